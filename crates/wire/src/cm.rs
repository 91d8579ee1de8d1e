//! InfiniBand communication manager (CM) messages: REQ, MRA, REJ, REP, RTU, DREQ, DREP,
//! SIDR_REQ and SIDR_REP, as carried in the 232-byte class data of a CM MAD
//! ([`crate::mad`]).
//!
//! Every message has a zero-copy view over the class data (for example [`ReqPacket`]) with
//! field getters and setters, and a representation (for example [`ReqRepr`]) with `parse` and
//! `emit`. [`Message`] ties them together: [`Message::parse`] checks the MAD header and
//! dispatches on the attribute ID; [`Message::emit_mad`] writes a whole 256-byte MAD.
//!
//! Field positions follow IBTA Volume 1 chapter 12 (as Linux's `ibta_vol1_c12.h` lays them
//! out): offsets are within the class data (MAD offset minus 24); bit 0 is the most
//! significant bit of a byte.
//!
//! # Reserved bits
//!
//! Reserved bits and bytes are ignored by `parse` and written as zero by `emit` (the IBTA rule:
//! "ignore on receive, zero on send"). Every field that is not reserved, including the ECE
//! vendor IDs of recent Linux kernels and the whole alternate path of a REQ, is part of the
//! representations, and private data is kept as a fixed-size array of the exact size the
//! message reserves for it. Hence parse → emit reproduces any message whose reserved bits are
//! zero byte for byte — every message Linux sends, and every one in the golden captures.
//!
//! ```
//! use softrdma_wire::cm::{Message, RtuRepr, RTU_PRIVATE_DATA_LEN};
//! use softrdma_wire::mad;
//! let rtu = Message::Rtu(RtuRepr {
//!     local_comm_id: 0x5633_9ffc,
//!     remote_comm_id: 0x209e_7d45,
//!     private_data: [0; RTU_PRIVATE_DATA_LEN],
//! });
//! let mut buf = [0u8; mad::MAD_SIZE];
//! rtu.emit_mad(0x2_fc9f_3356, &mut buf).unwrap();
//! let pkt = mad::Packet::new_checked(&buf[..]).unwrap();
//! assert_eq!(pkt.transaction_id(), 0x2_fc9f_3356);
//! assert_eq!(Message::parse(&pkt).unwrap(), rtu);
//! ```

use crate::mad;
use crate::{Error, Result};
use core::net::Ipv6Addr;

/// Length of the CM class data in a MAD: every CM message occupies exactly this many bytes.
pub const CM_DATA_LEN: usize = mad::MAD_DATA_LEN;

/// Size of the private data of a REQ.
pub const REQ_PRIVATE_DATA_LEN: usize = 92;
/// Size of the private data of an MRA.
pub const MRA_PRIVATE_DATA_LEN: usize = 222;
/// Size of the private data of a REJ.
pub const REJ_PRIVATE_DATA_LEN: usize = 148;
/// Size of the additional rejection information (ARI) of a REJ.
pub const REJ_ARI_LEN: usize = 72;
/// Size of the private data of a REP.
pub const REP_PRIVATE_DATA_LEN: usize = 196;
/// Size of the private data of an RTU.
pub const RTU_PRIVATE_DATA_LEN: usize = 224;
/// Size of the private data of a DREQ.
pub const DREQ_PRIVATE_DATA_LEN: usize = 220;
/// Size of the private data of a DREP.
pub const DREP_PRIVATE_DATA_LEN: usize = 224;
/// Size of the private data of a SIDR_REQ.
pub const SIDR_REQ_PRIVATE_DATA_LEN: usize = 216;
/// Size of the private data of a SIDR_REP.
pub const SIDR_REP_PRIVATE_DATA_LEN: usize = 136;
/// Size of the additional information of a SIDR_REP.
pub const SIDR_REP_ADDITIONAL_INFO_LEN: usize = 72;

/// Converts a 5-bit IBA time exponent `t` (4.096 µs × 2^t) to milliseconds the way Linux's CM
/// approximates it: `1 << max(t − 8, 0)`. Values above 31 are treated as 31.
pub const fn cm_timeout_to_ms(t: u8) -> u64 {
    let t = if t > 31 { 31 } else { t };
    1u64 << t.saturating_sub(8)
}

/// Converts a 5-bit IBA time exponent `t` to nanoseconds exactly: 4096 ns × 2^t. Values above
/// 31 are treated as 31.
pub const fn iba_time_to_ns(t: u8) -> u64 {
    let t = if t > 31 { 31 } else { t };
    4096u64 << t
}

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

// ----------------------------------------------------------------------------------------
// Bit-field plumbing
// ----------------------------------------------------------------------------------------

/// Reads `width` (1..=64) bits that start `bit` bits (MSB first) into byte `byte`.
/// The caller guarantees the bytes exist.
fn get_bits(buf: &[u8], byte: usize, bit: u32, width: u32) -> u64 {
    let nbytes = (bit + width).div_ceil(8) as usize;
    let mut v: u128 = 0;
    for &b in &buf[byte..byte + nbytes] {
        v = (v << 8) | u128::from(b);
    }
    let shift = nbytes as u32 * 8 - bit - width;
    ((v >> shift) & mask(width)) as u64
}

/// Writes the low `width` bits of `value` at the place [`get_bits`] reads.
fn set_bits(buf: &mut [u8], byte: usize, bit: u32, width: u32, value: u64) {
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
trait FieldValue: Copy {
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
        /// `new_unchecked`, accessors panic when the buffer is shorter than [`CM_DATA_LEN`].
        /// Bytes beyond the first [`CM_DATA_LEN`] are ignored.
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
            /// Fails with [`Error::Truncated`] when the buffer is shorter than
            /// [`CM_DATA_LEN`].
            pub fn new_checked(buffer: T) -> Result<Self> {
                let p = Self::new_unchecked(buffer);
                p.check_len()?;
                Ok(p)
            }

            /// Checks that the buffer holds the whole message ([`Error::Truncated`] if not).
            pub fn check_len(&self) -> Result<()> {
                if self.buffer.as_ref().len() < CM_DATA_LEN {
                    Err(Error::Truncated)
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
                &self.buffer.as_ref()[$pd..CM_DATA_LEN]
            }

            $(
                $(#[$doc])*
                pub fn $get(&self) -> $ty {
                    <$ty as FieldValue>::from_raw(get_bits(self.buffer.as_ref(), $byte, $bit, $width))
                }
            )*
        }

        impl<T: AsRef<[u8]> + AsMut<[u8]>> $name<T> {
            /// The private data of the message, writable.
            pub fn private_data_mut(&mut self) -> &mut [u8] {
                &mut self.buffer.as_mut()[$pd..CM_DATA_LEN]
            }

            /// Sets all [`CM_DATA_LEN`] bytes, reserved ones included, to zero.
            pub fn clear(&mut self) {
                self.buffer.as_mut()[..CM_DATA_LEN].fill(0);
            }

            $(
                #[doc = concat!("Sets the field read by [`Self::", stringify!($get),
                    "`]; bits beyond the field's width are dropped.")]
                pub fn $set(&mut self, value: $ty) {
                    set_bits(self.buffer.as_mut(), $byte, $bit, $width, FieldValue::into_raw(value))
                }
            )*
        }
    };
}

fn read_array<const N: usize>(buf: &[u8], at: usize) -> [u8; N] {
    let mut out = [0u8; N];
    out.copy_from_slice(&buf[at..at + N]);
    out
}

// ----------------------------------------------------------------------------------------
// Enumerations
// ----------------------------------------------------------------------------------------

/// Transport service type of a REQ (2 bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TransportServiceType {
    /// Reliable connected (0).
    Rc,
    /// Unreliable connected (1).
    Uc,
    /// Reliable datagram (2).
    Rd,
    /// XRC (3; Linux also sets the extended transport type to 1).
    Xrc,
}

impl TransportServiceType {
    /// Decodes the low two bits of `v` (every value is defined, so this never fails).
    pub const fn from_bits(v: u8) -> Self {
        match v & 3 {
            0 => Self::Rc,
            1 => Self::Uc,
            2 => Self::Rd,
            _ => Self::Xrc,
        }
    }

    /// The 2-bit wire value.
    pub const fn bits(self) -> u8 {
        match self {
            Self::Rc => 0,
            Self::Uc => 1,
            Self::Rd => 2,
            Self::Xrc => 3,
        }
    }
}

/// Which message a REJ rejects (2 bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MessageRejected {
    /// A REQ (0).
    Req,
    /// A REP (1).
    Rep,
    /// Anything else, e.g. a timeout of the active side (2).
    Other,
}

impl MessageRejected {
    /// Decodes the 2-bit value; fails with [`Error::Malformed`] on the reserved value 3.
    pub const fn from_bits(v: u8) -> Result<Self> {
        match v {
            0 => Ok(Self::Req),
            1 => Ok(Self::Rep),
            2 => Ok(Self::Other),
            _ => Err(Error::Malformed),
        }
    }

    /// The 2-bit wire value.
    pub const fn bits(self) -> u8 {
        match self {
            Self::Req => 0,
            Self::Rep => 1,
            Self::Other => 2,
        }
    }
}

/// Which message an MRA acknowledges (2 bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MessageMraed {
    /// A REQ (0).
    Req,
    /// A REP (1).
    Rep,
    /// A LAP (2).
    Lap,
}

impl MessageMraed {
    /// Decodes the 2-bit value; fails with [`Error::Malformed`] on the reserved value 3.
    pub const fn from_bits(v: u8) -> Result<Self> {
        match v {
            0 => Ok(Self::Req),
            1 => Ok(Self::Rep),
            2 => Ok(Self::Lap),
            _ => Err(Error::Malformed),
        }
    }

    /// The 2-bit wire value.
    pub const fn bits(self) -> u8 {
        match self {
            Self::Req => 0,
            Self::Rep => 1,
            Self::Lap => 2,
        }
    }
}

