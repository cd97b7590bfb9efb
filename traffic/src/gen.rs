//! Turning requests into a stream of frames, faults included.
//!
//! [`generate`] plans a whole run from a [`GenConfig`] and the run's
//! [`Inputs`]: which if_id and source port each request has, which of its
//! fragments are dropped, duplicated, replaced by a disagreeing copy, which
//! broken datagrams are made from them, and in what order every packet goes
//! out. The plan is small (a few bytes per packet); frames are built one at
//! a time when written ([`Generated::write_pcap`]), so a pcap of millions of
//! packets needs no more memory than its plan.
//!
//! Order of a run, all drawn from one `StdRng` seeded with `--seed`, so the
//! same settings and inputs give the same pcap byte for byte:
//!
//! 1. requests `0..N`: request_id `first_request_id + i`, source port
//!    `src_ports[i % len]`, if_id round-robin over `--if-ids` or drawn
//!    from the `--if-mix` weights;
//! 2. missing fragments (rate: each fragment independently; count: that
//!    many distinct fragments, uniformly);
//! 3. each request's *completing index*: its highest index still present;
//! 4. disagreeing fragments: only for requests with at least two present
//!    indices; the completing index's fragment is replaced by a copy whose
//!    `total_len` (with a payload following its own geometry) or
//!    `send_ts_ns` differs;
//! 5. duplicates: of present indices other than the completing one;
//! 6. fault datagrams (rate: after each present fragment with that
//!    probability, a kind drawn uniformly from the allowed kinds; count:
//!    that many of each allowed kind, each from a uniformly drawn fragment);
//! 7. per request, its packets in index order, each duplicate at a random
//!    place after its original and before the completing fragment, each
//!    fault anywhere;
//! 8. round-robin across `--interleave` requests in flight;
//! 9. a random permutation within each window of `--shuffle-window`
//!    packets;
//! 10. for every request, its completing fragment swapped into the place of
//!     its last well-formed packet, so duplicates and the disagreeing
//!     fragment always arrive before the request can complete;
//! 11. corrupted payloads (`--corrupt-rate`/`--corrupt-count`): of the
//!     originals and duplicates in packet order, drawn last so that a run
//!     without them is the same pcap as before they existed. A corrupted
//!     fragment has 1 to 4 bytes of its *payload* (never the 32-byte
//!     kneepoint header) changed, a valid IPv4 header checksum and a UDP
//!     checksum computed over the changed bytes: what a sender that
//!     corrupts data before checksumming it puts on the wire. Nothing in
//!     docs/PROTOCOL.md (which has no integrity check of its own) or below
//!     it can tell such a fragment from a good one, so it is well-formed
//!     and changes no outcome, only, perhaps, the model's answer.
//!
//! Packet `k` gets the pcap timestamp `start_ts_ns + k * gap_ns`; a
//! request's `send_ts_ns` is the timestamp of its first packet.

use std::collections::{BTreeMap, VecDeque};
use std::io::Write;
use std::net::Ipv4Addr;
use std::str::FromStr;

use kp_wire::{
    emit_udp_frame, fragment_range, FragmentRepr, FrameAddr, FrameErrorKind, IfId, MacAddr,
    MalformedKind, HEADER_LEN,
};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use crate::fault::{FaultKind, NotForUs, Reason, Verdict};
use crate::input::Inputs;
use crate::manifest::{
    DisagreeField, Disagreement, Expected, IfManagerExpectation, InjectedFault, Manifest,
    ManifestConfig, RequestEntry, Totals, MANIFEST_FORMAT,
};
use crate::pcap::PcapWriter;

/// Payload bytes per fragment unless told otherwise: GSLICE's 1 KiB, which
/// keeps a fragment (1024 + 32 + 42 bytes of headers) well inside a
/// standard 1500-byte MTU.
pub const DEFAULT_FRAG_SIZE: usize = 1024;

/// Why a run cannot be generated.
#[derive(Debug, thiserror::Error)]
pub enum GenError {
    /// `--frag-size 0`.
    #[error("fragment size must be at least 1 byte")]
    ZeroFragSize,
    /// The payload would need more than 65535 fragments.
    #[error("a {payload_len}-byte payload in {frag_size}-byte fragments needs more than 65535 fragments")]
    TooManyFragments {
        /// Request payload size.
        payload_len: usize,
        /// Fragment size.
        frag_size: usize,
    },
    /// Payloads must be 1 byte or more (docs/PROTOCOL.md: total_len >= 1).
    #[error("request payloads must not be empty")]
    EmptyPayload,
    /// A rate outside 0..=1.
    #[error("{what} rate {rate} is not within 0..=1")]
    BadRate {
        /// Which fault.
        what: &'static str,
        /// The rate given.
        rate: f64,
    },
    /// A count larger than what it can be drawn from.
    #[error("{what}: asked for {asked}, only {available} eligible")]
    CountTooLarge {
        /// Which fault.
        what: &'static str,
        /// The count given.
        asked: u64,
        /// How many could be chosen.
        available: u64,
    },
    /// Fault datagrams need a fragment to be made from.
    #[error("fault datagrams need at least one request")]
    NoFragmentsForFaults,
    /// An empty list of if_ids, weights, source ports or fault kinds.
    #[error("{0} must not be empty")]
    Empty(&'static str),
}

/// How if_ids are given to requests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IfMix {
    /// Request `i` gets `ids[i % len]` (`--if-ids 1,2`).
    RoundRobin(Vec<u16>),
    /// Each request draws an if_id with these weights (`--if-mix 1:3,2:1`).
    Weighted(Vec<(u16, u32)>),
}

