//! Classic libpcap files: a writer and a reader, nothing else.
//!
//! The writer produces what tcpreplay, tcpdump and DPDK's `net_pcap` read:
//! the classic format (not pcapng), little-endian, `LINKTYPE_ETHERNET`,
//! microsecond timestamps. Timestamps are given in nanoseconds and truncated
//! to microseconds, so a generator can keep one time base for pcap records
//! and `send_ts_ns` fields.
//!
//! The reader accepts both byte orders and both the microsecond and the
//! nanosecond magic numbers, and returns timestamps in nanoseconds. It only
//! accepts `LINKTYPE_ETHERNET`: every kneepoint frame is Ethernet II.
//!
//! Limits: no pcapng, no other link types, records larger than the file's
//! snap length (or 256 KiB, whichever is larger) are refused as corrupt.

use std::io::{self, Read, Write};

/// `LINKTYPE_ETHERNET` (DLT_EN10MB).
pub const LINKTYPE_ETHERNET: u32 = 1;
/// Magic number of a microsecond-resolution classic pcap file.
pub const MAGIC_MICROS: u32 = 0xa1b2_c3d4;
/// Magic number of a nanosecond-resolution classic pcap file.
pub const MAGIC_NANOS: u32 = 0xa1b2_3c4d;
/// Snap length the writer declares: the largest Ethernet frame we emit
/// fits, and 65535 is what tcpdump writes by default for Ethernet.
pub const SNAPLEN: u32 = 65_535;
/// Upper bound on one record's captured length when reading, whatever the
/// header's snap length says: a corrupt length field must not make the
/// reader allocate gigabytes.
const MAX_RECORD: u32 = 256 * 1024;

const GLOBAL_HEADER_LEN: usize = 24;
const RECORD_HEADER_LEN: usize = 16;

/// Why a pcap file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum PcapError {
    /// The underlying reader failed.
    #[error("pcap I/O: {0}")]
    Io(#[from] io::Error),
    /// The file does not start with a classic pcap magic number.
    #[error("not a classic pcap file (magic {0:#010x})")]
    BadMagic(u32),
    /// The link type is not Ethernet.
    #[error("unsupported pcap link type {0} (only 1, Ethernet, is read)")]
    UnsupportedLinkType(u32),
    /// The file ends inside a header or a record.
    #[error("pcap file truncated inside {0}")]
    Truncated(&'static str),
    /// A record claims an implausible length.
    #[error("pcap record {index} claims {caplen} captured bytes (limit {limit})")]
    RecordTooLarge {
        /// 0-based record number.
        index: u64,
        /// The captured length it claims.
        caplen: u32,
        /// The largest accepted.
        limit: u32,
    },
}

/// Writes a classic pcap file, one Ethernet frame per record.
#[derive(Debug)]
pub struct PcapWriter<W: Write> {
    out: W,
    records: u64,
}

impl<W: Write> PcapWriter<W> {
    /// Writes the global header and returns the writer.
    pub fn new(mut out: W) -> io::Result<Self> {
        let mut h = [0u8; GLOBAL_HEADER_LEN];
        h[0..4].copy_from_slice(&MAGIC_MICROS.to_le_bytes());
        h[4..6].copy_from_slice(&2u16.to_le_bytes());
        h[6..8].copy_from_slice(&4u16.to_le_bytes());
        // thiszone (8..12) and sigfigs (12..16) stay 0.
        h[16..20].copy_from_slice(&SNAPLEN.to_le_bytes());
        h[20..24].copy_from_slice(&LINKTYPE_ETHERNET.to_le_bytes());
        out.write_all(&h)?;
        Ok(PcapWriter { out, records: 0 })
    }

    /// Appends one frame captured at `ts_ns` nanoseconds since the Unix
    /// epoch (stored with microsecond resolution).
    pub fn write_frame(&mut self, ts_ns: u64, frame: &[u8]) -> io::Result<()> {
        let len = u32::try_from(frame.len())
            .ok()
            .filter(|l| *l <= SNAPLEN)
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "frame of {} bytes exceeds the snap length {SNAPLEN}",
                        frame.len()
                    ),
                )
            })?;
        let secs = u32::try_from(ts_ns / 1_000_000_000).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                "timestamp past 2106 does not fit pcap",
            )
        })?;
        // < 1_000_000 by construction, so the cast is lossless.
        let micros = ((ts_ns % 1_000_000_000) / 1_000) as u32;
        let mut h = [0u8; RECORD_HEADER_LEN];
        h[0..4].copy_from_slice(&secs.to_le_bytes());
        h[4..8].copy_from_slice(&micros.to_le_bytes());
        h[8..12].copy_from_slice(&len.to_le_bytes());
        h[12..16].copy_from_slice(&len.to_le_bytes());
        self.out.write_all(&h)?;
        self.out.write_all(frame)?;
        self.records += 1;
        Ok(())
    }

    /// Records written so far.
    pub fn records(&self) -> u64 {
        self.records
    }

    /// Flushes and returns the inner writer.
    pub fn finish(mut self) -> io::Result<W> {
        self.out.flush()?;
        Ok(self.out)
    }
}

