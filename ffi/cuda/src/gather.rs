//! The gather: a batch's requests, each in its own slot of the pinned input
//! pool, into the model's input tensor on the device, in one kernel launch
//! that reads host memory directly (no staging copy) — GSLICE's
//! `transfer_data_light`, plus the normalisation libml does on the CPU.
//!
//! This module is the part that needs no GPU: the descriptor layout the
//! kernel reads ([`GatherDesc`]), building it for a batch
//! ([`descriptors`]), the CUDA C source ([`KERNEL_SOURCE`]) and the CPU
//! reference of the same index arithmetic ([`gather_cpu`]), which the GPU
//! check compares the kernel with, bit for bit.
//!
//! Index arithmetic, the same on both sides (the kernel computes what
//! [`rgb_element`] and [`f32_element`] do, chunk by chunk; tests/
//! gather_emulated.rs runs its source on the CPU against [`gather_cpu`]):
//! - `rgb_u8_hwc` (an H×W×3 image, one byte per channel) → f32 NCHW: for
//!   request `r` of the batch and pixel `p` (`0..H·W`), channel `c`, the
//!   source byte is `pool[desc[r].src_offset + 3p + c]` and the destination
//!   `out[desc[r].dst_index · 3HW + c·HW + p] = lut[256c + byte]`, where
//!   `lut[256c + b] = (b / 255 − mean[c]) / std[c]` in f32: the very table
//!   libml's CPU path uses (`InputLayout`), so both give the same bits.
//! - `f32_nchw` (a ready tensor): element `e` of request `r` is the f32 at
//!   byte `desc[r].src_offset + 4e` (little-endian, as the wire carries
//!   it), copied to `out[desc[r].dst_index · elems + e]`.

/// One request of a batch, as the kernel reads it (`#[repr(C)]`, 16 bytes,
/// the layout of `struct kp_gather_desc` in [`KERNEL_SOURCE`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GatherDesc {
    /// Bytes from the start of the pinned pool to the request's slot.
    pub src_offset: u64,
    /// The request's position in the batch tensor.
    pub dst_index: u32,
    /// Zero; keeps the struct 16 bytes on both sides.
    pub reserved: u32,
}

/// The descriptors of a batch whose requests sit at `slot_offsets` (bytes
/// into the pool), in batch order (an iterator: the IF's per-batch path
/// fills a buffer it keeps, allocating nothing).
pub fn descriptors(
    slot_offsets: impl IntoIterator<Item = u64>,
) -> impl Iterator<Item = GatherDesc> {
    slot_offsets
        .into_iter()
        .enumerate()
        .map(|(i, src_offset)| GatherDesc {
            src_offset,
            dst_index: i as u32,
            reserved: 0,
        })
}

/// The per-channel table of `rgb_u8_hwc` normalisation:
/// `lut[256c + b] = (b / 255 − mean[c]) / std[c]`, in f32, as libml
/// computes it on the CPU.
pub fn rgb_lut(mean: [f32; 3], std: [f32; 3]) -> Vec<f32> {
    (0..3)
        .flat_map(|c| (0..=255u8).map(move |b| (f32::from(b) / 255.0 - mean[c]) / std[c]))
        .collect()
}

/// The shape of one request's input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GatherShape {
    /// An `height × width × 3` RGB u8 image, to f32 NCHW through the table.
    RgbU8Hwc {
        /// Rows.
        height: u32,
        /// Columns.
        width: u32,
    },
    /// `elems` f32 values, little-endian, copied as they are.
    F32 {
        /// Values per request.
        elems: u32,
    },
}

impl GatherShape {
    /// Bytes one request takes in the pool.
    pub fn request_bytes(self) -> u64 {
        match self {
            GatherShape::RgbU8Hwc { height, width } => 3 * u64::from(height) * u64::from(width),
            GatherShape::F32 { elems } => 4 * u64::from(elems),
        }
    }

    /// What the kernel counts per request, its last argument and the
    /// grid's x extent in [`CHUNK`]s: pixels (`rgb_u8_hwc`) or values
    /// (`f32`).
    pub fn kernel_items(self) -> u64 {
        match self {
            GatherShape::RgbU8Hwc { height, width } => u64::from(height) * u64::from(width),
            GatherShape::F32 { elems } => u64::from(elems),
        }
    }

    /// f32 values one request takes in the batch tensor.
    pub fn request_elems(self) -> u64 {
        match self {
            GatherShape::RgbU8Hwc { height, width } => 3 * u64::from(height) * u64::from(width),
            GatherShape::F32 { elems } => u64::from(elems),
        }
    }
}

