//! Rings of mbufs: how packets move between the if-manager and the
//! inference functions (and between threads of one process).

use std::cell::Cell;
use std::ffi::CStr;
use std::fmt;
use std::marker::PhantomData;
use std::os::raw::c_void;
use std::ptr::NonNull;

use dpdk_sys as sys;

use crate::error::{c_name, last_error};
use crate::live::{self, EalClaim, Kind};
use crate::{DpdkError, Mbuf, MbufBurst, SocketId};

/// How a ring is shared, fixed when it is created.
///
/// A single-producer ring must only ever be enqueued on by one thread at a
/// time, in all processes together; likewise a single-consumer ring and
/// dequeues. Within one process this crate enforces it (one handle, not
/// `Sync`); across processes it is the deployment's protocol.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RingFlags {
    /// `RING_F_SP_ENQ`: one producer (cheaper enqueue).
    pub single_producer: bool,
    /// `RING_F_SC_DEQ`: one consumer (cheaper dequeue).
    pub single_consumer: bool,
}

impl RingFlags {
    fn bits(self) -> u32 {
        let mut f = 0;
        if self.single_producer {
            f |= sys::RING_F_SP_ENQ;
        }
        if self.single_consumer {
            f |= sys::RING_F_SC_DEQ;
        }
        f
    }

    fn from_bits(bits: i32) -> Self {
        let bits = bits as u32;
        RingFlags {
            single_producer: bits & sys::RING_F_SP_ENQ != 0,
            single_consumer: bits & sys::RING_F_SC_DEQ != 0,
        }
    }

    fn any_single(self) -> bool {
        self.single_producer || self.single_consumer
    }
}

/// The operations, on a pointer that the wrappers vouch for.
#[derive(Clone, Copy)]
struct RawRing(NonNull<sys::rte_ring>);

impl RawRing {
    #[inline]
    fn ptr(self) -> *mut sys::rte_ring {
        self.0.as_ptr()
    }

    fn desc(&self) -> &sys::rte_ring {
        // SAFETY:
        // - the wrappers guarantee a live ring for as long as `self` is
        //   borrowed; only fields fixed at creation are read.
        unsafe { self.0.as_ref() }
    }

    #[inline]
    fn enqueue_burst<const N: usize>(self, burst: &mut MbufBurst<N>) -> usize {
        let n = burst.len();
        if n == 0 {
            return 0;
        }
        let objs = burst.raw_front().cast::<*mut c_void>().cast_const();
        // SAFETY:
        // - a live ring of mbufs whose producer discipline the wrapper
        //   upholds; `objs` holds `n` mbuf pointers (`n <= u16::MAX`).
        let done = unsafe {
            sys::kp_rte_ring_enqueue_burst(self.ptr(), objs, n as u32, std::ptr::null_mut())
        };
        let done = done as usize;
        // SAFETY:
        // - `done <= n` mbufs from the front now belong to the ring.
        unsafe { burst.taken_from_front(done) };
        done
    }

    #[inline]
    fn dequeue_burst<const N: usize>(self, burst: &mut MbufBurst<N>) -> usize {
        let (slots, spare) = burst.raw_spare();
        if spare == 0 {
            return 0;
        }
        // SAFETY:
        // - a live ring of mbufs whose consumer discipline the wrapper
        //   upholds; `slots` has room for `spare <= u16::MAX` pointers.
        let got = unsafe {
            sys::kp_rte_ring_dequeue_burst(
                self.ptr(),
                slots.cast::<*mut c_void>(),
                spare as u32,
                std::ptr::null_mut(),
            )
        };
        let got = got as usize;
        // SAFETY:
        // - the ring handed over `got <= spare` mbufs it owned; everything
        //   on a ring of this crate is an owned, direct mbuf.
        unsafe { burst.appended(got) };
        got
    }

    /// Dequeues and frees everything queued; returns how many.
    fn free_queued(self) -> u64 {
        let mut burst = MbufBurst::<64>::new();
        let mut n = 0;
        loop {
            let got = self.dequeue_burst(&mut burst);
            if got == 0 {
                return n;
            }
            n += got as u64;
            burst.clear(); // frees them
        }
    }

