"""The producer's export path end to end: snapshot -> MetricsData -> its OTLP exporter -> a real receiver."""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import attrs
import pytest
from prometheus_client.parser import text_string_to_metric_families

from otel_ofu import names
from otel_ofu.gpu_values import CalibrationTable, compute
from otel_ofu.model import GpuError, GpuIdentity, GpuReading, Snapshot
from otel_ofu.otlp_client import OtlpSettings
from otel_ofu.producer import MetricsDataBuilder, Producer, compute_snapshot, otlp_exporter
from otel_ofu.producer.exporters import HTTP_PROTOBUF, OtlpMetricExporter, resolve_protocol
from otel_ofu.producer.prometheus import PROMETHEUS_NAMES, PrometheusEndpoint
from otel_ofu.testing.otlp_sink import OtlpSink, SinkMode, unused_port

MODEL = "NVIDIA H100 80GB HBM3"
HOST = "node-7"
SECOND = 1_000_000_000


@attrs.define
class FakeClock:
    now: int = 1_700_000_000 * SECOND

    def __call__(self) -> int:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += int(seconds * SECOND)


def gpu(index: int) -> GpuIdentity:
    return GpuIdentity(uuid=f"GPU-{index:08d}", model=MODEL, index=index, host=HOST)


@attrs.define
class FakeSource:
    """Deterministic readings: GPU i has TPA 0.1 x (i + 1) at 1.5 GHz; ``broken`` GPUs fail as told."""

    gpus: int
    clock: FakeClock
    invalid: frozenset[int] = frozenset()
    lost: frozenset[int] = frozenset()
    name: str = "fake"
    reads: int = 0
    closed: bool = False
    last: Snapshot | None = None
    _previous: int = attrs.field(init=False, default=0)

    def __attrs_post_init__(self) -> None:
        self._previous = self.clock()

    def read(self) -> Snapshot:
        self.clock.advance(10)
        start, end = self._previous, self.clock()
        self._previous = end
        self.reads += 1
        readings = []
        errors = []
        for index in range(self.gpus):
            if index in self.lost:
                errors.append(GpuError(names.ErrorReason.GPU_LOST, "fell off the bus", gpu(index)))
                continue
            tpa = 1.5 if index in self.invalid else 0.1 * (index + 1)
            readings.append(
                GpuReading(gpu(index), start, end, tensor_active=tpa, sm_clock_hz=1.5e9, max_sm_clock_hz=1.98e9)
            )
        self.last = Snapshot(tuple(readings), tuple(errors))
        return self.last

    def close(self) -> None:
        self.closed = True


def attribution(identity: GpuIdentity) -> Mapping[str, str]:
    return {
        names.JOB_ID: f"job-{identity.index % 2}",
        names.JOB_SCHEDULER: "static",
        names.GPU_PRECISION: "bf16",
    }


@pytest.fixture
def sink() -> Iterator[OtlpSink]:
    with OtlpSink.start(hold_limit_s=20) as started:
        yield started


@pytest.fixture(autouse=True)
def _clean_otel_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("OTEL_"):
            monkeypatch.delenv(key)


def attributes_of(proto_attributes: Any) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for item in proto_attributes:
        value = item.value
        result[item.key] = getattr(value, value.WhichOneof("value"))
    return result


def gpu_resources(request: Any) -> list[Any]:
    return [rm for rm in request.resource_metrics if names.HW_ID in attributes_of(rm.resource.attributes)]


def self_metric_points(request: Any, name: str) -> tuple[Any, dict[str, float]]:
    """The metric and its points by reason from the producer's own resource."""
    for rm in request.resource_metrics:
        for scope in rm.scope_metrics:
            for metric in scope.metrics:
                if metric.name == name:
                    points = {attributes_of(p.attributes)[names.ERROR_REASON]: p.as_int for p in metric.sum.data_points}
                    return metric, points
    raise AssertionError(f"{name} not in the request")


