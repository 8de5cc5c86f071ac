"""The producer's own OTLP exporter: settings from the standard variables, retries as OTLP specifies, TLS,
and one line with the likely cause when exporting fails, against the real loopback sink (gRPC and HTTP)."""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest
from opentelemetry.sdk.metrics import Counter, Histogram, ObservableCounter, UpDownCounter
from opentelemetry.sdk.metrics.export import AggregationTemporality, MetricExportResult, MetricsData
from opentelemetry.sdk.metrics.view import ExponentialBucketHistogramAggregation

from otel_ofu import __version__
from otel_ofu.model import GpuIdentity, GpuReading, Snapshot
from otel_ofu.otlp_client import ExporterConfigError, OtlpSettings, retry_after_s
from otel_ofu.otlp_client.failures import probe
from otel_ofu.producer import MetricsDataBuilder, compute_snapshot, env_resource
from otel_ofu.producer.exporters import ExportHealth, OtlpMetricExporter
from otel_ofu.producer.preferences import preferred_aggregation, preferred_temporality
from otel_ofu.testing.otlp_sink import OtlpSink, SinkMode, unused_port
from otel_ofu.testing.pki import Pki

SECOND = 1_000_000_000
GPU = GpuIdentity(uuid="GPU-a", model="NVIDIA H100 80GB HBM3", index=0, host="node-1")


@pytest.fixture(autouse=True)
def _clean_otel_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("OTEL_"):
            monkeypatch.delenv(key)


@pytest.fixture
def sink() -> Iterator[OtlpSink]:
    with OtlpSink.start(hold_limit_s=20) as started:
        yield started


def data() -> MetricsData:
    reading = GpuReading(GPU, 10 * SECOND, 20 * SECOND, tensor_active=0.5, sm_clock_hz=1.5e9, max_sm_clock_hz=1.98e9)
    return MetricsDataBuilder(base=env_resource("node-1")).build(compute_snapshot(Snapshot((reading,))))


@attrs.define
class RecordedWaits:
    """The exporter's wait between attempts, recorded instead of slept; ``then`` runs at the first wait."""

    delays: list[float] = attrs.field(factory=list)
    then: object = None

    def __call__(self, seconds: float) -> bool:
        self.delays.append(round(seconds, 6))
        if callable(self.then):
            self.then()
            self.then = None
        return False  # not shut down


def exporter(
    endpoint: str, protocol: str = "grpc", timeout_s: float | None = None
) -> tuple[OtlpMetricExporter, RecordedWaits]:
    waits = RecordedWaits()
    settings = OtlpSettings.resolve(protocol=protocol, endpoint=endpoint, timeout_s=timeout_s)
    # jitter() = 0.5 makes the backoff factor exactly 1: delays of 1, 2, 4 ... s.
    return OtlpMetricExporter(settings, wait=waits, jitter=lambda: 0.5), waits


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


# --- settings ---------------------------------------------------------------------------------------


def test_settings_follow_the_standard_variables() -> None:
    grpc_default = OtlpSettings.resolve(environ={})
    assert (grpc_default.protocol, grpc_default.endpoint, grpc_default.grpc_target) == (
        "grpc",
        "http://localhost:4317",
        "localhost:4317",
    )
    assert (grpc_default.tls, grpc_default.timeout_s, grpc_default.headers, grpc_default.compression) == (
        False,
        10.0,
        (),
        None,
    )
    assert OtlpSettings.resolve(protocol="http/protobuf", environ={}).endpoint == "http://localhost:4318/v1/metrics"
    base = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://gw:4318/otlp"}
    # The generic endpoint gets the signal's path, even after a path of its own; the metrics one is used as is.
    assert OtlpSettings.resolve(protocol="http/protobuf", environ=base).endpoint == "http://gw:4318/otlp/v1/metrics"
    own = base | {"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://gw:9999/custom"}
    assert OtlpSettings.resolve(protocol="http/protobuf", environ=own).endpoint == "http://gw:9999/custom"
    assert OtlpSettings.resolve(environ=own).endpoint == "http://gw:9999/custom"
    # An option's endpoint gets /v1/metrics only when it has no path.
    assert OtlpSettings.resolve(protocol="http/protobuf", endpoint="http://c:4318", environ={}).endpoint == (
        "http://c:4318/v1/metrics"
    )


