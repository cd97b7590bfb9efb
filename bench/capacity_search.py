"""Which offered rates bench/bench.py tries to find a system's capacity.

Sans-IO: each function is given `meets(rate, phase) -> bool`, which runs a
level at that rate (or, in the tests, looks a verdict up) and says whether
it met the SLO (the phase names why the rate is tried: "sweep", "down",
"refine" or "confirm"), and returns a bracket `(lo, hi)`: the highest rate
that met the SLO and the lowest rate above it that missed (None where
there is none).

A level of the side-by-side holds at least 2,000 requests (issue 13), so
at resnet50's rates (~8 req/s on the 2-CPU VM) one costs four minutes and
the eight of a bisection from a factor-2 bracket half an hour per system.
Hence two kinds of level:

- *scouts*: one short window each (a few hundred requests), cheap and
  noisy, run through `search` to a coarse bracket (a few percent);
- *full* levels, run through `confirm` from the scouts' bracket: the
  scouts' two rates first, then, where a full level disagrees with its
  scout, away from it by a growing step until one agrees, then bisection
  to the final resolution. Only full levels decide the capacity; a scout
  only says where to look.

Without scouts, `search` runs on full levels, as the harness always did.

Even so, where a system's failed share hovers near the 1% rule over a
range of rates, the full levels needed to resolve 2% pile up (seven of
them, 35 minutes, for one system on resnet50). `budgeted` gives a search a
time budget: once it has run out, no further level starts (`OutOfTime`),
and the caller reports the bracket the levels reached, flagged as not
resolved, instead of a run that outlasts the session it was started in.
"""

from __future__ import annotations

from typing import Callable, Optional

Meets = Callable[[float, str], bool]
Bracket = tuple[Optional[float], Optional[float]]

# Levels are not tried below this rate (req/s).
FLOOR = 0.5
# Halvings below a first sweep level that missed, at most.
HALVINGS = 5
# Steps away from a scout's rate that a full level disagreed with, at most.
STEPS = 6


class OutOfTime(Exception):
    """Raised by a `budgeted` meets instead of starting a level once its
    budget has run out: the search ends with the levels it ran."""


def budgeted(meets: Meets, budget_s: float, clock: Callable[[], float]) -> Meets:
    """`meets` under a time budget: from its first level on, a level starts
    only while less than `budget_s` seconds (by `clock`) have passed since
    that first level started, else OutOfTime is raised. A level that
    started in time runs to its end, so a search overruns its budget by at
    most one level. budget_s <= 0: no budget, `meets` itself."""
    if budget_s <= 0:
        return meets
    start: Optional[float] = None

    def within(rate: float, phase: str) -> bool:
        nonlocal start
        now = clock()
        if start is None:
            start = now
        elif now - start >= budget_s:
            raise OutOfTime(f"the search's budget of {budget_s:g} s ran out after {now - start:.0f} s")
        return meets(rate, phase)

    return within


def lowest(sweep: list[float], floor: float = FLOOR) -> float:
    """The lowest rate a search from `sweep` tries: its first rate halved
    HALVINGS times (1.6% of the engine limit with the harness's sweep), not
    below `floor`. Full levels go no lower either (`confirm`'s floor): a
    system that misses the SLO there has its capacity reported as below
    the lowest level tried, however its scouts fared, instead of a walk
    down in levels of 2,000 requests that take a quarter of an hour each
    at such rates."""
    return max(floor, sweep[0] / 2 ** HALVINGS)


def bisect(meets: Meets, lo: Optional[float], hi: Optional[float], resolution: float, refine: int) -> Bracket:
    """Halve [lo, hi] (lo met, hi missed) until hi - lo <= resolution * lo,
    at most `refine` levels; nothing to do where either end is missing."""
    for _ in range(refine):
        if lo is None or hi is None or hi - lo <= resolution * lo:
            break
        mid = (lo + hi) / 2
        if meets(mid, "refine"):
            lo = mid
        else:
            hi = mid
    return lo, hi


def search(meets: Meets, sweep: list[float], resolution: float, refine: int, floor: float = FLOOR) -> Bracket:
    """The sweep's rates in order until one misses; if the first one
    misses, halve it (at most HALVINGS times, not below `floor`) until a
    level meets; then bisect."""
    lo = hi = None
    for rate in sweep:
        if meets(rate, "sweep"):
            lo = rate
        else:
            hi = rate
            break
    if lo is None and hi is not None:
        rate = hi
        for _ in range(HALVINGS):
            rate /= 2
            if rate < floor:
                break
            if meets(rate, "down"):
                lo = rate
                break
            hi = rate
    return bisect(meets, lo, hi, resolution, refine)


def confirm(meets: Meets, scout: Bracket, resolution: float, refine: int, top: float,
            floor: float = FLOOR, steps: int = STEPS) -> Bracket:
    """Full levels from a scouts' bracket `scout` (lo met, hi missed as
    scouts; either may be None): the scouts' lo (or, if no scout met, their
    lowest miss), then upward through the scouts' hi while levels meet, or
    downward while they miss, by a step that starts at the scouts' bracket
    width and doubles each time, not above `top` (the sweep's highest rate:
    a system that meets it there has no bracket) nor below `floor`; then
    bisection. Where no scout met the SLO, one full level at the lowest
    scout's rate decides: if it misses too, the search ends there (no
    capacity at or above it) instead of walking below the scouts' floor,
    where a level of 2,000 requests takes a quarter of an hour. Returns
    the bracket of full levels."""
    s_lo, s_hi = scout
    if s_lo is None and s_hi is None:
        return None, None
    grow = (s_hi / s_lo - 1) if s_lo and s_hi else 4 * resolution
    grow = max(grow, resolution)
    start = s_lo if s_lo is not None else s_hi
    lo = hi = None
    if meets(start, "confirm"):
        lo = start
        rate = s_hi if s_hi is not None and s_hi > start else start * (1 + grow)
        for _ in range(steps):
            if rate > top * (1 + 1e-9):
                break
            if not meets(rate, "confirm"):
                hi = rate
                break
            lo = rate
            grow *= 2
            rate = lo * (1 + grow)
    else:
        hi = start
        rate = start / (1 + grow)
        # Where no scout met the SLO, `start` is the lowest scout and
        # nothing below it is tried: that one full level decides.
        steps_down = steps if s_lo is not None else 0
        for _ in range(steps_down):
            if rate < floor:
                break
            if meets(rate, "confirm"):
                lo = rate
                break
            hi = rate
            grow *= 2
            rate = hi / (1 + grow)
    return bisect(meets, lo, hi, resolution, refine)
