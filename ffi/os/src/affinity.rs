//! CPU affinity of the calling thread (the CPU form of a resource share),
//! and the machine-wide monotonic clock.
//!
//! DPDK pins each lcore's thread itself (`--lcores ID@CPUS`); the other
//! threads of a process — an inference engine's intra-op pool, the
//! inference thread — are pinned here, to the cores the orchestrator gave
//! the process. A thread created afterwards inherits its creator's mask, so
//! pinning a thread before it starts an engine's thread pool pins the pool.
//! This is the one Linux call outside DPDK that the data path needs; it
//! lives in `ffi/`, at the unsafe edge, beside the DPDK wrapper.

use std::io;

/// Restricts the calling thread to `cpus` (CPU numbers as the kernel counts
/// them). An empty list, a CPU beyond the mask's range, or one the process
/// may not use is an error, and the mask is left as it was.
pub fn set_current_thread_cpus(cpus: &[usize]) -> io::Result<()> {
    if cpus.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "an empty CPU set",
        ));
    }
    let max = 8 * std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: cpu_set_t is a plain bit array; all zeroes is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &cpu in cpus {
        if cpu >= max {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("CPU {cpu} is beyond the {max} a CPU set can name"),
            ));
        }
        // SAFETY: `cpu` is below the set's size (checked just above).
        unsafe { libc::CPU_SET(cpu, &mut set) };
    }
    // SAFETY: `set` is a valid, initialised cpu_set_t of the size we pass;
    // pid 0 means the calling thread; the kernel only reads it.
    let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The CPUs the calling thread may run on.
pub fn current_thread_cpus() -> io::Result<Vec<usize>> {
    // SAFETY: as above, all zeroes is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is writable and of the size we pass; pid 0 is the
    // calling thread.
    let rc = unsafe { libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    let max = 8 * std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: CPU_ISSET reads a bit of an initialised set, in range.
    Ok((0..max)
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect())
}

/// `CLOCK_MONOTONIC` in nanoseconds: one clock for every process of the
/// machine (unlike `std::time::Instant`, whose values cannot be exchanged),
/// so a switchover gap can be measured from one IF's last dequeue to the
/// next one's first.
pub fn monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// CPU time the calling thread has used, ns (`CLOCK_THREAD_CPUTIME_ID`):
/// what a hot loop costs, as opposed to how long it ran. A system call (no
/// vDSO for this clock): call it per tick, not per packet.
pub fn thread_cpu_ns() -> u64 {
    clock_ns(libc::CLOCK_THREAD_CPUTIME_ID)
}

/// A clock that always exists on Linux, in ns.
fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the callers pass
    // CLOCK_MONOTONIC or the calling thread's CPU clock, which always exist
    // on Linux, so the call cannot fail.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Whether a process with this pid is alive (exists and is not a zombie
/// waiting for its parent to reap it).
///
/// Dead means known dead: `/proc/PID` is not there (or the process went
/// while it was read), or its state is a zombie's. Any other failure to
/// read it (no file descriptor left, no memory) says nothing, and the
/// process counts as alive: the callers act on a death (take the ring of a
/// dead owner, whose live one would then have two consumers; answer its
/// requests INTERNAL) and merely wait longer on a life.
pub fn process_alive(pid: u32) -> bool {
    pid != 0 && alive_from_stat(std::fs::read_to_string(format!("/proc/{pid}/stat")))
}

/// [`process_alive`]'s reading of `/proc/PID/stat`.
fn alive_from_stat(stat: std::io::Result<String>) -> bool {
    let stat = match stat {
        Ok(stat) => stat,
        Err(e) => {
            return !(e.kind() == std::io::ErrorKind::NotFound
                || e.raw_os_error() == Some(libc::ESRCH));
        }
    };
    // "pid (comm) S ...": the state follows the last ')'.
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.trim_start().chars().next());
    !matches!(state, None | Some('Z' | 'X'))
}

/// A Linux CPU list that does not parse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("bad CPU list {list:?}: {reason}")]
pub struct CpuListError {
    /// The list.
    pub list: String,
    /// What is wrong with it.
    pub reason: String,
}

