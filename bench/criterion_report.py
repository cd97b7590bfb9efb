"""docs/PERFORMANCE.md's generated section of a criterion benchmark
(scripts/bench-classify.sh: the if-manager's sans-IO core, classify and
route one 1 KiB fragment frame; scripts/bench-layout.sh: libml's input
conversion on copy): each benchmark of one or more criterion groups as
criterion left them in target/criterion/<group>/<benchmark>/new/
(benchmark.json: its id and throughput; estimates.json: nanoseconds per
iteration), per iteration and per element, or in GB/s where the benchmark
counts bytes, with criterion's 95% confidence interval. Standard library
only; tested in bench/test_criterion_report.py.

    criterion_report.py --title TITLE --run-line LINE [--command CMD] GROUP_DIR...   # markdown on stdout
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def benchmarks(group: Path) -> list[dict]:
    """Each benchmark of a criterion group folder: its id, what one
    iteration handles (unit "Elements" or "Bytes" and how many; 1 element
    without a throughput) and criterion's median estimate of an iteration
    (ns: point, lower and upper bound of the confidence interval), sorted by
    id. Empty where criterion left none."""
    out = []
    for meta in sorted(group.glob("*/new/benchmark.json")):
        b = json.loads(meta.read_text())
        bid = b.get("full_id") or meta.parent.parent.name
        est = json.loads((meta.parent / "estimates.json").read_text())["median"]
        unit, n = next(iter((b.get("throughput") or {"Elements": 1}).items()))
        if unit not in ("Elements", "Bytes"):
            raise ValueError(f"{bid}: a throughput in {unit} is not rendered")
        ci = est["confidence_interval"]
        out.append({"id": bid, "unit": unit, "n": int(n),
                    "ns": est["point_estimate"], "lo": ci["lower_bound"], "hi": ci["upper_bound"],
                    "confidence": ci.get("confidence_level", 0.95)})
    return sorted(out, key=lambda b: b["id"])


def duration(b: dict) -> str:
    """An iteration's median and interval in ns below a microsecond, else µs."""
    if b["ns"] < 1000:
        return f"{b['ns']:.1f} ns [{b['lo']:.1f}–{b['hi']:.1f}]"
    return f"{b['ns'] / 1000:.2f} µs [{b['lo'] / 1000:.2f}–{b['hi'] / 1000:.2f}]"


def elements_table(benches: list[dict]) -> list[str]:
    L = ["| benchmark | per iteration | elements per iteration | per element | elements/s |", "|---|---|---|---|---|"]
    for b in benches:
        n = b["n"]
        L.append(f"| {b['id']} | {b['ns'] / 1000:.3f} µs [{b['lo'] / 1000:.3f}–{b['hi'] / 1000:.3f}] | {n} | "
                 f"**{b['ns'] / n:.2f} ns** [{b['lo'] / n:.2f}–{b['hi'] / n:.2f}] | {1e3 * n / b['ns']:.0f} M |")
    return L


def bytes_table(benches: list[dict]) -> list[str]:
    """Bytes per nanosecond are GB/s (10^9 bytes/s); the slower bound of the
    interval is the lower rate."""
    L = ["| benchmark | per iteration | bytes per iteration | GB/s |", "|---|---|---|---|"]
    for b in benches:
        n = b["n"]
        L.append(f"| {b['id']} | {duration(b)} | {n} | **{n / b['ns']:.2f}** [{n / b['hi']:.2f}–{n / b['lo']:.2f}] |")
    return L


def markdown(benches: list[dict], title: str, run_line: str, command: str) -> str:
    """The report: a table of the benchmarks counting elements (or nothing),
    then one of those counting bytes, each where there are any."""
    L = [f"#### {title} ({run_line})", "",
         f"`{command}` (criterion; the median of its samples, in brackets its "
         f"{100 * (benches[0]['confidence'] if benches else 0.95):.0f}% confidence interval):"]
    for unit, table in (("Elements", elements_table), ("Bytes", bytes_table)):
        rows = [b for b in benches if b["unit"] == unit]
        if rows:
            L += [""] + table(rows)
    return "\n".join(L) + "\n"


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("groups", nargs="+", metavar="GROUP_DIR", help="target/criterion/<group>, in the report's order")
    ap.add_argument("--title", required=True, help="the heading, before the run line")
    ap.add_argument("--run-line", required=True, help="when, the commit, the machine (bench/host.py run-line)")
    ap.add_argument("--command", default="cargo bench", help="what ran the benchmark, as the report names it")
    a = ap.parse_args(argv)
    benches = []
    for group in a.groups:
        found = benchmarks(Path(group))
        if not found:
            print(f"criterion_report.py: no benchmark results in {group}", file=sys.stderr)
            return 1
        benches += found
    print(markdown(benches, a.title, a.run_line, a.command), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
