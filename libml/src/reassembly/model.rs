//! Property tests of the [`Reassembler`] against an obviously-correct slow
//! reference that follows the same rules with unbounded memory: a
//! `HashMap` from key to the headers received so far, a `HashMap` of
//! answered keys with their expiry, and a count of handed-over requests for
//! the capacity rule. It neither hashes nor allocates slots nor keeps
//! bitmaps, and it computes the fragment geometry itself.
//!
//! Random streams of fragments — a few clients, a few request ids each,
//! random order, duplicates, drops (indices never sent), fields that
//! disagree, malformed headers, time advancing, polls, releases (and
//! bogus ones), drains, shed notices — go through both; every fragment's
//! outcome and every poll's and drain's answers must match. Alongside, a shadow of the
//! slots checks that no slot is ever held by two live requests and that
//! the counters add up, and at the end every request seen has had exactly
//! one answer.

use std::collections::{HashMap, HashSet};
use std::net::Ipv4Addr;

use proptest::prelude::*;

use super::*;
use kp_wire::IfId;

const LEN: u32 = 60;
const MAX_FRAGS: u16 = 6;
const TIMEOUT: u64 = 100;
const TTL: u64 = 300;
const CLIENTS: u8 = 3;
const IDS: u64 = 5;
const IF: IfId = IfId(9);

fn key(client: u8, id: u64) -> RequestKey {
    RequestKey {
        src_ip: Ipv4Addr::new(192, 168, 1, client),
        src_port: 5000,
        if_id: IF,
        request_id: id,
    }
}

fn order(k: &RequestKey) -> (Ipv4Addr, u16, IfId, u64) {
    (k.src_ip, k.src_port, k.if_id, k.request_id)
}

/// What either implementation said about one fragment, slots left out.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Said {
    Store {
        offset: usize,
    },
    Complete {
        offset: usize,
        key: RequestKey,
        send_ts_ns: u64,
        first_seen_ns: u64,
    },
    Duplicate,
    Late,
    Reject {
        key: RequestKey,
        send_ts_ns: u64,
        first_seen_ns: u64,
        status: Status,
    },
    Malformed,
}

impl From<FragmentOutcome> for Said {
    fn from(o: FragmentOutcome) -> Said {
        match o {
            FragmentOutcome::Store { offset, .. } => Said::Store { offset },
            FragmentOutcome::StoreAndComplete { offset, done, .. } => Said::Complete {
                offset,
                key: done.key,
                send_ts_ns: done.send_ts_ns,
                first_seen_ns: done.first_seen_ns,
            },
            FragmentOutcome::Duplicate => Said::Duplicate,
            FragmentOutcome::Late => Said::Late,
            FragmentOutcome::Reject {
                key,
                send_ts_ns,
                first_seen_ns,
                status,
                ..
            } => Said::Reject {
                key,
                send_ts_ns,
                first_seen_ns,
                status,
            },
            FragmentOutcome::Malformed => Said::Malformed,
        }
    }
}

/// An expired or drained request: (key, send_ts_ns, first_seen_ns,
/// indices received).
type Ended = (RequestKey, u64, u64, Vec<usize>);

struct RefRequest {
    first: FragmentRepr,
    first_seen_ns: u64,
    got: Vec<Option<FragmentRepr>>,
}

impl RefRequest {
    fn ended(&self, key: RequestKey) -> Ended {
        let got = (0..self.got.len())
            .filter(|i| self.got[*i].is_some())
            .collect();
        (key, self.first.send_ts_ns, self.first_seen_ns, got)
    }
}

struct Reference {
    cfg: ReassemblerConfig,
    in_flight: HashMap<RequestKey, RefRequest>,
    /// Key -> remembered until (from its first fragment).
    answered: HashMap<RequestKey, u64>,
    handed: usize,
}

impl Reference {
    fn new(cfg: ReassemblerConfig) -> Self {
        Reference {
            cfg,
            in_flight: HashMap::new(),
            answered: HashMap::new(),
            handed: 0,
        }
    }

