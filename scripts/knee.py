#!/usr/bin/env python3
"""The knee of each model from a knee sweep (scripts/gpu-knee.sh: one
`kp-gpu-check --knee` process per CUDA MPS percentage, each appending its
latency sweep to knee.csv).

GSLICE's knee: the share of the GPU past which a model gains little. Here,
for each model and batch size, the smallest MPS percentage whose
throughput (images/s at the median batch time) reaches `--fraction`
(default 0.9) of the best throughput over all percentages measured. The
table gives the throughput at every percentage, the knee, and p99 latency
at the knee; `knee-summary.csv` beside the input holds model, batch,
knee_pct, best images/s and p99 ms at the knee. With `--plot FILE.svg`
(and matplotlib), throughput against percentage per model, one line per
batch size: GSLICE's knee curves.

    python3 scripts/knee.py OUT/knee.csv [--fraction 0.9] [--plot knee.svg]
"""

import argparse
import csv
import sys
from collections import defaultdict
from pathlib import Path


def read(path):
    """{(model, batch): {pct: (images_per_s, p99_ms)}} and {pct: SMs}."""
    points, sms = defaultdict(dict), {}
    with open(path) as f:
        for r in csv.DictReader(f):
            pct = float(r["mps_pct"])
            points[(r["model"], int(r["batch"]))][pct] = (float(r["images_per_s"]), float(r["p99_ms"]))
            if r.get("sms_available"):
                sms[pct] = int(r["sms_available"])
    return points, sms


def knee(curve, fraction):
    """The smallest percentage of `curve` ({pct: (images/s, p99)}) whose
    throughput is at least `fraction` of the best."""
    best = max(t for t, _ in curve.values())
    return min(p for p, (t, _) in curve.items() if t >= fraction * best), best


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv", type=Path)
    ap.add_argument("--fraction", type=float, default=0.9)
    ap.add_argument("--plot", type=Path)
    args = ap.parse_args(argv)
    points, sms = read(args.csv)
    if not points:
        print(f"knee: no points in {args.csv}", file=sys.stderr)
        return 1
    pcts = sorted({p for c in points.values() for p in c})
    if sms:
        print("SMs available per MPS percentage (cuCtxGetExecAffinity): "
              + ", ".join(f"{p:g}%: {sms[p]}" for p in pcts if p in sms))
    print(f"\nimages/s per MPS percentage; knee = smallest percentage at >= {args.fraction:g} of the best\n")
    print("| model | batch | " + " | ".join(f"{p:g}%" for p in pcts) + " | knee | p99 ms at knee |")
    print("|---|---:|" + "---:|" * len(pcts) + "---:|---:|")
    rows = []
    for (model, batch), curve in sorted(points.items()):
        k, best = knee(curve, args.fraction)
        cells = [f"{curve[p][0]:.0f}" if p in curve else "-" for p in pcts]
        print(f"| {model} | {batch} | " + " | ".join(cells) + f" | **{k:g}%** | {curve[k][1]:.2f} |")
        rows.append((model, batch, k, best, curve[k][1]))
    out = args.csv.with_name("knee-summary.csv")
    with open(out, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["model", "batch", "knee_pct", "best_images_per_s", "p99_ms_at_knee"])
        for r in rows:
            w.writerow([r[0], r[1], f"{r[2]:g}", f"{r[3]:.1f}", f"{r[4]:.3f}"])
    models = sorted({m for m, *_ in rows})
    print()
    for m in models:
        ks = [k for mm, _, k, _, _ in rows if mm == m]
        print(f"{m}: knee {min(ks):g}% to {max(ks):g}% over batch sizes")
    if args.plot:
        plot(points, pcts, models, args.plot)
    return 0


def plot(points, pcts, models, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("knee: no matplotlib: no plot", file=sys.stderr)
        return
    fig, axes = plt.subplots(1, len(models), figsize=(4.5 * len(models), 3.6), squeeze=False)
    for ax, m in zip(axes[0], models):
        for (model, batch), curve in sorted(points.items()):
            if model != m:
                continue
            xs = [p for p in pcts if p in curve]
            ax.plot(xs, [curve[p][0] for p in xs], marker="o", ms=3, label=f"batch {batch}")
        ax.set_title(m)
        ax.set_xlabel("CUDA MPS active thread %")
        ax.set_ylabel("images/s")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    print(f"knee: plot in {path}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
