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
knee_pct, best images/s and p99 ms at the knee. With `--plot FILE.svg`,
throughput against percentage per model, one line per batch size, the
knees ringed: GSLICE's knee curves (plain SVG, no plotting library).

    python3 scripts/knee.py OUT/knee.csv [--fraction 0.9] [--plot knee.svg] [--note TEXT]
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
    ap.add_argument("--note", default="", help="a line under the plot's title (GPU, date, commit)")
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
        plot(points, pcts, models, args.plot, args.fraction, args.note)
    return 0


COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]


def svg(points, pcts, models, fraction, note=""):
    """GSLICE's knee curves as SVG text (no plotting library): one panel per
    model, images/s against the MPS percentage, one line per batch size, the
    knee of each line ringed."""
    import html

    pw, ph, ml, mt, gap = 300, 220, 62, 52, 40
    W = ml + len(models) * (pw + gap) + 90
    H = mt + ph + 60
    o = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" '
         'font-family="DejaVu Sans, Arial, sans-serif" font-size="11">',
         f'<rect width="{W}" height="{H}" fill="white"/>',
         f'<text x="{ml}" y="18" font-size="14" font-weight="bold">Throughput against the CUDA MPS share '
         f'(knee: smallest share at {fraction:g} of the best, ringed)</text>',
         f'<text x="{ml}" y="34" fill="#555">{html.escape(note)}</text>']
    batches = sorted({b for (_, b) in points})
    for i, m in enumerate(models):
        x0 = ml + i * (pw + gap)
        curves = {b: c for (mm, b), c in points.items() if mm == m}
        top = max(t for c in curves.values() for t, _ in c.values()) * 1.08
        X = lambda p: x0 + pw * p / 100.0  # noqa: E731
        Y = lambda v: mt + ph * (1 - v / top)  # noqa: E731
        o.append(f'<text x="{x0 + pw / 2}" y="{mt - 6}" text-anchor="middle" font-weight="bold">'
                 f'{html.escape(m)}</text>')
        for p in range(0, 101, 20):
            o.append(f'<line x1="{X(p):.1f}" y1="{mt}" x2="{X(p):.1f}" y2="{mt + ph}" stroke="#eee"/>'
                     f'<text x="{X(p):.1f}" y="{mt + ph + 14}" text-anchor="middle">{p}</text>')
        for k in range(6):
            v = top / 1.08 * k / 5
            o.append(f'<line x1="{x0}" y1="{Y(v):.1f}" x2="{x0 + pw}" y2="{Y(v):.1f}" stroke="#f0f0f0"/>'
                     f'<text x="{x0 - 4}" y="{Y(v) + 4:.1f}" text-anchor="end">{v:.0f}</text>')
        o.append(f'<rect x="{x0}" y="{mt}" width="{pw}" height="{ph}" fill="none" stroke="#444"/>')
        o.append(f'<text x="{x0 + pw / 2}" y="{mt + ph + 30}" text-anchor="middle">MPS active thread %</text>')
        for b, c in sorted(curves.items()):
            colour = COLOURS[batches.index(b) % len(COLOURS)]
            xs = [p for p in pcts if p in c]
            pts = " ".join(f"{X(p):.1f},{Y(c[p][0]):.1f}" for p in xs)
            o.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.6" points="{pts}"/>')
            for p in xs:
                o.append(f'<circle cx="{X(p):.1f}" cy="{Y(c[p][0]):.1f}" r="2.5" fill="{colour}"/>')
            k, _ = knee(c, fraction)
            o.append(f'<circle cx="{X(k):.1f}" cy="{Y(c[k][0]):.1f}" r="6" fill="none" stroke="{colour}" '
                     'stroke-width="1.5"/>')
    o.append(f'<text transform="translate(16,{mt + ph / 2}) rotate(-90)" text-anchor="middle">images/s</text>')
    lx = ml + len(models) * (pw + gap) - gap + 14
    for j, b in enumerate(batches):
        colour = COLOURS[j % len(COLOURS)]
        o.append(f'<line x1="{lx}" y1="{mt + 8 + 16 * j}" x2="{lx + 20}" y2="{mt + 8 + 16 * j}" '
                 f'stroke="{colour}" stroke-width="3"/><text x="{lx + 24}" y="{mt + 12 + 16 * j}">batch {b}</text>')
    o.append("</svg>")
    return "\n".join(o) + "\n"


def plot(points, pcts, models, path, fraction=0.9, note=""):
    Path(path).write_text(svg(points, pcts, models, fraction, note))
    print(f"knee: plot in {path}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
