//! Packet mempools: where every mbuf comes from.

use std::ffi::CStr;
use std::fmt;
use std::ptr::NonNull;

use dpdk_sys as sys;

use crate::error::{c_name, last_error};
use crate::live::{self, EalClaim, Kind};
use crate::{DpdkError, Mbuf, MbufBurst, SocketId};

/// A packet mbuf pool (`struct rte_mempool` made by
/// `rte_pktmbuf_pool_create`), shared by every process of the DPDK
/// instance.
///
/// [`create_pktmbuf`](Mempool::create_pktmbuf) makes one (this process owns
/// it); [`lookup`](Mempool::lookup) finds one made by another process or
/// elsewhere in this one. Clones are further handles to the same pool. A
/// pool created by this process is freed (`rte_mempool_free`) when its last
/// handle in this process goes — unless mbufs of it are still out (in
/// `Mbuf`s, rings, driver queues or other processes), in which case it is
/// left in place rather than pulled from under them (the EAL's cleanup
/// releases the memory). Other processes must have stopped using a pool
/// before its creator lets go of it; nothing can check that.
///
/// Allocation and free are safe from any thread: packet pools use DPDK's
/// default multi-producer/multi-consumer ring ops, and a thread without an
/// lcore id skips the per-lcore cache.
pub struct Mempool {
    ptr: NonNull<sys::rte_mempool>,
    name: String,
    _claim: EalClaim,
}

// SAFETY:
// - the handle is a pointer into DPDK's shared memory, valid from any
//   thread of the process while the EAL runs (which the claim guarantees);
// - all the operations it exposes are thread-safe in DPDK (MP/MC pool,
//   atomic counters).
unsafe impl Send for Mempool {}
// SAFETY:
// - as for `Send`: every `&self` operation is thread-safe in DPDK.
unsafe impl Sync for Mempool {}

impl Mempool {
    /// Creates a packet mbuf pool of `n` mbufs (`2^q - 1` uses memory
    /// best) with a per-lcore cache of `cache_size` (at most 512, and at
    /// most `n / 1.5`) and `data_room` bytes of buffer per mbuf, headroom
    /// (`RTE_PKTMBUF_HEADROOM`, 128) included. Names are at most 25 bytes.
    pub fn create_pktmbuf(
        name: &str,
        n: u32,
        cache_size: u32,
        data_room: u16,
        socket: SocketId,
    ) -> Result<Mempool, DpdkError> {
        const OP: &str = "rte_pktmbuf_pool_create";
        let cname = c_name(OP, name)?;
        let claim = EalClaim::new(OP)?;
        // SAFETY:
        // - the EAL runs (claim held); `cname` is a valid C string that
        //   DPDK copies; the numeric arguments are checked by DPDK.
        let ptr = unsafe {
            sys::rte_pktmbuf_pool_create(cname.as_ptr(), n, cache_size, 0, data_room, socket.0)
        };
        let ptr = NonNull::new(ptr).ok_or_else(|| last_error(OP))?;
        Ok(Self::register(ptr, name, claim, true))
    }

    /// Finds the packet mbuf pool called `name`.
    pub fn lookup(name: &str) -> Result<Mempool, DpdkError> {
        const OP: &str = "rte_mempool_lookup";
        let cname = c_name(OP, name)?;
        let claim = EalClaim::new(OP)?;
        // SAFETY:
        // - the EAL runs (claim held); `cname` is a valid C string.
        let ptr = unsafe { sys::rte_mempool_lookup(cname.as_ptr()) };
        let Some(ptr) = NonNull::new(ptr) else {
            return Err(DpdkError::NotFound {
                op: OP,
                name: name.to_owned(),
            });
        };
        // SAFETY:
        // - `ptr` is a live mempool descriptor in shared memory (lookup
        //   succeeded and the EAL runs); only its immutable fields are read.
        let mp = unsafe { ptr.as_ref() };
        // A packet pool carries `rte_pktmbuf_pool_private` and holds mbufs;
        // `rte_pktmbuf_alloc` on any other pool would be undefined.
        if (mp.private_data_size as usize) < std::mem::size_of::<sys::rte_pktmbuf_pool_private>()
            || (mp.elt_size as usize) < std::mem::size_of::<sys::rte_mbuf>()
        {
            return Err(DpdkError::InvalidArgument {
                op: OP,
                reason: format!("mempool {name:?} is not a packet mbuf pool"),
            });
        }
        // Its operations are an index into this process's table of mempool
        // ops, which the driver plugins fill as they load: a process that
        // did not load its creator's plugins (`-d`) would call through a
        // null pointer at its first buffer.
        // SAFETY: the table is written only by the constructors of DPDK's
        // libraries and plugins, which ran at load time and `rte_eal_init`
        // (the EAL runs: claim held); nothing writes it now.
        let registered = unsafe { sys::rte_mempool_ops_table.num_ops };
        if mp.ops_index < 0 || mp.ops_index as u32 >= registered {
            return Err(DpdkError::InvalidArgument {
                op: OP,
                reason: format!(
                    "mempool {name:?} uses mempool ops #{} but this process registered {registered}: \
                     load the DPDK driver plugins its creator loaded (the same -d arguments)",
                    mp.ops_index
                ),
            });
        }
        Ok(Self::register(ptr, name, claim, false))
    }

