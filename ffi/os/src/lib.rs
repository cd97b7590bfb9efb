//! kp-os — the few Linux calls kneepoint makes outside DPDK, at the unsafe
//! edge with the rest of `ffi/`, so that a crate that needs them (the
//! orchestrator, the IF runtime) does not link DPDK for them.
//!
//! - [`affinity`]: pin the calling thread to a set of CPUs (the CPU form of
//!   a resource share), read its mask, parse `0-3,6` CPU lists; the
//!   machine-wide monotonic clock; whether a process is alive.
//! - [`futex`]: wait and wake on a word of memory shared between processes
//!   (a memzone), so a shadow IF sleeps instead of spinning on a core it
//!   shares with the process it waits for.
//! - [`net`]: several UDP datagrams in one `sendmmsg` call on a connected
//!   socket (the client's fragments), and a socket's receive buffer size.
//! - [`inherit`]: hand a descriptor to a child at a number it is told (the
//!   orchestrator's readiness pipes, `--notify-fd N`), and take it there.
//!
//! Every `unsafe` block here is one call (to libc, or std's descriptor and
//! pre-exec edges) with a `// SAFETY:` note; the functions around them are
//! safe.

pub mod affinity;
pub mod futex;
pub mod inherit;
pub mod net;
pub mod priority;
