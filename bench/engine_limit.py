#!/usr/bin/env python3
"""The engine limit: ONNX Runtime alone on a model, no server around it.

    taskset -c 1 .venv/bin/python bench/engine_limit.py \
        --config models/squeezenet/config.toml --threads 1 --batches 1,2,4,8 --seconds 3

The session is made exactly as every system under test makes it
(bench/peers/kp_peer_model.py: libml's session options, the same intra-op
threads); for each batch size it runs back-to-back batches of random RGB
images (already preprocessed: only the engine is timed, as kp-engine-bench
does) for --seconds after --warmup batches, and prints one JSON line: the
per-batch latency (median, p90, p99, min, max; ms) and images/s as
batch / median. Pin it (taskset) to the core the servers' inference runs on.
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batches", default="1,2,4,8")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--min-iterations", type=int, default=5)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()

    model = Model(a.config, a.threads)
    rng = np.random.default_rng(a.seed)
    for b in (int(x) for x in a.batches.split(",")):
        x = model.preprocess(rng.integers(0, 256, (b, model.height, model.width, 3), dtype=np.uint8))
        for _ in range(a.warmup):
            model.infer(x)
        lat = []
        t0 = time.perf_counter()
        while len(lat) < a.min_iterations or time.perf_counter() - t0 < a.seconds:
            t = time.perf_counter()
            model.infer(x)
            lat.append((time.perf_counter() - t) * 1e3)
        lat.sort()
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
