//! kp-wire — kneepoint's wire contract as a sans-IO codec: the messages of
//! docs/PROTOCOL.md (version 1) and the Ethernet/IPv4/UDP frames that carry
//! them, the key that identifies a request, and the bounded table of
//! answered requests that keeps "exactly one answer per request" true when
//! stragglers arrive.
//!
//! It sits at the bottom of the crate graph and depends on nothing of
//! kneepoint: the if-manager, the IF runtime (libml), the traffic tools and
//! the fuzz targets (`fuzz/`) all build it alone, without DPDK or an
//! inference engine.
//!
//! # What
//!
//! - [`proto`]: request fragments ([`Fragment`], [`FragmentRepr`]),
//!   responses and errors ([`Response`], [`ResponseRepr`]), the fragment
//!   geometry ([`stride`], [`fragment_range`]), [`IfId`], [`Status`] and the
//!   [`RequestKey`] that identifies a request.
//! - [`net`]: Ethernet II with at most one 802.1Q tag, IPv4 and UDP
//!   ([`parse_udp_frame`], [`emit_udp_headers`], [`emit_udp_frame`],
//!   [`FrameAddr`]).
//! - [`answered`]: [`answered::AnsweredTable`], a fixed-size, time-bounded
//!   memory of answered requests, so that fragments arriving after an
//!   answer do not cause a second one.
//! - [`fuzzing`]: the bodies of the fuzz targets in `fuzz/`, also run
//!   over the committed seed corpus by `cargo test`.
//!
//! # Design
//!
//! Modelled on smoltcp's `wire`: a zero-copy view (`Fragment<T: AsRef<[u8]>>`,
//! `Response<T>`) that can only be made by `new_checked`, which validates
//! everything docs/PROTOCOL.md lets one datagram be checked for, so its accessors
//! read fields in place without re-checking; and a plain "Repr" struct that
//! the rest of the platform passes around and `emit`s. There is no
//! `new_unchecked`: the data plane's input is untrusted, and the checks are a
//! handful of compares.
//!
//! Bytes in, typed values or a typed error out: no I/O, no clock, no global
//! state. Parsing and emitting never allocate (emit writes into a caller's
//! `&mut [u8]`) and never panic, whatever the bytes. Every error is a
//! `thiserror` enum with a fieldless `*Kind` twin ([`MalformedKind`],
//! [`FrameErrorKind`]) that has `ALL` and `name()`, so each reason a packet is
//! dropped gets a counter. Everything on the wire is big-endian.
//!
//! # Example
//!
//! A fragment arrives; the platform answers it with an error, in a buffer
//! of its own:
//!
//! ```
//! use std::net::Ipv4Addr;
//! use kp_wire::*;
//!
//! // What a client sends: fragment 0 of a 3-byte request, in one frame.
//! let client = FrameAddr {
//!     src_mac: MacAddr([2, 0, 0, 0, 0, 1]),
//!     dst_mac: MacAddr([2, 0, 0, 0, 0, 2]),
//!     vlan_tci: None,
//!     src_ip: Ipv4Addr::new(10, 0, 0, 1),
//!     dst_ip: Ipv4Addr::new(10, 0, 0, 2),
//!     src_port: 40000,
//!     dst_port: 9000,
//! };
//! let header = FragmentRepr {
//!     if_id: IfId(7),
//!     request_id: 1,
//!     total_len: 3,
//!     frag_index: 0,
//!     frag_count: 1,
//!     send_ts_ns: 123,
//! };
//! let mut payload = [0u8; HEADER_LEN + 3];
//! header.emit_header(&mut payload)?;
//! payload[HEADER_LEN..].copy_from_slice(b"abc");
//! let mut frame = [0u8; 128];
//! let len = emit_udp_frame(&client, &payload, &mut frame)?;
//!
//! // What the platform does with it.
//! let udp = parse_udp_frame(&frame[..len])?;
//! let fragment = Fragment::new_checked(udp.payload)?;
//! assert_eq!(fragment.payload(), b"abc");
//! assert_eq!(fragment.payload_offset(), 0);
//! let got = FragmentRepr::parse(&fragment);
//! let reply = udp.addr.reversed();
//! let mut out = [0u8; 128];
//! let hdr = reply.header_len();
//! let answer = ResponseRepr::error(got.if_id, got.request_id, got.send_ts_ns, Status::UnknownIf, 0);
//! let n = answer.emit(&mut out[hdr..])?;
//! let len = emit_udp_headers(&reply, n, &mut out)?;
//!
//! // What the client reads back.
//! let udp = parse_udp_frame(&out[..len])?;
//! let response = Response::new_checked(udp.payload)?;
//! assert_eq!((response.status(), response.send_ts_ns()), (Status::UnknownIf, 123));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Limits
//!
//! - Only IPv4; at most one VLAN tag (QinQ is reported as not IPv4); IPv4
//!   fragments are rejected, not reassembled (kneepoint fragments requests
//!   itself, one datagram per fragment).
//! - The UDP checksum of received frames is not verified (veth and
//!   `af_packet` deliver `CHECKSUM_PARTIAL` packets with it unfilled); the
//!   IPv4 header checksum is. Emitted frames carry both.
//! - Emitted IPv4 headers have no options.
//! - Rules that span datagrams (fragments of one request agreeing on
//!   `total_len`, `frag_count`, `send_ts_ns`; duplicates) are the
//!   reassembler's, not this module's.

#![deny(unsafe_code)]

pub mod answered;
pub mod fuzzing;
pub mod net;
pub mod proto;

pub use net::{
    emit_udp_frame, emit_udp_headers, parse_udp_frame, udp_frame_at, FrameAddr, FrameError,
    FrameErrorKind, MacAddr, MacAddrParseError, UdpFrame, ETHERTYPE_IPV4, ETHERTYPE_VLAN,
    ETH_HDR_LEN, IPPROTO_UDP, IPV4_HDR_LEN, MAX_UDP_PAYLOAD, UDP_HDR_LEN, VLAN_TAG_LEN,
};
pub use proto::{
    fragment_range, stride, BufferTooSmall, Fragment, FragmentRepr, HeaderError, IfId,
    MalformedKind, MsgType, RequestKey, Response, ResponseError, ResponseRepr, Status, HEADER_LEN,
    MAGIC, MAX_RESULTS, RESPONSE_HEADER_LEN, RESULT_LEN, VERSION,
};
pub use proto::{mark_shed_notice, parse_shed_notice, SHED_NOTICE_TYPE};

#[cfg(test)]
mod testutil;
