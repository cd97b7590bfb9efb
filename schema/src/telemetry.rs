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

/// Upper bounds of the latency histogram's buckets, microseconds (a
/// request's latency `l` is counted in the first bucket with `l <= bound`,
/// or in the overflow bucket past the last). Chosen for millisecond SLOs:
/// the models' SLOs are 10 to 200 ms and their batches take 1 to 100 ms, so
/// the buckets are dense from 0.5 to 100 ms (a bucket at every usual SLO:
/// 5, 10, 15, 20, 30, 50, 75, 100 ms) and sparse beyond. They are what the
/// orchestrator exposes as the Prometheus histogram's `le` buckets, so a
/// change here is a change of every dashboard's buckets.
pub const LATENCY_BOUNDS_US: [u64; 19] = [
    250, 500, 1_000, 2_000, 3_000, 5_000, 7_500, 10_000, 15_000, 20_000, 30_000, 50_000, 75_000,
    100_000, 150_000, 250_000, 500_000, 1_000_000, 2_500_000,
];

/// The latency of OK answers as bucket counts: what a Prometheus histogram
/// is made of, cumulative since the IF started (never reset).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LatencyHistogram {
    /// The buckets' upper bounds, µs ([`LATENCY_BOUNDS_US`]): sent so that
    /// a reader built with other bounds refuses the numbers rather than
    /// mislabel them.
    pub bounds_us: Vec<u64>,
    /// Answers per bucket (not cumulative): one count per bound, then the
    /// overflow bucket (`bounds_us.len() + 1` counts).
    pub counts: Vec<u64>,
    /// The sum of the latencies counted, µs.
    pub sum_us: u64,
}

impl LatencyHistogram {
    /// The index in [`LatencyHistogram::counts`] of a latency of `us`.
    pub fn bucket_of(us: u64) -> usize {
        LATENCY_BOUNDS_US.partition_point(|b| *b < us)
    }

    /// Answers counted (the sum of the counts).
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }
}

/// Upper bounds of the batch-size histogram's buckets for an IF whose
/// engine runs batches of up to `max_batch` requests: the powers of two
/// below `max_batch`, then `max_batch` itself (1, 2, 4, 8, 16, 32 for the
/// default 32; 1, 2, 4, 8, 16, 24 for 24). Powers of two because a batching
/// policy's sizes spread over orders of magnitude, and the last bucket is
/// the full batch, which a saturated IF runs all the time.
pub fn batch_size_bounds(max_batch: usize) -> Vec<u64> {
    let max = max_batch.max(1) as u64;
    let mut bounds: Vec<u64> = std::iter::successors(Some(1u64), |b| b.checked_mul(2))
        .take_while(|b| *b < max)
        .collect();
    bounds.push(max);
    bounds
}

/// The sizes of the batches an IF ran as bucket counts, cumulative since
/// the IF started: what the orchestrator exposes as the Prometheus
/// histogram `kneepoint_if_batch_size`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchSizeHistogram {
    /// The buckets' upper bounds, requests ([`batch_size_bounds`] of the
    /// IF's largest batch): strictly increasing, at least one.
    pub bounds: Vec<u64>,
    /// Batches per bucket (not cumulative): one count per bound, then the
    /// overflow bucket (`bounds.len() + 1` counts; the last stays 0 while
    /// no batch is larger than the engine's largest).
    pub counts: Vec<u64>,
    /// The requests in those batches.
    pub sum: u64,
}

impl BatchSizeHistogram {
    /// The index in [`BatchSizeHistogram::counts`] of a batch of `size`
    /// requests under `bounds`.
    pub fn bucket_of(bounds: &[u64], size: u64) -> usize {
        bounds.partition_point(|b| *b < size)
    }

