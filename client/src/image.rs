//! Photos to model inputs (cargo feature `image`): decode PNG or JPEG,
//! resize, centre-crop, as HxWx3 RGB u8 — the layout an image model of the
//! model repository takes (its normalisation, mean/std, is the platform's).
//!
//! # The exact arithmetic
//!
//! This is `resize_shorter_crop()` of scripts/prepare_models.py, bit for
//! bit: the model repository's photo check (`make models`) classifies the
//! bytes that function gives, and this crate's tests compare its output on
//! the same photo byte for byte (`photo_coffee.u8`). **A change here is a
//! change there**, and the other way round. For a model input of `H`×`W`
//! and a decoded image of `w`×`h` pixels:
//!
//! 1. **To RGB u8.** `DynamicImage::to_rgb8()`: grey is replicated, alpha
//!    is dropped (not composited), 16-bit channels are scaled to 8 bits by
//!    the `image` crate (Pillow's `convert("RGB")` does the same for 8-bit
//!    PNGs). No EXIF orientation is applied. PNG decodes to the same pixels
//!    everywhere; JPEG decoders (this crate's and Pillow's libjpeg) may
//!    differ by a few levels, so only PNG inputs are bit-exact end to end.
//! 2. **Resized size**, keeping the aspect ratio, so that the shorter side
//!    is `S = round(max(H, W) * 256 / 224)` ([`resize_short_side`]) — for
//!    the usual 224×224 input `S = 256`, the reference's `PHOTO_RESIZE`
//!    (ImageNet's "resize 256, crop 224", generalised). The other side is
//!    `round(long * S / short)` ([`resized_dims`]). Both round half up, in
//!    integers. A square image becomes `S`×`S`. Since `S > max(H, W)`, the
//!    resized image always covers the crop.
//! 3. **Bilinear on pixel centres** (align_corners = false), no
//!    antialiasing (a downscale samples, it does not average), every step
//!    in `f64`, in this order: for output row `y` of the resized image,
//!    `sy = (y + 0.5) * (h / h') - 0.5` (the ratio `h / h'` divided first),
//!    clamped to `[0, h - 1]`; `y0 = floor(sy)`, `y1 = min(y0 + 1, h - 1)`,
//!    `fy = sy - y0`; the same for columns with `w / w'`. Then, per
//!    channel, `top = p[y0,x0] + (p[y0,x1] - p[y0,x0]) * fx`,
//!    `bot = p[y1,x0] + (p[y1,x1] - p[y1,x0]) * fx`,
//!    `v = top + (bot - top) * fy`, and the byte is
//!    `min(255, max(0, floor(v + 0.5)))` (half up). No fused multiply-add:
//!    Rust does not contract `a + b * c`, numpy does not either.
//! 4. **Centre crop** `W`×`H` at `x0 = (w' - W) / 2`, `y0 = (h' - H) / 2`,
//!    floored. Only the crop's pixels are computed (step 3 for those rows
//!    and columns of the resized image).
//! 5. **Layout:** row-major, `H` rows of `W` pixels of R, G, B: `H*W*3`
//!    bytes.
//!
//! [`preprocess_rgb`] runs steps 2 to 5 on a raw RGB buffer (for callers
//! that decode themselves, such as a Python binding) and returns a typed
//! [`PreprocessError`] for a buffer that is not `w*h*3` bytes or a size
//! with a zero side.

use std::path::Path;

pub use image::{DynamicImage, ImageError};

use image::error::{ParameterError, ParameterErrorKind};

/// Why [`preprocess_rgb`] cannot make a model input.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PreprocessError {
    /// The buffer is not `width * height * 3` bytes.
    #[error("an RGB image of {width}x{height} is {expected} bytes, the buffer has {got}")]
    WrongLength {
        /// The image's width, as given.
        width: u32,
        /// The image's height, as given.
        height: u32,
        /// `width * height * 3`.
        expected: u64,
        /// The buffer's length.
        got: usize,
    },
    /// The image has no pixels.
    #[error("the image is {width}x{height}: no pixels")]
    EmptyImage {
        /// The image's width.
        width: u32,
        /// The image's height.
        height: u32,
    },
    /// The model input asked for has no pixels.
    #[error("a model input of {height}x{width} has no pixels")]
    EmptyOutput {
        /// Rows asked for.
        height: u32,
        /// Columns asked for.
        width: u32,
    },
}

/// The shorter side an image is resized to before a centre crop of
/// `height`×`width`: `round(max(height, width) * 256 / 224)`, half up.
pub fn resize_short_side(height: u32, width: u32) -> u32 {
    let size = u64::from(height.max(width));
    ((2 * size * 256 + 224) / (2 * 224)) as u32
}

