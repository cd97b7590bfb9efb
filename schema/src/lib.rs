//! kp-schema — what kneepoint's processes say to each other, and the
//! model repository they agree on. Plain data and its (de)serialisation:
//! no DPDK, no engine, no sockets, so the orchestrator and kpctl build and
//! link without the data plane, and every process reads the same types.
//!
//! Modules:
//! - [`messages`]: the control commands and replies of the if-manager, the
//!   IFs and the orchestrator over ZeroMQ, with one error shape
//!   (`{code, message}`), and readiness as a typed message.
//! - [`telemetry`]: what an IF publishes (statistics, provisioning reports).
//! - [`batching`]: the batching policy's state and verdicts, as published.
//! - [`mode`]: the life-cycle modes of an IF process.
//! - [`model`]: the model repository: `models/<name>/config.toml` read into
//!   a validated [`model::ModelConfig`], and [`model::repository`].
//! - [`names`]: shared-memory names the if-manager and IFs agree on.
//! - `fuzzing` (hidden): the bodies of the fuzz targets `if_manager_command`
//!   and `model_config` in `fuzz/`, also run over their committed seed
//!   corpora by `cargo test`.
//!
//! libml (the IF runtime) re-exports these modules under its own paths.

#![deny(unsafe_code)]

pub mod batching;
#[doc(hidden)]
pub mod fuzzing;
pub mod messages;
pub mod mode;
pub mod model;
pub mod names;
pub mod telemetry;

pub use mode::Mode;
