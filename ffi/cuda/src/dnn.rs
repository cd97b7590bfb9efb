//! The steps of a network on the GPU: cuDNN for convolution, pooling, LRN
//! and softmax, cuBLAS for matrix products, and small NVRTC kernels
//! (`dnn_kernels.cu`: bias + activation, per-channel affine, sums, padding,
//! average pooling with asymmetric padding, channel concatenation,
//! transposes) for what those libraries lack or do awkwardly.
//!
//! # Memory and safety
//!
//! Tensors live in [`DeviceF32`] buffers (one arena for activations, one for
//! parameters, one workspace) and are named by element offsets. Every
//! `run_*` method checks, before its one unsafe library call or launch,
//! that each range it touches lies inside its buffer and that the output
//! does not overlap an input (besides the documented in-place cases), and
//! every descriptor was made from the same sizes the ranges are checked
//! against. All work is enqueued on the one stream of the [`Gpu`]; nothing
//! waits for it except [`DeviceF32::read`].
//!
//! # Precision
//!
//! Convolutions run with `CUDNN_FMA_MATH` (strict fp32, no TF32) and cuBLAS
//! with its default math (fp32), so results agree with a CPU engine to fp32
//! rounding. PyTorch allows TF32 for convolutions by default; a comparison
//! must set the same precision on both sides.
//!
//! # Status
//!
//! `make gpu-check` runs every model through it against ONNX Runtime on a
//! GPU; it passed on an NVIDIA H200 (27 November 2026; docs/PERFORMANCE.md).
//! [`Dnn::capture`] records what the `run_*` methods enqueue as a CUDA graph
//! ([`StepGraph`]); the same checks ran when the calls were captured.

use std::ffi::c_void;
use std::ops::Range;
use std::sync::Arc;

use cudarc::cublas::{self, CudaBlas};
use cudarc::cudnn::sys as dnn;
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, DeviceRepr, LaunchConfig,
    PushKernelArg,
};

use crate::{candidates, cuda, Gpu, GpuError};

/// The step kernels' CUDA C source.
pub const KERNEL_SOURCE: &str = include_str!("dnn_kernels.cu");

/// The kernels of [`KERNEL_SOURCE`] that [`Dnn::new`] loads, by name.
pub const STEP_KERNELS: [&str; 8] = [
    "kp_bias_act",
    "kp_affine",
    "kp_add",
    "kp_act",
    "kp_pad",
    "kp_avgpool",
    "kp_copy_block",
    "kp_transpose",
];

/// Threads per block of the step kernels.
const BLOCK: u32 = 256;

/// Whether libcudnn and libcublas load; the error says which is missing.
pub fn check_libraries() -> Result<(), GpuError> {
    // SAFETY: `is_culib_present` only tries `dlopen` on the candidate names.
    if !unsafe { dnn::is_culib_present() } {
        return Err(GpuError::NoLibrary {
            lib: "cuDNN",
            looked: candidates("cudnn"),
            fix: "install the nvidia-cudnn-cu13 wheel (or cuDNN 9) and put its lib folder on LD_LIBRARY_PATH",
        });
    }
    // SAFETY: as above, for libcublas.
    if !unsafe { cublas::sys::is_culib_present() } {
        return Err(GpuError::NoLibrary {
            lib: "cuBLAS",
            looked: candidates("cublas"),
            fix: "install the nvidia-cublas wheel (or the CUDA toolkit) and put its lib folder on LD_LIBRARY_PATH",
        });
    }
    Ok(())
}

fn dnn_err(what: &'static str) -> impl FnOnce(cudarc::cudnn::CudnnError) -> GpuError {
    move |e| GpuError::Library {
        what,
        error: format!("{e:?}"),
    }
}

fn blas_err(what: &'static str) -> impl FnOnce(cublas::result::CublasError) -> GpuError {
    move |e| GpuError::Library {
        what,
        error: format!("{e:?}"),
    }
}

fn int(v: usize, what: &'static str) -> Result<i32, GpuError> {
    i32::try_from(v).map_err(|_| GpuError::Bounds(format!("{what} = {v} does not fit cuDNN's int")))
}

/// An activation applied in a kernel's epilogue.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Act {
    /// None.
    Identity,
    /// `max(x, 0)`.
    Relu,
    /// `min(max(x, lo), hi)`.
    Clip {
        /// Lower bound.
        lo: f32,
        /// Upper bound.
        hi: f32,
    },
}

impl Act {
    fn code(self) -> (i32, f32, f32) {
        match self {
            Act::Identity => (0, 0.0, 0.0),
            Act::Relu => (1, 0.0, 0.0),
            Act::Clip { lo, hi } => (2, lo, hi),
        }
    }
}

/// f32 memory on the device with its base address.
#[derive(Debug)]
pub struct DeviceF32 {
    buf: CudaSlice<f32>,
    base: u64,
}

impl DeviceF32 {
    fn wrap(buf: CudaSlice<f32>, stream: &CudaStream) -> DeviceF32 {
        let base = {
            let (base, _sync) = buf.device_ptr(stream);
            base
        };
        DeviceF32 { buf, base }
    }

    /// `len` zeros.
    pub fn zeros(d: &Dnn, len: usize) -> Result<DeviceF32, GpuError> {
        let buf = d
            .stream
            .alloc_zeros::<f32>(len.max(1))
            .map_err(cuda("allocating device memory"))?;
        Ok(DeviceF32::wrap(buf, &d.stream))
    }

    /// A copy of `data`.
    pub fn from_host(d: &Dnn, data: &[f32]) -> Result<DeviceF32, GpuError> {
        let mut v = DeviceF32::zeros(d, data.len())?;
        v.write(d, 0, data)?;
        Ok(v)
    }

    /// Values.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// Whether it holds no values.
    pub fn is_empty(&self) -> bool {
        self.buf.len() == 0
    }

    /// The underlying cudarc buffer (for kernels outside this module, e.g.
    /// the gather writing a batch's input).
    pub fn slice_mut(&mut self) -> &mut CudaSlice<f32> {
        &mut self.buf
    }

