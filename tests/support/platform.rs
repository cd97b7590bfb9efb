//! The live platform in one call, for tests that send requests through the
//! real data path: a veth pair between two network namespaces, the
//! if-manager on it (DPDK `net_af_packet`), and one inference function
//! (`kp-if`, a DPDK secondary) serving one model of the repository.
//! Requests go from the client namespace ([`Platform::client_command`]).

use std::path::Path;
use std::process::Command;

use anyhow::{ensure, Context, Result};
use serde_json::Value;

use crate::{bin, dpdk_files_left, file_prefix, repo_root, run_report, Daemon, NetnsPair, Scratch};

/// Hugepage memory, MiB, the if-manager of a test platform maps at start
/// (EAL `-m`, as configs/platform.toml sets it): the if-manager's mbuf
/// pool at its default jumbo `--max-frame` (~350 MiB) and every kp-if that
/// can live at once (2 IFs, up to 5 processes each during a re-provision,
/// ~40 MiB of input pool each). Without it, every kp-if that starts adds
/// pages and every one that exits frees them, and each change syncs every
/// process's memory map, waiting up to 5 s for a process that does not
/// answer; four kp-ifs exiting at once at a shutdown could wait on each
/// other past the orchestrator's grace, be killed inside DPDK's shared
/// locks and wedge the if-manager (docs/RELIABILITY.md, 29 November 2026).
pub const HUGEPAGE_MB: u32 = 1024;

/// EAL options of the if-manager (the DPDK primary, lcore 0 on CPU 0) of a
/// test platform on `vdev`, mapping [`HUGEPAGE_MB`] at start.
pub fn primary_eal(prefix: &str, vdev: &str) -> Vec<String> {
    eal(
        prefix,
        "0@0",
        &["-m", &HUGEPAGE_MB.to_string(), "--vdev", vdev],
    )
}

/// EAL options of one process of a test platform (`extra` after the
/// common ones): the one copy every cross-process test uses.
pub fn eal(prefix: &str, lcores: &str, extra: &[impl AsRef<str>]) -> Vec<String> {
    [
        "--lcores",
        lcores,
        "--file-prefix",
        prefix,
        "--no-pci",
        "--no-telemetry",
        "--log-level",
        "lib.eal:error",
    ]
    .into_iter()
    .chain(extra.iter().map(AsRef::as_ref))
    .map(String::from)
    .collect()
}

/// The if-manager's `--vdev` for a veth end `iface`: net_af_packet with
/// ring frames of 10 KiB (`framesz`, two per 20 KiB block: a block is a
/// whole number of 4 KiB pages), so the kernel hands over whole frames of
/// a 9000-byte MTU, which the if-manager's default `--max-frame` (10240)
/// holds in one mbuf. DPDK's default frame (2048 bytes) would truncate
/// any frame over 1982 bytes.
pub fn af_packet_vdev(iface: &str) -> String {
    format!("net_af_packet0,iface={iface},framesz=10240,blocksz=20480")
}

/// kp-if's `--lcores` where its fragment thread may run on either core,
/// the engine's (`--cores 1`) included: [`Platform::up`]'s default.
pub const LCORES_BESIDE_THE_ENGINE: &str = "1@(0-1)";

/// kp-if's `--lcores` with its fragment thread on the if-manager's core
/// (the network side's), apart from the engine on core 1.
pub const LCORES_ON_THE_NETWORK_SIDE: &str = "1@0";

/// A running if-manager + one kp-if in a network namespace. Dropping it
/// stops everything (the processes, then the namespaces); [`Platform::stop`]
/// does the same and returns the final reports.
#[derive(Debug)]
pub struct Platform {
    // Fields drop in order: the processes before the namespaces they run in.
    kp_if: Daemon,
    ifm: Daemon,
    net: NetnsPair,
    _dir: Scratch,
    prefix: String,
}

/// What the processes reported when stopped.
#[derive(Debug)]
pub struct Reports {
    /// kp-if's final JSON report.
    pub kp_if: Value,
    /// The if-manager's final JSON report.
    pub if_manager: Value,
}