    fn register(
        ptr: NonNull<sys::rte_mempool>,
        name: &str,
        claim: EalClaim,
        created: bool,
    ) -> Mempool {
        live::acquire(Kind::Mempool, ptr.as_ptr() as usize, created, false)
            .expect("mempools are never exclusive");
        Mempool {
            ptr,
            name: name.to_owned(),
            _claim: claim,
        }
    }

    #[inline]
    fn raw(&self) -> &sys::rte_mempool {
        // SAFETY:
        // - the descriptor lives in shared memory as long as this handle
        //   (the creator frees it only after its last handle; the claim
        //   keeps the EAL up); only fields fixed at creation are read.
        unsafe { self.ptr.as_ref() }
    }

    /// One mbuf (reset, empty), or `None` if the pool is exhausted.
    #[inline]
    pub fn alloc(&self) -> Option<Mbuf> {
        // SAFETY:
        // - a live packet pool (handle invariant); thread-safe in DPDK.
        let m = unsafe { sys::kp_rte_pktmbuf_alloc(self.ptr.as_ptr()) };
        let m = NonNull::new(m)?;
        // SAFETY:
        // - a freshly allocated, direct mbuf that nothing else owns.
        Some(unsafe { Mbuf::from_raw(m) })
    }

    /// Appends `n` fresh mbufs to `burst`, all or none: false (nothing
    /// changed) if the pool has fewer than `n` or the burst has fewer than
    /// `n` free slots.
    #[inline]
    #[must_use]
    pub fn alloc_bulk<const N: usize>(&self, burst: &mut MbufBurst<N>, n: usize) -> bool {
        let (slots, spare) = burst.raw_spare();
        if n > spare {
            return false;
        }
        // SAFETY:
        // - a live packet pool; `slots` has room for `n <= spare` pointers;
        //   `n <= N <= u16::MAX` so the cast is lossless.
        let ret = unsafe { sys::kp_rte_pktmbuf_alloc_bulk(self.ptr.as_ptr(), slots, n as u32) };
        if ret != 0 {
            return false;
        }
        // SAFETY:
        // - DPDK wrote `n` freshly allocated, direct mbufs into the first
        //   `n` free slots.
        unsafe { burst.appended(n) };
        true
    }

    /// Mbufs in the pool in all (its size).
    #[inline]
    pub fn size(&self) -> u32 {
        self.raw().size
    }

    /// Mbufs available now (in the pool and in per-lcore caches).
    #[inline]
    pub fn avail_count(&self) -> u32 {
        // SAFETY:
        // - a live mempool; DPDK reads its counters.
        unsafe { sys::rte_mempool_avail_count(self.ptr.as_ptr()) }
    }

    /// Mbufs allocated now, by any process (`size - avail_count`).
    #[inline]
    pub fn in_use_count(&self) -> u32 {
        // SAFETY:
        // - a live mempool; DPDK reads its counters.
        unsafe { sys::rte_mempool_in_use_count(self.ptr.as_ptr()) }
    }

    /// NUMA socket of its memory.
    pub fn socket_id(&self) -> SocketId {
        SocketId(self.raw().socket_id)
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The name stored in DPDK's descriptor (same as [`name`](Self::name)).
    pub fn dpdk_name(&self) -> String {
        let raw = &self.raw().name;
        // SAFETY:
        // - DPDK stores the name NUL-terminated within the array.
        unsafe { CStr::from_ptr(raw.as_ptr()) }
            .to_string_lossy()
            .into_owned()
    }

    /// The raw pool, for DPDK calls this crate does not wrap.
    pub fn as_ptr(&self) -> *mut sys::rte_mempool {
        self.ptr.as_ptr()
    }
}

impl Clone for Mempool {
    fn clone(&self) -> Self {
        live::acquire(Kind::Mempool, self.ptr.as_ptr() as usize, false, false)
            .expect("mempools are never exclusive");
        Mempool {
            ptr: self.ptr,
            name: self.name.clone(),
            _claim: self._claim.clone(),
        }
    }
}

impl Drop for Mempool {
    fn drop(&mut self) {
        if !live::release(Kind::Mempool, self.ptr.as_ptr() as usize) {
            return;
        }
        if self.in_use_count() != 0 {
            // Mbufs of it are still out: freeing would leave them dangling.
            return;
        }
        // SAFETY:
        // - this process created the pool and this was its last handle
        //   here; no mbuf of it is out; the EAL still runs (claim held
        //   until after this body).
        unsafe { sys::rte_mempool_free(self.ptr.as_ptr()) };
    }
}

impl fmt::Debug for Mempool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Mempool({:?}, {} mbufs)", self.name, self.size())
    }
}