    /// Copies `data` to `at..` (enqueued on the stream).
    pub fn write(&mut self, d: &Dnn, at: usize, data: &[f32]) -> Result<(), GpuError> {
        self.check(at..at + data.len())?;
        let mut dst = self.buf.slice_mut(at..at + data.len());
        d.stream
            .memcpy_htod(data, &mut dst)
            .map_err(cuda("copying to the device"))
    }

    /// Copies `at..at + out.len()` into `out`, waiting for the stream.
    pub fn read(&self, d: &Dnn, at: usize, out: &mut [f32]) -> Result<(), GpuError> {
        self.check(at..at + out.len())?;
        let src = self.buf.slice(at..at + out.len());
        d.stream
            .memcpy_dtoh(&src, out)
            .map_err(cuda("copying from the device"))?;
        d.stream.synchronize().map_err(cuda("synchronising"))
    }

    fn check(&self, r: Range<usize>) -> Result<(), GpuError> {
        if r.start > r.end || r.end > self.buf.len() {
            return Err(GpuError::Bounds(format!(
                "range {r:?} outside a buffer of {} values",
                self.buf.len()
            )));
        }
        Ok(())
    }

    /// The device address of `r`'s start, after checking `r`.
    fn ptr(&self, r: Range<usize>) -> Result<u64, GpuError> {
        self.check(r.clone())?;
        Ok(self.base + 4 * r.start as u64)
    }

    /// The addresses of a step's input `x` and output `y`, after checking
    /// both ranges and that they do not overlap.
    fn io(&self, x: &Range<usize>, y: &Range<usize>) -> Result<(u64, u64), GpuError> {
        disjoint(x, y)?;
        Ok((self.ptr(x.clone())?, self.ptr(y.clone())?))
    }
}

fn disjoint(a: &Range<usize>, b: &Range<usize>) -> Result<(), GpuError> {
    if a.end <= b.start || b.end <= a.start || a.is_empty() || b.is_empty() {
        Ok(())
    } else {
        Err(GpuError::Bounds(format!(
            "output {b:?} overlaps input {a:?}"
        )))
    }
}

macro_rules! descriptor {
    ($name:ident, $raw:ty, $create:ident, $destroy:ident) => {
        /// A cuDNN descriptor, destroyed on drop.
        #[derive(Debug)]
        struct $name($raw);

        impl $name {
            fn new() -> Result<$name, GpuError> {
                let mut raw: $raw = std::ptr::null_mut();
                // SAFETY: `raw` is a valid place for the new descriptor.
                unsafe { dnn::$create(&mut raw) }
                    .result()
                    .map_err(dnn_err(stringify!($create)))?;
                Ok($name(raw))
            }
        }

        impl Drop for $name {
            fn drop(&mut self) {
                // SAFETY: made by `new`, destroyed once, here.
                let _ = unsafe { dnn::$destroy(self.0) };
            }
        }

        // SAFETY: a descriptor is plain host-side data owned by this value;
        // it is used by one thread at a time (through `&self` of an op that
        // is itself used by one thread at a time).
        unsafe impl Send for $name {}
    };
}

descriptor!(
    TensorDesc,
    dnn::cudnnTensorDescriptor_t,
    cudnnCreateTensorDescriptor,
    cudnnDestroyTensorDescriptor
);
descriptor!(
    FilterDesc,
    dnn::cudnnFilterDescriptor_t,
    cudnnCreateFilterDescriptor,
    cudnnDestroyFilterDescriptor
);
descriptor!(
    ConvDesc,
    dnn::cudnnConvolutionDescriptor_t,
    cudnnCreateConvolutionDescriptor,
    cudnnDestroyConvolutionDescriptor
);
descriptor!(
    PoolDesc,
    dnn::cudnnPoolingDescriptor_t,
    cudnnCreatePoolingDescriptor,
    cudnnDestroyPoolingDescriptor
);
descriptor!(
    LrnDesc,
    dnn::cudnnLRNDescriptor_t,
    cudnnCreateLRNDescriptor,
    cudnnDestroyLRNDescriptor
);

impl TensorDesc {
    fn nchw(n: usize, c: usize, h: usize, w: usize) -> Result<TensorDesc, GpuError> {
        let d = TensorDesc::new()?;
        // SAFETY: `d.0` is a live descriptor.
        unsafe {
            dnn::cudnnSetTensor4dDescriptor(
                d.0,
                dnn::cudnnTensorFormat_t::CUDNN_TENSOR_NCHW,
                dnn::cudnnDataType_t::CUDNN_DATA_FLOAT,
                int(n, "n")?,
                int(c, "c")?,
                int(h, "h")?,
                int(w, "w")?,
            )
        }
        .result()
        .map_err(dnn_err("cudnnSetTensor4dDescriptor"))?;
        Ok(d)
    }
}

/// The cuDNN handle, destroyed on drop.
#[derive(Debug)]
struct DnnHandle(dnn::cudnnHandle_t);

impl Drop for DnnHandle {
    fn drop(&mut self) {
        // SAFETY: created in `Dnn::new`, destroyed once, here.
        let _ = unsafe { dnn::cudnnDestroy(self.0) };
    }
}

// SAFETY: cuDNN allows a handle to be used from another host thread as long
// as it is not used by two at once; `Dnn` is used through `&self` by the one
// thread that owns it (it is `Send`, not `Sync`).
unsafe impl Send for DnnHandle {}

#[derive(Debug)]
struct Kernels {
    bias_act: CudaFunction,
    affine: CudaFunction,
    add: CudaFunction,
    act: CudaFunction,
    pad: CudaFunction,
    avgpool: CudaFunction,
    copy_block: CudaFunction,
    transpose: CudaFunction,
}