    /// docs/PROTOCOL.md's geometry, computed here from scratch: the offset of
    /// the fragment, or `None` if the header is malformed.
    fn offset(h: &FragmentRepr) -> Option<usize> {
        let (len, count, index) = (
            u64::from(h.total_len),
            u64::from(h.frag_count),
            u64::from(h.frag_index),
        );
        if len == 0 || count == 0 || index >= count {
            return None;
        }
        let stride = len.div_ceil(count);
        if (count - 1) * stride >= len {
            return None;
        }
        Some((index * stride) as usize)
    }

    fn on_fragment(&mut self, key: RequestKey, h: &FragmentRepr, now: u64) -> Said {
        let Some(offset) = Self::offset(h) else {
            return Said::Malformed;
        };
        if key.if_id != h.if_id || key.request_id != h.request_id {
            return Said::Malformed;
        }
        if let Some(r) = self.in_flight.get_mut(&key) {
            let f = r.first;
            if (h.total_len, h.frag_count, h.send_ts_ns)
                != (f.total_len, f.frag_count, f.send_ts_ns)
            {
                let first_seen_ns = r.first_seen_ns;
                self.in_flight.remove(&key);
                return Said::Reject {
                    key,
                    send_ts_ns: f.send_ts_ns,
                    first_seen_ns,
                    status: Status::BadRequest,
                };
            }
            let i = usize::from(h.frag_index);
            if r.got[i].is_some() {
                return Said::Duplicate;
            }
            r.got[i] = Some(*h);
            if r.got.iter().any(Option::is_none) {
                return Said::Store { offset };
            }
            let first_seen_ns = r.first_seen_ns;
            self.in_flight.remove(&key);
            self.handed += 1;
            return Said::Complete {
                offset,
                key,
                send_ts_ns: f.send_ts_ns,
                first_seen_ns,
            };
        }
        if self.answered.get(&key).is_some_and(|until| *until > now) {
            return Said::Late;
        }
        self.answered
            .insert(key, now.saturating_add(self.cfg.answered_ttl_ns));
        let reject = |status| Said::Reject {
            key,
            send_ts_ns: h.send_ts_ns,
            first_seen_ns: now,
            status,
        };
        if h.total_len != self.cfg.input_len || h.frag_count > self.cfg.max_frags {
            return reject(Status::BadRequest);
        }
        if self.in_flight.len() + self.handed >= self.cfg.capacity {
            return reject(Status::Overloaded);
        }
        let mut got = vec![None; usize::from(h.frag_count)];
        got[usize::from(h.frag_index)] = Some(*h);
        if h.frag_count == 1 {
            self.handed += 1;
            return Said::Complete {
                offset,
                key,
                send_ts_ns: h.send_ts_ns,
                first_seen_ns: now,
            };
        }
        self.in_flight.insert(
            key,
            RefRequest {
                first: *h,
                first_seen_ns: now,
                got,
            },
        );
        Said::Store { offset }
    }

    fn on_shed_notice(&mut self, key: RequestKey, h: &FragmentRepr, now: u64) -> Said {
        let overloaded = |send_ts_ns, first_seen_ns| Said::Reject {
            key,
            send_ts_ns,
            first_seen_ns,
            status: Status::Overloaded,
        };
        if let Some(r) = self.in_flight.remove(&key) {
            return overloaded(r.first.send_ts_ns, r.first_seen_ns);
        }
        if self.answered.get(&key).is_some_and(|until| *until > now) {
            return Said::Late;
        }
        self.answered
            .insert(key, now.saturating_add(self.cfg.answered_ttl_ns));
        overloaded(h.send_ts_ns, now)
    }

    fn poll_expired(&mut self, now: u64) -> Vec<Ended> {
        let due: Vec<RequestKey> = self
            .in_flight
            .iter()
            .filter(|(_, r)| r.first_seen_ns + self.cfg.timeout_ns <= now)
            .map(|(k, _)| *k)
            .collect();
        let mut out: Vec<Ended> = due
            .into_iter()
            .map(|k| self.in_flight.remove(&k).unwrap().ended(k))
            .collect();
        out.sort_by_key(|e| order(&e.0));
        out
    }

