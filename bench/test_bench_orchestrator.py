"""Unit tests of bench/bench_orchestrator.py, the Python of
scripts/bench-orchestrator.sh: switchover gaps, client totals, kp-if
succession reports, the tuner's trajectory and convergence, and the
summary's markdown (run by `make test`).

    .venv/bin/python -m unittest bench/test_bench_orchestrator.py
"""

from __future__ import annotations

import json
import sys
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_orchestrator as bo  # noqa: E402


class Switchover(unittest.TestCase):
    def test_gap_distribution_is_nearest_rank(self):
        self.assertEqual(bo.gap_stats([120.5, 80.0, 300.25, 95.0]), {
            "n": 4, "p50": 95.0, "p90": 300.25, "p99": 300.25, "min": 80.0, "max": 300.25, "mean": 148.9375})
        self.assertEqual(bo.gap_stats([]), {"n": 0, "p50": None, "p90": None, "p99": None, "min": None,
                                            "max": None, "mean": None})

    def test_gaps_csv_numbers_the_switchovers(self):
        self.assertEqual(bo.gaps_csv([112.8, 86]), "n,gap_us\n1,112.8\n2,86\n")

    def test_command_to_active_from_the_csv_rows(self):
        rows = [{"n": "1", "cmd_to_active_ms": "930.0"}, {"n": "2", "cmd_to_active_ms": "1013.1"},
                {"n": "3", "cmd_to_active_ms": "700.5"}]
        self.assertEqual(bo.command_to_active(rows), {"p50": 930.0, "p90": 1013.1, "max": 1013.1})

    def test_client_totals_count_every_error_of_every_piece(self):
        piece = lambda sent, ok, over, un, dup: {"sent": sent, "answered": ok + over, "unanswered": un, "duplicates": dup,
                                                 "late": 0, "unexpected": 0, "malformed": 0,
                                                 "status": {"ok": ok, "overloaded": over}}
        tot = bo.client_totals([piece(400, 398, 1, 1, 0), {"failed": 143}, piece(410, 410, 0, 0, 1)])
        self.assertEqual(tot, {"pieces": 2, "failed_pieces": 1, "sent": 810, "answered": 809, "unanswered": 1,
                               "duplicates": 1, "late": 0, "unexpected": 0, "malformed": 0,
                               "status": {"ok": 808, "overloaded": 1}, "errors": 3})

    def test_succession_is_the_last_line_of_a_kp_if_output(self):
        report = "kp-if: starting\n" + json.dumps({"if_id": 1, "succession": {"taken": "handed", "forwarded": 73}}) + "\n"
        self.assertEqual(bo.succession(6002, report), {"pid": 6002, "if_id": 1, "taken": "handed", "forwarded": 73})
        self.assertEqual(bo.succession(6006, '{"if_id": 5}'), {"pid": 6006, "if_id": 5})
        self.assertIsNone(bo.succession(6007, ""))
        self.assertIsNone(bo.succession(6008, "{not json\n"))

    def test_handovers_count_only_if_1_processes_handed_the_ring(self):
        procs = [{"pid": 1, "if_id": 1, "taken": "fresh", "yielded": True},
                 {"pid": 2, "if_id": 1, "taken": "handed", "handed_in_flight": 1, "forwarded": 73, "forward_lost": 0,
                  "yielded": True},
                 {"pid": 3, "if_id": 1, "taken": "handed", "handed_in_flight": 0, "forwarded": 0},
                 {"pid": 4, "if_id": 5, "taken": "handed", "handed_in_flight": 4, "forwarded": 9},
                 {"pid": 5, "if_id": 1, "taken": "handed", "handed_in_flight": 2, "forwarded": 140, "forward_lost": 3}]
        self.assertEqual(bo.handovers(procs), {
            "processes": 5, "reports_if1_handed": 3, "handovers_with_requests_in_flight": 2,
            "handed_in_flight_total": 3, "fragments_forwarded_total": 213, "forward_lost_total": 3, "yielded_if1": 2})


def decision(if_id, t_s, share, to=None, reason="band", held=None, estimate=None):
    obs = {"share_pct": share, "latency_ms": 4.56, "slo_ms": 100.0, "throughput_rps": 40.04, "arrival_rps": 39.96}
    return {"if_id": if_id, "at_ns": int(t_s * 1e9), "from_pct": share, "to_pct": share if to is None else to,
            "reason": reason, "held": held, "inputs": {"observation": obs, "estimate_pct": estimate}}


