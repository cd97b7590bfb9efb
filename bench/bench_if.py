#!/usr/bin/env python3
"""The Python of scripts/bench-if.sh (one inference function: the engine
alone vs end to end, the platform's latency, the IF's memory): the
snapshots the script takes while the platform runs, and the analysis of
everything it wrote into its results folder. The script keeps the
processes (DPDK, namespaces, tcpdump, kp-client); it calls

    bench_if.py meta FILE --model M ...     the run's settings and machine
    bench_if.py machine LABEL IFM_PID IF_PID  a JSON line of machine.jsonl
    bench_if.py memory LABEL PID PROC        a JSON line of memory.jsonl
    bench_if.py client BASE CMD...           CMD (kp-client) -> BASE.json,
                                             BASE.log, BASE.rusage.json
    bench_if.py ok-rate CLIENT.json          OK answers per second
    bench_if.py offered-rate OK_RATE FRACTION  the half-load rate (fails
                                             below 0.5 req/s)
    bench_if.py analyse OUT                  engine.csv, answers-*.csv,
                                             memory.csv, summary.json,
                                             summary.md (also printed)

How each number is computed: docs/PERFORMANCE.md, "Inference function:
engine alone vs end to end". Percentiles are bench/stats.py's (nearest
rank). Standard library only; the functions below the readers are pure,
tested in bench/test_bench_if.py.
"""

from __future__ import annotations

import argparse
import bisect
import csv
import itertools
import json
import math
import os
import platform
import resource
import statistics
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
import host  # noqa: E402
from stats import percentile as pct  # noqa: E402  (the one percentile: nearest rank)

PHASES = ("single", "sat", "low", "half", "long")
# Phases a run may leave out (LOW_LOAD_FRACTION=0, or runs before it).
OPTIONAL_PHASES = ("low",)
MEMORY_KEYS = ["VmRSS_kB", "RssAnon_kB", "RssFile_kB", "RssShmem_kB", "VmHWM_kB", "HugetlbPages_kB"]
MEMORY_LABELS = ["rest", "after-saturation", "after-half", "after-long"]
# Answers of one batch leave one after the other, well within this.
BATCH_WINDOW_NS = 2_000_000


# --- snapshots while the platform runs (/proc) ---------------------------

def cpu_counters(proc_stat: str) -> dict:
    """Per-CPU busy/idle/steal/user/system/softirq ticks of /proc/stat."""
    cpus = {}
    for l in proc_stat.splitlines(True):
        if l.startswith("cpu"):
            f = l.split()
            v = list(map(int, f[1:]))
            # user nice system idle iowait irq softirq steal (ticks)
            cpus[f[0]] = {"busy": v[0] + v[1] + v[2] + v[5] + v[6], "idle": v[3] + v[4], "steal": v[7],
                          "user": v[0] + v[1], "system": v[2], "softirq": v[5] + v[6]}
    return cpus


def task_record(stat: str, status: str, schedstat: str, tid: int, pid: int) -> dict:
    """One thread: its name, CPU time (schedstat ns: exact, where the
    tick-sampled utime/stime misattribute threads that sleep and wake
    often) and allowed CPUs, from its /proc/PID/task/TID files."""
    comm = stat[stat.index("(") + 1:stat.rindex(")")]
    allowed = [l.split(":")[1].strip() for l in status.splitlines(True) if l.startswith("Cpus_allowed_list")][0]
    return {"comm": comm, "ns": int(schedstat.split()[0]), "cpus": allowed, "main": tid == pid}


def threads(pid: int) -> Optional[dict]:
    """Every thread of PID by tid; None when there is no such process."""
    if pid <= 0 or not os.path.exists(f"/proc/{pid}"):
        return None
    ts = {}
    for tid in sorted(os.listdir(f"/proc/{pid}/task"), key=int):
        d = f"/proc/{pid}/task/{tid}"
        try:
            ts[tid] = task_record(host.read(f"{d}/stat"), host.read(f"{d}/status"), host.read(f"{d}/schedstat"),
                                  int(tid), pid)
        except (OSError, ValueError, IndexError):
            pass
    return ts


def machine_snapshot(label: str, ifm_pid: int, kpif_pid: int) -> dict:
    """Load average, per-CPU counters and both daemons' threads now."""
    cpus = cpu_counters(host.read("/proc/stat"))
    return {"label": label, "t": time.monotonic(), "loadavg": host.load_average(host.read("/proc/loadavg")),
            "cpus": cpus, "if_manager": threads(ifm_pid), "kp_if": threads(kpif_pid)}


def process_memory(status: str) -> dict:
    """The memory lines of /proc/PID/status (kB) and its thread count."""
    st = {}
    for l in status.splitlines(True):
        k, _, v = l.partition(":")
        if k in ("VmRSS", "RssAnon", "RssFile", "RssShmem", "VmHWM", "VmSize", "HugetlbPages"):
            st[k + "_kB"] = int(v.split()[0])
        elif k == "Threads":
            st[k] = int(v)
    return st


def hugetlb_maps(smaps: str) -> dict:
    """Mapped file (or "[anon]") -> shared/private hugetlb kB, of the
    mappings of /proc/PID/smaps that have some or are on /dev/hugepages."""
    maps, cur = {}, None
    for l in smaps.splitlines(True):
        f = l.split()
        if len(f) >= 5 and "-" in f[0] and not f[0].endswith(":"):
            cur = f[5] if len(f) >= 6 else "[anon]"
            continue
        if f[0] in ("Shared_Hugetlb:", "Private_Hugetlb:") and cur is not None:
            m = maps.setdefault(cur, {"shared_kB": 0, "private_kB": 0})
            m["shared_kB" if f[0] == "Shared_Hugetlb:" else "private_kB"] += int(f[1])
    return {k: v for k, v in maps.items() if v["shared_kB"] or v["private_kB"] or k.startswith("/dev/hugepages")}


def hugepage_counts(meminfo: str) -> dict:
    """The HugePages_* lines of /proc/meminfo."""
    return {l.split(":")[0]: int(l.split()[1]) for l in meminfo.splitlines(True) if l.startswith("HugePages_")}


def memory_snapshot(label: str, pid: int, proc: str) -> dict:
    """PID's memory now and the machine's free hugepages."""
    st = process_memory(host.read(f"/proc/{pid}/status"))
    hp = hugetlb_maps(host.read(f"/proc/{pid}/smaps"))
    mi = hugepage_counts(host.read("/proc/meminfo"))
    return {"label": label, "proc": proc, "pid": pid, "status": st,
            "hugetlb_kB": sum(v["shared_kB"] + v["private_kB"] for v in hp.values()),
            "hugetlb_maps": hp, "hugepages_free": mi.get("HugePages_Free"),
            "hugepages_total": mi.get("HugePages_Total")}


def run_client(base: str, command: list[str]) -> int:
    """COMMAND's stdout to BASE.json, stderr to BASE.log, and the CPU time
    it used (getrusage of the children) to BASE.rusage.json."""
    t = time.monotonic()
    with open(base + ".json", "w") as o, open(base + ".log", "w") as e:
        rc = subprocess.run(command, stdout=o, stderr=e, stdin=subprocess.DEVNULL).returncode
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    with open(base + ".rusage.json", "w") as f:
        json.dump({"user_s": ru.ru_utime, "sys_s": ru.ru_stime, "wall_s": time.monotonic() - t}, f)
    return rc


