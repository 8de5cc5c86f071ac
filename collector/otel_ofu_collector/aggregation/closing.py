"""Closing a window: its cells routed to their groups and jobs, each group's percentiles and histograms, each job's
part of the window (its sums, ``results.JobWindow``) and its GPUs' flags, and the fleet's totals.

A close reads the window (``cells.Window``) and writes nothing back into it: the windows (``windows.Aggregator``)
decide when a window closes and let it go once its close succeeded. Each group and each job is closed on its own: one
that fails (it should not: its inputs were bounded when they came) is left out of the window, counted and logged once,
and costs the rest nothing.

How the seconds add up (``cells.Cell.seconds``), how a job's loss is split (``loss``) and how its flags and
correlation move on (``jobs.JobLedger``) are the other modules'; here they meet, in columns: a window of a 100k-GPU
fleet closes with no object per GPU beyond its cell.
"""

from __future__ import annotations

import itertools
import logging
import math
import operator
from array import array
from collections.abc import Iterable, Mapping
from typing import cast

import attrs

from otel_ofu import catalog, gpu_share, names
from otel_ofu_collector.aggregation import loss
from otel_ofu_collector.aggregation.cells import (
    CLOCK_MAX_SLOT,
    CLOCK_SLOT,
    DRAM_SLOT,
    ENGINE_SLOT,
    FLOPS_SLOT,
    NS_PER_S,
    NVLINK_SLOT,
    PCIE_SLOT,
    POWER_SLOT,
    SM_SLOT,
    TENSOR_SLOT,
    Cell,
    CellKey,
    GpuInputs,
    MfuCell,
    Profile,
    Window,
)
from otel_ofu_collector.aggregation.jobs import JobLedger, JobState, point_ofu
from otel_ofu_collector.config import AggregatorConfig
from otel_ofu_collector.detectors import GPU_DETECTORS, GpuWindowValues, hang
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
_GPU_IDENTITY_KEYS = (names.HOST_NAME, names.HW_ID, names.GPU_MIG_INSTANCE_ID)
_LAST_END = operator.attrgetter("last_end_ns")
# The means a split needs (tensor activity, clocks, engine and SM activity), and DRAM activity for its context.
_MEAN_SLOTS = (TENSOR_SLOT, CLOCK_SLOT, CLOCK_MAX_SLOT, ENGINE_SLOT, SM_SLOT, DRAM_SLOT)
_PROFILE = operator.attrgetter("profile")
# Capacity histograms (a shard's, for its merge tier) count GPU-microseconds: whole units, fine enough for a slice.
_CAPACITY_UNITS_PER_S = 1e6


# A bucket's cells' (seconds in the window, seconds their OFU covered, OFU; None: a cell without OFU).
_Columns = tuple[list[float], list[float], list[float | None]]
# A job's GPUs' engine and SM activity, window means in columns (None: no GPU sent it).
_Activity = tuple[list[float | None] | None, list[float | None] | None]


