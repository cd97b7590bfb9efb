#!/usr/bin/env python3
"""The engine limit: ONNX Runtime alone on a model, no server around it.

    taskset -c 1 .venv/bin/python bench/engine_limit.py \
        --config models/squeezenet/config.toml --threads 1 --batches 1,2,4,8 --seconds 3

The session is made exactly as every system under test makes it
(bench/peers/kp_peer_model.py: libml's session options, the same intra-op
threads); it runs back-to-back batches of random RGB images (already
preprocessed: only the engine is timed, as kp-engine-bench does) of each
batch size for --seconds in all, after --warmup batches, and prints one
JSON line per size: the per-batch latency (median, p90, p99, min, max;
ms) and images/s as batch / median. Pin it (taskset) to the core the
servers' inference runs on.

The sizes take turns, --slice seconds each (the first batch after one of
another shape not counted), in rounds whose order
alternates (1, 2, 4, 8, then 8, 4, 2, 1), until each has had its
--seconds: a shared machine's speed drifts within seconds (on 1 December
one run's batches of 1 and 2 ran at 7.7 ms per image and its batches of 4
and 8, timed after them, at 6.0), and sizes timed one after the other
would show that drift as a gain or a loss from batching, which the
harness then tunes the peers' batch cap and the upper bound from.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent / "peers"))
from kp_peer_model import Model  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from stats import percentile  # noqa: E402


# Seconds of one size's turn: the shorter, the less of a drift within the
# measurement stays in the ratios between sizes (test_engine_limit: a 30%
# drift left 1.7% at 0.25 s, 3.5% at 0.5 s, 6.8% at 1 s), and each turn
# runs one batch more than it counts.
SLICE_S = 0.25


def time_sizes(sizes: list[int], infer, seconds: float, slice_s: float, min_iterations: int,
               clock=time.perf_counter) -> dict[int, list[float]]:
    """Per batch size, the latencies (ms) of back-to-back `infer(size)`
    calls, the sizes taking turns of `slice_s` seconds, in rounds whose
    order alternates, until each has had `seconds` of counted batches and
    at least `min_iterations`; the first batch after one of another shape
    is run but not counted (so one size alone runs as one turn)."""
    lats: dict[int, list[float]] = {b: [] for b in sizes}
    spent = dict.fromkeys(sizes, 0.0)  # seconds of counted batches per size

    def done(b: int) -> bool:
        return len(lats[b]) >= min_iterations and spent[b] >= seconds

    order, last = list(sizes), None
    while not all(done(b) for b in sizes):
        for b in order:
            if done(b):
                continue
            if b != last:
                infer(b)  # the first batch after one of another shape: not counted
                last = b
            turn = 0.0
            while not done(b) and turn < slice_s:
                t = clock()
                infer(b)
                dt = clock() - t
                lats[b].append(dt * 1e3)
                turn += dt
                spent[b] += dt
        order.reverse()  # 1, 2, 4, 8, then 8, 4, 2, 1: a steady drift weighs on every size alike
    return lats


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batches", default="1,2,4,8")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--min-iterations", type=int, default=5)
    ap.add_argument("--slice", type=float, default=SLICE_S,
                    help="seconds of one size's turn before the next size's (the sizes interleave)")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()

    model = Model(a.config, a.threads)
    rng = np.random.default_rng(a.seed)
    sizes = [int(x) for x in a.batches.split(",")]
    inputs = {b: model.preprocess(rng.integers(0, 256, (b, model.height, model.width, 3), dtype=np.uint8))
              for b in sizes}
    for b in sizes:
        for _ in range(a.warmup):
            model.infer(inputs[b])
    lats = time_sizes(sizes, lambda b: model.infer(inputs[b]), a.seconds, a.slice, a.min_iterations)
    for b in sizes:
        lat = sorted(lats[b])
        med = percentile(lat, 0.5)
        print(json.dumps({
            "model": model.name, "batch": b, "threads": a.threads, "iterations": len(lat),
            "median_ms": med, "p90_ms": percentile(lat, 0.9), "p99_ms": percentile(lat, 0.99),
            "min_ms": lat[0], "max_ms": lat[-1], "images_per_s": 1000.0 * b / med,
            "cpus": sorted(os.sched_getaffinity(0)),
        }), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