/// Work captured from the [`Dnn`]'s stream (a CUDA graph, instantiated
/// and uploaded), replayed with one launch: the steps of one batch size,
/// without a host call per kernel. What it captured reads and writes
/// fixed device addresses (the arena, the parameters, the workspace), so
/// it stays valid while those buffers live; [`Dnn::capture`] says which.
pub struct StepGraph {
    graph: cudarc::driver::CudaGraph,
    nodes: usize,
}

impl std::fmt::Debug for StepGraph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StepGraph")
            .field("nodes", &self.nodes)
            .finish_non_exhaustive()
    }
}

// SAFETY: a CUDA graph and its executable instance may be used from any host
// thread as long as no two threads use them at once (the driver's graph
// thread-safety rules); a `StepGraph` is owned by one value and launched
// through `&self` of an owner that is `Send`, not `Sync`.
unsafe impl Send for StepGraph {}

impl StepGraph {
    /// Enqueues the captured work on the stream it was captured from.
    pub fn launch(&self) -> Result<(), GpuError> {
        self.graph.launch().map_err(cuda("launching a CUDA graph"))
    }

    /// The kernels and library calls' nodes it holds.
    pub fn nodes(&self) -> usize {
        self.nodes
    }
}

/// cuDNN, cuBLAS and the step kernels on one GPU's stream.
#[derive(Debug)]
pub struct Dnn {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    handle: DnnHandle,
    blas: CudaBlas,
    k: Kernels,
}

/// The per-sample dimensions of a transpose, as the kernel takes them.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct Perm {
    rank: u32,
    pad: u32,
    per: u64,
    out_shape: [u64; 8],
    in_stride: [u64; 8],
}

// SAFETY: `Perm` is `#[repr(C)]` plain data laid out as `struct kp_perm`
// in `dnn_kernels.cu` (u32, u32, u64, u64[8], u64[8]; no padding).
unsafe impl DeviceRepr for Perm {}

impl Dnn {
    /// Loads cuDNN and cuBLAS for `gpu`'s stream and compiles the step
    /// kernels.
    pub fn new(gpu: &Gpu) -> Result<Dnn, GpuError> {
        check_libraries()?;
        let ctx = gpu.context().clone();
        let stream = gpu.stream().clone();
        ctx.bind_to_thread().map_err(cuda("binding the context"))?;
        let mut raw: dnn::cudnnHandle_t = std::ptr::null_mut();
        // SAFETY: `raw` is a valid place for the new handle.
        unsafe { dnn::cudnnCreate(&mut raw) }
            .result()
            .map_err(dnn_err("cudnnCreate"))?;
        let handle = DnnHandle(raw);
        // SAFETY: the handle is live; the stream outlives it (both held by
        // this `Dnn`, the stream through its `Arc`).
        unsafe { dnn::cudnnSetStream(handle.0, stream.cu_stream() as _) }
            .result()
            .map_err(dnn_err("cudnnSetStream"))?;
        let blas = CudaBlas::new(stream.clone()).map_err(blas_err("creating the cuBLAS handle"))?;
        let ptx = cudarc::nvrtc::compile_ptx(KERNEL_SOURCE)
            .map_err(|e| GpuError::Compile(e.to_string()))?;
        let module = ctx
            .load_module(ptx)
            .map_err(cuda("loading the step kernels"))?;
        let f = |name: &'static str| module.load_function(name).map_err(cuda(name));
        let [bias_act, affine, add, act, pad, avgpool, copy_block, transpose] = STEP_KERNELS;
        let k = Kernels {
            bias_act: f(bias_act)?,
            affine: f(affine)?,
            add: f(add)?,
            act: f(act)?,
            pad: f(pad)?,
            avgpool: f(avgpool)?,
            copy_block: f(copy_block)?,
            transpose: f(transpose)?,
        };
        Ok(Dnn {
            ctx,
            stream,
            handle,
            blas,
            k,
        })
    }

    /// The stream everything runs on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Makes the context current on the calling thread (the raw cuDNN calls
    /// need it; cudarc's own calls do it themselves).
    pub fn bind(&self) -> Result<(), GpuError> {
        self.ctx
            .bind_to_thread()
            .map_err(cuda("binding the context"))
    }

    /// Captures what `enqueue` puts on the stream into a [`StepGraph`]
    /// instead of running it. The buffers `enqueue` touches must outlive
    /// the graph. Nothing runs: a failure (a library call that cannot be
    /// captured, say) ends the capture and leaves the stream as it was.
    pub fn capture(
        &self,
        enqueue: impl FnOnce(&Dnn) -> Result<(), GpuError>,
    ) -> Result<StepGraph, GpuError> {
        use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
        self.bind()?;
        self.stream
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(cuda("beginning a stream capture"))?;
        let enqueued = enqueue(self);
        // Always ended, also after a failure: a stream left capturing
        // refuses all later work.
        let ended = self.stream.end_capture(CUgraphInstantiate_flags(0));
        enqueued?;
        let graph = ended
            .map_err(cuda("ending a stream capture"))?
            .ok_or(GpuError::Library {
                what: "a stream capture",
                error: "captured no work".into(),
            })?;
        let mut nodes = 0usize;
        // SAFETY: `graph.cu_graph()` is the live graph `graph` owns; with a
        // null node array the call only writes the count to `nodes`.
        unsafe {
            cudarc::driver::sys::cuGraphGetNodes(graph.cu_graph(), std::ptr::null_mut(), &mut nodes)
        }
        .result()
        .map_err(cuda("counting a graph's nodes"))?;
        graph.upload().map_err(cuda("uploading a CUDA graph"))?;
        Ok(StepGraph { graph, nodes })
    }