@attrs.define(slots=True)
class _JobGpus:
    """A job's cells in a window closing, in columns: the cells' keys, the cells, their OFU (None: the cell has only
    unmeasured time), their seconds in the window and the seconds their OFU covered, and their GPU shares."""

    keys: list[CellKey] = attrs.field(factory=list)
    cells: list[Cell] = attrs.field(factory=list)
    ofus: list[float | None] = attrs.field(factory=list)
    seconds: list[float] = attrs.field(factory=list)
    measured: list[float] = attrs.field(factory=list)
    shares: list[float] | None = None  # each GPU's share of a physical GPU; None: all whole GPUs

    def add(self, keys: list[CellKey], cells: list[Cell], columns: _Columns) -> None:
        """One bucket's cells (``_columns``)."""
        seconds, measured, ofus = columns
        self.keys += keys
        self.cells += cells
        self.ofus += ofus
        self.seconds += seconds
        self.measured += measured

    def stream_keys(self) -> list[str]:
        keys = self.keys
        if all(map(isinstance, keys, itertools.repeat(str))):  # no stream moved job: the keys as they are
            return cast(list[str], keys)
        return [key if isinstance(key, str) else key[0] for key in keys]

    def with_ofu(self) -> list[int] | None:
        """The positions of the cells that have OFU; None when all have."""
        ofus = self.ofus
        return None if None not in ofus else [i for i, ofu in enumerate(ofus) if ofu is not None]

    def count(self, measuring: list[int] | None) -> float:
        """The GPU equivalents of the cells at ``measuring`` (``with_ofu``; None: all)."""
        shares = self.shares
        if measuring is None:
            return math.fsum(shares) if shares else float(len(self.cells))
        return math.fsum(shares[i] for i in measuring) if shares else float(len(measuring))

    def idle(self, measuring: list[int] | None, tensor_active: list[float]) -> dict[str, float]:
        """The streams whose tensor pipes were idle in the window, among those with OFU, with their shares."""
        idle = list(map(loss.IDLE_TENSOR_ACTIVE.__gt__, tensor_active))  # active < IDLE_TENSOR_ACTIVE
        if measuring is not None:
            idle = [found and ofu is not None for found, ofu in zip(idle, self.ofus, strict=True)]
        keys, shares = self.stream_keys(), self.shares
        return {keys[i]: shares[i] if shares else 1.0 for i in itertools.compress(range(len(idle)), idle)}

    def stalled(
        self,
        measuring: list[int] | None,
        thresholds: hang.Thresholds,
        tensor_active: list[float],
        activity: _Activity,
        columns: loss.GpuColumns,
    ) -> tuple[dict[str, float], float]:
        """The streams among those with OFU that ran kernels with nothing moving (``hang.stalled``), with their
        shares, and the GPU equivalents judged moving."""
        links: list[float | None] | None = None
        if columns.nvlink is not None or columns.pcie is not None:
            nvlink = columns.nvlink or [None] * len(tensor_active)
            pcie = columns.pcie or [None] * len(tensor_active)
            links = [
                None if a is None and b is None else (a or 0.0) + (b or 0.0) for a, b in zip(nvlink, pcie, strict=True)
            ]
        verdicts = hang.stalled(thresholds, tensor_active, activity[0], activity[1], columns.dram, links)
        keys, shares = self.stream_keys(), self.shares
        stalled: dict[str, float] = {}
        moving = 0.0
        for i in range(len(verdicts)) if measuring is None else measuring:
            share = shares[i] if shares else 1.0
            if verdicts[i]:
                stalled[keys[i]] = share
            elif verdicts[i] is not None:
                moving += share
        return stalled, moving

    def capacity_s(self, keys: Iterable[str]) -> float:
        """The GPU-seconds (share x seconds in the window) of the streams ``keys``."""
        wanted = set(keys)
        if not wanted:
            return 0.0
        shares = self.shares
        return math.fsum(
            (shares[i] if shares else 1.0) * self.seconds[i]
            for i, key in enumerate(self.stream_keys())
            if key in wanted
        )

    def untimed_ofu(self, measuring: list[int] | None) -> tuple[float, float]:
        """``point_ofu`` of the cells with OFU whose points carried no time (their OFU cannot be weighed by it)."""
        untimed = [i for i in (range(len(self.cells)) if measuring is None else measuring) if not self.measured[i]]
        shares = self.shares
        return point_ofu([cast(float, self.ofus[i]) for i in untimed], [shares[i] if shares else 1.0 for i in untimed])


@attrs.define(slots=True)
class _GroupCells:
    """A group's cells in a window closing: the OFU of those that have it with their measured capacity-seconds (share
    x seconds their OFU covered) and shares, and every cell's capacity-seconds (unmeasured ones too)."""

    values: list[float] = attrs.field(factory=list)
    weights: list[float] = attrs.field(factory=list)
    shares: list[float] = attrs.field(factory=list)
    capacity_s: list[float] = attrs.field(factory=list)

    def add(self, columns: _Columns, share: float) -> None:
        """One bucket's cells (``_columns``), each ``share`` of a GPU."""
        seconds, measured, ofus = columns
        with_ofu = [i for i, ofu in enumerate(ofus) if ofu is not None] if None in ofus else None
        if with_ofu is None:
            self.values += cast(list[float], ofus)
            self.weights += [share * m for m in measured] if share != 1.0 else measured
        else:
            self.values += [cast(float, ofus[i]) for i in with_ofu]
            self.weights += [share * measured[i] for i in with_ofu]
        self.shares += [share] * (len(ofus) if with_ofu is None else len(with_ofu))
        self.capacity_s += [share * s for s in seconds] if share != 1.0 else seconds


