//! File descriptors a parent hands to the child it starts, at a number the
//! child is told on its command line — how the orchestrator gives each
//! child the write end of a readiness pipe (`--notify-fd N`), as s6's
//! readiness fd and systemd's `LISTEN_FDS` do.
//!
//! Rust opens every descriptor close-on-exec, so a child inherits none but
//! its standard streams. The parent side, [`ChildFd`], clears that flag in
//! the forked child only, between fork and exec (the parent's copy stays
//! close-on-exec, so a sibling started meanwhile does not inherit it); the
//! child side, [`claim`], takes the number it was told as an [`OwnedFd`].
//!
//! Limits: the number is whatever the parent's descriptor is (3 or more,
//! never a standard stream); one descriptor per [`ChildFd`].

use std::collections::BTreeSet;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::sync::Mutex;

/// A descriptor to hand to a child, at the number [`ChildFd::number`].
#[derive(Debug)]
pub struct ChildFd {
    fd: OwnedFd,
}

impl ChildFd {
    /// Wraps `fd`. A descriptor 0–2 (possible when this process was started
    /// with a standard stream closed) is first duplicated to 3 or more:
    /// the child's standard streams are set up over 0–2 before it could
    /// keep it.
    pub fn new(fd: OwnedFd) -> io::Result<ChildFd> {
        // `try_clone` duplicates to the lowest free number from 3 up.
        let fd = if fd.as_raw_fd() <= 2 {
            fd.try_clone()?
        } else {
            fd
        };
        Ok(ChildFd { fd })
    }

    /// The number the child will have it at: what to tell it.
    pub fn number(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Makes the processes `cmd` spawns inherit it at [`ChildFd::number`].
    /// `cmd` owns it from now on: drop `cmd` once the child is spawned, so
    /// that the child holds the only copy and the other end sees
    /// end-of-file when the child exits.
    pub fn pass_to(self, cmd: &mut Command) {
        let fd = self.fd;
        let keep_open_across_exec = move || -> io::Result<()> {
            // SAFETY: fcntl with F_SETFD takes an int and no pointer; `fd`
            // is owned by this closure, so it is open in the parent as long
            // as `cmd` can spawn, hence in the forked child that runs this;
            // flags 0 only clears its close-on-exec flag.
            if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFD, 0) } == -1 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        };
        // SAFETY: pre_exec's contract: the closure runs in the forked child
        // before exec, where only async-signal-safe calls are allowed. It
        // makes one fcntl call (async-signal-safe) and, on failure, builds
        // an io::Error from errno, which neither allocates nor locks.
        unsafe { cmd.pre_exec(keep_open_across_exec) };
    }
}

/// Why a child cannot take the descriptor it was told of.
#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    /// 0, 1 and 2 are the standard streams, never a passed descriptor.
    #[error("fd {0} is a standard stream, not a descriptor passed to this process")]
    StandardStream(RawFd),
    /// Nothing is open at that number: the parent did not pass it.
    #[error("fd {fd} is not open: the parent did not pass it")]
    NotOpen {
        /// The number.
        fd: RawFd,
        /// What fcntl said.
        source: io::Error,
    },
    /// This process took it already.
    #[error("fd {0} was claimed already")]
    Claimed(RawFd),
}

/// Numbers [`claim`] has handed out: each is owned once.
static CLAIMED: Mutex<BTreeSet<RawFd>> = Mutex::new(BTreeSet::new());

/// Takes ownership of descriptor `fd`, which this process's parent passed
/// it (its number is on the command line), and marks it close-on-exec so
/// that this process's own children do not inherit it.
///
/// Call it at start-up, before the process opens anything: then a
/// descriptor open at that number can only be the inherited one, which
/// nothing else in the process owns. A standard stream, a number with
/// nothing open and a second claim of the same number are refused.
pub fn claim(fd: RawFd) -> Result<OwnedFd, ClaimError> {
    if (0..=2).contains(&fd) {
        return Err(ClaimError::StandardStream(fd));
    }
    let mut claimed = CLAIMED.lock().unwrap_or_else(|p| p.into_inner());
    if claimed.contains(&fd) {
        return Err(ClaimError::Claimed(fd));
    }
    // SAFETY: fcntl with F_SETFD takes an int and no pointer; on a number
    // with nothing open it fails with EBADF and changes nothing.
    if unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) } == -1 {
        return Err(ClaimError::NotOpen {
            fd,
            source: io::Error::last_os_error(),
        });
    }
    claimed.insert(fd);
    // SAFETY: OwnedFd needs an open descriptor that nothing else owns. It
    // is open (fcntl just succeeded); it is not a standard stream; this
    // function hands each number out once (`CLAIMED`); and, called at
    // start-up as documented, a descriptor open then is the inherited one,
    // which no other code of this process has opened.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    fn a_child_writes_to_the_number_it_is_told_and_the_reader_sees_its_end() {
        let (mut reader, writer) = std::io::pipe().unwrap();
        let fd = ChildFd::new(writer.into()).unwrap();
        let n = fd.number();
        assert!(n > 2);
        // bash: dash redirects only descriptors 0-9.
        let mut cmd = Command::new("bash");
        cmd.args(["-c", &format!("echo hello >&{n}")]);
        fd.pass_to(&mut cmd);
        let status = cmd.status().unwrap();
        assert!(status.success());
        drop(cmd); // the parent's copy: the child's was the only other
        let mut got = String::new();
        reader.read_to_string(&mut got).unwrap();
        assert_eq!(got, "hello\n");
    }

    #[test]
    fn without_pass_to_a_child_inherits_nothing() {
        let (_reader, writer) = std::io::pipe().unwrap();
        let n = writer.as_raw_fd();
        let status = Command::new("bash")
            .args(["-c", &format!("echo hello >&{n}")])
            .stderr(std::process::Stdio::null())
            .status()
            .unwrap();
        assert!(!status.success(), "fd {n} leaked into a child");
    }

    #[test]
    fn claims_refuse_stdio_closed_numbers_and_a_second_claim() {
        assert!(matches!(claim(1), Err(ClaimError::StandardStream(1))));
        assert!(matches!(
            claim(100_000),
            Err(ClaimError::NotOpen { fd: 100_000, .. })
        ));
        // A descriptor this test owns, handed over as a parent would.
        let (_reader, writer) = std::io::pipe().unwrap();
        let n = std::os::fd::IntoRawFd::into_raw_fd(OwnedFd::from(writer));
        let owned = claim(n).unwrap();
        assert_eq!(owned.as_raw_fd(), n);
        assert!(matches!(claim(n), Err(ClaimError::Claimed(m)) if m == n));
    }
}
