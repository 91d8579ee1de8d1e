//! The layout of a work-request record: what two QPs of this host exchange through a lane's
//! ring instead of RoCE packets for a short RC SEND or RDMA WRITE (`verbs::records` has the
//! rules). A record never leaves the host: it is not a RoCE packet, and the lanes carry
//! it only between processes that said they take it.
//!
//! ```text
//!  0      WR_RECORD (an opcode of the manufacturer-specific range)
//!  1      kind (see [`Kind`])
//!  2      flags: bit 0 solicited event, bit 1 carries an acknowledgement (SEND only)
//!  3..5   0
//!  5..8   destination QP number (where a BTH has it)
//!  8..12  sequence number of the request (the sender's count)
//! 12..16  epoch (the sender's; a refusal starts a new one)
//! 16..20  source QP number
//! 20..24  immediate data
//! 24..32  remote address (WRITE); SEND with flag bit 1: the sequence number (24..28) and
//!         epoch (28..32) of an acknowledgement of the receiver's own records
//! 32..36  rkey (WRITE)
//! 36..40  payload length
//! 40..    payload
//! ```
//! (Native byte order: both ends are processes of one host.) A SEND carries the
//! acknowledgement that its sender owes in the room a WRITE uses for its address: the 8-byte
//! SEND of a ping-pong and its answer stay one cache line each (16 bytes of the ring's own,
//! 40, 8), and no acknowledgement record goes either way.

use super::WR_RECORD;

/// Bytes of a record before its payload.
pub(crate) const HEADER: usize = 40;

/// What a record is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A SEND.
    Send,
    /// A SEND with immediate data.
    SendWithImm,
    /// An RDMA WRITE.
    Write,
    /// An RDMA WRITE with immediate data.
    WriteWithImm,
    /// The requests of the epoch up to the sequence number were carried out.
    Ack,
    /// The request with the sequence number was not carried out, nor anything after it in
    /// its epoch: the sender sends them again as packets.
    Bounce,
    /// As [`Kind::Bounce`], and no record should come to this QP again.
    Refuse,
}

impl Kind {
    fn code(self) -> u8 {
        match self {
            Kind::Send => 0,
            Kind::SendWithImm => 1,
            Kind::Write => 2,
            Kind::WriteWithImm => 3,
            Kind::Ack => 0x10,
            Kind::Bounce => 0x11,
            Kind::Refuse => 0x12,
        }
    }

    fn from_code(c: u8) -> Option<Kind> {
        Some(match c {
            0 => Kind::Send,
            1 => Kind::SendWithImm,
            2 => Kind::Write,
            3 => Kind::WriteWithImm,
            0x10 => Kind::Ack,
            0x11 => Kind::Bounce,
            0x12 => Kind::Refuse,
            _ => return None,
        })
    }

    /// Whether the record carries a work request (rather than answering one).
    pub(crate) fn is_request(self) -> bool {
        matches!(
            self,
            Kind::Send | Kind::SendWithImm | Kind::Write | Kind::WriteWithImm
        )
    }
}

/// The header of a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Record {
    pub(crate) kind: Kind,
    pub(crate) solicited: bool,
    pub(crate) dest_qpn: u32,
    pub(crate) seq: u32,
    pub(crate) epoch: u32,
    pub(crate) src_qpn: u32,
    pub(crate) imm: u32,
    pub(crate) remote_addr: u64,
    pub(crate) rkey: u32,
    pub(crate) len: u32,
    /// A SEND's acknowledgement of the receiver's records (as a [`Kind::Ack`] record's
    /// `seq` and `epoch`); `None` on anything else.
    pub(crate) ack: Option<(u32, u32)>,
}

impl Record {
    /// An answer (`kind` [`Kind::Ack`], [`Kind::Bounce`] or [`Kind::Refuse`]) to the
    /// request `to`, going back to its sender.
    pub(crate) fn answer(kind: Kind, to: &Record) -> Record {
        Record {
            kind,
            solicited: false,
            dest_qpn: to.src_qpn,
            seq: to.seq,
            epoch: to.epoch,
            src_qpn: to.dest_qpn,
            imm: 0,
            remote_addr: 0,
            rkey: 0,
            len: 0,
            ack: None,
        }
    }

    /// Whether a record of this kind may carry an acknowledgement (its address room is
    /// free).
    pub(crate) fn may_carry_ack(kind: Kind) -> bool {
        matches!(kind, Kind::Send | Kind::SendWithImm)
    }

    /// Writes the header into the first [`HEADER`] bytes of `buf` (which must hold them). An
    /// `ack` goes only on a SEND (see [`Record::may_carry_ack`]; on others it is dropped).
    pub(crate) fn emit(&self, buf: &mut [u8]) {
        let b = &mut buf[..HEADER];
        let ack = self.ack.filter(|_| Record::may_carry_ack(self.kind));
        b[0] = WR_RECORD;
        b[1] = self.kind.code();
        b[2] = u8::from(self.solicited) | (u8::from(ack.is_some()) << 1);
        b[3] = 0;
        b[4] = 0;
        b[5..8].copy_from_slice(&self.dest_qpn.to_be_bytes()[1..]);
        b[8..12].copy_from_slice(&self.seq.to_ne_bytes());
        b[12..16].copy_from_slice(&self.epoch.to_ne_bytes());
        b[16..20].copy_from_slice(&self.src_qpn.to_ne_bytes());
        b[20..24].copy_from_slice(&self.imm.to_ne_bytes());
        match ack {
            Some((seq, epoch)) => {
                b[24..28].copy_from_slice(&seq.to_ne_bytes());
                b[28..32].copy_from_slice(&epoch.to_ne_bytes());
            }
            None => b[24..32].copy_from_slice(&self.remote_addr.to_ne_bytes()),
        }
        b[32..36].copy_from_slice(&self.rkey.to_ne_bytes());
        b[36..40].copy_from_slice(&self.len.to_ne_bytes());
    }

