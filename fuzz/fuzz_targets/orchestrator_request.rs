//! A session of control requests to the orchestrator, one per line.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| orchestrator::control::fuzzing::orchestrator_request(data));