def meta(a: argparse.Namespace) -> dict:
    """The run's settings (as the script got them) and the machine."""
    return {"model": a.model, "if_id": a.if_id, "duration_s": a.duration_s, "long_duration_s": a.long_duration_s,
            "warmup_s": a.warmup_s, "engine_seconds": a.engine_seconds, "max_batch": a.max_batch,
            "concurrency": a.concurrency, "slo_ms": a.slo_ms, "load_fraction": a.load_fraction,
            "low_load_fraction": a.low_load_fraction,
            "threads": a.threads, "cpus": {"if_manager": a.if_manager_cpu, "kp_if": a.kp_if_cpu,
                     "kp_if_fragment_thread": a.kp_if_cpu if a.kp_rx_cpu is None else a.kp_rx_cpu,
                     "client": a.client_cpu},
            "client_policy": a.client_policy, "busy_poll": a.busy_poll == "1", "tcpdump": a.tcpdump == 1,
            "if_manager_timer_slack_us": int(a.if_manager_timer_slack_us) if a.if_manager_timer_slack_us else None,
            "inference_spin_ms": a.inference_spin_ms, "convert_on": a.convert_on,
            "nproc": os.cpu_count(), "cpu": host.cpu_model(host.read("/proc/cpuinfo")), "kernel": platform.release(),
            "git": host.git_head(a.repo), "loadavg_at_start": host.load_average(host.read("/proc/loadavg")),
            "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def ok_rate(client: dict) -> float:
    """A kp-client report's OK answers per second over its answer span."""
    return client["status"]["ok"] / client["answer_span_s"]


def low_load_seconds(duration_s: float, requests: int, rate: float) -> int:
    """How long the low-load phase runs: DURATION, or longer where that
    many seconds at `rate` would send fewer than `requests` (LOW_REQUESTS),
    so that its p99 is not one of a handful of requests (resnet50's 10%
    load is ~1.3 req/s: 75 requests in 60 s, their p99 their maximum)."""
    return max(math.ceil(duration_s), math.ceil(requests / rate) if rate > 0 else 0)


def offered_rate(ok_per_s: float, fraction: float) -> float:
    """The open-loop rate of the low- and half-load phases, 0.1 req/s
    resolution."""
    return round(ok_per_s * fraction, 1)


# --- analysis: engine alone -------------------------------------------------

def engine_runs(before: list[dict], after: list[dict]) -> dict:
    """batch -> {"before": line, "after": line} of kp-engine-bench's output."""
    eng = {}
    for run, lines in (("before", before), ("after", after)):
        for r in lines:
            eng.setdefault(r["batch"], {})[run] = r
    return eng


def reference_ms(eng: dict) -> dict:
    """The reference cost of a batch of n: the mean of the runs' medians."""
    return {n: statistics.mean(v[k]["latency_ms"]["median"] for k in v) for n, v in eng.items()}


def engine_rows(eng: dict) -> list[list]:
    """engine.csv, header first."""
    rows = [["run", "batch", "iterations", "median_ms", "p90_ms", "p99_ms", "images_per_s_median", "images_per_s_total"]]
    for n in sorted(eng):
        for run, r in sorted(eng[n].items()):
            L = r["latency_ms"]
            rows.append([run, n, r["iterations"], L["median"], L["p90"], L["p99"], r["images_per_s_median"],
                         r["images_per_s_total"]])
    return rows


# --- analysis: captures -------------------------------------------------------

def udp_payloads(data: bytes) -> Iterator[tuple[int, bytes]]:
    """(capture time ns, UDP payload) of every IPv4/UDP frame of a pcap
    (either byte order, µs or ns timestamps) whose payload is kneepoint's."""
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


FRAGMENT_TYPE = 1  # docs/PROTOCOL.md: 1 request fragment, 2 response, 3 error


def fragment_ends(fragments: Iterator[tuple[int, bytes]]) -> tuple[dict, dict]:
    """request_id -> capture time (ns) of its first and of its last
    fragment at the platform's interface; answers in the same capture
    are skipped."""
    first, last = {}, {}
    for t, p in fragments:
        if len(p) < 24 or p[5] != FRAGMENT_TYPE:
            continue
        req, _, idx, cnt = struct.unpack(">QIHH", p[8:24])
        if idx == 0:
            first[req] = t
        if idx + 1 == cnt:
            last[req] = t
    return first, last


def fragment_spans(fragments: Iterator[tuple[int, bytes]]) -> dict:
    """request_id -> µs from its first to its last fragment at the
    platform's interface (the reassembly span the client's sending
    imposes), for requests with both captured."""
    return spans_of(*fragment_ends(fragments))


def spans_of(first: dict, last: dict) -> dict:
    return {r: (last[r] - first[r]) / 1000 for r in first if r in last and last[r] >= first[r]}


def last_fragments(fragments: Iterator[tuple[int, bytes]]) -> dict:
    """request_id -> capture time (ns) of its last fragment at the
    platform's interface."""
    return fragment_ends(fragments)[1]


def trace_records(lines: Iterator[dict]) -> dict:
    """kp-if --trace's records by (request_id, send_ts_ns): the key an
    answer echoes."""
    return {(r["request_id"], r["send_ts_ns"]): r for r in lines}


def answer_rows(answers: Iterator[tuple[int, bytes]], spans: dict, last: Optional[dict] = None,
                trace: Optional[dict] = None, origin_ns: Optional[int] = None) -> list[dict]:
    """Every answer, in capture order: status, batch_size, latency_us, the
    wire RTT (capture time - the send_ts_ns the client stamped just before
    its first fragment, both CLOCK_REALTIME on this machine), its
    request's fragment span and, where captured and traced, the time from
    its last fragment at the platform's interface to its answer at the
    client's (LAST: request_id -> capture ns), its batch's own engine time
    (kp-if's trace), and the IF's two hand-overs around it: from the
    request's completion to its batch's start, and from the batch's end to
    its answer on the TX ring; with ORIGIN_NS (the trace's time 0 on the
    realtime clock, kp-if's clock_realtime_ns), also the way in (last
    fragment at the interface -> request complete in the IF) and out
    (answer on the TX ring -> at the client's interface)."""
    last, trace = last or {}, trace or {}
    rows = []
    for t_ns, p in answers:
        if len(p) < 36:
            continue
        _, _, _, _, req, send_ts, status, _, batch, lat = struct.unpack(">IBBHQQIHHI", p[:36])
        rec = trace.get((req, send_ts))
        rows.append({"request_id": req, "status": status, "batch_size": batch, "latency_us": lat,
                     "rtt_wire_us": round((t_ns - send_ts) / 1000, 1), "t_ns": t_ns,
                     "frag_span_us": spans.get(req),
                     "after_last_wire_us": round((t_ns - last[req]) / 1000, 3)
                     if req in last and t_ns >= last[req] else None,
                     "engine_own_us": None if rec is None else (rec["end_ns"] - rec["start_ns"]) / 1000,
                     # The inference thread's CPU time in that batch (kp-if
                     # records it for engines that compute on that thread).
                     "engine_cpu_us": rec["batch_cpu_ns"] / 1000 if rec and rec.get("batch_cpu_ns") else None,
                     "if_wait_us": None if rec is None else (rec["start_ns"] - rec["complete_ns"]) / 1000,
                     "if_answer_us": None if rec is None else (rec["sent_ns"] - rec["end_ns"]) / 1000,
                     "complete_ns": None if rec is None else rec["complete_ns"],
                     "batch_start_ns": None if rec is None else rec["start_ns"],
                     "batch_end_ns": None if rec is None else rec["end_ns"],
                     "in_path_us": None if rec is None or origin_ns is None or req not in last
                     else (origin_ns + rec["complete_ns"] - last[req]) / 1000,
                     "out_path_us": None if rec is None or origin_ns is None
                     else (t_ns - origin_ns - rec["sent_ns"]) / 1000})
    rows.sort(key=lambda r: r["t_ns"])
    return rows


def mark_engine_busy(rows: list[dict]) -> list[dict]:
    """The OK answers with a batch, each given engine_busy_at_arrival_us.
    The answers of one batch leave together, one after the other. A
    request "found the engine busy" if the previous batch's answers left
    after its first fragment reached the IF (capture time - latency_us);
    both times carry the same answer-path delay, which cancels."""
    ok = [r for r in rows if r["status"] == 0 and r["batch_size"] > 0]
    prev_done, cur = None, None
    for r in ok:
        if cur and r["batch_size"] == cur["n"] and cur["left"] > 0 and r["t_ns"] - cur["t0"] < BATCH_WINDOW_NS:
            cur["left"] -= 1
        else:
            if cur:
                prev_done = cur["t0"]
            cur = {"n": r["batch_size"], "t0": r["t_ns"], "left": r["batch_size"] - 1}
        arrival = r["t_ns"] - 1000 * r["latency_us"]
        r["engine_busy_at_arrival_us"] = None if prev_done is None else round(max(0, prev_done - arrival) / 1000, 1)
    return ok


ANSWER_COLUMNS = ["request_id", "status", "batch_size", "latency_us", "rtt_wire_us", "t_ns", "frag_span_us",
                  "after_last_wire_us", "engine_own_us", "engine_cpu_us", "if_wait_us", "if_answer_us", "in_path_us",
                  "out_path_us", "complete_ns", "batch_start_ns", "batch_end_ns",
                  "engine_busy_at_arrival_us"]


# --- analysis: CPU use and per-phase statistics -------------------------------

def cpu_use(a: dict, b: dict, hz: int, rusage: dict, tcpdump_s: float) -> dict:
    """CPU use between two machine snapshots: both CPUs' busy shares, our
    daemons' threads, kp-client and tcpdump, % of a CPU."""
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
        res[f"{proc}_main_s"] = 0.0
        for tid, t in tb.items():
            d = (t["ns"] - ta.get(tid, {"ns": 0})["ns"]) / 1e9
            ours += d
            if t["main"]:
                res[f"{proc}_main_s"] = d
            if d >= 0.001 * secs:
                th[t["comm"] + (" main" if t["main"] else f" {tid}")] = round(100 * d / secs, 1)
        res[f"{proc}_threads_pct"] = th
    res["kp_client_pct"] = round(100 * (rusage["user_s"] + rusage["sys_s"]) / secs, 1)
    ours += rusage["user_s"] + rusage["sys_s"]
    res["tcpdump_pct"] = round(100 * tcpdump_s / secs, 1)
    ours += tcpdump_s
    # Busy time of both CPUs not spent in our processes' threads: other
    # users' work, plus kernel work not charged to a task (e.g. softirqs).
    res["others_pct"] = round(100 * max(0.0, busy_s - ours) / secs, 1)
    return res


def fragment_thread_cost(phase: dict, fragments_per_request: Optional[float]) -> Optional[float]:
    """µs of CPU kp-if's main thread (its EAL lcore: the fragment thread,
    which dequeues, reassembles, converts and answers) spent per fragment
    of the requests answered in PHASE, wake-ups and idle polls included;
    None when nothing was answered or the fragments per request are unknown."""
    answered = sum(phase["client"]["status"].values())
    if not fragments_per_request or not answered:
        return None
    return 1e6 * phase["cpu"]["kp_if_main_s"] / (answered * fragments_per_request)


def q3(v: list) -> dict:
    return {"p50": pct(v, .5), "p90": pct(v, .9), "p99": pct(v, .99), "n": len(v)}


def phase_stats(client: dict, ok: list[dict], ref_ms: dict, cpu: dict) -> dict:
    """One phase: kp-client's report and, from the captured OK answers at
    batch sizes the engine was measured at, the platform's latency split
    into inference (the engine's median at the request's batch size) and
    overhead."""
    res = {"client": client,
           "ok_per_s": client["status"]["ok"] / client["answer_span_s"] if client["answer_span_s"] else 0.0,
           "statuses": {k: v for k, v in client["status"].items() if v}, "unanswered": client["unanswered"],
           "cpu": cpu}
    rows = [r for r in ok if r["batch_size"] in ref_ms]
    if not rows:
        return res
    mix = {}
    for r in rows:
        mix[r["batch_size"]] = mix.get(r["batch_size"], 0) + 1
    over = [r["latency_us"] - 1000 * ref_ms[r["batch_size"]] for r in rows]
    idle = [r["latency_us"] - 1000 * ref_ms[r["batch_size"]] for r in rows if r["engine_busy_at_arrival_us"] == 0]
    spanned = [r for r in rows if r["frag_span_us"] is not None]
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
        "frag_span_us": q3([r["frag_span_us"] for r in spanned]),
        "overhead_after_last_fragment_us": q3([r["latency_us"] - 1000 * ref_ms[r["batch_size"]] - r["frag_span_us"]
                                               for r in spanned]),
        "overhead_after_last_fragment_engine_idle_us": q3([
            r["latency_us"] - 1000 * ref_ms[r["batch_size"]] - r["frag_span_us"]
            for r in spanned if r["engine_busy_at_arrival_us"] == 0]),
        "rtt_wire_us": q3([r["rtt_wire_us"] for r in rows]),
    })
    # The issue-13 target, with each request's own engine time (kp-if's
    # trace) instead of the engine's median: last fragment in to answer
    # out at the platform's interface, less the engine's time for that
    # request's batch; and where the rest went.
    traced = [r for r in rows if r.get("after_last_wire_us") is not None and r.get("engine_own_us") is not None]
    if traced:
        res.update({
            "engine_own_us": q3([r["engine_own_us"] for r in traced]),
            "after_last_wire_us": q3([r["after_last_wire_us"] for r in traced]),
            "overhead_after_last_own_us": q3([r["after_last_wire_us"] - r["engine_own_us"] for r in traced]),
            "overhead_after_last_own_engine_idle_us": q3([
                r["after_last_wire_us"] - r["engine_own_us"] for r in traced if r["engine_busy_at_arrival_us"] == 0]),
            "if_wait_us": q3([r["if_wait_us"] for r in traced]),
            "if_answer_us": q3([r["if_answer_us"] for r in traced]),
            "outside_if_after_last_us": q3([
                r["after_last_wire_us"] - r["if_wait_us"] - r["engine_own_us"] - r["if_answer_us"] for r in traced]),
        })
        if all(r.get("in_path_us") is not None and r.get("out_path_us") is not None for r in traced):
            res["in_path_us"] = q3([r["in_path_us"] for r in traced])
            res["out_path_us"] = q3([r["out_path_us"] for r in traced])
            res["tail_stages"] = tail_stages(traced, AFTER_LAST_TARGET_US[1])
        res.update(engine_per_image_in_if(traced))
        res.update(engine_vs_batch1_nearby(traced))
    res.update(engine_idle_in_if(rows))
    return res


