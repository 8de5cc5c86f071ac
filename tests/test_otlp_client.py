"""The one OTLP client the producer and the collector share, against real servers on loopback (grpcio and
http.server on 127.0.0.1, port 0): a partial refusal read, counted in each side's self-metrics and said once
per message; the OTLP retry rules (Retry-After in seconds or as an HTTP date, a 400 never retried, a 503
retried then accepted, backoff with jitter); the standard variables read one way by both sides."""

from __future__ import annotations

import http.server
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import ClassVar

import attrs
import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from otel_ofu import names
from otel_ofu.otlp_client import Attempt, Backoff, ExporterConfigError, OtlpClient, OtlpSettings
from otel_ofu.otlp_client.partial import PartialSuccessLog
from otel_ofu.otlp_client.senders import HttpSender
from otel_ofu.producer import Producer
from otel_ofu.producer.exporters import OtlpMetricExporter
from otel_ofu.testing.otlp_requests import gpu_request
from otel_ofu.testing.otlp_sink import OtlpSink, SinkMode
from otel_ofu_collector.outputs.delivery import Delivery
from otel_ofu_collector.service import CollectorService
from tests.collector_helpers import collector_options
from tests.test_producer_export import FakeClock, FakeSource

S = 1_000_000_000
W0 = 1_700_000_040 * S  # a multiple of 60 s: the collector's windows are aligned to the epoch
WINDOW = 60 * S
PROTOCOLS = ["grpc", "http/protobuf"]
COUNTED_IN = "test.rejected"


@pytest.fixture(autouse=True)
def _clean_otel_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("OTEL_"):
            monkeypatch.delenv(key)


@pytest.fixture
def sink() -> Iterator[OtlpSink]:
    with OtlpSink.start(hold_limit_s=20) as started:
        yield started


def client_to(sink: OtlpSink, protocol: str) -> OtlpClient:
    endpoint = sink.grpc_endpoint if protocol == "grpc" else sink.http_endpoint
    return OtlpClient(OtlpSettings.resolve(protocol=protocol, endpoint=endpoint, environ={}), COUNTED_IN)


def request_of(points: Mapping[str, int]) -> bytes:
    """A request holding ``count`` gauge points of each metric ``name``."""
    request = ExportMetricsServiceRequest()
    sm = request.resource_metrics.add().scope_metrics.add()
    for name, count in points.items():
        metric = sm.metrics.add(name=name)
        for index in range(count):
            metric.gauge.data_points.add(time_unix_nano=W0, as_double=index / 10)
    return request.SerializeToString()


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


@attrs.define
class RecordedWaits:
    """The waits between attempts, recorded instead of slept; ``then`` runs at the first."""

    delays: list[float] = attrs.field(factory=list)
    then: Callable[[], None] | None = None

    def __call__(self, seconds: float) -> bool:
        self.delays.append(seconds)
        if self.then is not None:
            self.then()
            self.then = None
        return False  # not stopped


def until(condition: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


# --- partial success ----------------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_partial_refusal_is_read_and_said_once_for_two_alike(
    sink: OtlpSink, caplog: pytest.LogCaptureFixture, protocol: str
) -> None:
    # 10 points: 3 of job.ofu, which this receiver does not take, and 7 of fleet.gpus. It takes the request and
    # answers rejected_data_points = 3. Sent twice: the same refusal, said once; never retried (2 requests).
    sink.refuse_metric("job.ofu")
    client = client_to(sink, protocol)
    payload = request_of({"job.ofu": 3, "fleet.gpus": 7})
    try:
        first, second = client.send(payload), client.send(payload)
    finally:
        client.close()
    assert (first.delivered, first.rejected_points, first.rejection) == (True, 3, "job.ofu is not accepted here")
    assert second == first
    assert len(sink.received) == 2
    assert warnings_of(caplog) == [
        f"{client.endpoint} refused 3 data point(s) of an export: job.ofu is not accepted here"
        f" (counted in {COUNTED_IN}; each message said once)"
    ]


def test_each_distinct_message_is_said_once_up_to_a_bound(caplog: pytest.LogCaptureFixture) -> None:
    said = PartialSuccessLog("downstream d", "c", max_messages=2)
    for message in ("a", "b", "a", "c", "d", "b"):
        said.note(Attempt(True, rejected_points=1, rejection=message))
    said.note(Attempt(True, rejection="a warning"))  # past the bound: counted, not said
    assert warnings_of(caplog) == [
        "downstream d refused 1 data point(s) of an export: a (counted in c; each message said once)",
        "downstream d refused 1 data point(s) of an export: b (counted in c; each message said once)",
        "downstream d: 2 distinct partial-success messages said; further ones are not (the refused points are "
        "still counted in c)",
    ]


