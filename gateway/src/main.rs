//! The `kp-gateway` binary: parses its options, loads the served models,
//! connects the client, serves HTTP until SIGINT/SIGTERM, then prints its
//! counters as one JSON line on stdout.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Parser;
use kneepoint_client::Config;
use kp_gateway::bridge::Bridge;
use kp_gateway::http::{self, Gateway, Limits};
use kp_gateway::models::{self, ModelArg};
use serde_json::json;

/// A KServe v2 (Open Inference Protocol) HTTP gateway to a kneepoint platform.
#[derive(Debug, Parser)]
#[command(name = "kp-gateway", version)]
struct Args {
    /// The platform's UDP address (the if-manager's IP:PORT).
    #[arg(long, value_name = "IP:PORT")]
    platform: String,
    /// The model repository (read for names, if_ids and tensor shapes).
    #[arg(long, value_name = "DIR", default_value = "models")]
    models: PathBuf,
    /// Serve this model (repeatable; default: every model of the
    /// repository); NAME=IF_ID when it is deployed under another if_id.
    #[arg(long = "model", value_name = "NAME[=IF_ID]")]
    model: Vec<ModelArg>,
    /// HTTP address to listen on.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8000")]
    listen: SocketAddr,
    /// Runtime worker threads.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// A platform request's timeout, ms (504 after it).
    #[arg(long, value_name = "MS", default_value_t = 1000)]
    timeout_ms: u64,
    /// Batch items per infer request at most.
    #[arg(long, default_value_t = 8)]
    max_batch: usize,
    /// Connections at once at most.
    #[arg(long, default_value_t = 1024)]
    max_connections: usize,
    /// Request bodies held in memory at once, MiB.
    #[arg(long, value_name = "MIB", default_value_t = 256)]
    max_body_mib: usize,
    /// A request head must arrive within this, ms.
    #[arg(long, value_name = "MS", default_value_t = 5000)]
    header_timeout_ms: u64,
    /// A request body must arrive within this, ms.
    #[arg(long, value_name = "MS", default_value_t = 10_000)]
    body_timeout_ms: u64,
    /// Payload bytes per UDP fragment (kneepoint-client's default: 1024).
    #[arg(long, default_value_t = kneepoint_client::DEFAULT_FRAGMENT_PAYLOAD)]
    fragment_payload: usize,
}

fn main() -> Result<()> {
    let args = Args::parse();
    anyhow::ensure!(args.threads >= 1, "--threads must be >= 1");
    anyhow::ensure!(args.max_batch >= 1, "--max-batch must be >= 1");
    anyhow::ensure!(args.timeout_ms >= 1, "--timeout-ms must be >= 1");
    let served = models::load(&args.models, &args.model)?;
    let client = Config::builder(args.platform.as_str())
        .timeout(Duration::from_millis(args.timeout_ms))
        .fragment_payload(args.fragment_payload)
        .connect()
        .with_context(|| format!("platform {}", args.platform))?;
    let limits = Limits {
        max_batch: args.max_batch,
        timeout: Duration::from_millis(args.timeout_ms),
        body_timeout: Duration::from_millis(args.body_timeout_ms),
        max_body_bytes: args.max_body_mib.saturating_mul(1 << 20),
        ready_ttl: Duration::from_secs(1),
    };
    let names: Vec<String> = served
        .values()
        .map(|m| format!("{}={}", m.name, m.if_id))
        .collect();
    let gw = Arc::new(Gateway::new(served, Bridge::new(client)?, limits));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.threads)
        .enable_all()
        .build()?;
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind(args.listen)
            .await
            .with_context(|| format!("listening on {}", args.listen))?;
        eprintln!(
            "kp-gateway: ready on http://{} for {} -> {}",
            listener.local_addr()?,
            names.join(", "),
            args.platform
        );
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        let shutdown = async move {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        };
        http::serve(
            listener,
            http::router(gw.clone()),
            args.max_connections,
            Duration::from_millis(args.header_timeout_ms),
            shutdown,
        )
        .await;
        anyhow::Ok(())
    })?;
    // Connections still open are cut when the runtime goes.
    rt.shutdown_timeout(Duration::from_millis(200));
    let stats = gw.bridge.client().stats();
    println!(
        "{}",
        json!({
            "gateway": gw.counters.report(),
            "client": {
                "submitted": stats.submitted,
                "answered": stats.answered,
                "timed_out": stats.timed_out,
                "late": stats.late,
            },
        })
    );
    Ok(())
}