# Issue 13's targets: end to end / engine alone, and last fragment in ->
# answer out - own engine time, p50 and p99 (µs).
E2E_TARGET = 0.95
AFTER_LAST_TARGET_US = (100.0, 500.0)

# The four legs of a request's way after its last fragment, besides its
# batch's own engine time, in order: (name in the report, its column).
TAIL_STAGES = [("way in", "in_path_us"), ("to its batch", "if_wait_us"), ("to the TX ring", "if_answer_us"),
               ("way out", "out_path_us")]


def tail_stages(traced: list[dict], over_us: float) -> dict:
    """Where the slow requests' time went: of the traced requests that
    found the engine idle (the low-latency target's requests), those whose
    last fragment in -> answer out - own engine time exceeds OVER_US, each
    counted once under the leg of TAIL_STAGES that took it longest. A tail
    that sits in one leg points at that hand-over (a wake-up across CPUs,
    the if-manager's sleep); one spread over all legs at the host."""
    idle = [r for r in traced if r["engine_busy_at_arrival_us"] == 0]
    slow = [r for r in idle if r["after_last_wire_us"] - r["engine_own_us"] > over_us]
    by = {name: 0 for name, _ in TAIL_STAGES}
    for r in slow:
        by[max(TAIL_STAGES, key=lambda s: r[s[1]])[0]] += 1
    return {"over_us": over_us, "n": len(idle), "slow": len(slow), "by_stage": by}


def tail_cell(t: Optional[dict]) -> str:
    """tail_stages for the report: "11 of 864: 6 / 2 / 0 / 3"."""
    if not t:
        return "-"
    return f"{t['slow']} of {t['n']}: " + " / ".join(str(t["by_stage"][name]) for name, _ in TAIL_STAGES)


def engine_idle_in_if(rows: list[dict]) -> dict:
    """Where the engine sat idle between the phase's batches (kp-if's
    trace, its monotonic clock), as fractions of the time from the first
    batch's start to the last one's end: with a request of the next batch
    already complete in the IF (what the batching policy's waits and the
    inference thread's own work between batches cost), and with none yet
    (the requests were still arriving: what the load left it)."""
    batches: dict[tuple[int, int], int] = {}
    for r in rows:
        if r.get("batch_start_ns") is None:
            continue
        key = (r["batch_start_ns"], r["batch_end_ns"])
        batches[key] = min(batches.get(key, r["complete_ns"]), r["complete_ns"])
    if len(batches) < 2:
        return {}
    order = sorted(batches.items())
    queued = empty = 0
    for ((_, prev_end), _), ((start, _), first_complete) in zip(order, order[1:]):
        if start <= prev_end:
            continue
        empty += max(0, min(start, first_complete) - prev_end)
        queued += max(0, start - max(prev_end, first_complete))
    span = order[-1][0][1] - order[0][0][0]
    return {"engine_idle_with_request_complete_fraction": queued / span,
            "engine_idle_with_none_complete_fraction": empty / span}


