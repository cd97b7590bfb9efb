"""Unit tests of bench/report.py: the rules that turn load-generator windows
into levels, capacities, tables and plots (run by `make test`).

    .venv/bin/python -m unittest bench/test_report.py
"""

from __future__ import annotations

import json
import math
import sys
import unittest
import xml.etree.ElementTree as ET
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import report  # noqa: E402


def window(ok_per_s, p99, sent=100, ok=None, errors=0, unanswered=0, offered=100.0):
    return {"offered_rps": offered, "sent": sent, "ok": sent - errors - unanswered if ok is None else ok,
            "errors": errors, "unanswered": unanswered, "ok_per_s": ok_per_s, "p50_ms": p99 / 2,
            "p90_ms": p99 * 0.8, "p99_ms": p99, "server_cpu_s": 0.5, "worker_cpu_s": 0.4, "client_cpu_s": 0.1}


class Stability(unittest.TestCase):
    def test_three_windows_within_ten_percent_are_stable(self):
        self.assertTrue(report.stable([window(100, 10), window(104, 10.5), window(97, 9.6)]))

    def test_fewer_than_three_windows_are_never_stable(self):
        self.assertFalse(report.stable([window(100, 10), window(100, 10)]))

    def test_one_window_off_by_more_than_ten_percent_is_not_stable(self):
        self.assertFalse(report.stable([window(100, 10), window(100, 10), window(100, 14)]))
        self.assertFalse(report.stable([window(100, 10), window(70, 10), window(100, 10)]))

    def test_only_the_last_three_windows_count(self):
        self.assertTrue(report.stable([window(10, 90), window(100, 10), window(101, 10), window(99, 10)]))


class Levels(unittest.TestCase):
    def test_a_level_meets_the_slo_on_p99_errors_and_goodput(self):
        lv = report.aggregate([window(99, 15), window(100, 16), window(98, 15)], slo_ms=20)
        self.assertTrue(lv["meets_slo"])
        self.assertAlmostEqual(lv["p99_ms"], 46 / 3)
        self.assertEqual(lv["sent"], 300)

    def test_p99_over_the_slo_misses_it(self):
        lv = report.aggregate([window(100, 19), window(100, 22), window(100, 21)], slo_ms=20)
        self.assertFalse(lv["meets_slo"])

    def test_more_than_one_percent_failed_misses_it_even_with_a_good_p99(self):
        # OVERLOADED answers are fast: a shedding system has a low p99.
        ws = [window(98, 5, errors=2), window(98, 5, errors=2), window(98, 5, unanswered=1)]
        lv = report.aggregate(ws, slo_ms=20)
        self.assertEqual(lv["failed"], 5)
        self.assertFalse(lv["meets_slo"])

    def test_a_p99_among_the_failures_is_infinite_and_misses_it(self):
        # The load generators report p99 with failures counted as late:
        # more than 1% failed puts it among them (null, here inf).
        inf = float("inf")
        ws = [window(97, inf, errors=3), window(97, inf, errors=3), window(97, inf, errors=3)]
        lv = report.aggregate(ws, slo_ms=20)
        self.assertEqual(lv["p99_ms"], inf)
        self.assertFalse(lv["meets_slo"])
        self.assertTrue(report.stable(ws))  # consistently among the failures
        self.assertFalse(report.stable([window(100, 10), window(100, 10), window(97, inf, errors=3)]))
        self.assertEqual(report._f(inf), "∞")
        # The plot leaves such points out instead of failing on them.
        lvs = [dict(lv, offered_rps=50.0), dict(report.aggregate([window(50, 8)] * 3, slo_ms=20), offered_rps=25.0)]
        svg = report.svg_plot("squeezenet", 20.0, 100.0, {"kneepoint": lvs})
        ET.fromstring(svg)
        self.assertNotIn("inf", svg)

    def test_fewer_ok_than_offered_by_poisson_chance_alone_still_meets_it(self):
        # 2.5 s windows of Poisson arrivals at 100/s hold 250 +- 16: every
        # request answered OK in time is a level that meets the SLO.
        lv = report.aggregate([window(92, 5), window(93, 5), window(91, 5)], slo_ms=20)
        self.assertTrue(lv["meets_slo"])

    def test_a_level_with_no_ok_answer_never_meets_it(self):
        lv = report.aggregate([window(0, 0, ok=0, errors=100)], slo_ms=20)
        self.assertFalse(lv["meets_slo"])
        self.assertEqual(lv["error_frac"], 1.0)

    def test_capacity_is_the_best_ok_rate_among_levels_meeting_the_slo(self):
        levels = [{"ok_per_s": 50, "meets_slo": True}, {"ok_per_s": 120, "meets_slo": False},
                  {"ok_per_s": 90, "meets_slo": True}, {"ok_per_s": 70, "meets_slo": True}]
        self.assertEqual(report.capacity(levels)["ok_per_s"], 90)
        self.assertIsNone(report.capacity([{"ok_per_s": 1, "meets_slo": False}]))

    def test_peak_is_the_best_ok_rate_slo_or_not(self):
        levels = [{"ok_per_s": 50, "meets_slo": True}, {"ok_per_s": 120, "meets_slo": False}]
        self.assertEqual(report.peak(levels)["ok_per_s"], 120)
        self.assertIsNone(report.peak([]))


