"""Unit tests of `archive` (BENCH_ARCHIVE): what of a run is kept in the
repository so that --combine can use it in a later session. (The smoke run
of `make test` archives itself and combines from the copy: smoke_combine.)

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
    def test_keeps_the_summary_not_the_raw_results_and_replaces_an_older_copy(self):
        with tempfile.TemporaryDirectory() as t:
            out, dest = Path(t) / "out", Path(t) / "runs" / "rep-2" / "squeezenet"
            (out / "logs").mkdir(parents=True)
            (out / "logs" / "kp-if.log").write_text("log\n")
            for name in ("summary.json", "windows.csv", "levels.csv", "engine.csv", "meta.json", "report.md"):
                (out / name).write_text(f"new {name}\n")
            (out / "peers-squeezenet.svg").write_text("<svg/>\n")
            dest.mkdir(parents=True)
            (dest / "summary.json").write_text("old\n")
            (dest / "windows.csv").write_text("from an earlier run\n")

            self.assertEqual(bench.archive(out, dest), dest)

            self.assertEqual([p.name for p in dest.iterdir()], ["summary.json"])
            self.assertEqual((dest / "summary.json").read_text(), "new summary.json\n")

    def test_a_run_without_a_summary_is_not_archived_as_if_it_had_one(self):
        with tempfile.TemporaryDirectory() as t:
            out = Path(t) / "out"
            out.mkdir()
            with self.assertRaises(FileNotFoundError):
                bench.archive(out, Path(t) / "runs" / "rep-1" / "squeezenet")

    def test_recorded_settings_come_back_without_the_environment(self):
        s = bench.Settings(smoke=True)
        r = bench.Settings.recorded(dict(s.as_dict(), worker_cpu=7, max_batch=4))
        self.assertEqual((r.worker_cpu, r.max_batch, r.smoke), (7, 4, True))


if __name__ == "__main__":
    unittest.main()
