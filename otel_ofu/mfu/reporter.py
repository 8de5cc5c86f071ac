"""Report a training job's MFU as the OpenTelemetry gauge ``job.mfu``: the other half of the OFU correlation; and
its progress (``job.step``) and checkpoint time (``job.checkpoint.time``), what the collector's goodput is built on.

Two ways in for MFU:

* ``step(tokens=, seconds=)`` computes MFU = FLOPs/token x tokens/s / (num GPUs x dense peak FLOP/s),
  FLOPs/token being the one given or 6N for dense transformer training (PaLM's appendix B);
* ``report(mfu)`` passes a framework's own MFU through (validated, see ``otel_ofu.mfu.values``).

Progress: ``report_step(n)`` after step n completed (``step(..., step=n)`` says it with the MFU), and
``checkpoint("save")`` / ``checkpoint("load", step=n)`` around a checkpoint save or load (or
``report_checkpoint(operation, seconds)`` where the framework timed it): the seconds add up per operation in the
cumulative ``job.checkpoint.time``, and a load names the step the job resumes from, which ``job.step`` then says (the
collector tells a restart by the step going back, and counts the steps done again from there). Report them from one
process of the job (rank 0), as MFU: two processes' steps would read as restarts.

The gauge is observable and yields the latest value only while it is younger than ``stale_after_s``: a
synchronous gauge with cumulative temporality would repeat a hung job's last MFU forever, and the collector
would then see a busy-looking job on idle GPUs. A job that stops reporting goes absent instead.

The metric goes through the application's MeterProvider when one is given, so it shares the app's resource
and exporters; otherwise the reporter builds its own, exporting OTLP as the standard ``OTEL_EXPORTER_OTLP_*``
variables say. One reporter per job per MeterProvider: the SDK keeps the first instrument of a name.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from types import TracebackType

import attrs
from opentelemetry.metrics import CallbackOptions, MeterProvider, Observation
from opentelemetry.sdk.metrics import MeterProvider as SdkMeterProvider
from opentelemetry.sdk.metrics.export import MetricExporter, PeriodicExportingMetricReader

from otel_ofu import __version__, catalog, names, ofu_math
from otel_ofu.mfu.values import check_mfu
from otel_ofu.producer.exporters import otlp_exporter
from otel_ofu.producer.metrics_data import env_resource

log = logging.getLogger(__name__)

DEFAULT_SERVICE_NAME = names.MFU_SERVICE_NAME
DEFAULT_STALE_AFTER_S = 300.0


def otlp_metric_exporter() -> MetricExporter:
    """The OTLP metric exporter the standard variables describe, built as the producer builds its own.

    The protocol comes from ``OTEL_EXPORTER_OTLP_METRICS_PROTOCOL`` / ``OTEL_EXPORTER_OTLP_PROTOCOL`` (any case;
    gRPC by default); endpoint, headers, TLS, compression and timeout are left to the exporter, which reads the
    ``OTEL_EXPORTER_OTLP_*`` variables itself. An unsupported protocol raises ``ExporterConfigError`` (a
    ``ValueError``).
    """
    return otlp_exporter()


def otlp_meter_provider(
    *,
    export_interval_s: float | None = None,
    exporter: MetricExporter | None = None,
    default_service_name: str = DEFAULT_SERVICE_NAME,
) -> SdkMeterProvider:
    """A MeterProvider exporting OTLP every ``export_interval_s`` (else ``OTEL_METRIC_EXPORT_INTERVAL``)."""
    interval_ms = None if export_interval_s is None else export_interval_s * 1000.0
    if interval_ms is not None and (not math.isfinite(interval_ms) or interval_ms <= 0):
        raise ValueError(f"export interval must be positive, got {export_interval_s!r} s")
    reader = PeriodicExportingMetricReader(exporter or otlp_metric_exporter(), export_interval_millis=interval_ms)
    return SdkMeterProvider(
        metric_readers=[reader], resource=env_resource(default_service_name=default_service_name, with_host=False)
    )


def _positive(label: str, value: float | None) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{label} must be finite and positive, got {value!r}")
    return float(value)


def resolve_peak(precision: str, gpu_model: str | None, peak_flops_per_gpu: float | None) -> float | None:
    """The dense peak FLOP/s per GPU: the explicit one, else the catalog's for the model and precision."""
    explicit = _positive("peak_flops_per_gpu", peak_flops_per_gpu)
    if explicit is not None:
        return explicit
    if gpu_model is None:
        return None
    spec = catalog.lookup(gpu_model)
    if spec is None:
        raise ValueError(f"GPU model {gpu_model!r} is not in the catalog: pass peak_flops_per_gpu")
    peak = spec.peak(precision)
    if peak is None:
        raise ValueError(
            f"the catalog has no dense {precision} peak for {spec.key}: pass peak_flops_per_gpu "
            f"(known: {', '.join(sorted(spec.peak_flops))})"
        )
    return peak