@pytest.mark.parametrize(
    ("endpoint", "insecure", "tls"),
    [
        ("collector:4317", None, True),  # no scheme: TLS unless told otherwise (the specification's default)
        ("collector:4317", "true", False),
        ("collector:4317", "false", True),
        ("https://collector:4317", "true", True),  # a scheme decides; ..._INSECURE applies only without one
        ("http://collector:4317", "false", False),
    ],
)
def test_grpc_tls_follows_the_scheme_then_the_insecure_variable(endpoint: str, insecure: str | None, tls: bool) -> None:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint} | ({"OTEL_EXPORTER_OTLP_INSECURE": insecure} if insecure else {})
    settings = OtlpSettings.resolve(environ=env)
    assert settings.tls is tls
    assert settings.grpc_target == "collector:4317"


def test_headers_timeout_and_compression_from_the_variables() -> None:
    env = {
        "OTEL_EXPORTER_OTLP_HEADERS": "x-generic=1",
        "OTEL_EXPORTER_OTLP_METRICS_HEADERS": "Authorization=Bearer%20s3cret,X-Tenant=ml",
        "OTEL_EXPORTER_OTLP_TIMEOUT": "2.5",
        "OTEL_EXPORTER_OTLP_METRICS_COMPRESSION": "GZIP",
    }
    settings = OtlpSettings.resolve(headers={"X-Tenant": "ops"}, environ=env)
    # The metrics variable replaces the generic one (as the SDK reads it); an option's header wins over both.
    assert dict(settings.headers) == {"authorization": "Bearer s3cret", "x-tenant": "ops"}
    assert (settings.timeout_s, settings.compression) == (2.5, "gzip")
    assert OtlpSettings.resolve(environ={"OTEL_EXPORTER_OTLP_COMPRESSION": "none"}).compression is None


@pytest.mark.parametrize(
    ("variable", "value", "says"),
    [
        ("OTEL_EXPORTER_OTLP_TIMEOUT", "soon", "OTEL_EXPORTER_OTLP_TIMEOUT='soon' is not a number"),
        ("OTEL_EXPORTER_OTLP_METRICS_TIMEOUT", "-1", "positive"),
        ("OTEL_EXPORTER_OTLP_COMPRESSION", "brotli", "OTEL_EXPORTER_OTLP_COMPRESSION='brotli' is not supported"),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json", "http/json"),
        ("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "not a url", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"),
    ],
)
def test_a_bad_variable_is_one_line_before_anything_runs(variable: str, value: str, says: str) -> None:
    with pytest.raises(ExporterConfigError) as raised:
        OtlpSettings.resolve(environ={variable: value})
    assert says in str(raised.value)
    assert "\n" not in str(raised.value)


def test_a_missing_certificate_file_is_a_config_error(tmp_path: Path) -> None:
    missing = str(tmp_path / "ca.pem")
    settings = OtlpSettings.resolve(endpoint="https://c:4317", environ={"OTEL_EXPORTER_OTLP_CERTIFICATE": missing})
    with pytest.raises(ExporterConfigError, match="cannot read the certificate"):
        OtlpMetricExporter(settings)


def test_temporality_and_histogram_preferences_as_the_otlp_exporters_read_them() -> None:
    cumulative, delta = AggregationTemporality.CUMULATIVE, AggregationTemporality.DELTA
    chosen = preferred_temporality({"OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE": "DELTA"})
    assert [chosen[kind] for kind in (Counter, UpDownCounter, Histogram, ObservableCounter)] == [
        delta,
        cumulative,  # an up-down counter's delta would lose its level
        delta,
        delta,
    ]
    low = preferred_temporality({"OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE": "lowmemory"})
    assert (low[Counter], low[ObservableCounter]) == (delta, cumulative)
    assert set(preferred_temporality({}).values()) == {cumulative}
    exponential = {"OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION": "base2_exponential_bucket_histogram"}
    assert isinstance(preferred_aggregation(exponential)[Histogram], ExponentialBucketHistogramAggregation)


