//! The input pool in a real DPDK memzone of hugepages, against the same
//! pool on the heap: the same operations give the same bits.
//!
//! `rte_eal_init` runs once per process, so the memzone part is one
//! `#[test]` that starts the EAL as a primary on its own `--file-prefix`
//! and cleans up down to the last file. It needs root and free 2 MiB
//! hugepages (mounted at `/dev/hugepages`); as a non-root user it fails at
//! once and says so (a test that cannot run is not a pass).

use std::path::{Path, PathBuf};

use dpdk::{live_handles, DpdkError, Eal, Memzone, ProcessType};
use libml::pool::{InputLayout, InputPool, PoolError, IMAGENET_MEAN, IMAGENET_STD};

const CAPACITY: usize = 8;

/// The layout the scenario converts with: a small image, so that the slots
/// are not page multiples and a slot boundary falls inside a page.
fn layout() -> InputLayout {
    InputLayout::rgb_u8_hwc(17, 11, IMAGENET_MEAN, IMAGENET_STD).unwrap()
}

fn image(seed: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i.wrapping_mul(31) ^ seed.wrapping_mul(97)) as u8)
        .collect()
}

/// The same work on any pool: every slot gets its own image in odd-sized
/// fragments in reverse order; then contiguous runs, a wrap-around and a
/// gather are checked. Returns the whole pool and the gathered batch.
fn scenario(pool: &mut InputPool) -> (Vec<u32>, Vec<u32>) {
    let layout = layout();
    let n = layout.request_bytes();
    assert_eq!(pool.capacity(), CAPACITY);
    assert_eq!(pool.slot_elems(), layout.slot_elems());
    assert_eq!(pool.bytes(), CAPACITY * n * 4);
    assert!(pool.batch(0, CAPACITY).unwrap().iter().all(|&v| v == 0.0));

    for s in 0..CAPACITY {
        let img = image(s, n);
        let cuts: Vec<usize> = (0..n).step_by(100 + s).chain([n]).collect();
        for w in cuts.windows(2).rev() {
            pool.write_fragment(&layout, s, w[0], &img[w[0]..w[1]]);
        }
    }
    // Disjoint: each slot holds its own image, converted.
    for s in 0..CAPACITY {
        let mut want = vec![0.0; layout.slot_elems()];
        layout.write_fragment(&image(s, n), 0, &mut want);
        assert_eq!(bits(pool.slot(s)), bits(&want), "slot {s}");
    }
    // In-order runs are the slots' concatenation, in place.
    let run = pool.batch(2, 4).unwrap();
    assert_eq!(run.as_ptr(), pool.slot(2).as_ptr());
    let concat: Vec<f32> = (2..6).flat_map(|s| pool.slot(s).to_vec()).collect();
    assert_eq!(bits(run), bits(&concat));
    // A run that wraps has no view; gather it.
    assert!(pool.batch(6, 3).is_none());
    let mut gathered = vec![0.0; 3 * pool.slot_elems()];
    pool.gather(&[6, 7, 0], &mut gathered);
    let concat: Vec<f32> = [6, 7, 0]
        .iter()
        .flat_map(|&s| pool.slot(s).to_vec())
        .collect();
    assert_eq!(bits(&gathered), bits(&concat));
    (bits(pool.batch(0, CAPACITY).unwrap()), bits(&gathered))
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn heap_pool_scenario() {
    let mut pool = InputPool::on_heap(CAPACITY, layout().slot_elems());
    scenario(&mut pool);
}

/// Files of `prefix` in the hugepage mount and its runtime directory.
fn instance_files(prefix: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir("/dev/hugepages") {
        for e in rd.flatten() {
            if e.file_name().to_string_lossy().starts_with(prefix) {
                out.push(e.path());
            }
        }
    }
    let run = Path::new("/var/run/dpdk").join(prefix);
    if run.exists() {
        out.push(run);
    }
    out
}

#[test]
fn memzone_pool_behaves_like_the_heap_pool() {
    // SAFETY:
    // - `geteuid` has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        panic!(
            "memzone_pool_behaves_like_the_heap_pool needs root and free 2 MiB hugepages: \
             run it as root, after scripts/setup.sh has reserved them"
        );
    }
    let pid = std::process::id();
    let prefix = format!("kp-pool-test-{pid}");
    let args: Vec<String> = [
        "kp-pool-test",
        "--lcores",
        "0@0",
        "--no-pci",
        "--no-telemetry",
        "--file-prefix",
        &prefix,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let eal = Eal::init(&args).expect("EAL init as primary");
    assert_eq!(eal.process_type(), ProcessType::Primary);
    let socket = eal.socket_id();
    let name = format!("kp_pool_1_{pid}");
    {
        let slot_elems = layout().slot_elems();
        let mut zoned = InputPool::in_memzone(&name, CAPACITY, slot_elems, socket)
            .expect("a pool of 2 MiB pages");
        eprintln!("{zoned:?}, iova {:?}", zoned.iova());
        assert_eq!(zoned.memzone_name(), Some(name.as_str()));
        assert!(zoned.iova().is_some());
        assert_eq!(zoned.as_ptr() as usize % (2 << 20), 0, "page-aligned");
        assert_eq!(zoned.reserved_bytes() % (2 << 20), 0, "whole pages");
        assert!(zoned.reserved_bytes() >= zoned.bytes());
        {
            let zone = Memzone::lookup(&name).expect("the pool's zone");
            assert_eq!(zone.as_ptr().cast_const(), zoned.as_ptr().cast::<u8>());
            assert_eq!(zone.hugepage_size(), 2 << 20);
        }
        // The name is the pool's until it is dropped.
        let err = InputPool::in_memzone(&name, 1, 1, socket).unwrap_err();
        match &err {
            PoolError::Dpdk(e) => assert_eq!(e.errno(), Some(libc::EEXIST), "{err}"),
            other => panic!("second pool of the same name: {other:?}"),
        }

        let mut heap = InputPool::on_heap(CAPACITY, slot_elems);
        let from_zone = scenario(&mut zoned);
        let from_heap = scenario(&mut heap);
        assert!(from_zone == from_heap, "memzone and heap pools differ");

        // Big enough for the default: 64 slots of 224×224×3 images.
        let big = InputLayout::rgb_u8_hwc(224, 224, IMAGENET_MEAN, IMAGENET_STD).unwrap();
        let big = InputPool::in_memzone(&format!("kp_pool_2_{pid}"), 64, big.slot_elems(), socket)
            .expect("a 37 MiB pool");
        assert_eq!(big.bytes(), 64 * 150_528 * 4);
        assert_eq!(big.reserved_bytes(), 19 * (2 << 20));
        drop(big);
        drop(zoned);
        assert!(matches!(
            Memzone::lookup(&name),
            Err(DpdkError::NotFound { .. })
        ));
    }
    assert_eq!(live_handles(), 0);
    eal.cleanup().expect("EAL cleanup");
    let left = instance_files(&prefix);
    assert!(left.is_empty(), "left behind: {left:?}");
}
