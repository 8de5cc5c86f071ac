"""Exports on their own thread so a slow or dead backend never holds up sampling.

The queue is bounded: when the backend falls behind, the oldest interval is dropped (the newest is the
one worth having) and the drop is counted in ``otel_ofu.export.failures{reason="queue_full"}``. Each
export is bounded by the SDK exporter's own timeout.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque

import attrs
from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult, MetricsData

from otel_ofu.names import ExportFailureReason
from otel_ofu.producer.self_metrics import SelfMetrics

log = logging.getLogger(__name__)


@attrs.define
class ExportWorker:
    exporter: MetricExporter
    self_metrics: SelfMetrics
    max_queue: int = 4
    _queue: deque[MetricsData] = attrs.field(factory=deque, init=False)
    _cond: threading.Condition = attrs.field(factory=threading.Condition, init=False)
    _busy: bool = attrs.field(default=False, init=False)
    _closing: bool = attrs.field(default=False, init=False)
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
                log.warning("the backend is behind: dropped the oldest queued interval")
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

    def close(self, timeout_s: float = 10.0) -> None:
        """Flush within ``timeout_s``, count what is left as lost, then shut the exporter down."""
        flushed = self.flush(timeout_s)
        with self._cond:
            self._closing = True
            left = len(self._queue)
            self._queue.clear()
            self._cond.notify_all()
        if left:
            self.self_metrics.count_export_failure(ExportFailureReason.SHUTDOWN, left)
            log.warning("shutdown: %d interval(s) could not be exported in time", left)
        try:
            self.exporter.shutdown(timeout_millis=max(timeout_s, 0.1) * 1000)
        except Exception:
            log.exception("exporter shutdown failed")
        if self._thread is not None:
            self._thread.join(timeout=timeout_s if flushed else 1.0)

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
        else:
            self.self_metrics.count_export_failure(ExportFailureReason.REJECTED)
