"""A producer and a collector in one process, over real OTLP/gRPC on loopback: the demo's pipeline.

``otel-ofu demo`` runs the simulated fleet through it as fast as the machine allows; ``otel-ofu top`` runs the
same fleet through it live (``--demo``), or one node's own source (``--source``), so a screen shows what the
collector would close without a collector deployed. The caller owns the clock: it moves the clock across an
interval (a ``ManualClock``) or waits for it (the wall clock), then calls ``step``, which reads the source,
exports the GPUs' points and the frameworks' MFU and progress over OTLP and closes the windows due.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import attrs
from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult

from otel_ofu.gpu_samples import Attribution, ComputedSnapshot
from otel_ofu.gpu_values import CalibrationTable
from otel_ofu.mfu.timed import (
    TimedCheckpoints,
    TimedMfu,
    TimedStep,
    timed_mfu_metrics_data,
    timed_progress_metrics_data,
)
from otel_ofu.model import Clock, Source
from otel_ofu.producer.exporters import otlp_exporter
from otel_ofu.producer.loop import Observer, Producer
from otel_ofu.producer.self_metrics import SelfMetrics
from otel_ofu_collector.config import AggregatorConfig
from otel_ofu_collector.outputs.consumer import CallbackConsumer, WindowConsumer
from otel_ofu_collector.results import WindowReport
from otel_ofu_collector.service import CollectorOptions, CollectorService

# The frameworks' MFU over one interval (start_ns, end_ns): what the training jobs would report.
MfuReports = Callable[[int, int], Sequence[TimedMfu]]
# The frameworks' progress at the end of an interval: their last steps and their checkpoint seconds so far.
ProgressReports = Callable[[int], tuple[Sequence[TimedStep], Sequence[TimedCheckpoints]]]


def _checked(result: MetricExportResult, what: str) -> None:
    if result is not MetricExportResult.SUCCESS:
        raise RuntimeError(f"the collector did not accept the {what} export")


@attrs.frozen
class Step:
    """One interval through the pipeline: the windows it closed and the GPUs as the producer computed them."""

    windows: tuple[WindowReport, ...]
    computed: ComputedSnapshot


@attrs.define
class LoopbackPipeline:
    """``source`` -> producer -> OTLP/gRPC on 127.0.0.1 -> collector, windows closed on ``clock``.

    ``start`` listens on a free port; ``step`` runs one interval; ``stop`` closes what is still open and
    returns those windows. The producer and the frameworks are separate OTLP clients, as in a real fleet.
    """

    source: Source
    clock: Clock
    aggregator: AggregatorConfig
    interval_s: float
    attribution: Attribution | None = None
    calibration: CalibrationTable = attrs.field(factory=CalibrationTable)
    mfu: MfuReports | None = None
    progress: ProgressReports | None = None
    consumers: Sequence[WindowConsumer] = ()  # more outputs of the collector (a report feed, say)
    observers: Sequence[Observer] = ()  # more observers of the producer's cycles (the demo's unreadable GPUs)
    _closed: list[WindowReport] = attrs.field(init=False, factory=list)
    _computed: list[ComputedSnapshot] = attrs.field(init=False, factory=list)
    _service: CollectorService | None = attrs.field(init=False, default=None)
    _producer: Producer | None = attrs.field(init=False, default=None)
    _exporters: list[MetricExporter] = attrs.field(init=False, factory=list)
    _last_ns: int = attrs.field(init=False, default=0)

    def start(self) -> None:
        service = CollectorService(
            CollectorOptions(
                aggregator=self.aggregator,
                grpc_listen="127.0.0.1:0",
                flush_interval_s=0,  # the caller's clock closes the windows, through step
                pass_through=False,
            ),
            clock=self.clock,
            consumers=[CallbackConsumer(self._closed.extend), *self.consumers],
            environ={},
        )
        service.start()
        self._service = service
        endpoint = f"http://127.0.0.1:{service.ports['grpc']}"
        self._exporters = [otlp_exporter(protocol="grpc", endpoint=endpoint) for _ in range(2)]
        self._producer = Producer(
            source=self.source,
            attribution=self.attribution,
            interval_s=self.interval_s,
            clock=self.clock,
            calibration=self.calibration,
            observers=[self._observe, *self.observers],
        )
        self._last_ns = self.clock()

    def _observe(self, computed: ComputedSnapshot, _metrics: SelfMetrics) -> None:
        self._computed.append(computed)

    def step(self) -> Step:
        """Read the interval since the last step, export it and the frameworks' MFU, close the windows due."""
        if self._service is None or self._producer is None:
            raise RuntimeError("the pipeline is not started")
        gpu_exporter, mfu_exporter = self._exporters
        start_ns, end_ns = self._last_ns, self.clock()
        self._last_ns = end_ns
        _checked(gpu_exporter.export(self._producer.run_once()), "GPU")
        points = self.mfu(start_ns, end_ns) if self.mfu is not None else ()
        if points:
            _checked(mfu_exporter.export(timed_mfu_metrics_data(points)), "MFU")
        steps, checkpoints = self.progress(end_ns) if self.progress is not None else ((), ())
        if steps or checkpoints:
            _checked(mfu_exporter.export(timed_progress_metrics_data(steps, checkpoints)), "progress")
        self._service.flush(end_ns)
        computed = self._computed.pop() if self._computed else ComputedSnapshot()
        self._computed.clear()
        return Step(self._drain(), computed)

    def _drain(self) -> tuple[WindowReport, ...]:
        closed = tuple(self._closed)
        self._closed.clear()
        return closed

    def stop(self) -> tuple[WindowReport, ...]:
        """Close and publish the open windows, shut everything down; returns the windows that closed."""
        try:
            if self._service is not None:
                self._service.stop()
        finally:
            self._service = None
            if self._producer is not None:
                self._producer.close()  # closes the source
                self._producer = None
            else:
                self.source.close()
            for exporter in self._exporters:
                exporter.shutdown()
            self._exporters = []
        return self._drain()
