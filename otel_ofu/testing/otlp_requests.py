"""OTLP requests as our producers send them, and a recording point sink, for the collector's tests.

``gpu_request`` is the producer's layout (one Resource per GPU, identity on the resource, ``gpu.ofu``
gauges); ``mfu_request`` the MFU reporter's (the application's own resource, ``job.id`` on the point).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import attrs
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from otel_ofu import names

T0 = 1_700_000_000_000_000_000  # a default point time (ns)
INTERVAL_NS = 10_000_000_000  # the producer's default interval: a gauge point covers the 10 s before it
H100 = "NVIDIA H100 80GB HBM3"


def set_attribute(target: Any, key: str, value: object) -> None:
    """Append ``key=value`` to a repeated KeyValue field, typed as OTLP types it (bool, int, double, string)."""
    kv = target.add()
    kv.key = key
    if isinstance(value, bool):
        kv.value.bool_value = value
    elif isinstance(value, int):
        kv.value.int_value = value
    elif isinstance(value, float):
        kv.value.double_value = value
    else:
        kv.value.string_value = str(value)


def gpu_request(
    gpus: Mapping[str, float | tuple[str, float]],
    *,
    host: str = "node-1",
    job: str = "job-a",
    time_ns: int = T0,
    interval_ns: int = INTERVAL_NS,
    model: str = H100,
    precision: str = "bf16",
    sm_clock_hz: float | None = None,
    extra_metric: str | None = None,
) -> ExportMetricsServiceRequest:
    """``{hw.id: ofu}`` (every GPU on ``job``) or ``{hw.id: (job.id, ofu)}`` in the producer's layout.

    ``sm_clock_hz`` adds the producer's ``gpu.clock.sm`` gauge; ``extra_metric`` a foreign gauge in the
    same scope (what pass-through should forward).
    """
    request = ExportMetricsServiceRequest()
    for index, (hw_id, given) in enumerate(gpus.items()):
        gpu_job, value = given if isinstance(given, tuple) else (job, given)
        rm = request.resource_metrics.add()
        for key, attribute in (
            (names.SERVICE_NAME, names.PRODUCER_SERVICE_NAME),
            (names.HOST_NAME, host),
            (names.HW_ID, hw_id),
            (names.HW_MODEL, model),
            (names.GPU_INDEX, index),
            (names.JOB_ID, gpu_job),
            (names.GPU_PRECISION, precision),
        ):
            set_attribute(rm.resource.attributes, key, attribute)
        sm = rm.scope_metrics.add()
        sm.scope.name = names.INSTRUMENTATION_SCOPE
        metric = sm.metrics.add(name=names.GPU_OFU.name, unit=names.GPU_OFU.unit)
        point = metric.gauge.data_points.add(as_double=value, time_unix_nano=time_ns)
        point.start_time_unix_nano = time_ns - interval_ns
        if sm_clock_hz is not None:
            clock = sm.metrics.add(name=names.GPU_CLOCK_SM.name, unit=names.GPU_CLOCK_SM.unit)
            clock.gauge.data_points.add(as_double=sm_clock_hz, time_unix_nano=time_ns)
        if extra_metric:
            sm.metrics.add(name=extra_metric).gauge.data_points.add(as_int=7, time_unix_nano=time_ns)
    return request


def mfu_request(
    mfu: Mapping[str, float], time_ns: int = T0, *, service_name: str = "trainer"
) -> ExportMetricsServiceRequest:
    """``{job.id: mfu}`` in the MFU reporter's layout: the application's resource, job.id on each point."""
    request = ExportMetricsServiceRequest()
    rm = request.resource_metrics.add()
    set_attribute(rm.resource.attributes, names.SERVICE_NAME, service_name)
    metric = rm.scope_metrics.add().metrics.add(name=names.JOB_MFU.name, unit=names.JOB_MFU.unit)
    for job_id, value in mfu.items():
        point = metric.gauge.data_points.add(as_double=value, time_unix_nano=time_ns)
        set_attribute(point.attributes, names.JOB_ID, job_id)
    return request


@attrs.define
class RecordingSink:
    """A stand-in for the collector's aggregator (its ``PointSink``) that takes and keeps every point it is given."""

    ofu: list[tuple[str, float, int, int, dict[str, str]]] = attrs.field(factory=list)
    mfu: list[tuple[str, float, int, dict[str, str]]] = attrs.field(factory=list)
    inputs: list[tuple[str, int, int, dict[str, float], dict[str, float]]] = attrs.field(factory=list)
    counters: list[tuple[str, int, int, dict[str, float]]] = attrs.field(factory=list)
    unmeasured: list[tuple[str, int, int, dict[str, str]]] = attrs.field(factory=list)
    steps: list[tuple[str, float, int]] = attrs.field(factory=list)
    checkpoints: list[tuple[str, str, int, int, float]] = attrs.field(factory=list)
    lock: threading.Lock = attrs.field(factory=threading.Lock)

    def profile_of(self, identity: Mapping[str, str]) -> Any:
        return None

    def add_ofu(
        self, stream_key: str, value: float, start_ns: int, end_ns: int, identity: Mapping[str, str], profile: Any
    ) -> str | None:
        self.ofu.append((stream_key, value, start_ns, end_ns, dict(identity)))
        return None

    def cache_budget(self, cache_bytes: int) -> int:
        return 1 << 40

    def add_unmeasured(
        self, stream_key: str, start_ns: int, end_ns: int, identity: Mapping[str, str], profile: Any
    ) -> str | None:
        self.unmeasured.append((stream_key, start_ns, end_ns, dict(identity)))
        return None

    def add_mfu(self, job_id: str, value: float, time_ns: int, identity: Mapping[str, str]) -> str | None:
        self.mfu.append((job_id, value, time_ns, dict(identity)))
        return None

    def add_progress(
        self,
        job_id: str,
        value: float,
        time_ns: int,
        identity: Mapping[str, str],
        operation: str | None = None,
        series_start_ns: int = 0,
    ) -> str | None:
        if operation is None:
            self.steps.append((job_id, value, time_ns))
        else:
            self.checkpoints.append((job_id, operation, series_start_ns, time_ns, value))
        return None

    def add_gpu_inputs(
        self,
        stream_key: str,
        start_ns: int,
        end_ns: int,
        identity: Mapping[str, str],
        values: Mapping[str, float],
        throttle: Mapping[str, float],
    ) -> str | None:
        self.inputs.append((stream_key, start_ns, end_ns, dict(values), dict(throttle)))
        return None

    def add_gpu_counters(
        self,
        stream_key: str,
        series_start_ns: int,
        end_ns: int,
        identity: Mapping[str, str],
        counters: Mapping[str, float],
    ) -> str | None:
        self.counters.append((stream_key, series_start_ns, end_ns, dict(counters)))
        return None

    def live_entries(self) -> int:
        return len({point[0] for point in self.ofu}) + len({point[0] for point in self.mfu})
