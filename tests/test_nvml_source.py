"""The NVML source through the real pynvml against the fake NVML C library (no Python-level mocking)."""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Callable

import attrs
import pynvml
import pytest

from otel_ofu import gpu_values, names, ofu_math
from otel_ofu.model import GpuError, GpuReading, Snapshot, Source, SourceUnavailable
from otel_ofu.sources import nvml
from otel_ofu.sources.nvml import NO_GPM_MESSAGE, NvmlSource
from otel_ofu.testing import fake_nvml
from otel_ofu.testing.fake_nvml import FakeNvml
from tests.nvml_helpers import SECOND, T0, ManualClock

Reason = names.ErrorReason
Code = names.NvmlReturn


def only_reading(snapshot: Snapshot, uuid: str) -> GpuReading:
    (reading,) = (r for r in snapshot.readings if r.gpu.uuid == uuid)
    return reading


def errors_of(snapshot: Snapshot, key: str) -> list[GpuError]:
    return [error for error in snapshot.errors if error.gpu_key == key]


def test_fake_struct_layouts_match_pynvml(fake: FakeNvml) -> None:
    assert fake.struct_sizes() == {
        "nvmlGpmMetric_t": ctypes.sizeof(pynvml.c_nvmlGpmMetric_t),
        "nvmlGpmMetricsGet_t.metrics": pynvml.c_nvmlGpmMetricsGet_t.metrics.offset,
        "nvmlProcessInfo_t": ctypes.sizeof(pynvml.c_nvmlProcessInfo_v3_t),
        "nvmlGpmSupport_t": ctypes.sizeof(pynvml.c_nvmlGpmSupport_t),
        "nvmlViolationTime_t": ctypes.sizeof(pynvml.c_nvmlViolationTime_t),
    }


def test_build_is_cached(fake: FakeNvml) -> None:
    assert fake_nvml.build_library() == fake.path


def test_reads_identity_clocks_and_interval_tensor_activity(
    fake: FakeNvml, clock: ManualClock, open_source: Callable[[], NvmlSource]
) -> None:
    first = fake.add_gpu("NVIDIA H100 80GB HBM3", sm_clock_mhz=1755)
    second = fake.add_gpu("NVIDIA H100 PCIe", max_sm_clock_mhz=1755, sm_clock_mhz=1600)
    fake.set_tensor_util(first, 42.5)
    fake.set_metric(first, names.NVML_GPM_METRIC_SM_UTIL, 80.0)
    fake.set_metric(first, names.NVML_GPM_METRIC_DRAM_BW_UTIL, 30.0)
    fake.set_tensor_util(second, 10.0)
    source = open_source()
    assert isinstance(source, Source)
    assert source.name == "nvml"
    clock.advance(10)

    snapshot = source.read()

    assert snapshot.errors == ()
    reading = only_reading(snapshot, fake.uuid_of(first))
    assert reading.gpu.model == "NVIDIA H100 80GB HBM3"
    assert reading.gpu.index == 0
    assert reading.gpu.host == "node-1"
    assert (reading.start_ns, reading.end_ns) == (T0, T0 + 10 * SECOND)
    assert reading.tensor_active == 0.425
    assert reading.sm_active == 0.8
    assert reading.dram_active == 0.3
    assert reading.sm_clock_hz == 1755e6
    assert reading.max_sm_clock_hz == 1980e6
    assert reading.cycles is None
    other = only_reading(snapshot, fake.uuid_of(second))
    assert (other.gpu.index, other.tensor_active, other.sm_clock_hz, other.max_sm_clock_hz) == (1, 0.1, 1600e6, 1755e6)
    assert other.sm_active is None  # a metric the GPU does not report is absent, not 0

    values = gpu_values.compute(reading)
    assert values.ofu_raw == pytest.approx(0.425 * 1755 / 1980)
    assert values.ofu == pytest.approx(0.425 * min(1755 / 1830, 1.0))


def test_consecutive_reads_cover_consecutive_intervals(
    fake: FakeNvml, clock: ManualClock, open_source: Callable[[], NvmlSource]
) -> None:
    gpu = fake.add_gpu()
    fake.set_tensor_util(gpu, 50.0)
    source = open_source()
    clock.advance(10)
    first = source.read().readings[0]
    fake.set_tensor_util(gpu, 20.0)
    clock.advance(5)
    second = source.read().readings[0]
    assert (second.start_ns, second.end_ns) == (first.end_ns, first.end_ns + 5 * SECOND)
    assert (first.tensor_active, second.tensor_active) == (0.5, 0.2)


