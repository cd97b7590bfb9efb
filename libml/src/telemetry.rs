//! What an inference function reports about itself.
//!
//! Per IF: arrival rate, throughput, batch sizes, latency (an EWMA for the
//! control loop, an HDR histogram for percentiles), and a counter per way a
//! request ended (one per docs/PROTOCOL.md status). The orchestrator reads these
//! (published as JSON over ZeroMQ); the IF prints them as one JSON object on
//! exit.
//!
//! What goes on the wire is typed: [`TelemetrySnapshot`] and the
//! [`IfMessage`] an IF publishes are serde structs that the IF serialises and
//! the orchestrator deserialises, so a renamed or missing field is a parse
//! error the orchestrator counts, never a number silently read as zero.
//!
//! Sans-IO: time comes in as an argument. The histogram is allocated once
//! (1 µs to 60 s at 3 significant digits, ~100 KiB) and never grows.

use std::collections::BTreeMap;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use kp_wire::Status;

use crate::batching::{BatchStats, ProvisioningReport};

/// Latency of answered requests, microseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LatencySummary {
    /// Exponentially weighted mean ([`EWMA_ALPHA`]): what the tuning loop
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

/// One IF's statistics at one moment: what [`Telemetry::snapshot`] gives,
/// what the IF publishes and prints on exit.
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

/// Weight of the newest sample in the EWMAs. 0.1 follows a change within
/// ~20 samples while smoothing batch-to-batch noise; GSLICE's control loop
/// reacts on a seconds scale, far slower.
pub const EWMA_ALPHA: f64 = 0.1;

/// Latency and outcome statistics of one inference function.
#[derive(Debug)]
pub struct Telemetry {
    started_ns: u64,
    answers: [u64; Status::ALL.len()],
    arrivals: u64,
    batches: u64,
    batched_requests: u64,
    latency_us: Histogram<u64>,
    ewma_latency_us: f64,
    ewma_exec_us: f64,
    window_start_ns: u64,
    window_arrivals: u64,
    window_answers: u64,
    arrival_rate: f64,
    throughput: f64,
    first_arrival_ns: Option<u64>,
    last_answer_ns: u64,
    /// The latency objective (0: none), for the SLO attainment.
    slo_us: u64,
    /// Answers OK within the objective.
    within_slo: u64,
}

/// Length of the window over which rates are measured.
const RATE_WINDOW_NS: u64 = 1_000_000_000;

impl Telemetry {
    /// Empty statistics, starting at `now_ns`.
    pub fn new(now_ns: u64) -> Self {
        Telemetry {
            started_ns: now_ns,
            answers: [0; Status::ALL.len()],
            arrivals: 0,
            batches: 0,
            batched_requests: 0,
            latency_us: Histogram::new_with_bounds(1, 60_000_000, 3)
                .expect("static bounds are valid"),
            ewma_latency_us: 0.0,
            ewma_exec_us: 0.0,
            window_start_ns: now_ns,
            window_arrivals: 0,
            window_answers: 0,
            arrival_rate: 0.0,
            throughput: 0.0,
            first_arrival_ns: None,
            last_answer_ns: now_ns,
            slo_us: 0,
            within_slo: 0,
        }
    }

    /// The latency objective SLO attainment is measured against (0: none).
    pub fn slo_us(&self) -> u64 {
        self.slo_us
    }

    /// Measures SLO attainment against `slo_us` from now on.
    pub fn with_slo_us(mut self, slo_us: u64) -> Self {
        self.slo_us = slo_us;
        self
    }

    /// A request was seen for the first time (its first fragment).
    pub fn on_arrival(&mut self, now_ns: u64) {
        self.arrivals += 1;
        self.window_arrivals += 1;
        self.first_arrival_ns.get_or_insert(now_ns);
        self.roll(now_ns);
    }

    /// A request was answered with `status`, `latency_us` after its first
    /// fragment arrived.
    pub fn on_answer(&mut self, status: Status, latency_us: u64, now_ns: u64) {
        self.answers[status as usize] += 1;
        // Goodput: a shed (OVERLOADED) or failed request is not served, so
        // shedding shows as throughput below the arrival rate.
        self.window_answers += u64::from(status == Status::Ok);
        self.last_answer_ns = self.last_answer_ns.max(now_ns);
        if status == Status::Ok {
            self.within_slo += u64::from(latency_us <= self.slo_us);
            let _ = self.latency_us.record(latency_us.clamp(1, 60_000_000));
            self.ewma_latency_us = ewma(
                self.ewma_latency_us,
                latency_us as f64,
                self.answers[0] == 1,
            );
        }
        self.roll(now_ns);
    }

    /// A batch of `size` requests ran in `exec_us`.
    pub fn on_batch(&mut self, size: usize, exec_us: u64) {
        self.batches += 1;
        self.batched_requests += size as u64;
        self.ewma_exec_us = ewma(self.ewma_exec_us, exec_us as f64, self.batches == 1);
    }

