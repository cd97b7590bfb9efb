//! Chaos under load (issue 14, item 2): the whole platform under the
//! orchestrator, live over a veth pair, with two inference functions
//! (squeezenet as if 1, shufflenet as if 5) under open-loop load from two
//! kp-clients, while a seeded schedule
//!
//! - SIGKILLs an IF's active, its parked shadow, a kp-if while it loads its
//!   model (the replacement of a shadow just killed, or the new shadow of a
//!   re-provision just asked for: a kill during a switchover), the
//!   if-manager, and the orchestrator itself (started again, as a service
//!   manager would, a moment later: the new one cleans up what the dead one
//!   left and starts the platform afresh);
//! - and sends valid control commands (SLO changes, share pins and unpins,
//!   status) and invalid ones (not JSON, unknown commands, unknown IFs,
//!   values out of range, a deploy of a deployed IF or of a model that does
//!   not exist).
//!
//! What must hold at the end (docs/RELIABILITY.md, "Chaos"):
//!
//! - **no request answered twice** (the clients' `duplicates`, `late` and
//!   `unexpected` are 0);
//! - **every request answered**, unless it was in the platform when a
//!   fault took the whole data path down (the if-manager killed, or the
//!   orchestrator killed and its successor restarting the platform): an
//!   unanswered request must have been sent within [`IN_PLATFORM`] before
//!   such a fault and the first request served OK after it. Those are the
//!   documented loss, counted per fault. A killed IF loses nothing: its
//!   successor answers what it held INTERNAL (libml's ledger);
//! - **an answer other than OK only near a fault** (INTERNAL for what a
//!   killed IF held, INCOMPLETE for a request cut by a restart, OVERLOADED
//!   while a replacement loads, UNKNOWN_IF while a restarted if-manager
//!   has not got its IFs back), never BAD_REQUEST;
//! - **service restored** after each if-manager kill within
//!   [`IF_MANAGER_RESTORED`] and after each orchestrator kill within
//!   [`ORCHESTRATOR_RESTORED`] (time from the kill to the first OK answer
//!   of each IF to a request sent after it; measured and printed);
//! - **every command answered**: a valid one `ok` (or `busy`/`failed`, with
//!   a message, while the platform is in the middle of something), an
//!   invalid one with its error code, whenever an orchestrator runs;
//! - **nothing leaked** once the last orchestrator has shut down: no
//!   process the platform ever ran, no DPDK hugepage file or runtime
//!   directory of its file prefix, no socket in its runtime directory, and
//!   (after the test's own teardown) no network namespace;
//! - **memory flat**: the resident set of every process that lived long
//!   enough to tell ([`RSS_MIN_LIFE`]) grew by at most [`RSS_GROWTH`]
//!   between its warm-up and its end.
//!
//! `make test` runs 60 s of chaos; `make chaos` 600 s (`CHAOS_SECONDS`;
//! `CHAOS_SEED` picks another schedule). The
//! summary (faults, losses, restoration times, RSS) is printed, and written
//! as JSON to `KP_CHAOS_OUT` when that is set.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, ensure, Context, Result};
use kneepoint_tests::orchestrator::{all_active, kpctl, write_config, Orchestrator, HUNG};
use kneepoint_tests::{
    bin, control_raw, dpdk_files_left, file_prefix, read_record, repo_root, vm_rss_kib,
    BackgroundClient, NetnsPair, Recorded, Scratch,
};
use kp_os::affinity::process_alive;
use serde_json::{json, Value};

/// The `[platform]` lines: metrics on a port the system picks.
const PLATFORM: &str = r#"metrics_listen = "127.0.0.1:0""#;

/// The IFs under load: (if_id, model).
const IFS: [(u16, &str); 2] = [(1, "squeezenet"), (5, "shufflenet")];

/// Open-loop request rate per IF (Poisson), requests/s: a fifth or less of
/// what one core serves of either model here, so that what goes wrong is
/// the faults' doing, not overload's.
const RATE: &str = "12";

/// A request unanswered this long is unanswered (far above any answer's
/// round trip: the SLOs stay within 1.5–3 s).
const CLIENT_TIMEOUT: &str = "10s";

/// The longest a request may be inside the platform before its answer, µs:
/// the largest SLO the schedule sets (3 s), plus the time it may wait in
/// its ring for a replacement active to load after its IF's active was
/// killed with no ready shadow (5 s: under 2 s here, more on a starved
/// machine), plus the reassembly timeout. A request sent this long before
/// a fault that takes the data path down may have been in the platform
/// when it struck.
const IN_PLATFORM: u64 = 8_200_000;