/// The size `(w', h')` a `width`×`height` image is resized to so that its
/// shorter side is `short_side`, the other one scaled to keep the aspect
/// ratio (rounded half up; `u32::MAX` if it would not fit, which no image
/// that fits in memory reaches with a sensible `short_side`).
pub fn resized_dims(width: u32, height: u32, short_side: u32) -> (u32, u32) {
    let (w, h) = resized_dims_u64(width, height, short_side);
    let fit = |v: u64| u32::try_from(v).unwrap_or(u32::MAX);
    (fit(w), fit(h))
}

/// [`resized_dims`] without the narrowing: `long * short_side` can exceed
/// `u32` for a very long, thin image.
fn resized_dims_u64(width: u32, height: u32, short_side: u32) -> (u64, u64) {
    let scale = |long: u32, short: u32| -> u64 {
        let (long, short, s) = (
            u64::from(long),
            u64::from(short.max(1)),
            u64::from(short_side),
        );
        (2 * long * s + short) / (2 * short)
    };
    if width <= height {
        (u64::from(short_side), scale(height, width))
    } else {
        (scale(width, height), u64::from(short_side))
    }
}

/// One output row's (or column's) source pixels: `(i0, i1, f)` with the
/// value `p[i0] + (p[i1] - p[i0]) * f`, for `n_out` positions of an axis
/// resized from `n_in` to `n_res` pixels, starting at resized position
/// `start` (step 3 of the module docs).
fn axis(n_in: u32, n_res: u64, start: u64, n_out: u32) -> Vec<(usize, usize, f64)> {
    let ratio = f64::from(n_in) / n_res as f64;
    let last = f64::from(n_in - 1);
    (0..u64::from(n_out))
        .map(|i| {
            let s = ((start + i) as f64 + 0.5) * ratio - 0.5;
            let s = s.max(0.0).min(last);
            let i0 = s.floor();
            let i1 = (i0 + 1.0).min(last);
            (i0 as usize, i1 as usize, s - i0)
        })
        .collect()
}

/// A raw RGB u8 image (`width`×`height`, row-major, R G B per pixel) as a
/// model input of `out_h`×`out_w`×3 RGB u8 (steps 2 to 5 of the module
/// docs, bit for bit scripts/prepare_models.py's `resize_shorter_crop`).
pub fn preprocess_rgb(
    rgb: &[u8],
    width: u32,
    height: u32,
    out_h: u32,
    out_w: u32,
) -> Result<Vec<u8>, PreprocessError> {
    let expected = u64::from(width) * u64::from(height) * 3;
    if rgb.len() as u64 != expected {
        return Err(PreprocessError::WrongLength {
            width,
            height,
            expected,
            got: rgb.len(),
        });
    }
    if width == 0 || height == 0 {
        return Err(PreprocessError::EmptyImage { width, height });
    }
    if out_h == 0 || out_w == 0 {
        return Err(PreprocessError::EmptyOutput {
            height: out_h,
            width: out_w,
        });
    }
    let short = resize_short_side(out_h, out_w);
    let (rw, rh) = resized_dims_u64(width, height, short);
    // S > max(out_h, out_w) and the long side >= S: the crop always fits.
    debug_assert!(rw >= u64::from(out_w) && rh >= u64::from(out_h));
    let rows = axis(height, rh, (rh - u64::from(out_h)) / 2, out_h);
    let cols = axis(width, rw, (rw - u64::from(out_w)) / 2, out_w);
    let stride = width as usize * 3;
    let px = |y: usize, x: usize, c: usize| f64::from(rgb[y * stride + x * 3 + c]);
    let mut out = Vec::with_capacity(out_h as usize * out_w as usize * 3);
    for &(y0, y1, fy) in &rows {
        for &(x0, x1, fx) in &cols {
            for c in 0..3 {
                let (a, b) = (px(y0, x0, c), px(y0, x1, c));
                let top = a + (b - a) * fx;
                let (a, b) = (px(y1, x0, c), px(y1, x1, c));
                let bot = a + (b - a) * fx;
                let v = top + (bot - top) * fy;
                out.push((v + 0.5).floor().clamp(0.0, 255.0) as u8);
            }
        }
    }
    Ok(out)
}

/// `img` as a model input of `height`×`width`×3 RGB u8 (the steps of the
/// module docs). An image or a size with a zero side (no decoder gives
/// such an image) gives an empty `Vec`; [`preprocess_rgb`] says why.
pub fn preprocess(img: &DynamicImage, height: u32, width: u32) -> Vec<u8> {
    try_preprocess(img, height, width).unwrap_or_default()
}

fn try_preprocess(img: &DynamicImage, height: u32, width: u32) -> Result<Vec<u8>, PreprocessError> {
    let rgb = img.to_rgb8();
    preprocess_rgb(rgb.as_raw(), rgb.width(), rgb.height(), height, width)
}

