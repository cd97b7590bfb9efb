//! The IF's side of the if-manager's control socket (ZeroMQ REQ, JSON).
//!
//! An IF registers its ring (unless the if-manager was started with it),
//! says `ready` once its model is loaded and it is attached, and `goodbye`
//! after its last answer is on the TX ring. See the if-manager's `control`
//! module for the commands.

use std::time::Duration;

use serde_json::Value;

use kp_wire::IfId;

use crate::messages::{codes, ErrorBody, IfManagerCommand};

/// Why a request to the if-manager failed.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// The socket could not be made or set up.
    #[error("ZeroMQ socket: {0}")]
    Socket(#[source] zmq::Error),
    /// The endpoint is not one ZeroMQ can connect to.
    #[error("cannot connect to {endpoint}: {source}")]
    Connect {
        /// The endpoint.
        endpoint: String,
        /// ZeroMQ's error.
        source: zmq::Error,
    },
    /// Sending failed, or no reply came within [`REPLY_TIMEOUT`].
    #[error("no reply from the if-manager at {endpoint} ({source})")]
    NoReply {
        /// The endpoint.
        endpoint: String,
        /// ZeroMQ's error.
        source: zmq::Error,
    },
    /// The reply was not JSON.
    #[error("bad reply from the if-manager at {endpoint}: {source}")]
    BadReply {
        /// The endpoint.
        endpoint: String,
        /// The parse error.
        source: serde_json::Error,
    },
    /// The if-manager answered `"ok": false`, with its reason.
    #[error("the if-manager refused: {0}")]
    Refused(ErrorBody),
}

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
    pub fn connect(endpoint: &str) -> Result<ControlClient, ControlError> {
        let ctx = zmq::Context::new();
        let sock = ctx.socket(zmq::REQ).map_err(ControlError::Socket)?;
        sock.set_linger(0).map_err(ControlError::Socket)?;
        sock.set_rcvtimeo(REPLY_TIMEOUT.as_millis() as i32)
            .map_err(ControlError::Socket)?;
        sock.connect(endpoint)
            .map_err(|source| ControlError::Connect {
                endpoint: endpoint.to_string(),
                source,
            })?;
        Ok(ControlClient {
            _ctx: ctx,
            sock,
            endpoint: endpoint.to_string(),
        })
    }

    /// Sends one command and returns the reply; a reply with `"ok": false`
    /// is [`ControlError::Refused`] with the if-manager's reason.
    pub fn request(&self, command: &IfManagerCommand) -> Result<Value, ControlError> {
        let no_reply = |source| ControlError::NoReply {
            endpoint: self.endpoint.clone(),
            source,
        };
        self.sock
            .send(serde_json::to_vec(command).unwrap_or_default(), 0)
            .map_err(no_reply)?;
        let bytes = self.sock.recv_bytes(0).map_err(no_reply)?;
        let reply: Value =
            serde_json::from_slice(&bytes).map_err(|source| ControlError::BadReply {
                endpoint: self.endpoint.clone(),
                source,
            })?;
        match ErrorBody::of_reply(&reply) {
            None => Ok(reply),
            Some(e) => Err(ControlError::Refused(e)),
        }
    }

    /// Registers `if_id`'s ring; an IF registered on the if-manager's
    /// command line is fine too. Returns the ring's name.
    pub fn register(&self, if_id: IfId, ring_size: Option<u32>) -> Result<String, ControlError> {
        let cmd = IfManagerCommand::Register {
            if_id: if_id.0,
            ring_size,
        };
        match self.request(&cmd) {
            Ok(reply) => Ok(reply["ring"].as_str().unwrap_or_default().to_string()),
            Err(ControlError::Refused(e)) if e.code == codes::ALREADY_REGISTERED => {
                Ok(crate::names::if_ring(if_id))
            }
            Err(e) => Err(e),
        }
    }

    /// Says the IF is attached and serving.
    pub fn ready(&self, if_id: IfId) -> Result<(), ControlError> {
        self.request(&IfManagerCommand::Ready { if_id: if_id.0 })
            .map(drop)
    }

    /// Says the IF's last answer is on the TX ring.
    pub fn goodbye(&self, if_id: IfId) -> Result<(), ControlError> {
        self.request(&IfManagerCommand::Goodbye { if_id: if_id.0 })
            .map(drop)
    }
}