/// `rgb_u8_hwc`: the source byte and the destination element of channel
/// `c` of pixel `p` of the request `d`, for `hw = height · width`.
#[inline]
pub fn rgb_element(d: &GatherDesc, p: u64, c: u64, hw: u64) -> (u64, u64) {
    (
        d.src_offset + 3 * p + c,
        u64::from(d.dst_index) * 3 * hw + c * hw + p,
    )
}

/// `f32_nchw`: the source byte (of 4) and the destination element of value
/// `e` of the request `d`.
#[inline]
pub fn f32_element(d: &GatherDesc, e: u64, elems: u64) -> (u64, u64) {
    (d.src_offset + 4 * e, u64::from(d.dst_index) * elems + e)
}

/// Why a gather's arguments do not fit together.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum GatherError {
    /// A request's bytes run past the end of the pool.
    #[error("request {index} at byte {offset} (+{len}) runs past the pool's {pool} bytes")]
    OutOfPool {
        /// Its position among the descriptors.
        index: usize,
        /// Its `src_offset`.
        offset: u64,
        /// Its length in bytes.
        len: u64,
        /// The pool's length.
        pool: u64,
    },
    /// A destination index past the batch, or two requests with one.
    #[error(
        "descriptor {index}: destination {dst} is outside the batch of {batch} or taken twice"
    )]
    BadDestination {
        /// Its position among the descriptors.
        index: usize,
        /// Its `dst_index`.
        dst: u32,
        /// The batch size (`out` holds this many requests).
        batch: u64,
    },
    /// `out` does not hold a whole number of requests, or the table is not
    /// 3 × 256 values.
    #[error(
        "output of {out} f32 for requests of {per} f32, or a table of {lut} values (want 768)"
    )]
    Sizes {
        /// `out.len()`.
        out: usize,
        /// Values per request.
        per: u64,
        /// `lut.len()`.
        lut: usize,
    },
    /// More blocks than a CUDA grid holds.
    #[error("a gather of {batch} requests of {blocks} blocks each is past CUDA's grid (2³¹ − 1 blocks by 65,535 requests)")]
    TooLarge {
        /// Blocks per request.
        blocks: u64,
        /// Requests in the batch.
        batch: usize,
    },
}

/// Destinations [`validate`] tracks without allocating: batches of up to
/// 64 times this.
const TAKEN_WORDS: usize = 16;

/// Checks `descs` against a pool of `pool_len` bytes and a batch tensor of
/// `out_len` values: what the kernel assumes and cannot check itself.
pub fn validate(
    descs: &[GatherDesc],
    shape: GatherShape,
    pool_len: u64,
    out_len: usize,
    lut_len: usize,
) -> Result<(), GatherError> {
    let per = shape.request_elems();
    let lut_ok = matches!(shape, GatherShape::F32 { .. }) || lut_len == 768;
    if per == 0 || !(out_len as u64).is_multiple_of(per) || !lut_ok {
        return Err(GatherError::Sizes {
            out: out_len,
            per,
            lut: lut_len,
        });
    }
    let batch = out_len as u64 / per;
    // Which destinations are taken: a bitset on the stack for the batches
    // an IF runs (no allocation per batch), on the heap beyond.
    let mut small = [0u64; TAKEN_WORDS];
    let mut large = Vec::new();
    let taken: &mut [u64] = if batch <= 64 * TAKEN_WORDS as u64 {
        &mut small
    } else {
        large.resize(batch.div_ceil(64) as usize, 0);
        &mut large
    };
    for (index, d) in descs.iter().enumerate() {
        let len = shape.request_bytes();
        if d.src_offset
            .checked_add(len)
            .is_none_or(|end| end > pool_len)
        {
            return Err(GatherError::OutOfPool {
                index,
                offset: d.src_offset,
                len,
                pool: pool_len,
            });
        }
        let (word, bit) = (d.dst_index as usize / 64, 1u64 << (d.dst_index % 64));
        match taken.get_mut(word) {
            Some(t) if u64::from(d.dst_index) < batch && *t & bit == 0 => *t |= bit,
            _ => {
                return Err(GatherError::BadDestination {
                    index,
                    dst: d.dst_index,
                    batch,
                })
            }
        }
    }
    Ok(())
}

