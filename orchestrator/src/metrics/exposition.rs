//! The mapping of [`PlatformMetrics`] to Prometheus series, written in the
//! text exposition format (version 0.0.4) by `prometheus-client`: every
//! name, type, label and unit the endpoint serves is in this file, and
//! docs/METRICS.md lists them.
//!
//! Conventions (prometheus.io/docs/practices/naming): the `kneepoint_`
//! prefix; counters end in `_total` (the encoder adds it to a counter's
//! name); times in seconds, shares as ratios in [0, 1]. Per-IF series carry
//! `if_id` and `model`; those counted per process also `role` (`active` or
//! `shadow`, see the parent module).
//!
//! The numbers are a snapshot taken under the lock ([`encode`] takes a
//! `&PlatformMetrics`): a [`Collector`] writes them as constant metrics at
//! each scrape, so nothing here holds state of its own.

use std::fmt;

use kp_schema::telemetry::LATENCY_BOUNDS_US;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeCounterValue, EncodeMetric, NoLabelSet,
};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use super::{IfSeries, PlatformMetrics, Role};

/// The `Content-Type` of what [`encode`] writes.
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// Upper bounds of the switchover-gap histogram's buckets, seconds: a gap
/// is tens of microseconds when all goes well (docs/PERFORMANCE.md), a
/// starved machine makes it milliseconds.
pub const GAP_BOUNDS_S: [f64; 10] = [
    10e-6, 25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 10e-3, 100e-3, 1.0,
];

/// A series' labels.
type Labels = Vec<(&'static str, String)>;

/// The whole exposition of `m`.
pub fn encode(m: &PlatformMetrics) -> Result<String, fmt::Error> {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Snapshot(m.clone())));
    let mut out = String::new();
    prometheus_client::encoding::prometheus_text::encode(&mut out, &registry)?;
    Ok(out)
}

/// The numbers of one scrape.
#[derive(Debug)]
struct Snapshot(PlatformMetrics);

/// Writes one metric family: its HELP and TYPE, then a sample per series.
struct Family<'a, 'e> {
    enc: &'a mut DescriptorEncoder<'e>,
}

impl Family<'_, '_> {
    /// Counters of whole numbers (`u64`) or of seconds (`f64`).
    fn counters<N: EncodeCounterValue + fmt::Debug>(
        &mut self,
        name: &str,
        help: &str,
        series: impl IntoIterator<Item = (Labels, N)>,
    ) -> fmt::Result {
        let mut m = self
            .enc
            .encode_descriptor(name, help, None, MetricType::Counter)?;
        for (labels, v) in series {
            ConstCounter::new(v).encode(m.encode_family(&labels)?)?;
        }
        Ok(())
    }

    fn gauges(
        &mut self,
        name: &str,
        help: &str,
        series: impl IntoIterator<Item = (Labels, f64)>,
    ) -> fmt::Result {
        let mut m = self
            .enc
            .encode_descriptor(name, help, None, MetricType::Gauge)?;
        for (labels, v) in series {
            ConstGauge::new(v).encode(m.encode_family(&labels)?)?;
        }
        Ok(())
    }

    /// `series`: labels, the finite buckets (upper bound in seconds, count
    /// in that bucket alone), the count of all observations, their sum.
    fn histograms(
        &mut self,
        name: &str,
        help: &str,
        series: impl IntoIterator<Item = (Labels, Vec<(f64, u64)>, u64, f64)>,
    ) -> fmt::Result {
        let mut m = self
            .enc
            .encode_descriptor(name, help, None, MetricType::Histogram)?;
        for (labels, buckets, count, sum) in series {
            m.encode_family(&labels)?
                .encode_histogram::<NoLabelSet>(sum, count, &buckets, None)?;
        }
        Ok(())
    }
}

fn if_labels(id: u16, s: &IfSeries) -> Labels {
    vec![("if_id", id.to_string()), ("model", s.model.clone())]
}

