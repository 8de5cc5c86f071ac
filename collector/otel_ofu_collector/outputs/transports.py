"""The raw OTLP clients that carry serialized ExportMetricsServiceRequest bytes to the downstream.

One client (gRPC or HTTP/protobuf) sends window outputs and pass-through alike. It reads the standard
``OTEL_EXPORTER_OTLP_[METRICS_]*`` variables (endpoint, protocol, headers, compression, timeout,
certificate, client key and certificate, insecure) as the SDK's exporters do. ``send`` says whether a
failure is worth retrying and after how long (RetryInfo / Retry-After).
"""

from __future__ import annotations

import logging
import os
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import unquote, urlparse

import attrs
import grpc
from google.rpc import error_details_pb2  # type: ignore[import-untyped]

logger = logging.getLogger(__name__)

EXPORT_METHOD = "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export"
# The OTLP spec's retryable codes. RESOURCE_EXHAUSTED is retryable only when the server sends RetryInfo
# (it is out of capacity for now); without it (a message over its size limit, a quota) no retry cures it.
RETRYABLE_GRPC = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.OUT_OF_RANGE,
        grpc.StatusCode.DATA_LOSS,
    }
)
RETRYABLE_HTTP = frozenset({429, 502, 503, 504})
GRPC = "grpc"
HTTP_PROTOBUF = "http/protobuf"


def _env(environ: Mapping[str, str], name: str) -> str | None:
    value = environ.get(f"OTEL_EXPORTER_OTLP_METRICS_{name}") or environ.get(f"OTEL_EXPORTER_OTLP_{name}")
    return value.strip() if value and value.strip() else None


def configured_endpoint(endpoint: str | None, environ: Mapping[str, str] | None = None) -> str | None:
    """Where a downstream is configured, as given: ``endpoint`` (an option), else the standard
    ``OTEL_EXPORTER_OTLP_METRICS_ENDPOINT``, else ``OTEL_EXPORTER_OTLP_ENDPOINT``; None when none is.

    None means no downstream at all, never a guessed localhost (for a collector that would be itself).
    ``DownstreamConfig.resolve`` turns a configured endpoint into the URL actually used.
    """
    if endpoint and endpoint.strip():
        return endpoint.strip()
    return _env(os.environ if environ is None else environ, "ENDPOINT")


def _parse_headers(text: str | None) -> tuple[tuple[str, str], ...]:
    pairs = []
    for item in (text or "").split(","):
        key, sep, value = item.partition("=")
        if sep and key.strip():
            pairs.append((unquote(key.strip()).lower(), unquote(value.strip())))
    return tuple(pairs)


@attrs.frozen
class DownstreamConfig:
    """Where and how to send: resolved from options first, then the standard OTLP variables."""

    endpoint: str
    protocol: str = GRPC
    headers: tuple[tuple[str, str], ...] = ()
    insecure: bool = True
    certificate: str | None = None
    client_key: str | None = None
    client_certificate: str | None = None
    compression: str | None = None
    timeout_s: float = 10.0

    @classmethod
    def resolve(
        cls, endpoint: str | None = None, protocol: str | None = None, environ: Mapping[str, str] | None = None
    ) -> DownstreamConfig:
        env = os.environ if environ is None else environ
        protocol = (protocol or _env(env, "PROTOCOL") or GRPC).lower()
        if protocol not in (GRPC, HTTP_PROTOBUF):
            raise ValueError(f"export protocol {protocol!r} not supported (use grpc or http/protobuf)")
        explicit_metrics = env.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")
        if endpoint is None and explicit_metrics:
            endpoint = explicit_metrics.strip()  # per spec: used as is, no /v1/metrics appended
        elif endpoint is None:
            base = env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or (
                "http://localhost:4317" if protocol == GRPC else "http://localhost:4318"
            )
            endpoint = base.strip()
            if protocol == HTTP_PROTOBUF:
                endpoint = endpoint.rstrip("/") + "/v1/metrics"
        elif protocol == HTTP_PROTOBUF and urlparse(endpoint).path in ("", "/"):
            endpoint = endpoint.rstrip("/") + "/v1/metrics"
        scheme = urlparse(endpoint).scheme if "://" in endpoint else ""
        if scheme in ("http", "https"):
            insecure = scheme == "http"
        else:
            insecure = (_env(env, "INSECURE") or "").lower() == "true" or _env(env, "CERTIFICATE") is None
        timeout = _env(env, "TIMEOUT")
        return cls(
            endpoint=endpoint,
            protocol=protocol,
            headers=_parse_headers(_env(env, "HEADERS")),
            insecure=insecure,
            certificate=_env(env, "CERTIFICATE"),
            client_key=_env(env, "CLIENT_KEY"),
            client_certificate=_env(env, "CLIENT_CERTIFICATE"),
            compression=(_env(env, "COMPRESSION") or "").lower() or None,
            timeout_s=float(timeout) if timeout else 10.0,  # seconds, as the Python SDK reads it
        )


