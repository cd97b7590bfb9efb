//! The life cycle of the IF processes as a sans-IO state machine: events
//! in, actions out, time passed in as a value.
//!
//! [`Lifecycle`] decides what happens to every `kp-if` process — deploy,
//! the shadow, a re-provision's switchover, fail-over, the start timeout,
//! retire, shutdown — and to the if-manager when it dies (a platform
//! restart). It performs nothing: [`Lifecycle::handle`] takes an [`Event`]
//! and the time, and returns the [`Action`]s the driver
//! ([`crate::daemon`]) carries out (spawn a process, send `activate` to an
//! IF, switch over, signal a process, mark an IF busy, …). The driver feeds
//! what it saw back as events: a process spawned or not, ready, exited, an
//! activation's or a switchover's result. That is the whole interface, so
//! every transition, each step's failure included, is tested here with a
//! fake clock, without processes or sockets (`mod tests`).
//!
//! # Processes
//!
//! A process is a [`ProcId`] the machine hands out in [`Action::Spawn`];
//! the driver keeps the real process under that id until it has exited.
//! Each IF has at most one **active** (owns the IF's ring), one **shadow**
//! (`--standby`: loaded and parked, same spec), and during a re-provision
//! one **pending** shadow with the new spec. A process in none of those
//! places is **leaving**: an old active finishing what it holds, a process
//! told to stop. Every process is tracked until its [`Event::Exited`].
//!
//! # Rules (the daemon's, as they were)
//!
//! - One kp-if starts at a time: a shadow or a re-provision's new shadow
//!   waits while any active, shadow or pending process is still starting
//!   (a fail-over or a deploy does not wait). One not ready within
//!   [`START_TIMEOUT`] is killed, and then handled as any dead process.
//! - A dead active is replaced by its ready shadow (`activate`); a shadow
//!   that is not ready, or refuses, is stopped and a new active started
//!   with the IF's desired spec. A dead shadow is restarted. A pending
//!   shadow that dies fails the re-provision.
//! - A pending shadow that is ready while the active is ready (or there is
//!   none) is switched to ([`Action::CarryOutSwitch`]); the old active
//!   leaves by itself once it has finished what it holds, the old shadow is
//!   stopped, and a new shadow with the new spec is started.
//! - The if-manager dying takes every IF with it: every IF process is
//!   killed, the if-manager respawned once they have all exited (so that
//!   the new one can remove the old one's hugepage files; at most
//!   [`IF_MANAGER_CLEARING`] later) and again a second after it dies or
//!   cannot be spawned, and once it is ready every desired IF is started
//!   again.
//! - Retired IFs are unregistered once all their processes are gone;
//!   after `shutdown` the processes still there after [`SHUTDOWN_GRACE`]
//!   are killed, again after each further grace.
//!
//! # Events and time
//!
//! Events that answer an action ([`Event::Spawned`], [`Event::SpawnFailed`],
//! [`Event::Activated`], [`Event::Switched`], the if-manager's) are
//! expected right after it: the driver performs actions one by one and
//! feeds each result back at once. One that no longer matches (the process
//! left meanwhile) is ignored. Everything that is level-triggered — a
//! start timing out, a shadow to start, a switch to carry out, a retired
//! IF to unregister — is decided on [`Event::Tick`], which the driver
//! sends once per round after the exits and readiness it saw; so a spawn
//! that keeps failing is retried once a round, never in a loop.
//!
//! # Limits (kept from the daemon as it was)
//!
//! - An active that dies at once is replaced at once, every round: there
//!   is no back-off for a binary that crashes on start.
//! - An IF whose replacement active cannot be spawned stays without one
//!   (status `failed`, with the reason) until it is re-provisioned or
//!   retired; one whose active is not redeployed after a platform restart
//!   stays `starting`.
//! - A fail-over during a re-provision marks the IF `starting`, which
//!   replaces `switching`; the re-provision goes on once the new active
//!   serves, no longer marked busy.
//!
//! One change: an if-manager that is ready again after `shutdown` redeploys
//! nothing (it did, and those IFs then kept shutdown from ending).
//!
//! Messages for operators are logged here with `tracing` (their texts are
//! what the cross-process tests and scripts look for); those that need a
//! live process's output (a kill's last words) are the driver's.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

/// How long a process may take to say it is ready (model load included).
pub const START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long IF processes get to finish and exit after `shutdown` (SIGTERM)
/// before they are killed: an IF answers what it holds within its
/// reassembly timeout and a batch, well under this; one that has not exited
/// by then is stuck, and shutdown must not wait on it forever.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);
/// How long after a switchover an IF's telemetry is not acted on: its new
/// process's first rate windows are not yet its steady state.
pub const WARM_UP: Duration = Duration::from_secs(3);
/// How long after a failed if-manager restart the next one is tried: an
/// if-manager that dies at once (its NIC gone, hugepages short) is not
/// respawned in a tight loop.
pub const IF_MANAGER_RETRY: Duration = Duration::from_secs(1);

/// After the if-manager died, how long its IF processes (killed) may take
/// to exit before it is started again anyway. A new if-manager started
/// while processes of the old one still map its hugepage files cannot
/// remove those files (they are left behind, and the memory with them);
/// SIGKILLed processes exit in milliseconds, so this only bounds a process
/// stuck in the kernel.
pub const IF_MANAGER_CLEARING: Duration = Duration::from_secs(10);

/// What one `kp-if` process runs with.
#[derive(Clone, Debug, PartialEq)]
pub struct Spec {
    /// The model's name in the repository.
    pub model: String,
    /// The IF binary.
    pub binary: PathBuf,
    /// Its latency SLO.
    pub slo_ms: f64,
    /// Its share of the device, percent.
    pub share_pct: f64,
    /// The cores it runs on (and as many engine threads).
    pub cores: Vec<usize>,
}

/// A process, as the machine names it: handed out in [`Action::Spawn`],
/// never reused.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ProcId(u64);

impl fmt::Debug for ProcId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "p{}", self.0)
    }
}

/// What is in progress for an IF; while it is, commands that change the
/// IF are refused (`busy`, [`crate::control::DesiredState::set_busy`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Busy {
    /// Its active is starting (deploy, fail-over, platform restart).
    Starting,
    /// A re-provision is under way.
    Switching,
    /// Retired; its processes are still leaving.
    Retiring,
}

impl Busy {
    /// The word the control protocol shows.
    pub fn label(self) -> &'static str {
        match self {
            Busy::Starting => "starting",
            Busy::Switching => "switching",
            Busy::Retiring => "retiring",
        }
    }
}

/// How a process ended, for messages.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Exit {
    /// Its exit status, as `std::process::ExitStatus` displays it.
    pub status: String,
    /// Its last stderr lines.
    pub tail: String,
}

/// Why a process is killed (SIGKILL), so the driver can say so.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KillReason {
    /// Not ready within [`START_TIMEOUT`].
    StartTimeout,
    /// The if-manager died; its IFs go with it.
    PlatformRestart,
    /// Still there [`SHUTDOWN_GRACE`] after `shutdown`.
    ShutdownGrace,
}

/// Why a request ([`Event::Deploy`], [`Event::SwitchRequested`]) failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LifecycleError {
    /// The process could not be spawned (the driver's reason).
    #[error("{0}")]
    Spawn(String),
    /// No such IF (never deployed, or retired).
    #[error("no such IF")]
    NoSuchIf(u16),
    /// Deployed already.
    #[error("if {0} is deployed already")]
    Deployed(u16),
    /// `shutdown` was received.
    #[error("shutting down")]
    ShuttingDown,
}

/// What happened, as the driver saw it (or was asked).
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// Once per round of the driver's loop, after the exits and readiness
    /// it saw: timeouts, and everything that waits for a condition.
    Tick,
    /// Deploy `if_id` with `spec`: its active starts now.
    Deploy { if_id: u16, spec: Spec },
    /// Re-provision `if_id` to `spec` (`why`: for messages).
    SwitchRequested { if_id: u16, spec: Spec, why: String },
    /// Retire `if_id`: its processes are stopped, then it is unregistered.
    Retire { if_id: u16 },
    /// Stop everything.
    Shutdown,
    /// [`Action::Spawn`] started `proc`, called `name` in messages.
    Spawned { proc: ProcId, name: String },
    /// [`Action::Spawn`] failed.
    SpawnFailed { proc: ProcId, error: String },
    /// `proc` printed its ready line (a shadow: it is loaded and parked).
    Ready { proc: ProcId },
    /// `proc` exited (the driver then lets its handle go).
    Exited { proc: ProcId, exit: Exit },
    /// The answer to [`Action::Activate`].
    Activated {
        proc: ProcId,
        result: Result<(), String>,
    },
    /// The outcome of [`Action::CarryOutSwitch`] for its `new` process:
    /// the switchover gap in nanoseconds, or why it failed.
    Switched {
        proc: ProcId,
        result: Result<u64, String>,
    },
    /// [`Action::RespawnIfManager`] started it.
    IfManagerSpawned,
    /// [`Action::RespawnIfManager`] failed (the driver said why).
    IfManagerSpawnFailed,
    /// The if-manager printed its ready line.
    IfManagerReady,
    /// The if-manager exited.
    IfManagerExited { exit: Exit },
}

/// What the driver is to do.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Start a `kp-if` for `if_id` with `spec` (`--standby` if `standby`)
    /// and keep it as `proc`; answer [`Event::Spawned`] or
    /// [`Event::SpawnFailed`].
    Spawn {
        proc: ProcId,
        if_id: u16,
        spec: Spec,
        standby: bool,
    },
    /// Tell the parked `proc` to `activate` (a fail-over); answer
    /// [`Event::Activated`].
    Activate { proc: ProcId },
    /// Switch `if_id` over to the parked `new`: `activate` it, make `old`
    /// (if any) `yield`, wait until `new` is active and read the gap;
    /// answer [`Event::Switched`].
    CarryOutSwitch {
        if_id: u16,
        new: ProcId,
        old: Option<ProcId>,
    },
    /// SIGTERM: answer what it holds and exit.
    Terminate { proc: ProcId },
    /// SIGKILL.
    Kill { proc: ProcId, why: KillReason },
    /// Mark `if_id` busy.
    SetBusy { if_id: u16, busy: Busy },
    /// `if_id` is no longer busy.
    ClearBusy { if_id: u16 },
    /// `if_id` has a new active: forget its telemetry so far.
    NewActive { if_id: u16 },
    /// Tell the if-manager that `if_id` is gone; forget it.
    Unregister { if_id: u16 },
    /// Start the if-manager again; answer [`Event::IfManagerSpawned`] or
    /// [`Event::IfManagerSpawnFailed`].
    RespawnIfManager,
    /// The request being handled failed: reply with `error`.
    Refuse { error: LifecycleError },
}

/// Why a process was spawned: what its spawn failing means.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Purpose {
    /// A deploy's active: the deploy fails.
    Deploy,
    /// An active replacing a dead one, or redeployed after a platform
    /// restart: the IF has no active, and says why.
    Replacement,
    /// A shadow: the IF says why; retried next round.
    Shadow,
    /// A re-provision's new shadow, started by the request itself (the
    /// request fails) or once its turn came (the re-provision fails).
    Reprovision { by_request: bool },
}

