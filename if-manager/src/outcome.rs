//! Every packet's fate, and a counter per fate.
//!
//! Each frame the RX queue hands us ends in exactly one [`Outcome`]; the sum
//! of the outcome counters is the number of frames received. Two outcomes
//! carry a reason ([`NotForUsReason`], [`MalformedReason`]) with counters of
//! their own, so a reader can tell a wrong port from a bad magic number.
//!
//! Counters are written by one thread (the RX lcore) and read by others
//! (control, final report). They are `AtomicU64`s bumped with a relaxed
//! load + store: with a single writer that is exact and compiles to plain
//! moves, with no locked instruction on the data path.

use std::sync::atomic::{AtomicU64, Ordering};

use kp_wire::{FrameErrorKind, MalformedKind};

use crate::port_stats::PortCounterCells;
use serde_json::{json, Map, Value};

/// The one fate of one received frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// A well-formed fragment, enqueued without a copy on its IF's ring.
    Delivered,
    /// A fragment for an `if_id` with no registered IF; the first one seen of
    /// its request was turned into the request's UNKNOWN_IF error.
    UnknownIfAnswered,
    /// A later fragment of a request already answered UNKNOWN_IF; dropped.
    UnknownIfSuppressed,
    /// The IF's ring had no room left for data (only its shed headroom):
    /// the fragment was turned into its request's shed notice, in place,
    /// and enqueued; the IF answers the request OVERLOADED.
    Shed,
    /// A later fragment of a request already shed; dropped (its one answer
    /// comes from the notice).
    ShedSuppressed,
    /// The IF's ring was full to the last slot, headroom included (the IF
    /// is not draining it): dropped with no notice. Its request is answered
    /// only if the IF saw another fragment of it (INCOMPLETE).
    RingFull,
    /// Not kneepoint traffic (not IPv4/UDP, or not to our address and port);
    /// dropped silently, as docs/PROTOCOL.md says.
    NotForUs,
    /// Addressed to us but not a well-formed frame or fragment header;
    /// dropped silently.
    Malformed,
}

impl Outcome {
    /// All outcomes, in report order.
    pub const ALL: [Outcome; 8] = [
        Outcome::Delivered,
        Outcome::UnknownIfAnswered,
        Outcome::UnknownIfSuppressed,
        Outcome::Shed,
        Outcome::ShedSuppressed,
        Outcome::RingFull,
        Outcome::NotForUs,
        Outcome::Malformed,
    ];

    /// Counter name in the JSON stats.
    pub fn name(self) -> &'static str {
        match self {
            Outcome::Delivered => "delivered",
            Outcome::UnknownIfAnswered => "unknown_if_answered",
            Outcome::UnknownIfSuppressed => "unknown_if_suppressed",
            Outcome::Shed => "shed",
            Outcome::ShedSuppressed => "shed_suppressed",
            Outcome::RingFull => "ring_full",
            Outcome::NotForUs => "not_for_us",
            Outcome::Malformed => "malformed",
        }
    }
}

/// Why a frame was not for us.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NotForUsReason {
    /// Not IPv4 (ARP, IPv6, ...) or not UDP.
    NotIpv4Udp,
    /// UDP to another destination port.
    WrongPort,
    /// IPv4 to another destination address (only with `--ip`).
    WrongAddress,
}

impl NotForUsReason {
    /// All reasons, in report order.
    pub const ALL: [NotForUsReason; 3] = [
        NotForUsReason::NotIpv4Udp,
        NotForUsReason::WrongPort,
        NotForUsReason::WrongAddress,
    ];

    /// Counter name in the JSON stats.
    pub fn name(self) -> &'static str {
        match self {
            NotForUsReason::NotIpv4Udp => "not_ipv4_udp",
            NotForUsReason::WrongPort => "wrong_port",
            NotForUsReason::WrongAddress => "wrong_address",
        }
    }
}

/// Why a frame addressed to us was malformed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MalformedReason {
    /// The Ethernet/IPv4/UDP framing is broken.
    Frame(FrameErrorKind),
    /// The kneepoint request-fragment header breaks docs/PROTOCOL.md.
    Header(MalformedKind),
    /// The frame did not fit one mbuf segment: larger than the
    /// if-manager's `--max-frame` (10240 bytes unless set, more than a
    /// 9216-byte MTU's frame), so the PMD chained it (net_pcap does).
    Segmented,
}

