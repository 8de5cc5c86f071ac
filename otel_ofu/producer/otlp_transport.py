"""One attempt at sending a serialized ExportMetricsServiceRequest over OTLP/gRPC or OTLP/HTTP.

The bytes go as they are: over gRPC with grpcio's generic unary call on the OTLP method path (no
serializer: the payload already is the request), over HTTP as a ``POST`` of ``application/x-protobuf`` with
requests (a pooled session: proxies, ``REQUESTS_CA_BUNDLE`` and redirects as the SDK's HTTP exporter had
them). An ``Attempt`` says whether the request was delivered (and what the receiver rejected of it:
``partial_success``), whether the OTLP specification calls the failure retryable, the delay the receiver
asked for (gRPC RetryInfo, HTTP ``Retry-After``) and the failure's likely cause in words. Retrying is the
exporter's job (``exporters.py``).

The cause names what a user would fix: nothing listening; a gRPC port spoken to over HTTP or an OTLP/HTTP
port over gRPC (with the protocol setting to use); TLS spoken to a plain-text port or the reverse; an
untrusted certificate; no answer in time; credentials refused; no OTLP receiver at the path. Where the
error alone cannot tell (a connection closed without a word), the port is asked once, with a second
connection, what it speaks (HTTP/2, HTTP/1.1 or TLS).
"""

from __future__ import annotations

import contextlib
import email.utils
import gzip
import http.client
import math
import socket
import ssl
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol
from urllib.parse import urlparse

import attrs
import grpc
import requests
from google.protobuf.message import DecodeError
from google.rpc import error_details_pb2, status_pb2  # type: ignore[import-untyped]
from grpc_status import rpc_status
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceResponse

from otel_ofu import __version__
from otel_ofu.producer.otlp_settings import (
    GRPC,
    HTTP_PROTOBUF,
    PROTOCOL_OPTION,
    PROTOCOL_VARIABLE,
    ExporterConfigError,
    OtlpSettings,
)

EXPORT_METHOD = "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export"
USER_AGENT = f"otel-ofu/{__version__}"
# The OTLP specification's retryable gRPC codes; RESOURCE_EXHAUSTED only when the server sends RetryInfo
# (out of capacity for now), never without (a quota or a size limit no retry cures).
RETRYABLE_GRPC = frozenset(
    {
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.OUT_OF_RANGE,
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DATA_LOSS,
    }
)
RETRYABLE_HTTP = frozenset({429, 502, 503, 504})
RETRY_INFO_TRAILER = "google.rpc.retryinfo-bin"
# gRPC reconnects to a failed address with its own backoff, up to 2 minutes by default: a collector back
# after an outage would then wait that long for its producers. Capped at a few seconds instead.
MAX_RECONNECT_BACKOFF_MS = 5_000
PROBE_TIMEOUT_S = 1.0
# What a client sends first on an HTTP/2 connection: the preface, then an empty SETTINGS frame.
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


@attrs.frozen
class Attempt:
    delivered: bool
    retryable: bool = False
    retry_after_s: float | None = None
    cause: str = ""  # why it failed, in one line (for a delivered request: empty)
    rejected_points: int = 0  # partial_success: data points the receiver refused
    rejection: str = ""  # and what it said about them


class Sender(Protocol):
    """One attempt per ``send``; ``close`` aborts a call in flight where the transport can."""

    def send(self, payload: bytes, timeout_s: float) -> Attempt: ...

    def close(self) -> None: ...


def open_sender(settings: OtlpSettings) -> Sender:
    if settings.protocol == GRPC:
        return GrpcSender(settings)
    return HttpSender(settings)


def _read(path: str | None, what: str) -> bytes | None:
    if not path:
        return None
    try:
        return Path(path).read_bytes()
    except OSError as error:
        raise ExporterConfigError(
            f"cannot read the {what} {path!r} (OTEL_EXPORTER_OTLP_[METRICS_]{what.upper().replace(' ', '_')}): "
            f"{error.strerror or error}"
        ) from None


def _delivered(response: bytes) -> Attempt:
    """A delivered request, with what the receiver's ``partial_success`` says it refused."""
    if not response:
        return Attempt(True)
    try:
        partial = ExportMetricsServiceResponse.FromString(response).partial_success
    except DecodeError:
        return Attempt(True)  # a receiver that answers something else still took the request
    return Attempt(True, rejected_points=partial.rejected_data_points, rejection=partial.error_message)


# --- gRPC -------------------------------------------------------------------------------------------


