"""The collector's self-metrics sent to its OTLP downstream, as the OpenTelemetry Collector's internal
telemetry is: accepted and rejected points (by reason), evictions, queue depth, export failures, spool size.

Each part of the collector that counts what it did says so itself: it implements ``SelfMetrics`` (one method,
its points by metric name), and ``CollectorService`` asks each part in a list and ``gathered`` puts the answers
together (the Prometheus endpoint shows the same mapping).

``CollectorService`` sends them with every batch of closed windows (about once per window) and once at
shutdown, by a sender of their own on the same downstream, so they reach wherever the outputs go even
where nobody scrapes the Prometheus endpoint. Counters are cumulative monotonic sums since the service
started; the rest gauges. The resource is the outputs' own (service.name=otel-ofu-collector, the replica's
service.instance.id).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol, TypeAlias, runtime_checkable

import attrs
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.metrics.v1 import metrics_pb2

from otel_ofu import names
from otel_ofu_collector.outputs.delivery import Delivery

_SPECS: Mapping[str, names.MetricSpec] = {spec.name: spec for spec in names.COLLECTOR_SELF_METRICS}
_ORDER: Mapping[str, int] = {spec.name: index for index, spec in enumerate(names.COLLECTOR_SELF_METRICS)}

# One self-metric's value: a number, or numbers by attribute value (``names.COLLECTOR_SELF_METRIC_KEYS`` names the
# attribute; "reason" where it names none).
SelfMetricValue: TypeAlias = int | float | Mapping[str, int | float]


@runtime_checkable  # a window consumer may count something too (the records file: the windows it left out)
class SelfMetrics(Protocol):
    """A part of the collector that counts what it did: ``self_metrics`` gives its points by metric name
    (``names.COLLECTOR_SELF_METRICS``). Parts may share a metric, each with attribute values of its own (the
    drop counts of each stream) or adding to another's (two records files)."""

    def self_metrics(self) -> Mapping[str, SelfMetricValue]: ...


def gathered(parts: Iterable[SelfMetrics], shown: Iterable[str] = ()) -> dict[str, Any]:
    """Every part's points in one mapping, in the vocabulary's order; where parts give the same metric (and the
    same attribute value), their numbers add up. The ``shown`` metrics are there, empty, when no part gave them."""
    found: dict[str, Any] = {name: {} for name in shown}
    for part in parts:
        for name, value in part.self_metrics().items():
            if isinstance(value, Mapping):
                into = found.setdefault(name, {})
                for label, number in value.items():
                    into[label] = into.get(label, 0) + number
            else:
                found[name] = found.get(name, 0) + value
    return {name: found[name] for name in sorted(found, key=lambda name: _ORDER.get(name, len(_ORDER)))}


def _attribute(attributes: Any, key: str, value: str) -> None:
    kv = attributes.add()
    kv.key = key
    kv.value.string_value = value


def self_metrics_request(
    values: Mapping[str, Any], resource_attributes: Mapping[str, str], start_ns: int, now_ns: int
) -> ExportMetricsServiceRequest:
    """``values`` (``gathered``: a number, or numbers by attribute value) as OTLP."""
    request = ExportMetricsServiceRequest()
    rm = request.resource_metrics.add(schema_url=names.SCHEMA_URL)
    for key, value in {**resource_attributes, names.SERVICE_NAME: names.COLLECTOR_SERVICE_NAME}.items():
        _attribute(rm.resource.attributes, key, str(value))
    sm = rm.scope_metrics.add(schema_url=names.SCHEMA_URL)
    sm.scope.name = names.COLLECTOR_INSTRUMENTATION_SCOPE
    for name, value in values.items():
        spec = _SPECS.get(name)
        if spec is None:
            continue
        metric = sm.metrics.add(name=spec.name, description=spec.description, unit=spec.unit)
        points: Any
        if spec.kind == "sum":
            metric.sum.aggregation_temporality = metrics_pb2.AGGREGATION_TEMPORALITY_CUMULATIVE
            metric.sum.is_monotonic = True
            points = metric.sum.data_points
        else:
            points = metric.gauge.data_points
        key = names.COLLECTOR_SELF_METRIC_KEYS.get(name, "reason")
        items = value.items() if isinstance(value, Mapping) else [(None, value)]
        for label, number in items:
            point = points.add(time_unix_nano=now_ns)
            if spec.kind == "sum":
                point.start_time_unix_nano = start_ns
            if isinstance(number, int):
                point.as_int = number
            else:
                point.as_double = float(number)
            if label is not None:
                _attribute(point.attributes, key, str(label))
        if not points:
            del sm.metrics[-1]
    return request


@attrs.define
class SelfTelemetry:
    """Queues the self-metrics on ``delivery`` (a small queue of their own), timestamped by ``clock``."""

    delivery: Delivery
    resource_attributes: Mapping[str, str]
    clock: Callable[[], int]
    start_ns: int = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.start_ns = self.clock()

    def send(self, values: Mapping[str, Any]) -> None:
        if len(self.delivery.queue):
            return  # one snapshot waits already (the downstream is slow or down): the next flush sends a newer one
        request = self_metrics_request(values, self.resource_attributes, self.start_ns, self.clock())
        self.delivery.submit(request.SerializeToString())
