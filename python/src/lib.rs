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
//! runs. An input that is a `bytes` object is cut into its datagrams
//! (`Client::prepare`) with the GIL released (bytes are immutable). Any
//! other buffer (a numpy array, a bytearray, a memoryview) is cut with the
//! GIL held, straight from its memory into the datagrams, and only the
//! sending is done without it (`Client::send`): another Python thread could
//! write to a mutable buffer while it is read, which would be a data race on
//! memory Rust reads as `&[u8]`. (A non-contiguous buffer is first copied
//! contiguous.) Copying it into Rust memory first and cutting that later
//! cost a second 150 KB pass per 224x224x3 input, ~25 µs p50 on the live
//! platform with the caches cold after a wait.
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

// One `unsafe` block (`contiguous_bytes`), each use allowed where it is.
#![deny(unsafe_code)]

use std::collections::HashMap;
use std::time::Duration;

use kneepoint_client::image as kimage;
use kneepoint_client::{Answer, Client, ClientError, Config, Prepared, RequestId, Stats};
use pyo3::buffer::PyBuffer;
use pyo3::exceptions::{PyIndexError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{
    PyByteArray, PyBytes, PyDict, PyIterator, PyList, PyMemoryView, PyModule, PyString, PyTuple,
    PyType,
};
use pyo3::IntoPyObjectExt;

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

/// One of an answer's top-k classes: `kneepoint.Prediction`. A frozen
/// class that also behaves as the 3-tuple `(class_id, label, score)`
/// (indexing, unpacking, `len`, equality with such a tuple), as the
/// `NamedTuple` it replaced did.
///
/// Why here and not in Python: every answer makes one [`PyAnswer`] and up
/// to top_k of these, and on the closed-loop path the interpreter's code
/// for a Python dataclass and five `NamedTuple`s runs with cold caches
/// (the caller slept through the inference): measured at ~30 µs p50 per
/// answer on the live platform against a few µs made here
/// (docs/PERFORMANCE-JOURNAL.md, "Client libraries").
#[pyclass(frozen, get_all, module = "kneepoint", name = "Prediction")]
#[derive(Debug)]
struct PyPrediction {
    /// The class's index in the model's output.
    class_id: u32,
    /// The class's name from the model's labels, None without labels.
    label: Option<Py<PyString>>,
    /// The model's output at `class_id` (a probability for models that
    /// end in a softmax).
    score: f32,
}

impl PyPrediction {
    fn fields<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        (
            self.class_id,
            self.label.as_ref().map(|l| l.clone_ref(py)),
            self.score,
        )
            .into_pyobject(py)
    }
}

#[pymethods]
impl PyPrediction {
    #[new]
    #[pyo3(signature = (class_id, label, score))]
    fn new(class_id: u32, label: Option<Py<PyString>>, score: f32) -> Self {
        PyPrediction {
            class_id,
            label,
            score,
        }
    }

    fn __len__(&self) -> usize {
        3
    }

    fn __getitem__<'py>(&self, py: Python<'py>, index: isize) -> PyResult<Bound<'py, PyAny>> {
        let i = if index < 0 { index + 3 } else { index };
        match i {
            0 => self.class_id.into_bound_py_any(py),
            1 => self
                .label
                .as_ref()
                .map(|l| l.clone_ref(py))
                .into_bound_py_any(py),
            2 => self.score.into_bound_py_any(py),
            _ => Err(PyIndexError::new_err("Prediction index out of range")),
        }
    }

    fn __iter__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyIterator>> {
        self.fields(py)?.try_iter()
    }

    /// Equal to a Prediction or a tuple with the same three values.
    fn __eq__(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<bool> {
        let mine = self.fields(py)?;
        if let Ok(p) = other.cast::<PyPrediction>() {
            return mine.eq(p.get().fields(py)?);
        }
        if other.is_instance_of::<PyTuple>() {
            return mine.eq(other);
        }
        Ok(false)
    }

    fn __hash__(&self, py: Python<'_>) -> PyResult<isize> {
        self.fields(py)?.hash()
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let label = match &self.label {
            Some(l) => l.bind(py).repr()?.to_string(),
            None => "None".into(),
        };
        Ok(format!(
            "Prediction(class_id={}, label={label}, score={})",
            self.class_id,
            self.score.into_bound_py_any(py)?.repr()?
        ))
    }
}

