//! kp-if-abi — the C ABI through which an inference function hosts an
//! inference engine written in C or C++: the header
//! `include/kneepoint_if.h` (the normative contract: GSLICE's six callbacks
//! in a `kp_framework` table, versioning, ownership) and hand-written raw
//! bindings to it, one item per C item and with the C names.
//!
//! Bindings only: the safe adapter that makes such an engine a libml
//! `Framework` (dlopen, call order, error ownership) sits above libml, in
//! `engines/c-abi` (crate `kp-engine-c`).
//! The header is the reference: see it for what
//! every field means and who owns what. The unit test `layout_matches_c`
//! compares every size, alignment, offset and constant here with what the C
//! compiler makes of the header.

#![allow(non_camel_case_types)]

use std::ffi::c_char;
use std::marker::{PhantomData, PhantomPinned};

/// `KP_IF_ABI_VERSION_MAJOR`: the host refuses an engine of another major.
pub const KP_IF_ABI_VERSION_MAJOR: u32 = 1;
/// `KP_IF_ABI_VERSION_MINOR`: backward-compatible additions within a major.
pub const KP_IF_ABI_VERSION_MINOR: u32 = 0;
/// `KP_MAX_RANK`: most dimensions of a [`kp_shape`].
pub const KP_MAX_RANK: usize = 8;

/// `kp_status`: a callback's outcome.
pub type kp_status = i32;
/// The call succeeded.
pub const KP_STATUS_OK: kp_status = 0;
/// The model could not be read, parsed or prepared.
pub const KP_STATUS_MODEL: kp_status = 1;
/// Inputs, outputs or a batch size do not fit the model.
pub const KP_STATUS_SHAPE: kp_status = 2;
/// The call came out of order.
pub const KP_STATUS_ORDER: kp_status = 3;
/// Anything else went wrong.
pub const KP_STATUS_RUN: kp_status = 4;

/// `KP_IF_ENTRY_POINT`: the symbol an engine library exports, NUL-terminated.
pub const KP_IF_ENTRY_POINT: &[u8] = b"kp_if_framework\0";

/// `kp_engine`: one engine instance, opaque (the engine's own state).
#[repr(C)]
#[derive(Debug)]
pub struct kp_engine {
    _opaque: [u8; 0],
    _not_send_sync_unpin: PhantomData<(*mut u8, PhantomPinned)>,
}

/// `kp_error`: one error message, opaque (allocated by the engine).
#[repr(C)]
#[derive(Debug)]
pub struct kp_error {
    _opaque: [u8; 0],
    _not_send_sync_unpin: PhantomData<(*mut u8, PhantomPinned)>,
}

/// `kp_engine_config`: what the engine needs before it loads anything.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct kp_engine_config {
    /// The ABI the host was built against.
    pub abi_version_major: u32,
    /// The ABI the host was built against.
    pub abi_version_minor: u32,
    /// Intra-op threads (>= 1).
    pub intra_op_threads: usize,
}

/// `kp_shape`: `dims[..rank]` are the dimensions, without the batch one.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct kp_shape {
    /// Number of dimensions used, at most [`KP_MAX_RANK`].
    pub rank: usize,
    /// The dimensions; entries at `rank..` are ignored.
    pub dims: [usize; KP_MAX_RANK],
}

/// `kp_model_info`: the tensors of a loaded model.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct kp_model_info {
    /// NUL-terminated, owned by the engine until its next call returns.
    pub input_name: *const c_char,
    /// Input shape without the batch dimension.
    pub input_shape: kp_shape,
    /// NUL-terminated, owned by the engine until its next call returns.
    pub output_name: *const c_char,
    /// Output shape without the batch dimension.
    pub output_shape: kp_shape,
}

/// `kp_framework.init`.
pub type kp_init_fn = unsafe extern "C" fn(
    config: *const kp_engine_config,
    out: *mut *mut kp_engine,
    err: *mut *mut kp_error,
) -> kp_status;
/// `kp_framework.deinit`.
pub type kp_deinit_fn = unsafe extern "C" fn(engine: *mut kp_engine);
/// `kp_framework.load_model`.
pub type kp_load_model_fn = unsafe extern "C" fn(
    engine: *mut kp_engine,
    path: *const c_char,
    out: *mut kp_model_info,
    err: *mut *mut kp_error,
) -> kp_status;
/// `kp_framework.link_model`.
pub type kp_link_model_fn = unsafe extern "C" fn(
    engine: *mut kp_engine,
    bytes: *const u8,
    len: usize,
    out: *mut kp_model_info,
    err: *mut *mut kp_error,
) -> kp_status;
/// `kp_framework.configure_batch`.
pub type kp_configure_batch_fn = unsafe extern "C" fn(
    engine: *mut kp_engine,
    max_batch: usize,
    err: *mut *mut kp_error,
) -> kp_status;
/// `kp_framework.infer_batch`.
pub type kp_infer_batch_fn = unsafe extern "C" fn(
    engine: *mut kp_engine,
    input: *const f32,
    input_len: usize,
    batch: usize,
    output: *mut f32,
    output_len: usize,
    err: *mut *mut kp_error,
) -> kp_status;
/// `kp_framework.error_message`.
pub type kp_error_message_fn = unsafe extern "C" fn(err: *const kp_error) -> *const c_char;
/// `kp_framework.error_free`.
pub type kp_error_free_fn = unsafe extern "C" fn(err: *mut kp_error);

