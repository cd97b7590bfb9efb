//! The control socket: a ZeroMQ REP socket the daemon polls from its main
//! loop ([`ControlServer::poll_once`]), and where it lives
//! ([`default_endpoint`]).
//!
//! Endpoints and who can reach them:
//!
//! * `ipc:///abs/path.sock` (the default): the missing folders above the
//!   socket are created with mode 0700, a folder that exists must belong to
//!   this user or to root (so nobody else can have prepared it), and the
//!   socket file is made 0600 right after the bind. A socket file left by a
//!   dead orchestrator is replaced; one a live process answers on is not.
//! * `tcp://HOST:PORT`: only on a loopback address (`127.0.0.0/8`, `::1`,
//!   `localhost`) unless [`BindOptions::allow_remote`]. The protocol has no
//!   authentication: whoever reaches the socket controls the platform.
//! * `inproc://NAME`: same process only (tests).
//!
//! Anything else (abstract `ipc://@name` sockets, which have no permissions,
//! other transports) is refused.

use std::fmt;
use std::fs;
use std::io;
use std::net::IpAddr;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use thiserror::Error;

use super::protocol::{ControlError, Reply, Request};

/// Environment variable that overrides [`default_endpoint`] (for the daemon
/// and `kpctl` alike).
pub const ENDPOINT_ENV: &str = "KNEEPOINT_CONTROL";

/// The socket's file name inside the runtime folder.
pub const SOCKET_NAME: &str = "orchestrator.sock";

/// Largest request accepted, bytes. A request is a few hundred bytes; this
/// bounds what a confused or hostile peer can make the daemon allocate (a
/// larger message drops that peer's connection, unanswered).
pub const MAX_REQUEST_BYTES: i64 = 64 * 1024;

/// How long sending one reply may take. A REP socket queues replies, so
/// this is reached only if the peer's queue is full.
const SEND_TIMEOUT_MS: i32 = 1000;

/// Longest path of a Unix socket (`sun_path` less its NUL).
const MAX_SOCKET_PATH: usize = 107;

/// Where the control socket is when nothing says otherwise:
/// `$KNEEPOINT_CONTROL` if set, else [`default_endpoint_for`] this user.
pub fn default_endpoint() -> String {
    match std::env::var(ENDPOINT_ENV) {
        Ok(e) if !e.is_empty() => e,
        _ => default_endpoint_for(
            effective_uid(),
            std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from),
        ),
    }
}

/// The default endpoint for user `uid` with runtime folder `runtime_dir`:
/// `ipc:///run/kneepoint/orchestrator.sock` for root,
/// `ipc://$XDG_RUNTIME_DIR/kneepoint/orchestrator.sock` for others, and
/// `ipc:///tmp/kneepoint-UID/orchestrator.sock` without a runtime folder
/// (whose owner [`ControlServer::bind`] checks).
pub fn default_endpoint_for(uid: Option<u32>, runtime_dir: Option<PathBuf>) -> String {
    let dir = match (uid, runtime_dir) {
        (Some(0), _) => PathBuf::from("/run/kneepoint"),
        (_, Some(dir)) if dir.is_absolute() => dir.join("kneepoint"),
        (uid, _) => std::env::temp_dir().join(format!(
            "kneepoint-{}",
            uid.map_or_else(|| "user".to_string(), |u| u.to_string())
        )),
    };
    format!("ipc://{}", dir.join(SOCKET_NAME).display())
}

/// This process's effective user id, from `/proc/self` (owned by it).
pub fn effective_uid() -> Option<u32> {
    fs::metadata("/proc/self").ok().map(|m| m.uid())
}

/// The file of an `ipc://` endpoint (`None` for other transports).
pub fn ipc_path(endpoint: &str) -> Option<&Path> {
    endpoint.strip_prefix("ipc://").map(Path::new)
}

/// How [`ControlServer::bind`] treats its endpoint.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BindOptions {
    /// Allow a `tcp://` endpoint on a non-loopback address. The protocol
    /// has no authentication: only for a trusted network.
    pub allow_remote: bool,
}

