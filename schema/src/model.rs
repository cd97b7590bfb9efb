//! The model repository: one folder per model, `model.onnx` next to a
//! `config.toml` that says how the platform serves it.
//!
//! `make models` (`scripts/prepare_models.py`) generates `models/<name>/`
//! from `configs/models.toml`; the schema of `config.toml` (version 1) is
//! documented at the top of that file. [`ModelConfig::load`] reads one
//! entry into typed, validated form; [`repository`] reads every entry of a
//! repository folder.
//!
//! Validation is strict about what the data plane relies on (the input
//! shape and format decide how many bytes a request must carry, see
//! [`ModelConfig::request_bytes`]; the output shape decides where top-k
//! reads) and ignores what is informational (`[prepared]`, kept verbatim,
//! as is the optional `[knee]` profile, whose format is not fixed yet).
//! Every problem is an [`ConfigError`] that names the file and the field.
//!
//! `top_k` larger than `num_classes` is accepted: whoever takes the top-k
//! clamps it to the number of classes.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use thiserror::Error;

use kp_wire::IfId;

/// The `schema_version` this module reads.
pub const SCHEMA_VERSION: i64 = 1;

/// The name of a model's configuration file inside its folder.
pub const CONFIG_FILE: &str = "config.toml";

/// Which built-in engine serves a model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Deserialize)]
pub enum EngineKind {
    /// ONNX Runtime (`engine = "onnxruntime"`), the fast default.
    #[serde(rename = "onnxruntime")]
    OnnxRuntime,
    /// tract (`engine = "tract"`), pure Rust, needs nothing installed.
    #[serde(rename = "tract")]
    Tract,
    /// The GPU engine (`engine = "cudnn"`): the model as a kp-plan plan on
    /// cuDNN / cuBLAS; needs an NVIDIA GPU with the CUDA 13 libraries, and
    /// fails at start with what is missing otherwise (no CPU fallback).
    #[serde(rename = "cudnn")]
    Cudnn,
    /// ONNX Runtime with its CUDA execution provider (`engine =
    /// "onnxruntime-cuda"`): needs onnxruntime-gpu's library (named by
    /// `ORT_DYLIB_PATH`) and an NVIDIA GPU; a CPU build of ONNX Runtime is
    /// refused at start.
    #[serde(rename = "onnxruntime-cuda")]
    OnnxRuntimeCuda,
}

impl EngineKind {
    /// Every engine.
    pub const ALL: [EngineKind; 4] = [
        EngineKind::OnnxRuntime,
        EngineKind::Tract,
        EngineKind::Cudnn,
        EngineKind::OnnxRuntimeCuda,
    ];

    /// Whether the engine runs on a GPU (its share is a CUDA MPS percentage,
    /// not a set of cores).
    pub fn on_gpu(self) -> bool {
        matches!(self, EngineKind::Cudnn | EngineKind::OnnxRuntimeCuda)
    }

    /// The name used in `config.toml` and in logs.
    pub fn as_str(self) -> &'static str {
        match self {
            EngineKind::OnnxRuntime => "onnxruntime",
            EngineKind::Tract => "tract",
            EngineKind::Cudnn => "cudnn",
            EngineKind::OnnxRuntimeCuda => "onnxruntime-cuda",
        }
    }
}

impl std::fmt::Display for EngineKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for EngineKind {
    type Err = String;

    /// The names `config.toml` uses: `onnxruntime`, `tract`, `cudnn`,
    /// `onnxruntime-cuda`.
    fn from_str(s: &str) -> Result<EngineKind, String> {
        EngineKind::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| {
                format!("unknown engine '{s}' (onnxruntime, tract, cudnn, onnxruntime-cuda)")
            })
    }
}