META = {"hold_down_s": 10, "tuning_period_ms": 1000, "stable_k": 4}


class Convergence(unittest.TestCase):
    # Load from t = 10 s to 100 s on the daemon's clock: if 1 goes 90 -> 70
    # before the load (not counted in the quiet time), 70 -> 50 at 20 s and
    # back up 50 -> 60 at 40 s (a change is dated by the decision that logs
    # the old share, applied by the next); if 5 never changes.
    DECISIONS = [decision(1, 5.0, 90.0, 70.0, "under_used", estimate=69.5), decision(5, 5.5, 10.0),
                 decision(1, 6.0, 70.0), decision(1, 30.0, 70.0, 50.0, "under_used"),
                 decision(1, 31.0, 50.0, held="hold_down"), decision(1, 50.0, 50.0, 60.0, "over_slo"),
                 decision(1, 51.0, 60.0), decision(5, 60.0, 10.0, reason="idle"), decision(1, 120.0, 60.0)]

    def test_trajectory_csv(self):
        traj = bo.trajectory(self.DECISIONS[:2], 10.0)
        self.assertEqual(bo.trajectory_csv(traj), (
            "if_id,t_s,share_pct,demand_from,demand_to,reason,held,latency_ms,slo_ms,throughput_rps,arrival_rps,estimate_pct\n"
            "1,-5.000,90.000,90.000,70.000,under_used,,4.560,100.000,40.040,39.960,69.500\n"
            "5,-4.500,10.000,10.000,10.000,band,,4.560,100.000,40.040,39.960,\n"))

    def test_share_changes_reversals_and_reasons(self):
        traj = bo.trajectory(self.DECISIONS, 10.0)
        changes = bo.share_changes(traj)
        self.assertEqual(changes[5], [])
        self.assertEqual([(c["decided_s"], c["applied_by_s"], c["from"], c["to"]) for c in changes[1]],
                         [(-5.0, -4.0, 90.0, 70.0), (20.0, 21.0, 70.0, 50.0), (40.0, 41.0, 50.0, 60.0)])
        self.assertEqual(bo.direction_reversals(changes), {1: 1, 5: 0})
        self.assertEqual(bo.reasons_under_load(traj, 90.0), {1: {"band": 1, "band/hold_down": 1, "over_slo": 1,
                                                                 "under_used": 1}, 5: {"idle": 1}})

    def test_convergence_counts_from_the_last_change_under_load(self):
        traj = bo.trajectory(self.DECISIONS, 10.0)
        log = ["orchestrator: re-provisioning if 1 (share): starting kp-if\n",
               "orchestrator: if 1 switched to pid 7001 (handed); gap 123.4 µs\n", "orchestrator: re-reading cores\n",
               "orchestrator: shutdown\n"]
        c = bo.convergence(META, self.DECISIONS, traj, 90.0, log)
        self.assertEqual(c["stable_window_s"], 40)
        self.assertEqual((c["convergence_decided_s"], c["convergence_applied_s"], c["quiet_after_last_change_s"]),
                         (40.0, 41.0, 50.0))
        self.assertTrue(c["converged"])
        self.assertEqual(c["share_changes_before_load"], 1)
        self.assertEqual(c["demand_changes"], 3)
        self.assertEqual((c["reprovisions_logged"], c["switchovers_logged"]), (1, 1))
        self.assertEqual(c["final"][1]["share_pct"], 60.0)
        self.assertEqual(c["final"][1]["reasons_last5"], ["band", "under_used", "band", "over_slo", "band"])
        self.assertEqual(c["final"][5]["held_last5"], [None, None])
        # A window (70 s) longer than the quiet time (50 s): not converged.
        self.assertFalse(bo.convergence(dict(META, stable_k=7), self.DECISIONS, traj, 90.0, log)["converged"])

    def test_no_share_change_counts_as_converged_from_the_start(self):
        d = [decision(1, 11.0, 50.0), decision(1, 12.0, 50.0)]
        c = bo.convergence(META, d, bo.trajectory(d, 10.0), 45.0, [])
        self.assertEqual((c["converged"], c["convergence_decided_s"], c["quiet_after_last_change_s"]), (True, 0.0, 45.0))

    def test_a_change_decided_within_a_second_before_the_load_counts(self):
        d = [decision(1, 9.5, 50.0, 60.0), decision(1, 10.5, 60.0), decision(1, 12.0, 60.0)]
        c = bo.convergence(META, d, bo.trajectory(d, 10.0), 45.0, [])
        self.assertEqual((c["convergence_decided_s"], c["quiet_after_last_change_s"]), (-0.5, 45.5))
        self.assertEqual(c["share_changes_before_load"], 0)

    def test_client_summary_and_kp_if_cores(self):
        report = {"sent": 6000, "answered": 5999, "unanswered": 1, "throughput": 39.9, "status": {"ok": 5990},
                  "rtt_us": {"p50": 9120, "p99": 17330}, "duplicates": 0}
        self.assertEqual(bo.client_summary(report), {"sent": 6000, "answered": 5999, "unanswered": 1, "throughput": 39.9,
                                                     "status": {"ok": 5990}, "rtt_ms_p50": 9.12, "rtt_ms_p99": 17.33})
        line = ("kp-if: ready: squeezenet as if 1 on kp_if_1 (onnxruntime, 1 threads on cores [1], slo 100ms, "
                "capacity 64, max batch 8)\n")
        self.assertEqual(bo.kp_if_cores([line, line.replace("[1]", "[0, 1]"), line]),
                         ["if 1 on kp_if_1 [0, 1]", "if 1 on kp_if_1 [1]"])


