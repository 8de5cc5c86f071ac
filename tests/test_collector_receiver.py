"""The collector's OTLP/gRPC receiver: real gRPC on 127.0.0.1, the SDK exporter and a raw stub as clients."""

from __future__ import annotations

import http.client
import math
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import attrs
import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2  # type: ignore[import-untyped]
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.metrics.v1 import metrics_pb2
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

from otel_ofu import bounds, names
from otel_ofu.otlp_client import OtlpClient, OtlpSettings
from otel_ofu.testing.otlp_requests import T0, RecordingSink, gpu_request, set_attribute
from otel_ofu.testing.otlp_sink import OtlpSink
from otel_ofu.testing.pki import Pki, make_pki
from otel_ofu_collector.aggregation.windows import Aggregator
from otel_ofu_collector.config import AggregatorConfig
from otel_ofu_collector.otlp.decode import DecodeOutcome, Decoder
from otel_ofu_collector.outputs.delivery import Delivery
from otel_ofu_collector.receivers.admission import MAX_REQUEST_BYTES, Gate
from otel_ofu_collector.receivers.auth import BearerAuth, TlsFiles
from otel_ofu_collector.receivers.base import Receiver
from otel_ofu_collector.receivers.otlp_grpc import EXPORT_METHOD, RETRY_INFO_TRAILER, GrpcReceiver
from otel_ofu_collector.receivers.otlp_http import HttpReceiver

# --- request builders ------------------------------------------------------------------------------


def foreign_request() -> ExportMetricsServiceRequest:
    request = ExportMetricsServiceRequest()
    rm = request.resource_metrics.add()
    set_attribute(rm.resource.attributes, names.SERVICE_NAME, "checkout")
    rm.schema_url = "https://opentelemetry.io/schemas/1.24.0"
    sm = rm.scope_metrics.add()
    sm.scope.name = "checkout.http"
    metric = sm.metrics.add()
    metric.name = "http.server.request.duration"
    metric.unit = "s"
    hist = metric.histogram
    hist.aggregation_temporality = metrics_pb2.AGGREGATION_TEMPORALITY_CUMULATIVE
    point = hist.data_points.add(count=3, sum=0.5, time_unix_nano=T0, start_time_unix_nano=T0 - 1)
    point.bucket_counts.extend([1, 2])
    point.explicit_bounds.append(0.1)
    set_attribute(point.attributes, "http.route", "/pay")
    return request


# --- servers and clients ---------------------------------------------------------------------------


@attrs.define
class Running:
    receiver: GrpcReceiver
    sink: RecordingSink
    decoder: Decoder
    gate: Gate

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.receiver.port}"


def _start(
    *,
    ingest: Callable[[bytes], DecodeOutcome] | None = None,
    gate: Gate | None = None,
    tls: TlsFiles | None = None,
    auth: BearerAuth | None = None,
) -> Running:
    sink = RecordingSink()
    decoder = Decoder(sink)
    gate = gate or Gate(max_in_flight=8, retry_after_s=1.5)
    receiver = GrpcReceiver(ingest or decoder.decode_bytes, gate, "127.0.0.1:0", tls, auth)
    receiver.start()
    return Running(receiver, sink, decoder, gate)


@pytest.fixture
def running() -> Iterator[Running]:
    server = _start()
    yield server
    server.receiver.stop(0)


def _raw_call(channel: grpc.Channel) -> Callable[..., bytes]:
    call: Callable[..., bytes] = channel.unary_unary(EXPORT_METHOD, None, None)
    return call


def _export(target: str, payload: bytes, **kwargs: Any) -> ExportMetricsServiceResponse:
    with grpc.insecure_channel(target) as channel:
        return ExportMetricsServiceResponse.FromString(_raw_call(channel)(payload, timeout=10, **kwargs))


def _error(target: str, payload: bytes, **kwargs: Any) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        _export(target, payload, **kwargs)
    error: grpc.RpcError = caught.value
    return error