def test_sm_clock_is_the_mean_of_the_interval_sub_samples(
    fake: FakeNvml, clock: ManualClock, open_source: Callable[[], NvmlSource]
) -> None:
    gpu = fake.add_gpu()
    fake.set_tensor_util(gpu, 60.0)
    source = open_source()
    fake.schedule_sm_clocks(gpu, [1000, 1200, 1400, 1980])
    for _ in range(4):
        clock.advance(2.5)
        source.sample_clocks()

    reading = source.read().readings[0]
    assert reading.sm_clock_hz == pytest.approx(1395e6)  # mean of the four samples, none taken at read time
    assert fake.clock_calls(gpu) == 4

    clock.advance(10)
    again = source.read().readings[0]  # no sub-samples this interval: one sample at read time
    assert again.sm_clock_hz == 1980e6
    assert fake.clock_calls(gpu) == 5


def test_background_thread_sub_samples_the_clock(fake: FakeNvml, clock: ManualClock) -> None:
    gpu = fake.add_gpu()
    fake.set_tensor_util(gpu, 60.0)
    fake.schedule_sm_clocks(gpu, [1500] * 3)
    source = NvmlSource(host="node-1", clock=clock, clock_sample_hz=200.0)
    try:
        deadline = time.monotonic() + 10
        while fake.clock_calls(gpu) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert fake.clock_calls(gpu) >= 3
        assert source.read().readings[0].sm_clock_hz == 1500e6
    finally:
        source.close()
    assert not any(thread.name == "otel-ofu-nvml-clocks" for thread in threading.enumerate())


def test_cycle_counters_give_the_exact_interval_ofu(
    fake: FakeNvml, clock: ManualClock, open_source: Callable[[], NvmlSource]
) -> None:
    gpu = fake.add_gpu("NVIDIA H100 80GB HBM3")
    fake.advance_cycles(gpu, sm_cycles_elapsed=10**12, mma_cycles_active=10**11)  # history before opening
    fake.set_tensor_util(gpu, 50.0)
    source = open_source()
    fake.advance_cycles(gpu, sm_cycles_elapsed=15_000_000_000, mma_cycles_active=6_000_000_000)
    clock.advance(10)

    reading = source.read().readings[0]

    assert reading.cycles is not None
    assert (reading.cycles.sm_cycles_elapsed, reading.cycles.mma_cycles_active) == (15_000_000_000, 6_000_000_000)
    values = gpu_values.compute(reading)
    exact = ofu_math.ofu_from_cycles(6_000_000_000, 15_000_000_000, 10.0, 1980e6, tensor_clock_hz=1830e6)
    assert values.tensor_active == pytest.approx(0.4)
    assert values.sm_clock_hz == pytest.approx(1500e6)
    assert values.ofu == pytest.approx(exact.ofu)
    assert values.ofu == pytest.approx(0.4 * 1500 / 1830)


def test_implausible_cycle_counters_are_set_aside_for_tensor_utilisation(
    fake: FakeNvml, clock: ManualClock, open_source: Callable[[], NvmlSource]
) -> None:
    gpu = fake.add_gpu()
    fake.set_tensor_util(gpu, 50.0)
    source = open_source()
    # Summed over 132 SMs the counter would imply a clock far above the max: not one clock domain.
    fake.advance_cycles(gpu, sm_cycles_elapsed=132 * 15_000_000_000, mma_cycles_active=132 * 7_500_000_000)
    clock.advance(10)

    snapshot = source.read()

    assert snapshot.errors == ()
    assert snapshot.readings[0].cycles is None
    assert gpu_values.compute(snapshot.readings[0]).tensor_active == 0.5


def test_driver_rejecting_cycle_metric_ids_falls_back_to_tensor_utilisation(
    fake: FakeNvml, clock: ManualClock, open_source: Callable[[], NvmlSource]
) -> None:
    gpu = fake.add_gpu()
    fake.set_tensor_util(gpu, 30.0)
    fake.advance_cycles(gpu, sm_cycles_elapsed=1, mma_cycles_active=0)
    source = open_source()
    fake.fail("nvmlGpmMetricsGet", Code.ERROR_INVALID_ARGUMENT, gpu=gpu, times=1)
    clock.advance(10)

    snapshot = source.read()

    assert snapshot.errors == ()
    assert (snapshot.readings[0].tensor_active, snapshot.readings[0].cycles) == (0.3, None)