macro_rules! reject_reasons {
    ($( $(#[$doc:meta])* $name:ident = $v:expr, )*) => {
        /// The reason code of a REJ (IBTA table "Rejection Reason", Linux
        /// `enum ib_cm_rej_reason`).
        ///
        /// [`RejectReason::from_u16`] maps every defined code to its variant and anything else
        /// to `Unknown`, so `Unknown` never holds a defined code when built that way.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum RejectReason {
            $( $(#[$doc])* $name, )*
            /// A code this crate does not name (reserved or vendor specific).
            Unknown(u16),
        }

        impl RejectReason {
            /// Decodes a reason code (never fails: unknown codes become `Unknown`).
            pub const fn from_u16(v: u16) -> Self {
                match v {
                    $( $v => Self::$name, )*
                    other => Self::Unknown(other),
                }
            }

            /// The 16-bit wire value.
            pub const fn to_u16(self) -> u16 {
                match self {
                    $( Self::$name => $v, )*
                    Self::Unknown(v) => v,
                }
            }
        }
    };
}

reject_reasons! {
    /// 1: no QP available.
    NoQp = 1,
    /// 2: no EE context available.
    NoEec = 2,
    /// 3: no resources available.
    NoResources = 3,
    /// 4: timeout (the active side gave up waiting for a REP).
    Timeout = 4,
    /// 5: unsupported request.
    Unsupported = 5,
    /// 6: invalid communication ID.
    InvalidCommId = 6,
    /// 7: invalid communication instance.
    InvalidCommInstance = 7,
    /// 8: invalid service ID — nobody listens (rdma_cm: "connection refused").
    InvalidServiceId = 8,
    /// 9: invalid transport service type.
    InvalidTransportType = 9,
    /// 10: stale connection.
    StaleConn = 10,
    /// 11: RDC does not exist.
    RdcNotExist = 11,
    /// 12: primary remote port GID rejected.
    InvalidGid = 12,
    /// 13: primary remote port LID rejected.
    InvalidLid = 13,
    /// 14: invalid primary SL.
    InvalidSl = 14,
    /// 15: invalid primary traffic class.
    InvalidTrafficClass = 15,
    /// 16: invalid primary hop limit.
    InvalidHopLimit = 16,
    /// 17: invalid primary packet rate.
    InvalidPacketRate = 17,
    /// 18: alternate remote port GID rejected.
    InvalidAltGid = 18,
    /// 19: alternate remote port LID rejected.
    InvalidAltLid = 19,
    /// 20: invalid alternate SL.
    InvalidAltSl = 20,
    /// 21: invalid alternate traffic class.
    InvalidAltTrafficClass = 21,
    /// 22: invalid alternate hop limit.
    InvalidAltHopLimit = 22,
    /// 23: invalid alternate packet rate.
    InvalidAltPacketRate = 23,
    /// 24: port CM redirection.
    PortCmRedirect = 24,
    /// 25: port redirection.
    PortRedirect = 25,
    /// 26: invalid path MTU.
    InvalidMtu = 26,
    /// 27: insufficient responder resources.
    InsufficientRespResources = 27,
    /// 28: consumer defined (rdma_reject).
    ConsumerDefined = 28,
    /// 29: invalid RNR retry count.
    InvalidRnrRetry = 29,
    /// 30: duplicate local communication ID.
    DuplicateLocalCommId = 30,
    /// 31: invalid class version.
    InvalidClassVersion = 31,
    /// 32: invalid primary flow label.
    InvalidFlowLabel = 32,
    /// 33: invalid alternate flow label.
    InvalidAltFlowLabel = 33,
    /// 35: vendor option not supported (ECE).
    VendorOptionNotSupported = 35,
}

/// Status of a SIDR_REP (8 bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SidrStatus {
    /// 0: the QPN and Q_Key are valid.
    Success,
    /// 1: service ID not supported (nobody listens).
    Unsupported,
    /// 2: rejected by the service provider.
    Reject,
    /// 3: no QP available.
    NoQp,
    /// 4: redirect; the additional information holds ClassPortInfo.
    Redirect,
    /// 5: unsupported class version.
    UnsupportedVersion,
    /// Any other value.
    Unknown(u8),
}

impl SidrStatus {
    /// Decodes a status byte (never fails: unknown values become `Unknown`).
    pub const fn from_u8(v: u8) -> Self {
        match v {
            0 => Self::Success,
            1 => Self::Unsupported,
            2 => Self::Reject,
            3 => Self::NoQp,
            4 => Self::Redirect,
            5 => Self::UnsupportedVersion,
            other => Self::Unknown(other),
        }
    }

    /// The wire value.
    pub const fn to_u8(self) -> u8 {
        match self {
            Self::Success => 0,
            Self::Unsupported => 1,
            Self::Reject => 2,
            Self::NoQp => 3,
            Self::Redirect => 4,
            Self::UnsupportedVersion => 5,
            Self::Unknown(v) => v,
        }
    }
}

// ----------------------------------------------------------------------------------------
// REQ
// ----------------------------------------------------------------------------------------

mod req {
    pub const PRIMARY_PATH: usize = 52;
    pub const ALTERNATE_PATH: usize = 96;
    pub const PATH_LEN: usize = 44;
    pub const PRIVATE_DATA: usize = 140;
}

cm_view! {
    /// A view of a ConnectRequest (REQ, attribute 0x0010).
    ReqPacket, private_data: req::PRIVATE_DATA;
    /// Local communication ID of the sender.
    local_comm_id, set_local_comm_id: u32 = (0, 0, 32);
    /// ECE vendor ID (24 bits at byte 5; zero unless the sender uses ECE).
    vendor_id, set_vendor_id: u32 = (5, 0, 24);
    /// Service ID the REQ is addressed to.
    service_id, set_service_id: u64 = (8, 0, 64);
    /// GUID of the sender's channel adapter.
    local_ca_guid, set_local_ca_guid: u64 = (16, 0, 64);
    /// Local Q_Key (0 for RC).
    local_qkey, set_local_qkey: u32 = (28, 0, 32);
    /// Sender's QP number (24 bits).
    local_qpn, set_local_qpn: u32 = (32, 0, 24);
    /// Responder resources the sender offers (RDMA reads/atomics it accepts in flight).
    responder_resources, set_responder_resources: u8 = (35, 0, 8);
    /// Local EE context number (24 bits, 0 unless RD).
    local_eecn, set_local_eecn: u32 = (36, 0, 24);
    /// Initiator depth of the sender (reads/atomics it issues in flight).
    initiator_depth, set_initiator_depth: u8 = (39, 0, 8);
    /// Remote EE context number (24 bits, 0 unless RD).
    remote_eecn, set_remote_eecn: u32 = (40, 0, 24);
    /// Remote CM response timeout (5-bit IBA time).
    remote_cm_response_timeout, set_remote_cm_response_timeout: u8 = (43, 0, 5);
    /// Transport service type, raw 2 bits (see [`TransportServiceType`]).
    transport_service_type, set_transport_service_type: u8 = (43, 5, 2);
    /// End-to-end flow control.
    end_to_end_flow_control, set_end_to_end_flow_control: bool = (43, 7, 1);
    /// Starting PSN of the sender's send queue (24 bits).
    starting_psn, set_starting_psn: u32 = (44, 0, 24);
    /// Local CM response timeout (5-bit IBA time).
    local_cm_response_timeout, set_local_cm_response_timeout: u8 = (47, 0, 5);
    /// Retry count (3 bits).
    retry_count, set_retry_count: u8 = (47, 5, 3);
    /// Partition key.
    partition_key, set_partition_key: u16 = (48, 0, 16);
    /// Path MTU (4 bits, `enum ib_mtu`: 1 = 256 … 5 = 4096).
    path_mtu, set_path_mtu: u8 = (50, 0, 4);
    /// RDC exists.
    rdc_exists, set_rdc_exists: bool = (50, 4, 1);
    /// RNR retry count (3 bits, 7 = infinite).
    rnr_retry_count, set_rnr_retry_count: u8 = (50, 5, 3);
    /// Max CM retries (4 bits).
    max_cm_retries, set_max_cm_retries: u8 = (51, 0, 4);
    /// The sender's QP uses a shared receive queue.
    srq, set_srq: bool = (51, 4, 1);
    /// Extended transport type (3 bits; 1 = XRC).
    extended_transport_type, set_extended_transport_type: u8 = (51, 5, 3);
    /// Primary path: local port LID (0xFFFF on RoCE).
    primary_local_lid, set_primary_local_lid: u16 = (52, 0, 16);
    /// Primary path: remote port LID (0xFFFF on RoCE).
    primary_remote_lid, set_primary_remote_lid: u16 = (54, 0, 16);
    /// Primary path: flow label (20 bits).
    primary_flow_label, set_primary_flow_label: u32 = (88, 0, 20);
    /// Primary path: packet rate (6 bits).
    primary_packet_rate, set_primary_packet_rate: u8 = (91, 2, 6);
    /// Primary path: traffic class (the IP TOS on RoCE).
    primary_traffic_class, set_primary_traffic_class: u8 = (92, 0, 8);
    /// Primary path: hop limit (the IP TTL on RoCE).
    primary_hop_limit, set_primary_hop_limit: u8 = (93, 0, 8);
    /// Primary path: service level (4 bits).
    primary_sl, set_primary_sl: u8 = (94, 0, 4);
    /// Primary path: subnet local.
    primary_subnet_local, set_primary_subnet_local: bool = (94, 4, 1);
    /// Primary path: local ACK timeout (5-bit IBA time).
    primary_local_ack_timeout, set_primary_local_ack_timeout: u8 = (95, 0, 5);
    /// Alternate path: local port LID.
    alternate_local_lid, set_alternate_local_lid: u16 = (96, 0, 16);
    /// Alternate path: remote port LID.
    alternate_remote_lid, set_alternate_remote_lid: u16 = (98, 0, 16);
    /// Alternate path: flow label (20 bits).
    alternate_flow_label, set_alternate_flow_label: u32 = (132, 0, 20);
    /// Alternate path: packet rate (6 bits).
    alternate_packet_rate, set_alternate_packet_rate: u8 = (135, 2, 6);
    /// Alternate path: traffic class.
    alternate_traffic_class, set_alternate_traffic_class: u8 = (136, 0, 8);
    /// Alternate path: hop limit.
    alternate_hop_limit, set_alternate_hop_limit: u8 = (137, 0, 8);
    /// Alternate path: service level (4 bits).
    alternate_sl, set_alternate_sl: u8 = (138, 0, 4);
    /// Alternate path: subnet local.
    alternate_subnet_local, set_alternate_subnet_local: bool = (138, 4, 1);
    /// Alternate path: local ACK timeout (5-bit IBA time).
    alternate_local_ack_timeout, set_alternate_local_ack_timeout: u8 = (139, 0, 5);
    /// SAP supported (byte 139, bit 5).
    sap_supported, set_sap_supported: bool = (139, 5, 1);
}

impl<T: AsRef<[u8]>> ReqPacket<T> {
    /// Primary path: local port GID (the initiator's IP address as a GID on RoCE).
    pub fn primary_local_gid(&self) -> Ipv6Addr {
        Ipv6Addr::from(read_array::<16>(self.buffer.as_ref(), 56))
    }

    /// Primary path: remote port GID (the target's IP address as a GID on RoCE).
    pub fn primary_remote_gid(&self) -> Ipv6Addr {
        Ipv6Addr::from(read_array::<16>(self.buffer.as_ref(), 72))
    }

    /// Alternate path: local port GID.
    pub fn alternate_local_gid(&self) -> Ipv6Addr {
        Ipv6Addr::from(read_array::<16>(self.buffer.as_ref(), 100))
    }

    /// Alternate path: remote port GID.
    pub fn alternate_remote_gid(&self) -> Ipv6Addr {
        Ipv6Addr::from(read_array::<16>(self.buffer.as_ref(), 116))
    }

    /// The 44 raw bytes of the primary path (offsets 52..96).
    pub fn primary_path_bytes(&self) -> &[u8] {
        &self.buffer.as_ref()[req::PRIMARY_PATH..req::PRIMARY_PATH + req::PATH_LEN]
    }

    /// The 44 raw bytes of the alternate path (offsets 96..140, SAP bit included).
    pub fn alternate_path_bytes(&self) -> &[u8] {
        &self.buffer.as_ref()[req::ALTERNATE_PATH..req::ALTERNATE_PATH + req::PATH_LEN]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> ReqPacket<T> {
    /// Sets the primary local port GID.
    pub fn set_primary_local_gid(&mut self, gid: Ipv6Addr) {
        self.buffer.as_mut()[56..72].copy_from_slice(&gid.octets());
    }

    /// Sets the primary remote port GID.
    pub fn set_primary_remote_gid(&mut self, gid: Ipv6Addr) {
        self.buffer.as_mut()[72..88].copy_from_slice(&gid.octets());
    }

    /// Sets the alternate local port GID.
    pub fn set_alternate_local_gid(&mut self, gid: Ipv6Addr) {
        self.buffer.as_mut()[100..116].copy_from_slice(&gid.octets());
    }

    /// Sets the alternate remote port GID.
    pub fn set_alternate_remote_gid(&mut self, gid: Ipv6Addr) {
        self.buffer.as_mut()[116..132].copy_from_slice(&gid.octets());
    }
}

/// One path of a REQ (primary or alternate). On RoCE the alternate path is all zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ReqPath {
    /// Local port LID (0xFFFF, permissive, on RoCE when routed).
    pub local_lid: u16,
    /// Remote port LID.
    pub remote_lid: u16,
    /// Local port GID (sender's IP as a GID; IPv4 is v4-mapped).
    pub local_gid: Ipv6Addr,
    /// Remote port GID.
    pub remote_gid: Ipv6Addr,
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// Packet rate (6 bits, `enum ib_rate`).
    pub packet_rate: u8,
    /// Traffic class.
    pub traffic_class: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Service level (4 bits).
    pub sl: u8,
    /// Subnet local.
    pub subnet_local: bool,
    /// Local ACK timeout (5-bit IBA time).
    pub local_ack_timeout: u8,
}

impl ReqPath {
    /// A path with every field zero (what RoCE REQs carry as the alternate path).
    pub const ZERO: ReqPath = ReqPath {
        local_lid: 0,
        remote_lid: 0,
        local_gid: Ipv6Addr::UNSPECIFIED,
        remote_gid: Ipv6Addr::UNSPECIFIED,
        flow_label: 0,
        packet_rate: 0,
        traffic_class: 0,
        hop_limit: 0,
        sl: 0,
        subnet_local: false,
        local_ack_timeout: 0,
    };
}

/// A ConnectRequest (REQ) as a plain value.
///
/// Integer fields narrower than their type (QPNs, PSN, timeouts, …) are truncated to their
/// wire width by `emit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReqRepr {
    /// Local communication ID.
    pub local_comm_id: u32,
    /// ECE vendor ID (24 bits).
    pub vendor_id: u32,
    /// Service ID.
    pub service_id: u64,
    /// Local CA GUID.
    pub local_ca_guid: u64,
    /// Local Q_Key.
    pub local_qkey: u32,
    /// Local QPN (24 bits).
    pub local_qpn: u32,
    /// Responder resources.
    pub responder_resources: u8,
    /// Local EECN (24 bits).
    pub local_eecn: u32,
    /// Initiator depth.
    pub initiator_depth: u8,
    /// Remote EECN (24 bits).
    pub remote_eecn: u32,
    /// Remote CM response timeout (5 bits).
    pub remote_cm_response_timeout: u8,
    /// Transport service type.
    pub transport_service_type: TransportServiceType,
    /// End-to-end flow control.
    pub end_to_end_flow_control: bool,
    /// Starting PSN (24 bits).
    pub starting_psn: u32,
    /// Local CM response timeout (5 bits).
    pub local_cm_response_timeout: u8,
    /// Retry count (3 bits).
    pub retry_count: u8,
    /// Partition key.
    pub partition_key: u16,
    /// Path MTU (4 bits, `enum ib_mtu`).
    pub path_mtu: u8,
    /// RDC exists.
    pub rdc_exists: bool,
    /// RNR retry count (3 bits).
    pub rnr_retry_count: u8,
    /// Max CM retries (4 bits).
    pub max_cm_retries: u8,
    /// SRQ in use.
    pub srq: bool,
    /// Extended transport type (3 bits).
    pub extended_transport_type: u8,
    /// Primary path.
    pub primary_path: ReqPath,
    /// Alternate path (all zero on RoCE).
    pub alternate_path: ReqPath,
    /// SAP supported.
    pub sap_supported: bool,
    /// Private data (rdma_cm puts its 36-byte header first, see [`crate::cma`]).
    pub private_data: [u8; REQ_PRIVATE_DATA_LEN],
}

impl ReqRepr {
    /// Reads a REQ.
    ///
    /// Fails with [`Error::Truncated`] when the view is shorter than [`CM_DATA_LEN`].
    pub fn parse<T: AsRef<[u8]>>(p: &ReqPacket<T>) -> Result<ReqRepr> {
        p.check_len()?;
        Ok(ReqRepr {
            local_comm_id: p.local_comm_id(),
            vendor_id: p.vendor_id(),
            service_id: p.service_id(),
            local_ca_guid: p.local_ca_guid(),
            local_qkey: p.local_qkey(),
            local_qpn: p.local_qpn(),
            responder_resources: p.responder_resources(),
            local_eecn: p.local_eecn(),
            initiator_depth: p.initiator_depth(),
            remote_eecn: p.remote_eecn(),
            remote_cm_response_timeout: p.remote_cm_response_timeout(),
            transport_service_type: TransportServiceType::from_bits(p.transport_service_type()),
            end_to_end_flow_control: p.end_to_end_flow_control(),
            starting_psn: p.starting_psn(),
            local_cm_response_timeout: p.local_cm_response_timeout(),
            retry_count: p.retry_count(),
            partition_key: p.partition_key(),
            path_mtu: p.path_mtu(),
            rdc_exists: p.rdc_exists(),
            rnr_retry_count: p.rnr_retry_count(),
            max_cm_retries: p.max_cm_retries(),
            srq: p.srq(),
            extended_transport_type: p.extended_transport_type(),
            primary_path: ReqPath {
                local_lid: p.primary_local_lid(),
                remote_lid: p.primary_remote_lid(),
                local_gid: p.primary_local_gid(),
                remote_gid: p.primary_remote_gid(),
                flow_label: p.primary_flow_label(),
                packet_rate: p.primary_packet_rate(),
                traffic_class: p.primary_traffic_class(),
                hop_limit: p.primary_hop_limit(),
                sl: p.primary_sl(),
                subnet_local: p.primary_subnet_local(),
                local_ack_timeout: p.primary_local_ack_timeout(),
            },
            alternate_path: ReqPath {
                local_lid: p.alternate_local_lid(),
                remote_lid: p.alternate_remote_lid(),
                local_gid: p.alternate_local_gid(),
                remote_gid: p.alternate_remote_gid(),
                flow_label: p.alternate_flow_label(),
                packet_rate: p.alternate_packet_rate(),
                traffic_class: p.alternate_traffic_class(),
                hop_limit: p.alternate_hop_limit(),
                sl: p.alternate_sl(),
                subnet_local: p.alternate_subnet_local(),
                local_ack_timeout: p.alternate_local_ack_timeout(),
            },
            sap_supported: p.sap_supported(),
            private_data: read_array(p.buffer.as_ref(), req::PRIVATE_DATA),
        })
    }

    /// Length of the CM data a REQ occupies: [`CM_DATA_LEN`].
    pub const fn buffer_len(&self) -> usize {
        CM_DATA_LEN
    }

    /// Writes the REQ, zeroing every reserved bit.
    ///
    /// Panics if the view is shorter than [`CM_DATA_LEN`]; checked views never are.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut ReqPacket<T>) {
        p.clear();
        p.set_local_comm_id(self.local_comm_id);
        p.set_vendor_id(self.vendor_id);
        p.set_service_id(self.service_id);
        p.set_local_ca_guid(self.local_ca_guid);
        p.set_local_qkey(self.local_qkey);
        p.set_local_qpn(self.local_qpn);
        p.set_responder_resources(self.responder_resources);
        p.set_local_eecn(self.local_eecn);
        p.set_initiator_depth(self.initiator_depth);
        p.set_remote_eecn(self.remote_eecn);
        p.set_remote_cm_response_timeout(self.remote_cm_response_timeout);
        p.set_transport_service_type(self.transport_service_type.bits());
        p.set_end_to_end_flow_control(self.end_to_end_flow_control);
        p.set_starting_psn(self.starting_psn);
        p.set_local_cm_response_timeout(self.local_cm_response_timeout);
        p.set_retry_count(self.retry_count);
        p.set_partition_key(self.partition_key);
        p.set_path_mtu(self.path_mtu);
        p.set_rdc_exists(self.rdc_exists);
        p.set_rnr_retry_count(self.rnr_retry_count);
        p.set_max_cm_retries(self.max_cm_retries);
        p.set_srq(self.srq);
        p.set_extended_transport_type(self.extended_transport_type);
        let a = &self.primary_path;
        p.set_primary_local_lid(a.local_lid);
        p.set_primary_remote_lid(a.remote_lid);
        p.set_primary_local_gid(a.local_gid);
        p.set_primary_remote_gid(a.remote_gid);
        p.set_primary_flow_label(a.flow_label);
        p.set_primary_packet_rate(a.packet_rate);
        p.set_primary_traffic_class(a.traffic_class);
        p.set_primary_hop_limit(a.hop_limit);
        p.set_primary_sl(a.sl);
        p.set_primary_subnet_local(a.subnet_local);
        p.set_primary_local_ack_timeout(a.local_ack_timeout);
        let b = &self.alternate_path;
        p.set_alternate_local_lid(b.local_lid);
        p.set_alternate_remote_lid(b.remote_lid);
        p.set_alternate_local_gid(b.local_gid);
        p.set_alternate_remote_gid(b.remote_gid);
        p.set_alternate_flow_label(b.flow_label);
        p.set_alternate_packet_rate(b.packet_rate);
        p.set_alternate_traffic_class(b.traffic_class);
        p.set_alternate_hop_limit(b.hop_limit);
        p.set_alternate_sl(b.sl);
        p.set_alternate_subnet_local(b.subnet_local);
        p.set_alternate_local_ack_timeout(b.local_ack_timeout);
        p.set_sap_supported(self.sap_supported);
        p.private_data_mut().copy_from_slice(&self.private_data);
    }
}

// ----------------------------------------------------------------------------------------
// MRA
// ----------------------------------------------------------------------------------------

cm_view! {
    /// A view of a MsgRcptAck (MRA, attribute 0x0011).
    MraPacket, private_data: 10;
    /// Local communication ID of the sender.
    local_comm_id, set_local_comm_id: u32 = (0, 0, 32);
    /// Communication ID of the peer.
    remote_comm_id, set_remote_comm_id: u32 = (4, 0, 32);
    /// Which message is acknowledged, raw 2 bits (see [`MessageMraed`]).
    message_mraed, set_message_mraed: u8 = (8, 0, 2);
    /// Service timeout (5-bit IBA time) the peer should wait for.
    service_timeout, set_service_timeout: u8 = (9, 0, 5);
}

/// A MsgRcptAck (MRA) as a plain value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MraRepr {
    /// Local communication ID.
    pub local_comm_id: u32,
    /// Remote communication ID.
    pub remote_comm_id: u32,
    /// The message acknowledged.
    pub message_mraed: MessageMraed,
    /// Service timeout (5 bits).
    pub service_timeout: u8,
    /// Private data.
    pub private_data: [u8; MRA_PRIVATE_DATA_LEN],
}