def _assert_retry_info(error: Any, seconds: float) -> None:
    trailers = dict(error.trailing_metadata())
    retry = error_details_pb2.RetryInfo.FromString(trailers[RETRY_INFO_TRAILER])
    assert retry.retry_delay.seconds + retry.retry_delay.nanos / 1e9 == pytest.approx(seconds)
    status = status_pb2.Status.FromString(trailers["grpc-status-details-bin"])
    assert status.code == grpc.StatusCode.UNAVAILABLE.value[0]
    standard = error_details_pb2.RetryInfo()
    assert status.details[0].Unpack(standard)
    assert standard == retry


# --- tests -----------------------------------------------------------------------------------------


def test_the_sdk_exporter_delivers_gpu_ofu(running: Running) -> None:
    resource = Resource.create(
        {names.HW_ID: "GPU-1", names.HOST_NAME: "node-1", names.HW_MODEL: "NVIDIA A100", names.JOB_ID: "j1"}
    )
    point = NumberDataPoint(
        attributes={names.GPU_PRECISION: "bf16"}, start_time_unix_nano=T0 - 5, time_unix_nano=T0, value=0.42
    )
    metric = Metric(names.GPU_OFU.name, "", "1", Gauge([point]))
    data = MetricsData([ResourceMetrics(resource, [ScopeMetrics(InstrumentationScope("otel_ofu"), [metric], "")], "")])
    exporter = OTLPMetricExporter(endpoint=f"http://{running.target}", insecure=True, timeout=10)
    try:
        assert exporter.export(data) is MetricExportResult.SUCCESS
    finally:
        exporter.shutdown()
    [(key, value, start, end, identity)] = running.sink.ofu
    assert key == "node-1|GPU-1"
    # The SDK's encoder drops a gauge point's start time: the collector sees an instant (start = end).
    assert (value, start, end) == (0.42, T0, T0)
    assert identity[names.GPU_PRECISION] == "bf16"  # from the data point
    assert identity[names.JOB_ID] == "j1"  # from the resource


def test_raw_stub_and_identity_on_data_point_wins(running: Running) -> None:
    request = gpu_request({"GPU-1": 0.5}, job="resource-job")
    set_attribute(
        request.resource_metrics[0].scope_metrics[0].metrics[0].gauge.data_points[0].attributes,
        names.JOB_ID,
        "point-job",
    )
    response = _export(running.target, request.SerializeToString())
    assert not response.HasField("partial_success")
    assert running.sink.ofu[0][4][names.JOB_ID] == "point-job"
    assert running.sink.ofu[0][4][names.GPU_INDEX] == "0"  # int AnyValue as text


def test_garbage_is_invalid_argument_and_state_survives(running: Running) -> None:
    error = _error(running.target, b"\xff\xff\xff\xff garbage")
    assert error.code() is grpc.StatusCode.INVALID_ARGUMENT
    truncated = gpu_request({"GPU-1": 0.5}).SerializeToString()[:-3]
    assert _error(running.target, truncated).code() is grpc.StatusCode.INVALID_ARGUMENT
    assert running.sink.ofu == []
    _export(running.target, gpu_request({"GPU-2": 0.25}).SerializeToString())
    assert [call[1] for call in running.sink.ofu] == [0.25]


def test_unusable_points_counted_in_partial_success(running: Running) -> None:
    request = gpu_request({"GPU-1": 0.5, "GPU-2": math.nan, "GPU-3": 1.5, "GPU-4": math.inf, "GPU-5": -0.1})
    nameless = gpu_request({"": 0.3})
    request.resource_metrics.extend(nameless.resource_metrics)
    response = _export(running.target, request.SerializeToString())
    assert response.partial_success.rejected_data_points == 5
    assert "not finite or outside its range" in response.partial_success.error_message
    assert "without hw.id" in response.partial_success.error_message
    assert [call[0] for call in running.sink.ofu] == ["node-1|GPU-1"]


