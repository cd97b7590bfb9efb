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
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
target=${CARGO_TARGET_DIR:-$repo/target}
out="$repo/build/bench"
py="$repo/.venv/bin/python"
[[ -x $py ]] || py=python3
mkdir -p "$out"
# Only this run's estimates: criterion keeps a benchmark's last results.
groups=("$target/criterion/fragment" "$target/criterion/request")
rm -rf "${groups[@]}"
"${CARGO:-cargo}" bench --locked -p libml --bench layout
"$py" bench/criterion_report.py --title "Input conversion on copy" \
  --run-line "$("$py" bench/host.py run-line "$repo")" --command scripts/bench-layout.sh \
  "${groups[@]}" >"$out/layout.md"
echo
cat "$out/layout.md"
if [[ ${BENCH_UPDATE_DOCS:-0} == 1 ]]; then
  "$py" bench/docsection.py bench-layout scripts/bench-layout.sh "$out/layout.md" docs/PERFORMANCE.md || true
fi
