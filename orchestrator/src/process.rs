//! The child processes the orchestrator runs, and how it talks to them.
//!
//! A [`Proc`] is a spawned child. It says it is ready with a typed message,
//! not a log line: the orchestrator makes a pipe per child ([`ReadyPipe`]),
//! the child inherits its write end (told the number by `--notify-fd N`)
//! and writes one [`Readiness`] JSON line there once it serves (a shadow:
//! once it is parked and can take over). A thread reads the pipe; a line
//! that does not parse, or says another role or IF than the child was
//! started as, is an error (logged, and kept in the child's tail for the
//! error message that names it), never a readiness. A child that dies
//! before it writes stays not ready; its exit is seen by [`Proc::poll_exit`].
//!
//! Another thread reads its stderr line by line, into a log file and a
//! short in-memory tail (for error messages). Its stdout's last line is
//! its final JSON report: a third thread reads stdout to end-of-file, and
//! [`Proc::report`] waits for that thread (a moment, once the child has
//! exited) rather than read a buffer the thread has not filled yet.
//! Nothing here blocks for long: the daemon's loop polls
//! [`Proc::is_ready`] and [`Proc::poll_exit`].

use std::collections::VecDeque;
use std::fs::File;
use std::io::{BufRead, BufReader, PipeReader, Read, Write};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use kp_os::inherit::ChildFd;
use kp_schema::messages::{ErrorBody, IfCommand, IfStatus, Readiness, ReadyRole};
use serde_json::Value;

/// Stderr lines kept in memory per process.
const TAIL: usize = 40;

/// How long [`Proc::report`] waits, after the child exited, for its
/// stdout to reach end-of-file (a grandchild that kept the pipe open
/// would hold it forever).
const REPORT_WAIT: Duration = Duration::from_secs(2);

/// A child's whole stdout, once the reader saw end-of-file.
type Stdout = Arc<(Mutex<Option<String>>, Condvar)>;

/// The pipe a child says it is ready on, made before its command line is
/// complete: the child is told the write end's number ([`ReadyPipe::args`]).
#[derive(Debug)]
pub struct ReadyPipe {
    reader: PipeReader,
    writer: ChildFd,
    role: ReadyRole,
    if_id: Option<u16>,
}

impl ReadyPipe {
    /// A pipe for a child that is to say it is ready as `role` of `if_id`
    /// (`None`: the if-manager).
    pub fn new(role: ReadyRole, if_id: Option<u16>) -> std::io::Result<ReadyPipe> {
        let (reader, writer) = std::io::pipe()?;
        Ok(ReadyPipe {
            reader,
            writer: ChildFd::new(writer.into())?,
            role,
            if_id,
        })
    }

    /// `--notify-fd N`, for the child's command line (before any `--`).
    pub fn args(&self) -> [String; 2] {
        ["--notify-fd".to_string(), self.writer.number().to_string()]
    }
}

/// A child process.
#[derive(Debug)]
pub struct Proc {
    name: String,
    child: Child,
    pid: u32,
    ready: Arc<AtomicBool>,
    tail: Arc<Mutex<VecDeque<String>>>,
    stdout: Stdout,
    exit: Option<ExitStatus>,
    started: Instant,
}