impl Platform {
    /// Brings up namespaces and processes for `test` (a name unique among
    /// tests in its first 5 characters, letters, digits or `_`), with kp-if serving `model` (a config.toml) on one core
    /// with two threads under a generous SLO (a busy test machine still
    /// serves; shedding is the batching tests' job).
    pub fn up(test: &str, model: &Path) -> Result<Platform> {
        Platform::up_mtu(test, model, None)
    }

    /// [`up`](Platform::up) on a veth pair whose MTU is `mtu` (9000 for
    /// jumbo fragments); `None` leaves the kernel's 1500.
    pub fn up_mtu(test: &str, model: &Path, mtu: Option<u32>) -> Result<Platform> {
        Platform::up_with(test, model, mtu, &[])
    }

    /// [`up_mtu`](Platform::up_mtu) with `kp_if_extra` added to kp-if's
    /// options (e.g. `--convert-on inference`).
    pub fn up_with(
        test: &str,
        model: &Path,
        mtu: Option<u32>,
        kp_if_extra: &[&str],
    ) -> Result<Platform> {
        Platform::up_on(test, model, mtu, LCORES_BESIDE_THE_ENGINE, kp_if_extra)
    }

    /// [`up_with`](Platform::up_with) with kp-if's EAL lcore, its fragment
    /// thread, where `kp_if_lcores` (`--lcores`) says, e.g. `1@0` for the
    /// if-manager's core (its engine stays on core 1).
    pub fn up_on(
        test: &str,
        model: &Path,
        mtu: Option<u32>,
        kp_if_lcores: &str,
        kp_if_extra: &[&str],
    ) -> Result<Platform> {
        ensure!(
            model.exists(),
            "{} is missing: run `make models` first",
            model.display()
        );
        // netns.sh names are at most 12 characters: kp + 5 + 5 digits.
        let short: String = test.chars().take(5).collect();
        let net = NetnsPair::up_mtu(&format!("kp{short}{}", std::process::id() % 100_000), mtu)?;
        let dir = Scratch::new(test);
        let prefix = file_prefix(test);
        let control = format!("ipc://{}", dir.path("ifm.sock").display());
        let telemetry = format!("ipc://{}", dir.path("telemetry.sock").display());
        let ns = ["ip", "netns", "exec", net.get("PLATFORM_NS")];
        let vdev = af_packet_vdev(net.get("PLATFORM_IF"));
        let ifm = Daemon::start(
            &ns,
            &["--control", &control, "--ip", net.get("PLATFORM_IP")].map(String::from),
            &primary_eal(&prefix, &vdev),
        )?;
        let mut kp_if_args: Vec<String> = vec![
            "--model".into(),
            model.display().to_string(),
            "--control".into(),
            control,
            "--telemetry".into(),
            telemetry,
            "--slo-ms".into(),
            "2000".into(),
            "--cores".into(),
            "1".into(),
            "--threads".into(),
            "2".into(),
        ];
        kp_if_args.extend(kp_if_extra.iter().map(|a| a.to_string()));
        let kp_if = Daemon::start_bin(
            &ns,
            "kp-if",
            &kp_if_args,
            &eal(&prefix, kp_if_lcores, &["--proc-type", "secondary"]),
            "kp-if: ready",
        )?;
        Ok(Platform {
            kp_if,
            ifm,
            net,
            _dir: dir,
            prefix,
        })
    }

    /// kp-if's process id.
    pub fn kp_if_pid(&self) -> u32 {
        self.kp_if.pid()
    }

    /// The platform's UDP address, `IP:9000`.
    pub fn address(&self) -> String {
        format!("{}:9000", self.net.get("PLATFORM_IP"))
    }

    /// The client network namespace's name (to run a daemon there).
    pub fn client_ns(&self) -> &str {
        self.net.get("CLIENT_NS")
    }

