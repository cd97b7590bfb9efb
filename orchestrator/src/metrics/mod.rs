//! The platform's numbers for Prometheus: what the orchestrator exposes on
//! its `/metrics` endpoint (docs/METRICS.md lists every series).
//!
//! Three parts:
//! - this module, [`PlatformMetrics`]: a sans-IO accumulator. The daemon
//!   feeds it the typed telemetry the IFs publish ([`IfMessage`]), what it
//!   knows itself (shares, SLOs, switchovers, fail-overs, platform
//!   restarts, tuning decisions: [`IfView`]), and the if-manager's typed
//!   counters ([`IfManagerCounters`]); nothing is read from a log;
//! - [`exposition`]: the mapping of those numbers to Prometheus series
//!   (names, types, labels, units), written in the text exposition format
//!   by the `prometheus-client` crate;
//! - [`http`]: the endpoint, a `tiny_http` server on a thread of its own
//!   (the orchestrator has no async runtime and needs none for one request
//!   per scrape interval), which also asks the if-manager for its counters
//!   at each scrape.
//!
//! # Counters that survive switchovers
//!
//! An IF's counters are its process's, from that process's start; a
//! re-provision replaces the process, and a fail-over promotes its shadow.
//! A Prometheus counter must only go up (`rate()` reads a decrease as a
//! reset and then counts the whole new value again), so the accumulator
//! keeps each process's last numbers by pid and adds only the *increase*
//! of each message to the IF's series. A process that leaves keeps its
//! contribution; its successor's numbers add from zero. A message from a
//! process already seen exiting is ignored (its final numbers were read
//! before its exit was handled, so reading it again would count twice). A
//! process whose numbers went down (a pid reused) is taken for a new one.
//!
//! The `role` label says which process answered: `active` for the serving
//! process (and an old active finishing what it held after a switchover),
//! `shadow` for a parked standby (which answers nothing until promoted,
//! except, on a fail-over, INTERNAL for what the dead active held).
//!
//! The if-manager's counters are added up the same way by its pid, so a
//! restarted if-manager does not reset them.

pub mod exposition;
pub mod http;

use std::collections::{BTreeMap, VecDeque};

use kp_schema::batching::BatchStats;
use kp_schema::messages::IfManagerCounters;
use kp_schema::telemetry::{IfMessage, Publication, TelemetrySnapshot, LATENCY_BOUNDS_US};
use kp_schema::Mode;

/// Exited processes remembered, to ignore their late messages: far more
/// than can exit between two reads of the telemetry socket (5 ms).
const GONE_REMEMBERED: usize = 1024;

/// Which process of an IF answered (the `role` label).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    /// The serving process (or an old one finishing after a switchover).
    Active,
    /// A parked standby.
    Shadow,
}

impl Role {
    /// The label value.
    pub fn name(self) -> &'static str {
        match self {
            Role::Active => "active",
            Role::Shadow => "shadow",
        }
    }

    /// The role of a process in `mode` (a [`Mode`] name).
    fn of_mode(mode: &str) -> Role {
        if mode == Mode::Standby.name() || mode == Mode::Arming.name() {
            Role::Shadow
        } else {
            Role::Active
        }
    }
}

/// Cumulative counts of one process, or the sum over an IF's processes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Answers by status name (`ok`, `overloaded`, ...).
    pub answers: BTreeMap<String, u64>,
    /// Requests that arrived.
    pub arrivals: u64,
    /// OK answers within the SLO.
    pub within_slo: u64,
    /// Batches run.
    pub batches: u64,
    /// Requests in those batches.
    pub batched_requests: u64,
    /// Requests the batching policy shed (answered OVERLOADED).
    pub shed: u64,
    /// Batches whose slowest request missed the SLO.
    pub slo_miss_batches: u64,
    /// OK answers per latency bucket ([`LATENCY_BOUNDS_US`], then overflow).
    pub latency_counts: Vec<u64>,
    /// Sum of their latencies, µs.
    pub latency_sum_us: u64,
    /// The batch-size histogram's bucket bounds, requests (empty before
    /// the first message).
    pub batch_bounds: Vec<u64>,
    /// Batches per batch-size bucket (then the overflow one).
    pub batch_counts: Vec<u64>,
    /// Requests in those batches.
    pub batch_sum: u64,
    /// The fragment threads' CPU time, ns, the fragments they handled and
    /// their payload bytes; the inference threads' CPU time, ns.
    pub fragment_cpu_ns: u64,
    pub fragments: u64,
    pub fragment_bytes: u64,
    pub inference_cpu_ns: u64,
}

