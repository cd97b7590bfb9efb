//! `kp-if`: an inference function — one model, one device share — as a DPDK
//! secondary process of a running if-manager.
//!
//! `kp-if --model models/squeezenet/config.toml --control ENDPOINT -- EAL`
//!
//! Start-up: attach to the if-manager's shared memory (`--proc-type
//! secondary`, same `--file-prefix`, a distinct lcore id; first, because a
//! GPU engine's CUDA start-up reserves the addresses DPDK maps that memory
//! at), load the model into its engine (ONNX Runtime, tract, or a GPU
//! engine), register the IF's ring and say `ready`; then serve until SIGINT/SIGTERM
//! (or `--exit-when-idle`), say `goodbye`, print the final report as one
//! JSON object and leave no hugepage memory behind.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;
use dpdk::{Eal, Mempool, ProcessType, Ring, RingFlags};
use kp_if::{engine_for, EngineOverrides};
use kp_schema::messages::{IfMessage, IfStatus, Publication, Readiness, ReadyRole};
use kp_schema::model::ModelConfig;
use kp_wire::IfId;
use libml::batching::{BatchConfig, BatchPolicy};
use libml::engine::{EngineConfig, Framework, ModelInfo};
use libml::names;
use libml::pool::{InputLayout, InputPool};
use libml::reassembly::{Reassembler, ReassemblerConfig};
use libml::runtime::control::ControlClient;
use libml::runtime::handover::{IfControl, Ledger, Mode, ModeCell, TxBell};
use libml::runtime::succession::answer_command;
use libml::runtime::trace::RequestTrace;
use libml::runtime::{serve, Answerer, RuntimeConfig, Succession};
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
    /// Engine and threads (default: the model's).
    #[command(flatten)]
    engine: EngineOverrides,
    /// CPU cores of this IF's share (`0-3,6`): the engine's thread pool and
    /// the inference thread run only there. The fragment thread is the EAL
    /// lcore, pinned by `--lcores`: a CPU of the same set (what the
    /// orchestrator gives it), or the network side's core, where it then
    /// reassembles and converts off the engine's cores. Default: wherever
    /// the process may run.
    #[arg(long, value_parser = parse_cores)]
    cores: Option<Cores>,
    /// Where an RGB image is converted to the model's input: `network`, by
    /// the fragment thread as the bytes arrive (the design: the network
    /// side's core does it, the inference core only runs the engine), or
    /// `inference`, by the inference thread just before the engine (the
    /// fragment thread copies bytes only): all of the IF's per-request work
    /// on the inference core, as servers that preprocess in the model's
    /// process do. `auto` (the default): `inference` where the fragment
    /// thread's CPUs (`--lcores`) overlap `--cores` — converting there
    /// would write the model's input over the engine's caches while a batch
    /// runs (squeezenet: 0.90 of the engine alone against 0.96,
    /// docs/PERFORMANCE-JOURNAL.md, 2 December, seventh) — else `network`.
    /// GPU engines normalise on the device either way.
    #[arg(long, value_enum, default_value_t = ConvertOn::Auto)]
    convert_on: ConvertOn,
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
    /// Keep the idle inference thread spinning on its core for this long
    /// after its last batch, instead of dozing: a batch that follows a
    /// doze runs the engine slower (caches and the vCPU gone cold: after
    /// 50 ms asleep 35–45% slower than after 50 ms spinning, squeezenet on
    /// the AMD VM), and a complete request waits for the thread to wake
    /// (tens of µs). The inference core then stays 100% busy while traffic
    /// is recent, so give it only to an IF whose inference cores no other
    /// IF or the fragment thread shares; 0 (the default) never spins, and
    /// without a batch for this long the thread dozes again.
    #[arg(long, default_value_t = 0)]
    inference_spin_ms: u64,
    /// Start as a shadow: load the model, attach, then park (dequeue
    /// nothing) until told to `activate` on the `--listen` socket; the
    /// active IF of the same if_id keeps serving meanwhile.
    #[arg(long, requires = "listen")]
    standby: bool,
    /// How long a shadow starts under `SCHED_IDLE`, in ms: the EAL, the
    /// model's load and its warm-up batch run while the active serves,
    /// often on the same cores, and at the active's priority they take its
    /// CPU; under `SCHED_IDLE` they get only the CPU time nothing at normal
    /// priority wants. A shadow not parked by then goes on at nice
    /// +`--standby-nice`, so that a saturated machine still re-provisions
    /// (in well under the orchestrator's 60 s start timeout). Every thread
    /// gets the normal priority back before the shadow parks, so it takes
    /// over at full speed. Only where the priority can be raised back
    /// (root, `CAP_SYS_NICE`); 0 skips the idle part.
    #[arg(long, default_value_t = 5000)]
    standby_idle_ms: u64,
    /// How much a shadow lowers its CPU priority (nice) while it starts,
    /// once its `--standby-idle-ms` are over (or throughout, with
    /// `--standby-idle-ms 0`); 0 and `--standby-idle-ms 0` keep the
    /// active's priority. At +19 (CFS weight 15 against nice 0's 1,024) a
    /// shadow still starting takes ~1.5% of a core the active keeps busy;
    /// at +10 (weight 110) it took ~10%, all of the margin at 90% load,
    /// and those re-provisions were the ones clients felt.
    #[arg(long, default_value_t = 19, value_parser = clap::value_parser!(i32).range(0..=19))]
    standby_nice: i32,
    /// Serve this IF's own control socket here (ZeroMQ REP, JSON):
    /// `status`, `activate`, `yield`, `stop` — how the orchestrator runs a
    /// switchover.
    #[arg(long)]
    listen: Option<String>,
    /// Publish telemetry (one JSON message per second, plus each
    /// under/over-provisioning report) on a ZeroMQ PUB socket bound here.
    #[arg(long)]
    telemetry: Option<String>,
    /// Also write the final report to this file.
    #[arg(long)]
    stats_json: Option<PathBuf>,
    /// Record every request the inference thread answers (when its first
    /// and last fragment were dequeued, when its batch started and ended
    /// on the engine, when its answer was sent) and write the records to
    /// this file as JSON lines when the IF stops: the engine's own time for
    /// each request, for telling it from the platform's
    /// (`libml::runtime::trace`). Nothing is written while serving.
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
    /// Requests `--trace` has room for (about 64 bytes each, committed as
    /// they are recorded); later ones are counted, not recorded.
    #[arg(long, default_value_t = 1_000_000, requires = "trace")]
    trace_capacity: usize,
    /// Say when it serves (with `--standby`: when it is parked and can take
    /// over) on this inherited descriptor: one JSON
    /// `kp_schema::messages::Readiness` line, as the orchestrator expects.
    /// Without it only the "kp-if: ready"/"kp-if: standby" log line says so.
    #[arg(long, value_name = "FD")]
    notify_fd: Option<i32>,
    /// `--notify-fd`'s descriptor, claimed at start-up.
    #[arg(skip)]
    notify: Option<std::fs::File>,
    /// DPDK EAL arguments (after `--`): `--proc-type secondary`, the
    /// if-manager's `--file-prefix`, a distinct `--lcores ID@CPU`.
    #[arg(last = true)]
    eal: Vec<String>,
}

