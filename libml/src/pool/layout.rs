//! A model's input layout on the wire and in the pool, and the conversion
//! of request bytes into pool elements, one fragment at a time.
//!
//! # Formats
//!
//! - [`InputLayout::RgbU8Hwc`]: the request is an `H×W` RGB image, one
//!   `u8` per channel, pixels row by row, channels interleaved (HWC). The
//!   slot holds `f32` NCHW (N = 1, C = 3): channel planes one after the
//!   other. Request byte `i` is pixel `p = i / 3` (`p = h·W + w`), channel
//!   `c = i % 3`, and lands in element `c·H·W + p`, normalised:
//!
//!   ```text
//!   x[c, h, w] = (f32(u8[h, w, c]) / 255.0f32 − mean[c]) / std[c]
//!   ```
//!
//!   evaluated in `f32`, two correctly rounded IEEE operations in that
//!   order (a division by 255, not a multiplication by 1/255; Rust never
//!   fuses them into an FMA), with `mean` and `std` as `f32`. numpy computes
//!   the same bits with `(img.astype(np.float32) / np.float32(255) − mean32)
//!   / std32` where `mean32 = np.array(mean, np.float32)` (and likewise
//!   `std32`). A byte has 256 values, so the result for each (channel, byte)
//!   pair is computed once, at construction, into a 3 × 256 lookup table;
//!   the data path only looks values up.
//! - [`InputLayout::F32Nchw`]: the request already is the model's input, `f32`
//!   NCHW (N = 1), each value as 4 little-endian bytes, copied bit for bit
//!   (NaN payloads included).
//! - [`InputLayout::RgbU8HwcRaw`]: the same images as `RgbU8Hwc`, kept in
//!   the slot as the bytes that came (`slot_elems` 4-byte words, the
//!   request's byte `i` at the slot's byte `i`, copied as the `f32` path
//!   copies, which on a little-endian host is byte order): for an engine
//!   that normalises on its device (the GPU gather reads the bytes from
//!   the pinned pool and applies the same table). The fragment thread then
//!   copies bytes only, a quarter of the bytes it writes for
//!   `RgbU8Hwc`. Its values are not the model's input: a host picks this
//!   layout for an engine that says it normalises images itself
//!   (`Framework::normalises_images`), or to move the conversion off the
//!   network-side core, when the runtime's inference thread makes each
//!   slot the model's input with [`InputLayout::normalise_raw`] (the same
//!   table, the same bits) before a CPU engine sees it (`kp-if
//!   --convert-on inference`).
//!
//! # Fragments
//!
//! [`InputLayout::write_fragment`] takes any byte range of the request: it
//! need not start or end on a pixel or on an `f32`, and fragments may come
//! in any order. The RGB path writes each byte's element independently, so
//! a pixel split across fragments needs nothing special. The `f32` path
//! assembles a value split across fragments in place: for the partial value
//! at either end of a fragment it reads the element's current bits, replaces
//! the bytes this fragment carries and writes it back, so whichever part
//! arrives second completes the value. This stays in safe code (no byte
//! view of the `f32` slot is needed) and costs one read-modify-write per
//! fragment end; the whole values in between are a plain
//! `f32::from_le_bytes` loop that compiles to a vectorised copy on a
//! little-endian host (see `benches/layout.rs`).
//!
//! # Cost
//!
//! The RGB path is per byte of every image (150 528 bytes for 224×224×3):
//! whole pixels go through one tight loop (three table look-ups, three
//! stores into the three planes, no bounds checks), eight pixels per step
//! read as three 64-bit words; the at most two partial pixels at either end
//! of a fragment are done separately. On the 2-core development machine
//! (AMD EPYC, busy) `benches/layout.rs` measured about 300 ns per 1 KiB
//! fragment (~3.3 GB/s of wire bytes, 13 GB/s of `f32` written), ~35 µs
//! per 224×224×3 request; the `f32` path about 25 ns per 1 KiB (~40 GB/s).

use std::fmt;

use super::PoolError;

// The raw layout and the f32 copy rely on a little-endian host: a word's
// bytes in memory are the request's bytes in wire order.
const _: () = assert!(
    cfg!(target_endian = "little"),
    "the input pool's byte layout assumes a little-endian host"
);

