//! The input pool's memory: a heap allocation, or a DPDK memzone of
//! hugepages seen as `f32`s, and its split into per-slot buffers
//! ([`SlotBuf`], [`PoolSpan`]). The only module of libml with `unsafe` code:
//! turning the memzone this module owns into a slice, and the slot
//! buffers' and span's pointer arithmetic inside the pool.
//!
//! # Ownership and aliasing of the memzone
//!
//! [`PoolMemory::memzone`] reserves a new zone itself (DPDK refuses an
//! existing name with `EEXIST`), so when it returns no other handle to the
//! zone exists, and the only way to its bytes from Rust is through the
//! `PoolMemory` that owns it: `&self` gives `&[f32]`, `&mut self` gives
//! `&mut [f32]`, and the borrow checker does the rest.
//!
//! What the borrow checker cannot see is the rest of the DPDK instance: a
//! memzone is shared memory, which another process (or another handle made
//! by `dpdk::Memzone::lookup` in this one) could map. The contract, which
//! `dpdk::Memzone::as_slice`/`as_mut_slice` state and kneepoint keeps: the
//! pool's zone is written only by the process that reserved it, through
//! its `InputPool`; nothing else writes it, and nothing else reads it while
//! that process writes the same bytes. The GPU path will read handed-over
//! slots (registered as pinned host memory) while the CPU writes other,
//! still-assembling slots; it never writes the pool.

use std::marker::PhantomData;
use std::ptr::NonNull;

use dpdk::{Memzone, MemzoneFlags, SocketId};

use super::PoolError;

/// Hugepage size the memzone is reserved from, and what its length and
/// start are rounded to: the zone then covers whole pages that nothing else
/// shares, which is what pinning it for a GPU (page by page) wants.
pub(super) const HUGEPAGE: usize = 2 << 20;

/// `elems` `f32`s, allocated once.
pub(super) enum PoolMemory {
    Heap(Box<[f32]>),
    /// Invariants (checked in [`PoolMemory::memzone`]): `zone.as_ptr()` is
    /// non-null and aligned for `f32`, `elems * 4 <= zone.len()`, and the
    /// zone was reserved by this value.
    Memzone {
        zone: Memzone,
        elems: usize,
    },
}

impl PoolMemory {
    /// `elems` zeros on the heap.
    pub(super) fn heap(elems: usize) -> PoolMemory {
        PoolMemory::Heap(vec![0.0; elems].into_boxed_slice())
    }

    /// `elems` zeros in a new memzone `name` of 2 MiB pages on `socket`,
    /// its length rounded up to whole pages and its start page-aligned.
    /// Writing the zeros also touches every page once, at start-up.
    pub(super) fn memzone(
        name: &str,
        elems: usize,
        socket: SocketId,
    ) -> Result<PoolMemory, PoolError> {
        let bytes = elems
            .checked_mul(4)
            .and_then(|b| b.checked_next_multiple_of(HUGEPAGE))
            .filter(|&b| b > 0)
            .ok_or(PoolError::TooLarge)?;
        let zone = Memzone::reserve(name, bytes, socket, MemzoneFlags::PAGE_2MB, HUGEPAGE as u32)?;
        let ptr = zone.as_ptr().cast::<f32>();
        if ptr.is_null() || !ptr.is_aligned() || zone.len() < elems * 4 {
            return Err(PoolError::BadZone {
                name: name.to_owned(),
                len: zone.len(),
            });
        }
        let mut memory = PoolMemory::Memzone { zone, elems };
        memory.as_mut_slice().fill(0.0);
        Ok(memory)
    }

    pub(super) fn as_slice(&self) -> &[f32] {
        match self {
            PoolMemory::Heap(b) => b,
            PoolMemory::Memzone { zone, elems } => {
                // SAFETY:
                // - the pointer is non-null and `f32`-aligned, and the
                //   `elems * 4` bytes from it are inside the zone's mapping,
                //   which lives as long as `zone`, owned by `self`
                //   (invariants checked in `memzone`);
                // - the bytes are initialised (hugepage memory, zeroed in
                //   `memzone`) and any bit pattern is a valid `f32`;
                // - nothing writes them while `&self` lives: in this process
                //   writes need `&mut self`, and nothing outside writes the
                //   pool's zone (module docs).
                unsafe { std::slice::from_raw_parts(zone.as_ptr().cast::<f32>(), *elems) }
            }
        }
    }