/// Writes `--trace`'s records; whether it could (a failure is said, and
/// does not change how the IF exits: its answers are out).
fn write_trace(path: &std::path::Path, trace: &RequestTrace) -> bool {
    let written = std::fs::File::create(path).and_then(|f| {
        let mut out = std::io::BufWriter::new(f);
        trace.write_jsonl(&mut out)?;
        std::io::Write::flush(&mut out)
    });
    if let Err(e) = &written {
        eprintln!("kp-if: cannot write --trace {}: {e}", path.display());
    }
    written.is_ok()
}

/// Which thread turns an RGB image into the model's input (`--convert-on`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum ConvertOn {
    /// The fragment thread, as fragments arrive.
    Network,
    /// The inference thread, before the engine runs a batch.
    Inference,
    /// `Inference` where the fragment thread shares a CPU with the
    /// engine's cores, else `Network` ([`ConvertOn::resolve`]).
    Auto,
}

impl ConvertOn {
    /// Whether the inference thread converts: `Auto` becomes `Inference`
    /// where the fragment thread's CPUs (`lcore`) overlap the engine's
    /// (`cores`), so that the conversion's writes do not land on the
    /// engine's core between its own reads while a batch runs. Without
    /// `--cores` (`None`) nothing is pinned to share: the design's
    /// `Network`.
    fn resolve(self, lcore: Option<&[usize]>, cores: Option<&[usize]>) -> bool {
        match self {
            Self::Network => false,
            Self::Inference => true,
            Self::Auto => match (lcore, cores) {
                (Some(lcore), Some(cores)) => lcore.iter().any(|c| cores.contains(c)),
                _ => false,
            },
        }
    }
}

/// A CPU list (a newtype so clap takes it as one value).
#[derive(Clone, Debug)]
struct Cores(Vec<usize>);

fn parse_cores(s: &str) -> Result<Cores, String> {
    match kp_os::affinity::parse_cpu_list(s) {
        Ok(cpus) if cpus.is_empty() => Err(format!("no CPU in {s:?}")),
        Ok(cpus) => Ok(Cores(cpus)),
        Err(e) => Err(e.to_string()),
    }
}

/// The shortest time an IF remembers the requests it answered.
const ANSWERED_TTL_FLOOR: Duration = Duration::from_secs(2);

/// Fragments a hand-back ring holds: a switchover hands back at most the
/// fragments of `capacity` requests, which arrive no faster than a ring's
/// worth between two polls.
const HANDBACK_RING_SIZE: u32 = 4096;

