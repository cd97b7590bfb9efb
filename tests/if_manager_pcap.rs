//! The if-manager on DPDK's `net_pcap` device, against kp-gen's manifest.
//!
//! A generated pcap holds requests for two registered IFs, requests for an
//! unregistered `if_id`, malformed datagrams of every kind, duplicates and
//! missing fragments, interleaved across requests and three clients. The
//! if-manager (DPDK primary) replays it; `kp-ring-probe` (a DPDK secondary)
//! drains both IF rings. Then:
//! - each ring carried exactly the manifest's fragments for its IF;
//! - the TX pcap holds exactly one UNKNOWN_IF error per unknown request,
//!   correctly addressed;
//! - every counter has its exact expected value;
//! - no mbuf is missing from the pool, and no DPDK file is left behind.

use std::process::Command;

use std::time::Duration;

use anyhow::{ensure, Result};
use kneepoint_tests::{
    bin, dpdk_files_left, expect, file_prefix, read_json, run, wait_for_stats, IfManager, Scratch,
};

fn replay_and_check(name: &str, extra_gen_args: &[&str]) -> Result<()> {
    let dir = Scratch::new(name);
    let (input, out, manifest) = (
        dir.path("in.pcap"),
        dir.path("out.pcap"),
        dir.path("manifest.json"),
    );
    let mut gen = Command::new(bin("kp-gen"));
    gen.arg("--out")
        .arg(&input)
        .arg("--manifest")
        .arg(&manifest);
    gen.args([
        "--requests",
        "24",
        "--if-mix",
        "1:1,2:1,9:1",
        "--deployed",
        "1,2",
        "--input",
        "synthetic",
        "--shape",
        "64x64x3",
        "--interleave",
        "3",
        "--shuffle-window",
        "16",
        "--src-ports",
        "40000-40002",
        "--malformed-each",
        "2",
        "--dup-count",
        "12",
        "--missing-count",
        "4",
        "--disagree-count",
        "2",
        "--seed",
        "11",
        "-q",
    ]);
    gen.args(extra_gen_args);
    run(&mut gen)?;
    let m = expect::load(&manifest)?;
    let delivered = m.totals.if_manager.as_ref().expect("deployed").delivered;

    let prefix = file_prefix(name);
    let ifm = IfManager::start(
        &[],
        &["--if", "1", "--if", "2", "--ring-size", "4096"].map(String::from),
        &[
            "--lcores".into(),
            "0@0".into(),
            "--file-prefix".into(),
            prefix.clone(),
            "--no-pci".into(),
            "--no-telemetry".into(),
            "--vdev".into(),
            format!(
                "net_pcap0,rx_pcap={},tx_pcap={}",
                input.display(),
                out.display()
            ),
        ],
    )?;

    let probe_out = dir.path("probe.json");
    run(Command::new(bin("kp-ring-probe"))
        .args([
            "--ring",
            "kp_if_1",
            "--ring",
            "kp_if_2",
            "--idle-ms",
            "2000",
        ])
        .arg("--expect")
        .arg(delivered.to_string())
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
        .arg("--file-prefix")
        .arg(&prefix))?;
    let report = ifm.stop()?;

    expect::check_probe(&read_json(&probe_out)?, &m)?;
    expect::check_counters(&report, &m, 0)?;
    let sent = kp_traffic::pcap::read_file(&out)?;
    expect::check_unknown_if_answers(sent.iter().map(|r| r.data.as_slice()), &m)?;
    let left = dpdk_files_left(&prefix);
    anyhow::ensure!(left.is_empty(), "DPDK files left behind: {left:?}");
    Ok(())
}

#[test]
fn pcap_replay_routes_every_fragment_and_answers_each_unknown_request_once() -> Result<()> {
    replay_and_check("pcap", &[])
}

#[test]
fn pcap_replay_with_vlan_tags() -> Result<()> {
    replay_and_check("pcap-vlan", &["--vlan", "100"])
}

/// A frame beyond the mbuf's room stays one counted outcome: with the
/// default `--max-frame` (10240) a 12288-byte fragment (a 12362-byte
/// frame, more than any 9216-byte MTU carries) arrives from net_pcap
/// chained over two mbufs and is counted `segmented` (malformed), never
/// delivered; no mbuf is lost.
#[test]
fn a_frame_beyond_max_frame_is_counted_segmented() -> Result<()> {
    let name = "pcap-oversize";
    let dir = Scratch::new(name);
    let (input, out, manifest) = (
        dir.path("in.pcap"),
        dir.path("out.pcap"),
        dir.path("manifest.json"),
    );
    // 64×128×3 = 24576 bytes: kp-gen cuts two equal fragments of 12288.
    run(Command::new(bin("kp-gen"))
        .arg("--out")
        .arg(&input)
        .arg("--manifest")
        .arg(&manifest)
        .args([
            "--requests",
            "2",
            "--if-ids",
            "1",
            "--deployed",
            "1",
            "--input",
            "synthetic",
            "--shape",
            "64x128x3",
            "--frag-size",
            "16000",
            "--seed",
            "3",
            "-q",
        ]))?;
    let prefix = file_prefix(name);
    let control = format!("ipc://{}", dir.path("ifm.sock").display());
    let ifm = IfManager::start(
        &[],
        &["--if", "1", "--control", &control].map(String::from),
        &[
            "--lcores".into(),
            "0@0".into(),
            "--file-prefix".into(),
            prefix.clone(),
            "--no-pci".into(),
            "--no-telemetry".into(),
            "--vdev".into(),
            format!(
                "net_pcap0,rx_pcap={},tx_pcap={}",
                input.display(),
                out.display()
            ),
        ],
    )?;
    wait_for_stats(&control, Duration::from_secs(20), |s| {
        s["outcomes"]["delivered"].as_u64().unwrap_or(0)
            + s["outcomes"]["malformed"].as_u64().unwrap_or(0)
            >= 4
    })?;
    let report = ifm.stop()?;
    ensure!(
        report["outcomes"]["delivered"] == 0
            && report["outcomes"]["malformed"] == 4
            && report["malformed"]["segmented"] == 4
            && report["mempool"]["max_frame"] == 10240
            && report["mempool"]["in_use_at_exit"] == 0,
        "if-manager: {report}"
    );
    let left = dpdk_files_left(&prefix);
    ensure!(left.is_empty(), "DPDK files left behind: {left:?}");
    Ok(())
}