def test_mfu_points_need_job_id_and_a_sane_value(running: Running) -> None:
    request = ExportMetricsServiceRequest()
    rm = request.resource_metrics.add()
    set_attribute(rm.resource.attributes, names.JOB_ID, "train-7")
    metric = rm.scope_metrics.add().metrics.add()
    metric.name = names.JOB_MFU.name
    for value in (0.45, 1.8, 11.0, -1.0, math.nan):  # 1.8: a miscounting framework, still taken
        metric.gauge.data_points.add(as_double=value, time_unix_nano=T0)
    response = _export(running.target, request.SerializeToString())
    assert response.partial_success.rejected_data_points == 3
    assert [(job, value) for job, value, _, _ in running.sink.mfu] == [("train-7", 0.45), ("train-7", 1.8)]


def test_gzip_requests_are_accepted(running: Running) -> None:
    with grpc.insecure_channel(running.target, compression=grpc.Compression.Gzip) as channel:
        _raw_call(channel)(gpu_request({"GPU-1": 0.7}).SerializeToString(), timeout=10)
    assert running.sink.ofu[0][1] == 0.7


def test_oversized_request_is_invalid_argument_not_resource_exhausted(running: Running) -> None:
    error = _error(running.target, b"\x00" * (MAX_REQUEST_BYTES + 1))
    assert error.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert running.sink.ofu == []


def test_overload_is_unavailable_with_retry_info_in_both_trailers() -> None:
    inside = threading.Event()
    release = threading.Event()
    sink = RecordingSink()
    decoder = Decoder(sink)

    def slow_ingest(raw: bytes) -> DecodeOutcome:
        inside.set()
        release.wait(10)
        return decoder.decode_bytes(raw)

    server = _start(ingest=slow_ingest, gate=Gate(max_in_flight=1, retry_after_s=2.5))
    try:
        with grpc.insecure_channel(server.target) as channel:
            first = _raw_call(channel).future(gpu_request({"GPU-1": 0.1}).SerializeToString(), timeout=10)  # type: ignore[attr-defined]
            assert inside.wait(10)
            error = _error(server.target, gpu_request({"GPU-2": 0.2}).SerializeToString())
            assert error.code() is grpc.StatusCode.UNAVAILABLE
            _assert_retry_info(error, 2.5)
            release.set()
            first.result(timeout=10)
        assert [call[0] for call in sink.ofu] == ["node-1|GPU-1"]
        assert server.gate.refused_overload == 1
    finally:
        release.set()
        server.receiver.stop(0)


def test_shutdown_is_unavailable_with_retry_info(running: Running) -> None:
    running.gate.close()
    error = _error(running.target, gpu_request({"GPU-1": 0.1}).SerializeToString())
    assert error.code() is grpc.StatusCode.UNAVAILABLE
    _assert_retry_info(error, 1.5)
    assert running.sink.ofu == []


def test_bearer_token_auth() -> None:
    server = _start(auth=BearerAuth("s3cret"))
    payload = gpu_request({"GPU-1": 0.3}).SerializeToString()
    try:
        assert _error(server.target, payload).code() is grpc.StatusCode.UNAUTHENTICATED
        wrong = (("authorization", "Bearer nope"),)
        assert _error(server.target, payload, metadata=wrong).code() is grpc.StatusCode.UNAUTHENTICATED
        assert server.sink.ofu == []
        _export(server.target, payload, metadata=(("authorization", "Bearer s3cret"),))
        assert len(server.sink.ofu) == 1
    finally:
        server.receiver.stop(0)


# --- TLS -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def _tls_export(target: str, credentials: grpc.ChannelCredentials, payload: bytes) -> None:
    with grpc.secure_channel(target, credentials) as channel:
        _raw_call(channel)(payload, timeout=10)


def test_tls(pki: Pki) -> None:
    server = _start(tls=TlsFiles(str(pki.server_cert), str(pki.server_key)))
    try:
        credentials = grpc.ssl_channel_credentials(root_certificates=pki.ca.read_bytes())
        _tls_export(server.target, credentials, gpu_request({"GPU-1": 0.9}).SerializeToString())
        assert server.sink.ofu[0][1] == 0.9
        with pytest.raises(grpc.RpcError), grpc.insecure_channel(server.target) as plain:
            _raw_call(plain)(b"", timeout=5)
    finally:
        server.receiver.stop(0)


