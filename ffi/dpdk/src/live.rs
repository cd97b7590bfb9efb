//! What of DPDK is alive in this process.
//!
//! `rte_eal_cleanup` unmaps DPDK's shared memory: every pointer into it
//! dangles afterwards. So that a safe [`Eal::cleanup`](crate::Eal::cleanup)
//! can never pull memory from under a Rust value, this module keeps:
//!
//! - the EAL's state (never initialised, running, cleaning, done);
//! - the number of live handles (`Mempool`, `Ring`, `Memzone`, `Port`),
//!   each of which holds an [`EalClaim`], taken only while the EAL runs;
//! - the number of live mbufs (`Mbuf`s and the contents of `MbufBurst`s),
//!   counted per burst on the fast path, so one atomic add per burst;
//! - which shared objects (by address) this process holds handles to and
//!   whether it created them, so that an object is freed when the last
//!   handle of its creator process goes, and never while another handle of
//!   this process still points at it;
//! - which ports and single-producer/consumer rings are held, since two
//!   handles to those would let safe code break DPDK's threading rules.
//!
//! Cleanup refuses while any handle or mbuf is alive
//! ([`DpdkError::EalInUse`]).

use std::sync::atomic::{AtomicIsize, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::DpdkError;

/// `Eal::init` never called (or its `rte_eal_init` failed).
pub(crate) const UNINIT: u8 = 0;
/// `rte_eal_init` in progress.
pub(crate) const INITIALISING: u8 = 1;
/// The EAL runs: handles may be created.
pub(crate) const RUNNING: u8 = 2;
/// `Eal::cleanup` is checking that nothing is alive.
pub(crate) const CLEANING: u8 = 3;
/// `rte_eal_cleanup` has run: DPDK memory is gone for good.
pub(crate) const DONE: u8 = 4;

/// The EAL's state, one of the constants above.
pub(crate) static EAL_STATE: AtomicU8 = AtomicU8::new(UNINIT);
/// Live [`EalClaim`]s.
static HANDLES: AtomicUsize = AtomicUsize::new(0);
/// Live mbufs owned by Rust values of this process.
static MBUFS: AtomicIsize = AtomicIsize::new(0);

/// A claim on the running EAL, held by every DPDK handle: while one exists,
/// `Eal::cleanup` refuses.
#[derive(Debug)]
pub(crate) struct EalClaim(());

impl EalClaim {
    /// A new claim, if the EAL runs.
    pub(crate) fn new(op: &'static str) -> Result<Self, DpdkError> {
        // Count first, then look at the state; cleanup does the opposite
        // (state first, then count), so with sequentially consistent
        // accesses at least one of the two sees the other.
        HANDLES.fetch_add(1, Ordering::SeqCst);
        if EAL_STATE.load(Ordering::SeqCst) == RUNNING {
            Ok(EalClaim(()))
        } else {
            HANDLES.fetch_sub(1, Ordering::SeqCst);
            Err(DpdkError::EalNotRunning { op })
        }
    }
}

impl Clone for EalClaim {
    fn clone(&self) -> Self {
        // `self` keeps the count above zero, so the EAL cannot be cleaned
        // up in between: no state check needed.
        HANDLES.fetch_add(1, Ordering::SeqCst);
        EalClaim(())
    }
}

impl Drop for EalClaim {
    fn drop(&mut self) {
        HANDLES.fetch_sub(1, Ordering::SeqCst);
    }
}

/// `n` mbufs came into Rust's hands (allocated, received, dequeued).
#[inline]
pub(crate) fn mbufs_in(n: usize) {
    if n > 0 {
        MBUFS.fetch_add(n as isize, Ordering::Relaxed);
    }
}

/// `n` mbufs left Rust's hands (freed, sent, enqueued, `into_raw`).
#[inline]
pub(crate) fn mbufs_out(n: usize) {
    if n > 0 {
        // Release: whatever was done with them happens-before a cleanup
        // that reads the count (acquire) as zero.
        MBUFS.fetch_sub(n as isize, Ordering::Release);
    }
}

/// Moves the state RUNNING -> CLEANING if nothing is alive; otherwise leaves
/// it RUNNING and says what is.
pub(crate) fn begin_cleanup() -> Result<(), DpdkError> {
    EAL_STATE
        .compare_exchange(RUNNING, CLEANING, Ordering::SeqCst, Ordering::SeqCst)
        .map_err(|_| DpdkError::EalNotRunning {
            op: "rte_eal_cleanup",
        })?;
    let handles = HANDLES.load(Ordering::SeqCst);
    // No handle: no new mbuf can enter Rust's hands, and every handle's
    // last operation happened-before its claim was dropped.
    let mbufs = MBUFS.load(Ordering::SeqCst);
    if handles != 0 || mbufs != 0 {
        EAL_STATE.store(RUNNING, Ordering::SeqCst);
        return Err(DpdkError::EalInUse { handles, mbufs });
    }
    Ok(())
}

/// Live mbufs of this process (for tests and diagnostics).
pub fn live_mbufs() -> isize {
    MBUFS.load(Ordering::Acquire)
}

/// Live DPDK handles of this process (for tests and diagnostics).
pub fn live_handles() -> usize {
    HANDLES.load(Ordering::SeqCst)
}

/// What kind of object a registry entry is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Mempool,
    Ring,
    Memzone,
    Port,
}

