//! Overload (issue 14, item 4): one inference function offered 2× and then
//! 10× its capacity while another one runs at half of its own, the whole
//! platform live under the orchestrator on a veth pair (squeezenet as if 1,
//! the overloaded one; shufflenet as if 5, the other one).
//!
//! The run, each step timed by the test and every request recorded by
//! kp-client (`--record`):
//!
//! 1. capacity: if 5 alone, closed loop; then, with if 5 at half its
//!    capacity (open loop, Poisson, until the end), if 1 closed loop: its
//!    goodput is *the* capacity the offered loads are multiples of;
//! 2. baseline: if 1 at half its capacity (open loop, until the end);
//! 3. 2×: a second client adds 1.5× the capacity to if 1, then recovery
//!    (the half loads only);
//! 4. 10×: the second client adds 9.5×, then recovery again.
//!
//! **Placement.** The orchestrator gives each IF its own cores (on a
//! 2-core machine: if 1 shares core 0 with the if-manager's poll loop, if 5
//! has core 1). The clients are the test's load generators, not part of
//! the platform; in a deployment they are other hosts. Here they run on the
//! CPUs of the IF they load (`taskset`), and with them the kernel's work
//! for their datagrams (a veth delivers on the sending CPU): otherwise the
//! 10× client and its packets would run on if 5's core, and if 5's latency
//! would measure the test's own traffic generator rather than the
//! platform's isolation.
//!
//! What is asserted holds on any machine, however slow or loaded: every
//! request sent is answered exactly once (none unanswered but for
//! datagrams the kernel dropped before the if-manager, counted; no
//! duplicate, no late answer); the answers are OK, OVERLOADED or
//! INCOMPLETE (the other IF's INCOMPLETE only for such a dropped
//! datagram), never INTERNAL or BAD_REQUEST; the overload is answered
//! OVERLOADED; no process's resident memory grows by more than
//! [`RSS_GROWTH_KIB`] over the baseline's; and after each overload if 1
//! serves its half load in full again (a 250 ms bin of it all OK within
//! the SLO) within the recovery phase.
//!
//! What depends on the machine's speed is measured and printed, not
//! asserted: capacity, the offered rate the client achieved and its lag,
//! the served latency per phase (client round trips from the records, and
//! the platform's own count of OK answers beyond the SLO, from its
//! metrics), if 5's p99 per phase against its baseline (the 20%),
//! resident memory, and the recovery time (the 2 s). Served p99 ≤
//! SLO is not asserted: on a shared 2-core machine the IFs miss their SLO
//! now and then at half load already, where no admission decision is
//! involved (a starved thread, docs/RELIABILITY.md "Overload"). The short
//! version runs in `make test`; `make overload` runs it with 60 s
//! overloads (`KP_OVERLOAD_SECONDS`) and writes the summary as JSON
//! (`KP_OVERLOAD_OUT`), which docs/RELIABILITY.md reports.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{ensure, Context, Result};
use kneepoint_tests::orchestrator::{
    kpctl, wait_for, write_config_with, Deploy, Orchestrator, HUNG,
};
use kneepoint_tests::{
    bin, control, datagrams_lost, datagrams_received, dpdk_files_left, file_prefix, read_record,
    repo_root, run_report, vm_rss_kib, BackgroundClient, NetnsPair, Recorded, Scratch,
};
use serde_json::{json, Value};

/// The overloaded IF and the other one.
const HOT: u16 = 1;
const OTHER: u16 = 5;
/// The SLO of both, ms: 13 times squeezenet's batch of one here (7.3 ms,
/// models/squeezenet/config.toml), so a machine that runs the model at
/// all can meet it; and five times less than what the IF's 64 slots hold
/// at its capacity (about half a second of work), so an IF that queued its
/// excess instead of shedding it would miss it.
const SLO_MS: f64 = 100.0;
/// Fragments of 8 KiB on a 9000-byte MTU: 19 datagrams per request instead
/// of 147, so that 10× squeezenet's capacity is a packet rate one client
/// can send beside the platform on two cores.
const FRAG_SIZE: &str = "8192";
const MTU: u32 = 9000;
/// How much a process's resident set may grow from the end of the
/// baseline to the end of the run. The input pool and the rings are in
/// hugepages (not resident set); what may grow is the engine's arena as
/// batches grow under overload, which is bounded by the largest batch.
const RSS_GROWTH_KIB: u64 = 64 * 1024;
/// Within this long after an overload stops, if 1's half load must be
/// served in full again (the target is 2 s: measured, not
/// asserted; this bound only catches an IF that does not recover).
const RECOVERY_BOUND: Duration = Duration::from_secs(10);
/// Width of the bins of the time-resolved goodput.
const BIN_US: u64 = 250_000;

