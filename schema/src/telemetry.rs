//! What an inference function publishes about itself: the typed telemetry
//! messages (libml's `telemetry` module records and merges the numbers).
//!
//! An IF serialises these as JSON on its telemetry socket and prints a
//! [`TelemetrySnapshot`] on exit; the orchestrator deserialises them, so a
//! renamed or missing field is a parse error it counts, never a number
//! silently read as zero.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::batching::{BatchStats, ProvisioningReport};

/// Latency of answered requests, microseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LatencySummary {
    /// Exponentially weighted mean (libml's `telemetry::EWMA_ALPHA`): what the tuning loop
    /// acts on.
    pub ewma: f64,
    /// Median since start.
    pub p50: u64,
    /// 90th percentile since start.
    pub p90: u64,
    /// 99th percentile since start.
    pub p99: u64,
    /// Largest since start.
    pub max: u64,
    /// Answers measured.
    pub count: u64,
}

/// One IF's statistics at one moment: what libml's `Telemetry::snapshot`
/// gives, what the IF publishes and prints on exit.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TelemetrySnapshot {
    /// Requests that arrived (first fragment seen).
    pub arrivals: u64,
    /// Answers by status name (`"ok"`, `"overloaded"`, ...), every status
    /// present.
    pub answers: BTreeMap<String, u64>,
    /// All answers.
    pub answers_total: u64,
    /// Batches run.
    pub batches: u64,
    /// Requests per batch, on average (0 before the first batch).
    pub mean_batch_size: f64,
    /// Arrivals per second over the last rate window.
    pub arrival_rate_per_s: f64,
    /// Answers per second over the last rate window.
    pub throughput_per_s: f64,
    /// OK answers per second from the first arrival to the last answer.
    pub mean_throughput_per_s: f64,
    /// Seconds from the first arrival to the last answer.
    pub busy_seconds: f64,
    /// Latency of the answers.
    pub latency_us: LatencySummary,
    /// Exponentially weighted mean batch execution time, microseconds.
    pub ewma_exec_us: f64,
    /// Answers OK within the SLO, of all answers (errors miss it); `None`
    /// without an SLO or before the first answer.
    pub slo_attainment: Option<f64>,
    /// Seconds since the statistics started.
    pub run_seconds: f64,
}

/// What an IF publishes on its telemetry socket, one JSON object per
/// message: who it is, and a [`Publication`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct IfMessage {
    /// The IF's id.
    pub if_id: u16,
    /// Its model's name.
    pub model: String,
    /// What it says.
    #[serde(flatten)]
    pub body: Publication,
}

/// The kinds of telemetry message (`"kind"` on the wire).
// One message a second per IF, built, sent and dropped: the size of the
// larger variant costs nothing worth a Box.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Publication {
    /// Periodic statistics.
    Telemetry {
        /// The process's mode (`"active"`, `"standby"`, ...): the
        /// orchestrator tunes on an active's numbers only.
        mode: String,
        /// The statistics.
        telemetry: TelemetrySnapshot,
        /// The batching policy's state.
        batching: BatchStats,
    },
    /// The batching policy found the IF under- or over-provisioned.
    Provisioning {
        /// What it found.
        report: ProvisioningReport,
    },
}
