//! The plan's types and the planner that builds one from an ONNX graph.
//!
//! See the crate docs for the pipeline. The invariants every backend may
//! rely on:
//! - tensors are f32, NCHW, batch outermost; [`Tensor::shape`] is per sample;
//! - a step's output never shares memory with its inputs;
//! - [`Conv`] padding is symmetric, and so is a max pool's (an asymmetric
//!   one is an [`Op::Pad`] step before it, with zeros or -inf); only an
//!   average pool may keep asymmetric padding (its divisor depends on it);
//! - [`Op::Concat`] joins along channels, [`Op::Transpose`] never moves the
//!   batch dimension, [`Op::Gemm`] reads its input as `[batch, k]`.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use crate::memory;
use crate::onnx::{self, Const, ConstData, Graph, Node};
use crate::PlanError;

/// The most values one tensor may have per sample (2^31: 8 GiB of f32);
/// a graph beyond it is refused rather than overflowing sizes.
pub const MAX_ELEMS: usize = 1 << 31;

/// The product of `shape`, if it stays within [`MAX_ELEMS`].
fn checked_elems(shape: &[usize]) -> Option<usize> {
    shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .filter(|&e| e <= MAX_ELEMS)
}

/// The largest per-sample rank a [`Op::Transpose`] may have.
pub const MAX_RANK: usize = 8;

/// A range of [`Plan::params`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Param {
    /// First f32 of the range.
    pub offset: usize,
    /// Number of f32 values.
    pub len: usize,
}

impl Param {
    /// The range as a slice of the blob.
    pub fn of<'a>(&self, params: &'a [f32]) -> &'a [f32] {
        &params[self.offset..self.offset + self.len]
    }
}

/// A tensor of the plan: a buffer of the arena seen with a per-sample shape
/// (views share a buffer with the tensor they reshape).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tensor {
    /// Index into [`Plan::buffers`].
    pub buffer: usize,
    /// Shape per sample, e.g. `[64, 56, 56]`.
    pub shape: Vec<usize>,
}

impl Tensor {
    /// f32 values per sample.
    pub fn elems(&self) -> usize {
        self.shape.iter().product()
    }

    /// `[c, h, w]` of a rank-3 tensor (per sample), or a planning error.
    pub fn chw(&self) -> Result<[usize; 3], PlanError> {
        match self.shape.as_slice() {
            &[c, h, w] => Ok([c, h, w]),
            other => Err(PlanError::Graph(format!(
                "expected an image tensor [c, h, w] per sample, got {other:?}"
            ))),
        }
    }
}

/// A region of the arena, per sample.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Buffer {
    /// Offset in f32 per sample: at batch `b` the buffer starts at
    /// `offset * b`.
    pub offset: usize,
    /// f32 values per sample.
    pub elems: usize,
}

/// An activation fused into the step that produces a tensor.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub enum Activation {
    /// None.
    #[default]
    Identity,
    /// `max(x, 0)`.
    Relu,
    /// `min(max(x, min), max)` (Clip; ReLU6 when min is 0 and max 6).
    Clip {
        /// Lower bound.
        min: f32,
        /// Upper bound.
        max: f32,
    },
}

impl Activation {
    /// Applies the activation to one value.
    #[inline]
    pub fn apply(self, x: f32) -> f32 {
        match self {
            Activation::Identity => x,
            Activation::Relu => x.max(0.0),
            Activation::Clip { min, max } => x.max(min).min(max),
        }
    }
}

/// A 2-D convolution (grouped and depthwise included) with its bias and
/// activation, batch-norm already folded into the weights.
#[derive(Clone, Debug, PartialEq)]
pub struct Conv {
    /// Groups (`c_in` for depthwise).
    pub groups: usize,
    /// Kernel `[kh, kw]`.
    pub kernel: [usize; 2],
    /// Strides `[sh, sw]`.
    pub stride: [usize; 2],
    /// Dilations `[dh, dw]`.
    pub dilation: [usize; 2],
    /// Symmetric zero padding `[ph, pw]`.
    pub pad: [usize; 2],
    /// Weights `[c_out, c_in / groups, kh, kw]`.
    pub weight: Param,
    /// Bias `[c_out]`, if any.
    pub bias: Option<Param>,
    /// Fused activation.
    pub act: Activation,
}

/// Max or average.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolKind {
    /// Max pooling.
    Max,
    /// Average pooling; `count_include_pad` as in ONNX.
    Avg {
        /// Whether padded positions count in the divisor.
        count_include_pad: bool,
    },
}

/// A 2-D pooling window.
#[derive(Clone, Debug, PartialEq)]
pub struct Pool {
    /// Max or average.
    pub kind: PoolKind,
    /// Window `[kh, kw]`.
    pub kernel: [usize; 2],
    /// Strides `[sh, sw]`.
    pub stride: [usize; 2],
    /// Padding `[top, left, bottom, right]` (symmetric for max pools).
    pub pads: [usize; 4],
}

/// What a step computes. Inputs and output are in [`Step`].
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// Convolution (+ bias + activation).
    Conv(Conv),
    /// Copies the image into a larger one, filling the border with `value`.
    Pad {
        /// `[top, left, bottom, right]`.
        pads: [usize; 4],
        /// Fill value (0 before a convolution, -inf before a max pool).
        value: f32,
    },
    /// Max or average pooling (global pooling is a window of the whole image).
    Pool(Pool),
    /// Local response normalisation across channels (ONNX LRN).
    Lrn {
        /// Channels in the window.
        size: usize,
        /// Scale.
        alpha: f32,
        /// Exponent.
        beta: f32,
        /// Offset.
        bias: f32,
    },
    /// `y = x · Wᵀ + b` on `[batch, k]` inputs (Gemm, MatMul), activation fused.
    Gemm {
        /// Input features.
        k: usize,
        /// Output features.
        m: usize,
        /// `[m, k]`, row-major (alpha folded in).
        weight: Param,
        /// `[m]` (beta folded in), if any.
        bias: Option<Param>,
        /// Fused activation.
        act: Activation,
    },
    /// Softmax over `len` consecutive values, `rows` times per sample.
    Softmax {
        /// Rows per sample.
        rows: usize,
        /// Values per row.
        len: usize,
    },
    /// Concatenation along channels of all inputs.
    Concat,
    /// Element-wise sum of all inputs (same shape), activation fused.
    Sum {
        /// Fused activation.
        act: Activation,
    },
    /// `y[c] = x[c] * scale[c] + shift[c]` per channel (batch-norm, scale
    /// layers that could not fold into a convolution), activation fused.
    ChannelAffine {
        /// `[c]`.
        scale: Param,
        /// `[c]`.
        shift: Param,
        /// Fused activation.
        act: Activation,
    },
    /// Permutes the per-sample dimensions: output dim `i` is input dim
    /// `perm[i]`.
    Transpose {
        /// Permutation of the per-sample dimensions.
        perm: Vec<usize>,
    },
    /// An activation on its own (when nothing before could take it).
    Activation(Activation),
}

