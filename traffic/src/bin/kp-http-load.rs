//! kp-http-load: an open-loop HTTP/1.1 load generator for the peer servers
//! that `bench/bench.py` compares kneepoint with (Triton Inference Server,
//! Ray Serve). It sends the same payloads kp-client sends (the same
//! synthetic 224x224x3 RGB u8 images from the same seed, `kp_traffic::input`)
//! as HTTP request bodies, at a fixed rate with Poisson (or constant) gaps,
//! never waiting for answers to send the next one, and reports what came
//! back in kp-client's terms (`--json`: sent, answered, unanswered, status,
//! throughput, `rtt_us` percentiles).
//!
//! Body formats (`--format`):
//! - `raw`: the image bytes as the body (`application/octet-stream`); Ray
//!   Serve's deployment reads `await request.body()`;
//! - `triton`: the KServe v2 inference protocol with Triton's binary tensor
//!   extension: a JSON header naming input `INPUT` (UINT8, [1, H, W, C],
//!   `binary_data_size`) and outputs `CLASSES`/`SCORES` as JSON, followed by
//!   the image bytes; `Inference-Header-Content-Length` says where the JSON
//!   ends. POST to `/v2/models/<model>/infer`.
//!
//! Open loop without coordinated omission: request `i` is *scheduled* at
//! `t_i` (Poisson process of `--rate`) and sent at `t_i` on a free one of
//! `--connections` persistent keep-alive connections (HTTP/1.1 allows one
//! request in flight per connection), each with its own worker thread.
//! Latency is measured from `t_i`, not from when a worker got to send it,
//! so a request that waits for a free connection is charged the wait (as
//! wrk2 does); `lag_us` reports that wait separately (it stays near zero
//! unless every connection is busy or the generator's CPU is starved).
//! Every connection is opened before the first request is scheduled. A
//! request not answered within `--timeout` of `t_i` is unanswered; its
//! connection is closed and reopened.
//!
//! No pacer thread: a worker that is free takes the next request off the
//! shared schedule (the earliest not yet taken), sleeps until its time and
//! sends it itself, as kp-client's pacer sends its own datagrams. Handing
//! each request from a pacer to a worker cost a cross-thread wake-up per
//! request (~0.1 ms p50 of `lag_us` on the 2-vCPU VM), which the UDP tool
//! does not pay, and which bench_gateway.py would have charged to the
//! gateway. A request still goes out at its time whenever any connection
//! is free then (the free worker took it, or an earlier one, already).

use std::collections::BTreeMap;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::process::ExitCode;
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Parser, ValueEnum};
use hdrhistogram::Histogram;
use kp_traffic::client::{late_percentiles, parse_duration, recorded};
use kp_traffic::input::{InputArgs, InputShape};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;

/// Highest latency the histograms hold, µs (one minute).
const HIST_MAX_US: u64 = 60_000_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Format {
    /// The image bytes as the body.
    Raw,
    /// KServe v2 / Triton binary tensor request.
    Triton,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum ArrivalArg {
    /// Exponential gaps (a Poisson process).
    Poisson,
    /// Equal gaps.
    Constant,
}

/// Open-loop HTTP load: POST images at a fixed rate, account for every answer.
#[derive(Debug, Parser)]
#[command(name = "kp-http-load", version)]
struct Args {
    /// Where to POST: http://HOST:PORT/PATH.
    #[arg(long)]
    url: String,
    /// Body format.
    #[arg(long, value_enum, default_value = "raw")]
    format: Format,
    /// Requests per second (open loop).
    #[arg(long, value_name = "R")]
    rate: f64,
    /// Spacing of requests.
    #[arg(long, value_enum, default_value = "poisson")]
    arrival: ArrivalArg,
    /// Send for this long (500ms, 10s, 2.5).
    #[arg(long, value_name = "TIME", value_parser = parse_duration, conflicts_with = "requests")]
    duration: Option<Duration>,
    /// Send this many requests (default 10 unless --duration).
    #[arg(long, value_name = "N")]
    requests: Option<u64>,
    /// Connections (and worker threads) at most; one request in flight each.
    #[arg(long, default_value_t = 64)]
    connections: usize,
    /// A request not answered this long after its scheduled time is
    /// unanswered.
    #[arg(long, default_value = "5s", value_name = "TIME", value_parser = parse_duration)]
    timeout: Duration,
    #[command(flatten)]
    inputs: InputArgs,
    /// Seed of synthetic images and Poisson gaps (kp-client's default: the
    /// same images).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Print the report as one JSON object.
    #[arg(long)]
    json: bool,
}

/// `http://host:port/path` split up.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Url {
    host: String,
    port: u16,
    path: String,
}

