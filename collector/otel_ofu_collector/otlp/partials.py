"""Shards' partial window state over OTLP, both ways: the gauges a shard adds, and reading them back.

A shard (``--mode shard``) exports, besides its window outputs, the fleet co-moments and |OFU - MFU| sum
as gauges (``names.COLLECTOR_PARTIAL_METRICS``); with the ``fleet.ofu`` histograms they are all a merge
tier needs to compute fleet-wide windows. The fleet's loss totals (``fleet.gpu_time.lost``, ``fleet.energy``,
``fleet.cost.lost``) are sums already: the merge tier reads the shards' and adds them.
``encode`` writes the gauges from ``fleet_state_gauges``; the
merge tier's ``Decoder`` reads requests back with ``partials_from_request``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import attrs
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from otel_ofu import names
from otel_ofu_collector.results import FleetLoss, FleetReport, PartialGroup, PartialWindow
from otel_ofu_collector.stats.comoments import CoMoments
from otel_ofu_collector.stats.exphist import ExpHistogram

_FLEET_LOSS_NAMES = frozenset(
    spec.name for spec in (names.FLEET_GPU_TIME_LOST, names.FLEET_ENERGY, names.FLEET_COST_LOST)
)
# What partials_from_request reads: the merge tier consumes these from shards instead of forwarding them. A group's
# fleet.gpus (GPU equivalents) is read beside its histogram, whose count is observations: they differ where a
# group has MIG slices, each one observation and its share of a GPU.
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
    for spec in (names.FLEET_OFU_QUANTILE, names.FLEET_GPUS, names.FLEET_OFU_MFU_CORRELATION, names.FLEET_OFU_MFU_MAE)
)


def is_partial_metric(name: str) -> bool:
    """True for the metrics a merge-tier collector reads from shards (``fleet.ofu`` and the partial gauges)."""
    return name in _PARTIAL_NAMES


def is_merge_recomputed_metric(name: str) -> bool:
    """True for the shard-local fleet gauges a merge tier should drop: it emits fleet-wide ones instead."""
    return name in _MERGE_RECOMPUTED_NAMES


def fleet_state_gauges(fleet: FleetReport) -> list[tuple[names.MetricSpec, float]]:
    """A shard's mergeable fleet state as (partial gauge, value), in ``names.COLLECTOR_PARTIAL_METRICS`` order."""
    c = fleet.comoments
    return [
        (names.PARTIAL_FLEET_JOBS, c.n),
        (names.PARTIAL_FLEET_MEAN_OFU, c.mean_x),
        (names.PARTIAL_FLEET_MEAN_MFU, c.mean_y),
        (names.PARTIAL_FLEET_M2_OFU, c.m2_x),
        (names.PARTIAL_FLEET_M2_MFU, c.m2_y),
        (names.PARTIAL_FLEET_C_OFU_MFU, c.c_xy),
        (names.PARTIAL_FLEET_ABS_DIFF_SUM, fleet.abs_diff_sum),
    ]


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
    raise ValueError(f"attribute value of kind {kind!r} cannot name a group or shard")


def _attributes(key_values: Iterable[Any]) -> dict[str, str]:
    return {kv.key: _any_value_text(kv.value) for kv in key_values}


def _finite(name: str, value: float) -> float:
    if not math.isfinite(value):
        raise ValueError(f"{name} is not finite: {value!r}")
    return float(value)


def _histogram(point: Any) -> ExpHistogram:
    if any(point.negative.bucket_counts):
        raise ValueError("fleet.ofu histogram has negative buckets: OFU is never negative")
    histogram = ExpHistogram(
        scale=point.scale,
        zero_count=point.zero_count,
        offset=point.positive.offset,
        counts=tuple(point.positive.bucket_counts),
        sum=_finite("fleet.ofu sum", point.sum),
        min=_finite("fleet.ofu min", point.min) if point.HasField("min") else None,
        max=_finite("fleet.ofu max", point.max) if point.HasField("max") else None,
    )
    if histogram.count != point.count:
        raise ValueError(f"fleet.ofu count {point.count} differs from its buckets' total {histogram.count}")
    if histogram.count == 0:  # an empty window carries no bounds; the SDK point writes 0.0 for them
        histogram = ExpHistogram(sum=histogram.sum)
    return histogram.normalized()


def _number(point: Any) -> float:
    kind = point.WhichOneof("value")
    if kind == "as_double":
        return _finite("partial gauge", point.as_double)
    if kind == "as_int":
        return float(point.as_int)
    raise ValueError("partial gauge point without a value")


