"""The sampling loop: read the source once per interval, attribute, compute, hand one export to the worker.

One ``exporter.export`` call (one RPC) per interval carries every GPU of the host. Sampling never
waits on the backend (see ``worker.py``). SIGTERM/SIGINT (or the end of ``--duration``) stop the loop
after one last read covering the partial interval, which is exported before the exporter shuts down,
within ``shutdown_timeout_s``: a backend that is down or stalled never holds the exit up longer.
"""

from __future__ import annotations

import importlib
import logging
import signal
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import Protocol, cast

import attrs
from opentelemetry.sdk.metrics.export import MetricExporter, MetricsData

from otel_ofu import names
from otel_ofu.clock import wall_clock
from otel_ofu.gpu_samples import Attribution, ComputedSnapshot, compute_snapshot, hints_attribution
from otel_ofu.gpu_values import CalibrationTable
from otel_ofu.model import Clock, GpuError, Snapshot, Source
from otel_ofu.producer.exporters import OtlpMetricExporter
from otel_ofu.producer.metrics_data import MetricsDataBuilder
from otel_ofu.producer.self_metrics import SelfMetrics
from otel_ofu.producer.source_health import SourceHealth
from otel_ofu.producer.worker import ExportWorker
from otel_ofu.sources import is_exhausted

log = logging.getLogger(__name__)

Observer = Callable[[ComputedSnapshot, SelfMetrics], None]
DEFAULT_SHUTDOWN_TIMEOUT_S = 1.0


class Recorder(Protocol):
    def write(self, snapshot: Snapshot) -> None: ...

    def close(self) -> None: ...


def open_recorder(path: str | Path) -> Recorder:
    """The capture writer of the sources package, imported only when ``--record`` is used."""
    # Imported by name: the capture module belongs to the sources package and is only needed here.
    capture = importlib.import_module("otel_ofu.sources.capture")
    writer: Recorder = capture.CaptureWriter(Path(path))
    return writer


def as_attribution(value: object) -> Attribution | None:
    """A callable ``attribute(gpu)``, or an object with an ``.attribute(gpu)`` method (an AttributionChain)."""
    if value is None:
        return None
    method = getattr(value, "attribute", None)
    if callable(method):
        return cast(Attribution, method)
    if callable(value):
        return cast(Attribution, value)
    raise TypeError(f"attribution must be callable or have .attribute(gpu), got {type(value).__name__}")