fn parse_url(s: &str) -> Result<Url> {
    let rest = s
        .strip_prefix("http://")
        .with_context(|| format!("{s}: only http:// URLs"))?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) => (h, p.parse().with_context(|| format!("{s}: bad port"))?),
        None => (authority, 80),
    };
    if host.is_empty() {
        bail!("{s}: no host");
    }
    Ok(Url {
        host: host.to_string(),
        port,
        path: path.to_string(),
    })
}

/// The whole HTTP request (head and body) for one payload.
fn build_request(url: &Url, format: Format, shape: InputShape, payload: &[u8]) -> Vec<u8> {
    let (extra, body): (String, Vec<u8>) = match format {
        Format::Raw => (String::new(), payload.to_vec()),
        Format::Triton => {
            let header = json!({
                "inputs": [{
                    "name": "INPUT",
                    "shape": [1, shape.height, shape.width, shape.channels],
                    "datatype": "UINT8",
                    "parameters": {"binary_data_size": payload.len()},
                }],
                "outputs": [
                    {"name": "CLASSES", "parameters": {"binary_data": false}},
                    {"name": "SCORES", "parameters": {"binary_data": false}},
                ],
            })
            .to_string();
            let mut body = header.clone().into_bytes();
            body.extend_from_slice(payload);
            (
                format!("Inference-Header-Content-Length: {}\r\n", header.len()),
                body,
            )
        }
    };
    let mut req = format!(
        "POST {} HTTP/1.1\r\nHost: {}:{}\r\nContent-Type: application/octet-stream\r\n{}Content-Length: {}\r\n\r\n",
        url.path,
        url.host,
        url.port,
        extra,
        body.len()
    )
    .into_bytes();
    req.extend_from_slice(&body);
    req
}

/// What a response said, once read whole.
#[derive(Debug, PartialEq, Eq)]
struct HttpResponse {
    status: u16,
    body: Vec<u8>,
    /// The server said `Connection: close` (or spoke HTTP/1.0).
    close: bool,
    /// kp-gateway's [`PLATFORM_RTT_HEADER`], if the server sent one.
    platform_rtt_us: Option<u64>,
}

/// The response header in which kp-gateway says how long the platform
/// took for the request (its UDP round trip, first fragment sent to answer
/// received, µs; the longest for a batch). With it, the time spent outside
/// the platform is measured per request: `beyond_platform_us`.
const PLATFORM_RTT_HEADER: &str = "kneepoint-platform-rtt-us";

/// A response head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Head {
    status: u16,
    /// `Content-Length` (None if chunked).
    len: Option<usize>,
    chunked: bool,
    close: bool,
    platform_rtt_us: Option<u64>,
}

/// Where the head of a response ends (index past `\r\n\r\n`), if it is in
/// `buf` yet.
fn head_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4)
}

/// The parts of a response head that matter here.
fn parse_head(head: &[u8]) -> io::Result<Head> {
    let bad = |m: &str| io::Error::new(io::ErrorKind::InvalidData, m.to_string());
    let text = std::str::from_utf8(head).map_err(|_| bad("response head is not UTF-8"))?;
    let mut lines = text.split("\r\n");
    let status_line = lines.next().ok_or_else(|| bad("empty response"))?;
    let mut parts = status_line.split_whitespace();
    let version = parts.next().unwrap_or("");
    if !version.starts_with("HTTP/1.") {
        return Err(bad("not an HTTP/1.x response"));
    }
    let status: u16 = parts
        .next()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad("no status code"))?;
    let mut len = None;
    let mut chunked = false;
    let mut close = version == "HTTP/1.0";
    let mut platform_rtt_us = None;
    for l in lines {
        let Some((k, v)) = l.split_once(':') else {
            continue;
        };
        let (k, v) = (k.trim().to_ascii_lowercase(), v.trim());
        match k.as_str() {
            "content-length" => len = Some(v.parse().map_err(|_| bad("bad Content-Length"))?),
            "transfer-encoding" => chunked = v.to_ascii_lowercase().contains("chunked"),
            "connection" => close = v.eq_ignore_ascii_case("close"),
            PLATFORM_RTT_HEADER => platform_rtt_us = v.parse().ok(),
            _ => {}
        }
    }
    Ok(Head {
        status,
        len: if chunked { None } else { len },
        chunked,
        close,
        platform_rtt_us,
    })
}

