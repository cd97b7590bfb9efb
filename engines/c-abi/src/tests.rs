//! Adapter tests against a fake engine written in Rust behind the C ABI. The
//! fake counts the error objects and engines it has alive, so that a leak or
//! a double free by the adapter shows as a wrong count (the C demonstration
//! engine is exercised in `tests/mean_engine.rs`).

use std::cell::{Cell, RefCell};
use std::ffi::{c_char, CString};

use libml::engine::{EngineConfig, EngineError, Framework};

use super::sys::*;
use super::{CFramework, OpenError};

/// What the fake engine does, per test (each test runs on its own thread).
#[derive(Clone, Copy, Debug)]
struct Plan {
    /// The callback that fails, and its status.
    fail: Option<(&'static str, kp_status)>,
    /// On failure, leave `*err` NULL.
    no_error_object: bool,
    /// Error objects whose `error_message` is NULL.
    null_message: bool,
    /// Set `*err` even on success (a broken engine the adapter must survive).
    error_on_success: bool,
    /// The output rank load/link report.
    output_rank: usize,
}

const GOOD: Plan = Plan {
    fail: None,
    no_error_object: false,
    null_message: false,
    error_on_success: false,
    output_rank: 1,
};

thread_local! {
    static PLAN: Cell<Plan> = const { Cell::new(GOOD) };
    static LIVE_ERRORS: Cell<i64> = const { Cell::new(0) };
    static ERRORS_MADE: Cell<i64> = const { Cell::new(0) };
    static LIVE_ENGINES: Cell<i64> = const { Cell::new(0) };
    static CALLS: RefCell<Vec<&'static str>> = const { RefCell::new(Vec::new()) };
}

/// The fake error object: a boxed message.
struct FakeError {
    message: CString,
    null_message: bool,
}

/// The fake engine instance.
struct FakeEngine {
    names: [CString; 2],
}

/// Records the call and answers according to the plan, setting `*err` when
/// the plan says so.
///
/// # Safety
///
/// - `err` is valid for writes.
unsafe fn respond(callback: &'static str, err: *mut *mut kp_error) -> kp_status {
    CALLS.with_borrow_mut(|calls| calls.push(callback));
    let plan = PLAN.get();
    let status = match plan.fail {
        Some((name, status)) if name == callback => status,
        _ => KP_STATUS_OK,
    };
    let make_error = if status == KP_STATUS_OK {
        plan.error_on_success
    } else {
        !plan.no_error_object
    };
    if make_error {
        let error = Box::new(FakeError {
            message: CString::new(format!("fake {callback} says no")).unwrap(),
            null_message: plan.null_message,
        });
        LIVE_ERRORS.set(LIVE_ERRORS.get() + 1);
        ERRORS_MADE.set(ERRORS_MADE.get() + 1);
        // SAFETY:
        // - `err` is valid for writes (contract).
        unsafe { err.write(Box::into_raw(error).cast()) };
    }
    status
}

unsafe extern "C" fn fake_init(
    _config: *const kp_engine_config,
    out: *mut *mut kp_engine,
    err: *mut *mut kp_error,
) -> kp_status {
    // SAFETY:
    // - the adapter passes a valid `err` (header).
    let status = unsafe { respond("init", err) };
    if status == KP_STATUS_OK {
        let engine = Box::new(FakeEngine {
            names: [c"in".to_owned(), c"out".to_owned()],
        });
        LIVE_ENGINES.set(LIVE_ENGINES.get() + 1);
        // SAFETY:
        // - the adapter passes a valid `out` (header).
        unsafe { out.write(Box::into_raw(engine).cast()) };
    }
    status
}

unsafe extern "C" fn fake_deinit(engine: *mut kp_engine) {
    CALLS.with_borrow_mut(|calls| calls.push("deinit"));
    // SAFETY:
    // - `engine` came from `Box::into_raw` in `fake_init` and the adapter
    //   releases it exactly once (what these tests check).
    drop(unsafe { Box::from_raw(engine.cast::<FakeEngine>()) });
    LIVE_ENGINES.set(LIVE_ENGINES.get() - 1);
}

/// Fills `out` for load and link.
///
/// # Safety
///
/// - `engine` is a live `FakeEngine`; `out` and `err` are valid for writes.
unsafe fn fake_load(
    callback: &'static str,
    engine: *mut kp_engine,
    out: *mut kp_model_info,
    err: *mut *mut kp_error,
) -> kp_status {
    // SAFETY:
    // - `err` is valid (contract).
    let status = unsafe { respond(callback, err) };
    if status == KP_STATUS_OK {
        // SAFETY:
        // - `engine` is a live `FakeEngine` (contract), only read here.
        let engine = unsafe { &*engine.cast::<FakeEngine>() };
        let mut output_shape = kp_shape {
            rank: PLAN.get().output_rank,
            dims: [1; KP_MAX_RANK],
        };
        output_shape.dims[0] = 10;
        let info = kp_model_info {
            input_name: engine.names[0].as_ptr(),
            input_shape: kp_shape {
                rank: 2,
                dims: [4, 5, 0, 0, 0, 0, 0, 0],
            },
            output_name: engine.names[1].as_ptr(),
            output_shape,
        };
        // SAFETY:
        // - `out` is valid for writes (contract).
        unsafe { out.write(info) };
    }
    status
}

unsafe extern "C" fn fake_load_model(
    engine: *mut kp_engine,
    _path: *const c_char,
    out: *mut kp_model_info,
    err: *mut *mut kp_error,
) -> kp_status {
    // SAFETY:
    // - the adapter passes a live engine and valid `out` and `err` (header).
    unsafe { fake_load("load_model", engine, out, err) }
}

unsafe extern "C" fn fake_link_model(
    engine: *mut kp_engine,
    _bytes: *const u8,
    _len: usize,
    out: *mut kp_model_info,
    err: *mut *mut kp_error,
) -> kp_status {
    // SAFETY:
    // - the adapter passes a live engine and valid `out` and `err` (header).
    unsafe { fake_load("link_model", engine, out, err) }
}

unsafe extern "C" fn fake_configure_batch(
    _engine: *mut kp_engine,
    _max: usize,
    err: *mut *mut kp_error,
) -> kp_status {
    // SAFETY:
    // - the adapter passes a valid `err` (header).
    unsafe { respond("configure_batch", err) }
}

unsafe extern "C" fn fake_infer_batch(
    _engine: *mut kp_engine,
    _input: *const f32,
    _input_len: usize,
    _batch: usize,
    _output: *mut f32,
    _output_len: usize,
    err: *mut *mut kp_error,
) -> kp_status {
    // SAFETY:
    // - the adapter passes a valid `err` (header).
    unsafe { respond("infer_batch", err) }
}

unsafe extern "C" fn fake_error_message(err: *const kp_error) -> *const c_char {
    // SAFETY:
    // - `err` is a live `FakeError` from `respond` (header: the host passes
    //   only errors it was given and has not freed), only read here.
    let error = unsafe { &*err.cast::<FakeError>() };
    if error.null_message {
        std::ptr::null()
    } else {
        error.message.as_ptr()
    }
}

unsafe extern "C" fn fake_error_free(err: *mut kp_error) {
    // SAFETY:
    // - `err` came from `Box::into_raw` in `respond`; the adapter frees each
    //   error once (what these tests check).
    drop(unsafe { Box::from_raw(err.cast::<FakeError>()) });
    LIVE_ERRORS.set(LIVE_ERRORS.get() - 1);
}

const FAKE: kp_framework = kp_framework {
    abi_version_major: KP_IF_ABI_VERSION_MAJOR,
    abi_version_minor: KP_IF_ABI_VERSION_MINOR,
    name: c"fake".as_ptr(),
    init: Some(fake_init),
    deinit: Some(fake_deinit),
    load_model: Some(fake_load_model),
    link_model: Some(fake_link_model),
    configure_batch: Some(fake_configure_batch),
    infer_batch: Some(fake_infer_batch),
    error_message: Some(fake_error_message),
    error_free: Some(fake_error_free),
};

fn open(table: &kp_framework) -> Result<CFramework, OpenError> {
    // SAFETY:
    // - the fake's callbacks are Rust functions of this binary that keep the
    //   header's rules, and its name is a static C string.
    unsafe { CFramework::from_table(table) }
}

fn fake(plan: Plan) -> CFramework {
    PLAN.set(plan);
    open(&FAKE).expect("the fake table is valid")
}

const CONFIG: EngineConfig = EngineConfig {
    intra_op_threads: 1,
};

/// Drives every callback once, stopping at the first error.
fn run_all(engine: &mut CFramework) -> Result<(), EngineError> {
    engine.init(&CONFIG)?;
    engine.link_model(b"model")?;
    engine.configure_batch(2)?;
    let mut output = [0.0; 20];
    engine.infer_batch(&[0.0; 40], 2, &mut output)?;
    engine.deinit();
    Ok(())
}

fn calls() -> Vec<&'static str> {
    CALLS.with_borrow_mut(std::mem::take)
}

