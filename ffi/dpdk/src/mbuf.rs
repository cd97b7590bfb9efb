//! Packet buffers: the owned [`Mbuf`] and the fixed-capacity
//! [`MbufBurst`] that carries them through RX, TX and rings without
//! allocating.

use std::fmt;
use std::mem::{ManuallyDrop, MaybeUninit};
use std::ptr::NonNull;

use dpdk_sys as sys;

use crate::live;
use crate::PortId;

/// One packet buffer (`struct rte_mbuf`), owned: dropping it frees it back
/// to its mempool.
///
/// Invariants (upheld by every constructor; [`Mbuf::from_raw`] makes them
/// the caller's):
/// - the pointer is a valid, allocated mbuf of a packet mempool in DPDK's
///   shared memory, and this `Mbuf` is its only owner (no other `Mbuf`, no
///   ring, no driver queue holds it);
/// - its data buffer is not shared with another mbuf (no clones, no
///   external buffers), so `&mut self` gives exclusive access to the bytes.
///   Every mbuf this crate hands out comes from `rte_pktmbuf_alloc`, a
///   PMD's RX or a ring filled by this crate, none of which share buffers.
///
/// DPDK's shared memory is mapped at the same virtual address in the
/// primary and every secondary process, so an `Mbuf` may travel between
/// processes through a [`Ring`](crate::Ring) as a plain pointer.
///
/// [`data`](Mbuf::data) and the length functions look at the first segment
/// only; kneepoint's packets are single-segment (see
/// [`is_segmented`](Mbuf::is_segmented)).
#[repr(transparent)]
pub struct Mbuf(NonNull<sys::rte_mbuf>);

// SAFETY:
// - an `Mbuf` is the unique owner of its buffer (type invariant), so
//   moving it to another thread moves the ownership with it;
// - freeing an mbuf from any thread is allowed: packet mempools are
//   multi-producer/multi-consumer, and a thread without an lcore id simply
//   bypasses the per-lcore cache.
unsafe impl Send for Mbuf {}
// SAFETY:
// - `&Mbuf` only reads the mbuf's header and bytes; every mutation takes
//   `&mut self`.
unsafe impl Sync for Mbuf {}

impl Mbuf {
    /// Takes ownership of a raw mbuf.
    ///
    /// # Safety
    ///
    /// - `ptr` points to a valid, allocated mbuf of a packet mempool, in
    ///   DPDK's memory, while the EAL runs;
    /// - nothing else owns it or will free it: ownership moves into the
    ///   returned `Mbuf` (typically it came from [`Mbuf::into_raw`]);
    /// - its data buffer is not shared with another mbuf (direct, not a
    ///   clone, not attached to an external buffer).
    #[inline]
    pub unsafe fn from_raw(ptr: NonNull<sys::rte_mbuf>) -> Mbuf {
        live::mbufs_in(1);
        Mbuf(ptr)
    }

    /// Gives up ownership without freeing; see [`Mbuf::from_raw`].
    #[inline]
    pub fn into_raw(self) -> NonNull<sys::rte_mbuf> {
        let this = ManuallyDrop::new(self);
        live::mbufs_out(1);
        this.0
    }

    /// The raw mbuf, still owned by `self`.
    #[inline]
    pub fn as_ptr(&self) -> *mut sys::rte_mbuf {
        self.0.as_ptr()
    }

    #[inline]
    fn raw(&self) -> &sys::rte_mbuf {
        // SAFETY:
        // - the pointer is a valid mbuf that `self` owns (type invariant);
        // - nothing else writes to it while `self` is borrowed.
        unsafe { self.0.as_ref() }
    }

    #[inline]
    fn raw_mut(&mut self) -> &mut sys::rte_mbuf {
        // SAFETY:
        // - the pointer is a valid mbuf that `self` owns exclusively (type
        //   invariant), and `&mut self` is the only way to it.
        unsafe { self.0.as_mut() }
    }

    #[inline]
    fn data_ptr(&self) -> *mut u8 {
        let m = self.raw();
        m.buf_addr
            .cast::<u8>()
            .wrapping_add(usize::from(m.data_off))
    }

    /// The packet bytes of the first segment.
    #[inline]
    pub fn data(&self) -> &[u8] {
        let len = self.len();
        // SAFETY:
        // - `buf_addr + data_off .. + data_len` lies inside the mbuf's data
        //   buffer (DPDK invariant of every valid mbuf), in mapped memory;
        // - the bytes are initialised: hugepage memory comes zeroed from
        //   the kernel and is only ever written with plain bytes;
        // - the buffer is not shared (type invariant) and `&self` excludes
        //   writers for the returned lifetime.
        unsafe { std::slice::from_raw_parts(self.data_ptr(), len) }
    }