    pub(super) fn as_mut_slice(&mut self) -> &mut [f32] {
        match self {
            PoolMemory::Heap(b) => b,
            PoolMemory::Memzone { zone, elems } => {
                // SAFETY:
                // - as in `as_slice` for the pointer, the length, the
                //   lifetime and the values;
                // - nothing else reads or writes them while `&mut self`
                //   lives: this value reserved the zone and is borrowed
                //   exclusively, and nothing outside touches the bytes the
                //   process writes (module docs).
                unsafe { std::slice::from_raw_parts_mut(zone.as_ptr().cast::<f32>(), *elems) }
            }
        }
    }

    /// The zone, if there is one.
    pub(super) fn zone(&self) -> Option<&Memzone> {
        match self {
            PoolMemory::Heap(_) => None,
            PoolMemory::Memzone { zone, .. } => Some(zone),
        }
    }
}

/// One slot's buffer, while the pool is split ([`super::InputPool::split_slots`]):
/// owned by whichever thread holds the request in it, and dereferencing to
/// the slot's `f32`s like a `&mut [f32]` would.
///
/// It is a pointer into the pool rather than a `&mut [f32]` so that
/// [`PoolSpan::join`] can read a run of adjacent slots as one slice: every
/// slot buffer and the span derive their pointers from the one base pointer
/// taken from the pool's exclusive borrow, so reading a run through the
/// span is a read of memory that base pointer covers, not a read past the
/// end of one slot's reference (which is what rebuilding one slice from
/// several `&[f32]` would be).
pub struct SlotBuf<'a> {
    ptr: NonNull<f32>,
    len: usize,
    index: usize,
    _pool: PhantomData<&'a mut [f32]>,
}

// SAFETY:
// - a `SlotBuf` is the only handle to its slot's memory (the pool is
//   exclusively borrowed for `'a` and split into disjoint slots), like a
//   `&'a mut [f32]`, which is `Send`;
// - `f32` is `Send`.
unsafe impl Send for SlotBuf<'_> {}
// SAFETY: `&SlotBuf` gives only `&[f32]` (as `&&mut [f32]` would), and
// `f32` is `Sync`.
unsafe impl Sync for SlotBuf<'_> {}

impl std::fmt::Debug for SlotBuf<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlotBuf")
            .field("slot", &self.index)
            .field("len", &self.len)
            .finish()
    }
}

impl SlotBuf<'_> {
    /// The slot's index in the pool.
    pub fn index(&self) -> usize {
        self.index
    }
}

