//! client_cost — what the client itself costs per request, without a model.
//!
//! **The peer here is a STAND-IN, not kneepoint.** It is a plain UDP socket
//! on loopback, in this process, that reads fragments and answers a
//! request OK the moment its *last* fragment arrives (no reassembly, no
//! model, no batching). It exists only to isolate the client's own cost
//! (cutting, sending, matching, waking the caller); its numbers say
//! nothing about the platform.
//!
//! ```sh
//! nice -n 19 cargo run --profile release -p kneepoint-client --example client_cost -- \
//!     [--requests 3000] [--concurrency 1] [--len 150528] [--payload 1024]
//! ```
//!
//! Per request it reports p50/p90 (µs) of:
//! - `fragment`: cutting the input and writing the 32-byte headers into
//!   one reused buffer, no syscalls (`frag::Fragmenter`, done here alone);
//! - `prepare`: `Client::prepare` (a request id, the fragmenting into one
//!   of the client's reused datagram buffers), tp - t0;
//! - `submit`: `prepare` + `Client::send` (the book entry and every send
//!   syscall), what `Client::submit` does, t1 - t0;
//! - `handoff`: (t2 - tp) - rtt, t2 after `Client::wait` returns; the
//!   answer's `rtt` runs from just before the first fragment is sent to
//!   the answer's arrival at the client's receiver, so this is the time
//!   from the answer being in the client's hands to the caller having it
//!   (matching, waking the waiter), plus the book entry before the send;
//! - `rtt`, and the closed-loop rate of C threads each doing submit + wait
//!   on one shared `Client`.
//!
//! The last line is one JSON object of the same numbers.

use std::net::{SocketAddr, UdpSocket};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kneepoint_client::frag::Fragmenter;
use kneepoint_client::Config;
use kp_wire::{Fragment, IfId, MsgType, ResponseRepr, Status, HEADER_LEN};

/// One thread's prepare, submit, hand-off and rtt samples (µs), and its
/// failures.
type Samples = (Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>, usize);

struct Args {
    requests: usize,
    concurrency: usize,
    len: usize,
    payload: usize,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        requests: 3000,
        concurrency: 1,
        len: 224 * 224 * 3,
        payload: 1024,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let n: usize = value
            .parse()
            .map_err(|_| format!("{flag}: not a number: {value}"))?;
        match flag.as_str() {
            "--requests" => a.requests = n,
            "--concurrency" => a.concurrency = n.max(1),
            "--len" => a.len = n,
            "--payload" => a.payload = n,
            _ => return Err(format!("unknown option {flag}")),
        }
    }
    Ok(a)
}

/// The stand-in peer (see the module docs): answers OK at each request's
/// last fragment. Returns its address; runs until `stop`.
fn stand_in(stop: Arc<AtomicBool>, fragments: Arc<AtomicU64>) -> SocketAddr {
    let socket = UdpSocket::bind("127.0.0.1:0").expect("bind the stand-in");
    socket
        .set_read_timeout(Some(Duration::from_millis(20)))
        .expect("read timeout");
    // 147 fragments of ~1.1 KB outrun a default 208 KB receive buffer
    // when this thread is not scheduled at once; a lost last fragment
    // would be a 2 s timeout here.
    kp_os::net::set_recv_buffer(&socket, 8 << 20).expect("SO_RCVBUF");
    let addr = socket.local_addr().expect("local addr");
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 65_536];
        let mut out = vec![0u8; 256];
        let results = [(967u32, 0.875f32), (504, 0.0625)];
        while !stop.load(Ordering::Relaxed) {
            let Ok((n, from)) = socket.recv_from(&mut buf) else {
                continue;
            };
            fragments.fetch_add(1, Ordering::Relaxed);
            let Ok(f) = Fragment::new_checked(&buf[..n]) else {
                continue;
            };
            if f.frag_index() + 1 != f.frag_count() {
                continue;
            }
            let repr = ResponseRepr {
                msg_type: MsgType::Response,
                if_id: IfId(f.if_id().0),
                request_id: f.request_id(),
                send_ts_ns: f.send_ts_ns(),
                status: Status::Ok,
                batch_size: 1,
                latency_us: 0,
                results: &results,
            };
            let len = repr.emit(&mut out).expect("a response fits 256 bytes");
            let _ = socket.send_to(&out[..len], from);
        }
    });
    addr
}

