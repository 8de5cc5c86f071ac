"""Co-moments and |OFU - MFU| sums: agree with numpy, and merging equals adding one pair at a time."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from otel_ofu_collector.stats.comoments import AbsDiff, CoMoments

unit = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)
pairs = st.lists(st.tuples(unit, unit), max_size=50)


def _close(a: CoMoments, b: CoMoments, tol: float = 1e-12) -> None:
    assert a.n == b.n
    for field in ("mean_x", "mean_y", "m2_x", "m2_y", "c_xy"):
        assert getattr(a, field) == pytest.approx(getattr(b, field), rel=tol, abs=tol), field


@settings(max_examples=200)
@given(pairs)
def test_pearson_matches_numpy_corrcoef(data: list[tuple[float, float]]) -> None:
    moments = CoMoments.of(data)
    r = moments.pearson()
    if len(data) < 2:
        assert r is None
        return
    xs = np.array([x for x, _ in data])
    ys = np.array([y for _, y in data])
    if np.ptp(xs) == 0 or np.ptp(ys) == 0:
        assert r is None
        return
    if r is None:  # only near-constant series whose variance is rounding noise
        assert min(float(np.var(xs)) / max(float(np.mean(xs)) ** 2, 1e-300), 1.0) < 1e-12 or (
            float(np.var(ys)) / max(float(np.mean(ys)) ** 2, 1e-300) < 1e-12
        )
        return
    # A sum of squares below the smallest normal float keeps only its bits above 2**-1074 (values of ~1e-160
    # square into that range): r is only that exact, in numpy's computation as in ours.
    coarse = max(math.ulp(0.0) / m2 for m2 in (moments.m2_x, moments.m2_y))
    assert r == pytest.approx(float(np.corrcoef(xs, ys)[0, 1]), abs=1e-9 + 4 * coarse)
    assert moments.mean_x == pytest.approx(float(xs.mean()), abs=1e-12)
    assert moments.m2_y == pytest.approx(float(((ys - ys.mean()) ** 2).sum()), abs=1e-12)


@settings(max_examples=200)
@given(pairs, pairs, pairs)
def test_merge_equals_sequential(
    a: list[tuple[float, float]], b: list[tuple[float, float]], c: list[tuple[float, float]]
) -> None:
    whole = CoMoments.of(a + b + c)
    merged = CoMoments.of(a).merge(CoMoments.of(b)).merge(CoMoments.of(c))
    _close(merged, whole)
    _close(CoMoments.of(c).merge(CoMoments.of(a).merge(CoMoments.of(b))), whole)  # order does not matter


def test_undefined_correlation_is_none() -> None:
    assert CoMoments().pearson() is None
    assert CoMoments().add(0.3, 0.4).pearson() is None
    assert CoMoments.of([(0.3, 0.1), (0.3, 0.9), (0.3, 0.5)]).pearson() is None  # OFU without variance
    assert CoMoments.of([(0.1, 0.4), (0.2, 0.4)]).pearson() is None  # MFU without variance


def test_perfect_correlations() -> None:
    assert CoMoments.of([(0.1, 0.2), (0.2, 0.4), (0.3, 0.6)]).pearson() == pytest.approx(1.0)
    assert CoMoments.of([(0.1, 0.6), (0.2, 0.4), (0.3, 0.2)]).pearson() == pytest.approx(-1.0)


def test_merging_empty_is_identity() -> None:
    moments = CoMoments.of([(0.1, 0.2), (0.5, 0.3)])
    assert moments.merge(CoMoments()) == moments
    assert CoMoments().merge(moments) == moments


@given(pairs, pairs)
def test_abs_diff_mean_and_merge(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> None:
    left = AbsDiff()
    for x, y in a:
        left = left.add(x, y)
    right = AbsDiff()
    for x, y in b:
        right = right.add(x, y)
    merged = left.merge(right)
    everything = a + b
    assert merged.n == len(everything)
    if everything:
        assert merged.mean() == pytest.approx(float(np.mean([abs(x - y) for x, y in everything])), abs=1e-12)
    else:
        assert merged.mean() is None


def test_pearson_of_vanishing_variances_is_the_r_of_the_unscaled_points() -> None:
    # Each variance is representable, their product underflows to 0.0; r is scale-free, so the tiny points
    # must correlate exactly as the same points scaled up by 1e83 do.
    unscaled = [(0.0, 0.0), (1.0, 2.0), (3.0, 1.0)]
    expected = CoMoments.of(unscaled).pearson()
    xs, ys = [x for x, _ in unscaled], [y for _, y in unscaled]
    assert expected == pytest.approx(float(np.corrcoef(xs, ys)[0, 1]))
    r = CoMoments.of([(x * 1e-83, y * 1e-83) for x, y in unscaled]).pearson()
    assert r == pytest.approx(expected, rel=1e-12)
