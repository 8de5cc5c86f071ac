"""Shards' partial window state over OTLP, both ways: what a shard adds to its outputs, and reading it back.

A shard (``--mode shard``) exports, for every window it closes (``fleet.partial.window``, so that the merge tier closes
the empty ones too), besides the ``fleet.ofu`` histograms, ``fleet.gpus`` and the fleet's loss totals
(``fleet.gpu_time.lost``, ``fleet.energy``, ``fleet.cost.lost``: sums, which the merge tier adds), each group's OFU
counted in GPU capacity (``fleet.ofu.partial.capacity``, an exponential histogram whose counts are GPU-microseconds:
the percentiles are read from it) and each job's window as sums (``job.partial``, one point per field, with the job's
identity: ``names.PartialField``; with what its goodput and hang flag are computed from: its stalled GPUs, its idle
GPUs' seconds, its checkpoint seconds, its step points). A shard sends no job.* output of its own: the merge tier adds
up each job's parts, from every shard it was on in the window, and computes them once. ``encode`` writes the points
from ``capacity_points`` and ``job_points``; the merge tier's ``Decoder`` reads requests back with
``partials_from_request``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import attrs
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from otel_ofu import names
from otel_ofu_collector.results import FleetLoss, JobSums, JobWindow, PartialGroup, PartialWindow, ordered_causes
from otel_ofu_collector.stats.exphist import ExpHistogram

F = names.PartialField
_FLEET_LOSS_NAMES = frozenset(
    spec.name for spec in (names.FLEET_GPU_TIME_LOST, names.FLEET_ENERGY, names.FLEET_COST_LOST)
)
# What partials_from_request reads: the merge tier consumes these from shards instead of forwarding them. A group's
# fleet.gpus (GPU equivalents) is read beside its histogram, whose count is observations.
_PARTIAL_NAMES = frozenset(
    [
        names.FLEET_OFU.name,
        names.FLEET_GPUS.name,
        *(spec.name for spec in names.COLLECTOR_PARTIAL_METRICS),
        *_FLEET_LOSS_NAMES,
    ]
)
# Fleet outputs a shard reports for its own slice only; the merge tier drops the shards' copies and emits its own.
_MERGE_RECOMPUTED_NAMES = frozenset(
    spec.name
    for spec in (
        names.FLEET_OFU_QUANTILE,
        names.FLEET_GPUS,
        names.FLEET_OFU_MFU_CORRELATION,
        names.FLEET_OFU_MFU_MAE,
        names.FLEET_BADPUT,
        names.FLEET_GOODPUT,
    )
)
# The attributes of a job.partial point that are the job's, not the field's.
_JOB_KEYS = (names.JOB_ID, names.JOB_NAME, names.HW_MODEL, names.GPU_PRECISION)
_CAPACITY_UNITS_PER_S = 1e6  # a capacity histogram counts GPU-microseconds


def is_partial_metric(name: str) -> bool:
    """True for the metrics a merge-tier collector reads from shards."""
    return name in _PARTIAL_NAMES


def is_merge_recomputed_metric(name: str) -> bool:
    """True for the shard-local fleet gauges a merge tier should drop: it emits fleet-wide ones instead."""
    return name in _MERGE_RECOMPUTED_NAMES


def capacity_units(seconds: float) -> int:
    """GPU capacity-seconds in a capacity histogram's units (GPU-microseconds: whole units, fine enough for a
    slice)."""
    return round(seconds * _CAPACITY_UNITS_PER_S)


def job_points(job_id: str, part: JobWindow) -> Iterator[tuple[dict[str, str], float]]:
    """A job's window sums as (attributes, value) of ``job.partial`` points: its identity, each field, and the
    shard's currency on the cost points."""
    identity = {names.JOB_ID: job_id, **{key: part.attributes[key] for key in _JOB_KEYS[1:] if key in part.attributes}}
    if part.sums is not None:
        for field, value, extra in _sums_fields(part.sums):
            yield {**identity, names.PARTIAL_FIELD: field, **extra}, value
    for field, value in _window_fields(part):
        yield {**identity, names.PARTIAL_FIELD: field}, value


