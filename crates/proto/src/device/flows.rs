//! The ICRC flows of a device: the masked IP and UDP pseudo-header of every sender it hears
//! from and every peer it sends to ([`IcrcPrefix`]), the check of a received packet's ICRC
//! (with the IPv4 identification solved for other stacks), and the GRH a UD receive gets.

use super::counters::{DeviceCounters, DropReason};
use softrdma_wire::icrc::{IcrcPrefix, IdentSolver};
use softrdma_wire::{bth, ip, opcode::Opcode, roce, ROCE_V2_UDP_PORT};
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};

/// The ICRC flow of datagrams from `src` port `src_port` to `dst` port 4791: IPv4 when both
/// addresses are IPv4 (identification 0, DF: what a softrdma peer sends), IPv6 otherwise
/// (IPv4 addresses mapped). Never fails.
pub fn icrc_flow(src: IpAddr, src_port: u16, dst: IpAddr) -> IcrcPrefix {
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => IcrcPrefix::ipv4(s, d, src_port, ROCE_V2_UDP_PORT),
        (s, d) => IcrcPrefix::ipv6(
            ip::ip_to_gid(s),
            ip::ip_to_gid(d),
            src_port,
            ROCE_V2_UDP_PORT,
        ),
    }
}

/// The 40-byte GRH area a UD receive gets for a transport packet of `packet_len` bytes from
/// `src` to `dst`: the IP header the datagram came with as softrdma peers send it (TTL 64,
/// DF, identification 0), an IPv4 one in the last 20 bytes after 20 zero bytes, or an IPv6
/// one (IPv4 addresses mapped) when either address is IPv6. Built through
/// [`softrdma_wire::ip`]. Never fails: a packet too long for the length fields, which
/// cannot arrive in a UDP datagram, leaves them zero.
pub fn grh_for(src: IpAddr, dst: IpAddr, packet_len: usize) -> [u8; 40] {
    let mut g = [0u8; 40];
    let udp_len = ip::UDP_HEADER_LEN + packet_len;
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            let repr = ip::Ipv4Repr {
                src_addr: s,
                dst_addr: d,
                protocol: ip::IP_PROTOCOL_UDP,
                payload_len: udp_len,
                ttl: 64,
                tos: 0,
                ident: 0,
                dont_frag: true,
            };
            let _ = repr.emit(&mut ip::Ipv4Packet::new_unchecked(&mut g[20..]));
        }
        (s, d) => {
            let repr = ip::Ipv6Repr {
                src_addr: ip::ip_to_gid(s),
                dst_addr: ip::ip_to_gid(d),
                next_header: ip::IP_PROTOCOL_UDP,
                payload_len: udp_len,
                hop_limit: 64,
                traffic_class: 0,
                flow_label: 0,
            };
            let _ = repr.emit(&mut ip::Ipv6Packet::new_unchecked(&mut g[..]));
        }
    }
    g
}

/// Packets verified with identification 0, and none through a solved one of [`GSO_IDENTS`]
/// or more, after which a sender counts as a softrdma peer whose packets get the full 32-bit
/// check, or that of identifications below [`GSO_IDENTS`] (a corrupted packet would
/// otherwise pass the 16-bit check of a solved identification with probability 2^-16).
/// Linux rxe varies the identification per packet, so its flows solve one long before this
/// many zeros. The provider's receive path uses the same number.
pub const ZERO_IDENT_PEER: u32 = 64;

/// Identifications below this are the numbers the kernel gives the datagrams of one UDP GSO
/// message over IPv4 (0, 1, 2, ...; a softrdma sender's super-datagrams hold at most 64), with
/// which a softrdma peer seals them: a sender counted as a softrdma peer
/// ([`ZERO_IDENT_PEER`]) gets its packets accepted with a solved identification below this
/// too. A corrupted packet passes that check with probability 63 x 2^-32 (about 2^-26), not
/// 2^-32; a solved identification this small does not make the sender another stack.
pub const GSO_IDENTS: u16 = 64;

/// What the receive side keeps per sender: its ICRC prefix and how its packets verified.
#[derive(Debug)]
struct RxFlow {
    prefix: IcrcPrefix,
    /// Packets verified with identification 0 (saturating).
    zero_ident: u32,
    /// Whether a packet ever verified through a solved identification of [`GSO_IDENTS`] or
    /// more (another stack).
    solved_any: bool,
}

