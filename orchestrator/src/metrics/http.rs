//! The `/metrics` endpoint: `GET /metrics` answers the exposition of the
//! shared [`PlatformMetrics`]; anything else gets 404 (405 for another
//! method).
//!
//! A `tiny_http` server: blocking, with its own accept thread, served here
//! by one thread of the orchestrator's. It fits the orchestrator, which is
//! a loop on one thread with no async runtime: a scrape is one short
//! request every few seconds, and a runtime (tokio under hyper) would be a
//! second threading model in the process for it. The daemon's loop never
//! waits on a scrape: it only takes the lock to add a telemetry message,
//! and the endpoint holds it only to copy the numbers out.
//!
//! At each scrape the endpoint also asks the if-manager for its counters
//! (its `stats` command, at most [`IF_MANAGER_TIMEOUT`]): they are exactly
//! as fresh as the scrape, and the daemon's loop never waits on it.

use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use kp_schema::messages::{IfManagerCommand, IfManagerCounters};

use super::{exposition, PlatformMetrics};

/// How long a scrape waits for the if-manager's counters. Prometheus's
/// default scrape timeout is 10 s; an if-manager that takes longer than
/// this is reported down (`kneepoint_if_manager_up 0`) rather than making
/// the scrape time out.
pub const IF_MANAGER_TIMEOUT: Duration = Duration::from_millis(500);

/// How often the serving thread looks at its stop flag.
const POLL: Duration = Duration::from_millis(100);

/// Why the endpoint could not start.
#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    /// The address is not loopback and remote metrics are not allowed.
    #[error("metrics_listen = {addr}: not a loopback address; set platform.allow_remote_metrics = true to serve it beyond this machine")]
    NotLoopback {
        /// The address.
        addr: SocketAddr,
    },
    /// Another process has the port.
    #[error("cannot serve metrics on {addr}: the port is taken by another process (choose another platform.metrics_listen, or platform.metrics = false)")]
    PortTaken {
        /// The address.
        addr: SocketAddr,
    },
    /// Binding failed otherwise.
    #[error("cannot serve metrics on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The HTTP server could not start on the bound socket.
    #[error("cannot serve metrics on {addr}: {reason}")]
    Server {
        /// The address.
        addr: SocketAddr,
        /// Why.
        reason: String,
    },
}

/// The running endpoint; dropping it stops its thread.
#[derive(Debug)]
pub struct MetricsEndpoint {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl MetricsEndpoint {
    /// Binds `addr` and serves `metrics` from a thread; `if_manager` is
    /// the if-manager's control endpoint.
    pub fn start(
        addr: SocketAddr,
        allow_remote: bool,
        metrics: Arc<Mutex<PlatformMetrics>>,
        if_manager: String,
    ) -> Result<MetricsEndpoint, EndpointError> {
        if !allow_remote && !addr.ip().is_loopback() {
            return Err(EndpointError::NotLoopback { addr });
        }
        let listener = TcpListener::bind(addr).map_err(|source| {
            if source.kind() == std::io::ErrorKind::AddrInUse {
                EndpointError::PortTaken { addr }
            } else {
                EndpointError::Bind { addr, source }
            }
        })?;
        let bound = listener
            .local_addr()
            .map_err(|source| EndpointError::Bind { addr, source })?;
        let server = tiny_http::Server::from_listener(listener, None).map_err(|e| {
            EndpointError::Server {
                addr,
                reason: e.to_string(),
            }
        })?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("metrics".into())
            .spawn(move || serve(&server, &metrics, &if_manager, &flag))
            .map_err(|e| EndpointError::Server {
                addr,
                reason: e.to_string(),
            })?;
        Ok(MetricsEndpoint {
            addr: bound,
            stop,
            thread: Some(thread),
        })
    }

