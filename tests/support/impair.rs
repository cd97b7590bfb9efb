//! A lossy wire, and captures of what really crossed it.
//!
//! The kernels of the test machines have no netem (`tc qdisc ... netem`:
//! "Specified qdisc kind is unknown"), but nftables' netdev hooks work. A
//! drop verdict on the *egress* hook of the client's veth is counted but
//! not honoured for frames injected through AF_PACKET (tcpreplay); on the
//! *ingress* hook of a bridge port it is. So [`Impairment`] puts nft
//! ingress rules on the two ports of the bridge namespace that
//! `scripts/netns.sh up NAME --bridge` makes: each frame that enters the
//! bridge from one side is dropped with probability `drop_per_mille`/1000
//! and, if it survives, copied once more (`dup to` the port towards the
//! other side) with probability `dup_per_mille`/1000. Named counters count
//! every frame that entered, every drop and every copy, per direction, so
//! what the far side received is exactly `entered - dropped + duplicated`.
//!
//! [`Capture`] is tcpdump writing a pcap of one interface in one
//! namespace; it reports how many frames it captured and how many the
//! kernel dropped before it could (which must be none for the capture to
//! stand for what crossed the wire).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use serde_json::Value;

use crate::{run, NetnsPair};

/// One direction's counters (see [`Impairment::counters`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Direction {
    /// Frames that entered the bridge on that side.
    pub entered: u64,
    /// Of those, dropped.
    pub dropped: u64,
    /// Of those not dropped, sent twice.
    pub duplicated: u64,
}

impl Direction {
    /// Frames that left the bridge on the far side.
    pub fn delivered(&self) -> u64 {
        self.entered - self.dropped + self.duplicated
    }
}

/// Loss and duplication by nftables in a bridged network's bridge
/// namespace (both directions), and nothing else on that wire from the
/// client's kernel. Removed with the namespaces.
#[derive(Debug)]
pub struct Impairment {
    bridge_ns: String,
}

/// The nft table of the impairment, in the bridge namespace.
const TABLE: &str = "kpl_impair";

impl Impairment {
    /// Installs the rules in `net` (made with `--bridge`): the same
    /// probabilities both ways. Also stops the client namespace's kernel
    /// from answering the platform's answers with ICMP port unreachable
    /// (nothing listens on a traffic generator's ports), which would cross
    /// the bridge and be impaired and counted as requests are.
    pub fn install(net: &NetnsPair, drop_per_mille: u32, dup_per_mille: u32) -> Result<Impairment> {
        ensure!(
            drop_per_mille <= 1000 && dup_per_mille <= 1000,
            "per mille values above 1000: {drop_per_mille}, {dup_per_mille}"
        );
        let bns = net.get("BRIDGE_NS");
        let bc = net.get("BRIDGE_CLIENT_IF");
        let bp = net.get("BRIDGE_PLATFORM_IF");
        let chain = |name: &str, dev: &str, to: &str| {
            format!(
                "  chain {name} {{\n    type filter hook ingress device \"{dev}\" priority 0; policy accept;\n    \
                 counter name \"{name}_entered\"\n    \
                 numgen random mod 1000 < {drop_per_mille} counter name \"{name}_dropped\" drop\n    \
                 numgen random mod 1000 < {dup_per_mille} counter name \"{name}_duplicated\" dup to \"{to}\"\n  }}\n"
            )
        };
        let mut rules = format!("table netdev {TABLE} {{\n");
        for dir in ["to_platform", "to_client"] {
            for what in ["entered", "dropped", "duplicated"] {
                rules += &format!("  counter {dir}_{what} {{}}\n");
            }
        }
        rules += &chain("to_platform", bc, bp);
        rules += &chain("to_client", bp, bc);
        rules += "}\n";
        nft(bns, &rules).context(
            "CANNOT INSTALL THE NFTABLES RULES: this test needs `nft` (Debian's nftables, \
             scripts/setup.sh installs it) and netdev ingress hooks",
        )?;
        nft(
            net.get("CLIENT_NS"),
            &format!(
                "table ip {TABLE} {{\n  counter icmp_suppressed {{}}\n  chain out {{\n    \
                 type filter hook output priority 0; policy accept;\n    \
                 icmp type destination-unreachable counter name \"icmp_suppressed\" drop\n  }}\n}}\n"
            ),
        )?;
        Ok(Impairment {
            bridge_ns: bns.to_string(),
        })
    }

