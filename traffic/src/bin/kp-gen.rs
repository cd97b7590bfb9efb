//! kp-gen: writes a pcap of kneepoint request fragments, faults included,
//! and optionally a JSON manifest of what it wrote (see `kp_traffic::gen`
//! and `kp_traffic::manifest`).

use std::io::{BufWriter, Write};
use std::net::Ipv4Addr;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Parser;
use kp_traffic::fault::FaultKind;
use kp_traffic::gen::{
    generate, parse_deployed, parse_ports, Amount, Endpoints, FaultPlan, GenConfig, IfMix,
    DEFAULT_FRAG_SIZE,
};
use kp_traffic::input::InputArgs;
use kp_wire::MacAddr;

/// Write a pcap of kneepoint requests (docs/PROTOCOL.md), with faults on purpose.
///
/// Deterministic: the same options (and input files) give the same pcap and
/// manifest byte for byte. Packet k has the pcap timestamp
/// start + k * gap, so tcpreplay without a rate option keeps the gap.
#[derive(Debug, Parser)]
#[command(name = "kp-gen", version)]
struct Args {
    /// pcap file to write (classic pcap, Ethernet, µs timestamps).
    #[arg(long, value_name = "FILE")]
    out: PathBuf,
    /// Also write the JSON manifest here.
    #[arg(long, value_name = "FILE")]
    manifest: Option<PathBuf>,
    /// Number of requests.
    #[arg(long, default_value_t = 1, value_name = "N")]
    requests: u64,
    /// if_ids given round-robin to the requests: 1,2.
    #[arg(long, value_name = "LIST", value_parser = IfMix::parse_ids, conflicts_with = "if_mix")]
    if_ids: Option<IfMix>,
    /// if_ids drawn with weights: 1:3,2:1.
    #[arg(long, value_name = "ID:W,...", value_parser = IfMix::parse_weights)]
    if_mix: Option<IfMix>,
    #[command(flatten)]
    inputs: InputArgs,
    /// Payload bytes per fragment at most.
    #[arg(long, default_value_t = DEFAULT_FRAG_SIZE, value_name = "BYTES")]
    frag_size: usize,
    /// Requests in flight, their fragments sent round-robin.
    #[arg(long, default_value_t = 1, value_name = "N")]
    interleave: usize,
    /// Randomly permute packets within windows of W (0 or 1: off).
    #[arg(long, default_value_t = 0, value_name = "W")]
    shuffle_window: usize,
    /// Duplicate each fragment with probability R.
    #[arg(long, value_name = "R", conflicts_with = "dup_count")]
    dup_rate: Option<f64>,
    /// Duplicate exactly N fragments.
    #[arg(long, value_name = "N")]
    dup_count: Option<u64>,
    /// Drop each fragment with probability R.
    #[arg(long, value_name = "R", conflicts_with = "missing_count")]
    missing_rate: Option<f64>,
    /// Drop exactly N fragments.
    #[arg(long, value_name = "N")]
    missing_count: Option<u64>,
    /// After each fragment, with probability R, a broken datagram of a
    /// random allowed kind.
    #[arg(long, value_name = "R", conflicts_with = "malformed_each")]
    malformed_rate: Option<f64>,
    /// K broken datagrams of every allowed kind.
    #[arg(long, value_name = "K")]
    malformed_each: Option<u64>,
    /// Allowed kinds of broken datagrams (default: all). Header:
    /// too_short, bad_magic, bad_version, bad_type, zero_total_len,
    /// zero_frag_count, index_out_of_range, empty_last_fragment,
    /// payload_length; frame: truncated, bad_ip_version, bad_ip_header_len,
    /// bad_ip_total_len, bad_ip_checksum, ip_fragment, bad_udp_length;
    /// not for us: not_ipv4, not_udp, wrong_port.
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    malformed_kinds: Option<Vec<String>>,
    /// Corrupt 1 to 4 payload bytes (never the kneepoint header) of each
    /// well-formed fragment with probability R, the IPv4 header checksum
    /// valid and the UDP checksum computed over the corrupted bytes (a
    /// sender that corrupts before it checksums): the protocol cannot tell,
    /// so such fragments stay well-formed.
    #[arg(long, value_name = "R", conflicts_with = "corrupt_count")]
    corrupt_rate: Option<f64>,
    /// Corrupt exactly N well-formed fragments' payloads (as --corrupt-rate).
    #[arg(long, value_name = "N")]
    corrupt_count: Option<u64>,
    /// Give each request (of 2+ fragments) with probability R a fragment
    /// that disagrees (total_len or send_ts_ns) with the others.
    #[arg(long, value_name = "R", conflicts_with = "disagree_count")]
    disagree_rate: Option<f64>,
    /// Exactly N requests with a disagreeing fragment.
    #[arg(long, value_name = "N")]
    disagree_count: Option<u64>,
    /// Gap between consecutive packets' timestamps, µs.
    #[arg(long, default_value_t = 10, value_name = "G")]
    gap_us: u64,
    /// Timestamp of the first packet, ns since the Unix epoch.
    #[arg(long, default_value_t = 0, value_name = "NS")]
    start_ns: u64,
    /// Source IPv4 address.
    #[arg(long, default_value = "10.77.0.1")]
    src_ip: Ipv4Addr,
    /// Destination IPv4 address (the platform's).
    #[arg(long, default_value = "10.77.0.2")]
    dst_ip: Ipv4Addr,
    /// Source MAC.
    #[arg(long, default_value = "02:00:00:00:00:01")]
    src_mac: MacAddr,
    /// Destination MAC (the platform port's, e.g. netns.sh's PLATFORM_MAC).
    #[arg(long, default_value = "02:00:00:00:00:02")]
    dst_mac: MacAddr,
    /// Source UDP ports, one per emulated client, round-robin by request:
    /// 40000, 40000-40003, 40000,40010.
    #[arg(long, default_value = "40000", value_name = "PORTS")]
    src_ports: String,
    /// Destination UDP port (the platform's).
    #[arg(long, default_value_t = 9000)]
    dst_port: u16,
    /// Add an 802.1Q tag with this TCI (VLAN id in the low 12 bits).
    #[arg(long, value_name = "TCI")]
    vlan: Option<u16>,
    /// Seed of every random choice (and of synthetic images).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// request_id of the first request.
    #[arg(long, default_value_t = 1, value_name = "ID")]
    first_request_id: u64,
    /// Deployed if_ids, to compute each request's expected outcome:
    /// 1,2 or 1:150528,2 (ID:INPUT_BYTES; default size: the payload's).
    #[arg(long, value_name = "LIST")]
    deployed: Option<String>,
    /// Print nothing on success.
    #[arg(long, short)]
    quiet: bool,
}

