//! The built-in engines against the model repository's reference outputs.
//!
//! `make models` writes, per model, `check/input_b8.f32` (8 NCHW inputs) and
//! `check/output_b8.f32` (what ONNX Runtime 1.31.1 in Python computed for
//! them), described by `check/check.json`. These tests load models through
//! their `config.toml`, run them in each engine at batch 1 and 8, and compare.
//! Without `models/` they fail and say to run `make models`.
//!
//! `latency` (ignored; `cargo test --release -p kp-if --test engines --
//! --ignored --nocapture latency`) prints ONNX Runtime vs tract medians.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use kp_engine_onnxruntime::OnnxRuntime;
use kp_engine_tract::{Tract, TractBatching};
use kp_if::engine_for;
use kp_schema::model::{repository, EngineKind, InputFormat, ModelConfig};
use libml::engine::{EngineConfig, Framework, ModelInfo};

const BATCH: usize = 8;

fn models_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("models")
}

fn config(name: &str) -> ModelConfig {
    let path = models_dir().join(name).join("config.toml");
    assert!(
        path.is_file(),
        "{} does not exist: run `make models` first (it writes the model repository these tests read)",
        path.display()
    );
    ModelConfig::load(&path).unwrap_or_else(|e| panic!("{e}"))
}

/// The reference data of one model.
struct Reference {
    /// `BATCH` inputs, NCHW.
    input: Vec<f32>,
    /// `BATCH` outputs.
    output: Vec<f32>,
    /// The tolerance check.json states.
    rel: f32,
    /// `BATCH` RGB u8 HWC images and their outputs.
    input_u8: Vec<u8>,
    output_from_u8: Vec<f32>,
}

fn read_f32(path: &Path) -> Vec<f32> {
    let bytes = std::fs::read(path)
        .unwrap_or_else(|e| panic!("{}: {e}; run `make models`", path.display()));
    assert_eq!(bytes.len() % 4, 0, "{}", path.display());
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

fn reference(config: &ModelConfig) -> Reference {
    let dir = config.model_path.parent().unwrap().join("check");
    let check: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("check.json"))
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display())),
    )
    .unwrap();
    let file = |key: &str| dir.join(check[key]["file"].as_str().unwrap());
    assert_eq!(check["byte_order"], "little");
    assert_eq!(check["input_f32"]["shape"][0], BATCH);
    let reference = Reference {
        input: read_f32(&file("input_f32")),
        output: read_f32(&file("output_f32")),
        rel: check["tolerance"]["rel"].as_f64().unwrap() as f32,
        input_u8: std::fs::read(file("input_u8")).unwrap(),
        output_from_u8: read_f32(&dir.join(check["output_from_u8"]["file"].as_str().unwrap())),
    };
    assert_eq!(reference.input.len(), BATCH * config.input.elems());
    assert_eq!(reference.output.len(), BATCH * config.output.num_classes);
    reference
}

/// Indices of the `k` largest scores, largest first.
fn top_k(row: &[f32], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..row.len()).collect();
    idx.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
    idx.truncate(k);
    idx
}

/// Each row of `got` is within `rel * max|expected row|` of `want`, and has
/// the same top-5 except where the reference itself ties within that bound.
fn assert_close(what: &str, got: &[f32], want: &[f32], rel: f32) {
    assert_eq!(got.len(), want.len(), "{what}");
    let classes = want.len() / BATCH;
    let mut worst = 0.0f32;
    for (n, (g, w)) in got.chunks(classes).zip(want.chunks(classes)).enumerate() {
        assert!(
            g.iter().all(|x| x.is_finite()),
            "{what}: sample {n} has a non-finite score"
        );
        let scale = w.iter().fold(0.0f32, |m, x| m.max(x.abs()));
        let bound = rel * scale;
        let diff = g
            .iter()
            .zip(w)
            .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(
            diff <= bound,
            "{what}: sample {n}: max |diff| {diff:e} > {rel:e} x max|expected| {scale:e}"
        );
        worst = worst.max(diff / scale);
        let (tg, tw) = (top_k(g, 5), top_k(w, 6));
        for (i, (&a, &b)) in tg.iter().zip(&tw).enumerate() {
            assert!(
                a == b || (w[a] - w[b]).abs() <= bound,
                "{what}: sample {n}: top-5 {tg:?} vs reference {:?} differ at {i} beyond a tie",
                &tw[..5]
            );
        }
    }
    println!("{what}: max |diff| / max |expected| = {worst:.1e} (bound {rel:.0e})");
}

