//! The frames kneepoint messages travel in: Ethernet II, optionally one
//! 802.1Q VLAN tag, IPv4, UDP.
//!
//! [`parse_udp_frame`] takes a received frame and returns its addressing
//! ([`FrameAddr`]) and the UDP payload, borrowed from the frame.
//! [`emit_udp_headers`] writes the headers in front of a payload already in
//! place (the answer path builds the payload first, then the headers, in one
//! buffer); [`emit_udp_frame`] copies a payload in first.
//!
//! What is checked on receive: the IPv4 header (version, header length,
//! total length, header checksum, no fragmentation) and the UDP length. The
//! **UDP checksum is not verified**: veth pairs and `af_packet` hand over
//! locally generated packets with `CHECKSUM_PARTIAL`, i.e. with the UDP
//! checksum not yet filled in, and a NIC that verifies it drops bad ones
//! before they reach us. Emitted frames always carry a correct UDP checksum.

use core::fmt;
use core::str::FromStr;
use std::net::Ipv4Addr;

use thiserror::Error;

use super::proto::BufferTooSmall;

/// Ethernet II header: destination MAC, source MAC, EtherType.
pub const ETH_HDR_LEN: usize = 14;
/// One 802.1Q tag: TPID (0x8100) and TCI, between source MAC and EtherType.
pub const VLAN_TAG_LEN: usize = 4;
/// IPv4 header without options (IHL 5); longer on receive if it has options.
pub const IPV4_HDR_LEN: usize = 20;
/// UDP header.
pub const UDP_HDR_LEN: usize = 8;
/// The most UDP payload one IPv4 datagram can carry (65535 - 20 - 8).
pub const MAX_UDP_PAYLOAD: usize = u16::MAX as usize - IPV4_HDR_LEN - UDP_HDR_LEN;

/// EtherType of IPv4.
pub const ETHERTYPE_IPV4: u16 = 0x0800;
/// TPID of an 802.1Q VLAN tag.
pub const ETHERTYPE_VLAN: u16 = 0x8100;
/// IP protocol number of UDP.
pub const IPPROTO_UDP: u8 = 17;

/// TTL of emitted datagrams (Linux's default).
const EMIT_TTL: u8 = 64;
/// The IPv4 "don't fragment" flag (in the flags/fragment-offset word).
const IP_DF: u16 = 0x4000;
/// The IPv4 "more fragments" flag.
const IP_MF: u16 = 0x2000;
/// The IPv4 fragment offset bits.
const IP_FRAG_OFFSET: u16 = 0x1FFF;

/// An Ethernet MAC address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct MacAddr(pub [u8; 6]);

impl MacAddr {
    /// `ff:ff:ff:ff:ff:ff`.
    pub const BROADCAST: MacAddr = MacAddr([0xff; 6]);
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [a, b, c, d, e, g] = self.0;
        write!(f, "{a:02x}:{b:02x}:{c:02x}:{d:02x}:{e:02x}:{g:02x}")
    }
}

/// A string that is not six `:`-separated hex octets.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[error("invalid MAC address {0:?} (expected six hex octets, like 02:00:00:00:00:01)")]
pub struct MacAddrParseError(pub String);

impl FromStr for MacAddr {
    type Err = MacAddrParseError;

    /// Parses `aa:bb:cc:dd:ee:ff` (either case, one or two digits an octet).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || MacAddrParseError(s.to_string());
        let mut out = [0u8; 6];
        let mut parts = s.split(':');
        for o in &mut out {
            let p = parts.next().ok_or_else(err)?;
            if p.is_empty() || p.len() > 2 || !p.bytes().all(|c| c.is_ascii_hexdigit()) {
                return Err(err());
            }
            *o = u8::from_str_radix(p, 16).map_err(|_| err())?;
        }
        if parts.next().is_some() {
            return Err(err());
        }
        Ok(MacAddr(out))
    }
}

/// Addressing of one UDP datagram on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameAddr {
    /// Ethernet source.
    pub src_mac: MacAddr,
    /// Ethernet destination.
    pub dst_mac: MacAddr,
    /// The 802.1Q TCI (PCP, DEI, VLAN id), if the frame is tagged.
    pub vlan_tci: Option<u16>,
    /// IPv4 source.
    pub src_ip: Ipv4Addr,
    /// IPv4 destination.
    pub dst_ip: Ipv4Addr,
    /// UDP source port.
    pub src_port: u16,
    /// UDP destination port.
    pub dst_port: u16,
}

impl FrameAddr {
    /// The reply's addressing: MACs, IPs and ports swapped, VLAN tag kept.
    pub fn reversed(&self) -> FrameAddr {
        FrameAddr {
            src_mac: self.dst_mac,
            dst_mac: self.src_mac,
            vlan_tci: self.vlan_tci,
            src_ip: self.dst_ip,
            dst_ip: self.src_ip,
            src_port: self.dst_port,
            dst_port: self.src_port,
        }
    }

    /// Length of the headers [`emit_udp_headers`] writes: 42, or 46 with a
    /// VLAN tag. The payload starts there.
    pub fn header_len(&self) -> usize {
        let vlan = if self.vlan_tci.is_some() {
            VLAN_TAG_LEN
        } else {
            0
        };
        ETH_HDR_LEN + vlan + IPV4_HDR_LEN + UDP_HDR_LEN
    }
}

/// A received UDP datagram: its addressing and payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UdpFrame<'a> {
    /// Who sent it to whom.
    pub addr: FrameAddr,
    /// The UDP payload (exactly UDP length - 8 bytes).
    pub payload: &'a [u8],
    /// Where `payload` starts in the frame.
    pub payload_offset: usize,
}