/// Service restored (each IF's first OK answer to a request sent after the
/// fault) at most this long after an if-manager kill, µs: it is started
/// again once its IFs exited, EAL and the mempool are set up, then both
/// actives load their models.
const IF_MANAGER_RESTORED: u64 = 20_000_000;

/// The same after an orchestrator kill, µs: the new one TERMs what the
/// old one left (up to 10 s of grace before it KILLs), then starts the
/// platform as at its first start.
const ORCHESTRATOR_RESTORED: u64 = 30_000_000;

/// RSS is judged only for processes that lived at least this long.
const RSS_MIN_LIFE: Duration = Duration::from_secs(30);

/// Growth allowed from the RSS after warm-up (the median of a process's
/// samples 10–15 s into its life) to its end (the median of its last five
/// samples): this fraction, plus [`RSS_SLACK_KIB`].
const RSS_GROWTH: f64 = 0.25;
const RSS_SLACK_KIB: u64 = 16 * 1024;

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// splitmix64: the schedule's dice, seeded.
struct Dice(u64);

impl Dice {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [lo, hi).
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo).max(1)
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.next() as usize % items.len()]
    }

    fn ms(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(self.range(lo, hi))
    }
}

/// What the schedule does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    KillActive,
    KillShadow,
    /// A shadow killed, then its replacement while it loads its model.
    KillLoading,
    /// An SLO change, then (while its new shadow loads or it switches
    /// over) a kill of the new shadow or of the active.
    KillInSwitchover,
    KillIfManager,
    KillOrchestrator,
    Command,
    BadCommand,
}

const KINDS: [Kind; 8] = [
    Kind::KillActive,
    Kind::KillShadow,
    Kind::KillLoading,
    Kind::KillInSwitchover,
    Kind::KillIfManager,
    Kind::KillOrchestrator,
    Kind::Command,
    Kind::BadCommand,
];

/// One thing the schedule did.
#[derive(Clone, Debug)]
struct Fault {
    kind: Kind,
    /// When, µs since the epoch.
    at: u64,
    /// What exactly (for the report).
    what: String,
    /// For faults that take the data path down: when the loss began (the
    /// kill; after an orchestrator kill, when its successor started).
    down_from: Option<u64>,
    /// After an orchestrator kill: when the last process of the old
    /// platform was gone (until then it may still answer).
    old_gone: Option<u64>,
}

/// The platform's processes, from the orchestrator's state file.
struct Procs {
    orchestrator: u32,
    /// Every process it runs: the if-manager and every kp-if.
    pids: Vec<u32>,
}

fn procs(runtime: &Path) -> Option<Procs> {
    let text = std::fs::read_to_string(runtime.join("state.json")).ok()?;
    let v: Value = serde_json::from_str(&text).ok()?;
    Some(Procs {
        orchestrator: v["orchestrator"].as_u64()? as u32,
        pids: v["pids"]
            .as_array()?
            .iter()
            .filter_map(|p| p.as_u64().map(|p| p as u32))
            .collect(),
    })
}

