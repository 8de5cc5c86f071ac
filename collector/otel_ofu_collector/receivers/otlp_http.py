"""OTLP/HTTP ``POST /v1/metrics``, binary protobuf and JSON; the HTTP/1.1 itself is ``http_framing``'s.

Status codes follow the OTLP/HTTP spec: 200 with an ExportMetricsServiceResponse (partial_success when
points were rejected), 400 malformed, 401 unauthenticated, 404 another path, 405 another method, 413 too
large, 415 unknown content type, 503 with Retry-After on overload or shutdown. Bodies answer in the
request's encoding; an error body is a google.rpc.Status whose code is the gRPC equivalent of the HTTP
status.

A request is judged on its head first (path, method, bearer token, content type, shutdown), before any of
its body is read; its body is then received under the body budget, deadline and minimum rate
(``http_framing``) and only then does it take an admission gate slot, so slow senders never hold the
slots, which are for requests being processed.
"""

from __future__ import annotations

import logging
import math
import zlib
from collections.abc import Callable, Sequence
from http import HTTPStatus
from typing import ClassVar, Final

import attrs
import grpc
from google.protobuf import json_format
from google.protobuf.message import Message
from google.rpc import status_pb2  # type: ignore[import-untyped]
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)

from otel_ofu_collector.otlp.rejections import MalformedRequest
from otel_ofu_collector.receivers.admission import (
    MAX_REQUEST_BYTES,
    BodyBudget,
    BodyLease,
    Gate,
    OverBudget,
    TooLarge,
    inflate,
)
from otel_ofu_collector.receivers.auth import BearerAuth, TlsFiles
from otel_ofu_collector.receivers.base import INLINE_BYTES, LISTEN_BACKLOG, Ingest
from otel_ofu_collector.receivers.http_framing import (
    BODY_DEADLINE_S,
    BODY_GRACE_S,
    BODY_MIN_RATE,
    HEADER_DEADLINE_S,
    READ_TIMEOUT_S,
    HttpServer,
    Limits,
    RequestHead,
    Response,
)

__all__ = ["BODY_DEADLINE_S", "BODY_GRACE_S", "BODY_MIN_RATE", "LISTEN_BACKLOG", "HttpReceiver", "grpc_code"]

logger = logging.getLogger(__name__)

METRICS_PATH = "/v1/metrics"
PROTOBUF = "application/x-protobuf"
JSON = "application/json"
_GRPC_CODES = {  # the OTLP/HTTP error body is a google.rpc.Status: its code is the gRPC one
    HTTPStatus.BAD_REQUEST: grpc.StatusCode.INVALID_ARGUMENT,
    HTTPStatus.UNAUTHORIZED: grpc.StatusCode.UNAUTHENTICATED,
    HTTPStatus.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    HTTPStatus.METHOD_NOT_ALLOWED: grpc.StatusCode.UNIMPLEMENTED,
    HTTPStatus.REQUEST_TIMEOUT: grpc.StatusCode.DEADLINE_EXCEEDED,
    HTTPStatus.LENGTH_REQUIRED: grpc.StatusCode.INVALID_ARGUMENT,
    HTTPStatus.REQUEST_ENTITY_TOO_LARGE: grpc.StatusCode.INVALID_ARGUMENT,
    HTTPStatus.UNSUPPORTED_MEDIA_TYPE: grpc.StatusCode.INVALID_ARGUMENT,
    HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE: grpc.StatusCode.INVALID_ARGUMENT,
    HTTPStatus.INTERNAL_SERVER_ERROR: grpc.StatusCode.INTERNAL,
    HTTPStatus.SERVICE_UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
}


def grpc_code(status: HTTPStatus) -> int:
    """The google.rpc.Status code an OTLP/HTTP error body carries for ``status``."""
    return int(_GRPC_CODES.get(status, grpc.StatusCode.UNKNOWN).value[0])