/// What a request carries, and so how the platform turns it into the
/// model's f32 NCHW input.
#[derive(Clone, Debug, PartialEq)]
pub enum InputFormat {
    /// An H x W x 3 RGB image, one byte per channel, normalised per channel
    /// as `x[c,h,w] = (u8[h,w,c] / 255 - mean[c]) / std[c]`.
    RgbU8Hwc {
        /// Per-channel mean (R, G, B), in [0, 1] units.
        mean: [f32; 3],
        /// Per-channel standard deviation (R, G, B), each > 0.
        std: [f32; 3],
    },
    /// A ready C x H x W tensor of little-endian f32, passed to the model as is.
    F32Nchw,
}

/// The model's input tensor and what requests carry for it.
#[derive(Clone, Debug, PartialEq)]
pub struct InputSpec {
    /// The model's input tensor name.
    pub name: String,
    /// What a request carries.
    pub format: InputFormat,
    /// `[C, H, W]`, without the batch dimension.
    pub shape: [usize; 3],
}

impl InputSpec {
    /// f32 values of one input as the model takes it (C·H·W).
    pub fn elems(&self) -> usize {
        self.shape.iter().product()
    }
}

/// What the model's output scores are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutputKind {
    /// Softmax already applied: scores sum to 1.
    Probabilities,
    /// Raw scores.
    Logits,
}

/// The model's output tensor.
#[derive(Clone, Debug, PartialEq)]
pub struct OutputSpec {
    /// The model's output tensor name.
    pub name: String,
    /// Shape without the batch dimension (e.g. `[1000]` or `[1000, 1, 1]`).
    pub shape: Vec<usize>,
    /// Classes top-k runs over: the product of `shape`.
    pub num_classes: usize,
    /// Probabilities or logits.
    pub kind: OutputKind,
}

/// One validated `models/<name>/config.toml`.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    /// The model's name (its folder's name in a repository).
    pub name: String,
    /// The inference function requests for this model are routed to.
    pub if_id: IfId,
    /// The ONNX file, resolved against the config's folder.
    pub model_path: PathBuf,
    /// Which engine serves the model.
    pub engine: EngineKind,
    /// Engine threads per worker (the CPU form of the IF's share), >= 1.
    pub intra_op_threads: usize,
    /// Classes returned per request, >= 1 (clamped to `num_classes` by the
    /// code that takes the top-k).
    pub top_k: usize,
    /// Latency objective of one request.
    pub slo: Duration,
    /// The input tensor and request format.
    pub input: InputSpec,
    /// The output tensor.
    pub output: OutputSpec,
    /// The optional `[knee]` profile (latency vs batch size), verbatim.
    pub knee: Option<toml::Table>,
    /// The informational `[prepared]` provenance, verbatim.
    pub prepared: Option<toml::Table>,
}

/// Why a model configuration or repository could not be read.
#[derive(Debug, Error)]
pub enum ConfigError {
    /// A file or folder could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// What was being read.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// The file is not TOML of the expected shape (bad syntax, a missing
    /// field, a value of the wrong type or an unknown enum value).
    #[error("{path}: {source}")]
    Parse {
        /// The config file.
        path: PathBuf,
        /// toml's message, with the line and column.
        source: toml::de::Error,
    },
    /// The file is a `config.toml` of another schema version.
    #[error(
        "{path}: schema_version = {found}, this build reads {SCHEMA_VERSION}; run `make models`"
    )]
    Schema {
        /// The config file.
        path: PathBuf,
        /// The version the file declares.
        found: i64,
    },
    /// A field has a value the platform cannot serve.
    #[error("{path}: `{field}` {reason}")]
    Invalid {
        /// The config file.
        path: PathBuf,
        /// The offending field (dotted, e.g. `input.shape`).
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The model file the config names does not exist.
    #[error("{path}: model file {model} does not exist; run `make models`")]
    MissingModel {
        /// The config file.
        path: PathBuf,
        /// The resolved model file.
        model: PathBuf,
    },
    /// Two models of one repository cannot be served side by side.
    #[error("model repository {dir}: {reason}")]
    Repository {
        /// The repository folder.
        dir: PathBuf,
        /// What clashes.
        reason: String,
    },
}

