//! Shadow standby and switchover: which process dequeues an IF's ring, and
//! how requests cross from the old one to the new one.
//!
//! # Ownership
//!
//! An IF's ring has one consumer at a time (it is a single-consumer ring).
//! Several processes may be attached to it — the active IF and its shadow,
//! same model, already loaded, parked — and they agree on which one
//! dequeues through [`IfControl`], a memzone the if-manager creates with the
//! ring: its `owner` word holds the pid of the process allowed to dequeue
//! (0: nobody). A process takes the ring by compare-and-swap, from 0 or from
//! a pid that is no longer alive, and checks the word before every dequeue.
//!
//! # Switchover (the old active `A` yields to the shadow `S`)
//!
//! 1. `S` is *armed*: it polls `owner` for a few tens of microseconds,
//!    then sleeps on the zone's *releases* counter, a process-shared futex
//!    (`kp_os::futex`) that every release bumps and wakes, with a 1 ms
//!    timeout (an owner that dies wakes nobody). On a core of its own a
//!    poll sees the release at once; on a core shared with `A` a spinner
//!    would be scheduled last, a woken sleeper is scheduled first.
//! 2. `A`'s fragment thread stops dequeuing between two bursts, writes into
//!    the zone the keys of the requests it is assembling (*in flight*) and
//!    of those it answered within its answered-table time-to-live, the time
//!    (`CLOCK_MONOTONIC`) and a grace period, then releases `owner` (a
//!    store-release of 0), wakes `S` and yields its CPU. Its complete
//!    requests stay queued for its own inference thread, which finishes
//!    them.
//! 3. `S` takes `owner` (acquire), reads the keys, notes the time: the gap
//!    is from `A`'s release to `S`'s first dequeue (docs/PERFORMANCE-JOURNAL.md:
//!    p50 71 µs on two shared cores under load).
//! 4. For the grace period, `S` forwards every fragment of a request `A`
//!    has in flight, as is, onto `A`'s *hand-back ring*; `A` keeps
//!    assembling from it, infers, answers. `S` treats the handed keys as
//!    answered, so their stragglers after the grace period are `Late`, not
//!    new requests.
//! 5. After the grace period (longer than the reassembly timeout, so every
//!    request `A` holds has completed or expired), `S` stops forwarding;
//!    `A` exits once it answered everything it held, and says so first
//!    ([`IfControl::mark_drained`]).
//!
//! **Guarantee:** every request of which a fragment arrived gets exactly one
//! answer across a switchover — from `A` if `A` saw a fragment of it before
//! it yielded, from `S` otherwise. Requests answered by `A` before the
//! switchover are not answered again by `S`, within the answered
//! time-to-live (and up to [`MAX_HANDOVER_KEYS`] of them).
//!
//! # Crash (the active dies)
//!
//! Each IF keeps a [`Ledger`] in its own memzone: one cache line per pool
//! slot with the addressing of the request in it, written when the request
//! takes the slot and cleared once its answer is on the TX ring; and the
//! keys of the latest [`EARLY_ANSWERS`] requests it answered before all
//! their fragments came (refused at the first, timed out), written once the
//! answer is on the TX ring. When a process takes a ring from a dead owner,
//! it reads the dead one's ledger and answers every request still in it
//! INTERNAL, and treats their keys as answered, and those answered early
//! too (the rest of a refused request is late, not a new request that it
//! would refuse again). The answer is enqueued *before* the entry is cleared, so a
//! crash can cause at worst a duplicate answer, never a silent loss —
//! except for fragments the dead process had dequeued but not yet looked
//! at (at most one burst), whose request, if it had no other fragment, is
//! lost with them. The entry is cleared *before* the TX doorbell wakes the
//! if-manager ([`super::AnswerBurst::send_then`]): between the enqueue and
//! the clear there are a few stores and no system call, so a kill lands
//! there only if it interrupts the thread in those nanoseconds. (Cleared
//! after the wake, as it once was, the window was as long as the woken
//! if-manager kept the IF's thread off a core they shared: a test that
//! kills an active under load saw one duplicate answer in about ten runs.)
//!
//! # Crash of a yielded owner (`A` dies while it drains)
//!
//! `S` took the ring from a live `A`, so it read no ledger on taking it;
//! but `A` still holds what it was assembling and what waited for its
//! engine. So `S` watches `A` from the handover until `A` says it drained
//! (the zone's `DRAINED` word names it): at a tick every
//! [`PREDECESSOR_CHECK`](super::succession::PREDECESSOR_CHECK) it reads
//! whether `A` lives, then the word. Found gone without having said so,
//! `A` was killed: `S` answers INTERNAL what `A`'s ledger holds, marks
//! those keys answered, stops forwarding to `A` and frees what waits in
//! `A`'s hand-back ring. An `A` that exits cleanly freed its ledger after
//! saying it drained, so `S` never looks up a zone that is gone (a lookup
//! takes DPDK's shared-memory lock: it happens only after a kill). Not
//! covered: `S` itself stopping (yielding on and draining out) before a
//! slow `A` is done — nobody watches `A` then.
//!
//! # Crash of the successor (`S` dies while `A` drains)
//!
//! Whoever takes the ring from a dead `S` (`T`) answers `S`'s ledger, and
//! also learns of the handover `S` had received: the zone keeps its words
//! (`LAST_FROM` names `A`; a take clears only `FROM`) and nobody but an
//! owner writes them. `T` marks its keys answered (their stragglers are
//! late, not new requests that `A` would answer too), and while `A`'s
//! window is open forwards its in-flight requests' fragments to `A` and
//! watches `A`, as `S` did.

