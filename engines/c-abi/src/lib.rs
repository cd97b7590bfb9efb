//! kp-engine-c — the safe adapter that makes an inference engine written in
//! C or C++ against the C ABI (`ffi/if-abi`, crate `kp-if-abi`) a
//! [`libml::engine::Framework`].
//!
//! # What is here
//!
//! - `ffi/if-abi/include/kneepoint_if.h`: the C header, the normative
//!   contract. An engine fills a [`sys::kp_framework`] table with GSLICE's six callbacks
//!   (`init`, `deinit`, `load_model`, `link_model`, `configure_batch`,
//!   `infer_batch`), a `name` and two error accessors (`error_message`,
//!   `error_free`), and a shared library exports it through
//!   `const kp_framework *kp_if_framework(void)`.
//! - [`sys`] (`kp-if-abi`, re-exported): hand-written `#[repr(C)]`
//!   bindings to the header, checked against the C compiler's sizes, alignments and offsets by a unit test.
//! - [`CFramework`]: the safe adapter. [`CFramework::load`] `dlopen()`s an
//!   engine library by path (and keeps it loaded as long as the adapter
//!   lives); [`CFramework::from_table`] adapts a table linked into the
//!   binary.
//! - `examples/c_engine/mean_engine.c`: a demonstration engine (window
//!   means of the input, from a `key=value` text "model") that exercises
//!   every callback and error path. It is an ABI demonstration, not a model.
//!
//! # Versioning
//!
//! Each side states the version it was built against: the engine in the
//! first two fields of its table, the host in the first two fields of
//! `kp_engine_config`. The adapter reads only those two fields of a table
//! first and refuses a major other than [`sys::KP_IF_ABI_VERSION_MAJOR`]
//! ([`OpenError::Version`]); any minor of the same major is accepted.
//!
//! # Ownership (summary of the header's rules)
//!
//! - Inputs (config, model path, model bytes, input tensor) are borrowed by
//!   the engine for one call; the output tensor is borrowed, writable, for
//!   one `infer_batch`.
//! - The engine handle is the engine's; the adapter passes it back and calls
//!   `deinit` exactly once if `init` succeeded — from [`Framework::deinit`]
//!   or, if the host never called that, from `Drop`.
//! - `kp_model_info` is host memory; its name strings are the engine's
//!   until its next call, and the adapter copies them into [`ModelInfo`]
//!   before returning.
//! - An error object the engine sets in `*err` becomes the adapter's: it
//!   copies the message into the [`EngineError`] and calls the engine's
//!   `error_free` exactly once, on every path (also when an engine sets an
//!   error on success). No allocator crosses the ABI.
//!
//! # Call order and threading
//!
//! The adapter enforces the header's call order itself (init first, one
//! successful load or link, `configure_batch` before `infer_batch`,
//! nothing after `deinit`) and answers [`EngineError::Order`] without
//! calling the engine, so an engine may rely on that order. Calls are made
//! one at a time (`&mut self`); the adapter is `Send`, so they may come from
//! different threads over its life, which the header requires engines to
//! accept.
//!
//! # Status codes
//!
//! `KP_STATUS_MODEL` becomes [`EngineError::Model`], `KP_STATUS_SHAPE`
//! [`EngineError::Shape`], `KP_STATUS_RUN` and unknown codes
//! [`EngineError::Run`]. `KP_STATUS_ORDER` becomes [`EngineError::Run`]
//! with "out of order" in the message: [`EngineError::Order`] holds only a
//! `&'static str`, and keeping the engine's message matters more than the
//! variant (the adapter's own order checks do answer `Order`).
//!
//! # Limits
//!
//! - Shapes have at most [`sys::KP_MAX_RANK`] (8) dimensions; a model with
//!   more cannot be described through this ABI.
//! - Tensors are `f32` only, one input and one output, as in the
//!   [`Framework`] trait.
//! - The adapter trusts the engine to keep the header's rules (bounds of
//!   `input`/`output`, string validity, no use of borrowed memory after a
//!   call): a C engine runs in the IF's address space, so a broken one can
//!   corrupt it. That is why the constructors are `unsafe`.
//! - A library is unloaded when its adapter is dropped; an engine must not
//!   leave threads or callbacks behind after `deinit`.
//! - Tested on Linux (ELF shared libraries, `dlopen`).

