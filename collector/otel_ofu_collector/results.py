"""What a closed window holds: the value classes every stage of the collector passes along.

The windows (``aggregation``) and the merge tier make them; the outputs (OTLP, Prometheus, records, the
live feed) and the report read them. Plain frozen values with no behaviour beyond what they derive, so
this module sits below everything else in the collector and imports nothing of it but the mergeable
statistics the values are made of (``stats``, which the windows import too: no cycle).

Also here: a shard's mergeable part of a window (``PartialWindow``), what the merge tier takes in.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from typing import Final

import attrs

from otel_ofu import names
from otel_ofu_collector.stats.comoments import CoMoments
from otel_ofu_collector.stats.exphist import ExpHistogram

STATUS_OK: Final = "ok"
STATUS_NO_MFU: Final = "no_mfu"
STATUS_NO_OFU: Final = "no_ofu"


def finite_or_none(value: float | None) -> float | None:
    """The value when it is a finite number; NaN and infinities are missing values, never numbers to show."""
    return value if value is not None and math.isfinite(value) else None


@attrs.frozen
class GroupReport:
    """A group's (model, precision) GPUs in one window. ``gpus``: GPU equivalents on average over the window (its
    GPU-seconds over the window's: a MIG slice counts as its share of its GPU, a GPU there for half the window as
    half of one). ``quantiles``: over GPU capacity (``stats.quantiles``); empty when no GPU gave OFU. ``histogram``:
    one observation per GPU (and job it served) with OFU. ``capacity``: the same OFU values counted in
    GPU-microseconds of capacity, what a merge tier reads the percentiles from (a shard's; None elsewhere)."""

    attributes: Mapping[str, str]
    gpus: float
    quantiles: Mapping[float, float]
    histogram: ExpHistogram
    ofu_sum: float
    ofu_min: float
    ofu_max: float
    capacity: ExpHistogram | None = None


_NO_LOSS: Final[Mapping[str, float]] = {}


@attrs.frozen
class JobLoss:
    """Where a job's 1 - OFU went in one window, and what it cost (see ``aggregation.loss``).

    ``shares`` by ``ofu.loss.cause``: with the job's OFU they sum to 1. ``lost_s``: GPU-seconds lost by cause.
    None: not known (no energy reading, no peak, no price, no grid intensity configured).
    """

    gpu_time_s: float
    shares: Mapping[str, float]
    lost_s: Mapping[str, float]
    energy_j: float | None = None
    flops_per_joule: float | None = None
    cost: float | None = None
    cost_lost: Mapping[str, float] | None = None
    emissions_kg: float | None = None
    currency: str | None = None  # of cost and cost_lost
    # What the job's GPUs did besides tensor work (means over the GPUs that report them): what tells a
    # memory-bound job from a communication-bound one. None: no GPU reported it.
    dram_active: float | None = None
    nvlink_bytes_per_s: float | None = None
    pcie_bytes_per_s: float | None = None


@attrs.frozen
class JobSums:
    """A job's window in sums over its GPUs, each of which adds across shards: capacity-seconds (``gpu_time_s``),
    useful ones (OFU x measured capacity-seconds), lost ones by cause, energy, achieved FLOPs and the energy of the
    GPUs that have them, cost (and its lost part by cause) and emissions where known, and each context value (DRAM
    activity, NVLink and PCIe bytes per second) as (sum weighted by GPU time, GPU time). ``job_values`` and ``job_loss``
    turn them into the job's OFU and its ``JobLoss``."""

    gpu_time_s: float
    useful_s: float
    lost_s: Mapping[str, float]
    energy_j: float | None = None
    flops: float = 0.0
    flops_energy_j: float = 0.0
    cost: float | None = None
    cost_lost: Mapping[str, float] | None = None
    emissions_kg: float | None = None
    currency: str | None = None
    context: Mapping[str, tuple[float, float]] = attrs.field(factory=dict)

    @property
    def residual(self) -> str | None:
        """The split cause the shares take as 1 - OFU - the others; None when no second was measured."""
        return residual_of(self.lost_s)

    @property
    def measured_s(self) -> float:
        """The capacity-seconds that gave OFU."""
        return self.gpu_time_s - self.lost_s.get(names.OfuLossCause.UNMEASURED, 0.0)

    def merge(self, other: JobSums) -> JobSums:
        """Both parts' sums (a job's GPUs on two shards in one window): every value adds."""
        context = dict(self.context)
        for kind, (total, weight) in other.context.items():
            mine = context.get(kind, (0.0, 0.0))
            context[kind] = (mine[0] + total, mine[1] + weight)
        return JobSums(
            gpu_time_s=self.gpu_time_s + other.gpu_time_s,
            useful_s=self.useful_s + other.useful_s,
            lost_s=_add(self.lost_s, other.lost_s) or {},
            energy_j=_add_number(self.energy_j, other.energy_j),
            flops=self.flops + other.flops,
            flops_energy_j=self.flops_energy_j + other.flops_energy_j,
            cost=_add_number(self.cost, other.cost),
            cost_lost=_add(self.cost_lost, other.cost_lost),
            emissions_kg=_add_number(self.emissions_kg, other.emissions_kg),
            currency=self.currency or other.currency,
            context=context,
        )


_NO_IDLE: Final[Mapping[str, float]] = {}
_NO_STEPS: Final[Mapping[int, float]] = {}


@attrs.frozen
class JobWindow:
    """One job's part of one window, in values that add across shards (what ``aggregation.jobs.JobLedger`` closes a
    job's window from, and what a shard sends its merge tier).

    ``sums``: its GPUs' sums (None: no GPU time). ``point_ofu``: (OFU x share, share) summed over GPUs whose OFU
    points carried no time (instantaneous, a stream's first): what stands in for the OFU where no second was measured.
    ``mfu``: (sum, count) of its ``job.mfu`` points. ``gpus``: GPU equivalents that gave OFU (each once, whatever
    time), ``idle_gpus`` those with no tensor activity by stream key (what the idle flag counts). ``attributes``:
    job.name, hw.model, gpu.precision as its MFU points and then its GPUs' newest points say; ``models``: its GPUs'
    models (where there are several, no one model names the job's outputs: its cost is theirs together).

    Goodput's inputs (``aggregation.goodput``): ``stalled_gpus`` by stream key (running kernels with nothing moving,
    ``detectors.hang.stalled``) and ``moving_gpus`` (GPU equivalents judged not stalled); ``idle_s``, the GPU-seconds
    of its idle GPUs that were not stalled; ``checkpoint_s``, the seconds of the window its framework reported saving
    or loading checkpoints; ``steps``, its ``job.step`` points by time (ns)."""

    sums: JobSums | None = None
    point_ofu: tuple[float, float] = (0.0, 0.0)
    mfu: tuple[float, int] = (0.0, 0)
    gpus: float = 0.0
    idle_gpus: Mapping[str, float] = _NO_IDLE
    attributes: Mapping[str, str] = attrs.field(factory=dict)
    models: frozenset[str] = frozenset()
    stalled_gpus: Mapping[str, float] = _NO_IDLE
    moving_gpus: float = 0.0
    idle_s: float = 0.0
    checkpoint_s: float = 0.0
    steps: Mapping[int, float] = _NO_STEPS

    def merge(self, other: JobWindow) -> JobWindow:
        """Both parts (the job on two shards in one window): the sums add, the GPUs are each on one side, the
        attributes are the later part's over the earlier's, the step points are both parts' (one point sent to both
        counts once)."""
        if self.sums is None or other.sums is None:
            sums = other.sums if self.sums is None else self.sums
        else:
            sums = self.sums.merge(other.sums)
        return JobWindow(
            sums=sums,
            point_ofu=(self.point_ofu[0] + other.point_ofu[0], self.point_ofu[1] + other.point_ofu[1]),
            mfu=(self.mfu[0] + other.mfu[0], self.mfu[1] + other.mfu[1]),
            gpus=self.gpus + other.gpus,
            idle_gpus={**self.idle_gpus, **other.idle_gpus},
            attributes={**self.attributes, **other.attributes},
            models=self.models | other.models,
            stalled_gpus={**self.stalled_gpus, **other.stalled_gpus},
            moving_gpus=self.moving_gpus + other.moving_gpus,
            idle_s=self.idle_s + other.idle_s,
            checkpoint_s=self.checkpoint_s + other.checkpoint_s,
            steps={**self.steps, **other.steps},
        )


def ordered_causes(causes: Iterable[str]) -> list[str]:
    """Causes in ``names.OfuLossCause.ALL`` order (``unmeasured`` after the split ones)."""
    present = set(causes)
    return [cause for cause in names.OfuLossCause.ALL if cause in present]


# The split cause a job's shares take as the residual, by preference: the coarse ``tensor`` where some GPU lacks
# engine and SM activity, else ``non_tensor``; the others only where those are absent.
_RESIDUAL_ORDER: Final = (
    names.OfuLossCause.TENSOR,
    names.OfuLossCause.NON_TENSOR,
    names.OfuLossCause.SM_IDLE,
    names.OfuLossCause.NO_KERNEL,
    names.OfuLossCause.CLOCK,
    names.OfuLossCause.IDLE,
)


def residual_of(causes: Iterable[str]) -> str | None:
    """The split cause a job's shares take as 1 - OFU - the others; None without a split cause (no time measured)."""
    present = set(causes)
    return next((cause for cause in _RESIDUAL_ORDER if cause in present), None)


@attrs.frozen
class FleetLoss:
    """The fleet's totals for one window: sums over its jobs (lost time and cost) and its GPUs (energy)."""

    lost_s: Mapping[str, float] = _NO_LOSS
    energy_j: float | None = None
    cost_lost: Mapping[str, float] | None = None
    currency: str | None = None

    def merge(self, other: FleetLoss) -> FleetLoss:
        """Both parts' totals: every value is a sum, so shards add exactly."""
        return FleetLoss(
            lost_s=_add(self.lost_s, other.lost_s) or {},
            energy_j=_add_number(self.energy_j, other.energy_j),
            cost_lost=_add(self.cost_lost, other.cost_lost),
            currency=self.currency or other.currency,
        )


def _add_number(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else a + b


def _add(a: Mapping[str, float] | None, b: Mapping[str, float] | None) -> Mapping[str, float] | None:
    if a is None or b is None:
        return b if a is None else a
    return {cause: a.get(cause, 0.0) + b.get(cause, 0.0) for cause in (*a, *(k for k in b if k not in a))}


@attrs.frozen
class GpuFlagReport:
    """One GPU's verdict on one GPU-level flag in one window (only GPUs whose flag is to be shown)."""

    metric: str  # the flag's metric name (a GPU detector's)
    job_id: str
    attributes: Mapping[str, str]  # the GPU's identity (host.name, hw.id, ...) and the flag's own labels
    value: int
    ofu: float
    job_median_ofu: float  # the median OFU of the job's other GPUs (the GPU's peers) in the window
    raised: bool = False  # the flag rose on this GPU in this window (its value 0 is always the fall)


_NO_THROTTLE: Final[Mapping[str, float]] = {}


@attrs.frozen
class GpuReport:
    """One GPU's means over one window, for a screen that opens a job's GPUs (``otel-ofu top``).

    ``attributes``: its identity (``host.name``, ``hw.id``, ``gpu.index``, ``hw.model``, ``gpu.mig.instance.id``
    where known). None: the GPU sent no such input. ``throttle``: share of the window by ``gpu.throttle.reason``.
    """

    job_id: str | None
    attributes: Mapping[str, str]
    ofu: float
    tensor_active: float | None = None
    sm_clock_hz: float | None = None
    sm_clock_max_hz: float | None = None
    power_w: float | None = None
    throttle: Mapping[str, float] = _NO_THROTTLE


@attrs.frozen
class JobGoodput:
    """Where a job's allocated GPU time went (``aggregation.goodput``). ``badput_s``: the GPU-seconds booked in this
    window by ``goodput.cause`` (a progress cause only on the progress basis); ``goodput`` and ``goodput_flops``: over
    the job so far (productive GPU time, and the useful FLOPs of it, over its allocated GPU time and that time's peak);
    ``basis``: ``names.GoodputBasis``."""

    badput_s: Mapping[str, float]
    goodput: float
    goodput_flops: float
    basis: str


@attrs.frozen
class FleetGoodput:
    """The fleet's: ``badput_s`` booked in this window by cause, summed over its jobs; ``goodput`` over the horizon;
    ``basis``: ``names.GoodputBasis`` of the window's jobs (``mixed`` where some reported progress and some not)."""

    badput_s: Mapping[str, float]
    goodput: float
    basis: str


_NO_CHANGES: Final[Mapping[str, bool]] = {}


@attrs.frozen
class JobReport:
    job_id: str
    attributes: Mapping[str, str]  # job.name, hw.model, gpu.precision where known
    ofu: float | None
    mfu: float | None
    gap: float | None
    correlation: float | None
    # Each detector's verdict by its metric name (``detectors.DETECTORS``): 1 up, 0 down, None not assessable.
    flags: Mapping[str, float | None]
    status: str  # STATUS_OK | STATUS_NO_MFU | STATUS_NO_OFU
    gpus: float  # GPU equivalents
    loss: JobLoss | None = None  # None: the job had no GPU in the window
    goodput: JobGoodput | None = None  # None: the job has had no GPU time yet
    # The flags that rose (True) or fell (False) in this window, by metric name: what the flag events say.
    flag_changes: Mapping[str, bool] = _NO_CHANGES

    def flag(self, metric: names.MetricSpec) -> float | None:
        """The verdict of the flag exported as ``metric``; None when absent."""
        return self.flags.get(metric.name)

    @property
    def flops_miscount(self) -> float | None:
        return self.flag(names.JOB_FLOPS_MISCOUNT)

    @property
    def regression(self) -> float | None:
        return self.flag(names.JOB_OFU_REGRESSION)


@attrs.frozen
class FleetReport:
    correlation: float | None
    mae: float | None
    jobs: int  # jobs with an (OFU, MFU) pair in the horizon: those behind correlation and mae
    comoments: CoMoments
    abs_diff_sum: float
    loss: FleetLoss = FleetLoss()
    goodput: FleetGoodput | None = None  # None: no job had GPU time in the horizon


@attrs.frozen
class WindowReport:
    start_ns: int
    end_ns: int
    groups: tuple[GroupReport, ...]
    jobs: tuple[JobReport, ...]
    fleet: FleetReport
    gpu_flags: tuple[GpuFlagReport, ...] = ()
    gpus: tuple[GpuReport, ...] = ()  # per-GPU means; empty where the windows were not asked for them
    # Each job's part of the window as sums, by job.id: what a shard sends its merge tier (empty elsewhere).
    job_parts: Mapping[str, JobWindow] = attrs.field(factory=dict)
    # When a clean stop closed the window before its end (without a write-ahead to keep it open); None: at its end.
    closed_at_ns: int | None = None


@attrs.frozen
class PartialGroup:
    attributes: Mapping[str, str]
    histogram: ExpHistogram
    gpus: float
    capacity: ExpHistogram | None = None  # GPU-microseconds of capacity by OFU (None: a shard that sent none)


@attrs.frozen
class PartialWindow:
    """One shard's mergeable state of one window: its groups, its fleet loss totals (None: it carries none) and each
    job's part of the window, by job.id."""

    start_ns: int
    end_ns: int
    groups: tuple[PartialGroup, ...]
    shard_id: str
    fleet_loss: FleetLoss | None = None
    jobs: Mapping[str, JobWindow] = attrs.field(factory=dict)


# Every window output in the contract's order: the OFU outputs, where OFU is lost, then goodput.
OUTPUT_METRICS: Final = (*names.COLLECTOR_METRICS, *names.COLLECTOR_LOSS_METRICS, *names.COLLECTOR_GOODPUT_METRICS)
_COLLECTOR_METRICS: Final = {spec.name: spec for spec in OUTPUT_METRICS}


def cost_spec(spec: names.MetricSpec, currency: str | None) -> names.MetricSpec:
    """A cost metric with the currency's code as its unit annotation (``{USD}``); others unchanged."""
    if spec.unit != names.COST_UNIT or not currency:
        return spec
    return attrs.evolve(spec, unit=f"{{{currency}}}")


@attrs.frozen
class GaugePoint:
    """One gauge value a closed window yields: what the OTLP encoder and the Prometheus endpoint both show."""

    spec: names.MetricSpec
    attributes: Mapping[str, str | float | int]
    value: float


def gauge_points(report: WindowReport) -> Iterator[GaugePoint]:
    """The window's gauge and sum outputs (every collector metric but the ``fleet.ofu`` histogram), in report
    order; a value that is None is not a point. Sums (``spec.kind == "sum"``) are the window's delta."""
    for group in report.groups:
        attributes: dict[str, str | float | int] = dict(group.attributes)
        for q, value in group.quantiles.items():
            yield GaugePoint(names.FLEET_OFU_QUANTILE, {**attributes, names.QUANTILE: q}, value)
        yield GaugePoint(names.FLEET_GPUS, attributes, group.gpus)
    for job in report.jobs:
        job_attributes = {names.JOB_ID: job.job_id, **job.attributes}
        for spec, job_value in (
            (names.JOB_OFU, job.ofu),
            (names.JOB_OFU_MFU_GAP, job.gap),
            (names.JOB_OFU_MFU_CORRELATION, job.correlation),
        ):
            if job_value is not None:
                yield GaugePoint(spec, job_attributes, job_value)
        for name, verdict in job.flags.items():
            if verdict is not None:
                yield GaugePoint(_COLLECTOR_METRICS[name], job_attributes, verdict)
        if job.gpus:
            yield GaugePoint(names.JOB_GPUS, job_attributes, job.gpus)
        if job.loss is not None:
            yield from _job_loss_points(job_attributes, job.loss)
        if job.goodput is not None:
            yield from _job_goodput_points(job_attributes, job.goodput)
    for flag in report.gpu_flags:
        yield GaugePoint(_COLLECTOR_METRICS[flag.metric], {names.JOB_ID: flag.job_id, **flag.attributes}, flag.value)
    fleet = report.fleet
    for spec, fleet_value in (
        (names.FLEET_OFU_MFU_CORRELATION, fleet.correlation),
        (names.FLEET_OFU_MFU_MAE, fleet.mae),
    ):
        if fleet_value is not None:
            yield GaugePoint(spec, {}, fleet_value)
    loss = fleet.loss
    yield from _by_cause(names.FLEET_GPU_TIME_LOST, {}, loss.lost_s)
    if loss.energy_j is not None:
        yield GaugePoint(names.FLEET_ENERGY, {}, loss.energy_j)
    if loss.cost_lost is not None:
        yield from _by_cause(cost_spec(names.FLEET_COST_LOST, loss.currency), {}, loss.cost_lost)
    if fleet.goodput is not None:
        basis = {names.GOODPUT_BASIS: fleet.goodput.basis}
        yield from _by_goodput_cause(names.FLEET_BADPUT, basis, fleet.goodput.badput_s)
        yield GaugePoint(names.FLEET_GOODPUT, basis, fleet.goodput.goodput)


def _by_goodput_cause(
    spec: names.MetricSpec, attributes: Mapping[str, str | float | int], values: Mapping[str, float]
) -> Iterator[GaugePoint]:
    for cause in names.GoodputCause.ALL:
        if cause in values:
            yield GaugePoint(spec, {**attributes, names.GOODPUT_CAUSE: cause}, values[cause])


def _job_goodput_points(attributes: Mapping[str, str | float | int], goodput: JobGoodput) -> Iterator[GaugePoint]:
    based = {**attributes, names.GOODPUT_BASIS: goodput.basis}
    yield from _by_goodput_cause(names.JOB_BADPUT, based, goodput.badput_s)
    yield GaugePoint(names.JOB_GOODPUT, based, goodput.goodput)
    yield GaugePoint(names.JOB_GOODPUT_FLOPS, based, goodput.goodput_flops)


def _by_cause(
    spec: names.MetricSpec, attributes: Mapping[str, str | float | int], values: Mapping[str, float]
) -> Iterator[GaugePoint]:
    for cause in names.OfuLossCause.ALL:
        if cause in values:
            yield GaugePoint(spec, {**attributes, names.OFU_LOSS_CAUSE: cause}, values[cause])


def _job_loss_points(attributes: Mapping[str, str | float | int], loss: JobLoss) -> Iterator[GaugePoint]:
    yield GaugePoint(names.JOB_GPU_TIME, attributes, loss.gpu_time_s)
    yield from _by_cause(names.JOB_OFU_LOSS, attributes, loss.shares)
    yield from _by_cause(names.JOB_GPU_TIME_LOST, attributes, loss.lost_s)
    for spec, value in (
        (names.JOB_ENERGY, loss.energy_j),
        (names.JOB_FLOPS_PER_JOULE, loss.flops_per_joule),
        (cost_spec(names.JOB_COST, loss.currency), loss.cost),
        (names.JOB_EMISSIONS, loss.emissions_kg),
        (names.JOB_DRAM_ACTIVE, loss.dram_active),
        (names.JOB_NVLINK_THROUGHPUT, loss.nvlink_bytes_per_s),
        (names.JOB_PCIE_THROUGHPUT, loss.pcie_bytes_per_s),
    ):
        if value is not None:
            yield GaugePoint(spec, attributes, value)
    if loss.cost_lost is not None:
        yield from _by_cause(cost_spec(names.JOB_COST_LOST, loss.currency), attributes, loss.cost_lost)
