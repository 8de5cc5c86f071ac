"""A real OTLP metrics receiver on loopback for tests, the demo and benchmarks (and logs: the collector's flag events).

gRPC (opentelemetry-proto's MetricsService and LogsService) and OTLP/HTTP protobuf (``POST /v1/metrics``,
``/v1/logs``), both on
127.0.0.1 with a free port, optionally over TLS (``start(tls=pki)``, mutual when the PKI's CA is to check
clients). Every request is kept with its metadata/headers. The failure mode can be scripted so failure
tests exercise the real exporters: ``UNAVAILABLE`` (HTTP 503), ``EXHAUSTED`` (RESOURCE_EXHAUSTED, HTTP
429), ``REFUSE`` (a permanent INVALID_ARGUMENT, HTTP 400) or ``HOLD`` (the handler waits until released,
like a stalled backend), each optionally with a retry delay (gRPC RetryInfo in the standard status details
and the ``google.rpc.retryinfo-bin`` trailer, HTTP ``Retry-After`` in seconds or as an HTTP date).
``reject_points`` makes an accepted request's response report a partial success, ``refuse_metric`` one that
refuses every point of a metric the request holds (as a backend that does not take a metric would). For a
backend that refuses connections, point the exporter at ``unused_port()``.
"""

from __future__ import annotations

import email.utils
import enum
import gzip
import socket
import ssl
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import attrs
import grpc
from google.protobuf import any_pb2, duration_pb2, json_format
from google.rpc import code_pb2, error_details_pb2, status_pb2  # type: ignore[import-untyped]
from grpc_status import rpc_status
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2, logs_service_pb2_grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc

from otel_ofu.testing.pki import Pki


class SinkMode(enum.Enum):
    OK = "ok"
    UNAVAILABLE = "unavailable"  # gRPC UNAVAILABLE, HTTP 503
    EXHAUSTED = "exhausted"  # gRPC RESOURCE_EXHAUSTED, HTTP 429
    REFUSE = "refuse"  # a permanent refusal: gRPC INVALID_ARGUMENT, HTTP 400
    HOLD = "hold"  # the handler blocks until the mode changes or the sink closes


# The failure modes' answers: gRPC status (and google.rpc code), HTTP status.
_FAILURES = {
    SinkMode.UNAVAILABLE: (grpc.StatusCode.UNAVAILABLE, code_pb2.UNAVAILABLE, 503),
    SinkMode.EXHAUSTED: (grpc.StatusCode.RESOURCE_EXHAUSTED, code_pb2.RESOURCE_EXHAUSTED, 429),
    SinkMode.REFUSE: (grpc.StatusCode.INVALID_ARGUMENT, code_pb2.INVALID_ARGUMENT, 400),
}


@attrs.frozen
class Received:
    request: Any  # ExportMetricsServiceRequest
    metadata: dict[str, str]  # gRPC metadata or HTTP headers, keys lower-cased
    transport: str  # "grpc" or "http"