/// A status-OK answer with everything the platform says about it:
/// `kneepoint.Answer` (frozen).
#[pyclass(frozen, get_all, module = "kneepoint", name = "Answer")]
#[derive(Debug)]
struct PyAnswer {
    /// The request it answers.
    request_id: u64,
    /// The inference function that answered.
    if_id: u16,
    /// Highest score first: a list of Prediction.
    predictions: Py<PyList>,
    /// Size of the batch the request was inferred in.
    batch_size: u16,
    /// The platform's time from the request's first fragment to its answer.
    platform_latency_us: u32,
    /// Round trip seen by the client (from just before the first fragment
    /// was sent to the answer's arrival), seconds.
    rtt: f64,
}

#[pymethods]
impl PyAnswer {
    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        Ok(format!(
            "Answer(request_id={}, if_id={}, predictions={}, batch_size={}, \
             platform_latency_us={}, rtt={})",
            self.request_id,
            self.if_id,
            self.predictions.bind(py).repr()?,
            self.batch_size,
            self.platform_latency_us,
            self.rtt
        ))
    }
}

/// Class names by if_id, as Python strings made once (an answer's labels
/// are references to them).
type Labels = HashMap<u16, Vec<Py<PyString>>>;

fn py_answer(py: Python<'_>, a: Answer, labels: &Labels) -> PyResult<Py<PyAnswer>> {
    let names = labels.get(&a.if_id);
    let predictions = PyList::empty(py);
    for c in &a.top_k {
        let label = names
            .and_then(|n| n.get(c.class as usize))
            .map(|l| l.clone_ref(py));
        predictions.append(PyPrediction {
            class_id: c.class,
            label,
            score: c.score,
        })?;
    }
    Py::new(
        py,
        PyAnswer {
            request_id: a.request_id.0,
            if_id: a.if_id,
            predictions: predictions.unbind(),
            batch_size: a.batch_size,
            platform_latency_us: a.platform_latency_us,
            rtt: a.rtt.as_secs_f64(),
        },
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
        Ok(Input::Copied(buffer_of(obj)?.to_vec(obj.py())?))
    }

    fn as_slice(&self) -> &[u8] {
        match self {
            Input::Bytes(b) => b.as_bytes(),
            Input::Copied(v) => v,
        }
    }
}

/// `obj`'s buffer of unsigned bytes, or a TypeError that says what is taken.
fn buffer_of(obj: &Bound<'_, PyAny>) -> PyResult<PyBuffer<u8>> {
    PyBuffer::<u8>::get(obj).map_err(|_| {
        PyTypeError::new_err(format!(
            "input must be bytes or a buffer of unsigned bytes (numpy uint8, bytearray, \
             memoryview), not {}",
            obj.get_type()
                .name()
                .map_or_else(|_| "?".into(), |n| n.to_string())
        ))
    })
}

/// A C-contiguous buffer's bytes, read in place while the GIL is held
/// (`_py`; the slice cannot outlive it); `None` for another layout.
///
/// This is what pyo3's own `PyBuffer::copy_to_slice` does (CPython's
/// `PyBuffer_ToContiguous` reads the same memory under the GIL), without
/// the intermediate copy that would then be cut into datagrams: cutting a
/// 224x224x3 array straight into the datagrams saves a 150 KB copy into
/// cold memory per request (docs/PERFORMANCE-JOURNAL.md, "Client libraries").
#[allow(unsafe_code)]
fn contiguous_bytes<'a>(_py: Python<'a>, buf: &'a PyBuffer<u8>) -> Option<&'a [u8]> {
    if !buf.is_c_contiguous() {
        return None;
    }
    if buf.len_bytes() == 0 {
        // (Its pointer may be null, which no slice may have.)
        return Some(&[]);
    }
    // SAFETY: `buf` is a live buffer export of `u8` items (PyBuffer::<u8>
    // checked the format and item size), C-contiguous, so its memory is the
    // `len_bytes()` bytes at `buf_ptr()`, and the export keeps it alive and
    // unresized (a bytearray with an export refuses to resize) for as long
    // as `buf`, which the slice borrows. The GIL is held for the slice's
    // whole life (`'a` is the `Python<'a>` token's), so no Python code can
    // write the memory meanwhile; native code that writes it without the
    // GIL would race with any reader of the buffer protocol, CPython's own
    // copy included, and breaks the protocol's contract.
    Some(unsafe { std::slice::from_raw_parts(buf.buf_ptr().cast::<u8>(), buf.len_bytes()) })
}

/// A seconds value as a positive `Duration`.
fn seconds(what: &str, s: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(s)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| PyValueError::new_err(format!("{what} must be > 0 seconds, got {s}")))
}