impl std::ops::Deref for SlotBuf<'_> {
    type Target = [f32];

    fn deref(&self) -> &[f32] {
        // SAFETY:
        // - `ptr..ptr + len` is this slot, inside the pool's allocation,
        //   non-null, `f32`-aligned and initialised (`PoolSpan::split`);
        // - the allocation lives for `'a`, which outlives `self`;
        // - nothing writes the slot while `&self` lives: writes need
        //   `&mut self` on this, the slot's one buffer, and the span reads
        //   only slots it borrows buffers of (`PoolSpan::join`).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl std::ops::DerefMut for SlotBuf<'_> {
    fn deref_mut(&mut self) -> &mut [f32] {
        // SAFETY:
        // - as in `deref` for the pointer, the length, the lifetime and the
        //   values;
        // - nothing else reads or writes the slot while `&mut self` lives:
        //   this is its one buffer, and the span reads a slot only through
        //   a shared borrow of its buffer.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

/// One pool's memory while it is split into [`SlotBuf`]s: joins the
/// buffers of adjacent slots back into one tensor, with no copy (see
/// [`super::InputPool::split_slots`]).
///
/// It is `Copy + Send + Sync` (it reads only through [`PoolSpan::join`],
/// which borrows the buffers it reads); `'a` ties it to the pool's
/// exclusive borrow, which every slot buffer also lives in.
#[derive(Clone, Copy, Debug)]
pub struct PoolSpan<'a> {
    base: NonNull<f32>,
    slot_elems: usize,
    slots: usize,
    _pool: PhantomData<&'a [f32]>,
}

// SAFETY: the span itself never touches the memory; `join` reads slots
// only through shared borrows of their buffers, which are `Sync`.
unsafe impl Send for PoolSpan<'_> {}
// SAFETY: as for `Send`.
unsafe impl Sync for PoolSpan<'_> {}

impl<'a> PoolSpan<'a> {
    /// Splits `memory` (the whole pool, exclusively borrowed for `'a`)
    /// into `slot_elems`-long slot buffers, slot `i` as item `i`, and the
    /// span over them. Every pointer derives from the one base pointer
    /// taken here.
    ///
    /// # Panics
    ///
    /// If `slot_elems` is 0 or does not divide `memory.len()`.
    pub(super) fn split(
        memory: &'a mut [f32],
        slot_elems: usize,
    ) -> (PoolSpan<'a>, Vec<SlotBuf<'a>>) {
        assert!(
            slot_elems > 0 && memory.len().is_multiple_of(slot_elems),
            "a pool of {} values does not split into slots of {slot_elems}",
            memory.len()
        );
        let slots = memory.len() / slot_elems;
        let base = NonNull::from(memory).cast::<f32>();
        let bufs = (0..slots)
            .map(|index| SlotBuf {
                // SAFETY: `index * slot_elems < memory.len()`, so the
                // offset stays inside the allocation `base` points into.
                ptr: unsafe { base.add(index * slot_elems) },
                len: slot_elems,
                index,
                _pool: PhantomData,
            })
            .collect();
        let span = PoolSpan {
            base,
            slot_elems,
            slots,
            _pool: PhantomData,
        };
        (span, bufs)
    }

    /// Whether `buf` is the buffer of one of this span's slots (a buffer of
    /// another pool, or another split, has another pointer).
    fn owns(&self, buf: &SlotBuf<'_>) -> bool {
        buf.index < self.slots
            // SAFETY: `buf.index < self.slots`, so the offset stays inside
            // the allocation `base` points into.
            && buf.ptr == unsafe { self.base.add(buf.index * self.slot_elems) }
    }

    /// `parts` as one slice, if they are buffers of this pool's slots
    /// `k, k+1, ..., k+n-1` in that order (a batch of requests in adjacent
    /// slots: one tensor, no copy); `None` otherwise (gather them), and
    /// for no parts.
    pub fn join<'b>(&self, parts: impl IntoIterator<Item = &'b SlotBuf<'a>>) -> Option<&'b [f32]>
    where
        'a: 'b,
    {
        let mut parts = parts.into_iter();
        let first = parts.next()?;
        if !self.owns(first) {
            return None;
        }
        let mut n = 1;
        for p in parts {
            if p.index != first.index + n || !self.owns(p) {
                return None;
            }
            n += 1;
        }
        // SAFETY: `first.index < self.slots` (`owns`), so the offset stays
        // inside the allocation `base` points into.
        let start = unsafe { self.base.add(first.index * self.slot_elems) };
        // SAFETY:
        // - slots `first.index..first.index + n` lie inside the pool's one
        //   allocation (each part is one of its slots: `owns`), which
        //   `base` points to and which lives for `'a: 'b`; the pointer is
        //   non-null, `f32`-aligned and the values initialised;
        // - `n * slot_elems * 4 <= isize::MAX` (one allocation);
        // - those slots' buffers are exactly `parts` (consecutive indices,
        //   one buffer per slot), all shared-borrowed for `'b`, so nothing
        //   writes those slots while the slice lives;
        // - the pointer derives from `base`, whose provenance covers the
        //   whole pool, not from one slot's buffer.
        Some(unsafe { std::slice::from_raw_parts(start.as_ptr(), n * self.slot_elems) })
    }
}