impl Op {
    /// A short name (for listings and the GPU mapping's errors).
    pub fn name(&self) -> &'static str {
        match self {
            Op::Conv(_) => "conv",
            Op::Pad { .. } => "pad",
            Op::Pool(p) => match p.kind {
                PoolKind::Max => "maxpool",
                PoolKind::Avg { .. } => "avgpool",
            },
            Op::Lrn { .. } => "lrn",
            Op::Gemm { .. } => "gemm",
            Op::Softmax { .. } => "softmax",
            Op::Concat => "concat",
            Op::Sum { .. } => "sum",
            Op::ChannelAffine { .. } => "affine",
            Op::Transpose { .. } => "transpose",
            Op::Activation(_) => "activation",
        }
    }

    fn activation_mut(&mut self) -> Option<&mut Activation> {
        match self {
            Op::Conv(c) => Some(&mut c.act),
            Op::Gemm { act, .. } | Op::Sum { act } | Op::ChannelAffine { act, .. } => Some(act),
            _ => None,
        }
    }
}

/// One step: an operation from input tensors to a fresh output tensor.
#[derive(Clone, Debug, PartialEq)]
pub struct Step {
    /// What it computes.
    pub op: Op,
    /// Its inputs.
    pub inputs: Vec<Tensor>,
    /// Its output (never overlapping an input).
    pub output: Tensor,
    /// The ONNX nodes it stands for (fused ones included), for messages.
    pub nodes: Vec<String>,
}

/// An executable plan: steps, buffers and parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// Where the batch's input is written (per sample, e.g. `[3, 224, 224]`).
    pub input: Tensor,
    /// Where the result is read.
    pub output: Tensor,
    /// The steps, in execution order.
    pub steps: Vec<Step>,
    /// The arena's buffers; [`Tensor::buffer`] indexes here.
    pub buffers: Vec<Buffer>,
    /// f32 values of the arena per sample (`* batch` for a batch).
    pub arena_per_sample: usize,
    /// Every parameter of every step.
    pub params: Vec<f32>,
    /// ONNX names of the input and output.
    pub io_names: (String, String),
}

impl Plan {
    /// Plans the model in an ONNX file.
    pub fn load(path: &std::path::Path) -> Result<Plan, PlanError> {
        build(&onnx::read_path(path)?)
    }

    /// Plans a model held in memory.
    pub fn from_bytes(bytes: &[u8]) -> Result<Plan, PlanError> {
        build(&onnx::read_bytes(bytes)?)
    }

    /// The arena range of a tensor's buffer at batch `batch`.
    pub fn range(&self, t: &Tensor, batch: usize) -> std::ops::Range<usize> {
        let b = self.buffers[t.buffer];
        b.offset * batch..(b.offset + b.elems) * batch
    }

    /// How many steps of each kind (for summaries).
    pub fn census(&self) -> BTreeMap<&'static str, usize> {
        let mut c = BTreeMap::new();
        for s in &self.steps {
            *c.entry(s.op.name()).or_insert(0) += 1;
        }
        c
    }
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "plan: input {:?} -> output {:?}, {} steps, arena {} f32/sample, {} params",
            self.input.shape,
            self.output.shape,
            self.steps.len(),
            self.arena_per_sample,
            self.params.len()
        )?;
        for (i, s) in self.steps.iter().enumerate() {
            writeln!(
                f,
                "{i:4} {:10} {:?} -> {:?} @{}  ({})",
                s.op.name(),
                s.inputs.iter().map(|t| &t.shape).collect::<Vec<_>>(),
                s.output.shape,
                self.buffers[s.output.buffer].offset,
                s.nodes.join("+")
            )?;
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// The planner.

/// A value during planning: a root (future buffer) seen with a shape.
#[derive(Clone, Debug)]
struct Value {
    root: usize,
    shape: Vec<usize>,
}

/// What a name of the ONNX graph stands for while planning.
#[derive(Clone, Debug)]
enum Named {
    Const(Const),
    Value(usize),
}

struct Builder<'g> {
    g: &'g Graph,
    named: HashMap<String, Named>,
    values: Vec<Value>,
    /// The step that writes each root (None for the input, root 0); its
    /// length is the number of roots.
    writer: Vec<Option<usize>>,
    steps: Vec<Step>,
    params: Vec<f32>,
    /// How many node inputs (and graph outputs) read each name.
    uses: HashMap<String, usize>,
    unsupported: BTreeMap<String, usize>,
}

/// Plans a decoded graph.
pub fn build(g: &Graph) -> Result<Plan, PlanError> {
    let input_shape = per_sample_input(g)?;
    let mut b = Builder {
        g,
        named: g
            .consts
            .iter()
            .map(|(k, v)| (k.clone(), Named::Const(v.clone())))
            .collect(),
        values: vec![Value {
            root: 0,
            shape: input_shape,
        }],
        writer: vec![None],
        steps: Vec::new(),
        params: Vec::new(),
        uses: HashMap::new(),
        unsupported: BTreeMap::new(),
    };
    b.named.insert(g.input.clone(), Named::Value(0));
    for n in &g.nodes {
        for i in n.inputs.iter().filter(|i| !i.is_empty()) {
            *b.uses.entry(i.clone()).or_insert(0) += 1;
        }
    }
    *b.uses.entry(g.output.clone()).or_insert(0) += 1;

    for n in &g.nodes {
        b.node(n)?;
    }
    if !b.unsupported.is_empty() {
        return Err(PlanError::Unsupported(
            b.unsupported
                .iter()
                .map(|(op, count)| {
                    format!("{op} ({count} node{})", if *count == 1 { "" } else { "s" })
                })
                .collect(),
        ));
    }
    let out = match b.named.get(&g.output) {
        Some(Named::Value(v)) => *v,
        Some(Named::Const(_)) => return Err(PlanError::Graph("the output is a constant".into())),
        None => {
            return Err(PlanError::Graph(format!(
                "no node produces the output {}",
                g.output
            )))
        }
    };
    if b.values[out].root == 0 {
        return Err(PlanError::Graph(
            "the output is the input itself: nothing to run".into(),
        ));
    }
    let output_value = b.values[out].clone();
    let Builder {
        values,
        steps,
        params,
        writer,
        ..
    } = b;
    // A root's size is its writer's output's (the input's for root 0); the
    // roots become the buffers, index for index.
    let input = Tensor {
        buffer: 0,
        shape: values[0].shape.clone(),
    };
    let root_elems: Vec<usize> = writer
        .iter()
        .map(|w| w.map_or(input.elems(), |s| steps[s].output.elems()))
        .collect();
    let layout = memory::assign(&steps, &root_elems, &writer, output_value.root);
    Ok(Plan {
        input,
        output: Tensor {
            buffer: output_value.root,
            shape: output_value.shape,
        },
        steps,
        buffers: layout.buffers,
        arena_per_sample: layout.arena_per_sample,
        params,
        io_names: (g.input.clone(), g.output.clone()),
    })
}

