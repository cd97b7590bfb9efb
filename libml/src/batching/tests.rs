//! Tests of the batching policy. Most run against a **simulation**: virtual
//! time, synthetic arrivals (constant or Poisson, from a seeded generator)
//! and a synthetic engine whose batch latency is `a + b·n` plus optional
//! seeded noise. Nothing here measures a real engine; the numbers say how
//! the policy behaves on that model, not how fast any model runs.

use super::*;
use proptest::prelude::*;

const MS: u64 = 1_000_000;

/// SplitMix64: small, seeded, good enough for arrival gaps and noise.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in (0, 1).
    fn unit(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }
}

#[derive(Clone, Copy, Debug)]
enum Arrivals {
    Constant {
        per_s: f64,
    },
    Poisson {
        per_s: f64,
    },
    /// A closed loop (bench-if's saturation phase): `outstanding` requests
    /// from the start, and each answered or shed one is followed by a new
    /// one `think_ns` later.
    Closed {
        outstanding: usize,
        think_ns: u64,
    },
}

impl Arrivals {
    fn gap_ns(&self, rng: &mut Rng) -> u64 {
        match *self {
            Arrivals::Constant { per_s } => (1e9 / per_s).round() as u64,
            Arrivals::Poisson { per_s } => (-rng.unit().ln() * 1e9 / per_s).round() as u64,
            Arrivals::Closed { .. } => u64::MAX / 2,
        }
    }
}

/// The simulated engine: a batch of `n` runs in `(a + b·n·(1 +
/// convex·(n − 1)))·(1 ± noise)`; `convex` is 0 (affine) unless set; with
/// probability `spike_p` a batch takes `spike` times as long (a thread
/// preempted mid-batch: the right-skewed tail of a shared core).
#[derive(Clone, Copy, Debug)]
struct Engine {
    a_ns: f64,
    b_ns: f64,
    noise: f64,
    convex: f64,
    spike_p: f64,
    spike: f64,
    /// A batch right after a bigger one costs `1 + switch·min(bigger − n,
    /// 3)` times as much (0: nothing): ONNX Runtime on the Intel Xeon VM,
    /// squeezenet alone (`kp-engine-bench --cycle`): a batch of 1 5.39 ms
    /// back to back, 5.67 after a batch of 2, 5.90 after 3, 6.04 after 4.
    switch: f64,
}

impl Engine {
    fn new(a_ms: f64, b_ms: f64, noise: f64) -> Self {
        Engine {
            a_ns: a_ms * 1e6,
            b_ns: b_ms * 1e6,
            noise,
            convex: 0.0,
            spike_p: 0.0,
            spike: 1.0,
            switch: 0.0,
        }
    }

    /// The same engine, a batch right after a bigger one dearer by
    /// `switch` per size of difference (at most 3).
    fn switching(self, switch: f64) -> Self {
        Engine { switch, ..self }
    }

    /// What a batch of `n` costs right after one of `prev`, relative to
    /// back to back.
    fn switch_factor(&self, prev: usize, n: usize) -> f64 {
        1.0 + self.switch * prev.saturating_sub(n).min(3) as f64
    }

    /// The same engine, a batch taking `factor` times as long with
    /// probability `p`.
    fn spiky(self, p: f64, factor: f64) -> Self {
        Engine {
            spike_p: p,
            spike: factor,
            ..self
        }
    }

    /// The same engine, each request of a batch of `n` costing `1 +
    /// convex·(n − 1)` times what it costs alone (caches spilled by bigger
    /// batches: what a CPU engine does on a small-cache machine).
    fn convex(self, convex: f64) -> Self {
        Engine { convex, ..self }
    }

    fn cost_ns(&self, n: usize) -> f64 {
        self.a_ns + self.b_ns * n as f64 * (1.0 + self.convex * (n as f64 - 1.0))
    }

    /// The mean of [`exec_ns`](Self::exec_ns) (the noise is symmetric).
    fn mean_ns(&self, n: usize) -> f64 {
        self.cost_ns(n) * (1.0 + self.spike_p * (self.spike - 1.0))
    }

    fn exec_ns(&self, n: usize, rng: &mut Rng) -> u64 {
        let jitter = 1.0 + self.noise * (2.0 * rng.unit() - 1.0);
        let spike = if self.spike_p > 0.0 && rng.unit() < self.spike_p {
            self.spike
        } else {
            1.0
        };
        (self.cost_ns(n) * jitter * spike).round() as u64
    }
}

#[derive(Clone, Copy, Debug)]
struct BatchRecord {
    n: usize,
    target_after: usize,
    max_e2e_ns: u64,
}

/// One IF in virtual time: a queue, the policy, the synthetic engine.
struct Sim {
    policy: BatchPolicy,
    now: u64,
    queue: Vec<u64>,
    arrivals: Arrivals,
    next_arrival: u64,
    engine: Engine,
    /// How long a request takes to arrive after its first fragment, in ns,
    /// uniform in this range (`(0, 0)`: at once). Its age, and its SLO,
    /// count from the first fragment, as kp-if's do.
    span: (u64, u64),
    /// Requests still arriving: (complete at, first fragment at).
    arriving: Vec<(u64, u64)>,
    /// The running batch: when it ends, its wall time, its time on the
    /// CPU, its requests' first fragments.
    running: Option<(u64, u64, u64, Vec<u64>)>,
    wake: Option<u64>,
    rng: Rng,
    batches: Vec<BatchRecord>,
    e2e: Vec<u64>,
    shed: u64,
    reports: Vec<ProvisioningReport>,
    /// Whether a request is refused at its first fragment while the IF
    /// holds [`BatchPolicy::admission_limit`] complete requests (queued or
    /// in the running batch), as kp-if's fragment thread refuses it.
    admission: bool,
    refused: u64,
    /// Slow spells of the whole machine: every `period` ns, for `len` ns,
    /// batches take `factor` times as long (a VM's speed drifts, and a
    /// spell slows whatever batch size runs in it).
    spells: Option<(u64, u64, f64)>,
    /// A core shared with the fragment thread: every request that arrives
    /// while a batch runs takes this many ns of the engine's thread (its
    /// fragments), which the batch's wall time holds and its CPU time
    /// does not (0: a core of its own).
    fragment_ns: u64,
    /// Whether the policy is given each batch's CPU time
    /// ([`BatchPolicy::on_batch_done_on_cpu`]) or only its wall time.
    cpu_clock: bool,
    /// The size of the batch that ran last (0: none yet).
    last_n: usize,
    /// A batch that starts after the engine idled for at least `.0` ns
    /// costs `.1` times as much (caches gone cold while the thread
    /// dozed: kp-if's engine after a doze, docs/PERFORMANCE-JOURNAL.md,
    /// 2 December, fourth); `None`: no such cost.
    cold: Option<(u64, f64)>,
    /// When the last batch ended (0: none yet).
    last_end: u64,
}

impl Sim {
    fn new(cfg: BatchConfig, arrivals: Arrivals, engine: Engine, seed: u64) -> Self {
        let mut rng = Rng(seed);
        let next_arrival = arrivals.gap_ns(&mut rng);
        let arriving = match arrivals {
            Arrivals::Closed { outstanding, .. } => {
                (1..=outstanding as u64).map(|t| (t, t)).collect()
            }
            _ => Vec::new(),
        };
        Sim {
            policy: BatchPolicy::new(cfg).unwrap(),
            now: 0,
            queue: Vec::new(),
            arrivals,
            next_arrival,
            engine,
            span: (0, 0),
            arriving,
            running: None,
            wake: None,
            rng,
            batches: Vec::new(),
            e2e: Vec::new(),
            shed: 0,
            reports: Vec::new(),
            admission: false,
            refused: 0,
            spells: None,
            fragment_ns: 0,
            cpu_clock: false,
            last_n: 0,
            cold: None,
            last_end: 0,
        }
    }

    fn run_until(&mut self, end_ns: u64) {
        while self.next_event() <= end_ns {
            self.step();
        }
    }

    fn run_batches(&mut self, k: usize) {
        let goal = self.batches.len() + k;
        while self.batches.len() < goal {
            self.step();
        }
    }

    /// The same simulation, each request arriving over a span uniform in
    /// `[min_ns, max_ns]` after its first fragment.
    fn with_spans(mut self, min_ns: u64, max_ns: u64) -> Self {
        self.span = (min_ns, max_ns);
        self
    }

    /// The same simulation with admission at the first fragment.
    fn with_admission(mut self) -> Self {
        self.admission = true;
        self
    }

    /// Requests shed, refused or answered past `slo`, over all requests.
    fn failed_fraction(&self, slo: u64) -> f64 {
        let late = self.e2e.iter().filter(|&&e| e > slo).count() as u64;
        let all = self.e2e.len() as u64 + self.shed + self.refused;
        (self.shed + self.refused + late) as f64 / all as f64
    }

    fn next_event(&self) -> u64 {
        let done = self.running.as_ref().map_or(u64::MAX, |r| r.0);
        let complete = self.arriving.iter().map(|r| r.0).min().unwrap_or(u64::MAX);
        self.next_arrival
            .min(done)
            .min(complete)
            .min(self.wake.unwrap_or(u64::MAX))
    }

    fn step(&mut self) {
        let t = self.next_event();
        assert!(t >= self.now);
        self.now = t;
        while self.next_arrival <= t {
            let held = self.queue.len() + self.running.as_ref().map_or(0, |r| r.3.len());
            if self.admission && self.policy.admission_limit().is_some_and(|l| held >= l) {
                self.refused += 1;
                self.policy.note_refused(self.next_arrival);
                self.next_arrival += self.arrivals.gap_ns(&mut self.rng).max(1);
                continue;
            }
            let (lo, hi) = self.span;
            let span = lo + ((hi - lo) as f64 * self.rng.unit()) as u64;
            self.arriving
                .push((self.next_arrival + span, self.next_arrival));
            self.next_arrival += self.arrivals.gap_ns(&mut self.rng).max(1);
        }
        // Complete requests join the queue in the order they complete, as
        // in kp-if, which is not always the order of their first fragments.
        self.arriving.sort_unstable();
        let complete = self.arriving.partition_point(|r| r.0 <= t);
        self.queue
            .extend(self.arriving.drain(..complete).map(|(_, first)| first));
        if self.running.as_ref().is_some_and(|r| r.0 == t) {
            let (_, wall, on_cpu, reqs) = self.running.take().unwrap();
            self.last_end = t;
            let max_e2e = reqs.iter().map(|a| t - a).max().unwrap();
            self.e2e.extend(reqs.iter().map(|a| t - a));
            self.next_of_closed_loop(reqs.len());
            let on_cpu = if self.cpu_clock { on_cpu } else { wall };
            let report = self
                .policy
                .on_batch_done_on_cpu(reqs.len(), wall, on_cpu, max_e2e, t);
            if let Some(r) = report {
                self.reports.push(r);
            }
            self.batches.push(BatchRecord {
                n: reqs.len(),
                target_after: self.policy.target_batch(),
                max_e2e_ns: max_e2e,
            });
        }
        if self.wake == Some(t) {
            self.wake = None;
        }
        self.poll();
    }

