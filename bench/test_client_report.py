"""Unit tests of bench/client_report.py: what docs/PERFORMANCE.md's
generated bench-client section says, from bench_client.py's summaries.

    .venv/bin/python -m unittest bench/test_client_report.py
"""

from __future__ import annotations

import io
import json
import sys
import tempfile
import unittest
from contextlib import redirect_stdout
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import client_report  # noqa: E402


def spread(median: float, lo: float, hi: float) -> dict:
    return {"median": median, "min": lo, "max": hi}


def summary(c: int, kp: tuple, py: tuple, ratio: tuple, ok_ratio: tuple, added: tuple, submit_p50: float,
            rounds: int = 5, duration_s: float = 3.0) -> dict:
    """bench_client.py's last line (its summary) for concurrency C; the
    OK-only rates, p99s and overhead are not in the report."""
    return {"concurrency": c, "duration_s": duration_s, "rounds": rounds,
            "kp_client_rate": spread(*kp), "python_rate": spread(*py), "ratio": spread(*ratio),
            "kp_client_ok_rate": spread(*kp), "python_ok_rate": spread(*py), "ok_ratio": spread(*ok_ratio),
            "python_added_us": {"p50": added[0], "p90": added[1], "p99": 2 * added[1]},
            "submit_us": {"p50": submit_p50, "p90": 1.5 * submit_p50, "p99": 2 * submit_p50},
            "overhead_us": {"p50": added[0] + submit_p50, "p90": 0.0, "p99": 0.0}, "samples": 1000}


# As bench_client.sh measured them at 65e745c (docs/PERFORMANCE.md, issue 12).
RUN = [
    summary(1, (118.2, 117.9, 119.9), (116.5, 114.2, 120.6), (0.986, 0.968, 1.006), (0.986, 0.968, 1.006),
            (97.5, 145.0), 597.0),
    summary(2, (129.1, 126.3, 149.5), (147.3, 146.1, 149.4), (1.147, 0.999, 1.156), (1.147, 0.999, 1.156),
            (54.2, 77.0), 512.0),
    summary(4, (267.3, 213.0, 290.9), (265.7, 244.1, 274.0), (0.987, 0.839, 1.255), (0.993, 0.835, 1.179),
            (63.1, 119.0), 515.0),
    summary(8, (303.5, 291.2, 327.8), (285.8, 259.2, 310.0), (0.922, 0.854, 1.064), (1.017, 0.967, 1.030),
            (63.5, 92.0), 500.0),
]
LINE = "2026-11-30 05:00 UTC, commit abc1234, AMD EPYC, 2 CPUs"
COMMAND = "bench/bench_client.sh --concurrency C --rounds 5 --duration 3"


def with_ratio(s: dict, median: float) -> dict:
    return {**s, "ratio": spread(median, median - 0.05, median + 0.05)}


def with_added_p50(s: dict, p50: float) -> dict:
    return {**s, "python_added_us": {**s["python_added_us"], "p50": p50}}


class Report(unittest.TestCase):
    def test_a_row_per_concurrency_and_both_targets_met(self):
        md = client_report.markdown(RUN, LINE, COMMAND)
        self.assertIn(f"#### The Python client against kp-client ({LINE})", md)
        self.assertIn(f"`{COMMAND}` at each concurrency C below: 5 rounds of 3 s per client", md)
        self.assertIn("| C | kp-client req/s (any status), median (min–max) | Python req/s "
                      "| ratio Python / kp-client, median (min–max) | ratio, OK answers only "
                      "| `python_added` p50 / p90 µs | `submit` p50 µs |", md)
        self.assertIn("| 1 | 118.2 (117.9–119.9) | 116.5 (114.2–120.6) | **0.986** (0.968–1.006) "
                      "| 0.986 (0.968–1.006) | **97.5** / 145 | 597 |", md)
        self.assertIn("| 8 | 303.5 (291.2–327.8) | 285.8 (259.2–310.0) | **0.922** (0.854–1.064) "
                      "| 1.017 (0.967–1.030) | **63.5** / 92 | 500 |", md)
        self.assertEqual(md.count("\n| "), 1 + len(RUN))  # the header, a row per C
        self.assertIn("Python rate ≥ 0.90 of kp-client's at the same concurrency: **met** "
                      "(the lowest median ratio, 0.922, C = 8)", md)
        self.assertIn("(`python_added`) p50 < 100 µs: **met** (the highest p50, 97.5 µs, C = 1).", md)

    def test_each_target_on_both_sides_of_its_threshold(self):
        for ratio, verdict in ((0.900, "met"), (0.899, "not met")):
            md = client_report.markdown([RUN[0], with_ratio(RUN[2], ratio)], LINE, COMMAND)
            self.assertIn(f"concurrency: **{verdict}** (the lowest median ratio, {ratio:.3f}, C = 4)", md)
        for p50, verdict in ((99.9, "met"), (100.0, "not met")):
            md = client_report.markdown([with_added_p50(RUN[1], p50), RUN[3]], LINE, COMMAND)
            self.assertIn(f"p50 < 100 µs: **{verdict}** (the highest p50, {p50:.1f} µs, C = 2)", md)

    def test_no_ok_answer_to_time_misses_the_overhead_target(self):
        md = client_report.markdown([RUN[0], with_added_p50(RUN[3], float("nan"))], LINE, COMMAND)
        self.assertIn("p50 < 100 µs: **not met** (the highest p50, nan µs, C = 8)", md)

    def test_main_reads_the_summaries_in_any_order_and_names_differing_rounds(self):
        with tempfile.TemporaryDirectory() as d:
            paths = []
            for s in (RUN[3], {**RUN[0], "rounds": 3}):
                p = Path(d) / f"{s['concurrency']}.json"
                p.write_text(json.dumps(s))
                paths.append(str(p))
            out = io.StringIO()
            with redirect_stdout(out):
                rc = client_report.main(["--run-line", LINE, "--command", COMMAND, *paths])
            self.assertEqual(rc, 0)
            md = out.getvalue()
            self.assertIn("3 or 5 rounds of 3 s per client", md)
            self.assertLess(md.index("\n| 1 |"), md.index("\n| 8 |"))


if __name__ == "__main__":
    unittest.main()
