"""Jobs: what each job's closed window adds up to, the state its flags and correlation keep, and the fleet's view of
them. The same for one collector and for the merge tier, which adds up a job's windows from every shard it was on.

A job's window comes in as a ``results.JobWindow``: sums that add across shards (``results.JobSums``: GPU time,
useful and lost time, energy, cost...), its MFU points' sum and count, its measured GPUs and the idle ones.
``JobLedger.close`` turns it into the job's ``JobReport``: OFU = useful / GPU time, the loss shares, MFU, and against
the OFU of its measured time the gap, the horizon's correlation and every job flag (``detectors.DETECTORS``), whose
state the ledger keeps per job. ``JobLedger.fleet`` is the fleet's correlation and MAE over the jobs' horizons.

Bounded state. ``max_jobs`` live jobs (beyond: refused, counted). A job unseen for ``stale_after_s`` is evicted (its
flags let go, counted); its horizon blocks linger until they leave the horizon, so the fleet's correlation still
counts it; those lingering are bounded apart (``max_jobs`` of them again, the longest-silent dropped first).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping

import attrs

from otel_ofu import names
from otel_ofu_collector.aggregation import loss
from otel_ofu_collector.aggregation.goodput import FleetGoodputLedger, GoodputState
from otel_ofu_collector.config import AggregatorConfig
from otel_ofu_collector.detectors import DETECTORS, GpuFlag, JobFlag, JobWindowValues
from otel_ofu_collector.results import (
    STATUS_NO_MFU,
    STATUS_NO_OFU,
    STATUS_OK,
    FleetReport,
    JobGoodput,
    JobLoss,
    JobReport,
    JobWindow,
)
from otel_ofu_collector.stats.comoments import AbsDiff, CoMoments

# The share of max_jobs (and of max_streams and max_state_bytes, in the windows) kept for the GPUs that reported
# before and their jobs: what a flood of new identities cannot take.
RESERVED_SHARE = 0.1


def open_places(cap: int) -> int:
    """The places of a cap new identities may take: all but a tenth, whole places kept (none of a cap under 10)."""
    return cap - int(cap * RESERVED_SHARE)


# What ``max_state_bytes`` counts per job besides its id: its flags and horizon; and, once it reported a step, its
# progress marks (``goodput.Progress``: three columns of MAX_MARKS doubles).
JOB_STATE_BYTES = 4096
_STARTUP, _RECOVERY = names.GoodputCause.STARTUP, names.GoodputCause.RECOVERY
PROGRESS_STATE_BYTES = 3 * 8 * 128
_HORIZON_BLOCKS = 48


@attrs.define
class Horizon:
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
class JobState:
    last_seen_ns: int
    config: AggregatorConfig
    live: bool = True
    attributes: Mapping[str, str] = attrs.field(factory=dict)
    flags: dict[str, JobFlag] = attrs.field(init=False)  # by the flag's metric name
    gpu_flags: dict[str, GpuFlag] = attrs.field(init=False)  # by the flag's metric name: per GPU inside
    horizon: Horizon = attrs.field(factory=Horizon)
    goodput: GoodputState = attrs.field(factory=GoodputState)  # carries on through an eviction, as the horizon
    # job.checkpoint.time's last reading per series: (operation, series start) -> (time, seconds); checkpoints.delta.
    checkpoints: dict[tuple[str, int], tuple[int, float]] = attrs.field(factory=dict)
    # Each flag's last value and the GPUs each GPU flag has up (metric, stream key): what tells a rise or a fall.
    last_flags: dict[str, float | None] = attrs.field(init=False, factory=dict)
    gpus_up: set[tuple[str, str]] = attrs.field(init=False, factory=set)

    def __attrs_post_init__(self) -> None:
        self.reset_flags()

    def reset_flags(self) -> None:
        self.flags = {detector.metric.name: detector.start(self.config) for detector in DETECTORS}
        self.gpu_flags = {}  # started at the first window with the job's GPUs (no state before it is needed)
        self.last_flags = {}
        self.gpus_up = set()

    def revive(self, seen_ns: int) -> None:
        """A job back after eviction starts its flags (and their baselines) afresh; its horizon blocks carry on."""
        self.live = True
        self.last_seen_ns = seen_ns
        self.reset_flags()


@attrs.define
class JobLedger:
    """Every job's state, for one collector or a merge tier."""

    config: AggregatorConfig
    jobs: dict[str, JobState] = attrs.field(factory=dict)
    live: int = 0
    rejected: int = 0  # points refused over max_jobs
    evicted: int = 0
    state_bytes: int = 0
    last_pair_start: int | None = None  # the newest window with a job's (OFU, MFU) pair
    _block_ns: int = attrs.field(init=False)
    _fleet_goodput: FleetGoodputLedger = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        config = self.config
        self._block_ns = max(1, config.horizon_ns // config.window_ns // _HORIZON_BLOCKS) * config.window_ns
        self._fleet_goodput = FleetGoodputLedger(config.horizon_ns, self._block_ns)

    def admit(self, job_id: str, seen_ns: int, reserved: bool = True) -> JobState | None:
        """The job's live state, started (or revived after eviction) if need be; None (counted) over ``max_jobs``.
        A job that is not ``reserved`` (of GPUs new to the collector) has all but the share kept for the others
        (``RESERVED_SHARE``): a flood of new jobs cannot refuse the fleet's own GPUs a new job."""
        job = self.jobs.get(job_id)
        if job is None or not job.live:
            cap = self.config.max_jobs
            if not reserved and job is None:
                cap = open_places(cap)
            if self.live >= cap:
                self.rejected += 1
                return None
            self.live += 1
            if job is None:
                if len(self.jobs) >= 2 * self.config.max_jobs:
                    self._forget_an_evicted_job()
                job = self.jobs[job_id] = JobState(seen_ns, self.config)
                self.state_bytes += JOB_STATE_BYTES + len(job_id)
            else:
                job.revive(seen_ns)
        elif seen_ns > job.last_seen_ns:
            job.last_seen_ns = seen_ns
        return job

    def close(self, job_id: str, job: JobState, start: int, end: int, window: JobWindow) -> JobReport:
        """The job's report for one closed window: its values, and its flags and correlation moved on by it."""
        config = self.config
        attributes = {**job.attributes, **window.attributes}
        if len(window.models) > 1:
            attributes.pop(names.HW_MODEL, None)
        job.attributes = attributes
        ofu = measured_ofu = None
        job_loss: JobLoss | None = None
        if window.sums is not None:
            job_loss = loss.job_loss(window.sums)
            if window.sums.residual is not None:
                ofu = window.sums.useful_s / window.sums.gpu_time_s
                measured_ofu = window.sums.useful_s / window.sums.measured_s
        if ofu is None and window.point_ofu[1] > 0.0:  # OFU points without time: their shares weigh them
            ofu = measured_ofu = window.point_ofu[0] / window.point_ofu[1]
        mfu_sum, mfu_count = window.mfu
        mfu = mfu_sum / mfu_count if mfu_count else None
        if measured_ofu is not None and mfu is not None:
            job.horizon.add(start - start % self._block_ns, measured_ofu, mfu)
            if self.last_pair_start is None or start > self.last_pair_start:
                self.last_pair_start = start
        values = JobWindowValues(
            start, end, measured_ofu, mfu, window.gpus, window.idle_gpus, window.stalled_gpus, window.moving_gpus
        )
        goodput = self._goodput(job, start, end, window, values.all_stalled)
        if goodput is not None and (goodput.badput_s.get(_STARTUP) or goodput.badput_s.get(_RECOVERY)):
            values = attrs.evolve(values, restarting=True)
        flags = {name: flag.assess(values) for name, flag in job.flags.items()}
        changes = _changes(job.last_flags, flags)
        job.last_flags = flags
        job.horizon.prune(end - config.horizon_ns)
        gpu_time = window.sums.gpu_time_s if window.sums is not None else 0.0
        return JobReport(
            job_id=job_id,
            attributes=job.attributes,
            ofu=ofu,
            mfu=mfu,
            gap=mfu - measured_ofu if measured_ofu is not None and mfu is not None else None,
            correlation=job.horizon.total().pearson(),
            flags=flags,
            status=STATUS_NO_OFU if ofu is None else STATUS_NO_MFU if mfu is None else STATUS_OK,
            gpus=gpu_time * 1e9 / config.window_ns,  # GPU equivalents on average over the window
            loss=job_loss,
            goodput=goodput,
            flag_changes=changes,
        )

    def _goodput(self, job: JobState, start: int, end: int, window: JobWindow, stalled: bool) -> JobGoodput | None:
        """The job's goodput moved on by the window (``aggregation.goodput``), counted into the fleet's."""
        sums = window.sums
        gpu_time, useful = (sums.gpu_time_s, sums.useful_s) if sums is not None else (0.0, 0.0)
        progressed = job.goodput.progress is not None
        found = job.goodput.close(
            start, end, gpu_time, useful, stalled, window.idle_s, window.checkpoint_s, window.steps
        )
        if not progressed and job.goodput.progress is not None:
            self.state_bytes += PROGRESS_STATE_BYTES
        self._fleet_goodput.add_job(gpu_time, found)
        return found

    def fleet(self, end: int) -> FleetReport:
        """Pearson r across jobs of each job's horizon mean OFU vs horizon mean MFU, and the MAE of those means,
        over every job with a pair in the horizon, evicted ones included; and the fleet's goodput over the horizon
        from the jobs closed since the last call."""
        oldest = end - self.config.horizon_ns
        fleet = CoMoments()
        diffs = AbsDiff()
        for job in self.jobs.values():
            horizon = job.horizon
            if not horizon.blocks:
                continue
            horizon.prune(oldest)
            total = horizon.total()
            if total.n:
                fleet = fleet.add(total.mean_x, total.mean_y)
                diffs = diffs.add(total.mean_x, total.mean_y)
        goodput = self._fleet_goodput.close(end - self.config.window_ns, end)
        return FleetReport(fleet.pearson(), diffs.mean(), fleet.n, fleet, diffs.total, goodput=goodput)

    def spans(self, window_end: int) -> bool:
        """Whether the fleet's horizon holds (OFU, MFU) pairs for a window ending at ``window_end``."""
        return self.last_pair_start is not None and self.last_pair_start >= window_end - self.config.horizon_ns

    def evict(self, now_ns: int) -> None:
        """Let go of jobs unseen for ``stale_after_s`` (their horizon blocks linger while in the horizon)."""
        cutoff = now_ns - self.config.stale_after_ns
        oldest_horizon = now_ns - self.config.horizon_ns
        gone: list[str] = []
        for job_id, job in self.jobs.items():
            if job.live and job.last_seen_ns <= cutoff:
                job.live = False
                self.live -= 1
                job.reset_flags()  # lets go of their state (a baseline); a revived job starts afresh anyway
                job.attributes = {}
                self.evicted += 1
            if not job.live:
                job.horizon.prune(oldest_horizon)
                # Its progress lingers as its horizon does: a job restarted after a long outage still finds its marks.
                progressing = job.goodput.progress is not None and job.last_seen_ns > oldest_horizon
                if not job.horizon.blocks and not progressing:
                    gone.append(job_id)
        for job_id in gone:
            self._forget(job_id)

    def _forget(self, job_id: str) -> None:
        job = self.jobs.pop(job_id)
        self.state_bytes -= JOB_STATE_BYTES + len(job_id)
        if job.goodput.progress is not None:
            self.state_bytes -= PROGRESS_STATE_BYTES

    def _forget_an_evicted_job(self) -> None:
        """Make room among the evicted jobs' lingering horizon blocks: drop the longest-silent one's."""
        oldest: str | None = None
        oldest_seen = 0
        for job_id, job in self.jobs.items():
            if not job.live and (oldest is None or job.last_seen_ns < oldest_seen):
                oldest, oldest_seen = job_id, job.last_seen_ns
        if oldest is not None:
            self._forget(oldest)


def _changes(before: Mapping[str, float | None], now: Mapping[str, float | None]) -> dict[str, bool]:
    """The flags that rose (True: up now, not up before) or fell (False: 0 now, up before); a flag not assessable
    either side is neither (absent is not a fall)."""
    found: dict[str, bool] = {}
    for name, value in now.items():
        if value is None:
            continue
        was_up = bool(before.get(name))
        if value and not was_up:
            found[name] = True
        elif not value and was_up:
            found[name] = False
    return found


def point_ofu(ofus: list[float], shares: list[float]) -> tuple[float, float]:
    """(sum of OFU x share, sum of shares) of GPUs whose OFU points carried no time (``JobWindow.point_ofu``)."""
    return math.fsum(o * s for o, s in zip(ofus, shares, strict=True)), math.fsum(shares)
