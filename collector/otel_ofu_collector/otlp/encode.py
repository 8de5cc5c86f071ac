"""Window reports as OpenTelemetry SDK MetricsData (the collector's OTLP outputs).

Every point spans its window: start = window start, time = window end (the OTLP encoder keeps the start only
for histograms and sums, so the merge tier identifies a window by its end). A value that is None is not
emitted. In shard mode (``include_partials``) each window also carries the fleet co-moments as gauges
(names.COLLECTOR_PARTIAL_METRICS, from ``otlp.partials``); with the ``fleet.ofu`` histograms they are all
the merge tier needs.
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


class _Points:
    """Data points collected per metric, in the contract's order."""

    def __init__(self) -> None:
        self.gauges: dict[str, list[NumberDataPoint]] = {}
        self.specs: dict[str, names.MetricSpec] = {}  # as the points said (a cost metric's unit is its currency)
        self.histograms: list[ExponentialHistogramDataPoint] = []

    def gauge(self, spec: names.MetricSpec, attributes: Attributes, report: WindowReport, value: float | None) -> None:
        if value is None:
            return
        self.specs.setdefault(spec.name, spec)
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
        # Unknown bounds (a shard's partial sent without them) stay absent, never 0.0: protobuf leaves an
        # optional field given None unset, so the encoded point has no min/max rather than wrong ones.
        min=histogram.min,  # type: ignore[arg-type]
        max=histogram.max,  # type: ignore[arg-type]
    )


def _collect(points: _Points, report: WindowReport, include_partials: bool) -> None:
    for group in report.groups:
        points.histograms.append(_histogram_point(dict(group.attributes), report, group.histogram))
    for point in gauge_points(report):
        points.gauge(point.spec, dict(point.attributes), report, point.value)
    if include_partials:
        for spec, value in partials.fleet_state_gauges(report.fleet):
            points.gauge(spec, {}, report, value)


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
