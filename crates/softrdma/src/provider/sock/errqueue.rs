//! Liveness probes and the socket's error queue (ICMP errors for what it sent).

use super::{from_sockaddr, to_sockaddr, UdpSock};
use std::net::SocketAddr;
use std::os::fd::AsRawFd;

impl UdpSock {
    /// Sends an empty datagram to `dst`: a liveness probe. RoCEv2 receivers drop it (softrdma
    /// counts it as a probe, Linux rxe as too short); a host where nothing holds the port
    /// answers with ICMP port unreachable, which [`UdpSock::take_icmp_errors`] then reads.
    /// Never blocks; a failure is ignored (the next probe tries again).
    pub(crate) fn send_probe(&self, dst: SocketAddr) {
        let (ss, len) = to_sockaddr(&dst);
        // SAFETY: an empty buffer and a valid sockaddr of `len` bytes.
        unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                std::ptr::null(),
                0,
                libc::MSG_DONTWAIT,
                (&ss as *const libc::sockaddr_storage).cast(),
                len,
            );
        }
    }

    /// Drains the socket's error queue (`IP_RECVERR` / `IPV6_RECVERR`), appending to `out`
    /// the original destination and errno of each datagram an ICMP error came back for
    /// (`ECONNREFUSED` for port unreachable, `EHOSTUNREACH`, `ENETUNREACH`, `EMSGSIZE` …).
    /// Errors of local origin are read and dropped. Never blocks; stops when the queue is
    /// empty or on an unexpected error (nothing is lost: the kernel keeps what was not read).
    pub(crate) fn take_icmp_errors(&self, out: &mut Vec<(SocketAddr, i32)>) {
        // The queue is bounded by the socket's receive buffer; a flood of ICMP errors is
        // rate-limited by the sender's kernel. Bound the work per call all the same.
        for _ in 0..256 {
            // SAFETY: all-zero bytes are a valid sockaddr_storage and msghdr.
            let mut name: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
            let mut data = [0u8; 64];
            let mut control = [0u64; 64];
            let mut iov = libc::iovec {
                iov_base: data.as_mut_ptr().cast(),
                iov_len: data.len(),
            };
            // SAFETY: as above.
            let mut h: libc::msghdr = unsafe { std::mem::zeroed() };
            h.msg_name = (&mut name as *mut libc::sockaddr_storage).cast();
            h.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            h.msg_iov = &mut iov;
            h.msg_iovlen = 1;
            h.msg_control = control.as_mut_ptr().cast();
            h.msg_controllen = std::mem::size_of_val(&control);
            // SAFETY: h points at live, writable buffers that outlive the call.
            let r = unsafe {
                libc::recvmsg(
                    self.fd.as_raw_fd(),
                    &mut h,
                    libc::MSG_ERRQUEUE | libc::MSG_DONTWAIT,
                )
            };
            if r < 0 {
                if std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                    continue;
                }
                return;
            }
            // SAFETY: the kernel wrote well-formed cmsgs into at most msg_controllen bytes of
            // `control`; each IP(V6)_RECVERR one holds a sock_extended_err (read unaligned).
            unsafe {
                let mut cm = libc::CMSG_FIRSTHDR(&h);
                while !cm.is_null() {
                    let c = &*cm;
                    let recverr = (c.cmsg_level == libc::IPPROTO_IP
                        && c.cmsg_type == libc::IP_RECVERR)
                        || (c.cmsg_level == libc::IPPROTO_IPV6
                            && c.cmsg_type == libc::IPV6_RECVERR);
                    if recverr {
                        let ee = std::ptr::read_unaligned(
                            libc::CMSG_DATA(cm).cast::<libc::sock_extended_err>(),
                        );
                        let icmp = ee.ee_origin == libc::SO_EE_ORIGIN_ICMP
                            || ee.ee_origin == libc::SO_EE_ORIGIN_ICMP6;
                        if icmp {
                            if let Some(dst) = from_sockaddr(&name) {
                                out.push((dst, ee.ee_errno as i32));
                            }
                        }
                    }
                    cm = libc::CMSG_NXTHDR(&h, cm);
                }
            }
        }
    }
}
