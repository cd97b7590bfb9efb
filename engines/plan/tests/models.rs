//! Every model of the repository (models/, made by `make models`) as a plan:
//! it plans, and the CPU reference backend running the plan agrees with
//! ONNX Runtime on CPU — the same top-5 and a max difference below 1e-3 of
//! the largest score — at batch 2, and batch 1 gives the same result as the
//! first sample of the batch of 2 (offsets scale with the batch).

use std::path::{Path, PathBuf};

use kp_engine_onnxruntime::OnnxRuntime;
use kp_plan::{CpuBackend, Op, Plan, PlanError};
use libml::engine::{EngineConfig, Framework};
use rand::{Rng, SeedableRng};

fn models() -> Vec<(String, PathBuf)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models");
    let mut found: Vec<(String, PathBuf)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}: run `make models` first", dir.display()))
        .filter_map(|e| e.ok())
        .map(|e| {
            (
                e.file_name().to_string_lossy().into_owned(),
                e.path().join("model.onnx"),
            )
        })
        .filter(|(_, p)| p.exists())
        .collect();
    found.sort();
    assert!(
        found.len() >= 10,
        "models/ has {} models, the repository has 10 (run `make models`)",
        found.len()
    );
    found
}

/// Indices of the `k` largest scores, largest first.
fn top(scores: &[f32], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..scores.len()).collect();
    idx.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]));
    idx.truncate(k);
    idx
}