/// Initialises `engine` for `config` and loads its model from the file.
fn loaded(mut engine: Box<dyn Framework>, config: &ModelConfig) -> (Box<dyn Framework>, ModelInfo) {
    engine
        .init(&EngineConfig {
            intra_op_threads: config.intra_op_threads,
        })
        .unwrap_or_else(|e| panic!("{}: {e}", engine.name()));
    let info = engine.load_model(&config.model_path).unwrap();
    check_info(&info, config);
    (engine, info)
}

/// What the engine found in the model agrees with config.toml.
fn check_info(info: &ModelInfo, config: &ModelConfig) {
    assert_eq!(info.input_name, config.input.name);
    assert_eq!(info.input_shape, config.input.shape);
    assert_eq!(info.output_name, config.output.name);
    assert_eq!(info.output_shape, config.output.shape);
}

fn run(engine: &mut dyn Framework, input: &[f32], batch: usize, classes: usize) -> Vec<f32> {
    let mut output = vec![f32::NAN; batch * classes];
    engine
        .infer_batch(input, batch, &mut output)
        .unwrap_or_else(|e| panic!("{} batch {batch}: {e}", engine.name()));
    output
}

/// Batch 8 at once, then each sample as a batch of 1. `rel`: the tolerance,
/// `None` for the one `check.json` states (1e-4: ONNX Runtime here vs ONNX
/// Runtime in Python).
fn matches_reference(engine: Box<dyn Framework>, name: &str, rel: Option<f32>) {
    let config = config(name);
    let reference = reference(&config);
    let rel = rel.unwrap_or(reference.rel);
    let (mut engine, info) = loaded(engine, &config);
    let (per_in, classes) = (info.input_elems(), info.output_elems());
    engine.configure_batch(BATCH).unwrap();
    let what = format!("{name} on {}", engine.name());

    let got = run(&mut *engine, &reference.input, BATCH, classes);
    assert_close(
        &format!("{what}, batch {BATCH}"),
        &got,
        &reference.output,
        rel,
    );

    let mut one_by_one = Vec::with_capacity(got.len());
    for n in 0..BATCH {
        one_by_one.extend(run(
            &mut *engine,
            &reference.input[n * per_in..(n + 1) * per_in],
            1,
            classes,
        ));
    }
    assert_close(
        &format!("{what}, batch 1"),
        &one_by_one,
        &reference.output,
        rel,
    );

    // Sizes the engine does not take.
    assert!(engine
        .infer_batch(
            &reference.input,
            BATCH + 1,
            &mut vec![0.0; (BATCH + 1) * classes]
        )
        .is_err());
    assert!(engine
        .infer_batch(
            &reference.input[1..],
            BATCH,
            &mut vec![0.0; BATCH * classes]
        )
        .is_err());
    engine.deinit();
}

#[test]
fn onnxruntime_matches_the_reference_squeezenet() {
    matches_reference(Box::new(OnnxRuntime::new()), "squeezenet", None);
}

#[test]
fn onnxruntime_matches_the_reference_resnet50() {
    matches_reference(Box::new(OnnxRuntime::new()), "resnet50", None);
}

/// tract vs ONNX Runtime: their kernels sum in other orders (tract tiles its
/// own matmuls, ORT uses MLAS with NCHWc convolutions), and the float32
/// rounding differences grow with depth. Measured: 5.5e-6 on squeezenet,
/// 9.4e-5 on resnet50, too close to check.json's 1e-4 to hold on every CPU.
const TRACT_REL: f32 = 1e-3;

#[test]
fn tract_matches_the_reference_squeezenet() {
    matches_reference(Box::new(Tract::new()), "squeezenet", Some(TRACT_REL));
}

#[test]
fn tract_with_a_plan_per_batch_size_matches_the_reference_squeezenet() {
    let engine = Tract::with_batching(TractBatching::PerSize);
    matches_reference(Box::new(engine), "squeezenet", Some(TRACT_REL));
}

