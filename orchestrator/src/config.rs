//! The platform configuration the orchestrator starts from
//! (`orchestrator --config configs/<file>.toml`).
//!
//! It names the if-manager (its options, its EAL arguments, and a command to
//! run it under, e.g. `ip netns exec NS`), the model repository, where the
//! binaries are, the cores inference functions may use, the self-tuning
//! settings, and the IFs to deploy at start. Every field but the if-manager's
//! EAL arguments has a default; `configs/platform.toml` is the commented
//! example.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// The whole file.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlatformConfig {
    /// Paths, cores, tuning.
    #[serde(default)]
    pub platform: Platform,
    /// How to start the if-manager.
    pub if_manager: IfManagerConfig,
    /// IFs to deploy at start, in order.
    #[serde(default)]
    pub deploy: Vec<DeployConfig>,
}

/// Paths, cores and tuning.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Platform {
    /// The model repository (relative paths: to the config file's folder's
    /// parent, i.e. the repository root for `configs/*.toml`).
    pub models: PathBuf,
    /// Where `if-manager` and `kp-if` are.
    pub bin_dir: PathBuf,
    /// Sockets, logs and the state file (created owner-only). Default:
    /// `/run/kneepoint` for root, else `$XDG_RUNTIME_DIR/kneepoint`.
    pub runtime_dir: Option<PathBuf>,
    /// The control endpoint (default: `ipc://<runtime_dir>/orchestrator.sock`).
    pub control: Option<String>,
    /// Let a TCP control endpoint bind beyond loopback.
    pub allow_remote_control: bool,
    /// Cores IFs may run on, as a CPU list (`0-3,6`; default: every core
    /// this process may use).
    pub cores: Option<String>,
    /// Cores the IFs' fragment threads run on (each IF's EAL lcore: it
    /// reassembles requests into the input pool), as a CPU list. Default:
    /// each IF's own cores, beside its engine, whose inference thread then
    /// converts images before each batch (`kp-if --convert-on auto`); on
    /// cores of their own the fragment threads convert them. The network
    /// side's cores (the if-manager's) leave an
    /// IF's share to its engine alone, the design's layout, and
    /// `inference_spin_ms` needs them.
    pub fragment_cores: Option<String>,
    /// `kp-if --inference-spin-ms` of IFs whose cores are their own (no
    /// other IF's and none of `fragment_cores`): the idle inference thread
    /// spins this long after each batch instead of dozing, lower latency
    /// at low load for a core kept busy while traffic is recent. 0: never.
    pub inference_spin_ms: u64,
    /// Run GSLICE's self-tuning loop (Algorithm 1 + max-min allocation).
    pub tuning: bool,
    /// How often the loop looks at telemetry, ms.
    pub tuning_period_ms: u64,
    /// No share change for an IF within this long of its last one, s.
    pub hold_down_s: f64,
    /// Smallest share change made, percent points.
    pub min_step_pct: f64,
    /// Hand the share the demands leave to the IFs (water-filled) rather
    /// than leave that part of the device idle (the allocator's
    /// `AllocConfig::work_conserving`). Off: every unpinned IF gets what it
    /// needs and no more, the rest stays free — GSLICE's "just the share it
    /// needs", and fewer re-provisions when IFs come and go.
    pub work_conserving: bool,
    /// What the allocator hands out, percent of the device in `(0, 100]`:
    /// lower it to keep room for what the orchestrator does not manage.
    pub capacity_pct: f64,
    /// Requests an IF holds in flight (`kp-if --capacity`).
    pub capacity: usize,
    /// Reassembly timeout of the IFs, ms.
    pub reassembly_timeout_ms: u64,
    /// Serve Prometheus metrics over HTTP (`GET /metrics`).
    pub metrics: bool,
    /// Where to serve them.
    pub metrics_listen: SocketAddr,
    /// Let the metrics endpoint bind beyond loopback.
    pub allow_remote_metrics: bool,
}