/// How long each phase lasts.
#[derive(Clone, Copy, Debug)]
struct Timings {
    capacity: Duration,
    baseline: Duration,
    overload: Duration,
    recovery: Duration,
}

impl Timings {
    /// `make test`'s short run, or `KP_OVERLOAD_SECONDS` of overload.
    fn from_env() -> Result<Timings> {
        Ok(match std::env::var("KP_OVERLOAD_SECONDS") {
            Ok(s) => Timings {
                capacity: Duration::from_secs(10),
                baseline: Duration::from_secs(20),
                overload: Duration::from_secs(s.parse().context("KP_OVERLOAD_SECONDS")?),
                recovery: Duration::from_secs(15),
            },
            Err(_) => Timings {
                capacity: Duration::from_secs(4),
                baseline: Duration::from_secs(4),
                overload: Duration::from_secs(5),
                recovery: Duration::from_secs(8),
            },
        })
    }
}

/// Like `ensure!`, but the failure is added to `$failures` and the test
/// goes on, so that its summary is printed whatever failed.
macro_rules! check {
    ($failures:expr, $cond:expr, $($fmt:tt)+) => {
        if !$cond {
            $failures.push(format!($($fmt)+));
        }
    };
}

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// kp-client from the client namespace to `if_id`, in jumbo fragments,
/// with `args` (the load) and `--record record`, on `cpus` (a CPU list, the
/// CPUs of the IF it loads: module doc, "Placement").
fn kp_client(net: &NetnsPair, if_id: u16, record: &Path, cpus: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", net.get("CLIENT_NS")])
        .args(["taskset", "-c", cpus])
        .arg(bin("kp-client"))
        .arg("--dst")
        .arg(format!("{}:9000", net.get("PLATFORM_IP")))
        .args(["--if-id", &if_id.to_string()])
        .args(["--timeout", "5s", "--input", "synthetic"])
        .args(["--frag-size", FRAG_SIZE, "--json"])
        .arg("--record")
        .arg(record)
        .args(args);
    cmd
}

/// Runs a kp-client to its end and returns its report.
fn run_client(mut cmd: Command) -> Result<Value> {
    run_report(&mut cmd)
}

/// OK answers per second of a closed-loop run.
fn goodput(report: &Value) -> Result<f64> {
    let ok = report["status"]["ok"].as_f64().context("ok")?;
    let s = report["send_duration_s"]
        .as_f64()
        .context("send_duration_s")?;
    ensure!(ok > 0.0 && s > 0.0, "no goodput: {report}");
    Ok(ok / s)
}

/// The orchestrator's Prometheus metrics (`GET /metrics` on `addr`), as
/// (series with labels, value).
fn scrape(addr: &str) -> Result<BTreeMap<String, f64>> {
    let mut s = std::net::TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(20)))?;
    write!(s, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    Ok(body
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.rsplit_once(' '))
        .filter_map(|(k, v)| Some((k.to_string(), v.parse().ok()?)))
        .collect())
}

/// The sum of the series of metric `name` whose labels include every one
/// of `labels` (`if_id="1"`, ...).
fn metric(m: &BTreeMap<String, f64>, name: &str, labels: &[&str]) -> f64 {
    m.iter()
        .filter(|(k, _)| {
            k.split_once('{')
                .is_some_and(|(n, l)| n == name && labels.iter().all(|x| l.contains(x)))
        })
        .map(|(_, v)| v)
        .sum()
}

