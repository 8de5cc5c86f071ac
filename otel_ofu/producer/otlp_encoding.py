"""The OTLP request for one export, as the SDK's encoder builds it, with each gauge point's start time kept.

The SDK's ``encode_metrics`` re-encodes every resource's and scope's attributes on every export and builds
each point through keyword plumbing; a producer's resources (one per GPU) and scopes hardly ever change.
This encoder produces the very same ``ExportMetricsServiceRequest`` (field for field, in the same order,
with the same merging of equal resources and scopes) from cached resource and scope encodings. It takes
gauges and sums of number points without exemplars, which is all the producer sends; anything else goes
through the SDK's encoder.
"""

from __future__ import annotations

import weakref

from opentelemetry.exporter.otlp.proto.common._internal import _encode_attributes
from opentelemetry.exporter.otlp.proto.common._internal.metrics_encoder import encode_metrics
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import InstrumentationScope as PbScope
from opentelemetry.proto.common.v1.common_pb2 import KeyValue
from opentelemetry.proto.metrics.v1 import metrics_pb2 as pb
from opentelemetry.proto.resource.v1.resource_pb2 import Resource as PbResource
from opentelemetry.sdk.metrics.export import Gauge, Metric, MetricsData, NumberDataPoint, Sum
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.util.types import Attributes

# Resources and scopes are immutable: a resource's encoding is kept, by identity (comparing two
# resources compares all their attributes), for as long as the resource lives.
_RESOURCES: dict[int, tuple[weakref.ref[Resource], PbResource]] = {}
_SCOPES: dict[InstrumentationScope, PbScope] = {}
# Point attribute sets repeat every export (a throttle reason, a GPU's identity); keyed by their items.
_POINT_ATTRIBUTES: dict[tuple[object, ...], list[KeyValue]] = {}
_CACHE_LIMIT = 4096  # attribute sets come and go with jobs; never grow without bound


class _Unsupported(Exception):
    """Data this encoder does not take (histograms, exemplars, ...): the SDK's encoder does."""


def encode_with_intervals(data: MetricsData) -> ExportMetricsServiceRequest:
    """``encode_metrics(data)`` with gauge points' start times set; the same request, built faster."""
    try:
        return _encode(data)
    except Exception:  # _Unsupported, or a bad value: the SDK's encoder, with its own error, decides
        return _sdk_with_intervals(data)


def _sdk_with_intervals(data: MetricsData) -> ExportMetricsServiceRequest:
    """The SDK's encoding, then each gauge point's start time, walking the two trees side by side;
    should they ever not line up, the request goes as the SDK encoded it."""
    request = encode_metrics(data)
    if len(request.resource_metrics) != len(data.resource_metrics):
        return request
    for rm_pb, rm in zip(request.resource_metrics, data.resource_metrics, strict=True):
        if len(rm_pb.scope_metrics) != len(rm.scope_metrics):
            continue
        for sm_pb, sm in zip(rm_pb.scope_metrics, rm.scope_metrics, strict=True):
            for metric_pb, metric in zip(sm_pb.metrics, sm.metrics, strict=False):
                if isinstance(metric.data, Gauge):
                    for point_pb, point in zip(metric_pb.gauge.data_points, metric.data.data_points, strict=False):
                        if point.start_time_unix_nano:
                            point_pb.start_time_unix_nano = point.start_time_unix_nano
    return request


