//! kneepoint-client — send inference requests to a kneepoint platform and
//! get typed answers back, over UDP per docs/PROTOCOL.md (version 1).
//!
//! # Example
//!
//! ```no_run
//! use std::time::Duration;
//! use kneepoint_client::{Client, ClientError, Config};
//!
//! // One blocking request.
//! let client = Client::new("10.0.0.2:9000")?;
//! let image = vec![0u8; 224 * 224 * 3]; // the model's input: HxWx3 RGB u8
//! match client.infer(1, &image) {
//!     Ok(answer) => {
//!         for c in &answer.top_k {
//!             println!("class {} score {:.3}", c.class, c.score);
//!         }
//!     }
//!     Err(ClientError::Overloaded) => eprintln!("shed; try later"),
//!     Err(e) => eprintln!("{e}"),
//! }
//!
//! // Many outstanding from one socket: submit, then poll.
//! let client = Config::builder("10.0.0.2:9000")
//!     .timeout(Duration::from_millis(500))
//!     .input_len(1, 224 * 224 * 3) // a wrong-size input is refused locally
//!     .connect()?;
//! let ids: Vec<_> = (0..8).map(|_| client.submit(1, &image)).collect::<Result<_, _>>()?;
//! let mut left = ids.len();
//! while left > 0 {
//!     for (id, result) in client.poll(Duration::from_secs(1)) {
//!         println!("{id}: {:?}", result.map(|a| a.top_k.first().copied()));
//!         left -= 1;
//!     }
//! }
//! # Ok::<(), ClientError>(())
//! ```
//!
//! (`no_run`: it needs a platform. The in-process tests in this crate run
//! the same calls against a fake one.)
//!
//! # What
//!
//! - [`Client`]: one UDP socket, connected to the platform's address (so
//!   the kernel drops datagrams from anyone else), and one receiver thread
//!   that reads it. Blocking [`Client::infer`]; [`Client::submit`] +
//!   [`Client::poll`] / [`Client::wait`] for many requests outstanding.
//!   `Client` is `Send + Sync` and every method takes `&self`: share it
//!   between threads (an `Arc<Client>`, or scoped threads), each calling
//!   `infer` — they all use the one socket.
//! - [`Config`] / [`ConfigBuilder`]: payload bytes per fragment (default
//!   [`DEFAULT_FRAGMENT_PAYLOAD`] = 1024, what kp-client uses; at most
//!   [`MAX_FRAGMENT_PAYLOAD`]), the per-request timeout (default 1 s), the
//!   local bind address (default `0.0.0.0:0`), declared input sizes per
//!   if_id, and how many times `infer` retries.
//! - [`Answer`] (status OK: the top-k [`Class`]es, batch size, platform
//!   latency, round trip) or [`ClientError`]: each platform status is its
//!   own variant (`UnknownIf`, `BadRequest`, `Incomplete`, `Overloaded`,
//!   `Internal`), then `Timeout`, `Unreachable`, `WrongSize`, `EmptyInput`,
//!   `InputTooLarge`, `UnknownRequest`, `Config`, `Io`.
//! - [`Client::poll_replies`]: `poll` with each answer's [`Reply`] (status,
//!   batch size, platform latency, send and arrival instants) for error
//!   statuses too; what the load tool kp-client accounts with.
//! - [`Client::on_result`]: results of submitted requests handed to a
//!   callback on the receiver thread as they end, instead of `poll`: for
//!   an async front end (kp-gateway) that completes each request's future
//!   from there, without a thread of its own in between.
//! - [`Stats`]: what every datagram received was (answers, duplicates,
//!   late, unexpected, malformed) and how requests ended.
//! - [`Prepared`]: a request cut into its datagrams, not yet sent
//!   ([`Client::prepare`] / [`Client::prepare_with`], then
//!   [`Client::send`] or [`Client::infer_prepared`]): for a caller whose
//!   input is only stable for a while (the Python binding cuts from a
//!   numpy array while it holds the GIL and sends without it), and the
//!   path `submit` and `infer` take themselves.
//! - [`frag`]: the fragmenter, on kp-wire's header codec and geometry.
//! - `image` (cargo feature `image`): PNG/JPEG decode, resize and centre
//!   crop to a model's HxWx3 u8 input, bit for bit the Python reference of
//!   scripts/prepare_models.py (`resize_shorter_crop`); `preprocess_rgb`
//!   for a raw RGB buffer.
//! - [`labels`]: class names for class ids (a model's labels.txt) and what
//!   a client needs from a model repository's config.toml (if_id, input
//!   size, labels file), read with kp-schema's parser.
//!
//! # Design
//!
//! **Blocking threads, not async.** A platform answer is one datagram per
//! request; the work a client does per request is a few memcpys and a map
//! lookup. An async API would make every user carry a runtime (tokio, or
//! pick one of several) and its executor: the Python binding, the load tools
//! and a plain application want a blocking call. So the crate is std-only:
//! `infer` blocks, and [`Client::submit`] / [`Client::poll`] keep many
//! requests outstanding from one thread (what an event loop or the closed-loop
//! load tool needs). An async user wraps `infer` in `spawn_blocking`, or
//! polls from one task. One receiver thread per client reads the socket and
//! wakes the waiters, so any number of threads can wait at once without
//! one of them having to read for the others.
//!
//! **Request identity.** docs/PROTOCOL.md identifies a request by (source
//! address, source port, if_id, request_id), with request_id "unique per
//! client address and port while in flight". Every `Client` has its own
//! socket, so its own port: ids need only be unique within it. They count
//! up by one from a start drawn at random (clock, pid, a process-wide
//! counter, mixed): a new client that the OS gives the port of a client just
//! closed does not reuse that one's ids, which the platform still remembers
//! as answered for a while (the answered table, below) and would ignore.
//!
//! **Matching.** An answer is a request's if its request_id is outstanding
//! on this client *and* its if_id and echoed send_ts_ns (the client's wall
//! clock in ns at submission) are the request's. The first such answer ends
//! the request; any other datagram is counted in [`Stats`] and dropped:
//! a second answer (`duplicates`), an answer after the request timed out
//! (`late`), no such request (`unexpected`), not a well-formed response
//! (`malformed`). A request's result is delivered once, to `infer`, `wait`
//! or `poll`, never twice.
//!
//! **Retries, and what the same request id would mean.** The platform
//! answers a request exactly once (docs/PROTOCOL.md) and then *remembers* it
//! as answered (kp-wire's `AnsweredTable`; by default 400 ms from its first
//! fragment in the IF, longer in the if-manager for unknown if_ids):
//! fragments that arrive with the same (address, port, if_id, request_id)
//! in that window are dropped silently, not answered again. While the request
//! is still being reassembled (up to the IF's reassembly timeout, 100 ms by
//! default), re-sent fragments only fill in gaps (duplicates are ignored).
//! So re-sending under the same id could at best repair lost fragments in
//! a 100 ms window, and would never recover a lost *answer*: it would be
//! met with silence, then a timeout. Hence **a retry here is always a new
//! request with a new request id** carrying the same input; the old id is
//! abandoned, and an answer to it that still arrives is counted `late` and
//! dropped, so the caller sees one answer. Inference has no side effects,
//! so running a request twice costs only platform time.
//! [`ClientError::is_retryable`] says which errors a new attempt may cure
//! (Timeout, Incomplete, Overloaded); [`ConfigBuilder::retries`] makes
//! `infer` do that itself (default 0: no retries, since retrying an
//! overloaded platform adds load); submit/poll users resubmit themselves.
//!
//! **Unreachable.** The socket is connected, so an ICMP port-unreachable
//! from the platform's host (nothing listening) surfaces as
//! `ConnectionRefused` on it: the receiver then ends every outstanding
//! request with [`ClientError::Unreachable`] rather than let them time
//! out. Without ICMP (filtered, remote) an absent platform is a `Timeout`.
//!
//! # Limits
//!
//! - IPv4 only, as the protocol; the platform address must be IPv4.
//! - Fragments of a request go out back to back unless
//!   [`ConfigBuilder::fragment_gap`] paces them. Above
//!   1440 payload bytes per fragment a datagram no longer fits a 1500-byte
//!   MTU; the kernel IP-fragments it and the platform drops IP fragments.
//! - Timeouts are measured from just before the first fragment is sent.
//! - Dropping a `Client` stops its receiver thread, which notices within
//!   [`RECV_POLL`] (so `drop` may block that long).
//! - Duplicate/late are told apart from `unexpected` for the last 4096
//!   request ids (by id modulo 4096); only the counters depend on it.

