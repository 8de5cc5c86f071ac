"""Exponential histograms: OTLP bucket layout, exact merges at any scale, quantiles within their bound."""

from __future__ import annotations

import itertools
import math
import random
from fractions import Fraction

import attrs
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.metrics._internal.exponential_histogram.mapping.exponent_mapping import ExponentMapping
from opentelemetry.sdk.metrics._internal.exponential_histogram.mapping.logarithm_mapping import LogarithmMapping

from otel_ofu import names
from otel_ofu_collector.stats.exphist import (
    MAX_SCALE,
    ExpHistogram,
    relative_error_bound,
    shift_to_fit,
    top_index,
)
from otel_ofu_collector.stats.quantiles import capacity_quantile_of_sorted, capacity_quantiles, percentile_of_sorted

ofu_values = st.floats(min_value=0.0, max_value=1.0, allow_nan=False, allow_subnormal=False)
positive = st.floats(min_value=1e-300, max_value=1e300, allow_nan=False, allow_infinity=False)
buckets = st.sampled_from([4, 20, 160, 640])


@attrs.define
class ExpHistogramBuilder:
    """A histogram filled one value at a time, downscaling only as far as the values seen so far require: a second
    way to the same buckets, which the module's batch construction must agree with."""

    max_buckets: int
    scale: int = MAX_SCALE
    zero_count: int = 0
    _buckets: dict[int, int] = attrs.field(factory=dict)
    _low: int = 0
    _high: int = 0
    _sum: float = 0.0
    _min: float | None = None
    _max: float | None = None

    def insert(self, raw: float) -> None:
        value = float(raw)  # the values of these tests are all finite and >= 0
        self._sum += value
        self._min = value if self._min is None else min(self._min, value)
        self._max = value if self._max is None else max(self._max, value)
        if value == 0.0:
            self.zero_count += 1
            return
        index = top_index(value) >> (MAX_SCALE - self.scale)
        if not self._buckets:
            self._low = self._high = index
        else:
            low, high = min(self._low, index), max(self._high, index)
            shift = shift_to_fit(low, high, self.max_buckets)
            if shift:
                self._rescale(shift)
                index >>= shift
                low, high = low >> shift, high >> shift
            self._low, self._high = low, high
        self._buckets[index] = self._buckets.get(index, 0) + 1

    def _rescale(self, shift: int) -> None:
        rescaled: dict[int, int] = {}
        for index, count in self._buckets.items():
            rescaled[index >> shift] = rescaled.get(index >> shift, 0) + count
        self._buckets = rescaled
        self.scale -= shift

    def snapshot(self) -> ExpHistogram:
        if not self._buckets:
            return ExpHistogram(zero_count=self.zero_count, sum=self._sum, min=self._min, max=self._max)
        counts = [0] * (self._high - self._low + 1)
        for index, count in self._buckets.items():
            counts[index - self._low] = count
        return ExpHistogram(self.scale, self.zero_count, self._low, tuple(counts), self._sum, self._min, self._max)


def _bucket_index(value: float, scale: int) -> int:
    return top_index(value) >> (MAX_SCALE - scale)


@given(positive, st.integers(min_value=-10, max_value=20))
def test_bucket_index_agrees_with_the_sdk_mapping(value: float, scale: int) -> None:
    mapping = LogarithmMapping(scale) if scale > 0 else ExponentMapping(scale)
    ours = _bucket_index(value, scale)
    theirs = mapping.map_to_index(value)
    # Both place a value in (base^i, base^(i+1)]; floating point may differ by one right at a boundary.
    assert abs(ours - theirs) <= 1
    if ours != theirs:
        lower = mapping.get_lower_boundary(max(ours, theirs))
        assert math.isclose(value, lower, rel_tol=1e-9)


@pytest.mark.parametrize("exponent", range(-20, 3))
def test_powers_of_two_are_the_upper_bound_of_their_bucket(exponent: int) -> None:
    value = 2.0**exponent
    for scale in (0, 3, 8, 20):
        assert _bucket_index(value, scale) == (exponent << scale) - 1
    for scale in (-1, -3):  # buckets of 2^(2^-scale): the power of two may sit inside one
        assert _bucket_index(value, scale) == (exponent - 1) >> -scale


