//! The client side of the control socket, as `kpctl` uses it.
//!
//! Every request gets a fresh REQ socket with `ZMQ_LINGER` 0 and a receive
//! timeout, so a dead or absent daemon is reported as "no reply within N
//! ms" instead of a hang, and a late reply can never be taken for the
//! answer to a later request.

use std::fmt;
use std::time::Duration;

use thiserror::Error;

use super::protocol::{Reply, Request};
use super::server::ipc_path;

/// Why a request got no usable reply.
#[derive(Debug, Error)]
pub enum ClientError {
    /// Nothing came back in time.
    #[error("no reply from {endpoint} within {timeout_ms} ms{hint}")]
    NoReply {
        /// The endpoint asked.
        endpoint: String,
        /// How long we waited.
        timeout_ms: u128,
        /// A likely cause, starting with "; " (or empty).
        hint: String,
    },
    /// The socket (or a folder above it) is another user's: the control
    /// socket is 0600 in a 0700 folder, for the user who runs the
    /// orchestrator and root only (docs/SECURITY.md).
    #[error(
        "{endpoint}: permission denied: the control socket {} or a folder above it \
         belongs to another user; only the user who runs the orchestrator (or root) may \
         use it",
        path.display()
    )]
    PermissionDenied {
        /// The endpoint.
        endpoint: String,
        /// The socket's path.
        path: std::path::PathBuf,
    },
    /// ZeroMQ refused (e.g. a malformed endpoint).
    #[error("{endpoint}: {what}: {source}")]
    Zmq {
        /// The endpoint.
        endpoint: String,
        /// What was being done.
        what: &'static str,
        /// ZeroMQ's error.
        source: zmq::Error,
    },
    /// The reply is not a control reply.
    #[error("{endpoint} sent a reply that is not one: {reason}")]
    BadReply {
        /// The endpoint.
        endpoint: String,
        /// What is wrong with it.
        reason: String,
    },
}

/// A connection to the orchestrator's control socket.
pub struct ControlClient {
    ctx: zmq::Context,
    endpoint: String,
    timeout: Duration,
}

impl fmt::Debug for ControlClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ControlClient")
            .field("endpoint", &self.endpoint)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl ControlClient {
    /// A client of `endpoint` that waits `timeout` for each reply.
    pub fn new(endpoint: impl Into<String>, timeout: Duration) -> ControlClient {
        ControlClient {
            ctx: zmq::Context::new(),
            endpoint: endpoint.into(),
            timeout,
        }
    }

    /// The endpoint.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Sends `request` and returns the reply (an `ok` or an error reply).
    pub fn request(&self, request: &Request) -> Result<Reply, ClientError> {
        self.request_raw(&request.to_bytes())
    }

    /// Sends `bytes` as one request, well formed or not (for tests and
    /// debugging), and returns the reply.
    pub fn request_raw(&self, bytes: &[u8]) -> Result<Reply, ClientError> {
        let bytes = self.exchange(&[bytes])?;
        Reply::parse(&bytes).map_err(|reason| ClientError::BadReply {
            endpoint: self.endpoint.clone(),
            reason,
        })
    }

    /// Sends `frames` as one multi-frame message and returns the reply's
    /// bytes as they came.
    pub fn exchange(&self, frames: &[&[u8]]) -> Result<Vec<u8>, ClientError> {
        let zmq_err = |what: &'static str| {
            move |source| ClientError::Zmq {
                endpoint: self.endpoint.clone(),
                what,
                source,
            }
        };
        self.check_access()?;
        let ms = i32::try_from(self.timeout.as_millis()).unwrap_or(i32::MAX);
        let socket = self.ctx.socket(zmq::REQ).map_err(zmq_err("socket"))?;
        socket.set_linger(0).map_err(zmq_err("set linger"))?;
        socket
            .set_rcvtimeo(ms)
            .map_err(zmq_err("set receive timeout"))?;
        socket
            .set_sndtimeo(ms)
            .map_err(zmq_err("set send timeout"))?;
        socket.connect(&self.endpoint).map_err(zmq_err("connect"))?;
        match socket.send_multipart(frames.iter().copied(), 0) {
            Ok(()) => {}
            Err(zmq::Error::EAGAIN) => return Err(self.no_reply()),
            Err(e) => return Err(zmq_err("send")(e)),
        }
        match socket.recv_bytes(0) {
            Ok(bytes) => Ok(bytes),
            Err(zmq::Error::EAGAIN) => Err(self.no_reply()),
            Err(e) => Err(zmq_err("receive")(e)),
        }
    }

    /// For an `ipc://` endpoint, whether this user may connect at all:
    /// ZeroMQ would retry a refused connection silently until the timeout,
    /// so a socket we may not use is told at once. The probe is a plain
    /// Unix connect, closed at once (the server drops it, as it drops any
    /// peer that never completes a handshake). Anything but "permission
    /// denied" is left to ZeroMQ (an absent socket gets its hint on
    /// timeout).
    fn check_access(&self) -> Result<(), ClientError> {
        let Some(path) = ipc_path(&self.endpoint) else {
            return Ok(());
        };
        match std::os::unix::net::UnixStream::connect(path) {
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                Err(ClientError::PermissionDenied {
                    endpoint: self.endpoint.clone(),
                    path: path.to_path_buf(),
                })
            }
            _ => Ok(()),
        }
    }

    fn no_reply(&self) -> ClientError {
        let hint = match ipc_path(&self.endpoint) {
            Some(path) if !path.exists() => format!(
                "; there is no socket at {}: is the orchestrator running?",
                path.display()
            ),
            Some(_) => "; the socket exists: is the orchestrator stuck, or is it another user's?"
                .to_string(),
            None => "; is the orchestrator running?".to_string(),
        };
        ClientError::NoReply {
            endpoint: self.endpoint.clone(),
            timeout_ms: self.timeout.as_millis(),
            hint,
        }
    }
}