/// [`try_preprocess`] with its error as the decoder's error type.
fn preprocess_decoded(img: &DynamicImage, height: u32, width: u32) -> Result<Vec<u8>, ImageError> {
    try_preprocess(img, height, width).map_err(|e| {
        ImageError::Parameter(ParameterError::from_kind(ParameterErrorKind::Generic(
            e.to_string(),
        )))
    })
}

/// Decodes a PNG or JPEG from memory and [`preprocess`]es it.
pub fn from_bytes(bytes: &[u8], height: u32, width: u32) -> Result<Vec<u8>, ImageError> {
    preprocess_decoded(&image::load_from_memory(bytes)?, height, width)
}

/// Reads a PNG or JPEG file and [`preprocess`]es it.
pub fn from_path(path: impl AsRef<Path>, height: u32, width: u32) -> Result<Vec<u8>, ImageError> {
    preprocess_decoded(&image::open(path)?, height, width)
}

#[cfg(test)]
mod tests {
    use super::*;
    use image::{ImageFormat, Rgb, RgbImage};
    use std::io::Cursor;
    use std::path::PathBuf;

    #[test]
    fn sizes_follow_the_documented_rounding() {
        assert_eq!(resize_short_side(224, 224), 256);
        assert_eq!(resize_short_side(299, 299), 342); // 341.71 -> 342
        assert_eq!(resize_short_side(7, 7), 8);
        assert_eq!(resize_short_side(112, 100), 128);
        assert_eq!(resized_dims(640, 480, 256), (341, 256)); // 341.33
        assert_eq!(resized_dims(480, 640, 256), (256, 341));
        assert_eq!(resized_dims(500, 375, 256), (341, 256)); // 341.33
        assert_eq!(resized_dims(600, 400, 256), (384, 256)); // coffee.png
        assert_eq!(resized_dims(3, 2, 3), (5, 3)); // 4.5 -> 5, half up
        assert_eq!(resized_dims(300, 300, 256), (256, 256));
        // 1 x 20,000,000 to a short side of 256: 5.12e9 does not fit u32.
        assert_eq!(resized_dims(20_000_000, 1, 256), (u32::MAX, 256));
    }

    #[test]
    fn sample_positions_are_pixel_centres_clamped_at_the_edges() {
        // 2 -> 4 (ratio 0.5): s = (i + 0.5) * 0.5 - 0.5 = -0.25, 0.25,
        // 0.75, 1.25; clamped to [0, 1].
        assert_eq!(
            axis(2, 4, 0, 4),
            vec![(0, 1, 0.0), (0, 1, 0.25), (0, 1, 0.75), (1, 1, 0.0)]
        );
        // 6 -> 3 (ratio 2, no averaging): s = 0.5, 2.5, 4.5; a crop that
        // starts at resized column 1 gets the last two.
        assert_eq!(
            axis(6, 3, 0, 3),
            vec![(0, 1, 0.5), (2, 3, 0.5), (4, 5, 0.5)]
        );
        assert_eq!(axis(6, 3, 1, 2), vec![(2, 3, 0.5), (4, 5, 0.5)]);
        // Same size: the identity.
        assert_eq!(
            axis(3, 3, 0, 3),
            vec![(0, 1, 0.0), (1, 2, 0.0), (2, 2, 0.0)]
        );
    }

    #[test]
    fn a_2x2_image_to_1x1_is_the_centre_bilinear_value_rounded_half_up() {
        // Out 1x1: S = round(256/224) = 1, resized 1x1, sx = sy = 0.5.
        // R: 0 10 / 20 31: top 5, bottom 25.5, v = 15.25 -> 15.
        // G: 0 1 / 0 1: v = 0.5 -> 1 (half up). B: 2 3 / 2 3: 2.5 -> 3
        // (half up, where round-half-even would give 2).
        let rgb = [0, 0, 2, 10, 1, 3, 20, 0, 2, 31, 1, 3];
        assert_eq!(preprocess_rgb(&rgb, 2, 2, 1, 1), Ok(vec![15, 1, 3]));
    }

    #[test]
    fn an_upscale_interpolates_between_neighbours() {
        // A 1-row image 0, 100 (w 2, h 1) to out 1x2: S = round(2*256/224)
        // = 2 (2.29); resized (round(2*2/1), 2) = (4, 2); the crop starts
        // at column (4 - 2) / 2 = 1, row 0. Columns 1, 2: s = 0.25, 0.75
        // -> 25, 75. Rows: 1 -> 2, s clamped to 0.
        let rgb = [0, 0, 0, 100, 200, 255];
        assert_eq!(
            preprocess_rgb(&rgb, 2, 1, 1, 2),
            Ok(vec![25, 50, 64, 75, 150, 191]) // 63.75 -> 64, 191.25 -> 191
        );
    }

