# Sourced by bench/bench_client.sh and bench/bench_gateway.sh: a platform of
# their own for a benchmark run from the client namespace. A veth pair
# between two network namespaces (scripts/netns.sh), the if-manager on it
# (lcore 0 on core 0) and one kp-if serving models/$MODEL (its configured
# SLO, or KP_IF_SLO_MS; free on both cores) in the platform namespace.
#
# Set before sourcing: BENCH (the script's name, for messages and the DPDK
# file prefix), BENCH_NS (a short prefix of the namespaces' names) and
# MODEL. Sets T (the binaries: ${CARGO_TARGET_DIR:-target}/release), D (a
# scratch folder), the netns.sh variables (PLATFORM_IP, CLIENT_NS, ...),
# EAL, wait_for FILE TEXT. On exit everything is torn down, after the
# script's own `bench_stop` if it defines one; on a failure the processes'
# last words (D/*.err) are shown first.
T=${CARGO_TARGET_DIR:-target}/release
NAME=$BENCH_NS$$
eval "$(scripts/netns.sh up "$NAME")"
D=$(mktemp -d)
P=kp-$BENCH-$$
cleanup() {
  local rc=$?
  set +e # tear everything down, whatever fails on the way
  if ((rc)); then
    for f in "$D"/*.err; do [[ -e $f ]] && { echo "--- $f" >&2; tail -n 5 "$f" >&2; }; done
  fi
  declare -F bench_stop >/dev/null && bench_stop
  [[ -n ${IF:-} ]] && kill -INT "$IF" 2>/dev/null && wait "$IF" 2>/dev/null
  [[ -n ${IFM:-} ]] && kill -INT "$IFM" 2>/dev/null && wait "$IFM" 2>/dev/null
  scripts/netns.sh down "$NAME" >/dev/null
  rm -rf "$D"
}
trap cleanup EXIT
wait_for() { # FILE TEXT
  for _ in $(seq 600); do grep -q "$2" "$1" && return 0; sleep 0.1; done
  echo "$BENCH: no '$2' in $1:" >&2; cat "$1" >&2; exit 1
}
EAL=(--file-prefix "$P" --no-pci --no-telemetry --log-level lib.eal:error)
ip netns exec "$PLATFORM_NS" "$T/if-manager" --control "ipc://$D/ifm.sock" --ip "$PLATFORM_IP" \
  -- --lcores 0@0 "${EAL[@]}" --vdev "net_af_packet0,iface=$PLATFORM_IF" >"$D/ifm.out" 2>"$D/ifm.err" &
IFM=$!
wait_for "$D/ifm.err" "if-manager: ready"
ip netns exec "$PLATFORM_NS" "$T/kp-if" --model "models/$MODEL/config.toml" --control "ipc://$D/ifm.sock" \
  ${KP_IF_SLO_MS:+--slo-ms "$KP_IF_SLO_MS"} -- --lcores "1@(0-1)" "${EAL[@]}" --proc-type secondary >"$D/if.out" 2>"$D/if.err" &
IF=$!
wait_for "$D/if.err" "kp-if: ready"
