"""The OTLP request for one export, in the protobuf wire format, with each gauge point's start time kept.

The request is the one the SDK's ``encode_metrics`` builds (field for field, in the same order, with the same
merging of equal resources and scopes), plus the gauges' start times, which the SDK leaves out: a sample's start
is what tells an average over the interval from a point sample. It is written straight to bytes, the bytes the
exporter sends: resources, scopes, metric headers and point attribute sets from cached encodings, with no
Python call per field of every point. It takes gauges and sums of number points without exemplars, which is
all the producer sends; anything else (histograms, exemplars, merged resources) goes through the SDK's public
encoder. Everything here is public OpenTelemetry API: the SDK's data classes and the generated protobuf
messages.
"""

from __future__ import annotations

import logging
import struct
import weakref
from collections.abc import Mapping, Sequence

from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue, KeyValueList
from opentelemetry.proto.common.v1.common_pb2 import InstrumentationScope as PbScope
from opentelemetry.proto.resource.v1.resource_pb2 import Resource as PbResource
from opentelemetry.sdk.metrics.export import Gauge, Metric, MetricsData, NumberDataPoint, Sum
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.util.types import Attributes

log = logging.getLogger(__name__)

# Resources and scopes are immutable: a resource's encoding is kept, by identity (comparing two
# resources compares all their attributes), for as long as the resource lives.
_RESOURCES: dict[int, tuple[weakref.ref[Resource], bytes]] = {}
_SCOPES: dict[InstrumentationScope, bytes] = {}
# Point attribute sets repeat every export (a throttle reason, a GPU's identity); keyed by their items.
_POINT_ATTRIBUTES: dict[tuple[object, ...], bytes] = {}
_CACHE_LIMIT = 4096  # attribute sets come and go with jobs; never grow without bound


class OtlpEncodingError(ValueError):
    """Data no OTLP encoder can write (a point whose value is not a number); the message says which metric."""


class _Unsupported(Exception):
    """Data this encoder does not take (histograms, exemplars, ...): the SDK's encoder does."""


def encode_request(data: MetricsData) -> bytes:
    """The serialized ``ExportMetricsServiceRequest`` for ``data``, gauge start times kept: what is sent.

    The same bytes as ``encode_metrics(data).SerializeToString()`` once the gauges' start times are set on it.
    Raises ``OtlpEncodingError`` for data that cannot be encoded.
    """
    try:
        return _encode(data)
    except Exception:  # _Unsupported, or a bad value: the SDK's encoder, with its own error, decides
        return _sdk_with_intervals(data).SerializeToString()


def encode_with_intervals(data: MetricsData) -> ExportMetricsServiceRequest:
    """``encode_metrics(data)`` with gauge points' start times set, as a message (for callers that read it)."""
    try:
        return ExportMetricsServiceRequest.FromString(_encode(data))
    except Exception:
        return _sdk_with_intervals(data)


def _sdk_with_intervals(data: MetricsData) -> ExportMetricsServiceRequest:
    """The SDK's encoding, then each gauge point's start time, walking the two trees side by side;
    should they ever not line up (merged resources or scopes), the request goes as the SDK encoded it."""
    try:
        request = encode_metrics(data)
    except Exception as error:  # the SDK's EncodingException names the metric on a line of its own
        raise OtlpEncodingError(f"cannot encode the export: {' '.join(str(error).split())}") from None
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


def _encode(data: MetricsData) -> bytes:
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
    request: list[bytes] = []
    for resource, scopes in by_resource.items():
        body = [_resource(resource)]
        for scope, metrics in scopes.items():
            scope_body = [_scope(scope), *map(_metric, metrics), _string(3, scope.schema_url)]
            body.append(_field(2, b"".join(scope_body)))
        body.append(_string(3, resource.schema_url))
        request.append(_field(1, b"".join(body)))
    return b"".join(request)