@attrs.define
class HttpReceiver:
    """Serves ``POST /v1/metrics`` on ``host:port`` (port 0 picks one; ``port`` tells which after ``start``)."""

    kind: ClassVar[str] = "http"
    ingest: Ingest
    gate: Gate
    listen: str = "0.0.0.0:4318"
    tls: TlsFiles | None = None
    auth: BearerAuth | None = None
    max_request_bytes: int = MAX_REQUEST_BYTES
    # A client silent this long mid-request (or idle on a keep-alive connection) is dropped.
    read_timeout_s: float = READ_TIMEOUT_S
    # A body not complete this long after its headers is answered 408 however steadily it drips.
    body_deadline_s: float = BODY_DEADLINE_S
    header_deadline_s: float = HEADER_DEADLINE_S
    # The bytes of bodies being received, inflated and processed (default: 4 x max_request_bytes, two per peer); the
    # service gives both receivers one.
    bodies: BodyBudget = attrs.field(
        default=attrs.Factory(
            lambda self: BodyBudget(max_bytes=4 * self.max_request_bytes, max_peer_bytes=2 * self.max_request_bytes),
            takes_self=True,
        )
    )
    # A body slower than this on average (bytes/s) after its first body_grace_s is answered 408; 0: no minimum.
    body_min_rate: float = BODY_MIN_RATE
    body_grace_s: float = BODY_GRACE_S
    # When it says so, a small uncompressed protobuf request is answered on the server's own thread, as the gRPC
    # receiver's are (``receivers.base.INLINE_BYTES``); the service says so while the windows' lock is free. None:
    # always on a worker thread.
    inline_when: Callable[[], bool] | None = None
    port: int = 0
    _server: HttpServer | None = attrs.field(init=False, default=None)

    def start(self) -> int:
        """Bind and serve; OSError (one line, naming the address) when the port cannot be had."""
        host, _, port = self.listen.rpartition(":")
        context = None
        if self.tls is not None:
            import ssl

            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(self.tls.cert, self.tls.key)
            if self.tls.client_ca:
                context.load_verify_locations(self.tls.client_ca)
                context.verify_mode = ssl.CERT_REQUIRED
        limits = Limits(
            max_body_bytes=self.max_request_bytes,
            read_timeout_s=self.read_timeout_s,
            header_deadline_s=self.header_deadline_s,
            body_deadline_s=self.body_deadline_s,
            body_min_rate=self.body_min_rate,
            body_grace_s=self.body_grace_s,
        )
        server = HttpServer(
            _OtlpApp(self), host, int(port), limits, self.bodies, context, "otlp-http", self.gate.max_in_flight
        )
        try:
            self.port = server.start()
        except OSError as error:
            raise OSError(f"cannot listen for OTLP/HTTP on {self.listen} ({error.strerror or error})") from error
        self._server = server
        return self.port

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None


