"""One scrape of a Prometheus page as the OpenTelemetry Collector's Prometheus receiver (v0.161.0) sends it over OTLP,
for the collector's tests and benchmarks that run no Collector binary (tests/e2e runs the real receiver on the same
pages).

As the receiver builds it (receiver/prometheusreceiver/internal: prom_to_otlp.go ``CreateResource``, transaction.go,
metricfamily.go): one ResourceMetrics per scrape target, its Resource ``service.name`` (the scrape job),
``service.instance.id`` (the target's ``host:port``), ``server.address``, ``server.port`` and ``url.scheme``; one
ScopeMetrics named after the receiver; each family a metric of the page's name (a ``gauge`` or untyped family a
gauge, a ``counter`` a cumulative monotonic sum), each series a data point with its labels as string attributes,
stamped with the scrape's time; and the scrape's own ``up`` gauge beside them.
"""

from __future__ import annotations

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.metrics.v1 import metrics_pb2
from prometheus_client.parser import text_string_to_metric_families

SCOPE_NAME = "github.com/open-telemetry/opentelemetry-collector-contrib/receiver/prometheusreceiver"
SCOPE_VERSION = "0.161.0"


def scrape_request(
    page: str, *, time_ns: int, instance: str = "10.0.0.7:9400", job: str = "dcgm-exporter", start_ns: int = 0
) -> ExportMetricsServiceRequest:
    """The request carrying one scrape of ``page`` at ``time_ns`` (a counter's start time is ``start_ns``)."""
    request = ExportMetricsServiceRequest()
    add_scrape(request, page, time_ns=time_ns, instance=instance, job=job, start_ns=start_ns)
    return request


def add_scrape(
    request: ExportMetricsServiceRequest,
    page: str,
    *,
    time_ns: int,
    instance: str = "10.0.0.7:9400",
    job: str = "dcgm-exporter",
    start_ns: int = 0,
) -> metrics_pb2.ResourceMetrics:
    """Append one scrape's ResourceMetrics to ``request``."""
    time_ns = time_ns // 1_000_000 * 1_000_000  # Prometheus scrape times are in milliseconds
    rm = request.resource_metrics.add()
    host, _, port = instance.rpartition(":")
    for key, value in (
        ("service.name", job),
        ("server.address", host),
        ("service.instance.id", instance),
        ("server.port", port),
        ("url.scheme", "http"),
    ):
        attribute = rm.resource.attributes.add()
        attribute.key = key
        attribute.value.string_value = value
    sm = rm.scope_metrics.add()
    sm.scope.name = SCOPE_NAME
    sm.scope.version = SCOPE_VERSION
    for family in text_string_to_metric_families(page):
        metric = sm.metrics.add()
        metric.name = family.name
        metric.description = family.documentation
        if family.type == "counter":
            metric.sum.aggregation_temporality = metrics_pb2.AGGREGATION_TEMPORALITY_CUMULATIVE
            metric.sum.is_monotonic = True
            points = metric.sum.data_points
        else:
            points = metric.gauge.data_points
        for sample in family.samples:
            point = points.add()
            point.time_unix_nano = time_ns
            if family.type == "counter":
                point.start_time_unix_nano = start_ns or time_ns
            point.as_double = sample.value
            for key, value in sample.labels.items():
                if not value:
                    continue  # Prometheus drops a label with an empty value (pod="" is no label)
                attribute = point.attributes.add()
                attribute.key = key
                attribute.value.string_value = value
    up = sm.metrics.add()
    up.name = "up"
    point = up.gauge.data_points.add()
    point.time_unix_nano = time_ns
    point.as_double = 1.0
    return rm