    /// `ip netns exec CLIENT_NS <program>`: a command run from the client
    /// side of the veth pair.
    pub fn client_command(&self, program: &Path) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", self.net.get("CLIENT_NS")])
            .arg(program);
        c
    }

    /// Stops kp-if, then the if-manager; checks that the if-manager got
    /// every mbuf back and that no DPDK file is left behind.
    pub fn stop(self) -> Result<Reports> {
        let Platform {
            kp_if,
            ifm,
            net,
            _dir,
            prefix,
        } = self;
        let kp_if = kp_if.stop()?;
        let if_manager = ifm.stop()?;
        drop(net);
        ensure!(
            if_manager["mempool"]["in_use_at_exit"] == 0,
            "if-manager: {if_manager}"
        );
        let left = dpdk_files_left(&prefix);
        ensure!(left.is_empty(), "DPDK files left behind: {left:?}");
        Ok(Reports { kp_if, if_manager })
    }
}

/// skimage's coffee.png (build/photos/, from `make models`) classified
/// through a whole platform: `kp-client --image` (the client library's
/// preprocessing, `extra` options added, e.g. a fragment size) from the
/// client namespace to EfficientNet-Lite0 (if 10, trained weights) on a
/// veth pair of `mtu` (None: the kernel's default). Checks the answer is
/// ImageNet class 967 "espresso" with the softmax score the model
/// repository's check saw (> 0.5), five classes, and that kp-if answered
/// exactly one request; returns kp-client's answer and the reports.
pub fn classify_coffee(test: &str, mtu: Option<u32>, extra: &[&str]) -> Result<(Value, Reports)> {
    classify_coffee_with(test, mtu, extra, &[])
}

/// [`classify_coffee`] with `kp_if_extra` added to kp-if's options.
pub fn classify_coffee_with(
    test: &str,
    mtu: Option<u32>,
    extra: &[&str],
    kp_if_extra: &[&str],
) -> Result<(Value, Reports)> {
    classify_coffee_on(test, mtu, extra, LCORES_BESIDE_THE_ENGINE, kp_if_extra)
}

/// [`classify_coffee_with`] with kp-if's fragment thread where
/// `kp_if_lcores` (`--lcores`) says ([`Platform::up_on`]).
pub fn classify_coffee_on(
    test: &str,
    mtu: Option<u32>,
    extra: &[&str],
    kp_if_lcores: &str,
    kp_if_extra: &[&str],
) -> Result<(Value, Reports)> {
    let models = repo_root().join("models");
    let photo = repo_root().join("build/photos/coffee.png");
    ensure!(
        photo.exists(),
        "{} is missing: run `make models` first (MODELS=efficientnet_lite0 is enough)",
        photo.display()
    );
    let platform = Platform::up_on(
        test,
        &models.join("efficientnet_lite0/config.toml"),
        mtu,
        kp_if_lcores,
        kp_if_extra,
    )?;
    let answer = run_report(
        platform
            .client_command(&bin("kp-client"))
            .args([
                "--dst",
                &platform.address(),
                "--if-id",
                "10",
                "--timeout",
                "5s",
            ])
            .args(extra)
            .arg("--models")
            .arg(&models)
            .arg("--json")
            .arg("--image")
            .arg(&photo),
    )?;
    let reports = platform.stop()?;
    eprintln!("kp-client --image {extra:?}: {answer}");
    let top1 = &answer["top_k"][0];
    ensure!(
        answer["image"] == "coffee.png" && answer["if_id"] == 10,
        "answer: {answer}"
    );
    ensure!(
        top1["class"] == 967 && top1["label"] == "espresso",
        "top-1 is not 967 espresso: {answer}"
    );
    // The model ends in a softmax: the repository's check saw 0.95.
    let score = top1["score"].as_f64().context("no score")?;
    ensure!(score > 0.5, "espresso only {score}: {answer}");
    ensure!(
        answer["top_k"].as_array().map(Vec::len) == Some(5),
        "top-k of efficientnet_lite0 is 5: {answer}"
    );
    ensure!(
        reports.kp_if["telemetry"]["answers_total"] == 1,
        "kp-if: {}",
        reports.kp_if
    );
    Ok((answer, reports))
}