@attrs.define
class Closer:
    """Closes windows for one collector (or shard): its caches of each model's price and tensor clock, the partitioned
    models it said it could not size, and the closes that failed, by kind."""

    config: AggregatorConfig
    ledger: JobLedger
    _groups: int = attrs.field(init=False)
    _model_index: int = attrs.field(init=False)  # where hw.model is in a profile
    # By hw.model: its price per GPU-hour and its tensor clock (None: not priced, not in the catalog).
    _prices: dict[str | None, float | None] = attrs.field(init=False, factory=dict)
    _tensor_clocks: dict[str | None, float | None] = attrs.field(init=False, factory=dict)
    _unsized: set[tuple[str | None, str | None]] = attrs.field(init=False, factory=set)
    _hang: hang.Thresholds = attrs.field(init=False)  # what a GPU is judged stalled by
    close_failures: dict[str, int] = attrs.field(init=False, factory=dict)  # groups/jobs/fleet totals left out
    windows_closed: int = attrs.field(init=False, default=0)

    def __attrs_post_init__(self) -> None:
        self._groups = len(self.config.group_keys)
        self._model_index = 1 + self._groups + JOB_ATTRIBUTE_KEYS.index(names.HW_MODEL)
        self._hang = hang.Thresholds.of(self.config)

    def close(self, start: int, window: Window) -> WindowReport:
        """One window's report. Each group and each job is closed on its own: one that fails (it should not: its
        inputs were bounded when they came) is left out of the window, counted and logged once, and costs the
        rest nothing."""
        end = start + self.config.window_ns
        groups_cells, jobs_gpus, stream_seconds = self._route(window)
        groups: list[GroupReport] = []
        for key, cells in sorted(groups_cells.items()):
            try:
                groups.append(self._group_report(key, cells))
            except Exception:
                self._failed("group", "|".join(key))
        job_reports: list[JobReport] = []
        gpu_flags: list[GpuFlagReport] = []
        gpu_reports: list[GpuReport] = []
        ledger = self.ledger
        job_parts: dict[str, JobWindow] = {}
        for job_id in sorted(jobs_gpus.keys() | window.mfu.keys() | window.steps.keys() | window.checkpoints.keys()):
            job = ledger.jobs.get(job_id)
            if job is None:  # over the job cap when its points came
                continue
            try:
                job_window, flagged, per_gpu = self._job_window(
                    job_id, job, start, end, window.mfu.get(job_id), window, jobs_gpus.get(job_id), stream_seconds
                )
                report = ledger.close(job_id, job, start, end, job_window)
                flagged = _gpu_flag_changes(job, flagged)
            except Exception:
                self._failed("job", job_id)
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
            self._failed("fleet", "loss")
        self.windows_closed += 1
        # In a stable order, whatever order the GPUs' points arrived in: the same data gives the same outputs.
        gpu_flags.sort(key=lambda r: (r.job_id, r.metric, sorted(r.attributes.items())))
        return WindowReport(
            start, end, tuple(groups), tuple(job_reports), fleet, tuple(gpu_flags), tuple(gpu_reports), job_parts
        )

    def _failed(self, kind: str, name: str) -> None:
        """Count a group, job or the fleet's totals that failed to close; the first failure of each kind is
        logged with its traceback, later ones only counted (one bad job must not flood the log each window)."""
        self.close_failures[kind] = self.close_failures.get(kind, 0) + 1
        if self.close_failures[kind] == 1:
            logger.exception("closing %s %r failed: left out of this window (counted; logged once)", kind, name)

    def _route(
        self, window: Window
    ) -> tuple[dict[tuple[str, ...], _GroupCells], dict[str, _JobGpus], dict[str, float] | None]:
        """The window's cells by group and by job (columns); and, where a stream moved job in the window, every
        stream's seconds over its cells (None: none moved), by which its energy is split between its jobs.

        The cells are first put in buckets by profile (shared by the streams of a job with one identity), by its id:
        profiles are interned, and one that is not only gets a bucket of its own for the same group and job. A bucket's
        group, job and share of a GPU are resolved once, and its cells' times and OFU read a column at a time
        (``_columns``): a window of a 100k-GPU fleet closes without a call per cell.
        """
        group_end = 1 + self._groups
        groups: dict[tuple[str, ...], _GroupCells] = {}
        jobs_gpus: dict[str, _JobGpus] = {}
        moved = not all(map(isinstance, window.cells, itertools.repeat(str)))
        stream_seconds: dict[str, float] | None = {} if moved else None
        partitioned = False
        for keys, cells in _buckets(window.cells).values():
            profile = cells[0].profile
            columns = _columns(cells)
            share = self._share_of(profile)
            partitioned = partitioned or share != 1.0
            group = tuple(UNKNOWN if v is None else v for v in profile[1:group_end])
            groups.setdefault(group, _GroupCells()).add(columns, share)
            if profile[0] is not None:
                jobs_gpus.setdefault(profile[0], _JobGpus()).add(keys, cells, columns)
            if stream_seconds is not None:
                for key, total in zip(keys, columns[0], strict=True):
                    stream = key if isinstance(key, str) else key[0]
                    stream_seconds[stream] = stream_seconds.get(stream, 0.0) + total
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

    def _fleet_energy(self, window: Window, stream_seconds: dict[str, float] | None) -> float | None:
        """Every GPU's energy in the window: those of jobs and those of none, with or without OFU. A GPU without an
        energy counter: its mean power x its seconds in the window (over every job it served), the whole window
        for one that sent no time at all."""
        energies: list[float] = []
        for key, inputs in window.gpus.items():
            seconds = stream_seconds.get(key) if stream_seconds is not None else None
            if seconds is None:
                cell = window.cells.get(key)
                seconds = cell.seconds()[0] if cell is not None else self.config.window_ns / NS_PER_S
            energy = inputs.energy(seconds)
            if energy is not None:
                energies.append(energy)
        return math.fsum(energies) if energies else None  # exactly rounded: the same in any arrival order

    def _models(self, cells: list[Cell]) -> list[str | None]:
        """The cells' GPU models, each model's price and tensor clock looked up once."""
        models = list(map(operator.itemgetter(self._model_index), map(_PROFILE, cells)))
        for model in set(models) - self._prices.keys():
            spec = catalog.lookup(model) if model else None
            self._prices[model] = self.config.price_of(model)
            self._tensor_clocks[model] = spec.tensor_clock_hz if spec is not None else None
        return models

    def _gpu_losses(
        self, window: Window, gpus: _JobGpus, stream_seconds: dict[str, float] | None
    ) -> tuple[loss.GpuColumns, loss.Split, list[GpuInputs | None], _Activity]:
        """The job's GPUs in columns, their split (with their tensor activity as used), their loss inputs, and their
        engine and SM activity (what a hang is judged by, beside the columns' DRAM and links).

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
        found: list[GpuInputs | None] = [None] * n
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
            return columns, split, found, (None, None)
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
            weight = gpu_sums[FLOPS_SLOT + 1]
            flops.append(gpu_sums[FLOPS_SLOT] / weight * gpu_measured if weight else None)
        columns = loss.GpuColumns(
            ofus,
            split,
            seconds,
            energy,
            flops,
            prices,
            gpus.shares,
            dram=dram,
            nvlink=_rates(sums, NVLINK_SLOT, seconds),
            pcie=_rates(sums, PCIE_SLOT, seconds),
            measured=all_measured,
        )
        return columns, split, found, (engine, sm)

    def _gpu_flags(
        self,
        job_id: str,
        job: JobState,
        window: GpuWindowValues,
        inputs: list[GpuInputs | None],
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
        gpus = math.fsum(cells.capacity_s) * NS_PER_S / self.config.window_ns
        values = cells.values
        if not values:
            return GroupReport(attributes, gpus, {}, ExpHistogram(), 0.0, 0.0, 0.0, capacity=self._no_capacity())
        # Capacity in whole GPU-microseconds: the same integers here, in a shard's capacity histogram and after the
        # merge, so that the three read every percentile alike (a share of capacity met exactly is met in each).
        units = list(map(round, map(_CAPACITY_UNITS_PER_S.__mul__, cells.weights)))
        if not any(units):  # OFU points without time: their shares of a GPU weigh them
            units = list(map(round, map(_CAPACITY_UNITS_PER_S.__mul__, cells.shares)))
        if min(units) == max(units):  # every GPU the same capacity (whole GPUs there all window): the values alone
            ordered = sorted(values)
            capacity = units
        else:
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
        mfu_cell: MfuCell | None,
        window: Window,
        gpus: _JobGpus | None,
        stream_seconds: dict[str, float] | None,
    ) -> tuple[JobWindow, list[GpuFlagReport], list[GpuReport]]:
        """The job's part of the window (``jobs.JobWindow``: what the ledger closes it from, and what a shard sends its
        merge tier), the points its GPU-level flags show, and its GPUs' own means where the configuration asks for
        them (``AggregatorConfig.per_gpu_reports``)."""
        config = self.config
        attributes = dict(mfu_cell.attributes) if mfu_cell is not None else {}
        mfu = (mfu_cell.total, mfu_cell.count) if mfu_cell is not None else (0.0, 0)
        steps = window.steps.get(job_id) or {}
        checkpoint_s = window.checkpoints.get(job_id, 0.0)
        if gpus is None:
            return JobWindow(mfu=mfu, attributes=attributes, checkpoint_s=checkpoint_s, steps=steps), [], []
        group_end = 1 + self._groups
        ends = list(map(_LAST_END, gpus.cells))
        newest = gpus.cells[ends.index(max(ends))].profile[group_end : group_end + len(JOB_ATTRIBUTE_KEYS)]
        # The GPUs' own identity wins over what the training side said.
        attributes.update((k, v) for k, v in zip(JOB_ATTRIBUTE_KEYS, newest, strict=True) if v is not None)
        models = frozenset(filter(None, map(operator.itemgetter(self._model_index), map(_PROFILE, gpus.cells))))
        columns, split, inputs, activity = self._gpu_losses(window, gpus, stream_seconds)
        sums = loss.job_sums_of(
            columns, currency=self._currency(), pue=config.pue, grid_intensity=config.grid_intensity
        )
        measuring = gpus.with_ofu()  # None: every GPU gave OFU (the common case: no index lists)
        gpu_flags: list[GpuFlagReport] = []
        if (measuring is None or measuring) and GPU_DETECTORS:
            if not job.gpu_flags:
                job.gpu_flags = {detector.metric.name: detector.start(config) for detector in GPU_DETECTORS}
            gpu_flags = self._measured_gpu_flags(job_id, job, start, end, gpus, measuring, split.tensor_active, inputs)
        per_gpu = _gpu_reports(job_id, gpus, inputs, self._model_index) if config.per_gpu_reports else []
        idle_gpus = gpus.idle(measuring, split.tensor_active)
        stalled, moving = gpus.stalled(measuring, self._hang, split.tensor_active, activity, columns)
        part = JobWindow(
            sums=sums,
            point_ofu=gpus.untimed_ofu(measuring),
            mfu=mfu,
            gpus=gpus.count(measuring),
            idle_gpus=idle_gpus,
            attributes=attributes,
            models=models,
            stalled_gpus=stalled,
            moving_gpus=moving,
            idle_s=gpus.capacity_s(key for key in idle_gpus if key not in stalled),
            checkpoint_s=checkpoint_s,
            steps=steps,
        )
        return part, gpu_flags, per_gpu

    def _measured_gpu_flags(
        self,
        job_id: str,
        job: JobState,
        start: int,
        end: int,
        gpus: _JobGpus,
        measuring: list[int] | None,
        tensor_active: list[float],
        inputs: list[GpuInputs | None],
    ) -> list[GpuFlagReport]:
        """The GPU-level flags over the job's GPUs that gave OFU (``measuring``; None: all), in columns, as
        ``GpuWindowValues`` takes them."""
        keys = gpus.stream_keys()
        cells = gpus.cells
        if measuring is None:
            ofus = cast(list[float], gpus.ofus)
        else:
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


def _gpu_flag_changes(job: JobState, flagged: list[GpuFlagReport]) -> list[GpuFlagReport]:
    """The GPU flags' points with the rises marked (``GpuFlagReport.raised``), and the job's GPUs up kept: a 1 on a GPU
    whose flag was not up rose; its 0 (shown once, when cleared) is the fall."""
    if not flagged:
        return flagged
    marked: list[GpuFlagReport] = []
    up = job.gpus_up
    for flag in flagged:
        key = (flag.metric, "|".join(f"{k}={v}" for k, v in sorted(flag.attributes.items()) if k in _GPU_IDENTITY_KEYS))
        if flag.value and key not in up:
            up.add(key)
            flag = attrs.evolve(flag, raised=True)
        elif not flag.value:
            up.discard(key)
        marked.append(flag)
    return marked


_LO = operator.attrgetter("lo")
_HI = operator.attrgetter("hi")
_SPANS = operator.attrgetter("spans")
_WEIGHT = operator.attrgetter("weight")
_WEIGHTED = operator.attrgetter("weighted")
_CARRIED = operator.attrgetter("carried")
_UNMEASURED = operator.attrgetter("unmeasured")
_CARRIED_UNMEASURED = operator.attrgetter("carried_unmeasured")
_NS_PER_S = itertools.repeat(float(NS_PER_S))


def _buckets(cells: dict[CellKey, Cell]) -> dict[int, tuple[list[CellKey], list[Cell]]]:
    """The cells' keys and cells by profile, by its id: profiles are interned (one that is not only gets a bucket of
    its own for the same group and job)."""
    buckets: dict[int, tuple[list[CellKey], list[Cell]]] = {}
    for key, cell in zip(cells, cells.values(), strict=True):  # no tuple per cell
        bucket = buckets.get(id(cell.profile))
        if bucket is None:
            bucket = buckets[id(cell.profile)] = ([], [])
        bucket[0].append(key)
        bucket[1].append(cell)
    return buckets


def _columns(cells: list[Cell]) -> _Columns:
    """The cells' (seconds in the window, seconds their OFU covered, OFU; None for a cell without OFU), a column at a
    time: the cells of a producer's fleet (one span each, nothing carried, every one with OFU) in C-level passes, the
    others cell by cell (``cells.Cell.seconds``)."""
    weights = list(map(_WEIGHT, cells))
    if 0.0 in weights:
        ofus: list[float | None] = [c.weighted / c.weight if c.weight else None for c in cells]
    else:
        ofus = list(map(operator.truediv, map(_WEIGHTED, cells), weights))
    plain = (
        not any(map(_SPANS, cells))
        and not any(map(_CARRIED, cells))
        and not any(map(_UNMEASURED, cells))
        and not any(map(_CARRIED_UNMEASURED, cells))
    )
    if plain:
        # Divided, not multiplied by 1e-9: a whole number of seconds stays whole.
        measured = list(map(operator.truediv, map(operator.sub, map(_HI, cells), map(_LO, cells)), _NS_PER_S))
        return measured, measured, ofus
    times = [cell.seconds() for cell in cells]
    return [total for total, _measured in times], [measured for _total, measured in times], ofus


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


def _gpu_reports(job_id: str, gpus: _JobGpus, inputs: list[GpuInputs | None], model_index: int) -> list[GpuReport]:
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
_GPU_REPORT_SLOTS = (TENSOR_SLOT, CLOCK_SLOT, CLOCK_MAX_SLOT, POWER_SLOT)


def _gpu_identity(key: str, inputs: GpuInputs | None) -> dict[str, str]:
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