fn per_sample_input(g: &Graph) -> Result<Vec<usize>, PlanError> {
    if g.input_shape.len() < 2 {
        return Err(PlanError::Graph(format!(
            "input {} has shape {:?}: expected [batch, ...]",
            g.input, g.input_shape
        )));
    }
    let shape = g.input_shape[1..]
        .iter()
        .map(|d| {
            d.ok_or_else(|| {
                PlanError::Graph(format!(
                    "input {} has a symbolic dimension besides the batch: {:?}",
                    g.input, g.input_shape
                ))
            })
        })
        .collect::<Result<Vec<usize>, _>>()?;
    if checked_elems(&shape).is_none() {
        return Err(PlanError::Graph(format!(
            "input {} of {shape:?} per sample is beyond {MAX_ELEMS} values",
            g.input
        )));
    }
    Ok(shape)
}

fn usize_of(v: i64, what: &str) -> Result<usize, PlanError> {
    usize::try_from(v).map_err(|_| PlanError::Graph(format!("{what} is negative: {v}")))
}

/// The largest kernel, stride, dilation or padding accepted (and image side).
const MAX_DIM: usize = 1 << 20;

fn pair(n: &Node, name: &str, default: usize) -> Result<[usize; 2], PlanError> {
    match n.ints(name)? {
        None => Ok([default, default]),
        Some(&[a, b]) => {
            let v = [usize_of(a, name)?, usize_of(b, name)?];
            if v.iter().any(|&x| x > MAX_DIM) {
                return Err(PlanError::Graph(format!(
                    "node {} ({}): {name} {v:?} beyond {MAX_DIM}",
                    n.name, n.op
                )));
            }
            Ok(v)
        }
        Some(other) => Err(PlanError::Graph(format!(
            "node {} ({}): {name} {other:?} is not 2-D; only 2-D images are supported",
            n.name, n.op
        ))),
    }
}

/// ONNX `pads` `[top, left, bottom, right]` after `auto_pad`, and the output
/// size, for a window `k` (dilated) over `[h, w]`.
fn window(
    n: &Node,
    hw: [usize; 2],
    k: [usize; 2],
    stride: [usize; 2],
    ceil: bool,
) -> Result<([usize; 4], [usize; 2]), PlanError> {
    let auto = n.string("auto_pad", "NOTSET")?;
    let pads = match auto {
        "NOTSET" => match n.ints("pads")? {
            None => [0; 4],
            Some(&[t, l, b, r]) => [
                usize_of(t, "pads")?,
                usize_of(l, "pads")?,
                usize_of(b, "pads")?,
                usize_of(r, "pads")?,
            ],
            Some(other) => {
                return Err(PlanError::Graph(format!(
                    "node {}: pads {other:?} are not 2-D",
                    n.name
                )))
            }
        },
        "VALID" => [0; 4],
        "SAME_UPPER" | "SAME_LOWER" => {
            let mut p = [0; 4];
            for d in 0..2 {
                let out = hw[d].div_ceil(stride[d]);
                let total = ((out - 1) * stride[d] + k[d]).saturating_sub(hw[d]);
                let (small, big) = (total / 2, total - total / 2);
                if auto == "SAME_UPPER" {
                    p[d] = small;
                    p[d + 2] = big;
                } else {
                    p[d] = big;
                    p[d + 2] = small;
                }
            }
            p
        }
        other => {
            return Err(PlanError::Graph(format!(
                "node {}: auto_pad {other} is not an ONNX value",
                n.name
            )))
        }
    };
    if pads.iter().any(|&p| p > MAX_DIM) || hw.iter().any(|&x| x > MAX_DIM) {
        return Err(PlanError::Graph(format!(
            "node {}: padding {pads:?} or image {hw:?} beyond {MAX_DIM}",
            n.name
        )));
    }
    let mut out = [0; 2];
    for d in 0..2 {
        let span = hw[d] + pads[d] + pads[d + 2];
        if span < k[d] || stride[d] == 0 {
            return Err(PlanError::Graph(format!(
                "node {}: window {k:?} stride {stride:?} does not fit {hw:?} padded by {pads:?}",
                n.name
            )));
        }
        out[d] = if ceil {
            let mut o = (span - k[d]).div_ceil(stride[d]) + 1;
            // The last window must start inside the image or its top/left
            // padding (ONNX and PyTorch drop one that starts in the bottom/right padding).
            if (o - 1) * stride[d] >= hw[d] + pads[d] {
                o -= 1;
            }
            o
        } else {
            (span - k[d]) / stride[d] + 1
        };
    }
    Ok((pads, out))
}

/// Broadcasts a constant to one value per channel of a `[c, ...]` tensor
/// (numpy rules against the full `[batch, c, ...]` shape), or `None` when it
/// varies along anything but the channel.
fn per_channel(c: &Const, value_shape: &[usize]) -> Option<Vec<f32>> {
    let data = match &c.data {
        ConstData::F32(v) => v,
        ConstData::I64(_) => return None,
    };
    let rank = value_shape.len() + 1;
    if c.shape.len() > rank {
        return None;
    }
    let mut full = vec![1; rank - c.shape.len()];
    full.extend_from_slice(&c.shape);
    let channels = *value_shape.first()?;
    if full[0] != 1 || full[2..].iter().any(|&d| d != 1) {
        return None;
    }
    match full[1] {
        1 => Some(vec![data[0]; channels]),
        d if d == channels => Some(data.clone()),
        _ => None,
    }
}