    fn drain(&mut self) -> Vec<Ended> {
        let mut out: Vec<Ended> = self.in_flight.drain().map(|(k, r)| r.ended(k)).collect();
        out.sort_by_key(|e| order(&e.0));
        out
    }
}

/// How one request id of one client is sent (fixed for the whole stream).
#[derive(Clone, Copy, Debug)]
struct Plan {
    frag_count: u16,
    total_len: u32,
    send_ts_ns: u64,
}

fn plan() -> impl Strategy<Value = Plan> {
    (
        prop_oneof![6 => 1u16..=MAX_FRAGS, 1 => MAX_FRAGS + 1..=MAX_FRAGS + 2],
        prop_oneof![8 => Just(LEN), 1 => Just(LEN + 4)],
        0u64..1_000_000,
    )
        .prop_map(|(frag_count, total_len, send_ts_ns)| Plan {
            frag_count,
            total_len,
            send_ts_ns,
        })
}

/// A change to a fragment's header that breaks a rule.
#[derive(Clone, Copy, Debug)]
enum Twist {
    None,
    TotalLen,
    FragCount,
    SendTs,
    IndexOutOfRange,
    OtherRequestId,
}

fn twist() -> impl Strategy<Value = Twist> {
    prop_oneof![
        40 => Just(Twist::None),
        1 => Just(Twist::TotalLen),
        1 => Just(Twist::FragCount),
        1 => Just(Twist::SendTs),
        1 => Just(Twist::IndexOutOfRange),
        1 => Just(Twist::OtherRequestId),
    ]
}

#[derive(Clone, Debug)]
enum Op {
    /// One fragment of request (client, id): index `index % frag_count`.
    Frag {
        client: u8,
        id: u64,
        index: u16,
        twist: Twist,
    },
    /// Every fragment of a request, back to back, in order or reversed.
    Whole {
        client: u8,
        id: u64,
        reversed: bool,
    },
    Advance(u64),
    Poll,
    /// Release the `n % len`-th handed slot; `bogus`: release slot
    /// `n % (capacity + 2)`, whatever it holds.
    Release {
        n: usize,
        bogus: bool,
    },
    Drain,
    /// A shed notice for request (client, id): the if-manager could not
    /// deliver one of its fragments.
    Shed {
        client: u8,
        id: u64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        30 => (0..CLIENTS, 0..IDS, any::<u16>(), twist())
            .prop_map(|(client, id, index, twist)| Op::Frag { client, id, index, twist }),
        4 => (0..CLIENTS, 0..IDS, any::<bool>())
            .prop_map(|(client, id, reversed)| Op::Whole { client, id, reversed }),
        6 => (0u64..40).prop_map(Op::Advance),
        5 => Just(Op::Poll),
        5 => (any::<usize>(), prop::bool::weighted(0.2))
            .prop_map(|(n, bogus)| Op::Release { n, bogus }),
        1 => Just(Op::Drain),
        2 => (0..CLIENTS, 0..IDS).prop_map(|(client, id)| Op::Shed { client, id }),
    ]
}

fn header(
    plans: &[Plan],
    client: u8,
    id: u64,
    index: u16,
    twist: Twist,
) -> (RequestKey, FragmentRepr) {
    let p = plans[usize::from(client) * IDS as usize + id as usize];
    let mut h = FragmentRepr {
        if_id: IF,
        request_id: id,
        total_len: p.total_len,
        frag_index: index % p.frag_count,
        frag_count: p.frag_count,
        send_ts_ns: p.send_ts_ns,
    };
    match twist {
        Twist::None => {}
        Twist::TotalLen => h.total_len += 1,
        Twist::FragCount => h.frag_count += 1,
        Twist::SendTs => h.send_ts_ns += 1,
        Twist::IndexOutOfRange => h.frag_index = h.frag_count,
        Twist::OtherRequestId => h.request_id += 100,
    }
    (key(client, id), h)
}