def test_mutual_tls_requires_a_client_certificate(pki: Pki) -> None:
    server = _start(tls=TlsFiles(str(pki.server_cert), str(pki.server_key), str(pki.ca)))
    payload = gpu_request({"GPU-1": 0.6}).SerializeToString()
    try:
        anonymous = grpc.ssl_channel_credentials(root_certificates=pki.ca.read_bytes())
        with pytest.raises(grpc.RpcError):
            _tls_export(server.target, anonymous, payload)
        assert server.sink.ofu == []
        mutual = grpc.ssl_channel_credentials(
            pki.ca.read_bytes(), pki.client_key.read_bytes(), pki.client_cert.read_bytes()
        )
        _tls_export(server.target, mutual, payload)
        assert server.sink.ofu[0][1] == 0.6
    finally:
        server.receiver.stop(0)


# --- pass-through ----------------------------------------------------------------------------------


def test_foreign_metrics_pass_through_untouched_to_the_downstream() -> None:
    with OtlpSink.start() as downstream:
        to = OtlpSettings.resolve(protocol="grpc", endpoint=downstream.grpc_endpoint, environ={})
        delivery = Delivery(OtlpClient(to, names.COLLECTOR_EXPORT_REJECTED.name))
        sink = RecordingSink()
        decoder = Decoder(sink)

        def ingest(raw: bytes) -> DecodeOutcome:
            outcome = decoder.decode_bytes(raw)
            if outcome.forward is not None:
                delivery.submit(outcome.forward)
            return outcome

        server = _start(ingest=ingest)
        try:
            foreign = foreign_request()
            _export(server.target, foreign.SerializeToString())
            mixed = gpu_request({"GPU-1": 0.4}, extra_metric="node.cpu.utilization")
            _export(server.target, mixed.SerializeToString())
            assert delivery.pump()
            received = downstream.requests()
            assert received[0] == foreign  # byte-for-byte the same message
            [rm] = received[1].resource_metrics
            assert rm.resource == mixed.resource_metrics[0].resource
            assert [m.name for m in rm.scope_metrics[0].metrics] == ["node.cpu.utilization"]
            assert rm.scope_metrics[0].scope.name == names.INSTRUMENTATION_SCOPE
            assert len(sink.ofu) == 1
        finally:
            server.receiver.stop(0)
            delivery.stop(1)


def test_no_pass_through_and_forward_inputs() -> None:
    mixed = gpu_request({"GPU-1": 0.4}, extra_metric="node.cpu.utilization")
    raw = mixed.SerializeToString()
    assert Decoder(RecordingSink(), pass_through=False).decode(mixed, raw).forward is None
    assert Decoder(RecordingSink(), forward_inputs=True).decode(mixed, raw).forward == raw
    ours_only = gpu_request({"GPU-1": 0.4})
    assert Decoder(RecordingSink()).decode(ours_only).forward is None


# --- adversarial input -----------------------------------------------------------------------------

_values = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
)
_attr_values = st.one_of(
    st.text(max_size=8), st.integers(min_value=-(2**63), max_value=2**63 - 1), st.floats(), st.booleans()
)
_keys = st.sampled_from([*names.IDENTITY_ATTRIBUTES, "other", ""])


@st.composite
def weird_requests(draw: st.DrawFn) -> ExportMetricsServiceRequest:
    request = ExportMetricsServiceRequest()
    for _ in range(draw(st.integers(0, 3))):
        rm = request.resource_metrics.add()
        for key, value in draw(st.lists(st.tuples(_keys, _attr_values), max_size=4)):
            set_attribute(rm.resource.attributes, key, value)
        for _ in range(draw(st.integers(0, 2))):
            sm = rm.scope_metrics.add()
            for _ in range(draw(st.integers(0, 3))):
                metric = sm.metrics.add()
                metric.name = draw(
                    st.sampled_from([names.GPU_OFU.name, names.JOB_MFU.name, names.GPU_CLOCK_SM.name, "x"])
                )
                kind = draw(st.sampled_from(["gauge", "sum", "histogram", "none"]))
                if kind == "histogram":
                    metric.histogram.data_points.add(count=1, time_unix_nano=T0)
                    continue
                if kind == "none":
                    continue
                points = getattr(metric, kind).data_points
                for value in draw(st.lists(_values, max_size=3)):
                    point = points.add(time_unix_nano=draw(st.sampled_from([0, T0, 2**64 - 1])))
                    if isinstance(value, float):
                        point.as_double = value
                    else:
                        point.as_int = value
                    for key, attr in draw(st.lists(st.tuples(_keys, _attr_values), max_size=3)):
                        set_attribute(point.attributes, key, attr)
    return request


