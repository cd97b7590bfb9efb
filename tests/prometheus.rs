//! A real Prometheus scrapes the platform: the orchestrator serves
//! `/metrics` on a free loopback port, Debian's `prometheus` (installed by
//! scripts/setup.sh) is started with its own config, storage and port and
//! scrapes it every second, kp-client (on the Rust client library) sends
//! requests, and Prometheus's HTTP API (`/api/v1/query`) must then say
//! exactly what the client counted: the OK answers, and as many latency
//! observations.
//!
//! Prometheus is stopped and its directory removed when the test ends,
//! failed or not (a guard's `Drop`); the orchestrator takes its platform
//! with it the same way.
//!
//! Two environment variables serve `bench/plot_prometheus.py` (a plot of a
//! real run, docs/METRICS.md): `KP_PROMETHEUS_KEEP=DIR` keeps Prometheus's
//! directory (config, `tsdb/`, log) in `DIR` instead of removing it, and
//! `KP_PROMETHEUS_REQUESTS=N` sends `N` requests instead of [`REQUESTS`],
//! `KP_PROMETHEUS_CONCURRENCY=C` keeps `C` in flight instead of
//! [`CONCURRENCY`] (the checks are the same).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, ensure, Context, Result};
use kneepoint_tests::orchestrator::{all_active, wait_for, write_config, Orchestrator};
use kneepoint_tests::{bin, file_prefix, kp_client_closed_loop, repo_root, NetnsPair, Scratch};
use serde_json::Value;

/// Requests the client sends: enough for every series to move, few enough
/// for a 2-core machine to serve in seconds.
const REQUESTS: u32 = 60;

/// Requests kp-client keeps in flight.
const CONCURRENCY: u32 = 2;

/// The number in environment variable `var`, or `default`.
fn env_number(var: &str, default: u32) -> Result<u32> {
    match std::env::var(var) {
        Ok(n) => n
            .parse()
            .with_context(|| format!("{var}={n} is not a number")),
        Err(_) => Ok(default),
    }
}

/// How long the test waits for Prometheus to be up and for a scrape after
/// the traffic; only a hung test reaches it.
const DEADLINE: Duration = Duration::from_secs(30);

/// A loopback port no one listens on now.
fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// A `prometheus` process and its directory, both gone when dropped.
struct Prometheus {
    child: Child,
    dir: std::path::PathBuf,
    port: u16,
}

