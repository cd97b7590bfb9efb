//! Request payloads: what the bytes of one request are.
//!
//! A request carries one input tensor in the model's layout. For the image
//! models kneepoint serves that is `height × width × channels` u8 in HWC
//! order (224×224×3 RGB by default, 150528 bytes). Three sources:
//!
//! - **images** (PNG or JPEG files, or folders of them): decoded and made
//!   the shape's size (the platform does no preprocessing, so the client
//!   must send the model's size). RGB (3 channels) goes through the client
//!   library's `image::preprocess`: the shorter side resized, then a centre
//!   crop, bit for bit the model repository's preprocessing and the same
//!   as `kp-client --image` and the Python package. 1 (luma) or 4 (RGBA)
//!   channels, which no model of the repository takes, are resized exactly
//!   to the shape (triangle filter, aspect ratio not kept);
//! - **raw** tensor files: sent byte for byte; the file's length must equal
//!   the shape's size;
//! - **synthetic** images from a seed: smooth gradients, a few filled
//!   rectangles and ellipses and some noise. Deterministic for a given
//!   seed and `rand` version (they come from [`rand::rngs::StdRng`]), and
//!   different from one seed to the next, so a model's answers differ
//!   between requests and a mix-up between two requests shows.
//!
//! [`Inputs`] hands out payload `i` of a run; requests cycle through the
//! distinct payloads it holds.

use std::path::{Path, PathBuf};
use std::str::FromStr;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Number of distinct synthetic images a run cycles through unless told
/// otherwise. Enough that a batch of up to 16 holds 16 different images
/// (so batching bugs that mix up inputs show), small enough that building
/// them costs well under a second even in a debug build.
pub const DEFAULT_SYNTHETIC_DISTINCT: usize = 16;

/// Why payloads could not be prepared.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    /// A `--shape` string is not `HxWxC` with positive numbers.
    #[error("bad shape {0:?}: expected HxWxC, e.g. 224x224x3, all >= 1")]
    BadShape(String),
    /// Reading a file or folder failed.
    #[error("{path}: {source}")]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// An image file could not be decoded.
    #[error("{path}: cannot decode image: {source}")]
    Decode {
        /// The file.
        path: PathBuf,
        /// The decoder's error.
        source: image::ImageError,
    },
    /// Images can only become 1, 3 or 4 channels.
    #[error("cannot convert an image to {0} channels (only 1, 3 or 4)")]
    UnsupportedChannels(usize),
    /// A raw tensor file's length is not the shape's size.
    #[error("{path}: raw tensor has {len} bytes, the shape needs {expected}")]
    RawLength {
        /// The file.
        path: PathBuf,
        /// Its length.
        len: u64,
        /// The shape's size in bytes.
        expected: usize,
    },
    /// A folder holds no PNG or JPEG file, or no file was named.
    #[error("no PNG or JPEG input found in {0}")]
    NoImages(String),
}

/// Shape of one request's tensor: height × width × channels, u8, HWC.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InputShape {
    /// Rows.
    pub height: usize,
    /// Columns.
    pub width: usize,
    /// Channels per pixel.
    pub channels: usize,
}

impl InputShape {
    /// 224×224×3, the input of the ImageNet models kneepoint demonstrates.
    pub const IMAGENET: InputShape = InputShape {
        height: 224,
        width: 224,
        channels: 3,
    };

    /// Size of one tensor in bytes.
    pub fn len(&self) -> usize {
        self.height * self.width * self.channels
    }

    /// Never true for a parsed shape (every dimension is >= 1).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Default for InputShape {
    fn default() -> Self {
        InputShape::IMAGENET
    }
}

