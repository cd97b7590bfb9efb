#!/usr/bin/env bash
# Benchmark: the orchestrator's shadow switchover gaps under load, the
# convergence of its self-tuning loop from a wrong initial share, and
# switchovers as clients see them.
#
#   scripts/bench-orchestrator.sh                       # all three phases
#   PHASES=switchover SWITCHOVERS=100 scripts/bench-orchestrator.sh
#   PHASES=convergence HOLD_DOWN=5 scripts/bench-orchestrator.sh
#
# The whole platform runs as in tests/orchestrator.rs: a veth pair in two
# namespaces (scripts/netns.sh), the orchestrator starting the if-manager on
# it (net_af_packet, lcore 0 on the first CPU of CPUS) and the IFs (kp-if,
# an active and a parked shadow each, on the cores of their share),
# kp-client in the client namespace. Everything shares the machine's CPUs.
#
# Phase "switchover" (tuning off): if 1 squeezenet and if 5 shufflenet at
# 50% each; kp-client closed loop on both for the whole phase (if 1's with
# --frag-gap FRAG_GAP, so requests are half-assembled when if 1 yields and
# their fragments take the hand-back path; if 5's back to back); then
# SWITCHOVERS re-provisions of if 1, `kpctl share 1 40` / `kpctl share 1 60`
# alternately, each one waited for (status: switchovers + 1 and active),
# SETTLE s apart; then shutdown. Gaps come from the orchestrator's summary
# (the new active's first dequeue minus the old one's release of the ring,
# CLOCK_MONOTONIC, as libml's handover measures it). Errors = kp-client
# answers with a status other than ok + unanswered + duplicates, over the
# whole phase (kp-client runs in CHUNK s pieces with disjoint request ids;
# each piece's report is kept). kp-if runs through a wrapper that keeps each
# process's final report (succession: how the ring was taken, requests handed
# back, fragments forwarded), which the orchestrator does not keep.
#
# Phase "convergence" (tuning on, period TUNING_PERIOD_MS, hold-down
# HOLD_DOWN s, minimum step MIN_STEP points), one run per scenario of
# SCENARIOS, each under open-loop Poisson load (kp-client --rate) on both IFs
# for CONV_DURATION s:
#  too-large: if 1 squeezenet deployed at 90% with SLO 100 ms under
#    40 req/s, which one core serves far within that SLO (latency ~1/10 of
#    it); if 5 shufflenet at 10%, SLO 100 ms, 30 req/s. The loop must
#    bring if 1 down on its latency.
#  too-small: if 1 squeezenet at 10% with SLO 5 ms under 120 req/s: one
#    core cannot meet that SLO (batch-1 inference alone is ~4.5 ms, plus
#    queueing); if 5 shufflenet at 90%, SLO 100 ms, 30 req/s. The loop must
#    raise if 1 and take from if 5.
#  custom: SHARE1 SLO1 RATE1 SHARE5 SLO5 RATE5 from the environment (e.g.
#    SHARE1=10 SLO1=50 RATE1=300 overloads if 1: it sheds most requests).
# The share and demand trajectory comes from the orchestrator's
# decisions.jsonl. Converged: no share change for STABLE_K hold-downs (and
# at least STABLE_K tuning periods) up to the end of the load; the
# convergence time is from the start of the load to the last share change
# (decided, and applied = its switchover done).
# NOTE: on a 2-core host two IFs always get one core each whatever their
# shares (orchestrator::alloc::split_cores), so here the loop's decisions
# follow real latency and throughput but its share changes change nothing
# the IFs run on; docs/PERFORMANCE.md says what this does and does not show.
#
# Phase "impact" (issue 13; ~30 min): switchovers as the
# clients see them, once per fraction of IMPACT_LOADS of if 1's measured
# capacity: open-loop load on if 1, every request recorded, while
# IMPACT_SWITCHOVERS switchovers run; requests in flight within
# IMPACT_MARGIN_MS of a switchover against the others (see phase_impact).
#
# Raw data (configs, orchestrator logs, decisions, status polls, kp-client
# reports, kp-if reports, CSVs, summary JSON) under
# target/bench/orchestrator/{switchover,convergence-SCENARIO}/; a markdown
# summary is printed and written to target/bench/orchestrator/summary.md.
#
# Env: PHASES ("switchover convergence impact"; "e2e" on request),
# E2E_SHARE (20), E2E_CONCURRENCY (8), E2E_S (20), E2E_WARMUP (5),
# E2E_ENGINE_S (2), E2E_ENGINE_CPUS (CPUS), WORK_CONSERVING (true: the
# platform's `work_conserving`; false gives each IF its demand and no
# leftover, so the shares show what the loop decides), SWITCHOVERS (100), SETTLE (1 s),
# FRAG_GAP (20us), CONCURRENCY (2), CHUNK (10 s), SCENARIOS ("too-large
# too-small"), CONV_DURATION (150 s), TUNING_PERIOD_MS (1000), HOLD_DOWN
# (10 s, the config's default), MIN_STEP (5), STABLE_K (4); IMPACT_LOADS
# ("0.5 0.9"), IMPACT_SWITCHOVERS (100), IMPACT_MARGIN_MS (10), IMPACT_SETTLE (5 s),
# CAP_CONCURRENCY (8), CAP_S (10 s); BENCH_UPDATE_DOCS (0; 1, as `make
# bench` sets it: a run of the default phases rewrites docs/PERFORMANCE.md's
# generated section of the orchestrator); for the custom
# scenario SHARE1 SLO1 RATE1 SHARE5 SLO5 RATE5; MODEL1 and MODEL5 (the
# models of if 1 and if 5: squeezenet and shufflenet; any two of the model
# repository with 224×224×3 RGB input, which kp-client sends);
# AF_PACKET_FRAMES (8192: the if-manager's AF_PACKET ring, in frames; DPDK's
# default, 512, overflows on bursts of whole images at high rates); CPUS (0-1: the CPUs of the
# whole benchmark, IFs, if-manager (on the first), orchestrator, clients;
# with one CPU both IFs share it); PROFILE (release). Elsewhere than in a
# built checkout (scripts/gpu-platform.sh runs it on a GPU server from a
# bundle): BIN (the binaries' folder, target/PROFILE), MODELS (the model
# repository, models/), OUT (target/bench/orchestrator) and EAL_EXTRA
# (more if-manager EAL arguments, e.g. "-d /run/kneepoint-pmds").
# Needs root, iproute2, jq, hugepages and `make build models`.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bin=${BIN:-$repo/target/${PROFILE:-release}}
models=${MODELS:-$repo/models}
eal_extra=${EAL_EXTRA:-}
# How a starting shadow lowers its priority (kp-if --standby-idle-ms and
# --standby-nice; empty: kp-if's defaults).
standby_nice_arg="${STANDBY_IDLE_MS:+--standby-idle-ms $STANDBY_IDLE_MS} ${STANDBY_NICE:+--standby-nice $STANDBY_NICE}"
model1=${MODEL1:-squeezenet}
model5=${MODEL5:-shufflenet}
af_frames=${AF_PACKET_FRAMES:-8192}
py="$repo/.venv/bin/python"
[[ -x "$py" ]] || py=python3
# The Python side: settings, the phases' results, the summary (tested).
harness="$repo/bench/bench_orchestrator.py"
phases=${PHASES:-switchover convergence impact}
switchovers=${SWITCHOVERS:-100}
settle=${SETTLE:-1}
frag_gap=${FRAG_GAP:-20us}
concurrency=${CONCURRENCY:-2}
chunk=${CHUNK:-10}
conv_duration=${CONV_DURATION:-150}
period_ms=${TUNING_PERIOD_MS:-1000}
hold_down=${HOLD_DOWN:-10}
min_step=${MIN_STEP:-5}
work_conserving=${WORK_CONSERVING:-true}
stable_k=${STABLE_K:-4}
scenarios=${SCENARIOS:-too-large too-small}
impact_loads=${IMPACT_LOADS:-0.5 0.9}
impact_switchovers=${IMPACT_SWITCHOVERS:-100}
impact_margin_ms=${IMPACT_MARGIN_MS:-10}
# Seconds between the impact phase's switchovers: on a machine where the
# shadow loads its model on the cores the active serves on, back-to-back
# re-provisions keep one loading all the time, and "all the others" are no
# calm baseline (docs/PERFORMANCE-JOURNAL.md).
impact_settle=${IMPACT_SETTLE:-5}
cap_concurrency=${CAP_CONCURRENCY:-8}
cap_s=${CAP_S:-10}
e2e_share=${E2E_SHARE:-20}
e2e_concurrency=${E2E_CONCURRENCY:-8}
e2e_s=${E2E_S:-20}
e2e_warmup=${E2E_WARMUP:-5}
e2e_engine_s=${E2E_ENGINE_S:-2}
e2e_engine_cpus=${E2E_ENGINE_CPUS:-${CPUS:-0-1}}
# Where everything runs: the IFs' cores (the orchestrator's `cores`), the
# if-manager's lcore (the first of them), the orchestrator and the clients.
cpus=${CPUS:-0-1}
ifm_cpu=${cpus%%[-,]*}
if [[ -z "${BENCH_ORCH_PINNED:-}" ]]; then # this script and its helpers too
  export BENCH_ORCH_PINNED=1
  exec taskset -c "$cpus" "$0" "$@"
