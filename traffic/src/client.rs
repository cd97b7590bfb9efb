//! A live client: requests over a real UDP socket, answers accounted for.
//!
//! [`run`] sends requests to the platform through one
//! [`kneepoint_client::Client`] (one UDP socket, its receiver thread),
//! fragmented per docs/PROTOCOL.md, either open loop (at a rate, constant or
//! Poisson spacing: the sender never waits for answers) or closed loop (a
//! fixed number outstanding: a new request goes out when one is answered or
//! times out).
//!
//! The request bookkeeping is the client crate's: it matches answers to
//! requests (request_id, if_id and echoed send_ts_ns), ends each request
//! once (its first matching answer, or its timeout) and counts every other
//! datagram received: `duplicates` (another answer to an answered
//! request), `late` (an answer to a request already counted unanswered),
//! `unexpected` (matching no request of this client's), `malformed` (not a
//! well-formed response per `Response::new_checked`). What this module adds
//! is the load: the schedule, and the accounting of what
//! [`Client::poll_replies`] returns into the report ([`Tally`]: every
//! request sent ends *answered*, by status, or *unanswered*).
//!
//! RTT is measured from just before the first fragment is sent (open loop:
//! from the request's *scheduled* time, so a sender that falls behind its
//! schedule is charged its lag, no coordinated omission) to the moment the
//! receiver thread has the answer; `latency_us` is the platform's own
//! figure from the answer. Both go into HDR histograms (microseconds, 3
//! significant digits).
//!
//! Request ids count up by one from `first_request_id`
//! ([`kneepoint_client::ConfigBuilder::first_request_id`]).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io::{self, Write};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use kneepoint_client::{frag, Client, Reply, RequestId};
use kp_wire::Status;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::input::Inputs;

/// Largest UDP payload that fits a standard 1500-byte Ethernet MTU without
/// IP fragmentation (1500 - 20 IPv4 - 8 UDP). The platform drops IP
/// fragments, so larger fragments only work on links with a larger MTU.
pub const MTU_UDP_PAYLOAD: usize = 1472;

/// Highest latency the histograms hold, µs (one minute); larger values
/// are recorded as this.
const HIST_MAX_US: u64 = 60_000_000;

/// How long one wait for results lasts at most while nothing ends: how
/// soon a closed-loop sender notices a stop signal.
const POLL: Duration = Duration::from_millis(20);

/// Spacing of open-loop requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Arrival {
    /// Exactly 1/rate apart.
    Constant,
    /// Exponentially distributed gaps with mean 1/rate (a Poisson process).
    Poisson,
}

/// Open or closed loop.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Load {
    /// Requests at `rate` per second whatever the answers.
    Open {
        /// Requests per second.
        rate: f64,
        /// Spacing.
        arrival: Arrival,
    },
    /// Keep `concurrency` requests outstanding.
    Closed {
        /// Requests outstanding at most.
        concurrency: usize,
    },
}

/// When to stop sending.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// After this many requests.
    Requests(u64),
    /// After this long.
    Duration(Duration),
}

/// Settings of a client run.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// Local address to bind.
    pub bind: SocketAddr,
    /// The platform's address and port.
    pub dst: SocketAddr,
    /// Inference function of every request.
    pub if_id: u16,
    /// When to stop.
    pub stop: Stop,
    /// Set (by kp-client's SIGINT/SIGTERM handler) to stop sending before
    /// `stop` says so; the requests already out are still resolved and
    /// reported, as after a `stop`.
    pub stop_early: Arc<AtomicBool>,
    /// Open or closed loop.
    pub load: Load,
    /// A request with no answer this long after its first fragment is
    /// unanswered.
    pub timeout: Duration,
    /// Payload bytes per fragment at most.
    pub frag_size: usize,
    /// Pause between two fragments of one request (0: back to back;
    /// [`kneepoint_client::ConfigBuilder::fragment_gap`]).
    pub frag_gap: Duration,
    /// request_id of the first request; the following ones count up.
    pub first_request_id: u64,
    /// Seed of the Poisson spacing.
    pub seed: u64,
    /// Listening time after the last request is resolved.
    pub linger: Duration,
    /// Where to write one line per request as it ends ([`RECORD_HEADER`]),
    /// for checks that need to know *when* each request went out and how
    /// it ended (the chaos test matches unanswered requests to the faults
    /// it injected); `None`: no record.
    pub record: Option<std::path::PathBuf>,
}

/// The first line of a `--record` file. Then one line per request, in the
/// order they ended: its request_id; when it was scheduled (open loop) or
/// sent (closed loop), µs since the Unix epoch; how it ended (a status as
/// [`Status::as_str`] says it, `unanswered` after its timeout, or
/// `unreachable`); when its answer came, µs since the Unix epoch (empty
/// when none came). Wall-clock times, so that other processes' events can
/// be placed among them; derived from one reading of the wall clock at the
/// start and the monotonic clock since, so a clock step during the run
/// does not reorder them.
pub const RECORD_HEADER: &str = "request_id,sent_unix_us,outcome,answered_unix_us";

/// Why a client run failed (not: requests went unanswered).
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Socket set-up or a send failed.
    #[error("socket: {0}")]
    Socket(#[from] io::Error),
    /// Settings that cannot work.
    #[error("{0}")]
    Usage(String),
}

