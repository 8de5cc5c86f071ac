"""The producer's OTLP encoder: the SDK's request, byte for byte, with gauge start times kept."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.sdk.metrics import Exemplar
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Gauge,
    Histogram,
    HistogramDataPoint,
    Metric,
    MetricsData,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from otel_ofu.model import GpuIdentity, GpuReading, Snapshot
from otel_ofu.producer import MetricsDataBuilder, compute_snapshot, env_resource, otlp_encoding
from otel_ofu.producer.otlp_encoding import OtlpEncodingError, encode_request, encode_with_intervals

SECOND = 1_000_000_000
SCOPE = InstrumentationScope("otel-ofu", "1.0")


def point(value: float, attributes: dict[str, object] | None = None, start: int = 10 * SECOND) -> NumberDataPoint:
    return NumberDataPoint(
        attributes=attributes or {},  # type: ignore[arg-type]
        start_time_unix_nano=start,
        time_unix_nano=20 * SECOND,
        value=value,
    )


def data_of(*resources: tuple[Resource, Sequence[Metric]], scope: InstrumentationScope = SCOPE) -> MetricsData:
    return MetricsData(
        resource_metrics=[
            ResourceMetrics(resource=resource, scope_metrics=[ScopeMetrics(scope, list(metrics), "")], schema_url="")
            for resource, metrics in resources
        ]
    )


def gauge(name: str, *points: NumberDataPoint) -> Metric:
    return Metric(name=name, description=f"{name} described", unit="1", data=Gauge(data_points=list(points)))


def sdk_then_starts(data: MetricsData) -> ExportMetricsServiceRequest:
    """What the SDK sends, with each gauge point's start time set by hand: the expected request."""
    request = encode_metrics(data)
    for rm_pb, rm in zip(request.resource_metrics, data.resource_metrics, strict=True):
        for sm_pb, sm in zip(rm_pb.scope_metrics, rm.scope_metrics, strict=True):
            for metric_pb, metric in zip(sm_pb.metrics, sm.metrics, strict=True):
                if isinstance(metric.data, Gauge):
                    for point_pb, sdk_point in zip(metric_pb.gauge.data_points, metric.data.data_points, strict=True):
                        point_pb.start_time_unix_nano = sdk_point.start_time_unix_nano
    return request


def test_the_producers_export_is_the_sdks_request_with_start_times() -> None:
    gpus = [GpuIdentity(uuid=f"GPU-{i}", model="NVIDIA H100 80GB HBM3", index=i, host="node-1") for i in range(3)]
    snapshot = Snapshot(
        tuple(GpuReading(gpu, 10 * SECOND, 20 * SECOND, tensor_active=0.5, sm_clock_hz=1.5e9) for gpu in gpus)
    )
    builder = MetricsDataBuilder(base=env_resource("node-1"))
    for _ in range(2):  # the second export comes from the cached encodings
        data = builder.build(compute_snapshot(snapshot))
        request = encode_with_intervals(data)
        assert request == sdk_then_starts(data)
        # What is sent: the very bytes protobuf writes for the SDK's request with the start times set.
        assert encode_request(data) == sdk_then_starts(data).SerializeToString()
        assert request.resource_metrics[0].scope_metrics[0].metrics[0].gauge.data_points[0].start_time_unix_nano


def test_values_and_attribute_types_are_encoded_as_the_sdk_does() -> None:
    resource = Resource({"host.name": "n", "count": 2, "flag": True, "ratio": 0.5, "tags": ("a", "b")})
    metrics = [
        gauge("g", point(1), point(2.5, {"reason": "power"}), point(3, {"n": 1}), point(4, {"n": True})),
        gauge("h", point(1.0, {"n": 1.0}), point(5, {"list": ["x", "y"]}), point(6, start=0)),
        Metric(
            name="energy",
            description="",
            unit="J",
            data=Sum([point(7.5)], AggregationTemporality.CUMULATIVE, is_monotonic=True),
        ),
    ]
    data = data_of((resource, metrics), scope=InstrumentationScope("s", "2", "https://schema", {"k": "v"}))
    for _ in range(2):
        request = encode_with_intervals(data)
        assert request == sdk_then_starts(data)
        assert encode_request(data) == sdk_then_starts(data).SerializeToString()
        points = request.resource_metrics[0].scope_metrics[0].metrics[0].gauge.data_points
        assert points[2].attributes[0].value.int_value == 1
        assert points[3].attributes[0].value.bool_value is True
        assert points[0].as_int == 1
        assert request.resource_metrics[0].scope_metrics[0].scope.attributes[0].key == "k"


