//! Packet capture: every packet the devices of this process send, and every packet they
//! receive from outside the process, written to a classic pcap file with the Ethernet, IP
//! and UDP headers it has on the wire, so Wireshark shows RoCEv2 as a switch would see it.
//!
//! Start it with [`start_capture`] or by setting `SOFTRDMA_PCAP=/path/file.pcap` before the
//! first device carries traffic; stop it with [`stop_capture`]. Packets exchanged between two
//! devices of the same process are written once (when sent). A sent packet is written as
//! sealed, with IPv4 identification 0 and its ICRC for it; where it leaves in a UDP GSO
//! message toward another host over IPv4, the `k`-th datagram of the message carries
//! identification `k` on the wire and the ICRC for that instead (see `UdpSock::send_batch`):
//! the same packet, both forms valid.
//!
//! Nothing recorded is lost: records are buffered and written whole (the file is a readable
//! pcap after every write), at least every [`FLUSH_EVERY`] of traffic, at [`stop_capture`],
//! when the process exits normally (an `atexit` hook) and on SIGINT, SIGTERM, SIGHUP or
//! SIGQUIT when the program left those at their default action (the handler writes what is
//! buffered, then lets the signal end the process as it would have). A process that crashes
//! leaves a readable file holding everything up to its last write.

use crate::error::{Error, Result};
use softrdma_wire::ip::{
    EthernetFrame, EthernetRepr, Ipv4Packet, Ipv4Repr, Ipv6Packet, Ipv6Repr, UdpPacket, UdpRepr,
    ETHERNET_HEADER_LEN, ETHERTYPE_IPV4, ETHERTYPE_IPV6, IPV4_HEADER_LEN, IPV6_HEADER_LEN,
    IP_PROTOCOL_UDP, UDP_HEADER_LEN,
};
use softrdma_wire::pcap::{PcapWriter, LINKTYPE_ETHERNET};
use std::fs::File;
use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The longest time a recorded packet waits in memory while traffic goes on.
pub const FLUSH_EVERY: Duration = Duration::from_millis(20);
/// Buffered bytes that trigger a write at once.
const FLUSH_BYTES: usize = 256 << 10;

/// The file behind the pcap writer: whole records accumulate in `buf` and reach the file
/// only through [`RecordFile::write_out`], so the file always ends on a record boundary.
struct RecordFile {
    file: File,
    buf: Vec<u8>,
    last: Instant,
}

impl Write for RecordFile {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(data);
        Ok(data.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.write_out()
    }
}

impl RecordFile {
    fn write_out(&mut self) -> std::io::Result<()> {
        self.last = Instant::now();
        if self.buf.is_empty() {
            return Ok(());
        }
        let r = self.file.write_all(&self.buf);
        self.buf.clear();
        r
    }
}

struct Capture {
    writer: PcapWriter<RecordFile>,
    frame: Vec<u8>,
}

static ON: AtomicBool = AtomicBool::new(false);
static CAPTURE: OnceLock<Mutex<Option<Capture>>> = OnceLock::new();

fn slot() -> &'static Mutex<Option<Capture>> {
    CAPTURE.get_or_init(|| {
        let c = std::env::var_os("SOFTRDMA_PCAP").and_then(|p| open(Path::new(&p)).ok());
        ON.store(c.is_some(), Ordering::Release);
        Mutex::new(c)
    })
}

fn open(path: &Path) -> Result<Capture> {
    let f = File::create(path)
        .map_err(|e| Error::from_io(e, format!("creating the capture file {}", path.display())))?;
    let file = RecordFile {
        file: f,
        buf: Vec::with_capacity(FLUSH_BYTES + 8192),
        last: Instant::now(),
    };
    let mut writer = PcapWriter::new(file, LINKTYPE_ETHERNET, 65535)
        .map_err(|e| Error::from_io(e, "writing the pcap header"))?;
    // The header goes out at once: even a capture of nothing is a valid pcap file.
    writer
        .flush()
        .map_err(|e| Error::from_io(e, "writing the pcap header"))?;
    install_exit_hooks();
    Ok(Capture {
        writer,
        frame: Vec::with_capacity(4096 + 128),
    })
}