fi
share1=0 slo1=0 rate1=0 share5=0 slo5=0 rate5=0

die() { printf 'bench-orchestrator: %s\n' "$*" >&2; exit 1; }
[[ $work_conserving == true || $work_conserving == false ]] || die "WORK_CONSERVING is true or false, not '$work_conserving'"
say() { printf 'bench-orchestrator: %s\n' "$*" >&2; }
((EUID == 0)) || die "must run as root (namespaces, DPDK)"
command -v jq >/dev/null || die "jq is missing (apt-get install jq)"
for m in "$model1" "$model5"; do
  [[ -f "$models/$m/config.toml" ]] || die "no $models/$m: run 'make models'"
done
for b in orchestrator kpctl if-manager kp-if kp-client; do
  [[ -x "$bin/$b" ]] || die "no $bin/$b: run 'make build'"
done
((switchovers >= 1)) || die "SWITCHOVERS must be >= 1"

out=${OUT:-$repo/target/bench/orchestrator}
mkdir -p "$out"
net="kbo$(($$ % 100000))"
prefix="kp-bo-$$"
orch_pid=""
runtime=""
loop_pids=()
client_pidfiles=()
stopfile=""

# Stops what this script started, in order: client loops and their
# kp-client, the orchestrator (which stops its if-manager and IFs; if it is
# gone, the processes its state file names), the namespaces, DPDK files.
cleanup() {
  local p f
  [[ -n "$stopfile" ]] && touch "$stopfile" 2>/dev/null
  for p in "${loop_pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for f in "${client_pidfiles[@]}"; do
    [[ -s "$f" ]] && kill -TERM "$(cat "$f")" 2>/dev/null || true
  done
  local children=()
  if [[ -n "$orch_pid" ]] && kill -0 "$orch_pid" 2>/dev/null; then
    # The orchestrator's own children (if-manager, kp-if), in case it
    # cannot stop them itself.
    children=($(ps -o pid= --ppid "$orch_pid" 2>/dev/null || true))
    kill -TERM "$orch_pid" 2>/dev/null || true
    for _ in $(seq 300); do kill -0 "$orch_pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$orch_pid" 2>/dev/null || true
  fi
  for p in "${children[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  if [[ -n "$runtime" && -f "$runtime/state.json" ]]; then
    for p in $(jq -r '.pids[]?' "$runtime/state.json" 2>/dev/null); do
      kill -TERM "$p" 2>/dev/null || true
    done
    sleep 1
    for p in $(jq -r '.pids[]?' "$runtime/state.json" 2>/dev/null); do
      kill -KILL "$p" 2>/dev/null || true
    done
  fi
  timeout 60 "$repo/scripts/netns.sh" down "$net" >/dev/null 2>&1 || true
  rm -rf /dev/hugepages/"$prefix"* /var/run/dpdk/"$prefix"* 2>/dev/null || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM

eval "$("$repo/scripts/netns.sh" up "$net")"
dst="$PLATFORM_IP:9000"

# A bin_dir for the orchestrator: the real if-manager, and kp-if through a
# wrapper that execs it (same pid, same arguments) with its stdout, the
# final JSON report, in a file of its own.
wrap="$out/bin"
rm -rf "$wrap"
mkdir -p "$wrap"
ln -s "$bin/if-manager" "$wrap/if-manager"

now() { date +%s.%N; }
calc() { awk "BEGIN { printf \"%.6f\", $1 }"; }
loadavg() { cut -d' ' -f1-3 /proc/loadavg; }

# config FILE TUNING DEPLOY...: a platform config; DEPLOY is "id model slo share".
config() {
  local file=$1 tuning=$2 d
  shift 2
  cat >"$file" <<EOF
[platform]
models = "$models"
bin_dir = "$wrap"
cores = "$cpus"
tuning = $tuning
tuning_period_ms = $period_ms
hold_down_s = $hold_down
# Metrics on any free port: a benchmark never collides with a demo's 9464.
metrics_listen = "127.0.0.1:0"
min_step_pct = $min_step
work_conserving = $work_conserving

[if_manager]
wrap = ["ip", "netns", "exec", "$PLATFORM_NS"]
options = ["--ip", "$PLATFORM_IP"]
eal = [$(for a in $eal_extra; do printf '"%s", ' "$a"; done)"--lcores", "0@$ifm_cpu", "--no-pci", "--no-telemetry", "--log-level", "lib.eal:error",
       "--vdev", "net_af_packet0,iface=$PLATFORM_IF,framecnt=$af_frames"]
file_prefix = "$prefix"
EOF
  for d in "$@"; do
    read -r id model slo share <<<"$d"
    printf '\n[[deploy]]\nif_id = %s\nmodel = "%s"\nslo_ms = %s\nshare_pct = %s\n' \
      "$id" "$model" "$slo" "$share" >>"$file"
  done
}

# wait_for_shadows DIR: until every IF that DIR/platform.toml deploys has a
# shadow that said it is parked (its log's "kp-if: standby:" line), at most
# 60 s: a shadow starts at a low priority (kp-if --standby-nice) and, while
# it does, a measurement on the active's cores is not of the IF alone.
wait_for_shadows() {
  local id ids parked
  ids=$(awk '/^if_id = / {print $3}' "$1/platform.toml")
  for _ in $(seq 600); do
    parked=1
    for id in $ids; do
      grep -qs 'kp-if: standby:' "$runtime"/logs/if-"$id"-*.log || parked=0
    done
    ((parked)) && return 0
    sleep 0.1
  done
  say "warning: not every IF's shadow parked within 60 s; going on"
}

# start_platform DIR: the orchestrator on DIR/platform.toml; waits until
# every IF is active and each has a parked shadow.
start_platform() {
  local dir=$1
  runtime="$dir/run"
  endpoint="ipc://$runtime/orchestrator.sock"
  mkdir -p "$dir/kp-if"
  cat >"$wrap/kp-if" <<EOF
#!/bin/sh
exec "$bin/kp-if" $standby_nice_arg "\$@" >"$dir/kp-if/\$\$.json"
EOF
  chmod +x "$wrap/kp-if"
  local ino
  ino=$(stat -c %i /dev/hugepages 2>/dev/null || echo none)
  if [[ $ino != none ]] && ! flock -n -x /dev/hugepages true 2>/dev/null; then
    say "warning: /dev/hugepages is locked by $(awk -v i=":$ino " 'index($0, i) {print "pid " $5; exit}' /proc/locks)" \
      "(another DPDK process); the if-manager waits until it is released"
  fi
  echo "$(now)" >"$dir/orchestrator.launched"
  taskset -c "$cpus" "$bin/orchestrator" --config "$dir/platform.toml" --runtime-dir "$runtime" \
    >"$dir/summary.json" 2>"$dir/orchestrator.log" &
  orch_pid=$!
  local n
  n=$(grep -c '^\[\[deploy\]\]' "$dir/platform.toml")
  for _ in $(seq 1200); do
    kill -0 "$orch_pid" 2>/dev/null || { tail -n 30 "$dir/orchestrator.log" >&2; die "the orchestrator exited"; }
    if kpctl status 2>/dev/null | jq -e --argjson n "$n" \
      '(.ifs | length) == $n and all(.ifs[]; .state == "active")' >/dev/null 2>&1; then
      wait_for_shadows "$dir"
      return 0
    fi
    sleep 0.1
  done
  tail -n 30 "$dir/orchestrator.log" >&2
  die "the IFs did not become active within 120 s"
}

# stop_platform DIR: kpctl shutdown; waits for the orchestrator's summary.
stop_platform() {
  local dir=$1
  kpctl shutdown >"$dir/shutdown.json" || die "kpctl shutdown failed"
  for _ in $(seq 600); do kill -0 "$orch_pid" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$orch_pid" 2>/dev/null && die "the orchestrator did not exit within 60 s of shutdown"
  wait "$orch_pid" || die "the orchestrator exited with status $?: $(tail -n 20 "$dir/orchestrator.log")"
  orch_pid=""
  jq -e '.ifs' "$dir/summary.json" >/dev/null || die "no summary from the orchestrator"
}

kpctl() { "$bin/kpctl" --endpoint "$endpoint" --json "$@"; }

# client_loop NAME ARGS...: kp-client in CHUNK s pieces until $stopfile
# exists, one JSON report per piece in NAME.jsonl; request ids disjoint.
client_loop() {
  local name=$1 k=0 pidfile="$cur/client-$name.pid" record
  shift
  while [[ ! -e "$stopfile" ]]; do
    # With RECORD_CLIENTS=1 (the impact phase), each piece also writes one
    # line per request (record-NAME-K.csv: when sent, how it ended, when).
    record=()
    [[ ${RECORD_CLIENTS:-0} == 1 ]] && record=(--record "$cur/record-$name-$k.csv")
    ip netns exec "$CLIENT_NS" taskset -c "$cpus" "$bin/kp-client" --dst "$dst" --input synthetic --timeout 5s --json \
      --first-request-id $((k * 100000000 + 1)) --duration "${chunk}s" "${record[@]}" "$@" \
      >>"$cur/client-$name.jsonl" 2>>"$cur/client-$name.log" &
    echo $! >"$pidfile"
    wait $! || echo "{\"failed\": $?}" >>"$cur/client-$name.jsonl"
    k=$((k + 1))
  done
}

start_loop() {
  local name=$1
  client_pidfiles+=("$cur/client-$name.pid")
  client_loop "$@" &
  loop_pids+=("$!")
}

meta() {
  local dir=$1 phase=$2
  "$py" "$harness" meta "$dir/meta.json" "$phase" --repo "$repo" --cpus "$cpus" --if-manager-cpu "$ifm_cpu" \
    --switchovers "$switchovers" --settle-s "$settle" --frag-gap "$frag_gap" --concurrency "$concurrency" \
    --chunk-s "$chunk" --conv-duration-s "$conv_duration" --tuning-period-ms "$period_ms" \
    --hold-down-s "$hold_down" --min-step-pct "$min_step" --stable-k "$stable_k" \
    --if1 "$share1" "$slo1" "$rate1" --if5 "$share5" "$slo5" "$rate5" \
    --model1 "$model1" --model5 "$model5" --af-packet-frames "$af_frames"
}

# switch_if1 N LABEL [SETTLE]: N re-provisions of if 1 under the load
# already running, `kpctl share 1 40` / `60` alternately, each waited for
# (status: switchovers + 1 and active), SETTLE s apart (default $settle);
# one row each in $cur/switchovers.csv.
switch_if1() {
  echo "n,target_pct,t_cmd_s,cmd_to_active_ms,gap_us_status,old_pid,new_pid" >"$cur/switchovers.csv"
  local n=$1 label=$2 pause=${3:-$settle} i pct s row t0 t1 old new
  local t_load
  t_load=$(cat "$cur/load.started")
  for ((i = 1; i <= n; i++)); do
    pct=$((i % 2 ? 40 : 60))
    old=$(kpctl status | jq -r '.ifs[] | select(.if_id == 1) | .pid') || die "kpctl status failed"
    t0=$(now)
    # `--wait` polls the status inside kpctl until the switchover is done:
    # no process per poll on the cores the IFs serve on while they switch.
    for _ in $(seq 600); do
      if s=$(kpctl --wait --wait-timeout-s 60 share 1 "$pct" 2>>"$cur/share-refusals.log"); then
        break
      fi
      grep -q '(busy)' <(tail -n 1 "$cur/share-refusals.log") || die "switchover $i failed: $(tail -n 3 "$cur/share-refusals.log")"
      s=""
      sleep 0.1 # busy: the previous change is still being carried out
    done
    [[ -n $s ]] || die "switchover $i: if 1 stayed busy for 60 s"
    t1=$(now)
    head -n 1 <<<"$s" >>"$cur/share-replies.jsonl"
    row=$(tail -n 1 <<<"$s")
    jq -e '.switchovers == 1 and .if.state == "active"' <<<"$row" >/dev/null ||
      die "switchover $i did not switch over: $row"
    new=$(jq -r '.if.pid' <<<"$row")
    echo "$row" >>"$cur/status.jsonl"
    printf '%d,%d,%.3f,%.1f,%s,%s,%s\n' "$i" "$pct" "$(calc "$t0 - $t_load")" \
      "$(calc "($t1 - $t0) * 1000")" "$(jq -r '.if.last_switchover_gap_us' <<<"$row")" \
      "$old" "$new" >>"$cur/switchovers.csv"
    if ((i % 10 == 0)); then say "[$label] $i done (load average $(loadavg))"; fi
    sleep "$pause"
  done
}

# ---------------------------------------------------------------------------
phase_switchover() {
  cur="$out/switchover"
  rm -rf "$cur"
  mkdir -p "$cur"
  stopfile="$cur/stop"
  meta "$cur" switchover
  busy start
  say "[switchover] load average $(loadavg); platform up (if 1 $model1, if 5 $model5, tuning off)"
  config "$cur/platform.toml" false "1 $model1 2000 50" "5 $model5 2000 50"
  start_platform "$cur"
  echo "$(now)" >"$cur/load.started"
  start_loop if1 --if-id 1 --concurrency "$concurrency" --frag-gap "$frag_gap"
  start_loop if5 --if-id 5 --concurrency "$concurrency"
  sleep 3
  say "[switchover] $switchovers switchovers of if 1 (share 40 <-> 60) under load"
  switch_if1 "$switchovers" switchover
  sleep 2
  echo "$(now)" >"$cur/load.stopping"
  busy end
  touch "$stopfile"
  say "[switchover] waiting for the clients' last pieces"
  for p in "${loop_pids[@]}"; do wait "$p" || true; done
  loop_pids=()
  client_pidfiles=()
  kpctl status >"$cur/status-end.json"
  stop_platform "$cur"
  echo "$(loadavg)" >"$cur/loadavg.end"
  "$py" "$harness" switchover "$cur"
}

# ---------------------------------------------------------------------------
# busy LABEL: the machine's busiest processes now (the machine is shared).
busy() {
  { echo "== $1 $(date +%T) load $(loadavg); $(head -n1 /proc/pressure/cpu 2>/dev/null)"
    timeout 10 ps -eo pid,pcpu,etime,comm --sort=-pcpu | awk "NR <= 12" || true; } >>"$cur/machine.txt"
}

phase_convergence() {
  local scenario=$1
  case $scenario in
    too-large) share1=90 slo1=100 rate1=40 share5=10 slo5=100 rate5=30 ;;
    too-small) share1=10 slo1=5 rate1=120 share5=90 slo5=100 rate5=30 ;;
    custom)
      share1=${SHARE1:?} slo1=${SLO1:?} rate1=${RATE1:?}
      share5=${SHARE5:?} slo5=${SLO5:?} rate5=${RATE5:?}
      ;;
    *) die "unknown scenario '$scenario' (too-large, too-small, custom)" ;;
  esac
  cur="$out/convergence-$scenario"
  rm -rf "$cur"
  mkdir -p "$cur"
  stopfile="$cur/stop"
  meta "$cur" "convergence $scenario"
  busy start
  say "[convergence $scenario] load average $(loadavg); platform up, tuning on: if 1 at $share1% (SLO $slo1 ms), if 5 at $share5% (SLO $slo5 ms), hold-down ${hold_down}s"
  config "$cur/platform.toml" true "1 $model1 $slo1 $share1" "5 $model5 $slo5 $share5"
  start_platform "$cur"
  kpctl status >"$cur/status-before.json"
  echo "$(now)" >"$cur/load.started"
  say "[convergence $scenario] open-loop load: if 1 $rate1 req/s, if 5 $rate5 req/s, ${conv_duration}s"
  local c1 c5 t_end
  ip netns exec "$CLIENT_NS" taskset -c "$cpus" "$bin/kp-client" --dst "$dst" --input synthetic --timeout 5s --json \
    --if-id 1 --rate "$rate1" --duration "${conv_duration}s" >"$cur/client-if1.json" 2>"$cur/client-if1.log" &
  c1=$!
  loop_pids+=("$c1")
  ip netns exec "$CLIENT_NS" taskset -c "$cpus" "$bin/kp-client" --dst "$dst" --input synthetic --timeout 5s --json \
    --if-id 5 --rate "$rate5" --duration "${conv_duration}s" >"$cur/client-if5.json" 2>"$cur/client-if5.log" &
  c5=$!
  loop_pids+=("$c5")
  t_end=$(calc "$(cat "$cur/load.started") + $conv_duration")
  while (($(calc "$(now) < $t_end ? 1 : 0" | cut -d. -f1))); do
    kpctl status >>"$cur/status.jsonl" 2>/dev/null || true
    kill -0 "$orch_pid" 2>/dev/null || die "the orchestrator died: $(tail -n 20 "$cur/orchestrator.log")"
    sleep 1
  done
  wait "$c1" || true
  wait "$c5" || true
  loop_pids=()
  echo "$(now)" >"$cur/load.stopped"
  busy end
  kpctl status >"$cur/status-end.json"
  stop_platform "$cur"
  echo "$(loadavg)" >"$cur/loadavg.end"
  cp "$runtime/decisions.jsonl" "$cur/decisions.jsonl"
  grep -h 'on cores' "$runtime"/logs/if-*.log >"$cur/kp-if-cores.txt" || true
  "$py" "$harness" convergence "$cur"
}