/// Why a frame is not a well-formed IPv4/UDP datagram.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
pub enum FrameError {
    /// The frame ends before a header, or before the IPv4 total length.
    #[error("frame truncated: needs {needed} bytes, has {got}")]
    Truncated {
        /// Bytes the headers call for.
        needed: usize,
        /// Bytes the frame has.
        got: usize,
    },
    /// The EtherType (after at most one VLAN tag) is not IPv4.
    #[error("EtherType {ethertype:#06x} is not IPv4")]
    NotIpv4 {
        /// The EtherType found.
        ethertype: u16,
    },
    /// The IPv4 protocol is not UDP.
    #[error("IP protocol {protocol} is not UDP")]
    NotUdp {
        /// The protocol found.
        protocol: u8,
    },
    /// The IP version nibble is not 4.
    #[error("IP version is not 4")]
    BadIpVersion,
    /// IHL < 5.
    #[error("IPv4 header length below 20 bytes")]
    BadIpHeaderLen,
    /// IPv4 total length smaller than its header.
    #[error("IPv4 total length smaller than its header")]
    BadIpTotalLen,
    /// The IPv4 header checksum does not verify.
    #[error("IPv4 header checksum does not verify")]
    BadIpChecksum,
    /// An IPv4 fragment (MF set or a fragment offset): not reassembled.
    #[error("IPv4 fragment (not reassembled)")]
    IpFragment,
    /// UDP length below 8 or beyond the IPv4 payload.
    #[error("UDP length out of range")]
    BadUdpLength,
}

impl FrameError {
    /// The error without its details, for per-reason counters.
    pub fn kind(&self) -> FrameErrorKind {
        match self {
            FrameError::Truncated { .. } => FrameErrorKind::Truncated,
            FrameError::NotIpv4 { .. } => FrameErrorKind::NotIpv4,
            FrameError::NotUdp { .. } => FrameErrorKind::NotUdp,
            FrameError::BadIpVersion => FrameErrorKind::BadIpVersion,
            FrameError::BadIpHeaderLen => FrameErrorKind::BadIpHeaderLen,
            FrameError::BadIpTotalLen => FrameErrorKind::BadIpTotalLen,
            FrameError::BadIpChecksum => FrameErrorKind::BadIpChecksum,
            FrameError::IpFragment => FrameErrorKind::IpFragment,
            FrameError::BadUdpLength => FrameErrorKind::BadUdpLength,
        }
    }

    /// Not IPv4 or not UDP: someone else's traffic, as opposed to a broken
    /// frame.
    pub fn is_not_for_us(&self) -> bool {
        matches!(self, FrameError::NotIpv4 { .. } | FrameError::NotUdp { .. })
    }
}

/// One variant per [`FrameError`] variant, without the details.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FrameErrorKind {
    /// [`FrameError::Truncated`].
    Truncated,
    /// [`FrameError::NotIpv4`].
    NotIpv4,
    /// [`FrameError::NotUdp`].
    NotUdp,
    /// [`FrameError::BadIpVersion`].
    BadIpVersion,
    /// [`FrameError::BadIpHeaderLen`].
    BadIpHeaderLen,
    /// [`FrameError::BadIpTotalLen`].
    BadIpTotalLen,
    /// [`FrameError::BadIpChecksum`].
    BadIpChecksum,
    /// [`FrameError::IpFragment`].
    IpFragment,
    /// [`FrameError::BadUdpLength`].
    BadUdpLength,
}

impl FrameErrorKind {
    /// Every kind.
    pub const ALL: [FrameErrorKind; 9] = [
        FrameErrorKind::Truncated,
        FrameErrorKind::NotIpv4,
        FrameErrorKind::NotUdp,
        FrameErrorKind::BadIpVersion,
        FrameErrorKind::BadIpHeaderLen,
        FrameErrorKind::BadIpTotalLen,
        FrameErrorKind::BadIpChecksum,
        FrameErrorKind::IpFragment,
        FrameErrorKind::BadUdpLength,
    ];

    /// snake_case name, for counters.
    pub fn name(self) -> &'static str {
        match self {
            FrameErrorKind::Truncated => "truncated",
            FrameErrorKind::NotIpv4 => "not_ipv4",
            FrameErrorKind::NotUdp => "not_udp",
            FrameErrorKind::BadIpVersion => "bad_ip_version",
            FrameErrorKind::BadIpHeaderLen => "bad_ip_header_len",
            FrameErrorKind::BadIpTotalLen => "bad_ip_total_len",
            FrameErrorKind::BadIpChecksum => "bad_ip_checksum",
            FrameErrorKind::IpFragment => "ip_fragment",
            FrameErrorKind::BadUdpLength => "bad_udp_length",
        }
    }
}

impl fmt::Display for FrameErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[inline]
fn be16(b: &[u8], at: usize) -> u16 {
    match b.get(at..at + 2) {
        Some(&[hi, lo]) => u16::from_be_bytes([hi, lo]),
        _ => 0,
    }
}

#[inline]
fn ipv4_at(b: &[u8], at: usize) -> Ipv4Addr {
    match b.get(at..at + 4) {
        Some(&[a, c, d, e]) => Ipv4Addr::new(a, c, d, e),
        _ => Ipv4Addr::UNSPECIFIED,
    }
}

#[inline]
fn mac_at(b: &[u8], at: usize) -> MacAddr {
    MacAddr(
        b.get(at..at + 6)
            .and_then(|m| <[u8; 6]>::try_from(m).ok())
            .unwrap_or_default(),
    )
}

