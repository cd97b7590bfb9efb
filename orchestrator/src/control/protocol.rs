//! The control protocol's messages: [`Request`], [`Reply`], [`ControlError`]
//! and the status rows, with their JSON forms (`docs/CONTROL.md`).
//!
//! Parsing never panics: any byte string is either a [`Request`] or a
//! [`ControlError`] whose code is `malformed` or `unknown_command`.

use std::fmt;
use std::path::PathBuf;

use kp_wire::IfId;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use thiserror::Error;

/// The commands, as the `cmd` field names them.
pub const COMMANDS: [&str; 7] = [
    "deploy", "retire", "slo", "share", "unpin", "status", "shutdown",
];

/// One control command, serde-tagged by `"cmd"`; unknown fields are refused.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// Start an inference function for `model` under `if_id`.
    Deploy {
        /// The IF's id; must be the model's `if_id` in the repository.
        if_id: u16,
        /// The model's name in the repository.
        model: String,
        /// The IF binary, an absolute path (default: the daemon's `kp-if`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        binary: Option<PathBuf>,
        /// Latency objective in ms (default: the model config's).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        slo_ms: Option<f64>,
        /// Initial share of the device in percent, in (0, 100] (default: the
        /// model's knee if known, else [`super::DEFAULT_SHARE_PCT`]). Not a
        /// pin: the allocator may change it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        share_pct: Option<f64>,
    },
    /// Stop the inference function `if_id`.
    Retire {
        /// The IF's id.
        if_id: u16,
    },
    /// Change `if_id`'s latency objective.
    Slo {
        /// The IF's id.
        if_id: u16,
        /// The new objective in ms, > 0.
        slo_ms: f64,
    },
    /// Pin `if_id`'s share at `pct` percent (the allocator leaves it alone).
    Share {
        /// The IF's id.
        if_id: u16,
        /// The share in percent, in (0, 100].
        pct: f64,
    },
    /// Hand `if_id`'s share back to the allocator.
    Unpin {
        /// The IF's id.
        if_id: u16,
    },
    /// Every IF's state and metrics.
    Status,
    /// Retire everything and stop the orchestrator.
    Shutdown,
}

impl Request {
    /// The request's `cmd`.
    pub fn command(&self) -> &'static str {
        match self {
            Request::Deploy { .. } => "deploy",
            Request::Retire { .. } => "retire",
            Request::Slo { .. } => "slo",
            Request::Share { .. } => "share",
            Request::Unpin { .. } => "unpin",
            Request::Status => "status",
            Request::Shutdown => "shutdown",
        }
    }

    /// Parses one request. Bytes that are not a JSON object with a known
    /// string `cmd` and exactly that command's fields, of the right types,
    /// give a `malformed` or `unknown_command` error that says why.
    pub fn parse(bytes: &[u8]) -> Result<Request, ControlError> {
        let value: Value = serde_json::from_slice(bytes)
            .map_err(|e| ControlError::Malformed(format!("not JSON: {e}")))?;
        let Value::Object(object) = value else {
            return Err(ControlError::Malformed(format!(
                "a request is a JSON object with a \"cmd\" field, not {}",
                json_kind(&value)
            )));
        };
        let cmd = match object.get("cmd") {
            None => return Err(ControlError::Malformed("missing field `cmd`".into())),
            Some(Value::String(cmd)) => cmd.clone(),
            Some(other) => {
                return Err(ControlError::Malformed(format!(
                    "`cmd` must be a string, not {}",
                    json_kind(other)
                )))
            }
        };
        if !COMMANDS.contains(&cmd.as_str()) {
            return Err(ControlError::UnknownCommand { cmd });
        }
        // serde's internally tagged unit variants ignore extra fields; the
        // protocol refuses them for every command alike.
        if matches!(cmd.as_str(), "status" | "shutdown") {
            if let Some(extra) = object.keys().find(|k| *k != "cmd") {
                return Err(ControlError::Malformed(format!(
                    "{cmd}: unknown field `{extra}`, `{cmd}` takes no fields"
                )));
            }
        }
        serde_json::from_value(Value::Object(object))
            .map_err(|e| ControlError::Malformed(format!("{cmd}: {e}")))
    }

    /// The request as the JSON bytes sent on the wire.
    pub fn to_bytes(&self) -> Vec<u8> {
        // A map of strings and numbers: serialising it cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }
}

fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The machine-readable kind of a refused command (`error.code`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// Not JSON, not an object, a missing field, an unknown field or a
    /// value of the wrong type.
    Malformed,
    /// `cmd` names no command.
    UnknownCommand,
    /// No IF with that id is deployed.
    UnknownIf,
    /// An IF with that id is already deployed.
    AlreadyDeployed,
    /// The `if_id` is not the one the model's config gives it.
    IfIdMismatch,
    /// The model repository has no such model.
    UnknownModel,
    /// A value is out of its range (SLO <= 0 or not finite, a share outside
    /// (0, 100], a relative binary path).
    InvalidValue,
    /// The pinned shares would sum above 100%.
    OverCapacity,
    /// `unpin` of an IF that is not pinned.
    NotPinned,
    /// A previous change to this IF is still being carried out.
    Busy,
    /// The orchestrator is shutting down.
    ShuttingDown,
    /// The daemon accepted the command but could not carry it out (e.g. the
    /// binary did not start); nothing changed.
    Failed,
}

impl ErrorCode {
    /// Every code, for documentation and tests.
    pub const ALL: [ErrorCode; 12] = [
        ErrorCode::Malformed,
        ErrorCode::UnknownCommand,
        ErrorCode::UnknownIf,
        ErrorCode::AlreadyDeployed,
        ErrorCode::IfIdMismatch,
        ErrorCode::UnknownModel,
        ErrorCode::InvalidValue,
        ErrorCode::OverCapacity,
        ErrorCode::NotPinned,
        ErrorCode::Busy,
        ErrorCode::ShuttingDown,
        ErrorCode::Failed,
    ];

