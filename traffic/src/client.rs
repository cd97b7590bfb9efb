//! A live client: requests over a real UDP socket, answers accounted for.
//!
//! [`run`] sends requests to the platform from one UDP socket, fragmented
//! per docs/PROTOCOL.md, either open loop (at a rate, constant or Poisson
//! spacing: the sender never waits for answers) or closed loop (a fixed
//! number outstanding: a new request goes out when one is answered or times
//! out). A receiver thread reads every datagram that comes back.
//!
//! The accounting is [`Tracker`], which is sans-IO (time is an argument), so
//! it is tested without sockets. Every request ends in exactly one of
//! *answered* (first well-formed answer that matches it: if_id, request_id
//! and echoed send_ts_ns) or *unanswered* (no such answer within the
//! timeout). Every datagram received ends in exactly one of: the answer of
//! a request, `duplicates` (another answer to an answered request),
//! `late` (an answer to a request already counted unanswered),
//! `unexpected` (no request with that request_id outstanding, or if_id or
//! send_ts_ns not matching), `malformed` (not a well-formed response per
//! `Response::new_checked`).
//!
//! RTT is measured from just before the first fragment is sent to the
//! moment the receiver thread has the answer; `latency_us` is the
//! platform's own figure from the answer. Both go into HDR histograms
//! (microseconds, 3 significant digits).

use std::collections::{BTreeMap, VecDeque};
use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use hdrhistogram::Histogram;
use kneepoint_client::frag::{self, Fragmenter};
use kp_wire::{MsgType, Response, Status, HEADER_LEN};
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

/// How often the receiver wakes to expire timed-out requests when nothing
/// arrives: a tenth of the smallest sensible timeout.
const RECV_POLL: Duration = Duration::from_millis(5);

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
    /// Pause between two fragments of one request (0: back to back).
    pub frag_gap: Duration,
    /// request_id of the first request; the following ones count up.
    pub first_request_id: u64,
    /// Seed of the Poisson spacing.
    pub seed: u64,
    /// Listening time after the last request is resolved.
    pub linger: Duration,
}

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

/// What happened to one received datagram.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Received {
    /// The first answer to an outstanding request.
    Answer(Status),
    /// Another answer to an answered request.
    Duplicate,
    /// An answer to a request already counted unanswered.
    Late,
    /// No such request outstanding, or its if_id / send_ts_ns differ.
    Unexpected,
    /// Not a well-formed response.
    Malformed,
}

#[derive(Clone, Copy, Debug)]
enum ReqState {
    Pending {
        sent_at: Instant,
        send_ts_ns: u64,
        if_id: u16,
    },
    Answered,
    TimedOut,
}

/// Sans-IO accounting of requests and answers (see the module docs).
#[derive(Debug)]
pub struct Tracker {
    first_id: u64,
    timeout: Duration,
    states: Vec<ReqState>,
    /// Request numbers (id - first_id) still pending, in send order: since
    /// every request has the same timeout, the oldest expires first.
    pending: VecDeque<usize>,
    outstanding: usize,
    tally: Tally,
}

/// Counters and histograms of a run.
#[derive(Debug, Clone)]
pub struct Tally {
    /// Requests sent.
    pub sent: u64,
    /// Requests answered (first matching answer).
    pub answered: u64,
    /// Requests not answered within the timeout.
    pub unanswered: u64,
    /// Extra answers to answered requests.
    pub duplicates: u64,
    /// Answers to requests already counted unanswered.
    pub late: u64,
    /// Answers matching no outstanding request.
    pub unexpected: u64,
    /// Datagrams that are not well-formed responses.
    pub malformed: u64,
    /// Answers by status (first answers only).
    pub by_status: BTreeMap<&'static str, u64>,
    /// Client-side round-trip times, µs: in open loop from the request's
    /// scheduled time (a sender that falls behind is charged its lag).
    pub rtt_us: Histogram<u64>,
    /// Open loop: how late each request went out after its scheduled
    /// time, µs.
    pub lag_us: Histogram<u64>,
    /// The platform's `latency_us` of answers.
    pub platform_latency_us: Histogram<u64>,
    /// Sum of `batch_size` over OK answers.
    pub batch_size_sum: u64,
    /// When the first request was sent.
    pub first_send: Option<Instant>,
    /// When the last answer came.
    pub last_answer: Option<Instant>,
}

