//! The inference function's driver: ring in, answers out.
//!
//! Two threads share the work, inside one `std::thread::scope`:
//! - the **fragment thread** (the process's EAL lcore) dequeues fragments
//!   from the IF's ring, reads each at the header offsets the if-manager
//!   recorded, runs it through the [`Reassembler`], converts its payload
//!   straight into its input-pool slot (the only copy), and frees the
//!   burst's mbufs in one bulk call; it answers BAD_REQUEST, OVERLOADED (no free
//!   slot) and INCOMPLETE (timeout) itself, and hands each complete request
//!   to the inference thread; with its ring empty it dozes on the ring's
//!   doorbell (`handover::Doorbell`), which the if-manager rings at a
//!   request's first and last fragment, instead of waking on a clock;
//! - the **inference thread** keeps the queue of complete requests, sheds
//!   those that can no longer meet the SLO (OVERLOADED), asks the
//!   [`BatchPolicy`] when to run how many, runs the engine on the batch —
//!   straight from the pool when the slots are adjacent, gathered otherwise
//!   — and answers each request with its top-k, the batch's answers in one
//!   bulk allocation and one burst on the TX ring; with nothing to run it
//!   dozes on a doorbell of its own, which the fragment thread rings for
//!   each burst that completed a request, instead of sleeping by the clock
//!   (a request completed just after such a sleep began waited for its end:
//!   up to the back-off's 500 µs cap plus the timer's slack).
//!
//! Asked to ([`trace`]), the inference thread also records each request it
//! answers, timestamped from its first fragment to its answer, in a buffer
//! allocated up front, for the caller to write out after the IF stopped.
//!
//! Neither thread takes a lock: each records its statistics in a telemetry
//! cell of its own ([`crate::telemetry`]), the batching state goes to the
//! publisher through a sequence lock ([`crate::seqlock`]), and both answer
//! through the TX ring's lock-free producer side.
//!
//! Slot ownership is Rust ownership: the pool is split once into one
//! `&mut [f32]` per slot. A slot's buffer lives in the fragment thread while
//! free or being assembled, travels with the complete request to the
//! inference thread, and comes back when the request is answered — only
//! then does the reassembler reuse the slot. No lock guards the pool and no
//! slot can be written while it is read.
//!
//! Exactly one answer per request: the reassembler gives each request one
//! end (complete, rejected, expired, shed by the if-manager's notice); a
//! complete request is answered by the inference thread exactly once (OK,
//! INTERNAL if the engine fails, or OVERLOADED if shed). A shed notice
//! ([`kp_wire::SHED_NOTICE_TYPE`]: the if-manager's ring to us was full)
//! is answered OVERLOADED by the fragment thread unless its request was
//! answered or handed to inference already. Requests still being assembled
//! when the IF stops are answered INTERNAL. An answer that cannot be sent (no mbuf, TX ring
//! full) is counted, never retried twice.

mod answer;
pub mod control;
pub mod handover;
pub mod succession;
pub mod trace;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crossbeam_queue::ArrayQueue;
use dpdk::{MbufBurst, Ring};
use serde_json::{json, Value};

pub use answer::{AnswerBurst, Answerer, ReplyTo, SendError};
use handover::{Doorbell, IfControl, Ledger, Mode, ModeCell};
pub use succession::NO_TRAFFIC_GRACE;
use succession::{
    handover_keys, ArmWait, Flow, Forward, Held, MachineConfig, ModeMachine, Predecessor, Step,
    StopReason, SuccessionStats, TickView, TookOver, ARMING_SLEEP, DOZE_ASSEMBLING, DOZE_IDLE,
    SPIN_ASSEMBLING, STANDBY_NAP,
};

use crate::backoff::{spins_while_idle, AnswerWindow, IdleAction, IdleBackoff};
use crate::batching::{BatchPolicy, BatchStats, Decision, ProvisioningReport};
use crate::engine::{DeviceStats, Framework};
use crate::pool::{self, InputLayout, SlotBuf};
use crate::reassembly::{FragmentOutcome, Reassembler, SlotId};
use crate::seqlock::SeqCell;
use crate::telemetry::{Publication, Telemetry, TelemetryWriter};
use crate::topk::top_k;
use kp_wire::{
    parse_shed_notice, parse_udp_frame, udp_frame_at, Fragment, FragmentRepr, RequestKey, Status,
};
use trace::{RequestSpan, RequestTrace};

/// Largest top-k an IF answers with (docs/PROTOCOL.md allows more; nobody needs
/// more than this many classes per answer, and it bounds the stack buffer).
pub const MAX_TOP_K: usize = 64;

/// Fragments per dequeue burst (at most 32: the fragment loop marks the
/// frames to forward in a `u32`).
const BURST: usize = 32;
const _: () = assert!(BURST <= 32);

/// How often the fragment thread samples its CPU time for telemetry, ns.
const CPU_SAMPLE_NS: u64 = 10_000_000;

/// Longest doze of an idle inference thread: the fragment thread rings it
/// for every request it completes (and when it stops), so this bounds only
/// what nothing rings for.
const INFERENCE_DOZE: Duration = Duration::from_millis(10);

/// What the driver runs with.
#[derive(Debug)]
pub struct RuntimeConfig {
    /// Top-k classes per answer (clamped to the output size and
    /// [`MAX_TOP_K`]).
    pub top_k: usize,
    /// Floats in one output row.
    pub output_elems: usize,
    /// Largest batch the engine runs.
    pub max_batch: usize,
    /// Exit once no fragment arrived for this long and nothing is in flight
    /// ([`NO_TRAFFIC_GRACE`] at least, before the first fragment).
    pub exit_when_idle: Option<Duration>,
    /// Never sleep when idle.
    pub busy_poll: bool,
    /// How long the idle inference thread keeps spinning on its core after
    /// its last batch before it dozes ([`crate::backoff::spins_while_idle`]);
    /// zero never spins.
    pub inference_spin: Duration,
    /// Period of the telemetry snapshots given to the publisher.
    pub telemetry_every: Duration,
    /// CPUs the inference thread is pinned to (the IF's share of cores);
    /// `None`: left where it was started.
    pub inference_cpus: Option<Vec<usize>>,
}

/// An IF's place in the succession of its ring: see [`handover`].
#[derive(Debug)]
pub struct Succession<'a> {
    /// The ring's shared control block (who dequeues; handovers).
    pub control: &'a IfControl,
    /// This IF's mode, changed by its control thread and its fragment
    /// thread.
    pub mode: &'a ModeCell,
    /// This IF's ledger of the requests it holds.
    pub ledger: &'a Ledger,
    /// This IF's hand-back ring: fragments its successor sends back.
    pub handback: &'a Ring,
    /// How long a successor forwards fragments back after a switchover
    /// (longer than the reassembly timeout).
    pub grace: Duration,
}

