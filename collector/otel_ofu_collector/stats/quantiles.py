"""Percentiles: the fleet's over GPU capacity, and plain ones for latencies.

The fleet's definition (``capacity_quantile_of_sorted``): each GPU's OFU weighs the GPU capacity it stands for in the
window (its GPU equivalents x the seconds its OFU covers), and the q-percentile is the smallest OFU at or below which
at least q of the group's capacity sat: the inverted CDF of the capacity-weighted values, numpy's
``quantile(values, q, weights=..., method="inverted_cdf")``. It is the only definition that does not change when a
GPU is cut into slices: an H100 run as one 3g.40gb slice at 0.5 and four 1g.10gb slices at 0.1 has three sevenths of
its capacity at 0.5 and four at 0.1, exactly as seven 1g slices would, so p75 is 0.5 either way (interpolating
between neighbours, as numpy's default does, would give a value no capacity had, and a different one for each cut).
The histogram estimate in ``exphist.py`` reads the same definition from its buckets, so the two differ only by
bucket resolution, in one process, on a shard and after the merge.

``percentile_of_sorted`` is the plain linear one (numpy's default) for latencies and the like, where every value
weighs the same and an interpolated value is what a reader expects.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Iterable, Mapping, Sequence

from otel_ofu import names

# Capacity weights are sums of fractions (seven 1/7 slices): a target met to within this share of the total counts
# as met, so that rounding in the last bit never moves a percentile to the next value.
_TOLERANCE = 1e-12


def check_quantile(q: float) -> float:
    if not (math.isfinite(q) and 0.0 <= q <= 1.0):
        raise ValueError(f"quantile must be in [0, 1], got {q!r}")
    return q


def capacity_rank(q: float, total: float) -> float:
    """The capacity at or below which the q-percentile is read: q of ``total``, less the rounding tolerance."""
    return q * total - _TOLERANCE * total


def capacity_quantile_of_sorted(sorted_values: Sequence[float], weights: Sequence[float], q: float) -> float:
    """The q-percentile over capacity (see the module doc): the smallest of the ascending ``sorted_values`` at or
    below which at least q of the total weight lies. Weights are >= 0 with a positive total."""
    check_quantile(q)
    if not sorted_values or len(weights) != len(sorted_values):
        raise ValueError("a capacity percentile needs as many weights as values, and some values")
    total = math.fsum(weights)
    if not total > 0.0:
        raise ValueError("a capacity percentile needs a positive total weight")
    target = capacity_rank(q, total)
    reached = 0.0
    for value, weight in zip(sorted_values, weights, strict=True):
        reached += weight
        if weight > 0.0 and reached >= target:
            return value
    return sorted_values[-1]  # only where rounding left the running sum under the target


def capacity_quantiles_of_sorted(
    sorted_values: Sequence[float], weights: Sequence[float], quantiles: Sequence[float] = names.QUANTILES
) -> dict[float, float]:
    """``capacity_quantile_of_sorted`` for each of ``quantiles``, with one running sum for all of them (a window's
    group can hold every GPU of a fleet)."""
    for q in quantiles:
        check_quantile(q)
    if not sorted_values or len(weights) != len(sorted_values):
        raise ValueError("a capacity percentile needs as many weights as values, and some values")
    if not min(weights) > 0.0:  # values without weight are no capacity: left out
        kept = [(value, weight) for value, weight in zip(sorted_values, weights, strict=True) if weight > 0.0]
        if not kept:
            raise ValueError("a capacity percentile needs a positive total weight")
        sorted_values = [value for value, _weight in kept]
        weights = [weight for _value, weight in kept]
    running = list(itertools.accumulate(weights))
    total = math.fsum(weights)
    last = len(running) - 1
    return {q: sorted_values[min(last, bisect.bisect_left(running, capacity_rank(q, total)))] for q in quantiles}


def capacity_quantiles(
    values: Iterable[float], weights: Iterable[float] | None = None, quantiles: Sequence[float] = names.QUANTILES
) -> Mapping[float, float]:
    """Each requested capacity percentile of the values (sorted here; each weighing 1 without ``weights``); an
    empty input (or one without weight) gives an empty mapping."""
    listed = list(values)
    pairs = sorted(zip(listed, weights if weights is not None else [1.0] * len(listed), strict=True))
    kept = [(value, weight) for value, weight in pairs if weight > 0.0]
    if not kept:
        return {}
    ordered = [value for value, _weight in kept]
    capacity = [weight for _value, weight in kept]
    return {q: capacity_quantile_of_sorted(ordered, capacity, q) for q in quantiles}


def percentile_of_sorted(sorted_values: Sequence[float], q: float) -> float:
    """The q-percentile of already sorted values (ascending), by linear interpolation between closest ranks (numpy's
    default, Hyndman & Fan type 7); they must not be empty. For latencies, not for the fleet's OFU."""
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
