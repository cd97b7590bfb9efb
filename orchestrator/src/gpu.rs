//! The GPU side of a share: is there an NVIDIA GPU, and is CUDA MPS there to
//! enforce `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`?
//!
//! GSLICE gives each IF a percentage of the GPU's streaming multiprocessors
//! through MPS: a client started with `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=P`
//! gets at most P% of the SMs. That is only enforced when the MPS control
//! daemon runs; without it the variable is ignored. Only IFs whose engine
//! runs on the GPU (`engine = "cudnn"`) get a percentage; the others get
//! cores even on a GPU host. The orchestrator calls [`ensure_mps`] when it
//! starts its first GPU IF (it starts the daemon when it is installed and
//! not running) and reports per IF whether its share is enforced (`mps`,
//! `none`, `cpu_cores`); `orchestrator --probe` only looks
//! ([`probe_mps`]).
//!
//! Measured on an H200 by the knee sweep (docs/PERFORMANCE.md, "GPU
//! shares"): with the daemon running, 10% gave a process 12 of the 132 SMs
//! and vgg19 10–15% of its full-GPU throughput.

use std::path::Path;
use std::process::{Command, Stdio};

use serde::Serialize;

/// The variable MPS reads the share from.
pub const MPS_PERCENTAGE_VAR: &str = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE";

/// Whether an NVIDIA GPU is visible here (its device nodes exist).
pub fn gpu_present() -> bool {
    Path::new("/dev/nvidiactl").exists() && Path::new("/dev/nvidia0").exists()
}

/// The GPUs `nvidia-smi` lists (name per line), if it is installed.
pub fn gpu_names() -> Vec<String> {
    Command::new("nvidia-smi")
        .args(["--query-gpu=name", "--format=csv,noheader"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .map(|l| l.trim().to_string())
                .filter(|l| !l.is_empty())
                .collect()
        })
        .unwrap_or_default()
}

/// What [`ensure_mps`] found.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "mps", content = "detail", rename_all = "snake_case")]
pub enum MpsState {
    /// The control daemon was already running.
    Running,
    /// This call started it.
    Started,
    /// Installed, not running (what [`probe_mps`] says before any GPU IF).
    Stopped,
    /// `nvidia-cuda-mps-control` is not installed: shares are not enforced.
    NotInstalled,
    /// Starting it failed (why): shares are not enforced.
    Failed(String),
}

impl MpsState {
    /// Whether IFs' percentages are enforced.
    pub fn enforces_shares(&self) -> bool {
        matches!(self, MpsState::Running | MpsState::Started)
    }

    /// One line for the log.
    pub fn describe(&self) -> String {
        match self {
            MpsState::Running => "the CUDA MPS control daemon is running: the shares of GPU IFs are enforced".into(),
            MpsState::Started => "started the CUDA MPS control daemon: the shares of GPU IFs are enforced".into(),
            MpsState::Stopped => "the CUDA MPS control daemon is installed, not running: the orchestrator starts it with the first GPU IF".into(),
            MpsState::NotInstalled => format!(
                "a GPU is present but CUDA MPS is not installed: {MPS_PERCENTAGE_VAR} is set but not enforced"
            ),
            MpsState::Failed(why) => {
                format!("nvidia-cuda-mps-control -d failed ({why}): GPU shares are not enforced")
            }
        }
    }
}

/// What MPS is here, changing nothing: running, installed, or absent.
pub fn probe_mps() -> MpsState {
    if mps_control_running() {
        return MpsState::Running;
    }
    let on_path = std::env::var_os("PATH").is_some_and(|p| {
        std::env::split_paths(&p).any(|d| d.join("nvidia-cuda-mps-control").is_file())
    });
    if on_path {
        MpsState::Stopped
    } else {
        MpsState::NotInstalled
    }
}

/// Starts the CUDA MPS control daemon if it is installed and not running.
pub fn ensure_mps() -> MpsState {
    if mps_control_running() {
        return MpsState::Running;
    }
    // Its output is not ours (`--probe` prints JSON on stdout).
    match Command::new("nvidia-cuda-mps-control")
        .arg("-d")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
    {
        Ok(s) if s.success() => MpsState::Started,
        Ok(s) => MpsState::Failed(s.to_string()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => MpsState::NotInstalled,
        Err(e) => MpsState::Failed(e.to_string()),
    }
}

/// Whether a process runs the program `nvidia-cuda-mps-control` (its
/// argv[0]; by name, since a process's comm is cut at 15 characters and
/// other command lines may mention it).
fn mps_control_running() -> bool {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return false;
    };
    dir.flatten().any(|e| {
        std::fs::read(e.path().join("cmdline")).is_ok_and(|c| {
            let argv0 = c.split(|b| *b == 0).next().unwrap_or_default();
            argv0.rsplit(|b| *b == b'/').next() == Some(b"nvidia-cuda-mps-control".as_slice())
        })
    })
}

/// The value of [`MPS_PERCENTAGE_VAR`] for a share of `pct` percent: a
/// whole percentage in 1..=100.
pub fn mps_percentage(pct: f64) -> String {
    format!("{}", pct.round().clamp(1.0, 100.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_share_becomes_a_whole_percentage_between_1_and_100() {
        assert_eq!(mps_percentage(29.6), "30");
        assert_eq!(mps_percentage(0.2), "1");
        assert_eq!(mps_percentage(140.0), "100");
    }

    #[test]
    fn only_a_running_daemon_enforces_shares() {
        assert!(MpsState::Running.enforces_shares());
        assert!(MpsState::Started.enforces_shares());
        assert!(!MpsState::NotInstalled.enforces_shares());
        assert!(MpsState::NotInstalled.describe().contains("not enforced"));
        assert!(!MpsState::Failed("exit 1".into()).enforces_shares());
    }

    #[test]
    fn the_state_serialises_for_the_probe() {
        let j = serde_json::to_value(MpsState::Failed("x".into())).unwrap();
        assert_eq!(j, serde_json::json!({"mps": "failed", "detail": "x"}));
    }
}
