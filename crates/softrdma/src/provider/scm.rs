//! Unix socket ancillary data: descriptors (`SCM_RIGHTS`) and credentials (`SCM_CREDENTIALS`),
//! for the slot sockets of shared devices and the offers of same-host lanes.

use std::mem::size_of;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// The most descriptors a slot socket message carries.
pub(crate) const MAX_FDS: usize = 2;

/// Sends `m` with the descriptors `fds` (`SCM_RIGHTS`) on the connected socket `sock`,
/// without blocking.
pub(crate) fn send_with_fds(sock: &OwnedFd, m: &[u8], fds: &[RawFd]) -> std::io::Result<()> {
    let mut iov = libc::iovec {
        iov_base: m.as_ptr() as *mut libc::c_void,
        iov_len: m.len(),
    };
    let mut cbuf = [0u64; 8];
    // SAFETY: all-zero msghdr is valid; iov and cbuf outlive the call; the control message
    // is built with the kernel's macros inside cbuf (room for two descriptors).
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        if !fds.is_empty() {
            let dlen = std::mem::size_of_val(fds) as u32;
            msg.msg_control = cbuf.as_mut_ptr().cast();
            msg.msg_controllen = libc::CMSG_SPACE(dlen) as usize;
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(dlen) as usize;
            std::ptr::copy_nonoverlapping(
                fds.as_ptr(),
                libc::CMSG_DATA(c).cast::<RawFd>(),
                fds.len(),
            );
        }
        if libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_DONTWAIT) < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// The descriptors (`SCM_RIGHTS`) and the sender's uid (`SCM_CREDENTIALS`) in what
/// `recvmsg` filled in `msg`. Every descriptor received is owned (closed when dropped).
pub(crate) fn control(msg: &libc::msghdr) -> (Vec<OwnedFd>, Option<libc::uid_t>) {
    let mut fds = Vec::new();
    let mut uid = None;
    // SAFETY: walks the control buffer recvmsg filled, with the kernel's own macros; every
    // descriptor in an SCM_RIGHTS message is a fresh one this process now owns.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(msg);
        while !c.is_null() {
            let data = libc::CMSG_DATA(c);
            let len = (*c).cmsg_len as usize - (data as usize - c as usize);
            match ((*c).cmsg_level, (*c).cmsg_type) {
                (libc::SOL_SOCKET, libc::SCM_RIGHTS) => {
                    for k in 0..len / size_of::<libc::c_int>() {
                        let fd = std::ptr::read_unaligned(data.cast::<libc::c_int>().add(k));
                        let fd = OwnedFd::from_raw_fd(fd);
                        if fds.len() < MAX_FDS {
                            fds.push(fd);
                        }
                    }
                }
                (libc::SOL_SOCKET, libc::SCM_CREDENTIALS) if len >= size_of::<libc::ucred>() => {
                    let cr = std::ptr::read_unaligned(data.cast::<libc::ucred>());
                    uid = Some(cr.uid);
                }
                _ => {}
            }
            c = libc::CMSG_NXTHDR(msg, c);
        }
    }
    (fds, uid)
}
