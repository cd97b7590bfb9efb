//! The conversion against an obviously-correct slow reference (whole image,
//! element by element, the formula written out), under random
//! fragmentation in random order; the pool's slot arithmetic on the heap
//! (`tests/pool_hugepages.rs` runs the same on a memzone).

use super::*;
use proptest::prelude::*;
use proptest::sample::Index;

/// SplitMix64, to shuffle fragments from a seed.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = (self.next_u64() % (i as u64 + 1)) as usize;
            v.swap(i, j);
        }
    }
}

/// `0..len` cut at `cuts` (any positions; empty pieces dropped), shuffled.
fn fragments(len: usize, cuts: &[Index], seed: u64) -> Vec<std::ops::Range<usize>> {
    let mut at: Vec<usize> = cuts.iter().map(|i| i.index(len + 1)).collect();
    at.extend([0, len]);
    at.sort_unstable();
    at.dedup();
    let mut frags: Vec<_> = at.windows(2).map(|w| w[0]..w[1]).collect();
    Rng(seed).shuffle(&mut frags);
    frags
}

/// The slow reference: `x[c, y, x] = (u8[y, x, c] / 255 - mean[c]) / std[c]`
/// in `f32`, element by element over the whole HWC image.
fn reference_rgb(img: &[u8], h: usize, w: usize, mean: [f32; 3], std: [f32; 3]) -> Vec<f32> {
    let mut out = vec![f32::NAN; 3 * h * w];
    for y in 0..h {
        for x in 0..w {
            for c in 0..3 {
                let byte = img[(y * w + x) * 3 + c];
                out[c * h * w + y * w + x] = (byte as f32 / 255.0f32 - mean[c]) / std[c];
            }
        }
    }
    out
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// A value no conversion produces (a NaN with a payload).
const SENTINEL: f32 = f32::from_bits(0x7fc0_beef);

fn norm() -> impl Strategy<Value = ([f32; 3], [f32; 3])> {
    prop_oneof![
        Just((IMAGENET_MEAN, IMAGENET_STD)),
        (
            prop::array::uniform3(-2.0f32..2.0),
            prop::array::uniform3(0.01f32..4.0)
        ),
    ]
}

fn rgb_case() -> impl Strategy<Value = (usize, usize, Vec<u8>)> {
    (1usize..12, 1usize..12).prop_flat_map(|(h, w)| {
        (
            Just(h),
            Just(w),
            prop::collection::vec(any::<u8>(), h * w * 3),
        )
    })
}

fn f32_case() -> impl Strategy<Value = (usize, usize, usize, Vec<u32>)> {
    (1usize..5, 1usize..8, 1usize..8).prop_flat_map(|(c, h, w)| {
        (
            Just(c),
            Just(h),
            Just(w),
            prop::collection::vec(any::<u32>(), c * h * w),
        )
    })
}

proptest! {
    #[test]
    fn rgb_fragments_in_any_order_equal_the_reference(
        (h, w, img) in rgb_case(),
        (mean, std) in norm(),
        cuts in prop::collection::vec(any::<Index>(), 0..40),
        seed in any::<u64>(),
        applied in any::<Index>(),
    ) {
        let layout = InputLayout::rgb_u8_hwc(h, w, mean, std).unwrap();
        prop_assert_eq!(layout.request_bytes(), img.len());
        prop_assert_eq!(layout.slot_elems(), img.len());
        let want = reference_rgb(&img, h, w, mean, std);
        let frags = fragments(img.len(), &cuts, seed);

        // A prefix of the fragments: exactly their bytes' elements are set.
        let k = applied.index(frags.len() + 1);
        let mut slot = vec![SENTINEL; layout.slot_elems()];
        let mut covered = vec![false; img.len()];
        for r in &frags[..k] {
            layout.write_fragment(&img[r.clone()], r.start, &mut slot);
            covered[r.clone()].fill(true);
        }
        for (i, &cov) in covered.iter().enumerate() {
            let e = (i % 3) * h * w + i / 3;
            let expect = if cov { want[e] } else { SENTINEL };
            prop_assert_eq!(slot[e].to_bits(), expect.to_bits(), "byte {}", i);
        }

        // All of them: the reference, bit for bit.
        for r in &frags[k..] {
            layout.write_fragment(&img[r.clone()], r.start, &mut slot);
        }
        prop_assert_eq!(bits(&slot), bits(&want));
    }

    #[test]
    fn f32_fragments_in_any_order_equal_the_input_bits(
        (c, h, w, values) in f32_case(),
        cuts in prop::collection::vec(any::<Index>(), 0..40),
        seed in any::<u64>(),
        applied in any::<Index>(),
    ) {
        let layout = InputLayout::f32_nchw(c, h, w).unwrap();
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        prop_assert_eq!(layout.request_bytes(), bytes.len());
        prop_assert_eq!(layout.slot_elems(), values.len());
        let frags = fragments(bytes.len(), &cuts, seed);

        // A prefix: each element has exactly the covered bytes replaced
        // (floats split across fragments keep their other bytes).
        let k = applied.index(frags.len() + 1);
        let mut slot = vec![SENTINEL; layout.slot_elems()];
        let mut expect: Vec<u8> = std::iter::repeat_n(SENTINEL.to_bits().to_le_bytes(), values.len())
            .flatten()
            .collect();
        for r in &frags[..k] {
            layout.write_fragment(&bytes[r.clone()], r.start, &mut slot);
            expect[r.clone()].copy_from_slice(&bytes[r.clone()]);
        }
        let got: Vec<u8> = slot.iter().flat_map(|v| v.to_bits().to_le_bytes()).collect();
        prop_assert_eq!(got, expect);

        for r in &frags[k..] {
            layout.write_fragment(&bytes[r.clone()], r.start, &mut slot);
        }
        prop_assert_eq!(bits(&slot), values);
    }
}

#[test]
fn imagenet_224_in_1k_fragments_backwards() {
    let layout = InputLayout::rgb_u8_hwc(224, 224, IMAGENET_MEAN, IMAGENET_STD).unwrap();
    assert_eq!(layout.request_bytes(), 150_528);
    assert_eq!(layout.slot_elems(), 150_528);
    assert_eq!(layout.chw(), [3, 224, 224]);
    let mut rng = Rng(7);
    let img: Vec<u8> = (0..150_528).map(|_| rng.next_u64() as u8).collect();
    let mut slot = vec![SENTINEL; layout.slot_elems()];
    let chunks: Vec<_> = img.chunks(1024).enumerate().collect();
    for (i, c) in chunks.into_iter().rev() {
        layout.write_fragment(c, i * 1024, &mut slot);
    }
    let want = reference_rgb(&img, 224, 224, IMAGENET_MEAN, IMAGENET_STD);
    assert_eq!(bits(&slot), bits(&want));
    // Spot checks of the formula: R of byte 0 and of byte 255.
    let lo = (0.0f32 - 0.485) / 0.229;
    let hi = (1.0f32 - 0.485) / 0.229;
    let mut one = vec![0.0; 3];
    let tiny = InputLayout::rgb_u8_hwc(1, 1, IMAGENET_MEAN, IMAGENET_STD).unwrap();
    tiny.write_fragment(&[0, 255, 0], 0, &mut one);
    assert_eq!(one[0], lo);
    assert_eq!(one[1], (1.0f32 - 0.456) / 0.224);
    tiny.write_fragment(&[255], 0, &mut one);
    assert_eq!(one[0], hi);
}

#[test]
fn layouts_are_checked() {
    assert!(matches!(
        InputLayout::rgb_u8_hwc(0, 4, IMAGENET_MEAN, IMAGENET_STD),
        Err(PoolError::EmptyLayout)
    ));
    assert!(matches!(
        InputLayout::f32_nchw(3, 0, 4),
        Err(PoolError::EmptyLayout)
    ));
    assert!(matches!(
        InputLayout::f32_nchw(3, 1 << 15, 1 << 15),
        Err(PoolError::LayoutTooLarge)
    ));
    assert!(matches!(
        InputLayout::rgb_u8_hwc(usize::MAX, 2, IMAGENET_MEAN, IMAGENET_STD),
        Err(PoolError::LayoutTooLarge)
    ));
    assert!(matches!(
        InputLayout::rgb_u8_hwc(2, 2, IMAGENET_MEAN, [0.2, 0.0, 0.2]),
        Err(PoolError::BadNormalisation { channel: 1 })
    ));
    assert!(matches!(
        InputLayout::rgb_u8_hwc(2, 2, [0.0, 0.0, f32::NAN], IMAGENET_STD),
        Err(PoolError::BadNormalisation { channel: 2 })
    ));
    assert!(matches!(
        InputLayout::rgb_u8_hwc(2, 2, IMAGENET_MEAN, [1e-45, 1.0, 1.0]),
        Err(PoolError::BadNormalisation { channel: 0 })
    ));
    let l = InputLayout::f32_nchw(3, 2, 5).unwrap();
    assert_eq!(
        (l.request_bytes(), l.slot_elems(), l.chw()),
        (120, 30, [3, 2, 5])
    );
    let a = InputLayout::rgb_u8_hwc(4, 4, IMAGENET_MEAN, IMAGENET_STD).unwrap();
    assert_eq!(a, a.clone());
    assert!(format!("{a:?}").contains("RgbU8Hwc"));
}

#[test]
#[should_panic(expected = "past the request")]
fn a_fragment_past_the_request_panics() {
    let l = InputLayout::f32_nchw(1, 1, 2).unwrap();
    l.write_fragment(&[0; 4], 5, &mut [0.0; 2]);
}

#[test]
#[should_panic(expected = "wrong size")]
fn a_slot_of_another_layout_panics() {
    let l = InputLayout::f32_nchw(1, 1, 2).unwrap();
    l.write_fragment(&[0; 4], 0, &mut [0.0; 3]);
}

/// Slot `s` holds `s * 1000 + j` at element `j`.
fn fill_pool(pool: &mut InputPool) {
    for s in 0..pool.capacity() {
        for (j, v) in pool.slot_mut(s).iter_mut().enumerate() {
            *v = (s * 1000 + j) as f32;
        }
    }
}

#[test]
fn slots_batches_and_gathers_on_the_heap() {
    let mut pool = InputPool::on_heap(5, 7);
    assert_eq!(
        (pool.capacity(), pool.slot_elems(), pool.bytes()),
        (5, 7, 140)
    );
    assert_eq!(pool.reserved_bytes(), 140);
    assert_eq!((pool.iova(), pool.memzone_name()), (None, None));
    assert!(pool.batch(0, 5).unwrap().iter().all(|&v| v == 0.0));
    fill_pool(&mut pool);
    // Disjoint: each slot kept its own values.
    for s in 0..5 {
        let want: Vec<f32> = (0..7).map(|j| (s * 1000 + j) as f32).collect();
        assert_eq!(pool.slot(s), &want[..]);
    }
    // A contiguous run is the slots' concatenation, in place.
    let run = pool.batch(1, 3).unwrap();
    assert_eq!(run.as_ptr(), pool.slot(1).as_ptr());
    assert_eq!(run, [pool.slot(1), pool.slot(2), pool.slot(3)].concat());
    assert_eq!(pool.batch(0, 5).unwrap().len(), 35);
    assert_eq!(pool.batch(4, 0), Some(&[][..]));
    // Wrap-around or past the end: no view; gather instead.
    assert_eq!(pool.batch(3, 3), None);
    assert_eq!(pool.batch(5, 0), None);
    assert_eq!(pool.batch(usize::MAX, 2), None);
    let mut dst = vec![0.0; 3 * 7];
    pool.gather(&[3, 4, 0], &mut dst);
    assert_eq!(dst, [pool.slot(3), pool.slot(4), pool.slot(0)].concat());
    pool.gather(&[], &mut []);
    assert!(format!("{pool:?}").contains("capacity: 5"));
}

#[test]
fn write_fragment_touches_only_its_slot() {
    let layout = InputLayout::rgb_u8_hwc(2, 3, IMAGENET_MEAN, IMAGENET_STD).unwrap();
    let mut pool = InputPool::on_heap(3, layout.slot_elems());
    fill_pool(&mut pool);
    let img: Vec<u8> = (0..18).map(|i| i * 13).collect();
    pool.write_fragment(&layout, 1, 5, &img[5..]);
    pool.write_fragment(&layout, 1, 0, &img[..5]);
    assert_eq!(
        bits(pool.slot(1)),
        bits(&reference_rgb(&img, 2, 3, IMAGENET_MEAN, IMAGENET_STD))
    );
    for s in [0, 2] {
        let want: Vec<f32> = (0..18).map(|j| (s * 1000 + j) as f32).collect();
        assert_eq!(pool.slot(s), &want[..]);
    }
}

#[test]
#[should_panic(expected = "out of range")]
fn a_slot_past_the_end_panics() {
    InputPool::on_heap(2, 4).slot(2);
}

#[test]
#[should_panic(expected = "dst must hold")]
fn gather_into_a_short_buffer_panics() {
    InputPool::on_heap(2, 4).gather(&[0, 1], &mut [0.0; 7]);
}

#[test]
#[should_panic(expected = "no slots")]
fn an_empty_heap_pool_panics() {
    InputPool::on_heap(0, 4);
}

#[test]
fn pool_sizes_are_checked() {
    assert!(matches!(
        InputPool::in_memzone("kp_never", 0, 4, SocketId::ANY),
        Err(PoolError::EmptyPool)
    ));
    assert!(matches!(
        InputPool::in_memzone("kp_never", usize::MAX / 2, 4, SocketId::ANY),
        Err(PoolError::TooLarge)
    ));
    // Without an EAL: DPDK's error, not a crash.
    assert!(matches!(
        InputPool::in_memzone("kp_never", 2, 4, SocketId::ANY),
        Err(PoolError::Dpdk(DpdkError::EalNotRunning { .. }))
    ));
}

/// Split, write and join the way the IF's two threads do: slot buffers move
/// between threads, adjacent ones join into one tensor without a copy,
/// others do not, and what was written is what is read.
#[test]
fn split_slots_join_adjacent_buffers_into_one_tensor() {
    let mut pool = InputPool::on_heap(6, 4);
    // An address, compared only: the joined tensor is slots 2..5 in place.
    let base = pool.as_ptr() as usize;
    let (span, bufs) = pool.split_slots();
    let mut slots: Vec<Option<SlotBuf<'_>>> = bufs.into_iter().map(Some).collect();
    for (i, s) in slots.iter_mut().enumerate() {
        let b = s.as_mut().unwrap();
        assert_eq!((b.index(), b.len()), (i, 4));
        b.fill(i as f32);
    }
    // Slots 2, 3, 4 go to "inference" on another thread while the
    // "fragment thread" keeps writing slots 0, 1 and 5.
    let batch: Vec<SlotBuf<'_>> = (2..5).map(|i| slots[i].take().unwrap()).collect();
    let read = std::thread::scope(|s| {
        let reader = s.spawn(|| {
            let joined = span.join(&batch).expect("adjacent slots join");
            assert_eq!(joined.as_ptr() as usize, base + 2 * 4 * size_of::<f32>());
            joined.to_vec()
        });
        for s in [0, 1, 5] {
            slots[s].as_mut().unwrap().fill(-1.0);
        }
        reader.join().unwrap()
    });
    let want: Vec<f32> = [2.0f32, 3.0, 4.0].iter().flat_map(|&v| [v; 4]).collect();
    assert_eq!(read, want);
    // Not in order, with a gap, empty: no single tensor.
    assert!(span.join([&batch[1], &batch[0]]).is_none());
    assert!(span.join([&batch[0], &batch[2]]).is_none());
    assert!(span.join(std::iter::empty()).is_none());
    assert_eq!(span.join([&batch[2]]).unwrap(), &[4.0; 4]);
    // Buffers come back and are written again.
    for b in batch {
        let i = b.index();
        slots[i] = Some(b);
    }
    for s in slots.iter_mut().flatten() {
        s.fill(7.0);
    }
    drop(slots);
    assert!((0..6).all(|s| pool.slot(s) == [7.0; 4]));
}

/// A buffer of another pool never joins this pool's span, even with the
/// right index.
#[test]
fn a_buffer_of_another_pool_does_not_join() {
    let mut a = InputPool::on_heap(3, 2);
    let mut b = InputPool::on_heap(3, 2);
    let (span_a, bufs_a) = a.split_slots();
    let (_, bufs_b) = b.split_slots();
    assert!(span_a.join([&bufs_a[0], &bufs_a[1]]).is_some());
    assert!(span_a.join([&bufs_b[0], &bufs_b[1]]).is_none());
    assert!(span_a.join([&bufs_a[0], &bufs_b[1]]).is_none());
}

#[test]
fn the_location_an_engine_registers_is_the_pools_memory_slot_by_slot() {
    let layout = InputLayout::f32_nchw(3, 2, 2).unwrap();
    let mut pool = InputPool::on_heap(5, layout.slot_elems());
    let loc = pool.location(&layout).unwrap();
    assert_eq!(loc.addr, pool.as_ptr() as usize);
    assert_eq!((loc.slots, loc.slot_bytes), (5, 48));
    assert_eq!(loc.content, SlotContent::F32 { elems: 12 });
    assert_eq!(loc.bytes(), pool.bytes());
    assert!(loc.reserved_bytes >= loc.bytes());
    pool.slot_mut(3)[0] = 7.5;
    // Slot 3's first value lies at the offset the engine is told.
    let at = loc.slot_offset(3).unwrap() as usize;
    assert_eq!(pool.slot(3).as_ptr() as usize, loc.addr + at);
    assert_eq!(loc.slot_offset(4), Some(4 * 48));
    assert_eq!(loc.slot_offset(5), None);
    // Another layout's slots do not fit this pool.
    let other = InputLayout::f32_nchw(3, 2, 3).unwrap();
    assert_eq!(pool.location(&other), None);
}

#[test]
fn a_raw_image_layout_keeps_the_bytes_as_they_came_in_any_fragment_order() {
    // 5×3 pixels: 45 bytes, not a whole number of words.
    let (h, w) = (5, 3);
    let cooked = InputLayout::rgb_u8_hwc(h, w, IMAGENET_MEAN, IMAGENET_STD).unwrap();
    let raw = cooked.clone().raw_images();
    assert_eq!(raw.request_bytes(), 45);
    assert_eq!(raw.input_elems(), 45);
    assert_eq!(raw.slot_elems(), 12);
    assert_eq!(raw.chw(), cooked.chw());
    assert_eq!(
        raw.slot_content(),
        SlotContent::RgbU8Hwc {
            h,
            w,
            mean: IMAGENET_MEAN,
            std: IMAGENET_STD
        }
    );
    assert_eq!(cooked.slot_content(), SlotContent::F32 { elems: 45 });
    let image: Vec<u8> = (0..45u8).map(|i| i.wrapping_mul(37) ^ 0x5a).collect();
    let mut rng = Rng(7);
    for _ in 0..50 {
        // Random cuts, written in a random order.
        let mut cuts: Vec<usize> = (0..4).map(|_| rng.next_u64() as usize % 46).collect();
        cuts.extend([0, 45]);
        cuts.sort_unstable();
        let mut pieces: Vec<(usize, usize)> = cuts.windows(2).map(|c| (c[0], c[1])).collect();
        for i in (1..pieces.len()).rev() {
            pieces.swap(i, rng.next_u64() as usize % (i + 1));
        }
        let mut slot = vec![f32::from_bits(0xdead_beef); raw.slot_elems()];
        for (a, b) in pieces {
            raw.write_fragment(&image[a..b], a, &mut slot);
        }
        let bytes: Vec<u8> = slot.iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(&bytes[..45], &image[..]);
    }
    // f32 layouts stay as they are.
    let f = InputLayout::f32_nchw(1, 2, 2).unwrap();
    assert_eq!(f.clone().raw_images(), f);
}

#[test]
fn a_raw_slot_normalised_on_the_inference_side_is_the_cooked_slot_bit_for_bit() {
    // 224×224 (three 3,072-byte steps and more, a tail shorter than one)
    // and 5×3 (45 bytes: one partial step, not whole words).
    for (h, w) in [(224, 224), (5, 3), (1, 1)] {
        let cooked = InputLayout::rgb_u8_hwc(h, w, IMAGENET_MEAN, IMAGENET_STD).unwrap();
        let raw = cooked.clone().raw_images();
        assert!(raw.is_raw() && !cooked.is_raw());
        let n = raw.request_bytes();
        let mut rng = Rng(h as u64 * 131 + w as u64);
        let image: Vec<u8> = (0..n).map(|_| rng.next_u64() as u8).collect();
        let mut want = vec![0f32; cooked.slot_elems()];
        cooked.write_fragment(&image, 0, &mut want);
        let mut slot = vec![f32::from_bits(0xdead_beef); raw.slot_elems()];
        raw.write_fragment(&image, 0, &mut slot);
        let mut got = vec![f32::NAN; raw.input_elems()];
        raw.normalise_raw(&slot, &mut got);
        assert!(
            got.iter()
                .zip(&want)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{h}x{w}"
        );
    }
}

#[test]
#[should_panic(expected = "not raw images")]
fn only_a_raw_layout_is_normalised() {
    let cooked = InputLayout::rgb_u8_hwc(2, 2, IMAGENET_MEAN, IMAGENET_STD).unwrap();
    cooked.normalise_raw(&[0.0; 12], &mut [0.0; 12]);
}
