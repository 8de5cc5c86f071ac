"""The producer's OTLP metric exporter, on the OpenTelemetry SDK's public API only, and the console one.

``OtlpMetricExporter`` is an SDK ``MetricExporter`` (so an SDK ``MetricReader`` drives it as well as the
producer's own worker does) that encodes each export itself (``otlp_encoding.py``: gauge start times kept) and
sends the bytes through otel-ofu's OTLP client (``otel_ofu.otlp_client``, the collector's too), with the OTLP
specification's retries: a retryable failure is tried again after the delay the receiver asked for
(RetryInfo, Retry-After), else after an exponential backoff of 1, 2, 4 ... s with 20% jitter, within the
export timeout; ``shutdown`` ends a wait at once.

Settings come from the options given and the standard ``OTEL_EXPORTER_OTLP_*`` variables
(``otlp_client/settings.py``). Failures are said on stderr in one line with the endpoint and the likely cause:
when exporting starts failing, again when the cause changes (at most once a minute), and once when it works
again (``ExportHealth``); each failed export is also counted by the producer's self-metrics. Points the
receiver refused of an export it took (``partial_success``) are counted in ``otel_ofu.export.rejected``
(``count_rejected``) and each distinct message said once. Each call of ``otlp_exporter`` builds a new
exporter: one per pipeline, never shared between readers.
"""

from __future__ import annotations

import logging
import random
import sys
import threading
import time
from collections.abc import Callable
from typing import IO

import attrs
from opentelemetry.sdk.metrics.export import (
    ConsoleMetricExporter,
    MetricExporter,
    MetricExportResult,
    MetricsData,
)

from otel_ofu import names
from otel_ofu.otlp_client import (
    GRPC,
    HTTP_METRICS_PATH,
    HTTP_PROTOBUF,
    PROTOCOLS,
    Attempt,
    ExporterConfigError,
    OtlpClient,
    OtlpSettings,
    Sender,
    check_env_endpoint,
    http_metrics_url,
    resolve_protocol,
)
from otel_ofu.producer.otlp_encoding import OtlpEncodingError, encode_request, encode_with_intervals
from otel_ofu.producer.preferences import preferred_aggregation, preferred_temporality

# Re-exported for the commands and callers that encode or resolve settings alone.
__all__ = [
    "EXPORTER_KINDS",
    "GRPC",
    "HTTP_METRICS_PATH",
    "HTTP_PROTOBUF",
    "PROTOCOLS",
    "ExportHealth",
    "ExporterConfigError",
    "OtlpMetricExporter",
    "build_exporter",
    "check_env_endpoint",
    "console_exporter",
    "encode_with_intervals",
    "http_metrics_url",
    "otlp_exporter",
    "resolve_protocol",
]

log = logging.getLogger(__name__)

EXPORTER_KINDS = ("otlp", "console", "none")
CAUSE_CHANGE_EVERY_S = 60.0


@attrs.define
class ExportHealth:
    """Whether exports to one endpoint are failing, said on stderr when that changes (see the module docstring).

    Thread-safe: the exporter's thread reports, the producer's worker reads ``failing``.
    """

    endpoint: str
    clock: Callable[[], float] = time.monotonic
    every_s: float = CAUSE_CHANGE_EVERY_S
    _said: str | None = attrs.field(init=False, default=None)
    _said_at: float = attrs.field(init=False, default=0.0)
    _lost: int = attrs.field(init=False, default=0)
    _lock: threading.Lock = attrs.field(init=False, factory=threading.Lock)

    @property
    def failing(self) -> bool:
        with self._lock:
            return self._said is not None

    def attempt_failed(self, cause: str) -> None:
        """An attempt failed and will be retried: said now if nothing is said yet (the retries can take long)."""
        with self._lock:
            if self._said is None:
                self._say(cause)

    def export_failed(self, cause: str) -> None:
        """An export is lost: said when it is the first, or when the cause changed and the quiet period is over."""
        with self._lock:
            self._lost += 1
            if self._said is None or (cause != self._said and self.clock() - self._said_at >= self.every_s):
                self._say(cause)

    def export_delivered(self) -> None:
        with self._lock:
            if self._said is None:
                return
            lost, self._said, self._lost = self._lost, None, 0
        what = f"{lost} export{'s' if lost != 1 else ''} lost while it failed" if lost else "a retry got through"
        log.warning("exporting to %s works again (%s)", self.endpoint, what)

    def _say(self, cause: str) -> None:
        log.warning(
            "cannot export to %s: %s (sampling goes on; each export is tried again as it comes)", self.endpoint, cause
        )
        self._said, self._said_at = cause, self.clock()