/// `kp_framework`: an engine's callback table. Function pointers are
/// `Option`s because C may leave them NULL; the adapter refuses a table
/// with a NULL callback.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct kp_framework {
    /// The ABI the engine was built against.
    pub abi_version_major: u32,
    /// The ABI the engine was built against.
    pub abi_version_minor: u32,
    /// NUL-terminated, static in the library.
    pub name: *const c_char,
    /// Creates an engine.
    pub init: Option<kp_init_fn>,
    /// Releases an engine.
    pub deinit: Option<kp_deinit_fn>,
    /// Loads a model from a file.
    pub load_model: Option<kp_load_model_fn>,
    /// Attaches a model already in memory.
    pub link_model: Option<kp_link_model_fn>,
    /// Prepares for batches up to a size.
    pub configure_batch: Option<kp_configure_batch_fn>,
    /// Runs a batch.
    pub infer_batch: Option<kp_infer_batch_fn>,
    /// An error's message.
    pub error_message: Option<kp_error_message_fn>,
    /// Releases an error.
    pub error_free: Option<kp_error_free_fn>,
}

/// `kp_if_framework_fn`: the type of the exported entry point.
pub type kp_if_framework_fn = unsafe extern "C" fn() -> *const kp_framework;

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::ffi::CStr;
    use std::mem::{align_of, offset_of, size_of};

    use super::*;

    /// One entry of `kp_if_abi_layout_probe` in `csrc/layout_probe.c`.
    #[repr(C)]
    struct LayoutEntry {
        name: *const c_char,
        value: usize,
    }

    unsafe extern "C" {
        static kp_if_abi_layout_probe: [LayoutEntry; 0];
        static kp_if_abi_layout_probe_len: usize;
    }

    /// The C compiler's view of the header, by name.
    fn c_layout() -> BTreeMap<String, usize> {
        // SAFETY:
        // - `kp_if_abi_layout_probe_len` is a `const size_t` defined in
        //   layout_probe.c (linked by build.rs), initialised before main and
        //   never written, so reading it races with nothing.
        let len = unsafe { kp_if_abi_layout_probe_len };
        let first = (&raw const kp_if_abi_layout_probe).cast::<LayoutEntry>();
        // SAFETY:
        // - `kp_if_abi_layout_probe` is a `const` array of exactly `len`
        //   `kp_layout_entry`s, whose layout `LayoutEntry` repeats, and is
        //   never written: a shared slice over it is valid for 'static.
        let entries = unsafe { std::slice::from_raw_parts(first, len) };
        entries
            .iter()
            .map(|e| {
                // SAFETY:
                // - every `name` is a string literal in layout_probe.c:
                //   NUL-terminated, static and never written.
                let name = unsafe { CStr::from_ptr(e.name) };
                (name.to_str().expect("ASCII names").to_owned(), e.value)
            })
            .collect()
    }

    macro_rules! size {
        ($m:ident, $t:ident) => {
            $m.insert(
                concat!("sizeof ", stringify!($t)).to_owned(),
                size_of::<$t>(),
            );
            $m.insert(
                concat!("alignof ", stringify!($t)).to_owned(),
                align_of::<$t>(),
            );
        };
    }
    macro_rules! field {
        ($m:ident, $t:ident, $f:ident) => {
            $m.insert(
                concat!("offsetof ", stringify!($t), ".", stringify!($f)).to_owned(),
                offset_of!($t, $f),
            );
        };
    }
    macro_rules! constant {
        ($m:ident, $c:ident) => {
            $m.insert(
                stringify!($c).to_owned(),
                usize::try_from($c).expect("small constant"),
            );
        };
    }

    /// The Rust bindings' view of the header, named as the probe names it.
    fn rust_layout() -> BTreeMap<String, usize> {
        let mut m = BTreeMap::new();
        constant!(m, KP_IF_ABI_VERSION_MAJOR);
        constant!(m, KP_IF_ABI_VERSION_MINOR);
        constant!(m, KP_MAX_RANK);
        constant!(m, KP_STATUS_OK);
        constant!(m, KP_STATUS_MODEL);
        constant!(m, KP_STATUS_SHAPE);
        constant!(m, KP_STATUS_ORDER);
        constant!(m, KP_STATUS_RUN);
        size!(m, kp_status);

        size!(m, kp_engine_config);
        field!(m, kp_engine_config, abi_version_major);
        field!(m, kp_engine_config, abi_version_minor);
        field!(m, kp_engine_config, intra_op_threads);

        size!(m, kp_shape);
        field!(m, kp_shape, rank);
        field!(m, kp_shape, dims);

        size!(m, kp_model_info);
        field!(m, kp_model_info, input_name);
        field!(m, kp_model_info, input_shape);
        field!(m, kp_model_info, output_name);
        field!(m, kp_model_info, output_shape);

        size!(m, kp_framework);
        field!(m, kp_framework, abi_version_major);
        field!(m, kp_framework, abi_version_minor);
        field!(m, kp_framework, name);
        field!(m, kp_framework, init);
        field!(m, kp_framework, deinit);
        field!(m, kp_framework, load_model);
        field!(m, kp_framework, link_model);
        field!(m, kp_framework, configure_batch);
        field!(m, kp_framework, infer_batch);
        field!(m, kp_framework, error_message);
        field!(m, kp_framework, error_free);
        m
    }

    #[test]
    fn layout_matches_c() {
        let c = c_layout();
        let rust = rust_layout();
        assert!(c.len() > 30, "probe too small: {c:?}");
        assert_eq!(
            rust, c,
            "Rust bindings (left) differ from the C header (right)"
        );
    }

    #[test]
    fn entry_point_name_matches_the_function() {
        assert_eq!(
            CStr::from_bytes_with_nul(KP_IF_ENTRY_POINT).unwrap(),
            c"kp_if_framework"
        );
    }
}
