//! An IF's mode machine, sans IO: what its fragment thread and its control
//! thread decide about the ring it shares with a predecessor or a successor
//! ([`super::handover`] describes the protocol and the shared memory).
//!
//! An IF is in one [`Mode`] at a time: a parked shadow (`standby`), told to
//! take over (`arming`), serving (`active`), told to hand over
//! (`yielding`), finishing what it holds (`draining`), `done`. Two threads
//! move it, through the shared [`ModeCell`]:
//!
//! - the **control thread**, on the orchestrator's commands: [`on_command`]
//!   says which transition a command makes and what it answers, and
//!   [`answer_command`] carries that out on the [`ModeCell`] (a
//!   compare-and-swap, then a short wait for the fragment thread, then the
//!   reply), so the kp-if binary only does the socket I/O;
//! - the **fragment thread**, between two bursts: [`ModeMachine`] says what
//!   to do next — nap; arm (spin on the owner word, then sleep on the
//!   release futex, or park again after [`ARMING_TIMEOUT`]); take over from
//!   a free ring, a yielded owner or a dead one; forward the predecessor's
//!   fragments back during its forward window; hand over; drain; stop.
//!
//! The machine touches no DPDK, no shared memory and no clock: the driver
//! (`runtime::fragment_loop`) reads the owner word, calls
//! `IfControl::try_take`, reads the clock, and passes what it saw in; the
//! decisions come back as values. Where the order of the driver's I/O
//! matters (the monotonic clock read after the handed keys are marked
//! answered) the machine takes it as a closure and calls it at the right
//! moment. Every transition is therefore tested here, with a fake clock,
//! without hugepages or root.
//!
//! Cost: the machine sits on the data path (each poll asks it whether to
//! tick and what the mode wants) and in the arming spin (each spin asks
//! whether to keep spinning): its methods compare plain fields, allocate
//! nothing, take no lock and make no system call. It allocates once per
//! switchover, the forward window's key set, after the spin as before.
//!
//! Limits: the machine decides on the mode the driver read at the top of
//! the poll; a command that moves it meanwhile is acted on at the next
//! poll, as before. The machine does not hold the mode itself — the
//! [`ModeCell`] is shared with the control thread and read by telemetry —
//! so the driver makes the transitions the steps name (`arming` →
//! `active` or back to `standby`, `yielding` → `draining`, → `done`).

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::handover::{Handover, Mode, ModeCell, Taken};
use crate::messages::{codes, ErrorBody, IfCommand, IfStatus};
use kp_wire::RequestKey;

/// How often the fragment thread checks for expired requests and returned
/// slots, in polls, while active (and after every sleep; in every other
/// mode at every poll).
pub const TICK_EVERY: u32 = 32;

/// How long the active fragment thread dozes on its ring's doorbell at most
/// while it assembles requests: the granularity of reassembly time-outs
/// when a request's last fragment is lost.
pub const DOZE_ASSEMBLING: Duration = Duration::from_millis(1);

/// How long after a request's latest fragment the active fragment thread
/// keeps polling instead of dozing, while that request is incomplete and
/// the inference thread sleeps (the engine has nothing to run, so the core
/// they may share has nothing better to do). A request's fragments then
/// pass through as they arrive, rather than waiting in the ring for its
/// last one, which rang the thread awake to work through all of them:
/// ~0.8 µs each, 120 µs for a 147-fragment image after its last fragment
/// (docs/PERFORMANCE-JOURNAL.md, "After the last fragment"). Fragments of one
/// request arrive microseconds apart; a client that pauses longer mid-
/// request is waited for by the doze, as before.
pub const SPIN_ASSEMBLING: Duration = Duration::from_micros(200);

/// How long it dozes at most with nothing in flight: the doorbell wakes it
/// for traffic and for mode changes, so this bounds only how late it sees
/// the stop flag (and how often an idle IF wakes: 100 times a second).
pub const DOZE_IDLE: Duration = Duration::from_millis(10);

/// How long a parked shadow sleeps between looks at its mode.
pub const STANDBY_NAP: Duration = Duration::from_millis(2);

/// Polls of the owner word an arming successor spins before it sleeps on
/// the release futex (tens of microseconds).
pub const ARMING_SPINS: u32 = 2_000;

/// How long an arming successor sleeps on the release futex at a time once
/// it stopped spinning: a release wakes it at once, a dead owner wakes
/// nobody, so this bounds how late a dead owner is noticed.
pub const ARMING_SLEEP: Duration = Duration::from_millis(1);

/// How long an armed shadow spins for the ring before it parks again (the
/// active it was to succeed never yielded).
pub const ARMING_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a yielded IF keeps its hand-back ring after its successor's
/// forwarding deadline.
pub const HANDBACK_MARGIN: Duration = Duration::from_millis(50);

/// With `exit_when_idle`, how long to wait for the very first fragment (the
/// if-manager holds RX until every IF of a replay has loaded its model).
pub const NO_TRAFFIC_GRACE: Duration = Duration::from_secs(30);

/// How often a successor looks whether the predecessor that yielded to it
/// still lives, until it finished draining: a read of `/proc/PID/stat`
/// (microseconds) at a tick at most this often, so that what a predecessor
/// killed while it drains held is answered INTERNAL this late at most
/// (plus a tick).
pub const PREDECESSOR_CHECK: Duration = Duration::from_millis(10);

// ---------------------------------------------------------------------
// The control thread: commands
// ---------------------------------------------------------------------

/// What the control thread waits for before it answers `activate` or
/// `yield`, so that the reply means what the orchestrator takes it to mean.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Settle {
    /// `activate`: until the fragment thread spins for the ring (it may be
    /// in the middle of a standby nap), or left `arming`: the gap the
    /// owner's `yield` then opens is the handover alone.
    Spinning,
    /// `yield`: until the fragment thread has handed the ring over (left
    /// `yielding`), so that the reply says `draining`.
    HandedOver,
}

impl Settle {
    /// Whether the wait is over, given the mode and whether the fragment
    /// thread spins for the ring ([`ModeCell::is_spinning`]).
    pub fn settled(self, mode: Mode, spinning: bool) -> bool {
        match self {
            Settle::Spinning => mode != Mode::Arming || spinning,
            Settle::HandedOver => mode != Mode::Yielding,
        }
    }

    /// The longest wait: past it the reply says the mode as it is.
    pub fn timeout(self) -> Duration {
        match self {
            Settle::Spinning => Duration::from_secs(1),
            Settle::HandedOver => Duration::from_secs(2),
        }
    }

    /// How often to look.
    pub fn poll_every(self) -> Duration {
        match self {
            Settle::Spinning => Duration::from_micros(20),
            Settle::HandedOver => Duration::from_micros(50),
        }
    }
}

/// What the control thread does with a command (from [`on_command`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ControlAction {
    /// Answer with the IF's [`IfStatus`] now.
    Status,
    /// Move the mode from `from` to `to` — a compare-and-swap: if the
    /// fragment thread moved it meanwhile, decide again on the mode it is
    /// in — then wait for `then` and answer with the [`IfStatus`].
    Move {
        /// The mode the decision was made in.
        from: Mode,
        /// The mode the command asks for.
        to: Mode,
        /// What the reply waits for.
        then: Settle,
    },
    /// Nothing to change (asked again): wait for `then` and answer with
    /// the [`IfStatus`].
    Wait(Settle),
    /// Refuse: the reply is this error.
    Refuse(ErrorBody),
    /// Set the stop flag and answer `{"ok": true}`.
    Stop,
}

/// What `cmd` does to an IF in `mode` (the whole command protocol of
/// docs/CONTROL.md, `kp-if --listen`):
///
/// - `status`: answers the status, in any mode;
/// - `activate`: a shadow (`standby`) arms; one arming or active already
///   answers its status again (the orchestrator may retry); any other mode
///   is refused `wrong_mode`;
/// - `yield`: the active hands over; any other mode is refused
///   `wrong_mode` (a second `yield` included: the first one did it);
/// - `stop`: sets the stop flag in any mode (the fragment thread notices
///   it at its next tick).
pub fn on_command(cmd: IfCommand, mode: Mode) -> ControlAction {
    match (cmd, mode) {
        (IfCommand::Status, _) => ControlAction::Status,
        (IfCommand::Activate, Mode::Standby) => ControlAction::Move {
            from: Mode::Standby,
            to: Mode::Arming,
            then: Settle::Spinning,
        },
        (IfCommand::Activate, Mode::Arming | Mode::Active) => ControlAction::Wait(Settle::Spinning),
        (IfCommand::Activate, _) => ControlAction::Refuse(wrong_mode("activate", mode)),
        (IfCommand::Yield, Mode::Active) => ControlAction::Move {
            from: Mode::Active,
            to: Mode::Yielding,
            then: Settle::HandedOver,
        },
        (IfCommand::Yield, _) => ControlAction::Refuse(wrong_mode("yield", mode)),
        (IfCommand::Stop, _) => ControlAction::Stop,
    }
}