class Pooled(unittest.TestCase):
    @staticmethod
    def w(sent, ok_ms, p99_ms=0.0):
        counts = {}
        for v in ok_ms:
            counts[int(v * 1000)] = counts.get(int(v * 1000), 0) + 1
        return {"offered_rps": "50", "sent": str(sent), "ok": str(len(ok_ms)),
                "errors": str(sent - len(ok_ms)), "unanswered": "0", "ok_per_s": "50", "p50_ms": "1",
                "p90_ms": "1", "p99_ms": str(p99_ms), "server_cpu_s": "0", "worker_cpu_s": "0",
                "client_cpu_s": "0", "ok_rtt_us_counts": json.dumps(sorted(counts.items()))}

    def test_one_windows_failures_do_not_make_the_level_infinite(self):
        # 700 requests a window; the first has 8 failed (1.1%: its own p99
        # is among them), the other two none: 8 of 2,100 (0.38%) pooled.
        ws = [self.w(700, [5.0] * 600 + [9.0] * 92, math.inf),
              self.w(700, [5.0] * 650 + [12.0] * 50, 12.0), self.w(700, [5.0] * 690 + [15.0] * 10, 15.0)]
        p50, p90, p99 = report.pooled_percentiles(ws)
        self.assertEqual((p50, p90), (5.0, 5.0))
        # Rank ceil(0.99 * 2100) = 2079 of 2092 OK answers: 12 ms.
        self.assertEqual(p99, 12.0)
        lv = report.aggregate(ws, slo_ms=20.0)
        self.assertTrue(lv["pooled"] and lv["meets_slo"], lv)
        self.assertAlmostEqual(lv["error_frac"], 8 / 2100)

    def test_late_answers_do_not_average_out_either(self):
        # Two calm windows and one where 5% came late: the windows' mean
        # p99 would be (6 + 6 + 40) / 3 = 17.3 ms, under a 20 ms SLO; over
        # the requests together 35 of 2,100 (1.7%) are late.
        ws = [self.w(700, [5.0] * 693 + [6.0] * 7, 6.0), self.w(700, [5.0] * 693 + [6.0] * 7, 6.0),
              self.w(700, [5.0] * 665 + [40.0] * 35, 40.0)]
        lv = report.aggregate(ws, slo_ms=20.0)
        self.assertEqual(lv["p99_ms"], 40.0)
        self.assertFalse(lv["meets_slo"])

    def test_more_than_one_percent_failed_is_infinite_and_old_windows_fall_back_to_means(self):
        ws = [self.w(100, [5.0] * 98)]
        self.assertEqual(report.pooled_percentiles(ws)[2], math.inf)
        old = [dict(w, ok_rtt_us_counts="") for w in [self.w(100, [5.0] * 100, 7.0), self.w(100, [5.0] * 100, 9.0)]]
        self.assertIsNone(report.pooled_percentiles(old))
        lv = report.aggregate(old, slo_ms=20.0)
        self.assertEqual((lv["pooled"], lv["p99_ms"]), (False, 8.0))