class Impact(unittest.TestCase):
    """Switchovers as clients see them: which requests were in flight near
    one, and how those fared against the others."""

    @staticmethod
    def rec(sent, latency_us, outcome="ok"):
        return {"request_id": str(sent), "sent": sent, "outcome": outcome,
                "answered": sent + latency_us if latency_us is not None else None}

    def test_in_flight_within_the_margin_of_a_window(self):
        w = [(1_000_000, 1_000_500), (5_000_000, 5_000_200)]
        near = lambda s, e: bo.near_a_switchover(s, e, w, 10_000)  # noqa: E731
        self.assertTrue(near(999_000, 1_000_100))    # across the window
        self.assertTrue(near(1_010_400, 1_020_000))  # sent 9.9 ms after it ended
        self.assertFalse(near(1_010_600, 1_020_000))  # 10.1 ms after
        self.assertTrue(near(980_000, 990_100))      # answered 9.9 ms before it began
        self.assertFalse(near(900_000, 989_000))     # 11 ms before
        self.assertTrue(near(4_995_000, 4_996_000))  # the second window
        self.assertFalse(near(3_000_000, 3_001_000))
        self.assertFalse(bo.near_a_switchover(0, 1, [], 10_000))

    def test_near_against_the_others(self):
        w = [[1_000_000, 1_000_500]]
        records = [self.rec(2_000_000 + 10_000 * i, 8_000) for i in range(98)]  # far: 8 ms
        records += [self.rec(995_000, 20_000), self.rec(1_000_200, 10_000)]    # near: 20 and 10 ms
        records += [self.rec(1_001_000, None, "unanswered"), self.rec(3_500_000, 9_000, "overloaded")]
        r = bo.switchover_impact(records, w, 10_000)
        self.assertEqual(r["switchovers"], 1)
        self.assertEqual((r["near"]["requests"], r["near"]["ok"], r["near"]["failed"]), (3, 2, 1))
        self.assertEqual(r["near"]["statuses"], {"ok": 2, "unanswered": 1})
        self.assertEqual((r["other"]["requests"], r["other"]["ok"], r["other"]["failed"]), (99, 98, 1))
        self.assertEqual(r["near"]["latency_ms"]["p99"], 20.0)
        self.assertEqual(r["other"]["latency_ms"]["p99"], 8.0)
        self.assertEqual(r["p99_ratio"], 2.5)
        self.assertFalse(r["meets_target"])
        # Without the failure and the slow one, the target is met.
        ok = [x for x in records if x["outcome"] == "ok" and x["sent"] != 995_000]
        r = bo.switchover_impact(ok, w, 10_000)
        self.assertEqual(r["p99_ratio"], 10.0 / 8.0)
        self.assertTrue(r["meets_target"])

    def test_latency_around_the_nearest_switchover(self):
        w = [[1_000_000, 10_000_000], [20_000_000, 20_000_500]]
        records = [self.rec(9_900_000, 5_000), self.rec(10_100_000, 7_000), self.rec(10_200_000, 9_000),
                   self.rec(19_000_000, 30_000), self.rec(20_000_400, 11_000, "overloaded"),
                   self.rec(13_600_000, 1_000)]  # 3.6 s after the first, 6.4 s before the second
        bins = bo.around_switchovers(records, w)
        self.assertEqual(len(bins), 14)
        by = {b["from_s"]: b for b in bins}
        self.assertEqual((by[-0.5]["requests"], by[-0.5]["p50_ms"]), (1, 5.0))   # 0.1 s before the first end
        self.assertEqual((by[0.0]["requests"], by[0.0]["p99_ms"]), (2, 9.0))    # 0.1 and 0.2 s after
        self.assertEqual((by[-1.5]["requests"], by[-1.5]["p50_ms"]), (1, 30.0))  # 1.0005 s before the second
        self.assertEqual(by[3.5]["requests"], 1, "3.6 s after the first is nearer than 6.4 s before the next")
        self.assertEqual(sum(b["requests"] for b in bins), 5, "a failed request is not a latency")
        self.assertEqual(bo.around_switchovers(records, [])[0]["requests"], 0)

    def test_the_slowest_request_at_each_switchover(self):
        w = [[1_000_000, 1_000_500], [5_000_000, 5_000_400], [9_000_000, 9_000_100]]
        records = [self.rec(700_000, 30_000),            # 300 ms before the first: counted
                   self.rec(699_000, 900_000),           # 301 ms before: not
                   self.rec(1_010_400, 12_000),          # 9.9 ms after it ended: counted
                   self.rec(4_990_000, 600_000),         # the second
                   self.rec(4_995_000, None, "unanswered"),
                   self.rec(9_000_050, 8_000)]           # the third
        r = bo.worst_near_switchovers(records, w)
        self.assertEqual(r["per_switchover_ms"], [30.0, 600.0, 8.0])
        self.assertEqual((r["median_ms"], r["over_500ms"]), (30.0, 1))
        self.assertEqual(bo.worst_near_switchovers(records, [[20_000_000, 20_000_100]])["per_switchover_ms"], [0.0])

    def test_result_from_a_phase_directory(self):
        import tempfile

        with tempfile.TemporaryDirectory() as d:
            summary = {"ifs": [{"if_id": 1, "switchovers": 1, "switchover_gaps_us": [50.0],
                                "switchover_windows_unix_us": [[1_000_000, 1_000_500]], "failovers": 0},
                               {"if_id": 5, "switchovers": 0, "switchover_gaps_us": [],
                                "switchover_windows_unix_us": [], "failovers": 0}]}
            Path(d, "summary.json").write_text("log line\n" + json.dumps(summary) + "\n")
            Path(d, "record-if1-0.csv").write_text(
                "request_id,sent_unix_us,outcome,answered_unix_us\n1,995000,ok,1005000\n2,3000000,ok,3008000\n")
            Path(d, "record-if1-1.csv").write_text(
                "request_id,sent_unix_us,outcome,answered_unix_us\n3,1000100,unanswered,\n")
            Path(d, "rate.txt").write_text("160.0 80.0\n")
            Path(d, "meta.json").write_text(json.dumps({"date": "d", "cpus": "0-1", "loadavg_at_start": ["1", "1", "1"],
                                                        "cpu_pressure_at_start": None}))
            Path(d, "loadavg.end").write_text("2 2 2\n")
            piece = {"sent": 3, "answered": 2, "unanswered": 1, "duplicates": 0, "late": 0, "unexpected": 0,
                     "malformed": 0, "status": {"ok": 2}}
            Path(d, "client-if1.jsonl").write_text(json.dumps(piece) + "\n")
            Path(d, "client-if5.jsonl").write_text("")
            r = bo.impact_result(d, 10.0)
            self.assertEqual(r["load_fraction"], 0.5)
            self.assertEqual((r["near"]["requests"], r["near"]["failed"], r["other"]["requests"]), (2, 1, 1))
            self.assertEqual(r["clients"]["if1"]["errors"], 1)
            self.assertTrue(Path(d, "result.json").exists())
            md = bo.impact_markdown(r)
            self.assertEqual(md[0], "## Switchovers as clients see them, 50% load (d, commit not recorded, CPUs 0-1, "
                                    "load average 1 1 1 -> 2 2 2)\n")
            self.assertEqual(md[4], "| near a switchover | 2 | 1 | 1 | 10.00 | 10.00 | 10.00 | 10.00 |")


