//! `kpctl`: the orchestrator's command-line client.
//!
//! `kpctl [--endpoint E] [--json] [--timeout-ms N] COMMAND`, where COMMAND is
//! `deploy`, `retire`, `slo`, `share`, `unpin`, `status`, `shutdown` or
//! `watch`. Replies print as text (a table for `status` and `watch`) or,
//! with `--json`, as the reply's JSON. See `docs/CONTROL.md`.
//!
//! Exit status: 0 the command was carried out; 1 it was refused (the error
//! reply's code and message on stderr); 2 bad usage; 3 no reply (daemon
//! absent, stuck or unreachable) or an unreadable one.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use orchestrator::control::{
    default_endpoint, format_status_table, ControlClient, IfState, Reply, Request, StatusReport,
    StatusRow, ENDPOINT_ENV,
};
use serde_json::Value;

#[derive(Debug, Parser)]
#[command(
    name = "kpctl",
    version,
    about = "Control a running kneepoint orchestrator",
    after_help = "Exit status: 0 done, 1 refused by the orchestrator, 2 bad usage, 3 no reply."
)]
struct Cli {
    /// The orchestrator's control endpoint [default: $KNEEPOINT_CONTROL, else
    /// ipc://$XDG_RUNTIME_DIR/kneepoint/orchestrator.sock, or
    /// ipc:///run/kneepoint/orchestrator.sock for root].
    #[arg(long, global = true, value_name = "ENDPOINT")]
    endpoint: Option<String>,
    /// Print the reply as JSON (one object per line) instead of text.
    #[arg(long, global = true)]
    json: bool,
    /// How long to wait for each reply.
    #[arg(long, global = true, value_name = "MS", default_value_t = 3000)]
    timeout_ms: u64,
    /// After a command that changes an IF (deploy, slo, share, unpin,
    /// retire) was accepted, wait until it has been carried out: the IF no
    /// longer `starting` or `switching` (gone, after retire), asking for
    /// the status every 20 ms in this process. Then print the IF's status
    /// row (one more JSON line with `--json`); exit 1 if it ended `failed`
    /// or the wait timed out.
    #[arg(long, global = true)]
    wait: bool,
    /// The longest `--wait` waits.
    #[arg(long, global = true, value_name = "S", default_value_t = 120)]
    wait_timeout_s: u64,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Start an inference function for a model.
    Deploy {
        /// The IF's id (must be the model's if_id).
        #[arg(long)]
        if_id: u16,
        /// The model's name in the model repository.
        #[arg(long)]
        model: String,
        /// The IF binary (default: the orchestrator's kp-if). Made absolute
        /// here; it must exist.
        #[arg(long)]
        binary: Option<PathBuf>,
        /// Latency objective in ms (default: the model's).
        #[arg(long, value_parser = positive_finite)]
        slo_ms: Option<f64>,
        /// Initial share of the device in percent (default: the model's knee,
        /// else 30).
        #[arg(long, value_parser = finite)]
        share_pct: Option<f64>,
    },
    /// Stop an inference function.
    Retire {
        /// The IF's id.
        if_id: u16,
    },
    /// Change an inference function's latency objective.
    Slo {
        /// The IF's id.
        if_id: u16,
        /// The new objective in ms.
        #[arg(value_parser = positive_finite)]
        slo_ms: f64,
    },
    /// Pin an inference function's share of the device.
    Share {
        /// The IF's id.
        if_id: u16,
        /// The share in percent, in (0, 100].
        #[arg(value_parser = finite)]
        pct: f64,
    },
    /// Hand an inference function's share back to the allocator.
    Unpin {
        /// The IF's id.
        if_id: u16,
    },
    /// Show every inference function's state and metrics.
    Status,
    /// Retire everything and stop the orchestrator.
    Shutdown,
    /// Redraw the status table until Ctrl-C.
    Watch {
        /// Refresh period.
        #[arg(long, value_name = "MS", default_value_t = 1000)]
        every_ms: u64,
    },
}

/// A number JSON can carry (NaN and infinities would turn into `null`).
fn finite(s: &str) -> Result<f64, String> {
    let x: f64 = s.parse().map_err(|e| format!("{e}"))?;
    if x.is_finite() {
        Ok(x)
    } else {
        Err("must be a finite number".into())
    }
}

fn positive_finite(s: &str) -> Result<f64, String> {
    let x = finite(s)?;
    if x > 0.0 {
        Ok(x)
    } else {
        Err("must be above 0".into())
    }
}

