//! Control commands to the if-manager (and to an IF): any bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| kp_schema::fuzzing::if_manager_command(data));