class EndToEnd(unittest.TestCase):
    ENGINE = [{"kind": "engine_bench", "engine": "cudnn", "batch": b, "latency_ms": {"median": m}}
              for b, m in ((1, 2.0), (2, 2.5), (3, 3.0), (4, 4.0))]

    def test_the_engine_is_timed_at_the_batch_mix_the_if_ran(self):
        # 10 answers from batches of 1 (10 batches, 20 ms) and 8 from
        # batches of 4 (2 batches, 8 ms): 18 images in 28 ms alone.
        a = bo.engine_at_mix(self.ENGINE, {"1": 10, "4": 8})
        self.assertAlmostEqual(a["engine_seconds"], 0.028)
        self.assertAlmostEqual(a["images_per_s"], 18 / 0.028)
        self.assertAlmostEqual(a["mean_batch"], 18 / 12)
        self.assertEqual(a["batch_mix"], {"1": 10, "4": 8})

    def test_a_batch_size_the_engine_was_not_timed_at_is_an_error(self):
        with self.assertRaisesRegex(ValueError, r"\[8\]"):
            bo.engine_at_mix(self.ENGINE, {"1": 3, "8": 8})

    def test_result_from_a_phase_directory(self):
        import tempfile

        with tempfile.TemporaryDirectory() as d:
            Path(d, "meta.json").write_text(json.dumps({
                "date": "d", "cpus": "0-7", "loadavg_at_start": ["1", "1", "1"], "cpu_pressure_at_start": None,
                "if1": {"model": "resnet50", "share": 20, "slo_ms": 2000, "rate": 0}}))
            Path(d, "loadavg.end").write_text("2 2 2\n")
            Path(d, "engine.jsonl").write_text("".join(json.dumps(e) + "\n" for e in self.ENGINE))
            # 400 OK in 1 s, all from batches of 2: the engine alone does
            # 2 images per 2.5 ms, 800/s; end to end is half of that.
            Path(d, "client.json").write_text(json.dumps({
                "sent": 401, "status": {"ok": 400, "incomplete": 1}, "answer_span_s": 1.0, "send_duration_s": 1.0,
                "concurrency": 8, "ok_by_batch_size": {"2": 400}}))
            r = bo.e2e_result(d)
            self.assertAlmostEqual(r["ratio"], 0.5)
            self.assertEqual((r["ok"], r["failed"], r["engine"], r["model"]), (400, 1, "cudnn", "resnet50"))
            self.assertFalse(r["meets_target"])
            self.assertTrue(Path(d, "result.json").exists())
            md = bo.e2e_markdown(r)
            self.assertEqual(md[4], "| 400.0 | 800.0 | 0.500 | 2.00 | 2: 400 |\n")