/// One record read back from a pcap file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PcapRecord {
    /// Capture time in nanoseconds since the Unix epoch.
    pub ts_ns: u64,
    /// Length of the frame on the wire (may exceed `data.len()` when the
    /// capture was cut at the snap length).
    pub orig_len: u32,
    /// The captured bytes.
    pub data: Vec<u8>,
}

/// Reads a classic pcap file record by record.
#[derive(Debug)]
pub struct PcapReader<R: Read> {
    input: R,
    big_endian: bool,
    nanos: bool,
    snaplen: u32,
    index: u64,
}

impl<R: Read> PcapReader<R> {
    /// Reads and checks the global header.
    pub fn new(mut input: R) -> Result<Self, PcapError> {
        let mut h = [0u8; GLOBAL_HEADER_LEN];
        if !read_full(&mut input, &mut h, "the global header")? {
            return Err(PcapError::Truncated("the global header"));
        }
        let le = u32::from_le_bytes([h[0], h[1], h[2], h[3]]);
        let be = u32::from_be_bytes([h[0], h[1], h[2], h[3]]);
        let (big_endian, nanos) = match (le, be) {
            (MAGIC_MICROS, _) => (false, false),
            (MAGIC_NANOS, _) => (false, true),
            (_, MAGIC_MICROS) => (true, false),
            (_, MAGIC_NANOS) => (true, true),
            _ => return Err(PcapError::BadMagic(le)),
        };
        let word = |b: &[u8]| {
            let a = [b[0], b[1], b[2], b[3]];
            if big_endian {
                u32::from_be_bytes(a)
            } else {
                u32::from_le_bytes(a)
            }
        };
        let snaplen = word(&h[16..20]);
        let linktype = word(&h[20..24]);
        if linktype != LINKTYPE_ETHERNET {
            return Err(PcapError::UnsupportedLinkType(linktype));
        }
        Ok(PcapReader {
            input,
            big_endian,
            nanos,
            snaplen,
            index: 0,
        })
    }

    /// Whether the file declares nanosecond timestamps.
    pub fn is_nanosecond(&self) -> bool {
        self.nanos
    }

    /// The next record, or `None` at a clean end of file.
    pub fn next_record(&mut self) -> Result<Option<PcapRecord>, PcapError> {
        let mut h = [0u8; RECORD_HEADER_LEN];
        if !read_full(&mut self.input, &mut h, "a record header")? {
            return Ok(None);
        }
        let word = |i: usize| {
            let a = [h[i], h[i + 1], h[i + 2], h[i + 3]];
            if self.big_endian {
                u32::from_be_bytes(a)
            } else {
                u32::from_le_bytes(a)
            }
        };
        let (secs, frac, caplen, orig_len) = (word(0), word(4), word(8), word(12));
        let limit = self.snaplen.max(MAX_RECORD);
        if caplen > limit {
            return Err(PcapError::RecordTooLarge {
                index: self.index,
                caplen,
                limit,
            });
        }
        let mut data = vec![0u8; caplen as usize];
        if !read_full(&mut self.input, &mut data, "a record")? && caplen > 0 {
            return Err(PcapError::Truncated("a record"));
        }
        let frac_ns = if self.nanos {
            u64::from(frac)
        } else {
            u64::from(frac) * 1_000
        };
        self.index += 1;
        Ok(Some(PcapRecord {
            ts_ns: u64::from(secs) * 1_000_000_000 + frac_ns,
            orig_len,
            data,
        }))
    }
}

impl<R: Read> Iterator for PcapReader<R> {
    type Item = Result<PcapRecord, PcapError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.next_record().transpose()
    }
}

/// Reads every record of the pcap file at `path`.
pub fn read_file(path: &std::path::Path) -> Result<Vec<PcapRecord>, PcapError> {
    let file = std::fs::File::open(path)?;
    PcapReader::new(io::BufReader::new(file))?.collect()
}

