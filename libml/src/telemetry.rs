//! What an inference function reports about itself.
//!
//! Per IF: arrival rate, throughput, batch sizes (their mean, and a
//! histogram bucketed by powers of two up to the largest batch), latency
//! (an EWMA for the control loop, an HDR histogram for percentiles), and a
//! counter per way a request ended (one per docs/PROTOCOL.md status). The orchestrator reads these
//! (published as JSON over ZeroMQ); the IF prints them as one JSON object on
//! exit.
//!
//! What goes on the wire is typed: [`TelemetrySnapshot`] and the
//! [`IfMessage`] an IF publishes are serde structs that the IF serialises and
//! the orchestrator deserialises, so a renamed or missing field is a parse
//! error the orchestrator counts, never a number silently read as zero.
//!
//! # No lock on the data path
//!
//! An IF's threads (the fragment thread, the inference thread) each record
//! into a [`TelemetryCell`] of their own through a [`TelemetryWriter`]: plain
//! counters in atomics that only that thread writes (a load and a store, no
//! read-modify-write, no lock), and a latency histogram of atomic buckets
//! with HDR's bucketing (1 µs to 60 s at 3 significant digits, ~136 KiB per
//! cell, allocated once). The publisher merges the cells into a
//! [`TelemetrySnapshot`] once a period; rates are measured there, over the
//! publisher's windows. A snapshot may see one thread's counters a few
//! events later than another's; each counter is exact.
//!
//! Sans-IO: time comes in as an argument.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use hdrhistogram::Histogram;
use serde_json::Value;

use kp_wire::Status;

pub use kp_schema::telemetry::{
    batch_size_bounds, BatchSizeHistogram, DeviceStats, IfMessage, LatencyHistogram,
    LatencySummary, Publication, TelemetrySnapshot, ThreadCpu, LATENCY_BOUNDS_US,
};

/// Weight of the newest sample in the EWMAs. 0.1 follows a change within
/// ~20 samples while smoothing batch-to-batch noise; GSLICE's control loop
/// reacts on a seconds scale, far slower.
pub const EWMA_ALPHA: f64 = 0.1;

/// Length of the window over which rates are measured.
const RATE_WINDOW_NS: u64 = 1_000_000_000;

/// Largest latency recorded, µs (larger ones are recorded as this).
const LATENCY_MAX_US: u64 = 60_000_000;
/// Sub-buckets per power of two: 3 significant digits, as HDR (2048, of
/// which the upper half is new in each bucket after the first).
const SUB_BUCKETS: u64 = 2048;
const HALF: u64 = SUB_BUCKETS / 2;
/// Buckets of the latency histogram: every value up to [`LATENCY_MAX_US`].
const LATENCY_BUCKETS: usize = bucket_of(LATENCY_MAX_US) + 1;

/// The histogram bucket of `v` (µs, at least 1): HDR's bucketing with unit
/// 1 and 3 significant digits, so merged buckets give HDR's percentiles.
const fn bucket_of(v: u64) -> usize {
    if v < SUB_BUCKETS {
        return v as usize;
    }
    // v >> shift lies in [HALF, SUB_BUCKETS).
    let shift = 63 - v.leading_zeros() as u64 - (SUB_BUCKETS.trailing_zeros() as u64 - 1);
    (shift * HALF + (v >> shift)) as usize
}

/// The lowest value of bucket `i` (the inverse of [`bucket_of`]).
const fn lowest_of(i: usize) -> u64 {
    let i = i as u64;
    if i < SUB_BUCKETS {
        return i;
    }
    let shift = i / HALF - 1;
    (i - shift * HALF) << shift
}

