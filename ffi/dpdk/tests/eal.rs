//! The wrapper against a real EAL: hugepages, mempools, rings, memzones,
//! ports (`net_ring` loops TX back to RX; `net_pcap` reads and writes pcap
//! files), a secondary process, and cleanup down to the last file.
//!
//! `rte_eal_init` runs once per process, so all of it is one `#[test]`. The
//! secondary is this same test binary started again with
//! `KP_DPDK_TEST_ROLE=secondary`.
//!
//! Needs root and free 2 MiB hugepages (mounted at `/dev/hugepages`); as a
//! non-root user it fails at once and says so (a test that cannot run is
//! not a pass). Run with
//! `cargo test -p dpdk --test eal -- --nocapture` to see what DPDK creates.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicPtr, Ordering};
use std::time::{Duration, Instant};

use dpdk::{
    live_handles, live_mbufs, DpdkError, Eal, Mbuf, MbufBurst, Mempool, Memzone, MemzoneFlags,
    Port, ProcessType, QueueId, Ring, RingFlags, RingRef, SocketId,
};

const ROLE_ENV: &str = "KP_DPDK_TEST_ROLE";
const PREFIX_ENV: &str = "KP_DPDK_TEST_PREFIX";

const POOL: &str = "kpt_pool";
const POOL_SIZE: u32 = 1023;
/// Primary -> secondary, single producer and consumer.
const TO_SECONDARY: &str = "kpt_to_sec";
/// Secondary -> primary, single producer and consumer.
const FROM_SECONDARY: &str = "kpt_from_sec";
const TO_SECONDARY_N: usize = 10;
const FROM_SECONDARY_N: usize = 5;
const Q0: QueueId = QueueId(0);

#[test]
fn eal_end_to_end() {
    // SAFETY:
    // - `geteuid` has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        panic!(
            "eal_end_to_end needs root and free 2 MiB hugepages (DPDK's EAL): \
             run it as root, after scripts/setup.sh has reserved them"
        );
    }
    match std::env::var(ROLE_ENV).as_deref() {
        Ok("secondary") => secondary(),
        _ => primary(),
    }
}

fn strings(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| s.to_string()).collect()
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
        out.push(run.clone());
        for e in std::fs::read_dir(&run).unwrap().flatten() {
            out.push(e.path());
        }
    }
    out.sort();
    out
}

/// A 64-byte Ethernet frame tagged `tag` (local-experimental ethertype).
fn frame(tag: u8) -> Vec<u8> {
    let mut f = vec![0xff; 6];
    f.extend_from_slice(&[0x02, 0, 0, 0, 0, tag]);
    f.extend_from_slice(&[0x88, 0xb5]);
    f.extend((0..50).map(|i| tag.wrapping_mul(7).wrapping_add(i)));
    f
}

fn write_pcap(path: &Path, frames: &[Vec<u8>]) {
    let mut b = Vec::new();
    b.extend_from_slice(&0xa1b2_c3d4u32.to_le_bytes());
    b.extend_from_slice(&2u16.to_le_bytes());
    b.extend_from_slice(&4u16.to_le_bytes());
    for v in [0u32, 0, 65535, 1] {
        b.extend_from_slice(&v.to_le_bytes());
    }
    for (i, f) in frames.iter().enumerate() {
        let len = f.len() as u32;
        for v in [1u32, i as u32, len, len] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.extend_from_slice(f);
    }
    std::fs::write(path, b).unwrap();
}

fn read_pcap(path: &Path) -> Vec<Vec<u8>> {
    let b = std::fs::read(path).unwrap();
    assert!(b.len() >= 24, "{} is not a pcap file", path.display());
    let mut out = Vec::new();
    let mut i = 24;
    while i + 16 <= b.len() {
        let incl = u32::from_le_bytes(b[i + 8..i + 12].try_into().unwrap()) as usize;
        out.push(b[i + 16..i + 16 + incl].to_vec());
        i += 16 + incl;
    }
    out
}

fn mbuf_with(pool: &Mempool, bytes: &[u8]) -> Mbuf {
    let mut m = pool.alloc().expect("pool not empty");
    m.append(bytes.len()).expect("room").copy_from_slice(bytes);
    m
}