@attrs.define
class Producer:
    """Node-side producer. ``clock`` stamps self-metrics and paces the loop (``time_scale`` clock seconds
    pass per wall second, for a simulated fleet that runs faster than real time)."""

    source: Source
    attribution: Attribution | None = attrs.field(default=None, converter=as_attribution)
    exporter: MetricExporter | None = None
    interval_s: float = 10.0
    clock: Clock = wall_clock
    calibration: CalibrationTable = attrs.field(factory=CalibrationTable)
    # The default builds the producer's resource from the environment; ``run`` passes its placement and host.
    builder: MetricsDataBuilder = attrs.field(factory=MetricsDataBuilder)
    observers: Sequence[Observer] = ()
    recorder: Recorder | None = None
    max_queue: int = 4
    # The last interval's export gets this long at shutdown; an unreachable backend gets no more.
    shutdown_timeout_s: float = DEFAULT_SHUTDOWN_TIMEOUT_S
    time_scale: float = 1.0
    self_metrics: SelfMetrics = attrs.field(init=False)
    health: SourceHealth = attrs.field(init=False)
    worker: ExportWorker | None = attrs.field(init=False, default=None)
    cycles: int = attrs.field(init=False, default=0)
    _stop: threading.Condition = attrs.field(init=False, factory=lambda: threading.Condition(threading.RLock()))
    _stopping: bool = attrs.field(init=False, default=False)
    _closed: bool = attrs.field(init=False, default=False)

    def __attrs_post_init__(self) -> None:
        if self.interval_s <= 0:
            raise ValueError(f"the interval must be positive, got {self.interval_s}")
        if self.time_scale <= 0:
            raise ValueError(f"the time scale must be positive, got {self.time_scale}")
        self.self_metrics = SelfMetrics(start_ns=self.clock())
        self.health = SourceHealth(self.source.name, self.clock)
        if self.exporter is not None:
            health = None
            if isinstance(self.exporter, OtlpMetricExporter):
                health = self.exporter.health
                self.exporter.count_rejected = self.self_metrics.count_rejected_points
            self.worker = ExportWorker(self.exporter, self.self_metrics, max_queue=self.max_queue, health=health)

    def run_once(self) -> MetricsData:
        """One interval: read, attribute, compute, queue the export; returns what was queued."""
        snapshot = self._read()
        if self.recorder is not None:
            try:
                self.recorder.write(snapshot)
            except Exception:
                log.exception("could not record the snapshot")
        computed = compute_snapshot(
            snapshot, attribution=self.attribution or hints_attribution, calibration=self.calibration
        )
        self.health.observe(computed)
        for error in computed.errors:
            self.self_metrics.count_source_error(error.reason)
            what = error.gpu.key if error.gpu is not None else error.gpu_key or f"source {self.source.name}"
            log.debug("skipped %s: %s (%s)", what, error.message, error.reason)
        data = self.builder.build(computed, self.self_metrics.metrics(self.clock()))
        for observer in self.observers:
            try:
                observer(computed, self.self_metrics)
            except Exception:
                log.exception("observer failed")
        if self.worker is not None:
            self.worker.submit(data)
        self.cycles += 1
        return data

    def _read(self) -> Snapshot:
        try:
            return self.source.read()
        except Exception as error:  # the next interval may read fine; the loop keeps going (health says it)
            return Snapshot(errors=(GpuError(names.ErrorReason.SCRAPE, str(error)),))

    def request_stop(self) -> None:
        """Ask ``run`` to finish: safe from a signal handler (the lock is reentrant) and from other threads. A source
        that reads over the network (an exporter's page) is interrupted: a read in flight must not hold the exit."""
        with self._stop:
            self._stopping = True
            self._stop.notify_all()
        interrupt = getattr(self.source, "interrupt", None)
        if callable(interrupt):
            interrupt()

    def _wait(self, clock_seconds: float) -> bool:
        """Wait up to ``clock_seconds`` of the producer's clock; True when a stop was requested."""
        with self._stop:
            if not self._stopping and clock_seconds > 0:
                self._stop.wait(clock_seconds / self.time_scale)
            return self._stopping

    def run(self, duration_s: float | None = None, *, handle_signals: bool = True) -> int:
        """Sample every interval until ``duration_s`` of clock time has passed or a stop is requested.

        On the way out one last read covers the partial interval, everything queued is flushed and the
        exporter is shut down. Returns the number of intervals exported.
        """
        previous = self._install_signals() if handle_signals else {}
        start = self.clock()
        end = start + int(duration_s * 1e9) if duration_s is not None else None
        interval_ns = int(self.interval_s * 1e9)
        next_due = start + interval_ns
        try:
            while True:
                now = self.clock()
                due = next_due if end is None else min(next_due, end)
                if self._wait((due - now) / 1e9):
                    break
                now = self.clock()
                if end is not None and now >= end:
                    break
                if now >= next_due:
                    self.run_once()
                    if is_exhausted(self.source):  # a replayed capture has run out
                        log.info("source %s has no more data; stopping", self.source.name)
                        break
                    # Skip intervals missed while suspended rather than bursting to catch up.
                    next_due += interval_ns * max(1, (now - next_due) // interval_ns + 1)
            if not is_exhausted(self.source):
                self.run_once()  # the last, partial interval
        finally:
            self._restore_signals(previous)
            self.close()
        return self.cycles

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.worker is not None:
            self.worker.close(self.shutdown_timeout_s)
        for name, closable in (("source", self.source), ("recorder", self.recorder)):
            try:
                if closable is not None:
                    closable.close()
            except Exception:
                log.exception("closing the %s failed", name)

    def _install_signals(self) -> dict[int, object]:
        if threading.current_thread() is not threading.main_thread():
            return {}

        def on_signal(signum: int, _frame: FrameType | None) -> None:
            log.info("received %s: exporting the last interval and shutting down", signal.Signals(signum).name)
            self.request_stop()

        previous: dict[int, object] = {}
        for signum in (signal.SIGTERM, signal.SIGINT):
            previous[signum] = signal.signal(signum, on_signal)
        return previous

    @staticmethod
    def _restore_signals(previous: dict[int, object]) -> None:
        for signum, handler in previous.items():
            signal.signal(signum, handler)  # type: ignore[arg-type]