class Repeats(unittest.TestCase):
    @staticmethod
    def one(git, caps, peaks=None, limit=200.0):
        systems = [{"system": k, "capacity": {"ok_per_s": v} if v else None,
                    "peak": {"ok_per_s": (peaks or {}).get(k, v or 1.0)}} for k, v in caps.items()]
        return {"meta": {"git": git, "started": "2026-11-27 09:00 UTC", "machine": {"cpu": "Xeon", "nproc": 2},
                         "model_info": {"squeezenet": {"peer_max_batch": 1}}},
                "models": [{"model": "squeezenet", "slo_ms": 40.0, "engine": [{"images_per_s": limit}],
                            "systems": systems}]}

    def test_medians_spreads_and_wins_only_without_overlap(self):
        runs = [self.one("a1", {"kneepoint": 190, "kneepoint-ic": 170, "triton": 120, "ray": 150}),
                self.one("a1", {"kneepoint": 185, "kneepoint-ic": 160, "triton": 125, "ray": 175}),
                self.one("a1", {"kneepoint": 195, "kneepoint-ic": 165, "triton": 118, "ray": 160})]
        row = report.repeats(runs)[0]
        self.assertEqual(row["capacity"]["kneepoint"], {"median": 190, "min": 185, "max": 195, "n": 3})
        c = {(x["kneepoint"], x["peer"]): x for x in row["comparisons"]}
        # 185..195 against 118..125: a win; the ratios' median is 190/120.
        self.assertEqual(c[("kneepoint", "triton")]["verdict"], "win")
        self.assertAlmostEqual(c[("kneepoint", "triton")]["ratio"]["median"], 190 / 120)
        # Target 1.5x on squeezenet: a median ratio >= 1.5 and a win.
        self.assertTrue(c[("kneepoint", "triton")]["target_met"])
        # 185..195 against 150..175: a win, but 1.06..1.27x is under 1.5x.
        self.assertEqual(c[("kneepoint", "ray")]["verdict"], "win")
        self.assertFalse(c[("kneepoint", "ray")]["target_met"])
        # 160..170 against 150..175: the spreads overlap.
        self.assertEqual(c[("kneepoint-ic", "ray")]["verdict"], "overlap")
        self.assertIsNone(c[("kneepoint-ic", "ray")]["target"])
        md = report.repeats_markdown(runs)
        self.assertIn("| kneepoint | 190.0 [185.0–195.0] |", md)
        self.assertIn("- squeezenet: kneepoint / Triton = 1.58× [1.48–1.65]", md)
        self.assertIn("a win: the capacity spreads do not overlap; the issue's target (a median ≥ 1.5× and a win) is met", md)
        self.assertIn("kneepoint-ic / Ray Serve = 1.03× [0.91–1.13], not a win or a loss", md)
        self.assertIn("kneepoint's capacity is 0.95 of the engine limit", md)
        self.assertNotIn("dirty", md)
        self.assertIn("on Xeon (2 CPUs).", md)
        self.assertNotIn("machines", md)

    def test_targets_are_judged_only_against_peers_with_a_tuned_batch_cap(self):
        runs = [self.one("a1", {"kneepoint": 190, "triton": 120}) for _ in range(3)]
        row = report.repeats(runs)[0]
        self.assertTrue(row["peers_tuned"])
        self.assertTrue(row["comparisons"][0]["target_met"])
        self.assertIn("- squeezenet: the peers' batch cap was tuned for the SLO in every run (1).",
                      report.repeats_markdown(runs))
        # One run from before the peers' cap was tuned: still a win, but
        # the target is not judged.
        del runs[1]["meta"]["model_info"]
        row = report.repeats(runs)[0]
        self.assertEqual((row["peers_tuned"], row["peer_caps"]), (False, [1, None, 1]))
        c = row["comparisons"][0]
        self.assertEqual(c["verdict"], "win")
        self.assertFalse(c["target_met"])
        md = report.repeats_markdown(runs)
        self.assertIn("a win: the capacity spreads do not overlap; the issue's target (a median ≥ 1.5× and a "
                      "win) is not judged: the peers' batch cap was not tuned for the SLO.", md)
        self.assertIn("- squeezenet: the peers' batch cap was kneepoint's in 1 of the runs, not tuned", md)

    def test_runs_of_several_machines_are_said(self):
        runs = [self.one("a1", {"kneepoint": 190, "triton": 120}) for _ in range(3)]
        runs[1]["meta"]["machine"] = {"cpu": "AMD EPYC", "nproc": 2}
        md = report.repeats_markdown(runs)
        self.assertIn("on Xeon (2 CPUs) and AMD EPYC (2 CPUs).", md)
        self.assertIn("The runs of squeezenet are of 2 machines", md)

    def test_a_peer_that_never_met_the_slo_gives_a_lower_bound_and_can_be_beaten(self):
        runs = [self.one("c3", {"kneepoint": 90, "ray": None}) for _ in range(3)]
        for r, low in zip(runs, (3.2, 3.0, 3.4)):
            r["models"][0]["systems"][1]["bracket"] = [None, low]
        row = report.repeats(runs)[0]
        c = row["comparisons"][0]
        self.assertEqual((c["peer"], c["verdict"], c["at_least"]), ("ray", "win", True))
        self.assertAlmostEqual(c["ratio"]["median"], 90 / 3.2)
        md = report.repeats_markdown(runs)
        self.assertIn("| Ray Serve | no level met the SLO in 3 of the runs: below 3.2 [3.0–3.4] |", md)
        self.assertIn("kneepoint / Ray Serve = at least 28.12× [26.47–30.00]", md)
        # One run is not a verdict, however large the ratio.
        row = report.repeats(runs[:1])[0]
        self.assertEqual(row["comparisons"][0]["verdict"], "few")
        self.assertFalse(row["comparisons"][0]["target_met"])
        self.assertIn("1 of the 3 runs a verdict needs; the issue's target (a median ≥ 1.5× and a win) is not "
                      "judged yet", report.repeats_markdown(runs[:1]))

    def test_a_loss_a_missing_capacity_and_a_dirty_tree_are_said(self):
        runs = [self.one("b2+dirty", {"kneepoint": 100, "triton": 150}),
                self.one("b2", {"kneepoint": 110, "triton": None}),
                self.one("b2", {"kneepoint": 105, "triton": 160})]
        row = report.repeats(runs)[0]
        c = row["comparisons"][0]
        self.assertEqual(row["capacity"]["triton"]["n"], 2)
        self.assertEqual(c["verdict"], "loss")
        self.assertEqual(c["ratio"]["n"], 2)  # only the runs where both met the SLO
        self.assertIn("not a record", report.repeats_markdown(runs))

    def test_each_models_series_may_be_of_its_own_commit_but_not_of_two(self):
        runs = [self.one("a1", {"kneepoint": 190, "triton": 120}) for _ in range(3)]
        other = [self.one("b2", {"kneepoint": 7, "triton": 5}) for _ in range(2)] + [
            self.one("c3", {"kneepoint": 7, "triton": 5})]
        for r in other:
            r["models"][0]["model"] = "resnet50"
        md = report.repeats_markdown(runs + other)
        self.assertNotIn("squeezenet are of", md)
        self.assertIn("**The runs of resnet50 are of 2 commits (b2, c3) whose measured code cannot be compared "
                      "here: not one record.**", md)
        self.assertEqual(md.count("not one record"), 1)
        # Commits whose measured code differs (bench/provenance.py), and
        # commits that differ only outside it (a session's own results).
        for r, code in zip(other, ("d1", "d1", "d2")):
            r["meta"]["measured"] = code
        self.assertIn("**The runs of resnet50 are of 2 commits (b2, c3) whose measured code differs: not one "
                      "record.**", report.repeats_markdown(runs + other))
        other[2]["meta"]["measured"] = "d1"
        md = report.repeats_markdown(runs + other)
        self.assertNotIn("not one record", md)
        self.assertIn("The runs of resnet50 are of 2 commits (b2, c3) whose measured code is the same (digest "
                      "d1; they differ only in documentation, tests, report code or other benchmarks' harness): one "
                      "record.", md)

    def test_runs_are_compared_on_the_side_by_sides_own_measured_code_where_git_has_their_commits(self):
        runs = [self.one(c, {"kneepoint": 190, "triton": 120}) for c in ("a1", "b2")]
        for r, code in zip(runs, ("all-1", "all-2")):
            r["meta"]["measured"] = code  # b2 changed another benchmark's harness
        real = report.provenance.measured_digest
        try:
            report.provenance.measured_digest = lambda c, section=None: {"a1": "peers", "b2": "peers"}.get(c)
            self.assertEqual(report.measured_code(runs), ["peers", "peers"])
            self.assertIn("whose measured code is the same (digest peers;", report.repeats_markdown(runs))
            # One commit git cannot read: the digests the runs recorded.
            report.provenance.measured_digest = lambda c, section=None: {"a1": "peers"}.get(c)
            self.assertEqual(report.measured_code(runs), ["all-1", "all-2"])
            self.assertIn("whose measured code differs: not one record", report.repeats_markdown(runs))
        finally:
            report.provenance.measured_digest = real

    def test_a_search_cut_by_its_budget_counts_with_its_brackets_upper_end(self):
        # Triton's search was cut with a bracket 150 (met) / 180 (missed):
        # its capacity may be up to 180, above kneepoint's lowest 175, so
        # no win, though 175 > Triton's measured 150.
        runs = [self.one("a1", {"kneepoint": c, "triton": 150}) for c in (175, 185, 190)]
        for r in runs:
            tr = r["models"][0]["systems"][1]
            tr.update(bracket=[150.0, 180.0], search_cut="budget ran out", resolution=0.02)
        row = report.repeats(runs)[0]
        c = {x["peer"]: x for x in row["comparisons"]}
        self.assertEqual(c["triton"]["verdict"], "overlap")
        self.assertEqual([round(w, 9) for w in row["cut"]["triton"]], [0.2, 0.2, 0.2])
        md = report.repeats_markdown(runs)
        self.assertIn("not resolved in 3 of the runs (time budget; bracket 20.0–20.0% wide)", md)
        # The same runs with Triton's bracket resolved to 2%: a win.
        for r in runs:
            r["models"][0]["systems"][1]["bracket"] = [150.0, 152.0]
        self.assertEqual({x["peer"]: x for x in report.repeats(runs)[0]["comparisons"]}["triton"]["verdict"], "win")

    def test_what_the_engine_allows_is_drawn_from_each_runs_engine(self):
        runs = [self.one("a1", {"kneepoint": k, "triton": 30}) for k in (45, 48, 50)]
        for r, b1 in zip(runs, (10.0, 10.2, 9.9)):
            r["models"][0]["engine"] = [{"batch": 1, "median_ms": b1, "images_per_s": 1000 / b1},
                                        {"batch": 2, "median_ms": 2.1 * b1, "images_per_s": 2000 / (2.1 * b1)}]
        row = report.repeats(runs)[0]
        a = row["allowed"]
        # The SLO is 40 ms, four batch-1 times: ~0.53 of the engine limit
        # (~100 images/s) with <= 1% refused, more than the ideal FIFO.
        self.assertGreater(a["bound_of_limit"]["median"], 0.45)
        self.assertLess(a["bound_of_limit"]["median"], 0.65)
        self.assertGreater(a["bound_over_fifo"]["min"], 1.0)
        self.assertEqual(a["batches"], [1, 2])
        self.assertEqual(a["kneepoint_of_bound"]["n"], 3)
        self.assertAlmostEqual(a["kneepoint_of_bound"]["max"], 50 / a["bound_per_s"]["min"], delta=0.05)
        md = report.repeats_markdown(runs)
        self.assertIn("- squeezenet: what the engine allows (a simulation, bench/schedule_bound.py, from each run's "
                      "engine medians at batch 1, 2): no server on this engine meets the SLO above ", md)
        # Runs without the engine's batch costs (older summaries): no line.
        self.assertNotIn("allowed", report.repeats([self.one("a1", {"kneepoint": 45})])[0])

    @staticmethod
    def guarded(run, speeds):
        """RUN with drift-guard checks: SPEEDS, images/s at batch 1 at the
        start and after each of its systems in order."""
        m = run["models"][0]
        order = ["start"] + [s["system"] for s in m["systems"]]
        m["engine_checks"] = [{"after": w, "median_ms": 1000 / v, "images_per_s": v} for w, v in zip(order, speeds)]
        return run

    def test_the_drift_guard_reads_each_capacity_against_the_engine_around_its_own_search(self):
        run = self.guarded(self.one("a1", {"kneepoint": 40, "triton": 36}), [100, 80, 120])
        m = run["models"][0]
        # kneepoint ran between the checks of 100 and 80 images/s, Triton
        # between 80 and 120: a slow spell for one, a fast one for the other.
        self.assertEqual(report.engine_around(m), {"kneepoint": 90.0, "triton": 100.0})
        self.assertAlmostEqual(report.engine_drift(m), 120 / 80 - 1)
        self.assertEqual(report.engine_around(self.one("a1", {"kneepoint": 40})["models"][0]), {})
        self.assertIsNone(report.engine_drift(self.one("a1", {"kneepoint": 40})["models"][0]))
        m["points"], m["plot"], m["engine"] = [], None, [{"batch": 1, "median_ms": 10.0, "images_per_s": 100.0}]
        for s in m["systems"]:
            s.update(points={}, bracket=None, cpu_level=None)
        md = report.model_markdown(m)
        self.assertIn("Drift guard (the engine alone at batch 1 on the same core, every system stopped, before the "
                      "first system and after each): 10.00 ms at the start, 12.50 ms after kneepoint, 8.33 ms after "
                      "Triton: its speed moved by 50.0% within the run.", md)
        self.assertIn("kneepoint / Triton = **1.11×** (at each one's engine speed: 1.23×)", md)

    def test_a_target_met_only_in_a_drift_the_guard_sees_is_not_met(self):
        # Raw: 60 against 38-40, a win at 1.5-1.58x. But kneepoint ran in
        # a fast spell (engine 120 images/s around it) and Triton in a
        # slowing one (120, then 90: 105): at each one's engine speed
        # 1.31-1.38x, under the target.
        runs = [self.guarded(self.one("a1", {"kneepoint": 60, "triton": t}), [120, 120, 90]) for t in (38, 39, 40)]
        c = report.repeats(runs)[0]["comparisons"][0]
        self.assertEqual((c["verdict"], c["verdict_at_speed"]), ("win", "win"))
        self.assertAlmostEqual(c["ratio"]["median"], 60 / 39)
        self.assertAlmostEqual(c["ratio_at_speed"]["median"], (60 / 120) / (39 / 105))
        self.assertFalse(c["target_met"])
        md = report.repeats_markdown(runs)
        self.assertIn("kneepoint / Triton = 1.54× [1.50–1.58], a win: the capacity spreads do not overlap; at each "
                      "one's engine speed (the drift guard): 1.35× [1.31–1.38], a win; the issue's target (a median "
                      "≥ 1.5× and a win, at each one's engine speed too) is not met.", md)
        self.assertIn("- squeezenet: within a run the engine's speed moved by 33.3% [33.3–33.3] (the drift guard, "
                      "in 3 of the 3 runs).", md)
        # A steady engine: the guard agrees and the target is met.
        for r in runs:
            self.guarded(r, [100, 100, 100])
        c = report.repeats(runs)[0]["comparisons"][0]
        self.assertTrue(c["target_met"])
        # One run without the guard: the raw verdict alone, as before it.
        del runs[0]["models"][0]["engine_checks"]
        row = report.repeats(runs)[0]
        self.assertIsNone(row["comparisons"][0]["ratio_at_speed"])
        self.assertTrue(row["comparisons"][0]["target_met"])
        self.assertIn("(the drift guard, in 2 of the 3 runs); ratios at each one's engine speed need it in every "
                      "run.", report.repeats_markdown(runs))

    def test_a_cut_search_is_flagged_under_the_runs_table(self):
        def sysm(name, bracket, cut):
            return {"system": name, "capacity": {"ok_per_s": bracket[0], "offered_rps": bracket[0]},
                    "peak": None, "points": {}, "levels": [], "bracket": bracket, "search_cut": cut,
                    "resolution": 0.02, "cpu_level": None}
        m = {"model": "resnet50", "slo_ms": 310.0, "engine": [{"batch": 1, "median_ms": 77.0, "images_per_s": 13.0}],
             "points": [], "plot": None,
             "systems": [sysm("kneepoint", [6.7, 6.8], "budget"), sysm("triton", [5.0, 6.0], "budget"),
                         sysm("ray", [5.0, 6.0], None)]}
        md = report.model_markdown(m)
        self.assertIn("kneepoint 6.70 / 6.80;", md)  # cut, but resolved: not flagged
        self.assertIn("Triton 5.00 / 6.00 (**not resolved**: the search's time budget ran out with the bracket "
                      "20.0% wide)", md)
        self.assertIn("Ray Serve 5.00 / 6.00.", md)  # not cut: its own search ended there
        # Without point levels (BENCH_POINTS=,) the table has no empty column.
        self.assert_table_is_rectangular(md, columns=5)
        m["points"] = [0.5]
        m["systems"][0]["points"] = {"0.5": {"p50_ms": 80.0, "p90_ms": 150.0, "p99_ms": 250.0, "meets_slo": True}}
        self.assert_table_is_rectangular(report.model_markdown(m), columns=6)

    def assert_table_is_rectangular(self, md: str, columns: int):
        rows = [l for l in md.splitlines() if l.startswith("|")]
        self.assertEqual(len(rows), 5, rows)  # header, rule, three systems
        for row in rows:
            self.assertEqual(row.count("|") - 1, columns, row)
            self.assertNotIn("|  |", row)


