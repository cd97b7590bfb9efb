//! `kp-gpu-check`: what `make gpu-check` runs on a machine with a GPU.
//!
//! 1. The libraries and the device (on a machine without them: a clear
//!    message and exit status 2, in well under a second).
//! 2. Pinned registration of an input pool (64 MiB, 2 MiB-aligned, as the
//!    IF's hugepage pool is) with PORTABLE | DEVICEMAP.
//! 3. The gather kernel on batches of 1..32 requests scattered over the
//!    pool (shuffled slots), `rgb_u8_hwc` 224×224 and `f32_nchw`, against
//!    the CPU reference of the same descriptors: bit for bit.
//! 4. The gather's bandwidth against a plain pinned host→device copy of
//!    the same bytes (`cuMemcpyHtoDAsync`), medians of CUDA-event timings
//!    over `--reps` runs each, in the same run (target: ≥ 0.9×).
//!
//! 5. With `--models DIR`: every `DIR/<name>/model.onnx` planned by kp-plan
//!    and run by the `cudnn` engine (kp-engine-cudnn's `GpuPlan`) at batch
//!    2 against the plan's CPU reference backend (which `make test` holds
//!    against ONNX Runtime): same top-5, max difference at most 1e-3 of the
//!    largest score; the input and the GPU's output are written under
//!    `--out/engine/<name>/` for scripts/gpu_check_ort.py to hold against
//!    the machine's own ONNX Runtime; then the latency per batch size
//!    (1, 2, 4, ... `--max-batch`; median and p90 of `--reps` runs, input
//!    copy and output read-back included, and the GPU's own time by CUDA
//!    events). The engine replays a CUDA graph per batch size: its output
//!    must equal the eager steps' bit for bit; `--compare-eager` also
//!    times the eager steps. And the IF's in-place path:
//!    the same two requests in slots of a pinned pool registered by
//!    address, gathered on the device (`GpuPlan::run_gathered`), must give
//!    the same bits (for image models also from a pool of raw RGB bytes,
//!    normalised by the gather, against the CPU reference's normalisation);
//!    its latency at `--max-batch` against the copied batch goes to
//!    `engine_in_place.csv`.
//!
//! With `--knee` (one point of the knee sweep: scripts/gpu-knee.sh runs
//! one process per CUDA MPS percentage), 1, then only the latency sweep of
//! every model of `--models` (`--only` picks some), with p99, appended to
//! `--out/knee.csv` under this process's MPS percentage and the SMs the
//! driver says it may use.
//!
//! Writes `gather.csv` (and `engine.csv`) under `--out` and prints a
//! summary. Exit status: 0 all checks passed; 1 a check failed; 2 no GPU
//! path here.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{ensure, Context, Result};
use clap::Parser;
use kp_cuda::gather::{self, GatherShape};
use kp_cuda::{Gpu, PinnedRegion};
use kp_engine_cudnn::GpuPlan;
use kp_plan::{CpuBackend, Plan};

#[derive(Debug, Parser)]
#[command(
    name = "kp-gpu-check",
    version,
    about = "kneepoint's GPU path, checked and measured"
)]
struct Args {
    /// Where gather.csv goes.
    #[arg(long, default_value = "build/gpu-check")]
    out: PathBuf,
    /// Device ordinal.
    #[arg(long, default_value_t = 0)]
    device: usize,
    /// Timed runs per measurement (the median is reported).
    #[arg(long, default_value_t = 50)]
    reps: usize,
    /// A model repository to run through the cudnn engine.
    #[arg(long)]
    models: Option<PathBuf>,
    /// The largest batch of the engine's latency sweep.
    #[arg(long, default_value_t = 32)]
    max_batch: usize,
    /// Only these models of `--models` (comma-separated names).
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Also sweep every model with its steps enqueued one by one from the
    /// host (graphs off): `eager_median_ms` in engine.csv, the host's cost
    /// per step. Off by default: it doubles the sweep's time.
    #[arg(long)]
    compare_eager: bool,
    /// One point of the knee sweep (scripts/gpu-knee.sh runs one process
    /// per CUDA MPS percentage): no gather, no agreement check; the latency
    /// sweep of every model of `--models`, with p99, appended to
    /// `--out/knee.csv` under this process's MPS percentage
    /// (`CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`, 100 when unset) and the SMs
    /// the driver says it may use.
    #[arg(long, requires = "models")]
    knee: bool,
}

