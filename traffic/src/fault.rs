//! Broken datagrams on purpose, and how the platform is expected to see any
//! frame.
//!
//! [`FaultKind`] names every way kp-gen can break a datagram: the nine ways
//! a kneepoint header can break docs/PROTOCOL.md, and six frame-level ones (some
//! of which make the frame "not for us" rather than malformed). Each kind
//! knows the [`Verdict`] the if-manager must reach for it, and
//! [`FaultKind::apply`] builds the frame from a well-formed fragment.
//!
//! [`classify`] is the reference for that verdict: it runs kp-wire's own
//! parsers (`parse_udp_frame`, `Fragment::new_checked`) on a frame, as the
//! if-manager does, and names the counter the frame must land in. The
//! counter names are the if-manager's: `header_<MalformedKind::name()>`,
//! `frame_<FrameErrorKind::name()>`, `not_ipv4_udp`, `wrong_port`.

use std::net::Ipv4Addr;

use kp_wire::{
    emit_udp_frame, fragment_range, parse_udp_frame, Fragment, FragmentRepr, FrameAddr,
    FrameErrorKind, MalformedKind, HEADER_LEN,
};
use serde::{Deserialize, Serialize};

/// One way of breaking a datagram.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultKind {
    /// Header: magic is not `KNPT`.
    BadMagic,
    /// Header: version is not 1.
    BadVersion,
    /// Header: type is not 1 (request fragment).
    BadType,
    /// Header: the UDP payload is shorter than the 32-byte header.
    TooShort,
    /// Header: `total_len` is 0.
    ZeroTotalLen,
    /// Header: `frag_count` is 0.
    ZeroFragCount,
    /// Header: `frag_index >= frag_count`.
    IndexOutOfRange,
    /// Header: the payload is one byte shorter or longer than the geometry
    /// says.
    PayloadLength,
    /// Header: `total_len` and `frag_count` leave the last fragment empty.
    EmptyLastFragment,
    /// Frame: cut short of the IPv4 total length.
    Truncated,
    /// Frame: IP version field is not 4.
    BadIpVersion,
    /// Frame: IPv4 header length (IHL) below 5 words.
    BadIpHeaderLen,
    /// Frame: IPv4 total length shorter than the IPv4 header.
    BadIpTotalLen,
    /// Frame: the IPv4 header checksum is wrong.
    BadIpChecksum,
    /// Frame: an IPv4 fragment (more-fragments flag set).
    IpFragment,
    /// Frame: UDP length below 8 or beyond the IPv4 payload.
    BadUdpLength,
    /// Frame: not IPv4 at all (an ARP request).
    NotIpv4,
    /// Frame: IPv4 but not UDP (an ICMP echo request).
    NotUdp,
    /// Frame: UDP to another port than the platform's.
    WrongPort,
}

impl FaultKind {
    /// Every kind, in manifest order.
    pub const ALL: [FaultKind; 19] = [
        FaultKind::BadMagic,
        FaultKind::BadVersion,
        FaultKind::BadType,
        FaultKind::TooShort,
        FaultKind::ZeroTotalLen,
        FaultKind::ZeroFragCount,
        FaultKind::IndexOutOfRange,
        FaultKind::PayloadLength,
        FaultKind::EmptyLastFragment,
        FaultKind::Truncated,
        FaultKind::BadIpVersion,
        FaultKind::BadIpHeaderLen,
        FaultKind::BadIpTotalLen,
        FaultKind::BadIpChecksum,
        FaultKind::IpFragment,
        FaultKind::BadUdpLength,
        FaultKind::NotIpv4,
        FaultKind::NotUdp,
        FaultKind::WrongPort,
    ];

