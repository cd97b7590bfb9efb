#!/usr/bin/env bash
# Offline replay: answer every request of a captured or generated pcap.
#
#   scripts/run-pcap.sh IN.pcap OUT.pcap [MODEL...]
#
# Starts the if-manager on DPDK's net_pcap device (RX from IN.pcap, TX to
# OUT.pcap) and one inference function per named model of the repository
# (models/<name>; all prepared models if none is named). The if-manager
# holds RX until every IF has said ready, then replays the file; each IF
# exits once it has answered everything and heard nothing for a second, and
# the if-manager once it is idle with no IF left. Prints one JSON object:
# {"if_manager": {...counters...}, "ifs": {"<model>": {...report...}}}.
#
# The pcap is read at memory speed, faster than any model can serve, so the
# IFs run with a long SLO (KP_SLO_MS, default 60000) and a large in-flight
# capacity (KP_CAPACITY, default 256 requests) to answer everything instead
# of shedding. Env: PROFILE (release), KP_ENGINE (model's engine),
# KP_THREADS (model's threads), KP_RING_SIZE (each IF's ring, default 16384
# fragments), KP_OUT_DIR (a temp dir; logs and reports).
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bin="$repo/target/${PROFILE:-release}"
[[ $# -ge 2 ]] || { sed -n '2,20p' "$0"; exit 2; }
in=$(realpath "$1"); out=$(realpath -m "$2"); shift 2
[[ -f "$in" ]] || { echo "run-pcap: no such pcap: $in" >&2; exit 2; }

models=("$@")
if [[ ${#models[@]} -eq 0 ]]; then
  for c in "$repo"/models/*/config.toml; do [[ -f "$c" ]] && models+=("$(basename "$(dirname "$c")")"); done
fi
[[ ${#models[@]} -gt 0 ]] || { echo "run-pcap: no models: run 'make models' first" >&2; exit 2; }
for m in "${models[@]}"; do
  [[ -f "$repo/models/$m/config.toml" ]] || { echo "run-pcap: unknown model '$m' (not in models/)" >&2; exit 2; }
done

work=${KP_OUT_DIR:-$(mktemp -d /tmp/kp-run-pcap.XXXXXX)}
mkdir -p "$work"
prefix="kp-run-$$"
ctl="ipc://$work/ifm.sock"
pids=()
cleanup() { for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

# The two idle windows are not bounds on how fast the machine is:
# - the if-manager's (2 s) only delays its exit: it exits when idle *and*
#   no IF is live (every IF has said goodbye), so nothing is left to serve;
# - an IF's (1 s) counts only from its first fragment (before it, libml's
#   NO_TRAFFIC_GRACE, 30 s), only while its ring is empty and nothing is in
#   flight. net_pcap delivers the whole file at memory speed, faster than
#   any model serves, so the rings hold the replay's backlog until it is
#   over; an IF leaves early only if the if-manager stops delivering for
#   1 s in mid-file *and* the IF has served its whole backlog meanwhile.
#   Closing that last gap needs an end-of-input notice from the if-manager
#   to the IFs, which the platform does not have yet.
"$bin/if-manager" --await-ifs "${#models[@]}" --control "$ctl" --exit-when-idle 2 \
  --ring-size "${KP_RING_SIZE:-16384}" --stats-json "$work/if-manager.json" -- \
  --lcores 0@0 --file-prefix "$prefix" --no-pci --no-telemetry --log-level lib.eal:error \
  --vdev "net_pcap0,rx_pcap=$in,tx_pcap=$out" >/dev/null 2>"$work/if-manager.log" &
ifm=$!; pids+=("$ifm")
for _ in $(seq 300); do
  grep -q "if-manager: ready" "$work/if-manager.log" 2>/dev/null && break
  kill -0 "$ifm" 2>/dev/null || { cat "$work/if-manager.log" >&2; exit 1; }
  sleep 0.1
done

lcore=1
for m in "${models[@]}"; do
  extra=()
  [[ -n "${KP_ENGINE:-}" ]] && extra+=(--engine "$KP_ENGINE")
  [[ -n "${KP_THREADS:-}" ]] && extra+=(--threads "$KP_THREADS")
  "$bin/kp-if" --model "$repo/models/$m/config.toml" --control "$ctl" --exit-when-idle 1 \
    --slo-ms "${KP_SLO_MS:-60000}" --capacity "${KP_CAPACITY:-256}" "${extra[@]}" \
    --stats-json "$work/if-$m.json" -- \
    --lcores "$lcore@(0-1)" --proc-type secondary --file-prefix "$prefix" --no-pci \
    --no-telemetry --log-level lib.eal:error >/dev/null 2>"$work/if-$m.log" &
  pids+=("$!")
  lcore=$((lcore + 1))
done

status=0
for p in "${pids[@]:1}"; do wait "$p" || status=1; done
wait "$ifm" || status=1
pids=()
if [[ $status -ne 0 ]]; then
  echo "run-pcap: a process failed; logs in $work" >&2
  tail -n 20 "$work"/*.log >&2
  exit 1
fi
"$repo/.venv/bin/python" - "$work" "${models[@]}" <<'PY'
import json, sys
work, models = sys.argv[1], sys.argv[2:]
print(json.dumps({
    "if_manager": json.load(open(f"{work}/if-manager.json")),
    "ifs": {m: json.load(open(f"{work}/if-{m}.json")) for m in models},
}))
PY