/// Decodes a complete chunked body from `buf`; None while incomplete.
fn dechunk(buf: &[u8]) -> io::Result<Option<(Vec<u8>, usize)>> {
    let bad = |m: &str| io::Error::new(io::ErrorKind::InvalidData, m.to_string());
    let mut body = Vec::new();
    let mut at = 0;
    loop {
        let Some(eol) = buf[at..].windows(2).position(|w| w == b"\r\n") else {
            return Ok(None);
        };
        let line = std::str::from_utf8(&buf[at..at + eol]).map_err(|_| bad("chunk size"))?;
        let size = usize::from_str_radix(line.split(';').next().unwrap_or("").trim(), 16)
            .map_err(|_| bad("chunk size"))?;
        at += eol + 2;
        if size == 0 {
            // Trailers (none expected), then the final CRLF.
            let Some(end) = head_end(&buf[at - 2..]) else {
                return Ok(None);
            };
            return Ok(Some((body, at - 2 + end)));
        }
        if buf.len() < at + size + 2 {
            return Ok(None);
        }
        body.extend_from_slice(&buf[at..at + size]);
        at += size + 2;
    }
}

/// One keep-alive connection and its read buffer.
struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl Conn {
    fn open(addr: SocketAddr) -> io::Result<Conn> {
        let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
        stream.set_nodelay(true)?;
        Ok(Conn {
            stream,
            buf: Vec::with_capacity(16 * 1024),
        })
    }

    /// Sends `req` and reads the whole response, by `deadline`.
    fn exchange(&mut self, req: &[u8], deadline: Instant) -> io::Result<HttpResponse> {
        let left = |d: Instant| {
            d.checked_duration_since(Instant::now())
                .filter(|l| !l.is_zero())
                .ok_or_else(|| io::Error::new(io::ErrorKind::TimedOut, "deadline"))
        };
        self.stream.set_write_timeout(Some(left(deadline)?))?;
        self.stream.write_all(req)?;
        self.buf.clear();
        let mut chunk = [0u8; 16 * 1024];
        let mut head: Option<(usize, Head)> = None;
        loop {
            if head.is_none() {
                if let Some(end) = head_end(&self.buf) {
                    let h = parse_head(&self.buf[..end])?;
                    if h.len.is_none() && !h.chunked {
                        return Err(io::Error::new(
                            io::ErrorKind::InvalidData,
                            "response without Content-Length or chunked body",
                        ));
                    }
                    head = Some((end, h));
                }
            }
            if let Some((end, h)) = head {
                let (len, chunked) = (h.len, h.chunked);
                let done = if chunked {
                    dechunk(&self.buf[end..])?.map(|(body, used)| (body, end + used))
                } else {
                    let n = len.unwrap_or(0);
                    (self.buf.len() >= end + n).then(|| (self.buf[end..end + n].to_vec(), end + n))
                };
                if let Some((body, used)) = done {
                    if used != self.buf.len() {
                        return Err(io::Error::new(
                            io::ErrorKind::InvalidData,
                            "bytes after the response",
                        ));
                    }
                    return Ok(HttpResponse {
                        status: h.status,
                        body,
                        close: h.close,
                        platform_rtt_us: h.platform_rtt_us,
                    });
                }
            }
            self.stream.set_read_timeout(Some(left(deadline)?))?;
            let n = self.stream.read(&mut chunk)?;
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "connection closed mid-response",
                ));
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }
}

/// A scheduled request.
struct Job {
    index: u64,
    at: Instant,
}