    /// Name on the command line and in the manifest.
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::BadMagic => "bad_magic",
            FaultKind::BadVersion => "bad_version",
            FaultKind::BadType => "bad_type",
            FaultKind::TooShort => "too_short",
            FaultKind::ZeroTotalLen => "zero_total_len",
            FaultKind::ZeroFragCount => "zero_frag_count",
            FaultKind::IndexOutOfRange => "index_out_of_range",
            FaultKind::PayloadLength => "payload_length",
            FaultKind::EmptyLastFragment => "empty_last_fragment",
            FaultKind::Truncated => "truncated",
            FaultKind::BadIpVersion => "bad_ip_version",
            FaultKind::BadIpHeaderLen => "bad_ip_header_len",
            FaultKind::BadIpTotalLen => "bad_ip_total_len",
            FaultKind::BadIpChecksum => "bad_ip_checksum",
            FaultKind::IpFragment => "ip_fragment",
            FaultKind::BadUdpLength => "bad_udp_length",
            FaultKind::NotIpv4 => "not_ipv4",
            FaultKind::NotUdp => "not_udp",
            FaultKind::WrongPort => "wrong_port",
        }
    }

    /// Parses [`FaultKind::name`].
    pub fn from_name(name: &str) -> Option<FaultKind> {
        FaultKind::ALL.into_iter().find(|k| k.name() == name)
    }

    /// What the if-manager must make of a frame broken this way.
    pub fn expected(self) -> Verdict {
        match self {
            FaultKind::BadMagic => Verdict::Malformed(Reason::Header(MalformedKind::BadMagic)),
            FaultKind::BadVersion => Verdict::Malformed(Reason::Header(MalformedKind::BadVersion)),
            FaultKind::BadType => Verdict::Malformed(Reason::Header(MalformedKind::BadType)),
            FaultKind::TooShort => Verdict::Malformed(Reason::Header(MalformedKind::TooShort)),
            FaultKind::ZeroTotalLen => {
                Verdict::Malformed(Reason::Header(MalformedKind::ZeroTotalLen))
            }
            FaultKind::ZeroFragCount => {
                Verdict::Malformed(Reason::Header(MalformedKind::ZeroFragCount))
            }
            FaultKind::IndexOutOfRange => {
                Verdict::Malformed(Reason::Header(MalformedKind::IndexOutOfRange))
            }
            FaultKind::PayloadLength => {
                Verdict::Malformed(Reason::Header(MalformedKind::PayloadLength))
            }
            FaultKind::EmptyLastFragment => {
                Verdict::Malformed(Reason::Header(MalformedKind::EmptyLastFragment))
            }
            FaultKind::Truncated => Verdict::Malformed(Reason::Frame(FrameErrorKind::Truncated)),
            FaultKind::BadIpVersion => {
                Verdict::Malformed(Reason::Frame(FrameErrorKind::BadIpVersion))
            }
            FaultKind::BadIpHeaderLen => {
                Verdict::Malformed(Reason::Frame(FrameErrorKind::BadIpHeaderLen))
            }
            FaultKind::BadIpTotalLen => {
                Verdict::Malformed(Reason::Frame(FrameErrorKind::BadIpTotalLen))
            }
            FaultKind::BadIpChecksum => {
                Verdict::Malformed(Reason::Frame(FrameErrorKind::BadIpChecksum))
            }
            FaultKind::IpFragment => Verdict::Malformed(Reason::Frame(FrameErrorKind::IpFragment)),
            FaultKind::BadUdpLength => {
                Verdict::Malformed(Reason::Frame(FrameErrorKind::BadUdpLength))
            }
            FaultKind::NotIpv4 | FaultKind::NotUdp => Verdict::NotForUs(NotForUs::NotIpv4Udp),
            FaultKind::WrongPort => Verdict::NotForUs(NotForUs::WrongPort),
        }
    }

    /// Whether the kind breaks the kneepoint header (rather than the frame).
    pub fn is_header_fault(self) -> bool {
        matches!(self.expected(), Verdict::Malformed(Reason::Header(_)))
    }

    /// Builds the frame of this fault from a well-formed fragment: `repr`
    /// is its header, `payload` its bytes, `addr` its addressing. `salt`
    /// varies the details (which length, which byte) deterministically.
    pub fn apply(
        self,
        addr: &FrameAddr,
        repr: &FragmentRepr,
        payload: &[u8],
        salt: u64,
    ) -> Vec<u8> {
        let mut r = *repr;
        let mut udp = Vec::with_capacity(HEADER_LEN + payload.len() + 1);
        let header = |r: &FragmentRepr, udp: &mut Vec<u8>| {
            udp.resize(HEADER_LEN, 0);
            r.emit_header(&mut udp[..HEADER_LEN])
                .expect("HEADER_LEN bytes");
        };
        match self {
            FaultKind::BadMagic | FaultKind::BadVersion | FaultKind::BadType => {
                header(&r, &mut udp);
                let (at, value) = match self {
                    FaultKind::BadMagic => (salt as usize % 4, udp[salt as usize % 4] ^ 0x20),
                    FaultKind::BadVersion => (4, [0u8, 2, 0xff][salt as usize % 3]),
                    _ => (5, [0u8, 2, 3, 0xff][salt as usize % 4]),
                };
                udp[at] = value;
                udp.extend_from_slice(payload);
            }
            FaultKind::TooShort => {
                header(&r, &mut udp);
                // Anything from nothing to one byte short of a header.
                udp.truncate(salt as usize % HEADER_LEN);
            }
            FaultKind::ZeroTotalLen => {
                r.total_len = 0;
                header(&r, &mut udp);
                udp.extend_from_slice(payload);
            }
            FaultKind::ZeroFragCount => {
                r.frag_count = 0;
                header(&r, &mut udp);
                udp.extend_from_slice(payload);
            }
            FaultKind::IndexOutOfRange => {
                r.frag_index = r.frag_count.saturating_add((salt % 3) as u16);
                header(&r, &mut udp);
                udp.extend_from_slice(payload);
            }
            FaultKind::PayloadLength => {
                header(&r, &mut udp);
                udp.extend_from_slice(payload);
                if salt.is_multiple_of(2) || payload.is_empty() {
                    udp.push(0xee);
                } else {
                    udp.pop();
                }
            }
            FaultKind::EmptyLastFragment => {
                let (total, count) = empty_last_geometry(r.total_len);
                r.total_len = total;
                r.frag_count = count;
                r.frag_index = 0;
                let stride = total.div_ceil(u32::from(count)) as usize;
                header(&r, &mut udp);
                udp.extend((0..stride).map(|i| payload.get(i).copied().unwrap_or(0)));
            }
            FaultKind::Truncated
            | FaultKind::BadIpVersion
            | FaultKind::BadIpHeaderLen
            | FaultKind::BadIpTotalLen
            | FaultKind::BadIpChecksum
            | FaultKind::IpFragment
            | FaultKind::BadUdpLength
            | FaultKind::NotUdp
            | FaultKind::WrongPort => {
                header(&r, &mut udp);
                udp.extend_from_slice(payload);
            }
            FaultKind::NotIpv4 => return arp_request(addr),
        }
        let mut a = *addr;
        if self == FaultKind::WrongPort {
            a.dst_port = a.dst_port.wrapping_add(1 + (salt % 100) as u16);
        }
        let mut frame = vec![0u8; a.header_len() + udp.len()];
        let n = emit_udp_frame(&a, &udp, &mut frame).expect("frame buffer sized from header_len");
        frame.truncate(n);
        let l3 = l2_len(addr);
        let udp_at = l3 + 20;
        match self {
            FaultKind::Truncated => {
                // Keep the Ethernet, IPv4 and UDP headers, lose part of the
                // payload: the IPv4 total length now exceeds what is there.
                let keep = a.header_len() + udp.len() / 2;
                frame.truncate(keep.min(frame.len() - 1));
            }
            FaultKind::BadIpVersion => {
                frame[l3] = [0x65, 0x05, 0xf5][salt as usize % 3];
                set_ipv4_checksum(&mut frame[l3..l3 + 20]);
            }
            FaultKind::BadIpHeaderLen => {
                frame[l3] = 0x40 | (salt % 5) as u8;
                set_ipv4_checksum(&mut frame[l3..l3 + 20]);
            }
            FaultKind::BadIpTotalLen => {
                let bad = (salt % 20) as u16;
                frame[l3 + 2..l3 + 4].copy_from_slice(&bad.to_be_bytes());
                set_ipv4_checksum(&mut frame[l3..l3 + 20]);
            }
            FaultKind::BadIpChecksum => {
                frame[l3 + 10] ^= 0x5a;
            }
            FaultKind::BadUdpLength => {
                // Below the UDP header, or one byte past the IPv4 payload.
                let room = (frame.len() - udp_at) as u16;
                let bad = if salt.is_multiple_of(2) {
                    (salt % 8) as u16
                } else {
                    room + 1
                };
                frame[udp_at + 4..udp_at + 6].copy_from_slice(&bad.to_be_bytes());
            }
            FaultKind::IpFragment => {
                // More fragments, offset 0: the first piece of a datagram.
                frame[l3 + 6] = 0x20;
                frame[l3 + 7] = 0;
                set_ipv4_checksum(&mut frame[l3..l3 + 20]);
            }
            FaultKind::NotUdp => {
                // An ICMP echo request carrying the datagram as its data.
                frame[l3 + 9] = 1;
                set_ipv4_checksum(&mut frame[l3..l3 + 20]);
                let icmp = &mut frame[udp_at..];
                icmp[..8].copy_from_slice(&[8, 0, 0, 0, 0x4b, 0x50, 0, 1]);
                let c = internet_checksum(icmp);
                icmp[2..4].copy_from_slice(&c.to_be_bytes());
            }
            _ => {}
        }
        frame
    }
}

