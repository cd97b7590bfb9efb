//! The Python package `kneepoint` against a live platform: the if-manager
//! on a veth pair between two network namespaces, two inference functions
//! (squeezenet, if 1; efficientnet_lite0 with trained weights, if 10), and
//! python/tests/platform_check.py run in the client namespace with the
//! repo's venv (`make python` installs the package there): a real photo
//! classified right, many threads on one client each request answered once,
//! UNKNOWN_IF and BAD_REQUEST raised as their exception classes.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{ensure, Context, Result};
use kneepoint_tests::platform::{af_packet_vdev, eal, primary_eal};
use kneepoint_tests::{dpdk_files_left, file_prefix, repo_root, run, Daemon, NetnsPair, Scratch};
use serde_json::Value;

/// A file the test needs, made by `make models` / `make python`.
fn needed(rel: &str, by: &str) -> Result<PathBuf> {
    let p = repo_root().join(rel);
    ensure!(p.exists(), "{} is missing: run `{by}` first", p.display());
    Ok(p)
}

#[test]
fn python_client_classifies_a_photo_and_shares_one_client_between_threads() -> Result<()> {
    let models = needed("models", "make models")?;
    let squeezenet = needed("models/squeezenet/config.toml", "make models")?;
    let effnet = needed("models/efficientnet_lite0/config.toml", "make models")?;
    let photo = needed("build/photos/coffee.png", "make models")?;
    let python = needed(".venv/bin/python", "make setup")?;
    let script = needed("python/tests/platform_check.py", "git checkout")?;
    let import = Command::new(&python)
        .args(["-c", "import kneepoint"])
        .output()?;
    ensure!(
        import.status.success(),
        "the venv cannot import kneepoint: run `make python` first\n{}",
        String::from_utf8_lossy(&import.stderr)
    );

    let net = NetnsPair::up(&format!("kpy{}", std::process::id() % 100_000))?;
    let dir = Scratch::new("python-client");
    let prefix = file_prefix("python-client");
    let control = format!("ipc://{}", dir.path("ifm.sock").display());
    let ns = ["ip", "netns", "exec", net.get("PLATFORM_NS")];

    let vdev = af_packet_vdev(net.get("PLATFORM_IF"));
    let ifm = Daemon::start(
        &ns,
        &["--control", &control, "--ip", net.get("PLATFORM_IP")].map(String::from),
        &primary_eal(&prefix, &vdev),
    )?;
    // Two IFs on the 2-core machine: distinct lcore ids (mempool caches are
    // per lcore), both free to run on either core. A generous SLO: a busy
    // test machine should still serve most requests (shedding is the
    // batching tests' job).
    let start_if = |model: &PathBuf, lcore: &str| {
        Daemon::start_bin(
            &ns,
            "kp-if",
            &[
                "--model".into(),
                model.display().to_string(),
                "--control".into(),
                control.clone(),
                "--slo-ms".into(),
                "2000".into(),
            ],
            &eal(
                &prefix,
                &format!("{lcore}@(0-1)"),
                &["--proc-type", "secondary"],
            ),
            "kp-if: ready",
        )
    };
    let if1 = start_if(&squeezenet, "1")?;
    let if10 = start_if(&effnet, "2")?;

    let out = run(Command::new("ip")
        .args(["netns", "exec", net.get("CLIENT_NS")])
        .arg(&python)
        .arg(&script)
        .arg("--addr")
        .arg(format!("{}:9000", net.get("PLATFORM_IP")))
        .arg("--models")
        .arg(&models)
        .arg("--photo")
        .arg(&photo)
        .args(["--threads", "4", "--requests", "80", "--timeout", "5"]))?;
    let summary: Value = serde_json::from_str(
        out.lines()
            .last()
            .context("platform_check.py printed nothing")?,
    )
    .with_context(|| format!("platform_check.py's last line is not JSON:\n{out}"))?;
    println!("platform_check.py: {summary}");
    // The script checked everything it says; its summary must say it ran.
    ensure!(
        summary["photo_top1"]["path"][0] == 967,
        "summary: {summary}"
    );
    ensure!(
        summary["concurrency"]["counters"]["answered"] == 84,
        "summary: {summary}"
    );

    let if10_report = if10.stop()?;
    let if1_report = if1.stop()?;
    let ifm_report = ifm.stop()?;
    ensure!(
        if1_report["telemetry"]["answers_total"].as_u64() >= Some(84),
        "kp-if 1: {if1_report}"
    );
    ensure!(
        if10_report["telemetry"]["answers_total"].as_u64() >= Some(2),
        "kp-if 10: {if10_report}"
    );
    ensure!(
        ifm_report["mempool"]["in_use_at_exit"] == 0,
        "if-manager: {ifm_report}"
    );
    let left = dpdk_files_left(&prefix);
    ensure!(left.is_empty(), "DPDK files left behind: {left:?}");
    Ok(())
}