impl Tally {
    fn new() -> Tally {
        let hist =
            || Histogram::new_with_bounds(1, HIST_MAX_US, 3).expect("valid histogram bounds");
        Tally {
            sent: 0,
            answered: 0,
            unanswered: 0,
            duplicates: 0,
            late: 0,
            unexpected: 0,
            malformed: 0,
            by_status: Status::ALL.iter().map(|s| (s.as_str(), 0)).collect(),
            rtt_us: hist(),
            lag_us: hist(),
            platform_latency_us: hist(),
            batch_size_sum: 0,
            first_send: None,
            last_answer: None,
        }
    }
}

impl Tracker {
    /// A tracker whose requests are numbered from `first_id` up.
    pub fn new(first_id: u64, timeout: Duration) -> Tracker {
        Tracker {
            first_id,
            timeout,
            states: Vec::new(),
            pending: VecDeque::new(),
            outstanding: 0,
            tally: Tally::new(),
        }
    }

    /// Records that the next request (id `first_id + sent`) goes out at
    /// `at`; returns its request_id.
    pub fn sent(&mut self, if_id: u16, send_ts_ns: u64, at: Instant) -> u64 {
        self.sent_scheduled(if_id, send_ts_ns, at, at)
    }

    /// [`Tracker::sent`] for a request scheduled at `scheduled` (open
    /// loop) that goes out at `at`: its round trip and timeout count from
    /// `scheduled`, and `at - scheduled` is recorded as lag.
    pub fn sent_scheduled(
        &mut self,
        if_id: u16,
        send_ts_ns: u64,
        scheduled: Instant,
        at: Instant,
    ) -> u64 {
        let scheduled = scheduled.min(at);
        self.tally
            .lag_us
            .saturating_record(at.saturating_duration_since(scheduled).as_micros() as u64);
        let at = scheduled;
        let n = self.states.len();
        self.states.push(ReqState::Pending {
            sent_at: at,
            send_ts_ns,
            if_id,
        });
        self.pending.push_back(n);
        self.outstanding += 1;
        self.tally.sent += 1;
        self.tally.first_send.get_or_insert(at);
        self.first_id.wrapping_add(n as u64)
    }

    /// Accounts for one received datagram.
    pub fn received(&mut self, datagram: &[u8], at: Instant) -> Received {
        let t = &mut self.tally;
        let Ok(r) = Response::new_checked(datagram) else {
            t.malformed += 1;
            return Received::Malformed;
        };
        let n = r.request_id().wrapping_sub(self.first_id);
        let Some(state) = usize::try_from(n).ok().and_then(|n| self.states.get_mut(n)) else {
            t.unexpected += 1;
            return Received::Unexpected;
        };
        match *state {
            ReqState::Pending {
                sent_at,
                send_ts_ns,
                if_id,
            } => {
                if r.if_id().0 != if_id || r.send_ts_ns() != send_ts_ns {
                    t.unexpected += 1;
                    return Received::Unexpected;
                }
                *state = ReqState::Answered;
                self.outstanding -= 1;
                t.answered += 1;
                let status = r.status();
                *t.by_status.entry(status.as_str()).or_default() += 1;
                t.rtt_us.saturating_record(
                    at.saturating_duration_since(sent_at).as_micros().max(1) as u64,
                );
                t.platform_latency_us
                    .saturating_record(u64::from(r.latency_us()).max(1));
                if status == Status::Ok && r.msg_type() == MsgType::Response {
                    t.batch_size_sum += u64::from(r.batch_size());
                }
                t.last_answer = Some(at);
                Received::Answer(status)
            }
            ReqState::Answered => {
                t.duplicates += 1;
                Received::Duplicate
            }
            ReqState::TimedOut => {
                t.late += 1;
                Received::Late
            }
        }
    }

    /// Counts every request pending longer than the timeout at `now` as
    /// unanswered; returns how many it expired.
    pub fn expire(&mut self, now: Instant) -> usize {
        let mut expired = 0;
        while let Some(&n) = self.pending.front() {
            match self.states[n] {
                ReqState::Pending { sent_at, .. } => {
                    if now.saturating_duration_since(sent_at) < self.timeout {
                        break;
                    }
                    self.states[n] = ReqState::TimedOut;
                    self.outstanding -= 1;
                    self.tally.unanswered += 1;
                    expired += 1;
                }
                ReqState::Answered | ReqState::TimedOut => {}
            }
            self.pending.pop_front();
        }
        expired
    }

