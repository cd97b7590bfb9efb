//! `kp-if`: an inference function — one model, one device share — as a DPDK
//! secondary process of a running if-manager.
//!
//! `kp-if --model models/squeezenet/config.toml --control ENDPOINT -- EAL`
//!
//! Start-up: load the model into its engine (ONNX Runtime or tract, with the
//! configured intra-op threads), attach to the if-manager's shared memory
//! (`--proc-type secondary`, same `--file-prefix`, a distinct lcore id),
//! register the IF's ring and say `ready`; then serve until SIGINT/SIGTERM
//! (or `--exit-when-idle`), say `goodbye`, print the final report as one
//! JSON object and leave no hugepage memory behind.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Parser;
use dpdk::{Eal, Mempool, ProcessType, Ring};
use libml::batching::{BatchConfig, BatchPolicy};
use libml::engine::{engine_for, EngineConfig};
use libml::model::{EngineKind, InputFormat, ModelConfig};
use libml::names;
use libml::pool::{InputLayout, InputPool};
use libml::reassembly::{Reassembler, ReassemblerConfig};
use libml::runtime::control::ControlClient;
use libml::runtime::{serve, Answerer, RuntimeConfig};
use libml::wire::IfId;
use serde_json::json;

#[derive(Debug, Parser)]
#[command(
    name = "kp-if",
    version,
    about = "A kneepoint inference function (DPDK secondary process)"
)]
struct Args {
    /// The model's config.toml in the model repository.
    #[arg(long)]
    model: PathBuf,
    /// The if-manager's control socket (register, ready, goodbye). Without
    /// it the ring must have been registered with `if-manager --if`.
    #[arg(long)]
    control: Option<String>,
    /// Serve under this if_id instead of the model's.
    #[arg(long)]
    if_id: Option<u16>,
    /// Size of the IF's fragment ring when registering it.
    #[arg(long)]
    ring_size: Option<u32>,
    /// Requests in flight (reassembling or waiting for inference): the input
    /// pool has this many slots. 64 as GSLICE.
    #[arg(long, default_value_t = 64)]
    capacity: usize,
    /// Largest batch.
    #[arg(long, default_value_t = 32)]
    max_batch: usize,
    /// Latency objective in ms (default: the model's).
    #[arg(long)]
    slo_ms: Option<f64>,
    /// Engine intra-op threads (default: the model's).
    #[arg(long)]
    threads: Option<usize>,
    /// CPU cores of this IF's share (`0-3,6`): the engine's thread pool and
    /// the inference thread run only there. The fragment thread is the EAL
    /// lcore, pinned by `--lcores` (give it a CPU of the same set). Default:
    /// wherever the process may run.
    #[arg(long, value_parser = parse_cores)]
    cores: Option<Cores>,
    /// Engine (default: the model's).
    #[arg(long, value_parser = ["onnxruntime", "tract"])]
    engine: Option<String>,
    /// Reassembly timeout in ms: a request not complete by then is answered
    /// INCOMPLETE.
    #[arg(long, default_value_t = 100)]
    reassembly_timeout_ms: u64,
    /// Exit once no fragment arrived for this many seconds and nothing is in
    /// flight (offline replay).
    #[arg(long)]
    exit_when_idle: Option<f64>,
    /// Never sleep when idle.
    #[arg(long)]
    busy_poll: bool,
    /// Publish telemetry (one JSON message per second, plus each
    /// under/over-provisioning report) on a ZeroMQ PUB socket bound here.
    #[arg(long)]
    telemetry: Option<String>,
    /// Also write the final report to this file.
    #[arg(long)]
    stats_json: Option<PathBuf>,
    /// DPDK EAL arguments (after `--`): `--proc-type secondary`, the
    /// if-manager's `--file-prefix`, a distinct `--lcores ID@CPU`.
    #[arg(last = true)]
    eal: Vec<String>,
}

/// A CPU list (a newtype so clap takes it as one value).
#[derive(Clone, Debug)]
struct Cores(Vec<usize>);

