//! The body of the `reassembler` fuzz target (`fuzz/`), here so that
//! `cargo test -p libml` replays its committed seed corpus
//! (`fuzz/corpus/reassembler/`) through exactly the code the fuzzer runs.
//!
//! The fuzz input is read as a [`Reassembler`] configuration (a few slots,
//! a small input, timeouts from 1 ns to `u64::MAX`, answered tables small
//! enough to evict) and then a sequence of operations: fragments of ~64
//! request keys with agreeing, disagreeing and arbitrary headers, the clock
//! stepping forward a little, jumping far ahead, or set anywhere (backwards
//! too, and to the edge of `u64`), expiry polls, releases (of handed slots
//! and of arbitrary slot numbers), shed notices, drains and
//! `mark_answered`. Each operation goes to the reassembler and to a small
//! reference model here that follows the rules of the module doc with
//! plain data, and after each the two must agree:
//!
//! - every fragment's outcome, every poll's expired requests and every
//!   drain's in-flight requests are the ones the model predicts (slots and
//!   offsets included); in particular a request gets exactly one end
//!   (completed, BAD_REQUEST, INCOMPLETE, OVERLOADED or drained), a
//!   fragment of a request that ended is `Late` for the answered ttl, and a
//!   request is never silently forgotten while in flight;
//! - the one thing the model does not predict, evictions from the answered
//!   table, may only make a request the model remembers look new when
//!   `answered_evictions` has grown since it was remembered, or when the
//!   clock went back after passing the entry's ttl (the table may then
//!   have reused its place, uncounted: the module doc's clock "never goes
//!   back", so this is the one rule the fuzzer's backward clock bends);
//! - the counters are the model's, and add up (`requests ==
//!   requests_ended() + in_flight()`, `in_flight + handed + free ==
//!   capacity`, the free bitmap agrees);
//! - bounded memory: no call allocates (the caller's allocation counter,
//!   if it passes one, does not move across any call);
//! - at the end, draining and releasing everything leaves every slot free
//!   and every request ended exactly once.
//!
//! A broken invariant panics: that is the bug the fuzzer reports. Unlike
//! the reassembler, this code allocates and panics on purpose.

use std::net::Ipv4Addr;

use kp_wire::{FragmentRepr, IfId, RequestKey, Status};

use super::{
    Complete, Expired, FragmentOutcome, Reassembler, ReassemblerConfig, ReassemblyCounters,
    ReleaseError, RequestEnd, SlotId,
};

/// Runs `data` (a configuration, then operations) through a [`Reassembler`]
/// and the reference model; panics on the first disagreement or broken
/// invariant. Allocations are not checked (see [`reassembler_counting`]).
pub fn reassembler(data: &[u8]) {
    reassembler_counting(data, || 0);
}

/// [`reassembler`], also asserting that `allocations` (a count of heap
/// allocations made by this thread so far, kept by the caller's global
/// allocator) does not move across any call into the reassembler after
/// [`Reassembler::new`].
pub fn reassembler_counting(data: &[u8], allocations: fn() -> u64) {
    run(data, allocations);
}

