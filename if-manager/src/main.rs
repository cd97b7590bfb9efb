//! The `if-manager` binary: a DPDK primary process that owns the NIC.
//!
//! Start-up: EAL (arguments after `--`), the shared mbuf pool, port 0 with
//! one RX and one TX queue, the shared TX ring, the IF rings named on the
//! command line, the control socket. Then it says it is ready (the
//! "if-manager: ready" log line; with `--notify-fd`, a
//! `kp_schema::messages::Readiness` line there too) and the poll loop runs on the main
//! lcore until SIGINT/SIGTERM, a control `shutdown` or `--exit-when-idle`.
//! At exit it prints the final counters as one JSON object on stdout, frees
//! every mbuf still queued, and removes its hugepage files and runtime
//! directory.

use std::io::Write;
use std::os::fd::OwnedFd;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::channel;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;
use dpdk::{Eal, Mempool, Port, PortId, ProcessType, Ring, RingFlags};
use serde_json::{json, Value};

use if_manager::classify::DstFilter;
use if_manager::config::{names, Args, MBUF_HEADROOM};
use if_manager::control::{self, Gate, Registry};
use if_manager::dataplane::DataPlane;
use if_manager::outcome::Counters;
use if_manager::routes::RouteTable;
use if_manager::shed::Shedder;
use kp_schema::messages::{Readiness, ReadyRole};
use kp_wire::answered::AnsweredTable;
use libml::backoff::IdleBackoff;
use libml::runtime::handover::TxBell;

/// Per-lcore mempool cache: DPDK's recommended size for bursts of 32.
const MBUF_CACHE: u32 = 256;

fn main() -> ExitCode {
    let args = Args::parse();
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("if-manager: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: Args) -> Result<()> {
    // Every thread started from here on inherits the slack.
    if let Some(us) = args.timer_slack_us {
        kp_os::priority::set_timer_slack_current_thread(Duration::from_micros(us))
            .context("--timer-slack-us")?;
    }
    // Before EAL opens anything: a descriptor open at that number now is
    // the one the parent passed.
    let notify = args
        .notify_fd
        .map(kp_os::inherit::claim)
        .transpose()
        .context("--notify-fd")?;
    // SIGTERM/SIGINT set a flag from before the EAL on: a stop asked for
    // while it starts must not kill the primary inside a DPDK call holding
    // a lock of the shared memory (see kp-if). A stop that came during
    // start-up ends `serve` at once, with its report.
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone()).context("installing signal handlers")?;
    }
    let mut eal_argv = vec!["if-manager".to_string()];
    eal_argv.extend(args.eal.iter().cloned());
    let eal = Eal::init(&eal_argv).context("DPDK EAL initialisation failed")?;
    if eal.process_type() != ProcessType::Primary {
        bail!("the if-manager must be the DPDK primary process (drop --proc-type)");
    }
    let socket = eal.socket_id();

    let result = serve(&args, socket, notify, stop);
    // The report first: it is complete once `serve` returns, and whoever
    // waits for it (the orchestrator gives a stopping if-manager 10 s
    // before it kills it) must not depend on how long the EAL's cleanup
    // takes with secondaries killed mid-request.
    let written = result.and_then(|report| {
        let text = serde_json::to_string(&report)?;
        println!("{text}");
        std::io::stdout().flush()?;
        if let Some(path) = &args.stats_json {
            std::fs::write(path, format!("{text}\n"))
                .with_context(|| format!("writing {}", path.display()))?;
        }
        Ok(())
    });
    // Whatever happened, give back hugepages and the runtime directory.
    let started = Instant::now();
    if let Err(e) = eal.cleanup() {
        eprintln!("if-manager: cleanup: {e}");
    }
    if started.elapsed() > Duration::from_secs(1) {
        eprintln!("if-manager: the EAL's cleanup took {:?}", started.elapsed());
    }
    written
}

