//! The manifest: what kp-gen put in a pcap, and what the platform must make
//! of it.
//!
//! `kp-gen --manifest FILE` writes one [`Manifest`] as JSON. Tests of the
//! if-manager and of the inference functions compare their counters and
//! answers against it, so every number here is exact and every field's
//! meaning is stated on it. Vocabulary:
//!
//! - a **packet** is one record of the pcap (one Ethernet frame);
//! - a **well-formed fragment** is a packet that kp-wire's parsers accept as
//!   a request fragment for the platform's UDP port (see
//!   [`crate::fault::classify`]): originals, duplicates and disagreeing
//!   fragments are well-formed; injected faults never are;
//! - a **request** is one (src ip, src port, if_id, request_id);
//! - the **completing fragment** of a request is the first occurrence of
//!   the last of its distinct indices to arrive. kp-gen places every
//!   duplicate and the disagreeing fragment of a request before its
//!   completing fragment in the pcap (the disagreeing fragment *is* the
//!   completing one), so no well-formed fragment of a request ever follows
//!   the moment the platform could answer it.
//!
//! Field names are stable; new fields may be added.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use serde::{Deserialize, Serialize};

use crate::fault::FaultKind;

/// Version of the manifest's layout.
pub const MANIFEST_FORMAT: u32 = 1;

/// Everything kp-gen wrote, and what must come of it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// [`MANIFEST_FORMAT`].
    pub format: u32,
    /// The generator's settings.
    pub config: ManifestConfig,
    /// The deployed IFs the expectations assume (`--deployed`): if_id ->
    /// the input size in bytes its model takes. `None` when not given; then
    /// every `expected` field is `null` too.
    pub deployed: Option<BTreeMap<u16, u32>>,
    /// One entry per request, in request_id order.
    pub requests: Vec<RequestEntry>,
    /// Sums over the whole pcap.
    pub totals: Totals,
}

/// The generator's settings, as used.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ManifestConfig {
    /// `--seed`.
    pub seed: u64,
    /// Input tensor shape, `HxWxC`.
    pub shape: String,
    /// Bytes of one request's payload (`total_len` of well-formed
    /// fragments).
    pub payload_len: u32,
    /// Payload bytes per fragment at most (`--frag-size`).
    pub frag_size: u32,
    /// Requests in flight in the round-robin interleave (`--interleave`).
    pub interleave: u32,
    /// Packets per shuffled window (`--shuffle-window`; 0 or 1: none).
    pub shuffle_window: u32,
    /// Time between consecutive packets' pcap timestamps, ns.
    pub gap_ns: u64,
    /// pcap timestamp of the first packet, ns since the Unix epoch.
    pub start_ts_ns: u64,
    /// Source MAC of every frame (`aa:bb:...`).
    pub src_mac: String,
    /// Destination MAC of every frame but ARP faults (broadcast).
    pub dst_mac: String,
    /// 802.1Q tag control information, if frames carry a VLAN tag.
    pub vlan_tci: Option<u16>,
    /// Source IPv4 address of every frame.
    pub src_ip: Ipv4Addr,
    /// Destination IPv4 address (the platform's).
    pub dst_ip: Ipv4Addr,
    /// Source UDP ports, used round-robin by request number.
    pub src_ports: Vec<u16>,
    /// Destination UDP port (the platform's).
    pub dst_port: u16,
}

/// What the platform must answer for one request, per docs/PROTOCOL.md,
/// assuming the deployment in [`Manifest::deployed`], that the whole
/// request arrives within the reassembly timeout, and that nothing is
/// shed (an `ok` request may still come back `overloaded` under load).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Expected {
    /// No well-formed fragment of it is in the pcap: no answer at all.
    None,
    /// Status 0: every fragment present, consistent, right size.
    Ok,
    /// Status 1: its if_id is not deployed (answered by the if-manager).
    UnknownIf,
    /// Status 2: total_len is not the model's input size, or one of its
    /// fragments disagrees with the others.
    BadRequest,
    /// Status 3: some fragment index never arrives.
    Incomplete,
}

impl Expected {
    /// Every outcome, in report order.
    pub const ALL: [Expected; 5] = [
        Expected::Ok,
        Expected::UnknownIf,
        Expected::BadRequest,
        Expected::Incomplete,
        Expected::None,
    ];

    /// Name in the manifest.
    pub fn name(self) -> &'static str {
        match self {
            Expected::None => "none",
            Expected::Ok => "ok",
            Expected::UnknownIf => "unknown_if",
            Expected::BadRequest => "bad_request",
            Expected::Incomplete => "incomplete",
        }
    }
}

/// Which header field a disagreeing fragment changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DisagreeField {
    /// `total_len` differs (the fragment's payload follows its own,
    /// different geometry, so it is well-formed on its own).
    TotalLen,
    /// `send_ts_ns` differs by one.
    SendTsNs,
}

/// The one disagreeing fragment of a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Disagreement {
    /// Its `frag_index`. The well-formed original of this index is NOT in
    /// the pcap: the disagreeing fragment replaces it, and it is the
    /// request's last well-formed fragment in pcap order.
    pub index: u16,
    /// The field that differs.
    pub field: DisagreeField,
    /// The field's value in the disagreeing fragment.
    pub value: u64,
}

/// A fault datagram derived from one of a request's fragments.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InjectedFault {
    /// How it is broken.
    pub kind: FaultKind,
    /// The `frag_index` of the fragment it was made from (the fault
    /// itself may carry another index, or none).
    pub from_index: u16,
}