def test_a_scope_with_attributes_is_not_mistaken_for_one_without() -> None:
    plain = encode_with_intervals(data_of((Resource({"a": "1"}), [gauge("g", point(1))])))
    attributed = encode_with_intervals(
        data_of(
            (Resource({"a": "1"}), [gauge("g", point(1))]),
            scope=InstrumentationScope("otel-ofu", "1.0", None, {"x": 1}),
        )
    )
    assert not plain.resource_metrics[0].scope_metrics[0].scope.attributes
    assert attributed.resource_metrics[0].scope_metrics[0].scope.attributes[0].key == "x"


def test_equal_resources_merge_as_in_the_sdk() -> None:
    data = data_of((Resource({"a": "1"}), [gauge("g", point(1))]), (Resource({"a": "1"}), [gauge("g", point(2))]))
    assert encode_with_intervals(data) == encode_metrics(data)


def test_what_it_does_not_take_goes_through_the_sdk() -> None:
    histogram = Metric(
        name="latency",
        description="",
        unit="s",
        data=Histogram(
            [HistogramDataPoint({}, 1, 2, 1, 0.5, [0, 1], [1.0], 0.5, 0.5)], AggregationTemporality.CUMULATIVE
        ),
    )
    with_exemplar = NumberDataPoint({}, 10 * SECOND, 20 * SECOND, 1.0, [Exemplar({}, 1.0, 15 * SECOND, None, None)])
    data = data_of((Resource({"a": "1"}), [histogram, gauge("g", with_exemplar)]))
    request = encode_with_intervals(data)
    assert request.resource_metrics[0].scope_metrics[0].metrics[0].histogram.data_points[0].count == 1
    assert request == sdk_then_starts(data)


def test_a_bad_value_is_one_line_naming_the_metric() -> None:
    data = data_of((Resource({"a": "1"}), [gauge("bad.gauge", point("high"))]))  # type: ignore[arg-type]
    with pytest.raises(OtlpEncodingError, match=r"bad\.gauge") as raised:
        encode_request(data)
    assert "\n" not in str(raised.value)
    with pytest.raises(OtlpEncodingError):
        encode_with_intervals(data)


def test_zero_times_and_empty_metrics_are_written_as_protobuf_writes_them() -> None:
    # proto3 leaves a zero time out; a gauge or sum with no points has no data field at all in the SDK's request.
    empty_sum = Metric("s", "", "1", Sum([], AggregationTemporality.DELTA, is_monotonic=True))
    metrics = [gauge("g", point(1.5, start=0), point(2, {"k": "v"}, start=0)), gauge("empty"), empty_sum]
    data = data_of((Resource({"a": "1"}), metrics))
    assert encode_request(data) == sdk_then_starts(data).SerializeToString()
    request = encode_with_intervals(data)
    assert request.resource_metrics[0].scope_metrics[0].metrics[1].WhichOneof("data") is None


def test_an_attribute_value_otlp_cannot_carry_is_left_out_and_the_rest_kept(caplog: pytest.LogCaptureFixture) -> None:
    # The SDK's encoder does the same (its own log line carries a traceback): the point and its other attributes go.
    data = data_of((Resource({"a": "1"}), [gauge("g", point(1.0, {"ok": "yes", "bad": object()}))]))
    (point_pb,) = encode_with_intervals(data).resource_metrics[0].scope_metrics[0].metrics[0].gauge.data_points
    (kept,) = point_pb.attributes
    assert (kept.key, kept.value.string_value) == ("ok", "yes")
    assert "'bad' left out" in caplog.text


def test_each_resource_gets_its_own_encoding_as_resources_come_and_go() -> None:
    for i in range(50):  # dropped resources' ids are reused: an encoding never outlives its resource
        data = data_of((Resource({"job.id": f"job-{i}"}), [gauge("g", point(1))]))
        request = encode_with_intervals(data)
        assert request.resource_metrics[0].resource.attributes[0].value.string_value == f"job-{i}"
        del data


def test_the_producers_data_is_written_without_the_sdks_encoder(monkeypatch: pytest.MonkeyPatch) -> None:
    # The fallback gives the same bytes, so the equality tests above cannot tell which path wrote them: this can.
    gpus = [GpuIdentity(uuid=f"GPU-{i}", model="NVIDIA H100 80GB HBM3", index=i, host="node-1") for i in range(2)]
    snapshot = Snapshot(tuple(GpuReading(gpu, 10 * SECOND, 20 * SECOND, tensor_active=0.5) for gpu in gpus))
    data = MetricsDataBuilder(base=env_resource("node-1"), placement="both").build(compute_snapshot(snapshot))
    expected = sdk_then_starts(data).SerializeToString()

    def refuse(data: MetricsData) -> ExportMetricsServiceRequest:
        raise AssertionError("the SDK's encoder was called")

    monkeypatch.setattr(otlp_encoding, "encode_metrics", refuse)
    assert encode_request(data) == expected