impl Prometheus {
    /// Starts Prometheus on a free loopback port, scraping `target`
    /// (`HOST:PORT`) every second, with its storage in `dir`.
    fn start(dir: std::path::PathBuf, target: &str) -> Result<Prometheus> {
        std::fs::create_dir_all(&dir)?;
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
                 scrape_configs:\n  - job_name: kneepoint\n    scrape_interval: 1s\n    scrape_timeout: 1s\n\
                 \x20   static_configs:\n      - targets: ['{target}']\n"
            ),
        )?;
        let port = free_port()?;
        let log = std::fs::File::create(dir.join("prometheus.log"))?;
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("tsdb").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("starting prometheus (scripts/setup.sh installs Debian's package)")?;
        let p = Prometheus { child, dir, port };
        let deadline = Instant::now() + DEADLINE;
        while !p.get("/-/ready").is_ok_and(|(code, _)| code == 200) {
            ensure!(
                Instant::now() < deadline,
                "prometheus not ready within {DEADLINE:?}: {}",
                p.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        Ok(p)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("prometheus.log")).unwrap_or_default()
    }

    /// `GET path` (already URL-encoded): the status code and the body.
    fn get(&self, path: &str) -> Result<(u16, String)> {
        let mut s = TcpStream::connect(("127.0.0.1", self.port))?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
        )?;
        let mut reply = String::new();
        s.read_to_string(&mut reply)?;
        let code = reply
            .split(' ')
            .nth(1)
            .and_then(|c| c.parse().ok())
            .context("no HTTP status")?;
        let body = reply
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_string())
            .unwrap_or_default();
        Ok((code, body))
    }

    /// The instant query `promql`: each result's (labels, value).
    fn query(&self, promql: &str) -> Result<Vec<(Value, f64)>> {
        let (code, body) = self.get(&format!("/api/v1/query?query={}", encode(promql)))?;
        let body = dechunk(&body);
        ensure!(code == 200, "query {promql}: HTTP {code}: {body}");
        let v: Value = serde_json::from_str(&body).with_context(|| format!("{promql}: {body}"))?;
        ensure!(v["status"] == "success", "query {promql}: {v}");
        v["data"]["result"]
            .as_array()
            .context("no result")?
            .iter()
            .map(|r| {
                let value = r["value"][1]
                    .as_str()
                    .and_then(|s| s.parse().ok())
                    .with_context(|| format!("a value in {r}"))?;
                Ok((r["metric"].clone(), value))
            })
            .collect()
    }

    /// The one value of `promql`.
    fn value(&self, promql: &str) -> Result<f64> {
        match self.query(promql)?.as_slice() {
            [(_, v)] => Ok(*v),
            other => bail!("{promql}: {} results: {other:?}", other.len()),
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline && matches!(self.child.try_wait(), Ok(None)) {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(keep) = std::env::var_os("KP_PROMETHEUS_KEEP") {
            // `cp`, not a rename: the scratch directory may be on another
            // file system.
            let copied = Command::new("cp")
                .arg("-a")
                .arg(&self.dir)
                .arg(&keep)
                .status();
            if !copied.is_ok_and(|s| s.success()) {
                eprintln!(
                    "cannot keep {} in {}",
                    self.dir.display(),
                    keep.to_string_lossy()
                );
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Percent-encodes a query parameter.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A chunked HTTP/1.1 body made whole (Prometheus chunks its replies).
fn dechunk(body: &str) -> String {
    if body.trim_start().starts_with('{') {
        return body.to_string();
    }
    let mut out = String::new();
    let mut rest = body;
    while let Some((size, after)) = rest.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || after.len() < n {
            break;
        }
        out.push_str(&after[..n]);
        rest = after[n..].trim_start_matches("\r\n");
    }
    out
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

#[test]
fn prometheus_scrapes_what_the_client_counted() -> Result<()> {
    let requests = env_number("KP_PROMETHEUS_REQUESTS", REQUESTS)?;
    let concurrency = env_number("KP_PROMETHEUS_CONCURRENCY", CONCURRENCY)?;
    ensure!(
        (1..=32).contains(&concurrency),
        "concurrency {concurrency}: 1 to 32 (the IF's largest batch)"
    );
    let model = repo_root().join("models/squeezenet/config.toml");
    ensure!(
        model.exists(),
        "{} is missing: run `make models`",
        model.display()
    );
    let net = NetnsPair::up(&format!("kpm{}", std::process::id() % 100_000))?;
    let dir = Scratch::new("prometheus");
    let prefix = file_prefix("prometheus");
    let metrics_port = free_port()?;
    let config = dir.path("platform.toml");
    write_config(
        &config,
        &net,
        &prefix,
        &[(1, "squeezenet")],
        &format!("metrics_listen = \"127.0.0.1:{metrics_port}\""),
    )?;
    let runtime = dir.path("run");
    let endpoint = format!("ipc://{}", runtime.join("orchestrator.sock").display());
    let _orch = Orchestrator::start(&config, &runtime)?;
    wait_for(&endpoint, "if 1 active", |s| all_active(s, 1))?;
    let prom = Prometheus::start(dir.path("prometheus"), &format!("127.0.0.1:{metrics_port}"))?;

    let client = kp_client_closed_loop(
        Command::new("ip")
            .args(["netns", "exec", net.get("CLIENT_NS")])
            .arg(bin("kp-client")),
        &format!("{}:9000", net.get("PLATFORM_IP")),
        1,
        requests.into(),
        &[
            "--timeout",
            "5s",
            "--concurrency",
            &concurrency.to_string(),
            "--input",
            "synthetic",
        ],
    )?;
    let ok = client["status"]["ok"].as_u64().context("status.ok")? as f64;
    ensure!(client["answered"] == requests, "kp-client: {client}");
    let datagrams = client["datagrams_sent"]
        .as_u64()
        .context("datagrams_sent")? as f64;
    let traffic_done = unix_now();

    // A scrape that took place after the IF published its numbers of the
    // whole traffic: the IF publishes every second, Prometheus scrapes
    // every second; 3 s after the last answer both have happened.
    let series = r#"kneepoint_if_requests_total{job="kneepoint",if_id="1",model="squeezenet",role="active",status="ok"}"#;
    let deadline = Instant::now() + DEADLINE;
    loop {
        let scraped_at = prom
            .query(&format!("timestamp({series})"))?
            .first()
            .map_or(0.0, |(_, t)| *t);
        if scraped_at > traffic_done + 3.0 {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "no scrape after the traffic within {DEADLINE:?} (last at {scraped_at}, traffic done at {traffic_done}): {}",
            prom.log()
        );
        std::thread::sleep(Duration::from_millis(250));
    }

    assert_eq!(
        prom.value(series)?,
        ok,
        "OK answers: Prometheus against kp-client {client}"
    );
    assert_eq!(
        prom.value(r#"kneepoint_if_request_latency_seconds_count{if_id="1",role="active"}"#)?,
        ok,
        "one latency observation per OK answer"
    );
    assert_eq!(
        prom.value(r#"sum(kneepoint_if_requests_total{if_id="1"})"#)?,
        f64::from(requests),
        "every answer of every status"
    );
    assert_eq!(
        prom.value(
            r#"kneepoint_if_request_latency_seconds_bucket{if_id="1",role="active",le="+Inf"}"#
        )?,
        ok
    );
    assert_eq!(prom.value(r#"kneepoint_if_slo_seconds{if_id="1"}"#)?, 2.0);
    assert_eq!(
        prom.value(r#"kneepoint_if_share_ratio{if_id="1",enforcement="cpu_cores"}"#)?,
        0.5
    );
    assert_eq!(
        prom.value(r#"kneepoint_if_state{if_id="1",state="active"}"#)?,
        1.0
    );
    assert_eq!(prom.value("kneepoint_if_manager_up")?, 1.0);
    assert_eq!(prom.value("kneepoint_platform_restarts_total")?, 0.0);
    // Every frame of every request reached the IF's ring: each request
    // is at least one fragment.
    let delivered = prom.value(r#"kneepoint_if_manager_packets_total{outcome="delivered"}"#)?;
    assert!(
        delivered >= f64::from(requests),
        "delivered {delivered} frames for {requests} requests"
    );
    assert_eq!(
        prom.value(r#"kneepoint_if_manager_packets_total{outcome="malformed"}"#)?,
        0.0
    );

    // The port's own counters. Nothing but kp-client talks on this veth:
    // netns.sh disables IPv6 on both ends (no router solicitations, no
    // DAD) and gives the client a permanent neighbour entry (no ARP), and
    // every request is answered while kp-client's socket is open (no ICMP
    // port-unreachable comes back). So the port received exactly the
    // datagrams kp-client sent, and the if-manager took each off its RX
    // queue. Should a kernel ever add a frame, it shows in the not_for_us
    // reasons this prints.
    let reasons = prom.query("kneepoint_if_manager_packet_reasons_total > 0")?;
    assert_eq!(
        prom.value("kneepoint_port_receive_packets_total")?,
        datagrams,
        "port ipackets against kp-client's datagrams; frames not for us: {reasons:?}"
    );
    assert_eq!(
        prom.value("kneepoint_port_receive_packets_total")?,
        prom.value("kneepoint_if_manager_rx_packets_total")?,
        "every frame the port received was taken off the RX queue"
    );
    for lost in [
        "kneepoint_port_receive_missed_total",
        "kneepoint_port_receive_errors_total",
        "kneepoint_port_receive_nombuf_total",
    ] {
        assert_eq!(prom.value(lost)?, 0.0, "{lost}");
    }
    // net_af_packet counts each frame tx_burst took as sent or as an error.
    assert_eq!(
        prom.value("kneepoint_port_transmit_packets_total + kneepoint_port_transmit_errors_total")?,
        prom.value(r#"kneepoint_if_manager_tx_frames_total{result="sent"}"#)?,
        "frames the port took"
    );

    // Batch sizes: the histogram counts every batch, and its sum is every
    // request batched; each batched request was answered OK or INTERNAL (a
    // failed batch), and nothing else answers those here (no fail-over).
    // kp-client keeps `concurrency` requests in flight, so no batch is
    // larger: all are in the bucket of the first bound (a power of two, up
    // to the IF's largest batch, 32) at or above it.
    let active = r#"if_id="1",model="squeezenet",role="active""#;
    let bound = concurrency.next_power_of_two();
    let batches = prom.value(&format!("kneepoint_if_batches_total{{{active}}}"))?;
    assert!(batches >= 1.0, "{batches} batches");
    assert_eq!(
        prom.value(&format!("kneepoint_if_batch_size_count{{{active}}}"))?,
        batches
    );
    let batched = prom.value(&format!("kneepoint_if_batched_requests_total{{{active}}}"))?;
    assert_eq!(
        prom.value(&format!("kneepoint_if_batch_size_sum{{{active}}}"))?,
        batched
    );
    assert_eq!(
        batched,
        prom.value(&format!(
            r#"sum(kneepoint_if_requests_total{{{active},status=~"ok|internal"}})"#
        ))?,
        "batched requests against OK and INTERNAL answers"
    );
    assert_eq!(
        prom.value(&format!(
            r#"kneepoint_if_batch_size_bucket{{{active},le=~"{bound}(\\.0)?"}}"#
        ))?,
        batches,
        "batches of at most {concurrency} requests"
    );
    assert_eq!(
        prom.value(&format!(
            r#"kneepoint_if_batch_size_bucket{{{active},le="+Inf"}}"#
        ))?,
        batches
    );
    Ok(())
}
