//! ONNX Runtime as a [`Framework`], through the `ort` crate (`=2.0.0-rc.15`).
//!
//! # The library
//!
//! `ort` is built with `load-dynamic` only: nothing is downloaded or linked
//! at build time (its build script returns at once under that feature), and
//! the ONNX Runtime shared library is `dlopen()`ed by [`Framework::init`].
//! [`OnnxRuntime::new`] finds it with [`find_onnxruntime_library`]: the
//! `ORT_DYLIB_PATH` environment variable if set, else the `onnxruntime`
//! wheel that `make setup` installs into the repository's `.venv`;
//! [`OnnxRuntime::with_library`] names it explicitly. A missing, unloadable
//! or too old library is an [`EngineError::Library`] that says where it
//! looked and how to fix it, never a panic: ort itself would panic if a
//! session were made before a library is loaded, so this module always loads
//! it first with `ort::init_from`, which reports `dlopen` and version errors
//! as values.
//!
//! One process holds one ONNX Runtime library and one ort `Environment`
//! (ort refuses a second environment for the life of the process, even after
//! the first is dropped), so both are kept in a process-wide slot, shared by
//! every [`OnnxRuntime`] of the process. A second engine asking for another
//! library file gets an error rather than silently running the first.
//!
//! # Sessions
//!
//! One session per engine: `intra_op_threads` threads from the
//! [`EngineConfig`] (the IF's CPU share), one inter-op thread, sequential
//! execution, every graph optimisation (`ORT_ENABLE_ALL`), and no spinning:
//! ORT's pool threads otherwise spin-wait after each run, so an idle IF would
//! burn its cores (`session.intra_op.allow_spinning = 0`, and the same for
//! inter-op). With 1 intra-op thread ORT starts no pool thread at all; the
//! calling thread runs the graph.
//!
//! # Data path
//!
//! [`Framework::infer_batch`] wraps the caller's input slice in a borrowed
//! tensor (`TensorRef::from_array_view((shape, &[f32]))`): ORT reads the
//! input pool in place, without a copy. ORT allocates the output from its
//! arena and this engine copies it (`batch × output_elems` f32, 32 KB at
//! batch 8 for 1000 classes) into the caller's slice.
//! [`Framework::configure_batch`] runs one warm-up batch of 1, so that the
//! session's first run (its allocation plan, the arena's first chunk) is
//! not a request's. Not one of the largest size: ORT plans memory per
//! input shape, so that batch would prepare no other size, and its only
//! lasting effect, an arena already grown to the largest batch, costs the
//! whole batch's compute at every start (squeezenet at 32 on the 2-CPU
//! EPYC VM: ~350 ms of a core, taken from the active IF when a shadow
//! starts on its cores) to save ~90 ms once, at the first batch of 32 if
//! one ever comes (docs/PERFORMANCE-JOURNAL.md, orchestrator section).
//!
//! # Devices
//!
//! [`Device::Cpu`] (the default) uses ONNX Runtime's CPU execution
//! provider. [`Device::Cuda`] (engine `onnxruntime-cuda`) registers its
//! CUDA execution provider (strict fp32: TF32 off), which only the
//! onnxruntime-gpu build has: with `ORT_DYLIB_PATH` naming that wheel's
//! library it runs on the GPU; with a CPU build (the one `make setup`
//! installs, and the only one on the GPU machine we test on) loading a model
//! fails with an [`EngineError::Library`] that says so, and never falls
//! back to the CPU. An IF's batches reach it in place: the engine takes
//! the IF's input pool (`Framework::attach_input_pool`), gathers each
//! batch on the GPU into a device tensor and gives ONNX Runtime that
//! tensor, on the stream its CUDA provider computes on (`device_input`;
//! never run: see there). Called with host memory (`infer_batch`, the
//! engine alone) ONNX Runtime copies the batch to the device itself.
//! `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` must be set before `init` (the
//! orchestrator sets it at the process's start).

use std::ffi::OsString;
use std::fmt;
use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use ort::environment::Environment;
use ort::memory::{AllocationDevice, AllocatorType, MemoryInfo, MemoryType};
use ort::session::builder::{GraphOptimizationLevel, SessionBuilder};
use ort::session::Session;
use ort::session::SessionOutputs;
use ort::value::{Shape, TensorElementType, TensorRef, TensorRefMut, ValueType};