def _input_points(request: ExportMetricsServiceRequest) -> int:
    total = 0
    for rm in request.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                kind = metric.WhichOneof("data")
                if metric.name in _AGGREGATED and kind is not None:
                    total += len(getattr(metric, kind).data_points)
    return total


# Every point of these is either taken or refused (the other producer metrics are only consumed).
_AGGREGATED = frozenset({names.GPU_OFU.name, names.JOB_MFU.name, names.GPU_CLOCK_SM.name})


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(weird_requests())
def test_weird_valid_requests_never_corrupt_state(request: ExportMetricsServiceRequest) -> None:
    sink = RecordingSink()
    outcome = Decoder(sink).decode(request, request.SerializeToString())
    assert outcome.accepted + outcome.rejected == _input_points(request)
    clocks = [values[names.GPU_CLOCK_SM.name] for *_, values, _shares in sink.inputs]
    assert outcome.accepted == len(sink.ofu) + len(sink.mfu) + len(clocks)
    low, high = bounds.range_of(names.GPU_CLOCK_SM.name)
    assert all(low <= clock <= high for clock in clocks)
    for key, value, start, end, identity in sink.ofu:
        assert 0.0 <= value <= 1.0
        assert identity[names.HW_ID]
        assert key
        assert 0 < start <= end
    for job, value, time_ns, _ in sink.mfu:
        assert job
        assert math.isfinite(value)
        assert value >= 0
        assert time_ns > 0


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(payload=st.one_of(st.binary(max_size=512), weird_requests().map(lambda r: r.SerializeToString())))
def test_random_bytes_over_grpc_never_crash(running: Running, payload: bytes) -> None:
    before = len(running.sink.ofu)
    code = grpc.StatusCode.OK
    try:
        _export(running.target, payload)
    except grpc.RpcError as error:
        code = error.code()
    assert code in (grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT)
    if code is grpc.StatusCode.INVALID_ARGUMENT:
        assert len(running.sink.ofu) == before
    _export(running.target, gpu_request({"GPU-ok": 0.5}).SerializeToString())
    assert running.sink.ofu[-1][1] == 0.5


# --- lifecycle -------------------------------------------------------------------------------------


def test_a_busy_port_is_one_line_oserror(running: Running) -> None:
    # Without SO_REUSEPORT off, a second receiver would bind too and the two would split the traffic.
    second = GrpcReceiver(Decoder(RecordingSink()).decode_bytes, Gate(), running.target)
    with pytest.raises(OSError, match=f"cannot listen for OTLP/gRPC on {running.target}") as caught:
        second.start()
    assert "\n" not in str(caught.value)
    _export(running.target, gpu_request({"GPU-1": 0.5}).SerializeToString())  # the first one still serves
    assert len(running.sink.ofu) == 1