/// Fills `buf` from `input`. Returns `Ok(false)` if the input was already at
/// its end (nothing read), `Err(Truncated)` if it ended part-way.
fn read_full(input: &mut impl Read, buf: &mut [u8], what: &'static str) -> Result<bool, PcapError> {
    let mut filled = 0;
    while filled < buf.len() {
        match input.read(&mut buf[filled..]) {
            Ok(0) if filled == 0 => return Ok(false),
            Ok(0) => return Err(PcapError::Truncated(what)),
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<(u64, Vec<u8>)> {
        vec![
            (1_700_000_000_123_456_000, vec![0xaa; 60]),
            (1_700_000_000_123_457_999, (0..=255).collect()),
            (0, vec![]),
            (5_000_000_000, vec![1, 2, 3]),
        ]
    }

    #[test]
    fn write_then_read_round_trips_frames_and_microsecond_timestamps() {
        let mut w = PcapWriter::new(Vec::new()).unwrap();
        for (ts, f) in sample() {
            w.write_frame(ts, &f).unwrap();
        }
        assert_eq!(w.records(), 4);
        let bytes = w.finish().unwrap();
        assert_eq!(
            &bytes[..4],
            &[0xd4, 0xc3, 0xb2, 0xa1],
            "little-endian µs magic"
        );
        let r = PcapReader::new(&bytes[..]).unwrap();
        assert!(!r.is_nanosecond());
        let back: Vec<PcapRecord> = r.collect::<Result<_, _>>().unwrap();
        assert_eq!(back.len(), 4);
        for (rec, (ts, f)) in back.iter().zip(sample()) {
            assert_eq!(rec.ts_ns, ts / 1_000 * 1_000, "truncated to µs");
            assert_eq!(rec.data, f);
            assert_eq!(rec.orig_len as usize, f.len());
        }
    }

    fn nanosecond_big_endian_file() -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&MAGIC_NANOS.to_be_bytes());
        b.extend_from_slice(&2u16.to_be_bytes());
        b.extend_from_slice(&4u16.to_be_bytes());
        b.extend_from_slice(&[0; 8]);
        b.extend_from_slice(&65535u32.to_be_bytes());
        b.extend_from_slice(&1u32.to_be_bytes());
        for (secs, ns, data) in [(7u32, 999_999_999u32, &[9u8, 8, 7][..]), (8, 1, &[][..])] {
            b.extend_from_slice(&secs.to_be_bytes());
            b.extend_from_slice(&ns.to_be_bytes());
            b.extend_from_slice(&(data.len() as u32).to_be_bytes());
            b.extend_from_slice(&100u32.to_be_bytes());
            b.extend_from_slice(data);
        }
        b
    }

    #[test]
    fn reader_accepts_nanosecond_magic_in_either_byte_order() {
        let b = nanosecond_big_endian_file();
        let r = PcapReader::new(&b[..]).unwrap();
        assert!(r.is_nanosecond());
        let recs: Vec<_> = r.collect::<Result<_, _>>().unwrap();
        assert_eq!(recs[0].ts_ns, 7_999_999_999);
        assert_eq!(recs[0].data, vec![9, 8, 7]);
        assert_eq!(recs[0].orig_len, 100);
        assert_eq!(recs[1].ts_ns, 8_000_000_001);
    }

    #[test]
    fn reader_rejects_garbage_truncation_and_other_link_types() {
        assert!(matches!(
            PcapReader::new(&[0u8; 24][..]),
            Err(PcapError::BadMagic(0))
        ));
        assert!(matches!(
            PcapReader::new(&[0xd4u8, 0xc3][..]),
            Err(PcapError::Truncated(_))
        ));
        let mut b = nanosecond_big_endian_file();
        b[23] = 101; // LINKTYPE_RAW
        assert!(matches!(
            PcapReader::new(&b[..]),
            Err(PcapError::UnsupportedLinkType(101))
        ));
        let b = nanosecond_big_endian_file();
        let cut = &b[..b.len() - 16 - 1];
        let res: Result<Vec<_>, _> = PcapReader::new(cut).unwrap().collect();
        assert!(matches!(res, Err(PcapError::Truncated(_))));
    }

    #[test]
    fn writer_refuses_oversized_frames() {
        let mut w = PcapWriter::new(Vec::new()).unwrap();
        assert!(w.write_frame(0, &vec![0; SNAPLEN as usize + 1]).is_err());
    }
}
