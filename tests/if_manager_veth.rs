//! The if-manager live on a veth pair, fed from a network namespace.
//!
//! `scripts/netns.sh` makes a client namespace and a platform namespace
//! joined by a veth pair; the if-manager runs in the platform namespace on
//! `net_af_packet`. Two tests:
//! - tcpreplay replays a kp-gen pcap (addressed to the platform) from the
//!   client namespace; a DPDK secondary drains the IF ring; every counter
//!   and every ring's contents match the manifest;
//! - kp-client sends requests for an unregistered IF over a real UDP socket
//!   from the client namespace and must get exactly one UNKNOWN_IF error
//!   per request back through the kernel.
//!
//! Both need root and `ip netns`. A machine that cannot create namespaces
//! fails these tests with a message that says so; they never pass silently.

use std::process::Command;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use kneepoint_tests::platform::af_packet_vdev;
use kneepoint_tests::{
    bin, control, dpdk_files_left, expect, file_prefix, kp_client_closed_loop, read_json,
    repo_root, run, wait_for_stats, IfManager, NetnsPair, Scratch,
};
use serde_json::json;

/// Starts the if-manager inside the platform namespace on its veth end.
fn start_if_manager(net: &NetnsPair, prefix: &str, options: &[&str]) -> Result<IfManager> {
    let eal = [
        "--lcores".to_string(),
        "0@0".into(),
        "--file-prefix".into(),
        prefix.into(),
        "--no-pci".into(),
        "--no-telemetry".into(),
        "--vdev".into(),
        af_packet_vdev(net.get("PLATFORM_IF")),
    ];
    let mut opts: Vec<String> = options.iter().map(|s| s.to_string()).collect();
    opts.extend(["--ip".into(), net.get("PLATFORM_IP").into()]);
    IfManager::start(
        &["ip", "netns", "exec", net.get("PLATFORM_NS")],
        &opts,
        &eal,
    )
}

#[test]
fn tcpreplay_over_veth_routes_every_fragment() -> Result<()> {
    let net = NetnsPair::up(&format!("kpr{}", std::process::id() % 100_000))?;
    let dir = Scratch::new("veth-replay");
    let (input, manifest) = (dir.path("in.pcap"), dir.path("manifest.json"));
    run(Command::new(bin("kp-gen"))
        .arg("--out")
        .arg(&input)
        .arg("--manifest")
        .arg(&manifest)
        .args([
            "--requests",
            "16",
            "--if-mix",
            "1:3,9:1",
            "--deployed",
            "1",
            "--input",
            "synthetic",
        ])
        .args([
            "--shape",
            "64x64x3",
            "--interleave",
            "2",
            "--malformed-each",
            "1",
            "--dup-count",
            "6",
        ])
        .args(["--missing-count", "2", "--seed", "5", "-q"])
        // Every kind but ip_fragment (see VETH_FAULT_KINDS). The pcap test
        // covers that kind.
        .args(["--malformed-kinds", expect::VETH_FAULT_KINDS])
        .args([
            "--src-mac",
            net.get("CLIENT_MAC"),
            "--dst-mac",
            net.get("PLATFORM_MAC"),
        ])
        .args([
            "--src-ip",
            net.get("CLIENT_IP"),
            "--dst-ip",
            net.get("PLATFORM_IP"),
        ]))?;
    let m = expect::load(&manifest)?;

    let prefix = file_prefix("veth-replay");
    let endpoint = format!("ipc://{}", dir.path("ifm.sock").display());
    let ifm = start_if_manager(&net, &prefix, &["--if", "1", "--control", &endpoint])?;

    let replay = run(Command::new(repo_root().join("scripts/replay.sh"))
        .args([
            "--ns",
            net.get("CLIENT_NS"),
            "--iface",
            net.get("CLIENT_IF"),
            "--pps",
            "20000",
        ])
        .arg("--pcap")
        .arg(&input))?;
    ensure!(
        replay.contains(&format!("Successful packets:        {}", m.totals.packets))
            || replay.contains(&format!("Successful packets: {}", m.totals.packets)),
        "tcpreplay did not send every packet:\n{replay}"
    );
    // Every packet (plus, possibly, the client kernel's ICMP port-unreachable
    // replies to our UNKNOWN_IF errors) must have been taken off the wire.
    let packets = m.totals.packets;
    wait_for_stats(&endpoint, Duration::from_secs(20), |s| {
        s["rx_packets"].as_u64() >= Some(packets)
    })?;

    let probe_out = dir.path("probe.json");
    let delivered = m.totals.if_manager.as_ref().context("deployed")?.delivered;
    run(Command::new("ip")
        .args(["netns", "exec", net.get("PLATFORM_NS")])
        .arg(bin("kp-ring-probe"))
        .args([
            "--ring",
            "kp_if_1",
            "--idle-ms",
            "2000",
            "--expect",
            &delivered.to_string(),
        ])
        .arg("--out")
        .arg(&probe_out)
        .args([
            "--",
            "--lcores",
            "1@1",
            "--proc-type",
            "secondary",
            "--no-pci",
            "--no-telemetry",
        ])
        .args(["--file-prefix", &prefix]))?;
    let report = ifm.stop()?;

    expect::check_probe(&read_json(&probe_out)?, &m)?;
    let unknown = m
        .totals
        .if_manager
        .as_ref()
        .context("deployed")?
        .unknown_if_answered;
    expect::check_counters(&report, &m, unknown)
        .with_context(|| format!("report: {report}\nmanifest totals: {:?}", m.totals))?;
    ensure!(
        report["port"]["imissed"] == 0,
        "the port dropped packets: {}",
        report["port"]
    );
    let left = dpdk_files_left(&prefix);
    ensure!(left.is_empty(), "DPDK files left behind: {left:?}");
    Ok(())
}

