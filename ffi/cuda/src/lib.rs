//! kp-cuda — the one safe wrapper over CUDA for kneepoint: a GPU opened with
//! clear errors, the input pool registered as pinned host memory, and the
//! gather kernel that turns a batch of requests in that pool into the
//! model's input tensor on the device.
//!
//! # Design
//!
//! On `cudarc` (the design's CUDA crate), built without default features and
//! with `dynamic-loading`: libcuda, libnvrtc (and, for the engine to come,
//! libcublas and libcudnn) are `dlopen()`ed at run time through the normal
//! search path, so this crate builds and its CPU side is tested on machines
//! without CUDA. cudarc panics when a library or one of its symbols is
//! missing; [`Gpu::open`] checks the libraries first ([`check_libraries`])
//! and returns [`GpuError`] instead, with what was looked for. An IF asked to
//! run on a GPU that cannot have one fails with that error: there is no
//! silent CPU fallback.
//!
//! - [`gather`]: the descriptors, the kernel source and the CPU reference
//!   (no GPU needed; `#![deny(unsafe_code)]` in spirit: it has none).
//! - [`Gpu`], [`PinnedRegion`], [`PinnedRange`], [`GatherKernel`]: the
//!   device side. Pinned registration follows DPDK gpudev's and GSLICE's
//!   sequence: `cuMemHostRegister` with PORTABLE | DEVICEMAP, then the
//!   device pointer of the range (`cuMemHostGetDevicePointer`), which the
//!   kernel reads through; unregistered on drop. A region borrows the
//!   memory it registers (and can show it on the host); a range is
//!   registered by address, for the IF's input pool, whose slots the
//!   runtime hands out one by one, and the device alone reads it.
//!
//! # Limits
//!
//! One device, one stream per [`Gpu`]. [`dnn`] holds the network steps the
//! `cudnn` engine maps a plan onto (cuDNN, cuBLAS, NVRTC step kernels).

pub mod dnn;
pub mod gather;

/// The cudarc this crate is built on: its device buffers, streams and events
/// are part of this crate's API.
pub use cudarc;

use std::marker::PhantomData;
use std::sync::Arc;

use cudarc::driver::sys;
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, CudaView, CudaViewMut, DeviceRepr,
    LaunchConfig, PushKernelArg,
};

use gather::{GatherDesc, GatherError, GatherShape, BLOCK, KERNEL_SOURCE};

/// Why the GPU path cannot run.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    /// libcuda is not loadable: no NVIDIA driver on this machine.
    #[error("no CUDA driver found (libcuda.so.1 not loadable; looked for {looked}): this machine has no NVIDIA driver, or it is not on the library path")]
    NoDriver {
        /// The file names tried.
        looked: String,
    },
    /// libnvrtc is not loadable: the gather kernel cannot be compiled.
    #[error("NVRTC missing (looked for {looked}): install the CUDA runtime compiler (e.g. the nvidia-cuda-nvrtc wheel) and put its lib folder on LD_LIBRARY_PATH")]
    NoNvrtc {
        /// The file names tried.
        looked: String,
    },
    /// The driver loaded but there is no usable device.
    #[error("no GPU: {0}")]
    NoDevice(String),
    /// A CUDA call failed.
    #[error("CUDA: {what}: {error}")]
    Cuda {
        /// What was being done.
        what: &'static str,
        /// The driver's error.
        error: cudarc::driver::DriverError,
    },
    /// NVRTC refused the kernel.
    #[error("compiling the gather kernel: {0}")]
    Compile(String),
    /// Registering host memory as pinned failed.
    #[error("cannot register {len} bytes at {addr:#x} as pinned host memory: {error}")]
    Register {
        /// Start of the range.
        addr: usize,
        /// Its length.
        len: usize,
        /// The driver's error.
        error: cudarc::driver::DriverError,
    },
    /// The descriptors on the device are not the ones checked on the host.
    #[error("{device} descriptors on the device, {host} on the host")]
    DescriptorCount {
        /// On the device.
        device: usize,
        /// On the host.
        host: usize,
    },
    /// The gather's arguments do not fit together.
    #[error(transparent)]
    Gather(#[from] GatherError),
    /// A library the network steps need (cuDNN, cuBLAS) is not loadable.
    #[error("{lib} missing (looked for {looked}): {fix}")]
    NoLibrary {
        /// Which.
        lib: &'static str,
        /// The file names tried.
        looked: String,
        /// How to get it.
        fix: &'static str,
    },
    /// A cuDNN or cuBLAS call failed.
    #[error("{what}: {error}")]
    Library {
        /// The call.
        what: &'static str,
        /// Its status.
        error: String,
    },
    /// A step was asked to touch memory outside its buffers, or to write
    /// over its own input.
    #[error("device memory: {0}")]
    Bounds(String),
}