impl MalformedReason {
    /// Counter name in the JSON stats (`frame_*`, `header_*`, `segmented`).
    pub fn name(self) -> String {
        match self {
            MalformedReason::Frame(k) => format!("frame_{}", k.name()),
            MalformedReason::Header(k) => format!("header_{}", k.name()),
            MalformedReason::Segmented => "segmented".to_string(),
        }
    }

    fn index(self) -> usize {
        match self {
            MalformedReason::Frame(k) => FrameErrorKind::ALL
                .iter()
                .position(|x| *x == k)
                .unwrap_or(0),
            MalformedReason::Header(k) => {
                FrameErrorKind::ALL.len()
                    + MalformedKind::ALL.iter().position(|x| *x == k).unwrap_or(0)
            }
            MalformedReason::Segmented => FrameErrorKind::ALL.len() + MalformedKind::ALL.len(),
        }
    }

    fn all() -> impl Iterator<Item = MalformedReason> {
        // NotIpv4 / NotUdp frames are not-for-us, never malformed.
        FrameErrorKind::ALL
            .iter()
            .filter(|k| !matches!(k, FrameErrorKind::NotIpv4 | FrameErrorKind::NotUdp))
            .map(|k| MalformedReason::Frame(*k))
            .chain(
                MalformedKind::ALL
                    .iter()
                    .map(|k| MalformedReason::Header(*k)),
            )
            .chain(std::iter::once(MalformedReason::Segmented))
    }
}

const MALFORMED_SLOTS: usize = FrameErrorKind::ALL.len() + MalformedKind::ALL.len() + 1;

/// Adds `n` to a counter that only the calling thread writes.
///
/// A relaxed load + store is exact for a single writer and avoids a locked
/// read-modify-write on the data path; readers see a value that is at most
/// a few packets old.
#[inline]
pub fn bump(counter: &AtomicU64, n: u64) {
    counter.store(
        counter.load(Ordering::Relaxed).wrapping_add(n),
        Ordering::Relaxed,
    );
}

/// The if-manager's packet and TX counters (single writer: the RX lcore).
#[derive(Debug)]
pub struct Counters {
    /// Frames taken off the RX queue.
    pub rx_packets: AtomicU64,
    outcomes: [AtomicU64; Outcome::ALL.len()],
    not_for_us: [AtomicU64; NotForUsReason::ALL.len()],
    malformed: [AtomicU64; MALFORMED_SLOTS],
    /// Frames handed to the NIC (IF responses and our own UNKNOWN_IF errors).
    pub tx_sent: AtomicU64,
    /// Frames the NIC refused after all retries; freed, never leaked.
    pub tx_dropped: AtomicU64,
    /// Responses dequeued from the shared TX ring (sent by IFs).
    pub tx_from_ifs: AtomicU64,
    /// Answered-request entries evicted before their time-to-live ran out
    /// (a later fragment of such a request would be answered again).
    pub answered_evictions: AtomicU64,
    /// Shed notices still waiting for room on their IF's ring when the IF
    /// unregistered or the if-manager stopped; freed.
    pub notices_dropped: AtomicU64,
    /// The NIC's counters, as the RX lcore last read them.
    pub port: PortCounterCells,
}

impl Default for Counters {
    fn default() -> Self {
        Counters {
            rx_packets: AtomicU64::new(0),
            outcomes: Default::default(),
            not_for_us: Default::default(),
            malformed: std::array::from_fn(|_| AtomicU64::new(0)),
            tx_sent: AtomicU64::new(0),
            tx_dropped: AtomicU64::new(0),
            tx_from_ifs: AtomicU64::new(0),
            answered_evictions: AtomicU64::new(0),
            notices_dropped: AtomicU64::new(0),
            port: PortCounterCells::default(),
        }
    }
}

impl Counters {
    /// Records one frame's outcome.
    #[inline]
    pub fn record(&self, outcome: Outcome) {
        self.record_n(outcome, 1);
    }

    /// Records `n` frames with the same outcome.
    #[inline]
    pub fn record_n(&self, outcome: Outcome, n: u64) {
        bump(&self.outcomes[outcome as usize], n);
    }

