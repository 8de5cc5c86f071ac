"""OTLP/HTTP ``POST /v1/metrics``, binary protobuf and JSON, on a threading HTTP server.

Status codes follow the OTLP/HTTP spec: 200 with an ExportMetricsServiceResponse (partial_success when
points were rejected), 400 malformed, 401 unauthenticated, 413 too large, 415 unknown content type,
503 with Retry-After on overload or shutdown. Bodies answer in the request's encoding; an error body is
a google.rpc.Status whose code is the gRPC equivalent of the HTTP status.

The body is framed by Content-Length or by chunked transfer encoding, parsed strictly: no framing is 411,
a bad one 400, and either closes the connection, since the next request's start is then unknown.
"""

from __future__ import annotations

import gzip
import io
import logging
import math
import re
import threading
import zlib
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import attrs
import grpc
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
READ_TIMEOUT_S = 30.0
_MAX_LINE = 1024  # a chunk-size or trailer line; real ones are a few bytes
_MAX_TRAILERS = 64
_DIGITS = re.compile(r"[0-9]+")
_HEX = re.compile(rb"[0-9A-Fa-f]+")
_GRPC_CODES = {  # the OTLP/HTTP error body is a google.rpc.Status: its code is the gRPC one
    HTTPStatus.BAD_REQUEST: grpc.StatusCode.INVALID_ARGUMENT,
    HTTPStatus.UNAUTHORIZED: grpc.StatusCode.UNAUTHENTICATED,
    HTTPStatus.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    HTTPStatus.LENGTH_REQUIRED: grpc.StatusCode.INVALID_ARGUMENT,
    HTTPStatus.REQUEST_ENTITY_TOO_LARGE: grpc.StatusCode.INVALID_ARGUMENT,
    HTTPStatus.UNSUPPORTED_MEDIA_TYPE: grpc.StatusCode.INVALID_ARGUMENT,
    HTTPStatus.INTERNAL_SERVER_ERROR: grpc.StatusCode.INTERNAL,
    HTTPStatus.SERVICE_UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
}


def grpc_code(status: HTTPStatus) -> int:
    """The google.rpc.Status code an OTLP/HTTP error body carries for ``status``."""
    return int(_GRPC_CODES.get(status, grpc.StatusCode.UNKNOWN).value[0])


class _TooLarge(Exception):
    pass


class _BadFraming(Exception):
    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _read_chunked(rfile: io.BufferedIOBase, limit: int) -> bytes:
    """A chunked body (RFC 9112 7.1) of at most ``limit`` bytes; extensions and trailers are skipped."""
    body = bytearray()
    while True:
        line = rfile.readline(_MAX_LINE + 1)
        size_text = line.split(b";", 1)[0].strip()
        if not line.endswith(b"\n") or not _HEX.fullmatch(size_text):
            raise _BadFraming(HTTPStatus.BAD_REQUEST, "malformed chunk size line")
        size = int(size_text, 16)
        if size == 0:
            break
        if len(body) + size > limit:
            raise _TooLarge
        chunk = rfile.read(size)
        if len(chunk) < size or rfile.readline(_MAX_LINE + 1) not in (b"\r\n", b"\n"):
            raise _BadFraming(HTTPStatus.BAD_REQUEST, "chunked body ended early or a chunk overran its size")
        body += chunk
    for _ in range(_MAX_TRAILERS):
        line = rfile.readline(_MAX_LINE + 1)
        if line in (b"\r\n", b"\n"):
            return bytes(body)
        if not line.endswith(b"\n"):
            break
    raise _BadFraming(HTTPStatus.BAD_REQUEST, "chunked body without its final empty line")


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
    # A client silent this long mid-request (or idle on a keep-alive connection) is dropped, so a
    # stalled body cannot hold one of the gate's slots for ever.
    read_timeout_s: float = READ_TIMEOUT_S
    port: int = 0
    _server: ThreadingHTTPServer | None = None
    _thread: threading.Thread | None = None

    def start(self) -> int:
        """Bind and serve; OSError (one line, naming the address) when the port cannot be had."""
        host, _, port = self.listen.rpartition(":")
        receiver = self

        class Handler(_Handler):
            owner: ClassVar[HttpReceiver] = receiver
            timeout = receiver.read_timeout_s

        try:
            server = ThreadingHTTPServer((host.strip("[]") or "0.0.0.0", int(port)), Handler)
        except OSError as error:
            raise OSError(f"cannot listen for OTLP/HTTP on {self.listen} ({error.strerror or error})") from error
        server.daemon_threads = True
        if self.tls is not None:
            import ssl

            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(self.tls.cert, self.tls.key)
            if self.tls.client_ca:
                context.load_verify_locations(self.tls.client_ca)
                context.verify_mode = ssl.CERT_REQUIRED
            # The handshake runs in each connection's own thread (``_Handler.setup``), under the read timeout:
            # done on accept, one client that connects and never completes it would stall all intake.
            server.socket = context.wrap_socket(server.socket, server_side=True, do_handshake_on_connect=False)
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
        if self._thread is not None:
            self._thread.join()
            self._thread = None