/// A model of the repository, as `submit` and answers need it.
#[derive(Debug)]
struct ModelEntry {
    /// `(height, width)` of a model that takes RGB u8 images; `None` for
    /// one that takes raw tensors.
    image: Option<(usize, usize)>,
}

/// A connection to a kneepoint platform: `kneepoint_client::Client`.
#[pyclass(frozen, module = "kneepoint._native")]
#[derive(Debug)]
struct NativeClient {
    inner: Client,
    labels: Labels,
    /// The model repository's models by if_id; `None` without one.
    models: Option<HashMap<u16, ModelEntry>>,
    /// `convert(if_id, image)`: the Python layer's `input_for` (what is
    /// sent for any image), for inputs the fast path does not take.
    convert: Option<Py<PyAny>>,
    /// `numpy.ndarray`, the one array type the fast path takes.
    ndarray: Option<Py<PyType>>,
}

#[pymethods]
impl NativeClient {
    /// Binds a UDP socket, connects it to `addr` and starts the receiver
    /// thread. `retries`: how many times `infer` tries again, as a new
    /// request, after a retryable error. `models`: the model repository,
    /// `None` without one, else `(if_id, input_len, (height, width) of an
    /// image model or None, class names or None)` per model (inputs of
    /// another size are refused locally with WrongSizeError; answers carry
    /// the names). `convert(if_id, image)` turns any other input into what
    /// is sent (the Python layer's `input_for`); `ndarray` is numpy's
    /// array type. Without `convert`, inputs must be buffers of bytes.
    #[new]
    #[pyo3(signature = (addr, timeout, fragment_payload, retries, models, convert=None, ndarray=None))]
    #[allow(clippy::too_many_arguments, clippy::type_complexity)]
    fn new(
        py: Python<'_>,
        addr: &str,
        timeout: f64,
        fragment_payload: usize,
        retries: u32,
        models: Option<
            Vec<(
                u16,
                usize,
                Option<(usize, usize)>,
                Option<Vec<Py<PyString>>>,
            )>,
        >,
        convert: Option<Py<PyAny>>,
        ndarray: Option<Py<PyType>>,
    ) -> PyResult<Self> {
        let mut cfg = Config::builder(addr)
            .timeout(seconds("timeout", timeout)?)
            .fragment_payload(fragment_payload)
            .retries(retries);
        let mut labels = Labels::new();
        let mut table = HashMap::new();
        for (if_id, len, image, names) in models.iter().flatten() {
            cfg = cfg.input_len(*if_id, *len);
            if let Some(names) = names {
                labels.insert(*if_id, names.iter().map(|n| n.clone_ref(py)).collect());
            }
            table.insert(*if_id, ModelEntry { image: *image });
        }
        let models = models.is_some().then_some(table);
        let inner = cfg.connect().map_err(|e| client_error(py, &e))?;
        Ok(NativeClient {
            inner,
            labels,
            models,
            convert,
            ndarray,
        })
    }

    /// Sends `data` to `if_id` and waits for the answer (GIL released);
    /// a retryable error is retried as a new request, up to `retries`
    /// times.
    fn infer(&self, py: Python<'_>, if_id: u16, data: &Bound<'_, PyAny>) -> PyResult<Py<PyAnswer>> {
        let mut attempt = 0;
        loop {
            let prepared = self.prepare(py, if_id, data)?;
            match py.detach(|| self.inner.infer_prepared(prepared)) {
                Ok(a) => return py_answer(py, a, &self.labels),
                Err(e) if e.is_retryable() && attempt < self.inner.config().retries() => {
                    attempt += 1;
                }
                Err(e) => return Err(client_error(py, &e)),
            }
        }
    }

    /// Sends `data` to `if_id`, returns its request id at once.
    fn submit(&self, py: Python<'_>, if_id: u16, data: &Bound<'_, PyAny>) -> PyResult<u64> {
        let prepared = self.prepare(py, if_id, data)?;
        py.detach(|| self.inner.send(prepared))
            .map(|id| id.0)
            .map_err(|e| client_error(py, &e))
    }

    /// Waits for request `request_id`'s result (GIL released).
    fn wait(&self, py: Python<'_>, request_id: u64) -> PyResult<Py<PyAnswer>> {
        match py.detach(|| self.inner.wait(RequestId(request_id))) {
            Ok(a) => py_answer(py, a, &self.labels),
            Err(e) => Err(client_error(py, &e)),
        }
    }

