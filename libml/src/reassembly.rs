//! The inference function's reassembler: decides, fragment by fragment,
//! which input-pool slot a request's bytes go to, when a request is
//! complete, and which requests are answered with an error.
//!
//! # What
//!
//! An IF dequeues request fragments (one datagram each, already checked by
//! [`Fragment::new_checked`](kp_wire::Fragment::new_checked)) and hands
//! each one's header to [`Reassembler::on_fragment`]. The answer is a
//! [`FragmentOutcome`]: copy the payload into slot `s` at byte offset `o`
//! (and maybe: the request is now complete), drop it (duplicate, late,
//! malformed), or answer the request with an error now. The caller moves
//! the bytes (into a pinned pool slot of `input_len` bytes, converting them
//! if it wants); the reassembler never sees them. A request whose fragments
//! stop coming is found by [`Reassembler::poll_expired`], which the caller
//! runs every few milliseconds. A complete request keeps its slot until the
//! caller [`release`](Reassembler::release)s it after inference.
//!
//! Sans-IO: time is an argument (nanoseconds from any fixed origin, never
//! going back), nothing is allocated after [`Reassembler::new`], nothing
//! blocks and nothing panics on any input.
//!
//! # Design
//!
//! **Slot lifecycle.** Each of the `capacity` slots is in one of three
//! states:
//!
//! ```text
//!   Free ── first fragment ──▶ Assembling ── last fragment ──▶ Handed
//!    ▲  ▲                          │        (StoreAndComplete)     │
//!    │  └──────────────────────────┘                               │
//!    │   disagreeing fragment (Reject BAD_REQUEST), shed notice    │
//!    │   (Reject OVERLOADED, see `on_shed_notice`),                │
//!    │   poll_expired (Expired: INCOMPLETE), drain_in_flight       │
//!    └──────────────────── release(slot), after inference ─────────┘
//! ```
//!
//! A first fragment that finds no Free slot is answered OVERLOADED (a
//! `Reject`) and takes none; one with the wrong `total_len` or too many
//! fragments is answered BAD_REQUEST before a slot is looked for. A
//! one-fragment request goes from Free straight to Handed.
//!
//! A slot is given to a new request only when it is Free, so no two live
//! requests ever share one. Allocation is circular: the next free slot at
//! or after the one following the last slot allocated. Requests that arrive
//! one after the other thus get consecutive slots, and a batch of them is one
//! contiguous tensor of the pool (E²bird's memory pool); a slot still held
//! by a slow request is skipped, not waited for.
//!
//! **Per-request state.** An Assembling slot holds the request's key, the
//! fields its fragments must agree on (`total_len`, `frag_count`,
//! `send_ts_ns`, from its first fragment), when it was first seen, and a
//! count of the fragments received. A fragment bitmap of `max_frags` bits
//! per slot (one `bitvec` allocation for all slots) says which indices have
//! arrived, so a duplicate is known in one bit test.
//!
//! **Lookup.** In-flight requests are found by key through a small
//! open-addressing hash index sized twice the capacity (see `index.rs` for
//! why not a linear scan). Only Assembling slots are in it.
//!
//! **Exactly one answer per request.** A fragment whose key is in the index
//! belongs to that in-flight request. Otherwise its key is looked up in, and
//! entered into, an [`AnsweredTable`] (check-and-insert is that table's one
//! operation): if it is there, the request was seen before and has left the
//! reassembler, so the fragment is `Late` and nothing is answered. If not,
//! this is a new request, remembered from now on, and it either is rejected
//! at once (BAD_REQUEST, OVERLOADED) or takes a slot and enters the index.
//! It leaves the index exactly once, by exactly one of: completion (handed
//! to the caller, who answers after inference), a disagreeing fragment
//! (BAD_REQUEST), expiry (INCOMPLETE), or [`drain_in_flight`]. Each of
//! those exits is where the request's end is counted, and each of them
//! yields the one answer (or hand-over) the request gets. Fragments that
//! come after it left miss the index and hit the answered table: `Late`.
//!
//! Entering the key in the answered table at first sight rather than at the
//! answer costs nothing while the request is in flight (the index is looked
//! at first), but it means the table remembers a request for
//! `answered_ttl_ns` from its *first fragment*: after its answer, for that
//! ttl minus the time it spent in flight, which is at most the timeout plus
//! one poll interval.
//!
//! **Expiry.** A request is due once `now >= first_seen + timeout_ns`. The
//! reassembler keeps a lower bound of the earliest deadline, so
//! [`poll_expired`](Reassembler::poll_expired) returns at once while
//! nothing can be due, and otherwise scans the slots once (O(capacity)).
//! The timeout is enforced at poll granularity: a request whose last
//! fragment arrives after its deadline but before the next poll is still
//! completed.
//!
//! **Outcomes.** Every fragment ends in exactly one [`FragmentKind`] and
//! every request in exactly one [`RequestEnd`]; [`ReassemblyCounters`]
//! counts both, plus misuse of [`release`](Reassembler::release) and
//! evictions from the answered table.
//!
//! # Defaults, and why
//!
//! - `capacity` = [`DEFAULT_CAPACITY`] = 64 in-flight plus handed requests,
//!   GSLICE's input-pool size: above any batch size it uses (≤ 32), so one
//!   batch can be inferred while the next one is being reassembled.
//! - `max_frags` = `min(input_len, 65535)`: every fragmentation
//!   docs/PROTOCOL.md can express for this input size (a fragment carries at
//!   least one byte; `frag_count` is a `u16`). docs/PROTOCOL.md does not make a
//!   finely fragmented request a bad one, so by default it is not. The
//!   bitmaps cost at most 8 KiB per slot: 512 KiB at 64 slots, beside the
//!   9.2 MiB of pool that 64 slots of 224×224×3 inputs take. Set it lower
//!   to refuse requests cut into absurdly many fragments (each fragment
//!   costs a packet on the data path).
//! - `timeout_ns` = [`DEFAULT_TIMEOUT_NS`] = 100 ms: a client sends a
//!   request's fragments back to back, and a 224×224×3 request takes 1.2 ms
//!   at 1 Gbit/s, so 100 ms is ~80× that: fragments still missing by then
//!   are lost, not late. And a request that took 100 ms to arrive has
//!   already missed any useful inference SLO (tens of ms), so waiting longer
//!   only holds its slot away from requests that can still be served.
//! - `answered_ttl_ns` = [`DEFAULT_ANSWERED_TTL_NS`] = 4 × the timeout: it
//!   is counted from the first fragment, so a request is remembered at
//!   least ~3 timeouts after its answer — orders of magnitude past LAN
//!   reordering — while a client may reuse a request id 400 ms after first
//!   sending it.
//! - `answered_capacity` = [`DEFAULT_ANSWERED_CAPACITY`] = 16384 entries
//!   (~0.5 MiB): every request seen within one ttl takes an entry, so it
//!   stays a quarter full (few conflict evictions in its 4-way sets) up to
//!   ~10k requests/s, 12 Gbit/s of 224×224×3 inputs.
//!
//! # Limits
//!
//! - A fragment arriving more than `answered_ttl_ns` after its request's
//!   first fragment, or after the request's entry was evicted from the
//!   answered table (counted in `answered_evictions`), looks like a new
//!   request; it ends INCOMPLETE, a second answer.
//! - Conversely a client that reuses a request id within `answered_ttl_ns`
//!   of the first fragment of its previous use gets no answer (`Late`).
//!   docs/PROTOCOL.md only asks ids to be unique while in flight; clients that
//!   count ids up (as `kp-gen` and `kp-client` do) never hit this.
//! - A slot that is handed over and never released is lost for good: the
//!   reassembler answers OVERLOADED once every slot is Assembling or
//!   Handed.
//! - [`drain_in_flight`] hands over only Assembling requests; Handed ones
//!   are already the caller's.
//! - Geometry is not re-checked beyond what offsets need: a header that
//!   [`Fragment::new_checked`](kp_wire::Fragment::new_checked) would
//!   refuse, or whose `if_id`/`request_id` differ from the key's, is
//!   counted as `Malformed` and dropped.
//!
//! # Example
//!
//! ```
//! use std::net::Ipv4Addr;
//! use libml::reassembly::*;
//! use kp_wire::{FragmentRepr, IfId, RequestKey};
//!
//! let mut r = Reassembler::new(ReassemblerConfig::new(6))?;
//! let key = RequestKey { src_ip: Ipv4Addr::new(10, 0, 0, 1), src_port: 4000, if_id: IfId(1), request_id: 7 };
//! let frag = |i| FragmentRepr { if_id: IfId(1), request_id: 7, total_len: 6, frag_index: i, frag_count: 2, send_ts_ns: 42 };
//!
//! let mut pool = vec![0u8; 6 * DEFAULT_CAPACITY];
//! // Fragment 1 first: bytes 3..6.
//! let FragmentOutcome::Store { slot, offset } = r.on_fragment(key, &frag(1), 1_000) else { panic!() };
//! pool[slot.index() * 6 + offset..][..3].copy_from_slice(b"def");
//! // Fragment 0 completes it.
//! let FragmentOutcome::StoreAndComplete { slot, offset, done } = r.on_fragment(key, &frag(0), 2_000) else { panic!() };
//! pool[slot.index() * 6 + offset..][..3].copy_from_slice(b"abc");
//! assert_eq!(&pool[done.slot.index() * 6..][..6], b"abcdef");
//! assert_eq!((done.send_ts_ns, done.first_seen_ns), (42, 1_000));
//! // A duplicate of a finished request is late, not a second request.
//! assert_eq!(r.on_fragment(key, &frag(0), 3_000), FragmentOutcome::Late);
//! // After inference the slot goes back to the pool.
//! r.release(done.slot)?;
//! assert_eq!(r.counters().requests_completed, 1);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! [`drain_in_flight`]: Reassembler::drain_in_flight