/// Counters and histograms of a run: what every request sent ended in.
/// Sans-IO (instants are arguments), so it is tested without sockets.
#[derive(Debug, Clone)]
pub struct Tally {
    /// Requests sent.
    pub sent: u64,
    /// Requests answered (first matching answer, any status).
    pub answered: u64,
    /// Requests not answered within the timeout (or failed unreachable).
    pub unanswered: u64,
    /// Answers by status (first answers only; all statuses present).
    pub by_status: BTreeMap<&'static str, u64>,
    /// Client-side round-trip times, µs: in open loop from the scheduled
    /// time (a sender that falls behind is charged its lag).
    pub rtt_us: Histogram<u64>,
    /// The same, of OK answers only (for [`late_percentiles`]).
    pub ok_rtt_us: Histogram<u64>,
    /// How late each request went out after its scheduled time, µs
    /// (closed loop: 0, a request is sent when its slot frees).
    pub lag_us: Histogram<u64>,
    /// The platform's `latency_us` of answers.
    pub platform_latency_us: Histogram<u64>,
    /// Sum of `batch_size` over OK answers.
    pub batch_size_sum: u64,
    /// OK answers per `batch_size`: the batch mix the platform ran, which
    /// the engine alone is timed at to compare with (a batch of `b` gives
    /// `b` answers).
    pub ok_by_batch_size: BTreeMap<u16, u64>,
    /// When the first request was scheduled (sent, in closed loop).
    pub first_send: Option<Instant>,
    /// When the last answer came.
    pub last_answer: Option<Instant>,
}

impl Default for Tally {
    fn default() -> Self {
        Tally::new()
    }
}

impl Tally {
    /// Nothing sent yet.
    pub fn new() -> Tally {
        let hist =
            || Histogram::new_with_bounds(1, HIST_MAX_US, 3).expect("valid histogram bounds");
        Tally {
            sent: 0,
            answered: 0,
            unanswered: 0,
            by_status: Status::ALL.iter().map(|s| (s.as_str(), 0)).collect(),
            rtt_us: hist(),
            ok_rtt_us: hist(),
            lag_us: hist(),
            platform_latency_us: hist(),
            batch_size_sum: 0,
            ok_by_batch_size: BTreeMap::new(),
            first_send: None,
            last_answer: None,
        }
    }

    /// Records that a request scheduled at `scheduled` goes out at `at`;
    /// returns the instant its round trip and timeout count from:
    /// `scheduled`, or `at` if that is earlier. `at - scheduled` is its lag.
    pub fn sent(&mut self, scheduled: Instant, at: Instant) -> Instant {
        let scheduled = scheduled.min(at);
        self.lag_us
            .saturating_record(at.saturating_duration_since(scheduled).as_micros() as u64);
        self.sent += 1;
        self.first_send.get_or_insert(scheduled);
        scheduled
    }

    /// Records how a request whose round trip counts from `from` (what
    /// [`Tally::sent`] returned) ended: answered as `reply` says (any
    /// status), or unanswered (`None`: no answer within the timeout).
    pub fn ended(&mut self, from: Instant, reply: Option<&Reply>) {
        let Some(r) = reply else {
            self.unanswered += 1;
            return;
        };
        self.answered += 1;
        *self.by_status.entry(r.status.as_str()).or_default() += 1;
        let rtt = r
            .received_at
            .saturating_duration_since(from)
            .as_micros()
            .max(1) as u64;
        self.rtt_us.saturating_record(rtt);
        if r.status == Status::Ok {
            self.ok_rtt_us.saturating_record(rtt);
        }
        self.platform_latency_us
            .saturating_record(u64::from(r.platform_latency_us).max(1));
        if r.status == Status::Ok {
            self.batch_size_sum += u64::from(r.batch_size);
            *self.ok_by_batch_size.entry(r.batch_size).or_default() += 1;
        }
        self.last_answer = Some(
            self.last_answer
                .map_or(r.received_at, |l| l.max(r.received_at)),
        );
    }
}

/// The gap to the next open-loop request, s.
fn gap(arrival: Arrival, rate: f64, rng: &mut StdRng) -> f64 {
    match arrival {
        Arrival::Constant => 1.0 / rate,
        // Inverse-CDF sampling of Exp(rate); 1-u is in (0, 1].
        Arrival::Poisson => -(1.0 - rng.random::<f64>()).ln() / rate,
    }
}

/// Percentiles of one histogram, µs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Percentiles {
    /// Values recorded.
    pub count: u64,
    /// Smallest.
    pub min: u64,
    /// Mean.
    pub mean: f64,
    /// Median.
    pub p50: u64,
    /// 90th percentile.
    pub p90: u64,
    /// 99th percentile.
    pub p99: u64,
    /// Largest.
    pub max: u64,
}

impl Percentiles {
    fn of(h: &Histogram<u64>) -> Percentiles {
        if h.is_empty() {
            return Percentiles::default();
        }
        Percentiles {
            count: h.len(),
            min: h.min(),
            mean: h.mean(),
            p50: h.value_at_quantile(0.50),
            p90: h.value_at_quantile(0.90),
            p99: h.value_at_quantile(0.99),
            max: h.max(),
        }
    }
}

/// Round-trip percentiles over every request sent, failures counted as
/// late: OK answers by their round trip, every other request (an answer
/// with another status, or none) as later than any OK one. A percentile
/// that falls among the failures is `None` (JSON `null`: beyond every
/// latency, so beyond any SLO). With nothing failed it is the percentile
/// of the OK answers; with 2% failed, p99 is `None`. What a latency target
/// means when a system that refuses or drops requests must not look faster
/// for it (issue 13's fair harness: all systems are measured this way).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct LatePercentiles {
    /// Requests counted (OK + failed).
    pub count: u64,
    /// Of which failed.
    pub failed: u64,
    /// Median, µs.
    pub p50: Option<u64>,
    /// 90th percentile, µs.
    pub p90: Option<u64>,
    /// 99th percentile, µs.
    pub p99: Option<u64>,
}

/// [`LatePercentiles`] of `ok` (the OK answers' round trips) and `failed`
/// other requests. Nearest rank: the q-quantile of n requests is the
/// ⌈q·n⌉-th smallest; it is an OK round trip when that rank is at most the
/// number of OK answers.
pub fn late_percentiles(ok: &Histogram<u64>, failed: u64) -> LatePercentiles {
    let n_ok = ok.len();
    let count = n_ok + failed;
    let at = |q: f64| {
        let rank = (q * count as f64).ceil().max(1.0) as u64;
        (count > 0 && rank <= n_ok).then(|| ok.value_at_quantile(rank as f64 / n_ok as f64))
    };
    LatePercentiles {
        count,
        failed,
        p50: at(0.50),
        p90: at(0.90),
        p99: at(0.99),
    }
}

