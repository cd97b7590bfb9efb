#!/usr/bin/env bash
# Benchmark: one inference function (IF) — the engine alone vs end to end
# through the platform, the platform's own latency at half load, and the
# IF's resident and hugepage memory at rest and after a long run.
#
#   scripts/bench-if.sh                 # squeezenet, about 5 minutes
#   MODEL=resnet50 DURATION=60 SLO_MS=5000 scripts/bench-if.sh
#
# (resnet50's saturation queues 32 requests for ~2.5 s: with the default 2 s
# SLO the IF would refuse most of them at once and the closed loop spin.)
#
# Machine layout (2 CPUs): the if-manager's lcore on CPU 0; kp-if's EAL
# lcore (its fragment thread) on CPU $KP_RX_CPU, by default the inference
# core ($IF_CPU, 1), where all of kp-if's per-request work then runs
# (KP_RX_CPU=0: kneepoint as designed, the fragment thread with the
# network side, as bench/bench.py runs it); its inference thread (1
# intra-op thread) on CPU $IF_CPU; kp-client and two tcpdumps on CPU 0, at idle
# priority (SCHED_IDLE): they stand for a client on another machine, so
# the platform's threads run as soon as they wake. At normal priority
# (CLIENT_POLICY=normal) kp-client keeps CPU 0 for the whole ~0.5 ms in
# which it sends a request's 147 fragments (the scheduler does not preempt
# it for the if-manager's wake-ups), and the platform then met every
# request as one burst that had already arrived (docs/PERFORMANCE-JOURNAL.md,
# "After the last fragment"). The engine alone (kp-engine-bench) is
# pinned to the IF's CPU with the same threads.
#
# Phases (the way each number is computed: docs/PERFORMANCE.md,
# "Inference function: engine alone vs end to end"):
#  1. engine alone: kp-engine-bench, batch sizes 1..MAX_BATCH, ENGINE_SECONDS
#     each; run again at the end to show how much the machine drifted;
#  2. a veth pair in two namespaces (scripts/netns.sh), the if-manager on it
#     (net_af_packet) and kp-if; kp-if's memory at rest, model loaded and no
#     traffic yet: /proc/PID/status and the hugetlb lines of /proc/PID/smaps;
#  3. one request at a time (closed loop, 1 outstanding) for DURATION: the
#     platform's latency with no queueing;
#  4. saturation: closed loop, CONCURRENCY outstanding, after a WARMUP of
#     the same load: OK answers per second, against the engine's images/s
#     at the batch sizes the IF really used;
#  5. low load: open loop (Poisson) at LOW_LOAD_FRACTION of the saturation
#     rate for DURATION, or longer for LOW_REQUESTS requests: the
#     platform's own latency where requests rarely meet each other (issue
#     13's low-latency target: at one request outstanding and at <= 10%
#     load);
#  6. half load: open loop (Poisson) at LOAD_FRACTION of the saturation
#     rate for DURATION: client RTT, platform latency (the answers'
#     latency_us) and platform overhead = latency_us minus the engine's
#     median time for a batch of the request's size, p50/p99;
#  7. a long run at the same load for LONG_DURATION, then memory again.
# In phases 3-7, tcpdump (headers only) records every answer on the
# client's interface (its batch_size and latency_us) and the first and last
# fragment of every request on the platform's interface.
# Raw results (JSON, JSON lines, CSV, pcap) go to $BENCH_IF_OUT;
# a markdown summary is printed and written there (summary.md).
#
# Env: MODEL (squeezenet), DURATION (20 s), LONG_DURATION (120 s),
# WARMUP (5 s), ENGINE_SECONDS (4 s per batch size), MAX_BATCH (8),
# CONCURRENCY (4 x MAX_BATCH: with 2 x, CPU 1 was up to 17% idle, the
# batching policy waiting for full batches), AF_PACKET_FRAMES (8192: the
# af_packet ring's frames; DPDK's default 512 lost datagrams), SLO_MS
# (2000: generous, so saturation measures capacity rather than shedding),
# LOAD_FRACTION (0.5), LOW_LOAD_FRACTION (0.1; 0 skips the low-load
# phase), LOW_REQUESTS (1000: the low-load phase runs DURATION or, where
# that sends fewer, long enough for this many requests, so that its p99
# is not one of a handful: resnet50 at 10% load is ~1.3 req/s), IF_CPU
# (1), KP_RX_CPU (IF_CPU), CLIENT_POLICY (idle, or normal),
# IFM_TIMER_SLACK_US (unset: the kernel's 50 µs; 1 gives the if-manager
# --timer-slack-us 1, exact back-off sleeps),
# BUSY_POLL (0; 1 gives both DPDK processes --busy-poll: on 2 CPUs they
# then spin on the cores the client and the engine need),
# HOST_PROBE_S (10: seconds of each of Debian's rt-tests, cyclictest and
# oslat, on the platform's CPUs before and after the run, the platform
# stopped: the host's own wake-up latency and interruptions; 0 skips them),
# INFERENCE_SPIN_MS (0; N gives kp-if --inference-spin-ms N: its inference
# thread spins, instead of dozing, for N ms after each batch — as designed
# only, KP_RX_CPU=0, where no other thread of the platform needs its core),
# CONVERT_ON (inference all on the inference core, network as designed:
# which kp-if thread converts the images, see below), PROFILE
# (release), BENCH_IF_OUT (target/bench/if/MODEL, or MODEL-as-designed
# when KP_RX_CPU is not IF_CPU, with -spinning after it when
# INFERENCE_SPIN_MS is set: the run's folder, emptied first),
# BENCH_UPDATE_DOCS (0; 1, as `make bench` sets it: summary.md becomes
# docs/PERFORMANCE.md's generated section of this run, bench-if-RUN where
# RUN is the folder's name),
# PERF (0; 1: Debian's `perf record` samples kp-if, all its threads, for
# the whole of the long run, from CPU 0 at idle priority: perf-long.data,
# and perf-long.txt with its samples by thread and shared object and the
# hottest symbols of kp-if itself and the kernel — ONNX Runtime's library
# is stripped: where the IF's time goes under load. The sampling slows
# the engine on a VM — resnet50's batch p50 86 ms profiled against 78 ms
# not — so the long run's latencies are then the profiler's; the
# half-load phase before it stays unprofiled).
# Needs root, iproute2, tcpdump (without it: no per-request batch sizes or
# overheads), 2 MiB hugepages and `make build models`.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bin="$repo/target/${PROFILE:-release}"
py="$repo/.venv/bin/python"
# The Python side: snapshots, kp-client's runner, the analysis (tested).
harness="$repo/bench/bench_if.py"
model=${MODEL:-squeezenet}
duration=${DURATION:-20}
long_duration=${LONG_DURATION:-120}
warmup=${WARMUP:-5}
engine_seconds=${ENGINE_SECONDS:-4}
max_batch=${MAX_BATCH:-8}
concurrency=${CONCURRENCY:-$((4 * max_batch))}
slo_ms=${SLO_MS:-2000}
load_fraction=${LOAD_FRACTION:-0.5}
low_load_fraction=${LOW_LOAD_FRACTION:-0.1}
low_requests=${LOW_REQUESTS:-1000}
host_probe_s=${HOST_PROBE_S:-10}
[[ $host_probe_s =~ ^[0-9]+$ ]] || { echo "bench-if: HOST_PROBE_S must be a whole number of seconds" >&2; exit 1; }
af_frames=${AF_PACKET_FRAMES:-8192}
ifm_cpu=0
if_cpu=${IF_CPU:-1}
kp_rx_cpu=${KP_RX_CPU:-$if_cpu}
client_cpu=0
# The load generator and its observers: idle priority (see above).
side=(chrt --idle 0)
case ${CLIENT_POLICY:-idle} in
  idle) ;;
  normal) side=() ;;
  *) echo "bench-if: CLIENT_POLICY must be idle or normal" >&2; exit 1 ;;