def test_a_warning_on_a_request_taken_whole_is_said_once(caplog: pytest.LogCaptureFixture) -> None:
    said = PartialSuccessLog("http://r:4318/v1/metrics", "c")
    for _ in range(2):
        said.note(Attempt(True, rejection="job.ofu is deprecated"))
    said.note(Attempt(True))  # a plain success: nothing to say
    assert warnings_of(caplog) == [
        "http://r:4318/v1/metrics took an export whole with a warning: job.ofu is deprecated (each message said once)"
    ]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_the_producer_counts_the_points_refused_in_its_self_metrics(
    sink: OtlpSink, caplog: pytest.LogCaptureFixture, protocol: str
) -> None:
    # 3 GPUs: each export holds 3 gpu.ofu points, all refused. Three exports: 3 + 3 + 3 = 9 counted; each export
    # carries the count of those before it, so the third says 3 + 3 = 6; the refusal is said once.
    sink.refuse_metric(names.GPU_OFU.name)
    endpoint = sink.grpc_endpoint if protocol == "grpc" else sink.http_endpoint
    exporter = OtlpMetricExporter(OtlpSettings.resolve(protocol=protocol, endpoint=endpoint, environ={}))
    clock = FakeClock()
    producer = Producer(source=FakeSource(gpus=3, clock=clock), exporter=exporter, clock=clock)
    try:
        for _ in range(3):
            producer.run_once()
            assert producer.worker is not None
            assert producer.worker.flush(10)
    finally:
        producer.close()
    assert producer.self_metrics.rejected_points == 9
    reported = [
        point.as_int for _, _, metric in sink.metrics(names.EXPORT_REJECTED.name) for point in metric.sum.data_points
    ]
    assert reported == [3, 6]  # absent from the first export: nothing was refused before it
    refusals = [line for line in warnings_of(caplog) if "refused" in line]
    assert refusals == [
        f"{endpoint} refused 3 data point(s) of an export: gpu.ofu is not accepted here"
        f" (counted in {names.EXPORT_REJECTED.name}; each message said once)"
    ]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_the_collector_counts_a_partial_refusal_of_its_window_export(
    sink: OtlpSink, caplog: pytest.LogCaptureFixture, protocol: str
) -> None:
    # 10 GPUs on 3 jobs (4, 3, 3): a window's export holds one job.ofu point per job, 3, all refused by this
    # downstream. Two windows: 6 counted on the window stream, the refusal said once.
    sink.refuse_metric(names.JOB_OFU.name)
    endpoint = sink.grpc_endpoint if protocol == "grpc" else f"http://127.0.0.1:{sink.http_port}"
    options = collector_options(sink, export_endpoint=endpoint, export_protocol=protocol, pass_through=False)
    service = CollectorService(options, environ={})
    service.start()
    jobs = {f"GPU-{n}": ("job-a" if n < 4 else "job-b" if n < 7 else "job-c", 0.5) for n in range(10)}
    try:
        for window in range(2):
            service.ingest(gpu_request(jobs, time_ns=W0 + window * WINDOW + 30 * S))
            service.flush(W0 + (window + 1) * WINDOW + 10 * S)
            assert until(lambda: service.exports is not None and service.exports.stats.sent == window + 1)  # noqa: B023
        counted = service.self_metrics()[names.COLLECTOR_EXPORT_REJECTED.name]
    finally:
        service.stop(grace=2)
    assert counted == {"windows": 6, "events": 0}  # the flag events refused nothing
    refusals = [line for line in warnings_of(caplog) if "refused" in line]
    assert refusals == [
        f"downstream {sink.http_endpoint if protocol != 'grpc' else endpoint} refused 3 data point(s) of an"
        f" export: job.ofu is not accepted here (counted in {names.COLLECTOR_EXPORT_REJECTED.name}; each message"
        " said once)"
    ]


# --- the retry rules ------------------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_503_is_retried_then_accepted(sink: OtlpSink, protocol: str) -> None:
    # UNAVAILABLE (HTTP 503) without a delay asked: the first backoff, 1 s (draw 0.5: the jitter factor is 1).
    sink.set_mode(SinkMode.UNAVAILABLE)
    client = client_to(sink, protocol)
    waits = RecordedWaits(then=lambda: sink.set_mode(SinkMode.OK))
    try:
        last = client.export(request_of({"fleet.gpus": 1}), 10.0, waits, draw=lambda: 0.5)
    finally:
        client.close()
    assert last is not None
    assert last.delivered
    assert (waits.delays, sink.attempts, len(sink.received)) == ([1.0], 2, 1)