/// Where telemetry goes (the kp-if binary publishes it on ZeroMQ): called
/// with a snapshot every [`RuntimeConfig::telemetry_every`] and with each
/// under/over-provisioning report as it happens, from the driver's threads.
pub type Publish<'a> = &'a (dyn Fn(&Publication) + Sync);

/// One complete request, on its way to inference with its slot's buffer.
struct Ready<'p> {
    slot: SlotId,
    buf: SlotBuf<'p>,
    reply: ReplyTo,
    first_seen_ns: u64,
    /// When its last fragment was dequeued (for the request trace).
    complete_ns: u64,
}

/// A slot's buffer on its way back to the fragment thread.
struct Returned<'p> {
    slot: SlotId,
    buf: SlotBuf<'p>,
}

/// The engine's latest [`DeviceStats`], handed from the inference thread to
/// the telemetry publisher; empty until an engine with a device reports.
struct DeviceCell {
    cell: SeqCell<{ DeviceStats::WORDS }>,
    seen: AtomicBool,
}

impl Default for DeviceCell {
    fn default() -> Self {
        DeviceCell {
            cell: SeqCell::new([0; DeviceStats::WORDS]),
            seen: AtomicBool::new(false),
        }
    }
}

impl DeviceCell {
    fn store(&self, d: &DeviceStats) {
        self.cell.store(d.to_words());
        self.seen.store(true, Ordering::Release);
    }

    fn load(&self) -> Option<DeviceStats> {
        self.seen
            .load(Ordering::Acquire)
            .then(|| DeviceStats::from_words(&self.cell.load()))
    }
}

/// Counters only the driver keeps (the rest is in the reassembler and the
/// batching policy).
#[derive(Debug, Default)]
struct DriverCounters {
    fragments: u64,
    /// Payload bytes of the fragments handled (stored, duplicate, late,
    /// malformed alike): what the fragment thread's CPU is per KiB of.
    payload_bytes: u64,
    unparsable: u64,
    send_failed: u64,
    under_reports: u64,
    over_reports: u64,
    engine_errors: u64,
    gathered_batches: u64,
    contiguous_batches: u64,
    /// Batches the engine read from the pool itself (`infer_slots`).
    in_place_batches: u64,
    /// Batches of raw images the inference thread normalised into the
    /// engine's input (`InputLayout::normalise_raw`) before a CPU engine
    /// ran them.
    normalised_batches: u64,
}

/// Runs the IF until `stop` is set (or it is idle, with `exit_when_idle`),
/// then finishes every complete request and returns the final report.
/// With a `trace`, the inference thread records each request it answers
/// there ([`trace`]).
#[allow(clippy::too_many_arguments)]
pub fn serve(
    cfg: &RuntimeConfig,
    ring: &Ring,
    succession: &Succession<'_>,
    answerer: &Answerer,
    layout: &InputLayout,
    pool: &mut pool::InputPool,
    reassembler: &mut Reassembler,
    policy: &mut BatchPolicy,
    engine: &mut dyn Framework,
    stop: &AtomicBool,
    publish: Option<Publish<'_>>,
    trace: Option<&mut RequestTrace>,
) -> Value {
    let clock = Instant::now();
    // The same instant on the realtime clock: puts the report's and the
    // trace's times (ns since `clock`) on the clock packet captures use.
    let clock_realtime_ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let now_ns = || clock.elapsed().as_nanos() as u64;
    let capacity = pool.capacity();
    // One cell per recording thread: 0 the fragment thread, 1 inference.
    let telemetry = Telemetry::new(0, policy.config().slo_ns / 1000, cfg.max_batch, 2);
    let mut fragment_telemetry = telemetry.writer(0).expect("cell 0 is free");
    let inference_telemetry = telemetry.writer(1).expect("cell 1 is free");
    let ready: ArrayQueue<Ready<'_>> = ArrayQueue::new(capacity);
    let returned: ArrayQueue<Returned<'_>> = ArrayQueue::new(capacity);
    let fragments_done = AtomicBool::new(false);
    let all_done = AtomicBool::new(false);
    // The fragment thread rings it when it hands over complete requests
    // (or stops); an idle inference thread dozes on it instead of sleeping
    // by the clock, so a request is not left waiting for a timer.
    let (ready_rings, ready_dozing) = (AtomicU64::new(0), AtomicU64::new(0));
    let ready_bell = Doorbell::new(&ready_rings, &ready_dozing);
    let admission = Admission::default();
    let latest_batching = SeqCell::new(policy.stats().to_words());
    let latest_device = DeviceCell::default();
    let (span, buffers) = pool.split_slots();
    let mut slots: Vec<Option<SlotBuf<'_>>> = buffers.into_iter().map(Some).collect();
    let mut rx = DriverCounters::default();
    let mut inf = DriverCounters::default();
    let mut stats = SuccessionStats::default();
    // Where the two threads may share a core (the inference thread's CPUs
    // overlap this one's; it inherits them when not pinned), the fragment
    // thread yields after handing over complete requests: a woken thread
    // need not preempt its waker, and the inference thread then waits for
    // the fragment thread's next polls (13 µs p50 from a request's
    // completion to its batch's start at one request in flight, 5–7 µs
    // with the yield: docs/PERFORMANCE-JOURNAL.md). With nothing else runnable
    // there a yield returns at once.
    let yield_on_handover = match (kp_os::affinity::current_thread_cpus(), &cfg.inference_cpus) {
        (Ok(mine), Some(theirs)) => mine.iter().any(|c| theirs.contains(c)),
        _ => true,
    };
    if yield_on_handover && !cfg.inference_spin.is_zero() {
        tracing::warn!(
            "kp-if: the inference thread spins for {:?} after each batch on a core the fragment \
             thread shares: it takes CPU the fragment thread needs (give the fragment thread \
             another core, or --inference-spin-ms 0)",
            cfg.inference_spin
        );
    }

    std::thread::scope(|s| {
        if let Some(publish) = publish {
            let (telemetry, latest, all_done) = (&telemetry, &latest_batching, &all_done);
            let device = &latest_device;
            let mode = succession.mode;
            s.spawn(move || {
                let mut next = Instant::now() + cfg.telemetry_every;
                while !all_done.load(Ordering::Acquire) {
                    std::thread::sleep(Duration::from_millis(20));
                    if Instant::now() < next {
                        continue;
                    }
                    next += cfg.telemetry_every;
                    publish(&Publication::Telemetry {
                        mode: mode.get().name().to_string(),
                        telemetry: telemetry.snapshot(now_ns()),
                        batching: BatchStats::from_words(&latest.load()),
                        device: device.load(),
                    });
                }
                // The last numbers, every answer counted: what a reader
                // adding up processes' counters (the orchestrator's
                // Prometheus counters) needs of one that leaves.
                publish(&Publication::Telemetry {
                    mode: mode.get().name().to_string(),
                    telemetry: telemetry.snapshot(now_ns()),
                    batching: BatchStats::from_words(&latest.load()),
                    device: device.load(),
                });
            });
        }
        let inference = s.spawn(|| {
            if let Some(cpus) = &cfg.inference_cpus {
                if let Err(e) = kp_os::affinity::set_current_thread_cpus(cpus) {
                    tracing::warn!("kp-if: cannot pin the inference thread to {cpus:?}: {e}");
                }
            }
            inference_loop(
                cfg,
                layout,
                engine,
                policy,
                answerer,
                &ready,
                ready_bell,
                &returned,
                &fragments_done,
                inference_telemetry,
                &now_ns,
                succession.ledger,
                span,
                &latest_batching,
                &latest_device,
                &admission,
                succession.mode,
                publish,
                trace,
                succession.control,
            )
        });
        fragment_loop(
            cfg,
            ring,
            succession,
            answerer,
            layout,
            reassembler,
            &mut slots,
            &ready,
            ready_bell,
            &returned,
            stop,
            &mut fragment_telemetry,
            &now_ns,
            &mut rx,
            &mut stats,
            &admission,
            yield_on_handover,
        );
        fragments_done.store(true, Ordering::Release);
        ready_bell.ring();
        match inference.join() {
            Ok(c) => inf = c,
            // A panic in the engine: its batch's requests were not answered.
            Err(_) => inf.engine_errors += 1,
        }
        all_done.store(true, Ordering::Release);
    });
    // Slots the inference thread handed back after the fragment loop ended.
    while let Some(r) = returned.pop() {
        let _ = reassembler.release(r.slot);
    }

    let now = now_ns();
    let c = reassembler.counters();
    json!({
        "clock_realtime_ns": clock_realtime_ns,
        "telemetry": telemetry.to_json(now),
        "reassembly": {
            "fragments": rx.fragments,
            "unparsable": rx.unparsable,
            "stored": c.stored, "completed": c.completed, "duplicate": c.duplicate, "late": c.late,
            "bad_request": c.bad_request, "overloaded": c.overloaded, "malformed": c.malformed,
            "requests": c.requests,
            "requests_completed": c.requests_completed,
            "requests_bad_request": c.requests_bad_request,
            "requests_incomplete": c.requests_incomplete,
            "requests_overloaded": c.requests_overloaded,
            "requests_drained": c.requests_drained,
            "shed_notices": c.shed_notices,
            "answered_evictions": c.answered_evictions,
        },
        "batching": serde_json::to_value(policy.stats()).unwrap_or(Value::Null),
        "device": serde_json::to_value(latest_device.load()).unwrap_or(Value::Null),
        "succession": {
            "taken": stats.taken,
            "gap_ns": stats.gap_ns,
            "handed_in_flight": stats.handed_in_flight,
            "handed_answered": stats.handed_answered,
            "forwarded": stats.forwarded,
            "forward_lost": stats.forward_lost,
            "recovered_internal": stats.recovered,
            "early_answers": stats.early_answers,
            "predecessor_died": stats.predecessor_died,
            "inherited_in_flight": stats.inherited_in_flight,
            "inherited_answered": stats.inherited_answered,
            "yielded": stats.yielded,
            "lost_ownership": stats.lost_ownership,
        },
        "driver": {
            "send_failed": rx.send_failed + inf.send_failed,
            "engine_errors": inf.engine_errors,
            "contiguous_batches": inf.contiguous_batches,
            "gathered_batches": inf.gathered_batches,
            "in_place_batches": inf.in_place_batches,
            "normalised_batches": inf.normalised_batches,
            "under_provisioning_reports": inf.under_reports,
            "over_provisioning_reports": inf.over_reports,
        },
    })
}

