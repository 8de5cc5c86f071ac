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

Where OFU is lost (``aggregation.loss``). Beside ``gpu.ofu`` each GPU stream sends its tensor activity,
clocks, achieved FLOP/s, power, energy counter and throttle shares (``add_gpu_input``); per window they are
time-weighted means like OFU's, energy a sum of the counter's deltas. Closing a window splits each job's
1 - OFU by cause, sums its GPU-seconds, energy and cost, and runs the GPU-level flags (``gpu.straggler``)
on each of its GPUs against the job's median OFU; the fleet totals add its jobs' lost time and cost and
every GPU's energy. A GPU's seconds in a window are those its OFU points cover (at most the window); a
GPU whose points carry no durations counts the whole window.

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

import itertools
import math
import operator
from array import array
from collections import deque
from collections.abc import Callable, Mapping
from typing import cast

import attrs

from otel_ofu import catalog, names
from otel_ofu_collector.aggregation import loss
from otel_ofu_collector.aggregation.comoments import AbsDiff, CoMoments
from otel_ofu_collector.aggregation.exphist import ExpHistogram
from otel_ofu_collector.aggregation.quantiles import percentile_of_sorted
from otel_ofu_collector.config import AggregatorConfig
from otel_ofu_collector.detectors import (
    DETECTORS,
    GPU_DETECTORS,
    GpuFlag,
    GpuWindowValues,
    JobFlag,
    JobWindowValues,
)
from otel_ofu_collector.results import (
    STATUS_NO_MFU,
    STATUS_NO_OFU,
    STATUS_OK,
    FleetReport,
    GpuFlagReport,
    GroupReport,
    JobReport,
    WindowReport,
)

UNKNOWN = "unknown"
JOB_ATTRIBUTE_KEYS = (names.JOB_NAME, names.HW_MODEL, names.GPU_PRECISION)
_HORIZON_BLOCKS = 48
# The per-GPU inputs of the loss split the windows average (gpu.throttle by reason, gpu.energy summed apart).
GPU_INPUT_METRICS: frozenset[str] = frozenset(spec.name for spec in names.LOSS_SPLIT_INPUTS)
_TENSOR = names.GPU_TENSOR_ACTIVE.name
_CLOCK = names.GPU_CLOCK_SM.name
_CLOCK_MAX = names.GPU_CLOCK_SM_MAX.name
_FLOPS = names.GPU_FLOPS_ACHIEVED.name
_POWER = names.GPU_POWER.name
_ENERGY = names.GPU_ENERGY.name
_THROTTLE = names.GPU_THROTTLE.name
_GPU_IDENTITY_KEYS = (names.HOST_NAME, names.HW_ID, names.GPU_MIG_INSTANCE_ID)
# A GPU whose OFU points cover less than this of a window carried no durations: it counts the whole window.
_MIN_COVERED_NS = 1_000_000
_NS_PER_S = 1e9

# A stream's identity as the windows need it: (job.id, *group values, *JOB_ATTRIBUTE_KEYS values), None if
# absent. Interned, so the streams of one job share one tuple.
Profile = tuple[str | None, ...]
# A cell's key in its window: the stream's key; (key, job.id) for the cell of a stream that moved job in it.
CellKey = str | tuple[str, str | None]


@attrs.frozen
class AggregatorStats:
    points_ofu: int = 0
    points_mfu: int = 0
    late_points: int = 0
    points_gpu_inputs: int = 0
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


# Where each averaged loss input keeps its (weighted sum, weight) pair in ``_GpuInputs.sums``; after them, each
# throttle reason's weighted share (over the GPU's OFU weight: the same intervals).
_SLOTS: dict[str, int] = {_TENSOR: 0, _CLOCK: 2, _CLOCK_MAX: 4, _FLOPS: 6, _POWER: 8}
_REASON_SLOTS: dict[str, int] = {reason: 10 + i for i, reason in enumerate(names.ThrottleReason.ALL)}
_SUMS = 10 + len(_REASON_SLOTS)
_TENSOR_SLOT, _CLOCK_SLOT, _CLOCK_MAX_SLOT, _FLOPS_SLOT, _POWER_SLOT = (
    _SLOTS[_TENSOR],
    _SLOTS[_CLOCK],
    _SLOTS[_CLOCK_MAX],
    _SLOTS[_FLOPS],
    _SLOTS[_POWER],
)


