"""What the engine allows: an upper bound on any server's capacity at an
SLO, and the capacity of an ideal FIFO server, from the engine's measured
batch costs. A simulation, labelled as one wherever its numbers appear.

The side-by-side (bench.py) counts a level as meeting the SLO when at most
1% of its requests are late or failed (a failed one counts as later than
any answer). Whatever a server does, its inference core runs batches of
the engine, and a batch of b images costs what the engine alone measured:
cost(b) ≥ b·c*, where c* is the least per-image cost among the measured
batch sizes (1/c* is the engine limit). So:

- **The bound.** Replace every batch of a schedule by its images run one
  at a time at c* each, from the batch's start: every image still ends no
  later (the k-th of the batch at start + k·c* ≤ start + cost(b)), and it
  had arrived by the start. A schedule of single images at c* is thus at
  least as good as any batched one, and among those, first-come
  first-served that admits a request exactly when it would still end
  within the SLO and refuses it otherwise (`admit_if_on_time`) maximises
  the requests answered in time: an exchange argument (all service times
  and SLOs equal, so deadlines are in arrival order) turns any schedule
  with more on time into one that agrees with it on a longer prefix,
  and `test_schedule_bound` checks it against every subset on small
  instances. Its highest Poisson load with ≤ 1% refused is an upper bound
  on the offered rate at which *any* server on this engine meets the
  SLO: SLO-aware batching and admission, refusing or not, knowing the
  future or not. It does assume what it is given: every batch takes its
  measured median (a server whose batches happen to run faster than the
  median could pass it slightly), batch sizes between those measured may
  be cheaper per image (unmeasured), and arrivals are Poisson as in the
  harness, not the harness's very arrivals.
- **The ideal FIFO.** A server that runs batch 1 at the engine's batch-1
  median, first come first served, and refuses nothing (a batcher capped
  at 1 with no overhead of its own: what Triton at a cap of 1 is at best).

Both are simulated over `N` Poisson arrivals (a fixed seed, so a report
redraws the same numbers), in units of the service time, and the highest
load with ≤ 1% late or refused is found by bisection to `RESOLUTION`."""

from __future__ import annotations

import functools
import math
import random

N = 400_000
SEED = 20261130
TOLERANCE = 0.01
RESOLUTION = 1e-3


@functools.lru_cache(maxsize=4)
def unit_arrivals(n: int = N, seed: int = SEED) -> tuple[float, ...]:
    """Arrival times of a Poisson process of rate 1: scaled by 1/load they
    are the arrivals at that load (the same draws at every load, so the
    bisection compares like with like)."""
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(1.0)
        out.append(t)
    return tuple(out)


def admit_if_on_time(arrivals, slo: float) -> list[bool]:
    """First come first served with service time 1, admitting a request
    exactly when it would end within slo of its arrival: per request,
    whether it was admitted (answered in time)."""
    free, out = 0.0, []
    for t in arrivals:
        end = (t if t > free else free) + 1.0
        ok = end <= t + slo
        if ok:
            free = end
        out.append(ok)
    return out


def refused_fraction(load: float, slo: float, n: int = N, seed: int = SEED) -> float:
    """Share of requests `admit_if_on_time` refuses at load (arrival rate ×
    service time), slo in service times."""
    admitted = admit_if_on_time((u / load for u in unit_arrivals(n, seed)), slo)
    return 1.0 - sum(admitted) / n


def late_fraction_fifo(load: float, slo: float, n: int = N, seed: int = SEED) -> float:
    """Share of requests a FIFO server that refuses nothing answers later
    than slo (service time 1, slo in service times)."""
    free, late = 0.0, 0
    for u in unit_arrivals(n, seed):
        t = u / load
        free = (t if t > free else free) + 1.0
        if free > t + slo:
            late += 1
    return late / n


def late_fraction_md1(load: float, slo: float) -> float:
    """The same share for M/D/1 in closed form (Erlang's waiting-time
    distribution, service 1): P(wait > slo - 1). Used to check the
    simulation."""
    w = slo - 1.0
    if w < 0:
        return 1.0
    cdf = (1.0 - load) * sum((load * (k - w)) ** k / math.factorial(k) * math.exp(load * (w - k))
                             for k in range(int(math.floor(w)) + 1))
    return 1.0 - cdf


def max_load(fraction, slo: float, tolerance: float = TOLERANCE, resolution: float = RESOLUTION) -> float:
    """The highest load (to resolution) at which fraction(load, slo) ≤
    tolerance, by bisection on (0, 1)."""
    lo, hi = 0.0, 1.0
    while hi - lo > resolution:
        mid = (lo + hi) / 2
        if fraction(mid, slo) <= tolerance:
            lo = mid
        else:
            hi = mid
    return lo


def engine_bound(engine: list[dict], slo_ms: float) -> dict | None:
    """From a run's engine measurements (batch, median_ms per batch) and
    its SLO: the bound and the ideal FIFO as offered req/s and as shares of
    the engine limit; None when the run lacks batch 1 or the costs."""
    costs = {int(e["batch"]): float(e["median_ms"]) for e in engine if e.get("batch") and e.get("median_ms")}
    if 1 not in costs or not slo_ms:
        return None
    per_image = min(ms / b for b, ms in costs.items())
    limit = 1000.0 / per_image
    bound = max_load(refused_fraction, slo_ms / per_image)
    fifo = max_load(late_fraction_fifo, slo_ms / costs[1]) * 1000.0 / costs[1]
    return {"per_image_ms": per_image, "batches": sorted(costs), "engine_limit": limit,
            "bound_per_s": bound * limit, "bound_of_limit": bound,
            "fifo_per_s": fifo, "fifo_of_limit": fifo / limit}