    fn poll(&mut self) {
        let idle = self.running.is_none();
        if idle {
            let k = self.policy.shed(self.now, &self.queue);
            self.shed += k as u64;
            self.queue.drain(..k);
            self.next_of_closed_loop(k);
        }
        match self.policy.decide(self.now, &self.queue, idle) {
            Decision::Dispatch { batch } => {
                assert!(idle && batch >= 1 && batch <= self.queue.len());
                let reqs: Vec<u64> = self.queue.drain(..batch).collect();
                let mut exec = self.engine.exec_ns(batch, &mut self.rng);
                if let Some((period, len, factor)) = self.spells {
                    if self.now % period < len {
                        exec = (exec as f64 * factor).round() as u64;
                    }
                }
                exec = (exec as f64 * self.engine.switch_factor(self.last_n, batch)).round() as u64;
                self.last_n = batch;
                if let Some((idle_ns, factor)) = self.cold {
                    if self.now.saturating_sub(self.last_end) >= idle_ns {
                        exec = (exec as f64 * factor).round() as u64;
                    }
                }
                // The fragments of what arrives meanwhile preempt the
                // engine's thread on a shared core.
                let ends = self.now + exec;
                let meanwhile = self.arriving.iter().filter(|r| r.0 < ends).count() as u64;
                let wall = exec + meanwhile * self.fragment_ns;
                self.running = Some((self.now + wall, wall, exec, reqs));
                self.wake = None;
            }
            Decision::Wait { until_ns } => {
                assert!(idle && until_ns > self.now);
                self.wake = Some(until_ns);
            }
            Decision::Idle => {
                assert!(!idle || self.queue.is_empty());
                self.wake = None;
            }
        }
    }

    /// In a closed loop, the requests that follow `k` answered or shed.
    fn next_of_closed_loop(&mut self, k: usize) {
        if let Arrivals::Closed { think_ns, .. } = self.arrivals {
            let (lo, hi) = self.span;
            for _ in 0..k {
                let first = self.now + think_ns;
                let span = lo + ((hi - lo) as f64 * self.rng.unit()) as u64;
                self.arriving.push((first + span, first));
            }
        }
    }

    fn percentile_e2e(&self, from_request: usize, p: f64) -> u64 {
        percentile(&self.e2e[from_request..], p)
    }
}

fn percentile(v: &[u64], p: f64) -> u64 {
    let mut v = v.to_vec();
    v.sort_unstable();
    let i = ((v.len() as f64 * p).ceil() as usize).clamp(1, v.len()) - 1;
    v[i]
}

/// The batch the policy should settle on, computed by brute force from the
/// *true* engine parameters and arrival rate, independently of the policy's
/// estimates: the feasible batches are those with `2·(a + b·n) ≤ slo·(1 −
/// margin)`; among them the smallest whose throughput is within the
/// tolerance of the best one and at least `load_headroom ×` the arrival rate
/// (or within [`BEST_MARGIN`] of the best, when nothing is).
fn best_batch(cfg: &BatchConfig, e: &Engine, rate_per_s: f64) -> usize {
    let budget = cfg.slo_ns as f64 * (1.0 - cfg.margin);
    let cost = |n: usize| e.a_ns + e.b_ns * n as f64;
    let thr = |n: usize| n as f64 / cost(n) * 1e9;
    let feasible: Vec<usize> = (1..=cfg.max_batch)
        .filter(|&n| 2.0 * cost(n) <= budget)
        .collect();
    let Some(&n_max) = feasible.last() else {
        return 1;
    };
    let best = thr(n_max);
    let need = (rate_per_s * cfg.load_headroom).min((1.0 - BEST_MARGIN) * best);
    let enough = ((1.0 - cfg.throughput_tolerance) * best).max(need);
    feasible
        .into_iter()
        .find(|&n| thr(n) >= enough * (1.0 - 1e-9))
        .unwrap()
}

fn largest_feasible(cfg: &BatchConfig, e: &Engine) -> usize {
    let budget = cfg.slo_ns as f64 * (1.0 - cfg.margin);
    (1..=cfg.max_batch)
        .rev()
        .find(|&n| 2.0 * (e.a_ns + e.b_ns * n as f64) <= budget)
        .unwrap_or(1)
}

// ---------------------------------------------------------------- config

#[test]
fn defaults_are_documented_values_and_validate() {
    let c = BatchConfig::new(40 * MS);
    assert_eq!(c.max_batch, 32);
    assert_eq!(c.report_after, 5);
    assert_eq!(c.margin, 0.1);
    assert_eq!(c.rate_window_ns, 400 * MS);
    assert_eq!(BatchConfig::new(2_000 * MS).rate_window_ns, 1_000 * MS);
    assert!(c.validate().is_ok());
    assert_eq!(
        BatchConfig::new(0).validate(),
        Err(BatchConfigError::ZeroSlo)
    );
    let bad = BatchConfig {
        margin: 1.0,
        ..BatchConfig::new(MS)
    };
    assert!(matches!(
        BatchPolicy::new(bad),
        Err(BatchConfigError::OutOfRange { name: "margin", .. })
    ));
    let bad = BatchConfig {
        max_batch: 0,
        ..BatchConfig::new(MS)
    };
    assert_eq!(bad.validate(), Err(BatchConfigError::ZeroMaxBatch));
}

// ---------------------------------------------------------------- decide basics

#[test]
fn idle_when_empty_or_busy_and_dispatches_at_cold_start() {
    let mut p = BatchPolicy::new(BatchConfig::new(40 * MS)).unwrap();
    assert_eq!(p.decide(0, &[], true), Decision::Idle);
    assert_eq!(p.decide(5, &[1, 2, 3], false), Decision::Idle);
    // Nothing learnt yet: run the target (1) at once, never wait blind.
    assert_eq!(
        p.decide(6, &[1, 2, 3], true),
        Decision::Dispatch { batch: 1 }
    );
    assert!(p.cost_model().is_none());
}

#[test]
fn one_batch_size_only_is_explored_on_purpose() {
    let mut p = BatchPolicy::new(BatchConfig::new(100 * MS)).unwrap();
    // Batch 4 at 44 ms: the SLAB step keeps 4 (4 · 45/44 rounds down to 4).
    for i in 0..3 {
        p.on_batch_done(4, 44 * MS, 60 * MS, i);
    }
    let m = p.cost_model().unwrap();
    assert_eq!(m.source, CostSource::Proportional);
    assert_eq!(m.a_ns, 0.0);
    assert_eq!(p.target_batch(), 4);
    let queue: Vec<u64> = (0..10).map(|i| 1_000 * MS + i).collect();
    assert_eq!(
        p.decide(1_000 * MS + 10, &queue, true),
        Decision::Dispatch { batch: 3 }
    );
    assert_eq!(p.stats().explorations, 1);
    p.on_batch_done(3, 41 * MS, 50 * MS, 1_000 * MS);
    let m = p.cost_model().unwrap();
    assert_eq!(m.source, CostSource::Fitted);
    assert!((m.a_ns - 32.0 * MS as f64).abs() < 1e3, "{m:?}");
    assert!((m.b_ns - 3.0 * MS as f64).abs() < 1e3, "{m:?}");
}

// ---------------------------------------------------------------- the fit

/// The costs are learnt on the CPU clock, the predictions are those costs
/// times the recent wall / CPU time, and a driver without a CPU clock
/// changes nothing.
#[test]
fn learns_costs_on_the_cpu_clock_and_predicts_wall_time() {
    let mut p = BatchPolicy::new(BatchConfig::new(100 * MS)).unwrap();
    // Batches of 1 and 2 that ran 5 and 10 ms on the CPU, 6 and 12 on the
    // wall clock.
    for i in 0..10 {
        let n = 1 + (i % 2) as usize;
        let cpu = 5 * MS * n as u64;
        p.on_batch_done_on_cpu(n, cpu * 6 / 5, cpu, 20 * MS, i * 20 * MS);
    }
    let m = p.cost_model().unwrap();
    assert_eq!(m.source, CostSource::Fitted);
    assert!((m.b_ns - 5.0 * MS as f64).abs() < 1e3, "{m:?}");
    assert!(m.a_ns.abs() < 1e3, "{m:?}");
    assert!(
        (p.wall_per_cpu() - 1.2).abs() < 1e-9,
        "{}",
        p.wall_per_cpu()
    );
    assert!((p.predicted_ns(&m, 1) - 6.0 * MS as f64).abs() < 1e3);
    assert!((p.predicted_ns(&m, 2) - 12.0 * MS as f64).abs() < 1e3);
    assert!((p.stats().wall_per_cpu - 1.2).abs() < 1e-9);
    // On time against the wall-clock prediction: no tail.
    assert_eq!(p.tail_factor(), 1.0);
    // The thread preempted for longer: ρ moves a tenth of the way per
    // batch, the costs stay.
    p.on_batch_done_on_cpu(1, 7 * MS, 5 * MS, 20 * MS, 300 * MS);
    assert!((p.wall_per_cpu() - (1.2 + 0.1 * 0.2)).abs() < 1e-9);
    assert!((p.predicted_ns(&m, 1) - 5.0 * MS as f64 * 1.22).abs() < 1e3);
    // A CPU time of 0 (no clock) or above the wall time counts as the wall
    // time: ρ 1 for those batches.
    let mut q = BatchPolicy::new(BatchConfig::new(100 * MS)).unwrap();
    q.on_batch_done_on_cpu(1, 5 * MS, 0, 20 * MS, MS);
    assert_eq!(q.wall_per_cpu(), 1.0);
    q.on_batch_done_on_cpu(1, 5 * MS, 6 * MS, 20 * MS, 2 * MS);
    assert_eq!(q.wall_per_cpu(), 1.0);
    assert_eq!(q.predicted_ns(&q.cost_model().unwrap(), 1), 5.0 * MS as f64);
    // A driver without a CPU clock: ρ is exactly 1 and predictions are
    // the wall times, as before the clock existed.
    let mut r = BatchPolicy::new(BatchConfig::new(100 * MS)).unwrap();
    for i in 0..10 {
        r.on_batch_done(1 + (i % 2) as usize, 6 * MS * (1 + i % 2), 20 * MS, i * MS);
    }
    assert_eq!(r.wall_per_cpu(), 1.0);
    assert!((r.predicted_ns(&r.cost_model().unwrap(), 2) - 12.0 * MS as f64).abs() < 1e3);
}

/// A batch right after one of another size costs what a switch costs, not
/// what its size costs back to back (module doc, "Switching sizes"): it
/// teaches a size not measured yet, nothing else; a probe runs its size
/// twice, and the second batch is learnt.
#[test]
fn learns_a_size_from_batches_after_the_same_size_and_probes_twice() {
    let mut p = BatchPolicy::new(BatchConfig::new(100 * MS)).unwrap();
    for i in 0..5 {
        p.on_batch_done(1, 5 * MS, 10 * MS, i * MS);
    }
    // The first batch of 3, after the 1s: the only news of its size.
    p.on_batch_done(3, 18 * MS, 20 * MS, 10 * MS);
    let m = p.cost_model().unwrap();
    assert_eq!(p.predicted_ns(&m, 3), 18.0 * MS as f64);
    // A 1 after the 3, dearer: a switch, not learnt.
    p.on_batch_done(1, 6 * MS, 10 * MS, 20 * MS);
    let m = p.cost_model().unwrap();
    assert_eq!(p.predicted_ns(&m, 1), 5.0 * MS as f64);
    // The next 1, after a 1: learnt, with the weight of a sixth sample
    // (at least 0.2).
    p.on_batch_done(1, 5_500_000, 10 * MS, 30 * MS);
    let m = p.cost_model().unwrap();
    assert!((p.predicted_ns(&m, 1) - 5.1 * MS as f64).abs() < 1.0);
    // A 3 after the 1s: a switch again, its estimate stays.
    p.on_batch_done(3, 20 * MS, 25 * MS, 40 * MS);
    let m = p.cost_model().unwrap();
    assert_eq!(p.predicted_ns(&m, 3), 18.0 * MS as f64);

    // Probes: a policy planning batches of 4 (1 + 4·n ms: batch 1 serves
    // 0.85 of batch 4's rate) whose batch of 1 was last measured more
    // than SIZE_STALE_NS ago runs 1 twice when a full batch is queued,
    // and learns from the second.
    let mut p = trained(100, 1, 4);
    let limit = p.batch_limit();
    assert_eq!(limit, 4);
    let now = 2 * SIZE_STALE_NS;
    let queue: Vec<u64> = (0..limit as u64).map(|i| now - 1_000 + i).collect();
    assert_eq!(p.decide(now, &queue, true), Decision::Dispatch { batch: 1 });
    // The probe ran slow after the bigger batches: a switch, not learnt.
    p.on_batch_done(1, 7 * MS, 7 * MS, now + 7 * MS);
    let t = now + 7 * MS;
    let queue: Vec<u64> = (0..limit as u64).map(|i| t - 1_000 + i).collect();
    assert_eq!(p.decide(t, &queue, true), Decision::Dispatch { batch: 1 });
    let m = p.cost_model().unwrap();
    assert_eq!(p.predicted_ns(&m, 1), 5.0 * MS as f64);
    // The second, after a 1: below the target, it replaces the stale
    // estimate.
    p.on_batch_done(1, 5_500_000, 5_500_000, t + 5_500_000);
    let m = p.cost_model().unwrap();
    assert!((p.predicted_ns(&m, 1) - 5.5 * MS as f64).abs() < 1.0);
    // Batch 1 is fresh now; the next stale size below the plan is 2 (the
    // two samples of batch 1 moved the line, and the plan with it).
    let t = t + 5_500_000;
    let queue: Vec<u64> = (0..p.batch_limit() as u64).map(|i| t - 1_000 + i).collect();
    assert_eq!(p.decide(t, &queue, true), Decision::Dispatch { batch: 2 });
    // A size far below the plan's rate is not probed: under a = 8 ms,
    // b = 1 ms batch 1 serves a third of batch 4's rate, and no drift
    // makes it the best (module doc, "Probes").
    let mut p = trained(100, 8, 1);
    let limit = p.batch_limit();
    assert!(limit >= 4, "limit {limit}");
    let queue: Vec<u64> = (0..limit as u64).map(|i| now - 1_000 + i).collect();
    assert_eq!(
        p.decide(now, &queue, true),
        Decision::Dispatch { batch: limit }
    );
}