/// The body; returns the counters as they were before the final drain
/// (for the seed tests).
fn run(data: &[u8], allocations: fn() -> u64) -> ReassemblyCounters {
    let mut input = Input(data);
    let cfg = config(&mut input);
    let mut r = Reassembler::new(cfg).expect("the fuzz configurations are valid");
    let mut m = Model::new(cfg);
    let mut now = clock_start(input.byte());
    // Pre-sized so that pushing from the callbacks never allocates.
    let mut expired: Vec<Expired> = Vec::with_capacity(cfg.capacity);
    let mut drained: Vec<Drained> = Vec::with_capacity(cfg.capacity);

    while let Some(op) = input.next() {
        let evictions = r.counters().answered_evictions;
        match op % 16 {
            0..=6 => {
                let (key, h) = if op % 16 == 6 {
                    arbitrary_fragment(&mut input)
                } else {
                    m.plausible_fragment(&mut input)
                };
                let before = allocations();
                let out = r.on_fragment(key, &h, now);
                assert_eq!(allocations(), before, "on_fragment allocated");
                let ev = (evictions, r.counters().answered_evictions);
                m.on_fragment(key, &h, now, out, ev);
            }
            7..=9 => {
                now = match op % 16 {
                    7 => now.saturating_add(u64::from(input.byte())),
                    8 => now.saturating_add(1u64 << (input.byte() % 64)),
                    _ => input.u64(),
                };
                m.clock(now);
            }
            10 => {
                expired.clear();
                let before = allocations();
                r.poll_expired(now, |e| expired.push(e));
                assert_eq!(allocations(), before, "poll_expired allocated");
                assert_eq!(expired, m.poll_expired(now), "poll_expired at {now}");
            }
            11 => {
                let slot = SlotId(u32::from(input.byte()) % (cfg.capacity as u32 + 2));
                release(&mut r, &mut m, slot, allocations);
            }
            12 => {
                let handed: Vec<u32> = m.handed_slots();
                if !handed.is_empty() {
                    let slot = SlotId(handed[usize::from(input.byte()) % handed.len()]);
                    release(&mut r, &mut m, slot, allocations);
                }
            }
            13 => {
                let (key, h) = m.plausible_fragment(&mut input);
                let before = allocations();
                let out = r.on_shed_notice(key, &h, now);
                assert_eq!(allocations(), before, "on_shed_notice allocated");
                let ev = (evictions, r.counters().answered_evictions);
                m.on_shed_notice(key, &h, now, out, ev);
            }
            14 => drain(&mut r, &mut m, &mut drained, allocations),
            _ => {
                let key = m.key(input.byte());
                // Whether the table still holds it decides whether
                // `mark_answered` enters it anew.
                let held = r.answered.contains(&key, now);
                let before = allocations();
                r.mark_answered(&key, now);
                assert_eq!(allocations(), before, "mark_answered allocated");
                let ev = (evictions, r.counters().answered_evictions);
                m.mark_answered(key, now, held, ev);
            }
        }
        m.check(&r);
    }
    let counters = *r.counters();

    // The end: everything in flight is handed over, everything handed is
    // released, and every request seen has ended exactly once.
    assert_eq!(r.in_flight_keys(), m.in_flight_keys());
    drain(&mut r, &mut m, &mut drained, allocations);
    for slot in m.handed_slots() {
        release(&mut r, &mut m, SlotId(slot), allocations);
    }
    m.check(&r);
    assert_eq!(r.free_slots(), cfg.capacity);
    let c = r.counters();
    assert_eq!(c.requests, c.requests_ended());
    assert_eq!(c.requests, m.ends.len() as u64);
    assert!(
        m.ends.iter().all(|e| e.is_some()),
        "a request without an end"
    );
    counters
}

fn release(r: &mut Reassembler, m: &mut Model, slot: SlotId, allocations: fn() -> u64) {
    let before = allocations();
    let got = r.release(slot);
    assert_eq!(allocations(), before, "release allocated");
    assert_eq!(got, m.release(slot), "release({slot})");
}

/// What the test keeps of one request handed over by `drain_in_flight`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Drained {
    key: RequestKey,
    slot: SlotId,
    send_ts_ns: u64,
    first_seen_ns: u64,
    total_len: u32,
    frag_count: u16,
    received: u64,
}

fn drain(r: &mut Reassembler, m: &mut Model, drained: &mut Vec<Drained>, allocations: fn() -> u64) {
    drained.clear();
    let before = allocations();
    r.drain_in_flight(|f| {
        let mut received = 0u64;
        for i in f.received.iter_ones() {
            received |= 1 << i;
        }
        assert_eq!(f.received.len(), usize::from(f.frag_count));
        drained.push(Drained {
            key: f.key,
            slot: f.slot,
            send_ts_ns: f.send_ts_ns,
            first_seen_ns: f.first_seen_ns,
            total_len: f.total_len,
            frag_count: f.frag_count,
            received,
        });
    });
    assert_eq!(allocations(), before, "drain_in_flight allocated");
    assert_eq!(*drained, m.drain(), "drain_in_flight");
}

/// The fuzz input, read front to back; zeros once it is used up.
struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn next(&mut self) -> Option<u8> {
        let (&b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(b)
    }

    fn byte(&mut self) -> u8 {
        self.next().unwrap_or(0)
    }

    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.byte(), self.byte()])
    }

    fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.byte(), self.byte(), self.byte(), self.byte()])
    }

    fn u64(&mut self) -> u64 {
        u64::from(self.u32()) | (u64::from(self.u32()) << 32)
    }
}

/// Most fragments a request may have here: the model keeps a request's
/// received fragments in a `u64`.
const MAX_FRAGS: u16 = 64;

/// Timeouts, from one nanosecond to never.
const TIMEOUTS: [u64; 8] = [1, 10, 100, 1_000, 1_000_000, 100_000_000, 1 << 62, u64::MAX];