/// One thread's share of an IF's statistics: written by one
/// [`TelemetryWriter`] only, read by anyone.
#[derive(Debug)]
pub struct TelemetryCell {
    claimed: AtomicBool,
    answers: [AtomicU64; Status::ALL.len()],
    arrivals: AtomicU64,
    batches: AtomicU64,
    batched_requests: AtomicU64,
    within_slo: AtomicU64,
    /// `f64` bits.
    ewma_latency_us: AtomicU64,
    /// `f64` bits.
    ewma_exec_us: AtomicU64,
    /// `u64::MAX` until the first arrival.
    first_arrival_ns: AtomicU64,
    last_answer_ns: AtomicU64,
    latency_us: Box<[AtomicU64]>,
    /// OK answers per [`LATENCY_BOUNDS_US`] bucket (and the overflow one),
    /// and the sum of their latencies, µs: the histogram Prometheus gets.
    latency_buckets: [AtomicU64; LATENCY_BOUNDS_US.len() + 1],
    latency_sum_us: AtomicU64,
    /// Batches per batch-size bucket ([`Telemetry`]'s bounds, then the
    /// overflow one).
    batch_buckets: Box<[AtomicU64]>,
    /// The writing thread's CPU time at its last sample, ns, as a fragment
    /// thread ([`TelemetryWriter::on_fragment_cpu`]) or an inference thread
    /// ([`TelemetryWriter::on_inference_cpu`]).
    fragment_cpu_ns: AtomicU64,
    fragments: AtomicU64,
    fragment_bytes: AtomicU64,
    inference_cpu_ns: AtomicU64,
}

impl TelemetryCell {
    fn new(batch_buckets: usize) -> Self {
        TelemetryCell {
            claimed: AtomicBool::new(false),
            answers: std::array::from_fn(|_| AtomicU64::new(0)),
            arrivals: AtomicU64::new(0),
            batches: AtomicU64::new(0),
            batched_requests: AtomicU64::new(0),
            within_slo: AtomicU64::new(0),
            ewma_latency_us: AtomicU64::new(0f64.to_bits()),
            ewma_exec_us: AtomicU64::new(0f64.to_bits()),
            first_arrival_ns: AtomicU64::new(u64::MAX),
            last_answer_ns: AtomicU64::new(0),
            latency_us: (0..LATENCY_BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            latency_buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            latency_sum_us: AtomicU64::new(0),
            batch_buckets: (0..batch_buckets).map(|_| AtomicU64::new(0)).collect(),
            fragment_cpu_ns: AtomicU64::new(0),
            fragments: AtomicU64::new(0),
            fragment_bytes: AtomicU64::new(0),
            inference_cpu_ns: AtomicU64::new(0),
        }
    }
}

/// Adds `n` to a counter only the calling thread writes: a load and a
/// store, which on x86 are plain moves (no locked instruction).
#[inline]
fn add(counter: &AtomicU64, n: u64) {
    counter.store(counter.load(Ordering::Relaxed) + n, Ordering::Relaxed);
}

/// The one thread that records into a [`TelemetryCell`]; see
/// [`Telemetry::writer`].
#[derive(Debug)]
pub struct TelemetryWriter<'a> {
    telemetry: &'a Telemetry,
    cell: &'a TelemetryCell,
    /// The writer's own copies of what its EWMAs need.
    ok: u64,
    batches: u64,
    ewma_latency_us: f64,
    ewma_exec_us: f64,
}