#[test]
fn fit_is_exact_without_noise() {
    let mut p = BatchPolicy::new(BatchConfig::new(1_000 * MS)).unwrap();
    for (i, n) in [1usize, 2, 4, 8, 16, 5, 3].into_iter().enumerate() {
        p.on_batch_done(n, 8 * MS + n as u64 * MS, 10 * MS, i as u64);
    }
    let m = p.cost_model().unwrap();
    assert_eq!(m.source, CostSource::Fitted);
    assert!((m.a_ns / 8e6 - 1.0).abs() < 1e-9, "{m:?}");
    assert!((m.b_ns / 1e6 - 1.0).abs() < 1e-9, "{m:?}");
}

/// The admission limit: none before a cost model, then the batch limit
/// times the batches of that size that fit in the SLO, plus two; the tail
/// factor does not change it.
#[test]
fn admission_limit_is_what_misses_the_slo_by_more_than_a_batch() {
    let mut p = BatchPolicy::new(BatchConfig::new(100 * MS)).unwrap();
    assert_eq!(p.admission_limit(), None);
    // a = 8 ms, b = 1 ms: exact after these.
    for (i, n) in [1usize, 2, 4, 8, 16, 5, 3].into_iter().enumerate() {
        p.on_batch_done(n, 8 * MS + n as u64 * MS, 10 * MS, i as u64);
    }
    let n = p.batch_limit();
    let cost = p.predicted_ns(&p.cost_model().unwrap(), n);
    let k = (100e6 / cost).floor() as usize + 2;
    assert_eq!(p.admission_limit(), Some(n * k));
    // Behind n·k held requests a new one ends k batches later at the
    // least, past the SLO by more than a batch; behind n·(k − 1), within
    // a batch of it.
    assert!(k as f64 * cost > 100e6 + cost);
    assert!((k - 1) as f64 * cost <= 100e6 + cost);
    // A batch 1.5 times as long as predicted raises the tail factor, not
    // the admission limit's batches.
    p.on_batch_done(n, (1.5 * cost) as u64, 10 * MS, 100);
    assert!((p.tail_factor() - 1.5).abs() < 1e-3, "{}", p.tail_factor());
    let cost = p.predicted_ns(&p.cost_model().unwrap(), p.batch_limit());
    let k = (100e6 / cost).floor() as usize + 2;
    assert_eq!(p.admission_limit(), Some(p.batch_limit() * k));
    // Under pressure (a request refused within the last SLO) admission
    // refuses what would end past the SLO with the running batch half done
    // and one batch among those ahead running slow.
    let now = 200 * MS;
    p.note_refused(now);
    assert!(p.under_pressure(now));
    let n = p.batch_limit();
    let cost = p.predicted_ns(&p.cost_model().unwrap(), n);
    p.on_batch_done(n, cost as u64, 10 * MS, now + 1);
    let tau = p.tail_factor();
    let cost = p.predicted_ns(&p.cost_model().unwrap(), p.batch_limit());
    let k = ((100e6 / cost - (tau - 1.0) + 0.5).floor() as usize).max(2);
    assert_eq!(p.admission_limit(), Some(p.batch_limit() * k));
    assert!((k as f64 - 0.5) * cost + (tau - 1.0) * cost <= 100e6 * (1.0 + 1e-9));
    assert!((k as f64 + 0.5) * cost + (tau - 1.0) * cost > 100e6);
    // A batch that ends more than an SLO after the last refusal relaxes it.
    let later = now + 100 * MS + 2;
    assert!(!p.under_pressure(later));
    let cost = p.predicted_ns(&p.cost_model().unwrap(), p.batch_limit());
    p.on_batch_done(p.batch_limit(), cost as u64, 10 * MS, later);
    let cost = p.predicted_ns(&p.cost_model().unwrap(), p.batch_limit());
    let k = (100e6 / cost).floor() as usize + 2;
    assert_eq!(p.admission_limit(), Some(p.batch_limit() * k));
    // An engine slower than the SLO still lets two batches in.
    let mut slow = BatchPolicy::new(BatchConfig::new(10 * MS)).unwrap();
    slow.on_batch_done(1, 30 * MS, 30 * MS, 1);
    assert_eq!(slow.admission_limit(), Some(2 * slow.batch_limit()));
}

#[test]
fn fit_recovers_a_and_b_from_noisy_samples() {
    let mut rng = Rng(7);
    let engine = Engine::new(8.0, 1.0, 0.05);
    let mut p = BatchPolicy::new(BatchConfig::new(1_000 * MS)).unwrap();
    let (mut sum_a, mut sum_b, mut k) = (0.0, 0.0, 0.0);
    for i in 0..400u64 {
        let n = 1 + (rng.next_u64() % 32) as usize;
        p.on_batch_done(n, engine.exec_ns(n, &mut rng), 10 * MS, i);
        let m = p.cost_model().unwrap();
        if i >= 50 {
            assert!((m.a_ns - 8e6).abs() < 2.0e6, "step {i}: {m:?}");
            assert!((m.b_ns / 1e6 - 1.0).abs() < 0.12, "step {i}: {m:?}");
            sum_a += m.a_ns;
            sum_b += m.b_ns;
            k += 1.0;
        }
    }
    let (mean_a, mean_b) = (sum_a / k / 1e6, sum_b / k / 1e6);
    eprintln!("noisy fit: mean a = {mean_a:.3} ms, mean b = {mean_b:.4} ms");
    assert!((mean_a - 8.0).abs() < 0.3);
    assert!((mean_b - 1.0).abs() < 0.02);
    assert_eq!(
        p.stats().regime_changes,
        0,
        "5% noise is not a regime change"
    );
}

#[test]
fn fit_never_goes_negative() {
    let mut p = BatchPolicy::new(BatchConfig::new(1_000 * MS)).unwrap();
    // Bigger batches measured *faster*: the slope is clamped to 0.
    for (i, (n, ms)) in [(1, 10), (2, 9), (4, 8), (8, 7)].into_iter().enumerate() {
        p.on_batch_done(n, ms * MS, 10 * MS, i as u64);
    }
    let m = p.cost_model().unwrap();
    assert!(m.a_ns >= 0.0 && m.b_ns >= 0.0, "{m:?}");
    assert_eq!(m.b_ns, 0.0);
}

// ---------------------------------------------------------------- simulations

/// Simulation: a = 8 ms, b = 1 ms, SLO 40 ms, constant arrivals at 500/s
/// (90% of what batch 10 serves, so batches fill). Largest batch meeting
/// the steady-state SLO plan: 2·(8 + n) ≤ 36 → n = 10.
#[test]
fn converges_within_ten_batches_where_batching_pays() {
    let cfg = BatchConfig::new(40 * MS);
    let engine = Engine::new(8.0, 1.0, 0.0);
    let rate = 500.0;
    let want = best_batch(&cfg, &engine, rate);
    assert_eq!(want, 10);
    assert_eq!(largest_feasible(&cfg, &engine), 10);
    let mut sim = Sim::new(cfg, Arrivals::Constant { per_s: rate }, engine, 1);
    sim.run_until(5_000 * MS);
    let targets: Vec<usize> = sim.batches.iter().map(|b| b.target_after).collect();
    let sizes: Vec<usize> = sim.batches.iter().map(|b| b.n).collect();
    eprintln!("targets: {:?}", &targets[..12]);
    eprintln!("sizes:   {:?}", &sizes[..12]);
    let first = targets.iter().position(|&t| t == want).unwrap() + 1;
    assert!(first <= 10, "reached {want} after {first} batches");
    assert!(targets[9..].iter().all(|&t| t == want), "{targets:?}");
    let p99 = sim.percentile_e2e(0, 0.99);
    let p50 = sim.percentile_e2e(0, 0.50);
    let s = sim.policy.stats();
    eprintln!(
        "constant 500/s: target {want} after {first} batches; p50 {:.1} ms, p99 {:.1} ms, \
         {} served, {} shed, {} batches missed; a {:.2} ms b {:.3} ms; stats {s:?}",
        p50 as f64 / 1e6,
        p99 as f64 / 1e6,
        sim.e2e.len(),
        sim.shed,
        s.slo_miss_batches,
        s.a_ns / 1e6,
        s.b_ns / 1e6,
    );
    assert!(p99 <= 40 * MS, "p99 {p99}");
    assert!(sim.batches.iter().all(|b| b.max_e2e_ns <= 40 * MS));
}

/// The same regime with Poisson arrivals and ±3% execution noise. The target
/// may sit one off the analytic optimum: at 90% load the estimated arrival
/// rate wanders by several percent, and with noise the fitted line moves
/// the feasibility edge `2·cost(n) ≤ budget` by a fraction of a batch.
#[test]
fn converges_with_poisson_arrivals_and_noise() {
    let cfg = BatchConfig::new(40 * MS);
    let engine = Engine::new(8.0, 1.0, 0.03);
    let want = best_batch(&cfg, &engine, 500.0);
    let mut sim = Sim::new(cfg, Arrivals::Poisson { per_s: 500.0 }, engine, 2);
    sim.run_until(10_000 * MS);
    let targets: Vec<usize> = sim.batches.iter().map(|b| b.target_after).collect();
    eprintln!("poisson targets: {:?}", &targets[..12]);
    assert!(
        targets[9..].iter().all(|&t| t.abs_diff(want) <= 1),
        "{targets:?}"
    );
    let on_target = targets[9..].iter().filter(|&&t| t == want).count();
    let p99 = sim.percentile_e2e(0, 0.99);
    let s = sim.policy.stats();
    eprintln!(
        "poisson 500/s: on target {on_target}/{} batches; p50 {:.1} ms p99 {:.1} ms; \
         {} served, {} shed ({:.2}%), {} of {} batches missed; explorations {}, waits {}",
        targets.len() - 9,
        sim.percentile_e2e(0, 0.5) as f64 / 1e6,
        p99 as f64 / 1e6,
        sim.e2e.len(),
        sim.shed,
        100.0 * sim.shed as f64 / (sim.shed as f64 + sim.e2e.len() as f64),
        s.slo_miss_batches,
        s.batches_done,
        s.explorations,
        s.waits,
    );
    assert!(p99 <= 40 * MS, "p99 {p99}");
}

