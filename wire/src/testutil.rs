//! Test helpers shared by the wire tests: frame builders, an independent
//! checksum, and the fuzz seed corpus (generated here, committed under
//! `fuzz/corpus/`).

use std::net::Ipv4Addr;

use super::net::{emit_udp_frame, FrameAddr, MacAddr, ETHERTYPE_VLAN, ETH_HDR_LEN, VLAN_TAG_LEN};
use super::proto::{FragmentRepr, IfId, ResponseRepr, Status, HEADER_LEN};

/// The Internet checksum the slow, obvious way: sum 16-bit big-endian
/// words (odd byte padded) into a wide integer, fold carries until none is
/// left, complement. Written apart from `net`'s own so each checks the other.
pub fn independent_checksum(parts: &[&[u8]]) -> u16 {
    let bytes: Vec<u8> = parts.iter().flat_map(|p| p.iter().copied()).collect();
    let mut sum: u128 = 0;
    let mut i = 0;
    while i < bytes.len() {
        let hi = u128::from(bytes[i]);
        let lo = if i + 1 < bytes.len() {
            u128::from(bytes[i + 1])
        } else {
            0
        };
        sum += hi * 256 + lo;
        i += 2;
    }
    while sum >> 16 != 0 {
        sum = (sum & 0xFFFF) + (sum >> 16);
    }
    !(sum as u16)
}

/// A test addressing, tagged with `vlan` if given.
pub fn addr(vlan: Option<u16>) -> FrameAddr {
    FrameAddr {
        src_mac: MacAddr([0x02, 0, 0, 0, 0, 0x01]),
        dst_mac: MacAddr([0x02, 0, 0, 0, 0, 0x02]),
        vlan_tci: vlan,
        src_ip: Ipv4Addr::new(10, 77, 0, 1),
        dst_ip: Ipv4Addr::new(10, 77, 0, 2),
        src_port: 40000,
        dst_port: 9000,
    }
}

/// A frame with `addr` around `payload`.
pub fn frame(addr: &FrameAddr, payload: &[u8]) -> Vec<u8> {
    let mut buf = vec![0u8; addr.header_len() + payload.len()];
    let n = emit_udp_frame(addr, payload, &mut buf).unwrap();
    assert_eq!(n, buf.len());
    buf
}

/// Where the IPv4 header of a frame built here starts.
pub fn l3(frame: &[u8]) -> usize {
    if u16::from_be_bytes([frame[12], frame[13]]) == ETHERTYPE_VLAN {
        ETH_HDR_LEN + VLAN_TAG_LEN
    } else {
        ETH_HDR_LEN
    }
}

/// Recomputes the IPv4 header checksum after a test changed the header.
pub fn fix_ip_checksum(frame: &mut [u8]) {
    let l3 = l3(frame);
    let ihl = usize::from(frame[l3] & 0x0F) * 4;
    frame[l3 + 10] = 0;
    frame[l3 + 11] = 0;
    let c = independent_checksum(&[&frame[l3..l3 + ihl]]);
    frame[l3 + 10..l3 + 12].copy_from_slice(&c.to_be_bytes());
}

/// `frame` with `options` (a multiple of 4 bytes) added to its IPv4 header.
pub fn with_ip_options(frame: &[u8], options: &[u8]) -> Vec<u8> {
    assert_eq!(options.len() % 4, 0);
    let l3 = l3(frame);
    let mut out = frame[..l3 + 20].to_vec();
    out.extend_from_slice(options);
    out.extend_from_slice(&frame[l3 + 20..]);
    out[l3] = 0x40 | (5 + options.len() / 4) as u8;
    let total = u16::from_be_bytes([out[l3 + 2], out[l3 + 3]]) + options.len() as u16;
    out[l3 + 2..l3 + 4].copy_from_slice(&total.to_be_bytes());
    fix_ip_checksum(&mut out);
    out
}

/// A request fragment with `h`'s header and `payload_len` payload bytes
/// (a recognisable pattern).
pub fn fragment(h: &FragmentRepr, payload_len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; HEADER_LEN + payload_len];
    h.emit_header(&mut buf).unwrap();
    for (i, b) in buf[HEADER_LEN..].iter_mut().enumerate() {
        *b = (i % 251) as u8;
    }
    buf
}

/// Fragment 1 of 3 of a 2500-byte request (stride 834).
pub fn header() -> FragmentRepr {
    FragmentRepr {
        if_id: IfId(7),
        request_id: 0x0102_0304_0506_0708,
        total_len: 2500,
        frag_index: 1,
        frag_count: 3,
        send_ts_ns: 0x1122_3344_5566_7788,
    }
}

/// A response (type 2) with the given results.
pub fn response(results: &[(u32, f32)]) -> Vec<u8> {
    let r = ResponseRepr {
        msg_type: super::proto::MsgType::Response,
        if_id: IfId(7),
        request_id: 42,
        send_ts_ns: 99,
        status: Status::Ok,
        batch_size: 8,
        latency_us: 1234,
        results,
    };
    let mut buf = vec![0u8; r.wire_len()];
    r.emit(&mut buf).unwrap();
    buf
}

/// Fragment 1 of 3 of a 25-byte request (stride 9): the seeds' header,
/// small so the fuzzer's inputs stay small.
pub fn seed_header() -> FragmentRepr {
    FragmentRepr {
        total_len: 25,
        ..header()
    }
}