def make_producer(source: FakeSource, sink_endpoint: str | None, clock: FakeClock, **kwargs: Any) -> Producer:
    exporter = otlp_exporter(endpoint=sink_endpoint) if sink_endpoint else None
    return Producer(source=source, attribution=attribution, exporter=exporter, interval_s=10, clock=clock, **kwargs)


def test_grpc_export_has_one_resource_per_gpu_with_the_contract(sink: OtlpSink) -> None:
    clock = FakeClock()
    source = FakeSource(gpus=3, clock=clock)
    producer = make_producer(source, sink.grpc_endpoint, clock)
    try:
        producer.run_once()
        assert sink.wait_for(lambda s: len(s.received) == 1)
    finally:
        producer.close()
    (received,) = sink.received
    assert received.transport == "grpc"
    resources = gpu_resources(received.request)
    assert len(resources) == 3
    assert source.last is not None
    readings = {reading.gpu.uuid: reading for reading in source.last.readings}
    specs = {spec.name: spec for spec in names.PRODUCER_METRICS}
    for rm in resources:
        attributes = attributes_of(rm.resource.attributes)
        reading = readings[attributes[names.HW_ID]]
        assert attributes[names.SERVICE_NAME] == names.PRODUCER_SERVICE_NAME
        assert attributes[names.HOST_NAME] == HOST
        assert attributes[names.HW_TYPE] == names.HW_TYPE_GPU
        assert attributes[names.HW_VENDOR] == names.HW_VENDOR_NVIDIA
        assert attributes[names.HW_MODEL] == MODEL
        assert attributes[names.GPU_INDEX] == reading.gpu.index
        assert attributes[names.JOB_ID] == f"job-{reading.gpu.index % 2}"
        assert attributes[names.GPU_PRECISION] == "bf16"
        expected = compute(reading, precision="bf16").as_metrics()
        (scope,) = rm.scope_metrics
        assert scope.scope.name == names.INSTRUMENTATION_SCOPE
        got = {}
        for metric in scope.metrics:
            spec = specs[metric.name]
            assert (metric.unit, metric.description) == (spec.unit, spec.description)
            assert metric.WhichOneof("data") == "gauge"
            (point,) = metric.gauge.data_points
            assert (point.start_time_unix_nano, point.time_unix_nano) == (reading.start_ns, reading.end_ns)
            assert len(point.attributes) == 0  # resource placement: identity lives on the resource only
            got[metric.name] = point.as_double
        assert got == pytest.approx(expected)
        assert names.GPU_FLOPS_ACHIEVED.name in got


def test_one_request_per_interval_carries_every_gpu(sink: OtlpSink) -> None:
    clock = FakeClock()
    producer = make_producer(FakeSource(gpus=8, clock=clock), sink.grpc_endpoint, clock)
    try:
        for _ in range(3):
            producer.run_once()
        assert sink.wait_for(lambda s: len(s.received) == 3)
    finally:
        producer.close()
    assert len(sink.received) == 3 == sink.attempts
    assert all(len(gpu_resources(item.request)) == 8 for item in sink.received)


def test_calibration_applies_per_job(sink: OtlpSink) -> None:
    clock = FakeClock()
    source = FakeSource(gpus=2, clock=clock)
    table = CalibrationTable.parse("job:job-1=0.8")
    snapshot = source.read()
    computed = compute_snapshot(snapshot, attribution=attribution, calibration=table)
    by_index = {sample.gpu.index: sample.values for sample in computed.samples}
    assert by_index[1].ofu == pytest.approx(compute(snapshot.readings[1], calibration=0.8).ofu)
    assert by_index[0].ofu == pytest.approx(compute(snapshot.readings[0]).ofu)


def test_http_protobuf_by_the_standard_protocol_variable(sink: OtlpSink, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{sink.http_port}")
    assert resolve_protocol() == HTTP_PROTOBUF
    clock = FakeClock()
    producer = Producer(
        source=FakeSource(gpus=2, clock=clock), exporter=otlp_exporter(), clock=clock, attribution=attribution
    )
    try:
        producer.run_once()
        assert sink.wait_for(lambda s: len(s.received) == 1)
    finally:
        producer.close()
    assert sink.received[0].transport == "http"
    assert len(gpu_resources(sink.received[0].request)) == 2


def test_metrics_protocol_variable_wins_and_bad_protocols_say_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "http/protobuf")
    assert resolve_protocol() == HTTP_PROTOBUF
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "http/json")
    with pytest.raises(ValueError, match="http/json"):
        resolve_protocol()