impl Counts {
    fn of(t: &TelemetrySnapshot, b: &BatchStats) -> Counts {
        Counts {
            answers: t.answers.clone(),
            arrivals: t.arrivals,
            within_slo: t.answers_within_slo,
            batches: t.batches,
            batched_requests: t.batched_requests,
            shed: b.shed,
            slo_miss_batches: b.slo_miss_batches,
            latency_counts: t.latency_histogram.counts.clone(),
            latency_sum_us: t.latency_histogram.sum_us,
            batch_bounds: t.batch_size_histogram.bounds.clone(),
            batch_counts: t.batch_size_histogram.counts.clone(),
            batch_sum: t.batch_size_histogram.sum,
            fragment_cpu_ns: (t.threads.fragment_thread_seconds * 1e9).round() as u64,
            fragments: t.threads.fragments,
            fragment_bytes: t.threads.fragment_payload_bytes,
            inference_cpu_ns: (t.threads.inference_thread_seconds * 1e9).round() as u64,
        }
    }

    /// `self - earlier`, or `None` if any count went down (then `self` is
    /// another process's).
    fn increase_over(&self, earlier: &Counts) -> Option<Counts> {
        let d = |now: u64, then: u64| now.checked_sub(then);
        let mut answers = BTreeMap::new();
        for (k, v) in &self.answers {
            answers.insert(
                k.clone(),
                d(*v, earlier.answers.get(k).copied().unwrap_or(0))?,
            );
        }
        if earlier
            .answers
            .keys()
            .any(|k| !self.answers.contains_key(k))
        {
            return None;
        }
        let buckets = |now: &Vec<u64>, then: &Vec<u64>| {
            if then.is_empty() {
                return Some(now.clone());
            }
            if then.len() != now.len() {
                return None;
            }
            now.iter()
                .zip(then)
                .map(|(n, t)| d(*n, *t))
                .collect::<Option<Vec<u64>>>()
        };
        let latency_counts = buckets(&self.latency_counts, &earlier.latency_counts)?;
        if !earlier.batch_bounds.is_empty() && earlier.batch_bounds != self.batch_bounds {
            return None;
        }
        let batch_counts = buckets(&self.batch_counts, &earlier.batch_counts)?;
        Some(Counts {
            answers,
            arrivals: d(self.arrivals, earlier.arrivals)?,
            within_slo: d(self.within_slo, earlier.within_slo)?,
            batches: d(self.batches, earlier.batches)?,
            batched_requests: d(self.batched_requests, earlier.batched_requests)?,
            shed: d(self.shed, earlier.shed)?,
            slo_miss_batches: d(self.slo_miss_batches, earlier.slo_miss_batches)?,
            latency_counts,
            latency_sum_us: d(self.latency_sum_us, earlier.latency_sum_us)?,
            batch_bounds: self.batch_bounds.clone(),
            batch_counts,
            batch_sum: d(self.batch_sum, earlier.batch_sum)?,
            fragment_cpu_ns: d(self.fragment_cpu_ns, earlier.fragment_cpu_ns)?,
            fragments: d(self.fragments, earlier.fragments)?,
            fragment_bytes: d(self.fragment_bytes, earlier.fragment_bytes)?,
            inference_cpu_ns: d(self.inference_cpu_ns, earlier.inference_cpu_ns)?,
        })
    }

    fn add(&mut self, d: &Counts) {
        for (k, v) in &d.answers {
            *self.answers.entry(k.clone()).or_default() += v;
        }
        self.arrivals += d.arrivals;
        self.within_slo += d.within_slo;
        self.batches += d.batches;
        self.batched_requests += d.batched_requests;
        self.shed += d.shed;
        self.slo_miss_batches += d.slo_miss_batches;
        self.fragment_cpu_ns += d.fragment_cpu_ns;
        self.fragments += d.fragments;
        self.fragment_bytes += d.fragment_bytes;
        self.inference_cpu_ns += d.inference_cpu_ns;
        if self.latency_counts.len() < d.latency_counts.len() {
            self.latency_counts.resize(d.latency_counts.len(), 0);
        }
        for (s, n) in self.latency_counts.iter_mut().zip(&d.latency_counts) {
            *s += n;
        }
        self.latency_sum_us += d.latency_sum_us;
        if self.batch_bounds != d.batch_bounds {
            // The first process, or one whose engine runs another largest
            // batch: a histogram's buckets cannot change, so its series
            // start again from this process's (Prometheus reads a reset).
            self.batch_bounds = d.batch_bounds.clone();
            self.batch_counts = vec![0; d.batch_counts.len()];
            self.batch_sum = 0;
        }
        for (s, n) in self.batch_counts.iter_mut().zip(&d.batch_counts) {
            *s += n;
        }
        self.batch_sum += d.batch_sum;
    }
}