fn config(input: &mut Input<'_>) -> ReassemblerConfig {
    let b = input.byte();
    // Mostly a few slots, so that they run out; sometimes up to 64.
    let capacity = if b < 224 {
        1 + usize::from(b % 8)
    } else {
        1 + usize::from(b % 64)
    };
    let input_len = 1 + u32::from(input.byte() % 64);
    let max_frags = 1 + u16::from(input.byte()) % MAX_FRAGS;
    let t = input.byte();
    let timeout_ns = TIMEOUTS[usize::from(t % 8)];
    let answered_ttl_ns = match (t >> 3) % 6 {
        0 => timeout_ns,
        1 => timeout_ns.saturating_add(1),
        2 => timeout_ns.saturating_mul(2),
        3 => timeout_ns.saturating_mul(4),
        4 => timeout_ns.saturating_add(1_000),
        _ => u64::MAX,
    };
    let answered_capacity = [1, 2, 4, 8, 16, 64, 1024][usize::from(input.byte() % 7)];
    ReassemblerConfig {
        capacity,
        input_len,
        max_frags,
        timeout_ns,
        answered_ttl_ns,
        answered_capacity,
    }
}

fn clock_start(b: u8) -> u64 {
    match b % 4 {
        0 => 0,
        1 => 1_000_000_000,
        2 => u64::MAX / 2,
        _ => u64::MAX - u64::from(b),
    }
}

/// A header of any fields, for a key that mostly matches it.
fn arbitrary_fragment(input: &mut Input<'_>) -> (RequestKey, FragmentRepr) {
    let sel = input.byte();
    let h = FragmentRepr {
        if_id: IfId(u16::from(sel & 1) + 1),
        request_id: u64::from(input.byte() % 8),
        total_len: input.u32(),
        frag_index: input.u16(),
        frag_count: input.u16(),
        send_ts_ns: u64::from(input.byte()),
    };
    let mut key = key_of((sel >> 1) % 4, h.if_id, h.request_id);
    if sel >= 0xf0 {
        // Not the key's header: a caller bug, Malformed.
        key.request_id ^= 1 << (sel % 8);
    }
    (key, h)
}

fn key_of(client: u8, if_id: IfId, request_id: u64) -> RequestKey {
    RequestKey {
        src_ip: Ipv4Addr::new(10, 0, 0, client),
        src_port: 4000 + u16::from(client),
        if_id,
        request_id,
    }
}

#[derive(Clone, Copy, Debug)]
struct Assembling {
    key: RequestKey,
    total_len: u32,
    frag_count: u16,
    send_ts_ns: u64,
    first_seen_ns: u64,
    received: u64,
    life: usize,
}

#[derive(Clone, Copy, Debug)]
enum Slot {
    Free,
    Assembling(Assembling),
    Handed,
}

/// A remembered (answered or begun) request: the answered table's entry
/// as the model sees it.
#[derive(Clone, Copy, Debug)]
struct Remembered {
    key: RequestKey,
    until_ns: u64,
    /// `answered_evictions` when it was (last) entered.
    evictions: u64,
    /// The clock has reached `until_ns` since: the table may have reused
    /// its place without counting an eviction, and if the clock then went
    /// back it would look remembered to the model.
    lapsed: bool,
}

/// The reference: the module doc's rules over plain data.
struct Model {
    cfg: ReassemblerConfig,
    slots: Vec<Slot>,
    next_slot: usize,
    remembered: Vec<Remembered>,
    counters: ReassemblyCounters,
    /// Every request seen, in order: how it ended, once it has.
    ends: Vec<Option<RequestEnd>>,
}

impl Model {
    fn new(cfg: ReassemblerConfig) -> Self {
        Model {
            cfg,
            slots: vec![Slot::Free; cfg.capacity],
            next_slot: 0,
            remembered: Vec::new(),
            counters: ReassemblyCounters::default(),
            ends: Vec::new(),
        }
    }

    /// One of 64 keys: 4 clients × 2 IFs × 8 request ids.
    fn key(&self, b: u8) -> RequestKey {
        key_of(
            b % 4,
            IfId(u16::from((b >> 2) & 1) + 1),
            u64::from(b >> 3) % 8,
        )
    }

    /// A fragment of one of the 64 keys that mostly follows the protocol:
    /// the model's input size, a fragment count within (or just past)
    /// `max_frags`, an index within it, and the key's own `send_ts_ns`;
    /// the flag byte twists a field now and then.
    fn plausible_fragment(&self, input: &mut Input<'_>) -> (RequestKey, FragmentRepr) {
        let key = self.key(input.byte());
        let count_byte = input.byte();
        let frag_count = 1 + u16::from(count_byte) % (self.cfg.max_frags + 2);
        let index_byte = input.byte();
        let flags = input.byte();
        let mut h = FragmentRepr {
            if_id: key.if_id,
            request_id: key.request_id,
            total_len: self.cfg.input_len,
            frag_index: u16::from(index_byte) % frag_count,
            frag_count,
            send_ts_ns: 1_000 + key.request_id,
        };
        match flags {
            0..=199 => {}
            200..=209 => h.total_len = h.total_len.wrapping_add(1),
            210..=219 => h.total_len = h.total_len.wrapping_sub(1),
            220..=229 => h.send_ts_ns = u64::from(flags),
            230..=239 => h.frag_count = h.frag_count.wrapping_add(1),
            240..=247 => h.frag_index = u16::from(index_byte),
            _ => h.frag_count = frag_count.saturating_sub(1),
        }
        (key, h)
    }

