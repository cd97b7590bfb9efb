#!/usr/bin/env bash
# bench/bench_gateway.py on a platform of its own: a veth pair between two
# network namespaces (scripts/netns.sh), the if-manager and one kp-if
# serving squeezenet (if 1, its configured SLO) in the platform namespace,
# kp-gateway in the client namespace pinned to the network-side core (core
# 0, the if-manager's), the load tools beside it; everything torn down on
# exit.
#
#   bench/bench_gateway.sh [bench_gateway.py options: --rate 100 --concurrency 4 --rounds 3 --duration 5]
#
# Needs root, hugepages, `make build models`. Binaries from
# ${CARGO_TARGET_DIR:-target}/release; Python ${PYTHON:-.venv/bin/python}
# (no package needed beyond the standard library).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
T=${CARGO_TARGET_DIR:-target}/release
NAME=kpg$$
eval "$(scripts/netns.sh up "$NAME")"
D=$(mktemp -d)
P=kp-bench-gateway-$$
cleanup() {
  local rc=$?
  if ((rc)); then # say why: the processes' last words
    for f in "$D"/*.err; do echo "--- $f" >&2; tail -n 5 "$f" >&2; done
  fi
  [[ -n ${GW:-} ]] && kill -TERM "$GW" 2>/dev/null && wait "$GW" 2>/dev/null
  [[ -n ${IF:-} ]] && kill -INT "$IF" 2>/dev/null && wait "$IF" 2>/dev/null
  [[ -n ${IFM:-} ]] && kill -INT "$IFM" 2>/dev/null && wait "$IFM" 2>/dev/null
  scripts/netns.sh down "$NAME" >/dev/null
  rm -rf "$D"
}
trap cleanup EXIT
wait_for() { # FILE TEXT
  for _ in $(seq 600); do grep -q "$2" "$1" && return 0; sleep 0.1; done
  echo "bench_gateway.sh: no '$2' in $1:" >&2; cat "$1" >&2; exit 1
}
EAL=(--file-prefix "$P" --no-pci --no-telemetry --log-level lib.eal:error)
ip netns exec "$PLATFORM_NS" "$T/if-manager" --control "ipc://$D/ifm.sock" --ip "$PLATFORM_IP" \
  -- --lcores 0@0 "${EAL[@]}" --vdev "net_af_packet0,iface=$PLATFORM_IF" >"$D/ifm.out" 2>"$D/ifm.err" &
IFM=$!
wait_for "$D/ifm.err" "if-manager: ready"
ip netns exec "$PLATFORM_NS" "$T/kp-if" --model models/squeezenet/config.toml --control "ipc://$D/ifm.sock" \
  -- --lcores "1@(0-1)" "${EAL[@]}" --proc-type secondary >"$D/if.out" 2>"$D/if.err" &
IF=$!
wait_for "$D/if.err" "kp-if: ready"
ip netns exec "$CLIENT_NS" taskset -c 0 "$T/kp-gateway" --platform "$PLATFORM_IP:9000" --models models \
  --model squeezenet --listen 127.0.0.1:8000 --timeout-ms 5000 >"$D/gw.out" 2>"$D/gw.err" &
GW=$!
wait_for "$D/gw.err" "kp-gateway: ready"
ip netns exec "$CLIENT_NS" "${PYTHON:-.venv/bin/python}" bench/bench_gateway.py \
  --addr "$PLATFORM_IP:9000" --gateway 127.0.0.1:8000 --gateway-pid "$GW" --bin "$T" "$@"
# Its report: answers by status, and its own time per answered request
# beside the platform round trip (own_us).
kill -TERM "$GW" && wait "$GW" || true
GW=
echo "kp-gateway: $(tail -n 1 "$D/gw.out")"