/// Length of the Ethernet header (with its VLAN tag, if any).
fn l2_len(addr: &FrameAddr) -> usize {
    if addr.vlan_tci.is_some() {
        18
    } else {
        14
    }
}

/// A (total_len, frag_count) whose last fragment would be empty, close to
/// the request's own `total_len` so the datagram looks plausible.
fn empty_last_geometry(total_len: u32) -> (u32, u16) {
    let total = total_len.max(2);
    // (n-1)*ceil(T/n) >= T needs n past about sqrt(T); search upwards.
    (2..=u16::MAX)
        .find(|n| fragment_range(total, *n, *n - 1).is_none() && u64::from(*n) <= u64::from(total))
        .map(|n| (total, n))
        .unwrap_or((5, 4))
}

/// An ARP who-has for `addr.dst_ip` from `addr.src_ip`, broadcast.
fn arp_request(addr: &FrameAddr) -> Vec<u8> {
    let mut f = Vec::with_capacity(64);
    f.extend_from_slice(&[0xff; 6]);
    f.extend_from_slice(&addr.src_mac.0);
    if let Some(tci) = addr.vlan_tci {
        f.extend_from_slice(&0x8100u16.to_be_bytes());
        f.extend_from_slice(&tci.to_be_bytes());
    }
    f.extend_from_slice(&0x0806u16.to_be_bytes());
    f.extend_from_slice(&[0, 1, 0x08, 0, 6, 4, 0, 1]);
    f.extend_from_slice(&addr.src_mac.0);
    f.extend_from_slice(&addr.src_ip.octets());
    f.extend_from_slice(&[0; 6]);
    f.extend_from_slice(&addr.dst_ip.octets());
    f.resize(f.len().max(60), 0);
    f
}