use std::ffi::{c_char, CStr, CString};
use std::fmt;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::ptr;

use libloading::Library;
use libml::engine::{EngineConfig, EngineError, Framework, ModelInfo};
use thiserror::Error;

pub use kp_if_abi as sys;

use sys::{kp_engine, kp_error, kp_framework, kp_model_info, kp_shape, kp_status};

/// Why an engine's table could not be adapted.
#[derive(Debug, Error)]
pub enum OpenError {
    /// `dlopen()` failed.
    #[error("cannot load engine library {path}: {reason}")]
    Dlopen {
        /// The library's path.
        path: String,
        /// The loader's message.
        reason: String,
    },
    /// The library does not export `kp_if_framework`.
    #[error("engine library {path} does not export kp_if_framework: {reason}")]
    EntryPoint {
        /// The library's path.
        path: String,
        /// The loader's message.
        reason: String,
    },
    /// `kp_if_framework()` returned NULL.
    #[error("kp_if_framework() returned no table")]
    NullTable,
    /// The engine was built against another major version of the ABI.
    #[error("engine speaks kneepoint IF ABI {engine_major}.{engine_minor}, this host speaks {host_major}.x")]
    Version {
        /// The engine's major version.
        engine_major: u32,
        /// The engine's minor version.
        engine_minor: u32,
        /// The host's major version.
        host_major: u32,
    },
    /// A required table entry is NULL.
    #[error("engine table has no {0}")]
    Missing(&'static str),
}

impl From<OpenError> for EngineError {
    fn from(e: OpenError) -> Self {
        EngineError::Library(e.to_string())
    }
}

/// The table's callbacks, checked non-NULL.
#[derive(Clone, Copy, Debug)]
struct Callbacks {
    init: sys::kp_init_fn,
    deinit: sys::kp_deinit_fn,
    load_model: sys::kp_load_model_fn,
    link_model: sys::kp_link_model_fn,
    configure_batch: sys::kp_configure_batch_fn,
    infer_batch: sys::kp_infer_batch_fn,
    error_message: sys::kp_error_message_fn,
    error_free: sys::kp_error_free_fn,
}

impl Callbacks {
    fn from_table(table: &kp_framework) -> Result<Self, OpenError> {
        Ok(Self {
            init: table.init.ok_or(OpenError::Missing("init"))?,
            deinit: table.deinit.ok_or(OpenError::Missing("deinit"))?,
            load_model: table.load_model.ok_or(OpenError::Missing("load_model"))?,
            link_model: table.link_model.ok_or(OpenError::Missing("link_model"))?,
            configure_batch: table
                .configure_batch
                .ok_or(OpenError::Missing("configure_batch"))?,
            infer_batch: table.infer_batch.ok_or(OpenError::Missing("infer_batch"))?,
            error_message: table
                .error_message
                .ok_or(OpenError::Missing("error_message"))?,
            error_free: table.error_free.ok_or(OpenError::Missing("error_free"))?,
        })
    }
}

/// Where the adapter is in the header's call order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    /// No engine yet (also after a failed `init`).
    Created,
    /// `init` succeeded; no model.
    Initialised,
    /// A model is loaded or linked.
    Loaded,
    /// `configure_batch` succeeded at least once.
    Configured,
    /// `deinit` done (or never needed); nothing more may be called.
    Released,
}

/// A C engine (a [`sys::kp_framework`] table) as a [`Framework`].
///
/// See the crate docs for the ownership and ordering rules it keeps.
pub struct CFramework {
    name: String,
    abi_version: (u32, u32),
    callbacks: Callbacks,
    /// The engine's handle; meaningful in `Initialised..=Configured`.
    engine: *mut kp_engine,
    stage: Stage,
    /// What the loaded (or being loaded) model is, for error messages.
    model: String,
    /// Keeps the engine's code loaded; dropped after `Drop::drop` has called
    /// `deinit`, and after every other field.
    library: Option<Library>,
}