/// The values `h` recorded as `[value, count]` pairs, lowest first, each
/// value the highest of its bucket (what `value_at_quantile` returns, at
/// the histogram's 3 significant digits). With [`LatePercentiles::failed`]
/// it is what percentiles over several runs together need: bench/report.py
/// pools a load level's windows so, instead of averaging their p99s (an
/// average in which one window's failures make the level's p99 infinite
/// while late answers average out).
pub fn recorded(h: &Histogram<u64>) -> Vec<[u64; 2]> {
    h.iter_recorded()
        .map(|v| [v.value_iterated_to(), v.count_at_value()])
        .collect()
}

/// The outcome of a client run (`kp-client --json` prints it).
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// Where requests went.
    pub dst: String,
    /// Their if_id.
    pub if_id: u16,
    /// Bytes per request.
    pub payload_len: usize,
    /// Fragments per request.
    pub frag_count: u16,
    /// `open` or `closed`.
    pub mode: &'static str,
    /// Open loop: requests per second asked for.
    pub rate: Option<f64>,
    /// Open loop: spacing.
    pub arrival: Option<Arrival>,
    /// Closed loop: requests outstanding.
    pub concurrency: Option<usize>,
    /// Per-request timeout, ms.
    pub timeout_ms: u64,
    /// Requests sent.
    pub sent: u64,
    /// Requests answered.
    pub answered: u64,
    /// Requests unanswered within the timeout.
    pub unanswered: u64,
    /// Extra answers to answered requests.
    pub duplicates: u64,
    /// Answers after the request's timeout.
    pub late: u64,
    /// Answers matching no request.
    pub unexpected: u64,
    /// Datagrams that are not well-formed responses.
    pub malformed: u64,
    /// Answers by status (`ok`, `unknown_if`, `bad_request`, `incomplete`,
    /// `overloaded`, `internal`; all keys present).
    pub status: BTreeMap<&'static str, u64>,
    /// Datagrams sent.
    pub datagrams_sent: u64,
    /// From the first send to the end of sending, s.
    pub send_duration_s: f64,
    /// From the first send to the last answer, s.
    pub answer_span_s: f64,
    /// Requests sent per second over `send_duration_s`.
    pub send_rate: f64,
    /// Answers per second over `answer_span_s`.
    pub throughput: f64,
    /// Client-side round-trip time, µs (open loop: from the scheduled time),
    /// of every answer whatever its status.
    pub rtt_us: Percentiles,
    /// The round trip over every request sent, failures (another status,
    /// no answer) counted as late ([`LatePercentiles`]).
    pub rtt_failed_as_late_us: LatePercentiles,
    /// The OK answers' round trips, µs, as `[value, count]` pairs
    /// ([`recorded`]).
    pub ok_rtt_us_counts: Vec<[u64; 2]>,
    /// Open loop: send lag behind the schedule, µs.
    pub lag_us: Percentiles,
    /// The platform's `latency_us`.
    pub platform_latency_us: Percentiles,
    /// Mean `batch_size` of OK answers (`null` when there is none).
    pub mean_batch_size: Option<f64>,
    /// OK answers per `batch_size` (a JSON object: `{"1": 120, "4": 36}`).
    pub ok_by_batch_size: BTreeMap<u16, u64>,
}

impl Report {
    /// Multi-line human-readable form.
    pub fn to_text(&self) -> String {
        let mut s = String::new();
        let mode = match (self.mode, self.rate, self.arrival, self.concurrency) {
            ("open", Some(r), Some(a), _) => format!("open loop, {r} req/s {a:?}"),
            (_, _, _, Some(c)) => format!("closed loop, {c} outstanding"),
            _ => self.mode.to_string(),
        };
        s += &format!(
            "kp-client: {} requests to {} (if_id {}, {} B in {} fragments), {mode}, timeout {} ms\n",
            self.sent, self.dst, self.if_id, self.payload_len, self.frag_count, self.timeout_ms
        );
        s += &format!(
            "  sent         {:>9}  ({} datagrams, {:.1} req/s)\n",
            self.sent, self.datagrams_sent, self.send_rate
        );
        let statuses: Vec<String> = Status::ALL
            .iter()
            .map(|st| {
                format!(
                    "{} {}",
                    st.as_str(),
                    self.status.get(st.as_str()).unwrap_or(&0)
                )
            })
            .collect();
        s += &format!(
            "  answered     {:>9}  ({})\n",
            self.answered,
            statuses.join(", ")
        );
        s += &format!("  unanswered   {:>9}\n", self.unanswered);
        s += &format!(
            "  duplicates   {:>9}  late {}  unexpected {}  malformed {}\n",
            self.duplicates, self.late, self.unexpected, self.malformed
        );
        s += &format!(
            "  throughput   {:>9.1} answers/s over {:.3} s\n",
            self.throughput, self.answer_span_s
        );
        let p = |name: &str, p: &Percentiles| {
            format!(
                "  {name:<12} p50 {} p90 {} p99 {} max {} (mean {:.0}, n {})\n",
                p.p50, p.p90, p.p99, p.max, p.mean, p.count
            )
        };
        s += &p("rtt µs", &self.rtt_us);
        if self.mode == "open" {
            s += &p("send lag µs", &self.lag_us);
        }
        s += &p("platform µs", &self.platform_latency_us);
        match self.mean_batch_size {
            Some(b) => s += &format!("  batch_size   mean {b:.2}\n"),
            None => s += "  batch_size   - (no OK answer)\n",
        }
        s
    }
}

