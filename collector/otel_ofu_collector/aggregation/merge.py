"""Merge mode: combine the partial windows of job-sharded collector replicas into fleet-wide windows.

Shards are split by ``job.id`` (the otelcol loadbalancing exporter), so a job nearly always lives on one shard; but
when the load balancer's ring changes (a shard added, restarted or gone) a job's points move to another shard, and
for that window the job is on two. So nothing of a job is taken from one shard as final: each shard sends its part of
every job's window as sums (``results.JobWindow``), the merge tier adds the parts of a job from every shard it was on
(by ``job.id``) and closes the job's window once, with a job ledger of its own (``aggregation.jobs``: the job's flags,
its correlation horizon, the fleet's correlation and MAE over the jobs), exactly as one collector would have.

What spans shards merges exactly too: per group the exponential histograms (any scales: the merge downscales to the
common one), the capacity histograms the percentiles are read from (within ``exphist.relative_error_bound(scale)``
of the exact ones a single process reports), the GPU equivalents (GPU-seconds over the window's: a GPU that moved
shard half way counts half on each), and the fleet's loss totals (sums).

A window is identified by its end time; the same shard sending the same group, job or fleet state twice for a window
(an export retry) replaces its earlier copy instead of counting twice. Partials without a shard id cannot be told
apart and are all added.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

import attrs

from otel_ofu import names
from otel_ofu_collector.aggregation.jobs import JobLedger
from otel_ofu_collector.config import AggregatorConfig
from otel_ofu_collector.results import (
    FleetLoss,
    GroupReport,
    JobReport,
    JobWindow,
    PartialGroup,
    PartialWindow,
    WindowReport,
)
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
    rejected_job_cap: int = 0
    evicted_jobs: int = 0


_GroupKey = tuple[tuple[str, str], ...]


@attrs.define
class _MergeWindow:
    start_ns: int
    groups: dict[tuple[str, _GroupKey], PartialGroup] = attrs.field(factory=dict)
    losses: dict[str, FleetLoss] = attrs.field(factory=dict)  # by shard
    jobs: dict[tuple[str, str], JobWindow] = attrs.field(factory=dict)  # by (job.id, shard)


@attrs.define
class MergeAggregator:
    """Collects shards' partial windows and closes merged windows on ``flush(now_ns)``, like ``Aggregator``."""

    config: AggregatorConfig
    # Guards the merge state: whoever calls it (the decoder per request, the service's flush) holds it.
    lock: threading.Lock = attrs.field(init=False, factory=threading.Lock)
    _windows: dict[int, _MergeWindow] = attrs.field(init=False, factory=dict)  # by end_ns
    _ledger: JobLedger = attrs.field(init=False)
    _watermark_ns: int = attrs.field(init=False, default=0)
    _flushed_ns: int | None = attrs.field(init=False, default=None)
    _anonymous: int = attrs.field(init=False, default=0)
    _partials: int = attrs.field(init=False, default=0)
    _late: int = attrs.field(init=False, default=0)
    _rejected: int = attrs.field(init=False, default=0)
    _replaced: int = attrs.field(init=False, default=0)
    _closed: int = attrs.field(init=False, default=0)

    def __attrs_post_init__(self) -> None:
        self._ledger = JobLedger(self.config)

    @property
    def watermark_ns(self) -> int:
        return self._watermark_ns

    @property
    def stats(self) -> MergeStats:
        ledger = self._ledger
        return MergeStats(
            self._partials, self._late, self._rejected, self._replaced, self._closed, ledger.rejected, ledger.evicted
        )

    @property
    def jobs(self) -> int:
        """Jobs in state: live ones and evicted ones whose horizon blocks still count for the fleet."""
        return len(self._ledger.jobs)

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
        if partial.fleet_loss is not None:
            if shard in window.losses:
                self._replaced += 1
            window.losses[shard] = partial.fleet_loss
        for job_id, part in partial.jobs.items():
            if (job_id, shard) in window.jobs:
                self._replaced += 1
            window.jobs[(job_id, shard)] = part
        self._partials += 1
        return None

    def flush(self, now_ns: int) -> list[WindowReport]:
        """Close, in time order, every window with end + lateness <= now_ns; then let go of jobs gone silent."""
        if self._flushed_ns is None or now_ns > self._flushed_ns:
            self._flushed_ns = now_ns
        limit = self._flushed_ns - self.config.lateness_ns
        reports = [self._close(end) for end in sorted(self._windows) if end <= limit]
        self._ledger.evict(min(self._watermark_ns, self._flushed_ns))
        return reports

    def close_all(self, now_ns: int | None = None) -> list[WindowReport]:  # now_ns: as Aggregator.close_all
        reports = [self._close(end) for end in sorted(self._windows)]
        if reports:
            closed_at = reports[-1].end_ns + self.config.lateness_ns
            if self._flushed_ns is None or closed_at > self._flushed_ns:
                self._flushed_ns = closed_at
        return reports

    def _close(self, end: int) -> WindowReport:
        window = self._windows.pop(end)
        max_buckets = self.config.histogram_max_buckets
        merged: dict[_GroupKey, tuple[ExpHistogram, ExpHistogram | None, float]] = {}
        for (_shard, key), group in sorted(window.groups.items(), key=lambda item: item[0]):
            histogram, capacity, gpus = merged.get(key, (ExpHistogram(), ExpHistogram(), 0.0))
            if capacity is not None and group.capacity is not None:
                capacity = capacity.merge(group.capacity, max_buckets=max_buckets)
            else:
                capacity = None  # a shard without capacity: the observations are all there is
            merged[key] = (histogram.merge(group.histogram, max_buckets=max_buckets), capacity, gpus + group.gpus)
        group_keys = self.config.group_keys

        def order(
            item: tuple[_GroupKey, tuple[ExpHistogram, ExpHistogram | None, float]],
        ) -> tuple[tuple[str, ...], _GroupKey]:
            attributes = dict(item[0])  # as a single collector orders them: by the group keys' values
            return tuple(attributes.get(key, "") for key in group_keys), item[0]

        groups = tuple(
            _group_report(dict(key), histogram, capacity, gpus)
            for key, (histogram, capacity, gpus) in sorted(merged.items(), key=order)
        )
        jobs = self._close_jobs(window.start_ns, end, window.jobs)
        loss = FleetLoss()
        for _shard, part in sorted(window.losses.items(), key=lambda item: item[0]):
            loss = loss.merge(part)
        fleet = attrs.evolve(self._ledger.fleet(end), loss=loss)
        self._closed += 1
        return WindowReport(window.start_ns, end, groups, jobs, fleet)

    def _close_jobs(self, start: int, end: int, parts: Mapping[tuple[str, str], JobWindow]) -> tuple[JobReport, ...]:
        """Each job's parts from every shard it was on, added up (in shard order) and closed once."""
        by_job: dict[str, JobWindow] = {}
        for (job_id, _shard), part in sorted(parts.items()):
            found = by_job.get(job_id)
            by_job[job_id] = part if found is None else found.merge(part)
        reports: list[JobReport] = []
        ledger = self._ledger
        for job_id, part in sorted(by_job.items()):
            job = ledger.admit(job_id, end)
            if job is None:  # over max_jobs (counted)
                continue
            reports.append(ledger.close(job_id, job, start, end, part))
        return tuple(reports)


def _group_report(
    attributes: Mapping[str, str], histogram: ExpHistogram, capacity: ExpHistogram | None, gpus: float
) -> GroupReport:
    """A merged group: percentiles over capacity where every shard sent its capacity histogram, else over the
    observations."""
    source = capacity if capacity is not None and capacity.count else histogram
    quantiles = {q: value for q in names.QUANTILES if (value := source.quantile(q)) is not None}
    return GroupReport(
        attributes=attributes,
        gpus=gpus,
        quantiles=quantiles,
        histogram=histogram,
        ofu_sum=histogram.sum,
        ofu_min=histogram.min if histogram.min is not None else 0.0,
        ofu_max=histogram.max if histogram.max is not None else 0.0,
        capacity=capacity,
    )
