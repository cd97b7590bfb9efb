"""The Python client (kneepoint) against kp-client (Rust) on a running
platform: closed-loop rate at the same concurrency, and the Python client's
per-request overhead. Issue 12 item 5's targets: >= 90% of kp-client's rate,
overhead under 100 µs p50.

    ip netns exec CLIENT_NS .venv/bin/python bench/bench_client.py \\
        --addr 10.77.X.2:9000 --kp-client target/release/kp-client \\
        [--if-id 1] [--concurrency 4] [--duration 5] [--rounds 5]

Rounds alternate kp-client and Python (so a drift of the machine hits both
alike); each prints one line, the end a summary and one JSON line.

Rate: answers (any status) per second, and OK answers per second (when the
platform sheds, its fast OVERLOADED answers are much of the first).
kp-client's is its report's `throughput` (answers over the span from first
send to last answer); the Python one is answers over the same span (a
request that timed out is no answer and does not stretch the span), from C
threads each looping submit + wait on one shared Client, inputs prepared up
front (16 distinct 224x224x3 numpy arrays, as kp-client's 16 synthetic
images).

Overhead, per OK request, from three clocks around each request:
    t0 before submit(), t1 after submit() returns, t2 after wait() returns
    and the answer's top prediction is read,
and the answer's `rtt` (the Rust crate's: from just before its first
fragment is sent to the answer datagram's arrival at the receiver thread).
  - python_added = (t2 - t0) - rtt: the client's per-request overhead, i.e.
    everything the client does outside the kernel's sends, the network and
    the platform: the Python call, the fast-path checks, cutting the array
    into its datagrams (fragmenting: the crate's `prepare`, before the rtt
    starts), the book entry, then matching the answer, waking the waiting
    thread, taking the GIL back and building the Answer;
  - submit = t1 - t0: fragmenting and the sends' syscalls (147 datagrams per
    224x224x3 request; the kernel's UDP path, which kp-client pays too);
  - overhead = python_added + submit: an upper bound of the client's own
    time per request (the fragmenting is in both); the platform's and the
    network's time is in neither.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import threading
import time
from typing import Any

import numpy as np

import kneepoint


def kp_client_round(exe: str, addr: str, if_id: int, conc: int, duration: float) -> dict[str, Any]:
    out = subprocess.run(
        [exe, "--dst", addr, "--if-id", str(if_id), "--concurrency", str(conc),
         "--duration", f"{duration}s", "--timeout", "5s", "--input", "synthetic", "--json"],
        check=True, capture_output=True, text=True,
    ).stdout
    r = json.loads(out.strip().splitlines()[-1])
    ok = r["status"]["ok"]
    return {"rate": r["throughput"], "ok_rate": r["throughput"] * ok / max(r["answered"], 1),
            "answered": r["answered"], "ok": ok,
            "unanswered": r["unanswered"], "rtt_p50_us": r["rtt_us"].get("p50")}


def python_round(addr: str, if_id: int, conc: int, duration: float) -> dict[str, Any]:
    client = kneepoint.Client(addr, models=False, timeout=5.0)
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, (224, 224, 3), dtype=np.uint8) for _ in range(16)]
    added: list[float] = []
    submit: list[float] = []
    counts = {"answered": 0, "ok": 0}
    lock = threading.Lock()
    first = [float("inf")]
    last = [0.0]
    stop = time.perf_counter() + duration

    def loop(k: int) -> None:
        my_added, my_submit, ok, answered = [], [], 0, 0
        first_t, last_t, i = float("inf"), 0.0, k
        while time.perf_counter() < stop:
            image = images[i % len(images)]
            i += 1
            t0 = time.perf_counter()
            rid = client.submit(if_id, image)
            t1 = time.perf_counter()
            first_t = min(first_t, t0)
            try:
                a = client.wait(rid)
                top = a.predictions[0]  # what an application reads
                t2 = time.perf_counter()
                ok += 1
                my_added.append(t2 - t0 - a.rtt)
                assert top.class_id < 1000
                my_submit.append(t1 - t0)
            except kneepoint.TimeoutError:
                continue  # unanswered: neither an answer nor the span's end
            except kneepoint.PlatformError:
                t2 = time.perf_counter()
            answered += 1
            last_t = t2
        with lock:
            added.extend(my_added)
            submit.extend(my_submit)
            counts["answered"] += answered
            counts["ok"] += ok
            first[0] = min(first[0], first_t)
            last[0] = max(last[0], last_t)

    ts = [threading.Thread(target=loop, args=(k,)) for k in range(conc)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    stats = client.stats()
    span = last[0] - first[0]
    return {"rate": counts["answered"] / span, "ok_rate": counts["ok"] / span, **counts,
            "timed_out": stats["timed_out"],
            "added": added, "submit": submit}


def pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(p / 100 * len(s)))] * 1e6 if s else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--addr", required=True)
    ap.add_argument("--kp-client", required=True, help="path of the kp-client binary")
    ap.add_argument("--if-id", type=int, default=1)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--duration", type=float, default=5.0, help="seconds per round and client")
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()

    rust, py, rust_ok, py_ok = [], [], [], []
    added: list[float] = []
    submit: list[float] = []
    overhead: list[float] = []
    for r in range(a.rounds):
        k = kp_client_round(a.kp_client, a.addr, a.if_id, a.concurrency, a.duration)
        p = python_round(a.addr, a.if_id, a.concurrency, a.duration)
        rust.append(k["rate"])
        py.append(p["rate"])
        rust_ok.append(k["ok_rate"])
        py_ok.append(p["ok_rate"])
        added += p["added"]
        submit += p["submit"]
        overhead += [x + y for x, y in zip(p["added"], p["submit"])]
        print(f"round {r + 1}: kp-client {k['rate']:8.1f}/s ({k['ok']} ok of {k['answered']}, "
              f"{k['unanswered']} timed out)  "
              f"python {p['rate']:8.1f}/s ({p['ok']} ok of {p['answered']}, {p['timed_out']} timed out)  "
              f"ratio {p['rate'] / k['rate']:.3f} (OK only {p['ok_rate'] / k['ok_rate']:.3f})", flush=True)
    ratios = [p / k for p, k in zip(py, rust)]
    ok_ratios = [p / k for p, k in zip(py_ok, rust_ok)]
    summary = {
        "concurrency": a.concurrency, "duration_s": a.duration, "rounds": a.rounds,
        "kp_client_rate": {"median": statistics.median(rust), "min": min(rust), "max": max(rust)},
        "python_rate": {"median": statistics.median(py), "min": min(py), "max": max(py)},
        "ratio": {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)},
        "kp_client_ok_rate": {"median": statistics.median(rust_ok), "min": min(rust_ok), "max": max(rust_ok)},
        "python_ok_rate": {"median": statistics.median(py_ok), "min": min(py_ok), "max": max(py_ok)},
        "ok_ratio": {"median": statistics.median(ok_ratios), "min": min(ok_ratios), "max": max(ok_ratios)},
        "python_added_us": {f"p{q}": round(pct(added, q), 1) for q in (50, 90, 99)},
        "submit_us": {f"p{q}": round(pct(submit, q), 1) for q in (50, 90, 99)},
        "overhead_us": {f"p{q}": round(pct(overhead, q), 1) for q in (50, 90, 99)},
        "samples": len(overhead),
    }
    print(f"rate ratio python/kp-client: median {summary['ratio']['median']:.3f} "
          f"(min {summary['ratio']['min']:.3f}, max {summary['ratio']['max']:.3f}); "
          f"OK answers only: median {summary['ok_ratio']['median']:.3f} "
          f"(min {summary['ok_ratio']['min']:.3f}, max {summary['ok_ratio']['max']:.3f})")
    print(f"overhead µs p50/p90/p99: {summary['overhead_us']}  "
          f"(python_added {summary['python_added_us']}, submit {summary['submit_us']})")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
