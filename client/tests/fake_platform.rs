//! The client against a FAKE platform, in-process.
//!
//! `FakePlatform` is NOT kneepoint: it stands in for the network peer so the
//! client's socket path (fragments out, answers in, threads, timeouts) is
//! tested without DPDK or an IF. It is a plain UDP socket that decodes
//! fragments with kp-wire's decoder (`Fragment::new_checked`, the
//! platform's own), reassembles them by (source, if_id, request_id), and
//! answers each complete request as a script says. The test of the client
//! against the real platform belongs in tests/ (cross-process).

use std::collections::HashMap;
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use kneepoint_client::{Client, ClientError, Config, RequestId, Status};
use kp_wire::{Fragment, FragmentRepr, IfId, MsgType, ResponseRepr};

/// What the fake platform does with a complete request.
#[derive(Clone, Debug)]
enum Act {
    /// Answer with this status (OK: the scripted top-k).
    Answer(Status),
    /// Answer twice (the second one OK whatever the first).
    AnswerTwice(Status),
    /// Send garbage first, then answer.
    GarbageThenAnswer(Status),
    /// Say nothing.
    Silent,
    /// Answer OK after this long.
    Delay(Duration),
}

type Script = dyn Fn(&FragmentRepr, &[u8], usize) -> Act + Send + Sync;

/// A complete request as the fake platform reassembled it.
#[derive(Clone, Debug)]
struct Seen {
    header: FragmentRepr,
    payload: Vec<u8>,
    fragments: usize,
    max_datagram: usize,
}

