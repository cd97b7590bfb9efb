#!/usr/bin/env bash
# Benchmark: converting request bytes from the wire into an input slot
# (docs/PERFORMANCE.md, "Inference function: input conversion on copy"):
# `cargo bench -p libml --bench layout` (criterion: RGB u8 HWC to normalised
# f32 NCHW through a lookup table, or an f32 copy, per 1 KiB fragment, group
# `fragment`, and per whole 224x224x3 request, group `request`), then
# bench/criterion_report.py renders criterion's estimates into
# build/bench/layout.md (docs/PERFORMANCE.md's generated section).
#
# Env: CARGO (cargo), CARGO_TARGET_DIR (target), BENCH_UPDATE_DOCS (0; 1, as
# `make bench` sets it, writes layout.md into the docs).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/criterion-section.sh"
criterion_section libml layout "Input conversion on copy" fragment request
