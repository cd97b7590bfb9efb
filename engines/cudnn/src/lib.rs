//! The `cudnn` engine: a [`kp_plan::Plan`] run on one GPU, as a libml
//! `Framework`.
//!
//! The plan (shapes, folded batch-norm, fused activations, lowered padding,
//! arena offsets) is built and proven on the CPU by `kp-plan`; this crate
//! only maps each step onto the GPU through `kp_cuda::dnn`:
//!
//! | plan step       | on the GPU                                          |
//! |-----------------|-----------------------------------------------------|
//! | conv            | `cudnnConvolutionForward` (+ `kp_bias_act`)         |
//! | pad             | `kp_pad`                                            |
//! | max/avg pool    | `cudnnPoolingForward`; `kp_avgpool` when asymmetric |
//! | lrn             | `cudnnLRNCrossChannelForward`                       |
//! | gemm            | `cublasSgemm` (+ `kp_bias_act`)                     |
//! | softmax         | `cudnnSoftmaxForward` (accurate, per instance)      |
//! | concat          | `kp_copy_block` per input                           |
//! | sum             | `kp_add` per extra input                            |
//! | affine          | `kp_affine`                                         |
//! | transpose       | `kp_transpose`                                      |
//! | activation      | `kp_act`                                            |
//!
//! Everything is planned once per batch size in
//! [`GpuPlan::configure`]: cuDNN descriptors and algorithms for
//! every batch size up to the maximum, one device arena for the largest
//! batch (the plan's offsets times the batch), one workspace for the
//! largest convolution, the parameters uploaded once at load. A batch
//! gets its input into the arena — copied from host memory
//! ([`GpuPlan::run`]), or, in an IF, gathered on the device straight from
//! the pinned input pool ([`GpuPlan::run_gathered`], `kp_cuda::PoolGather`)
//! — replays the steps of its batch size, captured at `configure` as one
//! CUDA graph (or enqueues them one by one when capturing failed), on the
//! GPU's one stream and reads the output back.
//!
//! [`GpuPlan`] is the engine itself and needs nothing but kp-plan and
//! kp-cuda (so `kp-gpu-check` carries it to GPU machines without DPDK);
//! with the default `framework` feature, [`CudnnEngine`] wraps it as a
//! libml `Framework` for the IF. Errors are values: no GPU, no driver or
//! no cuDNN is an `EngineError::Library` that says what was looked for, at
//! `Framework::init`; there is no CPU fallback. The device is
//! `$KP_GPU_DEVICE` (default 0).
//!
//! # Status
//!
//! Unit-tested here without a GPU; `make gpu-check` runs every model of the
//! repository through it against ONNX Runtime on a GPU machine. Passed on
//! an NVIDIA H200 (27 November 2026; docs/PERFORMANCE.md): all ten models,
//! graphs and eager steps bit for bit equal, the in-place path too.

use kp_cuda::cudarc::driver::sys::CUevent_flags;
use kp_cuda::cudarc::driver::CudaEvent;
use kp_cuda::dnn::{
    self, Act, ConvOp, ConvSpec, DeviceF32, Dnn, LrnOp, LrnSpec, Nchw, PoolOp, PoolSpec, SoftmaxOp,
    StepGraph,
};
use kp_cuda::gather::GatherShape;
use kp_cuda::{Gpu, GpuError, PoolGather};
use kp_plan::{Activation, Op, Plan, PoolKind};

#[cfg(feature = "framework")]
mod framework;
#[cfg(feature = "framework")]
pub use framework::{gather_shape, pool_gather, slot_offsets, CudnnEngine, Normalisation};

/// The environment variable naming the GPU ordinal.
pub const DEVICE_ENV: &str = "KP_GPU_DEVICE";