/// The fragment thread: a driver around the [`ModeMachine`] — it makes the
/// ring, shared-memory and clock calls each [`Step`] names — and around the
/// [`Reassembler`], for each burst of fragments.
#[allow(clippy::too_many_arguments)]
fn fragment_loop<'p>(
    cfg: &RuntimeConfig,
    ring: &Ring,
    succession: &Succession<'_>,
    answerer: &Answerer,
    layout: &InputLayout,
    reassembler: &mut Reassembler,
    slots: &mut [Option<SlotBuf<'p>>],
    ready: &ArrayQueue<Ready<'p>>,
    ready_bell: Doorbell<'_>,
    returned: &ArrayQueue<Returned<'p>>,
    stop: &AtomicBool,
    telemetry: &mut TelemetryWriter<'_>,
    now_ns: &dyn Fn() -> u64,
    counters: &mut DriverCounters,
    stats: &mut SuccessionStats,
    admission: &Admission,
    yield_on_handover: bool,
) {
    let me = std::process::id();
    let ledger = succession.ledger;
    let mut burst = MbufBurst::<BURST>::new();
    let mut backoff = IdleBackoff::new(cfg.busy_poll);
    let bell = succession.control.doorbell();
    let mut now = now_ns();
    let mut machine = ModeMachine::<Ring>::new(
        MachineConfig {
            me,
            exit_when_idle: cfg.exit_when_idle,
            grace: succession.grace,
        },
        now,
    );
    // Reply addressing of the request in each slot (for INCOMPLETE).
    let mut replies: Vec<Option<ReplyTo>> = vec![None; slots.len()];
    // Where fragments come from: our ring, or our hand-back ring once we
    // yielded it.
    let mut source = ring;
    // When the thread's CPU time was last sampled for telemetry (a system
    // call: every CPU_SAMPLE_NS at most, never per packet), and what it had
    // used before this loop: this is the process's main thread, and its
    // start-up (the EAL, the model's load) is not the packet path's cost.
    let mut cpu_sampled_ns = 0u64;
    // When the latest burst of fragments was dequeued.
    let mut last_fragment_ns = now;
    let cpu_base = kp_os::affinity::thread_cpu_ns();
    let sample_cpu = |telemetry: &mut TelemetryWriter<'_>, counters: &DriverCounters| {
        telemetry.on_fragment_cpu(
            kp_os::affinity::thread_cpu_ns() - cpu_base,
            counters.fragments,
            counters.payload_bytes,
        );
    };
    // Whether the last poll ended in a doze: the next one is a tick (a
    // doze is a sleep, whether the back-off's or the core's: see
    // `FragmentIdle`).
    let mut dozed = false;
    loop {
        let mode = succession.mode.get();
        let after_doze = std::mem::take(&mut dozed);
        if machine.poll_is_tick(mode, backoff.is_sleeping() || after_doze) {
            now = now_ns();
            if now.saturating_sub(cpu_sampled_ns) >= CPU_SAMPLE_NS {
                cpu_sampled_ns = now;
                sample_cpu(telemetry, counters);
            }
            take_back_slots(returned, reassembler, slots);
            reassembler.poll_expired(now, |e| {
                if let Some(reply) = replies[e.slot.index()].take() {
                    answer_alone(
                        answerer,
                        ledger,
                        &reply,
                        e.status(),
                        e.first_seen_ns,
                        Some(e.slot),
                        now,
                        counters,
                        telemetry,
                    );
                }
            });
            let seen = TickView {
                stop: stop.load(Ordering::Relaxed),
                fragments: counters.fragments,
                held: held(reassembler),
            };
            if let Flow::Stop(_) = machine.tick(mode, now, seen) {
                break;
            }
            if let Some(pid) = machine.predecessor_due(now) {
                // Alive first, then the drained word (`Predecessor::of`).
                let alive = kp_os::affinity::process_alive(pid);
                let found = Predecessor::of(pid, alive, succession.control.drained());
                if let Some(dead) = machine.predecessor_is(pid, found) {
                    if let Some(ring) = dead.handback {
                        // Its consumer is gone: the fragments sent back
                        // since it died go back to the pool.
                        ring.free_queued();
                    }
                    let (n, early) = recover_from_dead(
                        dead.pid,
                        answerer,
                        reassembler,
                        telemetry,
                        now,
                        &mut counters.send_failed,
                    );
                    machine.count_recovered(n, early);
                }
            }
        }

        match machine.step(mode, now, held(reassembler)) {
            Step::Nap => {
                // Parked: no CPU to speak of until told to arm.
                std::thread::sleep(STANDBY_NAP);
                continue;
            }
            Step::Arm => {
                let Some(taken) = arm(&mut machine, succession, me, now) else {
                    continue;
                };
                now = now_ns();
                let mark_answered = |key: &RequestKey| reassembler.mark_answered(key, now);
                let took = machine.took(taken, now, mark_answered, kp_os::affinity::monotonic_ns);
                if let TookOver::FromDead(pid) = took {
                    let (n, early) = recover_from_dead(
                        pid,
                        answerer,
                        reassembler,
                        telemetry,
                        now,
                        &mut counters.send_failed,
                    );
                    machine.count_recovered(n, early);
                }
                // A parked shadow served nothing (what it answered for a
                // dead predecessor, just now, counts): run time and rates
                // start when it starts serving.
                telemetry.restart_clock(now);
                succession.mode.transition(Mode::Arming, Mode::Active);
            }
            Step::Serve => {
                if let Flow::Stop(_) = machine.owner_seen(succession.control.owner()) {
                    break;
                }
            }
            Step::HandOver => {
                now = now_ns();
                let released = hand_over(&machine, succession, reassembler, me, now);
                if released {
                    source = succession.handback;
                    // The release woke the successor: if it shares our
                    // core, let it run now rather than at our next slice.
                    std::thread::yield_now();
                }
                let flow = machine.handed_over(released, now);
                succession.mode.set(Mode::Draining);
                if let Flow::Stop(_) = flow {
                    break; // we did not own it: nothing to finish
                }
            }
            Step::Poll => {}
            Step::Stop(reason) => {
                if reason == StopReason::Drained {
                    // Everything held is answered (and out of the ledger):
                    // the successor stops watching us.
                    succession.control.mark_drained(me);
                }
                break;
            }
        }

        if let Some((gap, taken_ns)) = machine.switchover_gap(kp_os::affinity::monotonic_ns) {
            succession.control.record_switchover(gap, taken_ns);
        }
        // Read before the ring is: a ring after this wakes a doze below.
        let rung = bell.seen();
        let got = source.dequeue_burst(&mut burst);
        machine.dequeued(got, now);
        if got > 0 {
            // Answered requests' slots back before this burst's first
            // fragments are admitted, not at the next tick: a request held
            // for one already answered would be refused OVERLOADED (seen at
            // one request outstanding behind a 4× SLO: 20% refused).
            take_back_slots(returned, reassembler, slots);
        }
        reassembler.set_handed_limit(admission.limit.load(Ordering::Relaxed));
        let refused_before = reassembler.counters().requests_overloaded;
        // The frames are read in place; those of a predecessor's requests
        // are marked here and sent back below, the rest freed in bulk.
        let mut to_forward = 0u32;
        // Whether this burst completed a request (the inference thread is
        // rung once per burst that did).
        let mut completed = false;
        for (i, mbuf) in burst.iter().enumerate() {
            let Some(parsed) = parse(mbuf) else {
                counters.fragments += 1;
                counters.unparsable += 1;
                continue;
            };
            // A shed notice carries no payload: the if-manager could not
            // deliver a fragment of its request, which is answered
            // OVERLOADED below unless it was answered (a notice ends in
            // `Reject` or `Late`, never in a store).
            let (reply, header, payload_at) = match parsed {
                Parsed::Fragment(reply, header, payload_at) => (reply, header, Some(payload_at)),
                Parsed::ShedNotice(reply, header) => (reply, header, None),
            };
            let key = reply.key();
            if machine.forward_to(&key).is_some() {
                to_forward |= 1 << i;
                continue;
            }
            let requests_before = reassembler.counters().requests;
            let outcome = if payload_at.is_some() {
                counters.fragments += 1;
                reassembler.on_fragment(key, &header, now)
            } else {
                reassembler.on_shed_notice(key, &header, now)
            };
            if reassembler.counters().requests != requests_before {
                telemetry.on_arrival(now);
            }
            let payload = payload_at.map_or(&[][..], |at| &mbuf.data()[at..]);
            counters.payload_bytes += payload.len() as u64;
            match outcome {
                FragmentOutcome::Store { slot, offset } => {
                    ledger.hold(slot.index(), &reply);
                    replies[slot.index()] = Some(reply);
                    if let Some(buf) = slots[slot.index()].as_deref_mut() {
                        layout.write_fragment(payload, offset, buf);
                    }
                }
                FragmentOutcome::StoreAndComplete { slot, offset, done } => {
                    ledger.hold(slot.index(), &reply);
                    replies[slot.index()] = None;
                    if let Some(mut buf) = slots[slot.index()].take() {
                        layout.write_fragment(payload, offset, &mut buf);
                        let r = Ready {
                            slot,
                            buf,
                            reply,
                            first_seen_ns: done.first_seen_ns,
                            // Now, not the loop's `now`: that is read once
                            // per tick (`TICK_EVERY` polls), up to ~0.1 ms
                            // ago while a request's fragments stream in.
                            complete_ns: now_ns(),
                        };
                        // Cannot be full: it holds at most one entry per slot.
                        let _ = ready.push(r);
                        completed = true;
                    }
                }
                FragmentOutcome::Reject {
                    status,
                    first_seen_ns,
                    freed,
                    ..
                } => {
                    answer_alone(
                        answerer,
                        ledger,
                        &reply,
                        status,
                        first_seen_ns,
                        freed,
                        now,
                        counters,
                        telemetry,
                    );
                    if let Some(slot) = freed {
                        replies[slot.index()] = None;
                    }
                }
                FragmentOutcome::Duplicate | FragmentOutcome::Late | FragmentOutcome::Malformed => {
                }
            }
        }
        if reassembler.counters().requests_overloaded != refused_before {
            admission.refused_ns.store(now, Ordering::Relaxed);
        }
        if completed {
            ready_bell.ring();
            if yield_on_handover {
                // The woken inference thread is scheduled now rather than
                // after this thread's next polls (see `serve`).
                std::thread::yield_now();
            }
        }
        if to_forward == 0 {
            // Every frame's bytes are in their slots: one bulk free.
            burst.clear();
        } else {
            for (i, mbuf) in burst.drain().enumerate() {
                if to_forward & (1 << i) == 0 {
                    continue; // freed here
                }
                let key = match parse(&mbuf) {
                    Some(Parsed::Fragment(reply, ..) | Parsed::ShedNotice(reply, ..)) => {
                        reply.key()
                    }
                    None => continue,
                };
                if let Some(back) = machine.forward_to(&key) {
                    let sent = forward_back(back, mbuf);
                    machine.count_forward(sent);
                }
            }
        }

        if got > 0 {
            last_fragment_ns = now;
        }
        // Who else needs the core is looked at only once the ring is empty:
        // the inference thread's dozing word is not read per burst.
        let step = match backoff.after_poll(got > 0) {
            IdleAction::Poll => FragmentStep::Poll,
            action => FragmentIdle {
                own_ring: std::ptr::eq(source, ring) && mode == Mode::Active,
                shares_core: yield_on_handover,
                engine_dozing: ready_bell.is_dozing(),
                assembling: reassembler.in_flight() > 0
                    && now.saturating_sub(last_fragment_ns) < SPIN_ASSEMBLING.as_nanos() as u64,
            }
            .next(action),
        };
        match step {
            FragmentStep::Poll => {}
            FragmentStep::Pause => std::hint::spin_loop(),
            // Our own ring: doze until the if-manager rings (a request's
            // first or last fragment, a shed notice, a filling ring) or the
            // clock says the reassembler has something to time out.
            FragmentStep::Doze => {
                let timeout = if reassembler.in_flight() > 0 {
                    DOZE_ASSEMBLING
                } else {
                    DOZE_IDLE
                };
                bell.doze(rung, timeout);
                // The loop's clock is as old as the doze: the next poll
                // ticks, so that what comes next is stamped fresh.
                dozed = true;
            }
            FragmentStep::Sleep(d) => std::thread::sleep(d),
        }
    }

    // Stopping: requests still being assembled will never complete here.
    reassembler.drain_in_flight(|f| {
        if let Some(reply) = replies[f.slot.index()].take() {
            answer_alone(
                answerer,
                ledger,
                &reply,
                Status::Internal,
                f.first_seen_ns,
                Some(f.slot),
                now,
                counters,
                telemetry,
            );
        }
    });
    sample_cpu(telemetry, counters);
    // A clean exit frees the ring for whoever comes next (a no-op if we
    // yielded it or never had it).
    succession.control.release(me);
    succession.mode.set(Mode::Done);
    *stats = machine.into_stats();
}