/// Writes what is buffered, if the capture lock can be had without waiting (from a signal
/// handler the interrupted thread may hold it; then what it holds is lost, nothing else).
fn flush_now() {
    let Some(m) = CAPTURE.get() else { return };
    let mut g = match m.try_lock() {
        Ok(g) => g,
        Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
        Err(std::sync::TryLockError::WouldBlock) => return,
    };
    if let Some(c) = g.as_mut() {
        let _ = c.writer.flush();
    }
}

extern "C" fn flush_at_exit() {
    flush_now();
}

extern "C" fn flush_on_signal(sig: libc::c_int) {
    flush_now();
    // SAFETY: restoring the default action and re-raising the signal are async-signal-safe;
    // the process then ends as it would have without the capture.
    unsafe {
        libc::signal(sig, libc::SIG_DFL);
        libc::raise(sig);
    }
}

/// Once per process: an `atexit` flush, and a flush before the default action of the
/// terminating signals a program did not handle itself.
fn install_exit_hooks() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: registering a plain extern "C" function with atexit; querying and setting
        // signal dispositions with a zeroed sigaction and our own handler, which only takes
        // a lock without waiting, writes, and re-raises.
        unsafe {
            libc::atexit(flush_at_exit);
            for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT] {
                let mut old: libc::sigaction = std::mem::zeroed();
                if libc::sigaction(sig, std::ptr::null(), &mut old) != 0 {
                    continue;
                }
                if old.sa_sigaction != libc::SIG_DFL {
                    continue;
                }
                let mut sa: libc::sigaction = std::mem::zeroed();
                sa.sa_sigaction = flush_on_signal as extern "C" fn(libc::c_int) as usize;
                sa.sa_flags = libc::SA_RESTART;
                libc::sigemptyset(&mut sa.sa_mask);
                libc::sigaction(sig, &sa, std::ptr::null_mut());
            }
        }
    });
}

/// Starts writing every packet of this process's devices to `path` (replacing any capture in
/// progress).
///
/// Fails with the errno of creating or writing the file.
pub fn start_capture(path: impl AsRef<Path>) -> Result<()> {
    let c = open(path.as_ref())?;
    let mut g = slot().lock().unwrap_or_else(|p| p.into_inner());
    if let Some(mut old) = g.take() {
        let _ = old.writer.flush();
    }
    *g = Some(c);
    ON.store(true, Ordering::Release);
    Ok(())
}

/// Stops the capture and flushes the file. Does nothing when no capture runs.
///
/// Fails with the errno of the final write.
pub fn stop_capture() -> Result<()> {
    let mut g = slot().lock().unwrap_or_else(|p| p.into_inner());
    ON.store(false, Ordering::Release);
    if let Some(mut c) = g.take() {
        c.writer
            .flush()
            .map_err(|e| Error::from_io(e, "flushing the capture file"))?;
    }
    Ok(())
}

/// Writes the buffered records when a capture runs (a progress thread calls it before it
/// sleeps, so a quiet process's packets are on disk too). One atomic load when none runs.
pub(crate) fn flush_idle() {
    if !ON.load(Ordering::Acquire) {
        return;
    }
    let mut g = slot().lock().unwrap_or_else(|p| p.into_inner());
    if let Some(c) = g.as_mut() {
        if !c.writer.get_mut().buf.is_empty() {
            let _ = c.writer.get_mut().write_out();
        }
    }
}

/// Whether a capture runs (cheap; checked per batch).
#[inline]
pub(crate) fn active() -> bool {
    if CAPTURE.get().is_none() {
        return slot().lock().map(|g| g.is_some()).unwrap_or(false);
    }
    ON.load(Ordering::Acquire)
}

fn mac_for(ip: IpAddr) -> [u8; 6] {
    let b = match ip {
        IpAddr::V4(a) => a.octets(),
        IpAddr::V6(a) => {
            let o = a.octets();
            [o[12], o[13], o[14], o[15]]
        }
    };
    [0x02, 0x53, b[0], b[1], b[2], b[3]]
}

/// The device sockets of this process: what they send each other is recorded once, when
/// sent.
static LOCAL_DEVICES: Mutex<Vec<SocketAddr>> = Mutex::new(Vec::new());

