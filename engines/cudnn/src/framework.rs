//! The `cudnn` engine as a libml [`Framework`]: [`GpuPlan`] behind GSLICE's
//! six callbacks.

use std::path::Path;

use kp_cuda::dnn::Dnn;
use kp_cuda::{Gpu, GpuError};
use kp_plan::{Plan, PlanError};
use libml::engine::{check_batch, DeviceStats, EngineConfig, EngineError, Framework, ModelInfo};

use crate::{device_ordinal, open, GpuPlan};

/// The `cudnn` engine.
#[derive(Debug, Default)]
pub struct CudnnEngine {
    /// Opened by `init`, until a model takes it.
    device: Option<(Gpu, Dnn)>,
    model: Option<(GpuPlan, ModelInfo)>,
}

fn gpu_err(e: GpuError) -> EngineError {
    match e {
        GpuError::NoDriver { .. }
        | GpuError::NoNvrtc { .. }
        | GpuError::NoDevice(_)
        | GpuError::NoLibrary { .. } => EngineError::Library(e.to_string()),
        other => EngineError::Run(other.to_string()),
    }
}

fn plan_err(model: &str) -> impl FnOnce(PlanError) -> EngineError + '_ {
    move |e| EngineError::Model {
        model: model.to_string(),
        reason: e.to_string(),
    }
}

impl CudnnEngine {
    /// An engine that opens the GPU at [`Framework::init`].
    pub fn new() -> Self {
        CudnnEngine::default()
    }

    /// The GPU's name, once initialised.
    pub fn device_name(&self) -> Option<&str> {
        match (&self.device, &self.model) {
            (Some((g, _)), _) => Some(g.info().name.as_str()),
            (None, Some((m, _))) => Some(m.gpu().info().name.as_str()),
            _ => None,
        }
    }

    /// Checked before a model is read (a big model is not parsed for
    /// nothing).
    fn ready_to_load(&self) -> Result<(), EngineError> {
        if self.model.is_some() {
            return Err(EngineError::Order("a second model load"));
        }
        if self.device.is_none() {
            return Err(EngineError::Order("load before init"));
        }
        Ok(())
    }

    fn loaded(&mut self, plan: Plan) -> Result<ModelInfo, EngineError> {
        self.ready_to_load()?;
        let info = ModelInfo {
            input_name: plan.io_names.0.clone(),
            input_shape: plan.input.shape.clone(),
            output_name: plan.io_names.1.clone(),
            output_shape: plan.output.shape.clone(),
        };
        let (gpu, dnn) = self
            .device
            .take()
            .ok_or(EngineError::Order("load before init"))?;
        let gp = GpuPlan::new(gpu, dnn, plan).map_err(gpu_err)?;
        self.model = Some((gp, info.clone()));
        Ok(info)
    }
}

impl Framework for CudnnEngine {
    fn name(&self) -> &str {
        "cudnn"
    }

    fn init(&mut self, _config: &EngineConfig) -> Result<(), EngineError> {
        if self.device.is_some() || self.model.is_some() {
            return Err(EngineError::Order("init twice"));
        }
        let ordinal = device_ordinal().map_err(EngineError::Library)?;
        self.device = Some(open(ordinal).map_err(gpu_err)?);
        Ok(())
    }

    fn load_model(&mut self, path: &Path) -> Result<ModelInfo, EngineError> {
        self.ready_to_load()?;
        let name = path.display().to_string();
        let plan = Plan::load(path).map_err(plan_err(&name))?;
        self.loaded(plan)
    }

    fn link_model(&mut self, model_bytes: &[u8]) -> Result<ModelInfo, EngineError> {
        self.ready_to_load()?;
        let plan = Plan::from_bytes(model_bytes).map_err(plan_err("model in memory"))?;
        self.loaded(plan)
    }

    fn configure_batch(&mut self, max_batch: usize) -> Result<(), EngineError> {
        let (m, _) = self
            .model
            .as_mut()
            .ok_or(EngineError::Order("configure before a model"))?;
        m.configure(max_batch).map_err(gpu_err)
    }

    fn infer_batch(
        &mut self,
        input: &[f32],
        batch: usize,
        output: &mut [f32],
    ) -> Result<(), EngineError> {
        let (m, info) = self
            .model
            .as_mut()
            .ok_or(EngineError::Order("infer before a model"))?;
        if m.max_batch() == 0 {
            return Err(EngineError::Order("infer before configure_batch"));
        }
        check_batch(info, input, batch, output, m.max_batch())?;
        m.run(input, batch, output).map_err(gpu_err)
    }

    fn deinit(&mut self) {
        self.model = None;
        self.device = None;
    }

    fn device_stats(&self) -> Option<DeviceStats> {
        let (m, _) = self.model.as_ref()?;
        let s = m.stats();
        Some(DeviceStats {
            batches: s.batches,
            busy_ns: s.busy_ns,
            last_batch_ns: s.last_batch_ns,
            memory_bytes: s.memory_bytes,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_gpu_init_is_a_clear_library_error_and_nothing_panics() {
        let mut e = CudnnEngine::new();
        match e.init(&EngineConfig {
            intra_op_threads: 1,
        }) {
            // On a GPU machine with the libraries this opens device 0.
            Ok(()) => assert!(e.device_name().is_some()),
            Err(EngineError::Library(msg)) => {
                assert!(
                    msg.starts_with("no CUDA driver found")
                        || msg.starts_with("NVRTC missing")
                        || msg.starts_with("no GPU")
                        || msg.starts_with("cuDNN missing")
                        || msg.starts_with("cuBLAS missing"),
                    "{msg}"
                );
                let mut out = [0.0f32; 1000];
                assert!(matches!(
                    e.infer_batch(&[0.0; 3], 1, &mut out),
                    Err(EngineError::Order(_))
                ));
                assert!(matches!(e.configure_batch(4), Err(EngineError::Order(_))));
                assert!(matches!(
                    e.load_model(Path::new("models/squeezenet/model.onnx")),
                    Err(EngineError::Order(_))
                ));
            }
            Err(other) => panic!("expected a library error, got {other}"),
        }
        e.deinit();
    }
}
