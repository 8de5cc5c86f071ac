"""OTLP/HTTP ``POST /v1/metrics``, binary protobuf and JSON, on a threading HTTP server.

Status codes follow the OTLP/HTTP spec: 200 with an ExportMetricsServiceResponse (partial_success when
points were rejected), 400 malformed, 401 unauthenticated, 413 too large, 415 unknown content type,
503 with Retry-After on overload or shutdown. Bodies answer in the request's encoding; an error body is
a google.rpc.Status whose code is the gRPC equivalent of the HTTP status.

The body is framed by Content-Length or by chunked transfer encoding, parsed strictly: no framing is 411,
a bad one 400, and either closes the connection, since the next request's start is then unknown.

A body must arrive within one overall deadline (408 and the connection closed after it), not merely
without long silences, and the request line and headers within one of their own from their first byte
(the connection is closed after it): a client dripping a byte now and then is cut off however steady.
A body is received before its request enters the admission gate, under its own bound (``BodyBudget``:
connections reading a body at once and their declared bytes; 503 beyond it), so slow senders never hold
the gate's slots, which are for requests being processed. A request refused before its body is read
(401, 404, 415, 503) has a small body read and discarded, so the connection stays usable; a larger one
is not read at all and the connection closes.
"""

from __future__ import annotations

import gzip
import io
import logging
import math
import re
import socket
import sys
import threading
import time
import zlib
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar, cast

import attrs
import grpc
from google.protobuf import json_format
from google.protobuf.message import DecodeError, Message
from google.rpc import status_pb2  # type: ignore[import-untyped]
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)

from otel_ofu_collector.receivers.admission import MAX_REQUEST_BYTES, BodyBudget, Gate
from otel_ofu_collector.receivers.auth import BearerAuth, TlsFiles
from otel_ofu_collector.receivers.otlp_grpc import Ingest

logger = logging.getLogger(__name__)