impl Builder<'_> {
    fn value_of(&self, n: &Node, i: usize) -> Result<usize, PlanError> {
        let name = n.inputs.get(i).filter(|s| !s.is_empty()).ok_or_else(|| {
            PlanError::Graph(format!("node {} ({}) lacks input {i}", n.name, n.op))
        })?;
        match self.named.get(name) {
            Some(Named::Value(v)) => Ok(*v),
            Some(Named::Const(_)) => Err(PlanError::Graph(format!(
                "node {} ({}): input {name} is a constant where an activation is expected",
                n.name, n.op
            ))),
            None => Err(PlanError::Graph(format!(
                "node {} ({}): input {name} is produced by no earlier node",
                n.name, n.op
            ))),
        }
    }

    /// The activations a variadic node (Sum, Concat) reads, and the first;
    /// an error when it reads none.
    fn values_of(&self, n: &Node) -> Result<(Vec<usize>, usize), PlanError> {
        let xs: Vec<usize> = (0..n.inputs.len())
            .map(|i| self.value_of(n, i))
            .collect::<Result<_, _>>()?;
        match xs.first() {
            Some(&x0) => Ok((xs, x0)),
            None => Err(PlanError::Graph(format!(
                "node {} ({}) has no inputs",
                n.name, n.op
            ))),
        }
    }

    fn const_of(&self, n: &Node, i: usize) -> Result<Option<&Const>, PlanError> {
        let Some(name) = n.inputs.get(i).filter(|s| !s.is_empty()) else {
            return Ok(None);
        };
        match self.named.get(name) {
            Some(Named::Const(c)) => Ok(Some(c)),
            Some(Named::Value(_)) => Err(PlanError::Graph(format!(
                "node {} ({}): input {name} must be a constant (an initializer)",
                n.name, n.op
            ))),
            None => Err(PlanError::Graph(format!(
                "node {} ({}): input {name} is produced by no earlier node",
                n.name, n.op
            ))),
        }
    }

    fn is_const(&self, name: &str) -> bool {
        matches!(self.named.get(name), Some(Named::Const(_)))
    }

    fn tensor(&self, v: usize) -> Tensor {
        Tensor {
            buffer: self.values[v].root,
            shape: self.values[v].shape.clone(),
        }
    }

    fn param(&mut self, data: &[f32]) -> Param {
        let p = Param {
            offset: self.params.len(),
            len: data.len(),
        };
        self.params.extend_from_slice(data);
        p
    }

    fn name_output(&mut self, n: &Node, v: usize) {
        if let Some(o) = n.outputs.first() {
            self.named.insert(o.clone(), Named::Value(v));
        }
    }

    /// Adds a step writing a fresh buffer; returns the output value.
    fn emit(
        &mut self,
        n: &Node,
        op: Op,
        inputs: &[usize],
        shape: Vec<usize>,
    ) -> Result<usize, PlanError> {
        checked_elems(&shape).ok_or_else(|| {
            PlanError::Graph(format!(
                "node {} ({}): an output of {shape:?} per sample is beyond {MAX_ELEMS} values",
                n.name, n.op
            ))
        })?;
        let root = self.writer.len();
        self.writer.push(Some(self.steps.len()));
        self.values.push(Value { root, shape });
        let out = self.values.len() - 1;
        self.steps.push(Step {
            op,
            inputs: inputs.iter().map(|&v| self.tensor(v)).collect(),
            output: self.tensor(out),
            nodes: vec![n.name.clone()],
        });
        Ok(out)
    }

    fn view(&mut self, n: &Node, of: usize, shape: Vec<usize>) -> Result<(), PlanError> {
        let have: usize = self.values[of].shape.iter().product();
        if checked_elems(&shape) != Some(have) {
            return Err(PlanError::Graph(format!(
                "node {} ({}): cannot view {:?} as {shape:?}",
                n.name, n.op, self.values[of].shape
            )));
        }
        let root = self.values[of].root;
        self.values.push(Value { root, shape });
        let v = self.values.len() - 1;
        self.name_output(n, v);
        Ok(())
    }

    /// The step that wrote `v` when `v` is that step's own output (not a
    /// view), is read by nothing but node `n`'s input `i`, and is not the
    /// graph's output: a step the node may fold into.
    fn sole_writer(&self, n: &Node, i: usize, v: usize) -> Option<usize> {
        let name = n.inputs.get(i)?;
        if self.uses.get(name) != Some(&1) || *name == self.g.output {
            return None;
        }
        let s = self.writer[self.values[v].root]?;
        (self.steps[s].output.buffer == self.values[v].root
            && self.steps[s].output.shape == self.values[v].shape
            && self
                .values
                .iter()
                .filter(|x| x.root == self.values[v].root)
                .count()
                == 1)
            .then_some(s)
    }

    fn node(&mut self, n: &Node) -> Result<(), PlanError> {
        if n.outputs.first().is_none_or(|o| o.is_empty()) {
            return Err(PlanError::Graph(format!(
                "node {} ({}) has no output",
                n.name, n.op
            )));
        }
        // Nodes whose inputs are all constants fold at plan time.
        let data_inputs: Vec<&String> = n.inputs.iter().filter(|i| !i.is_empty()).collect();
        if n.op == "Constant" {
            return self.constant(n);
        }
        if !data_inputs.is_empty() && data_inputs.iter().all(|i| self.is_const(i)) {
            return self.fold(n);
        }
        match n.op.as_str() {
            "Conv" => self.conv(n),
            "BatchNormalization" => self.batch_norm(n),
            "Mul" | "Add" | "Sub" | "Div" => self.binary(n),
            "Sum" => self.sum(n),
            "Relu" => self.activation(n, Activation::Relu),
            "Clip" => {
                let (min, max) = self.clip_bounds(n)?;
                self.activation(n, Activation::Clip { min, max })
            }
            "MaxPool" | "AveragePool" => self.pool(n),
            "GlobalAveragePool" | "GlobalMaxPool" => self.global_pool(n),
            "LRN" => self.lrn(n),
            "Gemm" | "MatMul" => self.gemm(n),
            "Softmax" => self.softmax(n),
            "Concat" => self.concat(n),
            "Transpose" => self.transpose(n),
            "Reshape" | "Flatten" | "Unsqueeze" | "Squeeze" => self.reshape(n),
            "Dropout" | "Identity" => {
                if n.outputs.len() > 1 && n.outputs[1..].iter().any(|o| self.uses.contains_key(o)) {
                    return Err(PlanError::Graph(format!(
                        "node {}: Dropout's mask output is read; inference has none",
                        n.name
                    )));
                }
                let v = self.value_of(n, 0)?;
                self.name_output(n, v);
                Ok(())
            }
            other => {
                *self.unsupported.entry(other.to_string()).or_insert(0) += 1;
                // Keep going so that the error lists every unsupported
                // operator: give the outputs a placeholder shape.
                let v = self.value_of(n, 0).unwrap_or(0);
                for o in &n.outputs {
                    self.named.insert(o.clone(), Named::Value(v));
                }
                Ok(())
            }
        }
    }

    fn constant(&mut self, n: &Node) -> Result<(), PlanError> {
        match n.attrs.get("value") {
            Some(onnx::Attr::Tensor(t)) => {
                self.named
                    .insert(n.outputs[0].clone(), Named::Const(t.clone()));
                Ok(())
            }
            _ => Err(PlanError::Graph(format!(
                "node {}: Constant without a tensor value",
                n.name
            ))),
        }
    }

    /// Constant folding of the shape operators the zoo's graphs apply to
    /// initializers (Unsqueeze of a scale vector, Reshape of a weight).
    fn fold(&mut self, n: &Node) -> Result<(), PlanError> {
        let Some(c) = self.const_of(n, 0)?.cloned() else {
            return Err(PlanError::Graph(format!("node {} has no inputs", n.name)));
        };
        let shape = match n.op.as_str() {
            "Unsqueeze" => {
                let axes = match n.ints("axes")? {
                    Some(a) => a.to_vec(),
                    None => self
                        .const_of(n, 1)?
                        .map(|a| a.i64s("Unsqueeze axes"))
                        .transpose()?
                        .map(<[i64]>::to_vec)
                        .unwrap_or_default(),
                };
                let rank = c.shape.len() + axes.len();
                let mut axes: Vec<usize> = axes
                    .iter()
                    .map(|&a| usize_of(if a < 0 { a + rank as i64 } else { a }, "axis"))
                    .collect::<Result<_, _>>()?;
                axes.sort_unstable();
                let mut shape = c.shape.clone();
                for a in axes {
                    if a > shape.len() {
                        return Err(PlanError::Graph(format!("node {}: axis {a} out of range", n.name)));
                    }
                    shape.insert(a, 1);
                }
                shape
            }
            "Reshape" => {
                let target = self
                    .const_of(n, 1)?
                    .ok_or_else(|| PlanError::Graph(format!("node {}: Reshape without a shape", n.name)))?
                    .i64s("Reshape shape")?
                    .to_vec();
                reshape_target(&c.shape, &target)
                    .ok_or_else(|| PlanError::Graph(format!("node {}: cannot reshape {:?} to {target:?}", n.name, c.shape)))?
            }
            "Identity" | "Dropout" => c.shape.clone(),
            other => {
                return Err(PlanError::Graph(format!(
                    "node {} ({other}) has only constant inputs; the planner folds Unsqueeze, Reshape, Identity and Dropout of constants",
                    n.name
                )))
            }
        };
        self.named.insert(
            n.outputs[0].clone(),
            Named::Const(Const {
                shape,
                data: c.data,
            }),
        );
        Ok(())
    }

    fn reshape(&mut self, n: &Node) -> Result<(), PlanError> {
        let v = self.value_of(n, 0)?;
        let shape = &self.values[v].shape;
        let mut full = vec![1usize];
        full.extend_from_slice(shape);
        let new_full: Vec<usize> = match n.op.as_str() {
            "Flatten" => {
                let axis = n.int("axis", 1)?;
                if axis != 1 {
                    return Err(PlanError::Graph(format!(
                        "node {}: Flatten axis {axis} would mix samples of a batch; only axis 1 is supported",
                        n.name
                    )));
                }
                vec![1, shape.iter().product()]
            }
            "Reshape" => {
                let target = self
                    .const_of(n, 1)?
                    .ok_or_else(|| {
                        PlanError::Graph(format!("node {}: Reshape without a shape", n.name))
                    })?
                    .i64s("Reshape shape")?
                    .to_vec();
                // The batch dimension must stay first and alone: 0 (copy) or
                // -1 with every other dimension given.
                match target.first() {
                    Some(0) => {}
                    Some(-1) if target[1..].iter().all(|&d| d > 0) => {}
                    _ => {
                        return Err(PlanError::Graph(format!(
                            "node {}: Reshape to {target:?} does not keep the batch dimension first (0, or -1 with the rest given)",
                            n.name
                        )))
                    }
                }
                let mut t = target.clone();
                t[0] = 1;
                reshape_target(&full, &t).ok_or_else(|| {
                    PlanError::Graph(format!(
                        "node {}: cannot reshape {shape:?} to {target:?}",
                        n.name
                    ))
                })?
            }
            "Unsqueeze" | "Squeeze" => {
                let axes = match n.ints("axes")? {
                    Some(a) => a.to_vec(),
                    None => self
                        .const_of(n, 1)?
                        .map(|a| a.i64s("axes"))
                        .transpose()?
                        .map(<[i64]>::to_vec)
                        .unwrap_or_default(),
                };
                let mut s = full.clone();
                if n.op == "Unsqueeze" {
                    let rank = (s.len() + axes.len()) as i64;
                    let mut axes: Vec<i64> = axes
                        .iter()
                        .map(|&a| if a < 0 { a + rank } else { a })
                        .collect();
                    axes.sort_unstable();
                    for a in axes {
                        if a <= 0 || a as usize > s.len() {
                            return Err(PlanError::Graph(format!(
                                "node {}: Unsqueeze axis {a} would move the batch dimension",
                                n.name
                            )));
                        }
                        s.insert(a as usize, 1);
                    }
                } else {
                    let rank = s.len() as i64;
                    let axes: Vec<usize> = if axes.is_empty() {
                        (1..s.len()).filter(|&i| s[i] == 1).collect()
                    } else {
                        axes.iter()
                            .map(|&a| (if a < 0 { a + rank } else { a }) as usize)
                            .collect()
                    };
                    if axes.iter().any(|&a| a == 0 || a >= s.len() || s[a] != 1) {
                        return Err(PlanError::Graph(format!(
                            "node {}: Squeeze axes {axes:?} are not unit dimensions of {full:?} besides the batch",
                            n.name
                        )));
                    }
                    s = s
                        .iter()
                        .enumerate()
                        .filter(|(i, _)| !axes.contains(i))
                        .map(|(_, &d)| d)
                        .collect();
                }
                s
            }
            _ => unreachable!("reshape() is called for view operators only"),
        };
        self.view(n, v, new_full[1..].to_vec())
    }

    fn conv(&mut self, n: &Node) -> Result<(), PlanError> {
        let x = self.value_of(n, 0)?;
        let [c_in, h, w] = self.tensor(x).chw()?;
        let wt = self
            .const_of(n, 1)?
            .ok_or_else(|| PlanError::Graph(format!("node {}: Conv without weights", n.name)))?
            .clone();
        let groups = usize_of(n.int("group", 1)?, "group")?;
        let (&[c_out, cpg, kh, kw], true) = (wt.shape.as_slice(), groups > 0) else {
            return Err(PlanError::Graph(format!(
                "node {}: Conv weights {:?} are not [c_out, c_in/group, kh, kw]",
                n.name, wt.shape
            )));
        };
        if cpg * groups != c_in || c_out % groups != 0 {
            return Err(PlanError::Graph(format!(
                "node {}: {c_in} input channels, {groups} groups and weights {:?} do not agree",
                n.name, wt.shape
            )));
        }
        let stride = pair(n, "strides", 1)?;
        let dilation = pair(n, "dilations", 1)?;
        if kh == 0 || kw == 0 || kh > MAX_DIM || kw > MAX_DIM || dilation.contains(&0) {
            return Err(PlanError::Graph(format!(
                "node {}: kernel [{kh}, {kw}] with dilations {dilation:?}",
                n.name
            )));
        }
        let k_eff = [(kh - 1) * dilation[0] + 1, (kw - 1) * dilation[1] + 1];
        let (pads, out) = window(n, [h, w], k_eff, stride, false)?;
        let weight = self.param(wt.f32s("Conv weights")?);
        let bias = match self.const_of(n, 2)? {
            Some(b) => {
                let b = b.f32s("Conv bias")?.to_vec();
                if b.len() != c_out {
                    return Err(PlanError::Graph(format!(
                        "node {}: bias of {} for {c_out} output channels",
                        n.name,
                        b.len()
                    )));
                }
                Some(self.param(&b))
            }
            None => None,
        };
        let (src, pad) = self.symmetric(n, x, pads, 0.0)?;
        let op = Op::Conv(Conv {
            groups,
            kernel: [kh, kw],
            stride,
            dilation,
            pad,
            weight,
            bias,
            act: Activation::Identity,
        });
        let y = self.emit(n, op, &[src], vec![c_out, out[0], out[1]])?;
        self.name_output(n, y);
        Ok(())
    }

    /// Keeps symmetric padding in the step; lowers an asymmetric one to an
    /// explicit [`Op::Pad`] step filled with `fill`.
    fn symmetric(
        &mut self,
        n: &Node,
        x: usize,
        pads: [usize; 4],
        fill: f32,
    ) -> Result<(usize, [usize; 2]), PlanError> {
        if pads[0] == pads[2] && pads[1] == pads[3] {
            return Ok((x, [pads[0], pads[1]]));
        }
        let [c, h, w] = self.tensor(x).chw()?;
        let padded = self.emit(
            n,
            Op::Pad { pads, value: fill },
            &[x],
            vec![c, h + pads[0] + pads[2], w + pads[1] + pads[3]],
        )?;
        Ok((padded, [0, 0]))
    }

    /// Folds a per-channel `y = x * scale + shift` into the step that wrote
    /// `x` when nothing else reads it, else adds a [`Op::ChannelAffine`].
    fn affine(
        &mut self,
        n: &Node,
        x: usize,
        scale: Vec<f32>,
        shift: Vec<f32>,
    ) -> Result<(), PlanError> {
        if let Some(s) = self.sole_writer(n, 0, x) {
            match &self.steps[s].op {
                Op::Conv(c) if c.act == Activation::Identity => {
                    let c = c.clone();
                    let per_out = c.weight.len / scale.len();
                    for (m, &k) in scale.iter().enumerate() {
                        let o = c.weight.offset + m * per_out;
                        for w in &mut self.params[o..o + per_out] {
                            *w *= k;
                        }
                    }
                    let bias = match c.bias {
                        Some(b) => {
                            for (m, v) in self.params[b.offset..b.offset + b.len]
                                .iter_mut()
                                .enumerate()
                            {
                                *v = *v * scale[m] + shift[m];
                            }
                            b
                        }
                        None => self.param(&shift),
                    };
                    if let Op::Conv(c) = &mut self.steps[s].op {
                        c.bias = Some(bias);
                    }
                    self.steps[s].nodes.push(n.name.clone());
                    self.name_output(n, x);
                    return Ok(());
                }
                Op::ChannelAffine {
                    scale: s1,
                    shift: t1,
                    act: Activation::Identity,
                } => {
                    let (s1, t1) = (*s1, *t1);
                    for c in 0..scale.len() {
                        let (a, b) = (scale[c], shift[c]);
                        self.params[s1.offset + c] *= a;
                        self.params[t1.offset + c] = self.params[t1.offset + c] * a + b;
                    }
                    self.steps[s].nodes.push(n.name.clone());
                    self.name_output(n, x);
                    return Ok(());
                }
                _ => {}
            }
        }
        let shape = self.values[x].shape.clone();
        let scale = self.param(&scale);
        let shift = self.param(&shift);
        let y = self.emit(
            n,
            Op::ChannelAffine {
                scale,
                shift,
                act: Activation::Identity,
            },
            &[x],
            shape,
        )?;
        self.name_output(n, y);
        Ok(())
    }

    fn batch_norm(&mut self, n: &Node) -> Result<(), PlanError> {
        let x = self.value_of(n, 0)?;
        let c = *self.values[x].shape.first().unwrap_or(&0);
        let eps = n.float("epsilon", 1e-5)?;
        let get = |i: usize, what: &str| -> Result<Vec<f32>, PlanError> {
            let t = self.const_of(n, i)?.ok_or_else(|| {
                PlanError::Graph(format!(
                    "node {}: BatchNormalization lacks its {what}",
                    n.name
                ))
            })?;
            let v = t.f32s(what)?.to_vec();
            if v.len() != c {
                return Err(PlanError::Graph(format!(
                    "node {}: {what} has {} values for {c} channels",
                    n.name,
                    v.len()
                )));
            }
            Ok(v)
        };
        let (gamma, beta, mean, var) = (
            get(1, "scale")?,
            get(2, "bias")?,
            get(3, "mean")?,
            get(4, "var")?,
        );
        let scale: Vec<f32> = (0..c).map(|i| gamma[i] / (var[i] + eps).sqrt()).collect();
        let shift: Vec<f32> = (0..c).map(|i| beta[i] - mean[i] * scale[i]).collect();
        self.affine(n, x, scale, shift)
    }

    fn binary(&mut self, n: &Node) -> Result<(), PlanError> {
        if n.inputs.len() != 2 {
            return Err(PlanError::Graph(format!(
                "node {} ({}) has {} inputs, not 2",
                n.name,
                n.op,
                n.inputs.len()
            )));
        }
        let (a_const, b_const) = (self.is_const(&n.inputs[0]), self.is_const(&n.inputs[1]));
        if !a_const && !b_const {
            if n.op == "Add" {
                return self.sum(n);
            }
            *self
                .unsupported
                .entry(format!("{} of two activations", n.op))
                .or_insert(0) += 1;
            return Ok(());
        }
        let (xi, ci) = if a_const { (1, 0) } else { (0, 1) };
        if a_const && (n.op == "Sub" || n.op == "Div") {
            *self
                .unsupported
                .entry(format!("{} with a constant first operand", n.op))
                .or_insert(0) += 1;
            return Ok(());
        }
        let x = self.value_of(n, xi)?;
        let shape = self.values[x].shape.clone();
        let Some(k) = self.const_of(n, ci)?.and_then(|c| per_channel(c, &shape)) else {
            *self
                .unsupported
                .entry(format!("{} with a constant that is not per channel", n.op))
                .or_insert(0) += 1;
            return Ok(());
        };
        let c = k.len();
        let (scale, shift) = match n.op.as_str() {
            "Mul" => (k, vec![0.0; c]),
            "Div" => (k.iter().map(|v| 1.0 / v).collect(), vec![0.0; c]),
            "Add" => (vec![1.0; c], k),
            _ => (vec![1.0; c], k.iter().map(|v| -v).collect()),
        };
        // The fold looks at input 0; present the activation there.
        if xi == 1 {
            let mut swapped = n.clone();
            swapped.inputs.swap(0, 1);
            return self.affine(&swapped, x, scale, shift);
        }
        self.affine(n, x, scale, shift)
    }

    fn sum(&mut self, n: &Node) -> Result<(), PlanError> {
        let (xs, x0) = self.values_of(n)?;
        let shape = self.values[x0].shape.clone();
        if xs.iter().any(|&x| self.values[x].shape != shape) {
            *self
                .unsupported
                .entry(format!("{} with broadcasting", n.op))
                .or_insert(0) += 1;
            return Ok(());
        }
        if xs.len() == 1 {
            self.name_output(n, xs[0]);
            return Ok(());
        }
        let y = self.emit(
            n,
            Op::Sum {
                act: Activation::Identity,
            },
            &xs,
            shape,
        )?;
        self.name_output(n, y);
        Ok(())
    }

    fn clip_bounds(&self, n: &Node) -> Result<(f32, f32), PlanError> {
        if self.g.opset < 11 {
            return Ok((n.float("min", f32::MIN)?, n.float("max", f32::MAX)?));
        }
        let bound = |i: usize, default: f32| -> Result<f32, PlanError> {
            Ok(match self.const_of(n, i)? {
                Some(c) => *c.f32s("Clip bound")?.first().unwrap_or(&default),
                None => default,
            })
        };
        Ok((bound(1, f32::MIN)?, bound(2, f32::MAX)?))
    }

    fn activation(&mut self, n: &Node, act: Activation) -> Result<(), PlanError> {
        let x = self.value_of(n, 0)?;
        if let Some(s) = self.sole_writer(n, 0, x) {
            if let Some(a) = self.steps[s].op.activation_mut() {
                if *a == Activation::Identity {
                    *a = act;
                    self.steps[s].nodes.push(n.name.clone());
                    self.name_output(n, x);
                    return Ok(());
                }
            }
        }
        let shape = self.values[x].shape.clone();
        let y = self.emit(n, Op::Activation(act), &[x], shape)?;
        self.name_output(n, y);
        Ok(())
    }

    fn pool(&mut self, n: &Node) -> Result<(), PlanError> {
        let x = self.value_of(n, 0)?;
        let [c, h, w] = self.tensor(x).chw()?;
        let kernel = pair(n, "kernel_shape", 0)?;
        if kernel.contains(&0) {
            return Err(PlanError::Graph(format!(
                "node {}: pool without kernel_shape",
                n.name
            )));
        }
        let stride = pair(n, "strides", 1)?;
        if pair(n, "dilations", 1)? != [1, 1] {
            *self
                .unsupported
                .entry(format!("{} with dilations", n.op))
                .or_insert(0) += 1;
            return Ok(());
        }
        if n.int("storage_order", 0)? != 0 {
            *self
                .unsupported
                .entry(format!("{} with storage_order 1", n.op))
                .or_insert(0) += 1;
            return Ok(());
        }
        let ceil = n.int("ceil_mode", 0)? != 0;
        let (pads, out) = window(n, [h, w], kernel, stride, ceil)?;
        // ceil_mode may let the last window run past the bottom/right
        // padding: by this much per dimension.
        let hw = [h, w];
        let extra = [0, 1].map(|d| {
            ((out[d] - 1) * stride[d] + kernel[d]).saturating_sub(hw[d] + pads[d] + pads[d + 2])
        });
        let (kind, src, pads) = if n.op == "MaxPool" {
            if n.outputs.len() > 1 && n.outputs[1..].iter().any(|o| self.uses.contains_key(o)) {
                *self
                    .unsupported
                    .entry("MaxPool with indices".into())
                    .or_insert(0) += 1;
                return Ok(());
            }
            // The -inf fill covers the ceil_mode overhang as well.
            let pads = [pads[0], pads[1], pads[2] + extra[0], pads[3] + extra[1]];
            let (src, p) = self.symmetric(n, x, pads, f32::NEG_INFINITY)?;
            (PoolKind::Max, src, [p[0], p[1], p[0], p[1]])
        } else {
            if extra != [0, 0] {
                *self
                    .unsupported
                    .entry("AveragePool with ceil_mode windows past the padding".into())
                    .or_insert(0) += 1;
                return Ok(());
            }
            let count_include_pad = n.int("count_include_pad", 0)? != 0;
            (PoolKind::Avg { count_include_pad }, x, pads)
        };
        let op = Op::Pool(Pool {
            kind,
            kernel,
            stride,
            pads,
        });
        let y = self.emit(n, op, &[src], vec![c, out[0], out[1]])?;
        self.name_output(n, y);
        Ok(())
    }

    fn global_pool(&mut self, n: &Node) -> Result<(), PlanError> {
        let x = self.value_of(n, 0)?;
        let [c, h, w] = self.tensor(x).chw()?;
        let kind = if n.op == "GlobalMaxPool" {
            PoolKind::Max
        } else {
            PoolKind::Avg {
                count_include_pad: false,
            }
        };
        let op = Op::Pool(Pool {
            kind,
            kernel: [h, w],
            stride: [1, 1],
            pads: [0; 4],
        });
        let y = self.emit(n, op, &[x], vec![c, 1, 1])?;
        self.name_output(n, y);
        Ok(())
    }

    fn lrn(&mut self, n: &Node) -> Result<(), PlanError> {
        let x = self.value_of(n, 0)?;
        let shape = self.tensor(x).chw()?.to_vec();
        let size = usize_of(n.int("size", 0)?, "size")?;
        if size == 0 {
            return Err(PlanError::Graph(format!(
                "node {}: LRN without size",
                n.name
            )));
        }
        let op = Op::Lrn {
            size,
            alpha: n.float("alpha", 1e-4)?,
            beta: n.float("beta", 0.75)?,
            bias: n.float("bias", 1.0)?,
        };
        let y = self.emit(n, op, &[x], shape)?;
        self.name_output(n, y);
        Ok(())
    }

    fn gemm(&mut self, n: &Node) -> Result<(), PlanError> {
        let x = self.value_of(n, 0)?;
        let &[k] = self.values[x].shape.as_slice() else {
            return Err(PlanError::Graph(format!(
                "node {} ({}): input per sample is {:?}, expected a vector [k] (flatten first)",
                n.name, n.op, self.values[x].shape
            )));
        };
        let gemm = n.op == "Gemm";
        if gemm && n.int("transA", 0)? != 0 {
            *self
                .unsupported
                .entry("Gemm with transA".into())
                .or_insert(0) += 1;
            return Ok(());
        }
        let trans_b = gemm && n.int("transB", 0)? != 0;
        let (alpha, beta) = if gemm {
            (n.float("alpha", 1.0)?, n.float("beta", 1.0)?)
        } else {
            (1.0, 1.0)
        };
        let b = self
            .const_of(n, 1)?
            .ok_or_else(|| PlanError::Graph(format!("node {}: {} without weights", n.name, n.op)))?
            .clone();
        let (rows, cols) = match b.shape.as_slice() {
            &[r, c] => (r, c),
            other => {
                return Err(PlanError::Graph(format!(
                    "node {}: weights {other:?} are not a matrix",
                    n.name
                )))
            }
        };
        let m = if trans_b { rows } else { cols };
        if (if trans_b { cols } else { rows }) != k {
            return Err(PlanError::Graph(format!(
                "node {}: input of {k} features, weights {:?} (transB {trans_b})",
                n.name, b.shape
            )));
        }
        let data = b.f32s("weights")?;
        // Stored [m, k] row-major (Wᵀ of the maths), alpha folded in.
        let w: Vec<f32> = if trans_b {
            data.iter().map(|v| v * alpha).collect()
        } else {
            let mut t = vec![0.0; m * k];
            for r in 0..k {
                for c in 0..m {
                    t[c * k + r] = data[r * m + c] * alpha;
                }
            }
            t
        };
        let weight = self.param(&w);
        let bias = match if gemm {
            self.const_of(n, 2)?.cloned()
        } else {
            None
        } {
            Some(c) => {
                let v = c.f32s("Gemm bias")?;
                let full: Vec<f32> = match v.len() {
                    1 => vec![v[0] * beta; m],
                    l if l == m => v.iter().map(|x| x * beta).collect(),
                    l => {
                        return Err(PlanError::Graph(format!(
                            "node {}: bias of {l} values for {m} outputs (only per-output or scalar bias)",
                            n.name
                        )))
                    }
                };
                Some(self.param(&full))
            }
            None => None,
        };
        let op = Op::Gemm {
            k,
            m,
            weight,
            bias,
            act: Activation::Identity,
        };
        let y = self.emit(n, op, &[x], vec![m])?;
        self.name_output(n, y);
        Ok(())
    }

    fn softmax(&mut self, n: &Node) -> Result<(), PlanError> {
        let x = self.value_of(n, 0)?;
        let shape = self.values[x].shape.clone();
        let rank = shape.len() as i64 + 1;
        let default = if self.g.opset >= 13 { -1 } else { 1 };
        let axis = n.int("axis", default)?;
        let axis = if axis < 0 { axis + rank } else { axis };
        if axis < 1 || axis >= rank {
            return Err(PlanError::Graph(format!(
                "node {}: Softmax axis {axis} must be a per-sample dimension of {shape:?}",
                n.name
            )));
        }
        let a = axis as usize - 1;
        let (rows, len) = if self.g.opset >= 13 {
            if a + 1 != shape.len() && shape[a + 1..].iter().any(|&d| d != 1) {
                *self
                    .unsupported
                    .entry("Softmax over an inner axis".into())
                    .or_insert(0) += 1;
                return Ok(());
            }
            (shape[..a].iter().product(), shape[a])
        } else {
            // Before opset 13 the input is coerced to 2-D at the axis.
            (shape[..a].iter().product(), shape[a..].iter().product())
        };
        let y = self.emit(n, Op::Softmax { rows, len }, &[x], shape)?;
        self.name_output(n, y);
        Ok(())
    }

    fn concat(&mut self, n: &Node) -> Result<(), PlanError> {
        let (xs, x0) = self.values_of(n)?;
        let first = self.values[x0].shape.clone();
        if first.is_empty() {
            return Err(PlanError::Graph(format!(
                "node {}: Concat of per-sample scalars",
                n.name
            )));
        }
        let rank = first.len() as i64 + 1;
        let axis = n.int("axis", 1)?;
        if (if axis < 0 { axis + rank } else { axis }) != 1 {
            *self
                .unsupported
                .entry("Concat along an axis other than the channels".into())
                .or_insert(0) += 1;
            return Ok(());
        }
        let mut shape = first.clone();
        shape[0] = 0;
        for &x in &xs {
            let s = &self.values[x].shape;
            if s.len() != first.len() || s[1..] != first[1..] {
                return Err(PlanError::Graph(format!(
                    "node {}: cannot concatenate {first:?} and {s:?} along channels",
                    n.name
                )));
            }
            shape[0] += s[0];
        }
        let y = self.emit(n, Op::Concat, &xs, shape)?;
        self.name_output(n, y);
        Ok(())
    }

    fn transpose(&mut self, n: &Node) -> Result<(), PlanError> {
        let x = self.value_of(n, 0)?;
        let shape = self.values[x].shape.clone();
        let rank = shape.len() + 1;
        let perm: Vec<usize> = match n.ints("perm")? {
            Some(p) => p
                .iter()
                .map(|&v| usize_of(v, "perm"))
                .collect::<Result<_, _>>()?,
            None => (0..rank).rev().collect(),
        };
        let mut sorted = perm.clone();
        sorted.sort_unstable();
        if sorted != (0..rank).collect::<Vec<_>>() || perm[0] != 0 {
            return Err(PlanError::Graph(format!(
                "node {}: perm {perm:?} must be a permutation that keeps the batch first",
                n.name
            )));
        }
        if shape.len() > MAX_RANK {
            return Err(PlanError::Graph(format!(
                "node {}: Transpose of rank {} per sample; at most {MAX_RANK}",
                n.name,
                shape.len()
            )));
        }
        let perm: Vec<usize> = perm[1..].iter().map(|p| p - 1).collect();
        let out_shape = perm.iter().map(|&p| shape[p]).collect();
        let y = self.emit(n, Op::Transpose { perm }, &[x], out_shape)?;
        self.name_output(n, y);
        Ok(())
    }
}