/// ImageNet's per-channel mean (R, G, B), the default image models'.
pub const IMAGENET_MEAN: [f32; 3] = [0.485, 0.456, 0.406];
/// ImageNet's per-channel standard deviation (R, G, B).
pub const IMAGENET_STD: [f32; 3] = [0.229, 0.224, 0.225];

/// How a request's bytes become the model's input in a pool slot.
///
/// Built once at start-up by [`InputLayout::rgb_u8_hwc`] or
/// [`InputLayout::f32_nchw`] (which check the shape and precompute what the
/// data path needs), then shared by reference.
#[derive(Clone, Debug, PartialEq)]
pub enum InputLayout {
    /// `H×W×3` RGB `u8` HWC on the wire, normalised `f32` NCHW in the slot.
    RgbU8Hwc(RgbU8Hwc),
    /// `C×H×W` little-endian `f32` NCHW on the wire, copied as is.
    F32Nchw(F32Nchw),
    /// `H×W×3` RGB `u8` HWC on the wire, the same bytes in the slot (for
    /// an engine that normalises on its device; module docs).
    RgbU8HwcRaw(RgbU8Hwc),
}

/// What a slot holds, as an engine that reads the pool in place needs to
/// know it ([`crate::engine::PoolLocation`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum SlotContent {
    /// The model's input, `elems` `f32` values NCHW.
    F32 {
        /// Values.
        elems: usize,
    },
    /// An `h×w×3` RGB `u8` HWC image as it came, to be normalised with
    /// `(b / 255 − mean[c]) / std[c]`.
    RgbU8Hwc {
        /// Rows.
        h: usize,
        /// Columns.
        w: usize,
        /// Per-channel mean.
        mean: [f32; 3],
        /// Per-channel standard deviation.
        std: [f32; 3],
    },
}

/// The [`InputLayout::RgbU8Hwc`] format: shape, normalisation and its
/// lookup table.
#[derive(Clone)]
pub struct RgbU8Hwc {
    h: usize,
    w: usize,
    mean: [f32; 3],
    std: [f32; 3],
    /// `lut[c][b] = (b as f32 / 255.0 - mean[c]) / std[c]`.
    lut: Box<[[f32; 256]; 3]>,
}

/// The [`InputLayout::F32Nchw`] format: its shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct F32Nchw {
    c: usize,
    h: usize,
    w: usize,
}

impl InputLayout {
    /// The layout a model's config declares (its input shape and format).
    pub fn for_model(model: &crate::model::ModelConfig) -> Result<InputLayout, PoolError> {
        use crate::model::InputFormat;
        let [c, h, w] = model.input.shape;
        match &model.input.format {
            InputFormat::RgbU8Hwc { mean, std } if c == 3 => {
                InputLayout::rgb_u8_hwc(h, w, *mean, *std)
            }
            InputFormat::RgbU8Hwc { .. } => Err(PoolError::NotRgb(c)),
            InputFormat::F32Nchw => InputLayout::f32_nchw(c, h, w),
        }
    }

    /// This layout for an engine that normalises images on its device:
    /// an `RgbU8Hwc` layout becomes [`InputLayout::RgbU8HwcRaw`] (same
    /// image, same normalisation, raw bytes in the slot); others stay.
    pub fn raw_images(self) -> InputLayout {
        match self {
            InputLayout::RgbU8Hwc(l) => InputLayout::RgbU8HwcRaw(l),
            other => other,
        }
    }

    /// What a slot holds, for an engine that reads the pool in place.
    pub fn slot_content(&self) -> SlotContent {
        match self {
            InputLayout::RgbU8HwcRaw(l) => SlotContent::RgbU8Hwc {
                h: l.h,
                w: l.w,
                mean: l.mean,
                std: l.std,
            },
            _ => SlotContent::F32 {
                elems: self.input_elems(),
            },
        }
    }

