"""Unit tests of bench/bench_if.py, the Python of scripts/bench-if.sh: the
/proc parsers, the pcap reader, batch and busy-engine detection, CPU
shares, per-phase statistics and the summary's tables (run by `make test`).

    .venv/bin/python -m unittest bench/test_bench_if.py
"""

from __future__ import annotations

import struct
import sys
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_if  # noqa: E402
import host  # noqa: E402

MAGIC = 0x4B4E5054  # "KNPT"


def answer(req, send_ts, status, batch, lat):
    return struct.pack(">IBBHQQIHHI", MAGIC, 1, 2, 0, req, send_ts, status, 0, batch, lat) + bytes(12)


def fragment(req, idx, cnt):
    return struct.pack(">IBBHQIHH", MAGIC, 1, 1, 0, req, 150528, idx, cnt) + bytes(40)


def frame(payload, ethertype=b"\x08\x00", ihl=5):
    return (bytes(12) + ethertype + bytes([0x40 | ihl]) + bytes(ihl * 4 - 1) + bytes(8) + payload)[:96]


def pcap(frames, nano=True, endian="<"):
    """A pcap of (time ns, frame) as tcpdump -w writes it."""
    magic = 0xA1B23C4D if nano else 0xA1B2C3D4
    data = struct.pack(endian + "IHHiIII", magic, 2, 4, 0, 0, 96, 1)
    for t, f in frames:
        sec, ns = divmod(t, 10**9)
        data += struct.pack(endian + "IIII", sec, ns if nano else ns // 1000, len(f), len(f)) + f
    return data


class ProcParsers(unittest.TestCase):
    def test_cpu_counters_sum_the_busy_kinds_of_each_cpu(self):
        stat = ("cpu  200 10 60 9000 30 5 15 2 0 0\n"
                "cpu0 120 4 40 4000 10 5 10 1 0 0\n"
                "intr 1234 0 9\nctxt 99\n")
        self.assertEqual(bench_if.cpu_counters(stat), {
            "cpu": {"busy": 290, "idle": 9030, "steal": 2, "user": 210, "system": 60, "softirq": 20},
            "cpu0": {"busy": 179, "idle": 4010, "steal": 1, "user": 124, "system": 40, "softirq": 15}})

    def test_task_record_takes_the_name_between_the_outer_parentheses(self):
        t = bench_if.task_record("4205 (ort) worker) S 1 4202 4202 0\n", "Name:\tort) worker\nCpus_allowed_list:\t1\n",
                                 "123456789 4567 89\n", 4205, 4202)
        self.assertEqual(t, {"comm": "ort) worker", "ns": 123456789, "cpus": "1", "main": False})
        main = bench_if.task_record("4202 (kp-if) S 1\n", "Cpus_allowed_list:\t0-1\n", "5 0 0\n", 4202, 4202)
        self.assertTrue(main["main"])

    def test_process_memory_keeps_the_memory_lines_and_threads(self):
        status = ("Name:\tkp-if\nVmPeak:\t 9000000 kB\nVmSize:\t 8900000 kB\nVmHWM:\t  185000 kB\n"
                  "VmRSS:\t  180000 kB\nRssAnon:\t 120000 kB\nHugetlbPages:\t  40960 kB\nThreads:\t5\n")
        self.assertEqual(bench_if.process_memory(status), {
            "VmSize_kB": 8900000, "VmHWM_kB": 185000, "VmRSS_kB": 180000, "RssAnon_kB": 120000,
            "HugetlbPages_kB": 40960, "Threads": 5})

    def test_hugetlb_maps_sum_per_file_and_keep_only_hugepage_mappings(self):
        smaps = ("55d0c0000000-55d0c1000000 r-xp 00000000 08:01 12 /opt/kp/kp-if\n"
                 "Size:  16384 kB\nShared_Hugetlb:  0 kB\nPrivate_Hugetlb:  0 kB\n"
                 "7f1000000000-7f1000400000 rw-s 00000000 00:2f 1001 /dev/hugepages/kp-77map_0\n"
                 "Shared_Hugetlb:  4096 kB\nPrivate_Hugetlb:  0 kB\n"
                 "7f1000400000-7f1000600000 rw-s 00200000 00:2f 1001 /dev/hugepages/kp-77map_0\n"
                 "Shared_Hugetlb:  2048 kB\nPrivate_Hugetlb:  0 kB\n"
                 "7f1000a00000-7f1000c00000 rw-s 00000000 00:2f 1004 /dev/hugepages/kp_pool_12\n"
                 "Shared_Hugetlb:  0 kB\nPrivate_Hugetlb:  0 kB\n"
                 "7f2000000000-7f2000800000 rw-p 00000000 00:00 0\n"
                 "Shared_Hugetlb:  0 kB\nPrivate_Hugetlb:  8192 kB\nVmFlags: rd wr mr mw me ac ht\n")
        self.assertEqual(bench_if.hugetlb_maps(smaps), {
            "/dev/hugepages/kp-77map_0": {"shared_kB": 6144, "private_kB": 0},
            "/dev/hugepages/kp_pool_12": {"shared_kB": 0, "private_kB": 0},
            "[anon]": {"shared_kB": 0, "private_kB": 8192}})

    def test_hugepage_counts(self):
        meminfo = "MemTotal: 8131212 kB\nHugePages_Total:    1024\nHugePages_Free:      900\nHugepagesize: 2048 kB\n"
        self.assertEqual(bench_if.hugepage_counts(meminfo), {"HugePages_Total": 1024, "HugePages_Free": 900})

    def test_host_facts(self):
        self.assertEqual(host.cpu_model("processor\t: 0\nmodel name\t: Xeon @ 2.20GHz\nmodel name\t: other\n"),
                         "Xeon @ 2.20GHz")
        self.assertEqual(host.cpu_model("processor\t: 0\n"), "")
        self.assertEqual(host.load_average("1.50 1.02 0.87 3/412 9000\n"), ["1.50", "1.02", "0.87"])
        self.assertEqual(host.run_line("2026-11-29 12:00 UTC", "ea508f7", "AMD EPYC", 2),
                         "2026-11-29 12:00 UTC, commit ea508f7, AMD EPYC, 2 CPUs")
        self.assertEqual(host.run_line("t", "", "", 1), "t, commit not recorded, CPU unknown, 1 CPUs")

    def test_the_benchmarks_own_output_does_not_make_a_commit_dirty(self):
        import subprocess
        import tempfile

        with tempfile.TemporaryDirectory() as d:
            git = lambda *a: subprocess.run(["git", "-C", d, *a], check=True, capture_output=True)  # noqa: E731
            git("init", "-q")
            Path(d, "docs", "bench").mkdir(parents=True)
            for f in ("docs/PERFORMANCE.md", "docs/bench/plot.svg", "src.rs"):
                Path(d, f).write_text("v1\n")
            git("add", ".")
            git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "c")
            head = host.git_head(d)
            self.assertRegex(head, r"^[0-9a-f]{7,}$")
            Path(d, "docs", "PERFORMANCE.md").write_text("generated\n")
            Path(d, "docs", "bench", "plot.svg").write_text("generated\n")
            self.assertEqual(host.git_head(d), head)
            # Notes written during a run do not change what it measured.
            Path(d, "docs", "PERFORMANCE-JOURNAL.md").write_text("a note\n")
            git("add", "docs/PERFORMANCE-JOURNAL.md")
            self.assertEqual(host.git_head(d), head)
            Path(d, "src.rs").write_text("v2\n")
            self.assertEqual(host.git_head(d), head + "+dirty")