    /// When the oldest pending request times out, if any is pending.
    pub fn next_deadline(&mut self) -> Option<Instant> {
        while let Some(&n) = self.pending.front() {
            if let ReqState::Pending { sent_at, .. } = self.states[n] {
                return Some(sent_at + self.timeout);
            }
            self.pending.pop_front();
        }
        None
    }

    /// Requests neither answered nor timed out.
    pub fn outstanding(&self) -> usize {
        self.outstanding
    }

    /// The counters so far.
    pub fn tally(&self) -> &Tally {
        &self.tally
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
    /// Client-side round-trip time, µs (open loop: from the scheduled time).
    pub rtt_us: Percentiles,
    /// Open loop: send lag behind the schedule, µs.
    pub lag_us: Percentiles,
    /// The platform's `latency_us`.
    pub platform_latency_us: Percentiles,
    /// Mean `batch_size` of OK answers (`null` when there is none).
    pub mean_batch_size: Option<f64>,
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

fn wall_clock_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
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

    let socket = UdpSocket::bind(cfg.bind)?;
    // Connected: answers come from the address requests go to (docs/PROTOCOL.md),
    // and the kernel filters out datagrams from anyone else.
    socket.connect(cfg.dst)?;
    let rx = socket.try_clone()?;
    rx.set_read_timeout(Some(RECV_POLL))?;

    let shared = Arc::new((
        Mutex::new(Tracker::new(cfg.first_request_id, cfg.timeout)),
        Condvar::new(),
    ));
    let done_sending = Arc::new(AtomicBool::new(false));

    let receiver = {
        let shared = Arc::clone(&shared);
        let done = Arc::clone(&done_sending);
        let linger = cfg.linger;
        std::thread::Builder::new()
            .name("kp-client-rx".into())
            .spawn(move || receive_loop(&rx, &shared, &done, linger))?
    };

    let send_result = send_loop(cfg, inputs, &socket, &shared);
    let send_end = Instant::now();
    done_sending.store(true, Ordering::Release);
    shared.1.notify_all();
    let recv_result = receiver.join().expect("receiver thread panicked");
    let datagrams_sent = send_result?;
    recv_result?;

    let tracker = shared.0.lock().expect("tracker lock");
    let t = tracker.tally();
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
        duplicates: t.duplicates,
        late: t.late,
        unexpected: t.unexpected,
        malformed: t.malformed,
        status: t.by_status.clone(),
        datagrams_sent,
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
        lag_us: Percentiles::of(&t.lag_us),
        platform_latency_us: Percentiles::of(&t.platform_latency_us),
        mean_batch_size: (ok > 0).then(|| t.batch_size_sum as f64 / ok as f64),
    })
}

