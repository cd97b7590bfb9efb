//! kp-client against a tiny UDP responder on 127.0.0.1: the client's
//! accounting of answers, duplicates, unexpected and missing answers is
//! checked on a real socket, across processes.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{SocketAddr, UdpSocket};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use kp_wire::{Fragment, MsgType, ResponseRepr, Status};
use serde_json::Value;

/// How the responder misbehaves, by request_id.
#[derive(Clone, Default)]
struct Script {
    drop: BTreeSet<u64>,
    duplicate: BTreeSet<u64>,
    bad_request: BTreeSet<u64>,
    /// Also send one answer for a request that does not exist, and one
    /// datagram that is not a response, after the first answer.
    noise: bool,
}

struct Responder {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<BTreeMap<&'static str, u64>>>,
}

impl Responder {
    /// Answers every complete request (all fragments seen) once, as the
    /// platform would, except where `script` says otherwise.
    fn start(script: Script) -> Responder {
        let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        sock.set_read_timeout(Some(Duration::from_millis(20)))
            .unwrap();
        let addr = sock.local_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let mut seen: BTreeMap<(SocketAddr, u16, u64), BTreeSet<u16>> = BTreeMap::new();
            let mut counts: BTreeMap<&'static str, u64> = BTreeMap::new();
            let mut buf = [0u8; 2048];
            let mut noise_sent = false;
            while !flag.load(Ordering::Relaxed) {
                let Ok((n, from)) = sock.recv_from(&mut buf) else {
                    continue;
                };
                let Ok(f) = Fragment::new_checked(&buf[..n]) else {
                    *counts.entry("malformed").or_default() += 1;
                    continue;
                };
                *counts.entry("fragments").or_default() += 1;
                let (if_id, id, ts, count) =
                    (f.if_id(), f.request_id(), f.send_ts_ns(), f.frag_count());
                let got = seen.entry((from, if_id.0, id)).or_default();
                got.insert(f.frag_index());
                if got.len() != usize::from(count) {
                    continue;
                }
                *counts.entry("complete").or_default() += 1;
                if script.drop.contains(&id) {
                    continue;
                }
                let results = [(7u32, 3.5f32), (2, 1.25)];
                let repr = if script.bad_request.contains(&id) {
                    ResponseRepr::error(if_id, id, ts, Status::BadRequest, 10)
                } else {
                    ResponseRepr {
                        msg_type: MsgType::Response,
                        if_id,
                        request_id: id,
                        send_ts_ns: ts,
                        status: Status::Ok,
                        batch_size: 2,
                        latency_us: 123,
                        results: &results,
                    }
                };
                let mut out = vec![0u8; repr.wire_len()];
                repr.emit(&mut out).unwrap();
                let times = if script.duplicate.contains(&id) { 2 } else { 1 };
                for _ in 0..times {
                    sock.send_to(&out, from).unwrap();
                }
                if script.noise && !noise_sent {
                    noise_sent = true;
                    let stray = ResponseRepr::error(if_id, 999_999, ts, Status::Internal, 1);
                    let mut s = vec![0u8; stray.wire_len()];
                    stray.emit(&mut s).unwrap();
                    sock.send_to(&s, from).unwrap();
                    sock.send_to(b"KNPT but not a response", from).unwrap();
                }
            }
            counts
        });
        Responder {
            addr,
            stop,
            thread: Some(thread),
        }
    }

    fn finish(mut self) -> BTreeMap<&'static str, u64> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().unwrap().join().unwrap()
    }
}