/// The serving process's latest state (gauges).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ActiveGauges {
    /// Requests arrived and not yet answered.
    pub in_flight: u64,
    /// The batching policy's target batch size.
    pub target_batch: u64,
    /// The batching policy's tail factor (`BatchStats::tail_factor`).
    pub tail_factor: f64,
    /// Recent batches' wall time per CPU time of the engine's thread
    /// (`BatchStats::wall_per_cpu`).
    pub wall_per_cpu: f64,
    /// OK answers within the SLO of all answers, since the process started.
    pub slo_attainment: Option<f64>,
    /// Answers per second over the last rate window.
    pub throughput_per_s: f64,
    /// Arrivals per second over the last rate window.
    pub arrival_rate_per_s: f64,
    /// A GPU engine's device numbers (`None` for CPU engines).
    pub device: Option<kp_schema::telemetry::DeviceStats>,
}

/// What the daemon knows of one IF: its desired state and its life cycle.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct IfView {
    /// The IF's id.
    pub if_id: u16,
    /// Its model.
    pub model: String,
    /// `starting`, `active`, `switching`, `retiring` or `failed`.
    pub state: String,
    /// Its share of the device, percent.
    pub share_pct: f64,
    /// How the share is enforced: `cpu_cores`, `mps` or `none`.
    pub enforcement: &'static str,
    /// Whether the share is pinned by hand.
    pub pinned: bool,
    /// The cores its active runs on (its share, enforced, on a CPU host).
    pub cores: usize,
    /// Latency objective, ms.
    pub slo_ms: f64,
    /// Every switchover's gap so far, ns.
    pub switchover_gaps_ns: Vec<u64>,
    /// Actives that died and were replaced by their shadow.
    pub failovers: u64,
}

/// One IF's series.
#[derive(Clone, Debug, Default)]
pub struct IfSeries {
    /// The model (a label of every series).
    pub model: String,
    /// Counts summed over the IF's processes, by role.
    pub counts: BTreeMap<Role, Counts>,
    /// The active's latest gauges.
    pub active: Option<ActiveGauges>,
    /// What the daemon knows of it (`None` until it says).
    pub view: Option<IfView>,
    /// Tuning decisions by (reason, whether the demand changed).
    pub tuning_decisions: BTreeMap<(String, bool), u64>,
}

/// The platform's own numbers.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PlatformView {
    /// Times the if-manager died and the platform was restarted.
    pub platform_restarts: u64,
    /// Telemetry messages that did not parse.
    pub telemetry_rejected: u64,
    /// `gpu` (shares are MPS percentages) or `cpu` (sets of cores).
    pub device: &'static str,
    /// The if-manager's pid, while one runs.
    pub if_manager_pid: Option<u32>,
}

/// Why a telemetry message was not taken.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MetricsError {
    /// Its batch-size buckets are not a histogram's: no bound, bounds not
    /// strictly increasing, or not one count per bound and an overflow one.
    #[error("if {if_id} (pid {pid}): batch-size buckets {bounds:?} with {counts} counts are not a histogram's")]
    BatchBuckets {
        /// The IF.
        if_id: u16,
        /// The process.
        pid: u32,
        /// The bounds it sent.
        bounds: Vec<u64>,
        /// How many counts it sent.
        counts: usize,
    },
    /// Its latency buckets are not this build's [`LATENCY_BOUNDS_US`].
    #[error("if {if_id} (pid {pid}): latency buckets {got:?}, expected {LATENCY_BOUNDS_US:?} and one overflow count")]
    Buckets {
        /// The IF.
        if_id: u16,
        /// The process.
        pid: u32,
        /// The bounds it sent.
        got: Vec<u64>,
    },
}

