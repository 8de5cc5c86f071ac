"""Merge mode: combine the window outputs of job-sharded collector replicas into fleet-wide windows.

Shards are split by ``job.id`` (the otelcol loadbalancing exporter), so every job lives on one shard and its
``job.*`` outputs pass through untouched (the transport forwards them; ``otlp.partials.is_partial_metric`` says
which metrics are not to be forwarded). What spans shards merges exactly: the per-group exponential
histograms (any scales: the merge downscales to the common one), the GPU counts, and the fleet co-moments
and |OFU - MFU| sums, and the fleet's loss totals (lost GPU-time and cost by cause, energy: sums).
Quantiles are then read from the merged histogram, within
``exphist.relative_error_bound(scale)`` of the exact ones a single process would report.

A window is identified by its end time; the same shard sending the same group or fleet state twice for a
window (an export retry) replaces its earlier copy instead of counting twice. Partials without a shard id
cannot be told apart and are all added.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

import attrs

from otel_ofu import names
from otel_ofu_collector.config import AggregatorConfig
from otel_ofu_collector.results import FleetLoss, FleetReport, GroupReport, PartialGroup, PartialWindow, WindowReport
from otel_ofu_collector.stats.comoments import CoMoments
from otel_ofu_collector.stats.exphist import ExpHistogram

# Windows the merge tier keeps open at once; a live deployment has one or two, so this only stops a
# flood of made-up timestamps from growing the state.
MAX_OPEN_WINDOWS = 1024


@attrs.frozen
class MergeStats:
    partials: int = 0
    late_partials: int = 0
    rejected_window_cap: int = 0
    replaced_partials: int = 0
    windows_closed: int = 0


_GroupKey = tuple[tuple[str, str], ...]


@attrs.define
class _Fleet:
    comoments: CoMoments
    abs_diff_sum: float
    jobs: int


@attrs.define
class _MergeWindow:
    start_ns: int
    groups: dict[tuple[str, _GroupKey], PartialGroup] = attrs.field(factory=dict)
    fleets: dict[str, _Fleet] = attrs.field(factory=dict)
    losses: dict[str, FleetLoss] = attrs.field(factory=dict)  # by shard


@attrs.define
class MergeAggregator:
    """Collects shards' partial windows and closes merged windows on ``flush(now_ns)``, like ``Aggregator``."""

    config: AggregatorConfig
    # Guards the merge state: whoever calls it (the decoder per request, the service's flush) holds it.
    lock: threading.Lock = attrs.field(init=False, factory=threading.Lock)
    _windows: dict[int, _MergeWindow] = attrs.field(init=False, factory=dict)  # by end_ns
    _watermark_ns: int = attrs.field(init=False, default=0)
    _flushed_ns: int | None = attrs.field(init=False, default=None)
    _anonymous: int = attrs.field(init=False, default=0)
    _partials: int = attrs.field(init=False, default=0)
    _late: int = attrs.field(init=False, default=0)
    _rejected: int = attrs.field(init=False, default=0)
    _replaced: int = attrs.field(init=False, default=0)
    _closed: int = attrs.field(init=False, default=0)

    @property
    def watermark_ns(self) -> int:
        return self._watermark_ns

    @property
    def stats(self) -> MergeStats:
        return MergeStats(self._partials, self._late, self._rejected, self._replaced, self._closed)

    def add_partial(self, partial: PartialWindow) -> str | None:
        """Take one shard's part of a window: None when taken, else why not (counted): its window already closed,
        or too many windows open."""
        end = partial.end_ns
        if self._flushed_ns is not None and end + self.config.lateness_ns <= self._flushed_ns:
            self._late += 1
            return names.RejectReason.LATE
        window = self._windows.get(end)
        if window is None:
            if len(self._windows) >= MAX_OPEN_WINDOWS:
                self._rejected += 1
                return names.RejectReason.MAX_STATE
            start = partial.start_ns if 0 < partial.start_ns < end else end - self.config.window_ns
            window = self._windows[end] = _MergeWindow(start)
        if end > self._watermark_ns:
            self._watermark_ns = end
        shard = partial.shard_id
        if not shard:
            self._anonymous += 1
            shard = f"\x00anonymous-{self._anonymous}"
        for group in partial.groups:
            key = (shard, tuple(sorted(group.attributes.items())))
            if key in window.groups:
                self._replaced += 1
            window.groups[key] = group
        if partial.fleet_comoments is not None:
            if shard in window.fleets:
                self._replaced += 1
            window.fleets[shard] = _Fleet(partial.fleet_comoments, partial.abs_diff_sum, partial.jobs_count)
        if partial.fleet_loss is not None:
            if shard in window.losses:
                self._replaced += 1
            window.losses[shard] = partial.fleet_loss
        self._partials += 1
        return None

    def flush(self, now_ns: int) -> list[WindowReport]:
        """Close, in time order, every window with end + lateness <= now_ns."""
        if self._flushed_ns is None or now_ns > self._flushed_ns:
            self._flushed_ns = now_ns
        limit = self._flushed_ns - self.config.lateness_ns
        return [self._close(end) for end in sorted(self._windows) if end <= limit]

    def close_all(self) -> list[WindowReport]:
        reports = [self._close(end) for end in sorted(self._windows)]
        if reports:
            closed_at = reports[-1].end_ns + self.config.lateness_ns
            if self._flushed_ns is None or closed_at > self._flushed_ns:
                self._flushed_ns = closed_at
        return reports

    def _close(self, end: int) -> WindowReport:
        window = self._windows.pop(end)
        max_buckets = self.config.histogram_max_buckets
        merged: dict[_GroupKey, tuple[ExpHistogram, float]] = {}
        for (_shard, key), group in sorted(window.groups.items(), key=lambda item: item[0]):
            histogram, gpus = merged.get(key, (ExpHistogram(), 0.0))
            merged[key] = (histogram.merge(group.histogram, max_buckets=max_buckets), gpus + group.gpus)
        group_keys = self.config.group_keys

        def order(item: tuple[_GroupKey, tuple[ExpHistogram, float]]) -> tuple[tuple[str, ...], _GroupKey]:
            attributes = dict(item[0])  # as a single collector orders them: by the group keys' values
            return tuple(attributes.get(key, "") for key in group_keys), item[0]

        groups = tuple(
            _group_report(dict(key), histogram, gpus) for key, (histogram, gpus) in sorted(merged.items(), key=order)
        )
        comoments = CoMoments()
        abs_diff_sum = 0.0
        jobs = 0
        for _shard, fleet in sorted(window.fleets.items(), key=lambda item: item[0]):
            comoments = comoments.merge(fleet.comoments)
            abs_diff_sum += fleet.abs_diff_sum
            jobs += fleet.jobs
        loss = FleetLoss()
        for _shard, part in sorted(window.losses.items(), key=lambda item: item[0]):
            loss = loss.merge(part)
        fleet_report = FleetReport(
            correlation=comoments.pearson(),
            mae=abs_diff_sum / jobs if jobs else None,
            jobs=jobs,
            comoments=comoments,
            abs_diff_sum=abs_diff_sum,
            loss=loss,
        )
        self._closed += 1
        return WindowReport(window.start_ns, end, groups, (), fleet_report)


def _group_report(attributes: Mapping[str, str], histogram: ExpHistogram, gpus: float) -> GroupReport:
    quantiles = {q: value for q in names.QUANTILES if (value := histogram.quantile(q)) is not None}
    return GroupReport(
        attributes=attributes,
        gpus=gpus,
        quantiles=quantiles,
        histogram=histogram,
        ofu_sum=histogram.sum,
        ofu_min=histogram.min if histogram.min is not None else 0.0,
        ofu_max=histogram.max if histogram.max is not None else 0.0,
    )