/// The CPU reference of the kernel: the same descriptors, the same index
/// arithmetic, the same table.
pub fn gather_cpu(
    pool: &[u8],
    descs: &[GatherDesc],
    shape: GatherShape,
    lut: &[f32],
    out: &mut [f32],
) -> Result<(), GatherError> {
    validate(descs, shape, pool.len() as u64, out.len(), lut.len())?;
    match shape {
        GatherShape::RgbU8Hwc { height, width } => {
            let hw = u64::from(height) * u64::from(width);
            for d in descs {
                for p in 0..hw {
                    for c in 0..3 {
                        let (src, dst) = rgb_element(d, p, c, hw);
                        out[dst as usize] = lut[256 * c as usize + pool[src as usize] as usize];
                    }
                }
            }
        }
        GatherShape::F32 { elems } => {
            for d in descs {
                for e in 0..u64::from(elems) {
                    let (src, dst) = f32_element(d, e, u64::from(elems));
                    let s = src as usize;
                    out[dst as usize] =
                        f32::from_le_bytes([pool[s], pool[s + 1], pool[s + 2], pool[s + 3]]);
                }
            }
        }
    }
    Ok(())
}

/// The kernels of [`KERNEL_SOURCE`]: `rgb_u8_hwc` requests, `f32_nchw`
/// requests.
pub const KERNELS: [&str; 2] = ["kp_gather_rgb_u8_hwc", "kp_gather_f32"];

/// Threads per block of the gather kernels.
pub const BLOCK: u32 = 256;

/// Pixels (`rgb_u8_hwc`) or values (`f32`) of one request a block of the
/// gather takes: `KP_CHUNK` in [`KERNEL_SOURCE`].
pub const CHUNK: u32 = 1024;

/// The gather's grid for a batch of `n` requests of `shape`: one block per
/// [`CHUNK`] of a request along x, one request per y.
pub fn grid(shape: GatherShape, n: usize) -> Result<(u32, u32), GatherError> {
    let x = shape.kernel_items().div_ceil(u64::from(CHUNK));
    // CUDA's limits: 2³¹ − 1 blocks along x, 65,535 along y.
    match (u32::try_from(x), u32::try_from(n)) {
        (Ok(x), Ok(y)) if x < (1 << 31) && y <= 65_535 => Ok((x, y)),
        _ => Err(GatherError::TooLarge {
            blocks: x,
            batch: n,
        }),
    }
}

/// The gather kernels, CUDA C, compiled at start with NVRTC. Block `(x, y)`
/// takes [`CHUNK`] pixels (or values) of request `y`; the index expressions
/// are [`rgb_element`]'s and [`f32_element`]'s. `pool` is the device pointer
/// of the registered pool: reads go over the bus straight from host memory.
///
/// Reads from the pool are what costs: each is a round trip over the bus,
/// and a warp's read moves the best when it is one contiguous, aligned run
/// of bytes. So where the source is 16-byte aligned every thread loads 16
/// bytes at once (a warp, 512 contiguous bytes) and every byte is read
/// once; byte (or 4-byte) loads are the fallback where it is not, and for
/// the tail. For `rgb_u8_hwc` the block first copies its chunk's bytes into
/// shared memory, then writes each channel plane (coalesced stores); an
/// `f32` chunk goes straight from the pool to the tensor. The same source
/// is compiled by the host's C++ compiler and run, thread by thread, against
/// [`gather_cpu`] in CI (tests/gather_emulated.rs): no GPU needed to check
/// its indexing.
pub const KERNEL_SOURCE: &str = r#"
struct kp_gather_desc {
    unsigned long long src_offset;
    unsigned int dst_index;
    unsigned int reserved;
};

#define KP_CHUNK 1024u

extern "C" __global__ void kp_gather_rgb_u8_hwc(
    const unsigned char *__restrict__ pool, const struct kp_gather_desc *__restrict__ descs,
    unsigned int n, const float *__restrict__ lut, float *__restrict__ out, unsigned long long hw)
{
    __shared__ __align__(16) unsigned char tile[3 * KP_CHUNK];
    const unsigned long long p0 = (unsigned long long)blockIdx.x * KP_CHUNK;
    /* The same for every thread of the block: no thread waits alone below. */
    if (blockIdx.y >= n || p0 >= hw) return;
    const struct kp_gather_desc d = descs[blockIdx.y];
    const unsigned int pixels = hw - p0 < KP_CHUNK ? (unsigned int)(hw - p0) : KP_CHUNK;
    const unsigned int bytes = 3 * pixels;
    const unsigned char *src = pool + d.src_offset + 3 * p0;
    unsigned int head = 0;
    if (((unsigned long long)src & 15) == 0) {
        const unsigned int vecs = bytes / 16;
        for (unsigned int v = threadIdx.x; v < vecs; v += blockDim.x)
            ((uint4 *)tile)[v] = ((const uint4 *)src)[v];
        head = 16 * vecs;
    }
    for (unsigned int b = head + threadIdx.x; b < bytes; b += blockDim.x)
        tile[b] = src[b];
    __syncthreads();
    /* Pixel p = p0 + q: source byte d.src_offset + 3 * p + c is tile[3 * q + c]. */
    float *dst = out + (unsigned long long)d.dst_index * 3 * hw + p0;
    for (unsigned int c = 0; c < 3; c++)
        for (unsigned int q = threadIdx.x; q < pixels; q += blockDim.x)
            dst[c * hw + q] = lut[256 * c + tile[3 * q + c]];
}

