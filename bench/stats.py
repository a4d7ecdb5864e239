"""Small statistics helpers (no numpy on the hot path of the harness)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default), q in [0, 100]. NaN for no values."""
    if not values:
        return float("nan")
    data = sorted(values)
    if len(data) == 1:
        return float(data[0])
    pos = (len(data) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(data) - 1)
    frac = pos - lo
    return float(data[lo] + (data[hi] - data[lo]) * frac)


def median(values: Sequence[float]) -> float:
    clean = [v for v in values if v == v]  # drop NaN
    if not clean:
        return float("nan")
    return float(statistics.median(clean))


def summarize_ms(latencies_s: Sequence[float]) -> dict[str, float]:
    """p50/p90/p99/max of latencies given in seconds, returned in milliseconds."""
    return {
        "p50_ms": percentile(latencies_s, 50) * 1000.0,
        "p90_ms": percentile(latencies_s, 90) * 1000.0,
        "p99_ms": percentile(latencies_s, 99) * 1000.0,
        "max_ms": (max(latencies_s) * 1000.0) if latencies_s else float("nan"),
    }
