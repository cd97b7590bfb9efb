#!/usr/bin/env python3
"""Prints the if-manager's final counters next to what kp-gen's manifest says
they must be, and (with --ifs REPORT.json from run-pcap.sh) a table per
inference function. Usage: show_stats.py STATS.json [MANIFEST.json] [--ifs REPORT.json]"""
import json
import sys


def if_table(report, manifest):
    expected = {}
    for r in (manifest or {}).get("requests", []):
        expected.setdefault(r["if_id"], {}).setdefault(r["expected"], 0)
        expected[r["if_id"]][r["expected"]] += 1
    print("\ninference functions")
    cols = ["model", "if", "requests", "ok", "bad_req", "incompl", "overload", "internal",
            "req/s", "p50 ms", "p99 ms", "batch"]
    print("  ".join(f"{c:>9}" for c in cols))
    for name, r in report["ifs"].items():
        t = r["telemetry"]
        a = t["answers"]
        row = [name, r["if_id"], t["arrivals"], a["ok"], a["bad_request"], a["incomplete"],
               a["overloaded"], a["internal"], f"{t['mean_throughput_per_s']:.1f}",
               f"{t['latency_us']['p50'] / 1000:.1f}", f"{t['latency_us']['p99'] / 1000:.1f}",
               f"{t['mean_batch_size']:.2f}"]
        print("  ".join(f"{str(c):>9}" for c in row))
        want = expected.get(r["if_id"])
        if want:
            print(f"{'':>9}  expected: " + ", ".join(f"{k} {v}" for k, v in sorted(want.items())))


def main() -> int:
    args = [a for a in sys.argv[1:]]
    ifs = None
    if "--ifs" in args:
        i = args.index("--ifs")
        ifs = json.load(open(args[i + 1]))
        del args[i:i + 2]
    stats = json.load(open(args[0]))
    manifest = json.load(open(args[1])) if len(args) > 1 else None
    want = (manifest or {}).get("totals", {}).get("if_manager") or {}
    totals = (manifest or {}).get("totals", {})

    rows = [("received", stats["rx_packets"], totals.get("packets"))]
    for name, n in stats["outcomes"].items():
        rows.append((name, n, want.get(name, 0 if want else None)))
    for name, n in stats["not_for_us"].items():
        if n or (totals.get("not_for_us") or {}).get(name):
            rows.append(("  not_for_us." + name, n, (totals.get("not_for_us") or {}).get(name, 0)))
    for name, n in stats["malformed"].items():
        if n or (totals.get("malformed") or {}).get(name):
            rows.append(("  malformed." + name, n, (totals.get("malformed") or {}).get(name, 0)))
    if ifs is None:
        rows.append(("sent (UNKNOWN_IF errors)", stats["tx"]["sent"], want.get("unknown_if_answered")))
    else:
        answered = sum(1 for r in (manifest or {}).get("requests", []) if r["expected"] != "none")
        rows.append(("answers sent (all requests)", stats["tx"]["sent"], answered if manifest else None))
    for r in stats.get("ifs", []):
        per_if = (want.get("delivered_per_if") or {}).get(str(r["if_id"]))
        rows.append((f"if {r['if_id']} delivered", r["delivered"], per_if))
    rows.append(("mbufs in use at exit", stats["mempool"]["in_use_at_exit"], 0))

    width = max(len(r[0]) for r in rows)
    print(f"\n{'counter':<{width}}  {'got':>8}  {'expected':>8}")
    bad = 0
    for name, got, exp in rows:
        mark = "" if exp is None or got == exp else "  <-- differs"
        bad += bool(mark)
        print(f"{name:<{width}}  {got:>8}  {'' if exp is None else exp:>8}{mark}")
    print(f"\nstopped: {stats['stop_reason']} after {stats['run_seconds']:.2f} s;"
          f" {'all counters as expected' if not bad else f'{bad} counters differ'}")
    if ifs is not None:
        if_table(ifs, manifest)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