/// Sends requests and accounts for the answers (see the module docs).
pub fn run(cfg: &ClientConfig, inputs: &Inputs) -> Result<Report, ClientError> {
    let payload_len = inputs.shape().len();
    if cfg.frag_size == 0 {
        return Err(ClientError::Usage("--frag-size must be at least 1".into()));
    }
    // The application client's geometry (kp-wire's): what it refuses, a
    // payload too large for a datagram or more than 65535 fragments, is a
    // usage error here.
    let (frag_count, _) = frag::geometry(payload_len, cfg.frag_size)
        .map_err(|e| ClientError::Usage(format!("--frag-size {}: {e}", cfg.frag_size)))?;
    match cfg.load {
        Load::Open { rate, .. } if !(rate.is_finite() && rate > 0.0) => {
            return Err(ClientError::Usage(format!(
                "--rate must be > 0 (got {rate})"
            )))
        }
        Load::Closed { concurrency: 0 } => {
            return Err(ClientError::Usage("--concurrency must be >= 1".into()))
        }
        _ => {}
    }

    // Connected: answers come from the address requests go to
    // (docs/PROTOCOL.md), and the kernel filters out datagrams from anyone
    // else.
    let client = kneepoint_client::Config::builder(cfg.dst)
        .bind(cfg.bind)
        .timeout(cfg.timeout)
        .fragment_payload(cfg.frag_size)
        .fragment_gap(cfg.frag_gap)
        .first_request_id(cfg.first_request_id)
        .connect()
        .map_err(from_client_error)?;
    let record = match &cfg.record {
        Some(path) => {
            let f = std::fs::File::create(path)
                .map_err(|e| ClientError::Usage(format!("--record {}: {e}", path.display())))?;
            let mut w = io::BufWriter::new(f);
            writeln!(w, "{RECORD_HEADER}")?;
            Some(Record {
                w,
                epoch: (Instant::now(), std::time::SystemTime::now()),
                failed: None,
            })
        }
        None => None,
    };
    let mut run = Loop {
        cfg,
        client: &client,
        tally: Tally::new(),
        out: HashMap::new(),
        held: VecDeque::new(),
        record,
    };
    run.send_all(inputs)?;
    let send_end = Instant::now();
    while !run.out.is_empty() {
        run.collect(POLL);
    }
    if let Some(mut r) = run.record.take() {
        if let Some(e) = r.failed.take() {
            return Err(ClientError::Socket(e));
        }
        r.w.flush()?;
    }
    // Trailing duplicates are counted by the client's receiver meanwhile.
    std::thread::sleep(cfg.linger);
    let stats = client.stats();
    let t = run.tally;

    let first = t.first_send.unwrap_or(send_end);
    let send_duration_s = send_end.saturating_duration_since(first).as_secs_f64();
    let answer_span_s = t
        .last_answer
        .map(|l| l.saturating_duration_since(first).as_secs_f64())
        .unwrap_or(0.0);
    let ok = t.by_status.get("ok").copied().unwrap_or(0);
    let (mode, rate, arrival, concurrency) = match cfg.load {
        Load::Open { rate, arrival } => ("open", Some(rate), Some(arrival), None),
        Load::Closed { concurrency } => ("closed", None, None, Some(concurrency)),
    };
    Ok(Report {
        dst: cfg.dst.to_string(),
        if_id: cfg.if_id,
        payload_len,
        frag_count,
        mode,
        rate,
        arrival,
        concurrency,
        timeout_ms: cfg.timeout.as_millis() as u64,
        sent: t.sent,
        answered: t.answered,
        unanswered: t.unanswered,
        duplicates: stats.duplicates,
        late: stats.late,
        unexpected: stats.unexpected,
        malformed: stats.malformed,
        status: t.by_status.clone(),
        // Every fragment of every request (one refused as unreachable
        // included, as a send that was tried).
        datagrams_sent: t.sent * u64::from(frag_count),
        send_duration_s,
        answer_span_s,
        send_rate: if send_duration_s > 0.0 {
            t.sent as f64 / send_duration_s
        } else {
            0.0
        },
        throughput: if answer_span_s > 0.0 {
            t.answered as f64 / answer_span_s
        } else {
            0.0
        },
        rtt_us: Percentiles::of(&t.rtt_us),
        rtt_failed_as_late_us: late_percentiles(&t.ok_rtt_us, t.sent - ok),
        ok_rtt_us_counts: recorded(&t.ok_rtt_us),
        lag_us: Percentiles::of(&t.lag_us),
        platform_latency_us: Percentiles::of(&t.platform_latency_us),
        mean_batch_size: (ok > 0).then(|| t.batch_size_sum as f64 / ok as f64),
        ok_by_batch_size: t.ok_by_batch_size.clone(),
    })
}

/// The client crate's set-up and send errors: socket errors stay socket
/// errors (exit 1), settings it refuses are usage errors (exit 2).
fn from_client_error(e: kneepoint_client::ClientError) -> ClientError {
    match e {
        kneepoint_client::ClientError::Io(e) => ClientError::Socket(e),
        e => ClientError::Usage(e.to_string()),
    }
}

/// One run's sender: the schedule on top of the client's submit/poll.
struct Loop<'a> {
    cfg: &'a ClientConfig,
    client: &'a Client,
    tally: Tally,
    /// Requests out and not collected yet: the instant each one's round
    /// trip counts from.
    out: HashMap<RequestId, Instant>,
    /// Closed loop: when the slots of requests that failed unreachable
    /// free up (their timeout after they were sent), soonest first; so an
    /// absent platform that answers with ICMP is not sent to in a tight
    /// loop (as before the client crate: they timed out).
    held: VecDeque<Instant>,
    /// `--record`: where each request's end is written.
    record: Option<Record>,
}

/// The `--record` file and the clocks' reading it converts instants with.
struct Record {
    w: io::BufWriter<std::fs::File>,
    epoch: (Instant, std::time::SystemTime),
    /// The first write that failed: the run ends with it.
    failed: Option<io::Error>,
}

impl Record {
    fn unix_us(&self, at: Instant) -> u128 {
        let (mono, wall) = self.epoch;
        let wall = if at >= mono {
            wall + (at - mono)
        } else {
            wall - (mono - at)
        };
        wall.duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_micros())
    }

    /// One request's line (see [`RECORD_HEADER`]).
    fn ended(
        &mut self,
        id: Option<RequestId>,
        from: Instant,
        outcome: &str,
        answered: Option<Instant>,
    ) -> io::Result<()> {
        let sent = self.unix_us(from);
        let answered = answered.map(|a| self.unix_us(a).to_string());
        writeln!(
            self.w,
            "{},{sent},{outcome},{}",
            id.map(|i| i.0.to_string()).unwrap_or_default(),
            answered.unwrap_or_default()
        )
    }
}

