//! What a poll loop does when a poll finds nothing.
//!
//! A poll-mode driver that spins on an empty queue burns a whole core; on a
//! 2-core machine that is half the box, taken from the inference functions.
//! The if-manager's RX loop and an inference function's ring consumer both
//! use it.
//! [`IdleBackoff`] escalates: first it keeps polling (with a CPU `pause`
//! between polls, which costs nothing in latency), then it sleeps for short,
//! doubling intervals up to a cap. Any packet resets it.
//!
//! The numbers: 256 empty polls of ~100 ns each keep a burst that is merely
//! bursty (gaps under ~25 µs) on the fast path; then the sleeps start at
//! 10 µs and double up to a cap. With the 500 µs cap a packet that arrives
//! on a platform idle for more than ~1 ms waits at most ~500 µs plus timer
//! slack. Measured
//! on the AMD VM (2 vCPUs), an idle if-manager then used 5.7% of a core
//! (each wake from a sleep costs tens of µs of CPU on a VM), and with a
//! 200 µs cap 9.6%; 1.3% on the Intel VM. The cap trades idle CPU against
//! first-packet latency, so the if-manager's receiving loop
//! ([`IdleBackoff::receiver`]) sets it by how recent the traffic is: 200 µs
//! ([`TRAFFIC_MAX_SLEEP`]) until it has slept [`QUIET_AFTER`] (10 s) without
//! work, 500 µs on a quiet port. The gaps between requests at light load
//! cost the shorter sleeps' wake-ups; a port with no traffic costs what it
//! did. The RX ring (1024 descriptors by default) absorbs
//! 500 µs of traffic at up to 2 Mpps, so a sleep does not lose packets on
//! a NIC; with net_af_packet the kernel's ring absorbs it. `--busy-poll`
//! disables all of this for benchmarks and latency-critical deployments.
//!
//! An active IF's fragment thread follows the back-off only until its first
//! sleep: where the back-off says sleep, it dozes on its ring's doorbell
//! instead (`runtime::handover::Doorbell`), which the if-manager rings at a
//! request's first and last fragment. A clock-driven sleep woke it dozens
//! of times per request for fragments that complete nothing (~3 µs of CPU
//! per fragment against ~0.8 µs with the doorbell: docs/PERFORMANCE-JOURNAL.md).
//! On a core it shares with the engine it also weighs who needs the core
//! (`runtime::FragmentIdle`): while a batch runs it dozes as soon as its
//! ring is empty, and while the engine sleeps and a request is arriving it
//! keeps polling (`runtime::succession::SPIN_ASSEMBLING`).
//!
//! The if-manager's sleeps are dozes on the TX ring's doorbell
//! (`runtime::handover::TxBell`) for the same time: an IF's answers end
//! them, so an answer does not wait for the sleep (up to the 500 µs cap)
//! to end; received packets still do. Where an IF says when its running
//! batch should end (`IfControl::set_answer_window`: a window, from the IF's
//! own record of how far its batches end from their prediction,
//! [`AnswerWindow`]), the doze ends [`ANSWER_LEAD`] before the window
//! opens and the if-manager polls until it closes
//! ([`doze_before_answers`]): the wake-up is then not on the answers' way
//! out, and the polling lasts only as long as the engine's own spread.
//!
//! The sleeps end up to the thread's timer slack late: 50 µs by default,
//! so the 10 µs first sleep lasts up to 60 µs. `if-manager
//! --timer-slack-us 1` makes them exact, which on a core shared with
//! other work lets a request's fragments wait less in the kernel's ring,
//! at the price of more wake-ups under load (docs/PERFORMANCE-JOURNAL.md, "After
//! the last fragment").
//!
//! The if-manager does not pay for that where the engine is busy: it
//! makes its sleeps exact only while the tail of a request is arriving
//! for an idle engine ([`ArrivalWatch`], [`sleep_slack`]): its last fragment
//! then waits at most the back-off's own short sleep, where the engine
//! would otherwise sit idle for the timer slack; under load, when a
//! request would queue behind a running batch anyway, the sleeps keep the
//! thread's own slack and its fewer wake-ups.
//!
//! Sans-IO: it returns what to do; the driver does it.

use std::time::Duration;

