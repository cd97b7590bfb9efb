//! The typed messages kneepoint's processes exchange over ZeroMQ, in one
//! place: what the if-manager, each kp-if and the orchestrator send each
//! other, as serde types both sides compile against.
//!
//! - Control (REQ/REP, one JSON object each way): a request has a `cmd`;
//!   the reply is `{"ok": true, ...}` or, for every process alike,
//!   `{"ok": false, "error": {"code": "...", "message": "..."}}`
//!   ([`ErrorBody`]): a machine-readable code and a sentence for people.
//!   The if-manager's commands are [`IfManagerCommand`]; an IF's are
//!   [`IfCommand`], answered with [`IfStatus`]. (The orchestrator's own
//!   protocol, which `kpctl` speaks, is `orchestrator::control` and
//!   docs/CONTROL.md; its errors have the same shape, with its own codes.)
//! - Telemetry (PUB/SUB, IF → orchestrator): [`IfMessage`], defined with
//!   the statistics in [`crate::telemetry`] and re-exported here.
//! - Readiness (a pipe, child → orchestrator, not ZeroMQ): [`Readiness`],
//!   one JSON line the if-manager or a kp-if writes on the descriptor it
//!   was given (`--notify-fd N`) once it serves, or, a shadow, once it is
//!   parked and can take over. Like s6's readiness fd: the orchestrator
//!   learns it from a typed message, not from the wording of a log line.
//!
//! A message that does not parse is an error the receiver reports and
//! counts, never a default read in its place.

use std::collections::BTreeMap;
use std::fmt;
use std::io::Write;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

pub use crate::telemetry::{IfMessage, LatencySummary, Publication, TelemetrySnapshot};

/// Why a control command was refused: the `error` of every `"ok": false`
/// reply.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{message} ({code})")]
pub struct ErrorBody {
    /// Machine-readable: one of [`codes`] (or of the orchestrator's codes).
    pub code: String,
    /// For people.
    pub message: String,
}

impl ErrorBody {
    /// An error with `code` and `message`.
    pub fn new(code: &str, message: impl fmt::Display) -> ErrorBody {
        ErrorBody {
            code: code.to_string(),
            message: message.to_string(),
        }
    }

    /// The whole reply: `{"ok": false, "error": {code, message}}`.
    pub fn reply(&self) -> Value {
        json!({ "ok": false, "error": self })
    }

    /// The error of a reply whose `ok` is not `true`; `None` for a
    /// successful one. A refusal whose `error` is not of this shape comes
    /// back as code [`codes::MALFORMED`], with the reply as the message.
    pub fn of_reply(reply: &Value) -> Option<ErrorBody> {
        if reply["ok"] == true {
            return None;
        }
        Some(
            serde_json::from_value(reply["error"].clone()).unwrap_or_else(|_| {
                ErrorBody::new(
                    codes::MALFORMED,
                    format!("a refusal of no known shape: {reply}"),
                )
            }),
        )
    }
}

/// The error codes of the if-manager's and the IFs' control sockets.
pub mod codes {
    /// Not JSON, not an object, a missing or unknown field, a wrong type.
    pub const MALFORMED: &str = "malformed";
    /// `cmd` names no command of this process.
    pub const UNKNOWN_COMMAND: &str = "unknown_command";
    /// `register` of an if_id that has a ring already.
    pub const ALREADY_REGISTERED: &str = "already_registered";
    /// A command for an if_id that has no ring.
    pub const NOT_REGISTERED: &str = "not_registered";
    /// `goodbye` of an IF that is not live.
    pub const NOT_LIVE: &str = "not_live";
    /// A value out of its range (a ring size that is not a power of two).
    pub const INVALID_VALUE: &str = "invalid_value";
    /// An IF asked to `activate` or `yield` in a mode it cannot from.
    pub const WRONG_MODE: &str = "wrong_mode";
    /// The command was valid but carrying it out failed (e.g. DPDK could
    /// not create the ring); nothing changed.
    pub const FAILED: &str = "failed";
}