struct FakePlatform {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

const TOP_K: [(u32, f32); 3] = [(967, 0.875), (504, 0.0625), (1, 0.03125)];

impl FakePlatform {
    fn start(script: impl Fn(&FragmentRepr, &[u8], usize) -> Act + Send + Sync + 'static) -> Self {
        let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
        socket
            .set_read_timeout(Some(Duration::from_millis(5)))
            .unwrap();
        let addr = socket.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let script: Arc<Script> = Arc::new(script);
        let thread = {
            let (seen, stop) = (seen.clone(), stop.clone());
            std::thread::spawn(move || serve(&socket, &*script, &seen, &stop))
        };
        FakePlatform {
            addr,
            seen,
            stop,
            thread: Some(thread),
        }
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

impl Drop for FakePlatform {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
    }
}

struct Assembling {
    header: FragmentRepr,
    buf: Vec<u8>,
    got: Vec<bool>,
    max_datagram: usize,
}

fn serve(socket: &UdpSocket, script: &Script, seen: &Mutex<Vec<Seen>>, stop: &AtomicBool) {
    let mut partial: HashMap<(SocketAddr, u16, u64), Assembling> = HashMap::new();
    let mut delayed: Vec<(Instant, SocketAddr, FragmentRepr)> = Vec::new();
    let mut buf = vec![0u8; 65_536];
    let mut n_requests = 0usize;
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        delayed.retain(|(at, to, h)| {
            if *at <= now {
                answer(socket, *to, h, Status::Ok);
                false
            } else {
                true
            }
        });
        let Ok((n, from)) = socket.recv_from(&mut buf) else {
            continue;
        };
        let f = Fragment::new_checked(&buf[..n]).expect("the client sent a malformed fragment");
        let h = FragmentRepr::parse(&f);
        let a = partial
            .entry((from, h.if_id.0, h.request_id))
            .or_insert_with(|| Assembling {
                header: h,
                buf: vec![0; h.total_len as usize],
                got: vec![false; usize::from(h.frag_count)],
                max_datagram: 0,
            });
        assert_eq!(
            (a.header.total_len, a.header.frag_count, a.header.send_ts_ns),
            (h.total_len, h.frag_count, h.send_ts_ns),
            "fragments of one request disagree"
        );
        assert!(!a.got[usize::from(h.frag_index)], "a fragment sent twice");
        a.got[usize::from(h.frag_index)] = true;
        a.buf[f.payload_range()].copy_from_slice(f.payload());
        a.max_datagram = a.max_datagram.max(n);
        if !a.got.iter().all(|g| *g) {
            continue;
        }
        let a = partial.remove(&(from, h.if_id.0, h.request_id)).unwrap();
        let act = script(&a.header, &a.buf, n_requests);
        n_requests += 1;
        seen.lock().unwrap().push(Seen {
            header: a.header,
            payload: a.buf,
            fragments: a.got.len(),
            max_datagram: a.max_datagram,
        });
        match act {
            Act::Answer(s) => answer(socket, from, &h, s),
            Act::AnswerTwice(s) => {
                answer(socket, from, &h, s);
                answer(socket, from, &h, Status::Ok);
            }
            Act::GarbageThenAnswer(s) => {
                for junk in [&b"junk"[..], &[0u8; 36], &[0xFF; 600]] {
                    socket.send_to(junk, from).unwrap();
                }
                // A well-formed answer to a request the client never made.
                let stranger = FragmentRepr {
                    request_id: h.request_id ^ 0x8000_0000_0000_0000,
                    ..h
                };
                answer(socket, from, &stranger, Status::Ok);
                answer(socket, from, &h, s);
            }
            Act::Silent => {}
            Act::Delay(d) => delayed.push((Instant::now() + d, from, h)),
        }
    }
}

fn answer(socket: &UdpSocket, to: SocketAddr, h: &FragmentRepr, status: Status) {
    let repr = if status == Status::Ok {
        ResponseRepr {
            msg_type: MsgType::Response,
            if_id: h.if_id,
            request_id: h.request_id,
            send_ts_ns: h.send_ts_ns,
            status,
            batch_size: 2,
            latency_us: 321,
            results: &TOP_K,
        }
    } else {
        ResponseRepr::error(h.if_id, h.request_id, h.send_ts_ns, status, 5)
    };
    let mut out = vec![0u8; repr.wire_len()];
    repr.emit(&mut out).unwrap();
    socket.send_to(&out, to).unwrap();
}

/// A 96x96x3 input. Not 224x224x3: the fake platform's socket has the
/// default receive buffer (~208 KiB on Linux, which a 147-fragment burst
/// of ~2 KiB socket buffers each overflows on loopback) and no way to grow
/// it from std.
fn photo() -> Vec<u8> {
    (0..96 * 96 * 3u32).map(|i| (i * 7 % 253) as u8).collect()
}

#[test]
fn infer_sends_the_input_fragmented_and_returns_the_top_k() {
    let platform = FakePlatform::start(|_, _, _| Act::Answer(Status::Ok));
    let input = photo();
    for (payload, frags) in [(1024, 27), (1000, 28), (1440, 20), (27_648, 1)] {
        let client = Config::builder(platform.addr)
            .fragment_payload(payload)
            .connect()
            .unwrap();
        let a = client.infer(9, &input).unwrap();
        let seen = platform.seen().pop().unwrap();
        assert_eq!(seen.payload, input, "reassembled bytes differ");
        assert_eq!(seen.fragments, frags, "payload {payload}");
        assert_eq!(seen.max_datagram, 32 + input.len().div_ceil(frags));
        assert_eq!(seen.header.if_id, IfId(9));
        assert_eq!(RequestId(seen.header.request_id), a.request_id);
        assert_eq!(a.if_id, 9);
        let got: Vec<(u32, f32)> = a.top_k.iter().map(|c| (c.class, c.score)).collect();
        assert_eq!(got, TOP_K);
        assert_eq!((a.batch_size, a.platform_latency_us), (2, 321));
        assert!(a.rtt > Duration::ZERO && a.rtt < Duration::from_secs(1));
        assert_eq!(client.outstanding(), 0);
    }
}

#[test]
fn each_status_is_a_distinct_error() {
    // The request's first byte picks the status.
    let platform =
        FakePlatform::start(|_, p, _| Act::Answer(Status::from_u32(u32::from(p[0])).unwrap()));
    let client = Client::new(platform.addr).unwrap();
    let r = |s: Status| client.infer(4, &[s as u8; 3000]);
    assert!(r(Status::Ok).is_ok());
    assert!(matches!(
        r(Status::UnknownIf),
        Err(ClientError::UnknownIf { if_id: 4 })
    ));
    assert!(matches!(
        r(Status::BadRequest),
        Err(ClientError::BadRequest { if_id: 4 })
    ));
    assert!(matches!(
        r(Status::Incomplete),
        Err(ClientError::Incomplete)
    ));
    assert!(matches!(
        r(Status::Overloaded),
        Err(ClientError::Overloaded)
    ));
    assert!(matches!(r(Status::Internal), Err(ClientError::Internal)));
    assert_eq!(client.stats().answered, 6);
}

#[test]
fn duplicates_and_garbage_are_dropped_and_counted() {
    let platform = FakePlatform::start(|_, _, n| {
        if n % 2 == 0 {
            Act::AnswerTwice(Status::Overloaded)
        } else {
            Act::GarbageThenAnswer(Status::Ok)
        }
    });
    let client = Client::new(platform.addr).unwrap();
    assert!(matches!(
        client.infer(1, &photo()),
        Err(ClientError::Overloaded)
    ));
    assert!(client.infer(1, &photo()).is_ok());
    // The duplicate came right after the first answer; give the receiver
    // a moment to count it.
    std::thread::sleep(Duration::from_millis(50));
    let s = client.stats();
    assert_eq!((s.answered, s.duplicates), (2, 1), "{s:?}");
    assert_eq!((s.malformed, s.unexpected), (3, 1), "{s:?}");
    // Submitted requests see the same: one result each.
    let ids: Vec<RequestId> = (0..4)
        .map(|_| client.submit(1, &photo()).unwrap())
        .collect();
    let mut got = Vec::new();
    let until = Instant::now() + Duration::from_secs(5);
    while got.len() < ids.len() && Instant::now() < until {
        got.extend(client.poll(Duration::from_millis(100)));
    }
    std::thread::sleep(Duration::from_millis(50));
    got.extend(client.poll(Duration::from_millis(10)));
    let mut got_ids: Vec<RequestId> = got.iter().map(|(id, _)| *id).collect();
    got_ids.sort();
    assert_eq!(got_ids, ids, "every request exactly once");
}

#[test]
fn silence_is_a_timeout_and_a_late_answer_is_dropped() {
    let platform = FakePlatform::start(|_, p, _| match p[0] {
        0 => Act::Silent,
        _ => Act::Delay(Duration::from_millis(150)),
    });
    let client = Config::builder(platform.addr)
        .timeout(Duration::from_millis(60))
        .connect()
        .unwrap();
    let t = Instant::now();
    assert!(
        matches!(client.infer(1, &[0; 10]), Err(ClientError::Timeout(d)) if d == Duration::from_millis(60))
    );
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(60) && took < Duration::from_millis(500),
        "{took:?}"
    );
    // Answered after its timeout: the caller got Timeout, the answer is late.
    let id = client.submit(1, &[1; 10]).unwrap();
    assert!(matches!(client.wait(id), Err(ClientError::Timeout(_))));
    assert!(matches!(client.wait(id), Err(ClientError::UnknownRequest(i)) if i == id));
    std::thread::sleep(Duration::from_millis(200));
    assert!(client.poll(Duration::ZERO).is_empty(), "no second result");
    let s = client.stats();
    assert_eq!((s.timed_out, s.late, s.answered), (2, 1, 0), "{s:?}");
    // A per-request timeout.
    let id = client
        .submit_with_timeout(1, &[0; 10], Duration::from_millis(10))
        .unwrap();
    let t = Instant::now();
    let got = client.poll(Duration::from_secs(2));
    assert!(t.elapsed() < Duration::from_millis(500));
    assert!(matches!(&got[..], [(i, Err(ClientError::Timeout(_)))] if *i == id));
}

