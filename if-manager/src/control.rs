//! Registration of inference functions and stats, over ZeroMQ.
//!
//! The if-manager serves a REP socket (`--control ENDPOINT`). Each request
//! is one JSON object with a `cmd` field; each gets exactly one JSON reply,
//! `{"ok": true, ...}` or `{"ok": false, "error": {"code": "...",
//! "message": "..."}}` (the one error shape of `kp_schema::messages`, whose
//! `IfManagerCommand` these commands are). A malformed or impossible
//! command changes nothing.
//!
//! | command | fields | effect / reply |
//! |---|---|---|
//! | `register` | `if_id`, optional `ring_size` (power of two) | creates ring `kp_if_<id>` and routes `if_id` to it; replies the ring, TX ring and mempool names |
//! | `unregister` | `if_id` | stops routing, drains and frees the ring; replies how many fragments were still queued |
//! | `ready` | `if_id` | the IF is attached to its ring and can serve; counts towards `--await-ifs` (once: said again while live, by the successor of a process killed before its `goodbye`, it is a no-op) |
//! | `goodbye` | `if_id` | the IF has sent its last answer and is leaving (it stops counting as live for `--exit-when-idle`) |
//! | `routes` | | the registered IFs and their counters |
//! | `stats` | | all counters, as in the final report; the port's (`port`) as the data-plane lcore last read them, at most [`crate::port_stats::PORT_STATS_EVERY`] old |
//! | `shutdown` | | stops the if-manager as SIGTERM does |
//!
//! Parsing ([`Command::parse`]) is separate from acting ([`Registry`]), so
//! the protocol is tested without a socket or DPDK.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dpdk::{Ring, RingFlags, SocketId};
use kp_schema::messages::{codes, ErrorBody};
use kp_wire::IfId;
use libml::runtime::handover::IfControl;
use serde_json::{json, Value};

use crate::config::names;
use crate::outcome::Counters;
use crate::routes::{IfCounters, Route, RouteUpdate};

pub use kp_schema::messages::IfManagerCommand as Command;

/// The registered inference functions, as the control side knows them.
#[derive(Debug)]
pub struct Registry {
    updates: Sender<RouteUpdate<Ring>>,
    socket: SocketId,
    default_ring_size: u32,
    ifs: BTreeMap<IfId, RegisteredIf>,
    gate: Arc<Gate>,
}

#[derive(Debug)]
struct RegisteredIf {
    /// Where its IFs agree on who dequeues (freed with the entry).
    _control: Arc<IfControl>,
    ring_name: String,
    ring_size: u32,
    counters: Arc<IfCounters>,
    ready: bool,
    gone: bool,
}

/// What the control side tells the RX loop about the IFs' lifecycle.
#[derive(Debug, Default)]
pub struct Gate {
    /// RX is polled only once this is set (at once without `--await-ifs`).
    pub rx_open: AtomicBool,
    /// IFs that said `ready` and not yet `goodbye`: the RX loop does not
    /// exit when idle while any is live (it may be computing a long batch).
    pub live_ifs: AtomicUsize,
    /// `ready` IFs needed to open RX.
    pub await_ifs: usize,
}

impl Gate {
    /// A gate that opens after `await_ifs` IFs are ready (0: open now).
    pub fn new(await_ifs: usize) -> Self {
        Gate {
            rx_open: AtomicBool::new(await_ifs == 0),
            live_ifs: AtomicUsize::new(0),
            await_ifs,
        }
    }
}

/// How long an unregister waits for the RX lcore to let go of a ring. The
/// RX loop applies updates at least every ~500 µs, even when idle.
const UNREGISTER_WAIT: Duration = Duration::from_secs(2);

impl Registry {
    /// A registry that sends route changes to the RX lcore over `updates`.
    pub fn new(
        updates: Sender<RouteUpdate<Ring>>,
        socket: SocketId,
        default_ring_size: u32,
        gate: Arc<Gate>,
    ) -> Self {
        Registry {
            updates,
            socket,
            default_ring_size,
            ifs: BTreeMap::new(),
            gate,
        }
    }

    /// Marks `if_id` ready; opens RX once `--await-ifs` IFs are.
    pub fn ready(&mut self, if_id: IfId) -> Result<Value, ErrorBody> {
        let r = self
            .ifs
            .get_mut(&if_id)
            .ok_or_else(|| not_registered(if_id))?;
        // Already live: the process that said `ready` was killed before its
        // `goodbye`, and this is its successor (a replacement active). It
        // counts once, as before; refusing it would leave the IF with no
        // process able to start (each replacement exiting on the refusal).
        if !r.ready || r.gone {
            r.ready = true;
            r.gone = false;
            self.gate.live_ifs.fetch_add(1, Ordering::Relaxed);
        }
        let ready = self.ifs.values().filter(|r| r.ready).count();
        if ready >= self.gate.await_ifs {
            self.gate.rx_open.store(true, Ordering::Release);
        }
        Ok(
            json!({ "ok": true, "if_id": if_id.0, "rx_open": self.gate.rx_open.load(Ordering::Relaxed) }),
        )
    }

