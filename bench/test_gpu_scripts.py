"""The GPU scripts on a machine without a GPU (run by `make test`): each
says so and exits 2 at once, before it prepares or starts anything, so a
device-tool call or a CI job that lands on the wrong machine costs seconds.

    .venv/bin/python -m unittest bench/test_gpu_scripts.py
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
import unittest
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HAS_GPU = os.path.exists("/dev/nvidiactl") and os.path.exists("/dev/nvidia0")


@unittest.skipIf(HAS_GPU, "this machine has a GPU")
class WithoutAGpu(unittest.TestCase):
    def run_script(self, name, env_extra):
        with tempfile.TemporaryDirectory() as d:
            env = dict(os.environ, **{k: v.format(d=d) for k, v in env_extra.items()})
            t = time.monotonic()
            r = subprocess.run(["bash", str(ROOT / "scripts" / name)], capture_output=True, text=True,
                               timeout=60, env=env)
            took = time.monotonic() - t
            left = sorted(p.name for p in Path(d).iterdir())
        return r, took, left

    def test_gpu_check_exits_2_and_prepares_no_model(self):
        r, took, left = self.run_script("gpu-check.sh", {"GPU_CHECK_OUT": "{d}/gc"})
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertRegex(r.stderr, "no GPU path here|no kp-gpu-check binary")
        self.assertNotIn("models", left)
        self.assertLess(took, 20)

    def test_gpu_platform_exits_2_at_once(self):
        r, took, left = self.run_script("gpu-platform.sh", {"GPU_PLATFORM_OUT": "{d}/plat"})
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("no GPU here", r.stderr)
        self.assertLess(took, 20)

    def test_gpu_all_exits_2_and_runs_neither_part(self):
        r, took, left = self.run_script("gpu-all.sh", {"GPU_ALL_OUT": "{d}/all"})
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("no GPU here", r.stderr)
        self.assertEqual(left, [])
        self.assertLess(took, 5)


if __name__ == "__main__":
    unittest.main()