/// ONNX Reshape's target with 0 (copy) and -1 (infer) resolved.
fn reshape_target(from: &[usize], target: &[i64]) -> Option<Vec<usize>> {
    let total = checked_elems(from)?;
    let mut out = Vec::with_capacity(target.len());
    let mut infer = None;
    for (i, &t) in target.iter().enumerate() {
        match t {
            0 => out.push(*from.get(i)?),
            -1 if infer.is_none() => {
                infer = Some(i);
                out.push(1);
            }
            t if t > 0 => out.push(t as usize),
            _ => return None,
        }
    }
    let known = checked_elems(&out)?;
    if let Some(i) = infer {
        if known == 0 || !total.is_multiple_of(known) {
            return None;
        }
        out[i] = total / known;
    }
    (checked_elems(&out)? == total).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reshape_target_resolves_copy_and_infer() {
        assert_eq!(reshape_target(&[1, 2, 3, 4], &[0, -1]), Some(vec![1, 24]));
        assert_eq!(
            reshape_target(&[1, 8, 7, 7], &[0, 2, 4, 7, 7]),
            Some(vec![1, 2, 4, 7, 7])
        );
        assert_eq!(reshape_target(&[1, 8], &[0, 3]), None);
        assert_eq!(reshape_target(&[1, 8], &[-1, -1]), None);
    }

    #[test]
    fn per_channel_broadcasts_only_along_channels() {
        let c = |shape: Vec<usize>, data: Vec<f32>| Const {
            shape,
            data: ConstData::F32(data),
        };
        let shape = [3, 4, 4];
        assert_eq!(
            per_channel(&c(vec![3, 1, 1], vec![1., 2., 3.]), &shape),
            Some(vec![1., 2., 3.])
        );
        assert_eq!(
            per_channel(&c(vec![1, 3, 1, 1], vec![1., 2., 3.]), &shape),
            Some(vec![1., 2., 3.])
        );
        assert_eq!(per_channel(&c(vec![], vec![5.]), &shape), Some(vec![5.; 3]));
        // [3] aligns with the width, not the channels.
        assert_eq!(per_channel(&c(vec![3], vec![1., 2., 3.]), &[3, 4, 3]), None);
        assert_eq!(per_channel(&c(vec![3, 4, 1], vec![0.; 12]), &shape), None);
    }
}
