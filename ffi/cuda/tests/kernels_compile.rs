//! Every CUDA C kernel of the GPU path compiles with NVRTC: the real
//! compiler, called as a GPU IF calls it at start (`compile_ptx`, no
//! options), on a machine without a GPU. NVRTC needs none: it is CUDA's
//! compiler alone, from the `nvidia-cuda-nvrtc` wheel `make setup` installs
//! into .venv (or the libnvrtc.so.13 that `KP_NVRTC_LIB` names). Without it
//! the test says so and passes, unless `KP_REQUIRE_NVRTC=1` (`make test`
//! sets it): then it fails.

use std::path::{Path, PathBuf};

/// libnvrtc.so.13: `$KP_NVRTC_LIB`, else the wheel's in the repository's
/// .venv.
fn nvrtc_path() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("KP_NVRTC_LIB") {
        return Some(PathBuf::from(p));
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let lib = std::fs::read_dir(root.join(".venv/lib")).ok()?;
    lib.flatten()
        .map(|py| {
            py.path()
                .join("site-packages/nvidia/cu13/lib/libnvrtc.so.13")
        })
        .find(|p| p.exists())
}

#[test]
fn every_kernel_compiles_with_nvrtc() {
    let Some(path) = nvrtc_path() else {
        assert!(
            std::env::var("KP_REQUIRE_NVRTC").as_deref() != Ok("1"),
            "no libnvrtc.so.13 (run scripts/setup.sh: it installs nvidia-cuda-nvrtc into .venv, or set KP_NVRTC_LIB)"
        );
        eprintln!("skipped: no libnvrtc.so.13 (scripts/setup.sh installs it into .venv)");
        return;
    };
    // NVRTC opens its builtins library (libnvrtc-builtins.so.13.N, beside
    // it) by name at the first compile: loaded first, by path, it is found
    // among the loaded libraries.
    let dir = path.parent().expect("a file in a folder");
    let mut libs: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    libs.retain(|p| {
        p.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("libnvrtc-builtins.so"))
    });
    libs.push(path.clone());
    for lib in libs {
        // SAFETY: loading NVRTC (or its builtins) runs only its own
        // initialisers. Leaked, so that it stays loaded: cudarc and NVRTC
        // then find it by its soname among the loaded libraries, whatever
        // LD_LIBRARY_PATH says.
        let handle = unsafe { libloading::Library::new(&lib) }
            .unwrap_or_else(|e| panic!("loading {}: {e}", lib.display()));
        std::mem::forget(handle);
    }
    // SAFETY: `is_culib_present` only tries `dlopen` on candidate names.
    let found = unsafe { kp_cuda::cudarc::nvrtc::sys::is_culib_present() };
    assert!(
        found,
        "cudarc does not find the NVRTC loaded from {}",
        path.display()
    );
    let sources: [(&str, &str, &[&str]); 2] = [
        (
            "the gather",
            kp_cuda::gather::KERNEL_SOURCE,
            &kp_cuda::gather::KERNELS,
        ),
        (
            "the step kernels",
            kp_cuda::dnn::KERNEL_SOURCE,
            &kp_cuda::dnn::STEP_KERNELS,
        ),
    ];
    for (what, source, entries) in sources {
        let ptx = kp_cuda::cudarc::nvrtc::compile_ptx(source)
            .unwrap_or_else(|e| panic!("{what}: NVRTC refuses the source: {e}"));
        let text = ptx.to_src();
        for entry in entries {
            assert!(
                text.contains(&format!(".entry {entry}(")),
                "{what}: no kernel {entry} in the PTX"
            );
        }
        if source == kp_cuda::gather::KERNEL_SOURCE {
            // Both gathers read aligned pool memory 16 bytes per load (what
            // their bandwidth rests on): one vector load each in the PTX.
            let vector_loads = text
                .lines()
                .filter(|l| l.contains("ld.global") && l.contains(".v4."))
                .count();
            assert!(
                vector_loads >= 2,
                "the gather's PTX has {vector_loads} 16-byte global loads, want one per kernel"
            );
        }
    }
}