use std::fmt;

use bitvec::boxed::BitBox;
use bitvec::slice::BitSlice;
use thiserror::Error;

use kp_wire::answered::{Answer, AnsweredTable};
use kp_wire::{FragmentRepr, RequestKey, Status};

#[doc(hidden)]
pub mod fuzzing;
mod index;
#[cfg(test)]
mod model;

use index::KeyIndex;

/// Default number of slots: GSLICE's input-pool size (see the module doc).
pub const DEFAULT_CAPACITY: usize = 64;

/// Most slots a reassembler may have. A million pool slots is more than
/// any host holds for one model; the bound keeps slot numbers and the
/// index's size well inside `u32`.
pub const MAX_CAPACITY: usize = 1 << 20;

/// Default reassembly timeout, 100 ms (see the module doc for why).
pub const DEFAULT_TIMEOUT_NS: u64 = 100_000_000;

/// Default time a request is remembered in the answered table, counted from
/// its first fragment: 4 × [`DEFAULT_TIMEOUT_NS`].
pub const DEFAULT_ANSWERED_TTL_NS: u64 = 4 * DEFAULT_TIMEOUT_NS;

/// Default size of the answered table (see the module doc).
pub const DEFAULT_ANSWERED_CAPACITY: usize = 16_384;

/// An input-pool slot: `0..capacity`. The request in slot `s` goes to bytes
/// `[s * input_len, (s + 1) * input_len)` of a pool laid out slot after
/// slot.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SlotId(pub u32);

impl SlotId {
    /// The slot's number as an index.
    #[inline]
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Debug for SlotId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "slot{}", self.0)
    }
}

impl fmt::Display for SlotId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "slot{}", self.0)
    }
}

/// How a [`Reassembler`] is sized and timed. [`ReassemblerConfig::new`]
/// gives the defaults for a model input; the fields can be changed before
/// [`Reassembler::new`], which checks them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReassemblerConfig {
    /// Number of slots: requests being assembled plus requests handed over
    /// and not yet released. `1..=MAX_CAPACITY`.
    pub capacity: usize,
    /// The model's input size in bytes: every request's `total_len` must be
    /// this. `>= 1`.
    pub input_len: u32,
    /// Most fragments a request may be cut into; a request with more is
    /// BAD_REQUEST. Each slot has a bitmap of this many bits. `>= 1`.
    pub max_frags: u16,
    /// A request not complete this long after its first fragment is
    /// INCOMPLETE. `>= 1`.
    pub timeout_ns: u64,
    /// How long a request is remembered, from its first fragment, so that
    /// its late fragments are not answered again. `>= timeout_ns`.
    pub answered_ttl_ns: u64,
    /// Entries in the answered table (rounded up, see
    /// [`AnsweredTable::new`]). `>= 1`.
    pub answered_capacity: usize,
}

impl ReassemblerConfig {
    /// The defaults for a model whose input is `input_len` bytes (see the
    /// module doc for each value and why).
    pub fn new(input_len: u32) -> Self {
        ReassemblerConfig {
            capacity: DEFAULT_CAPACITY,
            input_len,
            max_frags: u16::try_from(input_len).unwrap_or(u16::MAX),
            timeout_ns: DEFAULT_TIMEOUT_NS,
            answered_ttl_ns: DEFAULT_ANSWERED_TTL_NS,
            answered_capacity: DEFAULT_ANSWERED_CAPACITY,
        }
    }

    /// Checks the values against the ranges documented on each field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.capacity == 0 || self.capacity > MAX_CAPACITY {
            return Err(ConfigError::Capacity {
                capacity: self.capacity,
            });
        }
        if self.input_len == 0 {
            return Err(ConfigError::ZeroInputLen);
        }
        if self.max_frags == 0 {
            return Err(ConfigError::ZeroMaxFrags);
        }
        if self.timeout_ns == 0 {
            return Err(ConfigError::ZeroTimeout);
        }
        if self.answered_ttl_ns < self.timeout_ns {
            return Err(ConfigError::TtlShorterThanTimeout {
                ttl_ns: self.answered_ttl_ns,
                timeout_ns: self.timeout_ns,
            });
        }
        if self.answered_capacity == 0 {
            return Err(ConfigError::ZeroAnsweredCapacity);
        }
        Ok(())
    }
}

/// A [`ReassemblerConfig`] value out of range.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
pub enum ConfigError {
    /// `capacity` is 0 or above [`MAX_CAPACITY`].
    #[error("capacity {capacity} is not in 1..={MAX_CAPACITY}")]
    Capacity {
        /// The configured capacity.
        capacity: usize,
    },
    /// `input_len` is 0.
    #[error("input_len is 0 (a request carries at least one byte)")]
    ZeroInputLen,
    /// `max_frags` is 0.
    #[error("max_frags is 0 (a request has at least one fragment)")]
    ZeroMaxFrags,
    /// `timeout_ns` is 0.
    #[error("timeout_ns is 0")]
    ZeroTimeout,
    /// `answered_ttl_ns < timeout_ns`: a request could be forgotten while it
    /// may still be in flight, and its stragglers answered twice.
    #[error("answered_ttl_ns {ttl_ns} is shorter than timeout_ns {timeout_ns}")]
    TtlShorterThanTimeout {
        /// The configured ttl.
        ttl_ns: u64,
        /// The configured timeout.
        timeout_ns: u64,
    },
    /// `answered_capacity` is 0.
    #[error("answered_capacity is 0")]
    ZeroAnsweredCapacity,
}

/// [`Reassembler::release`] was given a slot that holds no handed-over
/// request. Nothing changed; the misuse is counted in `release_errors`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
pub enum ReleaseError {
    /// The slot number is not below the capacity.
    #[error("{slot} is out of range (capacity {capacity})")]
    OutOfRange {
        /// The slot given.
        slot: SlotId,
        /// The reassembler's capacity.
        capacity: usize,
    },
    /// The slot is free or still being assembled (released twice, or a
    /// slot number that was never handed over).
    #[error("{slot} holds no completed request")]
    NotHanded {
        /// The slot given.
        slot: SlotId,
    },
}

/// A request that is complete: all its bytes are (once the caller has
/// copied the fragment that completed it) in `slot`, which stays the
/// request's until [`Reassembler::release`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Complete {
    /// Where its bytes are.
    pub slot: SlotId,
    /// Which request it is.
    pub key: RequestKey,
    /// The client's timestamp, to echo in the answer.
    pub send_ts_ns: u64,
    /// When its first fragment was seen (for the answer's `latency_us`).
    pub first_seen_ns: u64,
}

