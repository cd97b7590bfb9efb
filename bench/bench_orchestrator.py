#!/usr/bin/env python3
"""The Python of scripts/bench-orchestrator.sh (the orchestrator's shadow
switchover gaps under load, and the convergence of its self-tuning loop):
what each phase's raw data comes to, and the markdown summary. The script
keeps the processes (namespaces, the orchestrator, kp-client loops,
kpctl); it calls

    bench_orchestrator.py meta FILE PHASE --repo R ...   the run's settings
    bench_orchestrator.py switchover DIR    gaps-if*.csv, kp-if-succession.json,
                                            result.json (also printed)
    bench_orchestrator.py convergence DIR   trajectory.csv, result.json
                                            (also printed)
    bench_orchestrator.py impact DIR        switchovers as clients see them
    bench_orchestrator.py e2e DIR           end to end against the engine
                                            alone at the same batch sizes,
                                            result.json (also printed)
    bench_orchestrator.py summary OUT       the markdown of every phase
                                            with a result.json, printed
    bench_orchestrator.py docs OUT DOC      that markdown into DOC, between
                                            its bench-orchestrator markers

How each number is computed: docs/PERFORMANCE.md, "Orchestrator". The
percentiles are bench/stats.py's (nearest rank). Standard library only;
the functions below the readers are pure, tested in
bench/test_bench_orchestrator.py.
"""

from __future__ import annotations

import argparse
import bisect
import csv
import glob
import json
import os
import platform
import re
import sys
import time
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
import docsection  # noqa: E402
import host  # noqa: E402
from stats import percentile as pct  # noqa: E402  (the one percentile: nearest rank)

CLIENT_COUNTS = ("sent", "answered", "unanswered", "duplicates", "late", "unexpected", "malformed")
TRAJECTORY_COLUMNS = ["t_s", "share_pct", "demand_from", "demand_to", "reason", "held", "latency_ms",
                      "slo_ms", "throughput_rps", "arrival_rps", "estimate_pct"]


def meta(a: argparse.Namespace) -> dict:
    """The run's settings (as the script got them) and the machine."""
    pressure = "/proc/pressure/cpu"
    return {"phase": a.phase, "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "loadavg_at_start": host.load_average(host.read("/proc/loadavg")),
            "cpu_pressure_at_start": host.read(pressure).split("\n")[0] if os.path.exists(pressure) else None,
            "nproc": os.cpu_count(), "cpu": host.cpu_model(host.read("/proc/cpuinfo")), "kernel": platform.release(),
            "git": host.git_head(a.repo),
            "cpus": a.cpus, "if_manager_cpu": a.if_manager_cpu,
            "switchovers": a.switchovers, "settle_s": a.settle_s, "frag_gap": a.frag_gap,
            "concurrency": a.concurrency, "chunk_s": a.chunk_s,
            "conv_duration_s": a.conv_duration_s, "tuning_period_ms": a.tuning_period_ms,
            "hold_down_s": a.hold_down_s, "min_step_pct": a.min_step_pct, "stable_k": a.stable_k,
            "af_packet_frames": a.af_packet_frames,
            "if1": {"model": a.model1, "share": a.if1[0], "slo_ms": a.if1[1], "rate": a.if1[2]},
            "if5": {"model": a.model5, "share": a.if5[0], "slo_ms": a.if5[1], "rate": a.if5[2]}}


def run_facts(meta: dict, loadavg_end: str) -> dict:
    """What every phase's result starts with: when, what, where, how busy."""
    return {"date": meta["date"], "commit": meta.get("git"), "cpus": meta["cpus"],
            "loadavg_at_start": meta["loadavg_at_start"],
            "cpu_pressure_at_start": meta["cpu_pressure_at_start"], "loadavg_at_end": loadavg_end.split()}


def measured(r: dict) -> str:
    """The commit a phase's result was measured at, for its heading."""
    return f"commit {r.get('commit') or 'not recorded'}"


# --- switchover ---------------------------------------------------------------

def gap_stats(gaps: list[float]) -> dict:
    """The distribution of one IF's switchover gaps, µs."""
    return {"n": len(gaps), "p50": pct(gaps, .5), "p90": pct(gaps, .9), "p99": pct(gaps, .99),
            "min": min(gaps) if gaps else None, "max": max(gaps) if gaps else None,
            "mean": sum(gaps) / len(gaps) if gaps else None}


def gaps_csv(gaps: list[float]) -> str:
    """gaps-ifN.csv: one gap per switchover, in order."""
    return "n,gap_us\n" + "".join(f"{n},{v}\n" for n, v in enumerate(gaps, 1))


