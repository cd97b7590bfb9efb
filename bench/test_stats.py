"""Unit tests of bench/stats.py (run by `make test`).

    .venv/bin/python -m unittest bench/test_stats.py
"""

from __future__ import annotations

import sys
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import stats  # noqa: E402


class NearestRank(unittest.TestCase):
    def test_definition_on_small_lists(self):
        v = [4, 1, 3, 2]
        self.assertEqual(stats.percentile(v, 0.25), 1)
        self.assertEqual(stats.percentile(v, 0.5), 2)  # ceil(2) = rank 2, not the upper median
        self.assertEqual(stats.percentile(v, 0.51), 3)
        self.assertEqual(stats.percentile(v, 1.0), 4)
        self.assertEqual(stats.percentile([7], 0.99), 7)

    def test_p99_of_a_hundred_is_the_99th(self):
        v = list(range(1, 101))
        self.assertEqual(stats.percentile(v, 0.99), 99)
        self.assertEqual(stats.percentile(v, 0.9), 90)
        self.assertEqual(stats.percentile(v + [1000], 0.99), 100)

    def test_empty_and_bad_quantiles(self):
        self.assertIsNone(stats.percentile([], 0.5))
        for q in (0.0, -0.1, 1.5):
            with self.assertRaises(ValueError):
                stats.percentile([1, 2], q)


if __name__ == "__main__":
    unittest.main()