#[test]
fn tract_matches_the_reference_resnet50() {
    matches_reference(Box::new(Tract::new()), "resnet50", Some(TRACT_REL));
}

/// `link_model` from bytes in memory gives the same output, bit for bit, as
/// `load_model` from the file.
fn link_equals_load(kind: EngineKind, name: &str) {
    let config = config(name);
    let reference = reference(&config);
    let threads = EngineConfig {
        intra_op_threads: config.intra_op_threads,
    };
    let (mut from_file, info) = loaded(engine_for(kind).unwrap(), &config);
    let bytes = std::fs::read(&config.model_path).unwrap();
    let mut from_memory = engine_for(kind).unwrap();
    from_memory.init(&threads).unwrap();
    let linked = from_memory.link_model(&bytes).unwrap();
    drop(bytes);
    assert_eq!(linked, info);
    from_file.configure_batch(BATCH).unwrap();
    from_memory.configure_batch(BATCH).unwrap();
    let classes = info.output_elems();
    let a = run(&mut *from_file, &reference.input, BATCH, classes);
    let b = run(&mut *from_memory, &reference.input, BATCH, classes);
    assert!(a == b, "{name} on {kind}: link_model and load_model differ");
}

#[test]
fn onnxruntime_link_model_equals_load_model() {
    link_equals_load(EngineKind::OnnxRuntime, "squeezenet");
}

#[test]
fn tract_link_model_equals_load_model() {
    link_equals_load(EngineKind::Tract, "squeezenet");
}

/// RGB u8 images normalised with config.toml's mean/std, as the input pool
/// does, give the outputs `make models` computed from them.
#[test]
fn rgb_images_normalised_with_the_config_match_the_reference() {
    let config = config("squeezenet");
    let InputFormat::RgbU8Hwc { mean, std } = config.input.format else {
        panic!("squeezenet's config.toml should say format = \"rgb_u8_hwc\"");
    };
    let reference = reference(&config);
    let [c, h, w] = config.input.shape;
    let per_image = c * h * w;
    assert_eq!(reference.input_u8.len(), BATCH * per_image);
    assert_eq!(config.request_bytes() as usize, per_image);
    let mut input = vec![0.0f32; BATCH * per_image];
    for n in 0..BATCH {
        for y in 0..h {
            for x in 0..w {
                for ch in 0..c {
                    let byte = reference.input_u8[n * per_image + (y * w + x) * c + ch];
                    // Each step rounded to f32, as check.json says.
                    let v = (f32::from(byte) / 255.0 - mean[ch]) / std[ch];
                    input[n * per_image + (ch * h + y) * w + x] = v;
                }
            }
        }
    }
    let (mut engine, info) = loaded(Box::new(OnnxRuntime::new()), &config);
    engine.configure_batch(BATCH).unwrap();
    let got = run(&mut *engine, &input, BATCH, info.output_elems());
    assert_close(
        "squeezenet from u8",
        &got,
        &reference.output_from_u8,
        reference.rel,
    );
}

/// CPU time of the threads ONNX Runtime started from the calling thread:
/// Linux threads inherit their creator's name, and the test harness names
/// each test's thread after the test.
fn pool_threads_cpu() -> Duration {
    let me = std::fs::read_link("/proc/thread-self").unwrap();
    let my_tid = me.file_name().unwrap().to_owned();
    let my_name = std::fs::read_to_string("/proc/thread-self/comm").unwrap();
    let mut total = 0;
    for task in std::fs::read_dir("/proc/self/task").unwrap() {
        let task = task.unwrap().path();
        let name = std::fs::read_to_string(task.join("comm")).unwrap_or_default();
        let stat = std::fs::read_to_string(task.join("schedstat")).unwrap_or_default();
        if name == my_name && task.file_name() != Some(my_tid.as_os_str()) {
            total += stat
                .split_whitespace()
                .next()
                .map_or(0, |ns| ns.parse().unwrap());
        }
    }
    Duration::from_nanos(total)
}

