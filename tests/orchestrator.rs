//! The whole platform under the orchestrator, live over a veth pair: two
//! inference functions under load from kp-client; an SLO change and a
//! share pin through `kpctl` each re-provision an IF through its shadow; the
//! active of one IF is killed with SIGKILL and its shadow takes over. Every
//! request sent gets exactly one answer — none lost, none duplicated — and
//! the switchover gaps are reported.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use kneepoint_tests::{bin, bin_dir, dpdk_files_left, file_prefix, repo_root, NetnsPair, Scratch};
use serde_json::Value;

fn kpctl(endpoint: &str, args: &[&str]) -> Result<Value> {
    let out = Command::new(bin("kpctl"))
        .args(["--endpoint", endpoint, "--json"])
        .args(args)
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success(),
        "kpctl {args:?}: {}{}",
        text,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(text.lines().last().unwrap_or("null")).context("kpctl --json output")
}

fn row(status: &Value, if_id: u64) -> Result<Value> {
    status["ifs"]
        .as_array()
        .and_then(|a| a.iter().find(|r| r["if_id"] == if_id))
        .cloned()
        .with_context(|| format!("if {if_id} not in status: {status}"))
}

fn wait_for(endpoint: &str, what: &str, done: impl Fn(&Value) -> bool) -> Result<Value> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let s = kpctl(endpoint, &["status"])?;
        if done(&s) {
            return Ok(s);
        }
        if Instant::now() > deadline {
            bail!("{what} did not happen: {s}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn client(net: &NetnsPair, if_id: &str, seconds: &str) -> Result<Child> {
    Command::new("ip")
        .args(["netns", "exec", net.get("CLIENT_NS")])
        .arg(bin("kp-client"))
        .arg("--dst")
        .arg(format!("{}:9000", net.get("PLATFORM_IP")))
        .args(["--if-id", if_id, "--concurrency", "2", "--timeout", "5s"])
        .args(["--input", "synthetic", "--duration", seconds, "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting kp-client")
}

fn client_report(child: Child) -> Result<Value> {
    let out = child.wait_with_output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success(),
        "kp-client: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(serde_json::from_str(
        text.lines().last().context("kp-client printed nothing")?,
    )?)
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
    std::fs::write(
        &config,
        format!(
            r#"
[platform]
models = "{models}"
bin_dir = "{bins}"
tuning = false

[if_manager]
wrap = ["ip", "netns", "exec", "{ns}"]
options = ["--ip", "{ip}"]
eal = ["--lcores", "0@0", "--no-pci", "--no-telemetry", "--log-level", "lib.eal:error",
       "--vdev", "net_af_packet0,iface={iface}"]
file_prefix = "{prefix}"

[[deploy]]
if_id = 1
model = "squeezenet"
slo_ms = 2000
share_pct = 50

[[deploy]]
if_id = 5
model = "shufflenet"
slo_ms = 2000
share_pct = 50
"#,
            models = repo_root().join("models").display(),
            bins = bin_dir().display(),
            ns = net.get("PLATFORM_NS"),
            ip = net.get("PLATFORM_IP"),
            iface = net.get("PLATFORM_IF"),
        ),
    )?;
    let runtime = dir.path("run");
    let endpoint = format!("ipc://{}", runtime.join("orchestrator.sock").display());
    let mut orch = Command::new(bin("orchestrator"))
        .arg("--config")
        .arg(&config)
        .arg("--runtime-dir")
        .arg(&runtime)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let result = (|| -> Result<(Value, Value, Value)> {
        // Both IFs serving, each with a parked shadow.
        wait_for(&endpoint, "both IFs active", |s| {
            s["ifs"]
                .as_array()
                .is_some_and(|a| a.len() == 2 && a.iter().all(|r| r["state"] == "active"))
        })?;
        std::thread::sleep(Duration::from_secs(3)); // shadows load
        let c1 = client(&net, "1", "10s")?;
        let c5 = client(&net, "5", "10s")?;
        std::thread::sleep(Duration::from_secs(2));

        // A live SLO change: a re-provision through the shadow.
        kpctl(&endpoint, &["slo", "1", "1500"])?;
        wait_for(&endpoint, "if 1's switchover", |s| {
            row(s, 1).is_ok_and(|r| r["switchovers"] == 1 && r["state"] == "active")
        })?;
        // A share pin: the same for if 5.
        kpctl(&endpoint, &["share", "5", "40"])?;
        let s = wait_for(&endpoint, "if 5's switchover", |s| {
            row(s, 5).is_ok_and(|r| r["switchovers"] == 1 && r["state"] == "active")
        })?;
        ensure!(row(&s, 5)?["pinned"] == true && row(&s, 5)?["share_pct"] == 40.0);
        ensure!(row(&s, 1)?["slo_ms"] == 1500.0);
        // Give the new shadows time to load, then kill if 1's active.
        std::thread::sleep(Duration::from_secs(2));
        let pid = row(&s, 1)?["pid"].as_u64().context("pid")?;
        Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status()?;
        wait_for(&endpoint, "if 1's failover", |s| {
            row(s, 1).is_ok_and(|r| {
                r["pid"].as_u64().is_some_and(|p| p != pid) && r["state"] == "active"
            })
        })?;
        let r1 = client_report(c1)?;
        let r5 = client_report(c5)?;
        let status = kpctl(&endpoint, &["status"])?;
        kpctl(&endpoint, &["shutdown"])?;
        Ok((r1, r5, status))
    })();
    let deadline = Instant::now() + Duration::from_secs(30);
    let exit = loop {
        if let Some(s) = orch.try_wait()? {
            break s;
        }
        if Instant::now() > deadline {
            let _ = orch.kill();
            bail!("the orchestrator did not exit after shutdown");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let out = orch.wait_with_output()?;
    let log = String::from_utf8_lossy(&out.stderr).to_string();
    let (r1, r5, status) = result.with_context(|| format!("orchestrator log:\n{log}"))?;
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
    // Only the kill may cost errors (INTERNAL for what the dead IF held).
    ensure!(r5["status"]["ok"] == r5["sent"], "if 5: {r5}");
    ensure!(row(&status, 1)?["state"] == "active", "{status}");
    let gaps = &summary["ifs"];
    ensure!(
        gaps.as_array()
            .is_some_and(|a| a.iter().all(|i| i["switchovers"] == 1)),
        "summary: {summary}"
    );
    ensure!(summary["ifs"][0]["failovers"] == 1, "summary: {summary}");
    ensure!(
        summary["if_manager"]["mempool"].is_object(),
        "summary: {summary}"
    );
    let left = dpdk_files_left(&prefix);
    ensure!(left.is_empty(), "DPDK files left behind: {left:?}");
    Ok(())
}
