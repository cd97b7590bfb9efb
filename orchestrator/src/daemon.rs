//! The orchestrator daemon: the if-manager and the inference functions as
//! processes, driven towards the desired state.
//!
//! One thread runs [`Daemon::run`]: every few milliseconds it serves at most
//! one control request ([`crate::control`]), looks at its processes (which
//! exited, which are ready), reads telemetry, and once a tuning period runs
//! GSLICE's loop ([`crate::tuning`], [`crate::alloc`]). Nothing in it waits
//! long: a process start is a state it polls.
//!
//! # Who decides, who does
//!
//! What happens to the processes — shadows, switchovers, fail-over, the
//! start timeout, a platform restart, retire, shutdown — is decided by
//! [`crate::lifecycle`], a state machine that performs nothing (its module
//! documentation has the rules). This module is its driver: it turns
//! control requests and what it sees of the processes into
//! [`Event`]s, and carries out the [`Action`]s that come back — spawning
//! `kp-if` processes, `activate` and `yield` requests to IFs, signals,
//! the busy marks of the desired state, unregistering at the if-manager —
//! feeding each result straight back. It owns the real processes, by the
//! machine's [`ProcId`]s, until they have exited.
//!
//! # Processes per IF
//!
//! - the **active**: a `kp-if` that owns the IF's ring;
//! - its **shadow**: a `kp-if --standby`, same model and share, loaded and
//!   parked (libml's `runtime::handover`);
//! - during a re-provision, the **pending** one: a shadow with the new share
//!   (or SLO). When it is parked and ready, the daemon tells it to
//!   `activate` and the active to `yield`; the gap is read from the new
//!   active; the old active finishes what it holds and exits, the old shadow
//!   is stopped, and a new shadow with the new share is started.
//!
//! One kp-if starts at a time: a shadow or a re-provision's new shadow waits
//! until the kp-if being started is ready (a fail-over or a deploy does not
//! wait), and one that is not ready within a minute is killed. Each start
//! maps DPDK's shared memory and loads a model; several at once on a busy
//! machine stalled the running IFs for seconds.
//!
//! A dead active is replaced by its shadow at once (`activate`: it finds the
//! owner dead, answers INTERNAL what the dead one held, and serves); a dead
//! shadow is restarted; a dead if-manager takes every IF with it, so the
//! platform is restarted and the IFs redeployed.
//!
//! # Resource shares
//!
//! On a CPU host a share is a set of cores (disjoint runs of the configured
//! cores — by default every core hwloc says this process may use, those
//! NUMA-local to the NIC first ([`crate::topology`]) —
//! [`crate::alloc::split_cores`]) and as many engine threads. On a
//! GPU host (an NVIDIA device node exists) the IF also gets
//! `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` and the MPS control daemon is started
//! if installed; without a GPU the daemon says so once and uses cores.

use std::collections::{BTreeMap, VecDeque};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kp_schema::batching::{BatchStats, ProvisioningReport};
use kp_schema::messages::{IfCommand, IfManagerCommand, ReadyRole};
use kp_schema::telemetry::{IfMessage, Publication, TelemetrySnapshot};
use kp_schema::Mode;
use serde_json::{json, Value};

use crate::alloc::{split_cores, AllocConfig, Claim, ShareAllocator};
use crate::config::PlatformConfig;
use crate::control::{
    Change, ControlError, DesiredIf, DesiredState, Handler, IfState, ModelCatalog, Reply, Request,
    StatusReport, StatusRow,
};
use crate::lcores::{LcoreIds, LcoreLease};
use crate::lifecycle::{
    Action, Busy, Event, Exit, IfView, KillReason, Lifecycle, LifecycleError, ProcId, Spec,
    SHUTDOWN_GRACE, START_TIMEOUT,
};
use crate::metrics::http::MetricsEndpoint;
use crate::metrics::{PlatformMetrics, PlatformView};
use crate::process::{if_request, log_line, request, Proc, ReadyPipe};
use crate::topology::{NicHint, Topology};
use crate::tuning::{Observation, ShareTuner, TuningConfig};

/// How long an IF's control socket may take to answer (a starved machine
/// can take seconds to schedule a parked process).
const IF_TIMEOUT: Duration = Duration::from_secs(10);

/// How often the daemon hands its own numbers (shares, SLOs, switchovers,
/// states) to the metrics: a scrape sees them at most this old, and
/// Prometheus scrapes every few seconds.
const METRICS_VIEW_EVERY: Duration = Duration::from_millis(250);

/// One `kp-if` process.
#[derive(Debug)]
struct IfProc {
    proc: Proc,
    /// Its EAL lcore id (which also names its sockets and log). After
    /// `proc`: fields drop in order, and `Proc` ends its process when
    /// dropped, so the id goes back only once the process is gone.
    _lcore: LcoreLease,
    listen: String,
    telemetry: String,
    /// Its readiness was told to the life cycle.
    ready_told: bool,
}

/// What the daemon measures of one IF and how it tunes it.
#[derive(Debug)]
struct IfTelemetry {
    tuner: ShareTuner,
    /// The active's latest statistics and batching state.
    metrics: Option<(TelemetrySnapshot, BatchStats)>,
    report: Option<ProvisioningReport>,
}

/// The if-manager process, and what was told of it.
#[derive(Debug)]
struct IfManagerProc {
    proc: Proc,
    exit_told: bool,
    ready_told: bool,
}

/// The daemon.
pub struct Daemon {
    cfg: PlatformConfig,
    runtime_dir: PathBuf,
    ifm_control: String,
    /// The if-manager (the last one started, dead or alive).
    ifm: Option<IfManagerProc>,
    state: DesiredState,
    models: ModelCatalog,
    /// What happens to the IF processes.
    lifecycle: Lifecycle,
    /// Every IF process not yet seen exited: actives, shadows, leaving.
    procs: BTreeMap<ProcId, IfProc>,
    /// Per deployed IF (until it is unregistered).
    telemetry_of: BTreeMap<u16, IfTelemetry>,
    cores: Vec<usize>,
    /// Where the IFs' fragment threads run (`platform.fragment_cores`;
    /// `None`: on each IF's own cores).
    fragment_cores: Option<Vec<usize>>,
    /// An NVIDIA GPU is present.
    gpu: bool,
    /// The MPS control daemon, as found when the first GPU IF started.
    mps: Option<crate::gpu::MpsState>,
    allocator: ShareAllocator,
    tuning: TuningConfig,
    lcores: LcoreIds,
    _zmq: zmq::Context,
    telemetry: zmq::Socket,
    decisions: Option<File>,
    clock: Instant,
    last_tuning: Instant,
    /// Telemetry messages that did not parse as an [`IfMessage`].
    telemetry_rejected: u64,
    /// Per IF, each completed switchover's window on the wall clock (µs
    /// since the Unix epoch): from just before the new process was told to
    /// take over to when it was seen active. The final summary carries
    /// them, so that a client's per-request record can be set beside them
    /// (requests in flight across a switchover against the others).
    switch_windows: BTreeMap<u16, Vec<(u64, u64)>>,
    /// The machine as hwloc sees it, for status.
    topology: Value,
    /// What the metrics endpoint serves, shared with its thread.
    metrics: Arc<Mutex<PlatformMetrics>>,
    last_metrics_view: Instant,
    /// The endpoint (`None`: `platform.metrics = false`).
    metrics_endpoint: Option<MetricsEndpoint>,
}