    #[test]
    fn bad_buffers_and_sizes_are_typed_errors() {
        assert_eq!(
            preprocess_rgb(&[0; 11], 2, 2, 1, 1),
            Err(PreprocessError::WrongLength {
                width: 2,
                height: 2,
                expected: 12,
                got: 11
            })
        );
        assert_eq!(
            preprocess_rgb(&[], 0, 5, 224, 224),
            Err(PreprocessError::EmptyImage {
                width: 0,
                height: 5
            })
        );
        assert_eq!(
            preprocess_rgb(&[0; 12], 2, 2, 0, 224),
            Err(PreprocessError::EmptyOutput {
                height: 0,
                width: 224
            })
        );
        // u32::MAX squared does not overflow the length check.
        assert!(matches!(
            preprocess_rgb(&[0; 3], u32::MAX, u32::MAX, 1, 1),
            Err(PreprocessError::WrongLength { .. })
        ));
        let empty = DynamicImage::ImageRgb8(RgbImage::new(0, 0));
        assert!(preprocess(&empty, 224, 224).is_empty());
    }

    /// An image whose left half is red and right half blue, with a green
    /// band in the middle rows.
    fn test_image(w: u32, h: u32) -> RgbImage {
        RgbImage::from_fn(w, h, |x, y| {
            if y >= h / 2 - 2 && y < h / 2 + 2 {
                Rgb([0, 255, 0])
            } else if x < w / 2 {
                Rgb([255, 0, 0])
            } else {
                Rgb([0, 0, 255])
            }
        })
    }

    #[test]
    fn png_and_jpeg_decode_to_the_model_layout() {
        let img = DynamicImage::ImageRgb8(test_image(640, 480));
        for fmt in [ImageFormat::Png, ImageFormat::Jpeg] {
            let mut bytes = Vec::new();
            img.write_to(&mut Cursor::new(&mut bytes), fmt).unwrap();
            let out = from_bytes(&bytes, 224, 224).unwrap();
            assert_eq!(out.len(), 224 * 224 * 3, "{fmt:?}");
            let px = |x: usize, y: usize| &out[(y * 224 + x) * 3..][..3];
            // Left is red, right is blue, the centre rows are green.
            assert!(px(10, 10)[0] > 200 && px(10, 10)[2] < 50, "{fmt:?}");
            assert!(px(213, 10)[2] > 200 && px(213, 10)[0] < 50, "{fmt:?}");
            assert!(px(60, 112)[1] > 100, "{fmt:?}: {:?}", px(60, 112));
        }
        assert!(from_bytes(b"not an image", 224, 224).is_err());
    }

    #[test]
    fn the_crop_is_centred_with_a_floored_offset() {
        // A 1-pixel-wide white column at x = 170 of a 341-wide (resized
        // already: 341x256 -> no scaling, sample positions exact) image
        // ends at x = 170 - (341 - 224) / 2 = 170 - 58 = 112 in the crop.
        let mut img = RgbImage::new(341, 256);
        for y in 0..256 {
            img.put_pixel(170, y, Rgb([255, 255, 255]));
        }
        let out = preprocess(&DynamicImage::ImageRgb8(img), 224, 224);
        let row: Vec<u8> = (0..224).map(|x| out[(100 * 224 + x) * 3]).collect();
        let white: Vec<usize> = (0..224).filter(|&x| row[x] == 255).collect();
        assert_eq!(white, vec![112]);
        assert!(row.iter().enumerate().all(|(x, &v)| x == 112 || v == 0));
    }

    /// A file that `make models` writes (the model repository or
    /// build/photos/), with a hint when it is missing.
    fn made_by_make_models(relative: &str) -> PathBuf {
        let p = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join(relative);
        assert!(
            p.is_file(),
            "{} is missing: run `make models` (MODELS=efficientnet_lite0 is enough)",
            p.display()
        );
        p
    }

    #[test]
    fn coffee_matches_the_python_reference_byte_for_byte() {
        let photo = made_by_make_models("build/photos/coffee.png");
        let reference = std::fs::read(made_by_make_models(
            "models/efficientnet_lite0/check/photo_coffee.u8",
        ))
        .unwrap();
        let ours = from_path(&photo, 224, 224).unwrap();
        assert_eq!(ours.len(), reference.len());
        let differ = ours.iter().zip(&reference).filter(|(a, b)| a != b).count();
        assert_eq!(
            differ,
            0,
            "{differ} of {} bytes differ from scripts/prepare_models.py's resize_shorter_crop",
            reference.len()
        );
    }
}