def test_a_receiver_whose_grpc_stop_never_ends_is_left_to_the_exit_within_its_bound(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A collector told to stop always stops: a gRPC shutdown that never ends (here grpc's stop made to wait forever)
    costs the stop its grace and the margin, said in one line, never the process."""
    import asyncio
    import time

    from otel_ofu_collector.receivers import otlp_grpc

    receiver = GrpcReceiver(Decoder(RecordingSink()).decode_bytes, Gate(), "127.0.0.1:0")
    receiver.start()

    async def never(server: Any, grace: float | None) -> None:
        await asyncio.Event().wait()

    monkeypatch.setattr(otlp_grpc, "_STOP_MARGIN_S", 0.5)
    monkeypatch.setattr(otlp_grpc.GrpcReceiver, "_stop", staticmethod(never))
    began = time.monotonic()
    receiver.stop(grace=0.2)
    assert time.monotonic() - began < 3.0  # grace 0.2 + margin 0.5 (+ the thread's join, 0.5)
    assert [r.getMessage() for r in caplog.records if "did not stop" in r.getMessage()] == [
        "the OTLP/gRPC receiver did not stop within 1 s: leaving it to the exit"
    ]


def test_the_resource_cache_stays_bounded_by_the_live_streams() -> None:
    aggregator = Aggregator(AggregatorConfig())
    decoder = Decoder(aggregator)
    fleet = gpu_request({f"GPU-{i}": 0.5 for i in range(2000)})
    assert decoder.decode(fleet, fleet.SerializeToString()).accepted == 2000
    assert decoder.cached_resources == 2000  # a fleet's Resources all stay cached
    bound = 2 * (aggregator.streams + aggregator.jobs) + 1024
    for batch in range(10):  # Resources that come and go, every point refused: none becomes a live stream
        churn = gpu_request({f"GPU-{batch}-{i}": 2.0 for i in range(1000)}, host=f"gone-{batch}")
        assert decoder.decode(churn, churn.SerializeToString()).rejected == 1000
        assert decoder.cached_resources <= bound
    assert aggregator.streams == 2000
    assert decoder.decode(fleet, fleet.SerializeToString()).accepted == 2000  # cleared, not wrong


def test_a_sink_that_does_not_count_its_streams_gets_the_fixed_cache_bound() -> None:
    decoder = Decoder(RecordingSink(), resource_cache_size=100)
    request = gpu_request({f"GPU-{i}": 0.5 for i in range(250)})
    assert decoder.decode(request, request.SerializeToString()).accepted == 250
    assert decoder.cached_resources == 50  # cleared at 100, twice


# --- the receivers' lifecycle and what they share ---------------------------------------------------------


def test_both_receivers_start_serve_and_stop_through_the_lifecycle_protocol() -> None:
    sink = RecordingSink()
    decoder = Decoder(sink)
    gate = Gate()
    receivers: list[Receiver] = [
        GrpcReceiver(decoder.decode_bytes, gate, "127.0.0.1:0"),
        HttpReceiver(decoder.decode_bytes, gate, "127.0.0.1:0"),
    ]
    ports = {receiver.kind: receiver.start() for receiver in receivers}  # the service's loop
    try:
        assert sorted(ports) == ["grpc", "http"]
        assert all(port > 0 and port == receiver.port for port, receiver in zip(ports.values(), receivers, strict=True))
        _export(f"127.0.0.1:{ports['grpc']}", gpu_request({"GPU-1": 0.5}).SerializeToString())
        connection = http.client.HTTPConnection("127.0.0.1", ports["http"], timeout=10)
        body = gpu_request({"GPU-2": 0.25}).SerializeToString()
        connection.request("POST", "/v1/metrics", body, {"Content-Type": "application/x-protobuf"})
        assert connection.getresponse().status == 200
        connection.close()
        assert [point[1] for point in sink.ofu] == [0.5, 0.25]
    finally:
        for receiver in receivers:
            receiver.stop()
    for port in ports.values():  # each port is free again: a listener of our own can have it
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(("127.0.0.1", port))
            probe.listen()


@pytest.mark.parametrize(
    ("module", "other"),
    [("otlp_http", "otlp_grpc"), ("otlp_grpc", "otlp_http")],
)
def test_neither_receiver_imports_the_other(module: str, other: str) -> None:
    # Before, the HTTP receiver took its Ingest type from the gRPC receiver (and so loaded grpc's server).
    package = "otel_ofu_collector.receivers"
    code = f"import sys, {package}.{module}; print('{package}.{other}' in sys.modules)"
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert found.stdout.strip() == "False"