/// Sends every request; returns the number of datagrams sent.
fn send_loop(
    cfg: &ClientConfig,
    inputs: &Inputs,
    socket: &UdpSocket,
    shared: &(Mutex<Tracker>, Condvar),
) -> Result<u64, ClientError> {
    let (lock, cvar) = shared;
    let mut rng = StdRng::seed_from_u64(cfg.seed);
    let mut buf = vec![0u8; HEADER_LEN + cfg.frag_size];
    let start = Instant::now();
    let mut next_at = start;
    let mut datagrams = 0u64;
    for i in 0u64.. {
        let now = Instant::now();
        let mut scheduled = now;
        if cfg.stop_early.load(Ordering::Relaxed) {
            break;
        }
        match cfg.stop {
            Stop::Requests(n) if i >= n => break,
            Stop::Duration(d) if now.saturating_duration_since(start) >= d => break,
            _ => {}
        }
        match cfg.load {
            Load::Open { rate, arrival } => {
                if next_at > now {
                    std::thread::sleep(next_at - now);
                }
                scheduled = next_at;
                let gap = match arrival {
                    Arrival::Constant => 1.0 / rate,
                    // Inverse-CDF sampling of Exp(rate); 1-u is in (0, 1].
                    Arrival::Poisson => -(1.0 - rng.random::<f64>()).ln() / rate,
                };
                next_at += Duration::from_secs_f64(gap);
            }
            Load::Closed { concurrency } => {
                let mut tracker = lock.lock().expect("tracker lock");
                while tracker.outstanding() >= concurrency {
                    let wait = tracker
                        .next_deadline()
                        .map(|d| d.saturating_duration_since(Instant::now()))
                        .unwrap_or(RECV_POLL)
                        .max(Duration::from_micros(100));
                    tracker = cvar.wait_timeout(tracker, wait).expect("tracker lock").0;
                    tracker.expire(Instant::now());
                }
            }
        }
        if let Stop::Duration(d) = cfg.stop {
            if Instant::now().saturating_duration_since(start) >= d {
                break;
            }
        }
        if cfg.stop_early.load(Ordering::Relaxed) {
            break;
        }
        let payload = inputs.get(i);
        let send_ts_ns = wall_clock_ns();
        let request_id = lock.lock().expect("tracker lock").sent_scheduled(
            cfg.if_id,
            send_ts_ns,
            scheduled,
            Instant::now(),
        );
        // run() checked the geometry with the same payload size.
        let mut frags = Fragmenter::new(cfg.if_id, request_id, send_ts_ns, payload, cfg.frag_size)
            .map_err(|e| ClientError::Usage(e.to_string()))?;
        let frag_count = frags.frag_count();
        let mut index = 0;
        while let Some(datagram) = frags.next_into(&mut buf) {
            send_datagram(socket, datagram)?;
            datagrams += 1;
            index += 1;
            if !cfg.frag_gap.is_zero() && index < frag_count {
                std::thread::sleep(cfg.frag_gap);
            }
        }
    }
    Ok(datagrams)
}

