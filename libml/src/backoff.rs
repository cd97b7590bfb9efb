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
//! to end; received packets still do.
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