use std::sync::atomic::{AtomicU64, Ordering};

use dpdk::{DpdkError, Memzone, MemzoneFlags, SocketId};

use crate::names;
use kp_wire::{FrameAddr, IfId, MacAddr, RequestKey};

use super::ReplyTo;

/// Most request keys a yielding IF hands over (in flight first, then the
/// most recently answered).
pub const MAX_HANDOVER_KEYS: usize = 8192;

const MAGIC: u64 = 0x4b50_4354_4c5f_0001; // "KPCTL_" v1

/// Word indices in the control zone.
mod w {
    pub const MAGIC: usize = 0;
    pub const OWNER: usize = 1;
    pub const FROM: usize = 2;
    pub const RELEASED_NS: usize = 3;
    pub const N_INFLIGHT: usize = 4;
    pub const N_ANSWERED: usize = 5;
    pub const GRACE_NS: usize = 6;
    pub const TAKEN_NS: usize = 7;
    pub const SWITCHOVERS: usize = 8;
    pub const LAST_GAP_NS: usize = 9;
    /// Counts releases of the ring; a futex a successor sleeps on.
    pub const RELEASES: usize = 10;
    /// The doorbell: counts the producer's rings; the futex the owner
    /// dozes on.
    pub const DOORBELL: usize = 11;
    /// How many threads doze (or are about to) on `DOORBELL`, normally the
    /// owner alone, briefly two across a switchover: a ring with nobody
    /// dozing makes no system call.
    pub const DOZING: usize = 12;
    /// When the batch the IF is running may end at the earliest
    /// (machine-wide monotonic ns), 0 when none runs: the if-manager stops
    /// dozing shortly before, to be polling when the answers come.
    pub const ANSWER_OPEN_NS: usize = 13;
    /// ... and at the latest: the if-manager polls until then.
    pub const ANSWER_CLOSE_NS: usize = 14;
    /// The pid of the latest yielded owner that answered everything it
    /// held (its ledger is empty, it exits): its successor stops watching
    /// it.
    pub const DRAINED: usize = 15;
    /// The pid of the latest owner that yielded the ring with a handover;
    /// unlike `FROM`, a take leaves it, so that whoever takes the ring
    /// from a dead successor learns of the handover that successor had
    /// received (with `RELEASED_NS`, `GRACE_NS` and the keys).
    pub const LAST_FROM: usize = 16;
    pub const KEYS: usize = 24;
}

/// Size of the control zone.
pub const CONTROL_BYTES: usize = (w::KEYS + 2 * MAX_HANDOVER_KEYS) * 8;

/// How the producer wakes the owner of a ring that dozes instead of
/// polling: two words of the control zone, a count that is a futex and a
/// flag that says someone sleeps on it.
///
/// The if-manager rings it when it enqueues a fragment that is the first or
/// the last of its request by index, when it sheds, and when the ring is
/// filling; the IF's control thread when it changes the IF's mode. A
/// fragment thread woken by a clock, on a core it shares with inference,
/// pays a context switch (tens of µs on a VM) per wake-up, most of them for
/// fragments that complete nothing; woken by the doorbell it wakes about
/// twice per request (docs/PERFORMANCE-JOURNAL.md, "The fragment thread's CPU per
/// fragment"). Inside an IF the same doorbell, over two words of its own,
/// wakes the inference thread when the fragment thread completes requests.
#[derive(Clone, Copy, Debug)]
pub struct Doorbell<'a> {
    count: &'a AtomicU64,
    dozing: &'a AtomicU64,
}

