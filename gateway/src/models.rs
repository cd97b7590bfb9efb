//! The models a gateway serves: names, if_ids and the tensors the KServe v2
//! metadata describes, from the model repository (`models/<name>/config.toml`,
//! read and validated by kp-schema, the parser the platform uses).
//!
//! Tensors as the gateway's clients see them (not the ONNX model's own
//! f32 NCHW input: the platform normalises on its side):
//!
//! | tensor | datatype | shape | what |
//! |---|---|---|---|
//! | `INPUT` | `UINT8` | `[-1, H, W, 3]` | `rgb_u8_hwc` models: RGB bytes, what a request carries on the wire |
//! | `INPUT` | `FP32` | `[-1, C, H, W]` | `f32_nchw` models: the ready tensor (little-endian on the wire) |
//! | `CLASSES` | `INT32` | `[-1, k]` | the platform's top-k class ids, highest score first |
//! | `SCORES` | `FP32` | `[-1, k]` | the model's raw output at those classes (probabilities or logits, as the model's `output.kind`) |
//!
//! `-1` is the batch dimension: each item is its own platform request. `k`
//! is the config's `top_k`, clamped to the class count (what the IF
//! answers). The names are those of the Triton model the side-by-side
//! benchmark serves (bench/bench.py), so a client written for one works
//! against the other.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use kp_schema::model::{repository, ConfigError, InputFormat, ModelConfig, OutputKind};

/// The input tensor's name.
pub const INPUT: &str = "INPUT";
/// The class ids output's name.
pub const CLASSES: &str = "CLASSES";
/// The scores output's name.
pub const SCORES: &str = "SCORES";
/// The one version every model has (the repository keeps one).
pub const VERSION: &str = "1";

/// A tensor element type, by its KServe v2 name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DataType {
    /// `UINT8`.
    Uint8,
    /// `INT32` (little-endian in binary form).
    Int32,
    /// `FP32` (little-endian in binary form).
    Fp32,
}

impl DataType {
    /// The KServe v2 name.
    pub fn as_str(self) -> &'static str {
        match self {
            DataType::Uint8 => "UINT8",
            DataType::Int32 => "INT32",
            DataType::Fp32 => "FP32",
        }
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DataType::Uint8 => 1,
            DataType::Int32 | DataType::Fp32 => 4,
        }
    }
}

/// A model the gateway serves.
#[derive(Clone, Debug, PartialEq)]
pub struct ServedModel {
    /// Its name (its folder in the repository, the `{name}` of the URLs).
    pub name: String,
    /// The inference function its requests go to.
    pub if_id: u16,
    /// The input's element type.
    pub input_type: DataType,
    /// The input's shape without the batch dimension.
    pub input_dims: [usize; 3],
    /// Bytes of one item's input on the wire.
    pub input_bytes: usize,
    /// Classes per answer (the IF's top-k).
    pub top_k: usize,
    /// Whether scores are probabilities (else logits).
    pub probabilities: bool,
    /// The model's latency objective (informational, in metadata).
    pub slo: Duration,
}

impl ServedModel {
    /// What the gateway serves for one repository entry.
    pub fn from_config(cfg: &ModelConfig) -> ServedModel {
        let [c, h, w] = cfg.input.shape;
        let (input_type, input_dims) = match cfg.input.format {
            InputFormat::RgbU8Hwc { .. } => (DataType::Uint8, [h, w, c]),
            InputFormat::F32Nchw => (DataType::Fp32, [c, h, w]),
        };
        ServedModel {
            name: cfg.name.clone(),
            if_id: cfg.if_id.0,
            input_type,
            input_dims,
            input_bytes: cfg.request_bytes() as usize,
            top_k: cfg.top_k.min(cfg.output.num_classes),
            probabilities: cfg.output.kind == OutputKind::Probabilities,
            slo: cfg.slo,
        }
    }

    /// Elements of one item's input.
    pub fn input_elems(&self) -> usize {
        self.input_dims.iter().product()
    }
}

/// A `--model` argument: `NAME` (its if_id from the repository) or
/// `NAME=IF_ID` (deployed under another if_id).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelArg {
    /// The model's name in the repository.
    pub name: String,
    /// The if_id to send its requests to, if not the repository's.
    pub if_id: Option<u16>,
}

impl std::str::FromStr for ModelArg {
    type Err = String;

    fn from_str(s: &str) -> Result<ModelArg, String> {
        let (name, if_id) = match s.split_once('=') {
            None => (s, None),
            Some((name, id)) => {
                let id = id
                    .parse::<u16>()
                    .ok()
                    .filter(|&id| id != 0)
                    .ok_or_else(|| format!("{s}: if_id must be in 1..=65535"))?;
                (name, Some(id))
            }
        };
        if name.is_empty() {
            return Err(format!("{s}: empty model name (NAME or NAME=IF_ID)"));
        }
        Ok(ModelArg {
            name: name.to_string(),
            if_id,
        })
    }
}

/// Why the served models could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ModelsError {
    /// The repository does not load (kp-schema's error).
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A `--model` the repository does not have.
    #[error("model repository {dir}: no model named {name:?} (it has: {have})")]
    NotInRepository {
        /// The repository folder.
        dir: String,
        /// The name asked for.
        name: String,
        /// The names it has.
        have: String,
    },
    /// Two served models would share an if_id.
    #[error("models {a:?} and {b:?} would both be served by if_id {if_id}")]
    SameIfId {
        /// One model.
        a: String,
        /// The other.
        b: String,
        /// Their if_id.
        if_id: u16,
    },
    /// Nothing to serve.
    #[error("model repository {0}: no models (run `make models`)")]
    Empty(String),
}