def command_to_active(switchovers: list[dict]) -> dict:
    """From `kpctl share` to the IF active again, ms (switchovers.csv rows)."""
    c2a = [float(r["cmd_to_active_ms"]) for r in switchovers]
    return {"p50": pct(c2a, .5), "p90": pct(c2a, .9), "max": max(c2a)}


def client_totals(pieces: list[dict]) -> dict:
    """One client loop's kp-client reports (one per CHUNK s piece, or
    {"failed": status}) summed; errors = answers other than ok +
    unanswered + duplicates."""
    tot = {"pieces": 0, "failed_pieces": 0, "sent": 0, "answered": 0, "unanswered": 0,
           "duplicates": 0, "late": 0, "unexpected": 0, "malformed": 0, "status": {}}
    for r in pieces:
        if "failed" in r:
            tot["failed_pieces"] += 1
            continue
        tot["pieces"] += 1
        for k in CLIENT_COUNTS:
            tot[k] += r[k]
        for k, v in r["status"].items():
            tot["status"][k] = tot["status"].get(k, 0) + v
    not_ok = sum(v for k, v in tot["status"].items() if k != "ok")
    tot["errors"] = not_ok + tot["unanswered"] + tot["duplicates"]
    return tot


def succession(pid: int, report: str) -> Optional[dict]:
    """How one kp-if process took the ring and what it handed back, from
    its output (the final report is the last line); None without one."""
    t = report.strip().splitlines()
    if not t:
        return None
    try:
        r = json.loads(t[-1])
    except json.JSONDecodeError:
        return None
    return {"pid": pid, "if_id": r.get("if_id"), **r.get("succession", {})}


def handovers(procs: list[dict]) -> dict:
    """Totals over if 1's processes that were handed the ring."""
    handed = [p for p in procs if p.get("taken") == "handed" and p["if_id"] == 1]
    return {
        "processes": len(procs), "reports_if1_handed": len(handed),
        "handovers_with_requests_in_flight": sum(1 for p in handed if p.get("handed_in_flight", 0) > 0),
        "handed_in_flight_total": sum(p.get("handed_in_flight", 0) for p in handed),
        "fragments_forwarded_total": sum(p.get("forwarded", 0) for p in handed),
        "forward_lost_total": sum(p.get("forward_lost", 0) for p in handed),
        "yielded_if1": sum(1 for p in procs if p["if_id"] == 1 and p.get("yielded")),
    }


def switchover_result(cur: str) -> dict:
    """DIR's switchover phase -> gaps-if*.csv, kp-if-succession.json, result.json."""
    summary = json.loads(host.read(f"{cur}/summary.json").strip().splitlines()[-1])
    res = dict(run_facts(read_json(f"{cur}/meta.json"), host.read(f"{cur}/loadavg.end")), ifs={})
    for i in summary["ifs"]:
        g = i["switchover_gaps_us"]
        res["ifs"][str(i["if_id"])] = {"switchovers": i["switchovers"], "failovers": i["failovers"],
                                       "gap_us": gap_stats(g)}
        write(f"{cur}/gaps-if{i['if_id']}.csv", gaps_csv(g))
    with open(f"{cur}/switchovers.csv") as f:
        res["cmd_to_active_ms"] = command_to_active(list(csv.DictReader(f)))
    clients = {name: client_totals(read_json_lines(f"{cur}/client-{name}.jsonl")) for name in ("if1", "if5")}
    res["clients"] = clients
    res["errors_total"] = sum(c["errors"] for c in clients.values())
    procs = []
    for f in sorted(glob.glob(f"{cur}/kp-if/*.json")):
        p = succession(int(os.path.basename(f)[:-5]), host.read(f))
        if p is not None:
            procs.append(p)
    res["kp_if"] = handovers(procs)
    write_json(f"{cur}/kp-if-succession.json", procs)
    write_json(f"{cur}/result.json", res)
    return res


# --- convergence -----------------------------------------------------------------

def trajectory(decisions: list[dict], t_load: float) -> dict:
    """if_id -> its tuner's decisions in order, times from the start of
    the load (s), with what each was computed from."""
    traj = {}
    for d in decisions:
        o = d["inputs"]["observation"]
        traj.setdefault(d["if_id"], []).append({
            "t_s": d["at_ns"] / 1e9 - t_load, "share_pct": o["share_pct"], "demand_from": d["from_pct"],
            "demand_to": d["to_pct"], "reason": d["reason"], "held": d["held"],
            "latency_ms": o["latency_ms"], "slo_ms": o["slo_ms"], "throughput_rps": o["throughput_rps"],
            "arrival_rps": o["arrival_rps"], "estimate_pct": d["inputs"]["estimate_pct"]})
    return traj