impl Loop<'_> {
    /// Sends every request, collecting results between sends.
    fn send_all(&mut self, inputs: &Inputs) -> Result<(), ClientError> {
        let cfg = self.cfg;
        let mut rng = StdRng::seed_from_u64(cfg.seed);
        let start = Instant::now();
        let mut next_at = start;
        for i in 0u64.. {
            if self.stopping(i, start) {
                break;
            }
            let scheduled = match cfg.load {
                Load::Open { rate, arrival } => {
                    // Never waits for an answer: collects what ended, and
                    // waits for the schedule only (collecting meanwhile).
                    self.collect(Duration::ZERO);
                    loop {
                        let now = Instant::now();
                        if now >= next_at {
                            break;
                        }
                        self.collect(next_at - now);
                    }
                    let scheduled = next_at;
                    next_at += Duration::from_secs_f64(gap(arrival, rate, &mut rng));
                    Some(scheduled)
                }
                Load::Closed { concurrency } => {
                    while self.in_flight() >= concurrency {
                        if cfg.stop_early.load(Ordering::Relaxed) {
                            return Ok(());
                        }
                        let wait = self.held.front().map_or(POLL, |h| {
                            h.saturating_duration_since(Instant::now()).min(POLL)
                        });
                        self.collect(wait);
                    }
                    // Sent as soon as a slot is free: no schedule to lag
                    // (not the clock read here: a preemption before the send
                    // would count as lag).
                    None
                }
            };
            if self.stopping(i, start) {
                break;
            }
            self.submit(inputs.get(i), scheduled)?;
        }
        Ok(())
    }

    /// Whether to stop before request `i`.
    fn stopping(&self, i: u64, start: Instant) -> bool {
        if self.cfg.stop_early.load(Ordering::Relaxed) {
            return true;
        }
        match self.cfg.stop {
            Stop::Requests(n) => i >= n,
            Stop::Duration(d) => start.elapsed() >= d,
        }
    }

    /// Sends one request scheduled at `scheduled` (`None`: now, no
    /// schedule). Its timeout counts from `scheduled`, as its round trip: a
    /// request sent late by its lag has that much less time.
    fn submit(&mut self, payload: &[u8], scheduled: Option<Instant>) -> Result<(), ClientError> {
        let now = Instant::now();
        let from = self.tally.sent(scheduled.unwrap_or(now), now);
        let timeout = self
            .cfg
            .timeout
            .saturating_sub(now - from)
            .max(Duration::from_micros(1));
        match self
            .client
            .submit_with_timeout(self.cfg.if_id, payload, timeout)
        {
            Ok(id) => {
                self.out.insert(id, from);
                Ok(())
            }
            // The platform's host says nothing listens (ICMP): unanswered.
            Err(kneepoint_client::ClientError::Unreachable) => {
                self.record(None, from, "unreachable", None);
                self.unreachable(from);
                Ok(())
            }
            Err(e) => Err(from_client_error(e)),
        }
    }

    fn unreachable(&mut self, from: Instant) {
        self.tally.ended(from, None);
        if matches!(self.cfg.load, Load::Closed { .. }) {
            self.held.push_back(from + self.cfg.timeout);
        }
    }

    /// Requests taking a closed-loop slot: out, or held after failing
    /// unreachable.
    fn in_flight(&mut self) -> usize {
        let now = Instant::now();
        while self.held.front().is_some_and(|h| *h <= now) {
            self.held.pop_front();
        }
        self.out.len() + self.held.len()
    }

    /// Waits up to `wait` for requests to end, and accounts for those that
    /// did.
    fn collect(&mut self, wait: Duration) {
        for (id, result, reply) in self.client.poll_replies(wait) {
            let Some(from) = self.out.remove(&id) else {
                continue; // not this loop's (cannot happen: one client each)
            };
            match (result, reply) {
                (Err(kneepoint_client::ClientError::Unreachable), _) => {
                    self.record(Some(id), from, "unreachable", None);
                    self.unreachable(from)
                }
                (_, reply) => {
                    match &reply {
                        Some(r) => {
                            self.record(Some(id), from, r.status.as_str(), Some(r.received_at))
                        }
                        None => self.record(Some(id), from, "unanswered", None),
                    }
                    self.tally.ended(from, reply.as_ref())
                }
            }
        }
    }

    /// Writes a request's line to the `--record` file, if there is one (a
    /// send refused as unreachable before it had an id: an empty id).
    fn record(&mut self, id: Option<RequestId>, from: Instant, outcome: &str, at: Option<Instant>) {
        if let Some(r) = self.record.as_mut().filter(|r| r.failed.is_none()) {
            if let Err(e) = r.ended(id, from, outcome, at) {
                r.failed = Some(e);
            }
        }
    }
}

