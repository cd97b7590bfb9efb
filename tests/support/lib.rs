//! Shared plumbing for kneepoint's cross-process tests.
//!
//! The tests run the real binaries (`if-manager`, `kp-gen`, `kp-client`,
//! `kp-ring-probe`) built by `make test` into the same target directory as
//! the test executables, on real DPDK with real hugepages. Each DPDK
//! instance gets its own `--file-prefix` (a primary deletes other
//! prefixes' unlocked hugepage files on a shared mount) and each process a
//! distinct lcore id (mempool caches are shared memory indexed by lcore).

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value;

/// The directory holding the workspace's binaries for this build profile
/// (the parent of the test executable's `deps/` directory).
pub fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    exe.parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps/<test>")
        .to_path_buf()
}

/// Path of one of the workspace's binaries; fails with a hint if missing.
pub fn bin(name: &str) -> PathBuf {
    let p = bin_dir().join(name);
    assert!(
        p.exists(),
        "{} not built: run `make test` (it builds the binaries first)",
        p.display()
    );
    p
}

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("repo root").to_path_buf()
}

/// A fresh scratch directory under the target dir, removed on drop.
#[derive(Debug)]
pub struct Scratch(pub PathBuf);

impl Scratch {
    /// Creates `target/kp-tests/<name>-<pid>`.
    pub fn new(name: &str) -> Scratch {
        let dir = bin_dir().join("kp-tests").join(format!("{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create scratch dir");
        Scratch(dir)
    }

    /// A path inside the scratch directory.
    pub fn path(&self, file: &str) -> PathBuf {
        self.0.join(file)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// A unique DPDK `--file-prefix` for one test instance.
pub fn file_prefix(test: &str) -> String {
    format!("kpt-{test}-{}", std::process::id())
}

/// Runs a command to completion; fails with its output if it fails.
pub fn run(cmd: &mut Command) -> Result<String> {
    let out = cmd.output().with_context(|| format!("spawning {cmd:?}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        bail!(
            "{cmd:?} failed ({}):\nstdout:\n{stdout}\nstderr:\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(stdout)
}

/// A running `if-manager`.
#[derive(Debug)]
pub struct IfManager {
    child: Option<Child>,
    stderr_lines: Receiver<String>,
    stderr_log: Vec<String>,
}

impl IfManager {
    /// Starts `[prefix...] if-manager OPTIONS -- EAL` and waits for it to
    /// report ready. `wrap` runs it under another command (e.g.
    /// `ip netns exec NS`).
    pub fn start(wrap: &[&str], options: &[String], eal: &[String]) -> Result<IfManager> {
        let exe = bin("if-manager");
        let mut cmd = match wrap.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(&exe);
                c
            }
            None => Command::new(&exe),
        };
        cmd.args(options).arg("--").args(eal);
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).stdin(Stdio::null());
        let mut child = cmd.spawn().with_context(|| format!("spawning {cmd:?}"))?;
        let stderr = child.stderr.take().expect("piped stderr");
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut m = IfManager {
            child: Some(child),
            stderr_lines: rx,
            stderr_log: Vec::new(),
        };
        m.wait_for_stderr("if-manager: ready", Duration::from_secs(30))?;
        Ok(m)
    }

    fn wait_for_stderr(&mut self, needle: &str, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.stderr_lines.recv_timeout(left.max(Duration::from_millis(1))) {
                Ok(line) => {
                    let hit = line.contains(needle);
                    self.stderr_log.push(line);
                    if hit {
                        return Ok(());
                    }
                }
                Err(_) => {
                    let status = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten());
                    bail!(
                        "if-manager not ready ({needle:?} not seen; exit status {status:?}); stderr:\n{}",
                        self.stderr_log.join("\n")
                    );
                }
            }
        }
    }

    /// The process id (for signals).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(Child::id).unwrap_or(0)
    }

    /// Sends SIGTERM and returns the final JSON report it prints.
    pub fn stop(self) -> Result<Value> {
        run(Command::new("kill").arg("-TERM").arg(self.pid().to_string()))?;
        self.wait_report(Duration::from_secs(20))
    }

    /// Waits for it to exit by itself (e.g. `--exit-when-idle`) and returns
    /// its final report.
    pub fn wait_report(mut self, timeout: Duration) -> Result<Value> {
        let mut child = self.child.take().expect("running");
        let deadline = Instant::now() + timeout;
        let status = loop {
            if let Some(s) = child.try_wait()? {
                break s;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                bail!("if-manager did not exit within {timeout:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut out = String::new();
        child.stdout.take().expect("piped").read_to_string(&mut out)?;
        while let Ok(line) = self.stderr_lines.recv_timeout(Duration::from_millis(100)) {
            self.stderr_log.push(line);
        }
        if !status.success() {
            bail!("if-manager exited with {status}; stderr:\n{}", self.stderr_log.join("\n"));
        }
        let last = out.lines().last().ok_or_else(|| anyhow!("if-manager printed no report"))?;
        serde_json::from_str(last).with_context(|| format!("final report is not JSON: {last}"))
    }
}

impl Drop for IfManager {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("kill").arg("-TERM").arg(c.id().to_string()).status();
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = c.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// True if no hugepage file or runtime directory of `prefix` is left.
pub fn dpdk_files_left(prefix: &str) -> Vec<PathBuf> {
    let mut left = Vec::new();
    for dir in ["/dev/hugepages", "/var/run/dpdk"] {
        if let Ok(entries) = std::fs::read_dir(dir) {
            for e in entries.flatten() {
                if e.file_name().to_string_lossy().starts_with(prefix) {
                    left.push(e.path());
                }
            }
        }
    }
    left
}

/// Reads a JSON file.
pub fn read_json(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

/// A pair of network namespaces joined by a veth pair (scripts/netns.sh).
#[derive(Debug)]
pub struct NetnsPair {
    /// Name given to netns.sh.
    pub name: String,
    /// KEY=VALUE facts printed by `netns.sh up`.
    pub facts: std::collections::BTreeMap<String, String>,
}

impl NetnsPair {
    /// Creates the pair, or fails loudly saying why (no silent pass).
    pub fn up(name: &str) -> Result<NetnsPair> {
        let script = repo_root().join("scripts/netns.sh");
        let _ = Command::new(&script).args(["down", name]).output();
        let out = run(Command::new(&script).args(["up", name])).context(
            "CANNOT CREATE NETWORK NAMESPACES: this test needs root and `ip netns` (iproute2)",
        )?;
        let facts = out
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
            .collect();
        Ok(NetnsPair {
            name: name.to_string(),
            facts,
        })
    }

    /// One fact (CLIENT_NS, PLATFORM_IF, CLIENT_MAC, ...).
    pub fn get(&self, key: &str) -> &str {
        self.facts
            .get(key)
            .unwrap_or_else(|| panic!("netns.sh did not print {key}: {:?}", self.facts))
    }
}

impl Drop for NetnsPair {
    fn drop(&mut self) {
        let _ = Command::new(repo_root().join("scripts/netns.sh"))
            .args(["down", &self.name])
            .output();
    }
}
