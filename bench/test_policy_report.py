"""Unit tests of bench/policy_report.py, the report of scripts/bench-policy.sh
(run by `make test`).

    .venv/bin/python -m unittest bench/test_policy_report.py
"""

from __future__ import annotations

import json
import sys
import tempfile
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import policy_report  # noqa: E402


def summary(max_batch, concurrency, ok_per_s, batch1_ms=7.0, mean_batch=None, mix=None, idle=0.002, waits=0,
            git="abc1234", nearby=None):
    """A bench-if summary.json with what the report reads; nearby: the
    engine time over batch 1's at the same moments and batch 1's ms per
    image there."""
    sat = {"ok_per_s": ok_per_s, "mean_batch": mean_batch if mean_batch is not None else (1.0 if max_batch == 1
                                                                                         else 1.9),
           "engine_idle_with_request_complete_fraction": idle}
    if mix is not None:
        sat["engine_own_per_image_mix_vs_batch1"] = mix
    if nearby is not None:
        sat["engine_own_vs_batch1_nearby"], sat["batch1_ms_per_image_nearby"] = nearby
    return {"meta": {"max_batch": max_batch, "concurrency": concurrency, "git": git},
            "engine_ref_ms": {"1": batch1_ms, "2": 2 * batch1_ms},
            "phases": {"sat": sat},
            "kp_if_final": {"batching": {"waits": waits}}}


class Figures(unittest.TestCase):
    def test_ok_rate_over_the_same_runs_engine_at_batch_one(self):
        f = policy_report.figures(summary(8, 32, 140.0, batch1_ms=6.25, mix=0.98, waits=3))
        self.assertAlmostEqual(f["ok_vs_engine_b1"], 140.0 / 160.0)
        self.assertEqual((f["max_batch"], f["concurrency"], f["mix_vs_b1"], f["waits"]), (8, 32, 0.98, 3))

    def test_a_batch_one_run_has_no_mix_figure(self):
        self.assertIsNone(policy_report.figures(summary(1, 4, 130.0))["mix_vs_b1"])

    def test_batch_ones_share_of_the_phase_for_the_same_answers(self):
        # 140 OK/s where batch 1 took 7.05 ms per image at the same moments.
        f = policy_report.figures(summary(8, 32, 140.0, nearby=(1.01, 7.05)))
        self.assertAlmostEqual(f["b1_share_needed"], 140.0 * 7.05 / 1000)
        self.assertEqual(f["vs_b1_nearby"], 1.01)
        self.assertIsNone(policy_report.figures(summary(8, 32, 140.0))["b1_share_needed"])


class Verdict(unittest.TestCase):
    def test_a_loss_or_a_win_only_over_three_runs_where_the_spreads_do_not_overlap(self):
        self.assertTrue(policy_report.verdict([0.90, 0.91], [0.95, 0.96, 0.97]).startswith("is not judged"))
        self.assertTrue(policy_report.verdict([0.90, 0.91, 0.92], [0.95, 0.96, 0.97]).startswith("**loses"))
        self.assertTrue(policy_report.verdict([0.98, 0.99, 0.99], [0.95, 0.96, 0.97]).startswith("wins"))
        self.assertTrue(policy_report.verdict([0.93, 0.96, 0.96], [0.95, 0.97, 0.97]).startswith("does not lose"))
        # Touching ends overlap.
        self.assertTrue(policy_report.verdict([0.93, 0.95, 0.95], [0.95, 0.97, 0.97]).startswith("does not lose"))


