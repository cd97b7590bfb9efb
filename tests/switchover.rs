//! Shadow standby and switchover, live: an inference function hands its
//! ring to a freshly started shadow several times while kp-client keeps
//! requests flowing over a veth pair, and every request sent is answered
//! exactly once — none lost, none duplicated — with each gap measured.
//! Then the active IF is killed with SIGKILL under load: its shadow takes
//! over, answers INTERNAL what the dead one held, and service goes on; and
//! so when an active is killed after it yielded, while it drains.
//! And a kp-if told to stop while it starts exits by itself, holding none
//! of DPDK's shared locks.
//!
//! Nothing here depends on the machine's speed: the client runs until the
//! scenario is over (it is stopped, not timed), each step waits for the
//! condition it needs (traffic flowing, a mode reached), and the deadlines
//! only fail a test that hangs.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use kneepoint_tests::platform::{af_packet_vdev, eal, primary_eal};
use kneepoint_tests::{
    answers, bin, control, datagrams_lost, datagrams_received, datagrams_sent, dpdk_files_left,
    expect_statuses, file_prefix, repo_root, BackgroundClient, Daemon, NetnsPair, Scratch,
};
use serde_json::{json, Value};

/// The bound on a switchover's gap, ms: kp-if's default reassembly
/// timeout (see the check at the end of the first test).
const GAP_BOUND_MS: u64 = 100;

/// The IFs' reassembly timeout, ms: ten times the default, so that only a
/// fragment that never comes makes a request INCOMPLETE, not a client or
/// an IF that a starved 2-core machine did not run for 100 ms mid-request
/// (seen under a concurrent build; the status checks allow no INCOMPLETE
/// that a lost datagram does not explain).
const REASSEMBLY_TIMEOUT_MS: u64 = 1000;

/// Requests kp-client keeps outstanding.
const CONCURRENCY: u64 = 4;

/// ... where an IF that yielded must still hold some when it is killed:
/// a backlog of about 16 squeezenet images, ~100 ms of engine time on the
/// machines we run on, against the few milliseconds from its reply to the
/// kill.
const DRAIN_CONCURRENCY: u64 = 16;

/// SIGKILLs `kp_if` and waits until it is gone (reaped or a zombie), as
/// the orchestrator's reaping would.
fn kill9(kp_if: Daemon) -> Result<()> {
    let pid = kp_if.pid();
    Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()?;
    let deadline = Instant::now() + HUNG;
    while kp_os::affinity::process_alive(pid) {
        ensure!(Instant::now() < deadline, "the killed IF is still alive");
        std::thread::sleep(Duration::from_millis(5));
    }
    drop(kp_if);
    Ok(())
}

/// How long a step may wait for its condition before the test is called
/// hung: far beyond what a slow, loaded machine needs (seconds at most).
const HUNG: Duration = Duration::from_secs(60);

struct Platform {
    net: NetnsPair,
    dir: Scratch,
    prefix: String,
    ifm_control: String,
    ifm: Option<Daemon>,
    next_lcore: u32,
}

impl Platform {
    fn up(name: &str) -> Result<Platform> {
        let model = repo_root().join("models/squeezenet/config.toml");
        ensure!(
            model.exists(),
            "{} is missing: run `make models` first",
            model.display()
        );
        let net = NetnsPair::up(&format!("kps{}", std::process::id() % 100_000))?;
        let dir = Scratch::new(name);
        let prefix = file_prefix(name);
        let ifm_control = format!("ipc://{}", dir.path("ifm.sock").display());
        // A ring of 4,096 frames (DPDK's default is 512): the kill test's
        // 16 images sent back to back are 2,352 datagrams, and a request
        // none of whose datagrams arrived cannot be answered by anyone.
        let vdev = format!("{},framecnt=4096", af_packet_vdev(net.get("PLATFORM_IF")));
        let ifm = Daemon::start(
            &["ip", "netns", "exec", net.get("PLATFORM_NS")],
            &["--control", &ifm_control, "--ip", net.get("PLATFORM_IP")].map(String::from),
            &primary_eal(&prefix, &vdev),
        )?;
        Ok(Platform {
            net,
            dir,
            prefix,
            ifm_control,
            ifm: Some(ifm),
            next_lcore: 1,
        })
    }