    fn assembling(&self, key: &RequestKey) -> Option<(usize, Assembling)> {
        self.slots
            .iter()
            .enumerate()
            .find_map(|(s, slot)| match slot {
                Slot::Assembling(a) if a.key == *key => Some((s, *a)),
                _ => None,
            })
    }

    fn handed_slots(&self) -> Vec<u32> {
        (0..self.slots.len() as u32)
            .filter(|&s| matches!(self.slots[s as usize], Slot::Handed))
            .collect()
    }

    fn in_flight_keys(&self) -> Vec<RequestKey> {
        self.slots
            .iter()
            .filter_map(|s| match s {
                Slot::Assembling(a) => Some(a.key),
                _ => None,
            })
            .collect()
    }

    /// The answered table's `first_answer`, as the model knows it:
    /// whether `key` is new at `now` (not remembered), entering it if so.
    /// `real_is_new` is what the reassembler decided: a key the model
    /// remembers may have been evicted to make room, but only if
    /// `answered_evictions` grew after the key was entered and before this
    /// call (`ev.0`); `ev.1` is the count after this call, recorded with
    /// the entry.
    fn first_answer(
        &mut self,
        key: RequestKey,
        now: u64,
        ev: (u64, u64),
        real_is_new: bool,
    ) -> bool {
        let until_ns = now.saturating_add(self.cfg.answered_ttl_ns);
        let entry = Remembered {
            key,
            until_ns,
            evictions: ev.1,
            // At the end of the clock, an entry expires as it is made.
            lapsed: until_ns <= now,
        };
        match self.remembered.iter_mut().find(|r| r.key == key) {
            Some(r) if r.until_ns > now => {
                if real_is_new && (ev.0 > r.evictions || r.lapsed) {
                    // Pushed out of the table to make room (counted).
                    *r = entry;
                    return true;
                }
                false
            }
            Some(r) => {
                *r = entry;
                true
            }
            None => {
                self.remembered.push(entry);
                true
            }
        }
    }

    /// `mark_answered`: enters `key` unless the table still `held` it
    /// (`ev` as for [`Model::first_answer`]).
    fn mark_answered(&mut self, key: RequestKey, now: u64, held: bool, ev: (u64, u64)) {
        let remembered = self
            .remembered
            .iter()
            .find(|r| r.key == key && r.until_ns > now)
            .map(|r| (r.evictions, r.lapsed));
        match (remembered, held) {
            (None, true) => panic!("the answered table holds {key:?}, which the model forgot"),
            (Some((entered, lapsed)), false) => assert!(
                ev.0 > entered || lapsed,
                "the answered table lost {key:?} with no eviction counted"
            ),
            _ => {}
        }
        if !held {
            // Never entered, expired, or evicted: entered now.
            self.first_answer(key, now, (u64::MAX, ev.1), true);
        }
    }

    /// The clock is now `now` (forwards or backwards).
    fn clock(&mut self, now: u64) {
        for r in &mut self.remembered {
            r.lapsed |= r.until_ns <= now;
        }
    }

    fn begin(&mut self) -> usize {
        self.counters.requests += 1;
        self.ends.push(None);
        self.ends.len() - 1
    }

    fn end(&mut self, life: usize, end: RequestEnd) {
        assert_eq!(self.ends[life], None, "request {life} ended twice");
        self.ends[life] = Some(end);
        match end {
            RequestEnd::Completed => self.counters.requests_completed += 1,
            RequestEnd::BadRequest => self.counters.requests_bad_request += 1,
            RequestEnd::Incomplete => self.counters.requests_incomplete += 1,
            RequestEnd::Overloaded => self.counters.requests_overloaded += 1,
            RequestEnd::Drained => self.counters.requests_drained += 1,
        }
    }

    /// The next free slot at or after `next_slot`, circularly.
    fn allocate(&mut self) -> Option<usize> {
        let n = self.slots.len();
        let s = (0..n)
            .map(|i| (self.next_slot + i) % n)
            .find(|&s| matches!(self.slots[s], Slot::Free))?;
        self.next_slot = (s + 1) % n;
        Some(s)
    }

