//! The gather kernels run without a GPU: their CUDA C source
//! (`kp_cuda::gather::KERNEL_SOURCE`, the very text NVRTC compiles at an
//! IF's start) is compiled by the host's C++ compiler behind a small
//! prelude that plays CUDA's part: one POSIX thread per CUDA thread of a
//! block, `__shared__` memory shared by the block's threads, a barrier for
//! `__syncthreads()`, blocks one after another over the grid
//! `kp_cuda::gather::grid` gives. Its output must equal the CPU reference
//! (`gather_cpu`) bit for bit, every element written, for batches whose
//! slots take each of the kernels' paths: 16-byte loads, byte (or 4-byte)
//! loads, a chunk's tail, requests out of order.
//!
//! What this cannot show is what only a GPU does: timing, and the bus.
//! `make gpu-check` runs the same kernels on one. It needs a C++ compiler
//! (`c++`, `clang++` or `g++`; Debian's clang, which setup installs, has
//! one): without one it fails and says so.

use std::path::{Path, PathBuf};
use std::process::Command;

use kp_cuda::gather::{self, GatherDesc, GatherShape, BLOCK, KERNEL_SOURCE};

/// CUDA's part, for a host C++ compiler.
const PRELUDE: &str = r#"
#include <pthread.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
struct kp_dim3 { unsigned int x, y, z; };
static kp_dim3 gridDim, blockDim, blockIdx;
static thread_local kp_dim3 threadIdx;
static pthread_barrier_t kp_barrier;
struct uint4 { unsigned int x, y, z, w; };
struct float4 { float x, y, z, w; };
static inline float __uint_as_float(unsigned int u) { float f; memcpy(&f, &u, 4); return f; }
#define __global__
#define __restrict__ __restrict
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
#define __syncthreads() pthread_barrier_wait(&kp_barrier)
"#;

