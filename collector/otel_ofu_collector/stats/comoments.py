"""Mergeable statistics for OFU-vs-MFU correlation: co-moments (Welford, Chan et al.) and mean |OFU - MFU|.

Both are sums in disguise: two shards' states merge exactly (up to float rounding) into the state of one
process that saw all the pairs, which is what lets the merge tier compute the fleet correlation.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import attrs

# Below this relative size a second moment is rounding noise from a merge, not variance.
_ZERO_VARIANCE = 1e-13


def _has_variance(n: int, mean: float, m2: float) -> bool:
    return m2 > 0.0 and m2 > _ZERO_VARIANCE * n * mean * mean


@attrs.frozen
class CoMoments:
    """Count, means, sums of squared deviations and the co-moment of (x, y) pairs."""

    n: int = 0
    mean_x: float = 0.0
    mean_y: float = 0.0
    m2_x: float = 0.0
    m2_y: float = 0.0
    c_xy: float = 0.0

    @classmethod
    def of(cls, pairs: Iterable[tuple[float, float]]) -> CoMoments:
        result = cls()
        for x, y in pairs:
            result = result.add(x, y)
        return result

    def add(self, x: float, y: float) -> CoMoments:
        """Welford's update with one pair."""
        n = self.n + 1
        dx = x - self.mean_x
        mean_x = self.mean_x + dx / n
        mean_y = self.mean_y + (y - self.mean_y) / n
        return CoMoments(
            n,
            mean_x,
            mean_y,
            self.m2_x + dx * (x - mean_x),
            self.m2_y + (y - self.mean_y) * (y - mean_y),
            self.c_xy + dx * (y - mean_y),
        )

    def merge(self, other: CoMoments) -> CoMoments:
        """Chan et al.'s pairwise combination: the state of both sets of pairs together."""
        if other.n == 0:
            return self
        if self.n == 0:
            return other
        n = self.n + other.n
        dx = other.mean_x - self.mean_x
        dy = other.mean_y - self.mean_y
        weight = self.n * other.n / n
        return CoMoments(
            n,
            self.mean_x + dx * other.n / n,
            self.mean_y + dy * other.n / n,
            self.m2_x + other.m2_x + dx * dx * weight,
            self.m2_y + other.m2_y + dy * dy * weight,
            self.c_xy + other.c_xy + dx * dy * weight,
        )

    def pearson(self) -> float | None:
        """Pearson r, or None where it is undefined: fewer than 2 pairs or a series without variance."""
        if self.n < 2:
            return None
        if not (_has_variance(self.n, self.mean_x, self.m2_x) and _has_variance(self.n, self.mean_y, self.m2_y)):
            return None
        # Square roots taken apart: the product of two tiny variances can underflow to 0.
        scale = math.sqrt(self.m2_x) * math.sqrt(self.m2_y)
        if scale == 0.0:
            return None
        return max(-1.0, min(1.0, self.c_xy / scale))


@attrs.frozen
class AbsDiff:
    """Count and sum of |x - y|: the mean absolute error, mergeable by adding."""

    n: int = 0
    total: float = 0.0

    def add(self, x: float, y: float) -> AbsDiff:
        return AbsDiff(self.n + 1, self.total + abs(x - y))

    def merge(self, other: AbsDiff) -> AbsDiff:
        return AbsDiff(self.n + other.n, self.total + other.total)

    def mean(self) -> float | None:
        return self.total / self.n if self.n else None