/// Simulation: SLO 80 ms, constant 250/s. The engine's cost doubles
/// (8 + 1·n ms → 16 + 2·n ms) and later halves back; after each switch the
/// target is the new optimum within 10 batches and stays there.
#[test]
fn adapts_within_ten_batches_when_the_cost_doubles_or_halves() {
    let cfg = BatchConfig::new(80 * MS);
    let rate = 250.0;
    let base = Engine::new(8.0, 1.0, 0.0);
    let doubled = Engine::new(16.0, 2.0, 0.0);
    let (want_base, want_doubled) = (
        best_batch(&cfg, &base, rate),
        best_batch(&cfg, &doubled, rate),
    );
    eprintln!("optimum: base {want_base}, doubled {want_doubled}");
    assert_ne!(want_base, want_doubled);
    let mut sim = Sim::new(cfg, Arrivals::Constant { per_s: rate }, base, 3);
    sim.run_until(3_000 * MS);
    assert_eq!(sim.policy.target_batch(), want_base);
    for (engine, want) in [(doubled, want_doubled), (base, want_base)] {
        sim.engine = engine;
        let from = sim.batches.len();
        sim.run_until(sim.now + 3_000 * MS);
        let targets: Vec<usize> = sim.batches[from..].iter().map(|b| b.target_after).collect();
        eprintln!("after switch to {:?}: {:?}", engine, &targets[..12]);
        let first = targets.iter().position(|&t| t == want).unwrap() + 1;
        assert!(first <= 10, "{targets:?}");
        assert!(targets[9..].iter().all(|&t| t == want), "{targets:?}");
    }
    let s = sim.policy.stats();
    eprintln!("adaptation: {s:?}");
    assert!(s.regime_changes >= 2);
}

/// Simulation of the no-gain regime measured on this CPU (batch 8 costs
/// about 8× batch 1): a ≈ 0.1 ms, b = 5 ms, SLO 50 ms, Poisson 100/s (half
/// the engine's capacity). Batches stay at one or two and latency near b.
#[test]
fn keeps_batches_small_when_batching_buys_nothing() {
    let cfg = BatchConfig::new(50 * MS);
    let engine = Engine::new(0.1, 5.0, 0.03);
    assert_eq!(best_batch(&cfg, &engine, 100.0), 1);
    let mut sim = Sim::new(cfg, Arrivals::Poisson { per_s: 100.0 }, engine, 4);
    sim.run_until(20_000 * MS);
    let biggest = sim.batches.iter().map(|b| b.n).max().unwrap();
    let twos = sim.batches.iter().filter(|b| b.n == 2).count();
    let p50 = sim.percentile_e2e(0, 0.5);
    let p99 = sim.percentile_e2e(0, 0.99);
    let mean = sim.e2e.iter().sum::<u64>() as f64 / sim.e2e.len() as f64;
    let s = sim.policy.stats();
    eprintln!(
        "no-gain: {} batches, biggest {biggest}, {twos} of size 2, target {}, \
         a {:.2} ms b {:.2} ms; e2e mean {:.2} ms p50 {:.2} ms p99 {:.2} ms; shed {}",
        sim.batches.len(),
        s.target_batch,
        s.a_ns / 1e6,
        s.b_ns / 1e6,
        mean / 1e6,
        p50 as f64 / 1e6,
        p99 as f64 / 1e6,
        sim.shed,
    );
    assert!(biggest <= 2);
    assert_eq!(s.target_batch, 1);
    assert!(p50 <= 2 * 5 * MS, "p50 {p50}");
    assert!(p99 <= 50 * MS);
    assert_eq!(sim.shed, 0);
}

/// Simulation of saturation on a convex cost (issue 13: on an AVX2 machine
/// a batch of 8 ran ~9% slower per image than a batch of 1, yet the affine
/// fit, extrapolating from small batches, predicted a gain and settled on
/// 8). Here a = 2 ms, b = 8 ms, each request 4% dearer per extra batch
/// member: 10, 9.32, 9.46, 10.5 ms per request at batches 1, 2, 4, 8, so
/// batch 2 is best (107/s) and anything from 4 up loses to it. Offered
/// 150/s, the policy must serve at least 95% of the best fixed batch's
/// rate and never less than batch 1's, with batches of about 2.
#[test]
fn never_loses_to_the_best_small_batch_on_a_convex_cost() {
    let cfg = BatchConfig::new(100 * MS);
    let engine = Engine::new(2.0, 8.0, 0.02).convex(0.04);
    let per_request = |n: usize| engine.cost_ns(n) / n as f64 / 1e6;
    let best_fixed = (1..=8).map(|n| 1e3 / per_request(n)).fold(0.0, f64::max);
    assert!(per_request(2) < per_request(1) && per_request(8) > per_request(1));
    let mut sim = Sim::new(cfg, Arrivals::Constant { per_s: 150.0 }, engine, 13);
    sim.run_until(2_000 * MS);
    let (served0, from) = (sim.e2e.len(), sim.batches.len());
    sim.run_until(22_000 * MS);
    let goodput = (sim.e2e.len() - served0) as f64 / 20.0;
    let recent = &sim.batches[from..];
    let mean_batch = recent.iter().map(|b| b.n).sum::<usize>() as f64 / recent.len() as f64;
    let at_least_4 = recent.iter().filter(|b| b.n >= 4).count();
    let p99 = sim.percentile_e2e(served0, 0.99);
    eprintln!(
        "convex 150/s: goodput {goodput:.1}/s, best fixed batch {best_fixed:.1}/s, batch 1 {:.1}/s; \
         mean batch {mean_batch:.2}, {at_least_4} of {} batches >= 4, target {}, p99 {:.1} ms, shed {}",
        1e3 / per_request(1),
        recent.len(),
        sim.policy.target_batch(),
        p99 as f64 / 1e6,
        sim.shed
    );
    assert!(
        goodput >= 0.95 * best_fixed,
        "goodput {goodput} vs {best_fixed}"
    );
    assert!(
        goodput >= 1e3 / per_request(1),
        "goodput {goodput} below batch 1's"
    );
    assert!(mean_batch <= 3.0, "mean batch {mean_batch}");
    assert!(p99 <= 100 * MS);
}

/// bench-if's saturation phase in the simulation: a closed loop of 32
/// requests (arriving over 0.2–1 ms, 0.2 ms after an answer) against
/// `engine` with its 2 s SLO and batches of at most 8, the simulation as
/// `setup` leaves it (slow [`Sim::spells`], a shared core); 5 s to settle,
/// then 30 s measured. Returns the goodput (requests/s), the mean batch
/// and the simulation.
fn saturated_closed_loop(
    engine: Engine,
    seed: u64,
    setup: impl FnOnce(&mut Sim),
) -> (f64, f64, Sim) {
    let cfg = BatchConfig {
        max_batch: 8,
        ..BatchConfig::new(2_000 * MS)
    };
    let loop32 = Arrivals::Closed {
        outstanding: 32,
        think_ns: 200_000,
    };
    let mut sim = Sim::new(cfg, loop32, engine, seed).with_spans(200_000, 1_000_000);
    setup(&mut sim);
    let (goodput, mean_batch) = settle_then_measure(&mut sim, 5_000 * MS, 35_000 * MS);
    (goodput, mean_batch, sim)
}

/// [`saturated_closed_loop`] as it is, for seeds 1 to `seeds`, none of
/// them shedding: each seed's goodput over `reference` (requests/s) and
/// its mean batch.
fn saturated_over_seeds(engine: Engine, seeds: u64, reference: f64) -> (Vec<f64>, Vec<f64>) {
    (1..=seeds)
        .map(|seed| {
            let (goodput, mean_batch, sim) = saturated_closed_loop(engine, seed, |_| {});
            assert_eq!(sim.shed, 0, "seed {seed}");
            (goodput / reference, mean_batch)
        })
        .unzip()
}

/// Runs `sim` until `settled_ns`, then measures until `end_ns`: the
/// goodput (requests/s) and the mean batch of that stretch.
fn settle_then_measure(sim: &mut Sim, settled_ns: u64, end_ns: u64) -> (f64, f64) {
    sim.run_until(settled_ns);
    let (served0, from) = (sim.e2e.len(), sim.batches.len());
    sim.run_until(end_ns);
    let goodput = (sim.e2e.len() - served0) as f64 / ((end_ns - settled_ns) as f64 / 1e9);
    let recent = &sim.batches[from..];
    let mean_batch = recent.iter().map(|b| b.n).sum::<usize>() as f64 / recent.len() as f64;
    (goodput, mean_batch)
}

/// Simulation of bench-if's saturation phase on a noisy engine like the
/// 2-CPU VM's (issue 13, item 1): an engine whose batch of 1 takes 5.1 ms
/// and a batch of 8 ~6% more per image, each batch ±10% and one in ten 1.3
/// times as long. No batch beats batch 1 per image, but the per-size
/// estimates are noisy, and a plan that took the best estimate under
/// saturation ran whichever size the noise favoured: mean batches of
/// 2.1–4.4 over five seeds, 2–4% below batch 1's rate (batches of 5–6 in
/// some live runs). With [`BEST_MARGIN`] and the probes of stale sizes,
/// over 30 seeds: 0.983 of batch 1's rate on average (the worst seed
/// 0.976), mean batches of 2.03 (at most 2.36); before a target of 1
/// stopped exploring 2 over a window of 2s (`BatchPolicy::neighbour`) the
/// same: 0.983 (worst 0.977), 2.00 (at most 2.44). A seed's rate moves by
/// ±0.5% with its draw, so the bar is on the 30 together. Learning each
/// size only from batches after the same size (module doc, "Switching
/// sizes") costs a little here, on an engine without a switching cost,
/// where it halves the samples: 0.981 (worst 0.971), 2.20 (at most 2.54);
/// where switching costs, it gains (the next test, and bench-if). That
/// was still the best of eight noisy estimates taken for the best: with
/// each size judged on what it surely gives (its estimate less
/// [`CONFIDENCE_Z`] standard errors; module doc, "Batch choice"), 0.9964
/// (worst 0.9884), mean batches 1.22 (at most 1.64), where it was 0.9847
/// (worst 0.9769), 2.01 (at most 2.53).
#[test]
fn stays_near_batch_1_in_saturation_on_a_noisy_convex_engine() {
    let engine = Engine::new(0.0, 5.1, 0.1).convex(0.009).spiky(0.1, 1.3);
    let (rates, batches) = saturated_over_seeds(engine, 30, 1e9 / engine.mean_ns(1));
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let worst_rate = rates.iter().copied().fold(f64::MAX, f64::min);
    let largest_batch = batches.iter().copied().fold(0.0, f64::max);
    eprintln!(
        "noisy convex, 30 seeds: {:.4} of batch 1's rate on average, the worst {worst_rate:.4}; \
         mean batch {:.2}, the largest {largest_batch:.2}",
        mean(&rates),
        mean(&batches)
    );
    assert!(mean(&rates) >= 0.993, "{rates:?}");
    assert!(worst_rate >= 0.985, "{rates:?}");
    assert!(mean(&batches) <= 1.4 && largest_batch <= 1.8, "{batches:?}");
}