use kp_cuda::Gpu;
use libml::engine::{check_batch, EngineConfig, EngineError, Framework, ModelInfo, PoolLocation};

mod device_input;
use device_input::DeviceInput;

/// The environment variable that names the ONNX Runtime library explicitly.
pub const LIBRARY_ENV: &str = "ORT_DYLIB_PATH";

/// Where the library is looked for under each candidate root (a glob, for
/// messages; [`find_onnxruntime_library`] walks it by hand).
pub const VENV_LIBRARY: &str =
    ".venv/lib/python3*/site-packages/onnxruntime/capi/libonnxruntime.so*";

const HOW_TO_FIX: &str = "run `make setup` (it installs the onnxruntime wheel into .venv) \
     or set ORT_DYLIB_PATH to the path of a libonnxruntime.so (ONNX Runtime >= 1.17)";

/// Finds the ONNX Runtime shared library: `$ORT_DYLIB_PATH` if set (it must
/// name a file), else the first `.venv/lib/python3*/site-packages/
/// onnxruntime/capi/libonnxruntime.so*` under the folder of the running
/// executable or any of its ancestors, then under the current directory or
/// any of its ancestors (so tests, examples and installed binaries inside the
/// repository all find the repository's `.venv`).
pub fn find_onnxruntime_library() -> Result<PathBuf, EngineError> {
    let mut roots = Vec::new();
    if let Ok(exe) = std::env::current_exe() {
        if let Some(dir) = exe.parent() {
            roots.extend(dir.ancestors().map(Path::to_path_buf));
        }
    }
    if let Ok(cwd) = std::env::current_dir() {
        roots.extend(cwd.ancestors().map(Path::to_path_buf));
    }
    find_library_in(std::env::var_os(LIBRARY_ENV), &roots)
}

/// [`find_onnxruntime_library`] without the process environment: `env` is
/// the value of `ORT_DYLIB_PATH`, `roots` the folders to look under, in order.
fn find_library_in(env: Option<OsString>, roots: &[PathBuf]) -> Result<PathBuf, EngineError> {
    if let Some(path) = env.filter(|p| !p.is_empty()) {
        let path = PathBuf::from(path);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(EngineError::Library(format!(
                "{LIBRARY_ENV}={} is not a file; point it at libonnxruntime.so, \
                 or unset it to use the onnxruntime wheel in .venv (`make setup`)",
                path.display()
            )))
        };
    }
    let mut seen: Vec<&Path> = Vec::new();
    for root in roots {
        if seen.contains(&root.as_path()) {
            continue;
        }
        seen.push(root);
        if let Some(library) = venv_library(root) {
            return Ok(library);
        }
    }
    let looked: Vec<String> = seen
        .iter()
        .map(|r| r.join(VENV_LIBRARY).display().to_string())
        .collect();
    Err(EngineError::Library(format!(
        "ONNX Runtime library not found: {LIBRARY_ENV} is not set and none of these exist: [{}]; {HOW_TO_FIX}",
        looked.join(", ")
    )))
}

/// `root/.venv/lib/python3*/site-packages/onnxruntime/capi/libonnxruntime.so*`,
/// the newest Python first, if any.
fn venv_library(root: &Path) -> Option<PathBuf> {
    let lib = root.join(".venv").join("lib");
    let mut pythons: Vec<PathBuf> = std::fs::read_dir(&lib)
        .ok()?
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("python3"))
        .map(|e| e.path())
        .collect();
    // python3.9 sorts after python3.11 as text: sort by the minor number.
    pythons.sort_by_key(|p| {
        let name = p
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        std::cmp::Reverse(
            name.trim_start_matches("python3.")
                .parse::<u32>()
                .unwrap_or(0),
        )
    });
    pythons.iter().find_map(|python| {
        let capi = python
            .join("site-packages")
            .join("onnxruntime")
            .join("capi");
        let mut libs: Vec<PathBuf> = std::fs::read_dir(capi)
            .ok()?
            .filter_map(Result::ok)
            .filter(|e| {
                e.file_name()
                    .to_string_lossy()
                    .starts_with("libonnxruntime.so")
            })
            .map(|e| e.path())
            .filter(|p| p.is_file())
            .collect();
        libs.sort();
        libs.pop()
    })
}

