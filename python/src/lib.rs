//! kneepoint-python — the native half of kneepoint's Python package:
//! `kneepoint._native`, a PyO3 extension module over the Rust client
//! library (kneepoint-client) and its image preprocessing. The Python half,
//! kneepoint/`__init__.py`, reads the model repository, turns numpy arrays,
//! PIL images and paths into model inputs, and maps results to Python
//! types; everything on the wire (fragmenting, request ids, matching,
//! timeouts, the receiver thread) and every pixel of preprocessing is this
//! crate's, i.e. the Rust library's own code, so a Rust and a Python client
//! behave alike and preprocess alike by construction.
//!
//! # The GIL
//!
//! Every call that blocks (`infer`, `wait`, `poll`) or computes
//! (`preprocess_rgb`, `load_image`, and `submit`, which fragments and sends)
//! releases the GIL ([`Python::detach`]) while it does, so any number of
//! Python threads can have requests outstanding on one `Client` (it is
//! `Send + Sync`, one socket, one receiver thread) while other Python code
//! runs. An input that is a `bytes` object is sent from its own memory
//! (bytes are immutable). Any other buffer (a numpy array, a bytearray, a
//! memoryview) is copied once into Rust memory, with the GIL held, before it
//! is released: another Python thread could write to a mutable buffer while
//! the request is being fragmented, which would be a data race on memory
//! Rust reads as `&[u8]`. That copy is a memcpy (150 KB for a 224x224x3
//! input: a few µs).
//!
//! # Errors
//!
//! Every [`ClientError`] becomes an instance of the Python class of the
//! same name in `kneepoint._errors` (`UnknownIf` → `UnknownIfError`, …),
//! with its fields (`if_id`, `expected`, `got`, …) as attributes; the
//! classes are Python's so that they can also derive from the builtin ones
//! (`TimeoutError`, `ConnectionError`, `ValueError`). Nothing here panics
//! on bad input: sizes are checked and reported as exceptions.
//!
//! # Why outside the workspace
//!
//! This crate has its own (empty) `[workspace]` and its own Cargo.lock;
//! the repository's workspace excludes `python/`. As a member it would
//! (1) turn on kneepoint-client's `image` feature for the whole workspace
//! (Cargo unifies features across the members built together), so `make
//! build` would compile the image decoders into kp-client and the separate
//! `-p kneepoint-client --features image` test pass would test nothing
//! new; (2) put pyo3 into every `cargo clippy --workspace` and
//! `cargo test --workspace`, whose builds would then depend on what Python
//! the machine has; (3) need `PYO3_BUILD_EXTENSION_MODULE` semantics for a
//! cdylib that cannot link a test binary. Outside, the workspace builds as
//! before, and this crate is built only by `make python` (maturin, which
//! names the venv's interpreter) and linted by `make lint` with
//! `--manifest-path python/Cargo.toml`. The cost: a second lock file, kept
//! to the workspace's versions of the shared dependencies (it started as a
//! copy of the workspace's), and the workspace lints copied into
//! Cargo.toml.

#![deny(unsafe_code)]

use std::time::Duration;

use kneepoint_client::image as kimage;
use kneepoint_client::{Answer, Client, ClientError, Config, RequestId, Stats};
use pyo3::buffer::PyBuffer;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyDict, PyModule};

/// `kneepoint._errors`, looked up once.
static ERRORS: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

/// The Python exception class `name` of `kneepoint._errors`, made with
/// `message` and the keyword arguments `fields` (set as attributes).
fn py_error(py: Python<'_>, name: &str, message: String, fields: &[(&str, usize)]) -> PyErr {
    let made = (|| -> PyResult<PyErr> {
        let module = ERRORS
            .get_or_try_init(py, || py.import("kneepoint._errors").map(Bound::unbind))?
            .bind(py);
        let kwargs = PyDict::new(py);
        for (k, v) in fields {
            kwargs.set_item(k, v)?;
        }
        let exc = module.getattr(name)?.call((message,), Some(&kwargs))?;
        Ok(PyErr::from_value(exc))
    })();
    // The module is part of the package: failing to make the exception
    // means a broken install; raise that error instead.
    made.unwrap_or_else(|e| e)
}

