//! Helpers both halves of a QP use: building packet headers and moving message bytes
//! between a scatter/gather list and a packet through the [`Env`].

use super::{AccessError, Env, Sge};
use crate::psn::Psn;
use softrdma_wire::opcode::Opcode;
use softrdma_wire::{bth, roce};

/// A BTH with this stack's constant fields.
pub(super) fn make_bth(
    opcode: Opcode,
    dest_qp: u32,
    psn: Psn,
    ack_req: bool,
    se: bool,
) -> bth::Repr {
    bth::Repr {
        opcode,
        solicited_event: se,
        mig_req: false,
        pad_count: 0,
        pkey: bth::DEFAULT_PKEY,
        fecn: false,
        becn: false,
        dest_qp: dest_qp & 0xff_ffff,
        ack_req,
        psn: psn.value(),
    }
}

/// Writes the headers of `repr` into `buf`, zeroes pad and ICRC, and returns the header
/// length and the total length; `None` when `buf` is too short or `repr` inconsistent.
#[inline]
pub(super) fn emit_headers(buf: &mut [u8], repr: &roce::Repr) -> Option<(usize, usize)> {
    repr.emit_around_payload(buf).ok()
}

/// Total length of a scatter/gather list.
pub(super) fn sge_total(sges: &[Sge]) -> u64 {
    sges.iter().map(|s| u64::from(s.length)).sum()
}

/// Copies message bytes `[off, off + dst.len())` of a gather list into `dst`.
pub(super) fn gather(
    env: &mut dyn Env,
    sges: &[Sge],
    mut off: u64,
    dst: &mut [u8],
) -> Result<(), AccessError> {
    let mut done = 0usize;
    for sge in sges {
        if done == dst.len() {
            break;
        }
        let len = u64::from(sge.length);
        if off >= len {
            off -= len;
            continue;
        }
        let n = ((len - off) as usize).min(dst.len() - done);
        env.read_local(sge, off as u32, &mut dst[done..done + n])?;
        done += n;
        off = 0;
    }
    if done == dst.len() {
        Ok(())
    } else {
        Err(AccessError::OutOfBounds)
    }
}

/// Copies `src` into message bytes `[off, off + src.len())` of a scatter list.
pub(super) fn scatter(
    env: &mut dyn Env,
    sges: &[Sge],
    mut off: u64,
    src: &[u8],
) -> Result<(), AccessError> {
    let mut done = 0usize;
    for sge in sges {
        if done == src.len() {
            break;
        }
        let len = u64::from(sge.length);
        if off >= len {
            off -= len;
            continue;
        }
        let n = ((len - off) as usize).min(src.len() - done);
        env.write_local(sge, off as u32, &src[done..done + n])?;
        done += n;
        off = 0;
    }
    if done == src.len() {
        Ok(())
    } else {
        Err(AccessError::OutOfBounds)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::{AtomicOp, RecvRequest};
    use std::collections::HashMap;

    struct VecEnv {
        mem: HashMap<u32, Vec<u8>>,
    }

    impl Env for VecEnv {
        fn read_local(
            &mut self,
            sge: &Sge,
            offset: u32,
            dst: &mut [u8],
        ) -> Result<(), AccessError> {
            let m = self.mem.get(&sge.lkey).ok_or(AccessError::InvalidKey)?;
            let at = (sge.addr + u64::from(offset)) as usize;
            dst.copy_from_slice(m.get(at..at + dst.len()).ok_or(AccessError::OutOfBounds)?);
            Ok(())
        }
        fn write_local(&mut self, sge: &Sge, offset: u32, src: &[u8]) -> Result<(), AccessError> {
            let m = self.mem.get_mut(&sge.lkey).ok_or(AccessError::InvalidKey)?;
            let at = (sge.addr + u64::from(offset)) as usize;
            m.get_mut(at..at + src.len())
                .ok_or(AccessError::OutOfBounds)?
                .copy_from_slice(src);
            Ok(())
        }
        fn check_remote(&mut self, _: u32, _: u64, _: u64, _: bool) -> Result<(), AccessError> {
            Err(AccessError::InvalidKey)
        }
        fn write_remote(&mut self, _: u32, _: u64, _: &[u8]) -> Result<(), AccessError> {
            Err(AccessError::InvalidKey)
        }
        fn read_remote(&mut self, _: u32, _: u64, _: &mut [u8]) -> Result<(), AccessError> {
            Err(AccessError::InvalidKey)
        }
        fn atomic_remote(&mut self, _: u32, _: u64, _: AtomicOp) -> Result<u64, AccessError> {
            Err(AccessError::InvalidKey)
        }
        fn take_recv(&mut self) -> Option<RecvRequest> {
            None
        }
    }

    #[test]
    fn gather_scatter_across_sges() {
        let mut env = VecEnv {
            mem: HashMap::from([(1, (0u8..100).collect()), (2, vec![0u8; 100])]),
        };
        let sges = [
            Sge {
                addr: 10,
                length: 3,
                lkey: 1,
            },
            Sge {
                addr: 0,
                length: 0,
                lkey: 1,
            },
            Sge {
                addr: 50,
                length: 5,
                lkey: 1,
            },
        ];
        let mut out = [0u8; 6];
        gather(&mut env, &sges, 1, &mut out).unwrap();
        assert_eq!(out, [11, 12, 50, 51, 52, 53]);
        let mut big = [0u8; 8];
        assert_eq!(
            gather(&mut env, &sges, 1, &mut big),
            Err(AccessError::OutOfBounds)
        );
        let dst = [
            Sge {
                addr: 0,
                length: 2,
                lkey: 2,
            },
            Sge {
                addr: 10,
                length: 4,
                lkey: 2,
            },
        ];
        scatter(&mut env, &dst, 1, &[7, 8, 9]).unwrap();
        assert_eq!(&env.mem[&2][..3], &[0, 7, 0]);
        assert_eq!(&env.mem[&2][10..13], &[8, 9, 0]);
        let bad = [Sge {
            addr: 0,
            length: 4,
            lkey: 9,
        }];
        assert_eq!(
            scatter(&mut env, &bad, 0, &[1]),
            Err(AccessError::InvalidKey)
        );
        assert_eq!(sge_total(&sges), 8);
    }
}
