"""Unit tests of bench/bench_gateway.py's report: what docs/PERFORMANCE.md's
generated bench-gateway section says, from a run's summary.

    .venv/bin/python -m unittest bench/test_bench_gateway.py
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import bench_gateway  # noqa: E402


def summary(added_p50: float, kept: float, stopped: str | None = None) -> dict:
    s = {"model": "squeezenet", "rate": 50.0, "concurrency": 4, "duration_s": 5.0, "rounds": 5, "stopped": stopped}
    for key, _, _, _ in bench_gateway.ROWS:
        s[key] = {"median": 100.0, "min": 90.0, "max": 110.0}
    s["gateway_added_p50_us"] = {"median": added_p50, "min": added_p50 - 60, "max": added_p50 + 90}
    s["capacity_ratio"] = {"median": kept, "min": kept - 0.04, "max": kept + 0.03}
    return s


class Report(unittest.TestCase):
    def test_every_figure_with_its_spread_and_the_targets_judged(self):
        md = bench_gateway.markdown(summary(410.0, 1.005), "2026-11-29 16:00 UTC, commit abc1234, EPYC, 2 CPUs",
                                    "bench/bench_gateway.sh --rounds 5",
                                    {"client": {"answered": 1250}, "gateway": {
                                        "infer": {"200": 1250},
                                        "own_us": {"count": 1250, "p50": 154, "p99": 778, "max": 2100}}})
        self.assertIn("#### kp-gateway's own cost (2026-11-29 16:00 UTC, commit abc1234, EPYC, 2 CPUs)", md)
        self.assertIn("| median of 5 rounds (min–max) |", md)
        self.assertIn("target < 500 µs) | 410 µs (350–500) |", md)
        self.assertIn("target ≥ 0.90) | 1.005 (0.965–1.035) |", md)
        self.assertIn("all 1250 requests of all rounds) | 154 / 778 µs |", md)
        self.assertIn("gateway added p50 < 500 µs: **met** (410 µs", md)
        self.assertIn("capacity kept ≥ 0.90: **met** (1.005)", md)
        self.assertEqual(md.count("\n| "), len(bench_gateway.ROWS) + 2)  # header, rows, own_us

    def test_a_missed_target_and_an_early_stop_are_said(self):
        md = bench_gateway.markdown(summary(640.0, 0.85, stopped="round 4: the closed loop got no OK answers"),
                                    "now", "bench/bench_gateway.sh")
        self.assertIn("gateway added p50 < 500 µs: **not met** (640 µs", md)
        self.assertIn("capacity kept ≥ 0.90: **not met** (0.850)", md)
        self.assertIn("The run stopped early: round 4: the closed loop got no OK answers.", md)
        self.assertNotIn("own time in its handler", md)  # no gateway report given
        self.assertNotIn("SLO", md.split("| figure")[0])  # a summary from before the SLO was recorded

    def test_the_slo_and_its_rule_are_named(self):
        s = dict(summary(410.0, 0.97), slo_ms=44.4, slo_rule="4 x the engine's batch-1 median here")
        md = bench_gateway.markdown(s, "now", "bench/bench_gateway.sh")
        self.assertIn("model squeezenet, kp-if's SLO 44.4 ms (4 x the engine's batch-1 median here).", md)

    def test_render_reads_the_summary_and_the_gateways_last_line(self):
        with tempfile.TemporaryDirectory() as d:
            d = Path(d)
            (d / "summary.json").write_text(json.dumps(summary(400.0, 0.97)))
            # As kp-gateway 1d26dc6 printed it when it stopped.
            (d / "gw.out").write_text('starting\n{"client":{"answered":9,"late":0,"submitted":9,"timed_out":0},'
                                      '"gateway":{"infer":{"200":9},"own_us":{"count":9,"max":900,"p50":150,'
                                      '"p99":800},"platform_requests":9}}\n')
            subprocess.run([sys.executable, str(HERE / "bench_gateway.py"), "--render", "--out", str(d / "summary.json"),
                            "--gateway-report", str(d / "gw.out"), "--markdown", str(d / "gw.md"),
                            "--repo", str(HERE.parent)], check=True)
            md = (d / "gw.md").read_text()
            self.assertIn("| 150 / 800 µs |", md)
            self.assertIn("commit ", md)

    def test_running_needs_the_platform_and_the_gateway(self):
        r = subprocess.run([sys.executable, str(HERE / "bench_gateway.py")], capture_output=True, text=True)
        self.assertEqual(r.returncode, 2)
        self.assertIn("--addr, --gateway and --gateway-pid are required to run", r.stderr)


if __name__ == "__main__":
    unittest.main()