    /// Batches counted (the sum of the counts).
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// Whether the bounds are usable as a histogram's: at least one,
    /// strictly increasing, and one count per bound plus the overflow one.
    pub fn is_well_formed(&self) -> bool {
        !self.bounds.is_empty()
            && self.bounds.windows(2).all(|w| w[0] < w[1])
            && self.counts.len() == self.bounds.len() + 1
    }
}

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
    /// Answers OK within the SLO (none without an SLO).
    pub answers_within_slo: u64,
    /// Batches run.
    pub batches: u64,
    /// Requests in those batches.
    pub batched_requests: u64,
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
    /// The same latencies as histogram buckets (OK answers).
    pub latency_histogram: LatencyHistogram,
    /// The sizes of the batches run, as histogram buckets: its count is
    /// `batches`, its sum `batched_requests`.
    pub batch_size_histogram: BatchSizeHistogram,
    /// Exponentially weighted mean batch execution time, microseconds.
    pub ewma_exec_us: f64,
    /// Answers OK within the SLO, of all answers (errors miss it); `None`
    /// without an SLO or before the first answer.
    pub slo_attainment: Option<f64>,
    /// Seconds since the statistics started.
    pub run_seconds: f64,
    /// CPU time of the IF's own threads: what its packet and inference
    /// paths cost, apart from how long they ran. Absent (zero) from IFs
    /// that predate it.
    #[serde(default)]
    pub threads: ThreadCpu,
}

/// CPU time of an IF's threads (`CLOCK_THREAD_CPUTIME_ID`), each since it
/// began to serve (the fragment thread is the process's main thread: its
/// start-up, the EAL and the model's load, is not counted), sampled by the
/// thread itself (the fragment thread about every 10 ms, the inference
/// thread after each batch and when it ends).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ThreadCpu {
    /// The fragment thread's CPU time, s: receiving, reassembling, copying
    /// (and converting) fragments into the pool, answering what fails.
    pub fragment_thread_seconds: f64,
    /// Fragments it had handled at that sample.
    pub fragments: u64,
    /// Their payload bytes.
    pub fragment_payload_bytes: u64,
    /// Its CPU per KiB (1,024 bytes) of payload, µs: the cost of a 1 KiB
    /// fragment, wake-ups and idle polls included; `None` before the first
    /// fragment.
    pub fragment_us_per_kib: Option<f64>,
    /// The inference thread's CPU time, s: batching, the engine call as
    /// far as it runs on that thread (an engine's own worker threads are
    /// not counted), answers.
    pub inference_thread_seconds: f64,
}

/// What an engine with a device of its own (a GPU engine) measured there;
/// CPU engines have none.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceStats {
    /// Batches timed on the device.
    pub batches: u64,
    /// Their device time summed, ns: from the input's copy to the device to
    /// the last step's end (CUDA events on the engine's stream).
    pub busy_ns: u64,
    /// The last batch's device time, ns.
    pub last_batch_ns: u64,
    /// Device memory the engine holds for its model (parameters,
    /// activations, workspace), bytes.
    pub memory_bytes: u64,
    /// The last batch's input reaching the device, ns (CUDA events): the
    /// gather from the pinned input pool when the engine reads it in
    /// place, the copy from host memory otherwise. Part of
    /// `last_batch_ns`.
    #[serde(default)]
    pub last_input_ns: u64,
}

impl DeviceStats {
    /// Words in [`DeviceStats::to_words`].
    pub const WORDS: usize = 5;

    /// The numbers as words, in field order (how the inference thread hands
    /// them to the telemetry publisher).
    pub fn to_words(&self) -> [u64; Self::WORDS] {
        [
            self.batches,
            self.busy_ns,
            self.last_batch_ns,
            self.memory_bytes,
            self.last_input_ns,
        ]
    }

    /// The inverse of [`DeviceStats::to_words`].
    pub fn from_words(w: &[u64; Self::WORDS]) -> Self {
        DeviceStats {
            batches: w[0],
            busy_ns: w[1],
            last_batch_ns: w[2],
            memory_bytes: w[3],
            last_input_ns: w[4],
        }
    }
}

