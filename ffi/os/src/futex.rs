//! Process-shared futexes on words of shared memory (a memzone).
//!
//! A process waiting for another to do something in shared memory (a
//! shadow IF waiting for the active one to release its ring) can spin, which
//! is fastest on a core of its own and worst on a shared one: a spinner
//! uses up its fair share of the core and is then scheduled last, after the
//! very process it waits for. Sleeping on a futex instead lets the kernel
//! wake it when the word changes, and a woken sleeper is scheduled first.
//!
//! The word is an [`AtomicU64`] (the memzone's unit); the futex is its low
//! 32 bits, so a counter kept in it compares modulo 2^32. The futexes are
//! not `FUTEX_PRIVATE`: the memory is mapped by several processes.

use std::sync::atomic::AtomicU64;
use std::time::Duration;

#[cfg(not(target_endian = "little"))]
compile_error!("futex: the low half of a u64 word is at its address only on little-endian targets");

/// Sleeps while the low 32 bits of `word` are `expected`, until woken by
/// [`wake_all`], for at most `timeout` (or less: a signal, a spurious
/// wake-up). Returns at once if they differ. Callers re-check their
/// condition after it returns.
pub fn wait(word: &AtomicU64, expected: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: libc::c_long::from(timeout.subsec_nanos() as i32),
    };
    // SAFETY: `word` is a live, 8-byte-aligned atomic for the whole call;
    // FUTEX_WAIT only reads the 4 bytes at its address (its low half on a
    // little-endian target, checked above), compares them with `expected`
    // and sleeps; `ts` outlives the call. The result (woken, timed out,
    // EAGAIN when the value differs, EINTR) needs no handling: the caller
    // re-checks its condition either way.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr().cast::<u32>(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}

/// Wakes every process sleeping in [`wait`] on `word`.
pub fn wake_all(word: &AtomicU64) {
    // SAFETY: `word` is a live, aligned atomic; FUTEX_WAKE touches no
    // memory, it only wakes the waiters queued on that address.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr().cast::<u32>(),
            libc::FUTEX_WAKE,
            i32::MAX,
            std::ptr::null::<libc::timespec>(),
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;
    use std::sync::Arc;
    use std::time::Instant;

    #[test]
    fn a_waiter_returns_at_once_when_the_word_already_changed() {
        let w = AtomicU64::new(5);
        let t = Instant::now();
        wait(&w, 4, Duration::from_secs(5));
        assert!(t.elapsed() < Duration::from_secs(1));
    }

    #[test]
    fn a_waiter_times_out_when_nothing_happens() {
        let w = AtomicU64::new(1);
        let t = Instant::now();
        wait(&w, 1, Duration::from_millis(20));
        let e = t.elapsed();
        assert!(e >= Duration::from_millis(15), "{e:?}");
    }

    #[test]
    fn a_wake_ends_the_wait_long_before_its_timeout() {
        let w = Arc::new(AtomicU64::new(0));
        let w2 = w.clone();
        let waiter = std::thread::spawn(move || {
            let t = Instant::now();
            while w2.load(Ordering::Acquire) == 0 {
                wait(&w2, 0, Duration::from_secs(10));
            }
            t.elapsed()
        });
        std::thread::sleep(Duration::from_millis(50));
        w.fetch_add(1, Ordering::Release);
        wake_all(&w);
        let waited = waiter.join().unwrap();
        assert!(waited < Duration::from_secs(5), "{waited:?}");
    }
}