/// Notes the socket of a device of this process (see [`record_received`]).
pub(crate) fn note_local_device(addr: SocketAddr) {
    let mut l = LOCAL_DEVICES.lock().unwrap_or_else(|p| p.into_inner());
    if !l.contains(&addr) {
        l.push(addr);
    }
}

/// Records a packet the device at `dst` received from `src` with IPv4 identification
/// `ident`, unless `src` is a device of this process (which recorded it when sending).
pub(crate) fn record_received(src: SocketAddr, dst: SocketAddr, payload: &[u8], ident: u16) {
    let local = LOCAL_DEVICES
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .contains(&src);
    if !local {
        record_ident(src, dst, payload, ident);
    }
}

/// Writes one RoCEv2 datagram (`payload` is the UDP payload) as an Ethernet frame.
pub(crate) fn record(src: SocketAddr, dst: SocketAddr, payload: &[u8]) {
    record_ident(src, dst, payload, 0);
}

/// [`record`] with the IPv4 identification `ident` in the frame's header (the one the
/// packet's ICRC was computed with; ignored for IPv6).
pub(crate) fn record_ident(src: SocketAddr, dst: SocketAddr, payload: &[u8], ident: u16) {
    let mut g = slot().lock().unwrap_or_else(|p| p.into_inner());
    let Some(c) = g.as_mut() else { return };
    let ip_len = if src.is_ipv4() {
        IPV4_HEADER_LEN
    } else {
        IPV6_HEADER_LEN
    };
    let total = ETHERNET_HEADER_LEN + ip_len + UDP_HEADER_LEN + payload.len();
    c.frame.clear();
    c.frame.resize(total, 0);
    let f = &mut c.frame[..];
    let eth = EthernetRepr {
        src_addr: mac_for(src.ip()),
        dst_addr: mac_for(dst.ip()),
        ethertype: if src.is_ipv4() {
            ETHERTYPE_IPV4
        } else {
            ETHERTYPE_IPV6
        },
    };
    eth.emit(&mut EthernetFrame::new_unchecked(
        &mut f[..ETHERNET_HEADER_LEN],
    ));
    let ip = &mut f[ETHERNET_HEADER_LEN..ETHERNET_HEADER_LEN + ip_len];
    let udp_payload = UDP_HEADER_LEN + payload.len();
    let ok = match (src.ip(), dst.ip()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => Ipv4Repr {
            src_addr: s,
            dst_addr: d,
            protocol: IP_PROTOCOL_UDP,
            payload_len: udp_payload,
            ttl: 64,
            tos: 0,
            ident,
            dont_frag: true,
        }
        .emit(&mut Ipv4Packet::new_unchecked(ip))
        .is_ok(),
        (IpAddr::V6(s), IpAddr::V6(d)) => Ipv6Repr {
            src_addr: s,
            dst_addr: d,
            next_header: IP_PROTOCOL_UDP,
            payload_len: udp_payload,
            hop_limit: 64,
            traffic_class: 0,
            flow_label: 0,
        }
        .emit(&mut Ipv6Packet::new_unchecked(ip))
        .is_ok(),
        _ => false,
    };
    if !ok {
        return;
    }
    let at = ETHERNET_HEADER_LEN + ip_len;
    let udp = UdpRepr {
        src_port: src.port(),
        dst_port: dst.port(),
        payload_len: payload.len(),
    };
    if udp
        .emit(&mut UdpPacket::new_unchecked(
            &mut f[at..at + UDP_HEADER_LEN],
        ))
        .is_err()
    {
        return;
    }
    f[at + UDP_HEADER_LEN..].copy_from_slice(payload);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let mut r = c
        .writer
        .write_record(now.as_secs() as u32, now.subsec_nanos(), &c.frame);
    if r.is_ok() {
        let f = c.writer.get_mut();
        if f.buf.len() >= FLUSH_BYTES || f.last.elapsed() >= FLUSH_EVERY {
            r = f.write_out();
        }
    }
    if let Err(e) = r {
        tracing::warn!(error = %e, "packet capture stopped");
        *g = None;
        ON.store(false, Ordering::Release);
    }
}