def test_zero_has_its_own_count_and_bad_values_are_refused() -> None:
    histogram = ExpHistogram.from_values([0.0, 0.0, 0.5], max_buckets=160)
    assert histogram.zero_count == 2
    assert histogram.count == 3
    assert histogram.quantile(0.0) == 0.0
    assert histogram.quantile(0.5) == 0.0
    assert histogram.quantile(1.0) == 0.5
    for bad in (-0.1, math.nan, math.inf):
        with pytest.raises(ValueError, match="finite values >= 0"):
            ExpHistogram.from_values([bad], max_buckets=160)


def test_empty_histogram_has_no_quantile() -> None:
    assert ExpHistogram().quantile(0.5) is None
    assert ExpHistogram.from_values([], max_buckets=160) == ExpHistogram()


@settings(max_examples=200)
@given(st.lists(ofu_values, max_size=60), buckets)
def test_inserting_one_by_one_equals_building_from_the_batch(values: list[float], max_buckets: int) -> None:
    builder = ExpHistogramBuilder(max_buckets)
    for value in values:
        builder.insert(value)
    assert builder.snapshot().normalized() == ExpHistogram.from_values(values, max_buckets=max_buckets)


@settings(max_examples=300)
@given(st.lists(st.one_of(ofu_values, st.sampled_from([0.0, -0.0, 0.25, 0.5, 1.0, 2.0**-20])), max_size=60), buckets)
def test_building_from_sorted_values_equals_building_from_the_batch(values: list[float], max_buckets: int) -> None:
    ordered = sorted(values)
    fast = ExpHistogram.from_sorted(ordered, max_buckets=max_buckets)
    batch = ExpHistogram.from_values(ordered, max_buckets=max_buckets)
    assert fast == batch
    assert (fast.sum, repr(fast.min), repr(fast.max)) == (batch.sum, repr(batch.min), repr(batch.max))


@settings(max_examples=200)
@given(st.lists(ofu_values, max_size=40), st.lists(ofu_values, max_size=40), buckets)
def test_merge_equals_one_histogram_of_all_values(a: list[float], b: list[float], max_buckets: int) -> None:
    merged = ExpHistogram.from_values(a, max_buckets=max_buckets).merge(
        ExpHistogram.from_values(b, max_buckets=max_buckets), max_buckets=max_buckets
    )
    whole = ExpHistogram.from_values(a + b, max_buckets=max_buckets)
    assert (merged.scale, merged.zero_count, merged.offset, merged.counts) == (
        whole.scale,
        whole.zero_count,
        whole.offset,
        whole.counts,
    )
    assert (merged.min, merged.max) == (whole.min, whole.max)
    assert merged.sum == pytest.approx(whole.sum, rel=1e-12, abs=1e-12)


@given(st.lists(positive, min_size=1, max_size=30), st.integers(min_value=0, max_value=25))
def test_downscale_keeps_every_count(values: list[float], by: int) -> None:
    histogram = ExpHistogram.from_values(values, max_buckets=10_000)
    by = min(by, histogram.scale + 10)
    smaller = histogram.downscale(by)
    assert smaller.scale == histogram.scale - by
    assert smaller.count == histogram.count
    for value in values:  # each value's bucket is its bucket at the lower scale
        assert smaller.offset <= _bucket_index(value, smaller.scale) < smaller.offset + len(smaller.counts)


@given(
    st.lists(ofu_values, max_size=30),
    st.floats(min_value=1e-6, max_value=1.0),
    st.integers(min_value=-10, max_value=20),
)
def test_merge_accepts_a_histogram_at_any_scale(values: list[float], busy: float, scale: int) -> None:
    fine = ExpHistogram.from_values([*values, busy], max_buckets=640)
    assert fine.counts  # at least one positive value: there is a scale to agree on
    coarse = fine.downscale(max(0, fine.scale - scale))
    merged = fine.merge(coarse, max_buckets=640)
    assert merged.count == 2 * fine.count
    assert merged.zero_count == 2 * fine.zero_count
    assert merged.scale == min(fine.scale, coarse.scale)


