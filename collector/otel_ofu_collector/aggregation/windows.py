"""Tumbling windows over OFU and MFU points: fleet percentiles per group, per-job correlation and flags.

Pure and single-threaded: the service feeds points and calls ``flush(now_ns)``; nothing here reads a clock.

Windows. Aligned to multiples of ``window_s`` since the epoch (shards agree without talking) and closed on
the right: window (start, end] holds the points whose end time lies in it, so a producer exporting exactly
on the boundary lands in the window its interval covers. A window closes once ``end + lateness <= now``;
a point arriving for a closed window is late: counted, returned False, never mixed into a later window.

Per GPU. A GPU ("stream", the caller's key) with several points in a window counts once: its OFU is the
time-weighted mean of its points (weight = the part of the point's interval inside the window), and its time is the
union of the parts of its intervals inside the window (``coverage``): a request delivered twice, a reading sent again
or intervals that overlap by a timer's jitter add nothing, and no GPU has more than the window. A point without an
interval (no start time, or one at or after its end) covers the time since the stream's previous point, if that is
within ``stale_after_s``; a stream's first such point marks its start and covers nothing. A GPU that reports an
interval without OFU (``add_unmeasured``: ``gpu.ofu.unmeasured``) has that time too, unmeasured. A stream that moves
to another job inside a window has a cell per job, each with its own intervals; its group and job attributes are those
of its latest point.

Per job (``job.id`` of the OFU points, ``job.mfu`` by job id). Every average is weighted by GPU time (GPU equivalents
x seconds, ``aggregation.loss``): the job's OFU is its useful GPU-seconds over its GPU-seconds (so OFU x GPU time is
the useful GPU time exactly, and unmeasured time counts in it as neither work nor idleness); MFU = mean of its
``job.mfu`` points; gap = MFU - the OFU of its measured time (MFU speaks for every GPU of the job, so it is compared
with what was measured: the two OFUs are the same number whenever every GPU gave OFU). ``job.gpus`` is its
GPU-seconds over the window's: GPU equivalents on average over the window, so a GPU that moved job half way counts
half in each and once in the fleet, on one collector or across shards. Correlation: Pearson r of the job's (measured
OFU, MFU) window pairs over the horizon, kept as co-moments in blocks of whole windows (the window itself up to 1/48
of the horizon, so the state stays small: the horizon is then honoured to within one block). Flags: every detector of
``detectors.DETECTORS`` (the job flags ``flops_miscount``, ``regression`` and ``idle_gpus``: each module says when
its flag rises) judges each of the job's windows on its measured OFU, with state of its own per job; every one of
``detectors.GPU_DETECTORS`` (``straggler``) each of its GPUs that gave OFU.

Where OFU is lost (``aggregation.loss``). Beside ``gpu.ofu`` each GPU stream sends its tensor activity,
clocks, achieved FLOP/s, power and throttle shares (``add_gpu_inputs``) and its energy counter
(``add_gpu_counters``); per window they are time-weighted means like OFU's, energy a sum of the counter's deltas
(split over the windows, and over the jobs a GPU served in one, by time). Closing a window splits each job's 1 - OFU
by cause, sums its GPU-seconds, energy and cost, and runs the GPU-level flags (``gpu.straggler``) on each of its GPUs
against the job's median OFU; the fleet totals add its jobs' lost time and cost and every GPU's energy.

Groups (``fleet.ofu``, ``fleet.ofu.quantile``, ``fleet.gpus``). The histogram counts observations (a GPU's OFU in a
window, per job it served); the percentiles are over GPU capacity (``stats.quantiles``: each OFU weighs its GPU
equivalents x the seconds it covered); ``fleet.gpus`` is the group's GPU-seconds over the window's, unmeasured GPUs
included. A shard also builds each group's capacity histogram, which its merge tier reads the same percentiles from.

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
import logging
import math
import operator
import threading
from array import array
from collections.abc import Mapping
from typing import cast

import attrs

from otel_ofu import bounds, catalog, gpu_share, names
from otel_ofu_collector.aggregation import coverage, loss
from otel_ofu_collector.aggregation.jobs import (
    JOB_STATE_BYTES,
    RESERVED_SHARE,
    JobLedger,
    JobState,
    open_places,
    point_ofu,
)
from otel_ofu_collector.config import AggregatorConfig
from otel_ofu_collector.detectors import (
    GPU_DETECTORS,
    GpuWindowValues,
)
from otel_ofu_collector.results import (
    GpuFlagReport,
    GpuReport,
    GroupReport,
    JobReport,
    JobWindow,
    WindowReport,
)
from otel_ofu_collector.stats.exphist import ExpHistogram
from otel_ofu_collector.stats.quantiles import capacity_quantiles_of_sorted

logger = logging.getLogger(__name__)

UNKNOWN = "unknown"
JOB_ATTRIBUTE_KEYS = (names.JOB_NAME, names.HW_MODEL, names.GPU_PRECISION)
# What sizes a partition (a MIG slice, an AMD compute partition) against its GPU: the last two of a profile.
SHARE_KEYS = (names.GPU_MIG_PROFILE, names.GPU_COMPUTE_PARTITION)
# A window whose close fails this many flushes in a row is dropped (counted): a defect must not stop the rest.
_CLOSE_ATTEMPTS = 3
# What ``max_state_bytes`` counts per GPU stream and per job besides the identity values they keep: a stream's
# cells, loss inputs and stream and energy entries (the benchmarks measure 1.7-1.8 KB in all), a job's flags and
# horizon.
STREAM_STATE_BYTES = 2048
R = names.RejectReason
_TENSOR = names.GPU_TENSOR_ACTIVE.name
_CLOCK = names.GPU_CLOCK_SM.name
_CLOCK_MAX = names.GPU_CLOCK_SM_MAX.name
_FLOPS = names.GPU_FLOPS_ACHIEVED.name
_POWER = names.GPU_POWER.name
_ENERGY = names.GPU_ENERGY.name
_THROTTLE = names.GPU_THROTTLE.name
_ENGINE = names.GPU_ENGINE_ACTIVE.name
_SM = names.GPU_SM_ACTIVE.name
_DRAM = names.GPU_DRAM_ACTIVE.name
_GPU_IDENTITY_KEYS = (names.HOST_NAME, names.HW_ID, names.GPU_MIG_INSTANCE_ID)
_NS_PER_S = 1e9
# Seconds of a GPU's time in a window its energy counter's deltas may leave uncovered before its power fills them:
# the two cover the same intervals, up to the rounding of their splits over windows.
_UNCOVERED_S = 1e-6
# How far a counter series' start may be from its stream's first point for the series to count as begun with it.
_SERIES_SLACK_NS = 1_000_000_000

# A stream's identity as the windows need it: (job.id, *group values, *JOB_ATTRIBUTE_KEYS values, *SHARE_KEYS
# values), None if absent. Interned, so the streams of one job share one tuple.
Profile = tuple[str | None, ...]
# A cell's key in its window: the stream's key; (key, job.id) for the cell of a stream that moved job in it.
CellKey = str | tuple[str, str | None]
# An interval's part in one window: (window, low, high, ns carried in from windows that had closed), its span
# (low, high] inside the window.
_Part = tuple["_Window", int, int, float]


@attrs.frozen
class AggregatorStats:
    points_ofu: int = 0
    points_mfu: int = 0
    points_unmeasured: int = 0
    late_points: int = 0
    points_gpu_inputs: int = 0
    rejected_stream_cap: int = 0
    rejected_job_cap: int = 0
    evicted_streams: int = 0
    evicted_jobs: int = 0
    windows_closed: int = 0
    rejected_state_cap: int = 0  # new streams refused at max_state_bytes
    windows_failed: int = 0  # windows given up after _CLOSE_ATTEMPTS failed closes
    close_failures: Mapping[str, int] = attrs.field(factory=dict)  # groups, jobs, fleet totals left out, by kind


@attrs.define(slots=True)
class _Cell:
    """One stream (for one job) in one window. ``weighted`` / ``weight``: its OFU points' time-weighted sum and
    weight (their mean is the GPU's OFU; weight 0: no OFU point, only unmeasured time). ``spans``: what its OFU points
    cover in the window (``coverage``), ``unmeasured`` what its points without OFU cover (None until one comes);
    ``carried`` and ``carried_unmeasured``: ns of earlier windows that had closed when the point came (see
    ``Aggregator._parts``)."""

    weighted: float
    weight: float
    profile: Profile
    last_end_ns: int
    job_id: str | None
    spans: list[int]
    carried: float = 0.0
    unmeasured: list[int] | None = None
    carried_unmeasured: float = 0.0

    def seconds(self) -> tuple[float, float]:
        """(seconds in the window, seconds of them its OFU covered)."""
        spans = self.spans
        measured = spans[1] - spans[0] if len(spans) == 2 else coverage.covered(spans)
        total = measured if self.unmeasured is None else coverage.covered_union(spans, self.unmeasured)
        measured_s = (measured + self.carried) / _NS_PER_S
        return (total + self.carried + self.carried_unmeasured) / _NS_PER_S, measured_s


# Where each averaged loss input keeps its (weighted sum, weight) pair in ``_GpuInputs.sums``; after them the NVLink
# and PCIe bytes of the window (their counters' deltas, both directions) and each throttle reason's weighted share
# (over the GPU's OFU weight: the same intervals).
_SLOTS: dict[str, int] = {
    _TENSOR: 0,
    _CLOCK: 2,
    _CLOCK_MAX: 4,
    _FLOPS: 6,
    _POWER: 8,
    _ENGINE: 10,
    _SM: 12,
    _DRAM: 14,
}
_NVLINK_SLOT, _PCIE_SLOT = 16, 18  # (bytes, parts counted): the second says the GPU sent the counter at all
_REASON_SLOTS: dict[str, int] = {reason: 20 + i for i, reason in enumerate(names.ThrottleReason.ALL)}
_SUMS = 20 + len(_REASON_SLOTS)
_TENSOR_SLOT, _CLOCK_SLOT, _CLOCK_MAX_SLOT, _FLOPS_SLOT, _POWER_SLOT = (
    _SLOTS[_TENSOR],
    _SLOTS[_CLOCK],
    _SLOTS[_CLOCK_MAX],
    _SLOTS[_FLOPS],
    _SLOTS[_POWER],
)
_ENGINE_SLOT, _SM_SLOT, _DRAM_SLOT = _SLOTS[_ENGINE], _SLOTS[_SM], _SLOTS[_DRAM]
# The cumulative counters a GPU stream sends, by field (``otlp.roles.keyed_field``), with their metric; and where
# the I/O counters' deltas go (energy has a field of its own, ``_GpuInputs.energy_j``).
_COUNTER_FIELDS: dict[str, str] = {
    _ENERGY: _ENERGY,
    **{
        f"{metric}|{direction}": metric
        for metric in (names.GPU_NVLINK_IO.name, names.GPU_PCIE_IO.name)
        for direction in names.IoDirection.ALL
    },
}
# Each counter field's most per second a GPU can reach (``otel_ofu.bounds.MAX_RATES``).
_COUNTER_RATES: dict[str, float] = {field: bounds.MAX_RATES[metric] for field, metric in _COUNTER_FIELDS.items()}
_COUNTER_SLOTS: dict[str, int] = {
    f"{metric}|{direction}": slot
    for metric, slot in ((names.GPU_NVLINK_IO.name, _NVLINK_SLOT), (names.GPU_PCIE_IO.name, _PCIE_SLOT))
    for direction in names.IoDirection.ALL
}


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
    energy_ns: float = 0.0  # the time the counter's deltas cover in the window

    def energy(self, seconds: float) -> float | None:
        """The GPU's energy over its ``seconds`` in the window: the counter's deltas, and mean power x the seconds
        they do not cover (a counter's first reading here only sets its baseline: a collector restarted, or a job
        moved to this shard); mean power x the seconds without a counter; None with neither."""
        sums = self.sums
        weight = sums[_POWER_SLOT + 1]
        if self.energy_j is None:
            return sums[_POWER_SLOT] / weight * seconds if weight else None
        uncovered = seconds - self.energy_ns / _NS_PER_S
        if weight and uncovered > _UNCOVERED_S:
            return self.energy_j + sums[_POWER_SLOT] / weight * uncovered
        return self.energy_j

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
    """A job's cells in a window closing, in columns: the cells' keys, the cells, their OFU (None: the cell has only
    unmeasured time), their seconds in the window and the seconds their OFU covered, and their GPU shares."""

    keys: list[CellKey] = attrs.field(factory=list)
    cells: list[_Cell] = attrs.field(factory=list)
    ofus: list[float | None] = attrs.field(factory=list)
    seconds: list[float] = attrs.field(factory=list)
    measured: list[float] = attrs.field(factory=list)
    shares: list[float] | None = None  # each GPU's share of a physical GPU; None: all whole GPUs

    def stream_keys(self) -> list[str]:
        keys = self.keys
        if all(map(isinstance, keys, itertools.repeat(str))):  # no stream moved job: the keys as they are
            return cast(list[str], keys)
        return [key if isinstance(key, str) else key[0] for key in keys]

    def with_ofu(self) -> list[int]:
        """The positions of the cells that have OFU."""
        return [i for i, ofu in enumerate(self.ofus) if ofu is not None]


@attrs.define(slots=True)
class _GroupCells:
    """A group's cells in a window closing: the OFU of those that have it with their measured capacity-seconds (share
    x seconds their OFU covered) and shares, and every cell's capacity-seconds (unmeasured ones too)."""

    values: list[float] = attrs.field(factory=list)
    weights: list[float] = attrs.field(factory=list)
    shares: list[float] = attrs.field(factory=list)
    capacity_s: list[float] = attrs.field(factory=list)