# --- delivery and retries -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("protocol", "compression"),
    [("grpc", "gzip"), ("grpc", "deflate"), ("http/protobuf", "gzip"), ("http/protobuf", "deflate")],
)
def test_delivered_with_the_user_agent_headers_and_compression(
    sink: OtlpSink, monkeypatch: pytest.MonkeyPatch, protocol: str, compression: str
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_HEADERS", "x-tenant=ml")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_COMPRESSION", compression)
    endpoint = sink.grpc_endpoint if protocol == "grpc" else sink.http_endpoint
    otlp, _ = exporter(endpoint, protocol)
    try:
        assert otlp.export(data()) is MetricExportResult.SUCCESS
    finally:
        otlp.shutdown()
    (received,) = sink.received
    assert received.metadata["x-tenant"] == "ml"
    assert received.metadata["user-agent"].startswith(f"otel-ofu/{__version__}")
    if protocol == "http/protobuf":
        assert received.metadata["content-encoding"] == compression  # the sink decompressed it to parse it
    points = received.request.resource_metrics[0].scope_metrics[0].metrics[0].gauge.data_points
    assert (points[0].start_time_unix_nano, points[0].time_unix_nano) == (10 * SECOND, 20 * SECOND)


@pytest.mark.parametrize(("protocol", "delay"), [("grpc", 0.25), ("http/protobuf", 2.0)])
def test_a_retry_waits_as_long_as_the_receiver_asks(sink: OtlpSink, protocol: str, delay: float) -> None:
    # gRPC RetryInfo of 0.25 s, HTTP Retry-After: 2: the exporter waits exactly that, not its own backoff (1 s).
    sink.set_mode(SinkMode.UNAVAILABLE, retry_after_s=delay)
    endpoint = sink.grpc_endpoint if protocol == "grpc" else sink.http_endpoint
    otlp, waits = exporter(endpoint, protocol)
    waits.then = lambda: sink.set_mode(SinkMode.OK)
    try:
        assert otlp.export(data()) is MetricExportResult.SUCCESS
    finally:
        otlp.shutdown()
    assert waits.delays == [delay]
    assert (sink.attempts, len(sink.received)) == (2, 1)


def test_the_backoff_doubles_within_the_export_timeout(sink: OtlpSink) -> None:
    # No retry delay from the receiver: 1, 2, 4, 8 s (jitter 0); the next, 16 s, is past the 10 s timeout, so
    # the export ends after 5 attempts. With jitter() = 0 the factor is 0.8: 0.8, 1.6, 3.2, 6.4 (12.8 > 10).
    sink.set_mode(SinkMode.UNAVAILABLE)
    otlp, waits = exporter(sink.grpc_endpoint)
    assert otlp.export(data()) is MetricExportResult.FAILURE
    assert (waits.delays, sink.attempts) == ([1, 2, 4, 8], 5)
    low = OtlpMetricExporter(otlp.settings, wait=(low_waits := RecordedWaits()), jitter=lambda: 0.0)
    assert low.export(data()) is MetricExportResult.FAILURE
    assert low_waits.delays == [0.8, 1.6, 3.2, 6.4]
    # With time to spare, six attempts at most, as the SDK's exporters make: waits 1, 2, 4, 8, 16.
    patient, patient_waits = exporter(sink.grpc_endpoint, timeout_s=100.0)
    assert patient.export(data()) is MetricExportResult.FAILURE
    assert patient_waits.delays == [1, 2, 4, 8, 16]
    for each in (otlp, low, patient):
        each.shutdown()


def test_resource_exhausted_is_retried_only_with_retry_info(sink: OtlpSink) -> None:
    # The OTLP specification: RESOURCE_EXHAUSTED is retryable only when the server says when to come back.
    sink.set_mode(SinkMode.EXHAUSTED)
    otlp, waits = exporter(sink.grpc_endpoint)
    assert otlp.export(data()) is MetricExportResult.FAILURE
    assert (waits.delays, sink.attempts) == ([], 1)
    sink.set_mode(SinkMode.EXHAUSTED, retry_after_s=0.5)
    waits.then = lambda: sink.set_mode(SinkMode.OK)
    assert otlp.export(data()) is MetricExportResult.SUCCESS
    assert waits.delays == [0.5]
    otlp.shutdown()