    /// Checks the reassembler's `out` for a fragment against the model's
    /// prediction, and moves the model on.
    fn on_fragment(
        &mut self,
        key: RequestKey,
        h: &FragmentRepr,
        now: u64,
        out: FragmentOutcome,
        ev: (u64, u64),
    ) {
        let want = self.predict_fragment(key, h, now, &out, ev);
        assert_eq!(out, want, "fragment {h:?} of {key:?} at {now}");
        let c = &mut self.counters;
        *match out {
            FragmentOutcome::Store { .. } => &mut c.stored,
            FragmentOutcome::StoreAndComplete { .. } => &mut c.completed,
            FragmentOutcome::Duplicate => &mut c.duplicate,
            FragmentOutcome::Late => &mut c.late,
            FragmentOutcome::Reject {
                status: Status::Overloaded,
                ..
            } => &mut c.overloaded,
            FragmentOutcome::Reject { .. } => &mut c.bad_request,
            FragmentOutcome::Malformed => &mut c.malformed,
        } += 1;
    }

    fn predict_fragment(
        &mut self,
        key: RequestKey,
        h: &FragmentRepr,
        now: u64,
        out: &FragmentOutcome,
        ev: (u64, u64),
    ) -> FragmentOutcome {
        let Some(range) = h.payload_range() else {
            return FragmentOutcome::Malformed;
        };
        if key.if_id != h.if_id || key.request_id != h.request_id {
            return FragmentOutcome::Malformed;
        }
        let offset = range.start;
        assert!(range.end <= h.total_len as usize);

        if let Some((s, mut a)) = self.assembling(&key) {
            let slot = SlotId(s as u32);
            if h.total_len != a.total_len
                || h.frag_count != a.frag_count
                || h.send_ts_ns != a.send_ts_ns
            {
                self.slots[s] = Slot::Free;
                self.end(a.life, RequestEnd::BadRequest);
                return FragmentOutcome::Reject {
                    key,
                    send_ts_ns: a.send_ts_ns,
                    first_seen_ns: a.first_seen_ns,
                    status: Status::BadRequest,
                    freed: Some(slot),
                };
            }
            let bit = 1u64 << h.frag_index;
            if a.received & bit != 0 {
                return FragmentOutcome::Duplicate;
            }
            a.received |= bit;
            if a.received.count_ones() < u32::from(a.frag_count) {
                self.slots[s] = Slot::Assembling(a);
                return FragmentOutcome::Store { slot, offset };
            }
            self.slots[s] = Slot::Handed;
            self.end(a.life, RequestEnd::Completed);
            return FragmentOutcome::StoreAndComplete {
                slot,
                offset,
                done: Complete {
                    slot,
                    key,
                    send_ts_ns: a.send_ts_ns,
                    first_seen_ns: a.first_seen_ns,
                },
            };
        }

        let real_is_new = !matches!(out, FragmentOutcome::Late);
        if !self.first_answer(key, now, ev, real_is_new) {
            return FragmentOutcome::Late;
        }
        let life = self.begin();
        let reject = |status| FragmentOutcome::Reject {
            key,
            send_ts_ns: h.send_ts_ns,
            first_seen_ns: now,
            status,
            freed: None,
        };
        if h.total_len != self.cfg.input_len || h.frag_count > self.cfg.max_frags {
            self.end(life, RequestEnd::BadRequest);
            return reject(Status::BadRequest);
        }
        let Some(s) = self.allocate() else {
            self.end(life, RequestEnd::Overloaded);
            return reject(Status::Overloaded);
        };
        let slot = SlotId(s as u32);
        if h.frag_count == 1 {
            self.slots[s] = Slot::Handed;
            self.end(life, RequestEnd::Completed);
            return FragmentOutcome::StoreAndComplete {
                slot,
                offset,
                done: Complete {
                    slot,
                    key,
                    send_ts_ns: h.send_ts_ns,
                    first_seen_ns: now,
                },
            };
        }
        self.slots[s] = Slot::Assembling(Assembling {
            key,
            total_len: h.total_len,
            frag_count: h.frag_count,
            send_ts_ns: h.send_ts_ns,
            first_seen_ns: now,
            received: 1 << h.frag_index,
            life,
        });
        FragmentOutcome::Store { slot, offset }
    }

