//! A real photo through the real data path: skimage's coffee.png (from
//! `make models`, build/photos/), preprocessed by kneepoint-client's image
//! module and sent with kneepoint_client::Client (kp-client --image) from a
//! network namespace, through the if-manager on a veth pair, into kp-if
//! running EfficientNet-Lite0 (trained ImageNet weights) on ONNX Runtime.
//! The answer must be ImageNet class 967, labelled "espresso" by the
//! model's labels.txt, as the model repository's own check found.

use anyhow::Result;
use kneepoint_tests::platform::classify_coffee;

#[test]
fn coffee_is_an_espresso_through_the_platform() -> Result<()> {
    classify_coffee("photo", None, &[]).map(drop)
}