fn assert_nothing_alive() {
    assert_eq!(LIVE_ERRORS.get(), 0, "error objects leaked or freed twice");
    assert_eq!(LIVE_ENGINES.get(), 0, "engines leaked or freed twice");
}

#[test]
fn good_engine_runs_every_callback_once() {
    let mut engine = fake(GOOD);
    assert_eq!(engine.name(), "fake");
    assert_eq!(
        engine.abi_version(),
        (KP_IF_ABI_VERSION_MAJOR, KP_IF_ABI_VERSION_MINOR)
    );
    engine.init(&CONFIG).unwrap();
    let info = engine.load_model("/nowhere".as_ref()).unwrap();
    assert_eq!(info.input_name, "in");
    assert_eq!(info.input_shape, [4, 5]);
    assert_eq!(info.output_name, "out");
    assert_eq!(info.output_shape, [10]);
    engine.configure_batch(2).unwrap();
    engine.infer_batch(&[0.0; 40], 2, &mut [0.0; 20]).unwrap();
    engine.deinit();
    engine.deinit();
    drop(engine);
    assert_eq!(
        calls(),
        [
            "init",
            "load_model",
            "configure_batch",
            "infer_batch",
            "deinit"
        ]
    );
    assert_nothing_alive();
}

#[test]
fn errors_set_on_success_are_freed() {
    let mut engine = fake(Plan {
        error_on_success: true,
        ..GOOD
    });
    run_all(&mut engine).unwrap();
    drop(engine);
    assert_eq!(ERRORS_MADE.get(), 4);
    assert_nothing_alive();
}

