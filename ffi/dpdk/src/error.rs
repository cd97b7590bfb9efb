//! The one error type, and the one place where DPDK's error conventions
//! (`rte_errno`, negative return codes) become it.

use std::ffi::CStr;
use std::os::raw::c_int;
use std::path::PathBuf;

use dpdk_sys as sys;

/// Everything that can go wrong in this crate.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DpdkError {
    /// A DPDK call failed; `errno` is DPDK's error number (a positive
    /// `errno` value, or one of DPDK's own `E_RTE_*` above 1000).
    #[error("{op} failed: {message} (errno {errno})")]
    Call {
        /// The DPDK function that failed.
        op: &'static str,
        /// Its error number.
        errno: i32,
        /// `rte_strerror(errno)`.
        message: String,
    },
    /// A lookup by name found nothing (`ENOENT`).
    #[error("{op}: no object named {name:?}")]
    NotFound {
        /// The lookup function.
        op: &'static str,
        /// The name looked for.
        name: String,
    },
    /// A name or argument cannot be passed to C: it contains a NUL byte.
    #[error("{op}: {name:?} contains a NUL byte")]
    InvalidName {
        /// The function it was meant for.
        op: &'static str,
        /// The offending string.
        name: String,
    },
    /// An argument this crate rejects before calling DPDK.
    #[error("{op}: {reason}")]
    InvalidArgument {
        /// The function it was meant for.
        op: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The object is already held by another handle in this process, and
    /// sharing it would break DPDK's threading rules (a port; a ring with a
    /// single producer or consumer).
    #[error("{op}: {name:?} is already in use by another handle in this process")]
    Busy {
        /// The function that refused.
        op: &'static str,
        /// The object.
        name: String,
    },
    /// `Eal::init` was already called in this process (successfully, or it
    /// is in progress): `rte_eal_init` runs once per process.
    #[error(
        "the DPDK EAL is already initialised in this process (rte_eal_init runs once per process)"
    )]
    EalAlreadyInitialised,
    /// A DPDK object was asked for before `Eal::init` succeeded or after
    /// `Eal::cleanup`.
    #[error("{op}: the DPDK EAL is not running (not initialised, or already cleaned up)")]
    EalNotRunning {
        /// The function that needed it.
        op: &'static str,
    },
    /// `Eal::cleanup` was refused because DPDK memory is still reachable
    /// from Rust: handles (mempools, rings, memzones, ports) or mbufs of this
    /// process are still alive. Drop them first.
    #[error("cannot clean up the EAL: {handles} DPDK handle(s) and {mbufs} mbuf(s) are still alive in this process")]
    EalInUse {
        /// Live `Mempool`/`Ring`/`Memzone`/`Port` handles.
        handles: usize,
        /// Live `Mbuf`s (including those held in `MbufBurst`s).
        mbufs: isize,
    },
    /// Removing a file DPDK left behind failed.
    #[error("removing {}: {source}", path.display())]
    Cleanup {
        /// The file or directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

impl DpdkError {
    /// DPDK's error number, where there is one (`ENOENT` for
    /// [`DpdkError::NotFound`]).
    pub fn errno(&self) -> Option<i32> {
        match self {
            DpdkError::Call { errno, .. } => Some(*errno),
            DpdkError::NotFound { .. } => Some(libc::ENOENT),
            _ => None,
        }
    }

    /// A [`DpdkError::Call`] for `errno` (positive).
    pub(crate) fn from_errno(op: &'static str, errno: i32) -> Self {
        DpdkError::Call {
            op,
            errno,
            message: strerror(errno),
        }
    }
}

/// `rte_strerror(errno)`, copied out of DPDK's per-thread buffer.
pub fn strerror(errno: i32) -> String {
    // SAFETY:
    // - `rte_strerror` accepts any value; it returns a pointer to a static
    //   string or to a per-thread buffer, never NULL.
    let msg = unsafe { sys::rte_strerror(errno) };
    if msg.is_null() {
        return format!("error {errno}");
    }
    // SAFETY:
    // - `msg` is a NUL-terminated string valid until the next
    //   `rte_strerror` call on this thread; it is copied out right here.
    unsafe { CStr::from_ptr(msg) }
        .to_string_lossy()
        .into_owned()
}

/// The calling thread's `rte_errno`.
pub(crate) fn rte_errno() -> i32 {
    // SAFETY:
    // - reads a thread-local integer; no precondition.
    unsafe { sys::kp_rte_errno() }
}

/// The error for a DPDK call that failed and set `rte_errno` (NULL or -1
/// return).
pub(crate) fn last_error(op: &'static str) -> DpdkError {
    DpdkError::from_errno(op, rte_errno())
}

/// Turns a DPDK "0 or positive on success, `-errno` on failure" return code
/// (ethdev, memzone) into a `Result`.
pub(crate) fn check(op: &'static str, ret: c_int) -> Result<c_int, DpdkError> {
    if ret < 0 {
        Err(DpdkError::from_errno(op, -ret))
    } else {
        Ok(ret)
    }
}

/// Turns a DPDK "-1 and `rte_errno` on failure" return code (EAL) into a
/// `Result`.
pub(crate) fn check_errno(op: &'static str, ret: c_int) -> Result<c_int, DpdkError> {
    if ret < 0 {
        Err(last_error(op))
    } else {
        Ok(ret)
    }
}

/// `name` as a C string, or [`DpdkError::InvalidName`].
pub(crate) fn c_name(op: &'static str, name: &str) -> Result<std::ffi::CString, DpdkError> {
    std::ffi::CString::new(name).map_err(|_| DpdkError::InvalidName {
        op,
        name: name.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negative_return_codes_become_call_errors_with_their_errno() {
        let err = check("rte_eth_dev_start", -libc::EINVAL).unwrap_err();
        assert_eq!(err.errno(), Some(libc::EINVAL));
        let text = err.to_string();
        assert!(text.starts_with("rte_eth_dev_start failed: "), "{text}");
        assert!(
            text.ends_with(&format!("(errno {})", libc::EINVAL)),
            "{text}"
        );
        assert_eq!(check("x", 3).unwrap(), 3);
    }

    #[test]
    fn strerror_knows_plain_errnos() {
        // Works without an EAL: rte_strerror falls back to strerror().
        assert_eq!(strerror(libc::ENOENT), "No such file or directory");
    }

    #[test]
    fn names_with_nul_are_rejected() {
        let err = c_name("rte_ring_create", "a\0b").unwrap_err();
        assert!(matches!(err, DpdkError::InvalidName { .. }));
        assert_eq!(err.errno(), None);
    }

    #[test]
    fn not_found_reports_enoent() {
        let err = DpdkError::NotFound {
            op: "rte_ring_lookup",
            name: "x".into(),
        };
        assert_eq!(err.errno(), Some(libc::ENOENT));
    }
}
