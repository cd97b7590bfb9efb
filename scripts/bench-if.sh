#!/usr/bin/env bash
# Benchmark: one inference function (IF) — the engine alone vs end to end
# through the platform, the platform's own latency at half load, and the
# IF's resident and hugepage memory at rest and after a long run.
#
#   scripts/bench-if.sh                 # squeezenet, about 5 minutes
#   MODEL=resnet50 DURATION=60 scripts/bench-if.sh
#
# Machine layout (2 CPUs): the if-manager's lcore on CPU 0; kp-if's EAL
# lcore (its fragment thread) and its inference thread (1 intra-op thread)
# on CPU $IF_CPU (1); kp-client and two tcpdumps on CPU 0. The engine
# alone (kp-engine-bench) is pinned to the IF's CPU with the same threads.
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
#  5. half load: open loop (Poisson) at LOAD_FRACTION of the saturation
#     rate for DURATION: client RTT, platform latency (the answers'
#     latency_us) and platform overhead = latency_us minus the engine's
#     median time for a batch of the request's size, p50/p99;
#  6. a long run at the same load for LONG_DURATION, then memory again.
# In phases 3-6, tcpdump (headers only) records every answer on the
# client's interface (its batch_size and latency_us) and the first and last
# fragment of every request on the platform's interface.
# Raw results (JSON, JSON lines, CSV, pcap) go to target/bench/if/MODEL/;
# a markdown summary is printed and written there (summary.md).
#
# Env: MODEL (squeezenet), DURATION (20 s), LONG_DURATION (120 s),
# WARMUP (5 s), ENGINE_SECONDS (4 s per batch size), MAX_BATCH (8),
# CONCURRENCY (4 x MAX_BATCH: with 2 x, CPU 1 was up to 17% idle, the
# batching policy waiting for full batches), AF_PACKET_FRAMES (8192: the
# af_packet ring's frames; DPDK's default 512 lost datagrams), SLO_MS
# (2000: generous, so saturation measures capacity rather than shedding),
# LOAD_FRACTION (0.5), IF_CPU (1),
# BUSY_POLL (0; 1 gives both DPDK processes --busy-poll), PROFILE (release).
# Needs root, iproute2, tcpdump (without it: no per-request batch sizes or
# overheads), 2 MiB hugepages and `make build models`.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# The harness's shared Python (bench/stats.py: the one percentile).
export KP_BENCH_DIR="$repo/bench"
bin="$repo/target/${PROFILE:-release}"
py="$repo/.venv/bin/python"
model=${MODEL:-squeezenet}
duration=${DURATION:-20}
long_duration=${LONG_DURATION:-120}
warmup=${WARMUP:-5}
engine_seconds=${ENGINE_SECONDS:-4}
max_batch=${MAX_BATCH:-8}
concurrency=${CONCURRENCY:-$((4 * max_batch))}
slo_ms=${SLO_MS:-2000}
load_fraction=${LOAD_FRACTION:-0.5}
af_frames=${AF_PACKET_FRAMES:-8192}
ifm_cpu=0
if_cpu=${IF_CPU:-1}
client_cpu=0
threads=1
busy=()
[[ "${BUSY_POLL:-0}" == 1 ]] && busy=(--busy-poll)

die() { printf 'bench-if: %s\n' "$*" >&2; exit 1; }
((EUID == 0)) || die "must run as root (namespaces, DPDK)"
config="$repo/models/$model/config.toml"
[[ -f "$config" ]] || die "no $config: run 'make models'"
for b in kp-engine-bench if-manager kp-if kp-client; do
  [[ -x "$bin/$b" ]] || die "no $bin/$b: run 'make build'"
done
have_tcpdump=1
command -v tcpdump >/dev/null || { have_tcpdump=0; echo "bench-if: no tcpdump: per-request batch sizes and overheads are skipped" >&2; }
if_id=$(sed -n 's/^if_id *= *\([0-9]*\).*/\1/p' "$config")
[[ -n "$if_id" ]] || die "no if_id in $config"

out="$repo/target/bench/if/$model"
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
  "$py" - "$1" "${ifm_pid:-0}" "${kpif_pid:-0}" >>"$out/machine.jsonl" <<'PY'