/// A command to the if-manager's control socket (`--control`).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "cmd", rename_all = "snake_case", deny_unknown_fields)]
pub enum IfManagerCommand {
    /// Route `if_id` to a new ring.
    Register {
        /// The inference function's id.
        if_id: u16,
        /// Ring size (power of two); the if-manager's default if absent.
        ring_size: Option<u32>,
    },
    /// Stop routing `if_id` and free its ring.
    Unregister {
        /// The inference function's id.
        if_id: u16,
    },
    /// The IF is attached and serving.
    Ready {
        /// The inference function's id.
        if_id: u16,
    },
    /// The IF has sent its last answer and is leaving.
    Goodbye {
        /// The inference function's id.
        if_id: u16,
    },
    /// List registered IFs.
    Routes,
    /// All counters.
    Stats,
    /// Stop the if-manager.
    Shutdown,
}

impl IfManagerCommand {
    /// Parses one request; the error says what is wrong with it.
    pub fn parse(bytes: &[u8]) -> Result<IfManagerCommand, ErrorBody> {
        parse_command(
            bytes,
            "register, unregister, ready, goodbye, routes, stats, shutdown",
        )
    }
}

/// The if-manager's packet counters since it started: the `stats` of its
/// reply to [`IfManagerCommand::Stats`] (which also lists its routes, not
/// read here). Every outcome and reason is present, zeros included.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IfManagerCounters {
    /// Frames taken off the RX queue.
    pub rx_packets: u64,
    /// Frames by outcome (`delivered`, `unknown_if_answered`, `shed`,
    /// `ring_full`, `not_for_us`, `malformed`, ...).
    pub outcomes: BTreeMap<String, u64>,
    /// `not_for_us` frames by reason.
    pub not_for_us: BTreeMap<String, u64>,
    /// `malformed` frames by reason.
    pub malformed: BTreeMap<String, u64>,
    /// The transmit side.
    pub tx: TxCounters,
    /// Answered-request entries evicted before their time-to-live ran out.
    pub answered_evictions: u64,
    /// Shed notices freed without reaching their IF.
    pub notices_dropped: u64,
    /// The port's own counters, as the data-plane lcore last read them.
    pub port: PortCounters,
}

/// The NIC's counters (DPDK's `struct rte_eth_stats`, totals): what the
/// driver saw, before the if-manager's classification. The if-manager's
/// data-plane lcore reads them every 100 ms (and once more as it stops),
/// so in a `stats` reply they are at most that old.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortCounters {
    /// Frames received (handed to the RX queue).
    pub ipackets: u64,
    /// Frames sent.
    pub opackets: u64,
    /// Bytes received.
    pub ibytes: u64,
    /// Bytes sent.
    pub obytes: u64,
    /// Frames the NIC dropped because the RX queue was full (0 from a
    /// driver that does not count them, e.g. DPDK 22.11's `net_af_packet`).
    pub imissed: u64,
    /// Erroneous frames received.
    pub ierrors: u64,
    /// Failed transmissions.
    pub oerrors: u64,
    /// RX mbuf allocation failures (the mempool ran dry).
    pub rx_nombuf: u64,
}

impl PortCounters {
    /// `self - earlier`, or `None` if any counter went down.
    pub fn increase_over(&self, earlier: &PortCounters) -> Option<PortCounters> {
        Some(PortCounters {
            ipackets: self.ipackets.checked_sub(earlier.ipackets)?,
            opackets: self.opackets.checked_sub(earlier.opackets)?,
            ibytes: self.ibytes.checked_sub(earlier.ibytes)?,
            obytes: self.obytes.checked_sub(earlier.obytes)?,
            imissed: self.imissed.checked_sub(earlier.imissed)?,
            ierrors: self.ierrors.checked_sub(earlier.ierrors)?,
            oerrors: self.oerrors.checked_sub(earlier.oerrors)?,
            rx_nombuf: self.rx_nombuf.checked_sub(earlier.rx_nombuf)?,
        })
    }

    /// Adds `other` to these counters.
    pub fn add(&mut self, other: &PortCounters) {
        self.ipackets += other.ipackets;
        self.opackets += other.opackets;
        self.ibytes += other.ibytes;
        self.obytes += other.obytes;
        self.imissed += other.imissed;
        self.ierrors += other.ierrors;
        self.oerrors += other.oerrors;
        self.rx_nombuf += other.rx_nombuf;
    }
}

/// The if-manager's transmit counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TxCounters {
    /// Frames handed to the NIC.
    pub sent: u64,
    /// Frames the NIC refused after all retries (freed).
    pub dropped: u64,
    /// Responses dequeued from the IFs' TX ring.
    pub from_ifs: u64,
}

