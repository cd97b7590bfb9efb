//! Shared-memory names the if-manager and inference functions agree on.
//!
//! They are scoped by DPDK's `--file-prefix`, so two platforms on one host
//! do not collide. DPDK limits ring names to 28 bytes, mempool names to 25
//! and memzone names to 31.

use kp_wire::IfId;

/// The packet mempool the if-manager creates and IFs look up.
pub const MEMPOOL: &str = "kp_mbufs";
/// The multi-producer ring IFs enqueue finished response frames on.
pub const TX_RING: &str = "kp_tx";
/// The memzone of the TX ring's doorbell: IFs ring it when they enqueue
/// answers, and an idle if-manager dozes on it instead of sleeping.
pub const TX_BELL: &str = "kp_tx_bell";

/// The ring that carries fragments to inference function `if_id`.
pub fn if_ring(if_id: IfId) -> String {
    format!("kp_if_{}", if_id.0)
}

/// The memzone holding inference function `if_id`'s input pool in process
/// `pid` (unique per process, so a shadow IF has its own).
pub fn input_pool(if_id: IfId, pid: u32) -> String {
    format!("kp_pool_{}_{}", if_id.0, pid)
}

/// The memzone where the IFs of `if_id` (active and shadow) agree on who
/// dequeues its ring and hand requests over (created with the ring).
pub fn if_control(if_id: IfId) -> String {
    format!("kp_ifctl_{}", if_id.0)
}

/// The ring on which process `pid`'s new active forwards it the fragments
/// of requests it was assembling when it handed its ring over.
pub fn handback_ring(pid: u32) -> String {
    format!("kp_hb_{pid}")
}

/// The memzone where process `pid` keeps the addressing of every request it
/// holds, so that its successor can answer them if it dies.
pub fn ledger(pid: u32) -> String {
    format!("kp_ledger_{pid}")
}