    /// The code as it appears on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::Malformed => "malformed",
            ErrorCode::UnknownCommand => "unknown_command",
            ErrorCode::UnknownIf => "unknown_if",
            ErrorCode::AlreadyDeployed => "already_deployed",
            ErrorCode::IfIdMismatch => "if_id_mismatch",
            ErrorCode::UnknownModel => "unknown_model",
            ErrorCode::InvalidValue => "invalid_value",
            ErrorCode::OverCapacity => "over_capacity",
            ErrorCode::NotPinned => "not_pinned",
            ErrorCode::Busy => "busy",
            ErrorCode::ShuttingDown => "shutting_down",
            ErrorCode::Failed => "failed",
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a command was refused. Its message is a sentence for a person; its
/// [`code`](ControlError::code) is for scripts.
#[derive(Clone, Debug, PartialEq, Error)]
pub enum ControlError {
    /// The bytes are not a well-formed request.
    #[error("malformed request: {0}")]
    Malformed(String),
    /// `cmd` names no command.
    #[error("unknown command {cmd:?}; the commands are deploy, retire, slo, share, unpin, status and shutdown")]
    UnknownCommand {
        /// What `cmd` said.
        cmd: String,
    },
    /// No IF with that id is deployed.
    #[error("no inference function {if_id} is deployed")]
    UnknownIf {
        /// The id asked for.
        if_id: IfId,
    },
    /// The IF is deployed already.
    #[error("{if_id} is already deployed (model {model}); retire it first")]
    AlreadyDeployed {
        /// The id asked for.
        if_id: IfId,
        /// The model it serves.
        model: String,
    },
    /// The `if_id` differs from the model config's.
    #[error("model {model} is served as {configured} (the if_id in its config), not {requested}")]
    IfIdMismatch {
        /// The model.
        model: String,
        /// The id asked for.
        requested: IfId,
        /// The id in the model's config.
        configured: IfId,
    },
    /// The repository has no such model.
    #[error("no model {model:?} in the model repository (it has: {known})")]
    UnknownModel {
        /// The name asked for.
        model: String,
        /// The known names, comma-separated.
        known: String,
    },
    /// A value is out of range.
    #[error("{field} = {value} is invalid: {reason}")]
    InvalidValue {
        /// The request field.
        field: &'static str,
        /// The value given, as text.
        value: String,
        /// What it must be.
        reason: &'static str,
    },
    /// Pinning would commit more than the whole device.
    #[error("pinning {if_id} at {pct}% would pin {total}% of the device (other pins hold {others}%); at most 100% can be pinned")]
    OverCapacity {
        /// The IF to pin.
        if_id: IfId,
        /// Its requested share.
        pct: f64,
        /// What the other pinned IFs hold.
        others: f64,
        /// `others + pct`.
        total: f64,
    },
    /// `unpin` of an unpinned IF.
    #[error("{if_id} is not pinned; its share is already the allocator's")]
    NotPinned {
        /// The IF.
        if_id: IfId,
    },
    /// A previous change to this IF is still being carried out.
    #[error("{if_id} is busy ({what}); try again once that is done")]
    Busy {
        /// The IF.
        if_id: IfId,
        /// What is in progress, as the daemon described it.
        what: String,
    },
    /// The orchestrator takes no more changes.
    #[error("the orchestrator is shutting down and takes no more changes")]
    ShuttingDown,
    /// The daemon could not carry out an accepted command; nothing changed.
    #[error("could not carry the command out, nothing changed: {0}")]
    Failed(String),
}

impl ControlError {
    /// The error's machine code.
    pub fn code(&self) -> ErrorCode {
        match self {
            ControlError::Malformed(_) => ErrorCode::Malformed,
            ControlError::UnknownCommand { .. } => ErrorCode::UnknownCommand,
            ControlError::UnknownIf { .. } => ErrorCode::UnknownIf,
            ControlError::AlreadyDeployed { .. } => ErrorCode::AlreadyDeployed,
            ControlError::IfIdMismatch { .. } => ErrorCode::IfIdMismatch,
            ControlError::UnknownModel { .. } => ErrorCode::UnknownModel,
            ControlError::InvalidValue { .. } => ErrorCode::InvalidValue,
            ControlError::OverCapacity { .. } => ErrorCode::OverCapacity,
            ControlError::NotPinned { .. } => ErrorCode::NotPinned,
            ControlError::Busy { .. } => ErrorCode::Busy,
            ControlError::ShuttingDown => ErrorCode::ShuttingDown,
            ControlError::Failed(_) => ErrorCode::Failed,
        }
    }
}

/// One reply: `{"ok": true, ...payload}` or
/// `{"ok": false, "error": {"code": "...", "message": "..."}}`.
#[derive(Clone, Debug, PartialEq)]
pub enum Reply {
    /// The command was carried out; the payload's fields sit beside `"ok"`.
    Ok(Map<String, Value>),
    /// The command was refused and changed nothing.
    Error {
        /// The machine code (an [`ErrorCode`] as text; kept as text so a
        /// client reads codes newer than itself).
        code: String,
        /// Why, for a person.
        message: String,
    },
}

impl Reply {
    /// `{"ok": true}`.
    pub fn ok() -> Reply {
        Reply::Ok(Map::new())
    }

    /// `{"ok": true, ...fields of payload}`. A payload that does not
    /// serialise to a JSON object is a daemon bug, answered as `failed`.
    pub fn ok_with<T: Serialize + ?Sized>(payload: &T) -> Reply {
        match serde_json::to_value(payload) {
            Ok(Value::Object(map)) => Reply::Ok(map),
            Ok(other) => Reply::from(ControlError::Failed(format!(
                "the reply payload is {}, not an object",
                json_kind(&other)
            ))),
            Err(e) => Reply::from(ControlError::Failed(format!(
                "cannot serialise the reply: {e}"
            ))),
        }
    }

    /// The reply to `status`.
    pub fn status(report: &StatusReport) -> Reply {
        Reply::ok_with(report)
    }

    /// Whether the command was carried out.
    pub fn is_ok(&self) -> bool {
        matches!(self, Reply::Ok(_))
    }

    /// The error code of a refusal.
    pub fn error_code(&self) -> Option<&str> {
        match self {
            Reply::Ok(_) => None,
            Reply::Error { code, .. } => Some(code),
        }
    }

    /// The reply as JSON.
    pub fn to_json(&self) -> Value {
        match self {
            Reply::Ok(payload) => {
                let mut map = Map::with_capacity(payload.len() + 1);
                map.insert("ok".into(), Value::Bool(true));
                for (k, v) in payload {
                    if k != "ok" {
                        map.insert(k.clone(), v.clone());
                    }
                }
                Value::Object(map)
            }
            Reply::Error { code, message } => serde_json::json!({
                "ok": false,
                "error": { "code": code, "message": message },
            }),
        }
    }