/// Reads the inputs the test wrote, runs the grid, writes `out.bin`.
/// Arguments: DIR KIND(rgb|f32) N PER GRID_X POOL_SHIFT.
const DRIVER: &str = r#"
static std::vector<unsigned char> slurp(const char *dir, const char *name) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "rb");
    if (!f) { perror(path); exit(3); }
    std::vector<unsigned char> v;
    unsigned char buf[65536];
    size_t k;
    while ((k = fread(buf, 1, sizeof buf, f)) > 0) v.insert(v.end(), buf, buf + k);
    fclose(f);
    return v;
}
struct kp_args {
    int rgb; unsigned int tid;
    const unsigned char *pool; const kp_gather_desc *descs; unsigned int n;
    const float *lut; float *out; unsigned long long per;
};
static void *kp_thread(void *p) {
    kp_args *a = (kp_args *)p;
    threadIdx = kp_dim3{a->tid, 0, 0};
    if (a->rgb) kp_gather_rgb_u8_hwc(a->pool, a->descs, a->n, a->lut, a->out, a->per);
    else kp_gather_f32(a->pool, a->descs, a->n, a->out, a->per);
    return nullptr;
}
int main(int argc, char **argv) {
    if (argc != 8) { fprintf(stderr, "usage: DIR KIND N PER GRID_X POOL_SHIFT BLOCK\n"); return 2; }
    const char *dir = argv[1];
    int rgb = strcmp(argv[2], "rgb") == 0;
    unsigned int n = (unsigned int)strtoul(argv[3], 0, 10);
    unsigned long long per = strtoull(argv[4], 0, 10);
    unsigned int grid_x = (unsigned int)strtoul(argv[5], 0, 10);
    size_t shift = strtoul(argv[6], 0, 10);
    unsigned int block = (unsigned int)strtoul(argv[7], 0, 10);
    std::vector<unsigned char> pool_bytes = slurp(dir, "pool.bin");
    std::vector<unsigned char> desc_bytes = slurp(dir, "descs.bin");
    std::vector<unsigned char> lut_bytes = slurp(dir, "lut.bin");
    std::vector<unsigned char> out_bytes = slurp(dir, "out.bin");
    /* The pool at a 64-byte boundary plus POOL_SHIFT, as a registered pool
       at an address of that alignment. */
    unsigned char *base = (unsigned char *)aligned_alloc(64, pool_bytes.size() + 128);
    unsigned char *pool = base + shift;
    memcpy(pool, pool_bytes.data(), pool_bytes.size());
    kp_gather_desc *descs = (kp_gather_desc *)aligned_alloc(64, desc_bytes.size() + 64);
    memcpy(descs, desc_bytes.data(), desc_bytes.size());
    float *lut = (float *)aligned_alloc(64, lut_bytes.size() + 64);
    memcpy(lut, lut_bytes.data(), lut_bytes.size());
    float *out = (float *)aligned_alloc(64, out_bytes.size() + 64);
    memcpy(out, out_bytes.data(), out_bytes.size());
    gridDim = kp_dim3{grid_x, n, 1};
    blockDim = kp_dim3{block, 1, 1};
    std::vector<pthread_t> threads(block);
    std::vector<kp_args> args(block);
    for (unsigned int y = 0; y < n; y++) {
        for (unsigned int x = 0; x < grid_x; x++) {
            blockIdx = kp_dim3{x, y, 0};
            pthread_barrier_init(&kp_barrier, nullptr, block);
            for (unsigned int t = 0; t < block; t++) {
                args[t] = kp_args{rgb, t, pool, descs, n, lut, out, per};
                if (pthread_create(&threads[t], nullptr, kp_thread, &args[t]) != 0) { perror("pthread_create"); return 3; }
            }
            for (unsigned int t = 0; t < block; t++) pthread_join(threads[t], nullptr);
            pthread_barrier_destroy(&kp_barrier);
        }
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/out.bin", dir);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(out, 1, out_bytes.size(), f) != out_bytes.size()) { perror(path); return 3; }
    fclose(f);
    return 0;
}
"#;

/// A C++ compiler: `$CXX`, else the first of c++, clang++, g++ that runs.
fn cxx() -> String {
    let candidates: Vec<String> = std::env::var("CXX")
        .into_iter()
        .chain(["c++", "clang++", "g++"].map(String::from))
        .collect();
    for c in &candidates {
        if Command::new(c)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
        {
            return c.clone();
        }
    }
    panic!("no C++ compiler (tried {candidates:?}): install g++ or clang (scripts/setup.sh installs clang)");
}

/// The kernels and the driver, built once per test binary.
fn emulator(dir: &Path) -> PathBuf {
    let src = dir.join("gather_emulated.cc");
    std::fs::write(&src, format!("{PRELUDE}\n{KERNEL_SOURCE}\n{DRIVER}")).unwrap();
    let bin = dir.join("gather_emulated");
    let out = Command::new(cxx())
        .args([
            "-std=c++17",
            "-O1",
            "-pthread",
            "-fno-strict-aliasing",
            "-w",
            "-o",
        ])
        .arg(&bin)
        .arg(&src)
        .output()
        .expect("running the C++ compiler");
    assert!(
        out.status.success(),
        "the kernel source does not compile as host C++:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    bin
}

fn scratch(name: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("kp-gather-emulated-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// SplitMix64.
fn rng(seed: &mut u64) -> u64 {
    *seed = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *seed;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

struct Case {
    name: &'static str,
    shape: GatherShape,
    /// Bytes between slot starts (need not be aligned).
    stride: u64,
    /// Slots in the pool.
    slots: u64,
    /// The batch: slot of each request, in batch order.
    batch: &'static [u64],
    /// The pool's address mod 64.
    shift: usize,
}

/// Runs `case` through the emulated kernel and the CPU reference.
fn run(bin: &Path, case: &Case) {
    let dir = scratch(case.name);
    let req = case.shape.request_bytes();
    assert!(case.stride >= req, "{}: slots overlap", case.name);
    let mut seed = req ^ case.stride;
    let pool: Vec<u8> = (0..case.stride * case.slots)
        .map(|_| rng(&mut seed) as u8)
        .collect();
    // For f32 requests, values that are not NaN (NaN payloads would pass a
    // bit comparison anyway, but the test is clearer without them).
    let pool: Vec<u8> = match case.shape {
        GatherShape::F32 { .. } => pool.iter().map(|&b| b & 0x3f).collect(),
        GatherShape::RgbU8Hwc { .. } => pool,
    };
    let descs: Vec<GatherDesc> =
        gather::descriptors(case.batch.iter().map(|s| s * case.stride)).collect();
    let lut = gather::rgb_lut([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]);
    let elems = case.batch.len() * case.shape.request_elems() as usize;
    let mut want = vec![0.0f32; elems];
    gather::gather_cpu(&pool, &descs, case.shape, &lut, &mut want).unwrap();

    // Every element the kernel must write starts as a NaN it would never
    // write (the reference writes none: values are finite).
    let sentinel = f32::from_bits(0x7fc0_dead);
    let out = vec![sentinel; elems];
    let bytes = |v: &[f32]| v.iter().flat_map(|f| f.to_le_bytes()).collect::<Vec<u8>>();
    std::fs::write(dir.join("pool.bin"), &pool).unwrap();
    let desc_bytes: Vec<u8> = descs
        .iter()
        .flat_map(|d| {
            let mut b = d.src_offset.to_le_bytes().to_vec();
            b.extend(d.dst_index.to_le_bytes());
            b.extend(d.reserved.to_le_bytes());
            b
        })
        .collect();
    std::fs::write(dir.join("descs.bin"), desc_bytes).unwrap();
    std::fs::write(dir.join("lut.bin"), bytes(&lut)).unwrap();
    std::fs::write(dir.join("out.bin"), bytes(&out)).unwrap();

    let kind = match case.shape {
        GatherShape::RgbU8Hwc { .. } => "rgb",
        GatherShape::F32 { .. } => "f32",
    };
    let per = case.shape.kernel_items();
    let (grid_x, grid_y) = gather::grid(case.shape, case.batch.len()).unwrap();
    assert_eq!(grid_y as usize, case.batch.len());
    let status = Command::new(bin)
        .arg(&dir)
        .args([
            kind.to_string(),
            case.batch.len().to_string(),
            per.to_string(),
            grid_x.to_string(),
            case.shift.to_string(),
            BLOCK.to_string(),
        ])
        .status()
        .unwrap();
    assert!(
        status.success(),
        "{}: the emulated kernel failed",
        case.name
    );
    let got: Vec<u32> = std::fs::read(dir.join("out.bin"))
        .unwrap()
        .chunks_exact(4)
        .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    assert_eq!(got.len(), elems);
    let unwritten = got.iter().filter(|&&b| b == sentinel.to_bits()).count();
    assert_eq!(
        unwritten, 0,
        "{}: {unwritten} elements never written",
        case.name
    );
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(
            *g,
            w.to_bits(),
            "{}: element {i} differs from the CPU reference",
            case.name
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_gather_kernels_agree_with_the_cpu_reference_on_every_path() {
    let dir = scratch("build");
    let bin = emulator(&dir);
    let rgb = |height, width| GatherShape::RgbU8Hwc { height, width };
    let cases = [
        // 37 × 29 = 1,073 pixels: a full chunk and a tail of 49. Slots of
        // an odd stride: every request but the first unaligned (byte loads).
        Case {
            name: "rgb-unaligned",
            shape: rgb(37, 29),
            stride: 3 * 1073 + 13,
            slots: 7,
            batch: &[5, 1, 3],
            shift: 0,
        },
        // The same image in 16-byte aligned slots: 16-byte loads, and a
        // tail of 147 bytes (9 loads of 16, then 3 bytes).
        Case {
            name: "rgb-aligned-tail",
            shape: rgb(37, 29),
            stride: (3 * 1073u64).next_multiple_of(16),
            slots: 6,
            batch: &[4, 0, 5, 2],
            shift: 0,
        },
        // Whole chunks only (64 × 48 = 3 × 1,024), aligned.
        Case {
            name: "rgb-whole-chunks",
            shape: rgb(64, 48),
            stride: 3 * 3072,
            slots: 3,
            batch: &[2, 0],
            shift: 0,
        },
        // A pool 4 bytes past alignment: aligned slots become unaligned.
        Case {
            name: "rgb-pool-shifted",
            shape: rgb(40, 40),
            stride: 4800,
            slots: 3,
            batch: &[1, 2, 0],
            shift: 4,
        },
        // f32: 1,003 values (a tail of 3 past the 16-byte loads), aligned
        // sources; destinations of the second request on are not 16-byte
        // aligned (1,003 × 4 bytes apart): 4-byte loads there.
        Case {
            name: "f32-mixed",
            shape: GatherShape::F32 { elems: 1003 },
            stride: (4 * 1003u64).next_multiple_of(16),
            slots: 5,
            batch: &[3, 0, 4],
            shift: 0,
        },
        // f32 over two chunks, aligned everywhere: 16-byte loads only.
        Case {
            name: "f32-aligned",
            shape: GatherShape::F32 { elems: 2048 },
            stride: 8192,
            slots: 4,
            batch: &[3, 1],
            shift: 0,
        },
        // f32 from a pool 4 bytes past alignment: 4-byte loads.
        Case {
            name: "f32-four-aligned",
            shape: GatherShape::F32 { elems: 1500 },
            stride: 6000,
            slots: 3,
            batch: &[2, 0, 1],
            shift: 4,
        },
        // f32 from a pool 1 byte past alignment: each value from its four
        // bytes.
        Case {
            name: "f32-unaligned",
            shape: GatherShape::F32 { elems: 777 },
            stride: 4 * 777 + 1,
            slots: 3,
            batch: &[1, 2],
            shift: 1,
        },
    ];
    for case in &cases {
        run(&bin, case);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_grid_covers_every_chunk_and_refuses_what_cuda_cannot_launch() {
    let chunk = u64::from(gather::CHUNK);
    assert_eq!(
        gather::grid(
            GatherShape::RgbU8Hwc {
                height: 224,
                width: 224
            },
            32
        ),
        Ok(((224 * 224u64).div_ceil(chunk) as u32, 32))
    );
    assert_eq!(gather::grid(GatherShape::F32 { elems: 1 }, 1), Ok((1, 1)));
    assert!(gather::grid(GatherShape::F32 { elems: 1 }, 65_536).is_err());
}
