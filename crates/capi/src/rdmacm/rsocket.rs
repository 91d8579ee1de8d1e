//! rsocket (`rsocket.h`): not implemented. Every call fails with -1 and `ENOSYS` (the
//! functions returning `ssize_t` or `off_t` give -1 of that width), so that programs
//! linked against librdmacm's rsocket names load and fail cleanly.

macro_rules! rsocket_stubs {
    ($($name:ident => $sym:literal),* $(,)?) => {$(
        /// An rsocket call: fails with -1 and `ENOSYS` (rsockets are not implemented).
        #[export_name = $sym]
        pub extern "C" fn $name() -> libc::c_long {
            crate::ffi::set_errno(libc::ENOSYS);
            -1
        }
    )*};
}

rsocket_stubs! {
    raccept => "softrdma_r_accept",
    rbind => "softrdma_r_bind",
    rclose => "softrdma_r_close",
    rconnect => "softrdma_r_connect",
    rfcntl => "softrdma_r_fcntl",
    rgetpeername => "softrdma_r_getpeername",
    rgetsockname => "softrdma_r_getsockname",
    rgetsockopt => "softrdma_r_getsockopt",
    riomap => "softrdma_r_iomap",
    riounmap => "softrdma_r_iounmap",
    riowrite => "softrdma_r_iowrite",
    rlisten => "softrdma_r_listen",
    rpoll => "softrdma_r_poll",
    rread => "softrdma_r_read",
    rreadv => "softrdma_r_readv",
    rrecv => "softrdma_r_recv",
    rrecvfrom => "softrdma_r_recvfrom",
    rrecvmsg => "softrdma_r_recvmsg",
    rselect => "softrdma_r_select",
    rsend => "softrdma_r_send",
    rsendmsg => "softrdma_r_sendmsg",
    rsendto => "softrdma_r_sendto",
    rsetsockopt => "softrdma_r_setsockopt",
    rshutdown => "softrdma_r_shutdown",
    rsocket => "softrdma_r_socket",
    rwrite => "softrdma_r_write",
    rwritev => "softrdma_r_writev",
}