    /// Reads a record: its header and payload. `None` when `buf` is not a whole record (too
    /// short for its header or its payload, an unknown kind, an answer with a payload, an
    /// acknowledgement on anything but a SEND).
    pub(crate) fn parse(buf: &[u8]) -> Option<(Record, &[u8])> {
        // (Read through a fixed-size array: no bounds check per field.)
        let b: &[u8; HEADER] = buf.get(..HEADER)?.try_into().ok()?;
        if b[0] != WR_RECORD {
            return None;
        }
        let u32_at = |i: usize| u32::from_ne_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let kind = Kind::from_code(b[1])?;
        let len = u32_at(36);
        if !kind.is_request() && len != 0 {
            return None;
        }
        let acks = b[2] & 2 != 0;
        if acks && !Record::may_carry_ack(kind) {
            return None;
        }
        let at24 = u64::from_ne_bytes([b[24], b[25], b[26], b[27], b[28], b[29], b[30], b[31]]);
        let r = Record {
            kind,
            solicited: b[2] & 1 != 0,
            dest_qpn: u32::from_be_bytes([0, b[5], b[6], b[7]]),
            seq: u32_at(8),
            epoch: u32_at(12),
            src_qpn: u32_at(16) & 0xff_ffff,
            imm: u32_at(20),
            remote_addr: if acks { 0 } else { at24 },
            rkey: u32_at(32),
            len,
            ack: acks.then(|| (u32_at(24), u32_at(28))),
        };
        let payload = buf.get(HEADER..HEADER.checked_add(len as usize)?)?;
        Some((r, payload))
    }
}

/// The destination QP number of a record (`None` when it is too short to have one).
#[inline]
pub(crate) fn dest_qpn(buf: &[u8]) -> Option<u32> {
    let b = buf.get(5..8)?;
    Some(u32::from_be_bytes([0, b[0], b[1], b[2]]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Record {
        Record {
            kind: Kind::WriteWithImm,
            solicited: true,
            dest_qpn: 0x12_3456,
            seq: 7,
            epoch: 3,
            src_qpn: 0x65_4321,
            imm: 0xdead_beef,
            remote_addr: 0x1234_5678_9abc,
            rkey: 0x42,
            len: 5,
            ack: None,
        }
    }

    #[test]
    fn a_record_reads_back_as_written() {
        let r = sample();
        let mut buf = vec![0u8; HEADER + 5];
        r.emit(&mut buf);
        buf[HEADER..].copy_from_slice(b"hello");
        let (back, payload) = Record::parse(&buf).expect("a whole record");
        assert_eq!(back, r);
        assert_eq!(payload, b"hello");
        assert_eq!(dest_qpn(&buf), Some(0x12_3456));
    }

    #[test]
    fn records_that_are_not_whole_are_refused() {
        let r = sample();
        let mut buf = vec![0u8; HEADER + 5];
        r.emit(&mut buf);
        // Every truncation: no header, or a payload shorter than its length.
        for n in 0..buf.len() {
            assert!(Record::parse(&buf[..n]).is_none(), "{n} bytes");
        }
        let mut bad = buf.clone();
        bad[1] = 0x7f;
        assert!(Record::parse(&bad).is_none(), "unknown kind");
        let mut bad = buf.clone();
        bad[0] = 0x04;
        assert!(Record::parse(&bad).is_none(), "not a record");
        let mut ack = Record::answer(Kind::Ack, &r);
        ack.len = 1;
        let mut b = vec![0u8; HEADER + 1];
        ack.emit(&mut b);
        assert!(Record::parse(&b).is_none(), "an answer with a payload");
    }

    #[test]
    fn a_send_carries_an_acknowledgement_and_nothing_else_does() {
        let mut r = sample();
        r.kind = Kind::SendWithImm;
        r.remote_addr = 0;
        r.rkey = 0;
        r.ack = Some((0x0102_0304, 0xa0b0_c0d0));
        let mut buf = vec![0u8; HEADER + 5];
        r.emit(&mut buf);
        buf[HEADER..].copy_from_slice(b"hello");
        assert_eq!(buf[2], 0b11, "solicited and carrying an acknowledgement");
        let (back, payload) = Record::parse(&buf).expect("a whole record");
        assert_eq!(back, r);
        assert_eq!(payload, b"hello");
        // Without one, the room is the address's again.
        r.ack = None;
        r.emit(&mut buf);
        assert_eq!(Record::parse(&buf).expect("a whole record").0, r);
        // A WRITE has no room for one: none is written, and one read is refused.
        let mut w = sample();
        w.ack = Some((1, 2));
        w.emit(&mut buf);
        let (back, _) = Record::parse(&buf).expect("a whole record");
        assert_eq!((back.ack, back.remote_addr), (None, w.remote_addr));
        buf[2] |= 2;
        assert!(
            Record::parse(&buf).is_none(),
            "a WRITE that says it acknowledges"
        );
    }

    #[test]
    fn an_answer_goes_back_to_the_sender_of_the_request() {
        let r = sample();
        let a = Record::answer(Kind::Bounce, &r);
        assert_eq!((a.dest_qpn, a.src_qpn), (r.src_qpn, r.dest_qpn));
        assert_eq!((a.seq, a.epoch, a.len), (r.seq, r.epoch, 0));
        assert!(!a.kind.is_request());
    }
}
