#!/usr/bin/env bash
# The Python client against kp-client at several concurrencies (issue 12):
# bench/bench_client.sh (a platform of its own per run, torn down after) at
# each C, then bench/client_report.py renders their summaries into one
# table with the targets judged.
#
#   bench/bench_client_all.sh
#
# The IF runs with a generous SLO (KP_IF_SLO_MS, 2000 ms): with squeezenet's
# own 20 ms it sheds from 4 outstanding on, and the rates would compare how
# fast each client gets OVERLOADED answers back, not the clients.
#
# Env: CLIENT_CONCURRENCIES ("1 2 4 8"), ROUNDS (5), DURATION (3, seconds
# per round and client), PYTHON (.venv/bin/python, the one with
# `kneepoint`). Each run's output (stdout) goes to build/bench/client/C.log
# and its last line, bench_client.py's summary (JSON), to C.json; the
# report (markdown) to build/bench/client.md. With BENCH_UPDATE_DOCS=1 (as
# `make bench` runs it) the report replaces the bench-client section of
# docs/PERFORMANCE.md.
#
# Needs root, hugepages, `make build models python`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
py=${PYTHON:-.venv/bin/python}
out=build/bench/client
rounds=${ROUNDS:-5} duration=${DURATION:-3}
mkdir -p "$out"
rm -f "$out"/*.log "$out"/*.json build/bench/client.md
slo_ms=${KP_IF_SLO_MS:-2000}
summaries=()
for c in ${CLIENT_CONCURRENCIES:-1 2 4 8}; do
  KP_IF_SLO_MS=$slo_ms bench/bench_client.sh --concurrency "$c" --rounds "$rounds" \
    --duration "$duration" | tee "$out/$c.log"
  tail -n 1 "$out/$c.log" >"$out/$c.json"
  if ! "$py" -c 'import json, sys; json.load(open(sys.argv[1]))["concurrency"]' "$out/$c.json" 2>/dev/null; then
    echo "bench_client_all.sh: the last line of $out/$c.log is not bench_client.py's summary (JSON)" >&2
    exit 1
  fi
  summaries+=("$out/$c.json")
done
"$py" bench/client_report.py --run-line "$("$py" bench/host.py run-line .)" \
  --command "KP_IF_SLO_MS=$slo_ms bench/bench_client.sh --concurrency C --rounds $rounds --duration $duration" \
  "${summaries[@]}" >build/bench/client.md
echo
cat build/bench/client.md
if [[ ${BENCH_UPDATE_DOCS:-0} == 1 ]]; then
  "$py" bench/docsection.py bench-client bench/bench_client_all.sh build/bench/client.md docs/PERFORMANCE.md || true
fi
