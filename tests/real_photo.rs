//! A real photo through the real data path: skimage's coffee.png (from
//! `make models`, build/photos/), preprocessed by kneepoint-client's image
//! module and sent with kneepoint_client::Client (kp-client --image) from a
//! network namespace, through the if-manager on a veth pair, into kp-if
//! running EfficientNet-Lite0 (trained ImageNet weights) on ONNX Runtime.
//! The answer must be ImageNet class 967, labelled "espresso" by the
//! model's labels.txt, as the model repository's own check found.

use anyhow::{ensure, Result};
use kneepoint_tests::platform::{
    classify_coffee, classify_coffee_on, Reports, LCORES_BESIDE_THE_ENGINE,
    LCORES_ON_THE_NETWORK_SIDE,
};

#[test]
fn coffee_is_an_espresso_through_the_platform() -> Result<()> {
    classify_coffee("photo", None, &[]).map(drop)
}

/// `kp-if --convert-on auto` (the default) and the thread it picks: with
/// the fragment thread on the network side's core (`--lcores 1@0`, the
/// engine on core 1) the fragment thread converts each image as it
/// arrives; with the fragment thread on the engine's core too
/// (`1@(0-1)`), it keeps the image's bytes and the inference thread
/// normalises them before the engine, with the fragment path's own table:
/// the same answer to the last bit of every score either way. An explicit
/// `--convert-on network` stands where auto would pick the inference
/// thread.
#[test]
fn auto_converts_on_the_inference_thread_where_the_fragment_thread_shares_its_core() -> Result<()> {
    let converted_by = |reports: &Reports, thread: &str, normalised: u64| -> Result<()> {
        ensure!(
            reports.kp_if["images_converted_by"] == thread
                && reports.kp_if["driver"]["normalised_batches"] == normalised,
            "expected the {thread} to convert ({normalised} normalised batches): {}",
            reports.kp_if
        );
        Ok(())
    };
    let (apart, reports) = classify_coffee_on("phnet", None, &[], LCORES_ON_THE_NETWORK_SIDE, &[])?;
    converted_by(&reports, "fragment thread", 0)?;
    let (shared, reports) = classify_coffee_on("phinf", None, &[], LCORES_BESIDE_THE_ENGINE, &[])?;
    converted_by(&reports, "inference thread", 1)?;
    let (told, reports) = classify_coffee_on(
        "phovr",
        None,
        &[],
        LCORES_BESIDE_THE_ENGINE,
        &["--convert-on", "network"],
    )?;
    converted_by(&reports, "fragment thread", 0)?;
    for (name, other) in [
        ("shared", &shared),
        ("told to convert on the network side", &told),
    ] {
        ensure!(
            apart["top_k"] == other["top_k"],
            "converted on the network side's core: {}\n{name}: {}",
            apart["top_k"],
            other["top_k"]
        );
    }
    Ok(())
}