/// With 2 intra-op threads ONNX Runtime starts one pool thread. Between
/// batches it must block, not spin. Measured here (batches 10 ms apart): the
/// pool thread used about 0.5x the batches' wall time of CPU as configured,
/// and 1.4-2.3x with ORT's default (spinning allowed): it spun through the
/// gaps.
#[test]
fn onnxruntime_pool_threads_do_not_spin_between_batches() {
    let mut config = config("squeezenet");
    config.intra_op_threads = 2;
    let reference = reference(&config);
    let mut engine = loaded(Box::new(OnnxRuntime::new()), &config).0;
    engine.configure_batch(1).unwrap();
    let input = &reference.input[..config.input.elems()];
    let mut output = vec![0.0; config.output.num_classes];
    let before = pool_threads_cpu();
    let mut inferring = Duration::ZERO;
    for _ in 0..20 {
        let t = Instant::now();
        engine.infer_batch(input, 1, &mut output).unwrap();
        inferring += t.elapsed();
        std::thread::sleep(Duration::from_millis(10));
    }
    let pool = pool_threads_cpu() - before;
    println!("pool thread: {pool:?} of CPU around {inferring:?} of batches");
    // The pool thread can work only while a batch runs.
    assert!(
        pool <= inferring,
        "ONNX Runtime's pool thread used {pool:?} of CPU around {inferring:?} of batches: it spins"
    );
}

