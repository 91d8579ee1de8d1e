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
//!
//! One file per message (`req`, `rep`, `rej`, `mra`, `rtu`, `dreq` for DREQ and DREP, `sidr`
//! for SIDR_REQ and SIDR_REP), the shared bit-field plumbing in `bits` and the dispatch in
//! `message`; this module re-exports them all. The CM's timeout encodings are
//! `softrdma_proto::timer`'s.

mod bits;
mod dreq;
mod message;
mod mra;
mod rej;
mod rep;
mod req;
mod rtu;
mod sidr;
#[cfg(test)]
mod tests;

pub use bits::{pad_private_data, CM_DATA_LEN};
pub use dreq::{
    DrepPacket, DrepRepr, DreqPacket, DreqRepr, DREP_PRIVATE_DATA_LEN, DREQ_PRIVATE_DATA_LEN,
};
pub use message::Message;
pub use mra::{MessageMraed, MraPacket, MraRepr, MRA_PRIVATE_DATA_LEN};
pub use rej::{
    MessageRejected, RejPacket, RejRepr, RejectReason, REJ_ARI_LEN, REJ_PRIVATE_DATA_LEN,
};
pub use rep::{RepPacket, RepRepr, REP_PRIVATE_DATA_LEN};
pub use req::{ReqPacket, ReqPath, ReqRepr, TransportServiceType, REQ_PRIVATE_DATA_LEN};
pub use rtu::{RtuPacket, RtuRepr, RTU_PRIVATE_DATA_LEN};
pub use sidr::{
    SidrRepPacket, SidrRepRepr, SidrReqPacket, SidrReqRepr, SidrStatus,
    SIDR_REP_ADDITIONAL_INFO_LEN, SIDR_REP_PRIVATE_DATA_LEN, SIDR_REQ_PRIVATE_DATA_LEN,
};