def _varint(value: int) -> bytes:
    if value < 0x80:
        return _SMALL[value]
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_SMALL = [bytes((n,)) for n in range(0x80)]


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field: tag, length, payload."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _string(number: int, text: str | None) -> bytes:
    return _field(number, text.encode()) if text else b""


# A data point field (1) of a Gauge or Sum holding a NumberDataPoint, its fields in number order as protobuf
# writes them: start_time_unix_nano (2) and time_unix_nano (3) as fixed64 (left out when 0, as proto3 does),
# as_double (4) or as_int (6, sfixed64), then attributes (7). The value is written even when 0: it is a oneof,
# so the SDK's encoding carries it too. With both times and no attributes the point is 27 bytes long.
_DOUBLE_POINT = struct.Struct("<BBBQBQBd")
_INT_POINT = struct.Struct("<BBBQBQBq")
_POINT_LENGTH = 27
_DOUBLE_BODY = struct.Struct("<BQBQBd")
_INT_BODY = struct.Struct("<BQBQBq")
_FIXED64, _SFIXED64, _DOUBLE = struct.Struct("<Q"), struct.Struct("<q"), struct.Struct("<d")
_GAUGE, _SUM, _DATA_POINT, _METRIC = b"\x2a", b"\x3a", b"\x0a", b"\x12"  # tags (field << 3 | 2)
_HEADERS: dict[tuple[str, str | None, str | None], bytes] = {}


def _metric(metric: Metric) -> bytes:
    """A Metric field (2) of a ScopeMetrics: name (1), description (2), unit (3), gauge (5) or sum (7)."""
    header_key = (metric.name, metric.description, metric.unit)
    header = _HEADERS.get(header_key)
    if header is None:
        if len(_HEADERS) > _CACHE_LIMIT:
            _HEADERS.clear()
        header = _HEADERS[header_key] = (
            _string(1, metric.name) + _string(2, metric.description) + _string(3, metric.unit)
        )
    data = metric.data
    if isinstance(data, Gauge):
        tag, tail = _GAUGE, b""
    elif isinstance(data, Sum):
        temporality = int(data.aggregation_temporality)
        tag = _SUM
        tail = (b"\x10" + _varint(temporality) if temporality else b"") + (b"\x18\x01" if data.is_monotonic else b"")
    else:
        raise _Unsupported
    if not data.data_points:  # the SDK sets no gauge or sum at all then
        return _METRIC + _varint(len(header)) + header
    points = []
    for point in data.data_points:
        if not isinstance(point, NumberDataPoint) or point.exemplars:
            raise _Unsupported
        value, start, end = point.value, point.start_time_unix_nano, point.time_unix_nano
        # The SDK leaves a gauge's start out; a sample's start is what tells an average from a point sample.
        if point.attributes or not (start and end):
            body = _point_body(value, start, end) + (_attributes(point.attributes) if point.attributes else b"")
            points.append(_DATA_POINT + _varint(len(body)) + body)
        elif isinstance(value, int):
            points.append(_INT_POINT.pack(0x0A, _POINT_LENGTH, 0x11, start, 0x19, end, 0x31, value))
        else:
            points.append(_DOUBLE_POINT.pack(0x0A, _POINT_LENGTH, 0x11, start, 0x19, end, 0x21, value))
    payload = b"".join(points) + tail
    body = header + tag + _varint(len(payload)) + payload
    return _METRIC + _varint(len(body)) + body


def _point_body(value: float | int, start: int | None, end: int | None) -> bytes:
    """A point's times and value; a time of 0 (or None) is left out, as protobuf leaves out a zero scalar."""
    if start and end:
        if isinstance(value, int):
            return _INT_BODY.pack(0x11, start, 0x19, end, 0x31, value)
        return _DOUBLE_BODY.pack(0x11, start, 0x19, end, 0x21, value)
    times = (b"\x11" + _FIXED64.pack(start) if start else b"") + (b"\x19" + _FIXED64.pack(end) if end else b"")
    if isinstance(value, int):
        return times + b"\x31" + _SFIXED64.pack(value)
    return times + b"\x21" + _DOUBLE.pack(value)