def engine_per_image_in_if(traced: list[dict]) -> dict:
    """The engine's own time per image inside the IF, by batch size (the
    median over the requests of that size of their batch's time / its
    size, ms), and the batch mix's time per image (those medians weighted
    by the requests of each size) over batch 1's: whether the sizes the
    batching policy chose cost the engine more per image than batches of
    1 would (issue 13, item 1). Both come from batches interleaved in one
    run, so a machine that drifts between runs cancels out; the ratio
    needs batches of 1 among them (the policy's probes run some)."""
    per: dict[int, list[float]] = {}
    cpu: dict[int, list[float]] = {}
    for r in traced:
        per.setdefault(r["batch_size"], []).append(r["engine_own_us"] / r["batch_size"] / 1000)
        if r.get("engine_cpu_us"):
            cpu.setdefault(r["batch_size"], []).append(r["engine_cpu_us"] / r["batch_size"] / 1000)
    if not per:
        return {}
    by_size = {n: statistics.median(v) for n, v in sorted(per.items())}
    res = {"engine_own_ms_per_image_by_size": by_size,
           "traced_requests_by_size": {n: len(v) for n, v in sorted(per.items())}}
    if cpu:
        res["engine_cpu_ms_per_image_by_size"] = {n: statistics.median(v) for n, v in sorted(cpu.items())}
    res.update(engine_after_another_size(traced))
    if 1 in by_size:
        mix = sum(by_size[n] * len(v) for n, v in per.items()) / sum(len(v) for v in per.values())
        res["engine_own_per_image_mix_vs_batch1"] = mix / by_size[1]
    return res


def traced_batches(traced: list[dict]) -> list[tuple]:
    """The phase's batches from its traced requests, each once, in order:
    (start_ns, size, engine_own_us, engine_cpu_us or None)."""
    return sorted({(r["batch_start_ns"], r["batch_size"], r["engine_own_us"], r.get("engine_cpu_us"))
                   for r in traced if r.get("batch_start_ns") is not None and r.get("engine_own_us") is not None})


# Batches of 1 within this much of a batch's start are its reference
# (engine_vs_batch1_nearby), and it needs at least NEARBY_LEAST of them.
NEARBY_WINDOW_NS = 1_000_000_000
NEARBY_LEAST = 5


def engine_vs_batch1_nearby(traced: list[dict], window_ns: int = NEARBY_WINDOW_NS,
                            least: int = NEARBY_LEAST) -> dict:
    """The engine's time for the phase's batches over what batches of 1
    took for the same images at the same moments: each batch against the
    mean time of the batches of 1 that started within `window_ns` of it
    (not itself), each of them run right after another batch of 1 (back to
    back, as batch 1 runs where it is the plan; one after a bigger batch
    costs more, docs/PERFORMANCE-JOURNAL.md, 6 December, second). A
    machine whose speed drifts within a run, or between the runs being
    compared (bench-policy's arms: batch 1 alone took 3.30-3.88 ms across
    one session's runs), moves both sides alike, so the ratio is what the
    batch sizes cost and nothing else; the image-weighted mean of those
    references times the OK answers per second is the share of the phase
    batches of 1 would have needed for the same answers
    (bench/policy_report.py). Batches without `least` references nearby
    are left out (the share of images kept is reported); the references
    need batches of 1 among the phase's (the policy's probes run some)."""
    batches = traced_batches(traced)
    refs = [(start, own) for (start, n, own, _), prev in zip(batches[1:], batches) if n == 1 and prev[1] == 1]
    if not batches or len(refs) < least:
        return {}
    starts = [s for s, _ in refs]
    sums = list(itertools.accumulate((own for _, own in refs), initial=0.0))
    took = would = images = kept = 0.0
    for start, n, own, _ in batches:
        images += n
        lo, hi = bisect.bisect_left(starts, start - window_ns), bisect.bisect_right(starts, start + window_ns)
        total, count = sums[hi] - sums[lo], hi - lo
        i = bisect.bisect_left(starts, start)
        if i < len(starts) and starts[i] == start:  # a reference itself: not its own
            total, count = total - refs[i][1], count - 1
        if count < least:
            continue
        took += own
        would += n * total / count
        kept += n
    if not kept:
        return {}
    return {"engine_own_vs_batch1_nearby": took / would,
            "batch1_ms_per_image_nearby": would / kept / 1000,
            "batch1_nearby_images_share": kept / images}


def engine_after_another_size(traced: list[dict], least: int = 5) -> dict:
    """The engine's time per image in the IF by batch size, split by what
    ran just before: a batch of the same size or of another (median ms per
    image over the batches, each batch once; sizes with fewer than `least`
    batches on either side are left out). An engine whose batch costs more
    right after a batch of another size (an allocator re-planning for the
    new shape, caches filled by the other batch's data) shows it here; the
    batching policy, which measures every size where it runs, then learns
    a size it only probes after others as dearer than it is back to back.
    With the inference thread's CPU time where kp-if recorded it: a gap
    between the two is time the thread was preempted."""
    batches = traced_batches(traced)
    split: dict[int, dict[str, list[tuple[float, float | None]]]] = {}
    for prev, cur in zip(batches, batches[1:]):
        _, n, own, cpu = cur
        side = "same" if prev[1] == n else "other"
        split.setdefault(n, {"same": [], "other": []})[side].append(
            (own / n / 1000, None if cpu is None else cpu / n / 1000))
    out = {}
    for n, sides in sorted(split.items()):
        if min(len(sides["same"]), len(sides["other"])) < least:
            continue
        entry = {}
        for side, v in sides.items():
            entry[side] = statistics.median(w for w, _ in v)
            cpus = [c for _, c in v if c is not None]
            if len(cpus) == len(v):
                entry[side + "_cpu"] = statistics.median(cpus)
            entry[side + "_batches"] = len(v)
        out[n] = entry
    return {"engine_own_ms_per_image_after": out} if out else {}


def add_saturation_ratios(sat: dict, eng: dict, ref_ms: dict, kp_if_final: dict) -> None:
    """Saturation against the engine: the engine's images/s at the batch
    mix kp-if really used (batch 1's before the run when no answers were
    captured), at its best batch, and kp-if's own cost fit at the end."""
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
    fit = kp_if_final.get("batching") or {}
    sat["if_fit_ms"] = {n: round((fit.get("a_ns", 0) + fit.get("b_ns", 0) * n) / 1e6, 3) for n in (1, 2, 4, 8)}


# --- analysis: the host's own latency (cyclictest, oslat) ---------------------

def report_threads(report: dict) -> list[dict]:
    """The per-thread records of an rt-tests `--json` report, in thread
    order."""
    return [t for _, t in sorted(report.get("thread", {}).items(), key=lambda kv: int(kv[0]))]


def host_histograms(report: dict) -> list[tuple[int, dict]]:
    """cyclictest's or oslat's `--json` report -> per thread, in thread
    order, its CPU and its histogram {µs: count}; what fell past the
    histogram's range (cycles not in it) is counted at the thread's
    maximum, where the nearest-rank quantiles below look for it."""
    out = []
    for t in report_threads(report):
        hist = {int(k): int(v) for k, v in t.get("histogram", {}).items() if int(v)}
        beyond = int(t.get("cycles", 0)) - sum(hist.values())
        if beyond > 0 and "max" in t:
            hist[int(t["max"])] = hist.get(int(t["max"]), 0) + beyond
        out.append((int(t.get("cpu", -1)), hist))
    return out


def latency_stats(hist: dict, late_us: float) -> dict:
    """One thread's histogram: p50, p99, p99.9 and the largest lateness
    (µs, stats.percentile's nearest rank), how many wake-ups, and the share
    later than LATE_US."""
    n = sum(hist.values())
    if not n:
        return {"n": 0}
    samples = [k for k, c in hist.items() for _ in range(c)]
    return {"n": n, "max": max(hist), "late_share": sum(c for k, c in hist.items() if k > late_us) / n,
            "p50": pct(samples, .5), "p99": pct(samples, .99), "p999": pct(samples, .999)}


HOST_LATE_US = AFTER_LAST_TARGET_US[1]


def interruptions(report: dict, over_us: float) -> list[dict]:
    """oslat's `--json` report -> per CPU (thread order) the longest
    iteration of its busy loop (µs) and how many took longer than OVER_US,
    in all and per second of its run: how often the host kept a running
    thread from its CPU."""
    out = []
    for t in report_threads(report):
        over = sum(int(c) for k, c in t.get("histogram", {}).items() if int(k) > over_us)
        seconds = float(t.get("duration") or 0)
        out.append({"cpu": int(t.get("cpu", -1)), "max": t.get("max"), "over": over,
                    "per_s": over / seconds if seconds else None})
    return out