    /// The reply as the JSON bytes sent on the wire.
    pub fn to_bytes(&self) -> Vec<u8> {
        self.to_json().to_string().into_bytes()
    }

    /// Reads a reply (the client side). Says why if `bytes` is not one.
    pub fn parse(bytes: &[u8]) -> Result<Reply, String> {
        let value: Value =
            serde_json::from_slice(bytes).map_err(|e| format!("reply is not JSON: {e}"))?;
        let Value::Object(mut map) = value else {
            return Err(format!("reply is {}, not an object", json_kind(&value)));
        };
        match map.remove("ok") {
            Some(Value::Bool(true)) => Ok(Reply::Ok(map)),
            Some(Value::Bool(false)) => {
                let error = map.get("error");
                let field = |name: &str| {
                    error
                        .and_then(|e| e.get(name))
                        .and_then(Value::as_str)
                        .map(str::to_owned)
                };
                match (field("code"), field("message")) {
                    (Some(code), Some(message)) => Ok(Reply::Error { code, message }),
                    _ => Err("error reply without error.code and error.message".into()),
                }
            }
            _ => Err("reply has no boolean \"ok\"".into()),
        }
    }
}

impl From<ControlError> for Reply {
    fn from(e: ControlError) -> Reply {
        Reply::Error {
            code: e.code().as_str().to_owned(),
            message: e.to_string(),
        }
    }
}

impl From<Result<Reply, ControlError>> for Reply {
    fn from(r: Result<Reply, ControlError>) -> Reply {
        r.unwrap_or_else(Reply::from)
    }
}

/// Where an IF is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IfState {
    /// Deployed; its process is loading the model or not yet ready.
    Starting,
    /// Serving.
    Active,
    /// Serving while a shadow with a new share takes over.
    Switching,
    /// Being stopped.
    Retiring,
    /// Its process died or did not start (see `reason`).
    Failed,
}

impl IfState {
    /// The state as the wire and the table write it.
    pub fn as_str(self) -> &'static str {
        match self {
            IfState::Starting => "starting",
            IfState::Active => "active",
            IfState::Switching => "switching",
            IfState::Retiring => "retiring",
            IfState::Failed => "failed",
        }
    }
}

