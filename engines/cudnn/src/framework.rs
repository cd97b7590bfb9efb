//! The `cudnn` engine as a libml [`Framework`]: [`GpuPlan`] behind GSLICE's
//! six callbacks, and the IF's input pool read in place: the host attaches
//! the pool ([`Framework::attach_input_pool`]), the engine registers it as
//! pinned memory, and each batch is one gather launch from the slots the
//! runtime names ([`Framework::infer_slots`]) into the device input.

use std::path::Path;

use kp_cuda::dnn::Dnn;
use kp_cuda::gather::GatherShape;
use kp_cuda::{Gpu, GpuError, PoolGather};
use kp_plan::{Plan, PlanError};
use libml::engine::{
    check_batch, DeviceStats, EngineConfig, EngineError, Framework, ModelInfo, PoolLocation,
    SlotContent,
};

use crate::{device_ordinal, open, GpuPlan};

/// The `cudnn` engine.
#[derive(Debug, Default)]
pub struct CudnnEngine {
    /// Opened by `init`, until a model takes it.
    device: Option<(Gpu, Dnn)>,
    model: Option<(GpuPlan, ModelInfo)>,
    /// The attached input pool.
    pool: Option<PoolLocation>,
    /// A batch's byte offsets into the pool, reused.
    offsets: Vec<u64>,
}

/// Per-channel mean and standard deviation of raw images.
pub type Normalisation = ([f32; 3], [f32; 3]);

/// The gather of the IF's input pool `pool` on `gpu`, with room for
/// batches of `max_batch`: what any GPU engine that reads the pool in
/// place needs (this one, and `onnxruntime-cuda`'s I/O binding). An error
/// says why the pool cannot be taken.
pub fn pool_gather(
    gpu: &Gpu,
    pool: &PoolLocation,
    max_batch: usize,
) -> Result<PoolGather, EngineError> {
    let (shape, norm) = gather_shape(pool)?;
    PoolGather::new(gpu, pool.addr, pool.reserved_bytes, shape, norm, max_batch)
        .map_err(|e| EngineError::Library(format!("registering the input pool: {e}")))
}

/// The gather of one request of `pool` (and the normalisation of raw
/// images); an error for a slot too small for what it says it holds.
pub fn gather_shape(pool: &PoolLocation) -> Result<(GatherShape, Normalisation), EngineError> {
    let too_big = || EngineError::Shape(format!("slot content {:?}", pool.content));
    let (shape, norm) = match pool.content {
        SlotContent::F32 { elems } => (
            GatherShape::F32 {
                elems: u32::try_from(elems).map_err(|_| too_big())?,
            },
            ([0.0; 3], [1.0; 3]),
        ),
        SlotContent::RgbU8Hwc { h, w, mean, std } => (
            GatherShape::RgbU8Hwc {
                height: u32::try_from(h).map_err(|_| too_big())?,
                width: u32::try_from(w).map_err(|_| too_big())?,
            },
            (mean, std),
        ),
    };
    if shape.request_bytes() > pool.slot_bytes as u64 {
        return Err(EngineError::Shape(format!(
            "a request of {} bytes in slots of {}",
            shape.request_bytes(),
            pool.slot_bytes
        )));
    }
    Ok((shape, norm))
}