/// One request.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RequestEntry {
    /// Inference function it is for.
    pub if_id: u16,
    /// Its request_id.
    pub request_id: u64,
    /// Source IPv4 address.
    pub src_ip: Ipv4Addr,
    /// Source UDP port.
    pub src_port: u16,
    /// `total_len` of its well-formed fragments (a disagreeing one aside).
    pub total_len: u32,
    /// `frag_count` of all its well-formed fragments.
    pub frag_count: u16,
    /// `send_ts_ns` of its well-formed fragments (a disagreeing one aside):
    /// the pcap timestamp of the request's first packet of any kind.
    pub send_ts_ns: u64,
    /// Distinct fragment indices of which a well-formed, agreeing copy is
    /// in the pcap, ascending (the disagreeing index is not among them).
    pub present: Vec<u16>,
    /// Indices with no copy at all in the pcap (dropped), ascending.
    pub missing: Vec<u16>,
    /// Indices sent twice (one extra, identical copy each), ascending.
    pub duplicated: Vec<u16>,
    /// Indices of the well-formed copies (originals or duplicates) whose
    /// payload bytes kp-gen corrupted, the UDP checksum recomputed, one
    /// entry per corrupted copy, ascending. They are well-formed: nothing
    /// in the protocol can tell (`kp_traffic::gen`, step 11), so they
    /// change no outcome. Absent in manifests older than the field.
    #[serde(default)]
    pub corrupted: Vec<u16>,
    /// The disagreeing fragment, if any.
    pub disagreement: Option<Disagreement>,
    /// Fault datagrams made from this request's fragments. They are never
    /// well-formed fragments, so they do not change its outcome.
    pub faults: Vec<InjectedFault>,
    /// Its well-formed fragments in the pcap: `present.len() +
    /// duplicated.len() + (1 if disagreement)`.
    pub well_formed: u64,
    /// 0-based pcap index of its first well-formed fragment, if any.
    pub first_packet: Option<u64>,
    /// 0-based pcap index of its last well-formed fragment (its completing
    /// fragment when it is complete), if any.
    pub last_packet: Option<u64>,
    /// What the platform must answer; `null` without `--deployed`.
    pub expected: Option<Expected>,
}

/// What the if-manager's counters must read after the whole pcap, for the
/// deployment given (with rings large enough that none is full).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IfManagerExpectation {
    /// `delivered`: well-formed fragments for deployed if_ids.
    pub delivered: u64,
    /// `delivered` split by if_id.
    pub delivered_per_if: BTreeMap<u16, u64>,
    /// `unknown_if_answered`: requests for undeployed if_ids with at least
    /// one well-formed fragment (one UNKNOWN_IF error each).
    pub unknown_if_answered: u64,
    /// `unknown_if_suppressed`: their other well-formed fragments.
    pub unknown_if_suppressed: u64,
    /// `not_for_us`: as [`Totals::not_for_us_total`].
    pub not_for_us: u64,
    /// `malformed`: as [`Totals::malformed_total`].
    pub malformed: u64,
}

/// Sums over the whole pcap. Identities that always hold:
/// `packets = well_formed + malformed_total + not_for_us_total`,
/// `well_formed = originals + duplicates + disagreeing`,
/// `faults = malformed_total + not_for_us_total`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Totals {
    /// Records in the pcap.
    pub packets: u64,
    /// Requests planned (entries in `requests`).
    pub requests: u64,
    /// Sum of `frag_count` over all requests.
    pub fragments: u64,
    /// Well-formed fragments (all that kp-wire accepts for the platform's
    /// port).
    pub well_formed: u64,
    /// Well-formed fragments by if_id (keys are if_ids as strings).
    pub well_formed_per_if: BTreeMap<u16, u64>,
    /// Well-formed fragments that are the first, agreeing copy of their
    /// index.
    pub originals: u64,
    /// Extra identical copies (each is a duplicate the reassembler counts).
    pub duplicates: u64,
    /// Fragments dropped from the stream (in no packet at all).
    pub missing: u64,
    /// Disagreeing fragments (one per request that has one).
    pub disagreeing: u64,
    /// Well-formed fragments with corrupted payload bytes (counted in
    /// `originals` or `duplicates` too). Absent in older manifests.
    #[serde(default)]
    pub corrupted: u64,
    /// Fault datagrams, by [`FaultKind`] name (every kind, zeros included).
    pub faults_by_kind: BTreeMap<String, u64>,
    /// All fault datagrams.
    pub faults: u64,
    /// Malformed packets by the if-manager's counter name:
    /// `frame_<FrameErrorKind::name()>` and `header_<MalformedKind::name()>`
    /// for every kind kp-wire has, zeros included (`frame_not_ipv4` and
    /// `frame_not_udp` are always 0: such frames are not for us). The
    /// if-manager's own `segmented` has no key: kp-gen never makes one.
    pub malformed: BTreeMap<String, u64>,
    /// All malformed packets.
    pub malformed_total: u64,
    /// Packets not for us by the if-manager's reason name (`not_ipv4_udp`,
    /// `wrong_port`; both always present). kp-gen never sends to another
    /// IPv4 address, so the if-manager's `wrong_address` stays 0.
    pub not_for_us: BTreeMap<String, u64>,
    /// All packets not for us.
    pub not_for_us_total: u64,
    /// Requests by expected outcome name (`ok`, `unknown_if`,
    /// `bad_request`, `incomplete`, `none`; all keys present); `null`
    /// without `--deployed`.
    pub expected: Option<BTreeMap<String, u64>>,
    /// The if-manager's counters; `null` without `--deployed`.
    pub if_manager: Option<IfManagerExpectation>,
}
