//! The orchestrator's control API: the protocol `kpctl` speaks, the desired
//! state it changes, and the ZeroMQ socket it is served on.
//!
//! One request is one JSON object with a `cmd` field; each gets exactly one
//! JSON reply, `{"ok": true, ...}` or `{"ok": false, "error": {"code",
//! "message"}}`. `docs/CONTROL.md` documents every command, reply and error
//! code.
//!
//! The parts, sans-IO first:
//!
//! * [`protocol`]: [`Request`] (serde-tagged by `cmd`, unknown fields
//!   refused), [`Reply`], [`ControlError`] with its [`ErrorCode`], and the
//!   [`StatusRow`]s of a [`StatusReport`].
//! * [`state`]: [`DesiredState`] and [`ModelCatalog`].
//!   [`DesiredState::plan`] validates a request against the state without
//!   changing it and returns a [`Change`]; [`DesiredState::apply`] commits
//!   it and cannot fail. So a refused command changes nothing, and the
//!   daemon may act on a change before committing it.
//! * [`server`]: [`ControlServer`], a REP socket the daemon polls from its
//!   main loop ([`ControlServer::poll_once`]) with its [`Handler`];
//!   [`default_endpoint`] and the permissions of the socket.
//! * [`client`]: [`ControlClient`], a REQ socket with a timeout (`kpctl`).
//! * [`table`]: the readable status table.
//! * `fuzzing` (hidden): the body of the `orchestrator_request` fuzz target
//!   in `fuzz/`, also run over its committed seed corpus by `cargo test`.
//!
//! Limits: the protocol has no authentication; access is the socket's file
//! permissions (owner-only) or, for TCP, loopback. Requests are handled one
//! at a time, in the daemon's loop.

#![deny(unsafe_code)]

pub mod client;
#[doc(hidden)]
pub mod fuzzing;
pub mod protocol;
pub mod server;
pub mod state;
pub mod table;

pub use client::{ClientError, ControlClient};
pub use protocol::{
    ControlError, ErrorCode, IfState, Reply, Request, StatusReport, StatusRow, COMMANDS,
};
pub use server::{
    default_endpoint, default_endpoint_for, BindOptions, ControlServer, Handler, Served,
    ServerError, ENDPOINT_ENV,
};
pub use state::{CatalogEntry, Change, DesiredIf, DesiredState, ModelCatalog, DEFAULT_SHARE_PCT};
pub use table::format_status_table;