    /// Marks `if_id` as gone (its last answer is on the TX ring).
    pub fn goodbye(&mut self, if_id: IfId) -> Result<Value, ErrorBody> {
        let r = self
            .ifs
            .get_mut(&if_id)
            .ok_or_else(|| not_registered(if_id))?;
        if !r.ready || r.gone {
            return Err(ErrorBody::new(
                codes::NOT_LIVE,
                format!("{if_id} is not live"),
            ));
        }
        r.gone = true;
        self.gate.live_ifs.fetch_sub(1, Ordering::Relaxed);
        Ok(json!({ "ok": true, "if_id": if_id.0 }))
    }

    /// Creates `if_id`'s ring and routes fragments to it.
    pub fn register(&mut self, if_id: IfId, ring_size: Option<u32>) -> Result<Value, ErrorBody> {
        if self.ifs.contains_key(&if_id) {
            return Err(ErrorBody::new(
                codes::ALREADY_REGISTERED,
                format!("{if_id} is already registered"),
            ));
        }
        let size = ring_size.unwrap_or(self.default_ring_size);
        if size < 2 || !size.is_power_of_two() {
            return Err(ErrorBody::new(
                codes::INVALID_VALUE,
                format!("ring_size {size} is not a power of two >= 2"),
            ));
        }
        let name = names::if_ring(if_id);
        // Single producer (the RX lcore), single consumer (the active IF;
        // its shadow waits its turn through the control block).
        let flags = RingFlags {
            single_producer: true,
            single_consumer: true,
        };
        let control = Arc::new(
            IfControl::create(if_id, self.socket)
                .map_err(|e| failed(format!("cannot create {if_id}'s control block: {e}")))?,
        );
        let ring = Ring::create(&name, size, self.socket, flags)
            .map_err(|e| failed(format!("cannot create ring {name}: {e}")))?;
        let counters = Arc::new(IfCounters::default());
        self.updates
            .send(RouteUpdate::Add(
                if_id,
                Route {
                    ring,
                    counters: counters.clone(),
                    control: Some(control.clone()),
                },
            ))
            .map_err(|_| failed("the RX loop has stopped"))?;
        self.ifs.insert(
            if_id,
            RegisteredIf {
                _control: control,
                ring_name: name.clone(),
                ring_size: size,
                counters,
                ready: false,
                gone: false,
            },
        );
        Ok(json!({
            "ok": true,
            "if_id": if_id.0,
            "ring": name,
            "ring_size": size,
            "tx_ring": names::TX_RING,
            "mempool": names::MEMPOOL,
        }))
    }

    /// Stops routing `if_id`, then drains and frees its ring.
    pub fn unregister(&mut self, if_id: IfId) -> Result<Value, ErrorBody> {
        if !self.ifs.contains_key(&if_id) {
            return Err(not_registered(if_id));
        }
        let (back_tx, back_rx) = channel();
        self.updates
            .send(RouteUpdate::Remove(if_id, back_tx))
            .map_err(|_| failed("the RX loop has stopped"))?;
        let route = back_rx.recv_timeout(UNREGISTER_WAIT).map_err(|_| {
            failed(format!(
                "the RX loop did not release {if_id}'s ring in time"
            ))
        })?;
        if let Some(r) = self.ifs.remove(&if_id) {
            if r.ready && !r.gone {
                self.gate.live_ifs.fetch_sub(1, Ordering::Relaxed);
            }
        }
        let drained = route.map_or(0, |r| r.ring.free_queued());
        Ok(json!({ "ok": true, "if_id": if_id.0, "drained": drained }))
    }

    /// The registered IFs and their counters.
    pub fn routes_json(&self) -> Value {
        let ifs: Vec<Value> = self
            .ifs
            .iter()
            .map(|(id, r)| {
                json!({
                    "if_id": id.0,
                    "ring": r.ring_name,
                    "ring_size": r.ring_size,
                    "delivered": r.counters.delivered.load(Ordering::Relaxed),
                    "shed": r.counters.shed.load(Ordering::Relaxed),
                    "shed_suppressed": r.counters.shed_suppressed.load(Ordering::Relaxed),
                    "ring_full": r.counters.ring_full.load(Ordering::Relaxed),
                    "ready": r.ready && !r.gone,
                })
            })
            .collect();
        Value::Array(ifs)
    }

    /// Acts on one command. `Stats` and `Shutdown` need the caller's state,
    /// so they are handled in [`serve`].
    pub fn handle(&mut self, cmd: &Command) -> Value {
        let result = match *cmd {
            Command::Register { if_id, ring_size } => self.register(IfId(if_id), ring_size),
            Command::Unregister { if_id } => self.unregister(IfId(if_id)),
            Command::Ready { if_id } => self.ready(IfId(if_id)),
            Command::Goodbye { if_id } => self.goodbye(IfId(if_id)),
            Command::Routes => Ok(json!({ "ok": true, "ifs": self.routes_json() })),
            Command::Stats | Command::Shutdown => Ok(json!({ "ok": true })),
        };
        result.unwrap_or_else(|e| e.reply())
    }
}

