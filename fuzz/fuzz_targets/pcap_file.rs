//! A classic pcap file; see `softrdma_fuzz::pcap_file`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| softrdma_fuzz::pcap_file(data));