/// Parses a duration: `250ms`, `500us`, `2s`, `1.5` (seconds).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let (num, scale) = if let Some(n) = t.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = t.strip_suffix("us") {
        (n, 1e-6)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1.0)
    } else {
        (t, 1.0)
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("bad duration {s:?} (e.g. 500ms, 2s, 1.5)"))?;
    if !(v.is_finite() && v >= 0.0) {
        return Err(format!("bad duration {s:?}: must be >= 0"));
    }
    Ok(Duration::from_secs_f64(v * scale))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_count_as_later_than_any_ok_answer() {
        let mut ok = Histogram::<u64>::new_with_bounds(1, HIST_MAX_US, 3).unwrap();
        for ms in 1..=98u64 {
            ok.record(ms * 1000).unwrap();
        }
        // 98 OK, 2 failed: p50 and p90 are OK round trips (ranks 50 and
        // 90), p99 (rank 99) falls among the failures.
        let l = late_percentiles(&ok, 2);
        assert_eq!((l.count, l.failed), (100, 2));
        assert_eq!(l.p50, Some(ok.highest_equivalent(50_000)));
        assert_eq!(l.p90, Some(ok.highest_equivalent(90_000)));
        assert_eq!(l.p99, None);
        // Nothing failed: the OK answers' own nearest-rank percentiles.
        let l = late_percentiles(&ok, 0);
        assert_eq!(l.p99, Some(ok.highest_equivalent(98_000)));
        assert_eq!(l.p50, Some(ok.highest_equivalent(49_000)));
        // One failure in a hundred: p99 is the last OK answer.
        ok.record(99_000).unwrap();
        assert_eq!(
            late_percentiles(&ok, 1).p99,
            Some(ok.highest_equivalent(99_000))
        );
        // Nothing at all, or only failures.
        let empty = Histogram::<u64>::new_with_bounds(1, HIST_MAX_US, 3).unwrap();
        assert_eq!(late_percentiles(&empty, 0).p50, None);
        assert_eq!(late_percentiles(&empty, 3).p50, None);
    }

    #[test]
    fn recorded_values_give_back_the_histograms_own_percentiles() {
        let mut ok = Histogram::<u64>::new_with_bounds(1, HIST_MAX_US, 3).unwrap();
        for (us, n) in [
            (5_071u64, 40u64),
            (6_300, 30),
            (12_345, 20),
            (19_990, 9),
            (250_000, 1),
        ] {
            ok.record_n(us, n).unwrap();
        }
        let pairs = recorded(&ok);
        assert_eq!(pairs.len(), 5);
        assert!(pairs.windows(2).all(|w| w[0][0] < w[1][0]));
        assert_eq!(pairs.iter().map(|p| p[1]).sum::<u64>(), ok.len());
        // The k-th smallest value, read from the pairs, is the histogram's
        // own value at that rank: what a harness merging windows computes.
        let kth = |k: u64| {
            let mut seen = 0;
            pairs
                .iter()
                .find(|p| {
                    seen += p[1];
                    seen >= k
                })
                .map(|p| p[0])
        };
        let l = late_percentiles(&ok, 0);
        assert_eq!(kth(50), l.p50);
        assert_eq!(kth(90), l.p90);
        assert_eq!(kth(99), l.p99);
        assert_eq!(kth(100), Some(ok.highest_equivalent(250_000)));
        assert!(recorded(&Histogram::<u64>::new(3).unwrap()).is_empty());
    }
    use std::net::UdpSocket;
    use std::sync::atomic::AtomicUsize;
    use std::sync::Mutex;
    use std::thread::JoinHandle;

    use kp_wire::{Fragment, FragmentRepr, MsgType, ResponseRepr};

    const MS: Duration = Duration::from_millis(1);

    fn reply(status: Status, batch: u16, sent_at: Instant, received_at: Instant) -> Reply {
        Reply {
            status,
            batch_size: batch,
            platform_latency_us: 250,
            sent_at,
            received_at,
        }
    }

    #[test]
    fn round_trips_count_from_the_schedule_and_lag_is_recorded() {
        let t0 = Instant::now();
        let mut t = Tally::new();
        // Open loop, sent 3 ms behind schedule, answered 10 ms after it:
        // its round trip is 10 ms, not 7.
        let from = t.sent(t0, t0 + 3 * MS);
        assert_eq!(from, t0);
        t.ended(from, Some(&reply(Status::Ok, 4, t0 + 3 * MS, t0 + 10 * MS)));
        // Sent on time (closed loop: scheduled when sent), or early: no lag.
        let on_time = t.sent(t0 + 20 * MS, t0 + 20 * MS);
        t.ended(
            on_time,
            Some(&reply(Status::Overloaded, 0, on_time, t0 + 22 * MS)),
        );
        let early = t.sent(t0 + 40 * MS, t0 + 30 * MS);
        assert_eq!(early, t0 + 30 * MS);
        t.ended(early, None);
        assert_eq!((t.sent, t.answered, t.unanswered), (3, 2, 1));
        assert_eq!(t.by_status["ok"], 1);
        assert_eq!(t.by_status["overloaded"], 1);
        assert_eq!(t.by_status.len(), Status::ALL.len(), "every status a key");
        assert_eq!(t.batch_size_sum, 4, "OK answers only");
        assert_eq!(
            t.ok_by_batch_size,
            BTreeMap::from([(4, 1)]),
            "OK answers only, by batch size"
        );
        assert_eq!(t.lag_us.len(), 3);
        assert_eq!(t.lag_us.max(), t.lag_us.highest_equivalent(3_000));
        assert_eq!(t.lag_us.min(), 0);
        assert_eq!(t.rtt_us.len(), 2);
        assert_eq!(t.rtt_us.max(), t.rtt_us.highest_equivalent(10_000));
        assert_eq!(t.rtt_us.min(), t.rtt_us.lowest_equivalent(2_000));
        assert_eq!(t.platform_latency_us.len(), 2);
        assert_eq!(t.first_send, Some(t0));
        assert_eq!(t.last_answer, Some(t0 + 22 * MS));
    }

    #[test]
    fn gaps_follow_the_rate() {
        let mut rng = StdRng::seed_from_u64(3);
        assert_eq!(gap(Arrival::Constant, 250.0, &mut rng), 0.004);
        let n = 20_000;
        let gaps: Vec<f64> = (0..n)
            .map(|_| gap(Arrival::Poisson, 1000.0, &mut rng))
            .collect();
        assert!(gaps.iter().all(|g| g.is_finite() && *g >= 0.0));
        let mean = gaps.iter().sum::<f64>() / n as f64;
        assert!((mean - 0.001).abs() < 0.00005, "mean gap {mean}");
        let mut again = StdRng::seed_from_u64(3);
        gap(Arrival::Constant, 250.0, &mut again);
        assert_eq!(gap(Arrival::Poisson, 1000.0, &mut again), gaps[0], "seeded");
    }

    /// What the fake platform does with the n-th request it receives.
    #[derive(Clone, Copy, Debug)]
    enum Act {
        Answer(Status),
        /// Answer OK twice.
        Twice,
        /// Garbage, an answer to a request never made, then OK.
        Garbage,
        Silent,
        Delay(Duration),
    }

    /// NOT the platform: a UDP socket that answers one-fragment requests
    /// as a script says, and records their ids and how many were
    /// unanswered at once at most.
    struct Fake {
        addr: SocketAddr,
        ids: Arc<Mutex<Vec<u64>>>,
        max_open: Arc<AtomicUsize>,
        stop: Arc<AtomicBool>,
        thread: Option<JoinHandle<()>>,
    }

    impl Fake {
        fn start(script: impl Fn(usize) -> Act + Send + 'static) -> Fake {
            let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
            socket.set_read_timeout(Some(MS)).unwrap();
            let addr = socket.local_addr().unwrap();
            let ids = Arc::new(Mutex::new(Vec::new()));
            let max_open = Arc::new(AtomicUsize::new(0));
            let stop = Arc::new(AtomicBool::new(false));
            let thread = {
                let (ids, max_open, stop) = (ids.clone(), max_open.clone(), stop.clone());
                std::thread::spawn(move || {
                    let mut delayed: Vec<(Instant, SocketAddr, FragmentRepr)> = Vec::new();
                    let mut buf = [0u8; 2048];
                    let mut n = 0;
                    while !stop.load(Ordering::Relaxed) {
                        let now = Instant::now();
                        delayed.retain(|(at, to, h)| {
                            let due = *at <= now;
                            if due {
                                answer(&socket, *to, h, h.request_id, Status::Ok);
                            }
                            !due
                        });
                        let Ok((len, from)) = socket.recv_from(&mut buf) else {
                            continue;
                        };
                        let h = FragmentRepr::parse(&Fragment::new_checked(&buf[..len]).unwrap());
                        assert_eq!(h.frag_count, 1, "one-fragment requests only");
                        ids.lock().unwrap().push(h.request_id);
                        match script(n) {
                            Act::Answer(s) => answer(&socket, from, &h, h.request_id, s),
                            Act::Twice => {
                                answer(&socket, from, &h, h.request_id, Status::Ok);
                                answer(&socket, from, &h, h.request_id, Status::Ok);
                            }
                            Act::Garbage => {
                                socket.send_to(b"junk", from).unwrap();
                                answer(&socket, from, &h, h.request_id ^ (1 << 63), Status::Ok);
                                answer(&socket, from, &h, h.request_id, Status::Ok);
                            }
                            Act::Silent => {}
                            Act::Delay(d) => {
                                // From now, not from the loop's `now`: that
                                // was read before recv_from waited.
                                delayed.push((Instant::now() + d, from, h));
                                max_open.fetch_max(delayed.len(), Ordering::Relaxed);
                            }
                        }
                        n += 1;
                    }
                })
            };
            Fake {
                addr,
                ids,
                max_open,
                stop,
                thread: Some(thread),
            }
        }

        fn ids(&self) -> Vec<u64> {
            self.ids.lock().unwrap().clone()
        }
    }

    impl Drop for Fake {
        fn drop(&mut self) {
            self.stop.store(true, Ordering::Relaxed);
            if let Some(t) = self.thread.take() {
                t.join().unwrap();
            }
        }
    }

    fn answer(socket: &UdpSocket, to: SocketAddr, h: &FragmentRepr, id: u64, status: Status) {
        let results = [(3u32, 0.5f32), (1, 0.25)];
        let repr = if status == Status::Ok {
            ResponseRepr {
                msg_type: MsgType::Response,
                if_id: h.if_id,
                request_id: id,
                send_ts_ns: h.send_ts_ns,
                status,
                batch_size: 4,
                latency_us: 250,
                results: &results,
            }
        } else {
            ResponseRepr::error(h.if_id, id, h.send_ts_ns, status, 99)
        };
        let mut out = vec![0u8; repr.wire_len()];
        repr.emit(&mut out).unwrap();
        socket.send_to(&out, to).unwrap();
    }

    fn config(dst: SocketAddr, load: Load, stop: Stop, timeout: Duration) -> ClientConfig {
        ClientConfig {
            bind: "127.0.0.1:0".parse().unwrap(),
            dst,
            if_id: 1,
            stop,
            stop_early: Arc::new(AtomicBool::new(false)),
            load,
            timeout,
            frag_size: 1000,
            frag_gap: Duration::ZERO,
            first_request_id: 1,
            seed: 0,
            linger: 20 * MS,
            record: None,
        }
    }

    fn inputs() -> Inputs {
        let shape = crate::input::InputShape {
            height: 4,
            width: 4,
            channels: 3,
        };
        Inputs::from_payloads(shape, vec![vec![7; shape.len()]])
    }

    #[test]
    fn every_request_and_every_datagram_ends_in_one_outcome() {
        let platform = Fake::start(|n| match n % 5 {
            0 => Act::Answer(Status::Ok),
            1 => Act::Answer(Status::Overloaded),
            2 => Act::Twice,
            3 => Act::Silent,
            _ => Act::Garbage,
        });
        let mut cfg = config(
            platform.addr,
            Load::Closed { concurrency: 3 },
            Stop::Requests(20),
            50 * MS,
        );
        cfg.first_request_id = 1000;
        let dir = std::env::temp_dir().join(format!("kp-record-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        cfg.record = Some(dir.join("record.csv"));
        let before = std::time::SystemTime::now();
        let r = run(&cfg, &inputs()).unwrap();
        assert_eq!((r.sent, r.answered, r.unanswered), (20, 16, 4), "{r:?}");
        // The record: a line per request, its outcome the fake's script for
        // the n-th request it saw, times within the run and answers after
        // their sends.
        let text = std::fs::read_to_string(dir.join("record.csv")).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        let mut lines = text.lines();
        assert_eq!(lines.next(), Some(RECORD_HEADER));
        let start_us = before
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_micros();
        let ids = platform.ids();
        let mut seen = Vec::new();
        for line in lines {
            let f: Vec<&str> = line.split(',').collect();
            assert_eq!(f.len(), 4, "{line}");
            let id: u64 = f[0].parse().unwrap();
            let sent: u128 = f[1].parse().unwrap();
            let n = ids.iter().position(|&i| i == id).unwrap();
            let want = match n % 5 {
                1 => "overloaded",
                3 => "unanswered",
                _ => "ok",
            };
            assert_eq!(f[2], want, "{line}");
            assert!(sent + 1_000 >= start_us, "{line}: sent before the run");
            if want == "unanswered" {
                assert_eq!(f[3], "", "{line}");
            } else {
                assert!(f[3].parse::<u128>().unwrap() >= sent, "{line}");
            }
            seen.push(id);
        }
        seen.sort_unstable();
        assert_eq!(seen, (1000..1020).collect::<Vec<u64>>(), "one line each");
        assert_eq!(
            (r.duplicates, r.late, r.unexpected, r.malformed),
            (4, 0, 4, 4),
            "{r:?}"
        );
        assert_eq!(r.status["ok"], 12);
        assert_eq!(r.status["overloaded"], 4);
        assert_eq!(r.status.len(), Status::ALL.len());
        assert_eq!((r.rtt_us.count, r.platform_latency_us.count), (16, 16));
        assert_eq!(r.mean_batch_size, Some(4.0));
        assert_eq!(r.ok_by_batch_size, BTreeMap::from([(4, 12)]));
        assert_eq!((r.payload_len, r.frag_count, r.datagrams_sent), (48, 1, 20));
        assert_eq!((r.mode, r.concurrency, r.rate), ("closed", Some(3), None));
        assert_eq!(r.lag_us.max, 0, "closed loop: sent when a slot frees");
        assert!(r.throughput > 0.0 && r.answer_span_s > 0.0, "{r:?}");
        let mut ids = platform.ids();
        ids.sort_unstable();
        assert_eq!(ids, (1000..1020).collect::<Vec<u64>>(), "ids count up");
        // The text form has every line.
        let text = r.to_text();
        for line in ["sent", "answered", "unanswered", "duplicates", "rtt µs"] {
            assert!(text.contains(line), "{text}");
        }
        assert!(!text.contains("send lag"), "{text}");
    }

    #[test]
    fn closed_loop_keeps_concurrency_requests_outstanding() {
        let platform = Fake::start(|_| Act::Delay(10 * MS));
        let cfg = config(
            platform.addr,
            Load::Closed { concurrency: 4 },
            Stop::Requests(24),
            Duration::from_secs(2),
        );
        let r = run(&cfg, &inputs()).unwrap();
        assert_eq!((r.sent, r.answered), (24, 24), "{r:?}");
        // Never more than 4 at the platform at once (the client counts a
        // request out until it has the answer), and it fills up.
        let max_open = platform.max_open.load(Ordering::Relaxed);
        assert!((2..=4).contains(&max_open), "{max_open} at once");
        assert!(r.rtt_us.min >= 10_000, "{r:?}");
    }

    #[test]
    fn open_loop_sends_on_schedule_whatever_the_answers() {
        // Never answers: a sender that waited for answers would send one
        // request per timeout.
        let platform = Fake::start(|_| Act::Silent);
        let cfg = config(
            platform.addr,
            Load::Open {
                rate: 200.0,
                arrival: Arrival::Constant,
            },
            Stop::Requests(20),
            Duration::from_secs(1),
        );
        let started = Instant::now();
        let r = run(&cfg, &inputs()).unwrap();
        assert!(started.elapsed() < Duration::from_secs(3), "{r:?}");
        assert_eq!((r.sent, r.unanswered, r.answered), (20, 20, 0), "{r:?}");
        assert_eq!(r.lag_us.count, 20);
        // 19 gaps of 5 ms.
        assert!(
            (0.09..1.0).contains(&r.send_duration_s),
            "send duration {r:?}"
        );
        assert_eq!((r.mode, r.arrival), ("open", Some(Arrival::Constant)));
        assert!(r.to_text().contains("send lag"));
    }

    #[test]
    fn stop_early_ends_a_run_before_its_duration_and_resolves_what_is_out() {
        // A platform that never answers: every request sent times out.
        let platform = UdpSocket::bind("127.0.0.1:0").unwrap();
        platform
            .set_read_timeout(Some(Duration::from_secs(60)))
            .unwrap();
        let duration = Duration::from_secs(60);
        let mut cfg = config(
            platform.local_addr().unwrap(),
            Load::Closed { concurrency: 2 },
            Stop::Duration(duration),
            20 * MS,
        );
        cfg.linger = Duration::ZERO;
        let stop_early = cfg.stop_early.clone();
        let started = Instant::now();
        let client = std::thread::spawn(move || run(&cfg, &inputs()));
        // Requests are out: stop.
        let mut buf = [0u8; 2048];
        platform.recv(&mut buf).expect("a request");
        stop_early.store(true, Ordering::Relaxed);
        let report = client.join().unwrap().unwrap();
        // Without the flag the run would have lasted its whole duration.
        assert!(started.elapsed() < duration, "not stopped early");
        assert!(report.sent >= 1, "{report:?}");
        assert_eq!(report.unanswered, report.sent, "{report:?}");
        assert_eq!(report.answered, 0, "{report:?}");
    }

    #[test]
    fn usage_errors_are_usage_errors() {
        let platform = Fake::start(|_| Act::Silent);
        let mut cfg = config(
            platform.addr,
            Load::Closed { concurrency: 0 },
            Stop::Requests(1),
            MS,
        );
        assert!(matches!(run(&cfg, &inputs()), Err(ClientError::Usage(_))));
        cfg.load = Load::Closed { concurrency: 1 };
        cfg.frag_size = 0;
        assert!(matches!(run(&cfg, &inputs()), Err(ClientError::Usage(_))));
        cfg.frag_size = 1000;
        cfg.dst = "[::1]:9".parse().unwrap();
        assert!(matches!(run(&cfg, &inputs()), Err(ClientError::Usage(_))));
    }

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("2s").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_duration("1.5").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("20us").unwrap(), Duration::from_micros(20));
        assert!(parse_duration("-1").is_err() && parse_duration("soon").is_err());
    }
}