#[test]
fn every_status_maps_to_its_variant_with_the_message() {
    for callback in ["init", "link_model", "configure_batch", "infer_batch"] {
        for status in [
            KP_STATUS_MODEL,
            KP_STATUS_SHAPE,
            KP_STATUS_ORDER,
            KP_STATUS_RUN,
            99,
        ] {
            let mut engine = fake(Plan {
                fail: Some((callback, status)),
                ..GOOD
            });
            let error = run_all(&mut engine).unwrap_err();
            let text = error.to_string();
            assert!(
                text.contains(&format!("fake {callback}: fake {callback} says no")),
                "{text}"
            );
            match (status, &error) {
                (KP_STATUS_MODEL, EngineError::Model { model, .. }) => {
                    let expected = if callback == "init" {
                        ""
                    } else {
                        "5 bytes in memory"
                    };
                    assert_eq!(model, expected);
                }
                (KP_STATUS_SHAPE, EngineError::Shape(_)) | (KP_STATUS_RUN, EngineError::Run(_)) => {
                }
                (KP_STATUS_ORDER, EngineError::Run(m)) => {
                    assert!(m.ends_with("(out of order)"), "{m}")
                }
                (99, EngineError::Run(m)) => assert!(m.ends_with("(unknown status 99)"), "{m}"),
                _ => panic!("status {status} became {error:?}"),
            }
            drop(engine);
            assert_nothing_alive();
        }
    }
    assert_eq!(ERRORS_MADE.get(), 20);
}

#[test]
fn missing_messages_are_reported_as_such() {
    for plan in [
        Plan {
            no_error_object: true,
            ..GOOD
        },
        Plan {
            null_message: true,
            ..GOOD
        },
    ] {
        let mut engine = fake(Plan {
            fail: Some(("configure_batch", KP_STATUS_RUN)),
            ..plan
        });
        let error = run_all(&mut engine).unwrap_err();
        assert_eq!(
            error.to_string(),
            "inference failed: fake configure_batch: (no message)"
        );
        drop(engine);
        assert_nothing_alive();
    }
}

