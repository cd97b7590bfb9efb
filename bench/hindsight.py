"""Kneepoint's misses in hindsight: at each load level, how many requests
kneepoint failed (refused, or answered past the SLO) against how many a
clairvoyant server would have failed on the same requests and the same
engine — a yardstick from the run's own data, not a measurement of
another server.

The side-by-side calls a level met when at most 1% of its requests fail.
On a shared VM the engine's own speed moves within seconds (in one run of
squeezenet at a quarter of the engine's rate, kp-if's batches of one took
a median of 5.5 ms per image in some 5-s spans and 11.7 ms in others, with
the load unchanged), and in a slow spell any server fails requests. Which
of kneepoint's failures are its policy's and which the engine's? kp-if's
`--trace` says, for every request it answered, when it was complete and
when its batch ran; its load generator's `--record` says when every
request was sent, how it ended and when. From both:

- each request's **engine time**: the per-image time of kp-if's batch
  nearest in time to the request's arrival (batches of one where there
  are any), i.e. what the engine took at that moment;
- its **arrival at the server**: when kp-if had it complete (requests
  refused at their first fragment are not in the trace: their send time
  plus the median transfer of the traced ones);
- the **clairvoyant server**: first come first served, one at a time,
  each request taking its engine time, answered after the median delay
  from a batch's end to the client's receipt, and admitting a request
  exactly when its answer would reach the client within the SLO of its
  send time (refusing the others, which costs no engine time).

It knows every engine time in advance and never batches, so it is a
yardstick, not a bound: where batching pays it is pessimistic, where
engine times are known only afterwards no server matches it. A level
whose clairvoyant server already fails more than 1% is one no server on
that engine, at that moment, could have met; where kneepoint fails much
more than the clairvoyant server, the difference is kneepoint's own.

Inputs are the files bench.py keeps for a kneepoint system: the trace
(JSON lines, times in ns since kp-if began serving), kp-if's final report
(its `clock_realtime_ns`, that origin on the realtime clock) and one
record CSV per window (`request_id,sent_unix_us,outcome,answered_unix_us`).
"""

from __future__ import annotations

import bisect
import csv
import json
import statistics
from pathlib import Path

# Spans over which the engine's per-image time is summarised (its median in
# each), to show how far it moved within a level.
SPAN_S = 5.0


def read_trace(path: Path, origin_ns: int) -> tuple[dict[int, dict], list[tuple[int, float, int]]]:
    """kp-if's trace: per request id its record with times on the realtime
    clock (ns), and its batches as (start ns, engine ns per image, batch
    size), sorted by start, each batch once."""
    spans: dict[int, dict] = {}
    batches: dict[tuple[int, int], int] = {}
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            r = json.loads(line)
            rec = {k: (r[k] + origin_ns if k.endswith("_ns") and k != "send_ts_ns" and r[k] else r[k])
                   for k in r}
            spans[int(r["request_id"])] = rec
            if r["batch"] > 0 and r["end_ns"] > r["start_ns"]:
                batches[(rec["start_ns"], rec["end_ns"])] = r["batch"]
    out = sorted((s, (e - s) / n, n) for (s, e), n in batches.items())
    return spans, out


def read_records(path: Path) -> list[dict]:
    """A kp-client --record file: per request its id, send and answer
    times (µs since the epoch; answered None when it was not) and outcome."""
    out = []
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            if not r["request_id"]:
                continue  # a send refused before it had an id
            out.append({"id": int(r["request_id"]), "sent_us": int(r["sent_unix_us"]),
                        "outcome": r["outcome"],
                        "answered_us": int(r["answered_unix_us"]) if r["answered_unix_us"] else None})
    return out


def missed(r: dict, slo_us: float) -> bool:
    """Whether a request failed the side-by-side's rule: not OK, or OK
    past the SLO (from its send time)."""
    return r["outcome"] != "ok" or r["answered_us"] is None or r["answered_us"] - r["sent_us"] > slo_us


