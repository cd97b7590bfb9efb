#!/usr/bin/env bash
# bench/bench_gateway.py on a platform of its own (bench/platform.sh: a veth
# pair between two network namespaces, the if-manager and one kp-if serving
# squeezenet, if 1, its configured SLO, in the platform namespace), with
# kp-gateway in the client namespace pinned to the network-side core (core
# 0, the if-manager's) and the load tools beside it; everything torn down
# on exit.
#
#   bench/bench_gateway.sh [bench_gateway.py options: --rate 50 --concurrency 4 --rounds 5 --duration 5]
#
# GATEWAY_CPUS (default 0, the if-manager's core) is where kp-gateway runs.
# The summary (JSON) and the report (markdown) go to OUT (target/bench/gateway);
# with BENCH_UPDATE_DOCS=1 (as `make bench` runs it) the report replaces the
# bench-gateway section of docs/PERFORMANCE.md.
#
# Needs root, hugepages, `make build models`. Binaries from
# ${CARGO_TARGET_DIR:-target}/release; Python ${PYTHON:-.venv/bin/python}
# (no package needed beyond the standard library).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BENCH=bench-gateway BENCH_NS=kpg MODEL=squeezenet
OUT=${OUT:-target/bench/gateway}
mkdir -p "$OUT"
rm -f "$OUT/summary.json" "$OUT/gateway.md"
bench_stop() { [[ -n ${GW:-} ]] && kill -TERM "$GW" 2>/dev/null && wait "$GW" 2>/dev/null; }
source bench/platform.sh
ip netns exec "$CLIENT_NS" taskset -c "${GATEWAY_CPUS:-0}" "$T/kp-gateway" --platform "$PLATFORM_IP:9000" --models models \
  --model squeezenet --listen 127.0.0.1:8000 --timeout-ms 5000 >"$D/gw.out" 2>"$D/gw.err" &
GW=$!
wait_for "$D/gw.err" "kp-gateway: ready"
ip netns exec "$CLIENT_NS" "${PYTHON:-.venv/bin/python}" bench/bench_gateway.py \
  --addr "$PLATFORM_IP:9000" --gateway 127.0.0.1:8000 --gateway-pid "$GW" --bin "$T" \
  --out "$OUT/summary.json" "$@"
# Its report: answers by status, and its own time per answered request
# beside the platform round trip (own_us).
kill -TERM "$GW" && wait "$GW" || true
GW=
echo "kp-gateway: $(tail -n 1 "$D/gw.out")"
"${PYTHON:-.venv/bin/python}" bench/bench_gateway.py --render --out "$OUT/summary.json" --gateway-report "$D/gw.out" \
  --markdown "$OUT/gateway.md" --repo . --command "bench/bench_gateway.sh $*"
echo "bench_gateway.sh: report in $OUT/gateway.md"
if [[ ${BENCH_UPDATE_DOCS:-0} == 1 ]]; then
  "${PYTHON:-.venv/bin/python}" bench/docsection.py bench-gateway bench/bench_gateway.sh "$OUT/gateway.md" docs/PERFORMANCE.md || true
fi