# ---------------------------------------------------------------------------
# Phase "impact" (issue 13: switchovers as clients see them), once per
# fraction of IMPACT_LOADS: the same platform as "switchover"; a light
# closed loop on if 5 from the start; if 1's capacity measured beside it
# (closed loop, CAP_CONCURRENCY outstanding, CAP_S s: OK answers/s); then
# open-loop Poisson load on if 1 at that fraction of it (every request
# recorded: record-if1-K.csv) while IMPACT_SWITCHOVERS switchovers of if 1
# run SETTLE s apart.
# The orchestrator's summary gives each switchover's wall-clock window; the
# harness compares the requests in flight within IMPACT_MARGIN_MS of one
# with all the others (latency percentiles, failures).
phase_impact() {
  local frac=$1 cap rate
  cur="$out/impact-$frac"
  rm -rf "$cur"
  mkdir -p "$cur"
  stopfile="$cur/stop"
  meta "$cur" impact
  busy start
  config "$cur/platform.toml" false "1 $model1 2000 50" "5 $model5 2000 50"
  start_platform "$cur"
  # if 5's light closed loop runs from here on, through the capacity
  # measurement too: measured with if 5 idle, the capacity was if 1's with
  # a core's worth of room for the clients and the kernel's packet work
  # that it no longer has under the load it is a fraction of.
  echo "$(now)" >"$cur/load.started"
  start_loop if5 --if-id 5 --concurrency 1
  sleep 3
  ip netns exec "$CLIENT_NS" taskset -c "$cpus" "$bin/kp-client" --dst "$dst" --input synthetic --timeout 5s --json \
    --if-id 1 --concurrency "$cap_concurrency" --duration "${cap_s}s" --first-request-id 900000000001 \
    >"$cur/capacity.json" 2>"$cur/capacity.log" || die "the capacity run failed: $(tail -n 5 "$cur/capacity.log")"
  cap=$(jq -r '.status.ok / .send_duration_s' "$cur/capacity.json")
  rate=$(calc "$cap * $frac")
  say "[impact $frac] if 1 capacity $(calc "$cap") OK/s; open loop at $rate req/s, $impact_switchovers switchovers"
  echo "$cap $rate" >"$cur/rate.txt"
  RECORD_CLIENTS=1 start_loop if1 --if-id 1 --rate "$rate"
  sleep 3
  switch_if1 "$impact_switchovers" "impact $frac" "$impact_settle"
  sleep 2
  busy end
  touch "$stopfile"
  for p in "${loop_pids[@]}"; do wait "$p" || true; done
  loop_pids=()
  client_pidfiles=()
  stop_platform "$cur"
  echo "$(loadavg)" >"$cur/loadavg.end"
  "$py" "$harness" impact "$cur" --margin-ms "$impact_margin_ms"
}