/// What if `if_id`'s active answered by the time of a scrape: OK answers,
/// those within the SLO, and the latency histogram's cumulative buckets
/// (upper bound s, count).
#[derive(Clone, Debug, Default)]
struct Served {
    ok: f64,
    within_slo: f64,
    buckets: Vec<(f64, f64)>,
}

impl Served {
    fn of(m: &BTreeMap<String, f64>, if_id: u16) -> Served {
        let id = format!("if_id=\"{if_id}\"");
        let labels = [id.as_str(), "role=\"active\""];
        let mut buckets: Vec<(f64, f64)> = m
            .iter()
            .filter(|(k, _)| {
                k.starts_with("kneepoint_if_request_latency_seconds_bucket{")
                    && labels.iter().all(|x| k.contains(x))
            })
            .filter_map(|(k, v)| {
                // The last label named `le` (`role="active"` ends in
                // `le="` too).
                let le = k.rsplit("le=\"").next()?.split('"').next()?;
                let le = if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().ok()?
                };
                Some((le, *v))
            })
            .collect();
        buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        Served {
            ok: metric(
                m,
                "kneepoint_if_requests_total",
                &[&id, "role=\"active\"", "status=\"ok\""],
            ),
            within_slo: metric(m, "kneepoint_if_requests_within_slo_total", &labels),
            buckets,
        }
    }

    /// What was served between `self` (earlier) and `later`: OK answers,
    /// those beyond the SLO, and the p99 latency's histogram bucket bound,
    /// ms (the smallest bound with 99% of them at or below it).
    fn since(&self, later: &Served) -> (u64, u64, Option<f64>) {
        let ok = (later.ok - self.ok).max(0.0);
        let beyond = (ok - (later.within_slo - self.within_slo)).max(0.0);
        let p99 = later.buckets.iter().find_map(|(le, n)| {
            let before = self
                .buckets
                .iter()
                .find(|(l, _)| l == le)
                .map_or(0.0, |b| b.1);
            (ok > 0.0 && n - before >= 0.99 * ok).then_some(le * 1e3)
        });
        (ok as u64, beyond as u64, p99)
    }

    /// The latency histogram between `self` and `later`: (upper bound ms,
    /// OK answers in that bucket), empty buckets left out.
    fn histogram_since(&self, later: &Served) -> Vec<(f64, f64)> {
        let mut below = 0.0;
        let mut out = Vec::new();
        for (le, n) in &later.buckets {
            let before = self
                .buckets
                .iter()
                .find(|(l, _)| l == le)
                .map_or(0.0, |b| b.1);
            let cum = n - before;
            if cum > below {
                out.push((le * 1e3, cum - below));
            }
            below = cum;
        }
        out
    }
}

/// Samples the resident set of `pids` every 250 ms until stopped.
struct RssSampler {
    stop: Arc<AtomicBool>,
    samples: Arc<Mutex<Vec<(u64, u32, u64)>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl RssSampler {
    fn start(pids: Vec<u32>) -> RssSampler {
        let stop = Arc::new(AtomicBool::new(false));
        let samples = Arc::new(Mutex::new(Vec::new()));
        let (s, out) = (stop.clone(), samples.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                let t = now_us();
                for &pid in &pids {
                    if let Some(kib) = vm_rss_kib(pid) {
                        out.lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .push((t, pid, kib));
                    }
                }
                std::thread::sleep(Duration::from_millis(250));
            }
        });
        RssSampler {
            stop,
            samples,
            thread: Some(thread),
        }
    }

    fn stop(mut self) -> Vec<(u64, u32, u64)> {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        std::mem::take(&mut *self.samples.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// A phase of the run: its name and its window of send times, µs since the
/// Unix epoch.
#[derive(Clone, Debug)]
struct Phase {
    name: &'static str,
    from_us: u64,
    to_us: u64,
}

/// Requests of `records` sent within `phase`.
fn within<'a>(records: &'a [Recorded], phase: &Phase) -> Vec<&'a Recorded> {
    records
        .iter()
        .filter(|r| r.sent_us >= phase.from_us && r.sent_us < phase.to_us)
        .collect()
}