/// Why the control socket could not be set up or served.
#[derive(Debug, Error)]
pub enum ServerError {
    /// The endpoint is not one the orchestrator serves on.
    #[error("control endpoint {endpoint}: {reason}")]
    Endpoint {
        /// The endpoint.
        endpoint: String,
        /// Why it is refused.
        reason: String,
    },
    /// Another process answers on the socket already.
    #[error("control endpoint {endpoint}: another process is serving it (an orchestrator already running?)")]
    InUse {
        /// The endpoint.
        endpoint: String,
    },
    /// A file-system step failed.
    #[error("control endpoint {endpoint}: {what} {}: {source}", path.display())]
    Io {
        /// The endpoint.
        endpoint: String,
        /// What was being done.
        what: &'static str,
        /// On which path.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// ZeroMQ refused.
    #[error("control endpoint {endpoint}: {what}: {source}")]
    Zmq {
        /// The endpoint.
        endpoint: String,
        /// What was being done.
        what: &'static str,
        /// ZeroMQ's error.
        source: zmq::Error,
    },
}

/// What the daemon does with a command. It is called once per well-formed
/// request; a malformed one is answered without it.
///
/// A typical daemon: `state.plan(&req, &models)`, act on the [`Change`]
/// (start a process, begin a switchover), then `state.apply(change)` and
/// answer [`Change::reply`] — or the error, with nothing applied.
///
/// [`Change`]: super::Change
/// [`Change::reply`]: super::Change::reply
pub trait Handler {
    /// Carries out `request` and says how it went. Every request gets
    /// exactly this one reply.
    fn handle(&mut self, request: Request) -> Reply;
}

impl<F: FnMut(Request) -> Reply> Handler for F {
    fn handle(&mut self, request: Request) -> Reply {
        self(request)
    }
}

/// What [`ControlServer::poll_once`] did.
#[derive(Clone, Debug, PartialEq)]
pub enum Served {
    /// No request arrived within the timeout.
    Idle,
    /// A well-formed request was handed to the handler and answered.
    Handled {
        /// The request's `cmd`.
        command: &'static str,
        /// Whether the reply was `ok`.
        ok: bool,
    },
    /// A malformed request was answered with this error, without the
    /// handler.
    Refused(ControlError),
}

/// The orchestrator's control socket.
pub struct ControlServer {
    /// `None` only while dropping.
    socket: Option<zmq::Socket>,
    endpoint: String,
    ipc: Option<PathBuf>,
    /// The socket file's (device, inode) once bound: the file [`Drop`]
    /// removes only while it is still this one.
    ipc_id: Option<(u64, u64)>,
    /// `None` only while dropping.
    ctx: Option<zmq::Context>,
}

impl Drop for ControlServer {
    /// Closes the socket and removes an `ipc://` socket file, which
    /// ZeroMQ leaves behind. The file is removed only while it is the one
    /// this server bound (same device and inode), so a server that took
    /// over the path keeps its socket. (It used to be removed when a
    /// connect to it was refused, which raced libzmq's I/O thread closing
    /// the listener: a connect that came first succeeded, and the file
    /// stayed.)
    fn drop(&mut self) {
        drop(self.socket.take());
        drop(self.ctx.take());
        if let (Some(path), Some(id)) = (&self.ipc, self.ipc_id) {
            let ours = fs::symlink_metadata(path)
                .is_ok_and(|m| m.file_type().is_socket() && (m.dev(), m.ino()) == id);
            if ours {
                let _ = fs::remove_file(path);
            }
        }
    }
}

impl fmt::Debug for ControlServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ControlServer")
            .field("endpoint", &self.endpoint)
            .finish_non_exhaustive()
    }
}