def _resource(resource: Resource) -> bytes:
    """The ResourceMetrics' resource field (1), encoded once per resource object."""
    key = id(resource)
    entry = _RESOURCES.get(key)
    if entry is not None and entry[0]() is resource:
        return entry[1]
    encoded = _field(1, PbResource(attributes=_key_values(resource.attributes)).SerializeToString())
    _RESOURCES[key] = (weakref.ref(resource, lambda ref: _forget(key, ref)), encoded)
    return encoded


def _forget(key: int, ref: weakref.ref[Resource]) -> None:
    """A cached resource is gone: its entry goes too (unless its id already holds a newer one)."""
    entry = _RESOURCES.get(key)
    if entry is not None and entry[0] is ref:
        _RESOURCES.pop(key, None)  # another exporter's thread may have dropped it first


def _scope(scope: InstrumentationScope) -> bytes:
    """The ScopeMetrics' scope field (1)."""
    if scope.attributes:  # a scope's equality leaves its attributes out: only attribute-less ones are kept
        return _field(1, _scope_message(scope).SerializeToString())
    encoded = _SCOPES.get(scope)
    if encoded is None:
        if len(_SCOPES) > _CACHE_LIMIT:
            _SCOPES.clear()
        encoded = _SCOPES[scope] = _field(1, _scope_message(scope).SerializeToString())
    return encoded


def _scope_message(scope: InstrumentationScope) -> PbScope:
    return PbScope(name=scope.name, version=scope.version or "", attributes=_key_values(scope.attributes))


def _attributes(attributes: Attributes) -> bytes:
    """A point's attributes fields (7)."""
    assert attributes is not None
    try:
        # With the values' types: 1, 1.0 and True are equal keys but different encodings.
        key = (*attributes.items(), *map(type, attributes.values()))
        encoded = _POINT_ATTRIBUTES.get(key)
    except TypeError:  # an unhashable value (a list): encoded each time
        return _encode_point_attributes(attributes)
    if encoded is None:
        if len(_POINT_ATTRIBUTES) > _CACHE_LIMIT:
            _POINT_ATTRIBUTES.clear()
        encoded = _POINT_ATTRIBUTES[key] = _encode_point_attributes(attributes)
    return encoded


def _encode_point_attributes(attributes: Attributes) -> bytes:
    return b"".join(_field(7, pair.SerializeToString()) for pair in _key_values(attributes))


def _key_values(attributes: Attributes) -> list[KeyValue]:
    """Attributes as OTLP KeyValues, as the SDK's encoder writes them: a value of a type OTLP cannot carry
    is left out (with a warning) and the rest kept, so one bad attribute never loses the point."""
    if not attributes:
        return []
    pairs = []
    for key, value in attributes.items():
        try:
            pairs.append(KeyValue(key=key, value=_any_value(value)))
        except TypeError as error:
            log.warning("attribute %r left out of the export: %s", key, error)
    return pairs


def _any_value(value: object) -> AnyValue:
    # The order matters: bool is an int, str and bytes are sequences.
    if value is None:
        return AnyValue()
    if isinstance(value, bool):
        return AnyValue(bool_value=value)
    if isinstance(value, str):
        return AnyValue(string_value=value)
    if isinstance(value, int):
        return AnyValue(int_value=value)
    if isinstance(value, float):
        return AnyValue(double_value=value)
    if isinstance(value, bytes):
        return AnyValue(bytes_value=value)
    if isinstance(value, Sequence):
        return AnyValue(array_value=ArrayValue(values=[_any_value(item) for item in value]))
    if isinstance(value, Mapping):
        return AnyValue(
            kvlist_value=KeyValueList(values=[KeyValue(key=str(k), value=_any_value(v)) for k, v in value.items()])
        )
    raise TypeError(f"a {type(value).__name__} is not an OTLP attribute value")