#[test]
fn the_repository_loads() {
    let dir = models_dir();
    assert!(
        dir.is_dir(),
        "{} does not exist: run `make models` first",
        dir.display()
    );
    let models = repository(&dir).unwrap_or_else(|e| panic!("{e}"));
    let names: Vec<&str> = models.iter().map(|m| m.name.as_str()).collect();
    for name in ["squeezenet", "resnet50"] {
        assert!(
            names.contains(&name),
            "{name} missing from {names:?}: run `make models`"
        );
    }
    for m in &models {
        assert!(m.model_path.is_file(), "{}", m.model_path.display());
    }
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

/// Median latency of `batch` inputs through each engine, which take turns
/// (one run each) so that they share whatever else loads the machine.
fn latencies(
    engines: &mut [Box<dyn Framework>],
    input: &[f32],
    batch: usize,
    classes: usize,
) -> Vec<Duration> {
    let mut output = vec![0.0f32; batch * classes];
    let mut samples = vec![Vec::new(); engines.len()];
    for engine in engines.iter_mut() {
        engine.infer_batch(input, batch, &mut output).unwrap();
    }
    // At least 5 runs each, at most 50, 4 s.
    let start = Instant::now();
    while samples[0].len() < 5
        || (start.elapsed() < Duration::from_secs(4) && samples[0].len() < 50)
    {
        for (engine, samples) in engines.iter_mut().zip(&mut samples) {
            let t = Instant::now();
            engine.infer_batch(input, batch, &mut output).unwrap();
            samples.push(t.elapsed());
        }
    }
    samples.into_iter().map(median).collect()
}

#[test]
#[ignore = "measurement: cargo test --release -p kp-if --test engines -- --ignored --nocapture latency"]
fn latency_onnxruntime_vs_tract() {
    println!("median latency in ms, 1 intra-op thread; the engines take turns, one run each");
    println!(
        "{:<12} {:>6} {:>12} {:>14} {:>14}",
        "model", "batch", "onnxruntime", "tract split", "tract per-size"
    );
    for name in ["squeezenet", "resnet50"] {
        let mut config = config(name);
        config.intra_op_threads = 1;
        let reference = reference(&config);
        let per_in = config.input.elems();
        let classes = config.output.num_classes;
        let mut engines = vec![
            loaded(Box::new(OnnxRuntime::new()), &config).0,
            loaded(Box::new(Tract::new()), &config).0,
            loaded(
                Box::new(Tract::with_batching(TractBatching::PerSize)),
                &config,
            )
            .0,
        ];
        for (engine, label) in
            engines
                .iter_mut()
                .zip(["onnxruntime", "tract split", "tract per-size"])
        {
            let t = Instant::now();
            engine.configure_batch(BATCH).unwrap();
            println!(
                "{name}: {label} configured for batches up to {BATCH} in {:.0?}",
                t.elapsed()
            );
        }
        for batch in [1, BATCH] {
            let input = &reference.input[..batch * per_in];
            let ms: Vec<f64> = latencies(&mut engines, input, batch, classes)
                .iter()
                .map(|d| d.as_secs_f64() * 1e3)
                .collect();
            println!(
                "{name:<12} {batch:>6} {:>12.2} {:>14.2} {:>14.2}",
                ms[0], ms[1], ms[2]
            );
        }
    }
}

/// `engine = "cudnn"` on a machine without a GPU path: the engine is made,
/// and `init` refuses with what is missing (no panic, no CPU fallback); on
/// a GPU machine it opens the device.
#[test]
fn the_cudnn_engine_without_a_gpu_refuses_at_init_with_what_is_missing() {
    let mut e = engine_for(EngineKind::Cudnn).unwrap();
    assert_eq!(e.name(), "cudnn");
    match e.init(&EngineConfig {
        intra_op_threads: 1,
    }) {
        Ok(()) => {}
        Err(libml::engine::EngineError::Library(msg)) => assert!(
            [
                "no CUDA driver found",
                "NVRTC missing",
                "no GPU",
                "cuDNN missing",
                "cuBLAS missing"
            ]
            .iter()
            .any(|p| msg.starts_with(p)),
            "{msg}"
        ),
        Err(other) => panic!("expected a library error, got {other}"),
    }
    e.deinit();
}

/// `engine = "onnxruntime-cuda"` with the CPU build of ONNX Runtime that
/// `make setup` installs: `init` refuses and says why (no CUDA execution
/// provider in that library) instead of running on the CPU.
#[test]
fn onnxruntime_cuda_on_a_cpu_build_is_refused_at_init() {
    let mut e = engine_for(EngineKind::OnnxRuntimeCuda).unwrap();
    assert_eq!(e.name(), "onnxruntime-cuda");
    match e.init(&EngineConfig {
        intra_op_threads: 1,
    }) {
        Err(libml::engine::EngineError::Library(msg)) => {
            assert!(msg.contains("no CUDA execution provider"), "{msg}");
            assert!(msg.contains("ORT_DYLIB_PATH"), "{msg}");
        }
        other => panic!("expected the CPU build to be refused, got {other:?}"),
    }
    e.deinit();
}

/// The in-place input path (`attach_input_pool` / `infer_slots`) on the
/// engines that can run here: the CPU engines take no pool (the runtime's
/// batch reaches them as host memory, read in place when its slots are
/// adjacent) and keep raw images out of their pools; `onnxruntime-cuda`
/// and `cudnn`, which gather on the GPU, normalise raw images and refuse
/// the in-place path, with what is missing, until a model is loaded on a
/// GPU.
#[test]
fn only_gpu_engines_read_the_pool_in_place_and_they_say_what_is_missing() {
    let cfg = config("squeezenet");
    let layout = libml::pool::InputLayout::for_model(&cfg).unwrap();
    let pool = libml::pool::InputPool::on_heap(4, layout.slot_elems());
    let location = pool.location(&layout).unwrap();
    for kind in [EngineKind::OnnxRuntime, EngineKind::Tract] {
        let (mut e, info) = loaded(engine_for(kind).unwrap(), &cfg);
        e.configure_batch(2).unwrap();
        assert!(!e.normalises_images(), "{}", e.name());
        e.attach_input_pool(location).unwrap();
        assert!(!e.reads_input_pool(), "{}", e.name());
        let mut out = vec![0.0; 2 * info.output_elems()];
        let err = e.infer_slots(&[0, 1], &mut out).unwrap_err();
        assert!(err.to_string().contains("reads no input pool"), "{err}");
        e.detach_input_pool();
        e.deinit();
    }
    for kind in [EngineKind::OnnxRuntimeCuda, EngineKind::Cudnn] {
        let mut e = engine_for(kind).unwrap();
        assert!(e.normalises_images(), "{}", e.name());
        let err = e.attach_input_pool(location).unwrap_err();
        assert!(
            matches!(err, libml::engine::EngineError::Order(_)),
            "{}: {err}",
            e.name()
        );
        assert!(!e.reads_input_pool());
        let mut out = vec![0.0; 1000];
        assert!(matches!(
            e.infer_slots(&[0], &mut out),
            Err(libml::engine::EngineError::Order(_))
        ));
        e.deinit();
    }
}