/// One poll of an arming IF: looks up a new owner's hand-back ring, says
/// it spins, and takes the ring if it is free (or its owner dead); if not,
/// spins, sleeps on the release futex or parks again, as the machine says.
/// This is the switchover's hot path: nothing here allocates, locks or
/// makes a system call but the futex sleep once spinning is over.
#[inline]
fn arm(
    machine: &mut ModeMachine<Ring>,
    succession: &Succession<'_>,
    me: u32,
    now: u64,
) -> Option<handover::Taken> {
    // Read before `try_take`, so that a release in between is not missed.
    let seq = succession.control.release_seq();
    machine.watch_owner(succession.control.owner(), |pid| {
        Ring::lookup(&crate::names::handback_ring(pid)).ok()
    });
    // Ready to take it (`activate` replies now, and then the orchestrator
    // asks the owner to yield).
    succession.mode.mark_spinning();
    let taken = succession.control.try_take(me);
    if taken.is_none() {
        match machine.not_taken(now) {
            ArmWait::Spin => std::hint::spin_loop(),
            ArmWait::Sleep => succession.control.wait_for_release(seq, ARMING_SLEEP),
            ArmWait::ParkAgain => {
                succession.mode.transition(Mode::Arming, Mode::Standby);
            }
        }
    }
    taken
}