fn cuda(what: &'static str) -> impl FnOnce(cudarc::driver::DriverError) -> GpuError {
    move |error| GpuError::Cuda { what, error }
}

fn candidates(lib: &str) -> String {
    cudarc::get_lib_name_candidates(lib).join(", ")
}

/// Whether libcuda and libnvrtc can be loaded; the error says which is
/// missing and what was looked for. Call before any other CUDA call (cudarc
/// panics on a missing library).
pub fn check_libraries() -> Result<(), GpuError> {
    // SAFETY: `is_culib_present` only tries `dlopen` on the candidate names
    // and closes what it opened; it has no other precondition.
    if !unsafe { sys::is_culib_present() } {
        return Err(GpuError::NoDriver {
            looked: candidates("cuda"),
        });
    }
    // SAFETY: as above, for libnvrtc.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(GpuError::NoNvrtc {
            looked: candidates("nvrtc"),
        });
    }
    Ok(())
}

/// What a [`Gpu`] is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Its ordinal.
    pub ordinal: usize,
    /// Its name, e.g. "NVIDIA H100 80GB HBM3".
    pub name: String,
    /// Compute capability (major, minor).
    pub compute_capability: (i32, i32),
    /// Device memory, bytes.
    pub total_mem: usize,
    /// Whether a registered host pointer can be used on the device as is
    /// (otherwise its device pointer is asked for).
    pub host_pointer_usable: bool,
    /// Streaming multiprocessors of the device.
    pub sm_count: i32,
    /// Those this context may run on, as the driver reports them
    /// (`cuCtxGetExecAffinity`, SM count): fewer than `sm_count` for a
    /// client of CUDA MPS with an active-thread percentage below 100;
    /// `None` when the driver does not say.
    pub sms_available: Option<u32>,
}

/// One device, opened: its context and the stream everything runs on.
#[derive(Debug)]
pub struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    info: DeviceInfo,
}

impl Gpu {
    /// Opens device `ordinal`: checks the libraries, creates the context
    /// (after `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` is set, if it is: the
    /// share is fixed here) and a stream.
    pub fn open(ordinal: usize) -> Result<Gpu, GpuError> {
        check_libraries()?;
        let count = CudaContext::device_count().map_err(|e| GpuError::NoDevice(e.to_string()))?;
        if ordinal >= count.max(0) as usize {
            return Err(GpuError::NoDevice(format!(
                "device {ordinal} asked for, the driver sees {count}"
            )));
        }
        let ctx = CudaContext::new(ordinal).map_err(|e| GpuError::NoDevice(e.to_string()))?;
        let stream = ctx.new_stream().map_err(cuda("creating a stream"))?;
        let info = DeviceInfo {
            ordinal,
            name: ctx.name().map_err(cuda("reading the device name"))?,
            compute_capability: ctx
                .compute_capability()
                .map_err(cuda("reading the compute capability"))?,
            total_mem: ctx.total_mem().map_err(cuda("reading the memory size"))?,
            host_pointer_usable: ctx
                .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM)
                .map_err(cuda("reading CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM"))?
                != 0,
            sm_count: ctx
                .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
                .map_err(cuda("reading the multiprocessor count"))?,
            sms_available: sms_available(&ctx),
        };
        Ok(Gpu { ctx, stream, info })
    }

    /// What it is.
    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    /// Its context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The stream kneepoint's work runs on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
}

/// The SMs `ctx` may run on (its execution affinity), or `None` when the
/// driver does not report it.
fn sms_available(ctx: &CudaContext) -> Option<u32> {
    ctx.bind_to_thread().ok()?;
    // SAFETY: an all-zero CUexecAffinityParam is a valid value of the
    // plain C struct (a type tag and a union of one unsigned int).
    let mut param: sys::CUexecAffinityParam = unsafe { std::mem::zeroed() };
    // SAFETY: `param` is a valid place for the driver to write one
    // CUexecAffinityParam; the context is current on this thread (bound
    // just above), which is the context the call reports on.
    let r = unsafe {
        sys::cuCtxGetExecAffinity(
            &mut param,
            sys::CUexecAffinityType::CU_EXEC_AFFINITY_TYPE_SM_COUNT,
        )
    };
    r.result().ok()?;
    // SAFETY: for CU_EXEC_AFFINITY_TYPE_SM_COUNT the driver fills the
    // union's `smCount` member, the only one it has.
    Some(unsafe { param.param.smCount.val })
}

