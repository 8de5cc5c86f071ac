"""Window reports as OpenTelemetry SDK MetricsData (the DESIGN.md collector outputs), and shards' partial
state read back from OTLP for the merge tier.

Every point spans its window: start = window start, time = window end (the OTLP encoder keeps the start only
for histograms and sums, so the merge tier identifies a window by its end). A value that is None is not
emitted. In shard mode (``include_partials``) each window also carries the fleet co-moments as gauges
(names.COLLECTOR_PARTIAL_METRICS); with the ``fleet.ofu`` histograms they are all the merge tier needs.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Buckets,
    ExponentialHistogram,
    ExponentialHistogramDataPoint,
    Gauge,
    Metric,
    MetricsData,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from otel_ofu import names
from otel_ofu_collector.aggregation.comoments import CoMoments
from otel_ofu_collector.aggregation.exphist import ExpHistogram
from otel_ofu_collector.aggregation.merge import PartialGroup, PartialWindow
from otel_ofu_collector.aggregation.windows import JobReport, WindowReport

# What partials_from_request reads: the merge tier consumes these from shards instead of forwarding them.
_PARTIAL_NAMES = frozenset([names.FLEET_OFU.name, *(spec.name for spec in names.COLLECTOR_PARTIAL_METRICS)])
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


Attributes = dict[str, str | float | int]


class _Points:
    """Data points collected per metric, in the contract's order."""

    def __init__(self) -> None:
        self.gauges: dict[str, list[NumberDataPoint]] = {}
        self.histograms: list[ExponentialHistogramDataPoint] = []

    def gauge(self, spec: names.MetricSpec, attributes: Attributes, report: WindowReport, value: float | None) -> None:
        if value is None:
            return
        self.gauges.setdefault(spec.name, []).append(
            NumberDataPoint(
                attributes=attributes, start_time_unix_nano=report.start_ns, time_unix_nano=report.end_ns, value=value
            )
        )


def _histogram_point(
    attributes: Attributes, report: WindowReport, histogram: ExpHistogram
) -> ExponentialHistogramDataPoint:
    return ExponentialHistogramDataPoint(
        attributes=attributes,
        start_time_unix_nano=report.start_ns,
        time_unix_nano=report.end_ns,
        count=histogram.count,
        sum=histogram.sum,
        scale=histogram.scale,
        zero_count=histogram.zero_count,
        positive=Buckets(offset=histogram.offset, bucket_counts=list(histogram.counts)),
        negative=Buckets(offset=0, bucket_counts=[]),
        flags=0,
        min=histogram.min if histogram.min is not None else 0.0,
        max=histogram.max if histogram.max is not None else 0.0,
    )


def _job_attributes(job: JobReport) -> Attributes:
    return {names.JOB_ID: job.job_id, **job.attributes}


def _collect(points: _Points, report: WindowReport, include_partials: bool) -> None:
    for group in report.groups:
        attributes: Attributes = dict(group.attributes)
        points.histograms.append(_histogram_point(attributes, report, group.histogram))
        for q, value in group.quantiles.items():
            points.gauge(names.FLEET_OFU_QUANTILE, {**attributes, names.QUANTILE: q}, report, value)
        points.gauge(names.FLEET_GPUS, attributes, report, group.gpus)
    for job in report.jobs:
        attributes = _job_attributes(job)
        points.gauge(names.JOB_OFU, attributes, report, job.ofu)
        points.gauge(names.JOB_OFU_MFU_GAP, attributes, report, job.gap)
        points.gauge(names.JOB_OFU_MFU_CORRELATION, attributes, report, job.correlation)
        points.gauge(names.JOB_FLOPS_MISCOUNT, attributes, report, job.flops_miscount)
        points.gauge(names.JOB_OFU_REGRESSION, attributes, report, job.regression)
    fleet = report.fleet
    points.gauge(names.FLEET_OFU_MFU_CORRELATION, {}, report, fleet.correlation)
    points.gauge(names.FLEET_OFU_MFU_MAE, {}, report, fleet.mae)
    if include_partials:
        c = fleet.comoments
        points.gauge(names.PARTIAL_FLEET_JOBS, {}, report, c.n)
        points.gauge(names.PARTIAL_FLEET_MEAN_OFU, {}, report, c.mean_x)
        points.gauge(names.PARTIAL_FLEET_MEAN_MFU, {}, report, c.mean_y)
        points.gauge(names.PARTIAL_FLEET_M2_OFU, {}, report, c.m2_x)
        points.gauge(names.PARTIAL_FLEET_M2_MFU, {}, report, c.m2_y)
        points.gauge(names.PARTIAL_FLEET_C_OFU_MFU, {}, report, c.c_xy)
        points.gauge(names.PARTIAL_FLEET_ABS_DIFF_SUM, {}, report, fleet.abs_diff_sum)


def reports_to_metrics_data(
    reports: Sequence[WindowReport], *, resource_attributes: Mapping[str, str | int], include_partials: bool
) -> MetricsData:
    """One ResourceMetrics holding every window's outputs as points.

    ``resource_attributes`` (the user's, and the service's service.instance.id) describe the resource;
    its service.name is always the collector's, whatever they say.
    """
    points = _Points()
    for report in reports:
        _collect(points, report, include_partials)
    metrics: list[Metric] = []
    if points.histograms:
        spec = names.FLEET_OFU
        data = ExponentialHistogram(points.histograms, AggregationTemporality.DELTA)
        metrics.append(Metric(spec.name, spec.description, spec.unit, data))
    specs = [*names.COLLECTOR_METRICS, *(names.COLLECTOR_PARTIAL_METRICS if include_partials else ())]
    for spec in specs:
        if spec.name in points.gauges:
            metrics.append(Metric(spec.name, spec.description, spec.unit, Gauge(points.gauges[spec.name])))
    resource = Resource({**resource_attributes, names.SERVICE_NAME: names.COLLECTOR_SERVICE_NAME})
    scope = InstrumentationScope(names.COLLECTOR_INSTRUMENTATION_SCOPE)
    scope_metrics = [ScopeMetrics(scope, metrics, "")] if metrics else []
    return MetricsData([ResourceMetrics(resource, scope_metrics, "")])


# --- reading shards' partial state back ------------------------------------------------------------------


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
    return PartialWindow(
        start_ns=part.start_ns,
        end_ns=end_ns,
        groups=tuple(part.groups),
        fleet_comoments=comoments,
        abs_diff_sum=abs_diff_sum,
        jobs_count=jobs,
        shard_id=shard,
    )
