//! The demonstration C engine (`examples/c_engine/mean_engine.c`, built by
//! build.rs as a shared library) through `dlopen()` and the safe adapter:
//! every callback, its results against a Rust re-implementation of the same
//! arithmetic, and its error paths with the engine's own messages.

use std::path::{Path, PathBuf};

use kp_engine_c::sys::{self, kp_engine, kp_engine_config, kp_error, kp_framework};
use kp_engine_c::{CFramework, OpenError};
use libml::engine::{EngineConfig, EngineError, Framework, ModelInfo};

const MEAN_ENGINE: &str = env!("KP_IF_ABI_MEAN_ENGINE");
const FUTURE_ENGINE: &str = env!("KP_IF_ABI_FUTURE_ENGINE");
const CONFIG: EngineConfig = EngineConfig {
    intra_op_threads: 2,
};

fn open() -> CFramework {
    // SAFETY:
    // - the library is this crate's demonstration engine, built from
    //   source by build.rs against kneepoint_if.h, which it follows.
    unsafe { CFramework::load(MEAN_ENGINE) }.expect("the demonstration engine loads")
}

fn example_model() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/c_engine/mean.model")
}

/// The engine's arithmetic, re-implemented: for each input of `n` values,
/// `k` window means, summed in order in f64 and rounded once to f32.
fn window_means(input: &[f32], n: usize, k: usize) -> Vec<f32> {
    input
        .chunks_exact(n)
        .flat_map(|x| {
            (0..k).map(move |j| {
                let window = &x[j * n / k..(j + 1) * n / k];
                let sum: f64 = window.iter().map(|&v| f64::from(v)).sum();
                (sum / window.len() as f64) as f32
            })
        })
        .collect()
}

/// Deterministic inputs of mixed sign and magnitude.
fn inputs(len: usize, seed: u64) -> Vec<f32> {
    let mut state = seed;
    (0..len)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let unit = (state >> 40) as f32 / (1u64 << 24) as f32; // [0, 1)
            (unit - 0.5) * if state & 1 == 0 { 1.0 } else { 300.0 }
        })
        .collect()
}

fn shape_error(result: Result<(), EngineError>) -> String {
    match result {
        Err(EngineError::Shape(message)) => message,
        other => panic!("expected a shape error, got {other:?}"),
    }
}

fn model_error(result: Result<ModelInfo, EngineError>) -> (String, String) {
    match result {
        Err(EngineError::Model { model, reason }) => (model, reason),
        other => panic!("expected a model error, got {other:?}"),
    }
}

#[test]
fn load_configure_infer_matches_the_rust_arithmetic() {
    let mut engine = open();
    assert_eq!(engine.name(), "mean-demo");
    assert_eq!(engine.abi_version(), (1, 0));
    engine.init(&CONFIG).unwrap();
    let info = engine.load_model(&example_model()).unwrap();
    assert_eq!(
        info,
        ModelInfo {
            input_name: "image".into(),
            input_shape: vec![3, 8, 8],
            output_name: "scores".into(),
            output_shape: vec![10],
        }
    );
    let (n, k) = (info.input_elems(), info.output_elems());
    engine.configure_batch(4).unwrap();

    for (batch, seed) in [(4, 1), (1, 2), (3, 3), (0, 4)] {
        let input = inputs(batch * n, seed);
        // Room for the largest batch, as an IF's output buffer has; the
        // engine writes only the first batch * k values.
        let mut output = vec![f32::NAN; 4 * k];
        engine.infer_batch(&input, batch, &mut output).unwrap();
        let expected = window_means(&input, n, k);
        assert_eq!(
            output[..batch * k]
                .iter()
                .map(|v| v.to_bits())
                .collect::<Vec<_>>(),
            expected.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            "batch {batch}"
        );
        assert!(
            output[batch * k..].iter().all(|v| v.is_nan()),
            "wrote past the batch"
        );
    }
    engine.deinit();
}

#[test]
fn every_input_value_moves_its_window_score() {
    let mut engine = open();
    engine.init(&CONFIG).unwrap();
    let info = engine.link_model(b"num_classes=10\ninput=3,8,8\n").unwrap();
    let (n, k) = (info.input_elems(), info.output_elems());
    engine.configure_batch(1).unwrap();
    let base = inputs(n, 7);
    let mut before = vec![0.0; k];
    engine.infer_batch(&base, 1, &mut before).unwrap();
    for i in 0..n {
        let mut changed = base.clone();
        changed[i] += 1000.0;
        let mut after = vec![0.0; k];
        engine.infer_batch(&changed, 1, &mut after).unwrap();
        let moved: Vec<usize> = (0..k).filter(|&j| after[j] != before[j]).collect();
        let window = (0..k).find(|&j| j * n / k <= i && i < (j + 1) * n / k);
        assert_eq!(moved, [window.unwrap()], "value {i}");
    }
}

