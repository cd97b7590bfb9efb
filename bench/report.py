"""Aggregation, markdown and SVG plots of bench/bench.py's measurements.

Standard library only, so that the smoke test in `make test` exercises it
with nothing installed. Terms:

- a *window* is one run of the load generator at one offered rate
  (kp-client or kp-http-load, a few seconds);
- a *level* is one offered rate, measured in windows until the last three
  agree (Triton perf_analyzer's convention: OK throughput and p99 latency of
  each of the three within +-10% of their mean) or --max-windows ran; its
  OK rate is the mean over those last three windows, its latency
  percentiles are over all their requests together (`pooled_percentiles`,
  from each window's OK round trips as the load generators count them):
  not the mean of the windows' percentiles, in which one window with more
  than 1% failed makes the level's p99 infinite while another's late
  answers average out;
- latency percentiles count every request sent, a failed one (any answer
  other than OK — kneepoint's OVERLOADED sheds, HTTP errors — or no answer
  within the timeout) as later than any OK answer: both load generators
  report them so (`rtt_failed_as_late_us`), for every system alike, so a
  system that refuses or drops requests cannot look faster for it. A
  percentile that falls among the failures is infinite (∞ in the tables);
- a level *meets the SLO* when its p99 latency is at most the model's SLO
  (so at most 1% of its requests failed) and at most 1% of its requests
  failed. Both
  load generators measure latency from each request's scheduled time, so a
  system (or generator) that falls behind the offered rate shows it in p99;
  the OK rate is not compared with the offered rate, which Poisson arrivals
  in a few-second window miss by several percent by chance;
- a system's *capacity* (max throughput with p99 <= SLO) is the highest OK
  rate among its levels that meet the SLO (bench.py's scouts, one short
  window each, only guide its search and are not among them);
- its *peak* is the highest OK rate of any level, SLO or not (the harness
  ends with a level offered more than the engine limit): what it completes
  when saturated.
"""

from __future__ import annotations

import html
import json
import math
from pathlib import Path

import docsection
import provenance
import schedule_bound
import stats


STABILITY = 0.10
# A level's figures are over its last this many windows (fewer where a
# level ran fewer), and it is stable when these agree.
LAST_WINDOWS = 3
MAX_ERROR = 0.01

# One colour per system, in the order they are usually listed.
COLOURS = {"kneepoint": "#1b7837", "kneepoint-ic": "#7fbf7b", "triton": "#2166ac", "ray": "#b2182b",
           "stub": "#7f7f7f"}
NAMES = {"kneepoint": "kneepoint", "kneepoint-ic": "kneepoint, all on the inference core", "triton": "Triton",
         "ray": "Ray Serve", "stub": "stub (smoke)"}
# kneepoint's two ways of running, and what each comparison with a peer is.
KNEEPOINTS = {"kneepoint": "as designed (images converted on the network-side core)",
              "kneepoint-ic": "all per-request work on the inference core, as the peers do"}
DASH = {"p50": "6,4", "p90": "2,3", "p99": ""}


def stable(windows: list[dict], stability: float = STABILITY) -> bool:
    """The last LAST_WINDOWS windows' OK rate and p99 within +-stability of their mean."""
    if len(windows) < LAST_WINDOWS:
        return False
    last = windows[-LAST_WINDOWS:]
    for key in ("ok_per_s", "p99_ms"):
        vals = [float(w[key]) for w in last]
        if not all(math.isfinite(v) for v in vals):
            # A percentile among the failures: stable only if it stays there.
            if any(math.isfinite(v) for v in vals):
                return False
            continue
        mean = sum(vals) / 3
        if mean <= 0 or any(abs(v - mean) > stability * mean for v in vals):
            return False
    return True


def pooled_percentiles(windows: list[dict], quantiles=(0.50, 0.90, 0.99)) -> list[float] | None:
    """Round-trip percentiles (ms) over every request of `windows`
    together, a failed one (sent, not answered OK) as later than any OK
    answer: infinite where the percentile falls among the failures
    (`stats.percentile`, nearest rank, as the load generators' own
    `rtt_failed_as_late_us`). From each window's `ok_rtt_us_counts`
    ([value, count] pairs, JSON); None when a window has none (runs before
    they were recorded)."""
    values: list[float] = []
    sent = 0
    for w in windows:
        raw = w.get("ok_rtt_us_counts")
        if raw is None or raw == "":
            return None
        for v, n in (json.loads(raw) if isinstance(raw, str) else raw):
            values += [int(v) / 1000] * int(n)
        sent += int(w["sent"])
    values += [math.inf] * max(0, sent - len(values))
    if not values:
        return [math.inf] * len(quantiles)
    return [stats.percentile(values, q) for q in quantiles]


