//! The input pool's memory: a heap allocation, or a DPDK memzone of
//! hugepages seen as `f32`s. The only module of libml with `unsafe` code:
//! two blocks, each turning the memzone this module owns into a slice.
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

/// The address range of one pool's memory, to join adjacent slot buffers
/// back into one tensor after the pool was split into per-slot buffers
/// (see [`super::InputPool::split_slots`]).
///
/// It holds addresses only, so it is `Copy + Send + Sync`; `'a` ties it to
/// the pool's exclusive borrow, which every slot buffer also lives in.
#[derive(Clone, Copy, Debug)]
pub struct PoolSpan<'a> {
    start: usize,
    end: usize,
    _pool: std::marker::PhantomData<&'a [f32]>,
}

impl<'a> PoolSpan<'a> {
    /// The span of the memory at `range`; `'a` is the borrow of the pool
    /// the caller holds for as long as the span is used.
    pub(super) fn of(range: std::ops::Range<*const f32>) -> PoolSpan<'a> {
        PoolSpan {
            start: range.start as usize,
            end: range.end as usize,
            _pool: std::marker::PhantomData,
        }
    }

    /// `parts` as one slice, if each starts where the previous one ends
    /// and all lie in this pool's memory (a batch of requests in adjacent
    /// slots: one tensor, no copy); `None` otherwise (gather them).
    pub fn join<'b>(&self, parts: impl IntoIterator<Item = &'b [f32]>) -> Option<&'b [f32]>
    where
        'a: 'b,
    {
        let mut parts = parts.into_iter().peekable();
        let start = parts.peek()?.as_ptr() as usize;
        let mut end = start;
        for p in parts {
            let r = p.as_ptr_range();
            if r.start as usize != end {
                return None;
            }
            end = r.end as usize;
        }
        if start < self.start || end > self.end {
            return None;
        }
        let len = (end - start) / std::mem::size_of::<f32>();
        // SAFETY:
        // - `start..end` lies inside this pool's single allocation (checked
        //   just above against the span taken from it), so the slice stays
        //   within one allocated object, is non-null and `f32`-aligned
        //   (it starts at `parts[0]`);
        // - it is exactly the union of `parts` (each starts where the
        //   previous ends), all of them initialised `f32`s shared-borrowed
        //   for `'b`, so reading them through one slice for `'b` aliases
        //   nothing that is being written;
        // - `len * 4 = end - start <= isize::MAX` (one allocation).
        Some(unsafe { std::slice::from_raw_parts(start as *const f32, len) })
    }
}