/// How much longer than the reassembly timeout a successor forwards
/// fragments back after a switchover.
const SWITCHOVER_GRACE_MARGIN: Duration = Duration::from_millis(100);

/// Who we are, for control replies.
struct IfInfo<'a> {
    if_id: u16,
    model: &'a str,
}

/// Serves the IF's control socket until the IF is done: one JSON reply to
/// every request, errors included (what each command does is libml's
/// [`answer_command`]; this is the socket and the status).
fn serve_control(
    sock: &zmq::Socket,
    mode: &ModeCell,
    stop: &AtomicBool,
    ctl: &IfControl,
    info: &IfInfo<'_>,
) {
    let status = |mode: Mode| {
        let (switchovers, last_gap_ns) = ctl.switchovers();
        IfStatus {
            pid: std::process::id(),
            if_id: info.if_id,
            model: info.model.to_string(),
            mode: mode.name().to_string(),
            owner: ctl.owner(),
            switchovers,
            last_gap_ns,
        }
    };
    while mode.get() != Mode::Done {
        let Ok(bytes) = sock.recv_bytes(0) else {
            continue; // the receive timeout: look at the mode again
        };
        let reply = answer_command(&bytes, mode, stop, || ctl.doorbell().ring(), status);
        let _ = sock.send(reply.to_string().as_bytes(), 0);
    }
}

fn main() -> ExitCode {
    init_logging();
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kp-if: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Logs: the libraries' `tracing` events on stderr, one line each, the
/// message alone (each names its process, as the log readers in scripts/
/// expect), at INFO and above unless `RUST_LOG` says otherwise.
fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .without_time()
        .with_target(false)
        .with_level(false)
        .with_ansi(false)
        .init();
}

fn run(mut args: Args) -> Result<()> {
    let started = Instant::now();
    // Before anything opens a file: a descriptor open at that number now is
    // the one the parent passed.
    if let Some(fd) = args.notify_fd {
        args.notify = Some(kp_os::inherit::claim(fd).context("--notify-fd")?.into());
    }
    let mut model = ModelConfig::load(&args.model)
        .with_context(|| format!("loading {}", args.model.display()))?;
    if let Some(id) = args.if_id {
        model.if_id = IfId(id);
    }
    if let Some(slo) = args.slo_ms {
        model.slo = Duration::from_secs_f64(slo / 1000.0);
    }
    args.engine.apply(&mut model);
    let layout = InputLayout::for_model(&model)?;
    // SIGTERM/SIGINT set a flag from here on, before the EAL: a stop asked
    // for during start-up must not kill this process inside a DPDK call.
    // Start-up takes DPDK's shared locks (the memory hotplug lock while the
    // EAL maps the primary's memory, the memzone lock, the heap lock while
    // the pool grows the heap), and a process that dies holding one leaves
    // it held for every process of the platform: seen as a shutdown where
    // every other kp-if and the if-manager spun forever in
    // `rte_memzone_free`, because a shadow started just before had died of
    // the orchestrator's SIGTERM inside `rte_eal_init`. The flag is looked
    // at once the EAL and once the engine are up, and then by the serving
    // loop.
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone()).context("installing signal handlers")?;
    }
    let lowered = if args.standby {
        StartPriority::lower(
            Duration::from_millis(args.standby_idle_ms),
            args.standby_nice,
        )
    } else {
        StartPriority::kept()
    };

    // The EAL before the engine. A DPDK secondary maps the primary's
    // hugepage memory at the primary's addresses (from 0x100000000 up, a
    // 16 GiB reservation), and a GPU engine's CUDA start-up reserves
    // address ranges there: opened first, it left every GPU IF unable to
    // start ("Cannot reserve 17179869184 bytes at [0x100200000]", seen on
    // the H200 machine). DPDK applications that use CUDA start it after
    // rte_eal_init for this reason.
    let mut argv = vec!["kp-if".to_string()];
    argv.extend(args.eal.iter().cloned());
    let eal_began = Instant::now();
    let eal = Eal::init(&argv).context("DPDK EAL initialisation (secondary)")?;
    let eal_time = eal_began.elapsed();
    if eal.process_type() != ProcessType::Secondary {
        let _ = eal.cleanup();
        bail!("kp-if must run as a DPDK secondary process (--proc-type secondary)");
    }
    if stopped_during_startup(&stop, "DPDK's EAL") {
        eal.cleanup().context("DPDK cleanup")?;
        return Ok(());
    }
    // The EAL pins this thread, the fragment thread, to its main lcore's
    // CPUs (`--lcores`). The engine's threads are made while the model
    // loads and inherit the mask of the thread that loads it: for the load
    // only, that is `--cores`; then the fragment thread goes back to its
    // lcore. (Pinned to `--cores` for good, it shared the engine's core
    // even where `--lcores` put it on the network side's.)
    let lcore_cpus = match &args.cores {
        Some(Cores(cores)) => {
            let lcore =
                kp_os::affinity::current_thread_cpus().context("reading the EAL lcore's CPUs")?;
            kp_os::affinity::set_current_thread_cpus(cores)
                .with_context(|| format!("pinning to cores {cores:?}"))?;
            Some(lcore)
        }
        None => None,
    };
    // The engine before anything is attached: a model that cannot load
    // fails before the IF registers its ring or says ready.
    let convert_on_inference = args.convert_on.resolve(
        lcore_cpus.as_deref(),
        args.cores.as_ref().map(|Cores(c)| c.as_slice()),
    );
    let load_began = Instant::now();
    let loaded = load_engine(&args, &model, layout, convert_on_inference);
    let load_time = load_began.elapsed();
    if let Some(lcore) = &lcore_cpus {
        if let Err(e) = kp_os::affinity::set_current_thread_cpus(lcore) {
            // It still works, on the engine's cores.
            eprintln!("kp-if: warning: cannot pin the fragment thread back to {lcore:?}: {e}");
        }
    }
    let (mut engine, layout, info, max_batch) = match loaded {
        Ok(loaded) => loaded,
        Err(e) => {
            let _ = eal.cleanup();
            return Err(e);
        }
    };
    if stopped_during_startup(&stop, "the engine") {
        engine.deinit();
        eal.cleanup().context("DPDK cleanup")?;
        return Ok(());
    }
    let setup = Setup {
        args: &args,
        model: &model,
        layout: &layout,
        max_batch,
        output_elems: info.output_elems(),
        stop: &stop,
        startup: Startup {
            began: started,
            eal: eal_time,
            model: load_time,
            priority: &lowered,
        },
    };
    let result = attach_and_serve(&setup, &mut *engine, &eal);
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