/// What to do with one fragment: the result of
/// [`Reassembler::on_fragment`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FragmentOutcome {
    /// Copy the payload into slot `slot` at byte `offset` of the request
    /// (the fragment's `payload_offset`).
    Store {
        /// The request's slot.
        slot: SlotId,
        /// Byte offset of this payload in the request.
        offset: usize,
    },
    /// Same, and this fragment completes the request: once the payload is
    /// copied, the request in `done.slot` is ready for inference.
    StoreAndComplete {
        /// The request's slot (`done.slot`).
        slot: SlotId,
        /// Byte offset of this payload in the request.
        offset: usize,
        /// The complete request.
        done: Complete,
    },
    /// This index of an in-flight request arrived before: drop it.
    Duplicate,
    /// The request was already answered or handed over: drop it, answer
    /// nothing.
    Late,
    /// Answer the request with `status` (BAD_REQUEST or OVERLOADED) now
    /// and drop the fragment. If the request had a slot, it is free already
    /// (`freed`; the next request may get it at once).
    Reject {
        /// Which request to answer.
        key: RequestKey,
        /// Its `send_ts_ns` (its first fragment's), to echo.
        send_ts_ns: u64,
        /// When its first fragment was seen.
        first_seen_ns: u64,
        /// [`Status::BadRequest`] or [`Status::Overloaded`].
        status: Status,
        /// The slot the request held, if it had one, for the caller's
        /// bookkeeping (e.g. to abandon a copy into it).
        freed: Option<SlotId>,
    },
    /// The header breaks a rule `Fragment::new_checked` checks, or its
    /// `if_id`/`request_id` differ from the key's: a caller bug. Dropped,
    /// nothing answered.
    Malformed,
}

impl FragmentOutcome {
    /// The counter this outcome goes to.
    pub fn kind(&self) -> FragmentKind {
        match self {
            FragmentOutcome::Store { .. } => FragmentKind::Stored,
            FragmentOutcome::StoreAndComplete { .. } => FragmentKind::Completed,
            FragmentOutcome::Duplicate => FragmentKind::Duplicate,
            FragmentOutcome::Late => FragmentKind::Late,
            FragmentOutcome::Reject {
                status: Status::Overloaded,
                ..
            } => FragmentKind::Overloaded,
            FragmentOutcome::Reject { .. } => FragmentKind::BadRequest,
            FragmentOutcome::Malformed => FragmentKind::Malformed,
        }
    }
}

/// The named end of one fragment (one counter each).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FragmentKind {
    /// Stored into its request's slot; the request is not complete yet.
    Stored,
    /// Stored, and it completed its request.
    Completed,
    /// An index its in-flight request already had.
    Duplicate,
    /// Its request was already answered or handed over.
    Late,
    /// It made its request BAD_REQUEST (wrong `total_len`, too many
    /// fragments, or disagreeing with the request's first fragment).
    BadRequest,
    /// It was the first of a request that found no free slot.
    Overloaded,
    /// A header `Fragment::new_checked` would refuse, or not the key's.
    Malformed,
}

impl FragmentKind {
    /// Every kind, in counter order.
    pub const ALL: [FragmentKind; 7] = [
        FragmentKind::Stored,
        FragmentKind::Completed,
        FragmentKind::Duplicate,
        FragmentKind::Late,
        FragmentKind::BadRequest,
        FragmentKind::Overloaded,
        FragmentKind::Malformed,
    ];

    /// snake_case name, for counters.
    pub fn name(self) -> &'static str {
        match self {
            FragmentKind::Stored => "stored",
            FragmentKind::Completed => "completed",
            FragmentKind::Duplicate => "duplicate",
            FragmentKind::Late => "late",
            FragmentKind::BadRequest => "bad_request",
            FragmentKind::Overloaded => "overloaded",
            FragmentKind::Malformed => "malformed",
        }
    }
}

/// The named end of one request (one counter each).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RequestEnd {
    /// All fragments arrived; handed to the caller for inference.
    Completed,
    /// Answered BAD_REQUEST (wrong size, too many fragments, disagreement).
    BadRequest,
    /// Answered INCOMPLETE by [`Reassembler::poll_expired`].
    Incomplete,
    /// Answered OVERLOADED: no free slot for it.
    Overloaded,
    /// Handed to the caller by [`Reassembler::drain_in_flight`].
    Drained,
}

impl RequestEnd {
    /// Every end, in counter order.
    pub const ALL: [RequestEnd; 5] = [
        RequestEnd::Completed,
        RequestEnd::BadRequest,
        RequestEnd::Incomplete,
        RequestEnd::Overloaded,
        RequestEnd::Drained,
    ];

    /// snake_case name, for counters.
    pub fn name(self) -> &'static str {
        match self {
            RequestEnd::Completed => "completed",
            RequestEnd::BadRequest => "bad_request",
            RequestEnd::Incomplete => "incomplete",
            RequestEnd::Overloaded => "overloaded",
            RequestEnd::Drained => "drained",
        }
    }
}

/// A request that [`Reassembler::poll_expired`] found not complete within
/// the timeout: answer it INCOMPLETE. Its slot is already free.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Expired {
    /// Which request to answer.
    pub key: RequestKey,
    /// Its `send_ts_ns`, to echo.
    pub send_ts_ns: u64,
    /// When its first fragment was seen.
    pub first_seen_ns: u64,
    /// The slot it held (already free; for the caller's bookkeeping).
    pub slot: SlotId,
    /// Fragments that arrived.
    pub received: u16,
    /// Fragments it has.
    pub frag_count: u16,
}

impl Expired {
    /// The status to answer with: INCOMPLETE.
    pub fn status(&self) -> Status {
        Status::Incomplete
    }
}

/// A request still being assembled, handed to the caller by
/// [`Reassembler::drain_in_flight`] (to answer it, or to pass it on to a
/// process taking over). Its slot is freed when the callback returns, so
/// copy what is needed out of the slot inside it.
#[derive(Clone, Copy, Debug)]
pub struct InFlight<'a> {
    /// Which request.
    pub key: RequestKey,
    /// Where the bytes received so far are.
    pub slot: SlotId,
    /// Its `send_ts_ns`.
    pub send_ts_ns: u64,
    /// When its first fragment was seen.
    pub first_seen_ns: u64,
    /// Its `total_len`.
    pub total_len: u32,
    /// Its `frag_count`.
    pub frag_count: u16,
    /// Bit `i` set: fragment `i` arrived (`frag_count` bits).
    pub received: &'a BitSlice,
}

/// What happened to fragments and requests, one counter per named outcome
/// (see [`FragmentKind`] and [`RequestEnd`]).
///
/// Invariants, at any time: `requests == requests_ended() + in_flight()`,
/// and `in_flight() + handed() + free_slots() == capacity`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReassemblyCounters {
    /// Fragments stored; their request not complete yet.
    pub stored: u64,
    /// Fragments stored that completed their request.
    pub completed: u64,
    /// Fragments whose index their in-flight request already had.
    pub duplicate: u64,
    /// Fragments of requests already answered or handed over.
    pub late: u64,
    /// Fragments that made their request BAD_REQUEST.
    pub bad_request: u64,
    /// First fragments of requests that found no free slot.
    pub overloaded: u64,
    /// Fragments whose header the reassembler cannot use.
    pub malformed: u64,
    /// Requests seen: first fragments that were neither late nor malformed.
    pub requests: u64,
    /// Requests handed over complete.
    pub requests_completed: u64,
    /// Requests answered BAD_REQUEST.
    pub requests_bad_request: u64,
    /// Requests answered INCOMPLETE.
    pub requests_incomplete: u64,
    /// Requests answered OVERLOADED (no free slot, or a shed notice).
    pub requests_overloaded: u64,
    /// Requests handed over by `drain_in_flight`.
    pub requests_drained: u64,
    /// Shed notices from the if-manager (see
    /// [`Reassembler::on_shed_notice`]); not fragments.
    pub shed_notices: u64,
    /// Slots released after inference.
    pub released: u64,
    /// `release` calls refused (slot out of range or not handed over).
    pub release_errors: u64,
    /// Still-remembered answered requests pushed out of the answered table
    /// to make room: each may be answered twice if a straggler comes.
    pub answered_evictions: u64,
}

impl ReassemblyCounters {
    /// The counter of fragments that ended as `kind`.
    pub fn fragments(&self, kind: FragmentKind) -> u64 {
        match kind {
            FragmentKind::Stored => self.stored,
            FragmentKind::Completed => self.completed,
            FragmentKind::Duplicate => self.duplicate,
            FragmentKind::Late => self.late,
            FragmentKind::BadRequest => self.bad_request,
            FragmentKind::Overloaded => self.overloaded,
            FragmentKind::Malformed => self.malformed,
        }
    }

    /// The counter of requests that ended as `end`.
    pub fn requests_ended_as(&self, end: RequestEnd) -> u64 {
        match end {
            RequestEnd::Completed => self.requests_completed,
            RequestEnd::BadRequest => self.requests_bad_request,
            RequestEnd::Incomplete => self.requests_incomplete,
            RequestEnd::Overloaded => self.requests_overloaded,
            RequestEnd::Drained => self.requests_drained,
        }
    }

    /// All fragments seen.
    pub fn fragments_total(&self) -> u64 {
        FragmentKind::ALL.iter().map(|k| self.fragments(*k)).sum()
    }