fn wrong_mode(what: &str, mode: Mode) -> ErrorBody {
    ErrorBody::new(
        codes::WRONG_MODE,
        format!("cannot {what}: the IF is {}", mode.name()),
    )
}

/// The control thread's driver around [`on_command`]: parses `bytes`,
/// makes the command's transition on `mode`, waits as [`Settle`] says,
/// sets `stop` for `stop`, and returns the JSON reply (an error reply for a
/// command that does not parse). `status` makes the IF's status in a given
/// mode (the caller knows the pid, the model and the control block).
///
/// A lost compare-and-swap is decided again at most once: besides this
/// thread, only the fragment thread moves an IF out of `standby` or
/// `active`, and only to `done`, where every command is answered at once.
pub fn answer_command(
    bytes: &[u8],
    mode: &ModeCell,
    stop: &AtomicBool,
    wake: impl Fn(),
    status: impl Fn(Mode) -> IfStatus,
) -> Value {
    let cmd = match IfCommand::parse(bytes) {
        Ok(cmd) => cmd,
        Err(e) => return e.reply(),
    };
    loop {
        let then = match on_command(cmd, mode.get()) {
            ControlAction::Status => return status(mode.get()).reply(),
            ControlAction::Refuse(e) => return e.reply(),
            ControlAction::Stop => {
                stop.store(true, Ordering::Relaxed);
                wake();
                return json!({ "ok": true });
            }
            ControlAction::Wait(then) => then,
            ControlAction::Move { from, to, then } => {
                if !mode.transition(from, to) {
                    continue; // moved meanwhile: decide on the new mode
                }
                wake(); // a dozing fragment thread looks at its mode now
                then
            }
        };
        let deadline = Instant::now() + then.timeout();
        while !then.settled(mode.get(), mode.is_spinning()) && Instant::now() < deadline {
            std::thread::sleep(then.poll_every());
        }
        return status(mode.get()).reply();
    }
}

// ---------------------------------------------------------------------
// The fragment thread: the mode machine
// ---------------------------------------------------------------------

/// What the machine needs to know of its IF, fixed at start.
#[derive(Clone, Copy, Debug)]
pub struct MachineConfig {
    /// This process's pid: the owner word's value while it owns the ring.
    pub me: u32,
    /// Exit once no fragment arrived for this long and nothing is held,
    /// while active ([`NO_TRAFFIC_GRACE`] at least before the first
    /// fragment).
    pub exit_when_idle: Option<Duration>,
    /// How long a successor forwards fragments back after a switchover.
    pub grace: Duration,
}

/// The requests an IF holds (from its reassembler).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Held {
    /// Requests being assembled.
    pub in_flight: usize,
    /// Complete requests handed to inference and not yet answered.
    pub handed: usize,
}

impl Held {
    /// Nothing held: every request it saw is answered.
    pub fn is_empty(self) -> bool {
        self.in_flight == 0 && self.handed == 0
    }
}

/// What the driver saw at a tick (after it released returned slots and
/// answered expired requests).
#[derive(Clone, Copy, Debug, Default)]
pub struct TickView {
    /// The stop flag (a signal, or the `stop` command).
    pub stop: bool,
    /// Fragments taken from the ring so far (forwarded ones and shed
    /// notices not counted).
    pub fragments: u64,
    /// What it holds.
    pub held: Held,
}

/// Why the fragment thread stops.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// The stop flag was set.
    Stopped,
    /// `exit_when_idle`: nothing arrived for that long and nothing is held.
    Idle,
    /// Someone else owns the ring while we were active.
    LostRing,
    /// Yielded, and done: the successor's forward window is over and every
    /// request held is answered.
    Drained,
    /// Told to yield a ring it did not own: nothing to finish.
    NotOwner,
    /// The mode was already `done`.
    Done,
}

/// Go on, or stop (the loop ends; what is still being assembled is
/// answered INTERNAL and the ring released).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flow {
    /// Go on with this poll.
    Go,
    /// Stop now.
    Stop(StopReason),
}

/// What the mode asks for before the next dequeue ([`ModeMachine::step`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Parked: sleep [`STANDBY_NAP`], then look again (no dequeue).
    Nap,
    /// Arming: look at the owner ([`ModeMachine::watch_owner`]), say it
    /// spins, try to take the ring; not taken: [`ModeMachine::not_taken`];
    /// taken: [`ModeMachine::took`], become active and dequeue at once.
    Arm,
    /// Active: dequeue if the owner word still names us
    /// ([`ModeMachine::owner_seen`]).
    Serve,
    /// Yielding: release the ring with the handover
    /// ([`handover_keys`]), then [`ModeMachine::handed_over`], mode
    /// `draining`.
    HandOver,
    /// Dequeue (draining: from the hand-back ring).
    Poll,
    /// Stop.
    Stop(StopReason),
}

/// What an arming IF does when the ring was not free to take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArmWait {
    /// Spin (a core of our own: the release is seen within a microsecond).
    Spin,
    /// Sleep on the release futex, at most [`ARMING_SLEEP`]: on a shared
    /// core a spinner is scheduled last, a woken sleeper first.
    Sleep,
    /// The owner did not yield within [`ARMING_TIMEOUT`]: go back to
    /// `standby` (mode `arming` → `standby`).
    ParkAgain,
}

/// How the ring came to us ([`ModeMachine::took`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TookOver {
    /// It was free: nothing to take over.
    Free,
    /// Handed over: its keys are marked answered, its in-flight ones
    /// forwarded back during the forward window.
    Handed,
    /// Its owner (this pid) died holding it: answer INTERNAL every request
    /// its ledger holds, mark them answered
    /// ([`ModeMachine::count_recovered`]).
    FromDead(u32),
}

/// The fragment thread's view of the ring's succession, and what it did
/// (the `succession` object of the IF's final report).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SuccessionStats {
    /// How it came to own the ring: "free", "handed", "from_dead".
    pub taken: Option<&'static str>,
    /// From the predecessor's release to our first dequeue.
    pub gap_ns: Option<u64>,
    /// Requests the predecessor was assembling when it yielded.
    pub handed_in_flight: usize,
    /// Requests the predecessor had answered recently.
    pub handed_answered: usize,
    /// Fragments of the predecessor's requests sent back to it.
    pub forwarded: u64,
    /// ... that its hand-back ring had no room for.
    pub forward_lost: u64,
    /// Requests of a dead predecessor answered INTERNAL (one that died
    /// owning the ring, or one that died while it drained after yielding
    /// it to us).
    pub recovered: u64,
    /// Requests a dead predecessor had answered before all their
    /// fragments came (its ledger's early answers), taken as answered.
    pub early_answers: u64,
    /// The predecessor that yielded to us died before it had answered
    /// everything it held.
    pub predecessor_died: bool,
    /// Taken from a dead owner: the requests that the handover it had
    /// received named as in flight (adopted: answered already, or
    /// forwarded to the process that yielded while its window is open).
    pub inherited_in_flight: usize,
    /// Taken from a dead owner: the requests that its handover named as
    /// answered.
    pub inherited_answered: usize,
    /// We yielded the ring to a successor.
    pub yielded: bool,
    /// We found someone else owning the ring while active, and stopped.
    pub lost_ownership: bool,
}

/// What the driver found of the predecessor that yielded to it
/// ([`ModeMachine::predecessor_due`], [`ModeMachine::predecessor_is`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Predecessor {
    /// It lives: look again later.
    Alive,
    /// It said it answered everything it held (`IfControl::drained`): it
    /// exits, or did; nothing more to watch.
    Drained,
    /// It is gone without saying so: killed while it drained.
    Dead,
}