impl IfManagerCounters {
    /// `self - earlier`, or `None` if any counter went down (then `self` is
    /// another process's).
    pub fn increase_over(&self, earlier: &IfManagerCounters) -> Option<IfManagerCounters> {
        let d = |now: u64, then: u64| now.checked_sub(then);
        let map = |now: &BTreeMap<String, u64>, then: &BTreeMap<String, u64>| {
            if then.keys().any(|k| !now.contains_key(k)) {
                return None;
            }
            now.iter()
                .map(|(k, v)| Some((k.clone(), d(*v, then.get(k).copied().unwrap_or(0))?)))
                .collect::<Option<BTreeMap<String, u64>>>()
        };
        Some(IfManagerCounters {
            rx_packets: d(self.rx_packets, earlier.rx_packets)?,
            outcomes: map(&self.outcomes, &earlier.outcomes)?,
            not_for_us: map(&self.not_for_us, &earlier.not_for_us)?,
            malformed: map(&self.malformed, &earlier.malformed)?,
            tx: TxCounters {
                sent: d(self.tx.sent, earlier.tx.sent)?,
                dropped: d(self.tx.dropped, earlier.tx.dropped)?,
                from_ifs: d(self.tx.from_ifs, earlier.tx.from_ifs)?,
            },
            answered_evictions: d(self.answered_evictions, earlier.answered_evictions)?,
            notices_dropped: d(self.notices_dropped, earlier.notices_dropped)?,
            port: self.port.increase_over(&earlier.port)?,
        })
    }

    /// Adds `other` to these counters.
    pub fn add(&mut self, other: &IfManagerCounters) {
        let add = |into: &mut BTreeMap<String, u64>, from: &BTreeMap<String, u64>| {
            for (k, v) in from {
                *into.entry(k.clone()).or_default() += v;
            }
        };
        self.rx_packets += other.rx_packets;
        add(&mut self.outcomes, &other.outcomes);
        add(&mut self.not_for_us, &other.not_for_us);
        add(&mut self.malformed, &other.malformed);
        self.tx.sent += other.tx.sent;
        self.tx.dropped += other.tx.dropped;
        self.tx.from_ifs += other.tx.from_ifs;
        self.answered_evictions += other.answered_evictions;
        self.notices_dropped += other.notices_dropped;
        self.port.add(&other.port);
    }
}

/// A command to an IF's control socket (`kp-if --listen`).
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "cmd", rename_all = "snake_case", deny_unknown_fields)]
pub enum IfCommand {
    /// Who and where the IF is: an [`IfStatus`].
    Status,
    /// A shadow: take the ring over once its owner yields (replies once it
    /// is ready to, with its [`IfStatus`]).
    Activate,
    /// The active: hand the ring to the armed shadow (replies once done,
    /// with its [`IfStatus`]).
    Yield,
    /// Stop: finish what is held, answer, exit.
    Stop,
}

impl IfCommand {
    /// Parses one request; the error says what is wrong with it.
    pub fn parse(bytes: &[u8]) -> Result<IfCommand, ErrorBody> {
        parse_command(bytes, "status, activate, yield, stop")
    }
}

/// An IF's reply to `status`, `activate` and `yield` (with `"ok": true`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IfStatus {
    /// Its process id.
    pub pid: u32,
    /// Its IF id.
    pub if_id: u16,
    /// Its model's name.
    pub model: String,
    /// Its mode (`"standby"`, `"arming"`, `"active"`, ...).
    pub mode: String,
    /// The pid that owns the ring now (0: nobody).
    pub owner: u32,
    /// Switchovers into this process so far.
    pub switchovers: u64,
    /// The last one's gap, from the predecessor's release to this
    /// process's first dequeue, ns.
    pub last_gap_ns: u64,
}

impl IfStatus {
    /// The whole reply: these fields and `"ok": true`.
    pub fn reply(&self) -> Value {
        let mut v = serde_json::to_value(self).unwrap_or(Value::Null);
        v["ok"] = Value::Bool(true);
        v
    }
}

/// What a process the orchestrator starts says once, as one JSON line on
/// its `--notify-fd` descriptor, when it is ready:
/// `{"pid": 4242, "role": "serving", "if_id": 1}`. The if-manager's has no
/// `if_id` (`null`). The human log line ("if-manager: ready", "kp-if:
/// ready", "kp-if: standby") is still printed, for people and scripts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Readiness {
    /// The process that is ready (the orchestrator's child, unless a
    /// wrapper forked it).
    pub pid: u32,
    /// What it is ready for.
    pub role: ReadyRole,
    /// The IF it serves; `None` for the if-manager.
    pub if_id: Option<u16>,
}

