"""The one percentile every kneepoint script reports: nearest rank, as HDR
histograms (kp-if's telemetry, kp-client) and kp-engine-bench compute it,
so a p99 here and a p99 there mean the same.

    percentile(values, q) = the smallest value v such that at least
    ceil(q * n) of the n values are <= v; None for no values.
"""

from __future__ import annotations

import math
from typing import Iterable, Optional


def percentile(values: Iterable[float], q: float) -> Optional[float]:
    """Nearest-rank `q`-quantile (0 < q <= 1) of `values` (any order)."""
    v = sorted(values)
    if not v:
        return None
    if not 0.0 < q <= 1.0:
        raise ValueError(f"quantile {q} is not in (0, 1]")
    return v[max(1, math.ceil(q * len(v))) - 1]