/// Releases the ring to our successor with the keys of the requests we
/// hold and of those we answered recently; false if it was not ours.
fn hand_over(
    machine: &ModeMachine<Ring>,
    succession: &Succession<'_>,
    reassembler: &Reassembler,
    me: u32,
    now: u64,
) -> bool {
    let (in_flight, answered) =
        handover_keys(reassembler.in_flight_keys(), reassembler.answered_keys(now));
    succession.control.release_with_handover(
        me,
        &in_flight,
        &answered,
        machine.grace_ns(),
        kp_os::affinity::monotonic_ns(),
    )
}

/// What the reassembler holds, as the mode machine sees it.
fn held(reassembler: &Reassembler) -> Held {
    Held {
        in_flight: reassembler.in_flight(),
        handed: reassembler.handed(),
    }
}

/// Sends a fragment of a request our predecessor holds back to it; false
/// if it was lost (no hand-back ring, or it was full).
fn forward_back(f: &mut Forward<Ring>, mbuf: dpdk::Mbuf) -> bool {
    if f.ring.is_none() {
        // Not found while arming (the owner changed meanwhile): looked up
        // at the first fragment to forward.
        f.ring = Ring::lookup(&crate::names::handback_ring(f.from_pid)).ok();
    }
    f.ring.as_ref().is_some_and(|r| r.enqueue(mbuf).is_ok())
}

/// Answers INTERNAL every request a dead predecessor (`pid`) held, from its
/// ledger, and remembers them as answered, with those it answered early.
/// Returns how many it answered, and how many early answers it adopted.
fn recover_from_dead(
    pid: u32,
    answerer: &Answerer,
    reassembler: &mut Reassembler,
    telemetry: &mut TelemetryWriter<'_>,
    now: u64,
    send_failed: &mut u64,
) -> (u64, u64) {
    let Ok(ledger) = handover::Ledger::lookup(pid) else {
        tracing::warn!("kp-if: predecessor {pid} died and left no ledger");
        return (0, 0);
    };
    // What it answered before all their fragments came (refused, timed
    // out): the rest of them is late, not new requests.
    let early = ledger.early_answers();
    for key in &early {
        reassembler.mark_answered(key, now);
    }
    let held = ledger.held();
    for reply in &held {
        reassembler.mark_answered(&reply.key(), now);
        *send_failed += u64::from(answerer.error(reply, Status::Internal, 0).is_err());
        telemetry.on_answer(Status::Internal, 0, now);
    }
    tracing::warn!(
        "kp-if: took over from dead {pid}; answered its {} requests INTERNAL",
        held.len()
    );
    (held.len() as u64, early.len() as u64)
}