/// Which live request holds each slot, from what the reassembler said.
#[derive(Default)]
struct Shadow {
    /// Slot -> (key, handed?).
    owner: HashMap<SlotId, (RequestKey, bool)>,
    /// Assembling key -> slot.
    open: HashMap<RequestKey, SlotId>,
    /// Handed slots in the order they were handed.
    handed: Vec<SlotId>,
    /// (key, first_seen_ns) of every answer or hand-over.
    answered: HashSet<(RequestKey, u64)>,
}

impl Shadow {
    fn answer(&mut self, key: RequestKey, first_seen_ns: u64) -> Result<(), TestCaseError> {
        prop_assert!(
            self.answered.insert((key, first_seen_ns)),
            "second answer for {:?} first seen at {}",
            key,
            first_seen_ns
        );
        Ok(())
    }

    /// A fragment of `key` went to `slot`.
    fn stored(&mut self, key: RequestKey, slot: SlotId) -> Result<(), TestCaseError> {
        match self.open.get(&key) {
            Some(s) => prop_assert_eq!(*s, slot, "{:?} moved", key),
            None => {
                prop_assert!(
                    !self.owner.contains_key(&slot),
                    "{:?} given to {:?} while {:?} holds it",
                    slot,
                    key,
                    self.owner.get(&slot)
                );
                self.owner.insert(slot, (key, false));
                self.open.insert(key, slot);
            }
        }
        Ok(())
    }

    /// The Assembling request `key` in `slot` ended without a hand-over.
    fn ended(&mut self, key: RequestKey, slot: SlotId) -> Result<(), TestCaseError> {
        prop_assert_eq!(self.open.remove(&key), Some(slot));
        prop_assert_eq!(self.owner.remove(&slot), Some((key, false)));
        Ok(())
    }

    fn outcome(&mut self, key: RequestKey, out: &FragmentOutcome) -> Result<(), TestCaseError> {
        match *out {
            FragmentOutcome::Store { slot, .. } => self.stored(key, slot)?,
            FragmentOutcome::StoreAndComplete { slot, done, .. } => {
                prop_assert_eq!((done.slot, done.key), (slot, key));
                self.stored(key, slot)?;
                self.open.remove(&key);
                self.owner.insert(slot, (key, true));
                self.handed.push(slot);
                self.answer(key, done.first_seen_ns)?;
            }
            FragmentOutcome::Reject {
                key: k,
                freed,
                first_seen_ns,
                ..
            } => {
                prop_assert_eq!(k, key);
                match freed {
                    Some(slot) => self.ended(key, slot)?,
                    None => prop_assert!(!self.open.contains_key(&key)),
                }
                self.answer(key, first_seen_ns)?;
            }
            FragmentOutcome::Duplicate => prop_assert!(self.open.contains_key(&key)),
            FragmentOutcome::Late => prop_assert!(!self.open.contains_key(&key)),
            FragmentOutcome::Malformed => {}
        }
        Ok(())
    }

    fn check(&self, r: &Reassembler) -> Result<(), TestCaseError> {
        let c = r.counters();
        prop_assert_eq!(c.requests, c.requests_ended() + r.in_flight() as u64);
        prop_assert_eq!(self.open.len(), r.in_flight());
        prop_assert_eq!(self.handed.len(), r.handed());
        prop_assert_eq!(self.owner.len(), r.in_flight() + r.handed());
        prop_assert_eq!(r.free_slots() + self.owner.len(), r.config().capacity);
        prop_assert_eq!(c.requests_ended(), self.answered.len() as u64);
        prop_assert_eq!(c.answered_evictions, 0);
        Ok(())
    }
}