#![deny(unsafe_code)]

use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, ToSocketAddrs, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use std::collections::HashMap;

mod book;
mod error;
pub mod frag;
#[cfg(feature = "image")]
pub mod image;
pub mod labels;

pub use book::{Received, Stats};
pub use error::{Answer, Class, ClientError, Reply, RequestId};
pub use frag::{DEFAULT_FRAGMENT_PAYLOAD, MAX_FRAGMENT_PAYLOAD};
pub use kp_wire::Status;

use book::Book;
use frag::Cut;
use kp_wire::HEADER_LEN;

/// Per-request timeout unless configured otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);

/// How long the receiver thread blocks in one `recv` before it looks at
/// timeouts and whether the client was dropped.
pub const RECV_POLL: Duration = Duration::from_millis(20);

/// Settings of a [`Client`]; made by [`Config::builder`].
#[derive(Clone, Debug)]
pub struct Config {
    platform: SocketAddrV4,
    bind: SocketAddr,
    fragment_payload: usize,
    timeout: Duration,
    input_lens: HashMap<u16, usize>,
    retries: u32,
    first_request_id: Option<u64>,
    fragment_gap: Duration,
}

impl Config {
    /// Settings for the platform at `platform` (an IPv4 `host:port`), all
    /// else default.
    pub fn builder(platform: impl ToSocketAddrs) -> ConfigBuilder {
        ConfigBuilder {
            platform: resolve_v4(platform),
            bind: SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)),
            fragment_payload: DEFAULT_FRAGMENT_PAYLOAD,
            timeout: DEFAULT_TIMEOUT,
            input_lens: HashMap::new(),
            retries: 0,
            first_request_id: None,
            fragment_gap: Duration::ZERO,
        }
    }

    /// The platform's address.
    pub fn platform(&self) -> SocketAddrV4 {
        self.platform
    }

    /// Payload bytes per fragment at most.
    pub fn fragment_payload(&self) -> usize {
        self.fragment_payload
    }

    /// The per-request timeout.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// How many times `infer` retries a retryable error.
    pub fn retries(&self) -> u32 {
        self.retries
    }
}