impl TelemetryWriter<'_> {
    /// A fragment thread's sample: its CPU time so far (ns), and the
    /// fragments and payload bytes it had handled by then.
    pub fn on_fragment_cpu(&mut self, cpu_ns: u64, fragments: u64, payload_bytes: u64) {
        self.cell.fragment_cpu_ns.store(cpu_ns, Ordering::Relaxed);
        self.cell.fragments.store(fragments, Ordering::Relaxed);
        self.cell
            .fragment_bytes
            .store(payload_bytes, Ordering::Relaxed);
    }

    /// An inference thread's sample: its CPU time so far, ns.
    pub fn on_inference_cpu(&mut self, cpu_ns: u64) {
        self.cell.inference_cpu_ns.store(cpu_ns, Ordering::Relaxed);
    }

    /// A request was seen for the first time (its first fragment).
    #[inline]
    pub fn on_arrival(&mut self, now_ns: u64) {
        add(&self.cell.arrivals, 1);
        if self.cell.first_arrival_ns.load(Ordering::Relaxed) == u64::MAX {
            self.cell.first_arrival_ns.store(now_ns, Ordering::Relaxed);
        }
    }

    /// A request was answered with `status`, `latency_us` after its first
    /// fragment arrived.
    #[inline]
    pub fn on_answer(&mut self, status: Status, latency_us: u64, now_ns: u64) {
        let c = self.cell;
        add(&c.answers[status as usize], 1);
        if now_ns > c.last_answer_ns.load(Ordering::Relaxed) {
            c.last_answer_ns.store(now_ns, Ordering::Relaxed);
        }
        if status == Status::Ok {
            self.ok += 1;
            add(
                &c.within_slo,
                u64::from(latency_us <= self.telemetry.slo_us),
            );
            add(
                &c.latency_us[bucket_of(latency_us.clamp(1, LATENCY_MAX_US))],
                1,
            );
            add(
                &c.latency_buckets[LatencyHistogram::bucket_of(latency_us)],
                1,
            );
            add(&c.latency_sum_us, latency_us);
            self.ewma_latency_us = ewma(self.ewma_latency_us, latency_us as f64, self.ok == 1);
            c.ewma_latency_us
                .store(self.ewma_latency_us.to_bits(), Ordering::Relaxed);
        }
    }

    /// A batch of `size` requests ran in `exec_us`.
    #[inline]
    pub fn on_batch(&mut self, size: usize, exec_us: u64) {
        self.batches += 1;
        add(&self.cell.batches, 1);
        add(&self.cell.batched_requests, size as u64);
        let bounds = &self.telemetry.batch_bounds;
        add(
            &self.cell.batch_buckets[BatchSizeHistogram::bucket_of(bounds, size as u64)],
            1,
        );
        self.ewma_exec_us = ewma(self.ewma_exec_us, exec_us as f64, self.batches == 1);
        self.cell
            .ewma_exec_us
            .store(self.ewma_exec_us.to_bits(), Ordering::Relaxed);
    }

    /// The IF starts serving now: run time and rates count from `now_ns`
    /// (what a parked shadow measured is not its service).
    pub fn restart_clock(&mut self, now_ns: u64) {
        let t = self.telemetry;
        // What was counted before does not go into the first rate window
        // (published before the new start, which the reader acquires).
        t.restart_arrivals.store(t.arrivals(), Ordering::Relaxed);
        t.restart_ok.store(t.answers(Status::Ok), Ordering::Relaxed);
        t.started_ns.store(now_ns, Ordering::Release);
    }
}

/// The publisher's rate window.
#[derive(Debug)]
struct RateWindow {
    /// Clock start it was opened for (a restart opens a new one).
    started_ns: u64,
    start_ns: u64,
    arrivals: u64,
    ok: u64,
    arrival_rate: f64,
    throughput: f64,
}

/// Latency and outcome statistics of one inference function: one
/// [`TelemetryCell`] per recording thread, merged when read.
#[derive(Debug)]
pub struct Telemetry {
    started_ns: AtomicU64,
    /// Arrivals and OK answers when the clock was last restarted.
    restart_arrivals: AtomicU64,
    restart_ok: AtomicU64,
    /// The latency objective (0: none), for the SLO attainment.
    slo_us: u64,
    /// The batch-size histogram's bucket bounds ([`batch_size_bounds`]).
    batch_bounds: Box<[u64]>,
    cells: Box<[TelemetryCell]>,
    /// Only the reader (the publisher, the final report) takes it.
    window: Mutex<RateWindow>,
}

impl Telemetry {
    /// Empty statistics starting at `now_ns`, SLO attainment measured
    /// against `slo_us` (0: none), batch sizes bucketed up to `max_batch`
    /// (the engine's largest batch), recorded by up to `writers` threads.
    pub fn new(now_ns: u64, slo_us: u64, max_batch: usize, writers: usize) -> Self {
        let batch_bounds: Box<[u64]> = batch_size_bounds(max_batch).into();
        let buckets = batch_bounds.len() + 1;
        Telemetry {
            started_ns: AtomicU64::new(now_ns),
            restart_arrivals: AtomicU64::new(0),
            restart_ok: AtomicU64::new(0),
            slo_us,
            batch_bounds,
            cells: (0..writers).map(|_| TelemetryCell::new(buckets)).collect(),
            window: Mutex::new(RateWindow {
                started_ns: now_ns,
                start_ns: now_ns,
                arrivals: 0,
                ok: 0,
                arrival_rate: 0.0,
                throughput: 0.0,
            }),
        }
    }

