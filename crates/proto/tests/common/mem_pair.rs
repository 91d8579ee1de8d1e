//! Two RC QPs back to back in memory, for the engine's criterion bench
//! (`benches/engine.rs`) and the allocation test (`tests/noalloc.rs`): each side's memory as
//! an [`Env`], the QP configuration, and the requests they post.
#![allow(dead_code)]

use softrdma_proto::transport::{
    AccessError, AtomicOp, Env, QpConfig, RecvRequest, RxMeta, SendOp, SendRequest, Sge,
};
use softrdma_proto::{Mtu, QpType};

/// The key (lkey and rkey) of each side's one memory region.
pub const KEY: u32 = 1;
/// Size of each side's memory region: room for the largest message.
pub const MEM_LEN: usize = 64 * 1024;
/// Length of every receive buffer the responder side hands out.
pub const RECV_LEN: u32 = 4096;
/// The GRH area given with each packet (unused by RC).
pub const META: RxMeta = RxMeta { grh: [0; 40] };

/// One side's registered memory (one region, any access) and an endless receive queue.
pub struct MemEnv {
    pub mem: Vec<u8>,
    pub next_recv: u64,
}

impl MemEnv {
    /// A region of [`MEM_LEN`] bytes with a recognisable pattern.
    pub fn new() -> MemEnv {
        MemEnv {
            mem: (0..MEM_LEN).map(|i| (i * 13 + 1) as u8).collect(),
            next_recv: 0,
        }
    }

    /// The bytes `[addr, addr + len)` of the region under `key`, bounds-checked.
    fn at(&mut self, key: u32, addr: u64, len: usize) -> Result<&mut [u8], AccessError> {
        if key != KEY {
            return Err(AccessError::InvalidKey);
        }
        let start = usize::try_from(addr).map_err(|_| AccessError::OutOfBounds)?;
        let end = start.checked_add(len).ok_or(AccessError::OutOfBounds)?;
        self.mem.get_mut(start..end).ok_or(AccessError::OutOfBounds)
    }
}

impl Env for MemEnv {
    fn read_local(&mut self, sge: &Sge, offset: u32, dst: &mut [u8]) -> Result<(), AccessError> {
        let n = dst.len();
        dst.copy_from_slice(self.at(sge.lkey, sge.addr + u64::from(offset), n)?);
        Ok(())
    }
    fn write_local(&mut self, sge: &Sge, offset: u32, src: &[u8]) -> Result<(), AccessError> {
        self.at(sge.lkey, sge.addr + u64::from(offset), src.len())?
            .copy_from_slice(src);
        Ok(())
    }
    fn check_remote(&mut self, rkey: u32, va: u64, len: u64, _: bool) -> Result<(), AccessError> {
        let len = usize::try_from(len).map_err(|_| AccessError::OutOfBounds)?;
        self.at(rkey, va, len).map(|_| ())
    }
    fn write_remote(&mut self, rkey: u32, va: u64, src: &[u8]) -> Result<(), AccessError> {
        self.at(rkey, va, src.len())?.copy_from_slice(src);
        Ok(())
    }
    fn read_remote(&mut self, rkey: u32, va: u64, dst: &mut [u8]) -> Result<(), AccessError> {
        let n = dst.len();
        dst.copy_from_slice(self.at(rkey, va, n)?);
        Ok(())
    }
    fn atomic_remote(&mut self, _: u32, _: u64, _: AtomicOp) -> Result<u64, AccessError> {
        Err(AccessError::AccessDenied)
    }
    fn take_recv(&mut self) -> Option<RecvRequest> {
        self.next_recv += 1;
        Some(RecvRequest {
            wr_id: self.next_recv,
            sges: [Sge {
                addr: 0,
                length: RECV_LEN,
                lkey: KEY,
            }]
            .into(),
        })
    }
}

/// The RTS configuration of QP `qp_num` connected to `dest`, path MTU 4096.
pub fn config(qp_num: u32, dest: u32) -> QpConfig {
    QpConfig {
        qp_type: QpType::Rc,
        qp_num,
        dest_qp_num: dest,
        path_mtu: Mtu::Mtu4096,
        sq_psn: 1000,
        rq_psn: 1000,
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        min_rnr_timer: 12,
        max_rd_atomic: 16,
        max_dest_rd_atomic: 16,
        qkey: 0,
        access_flags: 2 | 4 | 8,
        max_send_wr: 256,
    }
}

/// A signaled request of `len` bytes from address 0: a SEND, or with `write` an RDMA WRITE to
/// the peer's address 0.
pub fn request(wr_id: u64, write: bool, len: u32) -> SendRequest {
    let op = if write {
        SendOp::RdmaWrite {
            remote_addr: 0,
            rkey: KEY,
        }
    } else {
        SendOp::Send
    };
    SendRequest {
        wr_id,
        op,
        sges: [Sge {
            addr: 0,
            length: len,
            lkey: KEY,
        }]
        .into(),
        inline: None,
        signaled: true,
        solicited: false,
        fence: false,
        ud: None,
    }
}