/// The caution of the batch choice (sizes judged on what they surely
/// give, module doc "Batch choice") where batching does pay: the same
/// saturated closed loop on an engine like a GPU's, a = 2 ms and b = 0.5
/// ms (a batch of 8 serves 3.3 times batch 1's rate), as noisy as the
/// convex one above (±10%, one batch in ten 1.3 times as long). Over ten
/// seeds: 0.9851 of the rate of batches of 8 back to back, the best any
/// plan can do, mean batch 7.65; taking the best estimate for the best,
/// as before, 0.9628 (worst 0.9407), 7.16. Eight seeds are within 1.1%
/// of the best; two (0.946, 0.947) spent most of the run at 7 and 6
/// after their one batch of 8 ran slow: a size above the target is not
/// measured again (module doc, "Limits"). Probing the smaller sizes too,
/// whatever their rate (before [`PROBE_THROUGHPUT_SHARE`] applied to every
/// probe), cost 1–2% in all seeds and got those two out: 0.9865 (worst
/// 0.9652).
#[test]
fn pays_little_for_caution_where_batching_pays() {
    let engine = Engine::new(2.0, 0.5, 0.1).spiky(0.1, 1.3);
    let (rates, batches) = saturated_over_seeds(engine, 10, 8e9 / engine.mean_ns(8));
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let worst = rates.iter().copied().fold(f64::MAX, f64::min);
    eprintln!(
        "noisy concave, 10 seeds: {:.4} of batches of 8 on average, the worst {worst:.4}; mean batch {:.2}",
        mean(&rates),
        mean(&batches)
    );
    assert!(mean(&rates) >= 0.98 && worst >= 0.94, "{rates:?}");
}

/// The same closed loop on a steadier engine (±6%, one batch in ten 1.2
/// times as long) on a machine with slow spells: every 2 s, 400 ms in which
/// every batch takes 1.25 times as long. A spell inflates the estimate of
/// whatever size runs in it; without probes the plan moved to a size
/// measured outside the spell and never ran the inflated one again,
/// ratcheting up to batches of 4–8 (as in bench-if's trace on the VM; here
/// seed 8 ran batches of 4.31 on average, 0.978 of batch 1's rate, with
/// neither probes nor [`BEST_MARGIN`], 2.48–2.57 with one of them). With
/// both: 1.73–1.98, 0.991–0.995 of batch 1's rate; with the sizes judged
/// on what they surely give (module doc, "Batch choice"), 1.21–1.32 and
/// 1.001–1.005 (the spells' own slow batches of 1 count in batch 1's
/// rate, and bigger batches ran in some of them).
#[test]
fn probes_smaller_sizes_so_that_a_slow_spell_does_not_ratchet_the_batch_up() {
    let engine = Engine::new(0.0, 5.1, 0.06).convex(0.008).spiky(0.1, 1.2);
    // Batch 1's rate over the spells (a fifth of the time 1.25 times as slow).
    let batch_1 = 1e9 / engine.mean_ns(1) / (1.0 + 0.2 * 0.25);
    for seed in [3, 5, 8] {
        let spells = Some((2_000 * MS, 400 * MS, 1.25));
        let (goodput, mean_batch, sim) =
            saturated_closed_loop(engine, seed, |sim| sim.spells = spells);
        eprintln!(
            "spells, seed {seed}: goodput {goodput:.1}/s, batch 1 alone {batch_1:.1}/s, mean batch {mean_batch:.2}, \
             probes and explorations {}, regime changes {}",
            sim.policy.stats().explorations,
            sim.policy.stats().regime_changes
        );
        assert!(mean_batch <= 1.5, "seed {seed}: mean batch {mean_batch}");
        assert!(
            goodput >= 0.995 * batch_1,
            "seed {seed}: goodput {goodput} vs batch 1's {batch_1}"
        );
    }
}

/// The same closed loop on a core shared with the fragment thread: each
/// request that arrives while a batch runs preempts it for 0.4 ms (what
/// squeezenet's 147 fragments cost on the Intel Xeon VM, with wake-ups).
/// In a closed loop those are the previous batch's replacements, so a
/// batch of 1 after a batch of 3 runs 1.2 ms longer than after a batch of
/// one. Given each batch's CPU time, the policy learns the engine's own
/// costs, and predicts them times the wall / CPU time it sees. Over six
/// seeds: batches of 1.01–1.04 on average, 176.6–177.0/s (batch 1 back to
/// back: 176.9/s; before the sizes were judged on what they surely give,
/// module doc "Batch choice", 1.09–1.15 and 173.3–174.5/s), and no worse
/// than on wall times, where the switching rule
/// (module doc, "Switching sizes") already keeps a batch of 1 after a
/// batch of 3 out of the estimates (before it, on wall times: batches of
/// 1.40–1.59, 169.4–172.6/s).
#[test]
fn serves_near_batch_1_where_the_fragments_share_the_core() {
    let engine = Engine::new(0.0, 5.15, 0.05).convex(0.05).spiky(0.1, 1.2);
    // Batch 1 back to back: each batch preempted by one request's fragments.
    let batch_1 = 1e9 / (engine.mean_ns(1) + 0.4e6);
    let (mut on_cpu_total, mut on_wall_total) = (0.0, 0.0);
    for seed in [3, 5, 8, 13, 21, 34] {
        let run = |cpu_clock: bool| {
            saturated_closed_loop(engine, seed, |sim| {
                sim.fragment_ns = 400_000;
                sim.cpu_clock = cpu_clock;
            })
        };
        let (wall_goodput, wall_batch, _) = run(false);
        let (goodput, mean_batch, sim) = run(true);
        let rho = sim.policy.wall_per_cpu();
        eprintln!(
            "shared core, seed {seed}: on CPU time goodput {goodput:.1}/s, mean batch {mean_batch:.2}, \
             wall/cpu {rho:.3}; on wall time {wall_goodput:.1}/s, mean batch {wall_batch:.2}; \
             batch 1 alone {batch_1:.1}/s"
        );
        assert!(mean_batch <= 1.1, "seed {seed}: mean batch {mean_batch}");
        assert!(
            goodput >= 0.99 * batch_1,
            "seed {seed}: goodput {goodput} vs batch 1's {batch_1}"
        );
        // ρ: a batch of about one request is preempted for 0.4 ms in ~5.4.
        assert!((1.05..1.11).contains(&rho), "seed {seed}: wall/cpu {rho}");
        assert_eq!(sim.shed, 0);
        on_cpu_total += goodput;
        on_wall_total += wall_goodput;
    }
    assert!(
        on_cpu_total >= 0.995 * on_wall_total,
        "{on_cpu_total} on CPU time vs {on_wall_total} on wall time"
    );
}

/// bench-policy's arm at 4 outstanding in the simulation: first bench-if's
/// phase at one request outstanding (5 s; the engine idles between
/// requests, and a batch after an idle of 1 ms or more costs `cold` times
/// as much, so batch 1 is learnt at that price), then 4 outstanding, 5 s
/// to settle and 20 s measured. Requests arrive over 1.1–1.8 ms (147
/// fragments), 0.2 ms after an answer. Returns the goodput (requests/s),
/// the mean batch and the simulation.
fn four_outstanding_after_one(
    engine: Engine,
    max_batch: usize,
    cold: f64,
    seed: u64,
) -> (f64, f64, Sim) {
    let cfg = BatchConfig {
        max_batch,
        ..BatchConfig::new(2_000 * MS)
    };
    let one = Arrivals::Closed {
        outstanding: 1,
        think_ns: 2 * MS,
    };
    let mut sim = Sim::new(cfg, one, engine, seed).with_spans(1_100_000, 1_800_000);
    sim.cold = Some((MS, cold));
    sim.run_until(5_000 * MS);
    sim.arrivals = Arrivals::Closed {
        outstanding: 4,
        think_ns: 200_000,
    };
    let now = sim.now;
    for _ in 0..3 {
        let span = 1_100_000 + (700_000.0 * sim.rng.unit()) as u64;
        sim.arriving.push((now + span, now));
    }
    let (goodput, mean_batch) = settle_then_measure(&mut sim, 10_000 * MS, 30_000 * MS);
    (goodput, mean_batch, sim)
}

/// The policy against batches of 1 at 4 outstanding, after a phase at one
/// (what bench-policy.sh runs live), on engines like the AMD EPYC VM's
/// inside kp-if: squeezenet's batch of 1 3.45 ms back to back, a batch of
/// 2 3% or 6% dearer per image, ±5%, one batch in ten 1.2 times as long,
/// and a batch after an idle 1.25 times as long. Batch 1, learnt at the
/// cold price while one request was outstanding, and a warm batch 2 made a
/// line that promised a gain at 4–8, which 4 outstanding never queues;
/// while a probe waited for a full batch of the limit, the policy ran the
/// 2 queued for ever (live, round 1 of 7 December: 2,843 batches of 2 and
/// one of 1 in 20 s, final target 7; here every seed but one ran batches
/// of 2.00, 0.971 of batch 1's rate at 3%, 0.948 at 6%). Probing with
/// less than a full batch queued once the engine runs back to back
/// (module doc, "Probes"): 0.981 and 0.983 on average over ten seeds
/// (the worst 0.969 and 0.949), mean batches 1.41 and 1.15. There a
/// probe's one sample replaced a stale estimate, so an unlucky one (a slow
/// batch) could send the plan back to 2 for a second (the worst seed at
/// 6%: 0.949, mean batch 1.52); judged on what it surely gives (module
/// doc, "Batch choice"), a size measured once no longer outweighs one
/// measured often: 0.9986 and 0.9988 (the worst 0.9968 and 0.9975), mean
/// batches 1.02 and 1.01.
#[test]
fn probes_batch_1_where_the_queue_never_reaches_the_target() {
    for convex in [0.03, 0.06] {
        let engine = Engine::new(0.0, 3.45, 0.05).convex(convex).spiky(0.1, 1.2);
        let (mut ratios, mut batches) = (Vec::new(), Vec::new());
        for seed in 1..=10 {
            let (policy, mean_batch, sim) = four_outstanding_after_one(engine, 8, 1.25, seed);
            let (batch_1, _, _) = four_outstanding_after_one(engine, 1, 1.25, seed);
            assert_eq!(sim.shed, 0);
            assert!(
                sim.policy.stats().explorations > 0,
                "seed {seed}: never probed"
            );
            ratios.push(policy / batch_1);
            batches.push(mean_batch);
        }
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
        eprintln!(
            "4 outstanding, batch 2 {:.0}% dearer per image, 10 seeds: {:.4} of batch 1's rate \
             (the worst {:.4}), mean batch {:.2}",
            convex * 100.0,
            mean(&ratios),
            ratios.iter().copied().fold(f64::MAX, f64::min),
            mean(&batches)
        );
        assert!(mean(&ratios) >= 0.995, "convex {convex}: {ratios:?}");
        assert!(mean(&batches) <= 1.1, "convex {convex}: {batches:?}");
    }
}

/// The saturated closed loop on an engine like the VM's inside kp-if: a
/// batch of 1 5.15 ms back to back and each bigger batch 2% dearer per
/// image and extra request, ±5%, one batch in ten 1.2 times as long, and
/// a batch right after a bigger one 5% dearer per size of difference
/// (`Engine::switching`), the fragments on the engine's core. Batch 1
/// back to back is best; the sizes run only as explorations or probes
/// after others cost more there. Over 30 seeds with the switching rule:
/// 0.978 of batch 1's rate on average (worst 0.973), mean batches 1.53
/// (at most 1.60); learning from every batch: 0.975 (worst 0.965), 1.58
/// (at most 1.84). With the sizes judged on what they surely give (module
/// doc, "Batch choice"): 0.9980 (worst 0.9951), 1.05 (at most 1.17), where
/// it was 0.9815 (worst 0.9766), 1.41 (at most 1.57) just before.
#[test]
fn a_switch_between_sizes_is_not_learnt_as_the_sizes_cost() {
    let engine = Engine::new(0.0, 5.15, 0.05)
        .convex(0.02)
        .spiky(0.1, 1.2)
        .switching(0.05);
    let batch_1 = 1e9 / (engine.mean_ns(1) + 0.4e6);
    let (mut rates, mut batches) = (Vec::new(), Vec::new());
    for seed in 1..=30 {
        let (goodput, mean_batch, sim) = saturated_closed_loop(engine, seed, |sim| {
            sim.fragment_ns = 400_000;
            sim.cpu_clock = true;
        });
        assert_eq!(sim.shed, 0);
        rates.push(goodput / batch_1);
        batches.push(mean_batch);
    }
    let mean = rates.iter().sum::<f64>() / 30.0;
    let largest = batches.iter().copied().fold(0.0, f64::max);
    eprintln!(
        "switching, 30 seeds: {mean:.4} of batch 1's rate, the worst {:.4}; mean batch {:.2}, the largest {largest:.2}",
        rates.iter().copied().fold(f64::MAX, f64::min),
        batches.iter().sum::<f64>() / 30.0
    );
    assert!(mean >= 0.995, "{rates:?}");
    assert!(largest <= 1.3, "{batches:?}");
}