def aggregate(windows: list[dict], slo_ms: float, stability: float = STABILITY,
              max_error: float = MAX_ERROR) -> dict:
    """One level from its windows (see the module's docstring)."""
    last = windows[-LAST_WINDOWS:]
    n = len(last)
    sent = sum(int(w["sent"]) for w in last)
    ok = sum(int(w["ok"]) for w in last)
    failed = sum(int(w["errors"]) + int(w["unanswered"]) for w in last)
    mean = lambda k: sum(float(w[k]) for w in last) / n  # noqa: E731
    cpu = lambda k: sum(float(w[k]) for w in last)  # noqa: E731
    offered = float(windows[0]["offered_rps"])
    pooled = pooled_percentiles(last)
    p50, p90, p99 = pooled if pooled else (mean("p50_ms"), mean("p90_ms"), mean("p99_ms"))
    lvl = {
        "offered_rps": offered,
        "windows": len(windows),
        "stable": stable(windows, stability),
        "sent": sent,
        "ok": ok,
        "failed": failed,
        "error_frac": failed / sent if sent else 1.0,
        "ok_per_s": mean("ok_per_s"),
        "p50_ms": p50,
        "p90_ms": p90,
        "p99_ms": p99,
        "pooled": pooled is not None,
        "server_cpu_ms_per_req": 1000 * cpu("server_cpu_s") / ok if ok else float("nan"),
        "worker_cpu_ms_per_req": 1000 * cpu("worker_cpu_s") / ok if ok else float("nan"),
        "client_cpu_ms_per_req": 1000 * cpu("client_cpu_s") / ok if ok else float("nan"),
    }
    lvl["meets_slo"] = bool(ok and lvl["p99_ms"] <= slo_ms and lvl["error_frac"] <= max_error)
    return lvl


def peak(levels: list[dict]) -> dict | None:
    """The level with the highest OK rate, SLO or not (saturated goodput)."""
    return max(levels, key=lambda lv: lv["ok_per_s"]) if levels else None


def capacity(levels: list[dict]) -> dict | None:
    """The level with the highest OK rate among those meeting the SLO."""
    good = [lv for lv in levels if lv["meets_slo"]]
    return max(good, key=lambda lv: lv["ok_per_s"]) if good else None


# --- the drift guard ---------------------------------------------------------
#
# The systems of a run are measured one after another, each for 5-15
# minutes, on a shared machine whose speed drifts: on the 2-CPU Xeon VM the
# engine's batch-1 median went from 9.05 to 7.7 ms between two runs an hour
# apart, and within one run a system measured in a fast spell gains what one
# measured in a slow spell loses. So bench.py times the engine alone (batch
# 1, on the worker core, every system stopped) before the first system and
# after each ("engine_checks" of a model: {"after": "start" or the system,
# "median_ms", "images_per_s"}), and a capacity can be read against the
# engine's speed around its own search. Capacities are engine-bound at the
# SLO, so capacity / that speed is what each system makes of the engine it
# had; the ratio of two of them is the comparison with the drift taken out.


def engine_around(m: dict) -> dict[str, float]:
    """Each system's engine speed around its own search (images/s at batch
    1): the mean of the drift guard's checks just before and just after it.
    Empty for a run without checks (runs before the guard)."""
    checks = m.get("engine_checks") or []
    return {checks[i]["after"]: (checks[i - 1]["images_per_s"] + checks[i]["images_per_s"]) / 2
            for i in range(1, len(checks))}


def engine_drift(m: dict) -> float | None:
    """How far the engine's speed moved within the run: the fastest check's
    images/s over the slowest's, less one; None with fewer than two."""
    v = [c["images_per_s"] for c in m.get("engine_checks") or []]
    return max(v) / min(v) - 1 if len(v) >= 2 and min(v) > 0 else None


def guard_markdown(m: dict) -> str:
    """The drift guard's line of a run's model section ("" without checks)."""
    checks = m.get("engine_checks") or []
    drift = engine_drift(m)
    if drift is None:
        return ""
    when = lambda c: "at the start" if c["after"] == "start" else f"after {NAMES.get(c['after'], c['after'])}"  # noqa: E731
    return ("Drift guard (the engine alone at batch 1 on the same core, every system stopped, before the first "
            "system and after each): " + ", ".join(f"{c['median_ms']:.2f} ms {when(c)}" for c in checks)
            + f": its speed moved by {100 * drift:.1f}% within the run. The ratios \"at each one's engine speed\" "
            "divide each capacity by the engine's images/s around its own search (the mean of the checks before "
            "and after it).")


# --- markdown ---------------------------------------------------------------

def _f(v, nd=1):
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, float) and math.isinf(v):
        return "∞"
    return f"{v:.{nd}f}"


def _lowest(system: dict) -> str:
    """', down to N req/s offered' for a system no level of which met the
    SLO: the lowest rate its search tried, the upper end of its bracket
    (bench.py searches no lower than its lowest scout)."""
    hi = (system.get("bracket") or [None, None])[1]
    return f", down to {hi:.2f} req/s offered" if hi else ""


def unresolved(system: dict) -> float | None:
    """How wide (a fraction of its lower end) the bracket of a system whose
    capacity search its time budget cut is, where that is wider than the
    search's resolution; None where the search was not cut or resolved its
    bracket anyway. Infinite where one end is missing."""
    if not system.get("search_cut"):
        return None
    lo, hi = system.get("bracket") or (None, None)
    if not lo or not hi:
        return math.inf
    width = hi / lo - 1
    return width if width > system.get("resolution", 0.02) * (1 + 1e-9) else None


def _cut(system: dict) -> str:
    w = unresolved(system)
    if w is None:
        return ""
    return (" (**not resolved**: the search's time budget ran out with the bracket "
            + (f"{100 * w:.1f}% wide)" if math.isfinite(w) else "open at one end)"))