impl FromStr for InputShape {
    type Err = InputError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || InputError::BadShape(s.to_string());
        let dims: Vec<usize> = s
            .split(['x', 'X'])
            .map(|d| d.trim().parse::<usize>().map_err(|_| bad()))
            .collect::<Result<_, _>>()?;
        match dims[..] {
            [height, width, channels] if height > 0 && width > 0 && channels > 0 => {
                // Keep a request within docs/PROTOCOL.md's u32 total_len.
                let len = height
                    .checked_mul(width)
                    .and_then(|hw| hw.checked_mul(channels))
                    .filter(|l| u32::try_from(*l).is_ok())
                    .ok_or_else(bad)?;
                debug_assert!(len > 0);
                Ok(InputShape {
                    height,
                    width,
                    channels,
                })
            }
            _ => Err(bad()),
        }
    }
}

impl std::fmt::Display for InputShape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}x{}x{}", self.height, self.width, self.channels)
    }
}

/// Where request payloads come from (the `--input` option).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InputSpec {
    /// Synthetic images generated from the run's seed.
    Synthetic,
    /// One raw tensor file, sent as is.
    Raw(PathBuf),
    /// Image files and folders of image files (PNG, JPEG).
    Images(Vec<PathBuf>),
}

impl InputSpec {
    /// Parses the words given to `--input`: `synthetic`, `raw:FILE`, or any
    /// number of image files and folders.
    pub fn from_args(words: &[String]) -> Result<InputSpec, InputError> {
        match words {
            [] => Ok(InputSpec::Synthetic),
            [w] if w == "synthetic" => Ok(InputSpec::Synthetic),
            [w] if w.starts_with("raw:") => Ok(InputSpec::Raw(PathBuf::from(&w[4..]))),
            _ => Ok(InputSpec::Images(words.iter().map(PathBuf::from).collect())),
        }
    }
}

/// The payloads of a run: payload `i` is `distinct[i % distinct.len()]`.
#[derive(Debug)]
pub struct Inputs {
    shape: InputShape,
    payloads: Vec<Vec<u8>>,
}

/// The payload options every traffic tool takes (`#[command(flatten)]`):
/// kp-gen, kp-client and kp-http-load send the same images for the same
/// options and seed.
#[derive(Clone, Debug, clap::Args)]
pub struct InputArgs {
    /// Payloads: `synthetic`, `raw:FILE` (exact tensor bytes), or PNG/JPEG
    /// files and folders (resized to --shape).
    #[arg(long, num_args = 1.., default_value = "synthetic", value_name = "SRC")]
    pub input: Vec<String>,
    /// Model input, HxWxC u8 (HWC).
    #[arg(long, default_value = "224x224x3", value_name = "HxWxC")]
    pub shape: InputShape,
    /// Distinct synthetic images to cycle through.
    #[arg(long, default_value_t = DEFAULT_SYNTHETIC_DISTINCT, value_name = "N")]
    pub distinct: usize,
}

impl InputArgs {
    /// The payloads these options name (`seed`: synthetic images).
    pub fn load(&self, seed: u64) -> Result<Inputs, InputError> {
        Inputs::load(
            &InputSpec::from_args(&self.input)?,
            self.shape,
            seed,
            self.distinct,
        )
    }
}

impl Inputs {
    /// Prepares the payloads `spec` names for `shape`. `seed` and
    /// `synthetic_distinct` only matter for synthetic input.
    pub fn load(
        spec: &InputSpec,
        shape: InputShape,
        seed: u64,
        synthetic_distinct: usize,
    ) -> Result<Inputs, InputError> {
        let payloads = match spec {
            InputSpec::Synthetic => (0..synthetic_distinct.max(1) as u64)
                .map(|j| synthetic_image(shape, mix_seed(seed, j)))
                .collect(),
            InputSpec::Raw(path) => vec![read_raw(path, shape)?],
            InputSpec::Images(paths) => {
                let files = expand_image_paths(paths)?;
                files
                    .iter()
                    .map(|f| decode_image(f, shape))
                    .collect::<Result<_, _>>()?
            }
        };
        Ok(Inputs { shape, payloads })
    }

