//! kneepoint's data plane: the `if-manager`.
//!
//! The if-manager is the only process that touches the NIC. It is a DPDK
//! primary process that polls one RX queue on a pinned lcore, parses each
//! frame (Ethernet, optional 802.1Q tag, IPv4, UDP, the kneepoint header of
//! docs/PROTOCOL.md) and routes each request fragment, without copying it, by
//! `if_id` to that inference function's `rte_ring` in shared hugepage
//! memory. Inference functions (DPDK secondary processes) dequeue from their
//! ring and put finished response frames on one shared TX ring, which the
//! if-manager drains to the NIC. It knows nothing of models.
//!
//! Design:
//! - a sans-IO core — [`classify`] (what a frame is), `kp_wire::answered`
//!   (which unknown-IF requests were already answered), `libml::backoff`
//!   (what to do when idle), [`routes`] (the lock-free route table), [`outcome`] (one
//!   named fate and counter per packet) — tested on plain bytes and time;
//! - a thin driver, [`dataplane`], that runs that core over DPDK through
//!   the `dpdk` wrapper crate; this crate has no `unsafe` of its own;
//! - a control socket ([`control`], ZeroMQ REP, JSON) to register and
//!   unregister IF rings at run time and read the counters, the NIC's
//!   included ([`port_stats`]: the lcore publishes them, the control
//!   thread never calls the driver).
//!
//! Limits: one port, one RX and one TX queue (one core's worth of packets:
//! see docs/PERFORMANCE.md); fragments that exceed one mbuf segment are
//! counted malformed; a request that meets a full IF ring is shed: the IF
//! answers it OVERLOADED, exactly once, through a shed notice ([`shed`]).

#![forbid(unsafe_code)]

pub mod classify;
pub mod config;
pub mod control;
pub mod dataplane;
pub mod outcome;
pub mod port_stats;
pub mod routes;
pub mod shed;