impl IfMix {
    /// Parses `--if-ids`: `1,2,7`.
    pub fn parse_ids(s: &str) -> Result<IfMix, String> {
        let ids = s
            .split(',')
            .map(|w| {
                w.trim()
                    .parse::<u16>()
                    .map_err(|_| format!("bad if_id {w:?} in {s:?}"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(IfMix::RoundRobin(ids))
    }

    /// Parses `--if-mix`: `1:3,2:1` (if_id:weight; a bare if_id weighs 1).
    pub fn parse_weights(s: &str) -> Result<IfMix, String> {
        let pairs = s
            .split(',')
            .map(|w| {
                let (id, weight) = w.split_once(':').unwrap_or((w, "1"));
                let id = id
                    .trim()
                    .parse::<u16>()
                    .map_err(|_| format!("bad if_id in {w:?}"))?;
                let weight = weight
                    .trim()
                    .parse::<u32>()
                    .map_err(|_| format!("bad weight in {w:?}"))?;
                Ok((id, weight))
            })
            .collect::<Result<Vec<_>, String>>()?;
        if pairs.iter().all(|(_, w)| *w == 0) {
            return Err(format!("--if-mix {s:?}: all weights are 0"));
        }
        Ok(IfMix::Weighted(pairs))
    }
}

/// How much of a fault to inject.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Amount {
    /// Each candidate independently with this probability.
    Rate(f64),
    /// Exactly this many (for fault datagrams: this many of each kind).
    Count(u64),
}

/// Which faults a run carries.
#[derive(Clone, Debug, PartialEq)]
pub struct FaultPlan {
    /// Duplicate fragments.
    pub duplicates: Option<Amount>,
    /// Fragments dropped from the stream.
    pub missing: Option<Amount>,
    /// Requests given one disagreeing fragment.
    pub disagree: Option<Amount>,
    /// Fault datagrams (malformed and not-for-us).
    pub malformed: Option<Amount>,
    /// Kinds of fault datagrams allowed.
    pub malformed_kinds: Vec<FaultKind>,
    /// Well-formed fragments (originals and duplicates) whose payload bytes
    /// are corrupted, the UDP checksum recomputed (module doc, step 11).
    pub corrupt: Option<Amount>,
}

impl Default for FaultPlan {
    fn default() -> Self {
        FaultPlan {
            duplicates: None,
            missing: None,
            disagree: None,
            malformed: None,
            malformed_kinds: FaultKind::ALL.to_vec(),
            corrupt: None,
        }
    }
}

/// Addresses and ports of the frames.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoints {
    /// Source MAC.
    pub src_mac: MacAddr,
    /// Destination MAC (the platform port's, unless it is promiscuous).
    pub dst_mac: MacAddr,
    /// 802.1Q TCI of a VLAN tag, if any.
    pub vlan_tci: Option<u16>,
    /// Source IPv4 address.
    pub src_ip: Ipv4Addr,
    /// Destination IPv4 address.
    pub dst_ip: Ipv4Addr,
    /// Source UDP ports, one per emulated client, used round-robin.
    pub src_ports: Vec<u16>,
    /// The platform's UDP port.
    pub dst_port: u16,
}

impl Default for Endpoints {
    fn default() -> Self {
        Endpoints {
            src_mac: MacAddr([0x02, 0, 0, 0, 0, 0x01]),
            dst_mac: MacAddr([0x02, 0, 0, 0, 0, 0x02]),
            vlan_tci: None,
            src_ip: Ipv4Addr::new(10, 77, 0, 1),
            dst_ip: Ipv4Addr::new(10, 77, 0, 2),
            src_ports: vec![40000],
            dst_port: 9000,
        }
    }
}

/// Everything a run depends on besides its payloads.
#[derive(Clone, Debug, PartialEq)]
pub struct GenConfig {
    /// Number of requests.
    pub requests: u64,
    /// if_id of each request.
    pub if_mix: IfMix,
    /// Payload bytes per fragment at most.
    pub frag_size: usize,
    /// Requests in flight in the round-robin interleave (1: one after the
    /// other).
    pub interleave: usize,
    /// Packets per randomly permuted window (0 or 1: no shuffling).
    pub shuffle_window: usize,
    /// Faults.
    pub faults: FaultPlan,
    /// Time between consecutive packets, ns.
    pub gap_ns: u64,
    /// Timestamp of the first packet, ns since the Unix epoch.
    pub start_ts_ns: u64,
    /// Addresses.
    pub endpoints: Endpoints,
    /// Seed of every random choice.
    pub seed: u64,
    /// request_id of the first request.
    pub first_request_id: u64,
    /// Deployed IFs (if_id -> model input bytes) for the expectations.
    pub deployed: Option<BTreeMap<u16, u32>>,
}

impl Default for GenConfig {
    fn default() -> Self {
        GenConfig {
            requests: 1,
            if_mix: IfMix::RoundRobin(vec![1]),
            frag_size: DEFAULT_FRAG_SIZE,
            interleave: 1,
            shuffle_window: 0,
            faults: FaultPlan::default(),
            gap_ns: 10_000,
            start_ts_ns: 0,
            endpoints: Endpoints::default(),
            seed: 0,
            first_request_id: 1,
            deployed: None,
        }
    }
}

/// What one packet of the plan is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Slot {
    /// The agreeing copy of a fragment.
    Original,
    /// An extra identical copy.
    Duplicate,
    /// The disagreeing replacement of the completing fragment.
    Disagree,
    /// A fault datagram made from the fragment, with its salt.
    Fault(FaultKind, u64),
}

impl Slot {
    fn is_well_formed(self) -> bool {
        !matches!(self, Slot::Fault(..))
    }
}

/// One packet of the plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Packet {
    request: u32,
    index: u16,
    slot: Slot,
}

/// One request of the plan.
#[derive(Clone, Debug)]
struct Plan {
    if_id: u16,
    request_id: u64,
    src_port: u16,
    send_ts_ns: u64,
    completing: Option<u16>,
    disagreement: Option<Disagreement>,
    duplicated: Vec<u16>,
    faults: Vec<(FaultKind, u16, u64)>,
}

/// A planned run: call [`Generated::write_pcap`] to produce its pcap.
#[derive(Debug)]
pub struct Generated {
    endpoints: Endpoints,
    total_len: u32,
    frag_count: u16,
    gap_ns: u64,
    start_ts_ns: u64,
    plans: Vec<Plan>,
    order: Vec<Packet>,
    /// Per packet of `order`: the salt of its payload corruption, if any.
    corrupt: Vec<Option<u64>>,
    manifest: Manifest,
}

fn check_rate(what: &'static str, a: Option<Amount>) -> Result<(), GenError> {
    match a {
        Some(Amount::Rate(rate)) if !(0.0..=1.0).contains(&rate) => {
            Err(GenError::BadRate { what, rate })
        }
        _ => Ok(()),
    }
}

/// Picks `count` distinct values of `0..available` in ascending order.
fn pick(
    rng: &mut StdRng,
    what: &'static str,
    available: usize,
    count: u64,
) -> Result<Vec<usize>, GenError> {
    if count > available as u64 {
        return Err(GenError::CountTooLarge {
            what,
            asked: count,
            available: available as u64,
        });
    }
    let mut v = rand::seq::index::sample(rng, available, count as usize).into_vec();
    v.sort_unstable();
    Ok(v)
}

/// Writes a fragment header into the first [`HEADER_LEN`] bytes of `udp`.
fn put_header(repr: &FragmentRepr, udp: &mut [u8]) {
    repr.emit_header(&mut udp[..HEADER_LEN])
        .expect("HEADER_LEN bytes");
}