impl Drop for Responder {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn kp_client(dst: SocketAddr, extra: &[&str]) -> (i32, Value) {
    let out = Command::new(env!("CARGO_BIN_EXE_kp-client"))
        .args([
            "--dst",
            &dst.to_string(),
            "--bind",
            "127.0.0.1:0",
            "--shape",
            "8x8x3",
            "--frag-size",
            "64",
        ])
        .args(["--json", "--if-id", "4"])
        .args(extra)
        .output()
        .expect("run kp-client");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let report: Value = serde_json::from_str(stdout.trim()).unwrap_or_else(|e| {
        panic!("kp-client printed no JSON ({e}): stdout {stdout:?} stderr {stderr:?}")
    });
    (out.status.code().expect("exit code"), report)
}

#[test]
fn closed_loop_counts_answers_duplicates_unexpected_and_missing() {
    let responder = Responder::start(Script {
        drop: BTreeSet::from([103]),
        duplicate: BTreeSet::from([105]),
        bad_request: BTreeSet::from([107]),
        noise: true,
    });
    let (code, r) = kp_client(
        responder.addr,
        &[
            "--requests",
            "10",
            "--concurrency",
            "2",
            "--timeout",
            "300ms",
            "--first-request-id",
            "100",
        ],
    );
    let seen = responder.finish();
    assert_eq!(
        code, 0,
        "unanswered requests alone do not fail the run: {r}"
    );
    assert_eq!(
        seen["complete"], 10,
        "the responder saw every request whole: {seen:?}"
    );
    assert_eq!(
        seen["fragments"], 30,
        "8x8x3 = 192 bytes = 3 fragments of 64"
    );
    assert_eq!(r["sent"], 10);
    assert_eq!(r["frag_count"], 3);
    assert_eq!(r["datagrams_sent"], 30);
    assert_eq!(r["answered"], 9);
    assert_eq!(r["unanswered"], 1);
    assert_eq!(r["duplicates"], 1);
    assert_eq!(r["unexpected"], 1);
    assert_eq!(r["malformed"], 1);
    assert_eq!(r["late"], 0);
    assert_eq!(r["status"]["ok"], 8);
    assert_eq!(r["status"]["bad_request"], 1);
    assert_eq!(r["status"]["internal"], 0);
    assert_eq!(r["mode"], "closed");
    assert_eq!(r["rtt_us"]["count"], 9);
    assert_eq!(r["platform_latency_us"]["count"], 9);
    assert_eq!(r["mean_batch_size"], 2.0);
    assert!(r["rtt_us"]["p50"].as_u64().unwrap() > 0);
    assert!(r["throughput"].as_f64().unwrap() > 0.0);
}

#[test]
fn open_loop_at_a_rate_gets_everything_answered() {
    let responder = Responder::start(Script::default());
    let (code, r) = kp_client(
        responder.addr,
        &[
            "--rate",
            "200",
            "--arrival",
            "constant",
            "--duration",
            "250ms",
            "--expect-all-answered",
        ],
    );
    responder.finish();
    assert_eq!(code, 0, "{r}");
    let sent = r["sent"].as_u64().unwrap();
    // 200/s for 0.25 s: 50 requests, give or take scheduling.
    assert!((25..=51).contains(&sent), "sent {sent}");
    assert_eq!(r["answered"], sent);
    assert_eq!(r["unanswered"], 0);
    assert_eq!(r["mode"], "open");
    assert_eq!(r["arrival"], "constant");
    assert_eq!(r["status"]["ok"], sent);
}

#[test]
fn expect_all_answered_fails_the_run_and_a_closed_port_is_not_a_socket_error() {
    let responder = Responder::start(Script {
        drop: BTreeSet::from([1]),
        ..Script::default()
    });
    let (code, r) = kp_client(
        responder.addr,
        &[
            "--requests",
            "3",
            "--timeout",
            "100ms",
            "--expect-all-answered",
        ],
    );
    responder.finish();
    assert_eq!(code, 3, "{r}");
    assert_eq!(
        (r["answered"].as_u64(), r["unanswered"].as_u64()),
        (Some(2), Some(1))
    );

    // Nobody listens: ICMP port unreachable comes back; every request is
    // simply unanswered.
    let closed = UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let (code, r) = kp_client(
        closed,
        &[
            "--requests",
            "4",
            "--concurrency",
            "4",
            "--timeout",
            "100ms",
        ],
    );
    assert_eq!(code, 0, "{r}");
    assert_eq!(
        (r["sent"].as_u64(), r["unanswered"].as_u64()),
        (Some(4), Some(4))
    );
}
