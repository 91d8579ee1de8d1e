//! QP 1 on the wire: a CM MAD travels as a UD SEND_ONLY from QP 1 to QP 1 with the default
//! P_Key and Q_Key 0x80010000, exactly what Linux rdma_cm puts on the wire over RoCE.

use softrdma_wire::opcode::Opcode;
use softrdma_wire::{bth, deth, mad, roce};

/// The length of a framed MAD: BTH, DETH, the 256-byte MAD and the ICRC.
pub const MAD_PACKET_LEN: usize =
    bth::HEADER_LEN + deth::HEADER_LEN + mad::MAD_SIZE + roce::ICRC_LEN;

/// The headers of a MAD packet with PSN `psn`.
fn mad_repr(psn: u32) -> roce::Repr {
    roce::Repr {
        bth: bth::Repr {
            opcode: Opcode::UD_SEND_ONLY,
            solicited_event: false,
            mig_req: false,
            pad_count: 0,
            pkey: bth::DEFAULT_PKEY,
            fecn: false,
            becn: false,
            dest_qp: mad::GSI_QPN,
            ack_req: false,
            psn: psn & 0xff_ffff,
        },
        deth: Some(deth::Repr {
            qkey: mad::GSI_QKEY,
            src_qp: mad::GSI_QPN,
        }),
        payload_len: mad::MAD_SIZE,
        ..Default::default()
    }
}

/// Writes the BTH and DETH of a MAD packet with PSN `psn` at the start of `buf` and zeroes
/// its ICRC; the MAD goes in `buf[HEADER..HEADER + 256]` ([`MAD_AT`]). Returns the packet's
/// length ([`MAD_PACKET_LEN`]), or `None` when `buf` is shorter.
pub fn frame_headers(buf: &mut [u8], psn: u32) -> Option<usize> {
    let buf = buf.get_mut(..MAD_PACKET_LEN)?;
    let hlen = mad_repr(psn).emit_header(buf).ok()?;
    debug_assert_eq!(hlen, MAD_AT);
    buf[MAD_PACKET_LEN - roce::ICRC_LEN..].fill(0);
    Some(MAD_PACKET_LEN)
}

/// Where the MAD starts in a framed packet.
pub const MAD_AT: usize = bth::HEADER_LEN + deth::HEADER_LEN;

/// Frames `mad` (its first 256 bytes; a shorter one is refused) as a UD SEND_ONLY to QP 1
/// with PSN `psn` into `buf`, ICRC zeroed (the device seals it). Returns the packet's length,
/// or `None` when `mad` is shorter than a MAD or `buf` shorter than [`MAD_PACKET_LEN`].
pub fn frame_mad(buf: &mut [u8], psn: u32, mad: &[u8]) -> Option<usize> {
    let mad = mad.get(..mad::MAD_SIZE)?;
    let len = frame_headers(buf, psn)?;
    buf[MAD_AT..MAD_AT + mad::MAD_SIZE].copy_from_slice(mad);
    Some(len)
}

/// The MAD a packet to QP 1 (BTH through ICRC, ICRC already verified) carries: the first 256
/// bytes of its payload, when it is a UD SEND_ONLY with a P_Key of the default partition
/// (full or limited member), Q_Key 0x80010000 and at least 256 payload bytes; `None`
/// otherwise. Never panics.
pub fn unframe_mad(packet: &[u8]) -> Option<&[u8]> {
    let p = roce::Packet::new_checked(packet).ok()?;
    let repr = roce::Repr::parse(&p).ok()?;
    let deth = repr.deth?;
    let ok = repr.bth.opcode == Opcode::UD_SEND_ONLY
        && repr.bth.pkey & 0x7fff == bth::DEFAULT_PKEY & 0x7fff
        && deth.qkey == mad::GSI_QKEY;
    if !ok {
        return None;
    }
    // The payload of the view borrows `p`; find it in `packet` instead.
    let at = p.header_len();
    packet
        .get(at..at.checked_add(mad::MAD_SIZE)?)
        .filter(|_| p.payload().len() >= mad::MAD_SIZE)
}