const EXIT_REFUSED: u8 = 1;
const EXIT_USAGE: u8 = 2;
const EXIT_NO_REPLY: u8 = 3;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let endpoint = cli.endpoint.clone().unwrap_or_else(default_endpoint);
    let client = ControlClient::new(endpoint, Duration::from_millis(cli.timeout_ms));
    let request = match cli.command {
        Command::Deploy {
            if_id,
            ref model,
            ref binary,
            slo_ms,
            share_pct,
        } => {
            let binary = match binary.as_ref().map(std::fs::canonicalize).transpose() {
                Ok(b) => b,
                Err(e) => {
                    let path = binary.as_ref().map(|b| b.display().to_string());
                    eprintln!("kpctl: --binary {}: {e}", path.unwrap_or_default());
                    return ExitCode::from(EXIT_USAGE);
                }
            };
            Request::Deploy {
                if_id,
                model: model.clone(),
                binary,
                slo_ms,
                share_pct,
            }
        }
        Command::Retire { if_id } => Request::Retire { if_id },
        Command::Slo { if_id, slo_ms } => Request::Slo { if_id, slo_ms },
        Command::Share { if_id, pct } => Request::Share { if_id, pct },
        Command::Unpin { if_id } => Request::Unpin { if_id },
        Command::Status => Request::Status,
        Command::Shutdown => Request::Shutdown,
        Command::Watch { every_ms } => {
            return watch(&client, cli.json, Duration::from_millis(every_ms.max(50)))
        }
    };
    let waited_if = match (&request, cli.wait) {
        (_, false) => None,
        (
            Request::Deploy { if_id, .. }
            | Request::Retire { if_id }
            | Request::Slo { if_id, .. }
            | Request::Share { if_id, .. }
            | Request::Unpin { if_id },
            true,
        ) => Some(*if_id),
        (other, true) => {
            eprintln!(
                "kpctl: --wait is for commands that change an IF, not {}",
                other.command()
            );
            return ExitCode::from(EXIT_USAGE);
        }
    };
    // The IF before the change, to tell a switchover that happened from
    // one that did not.
    let before = match waited_if.map(|id| status_row(&client, id)) {
        Some(Err(e)) => {
            eprintln!("kpctl: {e}");
            return ExitCode::from(EXIT_NO_REPLY);
        }
        Some(Ok(row)) => row,
        None => None,
    };
    let reply = match client.request(&request) {
        Ok(reply) => reply,
        Err(e) => {
            eprintln!("kpctl: {e}");
            if cli.endpoint.is_none() {
                eprintln!(
                    "kpctl: (the endpoint is the default; set --endpoint or ${ENDPOINT_ENV})"
                );
            }
            return ExitCode::from(EXIT_NO_REPLY);
        }
    };
    if cli.json {
        println!("{}", reply.to_json());
    }
    match &reply {
        Reply::Error { code, message } => {
            eprintln!("kpctl: {} refused ({code}): {message}", request.command());
            ExitCode::from(EXIT_REFUSED)
        }
        Reply::Ok(payload) => {
            if !cli.json {
                match print_ok(&request, payload) {
                    Ok(()) => {}
                    Err(e) => {
                        eprintln!("kpctl: {e}");
                        return ExitCode::from(EXIT_NO_REPLY);
                    }
                }
            }
            match waited_if {
                Some(if_id) => wait_carried_out(
                    &client,
                    if_id,
                    before.as_ref(),
                    cli.json,
                    Duration::from_secs(cli.wait_timeout_s),
                ),
                None => ExitCode::SUCCESS,
            }
        }
    }
}

/// How often `--wait` asks for the status.
const WAIT_POLL: Duration = Duration::from_millis(20);

/// The payload of an `ok` reply to `status`, read as a report.
fn status_report(payload: serde_json::Map<String, Value>) -> Result<StatusReport, String> {
    serde_json::from_value(Value::Object(payload))
        .map_err(|e| format!("the status reply is not a status report: {e}"))
}

/// The status row of `if_id`, `None` if it is not deployed.
fn status_row(client: &ControlClient, if_id: u16) -> Result<Option<StatusRow>, String> {
    match client
        .request(&Request::Status)
        .map_err(|e| e.to_string())?
    {
        Reply::Ok(payload) => Ok(status_report(payload)?
            .ifs
            .into_iter()
            .find(|r| r.if_id == if_id)),
        Reply::Error { code, message } => Err(format!("status refused ({code}): {message}")),
    }
}

/// `--wait`: until `if_id` is neither starting nor switching (gone, if it
/// was retired); prints its row and what changed since `before`.
fn wait_carried_out(
    client: &ControlClient,
    if_id: u16,
    before: Option<&StatusRow>,
    json: bool,
    timeout: Duration,
) -> ExitCode {
    let started = Instant::now();
    loop {
        let row = match status_row(client, if_id) {
            Ok(row) => row,
            Err(e) => {
                eprintln!("kpctl: waiting for if{if_id}: {e}");
                return ExitCode::from(EXIT_NO_REPLY);
            }
        };
        let settled = match &row {
            None => true,
            Some(r) => !matches!(
                r.state,
                IfState::Starting | IfState::Switching | IfState::Retiring
            ),
        };
        if settled {
            let waited = started.elapsed();
            return report_carried_out(if_id, before, row.as_ref(), waited, json);
        }
        if started.elapsed() > timeout {
            eprintln!(
                "kpctl: if{if_id} still {} after {} s (--wait-timeout-s)",
                row.map_or("?", |r| r.state.as_str()),
                timeout.as_secs()
            );
            return ExitCode::from(EXIT_REFUSED);
        }
        std::thread::sleep(WAIT_POLL);
    }
}

