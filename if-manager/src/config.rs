//! Command line of the `if-manager` binary.
//!
//! `if-manager [OPTIONS] -- [EAL ARGS]`: our own options first, DPDK's EAL
//! arguments after `--`, as DPDK applications take them. The same binary
//! runs on a pcap file (`--vdev net_pcap0,rx_pcap=in.pcap,tx_pcap=out.pcap`),
//! on a veth pair (`--vdev net_af_packet0,iface=veth1`) or on a real NIC.

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use kp_wire::IfId;

/// Shared-memory names (re-exported from libml, which IFs use too).
pub use kp_schema::names;

/// kneepoint's data plane: takes request fragments off the NIC, routes them
/// without a copy to inference-function rings, and sends their answers.
#[derive(Debug, Parser)]
#[command(name = "if-manager", version, after_help = EAL_HELP)]
pub struct Args {
    /// UDP port the platform listens on.
    #[arg(long, default_value_t = 9000)]
    pub port: u16,

    /// Only accept datagrams to this IPv4 address (default: any).
    #[arg(long)]
    pub ip: Option<Ipv4Addr>,

    /// Register an inference function's ring at start-up: ID or ID:RING_SIZE.
    /// Repeatable. More can be registered at run time on --control.
    #[arg(long = "if", value_name = "ID[:RING_SIZE]", value_parser = parse_if_spec)]
    pub ifs: Vec<(IfId, Option<u32>)>,

    /// Default size of an IF's fragment ring (a power of two; one slot is
    /// kept empty by DPDK, so it holds RING_SIZE-1 fragments).
    #[arg(long, default_value_t = 4096, value_parser = parse_pow2)]
    pub ring_size: u32,

    /// Size of the shared response (TX) ring.
    #[arg(long, default_value_t = 4096, value_parser = parse_pow2)]
    pub tx_ring_size: u32,

    /// Number of packet buffers (mbufs) in the shared pool. Must cover the
    /// RX descriptors, every ring's capacity and the IFs' in-flight requests.
    #[arg(long, default_value_t = 32767)]
    pub mbufs: u32,

    /// Largest Ethernet frame (bytes, without the FCS) one mbuf holds: each
    /// mbuf gets this much data room plus DPDK's 128-byte headroom. The
    /// default, 10240, takes any frame of a 9216-byte MTU (jumbo
    /// fragments) in one segment; a larger frame arrives chained and is
    /// counted `segmented`. On net_af_packet give the vdev
    /// `framesz=10240,blocksz=20480` too (the PMD refuses a frame size that
    /// does not fit the mbuf). 2048 (a 1500-byte MTU) costs a quarter of
    /// the hugepage memory: README "Jumbo frames".
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_MAX_FRAME,
          value_parser = parse_max_frame)]
    pub max_frame: u16,

    /// RX descriptors of the port's queue.
    #[arg(long, default_value_t = 1024)]
    pub rx_desc: u16,

    /// TX descriptors of the port's queue.
    #[arg(long, default_value_t = 1024)]
    pub tx_desc: u16,

    /// Exit once nothing was received or sent for this many seconds and no
    /// IF is live (said `ready` and not `goodbye`), for offline replay.
    #[arg(long, value_name = "SECONDS", value_parser = parse_seconds)]
    pub exit_when_idle: Option<Duration>,

    /// Write the final counters, as one JSON object, to this file too.
    #[arg(long, value_name = "PATH")]
    pub stats_json: Option<PathBuf>,

    /// Print the counters as one JSON line on stderr every SECONDS (with a
    /// monotonic `t` in seconds), for live monitoring and benchmarks.
    #[arg(long, value_name = "SECONDS", value_parser = parse_seconds)]
    pub stats_every: Option<Duration>,

    /// ZeroMQ endpoint of the control socket (REP), e.g.
    /// ipc:///run/kneepoint/ifm.sock or tcp://127.0.0.1:5555.
    #[arg(long, value_name = "ENDPOINT")]
    pub control: Option<String>,

    /// Say when it serves on this inherited descriptor: one JSON
    /// `kp_schema::messages::Readiness` line, as the orchestrator expects.
    /// Without it only the "if-manager: ready" log line says so.
    #[arg(long, value_name = "FD")]
    pub notify_fd: Option<i32>,

    /// Do not poll RX until this many IFs have said `ready` on the control
    /// socket (so an offline replay does not start before its IFs can
    /// serve). Needs --control.
    #[arg(long, default_value_t = 0, requires = "control")]
    pub await_ifs: usize,

    /// Never pause or sleep when idle (pure polling, for benchmarks).
    #[arg(long)]
    pub busy_poll: bool,

    /// How late the idle back-off's sleeps may end, µs (the threads' timer
    /// slack; the kernel's default is 50). 1 makes its 10 µs first sleep
    /// last 10 µs rather than up to 60: a request's fragments then wait
    /// less in the kernel's ring on a core the if-manager shares, at the
    /// price of more wake-ups under load (docs/PERFORMANCE-JOURNAL.md, "After the
    /// last fragment").
    #[arg(long, value_name = "US", value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub timer_slack_us: Option<u64>,

    /// How long a request answered UNKNOWN_IF is remembered, in ms.
    #[arg(long, default_value_t = 2000)]
    pub answered_ttl_ms: u64,

    /// Capacity of the table of requests answered UNKNOWN_IF.
    #[arg(long, default_value_t = 16384)]
    pub answered_capacity: usize,

    /// DPDK EAL arguments (after `--`).
    #[arg(last = true, value_name = "EAL ARGS")]
    pub eal: Vec<String>,
}