def _encode(data: MetricsData) -> ExportMetricsServiceRequest:
    # As the SDK: resources merged by equality (a later equal one replaces the earlier one's scopes, in
    # the earlier one's place), scopes merged likewise within a resource.
    by_resource: dict[Resource, dict[InstrumentationScope, list[Metric]]] = {}
    for resource_metrics in data.resource_metrics:
        scopes: dict[InstrumentationScope, list[Metric]] = {}
        by_resource[resource_metrics.resource] = scopes
        for scope_metrics in resource_metrics.scope_metrics:
            scopes[scope_metrics.scope] = list(scope_metrics.metrics)
        if len(scopes) != len(resource_metrics.scope_metrics):
            raise _Unsupported  # merged scopes: the SDK's encoding (and no start times there)
    if len(by_resource) != len(data.resource_metrics):
        raise _Unsupported  # merged resources: the SDK's encoding (and no start times)
    request = ExportMetricsServiceRequest()
    add_resource = request.resource_metrics.add
    for resource, scopes in by_resource.items():
        rm_pb = add_resource(resource=_resource(resource), schema_url=resource.schema_url)
        add_scope = rm_pb.scope_metrics.add
        for scope, metrics in scopes.items():
            sm_pb = add_scope(scope=_scope(scope), schema_url=scope.schema_url)
            add_metric = sm_pb.metrics.add
            for metric in metrics:
                _metric(metric, add_metric(name=metric.name, description=metric.description, unit=metric.unit))
    return request


def _metric(metric: Metric, metric_pb: pb.Metric) -> None:
    data = metric.data
    if isinstance(data, Gauge):
        add = metric_pb.gauge.data_points.add
    elif isinstance(data, Sum):
        metric_pb.sum.aggregation_temporality = data.aggregation_temporality  # type: ignore[assignment]
        metric_pb.sum.is_monotonic = data.is_monotonic
        add = metric_pb.sum.data_points.add
    else:
        raise _Unsupported
    for point in data.data_points:
        if not isinstance(point, NumberDataPoint) or point.exemplars:
            raise _Unsupported
        value = point.value
        point_pb = add(attributes=_attributes(point.attributes)) if point.attributes else add()
        # The SDK leaves a gauge's start out; a sample's start is what tells an average from a point sample.
        point_pb.start_time_unix_nano = point.start_time_unix_nano
        point_pb.time_unix_nano = point.time_unix_nano
        if isinstance(value, int):
            point_pb.as_int = value
        else:
            point_pb.as_double = value


def _resource(resource: Resource) -> PbResource:
    key = id(resource)
    entry = _RESOURCES.get(key)
    if entry is not None and entry[0]() is resource:
        return entry[1]
    encoded = PbResource(attributes=_encode_attributes(resource.attributes))
    _RESOURCES[key] = (weakref.ref(resource, lambda ref: _forget(key, ref)), encoded)
    return encoded


def _forget(key: int, ref: weakref.ref[Resource]) -> None:
    """A cached resource is gone: its entry goes too (unless its id already holds a newer one)."""
    entry = _RESOURCES.get(key)
    if entry is not None and entry[0] is ref:
        del _RESOURCES[key]


def _scope(scope: InstrumentationScope) -> PbScope:
    if scope.attributes:  # a scope's equality leaves its attributes out: only attribute-less ones are kept
        return PbScope(name=scope.name, version=scope.version or "", attributes=_encode_attributes(scope.attributes))
    encoded = _SCOPES.get(scope)
    if encoded is None:
        if len(_SCOPES) > _CACHE_LIMIT:
            _SCOPES.clear()
        encoded = _SCOPES[scope] = PbScope(name=scope.name, version=scope.version or "")
    return encoded


def _attributes(attributes: Attributes) -> list[KeyValue]:
    assert attributes is not None
    try:
        # With the values' types: 1, 1.0 and True are equal keys but different encodings.
        key = (*attributes.items(), *map(type, attributes.values()))
        encoded = _POINT_ATTRIBUTES.get(key)
    except TypeError:  # an unhashable value (a list): encoded each time
        return _encode_attributes(attributes)
    if encoded is None:
        if len(_POINT_ATTRIBUTES) > _CACHE_LIMIT:
            _POINT_ATTRIBUTES.clear()
        encoded = _POINT_ATTRIBUTES[key] = _encode_attributes(attributes)
    return encoded