/// Simulation of overload: constant 800/s against an engine that serves at
/// most 556/s within the SLO (a = 8 ms, b = 1 ms, SLO 40 ms, batch 10).
/// Shedding keeps the served requests within the SLO and the engine busy
/// with full batches instead of collapsing to batch 1.
#[test]
fn overload_sheds_instead_of_collapsing() {
    let cfg = BatchConfig::new(40 * MS);
    let engine = Engine::new(8.0, 1.0, 0.0);
    let mut sim = Sim::new(cfg, Arrivals::Constant { per_s: 800.0 }, engine, 5);
    sim.run_until(1_000 * MS);
    let (served0, from) = (sim.e2e.len(), sim.batches.len());
    sim.run_until(6_000 * MS);
    let goodput = (sim.e2e.len() - served0) as f64 / 5.0;
    let capacity = 10.0 / 18e-3;
    let mean_batch = sim.batches[from..].iter().map(|b| b.n).sum::<usize>() as f64
        / (sim.batches.len() - from) as f64;
    let p99 = sim.percentile_e2e(served0, 0.99);
    eprintln!(
        "overload 800/s: goodput {goodput:.0}/s of {capacity:.0}/s capacity, mean batch \
         {mean_batch:.1}, p99 {:.1} ms, shed {}",
        p99 as f64 / 1e6,
        sim.shed
    );
    assert!(goodput >= 0.9 * capacity, "goodput {goodput}");
    assert!(p99 <= 40 * MS);
}

/// Overload on an engine whose batches are not all alike: ±5% noise, and
/// one batch in ten takes 1.4 times as long (preempted on a shared core,
/// as squeezenet's batches are on the if-manager's core in
/// tests/overload.rs: a model of that, not a measured distribution).
/// Offered twice the capacity, Poisson. Planning on the
/// mean cost alone, every request dispatched at the edge of its deadline
/// misses it whenever its batch is a slow one: the served requests' p99
/// was past the SLO. The policy plans deadlines on the measured spread of
/// batch times (the tail factor), so the served p99 stays within the SLO
/// at a goodput close to the capacity.
#[test]
fn overload_keeps_the_served_p99_within_the_slo_when_batches_spike() {
    let cfg = BatchConfig::new(100 * MS);
    let engine = Engine::new(3.0, 6.0, 0.05).spiky(0.1, 1.4);
    // The largest batch of the steady-state plan on the mean cost is 7
    // (2 · 45 ms ≤ 90 ms): 7 / 45 ms.
    let capacity = 7.0 / 45e-3;
    let mut sim = Sim::new(
        cfg,
        Arrivals::Poisson {
            per_s: 2.0 * capacity,
        },
        engine,
        21,
    );
    sim.run_until(2_000 * MS);
    let served0 = sim.e2e.len();
    sim.run_until(32_000 * MS);
    let goodput = (sim.e2e.len() - served0) as f64 / 30.0;
    let p99 = sim.percentile_e2e(served0, 0.99);
    let late = sim.e2e[served0..].iter().filter(|&&e| e > 100 * MS).count();
    eprintln!(
        "spiky overload at {:.0}/s: goodput {goodput:.0}/s of {capacity:.0}/s, p99 {:.1} ms, \
         {late} of {} served late, tail factor {:.3}",
        2.0 * capacity,
        p99 as f64 / 1e6,
        sim.e2e.len() - served0,
        sim.policy.stats().tail_factor,
    );
    assert!(p99 <= 100 * MS, "p99 {p99}");
    assert!(goodput >= 0.8 * capacity, "goodput {goodput}");
}

/// A burst of contention makes the engine slower than the SLO even at
/// batch 1 (a = 50 ms, b = 5 ms against a 40 ms SLO) for two seconds, then
/// it is back to a = 8 ms, b = 1 ms. A model learnt in the burst says no
/// request can make its SLO, so every arrival would be shed, no batch would
/// run, and the model would never learn that the engine is fast again:
/// OVERLOADED for ever (seen on the live platform after an overload). A
/// probe (the newest request kept, once per probe interval without a batch)
/// brings service back within a second of the burst's end.
#[test]
fn recovers_when_a_slow_spell_ends() {
    let cfg = BatchConfig::new(40 * MS);
    let base = Engine::new(8.0, 1.0, 0.0);
    let slow = Engine::new(50.0, 5.0, 0.0);
    let rate = 50.0;
    let mut sim = Sim::new(cfg, Arrivals::Constant { per_s: rate }, base, 6);
    sim.run_until(2_000 * MS);
    sim.engine = slow;
    sim.run_until(4_000 * MS);
    let cost1 = sim.policy.cost_model().unwrap().cost_ns(1);
    assert!(cost1 > 40e6, "the slow spell was learnt: cost(1) {cost1}");
    sim.engine = base;
    sim.run_until(5_000 * MS);
    let (served, shed) = (sim.e2e.len(), sim.shed);
    sim.run_until(7_000 * MS);
    let goodput = (sim.e2e.len() - served) as f64 / 2.0;
    eprintln!(
        "after the slow spell: goodput {goodput:.1}/s of {rate}/s, shed in the last 2 s {}, \
         p99 {:.1} ms",
        sim.shed - shed,
        sim.percentile_e2e(served, 0.99) as f64 / 1e6
    );
    assert!(goodput >= 0.98 * rate, "goodput {goodput}");
    assert_eq!(sim.shed, shed, "nothing shed once the model is right again");
    assert!(sim.percentile_e2e(served, 0.99) <= 40 * MS);
}

// ---------------------------------------------------------------- shedding

fn trained(slo_ms: u64, a_ms: u64, b_ms: u64) -> BatchPolicy {
    let mut p = BatchPolicy::new(BatchConfig::new(slo_ms * MS)).unwrap();
    for (i, n) in [1usize, 2, 4].into_iter().enumerate() {
        p.on_batch_done(n, (a_ms + b_ms * n as u64) * MS, MS, i as u64);
    }
    p
}

#[test]
fn sheds_a_request_that_cannot_make_its_slo_alone() {
    let p = trained(40, 8, 1);
    let cost1 = p.cost_model().unwrap().cost_ns(1);
    assert!((cost1 - 9e6).abs() < 1.0);
    let now = 1_000 * MS;
    // 31 ms + 9 ms = 40 ms: still makes it. 31 ms + 1 ns: does not.
    assert_eq!(p.shed_count(now, &[now - 31 * MS]), 0);
    assert_eq!(p.shed_count(now, &[now - 31 * MS - 1]), 1);
    let q = [now - 35 * MS, now - 32 * MS, now - 5 * MS, now];
    assert_eq!(p.shed_count(now, &q), 2);
    // Before anything ran, only requests already past the SLO go.
    let fresh = BatchPolicy::new(BatchConfig::new(40 * MS)).unwrap();
    assert_eq!(
        fresh.shed_count(now, &[now - 40 * MS, now - 40 * MS - 1]),
        0
    );
    assert_eq!(fresh.shed_count(now, &[now - 40 * MS - 1, now]), 1);
}

/// A lone request that makes its SLO on the average cost runs; under
/// pressure it must make it even when its batch runs slow (`τ`).
#[test]
fn sheds_a_lone_request_on_the_tail_only_under_pressure() {
    let mut p = trained(40, 8, 1);
    // One batch of 4 half as long again as predicted: τ = 1.5.
    p.on_batch_done(4, 18 * MS, MS, 10);
    assert!((p.tail_factor() - 1.5).abs() < 1e-9, "{}", p.tail_factor());
    let cost1 = p.predicted_ns(&p.cost_model().unwrap(), 1);
    assert!((cost1 - 9e6).abs() < 1.0, "{cost1}");
    let now = 1_000 * MS;
    // 28 ms + 9 ms ≤ 40 ms on the average; 28 + 13.5 > 40 in a slow batch.
    let lone = [now - 28 * MS];
    assert!(!p.under_pressure(now));
    assert_eq!(p.shed_count(now, &lone), 0);
    // A shed is no pressure; a refusal at admission is.
    assert_eq!(p.shed(now - 5 * MS, &[now - 50 * MS]), 1);
    assert!(!p.under_pressure(now));
    p.note_refused(now - 5 * MS);
    assert!(p.under_pressure(now));
    assert_eq!(p.shed_count(now, &lone), 1);
    // An SLO after that refusal, the pressure is off.
    assert_eq!(p.shed_count(now + 36 * MS, &[now + 36 * MS - 28 * MS]), 0);
}

/// Pressure (module doc): a refusal at admission, which only the driver
/// sees, counts for an SLO; 0 (no refusal yet) and a time older than the
/// latest are ignored.
#[test]
fn a_refusal_at_admission_is_pressure_for_an_slo() {
    let mut p = trained(40, 8, 1);
    let now = 1_000 * MS;
    p.note_refused(0);
    assert!(!p.under_pressure(now));
    p.note_refused(now);
    assert!(p.under_pressure(now + 40 * MS));
    assert!(!p.under_pressure(now + 40 * MS + 1));
    p.note_refused(now - 10 * MS);
    assert!(!p.under_pressure(now + 40 * MS + 1), "an older refusal");
}

/// Pressure (module doc): an arrival rate that asks for at least
/// [`PRESSURE_LOAD`] of what the engine serves at the batch limit. A
/// backlog or a shed at a lighter load is not pressure: at 35% of the
/// engine's rate a slow batch leaves a queue, and counting it (or the sheds
/// it causes) as pressure made the rules strict where they only fail more
/// requests (`admission_and_shedding_lose_little_to_a_mean_cost_oracle`).
#[test]
fn an_arrival_rate_near_the_engines_capacity_is_pressure() {
    for (load, pressed) in [(0.8, false), (0.95, true)] {
        let mut p = trained(40, 8, 1);
        let m = p.cost_model().unwrap();
        let n = p.batch_limit();
        let per_request = p.predicted_ns(&m, n) / n as f64;
        let gap = (per_request / load) as u64;
        // Two seconds of arrivals, the engine busy: the queue builds and
        // its arrivals give the rate.
        let t0 = 1_000 * MS;
        let mut queue = Vec::new();
        for k in 0..(2_000 * MS / gap) {
            let t = t0 + k * gap;
            queue.push(t);
            assert_eq!(p.decide(t, &queue, false), Decision::Idle);
        }
        let now = *queue.last().unwrap();
        let rate = p.arrival_rate_per_s();
        assert!(
            (rate * per_request / 1e9 / load - 1.0).abs() < 0.02,
            "{load}: {rate}/s"
        );
        assert_eq!(p.under_pressure(now), pressed, "{load} of the capacity");
        // Shedding the head of that backlog does not make pressure.
        assert!(p.shed(now, &queue) > 0);
        assert_eq!(p.under_pressure(now), pressed, "{load}, after a shed");
    }
}