    /// The writer of cell `i`, for one thread; `None` if `i` is out of range
    /// or its writer was handed out already (a cell has one writer only:
    /// that is what makes its plain stores correct).
    pub fn writer(&self, i: usize) -> Option<TelemetryWriter<'_>> {
        let cell = self.cells.get(i)?;
        if cell.claimed.swap(true, Ordering::AcqRel) {
            return None;
        }
        Some(TelemetryWriter {
            telemetry: self,
            cell,
            ok: 0,
            batches: 0,
            ewma_latency_us: 0.0,
            ewma_exec_us: 0.0,
        })
    }

    /// The latency objective SLO attainment is measured against (0: none).
    pub fn slo_us(&self) -> u64 {
        self.slo_us
    }

    fn sum(&self, field: impl Fn(&TelemetryCell) -> &AtomicU64) -> u64 {
        self.cells
            .iter()
            .map(|c| field(c).load(Ordering::Relaxed))
            .sum()
    }

    /// Answers sent with `status`.
    pub fn answers(&self, status: Status) -> u64 {
        self.sum(|c| &c.answers[status as usize])
    }

    /// All answers sent.
    pub fn answers_total(&self) -> u64 {
        Status::ALL.iter().map(|s| self.answers(*s)).sum()
    }

    /// Requests seen.
    pub fn arrivals(&self) -> u64 {
        self.sum(|c| &c.arrivals)
    }

    /// The threads' CPU samples (each field is written by one thread's
    /// cell only; the others hold zero).
    fn thread_cpu(&self) -> ThreadCpu {
        let fragments = self.sum(|c| &c.fragments);
        let bytes = self.sum(|c| &c.fragment_bytes);
        let fragment_ns = self.sum(|c| &c.fragment_cpu_ns);
        ThreadCpu {
            fragment_thread_seconds: fragment_ns as f64 / 1e9,
            fragments,
            fragment_payload_bytes: bytes,
            fragment_us_per_kib: (bytes > 0)
                .then(|| fragment_ns as f64 / 1e3 / (bytes as f64 / 1024.0)),
            inference_thread_seconds: self.sum(|c| &c.inference_cpu_ns) as f64 / 1e9,
        }
    }

    /// The latencies of every cell, merged.
    fn latency_histogram(&self) -> Histogram<u64> {
        let mut h =
            Histogram::new_with_bounds(1, LATENCY_MAX_US, 3).expect("static bounds are valid");
        for i in 1..LATENCY_BUCKETS {
            let n = self.sum(|c| &c.latency_us[i]);
            if n > 0 {
                let _ = h.record_n(lowest_of(i), n);
            }
        }
        h
    }

    /// An EWMA of the cell that took the most samples of it (one thread
    /// answers OK and runs batches: the inference thread).
    fn ewma_of(
        &self,
        samples: impl Fn(&TelemetryCell) -> u64,
        value: impl Fn(&TelemetryCell) -> &AtomicU64,
    ) -> f64 {
        self.cells
            .iter()
            .max_by_key(|c| samples(c))
            .map_or(0.0, |c| f64::from_bits(value(c).load(Ordering::Relaxed)))
    }

    /// Everything, as of `now_ns`. Closes the rate window if it is over
    /// ([`RATE_WINDOW_NS`]): arrival rate and throughput (OK answers: a shed
    /// or failed request is not served) are over the last closed window.
    /// `mean_throughput_per_s` is OK answers per second from the first
    /// arrival to the last answer.
    pub fn snapshot(&self, now_ns: u64) -> TelemetrySnapshot {
        let started_ns = self.started_ns.load(Ordering::Acquire);
        let arrivals = self.arrivals();
        let answers: [u64; Status::ALL.len()] =
            std::array::from_fn(|i| self.answers(Status::ALL[i]));
        let ok = answers[Status::Ok as usize];
        let answers_total: u64 = answers.iter().sum();
        let (arrival_rate, throughput) = {
            let mut w = self.window.lock().unwrap_or_else(|p| p.into_inner());
            if w.started_ns != started_ns {
                // Serving (re)started: a new window from then.
                *w = RateWindow {
                    started_ns,
                    start_ns: started_ns,
                    arrivals: self.restart_arrivals.load(Ordering::Relaxed),
                    ok: self.restart_ok.load(Ordering::Relaxed),
                    arrival_rate: 0.0,
                    throughput: 0.0,
                };
            }
            let span = now_ns.saturating_sub(w.start_ns);
            if span >= RATE_WINDOW_NS {
                let secs = span as f64 / 1e9;
                w.arrival_rate = (arrivals - w.arrivals) as f64 / secs;
                w.throughput = (ok - w.ok) as f64 / secs;
                w.start_ns = now_ns;
                w.arrivals = arrivals;
                w.ok = ok;
            }
            (w.arrival_rate, w.throughput)
        };
        let first_arrival = self
            .cells
            .iter()
            .map(|c| c.first_arrival_ns.load(Ordering::Relaxed))
            .min()
            .filter(|t| *t != u64::MAX);
        let last_answer = self
            .cells
            .iter()
            .map(|c| c.last_answer_ns.load(Ordering::Relaxed))
            .max()
            .unwrap_or(0)
            .max(started_ns);
        // From the first request's arrival to the last answer: the time the
        // IF had work, which is what a throughput is over.
        let busy_s = first_arrival.map_or(0.0, |f| last_answer.saturating_sub(f) as f64 / 1e9);
        let batches = self.sum(|c| &c.batches);
        let batched = self.sum(|c| &c.batched_requests);
        let latency = self.latency_histogram();
        let q = |p: f64| {
            if latency.is_empty() {
                0
            } else {
                latency.value_at_quantile(p)
            }
        };
        TelemetrySnapshot {
            arrivals,
            answers: Status::ALL
                .iter()
                .map(|s| (s.as_str().to_string(), answers[*s as usize]))
                .collect(),
            answers_total,
            answers_within_slo: self.sum(|c| &c.within_slo),
            batches,
            batched_requests: batched,
            mean_batch_size: if batches == 0 {
                0.0
            } else {
                batched as f64 / batches as f64
            },
            arrival_rate_per_s: arrival_rate,
            throughput_per_s: throughput,
            mean_throughput_per_s: if busy_s > 0.0 {
                ok as f64 / busy_s
            } else {
                0.0
            },
            busy_seconds: busy_s,
            latency_us: LatencySummary {
                ewma: self.ewma_of(
                    |c| c.answers[Status::Ok as usize].load(Ordering::Relaxed),
                    |c| &c.ewma_latency_us,
                ),
                p50: q(0.5),
                p90: q(0.9),
                p99: q(0.99),
                max: latency.max(),
                count: latency.len(),
            },
            latency_histogram: LatencyHistogram {
                bounds_us: LATENCY_BOUNDS_US.to_vec(),
                counts: (0..=LATENCY_BOUNDS_US.len())
                    .map(|i| self.sum(|c| &c.latency_buckets[i]))
                    .collect(),
                sum_us: self.sum(|c| &c.latency_sum_us),
            },
            batch_size_histogram: BatchSizeHistogram {
                bounds: self.batch_bounds.to_vec(),
                counts: (0..=self.batch_bounds.len())
                    .map(|i| self.sum(|c| &c.batch_buckets[i]))
                    .collect(),
                sum: batched,
            },
            ewma_exec_us: self.ewma_of(|c| c.batches.load(Ordering::Relaxed), |c| &c.ewma_exec_us),
            slo_attainment: (self.slo_us != 0 && answers_total != 0)
                .then(|| self.sum(|c| &c.within_slo) as f64 / answers_total as f64),
            run_seconds: now_ns.saturating_sub(started_ns) as f64 / 1e9,
            threads: self.thread_cpu(),
        }
    }

    /// [`Telemetry::snapshot`] as a JSON value (the IF's final report).
    pub fn to_json(&self, now_ns: u64) -> Value {
        serde_json::to_value(self.snapshot(now_ns)).unwrap_or(Value::Null)
    }
}