def _sums_fields(sums: JobSums) -> Iterator[tuple[str, float, Mapping[str, str]]]:
    """The fields of a job's GPU sums, each with the attributes it carries beyond the job's (a cost's currency)."""
    plain: Mapping[str, str] = {}
    yield F.GPU_TIME, sums.gpu_time_s, plain
    yield F.USEFUL, sums.useful_s, plain
    for cause, seconds in sums.lost_s.items():
        yield F.LOST + cause, seconds, plain
    if sums.energy_j is not None:
        yield F.ENERGY, sums.energy_j, plain
    if sums.flops_energy_j:
        yield F.FLOPS, sums.flops, plain
        yield F.FLOPS_ENERGY, sums.flops_energy_j, plain
    currency = {names.PARTIAL_CURRENCY: sums.currency} if sums.currency else plain
    if sums.cost is not None:
        yield F.COST, sums.cost, currency
    for cause, cost in (sums.cost_lost or {}).items():
        yield F.COST_LOST + cause, cost, currency
    if sums.emissions_kg is not None:
        yield F.EMISSIONS, sums.emissions_kg, plain
    for kind, (total, weight) in sums.context.items():
        yield F.CONTEXT + kind, total, plain
        yield F.CONTEXT_WEIGHT + kind, weight, plain


def _window_fields(part: JobWindow) -> Iterator[tuple[str, float]]:
    """The fields of a job's window beside its sums: point OFU, MFU, its GPUs and models, and goodput's inputs (the
    hang verdicts the shard made per GPU, its idle GPUs' seconds, its progress points). A zero sends nothing."""
    if part.point_ofu[1]:
        yield F.POINT_OFU, part.point_ofu[0]
        yield F.POINT_OFU_WEIGHT, part.point_ofu[1]
    if part.mfu[1]:
        yield F.MFU_SUM, part.mfu[0]
        yield F.MFU_COUNT, part.mfu[1]
    if part.gpus:
        yield F.GPUS, part.gpus
    for key, share in part.idle_gpus.items():
        yield F.IDLE_GPU + key, share
    for model in sorted(part.models):
        yield F.MODEL + model, 1.0
    for key, share in part.stalled_gpus.items():
        yield F.STALLED_GPU + key, share
    if part.moving_gpus:
        yield F.MOVING_GPUS, part.moving_gpus
    if part.idle_s:
        yield F.IDLE_S, part.idle_s
    if part.checkpoint_s:
        yield F.CHECKPOINT_S, part.checkpoint_s
    for time_ns, step in sorted(part.steps.items()):
        yield F.STEP + str(time_ns), step


def _any_value_text(value: Any) -> str:
    kind = value.WhichOneof("value")
    if kind == "string_value":
        return str(value.string_value)
    if kind == "bool_value":
        return "true" if value.bool_value else "false"
    if kind == "int_value":
        return str(value.int_value)
    if kind == "double_value":
        return repr(value.double_value)
    raise ValueError(f"attribute value of kind {kind!r} cannot name a group, job or shard")


def _attributes(key_values: Iterable[Any]) -> dict[str, str]:
    return {kv.key: _any_value_text(kv.value) for kv in key_values}


def _finite(name: str, value: float) -> float:
    if not math.isfinite(value):
        raise ValueError(f"{name} is not finite: {value!r}")
    return float(value)


def _histogram(name: str, point: Any) -> ExpHistogram:
    if any(point.negative.bucket_counts):
        raise ValueError(f"{name} histogram has negative buckets: OFU is never negative")
    histogram = ExpHistogram(
        scale=point.scale,
        zero_count=point.zero_count,
        offset=point.positive.offset,
        counts=tuple(point.positive.bucket_counts),
        sum=_finite(f"{name} sum", point.sum),
        min=_finite(f"{name} min", point.min) if point.HasField("min") else None,
        max=_finite(f"{name} max", point.max) if point.HasField("max") else None,
    )
    if histogram.count != point.count:
        raise ValueError(f"{name} count {point.count} differs from its buckets' total {histogram.count}")
    if histogram.count == 0:  # an empty window carries no bounds; the SDK point writes 0.0 for them
        histogram = ExpHistogram(sum=histogram.sum)
    return histogram.normalized()


def _number(point: Any) -> float:
    kind = point.WhichOneof("value")
    if kind == "as_double":
        return _finite("partial value", point.as_double)
    if kind == "as_int":
        return float(point.as_int)
    raise ValueError("partial point without a value")


