//! Per-packet cost of the if-manager's sans-IO core: classify a 1 KiB
//! fragment frame (Ethernet/IPv4/UDP parse, IPv4 checksum, header and
//! geometry checks) and look up its route. No DPDK: this is the work the
//! RX lcore does per packet on top of the PMD and the ring enqueue.
//! `scripts/bench-if-manager.sh` measures the whole thing on real DPDK.

use std::hint::black_box;
use std::net::Ipv4Addr;
use std::sync::mpsc::channel;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use if_manager::classify::{classify, DstFilter, Verdict};
use if_manager::routes::{Route, RouteTable, RouteUpdate};
use kp_wire::{emit_udp_frame, FragmentRepr, FrameAddr, IfId, MacAddr, HEADER_LEN};

fn frames(n: usize) -> Vec<Vec<u8>> {
    let addr = FrameAddr {
        src_mac: MacAddr([2, 0, 0, 0, 0, 1]),
        dst_mac: MacAddr([2, 0, 0, 0, 0, 2]),
        vlan_tci: None,
        src_ip: Ipv4Addr::new(10, 77, 0, 1),
        dst_ip: Ipv4Addr::new(10, 77, 0, 2),
        src_port: 40000,
        dst_port: 9000,
    };
    let total_len = 150_528u32; // 224x224x3
    let frag_count = total_len.div_ceil(1024) as u16;
    (0..n)
        .map(|i| {
            let h = FragmentRepr {
                if_id: IfId(1 + (i % 2) as u16),
                request_id: (i / usize::from(frag_count)) as u64,
                total_len,
                frag_index: (i % usize::from(frag_count)) as u16,
                frag_count,
                send_ts_ns: 1,
            };
            let len = h.payload_range().expect("valid geometry").len();
            let mut payload = vec![0x5a; HEADER_LEN + len];
            h.emit_header(&mut payload[..HEADER_LEN])
                .expect("header fits");
            let mut buf = vec![0; 1600];
            let n = emit_udp_frame(&addr, &payload, &mut buf).expect("frame fits");
            buf.truncate(n);
            buf
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let frames = frames(256);
    let filter = DstFilter {
        port: 9000,
        ip: None,
    };
    let (tx, rx) = channel();
    let mut routes = RouteTable::<u32>::new(rx);
    for id in [1u16, 2] {
        tx.send(RouteUpdate::Add(
            IfId(id),
            Route {
                ring: u32::from(id),
                counters: Arc::default(),
                control: None,
            },
        ))
        .expect("table alive");
    }
    routes.apply_updates(|_| {});

    let mut g = c.benchmark_group("if-manager");
    g.throughput(Throughput::Elements(frames.len() as u64));
    g.bench_function("classify+route 1KiB fragment", |b| {
        b.iter(|| {
            let mut routed = 0u32;
            for f in &frames {
                if let Verdict::Fragment { header, .. } = classify(black_box(f), &filter) {
                    if let Some(r) = routes.get(header.if_id) {
                        routed += r.ring;
                    }
                }
            }
            black_box(routed)
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