/// `config.toml` as written, before validation.
#[derive(Deserialize)]
struct RawConfig {
    schema_version: i64,
    name: String,
    if_id: i64,
    model_file: PathBuf,
    engine: EngineKind,
    intra_op_threads: i64,
    top_k: i64,
    slo_ms: f64,
    input: RawInput,
    output: RawOutput,
    knee: Option<toml::Table>,
    prepared: Option<toml::Table>,
}

#[derive(Deserialize)]
struct RawInput {
    name: String,
    format: RawFormat,
    dtype: Option<String>,
    layout: Option<String>,
    shape: Vec<i64>,
    mean: Option<Vec<f32>>,
    std: Option<Vec<f32>>,
}

#[derive(Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
enum RawFormat {
    RgbU8Hwc,
    F32Nchw,
}

#[derive(Deserialize)]
struct RawOutput {
    name: String,
    dtype: Option<String>,
    shape: Vec<i64>,
    num_classes: i64,
    kind: OutputKind,
}

impl ModelConfig {
    /// Reads and validates `path` (a `config.toml`), and checks that the
    /// model file it names exists.
    pub fn load(path: impl AsRef<Path>) -> Result<ModelConfig, ConfigError> {
        let path = path.as_ref();
        let text = fs::read_to_string(path).map_err(|source| ConfigError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let config = ModelConfig::parse(&text, path)?;
        if !config.model_path.is_file() {
            return Err(ConfigError::MissingModel {
                path: path.to_path_buf(),
                model: config.model_path,
            });
        }
        Ok(config)
    }

    /// Parses and validates `text` as if read from `path`: `model_file` is
    /// resolved against `path`'s folder, errors name `path`. Touches no file.
    pub fn parse(text: &str, path: &Path) -> Result<ModelConfig, ConfigError> {
        let raw: RawConfig = toml::from_str(text).map_err(|source| ConfigError::Parse {
            path: path.to_path_buf(),
            source,
        })?;
        validate(raw, path)
    }

    /// The `total_len` a request for this model must have: H·W·C bytes for
    /// `rgb_u8_hwc`, C·H·W·4 for `f32_nchw`. Validation checks that it fits
    /// a `u32`; a config altered afterwards to exceed it saturates at
    /// `u32::MAX`, a size no request can have.
    pub fn request_bytes(&self) -> u32 {
        request_bytes(&self.input.format, self.input.shape)
            .and_then(|bytes| u32::try_from(bytes).ok())
            .unwrap_or(u32::MAX)
    }
}

fn request_bytes(format: &InputFormat, shape: [usize; 3]) -> Option<u64> {
    let elems = shape
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(u64::try_from(d).ok()?))?;
    match format {
        InputFormat::RgbU8Hwc { .. } => Some(elems),
        InputFormat::F32Nchw => elems.checked_mul(4),
    }
}

