#!/usr/bin/env python3
"""The dashboard's main series, plotted from a running Prometheus's HTTP API
into one SVG: answers per second by status, OK latency p50/p99 (from the
histogram), and batch size (the mean, and the bucket bound that 90% of
batches stay within, from the batch-size histogram).

    .venv/bin/python bench/plot_prometheus.py --url http://127.0.0.1:9090 \\
        --out docs/metrics-example.svg [--if-id 1] [--start T --end T] \\
        [--window 5s] [--step 1] [--title "what run this is"]

Without --start/--end the range is that of the raw samples of
kneepoint_if_arrivals_total in the last --lookback (default 24h), so a
Prometheus serving a kept test run (tests/prometheus.rs with
KP_PROMETHEUS_KEEP) needs no times given. Every point is what
/api/v1/query_range answered for the PromQL printed under each panel; a
point Prometheus leaves out (no data, or NaN: a quantile of no answers) is a
gap in the line, never a zero.

No dependency beyond the standard library: the SVG is written by hand (line
charts on a shared time axis), so it runs where matplotlib is not installed.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from xml.sax.saxutils import escape

# Panel geometry, px.
WIDTH = 900
PANEL_H = 200
LEFT, RIGHT, TOP, GAP = 70, 170, 50, 80
COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2"]


class PrometheusError(Exception):
    """Prometheus could not be reached or refused a query."""


def get(url: str, path: str, params: dict) -> dict:
    """GET `path` with `params`; the `data` of a successful answer."""
    full = f"{url.rstrip('/')}{path}?{urllib.parse.urlencode(params)}"
    try:
        with urllib.request.urlopen(full, timeout=30) as r:
            body = json.load(r)
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise PrometheusError(f"{full}: {e}") from e
    if body.get("status") != "success":
        raise PrometheusError(f"{full}: {body}")
    return body["data"]


def sample_range(url: str, selector: str, lookback: str) -> tuple[float, float]:
    """First and last raw sample time of `selector` within `lookback`."""
    data = get(url, "/api/v1/query", {"query": f"{selector}[{lookback}]"})
    times = [float(t) for s in data["result"] for t, _ in s["values"]]
    if not times:
        raise PrometheusError(f"no samples of {selector} in the last {lookback}")
    return min(times), max(times)


@dataclass
class Series:
    label: str
    points: list[tuple[float, float]]  # (unix time, value); NaN is a gap


def bucket_quantile(url: str, promql: str, q: float, start: float, end: float,
                    step: float, label: str) -> list[Series]:
    """The smallest bucket bound `le` that holds at least `q` of the
    observations, at each point of `promql` (a `sum by (le)` of bucket
    rates). Unlike `histogram_quantile` it does not interpolate within a
    bucket: with every batch of size 1, `histogram_quantile(0.9)` says 0.9
    (it spreads the first bucket over 0 to 1); this says 1."""
    buckets = query_range(url, promql, start, end, step, lambda m: m.get("le", ""))
    by_time: dict[float, list[tuple[float, float]]] = {}
    for s in buckets:
        le = float(s.label)
        for t, v in s.points:
            by_time.setdefault(t, []).append((le, v))
    points = []
    for t in sorted(by_time):
        cum = sorted(by_time[t])
        total = cum[-1][1] if cum and math.isinf(cum[-1][0]) else math.nan
        if not total > 0:
            points.append((t, math.nan))
            continue
        points.append((t, next(le for le, n in cum if n >= q * total)))
    return [Series(label, points)] if points else []


def query_range(url: str, promql: str, start: float, end: float, step: float,
                label_of) -> list[Series]:
    data = get(url, "/api/v1/query_range",
               {"query": promql, "start": start, "end": end, "step": step})
    out = []
    for s in data["result"]:
        pts = [(float(t), float(v)) for t, v in s["values"]]
        out.append(Series(label_of(s["metric"]), pts))
    return sorted(out, key=lambda s: s.label)


@dataclass
class Panel:
    title: str
    unit: str
    promql: list[str]
    series: list[Series]


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About `n` round tick values, the last at or above `hi`."""
    if hi <= lo:
        hi = lo + 1.0
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    ticks = [round(math.floor(lo / step) * step, 10)]
    while ticks[-1] < hi - step * 1e-9:
        ticks.append(round(ticks[-1] + step, 10))
    return ticks


