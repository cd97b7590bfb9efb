//! Builds the C side of this crate's tests (nothing here is linked into
//! the adapter a host uses): `examples/c_engine/mean_engine.c` (the
//! demonstration engine) and `csrc/future_major_engine.c` (a fixture built
//! for another major version) into shared libraries in `OUT_DIR`, whose
//! paths the tests get as `KP_IF_ABI_MEAN_ENGINE` and
//! `KP_IF_ABI_FUTURE_ENGINE` and `dlopen()`. The header is the one in
//! `ffi/if-abi/include/`.

use std::env;
use std::path::{Path, PathBuf};

const INCLUDE: &str = "../../ffi/if-abi/include";
const HEADER: &str = "../../ffi/if-abi/include/kneepoint_if.h";
const MEAN_ENGINE: &str = "examples/c_engine/mean_engine.c";
const FUTURE_ENGINE: &str = "csrc/future_major_engine.c";

fn main() {
    for path in [HEADER, MEAN_ENGINE, FUTURE_ENGINE] {
        println!("cargo:rerun-if-changed={path}");
    }
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));

    let mut build = cc::Build::new();
    build
        .include(INCLUDE)
        .std("c11")
        .warnings(true)
        .extra_warnings(true)
        .warnings_into_errors(true);
    build.pic(true);
    for (source, stem, env_name) in [
        (MEAN_ENGINE, "kp_mean_engine", "KP_IF_ABI_MEAN_ENGINE"),
        (FUTURE_ENGINE, "kp_future_engine", "KP_IF_ABI_FUTURE_ENGINE"),
    ] {
        let library = shared_library(&build, source, &out_dir, stem);
        println!("cargo:rustc-env={env_name}={}", library.display());
    }
}

/// Compiles one C file into a shared library in `out_dir`. cc builds static
/// archives only, so this is one more run of the same compiler with the
/// same flags.
fn shared_library(build: &cc::Build, source: &str, out_dir: &Path, stem: &str) -> PathBuf {
    let (shared_flag, suffix) = match env::var("CARGO_CFG_TARGET_OS").as_deref() {
        Ok("macos") | Ok("ios") => ("-dynamiclib", "dylib"),
        _ => ("-shared", "so"),
    };
    let library = out_dir.join(format!("lib{stem}.{suffix}"));
    let compiler = build.get_compiler();
    let status = compiler
        .to_command()
        .arg(shared_flag)
        .arg("-o")
        .arg(&library)
        .arg(source)
        .status()
        .unwrap_or_else(|e| panic!("cannot run the C compiler {:?}: {e}", compiler.path()));
    assert!(status.success(), "compiling {source} failed: {status}");
    library
}