def host_summary(reports: dict) -> dict:
    """The reports by (tool, when) for summary.json: cyclictest's
    latency_stats and oslat's interruptions per CPU, under "tool-when"."""
    return {f"{tool}-{when}": [dict(latency_stats(h, HOST_LATE_US), cpu=cpu) for cpu, h in host_histograms(r)]
            if tool == "cyclictest" else interruptions(r, HOST_LATE_US)
            for (tool, when), r in reports.items()}


def command(report: dict, tool: str) -> str:
    """The command line a tool's `--json` report records, without the
    report's own path."""
    return " ".join(a for a in (report.get("cmdline:") or tool).split() if not a.startswith("--json"))


def host_markdown(reports: dict) -> list[str]:
    """The host's own latency for the report, from the tools' `--json`
    reports by (tool, when), when "before" or "after" the platform ran:
    how late a sleeping thread wakes (cyclictest: one thread per CPU
    sleeping on a timer, at the platform's scheduling policy: p99 / p99.9
    / max) and how often a running one is kept from its CPU (oslat: a busy
    loop per CPU; its longest gap and the gaps over HOST_LATE_US per
    second)."""
    def wakeups(r: dict) -> dict:
        out = {}
        for cpu, h in host_histograms(r):
            w = latency_stats(h, HOST_LATE_US)
            if w["n"]:
                out[cpu] = f"{w['p99']} / {w['p999']} / {w['max']} µs"
        return out

    def gaps(r: dict) -> dict:
        return {i["cpu"]: f"{i['max']} µs, {i['per_s']:.2f}/s" for i in interruptions(r, HOST_LATE_US)
                if i["max"] is not None and i["per_s"] is not None}

    parts = []
    for tool, what, cell in (("cyclictest", "a sleeping thread's timer wake-up late by p99 / p99.9 / max", wakeups),
                             ("oslat", f"a running thread's longest interruption, and those over {HOST_LATE_US:.0f} µs"
                              " per second", gaps)):
        runs = [(when, reports.get((tool, when))) for when in ("before", "after")]
        runs = [(when, cell(r), command(r, tool)) for when, r in runs if r is not None]
        if not runs:
            continue
        cpus = sorted({c for _, cells, _ in runs for c in cells})
        if not cpus:
            parts.append(f"{what}: no histogram (`{runs[0][2]}`)")
            continue
        parts.append(f"{what} (`{runs[0][2]}`): " + "; ".join(
            f"CPU {c} " + ", ".join(f"{when} {cells.get(c, '-')}" for when, cells, _ in runs) for c in cpus))
    if not parts:
        return []
    return ["", "The host itself, the platform stopped (Debian's rt-tests): " + "; ".join(parts) + "."]


# --- analysis: memory -----------------------------------------------------------

def memory_rows(mem: list[dict]) -> list[list]:
    """memory.csv, header first: every snapshot of memory.jsonl."""
    rows = [["proc", "label"] + MEMORY_KEYS + ["smaps_hugetlb_kB", "hugepages_free"]]
    for m in mem:
        rows.append([m["proc"], m["label"]] + [m["status"].get(k) for k in MEMORY_KEYS]
                    + [m["hugetlb_kB"], m["hugepages_free"]])
    return rows


def memory_growth(kp: dict) -> dict:
    """kp-if's growth from rest to after the long run, kB."""
    growth = {k: kp["after-long"]["status"][k] - kp["rest"]["status"][k] for k in kp["rest"]["status"]}
    growth["smaps_hugetlb_kB"] = kp["after-long"]["hugetlb_kB"] - kp["rest"]["hugetlb_kB"]
    return growth


def hugepage_groups(maps: dict) -> dict:
    """hugetlbfs files by name, a trailing number as N: (count, kB)."""
    g = {}
    for p, v in maps.items():
        key = os.path.basename(p).rstrip("0123456789") + ("N" if p[-1:].isdigit() else "")
        n, kb = g.get(key, (0, 0))
        g[key] = (n + 1, kb + v["shared_kB"] + v["private_kB"])
    return g


# --- analysis: markdown -----------------------------------------------------------

def ms(us: Optional[float]) -> str:
    return "-" if us is None else f"{us / 1000:.2f}"


def us(v: Optional[float]) -> str:
    return "-" if v is None else f"{v:.2f}"


def p50_p99(d: Optional[dict]) -> str:
    return "-" if not d else f"{ms(d['p50'])} / {ms(d['p99'])}"


def p50_p99_us(d: Optional[dict]) -> str:
    return "-" if not d or d["p50"] is None else f"{d['p50']:.0f} / {d['p99']:.0f}"


# kp-if's report (`images_converted_by`) for each --convert-on the script passes.
CONVERTED_BY = {"network": "fragment thread", "inference": "inference thread"}


def check_converted_by(meta: dict, final: dict) -> None:
    """Stops the report if kp-if says another thread converted the images
    than the one the section's header will name (kp-if's --convert-on auto
    chooses by itself where the script passes nothing). Reports of builds
    before 6 December say nothing, and pass."""
    said, want = final.get("images_converted_by"), CONVERTED_BY.get(meta.get("convert_on", "network"))
    if said is not None and said != want:
        raise SystemExit(f"bench-if: kp-if says its {said} converted the images, the header would say "
                         f"the {want} (--convert-on {meta.get('convert_on')})")


def engine_table(meta: dict, eng: dict) -> list[str]:
    return [f"### {meta['model']}: engine alone vs end to end ({layout(meta)})\n",
            (f"{meta['started']}, " if meta.get("started") else "")  # runs before 30 November have none
            + f"{meta['cpu']}, {meta['nproc']} CPUs, git {meta['git']}; load average at start {' '.join(meta['loadavg_at_start'])}; "
            f"if-manager on CPU {meta['cpus']['if_manager']}, kp-if's inference thread on CPU {meta['cpus']['kp_if']} "
            f"and its fragment thread on CPU {fragment_thread_cpu(meta)} "
            f"({meta['threads']} intra-op thread, "
            f"max batch {meta['max_batch']}, SLO {meta['slo_ms']} ms), kp-client + tcpdump on CPU {meta['cpus']['client']}"
            f"{' at idle priority' if meta.get('client_policy') == 'idle' else ''}"
            f"{'; if-manager timer slack %d µs' % meta['if_manager_timer_slack_us'] if meta.get('if_manager_timer_slack_us') else ''}"
            f"{'; the inference thread spinning %d ms after each batch (kp-if --inference-spin-ms)' % meta['inference_spin_ms'] if meta.get('inference_spin_ms') else ''}"
            f"{'; images converted by the inference thread before each batch (kp-if --convert-on inference)' if meta.get('convert_on') == 'inference' else ''}.\n",
            "| batch | engine median ms (before / after) | p99 ms | images/s (batch / median) |", "|---|---|---|---|"] + [
            f"| {n} | {b['latency_ms']['median']:.2f} / {a['latency_ms']['median']:.2f} | {b['latency_ms']['p99']:.2f} / "
            f"{a['latency_ms']['p99']:.2f} | {b['images_per_s_median']:.1f} / {a['images_per_s_median']:.1f} |"
            for n, b, a in ((n, eng[n]["before"], eng[n]["after"]) for n in sorted(eng))]