/// Seeds for `parse_fragment`: valid fragments, responses, and one per
/// malformed kind (named after it).
pub fn fragment_seeds() -> Vec<(&'static str, Vec<u8>)> {
    let h = seed_header();
    let small = |total_len, frag_count, frag_index| FragmentRepr {
        total_len,
        frag_count,
        frag_index,
        ..seed_header()
    };
    let mut bad_magic = fragment(&h, 9);
    bad_magic[0] = b'X';
    let mut bad_version = fragment(&h, 9);
    bad_version[4] = 2;
    let mut bad_type = fragment(&h, 9);
    bad_type[5] = 2;
    let error = {
        let r = ResponseRepr::error(IfId(7), 42, 99, Status::UnknownIf, 0);
        let mut buf = vec![0u8; r.wire_len()];
        r.emit(&mut buf).unwrap();
        buf
    };
    vec![
        ("valid_single", fragment(&small(16, 1, 0), 16)),
        ("valid_middle", fragment(&h, 9)),
        (
            "valid_last",
            fragment(&FragmentRepr { frag_index: 2, ..h }, 7),
        ),
        ("too_short", fragment(&h, 9)[..HEADER_LEN - 1].to_vec()),
        ("bad_magic", bad_magic),
        ("bad_version", bad_version),
        ("bad_type", bad_type),
        ("zero_total_len", fragment(&small(0, 1, 0), 0)),
        ("zero_frag_count", fragment(&small(10, 0, 0), 10)),
        ("index_out_of_range", fragment(&small(10, 2, 2), 5)),
        ("empty_last_fragment", fragment(&small(5, 4, 0), 2)),
        ("payload_length", fragment(&h, 8)),
        (
            "response_ok",
            response(&[(3, 9.5), (1, 2.25), (0, -1.0), (7, f32::MIN_POSITIVE)]),
        ),
        ("response_error", error),
    ]
}

/// Seeds for `parse_frame`: valid frames (plain, VLAN, IP options,
/// Ethernet padding, a response) and one per frame error kind.
pub fn frame_seeds() -> Vec<(&'static str, Vec<u8>)> {
    let plain = addr(None);
    let tagged = addr(Some(0x2064)); // PCP 1, VLAN 100
    let frag = fragment(&seed_header(), 9);
    let good = frame(&plain, &frag);
    let l3 = ETH_HDR_LEN;

    let small = fragment(
        &FragmentRepr {
            total_len: 4,
            frag_count: 1,
            frag_index: 0,
            ..seed_header()
        },
        4,
    );
    // trailing bytes after the IP datagram (Ethernet padding, or an FCS
    // left on by the capture)
    let mut padded = frame(&plain, &small);
    padded.extend_from_slice(&[0, 0, 0, 0, 0xDE, 0xAD, 0xBE, 0xEF]);
    // a short datagram padded to the 60-byte Ethernet minimum
    let mut short_padded = frame(&plain, b"hi");
    short_padded.resize(60, 0);

    let mut arp = vec![0u8; 42];
    arp[12..14].copy_from_slice(&0x0806u16.to_be_bytes());

    let mut not_udp = good.clone();
    not_udp[l3 + 9] = 6; // TCP
    fix_ip_checksum(&mut not_udp);

    let mut bad_version = good.clone();
    bad_version[l3] = 0x65;
    fix_ip_checksum(&mut bad_version);

    let mut bad_header_len = good.clone();
    bad_header_len[l3] = 0x44;

    let mut bad_total_len = good.clone();
    bad_total_len[l3 + 2..l3 + 4].copy_from_slice(&19u16.to_be_bytes());
    fix_ip_checksum(&mut bad_total_len);

    let mut bad_checksum = good.clone();
    bad_checksum[l3 + 10] ^= 0x01;

    let mut ip_fragment = good.clone();
    ip_fragment[l3 + 6] |= 0x20; // MF
    fix_ip_checksum(&mut ip_fragment);

    let mut bad_udp_length = good.clone();
    let udp = l3 + 20;
    let too_long = (8 + frag.len() + 1) as u16;
    bad_udp_length[udp + 4..udp + 6].copy_from_slice(&too_long.to_be_bytes());

    let mut bad_header = frag.clone();
    bad_header[0] = 0;

    vec![
        ("valid", good.clone()),
        ("valid_vlan", frame(&tagged, &frag)),
        (
            "valid_ip_options",
            with_ip_options(&good, &[0x01, 0x01, 0x01, 0x00]),
        ),
        ("valid_padded", padded),
        ("valid_short_padded", short_padded),
        (
            "valid_vlan_response",
            frame(&tagged, &response(&[(1, 0.5)])),
        ),
        ("valid_frame_bad_magic", frame(&plain, &bad_header)),
        ("truncated", good[..good.len() - 1].to_vec()),
        ("not_ipv4", arp),
        ("not_udp", not_udp),
        ("bad_ip_version", bad_version),
        ("bad_ip_header_len", bad_header_len),
        ("bad_ip_total_len", bad_total_len),
        ("bad_ip_checksum", bad_checksum),
        ("ip_fragment", ip_fragment),
        ("bad_udp_length", bad_udp_length),
    ]
}