/// Builds a [`Config`] (see [`Config::builder`]).
#[derive(Debug)]
pub struct ConfigBuilder {
    platform: Result<SocketAddrV4, String>,
    bind: SocketAddr,
    fragment_payload: usize,
    timeout: Duration,
    input_lens: HashMap<u16, usize>,
    retries: u32,
    first_request_id: Option<u64>,
    fragment_gap: Duration,
}

impl ConfigBuilder {
    /// Local address to bind the socket to (default `0.0.0.0:0`: any
    /// address, a port the OS picks).
    pub fn bind(mut self, addr: SocketAddr) -> Self {
        self.bind = addr;
        self
    }

    /// Payload bytes per fragment at most, `1..=`[`MAX_FRAGMENT_PAYLOAD`]
    /// (default [`DEFAULT_FRAGMENT_PAYLOAD`]).
    pub fn fragment_payload(mut self, bytes: usize) -> Self {
        self.fragment_payload = bytes;
        self
    }

    /// How long a request waits for its answer (default
    /// [`DEFAULT_TIMEOUT`]); > 0.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Declares that `if_id` takes inputs of `bytes` bytes: a request of
    /// another size fails with [`ClientError::WrongSize`] without being
    /// sent (else the platform answers BAD_REQUEST).
    pub fn input_len(mut self, if_id: u16, bytes: usize) -> Self {
        self.input_lens.insert(if_id, bytes);
        self
    }

    /// How many times [`Client::infer`] tries again, each time as a new
    /// request, after an error that [`ClientError::is_retryable`] (default
    /// 0). See the crate docs on retries.
    pub fn retries(mut self, retries: u32) -> Self {
        self.retries = retries;
        self
    }

    /// The request id of the client's first request; the following ones
    /// count up by one (default: a start drawn at random, see the crate
    /// docs on request identity). For tools that want known ids (kp-client
    /// `--first-request-id`); a client reusing a recent port with the same
    /// ids would be ignored by the platform's answered table.
    pub fn first_request_id(mut self, id: u64) -> Self {
        self.first_request_id = Some(id);
        self
    }

    /// Pause between two fragments of one request (default 0: back to
    /// back). For load tools that test reassembly (kp-client
    /// `--frag-gap`); the sending thread sleeps, and the request's timeout
    /// counts from its first fragment, the pauses included.
    pub fn fragment_gap(mut self, gap: Duration) -> Self {
        self.fragment_gap = gap;
        self
    }

