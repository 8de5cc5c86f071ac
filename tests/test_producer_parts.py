"""The producer's parts on their own: exporters from settings, resources, the builder, the worker."""

from __future__ import annotations

import io
import json
import os
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.metrics.export import AggregationTemporality, Gauge, Sum

from otel_ofu import names
from otel_ofu.model import GpuError, GpuIdentity, GpuReading, Snapshot
from otel_ofu.producer import MetricsDataBuilder, Producer, SelfMetrics, compute_snapshot, env_resource
from otel_ofu.producer.exporters import (
    ExporterConfigError,
    OtlpMetricExporter,
    build_exporter,
    console_exporter,
    encode_with_intervals,
    http_metrics_url,
    otlp_exporter,
)
from otel_ofu.producer.prometheus import PROMETHEUS_NAMES
from otel_ofu.producer.worker import ExportWorker
from otel_ofu.testing.otlp_sink import OtlpSink, SinkMode

SECOND = 1_000_000_000
GPU = GpuIdentity(uuid="GPU-a", model="NVIDIA H100 80GB HBM3", index=0, host="node-1")


def reading(start: int = 10 * SECOND, end: int = 20 * SECOND, gpu: GpuIdentity = GPU) -> GpuReading:
    return GpuReading(gpu, start, end, tensor_active=0.5, sm_clock_hz=1.5e9, max_sm_clock_hz=1.98e9)


@pytest.fixture(autouse=True)
def _clean_otel_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("OTEL_"):
            monkeypatch.delenv(key)


@pytest.fixture
def sink() -> Iterator[OtlpSink]:
    with OtlpSink.start(hold_limit_s=20) as started:
        yield started


def test_http_endpoint_gets_the_metrics_path_only_when_it_has_none() -> None:
    assert http_metrics_url("http://collector:4318") == "http://collector:4318/v1/metrics"
    assert http_metrics_url("http://collector:4318/") == "http://collector:4318/v1/metrics"
    assert http_metrics_url("https://gw.example/otlp/v1/metrics") == "https://gw.example/otlp/v1/metrics"


def test_exporter_kinds(monkeypatch: pytest.MonkeyPatch) -> None:
    grpc_exporter, http_exporter = build_exporter("otlp"), build_exporter("otlp", protocol="http/protobuf")
    assert isinstance(grpc_exporter, OtlpMetricExporter)
    assert grpc_exporter.settings.protocol == "grpc"
    assert isinstance(http_exporter, OtlpMetricExporter)
    assert http_exporter.settings.protocol == "http/protobuf"
    assert build_exporter("none") is None
    with pytest.raises(ExporterConfigError, match="kafka"):
        build_exporter("kafka")


def test_console_exporter_prints_each_interval_as_json() -> None:
    out = io.StringIO()
    producer = Producer(
        source=_OneShot(Snapshot((reading(),))), exporter=console_exporter(out), clock=lambda: 30 * SECOND
    )
    producer.run_once()
    assert producer.worker is not None
    assert producer.worker.flush(5)
    producer.close()
    document = json.loads(out.getvalue())
    resource = document["resource_metrics"][0]["resource"]["attributes"]
    assert resource[names.HW_ID] == "GPU-a"


def test_env_resource_keeps_the_users_service_and_host_names(monkeypatch: pytest.MonkeyPatch) -> None:
    assert env_resource("node-1").attributes[names.SERVICE_NAME] == names.PRODUCER_SERVICE_NAME
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "service.name=from-attrs,host.name=pinned")
    resource = env_resource("container-hostname")
    assert resource.attributes[names.SERVICE_NAME] == "from-attrs"
    assert resource.attributes[names.HOST_NAME] == "pinned"


def test_gauge_start_times_survive_encoding() -> None:
    data = MetricsDataBuilder(base=env_resource("h")).build(compute_snapshot(Snapshot((reading(),))))
    request = encode_with_intervals(data)
    for metric in request.resource_metrics[0].scope_metrics[0].metrics:
        (point,) = metric.gauge.data_points
        assert (point.start_time_unix_nano, point.time_unix_nano) == (10 * SECOND, 20 * SECOND)


def test_a_gpu_read_twice_keeps_both_points_in_one_resource() -> None:
    snapshot = Snapshot((reading(), reading(start=20 * SECOND, end=30 * SECOND)))
    data = MetricsDataBuilder(base=env_resource("h")).build(compute_snapshot(snapshot))
    (rm,) = data.resource_metrics
    ofu = [m for m in rm.scope_metrics[0].metrics if m.name == names.GPU_OFU.name]
    assert len(ofu) == 2


def test_resources_are_reused_while_a_gpus_attributes_stay_the_same() -> None:
    builder = MetricsDataBuilder(base=env_resource("h"))
    first = builder.build(compute_snapshot(Snapshot((reading(),))))
    second = builder.build(compute_snapshot(Snapshot((reading(start=20 * SECOND, end=30 * SECOND),))))
    assert first.resource_metrics[0].resource is second.resource_metrics[0].resource
    moved = compute_snapshot(Snapshot((reading(),)), attribution=lambda gpu: {names.JOB_ID: "job-9"})
    third = builder.build(moved)
    assert third.resource_metrics[0].resource.attributes[names.JOB_ID] == "job-9"