def test_resource_attributes_and_headers_variables_reach_the_receiver(
    sink: OtlpSink, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=staging,hw.id=bogus,cluster=east")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "gpu-ofu-east")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer%20s3cret,x-tenant=ml")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", sink.grpc_endpoint)
    clock = FakeClock()
    producer = Producer(source=FakeSource(gpus=2, clock=clock), exporter=otlp_exporter(), clock=clock)
    try:
        producer.run_once()
        assert sink.wait_for(lambda s: len(s.received) == 1)
    finally:
        producer.close()
    (received,) = sink.received
    assert received.metadata["authorization"] == "Bearer s3cret"
    assert received.metadata["x-tenant"] == "ml"
    for rm in gpu_resources(received.request):
        attributes = attributes_of(rm.resource.attributes)
        assert attributes["deployment.environment"] == "staging"
        assert attributes["cluster"] == "east"
        assert attributes[names.SERVICE_NAME] == "gpu-ofu-east"  # the user's service name is kept
        assert attributes[names.HW_ID].startswith("GPU-")  # but never the GPU's identity


def test_errored_gpus_are_counted_by_reason_and_the_rest_exported(sink: OtlpSink) -> None:
    clock = FakeClock()
    source = FakeSource(gpus=4, clock=clock, invalid=frozenset({1}), lost=frozenset({2}))
    producer = make_producer(source, sink.grpc_endpoint, clock)
    try:
        producer.run_once()
        producer.run_once()
        assert sink.wait_for(lambda s: len(s.received) == 2)
    finally:
        producer.close()
    last = sink.received[-1].request
    resources = {attributes_of(rm.resource.attributes)[names.GPU_INDEX]: rm for rm in gpu_resources(last)}
    # GPU 1 read an invalid value: exported without OFU (never as 0) and marked unmeasured, with why, so that its
    # time and energy are billed; GPU 2 was lost (nothing read, no interval): absent. Both counted.
    assert set(resources) == {0, 1, 3}
    invalid = {metric.name: metric for sm in resources[1].scope_metrics for metric in sm.metrics}
    assert names.GPU_OFU.name not in invalid
    (marker,) = invalid[names.GPU_OFU_UNMEASURED.name].gauge.data_points
    assert marker.as_int == 1 or marker.as_double == 1.0
    assert attributes_of(marker.attributes)[names.ERROR_TYPE] == names.ErrorReason.INVALID_VALUE
    assert marker.start_time_unix_nano < marker.time_unix_nano
    metric, points = self_metric_points(last, names.SOURCE_ERRORS.name)
    assert points == {names.ErrorReason.INVALID_VALUE: 2, names.ErrorReason.GPU_LOST: 2}  # cumulative
    assert metric.sum.is_monotonic
    assert metric.sum.aggregation_temporality == 2  # AGGREGATION_TEMPORALITY_CUMULATIVE
    assert metric.unit == names.SOURCE_ERRORS.unit
    own = next(rm for rm in last.resource_metrics if names.HW_ID not in attributes_of(rm.resource.attributes))
    assert attributes_of(own.resource.attributes)[names.SERVICE_NAME] == names.PRODUCER_SERVICE_NAME