    /// The settings, checked.
    pub fn build(self) -> Result<Config, ClientError> {
        let platform = self.platform.map_err(ClientError::Config)?;
        if !(1..=MAX_FRAGMENT_PAYLOAD).contains(&self.fragment_payload) {
            return Err(ClientError::Config(format!(
                "fragment payload {} is outside 1..={MAX_FRAGMENT_PAYLOAD}",
                self.fragment_payload
            )));
        }
        if self.timeout.is_zero() {
            return Err(ClientError::Config("timeout must be > 0".into()));
        }
        if !self.bind.is_ipv4() {
            return Err(ClientError::Config(format!(
                "bind address {} is not IPv4 (the protocol is IPv4 only)",
                self.bind
            )));
        }
        Ok(Config {
            platform,
            bind: self.bind,
            fragment_payload: self.fragment_payload,
            timeout: self.timeout,
            input_lens: self.input_lens,
            retries: self.retries,
            first_request_id: self.first_request_id,
            fragment_gap: self.fragment_gap,
        })
    }

    /// [`build`](Self::build), then [`Client::with_config`].
    pub fn connect(self) -> Result<Client, ClientError> {
        Client::with_config(self.build()?)
    }
}

fn resolve_v4(addr: impl ToSocketAddrs) -> Result<SocketAddrV4, String> {
    let all = addr
        .to_socket_addrs()
        .map_err(|e| format!("platform address: {e}"))?;
    let mut any = false;
    for a in all {
        any = true;
        if let SocketAddr::V4(v4) = a {
            return Ok(v4);
        }
    }
    Err(if any {
        "platform address is not IPv4 (the protocol is IPv4 only)".into()
    } else {
        "platform address resolves to nothing".into()
    })
}

/// What the client and its receiver thread share.
#[derive(Debug)]
struct Shared {
    socket: UdpSocket,
    book: Mutex<Book>,
    /// Signalled whenever a request ends.
    ended: Condvar,
    next_id: AtomicU64,
    closing: AtomicBool,
    /// Datagram buffers of sent requests, for the next ones to reuse (a
    /// fresh one per request would be zeroed, or page-faulted in, every
    /// time): at most [`SPARE_BUFFERS`].
    spare: Mutex<Vec<Vec<u8>>>,
    /// Where the results of submitted requests go, once set
    /// ([`Client::on_result`]).
    hook: OnceLock<ResultHook>,
}

/// A callback for results ([`Client::on_result`]).
struct ResultHook(Box<dyn Fn(RequestId, Result<Answer, ClientError>) + Send + Sync>);

impl ResultHook {
    fn deliver(&self, ready: Vec<(RequestId, Result<Answer, ClientError>)>) {
        for (id, result) in ready {
            (self.0)(id, result);
        }
    }
}

impl std::fmt::Debug for ResultHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ResultHook")
    }
}

/// Datagram buffers a client keeps for reuse (one per request in the
/// middle of being cut or sent; ~155 KB each for a 224x224x3 image).
const SPARE_BUFFERS: usize = 8;

impl Shared {
    fn book(&self) -> MutexGuard<'_, Book> {
        // A panic elsewhere while holding the lock leaves the book as
        // consistent as any of its methods' steps; carry on.
        self.book.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A connection to one platform: one UDP socket, one receiver thread. See
/// the crate docs.
#[derive(Debug)]
pub struct Client {
    shared: Arc<Shared>,
    cfg: Config,
    receiver: Option<JoinHandle<()>>,
}

impl Client {
    /// A client of the platform at `platform` (IPv4 `host:port`), with the
    /// default [`Config`].
    pub fn new(platform: impl ToSocketAddrs) -> Result<Client, ClientError> {
        Config::builder(platform).connect()
    }

    /// A client with these settings: binds and connects its socket and
    /// starts its receiver thread.
    pub fn with_config(cfg: Config) -> Result<Client, ClientError> {
        let socket = UdpSocket::bind(cfg.bind)?;
        socket.connect(cfg.platform)?;
        let rx = socket.try_clone()?;
        rx.set_read_timeout(Some(RECV_POLL))?;
        let shared = Arc::new(Shared {
            socket,
            book: Mutex::new(Book::new()),
            ended: Condvar::new(),
            next_id: AtomicU64::new(cfg.first_request_id.unwrap_or_else(first_request_id)),
            closing: AtomicBool::new(false),
            spare: Mutex::new(Vec::new()),
            hook: OnceLock::new(),
        });
        let receiver = {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name("kneepoint-client-rx".into())
                .spawn(move || receive_loop(&rx, &shared))?
        };
        Ok(Client {
            shared,
            cfg,
            receiver: Some(receiver),
        })
    }