class Captures(unittest.TestCase):
    T = 1_763_900_000 * 10**9

    def test_udp_payloads_keep_kneepoint_ipv4_frames_with_their_time(self):
        frames = [(self.T + 5, frame(answer(1, 0, 0, 1, 4000))),
                  (self.T + 6, frame(answer(2, 0, 0, 1, 4000), ethertype=b"\x86\xdd")),  # IPv6
                  (self.T + 7, frame(b"XXXX" + bytes(40))),                               # not kneepoint
                  (self.T + 8, frame(answer(3, 0, 0, 1, 4000), ihl=6)),                   # IP options
                  (self.T + 9, frame(bytes(10)))]                                          # too short
        got = list(bench_if.udp_payloads(pcap(frames)))
        self.assertEqual([t for t, _ in got], [self.T + 5, self.T + 8])
        self.assertEqual([struct.unpack(">Q", p[8:16])[0] for _, p in got], [1, 3])

    def test_microsecond_and_big_endian_captures(self):
        f = [(self.T + 1_234_567, frame(fragment(9, 0, 147)))]
        self.assertEqual([t for t, _ in bench_if.udp_payloads(pcap(f, nano=False))], [self.T + 1_234_000])
        self.assertEqual([t for t, _ in bench_if.udp_payloads(pcap(f, endian=">"))], [self.T + 1_234_567])

    def test_fragment_spans_need_both_ends_in_order(self):
        frags = [(1_000_000, fragment(1, 0, 147)), (1_250_500, fragment(1, 146, 147)),
                 (2_000_000, fragment(2, 0, 147)),                                       # last not captured
                 (3_000_000, fragment(3, 146, 147)), (3_500_000, fragment(3, 0, 147)),   # out of order
                 (4_000_000, fragment(4, 0, 1))]                                         # one fragment
        self.assertEqual(bench_if.fragment_spans(iter(frags)), {1: 250.5, 4: 0.0})

    def test_answers_sorted_by_time_and_the_engine_found_busy_after_a_batch(self):
        ms = 1_000_000
        answers = [  # (capture ns, payload), as captured: not quite in order
            (10 * ms + 20_000, answer(2, 10 * ms - 5_150_000, 0, 2, 5000)),
            (10 * ms, answer(1, 10 * ms - 5_100_000, 0, 2, 5000)),
            (11 * ms, answer(9, 0, 3, 0, 10)),                            # overloaded: no batch
            (13 * ms, answer(3, 13 * ms - 4_080_000, 0, 1, 4000)),        # arrived at 9 ms: busy 1 ms
            (30 * ms, answer(4, 30 * ms - 4_060_000, 0, 1, 4000)),        # arrived at 26 ms: idle
            (30 * ms + 10, answer(5, 0, 0, 1, 0)[:30]),                   # short: skipped
        ]
        rows = bench_if.answer_rows(iter(answers), {1: 120.5})
        self.assertEqual([r["request_id"] for r in rows], [1, 2, 9, 3, 4])
        self.assertEqual(rows[0], {"request_id": 1, "status": 0, "batch_size": 2, "latency_us": 5000,
                                   "rtt_wire_us": 5100.0, "t_ns": 10 * ms, "frag_span_us": 120.5,
                                   "after_last_wire_us": None, "engine_own_us": None, "engine_cpu_us": None,
                                   "if_wait_us": None,
                                   "if_answer_us": None, "in_path_us": None, "out_path_us": None,
                                   "complete_ns": None, "batch_start_ns": None, "batch_end_ns": None})
        ok = bench_if.mark_engine_busy(rows)
        self.assertEqual([r["request_id"] for r in ok], [1, 2, 3, 4])
        self.assertEqual([r["engine_busy_at_arrival_us"] for r in ok], [None, None, 1000.0, 0])
        self.assertNotIn("engine_busy_at_arrival_us", rows[2])

    def test_fragment_spans_skip_answers_in_the_same_capture(self):
        # An answer's bytes 20..24 are not a fragment index and count.
        got = bench_if.fragment_spans(iter([(1_000, fragment(1, 0, 2)), (2_000, answer(1, 0, 0, 1, 0)),
                                            (3_000, fragment(1, 1, 2))]))
        self.assertEqual(got, {1: 2.0})

    def test_last_fragments_skip_answers_and_other_fragments(self):
        platform = [(1_000_000, fragment(1, 0, 3)), (1_400_000, fragment(1, 2, 3)),
                    (2_000_000, answer(1, 0, 0, 1, 4000)),
                    (6_000_000, fragment(2, 0, 2)),                          # last not captured
                    (9_000_000, fragment(3, 0, 1))]
        self.assertEqual(bench_if.last_fragments(iter(platform)), {1: 1_400_000, 3: 9_000_000})

    def test_trace_records_join_answers_by_request_and_send_time(self):
        ms = 1_000_000
        trace = bench_if.trace_records(iter([
            {"request_id": 1, "send_ts_ns": 77, "complete_ns": 5 * ms, "start_ns": 5 * ms + 40_000,
             "end_ns": 9 * ms + 40_000, "sent_ns": 9 * ms + 52_000},
            {"request_id": 1, "send_ts_ns": 78, "complete_ns": 0, "start_ns": 0, "end_ns": 1, "sent_ns": 1}]))
        rows = bench_if.answer_rows(iter([(10 * ms, answer(1, 77, 0, 1, 4000)), (11 * ms, answer(2, 77, 0, 1, 4000)),
                                          (12 * ms, answer(3, 0, 0, 1, 4000))]),
                                    {}, {1: 10 * ms - 4_200_000, 3: 13 * ms}, trace,   # 3: answered before it ended
                                    origin_ns=900_000)
        self.assertEqual((rows[0]["engine_own_us"], rows[0]["if_wait_us"], rows[0]["if_answer_us"]),
                         (4000.0, 40.0, 12.0))
        self.assertEqual(rows[0]["after_last_wire_us"], 4200.0)
        # Last fragment at 5.8 ms, complete at 0.9 + 5 ms; sent at 0.9 + 9.052 ms, captured at 10 ms.
        self.assertEqual((rows[0]["in_path_us"], rows[0]["out_path_us"]), (100.0, 48.0))
        self.assertEqual([rows[1][k] for k in ("engine_own_us", "after_last_wire_us")], [None, None])
        self.assertIsNone(rows[2]["after_last_wire_us"])

    def test_a_full_batch_ends_it_even_within_the_window(self):
        ms = 1_000_000
        answers = [(10 * ms, answer(1, 0, 0, 1, 4000)), (10 * ms + 30_000, answer(2, 0, 0, 1, 4000))]
        ok = bench_if.mark_engine_busy(bench_if.answer_rows(iter(answers), {}))
        # Request 2 arrived at 6.03 ms, before batch 1's answer left at 10 ms.
        self.assertEqual([r["engine_busy_at_arrival_us"] for r in ok], [None, 3970.0])

    def test_answers_more_than_2_ms_apart_are_different_batches(self):
        ms = 1_000_000
        answers = [(10 * ms, answer(1, 0, 0, 2, 4000)), (15 * ms, answer(2, 0, 0, 2, 4000))]
        ok = bench_if.mark_engine_busy(bench_if.answer_rows(iter(answers), {}))
        # Request 2 arrived at 11 ms, after batch 1's answers left: idle.
        self.assertEqual([r["engine_busy_at_arrival_us"] for r in ok], [None, 0])


