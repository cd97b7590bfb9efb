//! CPU priority of this process's threads: the nice value and the
//! scheduling policy (normal or `SCHED_IDLE`). Linux keeps both per
//! thread, and a new thread starts with its creator's: a process that
//! lowers its main thread's priority early runs every thread it creates
//! later at that priority, and [`set_normal_all_threads`] gives all of
//! them one priority at once.
//!
//! Also the timer slack: how late the kernel may end a thread's timed
//! sleep to merge its wake-up with others' (50 µs by default, inherited
//! the same way).

use std::io;

/// Sets the calling thread's nice value (threads it creates afterwards
/// inherit it).
pub fn set_nice_current_thread(nice: i32) -> io::Result<()> {
    // SAFETY: gettid takes no arguments and cannot fail.
    let tid = unsafe { libc::gettid() };
    set_nice(tid, nice)
}

/// Puts the calling thread under `SCHED_IDLE` (threads it creates
/// afterwards inherit it): it runs only on CPU time that no thread under
/// the normal policy wants, whatever their nice values (its weight is a
/// third of nice +19's). Leaving it again needs `CAP_SYS_NICE`, e.g. root.
pub fn set_idle_current_thread() -> io::Result<()> {
    // SAFETY: gettid takes no arguments and cannot fail.
    let tid = unsafe { libc::gettid() };
    set_policy(tid, libc::SCHED_IDLE)
}

/// Puts every thread of this process (as listed in `/proc/self/task`; one
/// that exits meanwhile is skipped) under the normal policy
/// (`SCHED_OTHER`) at this nice value, from `SCHED_IDLE` or another nice
/// value. Raising a priority needs `CAP_SYS_NICE`, e.g. root.
pub fn set_normal_all_threads(nice: i32) -> io::Result<()> {
    for entry in std::fs::read_dir("/proc/self/task")? {
        let name = entry?.file_name();
        let tid: libc::pid_t = name.to_string_lossy().parse().map_err(|_| {
            io::Error::other(format!("/proc/self/task/{name:?} is not a thread id"))
        })?;
        match set_policy(tid, libc::SCHED_OTHER).and_then(|()| set_nice(tid, nice)) {
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {} // it exited
            other => other?,
        }
    }
    Ok(())
}

/// Whether the calling thread runs under `SCHED_IDLE`.
pub fn is_idle_current_thread() -> io::Result<bool> {
    // SAFETY: sched_getscheduler takes a plain integer (0: the calling
    // thread) and touches no memory of ours.
    let policy = unsafe { libc::sched_getscheduler(0) };
    if policy < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(policy == libc::SCHED_IDLE)
}

fn set_policy(tid: libc::pid_t, policy: libc::c_int) -> io::Result<()> {
    // Both SCHED_OTHER and SCHED_IDLE take a static priority of 0.
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: `param` is a valid sched_param that outlives the call, which
    // only reads it; a thread id selects that thread.
    let r = unsafe { libc::sched_setscheduler(tid, policy, &param) };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Whether this process runs as root (may raise priorities back).
pub fn is_root() -> bool {
    // SAFETY: geteuid takes no arguments and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

fn set_nice(tid: libc::pid_t, nice: i32) -> io::Result<()> {
    // SAFETY: setpriority takes plain integers and touches no memory of
    // ours; PRIO_PROCESS with a thread id sets that thread's nice value.
    let r = unsafe { libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, nice) };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The calling thread's nice value.
pub fn nice_current_thread() -> io::Result<i32> {
    // SAFETY: gettid takes no arguments and cannot fail.
    let tid = unsafe { libc::gettid() };
    // getpriority returns the nice value, and -1 is a valid one: errno
    // (cleared first) tells an error from it.
    // SAFETY: __errno_location returns this thread's errno, always valid.
    let errno = unsafe { libc::__errno_location() };
    // SAFETY: `errno` points at this thread's errno (above).
    unsafe { *errno = 0 };
    // SAFETY: getpriority takes plain integers and touches no memory of ours.
    let value = unsafe { libc::getpriority(libc::PRIO_PROCESS, tid as libc::id_t) };
    let err = io::Error::last_os_error();
    if value == -1 && err.raw_os_error() != Some(0) {
        return Err(err);
    }
    Ok(value)
}

/// Sets the calling thread's timer slack (threads it creates afterwards
/// inherit it): its timed sleeps, futex waits with a time-out among them,
/// end at most this much after their time rather than the default 50 µs.
pub fn set_timer_slack_current_thread(slack: std::time::Duration) -> io::Result<()> {
    let ns = libc::c_ulong::try_from(slack.as_nanos().max(1)).unwrap_or(libc::c_ulong::MAX);
    // SAFETY: PR_SET_TIMERSLACK takes a plain integer and touches no memory
    // of ours.
    let r = unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, ns, 0, 0, 0) };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The calling thread's timer slack.
pub fn timer_slack_current_thread() -> std::time::Duration {
    // SAFETY: PR_GET_TIMERSLACK takes no pointer and returns the slack in ns.
    let ns = unsafe { libc::prctl(libc::PR_GET_TIMERSLACK, 0, 0, 0, 0) };
    std::time::Duration::from_nanos(ns.max(0) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The priority tests change threads of the whole test process (all of
    /// them, in one): one at a time.
    static PRIORITY_TESTS: std::sync::Mutex<()> = std::sync::Mutex::new(());

    #[test]
    fn a_thread_started_after_lowering_inherits_it_and_all_can_be_reset() {
        let _one_at_a_time = PRIORITY_TESTS.lock().unwrap_or_else(|e| e.into_inner());
        // In a thread of its own, so the test harness's threads keep theirs.
        std::thread::spawn(|| {
            let before = nice_current_thread().unwrap();
            set_nice_current_thread(before + 5).unwrap();
            assert_eq!(nice_current_thread().unwrap(), before + 5);
            let child = std::thread::spawn(nice_current_thread)
                .join()
                .unwrap()
                .unwrap();
            assert_eq!(
                child,
                before + 5,
                "a new thread starts at its creator's nice value"
            );
            if is_root() {
                set_nice_current_thread(before).unwrap();
                assert_eq!(nice_current_thread().unwrap(), before);
            }
        })
        .join()
        .unwrap();
    }

    #[test]
    fn an_idle_thread_passes_the_policy_on_and_all_threads_return_to_normal() {
        let _one_at_a_time = PRIORITY_TESTS.lock().unwrap_or_else(|e| e.into_inner());
        std::thread::spawn(|| {
            let before = nice_current_thread().unwrap();
            assert!(!is_idle_current_thread().unwrap());
            set_idle_current_thread().unwrap();
            assert!(is_idle_current_thread().unwrap());
            let child = std::thread::spawn(is_idle_current_thread)
                .join()
                .unwrap()
                .unwrap();
            assert!(child, "a new thread starts under its creator's policy");
            if is_root() {
                // Every thread of the test process, this one among them.
                set_normal_all_threads(before).unwrap();
                assert!(!is_idle_current_thread().unwrap());
                assert_eq!(nice_current_thread().unwrap(), before);
            }
        })
        .join()
        .unwrap();
    }

    #[test]
    fn the_timer_slack_is_set_per_thread_and_inherited() {
        std::thread::spawn(|| {
            let us = std::time::Duration::from_micros(1);
            set_timer_slack_current_thread(us).unwrap();
            assert_eq!(timer_slack_current_thread(), us);
            let child = std::thread::spawn(timer_slack_current_thread)
                .join()
                .unwrap();
            assert_eq!(child, us, "a new thread starts with its creator's slack");
        })
        .join()
        .unwrap();
    }
}