/// Empty polls (with `pause`) before the first sleep.
pub const SPIN_POLLS: u32 = 256;
/// First sleep.
pub const MIN_SLEEP: Duration = Duration::from_micros(10);
/// Longest sleep.
pub const MAX_SLEEP: Duration = Duration::from_micros(500);

/// Longest sleep of a receiving loop ([`IdleBackoff::receiver`]) while
/// traffic is recent: a request whose fragments all arrive within one
/// sleep waits for the rest of it, then for its whole reassembly, so the
/// cap bounds the tail of the latency at light load. With [`MAX_SLEEP`]
/// that tail was 535–890 µs after the last fragment at 10% load on the
/// Intel VM; with this cap the p99 of last fragment → answer − own
/// engine time there went from 602–634 to 476–560 µs (three pairs of
/// runs), and a cap of 100 µs gave no less (468–632 µs): what remains of
/// the tail is not the sleeps (docs/PERFORMANCE-JOURNAL.md, 1 December).
pub const TRAFFIC_MAX_SLEEP: Duration = Duration::from_micros(200);

/// How long a receiving loop sleeps without work before it counts the
/// port as quiet and lets its sleeps grow to [`MAX_SLEEP`]: longer than
/// the gaps between requests of a lightly loaded model (resnet50 at 10% of
/// its capacity on 2 vCPUs: ~1.3 requests/s, 99% of the gaps under 3.5 s).
pub const QUIET_AFTER: Duration = Duration::from_secs(10);

/// How long before an inference function's answers may come a poll loop
/// that waits for them stops dozing: the doze's own lateness (the timer
/// slack, 50 µs by default, and the wake-up).
pub const ANSWER_LEAD: Duration = Duration::from_micros(60);

/// How long past the end of an answer window (or past a due time given
/// without one) the loop keeps polling before it dozes again; a batch that
/// runs longer rings the doorbell when done.
pub const ANSWER_SPIN_MAX: Duration = Duration::from_micros(50);

/// The window an IF gives before it has seen enough batches end
/// ([`AnswerWindow`]): this long before the predicted end to
/// [`WINDOW_AFTER_DEFAULT`] after it. On the VM, squeezenet's warm batches
/// of 1 ended within −92..+54 µs of a running mean half the time and
/// −190..+151 µs 80% of the time.
pub const WINDOW_BEFORE_DEFAULT: Duration = Duration::from_micros(100);
/// See [`WINDOW_BEFORE_DEFAULT`].
pub const WINDOW_AFTER_DEFAULT: Duration = Duration::from_micros(250);

/// The widest window an IF gives: past it the polling would cost more
/// CPU than the wake-up it saves is worth. The if-manager's core is
/// shared (with the fragment threads as designed, with the client in
/// bench-if), and a poll of a millisecond saves a wake-up of tens of µs.
pub const WINDOW_MAX: Duration = Duration::from_millis(1);

/// Whether an idle inference thread keeps spinning on its core instead of
/// following the back-off: for `window` after its last batch ended
/// (`last_batch_end_ns`, `None` before the first batch: a shadow that
/// never ran one, or an IF before its traffic, dozes as before).
///
/// A batch that follows the thread's sleep runs slower than one that
/// follows a spin: the engine alone, squeezenet batch 1 on the AMD VM,
/// took 28.7–31.3 ms after 50 ms asleep against 21.0–21.4 ms after 50 ms
/// spinning (21.7 back to back). Inside kp-if, in eight alternated pairs
/// at a quarter of its capacity, the engine's own time per batch was a
/// median 15% above the engine alone with the thread dozing and 3%
/// spinning (spreads overlapping: the VM drifts as much), and at one
/// request outstanding a complete request's batch started 7–10 µs after
/// it was complete rather than 58–83 µs (docs/PERFORMANCE-JOURNAL.md,
/// 2 December, fourth). Spinning holds the inference core at 100% while
/// traffic is recent, so it is for an IF whose inference cores are its
/// own (`kp-if --inference-spin-ms`; 0, the default, never spins); after
/// `window` without a batch it dozes again, and so does an IF draining to
/// its successor (libml's inference loop).
pub fn spins_while_idle(window: Duration, last_batch_end_ns: Option<u64>, now_ns: u64) -> bool {
    last_batch_end_ns.is_some_and(|end| Duration::from_nanos(now_ns.saturating_sub(end)) < window)
}

