//! A bounded memory of requests that were answered.
//!
//! docs/PROTOCOL.md wants exactly one answer per request, but a request's
//! fragments keep arriving after it was answered: the if-manager answers a
//! request for an `if_id` that has no IF on its first fragment, and an IF
//! may answer (BAD_REQUEST, OVERLOADED, INCOMPLETE) before late fragments or
//! duplicates arrive. [`AnsweredTable`] remembers which requests were
//! answered for a while (`ttl`), in a fixed amount of memory allocated at
//! start-up, so those stragglers are dropped instead of answered again.
//!
//! Design: a set-associative cache (like a CPU cache). A key hashes to one
//! set of [`WAYS`] slots; lookup and insert scan those slots only. When a set
//! is full, the entry closest to expiry is replaced; if it had not expired
//! yet, the insert reports an eviction so it can be counted. A later fragment
//! of an evicted request would be answered a second time, so size the table
//! for the number of unknown-IF requests in flight within one `ttl` (the
//! default, 16384 entries with a 2 s ttl, is 8k requests/s of unknown-IF
//! traffic with every set balanced).
//!
//! Sans-IO: time is an argument (nanoseconds from any fixed origin).

use std::hash::{Hash, Hasher};

use crate::RequestKey;

/// Slots per set. Four keeps a lookup within one or two cache lines' worth
/// of keys while making a conflict eviction unlikely at moderate load.
pub const WAYS: usize = 4;

#[derive(Clone, Copy, Debug)]
struct Slot {
    key: Option<RequestKey>,
    expires_ns: u64,
}

const EMPTY: Slot = Slot {
    key: None,
    expires_ns: 0,
};

/// What [`AnsweredTable::first_answer`] decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// Not answered before: answer it now (it is remembered from now on).
    /// `evicted_live` says a still-live entry had to make room.
    Now {
        /// A live entry was evicted to make room.
        evicted_live: bool,
    },
    /// Already answered within the time-to-live: stay silent.
    AlreadyAnswered,
}

/// Fixed-capacity, time-bounded set of answered [`RequestKey`]s.
#[derive(Debug)]
pub struct AnsweredTable {
    sets: Box<[[Slot; WAYS]]>,
    ttl_ns: u64,
}

impl AnsweredTable {
    /// A table of at least `capacity` entries (rounded up to a power-of-two
    /// number of sets), each remembered for `ttl_ns`.
    pub fn new(capacity: usize, ttl_ns: u64) -> Self {
        let sets = capacity.div_ceil(WAYS).max(1).next_power_of_two();
        AnsweredTable {
            sets: vec![[EMPTY; WAYS]; sets].into_boxed_slice(),
            ttl_ns,
        }
    }

    /// Number of entries the table can hold.
    pub fn capacity(&self) -> usize {
        self.sets.len() * WAYS
    }

    /// Decides whether the request `key` is to be answered now, and
    /// remembers that it was.
    pub fn first_answer(&mut self, key: &RequestKey, now_ns: u64) -> Answer {
        let mask = self.sets.len() - 1;
        let set = &mut self.sets[(hash(key) as usize) & mask];
        for slot in set.iter_mut() {
            if slot.key.as_ref() == Some(key) {
                if slot.expires_ns > now_ns {
                    return Answer::AlreadyAnswered;
                }
                // Expired: it is a new request that reuses an old id.
                slot.expires_ns = now_ns.saturating_add(self.ttl_ns);
                return Answer::Now {
                    evicted_live: false,
                };
            }
        }
        // Replace an empty or expired slot, else the one closest to expiry.
        let victim = set
            .iter_mut()
            .min_by_key(|s| if s.key.is_none() { 0 } else { s.expires_ns })
            .expect("WAYS > 0");
        let evicted_live = victim.key.is_some() && victim.expires_ns > now_ns;
        *victim = Slot {
            key: Some(*key),
            expires_ns: now_ns.saturating_add(self.ttl_ns),
        };
        Answer::Now { evicted_live }
    }
}

impl AnsweredTable {
    /// Whether `key` was answered within the time-to-live (a lookup that
    /// remembers nothing).
    pub fn contains(&self, key: &RequestKey, now_ns: u64) -> bool {
        let mask = self.sets.len() - 1;
        self.sets[(hash(key) as usize) & mask]
            .iter()
            .any(|slot| slot.key.as_ref() == Some(key) && slot.expires_ns > now_ns)
    }