def engine_times(batches: list[tuple[int, float, int]]):
    """A function of time (ns) giving the engine's time per image then:
    the nearest batch of one, or of any size where no batch of one ran."""
    ones = [(s, c) for s, c, n in batches if n == 1] or [(s, c) for s, c, _ in batches]
    starts = [s for s, _ in ones]

    def at(t_ns: int) -> float:
        i = bisect.bisect_left(starts, t_ns)
        near = [j for j in (i - 1, i) if 0 <= j < len(ones)]
        j = min(near, key=lambda j: abs(starts[j] - t_ns))
        return ones[j][1]

    return at


def level(records: list[dict], spans: dict[int, dict], batches: list[tuple[int, float, int]],
          slo_ms: float) -> dict | None:
    """One level's hindsight (module doc), or None without a batch to
    take the engine's times from."""
    if not records or not batches:
        return None
    slo_us = slo_ms * 1000
    traced = [(r, spans[r["id"]]) for r in records if r["id"] in spans and spans[r["id"]]["complete_ns"]]
    transfer = statistics.median([s["complete_ns"] - r["sent_us"] * 1000 for r, s in traced]) if traced else 0
    back = [r["answered_us"] * 1000 - s["end_ns"] for r, s in traced
            if r["outcome"] == "ok" and r["answered_us"] is not None and s["batch"] > 0]
    out_delay = statistics.median(back) if back else 0
    cost = engine_times(batches)
    arrivals = []
    for r in records:
        s = spans.get(r["id"])
        ready = s["complete_ns"] if s and s["complete_ns"] else r["sent_us"] * 1000 + transfer
        arrivals.append((ready, r["sent_us"] * 1000))
    arrivals.sort()
    free, refused = 0.0, 0
    for ready, sent in arrivals:
        start = max(free, ready)
        end = start + cost(ready)
        if end + out_delay - sent <= slo_us * 1000:
            free = end
        else:
            refused += 1
    lo, hi = min(r["sent_us"] for r in records) * 1000, max(r["sent_us"] for r in records) * 1000
    inside = [(s, c) for s, c, _ in batches if lo <= s <= hi]
    per_span: dict[int, list[float]] = {}
    for s, c in inside:
        per_span.setdefault(int((s - lo) / (SPAN_S * 1e9)), []).append(c)
    medians = [statistics.median(v) / 1e6 for k, v in sorted(per_span.items()) if len(v) >= 5]
    n = len(records)
    kp = [r for r in records if missed(r, slo_us)]
    return {
        "requests": n,
        "missed_frac": len(kp) / n,
        "refused_frac": sum(1 for r in kp if r["outcome"] != "ok") / n,
        "hindsight_missed_frac": refused / n,
        "traced_frac": len(traced) / n,
        "engine_ms_p50": statistics.median(c for _, c in inside) / 1e6 if inside else None,
        "engine_ms_spans": [min(medians), max(medians)] if medians else None,
    }


FIELDS = ["model", "system", "level", "requests", "missed_frac", "refused_frac", "hindsight_missed_frac",
          "traced_frac", "engine_ms_p50", "engine_ms_span_lo", "engine_ms_span_hi"]


def run(windows: list[dict], record_of, trace: Path, report_log: Path, slo_ms: float) -> list[dict]:
    """Every level of one kneepoint system: `windows` its rows of
    windows.csv (full levels only), `record_of(seed)` the record file of
    the window with that seed. Rows of hindsight.csv (FIELDS)."""
    origin = None
    for line in reversed(report_log.read_text().splitlines()):
        if line.startswith("{"):
            origin = int(json.loads(line)["clock_realtime_ns"])
            break
    if origin is None:
        raise ValueError(f"{report_log}: no final report (clock_realtime_ns)")
    spans, batches = read_trace(trace, origin)
    by_level: dict[str, list[dict]] = {}
    for w in windows:
        p = record_of(int(w["seed"]))
        if p.exists():
            by_level.setdefault(w["level"], []).extend(read_records(p))
    rows = []
    for lvl, recs in by_level.items():
        recs.sort(key=lambda r: r["sent_us"])
        h = level(recs, spans, batches, slo_ms)
        if h is None:
            continue
        span = h.pop("engine_ms_spans") or [None, None]
        rows.append({"model": windows[0]["model"], "system": windows[0]["system"], "level": int(lvl), **h,
                     "engine_ms_span_lo": span[0], "engine_ms_span_hi": span[1]})
    return rows