/// The ONNX Runtime library and environment of this process.
struct Runtime {
    /// The canonical path of the library `ort::init_from` loaded.
    library: PathBuf,
    /// Built once; ort refuses to build a second one.
    env: Option<Environment>,
}

static RUNTIME: Mutex<Option<Runtime>> = Mutex::new(None);

/// Loads `library` into the process (once) and returns the process's ort
/// environment.
fn runtime(library: &Path) -> Result<Environment, EngineError> {
    if !library.is_file() {
        return Err(EngineError::Library(format!(
            "{} does not exist or is not a file; {HOW_TO_FIX}",
            library.display()
        )));
    }
    let canonical = library
        .canonicalize()
        .map_err(|e| EngineError::Library(format!("{}: {e}; {HOW_TO_FIX}", library.display())))?;
    let mut slot = RUNTIME.lock().unwrap_or_else(PoisonError::into_inner);
    match slot.as_ref() {
        Some(rt) if rt.library != canonical => {
            return Err(EngineError::Library(format!(
                "this process already runs ONNX Runtime from {}; it cannot also load {} \
                 (one ONNX Runtime library per process)",
                rt.library.display(),
                canonical.display()
            )))
        }
        Some(Runtime { env: Some(env), .. }) => return Ok(env.clone()),
        Some(Runtime { env: None, .. }) => {}
        None => {
            // `init_from` returns dlopen, missing-symbol and version errors;
            // catch_unwind is a second guard for the asserts behind it.
            let loaded =
                panic::catch_unwind(AssertUnwindSafe(|| ort::init_from(&canonical).map(drop)))
                    .map_err(|_| {
                        EngineError::Library(format!("loading {} panicked", canonical.display()))
                    })?;
            loaded.map_err(|e| {
                EngineError::Library(format!(
                    "cannot load ONNX Runtime: {}; {HOW_TO_FIX}",
                    load_error(&e)
                ))
            })?;
            *slot = Some(Runtime {
                library: canonical.clone(),
                env: None,
            });
        }
    }
    let built = panic::catch_unwind(|| {
        ort::init()
            .with_name("kneepoint")
            .with_telemetry(false)
            .build()
    })
    .map_err(|_| {
        EngineError::Library(format!(
            "ONNX Runtime from {} panicked at start",
            canonical.display()
        ))
    })?;
    let env = built.map_err(|e| {
        EngineError::Library(format!(
            "ONNX Runtime from {} did not start: {e}",
            canonical.display()
        ))
    })?;
    if let Some(rt) = slot.as_mut() {
        rt.env = Some(env.clone());
    }
    Ok(env)
}

/// ort's message for a failed load, with the `dlerror()` text it leaves in
/// the error's source (ort prints only "dlopen failed").
fn load_error(e: &ort::LoadDynamicError) -> String {
    let mut msg = e.to_string();
    if let ort::LoadDynamicError::Dlopen { error, .. } = e {
        let mut source = std::error::Error::source(error);
        while let Some(cause) = source {
            msg.push_str(": ");
            msg.push_str(&cause.to_string());
            source = cause.source();
        }
    }
    msg
}

/// Where ONNX Runtime runs the model.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Device {
    /// ONNX Runtime's CPU execution provider.
    #[default]
    Cpu,
    /// ONNX Runtime's CUDA execution provider on GPU `device_id`.
    Cuda {
        /// The GPU ordinal.
        device_id: i32,
    },
}

/// ONNX Runtime behind the [`Framework`] callbacks.
pub struct OnnxRuntime {
    /// Explicit library; `None`: [`find_onnxruntime_library`] at `init`.
    library: Option<PathBuf>,
    device: Device,
    /// Set by `init`.
    env: Option<Environment>,
    intra_op_threads: usize,
    session: Option<Session>,
    info: Option<ModelInfo>,
    /// The input tensor's shape, batch first; `[0]` is set per batch.
    input_dims: Vec<i64>,
    /// The batch dimension if the model fixes it, `None` if symbolic.
    fixed_batch: Option<usize>,
    /// 0 until `configure_batch`.
    max_batch: usize,
    /// Whether `configure_batch` has run its warm-up batch on this session.
    warmed: bool,
    /// [`Device::Cuda`]: the IF's input pool, gathered on the GPU.
    device_input: Option<DeviceInput>,
    /// [`Device::Cuda`]: the GPU, opened at the first model load; its
    /// stream is the CUDA provider's. After `session` and `device_input`:
    /// dropped after them.
    gpu: Option<Gpu>,
}

