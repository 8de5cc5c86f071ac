"""Exact percentiles of a window's per-GPU OFU values.

Definition: linear interpolation between closest ranks, numpy's default (``method="linear"``,
Hyndman & Fan type 7). For n sorted values v[0..n-1] and q in [0, 1], the rank is h = q (n - 1) and the
percentile is v[floor(h)] + (h - floor(h)) (v[floor(h) + 1] - v[floor(h)]). The histogram estimate in
exphist.py uses the same definition, so the two differ only by bucket resolution.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

from otel_ofu import names


def check_quantile(q: float) -> float:
    if not (math.isfinite(q) and 0.0 <= q <= 1.0):
        raise ValueError(f"quantile must be in [0, 1], got {q!r}")
    return q


def percentile_of_sorted(sorted_values: Sequence[float], q: float) -> float:
    """The q-percentile of already sorted values (ascending); they must not be empty."""
    check_quantile(q)
    if not sorted_values:
        raise ValueError("percentile of no values")
    rank = q * (len(sorted_values) - 1)
    low = math.floor(rank)
    fraction = rank - low
    lower = sorted_values[low]
    if fraction == 0.0:
        return lower
    return lower + fraction * (sorted_values[low + 1] - lower)


def percentiles(values: Iterable[float], quantiles: Sequence[float] = names.QUANTILES) -> Mapping[float, float]:
    """Each requested percentile of the values (sorted here); an empty input gives an empty mapping."""
    ordered = sorted(values)
    if not ordered:
        return {}
    return {q: percentile_of_sorted(ordered, q) for q in quantiles}


def weighted_percentile_of_sorted(sorted_values: Sequence[float], weights: Sequence[float], q: float) -> float:
    """The q-percentile of sorted values each weighing its weight (> 0): type 7 with weights.

    Neighbouring values sit the mean of their two weights apart, and the percentile is read at q of the whole
    span by linear interpolation, so equal weights give ``percentile_of_sorted`` exactly: value i sits at
    i x w, the span is (n - 1) x w, and q of it is rank q (n - 1). A MIG slice weighing 1/7 thus moves the
    percentiles of its group a seventh as far as a whole GPU does.
    """
    check_quantile(q)
    if not sorted_values or len(weights) != len(sorted_values):
        raise ValueError("weighted percentile needs as many (positive) weights as values, and some values")
    n = len(sorted_values)
    if n == 1:
        return sorted_values[0]
    gaps = [(weights[i] + weights[i + 1]) / 2 for i in range(n - 1)]
    target = q * math.fsum(gaps)
    reached = 0.0
    for i, gap in enumerate(gaps):
        if target <= reached + gap or i == n - 2:
            fraction = min(1.0, max(0.0, (target - reached) / gap)) if gap > 0 else 0.0
            lower = sorted_values[i]
            return lower + fraction * (sorted_values[i + 1] - lower)
        reached += gap
    return sorted_values[-1]  # unreachable: the loop returns at its last gap