@attrs.frozen
class _OtlpApp:
    """OTLP/HTTP on a parsed request (``http_framing.HttpApp``): which requests are served, and how."""

    owner: HttpReceiver

    def admit(self, head: RequestHead) -> Response | None:
        owner = self.owner
        as_json = _is_json(head)
        if head.path != METRICS_PATH:
            return _error(HTTPStatus.NOT_FOUND, f"only POST {METRICS_PATH} is served", as_json)
        if head.method != "POST":
            return _error(HTTPStatus.METHOD_NOT_ALLOWED, f"only POST {METRICS_PATH} is served", as_json, _ALLOW_POST)
        if owner.auth is not None and not owner.auth.allows(head.get("authorization")):
            return _error(HTTPStatus.UNAUTHORIZED, "missing or wrong bearer token", as_json, _BEARER)
        if _content_type(head) not in (PROTOBUF, JSON):
            return _error(HTTPStatus.UNSUPPORTED_MEDIA_TYPE, f"Content-Type must be {PROTOBUF} or {JSON}", as_json)
        if owner.gate.closing:
            owner.gate.count_refusal("shutdown")
            return _error(HTTPStatus.SERVICE_UNAVAILABLE, "collector shutdown, retry later", as_json, self._retry())
        if owner.gate.full:  # busy now: the client retries later rather than send a body to be refused
            owner.gate.count_refusal("overload")
            return _error(HTTPStatus.SERVICE_UNAVAILABLE, "collector overload, retry later", as_json, self._retry())
        return None

    def refuse(self, head: RequestHead | None, status: HTTPStatus, message: str) -> Response:
        headers: tuple[tuple[str, str], ...] = ()
        if status == HTTPStatus.SERVICE_UNAVAILABLE:  # the body budget: overload, as the gate's own refusals
            self.owner.gate.count_refusal("overload")
            headers = self._retry()
        elif status == HTTPStatus.REQUEST_TIMEOUT:  # routine for a slow client: not worth a line each
            logger.debug("OTLP/HTTP client %s: %s", head.peer if head else "?", message)
        else:
            logger.info("OTLP/HTTP client %s: %s (%d)", head.peer if head else "?", message, status)
        return _error(status, message, head is not None and _is_json(head), headers)

    def inline(self, head: RequestHead, body: bytes) -> bool:
        inline_when = self.owner.inline_when
        return (
            inline_when is not None
            and len(body) <= INLINE_BYTES
            and _content_type(head) == PROTOBUF
            and (head.get("content-encoding") or "identity").strip().lower() in ("identity", "")
            and inline_when()
        )

    def respond(self, head: RequestHead, body: bytes, lease: BodyLease) -> Response:
        """The body is in: only now does the request take a gate slot, so a slow sender never holds one."""
        owner = self.owner
        as_json = _is_json(head)
        why = owner.gate.enter()
        if why is not None:
            return _error(HTTPStatus.SERVICE_UNAVAILABLE, f"collector {why}, retry later", as_json, self._retry())
        try:
            return self._export(head, body, as_json, lease)
        finally:
            owner.gate.leave()

    def _retry(self) -> tuple[tuple[str, str], ...]:
        return (("Retry-After", str(max(1, math.ceil(self.owner.gate.retry_after_s)))),)

    def _export(self, head: RequestHead, body: bytes, as_json: bool, lease: BodyLease) -> Response:
        owner = self.owner
        encoding = (head.get("content-encoding") or "identity").strip().lower()
        try:
            if encoding in ("gzip", "deflate"):  # inflated in the body budget (``admission.inflate``)
                body = inflate(body, gzip=encoding == "gzip", limit=owner.max_request_bytes, lease=lease)
            elif encoding not in ("identity", ""):
                return _error(HTTPStatus.UNSUPPORTED_MEDIA_TYPE, f"Content-Encoding {encoding} not supported", as_json)
        except TooLarge:
            return _error(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"body inflates past {owner.max_request_bytes} bytes", as_json
            )
        except OverBudget:
            owner.gate.count_refusal("overload")
            return _error(HTTPStatus.SERVICE_UNAVAILABLE, _INFLATING, as_json, self._retry())
        except (zlib.error, EOFError) as error:
            return _error(HTTPStatus.BAD_REQUEST, f"bad {encoding} body: {error}", as_json)
        if as_json:  # read here and passed on as the same request in protobuf's encoding
            try:
                parsed = json_format.Parse(body, ExportMetricsServiceRequest(), ignore_unknown_fields=True)
            except (json_format.ParseError, UnicodeDecodeError, ValueError, RuntimeError) as error:
                return _error(HTTPStatus.BAD_REQUEST, f"malformed ExportMetricsServiceRequest: {error}", as_json)
            body = parsed.SerializeToString()
        if owner.gate.closing:
            return _error(HTTPStatus.SERVICE_UNAVAILABLE, "collector shutdown, retry later", as_json, self._retry())
        try:
            outcome = owner.ingest(body)
        except MalformedRequest as error:
            return _error(HTTPStatus.BAD_REQUEST, str(error), as_json)
        except Exception:  # one bad request must not take the receiver down
            logger.exception("OTLP/HTTP request failed inside the collector")
            return _error(HTTPStatus.INTERNAL_SERVER_ERROR, "internal error while processing the request", as_json)
        if not outcome.rejected:
            return _ACCEPTED_JSON if as_json else _ACCEPTED
        response = ExportMetricsServiceResponse()
        response.partial_success.rejected_data_points = outcome.rejected
        response.partial_success.error_message = outcome.error_message
        return _message(HTTPStatus.OK, response, as_json)


_ALLOW_POST = (("Allow", "POST"),)
_INFLATING = "overloaded (request bodies being inflated), retry later"
_BEARER = (("WWW-Authenticate", "Bearer"),)


def _content_type(head: RequestHead) -> str:
    return (head.get("content-type") or "").split(";")[0].strip().lower()


def _is_json(head: RequestHead) -> bool:
    """Whether to answer in JSON: bodies answer in the request's encoding."""
    return _content_type(head) == JSON


def _message(status: HTTPStatus, message: Message, as_json: bool, headers: Sequence[tuple[str, str]] = ()) -> Response:
    body = json_format.MessageToJson(message).encode() if as_json else message.SerializeToString()
    return Response(int(status), body, (("Content-Type", JSON if as_json else PROTOBUF), *headers))


def _error(status: HTTPStatus, message: str, as_json: bool, headers: Sequence[tuple[str, str]] = ()) -> Response:
    """An OTLP/HTTP error: a google.rpc.Status whose code is the gRPC equivalent of ``status``."""
    return _message(status, status_pb2.Status(code=grpc_code(status), message=message), as_json, headers)


# Every point taken: the same answer each time (an empty ExportMetricsServiceResponse), made once.
_ACCEPTED: Final = _message(HTTPStatus.OK, ExportMetricsServiceResponse(), as_json=False)
_ACCEPTED_JSON: Final = _message(HTTPStatus.OK, ExportMetricsServiceResponse(), as_json=True)
