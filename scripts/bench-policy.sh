#!/usr/bin/env bash
# Benchmark: does the batching policy ever lose to batch 1? (issue 13,
# item 1; docs/PERFORMANCE.md, "Batching policy: does it ever lose to
# batch 1?"). scripts/bench-if.sh, short, for four arms — the policy
# (batches up to 8) and batches of 1 (MAX_BATCH=1), each at 32 and at 4
# requests outstanding — alternated for ROUNDS rounds, so that the
# machine's drift hits every arm alike; bench/policy_report.py then gives
# each arm's saturation figures as median [smallest–largest] and the
# verdict per concurrency (a loss only where the spreads do not overlap).
#
#   scripts/bench-policy.sh          # squeezenet, 3 rounds, ~30 min
#
# Env: MODEL (squeezenet), ROUNDS (3), BENCH_UPDATE_DOCS (0; 1, as `make
# bench` sets it: the report becomes docs/PERFORMANCE.md's bench-policy
# section). Runs in target/bench/policy/MODEL/ (one folder and log per run),
# the report in build/bench/policy.md. Needs what bench-if.sh needs.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
py="$repo/.venv/bin/python"
model=${MODEL:-squeezenet}
rounds=${ROUNDS:-3}
[[ $rounds =~ ^[1-9][0-9]*$ ]] || { echo "bench-policy: ROUNDS must be a positive integer" >&2; exit 2; }
out="$repo/target/bench/policy/$model"
rm -rf "$out"
mkdir -p "$out" "$repo/build/bench"
settings="DURATION=20 LONG_DURATION=3 ENGINE_SECONDS=2 WARMUP=3 LOAD_FRACTION=0.1 LOW_LOAD_FRACTION=0 HOST_PROBE_S=0"
for k in $(seq 1 "$rounds"); do
  for arm in 8:32 1:32 8:4 1:4; do
    max_batch=${arm%:*} concurrency=${arm#*:}
    run="$out/round$k-max$max_batch-c$concurrency"
    echo "bench-policy: round $k of $rounds, max batch $max_batch, $concurrency outstanding ($run.log)" >&2
    # shellcheck disable=SC2086  # $settings is a list of assignments
    if ! env BENCH_UPDATE_DOCS=0 BENCH_IF_OUT="$run" MODEL="$model" MAX_BATCH="$max_batch" \
      CONCURRENCY="$concurrency" $settings "$repo/scripts/bench-if.sh" >"$run.log" 2>&1; then
      echo "bench-policy: bench-if.sh failed; the end of $run.log:" >&2
      tail -20 "$run.log" >&2
      exit 1
    fi
  done
done
command="MODEL=$model ROUNDS=$rounds scripts/bench-policy.sh: MAX_BATCH=8|1 CONCURRENCY=32|4 $settings scripts/bench-if.sh"
"$py" "$repo/bench/policy_report.py" "$out" "$("$py" "$repo/bench/host.py" run-line "$repo")" "$command" \
  >"$repo/build/bench/policy.md"
cat "$repo/build/bench/policy.md"
if [[ ${BENCH_UPDATE_DOCS:-0} == 1 ]]; then
  "$py" "$repo/bench/docsection.py" bench-policy scripts/bench-policy.sh "$repo/build/bench/policy.md" \
    "$repo/docs/PERFORMANCE.md" || true
fi