/// Sends one datagram. An ICMP port-unreachable from an earlier datagram
/// surfaces as `ConnectionRefused` on a connected socket; that is the
/// platform being absent, not a socket failure, so it is retried once and
/// then ignored (the request will count as unanswered).
fn send_datagram(socket: &UdpSocket, datagram: &[u8]) -> io::Result<()> {
    for _ in 0..2 {
        match socket.send(datagram) {
            Ok(_) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => continue,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn receive_loop(
    socket: &UdpSocket,
    shared: &(Mutex<Tracker>, Condvar),
    done_sending: &AtomicBool,
    linger: Duration,
) -> io::Result<()> {
    let (lock, cvar) = shared;
    // Larger than any response (36 + 8 * 65535 bytes would not fit a
    // datagram anyway); an oversized datagram is truncated and then fails
    // Response::new_checked, counted as malformed.
    let mut buf = vec![0u8; 65_536];
    let mut resolved_at: Option<Instant> = None;
    loop {
        let got = match socket.recv(&mut buf) {
            Ok(n) => Some(n),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                        | io::ErrorKind::ConnectionRefused
                ) =>
            {
                None
            }
            Err(e) => return Err(e),
        };
        let now = Instant::now();
        let mut tracker = lock.lock().expect("tracker lock");
        if let Some(n) = got {
            tracker.received(&buf[..n], now);
        }
        if tracker.expire(now) > 0 || got.is_some() {
            cvar.notify_all();
        }
        if done_sending.load(Ordering::Acquire) && tracker.outstanding() == 0 {
            let since = *resolved_at.get_or_insert(now);
            if now.saturating_duration_since(since) >= linger {
                return Ok(());
            }
        } else {
            resolved_at = None;
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
    use kp_wire::{IfId, ResponseRepr};

    fn answer(id: u64, if_id: u16, ts: u64, status: Status, batch: u16) -> Vec<u8> {
        let results = [(3u32, 0.5f32), (1, 0.25)];
        let repr = if status == Status::Ok {
            ResponseRepr {
                msg_type: MsgType::Response,
                if_id: IfId(if_id),
                request_id: id,
                send_ts_ns: ts,
                status,
                batch_size: batch,
                latency_us: 250,
                results: &results,
            }
        } else {
            ResponseRepr::error(IfId(if_id), id, ts, status, 99)
        };
        let mut buf = vec![0u8; repr.wire_len()];
        repr.emit(&mut buf).unwrap();
        buf
    }

    #[test]
    fn stop_early_ends_a_run_before_its_duration_and_resolves_what_is_out() {
        // A platform that never answers: every request sent times out.
        let platform = UdpSocket::bind("127.0.0.1:0").unwrap();
        platform
            .set_read_timeout(Some(Duration::from_secs(60)))
            .unwrap();
        let stop_early = Arc::new(AtomicBool::new(false));
        let duration = Duration::from_secs(60);
        let cfg = ClientConfig {
            bind: "127.0.0.1:0".parse().unwrap(),
            dst: platform.local_addr().unwrap(),
            if_id: 1,
            stop: Stop::Duration(duration),
            stop_early: stop_early.clone(),
            load: Load::Closed { concurrency: 2 },
            timeout: Duration::from_millis(20),
            frag_size: 1000,
            frag_gap: Duration::ZERO,
            first_request_id: 1,
            seed: 0,
            linger: Duration::ZERO,
        };
        let shape = crate::input::InputShape {
            height: 4,
            width: 4,
            channels: 3,
        };
        let inputs = Inputs::from_payloads(shape, vec![vec![7; shape.len()]]);
        let started = Instant::now();
        let client = std::thread::spawn(move || run(&cfg, &inputs));
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
    fn durations_parse() {
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("2s").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_duration("1.5").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("20us").unwrap(), Duration::from_micros(20));
        assert!(parse_duration("-1").is_err() && parse_duration("soon").is_err());
    }

    #[test]
    fn every_request_and_every_datagram_ends_in_one_outcome() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut tr = Tracker::new(100, ms(50));
        let ids: Vec<u64> = (0..5).map(|i| tr.sent(7, 1000 + i, t0 + ms(i))).collect();
        assert_eq!(ids, vec![100, 101, 102, 103, 104]);
        assert_eq!(tr.outstanding(), 5);

        assert_eq!(
            tr.received(&answer(100, 7, 1000, Status::Ok, 4), t0 + ms(10)),
            Received::Answer(Status::Ok)
        );
        assert_eq!(
            tr.received(&answer(100, 7, 1000, Status::Ok, 4), t0 + ms(11)),
            Received::Duplicate
        );
        assert_eq!(
            tr.received(&answer(101, 7, 1001, Status::Overloaded, 0), t0 + ms(12)),
            Received::Answer(Status::Overloaded)
        );
        // Wrong if_id, wrong echoed timestamp, unknown id, garbage.
        assert_eq!(
            tr.received(&answer(102, 8, 1002, Status::Ok, 1), t0 + ms(13)),
            Received::Unexpected
        );
        assert_eq!(
            tr.received(&answer(102, 7, 9, Status::Ok, 1), t0 + ms(13)),
            Received::Unexpected
        );
        assert_eq!(
            tr.received(&answer(99, 7, 999, Status::Ok, 1), t0 + ms(13)),
            Received::Unexpected
        );
        assert_eq!(
            tr.received(&answer(105, 7, 1005, Status::Ok, 1), t0 + ms(13)),
            Received::Unexpected
        );
        assert_eq!(
            tr.received(b"not a response", t0 + ms(13)),
            Received::Malformed
        );
        assert_eq!(
            tr.received(&answer(102, 7, 1002, Status::Ok, 2), t0 + ms(14)),
            Received::Answer(Status::Ok)
        );

        assert_eq!(tr.next_deadline(), Some(t0 + ms(3) + ms(50)));
        assert_eq!(tr.expire(t0 + ms(52)), 0);
        assert_eq!(tr.expire(t0 + ms(53)), 1, "103 times out");
        assert_eq!(tr.outstanding(), 1);
        assert_eq!(
            tr.received(&answer(103, 7, 1003, Status::Ok, 1), t0 + ms(60)),
            Received::Late
        );
        assert_eq!(tr.expire(t0 + ms(100)), 1, "104 times out");
        assert_eq!(tr.next_deadline(), None);

        let t = tr.tally();
        assert_eq!((t.sent, t.answered, t.unanswered), (5, 3, 2));
        assert_eq!(
            (t.duplicates, t.late, t.unexpected, t.malformed),
            (1, 1, 4, 1)
        );
        assert_eq!(t.by_status["ok"], 2);
        assert_eq!(t.by_status["overloaded"], 1);
        assert_eq!(t.by_status.len(), 6);
        assert_eq!(t.batch_size_sum, 6);
        assert_eq!(t.rtt_us.len(), 3);
        assert_eq!(t.rtt_us.max(), t.rtt_us.highest_equivalent(12_000));
        assert_eq!(t.platform_latency_us.len(), 3);
    }
}
