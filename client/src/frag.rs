//! Cutting a request into fragments (docs/PROTOCOL.md, "Request fragment").
//!
//! The geometry is the protocol's, not "chunks of `payload` bytes": with
//! `frag_count = ceil(total_len / payload)` fragments, fragment `i` carries
//! bytes `[i*stride, min((i+1)*stride, total_len))` where `stride =
//! ceil(total_len / frag_count)` — kp-wire's [`fragment_range`]. `stride <=
//! payload`, so no fragment is larger than asked for, and the last fragment
//! is never empty: `(frag_count-1)*stride <= (frag_count-1)*payload <
//! total_len`. (Cutting 9 bytes at 4 per fragment gives 3+3+3, not 4+4+1:
//! the platform would call 4+4+1 malformed.)

use kp_wire::{fragment_range, FragmentRepr, IfId, HEADER_LEN, MAX_UDP_PAYLOAD};

use crate::ClientError;

/// Most payload bytes one fragment can carry: a UDP datagram over IPv4
/// holds at most 65507 bytes ([`MAX_UDP_PAYLOAD`]), 32 of them the header.
pub const MAX_FRAGMENT_PAYLOAD: usize = MAX_UDP_PAYLOAD - HEADER_LEN;

/// Payload bytes per fragment unless configured otherwise: 1024, the same
/// as kp-gen and kp-client (`kp_traffic::gen::DEFAULT_FRAG_SIZE`). A
/// fragment is then 1024 + 32 bytes of UDP payload, well inside a
/// 1500-byte MTU (up to 1440 payload bytes fit one; beyond that the kernel
/// IP-fragments the datagram and the platform drops IP fragments).
pub const DEFAULT_FRAGMENT_PAYLOAD: usize = 1024;

/// How a request of `total_len` bytes is cut at `payload` bytes per
/// fragment: `(frag_count, stride)`.
///
/// Errors: [`ClientError::EmptyInput`] for 0 bytes,
/// [`ClientError::InputTooLarge`] if `total_len` does not fit the `u32`
/// field or needs more than 65535 fragments, and
/// [`ClientError::Config`] for a `payload` outside
/// `1..=`[`MAX_FRAGMENT_PAYLOAD`].
pub fn geometry(total_len: usize, payload: usize) -> Result<(u16, u32), ClientError> {
    if !(1..=MAX_FRAGMENT_PAYLOAD).contains(&payload) {
        return Err(ClientError::Config(format!(
            "fragment payload {payload} is outside 1..={MAX_FRAGMENT_PAYLOAD}"
        )));
    }
    if total_len == 0 {
        return Err(ClientError::EmptyInput);
    }
    let too_large = || ClientError::InputTooLarge {
        len: total_len,
        payload,
    };
    let total = u32::try_from(total_len).map_err(|_| too_large())?;
    let count = u16::try_from(total_len.div_ceil(payload)).map_err(|_| too_large())?;
    let stride = kp_wire::stride(total, count).ok_or_else(too_large)?;
    Ok((count, stride))
}

/// The datagrams of one request, one at a time, written into a buffer the
/// caller reuses (`HEADER_LEN + payload` bytes).
#[derive(Debug)]
pub struct Fragmenter<'a> {
    input: &'a [u8],
    cut: Cut,
}

impl<'a> Fragmenter<'a> {
    /// Fragments of `input` for `if_id` under `request_id`, at most
    /// `payload` bytes each; `send_ts_ns` is echoed back by the platform.
    pub fn new(
        if_id: u16,
        request_id: u64,
        send_ts_ns: u64,
        input: &'a [u8],
        payload: usize,
    ) -> Result<Self, ClientError> {
        Ok(Fragmenter {
            input,
            cut: Cut::new(if_id, request_id, send_ts_ns, input.len(), payload)?,
        })
    }

    /// Number of fragments.
    pub fn frag_count(&self) -> u16 {
        self.cut.frag_count()
    }

    /// Writes the next fragment into `buf` and returns its bytes
    /// (`buf[..32 + len]`); `None` after the last. `buf` must hold
    /// `HEADER_LEN + stride` bytes (`HEADER_LEN + payload` always does).
    pub fn next_into<'b>(&mut self, buf: &'b mut [u8]) -> Option<&'b [u8]> {
        let input = self.input;
        self.cut
            .next_with(buf, |offset, dst| {
                dst.copy_from_slice(&input[offset..offset + dst.len()]);
            })
            .map(|d| &*d)
    }
}

/// A request's fragments without its input: the headers and the geometry,
/// with the payload bytes filled by a callback (`fill(offset, dst)`: copy
/// input bytes `offset..offset + dst.len()` into `dst`). [`Fragmenter`]
/// fills from a slice; [`Client::prepare_with`](crate::Client::prepare_with)
/// from whatever the caller reads its input through (the Python binding:
/// a numpy array's buffer, copied once, straight into the datagrams).
#[derive(Debug)]
pub(crate) struct Cut {
    header: FragmentRepr,
    next: u16,
}