def saturation_table(meta: dict, sat: dict) -> list[str]:
    c = sat["cpu"]
    return ["", "| saturation (closed loop) | value |", "|---|---|",
            f"| concurrency, duration | {meta['concurrency']}, {meta['duration_s']} s |",
            f"| end to end, OK answers/s | **{sat['ok_per_s']:.1f}** |",
            f"| batch sizes used (requests per size) | {sat.get('batch_mix_requests', '-')} (mean {sat.get('mean_batch', 0):.2f}) |",
            f"| engine alone at that batch mix, images/s | {sat['engine_images_per_s_same_mix']:.1f} |",
            f"| **ratio end to end / engine** (same batch mix) | **{ratio3(sat['ratio_e2e_to_engine'])}** |",
            f"| ratio end to end / engine's best batch | {ratio3(sat['ratio_e2e_to_engine_best'])} |",
            f"| engine time those batches need, share of the run | {sat.get('engine_busy_fraction', 0):.3f} |",
            "| engine's time per image in the IF by batch size, ms (kp-if --trace) | "
            + (", ".join(f"{n}: {v:.3f}" for n, v in sat["engine_own_ms_per_image_by_size"].items())
               if "engine_own_ms_per_image_by_size" in sat else "-") + " |",
            "| of which on the inference thread's CPU, by batch size, ms | "
            + (", ".join(f"{n}: {v:.3f}" for n, v in sat["engine_cpu_ms_per_image_by_size"].items())
               if "engine_cpu_ms_per_image_by_size" in sat else "-") + " |",
            "| the same by size, after a batch of the same size / of another (CPU), ms | "
            + (", ".join(after_cell(n, e) for n, e in sat["engine_own_ms_per_image_after"].items())
               if sat.get("engine_own_ms_per_image_after") else "-") + " |",
            "| the same, batch mix / batches of 1 (one run, interleaved) | "
            + (f"{sat['engine_own_per_image_mix_vs_batch1']:.3f}" if "engine_own_per_image_mix_vs_batch1" in sat
               else "-") + " |",
            "| the batches' engine time / batches of 1 within 1 s of each (drift-free; share of images) | "
            + (f"{sat['engine_own_vs_batch1_nearby']:.4f} ({sat['batch1_nearby_images_share']:.2f})"
               if "engine_own_vs_batch1_nearby" in sat else "-") + " |",
            "| engine idle between batches, share of the phase: a request complete / none yet (kp-if --trace) | "
            + (f"{sat['engine_idle_with_request_complete_fraction']:.4f} / {sat['engine_idle_with_none_complete_fraction']:.4f}"
               if "engine_idle_with_request_complete_fraction" in sat else "-") + " |",
            f"| kp-if's own cost fit a + b·n at the end, ms (n = 1, 2, 4, 8) | {list(sat['if_fit_ms'].values())} |",
            f"| statuses | {sat['statuses']} |",
            f"| CPU0 / CPU1 busy % (user, sys, softirq) | {c['cpu0']['busy']} ({c['cpu0']['user']}, {c['cpu0']['system']}, "
            f"{c['cpu0']['softirq']}) / {c['cpu1']['busy']} ({c['cpu1']['user']}, {c['cpu1']['system']}, {c['cpu1']['softirq']}) |",
            f"| kp-if threads, % of a CPU | {c['kp_if_threads_pct']} |",
            f"| fragment thread (kp-if main), µs of CPU per fragment | {us(sat.get('fragment_thread_us_per_fragment'))} |",
            f"| if-manager / kp-client / tcpdump / everything else, % of a CPU | {sum(c['if_manager_threads_pct'].values()):.1f}"
            f" / {c['kp_client_pct']} / {c['tcpdump_pct']} / {c['others_pct']} |"]


LATENCY_ROWS = [
    ("offered / OK answers per s", lambda p: f"{p['client']['rate'] or 0:.1f} / {p['ok_per_s']:.1f}"
     if p["client"]["rate"] else f"closed / {p['ok_per_s']:.1f}"),
    ("requests sent", lambda p: f"{p['client'].get('sent', '-')}"),
    ("client RTT p50 / p99 ms", lambda p: p50_p99(p["client"]["rtt_us"])),
    ("platform latency (answers' latency_us) p50 / p99 ms", lambda p: p50_p99(p["client"]["platform_latency_us"])),
    ("inference (engine median at the request's batch size) p50 / p99 ms", lambda p: p50_p99(p.get("inference_us"))),
    ("**platform overhead = latency_us − inference** p50 / p99 ms", lambda p: f"**{p50_p99(p.get('overhead_us'))}**"),
    ("share of requests that found the engine busy", lambda p: f"{p.get('found_engine_busy_fraction', 0):.2f}"),
    ("overhead of those that found it idle p50 / p99 ms", lambda p: p50_p99(p.get("overhead_engine_idle_us"))),
    ("fragments arriving (first to last at the platform's interface) p50 / p99 ms",
     lambda p: p50_p99(p.get("frag_span_us"))),
    ("overhead after the last fragment, engine idle at arrival, p50 / p99 ms",
     lambda p: p50_p99(p.get("overhead_after_last_fragment_engine_idle_us"))),
    ("outside the IF (wire RTT − latency_us) p50 / p99 ms", lambda p: p50_p99(p.get("outside_if_us"))),
    ("engine's own time for the request's batch (kp-if --trace) p50 / p99 ms", lambda p: p50_p99(p.get("engine_own_us"))),
    ("**last fragment in (platform's interface) → answer out (client's) − own engine time** p50 / p99 µs",
     lambda p: f"**{p50_p99_us(p.get('overhead_after_last_own_us'))}**"),
    ("the same, engine idle at arrival, p50 / p99 µs", lambda p: p50_p99_us(p.get("overhead_after_last_own_engine_idle_us"))),
    ("of which in the IF: request complete → its batch starts, p50 / p99 µs", lambda p: p50_p99_us(p.get("if_wait_us"))),
    ("of which in the IF: batch ends → answer on the TX ring, p50 / p99 µs", lambda p: p50_p99_us(p.get("if_answer_us"))),
    ("of which outside the IF (if-manager, af_packet, veth; both ways) p50 / p99 µs",
     lambda p: p50_p99_us(p.get("outside_if_after_last_us"))),
    ("way in: last fragment at the interface → request complete in the IF, p50 / p99 µs",
     lambda p: p50_p99_us(p.get("in_path_us"))),
    ("way out: answer on the TX ring → at the client's interface, p50 / p99 µs",
     lambda p: p50_p99_us(p.get("out_path_us"))),
    (f"engine idle at arrival, over {AFTER_LAST_TARGET_US[1]:.0f} µs after the last fragment, by the leg that took longest: "
     "way in / to its batch / to the TX ring / way out", lambda p: tail_cell(p.get("tail_stages"))),
    ("batch sizes (requests per size)", lambda p: str(p.get("batch_mix_requests", "-"))),
    ("statuses / unanswered", lambda p: f"{p['statuses']} / {p['unanswered']}"),
    ("CPU0 / CPU1 busy %", lambda p: f"{p['cpu']['cpu0']['busy']} / {p['cpu']['cpu1']['busy']}"),
    ("kp-if threads, % of a CPU", lambda p: str(p["cpu"]["kp_if_threads_pct"])),
    ("fragment thread (kp-if main), µs of CPU per fragment", lambda p: us(p.get("fragment_thread_us_per_fragment"))),
    ("if-manager / kp-client / everything else, % of a CPU",
     lambda p: f"{sum(p['cpu']['if_manager_threads_pct'].values()):.1f} / {p['cpu']['kp_client_pct']} / {p['cpu']['others_pct']}"),
    ("load average at the end", lambda p: " ".join(p["cpu"]["loadavg_end"])),
]


def latency_table(meta: dict, phases: dict) -> list[str]:
    """1 outstanding, low load (where the run had it), half load and the
    long run side by side."""
    def seconds(p: dict) -> str:  # what the phase ran (LOW_REQUESTS lengthens the low-load one)
        s = p["client"].get("send_duration_s")
        return f"{round(s)}" if s else f"{meta['duration_s']}"

    cols = [("single", f"1 outstanding ({meta['duration_s']} s)")]
    if "low" in phases:
        cols.append(("low", f"{meta['low_load_fraction']:.0%} load ({seconds(phases['low'])} s)"))
    cols += [("half", f"{meta['load_fraction']:.0%} load ({meta['duration_s']} s)"),
             ("long", f"{meta['load_fraction']:.0%} load ({meta['long_duration_s']} s)")]
    return ["", "| latency | " + " | ".join(h for _, h in cols) + " |", "|---" * (len(cols) + 1) + "|"] + [
            f"| {name} | " + " | ".join(fn(phases[k]) for k, _ in cols) + " |" for name, fn in LATENCY_ROWS]


def after_cell(n: int, e: dict) -> str:
    """One size of `engine_own_ms_per_image_after` for the report: "3:
    5.67 / 6.02" (wall, after the same size / another), with the CPU times
    in brackets where recorded, and the batches behind each."""
    def side(k: str) -> str:
        cpu = f" ({e[k + '_cpu']:.2f})" if k + "_cpu" in e else ""
        return f"{e[k]:.2f}{cpu}"
    return f"{n}: {side('same')} / {side('other')} ({e['same_batches']} / {e['other_batches']} batches)"


def ratio3(x: float) -> str:
    """A ratio to three decimals, cut, not rounded: 0.9499 is "0.949", so
    that a figure that misses a target never reads as the target, in the
    table or in the verdict."""
    return f"{math.floor(x * 1000 + 1e-9) / 1000:.3f}"