#[derive(Debug)]
struct Entry {
    kind: Kind,
    /// The object's address (or port id for ports).
    key: usize,
    /// Handles of this process.
    handles: usize,
    /// Created by this process: the last handle frees it.
    created_here: bool,
    /// At most one handle may exist.
    exclusive: bool,
}

static OBJECTS: Mutex<Vec<Entry>> = Mutex::new(Vec::new());

fn objects() -> MutexGuard<'static, Vec<Entry>> {
    // The table is consistent after every statement; a panic elsewhere
    // while it was locked cannot have broken it.
    OBJECTS.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Records one more handle to `(kind, key)`. Fails if the object is held
/// exclusively, or is to be held exclusively and already has a handle.
pub(crate) fn acquire(
    kind: Kind,
    key: usize,
    created_here: bool,
    exclusive: bool,
) -> Result<(), ()> {
    let mut table = objects();
    match table.iter_mut().find(|e| e.kind == kind && e.key == key) {
        Some(e) if e.exclusive || exclusive => Err(()),
        Some(e) => {
            e.handles += 1;
            e.created_here |= created_here;
            Ok(())
        }
        None => {
            table.push(Entry {
                kind,
                key,
                handles: 1,
                created_here,
                exclusive,
            });
            Ok(())
        }
    }
}

/// Records that a handle to `(kind, key)` is gone; true if it was the last
/// one of this process and this process created the object (then the caller
/// frees it).
pub(crate) fn release(kind: Kind, key: usize) -> bool {
    let mut table = objects();
    let Some(i) = table.iter().position(|e| e.kind == kind && e.key == key) else {
        debug_assert!(false, "release of an unregistered {kind:?}");
        return false;
    };
    table[i].handles -= 1;
    if table[i].handles > 0 {
        return false;
    }
    table.swap_remove(i).created_here
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_handle_of_the_creator_frees() {
        let k = 0x1000_0001;
        acquire(Kind::Mempool, k, true, false).unwrap();
        acquire(Kind::Mempool, k, false, false).unwrap();
        assert!(!release(Kind::Mempool, k));
        assert!(release(Kind::Mempool, k));
    }

    #[test]
    fn handles_of_other_processes_objects_never_free() {
        let k = 0x1000_0002;
        acquire(Kind::Ring, k, false, false).unwrap();
        assert!(!release(Kind::Ring, k));
    }

    #[test]
    fn exclusive_objects_take_one_handle() {
        let k = 0x1000_0003;
        acquire(Kind::Ring, k, true, true).unwrap();
        assert!(acquire(Kind::Ring, k, false, false).is_err());
        assert!(acquire(Kind::Ring, k, false, true).is_err());
        assert!(release(Kind::Ring, k));
        // Same key, other kind: unrelated.
        acquire(Kind::Port, k, true, true).unwrap();
        assert!(release(Kind::Port, k));
    }

    #[test]
    fn no_claim_without_a_running_eal() {
        // This unit-test binary never initialises the EAL.
        let err = EalClaim::new("rte_ring_create").unwrap_err();
        assert!(matches!(
            err,
            DpdkError::EalNotRunning {
                op: "rte_ring_create"
            }
        ));
        assert_eq!(live_handles(), 0);
    }
}