class Documents(unittest.TestCase):
    def test_the_section_between_the_markers_is_replaced_and_the_rest_kept(self):
        doc = f"# Perf\n\nbefore\n{report.BEGIN}\nold\n{report.END}\nafter\n"
        new = report.replace_section(doc, "new table\n")
        self.assertEqual(new, f"# Perf\n\nbefore\n{report.BEGIN}\nnew table\n{report.END}\nafter\n")
        self.assertIsNone(report.replace_section("no markers here", "x"))

    def test_the_plot_is_well_formed_svg_with_one_line_per_system_and_percentile(self):
        def lv(rate, p50, p99, ok=True):
            return {"offered_rps": rate, "ok_per_s": rate, "p50_ms": p50, "p90_ms": (p50 + p99) / 2,
                    "p99_ms": p99, "meets_slo": ok, "phase": "sweep"}
        series = {"kneepoint": [lv(100, 4, 6), lv(200, 5, 9), lv(300, 9, 30, False)],
                  "triton": [lv(100, 6, 9), lv(200, 8, 25, False)]}
        svg = report.svg_plot("squeezenet", 20.0, 310.0, series, "test")
        root = ET.fromstring(svg)
        self.assertTrue(root.tag.endswith("svg"))
        polylines = [e for e in root.iter() if e.tag.endswith("polyline")]
        self.assertGreaterEqual(len(polylines), 6, "p50/p90/p99 for each of two systems")
        self.assertIn("Triton", svg)


if __name__ == "__main__":
    unittest.main()
