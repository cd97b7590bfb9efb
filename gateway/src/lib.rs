//! kp-gateway — a KServe v2 / Open Inference Protocol HTTP front door to a
//! kneepoint platform, so applications that speak the protocol Triton,
//! KServe and MLServer share (tritonclient, curl, KServe's own clients)
//! use kneepoint unchanged. The UDP path stays the fast path: the gateway
//! is one more client of it.
//!
//! ```text
//!  tritonclient / curl ──HTTP/1.1──► kp-gateway ──UDP (PROTOCOL.md)──► if-manager ─► IFs
//! ```
//!
//! # What it serves
//!
//! `GET /v2/health/live`, `/v2/health/ready`, `/v2` (server metadata),
//! `/v2/models/{name}[/versions/1]` (metadata), `.../ready`, and
//! `POST .../infer` with JSON tensors or the binary tensor extension
//! ([`v2`]). Models are those of a model repository (`--models DIR`, read
//! by kp-schema), all of them or those named by `--model NAME[=IF_ID]`;
//! the tensors each model shows are in [`models`]: `INPUT` (what the
//! platform's requests carry) and the platform's answer as `CLASSES` and
//! `SCORES` (top-k). A batch of N is N platform requests.
//!
//! # Design
//!
//! - **HTTP**: hyper 1 (HTTP/1.1, keep-alive) under axum's router on a
//!   tokio runtime of `--threads` workers; the accept loop and the limits
//!   that bound memory and time (connections, header read timeout, body
//!   size checked against `Content-Length` before the body is read, a
//!   gateway-wide budget of body bytes, a body timeout) are in [`http`].
//! - **Platform**: one `kneepoint_client::Client` (one UDP socket) for all
//!   requests, bridged to futures by its receiver thread completing each
//!   request's oneshot ([`bridge`], which says why this rather than
//!   `spawn_blocking` around `infer` or a poller thread).
//! - **Statuses**: each platform status and client error has its HTTP code
//!   ([`http::platform_status`]); errors are `{"error": "..."}` bodies.
//! - **Readiness**: a model is ready when an IF answers for its if_id: a
//!   one-byte probe, refused BAD_REQUEST by an IF and UNKNOWN_IF by the
//!   if-manager when none is there ([`http::Gateway`]), cached for a
//!   second; the server is ready when every served model is.
//!
//! # Limits
//!
//! - HTTP/1.1 only, no TLS, no HTTP/2 (so no gRPC): put a proxy in front.
//! - One model version (`1`); no model control (load/unload) API: deploy
//!   with kpctl.
//! - Outputs are the platform's top-k, not the model's whole output.
//! - Readiness probes show as bad requests in the IF's counters.

#![deny(unsafe_code)]

pub mod bridge;
pub mod http;
pub mod models;
pub mod v2;
