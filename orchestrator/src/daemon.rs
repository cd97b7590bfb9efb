//! The orchestrator daemon: the if-manager and the inference functions as
//! processes, driven towards the desired state.
//!
//! One thread runs [`Daemon::run`]: every few milliseconds it serves at most
//! one control request ([`crate::control`]), reaps and replaces processes
//! that died, moves switchovers along, reads telemetry, and once a tuning
//! period runs GSLICE's loop ([`crate::tuning`], [`crate::alloc`]). Nothing
//! in it waits long: a process start is a state it polls.
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

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use libml::batching::{BatchStats, ProvisioningReport};
use libml::messages::{IfCommand, IfManagerCommand, ReadyRole};
use libml::runtime::handover::Mode;
use libml::telemetry::{IfMessage, Publication, TelemetrySnapshot};
use serde_json::{json, Value};

use crate::alloc::{split_cores, AllocConfig, Claim, ShareAllocator};
use crate::config::PlatformConfig;
use crate::control::{
    Change, ControlError, DesiredIf, DesiredState, Handler, IfState, ModelCatalog, Reply, Request,
    StatusReport, StatusRow,
};
use crate::lcores::{LcoreIds, LcoreLease};
use crate::process::{if_request, log_line, request, Proc, ReadyPipe};
use crate::topology::{NicHint, Topology};
use crate::tuning::{Observation, ShareTuner, TuningConfig};

/// How long an IF's control socket may take to answer (a starved machine
/// can take seconds to schedule a parked process).
const IF_TIMEOUT: Duration = Duration::from_secs(10);
/// How long after a switchover an IF's telemetry is not acted on: its new
/// process's first rate windows are not yet its steady state.
const WARM_UP: Duration = Duration::from_secs(3);
/// How long a process may take to say it is ready (model load included).
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long IF processes get to finish and exit after `shutdown` (SIGTERM)
/// before they are killed: an IF answers what it holds within its
/// reassembly timeout and a batch, well under this; one that has not exited
/// by then is stuck, and shutdown must not wait on it forever.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// What one `kp-if` process runs with.
#[derive(Clone, Debug, PartialEq)]
struct Spec {
    model: String,
    binary: PathBuf,
    slo_ms: f64,
    share_pct: f64,
    cores: Vec<usize>,
}

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
    spec: Spec,
}

/// A re-provision in progress.
#[derive(Debug)]
struct Switch {
    /// The new shadow; `None` while it waits for its turn to start.
    pending: Option<IfProc>,
    spec: Spec,
    why: String,
}

/// What the daemon knows of one IF at run time.
#[derive(Debug)]
struct IfRuntime {
    active: Option<IfProc>,
    shadow: Option<IfProc>,
    switch: Option<Switch>,
    tuner: ShareTuner,
    /// The active's latest statistics and batching state.
    metrics: Option<(TelemetrySnapshot, BatchStats)>,
    report: Option<ProvisioningReport>,
    gaps_ns: Vec<u64>,
    failovers: u64,
    reason: Option<String>,
    /// No tuning on its telemetry before this (a new process warming up).
    warm_until: Option<Instant>,
}

impl IfRuntime {
    /// Its processes: the active, the shadow, a re-provision's new one.
    fn procs(&self) -> impl Iterator<Item = &IfProc> {
        [
            self.active.as_ref(),
            self.shadow.as_ref(),
            self.switch.as_ref().and_then(|s| s.pending.as_ref()),
        ]
        .into_iter()
        .flatten()
    }

    /// [`IfRuntime::procs`], mutably.
    fn procs_mut(&mut self) -> impl Iterator<Item = &mut IfProc> {
        [
            self.active.as_mut(),
            self.shadow.as_mut(),
            self.switch.as_mut().and_then(|s| s.pending.as_mut()),
        ]
        .into_iter()
        .flatten()
    }

    /// Takes all its processes out (retire, shutdown, a platform restart);
    /// a pending re-provision is dropped with them.
    fn take_procs(&mut self) -> impl Iterator<Item = IfProc> {
        [
            self.active.take(),
            self.shadow.take(),
            self.switch.take().and_then(|s| s.pending),
        ]
        .into_iter()
        .flatten()
    }
}

