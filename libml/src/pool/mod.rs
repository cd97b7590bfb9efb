//! The input pool: where an inference function reassembles requests,
//! already converted to the model's input, and where batches are read from.
//!
//! # What
//!
//! An [`InputPool`] is `capacity` slots of `slot_elems` `f32`s each, one
//! slot after the other in one allocation made at start-up: a DPDK memzone
//! of 2 MiB hugepages ([`InputPool::in_memzone`]; pinned, so the GPU path
//! can register it) or the heap ([`InputPool::on_heap`]; for tests and for
//! running without DPDK). The two behave the same. Nothing in it grows:
//! size it from the reassembler's capacity (in-flight plus handed-over
//! requests) and the model's input ([`InputLayout::slot_elems`]).
//!
//! Slot `s` is the reassembler's `SlotId(s)`. Per fragment the reassembler
//! says "slot `s`, byte offset `o`"; [`InputPool::write_fragment`] converts
//! the payload straight into the slot with the model's [`InputLayout`]
//! (the one copy the bytes get; the mbuf can be freed right after). When a
//! request is complete its slot is the model's input as is.
//!
//! # Batches without a copy
//!
//! The reassembler allocates slots circularly, so requests that complete in
//! order sit in consecutive slots: [`InputPool::batch`] returns such a run
//! as one contiguous `[n, C, H, W]` tensor, borrowed from the pool
//! (E²bird's memory pool). A run that wraps past the last slot, or a batch
//! of scattered slots, is copied into a caller-owned batch buffer by
//! [`InputPool::gather`].
//!
//! # Safety
//!
//! The memzone is the only memory of libml that Rust did not allocate. The
//! private `memory` module, the one module of libml that allows `unsafe`,
//! turns it into slices; its docs give the ownership and aliasing contract
//! (the pool reserves the zone itself and is its only writer; no other
//! process writes it). Everything else here is safe code over those slices.
//!
//! # Limits
//!
//! - Slot indices and fragment ranges are the caller's (the reassembler's):
//!   out of range is a bug and panics, as slice indexing does.
//! - One pool per memzone name in a DPDK instance (name them e.g.
//!   `kp_pool_<if_id>_<pid>`; at most 31 bytes).

mod layout;
#[allow(unsafe_code)] // the pool's memory edge; see its module docs
mod memory;

use std::fmt;

use dpdk::{DpdkError, SocketId};

pub use layout::{F32Nchw, InputLayout, RgbU8Hwc, SlotContent, IMAGENET_MEAN, IMAGENET_STD};
use memory::PoolMemory;
pub use memory::{PoolSpan, SlotBuf};

/// What can go wrong building an [`InputLayout`] or an [`InputPool`].
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    /// A layout dimension is 0.
    #[error("input layout with a zero dimension")]
    EmptyLayout,
    /// The request would be over `u32::MAX` bytes, more than docs/PROTOCOL.md's
    /// `total_len` can say.
    #[error("input layout larger than a request can be (u32::MAX bytes)")]
    LayoutTooLarge,
    /// A channel's mean or std makes normalised values that are not finite.
    #[error("channel {channel}: mean and std must be finite, std non-zero, and every normalised value finite")]
    BadNormalisation {
        /// The channel (0 = R, 1 = G, 2 = B).
        channel: usize,
    },
    /// An `rgb_u8_hwc` model whose input does not have 3 channels.
    #[error("rgb_u8_hwc needs 3 channels, the model has {0}")]
    NotRgb(usize),
    /// `capacity` or `slot_elems` is 0.
    #[error("input pool with no slots or empty slots")]
    EmptyPool,
    /// `capacity × slot_elems × 4` bytes does not fit in memory.
    #[error("input pool too large for the address space")]
    TooLarge,
    /// Reserving the memzone failed (name taken, no hugepages left, EAL
    /// not running, ...).
    #[error("reserving the input pool's memzone: {0}")]
    Dpdk(#[from] DpdkError),
    /// DPDK returned a memzone that is not what was asked for.
    #[error("memzone {name:?} is unusable ({len} bytes, or misaligned)")]
    BadZone {
        /// The zone's name.
        name: String,
        /// Its length.
        len: usize,
    },
}

