//! `kp-ring-probe`: a test consumer attached to a running if-manager as a
//! DPDK secondary process.
//!
//! It looks up the named IF rings, dequeues every fragment the if-manager
//! routed there, re-parses each with kp-wire's codec, records where it came
//! from and frees the mbuf. It stops once it has seen `--expect` fragments
//! in all, or nothing arrived for `--idle-ms`, and writes what it saw as
//! JSON (to `--out`, or stdout):
//!
//! ```json
//! {"total": 12, "rings": {"kp_if_1": [[src_port, request_id, frag_index, if_id], ...]},
//!  "unparsable": 0}
//! ```
//!
//! Usage: `kp-ring-probe --ring kp_if_1 --ring kp_if_2 --expect 40 -- EAL ARGS`
//! where the EAL arguments carry `--proc-type secondary`, the if-manager's
//! `--file-prefix` and a distinct lcore (e.g. `--lcores 1@1`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;
use dpdk::{Eal, MbufBurst, ProcessType, Ring};
use kp_wire::{parse_udp_frame, Fragment};
use serde_json::json;

#[derive(Debug, Parser)]
struct Args {
    /// Ring to drain (repeatable).
    #[arg(long = "ring", required = true)]
    rings: Vec<String>,
    /// Stop after this many fragments in all.
    #[arg(long)]
    expect: Option<u64>,
    /// Stop after this long without a fragment.
    #[arg(long, default_value_t = 3000)]
    idle_ms: u64,
    /// Only count fragments (no parsing, no record): for benchmarks, where
    /// the probe must drain faster than the if-manager fills.
    #[arg(long)]
    count_only: bool,
    /// Stop after this many seconds, whatever else.
    #[arg(long)]
    duration_s: Option<f64>,
    /// Write the JSON report here instead of stdout.
    #[arg(long)]
    out: Option<PathBuf>,
    /// EAL arguments (after `--`).
    #[arg(last = true)]
    eal: Vec<String>,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let mut argv = vec!["kp-ring-probe".to_string()];
    argv.extend(args.eal.iter().cloned());
    let eal = Eal::init(&argv).context("EAL init (secondary)")?;
    if eal.process_type() != ProcessType::Secondary {
        bail!("kp-ring-probe must run as a secondary process (--proc-type secondary)");
    }
    let report = drain(&args);
    eal.cleanup().context("EAL cleanup")?;
    let report = report?;
    let text = serde_json::to_string(&report)?;
    match &args.out {
        Some(p) => std::fs::write(p, text)?,
        None => println!("{text}"),
    }
    Ok(())
}

fn drain(args: &Args) -> Result<serde_json::Value> {
    let rings = args
        .rings
        .iter()
        .map(|name| Ring::lookup(name).with_context(|| format!("looking up ring {name}")))
        .collect::<Result<Vec<_>>>()?;
    let mut seen: BTreeMap<String, Vec<[u64; 4]>> =
        args.rings.iter().map(|n| (n.clone(), Vec::new())).collect();
    let mut total = 0u64;
    let mut unparsable = 0u64;
    let mut burst = MbufBurst::<32>::new();
    let mut last = Instant::now();
    let idle = Duration::from_millis(args.idle_ms);
    let start = Instant::now();
    let deadline = args.duration_s.map(|s| start + Duration::from_secs_f64(s));
    loop {
        if deadline.is_some_and(|d| Instant::now() >= d) {
            break;
        }
        let mut got_any = false;
        for (ring, name) in rings.iter().zip(&args.rings) {
            if ring.dequeue_burst(&mut burst) == 0 {
                continue;
            }
            got_any = true;
            if args.count_only {
                total += burst.len() as u64;
                burst.clear();
                continue;
            }
            for mbuf in burst.drain() {
                total += 1;
                let parsed = parse_udp_frame(mbuf.data()).ok().and_then(|udp| {
                    Fragment::new_checked(udp.payload)
                        .ok()
                        .map(|f| (udp.addr.src_port, f))
                });
                match parsed {
                    Some((port, f)) => seen.get_mut(name).expect("known ring").push([
                        u64::from(port),
                        f.request_id(),
                        u64::from(f.frag_index()),
                        u64::from(f.if_id().0),
                    ]),
                    None => unparsable += 1,
                }
                // dropping the mbuf returns it to the shared pool
            }
        }
        if got_any {
            last = Instant::now();
        } else {
            if args.expect.is_some_and(|n| total >= n) || last.elapsed() >= idle {
                break;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    let secs = start.elapsed().as_secs_f64();
    Ok(json!({ "total": total, "rings": seen, "unparsable": unparsable, "seconds": secs }))
}
