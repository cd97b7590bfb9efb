//! The child processes the orchestrator runs, and how it talks to them.
//!
//! A [`Proc`] is a spawned child whose stderr a thread reads line by line:
//! into a log file, into a short in-memory tail (for error messages), and
//! against a "ready" line the child prints once it serves. Its stdout's last
//! line is its final JSON report. Nothing here blocks for long: the daemon's
//! loop polls [`Proc::is_ready`] and [`Proc::poll_exit`].

use std::collections::VecDeque;
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use libml::messages::{ErrorBody, IfCommand, IfStatus};
use serde_json::Value;

/// Stderr lines kept in memory per process.
const TAIL: usize = 40;

/// A child process.
#[derive(Debug)]
pub struct Proc {
    name: String,
    child: Child,
    pid: u32,
    ready: Arc<AtomicBool>,
    tail: Arc<Mutex<VecDeque<String>>>,
    stdout: Arc<Mutex<String>>,
    exit: Option<ExitStatus>,
    started: Instant,
}

impl Proc {
    /// Spawns `cmd`; its stderr goes to `log` (appended) and is watched for
    /// a line containing `ready`.
    pub fn spawn(
        name: impl Into<String>,
        mut cmd: Command,
        ready: &'static str,
        log: &Path,
    ) -> std::io::Result<Proc> {
        let name = name.into();
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn()?;
        let pid = child.id();
        let flag = Arc::new(AtomicBool::new(false));
        let tail = Arc::new(Mutex::new(VecDeque::with_capacity(TAIL)));
        let stdout_buf = Arc::new(Mutex::new(String::new()));
        let mut log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .ok();
        if let Some(stderr) = child.stderr.take() {
            let (flag, tail) = (flag.clone(), tail.clone());
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    if line.contains(ready) {
                        flag.store(true, Ordering::Release);
                    }
                    if let Some(f) = log.as_mut() {
                        let _ = writeln!(f, "{line}");
                    }
                    let mut t = tail.lock().unwrap_or_else(|p| p.into_inner());
                    if t.len() == TAIL {
                        t.pop_front();
                    }
                    t.push_back(line);
                }
            });
        }
        if let Some(mut stdout) = child.stdout.take() {
            let buf = stdout_buf.clone();
            std::thread::spawn(move || {
                let mut s = String::new();
                let _ = stdout.read_to_string(&mut s);
                *buf.lock().unwrap_or_else(|p| p.into_inner()) = s;
            });
        }
        Ok(Proc {
            name,
            child,
            pid,
            ready: flag,
            tail,
            stdout: stdout_buf,
            exit: None,
            started: Instant::now(),
        })
    }

    /// What it is, for logs.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its pid.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Whether it printed its ready line.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    /// Whether it runs but has not printed its ready line yet (as of the
    /// last [`Proc::poll_exit`]).
    pub fn is_starting(&self) -> bool {
        self.exit.is_none() && !self.is_ready()
    }

    /// How long ago it was started.
    pub fn age(&self) -> Duration {
        self.started.elapsed()
    }

    /// Its exit status, once it exited (reaps it).
    pub fn poll_exit(&mut self) -> Option<ExitStatus> {
        if self.exit.is_none() {
            self.exit = self.child.try_wait().ok().flatten();
        }
        self.exit
    }

    /// Asks it to stop (SIGTERM): IFs answer what they hold and exit.
    pub fn terminate(&self) {
        if self.exit.is_none() {
            signal(self.pid, "TERM");
        }
    }

    /// Kills it (SIGKILL).
    pub fn kill(&mut self) {
        if self.exit.is_none() {
            let _ = self.child.kill();
        }
    }

    /// Waits up to `timeout` for it to exit; kills it after that.
    pub fn wait_or_kill(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(s) = self.poll_exit() {
                return Some(s);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.kill();
        let _ = self.child.wait();
        self.poll_exit()
    }

    /// Its final report: the last stdout line, once it exited and printed
    /// one that is JSON.
    pub fn report(&self) -> Option<Value> {
        let out = self.stdout.lock().unwrap_or_else(|p| p.into_inner());
        out.lines()
            .last()
            .and_then(|l| serde_json::from_str(l).ok())
    }

    /// Its last stderr lines, for an error message.
    pub fn tail(&self) -> String {
        let t = self.tail.lock().unwrap_or_else(|p| p.into_inner());
        t.iter().cloned().collect::<Vec<_>>().join("\n")
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        // Never leave a child behind: an orchestrator that drops a process
        // handle has stopped caring about it.
        if self.poll_exit().is_none() {
            self.terminate();
            self.wait_or_kill(Duration::from_secs(5));
        }
    }
}

