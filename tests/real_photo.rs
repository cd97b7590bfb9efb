//! A real photo through the real data path: skimage's coffee.png (from
//! `make models`, build/photos/), preprocessed by kneepoint-client's image
//! module and sent with kneepoint_client::Client (kp-client --image) from a
//! network namespace, through the if-manager on a veth pair, into kp-if
//! running EfficientNet-Lite0 (trained ImageNet weights) on ONNX Runtime.
//! The answer must be ImageNet class 967, labelled "espresso" by the
//! model's labels.txt, as the model repository's own check found.

use anyhow::{ensure, Context, Result};
use kneepoint_tests::platform::Platform;
use kneepoint_tests::{bin, repo_root, run};
use serde_json::Value;

#[test]
fn coffee_is_an_espresso_through_the_platform() -> Result<()> {
    let models = repo_root().join("models");
    let photo = repo_root().join("build/photos/coffee.png");
    ensure!(
        photo.exists(),
        "{} is missing: run `make models` first (MODELS=efficientnet_lite0 is enough)",
        photo.display()
    );
    let platform = Platform::up("photo", &models.join("efficientnet_lite0/config.toml"))?;
    let out = run(platform
        .client_command(&bin("kp-client"))
        .args([
            "--dst",
            &platform.address(),
            "--if-id",
            "10",
            "--timeout",
            "5s",
        ])
        .arg("--models")
        .arg(&models)
        .arg("--json")
        .arg("--image")
        .arg(&photo))?;
    let reports = platform.stop()?;
    let answer: Value =
        serde_json::from_str(out.lines().last().context("kp-client printed nothing")?)?;
    eprintln!("kp-client --image: {answer}");
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
    Ok(())
}