/// Nearest-rank percentile of `v` (sorted here), ms.
fn percentile_ms(mut v: Vec<u64>, p: f64) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_unstable();
    let rank = ((p * v.len() as f64).ceil() as usize).clamp(1, v.len());
    Some(v[rank - 1] as f64 / 1e3)
}

/// Outcomes by name, and the OK round trips' p50 and p99, ms, of `rs`.
fn summary(rs: &[&Recorded], seconds: f64) -> Value {
    let mut outcomes: BTreeMap<&str, u64> = BTreeMap::new();
    for r in rs {
        *outcomes.entry(r.outcome.as_str()).or_default() += 1;
    }
    let ok_rtts: Vec<u64> = rs
        .iter()
        .filter(|r| r.outcome == "ok")
        .filter_map(|r| r.rtt_us())
        .collect();
    json!({
        "sent": rs.len(),
        "offered_rps": rs.len() as f64 / seconds,
        "goodput_rps": ok_rtts.len() as f64 / seconds,
        "outcomes": outcomes,
        "ok_rtt_p50_ms": percentile_ms(ok_rtts.clone(), 0.50),
        "ok_rtt_p99_ms": percentile_ms(ok_rtts, 0.99),
    })
}

/// How soon, after `stop_us` (an overload's last send), if 1's half load
/// (`steady`) is served again, µs after `stop_us`, looking at 250 ms bins
/// of send times until `until_us`: `first`, the start of the first bin in
/// which every request sent was answered OK within the SLO, and
/// `settled`, the start of the first bin from which on every one was
/// (`None`: never). Also each bin's count of such requests over those
/// sent, from 1 s before `stop_us`.
fn recovery(steady: &[Recorded], stop_us: u64, until_us: u64) -> Value {
    let slo_us = (SLO_MS * 1e3) as u64;
    let good = |r: &Recorded| r.outcome == "ok" && r.rtt_us().is_some_and(|t| t <= slo_us);
    let bins = (until_us.saturating_sub(stop_us)) / BIN_US;
    let from = stop_us.saturating_sub(4 * BIN_US);
    let per_bin: Vec<(u64, usize, usize)> = (0..bins + 4)
        .map(|i| {
            let (a, b) = (from + i * BIN_US, from + (i + 1) * BIN_US);
            let rs: Vec<&Recorded> = steady
                .iter()
                .filter(|r| r.sent_us >= a && r.sent_us < b)
                .collect();
            (a, rs.iter().filter(|r| good(r)).count(), rs.len())
        })
        .collect();
    let after: Vec<&(u64, usize, usize)> = per_bin.iter().filter(|b| b.0 >= stop_us).collect();
    let all_good = |b: &&(u64, usize, usize)| b.1 == b.2;
    let first = after
        .iter()
        .find(|b| b.2 > 0 && all_good(b))
        .map(|b| (b.0 - stop_us) as f64 / 1e3);
    let settled = after
        .iter()
        .rposition(|b| !all_good(b))
        .map_or(Some(0), |i| after.get(i + 1).map(|b| b.0 - stop_us))
        .map(|us| us as f64 / 1e3);
    json!({
        "first_good_bin_ms": first,
        "settled_ms": settled,
        "good_per_250ms_bin_from_1s_before": per_bin
            .iter()
            .map(|b| format!("{}/{}", b.1, b.2))
            .collect::<Vec<_>>(),
    })
}

/// The machine's load averages (/proc/loadavg: 1, 5 and 15 min): how
/// much else ran beside the test.
fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// The CPUs a process may run on (`Cpus_allowed_list`).
fn cpus_of(pid: u64) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
                .map(|v| v.trim().to_string())
        })
        .unwrap_or_else(|| "?".into())
}

fn row(status: &Value, if_id: u16) -> Result<Value> {
    status["ifs"]
        .as_array()
        .and_then(|a| a.iter().find(|r| r["if_id"] == if_id))
        .cloned()
        .with_context(|| format!("if {if_id} not in status: {status}"))
}

/// The datagrams the if-manager at `ifm_control` received so far.
fn received(ifm_control: &str) -> Result<u64> {
    let reply = control(ifm_control, &json!({"cmd": "stats"}), HUNG)?;
    datagrams_received(&reply["stats"])
}

