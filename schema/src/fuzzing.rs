//! Bodies of the fuzz targets `if_manager_command` and `model_config`
//! (`fuzz/`), here so that `cargo test -p kp-schema` replays their
//! committed seed corpora (`fuzz/corpus/<target>/`) through exactly the
//! code the fuzzer runs. A broken property panics: that is the bug the
//! fuzzer reports.

use std::path::Path;

use serde_json::Value;

use crate::messages::{codes, ErrorBody, IfCommand, IfManagerCommand};
use crate::model::{ConfigError, InputFormat, ModelConfig};

/// Any bytes as a request to the if-manager's control socket
/// ([`IfManagerCommand::parse`]) and to an IF's ([`IfCommand::parse`],
/// the same parser over kp-if's commands). A command that parses must
/// serialise to JSON that parses back to itself; a refusal is `malformed`
/// or `unknown_command` with a message, and its reply is the documented
/// error shape.
pub fn if_manager_command(data: &[u8]) {
    round_trip(IfManagerCommand::parse(data), IfManagerCommand::parse);
    round_trip(IfCommand::parse(data), IfCommand::parse);
}

fn round_trip<T>(parsed: Result<T, ErrorBody>, parse: fn(&[u8]) -> Result<T, ErrorBody>)
where
    T: serde::Serialize + PartialEq + std::fmt::Debug,
{
    match parsed {
        Ok(cmd) => {
            let bytes = serde_json::to_vec(&cmd).expect("a command serialises");
            assert_eq!(parse(&bytes).as_ref(), Ok(&cmd), "{cmd:?} round trip");
        }
        Err(e) => {
            assert!(
                e.code == codes::MALFORMED || e.code == codes::UNKNOWN_COMMAND,
                "{e:?}"
            );
            assert!(!e.message.is_empty());
            let reply = e.reply();
            assert_eq!(reply["ok"], Value::Bool(false));
            assert_eq!(ErrorBody::of_reply(&reply), Some(e));
        }
    }
}

/// Where the fuzzed `config.toml` claims to be.
const CONFIG_PATH: &str = "/repo/models/fuzz/config.toml";

/// Any bytes (as UTF-8; others are not a `config.toml`) through
/// [`ModelConfig::parse`]. An accepted config has every property the data
/// plane relies on (module doc of [`crate::model`]); a refused one is an
/// error that names the file.
pub fn model_config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let path = Path::new(CONFIG_PATH);
    match ModelConfig::parse(text, path) {
        Ok(c) => {
            assert!(!c.name.is_empty());
            assert_ne!(c.if_id.0, 0);
            assert!(c.intra_op_threads >= 1);
            assert!(c.top_k >= 1);
            assert!(!c.slo.is_zero());
            assert!(!c.input.name.is_empty());
            assert!(c.input.shape.iter().all(|&d| d > 0));
            let elems = c
                .input
                .shape
                .iter()
                .try_fold(1u64, |a, &d| a.checked_mul(d as u64));
            let bytes = match &c.input.format {
                InputFormat::RgbU8Hwc { mean, std } => {
                    assert_eq!(c.input.shape[0], 3);
                    assert!(mean.iter().all(|m| m.is_finite()));
                    assert!(std.iter().all(|s| s.is_finite() && *s > 0.0));
                    elems
                }
                InputFormat::F32Nchw => elems.and_then(|e| e.checked_mul(4)),
            };
            // What a request for it must carry: fits a total_len, and is
            // what request_bytes says.
            let bytes = bytes.expect("the input size fits a u64");
            assert!(bytes >= 1 && bytes <= u64::from(u32::MAX));
            assert_eq!(u64::from(c.request_bytes()), bytes);
            assert_eq!(c.input.elems() as u64, elems.unwrap());
            assert!(!c.output.name.is_empty());
            assert!(!c.output.shape.is_empty() && c.output.shape.iter().all(|&d| d > 0));
            assert_eq!(
                c.output.shape.iter().product::<usize>(),
                c.output.num_classes
            );
        }
        Err(e) => {
            assert!(
                !matches!(e, ConfigError::Io { .. } | ConfigError::MissingModel { .. }),
                "parse touched a file: {e}"
            );
            let message = e.to_string();
            assert!(message.contains(CONFIG_PATH), "{message}");
        }
    }
}

#[cfg(test)]
mod tests {

    use super::*;

    /// The committed seeds run clean; those named `valid_*` are accepted
    /// and the others refused, so the corpus covers both sides.
    #[test]
    fn the_if_manager_command_seed_corpus_runs_clean() {
        let files = kp_wire::fuzzing::seed_corpus("if_manager_command");
        assert!(files.len() >= 10, "only {} seeds", files.len());
        for (name, bytes) in files {
            eprintln!("if_manager_command seed {name}");
            if_manager_command(&bytes);
            let ok = IfManagerCommand::parse(&bytes).is_ok() || IfCommand::parse(&bytes).is_ok();
            assert_eq!(ok, name.starts_with("valid_"), "{name}");
        }
    }

    #[test]
    fn the_model_config_seed_corpus_runs_clean() {
        let files = kp_wire::fuzzing::seed_corpus("model_config");
        assert!(files.len() >= 6, "only {} seeds", files.len());
        for (name, bytes) in files {
            eprintln!("model_config seed {name}");
            model_config(&bytes);
            let text = String::from_utf8(bytes).unwrap();
            let ok = ModelConfig::parse(&text, Path::new(CONFIG_PATH)).is_ok();
            assert_eq!(ok, name.starts_with("valid_"), "{name}");
        }
    }
}