/// The byte offsets of `slots` in `pool`, into `out`; an error names a
/// slot the pool does not have.
pub fn slot_offsets(
    pool: &PoolLocation,
    slots: &[u32],
    out: &mut Vec<u64>,
) -> Result<(), EngineError> {
    out.clear();
    for &s in slots {
        out.push(pool.slot_offset(s).ok_or_else(|| {
            EngineError::Shape(format!("slot {s} of a pool of {} slots", pool.slots))
        })?);
    }
    Ok(())
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

    fn attach_input_pool(&mut self, pool: PoolLocation) -> Result<(), EngineError> {
        let (m, _) = self
            .model
            .as_mut()
            .ok_or(EngineError::Order("attach a pool before a model"))?;
        let (shape, norm) = gather_shape(&pool)?;
        m.attach_pool(pool.addr, pool.reserved_bytes, shape, norm)
            .map_err(|e| EngineError::Library(format!("registering the input pool: {e}")))?;
        self.offsets = Vec::with_capacity(m.max_batch().max(1));
        self.pool = Some(pool);
        Ok(())
    }

    fn normalises_images(&self) -> bool {
        // The gather kernel normalises raw RGB bytes through the same table
        // libml's CPU path uses.
        true
    }

    fn reads_input_pool(&self) -> bool {
        self.pool.is_some()
    }

    fn detach_input_pool(&mut self) {
        if let Some((m, _)) = self.model.as_mut() {
            m.detach_pool();
        }
        self.pool = None;
    }

    fn infer_slots(&mut self, slots: &[u32], output: &mut [f32]) -> Result<(), EngineError> {
        let pool = self
            .pool
            .as_ref()
            .ok_or(EngineError::Order("infer_slots without an input pool"))?;
        let (m, info) = self
            .model
            .as_mut()
            .ok_or(EngineError::Order("infer before a model"))?;
        let batch = slots.len();
        if batch == 0 || batch > m.max_batch() || output.len() != batch * info.output_elems() {
            return Err(EngineError::Shape(format!(
                "a batch of {batch} slots (at most {}) with room for {} outputs",
                m.max_batch(),
                output.len()
            )));
        }
        slot_offsets(pool, slots, &mut self.offsets)?;
        m.run_gathered(&self.offsets, output).map_err(gpu_err)
    }

    fn deinit(&mut self) {
        self.detach_input_pool();
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
            last_input_ns: s.last_input_ns,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_become_byte_offsets_and_a_slot_past_the_pool_is_an_error() {
        let pool = PoolLocation {
            addr: 0x1000,
            reserved_bytes: 2 << 20,
            slots: 4,
            slot_bytes: 3 * 224 * 224 * 4,
            content: SlotContent::F32 {
                elems: 3 * 224 * 224,
            },
        };
        let mut out = Vec::new();
        slot_offsets(&pool, &[2, 0, 3], &mut out).unwrap();
        let b = 3 * 224 * 224 * 4;
        assert_eq!(out, [2 * b, 0, 3 * b]);
        let e = slot_offsets(&pool, &[1, 4], &mut out).unwrap_err();
        assert!(e.to_string().contains("slot 4 of a pool of 4 slots"), "{e}");
    }

    #[test]
    fn raw_images_are_gathered_and_normalised_and_must_fit_their_slots() {
        let mut pool = PoolLocation {
            addr: 0x1000,
            reserved_bytes: 2 << 20,
            slots: 4,
            slot_bytes: 224 * 224 * 3,
            content: SlotContent::RgbU8Hwc {
                h: 224,
                w: 224,
                mean: [0.5, 0.4, 0.3],
                std: [0.2, 0.25, 0.3],
            },
        };
        let (shape, norm) = gather_shape(&pool).unwrap();
        assert_eq!(
            shape,
            GatherShape::RgbU8Hwc {
                height: 224,
                width: 224
            }
        );
        assert_eq!(norm, ([0.5, 0.4, 0.3], [0.2, 0.25, 0.3]));
        pool.slot_bytes -= 1;
        let e = gather_shape(&pool).unwrap_err();
        assert!(
            e.to_string().contains("150528 bytes in slots of 150527"),
            "{e}"
        );
        pool.content = SlotContent::F32 { elems: 100 };
        pool.slot_bytes = 399;
        assert!(gather_shape(&pool).is_err());
        pool.slot_bytes = 400;
        assert_eq!(
            gather_shape(&pool).unwrap().0,
            GatherShape::F32 { elems: 100 }
        );
    }

    #[test]
    fn without_a_pool_or_a_model_the_in_place_path_says_what_is_missing() {
        let mut e = CudnnEngine::new();
        assert!(!e.reads_input_pool());
        let pool = PoolLocation {
            addr: 0x1000,
            reserved_bytes: 4096,
            slots: 1,
            slot_bytes: 12,
            content: SlotContent::F32 { elems: 3 },
        };
        assert!(matches!(
            e.attach_input_pool(pool),
            Err(EngineError::Order(_))
        ));
        assert!(!e.reads_input_pool());
        let mut out = [0.0f32; 1000];
        assert!(matches!(
            e.infer_slots(&[0], &mut out),
            Err(EngineError::Order(_))
        ));
        e.deinit();
    }

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