impl RxFlow {
    /// The flow of a sender; `kept` (in the table, for the packets to come): with the header
    /// states of short packets (see [`IcrcPrefix::with_short_states`]), which a flow made
    /// for one message would not repay.
    fn new(src: SocketAddr, dst: IpAddr, kept: bool) -> RxFlow {
        let prefix = icrc_flow(src.ip(), src.port(), dst);
        RxFlow {
            prefix: if kept {
                prefix.with_short_states()
            } else {
                prefix
            },
            zero_ident: 0,
            solved_any: false,
        }
    }
}

/// The receive flows of a device: the ICRC prefix of every sender and how its packets
/// verified, at most `max` senders (one beyond that is checked with a prefix built for its
/// packets and kept nowhere). [`Device::handle_datagram`](super::Device::handle_datagram)
/// checks with one; an owner that receives by itself can hold its own and check the
/// packets of one message (a GRO batch from one sender) through one [`Sender`].
#[derive(Debug)]
pub struct RxFlows {
    /// Where each kept sender's flow is in `flows`.
    index: HashMap<(SocketAddr, IpAddr), usize>,
    flows: Vec<RxFlow>,
    /// The sender of the last [`RxFlows::sender`] and its place: nearly every message comes
    /// from the sender of the one before, which then costs no hash lookup.
    last: Option<((SocketAddr, IpAddr), usize)>,
    max: usize,
    solver: IdentSolver,
}

/// Whether a UDP payload is a RoCEv2 CNP: opcode `0x81` in a packet of exactly its size
/// (BTH, 16 reserved bytes, ICRC).
fn is_cnp(pkt: &[u8]) -> bool {
    pkt.len() == bth::HEADER_LEN + 16 + roce::ICRC_LEN && pkt.first() == Some(&Opcode::CNP.0)
}

/// The flow of one sender, to check its packets with ([`RxFlows::sender`]).
#[derive(Debug)]
pub struct Sender<'a> {
    flow: SenderFlow<'a>,
    solver: &'a mut IdentSolver,
}

#[derive(Debug)]
enum SenderFlow<'a> {
    Kept(&'a mut RxFlow),
    Spare(RxFlow),
}

impl RxFlows {
    /// No flow yet; at most `max` senders kept.
    pub fn new(max: usize) -> RxFlows {
        RxFlows {
            index: HashMap::new(),
            flows: Vec::new(),
            last: None,
            max,
            solver: IdentSolver::new(),
        }
    }

    /// The flow of datagrams from `src` to `dst`, kept (created if there is room).
    pub fn sender(&mut self, src: SocketAddr, dst: IpAddr) -> Sender<'_> {
        let key = (src, dst);
        let at = match self.last {
            Some((k, i)) if k == key => Some(i),
            _ => {
                let at = match self.index.get(&key) {
                    Some(&i) => Some(i),
                    None if self.flows.len() < self.max => {
                        self.flows.push(RxFlow::new(src, dst, true));
                        self.index.insert(key, self.flows.len() - 1);
                        Some(self.flows.len() - 1)
                    }
                    None => None,
                };
                if let Some(i) = at {
                    self.last = Some((key, i));
                }
                at
            }
        };
        let flow = match at {
            Some(i) => SenderFlow::Kept(&mut self.flows[i]),
            None => SenderFlow::Spare(RxFlow::new(src, dst, false)),
        };
        Sender {
            flow,
            solver: &mut self.solver,
        }
    }

    /// Checks one received transport packet `pkt` (BTH through ICRC) from `src` to `dst`
    /// (see [`Sender::check`]).
    pub fn check(
        &mut self,
        c: &mut DeviceCounters,
        pkt: &[u8],
        src: SocketAddr,
        dst: IpAddr,
    ) -> Result<(u32, u16), DropReason> {
        self.sender(src, dst).check(c, pkt)
    }

    /// The number of senders whose flows are kept.
    pub fn len(&self) -> usize {
        self.flows.len()
    }

    /// Whether no sender's flow is kept.
    pub fn is_empty(&self) -> bool {
        self.flows.is_empty()
    }
}