#[test]
fn retries_are_new_requests() {
    // The first attempt of every request goes unanswered, the second is
    // shed, the third is answered: as the platform only answers a request
    // once, each attempt must be a new request id.
    let platform = FakePlatform::start(|_, _, n| match n % 3 {
        0 => Act::Silent,
        1 => Act::Answer(Status::Overloaded),
        _ => Act::Answer(Status::Ok),
    });
    let client = Config::builder(platform.addr)
        .timeout(Duration::from_millis(50))
        .retries(2)
        .connect()
        .unwrap();
    let a = client.infer(2, &[5; 2000]).unwrap();
    let ids: Vec<u64> = platform
        .seen()
        .iter()
        .map(|s| s.header.request_id)
        .collect();
    assert_eq!(ids.len(), 3);
    assert!(ids[0] != ids[1] && ids[1] != ids[2] && ids[0] != ids[2]);
    assert_eq!(a.request_id, RequestId(ids[2]));
    // Without retries the first error is the answer; BAD_REQUEST is never
    // retried.
    let once = Config::builder(platform.addr)
        .timeout(Duration::from_millis(50))
        .connect()
        .unwrap();
    assert!(matches!(
        once.infer(2, &[5; 10]),
        Err(ClientError::Timeout(_))
    ));
}

#[test]
fn many_threads_share_one_client() {
    let platform = FakePlatform::start(|_, p, _| {
        Act::Answer(if p[0] % 5 == 0 {
            Status::Overloaded
        } else {
            Status::Ok
        })
    });
    let client = Arc::new(Client::new(platform.addr).unwrap());
    let local = client.local_addr().unwrap();
    std::thread::scope(|s| {
        for t in 0..8u8 {
            let client = &client;
            s.spawn(move || {
                for i in 0..25u8 {
                    let tag = t.wrapping_mul(25).wrapping_add(i);
                    let input = vec![tag; 5000];
                    match client.infer(3, &input) {
                        Ok(_) => assert_ne!(tag % 5, 0),
                        Err(ClientError::Overloaded) => assert_eq!(tag % 5, 0),
                        Err(e) => panic!("{e}"),
                    }
                }
            });
        }
    });
    let s = client.stats();
    assert_eq!(
        (s.submitted, s.answered, s.duplicates),
        (200, 200, 0),
        "{s:?}"
    );
    // One socket: the platform saw one source port.
    assert_eq!(platform.seen().len(), 200);
    assert_eq!(local.port(), client.local_addr().unwrap().port());
}