import json, os, sys, time
label, ifm, kpif = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
cpus = {}
for l in open("/proc/stat"):
    if l.startswith("cpu"):
        f = l.split()
        v = list(map(int, f[1:]))
        # user nice system idle iowait irq softirq steal (ticks)
        cpus[f[0]] = {"busy": v[0] + v[1] + v[2] + v[5] + v[6], "idle": v[3] + v[4], "steal": v[7],
                      "user": v[0] + v[1], "system": v[2], "softirq": v[5] + v[6]}
def threads(pid):
    if pid <= 0 or not os.path.exists(f"/proc/{pid}"):
        return None
    ts = {}
    for tid in sorted(os.listdir(f"/proc/{pid}/task"), key=int):
        try:
            s = open(f"/proc/{pid}/task/{tid}/stat").read()
            comm = s[s.index("(") + 1:s.rindex(")")]
            f = s[s.rindex(")") + 2:].split()
            allowed = [l.split(":")[1].strip() for l in open(f"/proc/{pid}/task/{tid}/status")
                       if l.startswith("Cpus_allowed_list")][0]
            ns = int(open(f"/proc/{pid}/task/{tid}/schedstat").read().split()[0])
            ts[tid] = {"comm": comm, "ns": ns, "cpus": allowed, "main": int(tid) == pid}
        except (OSError, ValueError, IndexError):
            pass
    return ts
print(json.dumps({"label": label, "t": time.monotonic(), "loadavg": open("/proc/loadavg").read().split()[:3],
                  "cpus": cpus, "if_manager": threads(ifm), "kp_if": threads(kpif)}))
PY
}

# memory LABEL PID PROC: /proc/PID/status, hugetlb mappings from smaps and
# the machine's free hugepages, as one JSON line of memory.jsonl.
memory() {
  "$py" - "$@" >>"$out/memory.jsonl" <<'PY'
import json, sys
label, pid, proc = sys.argv[1], int(sys.argv[2]), sys.argv[3]
st = {}
for l in open(f"/proc/{pid}/status"):
    k, _, v = l.partition(":")
    if k in ("VmRSS", "RssAnon", "RssFile", "RssShmem", "VmHWM", "VmSize", "HugetlbPages"):
        st[k + "_kB"] = int(v.split()[0])
    elif k == "Threads":
        st[k] = int(v)
maps, cur = {}, None
for l in open(f"/proc/{pid}/smaps"):
    f = l.split()
    if len(f) >= 5 and "-" in f[0] and not f[0].endswith(":"):
        cur = f[5] if len(f) >= 6 else "[anon]"
        continue
    if f[0] in ("Shared_Hugetlb:", "Private_Hugetlb:") and cur is not None:
        m = maps.setdefault(cur, {"shared_kB": 0, "private_kB": 0})
        m["shared_kB" if f[0] == "Shared_Hugetlb:" else "private_kB"] += int(f[1])
mi = {l.split(":")[0]: int(l.split()[1]) for l in open("/proc/meminfo") if l.startswith("HugePages_")}
hp = {k: v for k, v in maps.items() if v["shared_kB"] or v["private_kB"] or k.startswith("/dev/hugepages")}
print(json.dumps({"label": label, "proc": proc, "pid": pid, "status": st,
                  "hugetlb_kB": sum(v["shared_kB"] + v["private_kB"] for v in hp.values()),
                  "hugetlb_maps": hp, "hugepages_free": mi.get("HugePages_Free"),
                  "hugepages_total": mi.get("HugePages_Total")}))
PY
}

# capture PHASE: two tcpdumps on CPU 0, headers only: the platform's
# answers on the client's interface (answers-PHASE.pcap), and the first and
# last fragment of every request as they reach the platform's interface
# (frags-PHASE.pcap: the span in which a request's fragments arrive).
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
    ip netns exec "$ns" taskset -c "$client_cpu" tcpdump -i "$dev" -n -s 96 -U \
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