impl<'a> Doorbell<'a> {
    /// A doorbell over two words of shared memory.
    pub fn new(count: &'a AtomicU64, dozing: &'a AtomicU64) -> Self {
        Doorbell { count, dozing }
    }

    /// Rings: a doze in progress (or about to start after `seen`) returns.
    /// One add and a fence when nobody dozes; a futex wake when someone does.
    #[inline]
    pub fn ring(&self) {
        self.count.fetch_add(1, Ordering::Release);
        // Pairs with the fence in `doze` (Dekker's pattern): either the
        // dozer's futex wait sees the new count and does not sleep, or this
        // sees it dozing and wakes it.
        std::sync::atomic::fence(Ordering::SeqCst);
        if self.is_dozing() {
            kp_os::futex::wake_all(self.count);
        }
    }

    /// Whether someone dozes on it now (a hint: it may start or stop a
    /// moment later).
    #[inline]
    pub fn is_dozing(&self) -> bool {
        self.dozing.load(Ordering::Relaxed) != 0
    }

    /// The count now: read it before looking at the ring, and pass it to
    /// [`Doorbell::doze`] once the ring was found empty.
    #[inline]
    pub fn seen(&self) -> u64 {
        self.count.load(Ordering::Acquire)
    }

    /// Sleeps until the doorbell rings after `seen` or `timeout` passes;
    /// returns at once if it rang already (the futex compares the count
    /// with `seen` atomically with going to sleep).
    pub fn doze(&self, seen: u64, timeout: std::time::Duration) {
        // A count, not a flag: a predecessor that stops dozing must not
        // clear the mark of a successor that just began.
        self.dozing.fetch_add(1, Ordering::Relaxed);
        std::sync::atomic::fence(Ordering::SeqCst);
        kp_os::futex::wait(self.count, seen as u32, timeout);
        self.dozing.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The TX ring's doorbell, in a memzone of its own ([`names::TX_BELL`]):
/// the IFs ring it when they put answers on the TX ring, and the
/// if-manager, where its idle back-off would sleep by the clock (up to
/// `libml::backoff::MAX_SLEEP`), dozes on it for that long instead. An
/// answer then leaves as soon as it is enqueued rather than when the
/// if-manager's sleep ends: after a batch of several milliseconds the
/// if-manager is nearly always asleep, and an answer waited a quarter of a
/// millisecond on average for it (docs/PERFORMANCE-JOURNAL.md). Received packets
/// still wait for the end of the doze: a poll-mode port has no doorbell.
#[derive(Debug)]
pub struct TxBell {
    zone: Memzone,
}

/// Size of the TX bell's zone: its two words, a cache line.
const TX_BELL_BYTES: usize = 64;

/// A new memzone of `bytes`, cache-line aligned, every word 0.
fn reserve_zeroed(name: &str, bytes: usize, socket: SocketId) -> Result<Memzone, DpdkError> {
    let zone = Memzone::reserve(name, bytes, socket, MemzoneFlags::NONE, 64)?;
    for word in zone.as_atomic_u64s() {
        word.store(0, Ordering::Relaxed);
    }
    Ok(zone)
}

impl TxBell {
    /// Creates the bell (the if-manager, with the TX ring; freed with this
    /// handle).
    pub fn create(socket: SocketId) -> Result<TxBell, DpdkError> {
        Ok(TxBell {
            zone: reserve_zeroed(names::TX_BELL, TX_BELL_BYTES, socket)?,
        })
    }

    /// Finds the if-manager's bell.
    pub fn lookup() -> Result<TxBell, DpdkError> {
        let zone = Memzone::lookup(names::TX_BELL)?;
        if zone.len() < TX_BELL_BYTES {
            return Err(DpdkError::NotFound {
                op: "TxBell::lookup (too small)",
                name: names::TX_BELL.into(),
            });
        }
        Ok(TxBell { zone })
    }

    /// The doorbell over the zone's first two words.
    #[inline]
    pub fn doorbell(&self) -> Doorbell<'_> {
        let words = self.zone.as_atomic_u64s();
        Doorbell::new(&words[0], &words[1])
    }
}

/// What a yielding IF left for its successor.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Handover {
    /// The pid that yielded.
    pub from_pid: u32,
    /// When it released the ring (`CLOCK_MONOTONIC` ns).
    pub released_ns: u64,
    /// How long to forward fragments of `in_flight` requests to it.
    pub grace_ns: u64,
    /// Requests it was assembling: their fragments go back to it.
    pub in_flight: Vec<RequestKey>,
    /// Requests it answered recently: not to be answered again.
    pub answered: Vec<RequestKey>,
}