def _no_sums() -> array[float]:
    return array("d", bytes(8 * _SUMS))


@attrs.define(slots=True)
class _GpuInputs:
    """One stream's loss inputs in one window: time-weighted sums and weights per metric and the weighted
    throttle shares, in one flat array of doubles (a few hundred bytes less per GPU than tables). A metric's
    mean is sums[slot] / sums[slot + 1], None without weight; the GPU's energy is ``energy_j`` (the counter's
    deltas), else mean power x the GPU's seconds, else None (read so where a window closes)."""

    identity: Mapping[str, str]
    sums: array[float] = attrs.field(factory=_no_sums)
    energy_j: float | None = None

    def throttle_shares(self, covered: float) -> dict[str, float]:
        """Each reason's share of the window, over ``covered`` (the GPU's OFU weight: the same intervals; the
        decoder leaves zero shares out), for the reasons that held the clock at all."""
        sums = self.sums
        return {
            reason: min(1.0, sums[slot] / covered) if covered > 0 else 0.0
            for reason, slot in _REASON_SLOTS.items()
            if sums[slot] > 0
        }


@attrs.define(slots=True)
class _JobGpus:
    """A job's cells in a window closing, in columns: the cells' keys, the cells and their OFU."""

    keys: list[CellKey] = attrs.field(factory=list)
    cells: list[_Cell] = attrs.field(factory=list)
    ofus: list[float] = attrs.field(factory=list)

    def stream_keys(self) -> list[str]:
        keys = self.keys
        if all(map(isinstance, keys, itertools.repeat(str))):  # no stream moved job: the keys as they are
            return cast(list[str], keys)
        return [key if isinstance(key, str) else key[0] for key in keys]


# Where a cell goes when its window closes: the appends of its group's values and of its job's columns.
_Route = tuple[Callable[[float], None], Callable[[CellKey], None], Callable[[_Cell], None], Callable[[float], None]]
_LAST_END = operator.attrgetter("last_end_ns")
_SUMS_OF = operator.attrgetter("sums")
_MEAN_SLOTS = (_TENSOR_SLOT, _CLOCK_SLOT, _CLOCK_MAX_SLOT)  # the means a split needs


@attrs.define
class _Columns(loss.GpuColumns):
    """A job's splits in columns with its GPUs' tensor activity as used."""

    tensor_active: list[float] = attrs.field(factory=list)


_WEIGHT = operator.attrgetter("weight")
_PROFILE = operator.attrgetter("profile")


@attrs.define(slots=True)
class _MfuCell:
    total: float
    count: int
    attributes: Mapping[str, str]