/// Parses a Linux CPU list (`0-3,8,10-11`, as in `Cpus_allowed_list`,
/// `local_cpulist`, `taskset -c`) into ascending, distinct CPU numbers.
/// Whitespace around items is ignored; an empty list is empty (a NUMA node
/// without CPUs has one), so a caller that needs a CPU checks for none.
pub fn parse_cpu_list(list: &str) -> Result<Vec<usize>, CpuListError> {
    let bad = |reason: String| CpuListError {
        list: list.to_string(),
        reason,
    };
    let num = |s: &str| {
        s.trim()
            .parse::<usize>()
            .map_err(|e| bad(format!("{:?}: {e}", s.trim())))
    };
    let mut out = std::collections::BTreeSet::new();
    for item in list
        .trim()
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
    {
        match item.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (num(a)?, num(b)?);
                if a > b {
                    return Err(bad(format!("range {item} runs backwards")));
                }
                // Larger than any machine: a typo, not a list to expand.
                if b - a >= 1 << 16 {
                    return Err(bad(format!("range {item} is too large")));
                }
                out.extend(a..=b);
            }
            None => {
                out.insert(num(item)?);
            }
        }
    }
    Ok(out.into_iter().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_process_known_gone_or_a_zombie_is_dead() {
        use std::io::{Error, ErrorKind};
        let stat = |state: &str| Ok(format!("42 (kp-if (x)) {state} 1 42 42 0 -1"));
        assert!(alive_from_stat(stat("R")));
        assert!(alive_from_stat(stat("S")));
        assert!(!alive_from_stat(stat("Z")));
        assert!(!alive_from_stat(stat("X")));
        assert!(!alive_from_stat(Ok("garbage".into())));
        assert!(!alive_from_stat(Err(ErrorKind::NotFound.into())));
        assert!(!alive_from_stat(Err(Error::from_raw_os_error(libc::ESRCH))));
        // Not knowing is not dead.
        assert!(alive_from_stat(Err(Error::from_raw_os_error(libc::EMFILE))));
        assert!(alive_from_stat(Err(Error::from_raw_os_error(libc::ENOMEM))));
    }

    #[test]
    fn this_process_is_alive_and_pid_0_is_not() {
        assert!(process_alive(std::process::id()));
        assert!(!process_alive(0));
        assert!(!process_alive(u32::MAX));
        let t0 = monotonic_ns();
        assert!(monotonic_ns() >= t0 && t0 > 0);
    }

    #[test]
    fn a_thread_cpu_clock_counts_work_and_not_sleep() {
        std::thread::spawn(|| {
            let t0 = thread_cpu_ns();
            std::thread::sleep(std::time::Duration::from_millis(30));
            let slept = thread_cpu_ns() - t0;
            let t1 = thread_cpu_ns();
            let mut x = 0u64;
            while thread_cpu_ns() - t1 < 20_000_000 {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
            }
            let worked = thread_cpu_ns() - t1;
            assert!(slept < 10_000_000, "30 ms asleep cost {slept} ns of CPU");
            assert!(worked >= 20_000_000, "{worked}");
        })
        .join()
        .unwrap();
    }

    #[test]
    fn cpu_lists_parse_like_the_kernel_writes_them() {
        assert_eq!(
            parse_cpu_list("0-3,6,8-9").unwrap(),
            vec![0, 1, 2, 3, 6, 8, 9]
        );
        assert_eq!(parse_cpu_list("1, 1,0").unwrap(), vec![0, 1]);
        assert_eq!(parse_cpu_list(" 0-2,8, 4 \n").unwrap(), vec![0, 1, 2, 4, 8]);
        assert_eq!(parse_cpu_list("").unwrap(), Vec::<usize>::new());
        assert_eq!(parse_cpu_list(",").unwrap(), Vec::<usize>::new());
        for bad in ["x", "3-1", "1-", "0-7:2", "0-99999999"] {
            let e = parse_cpu_list(bad).unwrap_err();
            assert_eq!(e.list, bad, "{e}");
        }
    }

    #[test]
    fn a_thread_is_pinned_and_its_children_inherit_the_mask() {
        std::thread::spawn(|| {
            let all = current_thread_cpus().unwrap();
            let first = all[0];
            set_current_thread_cpus(&[first]).unwrap();
            assert_eq!(current_thread_cpus().unwrap(), vec![first]);
            let child = std::thread::spawn(|| current_thread_cpus().unwrap());
            assert_eq!(child.join().unwrap(), vec![first]);
            assert!(set_current_thread_cpus(&[]).is_err());
            assert!(set_current_thread_cpus(&[1 << 20]).is_err());
            assert_eq!(current_thread_cpus().unwrap(), vec![first], "unchanged");
        })
        .join()
        .unwrap();
    }
}