class OtlpMetricExporter(MetricExporter):
    """OTLP/gRPC or OTLP/HTTP protobuf, on public OpenTelemetry API only (see the module docstring)."""

    def __init__(
        self,
        settings: OtlpSettings,
        *,
        sender: Sender | None = None,
        wait: Callable[[float], bool] | None = None,
        jitter: Callable[[], float] = random.random,
    ) -> None:
        super().__init__(preferred_temporality=preferred_temporality(), preferred_aggregation=preferred_aggregation())
        self.settings = settings
        self.health = ExportHealth(f"{settings.endpoint} ({settings.protocol})")
        counted_in = names.EXPORT_REJECTED.name
        self.client = OtlpClient(settings, counted_in) if sender is None else OtlpClient(settings, counted_in, sender)
        # Told the points the receiver refused of each export it took (the producer's self-metrics).
        self.count_rejected: Callable[[int], None] | None = None
        self._stopping = threading.Event()
        # ``wait(seconds)`` sleeps between attempts and says whether shutdown began meanwhile.
        self._wait = wait if wait is not None else self._stopping.wait
        self._jitter = jitter
        self._shut_down = False

    def export(
        self, metrics_data: MetricsData, timeout_millis: float | None = None, **kwargs: object
    ) -> MetricExportResult:
        if self._stopping.is_set():
            return MetricExportResult.FAILURE
        try:
            payload = encode_request(metrics_data)
        except OtlpEncodingError as error:
            log.error("%s", error)
            return MetricExportResult.FAILURE
        timeout_s = self.settings.timeout_s
        if timeout_millis is not None and timeout_millis > 0:
            timeout_s = min(timeout_s, timeout_millis / 1000)
        return MetricExportResult.SUCCESS if self.send(payload, timeout_s) else MetricExportResult.FAILURE

    def send(self, payload: bytes, timeout_s: float) -> bool:
        """Deliver one serialized request, retrying as the OTLP specification says; True when delivered."""
        if self._stopping.is_set():
            return False
        attempt = self.client.export(payload, timeout_s, self._wait, self._retrying, self._jitter)
        if attempt is None:
            return False  # shut down meanwhile: the loss is the shutdown's, said by the worker
        if not attempt.delivered:
            self.health.export_failed(attempt.cause)
            return False
        self.health.export_delivered()
        if attempt.rejected_points and self.count_rejected is not None:
            self.count_rejected(attempt.rejected_points)
        return True

    def _retrying(self, attempt: Attempt, delay: float) -> None:
        if attempt.retry_after_s is None:
            # Not the receiver pacing us (that is normal under load): a failure worth saying now.
            self.health.attempt_failed(attempt.cause)
        log.debug("an export attempt failed (%s); retrying in %.2f s", attempt.cause, delay)

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True  # nothing is buffered here: each export is sent when it is made

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: object) -> None:
        """End any wait between attempts and any call in flight at once; later exports fail."""
        if self._shut_down:
            return
        self._shut_down = True
        self._stopping.set()
        self.client.close()


def otlp_exporter(
    *,
    protocol: str | None = None,
    endpoint: str | None = None,
    headers: dict[str, str] | None = None,
    timeout_s: float | None = None,
) -> OtlpMetricExporter:
    """A new OTLP metric exporter; ``None`` arguments defer to the standard variables."""
    settings = OtlpSettings.resolve(protocol=protocol, endpoint=endpoint, headers=headers, timeout_s=timeout_s)
    return OtlpMetricExporter(settings)


def console_exporter(out: IO[str] | None = None) -> MetricExporter:
    """The SDK's console exporter: every export as JSON on stdout, for debugging."""
    return ConsoleMetricExporter(out=out if out is not None else sys.stdout)


def build_exporter(
    kind: str,
    *,
    protocol: str | None = None,
    endpoint: str | None = None,
    headers: dict[str, str] | None = None,
    timeout_s: float | None = None,
) -> MetricExporter | None:
    """``otlp`` | ``console`` | ``none`` (None: no push export, e.g. Prometheus only)."""
    if kind == "otlp":
        return otlp_exporter(protocol=protocol, endpoint=endpoint, headers=headers, timeout_s=timeout_s)
    if kind == "console":
        return console_exporter()
    if kind == "none":
        return None
    raise ExporterConfigError(f"exporter {kind!r} is not one of {', '.join(EXPORTER_KINDS)}")