/// A plan on one GPU: its parameters uploaded, and once configured, the
/// library ops of every batch size, the arena and the workspace.
#[derive(Debug)]
pub struct GpuPlan {
    gpu: Gpu,
    dnn: Dnn,
    plan: Plan,
    params: DeviceF32,
    run: Option<Configured>,
    pool: Option<PoolGather>,
    stats: GpuStats,
    /// Whether batches replay the captured graphs (when there are any).
    use_graphs: bool,
}

/// What a [`GpuPlan`] measured on its GPU.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GpuStats {
    /// Batches run since `configure`.
    pub batches: u64,
    /// Their GPU time summed, ns (CUDA events from the input's copy to the
    /// last step).
    pub busy_ns: u64,
    /// The last batch's GPU time, ns.
    pub last_batch_ns: u64,
    /// The last batch's input reaching the device (the gather from the
    /// pool, or the copy from host memory), ns; part of `last_batch_ns`.
    pub last_input_ns: u64,
    /// Device memory held: parameters, arena, workspace, bytes.
    pub memory_bytes: u64,
}

#[derive(Debug)]
struct Configured {
    max_batch: usize,
    arena: DeviceF32,
    workspace: DeviceF32,
    /// `per_batch[b - 1][step]`: the library ops of each step at batch `b`.
    per_batch: Vec<Vec<StepOp>>,
    /// `graphs[b - 1]`: the steps at batch `b` captured as one CUDA graph;
    /// empty when capturing failed (`graphs_error` says why).
    graphs: Vec<StepGraph>,
    graphs_error: Option<String>,
    /// Start of a batch's work on the stream, its input on the device,
    /// its end.
    events: (CudaEvent, CudaEvent, CudaEvent),
}

impl Configured {
    /// Enqueues every step of `plan` at batch `b`, one host call each.
    fn enqueue(
        &mut self,
        d: &Dnn,
        plan: &Plan,
        params: &DeviceF32,
        b: usize,
    ) -> Result<(), GpuError> {
        let ops = &self.per_batch[b - 1];
        run_steps(
            d,
            plan,
            ops,
            b,
            &mut self.arena,
            params,
            &mut self.workspace,
        )
    }
}

/// How a configured [`GpuPlan`] runs its steps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StepLaunch {
    /// One CUDA graph launch per batch (captured at `configure` for every
    /// batch size); `nodes` is the largest batch's graph size.
    Graphs {
        /// Nodes of the largest batch's graph.
        nodes: usize,
    },
    /// One host call per step (graphs turned off).
    Eager,
    /// One host call per step because capturing failed: the reason.
    EagerCaptureFailed(String),
}

impl std::fmt::Display for StepLaunch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StepLaunch::Graphs { nodes } => {
                write!(f, "CUDA graphs ({nodes} nodes at the largest batch)")
            }
            StepLaunch::Eager => write!(f, "eager (graphs off)"),
            StepLaunch::EagerCaptureFailed(why) => {
                write!(f, "eager (capturing a CUDA graph failed: {why})")
            }
        }
    }
}

#[derive(Debug)]
enum StepOp {
    Conv(ConvOp),
    Pool(PoolOp),
    Lrn(LrnOp),
    Softmax(SoftmaxOp),
    /// A step run by a kernel that needs no prepared state.
    Kernel,
}

/// The GPU the GPU engines use: `$KP_GPU_DEVICE`, default 0; an error
/// names a value that is not an ordinal.
pub fn device_ordinal() -> Result<usize, String> {
    match std::env::var(DEVICE_ENV) {
        Ok(v) => v
            .parse()
            .map_err(|_| format!("{DEVICE_ENV}={v:?} is not a GPU ordinal")),
        Err(_) => Ok(0),
    }
}

/// Opens GPU `ordinal` and its libraries (cuDNN, cuBLAS, the step kernels).
pub fn open(ordinal: usize) -> Result<(Gpu, Dnn), GpuError> {
    let gpu = Gpu::open(ordinal)?;
    let dnn = Dnn::new(&gpu)?;
    Ok((gpu, dnn))
}