fn primary() {
    let prefix = format!("kp-ffi-test-{}", std::process::id());
    let tmp = std::env::temp_dir().join(&prefix);
    std::fs::create_dir_all(&tmp).unwrap();
    let rx_pcap = tmp.join("rx.pcap");
    let tx_pcap = tmp.join("tx.pcap");
    let pcap_in: Vec<Vec<u8>> = (1..=3).map(frame).collect();
    write_pcap(&rx_pcap, &pcap_in);

    let pcap_vdev = format!(
        "net_pcap0,rx_pcap={},tx_pcap={}",
        rx_pcap.display(),
        tx_pcap.display()
    );
    let mut args = strings(&[
        "kp-dpdk-test",
        "--lcores",
        "0@0",
        "--no-pci",
        "--file-prefix",
        &prefix,
        "--vdev",
        "net_ring0",
        "--vdev",
        &pcap_vdev,
    ]);
    args.extend(strings(&["--", "ours"]));
    let mut eal = Eal::init(&args).expect("EAL init as primary");
    assert_eq!(eal.process_type(), ProcessType::Primary);
    // Everything after argv[0] up to and including `--`: "ours" is left.
    assert_eq!(&args[eal.args_consumed() + 1..], ["ours"]);
    assert_eq!(eal.file_prefix(), prefix);
    assert_eq!(eal.main_lcore().0, 0);
    assert_eq!(eal.lcore_id(), Some(eal.main_lcore()));
    assert_eq!(
        std::thread::spawn(dpdk_lcore_of_plain_thread)
            .join()
            .unwrap(),
        None
    );
    assert!(eal.tsc_hz() > 0);
    let t0 = Eal::tsc_cycles();
    Eal::pause();
    assert!(Eal::tsc_cycles() > t0);
    assert!(matches!(
        Eal::init(&args),
        Err(DpdkError::EalAlreadyInitialised)
    ));
    let socket = eal.socket_id();

    let files = instance_files(&prefix);
    eprintln!("DPDK files after init ({}):", files.len());
    for f in &files {
        eprintln!("  {}", f.display());
    }
    assert!(
        files.iter().any(|f| f.ends_with("config")),
        "runtime dir with config"
    );

    {
        let pool =
            Mempool::create_pktmbuf(POOL, POOL_SIZE, 32, 2048 + 128, socket).expect("mempool");
        check_mempool(&pool, socket);
        check_mbuf(&pool);
        check_rings(&pool, socket);
        check_memzone(socket);
        let ring_port = check_ring_port(&pool);
        check_pcap_port(&pool, &pcap_in, &tx_pcap);
        // As in production, the primary's port runs while a secondary
        // attaches.
        check_secondary(&pool, socket, &prefix);
        let stats = ring_port.stats();
        assert_eq!((stats.ipackets, stats.opackets), (8, 8));
        ring_port.stop().unwrap();
        ring_port.close().unwrap();
        assert_eq!(ring_port.stats(), Default::default());
        drop(ring_port);

        // Nothing leaked anywhere.
        assert_eq!(live_mbufs(), 0);
        assert_eq!(pool.avail_count(), pool.size());
        assert_eq!(pool.in_use_count(), 0);

        // Cleanup is refused while a handle lives.
        match eal.try_cleanup() {
            Err(DpdkError::EalInUse { handles, mbufs }) => {
                assert_eq!((handles, mbufs), (1, 0));
            }
            other => panic!("cleanup with a live mempool: {other:?}"),
        }
        let files = instance_files(&prefix);
        eprintln!("DPDK files before cleanup ({}):", files.len());
        for f in &files {
            eprintln!("  {}", f.display());
        }
    }
    assert_eq!(live_handles(), 0);
    eal.cleanup().expect("EAL cleanup");

    let left = instance_files(&prefix);
    assert!(left.is_empty(), "left behind: {left:?}");
    assert!(matches!(
        Mempool::lookup(POOL),
        Err(DpdkError::EalNotRunning { .. })
    ));
    assert!(matches!(
        Eal::init(&args),
        Err(DpdkError::EalAlreadyInitialised)
    ));
    assert_eq!(Port::count_avail(), 0);
    std::fs::remove_dir_all(&tmp).unwrap();
}