impl fmt::Debug for CFramework {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CFramework")
            .field("name", &self.name)
            .field("abi_version", &self.abi_version)
            .field("stage", &self.stage)
            .field("model", &self.model)
            .field("library", &self.library)
            .finish_non_exhaustive()
    }
}

// SAFETY:
// - The header requires an engine to accept calls on one instance from
//   different threads as long as they are not concurrent; `&mut self` on
//   every call makes them one at a time, and `Send` without `Sync` never
//   shares the adapter between threads.
// - The remaining fields are a `String`, plain function pointers to code that
//   stays loaded as long as `library`, and a `libloading::Library`, which is
//   itself `Send`.
unsafe impl Send for CFramework {}

impl CFramework {
    /// `dlopen()`s the engine library at `path`, calls its
    /// `kp_if_framework()` and adapts the table. The library stays loaded
    /// until the adapter is dropped. A `path` without a `/` is looked up as
    /// `dlopen()` does (`LD_LIBRARY_PATH`, the cache, ...); pass a path.
    ///
    /// # Safety
    ///
    /// - Loading a library runs its initialisers: it must be safe to load
    ///   into this process.
    /// - The library must implement `kneepoint_if.h` as documented there: its
    ///   `kp_if_framework` has the declared type and returns a table of the
    ///   version it states, and every callback keeps the header's rules
    ///   (bounds, ownership, string validity). The adapter's safety rests
    ///   on them.
    pub unsafe fn load(path: impl AsRef<Path>) -> Result<Self, OpenError> {
        let path = path.as_ref();
        // SAFETY:
        // - running the library's initialisers is the caller's promise
        //   (this function's contract).
        let library = unsafe { Library::new(path) }.map_err(|e| OpenError::Dlopen {
            path: path.display().to_string(),
            reason: e.to_string(),
        })?;
        // SAFETY:
        // - the header declares `kp_if_framework` as `kp_if_framework_fn`,
        //   and the caller promises the library follows the header.
        let entry = unsafe { library.get::<sys::kp_if_framework_fn>(sys::KP_IF_ENTRY_POINT) }
            .map_err(|e| OpenError::EntryPoint {
                path: path.display().to_string(),
                reason: e.to_string(),
            })?;
        // SAFETY:
        // - `entry` has the header's type, takes no arguments and may be
        //   called any number of times from any thread (header rules,
        //   promised by the caller); `library` keeps its code loaded.
        let table = unsafe { entry() };
        // SAFETY:
        // - `table` comes from the entry point, which returns NULL or a
        //   table that stays valid while `library` is loaded, and `library`
        //   is moved into the adapter, which copies what it keeps.
        unsafe { Self::from_raw(table, Some(library)) }
    }

    /// Adapts a table linked into this binary (e.g. a C engine compiled
    /// into the host).
    ///
    /// # Safety
    ///
    /// - Every callback must keep the rules of `kneepoint_if.h` (bounds,
    ///   ownership, string validity): the adapter's safety rests on them.
    /// - The callbacks' code must stay valid as long as the adapter lives,
    ///   and `table.name` must be NULL or a NUL-terminated string valid for
    ///   this call.
    pub unsafe fn from_table(table: &kp_framework) -> Result<Self, OpenError> {
        // SAFETY:
        // - a reference is a valid, aligned, whole table; the rest is this
        //   function's contract, passed on.
        unsafe { Self::from_raw(table, None) }
    }

