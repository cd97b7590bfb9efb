//! `kp-engine-bench`: the engine alone, no platform around it — the limit an
//! inference function's throughput is compared with.
//!
//! `kp-engine-bench --model models/squeezenet/config.toml --batches 1,2,4,8`
//!
//! It loads the model exactly as `kp-if` does (same `config.toml` loading,
//! same [`engine_for`], same intra-op threads, `configure_batch` with the
//! largest batch, which also runs ORT's warm-up batch), then for each batch
//! size runs `infer_batch` back to back on seeded random images: a warm-up,
//! then until `--iterations` batches or `--seconds` have passed. The inputs
//! are random RGB `u8` images converted into the input layout by the same
//! code that converts fragments in `kp-if` (normalised `f32` NCHW), so the
//! values have the distribution real requests have.
//!
//! Prints one JSON object per batch size (JSON lines): per-batch latency
//! (median, p90, p99, min, mean, max, ms), images/s as `batch / median`
//! and as all images over all the time measured (the batches' own time
//! with `--gap-ms`), and the CPUs the process
//! was allowed to run on (pin it with `taskset -c CPU`, as
//! `scripts/bench-if.sh` does, to the CPU the IF's inference runs on).
//!
//! `--gap-ms G` idles G ms before each timed batch (`--gap-mode sleep`,
//! blocking as an IF's inference thread does between requests, or `spin`):
//! the cost of a batch that finds the engine cold, which is what every
//! batch is at low load, measured without the platform around it.
//!
//! `--cycle` runs the sizes of `--batches` in turn, one batch each, round
//! after round (`--batches 3,1 --cycle`: a batch of 3, one of 1, one of 3,
//! ...): what each size costs right after another, as in an IF whose batch
//! sizes vary, against what it costs back to back. Each line then also
//! says which size ran before (`after`) and the thread's CPU time per
//! batch (`cpu_ms`), so that a batch that runs slower after another one
//! shows whether the extra was work or waiting.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;
use kp_if::{engine_for, EngineOverrides};
use kp_schema::model::{InputFormat, ModelConfig};
use libml::engine::EngineConfig;
use libml::pool::InputLayout;
use serde_json::json;

#[derive(Debug, Parser)]
#[command(
    name = "kp-engine-bench",
    version,
    about = "Latency and images/s of the inference engine alone, per batch size"
)]
struct Args {
    /// The model's config.toml in the model repository.
    #[arg(long)]
    model: PathBuf,
    /// Batch sizes to measure, in this order.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8")]
    batches: Vec<usize>,
    /// Engine and threads (default: the model's, as kp-if).
    #[command(flatten)]
    engine: EngineOverrides,
    /// The largest batch the engine is configured for (default: the
    /// largest of --batches; give kp-if's --max-batch to match it exactly).
    #[arg(long)]
    max_batch: Option<usize>,
    /// Un-timed batches before measuring each batch size.
    #[arg(long, default_value_t = 3)]
    warmup: u64,
    /// Stop measuring a batch size after this many batches.
    #[arg(long)]
    iterations: Option<u64>,
    /// Stop measuring a batch size after this long (seconds), once at least
    /// --min-iterations batches ran. Default 5 unless --iterations is given.
    #[arg(long)]
    seconds: Option<f64>,
    /// Batches measured per batch size at least, whatever --seconds says.
    #[arg(long, default_value_t = 5)]
    min_iterations: u64,
    /// Seed of the random images.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Idle this long (milliseconds) before each timed batch, as an IF does
    /// between requests at low load: the cost of a *cold* batch. 0 runs the
    /// batches back to back.
    #[arg(long, default_value_t = 0.0)]
    gap_ms: f64,
    /// How to idle in the gap: `sleep` (the thread blocks and its CPU may go
    /// idle, as an IF's inference thread waits for work) or `spin` (the
    /// thread stays on its CPU, as a poll-mode thread would).
    #[arg(long, value_enum, default_value_t = GapMode::Sleep)]
    gap_mode: GapMode,
    /// Run the sizes of --batches in turn, one batch each, round after
    /// round, instead of one size after the other: each size follows the
    /// one before it in the list (the first follows the last). --iterations
    /// and --seconds then count rounds; one line per position of the list.
    #[arg(long)]
    cycle: bool,
}