class _Handler(BaseHTTPRequestHandler):
    owner: ClassVar[HttpReceiver]
    protocol_version = "HTTP/1.1"
    server_version = "otel-ofu-collector"

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("%s " + format, self.address_string(), *args)

    def setup(self) -> None:
        super().setup()  # applies the read timeout to the connection first
        self._handshake_failed = False
        do_handshake = getattr(self.connection, "do_handshake", None)
        if do_handshake is None:
            return
        try:
            do_handshake()
        except OSError as error:  # ssl.SSLError and socket timeouts alike: this client only
            logger.debug("TLS handshake with %s failed: %s", self.address_string(), error)
            self._handshake_failed = True

    def handle(self) -> None:
        if self._handshake_failed:
            self.close_connection = True
            return
        super().handle()

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
        self._reply(int(status), status_pb2.Status(code=grpc_code(status), message=message), as_json, headers)

    def _body_length(self) -> int | None:
        """The declared length of the body, None for a chunked one; _BadFraming when neither is usable."""
        transfer = self.headers.get_all("Transfer-Encoding") or []
        if transfer:
            codings = [coding.strip().lower() for value in transfer for coding in value.split(",")]
            if codings != ["chunked"]:
                raise _BadFraming(HTTPStatus.BAD_REQUEST, f"Transfer-Encoding {', '.join(transfer)} not supported")
            if self.headers.get("Content-Length") is not None:
                self.close_connection = True  # both framings: chunked wins (RFC 9112 6.3), trust neither after
            return None
        declared = {part.strip() for value in self.headers.get_all("Content-Length") or [] for part in value.split(",")}
        if not declared:
            raise _BadFraming(HTTPStatus.LENGTH_REQUIRED, "Content-Length (or a chunked body) required")
        if len(declared) > 1 or not _DIGITS.fullmatch(text := declared.pop()):
            raise _BadFraming(HTTPStatus.BAD_REQUEST, f"invalid Content-Length {self.headers.get('Content-Length')!r}")
        return int(text)

    def _skip_body(self, length: int | None) -> None:
        """Before an early refusal: read a small declared body so the connection stays usable, else close it."""
        if length is not None and length <= self.owner.max_request_bytes:
            self.rfile.read(length)
        else:
            self.close_connection = True

    def do_POST(self) -> None:
        owner = self.owner
        content_type = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        as_json = content_type == JSON
        try:
            length = self._body_length()
        except _BadFraming as bad:
            self.close_connection = True
            self._error(bad.status, bad.message, as_json)
            return
        if self.path.split("?")[0] != METRICS_PATH:
            self._skip_body(length)
            self._error(HTTPStatus.NOT_FOUND, f"only POST {METRICS_PATH} is served", as_json)
            return
        if owner.auth is not None and not owner.auth.allows(self.headers.get("Authorization")):
            self._skip_body(length)
            self._error(
                HTTPStatus.UNAUTHORIZED, "missing or wrong bearer token", as_json, {"WWW-Authenticate": "Bearer"}
            )
            return
        if content_type not in (PROTOBUF, JSON):
            self._skip_body(length)
            self._error(HTTPStatus.UNSUPPORTED_MEDIA_TYPE, f"Content-Type must be {PROTOBUF} or {JSON}", as_json)
            return
        if length is not None and length > owner.max_request_bytes:
            self.close_connection = True
            self._error(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"body exceeds {owner.max_request_bytes} bytes", as_json)
            return
        why = owner.gate.enter()
        if why is not None:
            self._skip_body(length)
            retry = {"Retry-After": str(max(1, math.ceil(owner.gate.retry_after_s)))}
            self._error(HTTPStatus.SERVICE_UNAVAILABLE, f"collector {why}, retry later", as_json, retry)
            return
        try:
            body = self._read_body(length, as_json)
            if body is not None:
                self._export(body, as_json)
        finally:
            owner.gate.leave()

    def _read_body(self, length: int | None, as_json: bool) -> bytes | None:
        """The whole body, or None after answering why not (the connection then closes)."""
        limit = self.owner.max_request_bytes
        try:
            if length is None:
                return _read_chunked(self.rfile, limit)
            body = self.rfile.read(length)
            if len(body) < length:
                raise _BadFraming(HTTPStatus.BAD_REQUEST, f"body ended after {len(body)} of {length} bytes")
            return body
        except _TooLarge:
            self.close_connection = True
            self._error(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"body exceeds {limit} bytes", as_json)
        except _BadFraming as bad:
            self.close_connection = True
            self._error(bad.status, bad.message, as_json)
        return None

    def _export(self, body: bytes, as_json: bool) -> None:
        owner = self.owner
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
