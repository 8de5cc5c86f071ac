"""Delivery of window outputs and pass-through to the downstream OTLP receiver.

Window outputs are encoded once with the OpenTelemetry SDK's OTLP encoder (``encode_metrics``) and
from then on travel as serialized ExportMetricsServiceRequest bytes, the same as pass-through data.
Bytes are what the SQLite spool stores, so a request survives a restart exactly as it would have been
sent, and one raw OTLP client (gRPC or HTTP/protobuf) sends both kinds. That client reads the
standard ``OTEL_EXPORTER_OTLP_[METRICS_]*`` variables (endpoint, protocol, headers, compression,
timeout, certificate, client key and certificate, insecure) as the SDK's exporters do.

A failed send stays at the head of its queue and is retried with exponential backoff (honouring the
receiver's RetryInfo / Retry-After); a permanent refusal (bad request, unauthenticated) is dropped
and counted; a full queue drops its oldest request and counts it. Nothing is dropped silently. An
error nobody foresaw (from the transport or the spool) is logged and retried the same way: the sender
thread outlives it, so the queue never silently stops draining.
"""

from __future__ import annotations

import collections
import logging
import os
import sqlite3
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import unquote, urlparse

import attrs
import grpc
from google.rpc import error_details_pb2  # type: ignore[import-untyped]
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.sdk.metrics.export import MetricsData

logger = logging.getLogger(__name__)

EXPORT_METHOD = "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export"
RETRYABLE_GRPC = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.OUT_OF_RANGE,
        grpc.StatusCode.DATA_LOSS,
    }
)
RETRYABLE_HTTP = frozenset({429, 502, 503, 504})
GRPC = "grpc"
HTTP_PROTOBUF = "http/protobuf"


def encode_request(metrics_data: MetricsData) -> bytes:
    """The SDK's own OTLP encoding of ``metrics_data``, serialized."""
    return bytes(encode_metrics(metrics_data).SerializeToString())


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
        call: Callable[..., bytes] = channel.unary_unary(EXPORT_METHOD, None, None)
        return call

    def send(self, payload: bytes) -> SendOutcome:
        try:
            self._call()(payload, metadata=self.config.headers, timeout=self.config.timeout_s)
        except grpc.RpcError as error:
            code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
            details = error.details() if hasattr(error, "details") else ""
            return SendOutcome(False, code in RETRYABLE_GRPC, _grpc_retry_delay(error), f"{code.name}: {details}")
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


class Queue(Protocol):
    """FIFO of serialized requests with a bound; ``put`` returns how many old entries it dropped."""

    def put(self, payload: bytes) -> int: ...

    def peek(self) -> tuple[int, bytes] | None: ...

    def remove(self, entry_id: int) -> None: ...

    def __len__(self) -> int: ...

    def close(self) -> None: ...


@attrs.define
class MemoryQueue:
    """In-memory bounded FIFO (by count and bytes)."""

    max_items: int = 1024
    max_bytes: int = 256 * 1024 * 1024
    _items: collections.deque[tuple[int, bytes]] = attrs.field(factory=collections.deque)
    _bytes: int = 0
    _next_id: int = 0
    _lock: threading.Lock = attrs.field(factory=threading.Lock)

    def put(self, payload: bytes) -> int:
        dropped = 0
        with self._lock:
            self._next_id += 1
            self._items.append((self._next_id, payload))
            self._bytes += len(payload)
            while len(self._items) > 1 and (len(self._items) > self.max_items or self._bytes > self.max_bytes):
                _, old = self._items.popleft()
                self._bytes -= len(old)
                dropped += 1
        return dropped

    def peek(self) -> tuple[int, bytes] | None:
        with self._lock:
            return self._items[0] if self._items else None

    def remove(self, entry_id: int) -> None:
        with self._lock:
            if self._items and self._items[0][0] == entry_id:
                _, old = self._items.popleft()
                self._bytes -= len(old)

    def __len__(self) -> int:
        return len(self._items)

    def close(self) -> None:
        return None


@attrs.define
class SqliteSpool:
    """A bounded FIFO of serialized requests in a SQLite file: what it holds survives a restart."""

    path: str
    max_bytes: int = 256 * 1024 * 1024
    _db: sqlite3.Connection = attrs.field(init=False)
    _lock: threading.Lock = attrs.field(factory=threading.Lock)
    _left: int | None = None  # once closed: how many requests it kept for the next start

    def __attrs_post_init__(self) -> None:
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS spool (id INTEGER PRIMARY KEY AUTOINCREMENT, payload BLOB NOT NULL)"
        )

    def _size(self) -> int:
        row = self._db.execute("SELECT COALESCE(SUM(LENGTH(payload)), 0) FROM spool").fetchone()
        return int(row[0])

    def put(self, payload: bytes) -> int:
        dropped = 0
        with self._lock:
            self._db.execute("INSERT INTO spool (payload) VALUES (?)", (payload,))
            size = self._size()
            while size > self.max_bytes:
                row = self._db.execute("SELECT id, LENGTH(payload) FROM spool ORDER BY id LIMIT 1").fetchone()
                count = self._db.execute("SELECT COUNT(*) FROM spool").fetchone()[0]
                if row is None or count <= 1:
                    break
                self._db.execute("DELETE FROM spool WHERE id = ?", (row[0],))
                size -= int(row[1])
                dropped += 1
        return dropped

    def peek(self) -> tuple[int, bytes] | None:
        with self._lock:
            if self._left is not None:
                return None
            row = self._db.execute("SELECT id, payload FROM spool ORDER BY id LIMIT 1").fetchone()
        return None if row is None else (int(row[0]), bytes(row[1]))

    def remove(self, entry_id: int) -> None:
        with self._lock:
            if self._left is None:
                self._db.execute("DELETE FROM spool WHERE id = ?", (entry_id,))

    def __len__(self) -> int:
        # A scrape of the self-metrics may come while the service shuts down, after the spool closed.
        with self._lock:
            if self._left is not None:
                return self._left
            return int(self._db.execute("SELECT COUNT(*) FROM spool").fetchone()[0])

    def close(self) -> None:
        with self._lock:
            if self._left is None:
                self._left = int(self._db.execute("SELECT COUNT(*) FROM spool").fetchone()[0])
                self._db.close()