fn dpdk_lcore_of_plain_thread() -> Option<u32> {
    // A thread the EAL did not create has no lcore id.
    // SAFETY:
    // - reads a thread-local; no precondition.
    let id = unsafe { dpdk::sys::kp_rte_lcore_id() };
    (id != dpdk::sys::LCORE_ID_ANY).then_some(id)
}

fn check_mempool(pool: &Mempool, socket: SocketId) {
    assert_eq!(pool.name(), POOL);
    assert_eq!(pool.dpdk_name(), POOL);
    assert_eq!(pool.size(), POOL_SIZE);
    assert_eq!(pool.avail_count(), POOL_SIZE);
    assert_eq!(pool.in_use_count(), 0);
    let err = Mempool::create_pktmbuf(POOL, 63, 0, 2176, socket).unwrap_err();
    assert_eq!(err.errno(), Some(libc::EEXIST), "{err}");
    let err = Mempool::lookup("kpt_no_such_pool").unwrap_err();
    assert!(matches!(err, DpdkError::NotFound { .. }), "{err}");
    assert_eq!(err.errno(), Some(libc::ENOENT));
    assert!(matches!(
        Mempool::create_pktmbuf("a\0b", 63, 0, 2176, socket),
        Err(DpdkError::InvalidName { .. })
    ));
    let found = Mempool::lookup(POOL).expect("lookup");
    assert_eq!(found.as_ptr(), pool.as_ptr());
    drop(found); // not the creator's last handle: nothing freed
    assert_eq!(Mempool::lookup(POOL).unwrap().size(), POOL_SIZE);

    let mut burst = MbufBurst::<64>::new();
    assert!(pool.alloc_bulk(&mut burst, 48));
    assert_eq!(burst.len(), 48);
    assert!(
        !pool.alloc_bulk(&mut burst, 17),
        "more than the burst's spare room"
    );
    assert_eq!(burst.len(), 48);
    assert!(pool.alloc_bulk(&mut burst, 16));
    assert!(burst.is_full());
    assert_eq!(pool.in_use_count(), 64);
    assert_eq!(live_mbufs(), 64);
    // Partly drained, then dropped: the rest is freed.
    let mut drain = burst.drain();
    let first = drain.next().unwrap();
    drop(drain);
    assert!(burst.is_empty());
    assert_eq!(pool.in_use_count(), 1);
    drop(first);
    assert_eq!(pool.in_use_count(), 0);
    assert_eq!(live_mbufs(), 0);

    // A short-lived pool of our own is freed on drop: its name is free again.
    let tmp = Mempool::create_pktmbuf("kpt_tmp_pool", 63, 0, 2176, socket).unwrap();
    let m = tmp.alloc().unwrap();
    drop(m);
    drop(tmp);
    assert!(matches!(
        Mempool::lookup("kpt_tmp_pool"),
        Err(DpdkError::NotFound { .. })
    ));
    Mempool::create_pktmbuf("kpt_tmp_pool", 63, 0, 2176, socket).unwrap();
}