impl MraRepr {
    /// Reads an MRA.
    ///
    /// Fails with [`Error::Truncated`] on a short view and [`Error::Malformed`] when the
    /// "message MRAed" field holds the reserved value 3.
    pub fn parse<T: AsRef<[u8]>>(p: &MraPacket<T>) -> Result<MraRepr> {
        p.check_len()?;
        Ok(MraRepr {
            local_comm_id: p.local_comm_id(),
            remote_comm_id: p.remote_comm_id(),
            message_mraed: MessageMraed::from_bits(p.message_mraed())?,
            service_timeout: p.service_timeout(),
            private_data: read_array(p.buffer.as_ref(), 10),
        })
    }

    /// Length of the CM data an MRA occupies: [`CM_DATA_LEN`].
    pub const fn buffer_len(&self) -> usize {
        CM_DATA_LEN
    }

    /// Writes the MRA, zeroing every reserved bit. Panics on a view shorter than
    /// [`CM_DATA_LEN`].
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut MraPacket<T>) {
        p.clear();
        p.set_local_comm_id(self.local_comm_id);
        p.set_remote_comm_id(self.remote_comm_id);
        p.set_message_mraed(self.message_mraed.bits());
        p.set_service_timeout(self.service_timeout);
        p.private_data_mut().copy_from_slice(&self.private_data);
    }
}