@attrs.define
class DeliveryStats:
    sent: int = 0
    retries: int = 0
    dropped_overflow: int = 0  # pushed out of a full queue or spool
    dropped_rejected: int = 0  # refused permanently by the downstream
    last_error: str = ""


@attrs.define
class Delivery:
    """One downstream stream of requests: a bounded queue, a sender thread, backoff between failures.

    Tests drive it without the thread: ``submit`` then ``pump`` (sends until empty or a failure).
    ``stop`` closes the transport only when the delivery owns it: one shared with another delivery (the
    service's export and pass-through) is closed by its owner once both have stopped.
    """

    transport: Transport
    queue: Queue = attrs.field(factory=MemoryQueue)
    name: str = "export"
    initial_backoff_s: float = 0.5
    max_backoff_s: float = 30.0
    sleep: Callable[[float], object] | None = None  # None: wait on the wake-up event (interruptible)
    stats: DeliveryStats = attrs.field(factory=DeliveryStats)
    owns_transport: bool = True
    _backoff_s: float = 0.0
    _wake: threading.Event = attrs.field(factory=threading.Event)
    _stopping: bool = False
    _thread: threading.Thread | None = None
    _lock: threading.Lock = attrs.field(factory=threading.Lock)  # held for a whole send and its remove
    _stats_lock: threading.Lock = attrs.field(factory=threading.Lock)
    _closed: bool = False

    def submit(self, payload: bytes) -> None:
        dropped = self.queue.put(payload)
        if dropped:
            # Every receiver thread submits pass-through: the count needs its own lock (``_lock`` is
            # held for whole sends, which would stall the receivers behind a slow downstream).
            with self._stats_lock:
                self.stats.dropped_overflow += dropped
            logger.warning("%s queue full: dropped %d oldest request(s)", self.name, dropped)
        self._wake.set()

    def pump(self) -> bool:
        """Send queued requests in order until the queue is empty (True) or a retryable failure (False)."""
        with self._lock:
            if self._closed:  # the sender thread woke after stop closed the queue and transport
                return True
            try:
                return self._drain()
            except Exception as error:  # unforeseen (a closed channel, sqlite3.Error): retried, never fatal
                self.stats.last_error = f"{type(error).__name__}: {error}"
                self._back_off(None)
                logger.error(
                    "%s: sending failed unexpectedly; retrying in %.1fs", self.name, self._backoff_s, exc_info=True
                )
                return False

    def _drain(self) -> bool:
        while True:
            head = self.queue.peek()
            if head is None:
                self._backoff_s = 0.0
                return True
            entry_id, payload = head
            outcome = self.transport.send(payload)
            if outcome.ok:
                self.queue.remove(entry_id)
                self.stats.sent += 1
                self._backoff_s = 0.0
                continue
            self.stats.last_error = outcome.error
            if not outcome.retryable:
                self.queue.remove(entry_id)
                self.stats.dropped_rejected += 1
                logger.error("%s: downstream refused a request permanently (%s); dropped", self.name, outcome.error)
                continue
            self._back_off(outcome.retry_after_s)
            logger.warning("%s: downstream failed (%s); retrying in %.1fs", self.name, outcome.error, self._backoff_s)
            return False

    def _back_off(self, retry_after_s: float | None) -> None:
        self.stats.retries += 1
        base = self._backoff_s * 2 if self._backoff_s else self.initial_backoff_s
        self._backoff_s = min(self.max_backoff_s, base)
        if retry_after_s is not None:
            self._backoff_s = min(self.max_backoff_s, max(self._backoff_s, retry_after_s))

    @property
    def backoff_s(self) -> float:
        return self._backoff_s

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"otel-ofu-{self.name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopping:
            if self.pump():
                self._wake.wait()
                self._wake.clear()
            elif self.sleep is not None:
                self.sleep(self._backoff_s)
            else:
                self._wake.wait(self._backoff_s)
                self._wake.clear()

    def stop(self, timeout_s: float = 5.0) -> int:
        """Try to empty the queue within ``timeout_s``, then stop; returns how many requests were left
        undelivered (a spool keeps them for the next start, a memory queue loses them)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and len(self.queue):
            if not self.pump():
                time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))
        self._stopping = True
        self._wake.set()
        # Closing under the lock waits out a send still in flight (bounded by the transport's timeout):
        # closing the spool under it would lose its remove, and the request would be sent again after a
        # restart. The sender then finds the delivery closed and returns at once.
        with self._lock:
            left = len(self.queue)
            self._closed = True
            if self.owns_transport:
                self.transport.close()
            self.queue.close()
        if self._thread is not None:
            self._thread.join()
        return left