METRICS_PATH = "/v1/metrics"
PROTOBUF = "application/x-protobuf"
JSON = "application/json"
READ_TIMEOUT_S = 30.0
BODY_DEADLINE_S = 60.0  # a whole body, 64 MiB at about 1 MB/s; READ_TIMEOUT_S still bounds each silence
HEADER_DEADLINE_S = 10.0  # the request line and headers, from their first byte; real ones take milliseconds
LISTEN_BACKLOG = 4096  # as gRPC's: a burst of new connections waits to be accepted instead of being reset
# A Content-Length longer than this many digits is over any limit (and int() refuses past 4300 digits).
_MAX_LENGTH_DIGITS = 18
SKIP_MAX_BYTES = 1024 * 1024  # the most read and discarded of a body refused before it was read
_PIECE = 1024 * 1024  # the most one read asks for: the deadline is checked between reads
_MAX_LINE = 1024  # a chunk-size or trailer line; real ones are a few bytes
_MAX_TRAILERS = 64
_DIGITS = re.compile(r"[0-9]+")
_HEX = re.compile(rb"[0-9A-Fa-f]+")
_GRPC_CODES = {  # the OTLP/HTTP error body is a google.rpc.Status: its code is the gRPC one
    HTTPStatus.BAD_REQUEST: grpc.StatusCode.INVALID_ARGUMENT,
    HTTPStatus.UNAUTHORIZED: grpc.StatusCode.UNAUTHENTICATED,
    HTTPStatus.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    HTTPStatus.REQUEST_TIMEOUT: grpc.StatusCode.DEADLINE_EXCEEDED,
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


class _BodyReader:
    """Reads one request body under an overall deadline: the socket's timeout is set to what is left of it
    before every single recv, so no pace of dripping bytes outlasts it. TimeoutError once it has passed.

    Reads go through the handler's buffered ``rfile`` (which may already hold the body's start) with
    ``read1`` and ``peek``, each at most one recv.
    """

    __slots__ = ("_connection", "_deadline", "_idle_s", "_rfile")

    def __init__(self, rfile: io.BufferedReader, connection: socket.socket, deadline_s: float, idle_s: float) -> None:
        self._rfile = rfile
        self._connection = connection
        self._deadline = time.monotonic() + deadline_s
        self._idle_s = idle_s

    def _arm(self) -> None:
        remaining = self._deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("request body deadline passed")
        self._connection.settimeout(min(remaining, self._idle_s))

    def read(self, size: int) -> bytes:
        """``size`` bytes, fewer only when the client closed first."""
        pieces = []
        left = size
        while left > 0:
            self._arm()
            piece = self._rfile.read1(min(left, _PIECE))
            if not piece:
                break
            pieces.append(piece)
            left -= len(piece)
        return b"".join(pieces)

    def skip(self, size: int) -> int:
        """Read and discard ``size`` bytes; how many there were before the client closed."""
        done = 0
        while done < size:
            self._arm()
            piece = self._rfile.read1(min(size - done, 64 * 1024))
            if not piece:
                break
            done += len(piece)
        return done

    def readline(self, limit: int) -> bytes:
        """A line with its newline, or at most ``limit`` bytes of one (or what came before the client closed)."""
        line = bytearray()
        while len(line) < limit:
            self._arm()
            ahead = self._rfile.peek(1)[: limit - len(line)]  # buffered bytes, or one recv for more
            if not ahead:
                break
            end = ahead.find(b"\n")
            line += self._rfile.read(end + 1 if end >= 0 else len(ahead))  # all buffered: no recv
            if end >= 0:
                break
        return bytes(line)


class _DeadlineSocketIO(io.RawIOBase):
    """The connection's reads for the handler's ``rfile``, with a deadline for the request line and headers.

    ``arm(window_s)`` before a request: its first recv waits as long as the idle timeout allows (a keep-alive
    connection between requests); from its first byte the rest of the head must come within ``window_s``,
    each recv's timeout cut to what is left. ``disarm`` once the headers are in (the body has its own).
    """

    def __init__(self, connection: socket.socket, idle_s: float) -> None:
        super().__init__()
        self._connection = connection
        self._idle_s = idle_s
        self._window_s: float | None = None
        self._deadline: float | None = None

    def arm(self, window_s: float) -> None:
        self._window_s, self._deadline = window_s, None

    def disarm(self) -> None:
        if self._window_s is not None or self._deadline is not None:
            self._window_s = self._deadline = None
            self._connection.settimeout(self._idle_s)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        deadline = self._deadline
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("request headers deadline passed")
            self._connection.settimeout(min(remaining, self._idle_s))
        count = self._connection.recv_into(buffer)
        if count and deadline is None and self._window_s is not None:
            self._deadline = time.monotonic() + self._window_s
        return count


def _read_chunked(reader: _BodyReader, limit: int) -> bytes:
    """A chunked body (RFC 9112 7.1) of at most ``limit`` bytes; extensions and trailers are skipped."""
    body = bytearray()
    while True:
        line = reader.readline(_MAX_LINE + 1)
        size_text = line.split(b";", 1)[0].strip()
        if not line.endswith(b"\n") or not _HEX.fullmatch(size_text):
            raise _BadFraming(HTTPStatus.BAD_REQUEST, "malformed chunk size line")
        size = int(size_text, 16)
        if size == 0:
            break
        if len(body) + size > limit:
            raise _TooLarge
        chunk = reader.read(size)
        if len(chunk) < size or reader.readline(_MAX_LINE + 1) not in (b"\r\n", b"\n"):
            raise _BadFraming(HTTPStatus.BAD_REQUEST, "chunked body ended early or a chunk overran its size")
        body += chunk
    for _ in range(_MAX_TRAILERS):
        line = reader.readline(_MAX_LINE + 1)
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
    # A client silent this long mid-request (or idle on a keep-alive connection) is dropped.
    read_timeout_s: float = READ_TIMEOUT_S
    # A body not complete this long after its headers is answered 408 however steadily it drips: the
    # request holds one of the gate's slots meanwhile.
    body_deadline_s: float = BODY_DEADLINE_S
    header_deadline_s: float = HEADER_DEADLINE_S
    # Bodies being received, before the gate (None: 4 x gate.max_in_flight readers, 4 x max_request_bytes).
    bodies: BodyBudget | None = None
    port: int = 0
    _server: ThreadingHTTPServer | None = None
    _thread: threading.Thread | None = None

    def start(self) -> int:
        """Bind and serve; OSError (one line, naming the address) when the port cannot be had."""
        host, _, port = self.listen.rpartition(":")
        receiver = self
        if self.bodies is None:
            self.bodies = BodyBudget(max_readers=4 * self.gate.max_in_flight, max_bytes=4 * self.max_request_bytes)

        class Handler(_Handler):
            owner: ClassVar[HttpReceiver] = receiver
            timeout = receiver.read_timeout_s

        try:
            server = _Server((host.strip("[]") or "0.0.0.0", int(port)), Handler)
        except OSError as error:
            raise OSError(f"cannot listen for OTLP/HTTP on {self.listen} ({error.strerror or error})") from error
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


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = LISTEN_BACKLOG  # socketserver's default is 5

    def handle_error(self, request: Any, client_address: Any) -> None:
        # socketserver prints a traceback on stderr for any error; a client that hangs up or goes silent
        # mid-request is routine for a server, and only that client's concern.
        error = sys.exc_info()[1]
        if isinstance(error, OSError):
            logger.debug("OTLP/HTTP client %s: %s", client_address, error)
        else:
            logger.error("OTLP/HTTP connection from %s failed", client_address, exc_info=True)


class _Handler(BaseHTTPRequestHandler):
    owner: ClassVar[HttpReceiver]
    protocol_version = "HTTP/1.1"
    # What a request line without a (valid) version is answered as: http.server's default, HTTP/0.9, sends an
    # error page with no status line at all; every answer here has one.
    default_request_version = "HTTP/1.1"
    server_version = "otel-ofu-collector"

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("%s " + format, self.address_string(), *args)

    def setup(self) -> None:
        super().setup()  # applies the read timeout to the connection first
        self._head = _DeadlineSocketIO(self.connection, self.owner.read_timeout_s)
        self.rfile.close()  # socketserver's own reader (nothing read yet): ours reads under the head's deadline
        self.rfile = io.BufferedReader(self._head, self.rbufsize if self.rbufsize > 0 else io.DEFAULT_BUFFER_SIZE)
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

    def handle_one_request(self) -> None:
        self._head.arm(self.owner.header_deadline_s)
        try:
            super().handle_one_request()  # a TimeoutError there closes the connection, logged at debug
        finally:
            self._head.disarm()

    def _reply(self, status: int, message: Message, as_json: bool, headers: dict[str, str] | None = None) -> None:
        body = json_format.MessageToJson(message).encode() if as_json else message.SerializeToString()
        try:
            self.send_response(status)
            self.send_header("Content-Type", JSON if as_json else PROTOBUF)
            self.send_header("Content-Length", str(len(body)))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            if self.close_connection:  # tell the client, which may still be sending a body we will not read
                self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(body)
        except OSError as error:  # the client is gone: nobody to answer
            logger.debug("OTLP/HTTP client %s left before its answer: %s", self.address_string(), error)
            self.close_connection = True

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
            shown = (self.headers.get("Content-Length") or "")[:40]
            raise _BadFraming(HTTPStatus.BAD_REQUEST, f"invalid Content-Length {shown!r}")
        if len(text.lstrip("0")) > _MAX_LENGTH_DIGITS:
            raise _BadFraming(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"Content-Length of {len(text)} digits")
        return int(text)

    def _body_reader(self) -> _BodyReader:
        return _BodyReader(
            cast(io.BufferedReader, self.rfile), self.connection, self.owner.body_deadline_s, self.owner.read_timeout_s
        )

    def _skip_body(self, length: int | None) -> None:
        """Before an early refusal: read and discard a small declared body so the connection stays usable;
        a larger or chunked one is not read at all (the connection closes), so refusing costs next to nothing."""
        if length is None or length > min(SKIP_MAX_BYTES, self.owner.max_request_bytes):
            self.close_connection = True
            return
        try:
            if self._body_reader().skip(length) < length:
                self.close_connection = True
        except OSError as error:  # the deadline (TimeoutError) or the client gone: answer if we can, then close
            logger.debug("OTLP/HTTP client %s: body not skipped: %s", self.address_string(), error)
            self.close_connection = True
        finally:
            self.connection.settimeout(self.owner.read_timeout_s)

    def do_POST(self) -> None:
        self._head.disarm()  # the headers are in; the body has a deadline of its own
        owner = self.owner
        content_type = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        as_json = content_type == JSON
        try:
            length = self._body_length()
        except _BadFraming as bad:
            logger.info("OTLP/HTTP client %s: %s (%d)", self.address_string(), bad.message, bad.status)
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
        retry = {"Retry-After": str(max(1, math.ceil(owner.gate.retry_after_s)))}
        if owner.gate.closing:
            owner.gate.count_refusal("shutdown")
            self._skip_body(length)
            self._error(HTTPStatus.SERVICE_UNAVAILABLE, "collector shutdown, retry later", as_json, retry)
            return
        # The body is received first, under the body budget, and only then does the request take a gate
        # slot: however slowly a client sends, it holds no slot meant for processing.
        bodies = owner.bodies
        assert bodies is not None  # set by start()
        reserved = length if length is not None else owner.max_request_bytes
        if not bodies.take(reserved):
            owner.gate.count_refusal("overload")
            self._skip_body(length)
            self._error(
                HTTPStatus.SERVICE_UNAVAILABLE,
                "collector overload (bodies being received), retry later",
                as_json,
                retry,
            )
            return
        try:
            body = self._read_body(length, as_json)
            if body is None:
                return
            why = owner.gate.enter()
            if why is not None:
                self._error(HTTPStatus.SERVICE_UNAVAILABLE, f"collector {why}, retry later", as_json, retry)
                return
            try:
                self._export(body, as_json)
            finally:
                owner.gate.leave()
        finally:
            bodies.give(reserved)

    def _read_body(self, length: int | None, as_json: bool) -> bytes | None:
        """The whole body, or None after answering why not (the connection then closes)."""
        owner = self.owner
        limit = owner.max_request_bytes
        reader = self._body_reader()
        try:
            if length is None:
                return _read_chunked(reader, limit)
            body = reader.read(length)
            if len(body) < length:
                raise _BadFraming(HTTPStatus.BAD_REQUEST, f"body ended after {len(body)} of {length} bytes")
            return body
        except TimeoutError:
            self.close_connection = True
            self._error(
                HTTPStatus.REQUEST_TIMEOUT,
                f"body not received within {owner.body_deadline_s:g} s (or silent for {owner.read_timeout_s:g} s)",
                as_json,
            )
        except OSError as error:  # the client hung up mid-body (reset, TLS EOF): nobody to answer
            logger.debug("OTLP/HTTP client %s left mid-body: %s", self.address_string(), error)
            self.close_connection = True
        except _TooLarge:
            self.close_connection = True
            self._error(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"body exceeds {limit} bytes", as_json)
        except _BadFraming as bad:
            self.close_connection = True
            self._error(bad.status, bad.message, as_json)
        finally:
            self.connection.settimeout(owner.read_timeout_s)  # back to the keep-alive idle timeout
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