@attrs.frozen
class SendOutcome:
    ok: bool
    retryable: bool = False
    retry_after_s: float | None = None
    error: str = ""


class Transport(Protocol):
    def send(self, payload: bytes) -> SendOutcome: ...

    def close(self) -> None: ...


def _read(path: str | None) -> bytes | None:
    return Path(path).read_bytes() if path else None


def _grpc_retry_delay(error: grpc.RpcError) -> float | None:
    trailers: Any = error.trailing_metadata() if hasattr(error, "trailing_metadata") else None
    for key, value in trailers or ():
        if key == "google.rpc.retryinfo-bin" and isinstance(value, bytes):
            info = error_details_pb2.RetryInfo.FromString(value)
            return float(info.retry_delay.seconds + info.retry_delay.nanos / 1e9)
    return None


@attrs.define
class GrpcTransport:
    """Sends serialized requests as they are (no re-encoding) with a generic unary call.

    Safe to share between senders (the service's window export and pass-through): the channel is opened
    and closed under a lock. A send after ``close`` opens a new channel.
    """

    config: DownstreamConfig
    _channel: grpc.Channel | None = None
    _lock: threading.Lock = attrs.field(factory=threading.Lock)
    method: str = attrs.field(default=EXPORT_METHOD, kw_only=True)  # the OTLP service's Export (logs: the flag events)

    def _call(self) -> Callable[..., bytes]:
        with self._lock:
            if self._channel is None:
                target = self.config.endpoint.split("://", 1)[-1].rstrip("/")
                compression = grpc.Compression.Gzip if self.config.compression == "gzip" else None
                if self.config.insecure:
                    self._channel = grpc.insecure_channel(target, compression=compression)
                else:
                    credentials = grpc.ssl_channel_credentials(
                        _read(self.config.certificate),
                        _read(self.config.client_key),
                        _read(self.config.client_certificate),
                    )
                    self._channel = grpc.secure_channel(target, credentials, compression=compression)
            channel = self._channel
        # No serializers: the payload is already a serialized ExportMetricsServiceRequest.
        call: Callable[..., bytes] = channel.unary_unary(self.method, None, None)
        return call

    def send(self, payload: bytes) -> SendOutcome:
        try:
            self._call()(payload, metadata=self.config.headers, timeout=self.config.timeout_s)
        except grpc.RpcError as error:
            code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
            details = error.details() if hasattr(error, "details") else ""
            delay = _grpc_retry_delay(error)
            retryable = code in RETRYABLE_GRPC or (code == grpc.StatusCode.RESOURCE_EXHAUSTED and delay is not None)
            return SendOutcome(False, retryable, delay, f"{code.name}: {details}")
        return SendOutcome(True)

    def close(self) -> None:
        with self._lock:
            channel, self._channel = self._channel, None
        if channel is not None:
            channel.close()


@attrs.define
class HttpTransport:
    """POSTs serialized requests as ``application/x-protobuf`` to the metrics endpoint."""

    config: DownstreamConfig

    def send(self, payload: bytes) -> SendOutcome:
        import gzip
        import ssl

        headers = {"Content-Type": "application/x-protobuf", **dict(self.config.headers)}
        body = payload
        if self.config.compression == "gzip":
            body = gzip.compress(payload)
            headers["Content-Encoding"] = "gzip"
        request = urllib.request.Request(self.config.endpoint, data=body, headers=headers, method="POST")
        context = None
        if self.config.endpoint.startswith("https://"):
            context = ssl.create_default_context(cafile=self.config.certificate)
            if self.config.client_certificate:
                context.load_cert_chain(self.config.client_certificate, self.config.client_key)
        try:
            with urllib.request.urlopen(request, timeout=self.config.timeout_s, context=context) as response:
                response.read()
        except urllib.error.HTTPError as error:
            retry_after = error.headers.get("Retry-After") if error.headers else None
            delay = float(retry_after) if retry_after and retry_after.strip().isdigit() else None
            return SendOutcome(False, error.code in RETRYABLE_HTTP, delay, f"HTTP {error.code}")
        except (urllib.error.URLError, OSError) as error:
            return SendOutcome(False, True, None, str(error))
        return SendOutcome(True)

    def close(self) -> None:
        return None


def make_transport(config: DownstreamConfig) -> Transport:
    return GrpcTransport(config) if config.protocol == GRPC else HttpTransport(config)