@given(st.integers(min_value=1, max_value=30), st.lists(positive, min_size=1, max_size=10))
def test_merging_all_zero_histograms_keeps_only_the_zero_bucket(zeros: int, busy: list[float]) -> None:
    idle = ExpHistogram.from_values([0.0] * zeros, max_buckets=640)
    assert not idle.counts
    both_idle = idle.merge(idle, max_buckets=640)
    assert (both_idle.count, both_idle.zero_count, both_idle.counts) == (2 * zeros, 2 * zeros, ())
    assert both_idle.scale == MAX_SCALE  # no positive bucket: the normal form's scale
    other = ExpHistogram.from_values(busy, max_buckets=20)
    mixed = idle.merge(other, max_buckets=20)  # the idle one has no scale of its own: the other's wins
    assert (mixed.scale, mixed.offset, mixed.counts) == (other.scale, other.offset, other.counts)
    assert mixed.zero_count == zeros + other.zero_count


def test_max_buckets_bounds_the_layout() -> None:
    values = [10.0**-k for k in range(12)]
    for max_buckets in (4, 20, 160):
        histogram = ExpHistogram.from_values(values, max_buckets=max_buckets)
        assert len(histogram.counts) <= max_buckets
        # one scale finer would not fit
        finer = ExpHistogram.from_values(values, max_buckets=10_000).downscale(0)
        assert finer.scale > histogram.scale


def _bimodal(rng: random.Random, n: int) -> list[float]:
    """An idle/busy fleet: a third of the GPUs at exactly 0, a few near-idle, the rest busy."""
    out: list[float] = []
    for _ in range(n):
        draw = rng.random()
        if draw < 0.33:
            out.append(0.0)
        elif draw < 0.40:
            out.append(rng.uniform(0.002, 0.02))
        else:
            out.append(min(1.0, max(0.0, rng.gauss(0.45, 0.08))))
    return out


def _narrow(rng: random.Random, n: int) -> list[float]:
    return [rng.uniform(0.499, 0.501) for _ in range(n)]


def _heavy_tail(rng: random.Random, n: int) -> list[float]:
    return [min(1.0, 0.001 * rng.paretovariate(1.2)) for _ in range(n)]


@pytest.mark.parametrize("distribution", [_bimodal, _narrow, _heavy_tail])
@pytest.mark.parametrize("max_buckets", [160, 640])
def test_quantiles_within_the_relative_error_bound(distribution: object, max_buckets: int) -> None:
    rng = random.Random(7)
    values = distribution(rng, 5000)  # type: ignore[operator]
    histogram = ExpHistogram.from_values(values, max_buckets=max_buckets)
    bound = relative_error_bound(histogram.scale)
    exact = capacity_quantiles(values)
    for q, truth in exact.items():
        estimate = histogram.quantile(q)
        assert estimate is not None
        assert abs(estimate - truth) <= bound * truth * (1 + 1e-9) + 1e-300, (q, estimate, truth, bound)


def test_default_buckets_meet_the_one_percent_target_over_ofu_range() -> None:
    # 640 buckets keep scale 6 (bound 0.54%) for OFU in [0.001, 1]: the 1% target.
    values = [0.001, 1.0, *np.linspace(0.001, 1.0, 1000).tolist()]
    histogram = ExpHistogram.from_values(values, max_buckets=640)
    assert histogram.scale >= 6
    assert relative_error_bound(histogram.scale) < 0.01


@pytest.mark.parametrize("shards", [2, 8, 32])
def test_merge_of_shards_equals_one_histogram(shards: int) -> None:
    rng = random.Random(shards)
    values = _bimodal(rng, 4000)
    parts: list[list[float]] = [[] for _ in range(shards)]
    for value in values:
        parts[rng.randrange(shards)].append(value)
    merged = ExpHistogram()
    for part in parts:
        merged = merged.merge(ExpHistogram.from_values(part, max_buckets=640), max_buckets=640)
    whole = ExpHistogram.from_values(values, max_buckets=640)
    assert (merged.scale, merged.offset, merged.counts, merged.zero_count) == (
        whole.scale,
        whole.offset,
        whole.counts,
        whole.zero_count,
    )
    bound = relative_error_bound(merged.scale)
    for q, truth in capacity_quantiles(values).items():
        estimate = merged.quantile(q)
        assert estimate is not None
        assert abs(estimate - truth) <= bound * truth * (1 + 1e-9)