#[test]
fn link_model_from_bytes_with_uneven_windows() {
    let mut engine = open();
    engine.init(&CONFIG).unwrap();
    let text = b"# in memory\r\nnum_classes=7\r\ninput=5,13\r\noutput_name=means";
    let info = engine.link_model(text).unwrap();
    assert_eq!(info.input_name, "input");
    assert_eq!(info.input_shape, [5, 13]);
    assert_eq!(info.output_name, "means");
    assert_eq!(info.output_shape, [7]);
    engine.configure_batch(8).unwrap();
    let input = inputs(8 * 65, 11);
    let mut output = vec![0.0; 8 * 7];
    engine.infer_batch(&input, 8, &mut output).unwrap();
    assert_eq!(output, window_means(&input, 65, 7));
}

#[test]
fn engine_errors_carry_the_engines_messages() {
    let mut engine = open();

    let error = engine
        .init(&EngineConfig {
            intra_op_threads: 0,
        })
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "inference failed: mean-demo init: intra_op_threads must be at least 1"
    );
    engine.init(&CONFIG).unwrap();

    let missing = Path::new("/nonexistent/kneepoint/model.txt");
    let (model, reason) = model_error(engine.load_model(missing));
    assert_eq!(model, missing.display().to_string());
    assert_eq!(
        reason,
        "mean-demo load_model: cannot open /nonexistent/kneepoint/model.txt: No such file or directory"
    );

    for (text, expected) in [
        (
            &b"num_classes=10\n"[..],
            "model in memory: needs num_classes= and input=",
        ),
        (
            b"num_classes=200\ninput=3,8,8",
            "model in memory: num_classes 200 exceeds the 192 input values",
        ),
        (
            b"num_classes=1\ninput=1,1,1,1,1,1,1,1,1",
            "model in memory: line 2: more than 8 dimensions",
        ),
        (
            b"num_classes=1\ninput=3,0,8",
            "model in memory: line 2: dimensions must be positive integers",
        ),
        (
            b"num_classes=1\nbatch=4",
            "model in memory: line 2: unknown key",
        ),
        (
            b"num_classes 1",
            "model in memory: line 1: expected key=value",
        ),
    ] {
        let (model, reason) = model_error(engine.link_model(text));
        assert_eq!(model, format!("{} bytes in memory", text.len()));
        assert_eq!(reason, format!("mean-demo link_model: {expected}"));
    }
    // A failed load leaves the engine as it was: a good model still loads.
    let info = engine.link_model(b"num_classes=2\ninput=4").unwrap();
    assert_eq!((info.input_elems(), info.output_elems()), (4, 2));

    assert_eq!(
        shape_error(engine.configure_batch(0)),
        "mean-demo configure_batch: max_batch 0 is not in 1..=65536"
    );
    engine.configure_batch(2).unwrap();
    assert_eq!(
        shape_error(engine.infer_batch(&[0.0; 12], 3, &mut [0.0; 6])),
        "mean-demo infer_batch: batch 3 exceeds the configured max_batch 2"
    );
    assert_eq!(
        shape_error(engine.infer_batch(&[0.0; 5], 1, &mut [0.0; 2])),
        "mean-demo infer_batch: input has 5 values, batch 1 needs 4"
    );
    assert_eq!(
        shape_error(engine.infer_batch(&[0.0; 8], 2, &mut [0.0; 3])),
        "mean-demo infer_batch: output has room for 3 values, batch 2 needs 4"
    );
    // Still usable after every error.
    let mut output = [0.0; 2];
    engine
        .infer_batch(&[1.0, 2.0, 3.0, 5.0], 1, &mut output)
        .unwrap();
    assert_eq!(output, [1.5, 4.0]);
}

#[test]
fn infer_before_load_is_refused_by_the_adapter() {
    let mut engine = open();
    engine.init(&CONFIG).unwrap();
    assert!(matches!(
        engine.infer_batch(&[0.0; 4], 1, &mut [0.0; 2]),
        Err(EngineError::Order(
            "infer_batch before load_model or link_model"
        ))
    ));
}