impl fmt::Display for IfState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One IF in a `status` reply. The daemon fills it from its desired state
/// and the IF's telemetry; a metric not measured yet is `null`. Clients
/// ignore fields they do not know, so fields may be added.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StatusRow {
    /// The IF's id.
    pub if_id: u16,
    /// The model it serves.
    pub model: String,
    /// Where it is in its life.
    pub state: IfState,
    /// The serving process, if one runs.
    #[serde(default)]
    pub pid: Option<u32>,
    /// Its share of the device, percent.
    pub share_pct: f64,
    /// Whether the share is pinned by hand.
    pub pinned: bool,
    /// Latency objective, ms.
    pub slo_ms: f64,
    /// The batching policy's target batch size now (its limit for the
    /// next batch).
    #[serde(default)]
    pub batch_size: Option<u32>,
    /// The mean size of the batches the serving process ran.
    #[serde(default)]
    pub mean_batch_size: Option<f64>,
    /// Answers per second.
    #[serde(default)]
    pub throughput_rps: Option<f64>,
    /// Requests arriving per second.
    #[serde(default)]
    pub arrival_rps: Option<f64>,
    /// Median latency, ms.
    #[serde(default)]
    pub p50_ms: Option<f64>,
    /// 99th-percentile latency, ms.
    #[serde(default)]
    pub p99_ms: Option<f64>,
    /// Fraction of answers within the SLO, in [0, 1].
    #[serde(default)]
    pub slo_attainment: Option<f64>,
    /// Shadow switchovers so far.
    #[serde(default)]
    pub switchovers: u64,
    /// Service gap of the last switchover, µs.
    #[serde(default)]
    pub last_switchover_gap_us: Option<u64>,
    /// Why the IF is `failed` (or what it is waiting for), if anything.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// The payload of a `status` reply.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StatusReport {
    /// Whether `shutdown` was received.
    #[serde(default)]
    pub shutting_down: bool,
    /// Every IF, by id.
    pub ifs: Vec<StatusRow>,
    /// The platform as a whole (the if-manager's pid, restarts, the
    /// device), when the daemon knows it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub platform: Option<Value>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code(bytes: &[u8]) -> ErrorCode {
        Request::parse(bytes).unwrap_err().code()
    }

    /// Found by the `orchestrator_request` fuzz target: without serde_json's
    /// `float_roundtrip`, `5e54` (how 5000…0001461167879102427580 is sent
    /// back) parsed one ulp away from the value first parsed.
    #[test]
    fn numbers_round_trip_exactly() {
        for slo in [
            "5000000000000000000000000000000000001461167879102427580",
            "5e54",
            "33.333333333333336",
            "0.1",
            "1.7976931348623157e308",
            "5e-324",
        ] {
            let bytes = format!(r#"{{"cmd":"slo","if_id":1,"slo_ms":{slo}}}"#);
            let request = Request::parse(bytes.as_bytes()).unwrap();
            let Request::Slo { slo_ms, .. } = request else {
                panic!("{request:?}")
            };
            assert_eq!(slo_ms, slo.parse::<f64>().unwrap(), "{slo}");
            assert_eq!(Request::parse(&request.to_bytes()), Ok(request), "{slo}");
        }
    }

    #[test]
    fn parses_every_command() {
        assert_eq!(
            Request::parse(br#"{"cmd":"deploy","if_id":1,"model":"squeezenet"}"#),
            Ok(Request::Deploy {
                if_id: 1,
                model: "squeezenet".into(),
                binary: None,
                slo_ms: None,
                share_pct: None
            })
        );
        assert_eq!(
            Request::parse(
                br#"{"cmd":"deploy","if_id":1,"model":"m","binary":"/bin/x","slo_ms":5,"share_pct":null}"#
            ),
            Ok(Request::Deploy {
                if_id: 1,
                model: "m".into(),
                binary: Some("/bin/x".into()),
                slo_ms: Some(5.0),
                share_pct: None
            })
        );
        assert_eq!(
            Request::parse(br#"{"cmd":"retire","if_id":65535}"#),
            Ok(Request::Retire { if_id: 65535 })
        );
        assert_eq!(
            Request::parse(br#"{"if_id":2,"slo_ms":12.5,"cmd":"slo"}"#),
            Ok(Request::Slo {
                if_id: 2,
                slo_ms: 12.5
            })
        );
        assert_eq!(
            Request::parse(br#"{"cmd":"share","if_id":2,"pct":40}"#),
            Ok(Request::Share {
                if_id: 2,
                pct: 40.0
            })
        );
        assert_eq!(
            Request::parse(br#"{"cmd":"unpin","if_id":2}"#),
            Ok(Request::Unpin { if_id: 2 })
        );
        assert_eq!(Request::parse(br#"{"cmd":"status"}"#), Ok(Request::Status));
        assert_eq!(
            Request::parse(br#"{"cmd":"shutdown"}"#),
            Ok(Request::Shutdown)
        );
    }

    #[test]
    fn requests_round_trip() {
        for r in [
            Request::Deploy {
                if_id: 3,
                model: "alexnet".into(),
                binary: Some("/opt/kp-if".into()),
                slo_ms: Some(99.5),
                share_pct: Some(25.0),
            },
            Request::Deploy {
                if_id: 3,
                model: "alexnet".into(),
                binary: None,
                slo_ms: None,
                share_pct: None,
            },
            Request::Retire { if_id: 1 },
            Request::Slo {
                if_id: 1,
                slo_ms: 3.0,
            },
            Request::Share {
                if_id: 1,
                pct: 100.0,
            },
            Request::Unpin { if_id: 1 },
            Request::Status,
            Request::Shutdown,
        ] {
            let bytes = r.to_bytes();
            assert_eq!(Request::parse(&bytes), Ok(r.clone()), "{bytes:?}");
            let cmd = serde_json::from_slice::<Value>(&bytes).unwrap()["cmd"].clone();
            assert_eq!(cmd, r.command());
        }
    }

    #[test]
    fn malformed_requests_say_why() {
        for bad in [
            &b""[..],
            b"not json",
            b"\xff\xfe",
            b"{\"cmd\":",
            b"[1,2]",
            b"\"status\"",
            b"null",
            b"42",
            br#"{}"#,
            br#"{"cmd":7}"#,
            br#"{"cmd":null}"#,
            br#"{"cmd":"deploy","model":"m"}"#,
            br#"{"cmd":"deploy","if_id":1}"#,
            br#"{"cmd":"deploy","if_id":"1","model":"m"}"#,
            br#"{"cmd":"deploy","if_id":70000,"model":"m"}"#,
            br#"{"cmd":"deploy","if_id":-1,"model":"m"}"#,
            br#"{"cmd":"deploy","if_id":1,"model":"m","colour":"red"}"#,
            br#"{"cmd":"slo","if_id":1}"#,
            br#"{"cmd":"slo","if_id":1,"slo_ms":"fast"}"#,
            br#"{"cmd":"slo","if_id":1,"slo_ms":null}"#,
            br#"{"cmd":"share","if_id":1,"pct":true}"#,
            br#"{"cmd":"retire"}"#,
            br#"{"cmd":"status","verbose":true}"#,
            br#"{"cmd":"shutdown","now":1}"#,
        ] {
            let err = Request::parse(bad).unwrap_err();
            assert_eq!(err.code(), ErrorCode::Malformed, "{bad:?}: {err}");
            assert!(err.to_string().starts_with("malformed request: "), "{err}");
        }
    }

    #[test]
    fn unknown_commands_are_named() {
        assert_eq!(code(br#"{"cmd":"launch"}"#), ErrorCode::UnknownCommand);
        assert_eq!(
            code(br#"{"cmd":"Deploy","if_id":1,"model":"m"}"#),
            ErrorCode::UnknownCommand
        );
        let err = Request::parse(br#"{"cmd":"reboot"}"#).unwrap_err();
        assert!(err.to_string().contains("\"reboot\""), "{err}");
    }

    #[test]
    fn replies_have_the_documented_shape() {
        let ok = Reply::ok_with(&serde_json::json!({"if_id": 3}));
        assert_eq!(ok.to_json(), serde_json::json!({"ok": true, "if_id": 3}));
        let err = Reply::from(ControlError::UnknownIf { if_id: IfId(9) });
        assert_eq!(
            err.to_json(),
            serde_json::json!({"ok": false, "error": {
                "code": "unknown_if",
                "message": "no inference function if9 is deployed"
            }})
        );
        for r in [ok, err, Reply::ok()] {
            assert_eq!(Reply::parse(&r.to_bytes()), Ok(r.clone()));
        }
        assert!(Reply::ok_with(&3).error_code() == Some("failed"));
        assert!(Reply::parse(b"[]").is_err());
        assert!(Reply::parse(br#"{"ok":false}"#).is_err());
        assert!(Reply::parse(br#"{"status":1}"#).is_err());
    }

    #[test]
    fn codes_serialise_as_documented() {
        for c in ErrorCode::ALL {
            assert_eq!(
                serde_json::to_value(c).unwrap(),
                Value::String(c.as_str().into())
            );
        }
    }

    #[test]
    fn status_rows_tolerate_missing_metrics_and_new_fields() {
        let row: StatusRow = serde_json::from_str(
            r#"{"if_id":1,"model":"m","state":"switching","share_pct":30,"pinned":false,
                "slo_ms":20,"future_field":1}"#,
        )
        .unwrap();
        assert_eq!(row.state, IfState::Switching);
        assert_eq!(row.p99_ms, None);
        assert_eq!(row.switchovers, 0);
    }

    proptest::proptest! {
        #[test]
        fn parse_never_panics(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..64)) {
            let _ = Request::parse(&bytes);
        }

        #[test]
        fn parse_of_any_json_object_never_panics(
            cmd in "(deploy|retire|slo|share|unpin|status|shutdown|x)",
            if_id in proptest::option::of(-2i64..70_000),
            x in proptest::option::of(proptest::num::f64::ANY),
        ) {
            let mut m = Map::new();
            m.insert("cmd".into(), Value::String(cmd));
            if let Some(id) = if_id { m.insert("if_id".into(), id.into()); }
            if let Some(x) = x {
                m.insert("pct".into(), serde_json::json!(x));
                m.insert("slo_ms".into(), serde_json::json!(x));
            }
            let _ = Request::parse(Value::Object(m).to_string().as_bytes());
        }
    }
}
