//! The kneepoint messages of docs/PROTOCOL.md: request fragments (type 1),
//! responses (type 2) and errors (type 3).
//!
//! [`Fragment`] and [`Response`] are zero-copy views over a UDP payload that
//! can only be built by `new_checked`, which enforces every rule of
//! docs/PROTOCOL.md that one datagram can be checked against; their accessors then
//! read the fields in place. [`FragmentRepr`] and [`ResponseRepr`] are the
//! plain-data forms the rest of the platform passes around and emits.
//!
//! Rules that need more than one datagram (all fragments of a request agree
//! on `total_len`, `frag_count` and `send_ts_ns`; duplicates are ignored)
//! belong to the reassembler, keyed by [`RequestKey`].

use core::fmt;
use core::ops::Range;
use std::net::Ipv4Addr;

use thiserror::Error;

/// `KNPT`, the first four bytes of every kneepoint message.
pub const MAGIC: u32 = 0x4B4E_5054;
/// The protocol version this codec speaks.
pub const VERSION: u8 = 1;
/// Length of a request fragment's header; the payload follows it.
pub const HEADER_LEN: usize = 32;
/// Length of a response's or error's header; the results follow it.
pub const RESPONSE_HEADER_LEN: usize = 36;
/// Length of one result: `{ u32 class_index, f32 score }`.
pub const RESULT_LEN: usize = 8;
/// The most results one response can carry (`k` is a `u16` on the wire).
pub const MAX_RESULTS: usize = u16::MAX as usize;

/// Byte ranges of the header fields (docs/PROTOCOL.md's tables).
mod field {
    use core::ops::Range;

    pub const MAGIC: Range<usize> = 0..4;
    pub const VERSION: usize = 4;
    pub const TYPE: usize = 5;
    pub const IF_ID: Range<usize> = 6..8;
    pub const REQUEST_ID: Range<usize> = 8..16;

    // request fragment
    pub const TOTAL_LEN: Range<usize> = 16..20;
    pub const FRAG_INDEX: Range<usize> = 20..22;
    pub const FRAG_COUNT: Range<usize> = 22..24;
    pub const FRAG_SEND_TS: Range<usize> = 24..32;

    // response / error
    pub const RESP_SEND_TS: Range<usize> = 16..24;
    pub const STATUS: Range<usize> = 24..28;
    pub const K: Range<usize> = 28..30;
    pub const BATCH_SIZE: Range<usize> = 30..32;
    pub const LATENCY_US: Range<usize> = 32..36;
}

/// Reads `N` bytes at `range`; zeros if `buf` is too short. The views only
/// call this on ranges `new_checked` has proven in bounds, so the fallback is
/// never taken — it exists so that no accessor can panic, whatever `T`'s
/// `AsRef` does.
#[inline]
fn array<const N: usize>(buf: &[u8], range: Range<usize>) -> [u8; N] {
    buf.get(range)
        .and_then(|b| <[u8; N]>::try_from(b).ok())
        .unwrap_or([0; N])
}

#[inline]
fn get_u16(buf: &[u8], range: Range<usize>) -> u16 {
    u16::from_be_bytes(array(buf, range))
}

#[inline]
fn get_u32(buf: &[u8], range: Range<usize>) -> u32 {
    u32::from_be_bytes(array(buf, range))
}

#[inline]
fn get_u64(buf: &[u8], range: Range<usize>) -> u64 {
    u64::from_be_bytes(array(buf, range))
}

#[inline]
fn get_u8(buf: &[u8], at: usize) -> u8 {
    buf.get(at).copied().unwrap_or(0)
}

/// Identifies an inference function (a deployed model) on the wire.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct IfId(pub u16);

impl fmt::Debug for IfId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "if{}", self.0)
    }
}

impl fmt::Display for IfId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "if{}", self.0)
    }
}

impl From<u16> for IfId {
    fn from(id: u16) -> Self {
        IfId(id)
    }
}

impl From<IfId> for u16 {
    fn from(id: IfId) -> Self {
        id.0
    }
}

/// The `type` byte of a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum MsgType {
    /// A request fragment, client -> platform.
    Request = 1,
    /// A response with results, platform -> client.
    Response = 2,
    /// An error (no results), platform -> client.
    Error = 3,
}

impl MsgType {
    /// The message type with this wire value, if any.
    pub fn from_u8(value: u8) -> Option<MsgType> {
        match value {
            1 => Some(MsgType::Request),
            2 => Some(MsgType::Response),
            3 => Some(MsgType::Error),
            _ => None,
        }
    }
}

/// The `status` of a response or error (docs/PROTOCOL.md's status table).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum Status {
    /// Inferred.
    Ok = 0,
    /// No inference function is deployed under that `if_id`.
    UnknownIf = 1,
    /// `total_len` does not match the model's input size, or the fragments
    /// disagree.
    BadRequest = 2,
    /// Not all fragments arrived within the reassembly timeout.
    Incomplete = 3,
    /// Shed: could not be served within its SLO, or queues were full.
    Overloaded = 4,
    /// The inference function failed on this request.
    Internal = 5,
}

impl Status {
    /// Every status, in wire-value order.
    pub const ALL: [Status; 6] = [
        Status::Ok,
        Status::UnknownIf,
        Status::BadRequest,
        Status::Incomplete,
        Status::Overloaded,
        Status::Internal,
    ];

    /// The status with this wire value, if any.
    pub fn from_u32(value: u32) -> Option<Status> {
        match value {
            0 => Some(Status::Ok),
            1 => Some(Status::UnknownIf),
            2 => Some(Status::BadRequest),
            3 => Some(Status::Incomplete),
            4 => Some(Status::Overloaded),
            5 => Some(Status::Internal),
            _ => None,
        }
    }

    /// The name docs/PROTOCOL.md gives it: `"OK"`, `"UNKNOWN_IF"`, ...
    pub fn name(self) -> &'static str {
        match self {
            Status::Ok => "OK",
            Status::UnknownIf => "UNKNOWN_IF",
            Status::BadRequest => "BAD_REQUEST",
            Status::Incomplete => "INCOMPLETE",
            Status::Overloaded => "OVERLOADED",
            Status::Internal => "INTERNAL",
        }
    }

    /// snake_case name, for counters: `"ok"`, `"unknown_if"`, ...
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::UnknownIf => "unknown_if",
            Status::BadRequest => "bad_request",
            Status::Incomplete => "incomplete",
            Status::Overloaded => "overloaded",
            Status::Internal => "internal",
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The output buffer cannot hold what is being written.
///
/// `got` is the room there was: the buffer's length, or the format's own
/// limit where that is smaller (an IPv4 datagram carries at most
/// [`MAX_UDP_PAYLOAD`](super::MAX_UDP_PAYLOAD) bytes of UDP payload; a
/// response at most [`MAX_RESULTS`] results).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
#[error("output needs {needed} bytes, has room for {got}")]
pub struct BufferTooSmall {
    /// Bytes the output needs.
    pub needed: usize,
    /// Bytes of room there were.
    pub got: usize,
}

/// Identifies a request (docs/PROTOCOL.md): (source IPv4 address, source UDP
/// port, `if_id`, `request_id`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct RequestKey {
    /// The client's IPv4 address.
    pub src_ip: Ipv4Addr,
    /// The client's UDP port.
    pub src_port: u16,
    /// The inference function the request is for.
    pub if_id: IfId,
    /// Chosen by the client, unique per address and port while in flight.
    pub request_id: u64,
}

// ---------------------------------------------------------------------------
// Fragment geometry
// ---------------------------------------------------------------------------

/// Bytes per fragment (all but possibly the last): `ceil(total_len /
/// frag_count)`.
///
/// `None` for geometry docs/PROTOCOL.md calls malformed: `total_len == 0`,
/// `frag_count == 0`, or a last fragment left empty (`(frag_count-1)*stride
/// >= total_len`).
pub fn stride(total_len: u32, frag_count: u16) -> Option<u32> {
    check_geometry(total_len, frag_count).ok()
}