/// What the if-manager put on the ring.
enum Parsed {
    /// A request fragment: reply addressing, header, where the payload
    /// starts in the frame.
    Fragment(ReplyTo, FragmentRepr, usize),
    /// A shed notice ([`kp_wire::SHED_NOTICE_TYPE`]) for a request.
    ShedNotice(ReplyTo, FragmentRepr),
}

/// Reads a frame the if-manager already validated: at the header lengths
/// it recorded in the mbuf (no second parse of Ethernet, IPv4 and UDP),
/// or parsed whole if none were recorded. The kneepoint header is checked
/// (it also tells a fragment from a shed notice).
fn parse(mbuf: &dpdk::Mbuf) -> Option<Parsed> {
    let frame = mbuf.data();
    let udp = match mbuf.header_lens() {
        (0, _) | (_, 0) => parse_udp_frame(frame).ok()?,
        (l2, l3) => udp_frame_at(frame, l2, l3)?,
    };
    let reply = |header: &FragmentRepr| ReplyTo {
        addr: udp.addr,
        if_id: header.if_id,
        request_id: header.request_id,
        send_ts_ns: header.send_ts_ns,
    };
    if let Some(header) = parse_shed_notice(udp.payload) {
        return Some(Parsed::ShedNotice(reply(&header), header));
    }
    let fragment = Fragment::new_checked(udp.payload).ok()?;
    let header = FragmentRepr::parse(&fragment);
    let payload_at = udp.payload_offset + kp_wire::HEADER_LEN;
    Some(Parsed::Fragment(reply(&header), header, payload_at))
}