/// The metrics endpoint's default address: loopback, port 9464 (the port
/// the OpenTelemetry Prometheus exporter uses by default; free on a
/// kneepoint host otherwise).
pub const DEFAULT_METRICS_LISTEN: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 9464);

impl Default for Platform {
    fn default() -> Self {
        Platform {
            models: PathBuf::from("models"),
            bin_dir: PathBuf::from("target/release"),
            runtime_dir: None,
            control: None,
            allow_remote_control: false,
            cores: None,
            fragment_cores: None,
            inference_spin_ms: 0,
            tuning: true,
            tuning_period_ms: 1000,
            hold_down_s: 10.0,
            min_step_pct: 5.0,
            work_conserving: true,
            capacity_pct: 100.0,
            capacity: 64,
            reassembly_timeout_ms: 100,
            metrics: true,
            metrics_listen: DEFAULT_METRICS_LISTEN,
            allow_remote_metrics: false,
        }
    }
}

/// How to start the if-manager.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IfManagerConfig {
    /// A command to run it under (e.g. `["ip", "netns", "exec", "kp-plat"]`).
    #[serde(default)]
    pub wrap: Vec<String>,
    /// Its options (the orchestrator adds `--control` and `--stats-json`).
    #[serde(default)]
    pub options: Vec<String>,
    /// Its EAL arguments (the orchestrator adds `--file-prefix`).
    pub eal: Vec<String>,
    /// DPDK `--file-prefix` of the platform (IFs attach with the same).
    #[serde(default = "default_prefix")]
    pub file_prefix: String,
}

impl IfManagerConfig {
    /// Whether its EAL arguments map the hugepage memory up front (`-m`,
    /// `--socket-mem`, or `--legacy-mem`). Without, DPDK adds pages as IF
    /// processes reserve their pools and frees them as they exit, and each
    /// such change syncs every process of the platform's memory map
    /// (waiting up to 5 s for one that does not answer: a process that is
    /// exiting or still starting); with, pools come from the memory mapped
    /// at start, which DPDK never frees.
    pub fn preallocates_memory(&self) -> bool {
        self.eal.iter().any(|a| {
            let megabytes = |n: &str| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit());
            a == "-m"
                || a.strip_prefix("-m").is_some_and(megabytes)
                || a == "--socket-mem"
                || a.starts_with("--socket-mem=")
                || a == "--legacy-mem"
        })
    }
}

fn default_prefix() -> String {
    "kneepoint".to_string()
}

/// One IF to deploy at start.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeployConfig {
    /// Its if_id (the model's, in the repository).
    pub if_id: u16,
    /// The model's name in the repository.
    pub model: String,
    /// Latency objective, ms (default: the model's).
    pub slo_ms: Option<f64>,
    /// Initial share, percent (default: the model's knee or 30%).
    pub share_pct: Option<f64>,
    /// Pin the share (the tuning loop leaves it).
    #[serde(default)]
    pub pinned: bool,
}

/// Why a configuration was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// It is not valid TOML for this schema.
    #[error("{path}: {source}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// Why.
        source: toml::de::Error,
    },
    /// A value is out of range.
    #[error("{path}: {what}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        what: String,
    },
}

