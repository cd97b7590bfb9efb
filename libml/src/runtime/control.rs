//! The IF's side of the if-manager's control socket (ZeroMQ REQ, JSON).
//!
//! An IF registers its ring (unless the if-manager was started with it),
//! says `ready` once its model is loaded and it is attached, and `goodbye`
//! after its last answer is on the TX ring. See the if-manager's `control`
//! module for the commands.

use std::time::Duration;

use serde_json::{json, Value};

use kp_wire::IfId;

/// How long to wait for the if-manager's reply.
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(5);

/// A connection to the if-manager's control socket.
pub struct ControlClient {
    _ctx: zmq::Context,
    sock: zmq::Socket,
    endpoint: String,
}

impl std::fmt::Debug for ControlClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlClient")
            .field("endpoint", &self.endpoint)
            .finish()
    }
}

impl ControlClient {
    /// Connects (ZeroMQ connects lazily; errors show on the first request).
    pub fn connect(endpoint: &str) -> Result<ControlClient, String> {
        let ctx = zmq::Context::new();
        let sock = ctx.socket(zmq::REQ).map_err(|e| e.to_string())?;
        sock.set_linger(0).map_err(|e| e.to_string())?;
        sock.set_rcvtimeo(REPLY_TIMEOUT.as_millis() as i32)
            .map_err(|e| e.to_string())?;
        sock.connect(endpoint)
            .map_err(|e| format!("cannot connect to {endpoint}: {e}"))?;
        Ok(ControlClient {
            _ctx: ctx,
            sock,
            endpoint: endpoint.to_string(),
        })
    }

    /// Sends one command and returns the reply; a reply with `"ok": false`
    /// is an error carrying the if-manager's reason.
    pub fn request(&self, command: &Value) -> Result<Value, String> {
        self.sock
            .send(command.to_string().as_bytes(), 0)
            .map_err(|e| format!("{}: {e}", self.endpoint))?;
        let bytes = self
            .sock
            .recv_bytes(0)
            .map_err(|e| format!("no reply from the if-manager at {} ({e})", self.endpoint))?;
        let reply: Value = serde_json::from_slice(&bytes).map_err(|e| format!("bad reply: {e}"))?;
        if reply["ok"] == true {
            Ok(reply)
        } else {
            Err(reply["error"]
                .as_str()
                .unwrap_or("unknown error")
                .to_string())
        }
    }

    /// Registers `if_id`'s ring; an IF registered on the if-manager's
    /// command line is fine too. Returns the ring's name.
    pub fn register(&self, if_id: IfId, ring_size: Option<u32>) -> Result<String, String> {
        let mut cmd = json!({ "cmd": "register", "if_id": if_id.0 });
        if let Some(size) = ring_size {
            cmd["ring_size"] = json!(size);
        }
        match self.request(&cmd) {
            Ok(reply) => Ok(reply["ring"].as_str().unwrap_or_default().to_string()),
            Err(e) if e.contains("already registered") => Ok(crate::names::if_ring(if_id)),
            Err(e) => Err(e),
        }
    }

    /// Says the IF is attached and serving.
    pub fn ready(&self, if_id: IfId) -> Result<(), String> {
        self.request(&json!({ "cmd": "ready", "if_id": if_id.0 }))
            .map(drop)
    }

    /// Says the IF's last answer is on the TX ring.
    pub fn goodbye(&self, if_id: IfId) -> Result<(), String> {
        self.request(&json!({ "cmd": "goodbye", "if_id": if_id.0 }))
            .map(drop)
    }
}