/// RFC 1071 checksum of `bytes`.
pub fn internet_checksum(bytes: &[u8]) -> u16 {
    let mut sum: u32 = bytes
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], c.get(1).copied().unwrap_or(0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// Recomputes the checksum of a 20-byte IPv4 header in place.
fn set_ipv4_checksum(ip: &mut [u8]) {
    ip[10] = 0;
    ip[11] = 0;
    let c = internet_checksum(ip);
    ip[10..12].copy_from_slice(&c.to_be_bytes());
}

/// Why a frame is not for the platform (the if-manager's names).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum NotForUs {
    /// Not IPv4, or IPv4 but not UDP.
    NotIpv4Udp,
    /// UDP to another port.
    WrongPort,
}

impl NotForUs {
    /// The if-manager's counter name.
    pub fn name(self) -> &'static str {
        match self {
            NotForUs::NotIpv4Udp => "not_ipv4_udp",
            NotForUs::WrongPort => "wrong_port",
        }
    }
}

/// Why a frame addressed to the platform is malformed (kp-wire's kinds).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// Ethernet/IPv4/UDP framing.
    Frame(FrameErrorKind),
    /// The kneepoint header.
    Header(MalformedKind),
}

impl Reason {
    /// The if-manager's counter name (`frame_*` or `header_*`).
    pub fn name(self) -> String {
        match self {
            Reason::Frame(k) => format!("frame_{}", k.name()),
            Reason::Header(k) => format!("header_{}", k.name()),
        }
    }
}

/// What the platform's parser makes of one frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// A well-formed request fragment for the platform.
    Fragment {
        /// Source address of the request.
        src_ip: Ipv4Addr,
        /// Source port of the request.
        src_port: u16,
        /// Its header.
        header: FragmentRepr,
    },
    /// Not for us: dropped, counted by reason.
    NotForUs(NotForUs),
    /// For us, but broken: dropped, counted by reason.
    Malformed(Reason),
}