/// Everything the endpoint exposes, accumulated.
#[derive(Clone, Debug, Default)]
pub struct PlatformMetrics {
    /// Per IF.
    pub ifs: BTreeMap<u16, IfSeries>,
    /// Each live IF process's last counts (and its IF), by pid.
    processes: BTreeMap<u32, (u16, Counts)>,
    /// Exited IF processes, newest last.
    gone: VecDeque<u32>,
    /// The platform's own numbers.
    pub platform: PlatformView,
    /// The if-manager's counters, summed over its processes.
    pub if_manager: Option<IfManagerCounters>,
    /// The last if-manager process's pid and counters.
    if_manager_last: Option<(u32, IfManagerCounters)>,
    /// Scrapes at which the if-manager did not answer.
    pub if_manager_unreachable: u64,
    /// Whether it answered at the last scrape.
    pub if_manager_answered: bool,
}

impl PlatformMetrics {
    /// Takes one telemetry message (a provisioning report changes nothing
    /// here).
    pub fn on_message(&mut self, msg: &IfMessage) -> Result<(), MetricsError> {
        let Publication::Telemetry {
            mode,
            telemetry,
            batching,
            device,
        } = &msg.body
        else {
            return Ok(());
        };
        let h = &telemetry.latency_histogram;
        if h.bounds_us != LATENCY_BOUNDS_US || h.counts.len() != LATENCY_BOUNDS_US.len() + 1 {
            return Err(MetricsError::Buckets {
                if_id: msg.if_id,
                pid: msg.pid,
                got: h.bounds_us.clone(),
            });
        }
        let b = &telemetry.batch_size_histogram;
        if !b.is_well_formed() {
            return Err(MetricsError::BatchBuckets {
                if_id: msg.if_id,
                pid: msg.pid,
                bounds: b.bounds.clone(),
                counts: b.counts.len(),
            });
        }
        if self.gone.contains(&msg.pid) {
            return Ok(());
        }
        let now = Counts::of(telemetry, batching);
        let increase = match self.processes.get(&msg.pid) {
            Some((if_id, last)) if *if_id == msg.if_id => {
                now.increase_over(last).unwrap_or_else(|| now.clone())
            }
            _ => now.clone(),
        };
        self.processes.insert(msg.pid, (msg.if_id, now));
        let role = Role::of_mode(mode);
        let series = self.ifs.entry(msg.if_id).or_default();
        if series.model != msg.model {
            // Another model under this if_id (retired and redeployed).
            *series = IfSeries {
                model: msg.model.clone(),
                ..IfSeries::default()
            };
        }
        series.counts.entry(role).or_default().add(&increase);
        if *mode == Mode::Active.name() {
            series.active = Some(ActiveGauges {
                in_flight: telemetry.arrivals.saturating_sub(telemetry.answers_total),
                target_batch: batching.target_batch as u64,
                tail_factor: batching.tail_factor,
                wall_per_cpu: batching.wall_per_cpu,
                slo_attainment: telemetry.slo_attainment,
                throughput_per_s: telemetry.throughput_per_s,
                arrival_rate_per_s: telemetry.arrival_rate_per_s,
                device: *device,
            });
        }
        Ok(())
    }

    /// IF process `pid` exited: its counts stay in its IF's series, and a
    /// message of it that comes late is ignored.
    pub fn process_exited(&mut self, pid: u32) {
        self.processes.remove(&pid);
        if self.gone.len() == GONE_REMEMBERED {
            self.gone.pop_front();
        }
        self.gone.push_back(pid);
    }

    /// The daemon's view of its IFs and the platform; the series of an IF
    /// not in `ifs` (retired) are dropped.
    pub fn set_views(&mut self, ifs: Vec<IfView>, platform: PlatformView) {
        let ids: Vec<u16> = ifs.iter().map(|v| v.if_id).collect();
        self.ifs.retain(|id, _| ids.contains(id));
        for v in ifs {
            let series = self.ifs.entry(v.if_id).or_default();
            if series.model != v.model {
                *series = IfSeries {
                    model: v.model.clone(),
                    ..IfSeries::default()
                };
            }
            series.view = Some(v);
        }
        self.platform = platform;
    }

    /// The serving process of `if_id` changed: the old one's gauges no
    /// longer describe it.
    pub fn new_active(&mut self, if_id: u16) {
        if let Some(s) = self.ifs.get_mut(&if_id) {
            s.active = None;
        }
    }