/// What a [`Readiness`] says the process is ready for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReadyRole {
    /// It serves: the if-manager polls its port, an active IF its ring.
    Serving,
    /// A shadow IF: model loaded, attached, parked until `activate`.
    Standby,
}

impl fmt::Display for ReadyRole {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ReadyRole::Serving => "serving",
            ReadyRole::Standby => "standby",
        })
    }
}

/// A readiness line that is not the one expected: never read as ready.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReadinessError {
    /// Not a [`Readiness`] at all.
    #[error("a readiness line that does not parse ({reason}): {line:?}")]
    Malformed {
        /// The line, as received.
        line: String,
        /// What serde said.
        reason: String,
    },
    /// A [`Readiness`], for another role or IF than the process was
    /// started as.
    #[error("ready as {got_role} of if {got_if:?}, started as {want_role} of if {want_if:?}")]
    Unexpected {
        /// The role it said.
        got_role: ReadyRole,
        /// The IF it said.
        got_if: Option<u16>,
        /// The role it was started for.
        want_role: ReadyRole,
        /// The IF it was started for.
        want_if: Option<u16>,
    },
}

impl Readiness {
    /// One line of the pipe (its newline trimmed or not) as a readiness.
    pub fn parse(line: &str) -> Result<Readiness, ReadinessError> {
        serde_json::from_str(line.trim_end()).map_err(|e| ReadinessError::Malformed {
            line: line.to_string(),
            reason: e.to_string(),
        })
    }

    /// Itself if it is for `role` and `if_id`, as the process was started.
    pub fn expect(self, role: ReadyRole, if_id: Option<u16>) -> Result<Readiness, ReadinessError> {
        if self.role == role && self.if_id == if_id {
            Ok(self)
        } else {
            Err(ReadinessError::Unexpected {
                got_role: self.role,
                got_if: self.if_id,
                want_role: role,
                want_if: if_id,
            })
        }
    }

    /// Writes it as one JSON line, in one `write` so that a reader never
    /// sees half of it.
    pub fn write_to(&self, mut out: impl Write) -> std::io::Result<()> {
        let mut line = serde_json::to_vec(self).map_err(std::io::Error::other)?;
        line.push(b'\n');
        out.write_all(&line)?;
        out.flush()
    }
}