/// The engine of `model`: initialised, the model loaded and checked against
/// the configured input, configured for the largest batch; with the pool
/// layout the engine wants (raw bytes when it normalises images itself).
fn load_engine(
    args: &Args,
    model: &ModelConfig,
    layout: InputLayout,
    convert_on_inference: bool,
) -> Result<(Box<dyn Framework>, InputLayout, ModelInfo, usize)> {
    let mut engine = engine_for(model.engine)?;
    engine.init(&EngineConfig {
        intra_op_threads: model.intra_op_threads.max(1),
    })?;
    let info = engine.load_model(&model.model_path)?;
    if info.input_elems() != layout.input_elems() {
        bail!(
            "model input {:?} has {} values, the configured input {:?} has {}",
            info.input_shape,
            info.input_elems(),
            model.input.shape,
            layout.input_elems()
        );
    }
    // An engine that normalises images on its device (the GPU gather) gets
    // them as they came: the fragment thread only copies bytes. So does one
    // whose images the inference thread converts (`--convert-on inference`).
    let layout = if engine.normalises_images() || convert_on_inference {
        layout.raw_images()
    } else {
        layout
    };
    let max_batch = args.max_batch.clamp(1, args.capacity);
    engine.configure_batch(max_batch)?;
    Ok((engine, layout, info, max_batch))
}

/// What an IF serves with, decided before it attaches to the platform.
#[derive(Clone, Copy)]
struct Setup<'a> {
    args: &'a Args,
    model: &'a ModelConfig,
    layout: &'a InputLayout,
    max_batch: usize,
    output_elems: usize,
    /// Set by SIGINT/SIGTERM (installed before the EAL starts).
    stop: &'a AtomicBool,
    startup: Startup<'a>,
}

/// Whether a stop was asked for while `what` started; if so, says so (the
/// caller then undoes what it started and exits without serving).
fn stopped_during_startup(stop: &AtomicBool, what: &str) -> bool {
    let stopped = stop.load(Ordering::Relaxed);
    if stopped {
        eprintln!("kp-if: told to stop while {what} started; exiting without serving");
    }
    stopped
}

/// Where a start-up's time went, for the ready line: a shadow starts while
/// the active serves, on the same cores, so what it costs is what clients
/// may feel during a re-provision.
#[derive(Clone, Copy)]
struct Startup<'a> {
    /// When `run` began (after the process was exec'd and its arguments
    /// parsed).
    began: Instant,
    /// `rte_eal_init` as a secondary (mapping the primary's memory).
    eal: Duration,
    /// The engine: initialised, the model loaded, configured.
    model: Duration,
    /// The priority it started at.
    priority: &'a StartPriority,
}

/// A shadow's start-up priority ([`Args::standby_idle_ms`],
/// [`Args::standby_nice`]).
struct StartPriority {
    /// `None`: as the process was started.
    lowered: Option<Lowered>,
}