@pytest.mark.parametrize(
    ("protocol", "says"),
    [
        ("grpc", "the receiver refused the request (INVALID_ARGUMENT: sink scripted to answer refuse)"),
        ("http/protobuf", "the receiver refused the request (HTTP 400: sink scripted to answer refuse)"),
    ],
)
def test_a_permanent_refusal_is_one_attempt_and_one_line(
    sink: OtlpSink, caplog: pytest.LogCaptureFixture, protocol: str, says: str
) -> None:
    sink.set_mode(SinkMode.REFUSE)
    endpoint = sink.grpc_endpoint if protocol == "grpc" else sink.http_endpoint
    otlp, waits = exporter(endpoint, protocol)
    assert otlp.export(data()) is MetricExportResult.FAILURE
    otlp.shutdown()
    assert (waits.delays, sink.attempts) == ([], 1)
    assert warnings_of(caplog) == [
        f"cannot export to {endpoint} ({protocol}): {says} (sampling goes on; each export is tried again as it comes)"
    ]


def test_a_partial_success_is_said_and_counts_as_delivered(sink: OtlpSink, caplog: pytest.LogCaptureFixture) -> None:
    sink.reject_points(3)
    otlp, _ = exporter(sink.grpc_endpoint)
    assert otlp.export(data()) is MetricExportResult.SUCCESS
    otlp.shutdown()
    assert warnings_of(caplog) == [
        f"{sink.grpc_endpoint} refused 3 data point(s) of an export: sink scripted to reject 3 point(s)"
        " (counted in otel_ofu.export.rejected; each message said once)"
    ]


def test_a_retry_after_date_is_the_time_until_it() -> None:
    now = 1_700_000_000.0  # 2023-11-14 22:13:20 UTC
    assert retry_after_s("Tue, 14 Nov 2023 22:13:50 GMT", now=now) == 30.0
    assert retry_after_s("7", now=now) == 7.0
    assert retry_after_s("Tue, 14 Nov 2023 22:13:00 GMT", now=now) == 0.0  # already past: at once
    assert retry_after_s("soon", now=now) is None


# --- TLS ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_tls_and_mutual_tls_from_the_certificate_variables(
    pki: Pki, monkeypatch: pytest.MonkeyPatch, protocol: str
) -> None:
    with OtlpSink.start(tls=pki, mutual=True) as tls_sink:
        endpoint = tls_sink.grpc_endpoint if protocol == "grpc" else tls_sink.http_endpoint
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_CERTIFICATE", str(pki.ca))
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_CLIENT_KEY", str(pki.client_key))
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_CLIENT_CERTIFICATE", str(pki.client_cert))
        otlp, _ = exporter(endpoint, protocol)
        try:
            assert otlp.settings.tls
            assert otlp.export(data()) is MetricExportResult.SUCCESS
        finally:
            otlp.shutdown()
        assert len(tls_sink.received) == 1


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_an_untrusted_certificate_says_which_variable_trusts_it(
    pki: Pki, caplog: pytest.LogCaptureFixture, protocol: str
) -> None:
    with OtlpSink.start(tls=pki) as tls_sink:
        endpoint = tls_sink.grpc_endpoint if protocol == "grpc" else tls_sink.http_endpoint
        otlp, waits = exporter(endpoint, protocol)
        assert otlp.export(data()) is MetricExportResult.FAILURE
        otlp.shutdown()
    (line,) = warnings_of(caplog)
    assert "its TLS certificate is not trusted: give its CA in OTEL_EXPORTER_OTLP_CERTIFICATE" in line
    assert waits.delays == []  # no retry cures it


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_tls_to_a_plain_text_port_and_plain_text_to_a_tls_port(
    sink: OtlpSink, pki: Pki, caplog: pytest.LogCaptureFixture, protocol: str
) -> None:
    port = sink.grpc_port if protocol == "grpc" else sink.http_port
    otlp, _ = exporter(f"https://127.0.0.1:{port}", protocol)
    assert otlp.export(data()) is MetricExportResult.FAILURE
    otlp.shutdown()
    with OtlpSink.start(tls=pki) as tls_sink:
        tls_port = tls_sink.grpc_port if protocol == "grpc" else tls_sink.http_port
        plain, _ = exporter(f"http://127.0.0.1:{tls_port}", protocol)
        assert plain.export(data()) is MetricExportResult.FAILURE
        plain.shutdown()
    first, second = warnings_of(caplog)
    assert "the TLS handshake failed: the port seems to speak plain text; use an http:// endpoint" in first
    assert "it speaks TLS and this exporter plain text: use an https:// endpoint" in second