fn report_carried_out(
    if_id: u16,
    before: Option<&StatusRow>,
    after: Option<&StatusRow>,
    waited: Duration,
    json: bool,
) -> ExitCode {
    let switchovers = |r: Option<&StatusRow>| r.map_or(0, |r| r.switchovers);
    let switched = switchovers(after).saturating_sub(switchovers(before));
    let failed = after.is_some_and(|r| r.state == IfState::Failed);
    if json {
        println!(
            "{}",
            serde_json::json!({
                "waited_ms": waited.as_secs_f64() * 1e3,
                "switchovers": switched,
                "if": after,
            })
        );
    } else {
        match after {
            None => println!("if{if_id}: gone (waited {} ms)", waited.as_millis()),
            Some(r) => {
                let pid = |r: Option<&StatusRow>| {
                    r.and_then(|r| r.pid)
                        .map_or("-".to_string(), |p| p.to_string())
                };
                let what = if switched > 0 {
                    format!(
                        "switched over from pid {} to {} (gap {} µs)",
                        pid(before),
                        pid(Some(r)),
                        r.last_switchover_gap_us
                            .map_or("?".to_string(), |g| g.to_string())
                    )
                } else {
                    format!("pid {}, no switchover", pid(Some(r)))
                };
                println!(
                    "if{if_id}: {} at {}%, SLO {} ms: {what} (waited {} ms){}",
                    r.state,
                    r.share_pct,
                    r.slo_ms,
                    waited.as_millis(),
                    r.reason
                        .as_deref()
                        .map_or(String::new(), |why| format!("; {why}"))
                );
            }
        }
    }
    if failed {
        eprintln!(
            "kpctl: if{if_id} failed: {}",
            after
                .and_then(|r| r.reason.as_deref())
                .unwrap_or("no reason given")
        );
        return ExitCode::from(EXIT_REFUSED);
    }
    ExitCode::SUCCESS
}

/// The text form of an `ok` reply.
fn print_ok(request: &Request, payload: &serde_json::Map<String, Value>) -> Result<(), String> {
    let desired = payload.get("if");
    let field = |name: &str| {
        desired
            .and_then(|d| d.get(name))
            .map(|v| match v {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            })
            .unwrap_or_else(|| "?".into())
    };
    match request {
        Request::Status => {
            print!("{}", format_status_table(&status_report(payload.clone())?));
        }
        Request::Deploy { if_id, .. } => println!(
            "deployed if{if_id}: model {}, share {}%, SLO {} ms, binary {}",
            field("model"),
            field("share_pct"),
            field("slo_ms"),
            field("binary")
        ),
        Request::Retire { if_id } => println!("retiring if{if_id}"),
        Request::Slo { if_id, .. } => println!("if{if_id}: SLO {} ms", field("slo_ms")),
        Request::Share { if_id, .. } => {
            println!("if{if_id}: share pinned at {}%", field("share_pct"))
        }
        Request::Unpin { if_id } => println!(
            "if{if_id}: unpinned (share {}% until the allocator moves it)",
            field("share_pct")
        ),
        Request::Shutdown => println!("the orchestrator is shutting down"),
    }
    Ok(())
}

/// `kpctl watch`: asks for the status every `every` and redraws it (on a
/// terminal; one JSON line or one table per refresh otherwise) until
/// interrupted. A refresh that fails is shown and retried.
fn watch(client: &ControlClient, json: bool, every: Duration) -> ExitCode {
    let clear = !json && std::io::stdout().is_terminal();
    let started = Instant::now();
    loop {
        let tick = Instant::now();
        let mut screen = String::new();
        if clear {
            screen.push_str("\x1b[H\x1b[2J");
        }
        let body = match client.request(&Request::Status) {
            Ok(Reply::Ok(payload)) if json => {
                format!("{}\n", Reply::Ok(payload).to_json())
            }
            Ok(Reply::Ok(payload)) => match status_report(payload) {
                Ok(report) => format_status_table(&report),
                Err(e) => format!("{e}\n"),
            },
            Ok(reply @ Reply::Error { .. }) if json => format!("{}\n", reply.to_json()),
            Ok(Reply::Error { code, message }) => format!("status refused ({code}): {message}\n"),
            Err(e) if json => format!(
                "{}\n",
                serde_json::json!({"ok": false, "error": {"code": "no_reply", "message": e.to_string()}})
            ),
            Err(e) => format!("{e}\n"),
        };
        if !json {
            screen.push_str(&format!(
                "kpctl watch {}  every {} ms  up {} s  (Ctrl-C to stop)\n\n",
                client.endpoint(),
                every.as_millis(),
                started.elapsed().as_secs()
            ));
        }
        screen.push_str(&body);
        if !clear && !json {
            screen.push('\n');
        }
        let mut out = std::io::stdout().lock();
        if out
            .write_all(screen.as_bytes())
            .and_then(|()| out.flush())
            .is_err()
        {
            // The reader went away (`kpctl watch | head`): done.
            return ExitCode::SUCCESS;
        }
        drop(out);
        std::thread::sleep(every.saturating_sub(tick.elapsed()));
    }
}
