//! Photos to model inputs (cargo feature `image`): decode PNG or JPEG,
//! resize, centre-crop, as HxWx3 RGB u8 — the layout an image model of the
//! model repository takes (its normalisation, mean/std, is the platform's).
//!
//! # The exact arithmetic
//!
//! scripts/prepare_models.py has a Python reference of the same steps; a
//! change here is a change there. For a model input of `H`×`W` and a
//! decoded image of `w`×`h` pixels:
//!
//! 1. **To RGB u8.** `DynamicImage::to_rgb8()`: grey is replicated, alpha
//!    is dropped (not composited), 16-bit channels are scaled to 8 bits by
//!    the `image` crate. No EXIF orientation is applied.
//! 2. **Resize, keeping the aspect ratio**, so that the shorter side is
//!    `S = round(max(H, W) * 256 / 224)` — for the usual 224×224 input,
//!    `S = 256` (ImageNet's "resize 256, crop 224", generalised). The other
//!    side is `round(long * S / short)`. Both roundings are *half up*, in
//!    integers: `S = (2*max(H,W)*256 + 224) / (2*224)` and
//!    `long' = (2*long*S + short) / (2*short)` (integer division). A square
//!    image becomes `S`×`S`.
//! 3. **Filter:** `image::imageops::resize` with `FilterType::Triangle`:
//!    a separable bilinear (tent) filter, pixel centres at `i + 0.5`, whose
//!    support widens with the downscale ratio (so downscaling averages, like
//!    Pillow's `BILINEAR`, unlike OpenCV's `INTER_LINEAR`); weights
//!    normalised to sum 1; the vertical pass first, into an f32 buffer, then
//!    the horizontal pass, rounded and clamped to u8 at the end. If the
//!    image is already the target size it is copied unfiltered.
//! 4. **Centre crop** `W`×`H` from the `w'`×`h'` resized image at
//!    `x0 = (w' - W) / 2`, `y0 = (h' - H) / 2`, floored.
//! 5. **Layout:** row-major, `H` rows of `W` pixels of R, G, B: `H*W*3`
//!    bytes.

use std::path::Path;

pub use image::{DynamicImage, ImageError};

use image::imageops::{self, FilterType};

/// The shorter side an image is resized to before a centre crop of
/// `height`×`width`: `round(max(height, width) * 256 / 224)`, half up.
pub fn resize_short_side(height: u32, width: u32) -> u32 {
    let size = u64::from(height.max(width));
    ((2 * size * 256 + 224) / (2 * 224)) as u32
}

/// The size `(w', h')` a `width`×`height` image is resized to so that its
/// shorter side is `short_side`, the other one scaled to keep the aspect
/// ratio (rounded half up).
pub fn resized_dims(width: u32, height: u32, short_side: u32) -> (u32, u32) {
    let scale = |long: u32, short: u32| -> u32 {
        let (long, short, s) = (
            u64::from(long),
            u64::from(short.max(1)),
            u64::from(short_side),
        );
        ((2 * long * s + short) / (2 * short)) as u32
    };
    if width <= height {
        (short_side, scale(height, width))
    } else {
        (scale(width, height), short_side)
    }
}

/// `img` as a model input of `height`×`width`×3 RGB u8 (the steps of the
/// module docs).
pub fn preprocess(img: &DynamicImage, height: u32, width: u32) -> Vec<u8> {
    let rgb = img.to_rgb8();
    let short = resize_short_side(height, width);
    let (rw, rh) = resized_dims(rgb.width(), rgb.height(), short);
    let resized = imageops::resize(&rgb, rw, rh, FilterType::Triangle);
    let x0 = (rw - width) / 2;
    let y0 = (rh - height) / 2;
    imageops::crop_imm(&resized, x0, y0, width, height)
        .to_image()
        .into_raw()
}

/// Decodes a PNG or JPEG from memory and [`preprocess`]es it.
pub fn from_bytes(bytes: &[u8], height: u32, width: u32) -> Result<Vec<u8>, ImageError> {
    Ok(preprocess(&image::load_from_memory(bytes)?, height, width))
}

/// Reads a PNG or JPEG file and [`preprocess`]es it.
pub fn from_path(path: impl AsRef<Path>, height: u32, width: u32) -> Result<Vec<u8>, ImageError> {
    Ok(preprocess(&image::open(path)?, height, width))
}

#[cfg(test)]
mod tests {
    use super::*;
    use image::{ImageFormat, Rgb, RgbImage};
    use std::io::Cursor;

    #[test]
    fn sizes_follow_the_documented_rounding() {
        assert_eq!(resize_short_side(224, 224), 256);
        assert_eq!(resize_short_side(299, 299), 342); // 341.71 -> 342
        assert_eq!(resize_short_side(7, 7), 8);
        assert_eq!(resize_short_side(112, 100), 128);
        assert_eq!(resized_dims(640, 480, 256), (341, 256)); // 341.33
        assert_eq!(resized_dims(480, 640, 256), (256, 341));
        assert_eq!(resized_dims(500, 375, 256), (341, 256)); // 341.33
        assert_eq!(resized_dims(3, 2, 3), (5, 3)); // 4.5 -> 5, half up
        assert_eq!(resized_dims(300, 300, 256), (256, 256));
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
        // already: 341x256 -> no vertical scaling needed) image ends at
        // x = 170 - (341 - 224) / 2 = 170 - 58 = 112 in the crop.
        let mut img = RgbImage::new(341, 256);
        for y in 0..256 {
            img.put_pixel(170, y, Rgb([255, 255, 255]));
        }
        let out = preprocess(&DynamicImage::ImageRgb8(img), 224, 224);
        let row: Vec<u8> = (0..224).map(|x| out[(100 * 224 + x) * 3]).collect();
        let white: Vec<usize> = (0..224).filter(|&x| row[x] == 255).collect();
        assert_eq!(white, vec![112]);
    }
}