/// The pool: 64 MiB, like a small IF's hugepage pool.
const POOL_BYTES: usize = 64 << 20;
/// Hugepage size: the pool is aligned to it, as a memzone of 2 MiB pages is.
const HUGEPAGE: usize = 2 << 20;
const MEAN: [f32; 3] = [0.485, 0.456, 0.406];
const STD: [f32; 3] = [0.229, 0.224, 0.225];

fn main() -> ExitCode {
    let args = Args::parse();
    let t0 = Instant::now();
    let gpu = match Gpu::open(args.device) {
        Ok(gpu) => gpu,
        Err(e) => {
            eprintln!("kp-gpu-check: no GPU path here: {e}");
            eprintln!("kp-gpu-check: nothing was checked ({:.0?})", t0.elapsed());
            return ExitCode::from(2);
        }
    };
    match run(&args, &gpu) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kp-gpu-check: FAILED: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args, gpu: &Gpu) -> Result<()> {
    let info = gpu.info();
    println!(
        "device {}: {} (sm_{}{}), {:.1} GiB, {} SMs ({} available to this process), host pointer usable as is: {}",
        info.ordinal,
        info.name,
        info.compute_capability.0,
        info.compute_capability.1,
        info.total_mem as f64 / (1u64 << 30) as f64,
        info.sm_count,
        info.sms_available
            .map_or_else(|| "not reported".to_string(), |n| n.to_string()),
        info.host_pointer_usable
    );
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    if args.knee {
        let dir = args.models.as_deref().context("--knee needs --models")?;
        return knee(args, gpu, dir);
    }
    // A 2 MiB-aligned 64 MiB range inside a larger Vec: no unsafe needed.
    let mut backing = vec![0u8; POOL_BYTES + HUGEPAGE];
    let skip = backing.as_ptr().align_offset(HUGEPAGE);
    let pool = &mut backing[skip..skip + POOL_BYTES];
    let mut rng = 0x2545_f491_4f6c_dd1d_u64;
    for b in pool.iter_mut() {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        *b = rng as u8;
    }
    let t = Instant::now();
    let region = PinnedRegion::register(gpu, pool).context("registering the pool")?;
    println!(
        "pinned: {} MiB registered in {:.1} ms, device pointer {:#x}",
        POOL_BYTES >> 20,
        t.elapsed().as_secs_f64() * 1e3,
        region.device_ptr()
    );
    let kernel = kp_cuda::GatherKernel::compile(gpu).context("compiling the gather kernel")?;
    let stream = gpu.stream();
    let lut = stream
        .clone_htod(&gather::rgb_lut(MEAN, STD))
        .context("uploading the table")?;

    let csv_path = args.out.join("gather.csv");
    let mut csv = std::fs::File::create(&csv_path)?;
    writeln!(
        csv,
        "layout,batch,bytes,gather_ms_p50,copy_ms_p50,gather_gb_s,copy_gb_s,ratio,bit_exact"
    )?;
    let shapes = [
        (
            "rgb_u8_hwc",
            GatherShape::RgbU8Hwc {
                height: 224,
                width: 224,
            },
        ),
        (
            "f32_nchw",
            GatherShape::F32 {
                elems: 3 * 224 * 224,
            },
        ),
    ];
    let mut worst_ratio = f64::INFINITY;
    for (name, shape) in shapes {
        let req = shape.request_bytes() as usize;
        let slots = POOL_BYTES / req;
        for batch in [1usize, 2, 4, 8, 16, 32] {
            ensure!(batch <= slots, "a batch of {batch} does not fit the pool");
            // Slots in a shuffled order, as a busy IF's batches are.
            let mut order: Vec<usize> = (0..slots).collect();
            for i in (1..order.len()).rev() {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                order.swap(i, (rng % (i as u64 + 1)) as usize);
            }
            let host_descs: Vec<_> =
                gather::descriptors(order[..batch].iter().map(|s| (s * req) as u64)).collect();
            let descs = stream.clone_htod(&host_descs)?;
            let elems = batch * shape.request_elems() as usize;
            let mut out = stream.alloc_zeros::<f32>(elems)?;
            let descs = descs.as_view();
            let launch = |out: &mut kp_cuda::cudarc::driver::CudaSlice<f32>| {
                kernel.launch(
                    gpu,
                    &region,
                    &host_descs,
                    &descs,
                    shape,
                    &lut,
                    &mut out.as_view_mut(),
                )
            };
            launch(&mut out)?;
            let got = stream.clone_dtoh(&out)?;
            let mut want = vec![0.0f32; elems];
            let host_lut = gather::rgb_lut(MEAN, STD);
            gather::gather_cpu(region.as_slice(), &host_descs, shape, &host_lut, &mut want)?;
            let exact = same_bits(&got, &want);
            ensure!(
                exact,
                "{name} batch {batch}: the kernel and the CPU reference differ"
            );

            // Bandwidth: the gather vs a plain copy of the same bytes.
            let bytes = batch * req;
            let gather_ms = median_ms(gpu, args.reps, || {
                launch(&mut out).map_err(anyhow::Error::from)
            })?;
            // The plain copy reads the registered pool itself (pinned, so a
            // DMA at the bus's speed), the same number of bytes.
            let mut dst = stream.alloc_zeros::<u8>(bytes)?;
            let pinned_src = &region.as_slice()[..bytes];
            let copy_ms = median_ms(gpu, args.reps, || {
                stream
                    .memcpy_htod(pinned_src, &mut dst)
                    .map_err(anyhow::Error::from)
            })?;
            let gb = |ms: f64| bytes as f64 / (ms / 1e3) / 1e9;
            let ratio = copy_ms / gather_ms;
            worst_ratio = worst_ratio.min(ratio);
            println!(
                "{name:10} batch {batch:2}: {:7.2} MB  gather {gather_ms:7.3} ms ({:6.2} GB/s)  copy {copy_ms:7.3} ms ({:6.2} GB/s)  gather/copy {ratio:.2}  bit-exact",
                bytes as f64 / 1e6,
                gb(gather_ms),
                gb(copy_ms)
            );
            writeln!(
                csv,
                "{name},{batch},{bytes},{gather_ms:.4},{copy_ms:.4},{:.3},{:.3},{ratio:.3},{exact}",
                gb(gather_ms),
                gb(copy_ms)
            )?;
        }
    }
    drop(region);
    println!(
        "gather: every batch bit-exact against the CPU reference; worst bandwidth ratio to a plain pinned copy {worst_ratio:.2} (target >= 0.9); {}",
        csv_path.display()
    );
    match &args.models {
        Some(dir) => engines(args, dir),
        None => {
            println!("engine: no --models given, the cudnn engine was not checked");
            Ok(())
        }
    }
}