def eng_line(batch, median, p99, ips):
    return {"batch": batch, "iterations": 100, "latency_ms": {"median": median, "p90": median, "p99": p99},
            "images_per_s_median": ips, "images_per_s_total": ips - 1}


class Engine(unittest.TestCase):
    def test_reference_is_the_mean_of_both_runs_medians(self):
        eng = bench_if.engine_runs([eng_line(1, 4.0, 4.5, 250.0), eng_line(2, 7.0, 8.0, 285.7)],
                                   [eng_line(2, 7.5, 8.2, 266.7), eng_line(1, 4.2, 4.6, 238.1)])
        self.assertEqual(bench_if.reference_ms(eng), {1: 4.1, 2: 7.25})
        self.assertEqual(bench_if.engine_rows(eng), [
            ["run", "batch", "iterations", "median_ms", "p90_ms", "p99_ms", "images_per_s_median", "images_per_s_total"],
            ["after", 1, 100, 4.2, 4.2, 4.6, 238.1, 237.1], ["before", 1, 100, 4.0, 4.0, 4.5, 250.0, 249.0],
            ["after", 2, 100, 7.5, 7.5, 8.2, 266.7, 265.7], ["before", 2, 100, 7.0, 7.0, 8.0, 285.7, 284.7]])
        self.assertEqual(bench_if.engine_table({"model": "m", "cpu": "X", "nproc": 2, "git": "abc", "loadavg_at_start":
                                                ["1", "2", "3"], "cpus": {"if_manager": 0, "kp_if": 1, "client": 0},
                                                "threads": 1, "max_batch": 8, "slo_ms": 2000}, eng)[-2:],
                         ["| 1 | 4.00 / 4.20 | 4.50 / 4.60 | 250.0 / 238.1 |",
                          "| 2 | 7.00 / 7.50 | 8.00 / 8.20 | 285.7 / 266.7 |"])
        # The heading names the layout: the fragment thread with the engine
        # or, as designed, on the network side's CPU.
        meta = {"model": "m", "cpu": "X", "nproc": 2, "git": "abc", "loadavg_at_start": ["1", "2", "3"],
                "cpus": {"if_manager": 0, "kp_if": 1, "client": 0}, "threads": 1, "max_batch": 8, "slo_ms": 2000}
        self.assertEqual(bench_if.engine_table(meta, eng)[0],
                         "### m: engine alone vs end to end (all on the inference core)\n")
        meta["cpus"]["kp_if_fragment_thread"] = 0
        self.assertEqual(bench_if.engine_table(meta, eng)[0], "### m: engine alone vs end to end (as designed)\n")
        # The line under it says when, where and at which commit.
        self.assertTrue(bench_if.engine_table(meta, eng)[1].startswith("X, 2 CPUs, git abc;"))
        meta["started"] = "2026-11-30 13:00 UTC"
        self.assertTrue(bench_if.engine_table(meta, eng)[1].startswith("2026-11-30 13:00 UTC, X, 2 CPUs, git abc;"))


