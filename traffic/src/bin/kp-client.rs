//! kp-client: sends requests to a running platform over a real UDP socket
//! and reports what came back (see `kp_traffic::client`); with `--image`,
//! classifies photos instead, one request each, and prints the top-k with
//! the model's class names.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, ValueEnum};
use kneepoint_client::labels::{Labels, LabelsError, ModelInfo};
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
///
/// With --image, no load run: each photo is resized and centre-cropped to
/// the --if-id model's input (read from --models; kneepoint-client's image
/// preprocessing, the model repository's reference), sent as one request,
/// and its top-k printed with class names when the model has labels.
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
    /// Write one CSV line per request as it ends: request_id, when it was
    /// sent and answered (µs since the Unix epoch), and how it ended
    /// (a status, `unanswered` or `unreachable`).
    #[arg(long, value_name = "FILE", conflicts_with = "image")]
    record: Option<PathBuf>,
    /// Exit 3 if any request went unanswered.
    #[arg(long)]
    expect_all_answered: bool,
    /// Classify these PNG or JPEG photos (one request each, one line of
    /// top-k each; with --json one JSON object each) instead of a load run.
    #[arg(long, value_name = "PATH", num_args = 1..,
          conflicts_with_all = ["requests", "duration", "rate", "concurrency", "expect_all_answered"])]
    image: Vec<PathBuf>,
    /// The model repository that --image reads the model's input size and
    /// class names from (its config.toml for --if-id, and labels file).
    #[arg(long, default_value = "models", value_name = "DIR", requires = "image")]
    models: PathBuf,
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
    let result = if a.image.is_empty() {
        client(&a, stop_early)
    } else {
        classify(&a)
    };
    match result {
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
        record: a.record.clone(),
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

/// `--image`: one blocking request per photo, top-k printed with names.
fn classify(a: &Args) -> anyhow::Result<ExitCode> {
    let model = ModelInfo::find(&a.models, a.if_id)?;
    if !model.rgb_u8 {
        anyhow::bail!(
            "model {} (if_id {}) takes f32 tensors, not images",
            model.name,
            a.if_id
        );
    }
    let labels = match model.labels() {
        Ok(labels) => Some(labels),
        Err(LabelsError::NoLabels { .. }) => None, // class ids only
        Err(e) => return Err(e.into()),
    };
    let client = kneepoint_client::Config::builder(a.dst)
        .bind(a.bind)
        .timeout(a.timeout)
        .fragment_payload(a.frag_size)
        .input_len(a.if_id, model.input_bytes as usize)
        .connect()?;
    for path in &a.image {
        let input = kneepoint_client::image::from_path(path, model.height, model.width)
            .with_context(|| format!("{}", path.display()))?;
        let answer = client
            .infer(a.if_id, &input)
            .with_context(|| format!("{}: request to if_id {}", path.display(), a.if_id))?;
        let name = path
            .file_name()
            .unwrap_or(path.as_os_str())
            .to_string_lossy();
        if a.json {
            println!(
                "{}",
                serde_json::to_string(&answer_json(&name, &answer, labels.as_ref()))?
            );
        } else {
            println!("{name}: {}", top_k_text(&answer, labels.as_ref()));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `1. espresso 0.953, 2. cup 0.014, ...`; `1. class 967 0.953, ...`
/// without labels. A label is its first comma-separated name (ImageNet's
/// "tabby, tabby cat" is "tabby").
fn top_k_text(answer: &kneepoint_client::Answer, labels: Option<&Labels>) -> String {
    let items: Vec<String> = answer
        .top_k
        .iter()
        .enumerate()
        .map(|(i, c)| match labels.and_then(|l| l.get(c.class)) {
            Some(label) => {
                let short = label.split(',').next().unwrap_or(label);
                format!("{}. {short} {:.3}", i + 1, c.score)
            }
            None => format!("{}. class {} {:.3}", i + 1, c.class, c.score),
        })
        .collect();
    items.join(", ")
}

/// One photo's answer as JSON: class ids, full labels (null without) and
/// scores, highest first.
fn answer_json(
    image: &str,
    answer: &kneepoint_client::Answer,
    labels: Option<&Labels>,
) -> serde_json::Value {
    let top_k: Vec<serde_json::Value> = answer
        .top_k
        .iter()
        .map(|c| {
            serde_json::json!({
                "class": c.class,
                "label": labels.and_then(|l| l.get(c.class)),
                "score": c.score,
            })
        })
        .collect();
    serde_json::json!({
        "image": image,
        "if_id": answer.if_id,
        "top_k": top_k,
        "batch_size": answer.batch_size,
        "platform_latency_us": answer.platform_latency_us,
        "rtt_us": answer.rtt.as_micros() as u64,
    })
}