fn pct(xs: &mut [f64], p: f64) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    xs.sort_by(f64::total_cmp);
    xs[((p / 100.0 * xs.len() as f64) as usize).min(xs.len() - 1)]
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn main() -> ExitCode {
    let a = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("client_cost: {e}");
            return ExitCode::FAILURE;
        }
    };
    let input: Vec<u8> = (0..a.len).map(|i| (i * 31 % 251) as u8).collect();

    // 1. Fragmenting alone: cut + headers into one reused buffer.
    let mut frag_us = Vec::with_capacity(a.requests);
    let mut buf = vec![0u8; HEADER_LEN + a.payload];
    let mut sink = 0u64;
    for i in 0..a.requests {
        let t = Instant::now();
        let mut f = Fragmenter::new(1, i as u64, 7, &input, a.payload).expect("geometry");
        while let Some(d) = f.next_into(&mut buf) {
            sink = sink.wrapping_add(u64::from(d[d.len() - 1]));
        }
        frag_us.push(us(t.elapsed()));
    }
    std::hint::black_box(sink);

    // 2 + 3. submit and the hand-off, against the stand-in.
    let stop = Arc::new(AtomicBool::new(false));
    let fragments = Arc::new(AtomicU64::new(0));
    let peer = stand_in(stop.clone(), fragments.clone());
    let client = Config::builder(peer)
        .timeout(Duration::from_secs(2))
        .fragment_payload(a.payload)
        .connect()
        .expect("client");
    // Warm up: sockets, the receiver thread, allocations.
    for _ in 0..50 {
        let _ = client.infer(1, &input);
    }
    let per_thread = a.requests.div_ceil(a.concurrency);
    let started = Instant::now();
    let runs: Vec<Samples> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..a.concurrency)
            .map(|_| {
                let (client, input) = (&client, &input);
                s.spawn(move || {
                    let (mut prepare, mut submit, mut handoff, mut rtt, mut failed) =
                        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), 0);
                    for _ in 0..per_thread {
                        // submit() is prepare() + send(); timed apart.
                        let t0 = Instant::now();
                        let p = client.prepare(1, input).expect("prepare");
                        let tp = Instant::now();
                        let id = client.send(p).expect("send");
                        let t1 = Instant::now();
                        match client.wait(id) {
                            Ok(ans) => {
                                let t2 = Instant::now();
                                prepare.push(us(tp - t0));
                                submit.push(us(t1 - t0));
                                handoff.push(us((t2 - tp).saturating_sub(ans.rtt)));
                                rtt.push(us(ans.rtt));
                            }
                            Err(_) => failed += 1,
                        }
                    }
                    (prepare, submit, handoff, rtt, failed)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("thread")).collect()
    });
    let span = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    let (mut prepare, mut submit, mut handoff, mut rtt) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut failed = 0;
    for (p, s, h, r, f) in runs {
        prepare.extend(p);
        submit.extend(s);
        handoff.extend(h);
        rtt.extend(r);
        failed += f;
    }
    let rate = submit.len() as f64 / span.as_secs_f64();
    let stats = client.stats();
    let line = |name: &str, xs: &mut Vec<f64>| {
        let (p50, p90) = (pct(xs, 50.0), pct(xs, 90.0));
        println!("{name:9} p50 {p50:8.1} µs  p90 {p90:8.1} µs");
        format!("\"{name}_us\":{{\"p50\":{p50:.1},\"p90\":{p90:.1}}}")
    };
    println!(
        "client_cost (peer: a loopback STAND-IN, not kneepoint), {} B at {} B/fragment, C={}, {} requests",
        a.len, a.payload, a.concurrency, submit.len()
    );
    let parts = [
        line("fragment", &mut frag_us),
        line("prepare", &mut prepare),
        line("submit", &mut submit),
        line("handoff", &mut handoff),
        line("rtt", &mut rtt),
    ];
    println!(
        "rate {rate:.0}/s; failed {failed} (timed out: the stand-in lost a last fragment); \
         stand-in read {} datagrams; client stats {stats:?}",
        fragments.load(Ordering::Relaxed)
    );
    println!(
        "{{\"concurrency\":{},\"requests\":{},\"failed\":{failed},\"rate\":{rate:.1},{}}}",
        a.concurrency,
        submit.len(),
        parts.join(",")
    );
    ExitCode::SUCCESS
}