class Report(unittest.TestCase):
    def runs(self, policy4):
        rows = []
        for k in range(3):
            rows += [policy_report.figures(summary(8, 32, 143.0 + k, mix=0.99)),
                     policy_report.figures(summary(1, 32, 142.0 + k)),
                     policy_report.figures(summary(8, 4, policy4[k], mix=0.98, waits=5 * k)),
                     policy_report.figures(summary(1, 4, 145.0 + k))]
        return rows

    def test_rows_per_arm_with_medians_and_spreads_and_the_target_met(self):
        md = policy_report.markdown(self.runs([144.0, 145.0, 146.0]), "RUN", "CMD")
        self.assertIn("#### The batching policy against batches of 1 (RUN)", md)
        self.assertIn("`CMD`: 3 round(s)", md)
        lines = md.splitlines()
        arms = [ln.split(" | ")[0] for ln in lines if ln.startswith("| policy") or ln.startswith("| batch 1")]
        self.assertEqual(arms, ["| policy (max batch 8), 32 outstanding", "| batch 1, 32 outstanding",
                                "| policy (max batch 8), 4 outstanding", "| batch 1, 4 outstanding"])
        # 144 OK/s against an engine of 1000/7 images/s at batch 1.
        self.assertIn(f"| {144 / (1000 / 7):.3f} [", md)
        # Without kp-if's trace, no figure from the same moments.
        self.assertIn("| - | - |", md)
        self.assertIn("| 5 [0–10] |", md)
        self.assertIn("Target (issue 13, item 1): the policy never loses to batch 1: **met**.", md)
        self.assertIn("Binaries of abc1234.", md)

    def test_a_loss_at_one_concurrency_fails_the_target(self):
        md = policy_report.markdown(self.runs([130.0, 131.0, 132.0]), "RUN", "CMD")
        self.assertIn("- 4 outstanding: the policy's OK/s ÷ the engine at batch 1 is 0.8973 of batch 1's (medians); "
                      "it **loses**", md)
        self.assertIn("**not met** (loses at 4 outstanding).", md)

    def test_the_verdict_is_on_batch_ones_share_where_every_run_has_it(self):
        # The engine alone says the policy loses by 10% (its runs' engine
        # was faster), the same moments inside the IF say it wins: 0.99 of
        # the phase against 0.97 by batches of 1.
        rows = []
        for k in range(3):
            rows += [policy_report.figures(summary(8, 4, 130.0, batch1_ms=6.3, nearby=(0.99, 7.6 + 0.01 * k))),
                     policy_report.figures(summary(1, 4, 145.0, nearby=(1.0, 6.7 - 0.01 * k)))]
        md = policy_report.markdown(rows, "RUN", "CMD")
        share = [round(r["b1_share_needed"], 4) for r in rows]
        self.assertEqual(share, [0.988, 0.9715, 0.9893, 0.9701, 0.9906, 0.9686])
        self.assertIn("- 4 outstanding: the policy's batch 1's share of the phase for the same answers is "
                      f"{130 * 7.61 / (145 * 6.69):.4f} of batch 1's (medians); it wins", md)
        self.assertIn("| 0.9893 [0.9880–0.9906] |", md)
        self.assertIn("**met**.", md)
        # One run without it: judged on the engine alone, and lost.
        rows[0] = policy_report.figures(summary(8, 4, 130.0, batch1_ms=6.3))
        md = policy_report.markdown(rows, "RUN", "CMD")
        self.assertIn("- 4 outstanding: the policy's OK/s ÷ the engine at batch 1 is", md)
        self.assertIn("**not met** (loses at 4 outstanding).", md)

    def test_one_round_is_not_judged(self):
        md = policy_report.markdown(self.runs([130.0, 131.0, 132.0])[:4], "RUN", "CMD")
        self.assertIn("it is not judged: a verdict needs 3 runs of each arm.", md)
        self.assertIn("batch 1: not judged (fewer than 3 runs of an arm).", md)

    def test_main_reads_every_runs_summary_and_fails_without_any(self):
        with tempfile.TemporaryDirectory() as d:
            self.assertEqual(policy_report.main([d, "RUN", "CMD"]), 1)
            for name, s in (("a", summary(8, 32, 140.0)), ("b", summary(1, 32, 139.0))):
                Path(d, name).mkdir()
                Path(d, name, "summary.json").write_text(json.dumps(s))
            self.assertEqual(policy_report.main([d, "RUN", "CMD"]), 0)


if __name__ == "__main__":
    unittest.main()
