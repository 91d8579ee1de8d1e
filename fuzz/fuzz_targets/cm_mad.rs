//! A management datagram carrying a CM message; see `softrdma_fuzz::cm_mad`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| softrdma_fuzz::cm_mad(data));