/// `capacity` request slots of `slot_elems` `f32`s, contiguous, allocated
/// once (module docs).
pub struct InputPool {
    memory: PoolMemory,
    capacity: usize,
    slot_elems: usize,
}

impl InputPool {
    /// A pool on the heap, zeroed.
    ///
    /// # Panics
    ///
    /// If `capacity` or `slot_elems` is 0 or the pool does not fit in
    /// memory (a configuration error, as for `Vec::with_capacity`).
    pub fn on_heap(capacity: usize, slot_elems: usize) -> InputPool {
        let elems = match Self::elems(capacity, slot_elems) {
            Ok(e) => e,
            Err(e) => panic!("InputPool::on_heap({capacity}, {slot_elems}): {e}"),
        };
        InputPool {
            memory: PoolMemory::heap(elems),
            capacity,
            slot_elems,
        }
    }

    /// A pool in a new DPDK memzone called `name` (at most 31 bytes, unique
    /// in the DPDK instance, e.g. `kp_pool_<if_id>_<pid>`), of 2 MiB pages
    /// on `socket`, page-aligned, its length rounded up to whole pages,
    /// zeroed. The EAL must be running; the zone is freed when the pool is
    /// dropped (and `Eal::cleanup` is refused while it lives).
    ///
    /// The pool is the zone's only writer: no other process may write it
    /// (module docs of the pool's memory).
    pub fn in_memzone(
        name: &str,
        capacity: usize,
        slot_elems: usize,
        socket: SocketId,
    ) -> Result<InputPool, PoolError> {
        let elems = Self::elems(capacity, slot_elems)?;
        Ok(InputPool {
            memory: PoolMemory::memzone(name, elems, socket)?,
            capacity,
            slot_elems,
        })
    }

    fn elems(capacity: usize, slot_elems: usize) -> Result<usize, PoolError> {
        if capacity == 0 || slot_elems == 0 {
            return Err(PoolError::EmptyPool);
        }
        capacity
            .checked_mul(slot_elems)
            .filter(|e| e.checked_mul(4).is_some_and(|b| b <= isize::MAX as usize))
            .ok_or(PoolError::TooLarge)
    }

    /// Number of slots.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// `f32` values per slot.
    pub fn slot_elems(&self) -> usize {
        self.slot_elems
    }

    /// Bytes of the slots, `capacity × slot_elems × 4` (a memzone is
    /// rounded up to whole pages beyond this; see [`InputPool::reserved_bytes`]).
    pub fn bytes(&self) -> usize {
        self.capacity * self.slot_elems * 4
    }

    /// Bytes of the memory under the pool: [`InputPool::bytes`] on the
    /// heap, the whole memzone (whole 2 MiB pages) otherwise.
    pub fn reserved_bytes(&self) -> usize {
        self.memory.zone().map_or(self.bytes(), |z| z.len())
    }

    /// Start of slot 0, for registering the pool with a device (e.g. as
    /// pinned host memory, [`InputPool::reserved_bytes`] long). Do not
    /// write through it: the pool's contract makes it the only writer.
    pub fn as_ptr(&self) -> *const f32 {
        self.memory.as_slice().as_ptr()
    }

    /// Where the pool lies and what its slots hold under `layout`, for an
    /// engine that reads requests in place
    /// ([`crate::engine::Framework::attach_input_pool`]); `None` when
    /// `layout` is not this pool's (another slot size).
    pub fn location(&self, layout: &InputLayout) -> Option<crate::engine::PoolLocation> {
        (layout.slot_elems() == self.slot_elems).then(|| crate::engine::PoolLocation {
            addr: self.as_ptr() as usize,
            reserved_bytes: self.reserved_bytes(),
            slots: self.capacity,
            slot_bytes: self.slot_elems * 4,
            content: layout.slot_content(),
        })
    }

    /// IO-virtual address of slot 0 as DPDK reports it (memzone pools
    /// only). The pool is IOVA-contiguous only where the EAL runs with IOVA
    /// as VA (or its pages happen to be physically contiguous); the GPU
    /// path registers it by virtual address ([`InputPool::as_ptr`]).
    pub fn iova(&self) -> Option<u64> {
        self.memory.zone().map(|z| z.iova())
    }

