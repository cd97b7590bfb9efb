//! kp-plan — an ONNX model as an execution plan of typed steps, and the CPU
//! reference backend that runs one.
//!
//! The GPU engine (issue 11's `cudnn` engine) does not interpret ONNX. It
//! runs a [`Plan`]: a list of [`Step`]s whose shapes are inferred, whose
//! batch-norms, per-channel scales/shifts and activations are already folded
//! into the convolution or fused into the step before, whose padding is
//! lowered to what cuDNN takes (symmetric, or an explicit [`Op::Pad`]), and
//! whose every tensor has its offset in one arena. Because a GPU is only
//! lent at times, everything up to the last mapping is proven here without
//! one: [`CpuBackend`] executes the same plan, step by step, on the CPU, and
//! the tests hold it against ONNX Runtime for every model of the repository
//! (same top-5, max difference below 1e-3 of the largest score). On the GPU
//! only the mapping of each step to cuDNN / cuBLAS / an NVRTC kernel is left
//! to check.
//!
//! # Pipeline
//!
//! 1. [`onnx`]: tract-onnx's protobuf types decode the file (prost on
//!    onnx.proto); constants become plain f32/i64 data.
//! 2. [`plan::build`]: node by node, constants are folded (Unsqueeze,
//!    Reshape of constants), views cost nothing (Reshape, Flatten, Dropout,
//!    Identity, Unsqueeze/Squeeze of activations), and every other node
//!    becomes a step or folds into the step before when that step's output
//!    has no other reader: BatchNormalization and per-channel Mul/Add/Sub/Div
//!    into a convolution's weights and bias (or one [`Op::ChannelAffine`]),
//!    Relu/Clip into the convolution, matrix product, sum or affine before.
//!    Operators it does not know are collected and the model is refused
//!    with the whole list ([`PlanError::Unsupported`]).
//! 3. [`memory`]: tensors get arena offsets by first fit over their
//!    lifetimes. Offsets are per sample: every tensor is batch-major, so at
//!    batch `b` a buffer lies at `offset * b` and spans `elems * b`, and one
//!    plan serves every batch size without re-planning.
//!
//! All parameters (folded weights, biases, scales) sit in one f32 blob,
//! [`Plan::params`], which a GPU backend uploads once.
//!
//! # Layout
//!
//! NCHW f32 throughout, batch outermost. Shapes in a plan are per sample
//! (without the batch dimension).

pub mod cpu;
pub mod memory;
pub mod onnx;
pub mod plan;

pub use cpu::CpuBackend;
pub use plan::{Activation, Buffer, Conv, Op, Param, Plan, Pool, PoolKind, Step, Tensor};

/// Why a model cannot be planned or a plan cannot run.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// The file could not be read or decoded as ONNX.
    #[error("cannot read the ONNX model: {0}")]
    Read(String),
    /// The graph is malformed, or uses a supported operator in a way this
    /// planner does not handle (said precisely).
    #[error("cannot plan the graph: {0}")]
    Graph(String),
    /// The graph uses operators the plan has no step for.
    #[error("unsupported operators: {}", .0.join(", "))]
    Unsupported(Vec<String>),
    /// A run was asked with sizes the plan does not have.
    #[error("shape mismatch: {0}")]
    Shape(String),
}
