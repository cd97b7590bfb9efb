#!/usr/bin/env bash
# bench/bench_client.py on a platform of its own: a veth pair between two
# network namespaces (scripts/netns.sh), the if-manager and one kp-if
# serving squeezenet (if 1, its configured SLO) in the platform namespace,
# the benchmark in the client namespace; everything torn down on exit.
#
#   bench/bench_client.sh [bench_client.py options: --concurrency 4 --rounds 5 --duration 3]
#
# Needs root, hugepages, `make build models python`. Binaries from
# ${CARGO_TARGET_DIR:-target}/release; the Python that has `kneepoint` is
# ${PYTHON:-.venv/bin/python} (e.g. a scratch venv with a wheel under test).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
T=${CARGO_TARGET_DIR:-target}/release
NAME=kpb$$
eval "$(scripts/netns.sh up "$NAME")"
D=$(mktemp -d)
P=kp-bench-client-$$
cleanup() {
  [[ -n ${IF:-} ]] && kill -INT "$IF" 2>/dev/null && wait "$IF" 2>/dev/null
  [[ -n ${IFM:-} ]] && kill -INT "$IFM" 2>/dev/null && wait "$IFM" 2>/dev/null
  scripts/netns.sh down "$NAME" >/dev/null
  rm -rf "$D"
}
trap cleanup EXIT
wait_for() { # FILE TEXT
  for _ in $(seq 600); do grep -q "$2" "$1" && return 0; sleep 0.1; done
  echo "bench_client.sh: no '$2' in $1:" >&2; cat "$1" >&2; exit 1
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
ip netns exec "$CLIENT_NS" "${PYTHON:-.venv/bin/python}" bench/bench_client.py \
  --addr "$PLATFORM_IP:9000" --kp-client "$T/kp-client" "$@"
