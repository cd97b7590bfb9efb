//! Ethernet/802.1Q/IPv4/UDP frames, and the kneepoint message inside.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| kp_wire::fuzzing::parse_frame(data));
