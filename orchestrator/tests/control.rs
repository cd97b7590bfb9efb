//! The control protocol over a real socket: a `ControlServer` on a temporary
//! `ipc://` endpoint, served from a thread by a small handler built on
//! `DesiredState`, asked by `ControlClient` and by the `kpctl` binary.
//!
//! Sends malformed bytes, non-object JSON, unknown commands and commands out
//! of order, and checks each reply's code and that the state did not move.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use orchestrator::control::{
    BindOptions, CatalogEntry, Change, ControlClient, ControlServer, DesiredState, Handler,
    ModelCatalog, Reply, Request, ServerError, StatusReport,
};
use serde_json::{json, Value};

/// A daemon without processes: plan, apply, answer.
struct TestDaemon {
    state: DesiredState,
    models: ModelCatalog,
}

impl Handler for TestDaemon {
    fn handle(&mut self, request: Request) -> Reply {
        // A hook for the test: "retire 99" marks if2 busy, "retire 98"
        // clears it (the daemon does this when it starts/ends a switchover).
        match request {
            Request::Retire { if_id: 99 } => {
                self.state.set_busy(2, "switching over to 50%");
                return Reply::ok();
            }
            Request::Retire { if_id: 98 } => {
                self.state.clear_busy(2);
                return Reply::ok();
            }
            _ => {}
        }
        match self.state.plan(&request, &self.models) {
            Err(e) => e.into(),
            Ok(Change::Status) => Reply::status(&StatusReport::from_desired(&self.state)),
            Ok(change) => {
                let reply = change.reply();
                self.state.apply(change);
                reply
            }
        }
    }
}

fn catalog() -> ModelCatalog {
    [
        ("squeezenet", 1, 20.0),
        ("resnet50", 2, 200.0),
        ("alexnet", 3, 100.0),
    ]
    .into_iter()
    .map(|(name, if_id, slo_ms)| CatalogEntry {
        name: name.into(),
        if_id,
        slo_ms,
        knee_share_pct: None,
        engine: kp_schema::model::EngineKind::OnnxRuntime,
    })
    .collect()
}

/// A fresh folder under the system temp folder, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("kp-ctl-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).expect("temp dir");
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// The server thread; stops and joins on drop.
struct Daemon {
    endpoint: String,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Daemon {
    fn start(endpoint: &str) -> Daemon {
        let mut server = ControlServer::bind(endpoint, BindOptions::default()).expect("bind");
        let endpoint = server.endpoint().to_string();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut daemon = TestDaemon {
                state: DesiredState::new("/opt/kneepoint/kp-if"),
                models: catalog(),
            };
            while !flag.load(Ordering::Relaxed) {
                server
                    .poll_once(&mut daemon, Duration::from_millis(20))
                    .expect("serve");
            }
        });
        Daemon {
            endpoint,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.join().expect("server thread");
        }
    }
}

fn client(endpoint: &str) -> ControlClient {
    ControlClient::new(endpoint, Duration::from_secs(10))
}

fn code(reply: &Reply) -> &str {
    reply.error_code().unwrap_or("ok")
}

/// The `ifs` of a status reply.
fn status(c: &ControlClient) -> Value {
    let reply = c.request(&Request::Status).expect("status");
    let json = reply.to_json();
    assert_eq!(json["ok"], true, "{json}");
    json["ifs"].clone()
}

fn raw(c: &ControlClient, bytes: &[u8]) -> Reply {
    c.request_raw(bytes).expect("a reply")
}

fn kpctl(endpoint: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kpctl"))
        .arg("--endpoint")
        .arg(endpoint)
        .args(args)
        .env_remove("KNEEPOINT_CONTROL")
        .output()
        .expect("run kpctl")
}

fn mode(path: &Path) -> u32 {
    fs::metadata(path).expect("metadata").permissions().mode() & 0o777
}