@attrs.define
class _Window:
    # A stream's cell under its key; should the stream move to another job inside the window, the cell for
    # that job under (key, job.id). One table, so that cells keep the order their first points came in.
    cells: dict[CellKey, _Cell] = attrs.field(factory=dict)
    mfu: dict[str, _MfuCell] = attrs.field(factory=dict)
    gpus: dict[str, _GpuInputs] = attrs.field(factory=dict)  # loss inputs by stream key


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
    gpu_flags: dict[str, GpuFlag] = attrs.field(init=False)  # by the flag's metric name: per GPU inside
    horizon: _Horizon = attrs.field(factory=_Horizon)

    def __attrs_post_init__(self) -> None:
        self.reset_flags()

    def reset_flags(self) -> None:
        self.flags = {detector.metric.name: detector.start(self.config) for detector in DETECTORS}
        self.gpu_flags = {}  # started at the first window with the job's GPUs (no state before it is needed)

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
    _points_gpu: int = attrs.field(init=False, default=0)
    # A stream's energy counter as last seen: (series start, time, joules), for deltas.
    _energy: dict[str, tuple[int, int, float]] = attrs.field(init=False, factory=dict)
    # By hw.model: its price per GPU-hour and its tensor clock (None: not priced, not in the catalog).
    _prices: dict[str | None, float | None] = attrs.field(init=False, factory=dict)
    _tensor_clocks: dict[str | None, float | None] = attrs.field(init=False, factory=dict)
    _gpu_flag_reports: list[GpuFlagReport] = attrs.field(init=False, factory=list)  # of the window closing
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
            points_gpu_inputs=self._points_gpu,
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

    def add_gpu_input(
        self,
        stream_key: str,
        metric: str,
        value: float,
        start_ns: int,
        end_ns: int,
        identity: Mapping[str, str],
        reason: str | None = None,
    ) -> bool:
        """One loss input of a GPU stream (a ``GPU_INPUT_METRICS`` point, value finite and >= 0, checked by
        the caller; ``reason`` its gpu.throttle.reason); see ``add_gpu_inputs``."""
        if metric == _THROTTLE:
            if reason is None:
                return False
            return self.add_gpu_inputs(stream_key, start_ns, end_ns, identity, {}, {reason: value})
        return self.add_gpu_inputs(stream_key, start_ns, end_ns, identity, {metric: value}, {})

    def add_gpu_inputs(
        self,
        stream_key: str,
        start_ns: int,
        end_ns: int,
        identity: Mapping[str, str],
        values: Mapping[str, float],
        throttle: Mapping[str, float],
    ) -> bool:
        """A GPU stream's loss inputs of one interval: ``values`` by metric name, ``throttle`` shares by
        reason (a reason left out reads as 0). False when late or over the stream cap.

        ``gpu.energy`` is the board's cumulative counter (``start_ns`` its series start): its delta since the
        stream's previous point goes to the window of this point; a first point (or one after a reset: a new
        start time, a lower value) counts whole only when its series began within one window before it, else
        it only sets the baseline (a collector restarting mid-series must not book a day's energy into one
        window).
        """
        if end_ns > self._watermark_ns:
            self._watermark_ns = end_ns
        delta: float | None = None
        joules = values.get(_ENERGY)
        if joules is not None:
            previous = self._energy.get(stream_key)
            if previous is None and len(self._energy) >= self.config.max_streams:
                self._rejected_streams += 1
                self.refusal = "max_streams"
                return False
            if previous is not None and end_ns == previous[1]:
                return True  # a retry: already counted
            if previous is not None and end_ns < previous[1]:
                # An older interval arriving after a newer one (a load balancer's parallel exports reorder):
                # its counter reading is already inside the newer delta, but its other inputs still count.
                pass
            elif previous is not None and previous[0] == start_ns and joules >= previous[2]:
                delta = joules - previous[2]
            elif 0 < start_ns < end_ns and end_ns - start_ns <= self._window_ns:
                delta = joules
            if previous is None or end_ns > previous[1]:
                self._energy[stream_key] = (start_ns, end_ns, joules)
            if delta is None and len(values) == 1 and not throttle:
                return True
        if self._last_start < end_ns <= self._last_end:
            window = self._last_window
            window_start = self._last_start
        else:
            found = self._open_window(end_ns)
            if found is None:
                return False
            window = found
            window_start = end_ns - 1 - (end_ns - 1) % self._window_ns
        inputs = window.gpus.get(stream_key)
        if inputs is None:
            if len(window.gpus) >= self.config.max_streams:
                self._rejected_streams += 1
                self.refusal = "max_streams"
                return False
            inputs = window.gpus[stream_key] = _GpuInputs(identity)
        self._points_gpu += len(values) + len(throttle)
        if delta is not None:
            inputs.energy_j = delta if inputs.energy_j is None else inputs.energy_j + delta
        overlap = end_ns - (start_ns if start_ns > window_start else window_start)
        weight = float(overlap) if overlap > 0 else 1.0
        sums = inputs.sums
        for metric, value in values.items():
            slot = _SLOTS.get(metric)
            if slot is not None:
                sums[slot] += value * weight
                sums[slot + 1] += weight
        for reason, value in throttle.items():
            slot = _REASON_SLOTS.get(reason)
            if slot is not None:
                sums[slot] += value * weight
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
        group_end = 1 + self._groups
        # One pass over the cells, in the order their first points came. A profile (shared by the streams of a
        # job with one identity) is resolved to its group's values and its job's GPUs once per window.
        groups_values: dict[tuple[str, ...], list[float]] = {}
        jobs_gpus: dict[str, _JobGpus] = {}
        no_job = _JobGpus()  # the cells of no job go through the same steps, to be dropped
        # The appends of each profile's group values and job columns, by the profile's id: profiles are interned,
        # and one that is not only gets a route of its own to the same lists (a tuple's hash is not cached).
        routes: dict[int, _Route] = {}
        for cell_key, cell in window.cells.items():
            route = routes.get(id(cell.profile))
            if route is None:
                profile = cell.profile
                group = tuple(UNKNOWN if v is None else v for v in profile[1:group_end])
                target = no_job
                if profile[0] is not None:
                    target = jobs_gpus.setdefault(profile[0], _JobGpus())
                values = groups_values.setdefault(group, [])
                route = (values.append, target.keys.append, target.cells.append, target.ofus.append)
                routes[id(profile)] = route
            add_value, add_key, add_cell, add_ofu = route
            value = cell.weighted / cell.weight
            add_value(value)
            add_key(cell_key)
            add_cell(cell)
            add_ofu(value)
        groups = tuple(self._group_report(key, values) for key, values in sorted(groups_values.items()))
        job_reports: list[JobReport] = []
        for job_id in sorted(jobs_gpus.keys() | window.mfu.keys()):
            job = self._jobs.get(job_id)
            if job is None:  # over the job cap when its points came
                continue
            mfu_cell = window.mfu.get(job_id)
            attributes = dict(job.attributes)
            if mfu_cell is not None:
                attributes.update(mfu_cell.attributes)
            gpus = jobs_gpus.get(job_id)
            if gpus is not None:  # the GPUs' own identity wins over what the training side said
                ends = list(map(_LAST_END, gpus.cells))
                newest = gpus.cells[ends.index(max(ends))].profile[group_end:]  # the first of the latest
                attributes.update((k, v) for k, v in zip(JOB_ATTRIBUTE_KEYS, newest, strict=True) if v is not None)
            job.attributes = attributes
            job_reports.append(self._job_report(job_id, job, start, end, mfu_cell, window, gpus))
        self._windows_closed += 1
        fleet = self._fleet_report(end)
        job_losses = [job.loss for job in job_reports if job.loss is not None]
        fleet = attrs.evolve(fleet, loss=loss.fleet_loss(job_losses, self._fleet_energy(window), self._currency()))
        # In a stable order, whatever order the GPUs' points arrived in: the same data gives the same outputs.
        gpu_flags = tuple(
            sorted(self._gpu_flag_reports, key=lambda r: (r.job_id, r.metric, sorted(r.attributes.items())))
        )
        self._gpu_flag_reports = []
        return WindowReport(start, end, groups, tuple(job_reports), fleet, gpu_flags)

    def _currency(self) -> str | None:
        return self.config.currency if self.config.price_per_gpu_hour else None

    def _seconds(self, cell: _Cell) -> float:
        covered = min(cell.weight, float(self._window_ns))
        return (covered if covered >= _MIN_COVERED_NS else self._window_ns) / 1e9

    def _fleet_energy(self, window: _Window) -> float | None:
        """Every GPU's energy in the window: those of jobs and those of none, with or without OFU."""
        energies: list[float] = []
        moved: dict[str, list[_Cell]] | None = None  # cells of streams that changed job, found when needed
        for key, inputs in window.gpus.items():
            energy = inputs.energy_j
            if energy is None:
                sums = inputs.sums
                if not sums[_POWER_SLOT + 1]:
                    continue  # neither counter nor power: no energy
                if moved is None:
                    moved = {}
                    for cell_key, cell in window.cells.items():
                        if not isinstance(cell_key, str):
                            moved.setdefault(cell_key[0], []).append(cell)
                cells = moved.get(key, [])
                own = window.cells.get(key)
                if own is not None:
                    cells = [own, *cells]
                seconds = max(map(self._seconds, cells)) if cells else self._window_ns / 1e9
                energy = sums[_POWER_SLOT] / sums[_POWER_SLOT + 1] * seconds
            energies.append(energy)
        return math.fsum(energies) if energies else None  # exactly rounded: the same in any arrival order

    def _models(self, cells: list[_Cell]) -> list[str | None]:
        """The cells' GPU models, each model's price and tensor clock looked up once."""
        models = list(map(operator.itemgetter(1 + self._groups + 1), map(_PROFILE, cells)))  # see Profile
        for model in set(models) - self._prices.keys():
            spec = catalog.lookup(model) if model else None
            self._prices[model] = self.config.price_of(model)
            self._tensor_clocks[model] = spec.tensor_clock_hz if spec is not None else None
        return models

    def _gpu_losses(
        self, window: _Window, gpus: _JobGpus
    ) -> tuple[loss.GpuColumns, list[float], list[_GpuInputs | None]]:
        """The job's GPUs' splits in columns, their tensor activity as used, and their loss inputs.

        Column by column where a GPU's values need nothing but its cell (the profile gives its model: price
        and tensor clock); one pass over the GPUs that sent loss inputs.
        """
        cells = gpus.cells
        n = len(cells)
        full = float(self._window_ns)
        window_ns = self._window_ns
        covered = list(map(min, map(_WEIGHT, cells), itertools.repeat(full)))
        if min(covered) >= _MIN_COVERED_NS:
            seconds = list(map(_NS_PER_S.__rtruediv__, covered))
        else:
            seconds = [(ns if ns >= _MIN_COVERED_NS else window_ns) / _NS_PER_S for ns in covered]
        inputs_of = window.gpus
        found: list[_GpuInputs | None] = [None] * n
        if inputs_of:
            found = list(map(inputs_of.get, gpus.stream_keys()))
        ofus = gpus.ofus
        without = sum(map(operator.is_, found, itertools.repeat(None)))  # by identity: no __eq__ per GPU
        with_inputs = without < n
        prices: list[float | None] = [None] * n
        models: list[str | None] = []
        if self.config.price_per_gpu_hour or with_inputs:
            models = self._models(cells)
            prices = list(map(self._prices.__getitem__, models))
        if not with_inputs:
            idle, clock, tensor = loss.split_ofu_only(ofus)
            columns = loss.GpuColumns(ofus, idle, clock, tensor, seconds, [None] * n, [None] * n, prices)
            return columns, ofus, found
        if not without:
            fast = self._gpu_losses_of_inputs(cast(list[_GpuInputs], found), ofus, seconds, prices, models)
            if fast is not None:
                return fast, fast.tensor_active, found
        columns = loss.GpuColumns(ofu=ofus, seconds=seconds, price=prices)
        idle_of, clock_of, tensor_of = columns.idle.append, columns.clock.append, columns.tensor.append
        energy_of, flops_of = columns.energy_j.append, columns.flops.append
        tensor_active: list[float] = []
        tpa_of = tensor_active.append
        split = loss.split_shares
        ratio_of = loss.clock_ratio
        clocks = map(self._tensor_clocks.__getitem__, models)
        for ofu, inputs, gpu_seconds, tensor_clock in zip(ofus, found, seconds, clocks, strict=True):
            if inputs is None:
                shares = split(ofu, None, None)
                energy = flops = None
            else:
                sums = inputs.sums
                weight = sums[_TENSOR_SLOT + 1]
                active = sums[_TENSOR_SLOT] / weight if weight else None
                weight = sums[_CLOCK_SLOT + 1]
                sm_clock = sums[_CLOCK_SLOT] / weight if weight else None
                weight = sums[_CLOCK_MAX_SLOT + 1]
                max_clock = sums[_CLOCK_MAX_SLOT] / weight if weight else None
                shares = split(ofu, active, ratio_of(sm_clock, max_clock, tensor_clock))
                energy = inputs.energy_j
                if energy is None:  # no counter: mean power x seconds
                    weight = sums[_POWER_SLOT + 1]
                    energy = sums[_POWER_SLOT] / weight * gpu_seconds if weight else None
                weight = sums[_FLOPS_SLOT + 1]
                flops = sums[_FLOPS_SLOT] / weight * gpu_seconds if weight else None
            tpa_of(shares[0])
            idle_of(shares[1])
            clock_of(shares[2])
            tensor_of(shares[3])
            energy_of(energy)
            flops_of(flops)
        return columns, tensor_active, found

    def _gpu_losses_of_inputs(
        self,
        inputs: list[_GpuInputs],
        ofus: list[float],
        seconds: list[float],
        prices: list[float | None],
        models: list[str | None],
    ) -> _Columns | None:
        """``_gpu_losses`` in columns for a job whose GPUs all sent tensor activity and clocks (the producer's
        layout); None where one did not (the GPU by GPU pass handles those)."""
        sums = list(map(_SUMS_OF, inputs))
        weights = [list(map(operator.itemgetter(slot + 1), sums)) for slot in _MEAN_SLOTS]
        if any(0.0 in column for column in weights):
            return None
        means = [
            list(map(operator.truediv, map(operator.itemgetter(slot), sums), column))
            for slot, column in zip(_MEAN_SLOTS, weights, strict=True)
        ]
        active, sm_clock, max_clock = means
        references = [
            tensor_clock if tensor_clock else board_max
            for tensor_clock, board_max in zip(map(self._tensor_clocks.__getitem__, models), max_clock, strict=True)
        ]
        if not min(references) > 0.0:
            return None
        tpa, idle, clock, tensor = loss.split_columns(ofus, active, loss.clock_ratios(sm_clock, references))
        energy: list[float | None] = []
        flops: list[float | None] = []
        for gpu_seconds, found, gpu_sums in zip(seconds, inputs, sums, strict=True):
            joules = found.energy_j
            if joules is None:  # no counter: mean power x seconds
                weight = gpu_sums[_POWER_SLOT + 1]
                joules = gpu_sums[_POWER_SLOT] / weight * gpu_seconds if weight else None
            energy.append(joules)
            weight = gpu_sums[_FLOPS_SLOT + 1]
            flops.append(gpu_sums[_FLOPS_SLOT] / weight * gpu_seconds if weight else None)
        return _Columns(ofus, idle, clock, tensor, seconds, energy, flops, prices, tensor_active=tpa)

    def _assess_gpus(
        self,
        job_id: str,
        job: _Job,
        window: GpuWindowValues,
        inputs: list[_GpuInputs | None],
    ) -> None:
        """Run the GPU-level flags on the job's GPUs; keep the points they have to show."""
        for name, flag in job.gpu_flags.items():
            for verdict in flag.assess(window):
                i = verdict.index
                attributes = {**_gpu_identity(window.keys[i], inputs[i]), **verdict.labels}
                self._gpu_flag_reports.append(
                    GpuFlagReport(name, job_id, attributes, verdict.value, window.ofu[i], window.job_median_ofu[i])
                )

    def _group_report(self, key: tuple[str, ...], values: list[float]) -> GroupReport:
        values.sort()
        return GroupReport(
            attributes=dict(zip(self.config.group_keys, key, strict=True)),
            gpus=len(values),
            quantiles={q: percentile_of_sorted(values, q) for q in names.QUANTILES},
            histogram=ExpHistogram.from_sorted(values, max_buckets=self.config.histogram_max_buckets),
            ofu_sum=sum(values),
            ofu_min=values[0],
            ofu_max=values[-1],
        )

    def _job_report(
        self,
        job_id: str,
        job: _Job,
        start: int,
        end: int,
        mfu_cell: _MfuCell | None,
        window: _Window,
        gpus: _JobGpus | None,
    ) -> JobReport:
        config = self.config
        ofus = gpus.ofus if gpus is not None else None
        ofu = math.fsum(ofus) / len(ofus) if ofus else None  # exactly rounded: the same in any GPU order
        mfu = mfu_cell.total / mfu_cell.count if mfu_cell is not None else None
        if ofu is not None and mfu is not None:
            job.horizon.add(start - start % self._block_ns, ofu, mfu)
            if self._last_pair_start is None or start > self._last_pair_start:
                self._last_pair_start = start
        job_loss = None
        count = 0
        idle_gpus: frozenset[str] = frozenset()
        if gpus is not None:
            columns, tensor_active, inputs = self._gpu_losses(window, gpus)
            job_loss = loss.job_loss_of(
                columns, currency=self._currency(), pue=config.pue, grid_intensity=config.grid_intensity
            )
            keys = gpus.stream_keys()
            idle = list(map(loss.IDLE_TENSOR_ACTIVE.__gt__, tensor_active))  # active < IDLE_TENSOR_ACTIVE
            idle_gpus = frozenset(itertools.compress(keys, idle))
            count = len(keys)
        values = JobWindowValues(start, end, ofu, mfu, count, idle_gpus)
        flags = {name: flag.assess(values) for name, flag in job.flags.items()}
        if gpus is not None and GPU_DETECTORS:
            if not job.gpu_flags:
                job.gpu_flags = {detector.metric.name: detector.start(config) for detector in GPU_DETECTORS}
            cells = gpus.cells

            def throttle(i: int) -> Mapping[str, float]:
                found = inputs[i]
                return found.throttle_shares(cells[i].weight) if found is not None else {}

            gpu_values = GpuWindowValues(
                start, end, keys, gpus.ofus, tensor_active, idle, _peer_medians(gpus.ofus), throttle
            )
            self._assess_gpus(job_id, job, gpu_values, inputs)
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
            gpus=count,
            loss=job_loss,
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
        stale_energy = [key for key, (_start, seen, _joules) in self._energy.items() if seen <= cutoff]
        for key in stale_energy:
            del self._energy[key]
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


