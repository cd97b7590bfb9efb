//! The gateway over real TCP and UDP sockets in-process: raw HTTP/1.1 bytes
//! in, exact statuses, headers and bodies out.
//!
//! The UDP peer is a STAND-IN, not kneepoint: a plain socket that decodes
//! fragments with kp-wire (the platform's decoder), reassembles them, and
//! answers each request with the status its if_id stands for, so every
//! platform status reaches the HTTP mapping. The gateway against the real
//! platform is tests/kserve_gateway.rs (cross-process, tritonclient).

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use kneepoint_client::Config;
use kp_wire::{Fragment, FragmentRepr, MsgType, ResponseRepr, Status};
use serde_json::{json, Value};

use super::*;
use crate::models;

/// What the stand-in answers for each if_id: 1 and 8 OK (top-k: the
/// input's first byte, then its last, with scores 0.5 and 0.25), 2
/// OVERLOADED, 3 BAD_REQUEST, 4 UNKNOWN_IF (for probes too), 5 INTERNAL,
/// 6 nothing, 7 INCOMPLETE. A one-byte probe gets BAD_REQUEST (as from an
/// IF) except from if 4.
fn behaviour(if_id: u16, payload: &[u8]) -> Option<Status> {
    match (if_id, payload.len()) {
        (4, _) => Some(Status::UnknownIf),
        (6, _) => None,
        (_, 1) => Some(Status::BadRequest),
        (1 | 8, _) => Some(Status::Ok),
        (2, _) => Some(Status::Overloaded),
        (3, _) => Some(Status::BadRequest),
        (5, _) => Some(Status::Internal),
        _ => Some(Status::Incomplete),
    }
}

struct StandIn {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl StandIn {
    fn start() -> StandIn {
        let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
        socket
            .set_read_timeout(Some(Duration::from_millis(5)))
            .unwrap();
        let addr = socket.local_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut partial: HashMap<(SocketAddr, u64), (Vec<u8>, u16)> = HashMap::new();
                let mut buf = vec![0u8; 65_536];
                while !stop.load(Ordering::Relaxed) {
                    let Ok((n, from)) = socket.recv_from(&mut buf) else {
                        continue;
                    };
                    let f = Fragment::new_checked(&buf[..n]).expect("a malformed fragment");
                    let h = FragmentRepr::parse(&f);
                    let (data, left) = partial
                        .entry((from, h.request_id))
                        .or_insert_with(|| (vec![0; h.total_len as usize], h.frag_count));
                    data[f.payload_range()].copy_from_slice(f.payload());
                    *left -= 1;
                    if *left > 0 {
                        continue;
                    }
                    let (data, _) = partial.remove(&(from, h.request_id)).unwrap();
                    let Some(status) = behaviour(h.if_id.0, &data) else {
                        continue;
                    };
                    let top = [
                        (u32::from(data[0]), 0.5f32),
                        (u32::from(data[data.len() - 1]), 0.25),
                    ];
                    let repr = if status == Status::Ok {
                        ResponseRepr {
                            msg_type: MsgType::Response,
                            if_id: h.if_id,
                            request_id: h.request_id,
                            send_ts_ns: h.send_ts_ns,
                            status,
                            batch_size: 1,
                            latency_us: 100,
                            results: &top,
                        }
                    } else {
                        ResponseRepr::error(h.if_id, h.request_id, h.send_ts_ns, status, 5)
                    };
                    let mut out = vec![0u8; repr.wire_len()];
                    repr.emit(&mut out).unwrap();
                    socket.send_to(&out, from).unwrap();
                }
            })
        };
        StandIn {
            addr,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for StandIn {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
    }
}

/// A gateway on 127.0.0.1 in front of a stand-in, with short timeouts.
struct Running {
    addr: SocketAddr,
    gw: Arc<Gateway>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
    _udp: StandIn,
    repo: std::path::PathBuf,
}

const HEADER_TIMEOUT: Duration = Duration::from_millis(300);
const BODY_TIMEOUT: Duration = Duration::from_millis(300);