    /// The settings.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// The socket's local address (the platform knows the client by it).
    pub fn local_addr(&self) -> Result<SocketAddr, ClientError> {
        Ok(self.shared.socket.local_addr()?)
    }

    /// Sends `input` to inference function `if_id` and blocks until its
    /// answer, an error status, or the timeout; with
    /// [`ConfigBuilder::retries`], retryable errors are retried as new
    /// requests and the last attempt's result returned.
    pub fn infer(&self, if_id: u16, input: &[u8]) -> Result<Answer, ClientError> {
        let mut attempt = 0;
        loop {
            let id = self.send_inner(self.prepare(if_id, input)?, self.cfg.timeout, false)?;
            match self.wait(id) {
                Err(e) if e.is_retryable() && attempt < self.cfg.retries => attempt += 1,
                result => return result,
            }
        }
    }

    /// Sends `input` to `if_id` and returns at once with the request's id;
    /// its result comes from [`poll`](Self::poll) or [`wait`](Self::wait),
    /// once. Fails (nothing outstanding) on a local error: wrong or bad
    /// size, a failed send, unreachable.
    pub fn submit(&self, if_id: u16, input: &[u8]) -> Result<RequestId, ClientError> {
        self.send(self.prepare(if_id, input)?)
    }

    /// [`submit`](Self::submit) with this request's own timeout.
    pub fn submit_with_timeout(
        &self,
        if_id: u16,
        input: &[u8],
        timeout: Duration,
    ) -> Result<RequestId, ClientError> {
        if timeout.is_zero() {
            return Err(ClientError::Config("timeout must be > 0".into()));
        }
        self.send_inner(self.prepare(if_id, input)?, timeout, true)
    }

    /// Cuts `input` for `if_id` into a new request's datagrams (a new
    /// request id; the size checks of [`submit`](Self::submit)) without
    /// sending them: [`send`](Self::send) or
    /// [`infer_prepared`](Self::infer_prepared) does. `input` is read here
    /// and not after.
    pub fn prepare(&self, if_id: u16, input: &[u8]) -> Result<Prepared, ClientError> {
        self.prepare_with(if_id, input.len(), |offset, dst| {
            dst.copy_from_slice(&input[offset..offset + dst.len()]);
        })
    }

    /// [`prepare`](Self::prepare) for an input of `len` bytes that is not a
    /// slice: `fill(offset, dst)` must copy input bytes `offset..offset +
    /// dst.len()` into `dst` (each byte is asked for once, in order, in
    /// pieces of at most the fragment payload).
    pub fn prepare_with(
        &self,
        if_id: u16,
        len: usize,
        mut fill: impl FnMut(usize, &mut [u8]),
    ) -> Result<Prepared, ClientError> {
        if let Some(&expected) = self.cfg.input_lens.get(&if_id) {
            if len != expected {
                return Err(ClientError::WrongSize {
                    if_id,
                    expected,
                    got: len,
                });
            }
        }
        let (count, stride) = frag::geometry(len, self.cfg.fragment_payload)?;
        let id = self.shared.next_id.fetch_add(1, Ordering::Relaxed);
        let send_ts_ns = wall_clock_ns();
        let mut cut = Cut::new(if_id, id, send_ts_ns, len, self.cfg.fragment_payload)?;
        let slot = HEADER_LEN + stride as usize;
        let mut buf = self
            .shared
            .spare
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop()
            .unwrap_or_default();
        // Grown (zeroed) only past what it held: a reused buffer's bytes
        // are all overwritten below.
        let need = slot * usize::from(count);
        if buf.len() < need {
            buf.resize(need, 0);
        }
        let mut last_len = 0;
        for chunk in buf[..need].chunks_exact_mut(slot) {
            last_len = cut.next_with(chunk, &mut fill).map_or(0, |d| d.len());
        }
        Ok(Prepared {
            client: Arc::as_ptr(&self.shared) as usize,
            id,
            if_id,
            send_ts_ns,
            buf,
            slot,
            count,
            last_len,
        })
    }

    /// Sends a prepared request; as [`submit`](Self::submit) from then on
    /// (its result from `poll` or `wait`, once; timeout from now).
    pub fn send(&self, prepared: Prepared) -> Result<RequestId, ClientError> {
        self.send_inner(prepared, self.cfg.timeout, true)
    }