// ----------------------------------------------------------------------------------------
// REJ
// ----------------------------------------------------------------------------------------

cm_view! {
    /// A view of a ConnectReject (REJ, attribute 0x0012).
    RejPacket, private_data: 84;
    /// Local communication ID of the sender (0 when it rejects a REQ before having one).
    local_comm_id, set_local_comm_id: u32 = (0, 0, 32);
    /// Communication ID of the peer (0 when unknown).
    remote_comm_id, set_remote_comm_id: u32 = (4, 0, 32);
    /// Which message is rejected, raw 2 bits (see [`MessageRejected`]).
    message_rejected, set_message_rejected: u8 = (8, 0, 2);
    /// Length of the meaningful part of the ARI (7 bits).
    reject_info_length, set_reject_info_length: u8 = (9, 0, 7);
    /// Reason code, raw (see [`RejectReason`]).
    reason, set_reason: u16 = (10, 0, 16);
}

impl<T: AsRef<[u8]>> RejPacket<T> {
    /// The whole 72-byte additional rejection information field.
    pub fn ari(&self) -> &[u8] {
        &self.buffer.as_ref()[12..12 + REJ_ARI_LEN]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> RejPacket<T> {
    /// The additional rejection information field, writable.
    pub fn ari_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[12..12 + REJ_ARI_LEN]
    }
}

/// A ConnectReject (REJ) as a plain value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RejRepr {
    /// Local communication ID.
    pub local_comm_id: u32,
    /// Remote communication ID.
    pub remote_comm_id: u32,
    /// The message rejected.
    pub message_rejected: MessageRejected,
    /// Number of meaningful bytes in `ari` (at most [`REJ_ARI_LEN`]).
    pub reject_info_length: u8,
    /// Reason.
    pub reason: RejectReason,
    /// Additional rejection information, all 72 bytes as on the wire.
    pub ari: [u8; REJ_ARI_LEN],
    /// Private data.
    pub private_data: [u8; REJ_PRIVATE_DATA_LEN],
}

impl RejRepr {
    /// Reads a REJ.
    ///
    /// Fails with [`Error::Truncated`] on a short view, and with [`Error::Malformed`] when
    /// "message rejected" holds the reserved value 3 or the reject info length exceeds 72.
    pub fn parse<T: AsRef<[u8]>>(p: &RejPacket<T>) -> Result<RejRepr> {
        p.check_len()?;
        let reject_info_length = p.reject_info_length();
        if usize::from(reject_info_length) > REJ_ARI_LEN {
            return Err(Error::Malformed);
        }
        Ok(RejRepr {
            local_comm_id: p.local_comm_id(),
            remote_comm_id: p.remote_comm_id(),
            message_rejected: MessageRejected::from_bits(p.message_rejected())?,
            reject_info_length,
            reason: RejectReason::from_u16(p.reason()),
            ari: read_array(p.buffer.as_ref(), 12),
            private_data: read_array(p.buffer.as_ref(), 84),
        })
    }

    /// The meaningful part of the ARI (`reject_info_length` bytes, capped at 72).
    pub fn ari_info(&self) -> &[u8] {
        &self.ari[..usize::from(self.reject_info_length).min(REJ_ARI_LEN)]
    }

    /// Length of the CM data a REJ occupies: [`CM_DATA_LEN`].
    pub const fn buffer_len(&self) -> usize {
        CM_DATA_LEN
    }

    /// Writes the REJ, zeroing every reserved bit. Panics on a view shorter than
    /// [`CM_DATA_LEN`].
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut RejPacket<T>) {
        p.clear();
        p.set_local_comm_id(self.local_comm_id);
        p.set_remote_comm_id(self.remote_comm_id);
        p.set_message_rejected(self.message_rejected.bits());
        p.set_reject_info_length(self.reject_info_length);
        p.set_reason(self.reason.to_u16());
        p.ari_mut().copy_from_slice(&self.ari);
        p.private_data_mut().copy_from_slice(&self.private_data);
    }
}

// ----------------------------------------------------------------------------------------
// REP
// ----------------------------------------------------------------------------------------

cm_view! {
    /// A view of a ConnectReply (REP, attribute 0x0013).
    RepPacket, private_data: 36;
    /// Local communication ID of the sender.
    local_comm_id, set_local_comm_id: u32 = (0, 0, 32);
    /// Communication ID of the peer (the REQ's local comm ID).
    remote_comm_id, set_remote_comm_id: u32 = (4, 0, 32);
    /// Local Q_Key.
    local_qkey, set_local_qkey: u32 = (8, 0, 32);
    /// Sender's QP number (24 bits).
    local_qpn, set_local_qpn: u32 = (12, 0, 24);
    /// ECE vendor ID, high byte.
    vendor_id_high, set_vendor_id_high: u8 = (15, 0, 8);
    /// Local EE context number (24 bits).
    local_eecn, set_local_eecn: u32 = (16, 0, 24);
    /// ECE vendor ID, middle byte.
    vendor_id_mid, set_vendor_id_mid: u8 = (19, 0, 8);
    /// Starting PSN of the sender's send queue (24 bits).
    starting_psn, set_starting_psn: u32 = (20, 0, 24);
    /// ECE vendor ID, low byte.
    vendor_id_low, set_vendor_id_low: u8 = (23, 0, 8);
    /// Responder resources.
    responder_resources, set_responder_resources: u8 = (24, 0, 8);
    /// Initiator depth.
    initiator_depth, set_initiator_depth: u8 = (25, 0, 8);
    /// Target ACK delay (5-bit IBA time).
    target_ack_delay, set_target_ack_delay: u8 = (26, 0, 5);
    /// Failover accepted (2 bits).
    failover_accepted, set_failover_accepted: u8 = (26, 5, 2);
    /// End-to-end flow control.
    end_to_end_flow_control, set_end_to_end_flow_control: bool = (26, 7, 1);
    /// RNR retry count (3 bits).
    rnr_retry_count, set_rnr_retry_count: u8 = (27, 0, 3);
    /// The sender's QP uses a shared receive queue.
    srq, set_srq: bool = (27, 3, 1);
    /// GUID of the sender's channel adapter.
    local_ca_guid, set_local_ca_guid: u64 = (28, 0, 64);
}

/// A ConnectReply (REP) as a plain value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RepRepr {
    /// Local communication ID.
    pub local_comm_id: u32,
    /// Remote communication ID.
    pub remote_comm_id: u32,
    /// Local Q_Key.
    pub local_qkey: u32,
    /// Local QPN (24 bits).
    pub local_qpn: u32,
    /// Local EECN (24 bits).
    pub local_eecn: u32,
    /// Starting PSN (24 bits).
    pub starting_psn: u32,
    /// ECE vendor ID (24 bits: high, middle and low bytes at offsets 15, 19 and 23).
    pub vendor_id: u32,
    /// Responder resources.
    pub responder_resources: u8,
    /// Initiator depth.
    pub initiator_depth: u8,
    /// Target ACK delay (5 bits).
    pub target_ack_delay: u8,
    /// Failover accepted (2 bits).
    pub failover_accepted: u8,
    /// End-to-end flow control.
    pub end_to_end_flow_control: bool,
    /// RNR retry count (3 bits).
    pub rnr_retry_count: u8,
    /// SRQ in use.
    pub srq: bool,
    /// Local CA GUID.
    pub local_ca_guid: u64,
    /// Private data.
    pub private_data: [u8; REP_PRIVATE_DATA_LEN],
}

impl RepRepr {
    /// Reads a REP. Fails with [`Error::Truncated`] on a short view.
    pub fn parse<T: AsRef<[u8]>>(p: &RepPacket<T>) -> Result<RepRepr> {
        p.check_len()?;
        Ok(RepRepr {
            local_comm_id: p.local_comm_id(),
            remote_comm_id: p.remote_comm_id(),
            local_qkey: p.local_qkey(),
            local_qpn: p.local_qpn(),
            local_eecn: p.local_eecn(),
            starting_psn: p.starting_psn(),
            vendor_id: u32::from(p.vendor_id_high()) << 16
                | u32::from(p.vendor_id_mid()) << 8
                | u32::from(p.vendor_id_low()),
            responder_resources: p.responder_resources(),
            initiator_depth: p.initiator_depth(),
            target_ack_delay: p.target_ack_delay(),
            failover_accepted: p.failover_accepted(),
            end_to_end_flow_control: p.end_to_end_flow_control(),
            rnr_retry_count: p.rnr_retry_count(),
            srq: p.srq(),
            local_ca_guid: p.local_ca_guid(),
            private_data: read_array(p.buffer.as_ref(), 36),
        })
    }

    /// Length of the CM data a REP occupies: [`CM_DATA_LEN`].
    pub const fn buffer_len(&self) -> usize {
        CM_DATA_LEN
    }

    /// Writes the REP, zeroing every reserved bit. Panics on a view shorter than
    /// [`CM_DATA_LEN`].
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut RepPacket<T>) {
        p.clear();
        p.set_local_comm_id(self.local_comm_id);
        p.set_remote_comm_id(self.remote_comm_id);
        p.set_local_qkey(self.local_qkey);
        p.set_local_qpn(self.local_qpn);
        p.set_vendor_id_high((self.vendor_id >> 16) as u8);
        p.set_local_eecn(self.local_eecn);
        p.set_vendor_id_mid((self.vendor_id >> 8) as u8);
        p.set_starting_psn(self.starting_psn);
        p.set_vendor_id_low(self.vendor_id as u8);
        p.set_responder_resources(self.responder_resources);
        p.set_initiator_depth(self.initiator_depth);
        p.set_target_ack_delay(self.target_ack_delay);
        p.set_failover_accepted(self.failover_accepted);
        p.set_end_to_end_flow_control(self.end_to_end_flow_control);
        p.set_rnr_retry_count(self.rnr_retry_count);
        p.set_srq(self.srq);
        p.set_local_ca_guid(self.local_ca_guid);
        p.private_data_mut().copy_from_slice(&self.private_data);
    }
}