impl Proc {
    /// Spawns `cmd` (whose arguments include `ready`'s [`ReadyPipe::args`])
    /// with `ready`'s write end; its stderr goes to `log` (appended).
    pub fn spawn(
        name: impl Into<String>,
        mut cmd: Command,
        ready: ReadyPipe,
        log: &Path,
    ) -> std::io::Result<Proc> {
        let name = name.into();
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let ReadyPipe {
            reader,
            writer,
            role,
            if_id,
        } = ready;
        writer.pass_to(&mut cmd);
        let mut child = cmd.spawn()?;
        // The write end is the child's alone now: the reader sees
        // end-of-file when the child exits.
        drop(cmd);
        let pid = child.id();
        let flag = Arc::new(AtomicBool::new(false));
        let tail = Arc::new(Mutex::new(VecDeque::with_capacity(TAIL)));
        let stdout_buf: Stdout = Arc::new((Mutex::new(None), Condvar::new()));
        let mut log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .ok();
        {
            let (flag, tail, name) = (flag.clone(), tail.clone(), name.clone());
            std::thread::spawn(move || {
                for line in BufReader::new(reader).lines() {
                    let line = match line {
                        Ok(line) => line,
                        Err(e) => {
                            // Not text, or the pipe failed: nothing more
                            // from it can be trusted.
                            let e = format!("reading its readiness pipe: {e}");
                            tracing::error!("orchestrator: {name}: {e}");
                            push_tail(&tail, format!("orchestrator: {e}"));
                            break;
                        }
                    };
                    match Readiness::parse(&line).and_then(|r| r.expect(role, if_id)) {
                        Ok(r) => {
                            // Ready before it is logged: whoever reads
                            // this line (a person, a test) may act on it.
                            flag.store(true, Ordering::Release);
                            tracing::info!(
                                "orchestrator: {name} said it is ready ({}, pid {})",
                                r.role,
                                r.pid
                            );
                        }
                        Err(e) => {
                            tracing::error!("orchestrator: {name}: {e}");
                            push_tail(&tail, format!("orchestrator: {e}"));
                        }
                    }
                }
            });
        }
        if let Some(stderr) = child.stderr.take() {
            let tail = tail.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    if let Some(f) = log.as_mut() {
                        let _ = writeln!(f, "{line}");
                    }
                    push_tail(&tail, line);
                }
            });
        }
        if let Some(mut stdout) = child.stdout.take() {
            let buf = stdout_buf.clone();
            std::thread::spawn(move || {
                let mut s = String::new();
                let _ = stdout.read_to_string(&mut s);
                let (text, done) = &*buf;
                *text.lock().unwrap_or_else(|p| p.into_inner()) = Some(s);
                done.notify_all();
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

    /// Whether it said it is ready (a [`Readiness`] for the role and IF it
    /// was started as).
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    /// Whether it runs but has not said it is ready yet (as of the last
    /// [`Proc::poll_exit`]).
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

    /// Its final report: the last stdout line, once it exited (as of the
    /// last [`Proc::poll_exit`]) and printed one that is JSON. The child's
    /// exit is seen before its stdout's reader reaches end-of-file, so
    /// this waits up to [`REPORT_WAIT`] for the reader.
    pub fn report(&self) -> Option<Value> {
        self.exit?;
        let (text, done) = &*self.stdout;
        let out = text.lock().unwrap_or_else(|p| p.into_inner());
        let (out, _) = done
            .wait_timeout_while(out, REPORT_WAIT, |t| t.is_none())
            .unwrap_or_else(|p| p.into_inner());
        out.as_deref()?
            .lines()
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

/// Appends `line` to a tail of at most [`TAIL`] lines.
fn push_tail(tail: &Mutex<VecDeque<String>>, line: String) {
    let mut t = tail.lock().unwrap_or_else(|p| p.into_inner());
    if t.len() == TAIL {
        t.pop_front();
    }
    t.push_back(line);
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
/// if-manager's `--control`): a command of `kp_schema::messages`; the reply,
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

    /// Waits for `cond`; the deadline only fails a hung test.
    fn eventually(what: &str, cond: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !cond() {
            assert!(Instant::now() < deadline, "never: {what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// `bash -c SCRIPT` with a readiness pipe for `role` of `if_id`; `$FD`
    /// in the script is the pipe's write end. (bash, not sh: dash redirects
    /// only descriptors 0-9, and a test process has more open.)
    fn sh(script: &str, role: ReadyRole, if_id: Option<u16>, log: &Path) -> Proc {
        let pipe = ReadyPipe::new(role, if_id).unwrap();
        let [flag, fd] = pipe.args();
        assert_eq!(flag, "--notify-fd");
        let mut cmd = Command::new("bash");
        cmd.args(["-c", &script.replace("$FD", &fd)]);
        Proc::spawn("sh", cmd, pipe, log).unwrap()
    }

    fn temp_dir(what: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("kp-proc-{what}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_process_is_ready_once_it_says_so_then_reported_and_reaped() {
        let dir = temp_dir("ready");
        let go = dir.join("go");
        // It says it is ready only once the test lets it.
        let script = format!(
            "echo 'x: starting' >&2; while [ ! -e {go} ]; do sleep 0.01; done; \
             echo \"{{\\\"pid\\\":$$,\\\"role\\\":\\\"standby\\\",\\\"if_id\\\":7}}\" >&$FD; \
             echo '{{\"n\": 1}}'",
            go = go.display()
        );
        let mut p = sh(&script, ReadyRole::Standby, Some(7), &dir.join("sh.log"));
        assert!(p.is_starting() && !p.is_ready(), "{}", p.tail());
        std::fs::write(&go, "").unwrap();
        eventually("ready", || p.is_ready());
        let status = p.wait_or_kill(Duration::from_secs(60)).unwrap();
        assert!(status.success(), "{status}: {}", p.tail());
        assert!(!p.is_starting());
        // No waiting here: the report is there as soon as the exit is.
        assert_eq!(p.report().expect("its report")["n"], 1);
        eventually("its stderr", || p.tail().contains("x: starting"));
        let log = std::fs::read_to_string(dir.join("sh.log")).unwrap();
        assert!(log.contains("x: starting"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_line_that_does_not_parse_or_is_for_another_role_is_not_readiness() {
        let dir = temp_dir("bad");
        for (script, role, why) in [
            // The old log line, on the pipe: text is not a readiness.
            (
                "echo 'kp-if: ready' >&$FD",
                ReadyRole::Serving,
                "does not parse",
            ),
            // A shadow that says it serves.
            (
                r#"echo '{"pid":1,"role":"serving","if_id":7}' >&$FD"#,
                ReadyRole::Standby,
                "started as standby",
            ),
        ] {
            let mut p = sh(script, role, Some(7), &dir.join("sh.log"));
            let status = p.wait_or_kill(Duration::from_secs(60)).unwrap();
            assert!(status.success(), "{status}");
            eventually(why, || p.tail().contains(why));
            assert!(!p.is_ready(), "{}", p.tail());
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_process_that_dies_before_it_says_so_is_not_ready_and_its_exit_is_seen() {
        let dir = temp_dir("dies");
        let mut p = sh(
            "echo 'x: error' >&2; exit 3",
            ReadyRole::Serving,
            None,
            &dir.join("sh.log"),
        );
        let status = p.wait_or_kill(Duration::from_secs(60)).unwrap();
        assert_eq!(status.code(), Some(3));
        assert!(!p.is_ready() && !p.is_starting());
        eventually("its stderr", || p.tail().contains("x: error"));
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
