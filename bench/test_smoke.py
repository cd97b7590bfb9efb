"""Unit tests of what `make test`'s smoke run of bench/bench.py asserts
(`smoke_problems`, `smoke_slo_ms`): rules that must hold on a machine of
any speed, and that still catch a lost or doubled answer.

    .venv/bin/python -m unittest bench/test_smoke.py
"""

from __future__ import annotations

import importlib.util
import json
import os
import unittest
from pathlib import Path
from unittest import mock

# By path: `import bench` would find the bench/ folder itself.
_spec = importlib.util.spec_from_file_location("bench_harness", Path(__file__).resolve().parent / "bench.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def window(system, sent=20, ok=None, unanswered=0, duplicates=0, statuses=None, phase="sweep"):
    ok = sent - unanswered if ok is None else ok
    return {"model": "squeezenet", "system": system, "phase": phase, "sent": str(sent), "ok": str(ok),
            "unanswered": str(unanswered), "duplicates": str(duplicates),
            "statuses": json.dumps(statuses or {"ok": ok})}


def problems(windows, errors=None):
    return bench.smoke_problems(windows, ["kneepoint", "stub"], ["squeezenet"], errors or {})


class SmokeRules(unittest.TestCase):
    def test_all_answered_once_and_ok_passes(self):
        self.assertEqual(problems([window("kneepoint"), window("stub"), window("kneepoint", phase="warmup",
                                                                                 ok=0)]), [])

    def test_a_request_never_answered_fails(self):
        p = problems([window("kneepoint", unanswered=1), window("stub")])
        self.assertTrue(any("never answered" in x for x in p), p)

    def test_a_request_answered_twice_fails(self):
        p = problems([window("kneepoint", duplicates=1), window("stub")])
        self.assertTrue(any("more than once" in x for x in p), p)

    def test_kneepoint_shedding_fails_and_says_which_statuses(self):
        p = problems([window("kneepoint", ok=18, statuses={"ok": 18, "overloaded": 2}), window("stub")])
        self.assertEqual(len(p), 1, p)
        self.assertIn("18 of 20", p[0])
        self.assertIn("overloaded", p[0])

    def test_a_system_or_model_not_measured_fails(self):
        p = problems([window("kneepoint")])
        self.assertEqual(p, ["squeezenet/stub: no window measured"])
        p = problems([window("kneepoint"), window("stub")], errors={"squeezenet/stub": "did not start"})
        self.assertEqual(p, ["squeezenet/stub: did not start"])

    def test_nothing_sent_fails(self):
        p = problems([window("kneepoint", sent=0), window("stub")])
        self.assertTrue(any("0 sent" in x for x in p), p)


def settings_with(name: str, value: str | None):
    """A full run's Settings with the environment variable `name` set to
    `value` (unset when None); the environment is restored after."""
    with mock.patch.dict(os.environ):
        os.environ.pop(name, None)
        if value is not None:
            os.environ[name] = value
        return bench.Settings(smoke=False)


class SmokeSlo(unittest.TestCase):
    def test_a_slow_machine_gets_a_longer_slo(self):
        # squeezenet on an AVX2-only machine: batch 1 ~10 ms, p99 ~12 ms.
        eng = [{"batch": 1, "p99_ms": 12.0}, {"batch": 2, "p99_ms": 25.0}]
        self.assertEqual(bench.smoke_slo_ms(20.0, eng), 120.0)

    def test_a_fast_machine_keeps_the_configured_slo(self):
        self.assertEqual(bench.smoke_slo_ms(200.0, [{"batch": "1", "p99_ms": "3.5"}]), 200.0)

    def test_without_a_batch_1_measurement_the_configured_slo_stands(self):
        self.assertEqual(bench.smoke_slo_ms(20.0, [{"batch": 2, "p99_ms": 9.0}]), 20.0)


class SloFromTheEngine(unittest.TestCase):
    def test_the_slo_is_a_multiple_of_the_batch_1_median_measured_here(self):
        eng = [{"batch": "1", "median_ms": "9.43", "p99_ms": "12.0"}, {"batch": "8", "median_ms": "80.0"}]
        self.assertEqual(bench.slo_from_engine(4.0, eng, 20.0), 37.7)
        self.assertEqual(bench.slo_from_engine(4.0, [{"batch": 8, "median_ms": 80.0}], 20.0), 20.0)


class PeerBatchCap(unittest.TestCase):
    """The peers' batch cap is tuned for the SLO from the engine limit of
    the same run (BENCH_PEER_MAX_BATCH=auto)."""

    # squeezenet on the 2-CPU AMD EPYC VM (29 November, target/bench/peers-b1):
    # no batch beats batch 1 per image by more than 5%.
    CPU = [{"batch": "1", "median_ms": "7.13", "images_per_s": "140.3"},
           {"batch": "2", "median_ms": "13.74", "images_per_s": "145.6"},
           {"batch": "4", "median_ms": "28.34", "images_per_s": "141.2"},
           {"batch": "8", "median_ms": "58.36", "images_per_s": "137.1"}]
    # An engine that gains from batching (a GPU's shape).
    GPU = [{"batch": 1, "median_ms": 5.0, "images_per_s": 200.0},
           {"batch": 2, "median_ms": 6.0, "images_per_s": 333.3},
           {"batch": 4, "median_ms": 8.0, "images_per_s": 500.0},
           {"batch": 8, "median_ms": 12.0, "images_per_s": 666.7}]

    def test_no_gain_from_batching_means_batch_1(self):
        self.assertEqual(bench.peer_max_batch(self.CPU, 28.5, 8), 1)
        # A 3.8% gain at batch 2 counts with a lower threshold.
        self.assertEqual(bench.peer_max_batch(self.CPU, 28.5, 8, gain=0.03), 2)

    def test_the_best_size_whose_batch_fits_in_half_the_slo(self):
        self.assertEqual(bench.peer_max_batch(self.GPU, 20.0, 8), 4)  # batch 8's 12 ms > 10
        self.assertEqual(bench.peer_max_batch(self.GPU, 24.0, 8), 8)
        self.assertEqual(bench.peer_max_batch(self.GPU, 24.0, 2), 2)  # never above the run's cap
        self.assertEqual(bench.peer_max_batch(self.GPU, 9.0, 8), 1)   # only batch 1 fits

    def test_without_a_batch_1_measurement_batch_1(self):
        self.assertEqual(bench.peer_max_batch(self.GPU[1:], 24.0, 8), 1)

    def test_the_setting_is_auto_or_a_size_within_the_cap(self):
        self.assertEqual(settings_with("BENCH_PEER_MAX_BATCH", None).peer_max_batch, "auto")
        self.assertEqual(settings_with("BENCH_PEER_MAX_BATCH", "2").peer_max_batch, "2")
        for bad in ("0", "9", "two", "-1"):
            with self.assertRaises(SystemExit):
                settings_with("BENCH_PEER_MAX_BATCH", bad)

    def test_the_report_says_each_models_cap(self):
        class S:
            max_batch, batch_delay_us, peer_max_batch = 8, 500, "auto"
        line = bench.batching_markdown({"model_info": {"squeezenet": {"peer_max_batch": 1},
                                                       "resnet50": {"peer_max_batch": 4}}}, S)
        self.assertIn("kneepoint at most 8 per batch", line)
        self.assertIn("the peers at most 1 (squeezenet), 4 (resnet50), tuned for the SLO", line)
        # A run from before the peers had their own cap: one for all.
        old = bench.batching_markdown({"model_info": {"squeezenet": {"slo_ms": 28.0}}}, S)
        self.assertIn("at most 8 per batch everywhere", old)


class PeerShedding(unittest.TestCase):
    """The peers may refuse what cannot meet the SLO, as kneepoint does."""

    def test_triton_queues_a_request_for_the_slo_less_one_batch_1_run(self):
        eng = [{"batch": 1, "median_ms": 9.4, "p99_ms": 12.0}, {"batch": 2, "median_ms": 18.0}]
        self.assertEqual(bench.queue_timeout_us(20.0, eng), 10_600)
        self.assertEqual(bench.queue_timeout_us(5.0, eng), 1000)  # never below 1 ms
        self.assertEqual(bench.queue_timeout_us(20.0, []), 20_000)

    def test_the_triton_config_rejects_late_requests_only_with_the_reject_policy(self):
        import tempfile

        m = {"name": "squeezenet", "shape": [3, 224, 224], "top_k": 5, "config": "/m/config.toml",
             "queue_timeout_us": 10_600, "peer_max_batch": 2}

        class S:
            max_batch, batch_delay_us, threads, peer_shed = 8, 500, 1, True
            triton_queue_policy = "reject"

        plain = "dynamic_batching {\n  max_queue_delay_microseconds: 500\n}"
        with tempfile.TemporaryDirectory() as d:
            bench.write_triton_model(Path(d), m, S)
            text = (Path(d) / "config.pbtxt").read_text()
            # The peers' own cap, not kneepoint's (S.max_batch).
            self.assertIn("\nmax_batch_size: 2\n", text)
            self.assertIn("dynamic_batching {\n  max_queue_delay_microseconds: 500\n  default_queue_policy { "
                          "timeout_action: REJECT default_timeout_microseconds: 10600 "
                          "allow_timeout_override: false }\n}", text)
            # Not without shedding, and not with the default policy, "none".
            for shed, policy in ((False, "reject"), (True, "none")):
                S.peer_shed, S.triton_queue_policy = shed, policy
                bench.write_triton_model(Path(d), m, S)
                text = (Path(d) / "config.pbtxt").read_text()
                self.assertIn(plain, text)
                self.assertNotIn("queue_policy", text)

    def test_triton_queues_every_request_unless_told_to_reject(self):
        self.assertEqual(settings_with("BENCH_TRITON_QUEUE_POLICY", None).triton_queue_policy, "none")
        self.assertTrue(bench.triton_rejects(settings_with("BENCH_TRITON_QUEUE_POLICY", "reject")))
        with self.assertRaises(SystemExit):
            settings_with("BENCH_TRITON_QUEUE_POLICY", "drop")


class InferenceSpin(unittest.TestCase):
    """BENCH_KP_INFERENCE_SPIN_MS: kneepoint's inference thread spins
    after each batch; the method says so, and kp-if gets the flag only
    when it is set."""

    def test_unset_means_no_flag_and_no_word(self):
        s = settings_with("BENCH_KP_INFERENCE_SPIN_MS", None)
        self.assertEqual(bench.kp_spin_args(s), [])
        self.assertNotIn("spins", bench.header_markdown(StartBrackets.meta(), s))

    def test_set_passes_the_flag_and_the_method_names_the_busy_core(self):
        s = settings_with("BENCH_KP_INFERENCE_SPIN_MS", "1000")
        self.assertEqual(bench.kp_spin_args(s), ["--inference-spin-ms", "1000"])
        text = bench.header_markdown(StartBrackets.meta(), s)
        self.assertIn("spins 1000 ms after each batch", text)
        self.assertIn(f"keeps CPU {s.worker_cpu} busy while idle", text)

    def test_a_run_recorded_before_the_option_reads_as_dozing(self):
        d = bench.Settings(smoke=False).as_dict()
        d.pop("kp_inference_spin_ms")
        self.assertEqual(bench.kp_spin_args(bench.Settings.recorded(d)), [])

    def test_refuses_a_negative_window(self):
        with self.assertRaises(SystemExit):
            settings_with("BENCH_KP_INFERENCE_SPIN_MS", "-1")


class Combine(unittest.TestCase):
    """`bench.py --combine`: runs of a repeat made a model at a time
    (rep-K/<model>/) are combined with runs of both (rep-K/)."""

    @staticmethod
    def run_dir(d: Path, git: str, caps: dict[str, dict[str, float]]):
        d.mkdir(parents=True)
        models = [{"model": m, "slo_ms": 20.0, "engine": [{"images_per_s": 200.0}],
                   "systems": [{"system": k, "capacity": {"ok_per_s": v}, "peak": {"ok_per_s": v}}
                               for k, v in c.items()]} for m, c in caps.items()]
        (d / "summary.json").write_text(json.dumps({"meta": {"git": git, "started": git, "settings": {"max_batch": 8}},
                                                    "models": models}))

    def test_per_model_runs_count_per_model_and_each_model_shows_its_last_run(self):
        import tempfile
        saved = os.environ.get("BENCH_UPDATE_DOCS")
        os.environ["BENCH_UPDATE_DOCS"] = "0"
        try:
            with tempfile.TemporaryDirectory() as t:
                top = Path(t)
                self.run_dir(top / "rep-1", "r1", {"squeezenet": {"kneepoint": 60, "triton": 40},
                                                   "resnet50": {"kneepoint": 8, "triton": 7}})
                self.run_dir(top / "rep-2" / "squeezenet", "r2s", {"squeezenet": {"kneepoint": 62, "triton": 41}})
                self.run_dir(top / "rep-2" / "resnet50", "r2r", {"resnet50": {"kneepoint": 9, "triton": 7}})
                self.run_dir(top / "rep-10" / "squeezenet", "r10s", {"squeezenet": {"kneepoint": 58, "triton": 42}})
                # Which run each model's detail comes from (the rendering
                # itself, from a real summary.json, is the smoke run's
                # smoke_combine): a stand-in that names the run.
                real, bench.render_report = bench.render_report, \
                    lambda meta, models, s, docs: f"report of {meta['git']} ({s.max_batch} per batch)\n"
                try:
                    self.assertEqual(bench.combine(top, bench.Settings(False), top / "docs"), 0)
                finally:
                    bench.render_report = real
                md = (top / "report.md").read_text()
        finally:
            if saved is None:
                del os.environ["BENCH_UPDATE_DOCS"]
            else:
                os.environ["BENCH_UPDATE_DOCS"] = saved
        self.assertIn("### Over 2 or 3 runs per model", md)
        self.assertIn("| kneepoint | 60.0 [58.0–62.0] |", md)
        self.assertIn("3 runs: r1 at r1; r2s at r2s; r10s at r10s; on an unrecorded CPU (? CPUs).", md)
        # Each model's runs are judged one record or not on their own.
        # (These commits are no git commits: their code cannot be compared.)
        self.assertIn("The runs of squeezenet are of 3 commits (r1, r10s, r2s) whose measured code cannot be "
                      "compared here: not one record", md)
        self.assertIn("The runs of resnet50 are of 2 commits (r1, r2r) whose measured code cannot be compared "
                      "here: not one record", md)
        # Each model's last run in detail, rep-10 after rep-2 (not as text).
        self.assertIn("### The last run of squeezenet (rep-10/squeezenet) in detail\n\nreport of r10s (8 per batch)", md)
        self.assertIn("### The last run of resnet50 (rep-2/resnet50) in detail\n\nreport of r2r", md)


class StartBrackets(unittest.TestCase):
    """BENCH_START: where a system's full levels start instead of scouts."""

    def test_parses_model_system_brackets(self):
        self.assertEqual(bench.start_brackets(" resnet50.kneepoint=5.9:6.7, resnet50.ray=3.7:4.4 "),
                         {"resnet50.kneepoint": [5.9, 6.7], "resnet50.ray": [3.7, 4.4]})
        self.assertEqual(bench.start_brackets(""), {})

    def test_refuses_what_is_not_a_bracket(self):
        for bad in ("resnet50.kneepoint=6.7:5.9", "resnet50.kneepoint=0:1", "resnet50.nginx=1:2",
                    "kneepoint=1:2", "resnet50.kneepoint=1", "resnet50.kneepoint=a:b", ".triton=1:2"):
            with self.subTest(bad=bad), self.assertRaises(SystemExit):
                bench.start_brackets(bad)

    def test_the_method_says_where_levels_started(self):
        self.assertEqual(bench.start_text({}), "")
        text = bench.start_text({"resnet50.triton": [5.2, 5.9], "resnet50.kneepoint": [5.9, 6.7]})
        self.assertIn("resnet50 kneepoint 5.9 / 6.7; resnet50 Triton 5.2 / 5.9", text)
        self.assertIn("instead of from scouts", text)

    def test_scouts_are_named_only_where_a_system_used_them(self):
        s = bench.Settings(smoke=False)
        s.scout_requests = 300
        meta = {"models": ["resnet50"], "systems": ["kneepoint", "triton"]}
        s.start = {"resnet50.kneepoint": [5.9, 6.7], "resnet50.triton": [5.2, 5.9]}
        self.assertFalse(bench.scouted(meta, s))
        self.assertNotIn("Scouts of one window", bench.header_markdown(self.meta(meta), s))
        s.start = {"resnet50.kneepoint": [5.9, 6.7]}
        self.assertTrue(bench.scouted(meta, s))
        self.assertIn("Scouts of one window", bench.header_markdown(self.meta(meta), s))
        s.scout_requests = 0
        self.assertFalse(bench.scouted(meta, s))

    def test_the_method_counts_the_windows_a_level_averages(self):
        s = bench.Settings(smoke=True)
        s.min_windows = s.max_windows = 2
        self.assertIn("mean of the last two,", bench.header_markdown(self.meta(), s))
        s.min_windows, s.max_windows = 3, 4
        self.assertIn("mean of the last three,", bench.header_markdown(self.meta(), s))

    @staticmethod
    def meta(extra: dict | None = None) -> dict:
        """The least a run's meta.json holds for header_markdown."""
        m = {"machine": {"cpu": "cpu", "nproc": 2, "mem_gib": 24, "kernel": "6.1", "debian": "12"},
             "versions": {"onnxruntime": "1.20"}, "systems": ["kneepoint"], "models": ["squeezenet"],
             "peers": {}, "started": "2026-11-30T13:00:00Z", "git": "abc1234", "loadavg_start": [0, 0, 0],
             "batching": {}}
        m.update(extra or {})
        return m


if __name__ == "__main__":
    unittest.main()