fn parse_cores(s: &str) -> Result<Cores, String> {
    dpdk::affinity::parse_cpu_list(s).map(Cores)
}

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kp-if: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: Args) -> Result<()> {
    let mut model = ModelConfig::load(&args.model)
        .with_context(|| format!("loading {}", args.model.display()))?;
    if let Some(id) = args.if_id {
        model.if_id = IfId(id);
    }
    if let Some(slo) = args.slo_ms {
        model.slo = Duration::from_secs_f64(slo / 1000.0);
    }
    if let Some(t) = args.threads {
        model.intra_op_threads = t;
    }
    if let Some(e) = &args.engine {
        model.engine = if e == "tract" {
            EngineKind::Tract
        } else {
            EngineKind::OnnxRuntime
        };
    }
    let [c, h, w] = model.input.shape;
    let layout = match &model.input.format {
        InputFormat::RgbU8Hwc { mean, std } => {
            if c != 3 {
                bail!("rgb_u8_hwc needs 3 channels, the model has {c}");
            }
            InputLayout::rgb_u8_hwc(h, w, *mean, *std)?
        }
        InputFormat::F32Nchw => InputLayout::f32_nchw(c, h, w)?,
    };

    // Pinned before the engine exists: its thread pool inherits the mask.
    if let Some(Cores(cores)) = &args.cores {
        dpdk::affinity::set_current_thread_cpus(cores)
            .with_context(|| format!("pinning to cores {cores:?}"))?;
    }
    // The engine first: a model that cannot load should fail before we
    // attach to anything.
    let mut engine = engine_for(model.engine)?;
    engine.init(&EngineConfig {
        intra_op_threads: model.intra_op_threads.max(1),
    })?;
    let info = engine.load_model(&model.model_path)?;
    if info.input_elems() != layout.slot_elems() {
        bail!(
            "model input {:?} has {} values, the configured input {} x {} x {} has {}",
            info.input_shape,
            info.input_elems(),
            c,
            h,
            w,
            layout.slot_elems()
        );
    }
    let max_batch = args.max_batch.clamp(1, args.capacity);
    engine.configure_batch(max_batch)?;

    let mut argv = vec!["kp-if".to_string()];
    argv.extend(args.eal.iter().cloned());
    let eal = Eal::init(&argv).context("DPDK EAL initialisation (secondary)")?;
    if eal.process_type() != ProcessType::Secondary {
        bail!("kp-if must run as a DPDK secondary process (--proc-type secondary)");
    }
    let result = attach_and_serve(
        &args,
        &model,
        &layout,
        max_batch,
        info.output_elems(),
        &mut *engine,
        &eal,
    );
    engine.deinit();
    let report = result?;
    eal.cleanup().context("DPDK cleanup")?;

    let text = serde_json::to_string(&report)?;
    println!("{text}");
    if let Some(p) = &args.stats_json {
        std::fs::write(p, format!("{text}\n"))
            .with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(())
}

fn attach_and_serve(
    args: &Args,
    model: &ModelConfig,
    layout: &InputLayout,
    max_batch: usize,
    output_elems: usize,
    engine: &mut dyn libml::engine::Framework,
    eal: &Eal,
) -> Result<serde_json::Value> {
    let control = args
        .control
        .as_deref()
        .map(ControlClient::connect)
        .transpose()
        .map_err(anyhow::Error::msg)?;
    let ring_name = match &control {
        Some(c) => c
            .register(model.if_id, args.ring_size)
            .map_err(anyhow::Error::msg)?,
        None => names::if_ring(model.if_id),
    };
    let ring = Ring::lookup(&ring_name).with_context(|| format!("looking up ring {ring_name}"))?;
    let mbufs = Mempool::lookup(names::MEMPOOL).context("looking up the if-manager's mbuf pool")?;
    let tx = Ring::lookup(names::TX_RING).context("looking up the TX ring")?;
    let answerer = Answerer::new(mbufs, tx);

    let mut pool = InputPool::in_memzone(
        &names::input_pool(model.if_id, std::process::id()),
        args.capacity,
        layout.slot_elems(),
        eal.socket_id(),
    )?;
    let mut rcfg = ReassemblerConfig::new(model.request_bytes());
    rcfg.capacity = args.capacity;
    rcfg.timeout_ns = args.reassembly_timeout_ms * 1_000_000;
    rcfg.answered_ttl_ns = rcfg.answered_ttl_ns.max(4 * rcfg.timeout_ns);
    let mut reassembler = Reassembler::new(rcfg)?;
    let mut bcfg = BatchConfig::new(model.slo.as_nanos() as u64);
    bcfg.max_batch = max_batch;
    let mut policy = BatchPolicy::new(bcfg)?;

    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone()).context("installing signal handlers")?;
    }
    if let Some(c) = &control {
        c.ready(model.if_id).map_err(anyhow::Error::msg)?;
    }
    eprintln!(
        "kp-if: ready: {} as if {} on {} ({}, {} threads on cores {}, slo {:?}, capacity {}, max batch {})",
        model.name,
        model.if_id.0,
        ring_name,
        engine.name(),
        model.intra_op_threads,
        args.cores
            .as_ref()
            .map_or("any".to_string(), |c| format!("{:?}", c.0)),
        model.slo,
        args.capacity,
        max_batch
    );
    let publisher = args
        .telemetry
        .as_deref()
        .map(|endpoint| -> Result<_> {
            let ctx = zmq::Context::new();
            let sock = ctx.socket(zmq::PUB)?;
            sock.set_linger(0)?;
            sock.bind(endpoint)
                .with_context(|| format!("binding telemetry socket {endpoint}"))?;
            Ok((ctx, std::sync::Mutex::new(sock)))
        })
        .transpose()?;
    let (if_id, name) = (model.if_id.0, model.name.clone());
    let publish = |msg: &serde_json::Value| {
        if let Some((_, sock)) = &publisher {
            let mut msg = msg.clone();
            msg["if_id"] = json!(if_id);
            msg["model"] = json!(name);
            let sock = sock.lock().unwrap_or_else(|p| p.into_inner());
            // PUB never blocks; a slow subscriber loses messages, not us.
            let _ = sock.send(msg.to_string().as_bytes(), zmq::DONTWAIT);
        }
    };
    let cfg = RuntimeConfig {
        top_k: model.top_k,
        output_elems,
        max_batch,
        exit_when_idle: args.exit_when_idle.map(Duration::from_secs_f64),
        busy_poll: args.busy_poll,
        telemetry_every: Duration::from_secs(1),
        inference_cpus: args.cores.as_ref().map(|c| c.0.clone()),
    };
    let mut report = serve(
        &cfg,
        &ring,
        &answerer,
        layout,
        &mut pool,
        &mut reassembler,
        &mut policy,
        engine,
        &stop,
        publisher
            .as_ref()
            .map(|_| &publish as &(dyn Fn(&serde_json::Value) + Sync)),
    );
    if let Some(c) = &control {
        if let Err(e) = c.goodbye(model.if_id) {
            eprintln!("kp-if: goodbye: {e}");
        }
    }
    report["model"] = json!(model.name);
    report["if_id"] = json!(model.if_id.0);
    report["engine"] = json!(engine.name());
    report["pool"] = json!({
        "slots": pool.capacity(),
        "slot_bytes": pool.slot_elems() * 4,
        "hugepage_bytes": pool.reserved_bytes(),
    });
    Ok(report)
}