fn not_registered(if_id: IfId) -> ErrorBody {
    ErrorBody::new(codes::NOT_REGISTERED, format!("{if_id} is not registered"))
}

fn failed(why: impl std::fmt::Display) -> ErrorBody {
    ErrorBody::new(codes::FAILED, why)
}

/// Serves the control socket until `stop` is set. Runs on its own thread.
pub fn serve(
    endpoint: &str,
    registry: Arc<Mutex<Registry>>,
    counters: Arc<Counters>,
    stop: Arc<AtomicBool>,
) -> Result<(), String> {
    let ctx = zmq::Context::new();
    let sock = ctx.socket(zmq::REP).map_err(|e| e.to_string())?;
    sock.set_rcvtimeo(100).map_err(|e| e.to_string())?;
    sock.set_linger(0).map_err(|e| e.to_string())?;
    if let Some(path) = endpoint.strip_prefix("ipc://") {
        if let Some(dir) = std::path::Path::new(path).parent() {
            std::fs::create_dir_all(dir)
                .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        }
    }
    sock.bind(endpoint)
        .map_err(|e| format!("cannot bind control socket {endpoint}: {e}"))?;
    while !stop.load(Ordering::Relaxed) {
        let msg = match sock.recv_bytes(0) {
            Ok(m) => m,
            Err(zmq::Error::EAGAIN) => continue,
            Err(e) => return Err(format!("control socket: {e}")),
        };
        let reply = match Command::parse(&msg) {
            Err(e) => e.reply(),
            Ok(cmd) => {
                let mut reg = registry.lock().unwrap_or_else(|p| p.into_inner());
                match cmd {
                    Command::Stats => {
                        let mut s = counters.to_json();
                        s["ifs"] = reg.routes_json();
                        json!({ "ok": true, "stats": s })
                    }
                    Command::Shutdown => {
                        stop.store(true, Ordering::Relaxed);
                        json!({ "ok": true })
                    }
                    other => reg.handle(&other),
                }
            }
        };
        sock.send(reply.to_string().as_bytes(), 0)
            .map_err(|e| format!("control socket: {e}"))?;
    }
    if let Some(path) = endpoint.strip_prefix("ipc://") {
        let _ = std::fs::remove_file(path);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_command() {
        assert_eq!(
            Command::parse(br#"{"cmd":"register","if_id":3}"#),
            Ok(Command::Register {
                if_id: 3,
                ring_size: None
            })
        );
        assert_eq!(
            Command::parse(br#"{"cmd":"register","if_id":3,"ring_size":1024}"#),
            Ok(Command::Register {
                if_id: 3,
                ring_size: Some(1024)
            })
        );
        assert_eq!(
            Command::parse(br#"{"cmd":"unregister","if_id":65535}"#),
            Ok(Command::Unregister { if_id: 65535 })
        );
        assert_eq!(
            Command::parse(br#"{"cmd":"ready","if_id":2}"#),
            Ok(Command::Ready { if_id: 2 })
        );
        assert_eq!(
            Command::parse(br#"{"cmd":"goodbye","if_id":2}"#),
            Ok(Command::Goodbye { if_id: 2 })
        );
        assert_eq!(Command::parse(br#"{"cmd":"routes"}"#), Ok(Command::Routes));
        assert_eq!(Command::parse(br#"{"cmd":"stats"}"#), Ok(Command::Stats));
        assert_eq!(
            Command::parse(br#"{"cmd":"shutdown"}"#),
            Ok(Command::Shutdown)
        );
    }

    #[test]
    fn malformed_commands_are_refused_with_a_reason() {
        for (bad, code) in [
            (&b"not json"[..], codes::MALFORMED),
            (br#"{"cmd":"launch"}"#, codes::UNKNOWN_COMMAND),
            (br#"{"cmd":"register"}"#, codes::MALFORMED),
            (br#"{"cmd":"register","if_id":70000}"#, codes::MALFORMED),
            (br#"{"cmd":"register","if_id":-1}"#, codes::MALFORMED),
            (
                br#"{"cmd":"register","if_id":1,"extra":true}"#,
                codes::MALFORMED,
            ),
            (br#"[1,2]"#, codes::MALFORMED),
            (b"", codes::MALFORMED),
        ] {
            let err = Command::parse(bad).unwrap_err();
            assert_eq!(err.code, code, "{}: {err}", String::from_utf8_lossy(bad));
            assert!(!err.message.is_empty());
            let reply = err.reply();
            assert_eq!(reply["ok"], false);
            assert_eq!(reply["error"]["code"], code);
        }
    }
}