_LAST_END = operator.attrgetter("last_end_ns")
_SUMS_OF = operator.attrgetter("sums")
# The means a split needs (tensor activity, clocks, engine and SM activity), and DRAM activity for its context.
_MEAN_SLOTS = (_TENSOR_SLOT, _CLOCK_SLOT, _CLOCK_MAX_SLOT, _ENGINE_SLOT, _SM_SLOT, _DRAM_SLOT)
_PROFILE = operator.attrgetter("profile")
# Capacity histograms (a shard's, for its merge tier) count GPU-microseconds: whole units, fine enough for a slice.
_CAPACITY_UNITS_PER_S = 1e6


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


def _window_start(time_ns: int, window_ns: int) -> int:
    return ((time_ns - 1) // window_ns) * window_ns


@attrs.define
class Aggregator:
    """Windows, correlation and flags for one collector process (or one shard)."""

    config: AggregatorConfig
    _window_ns: int = attrs.field(init=False)
    _lateness_ns: int = attrs.field(init=False)
    _max_interval_ns: int = attrs.field(init=False)
    _profile_keys: tuple[str, ...] = attrs.field(init=False)
    _groups: int = attrs.field(init=False)
    _model_index: int = attrs.field(init=False)  # where hw.model is in a profile
    _windows: dict[int, _Window] = attrs.field(init=False, factory=dict)
    _streams: dict[str, int] = attrs.field(init=False, factory=dict)  # key -> last seen end_ns
    _first_starts: dict[str, int] = attrs.field(init=False, factory=dict)  # key -> start of its first point here
    # Hashes of evicted streams' keys, oldest first (at most max_streams): they find a place kept for them.
    _returning: dict[int, None] = attrs.field(init=False, factory=dict)
    _cache_bytes: int = attrs.field(init=False, default=0)  # the decoder's identity cache (``cache_budget``)
    # key -> (end, start) of the latest interval inferred for a point without one (``_inferred_start``)
    _instant_starts: dict[str, tuple[int, int]] = attrs.field(init=False, factory=dict)
    _ledger: JobLedger = attrs.field(init=False)  # every job's state: flags, correlation horizon
    _profiles: dict[Profile, Profile] = attrs.field(init=False, factory=dict)
    _watermark_ns: int = attrs.field(init=False, default=0)
    _flushed_ns: int | None = attrs.field(init=False, default=None)
    _next_start: int | None = attrs.field(init=False, default=None)
    _last_data_end: int | None = attrs.field(init=False, default=None)  # the last closed window that held data
    _last_eviction_ns: int | None = attrs.field(init=False, default=None)
    _points_ofu: int = attrs.field(init=False, default=0)
    _points_unmeasured: int = attrs.field(init=False, default=0)
    _points_mfu: int = attrs.field(init=False, default=0)
    _late: int = attrs.field(init=False, default=0)
    _rejected_streams: int = attrs.field(init=False, default=0)
    _evicted_streams: int = attrs.field(init=False, default=0)
    _rejected_state: int = attrs.field(init=False, default=0)
    _state_bytes: int = attrs.field(init=False, default=0)  # streams' and jobs' (see ``state_bytes``)
    _profiles_bytes: int = attrs.field(init=False, default=0)
    # Guards the aggregator: whoever calls it (the decoder per request, the service's flush) holds it.
    lock: threading.Lock = attrs.field(init=False, factory=threading.Lock)
    _windows_closed: int = attrs.field(init=False, default=0)
    _points_gpu: int = attrs.field(init=False, default=0)
    # Each cumulative counter's latest reading by stream, by field (gpu.energy, gpu.nvlink.io|transmit, ...): (series
    # start, time, value), the baseline of the next delta.
    _counters: dict[str, dict[str, tuple[int, int, float]]] = attrs.field(init=False, factory=dict)
    # By hw.model: its price per GPU-hour and its tensor clock (None: not priced, not in the catalog).
    _prices: dict[str | None, float | None] = attrs.field(init=False, factory=dict)
    _tensor_clocks: dict[str | None, float | None] = attrs.field(init=False, factory=dict)
    # Closing: attempts at a window that failed, windows given up, groups/jobs/fleet totals that failed by kind,
    # partitioned models not in the catalog (said once).
    _close_attempts: dict[int, int] = attrs.field(init=False, factory=dict)
    _windows_failed: int = attrs.field(init=False, default=0)
    _close_failures: dict[str, int] = attrs.field(init=False, factory=dict)
    _unsized: set[tuple[str | None, str | None]] = attrs.field(init=False, factory=set)
    # The window the last point went to, (start, start + width]: consecutive points mostly share it.
    _last_start: int = attrs.field(init=False, default=-1)
    _last_end: int = attrs.field(init=False, default=-1)
    _last_window: _Window = attrs.field(init=False, factory=_Window)  # an empty stand-in while the range is void

    def __attrs_post_init__(self) -> None:
        config = self.config
        self._window_ns = config.window_ns
        self._lateness_ns = config.lateness_ns
        # A point covering more than this is refused: its stream would have been evicted as silent meanwhile.
        self._max_interval_ns = config.stale_after_ns
        self._ledger = JobLedger(config)
        self._profile_keys = (names.JOB_ID, *config.group_keys, *JOB_ATTRIBUTE_KEYS, *SHARE_KEYS)
        self._groups = len(config.group_keys)
        self._model_index = 1 + self._groups + JOB_ATTRIBUTE_KEYS.index(names.HW_MODEL)

    # --- ingest ------------------------------------------------------------------------------------

    @property
    def watermark_ns(self) -> int:
        return self._watermark_ns

    @property
    def stats(self) -> AggregatorStats:
        return AggregatorStats(
            points_ofu=self._points_ofu,
            points_mfu=self._points_mfu,
            points_unmeasured=self._points_unmeasured,
            late_points=self._late,
            points_gpu_inputs=self._points_gpu,
            rejected_stream_cap=self._rejected_streams,
            rejected_job_cap=self._ledger.rejected,
            evicted_streams=self._evicted_streams,
            evicted_jobs=self._ledger.evicted,
            windows_closed=self._windows_closed,
            rejected_state_cap=self._rejected_state,
            windows_failed=self._windows_failed,
            close_failures=dict(self._close_failures),
        )

    @property
    def streams(self) -> int:
        return len(self._streams)

    @property
    def jobs(self) -> int:
        """Jobs in state: live ones and evicted ones whose horizon blocks still count for the fleet."""
        return len(self._ledger.jobs)

    def cache_budget(self, cache_bytes: int) -> int:
        """The decoder's identity cache now holds ``cache_bytes``: counted in the state bound from now on; what it may
        hold at most is what the bound leaves the windows' own state."""
        self._cache_bytes = cache_bytes
        return max(0, self.config.max_state_bytes - self.state_bytes)

    def live_entries(self) -> int:
        """GPU streams and jobs in state: what the decoder's resource cache bound follows."""
        return len(self._streams) + len(self._ledger.jobs)

    @property
    def state_bytes(self) -> int:
        """The windows' state in bytes, as bounded by ``max_state_bytes``: a fixed part per GPU stream and job
        (``STREAM_STATE_BYTES``, ``JOB_STATE_BYTES``) and the identity values the windows keep."""
        return self._state_bytes + self._ledger.state_bytes + self._profiles_bytes

    def restart_close_time(self, now_ns: int) -> int | None:
        """After ``close_all`` at ``now_ns``, the close time a restarted collector should ``flush`` its fresh
        aggregator to, so that the windows exported are closed there too; None when none closed.

        No later than the window ``now_ns`` falls in (its end plus the lateness): windows ahead of the clock
        exist only for a producer whose clock runs ahead (within the future bound, 5 min by default), and
        keeping them closed would refuse every producer's points as late for that long after the restart.
        Such a window may instead be exported again by the next run."""
        if self._flushed_ns is None:
            return None
        current_end = _window_start(now_ns, self._window_ns) + self._window_ns
        return min(self._flushed_ns, current_end + self._lateness_ns)

    def _is_late(self, start: int) -> bool:
        return self._flushed_ns is not None and start + self._window_ns + self._lateness_ns <= self._flushed_ns

    def _open_window(self, time_ns: int) -> _Window | None:
        """The open window for a point at time_ns, or None (counted) when that window already closed."""
        start = _window_start(time_ns, self._window_ns)
        if self._is_late(start):
            self._late += 1
            return None
        window = self._windows.get(start)
        if window is None:
            window = self._windows[start] = _Window()
            if self._next_start is None or start < self._next_start:
                self._next_start = start
        return window

    def profile_of(self, identity: Mapping[str, str]) -> Profile:
        """What the windows keep of an identity (job, group, job attribute and partition values), interned.

        ``add_ofu`` takes it with every point; the decoder derives it once per Resource and passes it along.
        """
        raw = tuple(map(identity.get, self._profile_keys))
        found = self._profiles.get(raw)
        if found is None:
            size = _profile_bytes(raw)
            if self.state_bytes + self._cache_bytes + size > self.config.max_state_bytes:
                return raw  # not kept: at the bound, an identity is not interned (its points are refused anyway)
            found = self._profiles[raw] = raw
            self._profiles_bytes += size
        return found

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
        # The hot path of ingest: the next interval of a stream whose previous point went to this window, for the
        # same job (the same interned profile), inside it. Everything else takes ``_add_point``.
        if self._last_start <= start_ns < end_ns <= self._last_end:
            cell = self._last_window.cells.get(stream_key)
            if cell is not None and cell.profile is profile:
                streams = self._streams
                last_seen = streams.get(stream_key)
                job_id = cell.job_id
                job = self._ledger.jobs.get(job_id) if job_id is not None else None
                if last_seen is not None and (job_id is None or (job is not None and job.live)):
                    if end_ns > self._watermark_ns:
                        self._watermark_ns = end_ns
                    if end_ns > last_seen:
                        streams[stream_key] = end_ns
                    if job is not None and end_ns > job.last_seen_ns:
                        job.last_seen_ns = end_ns
                    weight = float(end_ns - start_ns)
                    cell.weighted += value * weight
                    cell.weight += weight
                    spans = cell.spans
                    if spans and spans[-1] == start_ns:  # the interval after the last one: the common case
                        spans[-1] = end_ns
                    else:
                        coverage.cover(spans, start_ns, end_ns)
                    if end_ns > cell.last_end_ns:
                        cell.last_end_ns = end_ns
                    self._points_ofu += 1
                    return None
        refused = self._add_point(stream_key, value, start_ns, end_ns, identity, profile)
        if refused is None:
            self._points_ofu += 1
        return refused

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
        refused = self._add_point(stream_key, None, start_ns, end_ns, identity, profile)
        if refused is None:
            self._points_unmeasured += 1
        return refused

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
        streams = self._streams
        last_seen = streams.get(stream_key)
        if last_seen is None:
            refused = self._new_stream_refusal(stream_key, end_ns, identity)
            if refused is not None:
                return refused
        if start_ns >= end_ns:
            start_ns = self._inferred_start(stream_key, end_ns, last_seen)
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
                    return R.LATE
            window = found
            self._last_start = window_start
            self._last_end = window_start + self._window_ns
            self._last_window = window
        if profile is None:
            profile = self.profile_of(identity)
        job_id = profile[0] or None  # job.id; an empty one names no job
        if job_id is not None:
            job = self._ledger.jobs.get(job_id)
            if job is None or not job.live:
                reserved = last_seen is not None or hash(stream_key) in self._returning  # a GPU that reported before
                if self._ledger.admit(job_id, end_ns, reserved) is None:
                    return R.MAX_JOBS  # a job the windows cannot keep: its GPUs' OFU would count in no job
            elif end_ns > job.last_seen_ns:
                job.last_seen_ns = end_ns
        if last_seen is None:
            streams[stream_key] = end_ns
            self._first_starts[stream_key] = start_ns
            self._state_bytes += STREAM_STATE_BYTES + 2 * len(stream_key)
        elif end_ns > last_seen:
            streams[stream_key] = end_ns
        # Time of windows that closed before the point came is carried into the first open one only for a point
        # that extends its stream: an older one sent again (a retry) would bill it twice.
        extends = last_seen is None or end_ns > last_seen
        if start_ns >= window_start:  # the whole interval in one window: the common case
            _add_to_cell(window, stream_key, value, start_ns, end_ns, 0.0, profile, job_id, extends)
        else:
            for part_window, low, high, carried in self._parts(start_ns, end_ns, window_start, window):
                _add_to_cell(part_window, stream_key, value, low, high, carried, profile, job_id, extends)
        return None

    def _new_stream_refusal(self, stream_key: str, end_ns: int, identity: Mapping[str, str]) -> str | None:
        """Why a point of a stream not in state cannot start one (counted), None when it can.

        A tenth of ``max_streams`` and of ``max_state_bytes`` is kept for streams that reported before (evicted since
        as silent): a flood of new identities fills the rest and is refused there, while the fleet's own GPUs coming
        back still find room. The decoder's identity cache counts in the bytes (``cache_budget``)."""
        config = self.config
        returning = hash(stream_key) in self._returning
        share = 1.0 if returning else 1.0 - RESERVED_SHARE
        over_streams = len(self._streams) >= (config.max_streams if returning else open_places(config.max_streams))
        # What the stream may bring: its entry, its identity values (interned as a profile, and the job's id) and a
        # job's state if the job is new.
        job_id = identity.get(names.JOB_ID)
        brings = STREAM_STATE_BYTES + 2 * len(stream_key) + 64 + 2 * sum(map(len, identity.values()))
        if job_id and job_id not in self._ledger.jobs:
            brings += JOB_STATE_BYTES
        needed = self.state_bytes + self._cache_bytes + brings
        over_bytes = needed > config.max_state_bytes * share
        if not (over_streams or over_bytes):
            return None
        if self._is_late(_window_start(end_ns, self._window_ns)):
            self._late += 1  # a late point is counted as late only
            return R.LATE
        if over_streams:
            self._rejected_streams += 1
            return R.MAX_STREAMS
        self._rejected_state += 1
        return R.MAX_STATE

    def _inferred_start(self, stream_key: str, end_ns: int, last_seen: int | None) -> int:
        """Where the interval of a point without one begins: the stream's previous time (its latest end before this
        point's), if within ``stale_after_s``; the point's own end (no time) for a stream's first. Every point of
        one interval (its OFU, its gauges) gets the same start, in whatever order they come: scrapes without start
        times (the SDK's encoder and Prometheus leave gauges without one) are weighed alike."""
        found = self._instant_starts.get(stream_key)
        if found is not None and found[0] == end_ns:
            return found[1]
        start_ns = end_ns
        if last_seen is not None and 0 < end_ns - last_seen <= self._max_interval_ns:
            start_ns = last_seen
        self._instant_starts[stream_key] = (end_ns, start_ns)
        return start_ns

    def _parts(self, start_ns: int, end_ns: int, end_start: int, end_window: _Window) -> list[_Part]:
        """An interval (start, end] that began before the window holding its end (``end_start``, open) split over
        every window it overlaps, as (window, low, high, ns carried in): its part (low, high] in each, oldest first.

        The part of a window that already closed goes to the first open window the interval overlaps (as ns carried
        in, outside that window's own span), so that a GPU's time over a run is the time it reported, whatever its
        interval and phase; that happens only where an interval is longer than the lateness (a window then closes
        before the point that ends after it comes). Windows close in time order, so the closed ones are the first few.
        """
        width = self._window_ns
        parts: list[_Part] = []
        carried = 0
        window_start = _window_start(start_ns + 1, width)  # the window of the interval's first nanosecond
        while window_start < end_start:
            low, high = max(start_ns, window_start), min(end_ns, window_start + width)
            window = self._windows.get(window_start)
            if window is None and not self._is_late(window_start):
                window = self._windows[window_start] = _Window()
                if self._next_start is None or window_start < self._next_start:
                    self._next_start = window_start
            if window is None:
                carried += high - low
            else:
                parts.append((window, low, high, float(carried)))
                carried = 0
            window_start += width
        parts.append((end_window, max(start_ns, end_start), end_ns, float(carried)))
        return parts

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
            window.mfu[job_id] = _MfuCell(value, 1, attributes)
        else:
            cell.total += value
            cell.count += 1
        self._points_mfu += 1
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
        if end_ns > self._watermark_ns:
            self._watermark_ns = end_ns
        if end_ns - start_ns > self._max_interval_ns:
            return R.IMPLAUSIBLE
        if start_ns >= end_ns:  # weighed over the same interval as the OFU point of the same time
            start_ns = self._inferred_start(stream_key, end_ns, self._streams.get(stream_key))
        if self._last_start < end_ns <= self._last_end:
            window = self._last_window
            window_start = self._last_start
        else:
            opened = self._open_window(end_ns)
            if opened is None:
                return R.LATE
            window = opened
            window_start = _window_start(end_ns, self._window_ns)
        if start_ns >= window_start or start_ns >= end_ns:  # the whole interval in one window: the common case
            inputs = window.gpus.get(stream_key)
            if inputs is None:
                if len(window.gpus) >= self.config.max_streams:
                    self._rejected_streams += 1
                    return R.MAX_STREAMS
                inputs = window.gpus[stream_key] = _GpuInputs(identity)
            parts = [(inputs, float(end_ns - start_ns) if end_ns > start_ns else 1.0)]
        else:
            split = self._parts(start_ns, end_ns, window_start, window)
            if self._over_stream_cap(stream_key, split):
                return R.MAX_STREAMS
            parts = [
                (self._inputs(w, stream_key, identity), float(high - low) + carried) for w, low, high, carried in split
            ]
        self._points_gpu += len(values) + len(throttle)
        for inputs, weight in parts:
            sums = inputs.sums
            for metric, value in values.items():
                slot = _SLOTS.get(metric)
                if slot is not None:
                    sums[slot] += value * weight
                    sums[slot + 1] += weight
            for reason, value in throttle.items():
                if value:  # a reason absent from the interval: nothing to add (the window reads it as 0)
                    slot = _REASON_SLOTS.get(reason)
                    if slot is not None:
                        sums[slot] += value * weight
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
        stream's previous reading (``_counter_delta``) is split over the windows of the time it covers, in
        proportion. None when taken, else why not (late, over the stream cap, beyond physics); a refused reading
        changes nothing, not even the baselines of the interval's other counters."""
        if end_ns > self._watermark_ns:
            self._watermark_ns = end_ns
        counted: list[tuple[str, float, int, tuple[int, int, float]]] = []  # (field, delta, since, state)
        for field, value in counters.items():
            max_rate = _COUNTER_RATES.get(field)
            if max_rate is None:
                continue  # not a counter the windows keep
            found = self._counter_delta(field, max_rate, stream_key, series_start_ns, end_ns, value)
            if isinstance(found, str):
                return found
            counted.append((field, *found))
        if any(entry[1] for entry in counted):
            if self._last_start < end_ns <= self._last_end:
                window, window_start = self._last_window, self._last_start
            else:
                opened = self._open_window(end_ns)
                if opened is None:
                    return R.LATE
                window, window_start = opened, _window_start(end_ns, self._window_ns)
            # Where each delta goes: its window alone (the common case), else every window its time overlaps.
            spread: list[tuple[str, float, float, list[_Part]]] = []
            for field, delta, since, _state in counted:
                if delta:
                    split = [(window, since, end_ns, 0.0)] if since >= window_start else None
                    if split is None:
                        split = self._parts(since, end_ns, window_start, window)
                    if self._over_stream_cap(stream_key, split):
                        return R.MAX_STREAMS
                    spread.append((field, delta, float(end_ns - since), split))
            for field, delta, covered, split in spread:
                for part_window, low, high, carried in split:
                    weight = float(high - low) + carried
                    inputs = part_window.gpus.get(stream_key)
                    if inputs is None:
                        inputs = part_window.gpus[stream_key] = _GpuInputs(identity)
                    part = delta * (weight / covered)
                    if field == _ENERGY:
                        inputs.energy_j = part if inputs.energy_j is None else inputs.energy_j + part
                        inputs.energy_ns += weight
                    else:
                        slot = _COUNTER_SLOTS[field]
                        inputs.sums[slot] += part
                        inputs.sums[slot + 1] += 1.0
        for field, _delta, _since, state in counted:
            if state[1] >= 0:
                self._counters.setdefault(field, {})[stream_key] = state
        self._points_gpu += len(counters)
        return None

    def _over_stream_cap(self, stream_key: str, split: list[_Part]) -> bool:
        """Whether a stream new to one of these windows is over ``max_streams`` there (counted)."""
        cap = self.config.max_streams
        for part_window, _low, _high, _carried in split:
            gpus = part_window.gpus
            if len(gpus) >= cap and stream_key not in gpus:
                self._rejected_streams += 1
                return True
        return False

    @staticmethod
    def _inputs(window: _Window, stream_key: str, identity: Mapping[str, str]) -> _GpuInputs:
        inputs = window.gpus.get(stream_key)
        if inputs is None:
            inputs = window.gpus[stream_key] = _GpuInputs(identity)
        return inputs

    def _counter_delta(
        self, field: str, max_rate: float, stream_key: str, series_start: int, end_ns: int, value: float
    ) -> tuple[float, int, tuple[int, int, float]] | str:
        """What one reading of a stream's cumulative counter books: (amount, since, state): the delta over
        (since, end] and the reading to keep, which the caller keeps once the whole reading is taken (a state with
        end -1 keeps nothing); a ``names.RejectReason`` code when refused.

        The delta is since the stream's previous reading of the same series (start time). A first reading (or one
        of a new series: a driver reload) counts whole only when its series is new (``_series_is_new``), else it
        only sets the baseline (a collector restarting mid-series must not book a day's energy into one window). A
        retry of the latest reading books nothing; an older reading arriving after a newer one (a load balancer's
        parallel exports reorder) is already inside the newer delta. A counter that runs backwards
        within its series, or faster than a GPU can (``max_rate``, from ``otel_ofu.bounds.MAX_RATES``), is
        refused and leaves the baseline as it was; so is one holding more than its series' age at that rate, so
        that a poisoned reading never becomes the baseline every later one is measured against.
        """
        states = self._counters.get(field)
        previous = states.get(stream_key) if states is not None else None
        if previous is None and states is not None and len(states) >= self.config.max_streams:
            self._rejected_streams += 1
            return R.MAX_STREAMS
        keep = (series_start, end_ns, value)
        if not 0.0 <= value <= max_rate * max(end_ns - series_start, 0) / _NS_PER_S:
            return R.IMPLAUSIBLE
        if previous is not None:
            previous_start, previous_end, previous_value = previous
            if end_ns <= previous_end:
                return 0.0, end_ns, (0, -1, 0.0)
            if previous_start == series_start:
                delta = value - previous_value
                if not 0.0 <= delta <= max_rate * (end_ns - previous_end) / _NS_PER_S:
                    return R.IMPLAUSIBLE  # running backwards, or faster than a GPU can
                return delta, previous_end, keep
        if not 0 < series_start < end_ns or not self._series_is_new(stream_key, series_start, end_ns):
            return 0.0, end_ns, keep
        return value, series_start, keep

    def _series_is_new(self, stream_key: str, series_start: int, end_ns: int) -> bool:
        """Whether a counter series first read at ``end_ns`` began while this collector was taking its stream, so that
        its whole count is this collector's to book. One that began before (a collector restarted mid-series, a job
        moved here from another shard) only sets the baseline: its whole count would book hours of energy into one
        window, or energy another shard booked; the GPU's power covers that interval instead (``_GpuInputs.energy``)."""
        first = self._first_starts.get(stream_key)
        if first is None:  # no point of the stream yet: new when it began within a window of this reading
            return end_ns - series_start <= self._window_ns
        # The stream's first point here began with the series (a producer's first interval starts when its counters
        # do): this collector has seen all of it. One that began later saw only the rest (a restart, or a job moved
        # here from another shard, which counted the series up to then).
        return first - _SERIES_SLACK_NS <= series_start <= first + _SERIES_SLACK_NS

    # --- closing -----------------------------------------------------------------------------------

    def flush(self, now_ns: int) -> list[WindowReport]:
        """Close, in time order, every window with end + lateness <= now_ns; then evict stale state."""
        if self._flushed_ns is None or now_ns > self._flushed_ns:
            self._flushed_ns = now_ns
        reports = self._close_through(self._flushed_ns - self._lateness_ns)
        self._evict(min(self._watermark_ns, self._flushed_ns))
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
        """Close, in time order, the windows ending at or before limit_ns: every one from the first data on, empty
        ones included, while the state still spans them (streams within their staleness, or fleet horizon pairs),
        so that every shard reports every window, the merge tier sees the whole fleet, and a quiet fleet shows
        as windows without GPUs rather than as the last window repeated.

        A window leaves the table only once its close succeeded; a close that fails (a defect: each job and group
        is closed on its own, see ``_close``) is retried at the next flush, at most ``_CLOSE_ATTEMPTS`` times.
        """
        reports: list[WindowReport] = []
        width = self._window_ns
        while self._next_start is not None and self._next_start + width <= limit_ns:
            start = self._next_start
            window = self._windows.get(start)
            if window is not None or self._state_spans(start + width):
                try:
                    reports.append(self._close(start, window or _Window()))
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
                self._last_window = _Window()  # let the closed one go
        return reports

    def _state_spans(self, window_end: int) -> bool:
        """Whether an empty window ending at ``window_end`` is still to be reported: it ends within the staleness of
        the last window that held data, or the fleet's horizon holds (OFU, MFU) pairs. Past that the close jumps to
        the next window that holds data: closing costs the windows that hold data (and a bounded tail after each),
        never the time between them, however old a point was (one stamped at the epoch opens one window)."""
        last = self._last_data_end
        if last is not None and window_end - last < self.config.stale_after_ns:
            return True
        return self._ledger.spans(window_end)

    def _close(self, start: int, window: _Window) -> WindowReport:
        """One window's report. Each group and each job is closed on its own: one that fails (it should not: its
        inputs were bounded when they came) is left out of the window, counted and logged once, and costs the
        rest nothing."""
        end = start + self._window_ns
        groups_cells, jobs_gpus, stream_seconds = self._route(window)
        groups: list[GroupReport] = []
        for key, cells in sorted(groups_cells.items()):
            try:
                groups.append(self._group_report(key, cells))
            except Exception:
                self._close_failed("group", "|".join(key))
        job_reports: list[JobReport] = []
        gpu_flags: list[GpuFlagReport] = []
        gpu_reports: list[GpuReport] = []
        ledger = self._ledger
        job_parts: dict[str, JobWindow] = {}
        for job_id in sorted(jobs_gpus.keys() | window.mfu.keys()):
            job = ledger.jobs.get(job_id)
            if job is None:  # over the job cap when its points came
                continue
            try:
                job_window, flagged, per_gpu = self._job_window(
                    job_id, job, start, end, window.mfu.get(job_id), window, jobs_gpus.get(job_id), stream_seconds
                )
                report = ledger.close(job_id, job, start, end, job_window)
            except Exception:
                self._close_failed("job", job_id)
                continue
            job_reports.append(report)
            gpu_flags += flagged
            gpu_reports += per_gpu
            if self.config.partials:
                job_parts[job_id] = job_window
        fleet = ledger.fleet(end)
        try:
            job_losses = [job.loss for job in job_reports if job.loss is not None]
            energy = self._fleet_energy(window, stream_seconds)
            fleet = attrs.evolve(fleet, loss=loss.fleet_loss(job_losses, energy, self._currency()))
        except Exception:
            self._close_failed("fleet", "loss")
        self._windows_closed += 1
        # In a stable order, whatever order the GPUs' points arrived in: the same data gives the same outputs.
        gpu_flags.sort(key=lambda r: (r.job_id, r.metric, sorted(r.attributes.items())))
        return WindowReport(
            start, end, tuple(groups), tuple(job_reports), fleet, tuple(gpu_flags), tuple(gpu_reports), job_parts
        )

    def _close_failed(self, kind: str, name: str) -> None:
        """Count a group, job or the fleet's totals that failed to close; the first failure of each kind is
        logged with its traceback, later ones only counted (one bad job must not flood the log each window)."""
        self._close_failures[kind] = self._close_failures.get(kind, 0) + 1
        if self._close_failures[kind] == 1:
            logger.exception("closing %s %r failed: left out of this window (counted; logged once)", kind, name)

    def _route(
        self, window: _Window
    ) -> tuple[dict[tuple[str, ...], _GroupCells], dict[str, _JobGpus], dict[str, float] | None]:
        """The window's cells by group and by job (columns), in one pass in the order their first points came; and,
        where a stream moved job in the window, every stream's seconds over its cells (None: none moved), by which
        its energy is split between its jobs.

        A profile (shared by the streams of a job with one identity) is resolved to its group, its job and its share
        of a GPU once per window, by the profile's id: profiles are interned, and one that is not only gets a route
        of its own to the same lists (a tuple's hash is not cached).
        """
        group_end = 1 + self._groups
        groups: dict[tuple[str, ...], _GroupCells] = {}
        jobs_gpus: dict[str, _JobGpus] = {}
        no_job = _JobGpus()  # the cells of no job go through the same steps, to be dropped
        routes: dict[int, tuple[_GroupCells, _JobGpus, float]] = {}
        partitioned = False
        moved = not all(map(isinstance, window.cells, itertools.repeat(str)))
        stream_seconds: dict[str, float] | None = {} if moved else None
        for cell_key, cell in window.cells.items():
            route = routes.get(id(cell.profile))
            if route is None:
                profile = cell.profile
                group = tuple(UNKNOWN if v is None else v for v in profile[1:group_end])
                target = no_job if profile[0] is None else jobs_gpus.setdefault(profile[0], _JobGpus())
                share = self._share_of(profile)
                partitioned = partitioned or share != 1.0
                route = routes[id(profile)] = (groups.setdefault(group, _GroupCells()), target, share)
            group_cells, target, share = route
            seconds, measured = cell.seconds()
            ofu = cell.weighted / cell.weight if cell.weight else None
            if ofu is not None:
                group_cells.values.append(ofu)
                group_cells.weights.append(share * measured)
                group_cells.shares.append(share)
            group_cells.capacity_s.append(share * seconds)
            target.keys.append(cell_key)
            target.cells.append(cell)
            target.ofus.append(ofu)
            target.seconds.append(seconds)
            target.measured.append(measured)
            if stream_seconds is not None:
                stream = cell_key if isinstance(cell_key, str) else cell_key[0]
                stream_seconds[stream] = stream_seconds.get(stream, 0.0) + seconds
        if partitioned:  # a partitioned GPU in the window: shares in columns
            for gpus in jobs_gpus.values():
                gpus.shares = [self._share_of(cell.profile) for cell in gpus.cells]
        return groups, jobs_gpus, stream_seconds

    def _share_of(self, profile: Profile) -> float:
        """A profile's share of a physical GPU (``otel_ofu.gpu_share``): 1, or a partition's fraction."""
        model, mig_profile, partition = profile[self._model_index], profile[-2], profile[-1]
        if not mig_profile and not partition:
            return 1.0
        if gpu_share.assumed_slices(model, mig_profile, partition) and (model, mig_profile) not in self._unsized:
            self._unsized.add((model, mig_profile))
            logger.warning(
                "GPU model %r is not in the catalog: its partition %r is counted against %d compute slices",
                model,
                mig_profile or partition,
                gpu_share.DEFAULT_MIG_SLICES,
            )
        return gpu_share.gpu_share(model, mig_profile, partition)

    def _currency(self) -> str | None:
        return self.config.currency if self.config.price_per_gpu_hour else None

    def _fleet_energy(self, window: _Window, stream_seconds: dict[str, float] | None) -> float | None:
        """Every GPU's energy in the window: those of jobs and those of none, with or without OFU. A GPU without an
        energy counter: its mean power x its seconds in the window (over every job it served), the whole window
        for one that sent no time at all."""
        energies: list[float] = []
        for key, inputs in window.gpus.items():
            seconds = stream_seconds.get(key) if stream_seconds is not None else None
            if seconds is None:
                cell = window.cells.get(key)
                seconds = cell.seconds()[0] if cell is not None else self._window_ns / _NS_PER_S
            energy = inputs.energy(seconds)
            if energy is not None:
                energies.append(energy)
        return math.fsum(energies) if energies else None  # exactly rounded: the same in any arrival order

    def _models(self, cells: list[_Cell]) -> list[str | None]:
        """The cells' GPU models, each model's price and tensor clock looked up once."""
        models = list(map(operator.itemgetter(self._model_index), map(_PROFILE, cells)))
        for model in set(models) - self._prices.keys():
            spec = catalog.lookup(model) if model else None
            self._prices[model] = self.config.price_of(model)
            self._tensor_clocks[model] = spec.tensor_clock_hz if spec is not None else None
        return models

    def _gpu_losses(
        self, window: _Window, gpus: _JobGpus, stream_seconds: dict[str, float] | None
    ) -> tuple[loss.GpuColumns, loss.Split, list[_GpuInputs | None]]:
        """The job's GPUs in columns, their split (with their tensor activity as used), and their loss inputs.

        The window means a split needs (tensor activity, clocks) come in columns, each a C-level pass where every
        GPU sent them (the producer's layout); ``loss.split_columns`` is the one split. A GPU without OFU stands in
        with OFU 0 and no measured second: its split weighs nothing. Energy and FLOPs in one pass over the GPUs: a
        GPU's energy counter is split between the jobs it served in the window by their seconds, its FLOPs count over
        its measured seconds.
        """
        cells = gpus.cells
        n = len(cells)
        seconds = gpus.seconds
        measured = gpus.measured
        ofus = [0.0 if ofu is None else ofu for ofu in gpus.ofus] if None in gpus.ofus else cast(list[float], gpus.ofus)
        keys = gpus.stream_keys()
        found: list[_GpuInputs | None] = [None] * n
        if window.gpus:
            found = list(map(window.gpus.get, keys))
        with_inputs = sum(map(operator.is_, found, itertools.repeat(None))) < n  # by identity: no __eq__ per GPU
        prices: list[float | None] = [None] * n
        models: list[str | None] = []
        if self.config.price_per_gpu_hour or with_inputs:
            models = self._models(cells)
            prices = list(map(self._prices.__getitem__, models))
        all_measured = None if measured == seconds else measured
        if not with_inputs:
            split = loss.split_columns(ofus)
            columns = loss.GpuColumns(
                ofus, split, seconds, [None] * n, [None] * n, prices, gpus.shares, measured=all_measured
            )
            return columns, split, found
        sums = [None if inputs is None else inputs.sums for inputs in found]
        active, sm_clock, max_clock, engine, sm, dram = (_means(sums, slot) for slot in _MEAN_SLOTS)
        tensor_clocks = list(map(self._tensor_clocks.__getitem__, models))
        ratios = _clock_ratios(sm_clock, max_clock, tensor_clocks)
        split = loss.split_columns(ofus, active, ratios, engine, sm)
        energy: list[float | None] = []
        flops: list[float | None] = []
        for key, gpu_seconds, gpu_measured, inputs in zip(keys, seconds, measured, found, strict=True):
            if inputs is None:
                energy.append(None)
                flops.append(None)
                continue
            gpu_sums = inputs.sums
            # The GPU's energy over all its seconds in the window; each job it served has its seconds' part.
            total = stream_seconds.get(key, gpu_seconds) if stream_seconds is not None else gpu_seconds
            joules = inputs.energy(total)
            if joules is not None and total > 0.0 and total != gpu_seconds:
                joules *= gpu_seconds / total
            energy.append(joules)
            weight = gpu_sums[_FLOPS_SLOT + 1]
            flops.append(gpu_sums[_FLOPS_SLOT] / weight * gpu_measured if weight else None)
        columns = loss.GpuColumns(
            ofus,
            split,
            seconds,
            energy,
            flops,
            prices,
            gpus.shares,
            dram=dram,
            nvlink=_rates(sums, _NVLINK_SLOT, seconds),
            pcie=_rates(sums, _PCIE_SLOT, seconds),
            measured=all_measured,
        )
        return columns, split, found

    def _gpu_flags(
        self,
        job_id: str,
        job: JobState,
        window: GpuWindowValues,
        inputs: list[_GpuInputs | None],
    ) -> list[GpuFlagReport]:
        """The GPU-level flags of the job's GPUs: the points they have to show."""
        reports: list[GpuFlagReport] = []
        for name, flag in job.gpu_flags.items():
            for verdict in flag.assess(window):
                i = verdict.index
                attributes = {**_gpu_identity(window.keys[i], inputs[i]), **verdict.labels}
                reports.append(
                    GpuFlagReport(name, job_id, attributes, verdict.value, window.ofu[i], window.job_median_ofu[i])
                )
        return reports

    def _group_report(self, key: tuple[str, ...], cells: _GroupCells) -> GroupReport:
        """A group's percentiles over GPU capacity, histogram and GPU equivalents. The histogram counts observations
        (a GPU or a MIG slice each, per job it served); the percentiles weigh each OFU by its GPU equivalents x the
        seconds it covered (its shares alone where no OFU covered any time: points without intervals); the GPU
        equivalents are the group's GPU-seconds (unmeasured ones too) over the window's."""
        attributes = dict(zip(self.config.group_keys, key, strict=True))
        gpus = math.fsum(cells.capacity_s) * _NS_PER_S / self._window_ns
        values = cells.values
        if not values:
            return GroupReport(attributes, gpus, {}, ExpHistogram(), 0.0, 0.0, 0.0, capacity=self._no_capacity())
        # Capacity in whole GPU-microseconds: the same integers here, in a shard's capacity histogram and after the
        # merge, so that the three read every percentile alike (a share of capacity met exactly is met in each).
        units = list(map(round, map(_CAPACITY_UNITS_PER_S.__mul__, cells.weights)))
        if not any(units):  # OFU points without time: their shares of a GPU weigh them
            units = list(map(round, map(_CAPACITY_UNITS_PER_S.__mul__, cells.shares)))
        order = sorted(range(len(values)), key=values.__getitem__)
        ordered = [values[i] for i in order]
        capacity = [units[i] for i in order]
        quantiles = capacity_quantiles_of_sorted(ordered, capacity, names.QUANTILES)
        max_buckets = self.config.histogram_max_buckets
        capacity_histogram = None
        if self.config.partials:
            capacity_histogram = ExpHistogram.from_sorted(ordered, max_buckets=max_buckets, counts=capacity)
        return GroupReport(
            attributes=attributes,
            gpus=gpus,
            quantiles=quantiles,
            histogram=ExpHistogram.from_sorted(ordered, max_buckets=max_buckets),
            ofu_sum=sum(ordered),
            ofu_min=ordered[0],
            ofu_max=ordered[-1],
            capacity=capacity_histogram,
        )

    def _no_capacity(self) -> ExpHistogram | None:
        return ExpHistogram() if self.config.partials else None

    def _job_window(
        self,
        job_id: str,
        job: JobState,
        start: int,
        end: int,
        mfu_cell: _MfuCell | None,
        window: _Window,
        gpus: _JobGpus | None,
        stream_seconds: dict[str, float] | None,
    ) -> tuple[JobWindow, list[GpuFlagReport], list[GpuReport]]:
        """The job's part of the window (``jobs.JobWindow``: what the ledger closes it from, and what a shard sends its
        merge tier), the points its GPU-level flags show, and its GPUs' own means where the configuration asks for
        them (``AggregatorConfig.per_gpu_reports``)."""
        config = self.config
        attributes: dict[str, str] = {}
        mfu = (0.0, 0)
        if mfu_cell is not None:
            attributes.update(mfu_cell.attributes)
            mfu = (mfu_cell.total, mfu_cell.count)
        if gpus is None:
            return JobWindow(mfu=mfu, attributes=attributes), [], []
        group_end = 1 + self._groups
        ends = list(map(_LAST_END, gpus.cells))
        newest = gpus.cells[ends.index(max(ends))].profile[group_end : group_end + len(JOB_ATTRIBUTE_KEYS)]
        # The GPUs' own identity wins over what the training side said.
        attributes.update((k, v) for k, v in zip(JOB_ATTRIBUTE_KEYS, newest, strict=True) if v is not None)
        models = frozenset(filter(None, map(operator.itemgetter(self._model_index), map(_PROFILE, gpus.cells))))
        columns, split, inputs = self._gpu_losses(window, gpus, stream_seconds)
        sums = loss.job_sums_of(
            columns, currency=self._currency(), pue=config.pue, grid_intensity=config.grid_intensity
        )
        measuring = gpus.with_ofu()
        shares = gpus.shares or [1.0] * len(gpus.cells)
        keys = gpus.stream_keys()
        untimed = [i for i in measuring if not gpus.measured[i]]
        tensor_active = split.tensor_active
        idle_gpus = {keys[i]: shares[i] for i in measuring if tensor_active[i] < loss.IDLE_TENSOR_ACTIVE}
        gpu_flags: list[GpuFlagReport] = []
        if measuring and GPU_DETECTORS:
            if not job.gpu_flags:
                job.gpu_flags = {detector.metric.name: detector.start(config) for detector in GPU_DETECTORS}
            gpu_flags = self._measured_gpu_flags(job_id, job, start, end, gpus, measuring, tensor_active, inputs)
        per_gpu = _gpu_reports(job_id, gpus, inputs, self._model_index) if config.per_gpu_reports else []
        part = JobWindow(
            sums=sums,
            point_ofu=point_ofu([cast(float, gpus.ofus[i]) for i in untimed], [shares[i] for i in untimed]),
            mfu=mfu,
            gpus=math.fsum(shares[i] for i in measuring),
            idle_gpus=idle_gpus,
            attributes=attributes,
            models=models,
        )
        return part, gpu_flags, per_gpu

    def _measured_gpu_flags(
        self,
        job_id: str,
        job: JobState,
        start: int,
        end: int,
        gpus: _JobGpus,
        measuring: list[int],
        tensor_active: list[float],
        inputs: list[_GpuInputs | None],
    ) -> list[GpuFlagReport]:
        """The GPU-level flags over the job's GPUs that gave OFU (in columns, as ``GpuWindowValues`` takes them)."""
        keys = gpus.stream_keys()
        cells = gpus.cells
        if len(measuring) < len(keys):
            keys = [keys[i] for i in measuring]
            cells = [cells[i] for i in measuring]
            tensor_active = [tensor_active[i] for i in measuring]
            inputs = [inputs[i] for i in measuring]
        ofus = [cast(float, gpus.ofus[i]) for i in measuring]
        idle = list(map(loss.IDLE_TENSOR_ACTIVE.__gt__, tensor_active))  # active < IDLE_TENSOR_ACTIVE

        def throttle(i: int) -> Mapping[str, float]:
            found = inputs[i]
            return found.throttle_shares(cells[i].weight) if found is not None else {}

        values = GpuWindowValues(start, end, keys, ofus, tensor_active, idle, _peer_medians(ofus), throttle)
        return self._gpu_flags(job_id, job, values, inputs)

    # --- bounded state ---------------------------------------------------------------------------------

    def _evict(self, now_ns: int) -> None:
        if self._last_eviction_ns is not None and now_ns < self._last_eviction_ns + self._window_ns:
            return  # a scan per window is enough; staleness is measured in many windows
        self._last_eviction_ns = now_ns
        cutoff = now_ns - self.config.stale_after_ns
        stale_streams = [key for key, seen in self._streams.items() if seen <= cutoff]
        for key in stale_streams:
            self._returning[hash(key)] = None  # it reported before: a place is kept for it (_new_stream_refusal)
            del self._streams[key]
            self._first_starts.pop(key, None)
            self._instant_starts.pop(key, None)
            self._state_bytes -= STREAM_STATE_BYTES + 2 * len(key)
        self._evicted_streams += len(stale_streams)
        while len(self._returning) > self.config.max_streams:  # the longest gone are forgotten first
            del self._returning[next(iter(self._returning))]
        for states in self._counters.values():
            for key in [key for key, (_start, seen, _value) in states.items() if seen <= cutoff]:
                del states[key]
        for key in [key for key, (seen, _start) in self._instant_starts.items() if seen <= cutoff]:
            del self._instant_starts[key]
        self._ledger.evict(now_ns)
        if len(self._profiles) > 2 * len(self._streams) + 1024:
            self._reintern()

    def _reintern(self) -> None:
        """Drop profiles no open window uses any more (the intern table would otherwise only grow)."""
        used: dict[Profile, Profile] = {}
        for window in self._windows.values():
            for cell in window.cells.values():
                used[cell.profile] = cell.profile
        self._profiles = used
        self._profiles_bytes = sum(map(_profile_bytes, used))


def _means(sums: list[array[float] | None], slot: int) -> list[float | None] | None:
    """Each GPU's window mean of one loss input (None: not sent), in a C-level pass where every GPU sent it; None
    when no GPU did (the column is absent, at the cost of one pass)."""
    if None not in sums:
        present = cast(list["array[float]"], sums)
        weights = list(map(operator.itemgetter(slot + 1), present))
        if 0.0 not in weights:
            return list(map(operator.truediv, map(operator.itemgetter(slot), present), weights))
        if not any(weights):
            return None
    means = [None if found is None or not found[slot + 1] else found[slot] / found[slot + 1] for found in sums]
    return means if any(mean is not None for mean in means) else None


def _rates(sums: list[array[float] | None], slot: int, seconds: list[float]) -> list[float | None] | None:
    """Each GPU's link bytes per second in the window (its counter deltas over its GPU-seconds), None where it sent
    no such counter; None when no GPU did."""
    rates = [
        None if found is None or not found[slot + 1] else found[slot] / gpu_seconds
        for found, gpu_seconds in zip(sums, seconds, strict=True)
    ]
    return rates if any(rate is not None for rate in rates) else None


def _clock_ratios(
    sm_clock: list[float | None] | None, max_clock: list[float | None] | None, tensor_clocks: list[float | None]
) -> list[float | None] | None:
    """Each GPU's ``loss.clock_ratio`` (its model's tensor clock where known, else its board max), in a C-level pass
    where every GPU has a clock and a reference; None without any clock reading."""
    if sm_clock is None:
        return None
    boards = max_clock if max_clock is not None else [None] * len(sm_clock)
    references = [tensor or board for tensor, board in zip(tensor_clocks, boards, strict=True)]
    if None not in sm_clock and None not in references and min(cast(list[float], references)) > 0.0:
        return cast(list[float | None], loss.clock_ratios(cast(list[float], sm_clock), cast(list[float], references)))
    return list(map(loss.clock_ratio, sm_clock, boards, tensor_clocks))


def _profile_bytes(profile: Profile) -> int:
    """An interned profile's size, roughly: its values and a tuple's slots."""
    return 64 + 8 * len(profile) + sum(len(value) for value in profile if value is not None)


def _add_to_cell(
    window: _Window,
    key: str,
    value: float | None,
    low: int,
    high: int,
    carried: float,
    profile: Profile,
    job_id: str | None,
    bill_carried: bool,
) -> None:
    """Add one point's part (low, high] (``carried`` ns more from closed windows, billed as time only where
    ``bill_carried``: a point that extends its stream), with its OFU (None: unmeasured), to its stream's cell for its
    job in ``window``: the stream's own cell, or the cell under (key, job.id) once the stream moved job in it. A part
    without duration (a stream's first point without an interval) weighs 1 ns in the OFU mean and covers nothing."""
    cells = window.cells
    cell = cells.get(key)
    if cell is not None and cell.job_id != job_id:
        moved = (key, job_id)
        cell = cells.get(moved)
        if cell is None:
            cell = cells[moved] = _Cell(0.0, 0.0, profile, high, job_id, [])
    elif cell is None:
        cell = cells[key] = _Cell(0.0, 0.0, profile, high, job_id, [])
    if value is None:
        if cell.unmeasured is None:
            cell.unmeasured = []
        coverage.cover(cell.unmeasured, low, high)
        if bill_carried:
            cell.carried_unmeasured += carried
    else:
        weight = float(high - low) + carried if high > low or carried else 1.0
        cell.weighted += value * weight
        cell.weight += weight
        coverage.cover(cell.spans, low, high)
        if bill_carried:
            cell.carried += carried
    if high >= cell.last_end_ns:
        cell.profile = profile
        cell.last_end_ns = high


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


def _gpu_reports(job_id: str, gpus: _JobGpus, inputs: list[_GpuInputs | None], model_index: int) -> list[GpuReport]:
    """Each of a job's GPUs' own window means, for a screen that opens the job (``otel-ofu top``): those that gave
    OFU."""
    reports: list[GpuReport] = []
    for key, cell, ofu, found in zip(gpus.stream_keys(), gpus.cells, gpus.ofus, inputs, strict=True):
        if ofu is None:
            continue
        attributes = _gpu_identity(key, found)
        if found is not None and found.identity.get(names.GPU_INDEX):
            attributes[names.GPU_INDEX] = found.identity[names.GPU_INDEX]
        model = cell.profile[model_index]
        if model:
            attributes[names.HW_MODEL] = model
        if found is None:
            reports.append(GpuReport(job_id, attributes, ofu))
            continue
        sums = found.sums
        tensor, clock, clock_max, power = (sums[i] / sums[i + 1] if sums[i + 1] else None for i in _GPU_REPORT_SLOTS)
        throttle = found.throttle_shares(cell.weight)
        reports.append(GpuReport(job_id, attributes, ofu, tensor, clock, clock_max, power, throttle))
    return reports


# The means a GpuReport shows, in its fields' order: tensor activity, SM clock, board max clock, power.
_GPU_REPORT_SLOTS = (_TENSOR_SLOT, _CLOCK_SLOT, _CLOCK_MAX_SLOT, _POWER_SLOT)


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
    if len(parts) > 2 and parts[2]:  # an empty instance id is no MIG instance
        found[names.GPU_MIG_INSTANCE_ID] = parts[2]
    return found