/// Adds `data` to a ones'-complement sum (RFC 1071), as big-endian 16-bit
/// words, an odd last byte padded with zero. The sum is not folded.
#[inline]
fn sum_words(mut acc: u64, data: &[u8]) -> u64 {
    let mut words = data.chunks_exact(2);
    for w in &mut words {
        acc += u64::from(u16::from_be_bytes([w[0], w[1]]));
    }
    if let [last] = words.remainder() {
        acc += u64::from(*last) << 8;
    }
    acc
}

/// Folds a sum to 16 bits and complements it: the Internet checksum.
#[inline]
fn finish_checksum(mut acc: u64) -> u16 {
    while acc > 0xFFFF {
        acc = (acc & 0xFFFF) + (acc >> 16);
    }
    !(acc as u16)
}

/// Parses an Ethernet II (optionally one 802.1Q tag) / IPv4 / UDP frame.
///
/// Checks, in this order:
/// - EtherType IPv4, after at most one tag (else [`FrameError::NotIpv4`]);
/// - IP version 4 and IHL of at least 5 (options are skipped);
/// - IP total length at least the IP header and at most the bytes available
///   (Ethernet padding after the datagram is ignored);
/// - the IPv4 header checksum;
/// - protocol UDP (else [`FrameError::NotUdp`]);
/// - no IP fragmentation (MF clear, offset 0);
/// - UDP length at least 8 and at most the IP payload.
///
/// The payload is exactly UDP length - 8 bytes. The UDP checksum is **not**
/// verified (see the module docs).
pub fn parse_udp_frame(frame: &[u8]) -> Result<UdpFrame<'_>, FrameError> {
    let got = frame.len();
    let truncated = |needed: usize| FrameError::Truncated { needed, got };
    if got < ETH_HDR_LEN {
        return Err(truncated(ETH_HDR_LEN));
    }
    let mut ethertype = be16(frame, 12);
    let mut l3 = ETH_HDR_LEN;
    let mut vlan_tci = None;
    if ethertype == ETHERTYPE_VLAN {
        l3 += VLAN_TAG_LEN;
        if got < l3 {
            return Err(truncated(l3));
        }
        vlan_tci = Some(be16(frame, 14));
        ethertype = be16(frame, 16);
    }
    if ethertype != ETHERTYPE_IPV4 {
        return Err(FrameError::NotIpv4 { ethertype });
    }

    let ip = frame.get(l3..).unwrap_or(&[]);
    if ip.len() < IPV4_HDR_LEN {
        return Err(truncated(l3 + IPV4_HDR_LEN));
    }
    if ip[0] >> 4 != 4 {
        return Err(FrameError::BadIpVersion);
    }
    let ihl = usize::from(ip[0] & 0x0F) * 4;
    if ihl < IPV4_HDR_LEN {
        return Err(FrameError::BadIpHeaderLen);
    }
    let total_len = usize::from(be16(ip, 2));
    if total_len < ihl {
        return Err(FrameError::BadIpTotalLen);
    }
    // Bytes after total_len are Ethernet padding (short frames are padded
    // to 60 bytes): ignored.
    let Some(ip) = ip.get(..total_len) else {
        return Err(truncated(l3 + total_len));
    };
    let (ip_hdr, udp) = ip.split_at(ihl);
    if finish_checksum(sum_words(0, ip_hdr)) != 0 {
        return Err(FrameError::BadIpChecksum);
    }
    let protocol = ip_hdr[9];
    if protocol != IPPROTO_UDP {
        return Err(FrameError::NotUdp { protocol });
    }
    let frag = be16(ip_hdr, 6);
    if frag & (IP_MF | IP_FRAG_OFFSET) != 0 {
        return Err(FrameError::IpFragment);
    }
    if udp.len() < UDP_HDR_LEN {
        return Err(FrameError::BadUdpLength);
    }
    let udp_len = usize::from(be16(udp, 4));
    if udp_len < UDP_HDR_LEN || udp_len > udp.len() {
        return Err(FrameError::BadUdpLength);
    }
    let payload = udp.get(UDP_HDR_LEN..udp_len).unwrap_or(&[]);
    Ok(UdpFrame {
        addr: FrameAddr {
            dst_mac: mac_at(frame, 0),
            src_mac: mac_at(frame, 6),
            vlan_tci,
            src_ip: ipv4_at(ip_hdr, 12),
            dst_ip: ipv4_at(ip_hdr, 16),
            src_port: be16(udp, 0),
            dst_port: be16(udp, 2),
        },
        payload,
        payload_offset: l3 + ihl + UDP_HDR_LEN,
    })
}

/// The addressing and payload of a frame that [`parse_udp_frame`] accepted
/// before (in another process: the if-manager), from the lengths of its L2
/// and L3 headers recorded then: no validation is repeated, only bounds are
/// checked (`None` if the lengths do not fit the frame). For a frame
/// `parse_udp_frame` accepts, with its true header lengths, the result is
/// the same as `parse_udp_frame`'s.
pub fn udp_frame_at(frame: &[u8], l2_len: usize, l3_len: usize) -> Option<UdpFrame<'_>> {
    let l4 = l2_len + l3_len;
    if l2_len < ETH_HDR_LEN || l3_len < IPV4_HDR_LEN || frame.len() < l4 + UDP_HDR_LEN {
        return None;
    }
    let ip_hdr = &frame[l2_len..l4];
    let udp = &frame[l4..];
    let udp_len = usize::from(be16(udp, 4));
    let payload = udp.get(UDP_HDR_LEN..udp_len)?;
    Some(UdpFrame {
        addr: FrameAddr {
            dst_mac: mac_at(frame, 0),
            src_mac: mac_at(frame, 6),
            vlan_tci: (l2_len == ETH_HDR_LEN + VLAN_TAG_LEN).then(|| be16(frame, 14)),
            src_ip: ipv4_at(ip_hdr, 12),
            dst_ip: ipv4_at(ip_hdr, 16),
            src_port: be16(udp, 0),
            dst_port: be16(udp, 2),
        },
        payload,
        payload_offset: l4 + UDP_HDR_LEN,
    })
}

