//! A real photo through the real data path: skimage's coffee.png (from
//! `make models`, build/photos/), preprocessed by kneepoint-client's image
//! module and sent with kneepoint_client::Client (kp-client --image) from a
//! network namespace, through the if-manager on a veth pair, into kp-if
//! running EfficientNet-Lite0 (trained ImageNet weights) on ONNX Runtime.
//! The answer must be ImageNet class 967, labelled "espresso" by the
//! model's labels.txt, as the model repository's own check found.

use anyhow::{ensure, Result};
use kneepoint_tests::platform::{classify_coffee, classify_coffee_with};

#[test]
fn coffee_is_an_espresso_through_the_platform() -> Result<()> {
    classify_coffee("photo", None, &[]).map(drop)
}

/// `kp-if --convert-on inference`: the fragment thread keeps the image's
/// bytes and the inference thread normalises them before the engine, with
/// the fragment path's own table: the same answer to the last bit of every
/// score.
#[test]
fn converting_on_the_inference_thread_gives_the_same_answer() -> Result<()> {
    let (network, reports) = classify_coffee("phnet", None, &[])?;
    ensure!(
        reports.kp_if["driver"]["normalised_batches"] == 0,
        "{}",
        reports.kp_if
    );
    let (inference, reports) =
        classify_coffee_with("phinf", None, &[], &["--convert-on", "inference"])?;
    ensure!(
        reports.kp_if["driver"]["normalised_batches"] == 1,
        "the inference thread normalised no batch: {}",
        reports.kp_if
    );
    ensure!(
        network["top_k"] == inference["top_k"],
        "converted on the network side: {}\non the inference side: {}",
        network["top_k"],
        inference["top_k"]
    );
    Ok(())
}