/// The models of `dir` (`<name>/model.onnx`), those of `--only` if given,
/// sorted.
fn model_names(args: &Args, dir: &Path) -> Result<Vec<String>> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok())
        .filter(|e| e.path().join("model.onnx").exists())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| args.only.is_empty() || args.only.contains(n))
        .collect();
    names.sort();
    ensure!(
        !names.is_empty(),
        "no <name>/model.onnx under {}{}",
        dir.display(),
        if args.only.is_empty() {
            String::new()
        } else {
            format!(" among {}", args.only.join(", "))
        }
    );
    Ok(names)
}

/// A deterministic input of `n` samples of `elems` values in [-2, 2).
fn sample_input(seed: u64, n: usize, elems: usize) -> Vec<f32> {
    let mut rng = 0x9e37_79b9_7f4a_7c15_u64 ^ seed;
    (0..n * elems)
        .map(|_| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            (rng >> 40) as f32 / (1u64 << 24) as f32 * 4.0 - 2.0
        })
        .collect()
}

/// One batch size of a latency sweep: milliseconds per batch, input copy
/// and output read-back included (wall clock); and the median of the
/// GPU's own time for it (CUDA events from the input copy to the last
/// step), which the difference shows host overhead against.
struct Latency {
    batch: usize,
    p50: f64,
    p90: f64,
    p99: f64,
    gpu_p50: f64,
}

