"""Window reports as OpenTelemetry SDK MetricsData (the collector's OTLP outputs).

Every point spans its window: start = window start, time = window end (the OTLP encoder keeps the start only
for histograms and sums, so the merge tier identifies a window by its end). A value that is None is not
emitted. In shard mode (``include_partials``) each window carries what the merge tier adds up instead of the job.*
outputs (``otlp.partials``: each group's capacity histogram and each job's window sums): the merge tier computes
every job output once, from every shard the job was on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
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
    Sum,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from otel_ofu import names
from otel_ofu_collector.otlp import partials
from otel_ofu_collector.results import OUTPUT_METRICS, WindowReport, gauge_points
from otel_ofu_collector.stats.exphist import ExpHistogram

Attributes = dict[str, str | float | int]
Span = tuple[int, int]  # a point's (start_time_unix_nano, time_unix_nano)


class _Points:
    """Data points collected per metric, in the contract's order."""

    def __init__(self) -> None:
        self.gauges: dict[str, list[NumberDataPoint]] = {}
        self.specs: dict[str, names.MetricSpec] = {}  # as the points said (a cost metric's unit is its currency)
        self.histograms: list[ExponentialHistogramDataPoint] = []
        self.capacity: list[ExponentialHistogramDataPoint] = []  # a shard's capacity histograms

    def gauge(self, spec: names.MetricSpec, attributes: Attributes, span: Span, value: float | None) -> None:
        if value is None:
            return
        self.specs.setdefault(spec.name, spec)
        self.gauges.setdefault(spec.name, []).append(
            NumberDataPoint(attributes=attributes, start_time_unix_nano=span[0], time_unix_nano=span[1], value=value)
        )


def _histogram_point(attributes: Attributes, span: Span, histogram: ExpHistogram) -> ExponentialHistogramDataPoint:
    return ExponentialHistogramDataPoint(
        attributes=attributes,
        start_time_unix_nano=span[0],
        time_unix_nano=span[1],
        count=histogram.count,
        sum=histogram.sum,
        scale=histogram.scale,
        zero_count=histogram.zero_count,
        positive=Buckets(offset=histogram.offset, bucket_counts=list(histogram.counts)),
        negative=Buckets(offset=0, bucket_counts=[]),
        flags=0,
        # Unknown bounds (a shard's partial sent without them) stay absent, never 0.0: protobuf leaves an
        # optional field given None unset, so the encoded point has no min/max rather than wrong ones.
        min=histogram.min,  # type: ignore[arg-type]
        max=histogram.max,  # type: ignore[arg-type]
    )


def _span(report: WindowReport, include_partials: bool, started_ns: int | None) -> Span:
    """The (start, time) a window's points carry: the window's, where a shard speaks to its merge tier (which knows a
    window by its end); else from this collector's start (``started_ns``) at the earliest to the time a clean stop
    closed it early at the latest, so that a restart's two parts of one window are two points, not one point twice."""
    if include_partials:
        return report.start_ns, report.end_ns
    start = report.start_ns if started_ns is None or started_ns <= report.start_ns else min(started_ns, report.end_ns)
    end = report.end_ns if report.closed_at_ns is None else max(start, report.closed_at_ns)
    return start, end


def _collect(points: _Points, report: WindowReport, include_partials: bool, started_ns: int | None) -> None:
    span = _span(report, include_partials, started_ns)
    for group in report.groups:
        attributes: Attributes = {**group.attributes}
        points.histograms.append(_histogram_point(attributes, span, group.histogram))
        if include_partials and group.capacity is not None:
            points.capacity.append(_histogram_point(attributes, span, group.capacity))
    for point in gauge_points(report):
        if include_partials and point.spec.name in _JOB_OUTPUTS:
            continue  # the merge tier's to compute, from every shard's part
        points.gauge(point.spec, dict(point.attributes), span, point.value)
    if include_partials:
        points.gauge(names.PARTIAL_WINDOW, {}, span, 1.0)
        for job_id, part in report.job_parts.items():
            for job_attributes, value in partials.job_points(job_id, part):
                points.gauge(names.PARTIAL_JOB, {**job_attributes}, span, value)


# What a shard leaves to its merge tier: every per-job output (gpu.straggler, a GPU's, stays the shard's).
_JOB_OUTPUTS = frozenset(spec.name for spec in OUTPUT_METRICS if spec.name.startswith("job."))


def reports_to_metrics_data(
    reports: Sequence[WindowReport],
    *,
    resource_attributes: Mapping[str, str | int],
    include_partials: bool,
    started_ns: int | None = None,
) -> MetricsData:
    """One ResourceMetrics holding every window's outputs as points.

    ``resource_attributes`` (the user's, and the service's service.instance.id) describe the resource;
    its service.name is always the collector's, whatever they say. ``started_ns``: when this collector started
    (``_span``).
    """
    points = _Points()
    for report in reports:
        _collect(points, report, include_partials, started_ns)
    metrics: list[Metric] = []
    for spec, histograms in ((names.FLEET_OFU, points.histograms), (names.PARTIAL_FLEET_OFU_CAPACITY, points.capacity)):
        if histograms:
            data = ExponentialHistogram(histograms, AggregationTemporality.DELTA)
            metrics.append(Metric(spec.name, spec.description, spec.unit, data))
    specs = [*OUTPUT_METRICS, *(names.COLLECTOR_PARTIAL_METRICS if include_partials else ())]
    for spec in specs:
        if spec.name in points.gauges:
            spec = points.specs[spec.name]
            data_points = points.gauges[spec.name]
            # The loss sums are the window's deltas (GPU-seconds, joules, cost: never negative).
            values: Gauge | Sum = (
                Sum(data_points, AggregationTemporality.DELTA, is_monotonic=True)
                if spec.kind == "sum"
                else Gauge(data_points)
            )
            metrics.append(Metric(spec.name, spec.description, spec.unit, values))
    # The schema URL names the semantic conventions the resource follows (service.*, k8s.*, hw.* on GPU flags).
    resource = Resource({**resource_attributes, names.SERVICE_NAME: names.COLLECTOR_SERVICE_NAME}, names.SCHEMA_URL)
    scope = InstrumentationScope(names.COLLECTOR_INSTRUMENTATION_SCOPE, schema_url=names.SCHEMA_URL)
    scope_metrics = [ScopeMetrics(scope, metrics, "")] if metrics else []
    return MetricsData([ResourceMetrics(resource, scope_metrics, "")])


def encode_request(metrics_data: MetricsData) -> bytes:
    """The SDK's own OTLP encoding of ``metrics_data``, serialized."""
    return bytes(encode_metrics(metrics_data).SerializeToString())