def test_gpu_without_gpm_reports_clocks_and_says_tensor_activity_is_unavailable(
    fake: FakeNvml, clock: ManualClock, open_source: Callable[[], NvmlSource]
) -> None:
    gpu = fake.add_gpu("NVIDIA A100-SXM4-80GB", max_sm_clock_mhz=1410, sm_clock_mhz=1410, gpm=False)
    source = open_source()
    clock.advance(10)

    snapshot = source.read()

    (reading,) = snapshot.readings
    assert (reading.sm_clock_hz, reading.max_sm_clock_hz, reading.tensor_active) == (1410e6, 1410e6, None)
    assert (reading.start_ns, reading.end_ns) == (T0, T0 + 10 * SECOND)
    (error,) = snapshot.errors
    assert (error.reason, error.message, error.gpu) == (Reason.NOT_SUPPORTED, NO_GPM_MESSAGE, reading.gpu)
    with pytest.raises(ofu_math.InvalidReading):  # never an OFU of 0
        gpu_values.compute(reading)
    assert fake.clock_calls(gpu) == 1


def test_a_failing_metric_is_reported_and_the_other_gpus_are_read(
    fake: FakeNvml, clock: ManualClock, open_source: Callable[[], NvmlSource]
) -> None:
    broken, healthy = fake.add_gpu(), fake.add_gpu()
    fake.set_tensor_util(broken, 40.0)
    fake.set_metric(broken, names.NVML_GPM_METRIC_SM_UTIL, 70.0)
    fake.set_tensor_util(healthy, 40.0)
    fake.fail_metric(broken, names.NVML_GPM_METRIC_ANY_TENSOR_UTIL, Code.ERROR_NO_PERMISSION)
    source = open_source()
    clock.advance(10)

    snapshot = source.read()

    reading = only_reading(snapshot, fake.uuid_of(broken))
    assert (reading.tensor_active, reading.sm_active, reading.sm_clock_hz) == (None, 0.7, 1980e6)
    (error,) = snapshot.errors
    assert error.reason == Reason.NO_PERMISSION
    assert error.gpu_key == fake.uuid_of(broken)
    assert "ANY_TENSOR_UTIL" in error.message
    assert only_reading(snapshot, fake.uuid_of(healthy)).tensor_active == 0.4


def test_each_read_reports_its_own_metric_results(
    fake: FakeNvml, clock: ManualClock, open_source: Callable[[], NvmlSource]
) -> None:
    # The metrics request is kept between reads: no read may see a result of the one before.
    gpu = fake.add_gpu()
    fake.set_tensor_util(gpu, 40.0)
    fake.set_metric(gpu, names.NVML_GPM_METRIC_SM_UTIL, 70.0)
    source = open_source()
    clock.advance(10)
    assert only_reading(source.read(), fake.uuid_of(gpu)).sm_active == 0.7
    fake.fail_metric(gpu, names.NVML_GPM_METRIC_SM_UTIL, Code.ERROR_NO_DATA)
    clock.advance(10)
    assert only_reading(source.read(), fake.uuid_of(gpu)).sm_active is None
    fake.fail_metric(gpu, names.NVML_GPM_METRIC_SM_UTIL, 0)
    fake.set_metric(gpu, names.NVML_GPM_METRIC_SM_UTIL, 20.0)
    fake.fail("nvmlGpmMetricsGet", Code.ERROR_UNKNOWN, times=1)
    clock.advance(10)
    failed = source.read()
    assert only_reading(failed, fake.uuid_of(gpu)).sm_active is None
    assert [error.reason for error in failed.errors] == [Reason.UNKNOWN]
    clock.advance(10)
    recovered = source.read()
    assert recovered.errors == ()
    assert (only_reading(recovered, fake.uuid_of(gpu)).sm_active, recovered.readings[0].tensor_active) == (0.2, 0.4)


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        (Code.ERROR_GPU_IS_LOST, Reason.GPU_LOST),
        (Code.ERROR_NOT_SUPPORTED, Reason.NOT_SUPPORTED),
        (Code.ERROR_NO_PERMISSION, Reason.NO_PERMISSION),
        (Code.ERROR_DRIVER_NOT_LOADED, Reason.DRIVER),
        (Code.ERROR_UNINITIALIZED, Reason.DRIVER),
        (Code.ERROR_NO_DATA, Reason.NO_VALUE),
        (Code.ERROR_UNKNOWN, Reason.UNKNOWN),
    ],
)
def test_nvml_errors_map_to_per_gpu_reasons(
    fake: FakeNvml, clock: ManualClock, open_source: Callable[[], NvmlSource], code: int, reason: str
) -> None:
    broken, healthy = fake.add_gpu(), fake.add_gpu()
    fake.set_tensor_util(broken, 40.0)
    fake.set_tensor_util(healthy, 40.0)
    source = open_source()
    fake.fail("nvmlGpmSampleGet", code, gpu=broken)
    clock.advance(10)

    snapshot = source.read()

    (error,) = snapshot.errors
    assert (error.reason, error.gpu_key) == (reason, fake.uuid_of(broken))
    assert error.gpu is not None
    assert error.gpu.uuid == fake.uuid_of(broken)
    assert only_reading(snapshot, fake.uuid_of(healthy)).tensor_active == 0.4
    assert nvml.error_reason(code) == reason


