//! Sans-IO classification of one received frame.
//!
//! [`classify`] takes the bytes of a frame and the platform's destination
//! filter and says what the frame is: a well-formed request fragment (with
//! the addressing needed to answer it), not for us, or malformed. It reads
//! no clock, touches no DPDK object and allocates nothing, so it is tested
//! on plain byte arrays and benchmarked in isolation.

use std::net::Ipv4Addr;

use kp_wire::{parse_udp_frame, Fragment, FragmentRepr, FrameAddr};

use crate::outcome::{MalformedReason, NotForUsReason};

/// Which datagrams are addressed to the platform.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DstFilter {
    /// UDP destination port (docs/PROTOCOL.md's "platform's port"; default 9000).
    pub port: u16,
    /// IPv4 destination address to accept; `None` accepts any.
    pub ip: Option<Ipv4Addr>,
}

/// What one frame is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// A well-formed request fragment addressed to us.
    Fragment {
        /// The frame's addressing (its reverse is the answer's).
        addr: FrameAddr,
        /// The fragment's header fields.
        header: FragmentRepr,
        /// Where the fragment's kneepoint header starts in the frame (after
        /// any IPv4 options).
        header_at: usize,
    },
    /// Not kneepoint traffic for this platform.
    NotForUs(NotForUsReason),
    /// Addressed to us, but broken.
    Malformed(MalformedReason),
}

/// Classifies one frame. Never panics, whatever the bytes.
#[inline]
pub fn classify(frame: &[u8], filter: &DstFilter) -> Verdict {
    let udp = match parse_udp_frame(frame) {
        Ok(udp) => udp,
        Err(e) if e.is_not_for_us() => return Verdict::NotForUs(NotForUsReason::NotIpv4Udp),
        Err(e) => return Verdict::Malformed(MalformedReason::Frame(e.kind())),
    };
    if udp.addr.dst_port != filter.port {
        return Verdict::NotForUs(NotForUsReason::WrongPort);
    }
    if filter.ip.is_some_and(|ip| ip != udp.addr.dst_ip) {
        return Verdict::NotForUs(NotForUsReason::WrongAddress);
    }
    match Fragment::new_checked(udp.payload) {
        Ok(fragment) => Verdict::Fragment {
            addr: udp.addr,
            header: FragmentRepr::parse(&fragment),
            header_at: udp.payload_offset,
        },
        Err(e) => Verdict::Malformed(MalformedReason::Header(e.kind())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kp_wire::{emit_udp_frame, FrameErrorKind, IfId, MacAddr, MalformedKind, HEADER_LEN};
    use proptest::prelude::*;

    const FILTER: DstFilter = DstFilter {
        port: 9000,
        ip: None,
    };

    fn addr(dst_port: u16) -> FrameAddr {
        FrameAddr {
            src_mac: MacAddr([2, 0, 0, 0, 0, 1]),
            dst_mac: MacAddr([2, 0, 0, 0, 0, 2]),
            vlan_tci: None,
            src_ip: Ipv4Addr::new(10, 77, 0, 1),
            dst_ip: Ipv4Addr::new(10, 77, 0, 2),
            src_port: 40000,
            dst_port,
        }
    }

    fn header() -> FragmentRepr {
        FragmentRepr {
            if_id: IfId(7),
            request_id: 42,
            total_len: 2500,
            frag_index: 2,
            frag_count: 3,
            send_ts_ns: 99,
        }
    }

    /// A frame carrying `header` and `payload_len` payload bytes.
    fn frame(a: &FrameAddr, h: &FragmentRepr, payload_len: usize) -> Vec<u8> {
        let mut payload = vec![0xAB; HEADER_LEN + payload_len];
        h.emit_header(&mut payload[..HEADER_LEN]).unwrap();
        let mut buf = vec![0; 64 + payload.len()];
        let n = emit_udp_frame(a, &payload, &mut buf).unwrap();
        buf.truncate(n);
        buf
    }

    #[test]
    fn a_well_formed_fragment_is_delivered_with_its_addressing() {
        let a = addr(9000);
        // last fragment of 3 for 2500 bytes: stride 834, carries 832 bytes
        let f = frame(&a, &header(), 2500 - 2 * 834);
        assert_eq!(
            classify(&f, &FILTER),
            Verdict::Fragment {
                addr: a,
                header: header(),
                header_at: 42,
            }
        );
    }

    #[test]
    fn wrong_port_and_wrong_address_are_not_for_us() {
        let f = frame(&addr(9001), &header(), 832);
        assert_eq!(
            classify(&f, &FILTER),
            Verdict::NotForUs(NotForUsReason::WrongPort)
        );
        let f = frame(&addr(9000), &header(), 832);
        let only = DstFilter {
            port: 9000,
            ip: Some(Ipv4Addr::new(10, 77, 0, 3)),
        };
        assert_eq!(
            classify(&f, &only),
            Verdict::NotForUs(NotForUsReason::WrongAddress)
        );
        let exact = DstFilter {
            port: 9000,
            ip: Some(Ipv4Addr::new(10, 77, 0, 2)),
        };
        assert!(matches!(classify(&f, &exact), Verdict::Fragment { .. }));
    }

    #[test]
    fn arp_is_not_for_us_and_a_truncated_frame_is_malformed() {
        let mut arp = vec![0u8; 42];
        arp[12] = 0x08;
        arp[13] = 0x06;
        assert_eq!(
            classify(&arp, &FILTER),
            Verdict::NotForUs(NotForUsReason::NotIpv4Udp)
        );
        let f = frame(&addr(9000), &header(), 832);
        assert!(matches!(
            classify(&f[..30], &FILTER),
            Verdict::Malformed(MalformedReason::Frame(FrameErrorKind::Truncated))
        ));
    }

    #[test]
    fn a_bad_header_is_malformed_with_its_reason() {
        // payload one byte short of what the geometry implies
        let f = frame(&addr(9000), &header(), 831);
        assert!(matches!(
            classify(&f, &FILTER),
            Verdict::Malformed(MalformedReason::Header(MalformedKind::PayloadLength))
        ));
    }

    proptest! {
        #[test]
        fn never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..1600)) {
            let _ = classify(&bytes, &FILTER);
        }
    }
}
