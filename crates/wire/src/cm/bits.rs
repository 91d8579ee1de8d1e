//! What every CM message shares: the length of the CM data, private-data padding, the
//! MSB-first bit fields of IBTA's layouts and [`cm_view!`], which declares a message's view.

use crate::mad;
use crate::{Error, Result};

/// Length of the CM class data in a MAD: every CM message occupies exactly this many bytes.
pub const CM_DATA_LEN: usize = mad::MAD_DATA_LEN;

/// Copies `data` into a zero-padded private-data array of `N` bytes.
///
/// Fails with [`Error::Malformed`] when `data` is longer than `N`.
pub fn pad_private_data<const N: usize>(data: &[u8]) -> Result<[u8; N]> {
    let mut out = [0u8; N];
    out.get_mut(..data.len())
        .ok_or(Error::Malformed)?
        .copy_from_slice(data);
    Ok(out)
}

/// Reads `width` (1..=64) bits that start `bit` bits (MSB first) into byte `byte`.
/// The caller guarantees the bytes exist.
pub(super) fn get_bits(buf: &[u8], byte: usize, bit: u32, width: u32) -> u64 {
    let nbytes = (bit + width).div_ceil(8) as usize;
    let mut v: u128 = 0;
    for &b in &buf[byte..byte + nbytes] {
        v = (v << 8) | u128::from(b);
    }
    let shift = nbytes as u32 * 8 - bit - width;
    ((v >> shift) & mask(width)) as u64
}

/// Writes the low `width` bits of `value` at the place [`get_bits`] reads.
pub(super) fn set_bits(buf: &mut [u8], byte: usize, bit: u32, width: u32, value: u64) {
    let nbytes = (bit + width).div_ceil(8) as usize;
    let window = &mut buf[byte..byte + nbytes];
    let mut v: u128 = 0;
    for &b in window.iter() {
        v = (v << 8) | u128::from(b);
    }
    let shift = nbytes as u32 * 8 - bit - width;
    let m = mask(width) << shift;
    v = (v & !m) | ((u128::from(value) << shift) & m);
    for (i, b) in window.iter_mut().enumerate() {
        *b = (v >> ((nbytes - 1 - i) * 8)) as u8;
    }
}

fn mask(width: u32) -> u128 {
    (1u128 << width) - 1
}

/// Conversion between a raw bit-field value and the accessor's type.
pub(super) trait FieldValue: Copy {
    fn from_raw(v: u64) -> Self;
    fn into_raw(self) -> u64;
}

macro_rules! field_value_int {
    ($($t:ty),*) => {$(
        impl FieldValue for $t {
            fn from_raw(v: u64) -> Self {
                v as $t
            }
            fn into_raw(self) -> u64 {
                u64::from(self)
            }
        }
    )*};
}
field_value_int!(u8, u16, u32, u64);

impl FieldValue for bool {
    fn from_raw(v: u64) -> Self {
        v != 0
    }
    fn into_raw(self) -> u64 {
        u64::from(self)
    }
}

/// Declares a zero-copy view over the 232-byte CM data of one message, with its private data
/// range and its bit-field accessors: `getter, setter: type = (byte, bit, width);`.
macro_rules! cm_view {
    (
        $(#[$sdoc:meta])*
        $name:ident, private_data: $pd:expr;
        $( $(#[$doc:meta])* $get:ident, $set:ident : $ty:ty = ($byte:expr, $bit:expr, $width:expr); )*
    ) => {
        $(#[$sdoc])*
        ///
        /// Built with `new_checked`, every accessor stays inside the buffer; built with
        /// `new_unchecked`, accessors panic when the buffer is shorter than [`CM_DATA_LEN`](crate::cm::CM_DATA_LEN).
        /// Bytes beyond the first [`CM_DATA_LEN`](crate::cm::CM_DATA_LEN) are ignored.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub struct $name<T: AsRef<[u8]>> {
            buffer: T,
        }

        impl<T: AsRef<[u8]>> $name<T> {
            /// Wraps the CM data of a MAD without checking its length.
            pub const fn new_unchecked(buffer: T) -> Self {
                Self { buffer }
            }

            /// Wraps the CM data of a MAD after checking its length.
            ///
            /// Fails with [`Error::Truncated`](crate::Error::Truncated) when the buffer is shorter than
            /// [`CM_DATA_LEN`](crate::cm::CM_DATA_LEN).
            pub fn new_checked(buffer: T) -> $crate::Result<Self> {
                let p = Self::new_unchecked(buffer);
                p.check_len()?;
                Ok(p)
            }

            /// Checks that the buffer holds the whole message ([`Error::Truncated`](crate::Error::Truncated) if not).
            pub fn check_len(&self) -> $crate::Result<()> {
                if self.buffer.as_ref().len() < $crate::cm::CM_DATA_LEN {
                    Err($crate::Error::Truncated)
                } else {
                    Ok(())
                }
            }

            /// Gives the underlying buffer back.
            pub fn into_inner(self) -> T {
                self.buffer
            }

            /// The private data of the message (all bytes up to the end of the CM data).
            pub fn private_data(&self) -> &[u8] {
                &self.buffer.as_ref()[$pd..$crate::cm::CM_DATA_LEN]
            }

            $(
                $(#[$doc])*
                pub fn $get(&self) -> $ty {
                    <$ty as $crate::cm::bits::FieldValue>::from_raw($crate::cm::bits::get_bits(self.buffer.as_ref(), $byte, $bit, $width))
                }
            )*
        }

        impl<T: AsRef<[u8]> + AsMut<[u8]>> $name<T> {
            /// The private data of the message, writable.
            pub fn private_data_mut(&mut self) -> &mut [u8] {
                &mut self.buffer.as_mut()[$pd..$crate::cm::CM_DATA_LEN]
            }

            /// Sets all [`CM_DATA_LEN`](crate::cm::CM_DATA_LEN) bytes, reserved ones included, to zero.
            pub fn clear(&mut self) {
                self.buffer.as_mut()[..$crate::cm::CM_DATA_LEN].fill(0);
            }

            $(
                #[doc = concat!("Sets the field read by [`Self::", stringify!($get),
                    "`]; bits beyond the field's width are dropped.")]
                pub fn $set(&mut self, value: $ty) {
                    $crate::cm::bits::set_bits(self.buffer.as_mut(), $byte, $bit, $width, $crate::cm::bits::FieldValue::into_raw(value))
                }
            )*
        }
    };
}
pub(super) use cm_view;

/// The `N` bytes at `at` as an array; the caller guarantees they exist.
pub(super) fn read_array<const N: usize>(buf: &[u8], at: usize) -> [u8; N] {
    let mut out = [0u8; N];
    out.copy_from_slice(&buf[at..at + N]);
    out
}