impl GpuPlan {
    /// Uploads `plan`'s parameters to the GPU `open` returned.
    pub fn new(gpu: Gpu, dnn: Dnn, plan: Plan) -> Result<GpuPlan, GpuError> {
        let params = DeviceF32::from_host(&dnn, &plan.params)?;
        Ok(GpuPlan {
            gpu,
            dnn,
            plan,
            params,
            run: None,
            pool: None,
            stats: GpuStats::default(),
            use_graphs: true,
        })
    }

    /// Whether batches replay the CUDA graphs captured at `configure` (the
    /// default) or enqueue each step from the host; both give the same
    /// bits (`make gpu-check` checks it).
    pub fn set_graphs(&mut self, on: bool) {
        self.use_graphs = on;
    }

    /// How batches run their steps now.
    pub fn step_launch(&self) -> StepLaunch {
        match &self.run {
            Some(run) if self.use_graphs => match (run.graphs.last(), &run.graphs_error) {
                (Some(g), _) => StepLaunch::Graphs { nodes: g.nodes() },
                (None, Some(why)) => StepLaunch::EagerCaptureFailed(why.clone()),
                (None, None) => StepLaunch::Eager,
            },
            _ => StepLaunch::Eager,
        }
    }

    /// The plan.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// The GPU.
    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// What was measured so far.
    pub fn stats(&self) -> GpuStats {
        self.stats
    }

    /// The largest batch configured (0 before [`configure`](Self::configure)).
    pub fn max_batch(&self) -> usize {
        self.run.as_ref().map_or(0, |r| r.max_batch)
    }

    /// Prepares every batch size up to `max_batch`: cuDNN descriptors and
    /// algorithms, the arena, the workspace; then runs one warm-up batch of
    /// each size (first launches load kernels, the libraries pick their
    /// code paths) and captures the steps of every batch size as a
    /// CUDA graph. A batch then costs one graph launch instead of a host
    /// call per kernel (hundreds for densenet121). When capturing fails
    /// the plan runs eagerly and [`GpuPlan::step_launch`] says why.
    pub fn configure(&mut self, max_batch: usize) -> Result<(), GpuError> {
        if max_batch == 0 {
            return Err(GpuError::Bounds("max_batch must be at least 1".into()));
        }
        if self.max_batch() == max_batch {
            return Ok(());
        }
        self.run = None;
        let d = &self.dnn;
        let per_batch = (1..=max_batch)
            .map(|b| prepare(d, &self.plan, b))
            .collect::<Result<Vec<_>, _>>()?;
        let ws_bytes = per_batch
            .iter()
            .flatten()
            .filter_map(|op| match op {
                StepOp::Conv(c) => Some(c.workspace_bytes()),
                _ => None,
            })
            .max()
            .unwrap_or(0);
        let event = || {
            self.gpu
                .context()
                .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(|error| GpuError::Cuda {
                    what: "creating a timing event",
                    error,
                })
        };
        let mut run = Configured {
            max_batch,
            arena: DeviceF32::zeros(d, self.plan.arena_per_sample * max_batch)?,
            workspace: DeviceF32::zeros(d, ws_bytes.div_ceil(4))?,
            per_batch,
            graphs: Vec::new(),
            graphs_error: None,
            events: (event()?, event()?, event()?),
        };
        // One eager batch of every size first: the libraries load the
        // kernels each size uses (lazily, by default) outside any capture.
        for b in 1..=max_batch {
            run.enqueue(d, &self.plan, &self.params, b)?;
        }
        d.stream().synchronize().map_err(|error| GpuError::Cuda {
            what: "the warm-up batches",
            error,
        })?;
        // The graphs read and write the arena and the workspace (owned by
        // `run`, with the graphs) and the parameters (owned by the plan,
        // which owns `run`) at fixed addresses: nothing is freed while a
        // graph can still be launched.
        let plan = &self.plan;
        let params = &self.params;
        let captured = (1..=max_batch)
            .map(|b| d.capture(|d| run.enqueue(d, plan, params, b)))
            .collect::<Result<Vec<_>, _>>();
        match captured {
            Ok(graphs) => {
                let replayed = graphs[max_batch - 1].launch().and_then(|()| {
                    d.stream().synchronize().map_err(|error| GpuError::Cuda {
                        what: "the first graph replay",
                        error,
                    })
                });
                match replayed {
                    Ok(()) => run.graphs = graphs,
                    Err(e) => run.graphs_error = Some(e.to_string()),
                }
            }
            Err(e) => run.graphs_error = Some(e.to_string()),
        }
        self.stats = GpuStats {
            memory_bytes: 4 * (self.params.len() + run.arena.len() + run.workspace.len()) as u64,
            ..GpuStats::default()
        };
        self.run = Some(run);
        Ok(())
    }