def unused_port() -> int:
    """A loopback port nothing listens on (bound, then released), for a backend that refuses."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


@attrs.define
class OtlpSink:
    """Start with ``OtlpSink.start()``; ``grpc_endpoint`` and ``http_endpoint`` say where to send."""

    hold_limit_s: float = 30.0
    tls: Pki | None = None
    # With tls: require a client certificate signed by the PKI's CA.
    mutual: bool = False
    received: list[Received] = attrs.field(factory=list, init=False)
    logs_received: list[Received] = attrs.field(factory=list, init=False)  # ExportLogsServiceRequests, apart
    attempts: int = attrs.field(default=0, init=False)  # metrics requests (logs are answered alike, not counted)
    mode: SinkMode = attrs.field(default=SinkMode.OK, init=False)
    retry_after_s: float | None = attrs.field(default=None, init=False)
    retry_after_date: bool = attrs.field(default=False, init=False)  # HTTP Retry-After as a date, not seconds
    rejected_points: int = attrs.field(default=0, init=False)
    refused_metric: str | None = attrs.field(default=None, init=False)
    _cond: threading.Condition = attrs.field(factory=threading.Condition, init=False)
    _closed: bool = attrs.field(default=False, init=False)
    _grpc: grpc.Server | None = attrs.field(default=None, init=False)
    _http: ThreadingHTTPServer | None = attrs.field(default=None, init=False)
    grpc_port: int = attrs.field(default=0, init=False)
    http_port: int = attrs.field(default=0, init=False)

    @classmethod
    def start(cls, hold_limit_s: float = 30.0, tls: Pki | None = None, mutual: bool = False) -> OtlpSink:
        sink = cls(hold_limit_s=hold_limit_s, tls=tls, mutual=mutual)
        sink._start_grpc()
        sink._start_http()
        return sink

    @property
    def scheme(self) -> str:
        return "https" if self.tls is not None else "http"

    @property
    def grpc_endpoint(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.grpc_port}"

    @property
    def http_endpoint(self) -> str:
        """The full OTLP/HTTP metrics URL."""
        return f"{self.scheme}://127.0.0.1:{self.http_port}/v1/metrics"

    def set_mode(self, mode: SinkMode, retry_after_s: float | None = None, as_date: bool = False) -> None:
        """Answer every request from now on as ``mode`` says, asking for ``retry_after_s`` when given (over HTTP
        ``as_date``: ``Retry-After`` as the HTTP date that many seconds from now, whole seconds as dates are)."""
        with self._cond:
            self.mode = mode
            self.retry_after_s = retry_after_s
            self.retry_after_date = as_date
            self._cond.notify_all()

    def reject_points(self, count: int) -> None:
        """Accept requests but report ``count`` of their points rejected (``partial_success``)."""
        with self._cond:
            self.rejected_points = count

    def refuse_metric(self, name: str | None) -> None:
        """Accept requests but refuse every point of the metric ``name`` they hold (``partial_success``, with
        the message ``<name> is not accepted here``); None: refuse nothing."""
        with self._cond:
            self.refused_metric = name

    def requests(self) -> list[Any]:
        with self._cond:
            return [item.request for item in self.received]

    def metrics(self, name: str | None = None, transport: str | None = None) -> Iterator[tuple[Any, Any, Any]]:
        """(resource_metrics, scope_metrics, metric) of every request received so far, in arrival order; only
        the metrics called ``name`` and the requests over ``transport`` ("grpc" or "http") when given."""
        with self._cond:
            received = list(self.received)
        for item in received:
            if transport is not None and item.transport != transport:
                continue
            for rm in item.request.resource_metrics:
                for sm in rm.scope_metrics:
                    for metric in sm.metrics:
                        if name is None or metric.name == name:
                            yield rm, sm, metric

    def log_records(self) -> list[tuple[Any, Any]]:
        """(resource_logs, log_record) of every logs request received so far, in arrival order."""
        with self._cond:
            received = list(self.logs_received)
        return [
            (rl, record)
            for item in received
            for rl in item.request.resource_logs
            for sl in rl.scope_logs
            for record in sl.log_records
        ]

    def wait_for(self, predicate: Callable[[OtlpSink], bool], timeout: float = 10.0) -> bool:
        """Wait until ``predicate(sink)`` holds (re-checked on every request); False on timeout."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not predicate(self):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(remaining)
        return True

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._grpc is not None:
            self._grpc.stop(grace=None)
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()

    def __enter__(self) -> OtlpSink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- shared by both transports --------------------------------------------------------------

    def _admit(self, count: bool = True) -> tuple[SinkMode, float | None]:
        """Count the attempt (``count``: a metrics request) and apply the failure mode; returns the mode to answer with
        and its retry delay."""
        deadline = time.monotonic() + self.hold_limit_s
        with self._cond:
            self.attempts += count
            self._cond.notify_all()
            while self.mode is SinkMode.HOLD and not self._closed:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
            return (SinkMode.OK if self.mode is SinkMode.HOLD else self.mode), self.retry_after_s

    def _response(self, request: Any) -> bytes:
        with self._cond:
            rejected, refused = self.rejected_points, self.refused_metric
        response = metrics_service_pb2.ExportMetricsServiceResponse()
        if rejected:
            response.partial_success.rejected_data_points = rejected
            response.partial_success.error_message = f"sink scripted to reject {rejected} point(s)"
        elif refused is not None:
            points = sum(
                len(getattr(metric, metric.WhichOneof("data")).data_points)
                for rm in request.resource_metrics
                for sm in rm.scope_metrics
                for metric in sm.metrics
                if metric.name == refused and metric.WhichOneof("data")
            )
            if points:
                response.partial_success.rejected_data_points = points
                response.partial_success.error_message = f"{refused} is not accepted here"
        return response.SerializeToString()

    def _retry_after(self, retry_after_s: float) -> str:
        with self._cond:
            as_date = self.retry_after_date
        return email.utils.formatdate(time.time() + retry_after_s, usegmt=True) if as_date else f"{retry_after_s:g}"

    @staticmethod
    def _status(mode: SinkMode, retry_after_s: float | None) -> Any:
        """The google.rpc.Status a failure mode answers with, RetryInfo in its details when asked."""
        status = status_pb2.Status(code=_FAILURES[mode][1], message=f"sink scripted to answer {mode.value}")
        if retry_after_s is not None:
            delay = duration_pb2.Duration(seconds=int(retry_after_s), nanos=int(retry_after_s % 1 * 1e9))
            detail = any_pb2.Any()
            detail.Pack(error_details_pb2.RetryInfo(retry_delay=delay))
            status.details.append(detail)
        return status

    def _store(self, request: Any, metadata: dict[str, str], transport: str) -> None:
        with self._cond:
            if isinstance(request, logs_service_pb2.ExportLogsServiceRequest):
                self.logs_received.append(Received(request, metadata, transport))
            else:
                self.received.append(Received(request, metadata, transport))
            self._cond.notify_all()

    # --- gRPC -----------------------------------------------------------------------------------

    def _start_grpc(self) -> None:
        sink = self

        class Servicer(metrics_service_pb2_grpc.MetricsServiceServicer):
            def Export(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
                mode, retry_after_s = sink._admit()
                if mode in _FAILURES:
                    status = sink._status(mode, retry_after_s)
                    if status.details:  # RetryInfo also in the trailer older clients read
                        context.set_trailing_metadata((("google.rpc.retryinfo-bin", status.details[0].value),))
                    context.abort_with_status(rpc_status.to_status(status))
                metadata = {key.lower(): str(value) for key, value in context.invocation_metadata()}
                sink._store(request, metadata, "grpc")
                return metrics_service_pb2.ExportMetricsServiceResponse.FromString(sink._response(request))

        class LogsServicer(logs_service_pb2_grpc.LogsServiceServicer):
            def Export(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
                mode, _retry_after_s = sink._admit(count=False)
                if mode in _FAILURES:
                    context.abort(_FAILURES[mode][0], f"sink scripted to answer {mode.value}")
                sink._store(request, {key.lower(): str(value) for key, value in context.invocation_metadata()}, "grpc")
                return logs_service_pb2.ExportLogsServiceResponse()

        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(Servicer(), server)  # type: ignore[no-untyped-call]
        logs_service_pb2_grpc.add_LogsServiceServicer_to_server(LogsServicer(), server)  # type: ignore[no-untyped-call]
        if self.tls is None:
            self.grpc_port = server.add_insecure_port("127.0.0.1:0")
        else:
            credentials = grpc.ssl_server_credentials(
                [(self.tls.server_key.read_bytes(), self.tls.server_cert.read_bytes())],
                root_certificates=self.tls.ca.read_bytes() if self.mutual else None,
                require_client_auth=self.mutual,
            )
            self.grpc_port = server.add_secure_port("127.0.0.1:0", credentials)
        server.start()
        self._grpc = server

    # --- OTLP/HTTP ------------------------------------------------------------------------------

    def _start_http(self) -> None:
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                path = self.path.rstrip("/")
                if path not in ("/v1/metrics", "/v1/logs"):
                    self._reply(404, b"", "text/plain")
                    return
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                encoding = (self.headers.get("Content-Encoding") or "").lower()
                if encoding == "gzip":
                    body = gzip.decompress(body)
                elif encoding == "deflate":
                    body = zlib.decompress(body)
                logs = path == "/v1/logs"
                mode, retry_after_s = sink._admit(count=not logs)
                if mode in _FAILURES:
                    status = sink._status(mode, retry_after_s).SerializeToString()
                    retry = {"Retry-After": sink._retry_after(retry_after_s)} if retry_after_s is not None else {}
                    self._reply(_FAILURES[mode][2], status, "application/x-protobuf", retry)
                    return
                request: Any = (
                    logs_service_pb2.ExportLogsServiceRequest()
                    if logs
                    else metrics_service_pb2.ExportMetricsServiceRequest()
                )
                json_body = "json" in (self.headers.get("Content-Type") or "").lower()
                try:
                    if json_body:  # OTLP/JSON (an otlphttp exporter with encoding: json)
                        json_format.Parse(body.decode("utf-8"), request, ignore_unknown_fields=True)
                    else:
                        request.ParseFromString(body)
                except Exception:
                    self._reply(400, b"malformed request", "text/plain")
                    return
                sink._store(request, {key.lower(): value for key, value in self.headers.items()}, "http")
                answer = (
                    logs_service_pb2.ExportLogsServiceResponse().SerializeToString()
                    if logs
                    else sink._response(request)
                )
                if json_body:
                    self._reply(200, b"{}", "application/json")
                    return
                self._reply(200, answer, "application/x-protobuf")

            def _reply(self, status: int, body: bytes, content_type: str, extra: dict[str, str] | None = None) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                for name, value in (extra or {}).items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # tests read the stored requests, not an access log

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        if self.tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(self.tls.server_cert, self.tls.server_key)
            if self.mutual:
                context.load_verify_locations(self.tls.ca)
                context.verify_mode = ssl.CERT_REQUIRED
            server.socket = context.wrap_socket(server.socket, server_side=True)
        self.http_port = server.server_address[1]
        threading.Thread(target=server.serve_forever, args=(0.05,), name="otlp-sink-http", daemon=True).start()
        self._http = server