def trajectory_csv(traj: dict) -> str:
    """trajectory.csv: floats to 3 decimals, None empty."""
    cell = lambda v: "" if v is None else (f"{v:.3f}" if isinstance(v, float) else str(v))
    lines = ["if_id," + ",".join(TRAJECTORY_COLUMNS) + "\n"]
    for i, rows in sorted(traj.items()):
        lines += [f"{i}," + ",".join(cell(r[c]) for c in TRAJECTORY_COLUMNS) + "\n" for r in rows]
    return "".join(lines)


def share_changes(traj: dict) -> dict:
    """if_id -> its share changes. The tune() that makes one logs the old
    share; the next line of that IF (after its switchover, none while
    switching) shows the new one."""
    changes = {}
    for i, rows in traj.items():
        changes[i] = [{"if_id": i, "decided_s": a["t_s"], "applied_by_s": b["t_s"],
                       "from": a["share_pct"], "to": b["share_pct"]}
                      for a, b in zip(rows, rows[1:]) if abs(b["share_pct"] - a["share_pct"]) > 1e-9]
    return changes


def reasons_under_load(traj: dict, load_end_s: float) -> dict:
    """if_id -> how many decisions under load had each reason(/held)."""
    reasons = {}
    for i, rows in traj.items():
        c = {}
        for r in rows:
            if 0 <= r["t_s"] <= load_end_s:
                key = r["reason"] + ("/" + r["held"] if r["held"] else "")
                c[key] = c.get(key, 0) + 1
        reasons[i] = dict(sorted(c.items()))
    return reasons


def direction_reversals(changes: dict) -> dict:
    """if_id -> how often a share change went the other way from the last."""
    reversals = {}
    for i, ch in changes.items():
        dirs = [1 if c["to"] > c["from"] else -1 for c in ch]
        reversals[i] = sum(1 for a, b in zip(dirs, dirs[1:]) if a != b)
    return reversals


def final_state(traj: dict, load_end_s: float) -> dict:
    """if_id -> its share and demand at the end of the load, and its last
    five decisions."""
    final = {}
    for i, rows in traj.items():
        tail = [r for r in rows if r["t_s"] <= load_end_s][-5:]
        final[i] = {"share_pct": tail[-1]["share_pct"], "demand_pct": tail[-1]["demand_to"],
                    "reasons_last5": [r["reason"] for r in tail], "held_last5": [r["held"] for r in tail],
                    "latency_ms_last5": [round(r["latency_ms"], 1) for r in tail],
                    "throughput_rps_last5": [round(r["throughput_rps"], 1) for r in tail],
                    "arrival_rps_last5": [round(r["arrival_rps"], 1) for r in tail]}
    return final


def client_summary(report: dict) -> dict:
    """An open-loop kp-client report's counts and RTT p50/p99 in ms."""
    c = {k: report[k] for k in ("sent", "answered", "unanswered", "throughput", "status")}
    c["rtt_ms_p50"] = report["rtt_us"]["p50"] / 1e3
    c["rtt_ms_p99"] = report["rtt_us"]["p99"] / 1e3
    return c


def kp_if_cores(log_lines: list[str]) -> list[str]:
    """"if N on X [cores]" of each distinct kp-if start-up line."""
    return sorted(set(re.sub(r".*(if \d+ on \S+).*threads on cores (\[[^\]]*\]).*", r"\1 \2", l.strip())
                      for l in log_lines))


def convergence(meta: dict, decisions: list[dict], traj: dict, load_end_s: float, log_lines: list[str]) -> dict:
    """The tuner's convergence from its decisions and trajectory (times
    from the start of the load, which lasted load_end_s) and the
    orchestrator's log. Converged: no share change for stable_k hold-downs
    (and at least stable_k tuning periods) up to the end of the load; the
    convergence time is that of the last share change."""
    hold, period, k = meta["hold_down_s"], meta["tuning_period_ms"] / 1e3, meta["stable_k"]
    window = max(k * hold, k * period)
    changes = share_changes(traj)
    all_changes = sorted((c for ch in changes.values() for c in ch), key=lambda c: c["decided_s"])
    in_load = [c for c in all_changes if -1 <= c["decided_s"] <= load_end_s]
    last = in_load[-1] if in_load else None
    quiet = load_end_s - (last["decided_s"] if last else 0.0)
    return {"stable_window_s": window, "load_s": load_end_s,
            "converged": bool(quiet >= window),
            "convergence_decided_s": last["decided_s"] if last else 0.0,
            "convergence_applied_s": last["applied_by_s"] if last else 0.0,
            "quiet_after_last_change_s": quiet,
            "share_changes": all_changes,
            "share_changes_before_load": sum(1 for c in all_changes if c["decided_s"] < -1),
            "demand_changes": sum(1 for d in decisions if d["to_pct"] != d["from_pct"]),
            "direction_reversals": direction_reversals(changes),
            "reasons_under_load": reasons_under_load(traj, load_end_s),
            "reprovisions_logged": sum(1 for l in log_lines if "re-provisioning" in l),
            "switchovers_logged": sum(1 for l in log_lines if "switched to" in l),
            "final": final_state(traj, load_end_s)}