    /// Starts a squeezenet IF (a shadow with `standby`); returns it and its
    /// control endpoint.
    fn start_if(&mut self, standby: bool) -> Result<(Daemon, String)> {
        self.start_if_with(standby, &[])
    }

    /// The same with more options.
    fn start_if_with(&mut self, standby: bool, more: &[&str]) -> Result<(Daemon, String)> {
        let (mut options, eal, listen) = self.if_args(standby);
        options.extend(more.iter().map(|o| o.to_string()));
        let d = Daemon::start_bin(
            &["ip", "netns", "exec", self.net.get("PLATFORM_NS")],
            "kp-if",
            &options,
            &eal,
            if standby {
                "kp-if: standby"
            } else {
                "kp-if: ready"
            },
        )?;
        Ok((d, listen))
    }

    /// `ip netns exec NS kp-if ...` for a squeezenet IF, not started.
    fn if_command(&mut self, standby: bool) -> Command {
        let (options, eal, _) = self.if_args(standby);
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", self.net.get("PLATFORM_NS")])
            .arg(bin("kp-if"))
            .args(options)
            .arg("--")
            .args(eal);
        cmd
    }

    /// A squeezenet IF's options, its EAL arguments (an lcore of its own)
    /// and its control endpoint.
    fn if_args(&mut self, standby: bool) -> (Vec<String>, Vec<String>, String) {
        let lcore = self.next_lcore;
        self.next_lcore += 1;
        let listen = format!(
            "ipc://{}",
            self.dir.path(&format!("if-{lcore}.sock")).display()
        );
        let mut options: Vec<String> = vec![
            "--model".into(),
            repo_root()
                .join("models/squeezenet/config.toml")
                .display()
                .to_string(),
            "--control".into(),
            self.ifm_control.clone(),
            "--listen".into(),
            listen.clone(),
            "--slo-ms".into(),
            "2000".into(),
            "--reassembly-timeout-ms".into(),
            REASSEMBLY_TIMEOUT_MS.to_string(),
        ];
        if standby {
            options.push("--standby".into());
        }
        let eal = eal(
            &self.prefix,
            &format!("{lcore}@(0-1)"),
            &["--proc-type", "secondary"],
        );
        (options, eal, listen)
    }

    /// kp-client, closed loop with [`CONCURRENCY`] outstanding, in the
    /// background until stopped: as long as the scenario takes on this
    /// machine.
    fn client(&self, frag_gap: &str) -> Result<BackgroundClient> {
        self.client_with(CONCURRENCY, frag_gap)
    }

    /// The same with `concurrency` requests outstanding.
    fn client_with(&self, concurrency: u64, frag_gap: &str) -> Result<BackgroundClient> {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", self.net.get("CLIENT_NS")])
            .arg(bin("kp-client"))
            .arg("--dst")
            .arg(format!("{}:9000", self.net.get("PLATFORM_IP")))
            .args(["--if-id", "1", "--timeout", "5s"])
            .args(["--concurrency", &concurrency.to_string()])
            .args(["--input", "synthetic", "--duration", "600s", "--json"])
            .args(["--frag-gap", frag_gap]);
        BackgroundClient::spawn(cmd)
    }

    /// Answers the IFs have sent so far (the if-manager's count).
    fn answers(&self) -> Result<u64> {
        let s = ask(&self.ifm_control, "stats")?;
        s["stats"]["tx"]["from_ifs"]
            .as_u64()
            .with_context(|| format!("no tx.from_ifs in {s}"))
    }