fn validate(raw: RawConfig, path: &Path) -> Result<ModelConfig, ConfigError> {
    let invalid = |field: &'static str, reason: String| ConfigError::Invalid {
        path: path.to_path_buf(),
        field,
        reason,
    };
    if raw.schema_version != SCHEMA_VERSION {
        return Err(ConfigError::Schema {
            path: path.to_path_buf(),
            found: raw.schema_version,
        });
    }
    if raw.name.is_empty() {
        return Err(invalid("name", "is empty".into()));
    }
    let if_id = u16::try_from(raw.if_id)
        .ok()
        .filter(|&id| id != 0)
        .ok_or_else(|| invalid("if_id", format!("is {}, must be in 1..=65535", raw.if_id)))?;
    if raw.model_file.as_os_str().is_empty() {
        return Err(invalid("model_file", "is empty".into()));
    }
    let model_path = match path.parent() {
        Some(dir) => dir.join(&raw.model_file),
        None => raw.model_file.clone(),
    };
    let intra_op_threads = positive(raw.intra_op_threads).ok_or_else(|| {
        invalid(
            "intra_op_threads",
            format!("is {}, must be >= 1", raw.intra_op_threads),
        )
    })?;
    let top_k = positive(raw.top_k)
        .ok_or_else(|| invalid("top_k", format!("is {}, must be >= 1", raw.top_k)))?;
    if !(raw.slo_ms.is_finite() && raw.slo_ms > 0.0) {
        return Err(invalid(
            "slo_ms",
            format!(
                "is {}, must be a positive number of milliseconds",
                raw.slo_ms
            ),
        ));
    }
    let slo = Duration::try_from_secs_f64(raw.slo_ms / 1e3)
        .map_err(|e| invalid("slo_ms", format!("is {}: {e}", raw.slo_ms)))?;

    // Input.
    let input = raw.input;
    if input.name.is_empty() {
        return Err(invalid("input.name", "is empty".into()));
    }
    check_f32("input.dtype", input.dtype.as_deref(), path)?;
    if let Some(layout) = input.layout.as_deref() {
        if !layout.eq_ignore_ascii_case("nchw") {
            return Err(invalid(
                "input.layout",
                format!("is {layout:?}, only \"nchw\" is supported"),
            ));
        }
    }
    let shape: [usize; 3] = dims(&input.shape)
        .and_then(|d| <[usize; 3]>::try_from(d).ok())
        .ok_or_else(|| {
            invalid(
                "input.shape",
                format!("is {:?}, must be [C, H, W] with each > 0", input.shape),
            )
        })?;
    let format = match input.format {
        RawFormat::F32Nchw => {
            if input.mean.is_some() || input.std.is_some() {
                return Err(invalid(
                    "input.mean",
                    "and `std` only apply to format = \"rgb_u8_hwc\"".into(),
                ));
            }
            InputFormat::F32Nchw
        }
        RawFormat::RgbU8Hwc => {
            if shape[0] != 3 {
                return Err(invalid(
                    "input.shape",
                    format!("is {shape:?}: format = \"rgb_u8_hwc\" carries 3 channels (RGB), C must be 3"),
                ));
            }
            let three =
                |field: &'static str, v: Option<Vec<f32>>| -> Result<[f32; 3], ConfigError> {
                    let v = v.ok_or_else(|| {
                        invalid(
                            field,
                            "is missing (required by format = \"rgb_u8_hwc\")".into(),
                        )
                    })?;
                    let array = <[f32; 3]>::try_from(v.as_slice()).map_err(|_| {
                        invalid(field, format!("is {v:?}, must be 3 numbers (R, G, B)"))
                    })?;
                    if array.iter().any(|x| !x.is_finite()) {
                        return Err(invalid(field, format!("is {v:?}, must be finite")));
                    }
                    Ok(array)
                };
            let mean = three("input.mean", input.mean)?;
            let std = three("input.std", input.std)?;
            if std.iter().any(|&s| s <= 0.0) {
                return Err(invalid(
                    "input.std",
                    format!("is {std:?}, each must be > 0"),
                ));
            }
            InputFormat::RgbU8Hwc { mean, std }
        }
    };
    match request_bytes(&format, shape) {
        Some(bytes) if bytes <= u64::from(u32::MAX) => {}
        _ => {
            return Err(invalid(
                "input.shape",
                format!("is {shape:?}: a request would exceed the 4 GiB a total_len can say"),
            ))
        }
    }

    // Output.
    let output = raw.output;
    if output.name.is_empty() {
        return Err(invalid("output.name", "is empty".into()));
    }
    check_f32("output.dtype", output.dtype.as_deref(), path)?;
    let out_shape = dims(&output.shape)
        .filter(|d| !d.is_empty())
        .ok_or_else(|| {
            invalid(
                "output.shape",
                format!("is {:?}, must be non-empty with each > 0", output.shape),
            )
        })?;
    let classes = out_shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| invalid("output.shape", format!("is {out_shape:?}: too large")))?;
    if usize::try_from(output.num_classes).ok() != Some(classes) {
        return Err(invalid(
            "output.num_classes",
            format!(
                "is {}, must be the product of output.shape {out_shape:?} = {classes}",
                output.num_classes
            ),
        ));
    }

    Ok(ModelConfig {
        name: raw.name,
        if_id: IfId(if_id),
        model_path,
        engine: raw.engine,
        intra_op_threads,
        top_k,
        slo,
        input: InputSpec {
            name: input.name,
            format,
            shape,
        },
        output: OutputSpec {
            name: output.name,
            shape: out_shape,
            num_classes: classes,
            kind: output.kind,
        },
        knee: raw.knee,
        prepared: raw.prepared,
    })
}