    /// The packet bytes of the first segment, writable.
    #[inline]
    pub fn data_mut(&mut self) -> &mut [u8] {
        let len = self.len();
        // SAFETY:
        // - as in `data`: in bounds, mapped, initialised;
        // - `&mut self` and the unshared buffer (type invariant) make this
        //   the only reference to those bytes.
        unsafe { std::slice::from_raw_parts_mut(self.data_ptr(), len) }
    }

    /// Bytes of data in the first segment (`data_len`).
    #[inline]
    pub fn len(&self) -> usize {
        usize::from(self.raw().data_len)
    }

    /// True if the first segment holds no data.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of data in all segments (`pkt_len`).
    #[inline]
    pub fn pkt_len(&self) -> usize {
        self.raw().pkt_len as usize
    }

    /// Number of segments.
    #[inline]
    pub fn nb_segs(&self) -> u16 {
        self.raw().nb_segs
    }

    /// True if the packet spans more than one mbuf; then [`data`](Mbuf::data)
    /// is only its first part.
    #[inline]
    pub fn is_segmented(&self) -> bool {
        self.nb_segs() > 1
    }

    /// The port it was received on (meaningful for received packets).
    #[inline]
    pub fn port(&self) -> PortId {
        PortId(self.raw().port)
    }

    /// The reference count (1 for every mbuf this crate hands out).
    #[inline]
    pub fn refcnt(&self) -> u16 {
        // SAFETY:
        // - valid mbuf owned by `self` (type invariant); reads the count
        //   atomically as DPDK does.
        unsafe { sys::kp_rte_mbuf_refcnt_read(self.as_ptr()) }
    }

    /// Where the frame's L3 and L4 headers start, as the classifier that
    /// validated them recorded ([`set_header_lens`](Mbuf::set_header_lens)):
    /// DPDK's `l2_len` and `l3_len`, `(0, 0)` when nobody did. A later
    /// stage (another process, through a ring) need not parse again.
    #[inline]
    pub fn header_lens(&self) -> (usize, usize) {
        // SAFETY:
        // - both variants of the union are plain integers over the same
        //   8 bytes: any bits are a valid value of the bit-field struct.
        let f = unsafe { self.raw().__bindgen_anon_3.__bindgen_anon_1 };
        (f.l2_len() as usize, f.l3_len() as usize)
    }

    /// Records the lengths of the L2 and L3 headers (`l2_len`, `l3_len`:
    /// 7 and 9 bits); false, nothing changed, if they do not fit. No
    /// offload is requested (`ol_flags` untouched), so a PMD sending this
    /// mbuf ignores them.
    #[inline]
    pub fn set_header_lens(&mut self, l2: usize, l3: usize) -> bool {
        if l2 >= 1 << 7 || l3 >= 1 << 9 {
            return false;
        }
        // SAFETY:
        // - as in `header_lens`: writing the bit-field view of a union of
        //   plain integers; `self` owns the mbuf uniquely.
        let f = unsafe { &mut self.raw_mut().__bindgen_anon_3.__bindgen_anon_1 };
        f.set_l2_len(l2 as u64);
        f.set_l3_len(l3 as u64);
        true
    }

    /// Free bytes before the data (first segment).
    #[inline]
    pub fn headroom(&self) -> usize {
        usize::from(self.raw().data_off)
    }

    /// Free bytes after the data (last segment).
    #[inline]
    pub fn tailroom(&self) -> usize {
        // SAFETY:
        // - valid mbuf owned by `self` (type invariant); only reads.
        usize::from(unsafe { sys::kp_rte_pktmbuf_tailroom(self.as_ptr()) })
    }

    /// Grows the packet by `n` bytes at its end and returns them, or `None`
    /// (nothing changed) if the tailroom is too small. The new bytes hold
    /// whatever the buffer held before.
    #[inline]
    pub fn append(&mut self, n: usize) -> Option<&mut [u8]> {
        let n16 = u16::try_from(n).ok()?;
        // SAFETY:
        // - valid mbuf owned exclusively by `self` (`&mut self`, type
        //   invariant); DPDK checks the tailroom itself.
        let p = unsafe { sys::kp_rte_pktmbuf_append(self.as_ptr(), n16) };
        let p = NonNull::new(p.cast::<u8>())?;
        // SAFETY:
        // - DPDK returned the start of `n` bytes inside the (last segment's)
        //   data buffer, now part of the packet: in bounds, mapped,
        //   initialised (see `data`), exclusively ours through `&mut self`.
        Some(unsafe { std::slice::from_raw_parts_mut(p.as_ptr(), n) })
    }

