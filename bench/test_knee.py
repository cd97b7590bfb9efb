"""Unit tests of scripts/knee.py, the knee of a knee sweep (run by `make
test`; the sweep itself needs a GPU with CUDA MPS: scripts/gpu-knee.sh).

    .venv/bin/python -m unittest bench/test_knee.py
"""

from __future__ import annotations

import csv
import importlib.util
import io
import subprocess
import sys
import tempfile
import unittest
from contextlib import redirect_stdout
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("knee", ROOT / "scripts" / "knee.py")
knee = importlib.util.module_from_spec(spec)
spec.loader.exec_module(knee)


def write(path: Path, rows):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["mps_pct", "sms_available", "sm_count", "model", "batch", "median_ms", "p99_ms", "images_per_s"])
        w.writerows(rows)


class Knee(unittest.TestCase):
    def test_smallest_share_within_the_fraction_of_the_best(self):
        # Saturating at 40%: 100, 180, 250, 290, 300, 300 images/s.
        curve = {10: (100, 9), 20: (180, 5), 30: (250, 4), 40: (290, 3.5), 50: (300, 3.4), 100: (300, 3.3)}
        self.assertEqual(knee.knee(curve, 0.9), (40, 300))
        self.assertEqual(knee.knee(curve, 0.8), (30, 300))
        self.assertEqual(knee.knee(curve, 1.0), (50, 300))

    def test_a_linear_model_has_its_knee_at_the_top(self):
        curve = {p: (p * 3.0, 1.0) for p in range(10, 101, 10)}
        self.assertEqual(knee.knee(curve, 0.9), (90, 300.0))

    def test_table_and_summary_from_a_sweep(self):
        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / "knee.csv"
            rows = []
            for pct, sms in [(10, 13), (50, 66), (100, 132)]:
                rows.append([pct, sms, 132, "squeezenet", 1, 1.0, 1.2, {10: 900, 50: 1000, 100: 1000}[pct]])
                rows.append([pct, sms, 132, "vgg19", 8, 8.0, 9.0, {10: 150, 50: 700, 100: 1000}[pct]])
            write(path, rows)
            text = io.StringIO()
            with redirect_stdout(text):
                rc = knee.main([str(path)])
            self.assertEqual(rc, 0)
            out = text.getvalue()
            self.assertIn("10%: 13, 50%: 66, 100%: 132", out)
            self.assertIn("| squeezenet | 1 | 900 | 1000 | 1000 | **10%** | 1.20 |", out)
            self.assertIn("| vgg19 | 8 | 150 | 700 | 1000 | **100%** | 9.00 |", out)
            with open(Path(d) / "knee-summary.csv") as f:
                summary = [(r["model"], r["batch"], r["knee_pct"]) for r in csv.DictReader(f)]
            self.assertEqual(summary, [("squeezenet", "1", "10"), ("vgg19", "8", "100")])

    def test_the_plot_has_a_line_per_batch_and_rings_each_knee(self):
        import xml.dom.minidom

        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / "knee.csv"
            rows = []
            for pct in (10, 50, 100):
                rows.append([pct, "", 132, "squeezenet", 1, 1.0, 1.2, {10: 900, 50: 1000, 100: 1000}[pct]])
                rows.append([pct, "", 132, "squeezenet", 8, 1.0, 1.2, {10: 300, 50: 900, 100: 1000}[pct]])
                rows.append([pct, "", 132, "vgg19", 8, 8.0, 9.0, {10: 150, 50: 700, 100: 1000}[pct]])
            write(path, rows)
            with redirect_stdout(io.StringIO()):
                self.assertEqual(knee.main([str(path), "--plot", str(Path(d) / "k.svg"), "--note", "H200"]), 0)
            doc = xml.dom.minidom.parse(str(Path(d) / "k.svg"))
            self.assertEqual(len(doc.getElementsByTagName("polyline")), 3)
            rings = [c for c in doc.getElementsByTagName("circle") if c.getAttribute("fill") == "none"]
            self.assertEqual(len(rings), 3)
            dots = [c for c in doc.getElementsByTagName("circle") if c.getAttribute("fill") != "none"]
            self.assertEqual(len(dots), 9)
            self.assertIn("H200", (Path(d) / "k.svg").read_text())

    def test_an_empty_sweep_is_an_error(self):
        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / "knee.csv"
            write(path, [])
            self.assertEqual(knee.main([str(path)]), 1)


class Sweep(unittest.TestCase):
    def test_without_mps_the_sweep_says_so_and_exits_2(self):
        with tempfile.TemporaryDirectory() as d:
            r = subprocess.run(
                ["bash", str(ROOT / "scripts" / "gpu-knee.sh"), "/nonexistent/kp-gpu-check", d, d],
                capture_output=True, text=True, timeout=30,
                env={"PATH": "/usr/bin:/bin"},
            )
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn("no nvidia-cuda-mps-control here", r.stderr)


if __name__ == "__main__":
    sys.exit(unittest.main())
