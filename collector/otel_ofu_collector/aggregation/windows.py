"""Tumbling windows over OFU and MFU points: fleet percentiles per group, per-job correlation and flags.

Pure and single-threaded: the service feeds points and calls ``flush(now_ns)``; nothing here reads a clock.

Windows. Aligned to multiples of ``window_s`` since the epoch (shards agree without talking) and closed on
the right: window (start, end] holds the points whose end time lies in it, so a producer exporting exactly
on the boundary lands in the window its interval covers. A window closes once ``end + lateness <= now``;
a point arriving for a closed window is late: counted, returned False, never mixed into a later window.

Per GPU. A GPU ("stream", the caller's key) with several points in a window counts once, with the
time-weighted mean of its points: weight = the part of the point's interval inside the window (a point
without duration weighs 1 ns, so a stream of instantaneous gauges gets the plain mean). A stream that moves
to another job inside a window counts once per job, as its points would on a job-sharded deployment; its
group and job attributes are those of its latest point.

Per job (``job.id`` of the OFU points, ``job.mfu`` by job id). Window OFU = mean over its GPUs; MFU = mean of
its ``job.mfu`` points; gap = MFU - OFU. Correlation: Pearson r of the job's (OFU, MFU) window pairs over
the horizon, kept as co-moments in blocks of whole windows (the window itself up to 1/48 of the horizon,
so the state stays small: the horizon is then honoured to within one block). Flags: every detector of
``detectors.DETECTORS`` (``flops_miscount``, ``regression``: each module says when its flag rises) judges
each of the job's windows, with state of its own per job.

Fleet. Pearson r across jobs of each job's horizon mean OFU vs horizon mean MFU (the means of its
co-moments), and the MAE of those means, over every job with a pair in the horizon - including jobs whose
live state was evicted: their co-moment blocks stay until they leave the horizon. Windows without data
are still closed and reported (fleet only) while any job has horizon data, so every shard reports every
window and the merge tier sees the whole fleet.

Bounded state. ``max_streams`` streams and ``max_jobs`` live jobs (points beyond: rejected, counted, and
``refusal`` says why the last point was refused). By event time (the watermark, and never past the flush
time) a stream unseen for ``stale_after_s`` is evicted, a job's live state likewise (its horizon blocks
linger as above), each counted. An evicted job no longer counts against ``max_jobs``: its lingering
blocks are bounded apart (``max_jobs`` of them again, the longest-silent dropped first).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping

import attrs

from otel_ofu import names
from otel_ofu_collector.aggregation.comoments import AbsDiff, CoMoments
from otel_ofu_collector.aggregation.exphist import ExpHistogram
from otel_ofu_collector.aggregation.quantiles import percentile_of_sorted
from otel_ofu_collector.config import AggregatorConfig
from otel_ofu_collector.detectors import DETECTORS, JobFlag, JobWindowValues
from otel_ofu_collector.results import (
    STATUS_NO_MFU,
    STATUS_NO_OFU,
    STATUS_OK,
    FleetReport,
    GroupReport,
    JobReport,
    WindowReport,
)

UNKNOWN = "unknown"
JOB_ATTRIBUTE_KEYS = (names.JOB_NAME, names.HW_MODEL, names.GPU_PRECISION)
_HORIZON_BLOCKS = 48

# A stream's identity as the windows need it: (job.id, *group values, *JOB_ATTRIBUTE_KEYS values), None if
# absent. Interned, so the streams of one job share one tuple.
Profile = tuple[str | None, ...]


@attrs.frozen
class AggregatorStats:
    points_ofu: int = 0
    points_mfu: int = 0
    late_points: int = 0
    rejected_stream_cap: int = 0
    rejected_job_cap: int = 0
    evicted_streams: int = 0
    evicted_jobs: int = 0
    windows_closed: int = 0


@attrs.define(slots=True)
class _Cell:
    """One stream (for one job) in one window."""

    weighted: float
    weight: float
    profile: Profile
    last_end_ns: int
    job_id: str | None


@attrs.define(slots=True)
class _MfuCell:
    total: float
    count: int
    attributes: Mapping[str, str]


@attrs.define
class _Window:
    # A stream's cell under its key; should the stream move to another job inside the window, the cell for
    # that job under (key, job.id). One table, so that cells keep the order their first points came in.
    cells: dict[str | tuple[str, str | None], _Cell] = attrs.field(factory=dict)
    mfu: dict[str, _MfuCell] = attrs.field(factory=dict)


@attrs.define
class _Horizon:
    """A job's (OFU, MFU) co-moments in blocks of whole windows; the sum of all but the newest is cached."""

    blocks: deque[tuple[int, CoMoments]] = attrs.field(factory=deque)
    _older: CoMoments | None = None

    def add(self, block_start: int, ofu: float, mfu: float) -> None:
        if self.blocks and self.blocks[-1][0] == block_start:
            self.blocks[-1] = (block_start, self.blocks[-1][1].add(ofu, mfu))
        else:
            self.blocks.append((block_start, CoMoments().add(ofu, mfu)))
            self._older = None

    def prune(self, oldest_start: int) -> None:
        while self.blocks and self.blocks[0][0] < oldest_start:
            self.blocks.popleft()
            self._older = None

    def total(self) -> CoMoments:
        if not self.blocks:
            return CoMoments()
        if self._older is None:
            older = CoMoments()
            for index in range(len(self.blocks) - 1):
                older = older.merge(self.blocks[index][1])
            self._older = older
        return self._older.merge(self.blocks[-1][1])