impl Running {
    fn start(tag: &str) -> Running {
        let repo = models::tests::repo(
            tag,
            &[
                ("ok", 1, "rgb_u8_hwc", [3, 2, 2], 2),
                ("shed", 2, "rgb_u8_hwc", [3, 2, 2], 2),
                ("refused", 3, "rgb_u8_hwc", [3, 2, 2], 2),
                ("gone", 4, "rgb_u8_hwc", [3, 2, 2], 2),
                ("broken", 5, "rgb_u8_hwc", [3, 2, 2], 2),
                ("silent", 6, "rgb_u8_hwc", [3, 2, 2], 2),
                ("lossy", 7, "rgb_u8_hwc", [3, 2, 2], 2),
                ("flat", 8, "f32_nchw", [1, 2, 2], 2),
            ],
        );
        let udp = StandIn::start();
        let served = models::load(&repo, &[]).unwrap();
        let client = Config::builder(udp.addr)
            .timeout(Duration::from_millis(300))
            .connect()
            .unwrap();
        let limits = Limits {
            max_batch: 2,
            timeout: Duration::from_millis(300),
            body_timeout: BODY_TIMEOUT,
            max_body_bytes: 1 << 20,
            ready_ttl: Duration::from_secs(1),
        };
        let gw = Arc::new(Gateway::new(served, Bridge::new(client).unwrap(), limits));
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let thread = {
            let gw = gw.clone();
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(async move {
                    let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                    serve(listener, router(gw), 16, HEADER_TIMEOUT, async {
                        let _ = rx.await;
                    })
                    .await;
                });
            })
        };
        Running {
            addr,
            gw,
            shutdown: Some(tx),
            thread: Some(thread),
            _udp: udp,
            repo,
        }
    }

    fn connect(&self) -> Conn {
        let s = TcpStream::connect(self.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        Conn(BufReader::new(s))
    }

    /// One request on a new connection.
    fn call(&self, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Reply {
        let mut c = self.connect();
        c.send(method, path, headers, body);
        c.read().expect("a response")
    }

    fn get(&self, path: &str) -> Reply {
        self.call("GET", path, &[], b"")
    }

    fn infer_json(&self, model: &str, body: &Value) -> Reply {
        self.call(
            "POST",
            &format!("/v2/models/{model}/infer"),
            &[("Content-Type", "application/json")],
            body.to_string().as_bytes(),
        )
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
        let _ = std::fs::remove_dir_all(&self.repo);
    }
}

#[derive(Debug)]
struct Reply {
    status: u16,
    headers: HashMap<String, String>,
    body: Vec<u8>,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!("{e}: {:?}", String::from_utf8_lossy(&self.body));
        })
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(String::as_str)
    }
}

struct Conn(BufReader<TcpStream>);