def _peer_medians(values: list[float]) -> list[float]:
    """For each value, the median of the others (a GPU's peers: its own OFU is not its reference); O(n log n).

    A lone value has no peers: its own value stands in (nothing is below itself). Without one value, the
    others' median takes one of at most three values, by where that value lies against the middle one.
    """
    n = len(values)
    if n < 2:
        return list(values)
    ordered = sorted(values)
    half = (n - 1) // 2
    pivot = ordered[half]
    if pivot == 0.0:
        return _peer_medians_by_rank(values)  # 0.0 and -0.0 tie there: which one is the median goes by rank
    if n % 2 == 0:  # an odd number of peers: the middle one
        above, at_or_below = ordered[half], ordered[half + 1]
        return [above if value > pivot else at_or_below for value in values]
    # An even number of peers: the mean of the two middle ones.
    above = (ordered[half - 1] + ordered[half]) / 2
    at = (ordered[half - 1] + ordered[half + 1]) / 2
    below = (ordered[half] + ordered[half + 1]) / 2
    return [above if value > pivot else below if value < pivot else at for value in values]


def _peer_medians_by_rank(values: list[float]) -> list[float]:
    """``_peer_medians`` by each value's rank in a stable sort (ties in input order)."""
    n = len(values)
    order = sorted(range(n), key=values.__getitem__)
    ordered = [values[i] for i in order]
    half = (n - 1) // 2
    if n % 2 == 0:  # below the middle the next one up is the median, from it up the middle one
        by_rank = [ordered[half + 1]] * (half + 1) + [ordered[half]] * (n - half - 1)
    else:
        by_rank = [(ordered[half] + ordered[half + 1]) / 2] * half
        by_rank.append((ordered[half - 1] + ordered[half + 1]) / 2)
        by_rank += [(ordered[half - 1] + ordered[half]) / 2] * (n - half - 1)
    found = [0.0] * n
    for index, median in zip(order, by_rank, strict=True):
        found[index] = median
    return found


def _gpu_identity(key: str, inputs: _GpuInputs | None) -> dict[str, str]:
    """The GPU's identity attributes: from its points where it sent loss inputs, else from its stream key."""
    if inputs is not None:
        found = {k: inputs.identity[k] for k in _GPU_IDENTITY_KEYS if inputs.identity.get(k)}
        if found.get(names.HW_ID):
            return found
    parts = key.split("|")  # host|hw.id[|mig], decode.stream_key
    if len(parts) < 2:
        return {names.HW_ID: key}
    found = {names.HOST_NAME: parts[0], names.HW_ID: parts[1]} if parts[0] else {names.HW_ID: parts[1]}
    if len(parts) > 2:
        found[names.GPU_MIG_INSTANCE_ID] = parts[2]
    return found