    /// All requests that have ended, whichever way.
    pub fn requests_ended(&self) -> u64 {
        RequestEnd::ALL
            .iter()
            .map(|e| self.requests_ended_as(*e))
            .sum()
    }

    fn count_fragment(&mut self, kind: FragmentKind) {
        let c = match kind {
            FragmentKind::Stored => &mut self.stored,
            FragmentKind::Completed => &mut self.completed,
            FragmentKind::Duplicate => &mut self.duplicate,
            FragmentKind::Late => &mut self.late,
            FragmentKind::BadRequest => &mut self.bad_request,
            FragmentKind::Overloaded => &mut self.overloaded,
            FragmentKind::Malformed => &mut self.malformed,
        };
        *c += 1;
    }

    fn count_end(&mut self, end: RequestEnd) {
        let c = match end {
            RequestEnd::Completed => &mut self.requests_completed,
            RequestEnd::BadRequest => &mut self.requests_bad_request,
            RequestEnd::Incomplete => &mut self.requests_incomplete,
            RequestEnd::Overloaded => &mut self.requests_overloaded,
            RequestEnd::Drained => &mut self.requests_drained,
        };
        *c += 1;
    }
}

/// A request being assembled.
#[derive(Clone, Copy, Debug)]
struct Assembly {
    key: RequestKey,
    hash: u32,
    total_len: u32,
    frag_count: u16,
    received: u16,
    send_ts_ns: u64,
    first_seen_ns: u64,
}

#[derive(Clone, Copy, Debug)]
enum SlotState {
    Free,
    Assembling(Assembly),
    /// Complete and handed to the caller; free again on `release`.
    Handed,
}

/// The reassembler: see the module doc.
#[derive(Debug)]
pub struct Reassembler {
    cfg: ReassemblerConfig,
    slots: Box<[SlotState]>,
    /// One bit per slot, set when the slot is Free (word-wide search for
    /// the next free slot).
    free: BitBox,
    /// `max_frags` bits per slot: which fragments arrived.
    frags: BitBox,
    index: KeyIndex,
    answered: AnsweredTable,
    /// Where the search for the next free slot starts.
    next_slot: usize,
    in_flight: usize,
    handed: usize,
    /// A new request is refused (OVERLOADED) while this many are handed
    /// ([`Reassembler::set_handed_limit`]).
    handed_limit: usize,
    /// No Assembling request is due before this (a lower bound).
    next_deadline_ns: u64,
    counters: ReassemblyCounters,
}

impl Reassembler {
    /// A reassembler with every slot free; all its memory is allocated
    /// here.
    pub fn new(cfg: ReassemblerConfig) -> Result<Self, ConfigError> {
        cfg.validate()?;
        // At most 2^20 slots × 65535 bits < 2^36: fits a 64-bit usize.
        let bits = cfg.capacity * usize::from(cfg.max_frags);
        Ok(Reassembler {
            cfg,
            slots: vec![SlotState::Free; cfg.capacity].into_boxed_slice(),
            free: bitvec::bitvec![1; cfg.capacity].into_boxed_bitslice(),
            frags: bitvec::bitvec![0; bits].into_boxed_bitslice(),
            index: KeyIndex::new(cfg.capacity),
            answered: AnsweredTable::new(cfg.answered_capacity, cfg.answered_ttl_ns),
            next_slot: 0,
            in_flight: 0,
            handed: 0,
            handed_limit: usize::MAX,
            next_deadline_ns: u64::MAX,
            counters: ReassemblyCounters::default(),
        })
    }

    /// The configuration it was made with.
    pub fn config(&self) -> &ReassemblerConfig {
        &self.cfg
    }

    /// Refuse a new request (OVERLOADED at its first fragment, a slot
    /// never taken) while `limit` or more complete requests are handed
    /// and not yet released; `usize::MAX` (the default) for no limit.
    /// The driver sets it from the batching policy
    /// (`BatchPolicy::admission_limit`): a request that arrives behind
    /// that many cannot be served within its SLO, and refusing it at once
    /// spares the work of converting its payload into a slot, which under
    /// overload takes the CPU the engine needs. Requests in flight are
    /// not affected.
    pub fn set_handed_limit(&mut self, limit: usize) {
        self.handed_limit = limit;
    }

    /// Decides what happens to one fragment of request `key` (whose header
    /// is `header`) that arrived at `now_ns`. `key.if_id` and
    /// `key.request_id` are the header's; the header passed
    /// `Fragment::new_checked`.
    pub fn on_fragment(
        &mut self,
        key: RequestKey,
        header: &FragmentRepr,
        now_ns: u64,
    ) -> FragmentOutcome {
        let outcome = self.decide(key, header, now_ns);
        self.counters.count_fragment(outcome.kind());
        outcome
    }

    fn decide(&mut self, key: RequestKey, h: &FragmentRepr, now_ns: u64) -> FragmentOutcome {
        let Some(range) = h.payload_range() else {
            return FragmentOutcome::Malformed;
        };
        if key.if_id != h.if_id || key.request_id != h.request_id {
            return FragmentOutcome::Malformed;
        }
        let offset = range.start;
        let hash = key_hash(&key);
        let slots = &self.slots;
        let found = self.index.find(
            hash,
            |s| matches!(&slots[s as usize], SlotState::Assembling(a) if a.key == key),
        );
        if let Some(s) = found {
            return self.next_fragment(s as usize, h, offset);
        }

        // Not in flight: late, or a new request.
        match self.answered.first_answer(&key, now_ns) {
            Answer::AlreadyAnswered => return FragmentOutcome::Late,
            Answer::Now { evicted_live } => {
                if evicted_live {
                    self.counters.answered_evictions += 1;
                }
            }
        }
        self.counters.requests += 1;
        let reject = |status| FragmentOutcome::Reject {
            key,
            send_ts_ns: h.send_ts_ns,
            first_seen_ns: now_ns,
            status,
            freed: None,
        };
        if h.total_len != self.cfg.input_len || h.frag_count > self.cfg.max_frags {
            self.counters.count_end(RequestEnd::BadRequest);
            return reject(Status::BadRequest);
        }
        if self.handed >= self.handed_limit {
            self.counters.count_end(RequestEnd::Overloaded);
            return reject(Status::Overloaded);
        }
        let Some(s) = self.allocate() else {
            self.counters.count_end(RequestEnd::Overloaded);
            return reject(Status::Overloaded);
        };
        let slot = SlotId(s as u32);
        if h.frag_count == 1 {
            self.slots[s] = SlotState::Handed;
            self.handed += 1;
            self.counters.count_end(RequestEnd::Completed);
            return FragmentOutcome::StoreAndComplete {
                slot,
                offset,
                done: Complete {
                    slot,
                    key,
                    send_ts_ns: h.send_ts_ns,
                    first_seen_ns: now_ns,
                },
            };
        }
        let bits = self.bitmap_mut(s, h.frag_count);
        bits.fill(false);
        bits.set(usize::from(h.frag_index), true);
        self.slots[s] = SlotState::Assembling(Assembly {
            key,
            hash,
            total_len: h.total_len,
            frag_count: h.frag_count,
            received: 1,
            send_ts_ns: h.send_ts_ns,
            first_seen_ns: now_ns,
        });
        self.index.insert(hash, s as u32);
        self.in_flight += 1;
        let deadline = now_ns.saturating_add(self.cfg.timeout_ns);
        self.next_deadline_ns = self.next_deadline_ns.min(deadline);
        FragmentOutcome::Store { slot, offset }
    }

    /// A fragment of the in-flight request in slot `s`.
    fn next_fragment(&mut self, s: usize, h: &FragmentRepr, offset: usize) -> FragmentOutcome {
        let SlotState::Assembling(mut a) = self.slots[s] else {
            unreachable!("the index holds Assembling slots only");
        };
        let slot = SlotId(s as u32);
        if h.total_len != a.total_len
            || h.frag_count != a.frag_count
            || h.send_ts_ns != a.send_ts_ns
        {
            self.end_assembly(s, &a);
            self.counters.count_end(RequestEnd::BadRequest);
            return FragmentOutcome::Reject {
                key: a.key,
                send_ts_ns: a.send_ts_ns,
                first_seen_ns: a.first_seen_ns,
                status: Status::BadRequest,
                freed: Some(slot),
            };
        }
        if self
            .bitmap_mut(s, a.frag_count)
            .replace(usize::from(h.frag_index), true)
        {
            return FragmentOutcome::Duplicate;
        }
        a.received += 1;
        if a.received < a.frag_count {
            self.slots[s] = SlotState::Assembling(a);
            return FragmentOutcome::Store { slot, offset };
        }
        self.index.remove(a.hash, s as u32);
        self.in_flight -= 1;
        self.slots[s] = SlotState::Handed;
        self.handed += 1;
        self.counters.count_end(RequestEnd::Completed);
        FragmentOutcome::StoreAndComplete {
            slot,
            offset,
            done: Complete {
                slot,
                key: a.key,
                send_ts_ns: a.send_ts_ns,
                first_seen_ns: a.first_seen_ns,
            },
        }
    }