def model_markdown(m: dict) -> str:
    """The section of one model: engine limit, the systems side by side."""
    eng = m["engine"]
    best = max(eng, key=lambda r: r["images_per_s"]) if eng else None
    rule = f": {m['slo_rule']}" if m.get("slo_rule") else ""
    L = [f"#### {m['model']} (SLO {m['slo_ms']:g} ms{rule})", ""]
    if best:
        L.append("Engine limit (ONNX Runtime alone, same thread and core): " + ", ".join(
            f"batch {r['batch']}: {r['median_ms']:.2f} ms/batch, {r['images_per_s']:.1f} img/s" for r in eng)
            + f". **Best: {best['images_per_s']:.1f} images/s at batch {best['batch']}.**")
        L.append("")
    guard = guard_markdown(m)
    if guard:
        L += [guard, ""]
    speed = engine_around(m)
    pts = m["points"]
    L.append("| system | capacity: max OK req/s with p99 ≤ SLO | % of engine limit | "
             + "".join(f"p50 / p90 / p99 ms at {int(round(100 * p))}% | " for p in pts)
             + "CPU ms per request: all server processes (inference process) "
             + "| peak: max OK req/s, saturated (% of engine limit) |")
    L.append("|---|---|---|" + "---|" * len(pts) + "---|---|")
    for s in m["systems"]:
        if s.get("error"):
            L.append(f"| {NAMES.get(s['system'], s['system'])} | not measured: {s['error']} |"
                     + " |" * (len(pts) + 3))
            continue
        cap = s["capacity"]
        cells = []
        for p in pts:
            lv = s["points"].get(f"{p:g}")
            if lv is None:
                cells.append("-")
            else:
                flag = "" if lv["meets_slo"] else " ✗"
                cells.append(f"{_f(lv['p50_ms'])} / {_f(lv['p90_ms'])} / {_f(lv['p99_ms'])}{flag}")
        ref = s.get("cpu_level") or {}
        cpu = f"{_f(ref.get('server_cpu_ms_per_req'), 2)} ({_f(ref.get('worker_cpu_ms_per_req'), 2)})"
        capcell = f"**{_f(cap['ok_per_s'])}**" if cap else f"none (no level met the SLO{_lowest(s)})"
        pct = f"{100 * cap['ok_per_s'] / best['images_per_s']:.0f}%" if cap and best else "-"
        pk = s.get("peak")
        pkcell = (f"{_f(pk['ok_per_s'])} ({100 * pk['ok_per_s'] / best['images_per_s']:.0f}%)"
                  if pk and best else "-")
        L.append(f"| {NAMES.get(s['system'], s['system'])} | {capcell} | {pct} | " + "".join(c + " | " for c in cells)
                 + f"{cpu} | {pkcell} |")
    L.append("")
    brackets = [f"{NAMES.get(s['system'], s['system'])} {_f(s['bracket'][0], 2)} / {_f(s['bracket'][1], 2)}"
                + _cut(s) for s in m["systems"] if s.get("bracket")]
    if brackets:
        L += ["Capacity bracket (offered req/s: the highest level that met the SLO / the lowest above it that "
              "missed; the capacity is the highest OK rate among the levels that met it): "
              + "; ".join(brackets) + ".", ""]
    caps = {s["system"]: (s["capacity"] or {}).get("ok_per_s") for s in m["systems"] if not s.get("error")}
    peaks = {s["system"]: (s.get("peak") or {}).get("ok_per_s") for s in m["systems"] if not s.get("error")}
    for me, how in KNEEPOINTS.items():
        kp = caps.get(me)
        ratios = []
        if kp:
            for peer in ("triton", "ray"):
                if caps.get(peer):
                    at_speed = (f" (at each one's engine speed: {kp / speed[me] / (caps[peer] / speed[peer]):.2f}×)"
                                if speed.get(me) and speed.get(peer) else "")
                    ratios.append(f"{me} / {NAMES[peer]} = **{kp / caps[peer]:.2f}×**{at_speed}")
                elif peer in caps:
                    low = _lowest(next(x for x in m["systems"] if x["system"] == peer))
                    ratios.append(f"{NAMES[peer]} met the SLO at no level measured{low}")
            if best:
                ratios.append(f"{me} / engine limit = **{kp / best['images_per_s']:.2f}**")
        if peaks.get(me) and best:
            ratios.append(f"saturated, {me} / engine limit = **{peaks[me] / best['images_per_s']:.2f}**")
        if ratios:
            L += [f"Capacity ratios, kneepoint {how}: " + "; ".join(ratios) + ".", ""]
    hs = hindsight_markdown(m)
    if hs:
        L += [hs, ""]
    if m.get("plot"):
        L += [f"![{m['model']}: latency percentiles vs offered load]({m['plot']})", ""]
    return "\n".join(L)


# --- in hindsight --------------------------------------------------------------
#
# For kneepoint, bench.py keeps kp-if's request trace and its load
# generator's per-request records, and hindsight.py puts beside each level
# what a clairvoyant first-come-first-served server would have failed on the
# same requests and kp-if's own engine times (levels' "hindsight"): whether
# a level was lost to kneepoint's policy or to the engine's speed then.


def hindsight_levels(s: dict) -> tuple[dict | None, dict | None]:
    """A system's capacity level and the level at the upper end of its
    bracket, the lowest rate above the capacity that missed the SLO
    (either None)."""
    hi = (s.get("bracket") or [None, None])[1]
    miss = next((lv for lv in s.get("levels", []) if hi is not None and lv["offered_rps"] == hi
                 and not lv["meets_slo"]), None)
    return s.get("capacity"), miss


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.2f}%"