/// How a process came to own a ring.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Taken {
    /// It was free and nobody handed anything over (first start, or the
    /// previous owner exited cleanly).
    Free,
    /// The previous owner yielded it with this handover.
    Handed(Handover),
    /// The previous owner (`pid`) died holding it. `earlier` is the latest
    /// handover of the ring, when another process than the dead one and
    /// us made it: the one the dead owner itself may have received, whose
    /// yielded process may still be draining.
    FromDead {
        /// The dead owner.
        pid: u32,
        /// The latest handover, as the zone still holds it.
        earlier: Option<Handover>,
    },
}

/// The shared control block of one IF's ring (see the module doc).
#[derive(Debug)]
pub struct IfControl {
    zone: Memzone,
    /// When this handle last looked whether the owner was alive.
    last_alive_check_ns: AtomicU64,
}

impl IfControl {
    /// Creates `if_id`'s control zone, nobody owning the ring (the
    /// if-manager does this when it creates the ring; the zone is freed
    /// with this handle).
    pub fn create(if_id: IfId, socket: SocketId) -> Result<IfControl, DpdkError> {
        let zone = Memzone::reserve(
            &names::if_control(if_id),
            CONTROL_BYTES,
            socket,
            MemzoneFlags::NONE,
            64,
        )?;
        let words = zone.as_atomic_u64s();
        for word in &words[1..] {
            word.store(0, Ordering::Relaxed);
        }
        words[w::MAGIC].store(MAGIC, Ordering::Release);
        Ok(IfControl {
            zone,
            last_alive_check_ns: AtomicU64::new(0),
        })
    }

    /// Finds `if_id`'s control zone.
    pub fn lookup(if_id: IfId) -> Result<IfControl, DpdkError> {
        let zone = Memzone::lookup(&names::if_control(if_id))?;
        let c = IfControl {
            zone,
            last_alive_check_ns: AtomicU64::new(0),
        };
        if c.word(w::MAGIC).load(Ordering::Acquire) != MAGIC || c.zone.len() < CONTROL_BYTES {
            return Err(DpdkError::NotFound {
                op: "IfControl::lookup (not initialised)",
                name: names::if_control(if_id),
            });
        }
        Ok(c)
    }

    fn word(&self, i: usize) -> &AtomicU64 {
        &self.zone.as_atomic_u64s()[i]
    }

    /// The pid allowed to dequeue (0: nobody).
    #[inline]
    pub fn owner(&self) -> u32 {
        self.word(w::OWNER).load(Ordering::Acquire) as u32
    }

    /// Takes the ring for `me` if it is free or its owner is dead; `None`
    /// (nothing changed) while a live process owns it.
    pub fn try_take(&self, me: u32) -> Option<Taken> {
        let owner = self.word(w::OWNER);
        let cur = owner.load(Ordering::Acquire);
        if cur == u64::from(me) {
            return Some(Taken::Free);
        }
        if cur != 0 && !self.owner_dead(cur as u32) {
            return None;
        }
        owner
            .compare_exchange(cur, u64::from(me), Ordering::AcqRel, Ordering::Acquire)
            .ok()?;
        if cur != 0 {
            // A handover's words are written only by an owner, and the dead
            // one cannot write any more: they are the latest handover's.
            let last = self.word(w::LAST_FROM).load(Ordering::Acquire) as u32;
            let earlier =
                (last != 0 && last != cur as u32 && last != me).then(|| self.handover_from(last));
            return Some(Taken::FromDead {
                pid: cur as u32,
                earlier,
            });
        }
        let from = self.word(w::FROM).swap(0, Ordering::AcqRel) as u32;
        if from == 0 || from == me {
            return Some(Taken::Free);
        }
        Some(Taken::Handed(self.handover_from(from)))
    }

