//! Cost of converting one fragment's payload into its pool slot: the one
//! copy every request byte gets on an inference function's data path.
//!
//! - `rgb_u8/1KiB`: a 1024-byte fragment of a 224×224×3 RGB image, at an
//!   offset that is not a pixel boundary (partial pixels at both ends),
//!   into an ImageNet-normalised `f32` NCHW slot.
//! - `f32/1KiB`: a 1024-byte fragment of a 3×224×224 `f32` tensor at an
//!   offset that splits a value at both ends.
//! - `*/request`: a whole request in 1 KiB fragments, in order.
//! - `rgb_u8_pixelwise/1KiB`: the same conversion one pixel (three byte
//!   loads) at a time, the simple loop the layout's 8-pixel blocks replace.
//! - `memcpy/1KiB`: `copy_from_slice` of 1 KiB, the floor.
//!
//! Throughput is in request (wire) bytes; the RGB path writes 4× as many.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use libml::pool::{InputLayout, InputPool, IMAGENET_MEAN, IMAGENET_STD};

const FRAG: usize = 1024;

fn bytes(n: usize) -> Vec<u8> {
    let mut x = 0x1234_5678u32;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let rgb = InputLayout::rgb_u8_hwc(224, 224, IMAGENET_MEAN, IMAGENET_STD).unwrap();
    let f32s = InputLayout::f32_nchw(3, 224, 224).unwrap();

    let mut g = c.benchmark_group("fragment");
    g.throughput(Throughput::Bytes(FRAG as u64));
    for (name, layout, offset) in [
        ("rgb_u8", &rgb, 100 * FRAG + 1),
        ("f32", &f32s, 100 * FRAG + 2),
    ] {
        let payload = bytes(layout.request_bytes());
        let mut pool = InputPool::on_heap(2, layout.slot_elems());
        g.bench_function(format!("{name}/1KiB"), |b| {
            b.iter(|| {
                pool.write_fragment(
                    layout,
                    1,
                    offset,
                    black_box(&payload[offset..offset + FRAG]),
                )
            })
        });
    }
    // The simple loop, whole pixels only (the partial ones are noise here).
    let mut lut = [[0.0f32; 256]; 3];
    for (c, t) in lut.iter_mut().enumerate() {
        for (b, v) in t.iter_mut().enumerate() {
            *v = (b as f32 / 255.0 - IMAGENET_MEAN[c]) / IMAGENET_STD[c];
        }
    }
    let payload = bytes(FRAG + 2);
    let mut planes = vec![0.0f32; 3 * 342];
    g.bench_function("rgb_u8_pixelwise/1KiB", |b| {
        b.iter(|| {
            let (pixels, _) = black_box(&payload[..FRAG + 2]).as_chunks::<3>();
            let (r, gb) = planes.split_at_mut(342);
            let (g, b) = gb.split_at_mut(342);
            for (((px, r), g), b) in pixels.iter().zip(r).zip(g).zip(b) {
                *r = lut[0][usize::from(px[0])];
                *g = lut[1][usize::from(px[1])];
                *b = lut[2][usize::from(px[2])];
            }
        })
    });
    let src = bytes(FRAG);
    let mut dst = vec![0u8; FRAG];
    g.bench_function("memcpy/1KiB", |b| {
        b.iter(|| dst.copy_from_slice(black_box(&src)))
    });
    g.finish();

    let mut g = c.benchmark_group("request");
    for (name, layout) in [("rgb_u8", &rgb), ("f32", &f32s)] {
        let payload = bytes(layout.request_bytes());
        let mut pool = InputPool::on_heap(2, layout.slot_elems());
        g.throughput(Throughput::Bytes(payload.len() as u64));
        g.bench_function(format!("{name}/request"), |b| {
            b.iter(|| {
                for (i, frag) in black_box(&payload).chunks(FRAG).enumerate() {
                    pool.write_fragment(layout, 0, i * FRAG, frag);
                }
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