impl PlatformConfig {
    /// Reads and checks `path`; relative paths in it are made absolute
    /// against the repository root (the config folder's parent).
    pub fn load(path: &Path) -> Result<PlatformConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let mut cfg: PlatformConfig =
            toml::from_str(&text).map_err(|source| ConfigError::Parse {
                path: path.to_path_buf(),
                source,
            })?;
        let base = path
            .canonicalize()
            .ok()
            .and_then(|p| p.parent().and_then(Path::parent).map(Path::to_path_buf))
            .unwrap_or_else(|| PathBuf::from("."));
        cfg.platform.models = absolute(&base, &cfg.platform.models);
        cfg.platform.bin_dir = absolute(&base, &cfg.platform.bin_dir);
        cfg.validate().map_err(|what| ConfigError::Invalid {
            path: path.to_path_buf(),
            what,
        })?;
        Ok(cfg)
    }

    /// Range checks.
    pub fn validate(&self) -> Result<(), String> {
        let p = &self.platform;
        if p.tuning_period_ms == 0 {
            return Err("platform.tuning_period_ms must be > 0".into());
        }
        if !(p.hold_down_s.is_finite() && p.hold_down_s >= 0.0) {
            return Err("platform.hold_down_s must be >= 0".into());
        }
        if !(p.min_step_pct.is_finite() && p.min_step_pct > 0.0 && p.min_step_pct <= 100.0) {
            return Err("platform.min_step_pct must be in (0, 100]".into());
        }
        if !(p.capacity_pct.is_finite() && p.capacity_pct > 0.0 && p.capacity_pct <= 100.0) {
            return Err("platform.capacity_pct must be in (0, 100]".into());
        }
        if p.capacity == 0 {
            return Err("platform.capacity must be > 0".into());
        }
        if let Some(list) = &p.fragment_cores {
            match kp_os::affinity::parse_cpu_list(list) {
                Ok(cpus) if !cpus.is_empty() => {}
                Ok(_) => return Err(format!("platform.fragment_cores {list:?} names no CPU")),
                Err(e) => return Err(format!("platform.fragment_cores: {e}")),
            }
        }
        if p.inference_spin_ms > MAX_INFERENCE_SPIN_MS {
            return Err(format!(
                "platform.inference_spin_ms must be at most {MAX_INFERENCE_SPIN_MS}"
            ));
        }
        if p.inference_spin_ms > 0 && p.fragment_cores.is_none() {
            return Err(
                "platform.inference_spin_ms needs platform.fragment_cores: on the IF's own \
                        cores its spinning inference thread would take the fragment thread's CPU"
                    .into(),
            );
        }
        if self.if_manager.eal.is_empty() {
            return Err("if_manager.eal is empty: give at least --lcores and a --vdev".into());
        }
        let mut seen = std::collections::BTreeSet::new();
        for d in &self.deploy {
            if !seen.insert(d.if_id) {
                return Err(format!("if_id {} is deployed twice", d.if_id));
            }
        }
        Ok(())
    }
}

/// The longest `platform.inference_spin_ms` taken: a minute (past that a
/// spinning thread is a busy-polling one; kp-if --busy-poll is that).
pub const MAX_INFERENCE_SPIN_MS: u64 = 60_000;