    /// The counters now: (towards the platform, towards the client).
    pub fn counters(&self) -> Result<(Direction, Direction)> {
        let c = counters(&self.bridge_ns)?;
        let get = |name: &str| {
            c.get(name)
                .copied()
                .with_context(|| format!("no nft counter {name}: {c:?}"))
        };
        let dir = |d: &str| -> Result<Direction> {
            Ok(Direction {
                entered: get(&format!("{d}_entered"))?,
                dropped: get(&format!("{d}_dropped"))?,
                duplicated: get(&format!("{d}_duplicated"))?,
            })
        };
        Ok((dir("to_platform")?, dir("to_client")?))
    }
}

/// Loads an nft ruleset into namespace `ns`.
fn nft(ns: &str, rules: &str) -> Result<()> {
    let mut child = Command::new("ip")
        .args(["netns", "exec", ns, "nft", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("spawning nft")?;
    std::io::Write::write_all(&mut child.stdin.take().expect("piped"), rules.as_bytes())?;
    let out = child.wait_with_output()?;
    ensure!(
        out.status.success(),
        "nft in {ns} failed ({}): {}\nrules:\n{rules}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// The packet counts of the named counters of the impairment table in
/// namespace `ns` (`nft -j list counters`).
fn counters(ns: &str) -> Result<BTreeMap<String, u64>> {
    let out = run(Command::new("ip").args([
        "netns", "exec", ns, "nft", "-j", "list", "counters", "table", "netdev", TABLE,
    ]))?;
    let v: Value = serde_json::from_str(&out).context("nft -j output")?;
    let mut c = BTreeMap::new();
    for item in v["nftables"].as_array().context("nft -j: no list")? {
        if let Some(counter) = item.get("counter") {
            let name = counter["name"].as_str().context("counter name")?;
            let packets = counter["packets"].as_u64().context("counter packets")?;
            c.insert(name.to_string(), packets);
        }
    }
    Ok(c)
}

/// What tcpdump said when it stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CaptureStats {
    /// Frames written to the pcap.
    pub captured: u64,
    /// Frames the kernel dropped before tcpdump read them.
    pub dropped_by_kernel: u64,
}

/// tcpdump capturing one interface of one namespace into a pcap (both
/// directions, the first `snaplen` bytes of each frame; the pcap keeps
/// each frame's true length). Killed if dropped without [`Capture::stop`].
#[derive(Debug)]
pub struct Capture {
    child: Option<Child>,
    stderr: Receiver<String>,
}

impl Capture {
    /// Starts tcpdump and waits (10 s at most) until it says it is
    /// listening.
    pub fn start(ns: &str, iface: &str, pcap: &Path, snaplen: u32) -> Result<Capture> {
        let mut child = Command::new("ip")
            .args(["netns", "exec", ns, "tcpdump", "-n", "-i", iface])
            .args(["-s", &snaplen.to_string()])
            // 64 MiB of kernel buffer: bursts of tcpreplay must not outrun it.
            .args(["-B", "65536", "-w"])
            .arg(pcap)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("spawning tcpdump (scripts/setup.sh installs it)")?;
        let stderr = child.stderr.take().expect("piped");
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let capture = Capture {
            child: Some(child),
            stderr: rx,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut said = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match capture.stderr.recv_timeout(left) {
                // "tcpdump: listening on IFACE, link-type EN10MB ..."
                Ok(line) if line.contains("listening on") => return Ok(capture),
                Ok(line) => said.push(line),
                Err(_) => bail!(
                    "tcpdump on {ns}/{iface} is not listening after 10 s: {}",
                    said.join("\n")
                ),
            }
        }
    }

    /// Stops it (SIGINT: it flushes the pcap) and returns its counts.
    pub fn stop(mut self) -> Result<CaptureStats> {
        let child = self.child.as_mut().expect("running");
        // If this fails, the drop kills it.
        run(Command::new("kill").args(["-INT", &child.id().to_string()]))?;
        let status = child.wait()?;
        self.child = None;
        // The reader thread ends at the pipe's end, after the last line.
        let text: Vec<String> = self.stderr.iter().collect();
        let text = text.join("\n");
        ensure!(status.success(), "tcpdump failed ({status}): {text}");
        let count = |what: &str| -> Result<u64> {
            text.lines()
                .find_map(|l| l.strip_suffix(what))
                .and_then(|n| n.trim().parse().ok())
                .with_context(|| format!("tcpdump did not say {what:?}: {text}"))
        };
        Ok(CaptureStats {
            captured: count(" packets captured")?,
            dropped_by_kernel: count(" packets dropped by kernel")?,
        })
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
