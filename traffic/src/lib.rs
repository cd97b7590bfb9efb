//! kp-traffic: kneepoint's traffic tools, as a library and two binaries.
//!
//! # What
//!
//! - `kp-gen` writes pcap files of request fragments (docs/PROTOCOL.md) for
//!   replay with tcpreplay or DPDK's `net_pcap`, with faults of every kind
//!   mixed in on purpose, and a JSON manifest of exactly what it wrote and
//!   what the platform must make of it.
//! - `kp-client` drives a running platform over a real UDP socket, open or
//!   closed loop, and accounts for every answer.
//!
//! Modules:
//! - [`input`]: request payloads (PNG/JPEG decoded and resized, raw tensor
//!   files, seeded synthetic images);
//! - [`gen`]: requests -> a planned, ordered, faulted packet stream ->
//!   frames;
//! - [`fault`]: every kind of broken datagram, and the reference
//!   classification of a frame through kp-wire's parsers;
//! - [`manifest`]: the JSON manifest and the meaning of each field;
//! - [`pcap`]: classic pcap writer and reader;
//! - [`client`]: the live UDP client: its schedule (open or closed loop) on
//!   kneepoint-client's `Client` (submit/poll), and the report.
//!
//! # Design
//!
//! The wire codec is kp-wire's (`kp_wire`), never re-implemented here:
//! headers, frames and responses are emitted and parsed by the same code the
//! platform runs (kp-client cuts requests with the application client's
//! fragmenter, `kneepoint_client::frag`, itself on kp-wire), and what this crate adds is only what a *sender* needs
//! (breaking datagrams deliberately, ordering, pacing). Everything random
//! comes from one `StdRng` seeded by `--seed`, so a run is reproducible
//! byte for byte. Generation plans packets as small descriptors and builds
//! frames one at a time while writing, so memory does not grow with the
//! payload bytes of a run.
//!
//! # Limits
//!
//! - All requests of a run have the same size (the input shape's).
//! - IPv4 only, as the protocol.
//! - `kp-client` speaks from one socket; several clients are several
//!   processes (or `kp-gen --src-ports` for replayed traffic).

pub mod client;
pub mod fault;
pub mod gen;
pub mod input;
pub mod manifest;
pub mod pcap;