/// Runs `ops` through a reassembler and the reference, comparing every
/// answer and checking the shadow invariants after every step.
fn run(capacity: usize, plans: &[Plan], ops: &[Op]) -> Result<Reassembler, TestCaseError> {
    let cfg = ReassemblerConfig {
        capacity,
        input_len: LEN,
        max_frags: MAX_FRAGS,
        timeout_ns: TIMEOUT,
        answered_ttl_ns: TTL,
        answered_capacity: 4096,
    };
    let mut r = Reassembler::new(cfg).unwrap();
    let mut model = Reference::new(cfg);
    let mut shadow = Shadow::default();
    let mut now = 0u64;

    fn fragment(
        r: &mut Reassembler,
        model: &mut Reference,
        shadow: &mut Shadow,
        (key, h): (RequestKey, FragmentRepr),
        now: u64,
    ) -> Result<(), TestCaseError> {
        let got = r.on_fragment(key, &h, now);
        let want = model.on_fragment(key, &h, now);
        prop_assert_eq!(
            Said::from(got),
            want,
            "fragment {:?} of {:?} at {}",
            h,
            key,
            now
        );
        shadow.outcome(key, &got)
    }

    for op in ops {
        match *op {
            Op::Frag {
                client,
                id,
                index,
                twist,
            } => {
                let f = header(plans, client, id, index, twist);
                fragment(&mut r, &mut model, &mut shadow, f, now)?;
            }
            Op::Whole {
                client,
                id,
                reversed,
            } => {
                let count = header(plans, client, id, 0, Twist::None).1.frag_count;
                for i in 0..count {
                    let index = if reversed { count - 1 - i } else { i };
                    let f = header(plans, client, id, index, Twist::None);
                    fragment(&mut r, &mut model, &mut shadow, f, now)?;
                }
            }
            Op::Shed { client, id } => {
                let (key, h) = header(plans, client, id, 0, Twist::None);
                let got = r.on_shed_notice(key, &h, now);
                let want = model.on_shed_notice(key, &h, now);
                prop_assert_eq!(
                    Said::from(got),
                    want,
                    "shed notice for {:?} at {}",
                    key,
                    now
                );
                shadow.outcome(key, &got)?;
            }
            Op::Advance(dt) => now += dt,
            Op::Poll => {
                let mut got = Vec::new();
                r.poll_expired(now, |e| got.push(e));
                let mut ended = Vec::new();
                for e in &got {
                    prop_assert_eq!(e.status(), Status::Incomplete);
                    prop_assert!(e.received < e.frag_count);
                    shadow.ended(e.key, e.slot)?;
                    shadow.answer(e.key, e.first_seen_ns)?;
                    let received = model.in_flight[&e.key].got.iter().flatten().count();
                    prop_assert_eq!(usize::from(e.received), received);
                    ended.push((e.key, e.send_ts_ns, e.first_seen_ns));
                }
                ended.sort_by_key(|e| order(&e.0));
                let want: Vec<_> = model
                    .poll_expired(now)
                    .into_iter()
                    .map(|(k, ts, seen, _)| (k, ts, seen))
                    .collect();
                prop_assert_eq!(ended, want, "poll at {}", now);
            }
            Op::Drain => {
                let mut got: Vec<(Ended, SlotId)> = Vec::new();
                r.drain_in_flight(|f| {
                    got.push((
                        (
                            f.key,
                            f.send_ts_ns,
                            f.first_seen_ns,
                            f.received.iter_ones().collect(),
                        ),
                        f.slot,
                    ))
                });
                for (e, slot) in &got {
                    shadow.ended(e.0, *slot)?;
                    shadow.answer(e.0, e.2)?;
                }
                let mut got: Vec<Ended> = got.into_iter().map(|(e, _)| e).collect();
                got.sort_by_key(|e| order(&e.0));
                prop_assert_eq!(got, model.drain());
            }
            Op::Release { n, bogus } => {
                if bogus {
                    let slot = SlotId((n % (capacity + 2)) as u32);
                    let held = shadow.owner.get(&slot).is_some_and(|(_, handed)| *handed);
                    let res = r.release(slot);
                    prop_assert_eq!(res.is_ok(), held, "release {:?}: {:?}", slot, res);
                    if held {
                        shadow.handed.retain(|s| *s != slot);
                        shadow.owner.remove(&slot);
                        model.handed -= 1;
                    }
                } else if !shadow.handed.is_empty() {
                    let slot = shadow.handed.remove(n % shadow.handed.len());
                    prop_assert_eq!(r.release(slot), Ok(()));
                    shadow.owner.remove(&slot);
                    model.handed -= 1;
                }
            }
        }
        shadow.check(&r)?;
    }

    // Let everything still in flight expire: then every request seen has
    // had exactly one answer.
    now += TIMEOUT;
    let mut got = Vec::new();
    r.poll_expired(now, |e| got.push(e));
    for e in &got {
        shadow.ended(e.key, e.slot)?;
        shadow.answer(e.key, e.first_seen_ns)?;
    }
    prop_assert_eq!(got.len(), model.poll_expired(now).len());
    prop_assert_eq!(r.in_flight(), 0);
    shadow.check(&r)?;
    prop_assert_eq!(r.counters().requests, shadow.answered.len() as u64);
    Ok(r)
}