#[test]
fn sheds_the_head_of_a_backlog_that_would_shrink_the_batch() {
    let p = trained(40, 8, 1);
    let now = 1_000 * MS;
    let n = p.batch_limit();
    assert_eq!(n, 8);
    // A head that waited 25 ms: alone it still makes 40 ms, but not within
    // the 36 ms budget in a batch of 8 (25 + 16 > 36). With a backlog it goes;
    // without one it stays and decide() gives it a smaller batch.
    let mut q = vec![now - 25 * MS];
    q.extend((0..n as u64).map(|i| now - i));
    assert_eq!(p.shed_count(now, &q), 1);
    q.pop();
    assert_eq!(p.shed_count(now, &q), 0);
}

/// Simulation: a = 8 ms, b = 1 ms, SLO 40 ms, Poisson at 150/s (about a
/// quarter of capacity): nothing is shed.
#[test]
fn sheds_nothing_at_light_load() {
    let cfg = BatchConfig::new(40 * MS);
    let mut sim = Sim::new(
        cfg,
        Arrivals::Poisson { per_s: 150.0 },
        Engine::new(8.0, 1.0, 0.03),
        6,
    );
    sim.run_until(20_000 * MS);
    let s = sim.policy.stats();
    eprintln!(
        "light load: {} served, shed {}, p99 {:.1} ms, target {}, mean batch {:.2}",
        sim.e2e.len(),
        sim.shed,
        sim.percentile_e2e(0, 0.99) as f64 / 1e6,
        s.target_batch,
        sim.e2e.len() as f64 / sim.batches.len() as f64
    );
    assert_eq!(sim.shed, 0);
    assert_eq!(s.slo_miss_batches, 0);
}

/// The engine of the simulations of the side-by-side's levels below:
/// squeezenet's batch of one on the 2-CPU VM, 5.1 ms back to back, but
/// spread (±15%, three in ten 1.3 times as long) as an engine that idles
/// between requests spreads its batches, and a little convex.
fn spread_engine() -> Engine {
    Engine::new(0.0, 5.1, 0.15).convex(0.035).spiky(0.3, 1.3)
}

/// Its SLO in the side-by-side: 4× the batch of one.
const SPREAD_SLO: u64 = 20_400_000;

/// A simulation of [`spread_engine`] under its SLO at `rate` Poisson
/// arrivals, each request arriving over a span uniform in `span` (ns).
fn spread_engine_sim(rate: f64, seed: u64, span: (u64, u64)) -> Sim {
    Sim::new(
        BatchConfig::new(SPREAD_SLO),
        Arrivals::Poisson { per_s: rate },
        spread_engine(),
        seed,
    )
    .with_spans(span.0, span.1)
}

/// Simulation of the side-by-side's light levels on the 2-CPU VM:
/// squeezenet's batch of one takes 5.1 ms when the engine runs back to
/// back, but an engine that idles between requests spreads its batches
/// (±15% here, and three in ten 1.3 times as long: a model of the cold
/// batches that bench-if's trace showed, 5.7–7.6 ms), the SLO is 4× the
/// batch of one (20.4 ms), as `make bench-peers` sets it, and a request
/// takes 0.2–5 ms to arrive after its first fragment, from which its age
/// counts. At a quarter of the engine's rate, shed or late, at most 1% may
/// fail, the side-by-side's rule: the tail factor makes the policy shed a
/// request that waited behind another's slow batch, but not more.
#[test]
fn sheds_almost_nothing_at_light_load_on_an_engine_whose_batches_spread() {
    let rate = 0.25 * 1e9 / 5.1e6;
    for seed in [7, 8, 9] {
        let mut sim = spread_engine_sim(rate, seed, (200_000, 5_000_000));
        sim.run_until(60_000 * MS);
        let served = sim.e2e.len() as u64;
        let late = sim.e2e.iter().filter(|&&e| e > SPREAD_SLO).count() as u64;
        let failed = sim.failed_fraction(SPREAD_SLO);
        eprintln!(
            "seed {seed}: {served} served, {} shed, {late} late ({:.2}% failed), p99 {:.1} ms, tail factor {:.2}",
            sim.shed,
            100.0 * failed,
            sim.percentile_e2e(0, 0.99) as f64 / 1e6,
            sim.policy.stats().tail_factor
        );
        assert!(failed <= 0.01, "seed {seed}: {:.2}% failed", 100.0 * failed);
    }
}

/// A reference for the shedding rules and admission together: a FIFO that
/// runs batches of one and drops a request (at once, as if refused) only
/// when the engine's true mean cost says it will end past the SLO — a
/// policy that knows the engine's mean, which the real one must learn.
/// Returns the fraction of requests dropped or late. Same arrivals, spans
/// and engine as [`Sim`] with the same seed draws them (not the same draws:
/// the comparison is of rates over a long run).
fn mean_cost_fifo_failures(
    engine: &Engine,
    per_s: f64,
    span: (u64, u64),
    slo: u64,
    seed: u64,
    end_ns: u64,
) -> f64 {
    let mut rng = Rng(seed);
    let arrivals = Arrivals::Poisson { per_s };
    let mean = engine.mean_ns(1);
    let (mut t, mut free, mut failed, mut all) = (0u64, 0u64, 0u64, 0u64);
    loop {
        t += arrivals.gap_ns(&mut rng).max(1);
        if t > end_ns {
            break;
        }
        all += 1;
        let ready = t + span.0 + ((span.1 - span.0) as f64 * rng.unit()) as u64;
        let start = ready.max(free);
        let exec = engine.exec_ns(1, &mut rng);
        if (start - t) as f64 + mean > slo as f64 {
            failed += 1;
        } else {
            free = start + exec;
            failed += u64::from(free - t > slo);
        }
    }
    failed as f64 / all as f64
}

/// Capacity at the SLO, the side-by-side's measure: the highest load at
/// which at most 1% of requests fail (shed, refused or late). The engine is
/// the spread batch-of-one engine above (squeezenet on the 2-CPU VM,
/// modelled), 4× SLO, requests arriving over 0.2–2 ms, admission on, at 35%
/// and 45% of the engine's back-to-back rate, 20 seeds of 120 s. The policy
/// must lose little to [`mean_cost_fifo_failures`], at most a quarter more,
/// both from a cold start and with the engine learnt first ("warm"): a
/// cold start spends much of a light run before the fit is identified,
/// where the rules that a learnt model brings do not apply, and the 3 seeds
/// cold this test once ran passed a policy that failed 1.108% and 2.463%
/// warm against the reference's 0.763% and 1.837% (module doc, "Pressure").
/// Now: 0.886% and 1.971% cold, 0.865% and 1.984% warm.
#[test]
fn admission_and_shedding_lose_little_to_a_mean_cost_oracle() {
    let (slo, engine) = (SPREAD_SLO, spread_engine());
    let span = (200_000, 2_000_000);
    let end = 120_000 * MS;
    let seeds = 1..=20u64;
    for frac in [0.35, 0.45] {
        let rate = frac * 1e9 / 5.1e6;
        let reference = seeds
            .clone()
            .map(|seed| mean_cost_fifo_failures(&engine, rate, span, slo, seed, end))
            .sum::<f64>()
            / 20.0;
        for warm in [false, true] {
            let mut policy = 0.0;
            for seed in seeds.clone() {
                let mut sim = spread_engine_sim(rate, seed, span).with_admission();
                if warm {
                    // What a heavier load before taught it: batches of 1
                    // and 2 at the engine's mean costs, a fitted line.
                    for i in 0..10 {
                        let n = 1 + i % 2;
                        let cost = engine.mean_ns(n) as u64;
                        sim.policy.on_batch_done(n, cost, cost, i as u64);
                    }
                    assert!(sim.policy.stats().fit_identified);
                }
                sim.run_until(end);
                policy += sim.failed_fraction(slo) / 20.0;
            }
            eprintln!(
                "{:.0}% of the engine's rate, {}: {:.3}% failed, the mean-cost FIFO {:.3}%",
                100.0 * frac,
                if warm { "warm" } else { "cold" },
                100.0 * policy,
                100.0 * reference
            );
            assert!(
                policy <= 1.25 * reference,
                "{:.0}%, warm {warm}: {policy} against {reference}",
                100.0 * frac
            );
        }
    }
}

// ---------------------------------------------------------------- provisioning

#[test]
fn under_provisioning_after_exactly_five_misses_at_batch_one() {
    let mut p = BatchPolicy::new(BatchConfig::new(10 * MS)).unwrap();
    let miss = |p: &mut BatchPolicy, t| p.on_batch_done(1, 12 * MS, 12 * MS + t, t);
    for t in 0..4 {
        assert_eq!(miss(&mut p, t), None);
    }
    // A batch that meets the SLO ends the streak.
    assert_eq!(p.on_batch_done(1, 6 * MS, 6 * MS, 4), None);
    for t in 5..9 {
        assert_eq!(miss(&mut p, t), None);
    }
    // A miss at a bigger batch neither counts nor resets.
    assert_eq!(p.on_batch_done(3, 20 * MS, 20 * MS, 9), None);
    let r = miss(&mut p, 10).expect("fifth successive miss at batch 1");
    assert_eq!(
        r,
        ProvisioningReport::Under {
            occurrences: 5,
            worst_e2e_ns: 12 * MS + 10,
            slo_ns: 10 * MS,
            at_ns: 10,
        }
    );
    // Counting starts again.
    for t in 11..15 {
        assert_eq!(miss(&mut p, t), None);
    }
    assert!(matches!(
        miss(&mut p, 15),
        Some(ProvisioningReport::Under { .. })
    ));
    assert_eq!(p.stats().under_reports, 2);
}

#[test]
fn over_provisioning_after_exactly_five_roomy_batches_without_backlog() {
    let mut p = BatchPolicy::new(BatchConfig::new(10 * MS)).unwrap();
    // 5 ms is exactly half the SLO: roomy. 5 ms + 1 ns is not.
    let roomy = |p: &mut BatchPolicy, t: u64| {
        assert_eq!(p.decide(t, &[t], true), Decision::Dispatch { batch: 1 });
        p.on_batch_done(1, 2 * MS, 5 * MS, t)
    };
    for t in 0..4 {
        assert_eq!(roomy(&mut p, t * 100 * MS), None);
    }
    assert_eq!(p.on_batch_done(1, 2 * MS, 5 * MS + 1, 450 * MS), None);
    for t in 5..9 {
        assert_eq!(roomy(&mut p, t * 100 * MS), None);
    }
    // A batch that left requests behind (the queue built) ends the streak.
    let t = 950 * MS;
    assert!(
        matches!(p.decide(t, &[t, t, t, t, t], true), Decision::Dispatch { batch } if batch < 5)
    );
    assert_eq!(p.on_batch_done(1, 2 * MS, 2 * MS, t), None);
    for t in 10..14 {
        assert_eq!(roomy(&mut p, t * 100 * MS), None);
    }
    let r = roomy(&mut p, 1_400 * MS).expect("fifth successive roomy batch");
    assert!(
        matches!(r, ProvisioningReport::Over { occurrences: 5, worst_e2e_ns, slo_ns, at_ns, .. }
            if worst_e2e_ns == 5 * MS && slo_ns == 10 * MS && at_ns == 1_400 * MS),
        "{r:?}"
    );
    assert_eq!(p.stats().over_reports, 1);
}

/// Simulation: at light load (a = 2 ms, b = 1 ms, SLO 40 ms, 50/s) the IF
/// is over-provisioned and says so, every five batches.
#[test]
fn light_load_reports_over_provisioning() {
    let cfg = BatchConfig::new(40 * MS);
    let mut sim = Sim::new(
        cfg,
        Arrivals::Constant { per_s: 50.0 },
        Engine::new(2.0, 1.0, 0.0),
        8,
    );
    sim.run_batches(20);
    assert_eq!(sim.reports.len(), 4);
    assert!(sim
        .reports
        .iter()
        .all(|r| matches!(r, ProvisioningReport::Over { .. })));
}

