//! Memzones: named, contiguous blocks of DPDK's shared hugepage memory
//! (e.g. the input pool that inference functions reassemble into).

use std::fmt;
use std::ops::BitOr;
use std::ptr::NonNull;
use std::sync::atomic::AtomicU64;

use dpdk_sys as sys;

use crate::error::{c_name, last_error};
use crate::live::{self, EalClaim, Kind};
use crate::{DpdkError, SocketId};

/// `RTE_MEMZONE_*` flags for [`Memzone::reserve`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemzoneFlags(u32);

impl MemzoneFlags {
    /// No constraint.
    pub const NONE: MemzoneFlags = MemzoneFlags(0);
    /// Only from 2 MiB pages.
    pub const PAGE_2MB: MemzoneFlags = MemzoneFlags(sys::RTE_MEMZONE_2MB);
    /// Only from 1 GiB pages.
    pub const PAGE_1GB: MemzoneFlags = MemzoneFlags(sys::RTE_MEMZONE_1GB);
    /// Page sizes above are a preference, not a requirement.
    pub const SIZE_HINT_ONLY: MemzoneFlags = MemzoneFlags(sys::RTE_MEMZONE_SIZE_HINT_ONLY);
    /// Contiguous in IO-virtual address space (for DMA by a device).
    pub const IOVA_CONTIG: MemzoneFlags = MemzoneFlags(sys::RTE_MEMZONE_IOVA_CONTIG);

    /// The raw bits.
    pub const fn bits(self) -> u32 {
        self.0
    }
}

impl BitOr for MemzoneFlags {
    type Output = MemzoneFlags;
    fn bitor(self, rhs: Self) -> Self {
        MemzoneFlags(self.0 | rhs.0)
    }
}

/// A memzone (`struct rte_memzone`): `len` bytes of hugepage memory, mapped
/// at the same address in every process of the DPDK instance.
///
/// [`reserve`](Memzone::reserve) makes one (freed when this process's last
/// handle to it goes); [`lookup`](Memzone::lookup) finds one. The bytes are
/// shared with other processes, which Rust cannot see: reading and writing
/// them goes through raw pointers or the `unsafe` slice accessors, under
/// the caller's own protocol.
pub struct Memzone {
    ptr: NonNull<sys::rte_memzone>,
    name: String,
    _claim: EalClaim,
}

// SAFETY:
// - the handle is a pointer to an immutable descriptor in shared memory,
//   valid from any thread while the EAL runs (claim held) and the zone
//   lives (freed only by this process's last handle);
// - access to the zone's bytes is `unsafe` and left to the caller.
unsafe impl Send for Memzone {}
// SAFETY:
// - as for `Send`; `&self` only reads the immutable descriptor.
unsafe impl Sync for Memzone {}

impl Memzone {
    /// Reserves `len` bytes called `name` (at most 31 bytes) on `socket`,
    /// aligned to `align` (a power of two; DPDK raises it to a cache line).
    pub fn reserve(
        name: &str,
        len: usize,
        socket: SocketId,
        flags: MemzoneFlags,
        align: u32,
    ) -> Result<Memzone, DpdkError> {
        const OP: &str = "rte_memzone_reserve_aligned";
        let cname = c_name(OP, name)?;
        let claim = EalClaim::new(OP)?;
        // SAFETY:
        // - the EAL runs (claim held); `cname` is a valid C string that
        //   DPDK copies; DPDK validates length, flags and alignment.
        let ptr = unsafe {
            sys::rte_memzone_reserve_aligned(cname.as_ptr(), len, socket.0, flags.0, align)
        };
        let ptr = NonNull::new(ptr.cast_mut()).ok_or_else(|| last_error(OP))?;
        Ok(Self::register(ptr, name, claim, true))
    }

    /// Finds the memzone called `name`.
    pub fn lookup(name: &str) -> Result<Memzone, DpdkError> {
        const OP: &str = "rte_memzone_lookup";
        let cname = c_name(OP, name)?;
        let claim = EalClaim::new(OP)?;
        // SAFETY:
        // - the EAL runs (claim held); `cname` is a valid C string.
        let ptr = unsafe { sys::rte_memzone_lookup(cname.as_ptr()) };
        let ptr = NonNull::new(ptr.cast_mut()).ok_or_else(|| DpdkError::NotFound {
            op: OP,
            name: name.to_owned(),
        })?;
        Ok(Self::register(ptr, name, claim, false))
    }