    /// The handover `from` left in the zone (read after taking the ring).
    fn handover_from(&self, from: u32) -> Handover {
        let n_in =
            (self.word(w::N_INFLIGHT).load(Ordering::Relaxed) as usize).min(MAX_HANDOVER_KEYS);
        let n_ans = (self.word(w::N_ANSWERED).load(Ordering::Relaxed) as usize)
            .min(MAX_HANDOVER_KEYS - n_in);
        let key = |i: usize| decode_key(self.word(w::KEYS + 2 * i), self.word(w::KEYS + 2 * i + 1));
        Handover {
            from_pid: from,
            released_ns: self.word(w::RELEASED_NS).load(Ordering::Relaxed),
            grace_ns: self.word(w::GRACE_NS).load(Ordering::Relaxed),
            in_flight: (0..n_in).map(key).collect(),
            answered: (n_in..n_in + n_ans).map(key).collect(),
        }
    }

    /// Whether `pid` died. Reading /proc costs microseconds, so a spinning
    /// taker asks at most once a millisecond; in between a live owner is
    /// assumed.
    fn owner_dead(&self, pid: u32) -> bool {
        let now = kp_os::affinity::monotonic_ns();
        let last = self.last_alive_check_ns.load(Ordering::Relaxed);
        if now.saturating_sub(last) < 1_000_000 {
            return false;
        }
        self.last_alive_check_ns.store(now, Ordering::Relaxed);
        !kp_os::affinity::process_alive(pid)
    }

    /// Hands the ring over: writes `in_flight` and `answered` (the first
    /// [`MAX_HANDOVER_KEYS`] in all), then releases it. Only its owner may;
    /// false if `me` does not own it.
    pub fn release_with_handover(
        &self,
        me: u32,
        in_flight: &[RequestKey],
        answered: &[RequestKey],
        grace_ns: u64,
        now_ns: u64,
    ) -> bool {
        if self.word(w::OWNER).load(Ordering::Acquire) != u64::from(me) {
            return false;
        }
        let n_in = in_flight.len().min(MAX_HANDOVER_KEYS);
        let n_ans = answered.len().min(MAX_HANDOVER_KEYS - n_in);
        for (i, k) in in_flight[..n_in]
            .iter()
            .chain(&answered[..n_ans])
            .enumerate()
        {
            let (a, b) = encode_key(k);
            self.word(w::KEYS + 2 * i).store(a, Ordering::Relaxed);
            self.word(w::KEYS + 2 * i + 1).store(b, Ordering::Relaxed);
        }
        self.word(w::N_INFLIGHT)
            .store(n_in as u64, Ordering::Relaxed);
        self.word(w::N_ANSWERED)
            .store(n_ans as u64, Ordering::Relaxed);
        self.word(w::GRACE_NS).store(grace_ns, Ordering::Relaxed);
        self.word(w::RELEASED_NS).store(now_ns, Ordering::Relaxed);
        self.word(w::FROM).store(u64::from(me), Ordering::Relaxed);
        self.word(w::LAST_FROM)
            .store(u64::from(me), Ordering::Relaxed);
        // Everything above is visible to whoever acquires `owner` next.
        self.word(w::OWNER).store(0, Ordering::Release);
        self.wake_successor();
        true
    }

    /// Wakes a successor sleeping in [`IfControl::wait_for_release`].
    fn wake_successor(&self) {
        let releases = self.word(w::RELEASES);
        releases.fetch_add(1, Ordering::AcqRel);
        kp_os::futex::wake_all(releases);
    }

    /// A value to pass to [`IfControl::wait_for_release`]: read it before
    /// [`IfControl::try_take`], so that a release in between is not missed.
    pub fn release_seq(&self) -> u64 {
        self.word(w::RELEASES).load(Ordering::Acquire)
    }

    /// Sleeps until the ring is released (after `seen`, from
    /// [`IfControl::release_seq`]) or `timeout` passes. A successor that
    /// shares a core with the owner sleeps here rather than spin: a woken
    /// sleeper is scheduled ahead of the processes that kept the core busy.
    /// An owner that dies wakes nobody: hence the timeout.
    pub fn wait_for_release(&self, seen: u64, timeout: std::time::Duration) {
        kp_os::futex::wait(self.word(w::RELEASES), seen as u32, timeout);
    }