/// What an IF publishes on its telemetry socket, one JSON object per
/// message: who it is, and a [`Publication`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct IfMessage {
    /// The publishing process: an IF's counters are its process's, from its
    /// start, so a reader that adds several processes' numbers (an active,
    /// its successor after a switchover) tells them apart by this.
    pub pid: u32,
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
        /// The engine's device, for an engine that has one (absent on the
        /// wire otherwise).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        device: Option<DeviceStats>,
    },
    /// The batching policy found the IF under- or over-provisioned.
    Provisioning {
        /// What it found.
        report: ProvisioningReport,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_stats_travel_only_for_engines_that_have_a_device() {
        let msg = |device| IfMessage {
            pid: 1,
            if_id: 2,
            model: "m".into(),
            body: Publication::Telemetry {
                mode: "active".into(),
                telemetry: TelemetrySnapshot::default(),
                batching: BatchStats::default(),
                device,
            },
        };
        let cpu = serde_json::to_value(msg(None)).unwrap();
        assert!(cpu.get("device").is_none(), "{cpu}");
        assert_eq!(serde_json::from_value::<IfMessage>(cpu).unwrap(), msg(None));
        let d = DeviceStats {
            batches: 3,
            busy_ns: 30,
            last_batch_ns: 9,
            memory_bytes: 1 << 30,
            last_input_ns: 2,
        };
        assert_eq!(DeviceStats::from_words(&d.to_words()), d);
        let gpu = serde_json::to_value(msg(Some(d))).unwrap();
        assert_eq!(gpu["device"]["memory_bytes"], 1u64 << 30);
        assert_eq!(
            serde_json::from_value::<IfMessage>(gpu).unwrap(),
            msg(Some(d))
        );
    }

    #[test]
    fn a_latency_lands_in_the_first_bucket_whose_bound_it_does_not_exceed() {
        assert_eq!(LatencyHistogram::bucket_of(0), 0);
        assert_eq!(LatencyHistogram::bucket_of(250), 0);
        assert_eq!(LatencyHistogram::bucket_of(251), 1);
        assert_eq!(LatencyHistogram::bucket_of(20_000), 9);
        assert_eq!(LATENCY_BOUNDS_US[9], 20_000);
        assert_eq!(LatencyHistogram::bucket_of(2_500_000), 18);
        assert_eq!(
            LatencyHistogram::bucket_of(2_500_001),
            LATENCY_BOUNDS_US.len(),
            "the overflow bucket"
        );
        assert!(LATENCY_BOUNDS_US.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn batch_size_buckets_are_powers_of_two_up_to_the_largest_batch() {
        assert_eq!(batch_size_bounds(32), [1, 2, 4, 8, 16, 32]);
        assert_eq!(batch_size_bounds(24), [1, 2, 4, 8, 16, 24]);
        assert_eq!(batch_size_bounds(33), [1, 2, 4, 8, 16, 32, 33]);
        assert_eq!(batch_size_bounds(1), [1]);
        assert_eq!(batch_size_bounds(0), [1], "a nonsense 0 is one");
        assert_eq!(batch_size_bounds(usize::MAX).len(), 65);
        let b = batch_size_bounds(24);
        assert_eq!(BatchSizeHistogram::bucket_of(&b, 1), 0);
        assert_eq!(BatchSizeHistogram::bucket_of(&b, 3), 2, "le 4");
        assert_eq!(BatchSizeHistogram::bucket_of(&b, 17), 5, "le 24");
        assert_eq!(BatchSizeHistogram::bucket_of(&b, 24), 5);
        assert_eq!(BatchSizeHistogram::bucket_of(&b, 25), 6, "overflow");
        let h = BatchSizeHistogram {
            bounds: b,
            counts: vec![0; 7],
            sum: 0,
        };
        assert!(h.is_well_formed());
        assert!(!BatchSizeHistogram::default().is_well_formed());
        let unsorted = BatchSizeHistogram {
            bounds: vec![2, 1],
            counts: vec![0; 3],
            sum: 0,
        };
        assert!(!unsorted.is_well_formed());
    }
}
