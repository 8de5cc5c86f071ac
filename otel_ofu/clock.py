"""Clocks: nanoseconds since the Unix epoch, injectable so simulated time can run faster than wall time.

Every service takes a ``model.Clock`` (a callable returning ns). Production passes ``wall_clock``;
tests, the demo and the studies pass a ``ManualClock`` and advance it themselves, never sleeping.
"""

from __future__ import annotations

import math
import time

import attrs

# 2026-01-01T00:00:00Z: a fixed, realistic epoch so simulated timestamps look like real ones.
DEFAULT_START_NS = 1_767_225_600 * 1_000_000_000


def wall_clock() -> int:
    """The real time in ns since the Unix epoch."""
    return time.time_ns()


@attrs.frozen
class ScaledClock:
    """Wall time that runs ``speed`` times faster from its origin (now, unless given): a simulated fleet's clock."""

    speed: float
    origin_ns: int = attrs.field(factory=time.time_ns)

    def __attrs_post_init__(self) -> None:
        if not (math.isfinite(self.speed) and self.speed > 0):
            raise ValueError(f"a clock's speed must be a positive number, got {self.speed!r}")

    def __call__(self) -> int:
        return self.origin_ns + int((time.time_ns() - self.origin_ns) * self.speed)


@attrs.define
class ManualClock:
    """A clock that moves only when told to; satisfies ``model.Clock`` by being callable."""

    _now_ns: int = attrs.field(default=DEFAULT_START_NS, alias="start_ns")

    def now(self) -> int:
        return self._now_ns

    def __call__(self) -> int:
        return self._now_ns

    def advance(self, seconds: float) -> int:
        """Move forward by ``seconds`` (>= 0) and return the new time; time never runs backwards."""
        if not math.isfinite(seconds) or seconds < 0.0:
            raise ValueError(f"a clock only advances by a finite, non-negative amount, got {seconds!r}")
        self._now_ns += round(seconds * 1e9)
        return self._now_ns

    def set(self, now_ns: int) -> None:
        """Jump to ``now_ns``, which must not be earlier than the current time."""
        if now_ns < self._now_ns:
            raise ValueError(f"a clock does not run backwards ({now_ns} < {self._now_ns})")
        self._now_ns = now_ns