/// The daemon.
pub struct Daemon {
    cfg: PlatformConfig,
    runtime_dir: PathBuf,
    ifm_control: String,
    ifm: Option<Proc>,
    state: DesiredState,
    models: ModelCatalog,
    ifs: BTreeMap<u16, IfRuntime>,
    /// Old actives finishing what they hold, retired IFs' processes.
    leaving: Vec<(u16, IfProc)>,
    /// IFs retired whose processes are still leaving (then unregistered).
    retiring: Vec<u16>,
    cores: Vec<usize>,
    gpu: bool,
    allocator: ShareAllocator,
    tuning: TuningConfig,
    lcores: LcoreIds,
    _zmq: zmq::Context,
    telemetry: zmq::Socket,
    decisions: Option<File>,
    clock: Instant,
    last_tuning: Instant,
    platform_restarts: u64,
    /// Telemetry messages that did not parse as an [`IfMessage`].
    telemetry_rejected: u64,
    /// Since when the if-manager is being restarted.
    ifm_restarting: Option<Instant>,
    /// Since when it is shutting down (processes killed after the grace).
    shutdown_since: Option<Instant>,
    /// The machine as hwloc sees it, for status.
    topology: Value,
}

impl std::fmt::Debug for Daemon {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Daemon")
            .field("runtime_dir", &self.runtime_dir)
            .field("ifs", &self.ifs.keys().collect::<Vec<_>>())
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
        let cores = topology.cores_near_nic(&nic);
        let topology_summary = topology.summary(&nic);
        let gpu = crate::gpu::gpu_present();
        if gpu {
            tracing::info!("orchestrator: {}", crate::gpu::ensure_mps().describe());
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
        let mut d = Daemon {
            ifm_control: format!("ipc://{}", runtime_dir.join("if-manager.sock").display()),
            runtime_dir,
            ifm: None,
            state: DesiredState::new(kp_if),
            models,
            ifs: BTreeMap::new(),
            leaving: Vec::new(),
            retiring: Vec::new(),
            cores,
            gpu,
            allocator: ShareAllocator::new(AllocConfig::default())?,
            tuning,
            lcores: LcoreIds::default(),
            _zmq: ctx,
            telemetry,
            decisions: None,
            clock: Instant::now(),
            last_tuning: Instant::now(),
            platform_restarts: 0,
            telemetry_rejected: 0,
            ifm_restarting: None,
            shutdown_since: None,
            topology: topology_summary,
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
            d.wait_until_idle(START_TIMEOUT)?;
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
            if self.state.is_shutting_down() {
                if self.all_ifs_gone() {
                    return self.finish();
                }
                self.kill_stragglers();
            }
        }
    }

