//! The orchestrator as a test runs it: a platform config on a veth pair,
//! the daemon in a process group of its own (stopped with everything it
//! started when the test ends, even on failure), and `kpctl` against it.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use serde_json::Value;

use crate::platform::HUGEPAGE_MB;
use crate::{bin, bin_dir, repo_root, NetnsPair};

pub fn kpctl(endpoint: &str, args: &[&str]) -> Result<Value> {
    let out = Command::new(bin("kpctl"))
        .args(["--endpoint", endpoint, "--json"])
        .args(args)
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success(),
        "kpctl {args:?}: {}{}",
        text,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(text.lines().last().unwrap_or("null")).context("kpctl --json output")
}

/// How long a step may wait for its condition before the test is called
/// hung: far beyond what a slow, loaded machine needs.
pub const HUNG: Duration = Duration::from_secs(120);

pub fn wait_for(endpoint: &str, what: &str, done: impl Fn(&Value) -> bool) -> Result<Value> {
    let deadline = Instant::now() + HUNG;
    loop {
        // A busy daemon may answer late: a timeout is retried, not fatal.
        let s = kpctl(endpoint, &["status"]).unwrap_or_else(|e| Value::String(e.to_string()));
        if done(&s) {
            return Ok(s);
        }
        if Instant::now() > deadline {
            bail!("{what} did not happen: {s}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A platform config on `net` serving `ifs` (if_id, model), each with a
/// 2 s SLO and a 50% share, with `platform_extra` (TOML lines) added to
/// its `[platform]` table.
pub fn write_config(
    path: &std::path::Path,
    net: &NetnsPair,
    prefix: &str,
    ifs: &[(u16, &str)],
    platform_extra: &str,
) -> Result<()> {
    let ifs: Vec<Deploy<'_>> = ifs
        .iter()
        .map(|&(if_id, model)| Deploy {
            if_id,
            model,
            slo_ms: 2000.0,
            share_pct: 50.0,
        })
        .collect();
    write_config_with(path, net, prefix, &ifs, platform_extra)
}

/// One IF a config deploys at start ([`write_config_with`]).
#[derive(Clone, Copy, Debug)]
pub struct Deploy<'a> {
    /// Its if_id.
    pub if_id: u16,
    /// The model's name in the repository.
    pub model: &'a str,
    /// Its latency objective, ms.
    pub slo_ms: f64,
    /// Its share of the device, percent.
    pub share_pct: f64,
}

/// [`write_config`] with each IF's SLO and share given.
pub fn write_config_with(
    path: &std::path::Path,
    net: &NetnsPair,
    prefix: &str,
    ifs: &[Deploy<'_>],
    platform_extra: &str,
) -> Result<()> {
    let mut text = format!(
        r#"
[platform]
models = "{models}"
bin_dir = "{bins}"
tuning = false
{platform_extra}

[if_manager]
wrap = ["ip", "netns", "exec", "{ns}"]
options = ["--ip", "{ip}"]
eal = ["--lcores", "0@0", "--no-pci", "--no-telemetry", "--log-level", "lib.eal:error",
       "-m", "{mem}", "--vdev", "net_af_packet0,iface={iface},framesz=10240,blocksz=20480"]
file_prefix = "{prefix}"
"#,
        models = repo_root().join("models").display(),
        bins = bin_dir().display(),
        ns = net.get("PLATFORM_NS"),
        ip = net.get("PLATFORM_IP"),
        iface = net.get("PLATFORM_IF"),
        mem = HUGEPAGE_MB,
    );
    for d in ifs {
        text += &format!(
            "\n[[deploy]]\nif_id = {}\nmodel = \"{}\"\nslo_ms = {:?}\nshare_pct = {:?}\n",
            d.if_id, d.model, d.slo_ms, d.share_pct
        );
    }
    std::fs::write(path, text)?;
    Ok(())
}

/// How long a test waits for the orchestrator to exit after `shutdown`.
pub const SHUTDOWN_WAIT: Duration = Duration::from_secs(60);

/// The orchestrator in a process group of its own, so that whatever it
/// started (the if-manager, the IFs) is stopped with it if the test fails.
/// Its stdout and stderr are read from the start, by a thread each: a pipe
/// nobody reads fills (64 KiB of log) and then blocks the orchestrator.
#[derive(Debug)]
pub struct Orchestrator {
    child: Option<Child>,
    stdout: Option<std::thread::JoinHandle<Vec<u8>>>,
    stderr: Option<std::thread::JoinHandle<Vec<u8>>>,
    /// What it wrote on stderr so far, for a timeout's error.
    log: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
}

impl Orchestrator {
    pub fn start(config: &std::path::Path, runtime: &std::path::Path) -> Result<Orchestrator> {
        use std::os::unix::process::CommandExt;
        let child = Command::new(bin("orchestrator"))
            .arg("--config")
            .arg(config)
            .arg("--runtime-dir")
            .arg(runtime)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()?;
        let mut child = child;
        let mut out = child.stdout.take().context("stdout")?;
        let mut err = child.stderr.take().context("stderr")?;
        let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let stdout = std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = std::io::Read::read_to_end(&mut out, &mut buf);
            buf
        });
        let sink = log.clone();
        let stderr = std::thread::spawn(move || {
            let mut chunk = [0u8; 4096];
            while let Ok(n) = std::io::Read::read(&mut err, &mut chunk) {
                if n == 0 {
                    break;
                }
                sink.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .extend_from_slice(&chunk[..n]);
            }
            sink.lock().unwrap_or_else(|p| p.into_inner()).clone()
        });
        Ok(Orchestrator {
            child: Some(child),
            stdout: Some(stdout),
            stderr: Some(stderr),
            log,
        })
    }

    pub fn child(&mut self) -> &mut Child {
        self.child.as_mut().expect("running")
    }

    /// What it wrote on stderr so far.
    pub fn log(&self) -> String {
        String::from_utf8_lossy(&self.log.lock().unwrap_or_else(|p| p.into_inner())).into_owned()
    }

    /// Waits until its log satisfies `done`.
    pub fn wait_log(&self, what: &str, done: impl Fn(&str) -> bool) -> Result<()> {
        let deadline = Instant::now() + HUNG;
        while !done(&self.log()) {
            ensure!(
                Instant::now() < deadline,
                "{what} did not happen within {HUNG:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// Ends a test's `scenario` (run against it at `endpoint`): waits for
    /// it to exit (the scenario's last step sent `shutdown`) and returns
    /// the scenario's value and its output. If the scenario failed before
    /// its `shutdown`, sends one, so that the test fails at once with the
    /// scenario's error (and the log), not [`SHUTDOWN_WAIT`] later with a
    /// timeout that hides it.
    pub fn end<T>(self, endpoint: &str, scenario: Result<T>) -> Result<(T, std::process::Output)> {
        if scenario.is_err() {
            let _ = kpctl(endpoint, &["shutdown"]);
        }
        match (scenario, self.wait(SHUTDOWN_WAIT)) {
            (Ok(v), Ok(out)) => Ok((v, out)),
            (Ok(_), Err(e)) => Err(e),
            (Err(e), Ok(out)) => Err(e.context(format!(
                "orchestrator log:\n{}",
                String::from_utf8_lossy(&out.stderr)
            ))),
            (Err(e), Err(waiting)) => Err(e.context(format!("{waiting:#}"))),
        }
    }

    /// Waits for it to exit (after `shutdown`) and returns its output. Its own
    /// shutdown is bounded: IF processes get 10 s (SHUTDOWN_GRACE) before they
    /// are killed, the if-manager 10 s more, so [`SHUTDOWN_WAIT`] leaves room
    /// for a slow, loaded machine and still fails on a real hang.
    pub fn wait(mut self, timeout: Duration) -> Result<std::process::Output> {
        let deadline = Instant::now() + timeout;
        while self.child().try_wait()?.is_none() {
            if Instant::now() > deadline {
                let log = self.log.lock().unwrap_or_else(|p| p.into_inner()).clone();
                let text = String::from_utf8_lossy(&log);
                let lines: Vec<&str> = text.lines().collect();
                // The first lines say how it started going wrong, the last
                // where it is stuck.
                let head = lines.iter().take(40).copied().collect::<Vec<_>>();
                let tail = lines.iter().skip(40.max(lines.len().saturating_sub(20)));
                bail!(
                    "the orchestrator did not exit within {timeout:?}; its log ({} lines):\n{}\n...\n{}",
                    lines.len(),
                    head.join("\n"),
                    tail.copied().collect::<Vec<_>>().join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let status = self.child.take().expect("running").wait()?;
        let join = |h: Option<std::thread::JoinHandle<Vec<u8>>>| {
            h.map(|h| h.join().unwrap_or_default()).unwrap_or_default()
        };
        Ok(std::process::Output {
            status,
            stdout: join(self.stdout.take()),
            stderr: join(self.stderr.take()),
        })
    }
}

impl Drop for Orchestrator {
    fn drop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let group = format!("-{}", child.id());
        let kill = |sig: &str| {
            let _ = Command::new("kill")
                .args([sig, "--", &group])
                .stderr(Stdio::null())
                .status();
        };
        kill("-TERM");
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline && matches!(child.try_wait(), Ok(None)) {
            std::thread::sleep(Duration::from_millis(50));
        }
        kill("-KILL");
        let _ = child.wait();
    }
}

pub fn all_active(s: &Value, n: usize) -> bool {
    s["ifs"]
        .as_array()
        .is_some_and(|a| a.len() == n && a.iter().all(|r| r["state"] == "active"))
}