/// What a poll loop does where the back-off says sleep, given when an
/// inference function's answers are due ([`doze_before_answers`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdleWait {
    /// Doze this long (on a doorbell that an answer also rings).
    Doze(Duration),
    /// Keep polling: answers are due.
    Poll,
}

/// The back-off's `sleep` for a loop that sends inference functions'
/// answers, shortened so that it is polling, not dozing, while some IF's
/// answers are due: from [`ANSWER_LEAD`] before a window `(open, close)`
/// (monotonic ns, `IfControl::answer_window`; open 0: no batch runs)
/// until [`ANSWER_SPIN_MAX`] after it closes. Waking a dozing if-manager
/// through the TX doorbell costs the inference thread a futex wake and the
/// answer the if-manager's wake-up: ~50 µs on a VM (docs/PERFORMANCE-JOURNAL.md).
/// A window long past is ignored (the batch runs long, or the hint is
/// stale): its answers ring the doorbell.
pub fn doze_before_answers(
    sleep: Duration,
    now_ns: u64,
    windows: impl IntoIterator<Item = (u64, u64)>,
) -> IdleWait {
    let lead = ANSWER_LEAD.as_nanos() as u64;
    let after = ANSWER_SPIN_MAX.as_nanos() as u64;
    let mut doze = sleep;
    for (open, close) in windows {
        if open == 0 {
            continue;
        }
        // A window read without its end (a torn read of the two words)
        // closes when it opens.
        let close = close.max(open);
        if now_ns > close.saturating_add(after) {
            continue;
        }
        let wake = open.saturating_sub(lead);
        if now_ns >= wake {
            return IdleWait::Poll;
        }
        doze = doze.min(Duration::from_nanos(wake - now_ns));
    }
    IdleWait::Doze(doze)
}

/// How many recent batch ends [`AnswerWindow`] remembers per kind.
const WINDOW_SAMPLES: usize = 32;
/// Batches of a kind seen before [`AnswerWindow`] trusts its record.
const WINDOW_MIN_SAMPLES: usize = 8;
/// An engine idle this long before a batch starts it cold: its caches
/// and the CPU's clocks have moved on, and it runs 16–22% slower than
/// back to back (kp-engine-bench `--gap-ms`, docs/PERFORMANCE-JOURNAL.md).
pub const COLD_AFTER: Duration = Duration::from_millis(1);

/// An IF's record of how far its batches end from the policy's
/// prediction, for the window it publishes around each batch's end
/// (`IfControl::set_answer_window`). Batches that start on an engine that
/// idled ([`COLD_AFTER`]) and those that run back to back spread
/// differently (on the VM: ±600 µs against ±150 µs for squeezenet's
/// batch of 1), so each kind keeps its own record: the last
/// `WINDOW_SAMPLES` errors relative to the prediction. The window runs from
/// the 10th to the 90th percentile of those, at most [`WINDOW_MAX`] wide;
/// before a kind has [`WINDOW_MIN_SAMPLES`] it is the default span
/// ([`WINDOW_BEFORE_DEFAULT`], [`WINDOW_AFTER_DEFAULT`]).
///
/// Sans-IO and allocation-free: the inference thread calls
/// [`window`](Self::window) before each batch and
/// [`record`](Self::record) after it.
#[derive(Clone, Debug)]
pub struct AnswerWindow {
    kinds: [ErrorRecord; 2],
}

#[derive(Clone, Debug)]
struct ErrorRecord {
    /// (actual − predicted) / predicted, newest at `next - 1`.
    errors: [f32; WINDOW_SAMPLES],
    next: usize,
    len: usize,
}

impl ErrorRecord {
    const EMPTY: ErrorRecord = ErrorRecord {
        errors: [0.0; WINDOW_SAMPLES],
        next: 0,
        len: 0,
    };

    fn push(&mut self, e: f32) {
        self.errors[self.next] = e;
        self.next = (self.next + 1) % WINDOW_SAMPLES;
        self.len = (self.len + 1).min(WINDOW_SAMPLES);
    }

    /// The 10th and 90th percentiles (nearest rank), if enough are known.
    fn spread(&self) -> Option<(f32, f32)> {
        if self.len < WINDOW_MIN_SAMPLES {
            return None;
        }
        let mut sorted = self.errors;
        let sorted = &mut sorted[..self.len];
        sorted.sort_unstable_by(f32::total_cmp);
        let rank = |q: f32| sorted[((q * self.len as f32).ceil() as usize).clamp(1, self.len) - 1];
        Some((rank(0.1), rank(0.9)))
    }
}