def hindsight_windows(lv: dict, h: dict) -> str:
    """What the hindsight of level LV covers, where it is not what the
    level was judged on: hindsight.py reads every window of a level, the
    level (aggregate) its last LAST_WINDOWS, so a level that ran a fourth
    window because its first three disagreed has a hindsight over more
    requests than its table row ("" where both cover the same)."""
    if h.get("requests") is None or int(lv.get("windows", 0)) <= LAST_WINDOWS:
        return ""
    return (f", over all {int(lv['windows'])} of the level's windows ({int(h['requests']):,} requests; "
            f"the level is judged on its last {LAST_WINDOWS}, {int(lv['sent']):,} requests, "
            f"{_pct(lv['error_frac'])} of them failed)")


def hindsight_markdown(m: dict) -> str:
    """The run's "in hindsight" paragraph ("" when no kneepoint level has
    hindsight)."""
    parts = []
    for s in m["systems"]:
        if s["system"] not in KNEEPOINTS or s.get("error"):
            continue
        said, engine = [], []
        for what, lv in zip(("at its capacity", "at the lowest rate above it that missed"), hindsight_levels(s)):
            h = (lv or {}).get("hindsight")
            if not h:
                continue
            said.append(f"{what} ({_f(lv['offered_rps'], 1)} req/s offered) it failed {_pct(h['missed_frac'])} "
                        f"(refused {_pct(h['refused_frac'])}), the clairvoyant server {_pct(h['hindsight_missed_frac'])}"
                        + hindsight_windows(lv, h))
            if h.get("engine_ms_p50") is not None:
                lo, hi = h.get("engine_ms_span_lo"), h.get("engine_ms_span_hi")
                spans = ("" if lo is None
                         else f", its 5-s spans {_f(lo, 1)}–{_f(hi, 1)} ms" if _f(lo, 1) != _f(hi, 1)
                         else f", its 5-s spans all {_f(lo, 1)} ms")
                engine.append(f"{_f(h['engine_ms_p50'], 2)} ms median{spans}")
        if said:
            parts.append(f"{NAMES[s['system']]}: " + "; ".join(said)
                         + (f" (kp-if's engine time per image at those levels: {' and '.join(engine)})" if engine else ""))
    if not parts:
        return ""
    return ("In hindsight (bench/hindsight.py, from kp-if's request trace and its load generator's records: "
            "a clairvoyant first-come-first-served server on the same requests, each taking the engine time "
            "kp-if measured at that moment, admitting exactly what it answers within the SLO — a yardstick "
            "from the run's own data, not another server measured; failed: refused or answered past the SLO): "
            + "; ".join(parts) + ".")


# --- SVG --------------------------------------------------------------------

def _nice_step(span: float, n: int = 6) -> float:
    raw = span / max(1, n)
    mag = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1
    for m in (1, 2, 2.5, 5, 10):
        if m * mag >= raw:
            return m * mag
    return 10 * mag