impl Conn {
    fn send(&mut self, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) {
        let mut head = format!("{method} {path} HTTP/1.1\r\nHost: gw\r\n");
        let mut has_length = false;
        for (k, v) in headers {
            has_length |= k.eq_ignore_ascii_case("content-length")
                || k.eq_ignore_ascii_case("transfer-encoding");
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        if !has_length && (method == "POST" || !body.is_empty()) {
            head.push_str(&format!("Content-Length: {}\r\n", body.len()));
        }
        head.push_str("\r\n");
        let s = self.0.get_mut();
        s.write_all(head.as_bytes()).unwrap();
        s.write_all(body).unwrap();
    }

    fn raw(&mut self, bytes: &[u8]) {
        self.0.get_mut().write_all(bytes).unwrap();
    }

    /// The next response, or None when the server closed the connection.
    fn read(&mut self) -> Option<Reply> {
        let mut line = String::new();
        if self.0.read_line(&mut line).ok()? == 0 {
            return None;
        }
        let status = line.split_whitespace().nth(1).unwrap().parse().unwrap();
        let mut headers = HashMap::new();
        loop {
            line.clear();
            self.0.read_line(&mut line).unwrap();
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            let (k, v) = l.split_once(':').unwrap();
            headers.insert(k.to_ascii_lowercase(), v.trim().to_string());
        }
        let len: usize = headers
            .get("content-length")
            .map_or(0, |v| v.parse().unwrap());
        let mut body = vec![0; len];
        self.0.read_exact(&mut body).unwrap();
        Some(Reply {
            status,
            headers,
            body,
        })
    }
}

fn input(data: Value) -> Value {
    json!({"inputs": [{"name": "INPUT", "datatype": "UINT8", "shape": [1, 2, 2, 3], "data": data}]})
}

#[test]
fn health_metadata_and_readiness() {
    let gw = Running::start("health");
    let cases = [
        ("/v2/health/live", 200, json!({"live": true})),
        (
            "/v2",
            200,
            json!({"name": "kneepoint", "version": env!("CARGO_PKG_VERSION"),
                   "extensions": ["binary_tensor_data"]}),
        ),
        (
            "/v2/models/ok/versions/1",
            200,
            json!({"name": "ok", "versions": ["1"], "platform": "kneepoint",
                "inputs": [{"name": "INPUT", "datatype": "UINT8", "shape": [-1, 2, 2, 3]}],
                "outputs": [{"name": "CLASSES", "datatype": "INT32", "shape": [-1, 2]},
                            {"name": "SCORES", "datatype": "FP32", "shape": [-1, 2]}],
                "parameters": {"if_id": 1, "scores": "probabilities", "slo_ms": 20.0}}),
        ),
        (
            "/v2/models/nope",
            404,
            json!({"error": "unknown model 'nope'"}),
        ),
        (
            "/v2/models/ok/versions/2",
            404,
            json!({"error": "model 'ok' has no version '2' (its only version is 1)"}),
        ),
        (
            "/v3/whatever",
            404,
            json!({"error": "no such endpoint: GET /v3/whatever"}),
        ),
        (
            "/v2/models/ok/ready",
            200,
            json!({"name": "ok", "ready": true}),
        ),
        (
            "/v2/models/ok/versions/1/ready",
            200,
            json!({"name": "ok", "ready": true}),
        ),
        (
            "/v2/models/gone/ready",
            503,
            json!({"error": "model 'gone' is not deployed (no inference function has if_id 4)"}),
        ),
        (
            "/v2/models/silent/ready",
            503,
            json!({"error": "model 'silent' (if_id 6): the platform did not answer: no answer within 300ms"}),
        ),
        // The server is ready when every model is: not with `gone` served.
        (
            "/v2/health/ready",
            503,
            json!({"error": "model 'gone' is not deployed (no inference function has if_id 4)"}),
        ),
    ];
    for (path, status, body) in cases {
        let r = gw.get(path);
        assert_eq!((r.status, r.json()), (status, body), "{path}");
        assert_eq!(
            r.header("retry-after"),
            (status == 503).then_some("1"),
            "{path}"
        );
    }
    assert_eq!(
        gw.get("/v2/models/flat").json()["inputs"][0]["datatype"],
        "FP32"
    );
    // Probes are cached: the second round sent nothing new.
    let sent = gw.bridge_submitted();
    assert_eq!(gw.get("/v2/models/ok/ready").status, 200);
    assert_eq!(gw.bridge_submitted(), sent);
}

impl Running {
    fn bridge_submitted(&self) -> u64 {
        self.gw.bridge.client().stats().submitted
    }
}

#[test]
fn infer_json_and_binary_forms() {
    let gw = Running::start("infer");
    let r = gw.infer_json("ok", &input(json!([7, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 9])));
    assert_eq!(r.status, 200, "{:?}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(
        r.json(),
        json!({"model_name": "ok", "model_version": "1", "outputs": [
            {"name": "CLASSES", "datatype": "INT32", "shape": [1, 2], "data": [7, 9]},
            {"name": "SCORES", "datatype": "FP32", "shape": [1, 2], "data": [0.5, 0.25]}]})
    );

    // Binary in, CLASSES binary out, a batch of two, on a versioned URL,
    // twice on one keep-alive connection.
    let header = json!({"id": "b2",
        "inputs": [{"name": "INPUT", "datatype": "UINT8", "shape": [2, 2, 2, 3],
                    "parameters": {"binary_data_size": 24}}],
        "outputs": [{"name": "CLASSES", "parameters": {"binary_data": true}}]})
    .to_string();
    let mut body = header.clone().into_bytes();
    body.extend((10..22).chain(30..42));
    let hl = header.len().to_string();
    let mut c = gw.connect();
    for _ in 0..2 {
        let sent = std::time::Instant::now();
        c.send(
            "POST",
            "/v2/models/ok/versions/1/infer",
            &[("Inference-Header-Content-Length", &hl)],
            &body,
        );
        let r = c.read().unwrap();
        let exchange = sent.elapsed();
        assert_eq!(r.status, 200, "{:?}", String::from_utf8_lossy(&r.body));
        assert_eq!(r.header("content-type"), Some("application/octet-stream"));
        // The platform's part of it, inside the whole exchange.
        let platform: u128 = r
            .header("kneepoint-platform-rtt-us")
            .unwrap()
            .parse()
            .unwrap();
        assert!(
            platform <= exchange.as_micros(),
            "{platform} us in {exchange:?}"
        );
        let n: usize = r
            .header("inference-header-content-length")
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(
            serde_json::from_slice::<Value>(&r.body[..n]).unwrap(),
            json!({"model_name": "ok", "model_version": "1", "id": "b2", "outputs": [
                {"name": "CLASSES", "datatype": "INT32", "shape": [2, 2],
                 "parameters": {"binary_data_size": 16}}]})
        );
        let classes: Vec<i32> = r.body[n..]
            .chunks_exact(4)
            .map(|b| i32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        assert_eq!(classes, [10, 21, 30, 41]);
    }

    // FP32 in JSON: its little-endian bytes are what the platform gets
    // (the stand-in answers the first and last byte).
    let r = gw.infer_json(
        "flat",
        &json!({"inputs": [{"name": "INPUT", "datatype": "FP32", "shape": [1, 1, 2, 2],
                            "data": [1.0, 0, 0, -2.0]}]}),
    );
    assert_eq!(r.status, 200);
    assert_eq!(
        r.json()["outputs"][0]["data"],
        json!([1.0f32.to_le_bytes()[0], (-2.0f32).to_le_bytes()[3]])
    );
    let report = gw.gw.counters.report();
    assert_eq!(
        (
            &report["infer"],
            &report["platform_requests"],
            &report["own_us"]["count"]
        ),
        (&json!({"200": 4}), &json!(6), &json!(4))
    );
}

#[test]
fn platform_statuses_become_http_statuses() {
    let gw = Running::start("status");
    let data = json!([1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]);
    let cases = [
        ("shed", 503, "model 'shed': OVERLOADED: the platform shed the request"),
        (
            "refused",
            400,
            "model 'refused': BAD_REQUEST: if_id 3 refused the request (input size not the model's?)",
        ),
        (
            "gone",
            404,
            "model 'gone': UNKNOWN_IF: no inference function is deployed under if_id 4",
        ),
        (
            "broken",
            500,
            "model 'broken': INTERNAL: the inference function failed on this request",
        ),
        ("silent", 504, "model 'silent': no answer within 300ms"),
        (
            "lossy",
            502,
            "model 'lossy': INCOMPLETE: not all fragments reached the platform in time",
        ),
    ];
    for (model, status, error) in cases {
        let r = gw.infer_json(model, &input(data.clone()));
        assert_eq!(
            (r.status, r.json()),
            (status, json!({ "error": error })),
            "{model}"
        );
        assert_eq!(
            r.header("retry-after"),
            (status == 503).then_some("1"),
            "{model}"
        );
    }
    // What those answers said is readiness enough: no probe is sent. An IF
    // answered for `shed` (ready); the if-manager's UNKNOWN_IF for `gone`
    // (not ready).
    let sent = gw.bridge_submitted();
    assert_eq!(gw.get("/v2/models/shed/ready").status, 200);
    assert_eq!(gw.get("/v2/models/gone/ready").status, 503);
    assert_eq!(gw.bridge_submitted(), sent);
    // A client's own shorter timeout (µs, as tritonclient sends it) wins.
    let mut body = input(data.clone());
    body["parameters"] = json!({"timeout": 50_000});
    let r = gw.infer_json("silent", &body);
    assert_eq!(
        (r.status, r.json()),
        (
            504,
            json!({"error": "model 'silent': no answer within 50ms"})
        )
    );
}

#[test]
fn bad_input_is_refused_with_the_right_status() {
    let gw = Running::start("bad");
    let post = |headers: &[(&str, &str)], body: &[u8]| {
        let r = gw.call("POST", "/v2/models/ok/infer", headers, body);
        (
            r.status,
            r.json()["error"].as_str().unwrap_or("").to_string(),
        )
    };
    assert_eq!(
        post(&[], b"{not json"),
        (
            400,
            "malformed inference request JSON: key must be a string at line 1 column 2".into()
        )
    );
    assert_eq!(
        gw.infer_json("nope", &input(json!([1]))).json(),
        json!({"error": "unknown model 'nope'"})
    );
    assert_eq!(
        post(&[("Content-Encoding", "gzip")], b"{}"),
        (
            415,
            "Content-Encoding 'gzip' is not supported: send the body uncompressed".into()
        )
    );
    assert_eq!(
        post(&[("Inference-Header-Content-Length", "x")], b"{}"),
        (
            400,
            "Inference-Header-Content-Length \"x\" is not a byte count".into()
        )
    );
    // Chunked, no Content-Length.
    assert_eq!(
        post(&[("Transfer-Encoding", "chunked")], b"2\r\n{}\r\n0\r\n\r\n"),
        (
            411,
            "infer needs a Content-Length (chunked bodies are not accepted)".into()
        )
    );
    // Over the limit: refused on the head alone, before any body byte is
    // sent (JSON form: 64 KiB + 2 x 12 elements x 26 bytes; binary form:
    // 64 KiB + 2 x 12 bytes).
    let json_limit = HEADER_ALLOWANCE + 2 * 12 * JSON_BYTES_PER_ELEMENT;
    let binary_limit = HEADER_ALLOWANCE + 2 * 12;
    for (extra, limit) in [(None, json_limit), (Some("10"), binary_limit)] {
        let mut c = gw.connect();
        let mut head = format!(
            "POST /v2/models/ok/infer HTTP/1.1\r\nHost: gw\r\nContent-Length: {}\r\n",
            limit + 1
        );
        if let Some(hl) = extra {
            head.push_str(&format!("Inference-Header-Content-Length: {hl}\r\n"));
        }
        head.push_str("\r\n");
        c.raw(head.as_bytes());
        let r = c.read().unwrap();
        assert_eq!(
            (r.status, r.json()),
            (
                413,
                json!({"error": format!(
                    "request body of {} bytes exceeds the {limit} bytes model 'ok' can take",
                    limit + 1
                )})
            )
        );
    }
    // A body that stops coming: 408 after the body timeout.
    let mut c = gw.connect();
    c.raw(b"POST /v2/models/ok/infer HTTP/1.1\r\nHost: gw\r\nContent-Length: 100\r\n\r\n{\"inp");
    let t0 = Instant::now();
    let r = c.read().unwrap();
    assert_eq!(
        (r.status, r.json()),
        (
            408,
            json!({"error": format!("request body not received within {BODY_TIMEOUT:?}")})
        )
    );
    assert!(t0.elapsed() >= BODY_TIMEOUT);
    // A head that stops coming (slow-loris): the connection is closed
    // after the header timeout, with nothing sent.
    let mut c = gw.connect();
    c.raw(b"POST /v2/models/ok/infer HTTP/1.1\r\nHost: gw\r\nX-Slow: ");
    let t0 = Instant::now();
    let mut rest = Vec::new();
    assert_eq!(c.0.read_to_end(&mut rest).unwrap(), 0);
    let waited = t0.elapsed();
    assert!(
        waited >= HEADER_TIMEOUT - Duration::from_millis(50) && waited < Duration::from_secs(3),
        "{waited:?}"
    );
    // Garbage instead of HTTP: hyper's bare 400 and the connection closed;
    // the gateway still serves afterwards.
    let mut c = gw.connect();
    c.raw(b"\x00\x01\x02 nonsense\r\n\r\n");
    let mut rest = Vec::new();
    c.0.read_to_end(&mut rest).unwrap();
    let rest = String::from_utf8_lossy(&rest);
    assert!(
        rest.starts_with("HTTP/1.1 400 Bad Request\r\nconnection: close\r\ncontent-length: 0\r\n"),
        "{rest:?}"
    );
    assert_eq!(gw.get("/v2/health/live").status, 200);
    assert_eq!(
        gw.gw.counters.report()["infer"],
        json!({"400": 2, "404": 1, "408": 1, "411": 1, "413": 2, "415": 1})
    );
}
