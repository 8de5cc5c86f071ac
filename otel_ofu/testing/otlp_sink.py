"""A real OTLP metrics receiver on loopback for tests, the demo and benchmarks.

gRPC (opentelemetry-proto's MetricsService) and OTLP/HTTP protobuf (``POST /v1/metrics``), both on
127.0.0.1 with a free port. Every request is kept with its metadata/headers. The failure mode can be
scripted so failure tests exercise the real exporters: ``UNAVAILABLE`` (HTTP 503) or ``HOLD`` (the
handler waits until released, like a stalled backend). For a backend that refuses connections, point
the exporter at ``unused_port()``.
"""

from __future__ import annotations

import enum
import gzip
import socket
import threading
import time
import zlib
from collections.abc import Callable
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import attrs
import grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc


class SinkMode(enum.Enum):
    OK = "ok"
    UNAVAILABLE = "unavailable"  # gRPC UNAVAILABLE, HTTP 503
    HOLD = "hold"  # the handler blocks until the mode changes or the sink closes


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
    received: list[Received] = attrs.field(factory=list, init=False)
    attempts: int = attrs.field(default=0, init=False)
    mode: SinkMode = attrs.field(default=SinkMode.OK, init=False)
    _cond: threading.Condition = attrs.field(factory=threading.Condition, init=False)
    _closed: bool = attrs.field(default=False, init=False)
    _grpc: grpc.Server | None = attrs.field(default=None, init=False)
    _http: ThreadingHTTPServer | None = attrs.field(default=None, init=False)
    grpc_port: int = attrs.field(default=0, init=False)
    http_port: int = attrs.field(default=0, init=False)

    @classmethod
    def start(cls, hold_limit_s: float = 30.0) -> OtlpSink:
        sink = cls(hold_limit_s=hold_limit_s)
        sink._start_grpc()
        sink._start_http()
        return sink

    @property
    def grpc_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.grpc_port}"

    @property
    def http_endpoint(self) -> str:
        """The full OTLP/HTTP metrics URL."""
        return f"http://127.0.0.1:{self.http_port}/v1/metrics"

    def set_mode(self, mode: SinkMode) -> None:
        with self._cond:
            self.mode = mode
            self._cond.notify_all()

    def requests(self) -> list[Any]:
        with self._cond:
            return [item.request for item in self.received]

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

    def _admit(self) -> SinkMode:
        """Count the attempt and apply the failure mode; returns the mode to answer with."""
        deadline = time.monotonic() + self.hold_limit_s
        with self._cond:
            self.attempts += 1
            self._cond.notify_all()
            while self.mode is SinkMode.HOLD and not self._closed:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
            return SinkMode.OK if self.mode is SinkMode.HOLD else self.mode

    def _store(self, request: Any, metadata: dict[str, str], transport: str) -> None:
        with self._cond:
            self.received.append(Received(request, metadata, transport))
            self._cond.notify_all()

    # --- gRPC -----------------------------------------------------------------------------------

    def _start_grpc(self) -> None:
        sink = self

        class Servicer(metrics_service_pb2_grpc.MetricsServiceServicer):
            def Export(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
                if sink._admit() is SinkMode.UNAVAILABLE:
                    context.abort(grpc.StatusCode.UNAVAILABLE, "sink scripted to be unavailable")
                metadata = {key.lower(): str(value) for key, value in context.invocation_metadata()}
                sink._store(request, metadata, "grpc")
                return metrics_service_pb2.ExportMetricsServiceResponse()

        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(Servicer(), server)  # type: ignore[no-untyped-call]
        self.grpc_port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        self._grpc = server

    # --- OTLP/HTTP ------------------------------------------------------------------------------

    def _start_http(self) -> None:
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                if self.path.rstrip("/") != "/v1/metrics":
                    self._reply(404, b"", "text/plain")
                    return
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                encoding = (self.headers.get("Content-Encoding") or "").lower()
                if encoding == "gzip":
                    body = gzip.decompress(body)
                elif encoding == "deflate":
                    body = zlib.decompress(body)
                if sink._admit() is SinkMode.UNAVAILABLE:
                    self._reply(503, b"sink scripted to be unavailable", "text/plain")
                    return
                request = metrics_service_pb2.ExportMetricsServiceRequest()
                try:
                    request.ParseFromString(body)
                except Exception:
                    self._reply(400, b"malformed protobuf", "text/plain")
                    return
                sink._store(request, {key.lower(): value for key, value in self.headers.items()}, "http")
                reply = metrics_service_pb2.ExportMetricsServiceResponse().SerializeToString()
                self._reply(200, reply, "application/x-protobuf")

            def _reply(self, status: int, body: bytes, content_type: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # tests read the stored requests, not an access log

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        self.http_port = server.server_address[1]
        threading.Thread(target=server.serve_forever, args=(0.05,), name="otlp-sink-http", daemon=True).start()
        self._http = server