@attrs.define
class MfuReporter:
    """Emits ``job.mfu`` (unit ``1``) with ``job.id``, ``job.name`` and ``gpu.precision`` on the data point.

    ``step()`` needs FLOPs/token (``flops_per_token``, else 6 x ``n_params``) and a peak
    (``peak_flops_per_gpu``, else the catalog's for ``gpu_model`` and ``precision``); when FLOPs/token is
    given and no peak resolves, construction fails. Without FLOPs/token the reporter only passes a framework's
    MFU through ``report()``. ``tokens`` in ``step()`` are the tokens all ``num_gpus`` GPUs processed.
    """

    job_id: str
    job_name: str | None = attrs.field(default=None, kw_only=True)
    flops_per_token: float | None = attrs.field(default=None, kw_only=True)
    n_params: float | None = attrs.field(default=None, kw_only=True)
    num_gpus: int = attrs.field(default=1, kw_only=True)
    precision: str = attrs.field(default="bf16", kw_only=True)
    gpu_model: str | None = attrs.field(default=None, kw_only=True)
    peak_flops_per_gpu: float | None = attrs.field(default=None, kw_only=True)
    meter_provider: MeterProvider | None = attrs.field(default=None, kw_only=True)
    attributes: Mapping[str, str] = attrs.field(factory=dict, kw_only=True)
    stale_after_s: float = attrs.field(default=DEFAULT_STALE_AFTER_S, kw_only=True)
    export_interval_s: float | None = attrs.field(default=None, kw_only=True)
    clock: Callable[[], float] = attrs.field(default=time.monotonic, kw_only=True)

    _peak: float | None = attrs.field(init=False, default=None)
    _flops_per_token: float | None = attrs.field(init=False, default=None)
    _point_attributes: dict[str, str] = attrs.field(init=False, factory=dict)
    _own_provider: SdkMeterProvider | None = attrs.field(init=False, default=None)
    _latest: tuple[float, float] | None = attrs.field(init=False, default=None)  # (mfu, clock time)
    _latest_step: tuple[int, float] | None = attrs.field(init=False, default=None)  # (step, clock time)
    _checkpoint_s: dict[str, float] = attrs.field(init=False, factory=dict)  # by operation, since construction
    _lock: threading.Lock = attrs.field(init=False, factory=threading.Lock)
    _closed: bool = attrs.field(init=False, default=False)
    _warned_above_one: bool = attrs.field(init=False, default=False)

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.job_id, str) or not self.job_id.strip():
            raise ValueError(f"job_id must be a non-empty string, got {self.job_id!r}")
        if self.precision not in names.PRECISIONS:
            raise ValueError(f"precision must be one of {', '.join(names.PRECISIONS)}, got {self.precision!r}")
        if isinstance(self.num_gpus, bool) or not isinstance(self.num_gpus, int) or self.num_gpus < 1:
            raise ValueError(f"num_gpus must be an integer >= 1, got {self.num_gpus!r}")
        if _positive("stale_after_s", self.stale_after_s) is None:
            raise ValueError("stale_after_s must be given")
        explicit = _positive("flops_per_token", self.flops_per_token)
        params = _positive("n_params", self.n_params)
        self._flops_per_token = explicit if explicit is not None else (None if params is None else 6.0 * params)
        if self._flops_per_token is not None:
            self._peak = resolve_peak(self.precision, self.gpu_model, self.peak_flops_per_gpu)
            if self._peak is None:
                raise ValueError(
                    "MFU needs the dense peak FLOP/s per GPU: pass gpu_model (a catalog GPU such as 'NVIDIA H100 "
                    "80GB HBM3') or peak_flops_per_gpu"
                )
        else:
            self._peak = _positive("peak_flops_per_gpu", self.peak_flops_per_gpu)
        # The contract's keys win over same-named extras.
        self._point_attributes = {**self.attributes, names.JOB_ID: self.job_id, names.GPU_PRECISION: self.precision}
        if self.job_name:
            self._point_attributes[names.JOB_NAME] = self.job_name
        provider = self.meter_provider
        if provider is None:
            self._own_provider = otlp_meter_provider(export_interval_s=self.export_interval_s)
            provider = self._own_provider
        meter = provider.get_meter(names.INSTRUMENTATION_SCOPE, __version__, schema_url=names.SCHEMA_URL)
        meter.create_observable_gauge(
            names.JOB_MFU.name,
            callbacks=[self._observe],
            unit=names.JOB_MFU.unit,
            description=names.JOB_MFU.description,
        )
        meter.create_observable_gauge(
            names.JOB_STEP.name,
            callbacks=[self._observe_step],
            unit=names.JOB_STEP.unit,
            description=names.JOB_STEP.description,
        )
        # Cumulative seconds per operation (the SDK stamps the series' start): the collector takes their deltas.
        meter.create_observable_counter(
            names.JOB_CHECKPOINT_TIME.name,
            callbacks=[self._observe_checkpoints],
            unit=names.JOB_CHECKPOINT_TIME.unit,
            description=names.JOB_CHECKPOINT_TIME.description,
        )

    @property
    def peak_flops(self) -> float | None:
        """The dense peak FLOP/s per GPU in use (explicit or from the catalog), None when unknown."""
        return self._peak

    @property
    def model_flops_per_token(self) -> float | None:
        """FLOPs/token in use by ``step()``: the given one, else 6 x n_params; None in pass-through mode."""
        return self._flops_per_token

    @property
    def point_attributes(self) -> Mapping[str, str]:
        return dict(self._point_attributes)

    @property
    def last_mfu(self) -> float | None:
        """The latest value reported, stale or not."""
        with self._lock:
            return None if self._latest is None else self._latest[0]

    @property
    def last_step(self) -> int | None:
        """The latest step reported, stale or not."""
        with self._lock:
            return None if self._latest_step is None else self._latest_step[0]

    def checkpoint_seconds(self, operation: str) -> float:
        """The seconds reported for ``operation`` (save, load) since the reporter started."""
        with self._lock:
            return self._checkpoint_s.get(operation, 0.0)

    def report_step(self, step: int) -> int:
        """Step ``step`` completed (the count the framework keeps, from 0 or 1); returns it."""
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"step must be a whole number >= 0, got {step!r}")
        with self._lock:
            if self._closed:
                raise RuntimeError(f"MFU reporter of job {self.job_id} is shut down")
            self._latest_step = (step, self.clock())
        return step

    def report_checkpoint(self, operation: str, seconds: float, *, step: int | None = None) -> float:
        """The framework spent ``seconds`` saving or loading (``operation``) a checkpoint; a load's ``step`` is the
        step the job resumes from, reported as its ``job.step``. Returns the operation's seconds so far."""
        if operation not in names.CheckpointOperation.ALL:
            raise ValueError(f"operation must be one of {', '.join(names.CheckpointOperation.ALL)}, got {operation!r}")
        if isinstance(seconds, bool) or not math.isfinite(seconds) or seconds < 0:
            raise ValueError(f"seconds must be finite and >= 0, got {seconds!r}")
        if step is not None:
            self.report_step(step)
        with self._lock:
            if self._closed:
                raise RuntimeError(f"MFU reporter of job {self.job_id} is shut down")
            total = self._checkpoint_s[operation] = self._checkpoint_s.get(operation, 0.0) + float(seconds)
        return total

    @contextmanager
    def checkpoint(self, operation: str, *, step: int | None = None) -> Iterator[None]:
        """Times the ``with`` block as a checkpoint ``operation`` (on the reporter's clock), reported when it ends,
        also when it raises (the time was spent)."""
        if operation not in names.CheckpointOperation.ALL:
            raise ValueError(f"operation must be one of {', '.join(names.CheckpointOperation.ALL)}, got {operation!r}")
        began = self.clock()
        try:
            yield
        finally:
            self.report_checkpoint(operation, max(0.0, self.clock() - began), step=step)

    def step(self, *, tokens: float, seconds: float, step: int | None = None) -> float:
        """Record the MFU of a step that processed ``tokens`` (all GPUs together) in ``seconds``; returns it. With
        ``step``, that step completed (``report_step``)."""
        if self._flops_per_token is None or self._peak is None:
            raise ValueError("step() needs flops_per_token or n_params at construction; use report() for a given MFU")
        if isinstance(tokens, bool) or not math.isfinite(tokens) or tokens < 0:
            raise ValueError(f"tokens must be finite and >= 0, got {tokens!r}")
        if isinstance(seconds, bool) or not math.isfinite(seconds) or seconds <= 0:
            raise ValueError(f"seconds must be finite and positive, got {seconds!r}")
        value = ofu_math.mfu(self._flops_per_token, tokens / seconds, self.num_gpus, self._peak)
        recorded = self._record(value)
        if step is not None:
            self.report_step(step)
        return recorded

    def report(self, mfu: float) -> float:
        """Pass a framework's own MFU (a fraction: 0.325 for 32.5%) straight through; returns it."""
        return self._record(mfu)

    def _record(self, value: float) -> float:
        checked = check_mfu(value)
        if checked > 1.0 and not self._warned_above_one:
            self._warned_above_one = True
            log.warning(
                "job %s: MFU %.3f is above 1, more FLOPs than the hardware peak: the FLOP count or the peak is "
                "likely wrong (reported anyway so the collector can flag it; said once)",
                self.job_id,
                checked,
            )
        with self._lock:
            if self._closed:
                raise RuntimeError(f"MFU reporter of job {self.job_id} is shut down")
            self._latest = (checked, self.clock())
        return checked

    def _observe(self, options: CallbackOptions) -> Iterable[Observation]:
        with self._lock:
            if self._closed or self._latest is None:
                return []
            value, at = self._latest
            if self.clock() - at > self.stale_after_s:
                return []
        return [Observation(value, self._point_attributes)]

    def _observe_step(self, options: CallbackOptions) -> Iterable[Observation]:
        with self._lock:
            if self._closed or self._latest_step is None:
                return []
            step, at = self._latest_step
            if self.clock() - at > self.stale_after_s:
                return []  # a hung job's last step is not repeated forever: its progress goes absent
        return [Observation(step, self._point_attributes)]

    def _observe_checkpoints(self, options: CallbackOptions) -> Iterable[Observation]:
        with self._lock:
            if self._closed:
                return []
            return [
                Observation(seconds, {**self._point_attributes, names.CHECKPOINT_OPERATION: operation})
                for operation, seconds in self._checkpoint_s.items()
            ]

    def flush(self, timeout_millis: float = 10_000) -> bool:
        """Export what is recorded now, when the provider is an SDK one (the API's has nothing to flush)."""
        provider = self._own_provider or self.meter_provider
        if isinstance(provider, SdkMeterProvider):
            return provider.force_flush(timeout_millis)
        return True

    def shutdown(self, timeout_millis: float = 10_000) -> None:
        """Flush the last value and stop reporting; shuts down the reporter's own provider, never the app's."""
        if self._closed:
            return
        if self._own_provider is not None:
            self._own_provider.shutdown(timeout_millis)
        else:
            self.flush(timeout_millis)
        with self._lock:
            self._closed = True

    def __enter__(self) -> MfuReporter:
        return self

    def __exit__(
        self, _exc_type: type[BaseException] | None, _exc: BaseException | None, _tb: TracebackType | None
    ) -> None:
        self.shutdown()
