//! `orchestrator`: kneepoint's control plane daemon.
//!
//! `orchestrator --config configs/platform.toml` starts the if-manager and
//! the inference functions the config names, serves the control socket
//! (`kpctl`), keeps a parked shadow beside every active IF, re-provisions
//! IFs through it, tunes their shares, and replaces what dies. SIGINT or
//! SIGTERM (or `kpctl shutdown`) stops everything it started; the final
//! summary (switchover gaps per IF) is printed as one JSON line.
//!
//! `orchestrator --probe` only says, as JSON, what the orchestrator would
//! share on this machine: the cores hwloc sees (NIC-local first, given
//! `--nic`), whether there is an NVIDIA GPU, and whether CUDA MPS runs to
//! enforce GPU shares (it starts the MPS control daemon if installed, as
//! the daemon does).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Parser;
use orchestrator::config::PlatformConfig;
use orchestrator::control::{BindOptions, ControlServer};
use orchestrator::daemon::Daemon;

#[derive(Debug, Parser)]
#[command(name = "orchestrator", version, about = "kneepoint's control plane")]
struct Args {
    /// The platform configuration (see configs/platform.toml).
    #[arg(long, required_unless_present = "probe")]
    config: Option<PathBuf>,
    /// Print what would be shared here (cores, GPU, MPS) and exit.
    #[arg(long)]
    probe: bool,
    /// With --probe: the NIC (PCI address or interface) to rank cores by.
    #[arg(long, requires = "probe")]
    nic: Option<String>,
    /// Sockets, logs, decisions and the state file (default: the config's,
    /// else /run/kneepoint for root, else $XDG_RUNTIME_DIR/kneepoint).
    #[arg(long)]
    runtime_dir: Option<PathBuf>,
    /// The control endpoint (default: ipc://RUNTIME_DIR/orchestrator.sock).
    #[arg(long)]
    control: Option<String>,
    /// Also write the final summary here.
    #[arg(long)]
    summary_json: Option<PathBuf>,
}

fn main() -> ExitCode {
    init_logging();
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("orchestrator: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Logs: the libraries' `tracing` events on stderr, one line each, the
/// message alone (each names its process, as the log readers in scripts/
/// expect), at INFO and above unless `RUST_LOG` says otherwise.
fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .without_time()
        .with_target(false)
        .with_level(false)
        .with_ansi(false)
        .init();
}

fn run(args: Args) -> Result<()> {
    if args.probe {
        return probe(args.nic.as_deref());
    }
    let cfg = PlatformConfig::load(args.config.as_deref().context("--config is required")?)?;
    let runtime_dir = args
        .runtime_dir
        .or_else(|| cfg.platform.runtime_dir.clone())
        .unwrap_or_else(default_runtime_dir);
    let endpoint = args
        .control
        .or_else(|| cfg.platform.control.clone())
        .unwrap_or_else(|| format!("ipc://{}", runtime_dir.join("orchestrator.sock").display()));
    let mut server = ControlServer::bind(
        &endpoint,
        BindOptions {
            allow_remote: cfg.platform.allow_remote_control,
        },
    )
    .with_context(|| format!("binding the control socket {endpoint}"))?;
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone()).context("installing signal handlers")?;
    }
    let daemon = Daemon::start(cfg, runtime_dir)?;
    eprintln!("orchestrator: ready: control on {endpoint}");
    let summary = daemon.run(&mut server, &stop);
    let text = summary.to_string();
    println!("{text}");
    if let Some(p) = &args.summary_json {
        std::fs::write(p, format!("{text}\n"))
            .with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(())
}

/// `--probe`: the machine as the orchestrator would share it.
fn probe(nic: Option<&str>) -> Result<()> {
    use orchestrator::gpu;
    use orchestrator::topology::{NicHint, Topology};
    let nic = nic.map_or(NicHint::Unknown, NicHint::parse);
    let (topology, hwloc_error) = match Topology::discover() {
        Ok(t) => (t, None),
        Err(e) => (Topology::fallback(), Some(e.to_string())),
    };
    let gpu_json = if gpu::gpu_present() {
        // Changes nothing: the daemon is started by a running orchestrator
        // with its first GPU IF, not by a probe.
        let mps = gpu::probe_mps();
        serde_json::json!({
            "present": true,
            "names": gpu::gpu_names(),
            "mps": mps,
            "gpu_if_shares_enforceable": !matches!(mps, gpu::MpsState::NotInstalled | gpu::MpsState::Failed(_)),
            "note": format!(
                "{}; IFs of GPU engines (engine = \"cudnn\") get CUDA MPS percentages, enforced only while the daemon runs; other IFs get cores",
                mps.describe()
            ),
        })
    } else {
        serde_json::json!({
            "present": false,
            "note": "no NVIDIA GPU here (/dev/nvidiactl, /dev/nvidia0): a share is a set of cores and as many engine threads",
        })
    };
    let out = serde_json::json!({
        "cores_for_ifs": topology.cores_near_nic(&nic),
        "topology": topology.summary(&nic),
        "hwloc_error": hwloc_error,
        "gpu": gpu_json,
    });
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(())
}

fn default_runtime_dir() -> PathBuf {
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(d) if orchestrator::control::server::effective_uid().is_none_or(|u| u != 0) => {
            PathBuf::from(d).join("kneepoint")
        }
        _ => PathBuf::from("/run/kneepoint"),
    }
}