/// Plans a run. Every request's payload is `inputs.get(i)`; they all have
/// the length of `inputs.shape()`.
pub fn generate(cfg: &GenConfig, inputs: &Inputs) -> Result<Generated, GenError> {
    let payload_len = inputs.shape().len();
    if payload_len == 0 {
        return Err(GenError::EmptyPayload);
    }
    if cfg.frag_size == 0 {
        return Err(GenError::ZeroFragSize);
    }
    let frag_count = u16::try_from(payload_len.div_ceil(cfg.frag_size)).map_err(|_| {
        GenError::TooManyFragments {
            payload_len,
            frag_size: cfg.frag_size,
        }
    })?;
    let total_len = u32::try_from(payload_len).map_err(|_| GenError::TooManyFragments {
        payload_len,
        frag_size: cfg.frag_size,
    })?;
    let f = &cfg.faults;
    check_rate("--dup", f.duplicates)?;
    check_rate("--missing", f.missing)?;
    check_rate("--disagree", f.disagree)?;
    check_rate("--malformed", f.malformed)?;
    check_rate("--corrupt", f.corrupt)?;
    if cfg.endpoints.src_ports.is_empty() {
        return Err(GenError::Empty("the source port list"));
    }
    if f.malformed.is_some() && f.malformed_kinds.is_empty() {
        return Err(GenError::Empty("the list of fault kinds"));
    }

    let mut rng = StdRng::seed_from_u64(cfg.seed);
    let n = usize::try_from(cfg.requests).expect("request count fits memory");
    let fc = usize::from(frag_count);
    let fragments = n * fc;

    // 1. Requests.
    let mut plans: Vec<Plan> = Vec::with_capacity(n);
    for i in 0..n {
        let if_id = match &cfg.if_mix {
            IfMix::RoundRobin(ids) if ids.is_empty() => {
                return Err(GenError::Empty("the if_id list"))
            }
            IfMix::RoundRobin(ids) => ids[i % ids.len()],
            IfMix::Weighted(w) => {
                let sum: u64 = w.iter().map(|(_, w)| u64::from(*w)).sum();
                if sum == 0 {
                    return Err(GenError::Empty("the if_id weights"));
                }
                let mut x = rng.random_range(0..sum);
                let mut chosen = w[0].0;
                for (id, weight) in w {
                    if x < u64::from(*weight) {
                        chosen = *id;
                        break;
                    }
                    x -= u64::from(*weight);
                }
                chosen
            }
        };
        plans.push(Plan {
            if_id,
            request_id: cfg.first_request_id.wrapping_add(i as u64),
            src_port: cfg.endpoints.src_ports[i % cfg.endpoints.src_ports.len()],
            send_ts_ns: cfg.start_ts_ns,
            completing: None,
            disagreement: None,
            duplicated: Vec::new(),
            faults: Vec::new(),
        });
    }

    // 2. Missing fragments (global fragment number g = request * fc + index).
    let mut missing = vec![false; fragments];
    match f.missing {
        Some(Amount::Rate(r)) if r > 0.0 => {
            missing.iter_mut().for_each(|m| *m = rng.random_bool(r))
        }
        Some(Amount::Count(c)) => pick(&mut rng, "--missing-count", fragments, c)?
            .into_iter()
            .for_each(|g| missing[g] = true),
        _ => {}
    }

    // 3. Completing indices.
    let mut present_count = vec![0usize; n];
    for (i, plan) in plans.iter_mut().enumerate() {
        let m = &missing[i * fc..(i + 1) * fc];
        present_count[i] = m.iter().filter(|x| !**x).count();
        plan.completing = m.iter().rposition(|x| !*x).map(|idx| idx as u16);
    }

    // 4. Disagreeing fragments.
    let eligible: Vec<usize> = (0..n).filter(|i| present_count[*i] >= 2).collect();
    let chosen: Vec<usize> = match f.disagree {
        Some(Amount::Rate(r)) if r > 0.0 => eligible
            .iter()
            .copied()
            .filter(|_| rng.random_bool(r))
            .collect(),
        Some(Amount::Count(c)) => pick(&mut rng, "--disagree-count", eligible.len(), c)?
            .into_iter()
            .map(|k| eligible[k])
            .collect(),
        _ => Vec::new(),
    };
    for i in chosen {
        let index = plans[i]
            .completing
            .expect("eligible requests have a completing index");
        let field = if rng.random_bool(0.5) {
            DisagreeField::TotalLen
        } else {
            DisagreeField::SendTsNs
        };
        let value = match field {
            DisagreeField::TotalLen => u64::from(other_total_len(total_len, frag_count, index)),
            DisagreeField::SendTsNs => 0, // known once the order is fixed
        };
        plans[i].disagreement = Some(Disagreement {
            index,
            field,
            value,
        });
    }

    // 5. Duplicates.
    let dup_ok = |g: usize| !missing[g] && plans[g / fc].completing != Some((g % fc) as u16);
    let dups: Vec<usize> = match f.duplicates {
        Some(Amount::Rate(r)) if r > 0.0 => (0..fragments)
            .filter(|g| dup_ok(*g) && rng.random_bool(r))
            .collect(),
        Some(Amount::Count(c)) => {
            let eligible: Vec<usize> = (0..fragments).filter(|g| dup_ok(*g)).collect();
            pick(&mut rng, "--dup-count", eligible.len(), c)?
                .into_iter()
                .map(|k| eligible[k])
                .collect()
        }
        _ => Vec::new(),
    };
    for g in dups {
        plans[g / fc].duplicated.push((g % fc) as u16);
    }

    // 6. Fault datagrams.
    let kinds = &f.malformed_kinds;
    match f.malformed {
        Some(Amount::Rate(r)) if r > 0.0 => {
            for g in 0..fragments {
                if !missing[g] && rng.random_bool(r) {
                    let kind = kinds[rng.random_range(0..kinds.len())];
                    plans[g / fc]
                        .faults
                        .push((kind, (g % fc) as u16, rng.random()));
                }
            }
        }
        Some(Amount::Count(c)) if c > 0 => {
            if fragments == 0 {
                return Err(GenError::NoFragmentsForFaults);
            }
            for kind in kinds {
                for _ in 0..c {
                    let g = rng.random_range(0..fragments);
                    plans[g / fc]
                        .faults
                        .push((*kind, (g % fc) as u16, rng.random()));
                }
            }
        }
        _ => {}
    }

    // 7 + 8. Per-request packet lists, interleaved round-robin.
    let mut order: Vec<Packet> = Vec::with_capacity(fragments + fragments / 16);
    let mut next = 0usize;
    let mut in_flight: Vec<VecDeque<Packet>> = Vec::new();
    let width = cfg.interleave.max(1);
    let refill = |rng: &mut StdRng, next: &mut usize| -> Option<VecDeque<Packet>> {
        while *next < n {
            let i = *next;
            *next += 1;
            let list = request_packets(rng, i, &plans[i], &missing[i * fc..(i + 1) * fc]);
            if !list.is_empty() {
                return Some(list);
            }
        }
        None
    };
    while in_flight.len() < width {
        match refill(&mut rng, &mut next) {
            Some(l) => in_flight.push(l),
            None => break,
        }
    }
    let mut cursor = 0;
    while !in_flight.is_empty() {
        let slot = cursor % in_flight.len();
        let p = in_flight[slot]
            .pop_front()
            .expect("lists in flight are never empty");
        order.push(p);
        if in_flight[slot].is_empty() {
            match refill(&mut rng, &mut next) {
                Some(l) => {
                    in_flight[slot] = l;
                    cursor = slot + 1;
                }
                None => {
                    in_flight.remove(slot);
                    cursor = slot;
                }
            }
        } else {
            cursor = slot + 1;
        }
    }

    // 9. Shuffle windows.
    if cfg.shuffle_window > 1 {
        for w in order.chunks_mut(cfg.shuffle_window) {
            w.shuffle(&mut rng);
        }
    }

    // 10. Completing fragments last among each request's well-formed ones.
    let mut last_pos: Vec<Option<usize>> = vec![None; n];
    let mut completing_pos: Vec<Option<usize>> = vec![None; n];
    for (k, p) in order.iter().enumerate() {
        if p.slot.is_well_formed() {
            let r = p.request as usize;
            last_pos[r] = Some(k);
            if matches!(p.slot, Slot::Original | Slot::Disagree)
                && plans[r].completing == Some(p.index)
            {
                completing_pos[r] = Some(k);
            }
        }
    }
    for r in 0..n {
        if let (Some(c), Some(l)) = (completing_pos[r], last_pos[r]) {
            order.swap(c, l);
        }
    }

    // Timestamps: send_ts_ns is the time of the request's first packet.
    let mut seen = vec![false; n];
    for (k, p) in order.iter().enumerate() {
        let r = p.request as usize;
        if !seen[r] {
            seen[r] = true;
            plans[r].send_ts_ns = cfg.start_ts_ns + k as u64 * cfg.gap_ns;
        }
    }
    for plan in &mut plans {
        if let Some(d) = plan
            .disagreement
            .as_mut()
            .filter(|d| d.field == DisagreeField::SendTsNs)
        {
            d.value = plan.send_ts_ns.wrapping_add(1);
        }
    }

    // 11. Corrupted payloads, drawn last (see the module doc).
    let mut corrupt = vec![None; order.len()];
    let candidates: Vec<usize> = order
        .iter()
        .enumerate()
        .filter(|(_, p)| matches!(p.slot, Slot::Original | Slot::Duplicate))
        .map(|(k, _)| k)
        .collect();
    let chosen: Vec<usize> = match f.corrupt {
        Some(Amount::Rate(r)) if r > 0.0 => candidates
            .iter()
            .copied()
            .filter(|_| rng.random_bool(r))
            .collect(),
        Some(Amount::Count(c)) => pick(&mut rng, "--corrupt-count", candidates.len(), c)?
            .into_iter()
            .map(|i| candidates[i])
            .collect(),
        _ => Vec::new(),
    };
    for k in chosen {
        corrupt[k] = Some(rng.random());
    }

    let manifest = build_manifest(
        cfg, inputs, total_len, frag_count, &plans, &missing, &order, &corrupt,
    );
    Ok(Generated {
        endpoints: cfg.endpoints.clone(),
        total_len,
        frag_count,
        gap_ns: cfg.gap_ns,
        start_ts_ns: cfg.start_ts_ns,
        plans,
        order,
        corrupt,
        manifest,
    })
}