class _PartialBuilder:
    def __init__(self) -> None:
        self.start_ns = 0
        self.groups: list[PartialGroup] = []
        self.gauges: dict[str, float] = {}
        self.lost_s: dict[str, float] = {}
        self.energy_j: float | None = None
        self.cost_lost: dict[str, float] | None = None
        self.currency: str | None = None
        self.has_loss = False
        self.gpus: dict[tuple[tuple[str, str], ...], float] = {}  # a group's fleet.gpus, by its attributes

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


def _group_key(attributes: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(attributes.items()))


def partials_from_request(request: ExportMetricsServiceRequest) -> list[PartialWindow]:
    """Shards' partial windows in an OTLP request: one per (shard, window end), shard = service.instance.id.

    Raises ValueError for partial state that cannot be used (negative buckets, counts that disagree, a
    fleet state with gauges missing, non-finite numbers); other metrics in the request are ignored.
    """
    partials: dict[tuple[str, int], _PartialBuilder] = {}
    partial_gauges = {spec.name for spec in names.COLLECTOR_PARTIAL_METRICS}
    for resource_metrics in request.resource_metrics:
        resource = _attributes(resource_metrics.resource.attributes)
        shard = resource.get(names.SERVICE_INSTANCE_ID, "")
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                if metric.name == names.FLEET_OFU.name and metric.WhichOneof("data") == "exponential_histogram":
                    for point in metric.exponential_histogram.data_points:
                        part = partials.setdefault((shard, point.time_unix_nano), _PartialBuilder())
                        part.start_ns = part.start_ns or point.start_time_unix_nano
                        histogram = _histogram(point)
                        part.groups.append(PartialGroup(_attributes(point.attributes), histogram, histogram.count))
                elif metric.name == names.FLEET_GPUS.name and metric.WhichOneof("data") == "gauge":
                    for number in metric.gauge.data_points:
                        part = partials.setdefault((shard, number.time_unix_nano), _PartialBuilder())
                        gpus = _number(number)
                        if gpus < 0:
                            raise ValueError(f"{metric.name} is negative: {gpus!r}")
                        part.gpus[_group_key(_attributes(number.attributes))] = gpus
                elif metric.name in _FLEET_LOSS_NAMES and metric.WhichOneof("data") == "sum":
                    for number in metric.sum.data_points:
                        part = partials.setdefault((shard, number.time_unix_nano), _PartialBuilder())
                        part.start_ns = part.start_ns or number.start_time_unix_nano
                        part.add_loss(metric.name, metric.unit, number)
                elif metric.name in partial_gauges and metric.WhichOneof("data") == "gauge":
                    for number in metric.gauge.data_points:
                        part = partials.setdefault((shard, number.time_unix_nano), _PartialBuilder())
                        part.start_ns = part.start_ns or number.start_time_unix_nano
                        part.gauges[metric.name] = _number(number)
    return [_partial(shard, end, part) for (shard, end), part in sorted(partials.items())]


def _partial(shard: str, end_ns: int, part: _PartialBuilder) -> PartialWindow:
    comoments: CoMoments | None = None
    abs_diff_sum = 0.0
    jobs = 0
    if part.gauges:
        missing = [spec.name for spec in names.COLLECTOR_PARTIAL_METRICS if spec.name not in part.gauges]
        if missing:
            raise ValueError(f"partial fleet state of window ending {end_ns} lacks {', '.join(missing)}")
        g = part.gauges
        jobs_value = g[names.PARTIAL_FLEET_JOBS.name]
        if jobs_value < 0 or jobs_value != int(jobs_value):
            raise ValueError(f"partial job count {jobs_value!r} is not a count")
        jobs = int(jobs_value)
        comoments = CoMoments(
            n=jobs,
            mean_x=g[names.PARTIAL_FLEET_MEAN_OFU.name],
            mean_y=g[names.PARTIAL_FLEET_MEAN_MFU.name],
            m2_x=g[names.PARTIAL_FLEET_M2_OFU.name],
            m2_y=g[names.PARTIAL_FLEET_M2_MFU.name],
            c_xy=g[names.PARTIAL_FLEET_C_OFU_MFU.name],
        )
        abs_diff_sum = g[names.PARTIAL_FLEET_ABS_DIFF_SUM.name]
    groups = tuple(
        attrs.evolve(group, gpus=part.gpus.get(_group_key(group.attributes), group.gpus)) for group in part.groups
    )
    return PartialWindow(
        start_ns=part.start_ns,
        end_ns=end_ns,
        groups=groups,
        fleet_comoments=comoments,
        abs_diff_sum=abs_diff_sum,
        jobs_count=jobs,
        shard_id=shard,
        fleet_loss=FleetLoss(part.lost_s, part.energy_j, part.cost_lost, part.currency) if part.has_loss else None,
    )