def convergence_result(cur: str) -> dict:
    """DIR's convergence scenario -> trajectory.csv, result.json."""
    meta = read_json(f"{cur}/meta.json")
    launched = float(host.read(f"{cur}/orchestrator.launched"))
    t_load = float(host.read(f"{cur}/load.started")) - launched   # on the daemon's clock, s
    t_stop = float(host.read(f"{cur}/load.stopped")) - launched
    decisions = [d for d in read_json_lines(f"{cur}/decisions.jsonl") if "allocation" not in d]
    traj = trajectory(decisions, t_load)
    write(f"{cur}/trajectory.csv", trajectory_csv(traj))
    clients = {}
    for n in ("if1", "if5"):
        try:
            clients[n] = client_summary(read_json(f"{cur}/client-{n}.json"))
        except (OSError, ValueError, KeyError):
            clients[n] = None
    res = {"phase": meta["phase"], **run_facts(meta, host.read(f"{cur}/loadavg.end")),
           "scenario": {k: meta[k] for k in ("if1", "if5", "tuning_period_ms", "hold_down_s", "min_step_pct", "stable_k")},
           **convergence(meta, decisions, traj, t_stop - t_load, host.read(f"{cur}/orchestrator.log").splitlines(True)),
           "clients": clients,
           "kp_if_cores": kp_if_cores(host.read(f"{cur}/kp-if-cores.txt").splitlines(True))}
    write_json(f"{cur}/result.json", res)
    return res


# --- impact: switchovers as the clients see them -------------------------------------

# kp-client's --timeout in the harness: an unanswered request was in flight
# this long.
CLIENT_TIMEOUT_US = 5_000_000


def read_records(paths: list[str]) -> list[dict]:
    """kp-client --record files (traffic::client::RECORD_HEADER) -> rows
    with sent/answered as ints (answered None when no answer came)."""
    rows = []
    for path in paths:
        with open(path) as f:
            for r in csv.DictReader(f):
                rows.append({"request_id": r["request_id"], "sent": int(r["sent_unix_us"]),
                             "outcome": r["outcome"],
                             "answered": int(r["answered_unix_us"]) if r["answered_unix_us"] else None})
    return rows


def near_a_switchover(sent: int, end: int, windows: list[tuple[int, int]], margin_us: int) -> bool:
    """Whether [sent, end] meets some window widened by margin_us on both
    sides (windows sorted by their start)."""
    # Windows that start before the request ends (plus the margin) ...
    i = bisect.bisect_right(windows, (end + margin_us, float("inf")))
    # ... of which one ends after it was sent (minus the margin): windows do
    # not overlap each other, so the last few are enough to look at.
    return any(w_end + margin_us >= sent for _, w_end in windows[max(0, i - 2):i])


def group_stats(rows: list[dict]) -> dict:
    lat = [(r["answered"] - r["sent"]) / 1e3 for r in rows if r["outcome"] == "ok"]
    statuses: dict = {}
    for r in rows:
        statuses[r["outcome"]] = statuses.get(r["outcome"], 0) + 1
    return {"requests": len(rows), "ok": len(lat), "failed": len(rows) - len(lat), "statuses": statuses,
            "latency_ms": {"p50": pct(lat, .5), "p90": pct(lat, .9), "p99": pct(lat, .99),
                           "max": max(lat) if lat else None}}


def switchover_impact(records: list[dict], windows: list, margin_us: int) -> dict:
    """Requests in flight within margin_us of a switchover window against
    all the others: latency of the OK ones (ms, from scheduled send to
    answer) and the failed (any other outcome: a status, unanswered).
    Target (issue 13): near p99 within 1.5x the others', nothing failed."""
    ws = sorted((int(a), int(b)) for a, b in windows)
    near, other = [], []
    for r in records:
        end = r["answered"] if r["answered"] is not None else r["sent"] + CLIENT_TIMEOUT_US
        (near if near_a_switchover(r["sent"], end, ws, margin_us) else other).append(r)
    n, o = group_stats(near), group_stats(other)
    ratio = (n["latency_ms"]["p99"] / o["latency_ms"]["p99"]
             if n["latency_ms"]["p99"] is not None and o["latency_ms"]["p99"] else None)
    return {"switchovers": len(ws), "margin_ms": margin_us / 1e3, "near": n, "other": o, "p99_ratio": ratio,
            "meets_target": ratio is not None and ratio <= 1.5 and n["failed"] == 0}