    /// Grows the packet by `n` bytes at its start and returns them, or
    /// `None` (nothing changed) if the headroom is too small.
    #[inline]
    pub fn prepend(&mut self, n: usize) -> Option<&mut [u8]> {
        let n16 = u16::try_from(n).ok()?;
        // SAFETY:
        // - valid mbuf owned exclusively by `self`; DPDK checks the headroom.
        let p = unsafe { sys::kp_rte_pktmbuf_prepend(self.as_ptr(), n16) };
        let p = NonNull::new(p.cast::<u8>())?;
        // SAFETY:
        // - DPDK returned the new start of the data; the first `n` bytes are
        //   inside the first segment's buffer: in bounds, mapped,
        //   initialised, exclusively ours through `&mut self`.
        Some(unsafe { std::slice::from_raw_parts_mut(p.as_ptr(), n) })
    }

    /// Removes `n` bytes from the start of the packet; false (nothing
    /// changed) if the first segment holds fewer.
    #[inline]
    pub fn adj(&mut self, n: usize) -> bool {
        let Ok(n16) = u16::try_from(n) else {
            return false;
        };
        // SAFETY:
        // - valid mbuf owned exclusively by `self`; DPDK checks the length.
        !unsafe { sys::kp_rte_pktmbuf_adj(self.as_ptr(), n16) }.is_null()
    }

    /// Removes `n` bytes from the end of the packet; false (nothing
    /// changed) if the last segment holds fewer.
    #[inline]
    pub fn trim(&mut self, n: usize) -> bool {
        let Ok(n16) = u16::try_from(n) else {
            return false;
        };
        // SAFETY:
        // - valid mbuf owned exclusively by `self`; DPDK checks the length.
        unsafe { sys::kp_rte_pktmbuf_trim(self.as_ptr(), n16) == 0 }
    }

    /// Sets the length of a single-segment packet to `n` bytes (growing
    /// into the tailroom or shrinking); false (nothing changed) if the
    /// packet is segmented or the buffer cannot hold `n` bytes.
    #[inline]
    pub fn set_len(&mut self, n: usize) -> bool {
        if self.is_segmented() {
            return false;
        }
        let max = self.len() + self.tailroom();
        let Ok(n16) = u16::try_from(n) else {
            return false;
        };
        if n > max {
            return false;
        }
        let m = self.raw_mut();
        m.data_len = n16;
        m.pkt_len = u32::from(n16);
        true
    }
}

impl Drop for Mbuf {
    #[inline]
    fn drop(&mut self) {
        // SAFETY:
        // - valid mbuf owned by `self` (type invariant), freed exactly once:
        //   `self` is going away.
        unsafe { sys::kp_rte_pktmbuf_free(self.as_ptr()) };
        live::mbufs_out(1);
    }
}

impl fmt::Debug for Mbuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Mbuf({:p}, {} bytes", self.0, self.len())?;
        if self.is_segmented() {
            write!(f, ", {} segs, {} total", self.nb_segs(), self.pkt_len())?;
        }
        f.write_str(")")
    }
}

/// Up to `N` owned mbufs in a fixed array: the unit of RX, TX and ring
/// transfers, with no allocation.
///
/// Transfers out ([`Port::tx_burst`](crate::Port::tx_burst),
/// [`Ring::enqueue_burst`](crate::Ring::enqueue_burst)) take from the front
/// and leave what was not taken in the burst, in order; transfers in
/// ([`Port::rx_burst`](crate::Port::rx_burst),
/// [`Ring::dequeue_burst`](crate::Ring::dequeue_burst),
/// [`Mempool::alloc_bulk`](crate::Mempool::alloc_bulk)) append. Whatever is
/// still in the burst when it is cleared or dropped is freed (in one
/// `rte_pktmbuf_free_bulk`): a burst never leaks.
pub struct MbufBurst<const N: usize> {
    /// `bufs[..len]` are initialised, owned mbufs.
    bufs: [MaybeUninit<Mbuf>; N],
    len: usize,
}

impl<const N: usize> MbufBurst<N> {
    /// An empty burst. `N` is at most 65535 (DPDK's burst functions count
    /// in `u16`); a larger `N` does not compile.
    pub const fn new() -> Self {
        const {
            assert!(
                N <= u16::MAX as usize,
                "MbufBurst holds at most 65535 mbufs"
            )
        };
        MbufBurst {
            bufs: [const { MaybeUninit::uninit() }; N],
            len: 0,
        }
    }