    /// One round of housekeeping (also used while starting).
    fn step(&mut self) {
        self.read_telemetry();
        self.reap();
        let ids: Vec<u16> = self.ifs.keys().copied().collect();
        for id in ids {
            self.progress(id);
        }
        self.reap_leaving();
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
                .ifs
                .keys()
                .copied()
                .filter(|id| self.state.busy(*id).is_some())
                .collect();
            if busy.is_empty() {
                return Ok(());
            }
            if Instant::now() > deadline {
                anyhow::bail!("IFs {busy:?} did not start within {timeout:?}");
            }
            if let Some(r) = busy.iter().find_map(|id| self.ifs[id].reason.clone()) {
                anyhow::bail!("{r}");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn now_ns(&self) -> u64 {
        self.clock.elapsed().as_nanos() as u64
    }

    // ---------------------------------------------------------------------
    // Processes

    /// Starts the if-manager and waits until it serves (at start-up, before
    /// the control socket is served).
    fn start_if_manager(&mut self) -> anyhow::Result<()> {
        let mut p = self.spawn_if_manager()?;
        let deadline = Instant::now() + START_TIMEOUT;
        while !p.is_ready() {
            if p.poll_exit().is_some() || Instant::now() > deadline {
                anyhow::bail!("the if-manager did not start:\n{}", p.tail());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        tracing::info!("orchestrator: if-manager ready (pid {})", p.pid());
        self.ifm = Some(p);
        self.save_state();
        Ok(())
    }

    fn spawn_if_manager(&mut self) -> anyhow::Result<Proc> {
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
        cmd.args(&c.options)
            .args(["--control", &self.ifm_control])
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
            .args(["--lcores", &format!("{lcore}@({cpu_list})")])
            .args(["--no-pci", "--no-telemetry", "--log-level", "lib.eal:error"]);
        if self.gpu {
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
            spec: spec.clone(),
        };
        self.save_state();
        Ok(p)
    }

    /// The spec an IF should run with now: its desired model, binary and
    /// SLO, its share, and cores for it given every IF's share.
    fn spec_for(&self, d: &DesiredIf) -> Spec {
        let mut shares: Vec<crate::alloc::Share> = self
            .state
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
        let cores = match split_cores(&self.cores, &shares) {
            Ok(sets) => sets
                .into_iter()
                .find(|s| s.if_id == d.if_id)
                .map(|s| s.cores)
                .unwrap_or_else(|| self.cores.clone()),
            // More IFs than cores: they share all of them.
            Err(_) => self.cores.clone(),
        };
        Spec {
            model: d.model.clone(),
            binary: d.binary.clone(),
            slo_ms: d.slo_ms,
            share_pct: d.share_pct,
            cores,
        }
    }

    /// Reaps exited processes and replaces them.
    fn reap(&mut self) {
        if self.ifm_restarting.is_some() {
            self.progress_restart();
            return;
        }
        if let Some(ifm) = self.ifm.as_mut() {
            if let Some(status) = ifm.poll_exit() {
                if !self.state.is_shutting_down() {
                    tracing::warn!(
                        "orchestrator: the if-manager died ({status}); restarting the platform"
                    );
                    self.restart_platform();
                }
                return;
            }
        }
        // A kp-if that never gets ready would hold up every start after it
        // (one at a time): kill it; it is then reaped like any dead one.
        for rt in self.ifs.values_mut() {
            for p in rt.procs_mut() {
                if p.proc.is_starting() && p.proc.age() > START_TIMEOUT {
                    tracing::warn!(
                        "orchestrator: {} not ready after {START_TIMEOUT:?}; killing it:\n{}",
                        p.proc.name(),
                        p.proc.tail()
                    );
                    p.proc.kill();
                }
            }
        }
        let ids: Vec<u16> = self.ifs.keys().copied().collect();
        for id in ids {
            let shutting = self.state.is_shutting_down() || self.retiring.contains(&id);
            let rt = self.ifs.get_mut(&id).expect("listed");
            // A dead shadow: start another (below, in `progress`).
            if let Some(s) = rt.shadow.as_mut() {
                if let Some(status) = s.proc.poll_exit() {
                    if !shutting {
                        tracing::warn!(
                            "orchestrator: {} exited ({status}):\n{}",
                            s.proc.name(),
                            s.proc.tail()
                        );
                    }
                    rt.shadow = None;
                }
            }
            if let Some((sw, p)) = rt
                .switch
                .as_mut()
                .and_then(|sw| sw.pending.as_mut().map(|p| (&sw.why, p)))
            {
                if let Some(status) = p.proc.poll_exit() {
                    rt.reason = Some(format!(
                        "re-provision ({sw}) failed: {} exited ({status}): {}",
                        p.proc.name(),
                        p.proc.tail()
                    ));
                    tracing::warn!("orchestrator: {}", rt.reason.as_deref().unwrap_or(""));
                    rt.switch = None;
                    self.state.clear_busy(id);
                }
            }
            let rt = self.ifs.get_mut(&id).expect("listed");
            let Some(a) = rt.active.as_mut() else {
                continue;
            };
            let Some(status) = a.proc.poll_exit() else {
                continue;
            };
            if shutting {
                let a = rt.active.take().expect("checked");
                self.leaving.push((id, a));
                continue;
            }
            tracing::warn!(
                "orchestrator: the active {} died ({status}); failing over",
                a.proc.name()
            );
            let dead = rt.active.take().expect("checked");
            self.leaving.push((id, dead));
            self.fail_over(id);
        }
    }

    /// Makes the shadow of `if_id` active after its active died, or starts
    /// a new active if there is no ready shadow.
    fn fail_over(&mut self, id: u16) {
        let rt = self.ifs.get_mut(&id).expect("exists");
        rt.failovers += 1;
        if let Some(s) = rt.shadow.take() {
            if s.proc.is_ready() {
                match if_request(&s.listen, IfCommand::Activate, IF_TIMEOUT) {
                    Ok(_) => {
                        tracing::info!("orchestrator: {} took over", s.proc.name());
                        rt.active = Some(s);
                        rt.metrics = None;
                        rt.warm_until = Some(Instant::now() + WARM_UP);
                        rt.reason = None;
                        return; // a new shadow is started by `progress`
                    }
                    Err(e) => tracing::warn!("orchestrator: activating {}: {e}", s.proc.name()),
                }
            }
            // Not taking over: stop it. Left running, a shadow that is still
            // loading parks and never exits, and one whose activation half
            // happened holds the ring, so every new active would refuse to
            // start ("already served") and be failed over again.
            s.proc.terminate();
            self.leaving.push((id, s));
        }
        // No ready shadow: start a new active (it takes the ring from the
        // dead owner and answers what it held).
        let Some(d) = self.state.get(id).cloned() else {
            return;
        };
        let spec = self.spec_for(&d);
        match self.spawn_if(id, &spec, false) {
            Ok(p) => {
                let rt = self.ifs.get_mut(&id).expect("exists");
                rt.active = Some(p);
                self.state.set_busy(id, "starting");
            }
            Err(e) => self.ifs.get_mut(&id).expect("exists").reason = Some(e),
        }
    }

    /// Moves `if_id` along: a started active becomes ready, a missing
    /// shadow is started, a pending re-provision is carried out.
    fn progress(&mut self, id: u16) {
        if self.state.is_shutting_down() || self.retiring.contains(&id) {
            return;
        }
        let busy = self.state.busy(id).map(str::to_string);
        let rt = self.ifs.get_mut(&id).expect("listed");
        let active_ready = rt.active.as_ref().is_some_and(|a| a.proc.is_ready());
        if busy.as_deref() == Some("starting") {
            if active_ready {
                tracing::info!(
                    "orchestrator: {} serving",
                    rt.active.as_ref().map_or("", |a| a.proc.name())
                );
                self.state.clear_busy(id);
            } else if let Some(a) = rt.active.as_ref() {
                if a.proc.age() > START_TIMEOUT {
                    rt.reason = Some(format!(
                        "{} did not start: {}",
                        a.proc.name(),
                        a.proc.tail()
                    ));
                }
                return;
            }
        }
        let starting = self.starting_if().map(str::to_string);
        let rt = self.ifs.get_mut(&id).expect("listed");
        if let Some(sw) = rt.switch.as_ref() {
            match &sw.pending {
                // Parked and ready: switch (to nobody's active if it died).
                Some(p) if p.proc.is_ready() && (active_ready || rt.active.is_none()) => {
                    self.complete_switch(id);
                }
                Some(_) => {}
                None if starting.is_none() => {
                    let spec = sw.spec.clone();
                    match self.spawn_if(id, &spec, true) {
                        Ok(p) => {
                            tracing::info!(
                                "orchestrator: re-provisioning if {id}: starting {}",
                                p.proc.name()
                            );
                            let sw = self.ifs.get_mut(&id).and_then(|rt| rt.switch.as_mut());
                            sw.expect("checked").pending = Some(p);
                        }
                        Err(e) => {
                            let rt = self.ifs.get_mut(&id).expect("listed");
                            rt.reason = Some(format!("re-provision failed: {e}"));
                            rt.switch = None;
                            self.state.clear_busy(id);
                        }
                    }
                }
                None => {} // waits for `starting` to be ready
            }
            return;
        }
        // One kp-if starts at a time (below): each start maps DPDK's shared
        // memory and loads a model, and two at once on a busy machine can
        // stall the others for seconds (a process still starting cannot
        // answer DPDK's memory-map syncs).
        if rt.shadow.is_none() && active_ready && starting.is_none() {
            let Some(a) = rt.active.as_ref() else { return };
            let spec = a.spec.clone();
            match self.spawn_if(id, &spec, true) {
                Ok(s) => self.ifs.get_mut(&id).expect("listed").shadow = Some(s),
                Err(e) => self.ifs.get_mut(&id).expect("listed").reason = Some(e),
            }
        }
    }

    /// The kp-if process that is starting (not yet ready), if any: a
    /// shadow or a re-provision's new shadow waits for it to be ready
    /// before it starts (a fail-over or a deploy does not wait).
    fn starting_if(&self) -> Option<&str> {
        self.ifs
            .values()
            .flat_map(IfRuntime::procs)
            .find(|p| p.proc.is_starting())
            .map(|p| p.proc.name())
    }

    /// Starts a re-provision of `if_id` to `spec`: its new shadow starts
    /// now, or once the kp-if now starting is ready.
    fn begin_switch(&mut self, id: u16, spec: Spec, why: String) -> Result<(), String> {
        let pending = match self.starting_if() {
            Some(other) => {
                tracing::info!(
                    "orchestrator: re-provisioning if {id} ({why}): waiting for {other} to start first"
                );
                None
            }
            None => {
                let p = self.spawn_if(id, &spec, true)?;
                tracing::info!(
                    "orchestrator: re-provisioning if {id} ({why}): starting {}",
                    p.proc.name()
                );
                Some(p)
            }
        };
        let rt = self.ifs.get_mut(&id).ok_or("no such IF")?;
        rt.switch = Some(Switch { pending, spec, why });
        self.state.set_busy(id, "switching");
        Ok(())
    }

    /// The pending shadow is parked: activate it, make the active yield,
    /// record the gap, retire the old pair and start a new shadow.
    fn complete_switch(&mut self, id: u16) {
        let rt = self.ifs.get_mut(&id).expect("listed");
        let Some(sw) = rt.switch.take() else { return };
        let Some(new) = sw.pending else { return };
        let result = (|| -> Result<u64, String> {
            if_request(&new.listen, IfCommand::Activate, IF_TIMEOUT)?;
            if let Some(a) = rt.active.as_ref() {
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
        })();
        match result {
            Ok(gap_ns) => {
                tracing::info!(
                    "orchestrator: if {id} switched to {} ({}); gap {:.1} µs",
                    new.proc.name(),
                    sw.why,
                    gap_ns as f64 / 1e3
                );
                rt.gaps_ns.push(gap_ns);
                rt.reason = None;
                rt.metrics = None;
                rt.warm_until = Some(Instant::now() + WARM_UP);
                let old_active = rt.active.replace(new);
                let old_shadow = rt.shadow.take();
                // The old active exits by itself once it has finished what
                // it holds; the old shadow has the old share: stop it.
                if let Some(s) = &old_shadow {
                    s.proc.terminate();
                }
                self.leaving
                    .extend(old_active.into_iter().chain(old_shadow).map(|p| (id, p)));
            }
            Err(e) => {
                rt.reason = Some(format!("re-provision ({}) failed: {e}", sw.why));
                tracing::warn!(
                    "orchestrator: if {id}: {}",
                    rt.reason.as_deref().unwrap_or("")
                );
                new.proc.terminate();
                self.leaving.push((id, new));
            }
        }
        self.state.clear_busy(id);
        self.save_state();
    }

    /// Reaps processes that are leaving; unregisters retired IFs once all
    /// theirs are gone.
    fn reap_leaving(&mut self) {
        let telemetry = &self.telemetry;
        self.leaving.retain_mut(|(_, p)| {
            if p.proc.poll_exit().is_some() {
                let _ = telemetry.disconnect(&p.telemetry);
                false
            } else {
                true
            }
        });
        let gone: Vec<u16> = self
            .retiring
            .iter()
            .copied()
            .filter(|id| !self.leaving.iter().any(|(i, _)| i == id))
            .filter(|id| {
                self.ifs.get(id).is_none_or(|rt| {
                    rt.active.is_none() && rt.shadow.is_none() && rt.switch.is_none()
                })
            })
            .collect();
        for id in gone {
            let _ = request(
                &self.ifm_control,
                &IfManagerCommand::Unregister { if_id: id },
                IF_TIMEOUT,
            );
            self.ifs.remove(&id);
            self.retiring.retain(|i| *i != id);
            self.state.clear_busy(id);
            tracing::info!("orchestrator: if {id} retired");
        }
    }

    /// The if-manager died: every IF lost its rings. Stop them all, start
    /// the if-manager again, redeploy the desired state.
    fn restart_platform(&mut self) {
        self.platform_restarts += 1;
        let ids: Vec<u16> = self.ifs.keys().copied().collect();
        for id in ids {
            let rt = self.ifs.get_mut(&id).expect("listed");
            for mut p in rt.take_procs() {
                p.proc.kill();
                self.leaving.push((id, p));
            }
            self.state.set_busy(id, "starting");
        }
        self.ifm = None;
        self.respawn_if_manager();
    }

    /// Starts the if-manager again (without waiting: [`Self::step`] sees it
    /// ready, then starts the IFs).
    fn respawn_if_manager(&mut self) {
        self.ifm_restarting = Some(Instant::now());
        match self.spawn_if_manager() {
            Ok(p) => {
                tracing::info!("orchestrator: restarting the if-manager (pid {})", p.pid());
                self.ifm = Some(p);
            }
            Err(e) => tracing::warn!("orchestrator: cannot restart the if-manager: {e:#}"),
        }
        self.save_state();
    }

    /// A restarting if-manager that is ready gets its IFs back; one that
    /// died again is retried a second later.
    fn progress_restart(&mut self) {
        let Some(since) = self.ifm_restarting else {
            return;
        };
        let ready = self.ifm.as_ref().is_some_and(Proc::is_ready);
        let dead = self.ifm.as_mut().is_none_or(|p| p.poll_exit().is_some());
        if dead {
            if since.elapsed() > Duration::from_secs(1) {
                if let Some(p) = &self.ifm {
                    tracing::warn!("orchestrator: the if-manager did not start:\n{}", p.tail());
                }
                self.respawn_if_manager();
            }
            return;
        }
        if !ready {
            return;
        }
        self.ifm_restarting = None;
        tracing::info!("orchestrator: if-manager ready again; redeploying");
        let ids: Vec<u16> = self.ifs.keys().copied().collect();
        for id in ids {
            let Some(d) = self.state.get(id).cloned() else {
                continue;
            };
            let spec = self.spec_for(&d);
            match self.spawn_if(id, &spec, false) {
                Ok(p) => self.ifs.get_mut(&id).expect("listed").active = Some(p),
                Err(e) => self.ifs.get_mut(&id).expect("listed").reason = Some(e),
            }
        }
    }

    /// After [`SHUTDOWN_GRACE`], kills the IF processes that did not exit
    /// on SIGTERM, saying which and what they said last.
    fn kill_stragglers(&mut self) {
        let since = *self.shutdown_since.get_or_insert_with(Instant::now);
        if since.elapsed() < SHUTDOWN_GRACE {
            return;
        }
        for (_, p) in &mut self.leaving {
            if p.proc.poll_exit().is_none() {
                tracing::warn!(
                    "orchestrator: {} did not exit within {SHUTDOWN_GRACE:?} of shutdown; killing it:\n{}",
                    p.proc.name(),
                    p.proc.tail()
                );
                p.proc.kill();
            }
        }
        // SIGKILL takes effect at once; the next round, if any, is after
        // another grace period, not on every pass of the loop.
        self.shutdown_since = Some(Instant::now());
    }

    fn all_ifs_gone(&mut self) -> bool {
        self.reap_leaving();
        self.leaving.is_empty()
            && self
                .ifs
                .values_mut()
                .all(|rt| rt.active.is_none() && rt.shadow.is_none() && rt.switch.is_none())
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
            let Some(rt) = self.ifs.get_mut(&msg.if_id) else {
                continue;
            };
            match msg.body {
                Publication::Telemetry {
                    mode,
                    telemetry,
                    batching,
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
        let ids: Vec<u16> = self.ifs.keys().copied().collect();
        for id in &ids {
            let Some(d) = self.state.get(*id).cloned() else {
                continue;
            };
            let rt = self.ifs.get_mut(id).expect("listed");
            if d.pinned || rt.switch.is_some() || rt.warm_until.is_some_and(|t| Instant::now() < t)
            {
                continue;
            }
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
                        .ifs
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
            let spec = self.spec_for(&d2);
            // On a CPU host a share is its cores: a new percentage that maps
            // to the same cores changes nothing a new process would run with.
            let current = self.ifs.get(&d.if_id).and_then(|rt| rt.active.as_ref());
            if !self.gpu && current.is_some_and(|a| a.spec.cores == spec.cores) {
                if let Some(rt) = self.ifs.get_mut(&d.if_id) {
                    if let Some(a) = rt.active.as_mut() {
                        a.spec.share_pct = spec.share_pct;
                    }
                }
                continue;
            }
            let why = format!("tuning: share {:.1}% -> {:.1}%", d.share_pct, share.pct);
            if let Err(e) = self.begin_switch(d.if_id, spec, why) {
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
            "if_manager_pid": self.ifm.as_ref().map(Proc::pid),
            "platform_restarts": self.platform_restarts,
            "telemetry_rejected": self.telemetry_rejected,
            "device": if self.gpu { "gpu" } else { "cpu" },
            "cores": self.cores,
            "tuning": self.cfg.platform.tuning,
            "topology": self.topology,
        }));
        for row in &mut report.ifs {
            let Some(rt) = self.ifs.get(&row.if_id) else {
                continue;
            };
            overlay(row, rt, self.state.busy(row.if_id));
        }
        report
    }

    fn save_state(&self) {
        let mut pids: Vec<u32> = self.ifm.iter().map(Proc::pid).collect();
        pids.extend(
            self.ifs
                .values()
                .flat_map(IfRuntime::procs)
                .map(|p| p.proc.pid()),
        );
        pids.extend(self.leaving.iter().map(|(_, p)| p.proc.pid()));
        let state = json!({ "orchestrator": std::process::id(), "pids": pids });
        let _ = std::fs::write(self.runtime_dir.join("state.json"), state.to_string());
    }

    fn finish(mut self) -> Value {
        let ifm_report = self.ifm.take().and_then(|mut p| {
            p.terminate();
            p.wait_or_kill(Duration::from_secs(10));
            p.report()
        });
        let _ = std::fs::remove_file(self.runtime_dir.join("state.json"));
        let ifs: Vec<Value> = self
            .ifs
            .iter()
            .map(|(id, rt)| {
                json!({
                    "if_id": id,
                    "switchovers": rt.gaps_ns.len(),
                    "switchover_gaps_us": rt.gaps_ns.iter().map(|g| *g as f64 / 1e3).collect::<Vec<_>>(),
                    "failovers": rt.failovers,
                })
            })
            .collect();
        json!({
            "ifs": ifs,
            "platform_restarts": self.platform_restarts,
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
                let spec = self.spec_for(new);
                let active = match self.spawn_if(new.if_id, &spec, false) {
                    Ok(p) => p,
                    Err(e) => return ControlError::Failed(e).into(),
                };
                let tuner = match ShareTuner::new(new.if_id, new.share_pct, self.tuning) {
                    Ok(t) => t,
                    Err(e) => return ControlError::Failed(e.to_string()).into(),
                };
                self.ifs.insert(
                    new.if_id,
                    IfRuntime {
                        active: Some(active),
                        shadow: None,
                        switch: None,
                        tuner,
                        metrics: None,
                        report: None,
                        gaps_ns: Vec::new(),
                        failovers: 0,
                        reason: None,
                        warm_until: Some(Instant::now() + WARM_UP),
                    },
                );
                let reply = change.reply();
                let id = new.if_id;
                self.state.apply(change);
                self.state.set_busy(id, "starting");
                return reply;
            }
            Change::Update { old, new } => {
                if old.share_pct != new.share_pct || old.slo_ms != new.slo_ms {
                    let why = if old.slo_ms != new.slo_ms {
                        format!("slo {} -> {} ms", old.slo_ms, new.slo_ms)
                    } else {
                        format!("share {:.1}% -> {:.1}%", old.share_pct, new.share_pct)
                    };
                    let spec = self.spec_for(new);
                    if let Err(e) = self.begin_switch(new.if_id, spec, why) {
                        return ControlError::Failed(e).into();
                    }
                }
                if !new.pinned {
                    let now = self.now_ns();
                    if let Some(rt) = self.ifs.get_mut(&new.if_id) {
                        rt.tuner.set_demand(new.share_pct, now);
                    }
                }
            }
            Change::Retire { old } => {
                let id = old.if_id;
                if let Some(rt) = self.ifs.get_mut(&id) {
                    for p in rt.take_procs() {
                        p.proc.terminate();
                        self.leaving.push((id, p));
                    }
                }
                self.retiring.push(id);
                let reply = change.reply();
                self.state.apply(change);
                self.state.set_busy(id, "retiring");
                return reply;
            }
            Change::Shutdown => {
                tracing::info!("orchestrator: shutting down");
                // Old actives still draining and shadows let go finish now.
                for (_, p) in &self.leaving {
                    p.proc.terminate();
                }
                for (id, rt) in self.ifs.iter_mut() {
                    for p in rt.take_procs() {
                        p.proc.terminate();
                        self.leaving.push((*id, p));
                    }
                }
            }
        }
        let reply = change.reply();
        self.state.apply(change);
        self.save_state();
        reply
    }
}

/// Fills `row` with what the daemon measured and knows of `rt`.
fn overlay(row: &mut StatusRow, rt: &IfRuntime, busy: Option<&str>) {
    row.state = match busy {
        Some("starting") => IfState::Starting,
        Some("switching") => IfState::Switching,
        Some("retiring") => IfState::Retiring,
        _ if rt.active.is_none() => IfState::Failed,
        _ => IfState::Active,
    };
    row.pid = rt.active.as_ref().map(|a| a.proc.pid());
    row.switchovers = rt.gaps_ns.len() as u64;
    row.last_switchover_gap_us = rt.gaps_ns.last().map(|g| g / 1000);
    row.reason = rt.reason.clone();
    if let Some((t, b)) = &rt.metrics {
        row.throughput_rps = Some(t.throughput_per_s);
        row.arrival_rps = Some(t.arrival_rate_per_s);
        row.p50_ms = Some(t.latency_us.p50 as f64 / 1e3);
        row.p99_ms = Some(t.latency_us.p99 as f64 / 1e3);
        row.slo_attainment = t.slo_attainment;
        row.batch_size = Some(b.target_batch as u32);
        row.mean_batch_size = Some(t.mean_batch_size).filter(|_| t.batches != 0);
    }
}

/// Creates `dir` (and parents) readable by the owner only.
fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
}

/// A previous orchestrator that died left its processes running: stop
/// them (they hold the platform's shared memory), so this one starts clean.
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
    let alive: Vec<u32> = pids
        .into_iter()
        .filter(|p| kp_os::affinity::process_alive(*p))
        .collect();
    if !alive.is_empty() {
        tracing::warn!(
            "orchestrator: cleaning up {} processes a previous orchestrator left: {alive:?}",
            alive.len()
        );
        for p in &alive {
            crate::process::signal(*p, "TERM");
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while alive.iter().any(|p| kp_os::affinity::process_alive(*p)) && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(20));
        }
        for p in alive.iter().filter(|p| kp_os::affinity::process_alive(**p)) {
            crate::process::signal(*p, "KILL");
        }
    }
    let _ = std::fs::remove_file(path);
}

/// The NIC the if-manager's EAL arguments name: an allowed PCI device
/// (`-a`, `--allow`), or a virtual device's interface (`iface=` of
/// af_packet), or the virtual device itself.
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

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
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