    /// Answers INCOMPLETE, through `on_expired`, every request not complete
    /// `timeout_ns` after its first fragment, and frees its slot. Run it
    /// every few milliseconds; it returns at once while nothing can be due.
    pub fn poll_expired(&mut self, now_ns: u64, mut on_expired: impl FnMut(Expired)) {
        if now_ns < self.next_deadline_ns {
            return;
        }
        let mut next = u64::MAX;
        for s in 0..self.slots.len() {
            let SlotState::Assembling(a) = self.slots[s] else {
                continue;
            };
            let deadline = a.first_seen_ns.saturating_add(self.cfg.timeout_ns);
            if deadline > now_ns {
                next = next.min(deadline);
                continue;
            }
            self.end_assembly(s, &a);
            self.counters.count_end(RequestEnd::Incomplete);
            on_expired(Expired {
                key: a.key,
                send_ts_ns: a.send_ts_ns,
                first_seen_ns: a.first_seen_ns,
                slot: SlotId(s as u32),
                received: a.received,
                frag_count: a.frag_count,
            });
        }
        self.next_deadline_ns = next;
    }

    /// The if-manager could not deliver a fragment of request `key` (its
    /// ring to this IF was full) and sent this shed notice instead
    /// (`header` is that fragment's; see
    /// [`SHED_NOTICE_TYPE`](kp_wire::SHED_NOTICE_TYPE)). The request is
    /// answered OVERLOADED now — a `Reject`, with the slot it held, if any,
    /// free already — unless it was answered or handed over before (`Late`:
    /// stay silent). Either way its later fragments are `Late`.
    pub fn on_shed_notice(
        &mut self,
        key: RequestKey,
        header: &FragmentRepr,
        now_ns: u64,
    ) -> FragmentOutcome {
        self.counters.shed_notices += 1;
        let hash = key_hash(&key);
        let slots = &self.slots;
        let found = self.index.find(
            hash,
            |s| matches!(&slots[s as usize], SlotState::Assembling(a) if a.key == key),
        );
        if let Some(s) = found {
            let s = s as usize;
            let SlotState::Assembling(a) = self.slots[s] else {
                unreachable!("the index holds Assembling slots only");
            };
            self.end_assembly(s, &a);
            self.counters.count_end(RequestEnd::Overloaded);
            return FragmentOutcome::Reject {
                key,
                send_ts_ns: a.send_ts_ns,
                first_seen_ns: a.first_seen_ns,
                status: Status::Overloaded,
                freed: Some(SlotId(s as u32)),
            };
        }
        match self.answered.first_answer(&key, now_ns) {
            Answer::AlreadyAnswered => FragmentOutcome::Late,
            Answer::Now { evicted_live } => {
                if evicted_live {
                    self.counters.answered_evictions += 1;
                }
                self.counters.requests += 1;
                self.counters.count_end(RequestEnd::Overloaded);
                FragmentOutcome::Reject {
                    key,
                    send_ts_ns: header.send_ts_ns,
                    first_seen_ns: now_ns,
                    status: Status::Overloaded,
                    freed: None,
                }
            }
        }
    }

    /// Gives slot `slot` back after the request handed over in it was
    /// inferred (answered); a later request may get it at once.
    pub fn release(&mut self, slot: SlotId) -> Result<(), ReleaseError> {
        let s = slot.index();
        let state = match self.slots.get(s) {
            Some(state) => *state,
            None => {
                self.counters.release_errors += 1;
                return Err(ReleaseError::OutOfRange {
                    slot,
                    capacity: self.cfg.capacity,
                });
            }
        };
        if !matches!(state, SlotState::Handed) {
            self.counters.release_errors += 1;
            return Err(ReleaseError::NotHanded { slot });
        }
        self.slots[s] = SlotState::Free;
        self.free.set(s, true);
        self.handed -= 1;
        self.counters.released += 1;
        Ok(())
    }