fn check_mbuf(pool: &Mempool) {
    let mut m = pool.alloc().unwrap();
    assert_eq!(m.len(), 0);
    assert!(m.is_empty());
    assert_eq!(m.headroom(), 128);
    assert_eq!(m.tailroom(), 2048);
    assert_eq!(m.refcnt(), 1);
    assert!(!m.is_segmented());
    assert_eq!(m.nb_segs(), 1);
    assert_eq!(m.header_lens(), (0, 0), "a fresh mbuf records none");
    assert!(m.set_header_lens(18, 20));
    assert_eq!(m.header_lens(), (18, 20));
    assert!(!m.set_header_lens(128, 20), "l2_len has 7 bits");
    assert!(!m.set_header_lens(14, 512), "l3_len has 9 bits");
    assert_eq!(m.header_lens(), (18, 20), "unchanged by a refusal");

    let payload: Vec<u8> = (0..100).collect();
    m.append(100).unwrap().copy_from_slice(&payload);
    assert_eq!(m.data(), &payload[..]);
    assert_eq!(m.pkt_len(), 100);
    m.prepend(14).unwrap().fill(0xee);
    assert_eq!(m.len(), 114);
    assert_eq!(m.headroom(), 114);
    assert_eq!(&m.data()[..14], &[0xee; 14]);
    assert!(m.adj(14));
    assert_eq!(m.data(), &payload[..]);
    assert!(m.trim(50));
    assert_eq!(m.data(), &payload[..50]);
    assert!(!m.trim(51));
    assert!(!m.adj(51));
    assert!(m.append(5000).is_none());
    assert!(m.prepend(129).is_none());
    assert_eq!(m.len(), 50);
    m.data_mut()[0] = 0xab;
    assert_eq!(m.data()[0], 0xab);
    assert!(m.set_len(2048));
    assert_eq!((m.len(), m.pkt_len(), m.tailroom()), (2048, 2048, 0));
    assert!(!m.set_len(2049));
    assert!(m.set_len(10));
    assert_eq!(m.tailroom(), 2038);
    assert!(format!("{m:?}").contains("10 bytes"));

    // Raw round trip.
    assert_eq!(live_mbufs(), 1);
    let raw = m.into_raw();
    assert_eq!(live_mbufs(), 0);
    assert_eq!(pool.in_use_count(), 1);
    // SAFETY:
    // - `raw` came from `into_raw` just above and nothing else owns it.
    let m = unsafe { Mbuf::from_raw(raw) };
    assert_eq!(m.len(), 10);
    drop(m);
    assert_eq!(pool.in_use_count(), 0);

    let mut b = MbufBurst::<2>::new();
    b.push(pool.alloc().unwrap());
    b.push(pool.alloc().unwrap());
    let extra = pool.alloc().unwrap();
    let back = b.try_push(extra).unwrap_err();
    drop(back);
    assert_eq!(b.pop().map(|m| m.len()), Some(0));
    b.clear();
    assert_eq!(pool.in_use_count(), 0);
    assert_eq!(live_mbufs(), 0);
}

fn tags<const N: usize>(b: &MbufBurst<N>) -> Vec<u8> {
    b.iter().map(|m| m.data()[0]).collect()
}