    /// Waits up to `timeout` seconds for submitted requests to end; returns
    /// `[(request_id, Answer or exception instance)]`.
    fn poll(&self, py: Python<'_>, timeout: f64) -> PyResult<Vec<(u64, Py<PyAny>)>> {
        let timeout = Duration::try_from_secs_f64(timeout).map_err(|_| {
            PyValueError::new_err(format!("timeout must be >= 0 seconds, got {timeout}"))
        })?;
        let ended = py.detach(|| self.inner.poll(timeout));
        ended
            .into_iter()
            .map(|(id, result)| {
                let value = match result {
                    Ok(a) => py_answer(py, a, &self.labels)?.into_any(),
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

impl NativeClient {
    /// `data` cut into a request's datagrams.
    ///
    /// The fast path, in Rust: raw bytes (`bytes`, `bytearray`,
    /// `memoryview`) and a uint8 `numpy.ndarray` that is already the
    /// model's input (its exact (height, width, 3) shape for an image
    /// model; any for a tensor model or without a repository), with the
    /// if_id in the repository if there is one. Everything else (other
    /// shapes, PIL images, paths, unknown if_ids, wrong types) goes through
    /// `convert`, the Python layer's `input_for`, which raises or returns
    /// what to send; the fast path sends exactly what it would return.
    /// Why: the Python layer's checks cost ~18 µs p50 per request on the
    /// live platform, its code cold after each wait, against ~1 µs here.
    fn prepare(&self, py: Python<'_>, if_id: u16, data: &Bound<'_, PyAny>) -> PyResult<Prepared> {
        if let Some(prepared) = self.prepare_direct(py, if_id, data)? {
            return Ok(prepared);
        }
        match &self.convert {
            Some(convert) => {
                let input = convert.bind(py).call1((if_id, data))?;
                self.prepare_raw(py, if_id, &input)
            }
            None => self.prepare_raw(py, if_id, data),
        }
    }

    /// The fast path of [`prepare`](Self::prepare): `None` when `data` is
    /// not an input it takes as it is.
    fn prepare_direct(
        &self,
        py: Python<'_>,
        if_id: u16,
        data: &Bound<'_, PyAny>,
    ) -> PyResult<Option<Prepared>> {
        let model = match &self.models {
            None => None,
            Some(models) => match models.get(&if_id) {
                Some(m) => Some(m),
                // Not in the repository: `convert` raises UnknownIfError.
                None => return Ok(None),
            },
        };
        if data.is_exact_instance_of::<PyBytes>()
            || data.is_exact_instance_of::<PyByteArray>()
            || data.is_exact_instance_of::<PyMemoryView>()
        {
            return self.prepare_raw(py, if_id, data).map(Some);
        }
        let is_ndarray = self
            .ndarray
            .as_ref()
            .is_some_and(|t| data.get_type().is(t.bind(py)));
        if !is_ndarray {
            return Ok(None);
        }
        // A uint8 array exports format "B"; any other dtype fails here.
        let Ok(buf) = PyBuffer::<u8>::get(data) else {
            return Ok(None);
        };
        if let Some((h, w)) = model.and_then(|m| m.image) {
            if buf.shape() != [h, w, 3] {
                return Ok(None);
            }
        }
        self.prepare_buffer(py, if_id, &buf).map(Some)
    }

    /// `data`, a `bytes` object (cut with the GIL released: immutable) or
    /// any other buffer of bytes, cut as it is.
    fn prepare_raw(
        &self,
        py: Python<'_>,
        if_id: u16,
        data: &Bound<'_, PyAny>,
    ) -> PyResult<Prepared> {
        if let Ok(bytes) = data.cast::<PyBytes>() {
            let slice = bytes.as_bytes();
            return py
                .detach(|| self.inner.prepare(if_id, slice))
                .map_err(|e| client_error(py, &e));
        }
        self.prepare_buffer(py, if_id, &buffer_of(data)?)
    }

    /// A buffer cut with the GIL held, read once, straight into the
    /// datagrams (see the crate docs on the GIL).
    fn prepare_buffer(&self, py: Python<'_>, if_id: u16, buf: &PyBuffer<u8>) -> PyResult<Prepared> {
        match contiguous_bytes(py, buf) {
            Some(bytes) => self.inner.prepare(if_id, bytes),
            None => self.inner.prepare(if_id, &buf.to_vec(py)?),
        }
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
    m.add_class::<PyAnswer>()?;
    m.add_class::<PyPrediction>()?;
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