impl Sender<'_> {
    /// Checks one received transport packet `pkt` (BTH through ICRC) of this sender: its
    /// layout and its ICRC. Returns the destination QP number of a good packet and the
    /// IPv4 identification it verified with; counts a bad one (and a CNP) and says why it
    /// was dropped. Good packets are counted by the caller. Never panics.
    pub fn check(&mut self, c: &mut DeviceCounters, pkt: &[u8]) -> Result<(u32, u16), DropReason> {
        let flow = match &mut self.flow {
            SenderFlow::Kept(f) => &mut **f,
            SenderFlow::Spare(f) => f,
        };
        // A sender whose packets all verified with identification 0 or the small numbers of
        // a GSO message (a softrdma peer) keeps (nearly) the full 32-bit check: its packets
        // are accepted through a solved identification only below GSO_IDENTS.
        let limit = if flow.solved_any || flow.zero_ident < ZERO_IDENT_PEER {
            u32::from(u16::MAX) + 1
        } else {
            u32::from(GSO_IDENTS)
        };
        let solver = Some((&mut *self.solver, limit));
        let Ok(view) = roce::Packet::new_checked(pkt) else {
            if is_cnp(pkt) {
                let (covered, icrc) = pkt.split_at(pkt.len() - roce::ICRC_LEN);
                let icrc = u32::from_le_bytes([icrc[0], icrc[1], icrc[2], icrc[3]]);
                verify_icrc_below(c, &flow.prefix, solver, covered, icrc)?;
                c.count_drop(DropReason::Cnp, 1);
                return Err(DropReason::Cnp);
            }
            c.count_drop(DropReason::Malformed, 1);
            return Err(DropReason::Malformed);
        };
        let ident = verify_icrc_below(c, &flow.prefix, solver, view.icrc_covered(), view.icrc())?;
        if ident == 0 {
            flow.zero_ident = flow.zero_ident.saturating_add(1);
        } else if ident >= GSO_IDENTS {
            flow.solved_any = true;
        }
        Ok((view.bth().dest_qp(), ident))
    }
}

/// Verifies the ICRC `icrc` of the bytes it covers against a flow's prefix: first as sent
/// with IPv4 identification 0 (the full 32-bit check), then, when `solver` is given, with
/// the identification solved from the ICRC. Returns the identification that matched;
/// counts and fails with [`DropReason::Icrc`] when none does. [`Sender::check`] decides
/// whether to solve from the sender's history; a check with no history (the provider's
/// multicast groups) always passes a solver.
pub fn verify_icrc(
    c: &mut DeviceCounters,
    prefix: &IcrcPrefix,
    solver: Option<&mut IdentSolver>,
    covered: &[u8],
    icrc: u32,
) -> Result<u16, DropReason> {
    let solver = solver.map(|s| (s, u32::from(u16::MAX) + 1));
    verify_icrc_below(c, prefix, solver, covered, icrc)
}

/// [`verify_icrc`], accepting a solved identification only below the limit given with the
/// solver.
fn verify_icrc_below(
    c: &mut DeviceCounters,
    prefix: &IcrcPrefix,
    solver: Option<(&mut IdentSolver, u32)>,
    covered: &[u8],
    icrc: u32,
) -> Result<u16, DropReason> {
    match prefix.compute(covered) {
        Ok(crc) if crc == icrc => Ok(0),
        Ok(crc) => match solver.and_then(|(s, limit)| {
            prefix
                .solve_ident(s, covered.len(), crc, icrc)
                .filter(|&i| u32::from(i) < limit)
        }) {
            Some(ident) => {
                c.icrc_ident_solved = c.icrc_ident_solved.saturating_add(1);
                Ok(ident)
            }
            None => {
                c.count_drop(DropReason::Icrc, 1);
                Err(DropReason::Icrc)
            }
        },
        Err(_) => {
            c.count_drop(DropReason::Icrc, 1);
            Err(DropReason::Icrc)
        }
    }
}

/// Why a packet could not be sealed ([`Sealer::seal`], [`Device::seal`](super::Device::seal)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SealError {
    /// Shorter than a BTH plus an ICRC.
    Truncated,
    /// Too long for the IP and UDP length fields.
    TooLong,
    /// A gap ([`Sealer::seal_around`]) out of order, overlapping the BTH or past the bytes
    /// the ICRC covers.
    BadGap,
}

/// Seals the packets one device sends: computes each one's ICRC over the pseudo-header of
/// the flow from the device's address and port to the destination's port 4791, keeping the
/// prefix of every destination (up to a bound) and the last one at hand, as nearly every
/// packet goes where the one before went. A [`Device`](super::Device) holds one; a sending
/// thread of the provider can hold its own (beside its transmit batch), since sealing needs
/// nothing else of the device.
#[derive(Debug, Clone)]
pub struct Sealer {
    local: IpAddr,
    port: u16,
    flows: HashMap<IpAddr, IcrcPrefix>,
    max: usize,
    last: Option<(IpAddr, IcrcPrefix)>,
}

impl Sealer {
    /// The sealer of a device at `local` sending from UDP port `port` (4791 for a device
    /// socket), keeping at most `max_flows` destinations' prefixes.
    pub fn new(local: IpAddr, port: u16, max_flows: usize) -> Sealer {
        Sealer {
            local,
            port,
            flows: HashMap::new(),
            max: max_flows,
            last: None,
        }
    }