    /// The memzone's name, if the pool is in one.
    pub fn memzone_name(&self) -> Option<&str> {
        self.memory.zone().map(|z| z.name())
    }

    /// Slot `slot`'s values.
    ///
    /// # Panics
    ///
    /// If `slot >= capacity`.
    #[inline]
    pub fn slot(&self, slot: usize) -> &[f32] {
        let range = self.range(slot, 1);
        &self.memory.as_slice()[range]
    }

    /// Slot `slot`'s values, writable.
    ///
    /// # Panics
    ///
    /// If `slot >= capacity`.
    #[inline]
    pub fn slot_mut(&mut self, slot: usize) -> &mut [f32] {
        let range = self.range(slot, 1);
        &mut self.memory.as_mut_slice()[range]
    }

    /// Splits the pool into one writable buffer per slot (slot `i` is item
    /// `i`), plus the span that joins adjacent buffers back into one tensor.
    ///
    /// This is how two threads share the pool without a lock: a slot's
    /// buffer is owned by whichever thread holds it (the fragment thread
    /// while the request is assembled, the inference thread until it is
    /// answered), and [`PoolSpan::join`] turns the buffers of a batch of
    /// adjacent slots into one input tensor with no copy.
    pub fn split_slots(&mut self) -> (PoolSpan<'_>, Vec<SlotBuf<'_>>) {
        let elems = self.slot_elems;
        PoolSpan::split(self.memory.as_mut_slice(), elems)
    }

    /// Slots `first..first + n` as one tensor (`n × slot_elems` values), if
    /// they are contiguous: `first + n <= capacity`, no wrap-around. `None`
    /// if they wrap (then [`gather`](InputPool::gather) them) or `first` is
    /// past the end. `n = 0` gives an empty slice.
    #[inline]
    pub fn batch(&self, first: usize, n: usize) -> Option<&[f32]> {
        let end = first.checked_add(n)?;
        if first >= self.capacity || end > self.capacity {
            return None;
        }
        Some(&self.memory.as_slice()[first * self.slot_elems..end * self.slot_elems])
    }

    /// Copies `slots`, in that order, into `dst` (`slots.len() × slot_elems`
    /// values): the batch tensor for slots that are not one contiguous run.
    ///
    /// # Panics
    ///
    /// If `dst.len() != slots.len() × slot_elems` or a slot is out of
    /// range.
    pub fn gather(&self, slots: &[usize], dst: &mut [f32]) {
        assert_eq!(
            Some(dst.len()),
            slots.len().checked_mul(self.slot_elems),
            "gather: dst must hold exactly {} slots of {} values",
            slots.len(),
            self.slot_elems
        );
        for (out, &s) in dst.chunks_exact_mut(self.slot_elems).zip(slots) {
            out.copy_from_slice(self.slot(s));
        }
    }

    /// Converts a fragment's payload, bytes `offset..` of the request in
    /// `slot`, into that slot with `layout` (see
    /// [`InputLayout::write_fragment`]). This is the one copy of the bytes:
    /// their mbuf can be freed once it returns.
    ///
    /// # Panics
    ///
    /// If `layout` is not this pool's (`layout.slot_elems() !=
    /// slot_elems()`), `slot >= capacity`, or the range goes past the
    /// request.
    #[inline]
    pub fn write_fragment(
        &mut self,
        layout: &InputLayout,
        slot: usize,
        offset: usize,
        payload: &[u8],
    ) {
        layout.write_fragment(payload, offset, self.slot_mut(slot));
    }

    /// Element range of slots `first..first + n`, checked.
    #[inline]
    fn range(&self, first: usize, n: usize) -> std::ops::Range<usize> {
        assert!(
            first < self.capacity && n <= self.capacity - first,
            "slot {first} (+{n}) out of range: the pool has {} slots",
            self.capacity
        );
        first * self.slot_elems..(first + n) * self.slot_elems
    }
}

impl fmt::Debug for InputPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("InputPool");
        d.field("capacity", &self.capacity)
            .field("slot_elems", &self.slot_elems)
            .field("at", &self.as_ptr());
        match self.memory.zone() {
            Some(z) => d.field("memzone", &z.name()),
            None => d.field("memzone", &None::<&str>),
        };
        d.finish()
    }
}

#[cfg(test)]
mod tests;
