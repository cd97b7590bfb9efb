//! Class names for class ids, and what a client needs from a model
//! repository (`make models`' `models/<name>/config.toml`): the if_id, the
//! input's size and format, and the labels file.
//!
//! A model with named classes has `labels = "labels.txt"` in its
//! config.toml: one class name per line, class id = line index (0-based),
//! as many lines as the model's `output.num_classes`. The config itself is
//! read and validated by kp-schema, the parser the platform uses, so a
//! config the platform would refuse is refused here too.
//!
//! ```no_run
//! use kneepoint_client::labels::ModelInfo;
//! let model = ModelInfo::find("models", 10)?; // efficientnet_lite0
//! let labels = model.labels()?;
//! assert_eq!(labels.get(967), Some("espresso"));
//! # Ok::<(), kneepoint_client::labels::LabelsError>(())
//! ```

use std::fs;
use std::path::{Path, PathBuf};

use kp_schema::model::{repository, ConfigError, InputFormat, ModelConfig};

/// Why class names or a model's config could not be had.
#[derive(Debug, thiserror::Error)]
pub enum LabelsError {
    /// The config or the repository does not load (kp-schema's error).
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// No model of the repository has this if_id.
    #[error("model repository {dir}: no model has if_id {if_id}")]
    UnknownIf {
        /// The repository folder.
        dir: PathBuf,
        /// The if_id asked for.
        if_id: u16,
    },
    /// The model's config.toml names no labels file.
    #[error("model {model} has no labels (no `labels` in its config.toml)")]
    NoLabels {
        /// The model's name.
        model: String,
    },
    /// `labels` in config.toml is not a string.
    #[error("{path}: `labels` must be a file name (a string)")]
    BadLabelsField {
        /// The config file.
        path: PathBuf,
    },
    /// A labels file could not be read (or is not UTF-8).
    #[error("cannot read labels {path}: {source}")]
    Io {
        /// The labels file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A labels file has an empty line, or no line at all.
    #[error("{path}: line {line} is empty; one class name per line")]
    EmptyName {
        /// The labels file.
        path: PathBuf,
        /// The 1-based line number.
        line: usize,
    },
    /// A labels file's line count is not the model's class count.
    #[error("{path}: {names} names for a model of {classes} classes")]
    Count {
        /// The labels file.
        path: PathBuf,
        /// Lines in it.
        names: usize,
        /// The model's `output.num_classes`.
        classes: usize,
    },
}

/// Class names, index = class id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Labels {
    names: Vec<String>,
}

impl Labels {
    /// Reads a labels file: one non-empty name per line (`\n` or `\r\n`
    /// line ends; a final line end is optional).
    pub fn from_file(path: impl AsRef<Path>) -> Result<Labels, LabelsError> {
        let path = path.as_ref();
        let text = fs::read_to_string(path).map_err(|source| LabelsError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let text = text.strip_suffix('\n').unwrap_or(&text);
        let names: Vec<String> = text
            .split('\n')
            .map(|l| l.strip_suffix('\r').unwrap_or(l).to_owned())
            .collect();
        if let Some(i) = names.iter().position(String::is_empty) {
            return Err(LabelsError::EmptyName {
                path: path.to_path_buf(),
                line: i + 1,
            });
        }
        Ok(Labels { names })
    }

    /// The name of class `class`, if there is one.
    pub fn get(&self, class: u32) -> Option<&str> {
        self.names.get(class as usize).map(String::as_str)
    }

    /// How many names.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// Whether there are none (never, for a file that loaded).
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }
}

/// A model of the repository, as a client sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelInfo {
    /// The model's name.
    pub name: String,
    /// The inference function its requests go to.
    pub if_id: u16,
    /// Input rows, for an image model (`rgb_u8_hwc`: what to resize to).
    pub height: u32,
    /// Input columns.
    pub width: u32,
    /// Whether requests carry HxWx3 RGB u8 (what [`crate::image`] makes);
    /// otherwise they carry a C x H x W f32 tensor.
    pub rgb_u8: bool,
    /// Bytes of one request's input.
    pub input_bytes: u32,
    /// Classes the model scores.
    pub num_classes: usize,
    /// The labels file, resolved against the config's folder, if it names
    /// one.
    pub labels_path: Option<PathBuf>,
}