fn amount(rate: Option<f64>, count: Option<u64>) -> Option<Amount> {
    rate.map(Amount::Rate).or(count.map(Amount::Count))
}

fn main() -> Result<()> {
    let a = Args::parse();
    let inputs = a.inputs.load(a.seed).context("loading --input")?;
    let malformed_kinds = match &a.malformed_kinds {
        None => FaultKind::ALL.to_vec(),
        Some(names) => names
            .iter()
            .map(|n| {
                FaultKind::from_name(n.trim())
                    .with_context(|| format!("unknown --malformed-kinds entry {n:?}"))
            })
            .collect::<Result<_>>()?,
    };
    let payload_len = u32::try_from(a.inputs.shape.len()).context("payload too large")?;
    let deployed = a
        .deployed
        .as_deref()
        .map(|s| parse_deployed(s, payload_len))
        .transpose()
        .map_err(anyhow::Error::msg)?;
    let src_ports = parse_ports(&a.src_ports).map_err(anyhow::Error::msg)?;
    if src_ports.is_empty() {
        bail!("--src-ports is empty");
    }
    let cfg = GenConfig {
        requests: a.requests,
        if_mix: a.if_mix.or(a.if_ids).unwrap_or(IfMix::RoundRobin(vec![1])),
        frag_size: a.frag_size,
        interleave: a.interleave,
        shuffle_window: a.shuffle_window,
        faults: FaultPlan {
            duplicates: amount(a.dup_rate, a.dup_count),
            missing: amount(a.missing_rate, a.missing_count),
            disagree: amount(a.disagree_rate, a.disagree_count),
            malformed: amount(a.malformed_rate, a.malformed_each),
            malformed_kinds,
            corrupt: amount(a.corrupt_rate, a.corrupt_count),
        },
        gap_ns: a.gap_us.checked_mul(1_000).context("--gap-us too large")?,
        start_ts_ns: a.start_ns,
        endpoints: Endpoints {
            src_mac: a.src_mac,
            dst_mac: a.dst_mac,
            vlan_tci: a.vlan,
            src_ip: a.src_ip,
            dst_ip: a.dst_ip,
            src_ports,
            dst_port: a.dst_port,
        },
        seed: a.seed,
        first_request_id: a.first_request_id,
        deployed,
    };
    let run = generate(&cfg, &inputs)?;

    let file =
        std::fs::File::create(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    let packets = run
        .write_pcap(&inputs, BufWriter::new(file))
        .with_context(|| format!("writing {}", a.out.display()))?;

    let m = run.manifest();
    if let Some(path) = &a.manifest {
        let file =
            std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
        let mut w = BufWriter::new(file);
        serde_json::to_writer_pretty(&mut w, m)?;
        w.write_all(b"\n")?;
        w.flush()
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if !a.quiet {
        let t = &m.totals;
        eprintln!(
            "kp-gen: {packets} packets -> {}: {} requests of {} fragments; {} well-formed ({} duplicates, {} disagreeing, {} corrupted), {} missing, {} malformed, {} not for us",
            a.out.display(),
            t.requests,
            m.requests.first().map(|r| r.frag_count).unwrap_or(0),
            t.well_formed,
            t.duplicates,
            t.disagreeing,
            t.corrupted,
            t.missing,
            t.malformed_total,
            t.not_for_us_total,
        );
        if let Some(e) = &t.expected {
            let parts: Vec<String> = e.iter().map(|(k, v)| format!("{k} {v}")).collect();
            eprintln!("kp-gen: expected outcomes: {}", parts.join(", "));
        }
    }
    Ok(())
}