/// The bytes `[start, end)` of the request payload that fragment `index`
/// carries; `None` if the geometry is invalid (see [`stride`]) or `index >=
/// frag_count`. Every fragment of a valid geometry is non-empty, and the
/// fragments cover `[0, total_len)` exactly, in order.
pub fn fragment_range(total_len: u32, frag_count: u16, index: u16) -> Option<Range<usize>> {
    if index >= frag_count {
        return None;
    }
    let stride = stride(total_len, frag_count)?;
    Some(range_of(total_len, stride, index))
}

/// Fragment `index`'s range, for a geometry already checked.
#[inline]
fn range_of(total_len: u32, stride: u32, index: u16) -> Range<usize> {
    // u64: index * stride and start + stride can exceed u32 (but not u64).
    let start = u64::from(index) * u64::from(stride);
    let end = (start + u64::from(stride)).min(u64::from(total_len));
    let start = start.min(end);
    // Both are <= total_len, a u32, so they fit a usize on every platform
    // with std and 32-bit or wider pointers.
    usize::try_from(start).unwrap_or(usize::MAX)..usize::try_from(end).unwrap_or(usize::MAX)
}

/// `Ok(stride)` or the geometry rule `(total_len, frag_count)` breaks.
#[inline]
fn check_geometry(total_len: u32, frag_count: u16) -> Result<u32, HeaderError> {
    if total_len == 0 {
        return Err(HeaderError::ZeroTotalLen);
    }
    if frag_count == 0 {
        return Err(HeaderError::ZeroFragCount);
    }
    let stride = total_len.div_ceil(u32::from(frag_count));
    if u64::from(frag_count - 1) * u64::from(stride) >= u64::from(total_len) {
        return Err(HeaderError::EmptyLastFragment {
            total_len,
            frag_count,
        });
    }
    Ok(stride)
}

// ---------------------------------------------------------------------------
// Request fragments
// ---------------------------------------------------------------------------

/// Why a datagram is not a well-formed request fragment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
pub enum HeaderError {
    /// Shorter than the 32-byte header.
    #[error("datagram of {len} bytes is shorter than the {HEADER_LEN}-byte header")]
    TooShort {
        /// The datagram's length.
        len: usize,
    },
    /// The first four bytes are not `KNPT`.
    #[error("bad magic {0:#010x} (expected {MAGIC:#010x})")]
    BadMagic(u32),
    /// A protocol version this codec does not speak.
    #[error("unsupported protocol version {0} (expected {VERSION})")]
    BadVersion(u8),
    /// Not a request fragment (type 1).
    #[error("message type {0} is not a request fragment (1)")]
    BadType(u8),
    /// `total_len` is 0.
    #[error("total_len is 0")]
    ZeroTotalLen,
    /// `frag_count` is 0.
    #[error("frag_count is 0")]
    ZeroFragCount,
    /// `frag_index >= frag_count`.
    #[error("frag_index {index} is out of range for frag_count {count}")]
    IndexOutOfRange {
        /// `frag_index`.
        index: u16,
        /// `frag_count`.
        count: u16,
    },
    /// The geometry leaves the last fragment empty.
    #[error("total_len {total_len} cut into {frag_count} fragments leaves the last one empty")]
    EmptyLastFragment {
        /// `total_len`.
        total_len: u32,
        /// `frag_count`.
        frag_count: u16,
    },
    /// The payload's length is not the one the geometry implies.
    #[error("fragment payload is {got} bytes, its geometry implies {expected}")]
    PayloadLength {
        /// Length implied by `total_len`, `frag_count` and `frag_index`.
        expected: usize,
        /// Length of the payload that came.
        got: usize,
    },
}

impl HeaderError {
    /// The error without its details, for per-reason counters.
    pub fn kind(&self) -> MalformedKind {
        match self {
            HeaderError::TooShort { .. } => MalformedKind::TooShort,
            HeaderError::BadMagic(_) => MalformedKind::BadMagic,
            HeaderError::BadVersion(_) => MalformedKind::BadVersion,
            HeaderError::BadType(_) => MalformedKind::BadType,
            HeaderError::ZeroTotalLen => MalformedKind::ZeroTotalLen,
            HeaderError::ZeroFragCount => MalformedKind::ZeroFragCount,
            HeaderError::IndexOutOfRange { .. } => MalformedKind::IndexOutOfRange,
            HeaderError::EmptyLastFragment { .. } => MalformedKind::EmptyLastFragment,
            HeaderError::PayloadLength { .. } => MalformedKind::PayloadLength,
        }
    }
}

/// One variant per [`HeaderError`] variant, without the details: the reason a
/// fragment is counted as malformed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MalformedKind {
    /// [`HeaderError::TooShort`].
    TooShort,
    /// [`HeaderError::BadMagic`].
    BadMagic,
    /// [`HeaderError::BadVersion`].
    BadVersion,
    /// [`HeaderError::BadType`].
    BadType,
    /// [`HeaderError::ZeroTotalLen`].
    ZeroTotalLen,
    /// [`HeaderError::ZeroFragCount`].
    ZeroFragCount,
    /// [`HeaderError::IndexOutOfRange`].
    IndexOutOfRange,
    /// [`HeaderError::EmptyLastFragment`].
    EmptyLastFragment,
    /// [`HeaderError::PayloadLength`].
    PayloadLength,
}

impl MalformedKind {
    /// Every kind, in the order `Fragment::new_checked` checks them.
    pub const ALL: [MalformedKind; 9] = [
        MalformedKind::TooShort,
        MalformedKind::BadMagic,
        MalformedKind::BadVersion,
        MalformedKind::BadType,
        MalformedKind::ZeroTotalLen,
        MalformedKind::ZeroFragCount,
        MalformedKind::IndexOutOfRange,
        MalformedKind::EmptyLastFragment,
        MalformedKind::PayloadLength,
    ];

    /// snake_case name, for counters.
    pub fn name(self) -> &'static str {
        match self {
            MalformedKind::TooShort => "too_short",
            MalformedKind::BadMagic => "bad_magic",
            MalformedKind::BadVersion => "bad_version",
            MalformedKind::BadType => "bad_type",
            MalformedKind::ZeroTotalLen => "zero_total_len",
            MalformedKind::ZeroFragCount => "zero_frag_count",
            MalformedKind::IndexOutOfRange => "index_out_of_range",
            MalformedKind::EmptyLastFragment => "empty_last_fragment",
            MalformedKind::PayloadLength => "payload_length",
        }
    }
}

impl fmt::Display for MalformedKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A checked, zero-copy view of a request fragment (a UDP payload).
///
/// Only [`Fragment::new_checked`] builds one, so every accessor reads a
/// field that is known to be there and to satisfy docs/PROTOCOL.md.
#[derive(Clone, Copy)]
pub struct Fragment<T: AsRef<[u8]>> {
    buf: T,
    /// `ceil(total_len / frag_count)`, computed once by `new_checked`.
    stride: u32,
}

