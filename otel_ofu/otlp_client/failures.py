"""A failed attempt as an ``Attempt``: whether the OTLP rules retry it, after how long, and its likely cause.

The cause names what a user would fix: nothing listening; a gRPC port spoken to over HTTP or an OTLP/HTTP
port over gRPC (with the protocol setting to use); TLS spoken to a plain-text port or the reverse; an
untrusted certificate; no answer in time; credentials refused; no OTLP receiver at the path. Where the
error alone cannot tell (a connection closed without a word), the port is asked once, with a second
connection, what it speaks (HTTP/2, HTTP/1.1 or TLS). The protocol and TLS causes are ``misconfigured``:
only a change of settings cures them.
"""

from __future__ import annotations

import http.client
import socket
import ssl
from collections.abc import Iterator
from urllib.parse import urlparse

import grpc
import requests
from google.protobuf.message import DecodeError
from google.rpc import status_pb2  # type: ignore[import-untyped]

from otel_ofu.otlp_client.retry import (
    RETRYABLE_GRPC,
    RETRYABLE_HTTP,
    Attempt,
    grpc_retry_delay,
    grpc_retryable,
    retry_after_s,
)
from otel_ofu.otlp_client.settings import GRPC, HTTP_PROTOBUF, PROTOCOL_VARIABLE, OtlpSettings

PROBE_TIMEOUT_S = 1.0
# What a client sends first on an HTTP/2 connection: the preface, then an empty SETTINGS frame.
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"

_REFUSED = "nothing is listening there (connection refused): is the receiver running, on this host and port?"
_TLS_VERIFY = "its TLS certificate is not trusted: give its CA in OTEL_EXPORTER_OTLP_CERTIFICATE"
_TLS_TO_PLAIN = "the TLS handshake failed: the port seems to speak plain text"
_PLAIN_TO_TLS = "it speaks TLS and this exporter plain text: use an https:// endpoint"


def _grpc_to_http_port(settings: OtlpSettings) -> str:
    option = settings.protocol_option
    return (
        "it answers in HTTP/1.1, not gRPC: this looks like an OTLP/HTTP port (4318 by default); send OTLP/HTTP with "
        f"{option} {HTTP_PROTOBUF} ({PROTOCOL_VARIABLE}={HTTP_PROTOBUF}) or use the receiver's gRPC port (4317)"
    )


def _http_to_grpc_port(settings: OtlpSettings) -> str:
    option = settings.protocol_option
    return (
        "it answers in HTTP/2, as a gRPC server does: this looks like an OTLP/gRPC port (4317 by default); send gRPC "
        f"with {option} {GRPC} ({PROTOCOL_VARIABLE}={GRPC}) or use the receiver's OTLP/HTTP port (4318)"
    )


def _tls_to_plain(settings: OtlpSettings) -> str:
    fix = (
        "use an http:// endpoint"
        if "://" in settings.endpoint
        else "use an http:// endpoint or OTEL_EXPORTER_OTLP_INSECURE=true"
    )
    return f"{_TLS_TO_PLAIN}; {fix}"


def _misconfigured(cause: str) -> Attempt:
    """A failure only a change of settings cures: retryable as a connection failure, but not within an export."""
    return Attempt(False, True, cause=cause, misconfigured=True)


# --- gRPC -------------------------------------------------------------------------------------------


def grpc_failure(error: grpc.RpcError, settings: OtlpSettings) -> Attempt:
    if not isinstance(error, grpc.Call):  # every RpcError grpcio raises for a call is one
        return Attempt(False, True, cause=str(error))
    code, details = error.code(), error.details() or ""
    delay = grpc_retry_delay(error)
    said = f"{code.name}: {details}" if details else code.name
    retryable = grpc_retryable(code, delay)
    if code == grpc.StatusCode.UNAVAILABLE or code == grpc.StatusCode.UNKNOWN:
        settings_cause = _grpc_connection_cause(details.lower(), said, retryable, settings)
        if settings_cause is not None:
            return settings_cause
    return Attempt(False, retryable, delay, grpc_cause(code, said, settings))


def _grpc_connection_cause(lowered: str, said: str, retryable: bool, settings: OtlpSettings) -> Attempt | None:
    """An UNAVAILABLE (or UNKNOWN) that says the connection, not the receiver, failed: why, when it can tell."""
    if "connection refused" in lowered:
        return Attempt(False, retryable, cause=_REFUSED)
    if "http1.x server" in lowered or "failed parsing http/2" in lowered:
        return _misconfigured(_grpc_to_http_port(settings))
    if "dns resolution failed" in lowered or "errors resolving" in lowered or "domain name not found" in lowered:
        return Attempt(False, retryable, cause=f"cannot resolve its host name ({said})")
    if "certificate_verify_failed" in lowered:
        return _misconfigured(f"{_TLS_VERIFY} ({said})")
    if "tls handshake failed" in lowered or "ssl" in lowered:
        return _misconfigured(_tls_to_plain(settings))
    if "socket closed" in lowered or "connection reset" in lowered:
        spoken = probe(settings.grpc_target)
        if spoken == "tls" and not settings.tls:
            return _misconfigured(_PLAIN_TO_TLS)
        if spoken == "http1":
            return _misconfigured(_grpc_to_http_port(settings))
    return None


def grpc_cause(code: grpc.StatusCode, said: str, settings: OtlpSettings) -> str:
    """The likely cause of a gRPC status, in words (``CODE: details`` when there is nothing to add)."""
    if code == grpc.StatusCode.UNAVAILABLE or code == grpc.StatusCode.UNKNOWN:
        return f"the receiver is unavailable ({said})"
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return f"no answer within the export timeout ({settings.timeout_s:g} s, OTEL_EXPORTER_OTLP_TIMEOUT)"
    if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
        return f"the receiver refused the credentials ({said}): check OTEL_EXPORTER_OTLP_HEADERS"
    if code == grpc.StatusCode.UNIMPLEMENTED:
        signal = settings.signal
        return f"it has no OTLP {signal} service ({said}): is it an OTLP receiver with a {signal} pipeline?"
    if code in RETRYABLE_GRPC or code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return f"the receiver could not take the request ({said})"
    return f"the receiver refused the request ({said})"


# --- HTTP -------------------------------------------------------------------------------------------


def http_status_failure(status: int, body: bytes, retry_after: str | None) -> Attempt:
    """An HTTP error answer: retryable as the rules say, after its ``Retry-After``."""
    retryable = status in RETRYABLE_HTTP
    delay = retry_after_s(retry_after) if retryable else None
    return Attempt(False, retryable, delay, http_status_cause(status, body))


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
    if status in RETRYABLE_HTTP:
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
    """A request that got no HTTP answer: every such failure is retryable, but for the settings' own."""
    chain = list(_chain(error))
    said = " ".join(str(error).split())[:300]

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
        return _misconfigured(f"{_TLS_VERIFY} ({said})")
    if found(ssl.SSLError):
        return _misconfigured(_tls_to_plain(settings))
    status_line = found(http.client.BadStatusLine)
    if status_line is not None and str(status_line.args[0] if status_line.args else "").startswith("\x00"):
        return _misconfigured(_http_to_grpc_port(settings))  # an HTTP/2 frame where a status line belongs
    if status_line is not None or found((ConnectionResetError, http.client.RemoteDisconnected)):
        host_port = _host_port(settings.endpoint)
        spoken = probe(host_port) if host_port else None
        if spoken == "http2":
            return _misconfigured(_http_to_grpc_port(settings))
        if spoken == "tls" and not settings.tls:
            return _misconfigured(_PLAIN_TO_TLS)
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
