//! kp-gateway in front of a live platform, used by standard clients: the
//! if-manager on a veth pair between two network namespaces, kp-if serving
//! EfficientNet-Lite0 (trained weights, if 10), kp-gateway in the client
//! namespace serving efficientnet_lite0 and squeezenet (no IF serves it
//! here), and tests/kserve_check.py run there with `tritonclient[http]`
//! (PyPI, pinned by scripts/setup.sh) and curl: health, readiness, metadata,
//! infer with binary and JSON tensors on skimage's coffee.png (preprocessed
//! by kneepoint-client's image module, as the client does) answering
//! ImageNet class 967 (espresso), and each bad input's exact status.
//!
//! The interpreter is `KP_TEST_PYTHON`, default the repo's `.venv/bin/python`.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{ensure, Context, Result};
use kneepoint_tests::platform::Platform;
use kneepoint_tests::{repo_root, run, Daemon, Scratch};
use serde_json::{json, Value};

#[test]
fn tritonclient_and_curl_use_kneepoint_through_kp_gateway() -> Result<()> {
    let models = repo_root().join("models");
    let photo = repo_root().join("build/photos/coffee.png");
    let effnet = models.join("efficientnet_lite0/config.toml");
    ensure!(
        photo.exists() && effnet.exists() && models.join("squeezenet/config.toml").exists(),
        "{} or the models are missing: run `make models` first",
        photo.display()
    );
    let python = std::env::var_os("KP_TEST_PYTHON")
        .map_or_else(|| repo_root().join(".venv/bin/python"), PathBuf::from);
    let import = Command::new(&python)
        .args(["-c", "import tritonclient.http, numpy"])
        .output()
        .with_context(|| format!("running {}", python.display()))?;
    ensure!(
        import.status.success(),
        "{} cannot import tritonclient.http: run scripts/setup.sh\n{}",
        python.display(),
        String::from_utf8_lossy(&import.stderr)
    );
    let script = repo_root().join("tests/kserve_check.py");
    let dir = Scratch::new("kserve");
    let input = dir.path("coffee.u8");
    std::fs::write(
        &input,
        kneepoint_client::image::from_path(&photo, 224, 224)?,
    )?;

    let platform = Platform::up("kserv", &effnet)?;
    let listen = "127.0.0.1:8000";
    let gateway = Daemon::start_bin(
        &["ip", "netns", "exec", platform.client_ns()],
        "kp-gateway",
        &[
            "--platform".into(),
            platform.address(),
            "--models".into(),
            models.display().to_string(),
            "--model".into(),
            "efficientnet_lite0".into(),
            "--model".into(),
            "squeezenet".into(),
            "--listen".into(),
            listen.into(),
            "--timeout-ms".into(),
            "5000".into(),
        ],
        &[] as &[String],
        "kp-gateway: ready",
    )?;
    let out = run(platform
        .client_command(&python)
        .arg(&script)
        .args(["--url", listen])
        .arg("--input")
        .arg(&input))?;
    let summary: Value = serde_json::from_str(
        out.lines()
            .last()
            .context("kserve_check.py printed nothing")?,
    )
    .with_context(|| format!("kserve_check.py's last line is not JSON:\n{out}"))?;
    println!("kserve_check.py: {summary}");
    let report = gateway.stop()?;
    let reports = platform.stop()?;
    println!("kp-gateway: {report}");

    ensure!(summary["top1"] == 967, "summary: {summary}");
    ensure!(summary["curl_json_top1"] == 967, "summary: {summary}");
    ensure!(
        summary["tritonclient_errors"]
            == json!({
                "unknown_model": ["404", "unknown model 'nope'"],
                "unknown_if": ["404", "model 'squeezenet': UNKNOWN_IF: no inference function is deployed under if_id 1"],
                "wrong_shape": ["400", "input INPUT: shape [1, 200, 224, 3] is not [N, 224, 224, 3] with 1 <= N <= 8 for model 'efficientnet_lite0'"],
            }),
        "summary: {summary}"
    );
    ensure!(
        summary["curl"]
            == json!({
                "live": 200,
                "ready": [503, "model 'squeezenet' is not deployed (no inference function has if_id 1)"],
                "unknown_model": [404, "unknown model 'nope'"],
                "malformed_json": [400, "malformed inference request JSON: EOF while parsing a list at line 1 column 12"],
                "oversized": [413, "request body of 1269761 bytes exceeds the 1269760 bytes model 'efficientnet_lite0' can take"],
                "wrong_datatype": [400, "input INPUT of model 'efficientnet_lite0' is UINT8, the request says FP32"],
                "unknown_if": [404, "model 'squeezenet': UNKNOWN_IF: no inference function is deployed under if_id 1"],
            }),
        "summary: {summary}"
    );
    // Every infer request ended in one status: 5 answered (three
    // encodings, a batch of two, curl's JSON), 3 refused by the gateway
    // (shape, JSON, datatype), 3 not found (no such model; no IF, twice),
    // 1 too large; 8 platform requests (the batch is two).
    let g = &report["gateway"];
    ensure!(
        g["infer"] == json!({"200": 5, "400": 3, "404": 3, "413": 1})
            && g["platform_requests"] == 8
            && g["own_us"]["count"] == 5,
        "kp-gateway: {report}"
    );
    ensure!(
        report["client"]["timed_out"] == 0 && report["client"]["late"] == 0,
        "kp-gateway: {report}"
    );
    // The IF inferred the 6 photos (3 + a batch of 2 + curl's); readiness
    // probes (at most one a second) are its bad requests.
    ensure!(
        reports.kp_if["telemetry"]["answers"]["ok"] == 6,
        "kp-if: {}",
        reports.kp_if["telemetry"]
    );
    Ok(())
}