    /// Closes the rate window if it is over, so a snapshot taken while no
    /// request arrives or is answered still reads current rates (zero).
    pub fn tick(&mut self, now_ns: u64) {
        self.roll(now_ns);
    }

    fn roll(&mut self, now_ns: u64) {
        let span = now_ns.saturating_sub(self.window_start_ns);
        if span >= RATE_WINDOW_NS {
            let secs = span as f64 / 1e9;
            self.arrival_rate = self.window_arrivals as f64 / secs;
            self.throughput = self.window_answers as f64 / secs;
            self.window_start_ns = now_ns;
            self.window_arrivals = 0;
            self.window_answers = 0;
        }
    }

    /// Answers sent with `status`.
    pub fn answers(&self, status: Status) -> u64 {
        self.answers[status as usize]
    }

    /// All answers sent.
    pub fn answers_total(&self) -> u64 {
        self.answers.iter().sum()
    }

    /// Requests seen.
    pub fn arrivals(&self) -> u64 {
        self.arrivals
    }

    /// Everything, as of `now_ns`. `mean_throughput_per_s` is OK answers
    /// per second from the first arrival to the last answer.
    pub fn snapshot(&self, now_ns: u64) -> TelemetrySnapshot {
        let run_s = now_ns.saturating_sub(self.started_ns) as f64 / 1e9;
        // From the first request's arrival to the last answer: the time the
        // IF had work, which is what a throughput is over.
        let busy_s = self
            .first_arrival_ns
            .map_or(0.0, |f| self.last_answer_ns.saturating_sub(f) as f64 / 1e9);
        let q = |p: f64| {
            if self.latency_us.is_empty() {
                0
            } else {
                self.latency_us.value_at_quantile(p)
            }
        };
        TelemetrySnapshot {
            arrivals: self.arrivals,
            answers: Status::ALL
                .iter()
                .map(|s| (s.as_str().to_string(), self.answers[*s as usize]))
                .collect(),
            answers_total: self.answers_total(),
            batches: self.batches,
            mean_batch_size: if self.batches == 0 {
                0.0
            } else {
                self.batched_requests as f64 / self.batches as f64
            },
            arrival_rate_per_s: self.arrival_rate,
            throughput_per_s: self.throughput,
            mean_throughput_per_s: if busy_s > 0.0 {
                self.answers[0] as f64 / busy_s
            } else {
                0.0
            },
            busy_seconds: busy_s,
            latency_us: LatencySummary {
                ewma: self.ewma_latency_us,
                p50: q(0.5),
                p90: q(0.9),
                p99: q(0.99),
                max: self.latency_us.max(),
                count: self.latency_us.len(),
            },
            ewma_exec_us: self.ewma_exec_us,
            slo_attainment: (self.slo_us != 0 && self.answers_total() != 0)
                .then(|| self.within_slo as f64 / self.answers_total() as f64),
            run_seconds: run_s,
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

    #[test]
    fn counts_answers_by_status_and_latency_percentiles() {
        let mut t = Telemetry::new(0);
        for i in 1..=100u64 {
            t.on_arrival(i * 1_000_000);
            t.on_answer(Status::Ok, i * 100, i * 1_000_000);
        }
        t.on_answer(Status::Overloaded, 5, 101_000_000);
        t.on_batch(4, 1000);
        t.on_batch(2, 3000);
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
    }

    #[test]
    fn throughput_is_goodput_and_rates_fall_to_zero_without_traffic() {
        let mut t = Telemetry::new(0).with_slo_us(1000);
        // One second: 10 arrivals, 5 served in 500 µs, 5 shed.
        for i in 0..10u64 {
            t.on_arrival(i * 100_000_000);
            let status = if i % 2 == 0 {
                Status::Ok
            } else {
                Status::Overloaded
            };
            t.on_answer(status, 500, i * 100_000_000 + 1);
        }
        t.tick(1_000_000_001);
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
        t.tick(3_000_000_002);
        assert_eq!(t.to_json(3_000_000_002)["throughput_per_s"], 0.0);
    }

    fn busy_telemetry() -> Telemetry {
        let mut t = Telemetry::new(0).with_slo_us(20_000);
        for i in 1..=50u64 {
            t.on_arrival(i * 1_000_000);
            t.on_answer(Status::Ok, i * 700, i * 1_000_000 + 500_000);
        }
        t.on_answer(Status::Overloaded, 30, 51_000_000);
        t.on_batch(3, 2_000);
        t.tick(1_100_000_000);
        t
    }

    #[test]
    fn a_published_message_parses_back_to_what_was_sent() {
        let t = busy_telemetry();
        let sent = IfMessage {
            if_id: 7,
            model: "squeezenet".into(),
            body: Publication::Telemetry {
                mode: "active".into(),
                telemetry: t.snapshot(1_200_000_000),
                batching: BatchStats {
                    target_batch: 4,
                    ..BatchStats::default()
                },
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
            if_id: 1,
            model: "m".into(),
            body: Publication::Telemetry {
                mode: "active".into(),
                telemetry: t.snapshot(1_200_000_000),
                batching: BatchStats::default(),
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
