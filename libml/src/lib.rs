//! libml — the runtime every kneepoint inference function (IF) is built on.
//!
//! An IF is a separate process that dequeues request fragments from its
//! `if-manager` ring, reassembles them into a pinned input pool, batches
//! them under a latency SLO, runs a model and answers on the wire.
//!
//! Modules:
//! - [`backoff`]: what a poll loop does when idle (pause, then sleeps
//!   doubling up to a cap), so idle pollers do not burn a core.
//! - [`reassembly`]: the sans-IO reassembler: per fragment, which input-pool
//!   slot and offset its bytes go to, when a request is complete, and which
//!   requests are answered BAD_REQUEST, INCOMPLETE or OVERLOADED, exactly
//!   once each.
//! - [`pool`]: the input pool: request slots, contiguous in one hugepage
//!   memzone (or the heap), that fragments are converted into (RGB `u8` HWC
//!   to normalised `f32` NCHW, or `f32` as is) and that in-order batches are
//!   read from without a copy. Its memory edge is libml's one `unsafe`
//!   module.
//! - [`engine`]: the framework callback interface (`init`, `deinit`,
//!   `load_model`, `link_model`, `configure_batch`, `infer_batch`) every
//!   inference engine is hosted through.
//! - [`model`], [`messages`], [`names`]: the model repository's config,
//!   the typed messages between processes, the shared-memory names; they
//!   live in kp-schema (plain data, no DPDK) and are re-exported here.
//! - [`telemetry`]: per-IF arrival rate, throughput, batch sizes, latency
//!   EWMA and percentiles, answers by status.
//! - [`runtime`]: the IF's driver over DPDK: fragments from its ring into
//!   the input pool, batches through the engine, answers on the TX ring.
//! - [`seqlock`]: a few words one thread publishes and others read whole,
//!   without a lock (the batching state, to the telemetry publisher).
//! - [`topk`]: the k best `(class, score)` pairs of an output row.
//! - [`batching`]: the sans-IO batching policy (SLAB plus an online fit of
//!   the batch-cost curve): when to run a batch and how big, which requests
//!   to shed, and when to report under- or over-provisioning.

#![deny(unsafe_code)]

// The typed messages, the model repository's config and the shared names
// live in kp-schema (no DPDK), so the orchestrator need not link the data
// plane; they stay reachable here under their old paths.
pub use kp_schema::{messages, model, names};

pub mod backoff;
pub mod batching;
pub mod engine;
pub mod pool;
pub mod reassembly;
pub mod runtime;
pub mod seqlock;
pub mod telemetry;
pub mod topk;
