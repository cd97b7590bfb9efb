//! Request fragments and responses: any bytes as a UDP payload.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| kp_wire::fuzzing::parse_fragment(data));
