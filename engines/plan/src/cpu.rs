//! The CPU reference backend: runs a [`Plan`] step by step, on one thread,
//! with the plan's own arena layout.
//!
//! It exists to prove plans without a GPU: it reads every step's tensors at
//! the offsets the plan assigned and uses nothing the plan does not say, so
//! a plan that agrees with ONNX Runtime here has correct shapes, folding,
//! fusion, padding lowering and buffer reuse; on the GPU only each step's
//! mapping to cuDNN / cuBLAS / NVRTC is left to check. Matrix products
//! (convolution as im2col + GEMM, Gemm) go through ndarray's
//! `general_mat_mul` (matrixmultiply); everything else is plain loops,
//! written for clarity. Like the GPU backend it allocates everything once:
//! the arena for the largest batch and the im2col scratch of the largest
//! convolution; a batch allocates nothing.

use std::ops::Range;

use ndarray::linalg::general_mat_mul;
use ndarray::{ArrayView2, ArrayViewMut2};

use crate::plan::{Activation, Conv, Op, Plan, Pool, PoolKind, Step, MAX_RANK};
use crate::PlanError;

/// A plan with its memory, ready to run batches on the CPU.
#[derive(Debug)]
pub struct CpuBackend {
    plan: Plan,
    max_batch: usize,
    arena: Vec<f32>,
    scratch: Vec<f32>,
}

impl CpuBackend {
    /// Allocates the arena for batches of up to `max_batch` and the scratch
    /// of the largest convolution.
    pub fn new(plan: Plan, max_batch: usize) -> CpuBackend {
        let scratch = plan
            .steps
            .iter()
            .filter_map(|s| match &s.op {
                Op::Conv(c) if needs_im2col(c) => {
                    let cpg = s.inputs[0].shape[0] / c.groups;
                    let ohw = s.output.shape[1] * s.output.shape[2];
                    Some(cpg * c.kernel[0] * c.kernel[1] * ohw)
                }
                _ => None,
            })
            .max()
            .unwrap_or(0);
        CpuBackend {
            arena: vec![0.0; plan.arena_per_sample * max_batch.max(1)],
            scratch: vec![0.0; scratch],
            max_batch: max_batch.max(1),
            plan,
        }
    }

    /// The plan it runs.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// Runs `batch` inputs laid out back to back (per-sample input shape)
    /// and writes `batch` outputs back to back.
    pub fn run(
        &mut self,
        input: &[f32],
        batch: usize,
        output: &mut [f32],
    ) -> Result<(), PlanError> {
        let (i_elems, o_elems) = (self.plan.input.elems(), self.plan.output.elems());
        if batch == 0 || batch > self.max_batch {
            return Err(PlanError::Shape(format!(
                "batch {batch} is outside 1..={}",
                self.max_batch
            )));
        }
        if input.len() != batch * i_elems || output.len() != batch * o_elems {
            return Err(PlanError::Shape(format!(
                "a batch of {batch} takes {} input and {} output f32, got {} and {}",
                batch * i_elems,
                batch * o_elems,
                input.len(),
                output.len()
            )));
        }
        let r = self.plan.range(&self.plan.input, batch);
        self.arena[r.start..r.start + input.len()].copy_from_slice(input);
        for s in &self.plan.steps {
            let out = self.plan.range(&s.output, batch);
            let (lo, y, hi) = split(&mut self.arena, out.clone());
            let x = Inputs {
                lo,
                hi,
                out,
                plan: &self.plan,
                step: s,
                batch,
            };
            run_step(s, &self.plan.params, batch, &x, y, &mut self.scratch);
        }
        let r = self.plan.range(&self.plan.output, batch);
        output.copy_from_slice(&self.arena[r.start..r.start + output.len()]);
        Ok(())
    }
}

/// The arena cut around `out`: before it, it, after it. The plan never
/// lets a step's output overlap its inputs, so each input lies in one side.
fn split(arena: &mut [f32], out: Range<usize>) -> (&[f32], &mut [f32], &[f32]) {
    let (lo, rest) = arena.split_at_mut(out.start);
    let (y, hi) = rest.split_at_mut(out.end - out.start);
    (lo, y, hi)
}

/// A step's inputs in the arena around its output.
struct Inputs<'a> {
    lo: &'a [f32],
    hi: &'a [f32],
    out: Range<usize>,
    plan: &'a Plan,
    step: &'a Step,
    batch: usize,
}

impl<'a> Inputs<'a> {
    /// Input `i` of the step.
    fn get(&self, i: usize) -> &'a [f32] {
        let r = self.plan.range(&self.step.inputs[i], self.batch);
        if r.end <= self.out.start {
            &self.lo[r]
        } else {
            &self.hi[r.start - self.out.end..r.end - self.out.end]
        }
    }
}

fn needs_im2col(c: &Conv) -> bool {
    !(c.kernel == [1, 1] && c.stride == [1, 1] && c.pad == [0, 0])
}