/// The Python exception for a client error.
fn client_error(py: Python<'_>, e: &ClientError) -> PyErr {
    let msg = e.to_string();
    let if_id = |id: &u16| ("if_id", usize::from(*id));
    match e {
        ClientError::UnknownIf { if_id: id } => py_error(py, "UnknownIfError", msg, &[if_id(id)]),
        ClientError::BadRequest { if_id: id } => py_error(py, "BadRequestError", msg, &[if_id(id)]),
        ClientError::Incomplete => py_error(py, "IncompleteError", msg, &[]),
        ClientError::Overloaded => py_error(py, "OverloadedError", msg, &[]),
        ClientError::Internal => py_error(py, "InternalError", msg, &[]),
        ClientError::Timeout(_) => py_error(py, "TimeoutError", msg, &[]),
        ClientError::Unreachable => py_error(py, "UnreachableError", msg, &[]),
        ClientError::WrongSize {
            if_id: id,
            expected,
            got,
        } => py_error(
            py,
            "WrongSizeError",
            msg,
            &[if_id(id), ("expected", *expected), ("got", *got)],
        ),
        ClientError::EmptyInput => py_error(py, "EmptyInputError", msg, &[]),
        ClientError::InputTooLarge { len, payload } => py_error(
            py,
            "InputTooLargeError",
            msg,
            &[("len", *len), ("payload", *payload)],
        ),
        ClientError::UnknownRequest(RequestId(id)) => py_error(
            py,
            "UnknownRequestError",
            msg,
            &[("request_id", *id as usize)],
        ),
        ClientError::Config(_) => py_error(py, "ConfigError", msg, &[]),
        ClientError::Io(_) => py_error(py, "SocketError", msg, &[]),
        // ClientError is non_exhaustive: a variant added later is still a
        // KneepointError.
        _ => py_error(py, "KneepointError", msg, &[]),
    }
}

/// An answer as the Python layer takes it:
/// `(request_id, if_id, [(class, score), ...], batch_size,
/// platform_latency_us, rtt_seconds)`.
type PyAnswer = (u64, u16, Vec<(u32, f32)>, u16, u32, f64);

fn py_answer(a: Answer) -> PyAnswer {
    (
        a.request_id.0,
        a.if_id,
        a.top_k.iter().map(|c| (c.class, c.score)).collect(),
        a.batch_size,
        a.platform_latency_us,
        a.rtt.as_secs_f64(),
    )
}

/// An input's bytes: borrowed from an immutable `bytes` object, else a copy
/// of the buffer's (see the crate docs on the GIL).
enum Input<'py> {
    Bytes(Bound<'py, PyBytes>),
    Copied(Vec<u8>),
}

impl Input<'_> {
    fn get<'py>(obj: &Bound<'py, PyAny>) -> PyResult<Input<'py>> {
        if let Ok(bytes) = obj.cast::<PyBytes>() {
            return Ok(Input::Bytes(bytes.clone()));
        }
        let buf = PyBuffer::<u8>::get(obj).map_err(|_| {
            PyTypeError::new_err(format!(
                "input must be bytes or a buffer of unsigned bytes (numpy uint8, bytearray, \
                 memoryview), not {}",
                obj.get_type()
                    .name()
                    .map_or_else(|_| "?".into(), |n| n.to_string())
            ))
        })?;
        Ok(Input::Copied(buf.to_vec(obj.py())?))
    }

    fn as_slice(&self) -> &[u8] {
        match self {
            Input::Bytes(b) => b.as_bytes(),
            Input::Copied(v) => v,
        }
    }
}

/// A seconds value as a positive `Duration`.
fn seconds(what: &str, s: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(s)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| PyValueError::new_err(format!("{what} must be > 0 seconds, got {s}")))
}