    /// The ring's doorbell (see [`Doorbell`]).
    #[inline]
    pub fn doorbell(&self) -> Doorbell<'_> {
        Doorbell {
            count: self.word(w::DOORBELL),
            dozing: self.word(w::DOZING),
        }
    }

    /// Says that `me`, which yielded the ring, answered everything it held
    /// and exits: its successor, which watches it until then, stops (a
    /// yielded IF that dies before this is recovered from by its successor:
    /// the module doc).
    pub fn mark_drained(&self, me: u32) {
        self.word(w::DRAINED)
            .store(u64::from(me), Ordering::Release);
    }

    /// The latest yielded owner that said it drained
    /// ([`IfControl::mark_drained`]), 0 if none.
    pub fn drained(&self) -> u32 {
        self.word(w::DRAINED).load(Ordering::Acquire) as u32
    }

    /// Releases the ring with nothing to hand over (a clean exit); false if
    /// `me` does not own it.
    pub fn release(&self, me: u32) -> bool {
        // FROM is left alone: it is non-zero only between a handover and
        // the next take, which clears it.
        let released = self
            .word(w::OWNER)
            .compare_exchange(u64::from(me), 0, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok();
        if released {
            self.wake_successor();
        }
        released
    }

    /// Says when the batch this IF starts now should end, as a window
    /// `open..=close` (machine-wide monotonic ns,
    /// `kp_os::affinity::monotonic_ns`; `libml::backoff::AnswerWindow`),
    /// or, with `open` 0, that none runs. The if-manager reads it where it
    /// would doze ([`IfControl::answer_window`]): a hint, never a promise,
    /// so a wrong, stale or torn value costs it some polling, no answer.
    #[inline]
    pub fn set_answer_window(&self, open_ns: u64, close_ns: u64) {
        // The end first: a reader that sees the new opening sees it too.
        self.word(w::ANSWER_CLOSE_NS)
            .store(close_ns, Ordering::Relaxed);
        self.word(w::ANSWER_OPEN_NS)
            .store(open_ns, Ordering::Release);
    }

    /// Says that no batch runs.
    #[inline]
    pub fn clear_answer_window(&self) {
        self.word(w::ANSWER_OPEN_NS).store(0, Ordering::Relaxed);
    }

    /// When the IF's running batch should end, `(open, close)`; open 0
    /// if none runs (see [`IfControl::set_answer_window`]).
    #[inline]
    pub fn answer_window(&self) -> (u64, u64) {
        let open = self.word(w::ANSWER_OPEN_NS).load(Ordering::Acquire);
        (open, self.word(w::ANSWER_CLOSE_NS).load(Ordering::Relaxed))
    }

    /// Records a switchover that completed with this gap.
    pub fn record_switchover(&self, gap_ns: u64, taken_ns: u64) {
        self.word(w::TAKEN_NS).store(taken_ns, Ordering::Relaxed);
        self.word(w::LAST_GAP_NS).store(gap_ns, Ordering::Relaxed);
        self.word(w::SWITCHOVERS).fetch_add(1, Ordering::Relaxed);
    }

    /// Switchovers so far and the last one's gap in ns.
    pub fn switchovers(&self) -> (u64, u64) {
        (
            self.word(w::SWITCHOVERS).load(Ordering::Relaxed),
            self.word(w::LAST_GAP_NS).load(Ordering::Relaxed),
        )
    }
}

fn encode_key(k: &RequestKey) -> (u64, u64) {
    let a = (u64::from(u32::from(k.src_ip)) << 32)
        | (u64::from(k.src_port) << 16)
        | u64::from(k.if_id.0);
    (a, k.request_id)
}

fn decode_key(a: &AtomicU64, b: &AtomicU64) -> RequestKey {
    let a = a.load(Ordering::Relaxed);
    RequestKey {
        src_ip: ((a >> 32) as u32).into(),
        src_port: (a >> 16) as u16,
        if_id: IfId(a as u16),
        request_id: b.load(Ordering::Relaxed),
    }
}

/// Words per ledger entry: one cache line.
const ENTRY: usize = 8;

/// How many of its latest early answers a ledger remembers
/// ([`Ledger::answered_early`]): a request's fragments arrive within
/// milliseconds, and an overloaded IF refuses a few thousand requests a
/// second at most, so the last 1,024 cover every request whose fragments
/// may still come.
pub const EARLY_ANSWERS: usize = 1024;

/// Where the early answers begin (after one line holding their count),
/// and where the slots' entries begin, in words.
const EARLY_AT: usize = ENTRY;
const SLOTS_AT: usize = EARLY_AT + 2 * EARLY_ANSWERS;

/// One process's record of the requests it holds, slot by slot, and of
/// the latest requests it answered before all their fragments came (see
/// the module doc). Each slot's entry is written only by the thread that
/// owns its slot at the time; the early answers only by the fragment
/// thread.
#[derive(Debug)]
pub struct Ledger {
    zone: Memzone,
}