/// Classifies `frame` as the if-manager does, for a platform listening on
/// UDP port `dst_port` (any destination address).
pub fn classify(frame: &[u8], dst_port: u16) -> Verdict {
    let udp = match parse_udp_frame(frame) {
        Ok(udp) => udp,
        Err(e) if e.is_not_for_us() => return Verdict::NotForUs(NotForUs::NotIpv4Udp),
        Err(e) => return Verdict::Malformed(Reason::Frame(e.kind())),
    };
    if udp.addr.dst_port != dst_port {
        return Verdict::NotForUs(NotForUs::WrongPort);
    }
    match Fragment::new_checked(udp.payload) {
        Ok(f) => Verdict::Fragment {
            src_ip: udp.addr.src_ip,
            src_port: udp.addr.src_port,
            header: FragmentRepr::parse(&f),
        },
        Err(e) => Verdict::Malformed(Reason::Header(e.kind())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kp_wire::{IfId, MacAddr};

    fn addr(vlan_tci: Option<u16>) -> FrameAddr {
        FrameAddr {
            src_mac: MacAddr([2, 0, 0, 0, 0, 1]),
            dst_mac: MacAddr([2, 0, 0, 0, 0, 2]),
            vlan_tci,
            src_ip: Ipv4Addr::new(10, 77, 0, 1),
            dst_ip: Ipv4Addr::new(10, 77, 0, 2),
            src_port: 40000,
            dst_port: 9000,
        }
    }

    #[test]
    fn internet_checksum_matches_a_known_ipv4_header() {
        let hdr = [
            0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0xb8, 0x61, 0xc0, 0xa8,
            0x00, 0x01, 0xc0, 0xa8, 0x00, 0xc7,
        ];
        assert_eq!(internet_checksum(&hdr), 0);
        let mut h = hdr;
        set_ipv4_checksum(&mut h);
        assert_eq!(h, hdr);
    }

    #[test]
    fn names_round_trip_and_header_kinds_are_the_codec_s() {
        for k in FaultKind::ALL {
            assert_eq!(FaultKind::from_name(k.name()), Some(k));
            if let Verdict::Malformed(Reason::Header(m)) = k.expected() {
                assert_eq!(k.name(), m.name(), "header fault names are kp-wire's");
                assert!(k.is_header_fault());
            }
            if let Verdict::Malformed(Reason::Frame(f)) = k.expected() {
                assert_eq!(k.name(), f.name(), "frame fault names are kp-wire's");
            }
        }
        // Every kind of malformed header and frame kp-wire can report (but the
        // two that mean "not for us") is produced by some fault.
        for m in MalformedKind::ALL {
            assert!(
                FaultKind::ALL
                    .iter()
                    .any(|k| k.expected() == Verdict::Malformed(Reason::Header(m))),
                "{m:?}"
            );
        }
        for f in FrameErrorKind::ALL {
            if matches!(f, FrameErrorKind::NotIpv4 | FrameErrorKind::NotUdp) {
                continue;
            }
            assert!(
                FaultKind::ALL
                    .iter()
                    .any(|k| k.expected() == Verdict::Malformed(Reason::Frame(f))),
                "{f:?}"
            );
        }
    }

    #[test]
    fn every_fault_kind_gets_the_verdict_it_promises() {
        let payload: Vec<u8> = (0..150_528u32).map(|i| (i * 7) as u8).collect();
        let geometries = [
            (150_528u32, 147u16, 0u16),
            (150_528, 147, 146),
            (10, 3, 2),
            (1, 1, 0),
            (300, 5, 4),
        ];
        for vlan in [None, Some(100)] {
            let a = addr(vlan);
            for (total_len, frag_count, frag_index) in geometries {
                let repr = FragmentRepr {
                    if_id: IfId(3),
                    request_id: 42,
                    total_len,
                    frag_index,
                    frag_count,
                    send_ts_ns: 123_456,
                };
                let range = fragment_range(total_len, frag_count, frag_index).unwrap();
                let body = &payload[range.clone()];
                // The untouched fragment is well-formed.
                let mut udp = vec![0u8; HEADER_LEN + body.len()];
                repr.emit_header(&mut udp).unwrap();
                udp[HEADER_LEN..].copy_from_slice(body);
                let mut frame = vec![0u8; a.header_len() + udp.len()];
                emit_udp_frame(&a, &udp, &mut frame).unwrap();
                assert_eq!(
                    classify(&frame, 9000),
                    Verdict::Fragment {
                        src_ip: a.src_ip,
                        src_port: a.src_port,
                        header: repr
                    }
                );
                for kind in FaultKind::ALL {
                    for salt in 0..40 {
                        let frame = kind.apply(&a, &repr, body, salt);
                        assert_eq!(
                            classify(&frame, 9000),
                            kind.expected(),
                            "{kind:?} salt {salt} vlan {vlan:?} geometry {total_len}/{frag_count}/{frag_index}"
                        );
                    }
                }
            }
        }
    }
}