    /// An `h×w` RGB `u8` HWC image, normalised per channel with `mean` and
    /// `std` (e.g. [`IMAGENET_MEAN`], [`IMAGENET_STD`]).
    ///
    /// Errors: [`PoolError::EmptyLayout`] if `h` or `w` is 0;
    /// [`PoolError::LayoutTooLarge`] if the request is over `u32::MAX`
    /// bytes (docs/PROTOCOL.md's `total_len` is a `u32`);
    /// [`PoolError::BadNormalisation`] if a mean or std is not finite, a
    /// std is 0, or any normalised value is not finite.
    pub fn rgb_u8_hwc(
        h: usize,
        w: usize,
        mean: [f32; 3],
        std: [f32; 3],
    ) -> Result<InputLayout, PoolError> {
        request_len(&[h, w, 3])?;
        let mut lut = Box::new([[0.0f32; 256]; 3]);
        for (c, table) in lut.iter_mut().enumerate() {
            if !mean[c].is_finite() || !std[c].is_finite() || std[c] == 0.0 {
                return Err(PoolError::BadNormalisation { channel: c });
            }
            for (b, v) in table.iter_mut().enumerate() {
                *v = normalise(b as u8, mean[c], std[c]);
                if !v.is_finite() {
                    return Err(PoolError::BadNormalisation { channel: c });
                }
            }
        }
        Ok(InputLayout::RgbU8Hwc(RgbU8Hwc {
            h,
            w,
            mean,
            std,
            lut,
        }))
    }

    /// A `c×h×w` `f32` NCHW tensor sent as little-endian bytes.
    ///
    /// Errors: [`PoolError::EmptyLayout`] if a dimension is 0;
    /// [`PoolError::LayoutTooLarge`] if the request is over `u32::MAX`
    /// bytes.
    pub fn f32_nchw(c: usize, h: usize, w: usize) -> Result<InputLayout, PoolError> {
        request_len(&[c, h, w, 4])?;
        Ok(InputLayout::F32Nchw(F32Nchw { c, h, w }))
    }

    /// The model input's shape `[C, H, W]` (the slot is one NCHW tensor
    /// with N = 1).
    pub fn chw(&self) -> [usize; 3] {
        match self {
            InputLayout::RgbU8Hwc(l) | InputLayout::RgbU8HwcRaw(l) => [3, l.h, l.w],
            InputLayout::F32Nchw(l) => [l.c, l.h, l.w],
        }
    }

    /// Values of the model's input per request: `C·H·W`.
    pub fn input_elems(&self) -> usize {
        let [c, h, w] = self.chw();
        c * h * w
    }

    /// Bytes of one request on the wire (the reassembler's `input_len`).
    pub fn request_bytes(&self) -> usize {
        match self {
            InputLayout::RgbU8Hwc(_) | InputLayout::RgbU8HwcRaw(_) => self.input_elems(),
            InputLayout::F32Nchw(_) => self.input_elems() * 4,
        }
    }

    /// 4-byte words per slot: `C·H·W` values, or for
    /// [`InputLayout::RgbU8HwcRaw`] the request's bytes rounded up to
    /// whole words.
    pub fn slot_elems(&self) -> usize {
        match self {
            InputLayout::RgbU8HwcRaw(_) => self.request_bytes().div_ceil(4),
            _ => self.input_elems(),
        }
    }

    /// Whether slots of this layout hold an image's raw bytes
    /// ([`InputLayout::RgbU8HwcRaw`]) rather than the model's input.
    pub fn is_raw(&self) -> bool {
        matches!(self, InputLayout::RgbU8HwcRaw(_))
    }