/// The open-loop schedule: request `i`'s time, taken once each, in order.
struct Schedule {
    rng: StdRng,
    arrival: ArrivalArg,
    rate: f64,
    start: Instant,
    next_at: Instant,
    taken: u64,
    limit: u64,
    duration: Option<Duration>,
}

impl Schedule {
    /// The earliest request not yet taken, or `None` once the run's
    /// requests or duration are used up.
    fn take(&mut self) -> Option<Job> {
        if self.taken >= self.limit
            || self
                .duration
                .is_some_and(|d| self.next_at.saturating_duration_since(self.start) >= d)
        {
            return None;
        }
        let job = Job {
            index: self.taken,
            at: self.next_at,
        };
        self.taken += 1;
        let gap = match self.arrival {
            ArrivalArg::Constant => 1.0 / self.rate,
            ArrivalArg::Poisson => -(1.0 - self.rng.random::<f64>()).ln() / self.rate,
        };
        self.next_at += Duration::from_secs_f64(gap);
        Some(job)
    }
}

/// What the workers share.
struct Shared {
    /// Set (with the start time) once every connection is open.
    schedule: Mutex<Option<Schedule>>,
    tally: Mutex<Tally>,
}

struct Tally {
    answered: u64,
    unanswered: u64,
    status: BTreeMap<String, u64>,
    malformed: u64,
    rtt_us: Histogram<u64>,
    /// The round trips of well-formed 200 answers alone (the requests that
    /// succeeded), for the percentiles with failures counted as late.
    ok_rtt_us: Histogram<u64>,
    lag_us: Histogram<u64>,
    /// Per answer that named its platform round trip: the round trip from
    /// when the request went out (lag excluded) less the platform's.
    beyond_platform_us: Histogram<u64>,
    last_answer: Option<Instant>,
    /// When the last request went out.
    last_send: Option<Instant>,
    connects: u64,
    errors: BTreeMap<String, u64>,
}

fn hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, HIST_MAX_US, 3).expect("valid histogram bounds")
}

fn percentiles(h: &Histogram<u64>) -> serde_json::Value {
    if h.is_empty() {
        return json!({"count": 0, "min": 0, "mean": 0.0, "p50": 0, "p90": 0, "p99": 0, "max": 0});
    }
    json!({
        "count": h.len(), "min": h.min(), "mean": h.mean(),
        "p50": h.value_at_quantile(0.5), "p90": h.value_at_quantile(0.9),
        "p99": h.value_at_quantile(0.99), "max": h.max(),
    })
}