#[test]
fn an_absent_platform_is_unreachable() {
    // A port with nothing behind it: loopback answers ICMP port-unreachable.
    let addr = {
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        s.local_addr().unwrap()
    };
    let client = Config::builder(addr)
        .timeout(Duration::from_secs(5))
        .connect()
        .unwrap();
    let t = Instant::now();
    assert!(matches!(
        client.infer(1, &[0; 3000]),
        Err(ClientError::Unreachable)
    ));
    assert!(t.elapsed() < Duration::from_secs(2), "not a timeout");
}

#[test]
fn poll_replies_times_error_answers_too_and_ids_can_start_where_told() {
    // The request's first byte picks the status; 0xEE: silence.
    let platform = FakePlatform::start(|_, p, _| match p[0] {
        0xEE => Act::Silent,
        b => Act::Answer(Status::from_u32(u32::from(b)).unwrap()),
    });
    let client = Config::builder(platform.addr)
        .timeout(Duration::from_millis(100))
        .first_request_id(500)
        .fragment_gap(Duration::from_millis(2))
        .connect()
        .unwrap();
    let before = Instant::now();
    let ok = client.submit(2, &[Status::Ok as u8; 3000]).unwrap();
    let shed = client.submit(2, &[Status::Overloaded as u8; 10]).unwrap();
    let silent = client.submit(2, &[0xEE; 10]).unwrap();
    assert_eq!(
        (ok, shed, silent),
        (RequestId(500), RequestId(501), RequestId(502))
    );
    let mut got = Vec::new();
    let until = Instant::now() + Duration::from_secs(5);
    while got.len() < 3 && Instant::now() < until {
        got.extend(client.poll_replies(Duration::from_millis(50)));
    }
    assert_eq!(got.len(), 3, "{got:?}");
    for (id, result, reply) in &got {
        if *id == silent {
            assert!(matches!(result, Err(ClientError::Timeout(_))));
            assert!(reply.is_none());
            continue;
        }
        let reply = reply.expect("an answered request has a reply");
        assert!(reply.sent_at >= before && reply.received_at >= reply.sent_at);
        if *id == ok {
            let a = result.as_ref().unwrap();
            assert_eq!(reply.status, Status::Ok);
            assert_eq!((reply.batch_size, reply.platform_latency_us), (2, 321));
            assert_eq!(a.rtt, reply.received_at - reply.sent_at);
            // 3000 bytes are 3 fragments at 1024: two 2 ms pauses.
            assert!(a.rtt >= Duration::from_millis(4), "{:?}", a.rtt);
        } else {
            assert!(matches!(result, Err(ClientError::Overloaded)));
            assert_eq!(
                (reply.status, reply.platform_latency_us),
                (Status::Overloaded, 5)
            );
        }
    }
    let seen = platform.seen();
    assert_eq!(seen[0].fragments, 3);
    assert_eq!(seen[0].header.request_id, 500);
}

