//! The whole platform under the orchestrator, live over a veth pair: two
//! inference functions under load from kp-client; an SLO change and a
//! share pin through `kpctl` each re-provision an IF through its shadow, then
//! both IFs are re-provisioned at once (one kp-if starts at a time); the
//! active of one IF is killed with SIGKILL and its shadow takes over. Every
//! request sent gets exactly one answer — none lost, none duplicated —, OK
//! but for what the kill cost (INTERNAL for what the dead IF held) and for
//! datagrams the kernel dropped (INCOMPLETE, counted), and the switchover
//! gaps are reported.
//!
//! Nothing here depends on the machine's speed: the clients run until the
//! scenario is over (they are stopped, not timed), each step waits for the
//! condition it needs (traffic through both IFs, a shadow that said it is
//! ready), and the deadlines only fail a test that hangs.

use std::os::unix::fs::PermissionsExt;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use kneepoint_tests::orchestrator::{
    all_active, kpctl, wait_for, write_config, Orchestrator, HUNG,
};
use kneepoint_tests::{
    answers, bin, control, datagrams_lost, datagrams_received, datagrams_sent, dpdk_files_left,
    expect_statuses, file_prefix, kp_client_closed_loop, repo_root, BackgroundClient, NetnsPair,
    Scratch,
};
use serde_json::{json, Value};

/// The `[platform]` lines of both tests: the metrics endpoint on a port
/// the system picks: tests running at once never collide on it
/// (tests/prometheus.rs scrapes it). The IFs keep the default 100 ms
/// reassembly timeout: with 1000 ms (as inference_veth and switchover
/// have, so that a starved machine cannot time a request out), the
/// fail-over below failed 3 times in 11 runs on a loaded 2-core machine
/// (replacement actives exiting 1 in a loop instead of the ready shadow
/// taking over), never in 17 runs with 100 ms. The loop's cause, found by
/// tests/chaos.rs, is fixed: the if-manager refused a replacement's
/// `ready` (`already_ready`) when its predecessor died without a goodbye.
const PLATFORM: &str = r#"metrics_listen = "127.0.0.1:0""#;

/// `platform.inference_spin_ms` of the restart test's platform.
const SPIN_MS: u64 = 500;

/// Requests each kp-client keeps outstanding.
const CONCURRENCY: u64 = 2;

fn row(status: &Value, if_id: u64) -> Result<Value> {
    status["ifs"]
        .as_array()
        .and_then(|a| a.iter().find(|r| r["if_id"] == if_id))
        .cloned()
        .with_context(|| format!("if {if_id} not in status: {status}"))
}

/// kp-client for `if_id`, closed loop, in the background until stopped.
fn client(net: &NetnsPair, if_id: &str) -> Result<BackgroundClient> {
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", net.get("CLIENT_NS")])
        .arg(bin("kp-client"))
        .arg("--dst")
        .arg(format!("{}:9000", net.get("PLATFORM_IP")))
        .args(["--if-id", if_id, "--timeout", "5s"])
        .args(["--concurrency", &CONCURRENCY.to_string()])
        .args(["--input", "synthetic", "--duration", "600s", "--json"]);
    BackgroundClient::spawn(cmd)
}

/// Whether `log` (the orchestrator's) has a line that says a shadow of
/// `if_id` is ready, after the line that contains `after` (from the start
/// without one), and other than the process `except` names.
fn shadow_ready(log: &str, if_id: u16, after: Option<&str>, except: Option<&str>) -> bool {
    let lines: Vec<&str> = log.lines().collect();
    let from = match after {
        Some(a) => match lines.iter().rposition(|l| l.contains(a)) {
            Some(i) => i + 1,
            None => return false,
        },
        None => 0,
    };
    lines[from..].iter().any(|l| {
        l.contains(&format!("kp-if {if_id} #"))
            && l.contains("(shadow,")
            && l.contains("said it is ready (standby")
            && except.is_none_or(|e| !l.contains(e))
    })
}