/// A `total_len` close to `total_len` under which `frag_count` fragments
/// are still a valid geometry (so the disagreeing fragment is well-formed
/// on its own) and fragment `index` exists.
fn other_total_len(total_len: u32, frag_count: u16, index: u16) -> u32 {
    (1..=u32::from(u16::MAX))
        .flat_map(|d| [total_len.checked_add(d), total_len.checked_sub(d)])
        .flatten()
        .find(|t| {
            *t >= 1
                && fragment_range(*t, frag_count, frag_count - 1).is_some()
                && fragment_range(*t, frag_count, index).is_some()
        })
        .expect("some nearby total_len fits any frag_count")
}

/// Step 7: one request's packets, before interleaving.
fn request_packets(rng: &mut StdRng, i: usize, plan: &Plan, missing: &[bool]) -> VecDeque<Packet> {
    let request = i as u32;
    let mut list: Vec<Packet> = missing
        .iter()
        .enumerate()
        .filter(|(_, m)| !**m)
        .map(|(idx, _)| {
            let index = idx as u16;
            let slot = match plan.disagreement {
                Some(d) if d.index == index => Slot::Disagree,
                _ => Slot::Original,
            };
            Packet {
                request,
                index,
                slot,
            }
        })
        .collect();
    for &index in &plan.duplicated {
        let at = list
            .iter()
            .position(|p| p.index == index && p.slot == Slot::Original)
            .expect("duplicates are of present fragments");
        // Somewhere after its original, before the completing (last) one.
        let pos = rng.random_range(at + 1..list.len());
        list.insert(
            pos,
            Packet {
                request,
                index,
                slot: Slot::Duplicate,
            },
        );
    }
    for &(kind, index, salt) in &plan.faults {
        let pos = rng.random_range(0..=list.len());
        list.insert(
            pos,
            Packet {
                request,
                index,
                slot: Slot::Fault(kind, salt),
            },
        );
    }
    list.into()
}