    /// Hands every request still being assembled to `f`, in slot order,
    /// and frees its slot when `f` returns (counted as `drained`). For a
    /// shadow switchover: the caller answers them or passes them on.
    /// Handed-over (complete, unreleased) requests are not touched, and
    /// the drained requests stay remembered, so their later fragments are
    /// `Late`.
    pub fn drain_in_flight(&mut self, mut f: impl FnMut(InFlight<'_>)) {
        for s in 0..self.slots.len() {
            let SlotState::Assembling(a) = self.slots[s] else {
                continue;
            };
            f(InFlight {
                key: a.key,
                slot: SlotId(s as u32),
                send_ts_ns: a.send_ts_ns,
                first_seen_ns: a.first_seen_ns,
                total_len: a.total_len,
                frag_count: a.frag_count,
                received: self.bitmap(s, a.frag_count),
            });
            self.end_assembly(s, &a);
            self.counters.count_end(RequestEnd::Drained);
        }
        self.next_deadline_ns = u64::MAX;
    }

    /// Remembers `key` as answered (by another process: a switchover's
    /// predecessor), so its fragments are `Late` for the answered
    /// time-to-live. Not for a request in flight here.
    pub fn mark_answered(&mut self, key: &RequestKey, now_ns: u64) {
        if let Answer::Now { evicted_live: true } = self.answered.first_answer(key, now_ns) {
            self.counters.answered_evictions += 1;
        }
    }

    /// The keys of the requests being assembled, in slot order.
    pub fn in_flight_keys(&self) -> Vec<RequestKey> {
        self.slots
            .iter()
            .filter_map(|s| match s {
                SlotState::Assembling(a) => Some(a.key),
                _ => None,
            })
            .collect()
    }

    /// Every request answered (or begun) within the answered time-to-live,
    /// most recent first: in flight, handed over and answered alike.
    pub fn answered_keys(&self, now_ns: u64) -> Vec<RequestKey> {
        self.answered.live_keys(now_ns)
    }

    /// Requests being assembled.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Complete requests handed over and not yet released.
    pub fn handed(&self) -> usize {
        self.handed
    }

    /// Slots a new request could get.
    pub fn free_slots(&self) -> usize {
        self.cfg.capacity - self.in_flight - self.handed
    }

    /// The counters.
    pub fn counters(&self) -> &ReassemblyCounters {
        &self.counters
    }

    /// Takes slot `s` out of the Free set: the first free slot at or after
    /// `next_slot`, circularly.
    fn allocate(&mut self) -> Option<usize> {
        let start = self.next_slot;
        let s = match self.free[start..].first_one() {
            Some(i) => start + i,
            None => self.free[..start].first_one()?,
        };
        self.free.set(s, false);
        self.next_slot = (s + 1) % self.cfg.capacity;
        Some(s)
    }

    /// Ends the Assembling request `a` in slot `s`: out of the index, slot
    /// free. (Its deadline may stay in `next_deadline_ns`: a lower bound.)
    fn end_assembly(&mut self, s: usize, a: &Assembly) {
        let removed = self.index.remove(a.hash, s as u32);
        debug_assert!(removed, "an Assembling slot is in the index");
        self.slots[s] = SlotState::Free;
        self.free.set(s, true);
        self.in_flight -= 1;
    }

    fn bitmap(&self, s: usize, frag_count: u16) -> &BitSlice {
        let start = s * usize::from(self.cfg.max_frags);
        &self.frags[start..start + usize::from(frag_count)]
    }

    fn bitmap_mut(&mut self, s: usize, frag_count: u16) -> &mut BitSlice {
        let start = s * usize::from(self.cfg.max_frags);
        &mut self.frags[start..start + usize::from(frag_count)]
    }
}

/// A well-mixed 32-bit hash of a key (SplitMix64's finalizer over its
/// fields). Fixed, not seeded: a client that crafts collisions only slows
/// its own lookups to a linear scan of the in-flight requests (see
/// `index.rs`).
fn key_hash(k: &RequestKey) -> u32 {
    let addr = (u64::from(u32::from(k.src_ip)) << 32)
        | (u64::from(k.src_port) << 16)
        | u64::from(k.if_id.0);
    let mut x = addr.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ k.request_id;
    x ^= x >> 30;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^= x >> 31;
    (x >> 32) as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use kp_wire::IfId;
    use std::net::Ipv4Addr;

    /// Input size: every frag_count in 1..=9 is a valid geometry for it.
    const LEN: u32 = 60;
    const IF: IfId = IfId(3);

    fn cfg() -> ReassemblerConfig {
        ReassemblerConfig {
            capacity: 8,
            input_len: LEN,
            max_frags: 6,
            timeout_ns: 100,
            answered_ttl_ns: 400,
            answered_capacity: 1024,
        }
    }

    fn reassembler(cfg: ReassemblerConfig) -> Reassembler {
        Reassembler::new(cfg).unwrap()
    }

    fn key(client: u8, id: u64) -> RequestKey {
        RequestKey {
            src_ip: Ipv4Addr::new(10, 0, 0, client),
            src_port: 4000 + u16::from(client),
            if_id: IF,
            request_id: id,
        }
    }

    fn hdr(id: u64, index: u16, count: u16) -> FragmentRepr {
        FragmentRepr {
            if_id: IF,
            request_id: id,
            total_len: LEN,
            frag_index: index,
            frag_count: count,
            send_ts_ns: 1_000 + id,
        }
    }

    fn feed(
        r: &mut Reassembler,
        client: u8,
        id: u64,
        index: u16,
        count: u16,
        now: u64,
    ) -> FragmentOutcome {
        r.on_fragment(key(client, id), &hdr(id, index, count), now)
    }

    fn expired(r: &mut Reassembler, now: u64) -> Vec<Expired> {
        let mut v = Vec::new();
        r.poll_expired(now, |e| v.push(e));
        v
    }

    /// The accounting the counters' doc promises.
    fn check_accounting(r: &Reassembler) {
        let c = r.counters();
        assert_eq!(
            c.requests,
            c.requests_ended() + r.in_flight() as u64,
            "{c:?}"
        );
        assert_eq!(
            r.in_flight() + r.handed() + r.free_slots(),
            r.config().capacity
        );
        assert_eq!(r.free.count_ones(), r.free_slots());
    }

    fn stored(slot: u32, offset: usize) -> FragmentOutcome {
        FragmentOutcome::Store {
            slot: SlotId(slot),
            offset,
        }
    }

    fn completed(
        slot: u32,
        offset: usize,
        client: u8,
        id: u64,
        first_seen_ns: u64,
    ) -> FragmentOutcome {
        FragmentOutcome::StoreAndComplete {
            slot: SlotId(slot),
            offset,
            done: Complete {
                slot: SlotId(slot),
                key: key(client, id),
                send_ts_ns: 1_000 + id,
                first_seen_ns,
            },
        }
    }

    fn rejected(
        client: u8,
        id: u64,
        first_seen_ns: u64,
        status: Status,
        freed: Option<u32>,
    ) -> FragmentOutcome {
        FragmentOutcome::Reject {
            key: key(client, id),
            send_ts_ns: 1_000 + id,
            first_seen_ns,
            status,
            freed: freed.map(SlotId),
        }
    }

    #[test]
    fn in_order_fragments_complete_on_the_last_one() {
        let mut r = reassembler(cfg());
        assert_eq!(feed(&mut r, 1, 7, 0, 4, 10), stored(0, 0));
        assert_eq!(feed(&mut r, 1, 7, 1, 4, 11), stored(0, 15));
        assert_eq!(feed(&mut r, 1, 7, 2, 4, 12), stored(0, 30));
        assert_eq!(r.in_flight(), 1);
        assert_eq!(feed(&mut r, 1, 7, 3, 4, 13), completed(0, 45, 1, 7, 10));
        assert_eq!((r.in_flight(), r.handed()), (0, 1));
        let c = r.counters();
        assert_eq!(
            (c.stored, c.completed, c.requests, c.requests_completed),
            (3, 1, 1, 1)
        );
        check_accounting(&r);
    }

    #[test]
    fn reversed_fragments_complete_on_fragment_zero() {
        let mut r = reassembler(cfg());
        assert_eq!(feed(&mut r, 1, 7, 3, 4, 10), stored(0, 45));
        assert_eq!(feed(&mut r, 1, 7, 2, 4, 11), stored(0, 30));
        assert_eq!(feed(&mut r, 1, 7, 1, 4, 12), stored(0, 15));
        assert_eq!(feed(&mut r, 1, 7, 0, 4, 13), completed(0, 0, 1, 7, 10));
        check_accounting(&r);
    }

    #[test]
    fn single_fragment_request_completes_at_once() {
        let mut r = reassembler(cfg());
        assert_eq!(feed(&mut r, 1, 7, 0, 1, 5), completed(0, 0, 1, 7, 5));
        assert_eq!((r.in_flight(), r.handed()), (0, 1));
        assert_eq!(feed(&mut r, 1, 7, 0, 1, 6), FragmentOutcome::Late);
        check_accounting(&r);
    }

    #[test]
    fn interleaved_requests_of_three_clients_stay_apart() {
        // Same request id from three clients: three requests.
        let mut r = reassembler(cfg());
        let mut slot_of = [None; 3];
        let mut done = Vec::new();
        for index in [2u16, 0, 1] {
            for client in 0..3u8 {
                let out = feed(&mut r, client, 1, index, 3, 100);
                let (slot, offset) = match out {
                    FragmentOutcome::Store { slot, offset } => (slot, offset),
                    FragmentOutcome::StoreAndComplete {
                        slot,
                        offset,
                        done: d,
                    } => {
                        assert_eq!(d.key, key(client, 1));
                        done.push(d);
                        (slot, offset)
                    }
                    other => panic!("{other:?}"),
                };
                assert_eq!(offset, usize::from(index) * 20);
                let s = *slot_of[usize::from(client)].get_or_insert(slot);
                assert_eq!(s, slot, "client {client} changed slot");
            }
        }
        assert_eq!(slot_of, [Some(SlotId(0)), Some(SlotId(1)), Some(SlotId(2))]);
        assert_eq!(done.len(), 3);
        assert_eq!(r.counters().requests_completed, 3);
        check_accounting(&r);
    }

    #[test]
    fn duplicates_are_dropped_and_counted() {
        let mut r = reassembler(cfg());
        assert_eq!(feed(&mut r, 1, 7, 0, 2, 10), stored(0, 0));
        assert_eq!(feed(&mut r, 1, 7, 0, 2, 11), FragmentOutcome::Duplicate);
        assert_eq!(feed(&mut r, 1, 7, 0, 2, 12), FragmentOutcome::Duplicate);
        assert_eq!(feed(&mut r, 1, 7, 1, 2, 13), completed(0, 30, 1, 7, 10));
        assert_eq!(r.counters().duplicate, 2);
        check_accounting(&r);
    }

    #[test]
    fn a_disagreeing_fragment_makes_the_request_bad_once_and_frees_its_slot() {
        let twists: [fn(&mut FragmentRepr); 3] = [
            |h| h.total_len = LEN - 1,
            |h| h.frag_count += 1,
            |h| h.send_ts_ns += 1,
        ];
        for twist in twists {
            let mut r = reassembler(cfg());
            assert_eq!(feed(&mut r, 1, 7, 0, 4, 10), stored(0, 0));
            assert_eq!(feed(&mut r, 1, 7, 1, 4, 11), stored(0, 15));
            let mut h = hdr(7, 2, 4);
            twist(&mut h);
            // The answer echoes the first fragment's send_ts_ns.
            assert_eq!(
                r.on_fragment(key(1, 7), &h, 12),
                rejected(1, 7, 10, Status::BadRequest, Some(0))
            );
            assert_eq!((r.in_flight(), r.free_slots()), (0, 8));
            // Stragglers, agreeing or not, are late.
            assert_eq!(feed(&mut r, 1, 7, 3, 4, 13), FragmentOutcome::Late);
            assert_eq!(r.on_fragment(key(1, 7), &h, 14), FragmentOutcome::Late);
            let c = r.counters();
            assert_eq!((c.bad_request, c.requests_bad_request, c.late), (1, 1, 2));
            check_accounting(&r);
        }
    }

    #[test]
    fn disagreement_wins_over_duplicate() {
        let mut r = reassembler(cfg());
        feed(&mut r, 1, 7, 0, 2, 10);
        let mut h = hdr(7, 0, 2);
        h.send_ts_ns = 5;
        assert_eq!(
            r.on_fragment(key(1, 7), &h, 11),
            rejected(1, 7, 10, Status::BadRequest, Some(0))
        );
    }

    #[test]
    fn a_wrong_total_len_is_bad_request_at_once_without_a_slot() {
        let mut r = reassembler(cfg());
        let mut h = hdr(7, 1, 3);
        h.total_len = LEN + 4;
        assert_eq!(
            r.on_fragment(key(1, 7), &h, 10),
            rejected(1, 7, 10, Status::BadRequest, None)
        );
        assert_eq!(r.free_slots(), 8);
        assert_eq!(r.on_fragment(key(1, 7), &h, 11), FragmentOutcome::Late);
        // even a fragment with the right size: the request was answered
        assert_eq!(feed(&mut r, 1, 7, 0, 3, 12), FragmentOutcome::Late);
        assert_eq!(r.counters().requests_bad_request, 1);
        check_accounting(&r);
    }

    #[test]
    fn too_many_fragments_is_bad_request_at_once() {
        let mut r = reassembler(cfg());
        assert_eq!(feed(&mut r, 1, 7, 0, 6, 10), stored(0, 0)); // max_frags: fine
        assert_eq!(
            feed(&mut r, 1, 8, 0, 7, 10),
            rejected(1, 8, 10, Status::BadRequest, None)
        );
        assert_eq!(feed(&mut r, 1, 8, 1, 7, 10), FragmentOutcome::Late);
        check_accounting(&r);
    }

    #[test]
    fn no_free_slot_is_overloaded_once_per_request() {
        let mut r = reassembler(ReassemblerConfig {
            capacity: 2,
            ..cfg()
        });
        feed(&mut r, 1, 1, 0, 2, 10);
        feed(&mut r, 1, 2, 0, 1, 10); // complete, handed, not released
        assert_eq!(
            feed(&mut r, 2, 1, 0, 2, 11),
            rejected(2, 1, 11, Status::Overloaded, None)
        );
        assert_eq!(feed(&mut r, 2, 1, 1, 2, 12), FragmentOutcome::Late);
        assert_eq!(feed(&mut r, 2, 1, 0, 2, 13), FragmentOutcome::Late);
        let c = r.counters();
        assert_eq!((c.overloaded, c.requests_overloaded, c.late), (1, 1, 2));
        // A slot coming back lets the next request in.
        r.release(SlotId(1)).unwrap();
        assert_eq!(feed(&mut r, 2, 2, 0, 2, 14), stored(1, 0));
        check_accounting(&r);
    }

    #[test]
    fn a_new_request_is_overloaded_while_the_handed_limit_is_reached() {
        let mut r = reassembler(cfg());
        r.set_handed_limit(1);
        feed(&mut r, 1, 1, 0, 2, 10); // assembling: not handed
        feed(&mut r, 1, 2, 0, 1, 10); // complete, handed, not released
                                      // Slots are free, but one request is handed: refused at once.
        assert_eq!(
            feed(&mut r, 2, 1, 0, 2, 11),
            rejected(2, 1, 11, Status::Overloaded, None)
        );
        assert_eq!(feed(&mut r, 2, 1, 1, 2, 12), FragmentOutcome::Late);
        // A request in flight still completes.
        assert!(matches!(
            feed(&mut r, 1, 1, 1, 2, 13),
            FragmentOutcome::StoreAndComplete { .. }
        ));
        let c = r.counters();
        assert_eq!((c.overloaded, c.requests_overloaded), (1, 1));
        // Released, or the limit lifted: new requests are let in again.
        r.release(SlotId(1)).unwrap();
        r.release(SlotId(0)).unwrap();
        assert_eq!(feed(&mut r, 2, 2, 0, 2, 14), stored(2, 0));
        r.set_handed_limit(usize::MAX);
        feed(&mut r, 3, 1, 0, 1, 15);
        feed(&mut r, 3, 2, 0, 1, 15);
        assert!(matches!(
            feed(&mut r, 3, 3, 0, 1, 15),
            FragmentOutcome::StoreAndComplete { .. }
        ));
        check_accounting(&r);
    }

    #[test]
    fn timeout_is_incomplete_once_and_frees_the_slot() {
        let mut r = reassembler(cfg());
        feed(&mut r, 1, 7, 0, 3, 10);
        feed(&mut r, 1, 7, 2, 3, 50);
        assert!(expired(&mut r, 109).is_empty());
        assert_eq!(
            expired(&mut r, 110),
            vec![Expired {
                key: key(1, 7),
                send_ts_ns: 1_007,
                first_seen_ns: 10,
                slot: SlotId(0),
                received: 2,
                frag_count: 3,
            }]
        );
        assert_eq!(expired(&mut r, 110)[..], []);
        assert_eq!(expired(&mut r, 10_000)[..], []);
        assert_eq!((r.in_flight(), r.free_slots()), (0, 8));
        // The missing fragment, now: late.
        assert_eq!(feed(&mut r, 1, 7, 1, 3, 120), FragmentOutcome::Late);
        assert_eq!(r.counters().requests_incomplete, 1);
        check_accounting(&r);
    }

    #[test]
    fn expiry_tracks_the_earliest_live_deadline() {
        let mut r = reassembler(cfg());
        feed(&mut r, 1, 1, 0, 2, 0); // due at 100, but completes
        feed(&mut r, 1, 2, 0, 2, 50); // due at 150
        feed(&mut r, 1, 1, 1, 2, 60);
        assert!(expired(&mut r, 100).is_empty());
        assert!(expired(&mut r, 149).is_empty());
        let e = expired(&mut r, 150);
        assert_eq!(e.len(), 1);
        assert_eq!(e[0].key, key(1, 2));
    }

    #[test]
    fn a_request_completed_before_the_next_poll_is_served() {
        // The timeout is enforced at poll granularity (module doc).
        let mut r = reassembler(cfg());
        feed(&mut r, 1, 7, 0, 2, 0);
        assert_eq!(feed(&mut r, 1, 7, 1, 2, 105), completed(0, 30, 1, 7, 0));
        assert!(expired(&mut r, 106).is_empty());
    }

    #[test]
    fn late_after_completion_rejection_and_expiry() {
        let mut r = reassembler(cfg());
        // completed
        feed(&mut r, 1, 1, 0, 2, 0);
        feed(&mut r, 1, 1, 1, 2, 0);
        // rejected (disagreement)
        feed(&mut r, 1, 2, 0, 2, 0);
        r.on_fragment(
            key(1, 2),
            &FragmentRepr {
                send_ts_ns: 0,
                ..hdr(2, 1, 2)
            },
            0,
        );
        // expired
        feed(&mut r, 1, 3, 0, 2, 0);
        assert_eq!(expired(&mut r, 100).len(), 1);
        for id in 1..=3 {
            for index in 0..2 {
                assert_eq!(feed(&mut r, 1, id, index, 2, 200), FragmentOutcome::Late);
            }
        }
        let c = r.counters();
        assert_eq!(c.late, 6);
        assert_eq!(
            (
                c.requests_completed,
                c.requests_bad_request,
                c.requests_incomplete
            ),
            (1, 1, 1)
        );
        check_accounting(&r);
    }

    #[test]
    fn a_request_is_remembered_for_the_ttl_from_its_first_fragment() {
        let mut r = reassembler(cfg());
        feed(&mut r, 1, 7, 0, 1, 0);
        r.release(SlotId(0)).unwrap();
        assert_eq!(feed(&mut r, 1, 7, 0, 1, 399), FragmentOutcome::Late);
        // ttl 400 after the first fragment: the id may be used again
        assert_eq!(feed(&mut r, 1, 7, 0, 1, 400), completed(1, 0, 1, 7, 400));
        assert_eq!(r.counters().requests, 2);
    }

    #[test]
    fn in_order_requests_get_consecutive_slots_circularly() {
        let mut r = reassembler(cfg());
        let mut slots = Vec::new();
        let send = |r: &mut Reassembler, id: u64| {
            feed(r, 1, id, 0, 2, id);
            match feed(r, 1, id, 1, 2, id) {
                FragmentOutcome::StoreAndComplete { done, .. } => done.slot.0,
                other => panic!("{other:?}"),
            }
        };
        for id in 0..6 {
            slots.push(send(&mut r, id));
        }
        assert_eq!(slots, [0, 1, 2, 3, 4, 5]);
        // Inference is done with all but slot 2.
        for s in [0, 1, 3, 4, 5] {
            r.release(SlotId(s)).unwrap();
        }
        // Next after the last one allocated, wrapping, skipping the held one.
        let next: Vec<u32> = (6..12).map(|id| send(&mut r, id)).collect();
        assert_eq!(next, [6, 7, 0, 1, 3, 4]);
        check_accounting(&r);
    }

    #[test]
    fn release_makes_a_slot_reusable_and_refuses_misuse() {
        let mut r = reassembler(ReassemblerConfig {
            capacity: 1,
            ..cfg()
        });
        assert_eq!(
            r.release(SlotId(0)),
            Err(ReleaseError::NotHanded { slot: SlotId(0) })
        );
        feed(&mut r, 1, 1, 0, 2, 0);
        assert_eq!(
            r.release(SlotId(0)),
            Err(ReleaseError::NotHanded { slot: SlotId(0) }),
            "still being assembled"
        );
        assert_eq!(feed(&mut r, 1, 1, 1, 2, 0), completed(0, 30, 1, 1, 0));
        assert_eq!(
            feed(&mut r, 1, 2, 0, 2, 1),
            rejected(1, 2, 1, Status::Overloaded, None)
        );
        assert_eq!(r.release(SlotId(0)), Ok(()));
        assert_eq!(
            r.release(SlotId(0)),
            Err(ReleaseError::NotHanded { slot: SlotId(0) }),
            "released twice"
        );
        assert_eq!(
            r.release(SlotId(1)),
            Err(ReleaseError::OutOfRange {
                slot: SlotId(1),
                capacity: 1
            })
        );
        assert_eq!(feed(&mut r, 1, 3, 0, 2, 2), stored(0, 0));
        let c = r.counters();
        assert_eq!((c.released, c.release_errors), (1, 4));
        check_accounting(&r);
    }

    #[test]
    fn unusable_headers_are_malformed_and_start_nothing() {
        let mut r = reassembler(cfg());
        let bad_index = FragmentRepr {
            frag_index: 4,
            ..hdr(7, 0, 4)
        };
        let wrong_size = FragmentRepr {
            total_len: 4,
            ..hdr(7, 0, 4)
        }; // a valid geometry: stride 1
        assert_eq!(
            r.on_fragment(key(1, 7), &bad_index, 0),
            FragmentOutcome::Malformed
        );
        assert_eq!(
            r.on_fragment(
                key(1, 7),
                &FragmentRepr {
                    total_len: 0,
                    ..hdr(7, 0, 1)
                },
                0
            ),
            FragmentOutcome::Malformed
        );
        assert_eq!(
            r.on_fragment(
                key(1, 7),
                &FragmentRepr {
                    total_len: 5,
                    ..hdr(7, 0, 4)
                },
                0
            ),
            FragmentOutcome::Malformed,
            "(4-1) * ceil(5/4) >= 5: empty last fragment"
        );
        assert_eq!(
            r.on_fragment(key(1, 8), &hdr(7, 0, 4), 0),
            FragmentOutcome::Malformed
        );
        let other_if = RequestKey {
            if_id: IfId(4),
            ..key(1, 7)
        };
        assert_eq!(
            r.on_fragment(other_if, &hdr(7, 0, 4), 0),
            FragmentOutcome::Malformed
        );
        assert_eq!(r.counters().malformed, 5);
        assert_eq!(r.counters().requests, 0);
        // The request itself was not touched.
        assert_eq!(
            r.on_fragment(key(1, 7), &wrong_size, 0),
            rejected(1, 7, 0, Status::BadRequest, None),
            "well-formed but not the model's size"
        );
        check_accounting(&r);
    }

    #[test]
    fn drain_hands_over_what_is_being_assembled() {
        let mut r = reassembler(cfg());
        feed(&mut r, 1, 1, 0, 1, 0); // handed: not drained
        feed(&mut r, 1, 2, 2, 3, 5);
        feed(&mut r, 2, 2, 0, 2, 6);
        let mut got = Vec::new();
        r.drain_in_flight(|f| {
            got.push((
                f.key,
                f.slot,
                f.first_seen_ns,
                f.frag_count,
                f.received.iter_ones().collect::<Vec<_>>(),
            ));
        });
        assert_eq!(
            got,
            vec![
                (key(1, 2), SlotId(1), 5, 3, vec![2]),
                (key(2, 2), SlotId(2), 6, 2, vec![0]),
            ]
        );
        assert_eq!((r.in_flight(), r.handed(), r.free_slots()), (0, 1, 7));
        assert_eq!(feed(&mut r, 1, 2, 0, 3, 7), FragmentOutcome::Late);
        assert!(expired(&mut r, 1_000).is_empty());
        assert_eq!(r.counters().requests_drained, 2);
        check_accounting(&r);
    }

    #[test]
    fn a_reused_slot_starts_with_an_empty_bitmap() {
        let mut r = reassembler(ReassemblerConfig {
            capacity: 1,
            ..cfg()
        });
        feed(&mut r, 1, 1, 0, 3, 0);
        feed(&mut r, 1, 1, 1, 3, 0);
        assert_eq!(expired(&mut r, 100).len(), 1);
        // Same slot, new request: index 1 is not a duplicate.
        assert_eq!(feed(&mut r, 1, 2, 1, 3, 101), stored(0, 20));
        assert_eq!(feed(&mut r, 1, 2, 0, 3, 101), stored(0, 0));
        assert_eq!(feed(&mut r, 1, 2, 2, 3, 101), completed(0, 40, 1, 2, 101));
    }

    #[test]
    fn outcome_kinds_and_counters_line_up() {
        let mut r = reassembler(ReassemblerConfig {
            capacity: 1,
            ..cfg()
        });
        let outs = [
            feed(&mut r, 1, 1, 0, 2, 0),
            feed(&mut r, 1, 1, 0, 2, 0),
            feed(&mut r, 1, 2, 0, 2, 0),
            feed(&mut r, 1, 1, 1, 2, 0),
            feed(&mut r, 1, 1, 1, 2, 0),
            feed(&mut r, 1, 3, 0, 7, 0),
            r.on_fragment(key(1, 4), &hdr(4, 2, 2), 0),
        ];
        let kinds: Vec<_> = outs.iter().map(|o| o.kind().name()).collect();
        assert_eq!(
            kinds,
            [
                "stored",
                "duplicate",
                "overloaded",
                "completed",
                "late",
                "bad_request",
                "malformed"
            ]
        );
        let c = r.counters();
        for k in FragmentKind::ALL {
            assert_eq!(c.fragments(k), 1, "{}", k.name());
        }
        assert_eq!(c.fragments_total(), 7);
        assert_eq!(
            RequestEnd::ALL.map(|e| (e.name(), c.requests_ended_as(e))),
            [
                ("completed", 1),
                ("bad_request", 1),
                ("incomplete", 0),
                ("overloaded", 1),
                ("drained", 0)
            ]
        );
        check_accounting(&r);
    }

    #[test]
    fn config_defaults_and_validation() {
        let d = ReassemblerConfig::new(150_528);
        assert_eq!(d.capacity, 64);
        assert_eq!(d.max_frags, u16::MAX);
        assert_eq!(d.timeout_ns, 100_000_000);
        assert_eq!(d.answered_ttl_ns, 400_000_000);
        assert_eq!(ReassemblerConfig::new(3).max_frags, 3);
        assert!(Reassembler::new(d).is_ok());

        let bad = |f: fn(&mut ReassemblerConfig)| {
            let mut c = cfg();
            f(&mut c);
            Reassembler::new(c).unwrap_err()
        };
        assert_eq!(
            bad(|c| c.capacity = 0),
            ConfigError::Capacity { capacity: 0 }
        );
        assert_eq!(
            bad(|c| c.capacity = MAX_CAPACITY + 1),
            ConfigError::Capacity {
                capacity: MAX_CAPACITY + 1
            }
        );
        assert_eq!(bad(|c| c.input_len = 0), ConfigError::ZeroInputLen);
        assert_eq!(bad(|c| c.max_frags = 0), ConfigError::ZeroMaxFrags);
        assert_eq!(bad(|c| c.timeout_ns = 0), ConfigError::ZeroTimeout);
        assert_eq!(
            bad(|c| c.answered_ttl_ns = 99),
            ConfigError::TtlShorterThanTimeout {
                ttl_ns: 99,
                timeout_ns: 100
            }
        );
        assert_eq!(
            bad(|c| c.answered_capacity = 0),
            ConfigError::ZeroAnsweredCapacity
        );
        assert_eq!(
            ConfigError::Capacity { capacity: 0 }.to_string(),
            "capacity 0 is not in 1..=1048576"
        );
    }

    #[test]
    fn slot_ids_print_short() {
        assert_eq!(format!("{:?} {}", SlotId(3), SlotId(4)), "slot3 slot4");
        assert_eq!(
            ReleaseError::NotHanded { slot: SlotId(2) }.to_string(),
            "slot2 holds no completed request"
        );
    }
}