@attrs.define
class GrpcSender:
    settings: OtlpSettings
    _channel: grpc.Channel = attrs.field(init=False)
    _call: grpc.UnaryUnaryMultiCallable[bytes, bytes] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        settings = self.settings
        options = [("grpc.primary_user_agent", USER_AGENT), ("grpc.max_reconnect_backoff_ms", MAX_RECONNECT_BACKOFF_MS)]
        compression = {"gzip": grpc.Compression.Gzip, "deflate": grpc.Compression.Deflate}.get(
            settings.compression or ""
        )
        if settings.tls:
            credentials = grpc.ssl_channel_credentials(
                _read(settings.certificate, "certificate"),
                _read(settings.client_key, "client key"),
                _read(settings.client_certificate, "client certificate"),
            )
            self._channel = grpc.secure_channel(settings.grpc_target, credentials, options, compression)
        else:
            self._channel = grpc.insecure_channel(settings.grpc_target, options, compression)
        # No serializers: bytes in (the request as encoded), bytes out (the response, read for partial success).
        self._call = self._channel.unary_unary(EXPORT_METHOD, None, None)

    def send(self, payload: bytes, timeout_s: float) -> Attempt:
        try:
            response = self._call(payload, timeout=timeout_s, metadata=self.settings.headers)
        except grpc.RpcError as error:
            return grpc_failure(error, self.settings)
        return _delivered(response)

    def close(self) -> None:
        self._channel.close()  # a call in flight ends at once, CANCELLED


def grpc_failure(error: grpc.RpcError, settings: OtlpSettings) -> Attempt:
    if not isinstance(error, grpc.Call):  # every RpcError grpcio raises for a call is one
        return Attempt(False, True, cause=str(error))
    code, details = error.code(), error.details() or ""
    delay = _grpc_retry_delay(error)
    retryable = code in RETRYABLE_GRPC or (code == grpc.StatusCode.RESOURCE_EXHAUSTED and delay is not None)
    cause = grpc_cause(code, details, settings)
    if misconfigured(cause):
        retryable = False  # a retry a second later cannot cure these: the next interval tries again
    return Attempt(False, retryable, delay, cause)


def _grpc_retry_delay(error: grpc.Call) -> float | None:
    """The receiver's RetryInfo: in the ``google.rpc.retryinfo-bin`` trailer or the standard status details."""
    infos: list[error_details_pb2.RetryInfo] = []
    for key, value in error.trailing_metadata() or ():
        if key == RETRY_INFO_TRAILER and isinstance(value, bytes):
            with contextlib.suppress(DecodeError):
                infos.append(error_details_pb2.RetryInfo.FromString(value))
    if not infos:
        try:
            status = rpc_status.from_call(error)
        except (ValueError, DecodeError):  # details inconsistent with the call's code
            status = None
        for detail in status.details if status is not None else ():
            if detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
                info = error_details_pb2.RetryInfo()
                detail.Unpack(info)
                infos.append(info)
    for info in infos:
        return float(info.retry_delay.seconds + info.retry_delay.nanos / 1e9)
    return None


_WRONG_PROTOCOL_HTTP1 = (
    "it answers in HTTP/1.1, not gRPC: this looks like an OTLP/HTTP port (4318 by default); send OTLP/HTTP with "
    f"{PROTOCOL_OPTION} {HTTP_PROTOBUF} ({PROTOCOL_VARIABLE}={HTTP_PROTOBUF}) or use the receiver's gRPC port (4317)"
)
_WRONG_PROTOCOL_HTTP2 = (
    "it answers in HTTP/2, as a gRPC server does: this looks like an OTLP/gRPC port (4317 by default); send gRPC "
    f"with {PROTOCOL_OPTION} {GRPC} ({PROTOCOL_VARIABLE}={GRPC}) or use the receiver's OTLP/HTTP port (4318)"
)
_REFUSED = "nothing is listening there (connection refused): is the receiver running, on this host and port?"
_TLS_VERIFY = "its TLS certificate is not trusted"
_TLS_TO_PLAIN = "the TLS handshake failed: the port seems to speak plain text"
_PLAIN_TO_TLS = "it speaks TLS and this exporter plain text: use an https:// endpoint"


def _tls_to_plain(settings: OtlpSettings) -> str:
    fix = (
        "use an http:// endpoint"
        if "://" in settings.endpoint
        else "use an http:// endpoint or OTEL_EXPORTER_OTLP_INSECURE=true"
    )
    return f"{_TLS_TO_PLAIN}; {fix}"


def misconfigured(cause: str) -> bool:
    """A cause only a change of settings cures (protocol, TLS): not retried within an export."""
    return cause in (_WRONG_PROTOCOL_HTTP1, _WRONG_PROTOCOL_HTTP2, _PLAIN_TO_TLS) or cause.startswith(
        (_TLS_VERIFY, _TLS_TO_PLAIN)
    )