#[allow(clippy::too_many_arguments)]
fn build_manifest(
    cfg: &GenConfig,
    inputs: &Inputs,
    total_len: u32,
    frag_count: u16,
    plans: &[Plan],
    missing: &[bool],
    order: &[Packet],
    corrupt: &[Option<u64>],
) -> Manifest {
    let fc = usize::from(frag_count);
    let n = plans.len();
    let mut well_formed = vec![0u64; n];
    let mut corrupted: Vec<Vec<u16>> = vec![Vec::new(); n];
    let mut first_packet = vec![None; n];
    let mut last_packet = vec![None; n];
    // Every counter name is present, zeros included, so a reader can
    // compare maps key by key with the if-manager's JSON.
    let mut t = Totals {
        packets: order.len() as u64,
        requests: n as u64,
        fragments: (n * fc) as u64,
        faults_by_kind: FaultKind::ALL
            .iter()
            .map(|k| (k.name().to_string(), 0))
            .collect(),
        malformed: FrameErrorKind::ALL
            .iter()
            .map(|k| Reason::Frame(*k))
            .chain(MalformedKind::ALL.iter().map(|k| Reason::Header(*k)))
            .map(|r| (r.name(), 0))
            .collect(),
        not_for_us: [NotForUs::NotIpv4Udp, NotForUs::WrongPort]
            .iter()
            .map(|r| (r.name().to_string(), 0))
            .collect(),
        ..Totals::default()
    };
    for (k, p) in order.iter().enumerate() {
        let r = p.request as usize;
        match p.slot {
            Slot::Fault(kind, _) => {
                *t.faults_by_kind.entry(kind.name().to_string()).or_default() += 1;
                t.faults += 1;
                match kind.expected() {
                    Verdict::Malformed(reason) => {
                        *t.malformed.entry(reason.name()).or_default() += 1;
                        t.malformed_total += 1;
                    }
                    Verdict::NotForUs(why) => {
                        *t.not_for_us.entry(why.name().to_string()).or_default() += 1;
                        t.not_for_us_total += 1;
                    }
                    Verdict::Fragment { .. } => unreachable!("faults are never well-formed"),
                }
            }
            slot => {
                match slot {
                    Slot::Original => t.originals += 1,
                    Slot::Duplicate => t.duplicates += 1,
                    _ => t.disagreeing += 1,
                }
                t.well_formed += 1;
                if corrupt[k].is_some() {
                    t.corrupted += 1;
                    corrupted[r].push(p.index);
                }
                *t.well_formed_per_if.entry(plans[r].if_id).or_default() += 1;
                well_formed[r] += 1;
                first_packet[r].get_or_insert(k as u64);
                last_packet[r] = Some(k as u64);
            }
        }
    }
    t.missing = missing.iter().filter(|m| **m).count() as u64;

    let mut requests = Vec::with_capacity(n);
    let mut expected_totals: BTreeMap<String, u64> = Expected::ALL
        .iter()
        .map(|e| (e.name().to_string(), 0))
        .collect();
    let mut im = IfManagerExpectation::default();
    for (i, plan) in plans.iter().enumerate() {
        let m = &missing[i * fc..(i + 1) * fc];
        let missing_idx: Vec<u16> = (0..frag_count).filter(|x| m[usize::from(*x)]).collect();
        let present: Vec<u16> = (0..frag_count)
            .filter(|x| !m[usize::from(*x)] && plan.disagreement.is_none_or(|d| d.index != *x))
            .collect();
        let mut duplicated = plan.duplicated.clone();
        duplicated.sort_unstable();
        corrupted[i].sort_unstable();
        let expected = cfg.deployed.as_ref().map(|deployed| {
            let e = if well_formed[i] == 0 {
                Expected::None
            } else {
                match deployed.get(&plan.if_id) {
                    None => Expected::UnknownIf,
                    Some(len) if *len != total_len => Expected::BadRequest,
                    Some(_) if plan.disagreement.is_some() => Expected::BadRequest,
                    Some(_) if !missing_idx.is_empty() => Expected::Incomplete,
                    Some(_) => Expected::Ok,
                }
            };
            *expected_totals.get_mut(e.name()).expect("all keys present") += 1;
            if deployed.contains_key(&plan.if_id) {
                im.delivered += well_formed[i];
                *im.delivered_per_if.entry(plan.if_id).or_default() += well_formed[i];
            } else if well_formed[i] > 0 {
                im.unknown_if_answered += 1;
                im.unknown_if_suppressed += well_formed[i] - 1;
            }
            e
        });
        requests.push(RequestEntry {
            if_id: plan.if_id,
            request_id: plan.request_id,
            src_ip: cfg.endpoints.src_ip,
            src_port: plan.src_port,
            total_len,
            frag_count,
            send_ts_ns: plan.send_ts_ns,
            present,
            missing: missing_idx,
            duplicated,
            corrupted: std::mem::take(&mut corrupted[i]),
            disagreement: plan.disagreement,
            faults: plan
                .faults
                .iter()
                .map(|(kind, from_index, _)| InjectedFault {
                    kind: *kind,
                    from_index: *from_index,
                })
                .collect(),
            well_formed: well_formed[i],
            first_packet: first_packet[i],
            last_packet: last_packet[i],
            expected,
        });
    }
    if cfg.deployed.is_some() {
        im.not_for_us = t.not_for_us_total;
        im.malformed = t.malformed_total;
        t.expected = Some(expected_totals);
        t.if_manager = Some(im);
    }
    let e = &cfg.endpoints;
    Manifest {
        format: MANIFEST_FORMAT,
        config: ManifestConfig {
            seed: cfg.seed,
            shape: inputs.shape().to_string(),
            payload_len: total_len,
            frag_size: cfg.frag_size as u32,
            interleave: cfg.interleave.max(1) as u32,
            shuffle_window: cfg.shuffle_window as u32,
            gap_ns: cfg.gap_ns,
            start_ts_ns: cfg.start_ts_ns,
            src_mac: e.src_mac.to_string(),
            dst_mac: e.dst_mac.to_string(),
            vlan_tci: e.vlan_tci,
            src_ip: e.src_ip,
            dst_ip: e.dst_ip,
            src_ports: e.src_ports.clone(),
            dst_port: e.dst_port,
        },
        deployed: cfg.deployed.clone(),
        requests,
        totals: t,
    }
}

impl Generated {
    /// The manifest of the run.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// Number of packets.
    pub fn packets(&self) -> usize {
        self.order.len()
    }

    /// Packet `k`: its pcap timestamp and frame. `inputs` must be the
    /// payloads the run was planned with.
    pub fn frame(&self, k: usize, inputs: &Inputs) -> (u64, Vec<u8>) {
        let p = self.order[k];
        let plan = &self.plans[p.request as usize];
        let payload = inputs.get(u64::from(p.request));
        let e = &self.endpoints;
        let addr = FrameAddr {
            src_mac: e.src_mac,
            dst_mac: e.dst_mac,
            vlan_tci: e.vlan_tci,
            src_ip: e.src_ip,
            dst_ip: e.dst_ip,
            src_port: plan.src_port,
            dst_port: e.dst_port,
        };
        let mut repr = FragmentRepr {
            if_id: IfId(plan.if_id),
            request_id: plan.request_id,
            total_len: self.total_len,
            frag_index: p.index,
            frag_count: self.frag_count,
            send_ts_ns: plan.send_ts_ns,
        };
        let range = fragment_range(self.total_len, self.frag_count, p.index)
            .expect("planned indices are valid");
        let ts = self.start_ts_ns + k as u64 * self.gap_ns;
        let udp = match p.slot {
            Slot::Fault(kind, salt) => {
                return (ts, kind.apply(&addr, &repr, &payload[range], salt))
            }
            Slot::Original | Slot::Duplicate => {
                let mut udp = vec![0u8; HEADER_LEN + range.len()];
                put_header(&repr, &mut udp);
                udp[HEADER_LEN..].copy_from_slice(&payload[range]);
                if let Some(salt) = self.corrupt[k] {
                    corrupt_payload(&mut udp[HEADER_LEN..], salt);
                }
                // emit_udp_frame checksums the bytes as they now are.
                udp
            }
            Slot::Disagree => {
                let d = plan
                    .disagreement
                    .expect("disagreeing packets have a disagreement");
                match d.field {
                    DisagreeField::TotalLen => repr.total_len = d.value as u32,
                    DisagreeField::SendTsNs => repr.send_ts_ns = d.value,
                }
                let own = fragment_range(repr.total_len, repr.frag_count, p.index)
                    .expect("other_total_len keeps the geometry valid");
                let mut udp = vec![0u8; HEADER_LEN + own.len()];
                put_header(&repr, &mut udp);
                for (dst, src) in udp[HEADER_LEN..].iter_mut().zip(own) {
                    *dst = payload.get(src).copied().unwrap_or(0);
                }
                udp
            }
        };
        let mut frame = vec![0u8; addr.header_len() + udp.len()];
        let len =
            emit_udp_frame(&addr, &udp, &mut frame).expect("frame buffer sized from header_len");
        frame.truncate(len);
        (ts, frame)
    }

    /// Writes the run's pcap; returns the number of packets written.
    pub fn write_pcap<W: Write>(&self, inputs: &Inputs, out: W) -> std::io::Result<u64> {
        let mut w = PcapWriter::new(out)?;
        for k in 0..self.order.len() {
            let (ts, frame) = self.frame(k, inputs);
            w.write_frame(ts, &frame)?;
        }
        let n = w.records();
        w.finish()?;
        Ok(n)
    }
}

/// Changes 1 to 4 bytes of a fragment's payload (never to their own
/// value), at places and by amounts drawn from `salt`.
fn corrupt_payload(payload: &mut [u8], salt: u64) {
    if payload.is_empty() {
        return;
    }
    let mut rng = StdRng::seed_from_u64(salt);
    for _ in 0..rng.random_range(1..=4) {
        let at = rng.random_range(0..payload.len());
        payload[at] ^= rng.random_range(1..=u8::MAX);
    }
}

