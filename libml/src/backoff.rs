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
//! 10 µs and double up to a 500 µs cap. A packet that arrives on a platform
//! idle for more than ~1 ms waits at most ~500 µs plus timer slack. Measured
//! here (2-vCPU VM), an idle if-manager then uses 5.7% of a core (each wake
//! from a sleep costs tens of µs of CPU on a VM); with a 200 µs cap it used
//! 9.6%, so the cap trades idle CPU against first-packet latency after a
//! long idle spell. The RX ring (1024 descriptors by default) absorbs
//! 500 µs of traffic at up to 2 Mpps, so a sleep does not lose packets on
//! a NIC; with net_af_packet the kernel's ring absorbs it. `--busy-poll`
//! disables all of this for benchmarks and latency-critical deployments.
//!
//! An active IF's fragment thread follows the back-off only until its first
//! sleep: where the back-off says sleep, it dozes on its ring's doorbell
//! instead (`runtime::handover::Doorbell`), which the if-manager rings at a
//! request's first and last fragment. A clock-driven sleep woke it dozens
//! of times per request for fragments that complete nothing (~3 µs of CPU
//! per fragment against ~0.8 µs with the doorbell: docs/PERFORMANCE.md).
//! On a core it shares with the engine it also weighs who needs the core
//! (`runtime::FragmentIdle`): while a batch runs it dozes as soon as its
//! ring is empty, and while the engine sleeps and a request is arriving it
//! keeps polling (`runtime::succession::SPIN_ASSEMBLING`).
//!
//! The if-manager's sleeps are dozes on the TX ring's doorbell
//! (`runtime::handover::TxBell`) for the same time: an IF's answers end
//! them, so an answer does not wait for the sleep (up to the 500 µs cap)
//! to end; received packets still do. Where an IF says when its running
//! batch should end (`IfControl::set_answer_due`), the doze ends
//! [`ANSWER_LEAD`] before, and the if-manager polls until the answers come
//! ([`doze_before_answer`]): the wake-up is then not on their way out.
//!
//! The sleeps end up to the thread's timer slack late: 50 µs by default,
//! so the 10 µs first sleep lasts up to 60 µs. `if-manager
//! --timer-slack-us 1` makes them exact, which on a core shared with
//! other work lets a request's fragments wait less in the kernel's ring,
//! at the price of more wake-ups under load (docs/PERFORMANCE.md, "After
//! the last fragment").
//!
//! Sans-IO: it returns what to do; the driver does it.

use std::time::Duration;

/// Empty polls (with `pause`) before the first sleep.
pub const SPIN_POLLS: u32 = 256;
/// First sleep.
pub const MIN_SLEEP: Duration = Duration::from_micros(10);
/// Longest sleep.
pub const MAX_SLEEP: Duration = Duration::from_micros(500);

/// How long before an inference function's batch should end a poll loop
/// that waits for its answers stops dozing. The end is predicted from the
/// batch's mean cost, and batches spread around it: on the VM, squeezenet's
/// batches of 1 ended within −92..+54 µs of a running mean half the time,
/// −190..+151 µs 80% of the time. The lead covers most early ends and the
/// doze's own lateness (the timer slack, 50 µs by default); a lead of
/// 60 µs caught 45% of the answers polling.
pub const ANSWER_LEAD: Duration = Duration::from_micros(150);

/// How long past that time the loop keeps polling for the answers before
/// it dozes again (a batch that runs long rings the doorbell when done).
pub const ANSWER_SPIN_MAX: Duration = Duration::from_micros(300);

/// What a poll loop does where the back-off says sleep, given when an
/// inference function's answers are due ([`doze_before_answer`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdleWait {
    /// Doze this long (on a doorbell that an answer also rings).
    Doze(Duration),
    /// Keep polling: answers are due within [`ANSWER_LEAD`].
    Poll,
}

/// The back-off's `sleep` for a loop that sends inference functions'
/// answers, shortened so that it is polling, not dozing, when the earliest
/// running batch should end (`due_ns`, monotonic; 0: none runs). Waking
/// a dozing if-manager through the TX doorbell costs the inference thread
/// a futex wake and the answer the if-manager's wake-up: ~50 µs on a VM
/// (docs/PERFORMANCE.md). A due time more than [`ANSWER_SPIN_MAX`] past is
/// ignored (the batch runs long, or the hint is stale).
pub fn doze_before_answer(sleep: Duration, now_ns: u64, due_ns: u64) -> IdleWait {
    let lead = ANSWER_LEAD.as_nanos() as u64;
    if due_ns == 0 || now_ns > due_ns.saturating_add(ANSWER_SPIN_MAX.as_nanos() as u64) {
        return IdleWait::Doze(sleep);
    }
    let wake = due_ns.saturating_sub(lead);
    if now_ns >= wake {
        return IdleWait::Poll;
    }
    IdleWait::Doze(sleep.min(Duration::from_nanos(wake - now_ns)))
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
#[derive(Clone, Debug)]
pub struct IdleBackoff {
    busy_poll: bool,
    empty_polls: u32,
    sleep: Duration,
}

impl IdleBackoff {
    /// A back-off; with `busy_poll` it never pauses or sleeps.
    pub fn new(busy_poll: bool) -> Self {
        IdleBackoff {
            busy_poll,
            empty_polls: 0,
            sleep: MIN_SLEEP,
        }
    }

    /// Tells the back-off whether the last poll did any work, and returns
    /// what to do next.
    pub fn after_poll(&mut self, did_work: bool) -> IdleAction {
        if did_work || self.busy_poll {
            self.empty_polls = 0;
            self.sleep = MIN_SLEEP;
            return IdleAction::Poll;
        }
        if self.empty_polls < SPIN_POLLS {
            self.empty_polls += 1;
            return IdleAction::Pause;
        }
        let this = self.sleep;
        self.sleep = (self.sleep * 2).min(MAX_SLEEP);
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
    fn dozes_until_shortly_before_an_answer_is_due_then_polls_for_a_while() {
        let us = |n: u64| Duration::from_micros(n);
        let t = 1_000_000_000u64; // now
        let sleep = us(500);
        // No batch running: the back-off's sleep.
        assert_eq!(doze_before_answer(sleep, t, 0), IdleWait::Doze(sleep));
        // Due in 5 ms: the sleep is shorter anyway.
        assert_eq!(
            doze_before_answer(sleep, t, t + 5_000_000),
            IdleWait::Doze(sleep)
        );
        // Due in 400 µs: doze until 150 µs before.
        assert_eq!(
            doze_before_answer(sleep, t, t + 400_000),
            IdleWait::Doze(us(250))
        );
        // Due within the lead, now, or up to 300 µs late: poll.
        for due in [t + 150_000, t + 1, t, t - 300_000] {
            assert_eq!(
                doze_before_answer(sleep, t, due),
                IdleWait::Poll,
                "due {due}"
            );
        }
        // Longer past due: the doorbell will say when it is done.
        assert_eq!(
            doze_before_answer(sleep, t, t - 300_001),
            IdleWait::Doze(sleep)
        );
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

    #[test]
    fn busy_poll_never_backs_off() {
        let mut b = IdleBackoff::new(true);
        for _ in 0..10_000 {
            assert_eq!(b.after_poll(false), IdleAction::Poll);
        }
    }
}
