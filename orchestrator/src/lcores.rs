//! EAL lcore ids for IF processes, from a free set.
//!
//! Every kp-if is a DPDK secondary process with an lcore id of its own
//! (`--lcores ID@CPUS`). Two live processes with the same id share the
//! mempools' per-lcore caches without a lock, which corrupts them (see
//! `ffi/dpdk`), so an id must never be handed out while a process that had
//! it may still run. The id also names the process's control and telemetry
//! sockets and its log file, so those never collide either.
//!
//! [`LcoreIds::acquire`] hands out a [`LcoreLease`]; dropping the lease
//! returns its id. The daemon keeps the lease inside the process handle,
//! after the process itself, and a process handle is dropped only once its
//! process has exited (or after it was killed and waited for), so an id
//! comes back exactly when its process is gone. Ids are reused
//! least-recently-released first, so the log file of a process that just
//! died is not overwritten by the next start.
//!
//! Lcore 0 is the if-manager's (configs/platform.toml); DPDK 22.11 as
//! Debian builds it has `RTE_MAX_LCORE` 128, so IFs get 1..=127: at most
//! 127 IF processes (actives, shadows, leaving ones) alive at once, and the
//! 128th start is refused with [`NoFreeLcore`] rather than given a live id.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};

/// The lowest lcore id an IF gets (0 is the if-manager's).
pub const FIRST_IF_LCORE: u32 = 1;
/// The highest (`RTE_MAX_LCORE` - 1).
pub const LAST_IF_LCORE: u32 = 127;

/// Every id is held by a live process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("no free EAL lcore id: all {n} ids for IF processes ({FIRST_IF_LCORE}..={LAST_IF_LCORE}) are held by live processes", n = LAST_IF_LCORE - FIRST_IF_LCORE + 1)]
pub struct NoFreeLcore;

/// The free set of lcore ids (shared with the leases, which give theirs
/// back when dropped).
#[derive(Clone, Debug)]
pub struct LcoreIds {
    free: Arc<Mutex<VecDeque<u32>>>,
}

impl Default for LcoreIds {
    fn default() -> Self {
        Self::new(FIRST_IF_LCORE..=LAST_IF_LCORE)
    }
}

impl LcoreIds {
    /// A free set holding `ids`.
    pub fn new(ids: impl IntoIterator<Item = u32>) -> LcoreIds {
        LcoreIds {
            free: Arc::new(Mutex::new(ids.into_iter().collect())),
        }
    }

    /// The least recently released free id, held until the lease drops.
    pub fn acquire(&self) -> Result<LcoreLease, NoFreeLcore> {
        let id = self.lock().pop_front().ok_or(NoFreeLcore)?;
        Ok(LcoreLease {
            id,
            free: Arc::clone(&self.free),
        })
    }

    /// How many ids are free.
    pub fn free(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<u32>> {
        // The queue is consistent after every operation on it: a panic
        // elsewhere while it was locked leaves nothing half done.
        self.free.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// One lcore id, held; back in the free set when dropped.
#[derive(Debug)]
pub struct LcoreLease {
    id: u32,
    free: Arc<Mutex<VecDeque<u32>>>,
}

impl LcoreLease {
    /// The id.
    pub fn id(&self) -> u32 {
        self.id
    }
}

impl Drop for LcoreLease {
    fn drop(&mut self) {
        self.free
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push_back(self.id);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use proptest::prelude::*;

    use super::*;

    #[test]
    fn a_thousand_processes_never_share_a_live_id() {
        // The daemon's pattern over a long run: every tuning switchover
        // starts a shadow and lets the old active go, fail-overs start
        // replacements; a few processes live long, most come and go.
        let ids = LcoreIds::default();
        let mut live: Vec<LcoreLease> = Vec::new();
        let mut rng = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let mut started = 0;
        while started < 1000 {
            // Up to 6 alive at once, like two IFs with a shadow and a
            // leaving predecessor each.
            if live.len() < 6 && next() % 3 != 0 {
                let lease = ids.acquire().expect("ids are free");
                let held: BTreeSet<u32> = live.iter().map(LcoreLease::id).collect();
                assert!(
                    !held.contains(&lease.id()),
                    "start {started}: id {} handed out while a live process holds it",
                    lease.id()
                );
                assert!((FIRST_IF_LCORE..=LAST_IF_LCORE).contains(&lease.id()));
                live.push(lease);
                started += 1;
            } else if !live.is_empty() {
                let i = (next() % live.len() as u64) as usize;
                live.swap_remove(i);
            }
        }
        drop(live);
        assert_eq!(ids.free(), 127, "every id came back");
    }

    #[test]
    fn the_128th_live_process_is_refused_not_given_a_live_id() {
        let ids = LcoreIds::default();
        let all: Vec<LcoreLease> = (0..127).map(|_| ids.acquire().unwrap()).collect();
        let distinct: BTreeSet<u32> = all.iter().map(LcoreLease::id).collect();
        assert_eq!(distinct.len(), 127);
        assert_eq!(ids.acquire().unwrap_err(), NoFreeLcore);
        assert!(NoFreeLcore.to_string().contains("1..=127"));
        drop(all);
        assert!(ids.acquire().is_ok());
    }

    #[test]
    fn ids_are_reused_least_recently_released_first() {
        let ids = LcoreIds::new([1, 2, 3]);
        let a = ids.acquire().unwrap();
        let b = ids.acquire().unwrap();
        assert_eq!((a.id(), b.id()), (1, 2));
        drop(a); // 1 goes behind 3
        assert_eq!(ids.acquire().unwrap().id(), 3);
        // That lease dropped at once: the queue is now 1, 3.
        assert_eq!(ids.acquire().unwrap().id(), 1);
    }

    proptest! {
        /// Any sequence of starts and exits: the live ids are distinct and
        /// live + free is always the whole range.
        #[test]
        fn live_and_free_partition_the_ids(ops in prop::collection::vec((any::<bool>(), any::<u8>()), 1..400)) {
            let ids = LcoreIds::new(1..=8);
            let mut live: Vec<LcoreLease> = Vec::new();
            for (start, pick) in ops {
                if start {
                    match ids.acquire() {
                        Ok(l) => live.push(l),
                        Err(NoFreeLcore) => prop_assert_eq!(live.len(), 8),
                    }
                } else if !live.is_empty() {
                    let i = pick as usize % live.len();
                    live.swap_remove(i);
                }
                let held: BTreeSet<u32> = live.iter().map(LcoreLease::id).collect();
                prop_assert_eq!(held.len(), live.len());
                prop_assert_eq!(held.len() + ids.free(), 8);
            }
        }
    }
}