# client PHASE ARGS...: kp-client from the client namespace on CPU 0.
# Its CPU time (getrusage of the child) goes to client-PHASE.rusage.json.
client() {
  local phase=$1; shift
  "$py" - "$out/client-$phase" ip netns exec "$CLIENT_NS" taskset -c "$client_cpu" "$bin/kp-client" \
    --dst "$PLATFORM_IP:9000" --if-id "$if_id" --input synthetic --timeout 5s --json "$@" <<'PY' ||
import json, resource, subprocess, sys, time
base = sys.argv[1]
t = time.monotonic()
with open(base + ".json", "w") as o, open(base + ".log", "w") as e:
    rc = subprocess.run(sys.argv[2:], stdout=o, stderr=e, stdin=subprocess.DEVNULL).returncode
ru = resource.getrusage(resource.RUSAGE_CHILDREN)
json.dump({"user_s": ru.ru_utime, "sys_s": ru.ru_stime, "wall_s": time.monotonic() - t}, open(base + ".rusage.json", "w"))
sys.exit(rc)
PY
    die "kp-client ($phase) failed: $(cat "$out/client-$phase.log")"
}

engine_bench() {
  taskset -c "$if_cpu" "$bin/kp-engine-bench" --model "$config" --threads "$threads" \
    --max-batch "$max_batch" --batches "$(seq -s, 1 "$max_batch")" --seconds "$engine_seconds" \
    >"$out/engine-$1.jsonl" 2>"$out/engine-$1.log" || die "kp-engine-bench failed: $(cat "$out/engine-$1.log")"
}