def test_a_400_is_not_retried_by_either_side(sink: OtlpSink) -> None:
    sink.set_mode(SinkMode.REFUSE)  # HTTP 400: the OTLP rules say permanent
    client = client_to(sink, "http/protobuf")
    waits = RecordedWaits()
    last = client.export(request_of({"fleet.gpus": 1}), 10.0, waits)
    assert last is not None
    assert (last.delivered, last.retryable, last.refused) == (False, False, True)
    assert "HTTP 400" in last.cause
    assert (waits.delays, sink.attempts) == ([], 1)
    # The collector's queue drops it, counted, and goes on with the next request.
    delivery = Delivery(client, owns_transport=True)
    delivery.submit(request_of({"fleet.gpus": 1}))
    assert delivery.pump()
    assert (delivery.stats.dropped_rejected, len(delivery.queue), sink.attempts) == (1, 0, 2)
    delivery.stop(0)


@pytest.mark.parametrize("as_date", [False, True])
def test_retry_after_in_seconds_or_as_an_http_date_is_honoured_by_both_sides(sink: OtlpSink, as_date: bool) -> None:
    # 503 with Retry-After: 20, or the HTTP date 20 s from now. A date has whole seconds (and the answer takes
    # its time to arrive): it asks for a little less than 20 s, never more.
    sink.set_mode(SinkMode.UNAVAILABLE, retry_after_s=20.0, as_date=as_date)
    client = client_to(sink, "http/protobuf")
    waits = RecordedWaits(then=lambda: sink.set_mode(SinkMode.OK))
    last = client.export(request_of({"fleet.gpus": 1}), 60.0, waits)
    assert last is not None
    assert last.delivered
    [asked] = waits.delays
    if as_date:
        assert 18.5 < asked <= 20.0
    else:
        assert asked == 20.0
    # The collector's queue waits as long (its own backoff would be 0.5 s).
    sink.set_mode(SinkMode.UNAVAILABLE, retry_after_s=20.0, as_date=as_date)
    delivery = Delivery(client, initial_backoff_s=0.5, max_backoff_s=60.0)
    delivery.submit(request_of({"fleet.gpus": 1}))
    assert not delivery.pump()
    assert 18.5 < delivery.backoff_s <= 20.0 if as_date else delivery.backoff_s == 20.0
    delivery.stop(0)


def test_the_backoff_doubles_with_jitter_up_to_its_cap() -> None:
    backoff = Backoff(initial_s=0.5, max_s=30.0, jitter=0.2)
    # Draw 0.5: factor 1; 0.5 s doubled after each failure in a row, capped at 30 s.
    assert [backoff.delay(n, None, 0.5) for n in range(1, 8)] == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0]
    assert backoff.delay(1, None, 0.0) == pytest.approx(0.4)  # factor 1 - 0.2
    assert backoff.delay(2, None, 0.75) == pytest.approx(1.1)  # 1 s x (1 + 0.2 x 0.5)
    assert backoff.delay(100_000, None, 0.5) == 30.0  # days of failures: still the cap, no overflow
    assert backoff.delay(3, 7.0, 0.9) == 7.0  # the receiver's delay instead, without jitter
    assert backoff.delay(3, 90.0, 0.5) == 30.0  # and never past the cap


def test_the_collector_backs_off_with_jitter() -> None:
    # Two collectors that lost the same downstream: draws 0 and 0.75 wait 0.4 s and 0.6 s, not both 0.5 s.
    waits = []
    for draw in (0.0, 0.75):
        delivery = Delivery(Down(), initial_backoff_s=0.5, jitter=lambda draw=draw: draw)  # type: ignore[misc]
        delivery.submit(b"w1")
        assert not delivery.pump()
        waits.append(delivery.backoff_s)
        delivery.stop(0)
    assert waits == [pytest.approx(0.4), pytest.approx(0.55)]


@attrs.define
class Down:
    def send(self, payload: bytes) -> Attempt:
        return Attempt(False, True, cause="UNAVAILABLE: down")

    def close(self) -> None:
        return None


def test_a_setting_only_a_change_cures_is_kept_by_the_collector_and_not_retried_by_the_producer(
    sink: OtlpSink,
) -> None:
    # OTLP/HTTP to the gRPC port: it answers HTTP/2. No retry within an export cures that; the collector keeps the
    # window (the spool holds it until the setting is fixed) and names its own option.
    endpoint = f"http://127.0.0.1:{sink.grpc_port}/v1/metrics"
    settings = OtlpSettings.resolve(
        protocol="http/protobuf", endpoint=endpoint, environ={}, protocol_option="--export-protocol"
    )
    client = OtlpClient(settings, COUNTED_IN)
    waits = RecordedWaits()
    last = client.export(request_of({"fleet.gpus": 1}), 10.0, waits)
    assert last is not None
    assert (last.misconfigured, last.refused) == (True, False)
    assert waits.delays == []
    delivery = Delivery(client, initial_backoff_s=0.5, jitter=lambda: 0.5)
    delivery.submit(request_of({"fleet.gpus": 1}))
    assert not delivery.pump()
    assert (len(delivery.queue), delivery.stats.dropped_rejected, delivery.backoff_s) == (1, 0, 0.5)
    assert "--export-protocol grpc (OTEL_EXPORTER_OTLP_PROTOCOL=grpc)" in delivery.stats.last_error
    delivery.stop(0)