/// A range of host memory registered with the driver as pinned (page-locked,
/// mapped into the device's address space), for as long as this value
/// lives; `'a` keeps the memory borrowed, so it outlives the registration.
#[derive(Debug)]
pub struct PinnedRegion<'a> {
    host: *mut u8,
    len: usize,
    device: sys::CUdeviceptr,
    ctx: Arc<CudaContext>,
    _mem: PhantomData<&'a mut [u8]>,
}

impl<'a> PinnedRegion<'a> {
    /// Registers `mem` (e.g. the IF's hugepage input pool) with PORTABLE |
    /// DEVICEMAP and finds its device pointer. The memory stays borrowed:
    /// while registered, the device may read it at any time.
    pub fn register(gpu: &Gpu, mem: &'a mut [u8]) -> Result<PinnedRegion<'a>, GpuError> {
        let (host, len) = (mem.as_mut_ptr(), mem.len());
        let device = register_host(gpu, host as usize, len)?;
        Ok(PinnedRegion {
            host,
            len,
            device,
            ctx: gpu.ctx.clone(),
            _mem: PhantomData,
        })
    }

    /// Its length, bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The address the device reads it at.
    pub fn device_ptr(&self) -> sys::CUdeviceptr {
        self.device
    }

    /// The registered bytes, read on the host (a plain pinned copy reads
    /// them from here; the CPU reference of the gather too).
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY:
        // - `host..host + len` is the range `register` borrowed mutably for
        //   `'a`, live and initialised (it came from a `&mut [u8]`);
        // - nothing writes it while this shared borrow lives: the mutable
        //   borrow is held by this value, and the device only reads it.
        unsafe { std::slice::from_raw_parts(self.host, self.len) }
    }
}

impl Drop for PinnedRegion<'_> {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: `host` is the start of a range this value registered and
        // has not unregistered; nothing launched by kneepoint reads it after
        // the stream that used it was synchronised (`GatherKernel` launches
        // are followed by a synchronisation before results are read).
        let _ = unsafe { sys::cuMemHostUnregister(self.host.cast()) };
    }
}

/// Registers `addr..addr + len` as pinned host memory (PORTABLE |
/// DEVICEMAP) and returns the address the device reads it at; on error
/// nothing stays registered.
fn register_host(gpu: &Gpu, addr: usize, len: usize) -> Result<sys::CUdeviceptr, GpuError> {
    gpu.ctx
        .bind_to_thread()
        .map_err(cuda("binding the context"))?;
    let host = addr as *mut std::ffi::c_void;
    let flags = sys::CU_MEMHOSTREGISTER_PORTABLE | sys::CU_MEMHOSTREGISTER_DEVICEMAP;
    // SAFETY: the call reads no host memory itself: the driver looks the
    // range up in the process's mappings and pins its pages (a range that
    // is not mapped is an error, returned below); the context is current
    // on this thread (bound just above).
    let r = unsafe { sys::cuMemHostRegister_v2(host, len, flags) };
    r.result()
        .map_err(|error| GpuError::Register { addr, len, error })?;
    let mut device: sys::CUdeviceptr = 0;
    // SAFETY: `host` was registered just above with DEVICEMAP, which is
    // what the call requires; `device` is a valid place to write to;
    // flags must be 0.
    let r = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut device, host, 0) };
    if let Err(e) = r.result() {
        // SAFETY: `host` is the start of the range registered above.
        let _ = unsafe { sys::cuMemHostUnregister(host) };
        return Err(cuda("finding the device pointer of pinned memory")(e));
    }
    Ok(device)
}

/// Host memory registered with the driver by address, for memory this
/// crate cannot borrow: the IF's input pool, whose slots the runtime hands
/// to its threads one by one. Unlike [`PinnedRegion`] it offers no host
/// view: nothing reads it on the host through this value. The device only
/// reads it (the gather writes device memory alone), so whatever becomes of
/// the range, no host memory is touched through it; the owner keeps it
/// mapped, and its bytes unwritten where a batch reads, while launches read
/// it (libml's `Framework::attach_input_pool` contract). Unregistered on
/// drop.
#[derive(Debug)]
pub struct PinnedRange {
    addr: usize,
    len: usize,
    device: sys::CUdeviceptr,
    ctx: Arc<CudaContext>,
}

impl PinnedRange {
    /// Registers `addr..addr + len` with PORTABLE | DEVICEMAP and finds
    /// its device pointer; an error (e.g. a range that is not mapped, or
    /// already registered) says which range.
    pub fn register(gpu: &Gpu, addr: usize, len: usize) -> Result<PinnedRange, GpuError> {
        let device = register_host(gpu, addr, len)?;
        Ok(PinnedRange {
            addr,
            len,
            device,
            ctx: gpu.ctx.clone(),
        })
    }