    fn on_shed_notice(
        &mut self,
        key: RequestKey,
        h: &FragmentRepr,
        now: u64,
        out: FragmentOutcome,
        ev: (u64, u64),
    ) {
        self.counters.shed_notices += 1;
        let want = if let Some((s, a)) = self.assembling(&key) {
            self.slots[s] = Slot::Free;
            self.end(a.life, RequestEnd::Overloaded);
            FragmentOutcome::Reject {
                key,
                send_ts_ns: a.send_ts_ns,
                first_seen_ns: a.first_seen_ns,
                status: Status::Overloaded,
                freed: Some(SlotId(s as u32)),
            }
        } else if self.first_answer(key, now, ev, out != FragmentOutcome::Late) {
            let life = self.begin();
            self.end(life, RequestEnd::Overloaded);
            FragmentOutcome::Reject {
                key,
                send_ts_ns: h.send_ts_ns,
                first_seen_ns: now,
                status: Status::Overloaded,
                freed: None,
            }
        } else {
            FragmentOutcome::Late
        };
        assert_eq!(out, want, "shed notice {h:?} of {key:?} at {now}");
    }

    fn poll_expired(&mut self, now: u64) -> Vec<Expired> {
        let mut out = Vec::new();
        for s in 0..self.slots.len() {
            let Slot::Assembling(a) = self.slots[s] else {
                continue;
            };
            if a.first_seen_ns.saturating_add(self.cfg.timeout_ns) > now {
                continue;
            }
            self.slots[s] = Slot::Free;
            self.end(a.life, RequestEnd::Incomplete);
            out.push(Expired {
                key: a.key,
                send_ts_ns: a.send_ts_ns,
                first_seen_ns: a.first_seen_ns,
                slot: SlotId(s as u32),
                received: a.received.count_ones() as u16,
                frag_count: a.frag_count,
            });
        }
        out
    }

    fn drain(&mut self) -> Vec<Drained> {
        let mut out = Vec::new();
        for s in 0..self.slots.len() {
            let Slot::Assembling(a) = self.slots[s] else {
                continue;
            };
            self.slots[s] = Slot::Free;
            self.end(a.life, RequestEnd::Drained);
            out.push(Drained {
                key: a.key,
                slot: SlotId(s as u32),
                send_ts_ns: a.send_ts_ns,
                first_seen_ns: a.first_seen_ns,
                total_len: a.total_len,
                frag_count: a.frag_count,
                received: a.received,
            });
        }
        out
    }

    fn release(&mut self, slot: SlotId) -> Result<(), ReleaseError> {
        let Some(state) = self.slots.get_mut(slot.index()) else {
            self.counters.release_errors += 1;
            return Err(ReleaseError::OutOfRange {
                slot,
                capacity: self.cfg.capacity,
            });
        };
        if !matches!(state, Slot::Handed) {
            self.counters.release_errors += 1;
            return Err(ReleaseError::NotHanded { slot });
        }
        *state = Slot::Free;
        self.counters.released += 1;
        Ok(())
    }

    /// The reassembler's state and counters are the model's.
    fn check(&mut self, r: &Reassembler) {
        let c = *r.counters();
        // Evictions are the answered table's business: they only grow, and
        // only when a key is entered.
        assert!(c.answered_evictions >= self.counters.answered_evictions);
        self.counters.answered_evictions = c.answered_evictions;
        assert_eq!(c, self.counters);

        let count = |f: fn(&Slot) -> bool| self.slots.iter().filter(|s| f(s)).count();
        let in_flight = count(|s| matches!(s, Slot::Assembling(_)));
        let handed = count(|s| matches!(s, Slot::Handed));
        let free = count(|s| matches!(s, Slot::Free));
        assert_eq!(
            (r.in_flight(), r.handed(), r.free_slots()),
            (in_flight, handed, free)
        );
        assert_eq!(
            r.in_flight() + r.handed() + r.free_slots(),
            self.cfg.capacity
        );
        assert_eq!(r.free.count_ones(), free);
        assert_eq!(c.requests, c.requests_ended() + in_flight as u64);
    }
}

/// Encodes operations as the fuzz input [`reassembler`] reads, for seeds.
#[cfg(test)]
pub(crate) mod seeds {
    /// A configuration: `capacity` (1..=8), `input_len` (1..=64),
    /// `max_frags` (1..=64), timeout and ttl table indices, answered table
    /// index, clock start.
    pub fn config(
        capacity: u8,
        input_len: u8,
        max_frags: u8,
        timeout: u8,
        ttl: u8,
        answered: u8,
        clock: u8,
    ) -> Vec<u8> {
        vec![
            capacity - 1,
            input_len - 1,
            max_frags - 1,
            timeout | (ttl << 3),
            answered,
            clock,
        ]
    }

    /// A key selector: client 0..4, if 0..2, id 0..8.
    pub fn key(client: u8, if_sel: u8, id: u8) -> u8 {
        client | (if_sel << 2) | (id << 3)
    }