impl Ledger {
    /// Creates this process's ledger for `slots` pool slots, all empty.
    pub fn create(slots: usize, socket: SocketId) -> Result<Ledger, DpdkError> {
        let name = names::ledger(std::process::id());
        Ok(Ledger {
            zone: reserve_zeroed(&name, (SLOTS_AT + slots.max(1) * ENTRY) * 8, socket)?,
        })
    }

    /// Finds the ledger of (dead) process `pid`.
    pub fn lookup(pid: u32) -> Result<Ledger, DpdkError> {
        let name = names::ledger(pid);
        let zone = Memzone::lookup(&name)?;
        if zone.len() < (SLOTS_AT + ENTRY) * 8 {
            return Err(DpdkError::NotFound {
                op: "Ledger::lookup (too small to be a ledger)",
                name,
            });
        }
        Ok(Ledger { zone })
    }

    fn entry(&self, slot: usize) -> Option<&[AtomicU64]> {
        let at = SLOTS_AT + slot * ENTRY;
        self.zone.as_atomic_u64s().get(at..at + ENTRY)
    }

    /// Records that the request `key` was answered before all its
    /// fragments arrived (refused, timed out): whoever takes over from us
    /// if we die must not take its later fragments for a new request. Call
    /// after the answer is on the TX ring, from the fragment thread only.
    #[inline]
    pub fn answered_early(&self, key: &RequestKey) {
        let words = self.zone.as_atomic_u64s();
        let n = words[0].load(Ordering::Relaxed);
        let at = EARLY_AT + 2 * (n as usize % EARLY_ANSWERS);
        let (a, b) = encode_key(key);
        words[at].store(a, Ordering::Relaxed);
        words[at + 1].store(b, Ordering::Relaxed);
        words[0].store(n + 1, Ordering::Release);
    }

    /// The latest requests answered early, oldest first (at most
    /// [`EARLY_ANSWERS`]).
    pub fn early_answers(&self) -> Vec<RequestKey> {
        let words = self.zone.as_atomic_u64s();
        let n = words[0].load(Ordering::Acquire) as usize;
        (n.saturating_sub(EARLY_ANSWERS)..n)
            .map(|i| {
                let at = EARLY_AT + 2 * (i % EARLY_ANSWERS);
                decode_key(&words[at], &words[at + 1])
            })
            .collect()
    }

    /// Records that `slot` holds the request answered to `reply`.
    #[inline]
    pub fn hold(&self, slot: usize, reply: &ReplyTo) {
        let Some(e) = self.entry(slot) else { return };
        if e[0].load(Ordering::Relaxed) != 0 {
            return; // already recorded (a later fragment of the request)
        }
        let a = &reply.addr;
        let mac = |m: MacAddr| m.0.iter().fold(0u64, |acc, b| (acc << 8) | u64::from(*b));
        e[1].store(mac(a.src_mac), Ordering::Relaxed);
        e[2].store(mac(a.dst_mac), Ordering::Relaxed);
        e[3].store(
            (u64::from(u32::from(a.src_ip)) << 32) | u64::from(u32::from(a.dst_ip)),
            Ordering::Relaxed,
        );
        let vlan = a.vlan_tci.map_or(0, |t| (1 << 16) | u64::from(t));
        e[4].store(
            (u64::from(a.src_port) << 48) | (u64::from(a.dst_port) << 32) | vlan,
            Ordering::Relaxed,
        );
        e[5].store(u64::from(reply.if_id.0), Ordering::Relaxed);
        e[6].store(reply.request_id, Ordering::Relaxed);
        e[7].store(reply.send_ts_ns, Ordering::Relaxed);
        e[0].store(1, Ordering::Release);
    }

    /// Records that `slot`'s request was answered (call after the answer is
    /// on the TX ring).
    #[inline]
    pub fn clear(&self, slot: usize) {
        if let Some(e) = self.entry(slot) {
            e[0].store(0, Ordering::Release);
        }
    }