    #[inline]
    fn enqueue(self, m: Mbuf) -> Result<(), Mbuf> {
        let obj = m.as_ptr().cast::<c_void>();
        let objs = [obj];
        // SAFETY:
        // - as in `enqueue_burst`, with one pointer.
        let done = unsafe {
            sys::kp_rte_ring_enqueue_burst(self.ptr(), objs.as_ptr(), 1, std::ptr::null_mut())
        };
        if done == 1 {
            // The ring owns it now.
            let _ = m.into_raw();
            Ok(())
        } else {
            Err(m)
        }
    }

    #[inline]
    fn dequeue(self) -> Option<Mbuf> {
        let mut obj: *mut c_void = std::ptr::null_mut();
        // SAFETY:
        // - as in `dequeue_burst`, with room for one pointer.
        let got = unsafe {
            sys::kp_rte_ring_dequeue_burst(self.ptr(), &mut obj, 1, std::ptr::null_mut())
        };
        if got != 1 {
            return None;
        }
        let m = NonNull::new(obj.cast::<sys::rte_mbuf>())?;
        // SAFETY:
        // - the ring handed over an owned, direct mbuf.
        Some(unsafe { Mbuf::from_raw(m) })
    }

    #[inline]
    fn count(self) -> usize {
        // SAFETY:
        // - a live ring; reads its head/tail indexes.
        unsafe { sys::kp_rte_ring_count(self.ptr()) as usize }
    }

    #[inline]
    fn free_count(self) -> usize {
        // SAFETY:
        // - a live ring; reads its head/tail indexes.
        unsafe { sys::kp_rte_ring_free_count(self.ptr()) as usize }
    }

    fn capacity(self) -> usize {
        // SAFETY:
        // - a live ring; reads a field fixed at creation.
        unsafe { sys::kp_rte_ring_get_capacity(self.ptr()) as usize }
    }

    fn flags(&self) -> RingFlags {
        RingFlags::from_bits(self.desc().flags)
    }

    fn name(&self) -> String {
        let raw = &self.desc().name;
        // SAFETY:
        // - DPDK stores the name NUL-terminated within the array.
        unsafe { CStr::from_ptr(raw.as_ptr()) }
            .to_string_lossy()
            .into_owned()
    }
}

/// A ring of mbufs (`struct rte_ring`) in DPDK's shared memory.
///
/// [`create`](Ring::create) makes one (this process owns it: the handle
/// frees it on drop, first freeing any mbufs still queued);
/// [`lookup`](Ring::lookup) finds one made by another process (or earlier
/// by this one). Everything on a ring handled by this type must be an owned
/// mbuf: every ring kneepoint names carries mbufs, and `lookup` cannot check
/// that of a ring made by someone else.
///
/// Transfers move ownership: an enqueued mbuf belongs to the ring, a
/// dequeued one to the caller. Burst transfers use the ring's own
/// producer/consumer mode ([`RingFlags`]).
///
/// The handle is `Send` but not `Sync`: one thread at a time uses it. A
/// ring with a single producer or consumer can have only one handle per
/// process ([`DpdkError::Busy`] otherwise). To reach a ring from another
/// thread without moving the handle (e.g. a route table of `AtomicPtr`s
/// read by the RX loop), pass [`as_ptr`](Ring::as_ptr) and use
/// [`RingRef::from_raw`] under its contract.
pub struct Ring {
    raw: RawRing,
    name: String,
    _claim: EalClaim,
    _not_sync: PhantomData<Cell<()>>,
}

// SAFETY:
// - the handle is a pointer into shared memory, valid from any thread
//   while the EAL runs (claim held) and the ring lives (freed only by its
//   last handle here);
// - moving it moves the right to produce/consume with it; it is not
//   `Sync`, so only one thread uses it at a time.
unsafe impl Send for Ring {}

impl Ring {
    /// Creates a ring called `name` (at most 28 bytes) with `count` slots
    /// (a power of two; it holds `count - 1` mbufs) on `socket`.
    pub fn create(
        name: &str,
        count: u32,
        socket: SocketId,
        flags: RingFlags,
    ) -> Result<Ring, DpdkError> {
        const OP: &str = "rte_ring_create";
        let cname = c_name(OP, name)?;
        let claim = EalClaim::new(OP)?;
        // SAFETY:
        // - the EAL runs (claim held); `cname` is a valid C string that
        //   DPDK copies; DPDK validates `count` and the flags.
        let ptr = unsafe { sys::rte_ring_create(cname.as_ptr(), count, socket.0, flags.bits()) };
        let ptr = NonNull::new(ptr).ok_or_else(|| last_error(OP))?;
        let raw = RawRing(ptr);
        if live::acquire(Kind::Ring, ptr.as_ptr() as usize, true, flags.any_single()).is_err() {
            // Cannot happen: a new ring has no handle yet.
            // SAFETY:
            // - we just created it and nothing else knows of it yet.
            unsafe { sys::rte_ring_free(ptr.as_ptr()) };
            return Err(DpdkError::Busy {
                op: OP,
                name: name.into(),
            });
        }
        Ok(Ring {
            raw,
            name: name.to_owned(),
            _claim: claim,
            _not_sync: PhantomData,
        })
    }