    /// # Safety
    ///
    /// - `table` is NULL or points to at least the two version fields of a
    ///   table, and to a whole `kp_framework` if its major is ours; that
    ///   table is valid for this call.
    /// - The callbacks keep the header's rules and their code stays loaded
    ///   as long as the adapter (through `library` or otherwise).
    unsafe fn from_raw(
        table: *const kp_framework,
        library: Option<Library>,
    ) -> Result<Self, OpenError> {
        if table.is_null() {
            return Err(OpenError::NullTable);
        }
        // Only the two version fields, which every major keeps in place: a
        // table of another major may be shorter than ours.
        // SAFETY:
        // - `table` is non-NULL and points to at least the version fields
        //   (contract); the place expression reads that field alone.
        let engine_major = unsafe { (*table).abi_version_major };
        // SAFETY:
        // - as above, for the second version field.
        let engine_minor = unsafe { (*table).abi_version_minor };
        if engine_major != sys::KP_IF_ABI_VERSION_MAJOR {
            return Err(OpenError::Version {
                engine_major,
                engine_minor,
                host_major: sys::KP_IF_ABI_VERSION_MAJOR,
            });
        }
        // SAFETY:
        // - the major is ours, so `table` points to a whole, valid, aligned
        //   `kp_framework` (contract); it is plain data and copied.
        let table = unsafe { ptr::read(table) };
        let callbacks = Callbacks::from_table(&table)?;
        if table.name.is_null() {
            return Err(OpenError::Missing("name"));
        }
        // SAFETY:
        // - a non-NULL `name` is a NUL-terminated string that stays valid
        //   while the library is loaded (header), here for this call; it is
        //   copied at once.
        let name = unsafe { CStr::from_ptr(table.name) }
            .to_string_lossy()
            .into_owned();
        Ok(Self {
            name,
            abi_version: (engine_major, engine_minor),
            callbacks,
            engine: ptr::null_mut(),
            stage: Stage::Created,
            model: String::new(),
            library,
        })
    }

    /// The ABI version `(major, minor)` the engine states it was built
    /// against.
    pub fn abi_version(&self) -> (u32, u32) {
        self.abi_version
    }

    /// Whether an engine instance is alive (between a successful `init` and
    /// `deinit`).
    fn has_engine(&self) -> bool {
        matches!(
            self.stage,
            Stage::Initialised | Stage::Loaded | Stage::Configured
        )
    }

    /// Takes ownership of the error object a callback returned (if any),
    /// copies its message and frees it, then maps `status` to a result.
    fn outcome(
        &self,
        callback: &str,
        status: kp_status,
        err: *mut kp_error,
    ) -> Result<(), EngineError> {
        // Freed when this function returns, on every path.
        let err = OwnedError {
            ptr: err,
            callbacks: &self.callbacks,
        };
        if status == sys::KP_STATUS_OK {
            return Ok(());
        }
        let message = format!("{} {callback}: {}", self.name, err.message());
        Err(match status {
            sys::KP_STATUS_MODEL => EngineError::Model {
                model: self.model.clone(),
                reason: message,
            },
            sys::KP_STATUS_SHAPE => EngineError::Shape(message),
            sys::KP_STATUS_ORDER => EngineError::Run(format!("{message} (out of order)")),
            sys::KP_STATUS_RUN => EngineError::Run(message),
            other => EngineError::Run(format!("{message} (unknown status {other})")),
        })
    }

    /// Shared by `load_model` and `link_model`: calls `load` with a zeroed
    /// `kp_model_info` and copies the result out.
    fn load_with(
        &mut self,
        callback: &str,
        model: String,
        load: impl FnOnce(*mut kp_engine, *mut kp_model_info, *mut *mut kp_error) -> kp_status,
    ) -> Result<ModelInfo, EngineError> {
        match self.stage {
            Stage::Initialised => {}
            Stage::Created => return Err(EngineError::Order("model loaded before init")),
            Stage::Loaded | Stage::Configured => {
                return Err(EngineError::Order("a model is already loaded"))
            }
            Stage::Released => return Err(EngineError::Order("engine used after deinit")),
        }
        self.model = model;
        let mut info = kp_model_info {
            input_name: ptr::null(),
            input_shape: kp_shape::default(),
            output_name: ptr::null(),
            output_shape: kp_shape::default(),
        };
        let mut err: *mut kp_error = ptr::null_mut();
        let status = load(self.engine, &mut info, &mut err);
        self.outcome(callback, status, err)?;
        // SAFETY:
        // - the call succeeded and the engine has not been called since, so
        //   the names in `info` are NULL or valid NUL-terminated strings
        //   (header: valid until the engine's next call); they are copied.
        let converted = unsafe { model_info_from_c(&info) };
        let info = converted.map_err(|reason| EngineError::Model {
            model: self.model.clone(),
            reason: format!(
                "{} {callback}: engine described the model wrongly: {reason}",
                self.name
            ),
        })?;
        self.stage = Stage::Loaded;
        Ok(info)
    }
}

