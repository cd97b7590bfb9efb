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

use anyhow::{anyhow, bail, ensure, Context, Result};
use serde_json::Value;

pub mod impair;
pub mod orchestrator;
pub mod platform;

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
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("repo root")
        .to_path_buf()
}

/// A fresh scratch directory under the target dir, removed on drop (kept
/// when the test panics, or always with `KP_KEEP_SCRATCH=1`).
#[derive(Debug)]
pub struct Scratch(pub PathBuf);

impl Scratch {
    /// Creates `target/kp-tests/<name>-<pid>`.
    pub fn new(name: &str) -> Scratch {
        let dir = bin_dir()
            .join("kp-tests")
            .join(format!("{name}-{}", std::process::id()));
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
        if !std::thread::panicking() && std::env::var_os("KP_KEEP_SCRATCH").is_none() {
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

/// The JSON report a tool prints as the last line of its standard output
/// (kp-client's `--json`).
pub fn last_json_line(stdout: &str) -> Result<Value> {
    let last = stdout.lines().last().context("it printed nothing")?;
    serde_json::from_str(last).with_context(|| format!("its report: {last}"))
}

/// [`run`]s a tool that ends by printing its JSON report, and returns the
/// report ([`last_json_line`]).
pub fn run_report(cmd: &mut Command) -> Result<Value> {
    last_json_line(&run(cmd)?)
}

/// kp-client closed loop (`cmd`: the command that starts it, e.g. in the
/// client's namespace): `requests` requests to IF `if_id` at `dst`
/// (`IP:PORT`), each of them answered (`--expect-all-answered`), with
/// `args` for the rest (input, concurrency, timeout, ...); its report.
pub fn kp_client_closed_loop(
    cmd: &mut Command,
    dst: &str,
    if_id: u32,
    requests: u64,
    args: &[&str],
) -> Result<Value> {
    run_report(
        cmd.args(["--dst", dst, "--if-id", &if_id.to_string()])
            .args(["--requests", &requests.to_string()])
            .args(args)
            .args(["--json", "--expect-all-answered"]),
    )
}

/// A running platform process (`if-manager`, `kp-if`) whose stderr is
/// watched and whose last stdout line is its final JSON report.
#[derive(Debug)]
pub struct Daemon {
    child: Option<Child>,
    stderr_lines: Receiver<String>,
    stderr_log: Vec<String>,
}

/// The if-manager is the daemon most tests start.
pub type IfManager = Daemon;

impl Daemon {
    /// Starts `[wrap...] if-manager OPTIONS -- EAL` and waits for it to
    /// report ready. `wrap` runs it under another command (e.g.
    /// `ip netns exec NS`).
    pub fn start(wrap: &[&str], options: &[String], eal: &[String]) -> Result<Daemon> {
        Daemon::start_bin(wrap, "if-manager", options, eal, "if-manager: ready")
    }

    /// Starts `[wrap...] NAME OPTIONS -- EAL` and waits until its stderr
    /// shows `ready`.
    pub fn start_bin(
        wrap: &[&str],
        name: &str,
        options: &[String],
        eal: &[String],
        ready: &str,
    ) -> Result<Daemon> {
        let exe = bin(name);
        let mut cmd = match wrap.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(&exe);
                c
            }
            None => Command::new(&exe),
        };
        cmd.args(options).arg("--").args(eal);
        cmd.stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .stdin(Stdio::null());
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
        let mut m = Daemon {
            child: Some(child),
            stderr_lines: rx,
            stderr_log: Vec::new(),
        };
        m.wait_for_stderr(ready, Duration::from_secs(60))?;
        Ok(m)
    }

    fn wait_for_stderr(&mut self, needle: &str, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self
                .stderr_lines
                .recv_timeout(left.max(Duration::from_millis(1)))
            {
                Ok(line) => {
                    let hit = line.contains(needle);
                    self.stderr_log.push(line);
                    if hit {
                        return Ok(());
                    }
                }
                Err(_) => {
                    let status = self
                        .child
                        .as_mut()
                        .and_then(|c| c.try_wait().ok().flatten());
                    bail!(
                        "not ready ({needle:?} not seen; exit status {status:?}); stderr:\n{}",
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
        run(Command::new("kill")
            .arg("-TERM")
            .arg(self.pid().to_string()))?;
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
        child
            .stdout
            .take()
            .expect("piped")
            .read_to_string(&mut out)?;
        while let Ok(line) = self.stderr_lines.recv_timeout(Duration::from_millis(100)) {
            self.stderr_log.push(line);
        }
        if !status.success() {
            bail!(
                "if-manager exited with {status}; stderr:\n{}",
                self.stderr_log.join("\n")
            );
        }
        let last = out
            .lines()
            .last()
            .ok_or_else(|| anyhow!("if-manager printed no report"))?;
        serde_json::from_str(last).with_context(|| format!("final report is not JSON: {last}"))
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("kill")
                .arg("-TERM")
                .arg(c.id().to_string())
                .status();
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
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
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
        NetnsPair::up_mtu(name, None)
    }

    /// [`up`](NetnsPair::up) with both ends' MTU set to `mtu` (9000 for
    /// jumbo fragments); `None` leaves the kernel's 1500.
    pub fn up_mtu(name: &str, mtu: Option<u32>) -> Result<NetnsPair> {
        NetnsPair::make(name, mtu, false)
    }

    /// [`up_mtu`](NetnsPair::up_mtu) with a third namespace between the
    /// two (`netns.sh up NAME --bridge`): a Linux bridge whose ports face
    /// the client and the platform (facts `BRIDGE_NS`, `BRIDGE_CLIENT_IF`,
    /// `BRIDGE_PLATFORM_IF`), where [`crate::impair`] impairs the wire.
    pub fn up_bridged(name: &str, mtu: Option<u32>) -> Result<NetnsPair> {
        NetnsPair::make(name, mtu, true)
    }

    fn make(name: &str, mtu: Option<u32>, bridge: bool) -> Result<NetnsPair> {
        let script = repo_root().join("scripts/netns.sh");
        let _ = Command::new(&script).args(["down", name]).output();
        let mut up = Command::new(&script);
        up.args(["up", name]);
        if let Some(mtu) = mtu {
            up.args(["--mtu", &mtu.to_string()]);
        }
        if bridge {
            up.arg("--bridge");
        }
        let out = run(&mut up).context(
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

/// What kp-gen's manifest says, and the checks every if-manager test makes
/// against it.
pub mod expect {
    use std::collections::BTreeMap;

    use anyhow::{ensure, Context, Result};
    use kp_traffic::manifest::{Expected, Manifest};
    use kp_wire::{parse_udp_frame, MsgType, Response, Status};
    use serde_json::Value;

    /// kp-gen's `--malformed-kinds` for a veth (net_af_packet): every kind
    /// but `ip_fragment`. DPDK 22.11's net_af_packet opens its socket with
    /// PACKET_FANOUT_FLAG_DEFRAG, so the kernel holds a lone IPv4 fragment
    /// for reassembly and it never reaches the if-manager (nor is counted
    /// by it); a pcap test (net_pcap) covers that kind.
    pub const VETH_FAULT_KINDS: &str = "too_short,bad_magic,bad_version,bad_type,zero_total_len,\
zero_frag_count,index_out_of_range,empty_last_fragment,payload_length,truncated,bad_ip_version,\
bad_ip_header_len,bad_ip_total_len,bad_ip_checksum,bad_udp_length,not_ipv4,not_udp,wrong_port";

    /// Loads a manifest written by `kp-gen --manifest`.
    pub fn load(path: &std::path::Path) -> Result<Manifest> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        serde_json::from_str(&text).context("parsing the manifest")
    }

    fn num(v: &Value, path: &[&str]) -> u64 {
        let mut cur = v;
        for p in path {
            cur = &cur[*p];
        }
        cur.as_u64()
            .unwrap_or_else(|| panic!("report has no number at {path:?}: {v}"))
    }

    /// Every packet and outcome counter of the if-manager's final report
    /// has exactly the value the manifest implies (rings big enough that
    /// none fills; `rx_extra_not_ipv4` extra non-IP frames allowed, e.g.
    /// from a kernel on a veth).
    pub fn check_counters(report: &Value, m: &Manifest, rx_extra_not_ipv4: u64) -> Result<()> {
        let want = m
            .totals
            .if_manager
            .as_ref()
            .context("manifest has no --deployed expectation")?;
        let t = &m.totals;
        let extra = num(report, &["not_for_us", "not_ipv4_udp"])
            - t.not_for_us.get("not_ipv4_udp").copied().unwrap_or(0);
        ensure!(
            extra <= rx_extra_not_ipv4,
            "{extra} unexpected non-IPv4/UDP frames"
        );
        let eq = |what: &str, got: u64, want: u64| -> Result<()> {
            ensure!(got == want, "{what}: got {got}, want {want}");
            Ok(())
        };
        eq(
            "rx_packets",
            num(report, &["rx_packets"]),
            t.packets + extra,
        )?;
        eq(
            "delivered",
            num(report, &["outcomes", "delivered"]),
            want.delivered,
        )?;
        eq(
            "unknown_if_answered",
            num(report, &["outcomes", "unknown_if_answered"]),
            want.unknown_if_answered,
        )?;
        eq(
            "unknown_if_suppressed",
            num(report, &["outcomes", "unknown_if_suppressed"]),
            want.unknown_if_suppressed,
        )?;
        eq("ring_full", num(report, &["outcomes", "ring_full"]), 0)?;
        eq(
            "not_for_us",
            num(report, &["outcomes", "not_for_us"]),
            want.not_for_us + extra,
        )?;
        eq(
            "malformed",
            num(report, &["outcomes", "malformed"]),
            want.malformed,
        )?;
        for (reason, n) in &t.malformed {
            // The manifest lists every frame error kind; the if-manager
            // counts not-IPv4/not-UDP frames as not-for-us, never malformed.
            if *n == 0 && report["malformed"].get(reason).is_none() {
                continue;
            }
            eq(
                &format!("malformed.{reason}"),
                num(report, &["malformed", reason]),
                *n,
            )?;
        }
        let reported: u64 = report["malformed"]
            .as_object()
            .context("malformed")?
            .values()
            .filter_map(Value::as_u64)
            .sum();
        eq("sum of malformed reasons", reported, want.malformed)?;
        eq(
            "not_for_us.wrong_port",
            num(report, &["not_for_us", "wrong_port"]),
            t.not_for_us.get("wrong_port").copied().unwrap_or(0),
        )?;
        let total_outcomes: u64 = report["outcomes"]
            .as_object()
            .context("outcomes")?
            .values()
            .filter_map(Value::as_u64)
            .sum();
        eq(
            "sum of outcomes",
            total_outcomes,
            num(report, &["rx_packets"]),
        )?;
        for r in report["ifs"].as_array().context("ifs")? {
            let id = num(r, &["if_id"]) as u16;
            eq(
                &format!("if {id} delivered"),
                num(r, &["delivered"]),
                want.delivered_per_if.get(&id).copied().unwrap_or(0),
            )?;
            eq(&format!("if {id} ring_full"), num(r, &["ring_full"]), 0)?;
        }
        eq(
            "tx.sent",
            num(report, &["tx", "sent"]),
            want.unknown_if_answered,
        )?;
        eq("tx.dropped", num(report, &["tx", "dropped"]), 0)?;
        eq(
            "mempool.in_use_at_exit",
            num(report, &["mempool", "in_use_at_exit"]),
            0,
        )?;
        Ok(())
    }

    /// The fragments each deployed IF's ring must carry, as sorted
    /// `[src_port, request_id, frag_index, if_id]` rows (duplicates twice).
    pub fn ring_contents(m: &Manifest) -> BTreeMap<String, Vec<[u64; 4]>> {
        let deployed = m.deployed.clone().unwrap_or_default();
        let mut rings: BTreeMap<String, Vec<[u64; 4]>> = deployed
            .keys()
            .map(|id| (format!("kp_if_{id}"), Vec::new()))
            .collect();
        for r in &m.requests {
            let Some(rows) = rings.get_mut(&format!("kp_if_{}", r.if_id)) else {
                continue;
            };
            let row = |i: u16| {
                [
                    u64::from(r.src_port),
                    r.request_id,
                    u64::from(i),
                    u64::from(r.if_id),
                ]
            };
            rows.extend(r.present.iter().map(|i| row(*i)));
            rows.extend(r.duplicated.iter().map(|i| row(*i)));
            rows.extend(r.disagreement.iter().map(|d| row(d.index)));
        }
        for rows in rings.values_mut() {
            rows.sort_unstable();
        }
        rings
    }

    /// Checks what a kp-ring-probe saw against [`ring_contents`].
    pub fn check_probe(probe: &Value, m: &Manifest) -> Result<()> {
        ensure!(
            probe["unparsable"] == 0,
            "the probe saw unparsable mbufs: {probe}"
        );
        for (ring, want) in ring_contents(m) {
            let mut got: Vec<[u64; 4]> = serde_json::from_value(probe["rings"][&ring].clone())
                .with_context(|| format!("probe rows of {ring}"))?;
            got.sort_unstable();
            ensure!(
                got.len() == want.len(),
                "{ring}: got {} fragments, want {}",
                got.len(),
                want.len()
            );
            ensure!(
                got == want,
                "{ring}: the fragments differ from the manifest's"
            );
        }
        Ok(())
    }

    /// Checks the frames the platform sent: exactly one UNKNOWN_IF error per
    /// request the manifest expects one for, addressed back to its sender
    /// from the address and port it was sent to, echoing its timestamp.
    pub fn check_unknown_if_answers<'a>(
        frames: impl IntoIterator<Item = &'a [u8]>,
        m: &Manifest,
    ) -> Result<()> {
        let mut want: BTreeMap<(u16, u64), u64> = m
            .requests
            .iter()
            .filter(|r| r.expected == Some(Expected::UnknownIf))
            .map(|r| ((r.src_port, r.request_id), r.send_ts_ns))
            .collect();
        let n_want = want.len();
        for frame in frames {
            let udp = parse_udp_frame(frame)
                .map_err(|e| anyhow::anyhow!("sent frame does not parse: {e}"))?;
            let a = udp.addr;
            ensure!(
                a.src_ip == m.config.dst_ip && a.src_port == m.config.dst_port,
                "answer from {}:{}",
                a.src_ip,
                a.src_port
            );
            ensure!(a.dst_ip == m.config.src_ip, "answer to {}", a.dst_ip);
            ensure!(
                a.src_mac.to_string() == m.config.dst_mac
                    && a.dst_mac.to_string() == m.config.src_mac,
                "MACs not swapped: {a:?}"
            );
            ensure!(a.vlan_tci == m.config.vlan_tci, "VLAN tag not kept: {a:?}");
            let resp = Response::new_checked(udp.payload)
                .map_err(|e| anyhow::anyhow!("sent answer does not parse: {e}"))?;
            ensure!(
                resp.msg_type() == MsgType::Error && resp.status() == Status::UnknownIf,
                "unexpected answer {:?}/{:?}",
                resp.msg_type(),
                resp.status()
            );
            let ts = want
                .remove(&(a.dst_port, resp.request_id()))
                .with_context(|| {
                    format!(
                        "answer for ({}, {}) not expected, or sent twice",
                        a.dst_port,
                        resp.request_id()
                    )
                })?;
            ensure!(resp.send_ts_ns() == ts, "send_ts not echoed");
        }
        ensure!(
            want.is_empty(),
            "{} of {n_want} requests got no UNKNOWN_IF answer: {want:?}",
            want.len()
        );
        Ok(())
    }
}

/// Sends one JSON command to a ZeroMQ REP control socket and returns the
/// reply (fails after `timeout` without one).
pub fn control(endpoint: &str, command: &Value, timeout: Duration) -> Result<Value> {
    control_raw(endpoint, command.to_string().as_bytes(), timeout)
}

/// [`control`] with any bytes as the request (not JSON, say); the reply
/// must be JSON.
pub fn control_raw(endpoint: &str, request: &[u8], timeout: Duration) -> Result<Value> {
    let ctx = zmq::Context::new();
    let sock = ctx.socket(zmq::REQ)?;
    sock.set_linger(0)?;
    sock.set_rcvtimeo(timeout.as_millis() as i32)?;
    sock.connect(endpoint)?;
    sock.send(request, 0)?;
    let reply = sock.recv_bytes(0).with_context(|| {
        format!(
            "no reply from {endpoint} to {}",
            String::from_utf8_lossy(request)
        )
    })?;
    Ok(serde_json::from_slice(&reply)?)
}

/// kp-client's answers of status `name` (`ok`, `incomplete`, ...: its
/// report lists every status, 0 included).
pub fn answers(client: &Value, name: &str) -> u64 {
    client["status"][name].as_u64().unwrap_or(0)
}

/// Checks the statuses kp-client's `client` report got: every answer is
/// OK except at most `allowed` (status, how many) of the statuses named
/// there, each with its reason for the failure message; a status not named
/// may not occur at all. The answers by status add up to those answered.
pub fn expect_statuses(client: &Value, allowed: &[(&str, u64, &str)]) -> Result<()> {
    let status = client["status"]
        .as_object()
        .with_context(|| format!("no statuses in kp-client's report: {client}"))?;
    let answered = client["answered"].as_u64().context("answered")?;
    let mut not_ok = 0;
    for (name, n) in status {
        let n = n.as_u64().context("a status count")?;
        if name == "ok" {
            continue;
        }
        not_ok += n;
        match allowed.iter().find(|(a, ..)| a == name) {
            Some((_, max, why)) => ensure!(
                n <= *max,
                "{n} answers {name}, at most {max} may be ({why}): {client}"
            ),
            None => ensure!(n == 0, "{n} answers {name}, none may be: {client}"),
        }
    }
    ensure!(
        answers(client, "ok") + not_ok == answered,
        "the statuses do not add up to the {answered} answered: {client}"
    );
    Ok(())
}

/// The datagrams the if-manager took in as the platform's (IPv4/UDP to its
/// address and port): every frame's outcome but `not_for_us` (a kernel's
/// own frames on a veth: neighbour discovery and the like). `counters` is
/// its final report or the `stats` of a `stats` reply.
pub fn datagrams_received(counters: &Value) -> Result<u64> {
    let outcomes = counters["outcomes"]
        .as_object()
        .with_context(|| format!("no outcomes in {counters}"))?;
    Ok(outcomes
        .iter()
        .filter(|(name, _)| *name != "not_for_us")
        .filter_map(|(_, n)| n.as_u64())
        .sum())
}

/// How many of the `sent` datagrams (kp-client's `datagrams_sent`, summed
/// over the clients) never reached the if-manager, given how many it
/// received ([`datagrams_received`]): those the kernel dropped between the
/// two ends of the veth. net_af_packet's ring is DPDK's default 512
/// frames, fewer than the 588 datagrams of 4 squeezenet requests that a
/// closed-loop client sends back to back when it starts (or when a
/// fail-over answers its outstanding ones at once): if they come while the
/// if-manager sleeps in its idle back-off, exactly 76 are lost, seen in
/// about a third of the runs here; a starved if-manager loses others.
/// Each such loss makes at most one request INCOMPLETE; fails if the
/// if-manager counted more than was sent.
pub fn datagrams_lost(sent: u64, received: u64) -> Result<u64> {
    ensure!(
        received <= sent,
        "the if-manager received {received} datagrams, more than the {sent} sent"
    );
    Ok(sent - received)
}

/// kp-client's `datagrams_sent`.
pub fn datagrams_sent(client: &Value) -> Result<u64> {
    client["datagrams_sent"]
        .as_u64()
        .with_context(|| format!("no datagrams_sent in {client}"))
}

/// Polls the if-manager's `stats` until `done(stats)` or `timeout`.
pub fn wait_for_stats(
    endpoint: &str,
    timeout: Duration,
    done: impl Fn(&Value) -> bool,
) -> Result<Value> {
    let deadline = Instant::now() + timeout;
    loop {
        let reply = control(
            endpoint,
            &serde_json::json!({"cmd": "stats"}),
            Duration::from_secs(2),
        )?;
        let stats = reply["stats"].clone();
        if done(&stats) {
            return Ok(stats);
        }
        if Instant::now() > deadline {
            bail!("stats did not reach the expected state within {timeout:?}: {stats}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A `kp-client --json` run in the background for as long as a scenario
/// takes on this machine: stopped by [`BackgroundClient::stop`], not timed
/// (its `--duration` should only end one that a hung test left behind).
/// Killed if the test ends without stopping it.
#[derive(Debug)]
pub struct BackgroundClient(Option<Child>);

impl BackgroundClient {
    /// Spawns `cmd` (a kp-client command line with `--json`), its output
    /// piped.
    pub fn spawn(mut cmd: Command) -> Result<BackgroundClient> {
        let child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {cmd:?}"))?;
        Ok(BackgroundClient(Some(child)))
    }

    /// Stops it (SIGINT: it stops sending and resolves what is out) and
    /// returns its report; fails if it failed.
    pub fn stop(mut self) -> Result<Value> {
        let pid = self.0.as_ref().expect("running").id();
        // If this fails, the drop kills it.
        run(Command::new("kill").args(["-INT", &pid.to_string()]))?;
        let out = self.0.take().expect("running").wait_with_output()?;
        let text = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            bail!(
                "kp-client failed ({}): {}\n{text}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        last_json_line(&text).context("kp-client")
    }
}

impl Drop for BackgroundClient {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A process's resident set (`VmRSS` of /proc/PID/status), KiB; `None`
/// once it is gone. Hugepage mappings (DPDK's memory, the input pool) are
/// not in it: they are fixed when the platform starts.
pub fn vm_rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// One line of a `kp-client --record` file: how one request ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recorded {
    /// Its request_id (`None`: a send refused as unreachable).
    pub request_id: Option<u64>,
    /// When it was sent (open loop: scheduled), µs since the Unix epoch.
    pub sent_us: u64,
    /// A status (`ok`, `overloaded`, ...), `unanswered` or `unreachable`.
    pub outcome: String,
    /// When its answer came, µs since the Unix epoch.
    pub answered_us: Option<u64>,
}

impl Recorded {
    /// Its round trip, µs, if it was answered.
    pub fn rtt_us(&self) -> Option<u64> {
        self.answered_us.map(|a| a.saturating_sub(self.sent_us))
    }
}

/// Reads a `kp-client --record` file (its header line skipped).
pub fn read_record(path: &Path) -> Result<Vec<Recorded>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let num =
        |s: &str| -> Result<Option<u64>> { Ok(if s.is_empty() { None } else { Some(s.parse()?) }) };
    text.lines()
        .skip(1)
        .map(|line| {
            let f: Vec<&str> = line.split(',').collect();
            ensure!(f.len() == 4, "{}: bad line {line:?}", path.display());
            Ok(Recorded {
                request_id: num(f[0])?,
                sent_us: num(f[1])?.context("no send time")?,
                outcome: f[2].to_string(),
                answered_us: num(f[3])?,
            })
        })
        .collect()
}