    /// Finds the ring called `name`. It must carry mbufs (see the type's
    /// documentation).
    pub fn lookup(name: &str) -> Result<Ring, DpdkError> {
        const OP: &str = "rte_ring_lookup";
        let cname = c_name(OP, name)?;
        let claim = EalClaim::new(OP)?;
        // SAFETY:
        // - the EAL runs (claim held); `cname` is a valid C string.
        let ptr = unsafe { sys::rte_ring_lookup(cname.as_ptr()) };
        let Some(ptr) = NonNull::new(ptr) else {
            return Err(DpdkError::NotFound {
                op: OP,
                name: name.to_owned(),
            });
        };
        let raw = RawRing(ptr);
        let exclusive = raw.flags().any_single();
        if live::acquire(Kind::Ring, ptr.as_ptr() as usize, false, exclusive).is_err() {
            return Err(DpdkError::Busy {
                op: OP,
                name: name.into(),
            });
        }
        Ok(Ring {
            raw,
            name: name.to_owned(),
            _claim: claim,
            _not_sync: PhantomData,
        })
    }

    /// Enqueues mbufs from the front of `burst` until the ring is full;
    /// returns how many. Those enqueued belong to the ring; the rest stay
    /// in `burst`, in order.
    #[inline]
    pub fn enqueue_burst<const N: usize>(&self, burst: &mut MbufBurst<N>) -> usize {
        self.raw.enqueue_burst(burst)
    }

    /// Enqueues one mbuf, or gives it back if the ring is full.
    #[inline]
    pub fn enqueue(&self, m: Mbuf) -> Result<(), Mbuf> {
        self.raw.enqueue(m)
    }

    /// Dequeues up to `burst.spare()` mbufs, appending them to `burst`;
    /// returns how many.
    #[inline]
    pub fn dequeue_burst<const N: usize>(&self, burst: &mut MbufBurst<N>) -> usize {
        self.raw.dequeue_burst(burst)
    }

    /// Dequeues and frees every mbuf queued; returns how many. For the
    /// ring's consumer, or for anyone once its consumer is gone (a dead
    /// process's ring, a route being removed).
    pub fn free_queued(&self) -> u64 {
        self.raw.free_queued()
    }

    /// Dequeues one mbuf.
    #[inline]
    pub fn dequeue(&self) -> Option<Mbuf> {
        self.raw.dequeue()
    }

    /// Mbufs queued now.
    #[inline]
    pub fn count(&self) -> usize {
        self.raw.count()
    }

    /// Free slots now.
    #[inline]
    pub fn free_count(&self) -> usize {
        self.raw.free_count()
    }

    /// How many mbufs it can hold.
    pub fn capacity(&self) -> usize {
        self.raw.capacity()
    }

    /// Its producer/consumer mode.
    pub fn flags(&self) -> RingFlags {
        self.raw.flags()
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The raw ring, e.g. for a [`RingRef`] on another thread.
    pub fn as_ptr(&self) -> *mut sys::rte_ring {
        self.raw.ptr()
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        if !live::release(Kind::Ring, self.raw.ptr() as usize) {
            return;
        }
        // The creator's last handle: free what is queued, then the ring.
        self.raw.free_queued();
        // SAFETY:
        // - this process created the ring and this was its last handle
        //   here; it is empty; the EAL runs (claim held until after this
        //   body). Other processes must have let go of it (type docs).
        unsafe { sys::rte_ring_free(self.raw.ptr()) };
    }
}

impl fmt::Debug for Ring {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Ring({:?}, {}/{})",
            self.name,
            self.count(),
            self.capacity()
        )
    }
}

/// The enqueue side of a multi-producer ring, shared by any number of
/// threads without a lock: DPDK's multi-producer enqueue is thread-safe,
/// and this handle can do nothing else (no dequeue), so it is `Sync`.
///
/// Made from a [`Ring`] by [`Ring::into_producer`]; dropping it drops that
/// handle.
pub struct RingProducer {
    ring: Ring,
}