    /// The address it serves on (the port the system chose for port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MetricsEndpoint {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn serve(
    server: &tiny_http::Server,
    metrics: &Mutex<PlatformMetrics>,
    if_manager: &str,
    stop: &AtomicBool,
) {
    while !stop.load(Ordering::Relaxed) {
        let request = match server.recv_timeout(POLL) {
            Ok(Some(r)) => r,
            Ok(None) => continue,
            Err(e) => {
                tracing::warn!("orchestrator: metrics endpoint: {e}");
                std::thread::sleep(POLL);
                continue;
            }
        };
        let path = request.url().split('?').next().unwrap_or("");
        let (code, body, content_type) = match (request.method(), path) {
            (tiny_http::Method::Get, "/metrics") => match scrape(metrics, if_manager) {
                Ok(text) => (200, text, exposition::CONTENT_TYPE),
                Err(e) => (500, format!("encoding failed: {e}\n"), "text/plain"),
            },
            (tiny_http::Method::Get, _) => (
                404,
                "kneepoint: the metrics are at /metrics\n".to_string(),
                "text/plain",
            ),
            _ => (405, "GET /metrics only\n".to_string(), "text/plain"),
        };
        let mut response = tiny_http::Response::from_string(body).with_status_code(code);
        if let Ok(h) = tiny_http::Header::from_bytes(&b"Content-Type"[..], content_type.as_bytes())
        {
            response = response.with_header(h);
        }
        // A scraper that went away: nothing to tell it.
        let _ = request.respond(response);
    }
}

/// One scrape: the if-manager's counters, then the exposition of
/// everything.
fn scrape(metrics: &Mutex<PlatformMetrics>, if_manager: &str) -> Result<String, std::fmt::Error> {
    let pid = lock(metrics).platform.if_manager_pid;
    let counters = pid.map(|pid| (pid, if_manager_counters(if_manager)));
    let snapshot = {
        let mut m = lock(metrics);
        match counters {
            Some((pid, Ok(c))) => {
                m.on_if_manager(pid, c);
                m.if_manager_answered = true;
            }
            Some((_, Err(e))) => {
                if m.if_manager_unreachable == 0 {
                    tracing::warn!("orchestrator: metrics: the if-manager's counters: {e}");
                }
                m.if_manager_unreachable += 1;
                m.if_manager_answered = false;
            }
            None => m.if_manager_answered = false,
        }
        m.clone()
    };
    exposition::encode(&snapshot)
}

fn lock(m: &Mutex<PlatformMetrics>) -> std::sync::MutexGuard<'_, PlatformMetrics> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn if_manager_counters(endpoint: &str) -> Result<IfManagerCounters, String> {
    let reply = crate::process::request(endpoint, &IfManagerCommand::Stats, IF_MANAGER_TIMEOUT)?;
    serde_json::from_value(reply["stats"].clone())
        .map_err(|e| format!("a stats reply of another shape ({e})"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    fn get(addr: SocketAddr, request: &str) -> String {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.write_all(request.as_bytes()).unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }

    #[test]
    fn serves_the_exposition_and_says_so_when_the_port_is_taken() {
        let metrics = Arc::new(Mutex::new(PlatformMetrics::default()));
        let lo: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let e = MetricsEndpoint::start(lo, false, metrics.clone(), "ipc:///nonexistent".into())
            .unwrap();
        let reply = get(
            e.addr(),
            "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        );
        assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
        assert!(
            reply.contains("Content-Type: text/plain; version=0.0.4"),
            "{reply}"
        );
        assert!(
            reply.contains("\nkneepoint_platform_restarts_total 0\n"),
            "{reply}"
        );
        let reply = get(e.addr(), "GET / HTTP/1.1\r\nConnection: close\r\n\r\n");
        assert!(reply.starts_with("HTTP/1.1 404"), "{reply}");

        let taken =
            MetricsEndpoint::start(e.addr(), false, metrics.clone(), String::new()).unwrap_err();
        assert!(matches!(taken, EndpointError::PortTaken { .. }), "{taken}");
        assert!(taken.to_string().contains("taken"), "{taken}");
        let remote: SocketAddr = "0.0.0.0:0".parse().unwrap();
        let refused = MetricsEndpoint::start(remote, false, metrics, String::new()).unwrap_err();
        assert!(
            matches!(refused, EndpointError::NotLoopback { .. }),
            "{refused}"
        );
    }
}