impl<T: AsRef<[u8]>> Fragment<T> {
    /// Checks `buf` against every request-fragment rule of docs/PROTOCOL.md that
    /// one datagram can be checked against, in this order: length >= 32,
    /// magic, version, type == 1, `total_len >= 1`, `frag_count >= 1`,
    /// `frag_index < frag_count`, last fragment non-empty, and the payload
    /// length equal to the one the geometry implies for this fragment.
    pub fn new_checked(buf: T) -> Result<Self, HeaderError> {
        let b = buf.as_ref();
        if b.len() < HEADER_LEN {
            return Err(HeaderError::TooShort { len: b.len() });
        }
        check_common(b, MsgType::Request).map_err(|e| match e {
            CommonError::Magic(m) => HeaderError::BadMagic(m),
            CommonError::Version(v) => HeaderError::BadVersion(v),
            CommonError::Type(t) => HeaderError::BadType(t),
        })?;
        let total_len = get_u32(b, field::TOTAL_LEN);
        let index = get_u16(b, field::FRAG_INDEX);
        let count = get_u16(b, field::FRAG_COUNT);
        // Zero checks come first so a zero frag_count is reported as such,
        // not as an index out of range.
        if total_len == 0 {
            return Err(HeaderError::ZeroTotalLen);
        }
        if count == 0 {
            return Err(HeaderError::ZeroFragCount);
        }
        if index >= count {
            return Err(HeaderError::IndexOutOfRange { index, count });
        }
        let stride = check_geometry(total_len, count)?;
        let expected = range_of(total_len, stride, index).len();
        let got = b.len() - HEADER_LEN;
        if got != expected {
            return Err(HeaderError::PayloadLength { expected, got });
        }
        Ok(Fragment { buf, stride })
    }

    /// The inference function the request is for.
    #[inline]
    pub fn if_id(&self) -> IfId {
        IfId(get_u16(self.buf.as_ref(), field::IF_ID))
    }

    /// The client's id for the request.
    #[inline]
    pub fn request_id(&self) -> u64 {
        get_u64(self.buf.as_ref(), field::REQUEST_ID)
    }

    /// Length of the whole request payload (>= 1).
    #[inline]
    pub fn total_len(&self) -> u32 {
        get_u32(self.buf.as_ref(), field::TOTAL_LEN)
    }

    /// 0-based index of this fragment (< `frag_count`).
    #[inline]
    pub fn frag_index(&self) -> u16 {
        get_u16(self.buf.as_ref(), field::FRAG_INDEX)
    }

    /// Number of fragments of the request (>= 1).
    #[inline]
    pub fn frag_count(&self) -> u16 {
        get_u16(self.buf.as_ref(), field::FRAG_COUNT)
    }

    /// The client's timestamp, echoed back in the answer.
    #[inline]
    pub fn send_ts_ns(&self) -> u64 {
        get_u64(self.buf.as_ref(), field::FRAG_SEND_TS)
    }

    /// This fragment's bytes of the request payload (never empty).
    #[inline]
    pub fn payload(&self) -> &[u8] {
        self.buf.as_ref().get(HEADER_LEN..).unwrap_or(&[])
    }

    /// `ceil(total_len / frag_count)`: bytes per fragment but the last.
    #[inline]
    pub fn stride(&self) -> u32 {
        self.stride
    }

    /// Where this payload goes in the request: `frag_index * stride`.
    #[inline]
    pub fn payload_offset(&self) -> usize {
        range_of(self.total_len(), self.stride, self.frag_index()).start
    }

    /// The bytes of the request payload this fragment carries:
    /// `payload_offset()..payload_offset() + payload().len()`.
    #[inline]
    pub fn payload_range(&self) -> Range<usize> {
        range_of(self.total_len(), self.stride, self.frag_index())
    }

    /// The whole datagram, header included.
    #[inline]
    pub fn as_bytes(&self) -> &[u8] {
        self.buf.as_ref()
    }

    /// Gives the buffer back.
    #[inline]
    pub fn into_inner(self) -> T {
        self.buf
    }
}

impl<T: AsRef<[u8]>> fmt::Debug for Fragment<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fragment")
            .field("if_id", &self.if_id())
            .field("request_id", &self.request_id())
            .field("total_len", &self.total_len())
            .field("frag_index", &self.frag_index())
            .field("frag_count", &self.frag_count())
            .field("send_ts_ns", &self.send_ts_ns())
            .field("payload_len", &self.payload().len())
            .finish()
    }
}

/// The header fields of a request fragment, as plain data.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FragmentRepr {
    /// The inference function the request is for.
    pub if_id: IfId,
    /// The client's id for the request.
    pub request_id: u64,
    /// Length of the whole request payload.
    pub total_len: u32,
    /// 0-based index of this fragment.
    pub frag_index: u16,
    /// Number of fragments of the request.
    pub frag_count: u16,
    /// The client's timestamp.
    pub send_ts_ns: u64,
}

impl FragmentRepr {
    /// The header of a checked fragment.
    pub fn parse<T: AsRef<[u8]>>(f: &Fragment<T>) -> Self {
        FragmentRepr {
            if_id: f.if_id(),
            request_id: f.request_id(),
            total_len: f.total_len(),
            frag_index: f.frag_index(),
            frag_count: f.frag_count(),
            send_ts_ns: f.send_ts_ns(),
        }
    }

    /// The bytes of the request payload this fragment must carry; `None`
    /// if the fields break a geometry rule.
    pub fn payload_range(&self) -> Option<Range<usize>> {
        fragment_range(self.total_len, self.frag_count, self.frag_index)
    }

    /// Writes the 32-byte header into `buf[..32]`. The fields are written
    /// as they are, valid or not (tests and traffic tools emit malformed
    /// headers on purpose); the payload goes at `buf[32..]`.
    pub fn emit_header(&self, buf: &mut [u8]) -> Result<(), BufferTooSmall> {
        let got = buf.len();
        let Some(h) = buf.get_mut(..HEADER_LEN) else {
            return Err(BufferTooSmall {
                needed: HEADER_LEN,
                got,
            });
        };
        h[field::MAGIC].copy_from_slice(&MAGIC.to_be_bytes());
        h[field::VERSION] = VERSION;
        h[field::TYPE] = MsgType::Request as u8;
        h[field::IF_ID].copy_from_slice(&self.if_id.0.to_be_bytes());
        h[field::REQUEST_ID].copy_from_slice(&self.request_id.to_be_bytes());
        h[field::TOTAL_LEN].copy_from_slice(&self.total_len.to_be_bytes());
        h[field::FRAG_INDEX].copy_from_slice(&self.frag_index.to_be_bytes());
        h[field::FRAG_COUNT].copy_from_slice(&self.frag_count.to_be_bytes());
        h[field::FRAG_SEND_TS].copy_from_slice(&self.send_ts_ns.to_be_bytes());
        Ok(())
    }
}

/// The `type` byte that turns a request fragment into a **shed notice**.
///
/// Internal to the platform: it never goes on the wire. When the if-manager
/// cannot deliver a fragment because its IF's ring is full, it overwrites
/// this one byte of the fragment (in the mbuf it already holds) and enqueues
/// it into headroom it keeps free on the ring for such notices. The IF
/// answers the request OVERLOADED, once, and frees whatever it had of it;
/// the if-manager drops the request's later fragments. That is how a request
/// all of whose fragments met a full ring still gets its one answer. A
/// datagram arriving from a client with this type is malformed (`BadType`),
/// like any type other than 1.
pub const SHED_NOTICE_TYPE: u8 = 0x81;

/// Turns the kneepoint message `fragment` (a checked request fragment, from
/// its header on) into a shed notice in place; false if it is shorter than
/// a header.
pub fn mark_shed_notice(fragment: &mut [u8]) -> bool {
    if fragment.len() < HEADER_LEN {
        return false;
    }
    fragment[field::TYPE] = SHED_NOTICE_TYPE;
    true
}

/// The header of `buf` if it is a shed notice ([`SHED_NOTICE_TYPE`]): the
/// fields of the fragment it was made from, as they were (the if-manager
/// checked them before).
pub fn parse_shed_notice(buf: &[u8]) -> Option<FragmentRepr> {
    if buf.len() < HEADER_LEN
        || get_u32(buf, field::MAGIC) != MAGIC
        || get_u8(buf, field::VERSION) != VERSION
        || get_u8(buf, field::TYPE) != SHED_NOTICE_TYPE
    {
        return None;
    }
    Some(FragmentRepr {
        if_id: IfId(get_u16(buf, field::IF_ID)),
        request_id: get_u64(buf, field::REQUEST_ID),
        total_len: get_u32(buf, field::TOTAL_LEN),
        frag_index: get_u16(buf, field::FRAG_INDEX),
        frag_count: get_u16(buf, field::FRAG_COUNT),
        send_ts_ns: get_u64(buf, field::FRAG_SEND_TS),
    })
}