/// Parses a port list: `40000`, `40000-40003`, `40000,40010-40011`.
pub fn parse_ports(s: &str) -> Result<Vec<u16>, String> {
    let mut out = Vec::new();
    for part in s.split(',') {
        let bad = || format!("bad port list {s:?}");
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (
                    u16::from_str(a.trim()).map_err(|_| bad())?,
                    u16::from_str(b.trim()).map_err(|_| bad())?,
                );
                if a > b {
                    return Err(bad());
                }
                out.extend(a..=b);
            }
            None => out.push(u16::from_str(part.trim()).map_err(|_| bad())?),
        }
    }
    Ok(out)
}

/// Parses `--deployed`: `1,2` or `1:150528,2`; an if_id without a size
/// takes `default_len` (the run's payload size).
pub fn parse_deployed(s: &str, default_len: u32) -> Result<BTreeMap<u16, u32>, String> {
    s.split(',')
        .filter(|w| !w.trim().is_empty())
        .map(|w| {
            let (id, len) = match w.split_once(':') {
                Some((id, len)) => (id, Some(len)),
                None => (w, None),
            };
            let id = id
                .trim()
                .parse::<u16>()
                .map_err(|_| format!("bad if_id in --deployed {w:?}"))?;
            let len = match len {
                Some(l) => l
                    .trim()
                    .parse::<u32>()
                    .map_err(|_| format!("bad size in --deployed {w:?}"))?,
                None => default_len,
            };
            Ok((id, len))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fault::classify;
    use crate::input::{InputShape, InputSpec};
    use crate::pcap::PcapReader;
    use kp_wire::{parse_udp_frame, Fragment};
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    fn shape(len: usize) -> InputShape {
        InputShape {
            height: len,
            width: 1,
            channels: 1,
        }
    }

    fn synthetic(s: InputShape, seed: u64) -> Inputs {
        Inputs::load(&InputSpec::Synthetic, s, seed, 4).unwrap()
    }

    fn pcap_bytes(run: &Generated, inputs: &Inputs) -> Vec<u8> {
        let mut buf = Vec::new();
        let n = run.write_pcap(inputs, &mut buf).unwrap();
        assert_eq!(n as usize, run.packets());
        buf
    }

    fn faulty_config() -> GenConfig {
        GenConfig {
            requests: 40,
            if_mix: IfMix::Weighted(vec![(1, 2), (2, 1), (9, 1)]),
            frag_size: 100,
            interleave: 3,
            shuffle_window: 7,
            faults: FaultPlan {
                duplicates: Some(Amount::Rate(0.05)),
                missing: Some(Amount::Rate(0.02)),
                disagree: Some(Amount::Rate(0.2)),
                malformed: Some(Amount::Rate(0.05)),
                malformed_kinds: FaultKind::ALL.to_vec(),
                corrupt: Some(Amount::Rate(0.05)),
            },
            gap_ns: 3_000,
            start_ts_ns: 1_700_000_000_000_000_000,
            endpoints: Endpoints {
                vlan_tci: Some(0x2064),
                src_ports: vec![40000, 40001, 40002],
                ..Endpoints::default()
            },
            seed: 11,
            first_request_id: 1000,
            deployed: Some(BTreeMap::from([(1, 768), (2, 768)])),
        }
    }

    #[derive(Default)]
    struct Seen {
        first: Option<FragmentRepr>,
        copies: BTreeMap<u16, u64>,
        disagreeing: u64,
        first_packet: Option<u64>,
        last_packet: Option<u64>,
        last_was_first_copy: bool,
    }

    /// Reads a pcap back and recounts it the way the platform would see
    /// it, independently of the plan.
    struct Recount {
        packets: u64,
        well_formed_per_if: BTreeMap<u16, u64>,
        malformed: BTreeMap<String, u64>,
        not_for_us: BTreeMap<String, u64>,
        duplicates: u64,
        disagreeing: u64,
        requests: BTreeMap<(Ipv4Addr, u16, u16, u64), Seen>,
        timestamps: Vec<u64>,
    }

    fn recount(pcap: &[u8], dst_port: u16) -> Recount {
        let mut r = Recount {
            packets: 0,
            well_formed_per_if: BTreeMap::new(),
            malformed: BTreeMap::new(),
            not_for_us: BTreeMap::new(),
            duplicates: 0,
            disagreeing: 0,
            requests: BTreeMap::new(),
            timestamps: Vec::new(),
        };
        for (k, rec) in PcapReader::new(pcap).unwrap().enumerate() {
            let rec = rec.unwrap();
            r.packets += 1;
            r.timestamps.push(rec.ts_ns);
            match classify(&rec.data, dst_port) {
                Verdict::Fragment {
                    src_ip,
                    src_port,
                    header: h,
                } => {
                    *r.well_formed_per_if.entry(h.if_id.0).or_default() += 1;
                    let s = r
                        .requests
                        .entry((src_ip, src_port, h.if_id.0, h.request_id))
                        .or_default();
                    let first = *s.first.get_or_insert(h);
                    s.first_packet.get_or_insert(k as u64);
                    s.last_packet = Some(k as u64);
                    let agrees = (h.total_len, h.frag_count, h.send_ts_ns)
                        == (first.total_len, first.frag_count, first.send_ts_ns);
                    if agrees {
                        let c = s.copies.entry(h.frag_index).or_default();
                        *c += 1;
                        s.last_was_first_copy = *c == 1;
                        if *c > 1 {
                            r.duplicates += 1;
                        }
                    } else {
                        s.disagreeing += 1;
                        s.last_was_first_copy = true;
                        r.disagreeing += 1;
                    }
                }
                Verdict::Malformed(reason) => *r.malformed.entry(reason.name()).or_default() += 1,
                Verdict::NotForUs(why) => {
                    *r.not_for_us.entry(why.name().to_string()).or_default() += 1
                }
            }
        }
        r
    }

    fn nonzero(m: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
        m.iter()
            .filter(|(_, v)| **v > 0)
            .map(|(k, v)| (k.clone(), *v))
            .collect()
    }

    fn check_manifest_against_pcap(cfg: &GenConfig, m: &Manifest, pcap: &[u8]) {
        let r = recount(pcap, cfg.endpoints.dst_port);
        let t = &m.totals;
        assert_eq!(t.packets, r.packets);
        assert_eq!(t.well_formed_per_if, r.well_formed_per_if);
        assert_eq!(t.well_formed, r.well_formed_per_if.values().sum::<u64>());
        assert_eq!(nonzero(&t.malformed), r.malformed);
        assert_eq!(t.malformed_total, r.malformed.values().sum::<u64>());
        assert_eq!(nonzero(&t.not_for_us), r.not_for_us);
        assert_eq!(t.not_for_us_total, r.not_for_us.values().sum::<u64>());
        assert_eq!(t.duplicates, r.duplicates);
        assert_eq!(t.disagreeing, r.disagreeing);
        assert_eq!(
            t.packets,
            t.well_formed + t.malformed_total + t.not_for_us_total
        );
        assert_eq!(t.well_formed, t.originals + t.duplicates + t.disagreeing);
        assert_eq!(t.faults, t.malformed_total + t.not_for_us_total);
        assert_eq!(t.faults, t.faults_by_kind.values().sum::<u64>());
        for (k, ts) in r.timestamps.iter().enumerate() {
            assert_eq!(*ts, (cfg.start_ts_ns + k as u64 * cfg.gap_ns) / 1000 * 1000);
        }

        let deployed = cfg.deployed.as_ref();
        let mut im = IfManagerExpectation::default();
        let mut missing_total = 0;
        let mut with_fragments = 0;
        for e in &m.requests {
            missing_total += e.missing.len() as u64;
            let key = (e.src_ip, e.src_port, e.if_id, e.request_id);
            let Some(s) = r.requests.get(&key) else {
                assert_eq!(e.well_formed, 0, "{key:?}");
                assert!(e.present.is_empty() && e.disagreement.is_none());
                assert_eq!(e.expected, deployed.map(|_| Expected::None));
                continue;
            };
            with_fragments += 1;
            let first = s.first.unwrap();
            assert_eq!(
                (first.total_len, first.frag_count),
                (e.total_len, e.frag_count)
            );
            assert_eq!(first.send_ts_ns, e.send_ts_ns, "{key:?}");
            assert_eq!(
                s.copies.keys().copied().collect::<Vec<_>>(),
                e.present,
                "{key:?}"
            );
            let dups: Vec<u16> = s
                .copies
                .iter()
                .flat_map(|(i, c)| std::iter::repeat_n(*i, (*c - 1) as usize))
                .collect();
            assert_eq!(dups, e.duplicated, "{key:?}");
            assert_eq!(s.disagreeing, u64::from(e.disagreement.is_some()));
            let absent: Vec<u16> = (0..e.frag_count)
                .filter(|i| {
                    !s.copies.contains_key(i) && e.disagreement.is_none_or(|d| d.index != *i)
                })
                .collect();
            assert_eq!(absent, e.missing, "{key:?}");
            assert_eq!(
                (s.first_packet, s.last_packet),
                (e.first_packet, e.last_packet)
            );
            assert_eq!(
                e.well_formed,
                s.copies.values().sum::<u64>() + s.disagreeing
            );
            // Nothing well-formed follows the moment the request can be
            // answered: its last well-formed packet is a first copy.
            assert!(
                s.last_was_first_copy,
                "{key:?}: a duplicate trails the completing fragment"
            );
            if let Some(deployed) = deployed {
                // Reference outcome, from what arrived.
                let want = match deployed.get(&e.if_id) {
                    None => Expected::UnknownIf,
                    Some(len) if *len != first.total_len || s.disagreeing > 0 => {
                        Expected::BadRequest
                    }
                    Some(_) if s.copies.len() == usize::from(first.frag_count) => Expected::Ok,
                    Some(_) => Expected::Incomplete,
                };
                assert_eq!(e.expected, Some(want), "{key:?}");
                let wf = e.well_formed;
                if deployed.contains_key(&e.if_id) {
                    im.delivered += wf;
                    *im.delivered_per_if.entry(e.if_id).or_default() += wf;
                } else {
                    im.unknown_if_answered += 1;
                    im.unknown_if_suppressed += wf - 1;
                }
            }
        }
        assert_eq!(
            with_fragments,
            r.requests.len(),
            "no well-formed fragment of an unplanned request"
        );
        assert_eq!(t.missing, missing_total);
        if deployed.is_some() {
            im.malformed = t.malformed_total;
            im.not_for_us = t.not_for_us_total;
            assert_eq!(t.if_manager.as_ref(), Some(&im));
            let exp = t.expected.as_ref().unwrap();
            assert_eq!(exp.values().sum::<u64>(), t.requests);
        }
    }

    #[test]
    fn manifest_totals_equal_a_recount_of_the_pcap() {
        let cfg = faulty_config();
        let inputs = synthetic(shape(768), 1);
        let run = generate(&cfg, &inputs).unwrap();
        let m = run.manifest();
        let t = &m.totals;
        // The mix really has every ingredient.
        assert!(
            t.duplicates > 0
                && t.missing > 0
                && t.disagreeing > 0
                && t.faults > 0
                && t.corrupted > 0,
            "{t:?}"
        );
        let exp = t.expected.as_ref().unwrap();
        for e in ["ok", "unknown_if", "bad_request", "incomplete"] {
            assert!(exp[e] > 0, "no {e} request in {exp:?}");
        }
        check_manifest_against_pcap(&cfg, m, &pcap_bytes(&run, &inputs));
        // And through JSON and back, unchanged.
        let json = serde_json::to_string(m).unwrap();
        assert_eq!(&serde_json::from_str::<Manifest>(&json).unwrap(), m);
    }

    #[test]
    fn counts_are_exact() {
        let cfg = GenConfig {
            requests: 12,
            if_mix: IfMix::RoundRobin(vec![1, 7]),
            frag_size: 64,
            interleave: 5,
            faults: FaultPlan {
                duplicates: Some(Amount::Count(9)),
                missing: Some(Amount::Count(13)),
                disagree: Some(Amount::Count(3)),
                malformed: Some(Amount::Count(2)),
                malformed_kinds: FaultKind::ALL.to_vec(),
                corrupt: Some(Amount::Count(7)),
            },
            deployed: Some(BTreeMap::from([(1, 300)])),
            ..GenConfig::default()
        };
        let inputs = synthetic(shape(300), 2);
        let run = generate(&cfg, &inputs).unwrap();
        let t = &run.manifest().totals;
        assert_eq!(
            (t.duplicates, t.missing, t.disagreeing, t.corrupted),
            (9, 13, 3, 7)
        );
        assert!(
            t.faults_by_kind.values().all(|v| *v == 2),
            "{:?}",
            t.faults_by_kind
        );
        assert_eq!(t.faults, 2 * FaultKind::ALL.len() as u64);
        assert_eq!(t.requests, 12);
        assert_eq!(t.fragments, 12 * 5);
        check_manifest_against_pcap(&cfg, run.manifest(), &pcap_bytes(&run, &inputs));

        let too_many = GenConfig {
            faults: FaultPlan {
                missing: Some(Amount::Count(61)),
                ..FaultPlan::default()
            },
            ..cfg.clone()
        };
        assert!(matches!(
            generate(&too_many, &inputs),
            Err(GenError::CountTooLarge {
                asked: 61,
                available: 60,
                ..
            })
        ));
        let bad_rate = GenConfig {
            faults: FaultPlan {
                duplicates: Some(Amount::Rate(1.5)),
                ..FaultPlan::default()
            },
            ..cfg
        };
        assert!(matches!(
            generate(&bad_rate, &inputs),
            Err(GenError::BadRate { .. })
        ));
    }

    /// The UDP checksum of an IPv4 frame without a VLAN tag or IP options
    /// verifies (RFC 768: the sum over pseudo-header and datagram is 0).
    fn udp_checksum_verifies(frame: &[u8]) -> bool {
        let ip = &frame[14..34];
        let udp = &frame[34..];
        let mut pseudo = Vec::with_capacity(12 + udp.len());
        pseudo.extend_from_slice(&ip[12..20]);
        pseudo.extend_from_slice(&[0, 17]);
        pseudo.extend_from_slice(&(udp.len() as u16).to_be_bytes());
        pseudo.extend_from_slice(udp);
        udp[6..8] != [0, 0] && crate::fault::internet_checksum(&pseudo) == 0
    }

    #[test]
    fn corrupted_fragments_differ_in_payload_bytes_only_and_stay_well_formed() {
        let plain = GenConfig {
            requests: 30,
            frag_size: 100,
            interleave: 3,
            shuffle_window: 5,
            faults: FaultPlan {
                duplicates: Some(Amount::Rate(0.1)),
                malformed: Some(Amount::Rate(0.05)),
                ..FaultPlan::default()
            },
            deployed: Some(BTreeMap::from([(1, 700)])),
            ..GenConfig::default()
        };
        let corrupt = GenConfig {
            faults: FaultPlan {
                corrupt: Some(Amount::Count(25)),
                ..plain.faults.clone()
            },
            ..plain.clone()
        };
        let inputs = synthetic(shape(700), 3);
        let a = generate(&plain, &inputs).unwrap();
        let b = generate(&corrupt, &inputs).unwrap();
        // Drawn last: the same packets in the same order, the same outcomes.
        assert_eq!(a.packets(), b.packets());
        assert_eq!(b.manifest().totals.corrupted, 25);
        let (ma, mb) = (a.manifest(), b.manifest());
        assert_eq!(ma.totals.expected, mb.totals.expected);
        assert_eq!(ma.totals.if_manager, mb.totals.if_manager);
        let mut changed = 0;
        for k in 0..a.packets() {
            let (_, fa) = a.frame(k, &inputs);
            let (_, fb) = b.frame(k, &inputs);
            if fa == fb {
                continue;
            }
            changed += 1;
            assert_eq!(fa.len(), fb.len());
            // Ethernet, IPv4 (checksum included), UDP ports and length,
            // and the kneepoint header are untouched; the UDP checksum is
            // the corrupted bytes' own.
            assert_eq!(fa[..40], fb[..40], "packet {k}");
            assert_eq!(fa[42..42 + HEADER_LEN], fb[42..42 + HEADER_LEN]);
            let diff = (42 + HEADER_LEN..fa.len())
                .filter(|i| fa[*i] != fb[*i])
                .count();
            assert!((1..=4).contains(&diff), "packet {k}: {diff} bytes differ");
            assert!(udp_checksum_verifies(&fa) && udp_checksum_verifies(&fb));
            assert_eq!(classify(&fa, 9000), classify(&fb, 9000));
            assert!(matches!(classify(&fb, 9000), Verdict::Fragment { .. }));
        }
        assert_eq!(changed, 25);
        let listed: usize = mb.requests.iter().map(|r| r.corrupted.len()).sum();
        assert_eq!(listed, 25);
        check_manifest_against_pcap(&corrupt, mb, &pcap_bytes(&b, &inputs));
    }

    #[test]
    fn same_seed_same_bytes_other_seed_other_bytes() {
        let cfg = faulty_config();
        let inputs = synthetic(shape(768), 1);
        let a = generate(&cfg, &inputs).unwrap();
        let b = generate(&cfg, &inputs).unwrap();
        assert_eq!(pcap_bytes(&a, &inputs), pcap_bytes(&b, &inputs));
        assert_eq!(a.manifest(), b.manifest());
        let other = GenConfig { seed: 12, ..cfg };
        let c = generate(&other, &inputs).unwrap();
        assert_ne!(pcap_bytes(&a, &inputs), pcap_bytes(&c, &inputs));
    }

    #[test]
    fn interleave_round_robins_and_shuffling_only_reorders() {
        let base = GenConfig {
            requests: 6,
            frag_size: 100,
            interleave: 3,
            // All timestamps 0, so send_ts_ns does not depend on the order.
            gap_ns: 0,
            ..GenConfig::default()
        };
        let inputs = synthetic(shape(1000), 3);
        let run = generate(&base, &inputs).unwrap();
        let ids: Vec<u64> = (0..run.packets())
            .map(|k| {
                let (_, f) = run.frame(k, &inputs);
                let udp = parse_udp_frame(&f).unwrap();
                Fragment::new_checked(udp.payload).unwrap().request_id()
            })
            .collect();
        assert_eq!(&ids[..6], &[1, 2, 3, 1, 2, 3]);
        assert_eq!(ids.len(), 60);
        // Request 4 takes the first free slot once request 1 is done.
        assert_eq!(ids[30], 4);

        let shuffled = GenConfig {
            shuffle_window: 16,
            ..base
        };
        let s = generate(&shuffled, &inputs).unwrap();
        let frames = |g: &Generated| -> BTreeSet<Vec<u8>> {
            (0..g.packets()).map(|k| g.frame(k, &inputs).1).collect()
        };
        assert!(frames(&run) == frames(&s), "shuffling changed a frame");
        let order = |g: &Generated| -> Vec<Vec<u8>> {
            (0..g.packets()).map(|k| g.frame(k, &inputs).1).collect()
        };
        assert!(order(&run) != order(&s), "shuffling changed nothing");
    }

    #[test]
    fn cli_lists_parse() {
        assert_eq!(
            parse_ports("40000-40003").unwrap(),
            vec![40000, 40001, 40002, 40003]
        );
        assert_eq!(parse_ports("1,5-6").unwrap(), vec![1, 5, 6]);
        assert!(parse_ports("6-5").is_err() && parse_ports("x").is_err());
        assert_eq!(
            parse_deployed("1,2:99", 150_528).unwrap(),
            BTreeMap::from([(1, 150_528), (2, 99)])
        );
        assert_eq!(
            IfMix::parse_ids("1,2").unwrap(),
            IfMix::RoundRobin(vec![1, 2])
        );
        assert_eq!(
            IfMix::parse_weights("1:3,2").unwrap(),
            IfMix::Weighted(vec![(1, 3), (2, 1)])
        );
        assert!(IfMix::parse_weights("1:0").is_err());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// Every generated datagram passes kp-wire's checks and the fragments
        /// of each request put its payload back together exactly.
        #[test]
        fn fragments_cover_the_payload_exactly(len in 1usize..3000, frag_size in 8usize..700, seed: u64) {
            let cfg = GenConfig {
                requests: 2,
                frag_size,
                interleave: 2,
                shuffle_window: 5,
                seed,
                ..GenConfig::default()
            };
            let inputs = synthetic(shape(len), seed);
            let run = generate(&cfg, &inputs).unwrap();
            let mut rebuilt = vec![vec![None::<u8>; len]; 2];
            for k in 0..run.packets() {
                let (_, f) = run.frame(k, &inputs);
                let udp = parse_udp_frame(&f).unwrap();
                let frag = Fragment::new_checked(udp.payload).unwrap();
                prop_assert!(frag.payload().len() <= frag_size);
                let r = (frag.request_id() - 1) as usize;
                for (i, b) in frag.payload_range().zip(frag.payload()) {
                    prop_assert!(rebuilt[r][i].is_none(), "byte {} twice", i);
                    rebuilt[r][i] = Some(*b);
                }
            }
            for (r, bytes) in rebuilt.iter().enumerate() {
                let got: Vec<u8> = bytes.iter().map(|b| b.expect("every byte covered")).collect();
                prop_assert_eq!(&got[..], inputs.get(r as u64));
            }
        }
    }
}
