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
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
target=${CARGO_TARGET_DIR:-$repo/target}
out="$repo/build/bench"
py="$repo/.venv/bin/python"
[[ -x $py ]] || py=python3
mkdir -p "$out"
# Only this run's estimates: criterion keeps a benchmark's last results.
rm -rf "$target/criterion/if-manager"
"${CARGO:-cargo}" bench --locked -p if-manager --bench classify
"$py" bench/criterion_report.py --title "The sans-IO core per packet" \
  --run-line "$("$py" bench/host.py run-line "$repo")" --command scripts/bench-classify.sh \
  "$target/criterion/if-manager" >"$out/classify.md"
echo
cat "$out/classify.md"
if [[ ${BENCH_UPDATE_DOCS:-0} == 1 ]]; then
  "$py" bench/docsection.py bench-classify scripts/bench-classify.sh "$out/classify.md" docs/PERFORMANCE.md || true
fi