"$py" - "$out/meta.json" <<PY
import json, os, platform, subprocess, sys
cpu = [l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")]
json.dump({"model": "$model", "if_id": $if_id, "duration_s": $duration, "long_duration_s": $long_duration,
           "warmup_s": $warmup, "engine_seconds": $engine_seconds, "max_batch": $max_batch,
           "concurrency": $concurrency, "slo_ms": $slo_ms, "load_fraction": $load_fraction,
           "threads": $threads, "cpus": {"if_manager": $ifm_cpu, "kp_if": $if_cpu, "client": $client_cpu},
           "busy_poll": "${BUSY_POLL:-0}" == "1", "tcpdump": $have_tcpdump == 1,
           "nproc": os.cpu_count(), "cpu": cpu[0] if cpu else "", "kernel": platform.release(),
           "git": subprocess.run(["git", "-C", "$repo", "rev-parse", "--short", "HEAD"],
                                 capture_output=True, text=True).stdout.strip(),
           "loadavg_at_start": open("/proc/loadavg").read().split()[:3]}, open(sys.argv[1], "w"), indent=1)
PY

echo "bench-if: $model: load average $(cut -d' ' -f1-3 /proc/loadavg); results in $out" >&2
echo "bench-if: [1/6] engine alone on CPU $if_cpu, batches 1..$max_batch, ${engine_seconds}s each" >&2
machine engine-before-start
engine_bench before
machine engine-before-end

echo "bench-if: [2/6] platform up, memory at rest" >&2
eval "$("$repo/scripts/netns.sh" up "$net")"
ctl="ipc://$out/ifm.sock"
memory_free_before=$(awk '/HugePages_Free/ {print $2}' /proc/meminfo)
ip netns exec "$PLATFORM_NS" "$bin/if-manager" "${busy[@]}" --control "$ctl" --ip "$PLATFORM_IP" \
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
ip netns exec "$PLATFORM_NS" "$bin/kp-if" "${busy[@]}" "${cores[@]}" --model "$config" --control "$ctl" \
  --slo-ms "$slo_ms" --threads "$threads" --max-batch "$max_batch" --stats-json "$out/kp-if.json" -- \
  --lcores "1@$if_cpu" --proc-type secondary --file-prefix "$prefix" --no-pci --no-telemetry \
  --log-level lib.eal:error >/dev/null 2>"$out/kp-if.log" &
kpif_pid=$!; pids+=("$kpif_pid")
wait_for "$out/kp-if.log" "kp-if: ready" "$kpif_pid" kp-if
sleep 2
memory_free_if=$(awk '/HugePages_Free/ {print $2}' /proc/meminfo)
echo "{\"hugepages_free\": {\"before\": $memory_free_before, \"if_manager_up\": $memory_free_ifm, \"kp_if_up\": $memory_free_if}}" \
  >"$out/hugepages.json"
memory rest "$kpif_pid" kp-if
memory rest "$ifm_pid" if-manager

# phase PHASE ARGS...: capture, CPU snapshots and kp-client around one load.
phase() {
  local name=$1; shift
  capture_start "$name"
  machine "$name-start"
  client "$name" "$@"
  machine "$name-end"
  capture_stop "$name"
}

echo "bench-if: [3/6] one request at a time (closed loop, 1 outstanding) for ${duration}s" >&2
client warmup1 --concurrency 1 --duration 2s
phase single --concurrency 1 --duration "${duration}s"

echo "bench-if: [4/6] saturation: closed loop, $concurrency outstanding, ${warmup}s warm-up + ${duration}s" >&2
client warmup --concurrency "$concurrency" --duration "${warmup}s"
phase sat --concurrency "$concurrency" --duration "${duration}s"
memory after-saturation "$kpif_pid" kp-if
sat_rate=$("$py" -c 'import json,sys; r=json.load(open(sys.argv[1])); print(r["status"]["ok"]/r["answer_span_s"])' "$out/client-sat.json")
rate=$("$py" -c "print(round($sat_rate * $load_fraction, 1))")
"$py" -c "import sys; sys.exit(0 if $rate >= 0.5 else 1)" || die "saturation served nothing (OK/s $sat_rate): see $out/client-sat.json"

echo "bench-if: [5/6] half load: open loop $rate req/s (Poisson) for ${duration}s" >&2
phase half --rate "$rate" --duration "${duration}s"
memory after-half "$kpif_pid" kp-if

echo "bench-if: [6/6] long run: $rate req/s for ${long_duration}s" >&2
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

"$py" - "$out" <<'PY'
# Analysis: everything the phases wrote -> summary.json, CSVs, summary.md.
import csv, json, math, os, statistics, struct, sys
out = sys.argv[1]
J = lambda n: json.load(open(f"{out}/{n}"))
JL = lambda n: [json.loads(l) for l in open(f"{out}/{n}") if l.strip()]
meta = J("meta.json")
hz = os.sysconf("SC_CLK_TCK")

sys.path.insert(0, os.environ["KP_BENCH_DIR"])
from stats import percentile as pct  # the one percentile: nearest rank

# --- engine alone -------------------------------------------------------
eng = {}
for run in ("before", "after"):
    for r in JL(f"engine-{run}.jsonl"):
        eng.setdefault(r["batch"], {})[run] = r
# The reference cost of a batch of n: the mean of the two runs' medians.
ref_ms = {n: statistics.mean(v[k]["latency_ms"]["median"] for k in v) for n, v in eng.items()}
with open(f"{out}/engine.csv", "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["run", "batch", "iterations", "median_ms", "p90_ms", "p99_ms", "images_per_s_median", "images_per_s_total"])
    for n in sorted(eng):
        for run, r in sorted(eng[n].items()):
            L = r["latency_ms"]
            w.writerow([run, n, r["iterations"], L["median"], L["p90"], L["p99"], r["images_per_s_median"], r["images_per_s_total"]])

# --- captures -------------------------------------------------------------
def udp_payloads(path):
    """(capture time ns, UDP payload) of every IPv4/UDP frame of a pcap."""
    if not os.path.exists(path):
        return
    data = open(path, "rb").read()
    magic = struct.unpack("<I", data[:4])[0]
    endian, nano = ("<", magic == 0xA1B23C4D) if magic in (0xA1B2C3D4, 0xA1B23C4D) else (">", magic == 0x4D3CB2A1)
    pos = 24
    while pos + 16 <= len(data):
        sec, frac, incl, _ = struct.unpack(endian + "IIII", data[pos:pos + 16])
        pkt = data[pos + 16:pos + 16 + incl]
        pos += 16 + incl
        if len(pkt) < 14 + 20 + 8 + 32 or pkt[12:14] != b"\x08\x00":
            continue
        p = pkt[14 + (pkt[14] & 15) * 4 + 8:]
        if p[:4] == b"KNPT":
            yield sec * 10**9 + (frac if nano else frac * 1000), p

def spans(phase):
    """request_id -> µs from its first to its last fragment at the platform's
    interface (the reassembly span the client's sending imposes)."""
    first, last = {}, {}
    for t, p in udp_payloads(f"{out}/frags-{phase}.pcap"):
        _, _, _, _, req, _, idx, cnt = struct.unpack(">IBBHQIHH", p[:24])
        if idx == 0:
            first[req] = t
        if idx + 1 == cnt:
            last[req] = t
    return {r: (last[r] - first[r]) / 1000 for r in first if r in last and last[r] >= first[r]}

def answers(phase):
    """Every answer of PHASE from its pcap: status, batch_size, latency_us,
    and the wire RTT (capture time - the send_ts_ns the client stamped just
    before its first fragment, both CLOCK_REALTIME on this machine)."""
    rows = []
    span = spans(phase)
    for t_ns, p in udp_payloads(f"{out}/answers-{phase}.pcap"):
        if len(p) < 36:
            continue
        _, _, _, _, req, send_ts, status, _, batch, lat = struct.unpack(">IBBHQQIHHI", p[:36])
        rows.append({"request_id": req, "status": status, "batch_size": batch, "latency_us": lat,
                     "rtt_wire_us": round((t_ns - send_ts) / 1000, 1), "t_ns": t_ns,
                     "frag_span_us": span.get(req)})
    rows.sort(key=lambda r: r["t_ns"])
    # Batches: the answers of one batch leave together, one after the other.
    # A request "found the engine busy" if the previous batch's answers left
    # after its first fragment reached the IF (capture time - latency_us);
    # both times carry the same answer-path delay, which cancels.
    ok = [r for r in rows if r["status"] == 0 and r["batch_size"] > 0]
    prev_done, cur = None, None
    for r in ok:
        if cur and r["batch_size"] == cur["n"] and cur["left"] > 0 and r["t_ns"] - cur["t0"] < 2_000_000:
            cur["left"] -= 1
        else:
            if cur:
                prev_done = cur["t0"]
            cur = {"n": r["batch_size"], "t0": r["t_ns"], "left": r["batch_size"] - 1}
        arrival = r["t_ns"] - 1000 * r["latency_us"]
        r["engine_busy_at_arrival_us"] = None if prev_done is None else round(max(0, prev_done - arrival) / 1000, 1)
    with open(f"{out}/answers-{phase}.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["request_id", "status", "batch_size", "latency_us", "rtt_wire_us", "t_ns", "frag_span_us", "engine_busy_at_arrival_us"])
        w.writeheader()
        w.writerows(rows)
    return ok

# --- CPU use per phase --------------------------------------------------
mach = {m["label"]: m for m in JL("machine.jsonl")}
def cpu(phase):
    a, b = mach[f"{phase}-start"], mach[f"{phase}-end"]
    secs = b["t"] - a["t"]
    res = {"seconds": round(secs, 2), "loadavg_end": b["loadavg"]}
    busy_s = 0.0
    for c in ("cpu0", "cpu1"):
        d = {k: (b["cpus"][c][k] - a["cpus"][c][k]) / hz for k in ("busy", "user", "system", "softirq", "steal")}
        busy_s += d["busy"]
        res[c] = {k: round(100 * v / secs, 1) for k, v in d.items()}
    ours = 0.0
    for proc in ("kp_if", "if_manager"):
        ta, tb = a.get(proc) or {}, b.get(proc) or {}
        th = {}
        for tid, t in tb.items():
            d = (t["ns"] - ta.get(tid, {"ns": 0})["ns"]) / 1e9
            ours += d
            if d >= 0.001 * secs:
                th[t["comm"] + (" main" if t["main"] else f" {tid}")] = round(100 * d / secs, 1)
        res[f"{proc}_threads_pct"] = th
    ru = J(f"client-{phase}.rusage.json")
    res["kp_client_pct"] = round(100 * (ru["user_s"] + ru["sys_s"]) / secs, 1)
    ours += ru["user_s"] + ru["sys_s"]
    try:
        td = int(open(f"{out}/tcpdump-{phase}.ns").read()) / 1e9
    except (OSError, ValueError):
        td = 0.0
    res["tcpdump_pct"] = round(100 * td / secs, 1)
    ours += td
    # Busy time of both CPUs not spent in our processes' threads: other
    # users' work, plus kernel work not charged to a task (e.g. softirqs).
    res["others_pct"] = round(100 * max(0.0, busy_s - ours) / secs, 1)
    return res

def q3(v):
    return {"p50": pct(v, .5), "p90": pct(v, .9), "p99": pct(v, .99), "n": len(v)}

def phase_stats(phase):
    c = J(f"client-{phase}.json")
    rows = answers(phase)
    res = {"client": c, "ok_per_s": c["status"]["ok"] / c["answer_span_s"] if c["answer_span_s"] else 0.0,
           "statuses": {k: v for k, v in c["status"].items() if v}, "unanswered": c["unanswered"], "cpu": cpu(phase)}
    rows = [r for r in rows if r["batch_size"] in ref_ms]
    if not rows:
        return res
    mix = {}
    for r in rows:
        mix[r["batch_size"]] = mix.get(r["batch_size"], 0) + 1
    over = [r["latency_us"] - 1000 * ref_ms[r["batch_size"]] for r in rows]
    idle = [r["latency_us"] - 1000 * ref_ms[r["batch_size"]] for r in rows if r["engine_busy_at_arrival_us"] == 0]
    res.update({
        "answers_captured": len(rows),
        "batch_mix_requests": dict(sorted(mix.items())),
        "mean_batch": statistics.mean(r["batch_size"] for r in rows),
        "platform_us": q3([r["latency_us"] for r in rows]),
        "inference_us": q3([1000 * ref_ms[r["batch_size"]] for r in rows]),
        "overhead_us": q3(over),
        "overhead_engine_idle_us": q3(idle),
        "found_engine_busy_fraction": sum(1 for r in rows if (r["engine_busy_at_arrival_us"] or 0) > 0) / len(rows),
        "outside_if_us": q3([r["rtt_wire_us"] - r["latency_us"] for r in rows]),
        # Of the overhead, the time the request's own fragments were still
        # arriving, and what is left after its last fragment (both from
        # requests whose first and last fragments were captured).
        "frag_span_us": q3([r["frag_span_us"] for r in rows if r["frag_span_us"] is not None]),
        "overhead_after_last_fragment_us": q3([r["latency_us"] - 1000 * ref_ms[r["batch_size"]] - r["frag_span_us"]
                                               for r in rows if r["frag_span_us"] is not None]),
        "overhead_after_last_fragment_engine_idle_us": q3([r["latency_us"] - 1000 * ref_ms[r["batch_size"]] - r["frag_span_us"]
                                               for r in rows if r["frag_span_us"] is not None and r["engine_busy_at_arrival_us"] == 0]),
        "rtt_wire_us": q3([r["rtt_wire_us"] for r in rows]),
    })
    return res

phases = {p: phase_stats(p) for p in ("single", "sat", "half", "long")}
sat = phases["sat"]
if "batch_mix_requests" in sat:
    mix = sat["batch_mix_requests"]
    engine_s = sum(k / n * ref_ms[n] / 1000 for n, k in mix.items())
    sat["engine_images_per_s_same_mix"] = sum(mix.values()) / engine_s
    # The share of the phase the engine alone would need for those batches.
    sat["engine_busy_fraction"] = engine_s / sum(mix.values()) * sat["ok_per_s"]
else:
    sat["engine_images_per_s_same_mix"] = eng[1]["before"]["images_per_s_median"]
sat["ratio_e2e_to_engine"] = sat["ok_per_s"] / sat["engine_images_per_s_same_mix"]
sat["ratio_e2e_to_engine_best"] = sat["ok_per_s"] / max(1000 * n / ms for n, ms in ref_ms.items())
final = J("kp-if.json")
fit = final.get("batching") or {}
sat["if_fit_ms"] = {n: round((fit.get("a_ns", 0) + fit.get("b_ns", 0) * n) / 1e6, 3) for n in (1, 2, 4, 8)}

# --- memory -------------------------------------------------------------
mem = JL("memory.jsonl")
kp = {m["label"]: m for m in mem if m["proc"] == "kp-if"}
ifm = {m["label"]: m for m in mem if m["proc"] == "if-manager"}
keys = ["VmRSS_kB", "RssAnon_kB", "RssFile_kB", "RssShmem_kB", "VmHWM_kB", "HugetlbPages_kB"]
with open(f"{out}/memory.csv", "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["proc", "label"] + keys + ["smaps_hugetlb_kB", "hugepages_free"])
    for m in mem:
        w.writerow([m["proc"], m["label"]] + [m["status"].get(k) for k in keys] + [m["hugetlb_kB"], m["hugepages_free"]])
hp = J("hugepages.json")["hugepages_free"]
growth = {k: kp["after-long"]["status"][k] - kp["rest"]["status"][k] for k in kp["rest"]["status"]}
growth["smaps_hugetlb_kB"] = kp["after-long"]["hugetlb_kB"] - kp["rest"]["hugetlb_kB"]
def groups(maps):
    """hugetlbfs files by name, a trailing number as N: (count, kB)."""
    g = {}
    for p, v in maps.items():
        key = os.path.basename(p).rstrip("0123456789") + ("N" if p[-1:].isdigit() else "")
        n, kb = g.get(key, (0, 0))
        g[key] = (n + 1, kb + v["shared_kB"] + v["private_kB"])
    return g

summary = {"meta": meta, "engine": {str(n): v for n, v in sorted(eng.items())}, "engine_ref_ms": ref_ms,
           "phases": phases,
           "memory": {"kp_if": kp, "if_manager": ifm, "hugepages_free": hp, "kp_if_growth_kB": growth,
                      "input_pool": final.get("pool")},
           "kp_if_final": final, "if_manager_final": J("if-manager.json")}
json.dump(summary, open(f"{out}/summary.json", "w"), indent=1, default=str)

# --- markdown -----------------------------------------------------------
ms = lambda us: "-" if us is None else f"{us / 1000:.2f}"
pp = lambda d: "-" if not d else f"{ms(d['p50'])} / {ms(d['p99'])}"
L = [f"### {meta['model']}: engine alone vs end to end\n",
     f"{meta['cpu']}, {meta['nproc']} CPUs, git {meta['git']}; load average at start {' '.join(meta['loadavg_at_start'])}; "
     f"if-manager on CPU {meta['cpus']['if_manager']}, kp-if on CPU {meta['cpus']['kp_if']} ({meta['threads']} intra-op thread, "
     f"max batch {meta['max_batch']}, SLO {meta['slo_ms']} ms), kp-client + tcpdump on CPU {meta['cpus']['client']}.\n",
     "| batch | engine median ms (before / after) | p99 ms | images/s (batch / median) |", "|---|---|---|---|"]
for n in sorted(eng):
    b, a = eng[n]["before"], eng[n]["after"]
    L.append(f"| {n} | {b['latency_ms']['median']:.2f} / {a['latency_ms']['median']:.2f} | {b['latency_ms']['p99']:.2f} / {a['latency_ms']['p99']:.2f} | {b['images_per_s_median']:.1f} / {a['images_per_s_median']:.1f} |")
c = sat["cpu"]
L += ["", "| saturation (closed loop) | value |", "|---|---|",
      f"| concurrency, duration | {meta['concurrency']}, {meta['duration_s']} s |",
      f"| end to end, OK answers/s | **{sat['ok_per_s']:.1f}** |",
      f"| batch sizes used (requests per size) | {sat.get('batch_mix_requests', '-')} (mean {sat.get('mean_batch', 0):.2f}) |",
      f"| engine alone at that batch mix, images/s | {sat['engine_images_per_s_same_mix']:.1f} |",
      f"| **ratio end to end / engine** (same batch mix) | **{sat['ratio_e2e_to_engine']:.3f}** |",
      f"| ratio end to end / engine's best batch | {sat['ratio_e2e_to_engine_best']:.3f} |",
      f"| engine time those batches need, share of the run | {sat.get('engine_busy_fraction', 0):.3f} |",
      f"| kp-if's own cost fit a + b·n at the end, ms (n = 1, 2, 4, 8) | {list(sat['if_fit_ms'].values())} |",
      f"| statuses | {sat['statuses']} |",
      f"| CPU0 / CPU1 busy % (user, sys, softirq) | {c['cpu0']['busy']} ({c['cpu0']['user']}, {c['cpu0']['system']}, {c['cpu0']['softirq']}) / {c['cpu1']['busy']} ({c['cpu1']['user']}, {c['cpu1']['system']}, {c['cpu1']['softirq']}) |",
      f"| kp-if threads, % of a CPU | {c['kp_if_threads_pct']} |",
      f"| if-manager / kp-client / tcpdump / everything else, % of a CPU | {sum(c['if_manager_threads_pct'].values()):.1f} / {c['kp_client_pct']} / {c['tcpdump_pct']} / {c['others_pct']} |",
      "", f"| latency | 1 outstanding ({meta['duration_s']} s) | {meta['load_fraction']:.0%} load ({meta['duration_s']} s) | {meta['load_fraction']:.0%} load ({meta['long_duration_s']} s) |",
      "|---|---|---|---|"]
P = [phases["single"], phases["half"], phases["long"]]
def row(name, fn):
    L.append(f"| {name} | " + " | ".join(fn(p) for p in P) + " |")
row("offered / OK answers per s", lambda p: f"{p['client']['rate'] or 0:.1f} / {p['ok_per_s']:.1f}" if p["client"]["rate"] else f"closed / {p['ok_per_s']:.1f}")
row("client RTT p50 / p99 ms", lambda p: pp(p["client"]["rtt_us"]))
row("platform latency (answers' latency_us) p50 / p99 ms", lambda p: pp(p["client"]["platform_latency_us"]))
row("inference (engine median at the request's batch size) p50 / p99 ms", lambda p: pp(p.get("inference_us")))
row("**platform overhead = latency_us − inference** p50 / p99 ms", lambda p: f"**{pp(p.get('overhead_us'))}**")
row("share of requests that found the engine busy", lambda p: f"{p.get('found_engine_busy_fraction', 0):.2f}")
row("overhead of those that found it idle p50 / p99 ms", lambda p: pp(p.get("overhead_engine_idle_us")))
row("fragments arriving (first to last at the platform's interface) p50 / p99 ms", lambda p: pp(p.get("frag_span_us")))
row("overhead after the last fragment, engine idle at arrival, p50 / p99 ms", lambda p: pp(p.get("overhead_after_last_fragment_engine_idle_us")))
row("outside the IF (wire RTT − latency_us) p50 / p99 ms", lambda p: pp(p.get("outside_if_us")))
row("batch sizes (requests per size)", lambda p: str(p.get("batch_mix_requests", "-")))
row("statuses / unanswered", lambda p: f"{p['statuses']} / {p['unanswered']}")
row("CPU0 / CPU1 busy %", lambda p: f"{p['cpu']['cpu0']['busy']} / {p['cpu']['cpu1']['busy']}")
row("kp-if threads, % of a CPU", lambda p: str(p["cpu"]["kp_if_threads_pct"]))
row("if-manager / kp-client / everything else, % of a CPU", lambda p: f"{sum(p['cpu']['if_manager_threads_pct'].values()):.1f} / {p['cpu']['kp_client_pct']} / {p['cpu']['others_pct']}")
row("load average at the end", lambda p: " ".join(p["cpu"]["loadavg_end"]))
labels = ["rest", "after-saturation", "after-half", "after-long"]
L += ["", "| kp-if memory, MiB | at rest | after saturation | after half load | after long run | growth (long − rest) |",
      "|---|---|---|---|---|---|"]
for k in keys:
    L.append(f"| {k[:-3]} | " + " | ".join(f"{kp[l]['status'][k] / 1024:.1f}" for l in labels) + f" | {growth[k] / 1024:+.1f} |")
L.append("| hugetlb mapped (smaps Shared+Private_Hugetlb) | " + " | ".join(f"{kp[l]['hugetlb_kB'] / 1024:.1f}" for l in labels) + f" | {growth['smaps_hugetlb_kB'] / 1024:+.1f} |")
L.append("| free 2 MiB hugepages on the machine | " + " | ".join(str(kp[l]["hugepages_free"]) for l in labels) + " | |")
pool = final.get("pool") or {}
r = ifm.get("rest")
L += ["", f"Hugepages: {hp['before']} free before the platform, {hp['if_manager_up']} with the if-manager up, {hp['kp_if_up']} with kp-if up: "
      f"kp-if added {2 * (hp['if_manager_up'] - hp['kp_if_up'])} MiB (its input pool reserves {pool.get('hugepage_bytes', 0) / 2**20:.1f} MiB: "
      f"{pool.get('slots')} slots of {pool.get('slot_bytes', 0) / 2**10:.0f} KiB). kp-if maps at rest: "
      + ", ".join(f"{n} x {g} ({kb / 1024:.0f} MiB)" for g, (n, kb) in groups(kp["rest"]["hugetlb_maps"]).items())
      + (f"; the if-manager at rest: RSS {r['status']['VmRSS_kB'] / 1024:.1f} MiB, hugetlb {r['hugetlb_kB'] / 1024:.0f} MiB." if r else ".")]
md = "\n".join(L) + "\n"
open(f"{out}/summary.md", "w").write(md)
print(md)
PY