# ---------------------------------------------------------------------------
# Phase "e2e" (issue 11: end to end against the engine alone, at the same
# batch sizes). First the engine alone: kp-engine-bench on MODEL1, batches
# 1..E2E_CONCURRENCY, E2E_ENGINE_S s each, as kp-if loads it; for a GPU
# engine under CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=E2E_SHARE (the share the
# IF gets), for a CPU engine on E2E_ENGINE_CPUS with the model's threads
# (give it the cores the IF's share gives: on a CPU, scripts/bench-if.sh
# is the finer tool). Then the platform, tuning off, if 1 at E2E_SHARE and
# if 5 at the rest (no leftover to hand out), and a closed loop on if 1
# with E2E_CONCURRENCY outstanding: E2E_WARMUP s, then E2E_S s measured.
# The harness times the engine alone at the batch mix the IF ran (kp-client
# counts OK answers per batch size) and gives OK/s against that.
phase_e2e() {
  cur="$out/e2e"
  rm -rf "$cur"
  mkdir -p "$cur"
  stopfile="$cur/stop"
  share1=$e2e_share slo1=2000 rate1=0 share5=$((100 - e2e_share)) slo5=2000 rate5=0
  meta "$cur" e2e
  busy start
  local batches engine_env=() engine
  batches=$(seq -s, 1 "$e2e_concurrency")
  engine=$(sed -n 's/^engine *= *"\(.*\)"/\1/p' "$models/$model1/config.toml" | head -n1)
  case $engine in
    cudnn | onnxruntime-cuda) engine_env=(env "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=$e2e_share") ;;
  esac
  say "[e2e] the engine alone: $model1 ($engine), batches $batches, ${e2e_engine_s}s each"
  "${engine_env[@]}" taskset -c "$e2e_engine_cpus" "$bin/kp-engine-bench" --model "$models/$model1/config.toml" \
    --batches "$batches" --max-batch 32 --seconds "$e2e_engine_s" >"$cur/engine.jsonl" 2>"$cur/engine.log" ||
    die "kp-engine-bench failed: $(tail -n 5 "$cur/engine.log")"
  config "$cur/platform.toml" false "1 $model1 2000 $share1" "5 $model5 2000 $share5"
  start_platform "$cur"
  say "[e2e] if 1 $model1 at $share1%: closed loop, $e2e_concurrency outstanding, ${e2e_warmup}s warm-up then ${e2e_s}s"
  ip netns exec "$CLIENT_NS" taskset -c "$cpus" "$bin/kp-client" --dst "$dst" --input synthetic --timeout 5s --json \
    --if-id 1 --concurrency "$e2e_concurrency" --duration "${e2e_warmup}s" --first-request-id 800000000001 \
    >"$cur/warmup.json" 2>"$cur/warmup.log" || die "the warm-up failed: $(tail -n 5 "$cur/warmup.log")"
  ip netns exec "$CLIENT_NS" taskset -c "$cpus" "$bin/kp-client" --dst "$dst" --input synthetic --timeout 5s --json \
    --if-id 1 --concurrency "$e2e_concurrency" --duration "${e2e_s}s" --first-request-id 810000000001 \
    >"$cur/client.json" 2>"$cur/client.log" || die "the measured run failed: $(tail -n 5 "$cur/client.log")"
  busy end
  kpctl status >"$cur/status-end.json"
  stop_platform "$cur"
  echo "$(loadavg)" >"$cur/loadavg.end"
  "$py" "$harness" e2e "$cur"
}

for p in $phases; do
  case $p in
    switchover) phase_switchover ;;
    e2e) phase_e2e ;;
    convergence) for sc in $scenarios; do phase_convergence "$sc"; done ;;
    impact) for f in $impact_loads; do phase_impact "$f"; done ;;
    *) die "unknown phase '$p' (switchover, convergence, impact, e2e)" ;;
  esac
done

# A markdown summary of whatever phases have results.
"$py" "$harness" summary "$out" | tee "$out/summary.md"
# A run of every default phase is docs/PERFORMANCE.md's generated section
# of the orchestrator, with BENCH_UPDATE_DOCS=1 (make bench); a run of some
# phases only is not: the summary may hold older runs' other phases.
if [[ ${BENCH_UPDATE_DOCS:-0} == 1 && $phases == "switchover convergence impact" && -z ${OUT:-} ]]; then
  "$py" "$harness" docs "$out" "$repo/docs/PERFORMANCE.md" || true
else
  say "docs/PERFORMANCE.md left alone (PHASES=\"$phases\", BENCH_UPDATE_DOCS=${BENCH_UPDATE_DOCS:-0}${OUT:+, OUT set})"
fi