// SAFETY:
// - the only operations through `&RingProducer` are enqueues (and reads of
//   the ring's counts), and the ring is multi-producer (checked when made):
//   DPDK's MP enqueue is safe from any number of threads at once;
// - the inner `Ring` is `Send`, and nothing hands it out by reference.
unsafe impl Sync for RingProducer {}

impl Ring {
    /// This handle as a [`RingProducer`] for several threads; given back if
    /// the ring is single-producer.
    pub fn into_producer(self) -> Result<RingProducer, Ring> {
        if self.flags().single_producer {
            return Err(self);
        }
        Ok(RingProducer { ring: self })
    }
}

impl RingProducer {
    /// See [`Ring::enqueue_burst`].
    #[inline]
    pub fn enqueue_burst<const N: usize>(&self, burst: &mut MbufBurst<N>) -> usize {
        self.ring.raw.enqueue_burst(burst)
    }

    /// See [`Ring::enqueue`].
    #[inline]
    pub fn enqueue(&self, m: Mbuf) -> Result<(), Mbuf> {
        self.ring.raw.enqueue(m)
    }

    /// See [`Ring::free_count`].
    pub fn free_count(&self) -> usize {
        self.ring.free_count()
    }

    /// See [`Ring::name`].
    pub fn name(&self) -> &str {
        self.ring.name()
    }
}

impl fmt::Debug for RingProducer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RingProducer({:?})", self.ring)
    }
}

/// A borrowed view of a ring of mbufs, made from a raw pointer: for
/// reaching a [`Ring`] from a thread other than the one holding it.
///
/// It has the same operations as `Ring` and neither owns nor frees the
/// ring. It is neither `Send` nor `Sync`: make one per thread, per use.
pub struct RingRef<'a> {
    raw: RawRing,
    _borrow: PhantomData<&'a sys::rte_ring>,
    _not_sync: PhantomData<Cell<()>>,
}

impl RingRef<'_> {
    /// A view of the ring at `ptr`.
    ///
    /// # Safety
    ///
    /// - `ptr` points to a ring (from [`Ring::as_ptr`], or DPDK) that stays
    ///   alive — its `Ring` not dropped, the EAL not cleaned up — for the
    ///   whole lifetime of the view;
    /// - everything on the ring is an owned mbuf, and whatever is enqueued
    ///   through the view is owned by the ring from then on;
    /// - the ring's modes are respected across all threads and processes:
    ///   on a single-producer ring no other thread enqueues while this view
    ///   may, on a single-consumer ring no other thread dequeues while this
    ///   view may (the holder of the `Ring` included).
    pub unsafe fn from_raw(ptr: NonNull<sys::rte_ring>) -> Self {
        RingRef {
            raw: RawRing(ptr),
            _borrow: PhantomData,
            _not_sync: PhantomData,
        }
    }

    /// See [`Ring::enqueue_burst`].
    #[inline]
    pub fn enqueue_burst<const N: usize>(&self, burst: &mut MbufBurst<N>) -> usize {
        self.raw.enqueue_burst(burst)
    }

    /// See [`Ring::enqueue`].
    #[inline]
    pub fn enqueue(&self, m: Mbuf) -> Result<(), Mbuf> {
        self.raw.enqueue(m)
    }

    /// See [`Ring::dequeue_burst`].
    #[inline]
    pub fn dequeue_burst<const N: usize>(&self, burst: &mut MbufBurst<N>) -> usize {
        self.raw.dequeue_burst(burst)
    }

    /// See [`Ring::dequeue`].
    #[inline]
    pub fn dequeue(&self) -> Option<Mbuf> {
        self.raw.dequeue()
    }

    /// Mbufs queued now.
    #[inline]
    pub fn count(&self) -> usize {
        self.raw.count()
    }

    /// Free slots now.
    #[inline]
    pub fn free_count(&self) -> usize {
        self.raw.free_count()
    }

    /// How many mbufs it can hold.
    pub fn capacity(&self) -> usize {
        self.raw.capacity()
    }

    /// Its name, read from DPDK's descriptor.
    pub fn name(&self) -> String {
        self.raw.name()
    }
}

impl fmt::Debug for RingRef<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RingRef({:p})", self.raw.0)
    }
}
