#!/usr/bin/env bash
# Benchmark: what an idle if-manager costs (docs/PERFORMANCE.md, "if-manager:
# CPU use when idle"): the if-manager on `net_ring0` (a DPDK ring device: no
# traffic can arrive), once with its idle back-off (the default) and once
# with --busy-poll; its main thread's (the polling lcore's) user + system
# ticks from /proc over SECONDS (10), after WARMUP (2) s, as % of one core.
# Then the back-off in the seconds after traffic, when its sleeps are
# capped shorter (libml::backoff::TRAFFIC_MAX_SLEEP, until QUIET_AFTER, 10
# s, of sleeping without work): on `net_pcap` whose capture holds one
# frame (kp-gen), which arrives at start; ticks from 1 s to 9 s after it.
# Prints one JSON line per mode and a markdown table; writes
# build/bench/idle.json and idle.md (docs/PERFORMANCE.md's generated
# section).
#
# Env: SECONDS_IDLE (10), WARMUP (2), BENCH_UPDATE_DOCS (0; 1, as `make
# bench` sets it, writes idle.md into the docs). Needs root (hugepages) and
# `make build`.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bin="$repo/target/${PROFILE:-release}"
out="$repo/build/bench"
mkdir -p "$out"
secs=${SECONDS_IDLE:-10}
warmup=${WARMUP:-2}
hz=$(getconf CLK_TCK)
[[ -x $bin/if-manager ]] || { echo "bench-idle: no $bin/if-manager: run 'make build'" >&2; exit 1; }

# ticks PID: user + system ticks of the process's main thread.
ticks() { awk '{print $14 + $15}' "/proc/$1/task/$1/stat"; }

# One request of one fragment (kp-gen), for an IF that is not there: the
# if-manager answers it UNKNOWN_IF, and net_pcap delivers it once.
"$bin/kp-gen" --out "$out/idle-one-frame.pcap" --requests 1 --if-ids 2 --shape 1x1x3 >/dev/null

# measure MODE [SECONDS WARMUP]: one if-manager, its main thread's CPU.
measure() {
  local mode=$1 secs=${2:-$secs} warmup=${3:-$warmup} prefix="kp-idle-$$-$1" pid t0 t1 extra=() vdev=net_ring0
  [[ $mode == busy-poll ]] && extra=(--busy-poll)
  [[ $mode == after-traffic ]] && vdev="net_pcap0,rx_pcap=$out/idle-one-frame.pcap,tx_pcap=$out/idle-tx.pcap"
  "$bin/if-manager" "${extra[@]}" --if 1 -- --lcores 0@0 --file-prefix "$prefix" --no-pci --no-telemetry \
    --log-level lib.eal:error --vdev "$vdev" >"$out/idle-$mode.json" 2>"$out/idle-$mode.log" &
  pid=$!
  for _ in $(seq 300); do
    grep -q "if-manager: ready" "$out/idle-$mode.log" 2>/dev/null && break
    kill -0 "$pid" 2>/dev/null || { cat "$out/idle-$mode.log" >&2; echo "bench-idle: the if-manager exited" >&2; exit 1; }
    sleep 0.1
  done
  sleep "$warmup"
  t0=$(ticks "$pid")
  sleep "$secs"
  t1=$(ticks "$pid")
  kill -INT "$pid"
  wait "$pid" || true
  rm -rf /dev/hugepages/"$prefix"* /var/run/dpdk/"$prefix" 2>/dev/null || true
  awk -v m="$mode" -v d=$((t1 - t0)) -v s="$secs" -v w="$warmup" -v hz="$hz" \
    'BEGIN { printf "{\"mode\": \"%s\", \"ticks\": %d, \"seconds\": %d, \"after_s\": %d, \"core_pct\": %.1f}\n", m, d, s, w, 100 * d / (s * hz) }'
}

{
  measure idle-backoff
  measure busy-poll
  measure after-traffic 8 1
} | tee "$out/idle.jsonl"
jq -s '.' "$out/idle.jsonl" >"$out/idle.json"
py="$repo/.venv/bin/python"
[[ -x $py ]] || py=python3
{
  echo "#### If-manager CPU when idle ($("$py" "$repo/bench/host.py" run-line "$repo"))"
  echo
  echo "| if-manager | % of one core (main thread) |"
  echo "|---|---|"
  jq -r '.[] | if .mode == "after-traffic"
    then "| idle-backoff, no traffic for \(.after_s)–\(.after_s + .seconds) s after one frame (short sleeps while traffic is recent) | \(.core_pct) |"
    else "| \(.mode), no traffic (\(.seconds) s after \(.after_s) s) | \(.core_pct) |" end' "$out/idle.json"
} >"$out/idle.md"
echo
cat "$out/idle.md"
# docs/PERFORMANCE.md's generated section, with BENCH_UPDATE_DOCS=1 (make bench).
if [[ ${BENCH_UPDATE_DOCS:-0} == 1 ]]; then
  "$py" "$repo/bench/docsection.py" bench-idle scripts/bench-idle.sh "$out/idle.md" "$repo/docs/PERFORMANCE.md" || true
fi
