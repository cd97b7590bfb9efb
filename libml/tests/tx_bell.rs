//! The TX ring's doorbell in real DPDK shared memory: an IF's answers wake
//! an if-manager dozing on it (`TxBell`), a batch's answers ring it once,
//! and nothing rings it when nothing was enqueued.
//!
//! One `#[test]`: `rte_eal_init` runs once per process. It starts the EAL
//! as a primary on its own `--file-prefix` (root and free 2 MiB hugepages,
//! as `pool_hugepages.rs`) and cleans up down to the last file.

use std::net::Ipv4Addr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dpdk::{live_handles, Eal, MbufBurst, Mempool, ProcessType, Ring, RingFlags};
use kp_wire::{FrameAddr, IfId, MacAddr, Status};
use libml::names;
use libml::runtime::handover::TxBell;
use libml::runtime::{Answerer, ReplyTo};

fn reply(request_id: u64) -> ReplyTo {
    ReplyTo {
        addr: FrameAddr {
            src_mac: MacAddr([2, 0, 0, 0, 0, 1]),
            dst_mac: MacAddr([2, 0, 0, 0, 0, 2]),
            vlan_tci: None,
            src_ip: Ipv4Addr::new(10, 0, 0, 1),
            dst_ip: Ipv4Addr::new(10, 0, 0, 2),
            src_port: 40_000,
            dst_port: 9000,
        },
        if_id: IfId(1),
        request_id,
        send_ts_ns: 1,
    }
}

#[test]
fn answers_wake_an_if_manager_dozing_on_the_tx_bell() {
    // SAFETY:
    // - `geteuid` has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        panic!("this test needs root and free 2 MiB hugepages (scripts/setup.sh reserves them)");
    }
    let prefix = format!("kp-txbell-test-{}", std::process::id());
    let args: Vec<String> = [
        "kp-txbell-test",
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
    {
        // What the if-manager creates, then what an IF looks up.
        let pool = Mempool::create_pktmbuf(names::MEMPOOL, 255, 0, 2048, socket).unwrap();
        // Multi-consumer, unlike the if-manager's: the dpdk crate allows a
        // second handle in one process only to a ring with no single side,
        // and this process is both the if-manager and the IF.
        let ring = Ring::create(
            names::TX_RING,
            64,
            socket,
            RingFlags {
                single_producer: false,
                single_consumer: false,
            },
        )
        .unwrap();
        let bell = TxBell::create(socket).unwrap();
        let answerer = Answerer::new(
            Mempool::lookup(names::MEMPOOL).unwrap(),
            Ring::lookup(names::TX_RING).unwrap(),
        )
        .unwrap()
        .with_bell(TxBell::lookup().unwrap());

        // An empty burst enqueues nothing and rings nothing.
        let before = bell.doorbell().seen();
        assert_eq!(answerer.burst(4).send(), 0);
        assert_eq!(bell.doorbell().seen(), before, "rang with nothing enqueued");

        // The if-manager's idle loop: read the count, find the ring empty,
        // doze for far longer than this test may take.
        let dozing = Arc::new(AtomicBool::new(false));
        let dozer = {
            let dozing = dozing.clone();
            std::thread::spawn(move || {
                let bell = TxBell::lookup().unwrap();
                let seen = bell.doorbell().seen();
                dozing.store(true, Ordering::Release);
                let t = Instant::now();
                bell.doorbell().doze(seen, Duration::from_secs(60));
                t.elapsed()
            })
        };
        while !dozing.load(Ordering::Acquire) {
            std::thread::yield_now();
        }
        std::thread::sleep(Duration::from_millis(50)); // into the futex wait
        let mut answers = answerer.burst(3);
        for id in 0..3 {
            answers.ok(&reply(id), &[(7, 0.5)], 3, 100).unwrap();
        }
        assert_eq!(answers.send(), 0);
        let dozed = dozer.join().unwrap();
        assert!(
            dozed < Duration::from_secs(30),
            "the dozer slept {dozed:?}: the answers did not wake it"
        );
        assert_eq!(bell.doorbell().seen(), before + 1, "a batch rings once");
        // A single error answer (the fragment thread's) rings too.
        answerer.error(&reply(9), Status::Incomplete, 100).unwrap();
        assert_eq!(bell.doorbell().seen(), before + 2);
        // Everything enqueued is on the ring.
        drop(answerer);
        let mut out = MbufBurst::<8>::new();
        assert_eq!(ring.dequeue_burst(&mut out), 4);
        drop(out);
        drop(bell);
        drop(ring);
        drop(pool);
    }
    assert_eq!(live_handles(), 0);
    eal.cleanup().expect("EAL cleanup");
    let left: Vec<_> = std::fs::read_dir("/dev/hugepages")
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .map(|e| e.path())
        .chain(Some(Path::new("/var/run/dpdk").join(&prefix)).filter(|p| p.exists()))
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}