/// Writes Ethernet (with `addr.vlan_tci`'s tag, if any), IPv4 and UDP
/// headers into `buf[..addr.header_len()]`, for a payload of `payload_len`
/// bytes already at `buf[addr.header_len()..]`. IPv4: no options, DF set,
/// TTL 64, id 0, header checksum. UDP: length and checksum over the
/// pseudo-header, header and payload (a computed 0 is sent as 0xFFFF).
/// Returns the frame's length, `addr.header_len() + payload_len`.
///
/// Fails if `buf` is shorter than that, or if `payload_len` exceeds
/// [`MAX_UDP_PAYLOAD`].
pub fn emit_udp_headers(
    addr: &FrameAddr,
    payload_len: usize,
    buf: &mut [u8],
) -> Result<usize, BufferTooSmall> {
    let hdr_len = addr.header_len();
    let needed = hdr_len.saturating_add(payload_len);
    if payload_len > MAX_UDP_PAYLOAD {
        return Err(BufferTooSmall {
            needed,
            got: buf.len().min(hdr_len + MAX_UDP_PAYLOAD),
        });
    }
    let got = buf.len();
    let Some(frame) = buf.get_mut(..needed) else {
        return Err(BufferTooSmall { needed, got });
    };

    // Ethernet
    frame[0..6].copy_from_slice(&addr.dst_mac.0);
    frame[6..12].copy_from_slice(&addr.src_mac.0);
    let mut l3 = 12;
    if let Some(tci) = addr.vlan_tci {
        frame[12..14].copy_from_slice(&ETHERTYPE_VLAN.to_be_bytes());
        frame[14..16].copy_from_slice(&tci.to_be_bytes());
        l3 += VLAN_TAG_LEN;
    }
    frame[l3..l3 + 2].copy_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
    l3 += 2;

    // payload_len <= MAX_UDP_PAYLOAD, so both lengths fit a u16.
    let udp_len = (UDP_HDR_LEN + payload_len) as u16;
    let ip_len = (IPV4_HDR_LEN + UDP_HDR_LEN + payload_len) as u16;
    let (ip, udp) = frame[l3..].split_at_mut(IPV4_HDR_LEN);

    // IPv4
    ip[0] = 0x45; // version 4, IHL 5
    ip[1] = 0; // DSCP/ECN
    ip[2..4].copy_from_slice(&ip_len.to_be_bytes());
    ip[4..6].copy_from_slice(&0u16.to_be_bytes()); // id: DF set, never fragmented
    ip[6..8].copy_from_slice(&IP_DF.to_be_bytes());
    ip[8] = EMIT_TTL;
    ip[9] = IPPROTO_UDP;
    ip[10..12].copy_from_slice(&[0, 0]);
    ip[12..16].copy_from_slice(&addr.src_ip.octets());
    ip[16..20].copy_from_slice(&addr.dst_ip.octets());
    let ip_csum = finish_checksum(sum_words(0, ip));
    ip[10..12].copy_from_slice(&ip_csum.to_be_bytes());

    // UDP
    udp[0..2].copy_from_slice(&addr.src_port.to_be_bytes());
    udp[2..4].copy_from_slice(&addr.dst_port.to_be_bytes());
    udp[4..6].copy_from_slice(&udp_len.to_be_bytes());
    udp[6..8].copy_from_slice(&[0, 0]);
    let mut acc = sum_words(0, &addr.src_ip.octets());
    acc = sum_words(acc, &addr.dst_ip.octets());
    acc += u64::from(IPPROTO_UDP);
    acc += u64::from(udp_len);
    acc = sum_words(acc, udp);
    let udp_csum = match finish_checksum(acc) {
        0 => 0xFFFF, // 0 means "no checksum" in UDP over IPv4
        c => c,
    };
    udp[6..8].copy_from_slice(&udp_csum.to_be_bytes());

    Ok(needed)
}