fn absolute(base: &Path, p: &Path) -> PathBuf {
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        base.join(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_minimal_config_gets_the_defaults_and_bad_ones_say_why() {
        let cfg: PlatformConfig =
            toml::from_str("[if_manager]\neal = [\"--lcores\", \"0@0\"]\n").unwrap();
        assert!(cfg.validate().is_ok());
        assert_eq!(cfg.platform.hold_down_s, 10.0);
        assert_eq!(cfg.if_manager.file_prefix, "kneepoint");
        assert!(toml::from_str::<PlatformConfig>("[if_manager]\neal=[]\nbogus=1\n").is_err());
        let twice: PlatformConfig = toml::from_str(
            "[if_manager]\neal=[\"x\"]\n[[deploy]]\nif_id=1\nmodel=\"a\"\n[[deploy]]\nif_id=1\nmodel=\"b\"\n",
        )
        .unwrap();
        assert!(twice.validate().unwrap_err().contains("twice"));
    }

    #[test]
    fn fragment_cores_and_spinning_are_checked() {
        let parse = |platform: &str| -> PlatformConfig {
            toml::from_str(&format!(
                "[platform]\n{platform}\n[if_manager]\neal = [\"x\"]\n"
            ))
            .unwrap()
        };
        let cfg = parse("");
        assert_eq!(cfg.platform.fragment_cores, None);
        assert_eq!(cfg.platform.inference_spin_ms, 0);
        assert!(parse("fragment_cores = \"0\"\ninference_spin_ms = 1000")
            .validate()
            .is_ok());
        let err = parse("inference_spin_ms = 1000").validate().unwrap_err();
        assert!(err.contains("needs platform.fragment_cores"), "{err}");
        let err = parse("fragment_cores = \"0\"\ninference_spin_ms = 60001")
            .validate()
            .unwrap_err();
        assert!(err.contains("at most 60000"), "{err}");
        for bad in ["\"\"", "\"a-b\"", "\"3-1\""] {
            let err = parse(&format!("fragment_cores = {bad}"))
                .validate()
                .unwrap_err();
            assert!(err.contains("platform.fragment_cores"), "{bad}: {err}");
        }
    }

    #[test]
    fn the_allocator_settings_default_to_work_conservation_over_the_whole_device() {
        let cfg: PlatformConfig = toml::from_str("[if_manager]\neal = [\"x\"]\n").unwrap();
        assert!(cfg.platform.work_conserving);
        assert_eq!(cfg.platform.capacity_pct, 100.0);
        let cfg: PlatformConfig = toml::from_str(
            "[platform]\nwork_conserving = false\ncapacity_pct = 80\n[if_manager]\neal = [\"x\"]\n",
        )
        .unwrap();
        assert!(cfg.validate().is_ok());
        assert!(!cfg.platform.work_conserving);
        assert_eq!(cfg.platform.capacity_pct, 80.0);
        for bad in ["0", "100.5", "-3"] {
            let cfg: PlatformConfig = toml::from_str(&format!(
                "[platform]\ncapacity_pct = {bad}\n[if_manager]\neal = [\"x\"]\n"
            ))
            .unwrap();
            assert!(
                cfg.validate().unwrap_err().contains("capacity_pct"),
                "{bad}"
            );
        }
    }

    #[test]
    fn metrics_default_to_loopback_and_take_an_address_or_off() {
        let cfg: PlatformConfig = toml::from_str("[if_manager]\neal = [\"x\"]\n").unwrap();
        assert!(cfg.platform.metrics);
        assert_eq!(cfg.platform.metrics_listen.to_string(), "127.0.0.1:9464");
        let cfg: PlatformConfig = toml::from_str(
            "[platform]\nmetrics = false\nmetrics_listen = \"127.0.0.1:9100\"\n[if_manager]\neal = [\"x\"]\n",
        )
        .unwrap();
        assert!(!cfg.platform.metrics);
        assert_eq!(cfg.platform.metrics_listen.port(), 9100);
        let bad = toml::from_str::<PlatformConfig>(
            "[platform]\nmetrics_listen = \"localhost\"\n[if_manager]\neal = [\"x\"]\n",
        )
        .unwrap_err();
        assert!(bad.to_string().contains("metrics_listen"), "{bad}");
    }

    #[test]
    fn preallocated_memory_is_recognised_in_every_spelling() {
        let of = |eal: &[&str]| IfManagerConfig {
            wrap: vec![],
            options: vec![],
            eal: eal.iter().map(|s| s.to_string()).collect(),
            file_prefix: "kp".into(),
        };
        for yes in [
            &["--lcores", "0@0", "-m", "1024"][..],
            &["-m1024"],
            &["--socket-mem", "512"],
            &["--socket-mem=512,0"],
            &["--legacy-mem"],
        ] {
            assert!(of(yes).preallocates_memory(), "{yes:?}");
        }
        for no in [
            &["--lcores", "0@0", "--no-pci"][..],
            &["--vdev", "net_af_packet0,iface=kp-p0"],
            &["-mx"],
            &[],
        ] {
            assert!(!of(no).preallocates_memory(), "{no:?}");
        }
    }
}