fn cmdline(pid: u32) -> Vec<String> {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| {
            b.split(|c| *c == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// The IF a live kp-if process serves.
fn kp_if_of(pid: u32) -> Option<u16> {
    let args = cmdline(pid);
    if !args.first().is_some_and(|a| a.ends_with("kp-if")) {
        return None;
    }
    let i = args.iter().position(|a| a == "--if-id")?;
    args.get(i + 1)?.parse().ok()
}

/// How long ago `pid` started.
fn age(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = stat.rsplit_once(')')?.1;
    // Field 22 (starttime) is the 20th after the command's ')'.
    let start_ticks: u64 = after.split_whitespace().nth(19)?.parse().ok()?;
    let uptime: f64 = std::fs::read_to_string("/proc/uptime")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    let hz = 100.0; // USER_HZ: 100 on every Linux this runs on
    Some(Duration::from_secs_f64(
        (uptime - start_ticks as f64 / hz).max(0.0),
    ))
}

fn kill9(pid: u32) {
    let _ = Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status();
}

fn row(status: &Value, if_id: u16) -> Option<&Value> {
    status["ifs"]
        .as_array()?
        .iter()
        .find(|r| r["if_id"] == if_id)
}

/// The run: processes seen, RSS samples, faults.
struct Run<'a> {
    runtime: &'a Path,
    config: &'a Path,
    endpoint: String,
    orchestrators: Vec<Orchestrator>,
    dice: Dice,
    faults: Vec<Fault>,
    /// Every pid the platform ran (orchestrators included), and its RSS
    /// samples: (seconds since first seen, KiB).
    seen: BTreeMap<u32, (Instant, Vec<(f64, u64)>)>,
    commands: u64,
    refused: BTreeMap<String, u64>,
    /// Orchestrator kills whose old platform still runs: (index of the
    /// fault, the old platform's processes). Once all are gone, the fault's
    /// `old_gone` is set.
    old_platforms: Vec<(usize, Vec<u32>)>,
}

impl Run<'_> {
    fn orchestrator_alive(&mut self) -> bool {
        self.orchestrators
            .last_mut()
            .is_some_and(|o| matches!(o.child().try_wait(), Ok(None)))
    }

    fn status(&mut self) -> Option<Value> {
        if !self.orchestrator_alive() {
            return None;
        }
        kpctl(&self.endpoint, &["status"]).ok()
    }

    /// Samples every process's RSS and notes new ones.
    fn observe(&mut self) {
        if let Some(p) = procs(self.runtime) {
            for pid in std::iter::once(p.orchestrator).chain(p.pids) {
                self.seen
                    .entry(pid)
                    .or_insert_with(|| (Instant::now(), Vec::new()));
            }
        }
        for (pid, (first, samples)) in self.seen.iter_mut() {
            if let Some(kib) = vm_rss_kib(*pid) {
                samples.push((first.elapsed().as_secs_f64(), kib));
            }
        }
        let now = now_us();
        let faults = &mut self.faults;
        self.old_platforms.retain(|(i, pids)| {
            let gone = !pids.iter().any(|p| process_alive(*p));
            if gone {
                faults[*i].old_gone = Some(now);
            }
            !gone
        });
    }

    /// Waits `d`, observing.
    fn pause(&mut self, d: Duration) {
        let until = Instant::now() + d;
        loop {
            self.observe();
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            std::thread::sleep(left.min(Duration::from_millis(100)));
        }
    }

    fn note(&mut self, kind: Kind, what: String, down: bool) {
        let at = now_us();
        eprintln!("chaos: {:>8.3} s {kind:?}: {what}", at as f64 / 1e6 % 1e4);
        self.faults.push(Fault {
            kind,
            at,
            what,
            down_from: down.then_some(at),
            old_gone: None,
        });
    }

    /// Live kp-if processes of `if_id` other than `except`, youngest first.
    fn kp_ifs(&self, if_id: u16, except: Option<u32>) -> Vec<u32> {
        let mut v: Vec<(Duration, u32)> = procs(self.runtime)
            .map(|p| p.pids)
            .unwrap_or_default()
            .into_iter()
            .filter(|p| Some(*p) != except && kp_if_of(*p) == Some(if_id))
            .filter_map(|p| Some((age(p)?, p)))
            .collect();
        v.sort();
        v.into_iter().map(|(_, p)| p).collect()
    }

    fn active(&mut self, if_id: u16) -> Option<u32> {
        let s = self.status()?;
        row(&s, if_id)?["pid"].as_u64().map(|p| p as u32)
    }

    /// A kp-if of `if_id` younger than `young` that appears within `within`
    /// and is not `except`.
    fn wait_young(&mut self, if_id: u16, young: Duration, within: Duration) -> Option<u32> {
        let until = Instant::now() + within;
        while Instant::now() < until {
            if let Some(p) = self
                .kp_ifs(if_id, None)
                .into_iter()
                .find(|p| age(*p).is_some_and(|a| a < young))
            {
                return Some(p);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// Does `kind`; whether it could be done (there was something to kill,
    /// the SLO change was accepted).
    fn act(&mut self, kind: Kind) -> Result<bool> {
        let if_id = self.dice.pick(&IFS).0;
        let before = self.faults.len();
        match kind {
            Kind::KillActive => match self.active(if_id) {
                Some(pid) => {
                    kill9(pid);
                    self.note(kind, format!("if {if_id}'s active {pid}"), false);
                }
                None => eprintln!("chaos: no active of if {if_id} to kill"),
            },
            Kind::KillShadow => {
                let active = self.active(if_id);
                match self.kp_ifs(if_id, active).last() {
                    Some(&pid) => {
                        kill9(pid);
                        self.note(kind, format!("if {if_id}'s shadow {pid}"), false);
                    }
                    None => eprintln!("chaos: no shadow of if {if_id} to kill"),
                }
            }
            Kind::KillLoading => {
                let active = self.active(if_id);
                let Some(&shadow) = self.kp_ifs(if_id, active).last() else {
                    eprintln!("chaos: no shadow of if {if_id} to kill");
                    return Ok(false);
                };
                kill9(shadow);
                self.note(
                    Kind::KillShadow,
                    format!("if {if_id}'s shadow {shadow}"),
                    false,
                );
                let load = self.dice.ms(0, 800);
                match self.wait_young(if_id, Duration::from_millis(500), Duration::from_secs(5)) {
                    Some(pid) => {
                        std::thread::sleep(load);
                        kill9(pid);
                        self.note(
                            kind,
                            format!("if {if_id}'s new shadow {pid}, {load:?} into its start"),
                            false,
                        );
                    }
                    None => eprintln!("chaos: no new shadow of if {if_id} within 5 s"),
                }
            }
            Kind::KillInSwitchover => {
                let slo = self.dice.range(1500, 3000);
                let reply = self.command(json!({"cmd": "slo", "if_id": if_id, "slo_ms": slo}))?;
                if reply["ok"] != true {
                    eprintln!("chaos: if {if_id}'s SLO change refused: {reply}");
                    return Ok(false);
                }
                self.note(kind, format!("if {if_id}: slo -> {slo} ms"), false);
                let wait = self.dice.ms(0, 1500);
                std::thread::sleep(wait);
                let active = self.active(if_id);
                let young = self.kp_ifs(if_id, active).first().copied();
                let (what, pid) = match (self.dice.next() % 2, young) {
                    (0, Some(p)) => ("its newest kp-if", Some(p)),
                    _ => ("its active", active),
                };
                if let Some(pid) = pid {
                    kill9(pid);
                    self.note(
                        kind,
                        format!("if {if_id}: {what} {pid}, {wait:?} after the SLO change"),
                        false,
                    );
                }
            }
            Kind::KillIfManager => {
                let pid = self
                    .status()
                    .and_then(|s| s["platform"]["if_manager_pid"].as_u64());
                match pid {
                    Some(pid) => {
                        kill9(pid as u32);
                        self.note(kind, format!("the if-manager {pid}"), true);
                    }
                    None => eprintln!("chaos: no if-manager to kill"),
                }
            }
            Kind::KillOrchestrator => {
                let old = procs(self.runtime).map(|p| p.pids).unwrap_or_default();
                let orch = self.orchestrators.last_mut().context("an orchestrator")?;
                let pid = orch.child().id();
                orch.child().kill()?;
                orch.child().wait()?;
                let log = orch.log();
                let path = self
                    .runtime
                    .with_file_name(format!("orchestrator-{pid}.log"));
                let _ = std::fs::write(path, log);
                self.note(kind, format!("the orchestrator {pid}"), true);
                // The old platform serves on until the successor starts: it
                // then stops the old processes (the IFs first, each taking
                // up to its grace) and starts the platform afresh. The loss
                // begins there.
                let gap = self.dice.ms(100, 1000);
                self.pause(gap);
                let i = self.faults.len() - 1;
                self.faults[i].down_from = Some(now_us());
                self.old_platforms.push((i, old));
                self.orchestrators
                    .push(Orchestrator::start(self.config, self.runtime)?);
            }
            Kind::Command => {
                let slo = self.dice.range(1500, 3000);
                let pct = self.dice.range(30, 60);
                let cmd = match self.dice.next() % 4 {
                    0 => json!({"cmd": "slo", "if_id": if_id, "slo_ms": slo}),
                    1 => json!({"cmd": "share", "if_id": if_id, "pct": pct}),
                    2 => json!({"cmd": "unpin", "if_id": if_id}),
                    _ => json!({"cmd": "status"}),
                };
                let reply = self.command(cmd.clone())?;
                let ok = reply["ok"] == true
                    || ["busy", "failed", "not_pinned"]
                        .contains(&reply["error"]["code"].as_str().unwrap_or(""));
                ensure!(ok, "{cmd} was answered {reply}");
                ensure!(
                    reply["ok"] == true || reply["error"]["message"].as_str().is_some(),
                    "a refusal without a message: {reply}"
                );
                self.note(kind, format!("{cmd} -> {reply:.80}"), false);
            }
            Kind::BadCommand => {
                let bad: [(&[u8], &str); 8] = [
                    (b"\xff{not json", "malformed"),
                    (br#"{"cmd": "frobnicate"}"#, "unknown_command"),
                    (
                        br#"{"cmd": "slo", "if_id": 77, "slo_ms": 100}"#,
                        "unknown_if",
                    ),
                    (
                        br#"{"cmd": "slo", "if_id": 1, "slo_ms": -5}"#,
                        "invalid_value",
                    ),
                    (
                        br#"{"cmd": "share", "if_id": 5, "pct": 250}"#,
                        "invalid_value",
                    ),
                    (
                        br#"{"cmd": "deploy", "if_id": 1, "model": "squeezenet"}"#,
                        "already_deployed",
                    ),
                    (
                        br#"{"cmd": "deploy", "if_id": 9, "model": "no_such_model"}"#,
                        "unknown_model",
                    ),
                    (br#"{"cmd": "slo", "if_id": "one"}"#, "malformed"),
                ];
                let (bytes, code) = *self.dice.pick(&bad);
                let reply = self.command_raw(bytes)?;
                ensure!(
                    reply["ok"] == false && reply["error"]["code"] == code,
                    "{} was answered {reply}, not {code}",
                    String::from_utf8_lossy(bytes)
                );
                *self.refused.entry(code.to_string()).or_default() += 1;
                self.note(
                    kind,
                    format!("{} -> {code}", String::from_utf8_lossy(bytes)),
                    false,
                );
            }
        }
        Ok(self.faults.iter().skip(before).any(|f| f.kind == kind))
    }

    fn command(&mut self, cmd: Value) -> Result<Value> {
        self.command_raw(cmd.to_string().as_bytes())
    }

    /// Sends a command to the running orchestrator: it must answer (one
    /// just started may first clean up what its predecessor left).
    fn command_raw(&mut self, bytes: &[u8]) -> Result<Value> {
        self.commands += 1;
        control_raw(&self.endpoint, bytes, Duration::from_secs(30)).with_context(|| {
            format!(
                "a command ({}) got no reply from a running orchestrator",
                String::from_utf8_lossy(bytes)
            )
        })
    }
}

/// The first request (by send time) sent at or after `from` and answered
/// OK: when it was sent and answered.
fn first_ok_after(reqs: &[Recorded], from: u64) -> Option<(u64, u64)> {
    reqs.iter()
        .filter(|r| r.sent_us >= from && r.outcome == "ok")
        .map(|r| (r.sent_us, r.answered_us.unwrap_or(r.sent_us)))
        .next()
}

#[test]
fn chaos_under_load_loses_nothing_it_should_not() -> Result<()> {
    for (_, m) in IFS {
        let p = repo_root().join("models").join(m).join("config.toml");
        ensure!(p.exists(), "{} is missing: run `make models`", p.display());
    }
    let seconds: u64 = std::env::var("KP_CHAOS_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    let seed: u64 = std::env::var("KP_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(14);
    let net = NetnsPair::up(&format!("kpx{}", std::process::id() % 100_000))?;
    let namespaces = [
        net.get("CLIENT_NS").to_string(),
        net.get("PLATFORM_NS").to_string(),
    ];
    let dir = Scratch::new("chaos");
    let prefix = file_prefix("chaos");
    let config = dir.path("platform.toml");
    write_config(&config, &net, &prefix, &IFS, PLATFORM)?;
    let runtime = dir.path("run");
    let endpoint = format!("ipc://{}", runtime.join("orchestrator.sock").display());

    let mut run = Run {
        runtime: &runtime,
        config: &config,
        endpoint: endpoint.clone(),
        orchestrators: vec![Orchestrator::start(&config, &runtime)?],
        dice: Dice(seed),
        faults: Vec::new(),
        seen: BTreeMap::new(),
        commands: 0,
        refused: BTreeMap::new(),
        old_platforms: Vec::new(),
    };
    let result = chaos(&mut run, &net, &dir, seconds);
    if let Some(o) = run.orchestrators.last() {
        let _ = std::fs::write(dir.path("orchestrator-last.log"), o.log());
    }
    let result = result.map_err(|e| {
        // The logs of every orchestrator and of every process they ran
        // (run/logs/) say what the platform was doing: kept.
        let log = run
            .orchestrators
            .last()
            .map(|o| o.log())
            .unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        let tail = lines[lines.len().saturating_sub(60)..].join("\n");
        e.context(format!(
            "logs kept in {}; the last orchestrator's (last 60 lines):\n{tail}",
            dir.0.display()
        ))
    });
    let keep = result.is_err();
    // Shut the last orchestrator down (even after a failure: what it ran
    // must not outlive the test), and wait for it.
    let _ = kpctl(&endpoint, &["shutdown"]);
    let last = run.orchestrators.pop().context("an orchestrator")?;
    let waited = last.wait(kneepoint_tests::orchestrator::SHUTDOWN_WAIT);
    drop(run.orchestrators.drain(..));
    if keep {
        // Not removed: its logs are the failure's evidence.
        std::mem::forget(dir);
        return result.map(drop);
    }
    let summary = result?;
    let out = waited?;
    ensure!(
        out.status.success(),
        "the orchestrator's shutdown failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Nothing leaked.
    let alive: Vec<u32> = run
        .seen
        .keys()
        .copied()
        .filter(|p| process_alive(*p))
        .collect();
    ensure!(
        alive.is_empty(),
        "processes of the platform still run after its shutdown: {:?}",
        alive.iter().map(|p| (p, cmdline(*p))).collect::<Vec<_>>()
    );
    let left = dpdk_files_left(&prefix);
    ensure!(left.is_empty(), "DPDK files left behind: {left:?}");
    let sockets: Vec<String> = std::fs::read_dir(&runtime)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.ends_with(".sock"))
                .collect()
        })
        .unwrap_or_default();
    ensure!(
        sockets.is_empty(),
        "sockets left in {}: {sockets:?}",
        runtime.display()
    );
    drop(net);
    let listed =
        String::from_utf8_lossy(&Command::new("ip").args(["netns", "list"]).output()?.stdout)
            .into_owned();
    for ns in &namespaces {
        ensure!(
            !listed
                .lines()
                .any(|l| l.split_whitespace().next() == Some(ns)),
            "network namespace {ns} left behind"
        );
    }

    // Memory flat.
    let mut rss = Vec::new();
    for (pid, (_, samples)) in &run.seen {
        let life = samples.last().map_or(0.0, |s| s.0);
        if life < RSS_MIN_LIFE.as_secs_f64() {
            continue;
        }
        let median = |v: &mut Vec<u64>| {
            v.sort_unstable();
            v[v.len() / 2]
        };
        let mut warm: Vec<u64> = samples
            .iter()
            .filter(|s| (10.0..15.0).contains(&s.0))
            .map(|s| s.1)
            .collect();
        let mut end: Vec<u64> = samples.iter().rev().take(5).map(|s| s.1).collect();
        if warm.is_empty() || end.is_empty() {
            continue;
        }
        let (w, e) = (median(&mut warm), median(&mut end));
        rss.push(json!({"pid": pid, "life_s": life.round(), "warm_kib": w, "end_kib": e}));
        ensure!(
            e as f64 <= w as f64 * (1.0 + RSS_GROWTH) + RSS_SLACK_KIB as f64,
            "process {pid} grew from {w} KiB to {e} KiB over {life:.0} s"
        );
    }
    let mut summary = summary;
    summary["rss"] = json!(rss);
    println!("chaos summary: {}", serde_json::to_string_pretty(&summary)?);
    if let Ok(path) = std::env::var("KP_CHAOS_OUT") {
        std::fs::write(&path, serde_json::to_string_pretty(&summary)?)?;
    }
    Ok(())
}

/// The load, the schedule and the checks on the answers; returns the
/// summary.
fn chaos(run: &mut Run<'_>, net: &NetnsPair, dir: &Scratch, seconds: u64) -> Result<Value> {
    let shadows_ready = |log: &str| {
        log.lines()
            .filter(|l| l.contains("(shadow,") && l.contains("said it is ready (standby"))
            .count()
            >= IFS.len()
    };
    let o = run.orchestrators.last().context("an orchestrator")?;
    o.wait_log("both shadows ready", shadows_ready)?;
    let mut clients = Vec::new();
    for (if_id, _) in IFS {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", net.get("CLIENT_NS")])
            .arg(bin("kp-client"))
            .arg("--dst")
            .arg(format!("{}:9000", net.get("PLATFORM_IP")))
            .args(["--if-id", &if_id.to_string(), "--timeout", CLIENT_TIMEOUT])
            .args(["--rate", RATE, "--seed", &if_id.to_string()])
            .args(["--input", "synthetic", "--duration", "7200s", "--json"])
            .args(["--linger", "2s"])
            .arg("--record")
            .arg(dir.path(&format!("if{if_id}.csv")));
        clients.push((if_id, BackgroundClient::spawn(cmd)?));
    }
    let start = Instant::now();
    run.pause(Duration::from_secs(3));
    // Every kind once, in a seeded order, then seeded picks.
    let mut deck: Vec<Kind> = KINDS.to_vec();
    for i in (1..deck.len()).rev() {
        let j = run.dice.range(0, i as u64 + 1) as usize;
        deck.swap(i, j);
    }
    let mut n = 0;
    let mut retries = 0;
    while start.elapsed() < Duration::from_secs(seconds) {
        let kind = if n < deck.len() {
            deck[n]
        } else {
            *run.dice.pick(&KINDS)
        };
        n += 1;
        if !run.orchestrator_alive() {
            bail!(
                "the orchestrator died by itself:\n{}",
                run.orchestrators
                    .last()
                    .map(|o| o.log())
                    .unwrap_or_default()
            );
        }
        if !run.act(kind)? && n <= deck.len() && retries < 3 * KINDS.len() {
            // Not possible now (nothing of the kind to kill, a change
            // refused while another is under way): later.
            deck.push(kind);
            retries += 1;
        }
        let gap = run.dice.ms(1000, 4000);
        run.pause(gap);
    }
    // Service back: both IFs active with their shadows, then five more
    // seconds of load.
    let settle = Instant::now();
    loop {
        run.observe();
        let s = run.status();
        let shadows = IFS.iter().all(|(id, _)| run.kp_ifs(*id, None).len() >= 2);
        if s.as_ref().is_some_and(|s| all_active(s, IFS.len()))
            && shadows
            && run.old_platforms.is_empty()
        {
            break;
        }
        ensure!(
            settle.elapsed() < HUNG,
            "the platform did not come back within {HUNG:?} of the last fault: {s:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let settled_us = now_us();
    run.pause(Duration::from_secs(5));
    let mut reports = BTreeMap::new();
    for (if_id, c) in clients {
        reports.insert(if_id, c.stop()?);
    }
    check(run, dir, &reports, settled_us)
}

/// The checks on what the clients saw; the summary.
fn check(
    run: &Run<'_>,
    dir: &Scratch,
    reports: &BTreeMap<u16, Value>,
    settled_us: u64,
) -> Result<Value> {
    let downs: Vec<&Fault> = run
        .faults
        .iter()
        .filter(|f| f.down_from.is_some())
        .collect();
    let kills: Vec<&Fault> = run
        .faults
        .iter()
        .filter(|f| !matches!(f.kind, Kind::Command | Kind::BadCommand))
        .collect();
    let mut violations = Vec::new();
    let mut per_if = BTreeMap::new();
    let mut restored: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    let mut lost_per_fault: BTreeMap<usize, u64> = BTreeMap::new();
    for (if_id, report) in reports {
        for field in ["duplicates", "late", "unexpected", "malformed"] {
            if report[field] != 0 {
                violations.push(format!(
                    "if {if_id}: {field} = {} ({report})",
                    report[field]
                ));
            }
        }
        let mut reqs = read_record(&dir.path(&format!("if{if_id}.csv")))?;
        reqs.sort_by_key(|r| r.sent_us);
        ensure!(
            reqs.len() as u64 == report["sent"].as_u64().unwrap_or(0),
            "if {if_id}: {} records for {} requests sent",
            reqs.len(),
            report["sent"]
        );
        // The window of each fault: from IN_PLATFORM before its loss began
        // to the first OK answer to a request sent after that (service
        // seen back: until then, a restarted if-manager may drop what the
        // kernel queued for it before it polled).
        // After an orchestrator kill, only an answer from the new platform
        // says the service is back: the old one may answer what it held
        // while the successor stops it.
        let window = |f: &Fault| -> (u64, u64) {
            let from = f.down_from.unwrap_or(f.at);
            let back_from = from.max(f.old_gone.unwrap_or(0));
            let end = first_ok_after(&reqs, back_from).map_or(u64::MAX, |(_, answered)| answered);
            (from.saturating_sub(IN_PLATFORM), end)
        };
        let mut excused = 0u64;
        let mut by_outcome: BTreeMap<String, u64> = BTreeMap::new();
        for r in &reqs {
            *by_outcome.entry(r.outcome.clone()).or_default() += 1;
            match r.outcome.as_str() {
                "ok" => {}
                "unanswered" | "unreachable" => {
                    let hit = downs.iter().position(|f| {
                        let (a, b) = window(f);
                        (a..=b).contains(&r.sent_us)
                    });
                    match hit {
                        Some(i) => {
                            excused += 1;
                            let idx = run
                                .faults
                                .iter()
                                .position(|g| std::ptr::eq(g, downs[i]))
                                .unwrap_or(0);
                            *lost_per_fault.entry(idx).or_default() += 1;
                        }
                        None => violations.push(format!(
                            "if {if_id}: a request sent at {} went unanswered, near no fault that \
                             takes the data path down",
                            r.sent_us
                        )),
                    }
                }
                "bad_request" => {
                    violations.push(format!("if {if_id}: BAD_REQUEST at {}", r.sent_us))
                }
                other => {
                    let near = kills.iter().any(|f| {
                        let (a, b) = window(f);
                        (a..=b.max(f.at + IN_PLATFORM)).contains(&r.sent_us)
                    });
                    if !near {
                        violations.push(format!(
                            "if {if_id}: {other} for a request sent at {}, near no fault",
                            r.sent_us
                        ));
                    }
                }
            }
        }
        // Restoration after each data-path fault not overlapped by the next.
        for (k, f) in downs.iter().enumerate() {
            let from = f.down_from.expect("down").max(f.old_gone.unwrap_or(0));
            let Some((_, answered)) = first_ok_after(&reqs, from) else {
                violations.push(format!("if {if_id}: never served again after {:?}", f.what));
                continue;
            };
            if downs.get(k + 1).is_some_and(|g| g.at < answered) {
                continue;
            }
            let took = answered.saturating_sub(f.at);
            let (name, bound) = match f.kind {
                Kind::KillIfManager => ("if-manager", IF_MANAGER_RESTORED),
                _ => ("orchestrator", ORCHESTRATOR_RESTORED),
            };
            restored.entry(name).or_default().push(took as f64 / 1e6);
            if took > bound {
                violations.push(format!(
                    "if {if_id}: served again {:.1} s after {}, more than {} s",
                    took as f64 / 1e6,
                    f.what,
                    bound / 1_000_000
                ));
            }
        }
        let after: u64 = reqs
            .iter()
            .filter(|r| r.sent_us >= settled_us && r.outcome != "ok")
            .count() as u64;
        if after > 0 {
            violations.push(format!(
                "if {if_id}: {after} requests not OK after the platform settled"
            ));
        }
        per_if.insert(
            if_id.to_string(),
            json!({"sent": reqs.len(), "outcomes": by_outcome, "lost_in_faults": excused}),
        );
    }
    let mut kinds: BTreeMap<String, u64> = BTreeMap::new();
    for f in &run.faults {
        *kinds.entry(format!("{:?}", f.kind)).or_default() += 1;
    }
    let restored: BTreeMap<&str, Value> = restored
        .into_iter()
        .map(|(k, mut v)| {
            v.sort_by(f64::total_cmp);
            let med = v[v.len() / 2];
            let max = v[v.len() - 1];
            (k, json!({"n": v.len(), "median_s": med, "max_s": max}))
        })
        .collect();
    let losses: Vec<Value> = lost_per_fault
        .iter()
        .map(|(i, n)| json!({"fault": run.faults[*i].what, "unanswered": n}))
        .collect();
    let summary = json!({
        "faults": kinds,
        "commands": run.commands,
        "refused": run.refused,
        "ifs": per_if,
        "restored": restored,
        "losses": losses,
        "processes_seen": run.seen.len(),
    });
    ensure!(
        violations.is_empty(),
        "{} violations:\n{}\nsummary: {summary:#}\nfaults:\n{}",
        violations.len(),
        violations.join("\n"),
        run.faults
            .iter()
            .map(|f| format!(
                "{} {:?} {} (down from {:?})",
                f.at, f.kind, f.what, f.down_from
            ))
            .collect::<Vec<_>>()
            .join("\n")
    );
    for kind in KINDS {
        ensure!(
            run.faults.iter().any(|f| f.kind == kind),
            "the schedule never did {kind:?}: {kinds:?}"
        );
    }
    Ok(summary)
}
