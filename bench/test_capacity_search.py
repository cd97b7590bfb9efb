"""Unit tests of bench/capacity_search.py: the rates tried to find a
system's capacity, against systems whose verdicts are known.

    .venv/bin/python -m unittest bench/test_capacity_search.py
"""

from __future__ import annotations

import sys
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import capacity_search as cs  # noqa: E402


class System:
    """Meets the SLO at and below `capacity` req/s; `wrong` maps a rate
    range (lo, hi) to the opposite verdict (a noisy level)."""

    def __init__(self, capacity: float, wrong: tuple[float, float] | None = None):
        self.capacity, self.wrong, self.tried, self.phases = capacity, wrong, [], []

    def __call__(self, rate: float, phase: str = "") -> bool:
        self.tried.append(rate)
        self.phases.append(phase)
        ok = rate <= self.capacity
        if self.wrong and self.wrong[0] <= rate <= self.wrong[1]:
            ok = not ok
        return ok


SWEEP = [98.0, 157.0, 177.0, 197.0, 217.0]  # 0.5, 0.8, 0.9, 1.0, 1.1 of an engine limit of 197


class Search(unittest.TestCase):
    def test_a_capacity_below_the_sweep_is_found_by_halving_then_bisection(self):
        s = System(55.0)
        lo, hi = cs.search(s, SWEEP, 0.02, 8)
        self.assertLessEqual(lo, 55.0)
        self.assertGreater(hi, 55.0)
        self.assertLessEqual(hi - lo, 0.02 * lo)
        self.assertEqual(s.tried[:2], [98.0, 49.0])
        self.assertEqual(s.phases[:3], ["sweep", "down", "refine"])

    def test_a_capacity_inside_the_sweep_is_bracketed_by_its_levels_first(self):
        s = System(180.0)
        lo, hi = cs.search(s, SWEEP, 0.02, 8)
        self.assertEqual(s.tried[:4], [98.0, 157.0, 177.0, 197.0])
        self.assertTrue(lo <= 180.0 < hi and hi - lo <= 0.02 * lo, (lo, hi))

    def test_a_system_that_meets_every_level_has_no_upper_end(self):
        self.assertEqual(cs.search(System(1e9), SWEEP, 0.02, 8), (217.0, None))

    def test_a_system_that_never_meets_stops_at_the_floor(self):
        s = System(0.1)
        self.assertEqual(cs.search(s, SWEEP, 0.02, 8), (None, 98.0 / 2 ** 5))
        self.assertTrue(all(r >= cs.FLOOR for r in s.tried))

    def test_refine_bounds_the_bisection(self):
        s = System(55.0)
        cs.search(s, SWEEP, 0.0001, 3)
        self.assertEqual(len(s.tried), 2 + 3)