# Offsets from the end of a switchover that around_switchovers bins by, s.
AROUND_FROM_S, AROUND_TO_S, AROUND_BIN_S = -3.0, 4.0, 0.5


def around_switchovers(records: list[dict], windows: list) -> list[dict]:
    """OK requests by when they were sent relative to the nearest
    switchover's end (the new active serving), in AROUND_BIN_S bins from
    AROUND_FROM_S to AROUND_TO_S: where around a re-provision the latency
    goes (the shadow starting before it, the handover, the replacement
    shadow starting after it). Each bin: its start offset (s), requests,
    p50 and p99 latency (ms)."""
    ends = sorted(int(b) for _, b in windows)
    nbins = round((AROUND_TO_S - AROUND_FROM_S) / AROUND_BIN_S)
    bins: list[list[float]] = [[] for _ in range(nbins)]
    for r in records:
        if r["outcome"] != "ok" or not ends:
            continue
        i = bisect.bisect_left(ends, r["sent"])
        off = min((r["sent"] - ends[j] for j in (i - 1, i) if 0 <= j < len(ends)), key=abs) / 1e6
        k = int((off - AROUND_FROM_S) // AROUND_BIN_S)
        if 0 <= k < nbins:
            bins[k].append((r["answered"] - r["sent"]) / 1e3)
    return [{"from_s": AROUND_FROM_S + k * AROUND_BIN_S, "requests": len(b), "p50_ms": pct(b, .5),
             "p99_ms": pct(b, .99)} for k, b in enumerate(bins)]


# The requests worst_near_switchovers looks at: sent this long before a
# switchover starts to this long after it ends, us.
WORST_BEFORE_US, WORST_AFTER_US = 300_000, 10_000


def worst_near_switchovers(records: list[dict], windows: list) -> dict:
    """Per switchover, the slowest OK request sent from WORST_BEFORE_US
    before it started to WORST_AFTER_US after it ended (what the one
    client unluckiest at that switchover saw); over the switchovers, the
    median of those and how many passed 500 ms. The near/others split
    weighs switchovers by how many requests they held up; this counts each
    once."""
    sent = sorted((r["sent"], r["answered"]) for r in records if r["outcome"] == "ok")
    keys = [t for t, _ in sent]
    worst = []
    for a, b in sorted((int(a), int(b)) for a, b in windows):
        lo, hi = bisect.bisect_left(keys, a - WORST_BEFORE_US), bisect.bisect_right(keys, b + WORST_AFTER_US)
        worst.append(max(((ans - t) / 1e3 for t, ans in sent[lo:hi]), default=0.0))
    return {"per_switchover_ms": worst, "median_ms": pct(worst, .5),
            "over_500ms": sum(1 for w in worst if w > 500.0)}


def impact_result(cur: str, margin_ms: float) -> dict:
    """DIR's impact phase -> result.json."""
    summary = json.loads(host.read(f"{cur}/summary.json").strip().splitlines()[-1])
    windows = next((i.get("switchover_windows_unix_us", []) for i in summary["ifs"] if i["if_id"] == 1), [])
    records = read_records(sorted(glob.glob(f"{cur}/record-if1-*.csv")))
    capacity, rate = (float(v) for v in host.read(f"{cur}/rate.txt").split())
    res = dict(run_facts(read_json(f"{cur}/meta.json"), host.read(f"{cur}/loadavg.end")),
               capacity_ok_per_s=capacity, offered_rps=rate, load_fraction=rate / capacity if capacity else None,
               **switchover_impact(records, windows, int(margin_ms * 1000)))
    res["around_switchovers"] = around_switchovers(records, windows)
    res["worst_near"] = worst_near_switchovers(records, windows)
    res["clients"] = {name: client_totals(read_json_lines(f"{cur}/client-{name}.jsonl")) for name in ("if1", "if5")}
    write_json(f"{cur}/result.json", res)
    return res


def impact_markdown(r: dict) -> list[str]:
    def row(name, g):
        lat = g["latency_ms"]
        f = lambda v: f"{v:.2f}" if v is not None else "-"  # noqa: E731
        return (f"| {name} | {g['requests']} | {g['ok']} | {g['failed']} | {f(lat['p50'])} | {f(lat['p90'])} | "
                f"{f(lat['p99'])} | {f(lat['max'])} |")
    ratio = f"{r['p99_ratio']:.2f}" if r["p99_ratio"] is not None else "-"
    return [f"## Switchovers as clients see them, {r['load_fraction']:.0%} load ({r['date']}, {measured(r)}, CPUs {r['cpus']}, "
            f"load average {' '.join(r['loadavg_at_start'])} -> {' '.join(r['loadavg_at_end'])})\n",
            f"if 1 capacity {r['capacity_ok_per_s']:.1f} OK/s (closed loop); open loop at {r['offered_rps']:.1f} "
            f"req/s; {r['switchovers']} switchovers; near = in flight within {r['margin_ms']:g} ms of one\n",
            "| requests | n | OK | failed | p50 ms | p90 ms | p99 ms | max ms |",
            "|---|---|---|---|---|---|---|---|",
            row("near a switchover", r["near"]), row("all others", r["other"]),
            f"\n- p99 near / others: {ratio} (target at most 1.5, and 0 failed: "
            f"{'met' if r['meets_target'] else 'not met'}); statuses near {r['near']['statuses']}"] + worst_markdown(r) + \
        [""] + around_markdown(r)


def worst_markdown(r: dict) -> list[str]:
    w = r.get("worst_near")
    if not w or w["median_ms"] is None:
        return []
    return [f"- the slowest request sent from {WORST_BEFORE_US // 1000} ms before a switchover to "
            f"{WORST_AFTER_US // 1000} ms after it, per switchover: median {w['median_ms']:.1f} ms; over 500 ms at "
            f"{w['over_500ms']} of {len(w['per_switchover_ms'])} switchovers"]


def around_markdown(r: dict) -> list[str]:
    bins = [b for b in r.get("around_switchovers", []) if b["requests"]]
    if not bins:
        return []
    f = lambda v: f"{v:.1f}" if v is not None else "-"  # noqa: E731
    return ["OK requests by when they were sent, relative to the nearest switchover's end (s):\n",
            "| sent at | " + " | ".join(f"{b['from_s']:+.1f}" for b in bins) + " |",
            "|---|" + "---|" * len(bins),
            "| requests | " + " | ".join(str(b["requests"]) for b in bins) + " |",
            "| p50 ms | " + " | ".join(f(b["p50_ms"]) for b in bins) + " |",
            "| p99 ms | " + " | ".join(f(b["p99_ms"]) for b in bins) + " |", ""]


# --- end to end against the engine alone ---------------------------------------------

def engine_at_mix(engine: list[dict], ok_by_batch: dict) -> dict:
    """The engine alone at the batch mix the IF ran: `ok_by_batch` counts OK
    answers per batch size (a batch of b gives b answers, so it ran
    count/b batches of b); the engine's median batch time at each size
    (kp-engine-bench's JSON lines) gives how long the engine alone takes
    for the same batches. Sizes the engine was not timed at are an error,
    not a guess."""
    median = {int(e["batch"]): float(e["latency_ms"]["median"]) for e in engine}
    mix = {int(b): int(n) for b, n in ok_by_batch.items() if int(n) > 0}
    missing = sorted(b for b in mix if b not in median)
    if missing:
        raise ValueError(f"the engine was not timed at batch sizes {missing} the IF ran")
    images = sum(mix.values())
    engine_s = sum(n / b * median[b] / 1e3 for b, n in mix.items())
    return {"images": images, "engine_seconds": engine_s,
            "images_per_s": images / engine_s if engine_s > 0 else None,
            "mean_batch": images / sum(n / b for b, n in mix.items()) if mix else None,
            "batch_mix": {str(b): mix[b] for b in sorted(mix)},
            "engine_median_ms": {str(b): median[b] for b in sorted(median)}}


def e2e_result(cur: str) -> dict:
    """DIR's e2e phase -> result.json: OK answers/s end to end against the
    engine alone at the same batch sizes (target, issue 11: >= 0.9)."""
    meta = read_json(f"{cur}/meta.json")
    client = read_json(f"{cur}/client.json")
    engine = [e for e in read_json_lines(f"{cur}/engine.jsonl") if e.get("kind") == "engine_bench"]
    ok = client["status"]["ok"]
    span = client["answer_span_s"] or client["send_duration_s"]
    e2e = ok / span if span else 0.0
    alone = engine_at_mix(engine, client.get("ok_by_batch_size", {}))
    ratio = e2e / alone["images_per_s"] if alone["images_per_s"] else None
    res = dict(run_facts(meta, host.read(f"{cur}/loadavg.end")),
               model=meta["if1"]["model"], engine=engine[0]["engine"] if engine else None,
               share_pct=meta["if1"]["share"], concurrency=client.get("concurrency"),
               sent=client["sent"], ok=ok, failed=client["sent"] - ok, seconds=span,
               e2e_ok_per_s=e2e, engine_alone=alone, ratio=ratio,
               meets_target=ratio is not None and ratio >= 0.9 and client["sent"] == ok,
               rtt_us=client.get("rtt_us"), platform_latency_us=client.get("platform_latency_us"))
    write_json(f"{cur}/result.json", res)
    return res


def e2e_markdown(r: dict) -> list[str]:
    a = r["engine_alone"]
    ratio = f"{r['ratio']:.3f}" if r["ratio"] is not None else "-"
    return [f"## End to end against the engine alone ({r['date']}, {measured(r)}, CPUs {r['cpus']}, load average "
            f"{' '.join(r['loadavg_at_start'])} -> {' '.join(r['loadavg_at_end'])})\n",
            f"if 1 {r['model']} ({r['engine']}) at {r['share_pct']}%, closed loop with {r['concurrency']} outstanding "
            f"for {r['seconds']:.1f} s: {r['ok']} OK of {r['sent']}\n",
            "| end to end OK/s | engine alone images/s at the same batches | ratio | mean batch | batch mix |",
            "|---|---|---|---|---|",
            f"| {r['e2e_ok_per_s']:.1f} | {a['images_per_s']:.1f} | {ratio} | {a['mean_batch']:.2f} | "
            f"{', '.join(f'{b}: {n}' for b, n in a['batch_mix'].items())} |\n",
            f"- target at least 0.9, every request OK: {'met' if r['meets_target'] else 'not met'}\n"]


# --- the markdown summary ------------------------------------------------------------

def switchover_markdown(r: dict) -> list[str]:
    g = r["ifs"]["1"]["gap_us"]
    k = r["kp_if"]
    c = r["cmd_to_active_ms"]
    return [f"## Switchover gaps ({r['date']}, {measured(r)}, CPUs {r['cpus']}, load average {' '.join(r['loadavg_at_start'])} -> "
            f"{' '.join(r['loadavg_at_end'])})\n",
            "| switchovers | gap p50 | p90 | p99 | max | min | errors (if 1 + if 5) |",
            "|---|---|---|---|---|---|---|",
            f"| {g['n']} | {g['p50']:.1f} µs | {g['p90']:.1f} µs | {g['p99']:.1f} µs | {g['max']:.1f} µs | "
            f"{g['min']:.1f} µs | {r['errors_total']} |\n"] + [
            f"- {n}: {c['sent']} sent, {c['answered']} answered, {c['unanswered']} unanswered, "
            f"{c['duplicates']} duplicates, status {c['status']}, {c['failed_pieces']} failed pieces"
            for n, c in r["clients"].items()] + [
            f"- handovers with requests in flight: {k['handovers_with_requests_in_flight']} of {k['reports_if1_handed']}; "
            f"{k['handed_in_flight_total']} requests handed back, {k['fragments_forwarded_total']} fragments forwarded, "
            f"{k['forward_lost_total']} lost in forwarding",
            f"- command to active (new process started, model loaded, switched): p50 {c['p50']:.0f} ms, "
            f"p90 {c['p90']:.0f} ms, max {c['max']:.0f} ms\n"]


def convergence_markdown(r: dict) -> list[str]:
    sc = r["scenario"]
    L = [f"## Self-tuning convergence, {r['phase'].split()[-1]} ({r['date']}, {measured(r)}, CPUs {r['cpus']}, load average "
         f"{' '.join(r['loadavg_at_start'])} -> {' '.join(r['loadavg_at_end'])})\n",
         f"if 1 {sc['if1'].get('model', 'squeezenet')} from {sc['if1']['share']}% (SLO {sc['if1']['slo_ms']} ms, "
         f"{sc['if1']['rate']} req/s), "
         f"if 5 {sc['if5'].get('model', 'shufflenet')} from {sc['if5']['share']}% (SLO {sc['if5']['slo_ms']} ms, "
         f"{sc['if5']['rate']} req/s); "
         f"period {sc['tuning_period_ms']} ms, hold-down {sc['hold_down_s']} s, min step {sc['min_step_pct']}; "
         f"stable = no change for {r['stable_window_s']:.0f} s\n",
         f"- converged: {r['converged']}; last share change decided at {r['convergence_decided_s']:.1f} s, "
         f"applied by {r['convergence_applied_s']:.1f} s after the load started; quiet for "
         f"{r['quiet_after_last_change_s']:.0f} s of {r['load_s']:.0f} s",
         f"- share changes: {len(r['share_changes'])}, direction reversals {r['direction_reversals']}",
         f"- decisions under load by reason(/held): {r['reasons_under_load']}"]
    L += [f"  - t={c['decided_s']:6.1f} s if {c['if_id']}: {c['from']:.1f}% -> {c['to']:.1f}%" for c in r["share_changes"]]
    L += [f"- if {i} final: share {f['share_pct']:.1f}%, demand {f['demand_pct']:.1f}%, reasons {f['reasons_last5']}, "
          f"held {f['held_last5']}, latency {f['latency_ms_last5']} ms" for i, f in r["final"].items()]
    L += [f"- {n} client: {c['sent']} sent, status {c['status']}, {c['unanswered']} unanswered, "
          f"RTT p50 {c['rtt_ms_p50']:.1f} ms p99 {c['rtt_ms_p99']:.1f} ms" for n, c in r["clients"].items() if c]
    return L + [f"- cores: {r['kp_if_cores']}"]


def summary(out: str, level: int = 2) -> str:
    """The markdown of every phase under OUT that has a result.json, each
    under a heading of LEVEL."""
    L = []
    s = f"{out}/switchover/result.json"
    if os.path.exists(s):
        L += switchover_markdown(read_json(s))
    for s in sorted(glob.glob(f"{out}/convergence-*/result.json")):
        L += convergence_markdown(read_json(s))
    for s in sorted(glob.glob(f"{out}/impact-*/result.json")):
        L += impact_markdown(read_json(s))
    s = f"{out}/e2e/result.json"
    if os.path.exists(s):
        L += e2e_markdown(read_json(s))
    L = ["#" * level + l[2:] if l.startswith("## ") else l for l in L]
    return "".join(l + "\n" for l in L)


DOC_SECTION = "bench-orchestrator"
DOC_BY = "scripts/bench-orchestrator.sh"


def update_docs(out: str, doc: Path) -> bool:
    """DOC's bench-orchestrator section replaced by OUT's summary (each
    phase under a level-4 heading); False where DOC has no such section."""
    return docsection.update(doc, DOC_SECTION, DOC_BY, summary(out, level=4))


# --- files ---------------------------------------------------------------------------

def read_json(path: str):
    with open(path) as f:
        return json.load(f)


def read_json_lines(path: str) -> list:
    with open(path) as f:
        return [json.loads(l) for l in f]


def write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def write_json(path: str, value) -> None:
    with open(path, "w") as f:
        json.dump(value, f, indent=1)


# --- command line ----------------------------------------------------------------------

def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    sub = ap.add_subparsers(dest="command", required=True)
    m = sub.add_parser("meta", help="the run's settings and machine -> FILE")
    m.add_argument("file")
    m.add_argument("phase")
    m.add_argument("--repo", required=True)
    m.add_argument("--cpus", required=True)
    m.add_argument("--frag-gap", required=True)
    m.add_argument("--if-manager-cpu", type=int, required=True)
    m.add_argument("--model1", default="squeezenet")
    m.add_argument("--model5", default="shufflenet")
    m.add_argument("--af-packet-frames", type=int, default=None)
    for name in ("switchovers", "settle-s", "concurrency", "chunk-s", "conv-duration-s", "tuning-period-ms",
                 "hold-down-s", "min-step-pct", "stable-k"):
        m.add_argument(f"--{name}", type=host.number, required=True)
    for i in ("if1", "if5"):
        m.add_argument(f"--{i}", type=host.number, nargs=3, metavar=("SHARE", "SLO_MS", "RATE"), required=True)
    for name in ("switchover", "convergence", "e2e"):
        sub.add_parser(name, help=f"DIR's {name} results").add_argument("dir")
    i = sub.add_parser("impact", help="DIR's impact results")
    i.add_argument("dir")
    i.add_argument("--margin-ms", type=float, default=10.0)
    sub.add_parser("summary", help="the markdown summary of OUT").add_argument("out")
    d = sub.add_parser("docs", help=f"DOC's {DOC_SECTION} section replaced by OUT's summary")
    d.add_argument("out")
    d.add_argument("doc", type=Path)
    return ap


def main() -> int:
    a = parser().parse_args()
    if a.command == "meta":
        write_json(a.file, meta(a))
    elif a.command == "switchover":
        print(json.dumps(switchover_result(a.dir), indent=1))
    elif a.command == "convergence":
        print(json.dumps(convergence_result(a.dir), indent=1))
    elif a.command == "e2e":
        print(json.dumps(e2e_result(a.dir), indent=1))
    elif a.command == "impact":
        print(json.dumps(impact_result(a.dir, a.margin_ms), indent=1))
    elif a.command == "summary":
        sys.stdout.write(summary(a.out))
    elif a.command == "docs":
        if not update_docs(a.out, a.doc):
            print(f"{a.doc}: no {DOC_SECTION} markers: section not updated (paste {a.out}/summary.md)",
                  file=sys.stderr)
            return 1
        print(f"updated the {DOC_SECTION} section of {a.doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
