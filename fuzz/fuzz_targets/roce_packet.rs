//! A RoCEv2 transport packet (BTH through ICRC); see `softrdma_fuzz::roce_packet`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| softrdma_fuzz::roce_packet(data));