    /// A plausible fragment `index` of `count` (`count` must be at most
    /// `max_frags + 2`) with a twist flag (0: none).
    pub fn frag(key: u8, index: u8, count: u8, flags: u8) -> [u8; 5] {
        [0, key, count - 1, index, flags]
    }

    /// An arbitrary header.
    pub fn raw(sel: u8, id: u8, total_len: u32, index: u16, count: u16, ts: u8) -> Vec<u8> {
        let mut v = vec![6, sel, id];
        v.extend_from_slice(&total_len.to_le_bytes());
        v.extend_from_slice(&index.to_le_bytes());
        v.extend_from_slice(&count.to_le_bytes());
        v.push(ts);
        v
    }

    pub fn advance(ns: u8) -> [u8; 2] {
        [7, ns]
    }

    pub fn jump(log2: u8) -> [u8; 2] {
        [8, log2]
    }

    pub fn set_clock(ns: u64) -> Vec<u8> {
        let mut v = vec![9];
        v.extend_from_slice(&ns.to_le_bytes());
        v
    }

    pub const POLL: u8 = 10;

    pub fn release_any(slot: u8) -> [u8; 2] {
        [11, slot]
    }

    pub fn release_handed(k: u8) -> [u8; 2] {
        [12, k]
    }

    pub fn shed(key: u8, index: u8, count: u8) -> [u8; 5] {
        [13, key, count - 1, index, 0]
    }

    pub const DRAIN: u8 = 14;

    pub fn mark_answered(key: u8) -> [u8; 2] {
        [15, key]
    }

    /// The named seeds of `fuzz/corpus/reassembler/`.
    pub fn all() -> Vec<(&'static str, Vec<u8>)> {
        let cfg = || config(4, 60, 6, 2, 3, 6, 0); // timeout 100, ttl 400
        let k1 = key(1, 0, 1);
        let k2 = key(2, 1, 2);
        let k3 = key(3, 0, 3);
        let mut seeds = Vec::new();
        let mut seed = |name, parts: &[&[u8]]| {
            let mut v = cfg();
            for p in parts {
                v.extend_from_slice(p);
            }
            seeds.push((name, v));
        };
        seed(
            "in_order",
            &[&frag(k1, 0, 3, 0), &frag(k1, 1, 3, 0), &frag(k1, 2, 3, 0)],
        );
        seed(
            "interleaved_reversed_with_duplicates",
            &[
                &frag(k1, 2, 3, 0),
                &frag(k2, 1, 2, 0),
                &frag(k1, 2, 3, 0),
                &frag(k2, 0, 2, 0),
                &frag(k1, 1, 3, 0),
                &frag(k1, 0, 3, 0),
                &frag(k1, 0, 3, 0),
                &release_handed(0),
                &release_handed(0),
            ],
        );
        seed(
            "expiry_then_late",
            &[
                &frag(k1, 0, 3, 0),
                &advance(99),
                &[POLL],
                &advance(1),
                &[POLL],
                &frag(k1, 1, 3, 0),
            ],
        );
        seed(
            "disagreements",
            &[
                &frag(k1, 0, 4, 0),
                &frag(k1, 1, 4, 200),
                &frag(k2, 0, 4, 0),
                &frag(k2, 1, 4, 220),
                &frag(k3, 0, 4, 0),
                &frag(k3, 1, 4, 230),
            ],
        );
        seed(
            "overloaded",
            &[
                &frag(k1, 0, 1, 0),
                &frag(k2, 0, 1, 0),
                &frag(k3, 0, 1, 0),
                &frag(key(0, 0, 4), 0, 1, 0),
                &frag(key(0, 1, 5), 0, 2, 0),
                &release_any(2),
                &release_any(2),
                &release_any(5),
                &frag(key(0, 1, 6), 0, 2, 0),
            ],
        );
        seed(
            "too_many_fragments_and_wrong_size",
            &[
                &frag(k1, 0, 7, 0),
                &frag(k2, 0, 3, 210),
                &frag(k3, 9, 8, 240),
            ],
        );
        seed(
            "shed_notices",
            &[
                &frag(k1, 0, 3, 0),
                &shed(k1, 1, 3),
                &shed(k2, 0, 3),
                &shed(k2, 1, 3),
                &frag(k1, 2, 3, 0),
            ],
        );
        seed(
            "drain_and_mark_answered",
            &[
                &frag(k1, 0, 3, 0),
                &frag(k2, 1, 3, 0),
                &mark_answered(k3),
                &[DRAIN],
                &frag(k1, 1, 3, 0),
                &frag(k3, 0, 1, 0),
            ],
        );
        seed(
            "ttl_then_reuse",
            &[
                &frag(k1, 0, 1, 0),
                &release_handed(0),
                &jump(9),
                &frag(k1, 0, 1, 0),
            ],
        );
        seed(
            "clock_back_and_to_the_edge",
            &[
                &frag(k1, 0, 2, 0),
                &set_clock(u64::MAX - 10),
                &frag(k2, 0, 2, 0),
                &[POLL],
                &set_clock(5),
                &frag(k1, 1, 2, 0),
                &[POLL],
                &set_clock(u64::MAX),
                &[POLL],
            ],
        );
        seed(
            "malformed_headers",
            &[
                &raw(0x02, 1, 60, 7, 6, 0),
                &raw(0x02, 1, 0, 0, 1, 0),
                &raw(0xf3, 1, 60, 0, 6, 0),
                &raw(0x04, 2, 60, 5, 6, 0),
            ],
        );
        let mut evicting = config(8, 4, 4, 5, 5, 0, 0); // one answered entry
        for id in 0..8 {
            evicting.extend_from_slice(&frag(key(1, 0, id), 0, 1, 0));
            evicting.extend_from_slice(&release_handed(0));
        }
        evicting.extend_from_slice(&frag(key(1, 0, 0), 0, 1, 0));
        seeds.push(("answered_evictions", evicting));
        seeds
    }
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;