extern "C" __global__ void kp_gather_f32(
    const unsigned char *__restrict__ pool, const struct kp_gather_desc *__restrict__ descs,
    unsigned int n, float *__restrict__ out, unsigned long long elems)
{
    const unsigned long long e0 = (unsigned long long)blockIdx.x * KP_CHUNK;
    if (blockIdx.y >= n || e0 >= elems) return;
    const struct kp_gather_desc d = descs[blockIdx.y];
    const unsigned int count = elems - e0 < KP_CHUNK ? (unsigned int)(elems - e0) : KP_CHUNK;
    /* Value e = e0 + i: source byte d.src_offset + 4 * e, destination
       (unsigned long long)d.dst_index * elems + e. */
    const unsigned char *src = pool + d.src_offset + 4 * e0;
    float *dst = out + (unsigned long long)d.dst_index * elems + e0;
    unsigned int head = 0;
    if ((((unsigned long long)src | (unsigned long long)dst) & 15) == 0) {
        const unsigned int vecs = count / 4;
        for (unsigned int v = threadIdx.x; v < vecs; v += blockDim.x)
            ((float4 *)dst)[v] = ((const float4 *)src)[v];
        head = 4 * vecs;
    }
    if (((unsigned long long)src & 3) == 0) {
        for (unsigned int i = head + threadIdx.x; i < count; i += blockDim.x)
            dst[i] = ((const float *)src)[i];
    } else {
        /* A pool not aligned for f32: the value's four bytes, little-endian. */
        for (unsigned int i = threadIdx.x; i < count; i += blockDim.x) {
            const unsigned char *s = src + 4 * i;
            dst[i] = __uint_as_float((unsigned int)s[0] | (unsigned int)s[1] << 8
                                     | (unsigned int)s[2] << 16 | (unsigned int)s[3] << 24);
        }
    }
}
"#;

#[cfg(test)]
mod tests {
    use super::*;