struct Lowered {
    /// The nice value it was started at, and gets back.
    base: i32,
    /// How much nicer it runs after (or without) its time under `SCHED_IDLE`.
    by: i32,
    /// How long it starts under `SCHED_IDLE` (zero: not at all).
    idle_for: Duration,
    /// Where it is now; the watchdog waits on the condition variable for
    /// [`StartPhase::Restored`] or the end of `idle_for`.
    phase: Arc<(Mutex<StartPhase>, Condvar)>,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum StartPhase {
    /// Under `SCHED_IDLE`.
    Idle,
    /// At nice +by: from the start, or after `idle_for` under `SCHED_IDLE`.
    Niced,
    /// Back at the priority it started at ([`StartPriority::restore`]).
    Restored { after_idle: bool },
}

impl StartPriority {
    fn kept() -> StartPriority {
        StartPriority { lowered: None }
    }

    /// Lowers this thread's priority (the threads it starts later inherit
    /// it), where it can be raised back: `SCHED_IDLE` for `idle_for`, then
    /// nice +`by`; a watchdog thread, started at full priority before the
    /// rest goes idle, moves every thread on when `idle_for` is over.
    fn lower(idle_for: Duration, by: i32) -> StartPriority {
        if by == 0 && idle_for.is_zero() {
            return StartPriority::kept();
        }
        if !kp_os::priority::is_root() {
            eprintln!(
                "kp-if: starting at the active's priority: lowering it needs the right to raise it back (root)"
            );
            return StartPriority::kept();
        }
        let base = match kp_os::priority::nice_current_thread() {
            Ok(base) => base,
            Err(e) => {
                eprintln!("kp-if: warning: starting at the active's priority: {e}");
                return StartPriority::kept();
            }
        };
        // Idle before the watchdog starts: one that found anything else
        // would leave at once.
        let phase = Arc::new((Mutex::new(StartPhase::Idle), Condvar::new()));
        let idle = !idle_for.is_zero() && Self::go_idle(&phase, idle_for, base + by);
        let lowered = if idle {
            Ok(())
        } else {
            *phase.0.lock().unwrap_or_else(PoisonError::into_inner) = StartPhase::Niced;
            // A watchdog that did start is woken, finds Niced and leaves.
            phase.1.notify_all();
            if by == 0 {
                return StartPriority::kept();
            }
            kp_os::priority::set_nice_current_thread(base + by)
        };
        match lowered {
            Ok(()) => StartPriority {
                lowered: Some(Lowered {
                    base,
                    by,
                    idle_for: if idle { idle_for } else { Duration::ZERO },
                    phase,
                }),
            },
            Err(e) => {
                eprintln!(
                    "kp-if: warning: starting at the active's priority: cannot lower it: {e}"
                );
                StartPriority::kept()
            }
        }
    }

    /// Starts the watchdog (at this thread's full priority), then puts this
    /// thread under `SCHED_IDLE`; false, with a warning, where either fails.
    fn go_idle(phase: &Arc<(Mutex<StartPhase>, Condvar)>, idle_for: Duration, nice: i32) -> bool {
        let watched = phase.clone();
        let started = std::thread::Builder::new()
            .name("kp-if-start-prio".into())
            .spawn(move || Self::watch(&watched, idle_for, nice))
            .map_err(anyhow::Error::from)
            .and_then(|_| kp_os::priority::set_idle_current_thread().map_err(anyhow::Error::from));
        if let Err(e) = &started {
            eprintln!("kp-if: warning: cannot start under SCHED_IDLE: {e}");
        }
        started.is_ok()
    }

    /// The watchdog: after `idle_for` still under `SCHED_IDLE`, every
    /// thread to the normal policy at `nice`.
    fn watch(phase: &(Mutex<StartPhase>, Condvar), idle_for: Duration, nice: i32) {
        let (lock, woken) = phase;
        let guard = lock.lock().unwrap_or_else(PoisonError::into_inner);
        let (mut now, _) = woken
            .wait_timeout_while(guard, idle_for, |p| *p == StartPhase::Idle)
            .unwrap_or_else(PoisonError::into_inner);
        if *now == StartPhase::Idle {
            if let Err(e) = kp_os::priority::set_normal_all_threads(nice) {
                eprintln!("kp-if: warning: cannot leave SCHED_IDLE after {idle_for:?}: {e}");
            }
            *now = StartPhase::Niced;
        }
    }

    /// Every thread of the process back to the priority it started at.
    fn restore(&self) -> Result<()> {
        let Some(l) = &self.lowered else {
            return Ok(());
        };
        let (lock, woken) = &*l.phase;
        let mut now = lock.lock().unwrap_or_else(PoisonError::into_inner);
        let after_idle = match *now {
            StartPhase::Restored { .. } => return Ok(()),
            StartPhase::Idle => false,
            StartPhase::Niced => !l.idle_for.is_zero(),
        };
        kp_os::priority::set_normal_all_threads(l.base)
            .with_context(|| format!("restoring every thread's priority to nice {}", l.base))?;
        *now = StartPhase::Restored { after_idle };
        woken.notify_all();
        Ok(())
    }