class Markdown(unittest.TestCase):
    FACTS = {"date": "2026-11-24 10:00:00 UTC", "commit": "e3af789", "cpus": "0-1",
             "loadavg_at_start": ["1.70", "1.02", "0.87"],
             "loadavg_at_end": ["2.31", "1.95", "1.40"]}

    def test_switchover_section(self):
        r = dict(self.FACTS, ifs={"1": {"gap_us": {"n": 24, "p50": 240.71, "p90": 386.05, "p99": 1520.25,
                                                   "max": 1520.25, "min": 30.5}}},
                 errors_total=4, clients={"if1": {"sent": 810, "answered": 809, "unanswered": 1, "duplicates": 1,
                                                  "status": {"ok": 808}, "failed_pieces": 1}},
                 kp_if={"handovers_with_requests_in_flight": 2, "reports_if1_handed": 3, "handed_in_flight_total": 3,
                        "fragments_forwarded_total": 213, "forward_lost_total": 3},
                 cmd_to_active_ms={"p50": 1144.4, "p90": 1706.6, "max": 1896.0})
        self.assertEqual(bo.switchover_markdown(r), [
            "## Switchover gaps (2026-11-24 10:00:00 UTC, commit e3af789, CPUs 0-1, load average 1.70 1.02 0.87 -> "
            "2.31 1.95 1.40)\n",
            "| switchovers | gap p50 | p90 | p99 | max | min | errors (if 1 + if 5) |",
            "|---|---|---|---|---|---|---|",
            "| 24 | 240.7 µs | 386.1 µs | 1520.2 µs | 1520.2 µs | 30.5 µs | 4 |\n",
            "- if1: 810 sent, 809 answered, 1 unanswered, 1 duplicates, status {'ok': 808}, 1 failed pieces",
            "- handovers with requests in flight: 2 of 3; 3 requests handed back, 213 fragments forwarded, "
            "3 lost in forwarding",
            "- command to active (new process started, model loaded, switched): p50 1144 ms, p90 1707 ms, max 1896 ms\n"])

    def test_convergence_section(self):
        r = dict(self.FACTS, phase="convergence too-small",
                 scenario={"if1": {"share": 10, "slo_ms": 5, "rate": 120}, "if5": {"share": 90, "slo_ms": 100, "rate": 30},
                           "tuning_period_ms": 1000, "hold_down_s": 10, "min_step_pct": 5},
                 stable_window_s=40, converged=True, convergence_decided_s=21.04, convergence_applied_s=41.0,
                 quiet_after_last_change_s=68.96, load_s=150.0, direction_reversals={"1": 1},
                 share_changes=[{"decided_s": 21.04, "if_id": 1, "from": 50.0, "to": 60.0}],
                 reasons_under_load={"1": {"band": 2}},
                 final={"1": {"share_pct": 60.0, "demand_pct": 60.0, "reasons_last5": ["band"], "held_last5": [None],
                              "latency_ms_last5": [4.6]}},
                 clients={"if1": {"sent": 6000, "status": {"ok": 5990}, "unanswered": 1, "rtt_ms_p50": 9.12,
                                  "rtt_ms_p99": 17.33}, "if5": None},
                 kp_if_cores=["if 1 on kp_if_1 [1]"])
        L = bo.convergence_markdown(r)
        self.assertEqual(L[0], "## Self-tuning convergence, too-small (2026-11-24 10:00:00 UTC, commit e3af789, "
                               "CPUs 0-1, load average 1.70 1.02 0.87 -> 2.31 1.95 1.40)\n")
        self.assertEqual(L[2], "- converged: True; last share change decided at 21.0 s, applied by 41.0 s after the "
                               "load started; quiet for 69 s of 150 s")
        self.assertEqual(L[5:], [
            "  - t=  21.0 s if 1: 50.0% -> 60.0%",
            "- if 1 final: share 60.0%, demand 60.0%, reasons ['band'], held [None], latency [4.6] ms",
            "- if1 client: 6000 sent, status {'ok': 5990}, 1 unanswered, RTT p50 9.1 ms p99 17.3 ms",
            "- cores: ['if 1 on kp_if_1 [1]']"])

    def test_the_summary_goes_into_the_docs_under_level_4_headings(self):
        import tempfile

        r = dict(self.FACTS, ifs={"1": {"gap_us": {"n": 1, "p50": 40.0, "p90": 40.0, "p99": 40.0, "max": 40.0,
                                                   "min": 40.0}}},
                 errors_total=0, clients={}, kp_if={"handovers_with_requests_in_flight": 0, "reports_if1_handed": 1,
                                                    "handed_in_flight_total": 0, "fragments_forwarded_total": 0,
                                                    "forward_lost_total": 0},
                 cmd_to_active_ms={"p50": 900.0, "p90": 900.0, "max": 900.0})
        with tempfile.TemporaryDirectory() as d:
            Path(d, "switchover").mkdir()
            Path(d, "switchover", "result.json").write_text(json.dumps(r))
            self.assertTrue(bo.summary(d).startswith("## Switchover gaps (2026-11-24 10:00:00 UTC, commit e3af789,"))
            body = bo.summary(d, level=4)
            self.assertTrue(body.startswith("#### Switchover gaps ("))
            doc = Path(d, "PERFORMANCE.md")
            self.assertFalse(bo.update_docs(d, doc), "no file")
            doc.write_text("# Perf\n\nprose\n")
            self.assertFalse(bo.update_docs(d, doc), "no markers")
            self.assertEqual(doc.read_text(), "# Perf\n\nprose\n")
            doc.write_text("prose\n<!-- bench-orchestrator:begin (generated by `make bench`: x) -->\nold\n"
                           "<!-- bench-orchestrator:end -->\nmore prose\n")
            self.assertTrue(bo.update_docs(d, doc))
            self.assertEqual(doc.read_text(), "prose\n<!-- bench-orchestrator:begin (generated by `make bench`: "
                                              "scripts/bench-orchestrator.sh) -->\n" + body.rstrip("\n")
                             + "\n<!-- bench-orchestrator:end -->\nmore prose\n")


if __name__ == "__main__":
    unittest.main()