/// Copies `payload` to `buf[addr.header_len()..]`, then
/// [`emit_udp_headers`]. Returns the frame's length.
pub fn emit_udp_frame(
    addr: &FrameAddr,
    payload: &[u8],
    buf: &mut [u8],
) -> Result<usize, BufferTooSmall> {
    let hdr_len = addr.header_len();
    let needed = hdr_len.saturating_add(payload.len());
    if payload.len() > MAX_UDP_PAYLOAD {
        return Err(BufferTooSmall {
            needed,
            got: buf.len().min(hdr_len + MAX_UDP_PAYLOAD),
        });
    }
    let got = buf.len();
    let Some(dst) = buf.get_mut(hdr_len..needed) else {
        return Err(BufferTooSmall { needed, got });
    };
    dst.copy_from_slice(payload);
    emit_udp_headers(addr, payload.len(), buf)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{
        addr, fix_ip_checksum, frame, frame_seeds, independent_checksum, with_ip_options,
    };
    use proptest::prelude::*;

    /// The UDP checksum over pseudo-header + UDP header + payload, by the
    /// independent fold: 0 for a correct one.
    fn udp_verify(frame: &[u8], l3: usize) -> u16 {
        let ihl = usize::from(frame[l3] & 0x0F) * 4;
        let total = usize::from(u16::from_be_bytes([frame[l3 + 2], frame[l3 + 3]]));
        let udp = &frame[l3 + ihl..l3 + total];
        let pseudo = [
            &frame[l3 + 12..l3 + 20],
            &[0, 17][..],
            &(udp.len() as u16).to_be_bytes()[..],
        ]
        .concat();
        independent_checksum(&[&pseudo, udp])
    }

    fn ip_verify(frame: &[u8], l3: usize) -> u16 {
        let ihl = usize::from(frame[l3] & 0x0F) * 4;
        independent_checksum(&[&frame[l3..l3 + ihl]])
    }

    fn kind(frame: &[u8]) -> Result<(), FrameErrorKind> {
        parse_udp_frame(frame).map(|_| ()).map_err(|e| e.kind())
    }

    #[test]
    fn an_untagged_frame_is_laid_out_and_parsed() {
        let a = addr(None);
        let f = frame(&a, b"hello");
        assert_eq!(a.header_len(), 42);
        assert_eq!(f.len(), 47);
        #[rustfmt::skip]
        let want: [u8; 42] = [
            2, 0, 0, 0, 0, 2,  2, 0, 0, 0, 0, 1,  0x08, 0x00,     // dst, src, IPv4
            0x45, 0x00, 0x00, 33,  0x00, 0x00, 0x40, 0x00,       // len 33, id 0, DF
            64, 17, f[24], f[25],                                 // TTL, UDP, csum
            10, 77, 0, 1,  10, 77, 0, 2,                          // src, dst
            0x9C, 0x40, 0x23, 0x28, 0, 13, f[40], f[41],         // 40000 -> 9000, len 13
        ];
        assert_eq!(&f[..42], &want);
        assert_eq!(ip_verify(&f, 14), 0);
        assert_eq!(udp_verify(&f, 14), 0);
        let p = parse_udp_frame(&f).unwrap();
        assert_eq!(p.addr, a);
        assert_eq!(p.payload, b"hello");
        assert_eq!(p.payload_offset, 42);
    }

    #[test]
    fn a_vlan_tagged_frame_keeps_its_tag() {
        let a = addr(Some(0xE00A)); // PCP 7, VLAN 10
        let f = frame(&a, b"tagged payload");
        assert_eq!(a.header_len(), 46);
        assert_eq!(&f[12..18], &[0x81, 0x00, 0xE0, 0x0A, 0x08, 0x00]);
        assert_eq!(ip_verify(&f, 18), 0);
        assert_eq!(udp_verify(&f, 18), 0);
        let p = parse_udp_frame(&f).unwrap();
        assert_eq!(p.addr, a);
        assert_eq!(p.payload, b"tagged payload");
        assert_eq!(p.payload_offset, 46);
    }

    #[test]
    fn ip_options_are_skipped() {
        for vlan in [None, Some(5)] {
            let a = addr(vlan);
            let f = frame(&a, b"with options");
            // two NOPs, end of options list, padding; then 4 more bytes
            let g = with_ip_options(&f, &[1, 1, 0, 0, 0x44, 0x04, 0x05, 0x00]);
            let p = parse_udp_frame(&g).unwrap();
            assert_eq!(p.addr, a);
            assert_eq!(p.payload, b"with options");
            assert_eq!(p.payload_offset, a.header_len() + 8);
        }
    }

    #[test]
    fn ethernet_padding_after_the_ip_datagram_is_ignored() {
        let a = addr(None);
        let mut f = frame(&a, b"hi");
        assert_eq!(f.len(), 44);
        f.resize(60, 0); // minimum Ethernet frame without FCS
        let p = parse_udp_frame(&f).unwrap();
        assert_eq!(p.payload, b"hi");
        f.resize(60, 0xAA);
        f.extend_from_slice(&[0xAA; 100]);
        assert_eq!(parse_udp_frame(&f).unwrap().payload, b"hi");
    }

    #[test]
    fn an_empty_payload_is_a_valid_datagram() {
        let f = frame(&addr(None), b"");
        let p = parse_udp_frame(&f).unwrap();
        assert!(p.payload.is_empty());
        assert_eq!(p.payload_offset, 42);
    }

    #[test]
    fn the_ip_checksum_matches_a_known_answer() {
        // The classic worked example (RFC 1071 style): header with checksum
        // 0xB861.
        let hdr = [
            0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00, 0xc0, 0xa8,
            0x00, 0x01, 0xc0, 0xa8, 0x00, 0xc7,
        ];
        assert_eq!(finish_checksum(sum_words(0, &hdr)), 0xB861);
        assert_eq!(independent_checksum(&[&hdr]), 0xB861);
        let a = FrameAddr {
            src_ip: Ipv4Addr::new(192, 168, 0, 1),
            dst_ip: Ipv4Addr::new(192, 168, 0, 199),
            ..addr(None)
        };
        let f = frame(&a, &[0u8; 0x73 - 28]);
        assert_eq!(&f[24..26], &[0xB8, 0x61]);
    }

    #[test]
    fn udp_checksums_verify_for_odd_and_even_payloads() {
        for len in [0usize, 1, 2, 3, 17, 1400, 1401] {
            let payload: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
            for vlan in [None, Some(1)] {
                let f = frame(&addr(vlan), &payload);
                let l3 = if vlan.is_some() { 18 } else { 14 };
                assert_eq!(ip_verify(&f, l3), 0, "len {len}");
                assert_eq!(udp_verify(&f, l3), 0, "len {len}");
                assert_ne!(&f[l3 + 26..l3 + 28], &[0, 0], "0 means no checksum");
            }
        }
    }

    #[test]
    fn a_computed_udp_checksum_of_0_is_sent_as_ffff() {
        let a = addr(None);
        // With payload [0, 0] the checksum is c; payload c makes the sum
        // 0xFFFF, so the computed checksum is 0.
        let f = frame(&a, &[0, 0]);
        let c = [f[40], f[41]];
        let g = frame(&a, &c);
        assert_eq!(&g[40..42], &[0xFF, 0xFF]);
        assert_eq!(udp_verify(&g, 14), 0);
    }

    #[test]
    fn the_udp_checksum_is_not_verified() {
        // veth / af_packet deliver CHECKSUM_PARTIAL packets, UDP checksum unfilled
        let mut f = frame(&addr(None), b"partial");
        f[40] ^= 0xFF;
        assert!(parse_udp_frame(&f).is_ok());
        f[40] = 0;
        f[41] = 0;
        assert!(parse_udp_frame(&f).is_ok());
    }

    // --- one test per error kind ---------------------------------------------

    #[test]
    fn truncated() {
        let f = frame(&addr(None), b"0123456789");
        for len in [0, 13, 14, 33] {
            assert!(matches!(
                parse_udp_frame(&f[..len]),
                Err(FrameError::Truncated { got, .. }) if got == len
            ));
        }
        // shorter than IPv4 total length
        assert_eq!(
            parse_udp_frame(&f[..f.len() - 1]),
            Err(FrameError::Truncated {
                needed: f.len(),
                got: f.len() - 1
            })
        );
        // a tag but no room for the EtherType after it
        let g = frame(&addr(Some(3)), b"x");
        assert_eq!(
            parse_udp_frame(&g[..17]),
            Err(FrameError::Truncated {
                needed: 18,
                got: 17
            })
        );
    }

    #[test]
    fn not_ipv4() {
        let mut f = frame(&addr(None), b"x");
        for ethertype in [0x0806u16, 0x86DD, 0x88A8] {
            f[12..14].copy_from_slice(&ethertype.to_be_bytes());
            let e = parse_udp_frame(&f).unwrap_err();
            assert_eq!(e, FrameError::NotIpv4 { ethertype });
            assert!(e.is_not_for_us());
        }
        // QinQ: a second tag is not IPv4 either
        let mut g = frame(&addr(Some(3)), b"x");
        g[16..18].copy_from_slice(&0x8100u16.to_be_bytes());
        assert_eq!(
            parse_udp_frame(&g),
            Err(FrameError::NotIpv4 { ethertype: 0x8100 })
        );
    }

    #[test]
    fn not_udp() {
        let mut f = frame(&addr(None), b"x");
        f[23] = 6;
        fix_ip_checksum(&mut f);
        let e = parse_udp_frame(&f).unwrap_err();
        assert_eq!(e, FrameError::NotUdp { protocol: 6 });
        assert!(e.is_not_for_us());
    }

    #[test]
    fn bad_ip_version() {
        let mut f = frame(&addr(None), b"x");
        f[14] = 0x65;
        fix_ip_checksum(&mut f);
        let e = parse_udp_frame(&f).unwrap_err();
        assert_eq!(e, FrameError::BadIpVersion);
        assert!(!e.is_not_for_us());
    }

    #[test]
    fn bad_ip_header_len() {
        let mut f = frame(&addr(None), b"x");
        for ihl in 0..5u8 {
            f[14] = 0x40 | ihl;
            assert_eq!(parse_udp_frame(&f), Err(FrameError::BadIpHeaderLen));
        }
    }

    #[test]
    fn bad_ip_total_len() {
        let mut f = frame(&addr(None), b"x");
        f[16..18].copy_from_slice(&19u16.to_be_bytes());
        fix_ip_checksum(&mut f);
        assert_eq!(parse_udp_frame(&f), Err(FrameError::BadIpTotalLen));
    }

    #[test]
    fn bad_ip_checksum() {
        let f = frame(&addr(None), b"x");
        for byte in [15, 18, 22, 24, 25, 26, 33] {
            let mut g = f.clone();
            g[byte] ^= 0x10;
            assert_eq!(
                parse_udp_frame(&g),
                Err(FrameError::BadIpChecksum),
                "byte {byte}"
            );
        }
    }

    #[test]
    fn ip_fragment() {
        let f = frame(&addr(None), b"x");
        for flags in [0x2000u16, 0x0001, 0x1FFF, 0x4001, 0x2000 | 0x4000] {
            let mut g = f.clone();
            g[20..22].copy_from_slice(&flags.to_be_bytes());
            fix_ip_checksum(&mut g);
            assert_eq!(
                parse_udp_frame(&g),
                Err(FrameError::IpFragment),
                "{flags:#x}"
            );
        }
        // DF alone is fine
        assert!(parse_udp_frame(&f).is_ok());
    }

    #[test]
    fn bad_udp_length() {
        let f = frame(&addr(None), b"0123");
        for udp_len in [0u16, 7, 13] {
            let mut g = f.clone();
            g[38..40].copy_from_slice(&udp_len.to_be_bytes());
            assert_eq!(
                parse_udp_frame(&g),
                Err(FrameError::BadUdpLength),
                "{udp_len}"
            );
        }
        // an IP payload too short for a UDP header
        let mut g = f.clone();
        g[16..18].copy_from_slice(&27u16.to_be_bytes());
        fix_ip_checksum(&mut g);
        assert_eq!(parse_udp_frame(&g), Err(FrameError::BadUdpLength));
        // a UDP length shorter than the IP payload: the rest is ignored
        let mut g = f.clone();
        g[38..40].copy_from_slice(&10u16.to_be_bytes());
        assert_eq!(parse_udp_frame(&g).unwrap().payload, b"01");
    }

    #[test]
    fn every_frame_error_kind_has_a_seed_and_a_distinct_name() {
        let seeds = frame_seeds();
        for k in FrameErrorKind::ALL {
            let (_, bytes) = seeds
                .iter()
                .find(|(n, _)| *n == k.name())
                .unwrap_or_else(|| panic!("no seed named {}", k.name()));
            assert_eq!(kind(bytes), Err(k));
            assert_eq!(k.to_string(), k.name());
        }
        for (name, bytes) in &seeds {
            if name.starts_with("valid") {
                assert_eq!(kind(bytes), Ok(()), "{name}");
            }
        }
        let mut names: Vec<_> = FrameErrorKind::ALL.iter().map(|k| k.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), FrameErrorKind::ALL.len());
    }

    // --- emit ------------------------------------------------------------------

    #[test]
    fn the_reply_goes_back_where_the_request_came_from() {
        let a = addr(Some(42));
        let r = a.reversed();
        assert_eq!((r.src_mac, r.dst_mac), (a.dst_mac, a.src_mac));
        assert_eq!((r.src_ip, r.dst_ip), (a.dst_ip, a.src_ip));
        assert_eq!((r.src_port, r.dst_port), (a.dst_port, a.src_port));
        assert_eq!(r.vlan_tci, Some(42));
        assert_eq!(r.reversed(), a);
    }

    #[test]
    fn emit_headers_in_front_of_a_payload_in_place() {
        let a = addr(Some(7));
        let mut buf = [0u8; 100];
        buf[46..50].copy_from_slice(b"abcd");
        assert_eq!(emit_udp_headers(&a, 4, &mut buf), Ok(50));
        let p = parse_udp_frame(&buf[..50]).unwrap();
        assert_eq!((p.addr, p.payload), (a, &b"abcd"[..]));
        assert_eq!(buf[50], 0, "nothing written past the frame");
    }

    #[test]
    fn emit_needs_room() {
        let a = addr(None);
        let mut buf = [0u8; 45];
        assert_eq!(
            emit_udp_headers(&a, 4, &mut buf),
            Err(BufferTooSmall {
                needed: 46,
                got: 45
            })
        );
        assert_eq!(
            emit_udp_frame(&a, b"abcd", &mut buf),
            Err(BufferTooSmall {
                needed: 46,
                got: 45
            })
        );
        assert_eq!(buf, [0u8; 45], "nothing written on failure");
        let mut big = vec![0u8; 70_000];
        assert_eq!(
            emit_udp_headers(&a, MAX_UDP_PAYLOAD + 1, &mut big),
            Err(BufferTooSmall {
                needed: 42 + MAX_UDP_PAYLOAD + 1,
                got: 42 + MAX_UDP_PAYLOAD
            })
        );
        let n = emit_udp_headers(&a, MAX_UDP_PAYLOAD, &mut big).unwrap();
        let p = parse_udp_frame(&big[..n]).unwrap();
        assert_eq!(p.payload.len(), MAX_UDP_PAYLOAD);
    }

    #[test]
    fn mac_addresses_print_and_parse() {
        let m = MacAddr([0x02, 0xab, 0, 0x10, 0xff, 1]);
        assert_eq!(m.to_string(), "02:ab:00:10:ff:01");
        assert_eq!("02:AB:0:10:ff:01".parse::<MacAddr>(), Ok(m));
        for bad in [
            "",
            "02:ab:00:10:ff",
            "02:ab:00:10:ff:01:02",
            "02:ab:00:10:ff:1g",
            "002:ab:0:1:2:3",
            "::::::",
        ] {
            assert!(bad.parse::<MacAddr>().is_err(), "{bad:?}");
        }
        assert_eq!(MacAddr::BROADCAST.to_string(), "ff:ff:ff:ff:ff:ff");
    }

    // --- properties --------------------------------------------------------------

    /// The parsing rules re-stated from scratch: the addressing fields and
    /// payload range, or the first rule broken.
    #[allow(clippy::type_complexity)]
    fn reference_parse(
        b: &[u8],
    ) -> Result<(Option<u16>, [u8; 8], [u16; 2], usize, usize), FrameErrorKind> {
        use FrameErrorKind::*;
        let u16_at = |i: usize| u16::from(b[i]) << 8 | u16::from(b[i + 1]);
        if b.len() < 14 {
            return Err(Truncated);
        }
        let (vlan, l3) = if u16_at(12) == 0x8100 {
            if b.len() < 18 {
                return Err(Truncated);
            }
            (Some(u16_at(14)), 18)
        } else {
            (None, 14)
        };
        if u16_at(l3 - 2) != 0x0800 {
            return Err(NotIpv4);
        }
        if b.len() < l3 + 20 {
            return Err(Truncated);
        }
        if b[l3] / 16 != 4 {
            return Err(BadIpVersion);
        }
        let ihl = (b[l3] % 16) as usize * 4;
        if ihl < 20 {
            return Err(BadIpHeaderLen);
        }
        let total = u16_at(l3 + 2) as usize;
        if total < ihl {
            return Err(BadIpTotalLen);
        }
        if l3 + total > b.len() {
            return Err(Truncated);
        }
        if independent_checksum(&[&b[l3..l3 + ihl]]) != 0 {
            return Err(BadIpChecksum);
        }
        if b[l3 + 9] != 17 {
            return Err(NotUdp);
        }
        let frag = u16_at(l3 + 6);
        if frag & 0x2000 != 0 || frag % 0x2000 != 0 {
            return Err(IpFragment);
        }
        let udp = l3 + ihl;
        if total - ihl < 8 {
            return Err(BadUdpLength);
        }
        let udp_len = u16_at(udp + 4) as usize;
        if udp_len < 8 || udp_len > total - ihl {
            return Err(BadUdpLength);
        }
        let mut ips = [0u8; 8];
        ips.copy_from_slice(&b[l3 + 12..l3 + 20]);
        Ok((
            vlan,
            ips,
            [u16_at(udp), u16_at(udp + 2)],
            udp + 8,
            udp + udp_len,
        ))
    }

    fn any_addr() -> impl Strategy<Value = FrameAddr> {
        (
            any::<[u8; 6]>(),
            any::<[u8; 6]>(),
            proptest::option::of(any::<u16>()),
            any::<[u8; 4]>(),
            any::<[u8; 4]>(),
            any::<u16>(),
            any::<u16>(),
        )
            .prop_map(|(s, d, vlan_tci, si, di, src_port, dst_port)| FrameAddr {
                src_mac: MacAddr(s),
                dst_mac: MacAddr(d),
                vlan_tci,
                src_ip: Ipv4Addr::from(si),
                dst_ip: Ipv4Addr::from(di),
                src_port,
                dst_port,
            })
    }

    /// Valid frames, then damaged: a byte flipped, cut short, padded,
    /// given options, or with its IP header re-checksummed after damage.
    fn near_valid_frame() -> impl Strategy<Value = Vec<u8>> {
        (
            any_addr(),
            proptest::collection::vec(any::<u8>(), 0..64),
            0u8..6,
            any::<prop::sample::Index>(),
            any::<u8>(),
            0usize..40,
        )
            .prop_map(|(a, payload, how, at, val, n)| {
                let mut f = frame(&a, &payload);
                let l3 = a.header_len() - 28;
                match how {
                    0 => {}
                    1 => {
                        let i = at.index(f.len());
                        f[i] = val;
                    }
                    2 => f.truncate(at.index(f.len())),
                    3 => f.extend(std::iter::repeat_n(val, n)),
                    4 => f = with_ip_options(&f, &vec![val; (n % 10) * 4]),
                    _ => {
                        // damage the IP or UDP header, keep the IP checksum right
                        let i = l3 + at.index(28);
                        if i != l3 + 10 && i != l3 + 11 {
                            f[i] = val;
                            if f[l3] & 0x0F >= 5 && f[l3] & 0x0F <= 7 {
                                fix_ip_checksum(&mut f);
                            }
                        }
                    }
                }
                f
            })
    }

    proptest! {
        #[test]
        fn recorded_lengths_never_panic_on_any_bytes(
            bytes in proptest::collection::vec(any::<u8>(), 0..120),
            l2 in 0usize..40,
            l3 in 0usize..80,
        ) {
            if let Some(p) = udp_frame_at(&bytes, l2, l3) {
                prop_assert_eq!(p.payload_offset, l2 + l3 + UDP_HDR_LEN);
                prop_assert!(p.payload_offset + p.payload.len() <= bytes.len());
            }
        }

        #[test]
        fn emit_then_parse_round_trips(
            a in any_addr(),
            payload in proptest::collection::vec(any::<u8>(), 0..1500),
            slack in 0usize..8,
        ) {
            let mut buf = vec![0u8; a.header_len() + payload.len() + slack];
            let n = emit_udp_frame(&a, &payload, &mut buf).unwrap();
            prop_assert_eq!(n, a.header_len() + payload.len());
            let p = parse_udp_frame(&buf[..n]).unwrap();
            prop_assert_eq!(p.addr, a);
            prop_assert_eq!(p.payload, &payload[..]);
            prop_assert_eq!(p.payload_offset, a.header_len());
            let l3 = a.header_len() - 28;
            prop_assert_eq!(ip_verify(&buf, l3), 0);
            prop_assert_eq!(udp_verify(&buf, l3), 0);
            // and the reply's addressing round-trips too
            let n = emit_udp_frame(&a.reversed(), &payload, &mut buf).unwrap();
            prop_assert_eq!(parse_udp_frame(&buf[..n]).unwrap().addr.reversed(), a);
        }

        #[test]
        fn any_bytes_parse_as_the_rules_say_or_are_rejected(
            bytes in prop_oneof![
                proptest::collection::vec(any::<u8>(), 0..120),
                near_valid_frame(),
            ]
        ) {
            let got = parse_udp_frame(&bytes);
            if let Ok(p) = &got {
                // The if-manager's recorded lengths give the same result.
                let l2 = if p.addr.vlan_tci.is_some() { 18 } else { 14 };
                let l3 = p.payload_offset - l2 - UDP_HDR_LEN;
                prop_assert_eq!(udp_frame_at(&bytes, l2, l3), Some(*p));
            }
            match (&got, reference_parse(&bytes)) {
                (Ok(p), Ok((vlan, ips, ports, start, end))) => {
                    prop_assert_eq!(p.addr.vlan_tci, vlan);
                    prop_assert_eq!(p.addr.src_ip.octets(), [ips[0], ips[1], ips[2], ips[3]]);
                    prop_assert_eq!(p.addr.dst_ip.octets(), [ips[4], ips[5], ips[6], ips[7]]);
                    prop_assert_eq!([p.addr.src_port, p.addr.dst_port], ports);
                    prop_assert_eq!(&p.addr.dst_mac.0[..], &bytes[0..6]);
                    prop_assert_eq!(&p.addr.src_mac.0[..], &bytes[6..12]);
                    prop_assert_eq!(p.payload_offset, start);
                    prop_assert_eq!(p.payload, &bytes[start..end]);
                }
                (Err(e), Err(k)) => prop_assert_eq!(e.kind(), k),
                (g, r) => prop_assert!(false, "parse {:?}, reference {:?}", g, r),
            }
            crate::fuzzing::parse_frame(&bytes);
        }
    }
}