    fn grid(total: u64) -> LaunchConfig {
        LaunchConfig {
            grid_dim: (
                total.div_ceil(u64::from(BLOCK)).clamp(1, 65_535 * 8) as u32,
                1,
                1,
            ),
            block_dim: (BLOCK, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    // ------------------------------------------------------------ cuDNN ops

    /// Descriptors and algorithm of one convolution at one batch size.
    pub fn conv(&self, s: &ConvSpec) -> Result<ConvOp, GpuError> {
        self.bind()?;
        let out = s.out();
        let x = s.x.desc()?;
        let y = TensorDesc::nchw(s.x.n, s.c_out, out[0], out[1])?;
        let w = FilterDesc::new()?;
        // SAFETY: `w.0` is a live descriptor.
        unsafe {
            dnn::cudnnSetFilter4dDescriptor(
                w.0,
                dnn::cudnnDataType_t::CUDNN_DATA_FLOAT,
                dnn::cudnnTensorFormat_t::CUDNN_TENSOR_NCHW,
                int(s.c_out, "c_out")?,
                int(s.x.c / s.groups.max(1), "c_in/groups")?,
                int(s.kernel[0], "kh")?,
                int(s.kernel[1], "kw")?,
            )
        }
        .result()
        .map_err(dnn_err("cudnnSetFilter4dDescriptor"))?;
        let conv = ConvDesc::new()?;
        // SAFETY: `conv.0` is a live descriptor.
        unsafe {
            dnn::cudnnSetConvolution2dDescriptor(
                conv.0,
                int(s.pad[0], "pad")?,
                int(s.pad[1], "pad")?,
                int(s.stride[0], "stride")?,
                int(s.stride[1], "stride")?,
                int(s.dilation[0], "dilation")?,
                int(s.dilation[1], "dilation")?,
                dnn::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION,
                dnn::cudnnDataType_t::CUDNN_DATA_FLOAT,
            )
        }
        .result()
        .map_err(dnn_err("cudnnSetConvolution2dDescriptor"))?;
        // SAFETY: `conv.0` is a live descriptor.
        unsafe { dnn::cudnnSetConvolutionGroupCount(conv.0, int(s.groups, "groups")?) }
            .result()
            .map_err(dnn_err("cudnnSetConvolutionGroupCount"))?;
        // SAFETY: `conv.0` is a live descriptor.
        unsafe { dnn::cudnnSetConvolutionMathType(conv.0, dnn::cudnnMathType_t::CUDNN_FMA_MATH) }
            .result()
            .map_err(dnn_err("cudnnSetConvolutionMathType"))?;
        // SAFETY: a plain C struct of enums, a float, a size and ints; all
        // zeros is a valid value of each (algorithm 0, SUCCESS, ...).
        let mut perf: [dnn::cudnnConvolutionFwdAlgoPerf_t; 8] = unsafe { std::mem::zeroed() };
        let mut found = 0;
        // SAFETY: handle and descriptors are live; `perf` has room for the 8
        // results asked for and `found` is a valid place to write.
        unsafe {
            dnn::cudnnGetConvolutionForwardAlgorithm_v7(
                self.handle.0,
                x.0,
                w.0,
                conv.0,
                y.0,
                perf.len() as i32,
                &mut found,
                perf.as_mut_ptr(),
            )
        }
        .result()
        .map_err(dnn_err("cudnnGetConvolutionForwardAlgorithm_v7"))?;
        // The fastest algorithm that runs in strict fp32 (FMA math): the
        // heuristics may also offer TF32 tensor-core ones for float data.
        let ok: Vec<&dnn::cudnnConvolutionFwdAlgoPerf_t> = perf[..found.clamp(0, 8) as usize]
            .iter()
            .filter(|p| p.status == dnn::cudnnStatus_t::CUDNN_STATUS_SUCCESS)
            .collect();
        let best = ok
            .iter()
            .find(|p| p.mathType == dnn::cudnnMathType_t::CUDNN_FMA_MATH)
            .or_else(|| ok.first())
            .ok_or_else(|| GpuError::Library {
                what: "cudnnGetConvolutionForwardAlgorithm_v7",
                error: format!("no algorithm for {s:?}"),
            })?;
        if best.mathType != dnn::cudnnMathType_t::CUDNN_FMA_MATH {
            // SAFETY: `conv.0` is a live descriptor.
            unsafe { dnn::cudnnSetConvolutionMathType(conv.0, best.mathType) }
                .result()
                .map_err(dnn_err("cudnnSetConvolutionMathType"))?;
        }
        Ok(ConvOp {
            spec: *s,
            out,
            x,
            y,
            w,
            conv,
            algo: best.algo,
            workspace_bytes: best.memory,
        })
    }

    /// Runs `op`: `y = act(conv(x, w) + bias)`; offsets are element offsets
    /// into `arena` (x, y), `params` (w, bias) and the start of `workspace`.
    #[allow(clippy::too_many_arguments)]
    pub fn run_conv(
        &self,
        op: &ConvOp,
        arena: &mut DeviceF32,
        x: usize,
        y: usize,
        params: &DeviceF32,
        w: usize,
        bias: Option<usize>,
        act: Act,
        workspace: &mut DeviceF32,
    ) -> Result<(), GpuError> {
        let s = &op.spec;
        let xr = x..x + s.x.len();
        let yr = y..y + s.x.n * s.c_out * op.out[0] * op.out[1];
        let wr = w..w + s.c_out * (s.x.c / s.groups.max(1)) * s.kernel[0] * s.kernel[1];
        let ((xp, yp), wp) = (arena.io(&xr, &yr)?, params.ptr(wr)?);
        let ws_len = op.workspace_bytes.div_ceil(4);
        let wsp = workspace.ptr(0..ws_len)?;
        let bp = match bias {
            Some(b) => params.ptr(b..b + s.c_out)?,
            None => 0,
        };
        let (alpha, beta) = (1.0f32, 0.0f32);
        self.bind()?;
        // SAFETY: handle and descriptors are live and describe exactly the
        // ranges checked above (x: batch x c_in x h x w, y: batch x c_out x
        // oh x ow, w: c_out x c_in/groups x kh x kw), which lie inside their
        // buffers and do not overlap; the workspace has the bytes the
        // algorithm asked for; alpha and beta are host f32 as cuDNN expects
        // for float tensors.
        unsafe {
            dnn::cudnnConvolutionForward(
                self.handle.0,
                (&alpha as *const f32).cast(),
                op.x.0,
                xp as *const c_void,
                op.w.0,
                wp as *const c_void,
                op.conv.0,
                op.algo,
                wsp as *mut c_void,
                op.workspace_bytes,
                (&beta as *const f32).cast(),
                op.y.0,
                yp as *mut c_void,
            )
        }
        .result()
        .map_err(dnn_err("cudnnConvolutionForward"))?;
        if bias.is_some() || act != Act::Identity {
            self.bias_act(yp, bp, s.c_out, op.out[0] * op.out[1], yr.len(), act)?;
        }
        Ok(())
    }

    fn bias_act(
        &self,
        y: u64,
        bias: u64,
        c: usize,
        hw: usize,
        total: usize,
        act: Act,
    ) -> Result<(), GpuError> {
        let (code, lo, hi) = act.code();
        let (c, hw, total) = (c as u64, hw as u64, total as u64);
        let mut b = self.stream.launch_builder(&self.k.bias_act);
        b.arg(&y)
            .arg(&bias)
            .arg(&c)
            .arg(&hw)
            .arg(&total)
            .arg(&code)
            .arg(&lo)
            .arg(&hi);
        // SAFETY: the arguments match `kp_bias_act`'s parameters; `y` spans
        // `total` checked values and `bias` (when not 0) `c` checked values.
        unsafe { b.launch(Self::grid(total)) }
            .map(drop)
            .map_err(cuda("launching kp_bias_act"))
    }

    /// Pooling at one batch size: cuDNN for symmetric padding, the
    /// `kp_avgpool` kernel for an average pool with asymmetric padding.
    pub fn pool(&self, s: &PoolSpec) -> Result<PoolOp, GpuError> {
        let out = s.out();
        let symmetric = s.pads[0] == s.pads[2] && s.pads[1] == s.pads[3];
        if !symmetric && s.max {
            return Err(GpuError::Bounds(
                "a max pool with asymmetric padding (the plan lowers it to a pad step)".into(),
            ));
        }
        if !symmetric {
            return Ok(PoolOp {
                spec: *s,
                out,
                cudnn: None,
            });
        }
        self.bind()?;
        let x = s.x.desc()?;
        let y = TensorDesc::nchw(s.x.n, s.x.c, out[0], out[1])?;
        let p = PoolDesc::new()?;
        let mode = if s.max {
            dnn::cudnnPoolingMode_t::CUDNN_POOLING_MAX
        } else if s.include_pad {
            dnn::cudnnPoolingMode_t::CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING
        } else {
            dnn::cudnnPoolingMode_t::CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING
        };
        let window = [int(s.kernel[0], "kh")?, int(s.kernel[1], "kw")?];
        let pads = [int(s.pads[0], "pad")?, int(s.pads[1], "pad")?];
        let strides = [int(s.stride[0], "stride")?, int(s.stride[1], "stride")?];
        // SAFETY: `p.0` is live; the three arrays hold the 2 values each
        // that nbDims = 2 promises.
        unsafe {
            dnn::cudnnSetPoolingNdDescriptor(
                p.0,
                mode,
                dnn::cudnnNanPropagation_t::CUDNN_NOT_PROPAGATE_NAN,
                2,
                window.as_ptr(),
                pads.as_ptr(),
                strides.as_ptr(),
            )
        }
        .result()
        .map_err(dnn_err("cudnnSetPoolingNdDescriptor"))?;
        Ok(PoolOp {
            spec: *s,
            out,
            cudnn: Some((x, y, p)),
        })
    }

    /// Runs a pooling op from `x` to `y` in `arena`.
    pub fn run_pool(
        &self,
        op: &PoolOp,
        arena: &mut DeviceF32,
        x: usize,
        y: usize,
    ) -> Result<(), GpuError> {
        let s = &op.spec;
        let xr = x..x + s.x.len();
        let yr = y..y + s.x.n * s.x.c * op.out[0] * op.out[1];
        let (xp, yp) = arena.io(&xr, &yr)?;
        match &op.cudnn {
            Some((xd, yd, pd)) => {
                let (alpha, beta) = (1.0f32, 0.0f32);
                self.bind()?;
                // SAFETY: descriptors are live and describe the checked,
                // disjoint ranges; alpha/beta are host f32.
                unsafe {
                    dnn::cudnnPoolingForward(
                        self.handle.0,
                        pd.0,
                        (&alpha as *const f32).cast(),
                        xd.0,
                        xp as *const c_void,
                        (&beta as *const f32).cast(),
                        yd.0,
                        yp as *mut c_void,
                    )
                }
                .result()
                .map_err(dnn_err("cudnnPoolingForward"))
            }
            None => {
                let v = |u: usize| u as u64;
                let planes = v(s.x.n * s.x.c);
                let inc = i32::from(s.include_pad);
                let (h, w, oh, ow) = (v(s.x.h), v(s.x.w), v(op.out[0]), v(op.out[1]));
                let (kh, kw, sh, sw) = (
                    v(s.kernel[0]),
                    v(s.kernel[1]),
                    v(s.stride[0]),
                    v(s.stride[1]),
                );
                let [pt, pl, pb, pr] = s.pads.map(v);
                let mut b = self.stream.launch_builder(&self.k.avgpool);
                b.arg(&xp)
                    .arg(&yp)
                    .arg(&planes)
                    .arg(&h)
                    .arg(&w)
                    .arg(&oh)
                    .arg(&ow);
                b.arg(&kh)
                    .arg(&kw)
                    .arg(&sh)
                    .arg(&sw)
                    .arg(&pt)
                    .arg(&pl)
                    .arg(&pb)
                    .arg(&pr)
                    .arg(&inc);
                // SAFETY: the arguments match `kp_avgpool`'s parameters; the
                // kernel reads planes x h x w values at `xp` and writes
                // planes x oh x ow at `yp`, both checked and disjoint.
                unsafe { b.launch(Self::grid(yr.len() as u64)) }
                    .map(drop)
                    .map_err(cuda("launching kp_avgpool"))
            }
        }
    }

    /// Local response normalisation across channels (ONNX LRN) at one batch.
    pub fn lrn(&self, s: &LrnSpec) -> Result<LrnOp, GpuError> {
        self.bind()?;
        let t = s.x.desc()?;
        let d = LrnDesc::new()?;
        // SAFETY: `d.0` is live. cuDNN divides alpha by the window like ONNX.
        unsafe {
            dnn::cudnnSetLRNDescriptor(
                d.0,
                s.size as u32,
                f64::from(s.alpha),
                f64::from(s.beta),
                f64::from(s.bias),
            )
        }
        .result()
        .map_err(dnn_err("cudnnSetLRNDescriptor"))?;
        Ok(LrnOp { spec: *s, t, d })
    }

    /// Runs an LRN op from `x` to `y` in `arena`.
    pub fn run_lrn(
        &self,
        op: &LrnOp,
        arena: &mut DeviceF32,
        x: usize,
        y: usize,
    ) -> Result<(), GpuError> {
        let s = &op.spec;
        let n = s.x.len();
        let (xr, yr) = (x..x + n, y..y + n);
        let (xp, yp) = arena.io(&xr, &yr)?;
        let (alpha, beta) = (1.0f32, 0.0f32);
        self.bind()?;
        // SAFETY: the descriptor describes both checked, disjoint ranges;
        // alpha/beta are host f32.
        unsafe {
            dnn::cudnnLRNCrossChannelForward(
                self.handle.0,
                op.d.0,
                dnn::cudnnLRNMode_t::CUDNN_LRN_CROSS_CHANNEL_DIM1,
                (&alpha as *const f32).cast(),
                op.t.0,
                xp as *const c_void,
                (&beta as *const f32).cast(),
                op.t.0,
                yp as *mut c_void,
            )
        }
        .result()
        .map_err(dnn_err("cudnnLRNCrossChannelForward"))
    }

    /// Softmax over `len` values, `rows` rows (all samples together).
    pub fn softmax(&self, rows: usize, len: usize) -> Result<SoftmaxOp, GpuError> {
        self.bind()?;
        Ok(SoftmaxOp {
            rows,
            len,
            t: TensorDesc::nchw(rows, len, 1, 1)?,
        })
    }

    /// Runs a softmax op from `x` to `y` in `arena`.
    pub fn run_softmax(
        &self,
        op: &SoftmaxOp,
        arena: &mut DeviceF32,
        x: usize,
        y: usize,
    ) -> Result<(), GpuError> {
        let n = op.rows * op.len;
        let (xr, yr) = (x..x + n, y..y + n);
        let (xp, yp) = arena.io(&xr, &yr)?;
        let (alpha, beta) = (1.0f32, 0.0f32);
        self.bind()?;
        // SAFETY: the descriptor ([rows, len, 1, 1]) describes both checked,
        // disjoint ranges; alpha/beta are host f32.
        unsafe {
            dnn::cudnnSoftmaxForward(
                self.handle.0,
                dnn::cudnnSoftmaxAlgorithm_t::CUDNN_SOFTMAX_ACCURATE,
                dnn::cudnnSoftmaxMode_t::CUDNN_SOFTMAX_MODE_INSTANCE,
                (&alpha as *const f32).cast(),
                op.t.0,
                xp as *const c_void,
                (&beta as *const f32).cast(),
                op.t.0,
                yp as *mut c_void,
            )
        }
        .result()
        .map_err(dnn_err("cudnnSoftmaxForward"))
    }

    // ------------------------------------------------------------- cuBLAS

    /// `y[batch, m] = act(x[batch, k] · Wᵀ + bias)` with `W` `[m, k]`
    /// row-major at `w` in `params`.
    #[allow(clippy::too_many_arguments)]
    pub fn run_gemm(
        &self,
        arena: &mut DeviceF32,
        x: usize,
        y: usize,
        batch: usize,
        k: usize,
        m: usize,
        params: &DeviceF32,
        w: usize,
        bias: Option<usize>,
        act: Act,
    ) -> Result<(), GpuError> {
        let (xr, yr) = (x..x + batch * k, y..y + batch * m);
        let ((xp, yp), wp) = (arena.io(&xr, &yr)?, params.ptr(w..w + m * k)?);
        let bp = match bias {
            Some(b) => params.ptr(b..b + m)?,
            None => 0,
        };
        let (alpha, beta) = (1.0f32, 0.0f32);
        let (mi, bi, ki) = (int(m, "m")?, int(batch, "batch")?, int(k, "k")?);
        // Column-major view: Yᵀ[m, batch] = op(W)[m, k] · Xᵀ[k, batch], with
        // W row-major [m, k] = column-major [k, m] transposed (lda k), X
        // row-major [batch, k] = column-major [k, batch] (ldb k).
        // SAFETY: the handle is live and bound to the stream; the three
        // matrices are the checked ranges (W m*k, X batch*k, Y batch*m),
        // Y disjoint from X; alpha/beta are host pointers (cuBLAS's default
        // pointer mode).
        unsafe {
            cublas::result::sgemm(
                *self.blas.handle(),
                cublas::sys::cublasOperation_t::CUBLAS_OP_T,
                cublas::sys::cublasOperation_t::CUBLAS_OP_N,
                mi,
                bi,
                ki,
                &alpha,
                wp as *const f32,
                ki,
                xp as *const f32,
                ki,
                &beta,
                yp as *mut f32,
                mi,
            )
        }
        .map_err(blas_err("cublasSgemm"))?;
        if bias.is_some() || act != Act::Identity {
            self.bias_act(yp, bp, m, 1, yr.len(), act)?;
        }
        Ok(())
    }

    // ------------------------------------------------------- step kernels

    /// `y = act(x * scale[c] + shift[c])` over `batch` samples of
    /// `c` channels of `hw` values.
    #[allow(clippy::too_many_arguments)]
    pub fn run_affine(
        &self,
        arena: &mut DeviceF32,
        x: usize,
        y: usize,
        batch: usize,
        c: usize,
        hw: usize,
        params: &DeviceF32,
        scale: usize,
        shift: usize,
        act: Act,
    ) -> Result<(), GpuError> {
        let n = batch * c * hw;
        let (xr, yr) = (x..x + n, y..y + n);
        let (xp, yp) = arena.io(&xr, &yr)?;
        let (sp, tp) = (params.ptr(scale..scale + c)?, params.ptr(shift..shift + c)?);
        let (code, lo, hi) = act.code();
        let (c, hw, total) = (c as u64, hw as u64, n as u64);
        let mut b = self.stream.launch_builder(&self.k.affine);
        b.arg(&xp)
            .arg(&yp)
            .arg(&sp)
            .arg(&tp)
            .arg(&c)
            .arg(&hw)
            .arg(&total);
        b.arg(&code).arg(&lo).arg(&hi);
        // SAFETY: arguments match `kp_affine`; x and y span `total` checked,
        // disjoint values, scale and shift `c` checked values each.
        unsafe { b.launch(Self::grid(total)) }
            .map(drop)
            .map_err(cuda("launching kp_affine"))
    }

    /// `y = act(a + b)` over `n` values; `y` may be `a` (in place), never
    /// `b` unless it is `a` too.
    #[allow(clippy::too_many_arguments)]
    pub fn run_add(
        &self,
        arena: &mut DeviceF32,
        a: usize,
        b_: usize,
        y: usize,
        n: usize,
        act: Act,
    ) -> Result<(), GpuError> {
        let (ar, br, yr) = (a..a + n, b_..b_ + n, y..y + n);
        if y != a {
            disjoint(&ar, &yr)?;
        }
        if y != b_ {
            disjoint(&br, &yr)?;
        }
        let (ap, bp, yp) = (arena.ptr(ar)?, arena.ptr(br)?, arena.ptr(yr)?);
        let (code, lo, hi) = act.code();
        let total = n as u64;
        let mut b = self.stream.launch_builder(&self.k.add);
        b.arg(&ap)
            .arg(&bp)
            .arg(&yp)
            .arg(&total)
            .arg(&code)
            .arg(&lo)
            .arg(&hi);
        // SAFETY: arguments match `kp_add`; the three ranges are checked;
        // y either equals an input exactly (element-wise in place) or is
        // disjoint from it.
        unsafe { b.launch(Self::grid(total)) }
            .map(drop)
            .map_err(cuda("launching kp_add"))
    }

    /// `y = act(x)` over `n` values.
    pub fn run_act(
        &self,
        arena: &mut DeviceF32,
        x: usize,
        y: usize,
        n: usize,
        act: Act,
    ) -> Result<(), GpuError> {
        let (xr, yr) = (x..x + n, y..y + n);
        let (xp, yp) = arena.io(&xr, &yr)?;
        let (code, lo, hi) = act.code();
        let total = n as u64;
        let mut b = self.stream.launch_builder(&self.k.act);
        b.arg(&xp).arg(&yp).arg(&total).arg(&code).arg(&lo).arg(&hi);
        // SAFETY: arguments match `kp_act`; x and y are checked, disjoint.
        unsafe { b.launch(Self::grid(total)) }
            .map(drop)
            .map_err(cuda("launching kp_act"))
    }

    /// Pads `planes` planes of `[h, w]` to `[h + top + bottom, w + left +
    /// right]` with `fill`; `pads` is `[top, left, bottom, right]`.
    #[allow(clippy::too_many_arguments)]
    pub fn run_pad(
        &self,
        arena: &mut DeviceF32,
        x: usize,
        y: usize,
        planes: usize,
        hw: [usize; 2],
        pads: [usize; 4],
        fill: f32,
    ) -> Result<(), GpuError> {
        let (oh, ow) = (hw[0] + pads[0] + pads[2], hw[1] + pads[1] + pads[3]);
        let (xr, yr) = (x..x + planes * hw[0] * hw[1], y..y + planes * oh * ow);
        let (xp, yp) = arena.io(&xr, &yr)?;
        let v = |u: usize| u as u64;
        let (p, h, w, oh, ow, t, l) = (
            v(planes),
            v(hw[0]),
            v(hw[1]),
            v(oh),
            v(ow),
            v(pads[0]),
            v(pads[1]),
        );
        let mut b = self.stream.launch_builder(&self.k.pad);
        b.arg(&xp)
            .arg(&yp)
            .arg(&p)
            .arg(&h)
            .arg(&w)
            .arg(&oh)
            .arg(&ow)
            .arg(&t)
            .arg(&l)
            .arg(&fill);
        // SAFETY: arguments match `kp_pad`; it reads planes x h x w and
        // writes planes x oh x ow values, both checked and disjoint.
        unsafe { b.launch(Self::grid(yr.len() as u64)) }
            .map(drop)
            .map_err(cuda("launching kp_pad"))
    }

    /// Copies each of `batch` samples of `per_src` values at `x` to
    /// `y + sample * per_dst + at` (one input of a channel concatenation).
    #[allow(clippy::too_many_arguments)]
    pub fn run_copy_block(
        &self,
        arena: &mut DeviceF32,
        x: usize,
        y: usize,
        batch: usize,
        per_src: usize,
        per_dst: usize,
        at: usize,
    ) -> Result<(), GpuError> {
        if at + per_src > per_dst {
            return Err(GpuError::Bounds(format!(
                "a block of {per_src} at {at} does not fit {per_dst} per sample"
            )));
        }
        let (xr, yr) = (x..x + batch * per_src, y..y + batch * per_dst);
        let (xp, yp) = arena.io(&xr, &yr)?;
        let (n, ps, pd, a) = (batch as u64, per_src as u64, per_dst as u64, at as u64);
        let mut b = self.stream.launch_builder(&self.k.copy_block);
        b.arg(&xp).arg(&yp).arg(&n).arg(&ps).arg(&pd).arg(&a);
        // SAFETY: arguments match `kp_copy_block`; reads batch x per_src,
        // writes within batch x per_dst (at + per_src <= per_dst), checked
        // and disjoint.
        unsafe { b.launch(Self::grid(xr.len() as u64)) }
            .map(drop)
            .map_err(cuda("launching kp_copy_block"))
    }

    /// Permutes the per-sample dimensions `shape` of `batch` samples: output
    /// dimension `i` is input dimension `perm[i]`.
    pub fn run_transpose(
        &self,
        arena: &mut DeviceF32,
        x: usize,
        y: usize,
        batch: usize,
        shape: &[usize],
        perm: &[usize],
    ) -> Result<(), GpuError> {
        let rank = shape.len();
        let mut sorted = perm.to_vec();
        sorted.sort_unstable();
        if rank > 8 || perm.len() != rank || sorted != (0..rank).collect::<Vec<_>>() {
            return Err(GpuError::Bounds(format!("transpose {perm:?} of {shape:?}")));
        }
        let per: usize = shape.iter().product();
        let mut stride = [1u64; 8];
        for d in (0..rank.saturating_sub(1)).rev() {
            stride[d] = stride[d + 1] * shape[d + 1] as u64;
        }
        let mut p = Perm {
            rank: rank as u32,
            pad: 0,
            per: per as u64,
            out_shape: [1; 8],
            in_stride: [0; 8],
        };
        for (i, &src) in perm.iter().enumerate() {
            p.out_shape[i] = shape[src] as u64;
            p.in_stride[i] = stride[src];
        }
        let (xr, yr) = (x..x + batch * per, y..y + batch * per);
        let (xp, yp) = arena.io(&xr, &yr)?;
        let n = batch as u64;
        let mut b = self.stream.launch_builder(&self.k.transpose);
        b.arg(&xp).arg(&yp).arg(&n).arg(&p);
        // SAFETY: arguments match `kp_transpose`; every source index is a
        // permutation of 0..per within its sample (perm checked above), so
        // reads and writes stay in the checked, disjoint ranges.
        unsafe { b.launch(Self::grid(yr.len() as u64)) }
            .map(drop)
            .map_err(cuda("launching kp_transpose"))
    }
}

/// The sizes of an NCHW tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Nchw {
    /// Batch.
    pub n: usize,
    /// Channels.
    pub c: usize,
    /// Height.
    pub h: usize,
    /// Width.
    pub w: usize,
}

impl Nchw {
    /// Values.
    pub fn len(&self) -> usize {
        self.n * self.c * self.h * self.w
    }

    /// Whether it holds no values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn desc(&self) -> Result<TensorDesc, GpuError> {
        TensorDesc::nchw(self.n, self.c, self.h, self.w)
    }
}

/// A convolution's sizes at one batch size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConvSpec {
    /// The input.
    pub x: Nchw,
    /// Output channels.
    pub c_out: usize,
    /// `[kh, kw]`.
    pub kernel: [usize; 2],
    /// `[sh, sw]`.
    pub stride: [usize; 2],
    /// Symmetric `[ph, pw]`.
    pub pad: [usize; 2],
    /// `[dh, dw]`.
    pub dilation: [usize; 2],
    /// Groups.
    pub groups: usize,
}

