//! Jumbo fragments on a veth pair (issue 14, item 0): both ends at a
//! 9000-byte MTU, the if-manager on net_af_packet with 10 KiB ring frames
//! (`framesz=10240,blocksz=20480`, tests/support `af_packet_vdev`) and its
//! default `--max-frame` (10240), requests sent by kp-client from the
//! client namespace in 4 KiB and 8 KiB fragments (frames of 4170 and 8266
//! bytes). Every request gets exactly one OK answer with the right result,
//! and the if-manager counts no fragment `segmented` or malformed.

use anyhow::{ensure, Result};
use kneepoint_tests::platform::{classify_coffee, Platform, Reports};
use kneepoint_tests::{bin, kp_client_closed_loop, repo_root};

/// The veth MTU of these tests.
const JUMBO_MTU: u32 = 9000;

/// The if-manager's report shows `delivered` fragments, every one whole.
fn check_no_segmented(reports: &Reports, delivered: u64) -> Result<()> {
    let ifm = &reports.if_manager;
    ensure!(
        ifm["outcomes"]["delivered"] == delivered
            && ifm["outcomes"]["malformed"] == 0
            && ifm["malformed"]["segmented"] == 0
            && ifm["mempool"]["max_frame"] == 10240,
        "if-manager (want {delivered} delivered, none malformed): {ifm}"
    );
    Ok(())
}

/// skimage's coffee.png in 8 KiB fragments: EfficientNet-Lite0 still says
/// class 967, espresso (tests/real_photo.rs sends the same photo in the
/// client library's default fragments).
#[test]
fn coffee_in_8_kib_fragments_is_an_espresso() -> Result<()> {
    let (_, reports) = classify_coffee("jphot", Some(JUMBO_MTU), &["--frag-size", "8192"])?;
    // 224×224×3 = 150528 input bytes: 19 fragments of at most 8192.
    check_no_segmented(&reports, 19)
}

/// Closed-loop synthetic requests to squeezenet in 4 KiB fragments: each
/// of them answered once, OK.
#[test]
fn squeezenet_requests_in_4_kib_fragments_are_each_answered_ok() -> Result<()> {
    let requests = 12u64;
    let platform = Platform::up_mtu(
        "jsqz4",
        &repo_root().join("models/squeezenet/config.toml"),
        Some(JUMBO_MTU),
    )?;
    let client = kp_client_closed_loop(
        &mut platform.client_command(&bin("kp-client")),
        &platform.address(),
        1,
        requests,
        &[
            "--timeout",
            "5s",
            "--input",
            "synthetic",
            "--frag-size",
            "4096",
        ],
    );
    let reports = platform.stop()?;
    let client = client?;
    ensure!(
        client["sent"] == requests
            && client["answered"] == requests
            && client["unanswered"] == 0
            && client["duplicates"] == 0
            && client["status"]["ok"] == requests,
        "client: {client}"
    );
    ensure!(
        reports.kp_if["telemetry"]["answers_total"] == requests,
        "kp-if: {}",
        reports.kp_if
    );
    // 224×224×3 = 150528 input bytes: 37 fragments of at most 4096.
    check_no_segmented(&reports, requests * 37)
}