impl Default for AnswerWindow {
    fn default() -> Self {
        Self::new()
    }
}

impl AnswerWindow {
    /// An empty record: default windows until batches end.
    pub fn new() -> Self {
        AnswerWindow {
            kinds: [ErrorRecord::EMPTY, ErrorRecord::EMPTY],
        }
    }

    fn kind(idle: Duration) -> usize {
        usize::from(idle >= COLD_AFTER)
    }

    /// When a batch predicted to take `predicted_ns`, starting at
    /// `start_ns` on an engine idle for `idle`, should end: `(open,
    /// close)`, monotonic ns, `0 < open <= close`.
    pub fn window(&self, start_ns: u64, predicted_ns: u64, idle: Duration) -> (u64, u64) {
        let end = start_ns.saturating_add(predicted_ns);
        let (before, after) = match self.kinds[Self::kind(idle)].spread() {
            Some((lo, hi)) => {
                let p = predicted_ns as f64;
                let before = (-(lo as f64) * p).round() as i64;
                let after = ((hi as f64) * p).round() as i64;
                (before, after)
            }
            None => (
                WINDOW_BEFORE_DEFAULT.as_nanos() as i64,
                WINDOW_AFTER_DEFAULT.as_nanos() as i64,
            ),
        };
        // Never 0, which says that no batch runs.
        let open = offset(end, -before).max(1);
        let close = offset(end, after).max(open);
        let max = WINDOW_MAX.as_nanos() as u64;
        if close - open <= max {
            return (open, close);
        }
        // Too wide: the part of it nearest the predicted end.
        let open = end.saturating_sub(max / 2).clamp(open, close - max);
        (open, open + max)
    }

    /// A batch predicted to take `predicted_ns` on an engine idle for
    /// `idle` took `actual_ns`.
    pub fn record(&mut self, predicted_ns: u64, actual_ns: u64, idle: Duration) {
        if predicted_ns == 0 {
            return;
        }
        let e = (actual_ns as f64 - predicted_ns as f64) / predicted_ns as f64;
        self.kinds[Self::kind(idle)].push(e as f32);
    }
}

fn offset(t: u64, by: i64) -> u64 {
    if by >= 0 {
        t.saturating_add(by as u64)
    } else {
        t.saturating_sub(by.unsigned_abs())
    }
}

/// How long after a request's latest fragment, if that was not its last,
/// the request counts as still arriving ([`ArrivalWatch`]): a client
/// sends a request's fragments back to back, so a gap this long means a
/// slow or lossy sender, for which exact sleeps buy nothing.
pub const ARRIVING_FOR: Duration = Duration::from_micros(200);

/// How many fragments before a request's last the [`ArrivalWatch`] starts
/// to count it as arriving: only the sleep its last fragment comes in
/// delays the engine, so the exact sleeps (and their wake-ups) are kept to
/// the request's tail. On the VM a client sharing the if-manager's core
/// sent ~9 fragments per default sleep; exact sleeps through whole
/// 147-fragment requests took a third of that core at one request
/// outstanding and slowed such a client's sending threefold
/// (docs/PERFORMANCE-JOURNAL.md).
pub const ARRIVING_TAIL: u16 = 32;

/// The timer slack of a poll loop's sleeps while a request arrives for an
/// idle engine ([`sleep_slack`]): exact, so that its last fragment waits
/// for the back-off's sleep alone, not for the kernel's 50 µs of slack
/// as well.
pub const HURRY_SLACK: Duration = Duration::from_micros(1);

/// Whether a request is arriving: its latest fragment came less than
/// [`ARRIVING_FOR`] ago, was not its last, and was one of the last
/// [`ARRIVING_TAIL`] before it. Requests interleave, so this follows the
/// latest fragment of any of them: a request whose last fragment ends the
/// watch while another is still arriving starts it again at that one's
/// next fragment in its tail. Sans-IO, times in the driver's ns.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ArrivalWatch {
    partial_at_ns: Option<u64>,
}