def svg_plot(model: str, slo_ms: float, engine_limit: float | None, series: dict[str, list[dict]],
             title_note: str = "") -> str:
    """Latency percentiles (log y) vs offered load, one colour per system.

    series: system -> levels (dicts with offered_rps, p50_ms, p90_ms, p99_ms,
    meets_slo). p50 dashed, p90 dotted, p99 solid with markers (hollow where
    the level misses the SLO). The SLO is a red line, the engine limit a grey
    vertical line.
    """
    W, H = 860, 470
    ml, mr, mt, mb = 70, 230, 46, 56
    pw, ph = W - ml - mr, H - mt - mb
    pts = [lv for lvs in series.values() for lv in lvs]
    xmax = max([lv["offered_rps"] for lv in pts] + [engine_limit or 0, 1.0]) * 1.08
    lat = [lv[k] for lv in pts for k in ("p50_ms", "p90_ms", "p99_ms")
           if lv.get(k) and lv[k] > 0 and math.isfinite(lv[k])]
    ylo = 10 ** math.floor(math.log10(min(lat + [slo_ms]) * 0.8))
    yhi = 10 ** math.ceil(math.log10(max(lat + [slo_ms]) * 1.25))
    X = lambda v: ml + pw * v / xmax  # noqa: E731
    Y = lambda v: mt + ph * (1 - (math.log10(max(v, ylo)) - math.log10(ylo))  # noqa: E731
                             / (math.log10(yhi) - math.log10(ylo)))
    o = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" '
         'font-family="DejaVu Sans, Arial, sans-serif" font-size="12">',
         f'<rect width="{W}" height="{H}" fill="white"/>',
         f'<text x="{ml}" y="22" font-size="15" font-weight="bold">{html.escape(model)}: latency vs offered load'
         f'</text><text x="{ml}" y="38" fill="#555">{html.escape(title_note)}</text>']
    # Grid and ticks.
    step = _nice_step(xmax)
    v = 0.0
    while v <= xmax + 1e-9:
        o.append(f'<line x1="{X(v):.1f}" y1="{mt}" x2="{X(v):.1f}" y2="{mt + ph}" stroke="#eee"/>'
                 f'<text x="{X(v):.1f}" y="{mt + ph + 16}" text-anchor="middle">{v:g}</text>')
        v += step
    d = ylo
    while d <= yhi * 1.0001:
        for m in (1, 2, 5):
            y = d * m
            if ylo <= y <= yhi:
                o.append(f'<line x1="{ml}" y1="{Y(y):.1f}" x2="{ml + pw}" y2="{Y(y):.1f}" '
                         f'stroke="{"#ddd" if m == 1 else "#f3f3f3"}"/>'
                         f'<text x="{ml - 6}" y="{Y(y) + 4:.1f}" text-anchor="end">{y:g}</text>')
        d *= 10
    o.append(f'<rect x="{ml}" y="{mt}" width="{pw}" height="{ph}" fill="none" stroke="#444"/>')
    o.append(f'<text x="{ml + pw / 2}" y="{H - 14}" text-anchor="middle">offered load, requests/s (open loop, Poisson)</text>')
    o.append(f'<text transform="translate(18,{mt + ph / 2}) rotate(-90)" text-anchor="middle">'
             'latency, ms (log scale)</text>')
    # SLO and engine limit.
    o.append(f'<line x1="{ml}" y1="{Y(slo_ms):.1f}" x2="{ml + pw}" y2="{Y(slo_ms):.1f}" stroke="#000" '
             f'stroke-width="1" stroke-dasharray="8,4"/><text x="{ml + pw - 4}" y="{Y(slo_ms) - 5:.1f}" '
             f'text-anchor="end">SLO {slo_ms:g} ms</text>')
    if engine_limit:
        o.append(f'<line x1="{X(engine_limit):.1f}" y1="{mt}" x2="{X(engine_limit):.1f}" y2="{mt + ph}" '
                 f'stroke="#888" stroke-width="1.5" stroke-dasharray="3,3"/>'
                 f'<text x="{X(engine_limit) - 4:.1f}" y="{mt + 14}" text-anchor="end" fill="#666">'
                 f'engine limit {engine_limit:.0f}/s</text>')
    # Series.
    for system, lvs in series.items():
        c = COLOURS.get(system, "#000")
        lvs = sorted(lvs, key=lambda lv: lv["offered_rps"])
        for k in ("p50", "p90", "p99"):
            xy = [(X(lv["offered_rps"]), Y(lv[k + "_ms"])) for lv in lvs
                  if lv.get(k + "_ms") and math.isfinite(lv[k + "_ms"])]
            if len(xy) > 1:
                dash = f' stroke-dasharray="{DASH[k]}"' if DASH[k] else ""
                o.append(f'<polyline fill="none" stroke="{c}" stroke-width="{2 if k == "p99" else 1.3}"{dash} '
                         'points="' + " ".join(f"{x:.1f},{y:.1f}" for x, y in xy) + '"/>')
        for lv in lvs:
            if lv.get("p99_ms") and math.isfinite(lv["p99_ms"]):
                fill = c if lv["meets_slo"] else "white"
                o.append(f'<circle cx="{X(lv["offered_rps"]):.1f}" cy="{Y(lv["p99_ms"]):.1f}" r="3.5" '
                         f'fill="{fill}" stroke="{c}" stroke-width="1.5"/>')
    # Legend.
    lx, ly = ml + pw + 16, mt + 8
    for i, system in enumerate(series):
        c = COLOURS.get(system, "#000")
        o.append(f'<line x1="{lx}" y1="{ly + 18 * i}" x2="{lx + 26}" y2="{ly + 18 * i}" stroke="{c}" '
                 f'stroke-width="3"/><text x="{lx + 32}" y="{ly + 18 * i + 4}">'
                 f'{html.escape(NAMES.get(system, system))}</text>')
    ly += 18 * len(series) + 12
    for i, k in enumerate(("p99", "p90", "p50")):
        dash = f' stroke-dasharray="{DASH[k]}"' if DASH[k] else ""
        o.append(f'<line x1="{lx}" y1="{ly + 18 * i}" x2="{lx + 26}" y2="{ly + 18 * i}" stroke="#333" '
                 f'stroke-width="1.5"{dash}/><text x="{lx + 32}" y="{ly + 18 * i + 4}">{k}</text>')
    ly += 18 * 3 + 8
    o.append(f'<circle cx="{lx + 13}" cy="{ly}" r="3.5" fill="#333"/><text x="{lx + 32}" y="{ly + 4}">'
             'p99, meets SLO</text>')
    o.append(f'<circle cx="{lx + 13}" cy="{ly + 18}" r="3.5" fill="white" stroke="#333" stroke-width="1.5"/>'
             f'<text x="{lx + 32}" y="{ly + 22}">misses SLO</text>')
    o.append('<text x="%d" y="%d" fill="#555">(p99 &gt; SLO or &gt;1%% failed)</text>' % (lx + 32, ly + 38))
    o.append("</svg>")
    return "\n".join(o) + "\n"


# --- repeats: medians, spreads, and what they allow to be said ----------------

# Runs a comparison needs before it is called a win or a loss (issue 13).
REPEATS_NEEDED = 3

# The issue's capacity targets: kneepoint (as designed) against each peer.
TARGETS = {"squeezenet": 1.5, "resnet50": 1.2}


def spread(values: list[float]) -> dict | None:
    """Median (the middle value; the mean of the two middle ones for an
    even count), smallest and largest of values; None when empty."""
    v = sorted(values)
    if not v:
        return None
    mid = len(v) // 2
    med = v[mid] if len(v) % 2 else (v[mid - 1] + v[mid]) / 2
    return {"median": med, "min": v[0], "max": v[-1], "n": len(v)}


def spread_text(x: dict | None, nd: int = 1, unit: str = "") -> str:
    """A spread (see `spread`) as "median [smallest–largest]", nd decimals,
    unit after the median; "-" for none."""
    if not x:
        return "-"
    return f"{x['median']:.{nd}f}{unit} [{x['min']:.{nd}f}–{x['max']:.{nd}f}]"