/// kp-client sends `n` requests closed loop and wants every one answered,
/// and OK: the platform serves again, nothing fails meanwhile and the load
/// is light (2 outstanding, a 2 s SLO), so the only other answer is
/// INCOMPLETE for a request that lost a datagram in the kernel before the
/// if-manager (`datagrams_lost`), counted by the if-manager at
/// `ifm_control` (its `stats` before and after).
fn all_ok(net: &NetnsPair, ifm_control: &str, if_id: &str, n: u32) -> Result<()> {
    let before = received(ifm_control)?;
    let c = all_answered(net, if_id, n)?;
    let during = received(ifm_control)?
        .checked_sub(before)
        .context("the if-manager's counters went down")?;
    let lost = datagrams_lost(datagrams_sent(&c)?, during)?;
    ensure!(c["answered"] == n, "{c}");
    expect_statuses(&c, &[("incomplete", lost, "a datagram the kernel dropped")])
}

/// The datagrams the if-manager at `ifm_control` received so far
/// ([`datagrams_received`] of its `stats`).
fn received(ifm_control: &str) -> Result<u64> {
    let reply = control(ifm_control, &json!({"cmd": "stats"}), HUNG)?;
    datagrams_received(&reply["stats"])
}

/// kp-client sends `n` requests closed loop and wants every one answered.
fn all_answered(net: &NetnsPair, if_id: &str, n: u32) -> Result<Value> {
    kp_client_closed_loop(
        Command::new("ip")
            .args(["netns", "exec", net.get("CLIENT_NS")])
            .arg(bin("kp-client")),
        &format!("{}:9000", net.get("PLATFORM_IP")),
        if_id.parse()?,
        n.into(),
        &[
            "--timeout",
            "5s",
            "--concurrency",
            &CONCURRENCY.to_string(),
            "--input",
            "synthetic",
        ],
    )
}

/// `kpctl status` run as `nobody` fails at once with "permission denied"
/// (the control socket is 0600 in a 0700 folder: docs/SECURITY.md), while
/// `nobody` can run kpctl itself (a copy in a folder anyone can read, so a
/// checkout only root can read does not make this pass for the wrong
/// reason).
fn another_user_is_refused(endpoint: &str) -> Result<()> {
    let dir = std::env::temp_dir().join(format!("kp-kpctl-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let exe = dir.join("kpctl");
    std::fs::copy(bin("kpctl"), &exe)?;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))?;
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755))?;
    let as_nobody = |args: &[&str]| {
        Command::new("runuser")
            .args(["-u", "nobody", "--"])
            .arg(&exe)
            .args(args)
            .output()
    };
    let result = (|| -> Result<()> {
        let help = as_nobody(&["--help"])?;
        ensure!(help.status.success(), "nobody cannot run kpctl: {help:?}");
        let t0 = Instant::now();
        let out = as_nobody(&["--endpoint", endpoint, "--timeout-ms", "20000", "status"])?;
        let err = String::from_utf8_lossy(&out.stderr);
        ensure!(
            !out.status.success() && err.contains("permission denied"),
            "kpctl as nobody: {:?} {err}",
            out.status
        );
        ensure!(
            t0.elapsed() < Duration::from_secs(10),
            "refused only after the timeout"
        );
        Ok(())
    })();
    let _ = std::fs::remove_dir_all(&dir);
    result
}