/// The first checks shared by both views (length already checked).
enum CommonError {
    Magic(u32),
    Version(u8),
    Type(u8),
}

#[inline]
fn check_common(b: &[u8], want: MsgType) -> Result<(), CommonError> {
    let magic = get_u32(b, field::MAGIC);
    if magic != MAGIC {
        return Err(CommonError::Magic(magic));
    }
    let version = get_u8(b, field::VERSION);
    if version != VERSION {
        return Err(CommonError::Version(version));
    }
    let ty = get_u8(b, field::TYPE);
    let ok = match want {
        MsgType::Request => ty == MsgType::Request as u8,
        // Response views accept both answer types.
        MsgType::Response | MsgType::Error => {
            ty == MsgType::Response as u8 || ty == MsgType::Error as u8
        }
    };
    if !ok {
        return Err(CommonError::Type(ty));
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Responses and errors
// ---------------------------------------------------------------------------

/// A response (type 2) or error (type 3), as plain data, to emit.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ResponseRepr<'a> {
    /// [`MsgType::Response`] or [`MsgType::Error`]; [`emit`](Self::emit)
    /// writes whatever is here.
    pub msg_type: MsgType,
    /// As in the request.
    pub if_id: IfId,
    /// As in the request.
    pub request_id: u64,
    /// Echoed from the request.
    pub send_ts_ns: u64,
    /// How the request ended.
    pub status: Status,
    /// Size of the batch the request was inferred in (0 for an error).
    pub batch_size: u16,
    /// Platform time from the first fragment received to the answer sent.
    pub latency_us: u32,
    /// `(class_index, score)`, highest score first; empty for an error.
    /// `k` on the wire is `results.len()`.
    pub results: &'a [(u32, f32)],
}

impl<'a> ResponseRepr<'a> {
    /// An error answer (type 3): no results, batch size 0.
    pub fn error(
        if_id: IfId,
        request_id: u64,
        send_ts_ns: u64,
        status: Status,
        latency_us: u32,
    ) -> Self {
        ResponseRepr {
            msg_type: MsgType::Error,
            if_id,
            request_id,
            send_ts_ns,
            status,
            batch_size: 0,
            latency_us,
            results: &[],
        }
    }

    /// Bytes [`emit`](Self::emit) writes: `36 + 8*k`.
    pub fn wire_len(&self) -> usize {
        RESPONSE_HEADER_LEN + RESULT_LEN * self.results.len()
    }

    /// Writes the message into `buf[..wire_len()]` and returns its length.
    /// Fails if `buf` is too short, or if there are more than
    /// [`MAX_RESULTS`] results (`k` is a `u16`).
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize, BufferTooSmall> {
        let needed = self.wire_len();
        let got = buf.len();
        let Ok(k) = u16::try_from(self.results.len()) else {
            return Err(BufferTooSmall {
                needed,
                got: got.min(RESPONSE_HEADER_LEN + RESULT_LEN * MAX_RESULTS),
            });
        };
        let Some(out) = buf.get_mut(..needed) else {
            return Err(BufferTooSmall { needed, got });
        };
        let (h, rest) = out.split_at_mut(RESPONSE_HEADER_LEN);
        h[field::MAGIC].copy_from_slice(&MAGIC.to_be_bytes());
        h[field::VERSION] = VERSION;
        h[field::TYPE] = self.msg_type as u8;
        h[field::IF_ID].copy_from_slice(&self.if_id.0.to_be_bytes());
        h[field::REQUEST_ID].copy_from_slice(&self.request_id.to_be_bytes());
        h[field::RESP_SEND_TS].copy_from_slice(&self.send_ts_ns.to_be_bytes());
        h[field::STATUS].copy_from_slice(&(self.status as u32).to_be_bytes());
        h[field::K].copy_from_slice(&k.to_be_bytes());
        h[field::BATCH_SIZE].copy_from_slice(&self.batch_size.to_be_bytes());
        h[field::LATENCY_US].copy_from_slice(&self.latency_us.to_be_bytes());
        for (slot, (class, score)) in rest.chunks_exact_mut(RESULT_LEN).zip(self.results) {
            slot[..4].copy_from_slice(&class.to_be_bytes());
            slot[4..].copy_from_slice(&score.to_be_bytes());
        }
        Ok(needed)
    }
}

/// Why a datagram is not a well-formed response or error.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
pub enum ResponseError {
    /// Shorter than the 36-byte header.
    #[error(
        "datagram of {len} bytes is shorter than the {RESPONSE_HEADER_LEN}-byte response header"
    )]
    TooShort {
        /// The datagram's length.
        len: usize,
    },
    /// The first four bytes are not `KNPT`.
    #[error("bad magic {0:#010x} (expected {MAGIC:#010x})")]
    BadMagic(u32),
    /// A protocol version this codec does not speak.
    #[error("unsupported protocol version {0} (expected {VERSION})")]
    BadVersion(u8),
    /// Neither a response (2) nor an error (3).
    #[error("message type {0} is neither a response (2) nor an error (3)")]
    BadType(u8),
    /// A status docs/PROTOCOL.md does not define.
    #[error("unknown status {0}")]
    UnknownStatus(u32),
    /// An error (type 3) with `k` or `batch_size` not 0.
    #[error("error message carries k={k} and batch_size={batch_size}; both must be 0")]
    ErrorWithResults {
        /// `k`.
        k: u16,
        /// `batch_size`.
        batch_size: u16,
    },
    /// The length is not `36 + 8*k`.
    #[error("response is {got} bytes, its k implies {expected}")]
    Length {
        /// `36 + 8*k`.
        expected: usize,
        /// The datagram's length.
        got: usize,
    },
}

/// A checked, zero-copy view of a response or error (a UDP payload), for
/// clients reading the platform's answers.
#[derive(Clone, Copy)]
pub struct Response<T: AsRef<[u8]>> {
    buf: T,
}

impl<T: AsRef<[u8]>> Response<T> {
    /// Checks, in this order: length >= 36, magic, version, type 2 or 3,
    /// a known status, `k == 0 && batch_size == 0` for an error, and the
    /// length equal to `36 + 8*k`.
    pub fn new_checked(buf: T) -> Result<Self, ResponseError> {
        let b = buf.as_ref();
        if b.len() < RESPONSE_HEADER_LEN {
            return Err(ResponseError::TooShort { len: b.len() });
        }
        check_common(b, MsgType::Response).map_err(|e| match e {
            CommonError::Magic(m) => ResponseError::BadMagic(m),
            CommonError::Version(v) => ResponseError::BadVersion(v),
            CommonError::Type(t) => ResponseError::BadType(t),
        })?;
        let status = get_u32(b, field::STATUS);
        if Status::from_u32(status).is_none() {
            return Err(ResponseError::UnknownStatus(status));
        }
        let k = get_u16(b, field::K);
        let batch_size = get_u16(b, field::BATCH_SIZE);
        if get_u8(b, field::TYPE) == MsgType::Error as u8 && (k != 0 || batch_size != 0) {
            return Err(ResponseError::ErrorWithResults { k, batch_size });
        }
        let expected = RESPONSE_HEADER_LEN + RESULT_LEN * usize::from(k);
        if b.len() != expected {
            return Err(ResponseError::Length {
                expected,
                got: b.len(),
            });
        }
        Ok(Response { buf })
    }