/// Batches of 1, 2, 4, ... `--max-batch` of `sample` (one sample repeated)
/// through `gp`: one warm-up, then `--reps` timed runs each.
fn sweep(args: &Args, gp: &mut GpuPlan, sample: &[f32], po: usize) -> Result<Vec<Latency>> {
    let mut out = Vec::new();
    let mut b = 1;
    while b <= args.max_batch {
        let inp: Vec<f32> = sample
            .iter()
            .copied()
            .cycle()
            .take(b * sample.len())
            .collect();
        let mut res = vec![0.0f32; b * po];
        gp.run(&inp, b, &mut res)?;
        let mut ms = Vec::with_capacity(args.reps);
        let mut gpu_ms = Vec::with_capacity(args.reps);
        for _ in 0..args.reps.max(1) {
            let t = Instant::now();
            gp.run(&inp, b, &mut res)?;
            ms.push(t.elapsed().as_secs_f64() * 1e3);
            gpu_ms.push(gp.stats().last_batch_ns as f64 / 1e6);
        }
        ms.sort_by(f64::total_cmp);
        gpu_ms.sort_by(f64::total_cmp);
        let at = |q: f64| ms[((ms.len() as f64 * q) as usize).min(ms.len() - 1)];
        out.push(Latency {
            batch: b,
            p50: ms[ms.len() / 2],
            p90: at(0.9),
            p99: at(0.99),
            gpu_p50: gpu_ms[gpu_ms.len() / 2],
        });
        b *= 2;
    }
    Ok(out)
}

/// One point of the knee sweep: every model's latency sweep under this
/// process's MPS percentage, appended to `knee.csv`.
fn knee(args: &Args, gpu: &Gpu, dir: &Path) -> Result<()> {
    let names = model_names(args, dir)?;
    let pct = std::env::var("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE").unwrap_or_else(|_| "100".into());
    let info = gpu.info();
    let sms = info
        .sms_available
        .map_or_else(String::new, |n| n.to_string());
    let csv_path = args.out.join("knee.csv");
    let new = !csv_path.exists();
    let mut csv = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&csv_path)
        .with_context(|| format!("opening {}", csv_path.display()))?;
    if new {
        writeln!(
            csv,
            "mps_pct,sms_available,sm_count,model,batch,median_ms,p99_ms,images_per_s"
        )?;
    }
    for name in &names {
        let plan = Plan::load(&dir.join(name).join("model.onnx"))
            .with_context(|| format!("planning {name}"))?;
        let (pi, po) = (plan.input.elems(), plan.output.elems());
        let (g, dnn) = kp_engine_cudnn::open(args.device)?;
        let mut gp = GpuPlan::new(g, dnn, plan)?;
        gp.configure(args.max_batch)?;
        println!(
            "knee point: MPS {pct}% {name:16} steps: {}",
            gp.step_launch()
        );
        let sample = sample_input(name.len() as u64, 1, pi);
        let mut line = String::new();
        for l in sweep(args, &mut gp, &sample, po)? {
            writeln!(
                csv,
                "{pct},{sms},{},{name},{},{:.4},{:.4},{:.1}",
                info.sm_count,
                l.batch,
                l.p50,
                l.p99,
                l.batch as f64 / l.p50 * 1e3
            )?;
            line.push_str(&format!(
                " b{}:{:.0}/s",
                l.batch,
                l.batch as f64 / l.p50 * 1e3
            ));
        }
        println!("knee point: MPS {pct}% {name:16}{line}");
    }
    Ok(())
}