#[test]
fn waiters_pollers_and_requests_nobody_waits_for_each_get_their_answer_once() {
    // Answers out of order: the input's first byte says how late (ms).
    let platform =
        FakePlatform::start(|_, p, _| Act::Delay(Duration::from_millis(u64::from(p[0] % 7) * 3)));
    let client = Config::builder(platform.addr)
        .timeout(Duration::from_secs(5))
        .connect()
        .unwrap();
    // Threads in `infer` (leading or following) and one polling its own
    // submissions, at once.
    let polled = std::thread::scope(|s| {
        for t in 0..4u8 {
            let client = &client;
            s.spawn(move || {
                for i in 0..20u8 {
                    let a = client.infer(1, &[t * 20 + i; 3000]).unwrap();
                    assert!(client.wait(a.request_id).is_err(), "delivered twice");
                }
            });
        }
        let poller = s.spawn(|| {
            let mut ids: Vec<RequestId> = (0..10u8)
                .map(|i| client.submit(1, &[i; 3000]).unwrap())
                .collect();
            let mut got = Vec::new();
            let until = Instant::now() + Duration::from_secs(5);
            while got.len() < ids.len() && Instant::now() < until {
                for (id, r) in client.poll(Duration::from_millis(5)) {
                    r.unwrap();
                    got.push(id);
                }
            }
            got.sort_unstable();
            ids.sort_unstable();
            assert_eq!(got, ids, "each polled request once");
            got.len()
        });
        poller.join().unwrap()
    });
    assert_eq!(polled, 10);
    // Then requests nobody waits for: the receiver thread reads their
    // answers (poll(0) only collects, it does not read the socket).
    let ids: Vec<RequestId> = (0..3u8)
        .map(|i| client.submit(1, &[i; 3000]).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(150));
    let ready: Vec<RequestId> = client
        .poll(Duration::ZERO)
        .into_iter()
        .map(|r| r.0)
        .collect();
    assert_eq!(ready, ids, "read without a waiter, in the order they ended");
    let s = client.stats();
    assert_eq!(
        (s.submitted, s.answered, s.duplicates, s.unexpected, s.late),
        (93, 93, 0, 0, 0),
        "{s:?}"
    );
    assert_eq!(client.outstanding(), 0);
}

