"""The collector at its outer limits: outputs too large for the downstream, permanent refusals, overlong
attributes, the job cap after eviction, its own health downstream, rate-limited logs and the shutdown grace."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures
from typing import Any

import attrs
import grpc
import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from otel_ofu import names
from otel_ofu.testing.otlp_requests import RecordingSink, gpu_request, mfu_request, set_attribute
from otel_ofu.testing.otlp_sink import OtlpSink
from otel_ofu_collector.aggregation.exphist import ExpHistogram
from otel_ofu_collector.aggregation.windows import Aggregator
from otel_ofu_collector.config import AggregatorConfig
from otel_ofu_collector.otlp.decode import Decoder
from otel_ofu_collector.otlp.encode import encode_request, reports_to_metrics_data
from otel_ofu_collector.outputs.delivery import Delivery
from otel_ofu_collector.outputs.split import split_request
from otel_ofu_collector.outputs.transports import DownstreamConfig, GrpcTransport
from otel_ofu_collector.receivers.otlp_grpc import SERVICE_NAME as OTLP_SERVICE
from otel_ofu_collector.receivers.otlp_grpc import retry_trailers
from otel_ofu_collector.service import CollectorOptions, CollectorService

S = 1_000_000_000
W0 = 1_700_000_040 * S  # a multiple of 60 s
WINDOW = 60 * S
GRPC_DEFAULT_LIMIT = 4 * 1024 * 1024  # what a gRPC server (the sink among them) accepts by default


@pytest.fixture
def sink() -> Iterator[OtlpSink]:
    with OtlpSink.start(hold_limit_s=5) as started:
        yield started


def options(sink: OtlpSink | None, **overrides: Any) -> CollectorOptions:
    settings: dict[str, Any] = {
        "aggregator": AggregatorConfig(window_s=60.0, lateness_s=10.0),
        "grpc_listen": None,
        "export_endpoint": sink.grpc_endpoint if sink else None,
        "flush_interval_s": 0.0,
        "initial_backoff_s": 0.01,
        "max_backoff_s": 0.05,
        "instance_id": "test-1",
    }
    settings.update(overrides)
    return CollectorOptions(**settings)


def points_of(requests: list[Any], name: str) -> list[Any]:
    return [
        point
        for request in requests
        for rm in request.resource_metrics
        for sm in rm.scope_metrics
        for metric in sm.metrics
        if metric.name == name
        for point in getattr(metric, metric.WhichOneof("data")).data_points
    ]


def job_ids(requests: list[Any]) -> set[str]:
    found = set()
    for point in points_of(requests, names.JOB_OFU.name):
        found |= {kv.value.string_value for kv in point.attributes if kv.key == names.JOB_ID}
    return found


# --- 1. outputs larger than the downstream takes ----------------------------------------------------


def big_fleet(jobs: int, id_length: int) -> ExportMetricsServiceRequest:
    """One GPU per job, each job id ``id_length`` characters long (within the attribute bound)."""
    return gpu_request({f"GPU-{n}": (f"job-{n:05d}-".ljust(id_length, "x"), 0.5) for n in range(jobs)}, time_ns=W0 + S)


def test_a_window_too_large_for_the_downstream_is_split_and_delivered_and_the_next_one_too(sink: OtlpSink) -> None:
    service = CollectorService(options(sink, self_telemetry=False), environ={})
    assert service.exports is not None
    service.ingest(big_fleet(1200, 4000))
    service.flush(W0 + WINDOW + 11 * S)
    service.ingest(gpu_request({"GPU-0": ("after", 0.5)}, time_ns=W0 + WINDOW + 20 * S))
    service.flush(W0 + 2 * WINDOW + 11 * S)
    try:
        assert service.exports.pump()  # before: RESOURCE_EXHAUSTED, retried for ever, the queue stuck
        assert job_ids(sink.requests()) == {f"job-{n:05d}-".ljust(4000, "x") for n in range(1200)} | {"after"}
        assert service.exports.stats.split >= 1
        assert all(request.ByteSize() <= GRPC_DEFAULT_LIMIT for request in sink.requests())
        assert service.exports.stats.dropped_rejected == service.exports.stats.dropped_oversized == 0
    finally:
        service.stop(0)


def test_a_large_foreign_request_passes_through_in_pieces_with_every_point(sink: OtlpSink) -> None:
    service = CollectorService(options(sink, self_telemetry=False), environ={})
    assert service.pass_through is not None
    foreign = ExportMetricsServiceRequest()
    rm = foreign.resource_metrics.add()
    set_attribute(rm.resource.attributes, names.SERVICE_NAME, "node-exporter")
    metric = rm.scope_metrics.add().metrics.add(name="node.filesystem.free")
    for n in range(8 * 1024):
        point = metric.gauge.data_points.add(as_int=n, time_unix_nano=W0)
        set_attribute(point.attributes, "mount", f"/mnt/{n}".ljust(1024, "x"))
    assert foreign.ByteSize() > 8 * 1024 * 1024
    service.ingest(foreign)
    try:
        assert service.pass_through.pump()
        received = points_of(sink.requests(), "node.filesystem.free")
        assert [point.as_int for point in received] == list(range(8 * 1024))  # each once, in order
        assert len(sink.requests()) >= 3
    finally:
        service.stop(0)


def test_split_keeps_every_point_once_under_its_resource_and_counts_a_point_that_cannot_fit() -> None:
    request = ExportMetricsServiceRequest()
    for r in range(3):
        rm = request.resource_metrics.add()
        set_attribute(rm.resource.attributes, "r", r)
        sm = rm.scope_metrics.add()
        sm.scope.name = "scope"
        for m in range(3):
            metric = sm.metrics.add(name=f"m{m}", unit="1")
            metric.sum.is_monotonic = True
            for p in range(50):
                metric.sum.data_points.add(as_int=p, time_unix_nano=1)
    lone = request.resource_metrics[2].scope_metrics[0].metrics[2].sum.data_points[0]
    set_attribute(lone.attributes, "huge", "x" * 5000)
    pieces, unfit = split_request(request.SerializeToString(), 2000)
    assert unfit == 1
    assert all(len(piece) <= 2000 for piece in pieces)
    seen = []
    for piece in map(ExportMetricsServiceRequest.FromString, pieces):
        for rm in piece.resource_metrics:
            for sm in rm.scope_metrics:
                assert sm.scope.name == "scope"
                for metric in sm.metrics:
                    assert metric.sum.is_monotonic
                    assert metric.unit == "1"
                    seen += [
                        (rm.resource.attributes[0].value.int_value, metric.name, p.as_int)
                        for p in metric.sum.data_points
                    ]
    expected = [(r, f"m{m}", p) for r in range(3) for m in range(3) for p in range(50)]
    expected.remove((2, "m2", 0))  # the one over the limit on its own
    assert seen == expected
    assert split_request(b"small", 2000) == ([b"small"], 0)


def test_resource_exhausted_without_retry_info_is_permanent_and_does_not_block_the_queue(sink: OtlpSink) -> None:
    transport = GrpcTransport(DownstreamConfig.resolve(sink.grpc_endpoint, "grpc", {}))
    # A limit above the downstream's: the oversized request reaches it and is refused for its size.
    delivery = Delivery(transport, max_request_bytes=64 * 1024 * 1024)
    oversized = gpu_request({"GPU-1": ("x" * (5 * 1024 * 1024), 0.5)}).SerializeToString()
    delivery.submit(oversized)
    delivery.submit(gpu_request({"GPU-2": 0.5}).SerializeToString())
    try:
        assert delivery.pump()  # before: False, and the small request behind it never sent
        assert delivery.stats.dropped_rejected == 1
        assert "RESOURCE_EXHAUSTED" in delivery.stats.last_error
        assert len(sink.requests()) == 1
    finally:
        delivery.stop(0)


@pytest.fixture
def exhausted_with_retry_info() -> Iterator[str]:
    """A gRPC downstream answering RESOURCE_EXHAUSTED with RetryInfo (out of capacity for now)."""

    def export(_request: bytes, context: grpc.ServicerContext) -> bytes:
        status, trailers = retry_trailers(grpc.StatusCode.RESOURCE_EXHAUSTED, "busy", 3.0)
        context.set_trailing_metadata(trailers)
        context.abort(status.code, status.details)
        return b""

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    handler = grpc.unary_unary_rpc_method_handler(export)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(OTLP_SERVICE, {"Export": handler}),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop(None)


def test_resource_exhausted_with_retry_info_is_retried_after_its_delay(exhausted_with_retry_info: str) -> None:
    outcome = GrpcTransport(DownstreamConfig.resolve(exhausted_with_retry_info, "grpc", {})).send(b"")
    assert (outcome.ok, outcome.retryable, outcome.retry_after_s) == (False, True, 3.0)


@pytest.mark.parametrize("length", [4096, 4097])
def test_an_identity_attribute_over_the_length_bound_rejects_its_points_by_reason(length: int) -> None:
    sink = RecordingSink()
    decoder = Decoder(sink, max_attribute_length=4096)
    on_resource = decoder.decode(gpu_request({"GPU-1": ("j" * length, 0.5)}))
    on_point = decoder.decode(mfu_request({"j" * length: 0.4}))
    if length == 4096:
        assert (on_resource.rejected, on_point.rejected) == (0, 0)
        assert len(sink.ofu) == len(sink.mfu) == 1
    else:
        assert (on_resource.rejected, on_point.rejected) == (1, 1)
        assert sink.ofu == sink.mfu == []  # rejected whole, never truncated
        assert decoder.stats.rejected_by_reason == {
            "gpu.ofu attribute value longer than 4096 characters": 1,
            "job.mfu attribute value longer than 4096 characters": 1,
        }
        assert "longer than 4096 characters" in on_point.error_message


# --- 15. histogram bounds ---------------------------------------------------------------------------


def test_unknown_histogram_bounds_stay_absent_in_the_encoding_and_through_a_merge() -> None:
    known = ExpHistogram.from_values([0.2, 0.4], max_buckets=160)
    unknown = attrs.evolve(known, min=None, max=None)  # a shard's partial sent without them
    merged = unknown.merge(known, max_buckets=160)
    assert (merged.min, merged.max) == (None, None)  # the known side does not bound the other's values
    assert known.merge(ExpHistogram(), max_buckets=160).min == known.min  # an empty side does not matter
    aggregator = Aggregator(AggregatorConfig())
    aggregator.add_ofu("g1", 0.3, W0, W0 + 30 * S, {names.HW_MODEL: "H100", names.GPU_PRECISION: "bf16"})
    (report,) = aggregator.close_all()
    report = attrs.evolve(report, groups=tuple(attrs.evolve(group, histogram=merged) for group in report.groups))
    data = reports_to_metrics_data([report], resource_attributes={}, include_partials=False)
    request = ExportMetricsServiceRequest.FromString(encode_request(data))
    (point,) = points_of([request], names.FLEET_OFU.name)
    assert point.count == merged.count
    assert not point.HasField("min")
    assert not point.HasField("max")