/// An error object the engine handed over; frees it with the engine's
/// `error_free` on drop.
struct OwnedError<'a> {
    ptr: *mut kp_error,
    callbacks: &'a Callbacks,
}

impl OwnedError<'_> {
    /// The message, copied; a placeholder if the engine gave none.
    fn message(&self) -> String {
        if self.ptr.is_null() {
            return "(no message)".to_owned();
        }
        // SAFETY:
        // - `ptr` is a live error object from this engine (not yet freed:
        //   only `drop` frees it); `error_message` may be called on it from
        //   any thread (header).
        let text = unsafe { (self.callbacks.error_message)(self.ptr) };
        if text.is_null() {
            return "(no message)".to_owned();
        }
        // SAFETY:
        // - a non-NULL message is NUL-terminated and valid until `error_free`
        //   (header), which runs only in `drop`, after this copy.
        unsafe { CStr::from_ptr(text) }
            .to_string_lossy()
            .into_owned()
    }
}

impl Drop for OwnedError<'_> {
    fn drop(&mut self) {
        if !self.ptr.is_null() {
            // SAFETY:
            // - `ptr` is an error object this engine allocated and handed
            //   over (header: ownership passes to the host), freed exactly
            //   once here and not used afterwards.
            unsafe { (self.callbacks.error_free)(self.ptr) };
        }
    }
}

/// Copies a `kp_shape`, checking its rank.
fn shape_from_c(shape: &kp_shape) -> Result<Vec<usize>, String> {
    shape
        .dims
        .get(..shape.rank)
        .map(<[usize]>::to_vec)
        .ok_or_else(|| format!("rank {} exceeds {}", shape.rank, sys::KP_MAX_RANK))
}

/// Copies a name out of a `kp_model_info`.
///
/// # Safety
///
/// - `name` is NULL or a NUL-terminated string valid for this call.
unsafe fn name_from_c(name: *const c_char, what: &str) -> Result<String, String> {
    if name.is_null() {
        return Err(format!("no {what}"));
    }
    // SAFETY:
    // - non-NULL, NUL-terminated and valid for this call (contract).
    Ok(unsafe { CStr::from_ptr(name) }
        .to_string_lossy()
        .into_owned())
}

/// Copies a `kp_model_info` into a [`ModelInfo`].
///
/// # Safety
///
/// - Both names are NULL or NUL-terminated strings valid for this call.
unsafe fn model_info_from_c(info: &kp_model_info) -> Result<ModelInfo, String> {
    Ok(ModelInfo {
        // SAFETY:
        // - the names are NULL or valid strings (contract).
        input_name: unsafe { name_from_c(info.input_name, "input name") }?,
        input_shape: shape_from_c(&info.input_shape).map_err(|e| format!("input shape: {e}"))?,
        // SAFETY:
        // - as above.
        output_name: unsafe { name_from_c(info.output_name, "output name") }?,
        output_shape: shape_from_c(&info.output_shape).map_err(|e| format!("output shape: {e}"))?,
    })
}

impl Framework for CFramework {
    fn name(&self) -> &str {
        &self.name
    }

    fn init(&mut self, config: &EngineConfig) -> Result<(), EngineError> {
        match self.stage {
            Stage::Created => {}
            Stage::Released => return Err(EngineError::Order("engine used after deinit")),
            _ => return Err(EngineError::Order("init called twice")),
        }
        let config = sys::kp_engine_config {
            abi_version_major: sys::KP_IF_ABI_VERSION_MAJOR,
            abi_version_minor: sys::KP_IF_ABI_VERSION_MINOR,
            intra_op_threads: config.intra_op_threads,
        };
        let mut engine: *mut kp_engine = ptr::null_mut();
        let mut err: *mut kp_error = ptr::null_mut();
        // SAFETY:
        // - `config`, `engine` and `err` are valid for the call and only
        //   borrowed by it (header); `err` starts NULL as required.
        // - no engine exists yet, so nothing else is running on it.
        let status = unsafe { (self.callbacks.init)(&config, &mut engine, &mut err) };
        self.outcome("init", status, err)?;
        self.engine = engine;
        self.stage = Stage::Initialised;
        Ok(())
    }

