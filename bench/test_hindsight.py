"""hindsight.py: the clairvoyant server on synthetic traces and records."""

import json
import tempfile
import unittest
from pathlib import Path

import hindsight
import report

MS = 1_000_000  # ns
ORIGIN = 1_800_000_000_000_000_000  # the trace's origin on the realtime clock, ns


def span(rid, complete_ms, start_ms, end_ms, batch=1, status=0):
    """A trace record (times in ms since the origin; first fragment 1 ms
    before complete)."""
    return {"request_id": rid, "send_ts_ns": 0, "src_port": 1, "status": status, "batch": batch,
            "first_seen_ns": int((complete_ms - 1) * MS), "complete_ns": int(complete_ms * MS),
            "start_ns": int(start_ms * MS), "end_ns": int(end_ms * MS), "sent_ns": int(end_ms * MS)}


def record(rid, sent_ms, outcome="ok", answered_ms=None):
    """A kp-client record, times in ms since the origin."""
    us = lambda ms: (ORIGIN + int(ms * MS)) // 1000  # noqa: E731
    return {"id": rid, "sent_us": us(sent_ms), "outcome": outcome,
            "answered_us": us(answered_ms) if answered_ms is not None else None}


def traced(spans):
    """read_trace's view of spans, without a file."""
    d = tempfile.mkdtemp()
    p = Path(d) / "t.jsonl"
    p.write_text("".join(json.dumps(s) + "\n" for s in spans))
    return hindsight.read_trace(p, ORIGIN)


class Clairvoyant(unittest.TestCase):
    def test_a_light_load_misses_nothing(self):
        # Every 20 ms a request, complete 1 ms after it is sent, 10 ms on
        # the engine, answered 0.5 ms after its batch: SLO 30 ms.
        spans = [span(i, 20 * i + 1, 20 * i + 1, 20 * i + 11) for i in range(50)]
        recs = [record(i, 20 * i, "ok", 20 * i + 11.5) for i in range(50)]
        h = hindsight.level(recs, *traced(spans), slo_ms=30)
        self.assertEqual(h["requests"], 50)
        self.assertEqual(h["missed_frac"], 0)
        self.assertEqual(h["hindsight_missed_frac"], 0)
        self.assertEqual(h["traced_frac"], 1)
        self.assertAlmostEqual(h["engine_ms_p50"], 10.0)

    def test_a_burst_is_refused_past_what_fits(self):
        # Five requests at once, 10 ms each, SLO 25 ms, answers 0.5 ms after
        # the batch: the clairvoyant server answers two (at 11.5 and 21.5
        # ms) and refuses three; kneepoint here answered all five, the last
        # three late.
        spans = [span(i, 1, 1 + 10 * i, 11 + 10 * i) for i in range(5)]
        recs = [record(i, 0, "ok", 11.5 + 10 * i) for i in range(5)]
        h = hindsight.level(recs, *traced(spans), slo_ms=25)
        self.assertAlmostEqual(h["hindsight_missed_frac"], 3 / 5)
        self.assertAlmostEqual(h["missed_frac"], 3 / 5)
        self.assertEqual(h["refused_frac"], 0)

    def test_engine_time_follows_the_moment(self):
        # The engine takes 5 ms for the first 20 requests, then 25 ms: with
        # requests every 20 ms and SLO 30 ms, the slow spell's queue grows
        # (25 ms of work every 20 ms), so the clairvoyant server refuses
        # some of the later ones and none of the earlier.
        spans, recs = [], []
        free = 0.0
        for i in range(40):
            c = 5 if i < 20 else 25
            start = max(free, 20 * i + 1)
            free = start + c
            spans.append(span(i, 20 * i + 1, start, start + c))
            recs.append(record(i, 20 * i, "ok", start + c + 0.5))
        spans_d, batches = traced(spans)
        h = hindsight.level(recs, spans_d, batches, slo_ms=30)
        self.assertGreater(h["hindsight_missed_frac"], 0)
        cost = hindsight.engine_times(batches)
        self.assertAlmostEqual(cost(ORIGIN + 100 * MS), 5 * MS)
        self.assertAlmostEqual(cost(ORIGIN + 700 * MS), 25 * MS)
        # 5-s spans: one span only here, so lo == hi.
        self.assertEqual(h["engine_ms_spans"][0], h["engine_ms_spans"][1])

    def test_requests_refused_at_admission_still_arrive(self):
        # Request 1 was refused at its first fragment (not in the trace):
        # it arrives at its send time plus the others' transfer (1 ms) and
        # takes the engine's time then; with it, request 2 no longer fits.
        spans = [span(0, 1, 1, 11), span(2, 3, 11, 21)]
        recs = [record(0, 0, "ok", 11.5), record(1, 1, "overloaded", 1.2), record(2, 2, "ok", 21.5)]
        h = hindsight.level(recs, *traced(spans), slo_ms=20.5)
        # The clairvoyant server: 0 ends at 11 (answer 11.5, on time);
        # 1 (ready at 2) would end at 21, answer 21.5 - 1 = 20.5: on time;
        # 2 (ready 3) would end at 31: refused.
        self.assertAlmostEqual(h["hindsight_missed_frac"], 1 / 3)
        self.assertAlmostEqual(h["missed_frac"], 1 / 3)
        self.assertAlmostEqual(h["refused_frac"], 1 / 3)
        self.assertAlmostEqual(h["traced_frac"], 2 / 3)

    def test_nothing_to_judge(self):
        self.assertIsNone(hindsight.level([], {}, [(0, 1.0, 1)], 10))
        self.assertIsNone(hindsight.level([record(0, 0)], {}, [], 10))