    /// Mbufs held.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// True if it holds none.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// True if it holds `N`.
    #[inline]
    pub fn is_full(&self) -> bool {
        self.len == N
    }

    /// `N`.
    #[inline]
    pub const fn capacity(&self) -> usize {
        N
    }

    /// How many more it can take.
    #[inline]
    pub fn spare(&self) -> usize {
        N - self.len
    }

    /// Appends `m`, or gives it back if the burst is full.
    #[inline]
    pub fn try_push(&mut self, m: Mbuf) -> Result<(), Mbuf> {
        if self.len == N {
            return Err(m);
        }
        self.bufs[self.len].write(m);
        self.len += 1;
        Ok(())
    }

    /// Appends `m`.
    ///
    /// # Panics
    ///
    /// If the burst is full (check [`is_full`](Self::is_full), or use
    /// [`try_push`](Self::try_push)).
    #[inline]
    pub fn push(&mut self, m: Mbuf) {
        if self.try_push(m).is_err() {
            panic!("MbufBurst::push on a full burst of {N}");
        }
    }

    /// Takes the last mbuf.
    #[inline]
    pub fn pop(&mut self) -> Option<Mbuf> {
        if self.len == 0 {
            return None;
        }
        self.len -= 1;
        // SAFETY:
        // - `bufs[len]` was initialised (it was below the old `len`) and is
        //   now outside `..len`, so it is read out exactly once.
        Some(unsafe { self.bufs[self.len].assume_init_read() })
    }

    /// The mbufs, in order.
    #[inline]
    pub fn as_slice(&self) -> &[Mbuf] {
        // SAFETY:
        // - `bufs[..len]` are initialised `Mbuf`s, and `MaybeUninit<Mbuf>`
        //   has the layout of `Mbuf`.
        unsafe { std::slice::from_raw_parts(self.bufs.as_ptr().cast::<Mbuf>(), self.len) }
    }

    /// The mbufs, in order, writable.
    #[inline]
    pub fn as_mut_slice(&mut self) -> &mut [Mbuf] {
        // SAFETY:
        // - as in `as_slice`, and `&mut self` makes the slice unique.
        unsafe { std::slice::from_raw_parts_mut(self.bufs.as_mut_ptr().cast::<Mbuf>(), self.len) }
    }

    /// Iterates over the mbufs by reference.
    #[inline]
    pub fn iter(&self) -> std::slice::Iter<'_, Mbuf> {
        self.as_slice().iter()
    }

    /// Iterates over the mbufs by mutable reference.
    #[inline]
    pub fn iter_mut(&mut self) -> std::slice::IterMut<'_, Mbuf> {
        self.as_mut_slice().iter_mut()
    }

    /// Takes every mbuf out, front to back; the burst is empty afterwards.
    /// Mbufs the iterator has not yielded when it is dropped are freed.
    #[inline]
    pub fn drain(&mut self) -> Drain<'_, N> {
        let end = self.len;
        // If the `Drain` is leaked, the mbufs leak but are never freed
        // twice.
        self.len = 0;
        Drain {
            burst: self,
            next: 0,
            end,
        }
    }

    /// Frees every mbuf held.
    #[inline]
    pub fn clear(&mut self) {
        let n = self.len;
        self.len = 0;
        free_bulk(self.bufs.as_mut_ptr(), n);
    }

    /// Pointer to the first slot, as DPDK's `struct rte_mbuf **`.
    #[inline]
    pub(crate) fn raw_front(&mut self) -> *mut *mut sys::rte_mbuf {
        // `MaybeUninit<Mbuf>` is `Mbuf` is `NonNull<rte_mbuf>` is
        // `*mut rte_mbuf`, layout-wise.
        self.bufs.as_mut_ptr().cast::<*mut sys::rte_mbuf>()
    }

    /// Pointer to the first free slot and the number of free slots.
    #[inline]
    pub(crate) fn raw_spare(&mut self) -> (*mut *mut sys::rte_mbuf, usize) {
        let len = self.len;
        let spare = N - len;
        (self.raw_front().wrapping_add(len), spare)
    }

    /// Records that DPDK wrote `n` owned mbufs into the first free slots.
    ///
    /// # Safety
    ///
    /// - `n <= self.spare()`;
    /// - slots `len..len + n` now hold valid mbufs that satisfy the
    ///   [`Mbuf`] invariants, owned by nothing else.
    #[inline]
    pub(crate) unsafe fn appended(&mut self, n: usize) {
        debug_assert!(n <= self.spare());
        self.len += n;
        live::mbufs_in(n);
    }

    /// Records that DPDK took ownership of the first `n` mbufs, and moves
    /// the rest to the front.
    ///
    /// # Safety
    ///
    /// - `n <= self.len()`;
    /// - the first `n` mbufs now belong to DPDK (a driver queue, a ring)
    ///   and must not be freed here.
    #[inline]
    pub(crate) unsafe fn taken_from_front(&mut self, n: usize) {
        debug_assert!(n <= self.len);
        if n == 0 {
            return;
        }
        let rest = self.len - n;
        let base = self.bufs.as_mut_ptr();
        // SAFETY:
        // - source `n..len` and destination `0..rest` are inside `bufs`;
        //   `copy` allows them to overlap;
        // - the moved-out slots `0..n` are forgotten (DPDK owns them) and
        //   slots `rest..len` become stale copies outside `..len`.
        unsafe { std::ptr::copy(base.wrapping_add(n), base, rest) };
        self.len = rest;
        live::mbufs_out(n);
    }
}