    fn load_model(&mut self, path: &Path) -> Result<ModelInfo, EngineError> {
        let c_path = CString::new(path.as_os_str().as_bytes()).map_err(|_| EngineError::Model {
            model: path.display().to_string(),
            reason: "the path contains a NUL byte".to_owned(),
        })?;
        let load_model = self.callbacks.load_model;
        self.load_with(
            "load_model",
            path.display().to_string(),
            |engine, info, err| {
                // SAFETY:
                // - `engine` is live (`load_with` checked the stage) and called
                //   by nothing else (`&mut self`).
                // - `c_path` is NUL-terminated and outlives the call; `info` and
                //   `err` are valid for the call, `err` starts NULL.
                unsafe { load_model(engine, c_path.as_ptr(), info, err) }
            },
        )
    }

    fn link_model(&mut self, model_bytes: &[u8]) -> Result<ModelInfo, EngineError> {
        let link_model = self.callbacks.link_model;
        let model = format!("{} bytes in memory", model_bytes.len());
        self.load_with("link_model", model, |engine, info, err| {
            // SAFETY:
            // - `engine` is live (`load_with` checked the stage) and called
            //   by nothing else (`&mut self`).
            // - `model_bytes` is `len` readable bytes, borrowed for the call
            //   only (header); `info` and `err` are valid, `err` starts NULL.
            unsafe { link_model(engine, model_bytes.as_ptr(), model_bytes.len(), info, err) }
        })
    }

    fn configure_batch(&mut self, max_batch: usize) -> Result<(), EngineError> {
        match self.stage {
            Stage::Loaded | Stage::Configured => {}
            Stage::Created | Stage::Initialised => {
                return Err(EngineError::Order(
                    "configure_batch before load_model or link_model",
                ))
            }
            Stage::Released => return Err(EngineError::Order("engine used after deinit")),
        }
        let mut err: *mut kp_error = ptr::null_mut();
        // SAFETY:
        // - `self.engine` is live (stage checked) and called by nothing else
        //   (`&mut self`); `err` is valid for the call and starts NULL.
        let status = unsafe { (self.callbacks.configure_batch)(self.engine, max_batch, &mut err) };
        self.outcome("configure_batch", status, err)?;
        self.stage = Stage::Configured;
        Ok(())
    }

    fn infer_batch(
        &mut self,
        input: &[f32],
        batch: usize,
        output: &mut [f32],
    ) -> Result<(), EngineError> {
        match self.stage {
            Stage::Configured => {}
            Stage::Created | Stage::Initialised => {
                return Err(EngineError::Order(
                    "infer_batch before load_model or link_model",
                ))
            }
            Stage::Loaded => return Err(EngineError::Order("infer_batch before configure_batch")),
            Stage::Released => return Err(EngineError::Order("engine used after deinit")),
        }
        let mut err: *mut kp_error = ptr::null_mut();
        // SAFETY:
        // - `self.engine` is live (stage checked) and called by nothing else
        //   (`&mut self`).
        // - `input` is `input.len()` readable floats and `output`
        //   `output.len()` writable ones, both borrowed for the call only;
        //   the engine reads and writes within those lengths (header).
        // - `err` is valid for the call and starts NULL.
        let status = unsafe {
            (self.callbacks.infer_batch)(
                self.engine,
                input.as_ptr(),
                input.len(),
                batch,
                output.as_mut_ptr(),
                output.len(),
                &mut err,
            )
        };
        self.outcome("infer_batch", status, err)
    }

    fn deinit(&mut self) {
        if self.has_engine() {
            // SAFETY:
            // - `self.engine` came from a successful `init` and has not been
            //   released (stage); it is released exactly once, here, and the
            //   stage change below stops every later use.
            unsafe { (self.callbacks.deinit)(self.engine) };
            self.engine = ptr::null_mut();
        }
        self.stage = Stage::Released;
    }
}

impl Drop for CFramework {
    /// Releases the engine if the host did not (`deinit` is idempotent);
    /// the library is unloaded afterwards, when the fields drop.
    fn drop(&mut self) {
        self.deinit();
    }
}

#[cfg(test)]
mod tests;