esac
threads=1
busy=()
[[ "${BUSY_POLL:-0}" == 1 ]] && busy=(--busy-poll)
inference_spin_ms=${INFERENCE_SPIN_MS:-0}
[[ $inference_spin_ms =~ ^[0-9]+$ ]] || { echo "bench-if: INFERENCE_SPIN_MS must be a whole number of ms" >&2; exit 1; }
# Given only when set, as --busy-poll is: binaries from before the option
# (PROFILE=... of an older build, alternated with this one) still run.
spin=()
((10#$inference_spin_ms > 0)) && spin=(--inference-spin-ms "$inference_spin_ms")
# Which of kp-if's threads converts each image to the model's input
# (kp-if --convert-on): all on the inference core, the inference thread,
# just before the engine runs the batch, as the peers preprocess in the
# model's process and as bench.py's kneepoint-ic runs (the fragment thread
# copies bytes only); as designed, the fragment thread on the network
# side's core. Converted by a fragment thread on the engine's core, the
# next requests' images were written while a batch ran, and the engine ran
# slower: end to end / engine 0.897-0.915 against 0.944-0.968 in three
# alternated pairs (docs/PERFORMANCE-JOURNAL.md, "2 December, seventh").
# CONVERT_ON (network or inference) overrides.
if [[ $kp_rx_cpu == "$if_cpu" ]]; then convert_on=${CONVERT_ON:-inference}; else convert_on=${CONVERT_ON:-network}; fi
[[ $convert_on == network || $convert_on == inference ]] || { echo "bench-if: CONVERT_ON must be network or inference" >&2; exit 1; }
# Passed where it differs from kp-if's own choice (--convert-on auto
# converts on the inference thread where the fragment thread shares its
# cores), so an older build without the option still runs as designed.
convert=()
[[ $convert_on == inference || $kp_rx_cpu == "$if_cpu" ]] && convert=(--convert-on "$convert_on")
ifm_extra=()
[[ -n "${IFM_TIMER_SLACK_US:-}" ]] && ifm_extra=(--timer-slack-us "$IFM_TIMER_SLACK_US")

die() { printf 'bench-if: %s\n' "$*" >&2; exit 1; }
((EUID == 0)) || die "must run as root (namespaces, DPDK)"
config="$repo/models/$model/config.toml"
[[ -f "$config" ]] || die "no $config: run 'make models'"
for b in kp-engine-bench if-manager kp-if kp-client; do
  [[ -x "$bin/$b" ]] || die "no $bin/$b: run 'make build'"
done
have_tcpdump=1
perf_on=${PERF:-0}
[[ $perf_on == 0 || $perf_on == 1 ]] || die "PERF must be 0 or 1"
if ((perf_on)); then
  command -v perf >/dev/null || die "PERF=1 needs perf (Debian: apt-get install linux-perf)"
fi
command -v tcpdump >/dev/null || { have_tcpdump=0; echo "bench-if: no tcpdump: per-request batch sizes and overheads are skipped" >&2; }
if_id=$(sed -n 's/^if_id *= *\([0-9]*\).*/\1/p' "$config")
[[ -n "$if_id" ]] || die "no if_id in $config"

# The run's name: the model, "-as-designed" when the fragment thread runs
# off the inference core, and "-spinning" with INFERENCE_SPIN_MS (its
# folder and its section of the docs).
run_name=$model
[[ $kp_rx_cpu == "$if_cpu" ]] || run_name=$model-as-designed
((10#$inference_spin_ms > 0)) && run_name=$run_name-spinning
out=${BENCH_IF_OUT:-$repo/target/bench/if/$run_name}
rm -rf "$out"
mkdir -p "$out"
prefix="kp-bif-$$"
net="kpb$(($$ % 100000))"
pids=()

cleanup() {
  local p
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$p" 2>/dev/null || true
  done
  "$repo/scripts/netns.sh" down "$net" 2>/dev/null || true
  rm -rf /dev/hugepages/"$prefix"* /var/run/dpdk/"$prefix" 2>/dev/null || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Waits until FILE contains TEXT, or PID exits (then fails with its log).
wait_for() {
  local file=$1 text=$2 pid=$3 what=$4
  for _ in $(seq 1800); do
    grep -q "$text" "$file" 2>/dev/null && return 0
    kill -0 "$pid" 2>/dev/null || { tail -n 30 "$file" >&2; die "$what exited before '$text'"; }
    sleep 0.1
  done
  tail -n 30 "$file" >&2
  die "$what: '$text' not seen in 180 s (a busy machine?)"
}

# stop PID: SIGTERM, wait for it, forget it.
stop() {
  local p=$1 rest=()
  kill -TERM "$p" 2>/dev/null || true
  wait "$p" 2>/dev/null || true
  for q in "${pids[@]}"; do [[ "$q" != "$p" ]] && rest+=("$q"); done
  pids=("${rest[@]}")
}

# machine LABEL: load average, per-CPU /proc/stat counters and, for each
# daemon, every thread's CPU time (schedstat, ns: exact, where the tick-
# sampled utime/stime misattribute threads that sleep and wake often), as
# one JSON line of machine.jsonl.
machine() {
  "$py" "$harness" machine "$1" "${ifm_pid:-0}" "${kpif_pid:-0}" >>"$out/machine.jsonl"
}

# memory LABEL PID PROC: /proc/PID/status, hugetlb mappings from smaps and
# the machine's free hugepages, as one JSON line of memory.jsonl.
memory() {
  "$py" "$harness" memory "$@" >>"$out/memory.jsonl"
}

# capture PHASE: two tcpdumps on CPU 0 (idle priority), headers only: the
# platform's answers on the client's interface (answers-PHASE.pcap), and the first and
# last fragment of every request as they reach the platform's interface
# (frags-PHASE.pcap: the span in which a request's fragments arrive). The
# platform's answers are not seen on its own interface: DPDK's af_packet
# sends them past the kernel's taps (qdisc bypass).
capture_start() {
  cap_pids=()
  ((have_tcpdump)) || return 0
  local ns dev file filter
  for what in answers frags; do
    if [[ $what == answers ]]; then
      ns=$CLIENT_NS dev=$CLIENT_IF filter="udp and src host $PLATFORM_IP and src port 9000"
    else
      # frag_index and frag_count are at UDP payload offsets 20 and 22.
      ns=$PLATFORM_NS dev=$PLATFORM_IF
      filter="udp and dst host $PLATFORM_IP and dst port 9000 and (udp[28:2] = 0 or udp[28:2] + 1 = udp[30:2])"
    fi
    file="$out/$what-$1"
    ip netns exec "$ns" "${side[@]}" taskset -c "$client_cpu" tcpdump -i "$dev" -n -s 96 -U \
      --time-stamp-precision nano -w "$file.pcap" "$filter" 2>"$file.tcpdump.log" &
    cap_pids+=("$!"); pids+=("$!")
    wait_for "$file.tcpdump.log" "listening on" "$!" tcpdump
  done
}
capture_stop() {
  local p ns=0
  ((${#cap_pids[@]})) || return 0
  sleep 0.2
  for p in "${cap_pids[@]}"; do
    ns=$((ns + $(cut -d' ' -f1 "/proc/$p/schedstat" 2>/dev/null || echo 0)))
    kill -INT "$p" 2>/dev/null || true
    stop "$p"
  done
  echo "$ns" >"$out/tcpdump-$1.ns"
}

# client PHASE ARGS...: kp-client from the client namespace on CPU 0, at
# idle priority.
# Its CPU time (getrusage of the child) goes to client-PHASE.rusage.json.
client() {
  local phase=$1; shift
  "$py" "$harness" client "$out/client-$phase" ip netns exec "$CLIENT_NS" "${side[@]}" taskset -c "$client_cpu" "$bin/kp-client" \
    --dst "$PLATFORM_IP:9000" --if-id "$if_id" --input synthetic --timeout 5s --json "$@" ||
    die "kp-client ($phase) failed: $(cat "$out/client-$phase.log")"
}

# host_latency WHEN: the host itself, the platform stopped, on the CPUs the
# platform uses (Debian's rt-tests, installed here when missing; each
# HOST_PROBE_S seconds, 0 skips both): how late a sleeping thread wakes
# (cyclictest: one SCHED_OTHER thread per CPU, as the platform's, sleeping
# 5 ms on a timer) and how often the host keeps a running one from its CPU
# (oslat: a busy loop per CPU). Every doze and sleep on a request's way pays
# the first; every leg the second. -> host-{cyclictest,oslat}-WHEN.json.
host_latency() {
  ((host_probe_s > 0)) || return 0
  if ! command -v cyclictest >/dev/null || ! command -v oslat >/dev/null; then
    echo "bench-if: installing rt-tests (cyclictest, oslat) from Debian" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends rt-tests >/dev/null 2>&1 ||
      { echo "bench-if: rt-tests not installed: the host's own latency is not measured" >&2; host_probe_s=0; return 0; }
  fi
  local cpus n
  cpus=$(printf '%s\n' "$ifm_cpu" "$if_cpu" "$kp_rx_cpu" | sort -un | paste -sd,)
  n=$(tr , '\n' <<<"$cpus" | wc -l)
  cyclictest --policy=other -m -q -t "$n" -a "$cpus" -i 5000 -D "$host_probe_s" -h 20000 \
    --json="$out/host-cyclictest-$1.json" >"$out/host-cyclictest-$1.log" 2>&1 ||
    echo "bench-if: cyclictest failed: $(tail -2 "$out/host-cyclictest-$1.log")" >&2
  oslat -c "$cpus" -D "$host_probe_s" -q -b 1024 --json="$out/host-oslat-$1.json" >"$out/host-oslat-$1.log" 2>&1 ||
    echo "bench-if: oslat failed: $(tail -2 "$out/host-oslat-$1.log")" >&2
}

engine_bench() {
  taskset -c "$if_cpu" "$bin/kp-engine-bench" --model "$config" --threads "$threads" \
    --max-batch "$max_batch" --batches "$(seq -s, 1 "$max_batch")" --seconds "$engine_seconds" \
    >"$out/engine-$1.jsonl" 2>"$out/engine-$1.log" || die "kp-engine-bench failed: $(cat "$out/engine-$1.log")"
}

"$py" "$harness" meta "$out/meta.json" --repo "$repo" --model "$model" --if-id "$if_id" \
  --duration-s "$duration" --long-duration-s "$long_duration" --warmup-s "$warmup" \
  --engine-seconds "$engine_seconds" --max-batch "$max_batch" --concurrency "$concurrency" --slo-ms "$slo_ms" \
  --load-fraction "$load_fraction" --low-load-fraction "$low_load_fraction" --threads "$threads" --if-manager-cpu "$ifm_cpu" --kp-if-cpu "$if_cpu" --kp-rx-cpu "$kp_rx_cpu" \
  --client-cpu "$client_cpu" --client-policy "${CLIENT_POLICY:-idle}" \
  --if-manager-timer-slack-us "${IFM_TIMER_SLACK_US:-}" --busy-poll "${BUSY_POLL:-0}" \
  --inference-spin-ms "$inference_spin_ms" --convert-on "$convert_on" --tcpdump "$have_tcpdump"

echo "bench-if: $model: load average $(cut -d' ' -f1-3 /proc/loadavg); results in $out" >&2
echo "bench-if: [1/6] engine alone on CPU $if_cpu, batches 1..$max_batch, ${engine_seconds}s each" >&2
machine engine-before-start
engine_bench before
machine engine-before-end
echo "bench-if: the host itself: cyclictest and oslat, ${host_probe_s}s each" >&2
host_latency before

echo "bench-if: [2/7] platform up, memory at rest" >&2
eval "$("$repo/scripts/netns.sh" up "$net")"
ctl="ipc://$out/ifm.sock"
memory_free_before=$(awk '/HugePages_Free/ {print $2}' /proc/meminfo)
ip netns exec "$PLATFORM_NS" "$bin/if-manager" "${busy[@]}" "${ifm_extra[@]}" --control "$ctl" --ip "$PLATFORM_IP" \
  --stats-json "$out/if-manager.json" -- \
  --lcores "0@$ifm_cpu" --file-prefix "$prefix" --no-pci --no-telemetry --log-level lib.eal:error \
  --vdev "net_af_packet0,iface=$PLATFORM_IF,framecnt=$af_frames" >/dev/null 2>"$out/if-manager.log" &
ifm_pid=$!; pids+=("$ifm_pid")
wait_for "$out/if-manager.log" "if-manager: ready" "$ifm_pid" if-manager
memory_free_ifm=$(awk '/HugePages_Free/ {print $2}' /proc/meminfo)
# The inference thread (and any engine thread) on the IF's CPU: with --cores
# where kp-if has it, else by inheriting the EAL lcore's affinity.
cores=()
"$bin/kp-if" --help | grep -q -- '--cores' && cores=(--cores "$if_cpu")
# Every request's own engine time and its way through the IF, written when
# kp-if stops (trace.jsonl; kp-if --trace, where it has it). Its records
# (64 bytes per request, ~2 MiB over a default run) are in kp-if's RSS
# growth below.
trace=()
"$bin/kp-if" --help | grep -q -- '--trace' && trace=(--trace "$out/trace.jsonl")
ip netns exec "$PLATFORM_NS" "$bin/kp-if" "${busy[@]}" "${spin[@]}" "${convert[@]}" "${cores[@]}" "${trace[@]}" --model "$config" --control "$ctl" \
  --slo-ms "$slo_ms" --threads "$threads" --max-batch "$max_batch" --stats-json "$out/kp-if.json" -- \
  --lcores "1@$kp_rx_cpu" --proc-type secondary --file-prefix "$prefix" --no-pci --no-telemetry \
  --log-level lib.eal:error >/dev/null 2>"$out/kp-if.log" &
kpif_pid=$!; pids+=("$kpif_pid")
wait_for "$out/kp-if.log" "kp-if: ready" "$kpif_pid" kp-if
sleep 2
memory_free_if=$(awk '/HugePages_Free/ {print $2}' /proc/meminfo)
echo "{\"hugepages_free\": {\"before\": $memory_free_before, \"if_manager_up\": $memory_free_ifm, \"kp_if_up\": $memory_free_if}}" \
  >"$out/hugepages.json"
memory rest "$kpif_pid" kp-if
memory rest "$ifm_pid" if-manager

# profile_start PHASE / profile_stop PHASE: with PERF=1, perf record of
# kp-if (every thread) through the long run, then its report.
profile_start() {
  perf_pid=
  ((perf_on)) && [[ $1 == long ]] || return 0
  "${side[@]}" taskset -c "$client_cpu" perf record -q -F 999 -p "$kpif_pid" -o "$out/perf-$1.data" \
    2>"$out/perf-$1.log" &
  perf_pid=$!; pids+=("$perf_pid")
  sleep 0.5
}
profile_stop() {
  [[ -n ${perf_pid:-} ]] || return 0
  kill -INT "$perf_pid" 2>/dev/null || true
  stop "$perf_pid"
  {
    echo "# perf record -F 999 of kp-if through phase $1: samples by thread (pid:comm) and shared object"
    perf report -i "$out/perf-$1.data" --stdio --no-children --sort pid,dso 2>/dev/null | grep -v '^#' | grep -v '^$'
    echo "# the hottest symbols of kp-if and the kernel, by thread"
    perf report -i "$out/perf-$1.data" --stdio --no-children --dsos "kp-if,[kernel.kallsyms]" --sort pid,sym \
      --percent-limit 0.02 2>/dev/null | grep -v '^#' | grep -v '^$'
  } >"$out/perf-$1.txt"
  echo "bench-if: perf profile of kp-if: $out/perf-$1.txt" >&2
}

# phase PHASE ARGS...: capture, CPU snapshots and kp-client around one load.
phase() {
  local name=$1; shift
  capture_start "$name"
  profile_start "$name"
  machine "$name-start"
  client "$name" "$@"
  machine "$name-end"
  profile_stop "$name"
  capture_stop "$name"
}

echo "bench-if: [3/7] one request at a time (closed loop, 1 outstanding) for ${duration}s" >&2
client warmup1 --concurrency 1 --duration 2s
phase single --concurrency 1 --duration "${duration}s"

echo "bench-if: [4/7] saturation: closed loop, $concurrency outstanding, ${warmup}s warm-up + ${duration}s" >&2
client warmup --concurrency "$concurrency" --duration "${warmup}s"
phase sat --concurrency "$concurrency" --duration "${duration}s"
memory after-saturation "$kpif_pid" kp-if
sat_rate=$("$py" "$harness" ok-rate "$out/client-sat.json")
rate=$("$py" "$harness" offered-rate "$sat_rate" "$load_fraction") ||
  die "saturation served nothing (OK/s $sat_rate): see $out/client-sat.json"

if [[ $low_load_fraction != 0 ]]; then
  low_rate=$("$py" "$harness" offered-rate "$sat_rate" "$low_load_fraction") ||
    die "the low-load rate ($low_load_fraction of $sat_rate OK/s) is under 0.5 req/s"
  low_duration=$("$py" "$harness" low-load-seconds "$duration" "$low_requests" "$low_rate")
  echo "bench-if: [5/7] low load: open loop $low_rate req/s (Poisson) for ${low_duration}s" >&2
  phase low --rate "$low_rate" --duration "${low_duration}s"
fi

echo "bench-if: [6/7] half load: open loop $rate req/s (Poisson) for ${duration}s" >&2
phase half --rate "$rate" --duration "${duration}s"
memory after-half "$kpif_pid" kp-if

echo "bench-if: [7/7] long run: $rate req/s for ${long_duration}s" >&2
phase long --rate "$rate" --duration "${long_duration}s"
sleep 2
memory after-long "$kpif_pid" kp-if
memory after-long "$ifm_pid" if-manager

stop "$kpif_pid"
stop "$ifm_pid"
"$repo/scripts/netns.sh" down "$net"
echo "bench-if: engine alone again (drift check)" >&2
machine engine-after-start
engine_bench after
machine engine-after-end
host_latency after

# Analysis: everything the phases wrote -> summary.json, CSVs, summary.md.
"$py" "$harness" analyse "$out"
# docs/PERFORMANCE.md's generated section of this run (bench-if-RUN, RUN
# as its folder is named), with BENCH_UPDATE_DOCS=1 (make bench), its
# heading one level down.
if [[ ${BENCH_UPDATE_DOCS:-0} == 1 ]]; then
  sed 's/^### /#### /' "$out/summary.md" >"$out/summary-docs.md"
  "$py" "$repo/bench/docsection.py" "bench-if-$run_name" scripts/bench-if.sh "$out/summary-docs.md" \
    "$repo/docs/PERFORMANCE.md" || true
fi
