//! A model's `config.toml`: any text.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| kp_schema::fuzzing::model_config(data));