impl ConvSpec {
    /// Output `[oh, ow]`.
    pub fn out(&self) -> [usize; 2] {
        [0, 1].map(|d| {
            let i = [self.x.h, self.x.w][d] + 2 * self.pad[d];
            let k = (self.kernel[d] - 1) * self.dilation[d] + 1;
            (i.saturating_sub(k)) / self.stride[d].max(1) + 1
        })
    }
}

/// A convolution ready to run at one batch size.
#[derive(Debug)]
pub struct ConvOp {
    spec: ConvSpec,
    out: [usize; 2],
    x: TensorDesc,
    y: TensorDesc,
    w: FilterDesc,
    conv: ConvDesc,
    algo: dnn::cudnnConvolutionFwdAlgo_t,
    workspace_bytes: usize,
}

impl ConvOp {
    /// Workspace the chosen algorithm needs, bytes.
    pub fn workspace_bytes(&self) -> usize {
        self.workspace_bytes
    }
}

/// A pooling's sizes at one batch size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolSpec {
    /// The input.
    pub x: Nchw,
    /// Max (else average).
    pub max: bool,
    /// Average: padded positions count in the divisor.
    pub include_pad: bool,
    /// `[kh, kw]`.
    pub kernel: [usize; 2],
    /// `[sh, sw]`.
    pub stride: [usize; 2],
    /// `[top, left, bottom, right]`.
    pub pads: [usize; 4],
}