# --- one reading of the standard variables --------------------------------------------------------------


def downstream_of(environ: Mapping[str, str], **overrides: object) -> OtlpSettings:
    """The settings a collector resolves for its downstream."""
    options = collector_options(None, **{"export_endpoint": None, **overrides})
    service = CollectorService(options, environ=environ)
    assert isinstance(service.transport, OtlpClient)
    service.transport.close()
    return service.transport.settings


def test_the_collector_reads_the_standard_variables_as_the_producer_does() -> None:
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4317",  # HOST:PORT: TLS unless ..._INSECURE=true
        "OTEL_EXPORTER_OTLP_TIMEOUT": "9",
        "OTEL_EXPORTER_OTLP_METRICS_TIMEOUT": "2.5",  # the signal's own wins over the generic one
        "OTEL_EXPORTER_OTLP_COMPRESSION": "deflate",
        "OTEL_EXPORTER_OTLP_HEADERS": "x-tenant=ml%20ops",
    }
    collector = downstream_of(env)
    producer = OtlpSettings.resolve(environ=env)
    assert attrs.evolve(collector, protocol_option=producer.protocol_option) == producer
    assert (collector.endpoint, collector.grpc_target, collector.tls) == ("collector:4317", "collector:4317", True)
    assert (collector.timeout_s, collector.compression) == (2.5, "deflate")
    assert collector.headers == (("x-tenant", "ml ops"),)
    assert not downstream_of(env | {"OTEL_EXPORTER_OTLP_INSECURE": "true"}).tls


def test_the_collectors_options_win_over_the_variables() -> None:
    env = {"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://m:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}
    chosen = downstream_of(env, export_endpoint="http://option:4318", export_protocol="http/protobuf")
    assert (chosen.protocol, chosen.endpoint) == ("http/protobuf", "http://option:4318/v1/metrics")


@pytest.mark.parametrize(
    ("variable", "value", "says"),
    [
        ("OTEL_EXPORTER_OTLP_TIMEOUT", "soon", "OTEL_EXPORTER_OTLP_TIMEOUT='soon' is not a number of seconds"),
        ("OTEL_EXPORTER_OTLP_COMPRESSION", "brotli", "OTEL_EXPORTER_OTLP_COMPRESSION='brotli' is not supported"),
        ("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "not a url", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"),
    ],
)
def test_a_bad_variable_stops_the_collector_in_one_line(variable: str, value: str, says: str) -> None:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://d:4317", variable: value}
    with pytest.raises(ExporterConfigError) as raised:
        downstream_of(env)
    assert says in str(raised.value)
    assert "\n" not in str(raised.value)


class _Proxy(http.server.BaseHTTPRequestHandler):
    """An HTTP forward proxy that answers every request itself: a 200 with an empty ExportMetricsServiceResponse,
    keeping the target it was asked for (a proxy is asked for the absolute URL)."""

    targets: ClassVar[list[str]] = []

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.targets.append(self.path)
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.mark.parametrize("bypassed", [False, True], ids=["through-the-proxy", "no_proxy"])
def test_the_http_sender_goes_through_the_proxy_the_environment_names(
    sink: OtlpSink, monkeypatch: pytest.MonkeyPatch, bypassed: bool
) -> None:
    """``HTTP_PROXY`` as requests reads it (read once per session now, not at every send): each of three sends goes
    through the proxy, and none where ``NO_PROXY`` names the host."""
    _Proxy.targets = []
    proxy = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Proxy)
    thread = threading.Thread(target=proxy.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{proxy.server_address[1]}")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1" if bypassed else "")
    sender = HttpSender(OtlpSettings.resolve(protocol="http/protobuf", endpoint=sink.http_endpoint, environ={}))
    try:
        attempts = [sender.send(gpu_request({"GPU-1": 0.5}).SerializeToString(), 5.0) for _ in range(3)]
    finally:
        sender.close()
        proxy.shutdown()
        proxy.server_close()
    assert [attempt.delivered for attempt in attempts] == [True, True, True]
    assert _Proxy.targets == ([] if bypassed else [sink.http_endpoint] * 3)
    assert len(sink.requests()) == (3 if bypassed else 0)
