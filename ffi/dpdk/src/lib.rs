//! The one safe wrapper over DPDK (`dpdk-sys`): EAL, ports, mempools,
//! mbufs, rings, memzones. Every other kneepoint crate speaks DPDK through
//! this crate and nothing else.
//!
//! # Design
//!
//! - **Handles own or borrow DPDK objects.** [`Mempool`], [`Ring`] and
//!   [`Memzone`] are made by `create`/`reserve` (this process owns the
//!   object and frees it when its last handle here goes) or by `lookup`
//!   (made elsewhere: never freed here). [`Port`] owns its port and closes
//!   it on drop. [`Mbuf`] owns one packet buffer and frees it on drop.
//! - **Bursts, not vectors.** [`MbufBurst<N>`] is a fixed array of up to
//!   `N` mbufs: RX, TX, ring enqueue/dequeue and bulk allocation move mbufs
//!   in and out of it without allocating. What a transfer does not take
//!   stays in the burst, in order; what a burst still holds when cleared or
//!   dropped is freed. Nothing leaks and nothing is freed twice.
//! - **One error type**, [`DpdkError`], made in one place from `rte_errno`
//!   or negative return codes, with the failing function's name, the errno
//!   and `rte_strerror`'s text.
//! - **Cleanup cannot pull memory from under Rust.** `rte_eal_cleanup`
//!   unmaps DPDK's memory, so [`Eal::cleanup`] refuses
//!   ([`DpdkError::EalInUse`]) while any handle or mbuf of the process is
//!   alive; handles cannot be made before `init` or after `cleanup`. Live
//!   mbufs are counted per burst (one atomic add per burst on the fast
//!   path; one per mbuf only for single `alloc`/drop).
//! - **Threading follows DPDK's rules.** `Mempool`, `Memzone` and `Mbuf`
//!   are `Send + Sync`; `Port` and `Ring` are `Send` but not `Sync` (DPDK's
//!   per-queue bursts and single-producer/consumer rings are not
//!   thread-safe), and a process gets one handle per port and per
//!   single-producer/consumer ring. [`RingRef`] reaches a ring from another
//!   thread under an `unsafe` contract.
//!
//! # Multi-process
//!
//! kneepoint runs one DPDK primary (the if-manager) and several secondaries
//! (the inference functions) on one `--file-prefix`. Hugepage memory is
//! mapped at the same virtual address in all of them, so an mbuf pointer
//! travels through a [`Ring`] unchanged and a secondary frees it into the
//! primary's [`Mempool`].
//!
//! **Rule: two processes of one instance never use the same lcore id.** A
//! mempool's per-lcore caches live in shared memory and are indexed by lcore
//! id without locks; two processes on the same id corrupt the pool. Give
//! each process its own id with `--lcores <id>@<cpu>`, e.g. `--lcores 0@0`
//! for the primary and `--lcores 1@0`, `--lcores 2@1`, ... for secondaries
//! (the id is what matters, the CPU may be shared). Threads the EAL did not
//! create (plain `std::thread`s) have no lcore id and bypass the caches, so
//! they are always safe.
//!
//! Other cross-process rules nothing in one process can check: a
//! single-producer (consumer) ring has one producer (consumer) among all
//! processes; the creator of a ring, pool or memzone frees it only after
//! the other processes stopped using it; a secondary starts after the
//! primary and ends before it.
//!
//! # Limits
//!
//! - One RX and one TX queue per port (`QueueId(0)`), default
//!   configuration: no RSS, no offloads, no multi-segment TX.
//! - Mbuf data access covers the first segment; kneepoint's frames fit one.
//! - [`Ring::lookup`] trusts that the named ring carries mbufs (every ring
//!   kneepoint creates does); [`Mempool::lookup`] checks that the pool is a
//!   packet pool.
//! - The threads of a process inherit the CPU affinity of the thread that
//!   spawned them: threads spawned by the main lcore after [`Eal::init`]
//!   are pinned to its CPU(s).
//! - DPDK 22.11 as packaged by Debian, linked dynamically (the EAL then
//!   loads its PMD plugins by itself).

mod eal;
mod error;
mod ids;
mod live;
mod mbuf;
mod mempool;
mod memzone;
mod port;
mod ring;

pub use eal::{Eal, ProcessType};
pub use error::{strerror, DpdkError};
pub use ids::{LcoreId, PortId, QueueId, SocketId};
pub use live::{live_handles, live_mbufs};
pub use mbuf::{Drain, Mbuf, MbufBurst};
pub use mempool::Mempool;
pub use memzone::{Memzone, MemzoneFlags};
pub use port::{MacAddr, Port, PortStats};
pub use ring::{Ring, RingFlags, RingProducer, RingRef};

/// The raw bindings, for what this crate does not wrap.
pub use dpdk_sys as sys;