#[test]
fn a_dead_if_manager_and_a_dead_orchestrator_are_recovered_from() -> Result<()> {
    let p = repo_root().join("models/squeezenet/config.toml");
    ensure!(p.exists(), "{} is missing: run `make models`", p.display());
    let net = NetnsPair::up(&format!("kpr{}", std::process::id() % 100_000))?;
    let dir = Scratch::new("orchestrator-restart");
    let prefix = file_prefix("orchestrator-restart");
    let config = dir.path("platform.toml");
    // The design's layout: the IF's fragment thread on the network side's
    // core (the if-manager's), its engine alone on core 1, where it spins.
    let platform =
        format!("{PLATFORM}\ncores = \"1\"\nfragment_cores = \"0\"\ninference_spin_ms = {SPIN_MS}");
    write_config(&config, &net, &prefix, &[(1, "squeezenet")], &platform)?;
    let runtime = dir.path("run");
    let endpoint = format!("ipc://{}", runtime.join("orchestrator.sock").display());
    // The if-manager's control socket (the orchestrator's runtime folder).
    let ifm_control = format!("ipc://{}", runtime.join("if-manager.sock").display());

    let mut first = Orchestrator::start(&config, &runtime)?;
    let result = (|| -> Result<Vec<u32>> {
        let s = wait_for(&endpoint, "if 1 active", |s| all_active(s, 1))?;
        let pid = row(&s, 1)?["pid"].as_u64().context("kp-if pid")?;
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline"))?;
        let args: Vec<String> = cmdline
            .split(|&b| b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let after = |flag: &str| {
            args.iter()
                .position(|a| a == flag)
                .map(|i| args[i + 1].clone())
        };
        ensure!(
            after("--cores").as_deref() == Some("1")
                && after("--inference-spin-ms") == Some(SPIN_MS.to_string())
                && after("--lcores").is_some_and(|l| l.ends_with("@(0)")),
            "kp-if not in the design's layout: {args:?}"
        );
        another_user_is_refused(&endpoint)?;
        // The if-manager dies: the platform comes back by itself.
        let ifm = s["platform"]["if_manager_pid"]
            .as_u64()
            .context("if-manager pid")?;
        Command::new("kill")
            .args(["-KILL", &ifm.to_string()])
            .status()?;
        let s = wait_for(&endpoint, "the platform's restart", |s| {
            s["platform"]["platform_restarts"] == 1 && all_active(s, 1)
        })?;
        all_ok(&net, &ifm_control, "1", 20).context("after the if-manager's restart")?;
        // The orchestrator dies and leaves its processes behind.
        let left: Vec<u32> = [
            s["platform"]["if_manager_pid"].as_u64(),
            row(&s, 1)?["pid"].as_u64(),
        ]
        .into_iter()
        .flatten()
        .map(|p| p as u32)
        .collect();
        Ok(left)
    })();
    // SIGKILL of the orchestrator alone: its processes stay behind.
    let _ = first.child().kill();
    let _ = first.child().wait();
    let left = result?;
    let second = Orchestrator::start(&config, &runtime)?;
    let result = (|| -> Result<()> {
        wait_for(&endpoint, "if 1 active under the new orchestrator", |s| {
            all_active(s, 1)
        })?;
        for pid in &left {
            ensure!(
                !kp_os::affinity::process_alive(*pid),
                "process {pid} of the dead orchestrator still runs"
            );
        }
        all_ok(&net, &ifm_control, "1", 20).context("under the new orchestrator")?;
        kpctl(&endpoint, &["shutdown"])?;
        Ok(())
    })();
    let ((), out) = second.end(&endpoint, result)?;
    ensure!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let left = dpdk_files_left(&prefix);
    ensure!(left.is_empty(), "DPDK files left behind: {left:?}");
    Ok(())
}

#[test]
fn slo_change_share_pin_and_a_killed_active_lose_no_request() -> Result<()> {
    for m in ["squeezenet", "shufflenet"] {
        let p = repo_root().join("models").join(m).join("config.toml");
        ensure!(p.exists(), "{} is missing: run `make models`", p.display());
    }
    let net = NetnsPair::up(&format!("kpo{}", std::process::id() % 100_000))?;
    let dir = Scratch::new("orchestrator");
    let prefix = file_prefix("orchestrator");
    let config = dir.path("platform.toml");
    write_config(
        &config,
        &net,
        &prefix,
        &[(1, "squeezenet"), (5, "shufflenet")],
        PLATFORM,
    )?;
    let runtime = dir.path("run");
    let endpoint = format!("ipc://{}", runtime.join("orchestrator.sock").display());
    let ifm_control = format!("ipc://{}", runtime.join("if-manager.sock").display());
    let orch = Orchestrator::start(&config, &runtime)?;
    let result = (|| -> Result<(Value, Value, u64, Value)> {
        // Both IFs serving, each with a parked shadow.
        wait_for(&endpoint, "both IFs active", |s| {
            s["ifs"]
                .as_array()
                .is_some_and(|a| a.len() == 2 && a.iter().all(|r| r["state"] == "active"))
        })?;
        orch.wait_log("both IFs' shadows ready", |log| {
            shadow_ready(log, 1, None, None) && shadow_ready(log, 5, None, None)
        })?;
        let c1 = client(&net, "1")?;
        let c5 = client(&net, "5")?;
        // Every switchover below happens under load.
        wait_for(&endpoint, "traffic through both IFs", |s| {
            [1, 5].iter().all(|&i| {
                row(s, i).is_ok_and(|r| r["throughput_rps"].as_f64().is_some_and(|t| t > 0.0))
            })
        })?;

        // A live SLO change: a re-provision through the shadow.
        // `kpctl --wait` returns once it is done.
        let waited = kpctl(&endpoint, &["--wait", "slo", "1", "1500"])?;
        ensure!(
            waited["switchovers"] == 1
                && waited["if"]["state"] == "active"
                && waited["if"]["slo_ms"] == 1500.0,
            "kpctl --wait slo: {waited}"
        );
        // A share pin: the same for if 5.
        kpctl(&endpoint, &["share", "5", "40"])?;
        let s = wait_for(&endpoint, "if 5's switchover", |s| {
            row(s, 5).is_ok_and(|r| r["switchovers"] == 1 && r["state"] == "active")
        })?;
        ensure!(row(&s, 5)?["pinned"] == true && row(&s, 5)?["share_pct"] == 40.0);
        ensure!(row(&s, 1)?["slo_ms"] == 1500.0);
        // Both IFs re-provisioned at once: one kp-if starts at a time, the
        // other re-provision waits for it (the orchestrator says so).
        kpctl(&endpoint, &["share", "1", "60"])?;
        kpctl(&endpoint, &["slo", "5", "1800"])?;
        let s = wait_for(&endpoint, "both IFs' second switchover", |s| {
            [1, 5]
                .iter()
                .all(|&i| row(s, i).is_ok_and(|r| r["switchovers"] == 2 && r["state"] == "active"))
        })?;
        ensure!(row(&s, 1)?["share_pct"] == 60.0 && row(&s, 5)?["slo_ms"] == 1800.0);
        // Wait for if 1's new shadow: one that said it is ready after if 1
        // switched to its new active, and is not that active. Then kill
        // the active: the shadow must take over.
        let log = orch.log();
        let switched = log
            .lines()
            .rfind(|l| l.contains("orchestrator: if 1 switched to "))
            .context("no switchover of if 1 in the log")?;
        let to = switched
            .split("switched to ")
            .nth(1)
            .and_then(|rest| rest.split(')').next())
            .context("switched to whom?")?
            .to_string();
        orch.wait_log("if 1's new shadow ready", |log| {
            shadow_ready(log, 1, Some(switched), Some(&to))
        })?;
        let pid = row(&s, 1)?["pid"].as_u64().context("pid")?;
        Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status()?;
        wait_for(&endpoint, "if 1's failover", |s| {
            row(s, 1).is_ok_and(|r| {
                r["pid"].as_u64().is_some_and(|p| p != pid) && r["state"] == "active"
            })
        })?;
        let r1 = c1.stop()?;
        let r5 = c5.stop()?;
        // What the if-manager received of the two clients' datagrams.
        let r15_received = received(&ifm_control)?;
        // Service is back: what is sent to if 1 now is served OK.
        all_ok(&net, &ifm_control, "1", 20).context("if 1 after its fail-over")?;
        let status = kpctl(&endpoint, &["status"])?;
        kpctl(&endpoint, &["shutdown"])?;
        Ok((r1, r5, r15_received, status))
    })();
    let ((r1, r5, r15_received, status), out) = orch.end(&endpoint, result)?;
    let exit = out.status;
    let log = String::from_utf8_lossy(&out.stderr).to_string();
    ensure!(exit.success(), "orchestrator exited with {exit}:\n{log}");
    let summary: Value = serde_json::from_str(
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .last()
            .context("no summary")?,
    )?;
    eprintln!("if 1: {r1}\nif 5: {r5}\nsummary: {summary}");

    for (name, r) in [("if 1", &r1), ("if 5", &r5)] {
        ensure!(
            r["sent"].as_u64().unwrap_or(0) > 20,
            "{name}: too little traffic: {r}"
        );
        ensure!(
            r["answered"] == r["sent"] && r["unanswered"] == 0 && r["duplicates"] == 0,
            "{name}: requests lost or answered twice: {r}"
        );
    }
    // Which answers: a re-provision costs no request anything (what was
    // being assembled is handed back and finished), and the load is light
    // (2 outstanding per IF, SLOs of 1.5 s and more), so every request is
    // OK but for two causes. A datagram the kernel dropped before the
    // if-manager (`datagrams_lost`; both clients' together) makes one
    // INCOMPLETE. The kill of if 1's active costs what it held, answered
    // INTERNAL by its shadow, or, for a request whose first fragments it
    // had taken off the ring but not yet entered in its ledger,
    // INCOMPLETE: requests the client had outstanding, so at most 2.
    let lost = datagrams_lost(datagrams_sent(&r1)? + datagrams_sent(&r5)?, r15_received)?;
    eprintln!("datagrams lost before the if-manager: {lost}");
    let dropped = (
        "incomplete",
        lost,
        "a datagram the kernel dropped (both IFs' together)",
    );
    expect_statuses(&r5, &[dropped]).context("if 5")?;
    expect_statuses(
        &r1,
        &[
            ("internal", CONCURRENCY, "what the killed active held"),
            (
                "incomplete",
                CONCURRENCY + lost,
                "what the killed active had taken off the ring, or a datagram the kernel dropped",
            ),
        ],
    )
    .context("if 1")?;
    let killed = answers(&r1, "internal") + answers(&r1, "incomplete");
    ensure!(
        killed <= CONCURRENCY + lost,
        "if 1: {killed} requests INTERNAL or INCOMPLETE, more than the {CONCURRENCY} \
         the kill can cost and the {lost} datagrams lost: {r1}"
    );
    ensure!(row(&status, 1)?["state"] == "active", "{status}");
    let gaps = &summary["ifs"];
    ensure!(
        gaps.as_array()
            .is_some_and(|a| a.iter().all(|i| i["switchovers"] == 2)),
        "summary: {summary}"
    );
    ensure!(
        log.contains("to start first"),
        "no re-provision waited for another kp-if to start:\n{log}"
    );
    ensure!(summary["ifs"][0]["failovers"] == 1, "summary: {summary}");
    ensure!(
        log.lines()
            .any(|l| l.contains("kp-if 1 #") && l.contains("(shadow,") && l.contains("took over")),
        "if 1's shadow did not take over:\n{log}"
    );
    ensure!(
        summary["if_manager"]["mempool"].is_object(),
        "no if-manager report in the summary: {summary}\n{log}"
    );
    let left = dpdk_files_left(&prefix);
    ensure!(left.is_empty(), "DPDK files left behind: {left:?}");
    Ok(())
}
