"""Exports on their own thread so a slow or dead backend never holds up sampling.

The queue is bounded: when exports fall behind, the oldest interval is dropped (the newest is the one worth
having) and the drop is counted in ``otel_ofu.export.failures{reason="queue_full"}``. A backend that answers,
only slowly, is said once until the queue drains; one that fails has said why already (the exporter's
``ExportHealth``), so its drops are only counted. Each export is bounded by the exporter's own timeout, and
``close`` by its own deadline: the backlog and an export in flight are given up, and counted, when it passes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque

import attrs
from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult, MetricsData

from otel_ofu.names import ExportFailureReason
from otel_ofu.producer.exporters import ExportHealth
from otel_ofu.producer.self_metrics import SelfMetrics

log = logging.getLogger(__name__)


@attrs.define
class ExportWorker:
    exporter: MetricExporter
    self_metrics: SelfMetrics
    max_queue: int = 4
    # The exporter's health when it keeps one: drops while exports fail are then not news.
    health: ExportHealth | None = None
    _queue: deque[MetricsData] = attrs.field(factory=deque, init=False)
    _cond: threading.Condition = attrs.field(factory=threading.Condition, init=False)
    _busy: bool = attrs.field(default=False, init=False)
    _closing: bool = attrs.field(default=False, init=False)
    _said_behind: bool = attrs.field(default=False, init=False)
    _thread: threading.Thread | None = attrs.field(default=None, init=False)
    exported: int = attrs.field(default=0, init=False)
    max_seen_queue: int = attrs.field(default=0, init=False)

    def __attrs_post_init__(self) -> None:
        if self.max_queue < 1:
            raise ValueError("the export queue must hold at least one interval")
        self._thread = threading.Thread(target=self._run, name="otel-ofu-export", daemon=True)
        self._thread.start()

    @property
    def queue_length(self) -> int:
        with self._cond:
            return len(self._queue)

    def submit(self, data: MetricsData) -> None:
        """Queue one interval; never blocks on the backend."""
        with self._cond:
            if self._closing:
                self.self_metrics.count_export_failure(ExportFailureReason.SHUTDOWN)
                return
            if len(self._queue) >= self.max_queue:
                self._queue.popleft()
                self.self_metrics.count_export_failure(ExportFailureReason.QUEUE_FULL)
                if not self._said_behind and not (self.health is not None and self.health.failing):
                    self._said_behind = True
                    log.warning(
                        "exports are slower than the interval: dropping the oldest queued interval until they "
                        "catch up (counted in otel_ofu.export.failures, reason queue_full)"
                    )
            self._queue.append(data)
            self.max_seen_queue = max(self.max_seen_queue, len(self._queue))
            self._cond.notify_all()

    def flush(self, timeout_s: float) -> bool:
        """Wait until everything queued has been handed to the exporter; False on timeout."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._queue or self._busy:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(remaining)
        return True

    def close(self, timeout_s: float = 1.0) -> None:
        """Flush for at most ``timeout_s``, count what is left as lost, shut the exporter down (which ends an
        export in flight, or its wait between retries), and wait for the thread within what is left."""
        deadline = time.monotonic() + timeout_s
        self.flush(timeout_s)
        with self._cond:
            self._closing = True
            left = len(self._queue)
            self._queue.clear()
            in_flight = self._busy
            self._cond.notify_all()
        if left or in_flight:
            if left:
                self.self_metrics.count_export_failure(ExportFailureReason.SHUTDOWN, left)
            log.warning(
                "shutdown: %d interval(s) not exported within %g s%s",
                left + in_flight,
                timeout_s,
                " (the one in flight given up)" if in_flight else "",
            )
        try:
            self.exporter.shutdown(timeout_millis=max(deadline - time.monotonic(), 0.1) * 1000)
        except Exception:
            log.exception("exporter shutdown failed")
        if self._thread is not None:
            self._thread.join(timeout=max(deadline - time.monotonic(), 0.1))

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closing:
                    self._cond.wait()
                if self._closing and not self._queue:
                    return
                data = self._queue.popleft()
                self._busy = True
            try:
                self._export(data)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _export(self, data: MetricsData) -> None:
        started = time.perf_counter()
        try:
            result = self.exporter.export(data)
        except Exception:
            log.exception("export raised")
            self.self_metrics.count_export_failure(ExportFailureReason.EXCEPTION)
            return
        finally:
            self.self_metrics.record_export_duration(time.perf_counter() - started)
        if result is MetricExportResult.SUCCESS:
            self.exported += 1
            with self._cond:
                if not self._queue:
                    self._said_behind = False  # caught up: a new backlog is news again
            return
        with self._cond:
            closing = self._closing
        # An export in flight when close gave up waiting is a shutdown's loss, not the backend's refusal.
        reason = ExportFailureReason.SHUTDOWN if closing else ExportFailureReason.REJECTED
        self.self_metrics.count_export_failure(reason)