#[test]
fn overload_is_answered_overloaded_within_slo_and_recovered_from() -> Result<()> {
    for m in ["squeezenet", "shufflenet"] {
        let p = repo_root().join("models").join(m).join("config.toml");
        ensure!(p.exists(), "{} is missing: run `make models`", p.display());
    }
    let timings = Timings::from_env()?;
    let net = NetnsPair::up_mtu(&format!("kpov{}", std::process::id() % 100_000), Some(MTU))?;
    let dir = Scratch::new("overload");
    let prefix = file_prefix("overload");
    let config = dir.path("platform.toml");
    let metrics_port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let metrics = format!("127.0.0.1:{metrics_port}");
    write_config_with(
        &config,
        &net,
        &prefix,
        &[
            Deploy {
                if_id: HOT,
                model: "squeezenet",
                slo_ms: SLO_MS,
                share_pct: 50.0,
            },
            Deploy {
                if_id: OTHER,
                model: "shufflenet",
                slo_ms: SLO_MS,
                share_pct: 50.0,
            },
        ],
        &format!("metrics_listen = \"{metrics}\""),
    )?;
    let runtime = dir.path("run");
    let endpoint = format!("ipc://{}", runtime.join("orchestrator.sock").display());
    let ifm_control = format!("ipc://{}", runtime.join("if-manager.sock").display());
    let record = |name: &str| -> PathBuf { dir.path(&format!("{name}.csv")) };
    let orch = Orchestrator::start(&config, &runtime)?;
    let result = (|| -> Result<(Vec<String>, Value)> {
        let s = wait_for(&endpoint, "both IFs active", |s| {
            s["ifs"]
                .as_array()
                .is_some_and(|a| a.len() == 2 && a.iter().all(|r| r["state"] == "active"))
        })?;
        // The shadows load their models too: wait for them, so that their
        // start is not part of any measurement.
        orch.wait_log("both shadows ready", |log| {
            [HOT, OTHER].iter().all(|id| {
                log.lines().any(|l| {
                    l.contains(&format!("kp-if {id} #"))
                        && l.contains("(shadow,")
                        && l.contains("said it is ready")
                })
            })
        })?;
        let ifm_pid = s["platform"]["if_manager_pid"]
            .as_u64()
            .context("if-manager pid")?;
        let hot_pid = row(&s, HOT)?["pid"].as_u64().context("pid")?;
        let other_pid = row(&s, OTHER)?["pid"].as_u64().context("pid")?;
        // Each IF's clients run on that IF's CPUs (module doc, "Placement").
        let (hot_cpus, other_cpus) = (cpus_of(hot_pid), cpus_of(other_pid));
        ensure!(
            hot_cpus != "?" && other_cpus != "?",
            "no CPU list for the IFs: {hot_cpus} / {other_cpus}"
        );
        let placement = json!({
            "if_manager": cpus_of(ifm_pid),
            "hot": hot_cpus,
            "other": other_cpus,
            "clients": "on the CPUs of the IF they load",
        });
        eprintln!("placement (CPUs allowed): {placement}");
        let received_before = received(&ifm_control)?;

        // 1. Capacity: if 5 alone, then if 1 beside if 5 at half load.
        let secs = format!("{}s", timings.capacity.as_secs_f64());
        let cap_other_report = run_client(kp_client(
            &net,
            OTHER,
            &record("capacity-other"),
            &other_cpus,
            &["--concurrency", "4", "--duration", &secs],
        ))?;
        let cap_other = goodput(&cap_other_report)?;
        let other_rate = format!("{:.1}", cap_other / 2.0);
        let other = BackgroundClient::spawn(kp_client(
            &net,
            OTHER,
            &record("other"),
            &other_cpus,
            &["--rate", &other_rate, "--duration", "3600s"],
        ))?;
        std::thread::sleep(Duration::from_secs(1));
        // Twice, the larger goodput counting: a spell of foreign load on
        // a shared machine lowers one measurement, never raises it.
        let mut cap_reports = Vec::new();
        for name in ["capacity-hot", "capacity-hot-2"] {
            cap_reports.push(run_client(kp_client(
                &net,
                HOT,
                &record(name),
                &hot_cpus,
                &["--concurrency", "4", "--duration", &secs],
            ))?);
        }
        let capacity = goodput(&cap_reports[0])?.max(goodput(&cap_reports[1])?);
        eprintln!(
            "capacity: if {OTHER} alone {cap_other:.1}/s, if {HOT} beside it {capacity:.1}/s"
        );

        // 2. Baseline: if 1 at half its capacity.
        let rss = RssSampler::start(
            [ifm_pid, hot_pid, other_pid]
                .iter()
                .map(|&p| p as u32)
                .collect(),
        );
        let base_from = now_us();
        let steady = BackgroundClient::spawn(kp_client(
            &net,
            HOT,
            &record("steady"),
            &hot_cpus,
            &[
                "--rate",
                &format!("{:.1}", capacity / 2.0),
                "--duration",
                "3600s",
            ],
        ))?;
        let mut scrapes = vec![("start", scrape(&metrics)?)];
        let mut loads = vec![("start", loadavg())];
        std::thread::sleep(timings.baseline);
        let base_to = now_us();
        scrapes.push(("baseline", scrape(&metrics)?));
        loads.push(("baseline", loadavg()));
        let mut phases = vec![Phase {
            name: "baseline",
            from_us: base_from,
            to_us: base_to,
        }];
        let mut excess = Vec::new();
        let mut stops = Vec::new();
        // 3. and 4.: the overloads, each followed by a recovery.
        for (name, rec_name, times) in [("2x", "recovery-2x", 2.0), ("10x", "recovery-10x", 10.0)] {
            let rate = capacity * (times - 0.5);
            let report = run_client(kp_client(
                &net,
                HOT,
                &record(name),
                &hot_cpus,
                &[
                    "--rate",
                    &format!("{rate:.1}"),
                    "--duration",
                    &format!("{}s", timings.overload.as_secs_f64()),
                ],
            ))?;
            let rs = read_record(&record(name))?;
            let from = rs.iter().map(|r| r.sent_us).min().context("no request")?;
            let to = rs.iter().map(|r| r.sent_us).max().context("no request")? + 1;
            scrapes.push((name, scrape(&metrics)?));
            loads.push((name, loadavg()));
            phases.push(Phase {
                name,
                from_us: from,
                to_us: to,
            });
            std::thread::sleep(timings.recovery);
            phases.push(Phase {
                name: rec_name,
                from_us: to,
                to_us: now_us(),
            });
            scrapes.push((rec_name, scrape(&metrics)?));
            loads.push((rec_name, loadavg()));
            stops.push(to);
            excess.push((name, times, rate, report));
        }
        let steady_report = steady.stop()?;
        let other_report = other.stop()?;
        let rss = rss.stop();
        let received_during = received(&ifm_control)?
            .checked_sub(received_before)
            .context("the if-manager's counters went down")?;
        let status = kpctl(&endpoint, &["status"])?;
        kpctl(&endpoint, &["shutdown"])?;

        let mut failures: Vec<String> = Vec::new();
        // Every request answered exactly once, but for datagrams the
        // kernel dropped before the if-manager.
        let mut reports: Vec<(&str, &Value)> = vec![
            ("steady", &steady_report),
            ("other", &other_report),
            ("capacity-hot", &cap_reports[0]),
            ("capacity-hot-2", &cap_reports[1]),
            ("capacity-other", &cap_other_report),
        ];
        for (name, _, _, r) in &excess {
            reports.push((name, r));
        }
        let sent: u64 = reports
            .iter()
            .map(|(_, r)| r["datagrams_sent"].as_u64().unwrap_or(0))
            .sum();
        let lost = datagrams_lost(sent, received_during)?;
        let (mut unanswered, mut other_incomplete) = (0, 0);
        for (name, r) in &reports {
            check!(
                failures,
                r["duplicates"] == 0 && r["late"] == 0 && r["unexpected"] == 0,
                "{name}: answered twice or late: {r}"
            );
            let st = &r["status"];
            for bad in ["internal", "bad_request", "unknown_if"] {
                check!(failures, st[bad] == 0, "{name}: {bad} answers: {r}");
            }
            unanswered += r["unanswered"].as_u64().unwrap_or(0);
            if name.contains("other") {
                other_incomplete += st["incomplete"].as_u64().unwrap_or(0);
            }
        }
        // A request none of whose datagrams reached the if-manager is not
        // answered; one that lost some is INCOMPLETE. The overloaded IF may
        // answer INCOMPLETE for other reasons too (its reassembly timeout
        // can end a request before the if-manager's shed notice comes: a
        // correct answer): only the other IF's are counted against drops.
        check!(
            failures,
            unanswered + other_incomplete <= lost,
            "{unanswered} requests unanswered and {other_incomplete} of if {OTHER}'s INCOMPLETE, \
             more than the {lost} datagrams the kernel dropped before the if-manager"
        );
        let overloaded: u64 = excess
            .iter()
            .map(|(_, _, _, r)| r["status"]["overloaded"].as_u64().unwrap_or(0))
            .sum();
        let offered_10x = excess[1].3["send_rate"].as_f64().unwrap_or(0.0) + capacity / 2.0;
        check!(
            failures,
            overloaded > 0 || offered_10x < 1.5 * capacity,
            "offered {offered_10x:.0}/s against a capacity of {capacity:.0}/s and nothing \
             answered OVERLOADED"
        );

        // Served within the SLO, by the platform's own count, per phase.
        let mut served = Vec::new();
        for w in scrapes.windows(2) {
            let (a, b) = (&w[0].1, &w[1].1);
            for if_id in [HOT, OTHER] {
                let (before, after) = (Served::of(a, if_id), Served::of(b, if_id));
                let (ok, beyond, p99) = before.since(&after);
                let id = format!("if_id=\"{if_id}\"");
                let delta =
                    |name: &str, labels: &[&str]| metric(b, name, labels) - metric(a, name, labels);
                served.push(json!({
                    "phase": w[1].0, "if_id": if_id, "ok": ok, "beyond_slo": beyond,
                    "platform_p99_ms_bucket": p99,
                    "platform_latency_ms_buckets": before.histogram_since(&after),
                    "overloaded": delta("kneepoint_if_requests_total", &[&id, "status=\"overloaded\""]),
                    "incomplete": delta("kneepoint_if_requests_total", &[&id, "status=\"incomplete\""]),
                    "in_flight_at_end": metric(b, "kneepoint_if_requests_in_flight", &[&id]),
                    "shed_by_policy": delta("kneepoint_if_shed_requests_total", &[&id]),
                    "if_manager_shed": delta("kneepoint_if_manager_packets_total", &["outcome=\"shed\""]),
                    "if_manager_shed_suppressed":
                        delta("kneepoint_if_manager_packets_total", &["outcome=\"shed_suppressed\""]),
                    "if_manager_ring_full": delta("kneepoint_if_manager_packets_total", &["outcome=\"ring_full\""]),
                }));
            }
        }

        // Per phase, from the records: what each IF's clients got.
        let hot: Vec<Recorded> = ["steady", "2x", "10x"]
            .iter()
            .map(|n| read_record(&record(n)))
            .collect::<Result<Vec<_>>>()?
            .concat();
        let steady_records = read_record(&record("steady"))?;
        let other_records = read_record(&record("other"))?;
        let mut table = Vec::new();
        for p in &phases {
            let secs = (p.to_us - p.from_us) as f64 / 1e6;
            table.push(json!({
                "phase": p.name,
                "seconds": secs,
                "hot": summary(&within(&hot, p), secs),
                "other": summary(&within(&other_records, p), secs),
            }));
        }
        // Recovery after each overload: served in full again within
        // RECOVERY_BOUND (how soon is measured, not asserted).
        let mut recoveries = Vec::new();
        for (i, &stop) in stops.iter().enumerate() {
            let until = phases[2 * i + 2].to_us;
            let mut r = recovery(&steady_records, stop, until);
            r["after"] = json!(excess[i].0);
            let first = r["first_good_bin_ms"].as_f64();
            check!(
                failures,
                first.is_some_and(|ms| ms <= RECOVERY_BOUND.as_secs_f64() * 1e3),
                "if {HOT} was not served in full within {RECOVERY_BOUND:?} after {}: {r}",
                excess[i].0
            );
            recoveries.push(r);
        }
        // Resident memory: at most RSS_GROWTH_KIB above the baseline's end.
        let mut memory = Vec::new();
        for (who, pid) in [
            ("if_manager", ifm_pid),
            ("hot", hot_pid),
            ("other", other_pid),
        ] {
            let of = |from: u64, to: u64| {
                rss.iter()
                    .filter(|(t, p, _)| u64::from(*p) == pid && *t >= from && *t < to)
                    .map(|s| s.2)
                    .max()
            };
            let base = of(0, base_to).context("no RSS sample in the baseline")?;
            let per_phase: Vec<Value> = phases
                .iter()
                .map(|p| json!({"phase": p.name, "max_kib": of(p.from_us, p.to_us)}))
                .collect();
            let max = of(0, u64::MAX).unwrap_or(0);
            memory.push(json!({"process": who, "baseline_kib": base, "max_kib": max, "per_phase": per_phase}));
            check!(
                failures,
                max <= base + RSS_GROWTH_KIB,
                "{who}: resident set grew from {base} KiB to {max} KiB"
            );
        }
        let offered: Vec<Value> = excess
            .iter()
            .map(|(name, times, rate, r)| {
                json!({
                    "phase": name, "times_capacity": times, "excess_rate_asked": rate,
                    "excess_rate_sent": r["send_rate"], "lag_us": r["lag_us"],
                    "status": r["status"], "datagrams_sent": r["datagrams_sent"],
                })
            })
            .collect();
        // Which code was measured (`-dirty`: with uncommitted changes).
        let commit = Command::new("git")
            .arg("-C")
            .arg(repo_root())
            .args(["describe", "--always", "--dirty", "--abbrev=7"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default();
        Ok((
            failures,
            json!({
                "commit": commit,
                "slo_ms": SLO_MS,
                "frag_size": FRAG_SIZE,
                "timings_s": {
                    "capacity": timings.capacity.as_secs_f64(),
                    "baseline": timings.baseline.as_secs_f64(),
                    "overload": timings.overload.as_secs_f64(),
                    "recovery": timings.recovery.as_secs_f64(),
                },
                "placement": placement,
            "loadavg_at_phase_end": loads.iter().map(|(n, l)| json!({"phase": n, "loadavg": l})).collect::<Vec<_>>(),
            "capacity_runs_rps": cap_reports.iter().map(goodput).collect::<Result<Vec<_>>>()?,
                "capacity_rps": {"other_alone": cap_other, "hot_beside_other_half": capacity},
                "offered": offered,
                "phases": table,
                "served_platform": served,
                "recovery": recoveries,
                "memory": memory,
                "datagrams": {"sent": sent, "received": received_during, "lost": lost},
                "clients": {"steady": steady_report, "other": other_report},
                "status": status,
            }),
        ))
    })();
    let ((mut failures, summary), out) = orch.end(&endpoint, result)?;
    ensure!(
        out.status.success(),
        "orchestrator: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // What went wrong first, then the summary (thousands of lines: CI
    // shows the head and the tail of a failing test's output).
    let log = String::from_utf8_lossy(&out.stderr);
    let left = dpdk_files_left(&prefix);
    if !left.is_empty() {
        // Files are left when a process was killed: say which and why.
        // Each such line is followed by the process's last output.
        let lines: Vec<&str> = log.lines().collect();
        let kills: Vec<String> = lines
            .iter()
            .enumerate()
            .filter(|(_, l)| l.contains("killing it") || l.contains("left no final report"))
            .map(|(i, _)| lines[i..lines.len().min(i + 9)].join("\n"))
            .collect();
        failures.push(format!(
            "DPDK files left behind: {left:?}; the orchestrator's kills: {kills:?}"
        ));
    }
    for f in &failures {
        eprintln!("FAILED: {f}");
    }
    println!("{summary:#}");
    if let Ok(path) = std::env::var("KP_OVERLOAD_OUT") {
        std::fs::write(&path, format!("{summary:#}\n"))?;
    }
    ensure!(failures.is_empty(), "{}", failures.join("\n"));
    Ok(())
}