/// Sends SIGNAL (a name: TERM, KILL) to `pid`.
pub fn signal(pid: u32, name: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// One JSON request to a ZeroMQ REP socket (an IF's `--listen`, the
/// if-manager's `--control`): a command of `libml::messages`; the reply,
/// or why there is none. A reply with `"ok": false` is an error carrying
/// its code and message.
pub fn request(
    endpoint: &str,
    cmd: &impl serde::Serialize,
    timeout: Duration,
) -> Result<Value, String> {
    let ctx = zmq::Context::new();
    let sock = ctx.socket(zmq::REQ).map_err(|e| e.to_string())?;
    sock.set_linger(0).map_err(|e| e.to_string())?;
    sock.set_rcvtimeo(timeout.as_millis() as i32)
        .map_err(|e| e.to_string())?;
    sock.connect(endpoint)
        .map_err(|e| format!("cannot connect to {endpoint}: {e}"))?;
    let bytes = serde_json::to_vec(cmd).map_err(|e| e.to_string())?;
    sock.send(bytes, 0)
        .map_err(|e| format!("{endpoint}: {e}"))?;
    let bytes = sock
        .recv_bytes(0)
        .map_err(|e| format!("no reply from {endpoint} within {timeout:?} ({e})"))?;
    let reply: Value =
        serde_json::from_slice(&bytes).map_err(|e| format!("bad reply from {endpoint}: {e}"))?;
    match ErrorBody::of_reply(&reply) {
        None => Ok(reply),
        Some(e) => Err(format!("{endpoint} refused: {e}")),
    }
}

/// An IF's `status`, `activate` or `yield`: its [`IfStatus`] reply.
pub fn if_request(endpoint: &str, cmd: IfCommand, timeout: Duration) -> Result<IfStatus, String> {
    let reply = request(endpoint, &cmd, timeout)?;
    serde_json::from_value(reply.clone())
        .map_err(|e| format!("{endpoint}: a {cmd:?} reply that is no status ({e}): {reply}"))
}

/// Appends one JSON line to `file` (the decision log).
pub fn log_line(file: &mut Option<File>, line: &str) {
    if let Some(f) = file.as_mut() {
        let _ = writeln!(f, "{line}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_is_seen_ready_reported_and_reaped() {
        let dir = std::env::temp_dir().join(format!("kp-proc-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "echo 'x: ready' >&2; echo '{\"n\": 1}'"]);
        let mut p = Proc::spawn("sh", cmd, "ready", &dir.join("sh.log")).unwrap();
        assert!(p.wait_or_kill(Duration::from_secs(5)).unwrap().success());
        std::thread::sleep(Duration::from_millis(50));
        assert!(p.is_ready());
        assert_eq!(p.report().unwrap()["n"], 1);
        assert!(p.tail().contains("x: ready"));
        let log = std::fs::read_to_string(dir.join("sh.log")).unwrap();
        assert!(log.contains("x: ready"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_dead_endpoint_is_an_error_not_a_hang() {
        let t = Instant::now();
        let e = request(
            "ipc:///nonexistent/kp.sock",
            &serde_json::json!({"cmd": "status"}),
            Duration::from_millis(100),
        )
        .unwrap_err();
        assert!(e.contains("no reply"), "{e}");
        assert!(t.elapsed() < Duration::from_secs(2));
    }
}