    /// Its length, bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Its host address.
    pub fn addr(&self) -> usize {
        self.addr
    }

    /// The address the device reads it at.
    pub fn device_ptr(&self) -> sys::CUdeviceptr {
        self.device
    }
}

impl Drop for PinnedRange {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: `addr` is the start of a range this value registered and
        // has not unregistered; launches that read it were synchronised
        // before their results were read, which is before this value can
        // be dropped by its owner.
        let _ = unsafe { sys::cuMemHostUnregister(self.addr as *mut std::ffi::c_void) };
    }
}

/// Pinned host memory the gather reads: a [`PinnedRegion`] or a
/// [`PinnedRange`].
pub trait PinnedHost {
    /// The address the device reads it at.
    fn device_ptr(&self) -> sys::CUdeviceptr;
    /// Its length, bytes.
    fn len(&self) -> usize;
    /// Whether it is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl PinnedHost for PinnedRegion<'_> {
    fn device_ptr(&self) -> sys::CUdeviceptr {
        self.device
    }
    fn len(&self) -> usize {
        self.len
    }
}

impl PinnedHost for PinnedRange {
    fn device_ptr(&self) -> sys::CUdeviceptr {
        self.device
    }
    fn len(&self) -> usize {
        self.len
    }
}

// SAFETY: `GatherDesc` is `#[repr(C)]` plain data (u64, u32, u32; no
// padding, no pointers), the layout of `struct kp_gather_desc` in the kernel.
unsafe impl DeviceRepr for GatherDesc {}

/// The gather kernels, compiled once with NVRTC and loaded.
#[derive(Debug)]
pub struct GatherKernel {
    rgb: CudaFunction,
    f32: CudaFunction,
}

impl GatherKernel {
    /// Compiles [`KERNEL_SOURCE`] for `gpu` and loads both kernels.
    pub fn compile(gpu: &Gpu) -> Result<GatherKernel, GpuError> {
        let ptx = cudarc::nvrtc::compile_ptx(KERNEL_SOURCE)
            .map_err(|e| GpuError::Compile(e.to_string()))?;
        let module = gpu
            .ctx
            .load_module(ptx)
            .map_err(cuda("loading the gather module"))?;
        let [rgb, f32] = gather::KERNELS;
        Ok(GatherKernel {
            rgb: module.load_function(rgb).map_err(cuda(rgb))?,
            f32: module.load_function(f32).map_err(cuda(f32))?,
        })
    }

    /// Enqueues one gather of the batch `descs` (on the device already)
    /// from `pool` into `out` on `gpu`'s stream; `lut` is
    /// [`gather::rgb_lut`] on the device (unused for f32 requests).
    /// `host_descs` are the same descriptors on the host, checked against
    /// the pool and `out` first: the kernel trusts them.
    #[allow(clippy::too_many_arguments)]
    pub fn launch(
        &self,
        gpu: &Gpu,
        pool: &dyn PinnedHost,
        host_descs: &[GatherDesc],
        descs: &CudaView<'_, GatherDesc>,
        shape: GatherShape,
        lut: &CudaSlice<f32>,
        out: &mut CudaViewMut<'_, f32>,
    ) -> Result<(), GpuError> {
        gather::validate(host_descs, shape, pool.len() as u64, out.len(), lut.len())?;
        if descs.len() != host_descs.len() {
            return Err(GpuError::DescriptorCount {
                device: descs.len(),
                host: host_descs.len(),
            });
        }
        let n = host_descs.len() as u32;
        let per = shape.kernel_items();
        if n == 0 || per == 0 {
            return Ok(());
        }
        let (x, y) = gather::grid(shape, host_descs.len())?;
        let cfg = LaunchConfig {
            grid_dim: (x, y, 1),
            block_dim: (BLOCK, 1, 1),
            shared_mem_bytes: 0,
        };
        let pool_ptr = pool.device_ptr();
        let stream = &gpu.stream;
        let result = match shape {
            GatherShape::RgbU8Hwc { .. } => {
                let mut b = stream.launch_builder(&self.rgb);
                b.arg(&pool_ptr)
                    .arg(descs)
                    .arg(&n)
                    .arg(lut)
                    .arg(out)
                    .arg(&per);
                // SAFETY: the arguments match `kp_gather_rgb_u8_hwc`'s
                // parameters in order and type; every index the kernel
                // forms stays inside `pool` and `out` (checked by
                // `validate` above) and inside `lut` (768 values, checked).
                unsafe { b.launch(cfg) }
            }
            GatherShape::F32 { .. } => {
                let mut b = stream.launch_builder(&self.f32);
                b.arg(&pool_ptr).arg(descs).arg(&n).arg(out).arg(&per);
                // SAFETY: as above, for `kp_gather_f32`.
                unsafe { b.launch(cfg) }
            }
        };
        result.map(drop).map_err(cuda("launching the gather"))
    }
}