impl std::fmt::Debug for Daemon {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Daemon")
            .field("runtime_dir", &self.runtime_dir)
            .field("ifs", &self.lifecycle.if_ids().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl Daemon {
    /// Prepares the runtime directory, cleans up after a previous
    /// orchestrator that died, and starts the if-manager and the configured
    /// IFs (each waits for the previous to be ready).
    pub fn start(cfg: PlatformConfig, runtime_dir: PathBuf) -> anyhow::Result<Daemon> {
        use anyhow::Context as _;
        create_private_dir(&runtime_dir)?;
        std::fs::create_dir_all(runtime_dir.join("logs"))?;
        clean_up_previous(&runtime_dir);
        let models = ModelCatalog::load(&cfg.platform.models).with_context(|| {
            format!(
                "loading the model repository {} (run `make models`)",
                cfg.platform.models.display()
            )
        })?;
        // Cores NIC-local first (hwloc), unless the config names them.
        let nic = nic_hint(&cfg.if_manager.eal);
        let topology = match &cfg.platform.cores {
            Some(list) => {
                let cpus = kp_os::affinity::parse_cpu_list(list)?;
                anyhow::ensure!(!cpus.is_empty(), "platform.cores {list:?} names no CPU");
                Topology::from_cpus(cpus)
            }
            None => Topology::discover().unwrap_or_else(|e| {
                tracing::warn!("orchestrator: hwloc: {e}; using the cores this process may run on");
                Topology::fallback()
            }),
        };
        if !cfg.if_manager.preallocates_memory() {
            tracing::warn!(
                "orchestrator: if_manager.eal maps no hugepage memory at start (no -m or --socket-mem): IF processes that start and stop will add and free pages, and DPDK syncs every process's memory map each time, waiting up to 5 s for one that is exiting or still starting (configs/platform.toml, -m)"
            );
        }
        let cores = topology.cores_near_nic(&nic);
        let fragment_cores = match &cfg.platform.fragment_cores {
            Some(list) => Some(kp_os::affinity::parse_cpu_list(list)?),
            None => None,
        };
        let topology_summary = topology.summary(&nic);
        let gpu = crate::gpu::gpu_present();
        if gpu {
            tracing::info!(
                "orchestrator: a GPU is present: IFs of GPU engines (engine = \"cudnn\") get CUDA MPS percentages (the MPS control daemon is started with the first), the others cores {cores:?}"
            );
        } else {
            tracing::info!(
                "orchestrator: no GPU here: a share is a set of the cores {cores:?} and as many engine threads"
            );
        }
        let tuning = TuningConfig {
            hold_down_ns: (cfg.platform.hold_down_s * 1e9) as u64,
            min_step_pct: cfg.platform.min_step_pct,
            ..TuningConfig::default()
        };
        let ctx = zmq::Context::new();
        let telemetry = ctx.socket(zmq::SUB)?;
        telemetry.set_subscribe(b"")?;
        telemetry.set_rcvtimeo(0)?;
        let kp_if = cfg.platform.bin_dir.join("kp-if");
        let ifm_control = format!("ipc://{}", runtime_dir.join("if-manager.sock").display());
        // Before any process starts: a taken port fails the start cleanly.
        let metrics = Arc::new(Mutex::new(PlatformMetrics::default()));
        let metrics_endpoint = if cfg.platform.metrics {
            let e = MetricsEndpoint::start(
                cfg.platform.metrics_listen,
                cfg.platform.allow_remote_metrics,
                metrics.clone(),
                ifm_control.clone(),
            )?;
            tracing::info!(
                "orchestrator: Prometheus metrics on http://{}/metrics",
                e.addr()
            );
            Some(e)
        } else {
            None
        };
        let mut d = Daemon {
            ifm_control,
            runtime_dir,
            ifm: None,
            state: DesiredState::new(kp_if),
            models,
            lifecycle: Lifecycle::new(),
            procs: BTreeMap::new(),
            telemetry_of: BTreeMap::new(),
            cores,
            fragment_cores,
            gpu,
            mps: None,
            allocator: ShareAllocator::new(AllocConfig {
                capacity_pct: cfg.platform.capacity_pct,
                work_conserving: cfg.platform.work_conserving,
            })?,
            tuning,
            lcores: LcoreIds::default(),
            _zmq: ctx,
            telemetry,
            decisions: None,
            clock: Instant::now(),
            last_tuning: Instant::now(),
            telemetry_rejected: 0,
            switch_windows: BTreeMap::new(),
            topology: topology_summary,
            metrics,
            last_metrics_view: Instant::now(),
            metrics_endpoint,
            cfg,
        };
        d.decisions = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(d.runtime_dir.join("decisions.jsonl"))
            .ok();
        d.start_if_manager()?;
        for dep in d.cfg.deploy.clone() {
            let req = Request::Deploy {
                if_id: dep.if_id,
                model: dep.model.clone(),
                binary: None,
                slo_ms: dep.slo_ms,
                share_pct: dep.share_pct,
            };
            let reply = d.handle(req);
            if !reply.is_ok() {
                anyhow::bail!(
                    "deploying if {} ({}): {}",
                    dep.if_id,
                    dep.model,
                    reply.to_json()
                );
            }
            if let Err(e) = d.wait_until_idle(START_TIMEOUT) {
                // A process that died while it started (killed, or a
                // transient failure) must not take the orchestrator down
                // with it: the IF shows as failed, with the reason, and can
                // be re-provisioned; the others are still deployed.
                tracing::warn!("orchestrator: if {} did not start: {e:#}", dep.if_id);
                continue;
            }
            if dep.pinned {
                // Once it serves: a starting IF refuses changes (busy).
                let pct = d.state.get(dep.if_id).map_or(30.0, |i| i.share_pct);
                let reply = d.handle(Request::Share {
                    if_id: dep.if_id,
                    pct,
                });
                if !reply.is_ok() {
                    anyhow::bail!("pinning if {}: {}", dep.if_id, reply.to_json());
                }
            }
        }
        Ok(d)
    }

    /// The if-manager's control endpoint.
    pub fn if_manager_control(&self) -> &str {
        &self.ifm_control
    }

    /// Runs until `shutdown`, serving `server`; returns the final summary.
    pub fn run(
        mut self,
        server: &mut crate::control::ControlServer,
        stop: &std::sync::atomic::AtomicBool,
    ) -> Value {
        loop {
            if stop.load(std::sync::atomic::Ordering::Relaxed) && !self.state.is_shutting_down() {
                self.handle(Request::Shutdown);
            }
            if let Err(e) = server.poll_once(&mut self, Duration::from_millis(5)) {
                tracing::warn!("orchestrator: control socket: {e}");
            }
            self.step();
            if self.state.is_shutting_down() && self.lifecycle.all_gone() {
                return self.finish();
            }
        }
    }

    /// One round of housekeeping (also used while starting).
    fn step(&mut self) {
        self.read_telemetry();
        self.observe();
        if self.last_metrics_view.elapsed() >= METRICS_VIEW_EVERY {
            self.last_metrics_view = Instant::now();
            self.update_metrics_view();
        }
        if self.cfg.platform.tuning
            && !self.state.is_shutting_down()
            && self.last_tuning.elapsed()
                >= Duration::from_millis(self.cfg.platform.tuning_period_ms)
        {
            self.last_tuning = Instant::now();
            self.tune();
        }
    }

    /// Steps until no IF is busy (start-up), or fails after `timeout`.
    fn wait_until_idle(&mut self, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            self.step();
            let busy: Vec<u16> = self
                .lifecycle
                .if_ids()
                .filter(|id| self.view(*id).is_some_and(|v| v.busy.is_some()))
                .collect();
            if busy.is_empty() {
                return Ok(());
            }
            if Instant::now() > deadline {
                anyhow::bail!("IFs {busy:?} did not start within {timeout:?}");
            }
            if let Some(r) = busy
                .iter()
                .find_map(|id| self.view(*id).and_then(|v| v.reason))
            {
                anyhow::bail!("{r}");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The life cycle's clock: time since the daemon started.
    fn now(&self) -> Duration {
        self.clock.elapsed()
    }

    fn now_ns(&self) -> u64 {
        self.now().as_nanos() as u64
    }

    fn view(&self, if_id: u16) -> Option<IfView<'_>> {
        self.lifecycle.view(if_id)
    }

    // ---------------------------------------------------------------------
    // Driving the life cycle

    /// Tells the life cycle what changed since the last round — the
    /// if-manager's exit first (it takes the IFs with it), then the IF
    /// processes' exits (actives last: a shadow that died with its active
    /// is not asked to take over), then readiness — and ends the round with
    /// a tick.
    fn observe(&mut self) {
        if let Some(ifm) = self.ifm.as_mut().filter(|p| !p.exit_told) {
            if let Some(status) = ifm.proc.poll_exit() {
                ifm.exit_told = true;
                let exit = Exit {
                    status: status.to_string(),
                    tail: ifm.proc.tail(),
                };
                self.feed(Event::IfManagerExited { exit });
            }
        }
        let mut exits: Vec<(ProcId, Exit)> = Vec::new();
        for (id, p) in &mut self.procs {
            if let Some(status) = p.proc.poll_exit() {
                let tail = p.proc.tail();
                let status = status.to_string();
                exits.push((*id, Exit { status, tail }));
            }
        }
        exits.sort_by_key(|(id, _)| self.lifecycle.is_active(*id));
        if !exits.is_empty() {
            // What they published last (their final numbers) before they
            // are forgotten.
            self.read_telemetry();
        }
        for (proc, exit) in exits {
            // Exited: its lcore id may go back now.
            if let Some(p) = self.procs.remove(&proc) {
                let _ = self.telemetry.disconnect(&p.telemetry);
                self.metrics_lock().process_exited(p.proc.pid());
                // One that was killed could not remove its sockets.
                remove_ipc_file(&p.listen);
                remove_ipc_file(&p.telemetry);
            }
            self.feed(Event::Exited { proc, exit });
        }
        if let Some(ifm) = self.ifm.as_mut() {
            if !ifm.exit_told && !ifm.ready_told && ifm.proc.is_ready() {
                ifm.ready_told = true;
                self.feed(Event::IfManagerReady);
            }
        }
        let ready: Vec<ProcId> = self
            .procs
            .iter_mut()
            .filter(|(_, p)| !p.ready_told && p.proc.is_ready())
            .map(|(id, p)| {
                p.ready_told = true;
                *id
            })
            .collect();
        for proc in ready {
            self.feed(Event::Ready { proc });
        }
        self.feed(Event::Tick);
    }

    /// Hands `event` to the life cycle and carries out what it says, one
    /// action at a time, each result fed back before the next action (as a
    /// direct call would). Returns why the request behind `event` failed,
    /// if it did.
    fn feed(&mut self, event: Event) -> Option<LifecycleError> {
        let mut refused = None;
        let mut queue: VecDeque<Action> = self.decide(event).into();
        while let Some(action) = queue.pop_front() {
            if let Action::Refuse { error } = action {
                refused.get_or_insert(error);
                continue;
            }
            if let Some(result) = self.perform(action) {
                let mut next: VecDeque<Action> = self.decide(result).into();
                next.append(&mut queue);
                queue = next;
            }
        }
        refused
    }

    fn decide(&mut self, event: Event) -> Vec<Action> {
        let now = self.now();
        let (state, cores) = (&self.state, &self.cores);
        let desired = |id: u16| state.get(id).map(|d| spec_for(state, cores, d));
        self.lifecycle.handle(now, event, &desired)
    }

    /// Carries out one action; the event that answers it, if any.
    fn perform(&mut self, action: Action) -> Option<Event> {
        match action {
            Action::Spawn {
                proc,
                if_id,
                spec,
                standby,
            } => match self.spawn_if(if_id, &spec, standby) {
                Ok(p) => {
                    let name = p.proc.name().to_string();
                    self.procs.insert(proc, p);
                    self.save_state();
                    Some(Event::Spawned { proc, name })
                }
                Err(error) => Some(Event::SpawnFailed { proc, error }),
            },
            Action::Activate { proc } => {
                let result = match self.procs.get(&proc) {
                    Some(p) => if_request(&p.listen, IfCommand::Activate, IF_TIMEOUT).map(|_| ()),
                    None => Err("it exited".to_string()),
                };
                Some(Event::Activated { proc, result })
            }
            Action::CarryOutSwitch { if_id, new, old } => {
                let begin = unix_us();
                let result = self.carry_out_switch(new, old);
                if result.is_ok() {
                    let window = (begin, unix_us());
                    self.switch_windows.entry(if_id).or_default().push(window);
                }
                self.save_state();
                Some(Event::Switched { proc: new, result })
            }
            Action::Terminate { proc } => {
                if let Some(p) = self.procs.get(&proc) {
                    p.proc.terminate();
                }
                None
            }
            Action::Kill { proc, why } => {
                let p = self.procs.get_mut(&proc)?;
                match why {
                    KillReason::StartTimeout => tracing::warn!(
                        "orchestrator: {} not ready after {START_TIMEOUT:?}; killing it:\n{}",
                        p.proc.name(),
                        p.proc.tail()
                    ),
                    KillReason::ShutdownGrace if p.proc.poll_exit().is_some() => return None,
                    KillReason::ShutdownGrace => tracing::warn!(
                        "orchestrator: {} did not exit within {SHUTDOWN_GRACE:?} of shutdown; killing it:\n{}",
                        p.proc.name(),
                        p.proc.tail()
                    ),
                    KillReason::PlatformRestart => {}
                }
                p.proc.kill();
                None
            }
            Action::SetBusy { if_id, busy } => {
                self.state.set_busy(if_id, busy.label());
                None
            }
            Action::ClearBusy { if_id } => {
                self.state.clear_busy(if_id);
                None
            }
            Action::NewActive { if_id } => {
                if let Some(t) = self.telemetry_of.get_mut(&if_id) {
                    t.metrics = None;
                }
                self.metrics_lock().new_active(if_id);
                None
            }
            Action::Unregister { if_id } => {
                let _ = request(
                    &self.ifm_control,
                    &IfManagerCommand::Unregister { if_id },
                    IF_TIMEOUT,
                );
                self.telemetry_of.remove(&if_id);
                None
            }
            Action::RespawnIfManager => {
                let ifs: Vec<u16> = self.state.ifs().map(|d| d.if_id).collect();
                let result = self.spawn_if_manager(&ifs);
                let answer = match result {
                    Ok(p) => {
                        tracing::info!("orchestrator: restarting the if-manager (pid {})", p.pid());
                        self.ifm = Some(IfManagerProc {
                            proc: p,
                            exit_told: false,
                            ready_told: false,
                        });
                        Event::IfManagerSpawned
                    }
                    Err(e) => {
                        tracing::warn!("orchestrator: cannot restart the if-manager: {e:#}");
                        Event::IfManagerSpawnFailed
                    }
                };
                self.save_state();
                Some(answer)
            }
            Action::Refuse { .. } => None, // `feed`'s
        }
    }

    /// A switchover: activates the parked `new`, makes `old` yield, waits
    /// until `new` is active; the gap it measured.
    fn carry_out_switch(&self, new: ProcId, old: Option<ProcId>) -> Result<u64, String> {
        let new = self.procs.get(&new).ok_or("the new process exited")?;
        if_request(&new.listen, IfCommand::Activate, IF_TIMEOUT)?;
        if let Some(a) = old.and_then(|old| self.procs.get(&old)) {
            let r = if_request(&a.listen, IfCommand::Yield, IF_TIMEOUT)?;
            if r.mode != Mode::Draining.name() && r.mode != Mode::Done.name() {
                return Err(format!("{} did not yield: {r:?}", a.proc.name()));
            }
        }
        let deadline = Instant::now() + IF_TIMEOUT;
        loop {
            let s = if_request(&new.listen, IfCommand::Status, IF_TIMEOUT)?;
            if s.mode == Mode::Active.name() {
                return Ok(s.last_gap_ns);
            }
            if Instant::now() > deadline {
                return Err(format!("{} never became active: {s:?}", new.proc.name()));
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// Asks the life cycle to re-provision `if_id` to `spec`; why not, if
    /// it cannot start.
    fn request_switch(&mut self, if_id: u16, spec: Spec, why: String) -> Result<(), String> {
        match self.feed(Event::SwitchRequested { if_id, spec, why }) {
            None => Ok(()),
            Some(e) => Err(e.to_string()),
        }
    }

    // ---------------------------------------------------------------------
    // Processes

    /// Starts the if-manager and waits until it serves (at start-up, before
    /// the control socket is served).
    fn start_if_manager(&mut self) -> anyhow::Result<()> {
        let ifs: Vec<u16> = self.cfg.deploy.iter().map(|d| d.if_id).collect();
        let mut p = self.spawn_if_manager(&ifs)?;
        let deadline = Instant::now() + START_TIMEOUT;
        while !p.is_ready() {
            if p.poll_exit().is_some() || Instant::now() > deadline {
                anyhow::bail!("the if-manager did not start:\n{}", p.tail());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        tracing::info!("orchestrator: if-manager ready (pid {})", p.pid());
        self.ifm = Some(IfManagerProc {
            proc: p,
            exit_told: false,
            ready_told: true,
        });
        self.save_state();
        Ok(())
    }

    /// Spawns the if-manager with the rings of `ifs` (the IFs about to be
    /// started on it) registered from the start: fragments that arrive
    /// while an IF's process loads its model wait in its ring (or are shed
    /// with a notice once it is full) instead of being answered
    /// UNKNOWN_IF, which would tell clients the IF does not exist.
    fn spawn_if_manager(&mut self, ifs: &[u16]) -> anyhow::Result<Proc> {
        let c = &self.cfg.if_manager;
        let exe = self.cfg.platform.bin_dir.join("if-manager");
        let mut cmd = match c.wrap.split_first() {
            Some((first, rest)) => {
                let mut cmd = Command::new(first);
                cmd.args(rest).arg(&exe);
                cmd
            }
            None => Command::new(&exe),
        };
        let ready = ReadyPipe::new(ReadyRole::Serving, None)?;
        cmd.args(&c.options);
        for id in ifs {
            cmd.args(["--if", &id.to_string()]);
        }
        cmd.args(["--control", &self.ifm_control])
            .args(ready.args())
            .arg("--stats-json")
            .arg(self.runtime_dir.join("if-manager.json"))
            .arg("--")
            .args(&c.eal)
            .args(["--file-prefix", &c.file_prefix]);
        Ok(Proc::spawn(
            "if-manager",
            cmd,
            ready,
            &self.runtime_dir.join("logs/if-manager.log"),
        )?)
    }

    fn spawn_if(&mut self, if_id: u16, spec: &Spec, standby: bool) -> Result<IfProc, String> {
        let lease = self.lcores.acquire().map_err(|e| e.to_string())?;
        let lcore = lease.id();
        let rt = &self.runtime_dir;
        let listen = format!(
            "ipc://{}",
            rt.join(format!("if-{if_id}-{lcore}.sock")).display()
        );
        let telemetry = format!(
            "ipc://{}",
            rt.join(format!("tm-{if_id}-{lcore}.sock")).display()
        );
        let config = self
            .cfg
            .platform
            .models
            .join(&spec.model)
            .join("config.toml");
        let cpu_list = spec
            .cores
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(",");
        // The fragment thread (the EAL lcore) on the network side's cores
        // where the config names them, else beside the engine.
        let lcore_cpus = self.fragment_cores.as_deref().map_or_else(
            || cpu_list.clone(),
            |c| {
                c.iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(",")
            },
        );
        let others: Vec<Vec<usize>> = self
            .state
            .ifs()
            .filter(|d| d.if_id != if_id)
            .map(|d| spec_for(&self.state, &self.cores, d).cores)
            .collect();
        let spin_ms = inference_spin_for(
            self.cfg.platform.inference_spin_ms,
            &spec.cores,
            self.fragment_cores.as_deref().unwrap_or(&spec.cores),
            &others,
        );
        if spin_ms == 0 && self.cfg.platform.inference_spin_ms > 0 {
            tracing::info!(
                "orchestrator: IF {if_id} dozes when idle (no --inference-spin-ms): its cores {:?} are not its own",
                spec.cores
            );
        }
        let mut cmd = Command::new(&spec.binary);
        cmd.arg("--model")
            .arg(&config)
            .args(["--if-id", &if_id.to_string()])
            .args(["--control", &self.ifm_control])
            .args(["--listen", &listen])
            .args(["--telemetry", &telemetry])
            .args(["--slo-ms", &spec.slo_ms.to_string()])
            .args(["--threads", &spec.cores.len().max(1).to_string()])
            .args(["--cores", &cpu_list])
            .args(["--capacity", &self.cfg.platform.capacity.to_string()])
            .args([
                "--reassembly-timeout-ms",
                &self.cfg.platform.reassembly_timeout_ms.to_string(),
            ]);
        if spin_ms > 0 {
            cmd.args(["--inference-spin-ms", &spin_ms.to_string()]);
        }
        let mut role = ReadyRole::Serving;
        if standby {
            cmd.arg("--standby");
            role = ReadyRole::Standby;
        }
        let ready = ReadyPipe::new(role, Some(if_id)).map_err(|e| e.to_string())?;
        cmd.args(ready.args());
        cmd.arg("--")
            .args(["--proc-type", "secondary"])
            .args(["--file-prefix", &self.cfg.if_manager.file_prefix])
            .args(["--lcores", &format!("{lcore}@({lcore_cpus})")])
            .args(["--no-pci", "--no-telemetry", "--log-level", "lib.eal:error"])
            .args(driver_args(&self.cfg.if_manager.eal));
        // A GPU IF's share is its MPS percentage, set before its first CUDA
        // call (the process's start). Without a GPU the IF itself refuses to
        // start and says what is missing.
        if self.gpu && self.on_gpu(&spec.model) {
            if self.mps.is_none() {
                let mps = crate::gpu::ensure_mps();
                tracing::info!("orchestrator: {}", mps.describe());
                self.mps = Some(mps);
            }
            cmd.env(
                crate::gpu::MPS_PERCENTAGE_VAR,
                crate::gpu::mps_percentage(spec.share_pct),
            );
        }
        let role = if standby { "shadow" } else { "active" };
        let name = format!("kp-if {if_id} #{lcore} ({role}, {:.0}%)", spec.share_pct);
        let log = rt.join(format!("logs/if-{if_id}-{lcore}.log"));
        let proc = Proc::spawn(name, cmd, ready, &log)
            .map_err(|e| format!("cannot start {}: {e}", spec.binary.display()))?;
        let _ = self.telemetry.connect(&telemetry);
        let p = IfProc {
            proc,
            _lcore: lease,
            listen,
            telemetry,
            ready_told: false,
        };
        self.save_state();
        Ok(p)
    }

    // ---------------------------------------------------------------------
    // Telemetry and tuning

    fn read_telemetry(&mut self) {
        while let Ok(bytes) = self.telemetry.recv_bytes(zmq::DONTWAIT) {
            let msg = match serde_json::from_slice::<IfMessage>(&bytes) {
                Ok(msg) => msg,
                Err(e) => {
                    // Counted and said (the first time), never read as
                    // zeros: a tuning loop fed zeros would take the IF for
                    // over-provisioned and shrink its share.
                    self.telemetry_rejected += 1;
                    if self.telemetry_rejected == 1 {
                        tracing::warn!(
                            "orchestrator: telemetry message rejected ({e}): {}",
                            String::from_utf8_lossy(&bytes[..bytes.len().min(200)])
                        );
                    }
                    continue;
                }
            };
            let Some(rt) = self.telemetry_of.get_mut(&msg.if_id) else {
                continue;
            };
            let taken = self
                .metrics
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .on_message(&msg);
            if let Err(e) = taken {
                self.telemetry_rejected += 1;
                if self.telemetry_rejected == 1 {
                    tracing::warn!("orchestrator: telemetry message rejected: {e}");
                }
                continue;
            }
            match msg.body {
                Publication::Telemetry {
                    mode,
                    telemetry,
                    batching,
                    ..
                } if mode == Mode::Active.name() => rt.metrics = Some((telemetry, batching)),
                Publication::Telemetry { .. } => {}
                Publication::Provisioning { report } => rt.report = Some(report),
            }
        }
    }

    /// GSLICE's loop: each unpinned IF's demand from its telemetry
    /// (Algorithm 1), then a max-min fair allocation of the device; an IF
    /// whose share moves by at least the minimum step is re-provisioned.
    fn tune(&mut self) {
        let now = self.now_ns();
        let ids: Vec<u16> = self.telemetry_of.keys().copied().collect();
        for id in &ids {
            let Some(d) = self.state.get(*id).cloned() else {
                continue;
            };
            let Some(life) = self.lifecycle.view(*id) else {
                continue;
            };
            if d.pinned || life.switching || life.warm_until.is_some_and(|t| self.now() < t) {
                continue;
            }
            let rt = self.telemetry_of.get_mut(id).expect("listed");
            let Some((t, _)) = rt.metrics.as_ref() else {
                continue;
            };
            let obs = Observation {
                latency_ms: t.latency_us.ewma / 1e3,
                throughput_rps: t.throughput_per_s,
                arrival_rps: t.arrival_rate_per_s,
                slo_ms: d.slo_ms,
                share_pct: d.share_pct,
            };
            let report = rt.report.take();
            match rt.tuner.observe(now, &obs, report.as_ref()) {
                Ok(decision) => {
                    let reason = serde_json::to_value(decision.reason)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_owned))
                        .unwrap_or_default();
                    self.metrics_lock()
                        .on_tuning_decision(*id, &reason, decision.changed());
                    let line = decision.to_json_line();
                    if decision.changed() {
                        tracing::info!("orchestrator: tuning: {line}");
                    }
                    log_line(&mut self.decisions, &line);
                }
                Err(e) => tracing::warn!("orchestrator: tuning if {id}: {e}"),
            }
        }
        let claims: Vec<Claim> = self
            .state
            .ifs()
            .map(|d| {
                if d.pinned {
                    Claim::pinned(d.if_id, d.share_pct)
                } else {
                    let demand = self
                        .telemetry_of
                        .get(&d.if_id)
                        .map_or(d.share_pct, |rt| rt.tuner.demand_pct());
                    Claim::elastic(d.if_id, demand)
                }
            })
            .collect();
        let allocation = match self.allocator.allocate(&claims) {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!("orchestrator: allocation: {e}");
                return;
            }
        };
        log_line(
            &mut self.decisions,
            &json!({"at_ns": now, "allocation": serde_json::to_value(&allocation).unwrap_or(Value::Null)})
                .to_string(),
        );
        for share in &allocation.shares {
            let Some(d) = self.state.get(share.if_id).cloned() else {
                continue;
            };
            if d.pinned
                || self.state.busy(d.if_id).is_some()
                || (share.pct - d.share_pct).abs() < self.cfg.platform.min_step_pct
            {
                continue;
            }
            self.state.set_share(d.if_id, share.pct);
            let Some(d2) = self.state.get(d.if_id).cloned() else {
                continue;
            };
            let spec = spec_for(&self.state, &self.cores, &d2);
            // On a CPU host a share is its cores: a new percentage that maps
            // to the same cores changes nothing a new process would run with.
            let current = self.lifecycle.active_spec(d.if_id);
            if !self.on_gpu(&spec.model) && current.is_some_and(|a| a.cores == spec.cores) {
                self.lifecycle.set_active_share(d.if_id, spec.share_pct);
                continue;
            }
            let why = format!("tuning: share {:.1}% -> {:.1}%", d.share_pct, share.pct);
            if let Err(e) = self.request_switch(d.if_id, spec, why) {
                tracing::warn!("orchestrator: if {}: {e}", d.if_id);
                self.state.set_share(d.if_id, d.share_pct);
            }
        }
    }

    // ---------------------------------------------------------------------
    // Status, state file, shutdown

    fn status(&self) -> StatusReport {
        let mut report = StatusReport::from_desired(&self.state);
        report.platform = Some(json!({
            "if_manager_pid": self.ifm.as_ref().map(|p| p.proc.pid()),
            "platform_restarts": self.lifecycle.platform_restarts(),
            "telemetry_rejected": self.telemetry_rejected,
            "device": if self.gpu { "gpu" } else { "cpu" },
            "mps": self.mps.as_ref().map(crate::gpu::MpsState::describe),
            "cores": self.cores,
            "tuning": self.cfg.platform.tuning,
            "topology": self.topology,
        }));
        for row in &mut report.ifs {
            let Some(life) = self.lifecycle.view(row.if_id) else {
                continue;
            };
            let pid = life
                .active
                .and_then(|a| self.procs.get(&a))
                .map(|a| a.proc.pid());
            let metrics = self
                .telemetry_of
                .get(&row.if_id)
                .and_then(|t| t.metrics.as_ref());
            overlay(row, &life, pid, metrics);
        }
        report
    }

    /// Whether the model's IF runs on the GPU (its engine is a GPU one).
    fn on_gpu(&self, model: &str) -> bool {
        self.models.get(model).is_some_and(|e| e.engine.on_gpu())
    }

    /// How the IF's share is enforced: `cpu_cores` (its cores and as many
    /// engine threads), `mps` (a GPU IF while the MPS control daemon runs)
    /// or `none` (a GPU IF without MPS: the percentage is set but ignored).
    fn enforcement(&self, model: &str) -> &'static str {
        if !self.on_gpu(model) {
            "cpu_cores"
        } else if self
            .mps
            .as_ref()
            .is_some_and(crate::gpu::MpsState::enforces_shares)
        {
            "mps"
        } else {
            "none"
        }
    }

    fn metrics_lock(&self) -> std::sync::MutexGuard<'_, PlatformMetrics> {
        self.metrics.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Hands the metrics what the daemon knows: each IF's desired state and
    /// life cycle, the platform's restarts and the if-manager's pid.
    fn update_metrics_view(&self) {
        let ifs = self
            .state
            .ifs()
            .filter_map(|d| {
                let life = self.lifecycle.view(d.if_id)?;
                let state = if_state(&life);
                Some(crate::metrics::IfView {
                    if_id: d.if_id,
                    model: d.model.clone(),
                    state: serde_json::to_value(state)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_owned))
                        .unwrap_or_default(),
                    share_pct: d.share_pct,
                    enforcement: self.enforcement(&d.model),
                    pinned: d.pinned,
                    cores: self
                        .lifecycle
                        .active_spec(d.if_id)
                        .map_or(0, |s| s.cores.len()),
                    slo_ms: d.slo_ms,
                    switchover_gaps_ns: life.gaps_ns.to_vec(),
                    failovers: life.failovers,
                })
            })
            .collect();
        let platform = PlatformView {
            platform_restarts: self.lifecycle.platform_restarts(),
            telemetry_rejected: self.telemetry_rejected,
            device: if self.gpu { "gpu" } else { "cpu" },
            if_manager_pid: self
                .ifm
                .as_ref()
                .filter(|p| !p.exit_told)
                .map(|p| p.proc.pid()),
        };
        self.metrics_lock().set_views(ifs, platform);
    }

    fn save_state(&self) {
        let ifm: Option<u32> = self.ifm.as_ref().map(|p| p.proc.pid());
        let mut pids: Vec<u32> = ifm.into_iter().collect();
        pids.extend(self.procs.values().map(|p| p.proc.pid()));
        let state = json!({
            "orchestrator": std::process::id(),
            "if_manager": ifm,
            "pids": pids,
        });
        let _ = std::fs::write(self.runtime_dir.join("state.json"), state.to_string());
    }

    fn finish(mut self) -> Value {
        // The endpoint stops first: the if-manager it asks is going.
        self.metrics_endpoint.take();
        let ifm_report = self.ifm.take().and_then(|mut ifm| {
            ifm.proc.terminate();
            let exit = ifm.proc.wait_or_kill(Duration::from_secs(10));
            let report = ifm.proc.report();
            if report.is_none() {
                tracing::warn!(
                    "orchestrator: the if-manager (pid {}) left no final report (exit: {exit:?}): {}",
                    ifm.proc.pid(),
                    ifm.proc.tail()
                );
            }
            report
        });
        let _ = std::fs::remove_file(self.runtime_dir.join("state.json"));
        let ifs: Vec<Value> = self
            .lifecycle
            .if_ids()
            .filter_map(|id| Some((id, self.lifecycle.view(id)?)))
            .map(|(id, rt)| {
                json!({
                    "if_id": id,
                    "switchovers": rt.gaps_ns.len(),
                    "switchover_gaps_us": rt.gaps_ns.iter().map(|g| *g as f64 / 1e3).collect::<Vec<_>>(),
                    "switchover_windows_unix_us": self.switch_windows.get(&id).cloned().unwrap_or_default(),
                    "failovers": rt.failovers,
                })
            })
            .collect();
        json!({
            "ifs": ifs,
            "platform_restarts": self.lifecycle.platform_restarts(),
            "if_manager": ifm_report,
        })
    }
}

impl Handler for Daemon {
    fn handle(&mut self, req: Request) -> Reply {
        let change = match self.state.plan(&req, &self.models) {
            Ok(change) => change,
            Err(e) => return e.into(),
        };
        match &change {
            Change::Status => return Reply::status(&self.status()),
            Change::Deploy { new } => {
                let spec = spec_for(&self.state, &self.cores, new);
                let tuner = match ShareTuner::new(new.if_id, new.share_pct, self.tuning) {
                    Ok(t) => t,
                    Err(e) => return ControlError::Failed(e.to_string()).into(),
                };
                let id = new.if_id;
                if let Some(e) = self.feed(Event::Deploy { if_id: id, spec }) {
                    return ControlError::Failed(e.to_string()).into();
                }
                self.telemetry_of.insert(
                    id,
                    IfTelemetry {
                        tuner,
                        metrics: None,
                        report: None,
                    },
                );
                let reply = change.reply();
                self.state.apply(change);
                return reply;
            }
            Change::Update { old, new } => {
                if old.share_pct != new.share_pct || old.slo_ms != new.slo_ms {
                    let why = if old.slo_ms != new.slo_ms {
                        format!("slo {} -> {} ms", old.slo_ms, new.slo_ms)
                    } else {
                        format!("share {:.1}% -> {:.1}%", old.share_pct, new.share_pct)
                    };
                    let spec = spec_for(&self.state, &self.cores, new);
                    if let Err(e) = self.request_switch(new.if_id, spec, why) {
                        return ControlError::Failed(e).into();
                    }
                }
                if !new.pinned {
                    let now = self.now_ns();
                    if let Some(rt) = self.telemetry_of.get_mut(&new.if_id) {
                        rt.tuner.set_demand(new.share_pct, now);
                    }
                }
            }
            Change::Retire { old } => {
                let id = old.if_id;
                self.feed(Event::Retire { if_id: id });
                let reply = change.reply();
                self.state.apply(change);
                return reply;
            }
            Change::Shutdown => {
                tracing::info!("orchestrator: shutting down");
                self.feed(Event::Shutdown);
            }
        }
        let reply = change.reply();
        self.state.apply(change);
        self.save_state();
        reply
    }
}

/// Where an IF is in its life, as status and the metrics say it.
fn if_state(life: &IfView<'_>) -> IfState {
    match life.busy {
        Some(Busy::Starting) => IfState::Starting,
        Some(Busy::Switching) => IfState::Switching,
        Some(Busy::Retiring) => IfState::Retiring,
        None if life.active.is_none() => IfState::Failed,
        None => IfState::Active,
    }
}

/// Fills `row` with what the daemon measured and knows of an IF.
fn overlay(
    row: &mut StatusRow,
    life: &IfView<'_>,
    pid: Option<u32>,
    metrics: Option<&(TelemetrySnapshot, BatchStats)>,
) {
    row.state = if_state(life);
    row.pid = pid;
    row.switchovers = life.gaps_ns.len() as u64;
    row.last_switchover_gap_us = life.gaps_ns.last().map(|g| g / 1000);
    row.reason = life.reason.map(str::to_string);
    if let Some((t, b)) = metrics {
        row.throughput_rps = Some(t.throughput_per_s);
        row.arrival_rps = Some(t.arrival_rate_per_s);
        row.p50_ms = Some(t.latency_us.p50 as f64 / 1e3);
        row.p99_ms = Some(t.latency_us.p99 as f64 / 1e3);
        row.slo_attainment = t.slo_attainment;
        row.batch_size = Some(b.target_batch as u32);
        row.mean_batch_size = Some(t.mean_batch_size).filter(|_| t.batches != 0);
    }
}

/// The spec an IF should run with now: its desired model, binary and
/// SLO, its share, and cores for it given every IF's share (in `state`,
/// as it is when this is called).
fn spec_for(state: &DesiredState, all_cores: &[usize], d: &DesiredIf) -> Spec {
    let mut shares: Vec<crate::alloc::Share> = state
        .ifs()
        .map(|i| crate::alloc::Share {
            if_id: i.if_id,
            pct: i.share_pct,
            basis: crate::alloc::Basis::Demand,
        })
        .collect();
    if !shares.iter().any(|s| s.if_id == d.if_id) {
        shares.push(crate::alloc::Share {
            if_id: d.if_id,
            pct: d.share_pct,
            basis: crate::alloc::Basis::Demand,
        });
    }
    let cores = match split_cores(all_cores, &shares) {
        Ok(sets) => sets
            .into_iter()
            .find(|s| s.if_id == d.if_id)
            .map(|s| s.cores)
            .unwrap_or_else(|| all_cores.to_vec()),
        // More IFs than cores: they share all of them.
        Err(_) => all_cores.to_vec(),
    };
    Spec {
        model: d.model.clone(),
        binary: d.binary.clone(),
        slo_ms: d.slo_ms,
        share_pct: d.share_pct,
        cores,
    }
}

/// `kp-if --inference-spin-ms` for an IF on `cores` whose fragment thread
/// runs on `fragment` while the other IFs run on `others`: `spin_ms` when
/// those cores are its own (none shared with its fragment thread or
/// another IF), else 0 — a spinning thread takes the CPU whoever shares
/// its core needs.
fn inference_spin_for(
    spin_ms: u64,
    cores: &[usize],
    fragment: &[usize],
    others: &[Vec<usize>],
) -> u64 {
    let shared = |set: &[usize]| set.iter().any(|c| cores.contains(c));
    if spin_ms == 0 || shared(fragment) || others.iter().any(|o| shared(o)) {
        0
    } else {
        spin_ms
    }
}

/// Creates `dir` (and parents) readable by the owner only.
fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
}

/// TERMs `pids`, KILLs those still alive after `grace`, and waits (up to
/// 5 s more) until they are gone: one still mapping the old hugepage files
/// would keep a new if-manager from removing them.
fn stop_all(pids: &[u32], grace: Duration) {
    let alive = |p: &&u32| kp_os::affinity::process_alive(**p);
    let wait = |until: Instant| {
        while pids.iter().any(|p| alive(&p)) && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    for p in pids {
        crate::process::signal(*p, "TERM");
    }
    wait(Instant::now() + grace);
    for p in pids.iter().filter(alive) {
        crate::process::signal(*p, "KILL");
    }
    wait(Instant::now() + Duration::from_secs(5));
}

/// Removes the socket file of an `ipc://` endpoint, if it is there: a
/// process killed with SIGKILL leaves its bound sockets' files behind.
fn remove_ipc_file(endpoint: &str) {
    if let Some(path) = endpoint.strip_prefix("ipc://") {
        let _ = std::fs::remove_file(path);
    }
}

/// The socket files of kp-if processes (`if-*.sock`, `tm-*.sock`) in
/// `runtime_dir`: none of them is live once no kp-if of this runtime
/// directory runs.
fn remove_kp_if_sockets(runtime_dir: &Path) {
    let Ok(entries) = std::fs::read_dir(runtime_dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let name = name.to_string_lossy();
        if (name.starts_with("if-") || name.starts_with("tm-")) && name.ends_with(".sock") {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// A previous orchestrator that died left its processes running: stop
/// them (they hold the platform's shared memory), so this one starts clean;
/// and the socket files of its kp-ifs go, as they would have had they
/// exited under it.
fn clean_up_previous(runtime_dir: &Path) {
    let path = runtime_dir.join("state.json");
    let Ok(text) = std::fs::read_to_string(&path) else {
        return;
    };
    let Ok(state) = serde_json::from_str::<Value>(&text) else {
        return;
    };
    let owner = state["orchestrator"].as_u64().unwrap_or(0) as u32;
    if kp_os::affinity::process_alive(owner) && owner != std::process::id() {
        tracing::warn!(
            "orchestrator: another orchestrator (pid {owner}) runs on {}",
            runtime_dir.display()
        );
        return;
    }
    let pids: Vec<u32> = state["pids"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|p| p.as_u64())
                .map(|p| p as u32)
                .collect()
        })
        .unwrap_or_default();
    let ifm = state["if_manager"].as_u64().map(|p| p as u32);
    let alive = |p: &u32| kp_os::affinity::process_alive(*p);
    // The IFs first, while their if-manager still runs: each finishes what
    // it holds, its answers go out, and it says goodbye and exits at once
    // (with the if-manager gone first, each would wait out its goodbye's
    // timeout). Then the if-manager.
    let ifs: Vec<u32> = pids
        .iter()
        .copied()
        .filter(|p| Some(*p) != ifm)
        .filter(alive)
        .collect();
    let ifm: Vec<u32> = ifm.into_iter().filter(alive).collect();
    if !ifs.is_empty() || !ifm.is_empty() {
        tracing::warn!(
            "orchestrator: cleaning up {} processes a previous orchestrator left: {:?}",
            ifs.len() + ifm.len(),
            ifs.iter().chain(&ifm).collect::<Vec<_>>()
        );
    }
    stop_all(&ifs, Duration::from_secs(10));
    stop_all(&ifm, Duration::from_secs(10));
    remove_kp_if_sockets(runtime_dir);
    let _ = std::fs::remove_file(path);
}

/// The NIC the if-manager's EAL arguments name: an allowed PCI device
/// (`-a`, `--allow`), or a virtual device's interface (`iface=` of
/// af_packet), or the virtual device itself.
/// The driver plugins (`-d PATH`, `-dPATH`) among the if-manager's EAL
/// arguments: an IF, a secondary process, must load the drivers its
/// primary loaded (the mempool's ops among them), and on a machine
/// without an installed DPDK (a bundle carried to a GPU server) they come
/// only from there.
fn driver_args(eal: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    let mut args = eal.iter();
    while let Some(a) = args.next() {
        if a == "-d" {
            if let Some(path) = args.next() {
                out.extend(["-d".to_string(), path.clone()]);
            }
        } else if let Some(path) = a.strip_prefix("-d").filter(|p| !p.is_empty()) {
            out.extend(["-d".to_string(), path.to_string()]);
        }
    }
    out
}

fn nic_hint(eal: &[String]) -> NicHint {
    let mut args = eal.iter();
    while let Some(a) = args.next() {
        match a.as_str() {
            "-a" | "--allow" | "-w" => {
                if let Some(v) = args.next() {
                    return NicHint::parse(v.split(',').next().unwrap_or(v));
                }
            }
            "--vdev" => {
                if let Some(v) = args.next() {
                    if let Some(iface) = v.split(',').find_map(|kv| kv.strip_prefix("iface=")) {
                        return NicHint::Interface(iface.to_string());
                    }
                    return NicHint::parse(v);
                }
            }
            _ => {}
        }
    }
    NicHint::Unknown
}

/// Now on the wall clock, µs since the Unix epoch (0 before it).
fn unix_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn the_ifs_load_the_driver_plugins_their_if_manager_loads() {
        let eal: Vec<String> = [
            "--lcores",
            "0@0",
            "-d",
            "/b/pmds",
            "--vdev",
            "x",
            "-d/b/x.so",
            "--no-pci",
        ]
        .map(String::from)
        .to_vec();
        assert_eq!(driver_args(&eal), ["-d", "/b/pmds", "-d", "/b/x.so"]);
        assert!(driver_args(&["--lcores".into(), "0@0".into()]).is_empty());
        // A trailing -d without its path is the EAL's to refuse.
        assert!(driver_args(&["-d".into()]).is_empty());
    }

    #[test]
    fn an_if_spins_only_on_cores_of_its_own() {
        // Two IFs on cores 1 and 2-3, fragment threads on core 0.
        assert_eq!(inference_spin_for(1000, &[1], &[0], &[vec![2, 3]]), 1000);
        assert_eq!(inference_spin_for(0, &[1], &[0], &[vec![2, 3]]), 0);
        // Its fragment thread beside its engine (no fragment_cores).
        assert_eq!(inference_spin_for(1000, &[1], &[1], &[]), 0);
        assert_eq!(inference_spin_for(1000, &[1, 2], &[2, 0], &[]), 0);
        // More IFs than cores: they share all of them.
        assert_eq!(inference_spin_for(1000, &[1, 2], &[0], &[vec![1, 2]]), 0);
    }

    #[test]
    fn the_nic_is_read_from_the_eal_arguments() {
        assert_eq!(
            nic_hint(&args("--lcores 0@0 -a 0000:3b:00.0,txq_inline=0")),
            NicHint::Pci("0000:3b:00.0".into())
        );
        assert_eq!(
            nic_hint(&args("--vdev net_af_packet0,iface=veth1 --no-pci")),
            NicHint::Interface("veth1".into())
        );
        assert_eq!(
            nic_hint(&args("--vdev net_pcap0,rx_pcap=a.pcap")),
            NicHint::Virtual("net_pcap0".into())
        );
        assert_eq!(nic_hint(&args("--lcores 0@0")), NicHint::Unknown);
    }
}