def test_lost_gpu_is_reported_until_it_returns_then_reacquired(
    fake: FakeNvml, clock: ManualClock, open_source: Callable[[], NvmlSource]
) -> None:
    gpu, other = fake.add_gpu(), fake.add_gpu()
    fake.set_tensor_util(gpu, 40.0)
    fake.set_tensor_util(other, 40.0)
    samples_before = fake.live_samples
    source = open_source()
    assert fake.live_samples == samples_before + 4  # a baseline and a spare per GPU
    key = fake.uuid_of(gpu)

    fake.fail("*", Code.ERROR_GPU_IS_LOST, gpu=gpu)
    clock.advance(10)
    lost = source.read()
    assert [error.reason for error in errors_of(lost, key)] == [Reason.GPU_LOST]
    assert fake.live_samples == samples_before + 2  # the lost GPU's samples were freed
    assert [reading.gpu.uuid for reading in lost.readings] == [fake.uuid_of(other)]

    clock.advance(10)
    still_lost = source.read()
    assert [error.reason for error in errors_of(still_lost, key)] == [Reason.GPU_LOST]

    fake.fail("*", Code.SUCCESS, gpu=gpu)
    fake.set_tensor_util(gpu, 70.0)
    clock.advance(10)
    returned = source.read()
    assert [error.reason for error in errors_of(returned, key)] == [Reason.NO_VALUE]  # a fresh baseline, no interval
    assert fake.live_samples == samples_before + 4

    clock.advance(10)
    recovered = source.read()
    assert recovered.errors == ()
    reading = only_reading(recovered, key)
    assert (reading.tensor_active, reading.start_ns, reading.end_ns) == (0.7, clock.now - 10 * SECOND, clock.now)


def test_lost_gpu_seen_by_the_clock_sampler_is_released(
    fake: FakeNvml, clock: ManualClock, open_source: Callable[[], NvmlSource]
) -> None:
    gpu = fake.add_gpu()
    fake.set_tensor_util(gpu, 40.0)
    source = open_source()
    fake.fail("nvmlDeviceGetClockInfo", Code.ERROR_GPU_IS_LOST, gpu=gpu, times=1)
    source.sample_clocks()
    clock.advance(10)
    assert [error.reason for error in source.read().errors] == [Reason.GPU_LOST]
    clock.advance(10)
    assert [error.reason for error in source.read().errors] == [Reason.NO_VALUE]


def test_gpu_unavailable_at_open_is_acquired_on_a_later_read(
    fake: FakeNvml, clock: ManualClock, open_source: Callable[[], NvmlSource]
) -> None:
    early, late = fake.add_gpu(), fake.add_gpu()
    fake.set_tensor_util(early, 40.0)
    fake.set_tensor_util(late, 40.0)
    fake.fail("nvmlDeviceGetHandleByIndex", Code.ERROR_GPU_IS_LOST, gpu=late, times=1)
    source = open_source()
    clock.advance(10)
    first = source.read()
    assert [(error.reason, error.gpu_key) for error in first.errors] == [(Reason.NO_VALUE, fake.uuid_of(late))]
    clock.advance(10)
    second = source.read()
    assert second.errors == ()
    assert only_reading(second, fake.uuid_of(late)).tensor_active == 0.4


def test_clock_read_failure_without_cycles_is_an_error(
    fake: FakeNvml, clock: ManualClock, open_source: Callable[[], NvmlSource]
) -> None:
    gpu = fake.add_gpu()
    fake.set_tensor_util(gpu, 40.0)
    source = open_source()
    fake.fail("nvmlDeviceGetClockInfo", Code.ERROR_NOT_SUPPORTED, gpu=gpu)
    clock.advance(10)
    snapshot = source.read()
    assert (snapshot.readings[0].sm_clock_hz, snapshot.readings[0].tensor_active) == (None, 0.4)
    assert [(error.reason, error.message.split(":")[0]) for error in snapshot.errors] == [
        (Reason.NOT_SUPPORTED, "SM clock unavailable")
    ]