impl Predecessor {
    /// What `pid` is, from whether it was `alive` (read first) and which
    /// pid the zone's `DRAINED` word named (read second): one that says it
    /// drained and then exits is seen drained whichever way the two reads
    /// fall; gone without having said so, it was killed.
    pub fn of(pid: u32, alive: bool, drained: u32) -> Predecessor {
        if drained == pid {
            Predecessor::Drained
        } else if alive {
            Predecessor::Alive
        } else {
            Predecessor::Dead
        }
    }
}

/// A predecessor found dead while it drained: answer INTERNAL what its
/// ledger still holds, and free what waits in its hand-back ring (nobody
/// will dequeue it), if it was looked up.
#[derive(Debug, PartialEq, Eq)]
pub struct Recover<H> {
    /// The dead predecessor.
    pub pid: u32,
    /// Its hand-back ring, if the forward window still had it.
    pub handback: Option<H>,
}

/// A predecessor's in-flight requests, whose fragments go back to it until
/// `until_ns` (the window closes at the first tick past it). `H` is its
/// hand-back ring, looked up by the driver.
#[derive(Debug)]
pub struct Forward<H> {
    /// The predecessor.
    pub from_pid: u32,
    /// Its hand-back ring: looked up while arming, or by the driver at the
    /// first fragment to forward if it was not found then.
    pub ring: Option<H>,
    keys: HashSet<RequestKey>,
    until_ns: u64,
}

impl<H> Forward<H> {
    /// When the window closes (the driver's clock).
    pub fn until_ns(&self) -> u64 {
        self.until_ns
    }
}

/// The fragment thread's mode machine (see the module doc): it holds the
/// succession's state between polls — arming since when and how many
/// spins, the owner's hand-back ring looked up while arming, the forward
/// window, the drain deadline, the switchover to time — and says what each
/// poll does. `H` is a hand-back ring (`dpdk::Ring`; anything in tests).
///
/// One poll of the driver:
/// 1. [`poll_is_tick`](Self::poll_is_tick): if so, read the clock, do the
///    reassembler's housekeeping, then [`tick`](Self::tick);
/// 2. [`step`](Self::step) for what the mode wants (and the follow-ups
///    each [`Step`] names);
/// 3. [`switchover_gap`](Self::switchover_gap) right before the dequeue;
/// 4. [`dequeued`](Self::dequeued); per fragment,
///    [`forward_to`](Self::forward_to).
#[derive(Debug)]
pub struct ModeMachine<H> {
    cfg: MachineConfig,
    polls: u32,
    last_fragment_ns: u64,
    arming_since: Option<u64>,
    arming_spins: u32,
    /// The current owner's hand-back ring, looked up while arming: a
    /// memzone lookup takes DPDK's shared memory lock, which another
    /// process can hold for seconds (a heap growing syncs every process's
    /// memory map), so it must not happen on the data path once we serve.
    owner_handback: Option<(u32, Option<H>)>,
    forward: Option<Forward<H>>,
    /// The predecessor that yielded to us, while it may still hold
    /// requests, and when to look at it next.
    predecessor: Option<(u32, u64)>,
    drain_until: Option<u64>,
    first_dequeue_pending: Option<u64>,
    stats: SuccessionStats,
}

impl<H> ModeMachine<H> {
    /// A machine started at `now_ns` (the driver's clock: counts as the
    /// last fragment for `exit_when_idle`).
    pub fn new(cfg: MachineConfig, now_ns: u64) -> Self {
        ModeMachine {
            cfg,
            polls: 0,
            last_fragment_ns: now_ns,
            arming_since: None,
            arming_spins: 0,
            owner_handback: None,
            forward: None,
            predecessor: None,
            drain_until: None,
            first_dequeue_pending: None,
            stats: SuccessionStats::default(),
        }
    }

    /// The forward grace to hand over with (ns).
    pub fn grace_ns(&self) -> u64 {
        self.cfg.grace.as_nanos() as u64
    }

    /// Counts a poll; whether it is a tick (read the clock, release
    /// returned slots, expire requests, [`tick`](Self::tick)): every
    /// [`TICK_EVERY`] polls while active, at every poll after a sleep and
    /// in every other mode.
    #[inline]
    pub fn poll_is_tick(&mut self, mode: Mode, backoff_sleeping: bool) -> bool {
        self.polls = self.polls.wrapping_add(1);
        self.polls.is_multiple_of(TICK_EVERY) || backoff_sleeping || mode != Mode::Active
    }

    /// A tick at `now`: closes the forward window past its deadline (the
    /// predecessor is done with those requests), stops on the stop flag,
    /// and, active with `exit_when_idle`, once it was quiet that long and
    /// holds nothing.
    pub fn tick(&mut self, mode: Mode, now: u64, seen: TickView) -> Flow {
        if self.forward.as_ref().is_some_and(|f| now >= f.until_ns) {
            self.forward = None;
        }
        if seen.stop {
            return Flow::Stop(StopReason::Stopped);
        }
        if let (Some(idle), Mode::Active) = (self.cfg.exit_when_idle, mode) {
            // Before the first fragment the if-manager may still be
            // waiting for other IFs to load their models: be patient.
            let idle = if seen.fragments == 0 {
                idle.max(NO_TRAFFIC_GRACE)
            } else {
                idle
            };
            let quiet = now.saturating_sub(self.last_fragment_ns) >= idle.as_nanos() as u64;
            if quiet && seen.held.is_empty() {
                return Flow::Stop(StopReason::Idle);
            }
        }
        Flow::Go
    }

    /// What `mode` asks for at `now` (the last tick's clock), holding
    /// `held`: a draining IF stops once the successor's forward window (and
    /// a margin) is over and every request it held is answered.
    #[inline]
    pub fn step(&mut self, mode: Mode, now: u64, held: Held) -> Step {
        match mode {
            Mode::Standby => Step::Nap,
            Mode::Arming => Step::Arm,
            Mode::Active => Step::Serve,
            Mode::Yielding => Step::HandOver,
            Mode::Draining => {
                if self.drain_until.is_some_and(|t| now >= t) && held.is_empty() {
                    Step::Stop(StopReason::Drained)
                } else {
                    Step::Poll
                }
            }
            Mode::Done => Step::Stop(StopReason::Done),
        }
    }

    /// Active, the owner word says `owner`: go on if it is us; otherwise
    /// the ring was taken from us, and we stop.
    #[inline]
    pub fn owner_seen(&mut self, owner: u32) -> Flow {
        if owner == self.cfg.me {
            return Flow::Go;
        }
        tracing::warn!("kp-if: the ring was taken from us; stopping");
        self.stats.lost_ownership = true;
        Flow::Stop(StopReason::LostRing)
    }

    /// Arming, the owner word says `owner`: a live owner that is not us
    /// and not the one looked at last gets its hand-back ring looked up now
    /// (`look_up(pid)`), while we do not serve yet.
    #[inline]
    pub fn watch_owner(&mut self, owner: u32, look_up: impl FnOnce(u32) -> Option<H>) {
        if owner != 0
            && owner != self.cfg.me
            && self
                .owner_handback
                .as_ref()
                .is_none_or(|(pid, _)| *pid != owner)
        {
            self.owner_handback = Some((owner, look_up(owner)));
        }
    }

    /// Arming, the ring was not free to take at `now`: spin a little, then
    /// sleep on the release futex; park again once [`ARMING_TIMEOUT`] has
    /// passed since the first try.
    #[inline]
    pub fn not_taken(&mut self, now: u64) -> ArmWait {
        let since = *self.arming_since.get_or_insert(now);
        if now.saturating_sub(since) > ARMING_TIMEOUT.as_nanos() as u64 {
            tracing::warn!(
                "kp-if: the ring's owner did not yield within {ARMING_TIMEOUT:?}; parked again"
            );
            self.arming_since = None;
            self.arming_spins = 0;
            return ArmWait::ParkAgain;
        }
        self.arming_spins = self.arming_spins.saturating_add(1);
        if self.arming_spins < ARMING_SPINS {
            ArmWait::Spin
        } else {
            ArmWait::Sleep
        }
    }