fn with(mut labels: Labels, more: &[(&'static str, &str)]) -> Labels {
    labels.extend(more.iter().map(|(k, v)| (*k, v.to_string())));
    labels
}

impl Snapshot {
    /// Every (labels with `role`, counts) of every IF.
    fn per_role(&self) -> impl Iterator<Item = (Labels, &super::Counts)> {
        self.0.ifs.iter().flat_map(|(id, s)| {
            s.counts
                .iter()
                .map(move |(role, c)| (with(if_labels(*id, s), &[("role", role.name())]), c))
        })
    }

    fn encode_ifs(&self, f: &mut Family<'_, '_>) -> fmt::Result {
        f.counters(
            "kneepoint_if_requests",
            "Requests answered by an inference function, by final status (ok, overloaded, bad_request, incomplete, internal, ...).",
            self.per_role().flat_map(|(l, c)| {
                c.answers
                    .iter()
                    .map(move |(status, n)| (with(l.clone(), &[("status", status)]), *n))
            }),
        )?;
        f.counters(
            "kneepoint_if_arrivals",
            "Requests that arrived at an inference function (first fragment seen).",
            self.per_role().map(|(l, c)| (l, c.arrivals)),
        )?;
        f.histograms(
            "kneepoint_if_request_latency_seconds",
            "Platform latency of OK answers, from a request's first fragment to its answer.",
            self.per_role().map(|(l, c)| {
                let buckets = LATENCY_BOUNDS_US
                    .iter()
                    .zip(&c.latency_counts)
                    .map(|(b, n)| (*b as f64 / 1e6, *n))
                    .collect();
                let count = c.latency_counts.iter().sum();
                (l, buckets, count, c.latency_sum_us as f64 / 1e6)
            }),
        )?;
        f.counters(
            "kneepoint_if_requests_within_slo",
            "OK answers within the IF's latency objective (SLO attainment: its rate over the rate of kneepoint_if_requests_total).",
            self.per_role().map(|(l, c)| (l, c.within_slo)),
        )?;
        f.counters(
            "kneepoint_if_batches",
            "Batches an inference function ran.",
            self.per_role().map(|(l, c)| (l, c.batches)),
        )?;
        f.counters(
            "kneepoint_if_batched_requests",
            "Requests in those batches (mean batch size: its rate over the rate of kneepoint_if_batches_total).",
            self.per_role().map(|(l, c)| (l, c.batched_requests)),
        )?;
        f.histograms(
            "kneepoint_if_batch_size",
            "Requests per batch an inference function ran; buckets are powers of two up to the IF's largest batch (its count is kneepoint_if_batches_total, its sum kneepoint_if_batched_requests_total).",
            self.per_role()
                .filter(|(_, c)| !c.batch_bounds.is_empty())
                .map(|(l, c)| {
                    let buckets = c
                        .batch_bounds
                        .iter()
                        .zip(&c.batch_counts)
                        .map(|(b, n)| (*b as f64, *n))
                        .collect();
                    let count = c.batch_counts.iter().sum();
                    (l, buckets, count, c.batch_sum as f64)
                }),
        )?;
        f.counters(
            "kneepoint_if_slo_miss_batches",
            "Batches whose slowest request missed the SLO.",
            self.per_role().map(|(l, c)| (l, c.slo_miss_batches)),
        )?;
        f.counters(
            "kneepoint_if_fragment_thread_cpu_seconds",
            "CPU time of an inference function's fragment thread (receiving, reassembling, copying fragments into the pool): its rate over the rate of kneepoint_if_fragment_payload_bytes_total is the cost of a byte of payload.",
            self.per_role().map(|(l, c)| (l, c.fragment_cpu_ns as f64 / 1e9)),
        )?;
        f.counters(
            "kneepoint_if_fragments",
            "Fragments an inference function's fragment thread handled.",
            self.per_role().map(|(l, c)| (l, c.fragments)),
        )?;
        f.counters(
            "kneepoint_if_fragment_payload_bytes",
            "Payload bytes of those fragments.",
            self.per_role().map(|(l, c)| (l, c.fragment_bytes)),
        )?;
        f.counters(
            "kneepoint_if_inference_thread_cpu_seconds",
            "CPU time of an inference function's inference thread (batching, the engine call as far as it runs on that thread, answers); an engine's own worker threads are not counted.",
            self.per_role().map(|(l, c)| (l, c.inference_cpu_ns as f64 / 1e9)),
        )?;
        f.counters(
            "kneepoint_if_shed_requests",
            "Requests the batching policy shed because they could no longer meet the SLO (answered OVERLOADED).",
            self.per_role().map(|(l, c)| (l, c.shed)),
        )?;

        let active = || {
            self.0.ifs.iter().filter_map(|(id, s)| {
                let g = s.active?;
                Some((with(if_labels(*id, s), &[("role", Role::Active.name())]), g))
            })
        };
        f.gauges(
            "kneepoint_if_requests_in_flight",
            "Requests the serving process holds: arrived, not yet answered (reassembling, queued or in a batch).",
            active().map(|(l, g)| (l, g.in_flight as f64)),
        )?;
        f.gauges(
            "kneepoint_if_target_batch_size",
            "The batch size the batching policy aims for now.",
            active().map(|(l, g)| (l, g.target_batch as f64)),
        )?;
        f.gauges(
            "kneepoint_if_batch_tail_factor",
            "How much slower than predicted the batching policy plans a batch where a deadline is at stake: the 95th percentile of recent batches' measured / predicted time, at least 1.",
            active().map(|(l, g)| (l, g.tail_factor)),
        )?;
        f.gauges(
            "kneepoint_if_batch_wall_per_cpu",
            "Recent batches' wall time per CPU time of the engine's thread, at least 1: above 1 where the thread was preempted while its engine computed (a core shared with the fragment thread). 1 for engines that compute elsewhere (a GPU).",
            active().map(|(l, g)| (l, g.wall_per_cpu)),
        )?;
        f.gauges(
            "kneepoint_if_device_batch_seconds",
            "A GPU engine's last batch on its device, from the input's copy to the last step (CUDA events); absent for CPU engines.",
            active().filter_map(|(l, g)| Some((l, g.device?.last_batch_ns as f64 / 1e9))),
        )?;
        f.gauges(
            "kneepoint_if_device_input_seconds",
            "Of a GPU engine's last batch, the input reaching the device: the gather from the pinned input pool (a GPU IF reads requests in place) or a copy from host memory (CUDA events); absent for CPU engines.",
            active().filter_map(|(l, g)| Some((l, g.device?.last_input_ns as f64 / 1e9))),
        )?;
        f.gauges(
            "kneepoint_if_device_memory_bytes",
            "Device memory a GPU engine holds for its model: parameters, activations, workspace; absent for CPU engines.",
            active().filter_map(|(l, g)| Some((l, g.device?.memory_bytes as f64))),
        )?;
        f.gauges(
            "kneepoint_if_slo_attainment_ratio",
            "OK answers within the SLO of all answers of the serving process since it started.",
            active().filter_map(|(l, g)| Some((l, g.slo_attainment?))),
        )?;

        let views = || {
            self.0
                .ifs
                .iter()
                .filter_map(|(id, s)| Some((if_labels(*id, s), s.view.as_ref()?)))
        };
        f.gauges(
            "kneepoint_if_share_ratio",
            "The IF's share of the device (0 to 1); enforcement says how: cpu_cores (a set of cores and as many engine threads), mps (CUDA MPS active-thread percentage of a GPU IF) or none (a GPU IF without the MPS daemon: the percentage is not enforced).",
            views().map(|(l, v)| {
                (
                    with(l, &[("enforcement", v.enforcement)]),
                    v.share_pct / 100.0,
                )
            }),
        )?;
        f.gauges(
            "kneepoint_if_share_cores",
            "Cores the IF's processes run on (its share, on a CPU host).",
            views().map(|(l, v)| (l, v.cores as f64)),
        )?;
        f.gauges(
            "kneepoint_if_share_pinned",
            "1 if the share is pinned by hand (the tuning loop leaves it), else 0.",
            views().map(|(l, v)| (l, f64::from(u8::from(v.pinned)))),
        )?;
        f.gauges(
            "kneepoint_if_slo_seconds",
            "The IF's latency objective.",
            views().map(|(l, v)| (l, v.slo_ms / 1e3)),
        )?;
        f.gauges(
            "kneepoint_if_state",
            "1 for the IF's state now (starting, active, switching, retiring, failed).",
            views().map(|(l, v)| (with(l, &[("state", &v.state)]), 1.0)),
        )?;
        f.counters(
            "kneepoint_if_switchovers",
            "Shadow switchovers (re-provisions) of the IF.",
            views().map(|(l, v)| (l, v.switchover_gaps_ns.len() as u64)),
        )?;
        f.histograms(
            "kneepoint_if_switchover_gap_seconds",
            "Switchover gaps: from the old active's release of the ring to the new one's first dequeue.",
            views().map(|(l, v)| {
                let mut counts = [0u64; GAP_BOUNDS_S.len()];
                for g in &v.switchover_gaps_ns {
                    let s = *g as f64 / 1e9;
                    if let Some(i) = GAP_BOUNDS_S.iter().position(|b| s <= *b) {
                        counts[i] += 1;
                    }
                }
                let buckets = GAP_BOUNDS_S.iter().copied().zip(counts).collect();
                let sum = v.switchover_gaps_ns.iter().map(|g| *g as f64 / 1e9).sum();
                (l, buckets, v.switchover_gaps_ns.len() as u64, sum)
            }),
        )?;
        f.counters(
            "kneepoint_if_failovers",
            "Actives that died and were replaced by their shadow.",
            views().map(|(l, v)| (l, v.failovers)),
        )?;
        f.counters(
            "kneepoint_tuning_decisions",
            "Decisions of the self-tuning loop (GSLICE's Algorithm 1) per IF: reason is how it read the IF, changed whether the IF's demand moved.",
            self.0.ifs.iter().flat_map(|(id, s)| {
                s.tuning_decisions
                    .iter()
                    .map(move |((reason, changed), n)| {
                        let changed = if *changed { "true" } else { "false" };
                        (
                            with(
                                if_labels(*id, s),
                                &[("reason", reason), ("changed", changed)],
                            ),
                            *n,
                        )
                    })
            }),
        )
    }

    fn encode_platform(&self, f: &mut Family<'_, '_>) -> fmt::Result {
        let p = &self.0.platform;
        f.counters(
            "kneepoint_platform_restarts",
            "Times the if-manager died and the platform was restarted with its IFs.",
            [(vec![], p.platform_restarts)],
        )?;
        f.counters(
            "kneepoint_telemetry_rejected",
            "Telemetry messages from IFs the orchestrator could not read.",
            [(vec![], p.telemetry_rejected)],
        )?;
        f.gauges(
            "kneepoint_if_manager_up",
            "1 if the if-manager answered this scrape's request for its counters, else 0.",
            [(
                vec![],
                f64::from(u8::from(
                    p.if_manager_pid.is_some() && self.0.if_manager_answered,
                )),
            )],
        )?;
        f.counters(
            "kneepoint_if_manager_unreachable",
            "Scrapes at which the if-manager did not answer for its counters.",
            [(vec![], self.0.if_manager_unreachable)],
        )?;
        let Some(c) = &self.0.if_manager else {
            return Ok(());
        };
        f.counters(
            "kneepoint_if_manager_rx_packets",
            "Frames the if-manager took off its RX queue.",
            [(vec![], c.rx_packets)],
        )?;
        f.counters(
            "kneepoint_if_manager_packets",
            "Frames by outcome: every frame taken off the RX queue ends in exactly one.",
            c.outcomes
                .iter()
                .map(|(o, n)| (vec![("outcome", o.clone())], *n)),
        )?;
        f.counters(
            "kneepoint_if_manager_packet_reasons",
            "Frames of the not_for_us and malformed outcomes, by reason.",
            c.not_for_us
                .iter()
                .map(|(r, n)| ("not_for_us", r, n))
                .chain(c.malformed.iter().map(|(r, n)| ("malformed", r, n)))
                .map(|(o, r, n)| (vec![("outcome", o.to_string()), ("reason", r.clone())], *n)),
        )?;
        f.counters(
            "kneepoint_if_manager_tx_frames",
            "Frames the if-manager handed to the NIC (sent) or that the NIC refused after all retries (dropped).",
            [
                (vec![("result", "sent".to_string())], c.tx.sent),
                (vec![("result", "dropped".to_string())], c.tx.dropped),
            ],
        )?;
        f.counters(
            "kneepoint_if_manager_answered_evictions",
            "Answered-request entries evicted before their time-to-live ran out.",
            [(vec![], c.answered_evictions)],
        )?;
        let p = &c.port;
        for (name, help, v) in [
            (
                "kneepoint_port_receive_packets",
                "Frames the port received (the driver's ipackets), before the if-manager classifies them.",
                p.ipackets,
            ),
            (
                "kneepoint_port_receive_bytes",
                "Bytes the port received (ibytes).",
                p.ibytes,
            ),
            (
                "kneepoint_port_receive_missed",
                "Frames the port dropped because its RX queue was full (imissed).",
                p.imissed,
            ),
            (
                "kneepoint_port_receive_errors",
                "Erroneous frames the port received (ierrors).",
                p.ierrors,
            ),
            (
                "kneepoint_port_receive_nombuf",
                "Frames the port could not receive for want of an mbuf (rx_nombuf: the mempool ran dry).",
                p.rx_nombuf,
            ),
            (
                "kneepoint_port_transmit_packets",
                "Frames the port sent (opackets).",
                p.opackets,
            ),
            (
                "kneepoint_port_transmit_bytes",
                "Bytes the port sent (obytes).",
                p.obytes,
            ),
            (
                "kneepoint_port_transmit_errors",
                "Frames the port failed to send (oerrors).",
                p.oerrors,
            ),
        ] {
            f.counters(name, help, [(vec![], v)])?;
        }
        Ok(())
    }
}

impl Collector for Snapshot {
    fn encode(&self, mut enc: DescriptorEncoder) -> fmt::Result {
        let mut f = Family { enc: &mut enc };
        self.encode_ifs(&mut f)?;
        self.encode_platform(&mut f)
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::message;
    use super::super::{IfView, PlatformView};
    use super::*;
    use kp_schema::messages::{IfManagerCounters, PortCounters};

    fn platform() -> PlatformMetrics {
        let mut m = PlatformMetrics::default();
        m.on_message(&message(100, "active", 10, 1)).unwrap();
        m.on_message(&message(200, "standby", 0, 0)).unwrap();
        m.set_views(
            vec![IfView {
                if_id: 1,
                model: "squeezenet".into(),
                state: "active".into(),
                share_pct: 50.0,
                enforcement: "cpu_cores",
                pinned: false,
                cores: 1,
                slo_ms: 20.0,
                switchover_gaps_ns: vec![40_000, 2_000_000],
                failovers: 1,
            }],
            PlatformView {
                platform_restarts: 0,
                telemetry_rejected: 0,
                device: "cpu",
                if_manager_pid: Some(7),
            },
        );
        m.on_tuning_decision(1, "in_band", false);
        m.on_if_manager(
            7,
            IfManagerCounters {
                rx_packets: 1_600,
                outcomes: [
                    ("delivered".to_string(), 1_590),
                    ("not_for_us".to_string(), 10),
                ]
                .into(),
                not_for_us: [("wrong_port".to_string(), 10)].into(),
                port: PortCounters {
                    ipackets: 1_603,
                    ibytes: 2_404_500,
                    imissed: 3,
                    opackets: 400,
                    ..PortCounters::default()
                },
                ..IfManagerCounters::default()
            },
        );
        m.if_manager_answered = true;
        m
    }

    /// Every sample line of `text` (not `#`), as (name{labels}, value).
    fn samples(text: &str) -> Vec<(String, String)> {
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| {
                let (k, v) = l.rsplit_once(' ').expect("name and value");
                (k.to_string(), v.to_string())
            })
            .collect()
    }

    fn value(text: &str, series: &str) -> String {
        samples(text)
            .into_iter()
            .find(|(k, _)| k == series)
            .map(|(_, v)| v)
            .unwrap_or_else(|| panic!("no {series} in\n{text}"))
    }

    #[test]
    fn requests_latency_and_shares_are_exposed_with_their_labels() {
        let text = encode(&platform()).unwrap();
        let ifl = r#"if_id="1",model="squeezenet""#;
        let act = format!(r#"{ifl},role="active""#);
        assert!(text.contains("# TYPE kneepoint_if_requests_total counter\n"));
        assert_eq!(
            value(
                &text,
                &format!(r#"kneepoint_if_requests_total{{{act},status="ok"}}"#)
            ),
            "10"
        );
        assert_eq!(
            value(
                &text,
                &format!(r#"kneepoint_if_requests_total{{{act},status="overloaded"}}"#)
            ),
            "1"
        );
        assert_eq!(
            value(
                &text,
                &format!(r#"kneepoint_if_requests_total{{{ifl},role="shadow",status="ok"}}"#)
            ),
            "0"
        );
        // The threads' CPU: 10 answers of 1.5 ms (fragments) and 5 ms.
        assert!(text.contains("# TYPE kneepoint_if_fragment_thread_cpu_seconds_total counter\n"));
        assert_eq!(
            value(
                &text,
                &format!("kneepoint_if_fragment_thread_cpu_seconds_total{{{act}}}")
            ),
            "0.015"
        );
        assert_eq!(
            value(&text, &format!("kneepoint_if_fragments_total{{{act}}}")),
            "1500"
        );
        assert_eq!(
            value(
                &text,
                &format!("kneepoint_if_fragment_payload_bytes_total{{{act}}}")
            ),
            "1536000"
        );
        assert_eq!(
            value(
                &text,
                &format!("kneepoint_if_inference_thread_cpu_seconds_total{{{act}}}")
            ),
            "0.05"
        );
        // The histogram: 10 answers of 3 ms, cumulative buckets.
        assert!(text.contains("# TYPE kneepoint_if_request_latency_seconds histogram\n"));
        let bucket = |le: &str| {
            value(
                &text,
                &format!(r#"kneepoint_if_request_latency_seconds_bucket{{{act},le="{le}"}}"#),
            )
        };
        assert_eq!(bucket("0.002"), "0");
        assert_eq!(bucket("0.003"), "10");
        assert_eq!(bucket("0.02"), "10");
        assert_eq!(bucket("+Inf"), "10");
        assert_eq!(
            value(
                &text,
                &format!("kneepoint_if_request_latency_seconds_sum{{{act}}}")
            ),
            "0.03"
        );
        assert_eq!(
            value(
                &text,
                &format!("kneepoint_if_request_latency_seconds_count{{{act}}}")
            ),
            "10"
        );
        // 5 batches of 2, bounds 1, 2, 4, 8.
        assert!(text.contains("# TYPE kneepoint_if_batch_size histogram\n"));
        let batch_lines: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("kneepoint_if_batch_size_") && l.contains(&act))
            .collect();
        assert_eq!(
            batch_lines,
            [
                format!(r#"kneepoint_if_batch_size_bucket{{{act},le="1"}} 0"#),
                format!(r#"kneepoint_if_batch_size_bucket{{{act},le="2"}} 5"#),
                format!(r#"kneepoint_if_batch_size_bucket{{{act},le="4"}} 5"#),
                format!(r#"kneepoint_if_batch_size_bucket{{{act},le="8"}} 5"#),
                format!(r#"kneepoint_if_batch_size_bucket{{{act},le="+Inf"}} 5"#),
                format!("kneepoint_if_batch_size_sum{{{act}}} 10.0"),
                format!("kneepoint_if_batch_size_count{{{act}}} 5"),
            ]
        );
        assert_eq!(
            value(&text, &format!("kneepoint_if_requests_in_flight{{{act}}}")),
            "2.0"
        );
        assert_eq!(
            value(
                &text,
                &format!(r#"kneepoint_if_share_ratio{{{ifl},enforcement="cpu_cores"}}"#)
            ),
            "0.5"
        );
        assert_eq!(
            value(&text, &format!("kneepoint_if_slo_seconds{{{ifl}}}")),
            "0.02"
        );
        assert_eq!(
            value(&text, &format!("kneepoint_if_switchovers_total{{{ifl}}}")),
            "2"
        );
        assert_eq!(
            value(
                &text,
                &format!(r#"kneepoint_if_switchover_gap_seconds_bucket{{{ifl},le="5e-05"}}"#)
            ),
            "1"
        );
        assert_eq!(
            value(&text, &format!("kneepoint_if_failovers_total{{{ifl}}}")),
            "1"
        );
        assert_eq!(
            value(
                &text,
                &format!(
                    r#"kneepoint_tuning_decisions_total{{{ifl},reason="in_band",changed="false"}}"#
                )
            ),
            "1"
        );
        assert_eq!(
            value(
                &text,
                r#"kneepoint_if_manager_packets_total{outcome="delivered"}"#
            ),
            "1590"
        );
        assert_eq!(
            value(
                &text,
                r#"kneepoint_if_manager_packet_reasons_total{outcome="not_for_us",reason="wrong_port"}"#
            ),
            "10"
        );
        assert_eq!(value(&text, "kneepoint_port_receive_packets_total"), "1603");
        assert_eq!(
            value(&text, "kneepoint_port_receive_bytes_total"),
            "2404500"
        );
        assert_eq!(value(&text, "kneepoint_port_receive_missed_total"), "3");
        assert_eq!(value(&text, "kneepoint_port_receive_errors_total"), "0");
        assert_eq!(value(&text, "kneepoint_port_receive_nombuf_total"), "0");
        assert_eq!(value(&text, "kneepoint_port_transmit_packets_total"), "400");
        assert!(text.contains("# TYPE kneepoint_port_receive_packets_total counter\n"));
        assert_eq!(value(&text, "kneepoint_if_manager_up"), "1.0");
        assert_eq!(value(&text, "kneepoint_platform_restarts_total"), "0");
    }

    #[test]
    fn a_gpu_engine_s_device_time_and_memory_are_gauges_and_cpu_engines_have_none() {
        let text = encode(&platform()).unwrap();
        assert!(
            !text.contains("kneepoint_if_device_memory_bytes{"),
            "{text}"
        );
        let mut m = platform();
        let mut msg = message(100, "active", 12, 1);
        if let kp_schema::telemetry::Publication::Telemetry { device, .. } = &mut msg.body {
            *device = Some(kp_schema::telemetry::DeviceStats {
                batches: 6,
                busy_ns: 9_000_000,
                last_batch_ns: 1_500_000,
                memory_bytes: 123_456_789,
                last_input_ns: 250_000,
            });
        }
        m.on_message(&msg).unwrap();
        let text = encode(&m).unwrap();
        let act = r#"if_id="1",model="squeezenet",role="active""#;
        assert_eq!(
            value(
                &text,
                &format!("kneepoint_if_device_batch_seconds{{{act}}}")
            ),
            "0.0015"
        );
        assert_eq!(
            value(&text, &format!("kneepoint_if_device_memory_bytes{{{act}}}")),
            "123456789.0"
        );
        assert_eq!(
            value(
                &text,
                &format!("kneepoint_if_device_input_seconds{{{act}}}")
            ),
            "0.00025"
        );
    }

    #[test]
    fn every_line_is_valid_exposition_and_every_sample_has_its_type() {
        let text = encode(&platform()).unwrap();
        let mut typed = std::collections::BTreeMap::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').unwrap();
                assert!(["counter", "gauge", "histogram"].contains(&kind), "{line}");
                assert!(name.starts_with("kneepoint_"), "{line}");
                assert_eq!(kind == "counter", name.ends_with("_total"), "{line}");
                typed.insert(name.to_string(), kind.to_string());
            } else if !line.starts_with("# HELP ") {
                let (series, v) = line.rsplit_once(' ').unwrap();
                let name = series.split('{').next().unwrap();
                let family = ["_bucket", "_sum", "_count"]
                    .iter()
                    .find_map(|s| {
                        name.strip_suffix(s)
                            .filter(|f| typed.get(*f).is_some_and(|k| k == "histogram"))
                    })
                    .unwrap_or(name);
                assert!(typed.contains_key(family), "no TYPE for {line}");
                assert!(v.parse::<f64>().is_ok(), "{line}");
                if let Some(labels) = series.strip_prefix(name) {
                    if !labels.is_empty() {
                        assert!(labels.starts_with('{') && labels.ends_with('}'), "{line}");
                    }
                }
            }
        }
        assert!(typed.len() > 20, "{typed:?}");
    }

    #[test]
    fn without_an_if_manager_answer_its_counters_are_absent_and_it_is_down() {
        let m = PlatformMetrics {
            if_manager_unreachable: 2,
            ..PlatformMetrics::default()
        };
        let text = encode(&m).unwrap();
        assert_eq!(value(&text, "kneepoint_if_manager_up"), "0.0");
        assert_eq!(value(&text, "kneepoint_if_manager_unreachable_total"), "2");
        assert!(!text.contains("kneepoint_if_manager_packets_total{"));
        assert!(!text.contains("kneepoint_port_"));
    }
}
