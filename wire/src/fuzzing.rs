//! Bodies of the wire codec's fuzz targets in `fuzz/` (the repository's
//! cargo-fuzz project).
//!
//! They live here, not in the fuzz crate, so that `cargo test` runs the
//! committed seed corpus (`fuzz/corpus/<target>/`) through exactly the
//! code the fuzzer runs, on the stable toolchain. Each body parses, and on
//! success re-emits, re-parses and asserts that nothing changed; a failed
//! assertion is the bug the fuzzer reports. Unlike the codec they exercise,
//! these functions allocate and panic on purpose.

use std::fs;
use std::path::PathBuf;

use super::net::{emit_udp_frame, parse_udp_frame, FrameErrorKind};
use super::proto::{
    fragment_range, stride, Fragment, FragmentRepr, MalformedKind, MsgType, Response, ResponseRepr,
    HEADER_LEN,
};

/// Runs `data` through both kneepoint message parsers ([`Fragment`] and
/// [`Response`]); whatever parses must re-emit to the same bytes and
/// re-parse to the same fields.
pub fn parse_fragment(data: &[u8]) {
    match Fragment::new_checked(data) {
        Ok(f) => {
            let repr = FragmentRepr::parse(&f);
            let range = f.payload_range();
            assert_eq!(Some(range.clone()), repr.payload_range());
            assert_eq!(
                Some(range.clone()),
                fragment_range(repr.total_len, repr.frag_count, repr.frag_index)
            );
            assert_eq!(Some(f.stride()), stride(repr.total_len, repr.frag_count));
            assert_eq!(
                f.payload_offset(),
                usize::from(repr.frag_index) * f.stride() as usize
            );
            assert_eq!(range.start, f.payload_offset());
            assert_eq!(range.len(), f.payload().len());
            assert!(!f.payload().is_empty());
            assert!(range.end <= repr.total_len as usize);

            // The header is fully determined by its fields: re-emitting
            // gives back the very bytes.
            let mut buf = vec![0u8; data.len()];
            repr.emit_header(&mut buf).expect("buffer holds the header");
            buf[HEADER_LEN..].copy_from_slice(f.payload());
            assert_eq!(buf, data);
            let again = Fragment::new_checked(&buf[..]).expect("re-emitted fragment parses");
            assert_eq!(FragmentRepr::parse(&again), repr);
        }
        Err(e) => assert!(MalformedKind::ALL.contains(&e.kind())),
    }

    if let Ok(r) = Response::new_checked(data) {
        let results: Vec<(u32, f32)> = r.results().collect();
        assert_eq!(results.len(), usize::from(r.k()));
        assert!(matches!(r.msg_type(), MsgType::Response | MsgType::Error));
        let repr = ResponseRepr {
            msg_type: r.msg_type(),
            if_id: r.if_id(),
            request_id: r.request_id(),
            send_ts_ns: r.send_ts_ns(),
            status: r.status(),
            batch_size: r.batch_size(),
            latency_us: r.latency_us(),
            results: &results,
        };
        assert_eq!(repr.wire_len(), data.len());
        let mut buf = vec![0u8; repr.wire_len()];
        let n = repr.emit(&mut buf).expect("buffer of wire_len bytes");
        assert_eq!(n, data.len());
        // Scores travel as raw bits, so even NaN payloads come back equal.
        assert_eq!(buf, data);
    }
}

/// Runs `data` through [`parse_udp_frame`]; a frame that parses must
/// re-emit (with a canonical IPv4 header) to one that parses to the same
/// addressing and payload. The payload then goes through
/// [`parse_fragment`].
pub fn parse_frame(data: &[u8]) {
    match parse_udp_frame(data) {
        Ok(udp) => {
            let end = udp.payload_offset + udp.payload.len();
            assert!(end <= data.len());
            assert_eq!(&data[udp.payload_offset..end], udp.payload);

            let mut buf = vec![0u8; udp.addr.header_len() + udp.payload.len()];
            let n = emit_udp_frame(&udp.addr, udp.payload, &mut buf).expect("buffer fits");
            assert_eq!(n, buf.len());
            let again = parse_udp_frame(&buf).expect("re-emitted frame parses");
            assert_eq!(again.addr, udp.addr);
            assert_eq!(again.payload, udp.payload);
            assert_eq!(again.payload_offset, udp.addr.header_len());

            parse_fragment(udp.payload);
        }
        Err(e) => {
            assert!(FrameErrorKind::ALL.contains(&e.kind()));
            assert_eq!(
                e.is_not_for_us(),
                matches!(e.kind(), FrameErrorKind::NotIpv4 | FrameErrorKind::NotUdp)
            );
        }
    }
}

/// Where fuzz target `target`'s committed seed corpus is:
/// `fuzz/corpus/<target>/` of this repository.
pub fn seed_corpus_dir(target: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/corpus")
        .join(target)
}

/// Every file of fuzz target `target`'s committed seed corpus (name and
/// bytes), sorted by name: what each crate's test replays through its
/// target's body. Panics when the corpus cannot be read (a test helper).
pub fn seed_corpus(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = seed_corpus_dir(target);
    let mut files: Vec<(String, Vec<u8>)> = fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            (name, fs::read(&path).unwrap())
        })
        .collect();
    files.sort();
    files
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;
    use crate::testutil::{fragment_seeds, frame_seeds};

    #[test]
    fn the_fragment_seed_corpus_runs_clean() {
        let files = seed_corpus("parse_fragment");
        assert!(files.len() >= 10, "only {} seeds", files.len());
        for (name, bytes) in files {
            eprintln!("parse_fragment seed {name}");
            parse_fragment(&bytes);
        }
    }

    #[test]
    fn the_frame_seed_corpus_runs_clean() {
        let files = seed_corpus("parse_frame");
        assert!(files.len() >= 10, "only {} seeds", files.len());
        for (name, bytes) in files {
            eprintln!("parse_frame seed {name}");
            parse_frame(&bytes);
        }
    }

    /// The committed seeds are the generator's output (files the fuzzer added
    /// beside them are allowed).
    #[test]
    fn the_committed_seeds_are_up_to_date() {
        for (target, seeds) in [
            ("parse_fragment", fragment_seeds()),
            ("parse_frame", frame_seeds()),
        ] {
            let committed = seed_corpus(target);
            for (name, bytes) in seeds {
                let found = committed.iter().find(|(n, _)| *n == name);
                assert_eq!(
                    found.map(|(_, b)| b),
                    Some(&bytes),
                    "{target}/{name} is missing or stale: run \
                     `cargo test -p kp-wire -- --ignored write_seed_corpus`"
                );
            }
        }
    }

    /// Writes the seed corpus; run it after changing the generator:
    /// `cargo test -p kp-wire -- --ignored write_seed_corpus`.
    #[test]
    #[ignore = "writes files into fuzz/corpus"]
    fn write_seed_seed_corpus() {
        for (target, seeds) in [
            ("parse_fragment", fragment_seeds()),
            ("parse_frame", frame_seeds()),
        ] {
            let dir = seed_corpus_dir(target);
            fs::create_dir_all(&dir).unwrap();
            for (name, bytes) in seeds {
                fs::write(dir.join(name), bytes).unwrap();
            }
        }
    }
}
