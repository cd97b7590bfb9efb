//! The Environment Abstraction Layer: DPDK's process-wide runtime.

use std::ffi::{CStr, CString};
use std::os::raw::{c_char, c_int};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use dpdk_sys as sys;

use crate::error::{c_name, check_errno, last_error};
use crate::live::{self, EAL_STATE, INITIALISING, RUNNING, UNINIT};
use crate::{DpdkError, LcoreId, SocketId};

/// Which role this process has in its DPDK instance (`--file-prefix`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProcessType {
    /// Owns the shared memory and the devices (the if-manager).
    Primary,
    /// Attached to a primary's memory (`--proc-type=secondary`; the IFs).
    Secondary,
}

/// The initialised EAL. One per process, ever: `rte_eal_init` cannot run
/// twice, so a second [`Eal::init`] returns
/// [`DpdkError::EalAlreadyInitialised`].
///
/// [`cleanup`](Eal::cleanup) (or dropping it) runs `rte_eal_cleanup` and,
/// in a primary, removes the hugepage files and runtime directory DPDK
/// leaves behind for this instance's `--file-prefix`. It is refused while
/// any DPDK handle or mbuf of this process is alive.
#[derive(Debug)]
pub struct Eal {
    process_type: ProcessType,
    args_consumed: usize,
    runtime_dir: PathBuf,
    huge_dir: Option<PathBuf>,
    cleaned: bool,
}

unsafe extern "C" {
    /// The C library's standard error stream.
    static stderr: *mut sys::FILE;
}

