//! kneepoint's control plane.
//!
//! The orchestrator starts the `if-manager` and the inference functions
//! (IFs), gives each IF a share of the device (CUDA MPS percentage on a GPU
//! host, a set of cores and an intra-op thread count on a CPU host),
//! re-provisions IFs through a shadow standby without stopping service,
//! tunes the shares from telemetry (GSLICE's Algorithm 1 and a weighted
//! max-min fair allocation) and takes commands over ZeroMQ from `kpctl`.
//!
//! This crate is the place for that control plane; see `DESIGN.md`. At this
//! stage of the project it holds nothing yet: the data plane (`if-manager`)
//! registers inference-function rings through its own ZeroMQ control socket
//! (see `if-manager`'s `control` module), which is what the orchestrator will
//! drive.

pub mod alloc;
pub mod control;
pub mod tuning;
