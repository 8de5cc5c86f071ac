"""One attempt at sending a serialized OTLP export request (metrics; logs where the settings' signal says) over
OTLP/gRPC or OTLP/HTTP.

The bytes go as they are: over gRPC with grpcio's generic unary call on the OTLP method path (no
serializer: the payload already is the request), over HTTP as a ``POST`` of ``application/x-protobuf`` with
requests (pooled connections, one session per sending thread: proxies, ``REQUESTS_CA_BUNDLE`` and redirects
as the SDK's HTTP exporter had them). Each ``send`` is one attempt, an ``Attempt``: delivered (with what the
receiver refused of it: ``partial_success``), or why not and whether the OTLP rules retry it
(``failures.py``). Retrying is the client's (``client.py``) or its caller's.

A sender may be shared by threads (the collector's window export, pass-through and self-metrics share one).
``close`` aborts a gRPC call in flight (it ends CANCELLED) and drops idle HTTP connections; a send after
``close`` opens the connection again.
"""

from __future__ import annotations

import gzip
import threading
import zlib
from pathlib import Path
from typing import Any, Protocol

import attrs
import grpc
import requests

from otel_ofu import __version__
from otel_ofu.otlp_client.failures import grpc_failure, http_exception_failure, http_status_failure
from otel_ofu.otlp_client.partial import delivered
from otel_ofu.otlp_client.retry import Attempt
from otel_ofu.otlp_client.settings import GRPC, LOGS, METRICS, ExporterConfigError, OtlpSettings

EXPORT_METHOD = "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export"
EXPORT_METHODS = {METRICS: EXPORT_METHOD, LOGS: "/opentelemetry.proto.collector.logs.v1.LogsService/Export"}
USER_AGENT = f"otel-ofu/{__version__}"
# gRPC reconnects to a failed address with its own backoff, up to 2 minutes by default: a collector back
# after an outage would then wait that long for its senders. Capped at a few seconds instead.
MAX_RECONNECT_BACKOFF_MS = 5_000


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


# --- gRPC -------------------------------------------------------------------------------------------


@attrs.define
class GrpcSender:
    settings: OtlpSettings
    _credentials: grpc.ChannelCredentials | None = attrs.field(init=False, default=None)
    _channel: grpc.Channel | None = attrs.field(init=False, default=None)
    _call: grpc.UnaryUnaryMultiCallable[bytes, bytes] | None = attrs.field(init=False, default=None)
    _lock: threading.Lock = attrs.field(init=False, factory=threading.Lock)

    def __attrs_post_init__(self) -> None:
        settings = self.settings
        if settings.tls:  # read now, so a missing file is the command's error, not every export's
            self._credentials = grpc.ssl_channel_credentials(
                _read(settings.certificate, "certificate"),
                _read(settings.client_key, "client key"),
                _read(settings.client_certificate, "client certificate"),
            )
        self._open()

    def _open(self) -> grpc.UnaryUnaryMultiCallable[bytes, bytes]:
        with self._lock:
            if self._call is not None:
                return self._call
            settings = self.settings
            options = [
                ("grpc.primary_user_agent", USER_AGENT),
                ("grpc.max_reconnect_backoff_ms", MAX_RECONNECT_BACKOFF_MS),
            ]
            compression = {"gzip": grpc.Compression.Gzip, "deflate": grpc.Compression.Deflate}.get(
                settings.compression or ""
            )
            if self._credentials is not None:
                channel = grpc.secure_channel(settings.grpc_target, self._credentials, options, compression)
            else:
                channel = grpc.insecure_channel(settings.grpc_target, options, compression)
            # No serializers: bytes in (the request as encoded), bytes out (the response, read for partial success).
            self._channel, self._call = channel, channel.unary_unary(EXPORT_METHODS[settings.signal], None, None)
            return self._call

    def send(self, payload: bytes, timeout_s: float) -> Attempt:
        call = self._call or self._open()
        try:
            response = call(payload, timeout=timeout_s, metadata=self.settings.headers)
        except grpc.RpcError as error:
            return grpc_failure(error, self.settings)
        return delivered(response)

    def close(self) -> None:
        with self._lock:
            channel, self._channel, self._call = self._channel, None, None
        if channel is not None:
            channel.close()  # a call in flight ends at once, CANCELLED


# --- HTTP -------------------------------------------------------------------------------------------


@attrs.define
class HttpSender:
    settings: OtlpSettings
    _headers: dict[str, str] = attrs.field(init=False, factory=dict)
    _verify: bool | str = attrs.field(init=False, default=True)
    _cert: str | tuple[str, str] | None = attrs.field(init=False, default=None)
    # requests' sessions are not made to be shared by threads: one per sending thread (a sender has one or a
    # few, each for its life), all closed by ``close``; a send after it opens a new one.
    _local: threading.local = attrs.field(init=False, factory=threading.local)
    _sessions: list[requests.Session] = attrs.field(init=False, factory=list)
    _generation: int = attrs.field(init=False, default=0)  # bumped by close: older sessions are closed
    _lock: threading.Lock = attrs.field(init=False, factory=threading.Lock)

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

    def _session(self) -> tuple[requests.Session, dict[str, Any]]:
        """This thread's session, and what requests reads from the environment for the endpoint (proxies and their
        exceptions, ``REQUESTS_CA_BUNDLE``), read once with the session: ``Session.post`` reads it again at every
        call, two passes over ``os.environ`` each, a quarter to a third of a small export's CPU."""
        local = self._local
        if getattr(local, "generation", None) != self._generation:
            with self._lock:
                session = requests.Session()
                local.session, local.generation = session, self._generation
                local.environment = session.merge_environment_settings(
                    self.settings.endpoint, {}, False, self._verify, self._cert
                )
                self._sessions.append(session)
        return local.session, local.environment

    def send(self, payload: bytes, timeout_s: float) -> Attempt:
        if self.settings.compression == "gzip":
            payload = gzip.compress(payload, compresslevel=6)
        elif self.settings.compression == "deflate":
            payload = zlib.compress(payload)
        session, environment = self._session()
        try:
            request = requests.Request("POST", self.settings.endpoint, data=payload, headers=self._headers)
            response = session.send(session.prepare_request(request), timeout=timeout_s, **environment)
        except requests.RequestException as error:
            return http_exception_failure(error, self.settings)
        with response:
            if 200 <= response.status_code < 300:
                return delivered(response.content)
            return http_status_failure(response.status_code, response.content, response.headers.get("Retry-After"))

    def close(self) -> None:
        with self._lock:
            sessions, self._sessions = self._sessions, []
            self._generation += 1
        for session in sessions:
            session.close()  # idle connections; a request in flight ends at its timeout