/// A connection to a kneepoint platform: `kneepoint_client::Client`.
#[pyclass(frozen, module = "kneepoint._native")]
#[derive(Debug)]
struct NativeClient {
    inner: Client,
}

#[pymethods]
impl NativeClient {
    /// Binds a UDP socket, connects it to `addr` and starts the receiver
    /// thread. `input_lens` maps if_id to its input size in bytes (other
    /// sizes are refused locally with WrongSizeError); `retries`: how many
    /// times `infer` tries again, as a new request, after a retryable error.
    #[new]
    #[pyo3(signature = (addr, timeout, fragment_payload, input_lens, retries))]
    fn new(
        py: Python<'_>,
        addr: &str,
        timeout: f64,
        fragment_payload: usize,
        input_lens: Vec<(u16, usize)>,
        retries: u32,
    ) -> PyResult<Self> {
        let mut cfg = Config::builder(addr)
            .timeout(seconds("timeout", timeout)?)
            .fragment_payload(fragment_payload)
            .retries(retries);
        for (if_id, len) in input_lens {
            cfg = cfg.input_len(if_id, len);
        }
        let inner = cfg.connect().map_err(|e| client_error(py, &e))?;
        Ok(NativeClient { inner })
    }

    /// Sends `data` to `if_id` and waits for the answer (GIL released).
    fn infer(&self, py: Python<'_>, if_id: u16, data: &Bound<'_, PyAny>) -> PyResult<PyAnswer> {
        let input = Input::get(data)?;
        let slice = input.as_slice();
        py.detach(|| self.inner.infer(if_id, slice))
            .map(py_answer)
            .map_err(|e| client_error(py, &e))
    }

    /// Sends `data` to `if_id`, returns its request id at once.
    fn submit(&self, py: Python<'_>, if_id: u16, data: &Bound<'_, PyAny>) -> PyResult<u64> {
        let input = Input::get(data)?;
        let slice = input.as_slice();
        py.detach(|| self.inner.submit(if_id, slice))
            .map(|id| id.0)
            .map_err(|e| client_error(py, &e))
    }

    /// Waits for request `request_id`'s result (GIL released).
    fn wait(&self, py: Python<'_>, request_id: u64) -> PyResult<PyAnswer> {
        py.detach(|| self.inner.wait(RequestId(request_id)))
            .map(py_answer)
            .map_err(|e| client_error(py, &e))
    }

    /// Waits up to `timeout` seconds for submitted requests to end; returns
    /// `[(request_id, answer tuple or exception instance)]`.
    fn poll(&self, py: Python<'_>, timeout: f64) -> PyResult<Vec<(u64, Py<PyAny>)>> {
        let timeout = Duration::try_from_secs_f64(timeout).map_err(|_| {
            PyValueError::new_err(format!("timeout must be >= 0 seconds, got {timeout}"))
        })?;
        let ended = py.detach(|| self.inner.poll(timeout));
        ended
            .into_iter()
            .map(|(id, result)| {
                let value = match result {
                    Ok(a) => py_answer(a).into_pyobject(py)?.into_any().unbind(),
                    Err(e) => client_error(py, &e).into_value(py).into_any(),
                };
                Ok((id.0, value))
            })
            .collect()
    }

    /// Requests sent and not ended.
    fn outstanding(&self) -> usize {
        self.inner.outstanding()
    }

    /// The client's counters, as a dict.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let Stats {
            submitted,
            answered,
            timed_out,
            unreachable,
            duplicates,
            late,
            unexpected,
            malformed,
            ..
        } = self.inner.stats();
        let d = PyDict::new(py);
        for (k, v) in [
            ("submitted", submitted),
            ("answered", answered),
            ("timed_out", timed_out),
            ("unreachable", unreachable),
            ("duplicates", duplicates),
            ("late", late),
            ("unexpected", unexpected),
            ("malformed", malformed),
        ] {
            d.set_item(k, v)?;
        }
        Ok(d)
    }

    /// The socket's local `host:port`.
    fn local_addr(&self, py: Python<'_>) -> PyResult<String> {
        self.inner
            .local_addr()
            .map(|a| a.to_string())
            .map_err(|e| client_error(py, &e))
    }
}

