"""Tumbling windows over OFU and MFU points: what goes into which window, and when a window closes.

Pure and single-threaded: the service feeds points and calls ``flush(now_ns)``; nothing here reads a clock. The rooms
around it: ``cells`` (what a window holds), ``streams`` (the GPUs known, their admission and bounds), ``counters``
(cumulative counters' deltas), ``closing`` (a closed window's report), ``jobs`` (each job's flags and correlation),
``loss`` (where OFU is lost, pure).

Windows. Aligned to multiples of ``window_s`` since the epoch (shards agree without talking) and closed on the right:
window (start, end] holds the points whose end time lies in it, so a producer exporting exactly on the boundary lands
in the window its interval covers. A window closes once ``end + lateness <= now``; a point arriving for a closed
window is late: counted, refused with its reason, never mixed into a later window. A point's interval is split over
every window it overlaps (``_parts``); the part of a window that had already closed goes to the first open one.

Per GPU. A GPU ("stream", the caller's key) with several points in a window counts once: its OFU is the time-weighted
mean of its points (weight = the part of the point's interval inside the window), and its time is the union of the
parts of its intervals inside the window (``cells.Cell``): a request delivered twice, a reading sent again or intervals
that overlap by a timer's jitter add nothing, and no GPU has more than the window. A point without an interval (no
start time, or one at or after its end) covers the time since the stream's previous point, if that is within
``stale_after_s``; a stream's first such point marks its start and covers nothing. A GPU that reports an interval
without OFU (``add_unmeasured``: ``gpu.ofu.unmeasured``) has that time too, unmeasured. A stream that moves to another
job inside a window has a cell per job, each with its own intervals; its group and job attributes are those of its
latest point.

What a closed window reports (``closing``): per group the histogram of its GPUs' OFU, the percentiles over GPU
capacity and its GPU equivalents; per job its OFU (useful GPU time over GPU time), MFU, the gap and flags against the
OFU of its measured time, its correlation, where its OFU was lost and what that cost; per fleet the correlation across
jobs and the loss totals. Windows without data are still closed and reported (fleet only) within the staleness after
the last window that held data, or while any job has horizon data, so every shard reports every window and the merge
tier sees the whole fleet; past that the close jumps to the next window holding data, so closing costs the windows
that hold data, never the time between them.

Bounded state. ``max_streams`` streams and ``max_jobs`` live jobs (points beyond: rejected, counted, a tenth kept for
the GPUs that reported before), ``max_state_bytes`` in all. By event time (the watermark, and never past the flush
time) a stream unseen for ``stale_after_s`` is evicted, a job's live state likewise (its horizon blocks linger), each
counted.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping

import attrs

from otel_ofu import names
from otel_ofu_collector.aggregation import checkpoints
from otel_ofu_collector.aggregation.cells import (
    COUNTER_RATES,
    CellKey,
    GpuInputs,
    MfuCell,
    Part,
    Profile,
    Window,
    add_to_cell,
    window_start,
)
from otel_ofu_collector.aggregation.cells import Cell as Cell
from otel_ofu_collector.aggregation.closing import JOB_ATTRIBUTE_KEYS, SHARE_KEYS, Closer
from otel_ofu_collector.aggregation.counters import CounterBaselines, Reading
from otel_ofu_collector.aggregation.jobs import JobLedger, JobState
from otel_ofu_collector.aggregation.streams import StreamTable
from otel_ofu_collector.config import AggregatorConfig
from otel_ofu_collector.results import WindowReport

logger = logging.getLogger(__name__)

R = names.RejectReason
# A window whose close fails this many flushes in a row is dropped (counted): a defect must not stop the rest.
_CLOSE_ATTEMPTS = 3
# job.step points one job may have in one window: a reporter sends one per export interval (seconds), so a 60 s window
# holds a handful; more is a flood, refused (counted) rather than kept.
MAX_STEP_POINTS = 256
__all__ = ["Aggregator", "AggregatorStats", "CellKey", "Profile"]


@attrs.frozen
class AggregatorStats:
    points_ofu: int = 0
    points_mfu: int = 0
    points_unmeasured: int = 0
    late_points: int = 0
    points_gpu_inputs: int = 0
    points_progress: int = 0  # job.step and job.checkpoint.time
    rejected_stream_cap: int = 0
    rejected_job_cap: int = 0
    evicted_streams: int = 0
    evicted_jobs: int = 0
    windows_closed: int = 0
    rejected_state_cap: int = 0  # new streams refused at max_state_bytes
    windows_failed: int = 0  # windows given up after _CLOSE_ATTEMPTS failed closes
    close_failures: Mapping[str, int] = attrs.field(factory=dict)  # groups, jobs, fleet totals left out, by kind


@attrs.define
class Aggregator:
    """Windows, correlation and flags for one collector process (or one shard)."""

    config: AggregatorConfig
    # Guards the aggregator: whoever calls it (the decoder per request, the service's flush) holds it.
    lock: threading.Lock = attrs.field(init=False, factory=threading.Lock)
    _window_ns: int = attrs.field(init=False)
    _lateness_ns: int = attrs.field(init=False)
    _max_interval_ns: int = attrs.field(init=False)
    _ledger: JobLedger = attrs.field(init=False)  # every job's state: flags, correlation horizon
    _table: StreamTable = attrs.field(init=False)  # the GPU streams known, and what their identities cost
    _counters: CounterBaselines = attrs.field(init=False)
    _closer: Closer = attrs.field(init=False)
    # The hot path's own references to the tables it reads on every point (the same dicts as the rooms').
    _last_seen: dict[str, int] = attrs.field(init=False)
    _jobs: dict[str, JobState] = attrs.field(init=False)
    _windows: dict[int, Window] = attrs.field(init=False, factory=dict)
    _watermark_ns: int = attrs.field(init=False, default=0)
    _flushed_ns: int | None = attrs.field(init=False, default=None)
    _next_start: int | None = attrs.field(init=False, default=None)
    _last_data_end: int | None = attrs.field(init=False, default=None)  # the last closed window that held data
    _last_eviction_ns: int | None = attrs.field(init=False, default=None)
    _close_attempts: dict[int, int] = attrs.field(init=False, factory=dict)
    _windows_failed: int = attrs.field(init=False, default=0)
    _points_ofu: int = attrs.field(init=False, default=0)
    _points_unmeasured: int = attrs.field(init=False, default=0)
    _points_mfu: int = attrs.field(init=False, default=0)
    _points_gpu: int = attrs.field(init=False, default=0)
    _points_progress: int = attrs.field(init=False, default=0)  # job.step and job.checkpoint.time points taken
    _late: int = attrs.field(init=False, default=0)
    _rejected_inputs: int = attrs.field(init=False, default=0)  # loss inputs over max_streams in one window
    # The window the last point went to, (start, start + width]: consecutive points mostly share it.
    _last_start: int = attrs.field(init=False, default=-1)
    _last_end: int = attrs.field(init=False, default=-1)
    _last_window: Window = attrs.field(init=False, factory=Window)  # an empty stand-in while the range is void

    def __attrs_post_init__(self) -> None:
        config = self.config
        self._window_ns = config.window_ns
        self._lateness_ns = config.lateness_ns
        # A point covering more than this is refused: its stream would have been evicted as silent meanwhile.
        self._max_interval_ns = config.stale_after_ns
        self._ledger = JobLedger(config)
        profile_keys = (names.JOB_ID, *config.group_keys, *JOB_ATTRIBUTE_KEYS, *SHARE_KEYS)
        self._table = StreamTable(config, self._ledger, profile_keys)
        self._counters = CounterBaselines(config, self._table.first_starts)
        self._closer = Closer(config, self._ledger)
        self._last_seen = self._table.last_seen
        self._jobs = self._ledger.jobs

    # --- what the service and the decoder read ------------------------------------------------------------

    @property
    def watermark_ns(self) -> int:
        return self._watermark_ns

    @property
    def stats(self) -> AggregatorStats:
        table, ledger, closer = self._table, self._ledger, self._closer
        return AggregatorStats(
            points_ofu=self._points_ofu,
            points_mfu=self._points_mfu,
            points_unmeasured=self._points_unmeasured,
            late_points=self._late,
            points_gpu_inputs=self._points_gpu,
            points_progress=self._points_progress,
            rejected_stream_cap=table.rejected_streams + self._counters.rejected_streams + self._rejected_inputs,
            rejected_job_cap=ledger.rejected,
            evicted_streams=table.evicted,
            evicted_jobs=ledger.evicted,
            windows_closed=closer.windows_closed,
            rejected_state_cap=table.rejected_state,
            windows_failed=self._windows_failed,
            close_failures=dict(closer.close_failures),
        )

    @property
    def streams(self) -> int:
        return len(self._table.last_seen)

    @property
    def jobs(self) -> int:
        """Jobs in state: live ones and evicted ones whose horizon blocks still count for the fleet."""
        return len(self._ledger.jobs)

    def live_entries(self) -> int:
        """GPU streams and jobs in state: what the decoder's resource cache bound follows."""
        return len(self._table.last_seen) + len(self._ledger.jobs)

    @property
    def state_bytes(self) -> int:
        """The windows' state in bytes, as bounded by ``max_state_bytes`` (``streams.StreamTable``)."""
        return self._table.state_bytes

    def cache_budget(self, cache_bytes: int) -> int:
        """The decoder's identity cache holds ``cache_bytes`` (counted in the bound); the most it may hold."""
        return self._table.cache_budget(cache_bytes)

    def profile_of(self, identity: Mapping[str, str]) -> Profile:
        """What the windows keep of an identity, interned: ``add_ofu`` takes it with every point; the decoder derives it
        once per Resource and passes it along."""
        return self._table.profile_of(identity)

    def restart_close_time(self, now_ns: int) -> int | None:
        """After ``close_all`` at ``now_ns``, the close time a restarted collector should ``flush`` its fresh
        aggregator to, so that the windows exported are closed there too; None when none closed.

        No later than the window ``now_ns`` falls in (its end plus the lateness): windows ahead of the clock exist only
        for a producer whose clock runs ahead (within the future bound, 5 min by default), and keeping them closed
        would refuse every producer's points as late for that long after the restart. Such a window may instead be
        exported again by the next run."""
        if self._flushed_ns is None:
            return None
        current_end = window_start(now_ns, self._window_ns) + self._window_ns
        return min(self._flushed_ns, current_end + self._lateness_ns)

    # --- ingest ------------------------------------------------------------------------------------------------

    def add_ofu(
        self,
        stream_key: str,
        value: float,
        start_ns: int,
        end_ns: int,
        identity: Mapping[str, str],
        profile: Profile | None = None,
    ) -> str | None:
        """One ``gpu.ofu`` point (value finite in [0, 1], checked by the caller) over (start, end]: None when taken,
        else why not (a ``names.RejectReason`` code: late, over a cap, an interval beyond ``stale_after_s``).

        ``profile``, when given, must be ``profile_of(identity)`` of this aggregator.
        """
        # The hot path of ingest: a known stream's interval inside the window the last point went to, for a job the
        # windows hold (or none), its cell new or of the same interned profile. Everything else takes ``_add_point``.
        if profile is not None and self._last_start <= start_ns < end_ns <= self._last_end:
            last_seen = self._last_seen.get(stream_key)
            job_id = profile[0] or None
            job = self._jobs.get(job_id) if job_id is not None else None
            if last_seen is not None and (job_id is None or (job is not None and job.live)):
                cells = self._last_window.cells
                cell = cells.get(stream_key)
                weight = float(end_ns - start_ns)
                if cell is None:
                    cells[stream_key] = Cell(value * weight, weight, profile, end_ns, job_id, start_ns, end_ns)
                elif cell.profile is profile:
                    cell.weighted += value * weight
                    cell.weight += weight
                    if cell.spans is None and cell.hi == start_ns:  # the interval after the last one: the common case
                        cell.hi = end_ns
                    else:
                        cell.cover(start_ns, end_ns)
                    if end_ns > cell.last_end_ns:
                        cell.last_end_ns = end_ns
                else:
                    return self._add_point(stream_key, value, start_ns, end_ns, identity, profile)
                if end_ns > self._watermark_ns:
                    self._watermark_ns = end_ns
                if end_ns > last_seen:
                    self._last_seen[stream_key] = end_ns
                if job is not None and end_ns > job.last_seen_ns:
                    job.last_seen_ns = end_ns
                self._points_ofu += 1
                return None
        return self._add_point(stream_key, value, start_ns, end_ns, identity, profile)

    def add_unmeasured(
        self,
        stream_key: str,
        start_ns: int,
        end_ns: int,
        identity: Mapping[str, str],
        profile: Profile | None = None,
    ) -> str | None:
        """One ``gpu.ofu.unmeasured`` point: the GPU reported (start, end] without OFU. Its time is billed to its job
        as ``unmeasured``; None when taken, else why not, as ``add_ofu``."""
        return self._add_point(stream_key, None, start_ns, end_ns, identity, profile)

    def _add_point(
        self,
        stream_key: str,
        value: float | None,
        start_ns: int,
        end_ns: int,
        identity: Mapping[str, str],
        profile: Profile | None,
    ) -> str | None:
        """A point of a GPU's time over (start, end], with its OFU (None: unmeasured), into every window it overlaps."""
        if end_ns > self._watermark_ns:
            self._watermark_ns = end_ns
        if end_ns - start_ns > self._max_interval_ns:
            return R.IMPLAUSIBLE
        table = self._table
        last_seen = table.last_seen.get(stream_key)
        if last_seen is None:
            refused = table.refusal(stream_key, identity)
            if refused is not None:
                if self._is_late(window_start(end_ns, self._window_ns)):
                    self._late += 1  # a late point is counted as late only
                    return R.LATE
                table.count_refusal(refused)
                return refused
        if start_ns >= end_ns:
            start_ns = table.inferred_start(stream_key, end_ns, last_seen)
        found = self._window_of(end_ns)
        if found is None:
            return R.LATE
        start_of_window, window = found
        if profile is None:
            profile = table.profile_of(identity)
        job_id = profile[0] or None  # job.id; an empty one names no job
        # A GPU that reported before (here, or before its eviction) draws on the places reserved for returning GPUs.
        reserved = last_seen is not None or hash(stream_key) in table.returning
        if job_id is not None and self._ledger.admit(job_id, end_ns, reserved) is None:
            return R.MAX_JOBS  # a job the windows cannot keep: its GPUs' OFU would count in no job
        if last_seen is None:
            table.start(stream_key, start_ns, end_ns)
        elif end_ns > last_seen:
            table.last_seen[stream_key] = end_ns
        # Time of windows that closed before the point came is carried into the first open one only for a point that
        # extends its stream: an older one sent again (a retry) would bill it twice.
        extends = last_seen is None or end_ns > last_seen
        if start_ns >= start_of_window:  # the whole interval in one window: the common case
            add_to_cell(window.cells, stream_key, value, start_ns, end_ns, 0.0, profile, job_id, extends)
        else:
            for part_window, low, high, carried in self._parts(start_ns, end_ns, start_of_window, window):
                add_to_cell(part_window.cells, stream_key, value, low, high, carried, profile, job_id, extends)
        if value is None:
            self._points_unmeasured += 1
        else:
            self._points_ofu += 1
        return None

    def add_mfu(self, job_id: str, value: float, time_ns: int, identity: Mapping[str, str]) -> str | None:
        """One ``job.mfu`` point: None when taken, else why not (late, over the job cap)."""
        if time_ns > self._watermark_ns:
            self._watermark_ns = time_ns
        window = self._open_window(time_ns)
        if window is None:
            return R.LATE
        if self._ledger.admit(job_id, time_ns) is None:
            return R.MAX_JOBS
        cell = window.mfu.get(job_id)
        if cell is None:
            attributes = {key: identity[key] for key in JOB_ATTRIBUTE_KEYS if key in identity}
            window.mfu[job_id] = MfuCell(value, 1, attributes)
        else:
            cell.total += value
            cell.count += 1
        self._points_mfu += 1
        return None

    def add_progress(
        self,
        job_id: str,
        value: float,
        time_ns: int,
        identity: Mapping[str, str],
        operation: str | None = None,
        series_start_ns: int = 0,
    ) -> str | None:
        """A job's progress at ``time_ns``: without ``operation`` a ``job.step`` point (the last step it completed);
        with one a ``job.checkpoint.time`` reading, the seconds it spent on ``operation`` (save, load) since its series
        began at ``series_start_ns``, whose delta since the series' previous reading is split over the windows of the
        time between them, in proportion (``checkpoints.delta``). None when taken, else why not (late, over the job cap,
        more step points for the job in the window than ``MAX_STEP_POINTS``, checkpoint seconds beyond the time they
        came in or going back)."""
        if time_ns > self._watermark_ns:
            self._watermark_ns = time_ns
        found = self._window_of(time_ns)
        if found is None:
            return R.LATE
        job = self._ledger.admit(job_id, time_ns)
        if job is None:
            return R.MAX_JOBS
        start_of_window, window = found
        if operation is None:
            points = window.steps.get(job_id)
            if points is None:
                points = window.steps[job_id] = {}
            elif len(points) >= MAX_STEP_POINTS and time_ns not in points:
                return R.MAX_STATE
            points[time_ns] = value
            self._points_progress += 1
            return None
        first_open = series_start_ns > 0 and not self._is_late(window_start(series_start_ns + 1, self._window_ns))
        delta = checkpoints.delta(job.checkpoints, operation, series_start_ns, time_ns, value, first_open)
        if isinstance(delta, str):
            return delta
        seconds, since = delta
        self._points_progress += 1
        if seconds <= 0.0:
            return None
        parts = [(window, since, time_ns, 0.0)] if since >= start_of_window else self._parts(since, time_ns, *found)
        covered = float(time_ns - since)
        for part_window, low, high, carried in parts:
            share = (float(high - low) + carried) / covered if covered > 0.0 else 1.0
            part_window.checkpoints[job_id] = part_window.checkpoints.get(job_id, 0.0) + seconds * share
        return None

    def add_gpu_inputs(
        self,
        stream_key: str,
        start_ns: int,
        end_ns: int,
        identity: Mapping[str, str],
        values: Mapping[str, float],
        throttle: Mapping[str, float],
    ) -> str | None:
        """A GPU stream's gauges over one interval (start, end]: ``values`` by metric name, ``throttle`` shares by
        reason (a reason left out reads as 0), time-weighted into every window the interval overlaps, as OFU is.
        None when taken, else why not (late, over the stream cap, an interval beyond ``stale_after_s``)."""
        # The hot path: an interval inside the window the last point went to, of a stream with inputs there.
        if self._last_start <= start_ns < end_ns <= self._last_end:
            inputs = self._last_window.gpus.get(stream_key)
            if inputs is not None:
                if end_ns > self._watermark_ns:
                    self._watermark_ns = end_ns
                self._points_gpu += len(values) + len(throttle)
                inputs.add(values, throttle, float(end_ns - start_ns))
                return None
        if end_ns > self._watermark_ns:
            self._watermark_ns = end_ns
        if end_ns - start_ns > self._max_interval_ns:
            return R.IMPLAUSIBLE
        if start_ns >= end_ns:  # weighed over the same interval as the OFU point of the same time
            start_ns = self._table.inferred_start(stream_key, end_ns, self._table.last_seen.get(stream_key))
        found = self._window_of(end_ns)
        if found is None:
            return R.LATE
        start_of_window, window = found
        if start_ns >= start_of_window or start_ns >= end_ns:  # the whole interval in one window: the common case
            parts: list[Part] = [(window, start_ns, end_ns, 0.0)]
        else:
            parts = self._parts(start_ns, end_ns, start_of_window, window)
        if _over_stream_cap(stream_key, parts, self.config.max_streams):
            self._rejected_inputs += 1
            return R.MAX_STREAMS
        self._points_gpu += len(values) + len(throttle)
        for part_window, low, high, carried in parts:
            inputs = _inputs_of(part_window, stream_key, identity)
            inputs.add(values, throttle, float(high - low) + carried if high > low or carried else 1.0)
        return None

    def add_gpu_counters(
        self,
        stream_key: str,
        series_start_ns: int,
        end_ns: int,
        identity: Mapping[str, str],
        counters: Mapping[str, float],
    ) -> str | None:
        """A GPU stream's cumulative counters read at ``end_ns``, their series begun at ``series_start_ns``:
        ``counters`` by field (``gpu.energy``, ``gpu.nvlink.io|transmit`` and the like). Each one's delta since the
        stream's previous reading (``counters.CounterBaselines``) is split over the windows of the time it covers, in
        proportion. None when taken, else why not (late, over the stream cap, beyond physics); a refused reading
        changes nothing, not even the baselines of the interval's other counters."""
        if end_ns > self._watermark_ns:
            self._watermark_ns = end_ns
        counted: list[tuple[str, float, int, Reading]] = []  # (field, delta, since, reading to keep)
        for field, value in counters.items():
            max_rate = COUNTER_RATES.get(field)
            if max_rate is None:
                continue  # not a counter the windows keep
            found = self._counters.delta(field, max_rate, stream_key, series_start_ns, end_ns, value)
            if isinstance(found, str):
                return found
            counted.append((field, *found))
        if any(entry[1] for entry in counted):
            window_found = self._window_of(end_ns)
            if window_found is None:
                return R.LATE
            start_of_window, window = window_found
            # Where each delta goes: its window alone (the common case), else every window its time overlaps.
            spread: list[tuple[str, float, float, list[Part]]] = []
            for field, delta, since, _reading in counted:
                if delta:
                    if since >= start_of_window:
                        split: list[Part] = [(window, since, end_ns, 0.0)]
                    else:
                        split = self._parts(since, end_ns, start_of_window, window)
                    if _over_stream_cap(stream_key, split, self.config.max_streams):
                        self._rejected_inputs += 1
                        return R.MAX_STREAMS
                    spread.append((field, delta, float(end_ns - since), split))
            for field, delta, covered, split in spread:
                for part_window, low, high, carried in split:
                    weight = float(high - low) + carried
                    _inputs_of(part_window, stream_key, identity).add_counter(field, delta * (weight / covered), weight)
        for field, _delta, _since, reading in counted:
            self._counters.keep(field, stream_key, reading)
        self._points_gpu += len(counters)
        return None

    # --- which window ------------------------------------------------------------------------------------------

    def _is_late(self, start: int) -> bool:
        return self._flushed_ns is not None and start + self._window_ns + self._lateness_ns <= self._flushed_ns

    def _open_window(self, time_ns: int) -> Window | None:
        """The open window for a point at time_ns, or None (counted) when that window already closed."""
        start = window_start(time_ns, self._window_ns)
        if self._is_late(start):
            self._late += 1
            return None
        window = self._windows.get(start)
        if window is None:
            window = self._windows[start] = Window()
            if self._next_start is None or start < self._next_start:
                self._next_start = start
        return window

    def _window_of(self, end_ns: int) -> tuple[int, Window] | None:
        """(its start, the window) a point ending at ``end_ns`` goes to, remembered for the next point; None (counted)
        when that window already closed."""
        if self._last_start < end_ns <= self._last_end:
            return self._last_start, self._last_window
        start = end_ns - 1 - (end_ns - 1) % self._window_ns
        # A window still in the table is open: closing one pops it (and forgets it as the last window).
        window = self._windows.get(start) or self._open_window(end_ns)
        if window is None:
            return None
        self._last_start, self._last_end, self._last_window = start, start + self._window_ns, window
        return start, window

    def _parts(self, start_ns: int, end_ns: int, end_start: int, end_window: Window) -> list[Part]:
        """An interval (start, end] that began before the window holding its end (``end_start``, open) split over every
        window it overlaps, as (window, low, high, ns carried in): its part (low, high] in each, oldest first.

        The part of a window that already closed goes to the first open window the interval overlaps (as ns carried
        in, outside that window's own span), so that a GPU's time over a run is the time it reported, whatever its
        interval and phase; that happens only where an interval is longer than the lateness (a window then closes
        before the point that ends after it comes). Windows close in time order, so the closed ones are the first few.
        """
        width = self._window_ns
        parts: list[Part] = []
        carried = 0
        start = window_start(start_ns + 1, width)  # the window of the interval's first nanosecond
        while start < end_start:
            low, high = max(start_ns, start), min(end_ns, start + width)
            window = self._windows.get(start)
            if window is None and not self._is_late(start):
                window = self._windows[start] = Window()
                if self._next_start is None or start < self._next_start:
                    self._next_start = start
            if window is None:
                carried += high - low
            else:
                parts.append((window, low, high, float(carried)))
                carried = 0
            start += width
        parts.append((end_window, max(start_ns, end_start), end_ns, float(carried)))
        return parts

    # --- closing -----------------------------------------------------------------------------------------------

    def flush(self, now_ns: int) -> list[WindowReport]:
        """Close, in time order, every window with end + lateness <= now_ns; then evict stale state."""
        if self._flushed_ns is None or now_ns > self._flushed_ns:
            self._flushed_ns = now_ns
        reports = self._close_through(self._flushed_ns - self._lateness_ns)
        # Eviction by event time, never past the flush: a scan per window is enough, staleness is many windows.
        now = min(self._watermark_ns, self._flushed_ns)
        if self._last_eviction_ns is None or now >= self._last_eviction_ns + self._window_ns:
            self._last_eviction_ns = now
            cutoff = now - self.config.stale_after_ns
            in_use = (cell.profile for window in self._windows.values() for cell in window.cells.values())
            self._table.evict(cutoff, in_use)
            self._counters.evict(cutoff)
            self._ledger.evict(now)
        return reports

    def close_all(self, now_ns: int | None = None) -> list[WindowReport]:
        """Close every open window (shutdown); later points for them are late. A window still running at ``now_ns``
        is closed early: its report says when (``closed_at_ns``), so that what a restarted collector reports for the
        rest of it is a point of its own, not one with the same timestamps."""
        if not self._windows:
            return []
        last_end = max(self._windows) + self._window_ns
        reports = self._close_through(last_end)
        closed_at = last_end + self._lateness_ns
        if self._flushed_ns is None or closed_at > self._flushed_ns:
            self._flushed_ns = closed_at
        if now_ns is not None:
            reports = [attrs.evolve(r, closed_at_ns=now_ns) if r.start_ns < now_ns < r.end_ns else r for r in reports]
        return reports

    def _close_through(self, limit_ns: int) -> list[WindowReport]:
        """Close, in time order, the windows ending at or before limit_ns: every one holding data, and the empty ones
        while the state still spans them (``_state_spans``), so that every shard reports every window, the merge tier
        sees the whole fleet, and a quiet fleet shows as windows without GPUs rather than as the last window repeated.

        A window leaves the table only once its close succeeded; a close that fails (a defect: each job and group is
        closed on its own, see ``closing``) is retried at the next flush, at most ``_CLOSE_ATTEMPTS`` times.
        """
        reports: list[WindowReport] = []
        width = self._window_ns
        while self._next_start is not None and self._next_start + width <= limit_ns:
            start = self._next_start
            window = self._windows.get(start)
            if window is not None or self._state_spans(start + width):
                try:
                    reports.append(self._closer.close(start, window or Window()))
                    if window is not None:
                        self._last_data_end = start + width
                except Exception:
                    attempts = self._close_attempts[start] = self._close_attempts.get(start, 0) + 1
                    logger.exception("closing the window ending %d failed (attempt %d)", start + width, attempts)
                    if attempts < _CLOSE_ATTEMPTS:
                        break  # kept, and the later windows with it: windows close in time order
                    self._windows_failed += 1
                self._close_attempts.pop(start, None)
                self._windows.pop(start, None)
                self._next_start = start + width
            elif self._windows:
                self._next_start = min(self._windows)
            else:
                self._next_start = (limit_ns // width) * width
            if start == self._last_start:
                self._last_start = self._last_end = -1
                self._last_window = Window()  # let the closed one go
        return reports

    def _state_spans(self, window_end: int) -> bool:
        """Whether an empty window ending at ``window_end`` is still to be reported: it ends within the staleness of the
        last window that held data, or the fleet's horizon holds (OFU, MFU) pairs. Past that the close jumps to the next
        window that holds data: closing costs the windows that hold data (and a bounded tail after each), never the
        time between them, however old a point was (one stamped at the epoch opens one window)."""
        last = self._last_data_end
        if last is not None and window_end - last < self.config.stale_after_ns:
            return True
        return self._ledger.spans(window_end)


def _inputs_of(window: Window, stream_key: str, identity: Mapping[str, str]) -> GpuInputs:
    inputs = window.gpus.get(stream_key)
    if inputs is None:
        inputs = window.gpus[stream_key] = GpuInputs(identity)
    return inputs


def _over_stream_cap(stream_key: str, split: list[Part], cap: int) -> bool:
    """Whether a stream's loss inputs new to one of these windows are over ``max_streams`` there. A loop, not any() of
    a generator: asked for every report that straddles a window's end, where the generator cost twice the loop."""
    for window, _low, _high, _carried in split:
        gpus = window.gpus
        if len(gpus) >= cap and stream_key not in gpus:
            return True
    return False
