//! A few words one thread publishes and others read whole, without a lock.
//!
//! [`SeqCell`] is a sequence lock over atomic words: the one writer bumps the
//! sequence to odd, stores the words, bumps it to even; a reader retries
//! while the sequence is odd or changed under it. The writer never waits;
//! a reader waits only while a store is in progress (a few nanoseconds).
//! Every access is atomic, so a torn read is impossible to observe and no
//! `unsafe` is needed (the orderings are those of Boehm, "Can seqlocks get
//! along with programming language memory models?", MSPC 2012).
//!
//! The IF's inference thread publishes its batching state through one for
//! the telemetry publisher, once per batch.

use std::sync::atomic::{fence, AtomicU64, Ordering};

/// `N` words, written by one thread at a time, read consistently by any.
#[derive(Debug)]
pub struct SeqCell<const N: usize> {
    seq: AtomicU64,
    words: [AtomicU64; N],
}

impl<const N: usize> SeqCell<N> {
    /// A cell holding `words`.
    pub fn new(words: [u64; N]) -> Self {
        SeqCell {
            seq: AtomicU64::new(0),
            words: words.map(AtomicU64::new),
        }
    }

    /// Replaces the words. One writer at a time: two concurrent stores
    /// could leave a mix of both (never a torn word).
    pub fn store(&self, words: [u64; N]) {
        let s = self.seq.load(Ordering::Relaxed);
        self.seq.store(s.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
        for (w, v) in self.words.iter().zip(words) {
            w.store(v, Ordering::Relaxed);
        }
        self.seq.store(s.wrapping_add(2), Ordering::Release);
    }

    /// The words of one complete store.
    pub fn load(&self) -> [u64; N] {
        loop {
            let before = self.seq.load(Ordering::Acquire);
            if before % 2 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let words = std::array::from_fn(|i| self.words[i].load(Ordering::Relaxed));
            fence(Ordering::Acquire);
            if self.seq.load(Ordering::Relaxed) == before {
                return words;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::SeqCell;

    #[test]
    fn a_reader_sees_whole_stores_only() {
        // Every store writes one value to all words: a mix would show.
        let cell = SeqCell::new([0u64; 8]);
        std::thread::scope(|s| {
            s.spawn(|| {
                for v in 1..=200_000u64 {
                    cell.store([v; 8]);
                }
            });
            s.spawn(|| {
                let mut last = 0;
                for _ in 0..200_000 {
                    let w = cell.load();
                    assert!(w.iter().all(|x| *x == w[0]), "torn: {w:?}");
                    assert!(w[0] >= last, "went back: {} after {last}", w[0]);
                    last = w[0];
                }
            });
        });
        assert_eq!(cell.load(), [200_000; 8]);
    }
}