#[allow(clippy::too_many_arguments)]
fn inference_loop<'p>(
    cfg: &RuntimeConfig,
    layout: &InputLayout,
    engine: &mut dyn Framework,
    policy: &mut BatchPolicy,
    answerer: &Answerer,
    ready: &ArrayQueue<Ready<'p>>,
    bell: Doorbell<'_>,
    returned: &ArrayQueue<Returned<'p>>,
    fragments_done: &AtomicBool,
    mut telemetry: TelemetryWriter<'_>,
    now_ns: &dyn Fn() -> u64,
    ledger: &Ledger,
    span: pool::PoolSpan<'p>,
    latest_batching: &SeqCell<{ BatchStats::WORDS }>,
    latest_device: &DeviceCell,
    admission: &Admission,
    mode: &ModeCell,
    publish: Option<Publish<'_>>,
    mut trace: Option<&mut RequestTrace>,
    control: &IfControl,
) -> DriverCounters {
    let mut counters = DriverCounters::default();
    let counters = &mut counters;
    let capacity = ready.capacity();
    let mut queue: VecDeque<Ready<'p>> = VecDeque::with_capacity(capacity);
    let mut arrivals: Vec<u64> = Vec::with_capacity(capacity);
    // Reused for every batch: nothing is allocated per batch.
    let mut batch: Vec<Ready<'p>> = Vec::with_capacity(cfg.max_batch.max(1));
    let mut gather: Vec<f32> = Vec::new();
    // An engine that reads the pool itself gets slot numbers, not values.
    let in_place = engine.reads_input_pool();
    // Whether the thread's CPU clock across a batch is what it cost (the
    // batching policy learns from it): read twice per batch, a system call
    // each, only then.
    let on_calling_thread = engine.runs_on_calling_thread();
    let mut slot_ids: Vec<u32> = Vec::with_capacity(cfg.max_batch.max(1));
    let mut output = vec![0f32; cfg.max_batch * cfg.output_elems];
    let k = cfg.top_k.min(cfg.output_elems).min(MAX_TOP_K);
    let mut best = [(0u32, 0f32); MAX_TOP_K];
    let mut backoff = IdleBackoff::new(cfg.busy_poll);
    // How far batches end from their prediction, for the window in which
    // the if-manager polls for their answers; and since when the engine
    // idles (a cold engine spreads more).
    let mut answer_window = AnswerWindow::new();
    let mut engine_free_since: Option<u64> = None;
    let cpu_base = kp_os::affinity::thread_cpu_ns();
    loop {
        let done = fragments_done.load(Ordering::Acquire);
        // Read before the queue is: a ring after this ends a doze below.
        let rung = bell.seen();
        while let Some(r) = ready.pop() {
            queue.push_back(r);
        }
        let now = now_ns();
        if queue.is_empty() {
            if done && ready.is_empty() {
                // The last sample: an IF that never ran a batch still
                // reports what waiting cost it.
                telemetry.on_inference_cpu(kp_os::affinity::thread_cpu_ns() - cpu_base);
                return std::mem::take(counters);
            }
            // Draining (its ring yielded to a successor, which may run on
            // the same cores): doze.
            let spin = mode.get() != Mode::Draining
                && spins_while_idle(cfg.inference_spin, engine_free_since, now);
            idle_until_rung(&mut backoff, bell, rung, INFERENCE_DOZE, spin);
            continue;
        }
        arrivals.clear();
        arrivals.extend(queue.iter().map(|r| r.first_seen_ns));
        // Shed what can no longer meet its SLO.
        policy.note_refused(admission.refused_ns.load(Ordering::Relaxed));
        let shed = policy.shed(now, &arrivals);
        if shed > 0 {
            let mut answers = answerer.burst(shed);
            for r in queue.iter().take(shed) {
                let latency = latency_us(r.first_seen_ns, now);
                counters.send_failed += u64::from(
                    answers
                        .error(&r.reply, Status::Overloaded, latency)
                        .is_err(),
                );
                telemetry.on_answer(Status::Overloaded, u64::from(latency), now);
            }
            // Answered (on the TX ring): out of the ledger before the
            // doorbell wakes the if-manager.
            counters.send_failed += answers.send_then(|| {
                for r in queue.iter().take(shed) {
                    ledger.clear(r.slot.index());
                }
            }) as u64;
            if let Some(t) = trace.as_deref_mut() {
                let sent = now_ns();
                for r in queue.iter().take(shed) {
                    t.record(span_of(r, Status::Overloaded, 0, (now, now, 0), sent));
                }
            }
            for r in queue.drain(..shed) {
                give_back(returned, r);
            }
            continue;
        }
        let n = match policy.decide(now, &arrivals, true) {
            Decision::Dispatch { batch } => batch.min(queue.len()).min(cfg.max_batch).max(1),
            // Do not wait to fill a batch once no new request can come:
            // fragments stopped for good, or this IF yielded its ring (only
            // what it was assembling still completes, its last fragments
            // handed back), where the policy, still counting on the arrival
            // rate it saw, would wait until the oldest request's deadline
            // (seen: requests queued at a switchover answered 1.4–1.8 s
            // late under a 2 s SLO).
            Decision::Wait { .. } if (done && ready.is_empty()) || mode.get() == Mode::Draining => {
                queue.len().min(cfg.max_batch)
            }
            Decision::Wait { until_ns } => {
                // Until the deadline, or sooner if another request
                // completes (it may fill the batch the policy waits for).
                let wait = Duration::from_nanos(until_ns.saturating_sub(now))
                    .min(Duration::from_micros(200));
                bell.doze(rung, wait);
                continue;
            }
            Decision::Idle => {
                let spin = mode.get() != Mode::Draining
                    && spins_while_idle(cfg.inference_spin, engine_free_since, now);
                idle_until_rung(&mut backoff, bell, rung, INFERENCE_DOZE, spin);
                continue;
            }
        };
        backoff.after_poll(true);
        batch.clear();
        batch.extend(queue.drain(..n));
        // When the answers should be out, for the if-manager's doze.
        let idle = engine_free_since.map_or(Duration::MAX, |t| {
            Duration::from_nanos(now.saturating_sub(t))
        });
        let predicted = policy
            .cost_model()
            .map(|m| policy.predicted_ns(&m, n) as u64);
        if let Some(p) = predicted {
            let (open, close) = answer_window.window(kp_os::affinity::monotonic_ns(), p, idle);
            control.set_answer_window(open, close);
        }
        let cpu_started = if on_calling_thread {
            kp_os::affinity::thread_cpu_ns()
        } else {
            0
        };
        let started = now_ns();
        let result = if in_place {
            counters.in_place_batches += 1;
            slot_ids.clear();
            // The batch's buffers are held (in `batch`) until its answers
            // are out: nothing writes those slots while the engine reads.
            slot_ids.extend(batch.iter().map(|r| r.buf.index() as u32));
            engine.infer_slots(&slot_ids, &mut output[..n * cfg.output_elems])
        } else if layout.is_raw() {
            // Raw images for an engine that wants its input: normalised
            // here, on the inference thread (`kp-if --convert-on
            // inference`), through the fragment path's own table.
            counters.normalised_batches += 1;
            let per = layout.input_elems();
            if gather.len() < n * per {
                gather.resize(n * per, 0.0); // grows to the largest batch once
            }
            let input = &mut gather[..n * per];
            for (r, out) in batch.iter().zip(input.chunks_exact_mut(per)) {
                layout.normalise_raw(&r.buf, out); // writes every value
            }
            engine.infer_batch(input, n, &mut output[..n * cfg.output_elems])
        } else {
            match span.join(batch.iter().map(|r| &r.buf)) {
                Some(input) => {
                    counters.contiguous_batches += 1;
                    engine.infer_batch(input, n, &mut output[..n * cfg.output_elems])
                }
                None => {
                    counters.gathered_batches += 1;
                    gather.clear();
                    for r in &batch {
                        gather.extend_from_slice(&r.buf);
                    }
                    engine.infer_batch(&gather, n, &mut output[..n * cfg.output_elems])
                }
            }
        };
        let finished = now_ns();
        let exec_ns = finished.saturating_sub(started);
        // Of which on the CPU (the rest: preempted, by the fragment thread
        // on a shared core); `None` without a CPU clock to read.
        let batch_cpu_ns =
            on_calling_thread.then(|| kp_os::affinity::thread_cpu_ns().saturating_sub(cpu_started));
        if let Some(p) = predicted {
            answer_window.record(p, exec_ns, idle);
        }
        engine_free_since = Some(finished);
        let mut worst = 0;
        let mut answers = answerer.burst(n);
        for (i, r) in batch.iter().enumerate() {
            let latency = latency_us(r.first_seen_ns, finished);
            worst = worst.max(finished.saturating_sub(r.first_seen_ns));
            let (status, sent) = match &result {
                Ok(()) => {
                    let row = &output[i * cfg.output_elems..(i + 1) * cfg.output_elems];
                    let kk = top_k(row, k, &mut best);
                    (
                        Status::Ok,
                        answers.ok(&r.reply, &best[..kk], n as u16, latency),
                    )
                }
                Err(_) => (
                    Status::Internal,
                    answers.error(&r.reply, Status::Internal, latency),
                ),
            };
            counters.send_failed += u64::from(sent.is_err());
            telemetry.on_answer(status, u64::from(latency), finished);
        }
        // One bulk allocation (above) and one burst on the TX ring; the
        // answered requests leave the ledger before the doorbell wakes the
        // if-manager.
        counters.send_failed += answers.send_then(|| {
            for r in &batch {
                ledger.clear(r.slot.index());
            }
        }) as u64;
        control.clear_answer_window();
        if let Some(t) = trace.as_deref_mut() {
            let sent = now_ns();
            let status = if result.is_ok() {
                Status::Ok
            } else {
                Status::Internal
            };
            let cpu = batch_cpu_ns.unwrap_or(0);
            for r in &batch {
                t.record(span_of(r, status, n as u16, (started, finished, cpu), sent));
            }
        }
        for r in batch.drain(..) {
            give_back(returned, r);
        }
        if let Err(e) = &result {
            counters.engine_errors += 1;
            tracing::error!("kp-if: inference failed on a batch of {n}: {e}");
        }
        telemetry.on_batch(n, exec_ns / 1000);
        // One system call per batch: next to a batch, nothing.
        telemetry.on_inference_cpu(kp_os::affinity::thread_cpu_ns() - cpu_base);
        // Refusals while the batch ran count for the admission limit set
        // below, not only for the next shedding.
        policy.note_refused(admission.refused_ns.load(Ordering::Relaxed));
        let on_cpu_ns = batch_cpu_ns.unwrap_or(exec_ns);
        let report = policy.on_batch_done_on_cpu(n, exec_ns, on_cpu_ns, worst, finished);
        match report {
            Some(ProvisioningReport::Under { .. }) => counters.under_reports += 1,
            Some(ProvisioningReport::Over { .. }) => counters.over_reports += 1,
            None => {}
        }
        if let (Some(report), Some(publish)) = (report, publish) {
            publish(&Publication::Provisioning { report });
        }
        latest_batching.store(policy.stats().to_words());
        admission.limit.store(
            policy.admission_limit().unwrap_or(usize::MAX),
            Ordering::Relaxed,
        );
        if let Some(d) = engine.device_stats() {
            latest_device.store(&d);
        }
    }
}

/// Admission, between the two threads: the batching policy's limit, set by
/// the inference thread after each batch for the fragment thread's
/// reassembler (`Reassembler::set_handed_limit`), and when the fragment
/// thread last answered a new request OVERLOADED (0: never), which the
/// policy counts as pressure (`BatchPolicy::note_refused`): it does not
/// see those requests otherwise.
#[derive(Debug)]
struct Admission {
    limit: AtomicUsize,
    refused_ns: AtomicU64,
}

impl Default for Admission {
    fn default() -> Self {
        Admission {
            limit: AtomicUsize::new(usize::MAX),
            refused_ns: AtomicU64::new(0),
        }
    }
}

