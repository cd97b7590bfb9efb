"""Unit tests of bench/criterion_report.py on a criterion results folder
laid out as criterion 0.5 leaves it.

    .venv/bin/python -m unittest bench/test_criterion_report.py
"""

from __future__ import annotations

import json
import sys
import tempfile
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import criterion_report as cr  # noqa: E402


def write(group: Path, name: str, median_ns: float, lo: float, hi: float, elements: int | None):
    d = group / name / "new"
    d.mkdir(parents=True)
    b = {"group_id": group.name, "function_id": name, "full_id": f"{group.name}/{name}",
         "throughput": {"Elements": elements} if elements else None}
    (d / "benchmark.json").write_text(json.dumps(b))
    e = {k: {"confidence_interval": {"confidence_level": 0.95, "lower_bound": lo, "upper_bound": hi},
             "point_estimate": median_ns, "standard_error": 1.0} for k in ("mean", "median", "std_dev")}
    e["mean"]["point_estimate"] = 2 * median_ns  # the report quotes the median, not the mean
    (d / "estimates.json").write_text(json.dumps(e))


class Report(unittest.TestCase):
    def test_per_iteration_and_per_element_from_the_median(self):
        with tempfile.TemporaryDirectory() as t:
            g = Path(t) / "if-manager"
            write(g, "classify+route 1KiB fragment", 2520.0, 2500.0, 2560.0, 256)
            (g / "report").mkdir()  # criterion's html folder: not a benchmark
            bs = cr.benchmarks(g)
            self.assertEqual(len(bs), 1)
            md = cr.markdown(bs, "2026-11-29 16:00 UTC, commit abc, EPYC, 2 CPUs", "scripts/bench-classify.sh")
            self.assertIn("#### The sans-IO core per packet (2026-11-29 16:00 UTC, commit abc, EPYC, 2 CPUs)", md)
            self.assertIn("| if-manager/classify+route 1KiB fragment | 2.520 µs [2.500–2.560] | 256 | "
                          "**9.84 ns** [9.77–10.00] | 102 M |", md)
            self.assertIn("95% confidence interval", md)

    def test_a_benchmark_without_throughput_is_one_element_and_an_empty_group_is_an_error(self):
        with tempfile.TemporaryDirectory() as t:
            g = Path(t) / "g"
            write(g, "b", 50.0, 49.0, 51.0, None)
            self.assertEqual(cr.benchmarks(g)[0]["elements"], 1)
            self.assertEqual(cr.main([str(Path(t) / "none"), "now"]), 1)


if __name__ == "__main__":
    unittest.main()