fn check_rings(pool: &Mempool, socket: SocketId) {
    let spsc = RingFlags {
        single_producer: true,
        single_consumer: true,
    };
    let small = Ring::create("kpt_small", 4, socket, spsc).expect("ring");
    assert_eq!(small.capacity(), 3);
    assert_eq!(small.flags(), spsc);
    assert_eq!(small.name(), "kpt_small");

    // Errors, with DPDK's errnos.
    let err = Ring::create("kpt_small", 4, socket, spsc).unwrap_err();
    assert_eq!(err.errno(), Some(libc::EEXIST), "{err}");
    assert!(err.to_string().contains("rte_ring_create"), "{err}");
    let err = Ring::create("kpt_odd", 6, socket, RingFlags::default()).unwrap_err();
    assert_eq!(err.errno(), Some(libc::EINVAL), "{err}");
    let err = Ring::lookup("kpt_missing").unwrap_err();
    assert!(matches!(err, DpdkError::NotFound { .. }), "{err}");
    assert_eq!(err.errno(), Some(libc::ENOENT));
    // A single-producer/consumer ring has one handle per process.
    assert!(matches!(
        Ring::lookup("kpt_small"),
        Err(DpdkError::Busy { .. })
    ));

    // Partial enqueue: what does not fit stays, in order.
    let mut b = MbufBurst::<8>::new();
    for tag in 0..5 {
        b.push(mbuf_with(pool, &[tag; 20]));
    }
    assert_eq!(small.enqueue_burst(&mut b), 3);
    assert_eq!(tags(&b), [3, 4]);
    assert_eq!((small.count(), small.free_count()), (3, 0));
    assert_eq!(live_mbufs(), 2);
    let extra = mbuf_with(pool, &[9; 20]);
    let extra = small.enqueue(extra).unwrap_err();
    assert_eq!(extra.data()[0], 9);
    drop(extra);
    assert_eq!(small.dequeue_burst(&mut b), 3);
    assert_eq!(tags(&b), [3, 4, 0, 1, 2]);
    assert_eq!(small.dequeue_burst(&mut b), 0);
    let one = b.pop().unwrap();
    small.enqueue(one).unwrap();
    assert_eq!(small.dequeue().map(|m| m.data()[0]), Some(2));
    assert!(small.dequeue().is_none());

    // Dropping the creator's ring frees what is queued, then the ring.
    assert_eq!(small.enqueue_burst(&mut b), 3);
    assert_eq!(pool.in_use_count(), 4);
    drop(small);
    drop(b);
    assert_eq!(pool.in_use_count(), 0);
    assert!(matches!(
        Ring::lookup("kpt_small"),
        Err(DpdkError::NotFound { .. })
    ));

    // Multi-producer/consumer rings may have several handles; the
    // creator's last handle frees it.
    let mpmc = Ring::create("kpt_mpmc", 64, socket, RingFlags::default()).unwrap();
    let again = Ring::lookup("kpt_mpmc").unwrap();
    assert_eq!(again.as_ptr(), mpmc.as_ptr());
    drop(mpmc);
    assert!(Ring::lookup("kpt_mpmc").is_ok(), "still held by `again`");

    // Another thread produces through a RingRef, finding the ring in an
    // `AtomicPtr` (as the if-manager's route table would).
    let shared = AtomicPtr::new(again.as_ptr());
    std::thread::scope(|s| {
        s.spawn(|| {
            let ptr = NonNull::new(shared.load(Ordering::Acquire)).unwrap();
            // SAFETY:
            // - the ring lives (`again` is held until after the scope);
            // - it carries mbufs; this thread is one producer of a
            //   multi-producer ring.
            let r = unsafe { RingRef::from_raw(ptr) };
            assert_eq!(r.name(), "kpt_mpmc");
            let mut b = MbufBurst::<4>::new();
            assert!(pool.alloc_bulk(&mut b, 4));
            for (i, m) in b.iter_mut().enumerate() {
                m.append(1).unwrap()[0] = 40 + i as u8;
            }
            assert_eq!(r.enqueue_burst(&mut b), 4);
        });
    });
    let mut b = MbufBurst::<8>::new();
    assert_eq!(again.dequeue_burst(&mut b), 4);
    assert_eq!(tags(&b), [40, 41, 42, 43]);
    drop(b);

    // A multi-producer ring's producer side is shared by threads with no
    // lock; a single-producer ring refuses to become one.
    let sp = Ring::create("kpt_sp", 8, socket, spsc).unwrap();
    let sp = sp.into_producer().expect_err("single-producer");
    drop(sp);
    let producer = Ring::lookup("kpt_mpmc").unwrap().into_producer().unwrap();
    std::thread::scope(|s| {
        for t in 0..2u8 {
            let producer = &producer;
            s.spawn(move || {
                for i in 0..10u8 {
                    let m = mbuf_with(pool, &[t * 100 + i; 4]);
                    producer.enqueue(m).expect("room");
                }
            });
        }
    });
    let mut seen = Vec::new();
    while let Some(m) = again.dequeue() {
        seen.push(m.data()[0]);
    }
    seen.sort_unstable();
    let want: Vec<u8> = (0..10).chain(100..110).collect();
    assert_eq!(seen, want, "every enqueue arrived once");
    drop(producer);
    drop(again);
    assert!(matches!(
        Ring::lookup("kpt_mpmc"),
        Err(DpdkError::NotFound { .. })
    ));
    assert_eq!(pool.in_use_count(), 0);
}

fn check_memzone(socket: SocketId) {
    let len = 1 << 20;
    let zone =
        Memzone::reserve("kpt_zone", len, socket, MemzoneFlags::NONE, 4096).expect("memzone");
    assert_eq!(zone.len(), len);
    assert_eq!(zone.as_ptr() as usize % 4096, 0);
    assert_ne!(zone.iova(), 0);
    assert_eq!(zone.hugepage_size(), 2 << 20);
    let err = Memzone::reserve("kpt_zone", 64, socket, MemzoneFlags::NONE, 64).unwrap_err();
    assert_eq!(err.errno(), Some(libc::EEXIST), "{err}");
    let err = Memzone::lookup("kpt_no_zone").unwrap_err();
    assert_eq!(err.errno(), Some(libc::ENOENT), "{err}");

    let view = Memzone::lookup("kpt_zone").unwrap();
    assert_eq!(view.as_ptr(), zone.as_ptr());
    {
        // SAFETY:
        // - nothing else touches the zone while this slice lives.
        let bytes = unsafe { zone.as_mut_slice() };
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = (i % 251) as u8;
        }
    }
    // SAFETY:
    // - nothing writes to the zone while this slice lives.
    let seen = unsafe { view.as_slice() };
    assert!(seen.iter().enumerate().all(|(i, b)| *b == (i % 251) as u8));
    drop(view);
    drop(zone);
    assert!(matches!(
        Memzone::lookup("kpt_zone"),
        Err(DpdkError::NotFound { .. })
    ));
}

