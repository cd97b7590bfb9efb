//! kp-if — the stock inference function: libml's runtime hosting the
//! built-in engines, as the `kp-if` binary (one model, one device share, a
//! DPDK secondary process of a running if-manager) and `kp-engine-bench`
//! (the same engine alone, for the benchmarks).
//!
//! This crate is where the engines meet the runtime: libml knows only the
//! [`Framework`] trait and the engine a model's `config.toml` names
//! ([`EngineKind`]); each engine is its own crate under `engines/`;
//! [`engine_for`] maps one to the other. What the two binaries share of
//! their command lines is here too ([`EngineOverrides`]).

use kp_schema::model::{EngineKind, ModelConfig};
use libml::engine::{EngineError, Framework};

/// A new, uninitialised engine of `kind`.
pub fn engine_for(kind: EngineKind) -> Result<Box<dyn Framework>, EngineError> {
    Ok(match kind {
        EngineKind::OnnxRuntime => Box::new(kp_engine_onnxruntime::OnnxRuntime::new()),
        EngineKind::Tract => Box::new(kp_engine_tract::Tract::new()),
        EngineKind::Cudnn => Box::new(kp_engine_cudnn::CudnnEngine::new()),
        EngineKind::OnnxRuntimeCuda => Box::new(
            kp_engine_onnxruntime::OnnxRuntime::new().with_device(
                kp_engine_onnxruntime::Device::Cuda {
                    device_id: kp_engine_cudnn::device_ordinal()
                        .and_then(|o| i32::try_from(o).map_err(|e| e.to_string()))
                        .map_err(EngineError::Library)?,
                },
            ),
        ),
    })
}

/// Command-line overrides of a model's engine settings, the same for every
/// binary that runs a model (kp-if, kp-engine-bench): `#[command(flatten)]`.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct EngineOverrides {
    /// Engine intra-op threads (default: the model's).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Engine, `onnxruntime`, `tract`, `cudnn` or `onnxruntime-cuda`
    /// (default: the model's).
    #[arg(long)]
    pub engine: Option<EngineKind>,
}

impl EngineOverrides {
    /// `model` with these overrides applied.
    pub fn apply(&self, model: &mut ModelConfig) {
        if let Some(t) = self.threads {
            model.intra_op_threads = t;
        }
        if let Some(e) = self.engine {
            model.engine = e;
        }
    }
}
