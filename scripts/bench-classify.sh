#!/usr/bin/env bash
# Benchmark: the per-packet cost of the if-manager's sans-IO core
# (docs/PERFORMANCE.md, "if-manager: per-packet cost of the sans-IO core"):
# `cargo bench -p if-manager --bench classify` (criterion: classify 256
# distinct 1 KiB fragment frames of two IFs and look up each route, in
# memory, no DPDK), then bench/criterion_report.py renders criterion's
# estimates into build/bench/classify.md (docs/PERFORMANCE.md's generated
# section).
#
# Env: CARGO (cargo), CARGO_TARGET_DIR (target), BENCH_UPDATE_DOCS (0; 1, as
# `make bench` sets it, writes classify.md into the docs).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/criterion-section.sh"
criterion_section if-manager classify "The sans-IO core per packet" if-manager
