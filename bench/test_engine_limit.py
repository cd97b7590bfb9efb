"""Unit tests of bench/engine_limit.py's timing schedule (run by `make test`):
the batch sizes take turns, so that a machine whose speed drifts while
they are timed does not show the drift as a gain from batching.

    .venv/bin/python -m unittest bench/test_engine_limit.py
"""

from __future__ import annotations

import statistics
import sys
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import engine_limit  # noqa: E402


class DriftingEngine:
    """A simulated engine on a virtual clock: a batch of b costs b ms per
    image (no gain from batching), times a speed that falls from 1.3 to 1.0
    over the first 12 s (a machine leaving a slow spell)."""

    def __init__(self):
        self.now = 0.0
        self.calls: list[int] = []

    def clock(self) -> float:
        return self.now

    def infer(self, b: int):
        self.calls.append(b)
        slow = 1.0 + 0.3 * max(0.0, 1.0 - self.now / 12.0)
        self.now += b * 1e-3 * slow


class TimeSizes(unittest.TestCase):
    def per_image(self, lats: dict[int, list[float]]) -> dict[int, float]:
        return {b: statistics.median(v) / b for b, v in lats.items()}

    def test_interleaved_sizes_share_the_drift(self):
        e = DriftingEngine()
        lats = engine_limit.time_sizes([1, 2, 4, 8], e.infer, 3.0, engine_limit.SLICE_S, 5, clock=e.clock)
        per = self.per_image(lats)
        # The same cost per image at every size: within 2% of each other,
        # though the engine's speed moved by 30% over the measurement.
        self.assertLess(max(per.values()) / min(per.values()), 1.02, per)
        for b, v in lats.items():
            self.assertGreaterEqual(sum(v) / 1e3, 3.0 - 1e-9, b)

    def test_sizes_timed_one_after_the_other_would_show_the_drift_as_a_gain(self):
        # What the schedule replaces: each size alone for its 3 s (one
        # turn as long as the whole measurement), the drift reads as a
        # 20%+ gain from batching that the engine does not have.
        e = DriftingEngine()
        lats = engine_limit.time_sizes([1, 2, 4, 8], e.infer, 3.0, 3.0, 5, clock=e.clock)
        per = self.per_image(lats)
        self.assertGreater(per[1] / per[8], 1.2, per)

    def test_the_first_batch_after_another_shape_runs_but_is_not_counted(self):
        e = DriftingEngine()
        lats = engine_limit.time_sizes([1, 8], e.infer, 0.02, 0.005, 2, clock=e.clock)
        turns = sum(1 for i, b in enumerate(e.calls) if i == 0 or e.calls[i - 1] != b)
        self.assertEqual(len(e.calls), sum(map(len, lats.values())) + turns)
        self.assertGreater(turns, 2)  # the sizes took turns

    def test_one_size_runs_in_one_turn_with_at_least_the_minimum_iterations(self):
        e = DriftingEngine()
        lats = engine_limit.time_sizes([8], e.infer, 0.001, 0.0001, 5, clock=e.clock)
        self.assertEqual(len(lats[8]), 5)
        self.assertEqual(len(e.calls), 6)  # one not counted, then the five


if __name__ == "__main__":
    unittest.main()