fn worker(
    shared: &Shared,
    addr: SocketAddr,
    requests: &[Vec<u8>],
    format: Format,
    timeout: Duration,
    ready: &Barrier,
) {
    // Connected before the first request is scheduled (a failure here is
    // retried when a request comes, and counted then).
    let mut conn: Option<Conn> = Conn::open(addr).ok();
    if conn.is_some() {
        shared.tally.lock().expect("tally lock").connects += 1;
    }
    // Once every connection is open (`ready`), the schedule is set, then
    // everyone goes.
    ready.wait();
    ready.wait();
    loop {
        let job = shared
            .schedule
            .lock()
            .expect("schedule lock")
            .as_mut()
            .and_then(Schedule::take);
        let Some(job) = job else { return };
        let now = Instant::now();
        if job.at > now {
            std::thread::sleep(job.at - now);
        }
        let deadline = job.at + timeout;
        let start = Instant::now();
        let lag = start.saturating_duration_since(job.at);
        let req = &requests[(job.index % requests.len() as u64) as usize];
        let mut connected = false;
        let result = (|| -> io::Result<HttpResponse> {
            if conn.is_none() {
                conn = Some(Conn::open(addr)?);
                connected = true;
            }
            conn.as_mut().expect("connection").exchange(req, deadline)
        })();
        let now = Instant::now();
        let mut t = shared.tally.lock().expect("tally lock");
        t.connects += u64::from(connected);
        t.last_send = t.last_send.max(Some(start));
        t.lag_us.saturating_record(lag.as_micros().max(1) as u64);
        match result {
            Ok(resp) => {
                t.answered += 1;
                let key = if resp.status == 200 {
                    "ok".to_string()
                } else {
                    format!("http_{}", resp.status)
                };
                *t.status.entry(key).or_default() += 1;
                let want: &[u8] = match format {
                    Format::Raw => b"classes",
                    Format::Triton => b"CLASSES",
                };
                // A 200 is a success only with a well-formed body (only a
                // 200's body is searched).
                let ok = resp.status == 200 && resp.body.windows(want.len()).any(|w| w == want);
                if resp.status == 200 && !ok {
                    t.malformed += 1;
                }
                let rtt = now.saturating_duration_since(job.at).as_micros().max(1) as u64;
                t.rtt_us.saturating_record(rtt);
                if ok {
                    t.ok_rtt_us.saturating_record(rtt);
                }
                if let Some(platform) = resp.platform_rtt_us {
                    let own = now.saturating_duration_since(start).as_micros() as u64;
                    t.beyond_platform_us
                        .saturating_record(own.saturating_sub(platform).max(1));
                }
                t.last_answer = Some(now);
                if resp.close {
                    conn = None;
                }
            }
            Err(e) => {
                t.unanswered += 1;
                let kind = if e.kind() == io::ErrorKind::WouldBlock {
                    "timed_out".to_string()
                } else {
                    format!("{:?}", e.kind()).to_ascii_lowercase()
                };
                *t.errors.entry(kind).or_default() += 1;
                conn = None;
            }
        }
    }
}

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kp-http-load: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(a: Args) -> Result<()> {
    if !(a.rate.is_finite() && a.rate > 0.0) {
        bail!("--rate must be > 0 (got {})", a.rate);
    }
    if a.connections == 0 {
        bail!("--connections must be >= 1");
    }
    let url = parse_url(&a.url)?;
    let addr = (url.host.as_str(), url.port)
        .to_socket_addrs()
        .with_context(|| format!("resolving {}", url.host))?
        .next()
        .with_context(|| format!("{} has no address", url.host))?;
    let inputs = a.inputs.load(a.seed)?;
    let requests: Arc<Vec<Vec<u8>>> = Arc::new(
        (0..inputs.distinct() as u64)
            .map(|i| build_request(&url, a.format, a.inputs.shape, inputs.get(i)))
            .collect(),
    );
    let shared = Arc::new(Shared {
        schedule: Mutex::new(None),
        tally: Mutex::new(Tally {
            answered: 0,
            unanswered: 0,
            status: BTreeMap::new(),
            malformed: 0,
            rtt_us: hist(),
            ok_rtt_us: hist(),
            lag_us: hist(),
            beyond_platform_us: hist(),
            last_answer: None,
            last_send: None,
            connects: 0,
            errors: BTreeMap::new(),
        }),
    });
    let ready = Arc::new(Barrier::new(a.connections + 1));
    let workers: Vec<_> = (0..a.connections)
        .map(|i| {
            let (shared, requests) = (Arc::clone(&shared), Arc::clone(&requests));
            let ready = Arc::clone(&ready);
            let (format, timeout) = (a.format, a.timeout);
            std::thread::Builder::new()
                .name(format!("http-{i}"))
                .spawn(move || worker(&shared, addr, &requests, format, timeout, &ready))
        })
        .collect::<io::Result<_>>()?;
    // Every worker waits at the barrier with its connection open; the
    // schedule starts then, and the workers take it from there.
    ready.wait();
    let limit = match (a.requests, a.duration) {
        (_, Some(_)) => u64::MAX,
        (Some(n), None) => n,
        (None, None) => 10,
    };
    let start = Instant::now();
    *shared.schedule.lock().expect("schedule lock") = Some(Schedule {
        rng: StdRng::seed_from_u64(a.seed),
        arrival: a.arrival,
        rate: a.rate,
        start,
        next_at: start,
        taken: 0,
        limit,
        duration: a.duration,
    });
    ready.wait();
    for w in workers {
        w.join().expect("worker panicked");
    }
    let sent = shared
        .schedule
        .lock()
        .expect("schedule lock")
        .as_ref()
        .map_or(0, |s| s.taken);

    let t = shared.tally.lock().expect("tally lock");
    let send_duration_s = t
        .last_send
        .map_or(0.0, |l| l.saturating_duration_since(start).as_secs_f64());
    let answer_span_s = t
        .last_answer
        .map(|l| l.saturating_duration_since(start).as_secs_f64())
        .unwrap_or(0.0);
    let ok = t.status.get("ok").copied().unwrap_or(0);
    let report = json!({
        "url": a.url,
        "format": format!("{:?}", a.format).to_ascii_lowercase(),
        "mode": "open",
        "rate": a.rate,
        "arrival": format!("{:?}", a.arrival).to_ascii_lowercase(),
        "connections": a.connections,
        "connects": t.connects,
        "timeout_ms": a.timeout.as_millis() as u64,
        "payload_len": inputs.shape().len(),
        "sent": sent,
        "answered": t.answered,
        "unanswered": t.unanswered,
        "malformed": t.malformed,
        "status": t.status,
        "errors": t.errors,
        "send_duration_s": send_duration_s,
        "answer_span_s": answer_span_s,
        "send_rate": if send_duration_s > 0.0 { sent as f64 / send_duration_s } else { 0.0 },
        "throughput": if answer_span_s > 0.0 { t.answered as f64 / answer_span_s } else { 0.0 },
        "ok_per_s": if answer_span_s > 0.0 { ok as f64 / answer_span_s } else { 0.0 },
        "rtt_us": percentiles(&t.rtt_us),
        "rtt_failed_as_late_us": late_percentiles(&t.ok_rtt_us, sent.saturating_sub(t.ok_rtt_us.len())),
        "ok_rtt_us_counts": recorded(&t.ok_rtt_us),
        "lag_us": percentiles(&t.lag_us),
        "beyond_platform_us": percentiles(&t.beyond_platform_us),
    });
    if a.json {
        println!("{report}");
    } else {
        println!("{}", serde_json::to_string_pretty(&report)?);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_split() {
        assert_eq!(
            parse_url("http://127.0.0.1:8000/v2/models/m/infer").unwrap(),
            Url {
                host: "127.0.0.1".into(),
                port: 8000,
                path: "/v2/models/m/infer".into()
            }
        );
        assert_eq!(parse_url("http://h").unwrap().path, "/");
        assert!(parse_url("https://h/").is_err());
    }

    #[test]
    fn heads_parse() {
        let h = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 12\r\n\r\n";
        assert_eq!(head_end(h), Some(h.len()));
        let head = |status, len, chunked, close, platform_rtt_us| Head {
            status,
            len,
            chunked,
            close,
            platform_rtt_us,
        };
        assert_eq!(
            parse_head(h).unwrap(),
            head(200, Some(12), false, false, None)
        );
        let c = b"HTTP/1.1 503 x\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n";
        assert_eq!(parse_head(c).unwrap(), head(503, None, true, true, None));
        let g = b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\nKneepoint-Platform-RTT-us: 8812\r\n\r\n";
        assert_eq!(
            parse_head(g).unwrap(),
            head(200, Some(3), false, false, Some(8812))
        );
        assert!(parse_head(b"SSH-2.0\r\n\r\n").is_err());
    }

    #[test]
    fn chunked_bodies_decode_only_when_complete() {
        let b = b"5\r\nhello\r\n6;x=y\r\n world\r\n0\r\n\r\n";
        assert_eq!(
            dechunk(b).unwrap(),
            Some((b"hello world".to_vec(), b.len()))
        );
        for cut in 0..b.len() {
            assert_eq!(dechunk(&b[..cut]).unwrap(), None, "cut at {cut}");
        }
    }

    #[test]
    fn triton_requests_carry_the_header_length() {
        let url = parse_url("http://h:1/v2/models/m/infer").unwrap();
        let shape = InputShape {
            height: 2,
            width: 2,
            channels: 3,
        };
        let req = build_request(&url, Format::Triton, shape, &[7u8; 12]);
        let end = head_end(&req).unwrap();
        let head = std::str::from_utf8(&req[..end]).unwrap();
        let n: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("Inference-Header-Content-Length: "))
            .unwrap()
            .parse()
            .unwrap();
        let body = &req[end..];
        let v: serde_json::Value = serde_json::from_slice(&body[..n]).unwrap();
        assert_eq!(v["inputs"][0]["shape"], json!([1, 2, 2, 3]));
        assert_eq!(&body[n..], &[7u8; 12]);
        assert!(head.contains(&format!("Content-Length: {}\r\n", body.len())));
    }
}