#[test]
fn bad_and_out_of_order_commands_change_nothing() {
    let tmp = TempDir::new("proto");
    let sock = tmp.0.join("run/kneepoint/orchestrator.sock");
    let endpoint = format!("ipc://{}", sock.display());
    let daemon = Daemon::start(&endpoint);
    let c = client(&daemon.endpoint);

    // Owner-only: the folders it created are 0700, the socket 0600.
    assert_eq!(mode(sock.parent().unwrap()), 0o700);
    assert_eq!(mode(&tmp.0.join("run")), 0o700);
    assert_eq!(mode(&sock), 0o600);

    let empty = status(&c);
    assert_eq!(empty, json!([]));

    // Out of order before anything is deployed.
    for (req, want) in [
        (json!({"cmd": "retire", "if_id": 1}), "unknown_if"),
        (
            json!({"cmd": "slo", "if_id": 1, "slo_ms": 10}),
            "unknown_if",
        ),
        (json!({"cmd": "share", "if_id": 1, "pct": 10}), "unknown_if"),
        (json!({"cmd": "unpin", "if_id": 1}), "unknown_if"),
    ] {
        let reply = raw(&c, req.to_string().as_bytes());
        assert_eq!(code(&reply), want, "{req}");
        assert_eq!(status(&c), empty, "after {req}");
    }

    // Deploy two IFs, pin one.
    let reply = raw(&c, br#"{"cmd":"deploy","if_id":1,"model":"squeezenet"}"#);
    assert_eq!(code(&reply), "ok");
    let deployed = reply.to_json();
    assert_eq!(deployed["if"]["share_pct"], 30.0);
    assert_eq!(deployed["if"]["slo_ms"], 20.0);
    assert_eq!(deployed["if"]["binary"], "/opt/kneepoint/kp-if");
    for req in [
        json!({"cmd": "deploy", "if_id": 2, "model": "resnet50", "slo_ms": 150, "share_pct": 40}),
        json!({"cmd": "share", "if_id": 2, "pct": 60}),
    ] {
        assert_eq!(code(&raw(&c, req.to_string().as_bytes())), "ok", "{req}");
    }
    let two = status(&c);
    assert_eq!(two.as_array().unwrap().len(), 2);
    assert_eq!(two[1]["pinned"], true);
    assert_eq!(two[1]["share_pct"], 60.0);
    assert_eq!(two[1]["slo_ms"], 150.0);

    // Every one of these is refused and leaves the state as it was.
    let bad: Vec<(Vec<u8>, &str)> = vec![
        (b"".to_vec(), "malformed"),
        (b"hello".to_vec(), "malformed"),
        (vec![0xff, 0x00, 0x80, 0x7b], "malformed"),
        (b"{\"cmd\":\"status\"".to_vec(), "malformed"),
        (b"[]".to_vec(), "malformed"),
        (br#"["status"]"#.to_vec(), "malformed"),
        (b"\"status\"".to_vec(), "malformed"),
        (b"17".to_vec(), "malformed"),
        (b"null".to_vec(), "malformed"),
        (b"{}".to_vec(), "malformed"),
        (br#"{"cmd":3}"#.to_vec(), "malformed"),
        (br#"{"cmd":"deploy","if_id":3}"#.to_vec(), "malformed"),
        (
            br#"{"cmd":"deploy","if_id":"3","model":"alexnet"}"#.to_vec(),
            "malformed",
        ),
        (
            br#"{"cmd":"deploy","if_id":3,"model":"alexnet","gpu":1}"#.to_vec(),
            "malformed",
        ),
        (br#"{"cmd":"retire","if_id":-1}"#.to_vec(), "malformed"),
        (br#"{"cmd":"retire","if_id":65536}"#.to_vec(), "malformed"),
        (
            br#"{"cmd":"slo","if_id":1,"slo_ms":"5"}"#.to_vec(),
            "malformed",
        ),
        (br#"{"cmd":"status","all":true}"#.to_vec(), "malformed"),
        (br#"{"cmd":"launch","if_id":3}"#.to_vec(), "unknown_command"),
        (br#"{"cmd":"STATUS"}"#.to_vec(), "unknown_command"),
        (
            br#"{"cmd":"deploy","if_id":1,"model":"squeezenet"}"#.to_vec(),
            "already_deployed",
        ),
        (
            br#"{"cmd":"deploy","if_id":4,"model":"alexnet"}"#.to_vec(),
            "if_id_mismatch",
        ),
        (
            br#"{"cmd":"deploy","if_id":4,"model":"vgg19"}"#.to_vec(),
            "unknown_model",
        ),
        (
            br#"{"cmd":"deploy","if_id":3,"model":"alexnet","slo_ms":0}"#.to_vec(),
            "invalid_value",
        ),
        (
            br#"{"cmd":"deploy","if_id":3,"model":"alexnet","share_pct":101}"#.to_vec(),
            "invalid_value",
        ),
        (
            br#"{"cmd":"deploy","if_id":3,"model":"alexnet","binary":"kp-if"}"#.to_vec(),
            "invalid_value",
        ),
        (
            br#"{"cmd":"slo","if_id":1,"slo_ms":-3}"#.to_vec(),
            "invalid_value",
        ),
        (
            br#"{"cmd":"share","if_id":1,"pct":0}"#.to_vec(),
            "invalid_value",
        ),
        (
            br#"{"cmd":"share","if_id":1,"pct":41}"#.to_vec(),
            "over_capacity",
        ),
        (br#"{"cmd":"unpin","if_id":1}"#.to_vec(), "not_pinned"),
        (br#"{"cmd":"retire","if_id":3}"#.to_vec(), "unknown_if"),
    ];
    for (bytes, want) in &bad {
        let reply = raw(&c, bytes);
        assert_eq!(code(&reply), *want, "{:?}", String::from_utf8_lossy(bytes));
        let Reply::Error { message, .. } = &reply else {
            unreachable!()
        };
        assert!(message.len() > 10, "a reason: {message}");
        assert_eq!(
            status(&c),
            two,
            "after {:?}",
            String::from_utf8_lossy(bytes)
        );
    }

    // A request in two frames is malformed too.
    let bytes = c
        .exchange(&[br#"{"cmd":"status"}"#, b"more"])
        .expect("a reply");
    assert_eq!(code(&Reply::parse(&bytes).unwrap()), "malformed");

    // Busy while a change is in progress.
    assert_eq!(code(&raw(&c, br#"{"cmd":"retire","if_id":99}"#)), "ok");
    let busy_status = status(&c);
    for req in [
        json!({"cmd": "share", "if_id": 2, "pct": 30}),
        json!({"cmd": "unpin", "if_id": 2}),
        json!({"cmd": "slo", "if_id": 2, "slo_ms": 90}),
        json!({"cmd": "retire", "if_id": 2}),
    ] {
        let reply = raw(&c, req.to_string().as_bytes());
        assert_eq!(code(&reply), "busy", "{req}");
        assert_eq!(status(&c), busy_status, "after {req}");
    }
    assert_eq!(code(&raw(&c, br#"{"cmd":"retire","if_id":98}"#)), "ok");

    // In order, they go through.
    for (req, check) in [
        (
            json!({"cmd": "unpin", "if_id": 2}),
            ("pinned", json!(false)),
        ),
        (
            json!({"cmd": "slo", "if_id": 1, "slo_ms": 25.5}),
            ("slo_ms", json!(25.5)),
        ),
        (
            json!({"cmd": "share", "if_id": 1, "pct": 100}),
            ("share_pct", json!(100.0)),
        ),
    ] {
        let reply = raw(&c, req.to_string().as_bytes());
        assert_eq!(code(&reply), "ok", "{req}");
        assert_eq!(reply.to_json()["if"][check.0], check.1, "{req}");
    }
    let reply = raw(&c, br#"{"cmd":"retire","if_id":2}"#);
    assert_eq!(reply.to_json()["retired"]["model"], "resnet50");
    let one = status(&c);
    assert_eq!(one.as_array().unwrap().len(), 1);

    // Shutdown: changes are refused from then on, status still answers.
    assert_eq!(code(&raw(&c, br#"{"cmd":"shutdown"}"#)), "ok");
    for req in [
        json!({"cmd": "deploy", "if_id": 3, "model": "alexnet"}),
        json!({"cmd": "retire", "if_id": 1}),
        json!({"cmd": "share", "if_id": 1, "pct": 5}),
    ] {
        assert_eq!(
            code(&raw(&c, req.to_string().as_bytes())),
            "shutting_down",
            "{req}"
        );
    }
    let after = c.request(&Request::Status).unwrap().to_json();
    assert_eq!(after["shutting_down"], true);
    assert_eq!(after["ifs"], one);

    drop(daemon);
    // libzmq closes (and unlinks) its listener from its I/O thread, which
    // can lag the context's end on a busy machine: wait for it. The deadline
    // only fails a socket that is never removed.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while sock.exists() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(!sock.exists(), "the socket is removed when the server goes");
}

#[test]
fn kpctl_prints_status_and_fails_on_errors() {
    let tmp = TempDir::new("kpctl");
    let endpoint = format!("ipc://{}", tmp.0.join("ctl.sock").display());
    let daemon = Daemon::start(&endpoint);

    let out = kpctl(&endpoint, &["status"]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "no inference functions deployed\n"
    );

    let out = kpctl(
        &endpoint,
        &[
            "deploy", "--if-id", "3", "--model", "alexnet", "--slo-ms", "80",
        ],
    );
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("deployed if3") && text.contains("80"),
        "{text}"
    );

    let out = kpctl(&endpoint, &["share", "3", "45"]);
    assert!(out.status.success(), "{out:?}");

    let out = kpctl(&endpoint, &["status"]);
    assert!(out.status.success(), "{out:?}");
    let table = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = table.lines().collect();
    assert!(lines[0].starts_with("IF  MODEL"), "{table}");
    assert!(
        lines[1].contains("alexnet") && lines[1].contains("45.0%"),
        "{table}"
    );
    assert!(lines[1].contains("pin"), "{table}");

    let out = kpctl(&endpoint, &["--json", "status"]);
    assert!(out.status.success(), "{out:?}");
    let json: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(json["ok"], true);
    assert_eq!(json["ifs"][0]["if_id"], 3);
    assert_eq!(json["ifs"][0]["slo_ms"], 80.0);

    // Refused: exit 1, the code and the reason on stderr.
    let out = kpctl(&endpoint, &["retire", "42"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unknown_if") && err.contains("if42"), "{err}");
    let out = kpctl(&endpoint, &["--json", "share", "3", "250"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let json: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(json["error"]["code"], "invalid_value");

    // Bad usage never reaches the daemon: exit 2.
    let out = kpctl(&endpoint, &["slo", "3", "nan"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let out = kpctl(
        &endpoint,
        &[
            "deploy",
            "--if-id",
            "3",
            "--model",
            "x",
            "--binary",
            "/no/such/kp-if",
        ],
    );
    assert_eq!(out.status.code(), Some(2), "{out:?}");

    // --wait: only for commands that change an IF; after one, the IF's row
    // once it is neither starting nor switching (here at once).
    let out = kpctl(&endpoint, &["--wait", "status"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let out = kpctl(&endpoint, &["--json", "--wait", "share", "3", "45"]);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "the reply, then the wait's result: {text}");
    let waited: Value = serde_json::from_str(lines[1]).expect("JSON");
    assert_eq!(waited["switchovers"], 0, "{waited}");
    assert_eq!(waited["if"]["state"], "active", "{waited}");
    assert_eq!(waited["if"]["share_pct"], 45.0, "{waited}");
    let out = kpctl(&endpoint, &["--wait", "share", "3", "45"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("if3: active at 45%") && text.contains("no switchover"),
        "{text}"
    );

    // The state is what the accepted commands made it.
    let out = kpctl(&endpoint, &["--json", "status"]);
    let json: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(json["ifs"].as_array().unwrap().len(), 1);
    assert_eq!(json["ifs"][0]["share_pct"], 45.0);

    // watch --json prints one status line per refresh; stop it after two.
    let mut child = Command::new(env!("CARGO_BIN_EXE_kpctl"))
        .args([
            "--endpoint",
            &endpoint,
            "--json",
            "watch",
            "--every-ms",
            "100",
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("kpctl watch");
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(
        child.stdout.take().expect("stdout"),
    ));
    for _ in 0..2 {
        let line = lines.next().expect("a line").expect("text");
        let json: Value = serde_json::from_str(&line).expect("JSON");
        assert_eq!(json["ifs"][0]["model"], "alexnet");
    }
    child.kill().expect("kill watch");
    child.wait().expect("wait watch");

    drop(daemon);

    // No daemon: a clear error, exit 3, promptly.
    let started = std::time::Instant::now();
    let out = kpctl(&endpoint, &["--timeout-ms", "300", "status"]);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no reply from") && err.contains("300 ms"),
        "{err}"
    );
    assert!(err.contains("no socket at"), "{err}");
    // Its own 300 ms, not kpctl's default 3000 ms: a process start and
    // 300 ms are far below the default even on a slow, loaded machine; a
    // client that ignored --timeout-ms would wait the default at least.
    let waited = started.elapsed();
    assert!(waited < Duration::from_millis(3000), "waited {waited:?}");
}

#[test]
fn a_live_socket_is_not_stolen_and_a_stale_one_is_replaced() {
    let tmp = TempDir::new("steal");
    let endpoint = format!("ipc://{}", tmp.0.join("o.sock").display());
    let daemon = Daemon::start(&endpoint);
    match ControlServer::bind(&endpoint, BindOptions::default()) {
        Err(ServerError::InUse { .. }) => {}
        other => panic!("expected InUse, got {other:?}"),
    }
    // The first server still answers.
    assert_eq!(status(&client(&daemon.endpoint)), json!([]));
    drop(daemon);

    // A socket file nobody serves (a crashed daemon's) is replaced.
    let stale = tmp.0.join("stale.sock");
    drop(std::os::unix::net::UnixListener::bind(&stale).expect("listener"));
    assert!(stale.exists());
    let endpoint = format!("ipc://{}", stale.display());
    let daemon = Daemon::start(&endpoint);
    assert_eq!(status(&client(&daemon.endpoint)), json!([]));
    assert_eq!(mode(&stale), 0o600);
    drop(daemon);

    // A plain file in the way is not touched.
    let file = tmp.0.join("file.sock");
    fs::write(&file, b"keep").unwrap();
    let err = ControlServer::bind(&format!("ipc://{}", file.display()), BindOptions::default())
        .unwrap_err();
    assert!(err.to_string().contains("not a socket"), "{err}");
    assert_eq!(fs::read(&file).unwrap(), b"keep");
}
