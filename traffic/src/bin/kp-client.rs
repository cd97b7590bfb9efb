//! kp-client: sends requests to a running platform over a real UDP socket
//! and reports what came back (see `kp_traffic::client`).

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use kp_traffic::client::{
    parse_duration, run, Arrival, ClientConfig, ClientError, Load, Stop, MTU_UDP_PAYLOAD,
};
use kp_traffic::gen::DEFAULT_FRAG_SIZE;
use kp_traffic::input::InputArgs;
use kp_wire::HEADER_LEN;

/// Exit status when --expect-all-answered is given and a request went
/// unanswered (1 is a socket or input error, 2 a usage error).
const EXIT_UNANSWERED: u8 = 3;

#[derive(Clone, Copy, Debug, ValueEnum)]
enum ArrivalArg {
    /// Exponential gaps (a Poisson process).
    Poisson,
    /// Equal gaps.
    Constant,
}

/// Send kneepoint requests over UDP and account for every answer.
///
/// Open loop with --rate (the sender never waits for answers), otherwise
/// closed loop with --concurrency requests outstanding (default 1). Exits 0
/// whatever the platform answered (or not), unless --expect-all-answered.
/// SIGINT or SIGTERM stops sending early: the requests out are resolved
/// (answered or timed out) and the report printed as after --duration.
#[derive(Debug, Parser)]
#[command(name = "kp-client", version)]
struct Args {
    /// The platform's address: IP:PORT.
    #[arg(long, value_name = "IP:PORT")]
    dst: SocketAddr,
    /// Local address to send from.
    #[arg(long, default_value = "0.0.0.0:0", value_name = "IP:PORT")]
    bind: SocketAddr,
    /// Inference function the requests are for.
    #[arg(long, default_value_t = 1)]
    if_id: u16,
    /// Send this many requests (default 10 unless --duration).
    #[arg(long, value_name = "N", conflicts_with = "duration")]
    requests: Option<u64>,
    /// Send for this long (500ms, 10s, 2.5).
    #[arg(long, value_name = "TIME", value_parser = parse_duration)]
    duration: Option<Duration>,
    /// Open loop: requests per second.
    #[arg(long, value_name = "R", conflicts_with = "concurrency")]
    rate: Option<f64>,
    /// Open loop: spacing of requests.
    #[arg(long, value_enum, default_value = "poisson", requires = "rate")]
    arrival: ArrivalArg,
    /// Closed loop: requests outstanding at once.
    #[arg(long, value_name = "N")]
    concurrency: Option<usize>,
    /// A request not answered this long after its first fragment is
    /// unanswered (500ms, 2s).
    #[arg(long, default_value = "1s", value_name = "TIME", value_parser = parse_duration)]
    timeout: Duration,
    #[command(flatten)]
    inputs: InputArgs,
    /// Payload bytes per fragment at most.
    #[arg(long, default_value_t = DEFAULT_FRAG_SIZE, value_name = "BYTES")]
    frag_size: usize,
    /// Pause between two fragments of one request (0: back to back).
    #[arg(long, default_value = "0", value_name = "TIME", value_parser = parse_duration)]
    frag_gap: Duration,
    /// request_id of the first request.
    #[arg(long, default_value_t = 1, value_name = "ID")]
    first_request_id: u64,
    /// Seed of synthetic images and Poisson gaps.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Keep listening this long after the last request is resolved, for
    /// trailing duplicate answers.
    #[arg(long, default_value = "50ms", value_name = "TIME", value_parser = parse_duration)]
    linger: Duration,
    /// Print the report as one JSON object.
    #[arg(long)]
    json: bool,
    /// Exit 3 if any request went unanswered.
    #[arg(long)]
    expect_all_answered: bool,
}

fn main() -> ExitCode {
    // First: a signal that comes before the handler would kill the client
    // without its report.
    let stop_early = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        if let Err(e) = signal_hook::flag::register(sig, stop_early.clone()) {
            eprintln!("kp-client: installing signal handlers: {e}");
            return ExitCode::from(1);
        }
    }
    let a = Args::parse();
    match client(&a, stop_early) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("kp-client: {e:#}");
            ExitCode::from(match e.downcast_ref::<ClientError>() {
                Some(ClientError::Usage(_)) => 2,
                _ => 1,
            })
        }
    }
}

fn client(a: &Args, stop_early: Arc<AtomicBool>) -> anyhow::Result<ExitCode> {
    if HEADER_LEN + a.frag_size > MTU_UDP_PAYLOAD {
        eprintln!(
            "kp-client: warning: {}-byte datagrams exceed a 1500-byte MTU; the kernel will IP-fragment them and the platform drops IP fragments",
            HEADER_LEN + a.frag_size
        );
    }
    let inputs = a.inputs.load(a.seed)?;
    let stop = match (a.requests, a.duration) {
        (_, Some(d)) => Stop::Duration(d),
        (Some(n), None) => Stop::Requests(n),
        (None, None) => Stop::Requests(10),
    };
    let load = match a.rate {
        Some(rate) => Load::Open {
            rate,
            arrival: match a.arrival {
                ArrivalArg::Poisson => Arrival::Poisson,
                ArrivalArg::Constant => Arrival::Constant,
            },
        },
        None => Load::Closed {
            concurrency: a.concurrency.unwrap_or(1),
        },
    };
    let cfg = ClientConfig {
        bind: a.bind,
        dst: a.dst,
        if_id: a.if_id,
        stop,
        stop_early,
        load,
        timeout: a.timeout,
        frag_size: a.frag_size,
        frag_gap: a.frag_gap,
        first_request_id: a.first_request_id,
        seed: a.seed,
        linger: a.linger,
    };
    let report = run(&cfg, &inputs)?;
    if a.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print!("{}", report.to_text());
    }
    if a.expect_all_answered && report.unanswered > 0 {
        eprintln!(
            "kp-client: {} of {} requests unanswered",
            report.unanswered, report.sent
        );
        return Ok(ExitCode::from(EXIT_UNANSWERED));
    }
    Ok(ExitCode::SUCCESS)
}
