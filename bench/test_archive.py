"""Unit tests of `archive` (BENCH_ARCHIVE): what a run keeps in the
repository so that --combine can use it in a later session.

    .venv/bin/python -m unittest bench/test_archive.py
"""

from __future__ import annotations

import importlib.util
import tempfile
import unittest
from pathlib import Path

# By path: `import bench` would find the bench/ folder itself.
_spec = importlib.util.spec_from_file_location("bench_harness", Path(__file__).resolve().parent / "bench.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


class Archive(unittest.TestCase):
    def test_keeps_the_data_and_plots_not_the_logs_and_replaces_an_older_copy(self):
        with tempfile.TemporaryDirectory() as t:
            out, dest = Path(t) / "out", Path(t) / "runs" / "rep-2" / "squeezenet"
            (out / "logs").mkdir(parents=True)
            (out / "logs" / "kp-if.log").write_text("log\n")
            for name in bench.ARCHIVED:
                (out / name).write_text(f"new {name}\n")
            (out / "peers-squeezenet.svg").write_text("<svg/>\n")
            dest.mkdir(parents=True)
            (dest / "windows.csv").write_text("old\n")
            (dest / "stale.csv").write_text("from an earlier run\n")

            self.assertEqual(bench.archive(out, dest), dest)

            self.assertEqual(sorted(p.name for p in dest.iterdir()),
                             sorted(list(bench.ARCHIVED) + ["peers-squeezenet.svg"]))
            self.assertEqual((dest / "windows.csv").read_text(), "new windows.csv\n")

    def test_what_combine_needs_is_archived(self):
        # combine() reads summary.json and meta.json, build_report() (and
        # --report-only) engine.csv and windows.csv; levels.csv is the
        # capacity search's own record of its steps.
        for name in ("summary.json", "meta.json", "windows.csv", "engine.csv", "levels.csv"):
            self.assertIn(name, bench.ARCHIVED)


if __name__ == "__main__":
    unittest.main()