/// The served models by name.
pub type Models = BTreeMap<String, ServedModel>;

/// The models of repository `dir` to serve: those `picks` names (with
/// their if_id overrides), or every model of it when `picks` is empty.
pub fn load(dir: &Path, picks: &[ModelArg]) -> Result<Models, ModelsError> {
    let all: Models = repository(dir)?
        .iter()
        .map(|c| (c.name.clone(), ServedModel::from_config(c)))
        .collect();
    if all.is_empty() {
        return Err(ModelsError::Empty(dir.display().to_string()));
    }
    if picks.is_empty() {
        return Ok(all);
    }
    let mut served = Models::new();
    for p in picks {
        let mut m = all
            .get(&p.name)
            .cloned()
            .ok_or_else(|| ModelsError::NotInRepository {
                dir: dir.display().to_string(),
                name: p.name.clone(),
                have: all.keys().cloned().collect::<Vec<_>>().join(", "),
            })?;
        if let Some(id) = p.if_id {
            m.if_id = id;
        }
        served.insert(m.name.clone(), m);
    }
    let mut by_id: BTreeMap<u16, &str> = BTreeMap::new();
    for m in served.values() {
        if let Some(other) = by_id.insert(m.if_id, &m.name) {
            return Err(ModelsError::SameIfId {
                a: other.to_string(),
                b: m.name.clone(),
                if_id: m.if_id,
            });
        }
    }
    Ok(served)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::path::PathBuf;

    /// A model repository in a fresh temporary folder: `(name, if_id,
    /// format, [C, H, W], top_k)` each; the model files are empty (only
    /// their existence is checked by kp-schema; nothing here runs them).
    pub(crate) fn repo(tag: &str, models: &[(&str, u16, &str, [usize; 3], usize)]) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("kp-gateway-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for (name, if_id, format, [c, h, w], top_k) in models {
            let m = dir.join(name);
            std::fs::create_dir_all(&m).unwrap();
            std::fs::write(m.join("model.onnx"), b"").unwrap();
            let norm = if *format == "rgb_u8_hwc" {
                "mean = [0.5, 0.5, 0.5]\nstd = [0.25, 0.25, 0.25]\n"
            } else {
                ""
            };
            std::fs::write(
                m.join("config.toml"),
                format!(
                    "schema_version = 1\nname = \"{name}\"\nif_id = {if_id}\n\
                     model_file = \"model.onnx\"\nengine = \"onnxruntime\"\n\
                     intra_op_threads = 1\ntop_k = {top_k}\nslo_ms = 20.0\n\n\
                     [input]\nname = \"data\"\nformat = \"{format}\"\n\
                     shape = [{c}, {h}, {w}]\n{norm}\n\
                     [output]\nname = \"prob\"\nshape = [10]\nnum_classes = 10\n\
                     kind = \"probabilities\"\n"
                ),
            )
            .unwrap();
        }
        dir
    }

    #[test]
    fn tensors_are_what_requests_carry() {
        let dir = repo(
            "tensors",
            &[
                ("tiny", 3, "rgb_u8_hwc", [3, 4, 2], 20),
                ("flat", 4, "f32_nchw", [2, 3, 5], 3),
            ],
        );
        let models = load(&dir, &[]).unwrap();
        let tiny = &models["tiny"];
        assert_eq!(
            (
                tiny.if_id,
                tiny.input_type,
                tiny.input_dims,
                tiny.input_bytes
            ),
            (3, DataType::Uint8, [4, 2, 3], 24)
        );
        assert_eq!(tiny.top_k, 10, "top_k 20 is clamped to the 10 classes");
        let flat = &models["flat"];
        assert_eq!(
            (
                flat.if_id,
                flat.input_type,
                flat.input_dims,
                flat.input_bytes
            ),
            (4, DataType::Fp32, [2, 3, 5], 120)
        );
        assert_eq!(flat.top_k, 3);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn picks_choose_models_and_override_if_ids() {
        let dir = repo(
            "picks",
            &[
                ("a", 1, "rgb_u8_hwc", [3, 2, 2], 1),
                ("b", 2, "rgb_u8_hwc", [3, 2, 2], 1),
            ],
        );
        let arg = |s: &str| s.parse::<ModelArg>().unwrap();
        let m = load(&dir, &[arg("b=7")]).unwrap();
        assert_eq!(m.keys().collect::<Vec<_>>(), ["b"]);
        assert_eq!(m["b"].if_id, 7);
        assert_eq!(
            load(&dir, &[arg("c")]).unwrap_err().to_string(),
            format!(
                "model repository {}: no model named \"c\" (it has: a, b)",
                dir.display()
            )
        );
        assert_eq!(
            load(&dir, &[arg("a"), arg("b=1")]).unwrap_err().to_string(),
            "models \"a\" and \"b\" would both be served by if_id 1"
        );
        assert_eq!(
            "x=0".parse::<ModelArg>().unwrap_err(),
            "x=0: if_id must be in 1..=65535"
        );
        assert_eq!(
            "=3".parse::<ModelArg>().unwrap_err(),
            "=3: empty model name (NAME or NAME=IF_ID)"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }
}
