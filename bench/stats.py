"""Summaries: medians over repeats, percentiles over samples, ratios to a baseline."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence


def median(values: Sequence[float]) -> float:
    """The median; NaN for no values (a measurement that produced nothing shows as such)."""
    return statistics.median(values) if values else math.nan


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100), linear between closest ranks; NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def ratio(value: float, baseline: float) -> float:
    """``value / baseline`` (NaN when the baseline is zero or missing)."""
    if not baseline or math.isnan(baseline):
        return math.nan
    return value / baseline


def spread(values: Sequence[float]) -> dict[str, float]:
    """Median, min, max and count of repeated measurements."""
    return {
        "median": median(values),
        "min": min(values) if values else math.nan,
        "max": max(values) if values else math.nan,
        "n": len(values),
    }


def distribution(values: Sequence[float]) -> dict[str, float]:
    """p50, p90, p99, max and count of samples."""
    return {
        "p50": percentile(values, 50),
        "p90": percentile(values, 90),
        "p99": percentile(values, 99),
        "max": max(values) if values else math.nan,
        "n": len(values),
    }
