//! The reassembler's key index: which slot holds the in-flight request with
//! a given [`RequestKey`](kp_wire::RequestKey).
//!
//! An open-addressing hash table of `(hash, slot)` pairs with linear
//! probing and backward-shift deletion (no tombstones, so a long-running
//! process never degrades), sized at construction to at least twice the
//! number of entries it may hold: the load factor stays at or below one
//! half, so a lookup ends after about 1.5 probes on average and always
//! reaches an empty bucket. Every bucket is 8 bytes, so the 128 buckets of
//! the default 64-slot reassembler are 1 KiB, sixteen cache lines.
//!
//! Why not a linear scan over the slots' keys: it costs `capacity` key
//! compares per fragment, 64 at the default and far more for a larger pool;
//! the table costs one or two whatever the capacity. A client that crafts
//! colliding keys can at worst make a probe sequence as long as the number
//! of live entries, which is the cost of that linear scan, never more.
//!
//! The table stores no keys: the caller passes the hash and a predicate that
//! compares the key held by a candidate slot, so a key lives in one place
//! (the slot's state).

/// One bucket: a slot number and the hash of its key, or empty.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Bucket {
    hash: u32,
    slot: u32,
}

const EMPTY: Bucket = Bucket {
    hash: 0,
    slot: u32::MAX,
};

/// Open-addressing map from a key's hash to slot numbers (see the module
/// doc). Slot numbers must be below `u32::MAX`.
#[derive(Debug)]
pub(super) struct KeyIndex {
    buckets: Box<[Bucket]>,
    mask: usize,
    len: usize,
    max_len: usize,
}

impl KeyIndex {
    /// A table for up to `max_len` entries: `2 * max_len` buckets rounded up
    /// to a power of two.
    pub(super) fn new(max_len: usize) -> Self {
        let n = max_len.saturating_mul(2).max(2).next_power_of_two();
        KeyIndex {
            buckets: vec![EMPTY; n].into_boxed_slice(),
            mask: n - 1,
            len: 0,
            max_len,
        }
    }

    /// Number of entries.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// The slot whose hash is `hash` and for which `is_key(slot)` holds.
    pub(super) fn find(&self, hash: u32, mut is_key: impl FnMut(u32) -> bool) -> Option<u32> {
        let mut i = hash as usize & self.mask;
        loop {
            let b = self.buckets[i];
            if b == EMPTY {
                return None;
            }
            if b.hash == hash && is_key(b.slot) {
                return Some(b.slot);
            }
            i = (i + 1) & self.mask;
        }
    }

    /// Adds `slot` under `hash`. The caller ensures that its key is not in
    /// the table yet and that there is room (`len < max_len`).
    pub(super) fn insert(&mut self, hash: u32, slot: u32) {
        debug_assert!(slot != u32::MAX, "slot number reserved for empty buckets");
        debug_assert!(self.len < self.max_len, "KeyIndex is full");
        let mut i = hash as usize & self.mask;
        while self.buckets[i] != EMPTY {
            i = (i + 1) & self.mask;
        }
        self.buckets[i] = Bucket { hash, slot };
        self.len += 1;
    }

    /// Removes `slot` (entered under `hash`); `false` if it was not there.
    pub(super) fn remove(&mut self, hash: u32, slot: u32) -> bool {
        let mut i = hash as usize & self.mask;
        loop {
            let b = self.buckets[i];
            if b == EMPTY {
                return false;
            }
            if b.slot == slot {
                break;
            }
            i = (i + 1) & self.mask;
        }
        // Backward shift: walk the run after the hole and move back every
        // entry whose home bucket lies at or before the hole (cyclically),
        // so no probe sequence crosses an empty bucket it used to cross
        // full.
        let mut hole = i;
        let mut j = i;
        loop {
            j = (j + 1) & self.mask;
            let b = self.buckets[j];
            if b == EMPTY {
                break;
            }
            let home = b.hash as usize & self.mask;
            let from_home = j.wrapping_sub(home) & self.mask;
            let from_hole = j.wrapping_sub(hole) & self.mask;
            if from_home >= from_hole {
                self.buckets[hole] = b;
                hole = j;
            }
        }
        self.buckets[hole] = EMPTY;
        self.len -= 1;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    #[test]
    fn sizes_for_a_load_factor_of_at_most_one_half() {
        assert_eq!(KeyIndex::new(0).buckets.len(), 2);
        assert_eq!(KeyIndex::new(1).buckets.len(), 2);
        assert_eq!(KeyIndex::new(64).buckets.len(), 128);
        assert_eq!(KeyIndex::new(65).buckets.len(), 256);
    }

    #[test]
    fn colliding_hashes_are_told_apart_by_the_predicate() {
        let mut t = KeyIndex::new(4);
        t.insert(7, 0);
        t.insert(7, 1);
        t.insert(7, 2);
        assert_eq!(t.find(7, |s| s == 1), Some(1));
        assert!(t.remove(7, 0));
        assert_eq!(t.find(7, |s| s == 2), Some(2));
        assert_eq!(t.find(7, |s| s == 0), None);
        assert!(!t.remove(7, 0));
        assert_eq!(t.len(), 2);
    }

    proptest! {
        /// Against a HashMap, with hashes drawn from a tiny range so probe
        /// runs collide, wrap around the end and get shifted back.
        #[test]
        fn behaves_like_a_map(ops in proptest::collection::vec((any::<bool>(), 0u32..12, 0u32..40), 1..300)) {
            const MAX: usize = 8;
            let mut t = KeyIndex::new(MAX);
            // slot -> hash; the "key" of a slot is the slot itself.
            let mut m: HashMap<u32, u32> = HashMap::new();
            for (insert, slot, hash) in ops {
                if insert {
                    if m.contains_key(&slot) || m.len() == MAX {
                        continue;
                    }
                    t.insert(hash, slot);
                    m.insert(slot, hash);
                } else {
                    match m.remove(&slot) {
                        Some(h) => prop_assert!(t.remove(h, slot)),
                        None => prop_assert!(!t.remove(hash, slot)),
                    }
                }
                prop_assert_eq!(t.len(), m.len());
                for (&s, &h) in &m {
                    prop_assert_eq!(t.find(h, |x| x == s), Some(s));
                }
                for s in 0..12u32 {
                    if !m.contains_key(&s) {
                        for h in 0..40u32 {
                            prop_assert_eq!(t.find(h, |x| x == s), None);
                        }
                    }
                }
            }
        }
    }
}