/// `bytes` as a command of type `T`, tagged by `cmd`: malformed JSON, an
/// unknown `cmd` and a bad field are told apart.
fn parse_command<T: serde::de::DeserializeOwned + Serialize>(
    bytes: &[u8],
    known: &str,
) -> Result<T, ErrorBody> {
    let v: Value = serde_json::from_slice(bytes)
        .map_err(|e| ErrorBody::new(codes::MALFORMED, format!("not JSON: {e}")))?;
    let Some(cmd) = v.get("cmd").and_then(Value::as_str).map(str::to_owned) else {
        return Err(ErrorBody::new(
            codes::MALFORMED,
            "a command is a JSON object with a \"cmd\" string",
        ));
    };
    let parsed: T = serde_json::from_value(v.clone()).map_err(|e| {
        if e.to_string().starts_with("unknown variant") {
            ErrorBody::new(
                codes::UNKNOWN_COMMAND,
                format!("unknown command {cmd:?} ({known})"),
            )
        } else {
            ErrorBody::new(codes::MALFORMED, format!("bad {cmd:?} command: {e}"))
        }
    })?;
    // serde's deny_unknown_fields does not reach the field-less commands of
    // an internally tagged enum: a field the command does not have is one
    // its own serialisation lacks.
    let fields = serde_json::to_value(&parsed).unwrap_or(Value::Null);
    if let Some(extra) = v
        .as_object()
        .and_then(|o| o.keys().find(|k| fields.get(k.as_str()).is_none()))
    {
        return Err(ErrorBody::new(
            codes::MALFORMED,
            format!("bad {cmd:?} command: unknown field {extra:?}"),
        ));
    }
    Ok(parsed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_refusal_has_the_same_shape() {
        let e = ErrorBody::new(codes::NOT_REGISTERED, "if7 is not registered");
        let reply = e.reply();
        assert_eq!(reply["ok"], false);
        assert_eq!(reply["error"]["code"], "not_registered");
        assert_eq!(reply["error"]["message"], "if7 is not registered");
        assert_eq!(ErrorBody::of_reply(&reply), Some(e));
        assert_eq!(ErrorBody::of_reply(&json!({"ok": true})), None);
        // The old if-manager shape, a bare string: still an error, said so.
        let old = ErrorBody::of_reply(&json!({"ok": false, "error": "why"})).unwrap();
        assert_eq!(old.code, codes::MALFORMED);
        assert!(old.message.contains("why"), "{old}");
    }

    #[test]
    fn commands_parse_and_bad_ones_say_why() {
        assert_eq!(
            IfCommand::parse(br#"{"cmd":"yield"}"#),
            Ok(IfCommand::Yield)
        );
        assert_eq!(
            IfManagerCommand::parse(br#"{"cmd":"register","if_id":3}"#),
            Ok(IfManagerCommand::Register {
                if_id: 3,
                ring_size: None
            })
        );
        for (bytes, code) in [
            (&b"{"[..], codes::MALFORMED),
            (br#"[1]"#, codes::MALFORMED),
            (br#"{"if_id":1}"#, codes::MALFORMED),
            (br#"{"cmd":"jump"}"#, codes::UNKNOWN_COMMAND),
            (br#"{"cmd":"status","extra":1}"#, codes::MALFORMED),
        ] {
            let e = IfCommand::parse(bytes).unwrap_err();
            assert_eq!(e.code, code, "{}: {e}", String::from_utf8_lossy(bytes));
        }
        let e = IfManagerCommand::parse(br#"{"cmd":"register","if_id":"one"}"#).unwrap_err();
        assert_eq!(e.code, codes::MALFORMED);
        assert!(e.message.contains("register"), "{e}");
        let e = IfManagerCommand::parse(br#"{"cmd":"activate"}"#).unwrap_err();
        assert_eq!(e.code, codes::UNKNOWN_COMMAND);
        assert!(e.message.contains("register, unregister"), "{e}");
    }

    #[test]
    fn an_if_status_round_trips_with_ok() {
        let s = IfStatus {
            pid: 42,
            if_id: 1,
            model: "squeezenet".into(),
            mode: "active".into(),
            owner: 42,
            switchovers: 3,
            last_gap_ns: 66_000,
        };
        let reply = s.reply();
        assert_eq!(reply["ok"], true);
        assert_eq!(serde_json::from_value::<IfStatus>(reply).unwrap(), s);
        assert!(serde_json::from_value::<IfStatus>(json!({"ok": true, "pid": 1})).is_err());
    }

    #[test]
    fn readiness_round_trips_and_a_bad_line_is_an_error_with_its_text() {
        let r = Readiness {
            pid: 4242,
            role: ReadyRole::Standby,
            if_id: Some(3),
        };
        let mut line = Vec::new();
        r.write_to(&mut line).unwrap();
        let line = String::from_utf8(line).unwrap();
        assert_eq!(line, "{\"pid\":4242,\"role\":\"standby\",\"if_id\":3}\n");
        assert_eq!(Readiness::parse(&line), Ok(r));
        assert_eq!(r.expect(ReadyRole::Standby, Some(3)), Ok(r));
        let ifm = Readiness::parse(r#"{"pid":1,"role":"serving","if_id":null}"#).unwrap();
        assert_eq!(ifm.expect(ReadyRole::Serving, None), Ok(ifm));

        for bad in [
            "kp-if: ready",
            r#"{"pid":1,"role":"ready","if_id":3}"#,
            r#"{"pid":1,"role":"serving","if_id":3,"extra":true}"#,
            r#"{"role":"serving","if_id":3}"#,
            "",
        ] {
            match Readiness::parse(bad) {
                Err(ReadinessError::Malformed { line, .. }) => assert_eq!(line, bad),
                other => panic!("{bad:?} read as {other:?}"),
            }
        }
        let e = r.expect(ReadyRole::Serving, Some(3)).unwrap_err();
        assert!(matches!(e, ReadinessError::Unexpected { .. }), "{e}");
        assert!(r.expect(ReadyRole::Standby, Some(4)).is_err());
        assert!(e.to_string().contains("standby"), "{e}");
    }
}