/// Everything between EAL init and cleanup; every DPDK object is dropped
/// (in the right order: port, rings, pool) before it returns.
fn serve(
    args: &Args,
    socket: dpdk::SocketId,
    notify: Option<OwnedFd>,
    stop: Arc<AtomicBool>,
) -> Result<Value> {
    let pool = Mempool::create_pktmbuf(
        names::MEMPOOL,
        args.mbufs,
        MBUF_CACHE,
        // Per-mbuf data room: --max-frame (jumbo by default) + headroom, so
        // a frame up to it is one segment, as the IFs read it.
        args.max_frame + MBUF_HEADROOM,
        socket,
    )
    .context("creating the mbuf pool")?;
    if Port::count_avail() == 0 {
        bail!("no DPDK port: give one after --, e.g. --vdev net_pcap0,rx_pcap=in.pcap,tx_pcap=out.pcap");
    }
    let port =
        Port::init(PortId(0), &pool, args.rx_desc, args.tx_desc).context("configuring port 0")?;
    // af_packet and real NICs must see frames addressed to any MAC (the
    // clients know the platform by IP); drivers without the notion say so.
    if let Err(e) = port.promiscuous_enable() {
        eprintln!("if-manager: warning: cannot enable promiscuous mode: {e}");
    }
    port.start().context("starting port 0")?;
    let tx_ring = Ring::create(
        names::TX_RING,
        args.tx_ring_size,
        socket,
        RingFlags {
            single_producer: false,
            single_consumer: true,
        },
    )
    .context("creating the TX ring")?;
    let tx_bell = TxBell::create(socket).context("creating the TX ring's doorbell")?;

    let (updates_tx, updates_rx) = channel();
    let gate = Arc::new(Gate::new(args.await_ifs));
    let registry = Arc::new(Mutex::new(Registry::new(
        updates_tx,
        socket,
        args.ring_size,
        gate.clone(),
    )));
    for (if_id, size) in &args.ifs {
        registry
            .lock()
            .expect("not poisoned yet")
            .register(*if_id, *size)
            .map_err(anyhow::Error::msg)?;
    }

    let counters = Arc::new(Counters::default());
    let control = args.control.clone().map(|endpoint| {
        let (registry, counters, stop) = (registry.clone(), counters.clone(), stop.clone());
        std::thread::Builder::new()
            .name("kp-control".into())
            .spawn(move || {
                if let Err(e) = control::serve(&endpoint, registry, counters, stop.clone()) {
                    eprintln!("if-manager: control: {e}");
                    stop.store(true, Ordering::Relaxed);
                }
            })
            .expect("spawning the control thread")
    });

    let stats_printer = args.stats_every.map(|every| {
        let (counters, stop) = (counters.clone(), stop.clone());
        std::thread::Builder::new()
            .name("kp-stats".into())
            .spawn(move || print_stats_every(every, &counters, &stop))
            .expect("spawning the stats thread")
    });

    let mut dp = DataPlane {
        port: &port,
        tx_ring: &tx_ring,
        tx_bell: &tx_bell,
        routes: RouteTable::new(updates_rx),
        filter: DstFilter {
            port: args.port,
            ip: args.ip,
        },
        answered: AnsweredTable::new(args.answered_capacity, args.answered_ttl_ms * 1_000_000),
        shedder: Shedder::new(args.answered_capacity, args.answered_ttl_ms * 1_000_000),
        counters: counters.clone(),
        stop: stop.clone(),
        exit_when_idle: args.exit_when_idle,
        backoff: IdleBackoff::receiver(args.busy_poll),
        gate,
    };
    dp.apply_route_updates();
    eprintln!(
        "if-manager: ready: port {} ({}) mac {} udp/{} ifs {:?}",
        port.id().0,
        port.name(),
        port.mac_addr(),
        args.port,
        args.ifs.iter().map(|(id, _)| id.0).collect::<Vec<_>>(),
    );
    if let Some(fd) = notify {
        let ready = Readiness {
            pid: std::process::id(),
            role: ReadyRole::Serving,
            if_id: None,
        };
        if let Err(e) = ready.write_to(std::fs::File::from(fd)) {
            eprintln!("if-manager: warning: cannot say it is ready on --notify-fd: {e}");
        }
    }
    let started = Instant::now();
    let reason = dp.run();
    let run_seconds = started.elapsed().as_secs_f64();

    stop.store(true, Ordering::Relaxed);
    let stopping = Instant::now();
    for t in [control, stats_printer].into_iter().flatten() {
        let _ = t.join();
    }
    if stopping.elapsed() > Duration::from_secs(1) {
        eprintln!(
            "if-manager: its threads took {:?} to stop",
            stopping.elapsed()
        );
    }
    // The final reading, on the thread that owns the port (as every
    // reading is: see if_manager::port_stats).
    counters.port.publish(&port.stats());
    // Closing flushes net_pcap's TX file and returns RX descriptors' mbufs.
    for (what, r) in [("stop", port.stop()), ("close", port.close())] {
        if let Err(e) = r {
            eprintln!("if-manager: warning: port {what}: {e}");
        }
    }

    // Free every fragment and response still queued.
    let mut drained = serde_json::Map::new();
    for (if_id, route) in dp.routes.take_all() {
        drained.insert(if_id.0.to_string(), json!(route.ring.free_queued()));
    }
    let tx_drained = tx_ring.free_queued();
    if stopping.elapsed() > Duration::from_secs(1) {
        eprintln!(
            "if-manager: stopping took {:?} up to the rings' drain",
            stopping.elapsed()
        );
    }
    let ifs = registry
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .routes_json();
    drop(dp);
    drop(tx_ring);

    let mut report = counters.to_json();
    report["stop_reason"] = json!(reason.name());
    report["run_seconds"] = json!(run_seconds);
    report["ifs"] = ifs;
    report["drained_at_exit"] = json!({ "if_rings": drained, "tx_ring": tx_drained });
    report["mempool"] = json!({
        "size": pool.size(),
        "max_frame": args.max_frame,
        "in_use_at_exit": pool.in_use_count(),
    });
    Ok(report)
}

/// The `--stats-every` thread: one JSON line of counters on stderr per
/// period, until stopped.
fn print_stats_every(every: Duration, counters: &Counters, stop: &AtomicBool) {
    let start = Instant::now();
    let mut next = start + every;
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        if now >= next {
            let mut line = counters.to_json();
            line["t"] = json!(now.duration_since(start).as_secs_f64());
            eprintln!("{line}");
            next += every;
        }
        std::thread::sleep(Duration::from_millis(10).min(next.saturating_duration_since(now)));
    }
}