impl Cut {
    pub(crate) fn new(
        if_id: u16,
        request_id: u64,
        send_ts_ns: u64,
        total_len: usize,
        payload: usize,
    ) -> Result<Cut, ClientError> {
        let (frag_count, _) = geometry(total_len, payload)?;
        Ok(Cut {
            header: FragmentRepr {
                if_id: IfId(if_id),
                request_id,
                // geometry() checked that it fits.
                total_len: total_len as u32,
                frag_index: 0,
                frag_count,
                send_ts_ns,
            },
            next: 0,
        })
    }

    pub(crate) fn frag_count(&self) -> u16 {
        self.header.frag_count
    }

    /// Writes the next fragment's header into `buf` and its payload with
    /// `fill`, and returns the datagram (`buf[..32 + len]`); `None` after
    /// the last or if `buf` is too short.
    pub(crate) fn next_with<'b>(
        &mut self,
        buf: &'b mut [u8],
        fill: impl FnOnce(usize, &mut [u8]),
    ) -> Option<&'b mut [u8]> {
        if self.next >= self.header.frag_count {
            return None;
        }
        let index = self.next;
        self.next += 1;
        let range = fragment_range(self.header.total_len, self.header.frag_count, index)?;
        let out = buf.get_mut(..HEADER_LEN + range.len())?;
        FragmentRepr {
            frag_index: index,
            ..self.header
        }
        .emit_header(out)
        .ok()?;
        fill(range.start, &mut out[HEADER_LEN..]);
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kp_wire::Fragment;

    fn all(input: &[u8], payload: usize) -> Vec<Vec<u8>> {
        let mut f = Fragmenter::new(7, 0xDEAD_BEEF_0000_0001, 42, input, payload).unwrap();
        let mut buf = vec![0u8; HEADER_LEN + payload];
        let mut out = Vec::new();
        while let Some(d) = f.next_into(&mut buf) {
            out.push(d.to_vec());
        }
        out
    }

    #[test]
    fn fragments_decode_with_the_wire_crate_and_reassemble_byte_exact() {
        let input: Vec<u8> = (0..150_528u32).map(|i| (i * 31 % 251) as u8).collect();
        for payload in [1024, 1000, 1440, 4096, 65_000, MAX_FRAGMENT_PAYLOAD, 7] {
            let frags = all(&input, payload);
            let want_count = input.len().div_ceil(payload);
            assert_eq!(frags.len(), want_count, "payload {payload}");
            let mut back = vec![0u8; input.len()];
            for (i, d) in frags.iter().enumerate() {
                let f = Fragment::new_checked(&d[..]).expect("the platform's decoder accepts it");
                assert!(d.len() <= HEADER_LEN + payload, "payload {payload}");
                assert_eq!(f.if_id(), IfId(7));
                assert_eq!(f.request_id(), 0xDEAD_BEEF_0000_0001);
                assert_eq!(f.total_len(), 150_528);
                assert_eq!(usize::from(f.frag_index()), i);
                assert_eq!(usize::from(f.frag_count()), want_count);
                assert_eq!(f.send_ts_ns(), 42);
                back[f.payload_range()].copy_from_slice(f.payload());
            }
            assert!(back == input, "payload {payload}: reassembly differs");
        }
    }

    #[test]
    fn header_bytes_are_the_protocols() {
        let frags = all(b"abcdefghi", 4);
        // 9 bytes at <= 4 per fragment: 3 fragments of stride 3, not 4+4+1.
        assert_eq!(frags.len(), 3);
        assert!(frags.iter().all(|d| d.len() == HEADER_LEN + 3));
        let d = &frags[2];
        assert_eq!(&d[0..4], b"KNPT");
        assert_eq!(d[4], 1, "version");
        assert_eq!(d[5], 1, "type: request fragment");
        assert_eq!(&d[6..8], &[0, 7], "if_id");
        assert_eq!(&d[8..16], &0xDEAD_BEEF_0000_0001u64.to_be_bytes());
        assert_eq!(&d[16..20], &[0, 0, 0, 9], "total_len");
        assert_eq!(&d[20..22], &[0, 2], "frag_index");
        assert_eq!(&d[22..24], &[0, 3], "frag_count");
        assert_eq!(&d[24..32], &42u64.to_be_bytes(), "send_ts_ns");
        assert_eq!(&d[32..], b"ghi", "the last fragment's payload");
    }

    #[test]
    fn every_size_gives_a_valid_geometry() {
        for total in 1..300usize {
            for payload in 1..40usize {
                let (count, stride) = geometry(total, payload).unwrap();
                assert_eq!(usize::from(count), total.div_ceil(payload));
                assert!(stride as usize <= payload);
                let last = fragment_range(total as u32, count, count - 1).unwrap();
                assert!(!last.is_empty() && last.end == total);
            }
        }
    }

    #[test]
    fn bad_sizes_are_typed_errors() {
        assert!(matches!(geometry(0, 1024), Err(ClientError::EmptyInput)));
        assert!(matches!(geometry(10, 0), Err(ClientError::Config(_))));
        assert!(matches!(
            geometry(10, MAX_FRAGMENT_PAYLOAD + 1),
            Err(ClientError::Config(_))
        ));
        // 65535 one-byte fragments fit the u16 frag_count, 65536 do not.
        assert!(geometry(65_535, 1).is_ok());
        assert!(matches!(
            geometry(65_536, 1),
            Err(ClientError::InputTooLarge { .. })
        ));
    }
}
