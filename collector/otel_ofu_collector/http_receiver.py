"""OTLP/HTTP ``POST /v1/metrics``, binary protobuf and JSON, on a threading HTTP server.

Status codes follow the OTLP/HTTP spec: 200 with an ExportMetricsServiceResponse (partial_success when
points were rejected), 400 malformed, 401 unauthenticated, 413 too large, 415 unknown content type,
503 with Retry-After on overload or shutdown. Bodies answer in the request's encoding.
"""

from __future__ import annotations

import gzip
import logging
import math
import threading
import zlib
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import attrs
from google.protobuf import json_format
from google.protobuf.message import DecodeError, Message
from google.rpc import status_pb2  # type: ignore[import-untyped]
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)

from otel_ofu_collector.auth import BearerAuth, TlsFiles
from otel_ofu_collector.gate import MAX_REQUEST_BYTES, Gate
from otel_ofu_collector.grpc_receiver import Ingest

logger = logging.getLogger(__name__)

METRICS_PATH = "/v1/metrics"
PROTOBUF = "application/x-protobuf"
JSON = "application/json"


class _TooLarge(Exception):
    pass


def _gunzip(body: bytes, limit: int) -> bytes:
    """Decompress at most ``limit`` bytes, so a small gzip bomb cannot inflate into gigabytes."""
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    out = inflater.decompress(body, limit + 1)
    if len(out) > limit or inflater.unconsumed_tail:
        raise _TooLarge
    return out


@attrs.define
class HttpReceiver:
    """Serves ``POST /v1/metrics`` on ``host:port`` (port 0 picks one; ``port`` tells which after ``start``)."""

    ingest: Ingest
    gate: Gate
    listen: str = "0.0.0.0:4318"
    tls: TlsFiles | None = None
    auth: BearerAuth | None = None
    max_request_bytes: int = MAX_REQUEST_BYTES
    port: int = 0
    _server: ThreadingHTTPServer | None = None
    _thread: threading.Thread | None = None

    def start(self) -> int:
        host, _, port = self.listen.rpartition(":")
        receiver = self

        class Handler(_Handler):
            owner: ClassVar[HttpReceiver] = receiver

        server = ThreadingHTTPServer((host.strip("[]") or "0.0.0.0", int(port)), Handler)
        server.daemon_threads = True
        if self.tls is not None:
            import ssl

            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(self.tls.cert, self.tls.key)
            if self.tls.client_ca:
                context.load_verify_locations(self.tls.client_ca)
                context.verify_mode = ssl.CERT_REQUIRED
            server.socket = context.wrap_socket(server.socket, server_side=True)
        self._server = server
        self.port = int(server.server_address[1])
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="otlp-http", daemon=True
        )
        self._thread.start()
        return self.port

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


class _Handler(BaseHTTPRequestHandler):
    owner: ClassVar[HttpReceiver]
    protocol_version = "HTTP/1.1"
    server_version = "otel-ofu-collector"

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("%s " + format, self.address_string(), *args)

    def _reply(self, status: int, message: Message, as_json: bool, headers: dict[str, str] | None = None) -> None:
        body = json_format.MessageToJson(message).encode() if as_json else message.SerializeToString()
        self.send_response(status)
        self.send_header("Content-Type", JSON if as_json else PROTOBUF)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)

    def _error(self, status: HTTPStatus, message: str, as_json: bool, headers: dict[str, str] | None = None) -> None:
        self._reply(int(status), status_pb2.Status(code=0, message=message), as_json, headers)

    def do_POST(self) -> None:
        owner = self.owner
        content_type = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        as_json = content_type == JSON
        length = int(self.headers.get("Content-Length") or 0)
        if self.path.split("?")[0] != METRICS_PATH:
            self._drain(length)
            self._error(HTTPStatus.NOT_FOUND, f"only POST {METRICS_PATH} is served", as_json)
            return
        if owner.auth is not None and not owner.auth.allows(self.headers.get("Authorization")):
            self._drain(length)
            self._error(
                HTTPStatus.UNAUTHORIZED, "missing or wrong bearer token", as_json, {"WWW-Authenticate": "Bearer"}
            )
            return
        if content_type not in (PROTOBUF, JSON):
            self._drain(length)
            self._error(HTTPStatus.UNSUPPORTED_MEDIA_TYPE, f"Content-Type must be {PROTOBUF} or {JSON}", as_json)
            return
        if length > owner.max_request_bytes:
            self.close_connection = True
            self._error(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"body exceeds {owner.max_request_bytes} bytes", as_json)
            return
        why = owner.gate.enter()
        if why is not None:
            self._drain(length)
            retry = {"Retry-After": str(max(1, math.ceil(owner.gate.retry_after_s)))}
            self._error(HTTPStatus.SERVICE_UNAVAILABLE, f"collector {why}, retry later", as_json, retry)
            return
        try:
            self._export(length, as_json)
        finally:
            owner.gate.leave()

    def _drain(self, length: int) -> None:
        if 0 < length <= self.owner.max_request_bytes:
            self.rfile.read(length)
        elif length:
            self.close_connection = True

    def _export(self, length: int, as_json: bool) -> None:
        owner = self.owner
        body = self.rfile.read(length)
        encoding = (self.headers.get("Content-Encoding") or "identity").strip().lower()
        try:
            if encoding == "gzip":
                body = _gunzip(body, owner.max_request_bytes)
            elif encoding not in ("identity", ""):
                self._error(HTTPStatus.UNSUPPORTED_MEDIA_TYPE, f"Content-Encoding {encoding} not supported", as_json)
                return
        except _TooLarge:
            self._error(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"body inflates past {owner.max_request_bytes} bytes", as_json
            )
            return
        except (zlib.error, gzip.BadGzipFile, EOFError) as error:
            self._error(HTTPStatus.BAD_REQUEST, f"bad gzip body: {error}", as_json)
            return
        try:
            if as_json:
                request = json_format.Parse(body, ExportMetricsServiceRequest(), ignore_unknown_fields=True)
                raw = None
            else:
                request = ExportMetricsServiceRequest.FromString(body)
                raw = body
        except (DecodeError, json_format.ParseError, UnicodeDecodeError, ValueError, RuntimeError) as error:
            self._error(HTTPStatus.BAD_REQUEST, f"malformed ExportMetricsServiceRequest: {error}", as_json)
            return
        if owner.gate.closing:
            retry = {"Retry-After": str(max(1, math.ceil(owner.gate.retry_after_s)))}
            self._error(HTTPStatus.SERVICE_UNAVAILABLE, "collector shutdown, retry later", as_json, retry)
            return
        try:
            outcome = owner.ingest(request, raw if raw is not None else request.SerializeToString())
        except Exception:  # one bad request must not take the receiver down
            logger.exception("OTLP/HTTP request failed inside the collector")
            self._error(HTTPStatus.INTERNAL_SERVER_ERROR, "internal error while processing the request", as_json)
            return
        response = ExportMetricsServiceResponse()
        if outcome.rejected:
            response.partial_success.rejected_data_points = outcome.rejected
            response.partial_success.error_message = outcome.error_message
        self._reply(int(HTTPStatus.OK), response, as_json)
