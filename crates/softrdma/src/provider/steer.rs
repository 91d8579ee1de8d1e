//! The classic BPF programs that steer a shared device's datagrams to the process that owns
//! their QP (see [`super::share`] and `docs/design/shared_devices.md`), and the discovery
//! markers they steer by index.

/// The opcode byte of a discovery marker: 0xFF, in the manufacturer-specific range, which no
/// transport sends.
pub(crate) const MARKER_OPCODE: u8 = 0xFF;
/// The bytes after the index that mark a datagram as a marker.
pub(crate) const MARKER_MAGIC: [u8; 4] = *b"SRDM";
/// `[0xFF, index, magic(4), from_slot, nonce(8)]`.
pub(crate) const MARKER_LEN: usize = 15;

const BPF_LD_B_ABS: u16 = 0x30;
const BPF_JEQ_K: u16 = 0x15;
const BPF_RET_K: u16 = 0x06;
const BPF_RET_A: u16 = 0x16;

fn ins(code: u16, jt: u8, jf: u8, k: u32) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

/// The steering program for `members` (slot, group index): a marker goes to the index in its
/// second byte; any other datagram to the index of the slot in its byte 5 (the top byte of
/// the BTH destination QP); a datagram for no member's slot to an index past the group, which
/// makes the kernel fall back to its hash.
pub(crate) fn steering_program(members: &[(u8, u8)]) -> Vec<libc::sock_filter> {
    let mut p = vec![
        ins(BPF_LD_B_ABS, 0, 0, 0),
        ins(BPF_JEQ_K, 0, 2, u32::from(MARKER_OPCODE)),
        ins(BPF_LD_B_ABS, 0, 0, 1),
        ins(BPF_RET_A, 0, 0, 0),
        ins(BPF_LD_B_ABS, 0, 0, 5),
    ];
    for &(slot, index) in members {
        p.push(ins(BPF_JEQ_K, 0, 1, u32::from(slot)));
        p.push(ins(BPF_RET_K, 0, 0, u32::from(index)));
    }
    p.push(ins(BPF_RET_K, 0, 0, u32::MAX));
    p
}

/// A program that steers nothing: every datagram falls back to the kernel's hash.
pub(crate) fn hash_program() -> Vec<libc::sock_filter> {
    vec![ins(BPF_RET_K, 0, 0, u32::MAX)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_program_sends_markers_by_their_byte_and_packets_by_their_slot() {
        // Interpret the program on a few payloads.
        fn run(p: &[libc::sock_filter], pkt: &[u8]) -> u32 {
            let (mut pc, mut a) = (0usize, 0u32);
            loop {
                let i = p[pc];
                match i.code {
                    BPF_LD_B_ABS => a = u32::from(pkt.get(i.k as usize).copied().unwrap_or(0)),
                    BPF_JEQ_K => {
                        pc += usize::from(if a == i.k { i.jt } else { i.jf });
                    }
                    BPF_RET_K => return i.k,
                    BPF_RET_A => return a,
                    _ => panic!("unknown instruction"),
                }
                pc += 1;
            }
        }
        let p = steering_program(&[(7, 0), (9, 2), (200, 1)]);
        let mut marker = [0u8; MARKER_LEN];
        marker[0] = MARKER_OPCODE;
        marker[1] = 5;
        assert_eq!(run(&p, &marker), 5);
        let pkt = |slot: u8| [0x04, 0, 0, 0, 0, slot, 0x12, 0x34, 0, 0, 0, 1];
        assert_eq!(run(&p, &pkt(7)), 0);
        assert_eq!(run(&p, &pkt(9)), 2);
        assert_eq!(run(&p, &pkt(200)), 1);
        assert_eq!(run(&p, &pkt(8)), u32::MAX);
        assert!(p.len() < 4096);
    }
}
