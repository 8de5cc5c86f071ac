"""OpenTelemetry base-2 exponential histograms of non-negative values (OFU is in [0, 1]; idle GPUs give 0).

Layout as in the OTLP data model: at scale s the base is 2^(2^-s) and bucket i holds (base^i, base^(i+1)];
zero has its own count (threshold 0: only exact zeros, so no value is ever moved). Every value is first
mapped at ``MAX_SCALE`` and lower scales are taken by an arithmetic shift, so the mapping at any scale is
the exact downscale of the mapping at the top one: inserting values one by one, building from a batch and
merging histograms at different scales all give identical buckets (the merge is exact, never approximate).

The scale chosen is the highest at which the non-empty buckets fit in ``max_buckets``; the relative error
of a quantile read from the buckets is then at most ``relative_error_bound(scale)`` = sqrt(base) - 1
(bucket representative: its geometric midpoint, clamped to the exact min and max). Quantiles are read as
``quantiles.py`` defines the fleet's: the smallest value at or below which q of the counts lie.

A histogram's counts are observations (a GPU or slice each), or, built with ``counts``, whole units of something
the values weigh (the capacity histogram a shard sends its merge tier counts GPU-microseconds of capacity).
"""

from __future__ import annotations

import bisect
import functools
import itertools
import math
import operator
from collections import Counter
from collections.abc import Iterable

import attrs

from otel_ofu_collector.stats.quantiles import capacity_rank, check_quantile

MAX_SCALE = 20
MIN_SCALE = -10
_LOG_SCALE_FACTOR = (1 << MAX_SCALE) / math.log(2.0)
# Bucket exponents (index / 2^scale) a float can reach: 2^-1075 .. 2^1024, with a margin.
_MIN_EXPONENT = -1100
_MAX_EXPONENT = 1100
_FLOAT_MAX_EXP = 1024  # 2^1024 is past the largest float
_POWERS_OF_TWO = frozenset(math.ldexp(1.0, exponent) for exponent in range(-1074, _FLOAT_MAX_EXP))


def top_index(value: float) -> int:
    """Bucket index of a positive finite value at MAX_SCALE; exact powers of two are mapped exactly."""
    mantissa, exponent = math.frexp(value)
    if mantissa == 0.5:
        # value = 2^(exponent-1) is the inclusive upper bound of the bucket below it
        return ((exponent - 1) << MAX_SCALE) - 1
    return math.floor(math.log(value) * _LOG_SCALE_FACTOR)


def _top_indices(positives: list[float]) -> list[int]:
    """``top_index`` of each positive finite value, in C-level passes: the logarithm's bucket, then the
    exact powers of two (rare in real data) moved to the bucket below, as ``top_index`` maps them."""
    indices = list(map(math.floor, map(_LOG_SCALE_FACTOR.__mul__, map(math.log, positives))))
    for power in _POWERS_OF_TWO.intersection(positives):
        index = top_index(power)
        at = -1
        for _ in range(positives.count(power)):
            at = positives.index(power, at + 1)
            indices[at] = index
    return indices


def relative_error_bound(scale: int) -> float:
    """Largest relative error of a value read back from a bucket at this scale (geometric midpoint)."""
    return float(2.0 ** (2.0**-scale / 2.0) - 1.0)


def shift_to_fit(low: int, high: int, max_buckets: int) -> int:
    """Smallest downscale (in steps of one scale) after which buckets low..high span at most max_buckets."""
    shift = 0
    while (high >> shift) - (low >> shift) + 1 > max_buckets and shift < MAX_SCALE - MIN_SCALE:
        shift += 1
    return shift


def _check_value(value: float) -> float:
    if not (math.isfinite(value) and value >= 0.0):
        raise ValueError(f"exponential histogram takes finite values >= 0, got {value!r}")
    return float(value)


def _as_counts(value: Iterable[int]) -> tuple[int, ...]:
    return tuple(value)


def _check_counts(_instance: object, _attribute: attrs.Attribute[tuple[int, ...]], value: tuple[int, ...]) -> None:
    if any(count < 0 for count in value):
        raise ValueError("bucket counts must be >= 0")