impl ControlServer {
    /// Binds a REP socket on `endpoint` (see the module docs for what is
    /// allowed and how an `ipc://` socket is protected).
    pub fn bind(endpoint: &str, options: BindOptions) -> Result<ControlServer, ServerError> {
        let refuse = |reason: String| ServerError::Endpoint {
            endpoint: endpoint.to_string(),
            reason,
        };
        let ipc = if let Some(path) = ipc_path(endpoint) {
            Some(prepare_ipc(endpoint, path)?)
        } else if let Some(addr) = endpoint.strip_prefix("tcp://") {
            let host =
                tcp_host(addr).ok_or_else(|| refuse("a tcp endpoint is tcp://HOST:PORT".into()))?;
            if !options.allow_remote && !is_loopback(host) {
                return Err(refuse(format!(
                    "{host} is not a loopback address; the control protocol has no \
                     authentication, so serving it beyond this host needs allow_remote"
                )));
            }
            None
        } else if endpoint.starts_with("inproc://") {
            None
        } else {
            return Err(refuse(
                "use ipc:///ABSOLUTE/PATH, tcp://HOST:PORT or inproc://NAME".into(),
            ));
        };

        let zmq_err = |what: &'static str| {
            move |source| ServerError::Zmq {
                endpoint: endpoint.to_string(),
                what,
                source,
            }
        };
        let ctx = zmq::Context::new();
        let socket = ctx.socket(zmq::REP).map_err(zmq_err("socket"))?;
        socket.set_linger(0).map_err(zmq_err("set linger"))?;
        socket
            .set_maxmsgsize(MAX_REQUEST_BYTES)
            .map_err(zmq_err("set max message size"))?;
        socket
            .set_sndtimeo(SEND_TIMEOUT_MS)
            .map_err(zmq_err("set send timeout"))?;
        socket.bind(endpoint).map_err(zmq_err("bind"))?;
        let bound = match socket.get_last_endpoint() {
            Ok(Ok(e)) if !e.is_empty() => e,
            _ => endpoint.to_string(),
        };
        let ipc_id = ipc
            .as_ref()
            .and_then(|p| fs::symlink_metadata(p).ok())
            .map(|m| (m.dev(), m.ino()));
        let server = ControlServer {
            socket: Some(socket),
            endpoint: bound,
            ipc,
            ipc_id,
            ctx: Some(ctx),
        };
        if let Some(path) = &server.ipc {
            // The folder is 0700 when we created it; the file is made
            // owner-only whatever the umask was.
            let io = |what, source| ServerError::Io {
                endpoint: endpoint.to_string(),
                what,
                path: path.clone(),
                source,
            };
            fs::set_permissions(path, fs::Permissions::from_mode(0o600))
                .map_err(|e| io("cannot restrict", e))?;
            let mode = fs::metadata(path)
                .map_err(|e| io("cannot read", e))?
                .permissions()
                .mode();
            if mode & 0o077 != 0 {
                return Err(refuse(format!(
                    "socket {} has mode {:o}, not owner-only",
                    path.display(),
                    mode & 0o777
                )));
            }
        }
        Ok(server)
    }

    /// The endpoint as bound (a `tcp://…:*` port resolved), for clients.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The socket file of an `ipc://` endpoint.
    pub fn socket_path(&self) -> Option<&Path> {
        self.ipc.as_deref()
    }

    /// Waits up to `timeout` for one request, answers it and returns; for
    /// the daemon's main loop. At most one request is read. A request that
    /// is not one frame of a well-formed command is answered `malformed` or
    /// `unknown_command` without calling `handler`; any other is answered
    /// with what `handler` returns. Either way exactly one reply is sent.
    ///
    /// An interrupted wait (a signal) counts as [`Served::Idle`]. An `Err`
    /// means the socket itself failed.
    pub fn poll_once<H: Handler + ?Sized>(
        &mut self,
        handler: &mut H,
        timeout: Duration,
    ) -> Result<Served, ServerError> {
        let zmq_err = |what: &'static str| {
            let endpoint = self.endpoint.clone();
            move |source| ServerError::Zmq {
                endpoint,
                what,
                source,
            }
        };
        let timeout_ms = i64::try_from(timeout.as_millis()).unwrap_or(i64::MAX);
        let Some(socket) = self.socket.as_ref() else {
            return Ok(Served::Idle);
        };
        match socket.poll(zmq::POLLIN, timeout_ms) {
            Ok(0) | Err(zmq::Error::EINTR) => return Ok(Served::Idle),
            Ok(_) => {}
            Err(e) => return Err(zmq_err("poll")(e)),
        }
        let frames = match socket.recv_multipart(zmq::DONTWAIT) {
            Ok(frames) => frames,
            Err(zmq::Error::EAGAIN) | Err(zmq::Error::EINTR) => return Ok(Served::Idle),
            Err(e) => return Err(zmq_err("receive")(e)),
        };
        let parsed = match frames.as_slice() {
            [one] => Request::parse(one),
            more => Err(ControlError::Malformed(format!(
                "a request is one message frame, this one has {}",
                more.len()
            ))),
        };
        let (reply, served) = match parsed {
            Ok(request) => {
                let command = request.command();
                let reply = handler.handle(request);
                let ok = reply.is_ok();
                (reply, Served::Handled { command, ok })
            }
            Err(e) => (Reply::from(e.clone()), Served::Refused(e)),
        };
        socket
            .send(reply.to_bytes(), 0)
            .map_err(zmq_err("send reply"))?;
        Ok(served)
    }
}