impl fmt::Debug for OnnxRuntime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OnnxRuntime")
            .field("library", &self.library)
            .field("device", &self.device)
            .field("initialised", &self.env.is_some())
            .field("intra_op_threads", &self.intra_op_threads)
            .field("model", &self.info)
            .field("max_batch", &self.max_batch)
            .finish()
    }
}

impl Default for OnnxRuntime {
    fn default() -> Self {
        OnnxRuntime::new()
    }
}

impl OnnxRuntime {
    /// An engine that finds its library with [`find_onnxruntime_library`]
    /// when `init` is called.
    pub fn new() -> Self {
        OnnxRuntime {
            library: None,
            device: Device::Cpu,
            env: None,
            intra_op_threads: 0,
            session: None,
            info: None,
            input_dims: Vec::new(),
            fixed_batch: None,
            max_batch: 0,
            warmed: false,
            device_input: None,
            gpu: None,
        }
    }

    /// An engine that loads the ONNX Runtime library at `path`.
    pub fn with_library(path: impl Into<PathBuf>) -> Self {
        OnnxRuntime {
            library: Some(path.into()),
            ..OnnxRuntime::new()
        }
    }

    /// Runs the model on `device` (set before `init`).
    pub fn with_device(mut self, device: Device) -> Self {
        self.device = device;
        self
    }

    /// The library this engine was given, if any (`None`: found at `init`).
    pub fn library(&self) -> Option<&Path> {
        self.library.as_deref()
    }

    /// The session options every model of this engine gets.
    fn session_builder(&mut self) -> Result<SessionBuilder, EngineError> {
        let env = self
            .env
            .as_ref()
            .ok_or(EngineError::Order("load before init"))?;
        let option = |e: ort::Error<SessionBuilder>| {
            EngineError::Library(format!("session option refused: {e}"))
        };
        let builder = Session::builder(env)
            .map_err(|e| EngineError::Library(format!("cannot create a session: {e}")))?
            .with_intra_threads(self.intra_op_threads)
            .map_err(option)?
            .with_inter_threads(1)
            .map_err(option)?
            .with_parallel_execution(false)
            .map_err(option)?
            .with_optimization_level(GraphOptimizationLevel::All)
            .map_err(option)?
            .with_intra_op_spinning(false)
            .map_err(option)?
            .with_inter_op_spinning(false)
            .map_err(option)?;
        match self.device {
            // The CPU execution provider is always there, registered last.
            Device::Cpu => Ok(builder),
            Device::Cuda { device_id } => {
                self.check_device()?;
                let ordinal = usize::try_from(device_id)
                    .map_err(|_| EngineError::Library(format!("GPU {device_id}")))?;
                if self.gpu.is_none() {
                    self.gpu =
                        Some(Gpu::open(ordinal).map_err(|e| EngineError::Library(e.to_string()))?);
                }
                let stream = self
                    .gpu
                    .as_ref()
                    .map_or(std::ptr::null_mut(), |g| g.stream().cu_stream() as *mut ());
                let cuda = ort::ep::CUDA::default()
                    .with_device_id(device_id)
                    .with_tf32(false);
                // SAFETY: `stream` is the stream of `self.gpu`, which lives
                // as long as this engine holds a session (it is dropped
                // after `session`, field order and `deinit`), so ONNX
                // Runtime never computes on a destroyed stream.
                let cuda = unsafe { cuda.with_compute_stream(stream) }
                    .build()
                    .error_on_failure();
                builder.with_execution_providers([cuda]).map_err(option)
            }
        }
    }

