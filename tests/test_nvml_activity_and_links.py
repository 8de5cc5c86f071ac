"""Engine activity, SM occupancy and the NVLink and PCIe counters from the NVML source: real pynvml against the
fake NVML library, and the producer's OTLP output over real gRPC. Every number is worked by hand."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from otel_ofu import names
from otel_ofu.model import GpuReading, IoCounter, Snapshot
from otel_ofu.producer import Producer, otlp_exporter
from otel_ofu.sources.nvml import NvmlSource
from otel_ofu.testing.fake_nvml import FakeNvml
from otel_ofu.testing.otlp_sink import OtlpSink
from tests.nvml_helpers import SECOND, T0, ManualClock

MIB = 1 << 20
TX, RX = names.IoDirection.TRANSMIT, names.IoDirection.RECEIVE


def whole_gpu(snapshot: Snapshot, uuid: str) -> GpuReading:
    (reading,) = (r for r in snapshot.readings if r.gpu.uuid == uuid and r.gpu.mig_instance_id is None)
    return reading


def test_engine_activity_and_occupancy_come_from_gpm_and_are_absent_where_gpm_lacks_them(
    fake: FakeNvml, clock: ManualClock, open_source: Callable[[], NvmlSource]
) -> None:
    busy = fake.add_gpu()
    fake.set_activity(busy, engine=93.0, sm=81.0, occupancy=31.0, dram=27.0, tensor=45.0)
    plain = fake.add_gpu()
    fake.set_tensor_util(plain, 40.0)  # a driver that gives tensor activity and nothing else
    source = open_source()
    clock.advance(10)

    snapshot = source.read()

    reading = whole_gpu(snapshot, fake.uuid_of(busy))
    # GPM's percent over the interval as a share: 93 % -> 0.93.
    assert (reading.engine_active, reading.sm_active, reading.sm_occupancy) == (0.93, 0.81, 0.31)
    assert (reading.dram_active, reading.tensor_active) == (0.27, 0.45)
    other = whole_gpu(snapshot, fake.uuid_of(plain))
    assert (other.engine_active, other.sm_occupancy) == (None, None)  # not there: absent, never 0
    assert (dict(other.nvlink_io), dict(other.pcie_io)) == ({}, {})
    assert snapshot.errors == ()  # optional readings that are not there are not errors of the GPU


def test_link_throughput_becomes_byte_counters_from_when_the_source_opened(
    fake: FakeNvml, clock: ManualClock, open_source: Callable[[], NvmlSource]
) -> None:
    gpu = fake.add_gpu()
    fake.set_tensor_util(gpu, 40.0)
    fake.set_link_rates(gpu, pcie_tx=1024.0, pcie_rx=4096.0, nvlink_tx=300_000.0, nvlink_rx=290_000.0)
    source = open_source()  # its first GPM sample, at T0, starts the counting
    clock.advance(10)
    first = whole_gpu(source.read(), fake.uuid_of(gpu))
    fake.set_link_rates(gpu, nvlink_tx=150_000.0)
    clock.advance(10)
    second = whole_gpu(source.read(), fake.uuid_of(gpu))

    # MiB/s x 2^20 x 10 s: PCIe 1024 MiB/s -> 10_737_418_240 B, 4096 -> 42_949_672_960; NVLink 300_000 MiB/s ->
    # 3_145_728_000_000 B, 290_000 -> 3_040_870_400_000.
    assert first.pcie_io == {TX: IoCounter(10_737_418_240.0, T0), RX: IoCounter(42_949_672_960.0, T0)}
    assert first.nvlink_io == {TX: IoCounter(3_145_728_000_000.0, T0), RX: IoCounter(3_040_870_400_000.0, T0)}
    # Then 150_000 MiB/s x 2^20 x 10 s = 1_572_864_000_000 B more transmitted; the receive side doubles.
    assert second.nvlink_io == {TX: IoCounter(4_718_592_000_000.0, T0), RX: IoCounter(6_081_740_800_000.0, T0)}
    assert second.pcie_io[TX] == IoCounter(21_474_836_480.0, T0)


def test_a_link_metric_that_fails_for_an_interval_has_no_point_and_its_counter_keeps_its_value(
    fake: FakeNvml, clock: ManualClock, open_source: Callable[[], NvmlSource]
) -> None:
    gpu = fake.add_gpu()
    fake.set_tensor_util(gpu, 40.0)
    fake.set_link_rates(gpu, nvlink_tx=1000.0, nvlink_rx=1000.0)
    source = open_source()
    clock.advance(10)
    source.read()
    fake.fail_metric(gpu, names.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC, names.NvmlReturn.ERROR_NO_DATA)
    clock.advance(10)
    gap = whole_gpu(source.read(), fake.uuid_of(gpu))
    fake.fail_metric(gpu, names.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC, names.NvmlReturn.SUCCESS)
    clock.advance(10)
    after = whole_gpu(source.read(), fake.uuid_of(gpu))

    ten_seconds = 1000.0 * MIB * 10  # 10_485_760_000 B at 1000 MiB/s
    assert gap.nvlink_io == {RX: IoCounter(2 * ten_seconds, T0)}  # no transmit point for the unknown interval
    # Transmit: the first and the third interval, the unknown one left out (not guessed, not 0 either).
    assert after.nvlink_io == {TX: IoCounter(2 * ten_seconds, T0), RX: IoCounter(3 * ten_seconds, T0)}


def test_mig_instances_have_their_own_activity_and_their_share_of_the_board_links(
    fake: FakeNvml, clock: ManualClock, open_source: Callable[[], NvmlSource]
) -> None:
    gpu = fake.add_gpu()  # an H100: 7 compute slices
    engines = {7: 99.3, 8: 49.5, 9: 0.0}  # the GRACT of three instances in DCGM issue 151's dmon capture
    for gi, engine in engines.items():
        fake.add_mig_instance(gpu, gi, profile="1g.10gb")
        fake.set_activity(gpu, engine=engine, sm=engine - 0.6, occupancy=6.1, tensor=engine * 0.94, gpu_instance_id=gi)
    fake.add_mig_instance(gpu, 1, profile="4g.40gb")
    fake.set_activity(gpu, engine=80.0, tensor=30.0, gpu_instance_id=1)
    # The board's links, read from a sample of the whole GPU.
    fake.set_link_rates(gpu, nvlink_tx=70_000.0, nvlink_rx=35_000.0, pcie_rx=700.0)
    source = open_source()
    clock.advance(10)

    snapshot = source.read()

    instances = {r.gpu.mig_instance_id: r for r in snapshot.readings}
    assert set(instances) == {1, 7, 8, 9}  # the board itself is no reading of its own
    assert instances[7].engine_active == pytest.approx(0.993)
    assert instances[8].engine_active == pytest.approx(0.495)
    assert instances[9].engine_active == 0.0  # an idle instance reads 0: measured, not missing
    assert instances[7].sm_active == pytest.approx(0.987)
    assert instances[7].sm_occupancy == pytest.approx(0.061)
    # A 1g slice is 1/7 of the board: NVLink 70_000 MiB/s x 2^20 x 10 s / 7 = 104_857_600_000 B transmitted;
    # a 4g slice 4/7: 419_430_400_000 B.
    assert instances[7].nvlink_io[TX].total_bytes == pytest.approx(104_857_600_000.0)
    assert instances[7].nvlink_io[RX].total_bytes == pytest.approx(52_428_800_000.0)
    assert instances[1].nvlink_io[TX].total_bytes == pytest.approx(419_430_400_000.0)
    assert instances[9].pcie_io[RX] == IoCounter(pytest.approx(700.0 * MIB * 10 / 7), T0)  # type: ignore[arg-type]
    # Seven slices' worth: the configured instances hold 7 of 7, so they add up to the board, once.
    board_bytes = 70_000.0 * MIB * 10
    assert sum(r.nvlink_io[TX].total_bytes for r in instances.values()) == pytest.approx(board_bytes)


def test_without_a_whole_gpu_sample_under_mig_the_instances_carry_no_links_and_keep_their_ofu(
    fake: FakeNvml, clock: ManualClock, open_source: Callable[[], NvmlSource]
) -> None:
    gpu = fake.add_gpu()
    fake.add_mig_instance(gpu, 7, profile="1g.10gb")
    fake.set_activity(gpu, engine=90.0, tensor=40.0, gpu_instance_id=7)
    fake.set_link_rates(gpu, nvlink_tx=70_000.0)
    # A driver that refuses the whole-GPU sample while MIG is on (instances are sampled by nvmlGpmMigSampleGet).
    fake.fail("nvmlGpmSampleGet", names.NvmlReturn.ERROR_NOT_SUPPORTED, gpu=gpu)
    source = open_source()
    clock.advance(10)

    snapshot = source.read()

    (reading,) = snapshot.readings
    assert (reading.tensor_active, reading.engine_active) == (0.4, 0.9)
    assert dict(reading.nvlink_io) == {}
    assert snapshot.errors == ()


def test_a_gpu_lost_while_its_whole_gpu_sample_is_taken_frees_every_sample_and_comes_back(
    fake: FakeNvml, clock: ManualClock, open_source: Callable[[], NvmlSource]
) -> None:
    gpu = fake.add_gpu()
    fake.add_mig_instance(gpu, 7, profile="1g.10gb")
    fake.set_activity(gpu, engine=90.0, tensor=40.0, gpu_instance_id=7)
    fake.set_link_rates(gpu, nvlink_tx=7000.0)
    before = fake.live_samples
    fake.fail("nvmlGpmSampleGet", names.NvmlReturn.ERROR_GPU_IS_LOST, gpu=gpu, times=1)  # the board's first sample
    source = open_source()
    assert fake.live_samples == before  # the instance's samples were freed with the board's, none leaked

    clock.advance(10)
    source.read()  # acquired again: its first interval starts now
    assert fake.live_samples == before + 4  # a baseline and a spare for the instance and for the board
    clock.advance(10)
    (reading,) = source.read().readings
    # 7000 MiB/s x 2^20 x 10 s / 7 for the 1g slice = 10_485_760_000 B, counted from the re-acquisition.
    assert reading.nvlink_io == {TX: IoCounter(pytest.approx(10_485_760_000.0), T0 + 10 * SECOND)}  # type: ignore[arg-type]


def test_the_fake_reports_link_metrics_in_mib_per_second(fake: FakeNvml) -> None:
    import pynvml

    gpu = fake.add_gpu()
    fake.set_link_rates(gpu, pcie_tx=1.0)
    fake.set_tensor_util(gpu, 1.0)
    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(gpu)
        first, second = pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()
        pynvml.nvmlGpmSampleGet(handle, first)
        pynvml.nvmlGpmSampleGet(handle, second)
        request = pynvml.c_nvmlGpmMetricsGet_t()
        request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = 2
        request.metrics[0].metricId = names.NVML_GPM_METRIC_PCIE_TX_PER_SEC
        request.metrics[1].metricId = names.NVML_GPM_METRIC_ANY_TENSOR_UTIL
        request.sample1, request.sample2 = first, second
        pynvml.nvmlGpmMetricsGet(request)
        units = [request.metrics[slot].metricInfo.unit for slot in range(2)]
        for sample in (first, second):
            pynvml.nvmlGpmSampleFree(sample)
    finally:
        pynvml.nvmlShutdown()
    assert units == [b"MiB/s", b"%"]


# --- the producer's OTLP output -----------------------------------------------------------------------


@pytest.fixture
def sink() -> Iterator[OtlpSink]:
    with OtlpSink.start(hold_limit_s=20) as started:
        yield started


@pytest.fixture(autouse=True)
def _clean_otel_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("OTEL_"):
            monkeypatch.delenv(key)


def _attributes(proto_attributes: Any) -> dict[str, Any]:
    return {item.key: getattr(item.value, item.value.WhichOneof("value")) for item in proto_attributes}


def test_the_producer_exports_cumulative_monotonic_byte_sums_by_direction_and_the_activity_gauges(
    fake: FakeNvml, clock: ManualClock, open_source: Callable[[], NvmlSource], sink: OtlpSink
) -> None:
    from opentelemetry.proto.metrics.v1.metrics_pb2 import AggregationTemporality

    gpu = fake.add_gpu()
    fake.set_activity(gpu, engine=95.0, sm=85.0, occupancy=30.0, tensor=48.0)
    fake.set_link_rates(gpu, nvlink_tx=100_000.0, nvlink_rx=50_000.0, pcie_tx=10.0, pcie_rx=20.0)
    producer = Producer(source=open_source(), exporter=otlp_exporter(endpoint=sink.grpc_endpoint), clock=clock)
    try:
        for _ in range(2):
            clock.advance(10)
            producer.run_once()
        assert sink.wait_for(lambda s: len(s.received) == 2)
    finally:
        producer.close()

    request = sink.received[-1].request
    (gpu_resource,) = [rm for rm in request.resource_metrics if names.HW_ID in _attributes(rm.resource.attributes)]
    metrics = {metric.name: metric for metric in gpu_resource.scope_metrics[0].metrics}
    nvlink = metrics[names.GPU_NVLINK_IO.name]
    assert nvlink.unit == "By"
    assert nvlink.WhichOneof("data") == "sum"
    assert nvlink.sum.aggregation_temporality == AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE
    assert nvlink.sum.is_monotonic
    points = {_attributes(p.attributes)[names.NETWORK_IO_DIRECTION]: p for p in nvlink.sum.data_points}
    assert set(points) == {TX, RX}
    for point in points.values():
        # The start is when the producer started counting (the source's first sample), the same on every point
        # of the series; the end is the interval's.
        assert (point.start_time_unix_nano, point.time_unix_nano) == (T0, T0 + 20 * SECOND)
    # 100_000 MiB/s x 2^20 x 20 s = 2_097_152_000_000 B; 50_000 MiB/s -> 1_048_576_000_000 B.
    assert points[TX].as_double == 2_097_152_000_000.0
    assert points[RX].as_double == 1_048_576_000_000.0
    pcie = {
        _attributes(p.attributes)[names.NETWORK_IO_DIRECTION]: p.as_double
        for p in metrics["gpu.pcie.io"].sum.data_points
    }
    assert pcie == {TX: 10.0 * MIB * 20, RX: 20.0 * MIB * 20}
    engine = metrics[names.GPU_ENGINE_ACTIVE.name]
    assert engine.WhichOneof("data") == "gauge"
    assert engine.gauge.data_points[0].as_double == 0.95
    assert metrics[names.GPU_SM_OCCUPANCY.name].gauge.data_points[0].as_double == 0.3