/// Checks and prepares the folder of an `ipc://` socket; returns its path.
fn prepare_ipc(endpoint: &str, path: &Path) -> Result<PathBuf, ServerError> {
    let refuse = |reason: String| ServerError::Endpoint {
        endpoint: endpoint.to_string(),
        reason,
    };
    let io = |what: &'static str, at: &Path| {
        let at = at.to_path_buf();
        move |source| ServerError::Io {
            endpoint: endpoint.to_string(),
            what,
            path: at,
            source,
        }
    };
    if path.as_os_str().to_string_lossy().starts_with('@') {
        return Err(refuse(
            "abstract ipc sockets have no file permissions: anyone on the host could \
             connect; use a path"
                .into(),
        ));
    }
    if !path.is_absolute() {
        return Err(refuse(format!(
            "{} is relative; an ipc endpoint needs an absolute path",
            path.display()
        )));
    }
    if path.as_os_str().len() > MAX_SOCKET_PATH {
        return Err(refuse(format!(
            "{} is longer than the {MAX_SOCKET_PATH} bytes a Unix socket path can have",
            path.display()
        )));
    }
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .ok_or_else(|| refuse(format!("{} has no folder", path.display())))?;
    match fs::symlink_metadata(dir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(io("cannot create", dir))?;
            // DirBuilder's mode is filtered by the umask; say it exactly.
            fs::set_permissions(dir, fs::Permissions::from_mode(0o700))
                .map_err(io("cannot restrict", dir))?;
        }
        Err(e) => return Err(io("cannot inspect", dir)(e)),
        Ok(meta) => {
            // Follow a link (e.g. /tmp -> /private/tmp) to what it names.
            let meta = if meta.file_type().is_symlink() {
                fs::metadata(dir).map_err(io("cannot inspect", dir))?
            } else {
                meta
            };
            if !meta.is_dir() {
                return Err(refuse(format!("{} is not a folder", dir.display())));
            }
            let me = effective_uid();
            if meta.uid() != 0 && Some(meta.uid()) != me {
                return Err(refuse(format!(
                    "folder {} belongs to uid {}, not to this user or root; someone else \
                     could replace the socket",
                    dir.display(),
                    meta.uid()
                )));
            }
        }
    }
    // A socket file already there: left by a dead orchestrator (replace it)
    // or served by a live process (refuse; binding would steal it).
    match fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io("cannot inspect", path)(e)),
        Ok(meta) if !meta.file_type().is_socket() => {
            return Err(refuse(format!(
                "{} exists and is not a socket",
                path.display()
            )))
        }
        Ok(_) => match UnixStream::connect(path) {
            Ok(_) => {
                return Err(ServerError::InUse {
                    endpoint: endpoint.to_string(),
                })
            }
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                fs::remove_file(path).map_err(io("cannot remove the stale socket", path))?;
            }
            Err(e) => return Err(io("cannot tell whether a process serves", path)(e)),
        },
    }
    Ok(path.to_path_buf())
}

/// The host of `HOST:PORT` (`[v6]:PORT` unbracketed).
fn tcp_host(addr: &str) -> Option<&str> {
    let (host, port) = addr.rsplit_once(':')?;
    if host.is_empty() || port.is_empty() {
        return None;
    }
    Some(
        host.strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host),
    )
}

