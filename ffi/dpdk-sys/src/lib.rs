//! Raw bindings to the system DPDK (22.11, Debian's `libdpdk-dev`).
//!
//! Generated at build time by bindgen over `src/bindings.h` with the exact
//! `pkg-config --cflags libdpdk` flags, and allowlisted to what kneepoint
//! uses: EAL, lcores, ethdev (one RX/TX queue per port), packet mempools and
//! mbufs, rings, memzones, multi-process messaging.
//!
//! DPDK's fast-path functions (`rte_eth_rx_burst`, `rte_pktmbuf_alloc`,
//! `rte_ring_enqueue_burst`, `rte_errno`, ...) are `static inline` in its
//! headers and have no symbol to link against; `src/shim.c` wraps each one
//! one-to-one under a `kp_` prefix (`kp_rte_eth_rx_burst`, ...), documented
//! in `bindings.h`.
//!
//! Nothing here is safe to call directly: the `dpdk` crate is the one safe
//! wrapper, and every other crate goes through it.
//!
//! Linking is dynamic, which is also what makes the EAL load the PMD
//! plugins (`net_pcap`, `net_af_packet`, `net_ring`, ...) from Debian's
//! plugin directory at run time.

mod generated {
    #![allow(
        non_camel_case_types,
        non_snake_case,
        non_upper_case_globals,
        dead_code,
        unsafe_op_in_unsafe_fn,
        missing_debug_implementations,
        clippy::all,
        clippy::pedantic,
        clippy::undocumented_unsafe_blocks,
        clippy::missing_safety_doc,
        clippy::multiple_unsafe_ops_per_block,
        clippy::ptr_offset_with_cast,
        rustdoc::all
    )]
    include!(concat!(env!("OUT_DIR"), "/bindings.rs"));
}

pub use generated::*;