@attrs.define
class _JobBuilder:
    """One job's ``job.partial`` fields of one window from one shard, as they are read."""

    attributes: dict[str, str] = attrs.field(factory=dict)
    values: dict[str, float] = attrs.field(factory=dict)
    currency: str | None = None

    def add(self, field: str, value: float, attributes: Mapping[str, str]) -> None:
        if field in self.values:
            raise ValueError(f"job.partial field {field!r} twice for one job and window")
        if value < 0 and not field.startswith(F.CONTEXT):
            raise ValueError(f"job.partial field {field!r} is negative: {value!r}")
        self.values[field] = value
        self.attributes.update((key, attributes[key]) for key in _JOB_KEYS[1:] if key in attributes)
        self.currency = self.currency or attributes.get(names.PARTIAL_CURRENCY)

    def window(self) -> JobWindow:
        values = self.values
        by_prefix: dict[str, dict[str, float]] = {}
        for field, value in values.items():
            prefix, dot, key = field.partition(".")
            if dot:
                by_prefix.setdefault(prefix + ".", {})[key] = value
        sums: JobSums | None = None
        if F.GPU_TIME in values:
            lost = by_prefix.get(F.LOST, {})
            unknown = set(lost) - set(names.OfuLossCause.ALL)
            if unknown:
                raise ValueError(f"job.partial lost time of unknown cause {sorted(unknown)[0]!r}")
            cost_lost = by_prefix.get(F.COST_LOST)
            context = {
                kind: (total, by_prefix.get(F.CONTEXT_WEIGHT, {}).get(kind, 0.0))
                for kind, total in by_prefix.get(F.CONTEXT, {}).items()
            }
            sums = JobSums(
                gpu_time_s=values[F.GPU_TIME],
                useful_s=values.get(F.USEFUL, 0.0),
                lost_s={cause: lost[cause] for cause in ordered_causes(lost)},
                energy_j=values.get(F.ENERGY),
                flops=values.get(F.FLOPS, 0.0),
                flops_energy_j=values.get(F.FLOPS_ENERGY, 0.0),
                cost=values.get(F.COST),
                cost_lost=None
                if cost_lost is None
                else {cause: cost_lost[cause] for cause in ordered_causes(cost_lost)},
                emissions_kg=values.get(F.EMISSIONS),
                currency=self.currency,
                context=context,
            )
        count = values.get(F.MFU_COUNT, 0.0)
        if count != int(count):
            raise ValueError(f"job.partial MFU count {count!r} is not a count")
        steps: dict[int, float] = {}
        for key, step in by_prefix.get(F.STEP, {}).items():
            if not key.isdigit():
                raise ValueError(f"job.partial step point at {key!r}: not a time in ns")
            steps[int(key)] = step
        return JobWindow(
            sums=sums,
            point_ofu=(values.get(F.POINT_OFU, 0.0), values.get(F.POINT_OFU_WEIGHT, 0.0)),
            mfu=(values.get(F.MFU_SUM, 0.0), int(count)),
            gpus=values.get(F.GPUS, 0.0),
            idle_gpus=by_prefix.get(F.IDLE_GPU, {}),
            attributes=dict(self.attributes),
            models=frozenset(by_prefix.get(F.MODEL, {})),
            stalled_gpus=by_prefix.get(F.STALLED_GPU, {}),
            moving_gpus=values.get(F.MOVING_GPUS, 0.0),
            idle_s=values.get(F.IDLE_S, 0.0),
            checkpoint_s=values.get(F.CHECKPOINT_S, 0.0),
            steps=steps,
        )


class _PartialBuilder:
    def __init__(self) -> None:
        self.start_ns = 0
        self.groups: list[PartialGroup] = []
        self.capacity: dict[tuple[tuple[str, str], ...], ExpHistogram] = {}  # a group's, by its attributes
        self.lost_s: dict[str, float] = {}
        self.energy_j: float | None = None
        self.cost_lost: dict[str, float] | None = None
        self.currency: str | None = None
        self.has_loss = False
        self.gpus: dict[tuple[tuple[str, str], ...], float] = {}  # a group's fleet.gpus, by its attributes
        self.jobs: dict[str, _JobBuilder] = {}

    def add_loss(self, name: str, unit: str, point: Any) -> None:
        value = _number(point)
        if value < 0:
            raise ValueError(f"{name} is negative: {value!r}")
        self.has_loss = True
        if name == names.FLEET_ENERGY.name:
            self.energy_j = (self.energy_j or 0.0) + value
            return
        cause = _attributes(point.attributes).get(names.OFU_LOSS_CAUSE)
        if cause not in names.OfuLossCause.ALL:
            raise ValueError(f"{name} point without a known {names.OFU_LOSS_CAUSE}: {cause!r}")
        table = self.lost_s
        if name == names.FLEET_COST_LOST.name:
            self.cost_lost = table = self.cost_lost if self.cost_lost is not None else {}
            self.currency = unit.removeprefix("{").removesuffix("}") or None
        table[cause] = table.get(cause, 0.0) + value

    def add_job(self, point: Any) -> None:
        attributes = _attributes(point.attributes)
        job_id = attributes.get(names.JOB_ID)
        field = attributes.get(names.PARTIAL_FIELD)
        if not job_id or not field:
            raise ValueError(f"{names.PARTIAL_JOB.name} point without {names.JOB_ID} or {names.PARTIAL_FIELD}")
        self.jobs.setdefault(job_id, _JobBuilder()).add(field, _number(point), attributes)