def targets(phases: dict) -> list[str]:
    """Issue 13's targets, met or not, from this run: end to end >= 0.95
    of the engine alone (at the batch mix the IF ran, and at the engine's
    best batch size), and last fragment in -> answer out - the request's
    own engine time, p50 <= 100 µs and p99 <= 500 µs, at one request
    outstanding and, among the requests that found the engine idle, at
    low load (where the run had that phase). A figure the run lacks (no
    capture, no trace) is said to be missing, not met."""
    def met(ok: bool) -> str:
        return "**met**" if ok else "**not met**"

    sat = phases["sat"]
    out = [f"end to end / engine ≥ {E2E_TARGET}: at the same batch mix {met(sat['ratio_e2e_to_engine'] >= E2E_TARGET)} "
           f"({ratio3(sat['ratio_e2e_to_engine'])}), at the engine's best batch size "
           f"{met(sat['ratio_e2e_to_engine_best'] >= E2E_TARGET)} ({ratio3(sat['ratio_e2e_to_engine_best'])})"]
    p50_max, p99_max = AFTER_LAST_TARGET_US
    for phase, key, where in (("single", "overhead_after_last_own_us", "1 outstanding"),
                              ("low", "overhead_after_last_own_engine_idle_us", "low load, engine idle at arrival")):
        if phase not in phases:
            continue
        q = phases[phase].get(key)
        if not q or q.get("p50") is None:
            out.append(f"last fragment in → answer out − own engine time, {where}: missing (no trace or capture)")
            continue
        out.append(f"last fragment in → answer out − own engine time ≤ {p50_max:.0f} / {p99_max:.0f} µs (p50 / p99), "
                   f"{where}: {met(q['p50'] <= p50_max and q['p99'] <= p99_max)} ({q['p50']:.0f} / {q['p99']:.0f} µs"
                   + (f" over {q['n']} requests)" if q.get("n") else ")"))
    return ["", "Targets (issue 13): " + "; ".join(out) + "."]


def memory_table(kp: dict, ifm: dict, growth: dict, hp: dict, pool: dict) -> list[str]:
    """kp-if's memory at each snapshot, and where its hugepages went."""
    L = ["", "| kp-if memory, MiB | at rest | after saturation | after half load | after long run | growth (long − rest) |",
         "|---|---|---|---|---|---|"]
    for k in MEMORY_KEYS:
        L.append(f"| {k[:-3]} | " + " | ".join(f"{kp[l]['status'][k] / 1024:.1f}" for l in MEMORY_LABELS)
                 + f" | {growth[k] / 1024:+.1f} |")
    L.append("| hugetlb mapped (smaps Shared+Private_Hugetlb) | "
             + " | ".join(f"{kp[l]['hugetlb_kB'] / 1024:.1f}" for l in MEMORY_LABELS)
             + f" | {growth['smaps_hugetlb_kB'] / 1024:+.1f} |")
    L.append("| free 2 MiB hugepages on the machine | " + " | ".join(str(kp[l]["hugepages_free"]) for l in MEMORY_LABELS)
             + " | |")
    r = ifm.get("rest")
    L += ["", f"Hugepages: {hp['before']} free before the platform, {hp['if_manager_up']} with the if-manager up, "
          f"{hp['kp_if_up']} with kp-if up: kp-if added {2 * (hp['if_manager_up'] - hp['kp_if_up'])} MiB (its input pool "
          f"reserves {pool.get('hugepage_bytes', 0) / 2**20:.1f} MiB: {pool.get('slots')} slots of "
          f"{pool.get('slot_bytes', 0) / 2**10:.0f} KiB). kp-if maps at rest: "
          + ", ".join(f"{n} x {g} ({kb / 1024:.0f} MiB)" for g, (n, kb) in hugepage_groups(kp["rest"]["hugetlb_maps"]).items())
          + (f"; the if-manager at rest: RSS {r['status']['VmRSS_kB'] / 1024:.1f} MiB, hugetlb {r['hugetlb_kB'] / 1024:.0f} MiB."
             if r else ".")]
    return L


# --- analysis: the results folder ---------------------------------------------------

def read_json(path: str):
    with open(path) as f:
        return json.load(f)


def read_json_lines(path: str) -> list:
    with open(path) as f:
        return [json.loads(l) for l in f if l.strip()]


def captured_payloads(path: str) -> Iterator[tuple[int, bytes]]:
    """udp_payloads of a capture; none when tcpdump did not run."""
    if not os.path.exists(path):
        return iter(())
    with open(path, "rb") as f:
        return udp_payloads(f.read())


def write_csv(path: str, rows: list[list]) -> None:
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows(rows)