/// Every model of `dir` on the cudnn engine: agreement, then latency.
fn engines(args: &Args, dir: &Path) -> Result<()> {
    let names = model_names(args, dir)?;
    let csv_path = args.out.join("engine.csv");
    let mut csv = std::fs::File::create(&csv_path)?;
    writeln!(
        csv,
        "model,batch,median_ms,p90_ms,images_per_s,gpu_median_ms,eager_median_ms,eager_gpu_median_ms"
    )?;
    let mut in_place_csv = std::fs::File::create(args.out.join("engine_in_place.csv"))?;
    writeln!(
        in_place_csv,
        "model,batch,copied_median_ms,gathered_median_ms,same_bits"
    )?;
    let mut failed = Vec::new();
    for name in &names {
        // One model's error (a cuDNN status, an unsupported step) is
        // reported and the others still run: a first run on a new GPU
        // should say everything that fails, not only the first thing.
        let checked = check_model(args, dir, name, &mut csv, &mut in_place_csv);
        match checked {
            Ok(true) => {}
            Ok(false) => failed.push(name.clone()),
            Err(e) => {
                println!("{name:20} ERROR: {e:#}");
                failed.push(format!("{name} (error)"));
            }
        }
    }
    ensure!(
        failed.is_empty(),
        "the cudnn engine failed its check (disagreement, different in-place bits or an error) on: {}",
        failed.join(", ")
    );
    println!(
        "engine: all {} models agree with the CPU reference; {}",
        names.len(),
        csv_path.display()
    );
    Ok(())
}

/// One model on the cudnn engine: agreement with the CPU reference and
/// the in-place path (`Ok(false)` when either fails), then its latency
/// sweep, appended to the two CSVs.
fn check_model(
    args: &Args,
    dir: &Path,
    name: &String,
    csv: &mut std::fs::File,
    in_place_csv: &mut std::fs::File,
) -> Result<bool> {
    let t = Instant::now();
    let plan = Plan::load(&dir.join(name).join("model.onnx"))
        .with_context(|| format!("planning {name}"))?;
    let (pi, po) = (plan.input.elems(), plan.output.elems());
    let input = sample_input(name.len() as u64, 2, pi);
    let mut want = vec![0.0f32; 2 * po];
    CpuBackend::new(plan.clone(), 2).run(&input, 2, &mut want)?;
    let cpu_s = t.elapsed().as_secs_f64();
    let (gpu, dnn) = kp_engine_cudnn::open(args.device)?;
    let mut gp = GpuPlan::new(gpu, dnn, plan)?;
    let t = Instant::now();
    gp.configure(args.max_batch)?;
    let configure_s = t.elapsed().as_secs_f64();
    let launch = gp.step_launch();
    let mut got = vec![0.0f32; 2 * po];
    gp.run(&input, 2, &mut got)?;
    // The graphs must replay exactly what the eager steps compute.
    gp.set_graphs(false);
    let mut eager = vec![0.0f32; 2 * po];
    let eager_run = gp.run(&input, 2, &mut eager);
    gp.set_graphs(true);
    eager_run?;
    let graphs_same = same_bits(&got, &eager);
    let mut worst = 0.0f32;
    let mut same_top5 = true;
    for n in 0..2 {
        let (g, w) = (&got[n * po..(n + 1) * po], &want[n * po..(n + 1) * po]);
        let scale = w
            .iter()
            .fold(0.0f32, |m, v| m.max(v.abs()))
            .max(f32::MIN_POSITIVE);
        let diff = g
            .iter()
            .zip(w)
            .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
        worst = worst.max(diff / scale);
        same_top5 &= top5(g) == top5(w);
    }
    let in_place = in_place(args, &mut gp, &input, &got)?;
    let ok = worst <= 1e-3
        && same_top5
        && got.iter().all(|v| v.is_finite())
        && in_place.same_bits
        && graphs_same;
    let keep = args.out.join("engine").join(name);
    std::fs::create_dir_all(&keep)?;
    std::fs::write(keep.join("input_b2.f32"), bytes(&input))?;
    std::fs::write(keep.join("cudnn_b2.f32"), bytes(&got))?;
    println!(
        "{name:20} {} steps  agree: {}  (max diff {worst:.2e} of the largest score, top-5 {})  cpu reference {cpu_s:.1} s, configure 1..{} {configure_s:.1} s",
        gp.plan().steps.len(),
        if ok { "yes" } else { "NO" },
        if same_top5 { "same" } else { "DIFFERENT" },
        args.max_batch
    );
    println!(
        "{name:20} steps run as {launch}; eager steps give {}",
        if graphs_same {
            "the same bits"
        } else {
            "DIFFERENT bits"
        }
    );
    println!(
        "{name:20} in place (the IF's path: slots of a pinned pool gathered on the device): {}; batch {}: {:.3} ms gathered vs {:.3} ms copied ({:.2}x)",
        if in_place.same_bits { "same bits" } else { "DIFFERENT" },
        in_place.batch,
        in_place.gathered_ms,
        in_place.copied_ms,
        in_place.copied_ms / in_place.gathered_ms
    );
    writeln!(
        in_place_csv,
        "{name},{},{:.4},{:.4},{}",
        in_place.batch, in_place.copied_ms, in_place.gathered_ms, in_place.same_bits
    )?;
    // The engine as it runs (graphs when captured), then eager: the
    // difference is the host's cost per step.
    let fast = sweep(args, &mut gp, &input[..pi], po)?;
    let eager = if args.compare_eager {
        gp.set_graphs(false);
        let eager = sweep(args, &mut gp, &input[..pi], po);
        gp.set_graphs(true);
        Some(eager?)
    } else {
        None
    };
    let (mut line, mut gpu_line, mut eager_line) = (String::new(), String::new(), String::new());
    for (i, l) in fast.iter().enumerate() {
        let e = eager.as_ref().map(|e| &e[i]);
        let cell = |v: Option<f64>| v.map_or_else(String::new, |v| format!("{v:.4}"));
        writeln!(
            csv,
            "{name},{},{:.4},{:.4},{:.1},{:.4},{},{}",
            l.batch,
            l.p50,
            l.p90,
            l.batch as f64 / l.p50 * 1e3,
            l.gpu_p50,
            cell(e.map(|e| e.p50)),
            cell(e.map(|e| e.gpu_p50))
        )?;
        line.push_str(&format!(" b{}:{:.2}ms", l.batch, l.p50));
        gpu_line.push_str(&format!(" b{}:{:.2}ms", l.batch, l.gpu_p50));
        if let Some(e) = e {
            eager_line.push_str(&format!(" b{}:{:.2}ms", e.batch, e.p50));
        }
    }
    println!("{name:20} latency p50{line}");
    println!("{name:20} GPU time p50{gpu_line}");
    if eager.is_some() {
        println!("{name:20} eager p50{eager_line}");
    }
    Ok(ok)
}