// ----------------------------------------------------------------------------------------
// RTU, DREQ, DREP
// ----------------------------------------------------------------------------------------

cm_view! {
    /// A view of a ReadyToUse (RTU, attribute 0x0014).
    RtuPacket, private_data: 8;
    /// Local communication ID of the sender.
    local_comm_id, set_local_comm_id: u32 = (0, 0, 32);
    /// Communication ID of the peer.
    remote_comm_id, set_remote_comm_id: u32 = (4, 0, 32);
}

/// A ReadyToUse (RTU) as a plain value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RtuRepr {
    /// Local communication ID.
    pub local_comm_id: u32,
    /// Remote communication ID.
    pub remote_comm_id: u32,
    /// Private data.
    pub private_data: [u8; RTU_PRIVATE_DATA_LEN],
}

impl RtuRepr {
    /// Reads an RTU. Fails with [`Error::Truncated`] on a short view.
    pub fn parse<T: AsRef<[u8]>>(p: &RtuPacket<T>) -> Result<RtuRepr> {
        p.check_len()?;
        Ok(RtuRepr {
            local_comm_id: p.local_comm_id(),
            remote_comm_id: p.remote_comm_id(),
            private_data: read_array(p.buffer.as_ref(), 8),
        })
    }

    /// Length of the CM data an RTU occupies: [`CM_DATA_LEN`].
    pub const fn buffer_len(&self) -> usize {
        CM_DATA_LEN
    }

    /// Writes the RTU. Panics on a view shorter than [`CM_DATA_LEN`].
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut RtuPacket<T>) {
        p.clear();
        p.set_local_comm_id(self.local_comm_id);
        p.set_remote_comm_id(self.remote_comm_id);
        p.private_data_mut().copy_from_slice(&self.private_data);
    }
}

cm_view! {
    /// A view of a DisconnectRequest (DREQ, attribute 0x0015).
    DreqPacket, private_data: 12;
    /// Local communication ID of the sender.
    local_comm_id, set_local_comm_id: u32 = (0, 0, 32);
    /// Communication ID of the peer.
    remote_comm_id, set_remote_comm_id: u32 = (4, 0, 32);
    /// The peer's QPN (or EECN), 24 bits.
    remote_qpn_eecn, set_remote_qpn_eecn: u32 = (8, 0, 24);
}

/// A DisconnectRequest (DREQ) as a plain value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DreqRepr {
    /// Local communication ID.
    pub local_comm_id: u32,
    /// Remote communication ID.
    pub remote_comm_id: u32,
    /// Remote QPN or EECN (24 bits).
    pub remote_qpn_eecn: u32,
    /// Private data.
    pub private_data: [u8; DREQ_PRIVATE_DATA_LEN],
}

impl DreqRepr {
    /// Reads a DREQ. Fails with [`Error::Truncated`] on a short view.
    pub fn parse<T: AsRef<[u8]>>(p: &DreqPacket<T>) -> Result<DreqRepr> {
        p.check_len()?;
        Ok(DreqRepr {
            local_comm_id: p.local_comm_id(),
            remote_comm_id: p.remote_comm_id(),
            remote_qpn_eecn: p.remote_qpn_eecn(),
            private_data: read_array(p.buffer.as_ref(), 12),
        })
    }

    /// Length of the CM data a DREQ occupies: [`CM_DATA_LEN`].
    pub const fn buffer_len(&self) -> usize {
        CM_DATA_LEN
    }

    /// Writes the DREQ, zeroing the reserved byte. Panics on a view shorter than
    /// [`CM_DATA_LEN`].
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut DreqPacket<T>) {
        p.clear();
        p.set_local_comm_id(self.local_comm_id);
        p.set_remote_comm_id(self.remote_comm_id);
        p.set_remote_qpn_eecn(self.remote_qpn_eecn);
        p.private_data_mut().copy_from_slice(&self.private_data);
    }
}

cm_view! {
    /// A view of a DisconnectReply (DREP, attribute 0x0016).
    DrepPacket, private_data: 8;
    /// Local communication ID of the sender.
    local_comm_id, set_local_comm_id: u32 = (0, 0, 32);
    /// Communication ID of the peer.
    remote_comm_id, set_remote_comm_id: u32 = (4, 0, 32);
}

/// A DisconnectReply (DREP) as a plain value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DrepRepr {
    /// Local communication ID.
    pub local_comm_id: u32,
    /// Remote communication ID.
    pub remote_comm_id: u32,
    /// Private data.
    pub private_data: [u8; DREP_PRIVATE_DATA_LEN],
}

impl DrepRepr {
    /// Reads a DREP. Fails with [`Error::Truncated`] on a short view.
    pub fn parse<T: AsRef<[u8]>>(p: &DrepPacket<T>) -> Result<DrepRepr> {
        p.check_len()?;
        Ok(DrepRepr {
            local_comm_id: p.local_comm_id(),
            remote_comm_id: p.remote_comm_id(),
            private_data: read_array(p.buffer.as_ref(), 8),
        })
    }

    /// Length of the CM data a DREP occupies: [`CM_DATA_LEN`].
    pub const fn buffer_len(&self) -> usize {
        CM_DATA_LEN
    }

    /// Writes the DREP. Panics on a view shorter than [`CM_DATA_LEN`].
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut DrepPacket<T>) {
        p.clear();
        p.set_local_comm_id(self.local_comm_id);
        p.set_remote_comm_id(self.remote_comm_id);
        p.private_data_mut().copy_from_slice(&self.private_data);
    }
}

// ----------------------------------------------------------------------------------------
// SIDR
// ----------------------------------------------------------------------------------------

cm_view! {
    /// A view of a ServiceIDResReq (SIDR_REQ, attribute 0x0017).
    SidrReqPacket, private_data: 16;
    /// Request ID chosen by the sender.
    request_id, set_request_id: u32 = (0, 0, 32);
    /// Partition key.
    partition_key, set_partition_key: u16 = (4, 0, 16);
    /// Service ID to resolve.
    service_id, set_service_id: u64 = (8, 0, 64);
}

/// A ServiceIDResReq (SIDR_REQ) as a plain value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SidrReqRepr {
    /// Request ID.
    pub request_id: u32,
    /// Partition key.
    pub partition_key: u16,
    /// Service ID.
    pub service_id: u64,
    /// Private data (rdma_cm puts its 36-byte header first, see [`crate::cma`]).
    pub private_data: [u8; SIDR_REQ_PRIVATE_DATA_LEN],
}

impl SidrReqRepr {
    /// Reads a SIDR_REQ. Fails with [`Error::Truncated`] on a short view.
    pub fn parse<T: AsRef<[u8]>>(p: &SidrReqPacket<T>) -> Result<SidrReqRepr> {
        p.check_len()?;
        Ok(SidrReqRepr {
            request_id: p.request_id(),
            partition_key: p.partition_key(),
            service_id: p.service_id(),
            private_data: read_array(p.buffer.as_ref(), 16),
        })
    }

    /// Length of the CM data a SIDR_REQ occupies: [`CM_DATA_LEN`].
    pub const fn buffer_len(&self) -> usize {
        CM_DATA_LEN
    }

    /// Writes the SIDR_REQ, zeroing the reserved bytes. Panics on a view shorter than
    /// [`CM_DATA_LEN`].
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut SidrReqPacket<T>) {
        p.clear();
        p.set_request_id(self.request_id);
        p.set_partition_key(self.partition_key);
        p.set_service_id(self.service_id);
        p.private_data_mut().copy_from_slice(&self.private_data);
    }
}

cm_view! {
    /// A view of a ServiceIDResReqResp (SIDR_REP, attribute 0x0018).
    SidrRepPacket, private_data: 96;
    /// Request ID of the SIDR_REQ answered.
    request_id, set_request_id: u32 = (0, 0, 32);
    /// Status, raw (see [`SidrStatus`]).
    status, set_status: u8 = (4, 0, 8);
    /// Length of the meaningful part of the additional information.
    additional_info_length, set_additional_info_length: u8 = (5, 0, 8);
    /// ECE vendor ID, high 16 bits.
    vendor_id_high, set_vendor_id_high: u16 = (6, 0, 16);
    /// QPN of the service (24 bits).
    qpn, set_qpn: u32 = (8, 0, 24);
    /// ECE vendor ID, low byte.
    vendor_id_low, set_vendor_id_low: u8 = (11, 0, 8);
    /// Service ID resolved.
    service_id, set_service_id: u64 = (12, 0, 64);
    /// Q_Key of the service's QP.
    qkey, set_qkey: u32 = (20, 0, 32);
}

impl<T: AsRef<[u8]>> SidrRepPacket<T> {
    /// The whole 72-byte additional information field.
    pub fn additional_info(&self) -> &[u8] {
        &self.buffer.as_ref()[24..24 + SIDR_REP_ADDITIONAL_INFO_LEN]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> SidrRepPacket<T> {
    /// The additional information field, writable.
    pub fn additional_info_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[24..24 + SIDR_REP_ADDITIONAL_INFO_LEN]
    }
}

/// A ServiceIDResReqResp (SIDR_REP) as a plain value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SidrRepRepr {
    /// Request ID.
    pub request_id: u32,
    /// Status.
    pub status: SidrStatus,
    /// Number of meaningful bytes in `additional_info` (at most 72).
    pub additional_info_length: u8,
    /// ECE vendor ID (24 bits: high 16 at offset 6, low 8 at offset 11).
    pub vendor_id: u32,
    /// QPN (24 bits).
    pub qpn: u32,
    /// Service ID.
    pub service_id: u64,
    /// Q_Key.
    pub qkey: u32,
    /// Additional information, all 72 bytes as on the wire.
    pub additional_info: [u8; SIDR_REP_ADDITIONAL_INFO_LEN],
    /// Private data.
    pub private_data: [u8; SIDR_REP_PRIVATE_DATA_LEN],
}

impl SidrRepRepr {
    /// Reads a SIDR_REP.
    ///
    /// Fails with [`Error::Truncated`] on a short view and [`Error::Malformed`] when the
    /// additional information length exceeds 72.
    pub fn parse<T: AsRef<[u8]>>(p: &SidrRepPacket<T>) -> Result<SidrRepRepr> {
        p.check_len()?;
        let additional_info_length = p.additional_info_length();
        if usize::from(additional_info_length) > SIDR_REP_ADDITIONAL_INFO_LEN {
            return Err(Error::Malformed);
        }
        Ok(SidrRepRepr {
            request_id: p.request_id(),
            status: SidrStatus::from_u8(p.status()),
            additional_info_length,
            vendor_id: u32::from(p.vendor_id_high()) << 8 | u32::from(p.vendor_id_low()),
            qpn: p.qpn(),
            service_id: p.service_id(),
            qkey: p.qkey(),
            additional_info: read_array(p.buffer.as_ref(), 24),
            private_data: read_array(p.buffer.as_ref(), 96),
        })
    }