def fmt(v: float) -> str:
    return f"{v:g}" if abs(v) >= 0.01 or v == 0 else f"{v:.2g}"


def render(panels: list[Panel], start: float, end: float, title: str,
           caption: list[str]) -> str:
    plot_w = WIDTH - LEFT - RIGHT
    height = TOP + len(panels) * (PANEL_H + GAP) + 14 * len(caption) + 10
    o = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
         f'viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="11">',
         f'<rect width="{WIDTH}" height="{height}" fill="white"/>',
         f'<text x="{LEFT}" y="22" font-size="15" font-weight="bold">{escape(title)}</text>']
    span = max(end - start, 1.0)
    x_of = lambda t: LEFT + (t - start) / span * plot_w  # noqa: E731
    xticks = nice_ticks(0, span, 8)
    for i, p in enumerate(panels):
        y0 = TOP + i * (PANEL_H + GAP)
        vals = [v for s in p.series for _, v in s.points if math.isfinite(v)]
        hi = max(vals) if vals else 1.0
        yt = nice_ticks(0.0, hi * 1.05 if hi > 0 else 1.0, 4)
        ymax = yt[-1]
        y_of = lambda v: y0 + PANEL_H - v / ymax * PANEL_H  # noqa: E731
        o.append(f'<text x="{LEFT}" y="{y0 - 8}" font-size="13" font-weight="bold">'
                 f'{escape(p.title)} ({escape(p.unit)})</text>')
        o.append(f'<rect x="{LEFT}" y="{y0}" width="{plot_w}" height="{PANEL_H}" '
                 'fill="none" stroke="#888"/>')
        for v in yt:
            y = y_of(v)
            o.append(f'<line x1="{LEFT}" x2="{LEFT + plot_w}" y1="{y:.1f}" y2="{y:.1f}" '
                     'stroke="#ddd"/>')
            o.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{fmt(v)}</text>')
        for t in xticks:
            x = x_of(start + t)
            if x > LEFT + plot_w + 0.5:
                continue
            o.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{y0}" y2="{y0 + PANEL_H}" '
                     'stroke="#eee"/>')
            o.append(f'<text x="{x:.1f}" y="{y0 + PANEL_H + 14}" text-anchor="middle">'
                     f'{fmt(t)}</text>')
        o.append(f'<text x="{LEFT + plot_w / 2}" y="{y0 + PANEL_H + 28}" '
                 'text-anchor="middle" fill="#555">seconds from the first sample</text>')
        for j, s in enumerate(p.series):
            color = COLORS[j % len(COLORS)]
            runs, cur = [], []
            for t, v in s.points:
                if math.isfinite(v):
                    cur.append(f"{x_of(t):.1f},{y_of(v):.1f}")
                elif cur:
                    runs.append(cur)
                    cur = []
            if cur:
                runs.append(cur)
            for run in runs:
                if len(run) == 1:
                    x, y = run[0].split(",")
                    o.append(f'<circle cx="{x}" cy="{y}" r="2" fill="{color}"/>')
                else:
                    o.append(f'<polyline points="{" ".join(run)}" fill="none" '
                             f'stroke="{color}" stroke-width="1.6"/>')
            ly = y0 + 12 + j * 16
            lx = LEFT + plot_w + 12
            o.append(f'<line x1="{lx}" x2="{lx + 18}" y1="{ly - 4}" y2="{ly - 4}" '
                     f'stroke="{color}" stroke-width="2"/>')
            o.append(f'<text x="{lx + 24}" y="{ly}">{escape(s.label)}</text>')
        if not p.series:
            o.append(f'<text x="{LEFT + plot_w / 2}" y="{y0 + PANEL_H / 2}" '
                     'text-anchor="middle" fill="#888">no data</text>')
        for k, q in enumerate(p.promql):
            o.append(f'<text x="{LEFT}" y="{y0 + PANEL_H + 42 + k * 12}" fill="#777" '
                     f'font-family="monospace" font-size="9">{escape(q)}</text>')
    cy = TOP + len(panels) * (PANEL_H + GAP) + 4
    for k, line in enumerate(caption):
        o.append(f'<text x="{LEFT}" y="{cy + k * 14}" fill="#333">{escape(line)}</text>')
    o.append("</svg>")
    return "\n".join(o) + "\n"


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:9090", help="Prometheus's address")
    ap.add_argument("--out", required=True, help="the SVG to write")
    ap.add_argument("--if-id", help="only this IF (default: all, summed)")
    ap.add_argument("--start", type=float, help="unix time (default: the first sample)")
    ap.add_argument("--end", type=float, help="unix time (default: the last sample)")
    ap.add_argument("--lookback", default="24h", help="where to look for samples")
    ap.add_argument("--window", default="5s", help="rate() window")
    ap.add_argument("--step", type=float, default=1.0, help="seconds between points")
    ap.add_argument("--title", default="kneepoint, from Prometheus")
    ap.add_argument("--caption", action="append", default=[],
                    help="a line under the plot (repeatable): say what run it is")
    a = ap.parse_args(argv)

    sel = f'if_id="{a.if_id}"' if a.if_id else ""
    try:
        if a.start is None or a.end is None:
            first, last = sample_range(a.url, f"kneepoint_if_arrivals_total{{{sel}}}",
                                       a.lookback)
            start = a.start if a.start is not None else first
            end = a.end if a.end is not None else last
        else:
            start, end = a.start, a.end
        w = a.window
        rate = lambda m, by="": f"sum{by}(rate({m}{{{sel}}}[{w}]))"  # noqa: E731
        qs = {
            "requests": rate("kneepoint_if_requests_total", " by (status)"),
            "p50": f"1000 * histogram_quantile(0.5, "
                   f"{rate('kneepoint_if_request_latency_seconds_bucket', ' by (le)')})",
            "p99": f"1000 * histogram_quantile(0.99, "
                   f"{rate('kneepoint_if_request_latency_seconds_bucket', ' by (le)')})",
            "mean_batch": f"{rate('kneepoint_if_batched_requests_total')} / "
                          f"{rate('kneepoint_if_batches_total')}",
            "batch_buckets": rate("kneepoint_if_batch_size_bucket", " by (le)"),
        }
        run = lambda q, label: query_range(a.url, q, start, end, a.step, label)  # noqa: E731
        by_status = run(qs["requests"], lambda m: m.get("status", "?"))
        # Statuses that never moved are noise in the legend.
        by_status = [s for s in by_status
                     if any(math.isfinite(v) and v > 0 for _, v in s.points)]
        panels = [
            Panel("Answers per second by status", "1/s", [qs["requests"]], by_status),
            Panel("Latency of OK answers", "ms", [qs["p50"], qs["p99"]],
                  run(qs["p50"], lambda m: "p50") + run(qs["p99"], lambda m: "p99")),
            Panel("Batch size", "requests",
                  [qs["mean_batch"], qs["batch_buckets"] + "  (90% of batches at most: its smallest le)"],
                  run(qs["mean_batch"], lambda m: "mean")
                  + bucket_quantile(a.url, qs["batch_buckets"], 0.9, start, end, a.step,
                                    "90% at most")),
        ]
    except PrometheusError as e:
        print(f"plot_prometheus: {e}", file=sys.stderr)
        return 1
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(start))
    caption = a.caption + [
        f"{a.url}, {when} + {end - start:.0f} s, step {a.step:g} s, rate window {w}"
        + (f", if_id {a.if_id}" if a.if_id else ", all IFs")
    ]
    svg = render(panels, start, end, a.title, caption)
    with open(a.out, "w", encoding="utf-8") as f:
        f.write(svg)
    print(f"plot_prometheus: wrote {a.out} ({len(panels)} panels, "
          f"{end - start:.0f} s of data)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