/// A pinned input pool and what gathers batches from it: the range
/// registered by address, the gather kernel, the normalisation table and
/// the descriptors' buffers (grown to the largest batch, never allocated
/// per batch). What a GPU engine that reads the IF's pool in place holds.
#[derive(Debug)]
pub struct PoolGather {
    range: PinnedRange,
    kernel: GatherKernel,
    shape: GatherShape,
    lut: CudaSlice<f32>,
    descs: CudaSlice<GatherDesc>,
    host_descs: Vec<GatherDesc>,
}

impl PoolGather {
    /// Registers `len` bytes at `addr` ([`PinnedRange::register`]) as a
    /// pool of `shape` requests, normalised (for `rgb_u8_hwc`) with
    /// `mean`, `std`; compiles the kernel; room for batches of `batch`.
    pub fn new(
        gpu: &Gpu,
        addr: usize,
        len: usize,
        shape: GatherShape,
        (mean, std): ([f32; 3], [f32; 3]),
        batch: usize,
    ) -> Result<PoolGather, GpuError> {
        let range = PinnedRange::register(gpu, addr, len)?;
        let kernel = GatherKernel::compile(gpu)?;
        let lut = gpu
            .stream
            .clone_htod(&gather::rgb_lut(mean, std))
            .map_err(cuda("uploading the normalisation table"))?;
        let batch = batch.max(1);
        let descs = gpu
            .stream
            .clone_htod(&vec![GatherDesc::default(); batch])
            .map_err(cuda("allocating the gather descriptors"))?;
        Ok(PoolGather {
            range,
            kernel,
            shape,
            lut,
            descs,
            host_descs: Vec::with_capacity(batch),
        })
    }

    /// One request as the pool holds it.
    pub fn shape(&self) -> GatherShape {
        self.shape
    }

    /// Enqueues on `gpu`'s stream the gather of the requests at `offsets`
    /// (bytes into the pool, batch order) into `out` (exactly that many
    /// requests' values): one descriptor upload, one launch.
    pub fn gather(
        &mut self,
        gpu: &Gpu,
        offsets: &[u64],
        out: &mut CudaViewMut<'_, f32>,
    ) -> Result<(), GpuError> {
        let n = offsets.len();
        self.host_descs.clear();
        self.host_descs
            .extend(gather::descriptors(offsets.iter().copied()));
        if self.descs.len() < n {
            self.descs = gpu
                .stream
                .clone_htod(&self.host_descs)
                .map_err(cuda("allocating the gather descriptors"))?;
        } else {
            let mut dst = self.descs.slice_mut(0..n);
            gpu.stream
                .memcpy_htod(&self.host_descs, &mut dst)
                .map_err(cuda("copying the gather descriptors"))?;
        }
        let descs = self.descs.slice(0..n);
        self.kernel.launch(
            gpu,
            &self.range,
            &self.host_descs,
            &descs,
            self.shape,
            &self.lut,
            out,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_errors_say_what_is_missing_and_what_to_do() {
        let e = GpuError::NoDriver {
            looked: candidates("cuda"),
        };
        let text = e.to_string();
        assert!(text.starts_with("no CUDA driver found"), "{text}");
        assert!(text.contains("libcuda.so.1"), "{text}");
        let e = GpuError::NoNvrtc {
            looked: candidates("nvrtc"),
        };
        assert!(e.to_string().contains("libnvrtc.so"), "{e}");
        assert!(GpuError::NoDevice("x".into())
            .to_string()
            .starts_with("no GPU"));
    }

    #[test]
    fn opening_a_gpu_never_panics() {
        // Here (CI, no NVIDIA driver) this is an error that says so; on a
        // GPU machine it opens device 0. Either way no panic: the libraries
        // are checked before cudarc is asked for anything.
        match Gpu::open(0) {
            Ok(gpu) => assert!(!gpu.info().name.is_empty()),
            // SAFETY: `is_culib_present` only tries `dlopen`.
            Err(GpuError::NoDriver { .. }) => assert!(!unsafe { sys::is_culib_present() }),
            Err(e) => assert!(
                matches!(e, GpuError::NoNvrtc { .. } | GpuError::NoDevice(_)),
                "{e}"
            ),
        }
    }
}