    /// For [`Device::Cuda`]: that the loaded library has the CUDA execution
    /// provider (a CPU build has not), else what to do about it.
    fn check_device(&self) -> Result<(), EngineError> {
        use ort::ep::ExecutionProvider as _;
        if self.device == Device::Cpu {
            return Ok(());
        }
        let available = ort::ep::CUDA::is_available().map_err(|e| {
            EngineError::Library(format!(
                "cannot list ONNX Runtime's execution providers: {e}"
            ))
        })?;
        if available {
            return Ok(());
        }
        Err(EngineError::Library(format!(
            "the ONNX Runtime library {} has no CUDA execution provider (a CPU build): \
             the onnxruntime-cuda engine needs onnxruntime-gpu's library, named by {LIBRARY_ENV}",
            self.library
                .as_deref()
                .map_or_else(|| "found".to_string(), |p| p.display().to_string())
        )))
    }

    /// Takes `session` as this engine's model.
    fn attach(&mut self, session: Session, model: &str) -> Result<ModelInfo, EngineError> {
        let bad = |reason: String| EngineError::Model {
            model: model.to_string(),
            reason,
        };
        let [input] = session.inputs() else {
            return Err(bad(format!(
                "has {} inputs, kneepoint serves single-input models",
                session.inputs().len()
            )));
        };
        let Some(output) = session.outputs().first() else {
            return Err(bad("has no output".into()));
        };
        let input_dims =
            f32_dims(input.dtype()).map_err(|e| bad(format!("input {:?} {e}", input.name())))?;
        let output_dims =
            f32_dims(output.dtype()).map_err(|e| bad(format!("output {:?} {e}", output.name())))?;
        let per_item = |dims: &[i64], what: &str| -> Result<Vec<usize>, EngineError> {
            match dims.split_first() {
                Some((_, rest)) if rest.iter().all(|&d| d > 0) => Ok(rest
                    .iter()
                    .map(|&d| usize::try_from(d).unwrap_or(0))
                    .collect()),
                _ => Err(bad(format!(
                    "{what} shape {dims:?}: needs a batch dimension first and fixed sizes after it"
                ))),
            }
        };
        let info = ModelInfo {
            input_name: input.name().to_string(),
            input_shape: per_item(&input_dims, "input")?,
            output_name: output.name().to_string(),
            output_shape: per_item(&output_dims, "output")?,
        };
        self.fixed_batch = usize::try_from(input_dims[0]).ok().filter(|&b| b > 0);
        self.input_dims = input_dims;
        self.session = Some(session);
        self.info = Some(info.clone());
        Ok(info)
    }

    fn ready_for_model(&self) -> Result<(), EngineError> {
        if self.env.is_none() {
            return Err(EngineError::Order("a model is loaded before init"));
        }
        if self.session.is_some() {
            return Err(EngineError::Order(
                "a second model is loaded into one engine",
            ));
        }
        Ok(())
    }
}

/// The dimensions of an f32 tensor type (-1 where symbolic).
fn f32_dims(dtype: &ValueType) -> Result<Vec<i64>, String> {
    match dtype {
        ValueType::Tensor {
            ty: TensorElementType::Float32,
            shape,
            ..
        } => Ok(shape.to_vec()),
        other => Err(format!("is {other}, kneepoint serves f32 tensors")),
    }
}

impl Framework for OnnxRuntime {
    fn name(&self) -> &str {
        match self.device {
            Device::Cpu => "onnxruntime",
            Device::Cuda { .. } => "onnxruntime-cuda",
        }
    }

    fn init(&mut self, config: &EngineConfig) -> Result<(), EngineError> {
        if self.env.is_some() {
            return Err(EngineError::Order("init is called twice"));
        }
        if config.intra_op_threads == 0 {
            // 0 would mean "one per core" to ONNX Runtime; a share is explicit.
            return Err(EngineError::Run(
                "intra_op_threads = 0: an engine needs at least one thread".into(),
            ));
        }
        let library = match &self.library {
            Some(path) => path.clone(),
            None => find_onnxruntime_library()?,
        };
        self.env = Some(runtime(&library)?);
        self.library = Some(library);
        self.intra_op_threads = config.intra_op_threads;
        // A GPU engine on a library without the GPU fails here, at start.
        if let Err(e) = self.check_device() {
            self.env = None;
            return Err(e);
        }
        Ok(())
    }