#[test]
fn failed_init_leaves_no_engine_and_may_be_retried() {
    let mut engine = fake(Plan {
        fail: Some(("init", KP_STATUS_RUN)),
        ..GOOD
    });
    engine.init(&CONFIG).unwrap_err();
    assert!(matches!(
        engine.link_model(b""),
        Err(EngineError::Order("model loaded before init"))
    ));
    PLAN.set(GOOD);
    engine.init(&CONFIG).unwrap();
    drop(engine);
    assert_eq!(calls(), ["init", "init", "deinit"]);
    assert_nothing_alive();
}

#[test]
fn drop_releases_an_engine_the_host_forgot() {
    let mut engine = fake(GOOD);
    engine.init(&CONFIG).unwrap();
    engine.link_model(b"").unwrap();
    assert_eq!(LIVE_ENGINES.get(), 1);
    drop(engine);
    assert_eq!(calls(), ["init", "link_model", "deinit"]);
    assert_nothing_alive();
}

#[test]
fn out_of_order_calls_never_reach_the_engine() {
    let mut engine = fake(GOOD);
    let order = |r: Result<(), EngineError>| match r {
        Err(EngineError::Order(m)) => m,
        other => panic!("expected an order error, got {other:?}"),
    };
    assert_eq!(
        order(engine.configure_batch(1)),
        "configure_batch before load_model or link_model"
    );
    assert_eq!(
        order(engine.infer_batch(&[], 0, &mut [])),
        "infer_batch before load_model or link_model"
    );
    engine.init(&CONFIG).unwrap();
    assert_eq!(order(engine.init(&CONFIG)), "init called twice");
    engine.link_model(b"").unwrap();
    assert_eq!(
        order(engine.load_model("m".as_ref()).map(drop)),
        "a model is already loaded"
    );
    assert_eq!(
        order(engine.infer_batch(&[], 0, &mut [])),
        "infer_batch before configure_batch"
    );
    engine.deinit();
    assert_eq!(order(engine.configure_batch(1)), "engine used after deinit");
    assert_eq!(order(engine.init(&CONFIG)), "engine used after deinit");
    drop(engine);
    assert_eq!(calls(), ["init", "link_model", "deinit"]);
    assert_nothing_alive();
}

#[test]
fn a_model_described_wrongly_is_refused() {
    let mut engine = fake(Plan {
        output_rank: KP_MAX_RANK + 1,
        ..GOOD
    });
    engine.init(&CONFIG).unwrap();
    let error = engine.link_model(b"").unwrap_err();
    assert_eq!(
        error.to_string(),
        "cannot load model 0 bytes in memory: fake link_model: engine described the model wrongly: \
         output shape: rank 9 exceeds 8"
    );
    PLAN.set(GOOD);
    engine.link_model(b"").unwrap();
}

#[test]
fn tables_of_another_major_or_with_holes_are_refused() {
    let other_major = kp_framework {
        abi_version_major: KP_IF_ABI_VERSION_MAJOR + 1,
        ..FAKE
    };
    match open(&other_major) {
        Err(OpenError::Version {
            engine_major,
            host_major,
            ..
        }) => assert_eq!((engine_major, host_major), (2, 1)),
        other => panic!("{other:?}"),
    }
    let newer_minor = kp_framework {
        abi_version_minor: KP_IF_ABI_VERSION_MINOR + 1,
        ..FAKE
    };
    assert_eq!(open(&newer_minor).unwrap().abi_version(), (1, 1));

    let no_infer = kp_framework {
        infer_batch: None,
        ..FAKE
    };
    assert!(matches!(
        open(&no_infer),
        Err(OpenError::Missing("infer_batch"))
    ));
    let no_name = kp_framework {
        name: std::ptr::null(),
        ..FAKE
    };
    assert!(matches!(open(&no_name), Err(OpenError::Missing("name"))));
    let error: EngineError = open(&other_major).unwrap_err().into();
    assert_eq!(
        error.to_string(),
        "inference engine library unavailable: engine speaks kneepoint IF ABI 2.0, this host speaks 1.x"
    );
}

#[test]
fn adapter_is_send_and_a_framework_object() {
    fn send<T: Send>(_: &T) {}
    let engine: Box<dyn Framework> = Box::new(fake(GOOD));
    send(&engine);
}