fn check_ring_port(pool: &Mempool) -> Port {
    let id = Port::id_by_name("net_ring0").expect("net_ring0");
    assert!(Port::count_avail() >= 2);
    let port = Port::init(id, pool, 128, 128).expect("port init");
    assert!(matches!(
        Port::init(id, pool, 128, 128),
        Err(DpdkError::Busy { .. })
    ));
    assert_eq!(port.name(), "net_ring0");
    port.promiscuous_enable().expect("ENOTSUP is fine");
    eprintln!(
        "net_ring0: mac {} socket {:?}",
        port.mac_addr(),
        port.socket_id()
    );

    let mut tx = MbufBurst::<16>::new();
    for tag in 0..8 {
        tx.push(mbuf_with(pool, &frame(tag)));
    }
    assert_eq!(port.tx_burst(Q0, &mut tx), 0, "not started: nothing sent");
    assert_eq!(tx.len(), 8);
    port.start().expect("start");
    assert_eq!(port.tx_burst(Q0, &mut tx), 8);
    assert!(tx.is_empty());
    let mut rx = MbufBurst::<4>::new();
    assert_eq!(
        port.rx_burst(Q0, &mut rx),
        4,
        "net_ring loops TX back to RX"
    );
    assert_eq!(port.rx_burst(Q0, &mut rx), 0, "burst full");
    assert_eq!(tags_at(&rx, 11), [0, 1, 2, 3]);
    rx.clear();
    assert_eq!(port.rx_burst(Q0, &mut rx), 4);
    assert_eq!(tags_at(&rx, 11), [4, 5, 6, 7]);
    assert!(rx.iter().all(|m| m.data() == frame(m.data()[11])));
    drop(rx);
    let stats = port.stats();
    eprintln!("net_ring0: {stats:?}");
    assert_eq!((stats.ipackets, stats.opackets), (8, 8));
    assert_eq!(pool.in_use_count(), 0);
    port
}

fn tags_at<const N: usize>(b: &MbufBurst<N>, at: usize) -> Vec<u8> {
    b.iter().map(|m| m.data()[at]).collect()
}

fn check_pcap_port(pool: &Mempool, pcap_in: &[Vec<u8>], tx_pcap: &Path) {
    let id = Port::id_by_name("net_pcap0").expect("net_pcap0");
    let port = Port::init(id, pool, 256, 256).expect("pcap port");
    port.start().unwrap();
    let mut rx = MbufBurst::<32>::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while rx.len() < pcap_in.len() && Instant::now() < deadline {
        port.rx_burst(Q0, &mut rx);
    }
    let got: Vec<Vec<u8>> = rx.iter().map(|m| m.data().to_vec()).collect();
    assert_eq!(got, pcap_in, "frames read from rx.pcap");
    // Send them back out, changed, plus one.
    for m in rx.iter_mut() {
        m.data_mut()[0] = 0x01;
    }
    rx.push(mbuf_with(pool, &frame(42)));
    let mut expected: Vec<Vec<u8>> = rx.iter().map(|m| m.data().to_vec()).collect();
    let mut sent = 0;
    while !rx.is_empty() && Instant::now() < deadline {
        sent += port.tx_burst(Q0, &mut rx);
    }
    assert_eq!(sent, 4);
    let stats = port.stats();
    assert_eq!((stats.ipackets, stats.opackets), (3, 4));
    port.close().unwrap(); // flushes tx.pcap
    let mut written = read_pcap(tx_pcap);
    written.sort();
    expected.sort();
    assert_eq!(written, expected, "frames written to tx.pcap");
    drop(port);
    assert_eq!(pool.in_use_count(), 0, "the RX queue gave its mbufs back");
}