/// The default of `--max-frame`: a 9216-byte MTU's frame (9216 + 14
/// Ethernet + 4 VLAN bytes) with room to spare, rounded to 10 KiB.
pub const DEFAULT_MAX_FRAME: u16 = 10240;

/// DPDK's `RTE_PKTMBUF_HEADROOM`: free bytes before a received frame.
pub const MBUF_HEADROOM: u16 = 128;

/// The smallest `--max-frame`: a full standard-MTU frame with a VLAN tag.
pub const MIN_MAX_FRAME: u16 = 1522;

fn parse_max_frame(s: &str) -> Result<u16, String> {
    let n: u16 = s
        .parse()
        .map_err(|_| format!("'{s}' is not a number of bytes (up to 65407)"))?;
    if !(MIN_MAX_FRAME..=u16::MAX - MBUF_HEADROOM).contains(&n) {
        return Err(format!(
            "{n} is not in {MIN_MAX_FRAME}..={} (a frame of a 1500-byte MTU up to DPDK's largest mbuf)",
            u16::MAX - MBUF_HEADROOM
        ));
    }
    Ok(n)
}

const EAL_HELP: &str = "\
EAL ARGS examples (after --):
  offline replay:  -l 0 --file-prefix kp1 --no-pci --vdev net_pcap0,rx_pcap=in.pcap,tx_pcap=out.pcap
  veth pair:       -l 0 --file-prefix kp1 --no-pci --vdev net_af_packet0,iface=veth1
Every DPDK process of one platform (if-manager and IFs) uses the same --file-prefix
and a distinct lcore id (e.g. --lcores 0@0 here, --lcores 1@1 in an IF).";

fn parse_if_spec(s: &str) -> Result<(IfId, Option<u32>), String> {
    let (id, size) = match s.split_once(':') {
        Some((id, size)) => (id, Some(parse_pow2(size)?)),
        None => (s, None),
    };
    let id: u16 = id
        .parse()
        .map_err(|_| format!("'{id}' is not an if_id (0..=65535)"))?;
    Ok((IfId(id), size))
}

fn parse_pow2(s: &str) -> Result<u32, String> {
    let n: u32 = s.parse().map_err(|_| format!("'{s}' is not a number"))?;
    if n < 2 || !n.is_power_of_two() {
        return Err(format!("{n} is not a power of two >= 2"));
    }
    Ok(n)
}

fn parse_seconds(s: &str) -> Result<Duration, String> {
    let secs: f64 = s
        .parse()
        .map_err(|_| format!("'{s}' is not a number of seconds"))?;
    if !(secs.is_finite() && secs >= 0.0) {
        return Err(format!("{s} is not a duration"));
    }
    Ok(Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_our_options_and_leaves_eal_args_after_the_double_dash() {
        let a = Args::try_parse_from([
            "if-manager",
            "--port",
            "9100",
            "--if",
            "1",
            "--if",
            "2:1024",
            "--exit-when-idle",
            "0.5",
            "--",
            "-l",
            "0",
            "--vdev",
            "net_pcap0,rx_pcap=a.pcap",
        ])
        .unwrap();
        assert_eq!(a.port, 9100);
        assert_eq!(a.ifs, vec![(IfId(1), None), (IfId(2), Some(1024))]);
        assert_eq!(a.exit_when_idle, Some(Duration::from_millis(500)));
        assert_eq!(a.eal, ["-l", "0", "--vdev", "net_pcap0,rx_pcap=a.pcap"]);
        assert_eq!(a.max_frame, 10240);
        let a = Args::try_parse_from(["if-manager", "--max-frame", "2048"]).unwrap();
        assert_eq!(a.max_frame, 2048);
    }

    #[test]
    fn rejects_bad_values_with_a_reason() {
        for bad in [
            vec!["if-manager", "--if", "70000"],
            vec!["if-manager", "--if", "1:1000"],
            vec!["if-manager", "--ring-size", "3"],
            vec!["if-manager", "--exit-when-idle", "-1"],
            vec!["if-manager", "--max-frame", "1521"],
            vec!["if-manager", "--max-frame", "65408"],
            vec!["if-manager", "--max-frame", "9k"],
        ] {
            assert!(
                Args::try_parse_from(&bad).is_err(),
                "{bad:?} should be rejected"
            );
        }
    }
}
