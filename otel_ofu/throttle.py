"""Power, energy and clock throttling of one GPU over an interval: the pure math every source shares.

- Throttle shares: the part of the interval the SM clock was held down, per ``gpu.throttle.reason``.
  From violation-time counters where the source has them (delta of violation time / interval), else
  from the clocks-event-reasons bitmask sampled through the interval (share of samples with a bit of
  that reason set). A reason without either is absent, never 0.
- Energy: the board's energy counter becomes energy since a start time (a cumulative sum whose start
  is when the source first read the counter, restarted when the counter goes back, as after a driver
  reload), and power over the interval is the counter's delta over the time between its reads.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import TypeVar

import attrs

from otel_ofu import names
from otel_ofu.model import EnergyCounter

# A share computed from counters may exceed 1 by timing jitter (the counter and our clock are read
# apart); beyond this much over, the counter does not describe the interval and is not used.
SHARE_TOLERANCE = 0.05

K = TypeVar("K")


def reasons_of(bitmask: int) -> frozenset[str]:
    """The throttle reasons whose bits are set in a clocks-event-reasons bitmask (GPU idle is none)."""
    return frozenset(reason for bit, reason in names.CLOCKS_EVENT_REASON_BITS.items() if bitmask & bit)


def bitmask_shares(samples: Iterable[int]) -> dict[str, float]:
    """Share of the samples with each reason's bit set; every reason when there are samples, else none."""
    counts = dict.fromkeys(names.ThrottleReason.ALL, 0)
    total = 0
    for sample in samples:
        total += 1
        for reason in reasons_of(sample):
            counts[reason] += 1
    if total == 0:
        return {}
    return {reason: count / total for reason, count in counts.items()}


def violation_shares(deltas_ns: Mapping[str, float], interval_ns: float) -> dict[str, float]:
    """Reason -> violation time / interval from per-reason counter deltas (ns) already summed by reason.

    A negative delta (a counter that went back) or an interval that is not positive gives nothing for
    that reason; a share slightly over 1 from jitter is 1, far over it is left out.
    """
    if interval_ns <= 0:
        return {}
    shares: dict[str, float] = {}
    for reason, delta in deltas_ns.items():
        if delta < 0:
            continue
        share = delta / interval_ns
        if share > 1.0 + SHARE_TOLERANCE:
            continue
        shares[reason] = min(share, 1.0)
    return shares


def merge_shares(counters: Mapping[str, float], bitmask: Mapping[str, float]) -> dict[str, float]:
    """Counter shares where there are counters, the bitmask's for the reasons without one."""
    merged = dict(bitmask)
    merged.update(counters)
    return {reason: merged[reason] for reason in names.ThrottleReason.ALL if reason in merged}


@attrs.define
class ViolationTracker:
    """Turns cumulative violation counters (ns, per reason) into per-interval shares, per GPU.

    A counter read for the first time only sets the baseline. Counters that map to the same reason are
    summed before the share is taken (and the share is capped at the interval).
    """

    _last: dict[str, tuple[dict[str, float], int]] = attrs.field(factory=dict)

    def update(self, key: str, counters_ns: Mapping[str, float], time_ns: int) -> dict[str, float]:
        """Shares over the span since the previous update of this GPU; empty the first time."""
        current = dict(counters_ns)
        previous = self._last.get(key)
        self._last[key] = (current, time_ns)
        if previous is None:
            return {}
        before, before_ns = previous
        deltas = {reason: value - before[reason] for reason, value in current.items() if reason in before}
        return violation_shares(deltas, time_ns - before_ns)

    def forget(self, keep: Iterable[str]) -> None:
        kept = set(keep)
        for key in [key for key in self._last if key not in kept]:
            del self._last[key]


def sum_by_reason(counters: Mapping[K, float], reasons: Mapping[K, str]) -> dict[str, float]:
    """Counter values keyed by policy or field, summed into their reasons (ids without a reason dropped)."""
    summed: dict[str, float] = {}
    for key, value in counters.items():
        reason = reasons.get(key)
        if reason is not None:
            summed[reason] = summed.get(reason, 0.0) + value
    return summed


@attrs.frozen
class EnergyObservation:
    """What one read of a board energy counter gives: energy since the start, and power where it can."""

    energy: EnergyCounter
    power_w: float | None  # counter delta / time between reads; None on the first read or a reset
    stale: bool = False  # the counter had not moved since the previous read: the source did not refresh it


@attrs.define
class EnergyTracker:
    """Per GPU: the first counter value seen (and when), and the previous one for power.

    A counter that did not move since the previous read is a value the source has not refreshed yet
    (an idle board still draws tens of watts), so no power is derived from it; a counter that went back
    restarts the cumulative sum with a new start time.
    """

    _first: dict[str, tuple[float, int]] = attrs.field(factory=dict)
    _previous: dict[str, tuple[float, int]] = attrs.field(factory=dict)

    def update(self, key: str, counter_j: float, time_ns: int) -> EnergyObservation:
        first = self._first.get(key)
        previous = self._previous.get(key)
        if first is None or previous is None or counter_j < previous[0]:
            self._first[key] = first = (counter_j, time_ns)
            self._previous[key] = (counter_j, time_ns)
            return EnergyObservation(EnergyCounter(0.0, time_ns), None)
        power: float | None = None
        if counter_j > previous[0] and time_ns > previous[1]:
            power = (counter_j - previous[0]) / ((time_ns - previous[1]) / 1e9)
            self._previous[key] = (counter_j, time_ns)
        stale = counter_j == previous[0]
        return EnergyObservation(EnergyCounter(counter_j - first[0], first[1]), power, stale)

    def forget(self, keep: Iterable[str]) -> None:
        kept = set(keep)
        for table in (self._first, self._previous):
            for key in [key for key in table if key not in kept]:
                del table[key]


def interval_power(observation: EnergyObservation | None, instantaneous_w: float | None) -> float | None:
    """Power over the interval from the energy counter where it gives one, else the instantaneous reading."""
    if observation is not None and observation.power_w is not None:
        return observation.power_w
    return valid_power(instantaneous_w)


def valid_power(watts: float | None) -> float | None:
    """A power reading, or None when it cannot be one (negative, NaN, infinite)."""
    if watts is None or not math.isfinite(watts) or watts < 0:
        return None
    return float(watts)