    /// The committed corpus (the generated seeds, plus any crash inputs
    /// kept as regressions) runs clean.
    #[test]
    fn the_reassembler_seed_corpus_runs_clean() {
        let files = kp_wire::fuzzing::seed_corpus("reassembler");
        assert!(files.len() >= 10, "only {} seeds", files.len());
        for (name, bytes) in files {
            eprintln!("reassembler seed {name}");
            reassembler(&bytes);
        }
    }

    #[test]
    fn the_committed_seeds_are_up_to_date() {
        let committed = kp_wire::fuzzing::seed_corpus("reassembler");
        for (name, bytes) in seeds::all() {
            let found = committed.iter().find(|(n, _)| n == name);
            assert_eq!(
                found.map(|(_, b)| b),
                Some(&bytes),
                "reassembler/{name} is missing or stale: run \
                 `cargo test -p libml -- --ignored write_reassembler_seed_corpus`"
            );
        }
    }

    /// The seeds reach what they are named after: every fragment outcome,
    /// every request end, an eviction and a release error.
    #[test]
    fn the_seeds_reach_every_outcome() {
        let mut total = ReassemblyCounters::default();
        for (_, bytes) in seeds::all() {
            let c = run(&bytes, || 0);
            total.stored += c.stored;
            total.completed += c.completed;
            total.duplicate += c.duplicate;
            total.late += c.late;
            total.bad_request += c.bad_request;
            total.overloaded += c.overloaded;
            total.malformed += c.malformed;
            total.requests_incomplete += c.requests_incomplete;
            total.requests_drained += c.requests_drained;
            total.shed_notices += c.shed_notices;
            total.release_errors += c.release_errors;
            total.answered_evictions += c.answered_evictions;
        }
        for k in super::super::FragmentKind::ALL {
            assert!(total.fragments(k) > 0, "no seed reaches {}", k.name());
        }
        assert!(total.requests_incomplete > 0);
        assert!(total.requests_drained > 0);
        assert!(total.shed_notices > 0);
        assert!(total.release_errors > 0);
        assert!(total.answered_evictions > 0);
    }

    /// An outcome the model does not predict is caught: the body is not a
    /// test that cannot fail.
    #[test]
    #[should_panic(expected = "fragment")]
    fn a_wrong_prediction_panics() {
        let cfg = seeds::config(4, 60, 6, 2, 3, 6, 0);
        let mut input = Input(&cfg);
        let cfg = config(&mut input);
        let mut m = Model::new(cfg);
        let (key, h) = m.plausible_fragment(&mut Input(&[0, 2, 0, 0]));
        // A new request's first fragment is stored; claim it was Late.
        m.on_fragment(key, &h, 0, FragmentOutcome::Late, (0, 0));
    }

    /// Writes the seed corpus; run it after changing the generator:
    /// `cargo test -p libml -- --ignored write_reassembler_seed_corpus`.
    #[test]
    #[ignore = "writes files into fuzz/corpus"]
    fn write_reassembler_seed_corpus() {
        let dir = kp_wire::fuzzing::seed_corpus_dir("reassembler");
        fs::create_dir_all(&dir).unwrap();
        for (name, bytes) in seeds::all() {
            fs::write(dir.join(name), bytes).unwrap();
        }
    }
}