def grpc_cause(code: grpc.StatusCode, details: str, settings: OtlpSettings) -> str:
    """The likely cause of a failed gRPC call, in words (``CODE: details`` when there is nothing to add)."""
    said = f"{code.name}: {details}" if details else code.name
    lowered = details.lower()
    if code == grpc.StatusCode.UNAVAILABLE or code == grpc.StatusCode.UNKNOWN:
        if "connection refused" in lowered:
            return _REFUSED
        if "http1.x server" in lowered or "failed parsing http/2" in lowered:
            return _WRONG_PROTOCOL_HTTP1
        if "dns resolution failed" in lowered or "errors resolving" in lowered or "domain name not found" in lowered:
            return f"cannot resolve its host name ({said})"
        if "certificate_verify_failed" in lowered:
            return f"{_TLS_VERIFY}: give its CA in OTEL_EXPORTER_OTLP_CERTIFICATE ({said})"
        if "tls handshake failed" in lowered or "ssl" in lowered:
            return _tls_to_plain(settings)
        if "socket closed" in lowered or "connection reset" in lowered:
            spoken = probe(settings.grpc_target)
            if spoken == "tls" and not settings.tls:
                return _PLAIN_TO_TLS
            if spoken == "http1":
                return _WRONG_PROTOCOL_HTTP1
        return f"the receiver is unavailable ({said})"
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return f"no answer within the export timeout ({settings.timeout_s:g} s, OTEL_EXPORTER_OTLP_TIMEOUT)"
    if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
        return f"the receiver refused the credentials ({said}): check OTEL_EXPORTER_OTLP_HEADERS"
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return f"it has no OTLP metrics service ({said}): is it an OTLP receiver?"
    if code in RETRYABLE_GRPC or code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return f"the receiver could not take the request ({said})"
    return f"the receiver refused the request ({said})"


# --- HTTP -------------------------------------------------------------------------------------------


@attrs.define
class HttpSender:
    settings: OtlpSettings
    _session: requests.Session = attrs.field(init=False, factory=requests.Session)
    _headers: dict[str, str] = attrs.field(init=False, factory=dict)
    _verify: bool | str = attrs.field(init=False, default=True)
    _cert: str | tuple[str, str] | None = attrs.field(init=False, default=None)

    def __attrs_post_init__(self) -> None:
        settings = self.settings
        # Read now, so a missing file is the command's error, not every export's.
        _read(settings.certificate, "certificate")
        _read(settings.client_key, "client key")
        _read(settings.client_certificate, "client certificate")
        self._verify = settings.certificate or True
        if settings.client_certificate and settings.client_key:
            self._cert = (settings.client_certificate, settings.client_key)
        elif settings.client_certificate:
            self._cert = settings.client_certificate
        self._headers = {"Content-Type": "application/x-protobuf", "User-Agent": USER_AGENT}
        if settings.compression:
            self._headers["Content-Encoding"] = settings.compression
        self._headers.update(settings.headers)

    def send(self, payload: bytes, timeout_s: float) -> Attempt:
        if self.settings.compression == "gzip":
            payload = gzip.compress(payload, compresslevel=6)
        elif self.settings.compression == "deflate":
            payload = zlib.compress(payload)
        try:
            response = self._session.post(
                self.settings.endpoint,
                data=payload,
                headers=self._headers,
                timeout=timeout_s,
                verify=self._verify,
                cert=self._cert,
            )
        except requests.RequestException as error:
            return http_exception_failure(error, self.settings)
        with response:
            if 200 <= response.status_code < 300:
                return _delivered(response.content)
            retryable = response.status_code in RETRYABLE_HTTP
            delay = retry_after_s(response.headers.get("Retry-After")) if retryable else None
            return Attempt(False, retryable, delay, http_status_cause(response.status_code, response.content))

    def close(self) -> None:
        self._session.close()  # idle connections; a request in flight ends at its timeout


def retry_after_s(value: str | None, now: float | None = None) -> float | None:
    """``Retry-After`` in seconds: a number of seconds or an HTTP date (RFC 9110); None when absent or bad."""
    if not value or not value.strip():
        return None
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(text)
        except (TypeError, ValueError):
            return None
        seconds = when.timestamp() - (time.time() if now is None else now)
    return max(seconds, 0.0) if math.isfinite(seconds) else None


def http_status_cause(status: int, body: bytes) -> str:
    """An HTTP error answer in words, with the receiver's own message (a google.rpc.Status body, else text)."""
    said = f"HTTP {status}"
    message = _status_message(body)
    if message:
        said += f": {message}"
    if status in (401, 403):
        return f"the receiver refused the credentials ({said}): check OTEL_EXPORTER_OTLP_HEADERS"
    if status in (404, 405):
        return f"no OTLP/HTTP receiver at this URL ({said}): OTLP/HTTP metrics are POSTed to /v1/metrics"
    if status in (502, 503, 504) or status == 429:
        return f"the receiver is unavailable ({said})"
    return f"the receiver refused the request ({said})"