fn check_dims(what: &str, height: u32, width: u32) -> PyResult<()> {
    if height == 0 || width == 0 {
        return Err(PyValueError::new_err(format!(
            "{what} must be at least 1x1, got {height}x{width} (height x width)"
        )));
    }
    Ok(())
}

/// An `height`x`width` RGB u8 image (`rgb`: row-major HxWx3 bytes, any
/// buffer) preprocessed to an `out_height`x`out_width` model input: the
/// Rust crate's `image::preprocess_rgb` (resize the shorter side, centre
/// crop: bit for bit the model repository's preprocessing).
#[pyfunction]
fn preprocess_rgb<'py>(
    py: Python<'py>,
    rgb: &Bound<'py, PyAny>,
    height: u32,
    width: u32,
    out_height: u32,
    out_width: u32,
) -> PyResult<Bound<'py, PyBytes>> {
    check_dims("the image", height, width)?;
    check_dims("the output", out_height, out_width)?;
    let data = match Input::get(rgb)? {
        Input::Bytes(b) => b.as_bytes().to_vec(),
        Input::Copied(v) => v,
    };
    // The crate checks the length (a typed error, raised as ValueError).
    let out = py.detach(|| kimage::preprocess_rgb(&data, width, height, out_height, out_width));
    match out {
        Ok(v) => Ok(PyBytes::new(py, &v)),
        Err(e) => Err(PyValueError::new_err(e.to_string())),
    }
}

/// Reads a PNG or JPEG file and preprocesses it to `height`x`width`
/// (the Rust crate's `image::from_path`).
#[pyfunction]
fn load_image<'py>(
    py: Python<'py>,
    path: std::path::PathBuf,
    height: u32,
    width: u32,
) -> PyResult<Bound<'py, PyBytes>> {
    check_dims("the output", height, width)?;
    let out = py.detach(|| kimage::from_path(&path, height, width));
    match out {
        Ok(v) => Ok(PyBytes::new(py, &v)),
        Err(e) => Err(py_error(
            py,
            "ImageError",
            format!("{}: {e}", path.display()),
            &[],
        )),
    }
}

/// Decodes a PNG or JPEG from memory and preprocesses it to
/// `height`x`width` (the Rust crate's `image::from_bytes`).
#[pyfunction]
fn decode_image<'py>(
    py: Python<'py>,
    data: &Bound<'py, PyAny>,
    height: u32,
    width: u32,
) -> PyResult<Bound<'py, PyBytes>> {
    check_dims("the output", height, width)?;
    let input = Input::get(data)?;
    let slice = input.as_slice();
    let out = py.detach(|| kimage::from_bytes(slice, height, width));
    match out {
        Ok(v) => Ok(PyBytes::new(py, &v)),
        Err(e) => Err(py_error(py, "ImageError", e.to_string(), &[])),
    }
}

/// The shorter side an image is resized to before a centre crop of
/// `height`x`width`.
#[pyfunction]
fn resize_short_side(height: u32, width: u32) -> u32 {
    kimage::resize_short_side(height, width)
}

/// The native module: `NativeClient` and the image functions.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<NativeClient>()?;
    m.add_function(wrap_pyfunction!(preprocess_rgb, m)?)?;
    m.add_function(wrap_pyfunction!(load_image, m)?)?;
    m.add_function(wrap_pyfunction!(decode_image, m)?)?;
    m.add_function(wrap_pyfunction!(resize_short_side, m)?)?;
    m.add(
        "DEFAULT_FRAGMENT_PAYLOAD",
        kneepoint_client::DEFAULT_FRAGMENT_PAYLOAD,
    )?;
    m.add(
        "MAX_FRAGMENT_PAYLOAD",
        kneepoint_client::MAX_FRAGMENT_PAYLOAD,
    )?;
    Ok(())
}