    /// Arming, the ring is ours at `now` (the driver's clock), `taken` as
    /// `IfControl::try_take` said. A handover: every handed key is marked
    /// answered (`mark_answered`: its stragglers are late, not new
    /// requests), the first dequeue is timed from the release, and the
    /// in-flight ones are forwarded back until the predecessor's release
    /// plus its grace — read on `monotonic_ns`, the clock the release was
    /// stamped with, after the keys are marked, as the window is measured
    /// from now on; the predecessor is watched until it drained. From a
    /// dead owner that had itself received a handover (`earlier`): its keys
    /// are marked answered too, and while its window is open, its in-flight
    /// ones are forwarded to the process that yielded and that process is
    /// watched, as the dead owner did.
    pub fn took(
        &mut self,
        taken: Taken,
        now: u64,
        mark_answered: impl FnMut(&RequestKey),
        monotonic_ns: impl FnOnce() -> u64,
    ) -> TookOver {
        self.arming_since = None;
        self.arming_spins = 0;
        match taken {
            Taken::Free => {
                self.stats.taken = Some("free");
                TookOver::Free
            }
            Taken::Handed(h) => {
                self.stats.taken = Some("handed");
                self.stats.handed_in_flight = h.in_flight.len();
                self.stats.handed_answered = h.answered.len();
                self.first_dequeue_pending = Some(h.released_ns);
                // It drains what it holds from now on: watched until it
                // says it is done, so that a kill meanwhile loses nothing.
                self.watch(h.from_pid, now);
                mark_handed(&h, mark_answered);
                if !h.in_flight.is_empty() {
                    let left = window_left(&h, monotonic_ns());
                    let ring = match self.owner_handback.take() {
                        Some((pid, ring)) if pid == h.from_pid => ring,
                        _ => None, // looked up at the first fragment
                    };
                    self.forward_back(h, ring, now.saturating_add(left));
                }
                TookOver::Handed
            }
            Taken::FromDead { pid, earlier } => {
                self.stats.taken = Some("from_dead");
                if let Some(h) = earlier {
                    // The handover the dead one had received: its keys are
                    // not new requests to us either, and while its window
                    // is open the process that made it may still drain
                    // (and assemble): forward to it and watch it as the
                    // dead one did.
                    self.stats.inherited_in_flight = h.in_flight.len();
                    self.stats.inherited_answered = h.answered.len();
                    mark_handed(&h, mark_answered);
                    let left = window_left(&h, monotonic_ns());
                    if left > 0 {
                        self.watch(h.from_pid, now);
                        // Its ring is looked up at the first fragment.
                        self.forward_back(h, None, now.saturating_add(left));
                    }
                }
                TookOver::FromDead(pid)
            }
        }
    }

    /// Sends the fragments of `h`'s in-flight requests back to the process
    /// that yielded (through `ring`, if looked up) until `until_ns`;
    /// nothing if none was in flight.
    fn forward_back(&mut self, h: Handover, ring: Option<H>, until_ns: u64) {
        if h.in_flight.is_empty() {
            return;
        }
        self.forward = Some(Forward {
            from_pid: h.from_pid,
            ring,
            keys: h.in_flight.into_iter().collect(),
            until_ns,
        });
    }

    /// Watches `pid`, which yielded the ring, from `now` on.
    fn watch(&mut self, pid: u32, now: u64) {
        self.predecessor = Some((pid, now.saturating_add(PREDECESSOR_CHECK.as_nanos() as u64)));
    }

    /// After [`TookOver::FromDead`] or a [`Recover`]: `n` requests of a
    /// dead predecessor were answered INTERNAL, and `early` it had answered
    /// early were taken as answered.
    pub fn count_recovered(&mut self, n: u64, early: u64) {
        self.stats.recovered += n;
        self.stats.early_answers += early;
    }

    /// At a tick at `now`: the pid of the predecessor that yielded to us,
    /// when it is time to look whether it still lives (every
    /// [`PREDECESSOR_CHECK`] until it drained or died); then
    /// [`predecessor_is`](Self::predecessor_is).
    #[inline]
    pub fn predecessor_due(&mut self, now: u64) -> Option<u32> {
        let (pid, next) = self.predecessor.as_mut()?;
        if now < *next {
            return None;
        }
        *next = now.saturating_add(PREDECESSOR_CHECK.as_nanos() as u64);
        Some(*pid)
    }

    /// What the driver found of predecessor `pid`: drained, it is watched
    /// no more; dead, it is watched no more either, nothing more goes back
    /// to it, and the driver recovers what it held ([`Recover`]; then
    /// [`count_recovered`](Self::count_recovered)).
    pub fn predecessor_is(&mut self, pid: u32, found: Predecessor) -> Option<Recover<H>> {
        if self.predecessor.is_none_or(|(p, _)| p != pid) || found == Predecessor::Alive {
            return None;
        }
        self.predecessor = None;
        if found == Predecessor::Drained {
            return None;
        }
        tracing::warn!("kp-if: predecessor {pid} died while it drained");
        self.stats.predecessor_died = true;
        // Its in-flight keys stay marked answered: their stragglers are
        // late, as after the window.
        let handback = if self.forward.as_ref().is_some_and(|f| f.from_pid == pid) {
            self.forward.take().and_then(|f| f.ring)
        } else {
            None
        };
        Some(Recover { pid, handback })
    }

    /// Right before a dequeue: after a handover, the first one is the end
    /// of the switchover. Returns `(gap, taken)` once: the gap from the
    /// predecessor's release to `monotonic_ns()`, and that time.
    #[inline]
    pub fn switchover_gap(&mut self, monotonic_ns: impl FnOnce() -> u64) -> Option<(u64, u64)> {
        let released_ns = self.first_dequeue_pending.take()?;
        let taken_ns = monotonic_ns();
        let gap = taken_ns.saturating_sub(released_ns);
        self.stats.gap_ns = Some(gap);
        Some((gap, taken_ns))
    }

    /// A dequeue at `now` (the last tick's clock) got `got` mbufs.
    #[inline]
    pub fn dequeued(&mut self, got: usize, now: u64) {
        if got > 0 {
            self.last_fragment_ns = now;
        }
    }

    /// Where a fragment (or shed notice) of `key` goes back to, if it is
    /// one the predecessor is assembling and the forward window is open.
    #[inline]
    pub fn forward_to(&mut self, key: &RequestKey) -> Option<&mut Forward<H>> {
        self.forward.as_mut().filter(|f| f.keys.contains(key))
    }

    /// A fragment [`forward_to`](Self::forward_to) named went back
    /// (`sent`) or was lost (no hand-back ring, or it was full).
    #[inline]
    pub fn count_forward(&mut self, sent: bool) {
        if sent {
            self.stats.forwarded += 1;
        } else {
            self.stats.forward_lost += 1;
        }
    }

    /// Yielding, at `now`: the ring was released with the handover
    /// (`released`), or it was not ours to release. Either way we forward
    /// nothing any more (our successor, if any, has our keys). Released:
    /// drain — fragments come on our hand-back ring until the successor's
    /// forward window and a margin are over; not released: stop.
    pub fn handed_over(&mut self, released: bool, now: u64) -> Flow {
        self.forward = None;
        if !released {
            return Flow::Stop(StopReason::NotOwner);
        }
        self.stats.yielded = true;
        // A margin past the successor's forwarding deadline: it must be
        // done with our hand-back ring before we go.
        self.drain_until = Some(
            now.saturating_add(self.grace_ns())
                .saturating_add(HANDBACK_MARGIN.as_nanos() as u64),
        );
        Flow::Go
    }

    /// What it did so far.
    pub fn stats(&self) -> &SuccessionStats {
        &self.stats
    }

    /// What it did, at the end.
    pub fn into_stats(self) -> SuccessionStats {
        self.stats
    }
}

/// Marks every key of a handover answered: its stragglers are late, not
/// new requests.
fn mark_handed(h: &Handover, mut mark_answered: impl FnMut(&RequestKey)) {
    for key in h.in_flight.iter().chain(&h.answered) {
        mark_answered(key);
    }
}

/// How long a handover's forward window has left at `monotonic_now` (the
/// clock its release was stamped with; 0: closed).
fn window_left(h: &Handover, monotonic_now: u64) -> u64 {
    h.released_ns
        .saturating_add(h.grace_ns)
        .saturating_sub(monotonic_now)
}