def test_self_metrics_delta_resets_and_cumulative_accumulates() -> None:
    delta = SelfMetrics(start_ns=0, temporality=AggregationTemporality.DELTA)
    delta.count_export_failure(names.ExportFailureReason.REJECTED)
    first = delta.metrics(10)
    assert isinstance(first[0].data, Sum)
    assert first[0].data.data_points[0].value == 1
    assert delta.metrics(20) == []  # nothing new: no zero points
    delta.record_export_duration(0.25)
    (duration,) = delta.metrics(30)
    assert isinstance(duration.data, Gauge)
    assert duration.name == names.EXPORT_DURATION.name
    assert duration.data.data_points[0].value == 0.25
    cumulative = SelfMetrics(start_ns=0, temporality=AggregationTemporality.CUMULATIVE)
    cumulative.count_source_error(names.ErrorReason.NO_VALUE)
    cumulative.metrics(10)
    cumulative.count_source_error(names.ErrorReason.NO_VALUE)
    (errors,) = cumulative.metrics(20)
    assert isinstance(errors.data, Sum)
    assert (errors.data.data_points[0].value, errors.data.data_points[0].start_time_unix_nano) == (2, 0)


def test_shutdown_counts_what_a_stalled_backend_never_took(sink: OtlpSink) -> None:
    sink.set_mode(SinkMode.HOLD)
    self_metrics = SelfMetrics(start_ns=0)
    worker = ExportWorker(otlp_exporter(endpoint=sink.grpc_endpoint, timeout_s=5), self_metrics, max_queue=3)
    data = MetricsDataBuilder(base=env_resource("h")).build(compute_snapshot(Snapshot((reading(),))))
    worker.submit(data)
    assert sink.wait_for(lambda s: s.attempts == 1)
    worker.submit(data)
    worker.submit(data)
    worker.close(timeout_s=0.1)
    sink.set_mode(SinkMode.OK)
    failures = self_metrics.totals()[1]
    # Two still queued and the one in flight, cancelled by the shutdown: counted as its losses, not silently lost.
    assert failures == {names.ExportFailureReason.SHUTDOWN: 3}


def test_prometheus_names_follow_the_conventions() -> None:
    assert PROMETHEUS_NAMES == {
        "gpu.ofu": "gpu_ofu",
        "gpu.ofu.raw": "gpu_ofu_raw",
        "gpu.ofu.unmeasured": "gpu_ofu_unmeasured",
        "gpu.tensor.active": "gpu_tensor_active",
        "gpu.clock.sm": "gpu_clock_sm_hertz",
        "gpu.clock.sm.max": "gpu_clock_sm_max_hertz",
        "gpu.flops.achieved": "gpu_flops_achieved_per_second",
        "gpu.sm.active": "gpu_sm_active",
        "gpu.dram.active": "gpu_dram_active",
        "gpu.engine.active": "gpu_engine_active",
        "gpu.sm.occupancy": "gpu_sm_occupancy",
        "gpu.nvlink.io": "gpu_nvlink_io_bytes",  # a counter: exposed with _total
        "gpu.pcie.io": "gpu_pcie_io_bytes",
        "gpu.power": "gpu_power_watts",
        "gpu.energy": "gpu_energy_joules",
        "gpu.throttle": "gpu_throttle",
        "otel_ofu.source.errors": "otel_ofu_source_errors",  # exposed with _total
        "otel_ofu.export.failures": "otel_ofu_export_failures",
        "otel_ofu.export.duration": "otel_ofu_export_duration_seconds",
        "otel_ofu.export.rejected": "otel_ofu_export_rejected",  # a counter: exposed with _total
    }


class _OneShot:
    name = "one-shot"

    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot

    def read(self) -> Snapshot:
        return self.snapshot

    def close(self) -> None:
        pass


def test_an_attribution_chain_object_is_accepted() -> None:
    from otel_ofu.attribution import build_chain

    chain = build_chain(static_job_id="job-static", static_precision="fp8")
    producer = Producer(source=_OneShot(Snapshot((reading(),))), attribution=chain, clock=lambda: 30 * SECOND)
    data = producer.run_once()
    producer.close()
    attributes = data.resource_metrics[0].resource.attributes
    assert (attributes[names.JOB_ID], attributes[names.GPU_PRECISION]) == ("job-static", "fp8")


def test_a_gpu_with_clocks_and_a_source_error_is_counted_once() -> None:
    # NVML without GPM returns the GPU's clocks and an error saying TPA is unavailable.
    gpu = GpuIdentity("GPU-nogpm", "NVIDIA H100 80GB HBM3", 0, "host-a")
    reading = GpuReading(gpu, 0, 10**10, tensor_active=None, sm_clock_hz=1.98e9, max_sm_clock_hz=1.98e9)
    error = GpuError(names.ErrorReason.NOT_SUPPORTED, "tensor activity unavailable: no GPM on this GPU", gpu)
    computed = compute_snapshot(Snapshot(readings=(reading,), errors=(error,)))
    assert computed.samples == ()
    assert computed.errors == (error,)