/// Whether `a` and `b` hold the same bits, value by value (NaN payloads
/// and signed zeros included).
fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// What [`in_place`] found.
struct InPlace {
    same_bits: bool,
    batch: usize,
    gathered_ms: f64,
    copied_ms: f64,
}

/// The IF's in-place path ([`GpuPlan::run_gathered`], what the `cudnn`
/// engine's `infer_slots` runs): a 2 MiB-aligned pool of `--max-batch`
/// slots (at least 4) registered by address; the two requests of `input`
/// put in slots 3 and 1 and gathered from there must give `want` (the
/// contiguous run of the same input) bit for bit. Then the median of
/// `--reps` batches of `--max-batch` requests, slots in reverse order,
/// gathered, against the same batch copied from host memory.
fn in_place(args: &Args, gp: &mut GpuPlan, input: &[f32], want: &[f32]) -> Result<InPlace> {
    let pi = gp.plan().input.elems();
    let po = gp.plan().output.elems();
    let slots = args.max_batch.max(4);
    let mut backing = vec![0.0f32; slots * pi + HUGEPAGE / 4];
    let skip = backing.as_ptr().align_offset(HUGEPAGE);
    let pool = &mut backing[skip..skip + slots * pi];
    pool[3 * pi..4 * pi].copy_from_slice(&input[..pi]);
    pool[pi..2 * pi].copy_from_slice(&input[pi..2 * pi]);
    for s in (0..slots).filter(|s| *s != 1 && *s != 3) {
        pool[s * pi..(s + 1) * pi].copy_from_slice(&input[..pi]);
    }
    let slot_bytes = (pi * 4) as u64;
    let shape = GatherShape::F32 {
        elems: u32::try_from(pi)?,
    };
    // `backing` outlives the registration: detached below on every path.
    gp.attach_pool(
        pool.as_ptr() as usize,
        pool.len() * 4,
        shape,
        ([0.0; 3], [1.0; 3]),
    )?;
    let result = (|| -> Result<InPlace> {
        let mut got = vec![0.0f32; 2 * po];
        gp.run_gathered(&[3 * slot_bytes, slot_bytes], &mut got)?;
        let same_bits = same_bits(&got, want);
        let b = args.max_batch;
        let offsets: Vec<u64> = (0..b as u64).rev().map(|s| s * slot_bytes).collect();
        let mut out = vec![0.0f32; b * po];
        let gathered_ms = median_wall_ms(args.reps, || {
            gp.run_gathered(&offsets, &mut out)
                .map_err(anyhow::Error::from)
        })?;
        let copied: Vec<f32> = offsets
            .iter()
            .flat_map(|o| {
                let s = (*o / slot_bytes) as usize;
                pool[s * pi..(s + 1) * pi].iter().copied()
            })
            .collect();
        let copied_ms = median_wall_ms(args.reps, || {
            gp.run(&copied, b, &mut out).map_err(anyhow::Error::from)
        })?;
        Ok(InPlace {
            same_bits,
            batch: b,
            gathered_ms,
            copied_ms,
        })
    })();
    gp.detach_pool();
    let mut result = result?;
    if let &[3, h, w] = gp.plan().input.shape.as_slice() {
        result.same_bits &= raw_images(gp, h, w)?;
    }
    Ok(result)
}