# --- the likely cause, said once ------------------------------------------------------------------------


def test_grpc_to_an_otlp_http_port_says_which_protocol_to_use(sink: OtlpSink, caplog: pytest.LogCaptureFixture) -> None:
    endpoint = f"http://127.0.0.1:{sink.http_port}"
    otlp, waits = exporter(endpoint)
    for _ in range(3):
        assert otlp.export(data()) is MetricExportResult.FAILURE
    otlp.shutdown()
    (line,) = warnings_of(caplog)  # once, not per export
    assert line.startswith(f"cannot export to {endpoint} (grpc): it answers in HTTP/1.1, not gRPC")
    assert "--protocol http/protobuf (OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf)" in line
    assert waits.delays == []  # a wrong protocol is not retried within an export
    assert not [r for r in caplog.records if r.name.startswith("opentelemetry")]


def test_http_to_an_otlp_grpc_port_says_which_protocol_to_use(sink: OtlpSink, caplog: pytest.LogCaptureFixture) -> None:
    endpoint = f"http://127.0.0.1:{sink.grpc_port}/v1/metrics"
    otlp, _ = exporter(endpoint, "http/protobuf")
    for _ in range(3):
        assert otlp.export(data()) is MetricExportResult.FAILURE
    otlp.shutdown()
    (line,) = warnings_of(caplog)
    assert line.startswith(f"cannot export to {endpoint} (http/protobuf): it answers in HTTP/2, as a gRPC server does")
    assert "--protocol grpc (OTEL_EXPORTER_OTLP_PROTOCOL=grpc)" in line
    assert "\\x00" not in line
    assert "BadStatusLine" not in line


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_nothing_listening_is_said_once_with_the_endpoint(caplog: pytest.LogCaptureFixture, protocol: str) -> None:
    endpoint = f"http://127.0.0.1:{unused_port()}"
    otlp, waits = exporter(endpoint, protocol)
    for _ in range(3):
        assert otlp.export(data()) is MetricExportResult.FAILURE
    otlp.shutdown()
    (line,) = warnings_of(caplog)
    shown = endpoint if protocol == "grpc" else endpoint + "/v1/metrics"
    assert line.startswith(f"cannot export to {shown} ({protocol}): nothing is listening there (connection refused)")
    assert len(waits.delays) == 3 * 4  # retried as the specification says: the collector may be restarting
    assert "behind" not in caplog.text


def test_failing_then_recovering_is_two_lines(sink: OtlpSink, caplog: pytest.LogCaptureFixture) -> None:
    sink.set_mode(SinkMode.UNAVAILABLE)
    otlp, _ = exporter(sink.grpc_endpoint, timeout_s=1.0)  # 1 s: one retry (after 1 s) per export
    for _ in range(3):
        assert otlp.export(data()) is MetricExportResult.FAILURE
    sink.set_mode(SinkMode.OK)
    assert otlp.export(data()) is MetricExportResult.SUCCESS
    assert otlp.export(data()) is MetricExportResult.SUCCESS
    otlp.shutdown()
    endpoint = f"{sink.grpc_endpoint} (grpc)"
    assert warnings_of(caplog) == [
        f"cannot export to {endpoint}: the receiver is unavailable (UNAVAILABLE: sink scripted to answer unavailable)"
        " (sampling goes on; each export is tried again as it comes)",
        f"exporting to {endpoint} works again (3 exports lost while it failed)",
    ]