    /// Runs `batch` inputs (the plan's input shape, back to back) and
    /// writes `batch` outputs; waits for the GPU.
    pub fn run(&mut self, input: &[f32], batch: usize, output: &mut [f32]) -> Result<(), GpuError> {
        let pi = self.plan.input.elems();
        if input.len() != batch * pi {
            return Err(GpuError::Bounds(format!(
                "a batch of {batch} takes {} input values, got {}",
                batch * pi,
                input.len()
            )));
        }
        let i = self.plan.range(&self.plan.input, batch).start;
        self.run_with(batch, output, |d, arena, _| arena.write(d, i, input))
    }

    /// Registers `len` bytes of host memory at `addr` (the IF's input
    /// pool) as pinned memory and compiles the gather kernel, so that
    /// [`GpuPlan::run_gathered`] reads batches from it on the device.
    /// `shape` is one request as the pool holds it (its values must be
    /// the plan's input); `norm` (mean, std) is the normalisation of
    /// `rgb_u8_hwc` requests.
    pub fn attach_pool(
        &mut self,
        addr: usize,
        len: usize,
        shape: GatherShape,
        norm: ([f32; 3], [f32; 3]),
    ) -> Result<(), GpuError> {
        let want = self.plan.input.elems() as u64;
        if shape.request_elems() != want {
            return Err(GpuError::Bounds(format!(
                "pool requests of {} values for a model input of {want}",
                shape.request_elems()
            )));
        }
        self.pool = None;
        let batch = self.max_batch();
        self.pool = Some(PoolGather::new(&self.gpu, addr, len, shape, norm, batch)?);
        Ok(())
    }

    /// Unregisters the pool [`GpuPlan::attach_pool`] registered (nothing
    /// when there is none).
    pub fn detach_pool(&mut self) {
        self.pool = None;
    }

    /// Whether a pool is attached.
    pub fn has_pool(&self) -> bool {
        self.pool.is_some()
    }

    /// Runs the batch whose requests start at `offsets` (bytes into the
    /// attached pool, batch order): one gather launch from pinned host
    /// memory into the arena's input, then the steps; waits for the GPU.
    pub fn run_gathered(&mut self, offsets: &[u64], output: &mut [f32]) -> Result<(), GpuError> {
        let batch = offsets.len();
        let i = self.plan.range(&self.plan.input, batch.max(1));
        let mut pool = self
            .pool
            .take()
            .ok_or_else(|| GpuError::Bounds("run_gathered without a pool".into()))?;
        let result = self.run_with(batch, output, |_, arena, gpu| {
            let mut input = arena.slice_mut().slice_mut(i);
            pool.gather(gpu, offsets, &mut input)
        });
        self.pool = Some(pool);
        result
    }