def _capacity_or_bound(system: dict | None) -> tuple[float | None, bool]:
    """A run's capacity of a system (OK req/s), or, where no level met the
    SLO, the lowest offered rate that missed it (its search went no lower,
    so the capacity is below it): (value, True) for such a bound, (None,
    False) when there is neither."""
    if not system:
        return None, False
    if system.get("capacity"):
        return system["capacity"]["ok_per_s"], False
    hi = (system.get("bracket") or [None, None])[1]
    return (hi, True) if hi else (None, False)


def _upper(system: dict | None) -> float | None:
    """What a run's capacity of a system is at most, as far as its search
    resolved it: the capacity (or the bound where no level met the SLO);
    where a time budget cut the search, the lowest rate above the capacity
    that missed, or nothing (None) when no level above it missed."""
    v, _ = _capacity_or_bound(system)
    w = unresolved(system) if system else None
    if w is None:
        return v
    return None if math.isinf(w) and system.get("capacity") else (system["bracket"][1] or v)


def repeats(runs: list[dict]) -> list[dict]:
    """Per model, over runs (each a bench run's summary.json: {"meta",
    "models"}): each system's capacity and peak (OK req/s), the engine
    limit, and for each kneepoint way and peer the per-run ratio of
    capacities; a comparison is a *win* (or a *loss*) only when the two
    systems' capacity spreads do not overlap. A peer that met the SLO at no
    level counts with the lowest rate it missed at as an upper bound of its
    capacity, and the ratios with it are lower bounds ("at_least"). Where a
    time budget cut a system's search short of the resolution ("cut": how
    many runs), its capacity in that run may be as high as the bracket's
    upper end, and the verdicts take that end: a win needs the lower
    system's upper ends below the other's capacities. The issue's targets
    are judged only over runs whose peers had a batch cap tuned for the
    SLO (bench.py's peer_max_batch, recorded per model): before it they ran
    at kneepoint's cap, which their batchers fill where batches gain
    nothing ("peer_caps": None for such a run)."""
    out = []
    names = list(dict.fromkeys(m["model"] for r in runs for m in r["models"]))
    for name in names:
        pairs = [(r, next((m for m in r["models"] if m["model"] == name), None)) for r in runs]
        pairs = [(r, m) for r, m in pairs if m]
        per = [m for _, m in pairs]
        systems = list(dict.fromkeys(s["system"] for m in per for s in m["systems"]))

        def find(m, system):
            return next((s for s in m["systems"] if s["system"] == system), None)

        def caps(system, key="capacity"):
            vals = []
            for m in per:
                s = find(m, system)
                if s and s.get(key):
                    vals.append(s[key]["ok_per_s"])
            return vals

        def bounds(system):
            return [v for v, bound in (_capacity_or_bound(find(m, system)) for m in per) if bound]

        peer_caps = [((r["meta"].get("model_info") or {}).get(name) or {}).get("peer_max_batch") for r, _ in pairs]
        # The drift guard's reading of each run: the engine's speed around
        # each system's search, and how far it moved.
        speeds, drifts = [engine_around(m) for m in per], [engine_drift(m) for m in per]
        engine = [max(r["images_per_s"] for r in m["engine"]) for m in per if m.get("engine")]
        row = {"model": name, "runs": len(per), "slo_ms": spread([m["slo_ms"] for m in per]),
               "engine_limit": spread(engine),
               "capacity": {s: spread(caps(s)) for s in systems},
               "below": {s: spread(bounds(s)) for s in systems},
               "cut": {s: [w for w in (unresolved(x) for x in (find(m, s) for m in per) if x) if w is not None]
                       for s in systems},
               "peak": {s: spread(caps(s, "peak")) for s in systems}, "comparisons": [],
               "peer_caps": peer_caps, "peers_tuned": all(c is not None for c in peer_caps),
               "drift": spread([d for d in drifts if d is not None]),
               "guarded_runs": sum(1 for d in drifts if d is not None)}
        # What the engine allows, per run (a simulation: schedule_bound.py).
        allowed = [schedule_bound.engine_bound(m.get("engine") or [], m.get("slo_ms")) for m in per]
        if allowed and all(allowed):
            kp = [(find(m, "kneepoint") or {}).get("capacity") for m in per]
            tr = [(find(m, "triton") or {}).get("capacity") for m in per]
            row["allowed"] = {
                "bound_per_s": spread([a["bound_per_s"] for a in allowed]),
                "bound_of_limit": spread([a["bound_of_limit"] for a in allowed]),
                "fifo_per_s": spread([a["fifo_per_s"] for a in allowed]),
                "bound_over_fifo": spread([a["bound_per_s"] / a["fifo_per_s"] for a in allowed]),
                "kneepoint_of_bound": spread([c["ok_per_s"] / a["bound_per_s"]
                                              for a, c in zip(allowed, kp) if c]),
                "triton_of_fifo": spread([c["ok_per_s"] / a["fifo_per_s"] for a, c in zip(allowed, tr) if c]),
                "batches": sorted({b for a in allowed for b in a["batches"]})}
        for me in KNEEPOINTS:
            if me not in systems:
                continue
            for peer in ("triton", "ray"):
                if peer not in systems:
                    continue
                def compare(scale):
                    """The ratios over runs and the verdict, each run's
                    capacities (and upper ends) of a system divided by
                    scale(i, system) for run i: 1 for the capacities as measured,
                    the engine's speed around the system's own search
                    for the drift guard's reading."""
                    ratios, at_least, mine, peers, my_upper, peer_upper = [], False, [], [], [], []
                    for i, m in enumerate(per):
                        over = lambda x, who: None if x is None else x / scale(i, who)  # noqa: E731
                        kp = over(((find(m, me) or {}).get("capacity") or {}).get("ok_per_s"), me)
                        v, bound = _capacity_or_bound(find(m, peer))
                        v = over(v, peer)
                        if kp:
                            mine.append(kp)
                        if v is not None:
                            peers.append(v)
                        peer_upper.append(over(_upper(find(m, peer)), peer))
                        my_upper.append(over(_upper(find(m, me)), me))
                        if kp and v:
                            ratios.append(kp / v)
                            at_least |= bound
                    # Upper ends: a search cut by its budget may have
                    # stopped below the capacity (None: unbounded above).
                    a, b = spread(mine), spread(peers)
                    b_up = None if None in peer_upper else spread(peer_upper)
                    a_up = None if None in my_upper else spread(my_upper)
                    verdict = ("few" if len(per) < REPEATS_NEEDED else
                               "win" if a and b and b_up and a["min"] > b_up["max"] else
                               "loss" if a and b and a_up and a_up["max"] < b["min"] and not row["below"][peer]
                               else "overlap")
                    return spread(ratios), at_least, verdict

                r, at_least, verdict = compare(lambda i, system: 1.0)
                # The same at each system's engine speed (the drift guard),
                # where every run has it for both.
                guarded = all(sp.get(me) and sp.get(peer) for sp in speeds)
                ra, _, verdict_at_speed = (compare(lambda i, system: speeds[i][system]) if guarded
                                           else (None, False, None))
                target = TARGETS.get(name) if me == "kneepoint" else None
                # A target is met only where the drift guard, when the runs
                # have it, agrees: the drift can flatter either side.
                row["comparisons"].append({
                    "kneepoint": me, "peer": peer, "ratio": r, "at_least": at_least, "verdict": verdict,
                    "ratio_at_speed": ra, "verdict_at_speed": verdict_at_speed,
                    "target": target,
                    "target_met": (target is not None and r is not None and verdict == "win"
                                   and r["median"] >= target and row["peers_tuned"]
                                   and (ra is None or (verdict_at_speed == "win" and ra["median"] >= target)))})
        out.append(row)
    return out