// ---------------------------------------------------------------- waiting

#[test]
fn waits_to_fill_a_batch_only_while_the_oldest_can_make_it() {
    let cfg = BatchConfig::new(40 * MS);
    let mut p = trained(40, 8, 1);
    // Teach the rate: one arrival every 2 ms for 200 ms (500/s), engine busy.
    let arrivals: Vec<u64> = (0..100).map(|i| 1_000 * MS + i * 2 * MS).collect();
    for k in 1..=arrivals.len() {
        let now = arrivals[k - 1];
        assert_eq!(
            p.decide(now, &arrivals[k.saturating_sub(3)..k], false),
            Decision::Idle
        );
    }
    let rate = p.arrival_rate_per_s();
    assert!((rate - 500.0).abs() < 10.0, "rate {rate}");
    // The target was planned at the last batch, before any arrival was
    // seen: the smallest batch within 5% of batch 10's throughput, 9. The
    // trust region limits dispatches to twice the largest batch seen.
    assert_eq!(p.target_batch(), 9);
    assert_eq!(p.batch_limit(), 8);
    let now = arrivals[99];
    let m = p.cost_model().unwrap();
    let latest = |oldest: u64| oldest + (cfg.slo_ns as f64 * 0.9 - m.cost_ns(8)) as u64;
    // Two queued: batches of 2 (2/10 ms = 200/s) cannot keep up with
    // 500/s, so wait for six more arrivals (12 ms) ...
    let q = [now - MS, now];
    let Decision::Wait { until_ns } = p.decide(now, &q, true) else {
        panic!("should wait");
    };
    // The estimated rate is 500/s give or take a few ns per gap.
    assert!(until_ns.abs_diff(now + 12 * MS) < 20 * 1_000, "{until_ns}");
    // ... but with an older head only until a batch of 8 still meets 36 ms,
    let q = [now - 10 * MS, now];
    assert_eq!(
        p.decide(now, &q, true),
        Decision::Wait {
            until_ns: latest(q[0])
        }
    );
    assert!(latest(q[0]).abs_diff(now + 10 * MS) <= 1);
    // and not at all when that moment has passed.
    let q = [now - 20 * MS - 1, now];
    assert_eq!(p.decide(now, &q, true), Decision::Dispatch { batch: 2 });
    assert_eq!(p.stats().waits, 2);
}

/// A wait holds the engine idle while the batch fills, and that time is
/// part of what the bigger batch costs. On an engine where batching buys
/// little (0.2 ms + 7 ms per image: batch 2 serves 1.4% more per second
/// than batch 1, and is the plan under saturation), with one request
/// queued and the next 6.6 ms away, a batch of 2 would serve 2 in 20.8 ms
/// against 1 in 7.2 ms now: the policy runs what is queued. Where batching
/// pays, it still waits (`waits_to_fill_a_batch_only_while_the_oldest_can_make_it`).
#[test]
fn does_not_wait_when_the_idle_fill_costs_more_than_the_bigger_batch_gains() {
    let mut p = BatchPolicy::new(BatchConfig::new(2_000 * MS)).unwrap();
    for (i, n) in [1u64, 2, 4].into_iter().enumerate() {
        p.on_batch_done(n as usize, 200_000 + 7 * MS * n, 10 * MS, i as u64);
    }
    // Teach the rate: an arrival every 6.6 ms (151.5/s, more than batch
    // 1's 138.9/s), the engine busy.
    let arrivals: Vec<u64> = (0..60).map(|i| 1_000 * MS + i * 6_600_000).collect();
    for k in 1..=arrivals.len() {
        assert_eq!(
            p.decide(arrivals[k - 1], &arrivals[k.saturating_sub(2)..k], false),
            Decision::Idle
        );
    }
    assert!(p.arrival_rate_per_s() > 145.0, "{}", p.arrival_rate_per_s());
    // A batch ends with that rate known: the plan is made again.
    let now = arrivals[59];
    p.on_batch_done(1, 200_000 + 7 * MS, 10 * MS, now);
    assert_eq!(p.batch_limit(), 2);
    let m = p.cost_model().unwrap();
    assert!(
        2.0 / m.cost_ns(2) > 1.0 / m.cost_ns(1),
        "batch 2 serves more per second"
    );
    assert_eq!(p.decide(now, &[now], true), Decision::Dispatch { batch: 1 });
    assert_eq!(p.stats().waits, 0);
}

proptest! {
    /// However the model, the arrival rate, the queue and the time are
    /// chosen, a chain of `Wait`s followed by the `Dispatch` it leads to
    /// never makes the oldest request finish (per the model) after its
    /// budget, unless it was already beyond reach when the policy first
    /// looked.
    #[test]
    fn wait_never_lets_the_oldest_miss_its_slo(
        slo_ms in 5u64..200,
        a_us in 0u64..30_000,
        b_us in 50u64..5_000,
        gap_us in 100u64..20_000,
        ages_us in proptest::collection::vec(0u64..150_000, 1..40),
        margin in 0.0f64..0.3,
    ) {
        let cfg = BatchConfig { margin, ..BatchConfig::new(slo_ms * MS) };
        let mut p = BatchPolicy::new(cfg).unwrap();
        for (i, n) in [1usize, 2, 4, 8, 3].into_iter().enumerate() {
            p.on_batch_done(n, (a_us + b_us * n as u64) * 1_000, MS, i as u64);
        }
        // Teach the rate with arrivals every gap_us while the engine is busy.
        let t0 = 10_000 * MS;
        let mut t = t0;
        for _ in 0..50 {
            t += gap_us * 1_000;
            p.decide(t, &[t], false);
        }
        let now = t;
        let mut queue: Vec<u64> = ages_us.iter().map(|a| now.saturating_sub(a * 1_000)).collect();
        queue.sort_unstable();
        let oldest = queue[0];
        let budget = cfg.slo_ns as f64 * (1.0 - margin);
        let m = p.cost_model().unwrap();
        let reachable = (now - oldest) as f64 + m.cost_ns(1) <= budget;
        let mut at = now;
        for _ in 0..1_000 {
            match p.decide(at, &queue, true) {
                Decision::Wait { until_ns } => {
                    prop_assert!(until_ns > at);
                    prop_assert!(reachable);
                    let n = p.batch_limit();
                    prop_assert!((until_ns - oldest) as f64 + m.cost_ns(n) <= budget + 1.0);
                    at = until_ns;
                }
                Decision::Dispatch { batch } => {
                    prop_assert!(batch >= 1 && batch <= queue.len());
                    if reachable {
                        prop_assert!((at - oldest) as f64 + m.cost_ns(batch) <= budget + 1.0,
                            "at {} oldest {} batch {}", at, oldest, batch);
                    }
                    return Ok(());
                }
                Decision::Idle => prop_assert!(false, "idle with a queue"),
            }
        }
        prop_assert!(false, "waited forever");
    }

    /// Dispatch sizes are always within the queue and `max_batch`.
    #[test]
    fn dispatch_is_within_the_queue_and_max_batch(
        max_batch in 1usize..40,
        samples in proptest::collection::vec((1usize..40, 1u64..50_000), 0..12),
        q in 1usize..60,
        age_us in 0u64..100_000,
    ) {
        let cfg = BatchConfig { max_batch, ..BatchConfig::new(40 * MS) };
        let mut p = BatchPolicy::new(cfg).unwrap();
        for (i, (n, us)) in samples.into_iter().enumerate() {
            p.on_batch_done(n.min(max_batch), us * 1_000, MS, i as u64);
            prop_assert!(p.target_batch() >= 1 && p.target_batch() <= max_batch);
            prop_assert!(p.batch_limit() >= 1 && p.batch_limit() <= p.target_batch());
        }
        let now = 1_000 * MS;
        let queue: Vec<u64> = (0..q as u64).map(|i| now - age_us * 1_000 + i).collect();
        match p.decide(now, &queue, true) {
            Decision::Dispatch { batch } => prop_assert!(batch >= 1 && batch <= q.min(max_batch)),
            Decision::Wait { until_ns } => prop_assert!(until_ns > now),
            Decision::Idle => prop_assert!(false),
        }
    }
}

#[test]
fn batch_stats_survive_the_trip_through_words() {
    // A distinct value in every field: a swapped or dropped one shows.
    let stats = BatchStats {
        target_batch: 1,
        a_ns: 2.5,
        b_ns: 3.5,
        fit_identified: true,
        ewma_exec_ns: 4.5,
        ewma_e2e_ns: 5.5,
        arrival_rate_per_s: 6.5,
        batch_limit: 7,
        dispatches: 8,
        dispatched_requests: 9,
        explorations: 10,
        waits: 11,
        batches_done: 12,
        slo_miss_batches: 13,
        shed: 14,
        regime_changes: 15,
        under_reports: 16,
        over_reports: 17,
        tail_factor: 18.5,
        wall_per_cpu: 19.5,
    };
    assert_eq!(BatchStats::from_words(&stats.to_words()), stats);
    assert_eq!(
        BatchStats::from_words(&BatchStats::default().to_words()),
        BatchStats::default()
    );
}

/// Simulation of what bench-if does after its saturation phase (issue 13):
/// a convex engine like the 2-CPU VM's (batch 1 ~5 ms, a batch of 8 ~9%
/// dearer per image) served near its capacity for 30 s with the generous
/// 2 s SLO of the benchmark, then 10% of that load, with each image 1.6
/// times as dear (an engine that idles between requests runs slower: the
/// VM's measured batch-1 time rose from ~5.5 to ~9 ms). Batching then buys
/// nothing, so every request must run as soon as the engine is free. With
/// an arrival-rate memory of 10 SLOs (20 s) the policy kept believing in
/// the saturation's rate, judged batch 1 too slow for it and waited up to
/// 225 ms to fill batches of 4–6 with the engine idle (bench-if's trace).
#[test]
fn does_not_wait_for_a_batch_after_the_load_drops() {
    let cfg = BatchConfig {
        max_batch: 8,
        ..BatchConfig::new(2_000 * MS)
    };
    let engine = Engine::new(0.0, 5.1, 0.03).convex(0.013);
    let mut sim = Sim::new(cfg, Arrivals::Poisson { per_s: 185.0 }, engine, 21);
    sim.run_until(30_000 * MS);
    sim.arrivals = Arrivals::Poisson { per_s: 18.0 };
    sim.engine = Engine::new(0.0, 5.1 * 1.6, 0.03).convex(0.013);
    // What saturation left queued drains first (bench-if's closed loop
    // leaves none: its client waits for its answers).
    sim.queue.clear();
    let (from, waits_before) = (sim.e2e.len(), sim.policy.stats().waits);
    let first_batch = sim.batches.len();
    sim.run_until(50_000 * MS);
    let low = &sim.batches[first_batch..];
    let biggest = low.iter().map(|b| b.n).max().unwrap();
    let waits = sim.policy.stats().waits - waits_before;
    let p50 = sim.percentile_e2e(from, 0.5);
    let p99 = sim.percentile_e2e(from, 0.99);
    eprintln!(
        "after the drop: {} requests, {} batches, biggest {biggest}, {waits} waits, \
         rate estimate {:.1}/s, e2e p50 {:.1} ms p99 {:.1} ms",
        sim.e2e.len() - from,
        low.len(),
        sim.policy.stats().arrival_rate_per_s,
        p50 as f64 / 1e6,
        p99 as f64 / 1e6,
    );
    // One request costs ~8.2 ms now; at 18/s a request that finds the
    // engine busy waits at most about one more batch of one or two. Before
    // the fix: 101 waits, p99 284 ms. Now a few short waits while the rate
    // estimate decays (its 1 s window), each granted once per head.
    assert!(p99 <= 30 * MS, "p99 {p99}");
    assert!(waits <= 10, "{waits} waits for a batch at 10% load");
}