class Confirm(unittest.TestCase):
    def scout_then_confirm(self, full: System, scout: System, top: float = 217.0):
        bracket = cs.search(scout, SWEEP, 0.04, 10)
        return bracket, cs.confirm(full, bracket, 0.02, 8, top)

    def test_where_the_scouts_were_right_three_full_levels_suffice(self):
        full = System(55.0)
        scout, (lo, hi) = self.scout_then_confirm(full, System(55.0))
        self.assertLessEqual(scout[1] - scout[0], 0.04 * scout[0])
        self.assertEqual(full.tried[:2], list(scout))
        self.assertEqual(full.phases[:2], ["confirm", "confirm"])
        self.assertLessEqual(len(full.tried), 3)
        self.assertTrue(lo <= 55.0 < hi and hi - lo <= 0.02 * lo, (lo, hi))

    def test_where_the_scouts_were_optimistic_full_levels_walk_down(self):
        full = System(40.0)
        scout, (lo, hi) = self.scout_then_confirm(full, System(55.0))
        self.assertGreater(scout[0], full.capacity)
        self.assertTrue(lo <= 40.0 < hi and hi - lo <= 0.02 * lo, (lo, hi))
        self.assertLessEqual(len(full.tried), 9)

    def test_where_the_scouts_were_pessimistic_full_levels_walk_up(self):
        full = System(70.0)
        scout, (lo, hi) = self.scout_then_confirm(full, System(55.0))
        self.assertTrue(lo <= 70.0 < hi and hi - lo <= 0.02 * lo, (lo, hi))
        self.assertLessEqual(len(full.tried), 9)

    def test_the_capacity_comes_from_full_levels_only(self):
        # A noisy scout that met far above the capacity: the bracket
        # returned is the full levels' verdicts, wherever the scouts were.
        full = System(50.0)
        _, (lo, hi) = self.scout_then_confirm(full, System(50.0, wrong=(60.0, 120.0)))
        self.assertTrue(lo <= 50.0 < hi, (lo, hi))
        self.assertTrue(all(r in full.tried for r in (lo, hi)))

    def test_a_full_level_above_the_sweep_is_never_run(self):
        full = System(1e9)
        self.assertEqual(self.scout_then_confirm(full, System(1e9))[1], (217.0, None))
        self.assertLessEqual(max(full.tried), 217.0)

    def test_no_scout_met_and_no_full_level_meets_one_full_level_says_so(self):
        full = System(0.1)
        scout, (lo, hi) = self.scout_then_confirm(full, System(0.1))
        self.assertIsNone(scout[0])
        self.assertEqual((lo, hi), (None, scout[1]))
        self.assertEqual(full.tried, [scout[1]])

    def test_no_scout_met_but_the_full_level_does_and_the_search_goes_up(self):
        full = System(4.0)
        scout, (lo, hi) = self.scout_then_confirm(full, System(0.1))
        self.assertIsNone(scout[0])
        self.assertTrue(lo <= 4.0 < hi and hi - lo <= 0.02 * lo, (lo, hi))

    def test_nothing_is_searched_below_the_lowest_scout(self):
        full = System(2.5)
        scout, (lo, hi) = self.scout_then_confirm(full, System(0.1))
        self.assertEqual((lo, hi), (None, scout[1]))
        self.assertEqual(len(full.tried), 1)

    def test_full_levels_walk_down_no_lower_than_the_scouts_could(self):
        # A scout at the search's lowest rate met by chance (a short
        # window), then one above it: the full levels miss from there down,
        # and stop at the lowest rate the scouts could have tried.
        full = System(0.1)
        floor = cs.lowest(SWEEP)
        self.assertEqual(floor, 98.0 / 2 ** cs.HALVINGS)
        scout = System(floor * 1.08)
        bracket = cs.search(scout, SWEEP, 0.04, 10)
        self.assertIsNotNone(bracket[0])
        lo, hi = cs.confirm(full, bracket, 0.02, 8, 217.0, floor=floor)
        self.assertIsNone(lo)
        self.assertTrue(all(r >= floor for r in full.tried), full.tried)
        self.assertEqual(hi, min(full.tried))
        self.assertLessEqual(len(full.tried), 3)

    def test_no_scouts_no_full_levels(self):
        full = System(10.0)
        self.assertEqual(cs.confirm(full, (None, None), 0.02, 8, 217.0), (None, None))
        self.assertEqual(full.tried, [])


class Budget(unittest.TestCase):
    """A search under a time budget starts no level once it has run out."""

    class Clock:
        """Each level takes `per_level` seconds of this clock."""

        def __init__(self, per_level: float):
            self.t, self.per_level = 1000.0, per_level

        def __call__(self) -> float:
            return self.t

    def timed(self, system: System, clock: "Budget.Clock") -> cs.Meets:
        def meets(rate: float, phase: str) -> bool:
            clock.t += clock.per_level
            return system(rate, phase)
        return meets

    def test_no_level_starts_after_the_budget_and_the_levels_run_stay(self):
        # Noisy between 60 and 70 so that a bisection would take many levels.
        full, clock = System(65.0, wrong=(60.0, 70.0)), self.Clock(300.0)
        meets = cs.budgeted(self.timed(full, clock), 1000.0, clock)
        with self.assertRaises(cs.OutOfTime):
            cs.confirm(meets, (50.0, 80.0), 0.02, 8, 217.0)
        # Levels start at 0, 300, 600 and 900 s: four, the last overrunning.
        self.assertEqual(len(full.tried), 4)
        self.assertEqual(clock.t - 1000.0, 1200.0)

    def test_a_search_that_ends_in_time_is_not_cut(self):
        full, clock = System(55.0), self.Clock(300.0)
        meets = cs.budgeted(self.timed(full, clock), 10_000.0, clock)
        self.assertEqual(cs.confirm(meets, (54.0, 56.0), 0.02, 8, 217.0),
                         cs.confirm(System(55.0), (54.0, 56.0), 0.02, 8, 217.0))

    def test_the_budget_counts_from_the_first_level(self):
        # Time spent before the search (scouts, start-up) is not charged.
        full, clock = System(55.0), self.Clock(300.0)
        meets = cs.budgeted(self.timed(full, clock), 500.0, clock)
        clock.t += 10_000.0
        with self.assertRaises(cs.OutOfTime):
            cs.search(meets, SWEEP, 0.02, 8)
        self.assertEqual(len(full.tried), 2)

    def test_no_budget_is_the_search_itself(self):
        full = System(55.0)
        self.assertIs(cs.budgeted(full, 0.0, lambda: 0.0), full)


if __name__ == "__main__":
    unittest.main()
