//! The framework callback interface: how an inference function hosts any
//! inference engine.
//!
//! As in GSLICE, an engine is six callbacks: [`Framework::init`],
//! [`Framework::deinit`], [`Framework::load_model`], [`Framework::link_model`]
//! (attach a model already in memory, e.g. shared from another process),
//! [`Framework::configure_batch`] and [`Framework::infer_batch`]. Rust IFs
//! implement the trait; C/C++ IFs fill a struct of function pointers declared
//! in the C header under `ffi/` and are adapted to the same trait.
//!
//! Contract:
//! - `init` is called once, first, with the engine's share of the device
//!   (intra-op threads on a CPU); a thread pool or a CUDA context is fixed
//!   from then on (which is why a share change needs a new process).
//! - Exactly one of `load_model` / `link_model` is called, once, after `init`.
//! - `configure_batch(max)` is called before the first `infer_batch` and
//!   whenever the largest batch the IF may run changes; an engine may
//!   pre-allocate or pre-optimise for it.
//! - `infer_batch` gets `batch` inputs laid out back to back in the model's
//!   input layout (`batch * input_elems` f32 values, NCHW) and writes
//!   `batch * output_elems` f32 values. It must not keep references to
//!   either slice after it returns.
//! - `deinit` is called once, last (also after an error); it must not fail.
//!
//! An engine may instead read each request where it lies, in the IF's input
//! pool (GSLICE's scatter-gather: a GPU engine registers the pool as pinned
//! memory and gathers a batch from its slots on the device, with no copy on
//! the host). The host calls [`Framework::attach_input_pool`] once, after
//! `configure_batch`, with the pool's [`PoolLocation`]; an engine that took
//! it says so in [`Framework::reads_input_pool`], and from then on the
//! runtime calls [`Framework::infer_slots`] with the slot numbers of each
//! batch, in batch order, instead of `infer_batch`. The host calls
//! [`Framework::detach_input_pool`] before the pool's memory goes. Engines
//! that read no pool (the CPU engines) keep the defaults: nothing to
//! attach, and `infer_batch` as above.
//!
//! The engines themselves live above libml, one crate each under
//! `engines/` (ONNX Runtime, tract, the C ABI adapter), so that nothing that
//! only needs the runtime (the if-manager, the orchestrator) builds an
//! engine; the `kp-if` crate hosts them and picks the one a model's
//! `config.toml` names. [`check_batch`] is the size check they all share.

use std::path::Path;

use thiserror::Error;

pub use crate::pool::SlotContent;
pub use kp_schema::telemetry::DeviceStats;

/// What the engine needs to know before it loads anything.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngineConfig {
    /// Intra-op threads (the CPU form of the IF's device share).
    pub intra_op_threads: usize,
}

/// The tensors of a loaded model, as the engine found them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelInfo {
    /// Input tensor name.
    pub input_name: String,
    /// Input shape without the batch dimension (e.g. `[3, 224, 224]`).
    pub input_shape: Vec<usize>,
    /// Output tensor name.
    pub output_name: String,
    /// Output shape without the batch dimension (e.g. `[1000]`).
    pub output_shape: Vec<usize>,
}

impl ModelInfo {
    /// f32 values of one input.
    pub fn input_elems(&self) -> usize {
        self.input_shape.iter().product()
    }

    /// f32 values of one output.
    pub fn output_elems(&self) -> usize {
        self.output_shape.iter().product()
    }
}

/// Why an engine call failed.
#[derive(Debug, Error)]
pub enum EngineError {
    /// The engine's library could not be found or loaded.
    #[error("inference engine library unavailable: {0}")]
    Library(String),
    /// The model could not be read, parsed or prepared.
    #[error("cannot load model {model}: {reason}")]
    Model {
        /// Path or description of the model.
        model: String,
        /// What went wrong.
        reason: String,
    },
    /// Inputs or outputs do not have the sizes the model needs.
    #[error("shape mismatch: {0}")]
    Shape(String),
    /// A call came out of order (e.g. `infer_batch` before a model).
    #[error("engine used out of order: {0}")]
    Order(&'static str),
    /// The engine failed while running.
    #[error("inference failed: {0}")]
    Run(String),
}

/// Where the IF's input pool lies and what its slots hold: plain numbers,
/// read by nothing here. An engine that reads requests in place registers
/// this range with its device ([`Framework::attach_input_pool`]) and finds
/// slot `s` at byte [`PoolLocation::slot_offset`]`(s)`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PoolLocation {
    /// Address of slot 0.
    pub addr: usize,
    /// Bytes of memory under the pool from `addr` (whole pages for a
    /// hugepage pool: what a registration covers).
    pub reserved_bytes: usize,
    /// Slots.
    pub slots: usize,
    /// Bytes from one slot to the next.
    pub slot_bytes: usize,
    /// What each slot holds: the model's input as `f32` values, or an
    /// image's raw bytes for the engine to normalise.
    pub content: SlotContent,
}

impl PoolLocation {
    /// Bytes of the slots themselves (at most
    /// [`PoolLocation::reserved_bytes`]).
    pub fn bytes(&self) -> usize {
        self.slots * self.slot_bytes
    }