impl Eal {
    /// Initialises the EAL with `args`, program name first (as `argv`):
    /// e.g. `["if-manager", "-l", "0", "--file-prefix", "kp", "--vdev",
    /// "net_pcap0,rx_pcap=in.pcap"]`. Arguments after a `--` are left
    /// alone; [`args_consumed`](Eal::args_consumed) says how many DPDK
    /// parsed.
    ///
    /// DPDK's log goes to standard error only (DPDK's default also copies
    /// every line to syslog); standard output stays the program's own.
    pub fn init(args: &[String]) -> Result<Eal, DpdkError> {
        const OP: &str = "rte_eal_init";
        if args.is_empty() {
            return Err(DpdkError::InvalidArgument {
                op: OP,
                reason: "no arguments: argv[0], the program name, comes first".into(),
            });
        }
        let cargs = args
            .iter()
            .map(|a| c_name(OP, a))
            .collect::<Result<Vec<CString>, _>>()?;
        let argc = c_int::try_from(args.len()).map_err(|_| DpdkError::InvalidArgument {
            op: OP,
            reason: "too many arguments".into(),
        })?;
        EAL_STATE
            .compare_exchange(UNINIT, INITIALISING, Ordering::SeqCst, Ordering::SeqCst)
            .map_err(|_| DpdkError::EalAlreadyInitialised)?;

        // DPDK may keep pointers into argv (openlog() keeps its identity
        // string), and getopt permutes the array: both live for the rest
        // of the process. A few bytes, once.
        let argv: &'static mut [*mut c_char] = Box::leak(
            cargs
                .into_iter()
                .map(CString::into_raw)
                .chain(std::iter::once(std::ptr::null_mut()))
                .collect::<Box<[_]>>(),
        );
        // SAFETY:
        // - `stderr` is the C library's stream, initialised before `main`.
        let err_stream = unsafe { stderr };
        // SAFETY:
        // - `err_stream` is a valid, open `FILE *` for the whole process;
        //   DPDK only writes log lines to it.
        unsafe { sys::rte_openlog_stream(err_stream) };
        // SAFETY:
        // - `argv` holds `argc` valid C strings followed by NULL, alive
        //   (leaked) for the rest of the process;
        // - the state machine above lets exactly one thread get here at a
        //   time, and never again after a success.
        let ret = unsafe { sys::rte_eal_init(argc, argv.as_mut_ptr()) };
        if ret < 0 {
            let err = last_error(OP);
            // DPDK itself refuses a retry where one is unsafe (EALREADY).
            EAL_STATE.store(UNINIT, Ordering::SeqCst);
            return Err(err);
        }
        // SAFETY:
        // - the EAL is initialised.
        let process_type = match unsafe { sys::rte_eal_process_type() } {
            sys::RTE_PROC_PRIMARY => ProcessType::Primary,
            _ => ProcessType::Secondary,
        };
        // SAFETY:
        // - the EAL is initialised; no other precondition.
        let runtime_dir = unsafe { sys::rte_eal_get_runtime_dir() };
        // SAFETY:
        // - DPDK returns a NUL-terminated string in a static buffer, copied
        //   out at once.
        let runtime_dir = unsafe { CStr::from_ptr(runtime_dir) };
        let runtime_dir = PathBuf::from(runtime_dir.to_string_lossy().into_owned());
        EAL_STATE.store(RUNNING, Ordering::SeqCst);
        Ok(Eal {
            process_type,
            args_consumed: ret as usize,
            runtime_dir,
            huge_dir: huge_dir_arg(args),
            cleaned: false,
        })
    }

    /// How many arguments after `argv[0]` DPDK parsed, a terminating `--`
    /// included (`rte_eal_init`'s return value): the program's own
    /// arguments are `args[args_consumed() + 1..]`.
    pub fn args_consumed(&self) -> usize {
        self.args_consumed
    }

    /// Primary or secondary.
    pub fn process_type(&self) -> ProcessType {
        self.process_type
    }

    /// The instance's `--file-prefix` (`rte` by default).
    pub fn file_prefix(&self) -> &str {
        self.runtime_dir
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("")
    }

    /// The instance's runtime directory (`/var/run/dpdk/<prefix>` as root).
    pub fn runtime_dir(&self) -> &Path {
        &self.runtime_dir
    }

    /// The main lcore (the thread that called [`init`](Eal::init)).
    pub fn main_lcore(&self) -> LcoreId {
        // SAFETY:
        // - the EAL is initialised (`self` exists).
        LcoreId(unsafe { sys::rte_get_main_lcore() })
    }

    /// Number of lcores the EAL was given.
    pub fn lcore_count(&self) -> u32 {
        // SAFETY:
        // - the EAL is initialised.
        unsafe { sys::rte_lcore_count() }
    }

    /// The calling thread's lcore, or `None` for a thread the EAL did not
    /// create or register (e.g. a `std::thread`).
    pub fn lcore_id(&self) -> Option<LcoreId> {
        // SAFETY:
        // - reads a thread-local; valid on any thread.
        let id = unsafe { sys::kp_rte_lcore_id() };
        (id != sys::LCORE_ID_ANY).then_some(LcoreId(id))
    }

    /// The calling thread's NUMA socket ([`SocketId::ANY`] for a thread
    /// that is not an lcore).
    pub fn socket_id(&self) -> SocketId {
        // SAFETY:
        // - reads a thread-local; valid on any thread.
        SocketId(unsafe { sys::rte_socket_id() } as i32)
    }

    /// Time-stamp counter ticks per second, as the EAL measured them.
    pub fn tsc_hz(&self) -> u64 {
        // SAFETY:
        // - the EAL is initialised (it calibrates the TSC in `init`).
        unsafe { sys::rte_get_tsc_hz() }
    }

    /// The time-stamp counter now (`rdtsc`).
    #[inline]
    pub fn tsc_cycles() -> u64 {
        // SAFETY:
        // - reads the CPU's counter; no precondition.
        unsafe { sys::kp_rte_get_tsc_cycles() }
    }

    /// The CPU's spin-wait hint, for busy-poll loops.
    #[inline]
    pub fn pause() {
        // SAFETY:
        // - a CPU hint instruction; no precondition.
        unsafe { sys::kp_rte_pause() }
    }

    /// Runs `rte_eal_cleanup` and, in a primary, removes the files DPDK
    /// leaves behind for this instance (see [`Eal::try_cleanup`]).
    pub fn cleanup(mut self) -> Result<(), DpdkError> {
        self.try_cleanup()
    }

    /// Like [`cleanup`](Eal::cleanup), but keeps the `Eal` so that a refused
    /// cleanup ([`DpdkError::EalInUse`]) can be retried once the handles
    /// are gone. Cleaning up twice is a no-op.
    ///
    /// In a primary, after `rte_eal_cleanup` it removes what DPDK 22.11
    /// leaves behind: the hugepage files `<prefix>map_<n>` in every
    /// hugetlbfs mount (and in `--huge-dir`, if given), and the runtime
    /// directory `/var/run/dpdk/<prefix>` (config, fbarrays, sockets). It
    /// touches no other prefix's files. Secondaries own no files.
    pub fn try_cleanup(&mut self) -> Result<(), DpdkError> {
        if self.cleaned {
            return Ok(());
        }
        live::begin_cleanup()?;
        // SAFETY:
        // - the EAL runs and nothing of this process points into its memory
        //   any more (no handle, no mbuf; new ones are refused from now on).
        let ret = unsafe { sys::rte_eal_cleanup() };
        EAL_STATE.store(live::DONE, Ordering::SeqCst);
        self.cleaned = true;
        check_errno("rte_eal_cleanup", ret)?;
        if self.process_type == ProcessType::Primary {
            remove_instance_files(&self.runtime_dir, self.huge_dir.as_deref())?;
        }
        Ok(())
    }
}

