"""Cumulative counters (a GPU's energy, its NVLink and PCIe bytes): each reading's delta since the stream's last one.

A counter is sent as its total since its series began (the sum's start time). Each stream's latest reading per field
is the baseline of the next delta; a delta is booked over the time since that reading, split over the windows it
overlaps by the caller. What is refused (a counter running backwards or faster than a GPU can) leaves the baseline as
it was, so that one poisoned reading never becomes the baseline every later one is measured against.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from otel_ofu import names
from otel_ofu_collector.aggregation.cells import NS_PER_S
from otel_ofu_collector.config import AggregatorConfig

R = names.RejectReason
# How far a counter series' start may be from its stream's first point for the series to count as begun with it.
_SERIES_SLACK_NS = 1_000_000_000
# A reading: (series start, time, value); one with time -1 keeps nothing.
Reading = tuple[int, int, float]
NOTHING: Reading = (0, -1, 0.0)


@attrs.define
class CounterBaselines:
    config: AggregatorConfig
    first_starts: Mapping[str, int]  # each stream's first point's start here (``streams.StreamTable``)
    # Each cumulative counter's latest reading by stream, by field (gpu.energy, gpu.nvlink.io|transmit, ...).
    _latest: dict[str, dict[str, Reading]] = attrs.field(factory=dict)
    rejected_streams: int = 0  # new streams' first readings refused over max_streams

    def delta(
        self, field: str, max_rate: float, stream_key: str, series_start: int, end_ns: int, value: float
    ) -> tuple[float, int, Reading] | str:
        """What one reading of a stream's cumulative counter books: (amount, since, reading to keep): the delta over
        (since, end], and the reading the caller keeps (``keep``) once the stream's whole reading is taken; a
        ``names.RejectReason`` code when refused.

        The delta is since the stream's previous reading of the same series (start time). A first reading (or one of a
        new series: a driver reload) counts whole only when its series is new (``_series_is_new``), else it only sets
        the baseline (a collector restarting mid-series must not book a day's energy into one window). A retry of the
        latest reading books nothing; an older reading arriving after a newer one (a load balancer's parallel exports
        reorder) is already inside the newer delta. A counter that runs backwards within its series, or faster than a
        GPU can (``max_rate``, from ``otel_ofu.bounds.MAX_RATES``), is refused; so is one holding more than its
        series' age at that rate."""
        states = self._latest.get(field)
        previous = states.get(stream_key) if states is not None else None
        if previous is None and states is not None and len(states) >= self.config.max_streams:
            self.rejected_streams += 1
            return R.MAX_STREAMS
        keep = (series_start, end_ns, value)
        if not 0.0 <= value <= max_rate * max(end_ns - series_start, 0) / NS_PER_S:
            return R.IMPLAUSIBLE
        if previous is not None:
            previous_start, previous_end, previous_value = previous
            if end_ns <= previous_end:
                return 0.0, end_ns, NOTHING
            if previous_start == series_start:
                delta = value - previous_value
                if not 0.0 <= delta <= max_rate * (end_ns - previous_end) / NS_PER_S:
                    return R.IMPLAUSIBLE  # running backwards, or faster than a GPU can
                return delta, previous_end, keep
        if not 0 < series_start < end_ns or not self._series_is_new(stream_key, series_start, end_ns):
            return 0.0, end_ns, keep
        return value, series_start, keep

    def keep(self, field: str, stream_key: str, reading: Reading) -> None:
        if reading[1] >= 0:
            self._latest.setdefault(field, {})[stream_key] = reading

    def _series_is_new(self, stream_key: str, series_start: int, end_ns: int) -> bool:
        """Whether a counter series first read at ``end_ns`` began while this collector was taking its stream, so that
        its whole count is this collector's to book. One that began before (a collector restarted mid-series, a job
        moved here from another shard) only sets the baseline: its whole count would book hours of energy into one
        window, or energy another shard booked; the GPU's power covers that interval instead
        (``cells.GpuInputs.energy``)."""
        first = self.first_starts.get(stream_key)
        if first is None:  # no point of the stream yet: new when it began within a window of this reading
            return end_ns - series_start <= self.config.window_ns
        # The series began with the stream's first point here (a producer's first interval starts when its counters
        # do) or after it (a driver reload reset the counter): this collector has seen all of it. One that began
        # before saw only the rest here.
        return series_start >= first - _SERIES_SLACK_NS

    def evict(self, cutoff_ns: int) -> None:
        """Let go of the baselines of streams unseen since ``cutoff_ns``."""
        for states in self._latest.values():
            for key in [key for key, (_start, seen, _value) in states.items() if seen <= cutoff_ns]:
                del states[key]