fn ewma(old: f64, sample: f64, first: bool) -> f64 {
    if first {
        sample
    } else {
        old + EWMA_ALPHA * (sample - old)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batching::{BatchStats, ProvisioningReport};

    #[test]
    fn counts_answers_by_status_and_latency_percentiles() {
        let t = Telemetry::new(0, 0, 32, 1);
        let mut w = t.writer(0).unwrap();
        for i in 1..=100u64 {
            w.on_arrival(i * 1_000_000);
            w.on_answer(Status::Ok, i * 100, i * 1_000_000);
        }
        w.on_answer(Status::Overloaded, 5, 101_000_000);
        w.on_batch(4, 1000);
        w.on_batch(2, 3000);
        let j = t.to_json(2_000_000_000);
        assert_eq!(j["answers"]["ok"], 100);
        assert_eq!(j["answers"]["overloaded"], 1);
        assert_eq!(j["answers_total"], 101);
        assert_eq!(j["mean_batch_size"], 3.0);
        let p50 = j["latency_us"]["p50"].as_u64().unwrap();
        assert!((4990..=5010).contains(&p50), "p50 {p50}");
        let p99 = j["latency_us"]["p99"].as_u64().unwrap();
        assert!((9890..=9910).contains(&p99), "p99 {p99}");
        assert_eq!(j["ewma_exec_us"], 1000.0 + EWMA_ALPHA * 2000.0);
        // OK latencies 100, 200, ..., 10_000 µs by bucket (bounds 250, 500,
        // 1000, 2000, 3000, 5000, 7500, 10_000 µs); the OVERLOADED answer
        // is not in it.
        let h = t.snapshot(2_000_000_000).latency_histogram;
        assert_eq!(h.bounds_us, LATENCY_BOUNDS_US.to_vec());
        let mut want = vec![0u64; LATENCY_BOUNDS_US.len() + 1];
        want[..8].copy_from_slice(&[2, 3, 5, 10, 10, 20, 25, 25]);
        assert_eq!(h.counts, want);
        assert_eq!(h.sum_us, (1..=100u64).map(|i| i * 100).sum::<u64>());
        assert_eq!(h.count(), 100);
        // Batches of 4 and 2 under bounds 1, 2, 4, 8, 16, 32.
        let b = t.snapshot(2_000_000_000).batch_size_histogram;
        assert_eq!(b.bounds, [1, 2, 4, 8, 16, 32]);
        assert_eq!(b.counts, [0, 1, 1, 0, 0, 0, 0]);
        assert_eq!(b.sum, 6);
    }

    #[test]
    fn each_thread_reports_its_cpu_and_the_fragment_cost_is_per_kib() {
        let t = Telemetry::new(0, 0, 32, 2);
        let none = t.snapshot(1).threads;
        assert_eq!(none.fragment_us_per_kib, None, "no fragment yet");
        let mut fragments = t.writer(0).unwrap();
        let mut inference = t.writer(1).unwrap();
        // 4 ms of CPU for 8 fragments of 1 KiB: 500 µs per KiB.
        fragments.on_fragment_cpu(4_000_000, 8, 8 * 1024);
        inference.on_inference_cpu(30_000_000);
        // A sample replaces the last one (a running total, not a delta).
        fragments.on_fragment_cpu(5_000_000, 10, 10 * 1024);
        let c = t.snapshot(1).threads;
        assert_eq!(c.fragment_thread_seconds, 0.005);
        assert_eq!((c.fragments, c.fragment_payload_bytes), (10, 10 * 1024));
        assert_eq!(c.fragment_us_per_kib, Some(500.0));
        assert_eq!(c.inference_thread_seconds, 0.03);
        let j = t.to_json(1);
        assert_eq!(j["threads"]["fragment_us_per_kib"], 500.0);
    }

    #[test]
    fn throughput_is_goodput_and_rates_fall_to_zero_without_traffic() {
        let t = Telemetry::new(0, 1000, 32, 1);
        let mut w = t.writer(0).unwrap();
        // One second: 10 arrivals, 5 served in 500 µs, 5 shed.
        for i in 0..10u64 {
            w.on_arrival(i * 100_000_000);
            let status = if i % 2 == 0 {
                Status::Ok
            } else {
                Status::Overloaded
            };
            w.on_answer(status, 500, i * 100_000_000 + 1);
        }
        let j = t.to_json(1_000_000_001);
        let (arrivals, served) = (
            j["arrival_rate_per_s"].as_f64().unwrap(),
            j["throughput_per_s"].as_f64().unwrap(),
        );
        assert!((9.9..=10.0).contains(&arrivals), "{j}");
        assert!(
            (4.9..=5.0).contains(&served),
            "shed requests are not throughput: {j}"
        );
        assert_eq!(j["slo_attainment"], 0.5);
        // Then nothing for two seconds: a snapshot says so.
        assert_eq!(t.to_json(3_000_000_002)["throughput_per_s"], 0.0);
    }

    fn busy_telemetry() -> Telemetry {
        let t = Telemetry::new(0, 20_000, 32, 1);
        {
            let mut w = t.writer(0).unwrap();
            for i in 1..=50u64 {
                w.on_arrival(i * 1_000_000);
                w.on_answer(Status::Ok, i * 700, i * 1_000_000 + 500_000);
            }
            w.on_answer(Status::Overloaded, 30, 51_000_000);
            w.on_batch(3, 2_000);
        }
        t.snapshot(1_100_000_000);
        t
    }

    #[test]
    fn the_buckets_are_hdr_buckets() {
        let h = Histogram::<u64>::new_with_bounds(1, LATENCY_MAX_US, 3).unwrap();
        let mut v = 1u64;
        while v <= LATENCY_MAX_US {
            for x in [v, v + 1, v * 3 / 2] {
                let x = x.min(LATENCY_MAX_US);
                let i = bucket_of(x);
                assert!(i < LATENCY_BUCKETS, "{x}");
                assert_eq!(lowest_of(i), h.lowest_equivalent(x), "{x}");
            }
            v = v * 2 + 1;
        }
        assert_eq!(bucket_of(2047), 2047);
        assert_eq!(bucket_of(2048), 2048);
        assert_eq!(lowest_of(bucket_of(4097)), 4096);
    }

    #[test]
    fn a_cell_has_one_writer() {
        let t = Telemetry::new(0, 0, 32, 2);
        let first = t.writer(0);
        assert!(first.is_some());
        assert!(t.writer(0).is_none(), "a second writer of cell 0");
        assert!(t.writer(1).is_some());
        assert!(t.writer(2).is_none(), "no cell 2");
    }

    #[test]
    fn cells_written_by_two_threads_merge_exactly() {
        // The fragment thread's errors and arrivals, the inference thread's
        // OK answers and batches, a reader snapshotting all along.
        let t = Telemetry::new(0, 1_000, 8, 2);
        let n = 20_000u64;
        std::thread::scope(|s| {
            let mut fragments = t.writer(0).unwrap();
            let mut inference = t.writer(1).unwrap();
            s.spawn(move || {
                for i in 0..n {
                    fragments.on_arrival(i);
                    if i % 4 == 0 {
                        fragments.on_answer(Status::Incomplete, 100_000, i);
                    }
                }
            });
            s.spawn(move || {
                for i in 0..n {
                    inference.on_answer(Status::Ok, 1 + i % 2_000, i);
                    if i % 8 == 0 {
                        inference.on_batch(8, 500);
                    }
                }
            });
            s.spawn(|| {
                for _ in 0..50 {
                    let snap = t.snapshot(0);
                    assert!(snap.answers_total <= n + n / 4);
                }
            });
        });
        let snap = t.snapshot(2 * n);
        assert_eq!(snap.arrivals, n);
        assert_eq!(snap.answers["ok"], n);
        assert_eq!(snap.answers["incomplete"], n / 4);
        assert_eq!(snap.answers_total, n + n / 4);
        assert_eq!(snap.batches, n / 8);
        let b = &snap.batch_size_histogram;
        assert_eq!(b.bounds, [1, 2, 4, 8], "up to the largest batch, 8");
        assert_eq!(b.counts, [0, 0, 0, n / 8, 0]);
        assert_eq!((b.count(), b.sum), (snap.batches, snap.batched_requests));
        assert_eq!(snap.latency_us.count, n, "OK answers only");
        assert_eq!(snap.latency_us.max, 2_000);
        assert_eq!(snap.latency_us.p50, 1_000);
        assert_eq!(snap.ewma_exec_us, 500.0);
        assert_eq!(
            snap.slo_attainment,
            Some(n as f64 / 2.0 / (n + n / 4) as f64)
        );
    }

    #[test]
    fn a_restarted_clock_starts_run_time_and_rates_again() {
        let t = Telemetry::new(0, 0, 32, 1);
        let mut w = t.writer(0).unwrap();
        w.on_answer(Status::Internal, 0, 5_000_000_000);
        w.restart_clock(5_000_000_000);
        for i in 0..4u64 {
            w.on_arrival(5_000_000_000 + i);
            w.on_answer(Status::Ok, 10, 5_000_000_000 + i);
        }
        let snap = t.snapshot(6_000_000_000);
        assert_eq!(snap.run_seconds, 1.0);
        assert_eq!(snap.throughput_per_s, 4.0);
        assert_eq!(snap.answers["internal"], 1, "kept across the restart");
    }

    #[test]
    fn a_published_message_parses_back_to_what_was_sent() {
        let t = busy_telemetry();
        let sent = IfMessage {
            pid: 4242,
            if_id: 7,
            model: "squeezenet".into(),
            body: Publication::Telemetry {
                mode: "active".into(),
                telemetry: t.snapshot(1_200_000_000),
                batching: BatchStats {
                    target_batch: 4,
                    ..BatchStats::default()
                },
                device: None,
            },
        };
        let bytes = serde_json::to_vec(&sent).unwrap();
        let got: IfMessage = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(got, sent);
        let Publication::Telemetry { telemetry, .. } = &got.body else {
            panic!("not telemetry: {got:?}");
        };
        assert!(telemetry.latency_us.ewma > 0.0 && telemetry.latency_us.p99 >= 35_000 - 100);
        assert_eq!(
            telemetry.answers["ok"] + telemetry.answers["overloaded"],
            51
        );
        assert_eq!(telemetry.slo_attainment, Some(28.0 / 51.0));

        let report = IfMessage {
            pid: 4242,
            if_id: 7,
            model: "squeezenet".into(),
            body: Publication::Provisioning {
                report: ProvisioningReport::Under {
                    occurrences: 3,
                    worst_e2e_ns: 31_000_000,
                    slo_ns: 20_000_000,
                    at_ns: 9,
                },
            },
        };
        let text = serde_json::to_string(&report).unwrap();
        assert_eq!(serde_json::from_str::<IfMessage>(&text).unwrap(), report);
    }

    #[test]
    fn a_renamed_or_missing_field_is_an_error_not_a_zero() {
        let t = busy_telemetry();
        let good = serde_json::to_value(IfMessage {
            pid: 4242,
            if_id: 1,
            model: "m".into(),
            body: Publication::Telemetry {
                mode: "active".into(),
                telemetry: t.snapshot(1_200_000_000),
                batching: BatchStats::default(),
                device: None,
            },
        })
        .unwrap();
        assert!(serde_json::from_value::<IfMessage>(good.clone()).is_ok());
        // What a producer with a renamed key would send.
        let mut renamed = good.clone();
        let lat = renamed["telemetry"]["latency_us"].take();
        renamed["telemetry"]
            .as_object_mut()
            .unwrap()
            .remove("latency_us");
        renamed["telemetry"]["latency"] = lat;
        let e = serde_json::from_value::<IfMessage>(renamed).unwrap_err();
        assert!(e.to_string().contains("latency_us"), "{e}");
        // A number where a number belongs, and nothing else.
        let mut wrong_type = good.clone();
        wrong_type["telemetry"]["throughput_per_s"] = "fast".into();
        assert!(serde_json::from_value::<IfMessage>(wrong_type).is_err());
        let mut unknown_kind = good;
        unknown_kind["kind"] = "gossip".into();
        assert!(serde_json::from_value::<IfMessage>(unknown_kind).is_err());
    }
}
