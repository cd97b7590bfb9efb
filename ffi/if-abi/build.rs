//! Builds `csrc/layout_probe.c` into a static library: the C compiler's
//! sizes, alignments, offsets and constants for `kneepoint_if.h`, which the
//! unit test `layout_matches_c` compares with the hand-written bindings.
//! Only that test refers to its symbol, so the linker pulls it into no
//! other binary.

const HEADER: &str = "include/kneepoint_if.h";
const PROBE: &str = "csrc/layout_probe.c";

fn main() {
    for path in [HEADER, PROBE] {
        println!("cargo:rerun-if-changed={path}");
    }
    cc::Build::new()
        .include("include")
        .std("c11")
        .warnings(true)
        .extra_warnings(true)
        .warnings_into_errors(true)
        .file(PROBE)
        .compile("kp_if_abi_layout_probe");
}