    /// One batch: `fill` puts the input into the arena (on the stream),
    /// then the steps run and the output is read back; timed with events
    /// from before `fill` to the last step, and to the end of `fill`.
    fn run_with(
        &mut self,
        batch: usize,
        output: &mut [f32],
        fill: impl FnOnce(&Dnn, &mut DeviceF32, &Gpu) -> Result<(), GpuError>,
    ) -> Result<(), GpuError> {
        let run = self
            .run
            .as_mut()
            .ok_or_else(|| GpuError::Bounds("run before configure".into()))?;
        let po = self.plan.output.elems();
        if batch == 0 || batch > run.max_batch || output.len() != batch * po {
            return Err(GpuError::Bounds(format!(
                "a batch of {batch} (at most {}) gives {} output values, got room for {}",
                run.max_batch,
                batch * po,
                output.len()
            )));
        }
        let d = &self.dnn;
        let o = self.plan.range(&self.plan.output, batch).start;
        let timing = |what| move |error| GpuError::Cuda { what, error };
        run.events
            .0
            .record(d.stream())
            .map_err(timing("recording an event"))?;
        fill(d, &mut run.arena, &self.gpu)?;
        run.events
            .1
            .record(d.stream())
            .map_err(timing("recording an event"))?;
        match run.graphs.get(batch - 1) {
            Some(graph) if self.use_graphs => graph.launch()?,
            _ => run.enqueue(d, &self.plan, &self.params, batch)?,
        }
        run.events
            .2
            .record(d.stream())
            .map_err(timing("recording an event"))?;
        run.arena.read(d, o, output)?;
        let ns = |a: &CudaEvent, b: &CudaEvent| {
            a.elapsed_ms(b)
                .map(|ms| (f64::from(ms) * 1e6) as u64)
                .map_err(timing("reading an event"))
        };
        let total = ns(&run.events.0, &run.events.2)?;
        let input = ns(&run.events.0, &run.events.1)?;
        self.stats.batches += 1;
        self.stats.busy_ns += total;
        self.stats.last_batch_ns = total;
        self.stats.last_input_ns = input;
        Ok(())
    }
}

fn act(a: Activation) -> Act {
    match a {
        Activation::Identity => Act::Identity,
        Activation::Relu => Act::Relu,
        Activation::Clip { min, max } => Act::Clip { lo: min, hi: max },
    }
}

/// The library ops of every step at batch `b`.
fn prepare(d: &Dnn, plan: &Plan, b: usize) -> Result<Vec<StepOp>, GpuError> {
    plan.steps
        .iter()
        .map(|s| {
            let sh = &s.inputs[0].shape;
            // The input as an image: conv, pool and LRN steps have [c, h, w]
            // inputs (the planner checks); the other steps do not use it.
            let nchw = match sh.as_slice() {
                &[c, h, w] => Nchw { n: b, c, h, w },
                _ => Nchw {
                    n: b,
                    c: 0,
                    h: 0,
                    w: 0,
                },
            };
            Ok(match &s.op {
                Op::Conv(c) => StepOp::Conv(d.conv(&ConvSpec {
                    x: nchw,
                    c_out: s.output.shape[0],
                    kernel: c.kernel,
                    stride: c.stride,
                    pad: c.pad,
                    dilation: c.dilation,
                    groups: c.groups,
                })?),
                Op::Pool(p) => StepOp::Pool(d.pool(&PoolSpec {
                    x: nchw,
                    max: p.kind == PoolKind::Max,
                    include_pad: matches!(
                        p.kind,
                        PoolKind::Avg {
                            count_include_pad: true
                        }
                    ),
                    kernel: p.kernel,
                    stride: p.stride,
                    pads: p.pads,
                })?),
                Op::Lrn {
                    size,
                    alpha,
                    beta,
                    bias,
                } => StepOp::Lrn(d.lrn(&LrnSpec {
                    x: nchw,
                    size: *size,
                    alpha: *alpha,
                    beta: *beta,
                    bias: *bias,
                })?),
                Op::Softmax { rows, len } => StepOp::Softmax(d.softmax(b * rows, *len)?),
                _ => StepOp::Kernel,
            })
        })
        .collect()
}