def captured_answers(out: str, phase: str) -> list[dict]:
    """PHASE's OK answers from its captures; every answer to answers-PHASE.csv."""
    first, last = fragment_ends(captured_payloads(f"{out}/frags-{phase}.pcap"))
    trace = f"{out}/trace.jsonl"
    rows = answer_rows(captured_payloads(f"{out}/answers-{phase}.pcap"), spans_of(first, last), last,
                       trace_records(read_json_lines(trace)) if os.path.exists(trace) else None,
                       read_json(f"{out}/kp-if.json").get("clock_realtime_ns"))
    ok = mark_engine_busy(rows)
    with open(f"{out}/answers-{phase}.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=ANSWER_COLUMNS)
        w.writeheader()
        w.writerows(rows)
    return ok


def tcpdump_seconds(out: str, phase: str) -> float:
    """Both tcpdumps' CPU time in PHASE; 0 without tcpdump."""
    try:
        return int(host.read(f"{out}/tcpdump-{phase}.ns")) / 1e9
    except (OSError, ValueError):
        return 0.0


def analyse(out: str) -> str:
    """Everything the phases wrote in OUT -> engine.csv, answers-*.csv,
    memory.csv, summary.json and summary.md; returns the markdown."""
    meta = read_json(f"{out}/meta.json")
    hz = os.sysconf("SC_CLK_TCK")
    eng = engine_runs(read_json_lines(f"{out}/engine-before.jsonl"), read_json_lines(f"{out}/engine-after.jsonl"))
    ref_ms = reference_ms(eng)
    write_csv(f"{out}/engine.csv", engine_rows(eng))

    mach = {m["label"]: m for m in read_json_lines(f"{out}/machine.jsonl")}
    phases = {}
    for p in PHASES:
        if p in OPTIONAL_PHASES and not os.path.exists(f"{out}/client-{p}.json"):
            continue
        client = read_json(f"{out}/client-{p}.json")
        ok = captured_answers(out, p)
        cpu = cpu_use(mach[f"{p}-start"], mach[f"{p}-end"], hz, read_json(f"{out}/client-{p}.rusage.json"),
                      tcpdump_seconds(out, p))
        phases[p] = phase_stats(client, ok, ref_ms, cpu)
    sat = phases["sat"]
    final = read_json(f"{out}/kp-if.json")
    check_converted_by(meta, final)
    rs = final.get("reassembly") or {}
    fpr = rs["fragments"] / rs["requests"] if rs.get("requests") else None
    for p in phases.values():
        p["fragment_thread_us_per_fragment"] = fragment_thread_cost(p, fpr)
    add_saturation_ratios(sat, eng, ref_ms, final)

    mem = read_json_lines(f"{out}/memory.jsonl")
    kp = {m["label"]: m for m in mem if m["proc"] == "kp-if"}
    ifm = {m["label"]: m for m in mem if m["proc"] == "if-manager"}
    write_csv(f"{out}/memory.csv", memory_rows(mem))
    hp = read_json(f"{out}/hugepages.json")["hugepages_free"]
    growth = memory_growth(kp)

    # The host's own latency (cyclictest, oslat), where the script measured it.
    host_json = {(tool, when): read_json(f"{out}/host-{tool}-{when}.json")
                 for tool in ("cyclictest", "oslat") for when in ("before", "after")
                 if os.path.exists(f"{out}/host-{tool}-{when}.json")}

    summary = {"meta": meta, "engine": {str(n): v for n, v in sorted(eng.items())}, "engine_ref_ms": ref_ms,
               "phases": phases,
               "memory": {"kp_if": kp, "if_manager": ifm, "hugepages_free": hp, "kp_if_growth_kB": growth,
                          "input_pool": final.get("pool")},
               "kp_if_final": final, "if_manager_final": read_json(f"{out}/if-manager.json"),
               "host_latency": host_summary(host_json)}
    with open(f"{out}/summary.json", "w") as f:
        json.dump(summary, f, indent=1, default=str)

    L = (engine_table(meta, eng) + saturation_table(meta, sat) + latency_table(meta, phases)
         + targets(phases) + host_markdown(host_json)
         + memory_table(kp, ifm, growth, hp, final.get("pool") or {}))
    md = "\n".join(L) + "\n"
    with open(f"{out}/summary.md", "w") as f:
        f.write(md)
    return md


# --- command line ---------------------------------------------------------------------

def fragment_thread_cpu(meta: dict) -> int:
    """The CPU kp-if's fragment thread ran on (runs recorded before it
    could move: the inference thread's)."""
    cpus = meta["cpus"]
    return cpus.get("kp_if_fragment_thread", cpus["kp_if"])


def layout(meta: dict) -> str:
    """Where kp-if's fragment thread ran: with the engine (all of kp-if's
    per-request work on the inference core) or on another CPU (kneepoint
    as designed: reassembly and conversion with the network side)."""
    return "all on the inference core" if fragment_thread_cpu(meta) == meta["cpus"]["kp_if"] else "as designed"


def commits(metas: list[dict]) -> str:
    """The commits the runs recorded, each once."""
    return ", ".join(sorted({m["git"] for m in metas}))


def saturation_rows(groups: list[tuple[str, list[dict]]]) -> list[str]:
    """A markdown table of the saturation phase of several runs, one row
    per labelled group of runs (their summary.json), each cell listing the
    runs in order: the model and layout, OK answers/s, the mean batch, and
    the ratio of end to end to the engine alone at the same batch mix and
    at the engine's best batch size (the same run's engine phase)."""
    def cell(sats: list[dict], key: str, fmt: str) -> str:
        return ", ".join(format(x[key], fmt) for x in sats)

    rows = ["| runs | model, layout | OK answers/s | mean batch | end to end / engine, same batch mix "
            "| end to end / engine's best batch | git |", "|---|---|---|---|---|---|---|"]
    for label, runs in groups:
        sats = [r["phases"]["sat"] for r in runs]
        metas = [r["meta"] for r in runs]
        where = "; ".join(sorted({f"{m['model']}, {layout(m)}" for m in metas}))
        rows.append(f"| {label} ({len(runs)}) | {where} | {cell(sats, 'ok_per_s', '.1f')} | "
                    f"{cell(sats, 'mean_batch', '.2f')} | {cell(sats, 'ratio_e2e_to_engine', '.3f')} | "
                    f"{cell(sats, 'ratio_e2e_to_engine_best', '.3f')} | {commits(metas)} |")
    return rows


def refusal_rows(groups: list[tuple[str, list[dict]]]) -> list[str]:
    """A markdown table of what was not answered OK in several runs, one
    row per labelled group (their summary.json): at one request
    outstanding, and in the open-loop phase at LOAD_FRACTION of the
    saturation rate, each run's non-OK answers of all it sent, and the
    SLO they ran under."""
    def share(c: dict) -> str:
        bad = c["sent"] - c["status"].get("ok", 0)
        return f"{bad} of {c['sent']} ({100 * bad / max(1, c['sent']):.1f}%)"

    rows = ["| runs | model, layout, SLO | 1 outstanding: not OK | open loop: offered req/s, not OK | git |",
            "|---|---|---|---|---|"]
    for label, runs in groups:
        metas = [r["meta"] for r in runs]
        where = "; ".join(sorted({f"{m['model']}, {layout(m)}, {m['slo_ms']:g} ms" for m in metas}))
        single = ", ".join(share(r["phases"]["single"]["client"]) for r in runs)
        half = ", ".join(f"{r['phases']['half']['client']['rate']:g}: {share(r['phases']['half']['client'])}"
                         for r in runs)
        rows.append(f"| {label} ({len(runs)}) | {where} | {single} | {half} | {commits(metas)} |")
    return rows


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    sub = ap.add_subparsers(dest="command", required=True)
    m = sub.add_parser("meta", help="the run's settings and machine -> FILE")
    m.add_argument("file")
    m.add_argument("--repo", required=True)
    m.add_argument("--model", required=True)
    for name in ("if-id", "max-batch", "concurrency", "threads", "if-manager-cpu", "kp-if-cpu", "client-cpu", "tcpdump"):
        m.add_argument(f"--{name}", type=int, required=True)
    for name in ("duration-s", "long-duration-s", "warmup-s", "engine-seconds", "slo-ms", "load-fraction"):
        m.add_argument(f"--{name}", type=host.number, required=True)
    m.add_argument("--low-load-fraction", type=host.number, default=0,
                   help="the low-load phase's share of the saturation rate (0: no such phase)")
    m.add_argument("--busy-poll", required=True, help="1: both DPDK processes ran with --busy-poll")
    m.add_argument("--kp-rx-cpu", type=int, default=None,
                   help="the CPU of kp-if's fragment thread (its EAL lcore); default: --kp-if-cpu")
    m.add_argument("--client-policy", default="normal", choices=("idle", "normal"),
                   help="kp-client's and tcpdump's scheduling policy (idle: SCHED_IDLE)")
    m.add_argument("--if-manager-timer-slack-us", default="", help="the if-manager's --timer-slack-us, if given")
    m.add_argument("--inference-spin-ms", type=int, default=0,
                   help="kp-if's --inference-spin-ms (0: its inference thread dozes when idle)")
    m.add_argument("--convert-on", default="network", choices=("network", "inference"),
                   help="kp-if's --convert-on: the thread that converts images to the model's input")
    s = sub.add_parser("machine", help="a machine.jsonl line")
    s.add_argument("label")
    s.add_argument("ifm_pid", type=int)
    s.add_argument("kpif_pid", type=int)
    s = sub.add_parser("memory", help="a memory.jsonl line")
    s.add_argument("label")
    s.add_argument("pid", type=int)
    s.add_argument("proc")
    s = sub.add_parser("client", help="run kp-client, keep its report, log and CPU time")
    s.add_argument("base")
    s.add_argument("cmd", nargs=argparse.REMAINDER)
    s = sub.add_parser("ok-rate", help="a kp-client report's OK answers per second")
    s.add_argument("report")
    s = sub.add_parser("low-load-seconds", help="the low-load phase's seconds: DURATION, or long enough "
                       "for REQUESTS at RATE")
    s.add_argument("duration_s", type=float)
    s.add_argument("requests", type=int)
    s.add_argument("rate", type=float)
    s = sub.add_parser("offered-rate", help="OK_RATE x FRACTION, 0.1 resolution; fails below 0.5")
    s.add_argument("ok_rate", type=float)
    s.add_argument("fraction", type=float)
    s = sub.add_parser("analyse", help="OUT's results -> CSVs, summary.json, summary.md")
    s.add_argument("out")
    s = sub.add_parser("compare", help="a markdown table of several runs: saturation, or refusals")
    s.add_argument("--refusals", action="store_true",
                   help="what was not answered OK at one outstanding and in the open-loop phase")
    s.add_argument("groups", nargs="+", metavar="LABEL=DIR[,DIR...]",
                   help="a row's label and the runs' output folders (each with summary.json)")
    return ap


def main() -> int:
    a = parser().parse_args()
    if a.command == "meta":
        with open(a.file, "w") as f:
            json.dump(meta(a), f, indent=1)
    elif a.command == "machine":
        print(json.dumps(machine_snapshot(a.label, a.ifm_pid, a.kpif_pid)))
    elif a.command == "memory":
        print(json.dumps(memory_snapshot(a.label, a.pid, a.proc)))
    elif a.command == "client":
        return run_client(a.base, a.cmd)
    elif a.command == "compare":
        groups = []
        for g in a.groups:
            label, _, dirs = g.rpartition("=")
            groups.append((label, [read_json(os.path.join(d, "summary.json")) for d in dirs.split(",")]))
        print("\n".join((refusal_rows if a.refusals else saturation_rows)(groups)))
    elif a.command == "ok-rate":
        print(ok_rate(read_json(a.report)))
    elif a.command == "low-load-seconds":
        print(low_load_seconds(a.duration_s, a.requests, a.rate))
    elif a.command == "offered-rate":
        rate = offered_rate(a.ok_rate, a.fraction)
        print(rate)
        return 0 if rate >= 0.5 else 1
    elif a.command == "analyse":
        print(analyse(a.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