    /// Payloads given directly (each must be `shape.len()` bytes long).
    pub fn from_payloads(shape: InputShape, payloads: Vec<Vec<u8>>) -> Inputs {
        assert!(!payloads.is_empty(), "at least one payload");
        Inputs { shape, payloads }
    }

    /// The tensor shape.
    pub fn shape(&self) -> InputShape {
        self.shape
    }

    /// How many different payloads the run cycles through.
    pub fn distinct(&self) -> usize {
        self.payloads.len()
    }

    /// Payload of request number `i` (0-based within the run).
    pub fn get(&self, i: u64) -> &[u8] {
        &self.payloads[(i % self.payloads.len() as u64) as usize]
    }
}

/// Derives the seed of synthetic image `j` from the run's seed
/// (splitmix64 of their combination, so neighbouring seeds diverge).
pub fn mix_seed(seed: u64, j: u64) -> u64 {
    let mut z = seed
        .wrapping_add(j.wrapping_mul(0x9e37_79b9_7f4a_7c15))
        .wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A synthetic HWC u8 image: a per-channel linear gradient, 3 to 6 filled
/// rectangles or ellipses of random colours, and uniform noise of ±12.
pub fn synthetic_image(shape: InputShape, seed: u64) -> Vec<u8> {
    let mut rng = StdRng::seed_from_u64(seed);
    let (h, w, c) = (shape.height, shape.width, shape.channels);
    // Gradient: value = base + dx * x/w + dy * y/h, per channel.
    let grad: Vec<(f32, f32, f32)> = (0..c)
        .map(|_| {
            (
                rng.random_range(0.0..255.0f32),
                rng.random_range(-128.0..128.0f32),
                rng.random_range(-128.0..128.0f32),
            )
        })
        .collect();
    let mut img = vec![0u8; shape.len()];
    for y in 0..h {
        for x in 0..w {
            for (ch, (base, dx, dy)) in grad.iter().enumerate() {
                let v = base + dx * x as f32 / w as f32 + dy * y as f32 / h as f32;
                img[(y * w + x) * c + ch] = v.clamp(0.0, 255.0) as u8;
            }
        }
    }
    let shapes = rng.random_range(3..=6);
    for _ in 0..shapes {
        let colour: Vec<u8> = (0..c).map(|_| rng.random()).collect();
        let (cx, cy) = (rng.random_range(0..w), rng.random_range(0..h));
        let (rx, ry) = (
            rng.random_range(1..=w.div_ceil(3)),
            rng.random_range(1..=h.div_ceil(3)),
        );
        let ellipse = rng.random_bool(0.5);
        for y in cy.saturating_sub(ry)..(cy + ry).min(h) {
            for x in cx.saturating_sub(rx)..(cx + rx).min(w) {
                if ellipse {
                    let nx = (x as f32 - cx as f32) / rx as f32;
                    let ny = (y as f32 - cy as f32) / ry as f32;
                    if nx * nx + ny * ny > 1.0 {
                        continue;
                    }
                }
                img[(y * w + x) * c..(y * w + x + 1) * c].copy_from_slice(&colour);
            }
        }
    }
    for v in &mut img {
        let noise: i16 = rng.random_range(-12..=12);
        *v = (i16::from(*v) + noise).clamp(0, 255) as u8;
    }
    img
}

/// Decodes a PNG or JPEG file and resizes it to `shape` (HWC u8).
pub fn decode_image(path: &Path, shape: InputShape) -> Result<Vec<u8>, InputError> {
    let img = image::ImageReader::open(path)
        .map_err(|source| InputError::Io {
            path: path.to_path_buf(),
            source,
        })?
        .with_guessed_format()
        .map_err(|source| InputError::Io {
            path: path.to_path_buf(),
            source,
        })?
        .decode()
        .map_err(|source| InputError::Decode {
            path: path.to_path_buf(),
            source,
        })?;
    image_to_tensor(&img, shape)
}

/// An image as a `shape` tensor, HWC u8: for 3 channels the client
/// library's preprocessing (shorter side resized, centre crop), else an
/// exact resize (see the module docs).
pub fn image_to_tensor(
    img: &image::DynamicImage,
    shape: InputShape,
) -> Result<Vec<u8>, InputError> {
    let (w, h) = (shape.width as u32, shape.height as u32);
    if shape.channels == 3 {
        return Ok(kneepoint_client::image::preprocess(img, h, w));
    }
    let resized = if img.width() == w && img.height() == h {
        img.clone()
    } else {
        img.resize_exact(w, h, image::imageops::FilterType::Triangle)
    };
    let raw = match shape.channels {
        1 => resized.into_luma8().into_raw(),
        3 => resized.into_rgb8().into_raw(),
        4 => resized.into_rgba8().into_raw(),
        n => return Err(InputError::UnsupportedChannels(n)),
    };
    debug_assert_eq!(raw.len(), shape.len());
    Ok(raw)
}

/// Reads a raw tensor file, whose length must be `shape.len()`.
pub fn read_raw(path: &Path, shape: InputShape) -> Result<Vec<u8>, InputError> {
    let bytes = std::fs::read(path).map_err(|source| InputError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    if bytes.len() != shape.len() {
        return Err(InputError::RawLength {
            path: path.to_path_buf(),
            len: bytes.len() as u64,
            expected: shape.len(),
        });
    }
    Ok(bytes)
}

/// Expands folders into their PNG/JPEG files (sorted by name, not
/// recursive); files are kept as given, whatever their extension.
pub fn expand_image_paths(paths: &[PathBuf]) -> Result<Vec<PathBuf>, InputError> {
    let mut out = Vec::new();
    for p in paths {
        let io = |source| InputError::Io {
            path: p.clone(),
            source,
        };
        if p.is_dir() {
            let mut found: Vec<PathBuf> = std::fs::read_dir(p)
                .map_err(io)?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|f| f.is_file() && is_image_name(f))
                .collect();
            if found.is_empty() {
                return Err(InputError::NoImages(p.display().to_string()));
            }
            found.sort();
            out.extend(found);
        } else {
            std::fs::metadata(p).map_err(io)?;
            out.push(p.clone());
        }
    }
    if out.is_empty() {
        return Err(InputError::NoImages("the --input list".to_string()));
    }
    Ok(out)
}

fn is_image_name(p: &Path) -> bool {
    p.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| matches!(e.to_ascii_lowercase().as_str(), "png" | "jpg" | "jpeg"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMALL: InputShape = InputShape {
        height: 16,
        width: 20,
        channels: 3,
    };

    #[test]
    fn shapes_parse_and_print() {
        let s: InputShape = "224x224x3".parse().unwrap();
        assert_eq!(s, InputShape::IMAGENET);
        assert_eq!(s.len(), 150_528);
        assert_eq!(s.to_string(), "224x224x3");
        for bad in ["224x224", "0x1x1", "ax1x1", "1x1x1x1", "", "70000x70000x3"] {
            assert!(bad.parse::<InputShape>().is_err(), "{bad}");
        }
    }

    #[test]
    fn input_spec_words() {
        let w = |s: &[&str]| s.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert_eq!(InputSpec::from_args(&w(&[])).unwrap(), InputSpec::Synthetic);
        assert_eq!(
            InputSpec::from_args(&w(&["synthetic"])).unwrap(),
            InputSpec::Synthetic
        );
        assert_eq!(
            InputSpec::from_args(&w(&["raw:/x/t.bin"])).unwrap(),
            InputSpec::Raw("/x/t.bin".into())
        );
        assert_eq!(
            InputSpec::from_args(&w(&["a.png", "dir"])).unwrap(),
            InputSpec::Images(vec!["a.png".into(), "dir".into()])
        );
    }

    #[test]
    fn synthetic_images_are_deterministic_and_vary_with_the_seed() {
        let a = synthetic_image(SMALL, 1);
        assert_eq!(a.len(), SMALL.len());
        assert_eq!(a, synthetic_image(SMALL, 1));
        let b = synthetic_image(SMALL, 2);
        let differing = a.iter().zip(&b).filter(|(x, y)| x != y).count();
        assert!(differing > a.len() / 2, "only {differing} bytes differ");
        // Not flat: a real spread of values.
        let (min, max) = (a.iter().min().unwrap(), a.iter().max().unwrap());
        assert!(max - min > 64);
        let inputs = Inputs::load(&InputSpec::Synthetic, SMALL, 7, 3).unwrap();
        assert_eq!(inputs.distinct(), 3);
        assert_eq!(inputs.get(0), inputs.get(3));
        assert_ne!(inputs.get(0), inputs.get(1));
    }

    fn tmpdir(name: &str) -> PathBuf {
        let d =
            std::env::temp_dir().join(format!("kp-traffic-input-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn png_and_jpeg_decode_and_resize_to_the_shape() {
        let dir = tmpdir("img");
        let src = image::RgbImage::from_fn(40, 30, |x, _| image::Rgb([x as u8 * 6, 100, 200]));
        src.save(dir.join("b.png")).unwrap();
        src.save(dir.join("a.jpg")).unwrap();
        std::fs::write(dir.join("notes.txt"), "not an image").unwrap();
        let files = expand_image_paths(std::slice::from_ref(&dir)).unwrap();
        assert_eq!(files, vec![dir.join("a.jpg"), dir.join("b.png")]);
        let inputs = Inputs::load(&InputSpec::Images(vec![dir.clone()]), SMALL, 0, 1).unwrap();
        assert_eq!(inputs.distinct(), 2);
        for i in 0..2 {
            let t = inputs.get(i);
            assert_eq!(t.len(), SMALL.len());
            // Green and blue are flat in the source, JPEG keeps them close.
            assert!(t
                .chunks(3)
                .all(|p| p[1].abs_diff(100) < 12 && p[2].abs_diff(200) < 12));
        }
        // RGB: exactly the client library's (and the model repository's)
        // preprocessing, as kp-client --image and Python send.
        assert_eq!(
            decode_image(&dir.join("b.png"), SMALL).unwrap(),
            kneepoint_client::image::from_path(
                dir.join("b.png"),
                SMALL.height as u32,
                SMALL.width as u32
            )
            .unwrap()
        );
        let grey = InputShape {
            channels: 1,
            ..SMALL
        };
        assert_eq!(
            decode_image(&dir.join("b.png"), grey).unwrap().len(),
            16 * 20
        );
        assert!(matches!(
            decode_image(
                &dir.join("b.png"),
                InputShape {
                    channels: 2,
                    ..SMALL
                }
            ),
            Err(InputError::UnsupportedChannels(2))
        ));
        assert!(matches!(
            decode_image(&dir.join("notes.txt"), SMALL),
            Err(InputError::Decode { .. })
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn raw_tensors_must_have_the_exact_size() {
        let dir = tmpdir("raw");
        let good = dir.join("good.bin");
        std::fs::write(&good, vec![7u8; SMALL.len()]).unwrap();
        let inputs = Inputs::load(&InputSpec::Raw(good), SMALL, 0, 1).unwrap();
        assert_eq!(inputs.get(5), &vec![7u8; SMALL.len()][..]);
        let bad = dir.join("bad.bin");
        std::fs::write(&bad, vec![7u8; SMALL.len() + 1]).unwrap();
        assert!(matches!(
            Inputs::load(&InputSpec::Raw(bad), SMALL, 0, 1),
            Err(InputError::RawLength { len, expected, .. }) if len == expected as u64 + 1
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