fn positive(v: i64) -> Option<usize> {
    usize::try_from(v).ok().filter(|&v| v > 0)
}

/// `v` as dimensions if every one is > 0.
fn dims(v: &[i64]) -> Option<Vec<usize>> {
    v.iter().map(|&d| positive(d)).collect()
}

fn check_f32(field: &'static str, dtype: Option<&str>, path: &Path) -> Result<(), ConfigError> {
    match dtype {
        None | Some("f32") | Some("float32") => Ok(()),
        Some(other) => Err(ConfigError::Invalid {
            path: path.to_path_buf(),
            field,
            reason: format!("is {other:?}, only \"f32\" is supported"),
        }),
    }
}

/// Every model of the repository folder `dir`: each subfolder that holds a
/// `config.toml`, sorted by name. Subfolders without one (not a model, or
/// one `make models` is still writing) are skipped; any config that does not
/// load is an error, and so are two models with the same name or `if_id`
/// and a model whose `name` is not its folder's.
pub fn repository(dir: impl AsRef<Path>) -> Result<Vec<ModelConfig>, ConfigError> {
    let dir = dir.as_ref();
    let io_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| ConfigError::Io { path, source }
    };
    let mut configs = Vec::new();
    for entry in fs::read_dir(dir).map_err(io_err(dir))? {
        let entry = entry.map_err(io_err(dir))?;
        let folder = entry.path();
        let config_path = folder.join(CONFIG_FILE);
        if !folder.is_dir() || !config_path.is_file() {
            continue;
        }
        let config = ModelConfig::load(&config_path)?;
        let folder_name = entry.file_name();
        if folder_name.to_str() != Some(config.name.as_str()) {
            return Err(ConfigError::Repository {
                dir: dir.to_path_buf(),
                reason: format!(
                    "folder {:?} holds model {:?}: a model's folder must have its name",
                    folder_name, config.name
                ),
            });
        }
        configs.push(config);
    }
    configs.sort_by(|a, b| a.name.cmp(&b.name));
    for (i, a) in configs.iter().enumerate() {
        if let Some(b) = configs[i + 1..].iter().find(|b| b.if_id == a.if_id) {
            return Err(ConfigError::Repository {
                dir: dir.to_path_buf(),
                reason: format!(
                    "models {:?} and {:?} both have if_id {}",
                    a.name, b.name, a.if_id.0
                ),
            });
        }
    }
    Ok(configs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_names_parse_as_in_config_toml_and_nothing_else_does() {
        for k in EngineKind::ALL {
            assert_eq!(k.as_str().parse::<EngineKind>(), Ok(k));
        }
        assert!(EngineKind::Cudnn.on_gpu() && EngineKind::OnnxRuntimeCuda.on_gpu());
        assert!(!EngineKind::OnnxRuntime.on_gpu() && !EngineKind::Tract.on_gpu());
        let e = "onnx".parse::<EngineKind>().unwrap_err();
        assert!(
            e.contains("onnxruntime, tract, cudnn, onnxruntime-cuda"),
            "{e}"
        );
    }

    const RESNET: &str = r#"
schema_version = 1
name = "resnet50"
if_id = 2
model_file = "model.onnx"
engine = "onnxruntime"
intra_op_threads = 1
top_k = 5
slo_ms = 200.0

[input]
name = "gpu_0/data_0"
format = "rgb_u8_hwc"
dtype = "f32"
layout = "nchw"
batch_dim = "N"
shape = [3, 224, 224]
mean = [0.485, 0.456, 0.406]
std = [0.229, 0.224, 0.225]

[output]
name = "gpu_0/softmax_1"
dtype = "f32"
shape = [1000]
num_classes = 1000
kind = "probabilities"

[prepared]
source = "light_resnet50.onnx"
latency_b1_ms = 44.691
"#;

    const DENSENET: &str = r#"
schema_version = 1
name = "densenet121"
if_id = 8
model_file = "model.onnx"
engine = "tract"
intra_op_threads = 2
top_k = 3
slo_ms = 150.5

[input]
name = "data_0"
format = "f32_nchw"
shape = [3, 224, 224]

[output]
name = "fc6_1"
shape = [1000, 1, 1]
num_classes = 1000
kind = "logits"

[knee]
batch = [1, 2, 4]
latency_ms = [35.0, 60.0, 110.0]
"#;

    fn path() -> &'static Path {
        Path::new("/repo/models/m/config.toml")
    }

    fn parse(text: &str) -> Result<ModelConfig, ConfigError> {
        ModelConfig::parse(text, path())
    }

    /// `text` with the first line starting with `key =` replaced by `line`
    /// (or removed if `line` is empty).
    fn with(text: &str, key: &str, line: &str) -> String {
        let mut done = false;
        let out: Vec<&str> = text
            .lines()
            .filter_map(|l| {
                if !done && l.starts_with(&format!("{key} =")) {
                    done = true;
                    (!line.is_empty()).then_some(line)
                } else {
                    Some(l)
                }
            })
            .collect();
        assert!(done, "no line for {key}");
        out.join("\n")
    }

    fn invalid_field(text: &str) -> &'static str {
        match parse(text) {
            Err(ConfigError::Invalid { field, .. }) => field,
            other => panic!("expected an Invalid error, got {other:?}"),
        }
    }

    #[test]
    fn parses_an_rgb_model() {
        let c = parse(RESNET).unwrap();
        assert_eq!(c.name, "resnet50");
        assert_eq!(c.if_id, IfId(2));
        assert_eq!(c.model_path, Path::new("/repo/models/m/model.onnx"));
        assert_eq!(c.engine, EngineKind::OnnxRuntime);
        assert_eq!(c.intra_op_threads, 1);
        assert_eq!(c.top_k, 5);
        assert_eq!(c.slo, Duration::from_millis(200));
        assert_eq!(c.input.name, "gpu_0/data_0");
        assert_eq!(
            c.input.format,
            InputFormat::RgbU8Hwc {
                mean: [0.485, 0.456, 0.406],
                std: [0.229, 0.224, 0.225]
            }
        );
        assert_eq!(c.input.shape, [3, 224, 224]);
        assert_eq!(c.input.elems(), 3 * 224 * 224);
        assert_eq!(c.output.name, "gpu_0/softmax_1");
        assert_eq!(c.output.shape, vec![1000]);
        assert_eq!(c.output.num_classes, 1000);
        assert_eq!(c.output.kind, OutputKind::Probabilities);
        assert_eq!(c.request_bytes(), 224 * 224 * 3);
        assert!(c.knee.is_none());
        assert_eq!(
            c.prepared.unwrap()["source"].as_str(),
            Some("light_resnet50.onnx")
        );
    }

    #[test]
    fn parses_an_f32_model_with_a_knee() {
        let c = parse(DENSENET).unwrap();
        assert_eq!(c.engine, EngineKind::Tract);
        assert_eq!(c.intra_op_threads, 2);
        assert_eq!(c.top_k, 3);
        assert_eq!(c.slo, Duration::from_micros(150_500));
        assert_eq!(c.input.format, InputFormat::F32Nchw);
        assert_eq!(c.request_bytes(), 3 * 224 * 224 * 4);
        assert_eq!(c.output.shape, vec![1000, 1, 1]);
        assert_eq!(c.output.kind, OutputKind::Logits);
        let knee = c.knee.unwrap();
        assert_eq!(knee["batch"].as_array().unwrap().len(), 3);
    }

    #[test]
    fn absolute_model_file_is_kept() {
        let c = parse(&with(
            RESNET,
            "model_file",
            r#"model_file = "/elsewhere/m.onnx""#,
        ))
        .unwrap();
        assert_eq!(c.model_path, Path::new("/elsewhere/m.onnx"));
    }

    #[test]
    fn missing_fields_are_named() {
        for key in ["name", "if_id", "model_file", "engine", "top_k", "slo_ms"] {
            let err = parse(&with(RESNET, key, "")).unwrap_err();
            assert!(matches!(err, ConfigError::Parse { .. }), "{key}: {err}");
            let msg = err.to_string();
            assert!(
                msg.contains(key) && msg.contains("/repo/models/m/config.toml"),
                "{msg}"
            );
        }
        let err = parse(&with(RESNET, "std", "")).unwrap_err();
        assert!(err.to_string().contains("`input.std` is missing"), "{err}");
    }

    #[test]
    fn unknown_engine_and_format_are_rejected() {
        let err = parse(&with(RESNET, "engine", r#"engine = "tensorrt""#)).unwrap_err();
        assert!(
            matches!(err, ConfigError::Parse { .. }) && err.to_string().contains("tensorrt"),
            "{err}"
        );
        let err = parse(&with(RESNET, "format", r#"format = "bgr""#)).unwrap_err();
        assert!(matches!(err, ConfigError::Parse { .. }), "{err}");
    }

    #[test]
    fn other_schema_versions_are_rejected() {
        let err = parse(&with(RESNET, "schema_version", "schema_version = 2")).unwrap_err();
        assert!(matches!(err, ConfigError::Schema { found: 2, .. }), "{err}");
    }

    #[test]
    fn bad_values_are_rejected_by_field() {
        assert_eq!(invalid_field(&with(RESNET, "top_k", "top_k = 0")), "top_k");
        assert_eq!(invalid_field(&with(RESNET, "top_k", "top_k = -1")), "top_k");
        assert_eq!(invalid_field(&with(RESNET, "if_id", "if_id = 0")), "if_id");
        assert_eq!(
            invalid_field(&with(RESNET, "if_id", "if_id = 65536")),
            "if_id"
        );
        assert_eq!(
            invalid_field(&with(RESNET, "intra_op_threads", "intra_op_threads = 0")),
            "intra_op_threads"
        );
        assert_eq!(
            invalid_field(&with(RESNET, "slo_ms", "slo_ms = 0.0")),
            "slo_ms"
        );
        assert_eq!(
            invalid_field(&with(RESNET, "slo_ms", "slo_ms = -5.0")),
            "slo_ms"
        );
        assert_eq!(
            invalid_field(&with(RESNET, "slo_ms", "slo_ms = nan")),
            "slo_ms"
        );
        assert_eq!(invalid_field(&with(RESNET, "name", r#"name = """#)), "name");
        assert_eq!(
            invalid_field(&with(RESNET, "dtype", r#"dtype = "f16""#)),
            "input.dtype"
        );
        assert_eq!(
            invalid_field(&with(RESNET, "layout", r#"layout = "nhwc""#)),
            "input.layout"
        );
    }

    #[test]
    fn bad_shapes_are_rejected() {
        for shape in [
            "[3, 224]",
            "[3, 224, 224, 1]",
            "[3, 0, 224]",
            "[3, -224, 224]",
            "[]",
        ] {
            let text = with(RESNET, "shape", &format!("shape = {shape}"));
            assert_eq!(invalid_field(&text), "input.shape", "{shape}");
        }
        // RGB means 3 channels.
        assert_eq!(
            invalid_field(&with(RESNET, "shape", "shape = [1, 224, 224]")),
            "input.shape"
        );
        assert_eq!(
            invalid_field(&with(RESNET, "mean", "mean = [0.5, 0.5]")),
            "input.mean"
        );
        assert_eq!(
            invalid_field(&with(RESNET, "std", "std = [0.2, 0.0, 0.2]")),
            "input.std"
        );
        // f32 takes any C, but no mean/std.
        let c = parse(&with(DENSENET, "shape", "shape = [1, 28, 28]")).unwrap();
        assert_eq!(c.request_bytes(), 28 * 28 * 4);
        let text = DENSENET.replace(
            "shape = [3, 224, 224]",
            "shape = [3, 224, 224]\nmean = [0.5, 0.5, 0.5]",
        );
        assert_eq!(invalid_field(&text), "input.mean");
        // A request must fit a u32 total_len.
        let text = with(DENSENET, "shape", "shape = [3, 32768, 32768]");
        assert_eq!(invalid_field(&text), "input.shape");
    }

    #[test]
    fn output_shape_and_classes_must_agree() {
        let text = RESNET.replace("num_classes = 1000", "num_classes = 999");
        assert_eq!(invalid_field(&text), "output.num_classes");
        let text = RESNET.replace("shape = [1000]", "shape = []");
        assert_eq!(invalid_field(&text), "output.shape");
        let text = RESNET.replace("shape = [1000]", "shape = [1000, 0]");
        assert_eq!(invalid_field(&text), "output.shape");
    }

    #[test]
    fn top_k_above_num_classes_is_accepted() {
        let c = parse(&with(RESNET, "top_k", "top_k = 5000")).unwrap();
        assert_eq!(c.top_k, 5000);
    }

    #[test]
    fn unknown_fields_are_ignored() {
        let text = RESNET.replace("top_k = 5", "top_k = 5\nfuture_field = true");
        assert!(parse(&text).is_ok());
    }

    /// A scratch folder under the system temp dir, emptied first.
    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("libml-model-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn write_model(repo: &Path, folder: &str, text: &str) {
        let dir = repo.join(folder);
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join(CONFIG_FILE), text).unwrap();
        fs::write(dir.join("model.onnx"), b"not really onnx").unwrap();
    }

    #[test]
    fn load_checks_the_model_file() {
        let repo = scratch("load");
        write_model(&repo, "resnet50", RESNET);
        let c = ModelConfig::load(repo.join("resnet50").join(CONFIG_FILE)).unwrap();
        assert_eq!(c.model_path, repo.join("resnet50").join("model.onnx"));
        fs::remove_file(repo.join("resnet50").join("model.onnx")).unwrap();
        let err = ModelConfig::load(repo.join("resnet50").join(CONFIG_FILE)).unwrap_err();
        assert!(matches!(err, ConfigError::MissingModel { .. }), "{err}");
        let err = ModelConfig::load(repo.join("nothing").join(CONFIG_FILE)).unwrap_err();
        assert!(matches!(err, ConfigError::Io { .. }), "{err}");
        fs::remove_dir_all(repo).unwrap();
    }

    #[test]
    fn repository_lists_models_by_name() {
        let repo = scratch("repo");
        write_model(&repo, "resnet50", RESNET);
        write_model(&repo, "densenet121", DENSENET);
        fs::create_dir_all(repo.join("half-written")).unwrap();
        fs::write(repo.join("README"), "not a model").unwrap();
        let models = repository(&repo).unwrap();
        let names: Vec<&str> = models.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(names, ["densenet121", "resnet50"]);

        // Two models with one if_id.
        write_model(&repo, "resnet50b", &RESNET.replace("resnet50", "resnet50b"));
        let err = repository(&repo).unwrap_err();
        assert!(err.to_string().contains("both have if_id 2"), "{err}");
        fs::remove_dir_all(repo.join("resnet50b")).unwrap();

        // A folder whose config names another model.
        write_model(&repo, "copy", &RESNET.replace("if_id = 2", "if_id = 3"));
        let err = repository(&repo).unwrap_err();
        assert!(matches!(err, ConfigError::Repository { .. }), "{err}");
        fs::remove_dir_all(repo.join("copy")).unwrap();

        // A broken config anywhere fails the whole repository.
        write_model(&repo, "broken", "schema_version = 1\n");
        assert!(matches!(repository(&repo), Err(ConfigError::Parse { .. })));
        fs::remove_dir_all(&repo).unwrap();

        assert!(matches!(repository(&repo), Err(ConfigError::Io { .. })));
    }
}