    /// Records one frame that was not for us, with its reason.
    #[inline]
    pub fn record_not_for_us(&self, reason: NotForUsReason) {
        self.record(Outcome::NotForUs);
        bump(&self.not_for_us[reason as usize], 1);
    }

    /// Records one malformed frame, with its reason.
    #[inline]
    pub fn record_malformed(&self, reason: MalformedReason) {
        self.record(Outcome::Malformed);
        bump(&self.malformed[reason.index()], 1);
    }

    /// Current value of one outcome counter.
    pub fn get(&self, outcome: Outcome) -> u64 {
        self.outcomes[outcome as usize].load(Ordering::Relaxed)
    }

    /// Sum of all outcome counters (equals `rx_packets` once the RX loop
    /// has finished with the burst it is on).
    pub fn outcomes_total(&self) -> u64 {
        self.outcomes
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .sum()
    }

    /// The counters as one JSON object (zero-valued reasons included, so a
    /// reader can rely on every key being present).
    pub fn to_json(&self) -> Value {
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let outcomes: Map<String, Value> = Outcome::ALL
            .iter()
            .map(|o| (o.name().to_string(), json!(self.get(*o))))
            .collect();
        let not_for_us: Map<String, Value> = NotForUsReason::ALL
            .iter()
            .map(|r| {
                (
                    r.name().to_string(),
                    json!(load(&self.not_for_us[*r as usize])),
                )
            })
            .collect();
        let malformed: Map<String, Value> = MalformedReason::all()
            .map(|r| (r.name(), json!(load(&self.malformed[r.index()]))))
            .collect();
        json!({
            "rx_packets": load(&self.rx_packets),
            "outcomes": outcomes,
            "not_for_us": not_for_us,
            "malformed": malformed,
            "tx": {
                "sent": load(&self.tx_sent),
                "dropped": load(&self.tx_dropped),
                "from_ifs": load(&self.tx_from_ifs),
            },
            "answered_evictions": load(&self.answered_evictions),
            "notices_dropped": load(&self.notices_dropped),
            "port": self.port.to_json(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_outcome_and_reason_has_its_own_counter() {
        let c = Counters::default();
        c.record(Outcome::Delivered);
        c.record(Outcome::Delivered);
        c.record_not_for_us(NotForUsReason::WrongPort);
        for r in MalformedReason::all() {
            c.record_malformed(r);
        }
        let j = c.to_json();
        assert_eq!(j["outcomes"]["delivered"], 2);
        assert_eq!(j["outcomes"]["not_for_us"], 1);
        assert_eq!(j["not_for_us"]["wrong_port"], 1);
        assert_eq!(j["not_for_us"]["not_ipv4_udp"], 0);
        let n = MalformedReason::all().count();
        assert_eq!(j["outcomes"]["malformed"], n as u64);
        let m = j["malformed"].as_object().unwrap();
        assert_eq!(m.len(), n, "one distinct counter per malformed reason");
        assert!(m.values().all(|v| v == 1));
        assert_eq!(c.outcomes_total(), 3 + n as u64);
    }

    #[test]
    fn the_counters_parse_as_the_typed_stats_the_orchestrator_reads() {
        let c = Counters::default();
        c.record(Outcome::Delivered);
        c.record_not_for_us(NotForUsReason::WrongPort);
        bump(&c.tx_sent, 3);
        c.port.publish(&dpdk::PortStats {
            ipackets: 2,
            imissed: 1,
            ..dpdk::PortStats::default()
        });
        let mut j = c.to_json();
        j["ifs"] = serde_json::json!([]); // the stats reply's routes
        let typed: kp_schema::messages::IfManagerCounters = serde_json::from_value(j).unwrap();
        assert_eq!(typed.outcomes["delivered"], 1);
        assert_eq!(typed.outcomes.len(), Outcome::ALL.len());
        assert_eq!(typed.not_for_us["wrong_port"], 1);
        assert_eq!(typed.malformed.len(), MalformedReason::all().count());
        assert_eq!(typed.tx.sent, 3);
        assert_eq!((typed.port.ipackets, typed.port.imissed), (2, 1));
    }
}
