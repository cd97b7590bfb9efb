//! libml — the runtime every kneepoint inference function (IF) is built on.
//!
//! An IF is a separate process that dequeues request fragments from its
//! `if-manager` ring, reassembles them into a pinned input pool, batches
//! them under a latency SLO, runs a model and answers on the wire.
//!
//! Modules:
//! - [`wire`]: the sans-IO codec of PROTOCOL.md (request fragments,
//!   responses and errors) and of the Ethernet/IPv4/UDP frames that carry
//!   them. It takes bytes and returns typed views or errors; it never
//!   panics on untrusted input and holds no `unsafe`.
//! - [`backoff`]: what a poll loop does when idle (pause, then sleeps
//!   doubling up to a cap), so idle pollers do not burn a core.
//! - [`answered`]: a fixed-size, time-bounded memory of answered requests,
//!   so that fragments arriving after an answer do not cause a second one.
//! - [`reassembly`]: the sans-IO reassembler: per fragment, which input-pool
//!   slot and offset its bytes go to, when a request is complete, and which
//!   requests are answered BAD_REQUEST, INCOMPLETE or OVERLOADED, exactly
//!   once each.
//! - [`engine`]: the framework callback interface (`init`, `deinit`,
//!   `load_model`, `link_model`, `configure_batch`, `infer_batch`) every
//!   inference engine is hosted through.
//! - [`batching`]: the sans-IO batching policy (SLAB plus an online fit of
//!   the batch-cost curve): when to run a batch and how big, which requests
//!   to shed, and when to report under- or over-provisioning.

#![deny(unsafe_code)]

pub mod answered;
pub mod backoff;
pub mod batching;
pub mod engine;
pub mod reassembly;
pub mod wire;