    /// Writes into `out` (the model's input, `input_elems` values) what
    /// the `RgbU8Hwc` layout would have put in the slot, from `raw`, a slot
    /// of this [`InputLayout::RgbU8HwcRaw`] layout (`slot_elems` words
    /// holding the request's bytes): the same table, the same bits. Nothing
    /// is allocated (the bytes go through a buffer on the stack).
    ///
    /// # Panics
    ///
    /// On another layout, or slices of other sizes: the caller's
    /// configuration.
    pub fn normalise_raw(&self, raw: &[f32], out: &mut [f32]) {
        let InputLayout::RgbU8HwcRaw(l) = self else {
            panic!("normalise_raw on a layout that is not raw images");
        };
        assert_eq!(raw.len(), self.slot_elems(), "raw slot of the wrong size");
        assert_eq!(out.len(), self.input_elems(), "input of the wrong size");
        // 3,072 bytes a step: whole words and whole pixels.
        const WORDS: usize = 768;
        let total = self.request_bytes();
        let mut bytes = [0u8; 4 * WORDS];
        for (k, words) in raw.chunks(WORDS).enumerate() {
            for (b, w) in bytes.chunks_exact_mut(4).zip(words) {
                b.copy_from_slice(&w.to_bits().to_le_bytes());
            }
            let at = k * 4 * WORDS;
            let len = (4 * words.len()).min(total - at);
            l.write(&bytes[..len], at, out);
        }
    }

    /// Converts bytes `[offset, offset + payload.len())` of a request into
    /// their places in `slot`, the request's slot of
    /// [`slot_elems`](InputLayout::slot_elems) values. Touches only the
    /// elements those bytes belong to (for `F32Nchw`, only those bytes of
    /// them), so fragments may be written in any order.
    ///
    /// # Panics
    ///
    /// If `slot.len() != self.slot_elems()` or the range goes past
    /// [`request_bytes`](InputLayout::request_bytes): both are the caller's
    /// configuration (the reassembler has already checked a fragment's range
    /// against its `input_len`, which must be `request_bytes`).
    #[inline]
    pub fn write_fragment(&self, payload: &[u8], offset: usize, slot: &mut [f32]) {
        assert_eq!(
            slot.len(),
            self.slot_elems(),
            "slot of the wrong size for this layout"
        );
        assert!(
            offset
                .checked_add(payload.len())
                .is_some_and(|end| end <= self.request_bytes()),
            "fragment [{offset}, +{}) past the request's {} bytes",
            payload.len(),
            self.request_bytes()
        );
        match self {
            InputLayout::RgbU8Hwc(l) => l.write(payload, offset, slot),
            // The raw bytes land where the f32 path puts them: byte `i` of
            // the request at byte `i` of the slot (little-endian words).
            InputLayout::F32Nchw(_) | InputLayout::RgbU8HwcRaw(_) => {
                write_f32_le(payload, offset, slot)
            }
        }
    }
}

/// The normalisation of one byte, exactly as documented (module docs).
#[inline]
fn normalise(b: u8, mean: f32, std: f32) -> f32 {
    (f32::from(b) / 255.0 - mean) / std
}

/// `dims`' product in bytes, if non-zero and within a `u32`.
fn request_len(dims: &[usize]) -> Result<usize, PoolError> {
    if dims.contains(&0) {
        return Err(PoolError::EmptyLayout);
    }
    dims.iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .filter(|&n| u32::try_from(n).is_ok())
        .ok_or(PoolError::LayoutTooLarge)
}

impl RgbU8Hwc {
    /// Image height.
    pub fn h(&self) -> usize {
        self.h
    }

    /// Image width.
    pub fn w(&self) -> usize {
        self.w
    }

    /// Per-channel mean.
    pub fn mean(&self) -> [f32; 3] {
        self.mean
    }

    /// Per-channel standard deviation.
    pub fn std(&self) -> [f32; 3] {
        self.std
    }