    /// Every key still remembered at `now_ns`, most recently answered first
    /// (for a switchover's handover).
    pub fn live_keys(&self, now_ns: u64) -> Vec<RequestKey> {
        let mut live: Vec<(u64, RequestKey)> = self
            .sets
            .iter()
            .flatten()
            .filter(|slot| slot.expires_ns > now_ns)
            .filter_map(|slot| slot.key.map(|k| (slot.expires_ns, k)))
            .collect();
        live.sort_unstable_by_key(|e| std::cmp::Reverse(e.0));
        live.into_iter().map(|(_, k)| k).collect()
    }
}

/// FNV-1a over the key's fields: cheap, no allocation, good enough spread for
/// keys that differ in a few low bits (consecutive request ids).
fn hash(key: &RequestKey) -> u64 {
    struct Fnv(u64);
    impl Hasher for Fnv {
        fn finish(&self) -> u64 {
            // Final avalanche so the low bits (the set index) depend on all.
            let mut x = self.0;
            x ^= x >> 33;
            x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
            x ^ (x >> 33)
        }
        fn write(&mut self, bytes: &[u8]) {
            for b in bytes {
                self.0 = (self.0 ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01B3);
            }
        }
    }
    let mut h = Fnv(0xcbf2_9ce4_8422_2325);
    key.hash(&mut h);
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::IfId;
    use proptest::prelude::*;
    use std::collections::HashMap;
    use std::net::Ipv4Addr;

    fn key(port: u16, id: u64) -> RequestKey {
        RequestKey {
            src_ip: Ipv4Addr::new(10, 0, 0, 1),
            src_port: port,
            if_id: IfId(9),
            request_id: id,
        }
    }

    #[test]
    fn answers_once_per_request_within_the_ttl() {
        let mut t = AnsweredTable::new(64, 1_000);
        assert_eq!(
            t.first_answer(&key(1, 1), 0),
            Answer::Now {
                evicted_live: false
            }
        );
        assert_eq!(t.first_answer(&key(1, 1), 999), Answer::AlreadyAnswered);
        assert_eq!(
            t.first_answer(&key(1, 2), 999),
            Answer::Now {
                evicted_live: false
            }
        );
        // after the ttl the same id is a new request
        assert_eq!(
            t.first_answer(&key(1, 1), 1_000),
            Answer::Now {
                evicted_live: false
            }
        );
    }

    #[test]
    fn overflow_evicts_and_says_so() {
        let mut t = AnsweredTable::new(WAYS, 1_000_000);
        assert_eq!(t.capacity(), WAYS);
        for id in 0..WAYS as u64 {
            assert_eq!(
                t.first_answer(&key(1, id), 0),
                Answer::Now {
                    evicted_live: false
                }
            );
        }
        assert_eq!(
            t.first_answer(&key(1, 99), 1),
            Answer::Now { evicted_live: true }
        );
    }

    /// Obviously-correct reference: an unbounded map of expiry times.
    struct Reference(HashMap<RequestKey, u64>, u64);
    impl Reference {
        fn first_answer(&mut self, k: &RequestKey, now: u64) -> bool {
            match self.0.get(k) {
                Some(exp) if *exp > now => false,
                _ => {
                    self.0.insert(*k, now + self.1);
                    true
                }
            }
        }
    }

    proptest! {
        /// While no live entry is evicted, the table answers exactly like
        /// the unbounded reference.
        #[test]
        fn matches_the_reference_until_it_overflows(
            ops in proptest::collection::vec((0u16..4, 0u64..40, 0u64..50), 1..400)
        ) {
            let ttl = 200;
            let mut t = AnsweredTable::new(1024, ttl);
            let mut r = Reference(HashMap::new(), ttl);
            let mut now = 0;
            for (port, id, dt) in ops {
                now += dt;
                let k = key(port, id);
                let got = t.first_answer(&k, now);
                let want = r.first_answer(&k, now);
                if let Answer::Now { evicted_live: true } = got {
                    break; // from here on the bounded table may differ
                }
                prop_assert_eq!(matches!(got, Answer::Now { .. }), want);
            }
        }
    }
}