def snapshot(t, busy0, busy1, kp_if=None, ifm=None):
    cpu = lambda busy: {"busy": busy, "user": busy // 2, "system": busy // 4, "softirq": busy // 10, "steal": 0}
    return {"t": t, "loadavg": ["1.0", "0.5", "0.2"], "cpus": {"cpu0": cpu(busy0), "cpu1": cpu(busy1)},
            "kp_if": kp_if, "if_manager": ifm}


class CpuUse(unittest.TestCase):
    def test_shares_of_a_cpu_and_what_is_left_to_others(self):
        a = snapshot(100.0, 1000, 2000, kp_if={"10": {"comm": "kp-if", "ns": 0, "main": True},
                                               "11": {"comm": "eal-intr-thread", "ns": 0, "main": False}})
        b = snapshot(110.0, 1500, 2800,
                     kp_if={"10": {"comm": "kp-if", "ns": 2 * 10**9, "main": True},
                            "11": {"comm": "eal-intr-thread", "ns": 5 * 10**6, "main": False},   # < 0.1%: left out
                            "12": {"comm": "kp-infer", "ns": 7 * 10**9, "main": False}},          # new thread
                     ifm={"20": {"comm": "if-manager", "ns": 10**9, "main": True}})              # ifm not at start
        res = bench_if.cpu_use(a, b, 100, {"user_s": 0.5, "sys_s": 0.25}, 0.25)
        self.assertEqual(res, {
            "seconds": 10.0, "loadavg_end": ["1.0", "0.5", "0.2"],
            "cpu0": {"busy": 50.0, "user": 25.0, "system": 12.5, "softirq": 5.0, "steal": 0.0},
            "cpu1": {"busy": 80.0, "user": 40.0, "system": 20.0, "softirq": 8.0, "steal": 0.0},
            "kp_if_threads_pct": {"kp-if main": 20.0, "kp-infer 12": 70.0},
            "kp_if_main_s": 2.0, "if_manager_main_s": 1.0,
            "if_manager_threads_pct": {"if-manager main": 10.0},
            "kp_client_pct": 7.5, "tcpdump_pct": 2.5,
            # busy 13 s - (10.005 + 0.75 + 0.25) s ours
            "others_pct": 20.0})


def row(req, batch, lat, t, busy, span=None):
    return {"request_id": req, "status": 0, "batch_size": batch, "latency_us": lat, "rtt_wire_us": lat + 60.0,
            "t_ns": t, "frag_span_us": span, "engine_busy_at_arrival_us": busy}


CLIENT = {"status": {"ok": 40, "overloaded": 2, "internal": 0}, "answer_span_s": 10.0, "unanswered": 1, "sent": 43,
          "rate": None, "rtt_us": {"p50": 9120, "p99": 17330}, "platform_latency_us": {"p50": 6040, "p99": 11480}}


class FragmentThreadCost(unittest.TestCase):
    def test_main_thread_cpu_over_the_answered_requests_fragments(self):
        # 42 answered (40 OK, 2 overloaded; the unanswered one is not counted),
        # 150 fragments each, 1.29 s of the main thread.
        phase = {"client": CLIENT, "cpu": {"kp_if_main_s": 1.29}}
        self.assertAlmostEqual(bench_if.fragment_thread_cost(phase, 150.0), 1.29e6 / (42 * 150.0))

    def test_unknown_without_fragments_or_answers(self):
        self.assertIsNone(bench_if.fragment_thread_cost({"client": CLIENT, "cpu": {"kp_if_main_s": 1.0}}, None))
        none = dict(CLIENT, status={"ok": 0})
        self.assertIsNone(bench_if.fragment_thread_cost({"client": none, "cpu": {"kp_if_main_s": 1.0}}, 150.0))


class Phases(unittest.TestCase):
    def test_overhead_is_latency_minus_the_engine_at_that_batch_size(self):
        ok = [row(1, 1, 5000, 1, None, 100.0), row(2, 2, 9000, 2, 0.0, 300.0), row(3, 2, 9500, 3, 0.0),
              row(4, 2, 8500, 4, 250.0, 200.0), row(5, 16, 20000, 5, 0.0)]   # 16: not measured, left out
        res = bench_if.phase_stats(CLIENT, ok, {1: 4.0, 2: 7.5}, {"cpu": "x"})
        self.assertEqual(res["ok_per_s"], 4.0)
        self.assertEqual(res["statuses"], {"ok": 40, "overloaded": 2})
        self.assertEqual(res["answers_captured"], 4)
        self.assertEqual(res["batch_mix_requests"], {1: 1, 2: 3})
        self.assertEqual(res["mean_batch"], 1.75)
        self.assertEqual(res["overhead_us"], {"p50": 1000.0, "p90": 2000.0, "p99": 2000.0, "n": 4})
        self.assertEqual(res["overhead_engine_idle_us"], {"p50": 1500.0, "p90": 2000.0, "p99": 2000.0, "n": 2})
        self.assertEqual(res["found_engine_busy_fraction"], 0.25)
        self.assertEqual(res["frag_span_us"], {"p50": 200.0, "p90": 300.0, "p99": 300.0, "n": 3})
        self.assertEqual(res["overhead_after_last_fragment_us"], {"p50": 900.0, "p90": 1200.0, "p99": 1200.0, "n": 3})
        self.assertEqual(res["overhead_after_last_fragment_engine_idle_us"], {"p50": 1200.0, "p90": 1200.0,
                                                                               "p99": 1200.0, "n": 1})
        self.assertEqual(res["outside_if_us"]["p50"], 60.0)

    def test_with_a_trace_the_overhead_subtracts_each_requests_own_engine_time(self):
        def traced(req, busy, wire, own, wait, ans):
            return dict(row(req, 1, 5000, req, busy), after_last_wire_us=wire, engine_own_us=own, if_wait_us=wait,
                        if_answer_us=ans)
        ok = [traced(1, 0.0, 4100.0, 4000.0, 30.0, 10.0), traced(2, 0.0, 6300.0, 6000.0, 50.0, 10.0),
              traced(3, 900.0, 5000.0, 4000.0, 700.0, 20.0), row(4, 1, 5000, 4, 0.0)]   # 4: not traced
        res = bench_if.phase_stats(CLIENT, ok, {1: 4.0}, {})
        self.assertEqual(res["engine_own_us"]["n"], 3)
        self.assertEqual(res["overhead_after_last_own_us"], {"p50": 300.0, "p90": 1000.0, "p99": 1000.0, "n": 3})
        self.assertEqual(res["overhead_after_last_own_engine_idle_us"]["p50"], 100.0)
        self.assertEqual(res["if_wait_us"]["p50"], 50.0)
        self.assertEqual(res["outside_if_after_last_us"], {"p50": 240.0, "p90": 280.0, "p99": 280.0, "n": 3})
        fn = next(fn for name, fn in bench_if.LATENCY_ROWS if name.startswith("**last fragment in"))
        self.assertEqual(fn(res), "**300 / 1000**")

    def test_the_slow_requests_are_counted_under_the_leg_that_took_longest(self):
        def traced(req, busy, wire, own, legs):
            i, w, a, o = legs
            return dict(row(req, 1, 5000, req, busy), after_last_wire_us=wire, engine_own_us=own, in_path_us=i,
                        if_wait_us=w, if_answer_us=a, out_path_us=o)
        ok = [traced(1, 0.0, 4100.0, 4000.0, (20, 20, 10, 50)),      # 100 µs: not slow
              traced(2, 0.0, 5000.0, 4000.0, (900, 30, 10, 60)),     # way in
              traced(3, 0.0, 5200.0, 4000.0, (20, 20, 10, 1150)),    # way out
              traced(4, 0.0, 4700.0, 4000.0, (100, 550, 10, 40)),    # to its batch
              traced(5, 0.0, 4500.0, 4000.0, (200, 200, 50, 50)),    # exactly 500: not over
              traced(6, 800.0, 6000.0, 4000.0, (1900, 20, 10, 70))]  # found the engine busy: not counted
        res = bench_if.phase_stats(CLIENT, ok, {1: 4.0}, {})
        self.assertEqual(res["tail_stages"], {"over_us": 500.0, "n": 5, "slow": 3, "by_stage": {
            "way in": 1, "to its batch": 1, "to the TX ring": 0, "way out": 1}})
        name, fn = next((n, f) for n, f in bench_if.LATENCY_ROWS if n.startswith("engine idle at arrival, over"))
        self.assertIn("over 500 µs", name)
        self.assertEqual(fn(res), "3 of 5: 1 / 1 / 0 / 1")
        self.assertEqual(fn({}), "-")

    def test_the_engines_time_per_image_by_batch_size_and_the_mix_against_batch_one(self):
        def traced(req, n, own):
            return dict(row(req, n, 9000, req, 0.0), after_last_wire_us=own + 100.0, engine_own_us=own,
                        if_wait_us=20.0, if_answer_us=10.0)
        # Batches of 1 at 7, 7.2 and 6.8 ms; of 2 at 13.6 ms (6.8 per image),
        # each of its 2 requests traced; one of 4 at 30 ms (7.5 per image).
        ok = ([traced(1, 1, 7000.0), traced(2, 1, 7200.0), traced(3, 1, 6800.0)]
              + [traced(r, 2, 13600.0) for r in (4, 5)] + [traced(r, 4, 30000.0) for r in (6, 7, 8, 9)])
        res = bench_if.phase_stats(CLIENT, ok, {1: 7.0, 2: 13.0, 4: 28.0}, {})
        self.assertEqual(res["traced_requests_by_size"], {1: 3, 2: 2, 4: 4})
        by = res["engine_own_ms_per_image_by_size"]
        self.assertEqual([round(by[n], 3) for n in (1, 2, 4)], [7.0, 6.8, 7.5])
        # (3 x 7.0 + 2 x 6.8 + 4 x 7.5) / 9 = 7.1778 ms, over 7.0.
        self.assertAlmostEqual(res["engine_own_per_image_mix_vs_batch1"], 64.6 / 9 / 7.0)
        # Without batches of 1 there is no ratio, and no trace no entry at all.
        res = bench_if.phase_stats(CLIENT, ok[3:], {1: 7.0, 2: 13.0, 4: 28.0}, {})
        self.assertNotIn("engine_own_per_image_mix_vs_batch1", res)
        self.assertEqual(bench_if.engine_per_image_in_if([]), {})

    def test_the_engines_time_after_a_batch_of_the_same_size_or_of_another(self):
        ms = 1_000_000

        def batch(req, start_ms, n, own_ms, cpu_ms=None):
            # One traced request per batch is enough: each batch counts once.
            return dict(row(req, n, 9000, req, 0.0), batch_start_ns=start_ms * ms,
                        batch_end_ns=(start_ms + own_ms) * ms, engine_own_us=own_ms * 1000.0,
                        engine_cpu_us=None if cpu_ms is None else cpu_ms * 1000.0)
        # Sizes 3, 3, 1, 1, 3, 1: a 3 after a 3 takes 15 ms (5 per image),
        # after a 1 18 ms (6 per image); a 1 after a 1 5 ms, after a 3 7 ms
        # of which 6 on the CPU.
        seq = [batch(1, 0, 3, 15, 15), batch(2, 20, 3, 15, 15), batch(3, 40, 1, 7, 6), batch(4, 50, 1, 5, 5),
               batch(5, 60, 3, 18, 17), batch(6, 80, 1, 7, 6)]
        # The second request of the first batch: the same batch, counted once.
        seq.append(dict(seq[0], request_id=7))
        res = bench_if.engine_after_another_size(seq, least=1)["engine_own_ms_per_image_after"]
        self.assertEqual(res[3], {"same": 5.0, "same_cpu": 5.0, "same_batches": 1,
                                  "other": 6.0, "other_cpu": 17 / 3, "other_batches": 1})
        self.assertEqual(res[1], {"same": 5.0, "same_cpu": 5.0, "same_batches": 1,
                                  "other": 7.0, "other_cpu": 6.0, "other_batches": 2})
        self.assertEqual(bench_if.after_cell(1, res[1]), "1: 5.00 (5.00) / 7.00 (6.00) (1 / 2 batches)")
        # Too few batches on a side: left out; none left: no entry.
        self.assertEqual(bench_if.engine_after_another_size(seq, least=2), {})
        # Without CPU times the wall times stand alone.
        res = bench_if.engine_after_another_size([dict(r, engine_cpu_us=None) for r in seq], least=1)
        self.assertNotIn("same_cpu", res["engine_own_ms_per_image_after"][3])

    def test_the_batches_engine_time_against_batches_of_one_at_the_same_moments(self):
        ms = 1_000_000

        def batch(req, start_ms, n, own_ms):
            return dict(row(req, n, 9000, req, 0.0), batch_start_ns=start_ms * ms,
                        batch_end_ns=(start_ms + own_ms) * ms, engine_own_us=own_ms * 1000.0)
        # The machine drifts: batch 1 takes 5 ms for the first second, 6 ms
        # after. Each second holds ten batches of 1 in a row, then a batch
        # of 2 at 2.2 times the batch 1 of its second, then a batch of 1
        # right after it at 1.5 times (not a reference: it follows a 2).
        seq, req = [], 0
        for sec, one in ((0, 5.0), (1, 6.0)):
            t = 1000 * sec
            for _ in range(10):
                req += 1
                seq.append(batch(req, t, 1, one))
                t += 10
            seq += [batch(req + 1, t, 2, 2.2 * one), batch(req + 2, t, 2, 2.2 * one)]  # one batch, two requests
            seq.append(batch(req + 3, t + 20, 1, 1.5 * one))
            req += 3
        res = bench_if.engine_vs_batch1_nearby(seq, window_ns=400 * ms, least=5)
        # Within 400 ms each batch sees only its own second's references
        # (9 of them for a reference itself): the batches of 1 in a row
        # take what their references take, the batch of 2 takes 1.1 of
        # twice theirs, the batch of 1 after it 1.5 of one.
        took = 10 * 5 + 11 + 7.5 + 10 * 6 + 13.2 + 9
        would = 13 * 5 + 13 * 6
        self.assertAlmostEqual(res["engine_own_vs_batch1_nearby"], took / would)
        self.assertAlmostEqual(res["batch1_ms_per_image_nearby"], would / 26)
        self.assertEqual(res["batch1_nearby_images_share"], 1.0)
        # With too few references nearby a batch is left out: the first
        # second has 9 (its first batch follows none), the second 10 (its
        # first follows a batch of 1), so at 10 only the second's batch of
        # 2 and the batch of 1 after it are kept; at 11, none, no entry.
        res = bench_if.engine_vs_batch1_nearby(seq, window_ns=400 * ms, least=10)
        self.assertAlmostEqual(res["engine_own_vs_batch1_nearby"], (13.2 + 9) / 18)
        self.assertAlmostEqual(res["batch1_nearby_images_share"], 3 / 26)
        self.assertEqual(bench_if.engine_vs_batch1_nearby(seq, window_ns=400 * ms, least=11), {})
        self.assertEqual(bench_if.engine_vs_batch1_nearby([batch(1, 0, 2, 10.0)]), {})
        # In a phase's statistics, from the traced requests.
        traced = [dict(r, after_last_wire_us=r["engine_own_us"] + 100, if_wait_us=20.0, if_answer_us=10.0,
                       complete_ns=r["batch_start_ns"])
                  for r in seq]
        stats = bench_if.phase_stats(CLIENT, traced, {1: 5.0, 2: 11.0}, {})
        self.assertIn("engine_own_vs_batch1_nearby", stats)

    def test_engine_idle_between_batches_with_a_request_complete_or_none(self):
        def traced(req, start, end, complete):
            return dict(row(req, 1, 5000, req, 0.0), complete_ns=complete, batch_start_ns=start, batch_end_ns=end)
        # Batches [0, 10], [12, 20], [30, 40], [40, 50] ms, 50 ms in all.
        # Before the second, its request was complete at 11: idle 1 ms with
        # none, 1 ms with it complete. Before the third, complete at 21:
        # 1 ms with none, 9 ms with it complete. The fourth starts at the
        # third's end.
        ms = 1_000_000
        ok = [traced(1, 0, 10 * ms, 0), traced(2, 12 * ms, 20 * ms, 11 * ms), traced(3, 30 * ms, 40 * ms, 21 * ms),
              traced(4, 40 * ms, 50 * ms, 35 * ms), row(5, 1, 5000, 5, 0.0)]   # 5: not traced
        res = bench_if.engine_idle_in_if(ok)
        self.assertAlmostEqual(res["engine_idle_with_request_complete_fraction"], 10 / 50)
        self.assertAlmostEqual(res["engine_idle_with_none_complete_fraction"], 2 / 50)
        # Both requests of a batch of 2 count once, from the earlier completion.
        two = [traced(1, 0, 10 * ms, 0), dict(traced(2, 14 * ms, 20 * ms, 13 * ms), batch_size=2),
               dict(traced(3, 14 * ms, 20 * ms, 11 * ms), batch_size=2)]
        res = bench_if.engine_idle_in_if(two)
        self.assertAlmostEqual(res["engine_idle_with_request_complete_fraction"], 3 / 20)
        self.assertAlmostEqual(res["engine_idle_with_none_complete_fraction"], 1 / 20)
        self.assertEqual(bench_if.engine_idle_in_if(ok[:1]), {})

    def test_a_phase_without_captures_has_the_client_only(self):
        res = bench_if.phase_stats(dict(CLIENT, answer_span_s=0), [], {1: 4.0}, {})
        self.assertEqual(sorted(res), ["client", "cpu", "ok_per_s", "statuses", "unanswered"])
        self.assertEqual(res["ok_per_s"], 0.0)

    def test_saturation_against_the_engine_at_the_same_batch_mix(self):
        sat = {"ok_per_s": 200.0, "batch_mix_requests": {2: 40, 4: 80}}
        ref = {1: 4.0, 2: 8.0, 4: 12.5}
        bench_if.add_saturation_ratios(sat, {}, ref, {"batching": {"a_ns": 3e6, "b_ns": 1.25e6}})
        # 20 batches of 2 (0.16 s) + 20 of 4 (0.25 s) = 120 images in 0.41 s.
        self.assertAlmostEqual(sat["engine_images_per_s_same_mix"], 120 / 0.41)
        self.assertAlmostEqual(sat["engine_busy_fraction"], 0.41 / 120 * 200)
        self.assertAlmostEqual(sat["ratio_e2e_to_engine_best"], 200 / 320)
        self.assertEqual(sat["if_fit_ms"], {1: 4.25, 2: 5.5, 4: 8.0, 8: 13.0})

    def test_saturation_without_captures_uses_batch_one(self):
        sat = {"ok_per_s": 100.0}
        eng = {1: {"before": {"images_per_s_median": 250.0}}}
        bench_if.add_saturation_ratios(sat, eng, {1: 4.0}, {})
        self.assertEqual(sat["ratio_e2e_to_engine"], 0.4)
        self.assertNotIn("engine_busy_fraction", sat)
        self.assertEqual(sat["if_fit_ms"], {1: 0.0, 2: 0.0, 4: 0.0, 8: 0.0})

    def test_latency_table_rows(self):
        cpu = {"cpu0": {"busy": 50.0}, "cpu1": {"busy": 99.5}, "kp_if_threads_pct": {}, "if_manager_threads_pct":
               {"a": 1.25, "b": 2.5}, "kp_client_pct": 7.5, "others_pct": 0.0, "loadavg_end": ["1.0", "0.5", "0.2"]}
        closed = {"client": CLIENT, "ok_per_s": 4.0, "statuses": {"ok": 40}, "unanswered": 1, "cpu": cpu,
                  "overhead_us": {"p50": 1000.0, "p99": 2345.0}}
        opened = dict(closed, client=dict(CLIENT, rate=81.3))
        L = bench_if.latency_table({"duration_s": 20, "long_duration_s": 120, "load_fraction": 0.5},
                                   {"single": closed, "half": opened, "long": opened})
        self.assertEqual(L[1], "| latency | 1 outstanding (20 s) | 50% load (20 s) | 50% load (120 s) |")
        self.assertEqual(L[3], "| offered / OK answers per s | closed / 4.0 | 81.3 / 4.0 | 81.3 / 4.0 |")
        self.assertEqual(L[4], f"| requests sent | {CLIENT['sent']} | {CLIENT['sent']} | {CLIENT['sent']} |")
        self.assertIn("| **platform overhead = latency_us − inference** p50 / p99 ms | **1.00 / 2.35** |", L[8])
        self.assertEqual(L[7], "| inference (engine median at the request's batch size) p50 / p99 ms | - | - | - |")
        self.assertEqual(L[-2], "| if-manager / kp-client / everything else, % of a CPU | 3.8 / 7.5 / 0.0 | 3.8 / 7.5 / 0.0 "
                                "| 3.8 / 7.5 / 0.0 |")
        # With a low-load phase (LOW_LOAD_FRACTION), its column comes second.
        # Its header says how long it ran (LOW_REQUESTS may lengthen it).
        low = dict(closed, client=dict(CLIENT, rate=16.2, send_duration_s=61.7))
        L = bench_if.latency_table({"duration_s": 20, "long_duration_s": 120, "load_fraction": 0.5,
                                    "low_load_fraction": 0.1},
                                   {"single": closed, "low": low, "half": opened, "long": opened})
        self.assertEqual(L[1], "| latency | 1 outstanding (20 s) | 10% load (62 s) | 50% load (20 s) | 50% load (120 s) |")
        self.assertEqual(L[2], "|---|---|---|---|---|")
        self.assertEqual(L[3], "| offered / OK answers per s | closed / 4.0 | 16.2 / 4.0 | 81.3 / 4.0 | 81.3 / 4.0 |")


class LowLoadSeconds(unittest.TestCase):
    def test_duration_or_long_enough_for_the_requests(self):
        self.assertEqual(bench_if.low_load_seconds(20, 1000, 14.5), 69)   # squeezenet's 10%: longer
        self.assertEqual(bench_if.low_load_seconds(60, 1000, 1.3), 770)   # resnet50's: much longer
        self.assertEqual(bench_if.low_load_seconds(20, 1000, 80.0), 20)   # DURATION already sends more
        self.assertEqual(bench_if.low_load_seconds(20, 0, 1.3), 20)       # LOW_REQUESTS=0: DURATION


class Targets(unittest.TestCase):
    def test_each_target_met_or_not_with_its_figure(self):
        sat = {"ratio_e2e_to_engine": 0.95, "ratio_e2e_to_engine_best": 0.935}
        single = {"overhead_after_last_own_us": {"p50": 55.0, "p99": 191.0}}
        low = {"overhead_after_last_own_engine_idle_us": {"p50": 101.0, "p99": 300.0, "n": 75}}
        line = bench_if.targets({"sat": sat, "single": single, "low": low})[1]
        self.assertIn("at the same batch mix **met** (0.950), at the engine's best batch size **not met** (0.935)", line)
        self.assertIn("1 outstanding: **met** (55 / 191 µs)", line)
        self.assertIn("low load, engine idle at arrival: **not met** (101 / 300 µs over 75 requests)", line)

    def test_a_ratio_just_below_the_target_never_reads_as_it(self):
        sat = {"ratio_e2e_to_engine": 0.949877, "ratio_e2e_to_engine_best": 0.9418}
        line = bench_if.targets({"sat": sat})[1]
        self.assertIn("at the same batch mix **not met** (0.949), at the engine's best batch size **not met** (0.941)",
                      line)
        # and the saturation table says the same figure as the verdict
        self.assertEqual(bench_if.ratio3(0.949877), "0.949")
        self.assertEqual(bench_if.ratio3(0.95), "0.950")

    def test_a_run_without_a_trace_misses_the_figure_and_without_low_load_leaves_it_out(self):
        sat = {"ratio_e2e_to_engine": 0.96, "ratio_e2e_to_engine_best": 0.96}
        line = bench_if.targets({"sat": sat, "single": {}})[1]
        self.assertIn("1 outstanding: missing (no trace or capture)", line)
        self.assertNotIn("low load", line)


# cyclictest --json (two threads; thread 0 had 2 wake-ups past -h's range)
# and oslat --json (-b 1024: iterations by µs), shortened.
CYCLICTEST = {"cmdline:": "cyclictest --policy=other -m -q -t 2 -a 0,1 -i 5000 -D 10 -h 20000 --json=/x/c.json",
              "thread": {"1": {"histogram": {"14": 3, "15": 996, "2500": 1}, "cycles": 1000, "min": 14, "max": 2500,
                               "cpu": 1},
                         "0": {"histogram": {"14": 500, "15": 400, "20": 90, "2500": 8, "19999": 0}, "cycles": 1000,
                               "min": 14, "max": 25000, "cpu": 0}}}
OSLAT = {"cmdline:": "oslat -c 0,1 -D 10 -q -b 1024 --json=/x/o.json",
         "thread": {"0": {"histogram": {"1": 9000, "480": 3, "600": 10, "1024": 2}, "max": 3854, "duration": 5.0,
                          "cpu": 0},
                    "1": {"histogram": {"1": 9000, "3": 1}, "max": 3, "duration": 5.0, "cpu": 1}}}


class HostLatency(unittest.TestCase):
    def test_histograms_per_thread_with_what_fell_past_them_at_the_maximum(self):
        self.assertEqual(bench_if.host_histograms(CYCLICTEST), [(0, {14: 500, 15: 400, 20: 90, 2500: 8, 25000: 2}),
                                                                (1, {14: 3, 15: 996, 2500: 1})])
        self.assertEqual(bench_if.host_histograms({}), [])

    def test_quantiles_by_nearest_rank_and_the_late_share(self):
        (_, a), (_, b) = bench_if.host_histograms(CYCLICTEST)
        self.assertEqual(bench_if.latency_stats(a, 500.0),
                         {"n": 1000, "max": 25000, "late_share": 0.01, "p50": 14, "p99": 20, "p999": 25000})
        w = bench_if.latency_stats(b, 500.0)
        self.assertEqual((w["n"], w["p50"], w["p999"], w["max"], w["late_share"]), (1000, 15, 15, 2500, 0.001))
        self.assertEqual(bench_if.latency_stats({}, 500.0), {"n": 0})

    def test_interruptions_are_the_busy_loops_iterations_over_the_bound(self):
        self.assertEqual(bench_if.interruptions(OSLAT, 500.0), [{"cpu": 0, "max": 3854, "over": 12, "per_s": 2.4},
                                                               {"cpu": 1, "max": 3, "over": 0, "per_s": 0.0}])

    def test_the_report_line_names_each_tool_its_command_and_each_cpu_before_and_after(self):
        L = bench_if.host_markdown({("cyclictest", "before"): CYCLICTEST, ("cyclictest", "after"): CYCLICTEST,
                                    ("oslat", "after"): OSLAT})
        self.assertEqual(L[0], "")
        self.assertIn("(`cyclictest --policy=other -m -q -t 2 -a 0,1 -i 5000 -D 10 -h 20000`): "
                      "CPU 0 before 20 / 25000 / 25000 µs, after 20 / 25000 / 25000 µs; "
                      "CPU 1 before 15 / 15 / 2500 µs, after 15 / 15 / 2500 µs", L[1])
        self.assertIn("over 500 µs per second (`oslat -c 0,1 -D 10 -q -b 1024`): CPU 0 after 3854 µs, 2.40/s; "
                      "CPU 1 after 3 µs, 0.00/s.", L[1])
        self.assertEqual(bench_if.host_markdown({}), [])
        self.assertIn("no histogram", bench_if.host_markdown({("oslat", "before"): {"thread": {}}})[1])


class Memory(unittest.TestCase):
    def test_growth_and_hugepage_groups(self):
        st = lambda rss: {k: rss for k in bench_if.MEMORY_KEYS}
        kp = {"rest": {"status": st(1000), "hugetlb_kB": 18432},
              "after-long": {"status": st(1512), "hugetlb_kB": 20480}}
        growth = bench_if.memory_growth(kp)
        self.assertEqual(growth["VmRSS_kB"], 512)
        self.assertEqual(growth["smaps_hugetlb_kB"], 2048)
        maps = {"/dev/hugepages/kp-77map_0": {"shared_kB": 4096, "private_kB": 0},
                "/dev/hugepages/kp-77map_1": {"shared_kB": 4096, "private_kB": 0},
                "/dev/hugepages/kp-77config": {"shared_kB": 2048, "private_kB": 0},
                "[anon]": {"shared_kB": 0, "private_kB": 8192}}
        self.assertEqual(bench_if.hugepage_groups(maps), {"kp-77map_N": (2, 8192), "kp-77config": (1, 2048),
                                                          "[anon]": (1, 8192)})

    def test_memory_rows_follow_the_snapshots(self):
        m = {"proc": "kp-if", "label": "rest", "status": {"VmRSS_kB": 10, "VmHWM_kB": 12}, "hugetlb_kB": 4,
             "hugepages_free": 900}
        self.assertEqual(bench_if.memory_rows([m])[1], ["kp-if", "rest", 10, None, None, None, 12, None, 4, 900])


class Rates(unittest.TestCase):
    def test_ok_rate_and_offered_rate(self):
        self.assertEqual(bench_if.ok_rate({"status": {"ok": 58}, "answer_span_s": 19.87}), 58 / 19.87)
        self.assertEqual(bench_if.offered_rate(163.37, 0.5), 81.7)
        self.assertEqual(bench_if.offered_rate(0.9, 0.5), 0.5)

    def test_settings_keep_ints_as_ints(self):
        self.assertEqual(repr(host.number("20")), "20")
        self.assertEqual(repr(host.number("2.5")), "2.5")
        with self.assertRaises(ValueError):
            host.number("twenty")


if __name__ == "__main__":
    unittest.main()


def run_summary(model, kp_if_cpu, frag_cpu, ok, batch, mix, best, git="abc1234"):
    cpus = {"if_manager": 0, "kp_if": kp_if_cpu, "client": 0}
    if frag_cpu is not None:
        cpus["kp_if_fragment_thread"] = frag_cpu
    return {"meta": {"model": model, "cpus": cpus, "git": git},
            "phases": {"sat": {"ok_per_s": ok, "mean_batch": batch, "ratio_e2e_to_engine": mix,
                               "ratio_e2e_to_engine_best": best}}}


class Compare(unittest.TestCase):
    def test_layout_is_where_the_fragment_thread_ran(self):
        self.assertEqual(bench_if.layout(run_summary("m", 1, 0, 1, 1, 1, 1)["meta"]), "as designed")
        self.assertEqual(bench_if.layout(run_summary("m", 1, 1, 1, 1, 1, 1)["meta"]), "all on the inference core")
        # Runs from before the fragment thread's CPU was recorded had it on kp-if's.
        self.assertEqual(bench_if.layout(run_summary("m", 1, None, 1, 1, 1, 1)["meta"]), "all on the inference core")

    def test_the_header_says_when_the_inference_thread_spun(self):
        meta = {"model": "squeezenet", "cpu": "AMD EPYC", "nproc": 2, "git": "abc1234",
                "loadavg_at_start": ["0.1", "0.2", "0.3"], "threads": 1, "max_batch": 8, "slo_ms": 2000,
                "cpus": {"if_manager": 0, "kp_if": 1, "kp_if_fragment_thread": 0, "client": 0}}
        eng = {1: {"before": {"latency_ms": {"median": 5.0, "p99": 6.0}, "images_per_s_median": 200.0},
                   "after": {"latency_ms": {"median": 5.1, "p99": 6.1}, "images_per_s_median": 196.1}}}
        self.assertNotIn("spinning", bench_if.engine_table(meta, eng)[1])
        # Runs from before the option have no such key; 0 is the default.
        self.assertNotIn("spinning", bench_if.engine_table(dict(meta, inference_spin_ms=0), eng)[1])
        self.assertIn("; the inference thread spinning 1000 ms after each batch (kp-if --inference-spin-ms).",
                      bench_if.engine_table(dict(meta, inference_spin_ms=1000), eng)[1])
        # Which thread converted the images: said only where it is not the design's.
        self.assertNotIn("converted", bench_if.engine_table(dict(meta, convert_on="network"), eng)[1])
        self.assertIn("; images converted by the inference thread before each batch (kp-if --convert-on inference).",
                      bench_if.engine_table(dict(meta, convert_on="inference"), eng)[1])

    def test_the_report_stops_when_kp_if_converted_elsewhere_than_the_header_says(self):
        bench_if.check_converted_by({"convert_on": "inference"}, {"images_converted_by": "inference thread"})
        bench_if.check_converted_by({"convert_on": "network"}, {"images_converted_by": "fragment thread"})
        bench_if.check_converted_by({}, {"images_converted_by": "fragment thread"})
        # A build before 6 December says nothing.
        bench_if.check_converted_by({"convert_on": "inference"}, {})
        with self.assertRaisesRegex(SystemExit, "its inference thread converted"):
            bench_if.check_converted_by({"convert_on": "network"}, {"images_converted_by": "inference thread"})
        with self.assertRaisesRegex(SystemExit, "its fragment thread converted"):
            bench_if.check_converted_by({"convert_on": "inference"}, {"images_converted_by": "fragment thread"})

    def test_one_row_per_group_with_every_run_in_order(self):
        rows = bench_if.saturation_rows([
            ("new", [run_summary("squeezenet", 1, 0, 194.21, 1.714, 0.9951, 0.9787),
                     run_summary("squeezenet", 1, 0, 187.7, 4.2, 0.986, 0.95, git="abc1234+dirty")]),
            ("ic", [run_summary("squeezenet", 1, 1, 182.9, 2.34, 0.954, 0.928)])])
        self.assertEqual(len(rows), 4)
        self.assertEqual(rows[2], "| new (2) | squeezenet, as designed | 194.2, 187.7 | 1.71, 4.20 | 0.995, 0.986 "
                                  "| 0.979, 0.950 | abc1234, abc1234+dirty |")
        self.assertIn("| ic (1) | squeezenet, all on the inference core | 182.9 |", rows[3])

    def test_refusals_per_phase(self):
        run = run_summary("squeezenet", 1, 0, 1, 1, 1, 1)
        run["meta"]["slo_ms"] = 20.0
        run["phases"]["single"] = {"client": {"sent": 2502, "status": {"ok": 1998, "overloaded": 504}}}
        run["phases"]["half"] = {"client": {"sent": 685, "rate": 56.2, "status": {"ok": 675, "overloaded": 10}}}
        rows = bench_if.refusal_rows([("fixed", [run])])
        self.assertEqual(rows[2], "| fixed (1) | squeezenet, as designed, 20 ms | 504 of 2502 (20.1%) "
                                  "| 56.2: 10 of 685 (1.5%) | abc1234 |")