def _status_message(body: bytes) -> str:
    if not body:
        return ""
    try:
        message: str = status_pb2.Status.FromString(body).message
    except DecodeError:
        message = ""
    if not message:
        text = body[:200].decode("utf-8", "replace")
        message = text if text.isprintable() or "\n" in text else ""
    return " ".join(message.split())[:200]


def _chain(error: BaseException) -> Iterator[BaseException]:
    """The error and everything it wraps: requests and urllib3 nest the socket's error a few levels deep
    (in their arguments and as the cause or context of each)."""
    seen: set[int] = set()
    todo = [error]
    while todo:
        current = todo.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        todo.extend(arg for arg in current.args if isinstance(arg, BaseException))
        todo.extend(linked for linked in (current.__cause__, current.__context__) if linked is not None)


def http_exception_failure(error: requests.RequestException, settings: OtlpSettings) -> Attempt:
    chain = list(_chain(error))
    said = " ".join(str(error).split())[:300]
    host_port = _host_port(settings.endpoint)

    def found(kind: type[BaseException] | tuple[type[BaseException], ...]) -> BaseException | None:
        return next((item for item in chain if isinstance(item, kind)), None)

    if isinstance(error, requests.Timeout) and not isinstance(error, requests.ConnectTimeout):
        return Attempt(False, True, cause=f"no answer within the export timeout ({settings.timeout_s:g} s, "
                       "OTEL_EXPORTER_OTLP_TIMEOUT)")  # fmt: skip
    if found(ConnectionRefusedError):
        return Attempt(False, True, cause=_REFUSED)
    if found(socket.gaierror):
        return Attempt(False, True, cause=f"cannot resolve its host name ({said})")
    if isinstance(error, requests.ConnectTimeout):
        return Attempt(False, True, cause=f"no connection within the export timeout ({settings.timeout_s:g} s)")
    if found(ssl.SSLCertVerificationError):
        return Attempt(False, False, cause=f"{_TLS_VERIFY}: give its CA in OTEL_EXPORTER_OTLP_CERTIFICATE ({said})")
    if found(ssl.SSLError):
        return Attempt(False, False, cause=_tls_to_plain(settings))
    status_line = found(http.client.BadStatusLine)
    if status_line is not None and str(status_line.args[0] if status_line.args else "").startswith("\x00"):
        return Attempt(False, False, cause=_WRONG_PROTOCOL_HTTP2)  # an HTTP/2 frame where a status line belongs
    if status_line is not None or found((ConnectionResetError, http.client.RemoteDisconnected)):
        spoken = probe(host_port) if host_port else None
        if spoken == "http2":
            return Attempt(False, False, cause=_WRONG_PROTOCOL_HTTP2)
        if spoken == "tls" and not settings.tls:
            return Attempt(False, False, cause=_PLAIN_TO_TLS)
        return Attempt(False, True, cause=f"the connection was closed without an answer ({said})")
    return Attempt(False, True, cause=said)


def _host_port(url: str) -> str | None:
    parsed = urlparse(url)
    if not parsed.hostname:
        return None
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    host = f"[{parsed.hostname}]" if ":" in parsed.hostname else parsed.hostname
    return f"{host}:{port}"


# --- what a port speaks -----------------------------------------------------------------------------


def probe(host_port: str, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """``http2``, ``http1`` or ``tls``: what the server at ``host_port`` answers an HTTP/2 preface with
    (and, when it answers nothing, whether it completes a TLS handshake); None when it cannot tell."""
    host, _, port_text = host_port.rpartition(":")
    host = host.strip("[]")
    try:
        port = int(port_text)
    except ValueError:
        return None
    try:
        with socket.create_connection((host, port), timeout_s) as connection:
            connection.sendall(_H2_PREFACE)
            first = connection.recv(16)
    except OSError:
        first = b""
    if len(first) >= 9 and first[3] == 0x04:  # a frame header (3-byte length, type): SETTINGS
        return "http2"
    if first[:1] == b"\x15":  # a TLS alert record
        return "tls"
    if first and 0x20 <= first[0] < 0x7F:  # text: an HTTP/1 status line (or a bare error page, HTTP/0.9 style)
        return "http1"
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # only asking whether it speaks TLS at all
    try:
        with (
            socket.create_connection((host, port), timeout_s) as connection,
            context.wrap_socket(connection, server_hostname=host),
        ):
            return "tls"
    except (OSError, ssl.SSLError):
        return None
