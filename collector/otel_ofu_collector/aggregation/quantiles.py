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
