//! What the batching policy reports: its state for telemetry
//! ([`BatchStats`]) and its provisioning verdicts ([`ProvisioningReport`]),
//! which the orchestrator's tuning loop acts on. The policy itself is
//! libml's `batching` module.

use serde::{Deserialize, Serialize};

/// Something the orchestrator should hear about, after libml's
/// `BatchConfig::report_after` successive occurrences.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ProvisioningReport {
    /// The SLO was missed at batch size 1 every time: the IF needs a larger
    /// share of the device.
    Under {
        /// Successive occurrences (= `report_after`).
        occurrences: u32,
        /// The slowest request's end-to-end latency over those batches, ns.
        worst_e2e_ns: u64,
        /// The SLO, ns.
        slo_ns: u64,
        /// When the last of them finished.
        at_ns: u64,
    },
    /// The SLO was met with room to spare and no backlog every time: the IF
    /// could do with a smaller share.
    Over {
        /// Successive occurrences (= `report_after`).
        occurrences: u32,
        /// The slowest request's end-to-end latency over those batches, ns.
        worst_e2e_ns: u64,
        /// The SLO, ns.
        slo_ns: u64,
        /// The target batch when reported.
        target_batch: usize,
        /// When the last of them finished.
        at_ns: u64,
    },
}

/// A snapshot for telemetry: plain numbers, cheap to copy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct BatchStats {
    /// The batch size the policy aims for now.
    pub target_batch: usize,
    /// Fitted fixed cost `a`, ns (0 before the first batch).
    pub a_ns: f64,
    /// Fitted per-request cost `b`, ns (0 before the first batch).
    pub b_ns: f64,
    /// Whether the current line was fitted through two or more batch sizes
    /// (or rescaled from such a fit) rather than guessed from one.
    pub fit_identified: bool,
    /// Average execution time of recent batches, ns.
    pub ewma_exec_ns: f64,
    /// Average end-to-end latency of the slowest request of recent batches,
    /// ns.
    pub ewma_e2e_ns: f64,
    /// Estimated arrival rate, requests per second.
    pub arrival_rate_per_s: f64,
    /// The largest batch dispatched now: the target within the trust region.
    pub batch_limit: usize,
    /// `Dispatch` decisions.
    pub dispatches: u64,
    /// Requests in those dispatches.
    pub dispatched_requests: u64,
    /// Dispatches that deliberately ran another size than planned: a
    /// neighbour to learn the slope, or a probe of a stale smaller size.
    pub explorations: u64,
    /// `Wait` decisions.
    pub waits: u64,
    /// Batches completed (libml's `BatchPolicy::on_batch_done` calls).
    pub batches_done: u64,
    /// Completed batches whose slowest request missed the SLO.
    pub slo_miss_batches: u64,
    /// Requests shed through libml's `BatchPolicy::shed`.
    pub shed: u64,
    /// Regime changes detected.
    pub regime_changes: u64,
    /// Under-provisioning reports issued.
    pub under_reports: u64,
    /// Over-provisioning reports issued.
    pub over_reports: u64,
    /// How much slower than predicted a batch may run: a high quantile of
    /// recent batches' measured / predicted execution time, at least 1.
    /// Deadlines (shedding, dispatch, waiting, admission) are planned with
    /// the predicted cost times this factor (libml's `batching` module). 0
    /// from an IF that does not report it.
    #[serde(default)]
    pub tail_factor: f64,
    /// Recent batches' wall time per CPU time of the engine's thread, at
    /// least 1: above 1 where the thread was preempted while its engine
    /// computed (a core shared with the fragment thread). The policy learns
    /// batch costs on the CPU clock and predicts them times this. 1 for an
    /// engine that does not compute on the calling thread (a GPU); 0 from
    /// an IF that does not report it.
    #[serde(default)]
    pub wall_per_cpu: f64,
}

impl BatchStats {
    /// Words in [`BatchStats::to_words`].
    pub const WORDS: usize = 20;

    /// The numbers as words (floats as their bits), in field order: how the
    /// inference thread hands them to the telemetry publisher
    /// (libml's `seqlock::SeqCell`).
    pub fn to_words(&self) -> [u64; Self::WORDS] {
        [
            self.target_batch as u64,
            self.a_ns.to_bits(),
            self.b_ns.to_bits(),
            u64::from(self.fit_identified),
            self.ewma_exec_ns.to_bits(),
            self.ewma_e2e_ns.to_bits(),
            self.arrival_rate_per_s.to_bits(),
            self.batch_limit as u64,
            self.dispatches,
            self.dispatched_requests,
            self.explorations,
            self.waits,
            self.batches_done,
            self.slo_miss_batches,
            self.shed,
            self.regime_changes,
            self.under_reports,
            self.over_reports,
            self.tail_factor.to_bits(),
            self.wall_per_cpu.to_bits(),
        ]
    }

    /// The inverse of [`BatchStats::to_words`].
    pub fn from_words(w: &[u64; Self::WORDS]) -> Self {
        BatchStats {
            target_batch: w[0] as usize,
            a_ns: f64::from_bits(w[1]),
            b_ns: f64::from_bits(w[2]),
            fit_identified: w[3] != 0,
            ewma_exec_ns: f64::from_bits(w[4]),
            ewma_e2e_ns: f64::from_bits(w[5]),
            arrival_rate_per_s: f64::from_bits(w[6]),
            batch_limit: w[7] as usize,
            dispatches: w[8],
            dispatched_requests: w[9],
            explorations: w[10],
            waits: w[11],
            batches_done: w[12],
            slo_miss_batches: w[13],
            shed: w[14],
            regime_changes: w[15],
            under_reports: w[16],
            over_reports: w[17],
            tail_factor: f64::from_bits(w[18]),
            wall_per_cpu: f64::from_bits(w[19]),
        }
    }
}
