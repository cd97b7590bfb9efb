#!/usr/bin/env python3
"""Markdown tables from the summaries tests/overload.rs writes
(`KP_OVERLOAD_OUT`, `make overload`): what docs/RELIABILITY.md
"Overload" reports, generated rather than typed.

    scripts/overload_report.py SUMMARY.json [SUMMARY.json ...]

Standard library only.
"""

import json
import statistics
import sys


def fmt(v, digits=0):
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def run_table(runs):
    out = [
        "| run | commit | load avg (start → end) | capacity if 1, req/s (runs) | if 5 alone | "
        "2×: excess asked / sent, req/s | 10×: excess asked / sent | send lag p99 2× / 10×, ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for i, (name, d) in enumerate(runs, 1):
        loads = d.get("loadavg_at_phase_end", [])
        load = f"{loads[0]['loadavg'].split()[0]} → {loads[-1]['loadavg'].split()[0]}" if loads else "-"
        caps = " / ".join(fmt(c) for c in d.get("capacity_runs_rps", []))
        o = {x["phase"]: x for x in d["offered"]}
        lag = " / ".join(fmt(o[p]["lag_us"]["p99"] / 1e3, 1) for p in ("2x", "10x"))
        out.append(
            f"| {i} | {d.get('commit', '-')} | {load} | "
            f"{fmt(d['capacity_rps']['hot_beside_other_half'])} ({caps}) | "
            f"{fmt(d['capacity_rps']['other_alone'])} | "
            f"{fmt(o['2x']['excess_rate_asked'])} / {fmt(o['2x']['excess_rate_sent'])} | "
            f"{fmt(o['10x']['excess_rate_asked'])} / {fmt(o['10x']['excess_rate_sent'])} | {lag} |"
        )
    return "\n".join(out)


def phase_table(name, d):
    served = {(s["phase"], s["if_id"]): s for s in d["served_platform"]}
    base_other = next(p for p in d["phases"] if p["phase"] == "baseline")["other"]["ok_rtt_p99_ms"]
    out = [
        f"Run {name}, per phase (if 1 = squeezenet, overloaded; if 5 = shufflenet at half load; "
        f"SLO {fmt(d['slo_ms'])} ms; round trips are the clients' own, from the scheduled send "
        "time; 'beyond SLO' is the platform's count of OK answers whose latency exceeded it):",
        "",
        "| phase | s | if 1 offered req/s | if 1 OK / OVERLOADED / other | if 1 goodput req/s | "
        "if 1 OK rtt p50 / p99 ms | if 1 beyond SLO (platform) | if 5 OK / OVERLOADED | "
        "if 5 OK rtt p99 ms | vs baseline |",
        "|---|---:|---:|---|---:|---|---|---|---:|---:|",
    ]
    for p in d["phases"]:
        h, o = p["hot"], p["other"]
        ho = h["outcomes"]
        other = sum(v for k, v in ho.items() if k not in ("ok", "overloaded"))
        s1 = served.get((p["phase"], 1), {})
        oo = o["outcomes"]
        ratio = (
            fmt(o["ok_rtt_p99_ms"] / base_other, 2) + "×"
            if o["ok_rtt_p99_ms"] and base_other
            else "-"
        )
        out.append(
            f"| {p['phase']} | {fmt(p['seconds'])} | {fmt(h['offered_rps'])} | "
            f"{ho.get('ok', 0)} / {ho.get('overloaded', 0)} / {other} | {fmt(h['goodput_rps'])} | "
            f"{fmt(h['ok_rtt_p50_ms'], 1)} / {fmt(h['ok_rtt_p99_ms'], 1)} | "
            f"{fmt(s1.get('beyond_slo'))} of {fmt(s1.get('ok'))} | "
            f"{oo.get('ok', 0)} / {oo.get('overloaded', 0)} | {fmt(o['ok_rtt_p99_ms'], 1)} | {ratio} |"
        )
    return "\n".join(out)


def recovery_table(runs):
    out = [
        "| run | after | first 250 ms bin all OK within SLO, ms after the overload stopped | "
        "from then on every bin, ms |",
        "|---|---|---:|---:|",
    ]
    for i, (name, d) in enumerate(runs, 1):
        for r in d["recovery"]:
            out.append(
                f"| {i} | {r['after']} | {fmt(r['first_good_bin_ms'])} | {fmt(r['settled_ms'])} |"
            )
    return "\n".join(out)


def memory_table(runs):
    out = [
        "| run | process | VmRSS end of baseline, MiB | largest after, MiB | growth, MiB |",
        "|---|---|---:|---:|---:|",
    ]
    for i, (name, d) in enumerate(runs, 1):
        for m in d["memory"]:
            b, x = m["baseline_kib"] / 1024, m["max_kib"] / 1024
            out.append(f"| {i} | {m['process']} | {b:.1f} | {x:.1f} | {x - b:.1f} |")
    return "\n".join(out)


def medians(runs):
    """Median and range over runs of the figures the issue names."""
    rows = []

    def per_run(f):
        vals = [f(d) for _, d in runs]
        vals = [v for v in vals if v is not None]
        if not vals:
            return "-"
        return f"{statistics.median(vals):.2f} ({min(vals):.2f} to {max(vals):.2f})"

    def phase(d, name):
        return next(p for p in d["phases"] if p["phase"] == name)

    def ratio(d, name):
        b = phase(d, "baseline")["other"]["ok_rtt_p99_ms"]
        v = phase(d, name)["other"]["ok_rtt_p99_ms"]
        return v / b if b and v else None

    def goodput_ratio(d, name):
        return phase(d, name)["hot"]["goodput_rps"] / d["capacity_rps"]["hot_beside_other_half"]

    def beyond(d, name):
        s = next(s for s in d["served_platform"] if s["phase"] == name and s["if_id"] == 1)
        return 100.0 * s["beyond_slo"] / s["ok"] if s["ok"] else None

    for name in ("2x", "10x"):
        rows.append((f"if 1 goodput in {name}, × capacity", per_run(lambda d: goodput_ratio(d, name))))
        rows.append((f"if 1 OK answers beyond SLO in {name}, % (platform)", per_run(lambda d: beyond(d, name))))
        rows.append((f"if 1 OK rtt p99 in {name}, ms", per_run(lambda d: phase(d, name)["hot"]["ok_rtt_p99_ms"])))
        rows.append((f"if 5 OK rtt p99 in {name} / baseline", per_run(lambda d: ratio(d, name))))
    for i, after in enumerate(("2x", "10x")):
        rows.append((f"first all-good bin after {after}, ms", per_run(lambda d: d["recovery"][i]["first_good_bin_ms"])))
    out = [f"Over {len(runs)} runs: median (smallest to largest).", "", "| figure | value |", "|---|---|"]
    out += [f"| {a} | {b} |" for a, b in rows]
    return "\n".join(out)


def main(paths):
    runs = [(p, json.load(open(p))) for p in paths]
    print(run_table(runs))
    print()
    print(medians(runs))
    print()
    for i, (_, d) in enumerate(runs, 1):
        print(phase_table(str(i), d))
        print()
    print(recovery_table(runs))
    print()
    print(memory_table(runs))


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
