"""schedule_bound: the admission it simulates is optimal, its FIFO agrees
with M/D/1's closed form, and the bound reads the engine's measurements."""

import itertools
import random
import sys
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import schedule_bound as sb  # noqa: E402


def on_time_fifo(arrivals, slo) -> bool:
    """Whether serving exactly these requests first come first served
    (service 1, never idle while one waits) ends each within slo."""
    free = 0.0
    for t in arrivals:
        free = max(t, free) + 1.0
        if free > t + slo + 1e-12:
            return False
    return True


class Optimal(unittest.TestCase):
    def test_admit_if_on_time_answers_as_many_in_time_as_the_best_subset(self):
        # All service times and SLOs are equal, so deadlines come in arrival
        # order and any set that can all end in time can in FIFO order: the
        # best schedule is the largest subset FIFO serves in time.
        rng = random.Random(7)
        for case in range(300):
            n = rng.randint(1, 10)
            arrivals = sorted(rng.uniform(0, n * rng.choice((0.4, 0.7, 1.0))) for _ in range(n))
            slo = rng.choice((1.0, 1.5, 2.0, 2.7, 4.0))
            best = max(k for k in range(n + 1) for s in itertools.combinations(arrivals, k) if on_time_fifo(s, slo))
            self.assertEqual(sum(sb.admit_if_on_time(arrivals, slo)), best, (case, arrivals, slo))

    def test_a_greedy_fifo_that_refuses_nothing_is_not_optimal(self):
        # Three at once, room in the SLO for two: admitting all makes one late.
        arrivals, slo = [0.0, 0.0, 0.0], 2.0
        self.assertFalse(on_time_fifo(arrivals, slo))
        self.assertEqual(sb.admit_if_on_time(arrivals, slo), [True, True, False])


class Simulation(unittest.TestCase):
    def test_fifo_agrees_with_the_md1_closed_form(self):
        for load, slo in ((0.3, 2.0), (0.5, 4.0), (0.7, 4.0)):
            sim, exact = sb.late_fraction_fifo(load, slo), sb.late_fraction_md1(load, slo)
            self.assertAlmostEqual(sim, exact, delta=0.15 * exact, msg=(load, slo))
        self.assertAlmostEqual(sb.max_load(sb.late_fraction_fifo, 4.0), sb.max_load(sb.late_fraction_md1, 4.0),
                               delta=0.01)

    def test_refusing_what_would_be_late_carries_more_load_than_fifo(self):
        fifo, bound = sb.max_load(sb.late_fraction_fifo, 4.0), sb.max_load(sb.refused_fraction, 4.0)
        self.assertGreater(bound, fifo)
        # Where the SLO is four service times, the gain is small: a batch-1
        # server cannot refuse its way far past a FIFO queue.
        self.assertLess(bound / fifo, 1.3)
        # A longer SLO allows more load to both.
        self.assertGreater(sb.max_load(sb.refused_fraction, 8.0), bound)


class Engine(unittest.TestCase):
    def test_the_bound_uses_the_cheapest_measured_batch_per_image(self):
        flat = [{"batch": 1, "median_ms": 10.0}, {"batch": 2, "median_ms": 21.0}]
        gains = [{"batch": 1, "median_ms": 10.0}, {"batch": 2, "median_ms": 15.0}]
        a, b = sb.engine_bound(flat, 40.0), sb.engine_bound(gains, 40.0)
        self.assertEqual(a["per_image_ms"], 10.0)
        self.assertEqual(b["per_image_ms"], 7.5)
        self.assertAlmostEqual(a["engine_limit"], 100.0)
        # Batch 1 at 10 ms for both: the ideal FIFO is the same; the bound
        # of the engine that gains from batches is higher.
        self.assertAlmostEqual(a["fifo_per_s"], b["fifo_per_s"])
        self.assertGreater(b["bound_per_s"], a["bound_per_s"])
        self.assertLess(a["bound_of_limit"], 1.0)
        self.assertGreater(a["bound_per_s"], a["fifo_per_s"])

    def test_no_bound_without_batch_1_or_an_slo(self):
        self.assertIsNone(sb.engine_bound([{"images_per_s": 100.0}], 40.0))
        self.assertIsNone(sb.engine_bound([{"batch": 2, "median_ms": 15.0}], 40.0))
        self.assertIsNone(sb.engine_bound([{"batch": 1, "median_ms": 10.0}], None))


if __name__ == "__main__":
    unittest.main()