impl Drop for Eal {
    fn drop(&mut self) {
        // Best effort: refused while handles live (then the process exit
        // releases the memory and the files stay).
        let _ = self.try_cleanup();
    }
}

/// The `--huge-dir` argument, if any (before a `--`).
fn huge_dir_arg(args: &[String]) -> Option<PathBuf> {
    let mut it = args.iter().skip(1).take_while(|a| *a != "--");
    let mut found = None;
    while let Some(a) = it.next() {
        if let Some(v) = a.strip_prefix("--huge-dir=") {
            found = Some(PathBuf::from(v));
        } else if a == "--huge-dir" {
            found = it.next().map(PathBuf::from);
        }
    }
    found
}

/// True for DPDK's hugepage file names of `prefix`: `<prefix>map_<digits>`.
fn is_hugepage_file_of(name: &str, prefix: &str) -> bool {
    name.strip_prefix(prefix)
        .and_then(|rest| rest.strip_prefix("map_"))
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// Mount points of hugetlbfs file systems, from a `/proc/mounts` text.
fn hugetlbfs_mounts(mounts: &str) -> Vec<PathBuf> {
    mounts
        .lines()
        .filter_map(|line| {
            let mut f = line.split_whitespace();
            let (_dev, dir, fstype) = (f.next()?, f.next()?, f.next()?);
            (fstype == "hugetlbfs").then(|| PathBuf::from(unescape_mount_path(dir)))
        })
        .collect()
}

/// Undoes `/proc/mounts`' octal escapes (`\040` for a space, ...).
fn unescape_mount_path(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Removes this instance's hugepage files and runtime directory.
fn remove_instance_files(runtime_dir: &Path, huge_dir: Option<&Path>) -> Result<(), DpdkError> {
    let Some(prefix) = runtime_dir
        .file_name()
        .and_then(|n| n.to_str())
        .filter(|p| !p.is_empty())
    else {
        return Ok(());
    };
    let mut dirs = hugetlbfs_mounts(&std::fs::read_to_string("/proc/mounts").unwrap_or_default());
    if let Some(d) = huge_dir {
        if !dirs.iter().any(|x| x == d) {
            dirs.push(d.to_owned());
        }
    }
    let mut first_error = None;
    let mut note = |path: PathBuf, r: std::io::Result<()>| match r {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            first_error.get_or_insert(DpdkError::Cleanup { path, source: e });
        }
        _ => {}
    };
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            if name
                .to_str()
                .is_some_and(|n| is_hugepage_file_of(n, prefix))
            {
                let path = entry.path();
                let r = std::fs::remove_file(&path);
                note(path, r);
            }
        }
    }
    // Only a directory named after the prefix, under a `dpdk` directory.
    if runtime_dir
        .parent()
        .and_then(Path::file_name)
        .is_some_and(|p| p == "dpdk")
    {
        let r = std::fs::remove_dir_all(runtime_dir);
        note(runtime_dir.to_owned(), r);
    }
    first_error.map_or(Ok(()), Err)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn hugepage_files_match_only_their_own_prefix() {
        assert!(is_hugepage_file_of("rtemap_0", "rte"));
        assert!(is_hugepage_file_of("kp-1map_123", "kp-1"));
        assert!(!is_hugepage_file_of("rte2map_0", "rte"));
        assert!(!is_hugepage_file_of("rtemap_", "rte"));
        assert!(!is_hugepage_file_of("rtemap_0x", "rte"));
        assert!(!is_hugepage_file_of("xmap_map_0", "x"));
        assert!(!is_hugepage_file_of("rtemap_0", "rt"));
        assert!(!is_hugepage_file_of("other", "rte"));
    }

    #[test]
    fn huge_dir_is_read_in_both_spellings_and_not_past_double_dash() {
        assert_eq!(
            huge_dir_arg(&args(&["p", "--huge-dir", "/mnt/h"])),
            Some("/mnt/h".into())
        );
        assert_eq!(
            huge_dir_arg(&args(&["p", "-l", "0", "--huge-dir=/h2"])),
            Some("/h2".into())
        );
        assert_eq!(huge_dir_arg(&args(&["p", "--", "--huge-dir", "/x"])), None);
        // argv[0] is never an option.
        assert_eq!(huge_dir_arg(&args(&["--huge-dir=/x"])), None);
    }

    #[test]
    fn hugetlbfs_mounts_are_found_and_unescaped() {
        let text = "sysfs /sys sysfs rw 0 0\n\
                    nodev /dev/hugepages hugetlbfs rw,relatime,pagesize=2M 0 0\n\
                    none /mnt/huge\\0401g hugetlbfs rw,pagesize=1024M 0 0\n";
        assert_eq!(
            hugetlbfs_mounts(text),
            vec![
                PathBuf::from("/dev/hugepages"),
                PathBuf::from("/mnt/huge 1g")
            ]
        );
    }

    #[test]
    fn removal_keeps_other_prefixes() {
        let tmp = std::env::temp_dir().join(format!("kp-dpdk-unit-{}", std::process::id()));
        let huge = tmp.join("huge");
        let run = tmp.join("run").join("dpdk").join("kp-x");
        std::fs::create_dir_all(&huge).unwrap();
        std::fs::create_dir_all(&run).unwrap();
        for f in [
            "kp-xmap_0",
            "kp-xmap_17",
            "kp-x2map_0",
            "rtemap_0",
            "kp-xmap_0.bak",
        ] {
            std::fs::write(huge.join(f), b"").unwrap();
        }
        std::fs::write(run.join("config"), b"").unwrap();
        remove_instance_files(&run, Some(&huge)).unwrap();
        let mut left: Vec<String> = std::fs::read_dir(&huge)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(left, ["kp-x2map_0", "kp-xmap_0.bak", "rtemap_0"]);
        assert!(!run.exists());
        std::fs::remove_dir_all(&tmp).unwrap();
    }

    #[test]
    fn init_needs_a_program_name_and_rejects_nul() {
        assert!(matches!(
            Eal::init(&[]),
            Err(DpdkError::InvalidArgument { .. })
        ));
        assert!(matches!(
            Eal::init(&args(&["p", "a\0b"])),
            Err(DpdkError::InvalidName { .. })
        ));
    }
}