impl ModelInfo {
    /// Reads and validates one `config.toml` (and checks that the model
    /// file it names exists, as the platform does).
    pub fn load(config: impl AsRef<Path>) -> Result<ModelInfo, LabelsError> {
        let path = config.as_ref();
        let cfg = ModelConfig::load(path)?;
        ModelInfo::from_config(&cfg, path)
    }

    /// The model of repository `dir` (e.g. `models/`) with `if_id`.
    pub fn find(dir: impl AsRef<Path>, if_id: u16) -> Result<ModelInfo, LabelsError> {
        let dir = dir.as_ref();
        let cfg = repository(dir)?
            .into_iter()
            .find(|c| c.if_id.0 == if_id)
            .ok_or_else(|| LabelsError::UnknownIf {
                dir: dir.to_path_buf(),
                if_id,
            })?;
        ModelInfo::from_config(&cfg, &dir.join(&cfg.name).join("config.toml"))
    }

    fn from_config(cfg: &ModelConfig, path: &Path) -> Result<ModelInfo, LabelsError> {
        // kp-schema's ModelConfig does not keep `labels` (the platform does
        // not need it): read that one key from the same file.
        let text = fs::read_to_string(path).map_err(|source| ConfigError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let table: toml::Table = text.parse().map_err(|source| ConfigError::Parse {
            path: path.to_path_buf(),
            source,
        })?;
        let labels_path = match table.get("labels") {
            None => None,
            Some(toml::Value::String(file)) => {
                Some(path.parent().unwrap_or(Path::new(".")).join(file))
            }
            Some(_) => {
                return Err(LabelsError::BadLabelsField {
                    path: path.to_path_buf(),
                })
            }
        };
        let [_, h, w] = cfg.input.shape;
        Ok(ModelInfo {
            name: cfg.name.clone(),
            if_id: cfg.if_id.0,
            // Validated by kp-schema: the request size fits a u32.
            height: u32::try_from(h).unwrap_or(u32::MAX),
            width: u32::try_from(w).unwrap_or(u32::MAX),
            rgb_u8: matches!(cfg.input.format, InputFormat::RgbU8Hwc { .. }),
            input_bytes: cfg.request_bytes(),
            num_classes: cfg.output.num_classes,
            labels_path,
        })
    }

    /// The model's class names: [`LabelsError::NoLabels`] if its config
    /// names none, [`LabelsError::Count`] if the file does not have one
    /// name per class.
    pub fn labels(&self) -> Result<Labels, LabelsError> {
        let path = self
            .labels_path
            .as_ref()
            .ok_or_else(|| LabelsError::NoLabels {
                model: self.name.clone(),
            })?;
        let labels = Labels::from_file(path)?;
        if labels.len() != self.num_classes {
            return Err(LabelsError::Count {
                path: path.clone(),
                names: labels.len(),
                classes: self.num_classes,
            });
        }
        Ok(labels)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scratch model repository holding one model `m` (if_id 3, 2x4
    /// input, 3 classes) whose config has `extra` at the top level.
    struct Repo(PathBuf);

    impl Repo {
        fn new(test: &str, extra: &str, labels: Option<&str>) -> Repo {
            let dir = std::env::temp_dir().join(format!("kp-labels-{test}-{}", std::process::id()));
            let _ = fs::remove_dir_all(&dir);
            let m = dir.join("m");
            fs::create_dir_all(&m).unwrap();
            fs::write(m.join("model.onnx"), b"not read").unwrap();
            let config = format!(
                "schema_version = 1\nname = \"m\"\nif_id = 3\nmodel_file = \"model.onnx\"\n\
                 engine = \"onnxruntime\"\nintra_op_threads = 1\ntop_k = 2\nslo_ms = 10.0\n{extra}\n\
                 [input]\nname = \"x\"\nformat = \"rgb_u8_hwc\"\nshape = [3, 2, 4]\n\
                 mean = [0.5, 0.5, 0.5]\nstd = [0.5, 0.5, 0.5]\n\
                 [output]\nname = \"y\"\nshape = [3]\nnum_classes = 3\nkind = \"logits\"\n"
            );
            fs::write(m.join("config.toml"), config).unwrap();
            if let Some(text) = labels {
                fs::write(m.join("names.txt"), text).unwrap();
            }
            Repo(dir)
        }
    }

    impl Drop for Repo {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn a_model_with_labels_names_its_classes() {
        let repo = Repo::new(
            "ok",
            "labels = \"names.txt\"",
            Some("cat\r\ndog\nespresso\n"),
        );
        let model = ModelInfo::find(&repo.0, 3).unwrap();
        assert_eq!(
            (
                model.name.as_str(),
                model.height,
                model.width,
                model.rgb_u8,
                model.input_bytes
            ),
            ("m", 2, 4, true, 24)
        );
        let labels = model.labels().unwrap();
        assert_eq!(labels.len(), 3);
        assert_eq!(
            [labels.get(0), labels.get(1), labels.get(2), labels.get(3)],
            [Some("cat"), Some("dog"), Some("espresso"), None]
        );
        assert_eq!(
            ModelInfo::load(repo.0.join("m/config.toml")).unwrap(),
            model
        );
        assert!(matches!(
            ModelInfo::find(&repo.0, 4),
            Err(LabelsError::UnknownIf { if_id: 4, .. })
        ));
    }

    #[test]
    fn a_model_without_labels_is_a_typed_error_when_they_are_asked_for() {
        let repo = Repo::new("none", "", None);
        let model = ModelInfo::find(&repo.0, 3).unwrap();
        let e = model.labels().unwrap_err();
        assert!(
            matches!(&e, LabelsError::NoLabels { model } if model == "m"),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            "model m has no labels (no `labels` in its config.toml)"
        );
    }

    #[test]
    fn bad_labels_files_are_refused() {
        let repo = Repo::new("count", "labels = \"names.txt\"", Some("cat\ndog\n"));
        let e = ModelInfo::find(&repo.0, 3).unwrap().labels().unwrap_err();
        assert!(
            matches!(
                e,
                LabelsError::Count {
                    names: 2,
                    classes: 3,
                    ..
                }
            ),
            "{e:?}"
        );
        let repo = Repo::new("empty", "labels = \"names.txt\"", Some("cat\n\ndog\n"));
        let e = ModelInfo::find(&repo.0, 3).unwrap().labels().unwrap_err();
        assert!(matches!(e, LabelsError::EmptyName { line: 2, .. }), "{e:?}");
        let repo = Repo::new("missing", "labels = \"names.txt\"", None);
        let e = ModelInfo::find(&repo.0, 3).unwrap().labels().unwrap_err();
        assert!(matches!(e, LabelsError::Io { .. }), "{e:?}");
        let repo = Repo::new("field", "labels = 7", None);
        let e = ModelInfo::find(&repo.0, 3).unwrap_err();
        assert!(matches!(e, LabelsError::BadLabelsField { .. }), "{e:?}");
    }

    #[test]
    fn the_model_repository_names_espresso() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../models");
        let config = dir.join("efficientnet_lite0/config.toml");
        assert!(
            config.is_file(),
            "{} is missing: run `make models` (MODELS=efficientnet_lite0 is enough)",
            config.display()
        );
        let model = ModelInfo::find(&dir, 10).unwrap();
        assert_eq!((model.height, model.width, model.rgb_u8), (224, 224, true));
        assert_eq!(model.labels().unwrap().get(967), Some("espresso"));
    }
}