    /// Stores in the last 4 bytes of `packet` (BTH through ICRC) its ICRC for the flow to
    /// `dst` port 4791 (IPv4 with identification 0 and DF when both addresses are IPv4,
    /// IPv6 otherwise). Fails, leaving `packet` as it was, when it is shorter than a BTH
    /// plus an ICRC or too long for the length fields. Allocates nothing once `dst` is known.
    pub fn seal(&mut self, dst: IpAddr, packet: &mut [u8]) -> Result<(), SealError> {
        if packet.len() < roce::MIN_LEN {
            return Err(SealError::Truncated);
        }
        let covered = packet.len() - roce::ICRC_LEN;
        let crc = self
            .icrc(dst, &packet[..covered])
            .map_err(|_| SealError::TooLong)?;
        packet[covered..].copy_from_slice(&crc.to_le_bytes());
        Ok(())
    }

    /// [`Sealer::seal`] of a packet whose bytes in `gaps` (offset and length in `packet`,
    /// in order, none overlapping, all after the BTH and before the ICRC) are not in `packet`
    /// but hashed by `crc_of(k, crc)` for gap `k` (see
    /// [`IcrcHasher::update_with`](softrdma_wire::icrc::IcrcHasher::update_with)): a payload
    /// sent from memory the packet's buffer does not hold. Fails like [`Sealer::seal`], and
    /// with [`SealError::BadGap`] for gaps out of place; `packet` is left as it was then.
    pub fn seal_around(
        &mut self,
        dst: IpAddr,
        packet: &mut [u8],
        gaps: &[(usize, usize)],
        mut crc_of: impl FnMut(usize, u32) -> u32,
    ) -> Result<(), SealError> {
        if packet.len() < roce::MIN_LEN {
            return Err(SealError::Truncated);
        }
        let covered = packet.len() - roce::ICRC_LEN;
        let mut at = softrdma_wire::bth::HEADER_LEN;
        for &(off, len) in gaps {
            if off < at || off.checked_add(len).is_none_or(|end| end > covered) {
                return Err(SealError::BadGap);
            }
            at = off + len;
        }
        let mut h = self
            .prefix(dst)
            .start(covered)
            .map_err(|_| SealError::TooLong)?;
        let mut at = 0;
        for (k, &(off, len)) in gaps.iter().enumerate() {
            h.update(&packet[at..off]);
            h.update_with(len, |crc| crc_of(k, crc))
                .map_err(|_| SealError::BadGap)?;
            at = off + len;
        }
        h.update(&packet[at..covered]);
        packet[covered..].copy_from_slice(&h.finalize().to_le_bytes());
        Ok(())
    }

    /// The ICRC of `covered` (BTH through pad) sent to `dst`.
    fn icrc(&mut self, dst: IpAddr, covered: &[u8]) -> softrdma_wire::Result<u32> {
        self.prefix(dst).compute(covered)
    }

    /// The prefix of the flow to `dst`, made and kept (up to the bound) when new.
    fn prefix(&mut self, dst: IpAddr) -> &IcrcPrefix {
        if matches!(&self.last, Some((d, _)) if *d == dst) {
            return &self.last.as_ref().expect("just matched").1;
        }
        let p = match self.flows.get(&dst) {
            Some(p) => p.clone(),
            None => {
                let p = icrc_flow(self.local, self.port, dst);
                if self.flows.len() < self.max {
                    // (Kept: its short packets' header states repay their making.)
                    let p = p.with_short_states();
                    self.flows.insert(dst, p.clone());
                    p
                } else {
                    p
                }
            }
        };
        &self.last.insert((dst, p)).1
    }
}

#[cfg(test)]
mod tests {
    use super::grh_for;
    use softrdma_wire::ip::{Ipv4Packet, Ipv6Packet, IP_PROTOCOL_UDP};
    use std::net::IpAddr;