impl PoolSpec {
    /// Output `[oh, ow]` (floor mode).
    pub fn out(&self) -> [usize; 2] {
        [0, 1].map(|d| {
            let i = [self.x.h, self.x.w][d] + self.pads[d] + self.pads[d + 2];
            i.saturating_sub(self.kernel[d]) / self.stride[d].max(1) + 1
        })
    }
}

/// A pooling ready to run at one batch size.
#[derive(Debug)]
pub struct PoolOp {
    spec: PoolSpec,
    out: [usize; 2],
    cudnn: Option<(TensorDesc, TensorDesc, PoolDesc)>,
}

/// An LRN's sizes at one batch size.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LrnSpec {
    /// The input (and output).
    pub x: Nchw,
    /// Channels in the window.
    pub size: usize,
    /// Scale.
    pub alpha: f32,
    /// Exponent.
    pub beta: f32,
    /// Offset.
    pub bias: f32,
}

/// An LRN ready to run at one batch size.
#[derive(Debug)]
pub struct LrnOp {
    spec: LrnSpec,
    t: TensorDesc,
    d: LrnDesc,
}

/// A softmax ready to run at one batch size.
#[derive(Debug)]
pub struct SoftmaxOp {
    rows: usize,
    len: usize,
    t: TensorDesc,
}