    /// The requests still recorded.
    pub fn held(&self) -> Vec<ReplyTo> {
        let words = self.zone.as_atomic_u64s();
        let mac = |v: u64| {
            let b = v.to_be_bytes();
            MacAddr([b[2], b[3], b[4], b[5], b[6], b[7]])
        };
        words[SLOTS_AT..]
            .chunks_exact(ENTRY)
            .filter(|e| e[0].load(Ordering::Acquire) == 1)
            .map(|e| {
                let ips = e[3].load(Ordering::Relaxed);
                let ports = e[4].load(Ordering::Relaxed);
                ReplyTo {
                    addr: FrameAddr {
                        src_mac: mac(e[1].load(Ordering::Relaxed)),
                        dst_mac: mac(e[2].load(Ordering::Relaxed)),
                        vlan_tci: (ports & (1 << 16) != 0).then_some(ports as u16),
                        src_ip: ((ips >> 32) as u32).into(),
                        dst_ip: (ips as u32).into(),
                        src_port: (ports >> 48) as u16,
                        dst_port: (ports >> 32) as u16,
                    },
                    if_id: IfId(e[5].load(Ordering::Relaxed) as u16),
                    request_id: e[6].load(Ordering::Relaxed),
                    send_ts_ns: e[7].load(Ordering::Relaxed),
                }
            })
            .collect()
    }
}

pub use kp_schema::Mode;

/// A [`Mode`] shared between threads, and whether the fragment thread has
/// seen [`Mode::Arming`] and spins for the ring.
#[derive(Debug)]
pub struct ModeCell {
    mode: std::sync::atomic::AtomicU8,
    spinning: std::sync::atomic::AtomicBool,
}

impl ModeCell {
    /// Starting in `mode`.
    pub fn new(mode: Mode) -> Self {
        ModeCell {
            mode: std::sync::atomic::AtomicU8::new(mode as u8),
            spinning: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// The current mode.
    #[inline]
    pub fn get(&self) -> Mode {
        Mode::from_u8(self.mode.load(Ordering::Acquire))
    }

    /// Sets it unconditionally (the fragment thread's transitions).
    pub fn set(&self, mode: Mode) {
        self.mode.store(mode as u8, Ordering::Release);
        if mode != Mode::Arming {
            self.spinning.store(false, Ordering::Release);
        }
    }

    /// Moves from `from` to `to`; false (nothing changed) if it was not in
    /// `from` (the control thread's requests).
    pub fn transition(&self, from: Mode, to: Mode) -> bool {
        let moved = self
            .mode
            .compare_exchange(from as u8, to as u8, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        if moved && from == Mode::Arming {
            self.spinning.store(false, Ordering::Release);
        }
        moved
    }

    /// The fragment thread says it is in [`Mode::Arming`] and spinning: it
    /// will take the ring within microseconds of its release, rather than
    /// after the rest of a standby nap.
    pub fn mark_spinning(&self) {
        self.spinning.store(true, Ordering::Release);
    }

    /// Whether it is spinning for the ring (`activate` waits for this
    /// before it replies, so that the orchestrator's `yield` to the old
    /// owner comes after it).
    pub fn is_spinning(&self) -> bool {
        self.spinning.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    fn words() -> Arc<[AtomicU64; 2]> {
        Arc::new([AtomicU64::new(0), AtomicU64::new(0)])
    }

    #[test]
    fn a_doze_returns_at_once_when_the_bell_rang_after_seen() {
        let w = words();
        let bell = Doorbell::new(&w[0], &w[1]);
        let seen = bell.seen();
        bell.ring(); // nobody dozing: no wake, just the count
        let t = Instant::now();
        bell.doze(seen, Duration::from_secs(30));
        assert!(t.elapsed() < Duration::from_secs(5));
        assert_eq!(w[1].load(Ordering::Relaxed), 0, "not left dozing");
    }

    #[test]
    fn a_ring_wakes_a_dozer_long_before_its_timeout() {
        let w = words();
        let dozer = {
            let w = w.clone();
            std::thread::spawn(move || {
                let bell = Doorbell::new(&w[0], &w[1]);
                let t = Instant::now();
                bell.doze(0, Duration::from_secs(30));
                t.elapsed()
            })
        };
        let bell = Doorbell::new(&w[0], &w[1]);
        while w[1].load(Ordering::Relaxed) == 0 {
            std::thread::yield_now();
        }
        std::thread::sleep(Duration::from_millis(20)); // into the futex wait
        bell.ring();
        let slept = dozer.join().unwrap();
        assert!(
            slept >= Duration::from_millis(20),
            "did not doze: {slept:?}"
        );
        assert!(
            slept < Duration::from_secs(10),
            "the ring did not wake it: {slept:?}"
        );
    }

    #[test]
    fn a_doze_without_a_ring_ends_at_its_timeout() {
        let w = words();
        let bell = Doorbell::new(&w[0], &w[1]);
        let t = Instant::now();
        bell.doze(bell.seen(), Duration::from_millis(30));
        assert!(t.elapsed() >= Duration::from_millis(25));
    }
}