    fn load_model(&mut self, path: &Path) -> Result<ModelInfo, EngineError> {
        self.ready_for_model()?;
        let model = path.display().to_string();
        let session = self
            .session_builder()?
            .commit_from_file(path)
            .map_err(|e| EngineError::Model {
                model: model.clone(),
                reason: e.to_string(),
            })?;
        self.attach(session, &model)
    }

    fn link_model(&mut self, model_bytes: &[u8]) -> Result<ModelInfo, EngineError> {
        self.ready_for_model()?;
        let model = format!("<{} bytes in memory>", model_bytes.len());
        // ONNX Runtime parses the bytes into its own graph: they are not
        // referenced after this returns.
        let session = self
            .session_builder()?
            .commit_from_memory(model_bytes)
            .map_err(|e| EngineError::Model {
                model: model.clone(),
                reason: e.to_string(),
            })?;
        self.attach(session, &model)
    }

    fn configure_batch(&mut self, max_batch: usize) -> Result<(), EngineError> {
        let info = self
            .info
            .as_ref()
            .ok_or(EngineError::Order("configure_batch before a model"))?;
        if max_batch == 0 {
            return Err(EngineError::Shape("max_batch = 0".into()));
        }
        if let Some(fixed) = self.fixed_batch {
            if max_batch != fixed {
                return Err(EngineError::Shape(format!(
                    "the model fixes its batch at {fixed}; max_batch must be {fixed}, not {max_batch}"
                )));
            }
        }
        let (input_elems, output_elems) = (info.input_elems(), info.output_elems());
        self.max_batch = max_batch;
        if !self.warmed {
            let warm = self.fixed_batch.unwrap_or(1);
            let input = vec![0.0f32; warm * input_elems];
            let mut output = vec![0.0f32; warm * output_elems];
            self.infer_batch(&input, warm, &mut output)?;
            self.warmed = true;
        }
        Ok(())
    }

    fn infer_batch(
        &mut self,
        input: &[f32],
        batch: usize,
        output: &mut [f32],
    ) -> Result<(), EngineError> {
        let (Some(session), Some(info)) = (self.session.as_mut(), self.info.as_ref()) else {
            return Err(EngineError::Order("infer_batch before a model"));
        };
        if self.max_batch == 0 {
            return Err(EngineError::Order("infer_batch before configure_batch"));
        }
        check_batch(info, input, batch, output, self.max_batch)?;
        if let Some(fixed) = self.fixed_batch {
            if batch != fixed {
                return Err(EngineError::Shape(format!(
                    "the model runs batches of exactly {fixed}, not {batch}"
                )));
            }
        }
        self.input_dims[0] =
            i64::try_from(batch).map_err(|_| EngineError::Shape(format!("batch {batch}")))?;
        // Borrowed: ORT reads `input` in place.
        let tensor = TensorRef::from_array_view((&self.input_dims[..], input))
            .map_err(|e| EngineError::Run(format!("input tensor: {e}")))?;
        let outputs = session
            .run(ort::inputs![tensor])
            .map_err(|e| EngineError::Run(e.to_string()))?;
        copy_output(&outputs, info, batch, output)
    }

    fn runs_on_calling_thread(&self) -> bool {
        // With one intra-op thread ORT starts no pool thread (module doc).
        self.device == Device::Cpu && self.intra_op_threads == 1
    }

    fn normalises_images(&self) -> bool {
        // The gather normalises raw RGB bytes on the GPU.
        self.device != Device::Cpu
    }

    fn attach_input_pool(&mut self, pool: PoolLocation) -> Result<(), EngineError> {
        let Device::Cuda { .. } = self.device else {
            // On the CPU the runtime's batch is read in place already.
            return Ok(());
        };
        let (Some(gpu), Some(info)) = (self.gpu.as_ref(), self.info.as_ref()) else {
            return Err(EngineError::Order("attach a pool before a model"));
        };
        if self.max_batch == 0 {
            return Err(EngineError::Order("attach a pool before configure_batch"));
        }
        self.device_input = Some(DeviceInput::new(
            gpu,
            pool,
            info.input_elems(),
            self.max_batch,
        )?);
        Ok(())
    }

    fn reads_input_pool(&self) -> bool {
        self.device_input.is_some()
    }

    fn detach_input_pool(&mut self) {
        self.device_input = None;
    }

