"""Unit tests of bench/criterion_report.py on a criterion results folder
laid out as criterion 0.8 leaves it.

    .venv/bin/python -m unittest bench/test_criterion_report.py
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
import criterion_report as cr  # noqa: E402


def write(group: Path, name: str, median_ns: float, lo: float, hi: float, elements: int | None,
          unit: str = "Elements"):
    """A benchmark as criterion leaves it: in a folder named after its id
    with / made _, its throughput {unit: elements} or null."""
    d = group / name.replace("/", "_") / "new"
    d.mkdir(parents=True)
    b = {"group_id": group.name, "function_id": name, "full_id": f"{group.name}/{name}",
         "throughput": {unit: elements} if elements else None}
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
            md = cr.markdown(bs, "The sans-IO core per packet", "2026-11-29 16:00 UTC, commit abc, EPYC, 2 CPUs",
                             "scripts/bench-classify.sh")
            self.assertIn("#### The sans-IO core per packet (2026-11-29 16:00 UTC, commit abc, EPYC, 2 CPUs)", md)
            self.assertIn("| if-manager/classify+route 1KiB fragment | 2.520 µs [2.500–2.560] | 256 | "
                          "**9.84 ns** [9.77–10.00] | 102 M |", md)
            self.assertIn("95% confidence interval", md)

    def test_a_benchmark_without_throughput_is_one_element_and_an_empty_group_is_an_error(self):
        with tempfile.TemporaryDirectory() as t:
            g = Path(t) / "g"
            write(g, "b", 50.0, 49.0, 51.0, None)
            self.assertEqual((cr.benchmarks(g)[0]["unit"], cr.benchmarks(g)[0]["n"]), ("Elements", 1))
            self.assertEqual(cr.main(["--title", "T", "--run-line", "now", str(Path(t) / "none")]), 1)

    def test_the_classify_report_is_as_before(self):
        with tempfile.TemporaryDirectory() as t:
            g = Path(t) / "if-manager"
            write(g, "classify+route 1KiB fragment", 3503.0, 3484.0, 3529.0, 256)
            out = io.StringIO()
            with redirect_stdout(out):
                rc = cr.main(["--title", "The sans-IO core per packet", "--run-line",
                              "2026-11-29 16:36 UTC, commit fdff290, AMD EPYC, 2 CPUs",
                              "--command", "scripts/bench-classify.sh", str(g)])
            self.assertEqual(rc, 0)
            self.assertEqual(out.getvalue(), (
                "#### The sans-IO core per packet (2026-11-29 16:36 UTC, commit fdff290, AMD EPYC, 2 CPUs)\n\n"
                "`scripts/bench-classify.sh` (criterion; the median of its samples, in brackets its "
                "95% confidence interval):\n\n"
                "| benchmark | per iteration | elements per iteration | per element | elements/s |\n"
                "|---|---|---|---|---|\n"
                "| if-manager/classify+route 1KiB fragment | 3.503 µs [3.484–3.529] | 256 | "
                "**13.68 ns** [13.61–13.79] | 73 M |\n"))

    def test_bytes_throughput_in_gb_per_s_over_several_groups(self):
        # libml's layout bench: group fragment (1 KiB each), group request
        # (a whole 224x224x3 request: 150528 u8 or 602112 f32 bytes).
        with tempfile.TemporaryDirectory() as t:
            frag, req = Path(t) / "fragment", Path(t) / "request"
            write(frag, "rgb_u8/1KiB", 310.0, 305.0, 320.0, 1024, "Bytes")
            write(frag, "memcpy/1KiB", 8.3, 8.0, 8.5, 1024, "Bytes")
            write(req, "rgb_u8/request", 40123.0, 39800.0, 40500.0, 150528, "Bytes")
            out = io.StringIO()
            with redirect_stdout(out):
                rc = cr.main(["--title", "Input conversion on copy", "--run-line", "now",
                              "--command", "scripts/bench-layout.sh", str(frag), str(req)])
            self.assertEqual(rc, 0)
            md = out.getvalue()
            self.assertIn("#### Input conversion on copy (now)", md)
            self.assertIn("| benchmark | per iteration | bytes per iteration | GB/s |", md)
            self.assertNotIn("elements", md)  # no benchmark counts elements: no such table
            rows = [l for l in md.splitlines() if l.startswith(("| fragment/", "| request/"))]
            self.assertEqual(rows, [  # in the groups' order, by id within each
                "| fragment/memcpy/1KiB | 8.3 ns [8.0–8.5] | 1024 | **123.37** [120.47–128.00] |",
                "| fragment/rgb_u8/1KiB | 310.0 ns [305.0–320.0] | 1024 | **3.30** [3.20–3.36] |",
                "| request/rgb_u8/request | 40.12 µs [39.80–40.50] | 150528 | **3.75** [3.72–3.78] |"])

    def test_elements_and_bytes_get_a_table_each_and_any_other_unit_is_an_error(self):
        with tempfile.TemporaryDirectory() as t:
            g = Path(t) / "g"
            write(g, "items", 1000.0, 990.0, 1010.0, 10)
            write(g, "bytes", 1000.0, 990.0, 1010.0, 2000, "Bytes")
            md = cr.markdown(cr.benchmarks(g), "T", "now", "cmd")
            self.assertIn("| g/items | 1.000 µs [0.990–1.010] | 10 | **100.00 ns** [99.00–101.00] | 10 M |", md)
            self.assertIn("| g/bytes | 1.00 µs [0.99–1.01] | 2000 | **2.00** [1.98–2.02] |", md)
            self.assertLess(md.index("elements per iteration"), md.index("bytes per iteration"))
            write(g, "bits", 1000.0, 990.0, 1010.0, 8, "Bits")
            with self.assertRaisesRegex(ValueError, "g/bits: a throughput in Bits"):
                cr.benchmarks(g)


if __name__ == "__main__":
    unittest.main()