fn plans() -> impl Strategy<Value = Vec<Plan>> {
    proptest::collection::vec(plan(), usize::from(CLIENTS) * IDS as usize)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// With room for every request, the reassembler answers exactly like
    /// the reference and never sheds.
    #[test]
    fn matches_the_reference(plans in plans(), ops in proptest::collection::vec(op(), 1..300)) {
        let r = run(1024, &plans, &ops)?;
        prop_assert_eq!(r.counters().overloaded, 0);
    }

    /// With 1 to 4 slots, OVERLOADED happens; still exactly the reference's
    /// answers, one per request, no slot held twice, counters adding up.
    #[test]
    fn matches_the_reference_when_slots_run_out(
        capacity in 1usize..=4,
        plans in plans(),
        ops in proptest::collection::vec(op(), 1..300),
    ) {
        run(capacity, &plans, &ops)?;
    }
}

/// The streams do reach every outcome (a guard against a generator that
/// silently stopped producing some of them).
#[test]
fn the_generated_streams_reach_every_outcome() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;

    let mut runner = TestRunner::deterministic();
    let mut total = ReassemblyCounters::default();
    let mut reused = 0;
    for i in 0..64 {
        let capacity = if i % 2 == 0 { 1024 } else { 2 };
        let plans = plans().new_tree(&mut runner).unwrap().current();
        let ops = proptest::collection::vec(op(), 200..300)
            .new_tree(&mut runner)
            .unwrap()
            .current();
        let r = run(capacity, &plans, &ops).unwrap();
        let c = r.counters();
        for k in FragmentKind::ALL {
            *match k {
                FragmentKind::Stored => &mut total.stored,
                FragmentKind::Completed => &mut total.completed,
                FragmentKind::Duplicate => &mut total.duplicate,
                FragmentKind::Late => &mut total.late,
                FragmentKind::BadRequest => &mut total.bad_request,
                FragmentKind::Overloaded => &mut total.overloaded,
                FragmentKind::Malformed => &mut total.malformed,
            } += c.fragments(k);
        }
        total.requests_incomplete += c.requests_incomplete;
        total.requests_drained += c.requests_drained;
        total.shed_notices += c.shed_notices;
        total.requests_overloaded += c.requests_overloaded;
        total.released += c.released;
        total.release_errors += c.release_errors;
        // a key seen as a new request more than once: the ttl ran out
        reused += u64::from(c.requests > u64::from(CLIENTS) * IDS);
    }
    for k in FragmentKind::ALL {
        assert!(
            total.fragments(k) > 0,
            "no {} fragment: {total:?}",
            k.name()
        );
    }
    assert!(total.requests_incomplete > 0, "{total:?}");
    assert!(total.requests_drained > 0, "{total:?}");
    assert!(total.shed_notices > 0, "{total:?}");
    assert!(total.released > 0 && total.release_errors > 0, "{total:?}");
    assert!(reused > 0, "no id was ever reused after its ttl");
}