    /// SplitMix64.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        }
    }

    const MEAN: [f32; 3] = [0.485, 0.456, 0.406];
    const STD: [f32; 3] = [0.229, 0.224, 0.225];

    /// The formula written out, element by element (libml's CPU
    /// conversion): x[c,h,w] = (u8[h,w,c] / 255 − mean[c]) / std[c].
    fn reference_nchw(img: &[u8], h: usize, w: usize) -> Vec<f32> {
        let mut x = vec![0.0; 3 * h * w];
        for y in 0..h {
            for col in 0..w {
                for c in 0..3 {
                    let b = img[(y * w + col) * 3 + c];
                    x[c * h * w + y * w + col] = (f32::from(b) / 255.0 - MEAN[c]) / STD[c];
                }
            }
        }
        x
    }

    #[test]
    fn rgb_batch_from_scattered_slots_matches_the_formula_bit_for_bit() {
        let (h, w) = (4usize, 5usize);
        let shape = GatherShape::RgbU8Hwc {
            height: h as u32,
            width: w as u32,
        };
        let req = shape.request_bytes() as usize;
        // A pool of 7 slots with an odd stride (slots need not be packed),
        // and a batch of 3 requests from slots 5, 1, 3 in that order.
        let stride = req + 13;
        let mut rng = Rng(7);
        let pool: Vec<u8> = (0..7 * stride).map(|_| rng.next() as u8).collect();
        let slots = [5usize, 1, 3];
        let descs = descriptors(slots.iter().map(|s| (s * stride + 1) as u64)).collect::<Vec<_>>();
        let lut = rgb_lut(MEAN, STD);
        let mut out = vec![f32::NAN; 3 * 3 * h * w];
        gather_cpu(&pool, &descs, shape, &lut, &mut out).unwrap();
        for (i, s) in slots.iter().enumerate() {
            let img = &pool[s * stride + 1..s * stride + 1 + req];
            let want = reference_nchw(img, h, w);
            let got = &out[i * 3 * h * w..(i + 1) * 3 * h * w];
            assert!(
                got.iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "request {i} (slot {s}) differs"
            );
        }
    }

    #[test]
    fn f32_requests_are_copied_as_they_are() {
        let shape = GatherShape::F32 { elems: 6 };
        let values: Vec<f32> = (0..24).map(|i| i as f32 * 0.5 - 3.0).collect();
        let mut pool = vec![0u8; 2];
        for v in &values {
            pool.extend_from_slice(&v.to_le_bytes());
        }
        // Requests 3, 0, 2 of the four in the pool.
        let descs = descriptors([3u64, 0, 2].map(|r| 2 + r * 24)).collect::<Vec<_>>();
        let mut out = vec![0.0; 18];
        gather_cpu(&pool, &descs, shape, &[], &mut out).unwrap();
        assert_eq!(&out[..6], &values[18..24]);
        assert_eq!(&out[6..12], &values[..6]);
        assert_eq!(&out[12..], &values[12..18]);
    }

    #[test]
    fn descriptors_number_the_batch_in_order_and_are_16_bytes() {
        let d = descriptors([40, 0, 8]).collect::<Vec<_>>();
        assert_eq!(d.iter().map(|d| d.dst_index).collect::<Vec<_>>(), [0, 1, 2]);
        assert_eq!(d[0].src_offset, 40);
        assert_eq!(std::mem::size_of::<GatherDesc>(), 16);
        assert_eq!(std::mem::align_of::<GatherDesc>(), 8);
    }

    #[test]
    fn what_the_kernel_cannot_check_is_refused() {
        let shape = GatherShape::RgbU8Hwc {
            height: 2,
            width: 2,
        };
        let lut = rgb_lut(MEAN, STD);
        let mut out = vec![0.0; 24];
        let pool = vec![0u8; 30];
        let e = gather_cpu(
            &pool,
            &descriptors([0, 20]).collect::<Vec<_>>(),
            shape,
            &lut,
            &mut out,
        )
        .unwrap_err();
        assert!(matches!(e, GatherError::OutOfPool { index: 1, .. }), "{e}");
        let twice = [GatherDesc {
            src_offset: 0,
            dst_index: 1,
            reserved: 0,
        }; 2];
        let e = gather_cpu(&pool, &twice, shape, &lut, &mut out).unwrap_err();
        assert!(
            matches!(e, GatherError::BadDestination { index: 1, .. }),
            "{e}"
        );
        let e = gather_cpu(
            &pool,
            &descriptors([0]).collect::<Vec<_>>(),
            shape,
            &lut,
            &mut out[..5],
        )
        .unwrap_err();
        assert!(matches!(e, GatherError::Sizes { .. }), "{e}");
        let e = gather_cpu(
            &pool,
            &descriptors([0]).collect::<Vec<_>>(),
            shape,
            &lut[..10],
            &mut out,
        )
        .unwrap_err();
        assert!(matches!(e, GatherError::Sizes { .. }), "{e}");
    }

    #[test]
    fn destinations_are_checked_on_the_stack_and_beyond_it() {
        let shape = GatherShape::F32 { elems: 1 };
        let d = |dst: u32| GatherDesc {
            src_offset: 0,
            dst_index: dst,
            reserved: 0,
        };
        // A batch of 4: destination 4 lies inside the stack bitset's words
        // but outside the batch.
        assert!(matches!(
            validate(&[d(0), d(4)], shape, 4, 4, 0),
            Err(GatherError::BadDestination {
                index: 1,
                dst: 4,
                batch: 4
            })
        ));
        // Batches past the stack bitset (64 · TAKEN_WORDS): every
        // destination once passes, one twice does not.
        for batch in [64 * TAKEN_WORDS as u32, 64 * TAKEN_WORDS as u32 + 1, 5000] {
            let mut descs: Vec<GatherDesc> = (0..batch).rev().map(d).collect();
            assert_eq!(validate(&descs, shape, 4, batch as usize, 0), Ok(()));
            descs[7] = d(batch - 1);
            assert!(matches!(
                validate(&descs, shape, 4, batch as usize, 0),
                Err(GatherError::BadDestination { index: 7, .. })
            ));
        }
    }
}