    /// How it started, for the ready line: "" or e.g. " under SCHED_IDLE".
    fn describe(&self) -> String {
        let Some(l) = &self.lowered else {
            return String::new();
        };
        let now = *l.phase.0.lock().unwrap_or_else(PoisonError::into_inner);
        match now {
            StartPhase::Restored { after_idle: false } | StartPhase::Idle
                if !l.idle_for.is_zero() =>
            {
                " under SCHED_IDLE".to_string()
            }
            StartPhase::Restored { after_idle: true } => format!(
                " under SCHED_IDLE for {} ms, then at nice +{}",
                l.idle_for.as_millis(),
                l.by
            ),
            _ => format!(" at nice +{}", l.by),
        }
    }
}

fn attach_and_serve(
    setup: &Setup<'_>,
    engine: &mut dyn libml::engine::Framework,
    eal: &Eal,
) -> Result<serde_json::Value> {
    let (args, model, layout) = (setup.args, setup.model, setup.layout);
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
    let answerer = Answerer::new(mbufs, tx)?;
    // An if-manager dozing in its idle back-off wakes when answers are
    // enqueued; without the bell they would wait for its sleep to end.
    let answerer = match TxBell::lookup() {
        Ok(bell) => answerer.with_bell(bell),
        Err(e) => {
            eprintln!(
                "kp-if: warning: no TX doorbell ({e}): answers wait for the if-manager's next poll"
            );
            answerer
        }
    };

    let mut pool = InputPool::in_memzone(
        &names::input_pool(model.if_id, std::process::id()),
        args.capacity,
        layout.slot_elems(),
        eal.socket_id(),
    )?;
    // An engine that reads requests in place (a GPU engine: the pool
    // registered as pinned memory, each batch gathered on the device)
    // takes the pool now, before anyone is told this IF is ready; every
    // path out of here below gives it back before the pool goes.
    let location = pool
        .location(layout)
        .context("the input pool does not fit the input layout")?;
    engine
        .attach_input_pool(location)
        .context("attaching the input pool to the engine")?;
    let served = serve_on(
        setup, engine, &mut pool, control, &ring_name, ring, answerer, eal,
    );
    engine.detach_input_pool();
    served
}

/// The IF's life on its ring, from the reassembler to its final report,
/// with `pool` attached to `engine`.
#[allow(clippy::too_many_arguments)]
fn serve_on(
    setup: &Setup<'_>,
    engine: &mut dyn libml::engine::Framework,
    pool: &mut InputPool,
    control: Option<ControlClient>,
    ring_name: &str,
    ring: Ring,
    answerer: Answerer,
    eal: &Eal,
) -> Result<serde_json::Value> {
    let Setup {
        args,
        model,
        layout,
        max_batch,
        output_elems,
        stop,
        startup,
    } = *setup;
    let mut rcfg = ReassemblerConfig::new(model.request_bytes());
    rcfg.capacity = args.capacity;
    rcfg.timeout_ns = args.reassembly_timeout_ms * 1_000_000;
    // Stragglers of an answered request are recognised this long: well past
    // the reassembly timeout, for clients slowed down by a busy machine.
    rcfg.answered_ttl_ns = rcfg
        .answered_ttl_ns
        .max(4 * rcfg.timeout_ns)
        .max(ANSWERED_TTL_FLOOR.as_nanos() as u64);
    let mut reassembler = Reassembler::new(rcfg)?;
    let mut bcfg = BatchConfig::new(model.slo.as_nanos() as u64);
    bcfg.max_batch = max_batch;
    let mut policy = BatchPolicy::new(bcfg)?;

    // The ring's succession: who dequeues it, and our part in it.
    let me = std::process::id();
    let ctl = IfControl::lookup(model.if_id)
        .with_context(|| format!("looking up {}'s control block", model.if_id))?;
    if !args.standby && ctl.owner() != 0 && kp_os::affinity::process_alive(ctl.owner()) {
        bail!(
            "{} is already served by process {} (start with --standby --listen to be its shadow)",
            model.if_id,
            ctl.owner()
        );
    }
    let ledger = Ledger::create(args.capacity, eal.socket_id()).context("creating the ledger")?;
    let handback = Ring::create(
        &names::handback_ring(me),
        HANDBACK_RING_SIZE,
        eal.socket_id(),
        RingFlags {
            single_producer: false,
            single_consumer: true,
        },
    )
    .context("creating the hand-back ring")?;
    let mode = ModeCell::new(if args.standby {
        Mode::Standby
    } else {
        Mode::Arming
    });
    let succession = Succession {
        control: &ctl,
        mode: &mode,
        ledger: &ledger,
        handback: &handback,
        grace: Duration::from_millis(args.reassembly_timeout_ms) + SWITCHOVER_GRACE_MARGIN,
    };

    if let (Some(c), false) = (&control, args.standby) {
        c.ready(model.if_id).map_err(anyhow::Error::msg)?;
    }
    let mut listener = args
        .listen
        .as_deref()
        .map(|endpoint| -> Result<_> {
            let ctx = zmq::Context::new();
            let sock = ctx.socket(zmq::REP)?;
            sock.set_linger(0)?;
            sock.set_rcvtimeo(100)?;
            sock.bind(endpoint)
                .with_context(|| format!("binding the control socket {endpoint}"))?;
            // The socket moves to the control thread; the context stays.
            Ok((ctx, Some(sock)))
        })
        .transpose()?;
    // Parked (or serving): full priority from here on, the threads started
    // later (inference, control) included.
    startup.priority.restore()?;
    let to_ready = startup.began.elapsed();
    eprintln!(
        "kp-if: {}: {} as if {} on {} ({}, {} threads on cores {}, slo {:?}, capacity {}, max batch {}; \
         started in {} ms{}: EAL {} ms, engine {} ms, the rest {} ms)",
        if args.standby { "standby" } else { "ready" },
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
        max_batch,
        to_ready.as_millis(),
        startup.priority.describe(),
        startup.eal.as_millis(),
        startup.model.as_millis(),
        to_ready.saturating_sub(startup.eal + startup.model).as_millis(),
    );
    if let Some(notify) = &args.notify {
        let ready = Readiness {
            pid: std::process::id(),
            role: if args.standby {
                ReadyRole::Standby
            } else {
                ReadyRole::Serving
            },
            if_id: Some(model.if_id.0),
        };
        if let Err(e) = ready.write_to(notify) {
            eprintln!("kp-if: warning: cannot say it is ready on --notify-fd: {e}");
        }
    }
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
    let publish = |body: &Publication| {
        if let Some((_, sock)) = &publisher {
            let msg = IfMessage {
                pid: std::process::id(),
                if_id,
                model: name.clone(),
                body: body.clone(),
            };
            let Ok(bytes) = serde_json::to_vec(&msg) else {
                return;
            };
            let sock = sock.lock().unwrap_or_else(|p| p.into_inner());
            // PUB never blocks; a slow subscriber loses messages, not us.
            let _ = sock.send(bytes, zmq::DONTWAIT);
        }
    };
    let cfg = RuntimeConfig {
        top_k: model.top_k,
        output_elems,
        max_batch,
        exit_when_idle: args.exit_when_idle.map(Duration::from_secs_f64),
        busy_poll: args.busy_poll,
        inference_spin: Duration::from_millis(args.inference_spin_ms),
        telemetry_every: Duration::from_secs(1),
        inference_cpus: args.cores.as_ref().map(|c| c.0.clone()),
    };
    let info = IfInfo {
        if_id: model.if_id.0,
        model: &model.name,
    };
    let mut trace = args
        .trace
        .as_ref()
        .map(|_| RequestTrace::new(args.trace_capacity));
    let mut report = std::thread::scope(|s| {
        if let Some(sock) = listener.as_mut().and_then(|(_, sock)| sock.take()) {
            let (mode, stop, ctl) = (&mode, stop, &ctl);
            let info = &info;
            s.spawn(move || serve_control(&sock, mode, stop, ctl, info));
        }
        serve(
            &cfg,
            &ring,
            &succession,
            &answerer,
            layout,
            pool,
            &mut reassembler,
            &mut policy,
            engine,
            stop,
            publisher
                .as_ref()
                .map(|_| &publish as &(dyn Fn(&Publication) + Sync)),
            trace.as_mut(),
        )
    });
    if let (Some(path), Some(trace)) = (&args.trace, &trace) {
        report["trace"] = json!({
            "path": path,
            "requests": trace.spans().len(),
            "dropped": trace.dropped(),
            "written": write_trace(path, trace),
        });
    }
    let yielded = report["succession"]["yielded"] == true;
    let never_active = report["succession"]["taken"].is_null();
    // The if_id stays live at the if-manager while a successor serves it.
    if let (Some(c), false, false) = (&control, yielded, never_active) {
        if let Err(e) = c.goodbye(model.if_id) {
            eprintln!("kp-if: goodbye: {e}");
        }
    }
    report["model"] = json!(model.name);
    report["if_id"] = json!(model.if_id.0);
    report["engine"] = json!(engine.name());
    // Which thread turned images into the model's input (`--convert-on`,
    // `auto` resolved); null for a model whose input is not an image.
    report["images_converted_by"] = match (layout, engine.normalises_images()) {
        (InputLayout::RgbU8Hwc(_), _) => json!("fragment thread"),
        (InputLayout::RgbU8HwcRaw(_), true) => json!("engine"),
        (InputLayout::RgbU8HwcRaw(_), false) => json!("inference thread"),
        _ => json!(null),
    };
    report["pool"] = json!({
        "slots": pool.capacity(),
        "slot_bytes": pool.slot_elems() * 4,
        "hugepage_bytes": pool.reserved_bytes(),
    });
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kp_os::priority::{is_idle_current_thread, is_root, nice_current_thread};

    #[test]
    fn auto_converts_on_the_inference_thread_only_where_the_fragment_thread_shares_its_cores() {
        let auto = |lcore: Option<&[usize]>, cores: Option<&[usize]>| {
            ConvertOn::Auto.resolve(lcore, cores)
        };
        // The orchestrator's default: the EAL lcore on the IF's own cores.
        assert!(auto(Some(&[1]), Some(&[1])));
        assert!(auto(Some(&[2, 3]), Some(&[0, 1, 2, 3])));
        // The design's layout: the fragment thread on the network side's core.
        assert!(!auto(Some(&[0]), Some(&[1])));
        assert!(!auto(Some(&[0, 1]), Some(&[2, 3])));
        // Nothing pinned: the design's default.
        assert!(!auto(None, None));
        // An explicit choice stands whatever the cores.
        for (lcore, cores) in [(&[1usize][..], &[1usize][..]), (&[0], &[1])] {
            assert!(ConvertOn::Inference.resolve(Some(lcore), Some(cores)));
            assert!(!ConvertOn::Network.resolve(Some(lcore), Some(cores)));
        }
        assert!(ConvertOn::Inference.resolve(None, None));
    }

    #[test]
    fn convert_on_defaults_to_auto() {
        let args = Args::try_parse_from(["kp-if", "--model", "m/config.toml", "--if-id", "1"])
            .expect("parses");
        assert_eq!(args.convert_on, ConvertOn::Auto);
    }

    /// Both tests change every thread of the test process: one at a time.
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

    // Lowering is refused without the right to raise back (then `lower`
    // keeps the priority, as the first branch of each test checks).

    #[test]
    fn a_shadow_still_starting_after_its_idle_time_goes_on_at_its_nice_value() {
        let _one = ONE_AT_A_TIME.lock().unwrap_or_else(PoisonError::into_inner);
        // Several times: the watchdog starts while this thread goes idle,
        // and must move it on whichever comes first.
        for _ in 0..10 {
            std::thread::spawn(|| {
                let base = nice_current_thread().unwrap();
                let p = StartPriority::lower(Duration::from_millis(20), 7);
                if !is_root() {
                    assert!(p.lowered.is_none());
                    return;
                }
                let deadline = Instant::now() + Duration::from_secs(10);
                while is_idle_current_thread().unwrap() {
                    assert!(Instant::now() < deadline, "the watchdog never moved it on");
                    std::thread::sleep(Duration::from_millis(2));
                }
                assert_eq!(nice_current_thread().unwrap(), base + 7);
                p.restore().unwrap();
                assert!(!is_idle_current_thread().unwrap());
                assert_eq!(nice_current_thread().unwrap(), base);
                assert_eq!(p.describe(), " under SCHED_IDLE for 20 ms, then at nice +7");
            })
            .join()
            .unwrap();
        }
    }

    #[test]
    fn a_shadow_parked_within_its_idle_time_gets_full_priority_back_and_stays_there() {
        let _one = ONE_AT_A_TIME.lock().unwrap_or_else(PoisonError::into_inner);
        std::thread::spawn(|| {
            let base = nice_current_thread().unwrap();
            let p = StartPriority::lower(Duration::from_secs(2), 7);
            if !is_root() {
                assert!(p.lowered.is_none());
                return;
            }
            assert!(is_idle_current_thread().unwrap());
            let child = std::thread::spawn(|| is_idle_current_thread().unwrap());
            assert!(
                child.join().unwrap(),
                "threads it starts inherit SCHED_IDLE"
            );
            p.restore().unwrap();
            assert!(!is_idle_current_thread().unwrap());
            assert_eq!(nice_current_thread().unwrap(), base);
            // Past the idle time: the watchdog, woken by the restore, left
            // every thread alone.
            std::thread::sleep(Duration::from_millis(2200));
            assert!(!is_idle_current_thread().unwrap());
            assert_eq!(nice_current_thread().unwrap(), base);
            assert_eq!(p.describe(), " under SCHED_IDLE");
            // Without an idle time: nice +7 from the start.
            let q = StartPriority::lower(Duration::ZERO, 7);
            assert!(!is_idle_current_thread().unwrap());
            assert_eq!(nice_current_thread().unwrap(), base + 7);
            q.restore().unwrap();
            assert_eq!(nice_current_thread().unwrap(), base);
            assert_eq!(q.describe(), " at nice +7");
        })
        .join()
        .unwrap();
    }
}
