//! The TX ring's doorbell in real DPDK shared memory: an IF's answers wake
//! an if-manager dozing on it (`TxBell`), a batch's answers ring it once,
//! nothing rings it when nothing was enqueued, and what must follow an
//! enqueue (the crash ledger's clear) runs before the ring: a woken
//! if-manager never finds an answered request still in the ledger, where a
//! successor of a process killed meanwhile would answer it again. The
//! ledger's early answers (requests answered before all their fragments
//! came) keep the latest ones, apart from the held requests.
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
use libml::runtime::handover::{Ledger, TxBell, EARLY_ANSWERS};
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

/// The if-manager's idle loop on a thread of its own: it reads the TX
/// bell's count and dozes until the count moves (a futex may wake for
/// nothing; 60 s at most), then runs `woken`. Returns once the thread is
/// in its doze; the thread returns how long it dozed and what `woken` did.
fn doze_until_rung<T: Send + 'static>(
    woken: impl FnOnce() -> T + Send + 'static,
) -> std::thread::JoinHandle<(Duration, T)> {
    let dozing = Arc::new(AtomicBool::new(false));
    let dozer = {
        let dozing = dozing.clone();
        std::thread::spawn(move || {
            let bell = TxBell::lookup().unwrap();
            let seen = bell.doorbell().seen();
            dozing.store(true, Ordering::Release);
            let t = Instant::now();
            while bell.doorbell().seen() == seen && t.elapsed() < Duration::from_secs(60) {
                bell.doorbell().doze(seen, Duration::from_secs(60));
            }
            (t.elapsed(), woken())
        })
    };
    while !dozing.load(Ordering::Acquire) {
        std::thread::yield_now();
    }
    std::thread::sleep(Duration::from_millis(50)); // into the futex wait
    dozer
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

        // The if-manager's idle loop, dozing for far longer than this test
        // may take.
        let dozer = doze_until_rung(|| ());
        let mut answers = answerer.burst(3);
        for id in 0..3 {
            answers.ok(&reply(id), &[(7, 0.5)], 3, 100).unwrap();
        }
        assert_eq!(answers.send(), 0);
        let (dozed, ()) = dozer.join().unwrap();
        assert!(
            dozed < Duration::from_secs(30),
            "the dozer slept {dozed:?}: the answers did not wake it"
        );
        assert_eq!(bell.doorbell().seen(), before + 1, "a batch rings once");
        // A single error answer (the fragment thread's) rings too.
        answerer.error(&reply(9), Status::Incomplete, 100).unwrap();
        assert_eq!(bell.doorbell().seen(), before + 2);

        // The ledger leaves before the doorbell rings, for a batch's
        // answers and for one alone: a dozer woken by the ring finds
        // nothing answered still held.
        let ledger = Ledger::create(4, socket).unwrap();
        let read_ledger = || Ledger::lookup(std::process::id()).unwrap().held();
        ledger.hold(0, &reply(10));
        ledger.hold(1, &reply(11));
        ledger.hold(2, &reply(12));
        assert_eq!(ledger.held().len(), 3);
        let dozer = doze_until_rung(read_ledger);
        let mut answers = answerer.burst(2);
        answers.ok(&reply(10), &[(7, 0.5)], 2, 100).unwrap();
        answers.ok(&reply(11), &[(7, 0.5)], 2, 100).unwrap();
        let rung = bell.doorbell().seen();
        let on_ring = ring.count();
        let sent = answers.send_then(|| {
            assert_eq!(ring.count(), on_ring + 2, "done ran before the enqueue");
            assert_eq!(bell.doorbell().seen(), rung, "rang before done ran");
            ledger.clear(0);
            ledger.clear(1);
        });
        assert_eq!(sent, 0);
        assert_eq!(bell.doorbell().seen(), rung + 1);
        let held: Vec<u64> = dozer
            .join()
            .unwrap()
            .1
            .iter()
            .map(|r| r.request_id)
            .collect();
        assert_eq!(
            held,
            [12],
            "the woken if-manager saw answered requests in the ledger"
        );

        let dozer = doze_until_rung(read_ledger);
        let rung = bell.doorbell().seen();
        let on_ring = ring.count();
        answerer
            .error_then(&reply(12), Status::Incomplete, 100, || {
                assert_eq!(ring.count(), on_ring + 1, "done ran before the enqueue");
                assert_eq!(bell.doorbell().seen(), rung, "rang before done ran");
                ledger.clear(2);
            })
            .unwrap();
        assert_eq!(bell.doorbell().seen(), rung + 1);
        assert!(
            dozer.join().unwrap().1.is_empty(),
            "the woken if-manager saw an answered request"
        );

        // Beside the slots, the requests answered early: the latest
        // EARLY_ANSWERS, oldest first, as a successor reads them; none of
        // them a held request, nor the other way round.
        let early_of = |pid| -> Vec<u64> {
            Ledger::lookup(pid)
                .unwrap()
                .early_answers()
                .iter()
                .map(|k| k.request_id)
                .collect()
        };
        assert!(early_of(std::process::id()).is_empty());
        ledger.hold(3, &reply(13));
        let n = EARLY_ANSWERS as u64 + 6;
        for id in 100..100 + n {
            ledger.answered_early(&reply(id).key());
        }
        assert_eq!(
            early_of(std::process::id()),
            (106..100 + n).collect::<Vec<_>>()
        );
        let held: Vec<u64> = read_ledger().iter().map(|r| r.request_id).collect();
        assert_eq!(held, [13]);
        ledger.clear(3);
        drop(ledger);

        // Everything enqueued is on the ring.
        drop(answerer);
        let mut out = MbufBurst::<8>::new();
        assert_eq!(ring.dequeue_burst(&mut out), 7);
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
