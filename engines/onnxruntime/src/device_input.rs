//! The `onnxruntime-cuda` engine reading the IF's input pool in place: the
//! pool registered as pinned memory and each batch gathered on the GPU
//! (kp-cuda's gather, the one the `cudnn` engine uses) into a device
//! tensor that ONNX Runtime's CUDA execution provider reads as the model's
//! input — no copy of the batch on the host, none to the device by ONNX
//! Runtime — on the stream the execution provider computes on (ours,
//! given to it as its `user_compute_stream`), so the gather is ordered
//! before the graph without a synchronisation.
//!
//! The device tensor goes to `Session::run` as a borrowed CUDA tensor, not
//! through an `IoBinding`: ort's `IoBinding::bind_input` clones a tensor
//! made from borrowed memory (ort 2.0.0-rc.15, `session/io_binding.rs`),
//! which would be one device copy per batch; `run` hands ONNX Runtime the
//! pointer, which its CUDA provider consumes where it lies.
//!
//! **Never run**: the GPU machine we test on has no onnxruntime-gpu
//! (docs/GPU.md). What runs without a GPU is tested: the refusal without a
//! CUDA-enabled library, the errors of the in-place path.

use kp_cuda::cudarc::driver::{CudaSlice, DevicePtr};
use kp_cuda::{Gpu, PoolGather};
use libml::engine::{EngineError, PoolLocation};

/// The pool's gather and the device tensor it fills.
#[derive(Debug)]
pub(crate) struct DeviceInput {
    pool: PoolLocation,
    gather: PoolGather,
    /// The batch input on the device, `max_batch` requests long.
    tensor: CudaSlice<f32>,
    /// Values per request.
    elems: usize,
    /// A batch's byte offsets into the pool, reused.
    offsets: Vec<u64>,
}

impl DeviceInput {
    /// Registers `pool` on `gpu` for a model of `elems` input values per
    /// request, batches of up to `max_batch`.
    pub(crate) fn new(
        gpu: &Gpu,
        pool: PoolLocation,
        elems: usize,
        max_batch: usize,
    ) -> Result<DeviceInput, EngineError> {
        let gather = kp_engine_cudnn::pool_gather(gpu, &pool, max_batch)?;
        if gather.shape().request_elems() != elems as u64 {
            return Err(EngineError::Shape(format!(
                "pool requests of {} values for a model input of {elems}",
                gather.shape().request_elems()
            )));
        }
        let tensor = gpu
            .stream()
            .alloc_zeros::<f32>(max_batch.max(1) * elems)
            .map_err(|e| EngineError::Library(format!("allocating the device input: {e}")))?;
        Ok(DeviceInput {
            pool,
            gather,
            tensor,
            elems,
            offsets: Vec::with_capacity(max_batch.max(1)),
        })
    }

    /// Enqueues the gather of `slots` (batch order) into the device tensor
    /// on `gpu`'s stream and returns the tensor's device address; the
    /// batch fills its first `slots.len() × elems` values.
    pub(crate) fn gather(&mut self, gpu: &Gpu, slots: &[u32]) -> Result<u64, EngineError> {
        let n = slots.len();
        if n == 0 || n * self.elems > self.tensor.len() {
            return Err(EngineError::Shape(format!(
                "a batch of {n} slots; the device input holds {}",
                self.tensor.len() / self.elems
            )));
        }
        kp_engine_cudnn::slot_offsets(&self.pool, slots, &mut self.offsets)?;
        let mut out = self.tensor.slice_mut(0..n * self.elems);
        self.gather
            .gather(gpu, &self.offsets, &mut out)
            .map_err(|e| EngineError::Run(format!("gathering the batch: {e}")))?;
        let (ptr, _sync) = self.tensor.device_ptr(gpu.stream());
        Ok(ptr)
    }
}