impl ArrivalWatch {
    /// A fragment was taken at `now_ns`, `remaining` fragments before its
    /// request's last (0: it is the last; a request of one fragment is its
    /// own last).
    #[inline]
    pub fn fragment(&mut self, now_ns: u64, remaining: u16) {
        self.partial_at_ns = (remaining > 0 && remaining <= ARRIVING_TAIL).then_some(now_ns);
    }

    /// Whether a request is arriving at `now_ns`.
    pub fn arriving(&self, now_ns: u64) -> bool {
        self.partial_at_ns
            .is_some_and(|t| now_ns.saturating_sub(t) < ARRIVING_FOR.as_nanos() as u64)
    }
}

/// The timer slack a poll loop's next sleep should have: [`HURRY_SLACK`]
/// while a request is arriving and no engine runs a batch (the request's
/// engine waits for its last fragment), else the thread's own `base`
/// (`--timer-slack-us`, or the kernel's 50 µs): a request that will queue
/// behind a running batch gains nothing from an exact sleep, and under load
/// exact sleeps cost the loop's core several times the wake-ups
/// (docs/PERFORMANCE-JOURNAL.md). Never more than `base`.
pub fn sleep_slack(arriving: bool, engine_busy: bool, base: Duration) -> Duration {
    if arriving && !engine_busy {
        HURRY_SLACK.min(base)
    } else {
        base
    }
}

/// What to do after a poll.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdleAction {
    /// Poll again at once.
    Poll,
    /// Execute a CPU pause hint, then poll.
    Pause,
    /// Sleep this long, then poll.
    Sleep(Duration),
}

/// Escalating back-off over consecutive empty polls.
///
/// A receiving loop's back-off ([`receiver`](Self::receiver)) caps its
/// sleeps by how recent the traffic is: at [`TRAFFIC_MAX_SLEEP`] until it
/// has slept [`QUIET_AFTER`] in all without work, at [`MAX_SLEEP`] after
/// that and before any work at all. A port with no traffic costs what it
/// did (bench-idle); between the requests of a lightly loaded model the
/// sleeps stay short, at the price of more wake-ups in those gaps. The
/// time is the sum of the sleeps it returned, so it needs no clock (the
/// sleeps run late by the timer slack: the port counts as quiet a little
/// later than `QUIET_AFTER`).
#[derive(Clone, Debug)]
pub struct IdleBackoff {
    busy_poll: bool,
    empty_polls: u32,
    sleep: Duration,
    /// The cap while traffic is recent (`MAX_SLEEP`: no traffic cap).
    traffic_cap: Duration,
    /// Sleeps returned since the last work, up to `QUIET_AFTER`.
    slept: Duration,
}

impl IdleBackoff {
    /// A back-off; with `busy_poll` it never pauses or sleeps.
    pub fn new(busy_poll: bool) -> Self {
        IdleBackoff {
            busy_poll,
            empty_polls: 0,
            sleep: MIN_SLEEP,
            traffic_cap: MAX_SLEEP,
            slept: QUIET_AFTER,
        }
    }

    /// The back-off of a loop that receives requests (the if-manager's RX
    /// loop): its sleeps are capped at [`TRAFFIC_MAX_SLEEP`] while traffic
    /// is recent (see the type's documentation).
    pub fn receiver(busy_poll: bool) -> Self {
        IdleBackoff {
            traffic_cap: TRAFFIC_MAX_SLEEP,
            ..Self::new(busy_poll)
        }
    }

    /// Tells the back-off whether the last poll did any work, and returns
    /// what to do next.
    pub fn after_poll(&mut self, did_work: bool) -> IdleAction {
        if did_work || self.busy_poll {
            self.empty_polls = 0;
            self.sleep = MIN_SLEEP;
            self.slept = Duration::ZERO;
            return IdleAction::Poll;
        }
        if self.empty_polls < SPIN_POLLS {
            self.empty_polls += 1;
            return IdleAction::Pause;
        }
        let cap = if self.slept < QUIET_AFTER {
            self.traffic_cap
        } else {
            MAX_SLEEP
        };
        let this = self.sleep.min(cap);
        self.slept = (self.slept + this).min(QUIET_AFTER);
        self.sleep = (this * 2).min(MAX_SLEEP);
        IdleAction::Sleep(this)
    }