#[test]
fn prepared_requests_carry_the_same_bytes_and_are_checked_like_submit() {
    let platform = FakePlatform::start(|_, _, _| Act::Answer(Status::Ok));
    let input = photo();
    let client = Config::builder(platform.addr)
        .fragment_payload(1000)
        .input_len(9, input.len())
        .connect()
        .unwrap();
    // prepare_with is asked for each byte once, in order, in pieces of at
    // most a fragment's payload; cut from a closure, the bytes are the same.
    let mut asked = Vec::new();
    let p = client
        .prepare_with(9, input.len(), |offset, dst| {
            asked.push((offset, dst.len()));
            dst.copy_from_slice(&input[offset..offset + dst.len()]);
        })
        .unwrap();
    assert_eq!(p.frag_count(), 28);
    assert_eq!(asked.len(), 28);
    assert!(asked.windows(2).all(|w| w[0].0 + w[0].1 == w[1].0));
    assert_eq!(asked.last().map(|(o, l)| o + l), Some(input.len()));
    assert!(asked.iter().all(|&(_, l)| l <= 1000));
    let id = p.request_id();
    assert_eq!(
        client.outstanding(),
        0,
        "nothing is outstanding before send"
    );
    let a = client.infer_prepared(p).unwrap();
    assert_eq!(a.request_id, id);
    let seen = platform.seen().pop().unwrap();
    assert_eq!(seen.payload, input, "reassembled bytes differ");
    assert_eq!(seen.fragments, 28);
    assert_eq!(seen.header.request_id, id.0);

    // send + wait, the buffer of the first request reused (same bytes out).
    let p = client.prepare(9, &input).unwrap();
    let id = client.send(p).unwrap();
    assert_eq!(client.wait(id).unwrap().request_id, id);
    assert_eq!(platform.seen().pop().unwrap().payload, input);

    // The size checks are submit's, before anything is cut.
    assert!(matches!(
        client.prepare_with(9, 10, |_, _| panic!("must not be asked")),
        Err(ClientError::WrongSize {
            if_id: 9,
            expected: 27_648,
            got: 10
        })
    ));
    assert!(matches!(
        client.prepare(3, &[]),
        Err(ClientError::EmptyInput)
    ));
    // A prepared request is its client's: another refuses it, sending nothing.
    let other = Client::new(platform.addr).unwrap();
    let before = platform.seen().len();
    let p = client.prepare(9, &input).unwrap();
    assert!(matches!(other.send(p), Err(ClientError::Config(_))));
    assert_eq!(other.stats().submitted, 0);
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(platform.seen().len(), before, "nothing was sent");
}

#[test]
fn on_result_hands_each_submitted_result_to_the_callback_once() {
    // First byte: 0 silent (a timeout), 1 OVERLOADED, else OK after a few ms.
    let platform = FakePlatform::start(|_, p, _| match p[0] {
        0 => Act::Silent,
        1 => Act::Answer(Status::Overloaded),
        _ => Act::Delay(Duration::from_millis(u64::from(p[0] % 5))),
    });
    let client = Config::builder(platform.addr)
        .timeout(Duration::from_millis(300))
        .connect()
        .unwrap();
    // Ended before the callback was set: handed over when it is.
    let early = client.submit(1, &[2; 3000]).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let (tx, rx) = std::sync::mpsc::channel();
    let tx = Mutex::new(tx);
    client
        .on_result(move |id, r| tx.lock().unwrap().send((id, r)).unwrap())
        .unwrap();
    assert!(matches!(
        client.on_result(|_, _| {}),
        Err(ClientError::Config(_))
    ));
    let silent = client.submit(1, &[0; 10]).unwrap();
    let shed = client.submit(1, &[1; 10]).unwrap();
    let ok: Vec<RequestId> = (2..12u8)
        .map(|i| client.submit(1, &[i; 3000]).unwrap())
        .collect();
    // `infer` still returns its own result, and it never reaches the callback.
    let inferred = client.infer(1, &[3; 100]).unwrap().request_id;
    let mut got = HashMap::new();
    let until = Instant::now() + Duration::from_secs(5);
    while got.len() < 13 && Instant::now() < until {
        if let Ok((id, r)) = rx.recv_timeout(Duration::from_millis(50)) {
            assert!(got.insert(id, r).is_none(), "{id} delivered twice");
        }
    }
    assert_eq!(got.len(), 13, "{:?}", got.keys());
    assert!(got[&early].is_ok());
    assert!(matches!(got[&silent], Err(ClientError::Timeout(_))));
    assert!(matches!(got[&shed], Err(ClientError::Overloaded)));
    for id in &ok {
        assert!(got[id].is_ok(), "{id}: {:?}", got[id]);
    }
    assert!(!got.contains_key(&inferred));
    assert!(
        client.poll(Duration::ZERO).is_empty(),
        "nothing left for poll"
    );
    assert!(
        rx.recv_timeout(Duration::from_millis(100)).is_err(),
        "nothing more"
    );
}