    #[test]
    fn grh_carries_the_ip_header_the_datagram_came_with() {
        let (a, b): (IpAddr, IpAddr) =
            ("127.91.0.1".parse().unwrap(), "127.91.0.2".parse().unwrap());
        let g = grh_for(a, b, 100);
        assert_eq!(g[..20], [0; 20]);
        let p = Ipv4Packet::new_unchecked(&g[20..]);
        assert!(p.verify_checksum());
        assert_eq!(
            &g[20..32],
            &[0x45, 0, 0, 128, 0, 0, 0x40, 0, 64, 17, g[30], g[31]]
        );
        assert_eq!(
            (p.src_addr(), p.dst_addr(), p.total_len()),
            (
                "127.91.0.1".parse().unwrap(),
                "127.91.0.2".parse().unwrap(),
                128
            )
        );
        let (a, b): (IpAddr, IpAddr) = ("fd00::1".parse().unwrap(), "fd00::2".parse().unwrap());
        let g = grh_for(a, b, 100);
        let p = Ipv6Packet::new_unchecked(&g[..]);
        assert_eq!(g[0..4], [0x60, 0, 0, 0]);
        assert_eq!(
            (p.next_header(), p.hop_limit(), p.payload_len()),
            (IP_PROTOCOL_UDP, 64, 108)
        );
        assert_eq!(
            (p.src_addr(), p.dst_addr()),
            ("fd00::1".parse().unwrap(), "fd00::2".parse().unwrap())
        );
    }

    #[test]
    fn a_packet_sealed_around_its_gaps_gets_the_icrc_of_the_whole() {
        use super::{SealError, Sealer};
        let (a, b): (IpAddr, IpAddr) =
            ("127.91.0.1".parse().unwrap(), "127.91.0.2".parse().unwrap());
        // An RC SEND (BTH, 2,000 payload bytes, ICRC) and its payload's bytes elsewhere.
        let payload: Vec<u8> = (0..2000u32).map(|i| (i * 7 + 3) as u8).collect();
        let mut whole = vec![0u8; 12 + 2000 + 4];
        whole[0] = 0x04;
        whole[7] = 0x12;
        whole[12..2012].copy_from_slice(&payload);
        let mut s = Sealer::new(a, 4791, 8);
        s.seal(b, &mut whole).unwrap();
        for gaps in [
            vec![(12, 2000)],
            vec![(12, 1000), (1012, 1000)],
            vec![(100, 10), (500, 1500)],
            vec![],
        ] {
            let mut p = whole.clone();
            for &(off, len) in &gaps {
                p[off..off + len].fill(0xee);
            }
            p[2012..].fill(0);
            s.seal_around(b, &mut p, &gaps, |k, crc| {
                let (off, len) = gaps[k];
                let mut h = crc32fast::Hasher::new_with_initial(crc);
                h.update(&payload[off - 12..off - 12 + len]);
                h.finalize()
            })
            .unwrap();
            assert_eq!(p[2012..], whole[2012..], "gaps {gaps:?}");
        }
        // Gaps out of place: refused, the packet untouched.
        for gaps in [
            vec![(4, 20)],
            vec![(12, 2001)],
            vec![(500, 10), (100, 10)],
            vec![(100, 10), (105, 10)],
        ] {
            let mut p = whole.clone();
            let r = s.seal_around(b, &mut p, &gaps, |_, c| c);
            assert_eq!(r, Err(SealError::BadGap), "gaps {gaps:?}");
            assert_eq!(p, whole);
        }
    }

    #[test]
    fn each_sender_is_checked_with_its_own_flow_whatever_the_order() {
        use super::{RxFlows, Sealer};
        use crate::device::DeviceCounters;
        use std::net::SocketAddr;
        let dst: IpAddr = "127.91.0.9".parse().unwrap();
        let senders: Vec<SocketAddr> = (1..=3)
            .map(|i| format!("127.91.0.{i}:4791").parse().unwrap())
            .collect();
        // A packet sealed by each sender (BTH of a UD SEND_ONLY to QP 0x12, DETH, payload).
        let sealed: Vec<Vec<u8>> = senders
            .iter()
            .map(|s| {
                let mut p = vec![0u8; 12 + 8 + 16 + 4];
                p[0] = 0x64;
                p[2] = 0xff;
                p[3] = 0xff;
                p[7] = 0x12;
                Sealer::new(s.ip(), 4791, 8).seal(dst, &mut p).unwrap();
                p
            })
            .collect();
        let mut flows = RxFlows::new(2);
        let mut c = DeviceCounters::default();
        // Alternating senders (the last-sender shortcut must not hand one the other's flow),
        // the third beyond the bound of two kept flows.
        for round in 0..3 {
            for (i, s) in senders.iter().enumerate() {
                let j = (i + round) % 3;
                let own = flows.sender(*s, dst).check(&mut c, &sealed[i]);
                assert_eq!(own, Ok((0x12, 0)), "sender {i}, round {round}");
                if j != i {
                    let other = flows.sender(*s, dst).check(&mut c, &sealed[j]);
                    assert!(other.is_err(), "sender {i} took sender {j}'s packet");
                }
            }
        }
        assert_eq!(flows.len(), 2);
    }
}