    /// Sends a prepared request and blocks until its result, as
    /// [`infer`](Self::infer) but with no retries (a retry is a new
    /// request: prepare again).
    pub fn infer_prepared(&self, prepared: Prepared) -> Result<Answer, ClientError> {
        let id = self.send_inner(prepared, self.cfg.timeout, false)?;
        self.wait(id)
    }

    /// Blocks until request `id` (from [`submit`](Self::submit)) ends, and
    /// returns its result; [`ClientError::UnknownRequest`] if it is not
    /// this client's or its result was collected already (by `wait` or
    /// `poll`). Waits at most until the request's timeout.
    pub fn wait(&self, id: RequestId) -> Result<Answer, ClientError> {
        let mut book = self.shared.book();
        loop {
            if let Some(result) = book.take(id.0) {
                return result;
            }
            let Some(deadline) = book.deadline_of(id.0) else {
                return Err(ClientError::UnknownRequest(id));
            };
            let now = Instant::now();
            if now >= deadline {
                book.expire(now);
                continue;
            }
            book = self
                .shared
                .ended
                .wait_timeout(book, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// Waits up to `timeout` for at least one submitted request to end,
    /// and returns every one that did and was not collected yet (possibly
    /// none), in the order they ended. Requests made by
    /// [`infer`](Self::infer) are never returned here.
    pub fn poll(&self, timeout: Duration) -> Vec<(RequestId, Result<Answer, ClientError>)> {
        self.poll_with(timeout, Book::take_ready)
    }

    /// [`poll`](Self::poll), each result with the [`Reply`] its answer
    /// came in (status, batch size, platform latency, when the request
    /// was sent and its answer received, whatever the status), or `None`
    /// when the request ended without an answer (timeout, unreachable).
    #[allow(clippy::type_complexity)]
    pub fn poll_replies(
        &self,
        timeout: Duration,
    ) -> Vec<(RequestId, Result<Answer, ClientError>, Option<Reply>)> {
        self.poll_with(timeout, Book::take_ready_replies)
    }

    fn poll_with<T>(&self, timeout: Duration, take: impl Fn(&mut Book) -> Vec<T>) -> Vec<T> {
        let until = Instant::now() + timeout;
        let mut book = self.shared.book();
        loop {
            let now = Instant::now();
            book.expire(now);
            if book.has_ready() {
                let ready = take(&mut book);
                if !ready.is_empty() || now >= until {
                    return ready;
                }
            }
            if now >= until {
                return Vec::new();
            }
            // Wake for the soonest request timeout too: it ends a request.
            let wake = book.next_deadline().map_or(until, |d| d.min(until));
            book = self
                .shared
                .ended
                .wait_timeout(book, wake.saturating_duration_since(now))
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// From now on, hands the result of every submitted request (`submit`,
    /// `submit_with_timeout`, `send`) to `f` as it ends, once each, instead
    /// of keeping it for [`poll`](Self::poll); results that ended before
    /// are handed over here, at once. `infer` and [`wait`](Self::wait)
    /// work as before. Set once per client
    /// ([`ClientError::Config`] the second time).
    ///
    /// `f` runs on the client's receiver thread, with no lock held: it
    /// must be quick (it delays every answer behind it) and must not
    /// block on this client (`wait`, `poll`, `infer`). It is what an
    /// async front end needs to complete a future per request: each
    /// answer costs the receiver thread's wake-up and the future's, with
    /// no thread in between (a thread blocked in `poll` would be one more
    /// cross-thread wake-up per answer). A timeout is noticed by the
    /// receiver thread, within [`RECV_POLL`] of it. Should `submit` fail
    /// after the first datagrams went out (a send error), an answer that
    /// already came for that request may have reached `f`.
    pub fn on_result(
        &self,
        f: impl Fn(RequestId, Result<Answer, ClientError>) + Send + Sync + 'static,
    ) -> Result<(), ClientError> {
        self.shared
            .hook
            .set(ResultHook(Box::new(f)))
            .map_err(|_| ClientError::Config("on_result is set once per client".into()))?;
        if let Some(hook) = self.shared.hook.get() {
            let ready = self.shared.book().take_ready();
            hook.deliver(ready);
        }
        Ok(())
    }

    /// Requests outstanding (sent, not ended).
    pub fn outstanding(&self) -> usize {
        self.shared.book().outstanding()
    }

    /// The counters so far.
    pub fn stats(&self) -> Stats {
        self.shared.book().stats()
    }

    fn send_inner(
        &self,
        p: Prepared,
        timeout: Duration,
        pollable: bool,
    ) -> Result<RequestId, ClientError> {
        if p.client != Arc::as_ptr(&self.shared) as usize {
            return Err(ClientError::Config(
                "a request prepared by another client (its request id is that client's)".into(),
            ));
        }
        // In the book before the first fragment leaves: its answer may
        // come before the last one is sent (UNKNOWN_IF does).
        self.shared.book().insert(
            p.id,
            p.if_id,
            p.send_ts_ns,
            Instant::now(),
            timeout,
            pollable,
        );
        // Up to SEND_BATCH datagrams per sendmmsg; with a fragment_gap, one
        // per call and a pause between.
        let per_call = if self.cfg.fragment_gap.is_zero() {
            SEND_BATCH
        } else {
            1
        };
        let count = usize::from(p.count);
        let mut datagrams: [&[u8]; SEND_BATCH] = [&[]; SEND_BATCH];
        let mut next = 0;
        let mut sent = Ok(());
        while next < count && sent.is_ok() {
            if next > 0 && per_call == 1 {
                std::thread::sleep(self.cfg.fragment_gap);
            }
            let n = per_call.min(count - next);
            for (k, d) in datagrams[..n].iter_mut().enumerate() {
                *d = p.datagram(next + k);
            }
            sent = send_datagrams(&self.shared.socket, &datagrams[..n]);
            next += n;
        }
        let Prepared { id, buf, .. } = p;
        let mut spare = self
            .shared
            .spare
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if spare.len() < SPARE_BUFFERS {
            spare.push(buf);
        }
        drop(spare);
        match sent {
            Ok(()) => Ok(RequestId(id)),
            Err(e) => {
                self.shared.book().forget(id);
                Err(e)
            }
        }
    }
}

/// A request cut into its datagrams and not sent yet: from
/// [`Client::prepare`] or [`Client::prepare_with`], for
/// [`Client::send`] or [`Client::infer_prepared`] of the same client
/// (its request id is that client's). Dropping it sends nothing.
#[derive(Debug)]
pub struct Prepared {
    /// The preparing client's identity (its shared state's address).
    client: usize,
    id: u64,
    if_id: u16,
    send_ts_ns: u64,
    /// `count` datagrams of `slot` bytes each (the last `last_len`).
    buf: Vec<u8>,
    slot: usize,
    count: u16,
    last_len: usize,
}

impl Prepared {
    /// Its request id (used once it is sent).
    pub fn request_id(&self) -> RequestId {
        RequestId(self.id)
    }

    /// Number of datagrams.
    pub fn frag_count(&self) -> u16 {
        self.count
    }

    /// Datagram `i` (`i < frag_count`).
    fn datagram(&self, i: usize) -> &[u8] {
        let len = if i + 1 == usize::from(self.count) {
            self.last_len
        } else {
            self.slot
        };
        &self.buf[i * self.slot..i * self.slot + len]
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        self.shared.closing.store(true, Ordering::Release);
        if let Some(receiver) = self.receiver.take() {
            // It notices within RECV_POLL; it never panics.
            let _ = receiver.join();
        }
    }
}

/// Fragments sent per `sendmmsg` call at most (a 224x224x3 image's 147
/// go in 3 calls instead of 147 `send`s).
const SEND_BATCH: usize = kp_os::net::MAX_BATCH;

/// Sends `datagrams`, in order, in as few `sendmmsg` calls as the kernel
/// takes (a partial send goes on from the first one not sent). A
/// `ConnectionRefused` is the socket reporting an ICMP port-unreachable
/// for an *earlier* datagram; so try once more, and only a second refusal
/// in a row means the platform is not there. Any other error (ENOBUFS, a
/// send buffer timeout) ends the request as `Io`, as a failed `send` did.
fn send_datagrams(socket: &UdpSocket, datagrams: &[&[u8]]) -> Result<(), ClientError> {
    let mut refused = 0;
    let mut sent = 0;
    while sent < datagrams.len() {
        match kp_os::net::send_batch(socket, &datagrams[sent..]) {
            Ok(0) => return Err(ClientError::Io(io::ErrorKind::WriteZero.into())),
            Ok(n) => {
                sent += n;
                refused = 0;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                refused += 1;
                if refused >= 2 {
                    return Err(ClientError::Unreachable);
                }
            }
            Err(e) => return Err(ClientError::Io(e)),
        }
    }
    Ok(())
}

fn receive_loop(socket: &UdpSocket, shared: &Shared) {
    // Larger than any datagram: an oversized one cannot be truncated into
    // something that parses.
    let mut buf = vec![0u8; 65_536];
    while !shared.closing.load(Ordering::Acquire) {
        let got = socket.recv(&mut buf);
        let now = Instant::now();
        let mut book = shared.book();
        let ended = match got {
            Ok(n) => usize::from(matches!(
                book.received(&buf[..n], now),
                Received::Answer(..)
            )),
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => book.fail_all_unreachable(),
            // WouldBlock / TimedOut: the read timeout; anything else is
            // transient for a UDP socket, and not this thread's to report.
            Err(_) => 0,
        };
        let ended = ended + book.expire(now);
        // Results for the on_result callback are taken under this lock
        // (not a second one); the callback runs and waiters are notified
        // after unlocking, so a woken waiter finds the lock free.
        let hook = shared.hook.get().filter(|_| ended > 0);
        let ready = hook.map(|_| book.take_ready());
        drop(book);
        if let (Some(hook), Some(ready)) = (hook, ready) {
            hook.deliver(ready);
        }
        if ended > 0 {
            shared.ended.notify_all();
        }
    }
}

/// Wall-clock nanoseconds, the `send_ts_ns` of a request (only echoed).
fn wall_clock_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// A request id start no other client is likely to use: the clock, the
/// pid and a process-wide counter, through splitmix64.
fn first_request_id() -> u64 {
    static CLIENTS: AtomicU64 = AtomicU64::new(0);
    let n = CLIENTS.fetch_add(1, Ordering::Relaxed);
    let mut x = wall_clock_ns() ^ (u64::from(std::process::id()) << 32) ^ n.rotate_left(17);
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_is_send_and_sync() {
        fn is<T: Send + Sync>() {}
        is::<Client>();
        is::<ClientError>();
        is::<Answer>();
    }

    #[test]
    fn request_ids_are_unique_across_threads_and_clients() {
        let sink = UdpSocket::bind("127.0.0.1:0").unwrap();
        let a = Arc::new(
            Config::builder(sink.local_addr().unwrap())
                .timeout(Duration::from_secs(30))
                .connect()
                .unwrap(),
        );
        let b = Client::new(sink.local_addr().unwrap()).unwrap();
        let mut ids: Vec<u64> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..4)
                .map(|_| {
                    let a = &a;
                    s.spawn(move || {
                        (0..250)
                            .map(|_| a.submit(1, &[1, 2, 3]).unwrap().0)
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
        });
        let from_b: Vec<u64> = (0..10).map(|_| b.submit(1, &[1]).unwrap().0).collect();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), 1000, "ids repeat within a client");
        assert!(
            from_b.iter().all(|id| ids.binary_search(id).is_err()),
            "two clients drew overlapping ids"
        );
        assert_eq!(a.outstanding(), 1000);
        assert_ne!(first_request_id(), first_request_id());
    }

    #[test]
    fn config_is_checked() {
        let c = |b: ConfigBuilder| b.build().map(|_| ()).unwrap_err().to_string();
        assert!(c(Config::builder("127.0.0.1:9").fragment_payload(0)).contains("payload"));
        assert!(c(Config::builder("127.0.0.1:9").fragment_payload(65_476)).contains("payload"));
        assert!(c(Config::builder("127.0.0.1:9").timeout(Duration::ZERO)).contains("timeout"));
        assert!(c(Config::builder("[::1]:9")).contains("IPv4"));
        assert!(Config::builder("127.0.0.1:9")
            .fragment_payload(MAX_FRAGMENT_PAYLOAD)
            .build()
            .is_ok());
    }

    #[test]
    fn wrong_size_and_empty_inputs_are_refused_before_sending() {
        let sink = UdpSocket::bind("127.0.0.1:0").unwrap();
        sink.set_nonblocking(true).unwrap();
        let c = Config::builder(sink.local_addr().unwrap())
            .input_len(3, 12)
            .connect()
            .unwrap();
        assert!(matches!(
            c.infer(3, &[0; 11]),
            Err(ClientError::WrongSize {
                if_id: 3,
                expected: 12,
                got: 11
            })
        ));
        assert!(matches!(c.submit(4, &[]), Err(ClientError::EmptyInput)));
        let mut buf = [0u8; 64];
        assert!(sink.recv(&mut buf).is_err(), "nothing was sent");
        assert_eq!(c.outstanding(), 0);
        assert_eq!(c.stats().submitted, 0);
    }
}