    /// Length of the CM data a SIDR_REP occupies: [`CM_DATA_LEN`].
    pub const fn buffer_len(&self) -> usize {
        CM_DATA_LEN
    }

    /// Writes the SIDR_REP. Panics on a view shorter than [`CM_DATA_LEN`].
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut SidrRepPacket<T>) {
        p.clear();
        p.set_request_id(self.request_id);
        p.set_status(self.status.to_u8());
        p.set_additional_info_length(self.additional_info_length);
        p.set_vendor_id_high((self.vendor_id >> 8) as u16);
        p.set_qpn(self.qpn);
        p.set_vendor_id_low(self.vendor_id as u8);
        p.set_service_id(self.service_id);
        p.set_qkey(self.qkey);
        p.additional_info_mut()
            .copy_from_slice(&self.additional_info);
        p.private_data_mut().copy_from_slice(&self.private_data);
    }
}

// ----------------------------------------------------------------------------------------
// Message
// ----------------------------------------------------------------------------------------

/// Any CM message this crate decodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Message {
    /// ConnectRequest.
    Req(ReqRepr),
    /// MsgRcptAck.
    Mra(MraRepr),
    /// ConnectReject.
    Rej(RejRepr),
    /// ConnectReply.
    Rep(RepRepr),
    /// ReadyToUse.
    Rtu(RtuRepr),
    /// DisconnectRequest.
    Dreq(DreqRepr),
    /// DisconnectReply.
    Drep(DrepRepr),
    /// ServiceIDResReq.
    SidrReq(SidrReqRepr),
    /// ServiceIDResReqResp.
    SidrRep(SidrRepRepr),
}

impl Message {
    /// Decodes the CM message carried by a MAD.
    ///
    /// Fails with [`Error::Truncated`] when the MAD is shorter than 256 bytes; with
    /// [`Error::Unsupported`] when the base version is not 1, the class is not CM (0x07), the
    /// class version is not 2, the method is not Send, or the attribute is not one of the nine
    /// messages decoded here (LAP, APR and ClassPortInfo included); and with
    /// [`Error::Malformed`] when a field holds a value the format forbids (see each `Repr`'s
    /// `parse`). The MAD's status, class-specific, reserved and attribute modifier fields are
    /// not checked.
    pub fn parse<T: AsRef<[u8]>>(mad: &mad::Packet<T>) -> Result<Message> {
        mad.check_len()?;
        if mad.base_version() != mad::BASE_VERSION
            || mad.mgmt_class() != mad::MGMT_CLASS_CM
            || mad.class_version() != mad::CM_CLASS_VERSION
            || mad.method() != mad::METHOD_SEND
        {
            return Err(Error::Unsupported);
        }
        Self::parse_data(mad.attribute_id(), mad.data())
    }

    /// Decodes the CM data `data` of a message whose MAD attribute ID is `attribute_id`.
    ///
    /// Fails with [`Error::Truncated`] when `data` is shorter than [`CM_DATA_LEN`],
    /// [`Error::Unsupported`] on an attribute ID not decoded here and [`Error::Malformed`] on a
    /// forbidden field value.
    pub fn parse_data(attribute_id: u16, data: &[u8]) -> Result<Message> {
        Ok(match attribute_id {
            mad::ATTR_CM_REQ => Message::Req(ReqRepr::parse(&ReqPacket::new_checked(data)?)?),
            mad::ATTR_CM_MRA => Message::Mra(MraRepr::parse(&MraPacket::new_checked(data)?)?),
            mad::ATTR_CM_REJ => Message::Rej(RejRepr::parse(&RejPacket::new_checked(data)?)?),
            mad::ATTR_CM_REP => Message::Rep(RepRepr::parse(&RepPacket::new_checked(data)?)?),
            mad::ATTR_CM_RTU => Message::Rtu(RtuRepr::parse(&RtuPacket::new_checked(data)?)?),
            mad::ATTR_CM_DREQ => Message::Dreq(DreqRepr::parse(&DreqPacket::new_checked(data)?)?),
            mad::ATTR_CM_DREP => Message::Drep(DrepRepr::parse(&DrepPacket::new_checked(data)?)?),
            mad::ATTR_CM_SIDR_REQ => {
                Message::SidrReq(SidrReqRepr::parse(&SidrReqPacket::new_checked(data)?)?)
            }
            mad::ATTR_CM_SIDR_REP => {
                Message::SidrRep(SidrRepRepr::parse(&SidrRepPacket::new_checked(data)?)?)
            }
            _ => return Err(Error::Unsupported),
        })
    }

    /// The MAD attribute ID of this message.
    pub const fn attribute_id(&self) -> u16 {
        match self {
            Message::Req(_) => mad::ATTR_CM_REQ,
            Message::Mra(_) => mad::ATTR_CM_MRA,
            Message::Rej(_) => mad::ATTR_CM_REJ,
            Message::Rep(_) => mad::ATTR_CM_REP,
            Message::Rtu(_) => mad::ATTR_CM_RTU,
            Message::Dreq(_) => mad::ATTR_CM_DREQ,
            Message::Drep(_) => mad::ATTR_CM_DREP,
            Message::SidrReq(_) => mad::ATTR_CM_SIDR_REQ,
            Message::SidrRep(_) => mad::ATTR_CM_SIDR_REP,
        }
    }