/// A GPU IF's pool of an image model holds the raw bytes and the gather
/// normalises them: two random images in slots 2 and 0 of a u8 pool,
/// gathered, must give the bits of the CPU reference's normalisation of
/// the same bytes run contiguously.
fn raw_images(gp: &mut GpuPlan, h: usize, w: usize) -> Result<bool> {
    let req = h * w * 3;
    let po = gp.plan().output.elems();
    let mut backing = vec![0u8; 3 * req + HUGEPAGE];
    let skip = backing.as_ptr().align_offset(HUGEPAGE);
    let pool = &mut backing[skip..skip + 3 * req];
    let mut rng = 0x853c_49e6_748f_ea9b_u64;
    for b in pool.iter_mut() {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        *b = rng as u8;
    }
    let shape = GatherShape::RgbU8Hwc {
        height: u32::try_from(h)?,
        width: u32::try_from(w)?,
    };
    let offsets = [2 * req as u64, 0];
    let mut input = vec![0.0f32; 2 * req];
    let descs: Vec<_> = gather::descriptors(offsets).collect();
    gather::gather_cpu(pool, &descs, shape, &gather::rgb_lut(MEAN, STD), &mut input)?;
    let mut want = vec![0.0f32; 2 * po];
    gp.run(&input, 2, &mut want)?;
    // `backing` outlives the registration: detached below on every path.
    gp.attach_pool(pool.as_ptr() as usize, pool.len(), shape, (MEAN, STD))?;
    let mut got = vec![0.0f32; 2 * po];
    let result = gp.run_gathered(&offsets, &mut got);
    gp.detach_pool();
    result?;
    Ok(same_bits(&got, &want))
}

/// The median wall time of `reps` calls of `f` (after one warm-up), ms:
/// each call waits for the GPU.
fn median_wall_ms(reps: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    f()?;
    let mut ms = Vec::with_capacity(reps.max(1));
    for _ in 0..reps.max(1) {
        let t = Instant::now();
        f()?;
        ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
    ms.sort_by(f64::total_cmp);
    Ok(ms[ms.len() / 2])
}

fn top5(v: &[f32]) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..v.len()).collect();
    idx.sort_by(|&a, &b| v[b].total_cmp(&v[a]));
    idx.truncate(5);
    idx
}

fn bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// The median of `reps` runs of `f` on `gpu`'s stream, timed with CUDA
/// events, milliseconds.
fn median_ms(gpu: &Gpu, reps: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    use kp_cuda::cudarc::driver::sys::CUevent_flags;
    let stream = gpu.stream();
    let ctx = gpu.context();
    f()?; // warm-up
    let mut ms = Vec::with_capacity(reps);
    for _ in 0..reps.max(1) {
        let start = ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        let end = ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        start.record(stream)?;
        f()?;
        end.record(stream)?;
        end.synchronize()?;
        ms.push(f64::from(start.elapsed_ms(&end)?));
    }
    ms.sort_by(f64::total_cmp);
    Ok(ms[ms.len() / 2])
}