#[test]
fn kp_client_over_veth_gets_exactly_one_unknown_if_error_per_request() -> Result<()> {
    let net = NetnsPair::up(&format!("kpc{}", std::process::id() % 100_000))?;
    let dir = Scratch::new("veth-client");
    let prefix = file_prefix("veth-client");
    let endpoint = format!("ipc://{}", dir.path("ifm.sock").display());
    let ifm = start_if_manager(&net, &prefix, &["--control", &endpoint])?;

    // The control socket works end to end: register and unregister an IF.
    let reply = control(
        &endpoint,
        &json!({"cmd": "register", "if_id": 3}),
        Duration::from_secs(5),
    )?;
    ensure!(
        reply["ok"] == true && reply["ring"] == "kp_if_3",
        "register: {reply}"
    );
    let reply = control(
        &endpoint,
        &json!({"cmd": "register", "if_id": 3}),
        Duration::from_secs(5),
    )?;
    ensure!(
        reply["ok"] == false && reply["error"]["code"] == "already_registered",
        "a second register must be refused: {reply}"
    );
    // `ready` said again while live (the successor of a process killed
    // before its goodbye) is accepted, and counts once: one goodbye ends it.
    for (cmd, ok) in [
        ("ready", true),
        ("ready", true),
        ("goodbye", true),
        ("goodbye", false),
    ] {
        let reply = control(
            &endpoint,
            &json!({"cmd": cmd, "if_id": 3}),
            Duration::from_secs(5),
        )?;
        ensure!(
            reply["ok"] == ok && (ok || reply["error"]["code"] == "not_live"),
            "{cmd}: {reply}"
        );
    }
    let reply = control(
        &endpoint,
        &json!({"cmd": "unregister", "if_id": 3}),
        Duration::from_secs(5),
    )?;
    ensure!(reply["ok"] == true, "unregister: {reply}");
    let reply = control(&endpoint, &json!({"cmd": "fly"}), Duration::from_secs(5))?;
    ensure!(
        reply["ok"] == false
            && reply["error"]["code"] == "unknown_command"
            && reply["error"]["message"].as_str().is_some(),
        "bad command: {reply}"
    );

    let requests = 300;
    let client = kp_client_closed_loop(
        Command::new("ip")
            .args(["netns", "exec", net.get("CLIENT_NS")])
            .arg(bin("kp-client")),
        &format!("{}:9000", net.get("PLATFORM_IP")),
        7,
        requests,
        &[
            "--shape",
            "32x32x3",
            "--concurrency",
            "8",
            "--timeout",
            "2s",
        ],
    )?;
    let report = ifm.stop()?;

    ensure!(client["sent"] == requests, "client: {client}");
    ensure!(client["answered"] == requests, "client: {client}");
    ensure!(
        client["status"]["unknown_if"] == requests,
        "client: {client}"
    );
    ensure!(
        client["unanswered"] == 0 && client["duplicates"] == 0,
        "client: {client}"
    );
    ensure!(
        report["outcomes"]["unknown_if_answered"] == requests,
        "if-manager: {report}"
    );
    ensure!(report["tx"]["sent"] == requests, "if-manager: {report}");
    ensure!(
        report["mempool"]["in_use_at_exit"] == 0,
        "if-manager: {report}"
    );
    let left = dpdk_files_left(&prefix);
    ensure!(left.is_empty(), "DPDK files left behind: {left:?}");
    Ok(())
}