@attrs.define
class _Job:
    last_seen_ns: int
    config: AggregatorConfig
    live: bool = True
    attributes: Mapping[str, str] = attrs.field(factory=dict)
    flags: dict[str, JobFlag] = attrs.field(init=False)  # by the flag's metric name
    horizon: _Horizon = attrs.field(factory=_Horizon)

    def __attrs_post_init__(self) -> None:
        self.reset_flags()

    def reset_flags(self) -> None:
        self.flags = {detector.metric.name: detector.start(self.config) for detector in DETECTORS}

    def revive(self, seen_ns: int) -> None:
        """A job back after eviction starts its flags (and their baselines) afresh; its horizon blocks carry on."""
        self.live = True
        self.last_seen_ns = seen_ns
        self.reset_flags()


def _window_start(time_ns: int, window_ns: int) -> int:
    return ((time_ns - 1) // window_ns) * window_ns


@attrs.define
class Aggregator:
    """Windows, correlation and flags for one collector process (or one shard)."""

    config: AggregatorConfig
    _window_ns: int = attrs.field(init=False)
    _lateness_ns: int = attrs.field(init=False)
    _block_ns: int = attrs.field(init=False)
    _profile_keys: tuple[str, ...] = attrs.field(init=False)
    _groups: int = attrs.field(init=False)
    _windows: dict[int, _Window] = attrs.field(init=False, factory=dict)
    _streams: dict[str, int] = attrs.field(init=False, factory=dict)  # key -> last seen end_ns
    _jobs: dict[str, _Job] = attrs.field(init=False, factory=dict)
    _profiles: dict[Profile, Profile] = attrs.field(init=False, factory=dict)
    _watermark_ns: int = attrs.field(init=False, default=0)
    _flushed_ns: int | None = attrs.field(init=False, default=None)
    _next_start: int | None = attrs.field(init=False, default=None)
    _last_pair_start: int | None = attrs.field(init=False, default=None)
    _last_eviction_ns: int | None = attrs.field(init=False, default=None)
    _points_ofu: int = attrs.field(init=False, default=0)
    _points_mfu: int = attrs.field(init=False, default=0)
    _late: int = attrs.field(init=False, default=0)
    _rejected_streams: int = attrs.field(init=False, default=0)
    _rejected_jobs: int = attrs.field(init=False, default=0)
    _evicted_streams: int = attrs.field(init=False, default=0)
    _evicted_jobs: int = attrs.field(init=False, default=0)
    _live_jobs: int = attrs.field(init=False, default=0)
    # Why the last add_ofu/add_mfu that returned False refused its point: "late", "max_streams" or
    # "max_jobs" (read by the decoder on that path only, to count rejections by their own reason).
    refusal: str = attrs.field(init=False, default="")
    _windows_closed: int = attrs.field(init=False, default=0)
    # The window the last point went to, (start, start + width]: consecutive points mostly share it.
    _last_start: int = attrs.field(init=False, default=-1)
    _last_end: int = attrs.field(init=False, default=-1)
    _last_window: _Window = attrs.field(init=False, factory=_Window)  # an empty stand-in while the range is void

    def __attrs_post_init__(self) -> None:
        config = self.config
        self._window_ns = config.window_ns
        self._lateness_ns = config.lateness_ns
        self._block_ns = max(1, config.horizon_ns // config.window_ns // _HORIZON_BLOCKS) * config.window_ns
        self._profile_keys = (names.JOB_ID, *config.group_keys, *JOB_ATTRIBUTE_KEYS)
        self._groups = len(config.group_keys)

    # --- ingest ------------------------------------------------------------------------------------

    @property
    def watermark_ns(self) -> int:
        return self._watermark_ns

    @property
    def stats(self) -> AggregatorStats:
        return AggregatorStats(
            points_ofu=self._points_ofu,
            points_mfu=self._points_mfu,
            late_points=self._late,
            rejected_stream_cap=self._rejected_streams,
            rejected_job_cap=self._rejected_jobs,
            evicted_streams=self._evicted_streams,
            evicted_jobs=self._evicted_jobs,
            windows_closed=self._windows_closed,
        )

    @property
    def streams(self) -> int:
        return len(self._streams)

    @property
    def jobs(self) -> int:
        """Jobs in state: live ones and evicted ones whose horizon blocks still count for the fleet."""
        return len(self._jobs)

    def _is_late(self, start: int) -> bool:
        return self._flushed_ns is not None and start + self._window_ns + self._lateness_ns <= self._flushed_ns

    def _open_window(self, time_ns: int) -> _Window | None:
        """The open window for a point at time_ns, or None (counted) when that window already closed."""
        start = _window_start(time_ns, self._window_ns)
        if self._is_late(start):
            self._late += 1
            self.refusal = "late"
            return None
        window = self._windows.get(start)
        if window is None:
            window = self._windows[start] = _Window()
            if self._next_start is None or start < self._next_start:
                self._next_start = start
        return window

    def _job(self, job_id: str, seen_ns: int) -> _Job | None:
        job = self._jobs.get(job_id)
        if job is None or not job.live:
            if self._live_jobs >= self.config.max_jobs:
                self._rejected_jobs += 1
                self.refusal = "max_jobs"
                return None
            self._live_jobs += 1
            if job is None:
                if len(self._jobs) >= 2 * self.config.max_jobs:
                    self._forget_an_evicted_job()
                job = self._jobs[job_id] = _Job(seen_ns, self.config)
            else:
                job.revive(seen_ns)
        elif seen_ns > job.last_seen_ns:
            job.last_seen_ns = seen_ns
        return job

    def profile_of(self, identity: Mapping[str, str]) -> Profile:
        """What the windows keep of an identity (job, group and job attribute values), interned.

        ``add_ofu`` derives it from every point's identity; a caller that sends many points with one
        unchanging identity (the decoder, per Resource) can derive it once and pass it along.
        """
        raw = tuple(map(identity.get, self._profile_keys))
        return self._profiles.setdefault(raw, raw)

    def add_ofu(
        self,
        stream_key: str,
        value: float,
        start_ns: int,
        end_ns: int,
        identity: Mapping[str, str],
        profile: Profile | None = None,
    ) -> bool:
        """One ``gpu.ofu`` point (value finite in [0, 1], checked by the caller); False when late or over a cap.

        ``profile``, when given, must be ``profile_of(identity)`` of this aggregator.
        """
        # The hot path of ingest: the common case (known stream, open window, live job) is inlined.
        if end_ns > self._watermark_ns:
            self._watermark_ns = end_ns
        streams = self._streams
        last_seen = streams.get(stream_key)
        if last_seen is None and len(streams) >= self.config.max_streams:
            if self._is_late(_window_start(end_ns, self._window_ns)):
                self._late += 1  # a late point is counted as late only
                self.refusal = "late"
            else:
                self._rejected_streams += 1
                self.refusal = "max_streams"
            return False
        if self._last_start < end_ns <= self._last_end:
            window_start = self._last_start
            window = self._last_window
        else:
            window_start = end_ns - 1 - (end_ns - 1) % self._window_ns
            # A window still in the table is open: closing one pops it (and forgets it as the last window).
            found = self._windows.get(window_start)
            if found is None:
                found = self._open_window(end_ns)
                if found is None:
                    return False
            window = found
            self._last_start = window_start
            self._last_end = window_start + self._window_ns
            self._last_window = window
        if last_seen is None or end_ns > last_seen:
            streams[stream_key] = end_ns
        if profile is None:
            raw = tuple(map(identity.get, self._profile_keys))
            profile = self._profiles.setdefault(raw, raw)
        job_id = profile[0] or None  # job.id; an empty one names no job
        if job_id is not None:
            job = self._jobs.get(job_id)
            if job is None or not job.live:
                self._job(job_id, end_ns)
            elif end_ns > job.last_seen_ns:
                job.last_seen_ns = end_ns
        overlap = end_ns - (start_ns if start_ns > window_start else window_start)
        weight = float(overlap) if overlap > 0 else 1.0
        cells = window.cells
        cell = cells.get(stream_key)
        if cell is None:
            cells[stream_key] = _Cell(value * weight, weight, profile, end_ns, job_id)
        else:
            if cell.job_id != job_id:
                moved = (stream_key, job_id)
                cell = cells.get(moved)
                if cell is None:
                    cells[moved] = _Cell(value * weight, weight, profile, end_ns, job_id)
                    self._points_ofu += 1
                    return True
            cell.weighted += value * weight
            cell.weight += weight
            if end_ns >= cell.last_end_ns:
                cell.profile = profile
                cell.last_end_ns = end_ns
        self._points_ofu += 1
        return True

    def add_mfu(self, job_id: str, value: float, time_ns: int, identity: Mapping[str, str]) -> bool:
        """One ``job.mfu`` point; False when late or over the job cap."""
        if time_ns > self._watermark_ns:
            self._watermark_ns = time_ns
        window = self._open_window(time_ns)
        if window is None:
            return False
        if self._job(job_id, time_ns) is None:
            return False
        cell = window.mfu.get(job_id)
        if cell is None:
            attributes = {key: identity[key] for key in JOB_ATTRIBUTE_KEYS if key in identity}
            window.mfu[job_id] = _MfuCell(value, 1, attributes)
        else:
            cell.total += value
            cell.count += 1
        self._points_mfu += 1
        return True

    # --- closing -----------------------------------------------------------------------------------

    def flush(self, now_ns: int) -> list[WindowReport]:
        """Close, in time order, every window with end + lateness <= now_ns; then evict stale state."""
        if self._flushed_ns is None or now_ns > self._flushed_ns:
            self._flushed_ns = now_ns
        reports = self._close_through(self._flushed_ns - self._lateness_ns)
        self._evict(min(self._watermark_ns, self._flushed_ns))
        return reports

    def close_all(self) -> list[WindowReport]:
        """Close every open window (shutdown); later points for them are late."""
        if not self._windows:
            return []
        last_end = max(self._windows) + self._window_ns
        reports = self._close_through(last_end)
        closed_at = last_end + self._lateness_ns
        if self._flushed_ns is None or closed_at > self._flushed_ns:
            self._flushed_ns = closed_at
        return reports

    def _horizon_has_pairs(self, window_end: int) -> bool:
        return self._last_pair_start is not None and self._last_pair_start >= window_end - self.config.horizon_ns

    def _close_through(self, limit_ns: int) -> list[WindowReport]:
        """Close the windows ending at or before limit_ns, including empty ones the fleet state spans."""
        reports: list[WindowReport] = []
        width = self._window_ns
        while self._next_start is not None and self._next_start + width <= limit_ns:
            start = self._next_start
            window = self._windows.pop(start, None)
            if start == self._last_start:
                self._last_start = self._last_end = -1
                self._last_window = _Window()  # let the closed one go
            if window is not None or self._horizon_has_pairs(start + width):
                reports.append(self._close(start, window or _Window()))
                self._next_start = start + width
            elif self._windows:
                self._next_start = min(self._windows)
            else:
                self._next_start = (limit_ns // width) * width
        return reports

    def _close(self, start: int, window: _Window) -> WindowReport:
        end = start + self._window_ns
        groups_values: dict[tuple[str, ...], list[float]] = {}
        jobs_values: dict[str, list[float]] = {}
        jobs_latest: dict[str, _Cell] = {}
        group_end = 1 + self._groups
        group_of: dict[Profile, tuple[str, ...]] = {}
        for cell in window.cells.values():
            value = cell.weighted / cell.weight
            profile = cell.profile
            group = group_of.get(profile)
            if group is None:
                group = group_of[profile] = tuple(UNKNOWN if v is None else v for v in profile[1:group_end])
            groups_values.setdefault(group, []).append(value)
            job_id = profile[0]
            if job_id is not None:
                jobs_values.setdefault(job_id, []).append(value)
                latest = jobs_latest.get(job_id)
                if latest is None or cell.last_end_ns > latest.last_end_ns:
                    jobs_latest[job_id] = cell
        groups = tuple(self._group_report(key, values) for key, values in sorted(groups_values.items()))
        job_reports: list[JobReport] = []
        for job_id in sorted(jobs_values.keys() | window.mfu.keys()):
            job = self._jobs.get(job_id)
            if job is None:  # over the job cap when its points came
                continue
            mfu_cell = window.mfu.get(job_id)
            attributes = dict(job.attributes)
            if mfu_cell is not None:
                attributes.update(mfu_cell.attributes)
            if job_id in jobs_latest:  # the GPUs' own identity wins over what the training side said
                newest = jobs_latest[job_id].profile[group_end:]
                attributes.update((k, v) for k, v in zip(JOB_ATTRIBUTE_KEYS, newest, strict=True) if v is not None)
            job.attributes = attributes
            job_reports.append(self._job_report(job_id, job, start, end, jobs_values.get(job_id), mfu_cell))
        self._windows_closed += 1
        return WindowReport(start, end, groups, tuple(job_reports), self._fleet_report(end))

    def _group_report(self, key: tuple[str, ...], values: list[float]) -> GroupReport:
        values.sort()
        return GroupReport(
            attributes=dict(zip(self.config.group_keys, key, strict=True)),
            gpus=len(values),
            quantiles={q: percentile_of_sorted(values, q) for q in names.QUANTILES},
            histogram=ExpHistogram.from_values(values, max_buckets=self.config.histogram_max_buckets),
            ofu_sum=sum(values),
            ofu_min=values[0],
            ofu_max=values[-1],
        )

    def _job_report(
        self, job_id: str, job: _Job, start: int, end: int, ofus: list[float] | None, mfu_cell: _MfuCell | None
    ) -> JobReport:
        config = self.config
        ofu = sum(ofus) / len(ofus) if ofus else None
        mfu = mfu_cell.total / mfu_cell.count if mfu_cell is not None else None
        if ofu is not None and mfu is not None:
            job.horizon.add(start - start % self._block_ns, ofu, mfu)
            if self._last_pair_start is None or start > self._last_pair_start:
                self._last_pair_start = start
        gpus = len(ofus) if ofus else 0
        values = JobWindowValues(start, end, ofu, mfu, gpus)
        flags = {name: flag.assess(values) for name, flag in job.flags.items()}
        job.horizon.prune(end - config.horizon_ns)
        status = STATUS_NO_OFU if ofu is None else STATUS_NO_MFU if mfu is None else STATUS_OK
        return JobReport(
            job_id=job_id,
            attributes=job.attributes,
            ofu=ofu,
            mfu=mfu,
            gap=mfu - ofu if ofu is not None and mfu is not None else None,
            correlation=job.horizon.total().pearson(),
            flags=flags,
            status=status,
            gpus=gpus,
        )

    def _fleet_report(self, end: int) -> FleetReport:
        oldest = end - self.config.horizon_ns
        fleet = CoMoments()
        diffs = AbsDiff()
        for job in self._jobs.values():
            horizon = job.horizon
            if not horizon.blocks:
                continue
            horizon.prune(oldest)
            total = horizon.total()
            if total.n:
                fleet = fleet.add(total.mean_x, total.mean_y)
                diffs = diffs.add(total.mean_x, total.mean_y)
        return FleetReport(fleet.pearson(), diffs.mean(), fleet.n, fleet, diffs.total)

    # --- bounded state ---------------------------------------------------------------------------------

    def _evict(self, now_ns: int) -> None:
        if self._last_eviction_ns is not None and now_ns < self._last_eviction_ns + self._window_ns:
            return  # a scan per window is enough; staleness is measured in many windows
        self._last_eviction_ns = now_ns
        cutoff = now_ns - self.config.stale_after_ns
        stale_streams = [key for key, seen in self._streams.items() if seen <= cutoff]
        for key in stale_streams:
            del self._streams[key]
        self._evicted_streams += len(stale_streams)
        oldest_horizon = now_ns - self.config.horizon_ns
        gone: list[str] = []
        for job_id, job in self._jobs.items():
            if job.live and job.last_seen_ns <= cutoff:
                job.live = False
                self._live_jobs -= 1
                job.reset_flags()  # lets go of their state (a baseline); a revived job starts afresh anyway
                job.attributes = {}
                self._evicted_jobs += 1
            if not job.live:
                job.horizon.prune(oldest_horizon)
                if not job.horizon.blocks:
                    gone.append(job_id)
        for job_id in gone:
            del self._jobs[job_id]
        if len(self._profiles) > 2 * len(self._streams) + 1024:
            self._reintern()

    def _forget_an_evicted_job(self) -> None:
        """Make room among the evicted jobs' lingering horizon blocks: drop the longest-silent one's."""
        oldest: str | None = None
        oldest_seen = 0
        for job_id, job in self._jobs.items():
            if not job.live and (oldest is None or job.last_seen_ns < oldest_seen):
                oldest, oldest_seen = job_id, job.last_seen_ns
        if oldest is not None:
            del self._jobs[oldest]

    def _reintern(self) -> None:
        """Drop profiles no open window uses any more (the intern table would otherwise only grow)."""
        used: dict[Profile, Profile] = {}
        for window in self._windows.values():
            for cell in window.cells.values():
                used[cell.profile] = cell.profile
        self._profiles = used