def test_a_changed_cause_is_said_at_most_once_a_minute(caplog: pytest.LogCaptureFixture) -> None:
    now = [1000.0]
    health = ExportHealth("http://c:4317 (grpc)", clock=lambda: now[0])
    health.export_failed("cause A")  # said
    now[0] += 10
    health.export_failed("cause B")  # a change 10 s later: quiet
    health.export_failed("cause B")
    now[0] += 55
    health.export_failed("cause B")  # 65 s after the first line: said
    health.export_failed("cause B")  # the same: quiet
    assert health.failing
    health.export_delivered()
    assert not health.failing
    tail = " (sampling goes on; each export is tried again as it comes)"
    assert warnings_of(caplog) == [
        "cannot export to http://c:4317 (grpc): cause A" + tail,
        "cannot export to http://c:4317 (grpc): cause B" + tail,
        "exporting to http://c:4317 (grpc) works again (5 exports lost while it failed)",
    ]


def test_the_probe_tells_http2_from_http1_and_tls(sink: OtlpSink, pki: Pki) -> None:
    assert probe(f"127.0.0.1:{sink.grpc_port}") == "http2"
    assert probe(f"127.0.0.1:{sink.http_port}") == "http1"
    with OtlpSink.start(tls=pki) as tls_sink:
        assert probe(f"127.0.0.1:{tls_sink.http_port}") == "tls"
        assert probe(f"127.0.0.1:{tls_sink.grpc_port}") == "tls"
    assert probe(f"127.0.0.1:{unused_port()}") is None


def test_http_to_a_grpc_port_that_resets_the_connection_is_told_by_the_probe(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Go's gRPC server (the OpenTelemetry Collector's) resets an HTTP/1.1 request rather than answer it; this
    # server does the same: it reads the request, then closes with a reset. Asked again with an HTTP/2 preface,
    # it answers as HTTP/2 does, with a SETTINGS frame.
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                connection, _ = listener.accept()
            except OSError:
                return
            with connection:
                first = connection.recv(64)
                if first.startswith(b"PRI * HTTP/2.0"):
                    connection.sendall(b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")
                else:
                    connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    try:
        otlp, _ = exporter(f"http://127.0.0.1:{port}/v1/metrics", "http/protobuf")
        assert otlp.export(data()) is MetricExportResult.FAILURE
        otlp.shutdown()
    finally:
        stop.set()
        listener.close()
    (line,) = warnings_of(caplog)
    assert "it answers in HTTP/2, as a gRPC server does" in line


# --- shutdown -------------------------------------------------------------------------------------------


def test_shutdown_ends_a_wait_between_retries_at_once(sink: OtlpSink) -> None:
    # The receiver asks for a minute between attempts: shutdown must not wait for it.
    sink.set_mode(SinkMode.UNAVAILABLE, retry_after_s=60.0)
    settings = attrs.evolve(OtlpSettings.resolve(endpoint=sink.grpc_endpoint), timeout_s=120.0)
    otlp = OtlpMetricExporter(settings)
    results: list[MetricExportResult] = []
    exporting = threading.Thread(target=lambda: results.append(otlp.export(data())))
    exporting.start()
    assert sink.wait_for(lambda s: s.attempts == 1)
    otlp.shutdown()
    exporting.join(timeout=5)  # far under the minute asked for
    assert not exporting.is_alive()
    assert results == [MetricExportResult.FAILURE]
    assert otlp.export(data()) is MetricExportResult.FAILURE  # after shutdown, nothing is sent
    assert sink.attempts == 1


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_no_answer_within_the_timeout_names_the_timeout(
    sink: OtlpSink, caplog: pytest.LogCaptureFixture, protocol: str
) -> None:
    sink.set_mode(SinkMode.HOLD)  # takes the request and answers nothing (for up to 20 s)
    endpoint = sink.grpc_endpoint if protocol == "grpc" else sink.http_endpoint
    otlp, waits = exporter(endpoint, protocol, timeout_s=0.3)
    assert otlp.export(data()) is MetricExportResult.FAILURE
    otlp.shutdown()
    sink.set_mode(SinkMode.OK)
    (line,) = warnings_of(caplog)
    assert "no answer within the export timeout (0.3 s, OTEL_EXPORTER_OTLP_TIMEOUT)" in line
    assert waits.delays == []  # the first backoff (1 s) is past the 0.3 s timeout