    fn register(
        ptr: NonNull<sys::rte_memzone>,
        name: &str,
        claim: EalClaim,
        created: bool,
    ) -> Memzone {
        live::acquire(Kind::Memzone, ptr.as_ptr() as usize, created, false)
            .expect("memzones are never exclusive");
        Memzone {
            ptr,
            name: name.to_owned(),
            _claim: claim,
        }
    }

    fn desc(&self) -> &sys::rte_memzone {
        // SAFETY:
        // - the descriptor lives as long as this handle (see the type's
        //   `Send` reasoning) and is not modified after reservation.
        unsafe { self.ptr.as_ref() }
    }

    /// Start of the zone's bytes.
    pub fn as_ptr(&self) -> *mut u8 {
        // A copy: the descriptor is packed, so no reference to its fields.
        let anon = self.desc().__bindgen_anon_1;
        // SAFETY:
        // - both union members are 64 bits wide and DPDK always sets
        //   `addr`; reading it as a pointer is what DPDK does.
        unsafe { anon.addr }.cast::<u8>()
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.desc().len
    }

    /// True if it is zero bytes long.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// IO-virtual address of its start (what a device would DMA to).
    pub fn iova(&self) -> u64 {
        self.desc().iova
    }

    /// Size of the hugepages under it.
    pub fn hugepage_size(&self) -> u64 {
        self.desc().hugepage_sz
    }

    /// NUMA socket of its memory.
    pub fn socket_id(&self) -> SocketId {
        SocketId(self.desc().socket_id)
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The zone's bytes.
    ///
    /// # Safety
    ///
    /// For the lifetime of the slice, nothing — no thread of this process,
    /// no other process, no device — writes to the zone.
    pub unsafe fn as_slice(&self) -> &[u8] {
        // SAFETY:
        // - `as_ptr() .. + len()` is the mapped zone, alive while `self`
        //   is (handle invariant); hugepage bytes are initialised;
        // - the caller guarantees there is no concurrent writer.
        unsafe { std::slice::from_raw_parts(self.as_ptr(), self.len()) }
    }

    /// The zone's bytes, writable.
    ///
    /// # Safety
    ///
    /// For the lifetime of the slice, nothing else — no thread of this
    /// process (including through another handle to the same zone), no
    /// other process, no device — reads or writes the zone.
    #[allow(clippy::mut_from_ref)] // the exclusivity is the caller's contract
    pub unsafe fn as_mut_slice(&self) -> &mut [u8] {
        // SAFETY:
        // - as in `as_slice`; the caller guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.as_ptr(), self.len()) }
    }
}

impl Memzone {
    /// The zone's bytes as 64-bit atomic words (the first `len / 8`): the
    /// safe way to share state with other processes through a zone, each
    /// word read and written with the ordering the protocol needs.
    pub fn as_atomic_u64s(&self) -> &[AtomicU64] {
        // SAFETY:
        // - the zone is mapped and initialised for `len()` bytes while
        //   `self` lives (handle invariant), at an address aligned to a
        //   cache line (DPDK's minimum memzone alignment), so to 8 bytes;
        // - `AtomicU64` has the size and alignment of `u64` and every bit
        //   pattern is a valid value; all access through the slice is
        //   atomic, so sharing it with other threads and processes (which
        //   Rust cannot see) is no data race as long as they use atomics
        //   too, which is the documented contract of zones used this way.
        unsafe { std::slice::from_raw_parts(self.as_ptr().cast::<AtomicU64>(), self.len() / 8) }
    }
}

impl Drop for Memzone {
    fn drop(&mut self) {
        if !live::release(Kind::Memzone, self.ptr.as_ptr() as usize) {
            return;
        }
        // SAFETY:
        // - this process reserved the zone and this was its last handle
        //   here; the EAL runs (claim held until after this body). Other
        //   processes must have let go of it (type docs).
        let ret = unsafe { sys::rte_memzone_free(self.ptr.as_ptr()) };
        debug_assert_eq!(ret, 0, "rte_memzone_free({:?})", self.name);
    }
}

impl fmt::Debug for Memzone {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Memzone({:?}, {} bytes at {:p})",
            self.name,
            self.len(),
            self.as_ptr()
        )
    }
}