    /// True once the loop has started sleeping (used to refresh the clock
    /// after every sleep rather than every N polls).
    pub fn is_sleeping(&self) -> bool {
        self.empty_polls >= SPIN_POLLS
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sleeps_are_exact_only_while_a_request_arrives_for_an_idle_engine() {
        let us = |n: u64| n * 1_000;
        let base = Duration::from_micros(50);
        let mut watch = ArrivalWatch::default();
        // Nothing arrived yet.
        assert!(!watch.arriving(us(10)));
        // The head of a long request: not yet.
        watch.fragment(us(50), 146);
        assert!(!watch.arriving(us(50)));
        watch.fragment(us(60), ARRIVING_TAIL + 1);
        assert!(!watch.arriving(us(60)));
        // Its tail: arriving for ARRIVING_FOR after each fragment.
        watch.fragment(us(100), ARRIVING_TAIL);
        assert!(watch.arriving(us(100)));
        assert!(watch.arriving(us(299)));
        assert!(!watch.arriving(us(300)), "a sender silent for 200 µs");
        // Each further fragment extends it; the last ends it at once.
        watch.fragment(us(290), 1);
        assert!(watch.arriving(us(489)));
        watch.fragment(us(300), 0);
        assert!(!watch.arriving(us(301)));
        // A request of one fragment never starts it; one of two does.
        watch.fragment(us(400), 0);
        assert!(!watch.arriving(us(400)));
        watch.fragment(us(410), 1);
        assert!(watch.arriving(us(410)));
        // Another request's head ends the watch, until its own tail.
        watch.fragment(us(420), 100);
        assert!(!watch.arriving(us(420)));
        // A clock read before the fragment's (a stale loop clock) is not
        // a gap.
        watch.fragment(us(500), 3);
        assert!(watch.arriving(us(499)));

        assert_eq!(sleep_slack(true, false, base), HURRY_SLACK);
        assert_eq!(sleep_slack(true, true, base), base, "it would queue anyway");
        assert_eq!(sleep_slack(false, false, base), base, "nothing arriving");
        assert_eq!(sleep_slack(false, true, base), base);
        // Never looser than the thread's own slack.
        assert_eq!(sleep_slack(true, false, Duration::ZERO), Duration::ZERO);
    }

    #[test]
    fn dozes_until_shortly_before_an_answer_window_then_polls_through_it() {
        let us = |n: u64| Duration::from_micros(n);
        let t = 1_000_000_000u64; // now
        let sleep = us(500);
        // No batch running: the back-off's sleep.
        assert_eq!(doze_before_answers(sleep, t, []), IdleWait::Doze(sleep));
        assert_eq!(
            doze_before_answers(sleep, t, [(0, 0)]),
            IdleWait::Doze(sleep)
        );
        // Opens in 5 ms: the sleep is shorter anyway.
        assert_eq!(
            doze_before_answers(sleep, t, [(t + 5_000_000, t + 5_400_000)]),
            IdleWait::Doze(sleep)
        );
        // Opens in 400 µs: doze until the lead (60 µs) before.
        assert_eq!(
            doze_before_answers(sleep, t, [(t + 400_000, t + 900_000)]),
            IdleWait::Doze(us(340))
        );
        // Within the lead, open, or closed less than 50 µs ago: poll.
        for (open, close) in [
            (t + 60_000, t + 100_000),
            (t + 1, t + 1),
            (t - 800_000, t + 100_000),
            (t - 900_000, t - 50_000),
        ] {
            assert_eq!(
                doze_before_answers(sleep, t, [(open, close)]),
                IdleWait::Poll,
                "window {open}..{close}"
            );
        }
        // Closed longer ago: the doorbell will say when it is done.
        assert_eq!(
            doze_before_answers(sleep, t, [(t - 900_000, t - 50_001)]),
            IdleWait::Doze(sleep)
        );
        // A window read without its end counts as closing when it opens.
        assert_eq!(
            doze_before_answers(sleep, t, [(t - 50_000, 0)]),
            IdleWait::Poll
        );
        assert_eq!(
            doze_before_answers(sleep, t, [(t - 50_001, 0)]),
            IdleWait::Doze(sleep)
        );
        // Several IFs: any open window polls; else the earliest opening.
        assert_eq!(
            doze_before_answers(
                sleep,
                t,
                [
                    (t - 900_000, t - 800_000),
                    (t + 300_000, t + 400_000),
                    (t + 200_000, t + 900_000)
                ]
            ),
            IdleWait::Doze(us(140))
        );
        assert_eq!(
            doze_before_answers(sleep, t, [(t + 300_000, t + 400_000), (t - 10, t + 10)]),
            IdleWait::Poll
        );
    }

    #[test]
    fn an_answer_window_spans_the_engines_own_spread_per_kind_of_batch() {
        let ms = |n: u64| n * 1_000_000;
        let warm = Duration::ZERO;
        let cold = Duration::from_millis(50);
        let start = ms(1_000);
        let mut w = AnswerWindow::new();
        // Nothing known: the default span around the predicted end.
        assert_eq!(
            w.window(start, ms(5), warm),
            (start + ms(5) - 100_000, start + ms(5) + 250_000)
        );
        // Warm batches end within ±2% of 5 ms (±100 µs); cold ones 10–30% late.
        for i in 0..40u64 {
            w.record(ms(5), ms(5) - 100_000 + (i % 21) * 10_000, warm);
            w.record(ms(5), ms(5) + 500_000 + (i % 11) * 100_000, cold);
        }
        let (open, close) = w.window(start, ms(5), warm);
        let end = start + ms(5);
        assert!(
            open >= end - 100_000 && open <= end - 60_000,
            "warm opens {}",
            open as i64 - end as i64
        );
        assert!(
            close <= end + 100_000 && close >= end + 70_000,
            "warm closes {}",
            close as i64 - end as i64
        );
        let (open, close) = w.window(start, ms(5), cold);
        assert!(
            open >= end + 500_000 && open <= end + 700_000,
            "cold opens {}",
            open as i64 - end as i64
        );
        assert!(
            close >= end + 1_300_000 && close <= end + 1_500_000,
            "cold closes {}",
            close as i64 - end as i64
        );
        // Relative: a batch predicted twice as long gets twice the span.
        let (o2, c2) = w.window(start, ms(10), warm);
        let (o1, c1) = w.window(start, ms(5), warm);
        assert!(
            ((c2 - o2) as i64 - 2 * (c1 - o1) as i64).abs() <= 2,
            "{} vs {}",
            c2 - o2,
            c1 - o1
        );
    }

    #[test]
    fn an_answer_window_is_at_most_the_widest_polling_worth_it() {
        let mut w = AnswerWindow::new();
        let idle = Duration::ZERO;
        // A 100 ms batch spreading ±20%: a 40 ms window, cut to 1 ms around
        // the predicted end.
        for i in 0..32u64 {
            w.record(100_000_000, 80_000_000 + i * 1_300_000, idle);
        }
        let start = 5_000_000_000;
        let (open, close) = w.window(start, 100_000_000, idle);
        assert_eq!(close - open, WINDOW_MAX.as_nanos() as u64);
        let end = start + 100_000_000;
        assert_eq!((open, close), (end - 500_000, end + 500_000));
        // All late by 10–12%: the window starts at its opening.
        let mut w = AnswerWindow::new();
        for i in 0..32u64 {
            w.record(100_000_000, 110_000_000 + i * 200_000, idle);
        }
        let (open, close) = w.window(start, 100_000_000, idle);
        assert!(open >= end + 10_000_000 && close == open + WINDOW_MAX.as_nanos() as u64);
        // All early by 10–15%: the window ends at its closing.
        let mut w = AnswerWindow::new();
        for i in 0..32u64 {
            w.record(100_000_000, 85_000_000 + i * 160_000, idle);
        }
        let (open, close) = w.window(start, 100_000_000, idle);
        assert!(close <= end - 10_000_000 && close == open + WINDOW_MAX.as_nanos() as u64);
        // A zero prediction is not recorded, and a start near 0 does not wrap.
        w.record(0, 5, idle);
        // (0 would say that no batch runs.)
        let (open, close) = AnswerWindow::new().window(10, 20, idle);
        assert!(open == 1 && close >= open);
    }

    #[test]
    fn spins_then_sleeps_doubling_up_to_the_cap_and_resets_on_work() {
        let mut b = IdleBackoff::new(false);
        for _ in 0..SPIN_POLLS {
            assert_eq!(b.after_poll(false), IdleAction::Pause);
        }
        let sleeps: Vec<_> = (0..7).map(|_| b.after_poll(false)).collect();
        let us: Vec<u64> = sleeps
            .iter()
            .map(|a| match a {
                IdleAction::Sleep(d) => d.as_micros() as u64,
                other => panic!("expected a sleep, got {other:?}"),
            })
            .collect();
        assert_eq!(us, [10, 20, 40, 80, 160, 320, 500]);
        assert_eq!(b.after_poll(true), IdleAction::Poll);
        assert_eq!(b.after_poll(false), IdleAction::Pause);
    }

    /// The sleeps (µs) of `n` empty polls after the spins.
    fn sleeps_us(b: &mut IdleBackoff, n: usize) -> Vec<u64> {
        for _ in 0..SPIN_POLLS {
            assert_eq!(b.after_poll(false), IdleAction::Pause);
        }
        (0..n)
            .map(|_| match b.after_poll(false) {
                IdleAction::Sleep(d) => d.as_micros() as u64,
                other => panic!("expected a sleep, got {other:?}"),
            })
            .collect()
    }

    #[test]
    fn a_receiver_sleeps_short_while_traffic_is_recent_and_long_once_the_port_is_quiet() {
        let mut b = IdleBackoff::receiver(false);
        // No traffic yet: the port is quiet, the sleeps reach MAX_SLEEP.
        assert_eq!(sleeps_us(&mut b, 7), [10, 20, 40, 80, 160, 320, 500]);
        // After work, the cap is TRAFFIC_MAX_SLEEP ...
        assert_eq!(b.after_poll(true), IdleAction::Poll);
        let short = sleeps_us(&mut b, 6);
        assert_eq!(short, [10, 20, 40, 80, 160, 200]);
        // ... until it has slept QUIET_AFTER in all without work.
        let mut slept: u64 = short.iter().sum();
        let quiet = QUIET_AFTER.as_micros() as u64;
        while slept < quiet {
            match b.after_poll(false) {
                IdleAction::Sleep(d) => {
                    assert_eq!(d, TRAFFIC_MAX_SLEEP, "after {slept} µs");
                    slept += d.as_micros() as u64;
                }
                other => panic!("expected a sleep, got {other:?}"),
            }
        }
        let after: Vec<_> = (0..3).map(|_| b.after_poll(false)).collect();
        let us = |n| IdleAction::Sleep(Duration::from_micros(n));
        assert_eq!(
            after,
            [us(400), us(500), us(500)],
            "quiet: doubling to MAX_SLEEP"
        );
        // Any work makes the traffic recent again.
        assert_eq!(b.after_poll(true), IdleAction::Poll);
        assert_eq!(*sleeps_us(&mut b, 8).last().unwrap(), 200);
        // Other loops keep MAX_SLEEP whatever the traffic.
        let mut other = IdleBackoff::new(false);
        assert_eq!(other.after_poll(true), IdleAction::Poll);
        assert_eq!(*sleeps_us(&mut other, 8).last().unwrap(), 500);
    }

    #[test]
    fn an_idle_inference_thread_spins_only_within_its_window_after_a_batch() {
        let ms = |n: u64| n * 1_000_000;
        let window = Duration::from_millis(100);
        // Before its first batch it never spins (a parked shadow).
        assert!(!spins_while_idle(window, None, ms(5)));
        // Within the window after a batch it spins, at its end it dozes.
        assert!(spins_while_idle(window, Some(ms(10)), ms(10)));
        assert!(spins_while_idle(window, Some(ms(10)), ms(109)));
        assert!(!spins_while_idle(window, Some(ms(10)), ms(110)));
        assert!(!spins_while_idle(window, Some(ms(10)), ms(5_000)));
        // A clock read before the batch's end (another thread's stamp)
        // counts as no time passed.
        assert!(spins_while_idle(window, Some(ms(10)), ms(9)));
        // A zero window (the default) never spins.
        assert!(!spins_while_idle(Duration::ZERO, Some(ms(10)), ms(10)));
        // A window beyond u64 nanoseconds does not overflow.
        assert!(spins_while_idle(Duration::MAX, Some(0), u64::MAX));
    }

    #[test]
    fn busy_poll_never_backs_off() {
        let mut b = IdleBackoff::new(true);
        for _ in 0..10_000 {
            assert_eq!(b.after_poll(false), IdleAction::Poll);
        }
    }
}
