#!/usr/bin/env python3
"""Prints the if-manager's final counters next to what kp-gen's manifest says
they must be. Usage: show_stats.py STATS.json [MANIFEST.json]"""
import json
import sys


def main() -> int:
    stats = json.load(open(sys.argv[1]))
    manifest = json.load(open(sys.argv[2])) if len(sys.argv) > 2 else None
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
    rows.append(("sent (UNKNOWN_IF errors)", stats["tx"]["sent"], want.get("unknown_if_answered")))
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
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