def test_driver_not_loaded_at_open_is_source_unavailable(fake: FakeNvml) -> None:
    fake.add_gpu()
    fake.fail("nvmlInit", Code.ERROR_DRIVER_NOT_LOADED)
    with pytest.raises(SourceUnavailable, match="driver is not loaded") as caught:
        NvmlSource(background=False)
    assert "\n" not in str(caught.value)


def test_no_gpus_is_source_unavailable_and_nvml_is_shut_down(fake: FakeNvml) -> None:
    with pytest.raises(SourceUnavailable, match="no GPUs"):
        NvmlSource(background=False)
    assert fake.init_count == 0


def test_missing_library_is_source_unavailable(fake: FakeNvml) -> None:
    with pytest.raises(SourceUnavailable, match="cannot load"):
        NvmlSource(background=False, library="/nonexistent/libnvidia-ml.so.1")


def test_mig_instances_are_read_through_the_mig_sample_call(
    fake: FakeNvml, clock: ManualClock, open_source: Callable[[], NvmlSource]
) -> None:
    gpu = fake.add_gpu("NVIDIA H100 80GB HBM3", sm_clock_mhz=1800)
    fake.add_mig_instance(gpu, 1, profile="3g.40gb")
    fake.add_mig_instance(gpu, 5, profile="1g.10gb")
    fake.set_tensor_util(gpu, 99.0)  # the whole GPU's value is not what a MIG instance reports
    fake.set_tensor_util(gpu, 30.0, gpu_instance_id=1)
    fake.set_tensor_util(gpu, 80.0, gpu_instance_id=5)
    source = open_source()
    clock.advance(10)

    snapshot = source.read()

    assert snapshot.errors == ()
    by_instance = {reading.gpu.mig_instance_id: reading for reading in snapshot.readings}
    assert set(by_instance) == {1, 5}
    assert by_instance[1].gpu.mig_profile == "3g.40gb"
    assert by_instance[5].gpu.mig_profile == "1g.10gb"
    assert by_instance[1].gpu.key == f"{fake.uuid_of(gpu)}/1"
    assert by_instance[1].gpu.model == "NVIDIA H100 80GB HBM3"
    assert (by_instance[1].tensor_active, by_instance[5].tensor_active) == (0.3, 0.8)
    assert by_instance[5].sm_clock_hz == 1800e6
    assert {identity.mig_instance_id for identity in source.identities()} == {1, 5}


def test_compute_pids_per_gpu_and_mig_instance(fake: FakeNvml, open_source: Callable[[], NvmlSource]) -> None:
    plain = fake.add_gpu()
    mig = fake.add_gpu()
    fake.add_mig_instance(mig, 2)
    fake.add_mig_instance(mig, 3)
    fake.set_processes(plain, [4242, 17, 4242])
    fake.set_processes(mig, [100], gpu_instance_id=2)
    fake.set_processes(mig, [200, 201], gpu_instance_id=3)
    source = open_source()
    identities = {(identity.uuid, identity.mig_instance_id): identity for identity in source.identities()}

    assert source.compute_pids(identities[(fake.uuid_of(plain), None)]) == (17, 4242)
    assert source.compute_pids(identities[(fake.uuid_of(mig), 2)]) == (100,)
    assert source.compute_pids(identities[(fake.uuid_of(mig), 3)]) == (200, 201)

    fake.fail("nvmlDeviceGetComputeRunningProcesses", Code.ERROR_NO_PERMISSION, gpu=plain)
    assert source.compute_pids(identities[(fake.uuid_of(plain), None)]) == ()
    unknown = attrs.evolve(identities[(fake.uuid_of(plain), None)], uuid="GPU-unknown")
    assert source.compute_pids(unknown) == ()


def test_close_frees_samples_and_shuts_nvml_down(fake: FakeNvml, clock: ManualClock) -> None:
    fake.add_gpu()
    fake.add_gpu(gpm=False)
    before = fake.live_samples
    source = NvmlSource(host="node-1", clock=clock, background=False)
    assert (fake.init_count, fake.live_samples) == (1, before + 2)
    source.close()
    source.close()
    assert (fake.init_count, fake.live_samples) == (0, before)
    with pytest.raises(RuntimeError, match="closed"):
        source.read()