/// The keys a yielding IF hands over: those it is assembling, and those it
/// answered recently that are not among them (`answered` from the
/// answered table; a request can be in both after a duplicate).
pub fn handover_keys(
    in_flight: Vec<RequestKey>,
    answered: Vec<RequestKey>,
) -> (Vec<RequestKey>, Vec<RequestKey>) {
    let answered = {
        let mine: HashSet<_> = in_flight.iter().collect();
        answered.into_iter().filter(|k| !mine.contains(k)).collect()
    };
    (in_flight, answered)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::handover::Handover;
    use kp_wire::IfId;

    const ME: u32 = 100;
    const OLD: u32 = 200;
    const MS: u64 = 1_000_000;
    const S: u64 = 1_000 * MS;
    const ALL_MODES: [Mode; 6] = [
        Mode::Standby,
        Mode::Arming,
        Mode::Active,
        Mode::Yielding,
        Mode::Draining,
        Mode::Done,
    ];

    fn key(id: u64) -> RequestKey {
        RequestKey {
            src_ip: [10, 0, 0, 1].into(),
            src_port: 4000,
            if_id: IfId(1),
            request_id: id,
        }
    }

    /// A hand-back ring in tests: the pid it belongs to.
    type FakeRing = u32;

    fn machine() -> ModeMachine<FakeRing> {
        machine_with(None)
    }

    fn machine_with(exit_when_idle: Option<Duration>) -> ModeMachine<FakeRing> {
        ModeMachine::new(
            MachineConfig {
                me: ME,
                exit_when_idle,
                grace: Duration::from_millis(200),
            },
            0,
        )
    }

    fn handed(in_flight: &[u64], answered: &[u64], released_ns: u64) -> Taken {
        Taken::Handed(Handover {
            from_pid: OLD,
            released_ns,
            grace_ns: 200 * MS,
            in_flight: in_flight.iter().copied().map(key).collect(),
            answered: answered.iter().copied().map(key).collect(),
        })
    }

    fn no_clock() -> u64 {
        panic!("the monotonic clock was read")
    }

    fn idle_view() -> TickView {
        TickView {
            stop: false,
            fragments: 1,
            held: Held::default(),
        }
    }

    // ----- commands ------------------------------------------------

    #[test]
    fn status_and_stop_are_answered_in_every_mode() {
        for mode in ALL_MODES {
            assert_eq!(
                on_command(IfCommand::Status, mode),
                ControlAction::Status,
                "{mode:?}"
            );
            assert_eq!(
                on_command(IfCommand::Stop, mode),
                ControlAction::Stop,
                "{mode:?}"
            );
        }
    }

    #[test]
    fn activate_arms_a_shadow_and_waits_until_it_spins() {
        assert_eq!(
            on_command(IfCommand::Activate, Mode::Standby),
            ControlAction::Move {
                from: Mode::Standby,
                to: Mode::Arming,
                then: Settle::Spinning
            }
        );
    }

    #[test]
    fn activate_while_arming_or_active_changes_nothing_and_answers_the_status() {
        for mode in [Mode::Arming, Mode::Active] {
            assert_eq!(
                on_command(IfCommand::Activate, mode),
                ControlAction::Wait(Settle::Spinning),
                "{mode:?}"
            );
        }
        // Active: the wait is over at once.
        assert!(Settle::Spinning.settled(Mode::Active, false));
    }

    #[test]
    fn activate_after_the_ring_was_given_up_is_refused() {
        for mode in [Mode::Yielding, Mode::Draining, Mode::Done] {
            let ControlAction::Refuse(e) = on_command(IfCommand::Activate, mode) else {
                panic!("{mode:?}: not refused");
            };
            assert_eq!(e.code, codes::WRONG_MODE);
            assert_eq!(
                e.message,
                format!("cannot activate: the IF is {}", mode.name())
            );
        }
    }

    #[test]
    fn yield_hands_over_from_active_and_waits_until_it_did() {
        assert_eq!(
            on_command(IfCommand::Yield, Mode::Active),
            ControlAction::Move {
                from: Mode::Active,
                to: Mode::Yielding,
                then: Settle::HandedOver
            }
        );
    }

    #[test]
    fn yield_in_any_other_mode_is_refused() {
        for mode in ALL_MODES.into_iter().filter(|m| *m != Mode::Active) {
            let ControlAction::Refuse(e) = on_command(IfCommand::Yield, mode) else {
                panic!("{mode:?}: not refused");
            };
            assert_eq!(
                e.reply(),
                json!({"ok": false, "error": {
                    "code": "wrong_mode",
                    "message": format!("cannot yield: the IF is {}", mode.name()),
                }})
            );
        }
    }

    #[test]
    fn the_waits_end_when_the_fragment_thread_got_there() {
        let s = Settle::Spinning;
        assert!(!s.settled(Mode::Arming, false));
        assert!(s.settled(Mode::Arming, true));
        // Took the ring already, or parked again: answer what it is.
        assert!(s.settled(Mode::Active, false));
        assert!(s.settled(Mode::Standby, false));
        let h = Settle::HandedOver;
        assert!(!h.settled(Mode::Yielding, false));
        assert!(h.settled(Mode::Draining, false));
        assert!(h.settled(Mode::Done, false));
        assert!(Settle::Spinning.timeout() < Settle::HandedOver.timeout());
    }

    fn status(mode: Mode) -> IfStatus {
        IfStatus {
            pid: ME,
            if_id: 1,
            model: "m".into(),
            mode: mode.name().into(),
            owner: 0,
            switchovers: 0,
            last_gap_ns: 0,
        }
    }

    #[test]
    fn answer_command_arms_and_replies_once_the_fragment_thread_spins() {
        let cell = ModeCell::new(Mode::Standby);
        let stop = AtomicBool::new(false);
        let reply = std::thread::scope(|s| {
            // The fragment thread: sees `arming` after a nap, spins.
            s.spawn(|| {
                while cell.get() != Mode::Arming {
                    std::thread::sleep(Duration::from_millis(1));
                }
                std::thread::sleep(Duration::from_millis(5));
                cell.mark_spinning();
            });
            answer_command(br#"{"cmd":"activate"}"#, &cell, &stop, || {}, status)
        });
        assert!(cell.is_spinning(), "replied before the spin");
        assert_eq!(reply, status(Mode::Arming).reply());
        assert!(!stop.load(Ordering::Relaxed));
    }

    #[test]
    fn answer_command_yields_and_replies_draining() {
        let cell = ModeCell::new(Mode::Active);
        let stop = AtomicBool::new(false);
        let wakes = std::cell::Cell::new(0);
        let wake = || wakes.set(wakes.get() + 1);
        let reply = std::thread::scope(|s| {
            s.spawn(|| {
                while cell.get() != Mode::Yielding {
                    std::thread::sleep(Duration::from_millis(1));
                }
                std::thread::sleep(Duration::from_millis(5));
                cell.set(Mode::Draining);
            });
            answer_command(br#"{"cmd":"yield"}"#, &cell, &stop, wake, status)
        });
        assert_eq!(wakes.get(), 1, "the doorbell rang once the mode moved");
        assert_eq!(reply["ok"], true);
        assert_eq!(reply["mode"], "draining");
        // A second yield: refused, nothing changes.
        let again = answer_command(br#"{"cmd":"yield"}"#, &cell, &stop, wake, status);
        assert_eq!(wakes.get(), 1, "a refusal moves nothing, wakes nobody");
        assert_eq!(again["error"]["code"], "wrong_mode");
        assert_eq!(
            again["error"]["message"],
            "cannot yield: the IF is draining"
        );
        assert_eq!(cell.get(), Mode::Draining);
    }

    #[test]
    fn answer_command_stops_refuses_and_reports_bad_commands() {
        let cell = ModeCell::new(Mode::Standby);
        let stop = AtomicBool::new(false);
        let wakes = std::cell::Cell::new(0);
        let wake = || wakes.set(wakes.get() + 1);
        let r = answer_command(br#"{"cmd":"yield"}"#, &cell, &stop, wake, status);
        assert_eq!(r["error"]["message"], "cannot yield: the IF is standby");
        assert_eq!(cell.get(), Mode::Standby);
        let r = answer_command(br#"{"cmd":"status"}"#, &cell, &stop, wake, status);
        assert_eq!(r, status(Mode::Standby).reply());
        let r = answer_command(br#"{"cmd":"jump"}"#, &cell, &stop, wake, status);
        assert_eq!(r["error"]["code"], codes::UNKNOWN_COMMAND);
        assert!(!stop.load(Ordering::Relaxed));
        let r = answer_command(br#"{"cmd":"stop"}"#, &cell, &stop, wake, status);
        assert_eq!(r, json!({"ok": true}));
        assert!(stop.load(Ordering::Relaxed));
        assert_eq!(
            wakes.get(),
            1,
            "only the stop rang, so a dozing thread sees it"
        );
        assert_eq!(cell.get(), Mode::Standby, "stop is the fragment thread's");
    }

    // ----- the fragment thread -------------------------------------

    #[test]
    fn it_ticks_every_poll_unless_active_and_awake() {
        let mut m = machine();
        for mode in ALL_MODES.into_iter().filter(|m| *m != Mode::Active) {
            assert!(m.poll_is_tick(mode, false), "{mode:?}");
        }
        let mut m = machine();
        let ticks = (0..TICK_EVERY * 4)
            .filter(|_| m.poll_is_tick(Mode::Active, false))
            .count();
        assert_eq!(ticks, 4);
        assert!(m.poll_is_tick(Mode::Active, true), "after a sleep");
    }

    #[test]
    fn each_mode_asks_for_its_step() {
        let mut m = machine();
        let held = Held::default();
        assert_eq!(m.step(Mode::Standby, 0, held), Step::Nap);
        assert_eq!(m.step(Mode::Arming, 0, held), Step::Arm);
        assert_eq!(m.step(Mode::Active, 0, held), Step::Serve);
        assert_eq!(m.step(Mode::Yielding, 0, held), Step::HandOver);
        assert_eq!(m.step(Mode::Done, 0, held), Step::Stop(StopReason::Done));
    }

    #[test]
    fn arming_takes_a_free_ring() {
        let mut m = machine();
        m.watch_owner(0, |_| panic!("nobody to look up"));
        let took = m.took(Taken::Free, 5, |_| panic!("no keys"), no_clock);
        assert_eq!(took, TookOver::Free);
        assert_eq!(m.stats().taken, Some("free"));
        assert_eq!(m.switchover_gap(no_clock), None, "no switchover to time");
        assert!(m.forward_to(&key(1)).is_none());
        assert_eq!(m.owner_seen(ME), Flow::Go);
    }

    #[test]
    fn arming_spins_then_sleeps_on_the_futex() {
        let mut m = machine();
        for i in 1..ARMING_SPINS {
            assert_eq!(m.not_taken(u64::from(i)), ArmWait::Spin, "spin {i}");
        }
        for i in 0..10 {
            assert_eq!(m.not_taken(MS + i), ArmWait::Sleep);
        }
    }

    #[test]
    fn arming_parks_again_when_the_owner_never_yields() {
        let mut m = machine();
        let start = 7 * S;
        let timeout = ARMING_TIMEOUT.as_nanos() as u64;
        assert_eq!(m.not_taken(start), ArmWait::Spin);
        assert_ne!(m.not_taken(start + timeout), ArmWait::ParkAgain, "not yet");
        assert_eq!(m.not_taken(start + timeout + 1), ArmWait::ParkAgain);
        // Activated again later: a fresh timeout, spinning first.
        let again = start + 60 * S;
        assert_eq!(m.not_taken(again), ArmWait::Spin);
        assert_eq!(m.not_taken(again + timeout), ArmWait::Spin);
        assert_eq!(m.not_taken(again + timeout + 1), ArmWait::ParkAgain);
    }

    #[test]
    fn arming_looks_up_each_new_owners_hand_back_ring_once() {
        let mut m = machine();
        let mut looked = Vec::new();
        for owner in [0, ME, OLD, OLD, OLD, 300, 300, OLD] {
            m.watch_owner(owner, |pid| {
                looked.push(pid);
                Some(pid)
            });
        }
        assert_eq!(looked, [OLD, 300, OLD]);
    }

    #[test]
    fn a_dead_owner_is_recovered_from() {
        let mut m = machine();
        m.watch_owner(OLD, Some);
        assert_eq!(m.not_taken(0), ArmWait::Spin);
        let took = m.took(
            Taken::FromDead {
                pid: OLD,
                earlier: None,
            },
            S,
            |_| panic!("no keys"),
            no_clock,
        );
        assert_eq!(took, TookOver::FromDead(OLD));
        m.count_recovered(3, 5);
        assert_eq!(m.stats().taken, Some("from_dead"));
        assert_eq!((m.stats().recovered, m.stats().early_answers), (3, 5));
        assert!(m.forward_to(&key(1)).is_none(), "nothing to forward");
        assert_eq!(m.switchover_gap(no_clock), None);
    }

    #[test]
    fn a_ring_taken_free_or_from_the_dead_has_no_predecessor_to_watch() {
        for taken in [
            Taken::Free,
            Taken::FromDead {
                pid: OLD,
                earlier: None,
            },
        ] {
            let mut m = machine();
            m.took(taken, S, |_| panic!("no keys"), no_clock);
            assert_eq!(m.predecessor_due(100 * S), None);
            assert_eq!(m.predecessor_is(OLD, Predecessor::Dead), None);
            assert!(!m.stats().predecessor_died);
        }
    }

    /// The handover `handed` makes, as the zone still holds it.
    fn earlier(in_flight: &[u64], answered: &[u64], released_ns: u64) -> Option<Handover> {
        match handed(in_flight, answered, released_ns) {
            Taken::Handed(h) => Some(h),
            _ => unreachable!(),
        }
    }

    /// A machine that took the ring at `now` from 300, dead, to which OLD
    /// had yielded at S with key 1 in flight and key 2 answered; and the
    /// keys it marked answered.
    fn taken_from_dead_successor(now: u64) -> (ModeMachine<FakeRing>, TookOver, Vec<RequestKey>) {
        let mut m = machine();
        let mut marked = Vec::new();
        let took = m.took(
            Taken::FromDead {
                pid: 300,
                earlier: earlier(&[1], &[2], S),
            },
            now,
            |k| marked.push(*k),
            || now,
        );
        (m, took, marked)
    }

    #[test]
    fn a_ring_taken_from_a_dead_successor_adopts_the_handover_it_had_received() {
        // 300 died 50 ms after OLD yielded to it, in OLD's window.
        let now = S + 50 * MS;
        let (mut m, took, marked) = taken_from_dead_successor(now);
        assert_eq!(took, TookOver::FromDead(300));
        assert_eq!(marked, [key(1), key(2)], "its keys are not new requests");
        let f = m.forward_to(&key(1)).expect("OLD still assembles key 1");
        assert_eq!(
            (f.from_pid, f.ring, f.until_ns()),
            (OLD, None, now + 150 * MS)
        );
        assert!(m.forward_to(&key(2)).is_none(), "answered, not forwarded");
        let due = now + PREDECESSOR_CHECK.as_nanos() as u64;
        assert_eq!(m.predecessor_due(due), Some(OLD), "OLD may still drain");
        assert_eq!(m.switchover_gap(no_clock), None, "no switchover to time");
        let s = m.stats();
        assert_eq!(s.taken, Some("from_dead"));
        assert_eq!((s.inherited_in_flight, s.inherited_answered), (1, 1));
        assert_eq!((s.handed_in_flight, s.handed_answered), (0, 0));
    }

    #[test]
    fn an_earlier_handover_past_its_window_only_marks_its_keys() {
        let (mut m, _, marked) = taken_from_dead_successor(S + 300 * MS);
        assert_eq!(marked, [key(1), key(2)]);
        assert!(m.forward_to(&key(1)).is_none(), "its window closed");
        assert_eq!(m.predecessor_due(100 * S), None, "nothing to watch");
    }

    #[test]
    fn a_predecessor_is_dead_only_if_gone_without_saying_it_drained() {
        use Predecessor::{Alive, Dead, Drained};
        // (alive, drained word) -> what it is; the pid is 7.
        for ((alive, drained), want) in [
            ((true, 0), Alive),
            ((true, 8), Alive),
            ((true, 7), Drained), // said so, not gone yet
            ((false, 7), Drained),
            ((false, 0), Dead),
            ((false, 8), Dead), // another one drained
        ] {
            assert_eq!(
                Predecessor::of(7, alive, drained),
                want,
                "{alive} {drained}"
            );
        }
    }

    #[test]
    fn a_yielded_predecessor_is_watched_until_it_says_it_drained() {
        let mut m = machine();
        m.took(handed(&[1], &[], S), S, |_| {}, || S);
        let every = PREDECESSOR_CHECK.as_nanos() as u64;
        assert_eq!(m.predecessor_due(S), None, "not before a check is due");
        assert_eq!(m.predecessor_due(S + every), Some(OLD));
        assert_eq!(m.predecessor_due(S + every + 1), None, "once per period");
        assert_eq!(m.predecessor_is(OLD, Predecessor::Alive), None);
        assert_eq!(m.predecessor_due(S + 2 * every), Some(OLD));
        // Another pid's news changes nothing.
        assert_eq!(m.predecessor_is(300, Predecessor::Dead), None);
        assert_eq!(m.predecessor_due(S + 3 * every), Some(OLD));
        assert_eq!(m.predecessor_is(OLD, Predecessor::Drained), None);
        assert_eq!(m.predecessor_due(100 * S), None, "watched no more");
        assert!(m.forward_to(&key(1)).is_some(), "the window is its own");
        assert!(!m.stats().predecessor_died);
        assert_eq!(m.stats().recovered, 0);
    }

    #[test]
    fn a_predecessor_killed_while_it_drains_is_recovered_from_once() {
        let mut m = machine();
        m.watch_owner(OLD, Some);
        m.took(handed(&[1, 2], &[3], S), S, |_| {}, || S);
        assert!(m.forward_to(&key(1)).is_some());
        let due = S + PREDECESSOR_CHECK.as_nanos() as u64;
        assert_eq!(m.predecessor_due(due), Some(OLD));
        // Its hand-back ring comes back to be emptied; nothing more is sent
        // back to it, and its keys stay answered (stragglers are late).
        assert_eq!(
            m.predecessor_is(OLD, Predecessor::Dead),
            Some(Recover {
                pid: OLD,
                handback: Some(OLD)
            })
        );
        assert!(m.forward_to(&key(1)).is_none());
        m.count_recovered(2, 0);
        assert_eq!(m.predecessor_due(100 * S), None);
        assert_eq!(m.predecessor_is(OLD, Predecessor::Dead), None, "once");
        let s = m.stats();
        assert!(s.predecessor_died);
        assert_eq!((s.taken, s.recovered), (Some("handed"), 2));
    }

    #[test]
    fn a_predecessor_killed_after_its_forward_window_gives_no_ring_back() {
        let mut m = machine();
        m.watch_owner(OLD, Some);
        m.took(handed(&[1], &[], S), S, |_| {}, || S);
        let late = S + 10 * S;
        assert_eq!(m.tick(Mode::Active, late, idle_view()), Flow::Go);
        assert!(m.forward_to(&key(1)).is_none(), "the window closed");
        assert_eq!(m.predecessor_due(late), Some(OLD));
        assert_eq!(
            m.predecessor_is(OLD, Predecessor::Dead),
            Some(Recover {
                pid: OLD,
                handback: None
            })
        );
    }

    #[test]
    fn a_handover_marks_its_keys_answered_and_times_the_first_dequeue() {
        let mut m = machine();
        let mut marked = Vec::new();
        let took = m.took(
            handed(&[], &[7, 8], 1_000),
            S,
            |k| marked.push(*k),
            no_clock,
        );
        assert_eq!(took, TookOver::Handed);
        assert_eq!(marked, [key(7), key(8)]);
        assert!(m.forward_to(&key(7)).is_none(), "nothing in flight");
        assert_eq!(m.switchover_gap(|| 1_500), Some((500, 1_500)));
        assert_eq!(m.switchover_gap(no_clock), None, "once");
        let s = m.stats();
        assert_eq!(s.taken, Some("handed"));
        assert_eq!(s.gap_ns, Some(500));
        assert_eq!((s.handed_in_flight, s.handed_answered), (0, 2));
    }

    #[test]
    fn fragments_of_handed_keys_go_back_during_the_forward_window_only() {
        let mut m = machine();
        m.watch_owner(OLD, Some);
        let released = 10 * S; // the monotonic clock
        let marked = std::cell::RefCell::new(Vec::new());
        let mut clock_read_after_marking = false;
        let now = 3 * S; // the driver's clock
        m.took(
            handed(&[1, 2], &[3], released),
            now,
            |k| marked.borrow_mut().push(*k),
            || {
                clock_read_after_marking = marked.borrow().len() == 3;
                released + 50 * MS
            },
        );
        assert!(clock_read_after_marking);
        assert_eq!(*marked.borrow(), [key(1), key(2), key(3)]);
        // 200 ms of grace from the release, 50 ms of which had passed.
        let until = now + 150 * MS;
        let f = m.forward_to(&key(1)).expect("in flight at the predecessor");
        assert_eq!((f.from_pid, f.ring, f.until_ns()), (OLD, Some(OLD), until));
        assert!(m.forward_to(&key(2)).is_some());
        assert!(m.forward_to(&key(3)).is_none(), "answered: not forwarded");
        assert!(m.forward_to(&key(4)).is_none(), "a new request: ours");
        m.count_forward(true);
        m.count_forward(false);
        assert_eq!((m.stats().forwarded, m.stats().forward_lost), (1, 1));

        assert_eq!(m.tick(Mode::Active, until - 1, idle_view()), Flow::Go);
        assert!(m.forward_to(&key(1)).is_some(), "window still open");
        assert_eq!(m.tick(Mode::Active, until, idle_view()), Flow::Go);
        assert!(m.forward_to(&key(1)).is_none(), "window closed");
    }

    #[test]
    fn a_hand_back_ring_of_another_owner_is_not_used() {
        let mut m = machine();
        m.watch_owner(300, Some); // the owner changed after we looked
        m.took(handed(&[1], &[], 0), 0, |_| {}, || 0);
        let f = m.forward_to(&key(1)).unwrap();
        assert_eq!(f.ring, None, "looked up at the first fragment");
        // A handover whose deadline passed already: the window is empty.
        let mut m = machine();
        m.took(handed(&[1], &[], 0), 9, |_| {}, || 10 * S);
        assert_eq!(m.forward_to(&key(1)).unwrap().until_ns(), 9);
        m.tick(Mode::Active, 9, idle_view());
        assert!(m.forward_to(&key(1)).is_none());
    }

    #[test]
    fn the_active_stops_when_the_ring_was_taken_from_it() {
        let mut m = machine();
        assert_eq!(m.owner_seen(ME), Flow::Go);
        assert!(!m.stats().lost_ownership);
        assert_eq!(m.owner_seen(OLD), Flow::Stop(StopReason::LostRing));
        assert!(m.stats().lost_ownership);
    }

    #[test]
    fn a_yield_with_requests_in_flight_drains_until_they_are_answered() {
        let mut m = machine();
        let now = S;
        assert_eq!(m.handed_over(true, now), Flow::Go);
        assert!(m.stats().yielded);
        let drain_until = now + 200 * MS + HANDBACK_MARGIN.as_nanos() as u64;
        let busy = Held {
            in_flight: 2,
            handed: 1,
        };
        let nothing = Held::default();
        // Before the deadline: drain, held or not (fragments may come back).
        assert_eq!(m.step(Mode::Draining, now, busy), Step::Poll);
        assert_eq!(m.step(Mode::Draining, drain_until - 1, nothing), Step::Poll);
        // After it: until everything is answered.
        assert_eq!(m.step(Mode::Draining, drain_until, busy), Step::Poll);
        let handed_only = Held {
            in_flight: 0,
            handed: 1,
        };
        assert_eq!(m.step(Mode::Draining, drain_until, handed_only), Step::Poll);
        assert_eq!(
            m.step(Mode::Draining, drain_until, nothing),
            Step::Stop(StopReason::Drained)
        );
    }

    #[test]
    fn a_yield_of_a_ring_not_ours_stops_at_once() {
        let mut m = machine();
        assert_eq!(m.handed_over(false, S), Flow::Stop(StopReason::NotOwner));
        assert!(!m.stats().yielded);
    }

    #[test]
    fn a_successor_that_yields_forwards_nothing_more() {
        let mut m = machine();
        m.took(handed(&[1], &[], 0), 0, |_| {}, || 0);
        assert!(m.forward_to(&key(1)).is_some());
        m.handed_over(true, MS);
        assert!(m.forward_to(&key(1)).is_none());
    }

    #[test]
    fn exit_when_idle_only_when_quiet_active_and_nothing_held() {
        let idle = Duration::from_secs(2);
        let mut m = machine_with(Some(idle));
        let t = idle.as_nanos() as u64;
        m.dequeued(1, 10 * S);
        let seen = |held| TickView {
            stop: false,
            fragments: 5,
            held,
        };
        let busy = Held {
            in_flight: 1,
            handed: 0,
        };
        assert_eq!(
            m.tick(Mode::Active, 10 * S + t - 1, seen(Held::default())),
            Flow::Go
        );
        assert_eq!(m.tick(Mode::Active, 10 * S + t, seen(busy)), Flow::Go);
        let handed = Held {
            in_flight: 0,
            handed: 1,
        };
        assert_eq!(m.tick(Mode::Active, 10 * S + t, seen(handed)), Flow::Go);
        for mode in [Mode::Standby, Mode::Arming, Mode::Draining] {
            assert_eq!(
                m.tick(mode, 100 * S, seen(Held::default())),
                Flow::Go,
                "{mode:?}"
            );
        }
        assert_eq!(
            m.tick(Mode::Active, 10 * S + t, seen(Held::default())),
            Flow::Stop(StopReason::Idle)
        );
        // An empty dequeue is not a fragment.
        m.dequeued(0, 11 * S);
        assert_eq!(
            m.tick(Mode::Active, 10 * S + t, seen(Held::default())),
            Flow::Stop(StopReason::Idle)
        );
        // Without the option: never.
        let mut m = machine();
        assert_eq!(
            m.tick(Mode::Active, 1_000 * S, seen(Held::default())),
            Flow::Go
        );
    }

    #[test]
    fn before_the_first_fragment_exit_when_idle_waits_the_no_traffic_grace() {
        let mut m = machine_with(Some(Duration::from_secs(1)));
        let none_yet = TickView {
            fragments: 0,
            ..idle_view()
        };
        let grace = NO_TRAFFIC_GRACE.as_nanos() as u64;
        assert_eq!(m.tick(Mode::Active, 2 * S, none_yet), Flow::Go);
        assert_eq!(m.tick(Mode::Active, grace - 1, none_yet), Flow::Go);
        assert_eq!(
            m.tick(Mode::Active, grace, none_yet),
            Flow::Stop(StopReason::Idle)
        );
    }

    #[test]
    fn stop_stops_in_every_mode_and_still_closes_the_window() {
        for mode in ALL_MODES {
            let mut m = machine();
            m.took(handed(&[1], &[], 0), 0, |_| {}, || 0);
            let seen = TickView {
                stop: true,
                ..idle_view()
            };
            assert_eq!(
                m.tick(mode, 200 * MS, seen),
                Flow::Stop(StopReason::Stopped),
                "{mode:?}"
            );
            assert!(m.forward_to(&key(1)).is_none());
        }
    }

    #[test]
    fn handover_keys_do_not_repeat_in_flight_ones_as_answered() {
        let (in_flight, answered) =
            handover_keys(vec![key(1), key(2)], vec![key(2), key(3), key(4)]);
        assert_eq!(in_flight, [key(1), key(2)]);
        assert_eq!(answered, [key(3), key(4)]);
    }

    /// The owner word and handover area of a ring's control block, as
    /// `IfControl` keeps them, without shared memory.
    #[derive(Default)]
    struct FakeControl {
        owner: u32,
        left: Option<Handover>,
    }

    impl FakeControl {
        fn try_take(&mut self, me: u32) -> Option<Taken> {
            if self.owner != 0 {
                return None;
            }
            self.owner = me;
            Some(self.left.take().map_or(Taken::Free, Taken::Handed))
        }

        fn release_with_handover(&mut self, me: u32, h: Handover) -> bool {
            if self.owner != me {
                return false;
            }
            self.left = Some(h);
            self.owner = 0;
            true
        }
    }

    /// Carries out the control thread's decision on a plain mode.
    fn command(cmd: IfCommand, mode: &mut Mode) -> bool {
        match on_command(cmd, *mode) {
            ControlAction::Move { from, to, .. } => {
                assert_eq!(from, *mode);
                *mode = to;
                true
            }
            ControlAction::Refuse(_) => false,
            other => panic!("{other:?}"),
        }
    }

    /// One arming poll of the driver, on a virtual clock.
    fn arm(m: &mut ModeMachine<FakeRing>, mode: &mut Mode, ctl: &mut FakeControl, now: u64) {
        assert_eq!(m.step(*mode, now, Held::default()), Step::Arm);
        m.watch_owner(ctl.owner, Some);
        match ctl.try_take(ME) {
            None => {
                if m.not_taken(now) == ArmWait::ParkAgain {
                    *mode = Mode::Standby;
                }
            }
            Some(taken) => {
                assert_eq!(m.took(taken, now, |_| {}, || now), TookOver::Handed);
                *mode = Mode::Active;
            }
        }
    }

    /// A whole switchover between two machines sharing a fake control
    /// block, on a virtual clock: the first activation times out (the
    /// owner is never told to yield) and the shadow parks again; the
    /// second one succeeds while the old active holds a request in flight,
    /// whose fragments go back to it within the window; the old one drains
    /// and stops once it answered that request.
    #[test]
    fn a_switchover_between_two_machines() {
        let mut ctl = FakeControl {
            owner: OLD,
            left: None,
        };
        let mut old: ModeMachine<FakeRing> = ModeMachine::new(
            MachineConfig {
                me: OLD,
                exit_when_idle: None,
                grace: Duration::from_millis(200),
            },
            0,
        );
        let mut new = machine();
        let (mut old_mode, mut new_mode) = (Mode::Active, Mode::Standby);
        let mut t = S;

        assert!(!command(IfCommand::Yield, &mut new_mode), "not active");
        assert!(command(IfCommand::Activate, &mut new_mode));
        while new_mode == Mode::Arming {
            arm(&mut new, &mut new_mode, &mut ctl, t);
            t += MS;
        }
        assert_eq!(new_mode, Mode::Standby, "parked again");
        assert!(t > S + ARMING_TIMEOUT.as_nanos() as u64);
        assert_eq!(ctl.owner, OLD, "nothing taken");

        assert!(command(IfCommand::Activate, &mut new_mode));
        arm(&mut new, &mut new_mode, &mut ctl, t);
        assert_eq!(new_mode, Mode::Arming, "spinning");
        assert_eq!(old.step(old_mode, t, Held::default()), Step::Serve);
        assert_eq!(old.owner_seen(ctl.owner), Flow::Go);
        assert!(command(IfCommand::Yield, &mut old_mode));
        assert_eq!(old.step(old_mode, t, Held::default()), Step::HandOver);
        let (in_flight, answered) = handover_keys(vec![key(1)], vec![key(9)]);
        let h = Handover {
            from_pid: OLD,
            released_ns: t,
            grace_ns: old.grace_ns(),
            in_flight,
            answered,
        };
        let released = ctl.release_with_handover(OLD, h);
        assert_eq!(old.handed_over(released, t), Flow::Go);
        old_mode = Mode::Draining;
        assert!(!command(IfCommand::Yield, &mut old_mode), "yielded already");

        arm(&mut new, &mut new_mode, &mut ctl, t + 30_000);
        assert_eq!((new_mode, ctl.owner), (Mode::Active, ME));
        assert_eq!(
            new.switchover_gap(|| t + 70_000),
            Some((70_000, t + 70_000))
        );
        assert_eq!(new.owner_seen(ctl.owner), Flow::Go);
        assert!(!command(IfCommand::Activate, &mut old_mode), "gave it up");

        // Within the window key 1 goes back to the old one, which drains.
        assert_eq!(new.forward_to(&key(1)).expect("forwarded").ring, Some(OLD));
        assert!(new.forward_to(&key(9)).is_none(), "answered");
        let holding = Held {
            in_flight: 1,
            handed: 0,
        };
        t += 100 * MS;
        assert_eq!(old.step(old_mode, t, holding), Step::Poll);
        t += 120 * MS; // past the release and the grace, within the margin
        assert_eq!(new.tick(new_mode, t, idle_view()), Flow::Go);
        assert!(new.forward_to(&key(1)).is_none(), "window over");
        assert_eq!(old.step(old_mode, t, Held::default()), Step::Poll, "margin");
        t += 30 * MS;
        assert_eq!(old.step(old_mode, t, holding), Step::Poll, "holds it");
        assert_eq!(
            old.step(old_mode, t, Held::default()),
            Step::Stop(StopReason::Drained)
        );
        // The old one, were it still looking, would see the ring is gone.
        assert_eq!(old.owner_seen(ctl.owner), Flow::Stop(StopReason::LostRing));
        assert!(old.stats().yielded);
        assert_eq!(new.into_stats().gap_ns, Some(70_000));
    }
}
