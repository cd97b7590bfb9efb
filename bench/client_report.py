"""docs/PERFORMANCE.md's generated section of the Python client against
kp-client (issue 12): bench/bench_client.py's summaries (its last line,
JSON), one per concurrency, as bench/bench_client_all.sh collects them, in
one table, with the two targets judged: the Python client's rate >= 0.90
of kp-client's at every concurrency, and its per-request overhead
(python_added) under 100 µs p50 at every concurrency. Standard library
only (no numpy, no kneepoint); tested in bench/test_client_report.py.

    client_report.py --run-line LINE --command CMD SUMMARY.json...   # markdown on stdout
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

RATE_TARGET = 0.90  # Python's rate over kp-client's, at the same concurrency
ADDED_TARGET_US = 100.0  # python_added p50


def spread(x: dict[str, float], nd: int, bold: bool = False) -> str:
    """A summary figure's median (min–max) over rounds; the median bold."""
    median = f"{x['median']:.{nd}f}"
    return f"{f'**{median}**' if bold else median} ({x['min']:.{nd}f}–{x['max']:.{nd}f})"


def distinct(summaries: list[dict[str, Any]], key: str) -> str:
    """KEY's values over the summaries, each once: "5", or "3 or 5"."""
    return " or ".join(f"{v:g}" for v in sorted({s[key] for s in summaries}))


def added_p50(s: dict[str, Any]) -> float:
    """python_added's p50; infinite where there was no OK answer to time
    (bench_client.py writes NaN), so that it is the highest and misses."""
    p50 = s["python_added_us"]["p50"]
    return math.inf if math.isnan(p50) else p50


def markdown(summaries: list[dict[str, Any]], run_line: str, command: str) -> str:
    """The report: a row per concurrency (in increasing order), then the
    targets, each judged on its worst concurrency."""
    rows = sorted(summaries, key=lambda s: s["concurrency"])
    L = [f"#### The Python client against kp-client ({run_line})", "",
         f"`{command}` at each concurrency C below: {distinct(rows, 'rounds')} rounds of "
         f"{distinct(rows, 'duration_s')} s per client, kp-client and the Python client alternating; "
         "rates and ratios are the median (min–max) over rounds, `python_added` and `submit` percentiles "
         "over all OK requests of all rounds.", "",
         "| C | kp-client req/s (any status), median (min–max) | Python req/s "
         "| ratio Python / kp-client, median (min–max) | ratio, OK answers only "
         "| `python_added` p50 / p90 µs | `submit` p50 µs |",
         "|---|---|---|---|---|---|---|"]
    for s in rows:
        added = s["python_added_us"]
        L.append(f"| {s['concurrency']} | {spread(s['kp_client_rate'], 1)} | {spread(s['python_rate'], 1)} "
                 f"| {spread(s['ratio'], 3, bold=True)} | {spread(s['ok_ratio'], 3)} "
                 f"| **{added['p50']:.1f}** / {added['p90']:.0f} | {s['submit_us']['p50']:.0f} |")
    slowest = min(rows, key=lambda s: s["ratio"]["median"])
    costliest = max(rows, key=added_p50)
    rate_met = slowest["ratio"]["median"] >= RATE_TARGET
    added_met = added_p50(costliest) < ADDED_TARGET_US
    L += ["", f"Targets (issue 12): Python rate ≥ {RATE_TARGET:.2f} of kp-client's at the same concurrency: "
          f"**{'met' if rate_met else 'not met'}** (the lowest median ratio, {slowest['ratio']['median']:.3f}, "
          f"C = {slowest['concurrency']}); per-request overhead (`python_added`) p50 < {ADDED_TARGET_US:.0f} µs: "
          f"**{'met' if added_met else 'not met'}** (the highest p50, "
          f"{costliest['python_added_us']['p50']:.1f} µs, C = {costliest['concurrency']})."]
    return "\n".join(L) + "\n"


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("summaries", nargs="+", metavar="SUMMARY.json", help="bench_client.py's last line, one per C")
    ap.add_argument("--run-line", required=True, help="when, the commit, the machine (bench/host.py run-line)")
    ap.add_argument("--command", required=True, help="what ran each concurrency, as the report names it")
    a = ap.parse_args(argv)
    print(markdown([json.loads(Path(p).read_text()) for p in a.summaries], a.run_line, a.command), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