/// One process the machine tracks (until it exits).
#[derive(Debug)]
struct ProcState {
    if_id: u16,
    /// For messages; the driver's name once spawned.
    name: String,
    spec: Spec,
    started: Duration,
    ready: bool,
    purpose: Purpose,
    /// Killed for not being ready within [`START_TIMEOUT`].
    timed_out: bool,
}

/// A re-provision in progress.
#[derive(Debug)]
struct Switch {
    /// The new shadow; `None` while it waits for its turn to start.
    pending: Option<ProcId>,
    spec: Spec,
    why: String,
    /// [`Action::CarryOutSwitch`] was sent, with this old active.
    carrying_out: Option<Option<ProcId>>,
}

/// One IF's processes and history.
#[derive(Debug, Default)]
struct IfLife {
    active: Option<ProcId>,
    shadow: Option<ProcId>,
    /// A shadow told to `activate` after its active died.
    taking_over: Option<ProcId>,
    switch: Option<Switch>,
    busy: Option<Busy>,
    reason: Option<String>,
    gaps_ns: Vec<u64>,
    failovers: u64,
    /// No tuning on its telemetry before this (a new process warming up).
    warm_until: Option<Duration>,
    retiring: bool,
}

impl IfLife {
    /// Its processes in their places (active, shadow, pending, a shadow
    /// taking over), in that order.
    fn placed(&self) -> impl Iterator<Item = ProcId> + '_ {
        [
            self.active,
            self.shadow,
            self.switch.as_ref().and_then(|s| s.pending),
            self.taking_over,
        ]
        .into_iter()
        .flatten()
    }

    /// Takes every process out of its place (retire, shutdown, a platform
    /// restart); a re-provision in progress is dropped with them.
    fn take_placed(&mut self) -> Vec<ProcId> {
        [
            self.active.take(),
            self.shadow.take(),
            self.switch.take().and_then(|s| s.pending),
            self.taking_over.take(),
        ]
        .into_iter()
        .flatten()
        .collect()
    }
}

/// The if-manager, as far as a platform restart is concerned.
#[derive(Debug, PartialEq)]
enum IfManager {
    /// Serving.
    Up,
    /// Died during shutdown: not restarted.
    Down,
    /// Dead since `since`: waiting for the IF processes it took with it
    /// (`left`) to exit before it is started again
    /// ([`IF_MANAGER_CLEARING`]).
    Clearing {
        since: Duration,
        left: std::collections::BTreeSet<ProcId>,
    },
    /// Being restarted since `since` (the last spawn attempt).
    Restarting {
        since: Duration,
        /// Spawned and not dead (yet): waiting for it to be ready.
        alive: bool,
        /// The last one that died, for the message when retrying.
        last_tail: Option<String>,
    },
}

/// What one IF looks like to the driver (status, summary, tuning).
#[derive(Clone, Copy, Debug)]
pub struct IfView<'a> {
    /// Its active process.
    pub active: Option<ProcId>,
    /// What is in progress.
    pub busy: Option<Busy>,
    /// Why it is not as desired (the last failure).
    pub reason: Option<&'a str>,
    /// Every switchover's gap, nanoseconds.
    pub gaps_ns: &'a [u64],
    /// How often its active died and was replaced.
    pub failovers: u64,
    /// Whether a re-provision is under way.
    pub switching: bool,
    /// No tuning on its telemetry before this.
    pub warm_until: Option<Duration>,
}

/// The state machine. See the module documentation.
#[derive(Debug)]
pub struct Lifecycle {
    next_proc: u64,
    procs: BTreeMap<ProcId, ProcState>,
    ifs: BTreeMap<u16, IfLife>,
    if_manager: IfManager,
    shutting_down: bool,
    /// When the shutdown grace (or the last round of kills) started.
    grace_from: Option<Duration>,
    platform_restarts: u64,
}

impl Default for Lifecycle {
    fn default() -> Self {
        Self::new()
    }
}

impl Lifecycle {
    /// No IFs; the if-manager serving (the driver starts it before
    /// anything else).
    pub fn new() -> Lifecycle {
        Lifecycle {
            next_proc: 1,
            procs: BTreeMap::new(),
            ifs: BTreeMap::new(),
            if_manager: IfManager::Up,
            shutting_down: false,
            grace_from: None,
            platform_restarts: 0,
        }
    }

    /// Handles `event` at `now` (any monotonic time, e.g. since the driver
    /// started) and returns what to do, in order. `desired` is the spec an
    /// IF should run with now (`None`: it is not desired), for the actives
    /// it starts on its own: after a fail-over, after a platform restart.
    pub fn handle(
        &mut self,
        now: Duration,
        event: Event,
        desired: &dyn Fn(u16) -> Option<Spec>,
    ) -> Vec<Action> {
        let mut out = Vec::new();
        match event {
            Event::Tick => self.tick(now, &mut out),
            Event::Deploy { if_id, spec } => self.deploy(now, if_id, spec, &mut out),
            Event::SwitchRequested { if_id, spec, why } => {
                self.begin_switch(now, if_id, spec, why, &mut out)
            }
            Event::Retire { if_id } => self.retire(if_id, &mut out),
            Event::Shutdown => self.shutdown(now, &mut out),
            Event::Spawned { proc, name } => self.spawned(proc, name, &mut out),
            Event::SpawnFailed { proc, error } => self.spawn_failed(proc, error, &mut out),
            Event::Ready { proc } => {
                if let Some(p) = self.procs.get_mut(&proc) {
                    p.ready = true;
                }
            }
            Event::Exited { proc, exit } => self.exited(now, proc, exit, desired, &mut out),
            Event::Activated { proc, result } => {
                self.activated(now, proc, result, desired, &mut out)
            }
            Event::Switched { proc, result } => self.switched(now, proc, result, &mut out),
            Event::IfManagerSpawned => {
                if let IfManager::Restarting { alive, .. } = &mut self.if_manager {
                    *alive = true;
                }
            }
            Event::IfManagerSpawnFailed => {
                if let IfManager::Restarting { alive, .. } = &mut self.if_manager {
                    *alive = false;
                }
            }
            Event::IfManagerReady => self.if_manager_ready(now, desired, &mut out),
            Event::IfManagerExited { exit } => self.if_manager_exited(now, exit, &mut out),
        }
        out
    }

    // ---------------------------------------------------------------------
    // Queries