def _caps(caps: list[int]) -> str:
    """Batch caps over runs in words: "1" when all agree, else each."""
    return str(caps[0]) if len(set(caps)) == 1 else ", ".join(map(str, caps))


def machine(run: dict) -> str:
    """The machine a run (summary.json) was taken on, in words: its CPU
    model and how many CPUs."""
    m = run["meta"].get("machine") or {}
    return f"{m.get('cpu', 'an unrecorded CPU')} ({m.get('nproc', '?')} CPUs)"


def measured_code(runs: list[dict]) -> list[str | None]:
    """Each run's measured code, compared as the side-by-side runs it
    (bench/provenance.py, section bench-peers: the product and the shared
    harness, not other benchmarks' scripts) where this checkout has every
    run's commit; else the digests the runs recorded (of all the measured
    code), None where a run has none."""
    own = [provenance.measured_digest(r["meta"]["git"], section="bench-peers") if r["meta"].get("git") else None
           for r in runs]
    return own if all(own) else [r["meta"].get("measured") for r in runs]


def repeats_markdown(runs: list[dict]) -> str:
    """The summary of several runs, and the conclusions the data allow,
    written by this code (not by hand) so they cannot go stale."""
    commits = [r["meta"].get("git", "?") for r in runs]
    reps = repeats(runs)
    counts = sorted({row["runs"] for row in reps})
    L = [f"### Over {' or '.join(map(str, counts)) or 0} run{'' if counts == [1] else 's'} per model "
         "(median [smallest–largest])", ""]
    if any(c.endswith("+dirty") for c in commits):
        L += ["**Some runs were of a tree with uncommitted changes (+dirty): not a record.**", ""]
    for row in reps:
        systems = list(row["capacity"])
        theirs = [r for r in runs if any(m["model"] == row["model"] for m in r["models"])]
        mine = "; ".join(f"{r['meta'].get('started', '?')} at {r['meta'].get('git', '?')}" for r in theirs)
        machines = list(dict.fromkeys(machine(r) for r in theirs))
        L += [f"#### {row['model']} (SLO {spread_text(row['slo_ms'], 1, ' ms')}; engine limit "
              f"{spread_text(row['engine_limit'])} images/s)", "",
              f"{row['runs']} run{'s' if row['runs'] != 1 else ''}: {mine}; on {' and '.join(machines)}.", ""]
        # A model's runs are one record only if they measured the same
        # code (each model's series may be of its own): one commit, or
        # commits whose measured code (measured_code) is the same.
        theirs_commits = sorted({r["meta"].get("git", "?") for r in theirs})
        if len(theirs_commits) > 1:
            of = f"The runs of {row['model']} are of {len(theirs_commits)} commits ({', '.join(theirs_commits)})"
            codes = set(measured_code(theirs))
            if None in codes:
                L += [f"**{of} whose measured code cannot be compared here: not one record.**", ""]
            elif len(codes) > 1:
                L += [f"**{of} whose measured code differs: not one record.**", ""]
            else:
                L += [f"{of} whose measured code is the same (digest {next(iter(codes))}; they differ only in "
                      "documentation, tests, report code or other benchmarks' harness): one record.", ""]
        if len(machines) > 1:
            L += [f"**The runs of {row['model']} are of {len(machines)} machines: the capacities in req/s mix "
                  "their speeds, which widens the spreads; each ratio is of one run on one machine.**", ""]
        L += ["| system | capacity: OK req/s with p99 ≤ SLO | peak: OK req/s, saturated |", "|---|---|---|"]
        for s in systems:
            cap = spread_text(row["capacity"][s])
            if row["below"][s]:
                cap = (f"{cap}; " if row["capacity"][s] else "") + (
                    f"no level met the SLO in {row['below'][s]['n']} of the runs: below {spread_text(row['below'][s])}")
            cut = row["cut"][s]
            if cut:
                finite = [w for w in cut if math.isfinite(w)]
                cap += (f"; not resolved in {len(cut)} of the runs (time budget; bracket "
                        + (f"{100 * min(finite):.1f}–{100 * max(finite):.1f}% wide" if finite else "open")
                        + (", open in some" if finite and len(finite) < len(cut) else "") + ")")
            L.append(f"| {NAMES.get(s, s)} | {cap} | {spread_text(row['peak'][s])} |")
        L.append("")
    L += ["### What the runs say (generated)", ""]
    for row in reps:
        for c in row["comparisons"]:
            how = {"win": "a win: the capacity spreads do not overlap",
                   "loss": "a loss: the capacity spreads do not overlap",
                   "overlap": "not a win or a loss: the capacity spreads overlap",
                   "few": f"not called a win or a loss: {row['runs']} of the {REPEATS_NEEDED} runs a verdict "
                          "needs"}[c["verdict"]]
            bound = " (the peer met the SLO at no level, down to the rate it is divided by)"
            line = (f"- {row['model']}: {c['kneepoint']} / {NAMES[c['peer']]} = "
                    f"{'at least ' if c['at_least'] else ''}{spread_text(c['ratio'], 2, '×')}"
                    f"{bound if c['at_least'] else ''}, {how}")
            if c.get("ratio_at_speed"):
                line += (f"; at each one's engine speed (the drift guard): "
                         f"{'at least ' if c['at_least'] else ''}{spread_text(c['ratio_at_speed'], 2, '×')}, "
                         + {"win": "a win", "loss": "a loss", "overlap": "spreads overlapping",
                            "few": "too few runs"}[c["verdict_at_speed"]])
            if c["target"] is not None:
                line += (f"; the issue's target (a median ≥ {c['target']:g}× and a win"
                         + (", at each one's engine speed too" if c.get("ratio_at_speed") else "") + ") is "
                         + ("not judged yet" if c["verdict"] == "few" else
                            "not judged: the peers' batch cap was not tuned for the SLO" if not row["peers_tuned"]
                            else "met" if c["target_met"] else "not met"))
            L.append(line + ".")
        if row["comparisons"]:
            tuned = [c for c in row["peer_caps"] if c is not None]
            L.append(f"- {row['model']}: the peers' batch cap was "
                     + (f"tuned for the SLO in every run ({_caps(tuned)})." if row["peers_tuned"] else
                        f"kneepoint's in {len(row['peer_caps']) - len(tuned)} of the runs, not tuned for the SLO "
                        "(runs before BENCH_PEER_MAX_BATCH): their batchers fill batches up to it whether or not "
                        "those are faster per image, so the ratios may flatter kneepoint."))
        if row["drift"]:
            L.append(f"- {row['model']}: within a run the engine's speed moved by "
                     f"{spread_text({k: (100 * v if k != 'n' else v) for k, v in row['drift'].items()}, 1, '%')} "
                     f"(the drift guard, in {row['guarded_runs']} of the {row['runs']} runs)"
                     + ("" if row["guarded_runs"] == row["runs"] else
                        "; ratios at each one's engine speed need it in every run") + ".")
        cap = row["capacity"].get("kneepoint")
        if cap and row["engine_limit"]:
            L.append(f"- {row['model']}: kneepoint's capacity is {cap['median'] / row['engine_limit']['median']:.2f} "
                     f"of the engine limit (medians).")
        a = row.get("allowed")
        if a:
            L.append(f"- {row['model']}: what the engine allows (a simulation, bench/schedule_bound.py, from each "
                     f"run's engine medians at batch {', '.join(map(str, a['batches']))}): no server on this engine "
                     f"meets the SLO above {spread_text(a['bound_per_s'])} req/s offered "
                     f"({spread_text(a['bound_of_limit'], 2)} of the engine limit), whatever it batches or refuses"
                     + (f"; kneepoint's capacity is {spread_text(a['kneepoint_of_bound'], 2)} of that" if a["kneepoint_of_bound"]
                        else "")
                     + f". An ideal FIFO server at batch 1 that refuses nothing (Triton at a cap of 1 without "
                     f"overheads of its own) meets it up to {spread_text(a['fifo_per_s'])} req/s"
                     + (f" (Triton's capacity is {spread_text(a['triton_of_fifo'], 2)} of that)" if a["triton_of_fifo"]
                        else "")
                     + f": no server's capacity is more than {spread_text(a['bound_over_fifo'], 2, '×')} that ideal "
                     f"FIFO's.")
    return "\n".join(L) + "\n"


# --- PERFORMANCE.md ---------------------------------------------------------

SECTION = "bench-peers"
BY = "bench/bench.py"
BEGIN = docsection.begin_marker(SECTION, BY)
END = docsection.end_marker(SECTION)


def replace_section(doc: str, body: str) -> str | None:
    """doc with the text between BEGIN and END replaced by body; None if the
    markers are not both there (then nothing is written)."""
    return docsection.replace(doc, SECTION, BY, body)


def update_doc(path: Path, body: str) -> bool:
    return docsection.update(path, SECTION, BY, body)