fn run_step(
    s: &Step,
    params: &[f32],
    batch: usize,
    inputs: &Inputs<'_>,
    y: &mut [f32],
    scratch: &mut [f32],
) {
    let x = |i: usize| inputs.get(i);
    let shape_in = &s.inputs[0].shape;
    let shape_out = &s.output.shape;
    match &s.op {
        Op::Conv(c) => conv(c, params, batch, shape_in, shape_out, x(0), y, scratch),
        Op::Pad { pads, value } => {
            let ([ch, h, w], [oh, ow]) = (chw(shape_in), [shape_out[1], shape_out[2]]);
            y.fill(*value);
            for plane in 0..batch * ch {
                for r in 0..h {
                    let src = &x(0)[(plane * h + r) * w..][..w];
                    let dst = (plane * oh + r + pads[0]) * ow + pads[1];
                    y[dst..dst + w].copy_from_slice(src);
                }
            }
        }
        Op::Pool(p) => pool(p, batch, shape_in, shape_out, x(0), y),
        Op::Lrn {
            size,
            alpha,
            beta,
            bias,
        } => {
            let [ch, h, w] = chw(shape_in);
            let hw = h * w;
            let (before, after) = ((size - 1) / 2, size.div_ceil(2) - 1);
            let xin = x(0);
            for n in 0..batch {
                for c in 0..ch {
                    let (lo, hi) = (c.saturating_sub(before), (c + after).min(ch - 1));
                    for p in 0..hw {
                        let mut sq = 0.0f32;
                        for j in lo..=hi {
                            let v = xin[(n * ch + j) * hw + p];
                            sq += v * v;
                        }
                        let i = (n * ch + c) * hw + p;
                        y[i] = xin[i] / (bias + alpha / *size as f32 * sq).powf(*beta);
                    }
                }
            }
        }
        Op::Gemm {
            k,
            m,
            weight,
            bias,
            act,
        } => {
            let a = ArrayView2::from_shape((batch, *k), x(0)).expect("plan gemm input");
            let w = ArrayView2::from_shape((*m, *k), weight.of(params)).expect("plan gemm weight");
            let mut out = ArrayViewMut2::from_shape((batch, *m), y).expect("plan gemm output");
            general_mat_mul(1.0, &a, &w.t(), 0.0, &mut out);
            for row in out.rows_mut() {
                for (j, v) in row.into_iter().enumerate() {
                    let b = bias.map_or(0.0, |b| params[b.offset + j]);
                    *v = act.apply(*v + b);
                }
            }
        }
        Op::Softmax { rows, len } => {
            let xin = x(0);
            for r in 0..batch * rows {
                let row = &xin[r * len..(r + 1) * len];
                let out = &mut y[r * len..(r + 1) * len];
                let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let mut sum = 0.0f32;
                for (o, &v) in out.iter_mut().zip(row) {
                    *o = (v - max).exp();
                    sum += *o;
                }
                for o in out.iter_mut() {
                    *o /= sum;
                }
            }
        }
        Op::Concat => {
            let per_out = s.output.elems();
            let mut at = 0;
            for (i, t) in s.inputs.iter().enumerate() {
                let per = t.elems();
                let src = x(i);
                for n in 0..batch {
                    y[n * per_out + at..n * per_out + at + per]
                        .copy_from_slice(&src[n * per..(n + 1) * per]);
                }
                at += per;
            }
        }
        Op::Sum { act } => {
            y.copy_from_slice(x(0));
            for i in 1..s.inputs.len() {
                for (o, v) in y.iter_mut().zip(x(i)) {
                    *o += v;
                }
            }
            if *act != Activation::Identity {
                for o in y.iter_mut() {
                    *o = act.apply(*o);
                }
            }
        }
        Op::ChannelAffine { scale, shift, act } => {
            let ch = shape_in[0];
            let plane = s.inputs[0].elems() / ch;
            let xin = x(0);
            for n in 0..batch {
                for c in 0..ch {
                    let (k, b) = (params[scale.offset + c], params[shift.offset + c]);
                    let at = (n * ch + c) * plane;
                    for (o, &v) in y[at..at + plane].iter_mut().zip(&xin[at..at + plane]) {
                        *o = act.apply(v * k + b);
                    }
                }
            }
        }
        Op::Transpose { perm } => {
            let xin = x(0);
            let per = s.output.elems();
            // Strides of the input, taken in output order (rank <= MAX_RANK,
            // checked by the planner).
            let rank = shape_in.len();
            let mut in_stride = [1usize; MAX_RANK];
            for d in (0..rank.saturating_sub(1)).rev() {
                in_stride[d] = in_stride[d + 1] * shape_in[d + 1];
            }
            let mut strides = [0usize; MAX_RANK];
            for (s, &p) in strides.iter_mut().zip(perm) {
                *s = in_stride[p];
            }
            let mut idx = [0usize; MAX_RANK];
            for n in 0..batch {
                idx.fill(0);
                let base = n * per;
                for o in 0..per {
                    let src: usize = idx.iter().zip(&strides).map(|(i, s)| i * s).sum();
                    y[base + o] = xin[base + src];
                    for d in (0..rank).rev() {
                        idx[d] += 1;
                        if idx[d] < shape_out[d] {
                            break;
                        }
                        idx[d] = 0;
                    }
                }
            }
        }
        Op::Activation(act) => {
            for (o, &v) in y.iter_mut().zip(x(0)) {
                *o = act.apply(v);
            }
        }
    }
}