    /// The IFs it knows (deployed, or retired and still leaving), by id.
    pub fn if_ids(&self) -> impl Iterator<Item = u16> + '_ {
        self.ifs.keys().copied()
    }

    /// One IF as the driver sees it.
    pub fn view(&self, if_id: u16) -> Option<IfView<'_>> {
        self.ifs.get(&if_id).map(|rt| IfView {
            active: rt.active,
            busy: rt.busy,
            reason: rt.reason.as_deref(),
            gaps_ns: &rt.gaps_ns,
            failovers: rt.failovers,
            switching: rt.switch.is_some(),
            warm_until: rt.warm_until,
        })
    }

    /// The spec `if_id`'s active runs with.
    pub fn active_spec(&self, if_id: u16) -> Option<&Spec> {
        let active = self.ifs.get(&if_id)?.active?;
        self.procs.get(&active).map(|p| &p.spec)
    }

    /// Records that `if_id`'s active now stands for `share_pct` (on a CPU
    /// host a new share that maps to the same cores needs no new process);
    /// its next shadow is started with it.
    pub fn set_active_share(&mut self, if_id: u16, share_pct: f64) {
        let Some(active) = self.ifs.get(&if_id).and_then(|rt| rt.active) else {
            return;
        };
        if let Some(p) = self.procs.get_mut(&active) {
            p.spec.share_pct = share_pct;
        }
    }

    /// Whether `proc` is an IF's active (the driver feeds actives' exits
    /// last in a round: a shadow that died with its active is then not
    /// asked to take over).
    pub fn is_active(&self, proc: ProcId) -> bool {
        self.procs
            .get(&proc)
            .and_then(|p| self.ifs.get(&p.if_id))
            .is_some_and(|rt| rt.active == Some(proc))
    }

    /// How often the if-manager died and the platform was restarted.
    pub fn platform_restarts(&self) -> u64 {
        self.platform_restarts
    }

    /// Whether no IF process is left (after `shutdown`: time to exit).
    pub fn all_gone(&self) -> bool {
        self.procs.is_empty() && self.ifs.values().all(|rt| rt.switch.is_none())
    }

    // ---------------------------------------------------------------------
    // Requests

    fn deploy(&mut self, now: Duration, if_id: u16, spec: Spec, out: &mut Vec<Action>) {
        if self.shutting_down {
            out.push(Action::Refuse {
                error: LifecycleError::ShuttingDown,
            });
            return;
        }
        if self.ifs.contains_key(&if_id) {
            out.push(Action::Refuse {
                error: LifecycleError::Deployed(if_id),
            });
            return;
        }
        let active = self.spawn(now, if_id, spec, false, Purpose::Deploy, out);
        self.ifs.insert(
            if_id,
            IfLife {
                active: Some(active),
                warm_until: Some(now + WARM_UP),
                ..IfLife::default()
            },
        );
    }

    /// Starts a re-provision of `if_id` to `spec`: its new shadow starts
    /// now, or once the kp-if now starting is ready.
    fn begin_switch(
        &mut self,
        now: Duration,
        if_id: u16,
        spec: Spec,
        why: String,
        out: &mut Vec<Action>,
    ) {
        if self.shutting_down {
            out.push(Action::Refuse {
                error: LifecycleError::ShuttingDown,
            });
            return;
        }
        if self.ifs.get(&if_id).is_none_or(|rt| rt.retiring) {
            out.push(Action::Refuse {
                error: LifecycleError::NoSuchIf(if_id),
            });
            return;
        }
        // A re-provision replacing one in progress (the control protocol
        // refuses that while busy, but a fail-over's start clears busy):
        // its new shadow is stopped.
        let rt = self.ifs.get_mut(&if_id).expect("checked");
        if let Some(pending) = rt.switch.take().and_then(|s| s.pending) {
            out.push(Action::Terminate { proc: pending });
        }
        let pending = match self.starting() {
            Some(other) => {
                tracing::info!(
                    "orchestrator: re-provisioning if {if_id} ({why}): waiting for {} to start first",
                    self.name(other)
                );
                self.set_busy(if_id, Some(Busy::Switching), out);
                None
            }
            None => {
                let by_request = Purpose::Reprovision { by_request: true };
                Some(self.spawn(now, if_id, spec.clone(), true, by_request, out))
            }
        };
        let rt = self.ifs.get_mut(&if_id).expect("checked");
        rt.switch = Some(Switch {
            pending,
            spec,
            why,
            carrying_out: None,
        });
    }

    fn retire(&mut self, if_id: u16, out: &mut Vec<Action>) {
        let rt = self.ifs.entry(if_id).or_default();
        for proc in rt.take_placed() {
            out.push(Action::Terminate { proc });
        }
        rt.retiring = true;
        self.set_busy(if_id, Some(Busy::Retiring), out);
    }

    fn shutdown(&mut self, now: Duration, out: &mut Vec<Action>) {
        self.shutting_down = true;
        self.grace_from = Some(now);
        // Old actives still draining and shadows let go finish now.
        for proc in self.leaving() {
            out.push(Action::Terminate { proc });
        }
        for rt in self.ifs.values_mut() {
            for proc in rt.take_placed() {
                out.push(Action::Terminate { proc });
            }
        }
    }

    // ---------------------------------------------------------------------
    // Answers to actions

    fn spawned(&mut self, proc: ProcId, name: String, out: &mut Vec<Action>) {
        let Some(p) = self.procs.get_mut(&proc) else {
            return;
        };
        p.name = name;
        let (if_id, purpose) = (p.if_id, p.purpose);
        match purpose {
            Purpose::Deploy | Purpose::Replacement => {
                if self
                    .ifs
                    .get(&if_id)
                    .is_some_and(|rt| rt.active == Some(proc))
                {
                    self.set_busy(if_id, Some(Busy::Starting), out);
                }
            }
            Purpose::Shadow => {}
            Purpose::Reprovision { by_request } => {
                let Some(why) = self.switch_of(if_id, proc).map(|sw| sw.why.clone()) else {
                    return;
                };
                if by_request {
                    tracing::info!(
                        "orchestrator: re-provisioning if {if_id} ({why}): starting {}",
                        self.name(proc)
                    );
                    self.set_busy(if_id, Some(Busy::Switching), out);
                } else {
                    tracing::info!(
                        "orchestrator: re-provisioning if {if_id}: starting {}",
                        self.name(proc)
                    );
                }
            }
        }
    }

    fn spawn_failed(&mut self, proc: ProcId, error: String, out: &mut Vec<Action>) {
        let Some(p) = self.procs.remove(&proc) else {
            return;
        };
        let if_id = p.if_id;
        let Some(rt) = self.ifs.get_mut(&if_id) else {
            return;
        };
        match p.purpose {
            Purpose::Deploy if rt.active == Some(proc) => {
                self.ifs.remove(&if_id);
                out.push(Action::Refuse {
                    error: LifecycleError::Spawn(error),
                });
            }
            Purpose::Deploy => {}
            Purpose::Replacement | Purpose::Shadow => {
                if rt.active == Some(proc) {
                    rt.active = None;
                }
                if rt.shadow == Some(proc) {
                    rt.shadow = None;
                }
                rt.reason = Some(error);
            }
            Purpose::Reprovision { by_request } => {
                if rt.switch.as_ref().and_then(|s| s.pending) != Some(proc) {
                    return;
                }
                rt.switch = None;
                if by_request {
                    out.push(Action::Refuse {
                        error: LifecycleError::Spawn(error),
                    });
                } else {
                    rt.reason = Some(format!("re-provision failed: {error}"));
                    self.set_busy(if_id, None, out);
                }
            }
        }
    }

    fn exited(
        &mut self,
        now: Duration,
        proc: ProcId,
        exit: Exit,
        desired: &dyn Fn(u16) -> Option<Spec>,
        out: &mut Vec<Action>,
    ) {
        let Some(p) = self.procs.remove(&proc) else {
            return;
        };
        if let IfManager::Clearing { left, .. } = &mut self.if_manager {
            left.remove(&proc);
        }
        let if_id = p.if_id;
        let shutting = self.shutting_down;
        let Some(rt) = self.ifs.get_mut(&if_id) else {
            return;
        };
        let shutting = shutting || rt.retiring;
        let Exit { status, tail } = exit;
        if rt.shadow == Some(proc) {
            // Started again on the next tick.
            if !shutting {
                tracing::warn!("orchestrator: {} exited ({status}):\n{tail}", p.name);
            }
            rt.shadow = None;
        } else if rt.switch.as_ref().and_then(|s| s.pending) == Some(proc) {
            let sw = rt.switch.take().expect("checked");
            let reason = format!(
                "re-provision ({}) failed: {} exited ({status}): {tail}",
                sw.why, p.name
            );
            tracing::warn!("orchestrator: {reason}");
            rt.reason = Some(reason);
            self.set_busy(if_id, None, out);
        } else if rt.taking_over == Some(proc) {
            // Died before it answered `activate` (its answer, if one
            // comes, is ignored): start a new active.
            rt.taking_over = None;
            self.replace_active(now, if_id, desired, out);
        } else if rt.active == Some(proc) {
            rt.active = None;
            if shutting {
                return;
            }
            if p.timed_out && rt.busy == Some(Busy::Starting) {
                rt.reason = Some(format!("{} did not start: {tail}", p.name));
            }
            tracing::warn!(
                "orchestrator: the active {} died ({status}); failing over",
                p.name
            );
            self.fail_over(now, if_id, desired, out);
        }
        // Otherwise it was leaving: nothing more to do.
    }

    fn activated(
        &mut self,
        now: Duration,
        proc: ProcId,
        result: Result<(), String>,
        desired: &dyn Fn(u16) -> Option<Spec>,
        out: &mut Vec<Action>,
    ) {
        let Some(if_id) = self.procs.get(&proc).map(|p| p.if_id) else {
            return;
        };
        let name = self.name(proc).to_string();
        let Some(rt) = self.ifs.get_mut(&if_id) else {
            return;
        };
        if rt.taking_over != Some(proc) {
            return;
        }
        rt.taking_over = None;
        match result {
            Ok(()) if rt.active.is_none() => {
                tracing::info!("orchestrator: {name} took over");
                rt.active = Some(proc);
                rt.warm_until = Some(now + WARM_UP);
                rt.reason = None;
                out.push(Action::NewActive { if_id });
                // A new shadow is started on the next tick.
            }
            result => {
                if let Err(e) = result {
                    tracing::warn!("orchestrator: activating {name}: {e}");
                }
                // Not taking over: stop it. Left running, a shadow that is
                // still loading parks and never exits, and one whose
                // activation half happened holds the ring, so every new
                // active would refuse to start ("already served") and be
                // failed over again.
                out.push(Action::Terminate { proc });
                if rt.active.is_none() {
                    self.replace_active(now, if_id, desired, out);
                }
            }
        }
    }

    fn switched(
        &mut self,
        now: Duration,
        proc: ProcId,
        result: Result<u64, String>,
        out: &mut Vec<Action>,
    ) {
        let Some(if_id) = self.procs.get(&proc).map(|p| p.if_id) else {
            return;
        };
        let name = self.name(proc).to_string();
        let Some(rt) = self.ifs.get_mut(&if_id) else {
            return;
        };
        let carried_out = rt
            .switch
            .as_ref()
            .filter(|s| s.pending == Some(proc))
            .and_then(|s| s.carrying_out);
        let Some(yielded) = carried_out else {
            return;
        };
        let sw = rt.switch.take().expect("checked");
        match result {
            Ok(gap_ns) => {
                tracing::info!(
                    "orchestrator: if {if_id} switched to {name} ({}); gap {:.1} µs",
                    sw.why,
                    gap_ns as f64 / 1e3
                );
                rt.gaps_ns.push(gap_ns);
                rt.reason = None;
                rt.warm_until = Some(now + WARM_UP);
                out.push(Action::NewActive { if_id });
                // The old active exits by itself once it has finished what
                // it holds (one that was not told to yield is stopped); the
                // old shadow has the old spec: stop it.
                let old_active = rt.active.replace(proc);
                if let Some(old) = old_active.filter(|a| Some(*a) != yielded) {
                    out.push(Action::Terminate { proc: old });
                }
                if let Some(old) = rt.shadow.take() {
                    out.push(Action::Terminate { proc: old });
                }
            }
            Err(e) => {
                let reason = format!("re-provision ({}) failed: {e}", sw.why);
                tracing::warn!("orchestrator: if {if_id}: {reason}");
                rt.reason = Some(reason);
                out.push(Action::Terminate { proc });
            }
        }
        self.set_busy(if_id, None, out);
    }

    // ---------------------------------------------------------------------
    // The if-manager

    /// The if-manager died: every IF lost its rings. Kill them all, start
    /// the if-manager again, redeploy once it is ready.
    fn if_manager_exited(&mut self, now: Duration, exit: Exit, out: &mut Vec<Action>) {
        match &mut self.if_manager {
            IfManager::Up if self.shutting_down => self.if_manager = IfManager::Down,
            IfManager::Up => {
                tracing::warn!(
                    "orchestrator: the if-manager died ({}); restarting the platform",
                    exit.status
                );
                self.platform_restarts += 1;
                // Those in no place (an old active finishing what it held,
                // a shadow let go) were on the dead one's rings too.
                for proc in self.leaving() {
                    out.push(Action::Kill {
                        proc,
                        why: KillReason::PlatformRestart,
                    });
                }
                let ids: Vec<u16> = self.ifs.keys().copied().collect();
                for if_id in ids {
                    let rt = self.ifs.get_mut(&if_id).expect("listed");
                    for proc in rt.take_placed() {
                        out.push(Action::Kill {
                            proc,
                            why: KillReason::PlatformRestart,
                        });
                    }
                    self.set_busy(if_id, Some(Busy::Starting), out);
                }
                if self.procs.is_empty() {
                    self.respawn_if_manager(now, None, out);
                } else {
                    // Started again on the tick after the last one exits.
                    self.if_manager = IfManager::Clearing {
                        since: now,
                        left: self.procs.keys().copied().collect(),
                    };
                }
            }
            IfManager::Restarting {
                alive, last_tail, ..
            } => {
                *alive = false;
                *last_tail = Some(exit.tail);
            }
            IfManager::Down | IfManager::Clearing { .. } => {}
        }
    }

    fn respawn_if_manager(
        &mut self,
        now: Duration,
        last_tail: Option<String>,
        out: &mut Vec<Action>,
    ) {
        self.if_manager = IfManager::Restarting {
            since: now,
            alive: false,
            last_tail,
        };
        out.push(Action::RespawnIfManager);
    }

    /// A restarting if-manager that is ready gets its IFs back.
    fn if_manager_ready(
        &mut self,
        now: Duration,
        desired: &dyn Fn(u16) -> Option<Spec>,
        out: &mut Vec<Action>,
    ) {
        if !matches!(self.if_manager, IfManager::Restarting { alive: true, .. }) {
            return;
        }
        self.if_manager = IfManager::Up;
        if self.shutting_down {
            return;
        }
        tracing::info!("orchestrator: if-manager ready again; redeploying");
        let ids: Vec<u16> = self.ifs.keys().copied().collect();
        for if_id in ids {
            let Some(spec) = desired(if_id) else {
                continue;
            };
            let rt = self.ifs.get_mut(&if_id).expect("listed");
            if rt.retiring {
                continue;
            }
            // One deployed while the if-manager was down is replaced, with
            // the shadow it may have started.
            for proc in rt.take_placed() {
                out.push(Action::Terminate { proc });
            }
            let active = self.spawn(now, if_id, spec, false, Purpose::Replacement, out);
            self.ifs.get_mut(&if_id).expect("listed").active = Some(active);
        }
    }

    // ---------------------------------------------------------------------
    // The tick

    fn tick(&mut self, now: Duration, out: &mut Vec<Action>) {
        match &self.if_manager {
            IfManager::Restarting {
                since,
                alive: false,
                last_tail,
            } if now.saturating_sub(*since) > IF_MANAGER_RETRY => {
                if let Some(tail) = last_tail {
                    tracing::warn!("orchestrator: the if-manager did not start:\n{tail}");
                }
                let tail = last_tail.clone();
                self.respawn_if_manager(now, tail, out);
            }
            IfManager::Clearing { .. } if self.shutting_down => self.if_manager = IfManager::Down,
            IfManager::Clearing { since, left } => {
                let waited = now.saturating_sub(*since);
                if !left.is_empty() && waited > IF_MANAGER_CLEARING {
                    tracing::warn!(
                        "orchestrator: {} IF processes of the dead if-manager still run after \
                         {:?}; starting it again anyway (their hugepage files may be left behind)",
                        left.len(),
                        IF_MANAGER_CLEARING
                    );
                }
                if left.is_empty() || waited > IF_MANAGER_CLEARING {
                    self.respawn_if_manager(now, None, out);
                }
            }
            IfManager::Up => self.kill_timed_out(now, out),
            IfManager::Restarting { .. } | IfManager::Down => {}
        }
        let ids: Vec<u16> = self.ifs.keys().copied().collect();
        for if_id in ids {
            self.progress(now, if_id, out);
        }
        self.unregister_retired(out);
        self.kill_stragglers(now, out);
    }

    /// A kp-if that never gets ready would hold up every start after it
    /// (one at a time): kill it; it is then handled like any dead one.
    fn kill_timed_out(&mut self, now: Duration, out: &mut Vec<Action>) {
        let placed: Vec<ProcId> = self.ifs.values().flat_map(IfLife::placed).collect();
        for proc in placed {
            let Some(p) = self.procs.get_mut(&proc) else {
                continue;
            };
            if !p.ready && !p.timed_out && now.saturating_sub(p.started) > START_TIMEOUT {
                p.timed_out = true;
                out.push(Action::Kill {
                    proc,
                    why: KillReason::StartTimeout,
                });
            }
        }
    }

    /// Moves `if_id` along: a started active becomes ready, a missing
    /// shadow is started, a pending re-provision is carried out.
    fn progress(&mut self, now: Duration, if_id: u16, out: &mut Vec<Action>) {
        let rt = &self.ifs[&if_id];
        if self.shutting_down || rt.retiring || rt.taking_over.is_some() {
            return;
        }
        let active_ready = rt.active.is_some_and(|a| self.is_ready(a));
        if rt.busy == Some(Busy::Starting) {
            if active_ready {
                let active = rt.active.expect("ready");
                tracing::info!("orchestrator: {} serving", self.name(active));
                self.set_busy(if_id, None, out);
            } else if rt.active.is_some() {
                return;
            }
        }
        let starting = self.starting();
        let rt = &self.ifs[&if_id];
        if let Some(sw) = &rt.switch {
            match sw.pending {
                _ if sw.carrying_out.is_some() => {}
                // Parked and ready: switch (to nobody's active if it died).
                Some(new) if self.is_ready(new) && (active_ready || rt.active.is_none()) => {
                    let old = rt.active;
                    let rt = self.ifs.get_mut(&if_id).expect("listed");
                    rt.switch.as_mut().expect("checked").carrying_out = Some(old);
                    out.push(Action::CarryOutSwitch { if_id, new, old });
                }
                Some(_) => {}
                None if starting.is_none() => {
                    let spec = sw.spec.clone();
                    let turn = Purpose::Reprovision { by_request: false };
                    let new = self.spawn(now, if_id, spec, true, turn, out);
                    let rt = self.ifs.get_mut(&if_id).expect("listed");
                    rt.switch.as_mut().expect("checked").pending = Some(new);
                }
                None => {} // waits for `starting` to be ready
            }
            return;
        }
        // One kp-if starts at a time: each start maps DPDK's shared memory
        // and loads a model, and two at once on a busy machine can stall
        // the others for seconds (a process still starting cannot answer
        // DPDK's memory-map syncs).
        if rt.shadow.is_none() && active_ready && starting.is_none() {
            let active = rt.active.expect("ready");
            let spec = self.procs[&active].spec.clone();
            let shadow = self.spawn(now, if_id, spec, true, Purpose::Shadow, out);
            self.ifs.get_mut(&if_id).expect("listed").shadow = Some(shadow);
        }
    }

    /// Retired IFs whose processes are all gone are unregistered.
    fn unregister_retired(&mut self, out: &mut Vec<Action>) {
        let gone: Vec<u16> = self
            .ifs
            .iter()
            .filter(|(_, rt)| rt.retiring && rt.switch.is_none())
            .map(|(id, _)| *id)
            .filter(|id| !self.procs.values().any(|p| p.if_id == *id))
            .collect();
        for if_id in gone {
            self.ifs.remove(&if_id);
            out.push(Action::Unregister { if_id });
            out.push(Action::ClearBusy { if_id });
            tracing::info!("orchestrator: if {if_id} retired");
        }
    }

    /// After [`SHUTDOWN_GRACE`], kills the IF processes still there, and
    /// again after each further grace (not on every tick).
    fn kill_stragglers(&mut self, now: Duration, out: &mut Vec<Action>) {
        let Some(from) = self.grace_from else {
            return;
        };
        if now.saturating_sub(from) < SHUTDOWN_GRACE {
            return;
        }
        for proc in self.procs.keys() {
            out.push(Action::Kill {
                proc: *proc,
                why: KillReason::ShutdownGrace,
            });
        }
        self.grace_from = Some(now);
    }

    // ---------------------------------------------------------------------
    // Helpers

    /// Makes the shadow of `if_id` active after its active died, or starts
    /// a new active if there is no ready shadow.
    fn fail_over(
        &mut self,
        now: Duration,
        if_id: u16,
        desired: &dyn Fn(u16) -> Option<Spec>,
        out: &mut Vec<Action>,
    ) {
        let rt = self.ifs.get_mut(&if_id).expect("exists");
        rt.failovers += 1;
        if let Some(shadow) = rt.shadow.take() {
            if self.is_ready(shadow) {
                let rt = self.ifs.get_mut(&if_id).expect("exists");
                rt.taking_over = Some(shadow);
                out.push(Action::Activate { proc: shadow });
                return;
            }
            // Not ready: stop it (see `activated`).
            out.push(Action::Terminate { proc: shadow });
        }
        self.replace_active(now, if_id, desired, out);
    }

    /// No ready shadow: start a new active (it takes the ring from the dead
    /// owner and answers what it held).
    fn replace_active(
        &mut self,
        now: Duration,
        if_id: u16,
        desired: &dyn Fn(u16) -> Option<Spec>,
        out: &mut Vec<Action>,
    ) {
        let Some(spec) = desired(if_id) else {
            return;
        };
        let active = self.spawn(now, if_id, spec, false, Purpose::Replacement, out);
        self.ifs.get_mut(&if_id).expect("exists").active = Some(active);
    }

    /// A new process, tracked from now (and counted as starting).
    fn spawn(
        &mut self,
        now: Duration,
        if_id: u16,
        spec: Spec,
        standby: bool,
        purpose: Purpose,
        out: &mut Vec<Action>,
    ) -> ProcId {
        let proc = ProcId(self.next_proc);
        self.next_proc += 1;
        out.push(Action::Spawn {
            proc,
            if_id,
            spec: spec.clone(),
            standby,
        });
        self.procs.insert(
            proc,
            ProcState {
                if_id,
                name: format!("kp-if {if_id} ({proc:?})"),
                spec,
                started: now,
                ready: false,
                purpose,
                timed_out: false,
            },
        );
        proc
    }

    /// The kp-if process that is starting (not yet ready), if any: a
    /// shadow or a re-provision's new shadow waits for it to be ready
    /// before it starts (a fail-over or a deploy does not wait).
    fn starting(&self) -> Option<ProcId> {
        self.ifs
            .values()
            .flat_map(IfLife::placed)
            .find(|p| !self.is_ready(*p))
    }

    /// Processes in no place: leaving.
    fn leaving(&self) -> Vec<ProcId> {
        self.procs
            .iter()
            .filter(|(id, p)| {
                self.ifs
                    .get(&p.if_id)
                    .is_none_or(|rt| !rt.placed().any(|q| q == **id))
            })
            .map(|(id, _)| *id)
            .collect()
    }

    fn switch_of(&self, if_id: u16, proc: ProcId) -> Option<&Switch> {
        self.ifs
            .get(&if_id)?
            .switch
            .as_ref()
            .filter(|s| s.pending == Some(proc))
    }

    /// Whether `proc` said it is ready (and is not being killed for having
    /// taken too long: its ready line may race the kill).
    fn is_ready(&self, proc: ProcId) -> bool {
        self.procs
            .get(&proc)
            .is_some_and(|p| p.ready && !p.timed_out)
    }

    fn name(&self, proc: ProcId) -> &str {
        self.procs.get(&proc).map_or("a kp-if", |p| p.name.as_str())
    }

    /// Sets what is in progress for `if_id`, telling the driver if it
    /// changed.
    fn set_busy(&mut self, if_id: u16, busy: Option<Busy>, out: &mut Vec<Action>) {
        let Some(rt) = self.ifs.get_mut(&if_id) else {
            return;
        };
        if rt.busy == busy {
            return;
        }
        rt.busy = busy;
        out.push(match busy {
            Some(busy) => Action::SetBusy { if_id, busy },
            None => Action::ClearBusy { if_id },
        });
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use proptest::prelude::*;

    use super::*;

    // ---------------------------------------------------------------------
    // A rig: the machine, a fake clock and a desired state.

    fn spec(pct: f64) -> Spec {
        Spec {
            model: "resnet50".into(),
            binary: "/opt/kneepoint/bin/kp-if".into(),
            slo_ms: 100.0,
            share_pct: pct,
            cores: vec![0, 1],
        }
    }

    fn p(n: u64) -> ProcId {
        ProcId(n)
    }

    fn crash() -> Exit {
        Exit {
            status: "signal: 9 (SIGKILL)".into(),
            tail: "kp-if: last words".into(),
        }
    }

    fn spawn(n: u64, if_id: u16, pct: f64, standby: bool) -> Action {
        Action::Spawn {
            proc: p(n),
            if_id,
            spec: spec(pct),
            standby,
        }
    }

    fn set_busy(if_id: u16, busy: Busy) -> Action {
        Action::SetBusy { if_id, busy }
    }

    fn clear(if_id: u16) -> Action {
        Action::ClearBusy { if_id }
    }

    fn term(n: u64) -> Action {
        Action::Terminate { proc: p(n) }
    }

    fn kill(n: u64, why: KillReason) -> Action {
        Action::Kill { proc: p(n), why }
    }

    fn switch_to(if_id: u16, new: u64, old: Option<u64>) -> Action {
        Action::CarryOutSwitch {
            if_id,
            new: p(new),
            old: old.map(p),
        }
    }

    struct Rig {
        m: Lifecycle,
        now: Duration,
        desired: BTreeMap<u16, Spec>,
    }

    impl Rig {
        fn new() -> Rig {
            Rig {
                m: Lifecycle::new(),
                now: Duration::ZERO,
                desired: BTreeMap::new(),
            }
        }

        fn at(&mut self, secs: f64) {
            self.now = Duration::from_secs_f64(secs);
        }

        fn on(&mut self, event: Event) -> Vec<Action> {
            let desired = self.desired.clone();
            self.m
                .handle(self.now, event, &move |id| desired.get(&id).cloned())
        }

        fn tick(&mut self) -> Vec<Action> {
            self.on(Event::Tick)
        }

        fn deploy(&mut self, if_id: u16, pct: f64) -> Vec<Action> {
            self.desired.insert(if_id, spec(pct));
            self.on(Event::Deploy {
                if_id,
                spec: spec(pct),
            })
        }

        fn switch(&mut self, if_id: u16, pct: f64) -> Vec<Action> {
            self.on(Event::SwitchRequested {
                if_id,
                spec: spec(pct),
                why: format!("share -> {pct}%"),
            })
        }

        fn spawned(&mut self, n: u64) -> Vec<Action> {
            self.on(Event::Spawned {
                proc: p(n),
                name: format!("kp-if #{n}"),
            })
        }

        fn spawn_failed(&mut self, n: u64) -> Vec<Action> {
            self.on(Event::SpawnFailed {
                proc: p(n),
                error: "no free EAL lcore id".into(),
            })
        }

        fn ready(&mut self, n: u64) {
            assert_eq!(self.on(Event::Ready { proc: p(n) }), vec![]);
        }

        fn exited(&mut self, n: u64) -> Vec<Action> {
            self.on(Event::Exited {
                proc: p(n),
                exit: crash(),
            })
        }

        fn activated(&mut self, n: u64, result: Result<(), &str>) -> Vec<Action> {
            self.on(Event::Activated {
                proc: p(n),
                result: result.map_err(String::from),
            })
        }

        fn switched(&mut self, n: u64, result: Result<u64, &str>) -> Vec<Action> {
            self.on(Event::Switched {
                proc: p(n),
                result: result.map_err(String::from),
            })
        }

        /// Deploys `if_id` and brings it to serving with a ready shadow;
        /// returns (active, shadow).
        fn serving(&mut self, if_id: u16, pct: f64) -> (u64, u64) {
            let a = spawned_proc(&self.deploy(if_id, pct));
            self.spawned(a);
            self.ready(a);
            let s = spawned_proc(&self.tick());
            self.spawned(s);
            self.ready(s);
            assert_eq!(self.tick(), vec![]);
            let v = self.view(if_id);
            assert_eq!((v.active, v.busy), (Some(p(a)), None));
            (a, s)
        }

        fn view(&self, if_id: u16) -> IfView<'_> {
            self.m.view(if_id).expect("known")
        }

        fn reason(&self, if_id: u16) -> String {
            self.view(if_id).reason.unwrap_or_default().to_string()
        }
    }

    /// The one process `actions` spawn.
    fn spawned_proc(actions: &[Action]) -> u64 {
        let spawns: Vec<u64> = actions
            .iter()
            .filter_map(|a| match a {
                Action::Spawn { proc, .. } => Some(proc.0),
                _ => None,
            })
            .collect();
        assert_eq!(spawns.len(), 1, "{actions:?}");
        spawns[0]
    }

    // ---------------------------------------------------------------------
    // Deploy and start

    #[test]
    fn a_deploy_starts_its_active_then_a_shadow_once_it_serves() {
        let mut r = Rig::new();
        assert_eq!(r.deploy(1, 30.0), vec![spawn(1, 1, 30.0, false)]);
        assert_eq!(r.spawned(1), vec![set_busy(1, Busy::Starting)]);
        assert_eq!(r.tick(), vec![], "nothing else starts before it serves");
        r.ready(1);
        assert_eq!(r.tick(), vec![clear(1), spawn(2, 1, 30.0, true)]);
        r.spawned(2);
        r.ready(2);
        assert_eq!(r.tick(), vec![]);
        let v = r.view(1);
        assert_eq!(v.active, Some(p(1)));
        assert_eq!(v.warm_until, Some(WARM_UP));
        assert_eq!((v.failovers, v.gaps_ns.len(), v.reason), (0, 0, None));
    }

    #[test]
    fn a_deploy_whose_process_cannot_be_spawned_fails_and_leaves_nothing() {
        let mut r = Rig::new();
        r.deploy(1, 30.0);
        assert_eq!(
            r.spawn_failed(1),
            vec![Action::Refuse {
                error: LifecycleError::Spawn("no free EAL lcore id".into())
            }]
        );
        assert!(r.m.view(1).is_none());
        assert!(r.m.all_gone());
        // It can be deployed again.
        assert_eq!(r.deploy(1, 30.0), vec![spawn(2, 1, 30.0, false)]);
    }

    #[test]
    fn a_deploy_of_a_deployed_if_or_during_shutdown_is_refused() {
        let mut r = Rig::new();
        r.serving(1, 30.0);
        assert_eq!(
            r.deploy(1, 30.0),
            vec![Action::Refuse {
                error: LifecycleError::Deployed(1)
            }]
        );
        r.on(Event::Shutdown);
        assert_eq!(
            r.deploy(2, 30.0),
            vec![Action::Refuse {
                error: LifecycleError::ShuttingDown
            }]
        );
    }

    #[test]
    fn an_active_not_ready_within_the_start_timeout_is_killed_once_then_replaced() {
        let mut r = Rig::new();
        r.deploy(1, 30.0);
        r.spawned(1);
        r.at(60.0);
        assert_eq!(r.tick(), vec![], "60 s is allowed");
        r.at(60.001);
        assert_eq!(r.tick(), vec![kill(1, KillReason::StartTimeout)]);
        r.at(61.0);
        assert_eq!(r.tick(), vec![], "killed once");
        // Its exit is a fail-over, and the IF says why.
        assert_eq!(r.exited(1), vec![spawn(2, 1, 30.0, false)]);
        assert!(r
            .reason(1)
            .starts_with("kp-if #1 did not start: kp-if: last words"));
        assert_eq!(r.view(1).failovers, 1);
        assert_eq!(r.spawned(2), vec![], "still starting");
        assert_eq!(r.view(1).busy, Some(Busy::Starting));
    }

    #[test]
    fn a_shadow_not_ready_within_the_start_timeout_is_killed_and_started_again() {
        let mut r = Rig::new();
        r.deploy(1, 30.0);
        r.spawned(1);
        r.ready(1);
        assert_eq!(r.tick(), vec![clear(1), spawn(2, 1, 30.0, true)]);
        r.spawned(2);
        r.at(60.5);
        assert_eq!(r.tick(), vec![kill(2, KillReason::StartTimeout)]);
        assert_eq!(r.exited(2), vec![]);
        assert_eq!(r.tick(), vec![spawn(3, 1, 30.0, true)]);
        assert_eq!(r.view(1).reason, None, "a shadow's start is not the IF's");
    }

    #[test]
    fn one_kp_if_starts_at_a_time_but_a_deploy_does_not_wait() {
        let mut r = Rig::new();
        r.deploy(1, 30.0);
        r.spawned(1);
        r.ready(1);
        // If 2's deploy starts at once, while nothing else is starting.
        assert_eq!(r.deploy(2, 30.0), vec![spawn(2, 2, 30.0, false)]);
        r.spawned(2);
        // If 1 serves, but its shadow waits for if 2's active.
        assert_eq!(r.tick(), vec![clear(1)]);
        r.ready(2);
        assert_eq!(r.tick(), vec![spawn(3, 1, 30.0, true), clear(2)]);
        r.spawned(3);
        // If 2's shadow waits for if 1's.
        assert_eq!(r.tick(), vec![]);
        // A deploy does not wait for it.
        assert_eq!(r.deploy(3, 30.0), vec![spawn(4, 3, 30.0, false)]);
        r.spawned(4);
        r.ready(3);
        assert_eq!(r.tick(), vec![], "if 3's active is still starting");
        r.ready(4);
        assert_eq!(r.tick(), vec![spawn(5, 2, 30.0, true), clear(3)]);
    }

    // ---------------------------------------------------------------------
    // Fail-over and dead shadows

    #[test]
    fn a_dead_active_is_replaced_by_its_ready_shadow() {
        let mut r = Rig::new();
        let (a, s) = r.serving(1, 30.0);
        r.at(5.0);
        assert_eq!(r.exited(a), vec![Action::Activate { proc: p(s) }]);
        assert_eq!(r.activated(s, Ok(())), vec![Action::NewActive { if_id: 1 }]);
        let v = r.view(1);
        assert_eq!((v.active, v.failovers, v.busy), (Some(p(s)), 1, None));
        assert_eq!(v.warm_until, Some(Duration::from_secs(5) + WARM_UP));
        assert_eq!(r.tick(), vec![spawn(3, 1, 30.0, true)], "a new shadow");
    }

    #[test]
    fn a_shadow_that_refuses_to_activate_is_stopped_and_a_new_active_started() {
        let mut r = Rig::new();
        let (a, s) = r.serving(1, 30.0);
        r.exited(a);
        assert_eq!(
            r.activated(s, Err("no reply within 10s")),
            vec![term(s), spawn(3, 1, 30.0, false)]
        );
        assert_eq!(r.spawned(3), vec![set_busy(1, Busy::Starting)]);
        assert_eq!(r.tick(), vec![]);
        r.ready(3);
        assert_eq!(r.tick(), vec![clear(1), spawn(4, 1, 30.0, true)]);
        assert_eq!(r.exited(s), vec![], "the stopped shadow just leaves");
    }

    #[test]
    fn a_shadow_not_ready_at_fail_over_is_stopped_and_a_new_active_started() {
        let mut r = Rig::new();
        r.deploy(1, 30.0);
        r.spawned(1);
        r.ready(1);
        r.tick(); // shadow 2 starts
        r.spawned(2);
        assert_eq!(r.exited(1), vec![term(2), spawn(3, 1, 30.0, false)]);
        assert_eq!(r.view(1).failovers, 1);
    }

    #[test]
    fn an_active_that_dies_with_its_shadow_is_started_again() {
        // The driver feeds actives' exits last in a round: the dead shadow
        // is not asked to take over.
        let mut r = Rig::new();
        let (a, s) = r.serving(1, 30.0);
        assert!(r.m.is_active(p(a)) && !r.m.is_active(p(s)));
        assert_eq!(r.exited(s), vec![]);
        assert_eq!(r.exited(a), vec![spawn(3, 1, 30.0, false)]);
    }

    #[test]
    fn a_new_active_uses_the_desired_spec_not_the_dead_ones() {
        let mut r = Rig::new();
        r.deploy(1, 30.0);
        r.spawned(1);
        r.desired.insert(1, spec(45.0));
        assert_eq!(r.exited(1), vec![spawn(2, 1, 45.0, false)]);
    }

    #[test]
    fn an_if_whose_new_active_cannot_be_spawned_has_none_and_says_why() {
        let mut r = Rig::new();
        let (a, s) = r.serving(1, 30.0);
        r.exited(s);
        r.exited(a);
        assert_eq!(r.spawn_failed(3), vec![]);
        let v = r.view(1);
        assert_eq!((v.active, v.busy), (None, None));
        assert_eq!(v.reason, Some("no free EAL lcore id"));
        assert_eq!(r.tick(), vec![], "not retried (as before)");
    }

    #[test]
    fn a_shadow_taking_over_that_dies_before_it_answers_is_replaced() {
        let mut r = Rig::new();
        let (a, s) = r.serving(1, 30.0);
        r.exited(a);
        assert_eq!(r.exited(s), vec![spawn(3, 1, 30.0, false)]);
        assert_eq!(r.activated(s, Ok(())), vec![], "a late answer is ignored");
        assert_eq!(r.view(1).active, Some(p(3)));
    }

    #[test]
    fn a_dead_shadow_is_started_again_next_tick() {
        let mut r = Rig::new();
        let (_, s) = r.serving(1, 30.0);
        assert_eq!(r.exited(s), vec![]);
        assert_eq!(r.tick(), vec![spawn(3, 1, 30.0, true)]);
    }

    #[test]
    fn a_shadow_that_cannot_be_spawned_says_why_and_is_retried_each_tick() {
        let mut r = Rig::new();
        let (_, s) = r.serving(1, 30.0);
        r.exited(s);
        r.tick();
        assert_eq!(r.spawn_failed(3), vec![], "no retry in the same round");
        assert_eq!(r.reason(1), "no free EAL lcore id");
        assert_eq!(r.tick(), vec![spawn(4, 1, 30.0, true)]);
    }

    #[test]
    fn a_relabelled_share_is_the_next_shadows() {
        let mut r = Rig::new();
        let (_, s) = r.serving(1, 30.0);
        r.m.set_active_share(1, 35.0);
        assert_eq!(r.m.active_spec(1).map(|s| s.share_pct), Some(35.0));
        r.exited(s);
        assert_eq!(r.tick(), vec![spawn(3, 1, 35.0, true)]);
    }

    // ---------------------------------------------------------------------
    // Re-provisioning

    #[test]
    fn a_switch_starts_a_new_shadow_switches_over_and_replaces_the_old_pair() {
        let mut r = Rig::new();
        let (a, s) = r.serving(1, 30.0);
        assert_eq!(r.switch(1, 60.0), vec![spawn(3, 1, 60.0, true)]);
        assert_eq!(r.spawned(3), vec![set_busy(1, Busy::Switching)]);
        assert!(r.view(1).switching);
        assert_eq!(r.tick(), vec![], "not parked yet");
        r.ready(3);
        r.at(7.0);
        assert_eq!(r.tick(), vec![switch_to(1, 3, Some(a))]);
        assert_eq!(r.tick(), vec![], "carried out once");
        assert_eq!(
            r.switched(3, Ok(1500)),
            vec![Action::NewActive { if_id: 1 }, term(s), clear(1)],
            "the old active leaves by itself; the old shadow is stopped"
        );
        let v = r.view(1);
        assert_eq!(
            (v.active, v.gaps_ns, v.switching),
            (Some(p(3)), &[1500][..], false)
        );
        assert_eq!(v.warm_until, Some(Duration::from_secs(7) + WARM_UP));
        assert_eq!(r.tick(), vec![spawn(4, 1, 60.0, true)], "a shadow at 60%");
        assert_eq!(r.exited(a), vec![], "the old active's exit is no fail-over");
        assert_eq!(r.view(1).failovers, 0);
    }

    #[test]
    fn a_switch_waits_for_a_kp_if_that_is_starting() {
        let mut r = Rig::new();
        r.serving(1, 30.0);
        r.deploy(2, 30.0);
        r.spawned(3);
        assert_eq!(r.switch(1, 60.0), vec![set_busy(1, Busy::Switching)]);
        assert_eq!(r.tick(), vec![]);
        r.ready(3);
        assert_eq!(r.tick(), vec![spawn(4, 1, 60.0, true), clear(2)]);
        assert_eq!(r.spawned(4), vec![], "busy already");
        r.ready(4);
        assert_eq!(
            r.tick(),
            vec![switch_to(1, 4, Some(1)), spawn(5, 2, 30.0, true)],
            "if 2's shadow starts once nothing else is starting"
        );
    }

    #[test]
    fn a_switch_whose_new_shadow_cannot_be_spawned_is_refused() {
        let mut r = Rig::new();
        r.serving(1, 30.0);
        r.switch(1, 60.0);
        assert_eq!(
            r.spawn_failed(3),
            vec![Action::Refuse {
                error: LifecycleError::Spawn("no free EAL lcore id".into())
            }]
        );
        let v = r.view(1);
        assert_eq!((v.busy, v.switching, v.reason), (None, false, None));
    }

    #[test]
    fn a_switch_whose_turn_comes_but_cannot_spawn_fails_and_says_why() {
        let mut r = Rig::new();
        r.serving(1, 30.0);
        r.deploy(2, 30.0);
        r.spawned(3);
        r.switch(1, 60.0);
        r.ready(3);
        r.tick();
        assert_eq!(r.spawn_failed(4), vec![clear(1)]);
        assert_eq!(r.reason(1), "re-provision failed: no free EAL lcore id");
        assert!(!r.view(1).switching);
    }

    #[test]
    fn a_failed_switchover_stops_the_new_shadow_and_keeps_the_old_pair() {
        // Whichever step failed: activate, yield, or becoming active.
        for error in [
            "ipc://if-1-3.sock refused: not parked",
            "kp-if 1 #1 (active, 30%) did not yield: IfStatus { mode: \"active\" }",
            "kp-if 1 #3 (shadow, 60%) never became active: IfStatus { mode: \"parked\" }",
        ] {
            let mut r = Rig::new();
            let (a, s) = r.serving(1, 30.0);
            r.switch(1, 60.0);
            r.spawned(3);
            r.ready(3);
            r.tick();
            assert_eq!(
                r.switched(3, Err(error)),
                vec![term(3), clear(1)],
                "{error}"
            );
            let v = r.view(1);
            assert_eq!(
                v.reason,
                Some(format!("re-provision (share -> 60%) failed: {error}").as_str())
            );
            assert_eq!(
                (v.active, v.gaps_ns.len(), v.switching),
                (Some(p(a)), 0, false)
            );
            assert_eq!(r.tick(), vec![], "shadow {s} is still there");
        }
    }

    #[test]
    fn a_pending_shadow_that_dies_fails_the_re_provision() {
        let mut r = Rig::new();
        r.serving(1, 30.0);
        r.switch(1, 60.0);
        r.spawned(3);
        assert_eq!(r.exited(3), vec![clear(1)]);
        assert_eq!(
            r.reason(1),
            "re-provision (share -> 60%) failed: kp-if #3 exited (signal: 9 (SIGKILL)): kp-if: last words"
        );
        assert!(!r.view(1).switching);
        assert_eq!(r.tick(), vec![]);
    }

    #[test]
    fn the_active_dying_while_switching_fails_over_and_the_switch_goes_on() {
        let mut r = Rig::new();
        let (a, s) = r.serving(1, 30.0);
        r.switch(1, 60.0);
        r.spawned(3);
        assert_eq!(r.exited(a), vec![Action::Activate { proc: p(s) }]);
        r.activated(s, Ok(()));
        r.ready(3);
        assert_eq!(r.tick(), vec![switch_to(1, 3, Some(s))]);
        assert_eq!(
            r.switched(3, Ok(900)),
            vec![Action::NewActive { if_id: 1 }, clear(1)]
        );
        assert_eq!(r.view(1).failovers, 1);
        assert_eq!(r.tick(), vec![spawn(4, 1, 60.0, true)]);
    }

    #[test]
    fn the_active_dying_while_switching_without_a_shadow_waits_for_the_new_active() {
        let mut r = Rig::new();
        let (a, s) = r.serving(1, 30.0);
        r.exited(s);
        r.desired.insert(1, spec(60.0));
        assert_eq!(r.switch(1, 60.0), vec![spawn(3, 1, 60.0, true)]);
        r.spawned(3);
        assert_eq!(r.exited(a), vec![spawn(4, 1, 60.0, false)]);
        // The new active's start marks the IF starting (as before: the
        // re-provision goes on after it serves, no longer marked busy).
        assert_eq!(r.spawned(4), vec![set_busy(1, Busy::Starting)]);
        r.ready(3);
        assert_eq!(r.tick(), vec![], "the new active is not ready");
        r.ready(4);
        assert_eq!(r.tick(), vec![clear(1), switch_to(1, 3, Some(4))]);
    }

    #[test]
    fn a_switch_goes_to_nobodys_active_when_none_is_left() {
        let mut r = Rig::new();
        let (a, s) = r.serving(1, 30.0);
        r.switch(1, 60.0);
        r.spawned(3);
        r.exited(s);
        r.exited(a);
        r.spawn_failed(4);
        r.ready(3);
        assert_eq!(r.tick(), vec![switch_to(1, 3, None)]);
        assert_eq!(
            r.switched(3, Ok(0)),
            vec![Action::NewActive { if_id: 1 }, clear(1)]
        );
        assert_eq!(r.view(1).active, Some(p(3)));
    }

    #[test]
    fn a_second_switch_replaces_the_first_and_stops_its_new_shadow() {
        let mut r = Rig::new();
        r.serving(1, 30.0);
        r.switch(1, 60.0);
        r.spawned(3);
        r.ready(3);
        assert_eq!(r.switch(1, 40.0), vec![term(3), spawn(4, 1, 40.0, true)]);
        r.spawned(4);
        assert_eq!(r.tick(), vec![]);
    }

    #[test]
    fn a_switch_of_an_unknown_or_retired_if_or_during_shutdown_is_refused() {
        let mut r = Rig::new();
        let refused = |error| vec![Action::Refuse { error }];
        assert_eq!(r.switch(7, 60.0), refused(LifecycleError::NoSuchIf(7)));
        r.serving(1, 30.0);
        r.serving(2, 30.0);
        r.on(Event::Retire { if_id: 2 });
        assert_eq!(r.switch(2, 60.0), refused(LifecycleError::NoSuchIf(2)));
        r.on(Event::Shutdown);
        assert_eq!(r.switch(1, 60.0), refused(LifecycleError::ShuttingDown));
    }

    // ---------------------------------------------------------------------
    // Retire and shutdown

    #[test]
    fn retire_while_switching_stops_every_process_then_unregisters() {
        let mut r = Rig::new();
        let (a, s) = r.serving(1, 30.0);
        r.switch(1, 60.0);
        r.spawned(3);
        r.ready(3);
        assert_eq!(
            r.on(Event::Retire { if_id: 1 }),
            vec![term(a), term(s), term(3), set_busy(1, Busy::Retiring)]
        );
        assert_eq!(r.tick(), vec![], "no switch, no shadow, no unregister");
        assert_eq!(r.switched(3, Ok(1)), vec![], "a late answer is ignored");
        for n in [a, s] {
            assert_eq!(r.exited(n), vec![], "no fail-over");
            assert_eq!(r.tick(), vec![]);
        }
        r.exited(3);
        assert_eq!(r.tick(), vec![Action::Unregister { if_id: 1 }, clear(1)]);
        assert!(r.m.view(1).is_none() && r.m.all_gone());
    }

    #[test]
    fn retire_while_starting_stops_the_starting_active() {
        let mut r = Rig::new();
        r.deploy(1, 30.0);
        r.spawned(1);
        assert_eq!(
            r.on(Event::Retire { if_id: 1 }),
            vec![term(1), set_busy(1, Busy::Retiring)]
        );
        r.at(100.0);
        assert_eq!(r.tick(), vec![], "no start timeout for a leaving process");
        r.exited(1);
        assert_eq!(r.tick(), vec![Action::Unregister { if_id: 1 }, clear(1)]);
    }

    #[test]
    fn retire_of_an_if_without_processes_unregisters_it_next_tick() {
        let mut r = Rig::new();
        r.deploy(1, 30.0);
        r.spawned(1);
        r.desired.clear();
        r.exited(1); // no desired spec: no new active
        assert_eq!(r.view(1).active, None);
        assert_eq!(
            r.on(Event::Retire { if_id: 1 }),
            vec![set_busy(1, Busy::Retiring)]
        );
        assert_eq!(r.tick(), vec![Action::Unregister { if_id: 1 }, clear(1)]);
    }

    #[test]
    fn shutdown_while_starting_stops_everything_without_failing_over() {
        let mut r = Rig::new();
        let (a, s) = r.serving(1, 30.0);
        r.deploy(2, 30.0);
        r.spawned(3);
        assert_eq!(r.on(Event::Shutdown), vec![term(a), term(s), term(3)]);
        assert!(!r.m.all_gone());
        for n in [3, a] {
            assert_eq!(r.exited(n), vec![]);
        }
        r.at(100.0);
        assert_eq!(r.tick(), vec![kill(s, KillReason::ShutdownGrace)]);
        r.exited(s);
        assert!(r.m.all_gone());
    }

    #[test]
    fn shutdown_stops_leaving_processes_and_kills_stragglers_after_each_grace() {
        let mut r = Rig::new();
        let (a, s) = r.serving(1, 30.0);
        r.switch(1, 60.0);
        r.spawned(3);
        r.ready(3);
        r.tick();
        r.switched(3, Ok(1));
        r.tick(); // shadow 4
        r.spawned(4);
        r.at(20.0);
        // The draining old active and the stopped old shadow first.
        assert_eq!(
            r.on(Event::Shutdown),
            vec![term(a), term(s), term(3), term(4)]
        );
        r.exited(s);
        r.exited(4);
        r.at(29.9);
        assert_eq!(r.tick(), vec![]);
        r.at(30.0);
        let stragglers = vec![
            kill(a, KillReason::ShutdownGrace),
            kill(3, KillReason::ShutdownGrace),
        ];
        assert_eq!(r.tick(), stragglers);
        r.at(35.0);
        assert_eq!(r.tick(), vec![], "not on every tick");
        r.at(40.0);
        assert_eq!(r.tick(), stragglers, "again after another grace");
        r.exited(a);
        r.exited(3);
        assert!(r.m.all_gone());
    }

    #[test]
    fn shutdown_during_a_fail_over_stops_the_shadow_taking_over() {
        let mut r = Rig::new();
        let (a, s) = r.serving(1, 30.0);
        r.exited(a);
        assert_eq!(r.on(Event::Shutdown), vec![term(s)]);
        assert_eq!(r.activated(s, Ok(())), vec![], "a late answer is ignored");
        assert_eq!(r.view(1).active, None);
    }

    // ---------------------------------------------------------------------
    // The if-manager

    #[test]
    fn the_if_manager_dying_restarts_the_platform_and_redeploys_when_ready() {
        let mut r = Rig::new();
        r.serving(1, 30.0);
        r.serving(2, 30.0);
        r.switch(1, 60.0);
        r.spawned(5);
        let restart = KillReason::PlatformRestart;
        assert_eq!(
            r.on(Event::IfManagerExited { exit: crash() }),
            vec![
                kill(1, restart),
                kill(2, restart),
                kill(5, restart),
                set_busy(1, Busy::Starting),
                kill(3, restart),
                kill(4, restart),
                set_busy(2, Busy::Starting),
            ]
        );
        assert_eq!(r.m.platform_restarts(), 1);
        for n in 1..=5 {
            assert_eq!(r.tick(), vec![], "process {n} of the dead one runs");
            assert_eq!(r.exited(n), vec![], "no fail-over");
        }
        assert_eq!(
            r.tick(),
            vec![Action::RespawnIfManager],
            "once the last one exited"
        );
        assert_eq!(r.on(Event::IfManagerSpawned), vec![]);
        assert_eq!(r.tick(), vec![], "nothing starts before it is ready");
        r.desired.insert(1, spec(60.0));
        assert_eq!(
            r.on(Event::IfManagerReady),
            vec![spawn(6, 1, 60.0, false), spawn(7, 2, 30.0, false)]
        );
        assert_eq!(r.spawned(6), vec![], "starting already");
        r.spawned(7);
        r.ready(6);
        r.ready(7);
        assert_eq!(
            r.tick(),
            vec![clear(1), spawn(8, 1, 60.0, true), clear(2)],
            "the re-provision was dropped with its processes"
        );
    }

    #[test]
    fn processes_in_no_place_are_killed_too_and_a_stuck_one_is_waited_for_a_while() {
        let mut r = Rig::new();
        r.serving(1, 30.0);
        r.switch(1, 60.0);
        r.spawned(3);
        r.ready(3);
        r.tick();
        // 1 (the old active) finishes what it holds, 2 (the old shadow) was
        // told to stop, 3 serves and 4 is its new shadow.
        r.switched(3, Ok(1500));
        assert_eq!(r.tick(), vec![spawn(4, 1, 60.0, true)]);
        r.at(20.0);
        let restart = KillReason::PlatformRestart;
        let actions = r.on(Event::IfManagerExited { exit: crash() });
        for n in 1..=4 {
            assert!(actions.contains(&kill(n, restart)), "{n}: {actions:?}");
        }
        assert!(!actions.contains(&Action::RespawnIfManager));
        for n in [1, 2, 3] {
            r.exited(n);
        }
        r.at(20.0 + IF_MANAGER_CLEARING.as_secs_f64());
        assert_eq!(r.tick(), vec![], "4 still runs");
        r.at(20.001 + IF_MANAGER_CLEARING.as_secs_f64());
        assert_eq!(r.tick(), vec![Action::RespawnIfManager], "not forever");
    }

    #[test]
    fn an_if_manager_that_fails_to_restart_is_tried_again_a_second_later() {
        let mut r = Rig::new();
        r.serving(1, 30.0);
        r.at(10.0);
        r.on(Event::IfManagerExited { exit: crash() });
        r.exited(1);
        r.exited(2);
        assert_eq!(r.tick(), vec![Action::RespawnIfManager]);
        assert_eq!(r.on(Event::IfManagerSpawnFailed), vec![]);
        r.at(11.0);
        let keep_busy = vec![];
        assert_eq!(r.tick(), keep_busy, "a second is not over");
        r.at(11.001);
        assert_eq!(r.tick(), vec![Action::RespawnIfManager]);
        r.on(Event::IfManagerSpawned);
        r.at(13.0);
        assert_eq!(r.tick(), vec![], "alive: it is waited for");
        // It dies again before it is ready.
        assert_eq!(r.on(Event::IfManagerExited { exit: crash() }), vec![]);
        assert_eq!(
            r.on(Event::IfManagerReady),
            vec![],
            "a dead one's readiness"
        );
        r.at(13.5);
        assert_eq!(
            r.tick(),
            vec![Action::RespawnIfManager],
            "a second after the last try"
        );
        r.on(Event::IfManagerSpawned);
        assert_eq!(r.on(Event::IfManagerReady), vec![spawn(3, 1, 30.0, false)]);
        assert_eq!(r.m.platform_restarts(), 1);
    }

    #[test]
    fn start_timeouts_wait_while_the_if_manager_restarts() {
        let mut r = Rig::new();
        r.deploy(1, 30.0);
        r.spawned(1);
        r.on(Event::IfManagerExited { exit: crash() });
        // Deployed meanwhile: started, but not timed out, and not waited
        // for (it is no process of the dead if-manager).
        r.deploy(2, 30.0);
        r.spawned(2);
        r.exited(1);
        assert_eq!(r.tick(), vec![Action::RespawnIfManager]);
        r.on(Event::IfManagerSpawned);
        r.at(120.0);
        assert_eq!(r.tick(), vec![]);
        // Once ready, if 2's early active is replaced like every other.
        assert_eq!(
            r.on(Event::IfManagerReady),
            vec![spawn(3, 1, 30.0, false), term(2), spawn(4, 2, 30.0, false)]
        );
    }

    #[test]
    fn a_redeployed_active_that_cannot_be_spawned_leaves_the_if_starting() {
        let mut r = Rig::new();
        r.serving(1, 30.0);
        r.on(Event::IfManagerExited { exit: crash() });
        r.exited(1);
        r.exited(2);
        r.tick();
        r.on(Event::IfManagerSpawned);
        r.on(Event::IfManagerReady);
        assert_eq!(r.spawn_failed(3), vec![]);
        let v = r.view(1);
        assert_eq!((v.active, v.busy), (None, Some(Busy::Starting)));
        assert_eq!(v.reason, Some("no free EAL lcore id"));
    }

    #[test]
    fn a_retired_if_is_not_redeployed_and_is_unregistered_once_gone() {
        let mut r = Rig::new();
        r.serving(1, 30.0);
        let (a, s) = r.serving(2, 30.0);
        r.desired.remove(&2);
        r.on(Event::Retire { if_id: 2 });
        r.on(Event::IfManagerExited { exit: crash() });
        for n in [1, 2, a, s] {
            r.exited(n);
        }
        assert_eq!(
            r.tick(),
            vec![
                Action::RespawnIfManager,
                Action::Unregister { if_id: 2 },
                clear(2)
            ]
        );
        r.on(Event::IfManagerSpawned);
        assert_eq!(r.on(Event::IfManagerReady), vec![spawn(5, 1, 30.0, false)]);
    }

    #[test]
    fn the_if_manager_dying_during_shutdown_is_not_restarted() {
        let mut r = Rig::new();
        r.serving(1, 30.0);
        r.on(Event::Shutdown);
        assert_eq!(r.on(Event::IfManagerExited { exit: crash() }), vec![]);
        r.at(5.0);
        assert_eq!(r.tick(), vec![]);
        assert_eq!(r.m.platform_restarts(), 0);
    }

    #[test]
    fn an_if_manager_ready_after_shutdown_redeploys_nothing() {
        let mut r = Rig::new();
        r.serving(1, 30.0);
        r.on(Event::IfManagerExited { exit: crash() });
        r.on(Event::IfManagerSpawned);
        r.on(Event::Shutdown);
        assert_eq!(r.on(Event::IfManagerReady), vec![]);
    }

    #[test]
    fn answers_about_unknown_processes_are_ignored() {
        let mut r = Rig::new();
        r.serving(1, 30.0);
        let ghost = 99;
        assert_eq!(r.spawned(ghost), vec![]);
        assert_eq!(r.spawn_failed(ghost), vec![]);
        assert_eq!(r.exited(ghost), vec![]);
        assert_eq!(r.activated(ghost, Ok(())), vec![]);
        assert_eq!(r.switched(ghost, Ok(1)), vec![]);
        assert_eq!(r.on(Event::Ready { proc: p(ghost) }), vec![]);
        assert_eq!(r.on(Event::IfManagerReady), vec![], "it is up");
        assert_eq!(r.tick(), vec![]);
    }

    // ---------------------------------------------------------------------
    // Random sequences against a simulated world

    /// A process as the simulated world sees it.
    #[derive(Debug)]
    struct WorldProc {
        if_id: u16,
        standby: bool,
        /// It owns (or asked for) its IF's ring: started active, activated
        /// or switched to, and neither yielded nor told to stop.
        owns_ring: bool,
        ready: bool,
        stopping: bool,
    }

    /// The driver, with outcomes drawn from the test case.
    struct World {
        rig: Rig,
        procs: BTreeMap<ProcId, WorldProc>,
        busy: BTreeMap<u16, Busy>,
        /// The if-manager: None dead, Some(ready reported).
        ifm: Option<bool>,
        shutting: bool,
        luck: std::vec::IntoIter<u8>,
    }

    #[derive(Clone, Debug)]
    enum Op {
        Tick(u8),
        Deploy(u16),
        Switch(u16, u8),
        Retire(u16),
        Shutdown,
        Ready(u8),
        Exit(u8),
        IfManagerExit,
        IfManagerReady,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => any::<u8>().prop_map(Op::Tick),
            2 => (1u16..4).prop_map(Op::Deploy),
            2 => ((1u16..4), any::<u8>()).prop_map(|(i, s)| Op::Switch(i, s)),
            1 => (1u16..4).prop_map(Op::Retire),
            4 => any::<u8>().prop_map(Op::Ready),
            2 => any::<u8>().prop_map(Op::Exit),
            1 => Just(Op::IfManagerExit),
            2 => Just(Op::IfManagerReady),
            1 => Just(Op::Shutdown),
        ]
    }

    impl World {
        /// Usually true; false one time in `odds`.
        fn lucky(&mut self, odds: u8) -> bool {
            !self.luck.next().unwrap_or(1).is_multiple_of(odds)
        }

        /// Feeds `event` and carries out every action as the daemon does:
        /// one by one, each answer fed back before the next action.
        fn feed(&mut self, event: Event) -> Result<Vec<LifecycleError>, TestCaseError> {
            let mut refused = Vec::new();
            let mut queue: std::collections::VecDeque<Action> = self.rig.on(event).into();
            while let Some(action) = queue.pop_front() {
                let answer = match action {
                    Action::Spawn {
                        proc,
                        if_id,
                        standby,
                        ..
                    } => {
                        prop_assert!(!self.shutting, "{proc:?} spawned after shutdown");
                        prop_assert!(!self.procs.contains_key(&proc), "{proc:?} reused");
                        if standby {
                            let starting: Vec<_> = self
                                .procs
                                .iter()
                                .filter(|(_, w)| !w.ready && !w.stopping)
                                .map(|(id, _)| *id)
                                .collect();
                            prop_assert!(
                                starting.is_empty(),
                                "shadow {proc:?} spawned while {starting:?} start"
                            );
                        }
                        if self.lucky(6) {
                            self.procs.insert(
                                proc,
                                WorldProc {
                                    if_id,
                                    standby,
                                    owns_ring: !standby,
                                    ready: false,
                                    stopping: false,
                                },
                            );
                            Some(Event::Spawned {
                                proc,
                                name: format!("{proc:?}"),
                            })
                        } else {
                            Some(Event::SpawnFailed {
                                proc,
                                error: "cannot start".into(),
                            })
                        }
                    }
                    Action::Activate { proc } => {
                        let ok = self.lucky(3);
                        let w = self.procs.get_mut(&proc).expect("alive");
                        prop_assert!(w.standby && w.ready && !w.stopping, "{proc:?}: {w:?}");
                        w.owns_ring |= ok;
                        let result = if ok { Ok(()) } else { Err("refused".into()) };
                        Some(Event::Activated { proc, result })
                    }
                    Action::CarryOutSwitch { new, old, .. } => {
                        let ok = self.lucky(3);
                        let w = self.procs.get_mut(&new).expect("alive");
                        prop_assert!(w.standby && w.ready && !w.stopping, "{new:?}: {w:?}");
                        // Failed or not, `activate` may have happened: the
                        // machine must stop the new one if it failed.
                        w.owns_ring = true;
                        if ok {
                            if let Some(old) = old {
                                self.procs.get_mut(&old).expect("alive").owns_ring = false;
                            }
                        }
                        let result = if ok {
                            Ok(1000)
                        } else {
                            Err("did not yield".into())
                        };
                        Some(Event::Switched { proc: new, result })
                    }
                    Action::Terminate { proc } | Action::Kill { proc, .. } => {
                        let w = self.procs.get_mut(&proc);
                        prop_assert!(w.is_some(), "{proc:?} signalled but not alive");
                        let w = w.expect("checked");
                        w.stopping = true;
                        w.owns_ring = false;
                        None
                    }
                    Action::SetBusy { if_id, busy } => {
                        self.busy.insert(if_id, busy);
                        None
                    }
                    Action::ClearBusy { if_id } => {
                        self.busy.remove(&if_id);
                        None
                    }
                    Action::NewActive { .. } => None,
                    Action::Unregister { if_id } => {
                        prop_assert!(
                            !self.procs.values().any(|w| w.if_id == if_id),
                            "if {if_id} unregistered with processes alive"
                        );
                        None
                    }
                    Action::RespawnIfManager => {
                        prop_assert!(self.ifm.is_none(), "a second if-manager");
                        if self.lucky(3) {
                            self.ifm = Some(false);
                            Some(Event::IfManagerSpawned)
                        } else {
                            Some(Event::IfManagerSpawnFailed)
                        }
                    }
                    Action::Refuse { error } => {
                        refused.push(error);
                        None
                    }
                };
                if let Some(answer) = answer {
                    let mut next: std::collections::VecDeque<Action> = self.rig.on(answer).into();
                    next.extend(queue);
                    queue = next;
                }
            }
            Ok(refused)
        }

        fn step(&mut self, op: Op) -> Result<(), TestCaseError> {
            let plan_ok = |w: &World, id: u16| {
                !w.shutting && w.rig.desired.contains_key(&id) && !w.busy.contains_key(&id)
            };
            match op {
                Op::Tick(dt) => {
                    let dt = [0.005, 0.5, 1.5, 11.0, 61.0][dt as usize % 5];
                    self.rig.now += Duration::from_secs_f64(dt);
                    self.feed(Event::Tick)?;
                }
                Op::Deploy(if_id) => {
                    if !self.shutting
                        && !self.rig.desired.contains_key(&if_id)
                        && !self.busy.contains_key(&if_id)
                    {
                        let refused = self.feed(Event::Deploy {
                            if_id,
                            spec: spec(30.0),
                        })?;
                        if refused.is_empty() {
                            self.rig.desired.insert(if_id, spec(30.0));
                        }
                    }
                }
                Op::Switch(if_id, pct) if plan_ok(self, if_id) => {
                    let pct = 10.0 + f64::from(pct % 80);
                    let refused = self.feed(Event::SwitchRequested {
                        if_id,
                        spec: spec(pct),
                        why: "test".into(),
                    })?;
                    if refused.is_empty() {
                        self.rig.desired.insert(if_id, spec(pct));
                    }
                }
                Op::Retire(if_id) if plan_ok(self, if_id) => {
                    self.rig.desired.remove(&if_id);
                    self.feed(Event::Retire { if_id })?;
                }
                Op::Switch(..) | Op::Retire(_) => {}
                Op::Shutdown => {
                    if !self.shutting {
                        self.shutting = true;
                        self.feed(Event::Shutdown)?;
                    }
                }
                Op::Ready(i) => {
                    let unready: Vec<ProcId> = self
                        .procs
                        .iter()
                        .filter(|(_, w)| !w.ready)
                        .map(|(id, _)| *id)
                        .collect();
                    if !unready.is_empty() {
                        let proc = unready[i as usize % unready.len()];
                        self.procs.get_mut(&proc).expect("listed").ready = true;
                        self.feed(Event::Ready { proc })?;
                    }
                }
                Op::Exit(i) => {
                    let alive: Vec<ProcId> = self.procs.keys().copied().collect();
                    if !alive.is_empty() {
                        let proc = alive[i as usize % alive.len()];
                        self.procs.remove(&proc);
                        self.feed(Event::Exited {
                            proc,
                            exit: crash(),
                        })?;
                    }
                }
                Op::IfManagerExit => {
                    if self.ifm.take().is_some() {
                        self.feed(Event::IfManagerExited { exit: crash() })?;
                    }
                }
                Op::IfManagerReady => {
                    if self.ifm == Some(false) {
                        self.ifm = Some(true);
                        self.feed(Event::IfManagerReady)?;
                    }
                }
            }
            self.check()
        }

        /// What must hold between any two events.
        fn check(&self) -> Result<(), TestCaseError> {
            let m = &self.rig.m;
            // Never two processes owning an IF's ring.
            for if_id in 1u16..4 {
                let owners: Vec<_> = self
                    .procs
                    .iter()
                    .filter(|(_, w)| w.if_id == if_id && w.owns_ring && !w.stopping)
                    .collect();
                prop_assert!(owners.len() <= 1, "if {if_id}: two actives: {owners:?}");
            }
            // Never a lost handle: the machine tracks exactly the live ones.
            let tracked: BTreeSet<ProcId> = m.procs.keys().copied().collect();
            let alive: BTreeSet<ProcId> = self.procs.keys().copied().collect();
            prop_assert_eq!(&tracked, &alive);
            // Each in one place at most; a leaving one is told to stop or
            // is an old active draining.
            let placed: Vec<ProcId> = m.ifs.values().flat_map(IfLife::placed).collect();
            let distinct: BTreeSet<ProcId> = placed.iter().copied().collect();
            prop_assert_eq!(placed.len(), distinct.len(), "placed twice: {:?}", placed);
            for proc in m.leaving() {
                let w = &self.procs[&proc];
                prop_assert!(w.stopping || w.ready, "{proc:?} leaves unstopped: {w:?}");
            }
            for proc in &placed {
                prop_assert!(
                    !self.procs[proc].stopping || m.procs[proc].timed_out,
                    "{proc:?} stopped in place"
                );
            }
            // What the driver was told is busy is what the machine says.
            for (if_id, busy) in &self.busy {
                prop_assert_eq!(m.view(*if_id).and_then(|v| v.busy), Some(*busy));
            }
            for if_id in m.if_ids() {
                let busy = m.view(if_id).and_then(|v| v.busy);
                prop_assert_eq!(busy, self.busy.get(&if_id).copied());
            }
            Ok(())
        }

        /// Shutdown always ends: after the grace every process is killed.
        fn shut_down(&mut self) -> Result<(), TestCaseError> {
            if !self.shutting {
                self.shutting = true;
                self.feed(Event::Shutdown)?;
            }
            self.rig.now += SHUTDOWN_GRACE;
            self.feed(Event::Tick)?;
            prop_assert!(self.procs.values().all(|w| w.stopping), "{:?}", self.procs);
            let alive: Vec<ProcId> = self.procs.keys().copied().collect();
            for proc in alive {
                self.procs.remove(&proc);
                self.feed(Event::Exited {
                    proc,
                    exit: crash(),
                })?;
                self.check()?;
            }
            self.feed(Event::Tick)?;
            prop_assert!(self.rig.m.all_gone());
            Ok(())
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

        /// Random requests, readiness, crashes, if-manager deaths and
        /// action outcomes: never two actives for an IF, never a shadow
        /// started while another kp-if starts, never a process the machine
        /// forgets or signals after it is gone, busy as the driver was
        /// told; and shutdown always ends.
        #[test]
        fn random_histories_keep_the_invariants(
            ops in prop::collection::vec(op(), 1..120),
            luck in prop::collection::vec(any::<u8>(), 400),
        ) {
            let mut w = World {
                rig: Rig::new(),
                procs: BTreeMap::new(),
                busy: BTreeMap::new(),
                ifm: Some(true),
                shutting: false,
                luck: luck.into_iter(),
            };
            for op in ops {
                w.step(op)?;
            }
            w.shut_down()?;
        }
    }
}