/// Enqueues every step of `plan` at batch `b`.
fn run_steps(
    d: &Dnn,
    plan: &Plan,
    ops: &[StepOp],
    b: usize,
    arena: &mut DeviceF32,
    params: &DeviceF32,
    workspace: &mut DeviceF32,
) -> Result<(), GpuError> {
    for (s, op) in plan.steps.iter().zip(ops) {
        let at = |t: &kp_plan::Tensor| plan.range(t, b).start;
        let (x, y) = (at(&s.inputs[0]), at(&s.output));
        match (&s.op, op) {
            (Op::Conv(c), StepOp::Conv(k)) => d.run_conv(
                k,
                arena,
                x,
                y,
                params,
                c.weight.offset,
                c.bias.map(|p| p.offset),
                act(c.act),
                workspace,
            )?,
            (Op::Pad { pads, value }, _) => {
                let sh = &s.inputs[0].shape;
                d.run_pad(arena, x, y, b * sh[0], [sh[1], sh[2]], *pads, *value)?
            }
            (Op::Pool(_), StepOp::Pool(k)) => d.run_pool(k, arena, x, y)?,
            (Op::Lrn { .. }, StepOp::Lrn(k)) => d.run_lrn(k, arena, x, y)?,
            (
                Op::Gemm {
                    k,
                    m,
                    weight,
                    bias,
                    act: a,
                },
                _,
            ) => d.run_gemm(
                arena,
                x,
                y,
                b,
                *k,
                *m,
                params,
                weight.offset,
                bias.map(|p| p.offset),
                act(*a),
            )?,
            (Op::Softmax { .. }, StepOp::Softmax(k)) => d.run_softmax(k, arena, x, y)?,
            (Op::Concat, _) => {
                let per_dst = s.output.elems();
                let mut off = 0;
                for t in &s.inputs {
                    d.run_copy_block(arena, at(t), y, b, t.elems(), per_dst, off)?;
                    off += t.elems();
                }
            }
            (Op::Sum { act: a }, _) => {
                let n = b * s.output.elems();
                let last = s.inputs.len() - 1;
                let a0 = if last == 1 { act(*a) } else { Act::Identity };
                d.run_add(arena, x, at(&s.inputs[1]), y, n, a0)?;
                for (i, t) in s.inputs.iter().enumerate().skip(2) {
                    let ai = if i == last { act(*a) } else { Act::Identity };
                    d.run_add(arena, y, at(t), y, n, ai)?;
                }
            }
            (
                Op::ChannelAffine {
                    scale,
                    shift,
                    act: a,
                },
                _,
            ) => {
                let c = s.inputs[0].shape[0];
                let hw = s.inputs[0].elems() / c;
                d.run_affine(
                    arena,
                    x,
                    y,
                    b,
                    c,
                    hw,
                    params,
                    scale.offset,
                    shift.offset,
                    act(*a),
                )?
            }
            (Op::Transpose { perm }, _) => {
                d.run_transpose(arena, x, y, b, &s.inputs[0].shape, perm)?
            }
            (Op::Activation(a), _) => d.run_act(arena, x, y, b * s.output.elems(), act(*a))?,
            (other, _) => {
                return Err(GpuError::Bounds(format!(
                    "step {} has no prepared op (internal error)",
                    other.name()
                )))
            }
        }
    }
    Ok(())
}

/// The kernels' source, for listings and checks.
pub fn kernel_source() -> &'static str {
    dnn::KERNEL_SOURCE
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_gpu_opening_is_a_clear_error() {
        match open(0) {
            Ok((gpu, _)) => assert!(!gpu.info().name.is_empty()),
            Err(e) => assert!(
                matches!(
                    e,
                    GpuError::NoDriver { .. }
                        | GpuError::NoNvrtc { .. }
                        | GpuError::NoDevice(_)
                        | GpuError::NoLibrary { .. }
                ),
                "{e}"
            ),
        }
    }

    #[test]
    fn every_step_kernel_is_in_the_source() {
        for k in dnn::STEP_KERNELS {
            assert!(kernel_source().contains(&format!("void {k}(")), "{k}");
        }
    }
}