    /// The conventional short name of the message ("REQ", "SIDR_REP", …).
    pub const fn name(&self) -> &'static str {
        match self {
            Message::Req(_) => "REQ",
            Message::Mra(_) => "MRA",
            Message::Rej(_) => "REJ",
            Message::Rep(_) => "REP",
            Message::Rtu(_) => "RTU",
            Message::Dreq(_) => "DREQ",
            Message::Drep(_) => "DREP",
            Message::SidrReq(_) => "SIDR_REQ",
            Message::SidrRep(_) => "SIDR_REP",
        }
    }

    /// Length of the CM data every message occupies: [`CM_DATA_LEN`].
    pub const fn buffer_len(&self) -> usize {
        CM_DATA_LEN
    }

    /// Writes the CM data (the 232 bytes after the MAD header) into `data`.
    ///
    /// Fails with [`Error::Truncated`] when `data` is shorter than [`CM_DATA_LEN`].
    pub fn emit(&self, data: &mut [u8]) -> Result<()> {
        if data.len() < CM_DATA_LEN {
            return Err(Error::Truncated);
        }
        match self {
            Message::Req(r) => r.emit(&mut ReqPacket::new_unchecked(data)),
            Message::Mra(r) => r.emit(&mut MraPacket::new_unchecked(data)),
            Message::Rej(r) => r.emit(&mut RejPacket::new_unchecked(data)),
            Message::Rep(r) => r.emit(&mut RepPacket::new_unchecked(data)),
            Message::Rtu(r) => r.emit(&mut RtuPacket::new_unchecked(data)),
            Message::Dreq(r) => r.emit(&mut DreqPacket::new_unchecked(data)),
            Message::Drep(r) => r.emit(&mut DrepPacket::new_unchecked(data)),
            Message::SidrReq(r) => r.emit(&mut SidrReqPacket::new_unchecked(data)),
            Message::SidrRep(r) => r.emit(&mut SidrRepPacket::new_unchecked(data)),
        }
        Ok(())
    }

    /// Writes a whole 256-byte CM MAD: base version 1, class CM, class version 2, method Send,
    /// status 0, the given transaction ID, this message's attribute ID, attribute modifier 0,
    /// then the message. To set another attribute modifier, emit a [`mad::Repr`] and
    /// [`Message::emit`] into [`mad::Packet::data_mut`] instead.
    ///
    /// Fails with [`Error::Truncated`] when `buf` is shorter than [`mad::MAD_SIZE`].
    pub fn emit_mad(&self, transaction_id: u64, buf: &mut [u8]) -> Result<()> {
        let mut packet = mad::Packet::new_checked(buf)?;
        mad::Repr::cm(transaction_id, self.attribute_id()).emit(&mut packet);
        self.emit(packet.data_mut())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn hex(s: &str) -> Vec<u8> {
        let s: String = s.chars().filter(|c| c.is_ascii_hexdigit()).collect();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    /// The CM data of a REQ as rxe sends it (rxe_two_vm.pcap frame 361), written out by hand:
    /// 140 fixed bytes and the rdma_cm header at the start of the private data.
    fn req_bytes() -> [u8; CM_DATA_LEN] {
        let mut b = [0u8; CM_DATA_LEN];
        let fixed = hex(
            "56339ffc 00000000 0000000001061c06 505400fffe000003 00000000 00000000
             00002401 00000001 000000a0 72e4d5a7 ffff 37 f0 ffff ffff
             00000000000000000000ffffc6120003 00000000000000000000ffffc6120002
             48e0f000 00 40 00 98",
        );
        b[..fixed.len()].copy_from_slice(&fixed);
        let cma =
            hex("00 40 a8d7 000000000000000000000000c6120003 000000000000000000000000c6120002");
        b[140..140 + cma.len()].copy_from_slice(&cma);
        b
    }

    fn mad_of(attr: u16, data: &[u8]) -> [u8; mad::MAD_SIZE] {
        let mut m = [0u8; mad::MAD_SIZE];
        let mut p = mad::Packet::new_unchecked(&mut m[..]);
        mad::Repr::cm(0x2_fc9f_3356, attr).emit(&mut p);
        p.data_mut().copy_from_slice(&data[..CM_DATA_LEN]);
        m
    }

    #[test]
    fn bits_edges() {
        // Every (bit, width) that fits in 8 bytes, at a non-zero byte offset: writing all ones
        // reads back as all ones, leaves every other bit alone, and writing zero clears it.
        for bit in 0..8u32 {
            for width in 1..=(64 - bit) {
                let mut buf = [0u8; 12];
                set_bits(&mut buf, 2, bit, width, u64::MAX);
                let max = if width == 64 {
                    u64::MAX
                } else {
                    (1u64 << width) - 1
                };
                assert_eq!(
                    get_bits(&buf, 2, bit, width),
                    max,
                    "bit {bit} width {width}"
                );
                let ones: u32 = buf.iter().map(|b| b.count_ones()).sum();
                assert_eq!(ones, width);
                assert_eq!(buf[0] | buf[1] | buf[11], 0);
                let mut full = [0xffu8; 12];
                set_bits(&mut full, 2, bit, width, 0);
                let zeros: u32 = full.iter().map(|b| b.count_zeros()).sum();
                assert_eq!(zeros, width);
                // Values wider than the field are truncated to it.
                let mut buf = [0u8; 12];
                set_bits(&mut buf, 2, bit, width, 0xa5c3_5a3c_a5c3_5a3c);
                assert_eq!(get_bits(&buf, 2, bit, width), 0xa5c3_5a3c_a5c3_5a3c & max);
            }
        }
    }

    #[test]
    fn req_golden() {
        let b = req_bytes();
        let p = ReqPacket::new_checked(&b[..]).unwrap();
        let r = ReqRepr::parse(&p).unwrap();
        assert_eq!(r.local_comm_id, 0x5633_9ffc);
        assert_eq!(r.vendor_id, 0);
        assert_eq!(r.service_id, 0x0000_0000_0106_1c06);
        assert_eq!(r.local_ca_guid, 0x5054_00ff_fe00_0003);
        assert_eq!(r.local_qpn, 0x24);
        assert_eq!(r.responder_resources, 1);
        assert_eq!(r.initiator_depth, 1);
        assert_eq!(r.remote_cm_response_timeout, 20);
        assert_eq!(r.transport_service_type, TransportServiceType::Rc);
        assert!(!r.end_to_end_flow_control);
        assert_eq!(r.starting_psn, 0x72_e4d5);
        assert_eq!(r.local_cm_response_timeout, 20);
        assert_eq!(r.retry_count, 7);
        assert_eq!(r.partition_key, 0xffff);
        assert_eq!(r.path_mtu, 3);
        assert!(!r.rdc_exists);
        assert_eq!(r.rnr_retry_count, 7);
        assert_eq!(r.max_cm_retries, 15);
        assert!(!r.srq);
        assert_eq!(r.extended_transport_type, 0);
        let pp = r.primary_path;
        assert_eq!((pp.local_lid, pp.remote_lid), (0xffff, 0xffff));
        assert_eq!(pp.local_gid, Ipv4Addr::new(198, 18, 0, 3).to_ipv6_mapped());
        assert_eq!(pp.remote_gid, Ipv4Addr::new(198, 18, 0, 2).to_ipv6_mapped());
        assert_eq!(pp.flow_label, 0x48e0f);
        assert_eq!(pp.packet_rate, 0);
        assert_eq!(pp.traffic_class, 0);
        assert_eq!(pp.hop_limit, 64);
        assert_eq!(pp.sl, 0);
        assert!(!pp.subnet_local);
        assert_eq!(pp.local_ack_timeout, 19);
        assert_eq!(r.alternate_path, ReqPath::ZERO);
        assert!(!r.sap_supported);
        assert_eq!(&r.private_data[..4], &[0x00, 0x40, 0xa8, 0xd7]);
        assert_eq!(p.private_data(), &r.private_data[..]);
        assert_eq!(p.primary_path_bytes().len(), 44);
        assert!(p.alternate_path_bytes().iter().all(|&x| x == 0));
        let mut out = [0xa5u8; CM_DATA_LEN];
        r.emit(&mut ReqPacket::new_unchecked(&mut out[..]));
        assert_eq!(out, b);
        assert_eq!(r.buffer_len(), CM_DATA_LEN);
    }

    #[test]
    fn req_every_field_at_max() {
        let path = ReqPath {
            local_lid: 0xffff,
            remote_lid: 0xfffe,
            local_gid: Ipv6Addr::from([0xff; 16]),
            remote_gid: Ipv6Addr::from([0xee; 16]),
            flow_label: 0xf_ffff,
            packet_rate: 0x3f,
            traffic_class: 0xff,
            hop_limit: 0xff,
            sl: 0xf,
            subnet_local: true,
            local_ack_timeout: 0x1f,
        };
        let r = ReqRepr {
            local_comm_id: u32::MAX,
            vendor_id: 0xff_ffff,
            service_id: u64::MAX,
            local_ca_guid: u64::MAX,
            local_qkey: u32::MAX,
            local_qpn: 0xff_ffff,
            responder_resources: 0xff,
            local_eecn: 0xff_ffff,
            initiator_depth: 0xff,
            remote_eecn: 0xff_ffff,
            remote_cm_response_timeout: 0x1f,
            transport_service_type: TransportServiceType::Xrc,
            end_to_end_flow_control: true,
            starting_psn: 0xff_ffff,
            local_cm_response_timeout: 0x1f,
            retry_count: 7,
            partition_key: 0xffff,
            path_mtu: 0xf,
            rdc_exists: true,
            rnr_retry_count: 7,
            max_cm_retries: 0xf,
            srq: true,
            extended_transport_type: 7,
            primary_path: path,
            alternate_path: path,
            sap_supported: true,
            private_data: [0xff; REQ_PRIVATE_DATA_LEN],
        };
        let mut out = [0u8; CM_DATA_LEN];
        r.emit(&mut ReqPacket::new_unchecked(&mut out[..]));
        assert_eq!(
            ReqRepr::parse(&ReqPacket::new_checked(&out[..]).unwrap()),
            Ok(r)
        );
        // Only the reserved bits stay zero: byte 4, bytes 24..28, the 6 bits between flow
        // label and packet rate, the 3 low bits of SL byte and ACK timeout byte (two paths),
        // minus the SAP bit.
        let zero_bits: u32 = out.iter().map(|b| b.count_zeros()).sum();
        let reserved = 8 + 32 + 2 * (6 + 3 + 3) - 1;
        let gid_zero_bits = 2 * (0xeeu8.count_zeros() * 16);
        let remote_lid_zero_bits = 2; // 0xfffe in both paths
        assert_eq!(zero_bits, reserved + gid_zero_bits + remote_lid_zero_bits);
        // Reserved bits set in the input are ignored, and re-emitted as zero.
        let mut dirty = out;
        dirty[4] = 0xff;
        dirty[24..28].fill(0xff);
        dirty[90] |= 0x0f;
        dirty[91] |= 0xc0;
        dirty[94] |= 0x07;
        dirty[95] |= 0x07;
        let r2 = ReqRepr::parse(&ReqPacket::new_checked(&dirty[..]).unwrap()).unwrap();
        assert_eq!(r2, r);
        let mut again = [0u8; CM_DATA_LEN];
        r2.emit(&mut ReqPacket::new_unchecked(&mut again[..]));
        assert_eq!(again, out);
    }

    #[test]
    fn rep_golden() {
        // synthetic_cm_messages.pcap frame 1, by hand.
        let mut b = [0u8; CM_DATA_LEN];
        let fixed = hex(
            "cafef00d deadbeef 00000000 00002200 00000000 65432100 01 01 79 e0 0002c9fffe000002",
        );
        b[..fixed.len()].copy_from_slice(&fixed);
        let r = RepRepr::parse(&RepPacket::new_checked(&b[..]).unwrap()).unwrap();
        assert_eq!(r.local_comm_id, 0xcafe_f00d);
        assert_eq!(r.remote_comm_id, 0xdead_beef);
        assert_eq!(r.local_qpn, 0x22);
        assert_eq!(r.starting_psn, 0x65_4321);
        assert_eq!((r.responder_resources, r.initiator_depth), (1, 1));
        assert_eq!(r.target_ack_delay, 15);
        assert_eq!(r.failover_accepted, 0);
        assert!(r.end_to_end_flow_control);
        assert_eq!(r.rnr_retry_count, 7);
        assert!(!r.srq);
        assert_eq!(r.vendor_id, 0);
        assert_eq!(r.local_ca_guid, 0x0002_c9ff_fe00_0002);
        let mut out = [0u8; CM_DATA_LEN];
        r.emit(&mut RepPacket::new_unchecked(&mut out[..]));
        assert_eq!(out, b);
        // The vendor ID is split over three bytes.
        let r = RepRepr {
            vendor_id: 0x12_3456,
            srq: true,
            ..r
        };
        r.emit(&mut RepPacket::new_unchecked(&mut out[..]));
        assert_eq!((out[15], out[19], out[23]), (0x12, 0x34, 0x56));
        assert_eq!(out[27], 0xf0);
        assert_eq!(
            RepRepr::parse(&RepPacket::new_checked(&out[..]).unwrap()),
            Ok(r)
        );
    }

    #[test]
    fn rej_golden() {
        // rxe_cm_req_no_listener.pcap frame 4: the active side's REJ (timeout) by hand.
        let mut b = [0u8; CM_DATA_LEN];
        let fixed = hex("a815e80d 00000000 80 10 0004 505400fffe000002");
        b[..fixed.len()].copy_from_slice(&fixed);
        let r = RejRepr::parse(&RejPacket::new_checked(&b[..]).unwrap()).unwrap();
        assert_eq!(r.local_comm_id, 0xa815_e80d);
        assert_eq!(r.remote_comm_id, 0);
        assert_eq!(r.message_rejected, MessageRejected::Other);
        assert_eq!(r.reject_info_length, 8);
        assert_eq!(r.reason, RejectReason::Timeout);
        assert_eq!(r.ari_info(), &hex("505400fffe000002")[..]);
        let mut out = [0u8; CM_DATA_LEN];
        r.emit(&mut RejPacket::new_unchecked(&mut out[..]));
        assert_eq!(out, b);
        // Reserved value 3 of "message rejected", and ARI lengths beyond 72, are malformed.
        let mut bad = b;
        bad[8] = 0xc0;
        assert_eq!(
            RejRepr::parse(&RejPacket::new_checked(&bad[..]).unwrap()),
            Err(Error::Malformed)
        );
        for len in 73..=127u8 {
            let mut bad = b;
            bad[9] = len << 1;
            assert_eq!(
                RejRepr::parse(&RejPacket::new_checked(&bad[..]).unwrap()),
                Err(Error::Malformed)
            );
        }
        let mut ok = b;
        ok[9] = 72 << 1 | 1; // the low reserved bit is ignored
        assert_eq!(
            RejRepr::parse(&RejPacket::new_checked(&ok[..]).unwrap())
                .unwrap()
                .reject_info_length,
            72
        );
    }

    #[test]
    fn mra_golden() {
        let mut b = [0u8; CM_DATA_LEN];
        b[..10].copy_from_slice(&hex("cafef00d deadbeef 00 c0"));
        let r = MraRepr::parse(&MraPacket::new_checked(&b[..]).unwrap()).unwrap();
        assert_eq!(r.message_mraed, MessageMraed::Req);
        assert_eq!(r.service_timeout, 24);
        let mut out = [0u8; CM_DATA_LEN];
        r.emit(&mut MraPacket::new_unchecked(&mut out[..]));
        assert_eq!(out, b);
        for (v, m) in [(0x40, MessageMraed::Rep), (0x80, MessageMraed::Lap)] {
            b[8] = v | 0x3f; // reserved bits ignored
            assert_eq!(
                MraRepr::parse(&MraPacket::new_checked(&b[..]).unwrap())
                    .unwrap()
                    .message_mraed,
                m
            );
        }
        b[8] = 0xc0;
        assert_eq!(
            MraRepr::parse(&MraPacket::new_checked(&b[..]).unwrap()),
            Err(Error::Malformed)
        );
    }

    #[test]
    fn rtu_dreq_drep_golden() {
        let mut b = [0u8; CM_DATA_LEN];
        b[..12].copy_from_slice(&hex("deadbeef cafef00d 00002200"));
        b[231] = 0x5a;
        let d = DreqRepr::parse(&DreqPacket::new_checked(&b[..]).unwrap()).unwrap();
        assert_eq!(
            (d.local_comm_id, d.remote_comm_id, d.remote_qpn_eecn),
            (0xdead_beef, 0xcafe_f00d, 0x22)
        );
        assert_eq!(d.private_data[219], 0x5a);
        let mut out = [0u8; CM_DATA_LEN];
        d.emit(&mut DreqPacket::new_unchecked(&mut out[..]));
        assert_eq!(out, b);
        let mut b2 = b;
        b2[8..12].fill(0);
        let r = RtuRepr::parse(&RtuPacket::new_checked(&b2[..]).unwrap()).unwrap();
        assert_eq!(r.private_data[223], 0x5a);
        r.emit(&mut RtuPacket::new_unchecked(&mut out[..]));
        assert_eq!(out, b2);
        let r = DrepRepr::parse(&DrepPacket::new_checked(&b2[..]).unwrap()).unwrap();
        assert_eq!(
            (r.local_comm_id, r.remote_comm_id),
            (0xdead_beef, 0xcafe_f00d)
        );
        r.emit(&mut DrepPacket::new_unchecked(&mut out[..]));
        assert_eq!(out, b2);
    }

    #[test]
    fn sidr_golden() {
        // rxe_two_vm.pcap frames 531 and 532, by hand.
        let mut b = [0u8; CM_DATA_LEN];
        let fixed = hex("54339ffc ffff 0000 0000000001111c06 00 40 e3ed");
        b[..fixed.len()].copy_from_slice(&fixed);
        let r = SidrReqRepr::parse(&SidrReqPacket::new_checked(&b[..]).unwrap()).unwrap();
        assert_eq!(r.request_id, 0x5433_9ffc);
        assert_eq!(r.partition_key, 0xffff);
        assert_eq!(r.service_id, 0x0111_1c06);
        assert_eq!(&r.private_data[..4], &[0, 0x40, 0xe3, 0xed]);
        let mut out = [0u8; CM_DATA_LEN];
        r.emit(&mut SidrReqPacket::new_unchecked(&mut out[..]));
        assert_eq!(out, b);

        let mut b = [0u8; CM_DATA_LEN];
        let fixed = hex("54339ffc 00 00 0000 00002600 0000000001111c06 01234567");
        b[..fixed.len()].copy_from_slice(&fixed);
        let r = SidrRepRepr::parse(&SidrRepPacket::new_checked(&b[..]).unwrap()).unwrap();
        assert_eq!(r.status, SidrStatus::Success);
        assert_eq!(r.qpn, 0x26);
        assert_eq!(r.service_id, 0x0111_1c06);
        assert_eq!(r.qkey, 0x0123_4567);
        assert_eq!(r.vendor_id, 0);
        r.emit(&mut SidrRepPacket::new_unchecked(&mut out[..]));
        assert_eq!(out, b);
        let r = SidrRepRepr {
            vendor_id: 0xab_cdef,
            status: SidrStatus::Unknown(0x99),
            ..r
        };
        r.emit(&mut SidrRepPacket::new_unchecked(&mut out[..]));
        assert_eq!((out[6], out[7], out[11], out[4]), (0xab, 0xcd, 0xef, 0x99));
        assert_eq!(
            SidrRepRepr::parse(&SidrRepPacket::new_checked(&out[..]).unwrap()),
            Ok(r)
        );
        for len in 73..=255u8 {
            let mut bad = b;
            bad[5] = len;
            assert_eq!(
                SidrRepRepr::parse(&SidrRepPacket::new_checked(&bad[..]).unwrap()),
                Err(Error::Malformed)
            );
        }
    }

    #[test]
    fn message_dispatch_and_mad_checks() {
        let req = req_bytes();
        let m = mad_of(mad::ATTR_CM_REQ, &req);
        let msg = Message::parse(&mad::Packet::new_checked(&m[..]).unwrap()).unwrap();
        assert_eq!(msg.attribute_id(), mad::ATTR_CM_REQ);
        assert_eq!(msg.name(), "REQ");
        assert_eq!(msg.buffer_len(), CM_DATA_LEN);
        let mut out = [0u8; mad::MAD_SIZE];
        msg.emit_mad(0x2_fc9f_3356, &mut out).unwrap();
        assert_eq!(out, m);
        assert_eq!(msg.emit_mad(0, &mut [0u8; 255]), Err(Error::Truncated));
        assert_eq!(msg.emit(&mut [0u8; 231]), Err(Error::Truncated));

        let cases: [(usize, u8); 5] = [
            (0, 2),               // base version
            (0, 0x80),            // OPA base version
            (1, 0x04),            // management class (PerfMgt)
            (2, 1),               // class version
            (3, mad::METHOD_GET), // method
        ];
        for (at, v) in cases {
            let mut bad = m;
            bad[at] = v;
            assert_eq!(
                Message::parse(&mad::Packet::new_checked(&bad[..]).unwrap()),
                Err(Error::Unsupported),
                "byte {at} = {v:#x}"
            );
        }
        for attr in [
            0u16,
            mad::ATTR_CLASS_PORT_INFO,
            0x000f,
            mad::ATTR_CM_LAP,
            mad::ATTR_CM_APR,
            0xffff,
        ] {
            let bad = mad_of(attr, &req);
            assert_eq!(
                Message::parse(&mad::Packet::new_checked(&bad[..]).unwrap()),
                Err(Error::Unsupported)
            );
        }
        // Every message type dispatches, and the attribute ID round-trips.
        for attr in mad::ATTR_CM_REQ..=mad::ATTR_CM_SIDR_REP {
            let mm = mad_of(attr, &[0u8; CM_DATA_LEN]);
            let msg = Message::parse(&mad::Packet::new_checked(&mm[..]).unwrap()).unwrap();
            assert_eq!(msg.attribute_id(), attr);
            let mut out = [0xffu8; mad::MAD_SIZE];
            msg.emit_mad(0x2_fc9f_3356, &mut out).unwrap();
            assert_eq!(out, mm);
        }
    }

    #[test]
    fn truncated_everywhere() {
        let data = [0u8; CM_DATA_LEN];
        for len in 0..CM_DATA_LEN {
            let d = &data[..len];
            assert_eq!(ReqPacket::new_checked(d), Err(Error::Truncated));
            assert_eq!(MraPacket::new_checked(d), Err(Error::Truncated));
            assert_eq!(RejPacket::new_checked(d), Err(Error::Truncated));
            assert_eq!(RepPacket::new_checked(d), Err(Error::Truncated));
            assert_eq!(RtuPacket::new_checked(d), Err(Error::Truncated));
            assert_eq!(DreqPacket::new_checked(d), Err(Error::Truncated));
            assert_eq!(DrepPacket::new_checked(d), Err(Error::Truncated));
            assert_eq!(SidrReqPacket::new_checked(d), Err(Error::Truncated));
            assert_eq!(SidrRepPacket::new_checked(d), Err(Error::Truncated));
            assert_eq!(
                ReqRepr::parse(&ReqPacket::new_unchecked(d)),
                Err(Error::Truncated)
            );
            assert_eq!(
                MraRepr::parse(&MraPacket::new_unchecked(d)),
                Err(Error::Truncated)
            );
            assert_eq!(
                RejRepr::parse(&RejPacket::new_unchecked(d)),
                Err(Error::Truncated)
            );
            assert_eq!(
                RepRepr::parse(&RepPacket::new_unchecked(d)),
                Err(Error::Truncated)
            );
            assert_eq!(
                RtuRepr::parse(&RtuPacket::new_unchecked(d)),
                Err(Error::Truncated)
            );
            assert_eq!(
                DreqRepr::parse(&DreqPacket::new_unchecked(d)),
                Err(Error::Truncated)
            );
            assert_eq!(
                DrepRepr::parse(&DrepPacket::new_unchecked(d)),
                Err(Error::Truncated)
            );
            assert_eq!(
                SidrReqRepr::parse(&SidrReqPacket::new_unchecked(d)),
                Err(Error::Truncated)
            );
            assert_eq!(
                SidrRepRepr::parse(&SidrRepPacket::new_unchecked(d)),
                Err(Error::Truncated)
            );
            for attr in mad::ATTR_CM_REQ..=mad::ATTR_CM_SIDR_REP {
                assert_eq!(Message::parse_data(attr, d), Err(Error::Truncated));
            }
        }
        let m = mad_of(mad::ATTR_CM_RTU, &data);
        for len in 0..mad::MAD_SIZE {
            assert_eq!(
                Message::parse(&mad::Packet::new_unchecked(&m[..len])),
                Err(Error::Truncated)
            );
        }
    }

    #[test]
    fn enums_round_trip() {
        for v in 0..=u16::MAX {
            let r = RejectReason::from_u16(v);
            assert_eq!(r.to_u16(), v);
            let named = !matches!(r, RejectReason::Unknown(_));
            assert_eq!(named, (1..=33).contains(&v) || v == 35, "{v}");
        }
        assert_eq!(RejectReason::from_u16(8), RejectReason::InvalidServiceId);
        assert_eq!(RejectReason::from_u16(28), RejectReason::ConsumerDefined);
        for v in 0..=u8::MAX {
            let s = SidrStatus::from_u8(v);
            assert_eq!(s.to_u8(), v);
            assert_eq!(matches!(s, SidrStatus::Unknown(_)), v > 5);
        }
        for v in 0..4u8 {
            assert_eq!(TransportServiceType::from_bits(v).bits(), v);
        }
        for v in 0..3u8 {
            assert_eq!(MessageRejected::from_bits(v).unwrap().bits(), v);
            assert_eq!(MessageMraed::from_bits(v).unwrap().bits(), v);
        }
        assert_eq!(MessageRejected::from_bits(3), Err(Error::Malformed));
        assert_eq!(MessageMraed::from_bits(3), Err(Error::Malformed));
    }

    #[test]
    fn timeouts_and_padding() {
        assert_eq!(cm_timeout_to_ms(0), 1);
        assert_eq!(cm_timeout_to_ms(8), 1);
        assert_eq!(cm_timeout_to_ms(20), 4096);
        assert_eq!(cm_timeout_to_ms(31), 1 << 23);
        assert_eq!(cm_timeout_to_ms(255), 1 << 23);
        assert_eq!(iba_time_to_ns(0), 4096);
        assert_eq!(iba_time_to_ns(20), 4096 << 20);
        assert_eq!(iba_time_to_ns(200), 4096 << 31);
        let p: [u8; 4] = pad_private_data(&[1, 2]).unwrap();
        assert_eq!(p, [1, 2, 0, 0]);
        assert_eq!(pad_private_data::<4>(&[0; 5]), Err(Error::Malformed));
        assert_eq!(pad_private_data::<4>(&[9; 4]), Ok([9; 4]));
    }

    #[test]
    fn view_setters() {
        let mut b = [0u8; CM_DATA_LEN + 4];
        let mut p = ReqPacket::new_checked(&mut b[..]).unwrap();
        p.set_primary_flow_label(0xabcde);
        p.set_primary_packet_rate(0x3f);
        p.set_sap_supported(true);
        p.set_alternate_local_ack_timeout(0x1f);
        p.private_data_mut()[0] = 1;
        assert_eq!(p.primary_flow_label(), 0xabcde);
        assert_eq!(p.primary_packet_rate(), 0x3f);
        assert!(p.sap_supported());
        assert_eq!(p.alternate_local_ack_timeout(), 0x1f);
        assert_eq!(p.private_data().len(), REQ_PRIVATE_DATA_LEN);
        let b = p.into_inner();
        assert_eq!(&b[88..92], &[0xab, 0xcd, 0xe0, 0x3f]);
        assert_eq!(b[139], 0xfc);
        assert_eq!(b[140], 1);
        assert_eq!(b[CM_DATA_LEN], 0, "bytes past the CM data are untouched");
    }
}