fn check_secondary(pool: &Mempool, socket: SocketId, prefix: &str) {
    let spsc = RingFlags {
        single_producer: true,
        single_consumer: true,
    };
    let to = Ring::create(TO_SECONDARY, 64, socket, spsc).unwrap();
    let from = Ring::create(FROM_SECONDARY, 64, socket, spsc).unwrap();
    let mut b = MbufBurst::<TO_SECONDARY_N>::new();
    for i in 0..TO_SECONDARY_N {
        b.push(mbuf_with(pool, &payload_to(i)));
    }
    assert_eq!(to.enqueue_burst(&mut b), TO_SECONDARY_N);
    assert_eq!(pool.in_use_count(), TO_SECONDARY_N as u32);

    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "eal_end_to_end",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(ROLE_ENV, "secondary")
        .env(PREFIX_ENV, prefix)
        .output()
        .expect("spawning the secondary");
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("---- secondary ----\n{text}---- end secondary ----");
    assert!(out.status.success(), "secondary failed");
    assert!(
        text.contains("secondary: ok"),
        "the secondary ran its checks"
    );

    // The secondary's cleanup left the primary's files alone.
    assert!(Path::new("/var/run/dpdk")
        .join(prefix)
        .join("config")
        .exists());
    eprintln!(
        "DPDK files after the secondary: {:#?}",
        instance_files(prefix)
    );

    assert_eq!(to.count(), 0, "secondary took them all");
    let mut back = MbufBurst::<16>::new();
    assert_eq!(from.dequeue_burst(&mut back), FROM_SECONDARY_N);
    for (i, m) in back.iter().enumerate() {
        assert_eq!(m.data(), payload_from(i));
    }
    drop(back);
    assert_eq!(pool.in_use_count(), 0, "every mbuf is back in the pool");
    assert_eq!(pool.avail_count(), pool.size());
}

fn payload_to(i: usize) -> Vec<u8> {
    format!("primary->secondary #{i}").into_bytes()
}

fn payload_from(i: usize) -> Vec<u8> {
    format!("secondary->primary #{i}").into_bytes()
}

fn secondary() {
    let prefix = std::env::var(PREFIX_ENV).expect("prefix");
    // Lcore id 1 on CPU 0: never the primary's lcore id 0.
    let args = strings(&[
        "kp-dpdk-test-secondary",
        "--proc-type=secondary",
        "--lcores",
        "1@0",
        "--no-pci",
        "--file-prefix",
        &prefix,
    ]);
    let eal = Eal::init(&args).expect("EAL init as secondary");
    assert_eq!(eal.process_type(), ProcessType::Secondary);
    assert_eq!(eal.lcore_id().map(|l| l.0), Some(1));
    println!("secondary: {} port(s) visible", Port::count_avail());
    {
        let pool = Mempool::lookup(POOL).expect("primary's pool");
        assert_eq!(pool.size(), POOL_SIZE);
        let to = Ring::lookup(TO_SECONDARY).expect("ring to secondary");
        let from = Ring::lookup(FROM_SECONDARY).expect("ring from secondary");
        let mut b = MbufBurst::<32>::new();
        let deadline = Instant::now() + Duration::from_secs(5);
        while b.len() < TO_SECONDARY_N && Instant::now() < deadline {
            to.dequeue_burst(&mut b);
        }
        assert_eq!(b.len(), TO_SECONDARY_N);
        for (i, m) in b.drain().enumerate() {
            assert_eq!(m.data(), payload_to(i));
        } // freed into the primary's pool, from this process
        let mut b = MbufBurst::<FROM_SECONDARY_N>::new();
        for i in 0..FROM_SECONDARY_N {
            b.push(mbuf_with(&pool, &payload_from(i)));
        }
        assert_eq!(from.enqueue_burst(&mut b), FROM_SECONDARY_N);
        // Dropping lookups frees nothing: the primary created them.
    }
    eal.cleanup().expect("secondary cleanup");
    println!("secondary: ok");
}
