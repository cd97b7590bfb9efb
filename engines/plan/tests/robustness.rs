//! A model is user input: whatever a deployed ONNX file holds, planning it
//! returns a plan or an error, and a plan that was accepted runs or returns
//! an error — nothing panics. Checked on seeded structural mutations of a
//! real graph (squeezenet from models/): inputs dropped or renamed, outputs
//! removed, attributes given values of the wrong kind or out of range,
//! operators swapped, constants reshaped, the input's shape broken, nodes
//! reordered. Byte-level garbage is the fuzz target's business; this test
//! reaches the planner's own checks, which random bytes mostly do not get
//! past the protobuf decoder to.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;

use kp_plan::onnx::{self, Attr, Const, ConstData, Graph};
use kp_plan::{plan, CpuBackend};

/// SplitMix64, seeded: the same mutations on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

const OPS: [&str; 14] = [
    "Conv",
    "Relu",
    "MaxPool",
    "AveragePool",
    "Concat",
    "Softmax",
    "Gemm",
    "Reshape",
    "Flatten",
    "Sum",
    "Transpose",
    "LRN",
    "BatchNormalization",
    "Clip",
];

fn bad_attr(rng: &mut Rng) -> Attr {
    match rng.below(10) {
        0 => Attr::Int(-1),
        1 => Attr::Int(0),
        2 => Attr::Int(1 << 40),
        3 => Attr::Ints(vec![]),
        4 => Attr::Ints(vec![0, 0]),
        5 => Attr::Ints(vec![-3, 7, 1, 1]),
        6 => Attr::Ints(vec![1 << 40, 1]),
        7 => Attr::Float(f32::NAN),
        8 => Attr::Str("SAME_LOWER".into()),
        _ => Attr::Other,
    }
}

fn mutate(g: &mut Graph, rng: &mut Rng) {
    let i = rng.below(g.nodes.len());
    match rng.below(10) {
        0 => {
            let n = &mut g.nodes[i];
            if !n.inputs.is_empty() {
                let k = rng.below(n.inputs.len());
                n.inputs.remove(k);
            }
        }
        1 => g.nodes[i].outputs.clear(),
        2 => g.nodes[i].inputs.push(String::new()),
        3 => {
            let names = [
                "kernel_shape",
                "strides",
                "pads",
                "group",
                "axis",
                "perm",
                "size",
                "auto_pad",
                "dilations",
                "ceil_mode",
            ];
            let name = names[rng.below(names.len())].to_string();
            let value = bad_attr(rng);
            g.nodes[i].attrs.insert(name, value);
        }
        4 => g.nodes[i].op = OPS[rng.below(OPS.len())].to_string(),
        5 => {
            let n = &mut g.nodes[i];
            if !n.inputs.is_empty() {
                let k = rng.below(n.inputs.len());
                n.inputs[k] = "nowhere".into();
            }
        }
        6 => {
            let j = rng.below(g.nodes.len());
            g.nodes.swap(i, j);
        }
        7 => {
            let mut keys: Vec<String> = g.consts.keys().cloned().collect();
            keys.sort();
            let k = keys[rng.below(keys.len())].clone();
            let c = g.consts.get_mut(&k).expect("a key of the map");
            let rank = rng.below(5);
            c.shape = (0..rank).map(|_| rng.below(6)).collect();
            if rng.below(2) == 0 {
                // Keep the data consistent with the new shape sometimes, so
                // the planner's shape checks (not the decoder's) are reached.
                let n: usize = c.shape.iter().product();
                c.data = ConstData::F32(vec![0.5; n]);
            }
        }
        8 => {
            let d = [Some(0), None, Some(1 << 40), Some(1)][rng.below(4)];
            let k = rng.below(g.input_shape.len());
            g.input_shape[k] = d;
        }
        _ => {
            let j = rng.below(g.nodes.len());
            if let Some(o) = g.nodes[j].outputs.first().cloned() {
                g.nodes[i].outputs = vec![o];
            }
        }
    }
}

#[test]
fn mutated_graphs_plan_or_fail_and_accepted_plans_run_or_fail_without_a_panic() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/squeezenet/model.onnx");
    let base = onnx::read_path(&path).unwrap_or_else(|e| panic!("{e}: run `make models` first"));
    let mut rng = Rng(0x6b70_706c_616e);
    let (mut planned, mut refused, mut ran, mut run_errors) = (0, 0, 0, 0);
    for case in 0..300 {
        let mut g = base.clone();
        for _ in 0..1 + rng.below(3) {
            mutate(&mut g, &mut rng);
        }
        let built = catch_unwind(AssertUnwindSafe(|| plan::build(&g)))
            .unwrap_or_else(|_| panic!("case {case}: planning panicked"));
        let Ok(p) = built else {
            refused += 1;
            continue;
        };
        planned += 1;
        // Run a few of the accepted plans (each costs a squeezenet batch).
        if ran + run_errors >= 25 || p.arena_per_sample > 1 << 24 {
            continue;
        }
        let (i, o) = (p.input.elems(), p.output.elems());
        let result = catch_unwind(AssertUnwindSafe(|| {
            let mut cpu = CpuBackend::new(p, 1);
            let mut out = vec![0.0f32; o];
            cpu.run(&vec![0.25f32; i], 1, &mut out)
        }))
        .unwrap_or_else(|_| panic!("case {case}: running an accepted plan panicked"));
        match result {
            Ok(()) => ran += 1,
            Err(_) => run_errors += 1,
        }
    }
    eprintln!("300 mutated graphs: {planned} planned ({ran} run, {run_errors} run errors), {refused} refused");
    // The mutations must reach both outcomes, or the test checks little.
    assert!(
        refused >= 100 && planned >= 20,
        "{planned} planned, {refused} refused"
    );
}

#[test]
fn a_constant_with_data_of_the_wrong_length_is_refused_by_the_decoder() {
    use tract_onnx::pb;
    let t = pb::TensorProto {
        name: "w".into(),
        dims: vec![2, 3],
        data_type: 1,
        float_data: vec![1.0; 5],
        ..Default::default()
    };
    let e = onnx::tensor(&t).unwrap_err().to_string();
    assert!(e.contains("5 values for shape [2, 3]"), "{e}");
    let huge = pb::TensorProto {
        dims: vec![1 << 40, 1 << 40],
        data_type: 1,
        ..t
    };
    assert!(onnx::tensor(&huge)
        .unwrap_err()
        .to_string()
        .contains("too large"));
    // A Const built by hand keeps what it was given.
    let c = Const {
        shape: vec![2],
        data: ConstData::I64(vec![1, 2]),
    };
    assert!(c.f32s("x").is_err() && c.i64s("x").is_ok());
}
