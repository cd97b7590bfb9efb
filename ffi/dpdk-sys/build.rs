//! Build script for `dpdk-sys`: finds the system DPDK with pkg-config, links
//! it dynamically, compiles the static-inline shim (`src/shim.c`) and runs
//! bindgen over `src/bindings.h`.
//!
//! Both the shim and bindgen get the complete `pkg-config --cflags libdpdk`
//! output: DPDK's headers only parse with its own flags (`-include
//! rte_config.h`, `-march=...` for the vector intrinsics in the inline
//! functions).
//!
//! Dynamic linking matters beyond the link line: Debian's EAL loads every PMD
//! in its plugin directory (`/usr/lib/x86_64-linux-gnu/dpdk/pmds-23.0`:
//! `net_pcap`, `net_af_packet`, `net_ring`, ...) only when `librte_eal.so`
//! itself is a shared object in the process, so no `-d` EAL argument is
//! needed. A static build would have to link the PMDs with
//! `--whole-archive` instead; we do not support that.

use std::env;
use std::path::PathBuf;
use std::process::Command;

/// The oldest DPDK whose ABI these bindings and the shim are written for.
const MIN_DPDK: &str = "22.11";

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=src/bindings.h");
    println!("cargo:rerun-if-changed=src/shim.c");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG");

    // Link flags (-L, -l) for every DPDK library; `--as-needed` keeps only
    // the ones we call.
    let lib = pkg_config::Config::new()
        .atleast_version(MIN_DPDK)
        .probe("libdpdk")
        .unwrap_or_else(|e| panic!("libdpdk >= {MIN_DPDK} not found by pkg-config: {e}"));

    let cflags = dpdk_cflags();

    let mut shim = cc::Build::new();
    shim.file("src/shim.c").include("src").warnings(true);
    for flag in &cflags {
        shim.flag(flag);
    }
    shim.compile("kp_dpdk_shim");

    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let bindings = bindgen::Builder::default()
        .header("src/bindings.h")
        .clang_args(&cflags)
        .clang_args(lib.include_paths.iter().map(|p| format!("-I{}", p.display())))
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()))
        // Ours: the shim.
        .allowlist_function("kp_.*")
        // EAL, lcores, launch, multi-process, time, errors.
        .allowlist_function("rte_eal_.*")
        .allowlist_function("rte_lcore_.*")
        .allowlist_function("rte_get_main_lcore")
        .allowlist_function("rte_get_next_lcore")
        .allowlist_function("rte_socket_id")
        .allowlist_function("rte_socket_count")
        .allowlist_function("rte_get_tsc_hz")
        .allowlist_function("rte_strerror")
        .allowlist_function("rte_exit")
        .allowlist_function("rte_openlog_stream")
        .allowlist_function("rte_mp_.*")
        // ethdev.
        .allowlist_function("rte_eth_dev_(configure|start|stop|close|socket_id|info_get|count_avail|get_name_by_port|get_port_by_name|is_valid_port|set_mtu|get_mtu)")
        .allowlist_function("rte_eth_(rx|tx)_queue_setup")
        .allowlist_function("rte_eth_macaddr_get")
        .allowlist_function("rte_eth_stats_(get|reset)")
        .allowlist_function("rte_eth_promiscuous_(enable|disable|get)")
        .allowlist_function("rte_eth_link_get_nowait")
        .allowlist_function("rte_eth_dev_adjust_nb_rx_tx_desc")
        // mbufs and mempools.
        .allowlist_function("rte_pktmbuf_pool_create")
        .allowlist_function("rte_pktmbuf_free_bulk")
        .allowlist_function("rte_mempool_(lookup|avail_count|in_use_count|free)")
        // rings and memzones.
        .allowlist_function("rte_ring_(create|lookup|free)")
        .allowlist_function("rte_memzone_(reserve|reserve_aligned|lookup|free)")
        // Structs our callers read (the functions above pull in the rest).
        .allowlist_type("rte_mbuf")
        .allowlist_type("rte_ether_addr")
        .allowlist_type("rte_eth_conf")
        .allowlist_type("rte_eth_stats")
        .allowlist_type("rte_eth_dev_info")
        .allowlist_type("rte_eth_link")
        .allowlist_type("rte_mempool")
        // How many mempool ops this process registered (a secondary that
        // did not load its primary's driver plugins has none).
        .allowlist_var("rte_mempool_ops_table")
        .allowlist_type("rte_pktmbuf_pool_private")
        .allowlist_type("rte_ring")
        .allowlist_type("rte_memzone")
        .allowlist_type("rte_proc_type_t")
        .allowlist_var("RING_F_.*")
        .allowlist_var("RTE_MEMZONE_.*")
        .allowlist_var("RTE_MEMPOOL_NAMESIZE")
        .allowlist_var("RTE_RING_NAMESIZE")
        .allowlist_var("RTE_ETH_NAME_MAX_LEN")
        .allowlist_var("RTE_ETHER_ADDR_LEN")
        .allowlist_var("RTE_MAX_LCORE")
        .allowlist_var("RTE_MAX_ETHPORTS")
        .allowlist_var("RTE_PKTMBUF_HEADROOM")
        .allowlist_var("RTE_MBUF_DEFAULT_.*")
        .allowlist_var("LCORE_ID_ANY")
        .allowlist_var("SOCKET_ID_ANY")
        .allowlist_var("RTE_ETH_DEV_NO_OWNER")
        .allowlist_var("RTE_MBUF_F_(INDIRECT|EXTERNAL)")
        // Packed structs with aligned members (`#[repr(packed)]` plus
        // `#[repr(align)]`, which Rust rejects) must stay opaque blobs of the
        // right size. The allowlist above does not reach the flow/net
        // protocol headers today; this keeps a widened allowlist building.
        .opaque_type("rte_gtp_psc_generic_hdr")
        .opaque_type("rte_l2tpv2_combined_msg_hdr")
        .default_enum_style(bindgen::EnumVariation::Consts)
        .prepend_enum_name(false)
        .derive_default(true)
        .derive_debug(true)
        .layout_tests(true)
        .generate_comments(true)
        .generate()
        .expect("bindgen failed on src/bindings.h");
    bindings
        .write_to_file(out.join("bindings.rs"))
        .expect("writing bindings.rs");
}

/// Every word of `pkg-config --cflags libdpdk`, in order.
fn dpdk_cflags() -> Vec<String> {
    let pkg_config = env::var("PKG_CONFIG").unwrap_or_else(|_| "pkg-config".to_string());
    let out = Command::new(&pkg_config)
        .args(["--cflags", "libdpdk"])
        .output()
        .unwrap_or_else(|e| panic!("running {pkg_config}: {e}"));
    assert!(
        out.status.success(),
        "{pkg_config} --cflags libdpdk failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .expect("pkg-config output is UTF-8")
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}
