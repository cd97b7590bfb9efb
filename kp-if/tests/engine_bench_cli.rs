//! `kp-engine-bench` as a user runs it: one JSON line per batch size, the
//! idle gap before each batch (`--gap-ms`) really idled and reported, and a
//! clear error for a bad value. Needs `make models` (squeezenet).

use std::path::PathBuf;
use std::process::{Command, Output};

use serde_json::Value;

fn squeezenet() -> PathBuf {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("models/squeezenet/config.toml");
    assert!(
        path.is_file(),
        "{} does not exist: run `make models` first",
        path.display()
    );
    path
}

fn engine_bench(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kp-engine-bench"))
        .arg("--model")
        .arg(squeezenet())
        .args(args)
        .output()
        .expect("run kp-engine-bench")
}

fn last_json_line(out: &Output) -> Value {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().last().unwrap_or_default();
    serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

#[test]
fn a_gap_is_idled_before_each_batch_and_left_out_of_the_rate() {
    for mode in ["sleep", "spin"] {
        let out = engine_bench(&[
            "--batches",
            "1",
            "--warmup",
            "1",
            "--iterations",
            "4",
            "--gap-ms",
            "50",
            "--gap-mode",
            mode,
        ]);
        assert!(
            out.status.success(),
            "{mode}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let line = last_json_line(&out);
        assert_eq!(line["gap_ms"], 50.0, "{line}");
        assert_eq!(line["gap_mode"], mode, "{line}");
        assert_eq!(line["iterations"], 4, "{line}");
        // Four gaps of 50 ms were idled, one before each measured batch, in
        // the measured span (four batches alone take ~25 ms)...
        let seconds = line["seconds"].as_f64().unwrap();
        assert!(seconds >= 0.2, "{mode}: measured for {seconds} s");
        // ...and the rate over all batches counts their own time only:
        // batch / mean latency, not batch / (latency + gap).
        let mean_ms = line["latency_ms"]["mean"].as_f64().unwrap();
        let total = line["images_per_s_total"].as_f64().unwrap();
        let own = 1e3 / mean_ms;
        assert!(
            (total - own).abs() <= 0.02 * own,
            "{mode}: {total} images/s against {own} from the mean latency"
        );
    }
}

#[test]
fn a_bad_gap_is_refused_with_a_clear_error() {
    let out = engine_bench(&["--batches", "1", "--gap-ms=-1"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--gap-ms must be"), "{err}");
    let out = engine_bench(&["--batches", "1", "--gap-mode", "doze"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("doze") && err.contains("sleep"), "{err}");
}

#[test]
fn a_cycle_runs_the_sizes_in_turn_and_says_what_ran_before() {
    let out = engine_bench(&[
        "--batches",
        "2,1,1",
        "--warmup",
        "1",
        "--iterations",
        "3",
        "--cycle",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    // One line per position: 2 after the last 1, 1 after 2, 1 after 1.
    let pairs: Vec<(u64, u64)> = lines
        .iter()
        .map(|l| (l["batch"].as_u64().unwrap(), l["after"].as_u64().unwrap()))
        .collect();
    assert_eq!(pairs, [(2, 1), (1, 2), (1, 1)], "{stdout}");
    for l in &lines {
        // Three rounds, each position once per round.
        assert_eq!(l["iterations"], 3, "{l}");
        // The thread's CPU time per batch: on the CPU, no more than the
        // wall time (a pinned engine thread is never off it for long).
        let cpu = l["cpu_ms"]["median"].as_f64().unwrap();
        let wall = l["latency_ms"]["median"].as_f64().unwrap();
        assert!(cpu > 0.0 && cpu <= wall * 1.01 + 0.01, "{l}");
    }
    // Without --cycle: no `after`, no CPU times, as before.
    let out = engine_bench(&["--batches", "1", "--warmup", "1", "--iterations", "2"]);
    let line = last_json_line(&out);
    assert!(
        line.get("after").is_none() && line.get("cpu_ms").is_none(),
        "{line}"
    );
}