fn chw(shape: &[usize]) -> [usize; 3] {
    [shape[0], shape[1], shape[2]]
}

#[allow(clippy::too_many_arguments)]
fn conv(
    c: &Conv,
    params: &[f32],
    batch: usize,
    shape_in: &[usize],
    shape_out: &[usize],
    x: &[f32],
    y: &mut [f32],
    scratch: &mut [f32],
) {
    let ([ci, h, w], [co, oh, ow]) = (chw(shape_in), chw(shape_out));
    let (cpg, mpg) = (ci / c.groups, co / c.groups);
    let [kh, kw] = c.kernel;
    let kk = cpg * kh * kw;
    let ohw = oh * ow;
    let weights = c.weight.of(params);
    for n in 0..batch {
        for g in 0..c.groups {
            let xg = &x[(n * ci + g * cpg) * h * w..][..cpg * h * w];
            let col: &[f32] = if needs_im2col(c) {
                let col = &mut scratch[..kk * ohw];
                for cc in 0..cpg {
                    for i in 0..kh {
                        for j in 0..kw {
                            let row = &mut col[((cc * kh + i) * kw + j) * ohw..][..ohw];
                            for oy in 0..oh {
                                let iy = (oy * c.stride[0] + i * c.dilation[0]) as isize
                                    - c.pad[0] as isize;
                                for ox in 0..ow {
                                    let ix = (ox * c.stride[1] + j * c.dilation[1]) as isize
                                        - c.pad[1] as isize;
                                    row[oy * ow + ox] = if iy >= 0
                                        && (iy as usize) < h
                                        && ix >= 0
                                        && (ix as usize) < w
                                    {
                                        xg[(cc * h + iy as usize) * w + ix as usize]
                                    } else {
                                        0.0
                                    };
                                }
                            }
                        }
                    }
                }
                col
            } else {
                xg
            };
            let wg = ArrayView2::from_shape((mpg, kk), &weights[g * mpg * kk..][..mpg * kk])
                .expect("plan conv weight");
            let colv = ArrayView2::from_shape((kk, ohw), col).expect("plan conv columns");
            let yg = &mut y[(n * co + g * mpg) * ohw..][..mpg * ohw];
            let mut out =
                ArrayViewMut2::from_shape((mpg, ohw), &mut *yg).expect("plan conv output");
            general_mat_mul(1.0, &wg, &colv, 0.0, &mut out);
            for m in 0..mpg {
                let b = c.bias.map_or(0.0, |b| params[b.offset + g * mpg + m]);
                for v in &mut yg[m * ohw..(m + 1) * ohw] {
                    *v = c.act.apply(*v + b);
                }
            }
        }
    }
}

fn pool(p: &Pool, batch: usize, shape_in: &[usize], shape_out: &[usize], x: &[f32], y: &mut [f32]) {
    let ([ch, h, w], [_, oh, ow]) = (chw(shape_in), chw(shape_out));
    let [pt, pl, pb, pr] = p.pads;
    for plane in 0..batch * ch {
        let xp = &x[plane * h * w..][..h * w];
        for oy in 0..oh {
            let y0 = (oy * p.stride[0]) as isize - pt as isize;
            let y1 = y0 + p.kernel[0] as isize;
            for ox in 0..ow {
                let x0 = (ox * p.stride[1]) as isize - pl as isize;
                let x1 = x0 + p.kernel[1] as isize;
                let (ya, yb) = (y0.max(0) as usize, (y1.min(h as isize)) as usize);
                let (xa, xb) = (x0.max(0) as usize, (x1.min(w as isize)) as usize);
                let v = match p.kind {
                    PoolKind::Max => {
                        let mut m = f32::NEG_INFINITY;
                        for r in ya..yb {
                            for v in &xp[r * w + xa..r * w + xb] {
                                m = m.max(*v);
                            }
                        }
                        m
                    }
                    PoolKind::Avg { count_include_pad } => {
                        let mut sum = 0.0f32;
                        for r in ya..yb {
                            sum += xp[r * w + xa..r * w + xb].iter().sum::<f32>();
                        }
                        let count = if count_include_pad {
                            // The window clipped to the padded image.
                            let (ey, ex) = ((h + pb) as isize, (w + pr) as isize);
                            ((y1.min(ey) - y0.max(-(pt as isize)))
                                * (x1.min(ex) - x0.max(-(pl as isize))))
                                as f32
                        } else {
                            ((yb - ya) * (xb - xa)) as f32
                        };
                        sum / count
                    }
                };
                y[(plane * oh + oy) * ow + ox] = v;
            }
        }
    }
}