    /// Bytes from `addr` to slot `slot`, or `None` for a slot the pool
    /// does not have.
    pub fn slot_offset(&self, slot: u32) -> Option<u64> {
        let slot = slot as usize;
        (slot < self.slots).then(|| (slot * self.slot_bytes) as u64)
    }
}

/// An inference engine, as the six callbacks of GSLICE's interface.
pub trait Framework: Send {
    /// A short name for logs and telemetry (e.g. "onnxruntime").
    fn name(&self) -> &str;
    /// Sets up the engine with its share of the device.
    fn init(&mut self, config: &EngineConfig) -> Result<(), EngineError>;
    /// Loads a model from a file.
    fn load_model(&mut self, path: &Path) -> Result<ModelInfo, EngineError>;
    /// Attaches a model whose bytes are already in memory (for example a
    /// model store shared between processes).
    fn link_model(&mut self, model_bytes: &[u8]) -> Result<ModelInfo, EngineError>;
    /// Prepares for batches of up to `max_batch` inputs.
    fn configure_batch(&mut self, max_batch: usize) -> Result<(), EngineError>;
    /// Runs `batch` inputs; see the module docs for the layout.
    fn infer_batch(
        &mut self,
        input: &[f32],
        batch: usize,
        output: &mut [f32],
    ) -> Result<(), EngineError>;
    /// Releases everything; the engine is not used again.
    fn deinit(&mut self);
    /// What the engine measured on a device of its own (a GPU engine:
    /// device time per batch, device memory), read after each batch and
    /// published with the IF's telemetry. CPU engines have none (the
    /// default).
    fn device_stats(&self) -> Option<DeviceStats> {
        None
    }
    /// Takes the IF's input pool, to read requests where they lie (module
    /// docs). An error means the engine wanted the pool and could not have
    /// it (a GPU that refuses to register it): the IF must not start. The
    /// default takes nothing.
    ///
    /// The host keeps the pool's memory until it has called
    /// [`Framework::detach_input_pool`] (or [`Framework::deinit`]), and
    /// names in [`Framework::infer_slots`] only slots that hold a complete
    /// request nothing writes until the call returns (what
    /// [`crate::runtime::serve`] does). The engine only *reads* the pool,
    /// and a device reads it only inside `infer_slots`.
    fn attach_input_pool(&mut self, pool: PoolLocation) -> Result<(), EngineError> {
        let _ = pool;
        Ok(())
    }
    /// Whether the engine normalises `rgb_u8_hwc` images itself, from the
    /// raw bytes in the pool ([`SlotContent::RgbU8Hwc`]): a host then keeps
    /// the bytes as they came (`InputLayout::raw_images`) and the fragment
    /// thread only copies them. Only for an engine that reads the pool in
    /// place; the default is no.
    fn normalises_images(&self) -> bool {
        false
    }
    /// Whether a batch's whole computation runs on the thread that calls
    /// [`Framework::infer_batch`] / [`Framework::infer_slots`] (a CPU engine
    /// with one thread), so that the thread's CPU clock across the call is
    /// what the batch cost, net of the time the thread spent off the CPU.
    /// The batching policy then learns its batch costs from that clock
    /// (`BatchPolicy::on_batch_done_on_cpu`): on a core shared with the
    /// fragment thread the wall time of a batch also holds the fragments of
    /// whatever requests arrived while it ran. The default is no (a GPU, or
    /// a thread pool, computes elsewhere; a foreign engine is not known to).
    fn runs_on_calling_thread(&self) -> bool {
        false
    }
    /// Whether the engine took the input pool: the runtime then calls
    /// [`Framework::infer_slots`], not [`Framework::infer_batch`].
    fn reads_input_pool(&self) -> bool {
        false
    }
    /// Gives the input pool back (registrations undone); the pool's memory
    /// may go after this. Called at most once, after the last batch.
    fn detach_input_pool(&mut self) {}
    /// Runs the batch whose requests are in the attached pool's `slots`
    /// (batch order) and writes `slots.len() * output_elems` values, as
    /// `infer_batch` does. Only called when
    /// [`Framework::reads_input_pool`] is true.
    fn infer_slots(&mut self, slots: &[u32], output: &mut [f32]) -> Result<(), EngineError> {
        let _ = (slots, output);
        Err(EngineError::Run(format!(
            "{} reads no input pool: the runtime must call infer_batch",
            self.name()
        )))
    }
}

/// The size checks every engine makes before a batch.
pub fn check_batch(
    info: &ModelInfo,
    input: &[f32],
    batch: usize,
    output: &[f32],
    max_batch: usize,
) -> Result<(), EngineError> {
    if batch == 0 || batch > max_batch {
        return Err(EngineError::Shape(format!(
            "batch {batch} is outside 1..={max_batch}"
        )));
    }
    let want_in = batch * info.input_elems();
    let want_out = batch * info.output_elems();
    if input.len() != want_in {
        return Err(EngineError::Shape(format!(
            "input has {} f32, a batch of {batch} x {:?} needs {want_in}",
            input.len(),
            info.input_shape
        )));
    }
    if output.len() != want_out {
        return Err(EngineError::Shape(format!(
            "output has room for {} f32, a batch of {batch} x {:?} gives {want_out}",
            output.len(),
            info.output_shape
        )));
    }
    Ok(())
}