@attrs.frozen
class ExpHistogram:
    """An immutable exponential histogram (a window's snapshot, or one decoded from OTLP).

    Normal form: no empty buckets at either end of ``counts``; without any positive bucket the scale is
    MAX_SCALE and the offset 0 (a scale carries no information then). ``normalized`` gives that form;
    ``from_values`` and ``merge`` always return it, so equal contents compare equal. Equality compares
    the distribution (scale, buckets, zero count, min, max), not ``sum``, which float rounding may
    change in the last bits when the same values are added in another order.
    """

    scale: int = MAX_SCALE
    zero_count: int = 0
    offset: int = 0
    counts: tuple[int, ...] = attrs.field(default=(), converter=_as_counts, validator=_check_counts)
    sum: float = attrs.field(default=0.0, eq=False)  # float-rounded: a merge may differ in the last bits
    min: float | None = None
    max: float | None = None

    def __attrs_post_init__(self) -> None:
        if not MIN_SCALE <= self.scale <= MAX_SCALE:
            raise ValueError(f"scale {self.scale} is outside [{MIN_SCALE}, {MAX_SCALE}]")
        if self.zero_count < 0:
            raise ValueError("zero_count must be >= 0")
        if self.counts:
            low = self.offset / 2.0**self.scale
            high = (self.offset + len(self.counts)) / 2.0**self.scale
            if low < _MIN_EXPONENT or high > _MAX_EXPONENT:
                raise ValueError(f"buckets offset {self.offset} at scale {self.scale} lie outside the float range")

    @classmethod
    def from_values(cls, values: Iterable[float], *, max_buckets: int) -> ExpHistogram:
        """The histogram of a batch of values, at the highest scale that fits.

        Built with C-level passes over the batch (a window closes with one histogram of up to every GPU):
        the same buckets, sum (added in order), min and max as inserting the values one by one.
        """
        batch = list(map(float, values))
        if not batch:
            return cls()
        total = functools.reduce(operator.add, batch, 0.0)
        smallest = min(batch)
        largest = max(batch)
        if not (smallest >= 0.0 and math.isfinite(total)):
            # A bad value (negative, NaN, infinite) or a sum past the float range: check each, in order.
            for value in batch:
                _check_value(value)
        positives = list(filter(None, batch))  # zero (either sign) has its own count
        zero_count = len(batch) - len(positives)
        if not positives:
            return cls(zero_count=zero_count, sum=total, min=smallest, max=largest)
        return cls._of(_top_indices(positives), zero_count, total, smallest, largest, max_buckets)

    @classmethod
    def from_sorted(cls, values: list[float], *, max_buckets: int, counts: list[int] | None = None) -> ExpHistogram:
        """``from_values`` of values already in ascending order (a window's, sorted for its percentiles),
        with less to do: the zeros lead, min and max are at the ends, the powers of two are found by bisection.

        ``counts``: how many units each value stands for (>= 0 each; None: one each); the sum then adds each value
        times its count, and a value counting 0 still bounds min and max."""
        if counts is not None:
            return cls._weighted(values, counts, max_buckets)
        if not values or not values[0] >= 0.0:
            return cls.from_values(values, max_buckets=max_buckets)
        total = functools.reduce(operator.add, values, 0.0)
        if not math.isfinite(total):
            return cls.from_values(values, max_buckets=max_buckets)
        zero_count = bisect.bisect_right(values, 0.0)
        # max() gives the first of equal largest values: the last value unless all are zeros (of either sign).
        smallest, largest = values[0], values[-1] if zero_count < len(values) else values[0]
        if zero_count == len(values):
            return cls(zero_count=zero_count, sum=total, min=smallest, max=largest)
        positives = values[zero_count:]
        indices = list(map(math.floor, map(_LOG_SCALE_FACTOR.__mul__, map(math.log, positives))))
        exponent = math.frexp(positives[0])[1] - 1  # 2^exponent <= the smallest positive value
        while exponent < _FLOAT_MAX_EXP and (power := math.ldexp(1.0, exponent)) <= positives[-1]:
            low = bisect.bisect_left(positives, power)
            high = bisect.bisect_right(positives, power, low)
            if high > low:
                indices[low:high] = [top_index(power)] * (high - low)
            exponent += 1
        return cls._of(indices, zero_count, total, smallest, largest, max_buckets)

    @classmethod
    def _weighted(cls, values: list[float], counts: list[int], max_buckets: int) -> ExpHistogram:
        """``from_sorted`` with a count per value: the values that count (a count of 0 leaves its value out, min and
        max too), each bucket adding their counts."""
        if len(counts) != len(values) or any(count < 0 for count in counts):
            raise ValueError("a weighted histogram needs a count >= 0 per value")
        kept = [(_check_value(value), count) for value, count in zip(values, counts, strict=True) if count]
        if not kept:
            return cls()
        total = math.fsum(value * count for value, count in kept)
        zero_count = sum(count for value, count in kept if value == 0.0)
        positives = [(value, count) for value, count in kept if value > 0.0]
        smallest, largest = kept[0][0], kept[-1][0]
        if not positives:
            return cls(zero_count=zero_count, sum=total, min=smallest, max=largest)
        indices = [top_index(value) for value, _count in positives]
        weights = [count for _value, count in positives]
        return cls._of(indices, zero_count, total, smallest, largest, max_buckets, weights)

    @classmethod
    def _of(
        cls,
        indices: list[int],
        zero_count: int,
        total: float,
        smallest: float,
        largest: float,
        max_buckets: int,
        weights: list[int] | None = None,
    ) -> ExpHistogram:
        """The histogram of positive values' top-scale bucket indices (each counting its weight, else 1), at the
        highest scale that fits."""
        shift = shift_to_fit(min(indices), max(indices), max_buckets)
        shifted = map(operator.rshift, indices, itertools.repeat(shift)) if shift else indices
        by_bucket: Counter[int] = Counter()
        if weights is None:
            by_bucket.update(shifted)
        else:
            for index, weight in zip(shifted, weights, strict=True):
                by_bucket[index] += weight
        offset = min(by_bucket)
        counts = [0] * (max(by_bucket) - offset + 1)
        for index, count in by_bucket.items():
            counts[index - offset] = count
        return cls(MAX_SCALE - shift, zero_count, offset, tuple(counts), total, smallest, largest)

    @property
    def count(self) -> int:
        return self.zero_count + sum(self.counts)

    def normalized(self) -> ExpHistogram:
        first = next((i for i, count in enumerate(self.counts) if count), None)
        if first is None:
            return attrs.evolve(self, scale=MAX_SCALE, offset=0, counts=())
        last = max(i for i, count in enumerate(self.counts) if count)
        if first == 0 and last == len(self.counts) - 1:
            return self
        return attrs.evolve(self, offset=self.offset + first, counts=self.counts[first : last + 1])

    def downscale(self, by: int) -> ExpHistogram:
        """The same data at ``scale - by`` (buckets merged pairwise ``by`` times)."""
        if by < 0:
            raise ValueError("downscale by a negative amount")
        if by == 0 or not self.counts:
            return self
        if self.scale - by < MIN_SCALE:
            raise ValueError(f"cannot downscale below scale {MIN_SCALE}")
        offset = self.offset >> by
        counts = [0] * (((self.offset + len(self.counts) - 1) >> by) - offset + 1)
        for i, count in enumerate(self.counts):
            counts[((self.offset + i) >> by) - offset] += count
        return attrs.evolve(self, scale=self.scale - by, offset=offset, counts=tuple(counts))

    def merge(self, other: ExpHistogram, *, max_buckets: int) -> ExpHistogram:
        """The exact union of both histograms, at the highest scale (<= both) that fits max_buckets."""
        mine, theirs = self.normalized(), other.normalized()
        with_buckets = [h for h in (mine, theirs) if h.counts]
        if with_buckets:
            scale = min(h.scale for h in with_buckets)
            low = min(h.offset >> (h.scale - scale) for h in with_buckets)
            high = max((h.offset + len(h.counts) - 1) >> (h.scale - scale) for h in with_buckets)
            scale -= shift_to_fit(low, high, max_buckets)
            parts = [h.downscale(h.scale - scale) for h in with_buckets]
            offset = min(p.offset for p in parts)
            counts = [0] * (max(p.offset + len(p.counts) for p in parts) - offset)
            for part in parts:
                for i, count in enumerate(part.counts):
                    counts[part.offset - offset + i] += count
            buckets: tuple[int, tuple[int, ...]] = (offset, tuple(counts))
        else:
            scale, buckets = MAX_SCALE, (0, ())
        return ExpHistogram(
            scale=scale,
            zero_count=mine.zero_count + theirs.zero_count,
            offset=buckets[0],
            counts=buckets[1],
            sum=mine.sum + theirs.sum,
            min=_pick(True, mine.min, theirs.min, mine.count, theirs.count),
            max=_pick(False, mine.max, theirs.max, mine.count, theirs.count),
        ).normalized()

    def bucket_midpoint(self, index: int) -> float:
        """Geometric midpoint of bucket ``index`` at this histogram's scale."""
        return float(2.0 ** ((index + 0.5) * 2.0**-self.scale))

    def _value_at_rank(self, rank: int) -> float:
        """Estimate of the rank-th smallest value (0-based)."""
        if rank < self.zero_count:
            return 0.0
        if self.min is not None and self.min > 0.0 and rank == self.zero_count:
            return self.min
        if self.max is not None and rank == self.count - 1:
            return self.max
        seen = self.zero_count
        for i, count in enumerate(self.counts):
            seen += count
            if rank < seen:
                estimate = self.bucket_midpoint(self.offset + i)
                if self.min is not None:
                    estimate = max(estimate, self.min)
                if self.max is not None:
                    estimate = min(estimate, self.max)
                return estimate
        raise IndexError(f"rank {rank} beyond count {self.count}")

    def quantile(self, q: float) -> float | None:
        """The q-percentile as ``quantiles.py`` defines the fleet's (the smallest value at or below which q of the
        counts lie), None if empty. Within ``relative_error_bound(scale)`` of the exact one of the inserted values:
        it is read in the bucket that holds that value."""
        check_quantile(q)
        total = self.count
        if total == 0:
            return None
        return self._value_at_rank(max(0, math.ceil(capacity_rank(q, total)) - 1))


def _pick(lower: bool, a: float | None, b: float | None, a_count: int, b_count: int) -> float | None:
    """The merged bound: unknown (None) when a side holding values does not know its own, since the
    other side's bound need not bound those values; an empty side's missing bound does not matter."""
    if a is None:
        return b if a_count == 0 else None
    if b is None:
        return a if b_count == 0 else None
    return min(a, b) if lower else max(a, b)
