# Sourced by scripts/bench-classify.sh and scripts/bench-layout.sh: run one
# criterion bench and render its estimates as docs/PERFORMANCE.md's
# generated section.
#
#   criterion_section PACKAGE BENCH TITLE GROUP...
#
# Clears target/criterion/GROUP (criterion keeps a benchmark's last
# results), runs `cargo bench -p PACKAGE --bench BENCH`, renders the groups
# with bench/criterion_report.py into build/bench/BENCH.md and, with
# BENCH_UPDATE_DOCS=1 (as `make bench` sets it), writes that into the
# bench-BENCH markers of docs/PERFORMANCE.md (the caller is
# scripts/bench-BENCH.sh). Env: CARGO (cargo), CARGO_TARGET_DIR (target).
criterion_section() {
  local package=$1 bench=$2 title=$3; shift 3
  local repo target out py g groups=()
  repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  target=${CARGO_TARGET_DIR:-$repo/target}
  out="$repo/build/bench"
  py="$repo/.venv/bin/python"
  [[ -x $py ]] || py=python3
  for g in "$@"; do groups+=("$target/criterion/$g"); done
  mkdir -p "$out"
  rm -rf "${groups[@]}"
  (cd "$repo" && "${CARGO:-cargo}" bench --locked -p "$package" --bench "$bench")
  "$py" "$repo/bench/criterion_report.py" --title "$title" \
    --run-line "$("$py" "$repo/bench/host.py" run-line "$repo")" --command "scripts/bench-$bench.sh" \
    "${groups[@]}" >"$out/$bench.md"
  echo
  cat "$out/$bench.md"
  if [[ ${BENCH_UPDATE_DOCS:-0} == 1 ]]; then
    "$py" "$repo/bench/docsection.py" "bench-$bench" "scripts/bench-$bench.sh" "$out/$bench.md" \
      "$repo/docs/PERFORMANCE.md" || true
  fi
}
