//! kneepoint's control plane.
//!
//! The orchestrator starts the `if-manager` and the inference functions
//! (IFs), gives each IF a share of the device (CUDA MPS percentage on a GPU
//! host, a set of cores and an intra-op thread count on a CPU host),
//! re-provisions IFs through a shadow standby without stopping service,
//! tunes the shares from telemetry (GSLICE's Algorithm 1 and a weighted
//! max-min fair allocation) and takes commands over ZeroMQ from `kpctl`.
//!
//! The parts, the deterministic ones first:
//! - [`alloc`]: the weighted max-min fair allocation of the device across
//!   IFs (pins, floors, demand caps) and its CPU form, sets of cores;
//! - [`tuning`]: GSLICE's Algorithm 1, an IF's demand from its telemetry;
//! - [`lifecycle`]: the IF processes' life cycle — deploy, shadow,
//!   switchover, fail-over, start timeout, platform restart — as a sans-IO
//!   state machine (events in, actions out, time passed in);
//! - [`control`]: the control protocol `kpctl` speaks, the desired state it
//!   changes (validated whole before anything changes), the ZeroMQ server;
//! - [`config`]: the platform configuration file;
//! - [`gpu`]: an NVIDIA GPU and CUDA MPS, which enforces GPU shares;
//! - [`lcores`]: EAL lcore ids for IF processes, from a free set (never
//!   one a live process holds);
//! - [`process`]: child processes and requests to their control sockets;
//! - [`metrics`]: the Prometheus endpoint: the IFs' telemetry, the
//!   if-manager's counters and the daemon's own numbers as series;
//! - [`daemon`]: the loop that drives the processes towards the desired
//!   state: it carries out [`lifecycle`]'s actions, reads telemetry and
//!   tunes.
//!
//! The data-plane mechanics a switchover relies on (who dequeues a ring,
//! handing requests over, the ledger of a dead IF) are libml's
//! `runtime::handover`; the orchestrator decides *when*.

pub mod alloc;
pub mod config;
pub mod control;
pub mod daemon;
pub mod gpu;
pub mod lcores;
pub mod lifecycle;
pub mod metrics;
pub mod process;
pub mod topology;
pub mod tuning;