@pytest.mark.parametrize(("preference", "expected"), [("delta", 1), ("lowmemory", 1), ("cumulative", 2)])
def test_counter_temporality_follows_the_preference_variable(
    sink: OtlpSink, monkeypatch: pytest.MonkeyPatch, preference: str, expected: int
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE", preference)
    clock = FakeClock()
    producer = make_producer(FakeSource(gpus=2, clock=clock, lost=frozenset({0})), sink.grpc_endpoint, clock)
    try:
        producer.run_once()
        producer.run_once()
        assert sink.wait_for(lambda s: len(s.received) == 2)
    finally:
        producer.close()
    first, points_first = self_metric_points(sink.received[0].request, names.SOURCE_ERRORS.name)
    second, points_second = self_metric_points(sink.received[1].request, names.SOURCE_ERRORS.name)
    assert points_first == {names.ErrorReason.GPU_LOST: 1}
    assert points_second == {names.ErrorReason.GPU_LOST: expected}
    is_delta = expected == 1
    assert second.sum.aggregation_temporality == (1 if is_delta else 2)
    start_first = first.sum.data_points[0].start_time_unix_nano
    start_second = second.sum.data_points[0].start_time_unix_nano
    if is_delta:  # each delta covers the time since the previous report
        assert start_second == first.sum.data_points[0].time_unix_nano
    else:
        assert start_second == start_first


def test_gauges_stay_gauges_whatever_the_preference(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE", "delta")
    clock = FakeClock()
    data = MetricsDataBuilder().build(compute_snapshot(FakeSource(gpus=1, clock=clock).read()))
    kinds = {
        type(metric.data).__name__ for rm in data.resource_metrics for s in rm.scope_metrics for metric in s.metrics
    }
    assert kinds == {"Gauge"}


@pytest.mark.parametrize("placement", names.PLACEMENTS)
def test_placement_modes(sink: OtlpSink, placement: str) -> None:
    clock = FakeClock()
    builder = MetricsDataBuilder(placement=placement)
    producer = make_producer(FakeSource(gpus=3, clock=clock), sink.grpc_endpoint, clock, builder=builder)
    try:
        producer.run_once()
        assert sink.wait_for(lambda s: len(s.received) == 1)
    finally:
        producer.close()
    request = sink.received[0].request
    gpu_rms = [
        rm for rm in request.resource_metrics if attributes_of(rm.resource.attributes).get(names.HW_TYPE) == "gpu"
    ]
    ofu_points = [
        (attributes_of(rm.resource.attributes), attributes_of(point.attributes))
        for rm in gpu_rms
        for scope in rm.scope_metrics
        for metric in scope.metrics
        if metric.name == names.GPU_OFU.name
        for point in metric.gauge.data_points
    ]
    assert len(ofu_points) == 3
    for resource, point in ofu_points:
        if placement == "resource":
            assert point == {}
            assert {names.HW_ID, names.JOB_ID} <= resource.keys()
        elif placement == "datapoint":
            assert names.HW_ID not in resource
            assert names.JOB_ID not in resource
            assert point[names.HOST_NAME] == HOST
        else:
            assert point[names.HW_ID] == resource[names.HW_ID]
        if placement != "resource":
            assert set(point) <= set(names.IDENTITY_ATTRIBUTES)
            assert {names.HW_ID, names.HW_MODEL, names.JOB_ID, names.GPU_PRECISION} <= point.keys()
    assert len(gpu_rms) == (1 if placement == "datapoint" else 3)


def test_unknown_placement_is_refused() -> None:
    with pytest.raises(ValueError, match="placement"):
        MetricsDataBuilder(placement="everywhere")


def test_prometheus_endpoint_is_scraped_and_parsed() -> None:
    clock = FakeClock()
    endpoint = PrometheusEndpoint(port=0, addr="127.0.0.1")
    producer = Producer(
        source=FakeSource(gpus=2, clock=clock, lost=frozenset({1})),
        attribution=attribution,
        clock=clock,
        observers=[endpoint.update],
    )
    url = f"http://127.0.0.1:{endpoint.port}/metrics"
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            before = {family.name: family for family in text_string_to_metric_families(response.read().decode())}
        producer.run_once()
        with urllib.request.urlopen(url, timeout=5) as response:
            text = response.read().decode()
    finally:
        producer.close()
        endpoint.close()
    families = {family.name: family for family in text_string_to_metric_families(text)}
    assert PROMETHEUS_NAMES[names.GPU_OFU.name] == "gpu_ofu"
    assert PROMETHEUS_NAMES[names.GPU_CLOCK_SM.name] == "gpu_clock_sm_hertz"
    assert PROMETHEUS_NAMES[names.GPU_FLOPS_ACHIEVED.name] == "gpu_flops_achieved_per_second"
    (ofu,) = families["gpu_ofu"].samples
    assert ofu.labels["hw_id"] == "GPU-00000000"
    assert ofu.labels["job_id"] == "job-0"
    assert ofu.labels["host_name"] == HOST
    assert ofu.value == pytest.approx(0.1 * 1.5 / 1.83)  # H100: tensor clock domain 1830 MHz
    (clock_sample,) = families["gpu_clock_sm_hertz"].samples
    assert clock_sample.value == pytest.approx(1.5e9)

    # Every reason is there from the first scrape, before the first interval, at 0 until it counts, so rate()
    # sees a first burst: the one lost GPU of the interval is 1 gpu_lost, every other reason 0; no export failed.
    def by_reason(scraped: dict[str, Any], family: str) -> dict[str, float]:
        return {s.labels["reason"]: s.value for s in scraped[family].samples if s.name == f"{family}_total"}

    errors, failures = "otel_ofu_source_errors", "otel_ofu_export_failures"
    assert by_reason(before, errors) == dict.fromkeys(names.ErrorReason.ALL, 0.0)
    assert by_reason(before, failures) == dict.fromkeys(names.ExportFailureReason.ALL, 0.0)
    assert by_reason(families, errors) == {**dict.fromkeys(names.ErrorReason.ALL, 0.0), "gpu_lost": 1.0}
    assert by_reason(families, failures) == dict.fromkeys(names.ExportFailureReason.ALL, 0.0)


def export_failures(producer: Producer) -> dict[str, int]:
    return producer.self_metrics.totals()[1]


def test_refusing_backend_never_blocks_sampling_and_memory_stays_bounded() -> None:
    clock = FakeClock()
    exporter = otlp_exporter(endpoint=f"http://127.0.0.1:{unused_port()}", timeout_s=0.2)
    producer = Producer(source=FakeSource(gpus=4, clock=clock), exporter=exporter, clock=clock, max_queue=2)
    worker = producer.worker
    assert worker is not None
    try:
        for _ in range(20):
            producer.run_once()
            assert worker.queue_length <= 2
        assert producer.cycles == 20
        assert worker.max_seen_queue <= 2
        assert worker.flush(10)
    finally:
        producer.close()
    failures = export_failures(producer)
    assert sum(failures.values()) == 20  # every interval is accounted for: refused or dropped
    assert failures.get(names.ExportFailureReason.REJECTED, 0) >= 1


def test_slow_backend_drops_the_oldest_and_counts_it(sink: OtlpSink) -> None:
    sink.set_mode(SinkMode.HOLD)
    clock = FakeClock()
    source = FakeSource(gpus=2, clock=clock)
    producer = Producer(source=source, exporter=otlp_exporter(endpoint=sink.grpc_endpoint), clock=clock, max_queue=2)
    try:
        producer.run_once()
        assert sink.wait_for(lambda s: s.attempts == 1)  # the first export is stuck in the backend
        for _ in range(9):
            producer.run_once()
        assert producer.worker is not None
        assert producer.worker.queue_length == 2
        assert export_failures(producer) == {names.ExportFailureReason.QUEUE_FULL: 7}
        sink.set_mode(SinkMode.OK)
        assert sink.wait_for(lambda s: len(s.received) == 3)
        assert producer.worker.flush(10)
    finally:
        producer.close()
    # The newest intervals survive: the held first one, then the last two.
    ends = [gpu_resources(item.request)[0].scope_metrics[0].metrics[0].gauge.data_points[0] for item in sink.received]
    assert [point.time_unix_nano for point in ends][1:] == [clock.now - 10 * SECOND, clock.now]


def test_unavailable_backend_is_counted_and_recovers(sink: OtlpSink) -> None:
    sink.set_mode(SinkMode.UNAVAILABLE)
    clock = FakeClock()
    exporter = otlp_exporter(endpoint=sink.grpc_endpoint, timeout_s=0.5)
    producer = Producer(source=FakeSource(gpus=2, clock=clock), exporter=exporter, clock=clock)
    try:
        for _ in range(3):
            producer.run_once()
        assert producer.worker is not None
        assert producer.worker.flush(10)
        assert export_failures(producer)[names.ExportFailureReason.REJECTED] == 3
        assert sink.received == []
        sink.set_mode(SinkMode.OK)
        producer.run_once()
        assert sink.wait_for(lambda s: len(s.received) == 1)
    finally:
        producer.close()
    _, points = self_metric_points(sink.received[0].request, names.EXPORT_FAILURES.name)
    assert points == {names.ExportFailureReason.REJECTED: 3}
    assert len(gpu_resources(sink.received[0].request)) == 2


def test_sigterm_flushes_the_last_interval(sink: OtlpSink) -> None:
    clock = FakeClock()
    source = FakeSource(gpus=2, clock=clock)
    # A real clock paces the loop (20 ms intervals); the fake source stamps its own readings.
    producer = Producer(source=source, exporter=otlp_exporter(endpoint=sink.grpc_endpoint), interval_s=0.02)
    previous = signal.getsignal(signal.SIGTERM)

    def terminate() -> None:
        sink.wait_for(lambda s: len(s.received) >= 2)
        os.kill(os.getpid(), signal.SIGTERM)

    killer = threading.Thread(target=terminate)
    killer.start()
    cycles = producer.run()
    killer.join()
    assert cycles >= 3
    assert cycles == source.reads
    assert len(sink.received) == cycles  # the last, partial interval was exported before shutdown
    assert source.closed
    assert signal.getsignal(signal.SIGTERM) is previous


def test_duration_stops_cleanly_and_flushes(sink: OtlpSink) -> None:
    clock = FakeClock()
    source = FakeSource(gpus=1, clock=clock)
    producer = Producer(source=source, exporter=otlp_exporter(endpoint=sink.grpc_endpoint), interval_s=0.05)
    cycles = producer.run(duration_s=0.2, handle_signals=False)
    assert cycles >= 1
    assert cycles == source.reads == len(sink.received)


def test_a_source_that_raises_is_counted_not_fatal() -> None:
    @attrs.define
    class Exploding:
        name: str = "exploding"

        def read(self) -> Snapshot:
            raise OSError("scrape failed: connection reset")

        def close(self) -> None:
            pass

    producer = Producer(source=Exploding(), clock=FakeClock())
    producer.run_once()
    assert producer.self_metrics.totals()[0] == {names.ErrorReason.SCRAPE: 1}


@attrs.define
class Recording:
    """Wraps a source and keeps what it read, so the test compares the export with the same readings."""

    inner: Any
    name: str = "recording"
    last: Snapshot | None = None

    def read(self) -> Snapshot:
        self.last = self.inner.read()
        return self.last

    def close(self) -> None:
        self.inner.close()


@pytest.mark.skipif(
    importlib.util.find_spec("otel_ofu.sources.simulated") is None, reason="the simulated fleet is not written yet"
)
def test_simulated_fleet_through_grpc_matches_its_truth(sink: OtlpSink) -> None:
    simulated: Any = importlib.import_module("otel_ofu.sources.simulated")
    clock = FakeClock()
    fleet = simulated.SimulatedFleet.demo(clock=clock, cycle_counters=True)
    source = Recording(fleet)
    producer = Producer(source=source, exporter=otlp_exporter(endpoint=sink.grpc_endpoint), clock=clock)
    try:
        clock.advance(300)
        producer.run_once()
        clock.advance(10)
        producer.run_once()
        assert sink.wait_for(lambda s: len(s.received) == 2)
    finally:
        producer.close()
    assert source.last is not None
    readings = {reading.gpu.uuid: reading for reading in source.last.readings}
    resources = gpu_resources(sink.received[-1].request)
    assert len(resources) == len(readings) > 0
    for rm in resources:
        attributes = attributes_of(rm.resource.attributes)
        reading = readings[attributes[names.HW_ID]]
        assert attributes[names.HOST_NAME] == reading.gpu.host
        assert attributes[names.JOB_ID] == reading.gpu.hints[names.JOB_ID]  # the source's own attribution hints
        metrics = rm.scope_metrics[0].metrics
        # gpu.energy is a sum and gpu.throttle a point per reason: the rest are one-point gauges.
        got = {
            m.name: m.gauge.data_points[0] for m in metrics if m.HasField("gauge") and m.name != names.GPU_THROTTLE.name
        }
        (energy,) = (m.sum for m in metrics if m.name == names.GPU_ENERGY.name)
        assert energy.is_monotonic
        assert energy.data_points[0].start_time_unix_nano == fleet.start_ns  # cumulative since the counter's start
        (throttle,) = (m.gauge for m in metrics if m.name == names.GPU_THROTTLE.name)
        assert len(throttle.data_points) == len(names.ThrottleReason.ALL)
        expected = compute(reading, precision=reading.gpu.hints.get(names.GPU_PRECISION)).as_metrics()
        assert {name: point.as_double for name, point in got.items()} == pytest.approx(expected)
        ofu = got[names.GPU_OFU.name]
        assert (ofu.start_time_unix_nano, ofu.time_unix_nano) == (reading.start_ns, reading.end_ns)
        truth = fleet.interval_truth(reading.gpu.key, reading.start_ns, reading.end_ns)
        assert ofu.as_double == pytest.approx(truth.ofu, abs=0.02)


# --- honest export errors: one line, never "behind" for a dead backend, a short shutdown ---------------


def until(predicate: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    """Poll ``predicate`` (another thread makes it true) until it holds; False after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_a_backend_that_fails_is_not_called_behind(caplog: pytest.LogCaptureFixture) -> None:
    # Nothing listens: the exporter says so once; the intervals that pile up meanwhile are dropped and counted,
    # without a second line blaming a slow backend.
    release = threading.Event()
    settings = OtlpSettings.resolve(endpoint=f"http://127.0.0.1:{unused_port()}")
    exporter = OtlpMetricExporter(settings, wait=lambda seconds: release.wait(30))
    clock = FakeClock()
    producer = Producer(source=FakeSource(gpus=2, clock=clock), exporter=exporter, clock=clock, max_queue=1)
    try:
        producer.run_once()
        assert until(lambda: exporter.health.failing)  # its first attempt was refused; it waits to retry
        for _ in range(5):  # 5 more intervals: 1 queued, 4 dropped
            producer.run_once()
        assert export_failures(producer) == {names.ExportFailureReason.QUEUE_FULL: 4}
    finally:
        release.set()
        producer.close()
    lines = [
        r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and "shutdown" not in r.getMessage()
    ]
    assert len(lines) == 1
    assert "nothing is listening there (connection refused)" in lines[0]


def test_a_slow_backend_is_said_once_until_it_catches_up(sink: OtlpSink, caplog: pytest.LogCaptureFixture) -> None:
    sink.set_mode(SinkMode.HOLD)
    clock = FakeClock()
    producer = Producer(
        source=FakeSource(gpus=2, clock=clock), exporter=otlp_exporter(endpoint=sink.grpc_endpoint), clock=clock,
        max_queue=2,
    )  # fmt: skip
    try:
        producer.run_once()
        assert sink.wait_for(lambda s: s.attempts == 1)  # held by the backend: it answers, only slowly
        for _ in range(6):  # 2 queued, 4 dropped
            producer.run_once()
        assert export_failures(producer) == {names.ExportFailureReason.QUEUE_FULL: 4}
        sink.set_mode(SinkMode.OK)
        assert producer.worker is not None
        assert producer.worker.flush(10)
    finally:
        producer.close()
    (line,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert line.startswith("exports are slower than the interval: dropping the oldest queued interval")


def test_close_gives_up_a_stalled_export_and_counts_it(sink: OtlpSink) -> None:
    # The backend holds every request (for up to 20 s): close waits its own second, then gives up the export in
    # flight and the two queued, each counted as a shutdown loss, while the backend still holds the first.
    sink.set_mode(SinkMode.HOLD)
    clock = FakeClock()
    producer = Producer(source=FakeSource(gpus=2, clock=clock), exporter=otlp_exporter(endpoint=sink.grpc_endpoint),
                        clock=clock)  # fmt: skip
    for _ in range(3):
        producer.run_once()
    assert sink.wait_for(lambda s: s.attempts == 1)
    closing = threading.Thread(target=producer.close)
    closing.start()
    closing.join(timeout=8)  # the old close waited 10 s for the backend
    assert not closing.is_alive()
    assert sink.received == []
    assert export_failures(producer) == {names.ExportFailureReason.SHUTDOWN: 3}


def test_run_with_nothing_listening_says_so_once_and_ends_soon_after_its_duration(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # `otel-ofu run --duration` against a port nothing listens on: one line naming the endpoint and the cause,
    # and the run ends about a second after its duration (it took over 10 s: the flush waited out the retries).
    from otel_ofu.commands import run

    endpoint = f"http://127.0.0.1:{unused_port()}"
    parser = argparse.ArgumentParser(prog="otel-ofu")
    run.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(
        ["run", "--source", "sim", "--interval", "0.2", "--duration", "1", "--export-endpoint", endpoint, "--quiet"]
    )
    status: list[int] = []
    running = threading.Thread(target=lambda: status.append(args.handler(args)))
    running.start()
    running.join(timeout=6)
    assert not running.is_alive()
    assert status == [1]  # a bounded run that exported nothing failed (and says so in one line, below)
    failing = [r.getMessage() for r in caplog.records if "cannot export" in r.getMessage()]
    assert failing == [
        f"cannot export to {endpoint} (grpc): nothing is listening there (connection refused): is the receiver "
        "running, on this host and port? (sampling goes on; each export is tried again as it comes)"
    ]
    assert not [r for r in caplog.records if r.name.startswith("opentelemetry")]


def test_run_names_the_endpoint_it_will_really_use(monkeypatch: pytest.MonkeyPatch) -> None:
    # The start-up line said "the SDK default", and the base URL where OTLP/HTTP appends /v1/metrics.
    from otel_ofu.commands import run

    parser = argparse.ArgumentParser(prog="otel-ofu")
    run.register(parser.add_subparsers(dest="command", required=True))
    assert run._describe_otlp(parser.parse_args(["run"])) == "grpc http://localhost:4317"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://gateway:4318")
    args = parser.parse_args(["run", "--protocol", "http/protobuf"])
    assert run._describe_otlp(args) == "http/protobuf http://gateway:4318/v1/metrics"


def test_the_command_prints_no_raw_grpc_lines_for_a_tls_mismatch(sink: OtlpSink) -> None:
    # TLS to a plain-text gRPC port: grpc itself logged "I... ssl_transport_security.cc ... Handshake failed" on
    # stderr for every attempt, beside the one line of otel-ofu's own that says what is wrong.
    endpoint = f"https://127.0.0.1:{sink.grpc_port}"
    env = {key: value for key, value in os.environ.items() if not key.startswith(("OTEL_", "GRPC_"))}
    argv = [sys.executable, "-m", "otel_ofu.cli", "run", "--source", "sim", "--interval", "0.3", "--duration", "1"]
    done = subprocess.run(
        [*argv, "--export-endpoint", endpoint, "--quiet"], capture_output=True, text=True, timeout=60, env=env
    )
    assert done.returncode == 1, done.stderr  # nothing got through in its --duration
    lines = done.stderr.splitlines()
    assert lines[-1].startswith(f"otel-ofu run: no export got through to {endpoint} in ")
    assert [line for line in lines if "cannot export" in line] == [
        line for line in lines if f"cannot export to {endpoint} (grpc): the TLS handshake failed" in line
    ]
    assert len([line for line in lines if "cannot export" in line]) == 1
    assert not [line for line in lines if "ssl_transport_security" in line or line[:1] in ("I", "E", "W")]