/// The engine's own order checks, called through the raw table (the adapter
/// never lets such calls through): each returns KP_STATUS_ORDER and an error
/// object with a message, which is then freed with the engine's
/// `error_free`.
#[test]
fn the_c_engine_checks_the_order_itself() {
    // SAFETY:
    // - the demonstration engine, built by build.rs, is safe to load.
    let library = unsafe { libloading::Library::new(MEAN_ENGINE) }.unwrap();
    // SAFETY:
    // - `kp_if_framework` has the header's type.
    let entry = unsafe { library.get::<sys::kp_if_framework_fn>(sys::KP_IF_ENTRY_POINT) }.unwrap();
    // SAFETY:
    // - the entry point takes nothing and may be called from any thread.
    let table = unsafe { entry() };
    // SAFETY:
    // - the entry point returns the library's static table, non-NULL and
    //   valid while `library` is loaded (it outlives this test body).
    let table: &kp_framework = unsafe { &*table };
    let config = kp_engine_config {
        abi_version_major: sys::KP_IF_ABI_VERSION_MAJOR,
        abi_version_minor: sys::KP_IF_ABI_VERSION_MINOR,
        intra_op_threads: 1,
    };
    let mut engine: *mut kp_engine = std::ptr::null_mut();
    let mut err: *mut kp_error = std::ptr::null_mut();
    // SAFETY:
    // - `config`, `engine` and `err` are valid for the call, `err` is NULL.
    let status = unsafe { table.init.unwrap()(&config, &mut engine, &mut err) };
    assert_eq!((status, err), (sys::KP_STATUS_OK, std::ptr::null_mut()));

    let take_message = |err: *mut kp_error| -> String {
        assert!(!err.is_null());
        // SAFETY:
        // - `err` is a live error object this engine returned.
        let text = unsafe { table.error_message.unwrap()(err) };
        // SAFETY:
        // - the message is NUL-terminated and valid until `error_free`.
        let message = unsafe { std::ffi::CStr::from_ptr(text) }
            .to_str()
            .unwrap()
            .to_owned();
        // SAFETY:
        // - `err` is ours to free, once; it is not used again.
        unsafe { table.error_free.unwrap()(err) };
        message
    };

    let mut output = [0.0f32; 2];
    // SAFETY:
    // - `engine` is live; `input`/`output` are valid for their lengths;
    //   `err` is valid and NULL.
    let status = unsafe {
        table.infer_batch.unwrap()(
            engine,
            [0.0f32; 4].as_ptr(),
            4,
            1,
            output.as_mut_ptr(),
            2,
            &mut err,
        )
    };
    assert_eq!(status, sys::KP_STATUS_ORDER);
    assert_eq!(
        take_message(err),
        "infer_batch before load_model or link_model"
    );

    err = std::ptr::null_mut();
    // SAFETY:
    // - `engine` is live; `err` is valid and NULL.
    let status = unsafe { table.configure_batch.unwrap()(engine, 4, &mut err) };
    assert_eq!(status, sys::KP_STATUS_ORDER);
    assert_eq!(
        take_message(err),
        "configure_batch before load_model or link_model"
    );

    // SAFETY:
    // - `engine` came from a successful init and is released once.
    unsafe { table.deinit.unwrap()(engine) };
}

#[test]
fn a_library_of_another_major_is_refused() {
    // SAFETY:
    // - the fixture, built by build.rs, is safe to load and exports the
    //   entry point; its table has the two version fields (and no more).
    match unsafe { CFramework::load(FUTURE_ENGINE) } {
        Err(OpenError::Version {
            engine_major: 2,
            engine_minor: 0,
            host_major: 1,
        }) => {}
        other => panic!("{other:?}"),
    }
}

#[test]
fn libraries_that_are_not_engines_are_refused() {
    // SAFETY:
    // - dlopen() of a missing file runs nothing.
    let missing = unsafe { CFramework::load("/nonexistent/libengine.so") };
    assert!(
        matches!(missing, Err(OpenError::Dlopen { .. })),
        "{missing:?}"
    );
    // SAFETY:
    // - the C library is already loaded in this process; opening it again
    //   runs no initialiser.
    let libc = unsafe { CFramework::load("libc.so.6") };
    assert!(
        matches!(libc, Err(OpenError::EntryPoint { .. })),
        "{libc:?}"
    );
}

#[test]
fn the_adapter_moves_between_threads() {
    let mut engine: Box<dyn Framework> = Box::new(open());
    engine.init(&CONFIG).unwrap();
    engine.link_model(b"num_classes=3\ninput=6").unwrap();
    let mut engine = std::thread::spawn(move || {
        engine.configure_batch(1).unwrap();
        engine
    })
    .join()
    .unwrap();
    let mut output = [0.0; 3];
    engine
        .infer_batch(&[1.0, 3.0, 5.0, 7.0, 9.0, 11.0], 1, &mut output)
        .unwrap();
    assert_eq!(output, [2.0, 6.0, 10.0]);
    engine.deinit();
}