    fn infer_slots(&mut self, slots: &[u32], output: &mut [f32]) -> Result<(), EngineError> {
        let Device::Cuda { device_id } = self.device else {
            return Err(EngineError::Run(
                "onnxruntime reads no input pool: the runtime must call infer_batch".into(),
            ));
        };
        let (Some(session), Some(info), Some(gpu), Some(input)) = (
            self.session.as_mut(),
            self.info.as_ref(),
            self.gpu.as_ref(),
            self.device_input.as_mut(),
        ) else {
            return Err(EngineError::Order("infer_slots without an attached pool"));
        };
        let batch = slots.len();
        if batch == 0 || batch > self.max_batch || output.len() != batch * info.output_elems() {
            return Err(EngineError::Shape(format!(
                "a batch of {batch} slots (at most {}) with room for {} outputs",
                self.max_batch,
                output.len()
            )));
        }
        if self.fixed_batch.is_some_and(|f| f != batch) {
            return Err(EngineError::Shape(format!(
                "the model runs batches of exactly {:?}, not {batch}",
                self.fixed_batch
            )));
        }
        let ptr = input.gather(gpu, slots)?;
        self.input_dims[0] =
            i64::try_from(batch).map_err(|_| EngineError::Shape(format!("batch {batch}")))?;
        let on_gpu = MemoryInfo::new(
            AllocationDevice::CUDA,
            device_id,
            AllocatorType::Device,
            MemoryType::Default,
        )
        .map_err(|e| EngineError::Run(format!("CUDA memory info: {e}")))?;
        // SAFETY:
        // - `ptr` is the device address of `input`'s tensor, on GPU
        //   `device_id` (the CUDA memory info says so), at least
        //   `batch × input_elems` f32 long (checked by `gather`);
        // - the tensor value is dropped at the end of this call, while
        //   `input` (borrowed from `self` for the call) still holds the
        //   buffer;
        // - the gather that fills it is enqueued on the provider's own
        //   compute stream, so ONNX Runtime reads it after it is written.
        let tensor = unsafe {
            TensorRefMut::<f32>::from_raw(
                on_gpu,
                ptr as usize as *mut std::ffi::c_void,
                Shape::new(self.input_dims.iter().copied()),
            )
        }
        .map_err(|e| EngineError::Run(format!("device input tensor: {e}")))?;
        let outputs = session
            .run(ort::inputs![tensor])
            .map_err(|e| EngineError::Run(e.to_string()))?;
        copy_output(&outputs, info, batch, output)
    }

    fn deinit(&mut self) {
        self.device_input = None;
        self.session = None;
        self.gpu = None;
        self.info = None;
        self.max_batch = 0;
        // The environment stays in the process-wide slot: ort cannot make another.
        self.env = None;
    }
}