    /// One decision of the tuning loop for `if_id`.
    pub fn on_tuning_decision(&mut self, if_id: u16, reason: &str, changed: bool) {
        if let Some(s) = self.ifs.get_mut(&if_id) {
            *s.tuning_decisions
                .entry((reason.to_string(), changed))
                .or_default() += 1;
        }
    }

    /// The if-manager (process `pid`) counted `c` since it started.
    pub fn on_if_manager(&mut self, pid: u32, c: IfManagerCounters) {
        let increase = match &self.if_manager_last {
            Some((last_pid, last)) if *last_pid == pid => {
                c.increase_over(last).unwrap_or_else(|| c.clone())
            }
            _ => c.clone(),
        };
        match &mut self.if_manager {
            Some(sum) => sum.add(&increase),
            None => self.if_manager = Some(increase),
        }
        self.if_manager_last = Some((pid, c));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kp_schema::messages::PortCounters;
    use kp_schema::telemetry::{
        batch_size_bounds, BatchSizeHistogram, LatencyHistogram, ThreadCpu,
    };

    /// A message of process `pid` of IF 1 in `mode` with `ok` OK answers
    /// of 3 ms each and `shed` OVERLOADED ones.
    pub(super) fn message(pid: u32, mode: &str, ok: u64, shed: u64) -> IfMessage {
        let mut counts = vec![0; LATENCY_BOUNDS_US.len() + 1];
        counts[LatencyHistogram::bucket_of(3_000)] = ok;
        IfMessage {
            pid,
            if_id: 1,
            model: "squeezenet".into(),
            body: Publication::Telemetry {
                mode: mode.into(),
                telemetry: TelemetrySnapshot {
                    arrivals: ok + shed + 2,
                    answers: [("ok".to_string(), ok), ("overloaded".to_string(), shed)].into(),
                    answers_total: ok + shed,
                    answers_within_slo: ok,
                    batches: ok / 2,
                    batched_requests: ok,
                    latency_histogram: LatencyHistogram {
                        bounds_us: LATENCY_BOUNDS_US.to_vec(),
                        counts,
                        sum_us: 3_000 * ok,
                    },
                    // `ok / 2` batches of 2 (bounds 1, 2, 4, 8).
                    batch_size_histogram: BatchSizeHistogram {
                        bounds: batch_size_bounds(8),
                        counts: vec![0, ok / 2, 0, 0, 0],
                        sum: ok / 2 * 2,
                    },
                    slo_attainment: Some(0.5),
                    // 1.5 ms of the fragment thread's CPU per answer, over
                    // 150 fragments of 1 KiB each; 5 ms of inference.
                    threads: ThreadCpu {
                        fragment_thread_seconds: ok as f64 * 0.0015,
                        fragments: 150 * ok,
                        fragment_payload_bytes: 150 * 1024 * ok,
                        fragment_us_per_kib: (ok > 0).then_some(10.0),
                        inference_thread_seconds: ok as f64 * 0.005,
                    },
                    ..TelemetrySnapshot::default()
                },
                batching: BatchStats {
                    target_batch: 4,
                    shed,
                    ..BatchStats::default()
                },
                device: None,
            },
        }
    }

    fn ok_of(m: &PlatformMetrics, role: Role) -> u64 {
        m.ifs[&1].counts.get(&role).map_or(0, |c| c.answers["ok"])
    }

    #[test]
    fn a_switchover_adds_the_successors_counts_and_never_goes_down() {
        let mut m = PlatformMetrics::default();
        m.on_message(&message(100, "active", 10, 1)).unwrap();
        m.on_message(&message(100, "active", 25, 1)).unwrap();
        assert_eq!(ok_of(&m, Role::Active), 25);
        // The shadow is promoted: its own counters start from zero.
        m.on_message(&message(200, "standby", 0, 0)).unwrap();
        m.on_message(&message(200, "active", 4, 0)).unwrap();
        assert_eq!(ok_of(&m, Role::Active), 29);
        // The old one finishes what it held and says so once more.
        m.on_message(&message(100, "draining", 27, 1)).unwrap();
        assert_eq!(ok_of(&m, Role::Active), 31);
        m.process_exited(100);
        // A late copy of its last message counts nothing.
        m.on_message(&message(100, "done", 27, 1)).unwrap();
        let c = &m.ifs[&1].counts[&Role::Active];
        assert_eq!(c.answers["ok"], 31);
        assert_eq!(c.answers["overloaded"], 1);
        assert_eq!(c.shed, 1);
        assert_eq!(c.latency_counts.iter().sum::<u64>(), 31);
        assert_eq!(c.latency_sum_us, 31 * 3_000);
        // Batches of 2: 12 of the first process, 2 of its successor, 1 more
        // of the first (27 / 2 - 25 / 2).
        assert_eq!(c.batch_bounds, [1, 2, 4, 8]);
        assert_eq!(c.batch_counts, [0, 15, 0, 0, 0]);
        assert_eq!(c.batch_sum, 30);
        assert_eq!(ok_of(&m, Role::Shadow), 0);
        assert_eq!(m.ifs[&1].active.unwrap().in_flight, 2);
    }

    #[test]
    fn a_reused_pid_whose_counts_went_down_is_a_new_process() {
        let mut m = PlatformMetrics::default();
        m.on_message(&message(100, "active", 10, 0)).unwrap();
        m.on_message(&message(100, "active", 3, 0)).unwrap();
        assert_eq!(ok_of(&m, Role::Active), 13);
    }

    #[test]
    fn other_latency_buckets_are_refused_not_mislabelled() {
        let mut msg = message(100, "active", 10, 0);
        if let Publication::Telemetry { telemetry, .. } = &mut msg.body {
            telemetry.latency_histogram.bounds_us[0] = 100;
        }
        let mut m = PlatformMetrics::default();
        let e = m.on_message(&msg).unwrap_err();
        assert!(e.to_string().contains("latency buckets"), "{e}");
        assert!(m.ifs.is_empty());
    }

    #[test]
    fn a_restarted_if_manager_adds_to_its_predecessors_counts() {
        let counters = |delivered: u64| IfManagerCounters {
            rx_packets: delivered,
            outcomes: [("delivered".to_string(), delivered)].into(),
            port: PortCounters {
                ipackets: delivered + 1,
                ..PortCounters::default()
            },
            ..IfManagerCounters::default()
        };
        let mut m = PlatformMetrics::default();
        m.on_if_manager(10, counters(100));
        m.on_if_manager(10, counters(150));
        m.on_if_manager(11, counters(7));
        let c = m.if_manager.as_ref().unwrap();
        assert_eq!(c.outcomes["delivered"], 157);
        assert_eq!(c.rx_packets, 157);
        // The new process's port counts from 0 too (its port was
        // re-initialised): 151 + 8.
        assert_eq!(c.port.ipackets, 159);
    }

    #[test]
    fn batch_buckets_that_are_not_a_histogram_are_refused() {
        let mut msg = message(100, "active", 10, 0);
        if let Publication::Telemetry { telemetry, .. } = &mut msg.body {
            telemetry.batch_size_histogram.counts.pop();
        }
        let mut m = PlatformMetrics::default();
        let e = m.on_message(&msg).unwrap_err();
        assert!(e.to_string().contains("batch-size buckets"), "{e}");
        assert!(m.ifs.is_empty());
    }

    #[test]
    fn a_successor_with_another_largest_batch_starts_the_histogram_again() {
        let mut m = PlatformMetrics::default();
        m.on_message(&message(100, "active", 10, 0)).unwrap();
        let mut msg = message(200, "active", 4, 0);
        if let Publication::Telemetry { telemetry, .. } = &mut msg.body {
            telemetry.batch_size_histogram = BatchSizeHistogram {
                bounds: batch_size_bounds(4),
                counts: vec![0, 0, 1, 0],
                sum: 4,
            };
        }
        m.on_message(&msg).unwrap();
        let c = &m.ifs[&1].counts[&Role::Active];
        assert_eq!(c.batch_bounds, [1, 2, 4]);
        assert_eq!(
            (c.batch_counts.as_slice(), c.batch_sum),
            (&[0, 0, 1, 0][..], 4)
        );
        assert_eq!(c.batches, 5 + 2, "the counters go on");
    }

    #[test]
    fn a_retired_if_loses_its_series() {
        let mut m = PlatformMetrics::default();
        m.on_message(&message(100, "active", 10, 0)).unwrap();
        m.set_views(vec![], PlatformView::default());
        assert!(m.ifs.is_empty());
    }
}
