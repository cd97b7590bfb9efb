//! Inference live: kp-client over a real UDP socket, from a network
//! namespace, through the if-manager on a veth pair, into an inference
//! function running squeezenet with ONNX Runtime.
//!
//! Closed loop with several requests outstanding: every request sent must
//! come back answered exactly once (OK, or OVERLOADED if it was shed under
//! its SLO), none unanswered, none duplicated, and most of them OK.

use std::process::Command;

use anyhow::{ensure, Context, Result};
use kneepoint_tests::{
    bin, dpdk_files_left, file_prefix, repo_root, run, Daemon, NetnsPair, Scratch,
};
use serde_json::Value;

#[test]
fn kp_client_closed_loop_through_squeezenet_gets_every_request_answered() -> Result<()> {
    let model = repo_root().join("models/squeezenet/config.toml");
    ensure!(
        model.exists(),
        "{} is missing: run `make models` first",
        model.display()
    );
    let net = NetnsPair::up(&format!("kpi{}", std::process::id() % 100_000))?;
    let dir = Scratch::new("inference-veth");
    let prefix = file_prefix("inference-veth");
    let endpoint = format!("ipc://{}", dir.path("ifm.sock").display());
    let ns = ["ip", "netns", "exec", net.get("PLATFORM_NS")];
    let common = |lcores: &str| -> Vec<String> {
        let mut v: Vec<String> = [
            "--lcores",
            lcores,
            "--file-prefix",
            &prefix,
            "--no-pci",
            "--no-telemetry",
        ]
        .map(String::from)
        .to_vec();
        v.extend(["--log-level".into(), "lib.eal:error".into()]);
        v
    };
    let mut eal = common("0@0");
    eal.extend([
        "--vdev".into(),
        format!("net_af_packet0,iface={}", net.get("PLATFORM_IF")),
    ]);
    let ifm = Daemon::start(
        &ns,
        &["--control", &endpoint, "--ip", net.get("PLATFORM_IP")].map(String::from),
        &eal,
    )?;
    let mut eal = common("1@(0-1)");
    eal.extend(["--proc-type".into(), "secondary".into()]);
    let kp_if = Daemon::start_bin(
        &ns,
        "kp-if",
        &[
            "--model".to_string(),
            model.display().to_string(),
            "--control".into(),
            endpoint.clone(),
        ],
        &eal,
        "kp-if: ready",
    )?;

    let requests = 80;
    let out = run(Command::new("ip")
        .args(["netns", "exec", net.get("CLIENT_NS")])
        .arg(bin("kp-client"))
        .arg("--dst")
        .arg(format!("{}:9000", net.get("PLATFORM_IP")))
        .args([
            "--if-id",
            "1",
            "--concurrency",
            "4",
            "--timeout",
            "5s",
            "--input",
            "synthetic",
        ])
        .args([
            "--requests",
            &requests.to_string(),
            "--json",
            "--expect-all-answered",
        ]))?;
    let client: Value =
        serde_json::from_str(out.lines().last().context("kp-client printed nothing")?)?;
    let if_report = kp_if.stop()?;
    let ifm_report = ifm.stop()?;

    ensure!(client["sent"] == requests, "client: {client}");
    ensure!(client["answered"] == requests, "client: {client}");
    ensure!(
        client["unanswered"] == 0 && client["duplicates"] == 0,
        "client: {client}"
    );
    let ok = client["status"]["ok"].as_u64().unwrap_or(0);
    let shed = client["status"]["overloaded"].as_u64().unwrap_or(0);
    ensure!(
        ok + shed == requests,
        "only OK or OVERLOADED expected: {client}"
    );
    ensure!(
        ok >= requests / 2,
        "most requests should be served: {client}"
    );
    ensure!(
        if_report["telemetry"]["answers_total"] == requests,
        "kp-if: {if_report}"
    );
    ensure!(
        ifm_report["mempool"]["in_use_at_exit"] == 0,
        "if-manager: {ifm_report}"
    );
    let left = dpdk_files_left(&prefix);
    ensure!(left.is_empty(), "DPDK files left behind: {left:?}");
    Ok(())
}