/// The model's output of a batch of `batch` out of `outputs`, into
/// `output`.
fn copy_output(
    outputs: &SessionOutputs<'_>,
    info: &ModelInfo,
    batch: usize,
    output: &mut [f32],
) -> Result<(), EngineError> {
    let value = outputs
        .get(&info.output_name)
        .ok_or_else(|| EngineError::Run(format!("no output {:?}", info.output_name)))?;
    let (shape, data) = value
        .try_extract_tensor::<f32>()
        .map_err(|e| EngineError::Run(format!("output {:?}: {e}", info.output_name)))?;
    if data.len() != output.len() || shape.first().copied() != i64::try_from(batch).ok() {
        return Err(EngineError::Shape(format!(
            "the model returned shape {:?} for a batch of {batch}; expected [{batch}, {:?}]",
            &shape[..],
            info.output_shape
        )));
    }
    output.copy_from_slice(data);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("libml-ort-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_missing_library_is_an_error_not_a_panic() {
        let missing = scratch("missing").join("libonnxruntime.so.1.99.0");
        let mut engine = OnnxRuntime::with_library(&missing);
        let err = engine
            .init(&EngineConfig {
                intra_op_threads: 1,
            })
            .unwrap_err();
        assert!(matches!(err, EngineError::Library(_)), "{err}");
        let msg = err.to_string();
        assert!(msg.contains(&missing.display().to_string()), "{msg}");
        assert!(
            msg.contains("make setup") && msg.contains("ORT_DYLIB_PATH"),
            "{msg}"
        );
        // Nothing was loaded: the engine refuses models in order.
        assert!(matches!(
            engine.load_model(Path::new("m.onnx")),
            Err(EngineError::Order(_))
        ));
        engine.deinit();
    }

    #[test]
    fn a_file_that_is_not_a_library_is_an_error_not_a_panic() {
        let dir = scratch("garbage");
        let fake = dir.join("libonnxruntime.so.1.31.1");
        std::fs::write(&fake, b"this is not an ELF shared object").unwrap();
        let err = OnnxRuntime::with_library(&fake)
            .init(&EngineConfig {
                intra_op_threads: 1,
            })
            .unwrap_err();
        assert!(matches!(err, EngineError::Library(_)), "{err}");
        // ort's dlopen error if this process has no ONNX Runtime loaded yet,
        // else ours about one library per process: either names the file.
        assert!(
            err.to_string().contains(&fake.display().to_string()),
            "{err}"
        );
        println!("{err}");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn zero_threads_are_refused() {
        let err = OnnxRuntime::with_library("/nonexistent")
            .init(&EngineConfig {
                intra_op_threads: 0,
            })
            .unwrap_err();
        assert!(err.to_string().contains("intra_op_threads = 0"), "{err}");
    }

    #[test]
    fn env_variable_wins_and_must_name_a_file() {
        let dir = scratch("env");
        let lib = dir.join("libonnxruntime.so");
        std::fs::write(&lib, b"").unwrap();
        assert_eq!(find_library_in(Some(lib.clone().into()), &[]).unwrap(), lib);
        let err = find_library_in(Some(dir.join("nope.so").into()), std::slice::from_ref(&dir))
            .unwrap_err();
        assert!(
            err.to_string().contains("ORT_DYLIB_PATH=") && err.to_string().contains("nope.so"),
            "{err}"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn finds_the_wheel_in_a_venv_of_an_ancestor() {
        let root = scratch("venv");
        let capi = root.join(".venv/lib/python3.11/site-packages/onnxruntime/capi");
        std::fs::create_dir_all(&capi).unwrap();
        std::fs::write(capi.join("libonnxruntime_providers_shared.so"), b"").unwrap();
        std::fs::write(capi.join("libonnxruntime.so.1.31.1"), b"").unwrap();
        let deep = root.join("target/debug/deps");
        let roots: Vec<PathBuf> = deep.ancestors().map(Path::to_path_buf).collect();
        // An empty ORT_DYLIB_PATH counts as unset.
        let found = find_library_in(Some(OsString::new()), &roots).unwrap();
        assert_eq!(found, capi.join("libonnxruntime.so.1.31.1"));
        std::fs::remove_dir_all(root).unwrap();
    }

    #[test]
    fn not_found_says_where_it_looked_and_how_to_fix_it() {
        let root = scratch("nowhere");
        let roots = vec![root.clone(), root.clone()];
        let msg = find_library_in(None, &roots).unwrap_err().to_string();
        assert!(
            msg.contains(&root.join(VENV_LIBRARY).display().to_string()),
            "{msg}"
        );
        assert_eq!(
            msg.matches(VENV_LIBRARY).count(),
            1,
            "roots are listed once: {msg}"
        );
        assert!(
            msg.contains("make setup") && msg.contains("ORT_DYLIB_PATH"),
            "{msg}"
        );
        std::fs::remove_dir_all(root).unwrap();
    }

    #[test]
    fn sizes_are_checked() {
        let info = ModelInfo {
            input_name: "x".into(),
            input_shape: vec![2, 3],
            output_name: "y".into(),
            output_shape: vec![4],
        };
        assert!(check_batch(&info, &[0.0; 12], 2, &[0.0; 8], 2).is_ok());
        assert!(check_batch(&info, &[0.0; 12], 2, &[0.0; 8], 1).is_err());
        assert!(check_batch(&info, &[], 0, &[], 2).is_err());
        assert!(check_batch(&info, &[0.0; 11], 2, &[0.0; 8], 2).is_err());
        assert!(check_batch(&info, &[0.0; 12], 2, &[0.0; 9], 2).is_err());
    }
}