    /// Waits until the IFs have sent more than `n` answers beyond those
    /// sent so far: traffic flows through the IF serving now.
    fn wait_answers(&self, n: u64) -> Result<()> {
        let from = self.answers()?;
        let deadline = Instant::now() + HUNG;
        loop {
            let now = self.answers()?;
            if now > from + n {
                return Ok(());
            }
            ensure!(
                Instant::now() < deadline,
                "no traffic: {} answers in {HUNG:?}",
                now - from
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// [`Self::finish`], and how many of the datagrams the client `c`
    /// sent never reached the if-manager (dropped by the kernel).
    fn finish_counting_lost(self, c: &Value) -> Result<u64> {
        let ifm = self.finish()?;
        datagrams_lost(datagrams_sent(c)?, datagrams_received(&ifm)?)
    }

    fn finish(mut self) -> Result<Value> {
        let report = self.ifm.take().expect("running").stop()?;
        let left = dpdk_files_left(&self.prefix);
        ensure!(left.is_empty(), "DPDK files left behind: {left:?}");
        Ok(report)
    }
}

fn ask(endpoint: &str, cmd: &str) -> Result<Value> {
    let reply = control(endpoint, &json!({ "cmd": cmd }), HUNG)?;
    ensure!(reply["ok"] == true, "{cmd} at {endpoint}: {reply}");
    Ok(reply)
}

fn wait_mode(endpoint: &str, mode: &str) -> Result<Value> {
    let deadline = Instant::now() + HUNG;
    loop {
        let s = ask(endpoint, "status")?;
        if s["mode"] == mode {
            return Ok(s);
        }
        ensure!(
            Instant::now() < deadline,
            "{endpoint} never became {mode}: {s}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn switchovers_under_load_lose_and_duplicate_nothing() -> Result<()> {
    let mut p = Platform::up("switchover")?;
    let (mut active, mut active_ep) = p.start_if(false)?;
    // Fragments paced out, so that requests are half assembled when a
    // switchover comes and their rest must be handed back.
    let client = p.client("40us")?;
    let mut gaps_us = Vec::new();
    let mut handed_back = 0;
    let mut forward_lost = 0;
    for _ in 0..3 {
        let (shadow, shadow_ep) = p.start_if(true)?;
        ensure!(ask(&shadow_ep, "status")?["mode"] == "standby");
        // Requests flowing through the active at the switchover (more
        // answers than the client keeps outstanding, so not only the
        // previous switchover's leftovers).
        p.wait_answers(4)?;
        ask(&shadow_ep, "activate")?;
        let yielded = ask(&active_ep, "yield")?;
        ensure!(yielded["mode"] == "draining", "yield: {yielded}");
        let s = wait_mode(&shadow_ep, "active")?;
        gaps_us.push(s["last_gap_ns"].as_u64().context("gap")? as f64 / 1000.0);
        let old = active.wait_report(HUNG)?;
        eprintln!("yielded: {}", old["succession"]);
        handed_back += old["succession"]["forwarded"].as_u64().unwrap_or(0);
        forward_lost += old["succession"]["forward_lost"].as_u64().unwrap_or(0);
        ensure!(
            old["succession"]["yielded"] == true,
            "old active: {}",
            old["succession"]
        );
        active = shadow;
        active_ep = shadow_ep;
    }
    // Traffic through the last active too, then the client stops.
    p.wait_answers(4)?;
    let c = client.stop()?;
    let last = active.stop()?;
    handed_back += last["succession"]["forwarded"].as_u64().unwrap_or(0);
    forward_lost += last["succession"]["forward_lost"].as_u64().unwrap_or(0);
    let ifm = p.finish()?;
    let lost = datagrams_lost(datagrams_sent(&c)?, datagrams_received(&ifm)?)?;
    eprintln!("if-manager outcomes: {}", ifm["outcomes"]);
    eprintln!("switchover gaps (µs): {gaps_us:?}; datagrams lost: {lost}; client: {c}");

    ensure!(
        c["sent"].as_u64().unwrap_or(0) > 50,
        "too little traffic: {c}"
    );
    ensure!(c["answered"] == c["sent"], "lost answers: {c}");
    ensure!(c["unanswered"] == 0 && c["duplicates"] == 0, "client: {c}");
    // A switchover costs no request anything: what was being assembled
    // was handed back and finished (no forwarded fragment lost), so every
    // request is OK but one that lost a datagram in the kernel before the
    // if-manager (INCOMPLETE: at most one request per lost datagram). No
    // INTERNAL (nothing died), no OVERLOADED (4 outstanding, a 2 s SLO).
    ensure!(
        forward_lost == 0,
        "{forward_lost} fragments could not be handed back"
    );
    expect_statuses(&c, &[("incomplete", lost, "a datagram the kernel dropped")])?;
    ensure!(
        last["succession"]["taken"] == "handed",
        "{}",
        last["succession"]
    );
    ensure!(
        handed_back > 0,
        "no fragment was handed back: the test did not exercise the hand-back ring"
    );
    // A gap is a time nobody dequeues the ring. It must stay below kp-if's
    // default reassembly timeout: fragments that wait longer than that make
    // their requests time out INCOMPLETE though nothing was lost, so a
    // switchover would not be seamless. A correct hand-over takes tens of
    // µs (a futex wake-up and a ring poll), thousands of times less: a 3x
    // slower machine whose loaded scheduler delays the wake-up by a few
    // ticks passes; a hand-over that waits out a timer, a poll interval or
    // the successor's grace period (reassembly timeout + 100 ms) fails.
    let bound_us = (GAP_BOUND_MS * 1000) as f64;
    ensure!(
        gaps_us.iter().all(|g| *g < bound_us),
        "gaps {gaps_us:?} µs, not all below kp-if's default reassembly timeout ({bound_us} µs)"
    );
    ensure!(ifm["mempool"]["in_use_at_exit"] == 0, "if-manager: {ifm}");
    Ok(())
}

#[test]
fn a_killed_active_is_replaced_by_its_shadow_and_nothing_is_silently_lost() -> Result<()> {
    let mut p = Platform::up("failover")?;
    let (active, _) = p.start_if(false)?;
    let (shadow, shadow_ep) = p.start_if(true)?;
    let client = p.client("0")?;
    // The active serves (and holds requests) when it is killed.
    p.wait_answers(4)?;
    kill9(active)?;
    ask(&shadow_ep, "activate")?;
    wait_mode(&shadow_ep, "active")?;
    // The successor serves: more answers than the dead one can have held
    // (the client keeps 4 outstanding), so some are its own.
    p.wait_answers(4)?;
    let c = client.stop()?;
    let last = shadow.stop()?;
    let lost = p.finish_counting_lost(&c)?;
    eprintln!(
        "client: {c}; successor: {}; datagrams lost: {lost}",
        last["succession"]
    );
    ensure!(
        last["succession"]["taken"] == "from_dead",
        "{}",
        last["succession"]
    );
    ensure!(c["duplicates"] == 0, "client: {c}");
    ensure!(
        c["unanswered"] == 0 && c["answered"] == c["sent"],
        "client: {c}"
    );
    // What the dead IF held was answered INTERNAL from its ledger, by the
    // successor, and nothing else was: the client's INTERNAL answers are
    // the successor's recovered ones. It held at least one (the client
    // keeps 4 outstanding and one squeezenet batch takes milliseconds,
    // sending a request far less: at any moment some wait in the IF) and
    // at most the 4 outstanding.
    let recovered = last["succession"]["recovered_internal"]
        .as_u64()
        .with_context(|| format!("successor: {last}"))?;
    ensure!(
        answers(&c, "internal") == recovered && (1..=CONCURRENCY).contains(&recovered),
        "{recovered} requests recovered from the dead IF's ledger, want 1 to \
         {CONCURRENCY} and as many INTERNAL answers: {c}"
    );
    // The rest the shadow served OK, but for two costs of the kill: a
    // request whose first fragments the dead IF had taken off the ring
    // but not yet entered in its ledger cannot complete (INCOMPLETE; such
    // a request was outstanding, so these and the INTERNAL ones are at
    // most the 4 outstanding), and a datagram the kernel dropped before
    // the if-manager makes one INCOMPLETE.
    let ok_after = last["telemetry"]["answers"]["ok"].as_u64().unwrap_or(0);
    ensure!(ok_after > 0, "the shadow served nothing: {last}");
    expect_statuses(
        &c,
        &[
            ("internal", recovered, "what the dead IF held"),
            (
                "incomplete",
                CONCURRENCY - recovered + lost,
                "taken off the ring by the dead IF, or a datagram the kernel dropped",
            ),
        ],
    )?;
    Ok(())
}

/// An active killed after it yielded, while it drains what it held: its
/// successor owns the ring and took it from a live process, so nobody
/// would look at the dead one's ledger on taking the ring; the successor
/// watches its predecessor until it says it drained, finds it dead, and
/// answers INTERNAL what its ledger holds. Without that watch the requests
/// it held are never answered (the client's `unanswered`).
#[test]
fn an_active_killed_while_it_drains_after_yielding_loses_nothing() -> Result<()> {
    let mut p = Platform::up("drain-kill")?;
    let (active, active_ep) = p.start_if(false)?;
    let (shadow, shadow_ep) = p.start_if(true)?;
    let client = p.client_with(DRAIN_CONCURRENCY, "0")?;
    // A backlog in the active: the client's window is full.
    p.wait_answers(DRAIN_CONCURRENCY)?;
    ask(&shadow_ep, "activate")?;
    let yielded = ask(&active_ep, "yield")?;
    ensure!(yielded["mode"] == "draining", "yield: {yielded}");
    kill9(active)?;
    wait_mode(&shadow_ep, "active")?;
    // The successor serves beyond what the dead one can have held.
    p.wait_answers(DRAIN_CONCURRENCY)?;
    let c = client.stop()?;
    let last = shadow.stop()?;
    let lost = p.finish_counting_lost(&c)?;
    eprintln!(
        "client: {c}; successor: {}; datagrams lost: {lost}",
        last["succession"]
    );
    let succession = &last["succession"];
    ensure!(succession["taken"] == "handed", "{succession}");
    ensure!(
        succession["predecessor_died"] == true,
        "the successor never saw its predecessor die: {succession}"
    );
    ensure!(c["duplicates"] == 0, "client: {c}");
    ensure!(
        c["unanswered"] == 0 && c["answered"] == c["sent"],
        "requests the killed IF held were lost: {c}"
    );
    // It held at least one (16 outstanding, ~100 ms of backlog, killed
    // milliseconds after its reply), at most the 16; the successor's
    // INTERNAL answers are those, and nothing else fails but what a
    // datagram the kernel dropped makes INCOMPLETE.
    let recovered = succession["recovered_internal"]
        .as_u64()
        .with_context(|| format!("successor: {last}"))?;
    ensure!(
        (1..=DRAIN_CONCURRENCY).contains(&recovered) && answers(&c, "internal") == recovered,
        "{recovered} requests recovered from the killed IF's ledger, want 1 to \
         {DRAIN_CONCURRENCY} (or the kill did not land in its drain) and as many \
         INTERNAL answers: {c}"
    );
    expect_statuses(
        &c,
        &[
            ("internal", recovered, "what the killed IF held"),
            ("incomplete", lost, "a datagram the kernel dropped"),
        ],
    )?;
    Ok(())
}

/// The new active killed right after a switchover, while the old one
/// still assembles the requests it had in flight: whoever takes the ring
/// from the dead one learns of the handover it had received, forwards the
/// rest of those requests to the old active, which answers them, and
/// takes none of them for a new request (which it would answer too,
/// INCOMPLETE, as the old active would at its time-out: twice).
#[test]
fn a_new_active_killed_in_its_predecessors_window_answers_nothing_twice() -> Result<()> {
    let mut p = Platform::up("successor-kill")?;
    let (old, old_ep) = p.start_if(false)?;
    let (new, new_ep) = p.start_if(true)?;
    let (third, third_ep) = p.start_if(true)?;
    // Fragments far apart (a request takes ~30 ms to arrive), so that the
    // old active is assembling one at the switchover and its rest arrives
    // after the new one is killed.
    let client = p.client("200us")?;
    p.wait_answers(4)?;
    ask(&new_ep, "activate")?;
    let yielded = ask(&old_ep, "yield")?;
    ensure!(yielded["mode"] == "draining", "yield: {yielded}");
    wait_mode(&new_ep, "active")?;
    kill9(new)?;
    ask(&third_ep, "activate")?;
    wait_mode(&third_ep, "active")?;
    // The old active drains and exits by itself, after its window: by then
    // every answer to the requests it had in flight is out (a request
    // taken for new by the third would be answered at its time-out, a
    // second after the kill, inside that window), and then some more.
    let old = old.wait_report(HUNG)?;
    p.wait_answers(4)?;
    let c = client.stop()?;
    let last = third.stop()?;
    let lost = p.finish_counting_lost(&c)?;
    let succession = &last["succession"];
    eprintln!(
        "client: {c}; old active: {}; third: {succession}; datagrams lost: {lost}",
        old["succession"]
    );
    ensure!(succession["taken"] == "from_dead", "{succession}");
    ensure!(
        succession["inherited_in_flight"].as_u64() >= Some(1)
            && succession["forwarded"].as_u64() >= Some(1),
        "the old active had nothing in flight, or nothing of it came after \
         the kill: the test did not exercise the inherited handover ({succession})"
    );
    ensure!(
        old["succession"]["yielded"] == true,
        "{}",
        old["succession"]
    );
    ensure!(c["duplicates"] == 0, "a request answered twice: {c}");
    ensure!(
        c["unanswered"] == 0 && c["answered"] == c["sent"],
        "client: {c}"
    );
    // What the killed one held, INTERNAL (from its ledger); a request of
    // which it took fragments off the ring and died before looking at
    // them, INCOMPLETE (at most the 4 outstanding), as a datagram the
    // kernel dropped.
    let recovered = succession["recovered_internal"].as_u64().unwrap_or(0);
    expect_statuses(
        &c,
        &[
            ("internal", recovered, "what the killed IF held"),
            (
                "incomplete",
                CONCURRENCY + lost,
                "taken off the ring by the killed IF, or a datagram the kernel dropped",
            ),
        ],
    )?;
    Ok(())
}

/// An active killed while it refuses requests (no free slot: OVERLOADED at
/// their first fragment, before the rest of them arrived): whoever takes
/// the ring from it must not take the rest of a refused request for a new
/// one, which it would answer again. The dead one's ledger lists the
/// requests it answered early (refused, timed out) with their keys.
#[test]
fn an_active_killed_while_it_refuses_requests_answers_none_twice() -> Result<()> {
    let mut p = Platform::up("refusing-kill")?;
    // Two slots for 16 outstanding: most requests are refused at once.
    let small = ["--capacity", "2"];
    let (active, _) = p.start_if_with(false, &small)?;
    let (shadow, shadow_ep) = p.start_if_with(true, &small)?;
    let client = p.client_with(DRAIN_CONCURRENCY, "0")?;
    p.wait_answers(DRAIN_CONCURRENCY)?;
    kill9(active)?;
    ask(&shadow_ep, "activate")?;
    wait_mode(&shadow_ep, "active")?;
    // Long enough for the successor's time-out of a request it took for
    // new to have passed: its answer would be out by then.
    let since = Instant::now();
    while since.elapsed() < Duration::from_millis(2 * REASSEMBLY_TIMEOUT_MS) {
        p.wait_answers(DRAIN_CONCURRENCY)?;
    }
    let c = client.stop()?;
    let last = shadow.stop()?;
    p.finish()?;
    let succession = &last["succession"];
    eprintln!("client: {c}; successor: {succession}");
    ensure!(succession["taken"] == "from_dead", "{succession}");
    ensure!(
        answers(&c, "overloaded") > DRAIN_CONCURRENCY
            && succession["early_answers"].as_u64() > Some(0),
        "too few refusals, or none in the dead one's ledger: the test did \
         not exercise them ({c}; {succession})"
    );
    ensure!(c["duplicates"] == 0, "a request answered twice: {c}");
    ensure!(
        c["unanswered"] == 0 && c["answered"] == c["sent"],
        "client: {c}"
    );
    Ok(())
}

/// A kp-if told to stop (SIGTERM) while it starts, in the EAL, loading its
/// engine or parked, finishes the step it is in and exits by itself with
/// status 0. Killed by the signal inside a DPDK call, it would leave a lock
/// of the shared memory held for every process of the platform (the memory
/// hotplug lock while the EAL maps the primary's memory, the memzone lock,
/// the heap lock): the next process to free a memzone then spins forever,
/// as every kp-if and the if-manager did at the orchestrator's shutdown
/// when the shadow it had just started died that way. After a dozen such
/// stops, spread from the first millisecond to after the shadow parked,
/// the serving IF and the if-manager still stop in time, each with its
/// report, and leave no DPDK file behind.
#[test]
fn a_kp_if_stopped_while_it_starts_exits_by_itself_and_holds_no_lock() -> Result<()> {
    let mut p = Platform::up("stop-at-start")?;
    let (active, _) = p.start_if(false)?;
    for delay_ms in [0u64, 2, 5, 10, 20, 40, 70, 100, 150, 250, 400, 800] {
        let mut cmd = p.if_command(true);
        cmd.stdout(Stdio::null())
            .stderr(Stdio::piped())
            .stdin(Stdio::null());
        let mut child = cmd.spawn().context("spawning kp-if")?;
        // From the moment its EAL opened its multi-process socket: a kp-if
        // is inside DPDK from there on (a signal before would find no DPDK
        // state to leave behind).
        let socket = format!("mp_socket_{}_", child.id());
        let runtime = std::path::Path::new("/var/run/dpdk").join(&p.prefix);
        let deadline = Instant::now() + HUNG;
        while !std::fs::read_dir(&runtime).is_ok_and(|d| {
            d.flatten()
                .any(|e| e.file_name().to_string_lossy().starts_with(&socket))
        }) {
            ensure!(
                Instant::now() < deadline && child.try_wait()?.is_none(),
                "a kp-if never started its EAL"
            );
            std::thread::sleep(Duration::from_micros(200));
        }
        std::thread::sleep(Duration::from_millis(delay_ms));
        Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()?;
        let deadline = Instant::now() + HUNG;
        let status = loop {
            if let Some(s) = child.try_wait()? {
                break s;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                anyhow::bail!("a kp-if stopped {delay_ms} ms into its start did not exit");
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let mut stderr = String::new();
        child
            .stderr
            .take()
            .expect("piped")
            .read_to_string(&mut stderr)?;
        ensure!(
            status.success(),
            "a kp-if stopped {delay_ms} ms into its start exited with {status}; stderr:\n{stderr}"
        );
    }
    // Every lock free: the active frees its memzones and the if-manager
    // its own, each within `Daemon::stop`'s 20 s, with their reports.
    let report = active.stop()?;
    ensure!(report["if_id"] == 1, "kp-if's report: {report}");
    let ifm = p.finish()?;
    ensure!(ifm["mempool"].is_object(), "if-manager's report: {ifm}");
    Ok(())
}