@settings(max_examples=200)
@given(st.lists(ofu_values, min_size=1, max_size=80), st.sampled_from(names.QUANTILES))
def test_plain_percentile_is_numpy_linear(values: list[float], q: float) -> None:
    ordered = sorted(values)
    assert percentile_of_sorted(ordered, q) == pytest.approx(float(np.percentile(values, q * 100)), abs=1e-15)


# An exact tie: 128 of 256 fifty-sixths at 0.0, so p50 is 0.0; numpy's float running sum lands under the half
# there and gives 0.5, hence the exact reference.
_TIE = [(0.0, 1), (0.0, 1), (0.0, 1), (0.0, 13), (0.0, 56), (0.0, 56), (0.5, 56), (1.0, 1), (1.0, 1), (1.0, 1)]
_TIE += [(1.0, 11), (1.0, 29), (1.0, 29)]


@settings(max_examples=300)
@given(
    st.lists(st.tuples(ofu_values, st.integers(min_value=1, max_value=56)), min_size=1, max_size=60),
    st.sampled_from(names.QUANTILES),
)
@example(_TIE, 0.5)
def test_capacity_percentile_is_the_inverted_cdf_of_capacity(pairs: list[tuple[float, int]], q: float) -> None:
    # Weights in 1/56 GPU-equivalents (sevenths and eighths: MIG slices and AMD partitions) stand for capacity; the
    # reference is the definition (numpy's weighted quantile, method="inverted_cdf") in exact fractions. numpy on
    # the float weights agrees everywhere but at an exact tie.
    pairs = sorted(pairs)
    values = [value for value, _units in pairs]
    weights = [units / 56 for _value, units in pairs]
    target = Fraction(str(q)) * sum(units for _value, units in pairs)
    running = list(itertools.accumulate(units for _value, units in pairs))
    expected = next(value for value, reached in zip(values, running, strict=True) if reached >= target)
    assert capacity_quantile_of_sorted(values, weights, q) == expected
    if float(np.quantile(values, q, weights=weights, method="inverted_cdf")) != expected:
        assert target in running


@settings(max_examples=200)
@given(st.lists(ofu_values, min_size=1, max_size=80), st.sampled_from(names.QUANTILES), buckets)
def test_histogram_quantile_within_bound_for_any_data(values: list[float], q: float, max_buckets: int) -> None:
    histogram = ExpHistogram.from_values(values, max_buckets=max_buckets)
    truth = capacity_quantiles(values, quantiles=(q,))[q]
    estimate = histogram.quantile(q)
    assert estimate is not None
    assert abs(estimate - truth) <= relative_error_bound(histogram.scale) * truth * (1 + 1e-9) + 1e-300


@settings(max_examples=200)
@given(
    st.lists(st.tuples(ofu_values, st.integers(min_value=0, max_value=10**7)), min_size=1, max_size=60),
    st.sampled_from(names.QUANTILES),
    buckets,
)
def test_a_capacity_histogram_reads_the_capacity_percentile_within_its_bound(
    pairs: list[tuple[float, int]], q: float, max_buckets: int
) -> None:
    pairs.sort()
    values = [value for value, _count in pairs]
    counts = [count for _value, count in pairs]
    histogram = ExpHistogram.from_sorted(values, max_buckets=max_buckets, counts=counts)
    if not any(counts):
        assert histogram.quantile(q) is None
        return
    truth = capacity_quantiles(values, [float(c) for c in counts], quantiles=(q,))[q]
    estimate = histogram.quantile(q)
    assert estimate is not None
    assert abs(estimate - truth) <= relative_error_bound(histogram.scale) * truth * (1 + 1e-9) + 1e-300


def test_invalid_layouts_are_refused() -> None:
    with pytest.raises(ValueError, match="scale"):
        ExpHistogram(scale=21)
    with pytest.raises(ValueError, match="float range"):
        ExpHistogram(scale=0, offset=5000, counts=(1,))
    with pytest.raises(ValueError, match=">= 0"):
        ExpHistogram(counts=(1, -1))
