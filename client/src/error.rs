//! What a request ends in: an [`Answer`] or a [`ClientError`].

use std::io;
use std::time::{Duration, Instant};

use kp_wire::Status;

/// A client-chosen request id (the protocol's `request_id`), unique per
/// [`Client`](crate::Client).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestId(pub u64);

impl std::fmt::Display for RequestId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "#{:016x}", self.0)
    }
}

/// One `(class, score)` of an answer's top-k.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Class {
    /// Index of the class in the model's output.
    pub class: u32,
    /// The model's raw output at that index (the platform applies no
    /// softmax of its own; a model that ends in one gives probabilities).
    pub score: f32,
}

/// A status-OK answer.
#[derive(Clone, Debug, PartialEq)]
pub struct Answer {
    /// The request it answers.
    pub request_id: RequestId,
    /// The inference function that answered.
    pub if_id: u16,
    /// The IF's top-k, highest score first (as on the wire).
    pub top_k: Vec<Class>,
    /// Size of the batch the request was inferred in.
    pub batch_size: u16,
    /// The platform's time from the request's first fragment to the
    /// answer, µs.
    pub platform_latency_us: u32,
    /// Client-side round trip: from just before the first fragment was
    /// sent to the answer's arrival at the client's receiver.
    pub rtt: Duration,
}

/// How a request's answer came, whatever its status (OK or an error
/// status): what [`Client::poll_replies`](crate::Client::poll_replies)
/// returns beside each answered request's result. A load tool needs it for
/// error answers too (their round trip and platform latency), which
/// [`ClientError`] does not carry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reply {
    /// The answer's status.
    pub status: Status,
    /// Its batch size (0 in error answers).
    pub batch_size: u16,
    /// The platform's time from the request's first fragment to the
    /// answer, µs.
    pub platform_latency_us: u32,
    /// When the request was recorded as sent: just before its first
    /// fragment (what its timeout and [`Answer::rtt`] count from).
    pub sent_at: Instant,
    /// When the receiver thread had the answer (`received_at - sent_at`
    /// is the round trip).
    pub received_at: Instant,
}

/// Why a request got no [`Answer`], or could not be sent.
///
/// The first five are the platform's error statuses (docs/PROTOCOL.md),
/// each its own variant; the rest are the client's.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// UNKNOWN_IF: no inference function is deployed under that if_id.
    #[error("UNKNOWN_IF: no inference function is deployed under if_id {if_id}")]
    UnknownIf {
        /// The if_id asked for.
        if_id: u16,
    },
    /// BAD_REQUEST: the input's length is not the model's input size, or
    /// the fragments disagreed.
    #[error("BAD_REQUEST: if_id {if_id} refused the request (input size not the model's?)")]
    BadRequest {
        /// The if_id asked for.
        if_id: u16,
    },
    /// INCOMPLETE: not all fragments reached the platform within its
    /// reassembly timeout (fragments lost on the way).
    #[error("INCOMPLETE: not all fragments reached the platform in time")]
    Incomplete,
    /// OVERLOADED: shed, the request could not be served within its SLO
    /// or queues were full. Retrying later may succeed.
    #[error("OVERLOADED: the platform shed the request")]
    Overloaded,
    /// INTERNAL: the inference function failed on this request.
    #[error("INTERNAL: the inference function failed on this request")]
    Internal,
    /// No answer within the request's timeout. It may still have been
    /// inferred: its answer may have been lost, or may come late (a late
    /// answer is dropped and counted, never delivered).
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// The platform's host said nothing listens on its port (an ICMP port
    /// unreachable, seen by the socket). Without one (a firewall, a
    /// dropped packet) an absent platform shows as [`ClientError::Timeout`].
    #[error("platform unreachable: nothing listens on its address")]
    Unreachable,
    /// The caller declared if_id's input size
    /// ([`ConfigBuilder::input_len`](crate::ConfigBuilder::input_len)) and
    /// the input differs; nothing was sent.
    #[error("input is {got} bytes, if_id {if_id} takes {expected}")]
    WrongSize {
        /// The if_id asked for.
        if_id: u16,
        /// Declared input size.
        expected: usize,
        /// The input's size.
        got: usize,
    },
    /// An empty input (the protocol's `total_len` is at least 1).
    #[error("empty input: a request carries at least one byte")]
    EmptyInput,
    /// The input does not fit a request: over 4 GiB, or more than 65535
    /// fragments at this payload size.
    #[error("input of {len} bytes does not fit a request at {payload} bytes per fragment")]
    InputTooLarge {
        /// The input's size.
        len: usize,
        /// Payload bytes per fragment.
        payload: usize,
    },
    /// [`Client::wait`](crate::Client::wait) for an id that this client
    /// has no result pending or waiting for (never submitted, already
    /// collected, or collected by [`Client::poll`](crate::Client::poll)).
    #[error("request {0} is not outstanding on this client")]
    UnknownRequest(RequestId),
    /// A setting that cannot work (fragment payload size, address).
    #[error("bad configuration: {0}")]
    Config(String),
    /// A socket error (binding, sending).
    #[error("socket: {0}")]
    Io(#[from] io::Error),
}

impl ClientError {
    /// The error for a platform status; `None` for OK.
    pub fn from_status(status: Status, if_id: u16) -> Option<ClientError> {
        Some(match status {
            Status::Ok => return None,
            Status::UnknownIf => ClientError::UnknownIf { if_id },
            Status::BadRequest => ClientError::BadRequest { if_id },
            Status::Incomplete => ClientError::Incomplete,
            Status::Overloaded => ClientError::Overloaded,
            Status::Internal => ClientError::Internal,
        })
    }

    /// The platform's status this error stands for, if it is one.
    pub fn status(&self) -> Option<Status> {
        Some(match self {
            ClientError::UnknownIf { .. } => Status::UnknownIf,
            ClientError::BadRequest { .. } => Status::BadRequest,
            ClientError::Incomplete => Status::Incomplete,
            ClientError::Overloaded => Status::Overloaded,
            ClientError::Internal => Status::Internal,
            _ => return None,
        })
    }

    /// Whether sending the same input again as a *new* request may
    /// succeed: [`Timeout`](ClientError::Timeout),
    /// [`Incomplete`](ClientError::Incomplete) (lost fragments) and
    /// [`Overloaded`](ClientError::Overloaded). Not the others: they
    /// would fail again the same way (or, for INTERNAL, fail the model
    /// again).
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            ClientError::Timeout(_) | ClientError::Incomplete | ClientError::Overloaded
        )
    }
}