fn is_loopback(host: &str) -> bool {
    host.eq_ignore_ascii_case("localhost")
        || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_endpoints() {
        assert_eq!(
            default_endpoint_for(Some(0), Some("/run/user/0".into())),
            "ipc:///run/kneepoint/orchestrator.sock"
        );
        assert_eq!(
            default_endpoint_for(Some(1000), Some("/run/user/1000".into())),
            "ipc:///run/user/1000/kneepoint/orchestrator.sock"
        );
        let tmp = std::env::temp_dir();
        assert_eq!(
            default_endpoint_for(Some(1000), None),
            format!(
                "ipc://{}",
                tmp.join("kneepoint-1000/orchestrator.sock").display()
            )
        );
        // A relative runtime folder is ignored.
        assert_eq!(
            default_endpoint_for(Some(1000), Some("run".into())),
            default_endpoint_for(Some(1000), None)
        );
    }

    #[test]
    fn tcp_hosts() {
        assert_eq!(tcp_host("127.0.0.1:5555"), Some("127.0.0.1"));
        assert_eq!(tcp_host("[::1]:5555"), Some("::1"));
        assert_eq!(tcp_host("*:5555"), Some("*"));
        assert_eq!(tcp_host("5555"), None);
        assert_eq!(tcp_host(":5555"), None);
        for host in ["127.0.0.1", "127.1.2.3", "::1", "localhost", "LOCALHOST"] {
            assert!(is_loopback(host), "{host}");
        }
        for host in ["*", "0.0.0.0", "10.0.0.1", "::", "eth0", "example.com"] {
            assert!(!is_loopback(host), "{host}");
        }
    }

    #[test]
    fn refused_endpoints() {
        for (endpoint, why) in [
            ("tcp://0.0.0.0:5555", "loopback"),
            ("tcp://*:5555", "loopback"),
            ("tcp://eth0:5555", "loopback"),
            ("tcp://5555", "tcp://HOST:PORT"),
            ("ipc://@kneepoint", "abstract"),
            ("ipc://relative/x.sock", "absolute"),
            ("udp://127.0.0.1:5555", "use ipc://"),
            ("/run/kneepoint/orchestrator.sock", "use ipc://"),
        ] {
            let err = ControlServer::bind(endpoint, BindOptions::default()).unwrap_err();
            assert!(err.to_string().contains(why), "{endpoint}: {err}");
        }
        let long = format!("ipc:///tmp/{}.sock", "x".repeat(120));
        let err = ControlServer::bind(&long, BindOptions::default()).unwrap_err();
        assert!(err.to_string().contains("longer"), "{err}");
    }

    #[test]
    fn tcp_loopback_and_explicit_remote() {
        let s = ControlServer::bind("tcp://127.0.0.1:*", BindOptions::default()).unwrap();
        assert!(
            s.endpoint().starts_with("tcp://127.0.0.1:"),
            "{}",
            s.endpoint()
        );
        assert!(!s.endpoint().ends_with(":*"));
        let remote = BindOptions { allow_remote: true };
        let s = ControlServer::bind("tcp://0.0.0.0:*", remote).unwrap();
        assert!(
            s.endpoint().starts_with("tcp://0.0.0.0:"),
            "{}",
            s.endpoint()
        );
    }

    #[test]
    fn poll_once_answers_inproc_requests() {
        let mut server =
            ControlServer::bind("inproc://poll-once-test", BindOptions::default()).unwrap();
        let mut calls = 0;
        let mut handler = |req: Request| {
            calls += 1;
            assert_eq!(req, Request::Status);
            Reply::ok()
        };
        assert_eq!(
            server
                .poll_once(&mut handler, Duration::from_millis(1))
                .unwrap(),
            Served::Idle
        );
        let client = server.ctx.as_ref().unwrap().socket(zmq::REQ).unwrap();
        client.connect("inproc://poll-once-test").unwrap();
        for (bytes, expect) in [
            (&br#"{"cmd":"status"}"#[..], "ok"),
            (b"{", "malformed"),
            (br#"{"cmd":"fly"}"#, "unknown_command"),
        ] {
            client.send(bytes, 0).unwrap();
            let served = server
                .poll_once(&mut handler, Duration::from_secs(5))
                .unwrap();
            let reply = Reply::parse(&client.recv_bytes(0).unwrap()).unwrap();
            assert_eq!(reply.error_code().unwrap_or("ok"), expect);
            assert_eq!(
                matches!(served, Served::Handled { ok: true, .. }),
                expect == "ok"
            );
        }
        client
            .send_multipart([&br#"{"cmd":"status"}"#[..], b"x"], 0)
            .unwrap();
        let served = server
            .poll_once(&mut handler, Duration::from_secs(5))
            .unwrap();
        assert!(matches!(
            served,
            Served::Refused(ControlError::Malformed(_))
        ));
        let reply = Reply::parse(&client.recv_bytes(0).unwrap()).unwrap();
        assert_eq!(reply.error_code(), Some("malformed"));
        assert_eq!(calls, 1);
    }
}
