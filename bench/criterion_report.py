"""docs/PERFORMANCE.md's generated section of a criterion benchmark
(scripts/bench-classify.sh: the if-manager's sans-IO core, classify and
route one 1 KiB fragment frame): each benchmark of a criterion group as
criterion left it in target/criterion/<group>/<benchmark>/new/
(benchmark.json: its id and throughput; estimates.json: nanoseconds per
iteration), per iteration and per element with criterion's 95% confidence
interval. Standard library only; tested in bench/test_criterion_report.py.

    criterion_report.py GROUP_DIR RUN_LINE   # markdown on stdout
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def benchmarks(group: Path) -> list[dict]:
    """Each benchmark of a criterion group folder: its id, the elements
    one iteration handles (1 without a throughput) and criterion's median
    estimate of an iteration (ns: point, lower and upper bound of the
    confidence interval), sorted by id. Empty where criterion left none."""
    out = []
    for meta in sorted(group.glob("*/new/benchmark.json")):
        b = json.loads(meta.read_text())
        est = json.loads((meta.parent / "estimates.json").read_text())["median"]
        elements = (b.get("throughput") or {}).get("Elements") or 1
        ci = est["confidence_interval"]
        out.append({"id": b.get("full_id") or meta.parent.parent.name, "elements": int(elements),
                    "ns": est["point_estimate"], "lo": ci["lower_bound"], "hi": ci["upper_bound"],
                    "confidence": ci.get("confidence_level", 0.95)})
    return sorted(out, key=lambda b: b["id"])


def markdown(benches: list[dict], run_line: str, command: str) -> str:
    L = [f"#### The sans-IO core per packet ({run_line})", "",
         f"`{command}` (criterion; the median of its samples, in brackets its "
         f"{100 * (benches[0]['confidence'] if benches else 0.95):.0f}% confidence interval):", "",
         "| benchmark | per iteration | elements per iteration | per element | elements/s |", "|---|---|---|---|---|"]
    for b in benches:
        n = b["elements"]
        L.append(f"| {b['id']} | {b['ns'] / 1000:.3f} µs [{b['lo'] / 1000:.3f}–{b['hi'] / 1000:.3f}] | {n} | "
                 f"**{b['ns'] / n:.2f} ns** [{b['lo'] / n:.2f}–{b['hi'] / n:.2f}] | {1e3 * n / b['ns']:.0f} M |")
    return "\n".join(L) + "\n"


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3):
        print("usage: criterion_report.py GROUP_DIR RUN_LINE [COMMAND]", file=sys.stderr)
        return 2
    benches = benchmarks(Path(argv[0]))
    if not benches:
        print(f"criterion_report.py: no benchmark results in {argv[0]}", file=sys.stderr)
        return 1
    print(markdown(benches, argv[1], argv[2] if len(argv) == 3 else "cargo bench"), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