/// Takes back the slots of answered requests from the inference thread:
/// free again for new requests, and no longer counted against the
/// admission limit. An empty queue costs a load or two.
fn take_back_slots<'p>(
    returned: &ArrayQueue<Returned<'p>>,
    reassembler: &mut Reassembler,
    slots: &mut [Option<SlotBuf<'p>>],
) {
    while let Some(r) = returned.pop() {
        let _ = reassembler.release(r.slot);
        slots[r.slot.index()] = Some(r.buf);
    }
}

/// A request is answered (its answer is on the TX ring and it left the
/// ledger in `send_then`): its slot goes back to the fragment thread.
fn give_back<'p>(returned: &ArrayQueue<Returned<'p>>, r: Ready<'p>) {
    // Cannot be full: it holds at most one entry per slot.
    let _ = returned.push(Returned {
        slot: r.slot,
        buf: r.buf,
    });
}

/// What the fragment thread knows when its poll found nothing more to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct FragmentIdle {
    /// It polls its own ring as the active IF (the if-manager rings it).
    own_ring: bool,
    /// It may run on the inference thread's core.
    shares_core: bool,
    /// The inference thread dozes: the engine has nothing to run.
    engine_dozing: bool,
    /// A request is incomplete and its latest fragment came less than
    /// [`SPIN_ASSEMBLING`] ago.
    assembling: bool,
}

/// What the fragment thread does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FragmentStep {
    Poll,
    Pause,
    Doze,
    Sleep(Duration),
}

impl FragmentIdle {
    /// The back-off's `action`, adjusted to who else needs the core. On a
    /// core it shares with a running engine, the thread dozes as soon as
    /// its ring is empty instead of spinning first: the if-manager rings it
    /// at the next request's edges, and the engine keeps the core (its
    /// polls and wake-ups cost the engine ~1.5 against ~1.2 µs per fragment
    /// of CPU under saturation). With the engine asleep and a request
    /// arriving, it keeps polling past the back-off's first sleep
    /// ([`SPIN_ASSEMBLING`]): the core has nothing better to do, and the
    /// request's fragments pass through as they come.
    fn next(self, action: IdleAction) -> FragmentStep {
        match action {
            IdleAction::Poll => FragmentStep::Poll,
            IdleAction::Pause if self.own_ring && self.shares_core && !self.engine_dozing => {
                FragmentStep::Doze
            }
            IdleAction::Pause => FragmentStep::Pause,
            IdleAction::Sleep(_) if self.assembling && self.engine_dozing => FragmentStep::Pause,
            IdleAction::Sleep(_) if self.own_ring => FragmentStep::Doze,
            IdleAction::Sleep(d) => FragmentStep::Sleep(d),
        }
    }
}

/// An idle poll of the inference thread: the back-off's spins first, then,
/// where it would sleep by the clock, a doze on `bell` that the next
/// completed request ends (or `longest`); while it `spin`s after its last
/// batch (`--inference-spin-ms`), a pause and no back-off.
fn idle_until_rung(
    backoff: &mut IdleBackoff,
    bell: Doorbell<'_>,
    rung: u64,
    longest: Duration,
    spin: bool,
) {
    if spin {
        std::hint::spin_loop();
        return;
    }
    match backoff.after_poll(false) {
        IdleAction::Poll => {}
        IdleAction::Pause => std::hint::spin_loop(),
        IdleAction::Sleep(_) => bell.doze(rung, longest),
    }
}

/// A request's trace record, answered with `status` after its batch of `n`
/// ran from `start` to `end` and its answer was sent at `sent`.
fn span_of(
    r: &Ready<'_>,
    status: Status,
    n: u16,
    (start, end, batch_cpu_ns): (u64, u64, u64),
    sent: u64,
) -> RequestSpan {
    RequestSpan {
        request_id: r.reply.request_id,
        send_ts_ns: r.reply.send_ts_ns,
        src_port: r.reply.addr.src_port,
        status: RequestSpan::status_value(status),
        batch: n,
        first_seen_ns: r.first_seen_ns,
        complete_ns: r.complete_ns,
        start_ns: start,
        end_ns: end,
        sent_ns: sent,
        batch_cpu_ns,
    }
}

/// Answers `reply` alone with an error `status` (the fragment thread's
/// rejections, expiries and drains: before all its fragments came),
/// counted; the `slot` it held, if any, leaves the ledger, and the request
/// enters its early answers, once the answer is on the TX ring and before
/// the doorbell wakes the if-manager.
#[allow(clippy::too_many_arguments)]
fn answer_alone(
    answerer: &Answerer,
    ledger: &Ledger,
    reply: &ReplyTo,
    status: Status,
    first_seen_ns: u64,
    slot: Option<SlotId>,
    now: u64,
    counters: &mut DriverCounters,
    telemetry: &mut TelemetryWriter<'_>,
) {
    let latency = latency_us(first_seen_ns, now);
    let sent = answerer.error_then(reply, status, latency, || {
        if let Some(slot) = slot {
            ledger.clear(slot.index());
        }
        ledger.answered_early(&reply.key());
    });
    counters.send_failed += u64::from(sent.is_err());
    telemetry.on_answer(status, u64::from(latency), now);
}

fn latency_us(first_seen_ns: u64, now_ns: u64) -> u32 {
    (now_ns.saturating_sub(first_seen_ns) / 1000).min(u64::from(u32::MAX)) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fragment_thread_spins_only_on_a_core_the_engine_leaves_idle() {
        let d = Duration::from_micros(10);
        let (poll, pause, sleep) = (IdleAction::Poll, IdleAction::Pause, IdleAction::Sleep(d));
        use FragmentStep::{Doze, Pause, Poll, Sleep};
        // (own_ring, shares_core, engine_dozing, assembling), the back-off's
        // action -> what the thread does.
        let cases = [
            // Work found: poll again, whatever else holds.
            ((true, true, false, true), poll, Poll),
            // Ring empty, the engine running on our core: give it the core.
            ((true, true, false, false), pause, Doze),
            ((true, true, false, true), pause, Doze),
            // ... but spin first on a core of our own, or with the engine idle.
            ((true, false, false, false), pause, Pause),
            ((true, true, true, false), pause, Pause),
            // A request arriving with the engine asleep: keep polling.
            ((true, true, true, true), sleep, Pause),
            ((true, false, true, true), sleep, Pause),
            // Otherwise the back-off's sleep becomes a doze on our own ring ...
            ((true, true, false, true), sleep, Doze),
            ((true, true, true, false), sleep, Doze),
            // ... and stays a sleep on a ring nobody rings for us (a hand-back
            // ring, a parked or draining IF).
            ((false, true, false, false), sleep, Sleep(d)),
            ((false, true, false, false), pause, Pause),
        ];
        for ((own_ring, shares_core, engine_dozing, assembling), action, want) in cases {
            let idle = FragmentIdle {
                own_ring,
                shares_core,
                engine_dozing,
                assembling,
            };
            assert_eq!(idle.next(action), want, "{idle:?} {action:?}");
        }
    }
}