    /// [`MsgType::Response`] or [`MsgType::Error`].
    #[inline]
    pub fn msg_type(&self) -> MsgType {
        if get_u8(self.buf.as_ref(), field::TYPE) == MsgType::Error as u8 {
            MsgType::Error
        } else {
            MsgType::Response
        }
    }

    /// As in the request.
    #[inline]
    pub fn if_id(&self) -> IfId {
        IfId(get_u16(self.buf.as_ref(), field::IF_ID))
    }

    /// As in the request.
    #[inline]
    pub fn request_id(&self) -> u64 {
        get_u64(self.buf.as_ref(), field::REQUEST_ID)
    }

    /// Echoed from the request.
    #[inline]
    pub fn send_ts_ns(&self) -> u64 {
        get_u64(self.buf.as_ref(), field::RESP_SEND_TS)
    }

    /// How the request ended.
    #[inline]
    pub fn status(&self) -> Status {
        // new_checked rejected unknown values.
        Status::from_u32(get_u32(self.buf.as_ref(), field::STATUS)).unwrap_or(Status::Internal)
    }

    /// Number of results.
    #[inline]
    pub fn k(&self) -> u16 {
        get_u16(self.buf.as_ref(), field::K)
    }

    /// Size of the batch the request was inferred in (0 for an error).
    #[inline]
    pub fn batch_size(&self) -> u16 {
        get_u16(self.buf.as_ref(), field::BATCH_SIZE)
    }

    /// Platform time from the first fragment received to the answer sent.
    #[inline]
    pub fn latency_us(&self) -> u32 {
        get_u32(self.buf.as_ref(), field::LATENCY_US)
    }

    /// The `k` results `(class_index, score)`, in wire order.
    pub fn results(&self) -> impl ExactSizeIterator<Item = (u32, f32)> + '_ {
        self.buf
            .as_ref()
            .get(RESPONSE_HEADER_LEN..)
            .unwrap_or(&[])
            .chunks_exact(RESULT_LEN)
            .map(|r| {
                let class = u32::from_be_bytes(array(r, 0..4));
                let score = f32::from_be_bytes(array(r, 4..8));
                (class, score)
            })
    }

    /// The whole datagram.
    #[inline]
    pub fn as_bytes(&self) -> &[u8] {
        self.buf.as_ref()
    }

    /// Gives the buffer back.
    #[inline]
    pub fn into_inner(self) -> T {
        self.buf
    }
}