    /// The hot path: `payload` is request bytes from `offset` on; ranges and
    /// `slot`'s size are checked by the caller.
    #[inline]
    fn write(&self, payload: &[u8], offset: usize, slot: &mut [f32]) {
        let hw = self.h * self.w;
        let (r, gb) = slot.split_at_mut(hw);
        let (g, b) = gb.split_at_mut(hw);
        let mut planes = [r, g, b];
        let lut = &*self.lut;

        // The partial pixel at the start: channels (offset % 3)..3.
        let lead = ((3 - offset % 3) % 3).min(payload.len());
        let (head, rest) = payload.split_at(lead);
        for (k, &byte) in head.iter().enumerate() {
            let i = offset + k;
            planes[i % 3][i / 3] = lut[i % 3][usize::from(byte)];
        }

        // Whole pixels: three look-ups and three stores each. Eight at a
        // time (24 bytes), read as three little-endian words whose bytes
        // come out by shifts: 3 loads instead of 24, ~20% faster than a
        // byte at a time (see `benches/layout.rs`); then one at a time.
        let first = (offset + lead) / 3;
        let (blocks, rest) = rest.as_chunks::<24>();
        let (pixels, tail) = rest.as_chunks::<3>();
        let blocked = first + blocks.len() * 8;
        let end = blocked + pixels.len();
        let [r, g, b] = &mut planes;
        let (lr, lg, lb) = (&lut[0], &lut[1], &lut[2]);
        let r8 = r[first..blocked].as_chunks_mut::<8>().0;
        let g8 = g[first..blocked].as_chunks_mut::<8>().0;
        let b8 = b[first..blocked].as_chunks_mut::<8>().0;
        for (((block, r), g), b) in blocks.iter().zip(r8).zip(g8).zip(b8) {
            let words = block.as_chunks::<8>().0;
            let w = [
                u64::from_le_bytes(words[0]),
                u64::from_le_bytes(words[1]),
                u64::from_le_bytes(words[2]),
            ];
            let byte = |j: usize| ((w[j / 8] >> (8 * (j % 8))) & 0xff) as usize;
            for k in 0..8 {
                r[k] = lr[byte(3 * k)];
                g[k] = lg[byte(3 * k + 1)];
                b[k] = lb[byte(3 * k + 2)];
            }
        }
        let (r1, g1, b1) = (
            &mut r[blocked..end],
            &mut g[blocked..end],
            &mut b[blocked..end],
        );
        for (((px, r), g), b) in pixels.iter().zip(r1).zip(g1).zip(b1) {
            *r = lr[usize::from(px[0])];
            *g = lg[usize::from(px[1])];
            *b = lb[usize::from(px[2])];
        }

        // The partial pixel at the end: channels 0..tail.len().
        for (c, &byte) in tail.iter().enumerate() {
            planes[c][end] = lut[c][usize::from(byte)];
        }
    }
}

/// Request bytes from `offset` on, little-endian `f32`s, into `slot`.
#[inline]
fn write_f32_le(payload: &[u8], offset: usize, slot: &mut [f32]) {
    // The partial value at the start: its bytes (offset % 4).. .
    let skip = offset % 4;
    let lead = ((4 - skip) % 4).min(payload.len());
    let (head, rest) = payload.split_at(lead);
    if !head.is_empty() {
        patch_bytes(&mut slot[offset / 4], skip, head);
    }

    // Whole values.
    let first = (offset + lead) / 4;
    let (values, tail) = rest.as_chunks::<4>();
    let end = first + values.len();
    for (d, s) in slot[first..end].iter_mut().zip(values) {
        *d = f32::from_le_bytes(*s);
    }

    // The partial value at the end: its bytes 0..tail.len().
    if !tail.is_empty() {
        patch_bytes(&mut slot[end], 0, tail);
    }
}

/// Replaces bytes `at..at + bytes.len()` of `v`'s little-endian
/// representation, keeping the others (bit for bit: `to_bits`/`from_bits`
/// are transmutes).
#[inline]
fn patch_bytes(v: &mut f32, at: usize, bytes: &[u8]) {
    let mut le = v.to_bits().to_le_bytes();
    le[at..at + bytes.len()].copy_from_slice(bytes);
    *v = f32::from_bits(u32::from_le_bytes(le));
}

impl fmt::Debug for RgbU8Hwc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RgbU8Hwc")
            .field("h", &self.h)
            .field("w", &self.w)
            .field("mean", &self.mean)
            .field("std", &self.std)
            .finish_non_exhaustive()
    }
}

/// The table follows from the other fields.
impl PartialEq for RgbU8Hwc {
    fn eq(&self, other: &Self) -> bool {
        (self.h, self.w, self.mean, self.std) == (other.h, other.w, other.mean, other.std)
    }
}

impl F32Nchw {
    /// Channels.
    pub fn c(&self) -> usize {
        self.c
    }

    /// Height.
    pub fn h(&self) -> usize {
        self.h
    }

    /// Width.
    pub fn w(&self) -> usize {
        self.w
    }
}