#[test]
fn every_model_plans_runs_and_agrees_with_onnxruntime() {
    let mut ort = OnnxRuntime::new();
    ort.init(&EngineConfig {
        intra_op_threads: 1,
    })
    .expect("ONNX Runtime (run `make setup`)");
    let mut report = Vec::new();
    for (name, path) in models() {
        let plan = Plan::load(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(plan.input.shape, vec![3, 224, 224], "{name}");
        let out = plan.output.elems();
        assert_eq!(out, 1000, "{name}: output {:?}", plan.output.shape);
        let census = plan.census();
        report.push(format!(
            "{name}: {} steps {census:?}, arena {:.1} MB/sample",
            plan.steps.len(),
            plan.arena_per_sample as f64 * 4e-6
        ));

        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        let input: Vec<f32> = (0..2 * 3 * 224 * 224)
            .map(|_| rng.random_range(-2.0f32..2.0))
            .collect();

        let mut reference = ort_session(&path);
        let mut want = vec![0.0f32; 2 * out];
        reference.infer_batch(&input, 2, &mut want).unwrap();
        drop(reference);

        let mut cpu = CpuBackend::new(plan, 2);
        let mut got = vec![0.0f32; 2 * out];
        cpu.run(&input, 2, &mut got).unwrap();
        for n in 0..2 {
            let (g, w) = (&got[n * out..(n + 1) * out], &want[n * out..(n + 1) * out]);
            let scale = w.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let diff = g
                .iter()
                .zip(w)
                .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
            assert!(
                diff <= 1e-3 * scale,
                "{name} sample {n}: max difference {diff} vs largest score {scale}"
            );
            assert_eq!(top(g, 5), top(w, 5), "{name} sample {n}: top-5 differs");
            report.push(format!(
                "  sample {n}: top-5 {:?}, max diff {diff:.2e} of {scale:.3}",
                top(w, 5)
            ));
        }
        let mut one = vec![0.0f32; out];
        cpu.run(&input[..3 * 224 * 224], 1, &mut one).unwrap();
        let diff = one
            .iter()
            .zip(&got[..out])
            .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(
            diff <= 1e-5,
            "{name}: batch 1 differs from sample 0 of batch 2 by {diff}"
        );
    }
    println!("{}", report.join("\n"));
}

fn ort_session(path: &Path) -> OnnxRuntime {
    let mut s = OnnxRuntime::new();
    s.init(&EngineConfig {
        intra_op_threads: 1,
    })
    .unwrap();
    s.load_model(path).unwrap();
    s.configure_batch(2).unwrap();
    s
}

#[test]
fn folding_leaves_no_batch_norm_after_a_convolution() {
    // resnet50: every BatchNormalization follows a convolution and folds
    // into it; every Relu fuses into the convolution or the sum before it.
    let (_, path) = models().into_iter().find(|(n, _)| n == "resnet50").unwrap();
    let plan = Plan::load(&path).unwrap();
    let census = plan.census();
    assert_eq!(census.get("conv"), Some(&53));
    assert_eq!(census.get("affine"), None, "{census:?}");
    assert_eq!(census.get("activation"), None, "{census:?}");
    assert_eq!(census.get("sum"), Some(&16));
    let relu_fused = plan
        .steps
        .iter()
        .filter(|s| match &s.op {
            Op::Conv(c) => c.act != kp_plan::Activation::Identity,
            Op::Sum { act } => *act != kp_plan::Activation::Identity,
            _ => false,
        })
        .count();
    assert_eq!(relu_fused, 49);
}

#[test]
fn an_unsupported_operator_is_refused_with_the_list() {
    use tract_onnx::pb;
    let value = |name: &str, dims: &[i64]| pb::ValueInfoProto {
        name: name.into(),
        r#type: Some(pb::TypeProto {
            value: Some(pb::type_proto::Value::TensorType(pb::type_proto::Tensor {
                elem_type: 1,
                shape: Some(pb::TensorShapeProto {
                    dim: dims
                        .iter()
                        .map(|&d| pb::tensor_shape_proto::Dimension {
                            value: Some(if d < 0 {
                                pb::tensor_shape_proto::dimension::Value::DimParam("N".into())
                            } else {
                                pb::tensor_shape_proto::dimension::Value::DimValue(d)
                            }),
                            ..Default::default()
                        })
                        .collect(),
                }),
            })),
            ..Default::default()
        }),
        ..Default::default()
    };
    let node = |op: &str, i: &str, o: &str| pb::NodeProto {
        op_type: op.into(),
        input: vec![i.into()],
        output: vec![o.into()],
        ..Default::default()
    };
    let model = pb::ModelProto {
        opset_import: vec![pb::OperatorSetIdProto {
            domain: String::new(),
            version: 13,
        }],
        graph: Some(pb::GraphProto {
            node: vec![
                node("Erf", "x", "a"),
                node("Relu", "a", "b"),
                node("Erf", "b", "c"),
                node("HardSwish", "c", "y"),
            ],
            input: vec![value("x", &[-1, 4])],
            output: vec![value("y", &[-1, 4])],
            ..Default::default()
        }),
        ..Default::default()
    };
    let graph = kp_plan::onnx::from_proto(&model).unwrap();
    match kp_plan::plan::build(&graph) {
        Err(PlanError::Unsupported(ops)) => {
            assert_eq!(
                ops,
                vec![
                    "Erf (2 nodes)".to_string(),
                    "HardSwish (1 node)".to_string()
                ]
            );
            let msg = PlanError::Unsupported(ops).to_string();
            assert_eq!(
                msg,
                "unsupported operators: Erf (2 nodes), HardSwish (1 node)"
            );
        }
        other => panic!("expected the unsupported operators, got {other:?}"),
    }
}

#[test]
fn a_bad_file_is_a_clear_error() {
    let dir = std::env::temp_dir().join(format!("kp-plan-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("bad.onnx");
    std::fs::write(&p, b"this is not protobuf \xff\xff\xff").unwrap();
    let e = Plan::load(&p).unwrap_err();
    assert!(matches!(e, PlanError::Read(_)), "{e}");
    assert!(Plan::load(&dir.join("missing.onnx"))
        .unwrap_err()
        .to_string()
        .contains("missing.onnx"));
    std::fs::remove_dir_all(&dir).unwrap();
}