/// How `--gap-ms` is spent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum GapMode {
    Sleep,
    Spin,
}

impl GapMode {
    fn name(self) -> &'static str {
        match self {
            GapMode::Sleep => "sleep",
            GapMode::Spin => "spin",
        }
    }

    /// Idles for `gap` the chosen way (nothing for a zero gap).
    fn idle(self, gap: Duration) {
        if gap.is_zero() {
            return;
        }
        match self {
            GapMode::Sleep => std::thread::sleep(gap),
            GapMode::Spin => {
                let until = Instant::now() + gap;
                while Instant::now() < until {
                    std::hint::spin_loop();
                }
            }
        }
    }
}

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kp-engine-bench: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: Args) -> Result<()> {
    if args.batches.is_empty() || args.batches.contains(&0) {
        bail!("--batches must list batch sizes >= 1");
    }
    if !(args.gap_ms.is_finite() && args.gap_ms >= 0.0) {
        bail!("--gap-ms must be a number of milliseconds >= 0");
    }
    let gap = Duration::from_secs_f64(args.gap_ms / 1e3);
    let mut model = ModelConfig::load(&args.model)
        .with_context(|| format!("loading {}", args.model.display()))?;
    args.engine.apply(&mut model);
    let layout = InputLayout::for_model(&model)?;
    let largest = *args.batches.iter().max().unwrap_or(&1);
    let max_batch = args.max_batch.unwrap_or(largest).max(largest);
    let (iterations, seconds) = match (args.iterations, args.seconds) {
        (None, None) => (None, Some(5.0)),
        other => other,
    };

    // As kp-if: init with the threads, load, configure for the largest batch.
    let mut engine = engine_for(model.engine)?;
    let threads = model.intra_op_threads.max(1);
    engine.init(&EngineConfig {
        intra_op_threads: threads,
    })?;
    let loaded = Instant::now();
    let info = engine.load_model(&model.model_path)?;
    let load_s = loaded.elapsed().as_secs_f64();
    if info.input_elems() != layout.slot_elems() {
        bail!(
            "model input {:?} has {} values, the configured input has {}",
            info.input_shape,
            info.input_elems(),
            layout.slot_elems()
        );
    }
    engine.configure_batch(max_batch)?;

    // max_batch distinct images, converted as kp-if converts fragments.
    let elems = layout.slot_elems();
    let mut rng = SplitMix64(args.seed);
    let mut input = vec![0f32; max_batch * elems];
    let mut bytes = vec![0u8; layout.request_bytes()];
    for slot in input.chunks_exact_mut(elems) {
        match model.input.format {
            InputFormat::RgbU8Hwc { .. } => {
                bytes.iter_mut().for_each(|b| *b = rng.next() as u8);
            }
            InputFormat::F32Nchw => {
                for v in bytes.chunks_exact_mut(4) {
                    // Uniform in [-1, 1).
                    let x = (rng.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0;
                    v.copy_from_slice(&x.to_le_bytes());
                }
            }
        }
        layout.write_fragment(&bytes, 0, slot);
    }
    let mut output = vec![0f32; max_batch * info.output_elems()];
    let cpus = allowed_cpus();

    // Each position of the list: its size, the size before it, its
    // batches' wall and CPU times (seconds), how long it was measured.
    #[derive(Default)]
    struct Measured {
        batch: usize,
        after: Option<usize>,
        wall: Vec<f64>,
        cpu: Vec<f64>,
        total_s: f64,
    }
    let mut timed = |batch: usize, m: &mut Measured| -> Result<()> {
        args.gap_mode.idle(gap);
        let cpu0 = kp_os::affinity::thread_cpu_ns();
        let t0 = Instant::now();
        let result = engine.infer_batch(
            &input[..batch * elems],
            batch,
            &mut output[..batch * info.output_elems()],
        );
        let wall = t0.elapsed().as_secs_f64();
        let cpu = kp_os::affinity::thread_cpu_ns().saturating_sub(cpu0) as f64 / 1e9;
        result.with_context(|| format!("batch {batch}"))?;
        m.wall.push(wall);
        m.cpu.push(cpu);
        Ok(())
    };
    let limit = seconds.map(Duration::from_secs_f64);
    let enough = |n: u64, start: Instant| {
        iterations.is_some_and(|it| n >= it)
            || (limit.is_some_and(|l| start.elapsed() >= l) && n >= args.min_iterations.max(1))
    };
    let sizes = &args.batches;
    let mut measured: Vec<Measured> = (0..sizes.len())
        .map(|i| Measured {
            batch: sizes[i],
            after: args
                .cycle
                .then(|| sizes[(i + sizes.len() - 1) % sizes.len()]),
            ..Measured::default()
        })
        .collect();
    let outcome = (|| -> Result<()> {
        if args.cycle {
            let mut scratch = Measured::default();
            for _ in 0..args.warmup {
                for &batch in sizes {
                    timed(batch, &mut scratch)?;
                }
            }
            let start = Instant::now();
            let mut rounds = 0;
            while !enough(rounds, start) {
                for m in measured.iter_mut() {
                    timed(m.batch, m)?;
                }
                rounds += 1;
            }
            let total_s = start.elapsed().as_secs_f64();
            for m in measured.iter_mut() {
                m.total_s = total_s;
            }
        } else {
            for m in measured.iter_mut() {
                let mut scratch = Measured::default();
                for _ in 0..args.warmup {
                    timed(m.batch, &mut scratch)?;
                }
                let start = Instant::now();
                while !enough(m.wall.len() as u64, start) {
                    timed(m.batch, m)?;
                }
                m.total_s = start.elapsed().as_secs_f64();
            }
        }
        Ok(())
    })();
    if let Err(e) = outcome {
        engine.deinit();
        return Err(e);
    }
    for m in measured {
        let batch = m.batch;
        let n = m.wall.len();
        // With a gap or in a cycle the wall clock also holds other time:
        // count the batches' own time only.
        let busy_s = if gap.is_zero() && !args.cycle {
            m.total_s
        } else {
            m.wall.iter().sum()
        };
        let mut samples = m.wall;
        samples.sort_by(f64::total_cmp);
        let mut cpu = m.cpu;
        cpu.sort_by(f64::total_cmp);
        let ms = |s: f64| (s * 1e6).round() / 1e3;
        let median = quantile(&samples, 0.5);
        let mut line = json!({
            "kind": "engine_bench",
            "model": model.name,
            "engine": engine.name(),
            "threads": threads,
            "max_batch": max_batch,
            "cpus_allowed": cpus,
            "batch": batch,
            "gap_ms": args.gap_ms,
            "gap_mode": args.gap_mode.name(),
            "iterations": n,
            "seconds": (m.total_s * 1e3).round() / 1e3,
            "latency_ms": {
                "median": ms(median),
                "p90": ms(quantile(&samples, 0.9)),
                "p99": ms(quantile(&samples, 0.99)),
                "min": ms(samples[0]),
                "mean": ms(samples.iter().sum::<f64>() / n as f64),
                "max": ms(samples[n - 1]),
            },
            "ms_per_image_median": ms(median / batch as f64),
            "images_per_s_median": round1(batch as f64 / median),
            "images_per_s_total": round1((batch * n) as f64 / busy_s),
            "model_load_s": (load_s * 1e3).round() / 1e3,
        });
        if let Some(after) = m.after {
            line["after"] = json!(after);
            line["cpu_ms"] = json!({
                "median": ms(quantile(&cpu, 0.5)),
                "p90": ms(quantile(&cpu, 0.9)),
            });
        }
        println!("{line}");
    }
    engine.deinit();
    Ok(())
}

/// Nearest-rank quantile of sorted, non-empty `v`.
fn quantile(v: &[f64], q: f64) -> f64 {
    let rank = (q * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}

fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

/// The `Cpus_allowed_list` of this process (e.g. "1" under `taskset -c 1`).
fn allowed_cpus() -> String {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
                .map(|v| v.trim().to_string())
        })
        .unwrap_or_default()
}

/// A small seeded generator (SplitMix64): reproducible inputs without a
/// dependency.
#[derive(Debug)]
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}