class Files(unittest.TestCase):
    def test_run_reads_a_systems_files_per_level(self):
        d = Path(tempfile.mkdtemp())
        spans = [span(i, 20 * i + 1, 20 * i + 1, 20 * i + 11) for i in range(1, 11)]
        (d / "trace.jsonl").write_text("".join(json.dumps(s) + "\n" for s in spans))
        (d / "report.log").write_text(json.dumps({"clock_realtime_ns": ORIGIN, "telemetry": {}}) + "\n")
        for seed, ids in ((1, range(1, 6)), (2, range(6, 11))):
            lines = ["request_id,sent_unix_us,outcome,answered_unix_us"]
            for i in ids:
                r = record(i, 20 * i, "ok", 20 * i + 11.5)
                lines.append(f"{r['id']},{r['sent_us']},ok,{r['answered_us']}")
            lines.append(",123,unreachable,")  # no id: skipped
            (d / f"w{seed}.csv").write_text("\n".join(lines) + "\n")
        windows = [{"model": "m", "system": "kneepoint", "level": "3", "seed": "1"},
                   {"model": "m", "system": "kneepoint", "level": "4", "seed": "2"}]
        rows = hindsight.run(windows, lambda s: d / f"w{s}.csv", d / "trace.jsonl", d / "report.log", 30)
        self.assertEqual([(r["level"], r["requests"]) for r in rows], [(3, 5), (4, 5)])
        self.assertTrue(all(r["hindsight_missed_frac"] == 0 and r["missed_frac"] == 0 for r in rows))
        self.assertEqual(set(rows[0]), set(hindsight.FIELDS))

    def test_run_without_a_final_report_says_so(self):
        d = Path(tempfile.mkdtemp())
        (d / "trace.jsonl").write_text("")
        (d / "report.log").write_text("kp-if: killed\n")
        with self.assertRaisesRegex(ValueError, "no final report"):
            hindsight.run([{"model": "m", "system": "kneepoint", "level": "1", "seed": "1"}],
                          lambda s: d / "none.csv", d / "trace.jsonl", d / "report.log", 30)


class Markdown(unittest.TestCase):
    def level(self, offered, meets, phase="confirm", h=None):
        lv = {"offered_rps": offered, "ok_per_s": offered, "meets_slo": meets, "phase": phase}
        if h:
            lv["hindsight"] = h
        return lv

    def test_capacity_and_first_miss_are_compared(self):
        h = lambda kp, hs: {"missed_frac": kp, "refused_frac": kp / 2, "hindsight_missed_frac": hs,  # noqa: E731
                            "traced_frac": 1.0, "engine_ms_p50": 6.5, "engine_ms_span_lo": 5.3,
                            "engine_ms_span_hi": 11.7}
        cap = self.level(45.0, True, h=h(0.001, 0.0008))
        miss = self.level(45.5, False, h=h(0.0266, 0.021))
        far = self.level(60.0, False, h=h(0.05, 0.04))
        peak = self.level(200.0, False, phase="peak", h=h(0.3, 0.3))
        s = {"system": "kneepoint", "capacity": cap, "levels": [far, cap, miss, peak], "bracket": [45.0, 45.5]}
        self.assertEqual(report.hindsight_levels(s), (cap, miss))
        md = report.hindsight_markdown({"systems": [s, {"system": "triton", "capacity": None, "levels": []}]})
        self.assertIn("at its capacity (45.0 req/s offered) it failed 0.10% (refused 0.05%), "
                      "the clairvoyant server 0.08%", md)
        self.assertIn("at the lowest rate above it that missed (45.5 req/s offered) it failed 2.66%", md)
        self.assertIn("5-s spans 5.3–11.7 ms", md)
        self.assertNotIn("Triton", md)

    def test_spans_of_one_value_are_not_a_range(self):
        h = {"missed_frac": 0.001, "refused_frac": 0.0, "hindsight_missed_frac": 0.001, "traced_frac": 1.0,
             "engine_ms_p50": 6.5, "engine_ms_span_lo": 6.52, "engine_ms_span_hi": 6.49}
        cap = self.level(45.0, True, h=h)
        md = report.hindsight_markdown({"systems": [{"system": "kneepoint", "capacity": cap, "levels": [cap],
                                                     "bracket": [45.0, None]}]})
        self.assertIn("its 5-s spans all 6.5 ms", md)
        self.assertNotIn("6.5–6.5", md)

    def test_a_hindsight_over_more_windows_than_the_level_says_so(self):
        # A level that ran a fourth window is judged on its last three;
        # hindsight.py reads all four.
        h = {"requests": 2713.0, "missed_frac": 0.0147, "refused_frac": 0.0129, "hindsight_missed_frac": 0.0118,
             "traced_frac": 1.0, "engine_ms_p50": None}
        cap = dict(self.level(49.1, True, h=h), windows=4, sent=2022, error_frac=0.0084)
        md = report.hindsight_markdown({"systems": [{"system": "kneepoint-ic", "capacity": cap, "levels": [cap],
                                                     "bracket": [49.1, None]}]})
        self.assertIn("the clairvoyant server 1.18%, over all 4 of the level's windows (2,713 requests; "
                      "the level is judged on its last 3, 2,022 requests, 0.84% of them failed)", md)
        same = dict(cap, windows=3, sent=2713)
        md = report.hindsight_markdown({"systems": [{"system": "kneepoint", "capacity": same, "levels": [same],
                                                     "bracket": [49.1, None]}]})
        self.assertIn("the clairvoyant server 1.18%", md)
        self.assertNotIn("windows", md)

    def test_no_hindsight_no_paragraph(self):
        s = {"system": "kneepoint", "capacity": self.level(45.0, True), "levels": [self.level(45.0, True)]}
        self.assertEqual(report.hindsight_markdown({"systems": [s]}), "")


if __name__ == "__main__":
    unittest.main()
