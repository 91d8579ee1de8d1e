//! Checks the ICRC of every RoCEv2 frame of a pcap file against the IP header as captured,
//! and, for IPv4, that solving for the identification (as a softrdma receiver, which cannot
//! see it, does) finds the one in the header. Prints one summary line per file and every bad
//! frame; exits 1 if any frame is bad or a file cannot be read.
//!
//! ```text
//! cargo run --release -p softrdma-wire --example pcap_icrc -- FILE.pcap...
//! ```

use softrdma_wire::pcap::{PcapReader, LINKTYPE_ETHERNET};
use softrdma_wire::{icrc, ip, ROCE_V2_UDP_PORT};

fn check(path: &str) -> Result<bool, String> {
    let data = std::fs::read(path).map_err(|e| format!("{path}: {e}"))?;
    let reader = PcapReader::new(&data).map_err(|e| format!("{path}: {e}"))?;
    if reader.link_type() != LINKTYPE_ETHERNET {
        return Err(format!("{path}: not an Ethernet capture"));
    }
    let (mut frames, mut bad, mut nonzero_ident, mut probes) = (0usize, 0usize, 0usize, 0usize);
    for (i, rec) in reader.records().enumerate() {
        let rec = rec.map_err(|e| format!("{path}: record {}: {e}", i + 1))?;
        let Ok(d) = ip::parse_ethernet_udp(rec.data) else {
            continue;
        };
        if d.dst_port != ROCE_V2_UDP_PORT {
            continue;
        }
        if d.payload.is_empty() {
            // softrdma's liveness probe to a connected peer: no RoCEv2 packet, no ICRC.
            probes += 1;
            continue;
        }
        frames += 1;
        let ip_packet = &rec.data[ip::ETHERNET_HEADER_LEN..];
        let ok = icrc::verify(ip_packet);
        let ident = ip::Ipv4Packet::new_checked(ip_packet)
            .ok()
            .map(|p| p.ident());
        let solved = ident.map(|_| icrc::recover_ident(ip_packet));
        match (ok, ident, solved) {
            (Ok(()), Some(id), Some(Ok(s))) if s == id => nonzero_ident += usize::from(id != 0),
            (Ok(()), None, None) => {}
            (ok, id, s) => {
                bad += 1;
                println!(
                    "{path}: frame {}: {} -> {}: ICRC {ok:?}, ident {id:04x?}, solved {s:04x?}",
                    i + 1,
                    d.src_addr,
                    d.dst_addr
                );
            }
        }
    }
    println!(
        "{path}: {frames} RoCEv2 frames, {bad} with a bad ICRC, {nonzero_ident} with a nonzero IPv4 identification, {probes} empty liveness probes"
    );
    Ok(bad == 0)
}

fn main() {
    let mut all_ok = true;
    for path in std::env::args().skip(1) {
        match check(&path) {
            Ok(ok) => all_ok &= ok,
            Err(e) => {
                eprintln!("pcap_icrc: {e}");
                all_ok = false;
            }
        }
    }
    std::process::exit(if all_ok { 0 } else { 1 });
}
