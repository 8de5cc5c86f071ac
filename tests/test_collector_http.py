"""The collector's OTLP/HTTP receiver on loopback: protobuf, JSON, gzip, status codes, the SDK's HTTP exporter."""

from __future__ import annotations

import gzip
import http.client
import json
import math
import threading
from collections.abc import Iterator, Mapping

import attrs
import pytest
from google.protobuf import json_format
from google.rpc import status_pb2  # type: ignore[import-untyped]
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.sdk.metrics.export import (
    Gauge,
    Metric,
    MetricExportResult,
    MetricsData,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from otel_ofu import names
from otel_ofu_collector.auth import BearerAuth
from otel_ofu_collector.decode import DecodeOutcome, Decoder
from otel_ofu_collector.gate import Gate
from otel_ofu_collector.http_receiver import HttpReceiver

T0 = 1_700_000_000_000_000_000


@attrs.define
class RecordingSink:
    ofu: list[tuple[str, float, dict[str, str]]] = attrs.field(factory=list)
    mfu: list[tuple[str, float]] = attrs.field(factory=list)

    def add_ofu(self, stream_key: str, value: float, start_ns: int, end_ns: int, identity: Mapping[str, str]) -> bool:
        self.ofu.append((stream_key, value, dict(identity)))
        return True

    def add_mfu(self, job_id: str, value: float, time_ns: int, identity: Mapping[str, str]) -> bool:
        self.mfu.append((job_id, value))
        return True


def gpu_request(values: Mapping[str, float]) -> ExportMetricsServiceRequest:
    request = ExportMetricsServiceRequest()
    for hw_id, value in values.items():
        rm = request.resource_metrics.add()
        for key, text in ((names.HOST_NAME, "node-1"), (names.HW_ID, hw_id), (names.JOB_ID, "job-a")):
            kv = rm.resource.attributes.add()
            kv.key = key
            kv.value.string_value = text
        metric = rm.scope_metrics.add().metrics.add()
        metric.name = names.GPU_OFU.name
        metric.gauge.data_points.add(as_double=value, time_unix_nano=T0)
    return request


@attrs.define
class Running:
    receiver: HttpReceiver
    sink: RecordingSink
    gate: Gate

    def post(
        self, body: bytes, headers: Mapping[str, str] | None = None, path: str = "/v1/metrics"
    ) -> tuple[int, dict[str, str], bytes]:
        connection = http.client.HTTPConnection("127.0.0.1", self.receiver.port, timeout=10)
        try:
            connection.request(
                "POST", path, body=body, headers={"Content-Type": "application/x-protobuf", **(headers or {})}
            )
            response = connection.getresponse()
            return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
        finally:
            connection.close()


def _start(auth: BearerAuth | None = None, gate: Gate | None = None, ingest: object = None) -> Running:
    sink = RecordingSink()
    decoder = Decoder(sink)
    gate = gate or Gate(max_in_flight=4, retry_after_s=2.0)
    receiver = HttpReceiver(ingest or decoder.decode, gate, "127.0.0.1:0", None, auth)  # type: ignore[arg-type]
    receiver.start()
    return Running(receiver, sink, gate)


@pytest.fixture
def running() -> Iterator[Running]:
    server = _start()
    yield server
    server.receiver.stop()


def test_protobuf_request_is_accepted(running: Running) -> None:
    status, headers, body = running.post(gpu_request({"GPU-1": 0.5}).SerializeToString())
    assert status == 200
    assert headers["content-type"] == "application/x-protobuf"
    assert not ExportMetricsServiceResponse.FromString(body).HasField("partial_success")
    assert running.sink.ofu[0][:2] == ("node-1|GPU-1", 0.5)


def test_json_request_answers_in_json_with_partial_success(running: Running) -> None:
    request = gpu_request({"GPU-1": 0.25, "GPU-2": 2.0})
    body = json_format.MessageToJson(request).encode()
    status, headers, reply = running.post(body, {"Content-Type": "application/json"})
    assert status == 200
    assert headers["content-type"] == "application/json"
    parsed = json.loads(reply)
    assert parsed["partialSuccess"]["rejectedDataPoints"] == "1"
    assert [value for _, value, _ in running.sink.ofu] == [0.25]


def test_gzip_body(running: Running) -> None:
    body = gzip.compress(gpu_request({"GPU-1": 0.75}).SerializeToString())
    status, _, _ = running.post(body, {"Content-Encoding": "gzip"})
    assert status == 200
    assert running.sink.ofu[0][1] == 0.75


def test_malformed_bodies_are_400_and_state_survives(running: Running) -> None:
    for body, headers in (
        (b"\xff\xff\xff", {}),
        (b"{not json", {"Content-Type": "application/json"}),
        (b"not gzip", {"Content-Encoding": "gzip"}),
    ):
        status, _, reply = running.post(body, headers)
        assert status == 400
        if headers.get("Content-Type") == "application/json":
            assert "malformed" in json.loads(reply)["message"]
        else:
            assert status_pb2.Status.FromString(reply).message
    assert running.sink.ofu == []
    assert running.post(gpu_request({"GPU-1": 0.1}).SerializeToString())[0] == 200


def test_wrong_path_and_content_type(running: Running) -> None:
    assert running.post(b"", path="/v1/traces")[0] == 404
    assert running.post(b"x", {"Content-Type": "text/plain"})[0] == 415


def test_oversized_body_is_413() -> None:
    sink = RecordingSink()
    receiver = HttpReceiver(Decoder(sink).decode, Gate(), "127.0.0.1:0", max_request_bytes=1024)
    receiver.start()
    try:
        server = Running(receiver, sink, Gate())
        assert server.post(b"\x00" * 2048)[0] == 413
        bomb = gzip.compress(b"\x00" * 100_000)
        assert server.post(bomb, {"Content-Encoding": "gzip"})[0] == 413
    finally:
        receiver.stop()


def test_bearer_auth_is_401() -> None:
    server = _start(auth=BearerAuth("tok"))
    try:
        body = gpu_request({"GPU-1": 0.5}).SerializeToString()
        status, headers, _ = server.post(body)
        assert status == 401
        assert headers["www-authenticate"] == "Bearer"
        assert server.post(body, {"Authorization": "Bearer wrong"})[0] == 401
        assert server.post(body, {"Authorization": "Bearer tok"})[0] == 200
        assert len(server.sink.ofu) == 1
    finally:
        server.receiver.stop()


def test_overload_and_shutdown_are_503_with_retry_after() -> None:
    inside = threading.Event()
    release = threading.Event()
    decoder = Decoder(RecordingSink())

    def slow(request: ExportMetricsServiceRequest, raw: bytes) -> DecodeOutcome:
        inside.set()
        release.wait(10)
        return decoder.decode(request, raw)

    server = _start(gate=Gate(max_in_flight=1, retry_after_s=2.0), ingest=slow)
    body = gpu_request({"GPU-1": 0.5}).SerializeToString()
    try:
        first = threading.Thread(target=server.post, args=(body,))
        first.start()
        assert inside.wait(10)
        status, headers, _ = server.post(body)
        assert (status, headers["retry-after"]) == (503, "2")
        release.set()
        first.join(10)
        server.gate.close()
        status, headers, _ = server.post(body)
        assert (status, headers["retry-after"]) == (503, "2")
    finally:
        release.set()
        server.receiver.stop()


def test_the_sdk_http_exporter_delivers(running: Running) -> None:
    resource = Resource.create({names.HW_ID: "GPU-9", names.HOST_NAME: "h", names.JOB_ID: "j"})
    point = NumberDataPoint(attributes={}, start_time_unix_nano=0, time_unix_nano=T0, value=0.33)
    data = MetricsData(
        [
            ResourceMetrics(
                resource,
                [ScopeMetrics(InstrumentationScope("x"), [Metric(names.GPU_OFU.name, "", "1", Gauge([point]))], "")],
                "",
            )
        ]
    )
    exporter = OTLPMetricExporter(endpoint=f"http://127.0.0.1:{running.receiver.port}/v1/metrics", timeout=10)
    try:
        assert exporter.export(data) is MetricExportResult.SUCCESS
    finally:
        exporter.shutdown()
    assert running.sink.ofu[0][:2] == ("h|GPU-9", 0.33)
    assert not math.isnan(running.sink.ofu[0][1])
