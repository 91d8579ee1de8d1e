//! An Ethernet frame or a bare IP packet; see `softrdma_fuzz::ip_frames`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| softrdma_fuzz::ip_frames(data));