impl<T: AsRef<[u8]>> fmt::Debug for Response<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Response")
            .field("msg_type", &self.msg_type())
            .field("if_id", &self.if_id())
            .field("request_id", &self.request_id())
            .field("send_ts_ns", &self.send_ts_ns())
            .field("status", &self.status())
            .field("k", &self.k())
            .field("batch_size", &self.batch_size())
            .field("latency_us", &self.latency_us())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{fragment, fragment_seeds, header, response};
    use proptest::prelude::*;

    fn repr(total_len: u32, frag_count: u16, frag_index: u16) -> FragmentRepr {
        FragmentRepr {
            total_len,
            frag_count,
            frag_index,
            ..header()
        }
    }

    fn check(bytes: &[u8]) -> Result<FragmentRepr, HeaderError> {
        Fragment::new_checked(bytes).map(|f| FragmentRepr::parse(&f))
    }

    // --- shed notices ------------------------------------------------------

    #[test]
    fn a_shed_notice_keeps_the_header_and_is_malformed_on_the_wire() {
        let h = header();
        let mut bytes = fragment(&h, 834);
        assert_eq!(parse_shed_notice(&bytes), None, "a fragment is no notice");
        assert!(mark_shed_notice(&mut bytes));
        assert_eq!(parse_shed_notice(&bytes), Some(h));
        assert_eq!(
            check(&bytes),
            Err(HeaderError::BadType(SHED_NOTICE_TYPE)),
            "a client cannot send a notice"
        );
        assert!(!mark_shed_notice(&mut [0u8; HEADER_LEN - 1]));
        assert_eq!(parse_shed_notice(&bytes[..HEADER_LEN - 1]), None);
    }

    // --- layout -----------------------------------------------------------

    #[test]
    fn the_fragment_header_is_laid_out_as_protocol_md_says() {
        let bytes = fragment(&header(), 834);
        #[rustfmt::skip]
        let want: [u8; 32] = [
            0x4B, 0x4E, 0x50, 0x54,                         // magic "KNPT"
            1,                                              // version
            1,                                              // type
            0x00, 0x07,                                     // if_id
            0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, // request_id
            0x00, 0x00, 0x09, 0xC4,                         // total_len 2500
            0x00, 0x01,                                     // frag_index
            0x00, 0x03,                                     // frag_count
            0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, // send_ts_ns
        ];
        assert_eq!(&bytes[..32], &want);
        assert_eq!(&bytes[..4], b"KNPT");
        let f = Fragment::new_checked(&bytes[..]).unwrap();
        assert_eq!(f.if_id(), IfId(7));
        assert_eq!(f.request_id(), 0x0102_0304_0506_0708);
        assert_eq!(f.total_len(), 2500);
        assert_eq!(f.frag_index(), 1);
        assert_eq!(f.frag_count(), 3);
        assert_eq!(f.send_ts_ns(), 0x1122_3344_5566_7788);
        assert_eq!(f.payload(), &bytes[32..]);
        assert_eq!(f.as_bytes(), &bytes[..]);
        assert_eq!(FragmentRepr::parse(&f), header());
        assert_eq!(f.into_inner(), &bytes[..]);
    }

    #[test]
    fn the_response_header_is_laid_out_as_protocol_md_says() {
        let bytes = response(&[(3, 1.5), (0x0102_0304, -2.0)]);
        #[rustfmt::skip]
        let want: [u8; 52] = [
            0x4B, 0x4E, 0x50, 0x54,                         // magic
            1, 2,                                           // version, type
            0x00, 0x07,                                     // if_id
            0, 0, 0, 0, 0, 0, 0, 42,                        // request_id
            0, 0, 0, 0, 0, 0, 0, 99,                        // send_ts_ns
            0, 0, 0, 0,                                     // status OK
            0, 2,                                           // k
            0, 8,                                           // batch_size
            0, 0, 0x04, 0xD2,                               // latency_us 1234
            0, 0, 0, 3, 0x3F, 0xC0, 0, 0,                   // (3, 1.5)
            0x01, 0x02, 0x03, 0x04, 0xC0, 0, 0, 0,          // (.., -2.0)
        ];
        assert_eq!(bytes, want);
        let r = Response::new_checked(&bytes[..]).unwrap();
        assert_eq!(r.msg_type(), MsgType::Response);
        assert_eq!(r.if_id(), IfId(7));
        assert_eq!(r.request_id(), 42);
        assert_eq!(r.send_ts_ns(), 99);
        assert_eq!(r.status(), Status::Ok);
        assert_eq!(r.k(), 2);
        assert_eq!(r.batch_size(), 8);
        assert_eq!(r.latency_us(), 1234);
        assert_eq!(
            r.results().collect::<Vec<_>>(),
            vec![(3, 1.5), (0x0102_0304, -2.0)]
        );
        assert_eq!(r.as_bytes(), &bytes[..]);
        assert_eq!(r.into_inner(), &bytes[..]);
    }

    #[test]
    fn an_error_is_type_3_with_no_results_and_batch_0() {
        let e = ResponseRepr::error(IfId(9), 5, 77, Status::UnknownIf, 12);
        assert_eq!(e.msg_type, MsgType::Error);
        assert_eq!(e.batch_size, 0);
        assert!(e.results.is_empty());
        assert_eq!(e.wire_len(), RESPONSE_HEADER_LEN);
        let mut buf = [0xEE; 64];
        assert_eq!(e.emit(&mut buf), Ok(36));
        assert_eq!(buf[5], 3);
        assert_eq!(&buf[24..28], &[0, 0, 0, 1]);
        assert_eq!(buf[36], 0xEE, "emit writes wire_len bytes, no more");
        let r = Response::new_checked(&buf[..36]).unwrap();
        assert_eq!(r.msg_type(), MsgType::Error);
        assert_eq!(r.status(), Status::UnknownIf);
        assert_eq!((r.k(), r.batch_size(), r.latency_us()), (0, 0, 12));
        assert_eq!(r.results().count(), 0);
    }

    // --- geometry ------------------------------------------------------------

    #[test]
    fn the_stride_is_the_ceiling_of_total_len_over_frag_count() {
        assert_eq!(stride(2500, 3), Some(834));
        assert_eq!(stride(150_528, 105), Some(1434));
        assert_eq!(stride(1, 1), Some(1));
        assert_eq!(stride(u32::MAX, 1), Some(u32::MAX));
        assert_eq!(stride(u32::MAX, u16::MAX), Some(65_537)); // 65535 * 65537 = 2^32 - 1
        assert_eq!(stride(u32::MAX, 2), Some(1 << 31));
        assert_eq!(stride(0, 1), None);
        assert_eq!(stride(1, 0), None);
        // 5 bytes in 4 fragments: stride 2 covers them in 3, the 4th is empty
        assert_eq!(stride(5, 4), None);
        assert_eq!(stride(3, 4), None);
    }

    #[test]
    fn fragment_i_carries_its_slice_of_the_request() {
        assert_eq!(fragment_range(2500, 3, 0), Some(0..834));
        assert_eq!(fragment_range(2500, 3, 1), Some(834..1668));
        assert_eq!(fragment_range(2500, 3, 2), Some(1668..2500));
        assert_eq!(fragment_range(2500, 3, 3), None);
        assert_eq!(fragment_range(5, 4, 0), None);
        assert_eq!(
            fragment_range(u32::MAX, u16::MAX, u16::MAX - 1),
            Some(65_534 * 65_537..u32::MAX as usize)
        );
        assert_eq!(header().payload_range(), Some(834..1668));
    }

    #[test]
    fn a_fragment_knows_where_its_payload_goes() {
        for (index, len, offset) in [(0u16, 834usize, 0usize), (1, 834, 834), (2, 832, 1668)] {
            let bytes = fragment(&repr(2500, 3, index), len);
            let f = Fragment::new_checked(&bytes[..]).unwrap();
            assert_eq!(f.stride(), 834);
            assert_eq!(f.payload_offset(), offset);
            assert_eq!(f.payload_range(), offset..offset + len);
        }
    }

    // --- one test per malformed kind -----------------------------------------

    #[test]
    fn too_short() {
        for len in [0, 1, 31] {
            let bytes = &fragment(&repr(1, 1, 0), 1)[..len];
            assert_eq!(check(bytes), Err(HeaderError::TooShort { len }));
        }
    }

    #[test]
    fn bad_magic() {
        let mut bytes = fragment(&header(), 834);
        bytes[3] = b'X';
        assert_eq!(check(&bytes), Err(HeaderError::BadMagic(0x4B4E_5058)));
    }

    #[test]
    fn bad_version() {
        let mut bytes = fragment(&header(), 834);
        for v in [0, 2, 255] {
            bytes[4] = v;
            assert_eq!(check(&bytes), Err(HeaderError::BadVersion(v)));
        }
    }

    #[test]
    fn bad_type() {
        let mut bytes = fragment(&header(), 834);
        for t in [0, 2, 3, 4, 255] {
            bytes[5] = t;
            assert_eq!(check(&bytes), Err(HeaderError::BadType(t)));
        }
    }

    #[test]
    fn zero_total_len() {
        assert_eq!(
            check(&fragment(&repr(0, 1, 0), 0)),
            Err(HeaderError::ZeroTotalLen)
        );
        assert_eq!(
            check(&fragment(&repr(0, 0, 0), 0)),
            Err(HeaderError::ZeroTotalLen)
        );
    }

    #[test]
    fn zero_frag_count() {
        // reported as such, not as frag_index 0 >= frag_count 0
        assert_eq!(
            check(&fragment(&repr(10, 0, 0), 10)),
            Err(HeaderError::ZeroFragCount)
        );
    }

    #[test]
    fn index_out_of_range() {
        assert_eq!(
            check(&fragment(&repr(10, 2, 2), 5)),
            Err(HeaderError::IndexOutOfRange { index: 2, count: 2 })
        );
        assert_eq!(
            check(&fragment(&repr(10, 2, u16::MAX), 5)),
            Err(HeaderError::IndexOutOfRange {
                index: u16::MAX,
                count: 2
            })
        );
    }

    #[test]
    fn empty_last_fragment() {
        // the geometry is malformed whichever fragment carries it
        for index in 0..4 {
            assert_eq!(
                check(&fragment(&repr(5, 4, index), 2)),
                Err(HeaderError::EmptyLastFragment {
                    total_len: 5,
                    frag_count: 4
                })
            );
        }
        // more fragments than bytes
        assert_eq!(
            check(&fragment(&repr(2, 3, 0), 1)),
            Err(HeaderError::EmptyLastFragment {
                total_len: 2,
                frag_count: 3
            })
        );
    }

    #[test]
    fn payload_length() {
        for (len, expected) in [(833, 834), (835, 834), (0, 834)] {
            assert_eq!(
                check(&fragment(&header(), len)),
                Err(HeaderError::PayloadLength { expected, got: len })
            );
        }
        // the last fragment carries the remainder, not a full stride
        assert_eq!(
            check(&fragment(&repr(2500, 3, 2), 834)),
            Err(HeaderError::PayloadLength {
                expected: 832,
                got: 834
            })
        );
    }

    #[test]
    fn every_malformed_kind_has_a_seed_and_a_distinct_name() {
        let seeds = fragment_seeds();
        for kind in MalformedKind::ALL {
            let (_, bytes) = seeds
                .iter()
                .find(|(n, _)| *n == kind.name())
                .unwrap_or_else(|| panic!("no seed named {}", kind.name()));
            assert_eq!(check(bytes).map_err(|e| e.kind()), Err(kind));
            assert_eq!(kind.to_string(), kind.name());
        }
        let mut names: Vec<_> = MalformedKind::ALL.iter().map(|k| k.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), MalformedKind::ALL.len());
    }

    #[test]
    fn header_errors_say_what_is_wrong() {
        assert_eq!(
            HeaderError::BadMagic(0x1234_5678).to_string(),
            "bad magic 0x12345678 (expected 0x4b4e5054)"
        );
        assert_eq!(
            HeaderError::PayloadLength {
                expected: 834,
                got: 833
            }
            .to_string(),
            "fragment payload is 833 bytes, its geometry implies 834"
        );
    }

    // --- response errors -----------------------------------------------------

    fn check_response(bytes: &[u8]) -> Result<(), ResponseError> {
        Response::new_checked(bytes).map(|_| ())
    }

    #[test]
    fn response_errors_one_per_variant() {
        let good = response(&[(1, 0.5), (2, 0.25)]);
        assert_eq!(check_response(&good), Ok(()));
        assert_eq!(
            check_response(&good[..35]),
            Err(ResponseError::TooShort { len: 35 })
        );
        let mut b = good.clone();
        b[0] = 0;
        assert_eq!(
            check_response(&b),
            Err(ResponseError::BadMagic(0x004E_5054))
        );
        let mut b = good.clone();
        b[4] = 9;
        assert_eq!(check_response(&b), Err(ResponseError::BadVersion(9)));
        for t in [0, 1, 4] {
            let mut b = good.clone();
            b[5] = t;
            assert_eq!(check_response(&b), Err(ResponseError::BadType(t)));
        }
        let mut b = good.clone();
        b[27] = 6;
        assert_eq!(check_response(&b), Err(ResponseError::UnknownStatus(6)));
        let mut b = good.clone();
        b[5] = 3;
        assert_eq!(
            check_response(&b),
            Err(ResponseError::ErrorWithResults {
                k: 2,
                batch_size: 8
            })
        );
        assert_eq!(
            check_response(&good[..good.len() - 1]),
            Err(ResponseError::Length {
                expected: 52,
                got: 51
            })
        );
        let mut b = good.clone();
        b.push(0);
        assert_eq!(
            check_response(&b),
            Err(ResponseError::Length {
                expected: 52,
                got: 53
            })
        );
        // a fragment is not a response
        assert!(check_response(&fragment(&header(), 834)).is_err());
    }

    #[test]
    fn emit_needs_room() {
        let mut small = [0u8; 31];
        assert_eq!(
            header().emit_header(&mut small),
            Err(BufferTooSmall {
                needed: 32,
                got: 31
            })
        );
        let results = [(0u32, 0f32); 3];
        let r = ResponseRepr {
            results: &results,
            ..ResponseRepr::error(IfId(1), 1, 1, Status::Ok, 1)
        };
        assert_eq!(r.wire_len(), 60);
        let mut buf = [0u8; 59];
        assert_eq!(
            r.emit(&mut buf),
            Err(BufferTooSmall {
                needed: 60,
                got: 59
            })
        );
        let too_many = vec![(0u32, 0f32); MAX_RESULTS + 1];
        let r = ResponseRepr {
            results: &too_many,
            ..r
        };
        let mut big = vec![0u8; r.wire_len()];
        let e = r.emit(&mut big).unwrap_err();
        assert!(e.got < e.needed, "{e:?}");
    }

    // --- small types ---------------------------------------------------------

    #[test]
    fn status_values_and_names() {
        let names = [
            "OK",
            "UNKNOWN_IF",
            "BAD_REQUEST",
            "INCOMPLETE",
            "OVERLOADED",
            "INTERNAL",
        ];
        let snake = [
            "ok",
            "unknown_if",
            "bad_request",
            "incomplete",
            "overloaded",
            "internal",
        ];
        for (i, s) in Status::ALL.iter().enumerate() {
            assert_eq!(*s as u32, i as u32);
            assert_eq!(Status::from_u32(i as u32), Some(*s));
            assert_eq!(s.name(), names[i]);
            assert_eq!(s.as_str(), snake[i]);
            assert_eq!(s.to_string(), names[i]);
        }
        assert_eq!(Status::from_u32(6), None);
        assert_eq!(Status::from_u32(u32::MAX), None);
    }

    #[test]
    fn msg_types() {
        assert_eq!(MsgType::from_u8(1), Some(MsgType::Request));
        assert_eq!(MsgType::from_u8(2), Some(MsgType::Response));
        assert_eq!(MsgType::from_u8(3), Some(MsgType::Error));
        assert_eq!(MsgType::from_u8(0), None);
        assert_eq!(MsgType::from_u8(4), None);
    }

    #[test]
    fn if_ids_print_short() {
        assert_eq!(format!("{:?}", IfId(7)), "if7");
        assert_eq!(IfId(65535).to_string(), "if65535");
        assert_eq!(u16::from(IfId::from(3)), 3);
        assert!(IfId(1) < IfId(2));
    }

    #[test]
    fn views_debug_print_their_fields() {
        let bytes = fragment(&header(), 834);
        let s = format!("{:?}", Fragment::new_checked(&bytes[..]).unwrap());
        assert!(
            s.contains("if_id: if7") && s.contains("payload_len: 834"),
            "{s}"
        );
        let bytes = response(&[]);
        let s = format!("{:?}", Response::new_checked(&bytes[..]).unwrap());
        assert!(s.contains("status: Ok"), "{s}");
    }

    // --- properties ----------------------------------------------------------

    /// docs/PROTOCOL.md's geometry the slow way: stride found by counting up,
    /// fragments cut byte by byte.
    fn reference_fragments(total_len: u32, frag_count: u16) -> Option<Vec<Vec<u32>>> {
        if total_len == 0 || frag_count == 0 {
            return None;
        }
        let mut stride = 1u32;
        while stride * u32::from(frag_count) < total_len {
            stride += 1;
        }
        let mut frags = vec![Vec::new(); usize::from(frag_count)];
        for byte in 0..total_len {
            frags[(byte / stride) as usize].push(byte);
        }
        if frags.iter().any(|f| f.is_empty()) {
            return None;
        }
        Some(frags)
    }

    /// The rules of docs/PROTOCOL.md for one datagram, re-stated independently:
    /// `Ok` or the first rule broken.
    fn reference_check(b: &[u8]) -> Result<(), MalformedKind> {
        if b.len() < 32 {
            return Err(MalformedKind::TooShort);
        }
        if b[0..4] != *b"KNPT" {
            return Err(MalformedKind::BadMagic);
        }
        if b[4] != 1 {
            return Err(MalformedKind::BadVersion);
        }
        if b[5] != 1 {
            return Err(MalformedKind::BadType);
        }
        let total = u64::from(u32::from_be_bytes([b[16], b[17], b[18], b[19]]));
        let index = u64::from(u16::from_be_bytes([b[20], b[21]]));
        let count = u64::from(u16::from_be_bytes([b[22], b[23]]));
        if total == 0 {
            return Err(MalformedKind::ZeroTotalLen);
        }
        if count == 0 {
            return Err(MalformedKind::ZeroFragCount);
        }
        if index >= count {
            return Err(MalformedKind::IndexOutOfRange);
        }
        let stride = total.div_ceil(count);
        if (count - 1) * stride >= total {
            return Err(MalformedKind::EmptyLastFragment);
        }
        let start = index * stride;
        let end = (start + stride).min(total);
        if (b.len() - 32) as u64 != end - start {
            return Err(MalformedKind::PayloadLength);
        }
        Ok(())
    }

    /// Headers near the interesting boundaries: each field either valid or
    /// off, the payload length near the implied one.
    fn near_valid_fragment() -> impl Strategy<Value = Vec<u8>> {
        (
            prop_oneof![4 => Just(MAGIC), 1 => any::<u32>()],
            prop_oneof![4 => Just(VERSION), 1 => any::<u8>()],
            prop_oneof![4 => Just(1u8), 1 => any::<u8>()],
            any::<u16>(),
            any::<u64>(),
            prop_oneof![1 => Just(0u32), 4 => 1u32..3000, 1 => any::<u32>()],
            prop_oneof![1 => Just(0u16), 4 => 1u16..40, 1 => any::<u16>()],
            prop_oneof![3 => 0u16..4, 1 => 0u16..48],
            any::<u64>(),
            prop_oneof![3 => Just(0i64), 1 => -2i64..3],
        )
            .prop_map(
                |(magic, version, ty, if_id, rid, total, count, index, ts, delta)| {
                    let h = FragmentRepr {
                        if_id: IfId(if_id),
                        request_id: rid,
                        total_len: total,
                        frag_index: index,
                        frag_count: count,
                        send_ts_ns: ts,
                    };
                    let implied = fragment_range(total, count, index).map_or(3, |r| r.len());
                    let len = (implied as i64 + delta).clamp(0, 4000) as usize;
                    let mut b = fragment(&h, len);
                    b[0..4].copy_from_slice(&magic.to_be_bytes());
                    b[4] = version;
                    b[5] = ty;
                    b
                },
            )
    }

    fn near_valid_response() -> impl Strategy<Value = Vec<u8>> {
        (
            prop_oneof![4 => Just(MAGIC), 1 => any::<u32>()],
            prop_oneof![4 => Just(VERSION), 1 => any::<u8>()],
            prop_oneof![3 => 2u8..=3, 1 => any::<u8>()],
            prop_oneof![4 => 0u32..6, 1 => any::<u32>()],
            prop_oneof![2 => Just(0u16), 2 => 0u16..8, 1 => any::<u16>()],
            prop_oneof![2 => Just(0u16), 1 => any::<u16>()],
            proptest::collection::vec(any::<u8>(), 36..37),
            prop_oneof![3 => Just(0i64), 1 => -9i64..10],
        )
            .prop_map(|(magic, version, ty, status, k, batch, mut b, delta)| {
                b[0..4].copy_from_slice(&magic.to_be_bytes());
                b[4] = version;
                b[5] = ty;
                b[24..28].copy_from_slice(&status.to_be_bytes());
                b[28..30].copy_from_slice(&k.to_be_bytes());
                b[30..32].copy_from_slice(&batch.to_be_bytes());
                let implied = 36 + 8 * i64::from(k.min(300));
                b.resize((implied + delta).max(0) as usize, 0x5A);
                b
            })
    }

    fn valid_geometry() -> impl Strategy<Value = (u32, u16, u16)> {
        (1u32..200_000, 1u16..300, any::<u16>()).prop_filter_map(
            "geometry leaves the last fragment empty",
            |(total, count, index)| {
                stride(total, count)?;
                Some((total, count, index % count))
            },
        )
    }

    proptest! {
        #[test]
        fn fragment_emit_then_parse_round_trips(
            (total_len, frag_count, frag_index) in valid_geometry(),
            if_id in any::<u16>(),
            request_id in any::<u64>(),
            send_ts_ns in any::<u64>(),
        ) {
            let h = FragmentRepr {
                if_id: IfId(if_id), request_id, total_len, frag_index, frag_count, send_ts_ns,
            };
            let range = h.payload_range().unwrap();
            let bytes = fragment(&h, range.len());
            let f = Fragment::new_checked(&bytes[..]).unwrap();
            prop_assert_eq!(FragmentRepr::parse(&f), h);
            prop_assert_eq!(f.payload(), &bytes[32..]);
            prop_assert_eq!(f.payload_range(), range);
        }

        #[test]
        fn response_emit_then_parse_round_trips(
            is_error in any::<bool>(),
            if_id in any::<u16>(),
            request_id in any::<u64>(),
            send_ts_ns in any::<u64>(),
            status in 0u32..6,
            batch_size in any::<u16>(),
            latency_us in any::<u32>(),
            results in proptest::collection::vec((any::<u32>(), any::<u32>()), 0..40),
        ) {
            let results: Vec<(u32, f32)> = if is_error {
                Vec::new()
            } else {
                results.into_iter().map(|(c, s)| (c, f32::from_bits(s))).collect()
            };
            let r = ResponseRepr {
                msg_type: if is_error { MsgType::Error } else { MsgType::Response },
                if_id: IfId(if_id),
                request_id,
                send_ts_ns,
                status: Status::from_u32(status).unwrap(),
                batch_size: if is_error { 0 } else { batch_size },
                latency_us,
                results: &results,
            };
            let mut buf = vec![0u8; r.wire_len() + 7];
            let n = r.emit(&mut buf).unwrap();
            prop_assert_eq!(n, 36 + 8 * results.len());
            let p = Response::new_checked(&buf[..n]).unwrap();
            prop_assert_eq!(p.msg_type(), r.msg_type);
            prop_assert_eq!(p.if_id(), r.if_id);
            prop_assert_eq!(p.request_id(), r.request_id);
            prop_assert_eq!(p.send_ts_ns(), r.send_ts_ns);
            prop_assert_eq!(p.status(), r.status);
            prop_assert_eq!(p.batch_size(), r.batch_size);
            prop_assert_eq!(p.latency_us(), r.latency_us);
            prop_assert_eq!(usize::from(p.k()), results.len());
            let got: Vec<(u32, u32)> = p.results().map(|(c, s)| (c, s.to_bits())).collect();
            let want: Vec<(u32, u32)> = results.iter().map(|(c, s)| (*c, s.to_bits())).collect();
            prop_assert_eq!(got, want);
        }

        #[test]
        fn any_bytes_parse_to_a_valid_fragment_or_the_first_broken_rule(
            bytes in prop_oneof![
                proptest::collection::vec(any::<u8>(), 0..100),
                near_valid_fragment(),
            ]
        ) {
            let got = Fragment::new_checked(&bytes[..]);
            prop_assert_eq!(got.as_ref().map(|_| ()).map_err(|e| e.kind()), reference_check(&bytes));
            if let Ok(f) = got {
                // re-check what a valid fragment promises, from the bytes
                let frags = reference_fragments(f.total_len(), f.frag_count()).unwrap();
                let mine = &frags[usize::from(f.frag_index())];
                prop_assert_eq!(f.payload().len(), mine.len());
                prop_assert_eq!(f.payload_offset(), mine[0] as usize);
                crate::fuzzing::parse_fragment(&bytes);
            }
        }

        #[test]
        fn any_bytes_parse_to_a_valid_response_or_are_rejected(
            bytes in prop_oneof![
                proptest::collection::vec(any::<u8>(), 0..100),
                near_valid_response(),
            ]
        ) {
            if let Ok(r) = Response::new_checked(&bytes[..]) {
                prop_assert!(bytes.len() >= 36);
                prop_assert_eq!(&bytes[0..4], b"KNPT");
                prop_assert_eq!(bytes[4], 1);
                prop_assert!(bytes[5] == 2 || bytes[5] == 3);
                let status = u32::from_be_bytes([bytes[24], bytes[25], bytes[26], bytes[27]]);
                prop_assert!(status <= 5);
                let k = usize::from(u16::from_be_bytes([bytes[28], bytes[29]]));
                let batch = u16::from_be_bytes([bytes[30], bytes[31]]);
                if bytes[5] == 3 {
                    prop_assert_eq!((k, batch), (0, 0));
                }
                prop_assert_eq!(bytes.len(), 36 + 8 * k);
                prop_assert_eq!(r.results().len(), k);
                crate::fuzzing::parse_fragment(&bytes);
            }
        }

        #[test]
        fn fragment_ranges_match_the_slow_reference(
            total_len in 1u32..3000,
            frag_count in 1u16..3100,
        ) {
            let reference = reference_fragments(total_len, frag_count);
            prop_assert_eq!(stride(total_len, frag_count).is_some(), reference.is_some());
            prop_assert_eq!(fragment_range(total_len, frag_count, frag_count), None);
            match reference {
                None => {
                    for i in 0..frag_count {
                        prop_assert_eq!(fragment_range(total_len, frag_count, i), None);
                    }
                }
                Some(frags) => {
                    for (i, f) in frags.iter().enumerate() {
                        let r = fragment_range(total_len, frag_count, i as u16).unwrap();
                        let want = f[0] as usize..*f.last().unwrap() as usize + 1;
                        prop_assert_eq!(r, want);
                    }
                }
            }
        }

        #[test]
        fn fragment_ranges_tile_the_request_at_any_size(
            total_len in any::<u32>(),
            frag_count in prop_oneof![1u16..100, any::<u16>()],
        ) {
            let Some(s) = stride(total_len, frag_count) else {
                // invalid only for a zero or a last fragment left empty
                prop_assert!(
                    total_len == 0
                        || frag_count == 0
                        || u64::from(frag_count - 1) * u64::from(total_len.div_ceil(u32::from(frag_count)))
                            >= u64::from(total_len)
                );
                return Ok(());
            };
            prop_assert_eq!(u64::from(s), u64::from(total_len).div_ceil(u64::from(frag_count)));
            let mut next = 0usize;
            for i in 0..frag_count {
                let r = fragment_range(total_len, frag_count, i).unwrap();
                prop_assert_eq!(r.start, next, "contiguous and disjoint");
                prop_assert!(!r.is_empty());
                prop_assert!(r.len() <= s as usize);
                next = r.end;
            }
            prop_assert_eq!(next, total_len as usize, "covers [0, total_len)");
        }
    }
}