/// Frees `n` owned mbufs starting at `first` with `rte_pktmbuf_free_bulk`.
#[inline]
fn free_bulk(first: *mut MaybeUninit<Mbuf>, n: usize) {
    if n == 0 {
        return;
    }
    // SAFETY:
    // - the caller passes `n` initialised, owned mbufs that it has already
    //   forgotten (removed from its `..len`), so each is freed exactly once;
    // - `n <= N <= u16::MAX` (checked in `MbufBurst::new`): the cast is
    //   lossless.
    unsafe {
        sys::rte_pktmbuf_free_bulk(
            first.cast::<*mut sys::rte_mbuf>(),
            n as std::os::raw::c_uint,
        )
    };
    live::mbufs_out(n);
}

impl<const N: usize> Default for MbufBurst<N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<const N: usize> Drop for MbufBurst<N> {
    fn drop(&mut self) {
        self.clear();
    }
}

impl<const N: usize> fmt::Debug for MbufBurst<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MbufBurst({}/{N})", self.len)
    }
}

impl<'a, const N: usize> IntoIterator for &'a MbufBurst<N> {
    type Item = &'a Mbuf;
    type IntoIter = std::slice::Iter<'a, Mbuf>;
    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

/// The iterator of [`MbufBurst::drain`].
pub struct Drain<'a, const N: usize> {
    burst: &'a mut MbufBurst<N>,
    /// `burst.bufs[next..end]` are owned mbufs not yet yielded.
    next: usize,
    end: usize,
}

impl<const N: usize> Iterator for Drain<'_, N> {
    type Item = Mbuf;

    #[inline]
    fn next(&mut self) -> Option<Mbuf> {
        if self.next == self.end {
            return None;
        }
        let i = self.next;
        self.next += 1;
        // SAFETY:
        // - `bufs[i]` is an initialised, owned mbuf (`i < end`), read out
        //   exactly once since `next` moved past it.
        Some(unsafe { self.burst.bufs[i].assume_init_read() })
    }

    #[inline]
    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.end - self.next;
        (n, Some(n))
    }
}

impl<const N: usize> ExactSizeIterator for Drain<'_, N> {}

impl<const N: usize> Drop for Drain<'_, N> {
    fn drop(&mut self) {
        let rest = self.end - self.next;
        let first = self.burst.bufs.as_mut_ptr().wrapping_add(self.next);
        self.next = self.end;
        free_bulk(first, rest);
    }
}

impl<const N: usize> fmt::Debug for Drain<'_, N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Drain({} left)", self.end - self.next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_burst_needs_no_eal() {
        let mut b = MbufBurst::<4>::new();
        assert!(b.is_empty());
        assert_eq!(b.capacity(), 4);
        assert_eq!(b.spare(), 4);
        assert!(b.pop().is_none());
        assert_eq!(b.drain().count(), 0);
        b.clear();
        assert_eq!(format!("{b:?}"), "MbufBurst(0/4)");
    }

    #[test]
    fn layout_matches_a_c_array_of_mbuf_pointers() {
        assert_eq!(
            std::mem::size_of::<Mbuf>(),
            std::mem::size_of::<*mut sys::rte_mbuf>()
        );
        assert_eq!(
            std::mem::size_of::<MaybeUninit<Mbuf>>(),
            std::mem::size_of::<*mut sys::rte_mbuf>()
        );
        assert_eq!(
            std::mem::size_of::<Option<Mbuf>>(),
            std::mem::size_of::<*mut sys::rte_mbuf>()
        );
    }
}