def _group_key(attributes: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(attributes.items()))


class _Windows:
    """The partial windows of one request as they are read, by (shard, window end): one reader per kind of point."""

    def __init__(self) -> None:
        self.by_end: dict[tuple[str, int], _PartialBuilder] = {}

    def part_of(self, shard: str, point: Any) -> _PartialBuilder:
        """The shard's window that ends at the point's time (its start: the first point's that has one)."""
        found = self.by_end.setdefault((shard, point.time_unix_nano), _PartialBuilder())
        found.start_ns = found.start_ns or point.start_time_unix_nano
        return found

    def groups(self, shard: str, metric: Any) -> None:
        """fleet.ofu: a group's histogram, counted in observations."""
        name = metric.name
        for point in metric.exponential_histogram.data_points:
            histogram = _histogram(name, point)
            group = PartialGroup(_attributes(point.attributes), histogram, histogram.count)
            self.part_of(shard, point).groups.append(group)

    def capacity(self, shard: str, metric: Any) -> None:
        """A group's OFU counted in GPU capacity."""
        name = metric.name
        for point in metric.exponential_histogram.data_points:
            key = _group_key(_attributes(point.attributes))
            self.part_of(shard, point).capacity[key] = _histogram(name, point)

    def gpus(self, shard: str, metric: Any) -> None:
        """fleet.gpus: a group's GPU equivalents."""
        for number in metric.gauge.data_points:
            gpus = _number(number)
            if gpus < 0:
                raise ValueError(f"{metric.name} is negative: {gpus!r}")
            self.part_of(shard, number).gpus[_group_key(_attributes(number.attributes))] = gpus

    def loss(self, shard: str, metric: Any) -> None:
        """The fleet's loss totals (sums)."""
        name, unit = metric.name, metric.unit
        for number in metric.sum.data_points:
            self.part_of(shard, number).add_loss(name, unit, number)

    def window(self, shard: str, metric: Any) -> None:
        """fleet.partial.window: the window closed, empty or not."""
        for number in metric.gauge.data_points:
            self.part_of(shard, number)

    def jobs(self, shard: str, metric: Any) -> None:
        """job.partial: one field of a job's window."""
        for number in metric.gauge.data_points:
            self.part_of(shard, number).add_job(number)


# The reader of each partial metric, by its name and kind (another kind under one of these names is not read).
_READERS: dict[tuple[str, str | None], Callable[[_Windows, str, Any], None]] = {
    (names.FLEET_OFU.name, "exponential_histogram"): _Windows.groups,
    (names.PARTIAL_FLEET_OFU_CAPACITY.name, "exponential_histogram"): _Windows.capacity,
    (names.FLEET_GPUS.name, "gauge"): _Windows.gpus,
    **{(name, "sum"): _Windows.loss for name in sorted(_FLEET_LOSS_NAMES)},
    (names.PARTIAL_WINDOW.name, "gauge"): _Windows.window,
    (names.PARTIAL_JOB.name, "gauge"): _Windows.jobs,
}


def partials_from_request(request: ExportMetricsServiceRequest) -> list[PartialWindow]:
    """Shards' partial windows in an OTLP request: one per (shard, window end), shard = service.instance.id.

    Raises ValueError for partial state that cannot be used (negative buckets or sums, counts that disagree, a job's
    field twice, non-finite numbers); other metrics in the request are ignored.
    """
    windows = _Windows()
    for resource_metrics in request.resource_metrics:
        resource = _attributes(resource_metrics.resource.attributes)
        shard = resource.get(names.SERVICE_INSTANCE_ID, "")
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                read = _READERS.get((metric.name, metric.WhichOneof("data")))
                if read is not None:
                    read(windows, shard, metric)
    return [_partial(shard, end, part) for (shard, end), part in sorted(windows.by_end.items())]


def _partial(shard: str, end_ns: int, part: _PartialBuilder) -> PartialWindow:
    groups = tuple(
        attrs.evolve(
            group,
            gpus=part.gpus.get(_group_key(group.attributes), group.gpus),
            capacity=part.capacity.get(_group_key(group.attributes)),
        )
        for group in part.groups
    )
    return PartialWindow(
        start_ns=part.start_ns,
        end_ns=end_ns,
        groups=groups,
        shard_id=shard,
        fleet_loss=FleetLoss(part.lost_s, part.energy_j, part.cost_lost, part.currency) if part.has_loss else None,
        jobs={job_id: builder.window() for job_id, builder in sorted(part.jobs.items())},
    )
