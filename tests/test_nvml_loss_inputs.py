"""Power, energy and clock throttling from the NVML source: real pynvml against the fake NVML library."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from otel_ofu import gpu_values, names
from otel_ofu.model import EnergyCounter, GpuReading, Snapshot
from otel_ofu.sources.nvml import NvmlSource
from otel_ofu.testing.fake_nvml import FakeNvml
from tests.nvml_helpers import SECOND, T0, ManualClock

R = names.ThrottleReason
SW_POWER_CAP, HW_SLOWDOWN, SW_THERMAL, HW_THERMAL, GPU_IDLE = 0x4, 0x8, 0x20, 0x40, 0x1


def gpu_reading(snapshot: Snapshot, uuid: str) -> GpuReading:
    (reading,) = (r for r in snapshot.readings if r.gpu.uuid == uuid and r.gpu.mig_instance_id is None)
    return reading


def test_power_is_the_energy_counter_delta_over_the_interval(
    fake: FakeNvml, clock: ManualClock, open_source: Callable[[], NvmlSource]
) -> None:
    gpu = fake.add_gpu()
    fake.set_tensor_util(gpu, 50.0)
    fake.set_energy(gpu, 1_000_000.0)  # 1 MJ since the driver loaded, before we started
    fake.set_power(gpu, 350.0)  # the instantaneous reading, not used while the counter gives power
    source = open_source()

    clock.advance(10)
    fake.advance_energy(gpu, 4000.0)
    first = gpu_reading(source.read(), fake.uuid_of(gpu))
    clock.advance(10)
    fake.advance_energy(gpu, 3000.0)
    second = gpu_reading(source.read(), fake.uuid_of(gpu))

    assert first.power_w == pytest.approx(400.0)  # 4000 J / 10 s
    assert first.energy == EnergyCounter(4000.0, T0)  # energy since the source first read the counter
    assert second.power_w == pytest.approx(300.0)
    assert second.energy == EnergyCounter(7000.0, T0)
    values = gpu_values.compute(second)
    assert values.as_metrics()[names.GPU_POWER.name] == pytest.approx(300.0)
    assert values.energy == EnergyCounter(7000.0, T0)


def test_a_counter_that_goes_back_restarts_the_sum_and_power_falls_back_to_the_reading(
    fake: FakeNvml, clock: ManualClock, open_source: Callable[[], NvmlSource]
) -> None:
    gpu = fake.add_gpu()
    fake.set_tensor_util(gpu, 50.0)
    fake.set_energy(gpu, 50_000.0)
    fake.set_power(gpu, 250.0)
    source = open_source()
    clock.advance(10)
    fake.set_energy(gpu, 120.0)  # a driver reload started the counter again

    reading = gpu_reading(source.read(), fake.uuid_of(gpu))

    assert reading.energy == EnergyCounter(0.0, T0 + 10 * SECOND)
    assert reading.power_w == 250.0  # no delta across a reset: the instantaneous power stands in


def test_without_an_energy_counter_power_is_the_instantaneous_reading(
    fake: FakeNvml, clock: ManualClock, open_source: Callable[[], NvmlSource]
) -> None:
    gpu = fake.add_gpu()
    fake.set_tensor_util(gpu, 50.0)
    fake.set_power(gpu, 351.5)
    source = open_source()
    clock.advance(10)

    reading = gpu_reading(source.read(), fake.uuid_of(gpu))

    assert reading.power_w == 351.5
    assert reading.energy is None


def test_a_gpu_without_power_energy_or_throttle_readings_has_them_absent(
    fake: FakeNvml, clock: ManualClock, open_source: Callable[[], NvmlSource]
) -> None:
    gpu = fake.add_gpu()
    fake.set_tensor_util(gpu, 50.0)
    source = open_source()
    clock.advance(10)

    snapshot = source.read()

    reading = gpu_reading(snapshot, fake.uuid_of(gpu))
    assert snapshot.errors == ()  # optional readings that are not there are not errors of the GPU
    assert (reading.power_w, reading.energy, dict(reading.throttle)) == (None, None, {})
    json = gpu_values.compute(reading).as_json()
    assert {names.GPU_POWER.name, names.GPU_ENERGY.name, names.GPU_THROTTLE.name}.isdisjoint(json)


def test_violation_counters_give_shares_and_the_bitmask_the_reasons_without_a_counter(
    fake: FakeNvml, clock: ManualClock, open_source: Callable[[], NvmlSource]
) -> None:
    gpu = fake.add_gpu()
    fake.set_tensor_util(gpu, 50.0)
    for policy in names.NVML_VIOLATION_POLICIES:
        fake.advance_violation(gpu, policy, 100.0)  # history before we started: only the deltas count
    fake.set_event_reasons(gpu, 0)
    source = open_source()

    # Four samples through the interval: power cap + HW slowdown, then power cap, then nothing twice.
    for mask in (SW_POWER_CAP | HW_SLOWDOWN, SW_POWER_CAP, 0, 0):
        fake.set_event_reasons(gpu, mask)
        source.sample_clocks()
    clock.advance(10)
    fake.advance_violation(gpu, names.NVML_PERF_POLICY_POWER, 2.5)
    fake.advance_violation(gpu, names.NVML_PERF_POLICY_THERMAL, 1.0)
    fake.advance_violation(gpu, names.NVML_PERF_POLICY_BOARD_LIMIT, 0.5)
    fake.advance_violation(gpu, names.NVML_PERF_POLICY_RELIABILITY, 0.25)

    reading = gpu_reading(source.read(), fake.uuid_of(gpu))

    assert reading.throttle == pytest.approx(
        {
            R.POWER: 0.25,  # the counter's 2.5 s / 10 s, not the bitmask's 2 of 4 samples
            R.THERMAL: 0.1,
            R.SYNC_BOOST: 0.0,  # a counter that did not move: measured, not throttled
            R.OTHER: 0.075,  # board limit + reliability
            R.HW_SLOWDOWN: 0.25,  # no counter: 1 of 4 samples
            R.APP_CLOCK: 0.0,
        }
    )


def test_without_violation_counters_the_sampled_bitmask_gives_every_share(
    fake: FakeNvml, clock: ManualClock, open_source: Callable[[], NvmlSource]
) -> None:
    gpu = fake.add_gpu()
    fake.set_tensor_util(gpu, 50.0)
    fake.set_event_reasons(gpu, 0)  # the GPU supports the call from the start, as hardware does
    source = open_source()
    for mask in (SW_THERMAL, HW_THERMAL | HW_SLOWDOWN, GPU_IDLE, 0):
        fake.set_event_reasons(gpu, mask)
        source.sample_clocks()
    clock.advance(10)

    reading = gpu_reading(source.read(), fake.uuid_of(gpu))

    expected = dict.fromkeys(R.ALL, 0.0) | {R.THERMAL: 0.5, R.HW_SLOWDOWN: 0.25}  # idle is no throttle
    assert reading.throttle == expected


def test_mig_instances_share_the_gpu_throttling_and_take_their_share_of_the_board_power(
    fake: FakeNvml, clock: ManualClock, open_source: Callable[[], NvmlSource]
) -> None:
    gpu = fake.add_gpu()  # an H100: 7 compute slices
    for gi in range(7):
        fake.add_mig_instance(gpu, gi + 7, profile="1g.10gb")
        fake.set_tensor_util(gpu, 40.0, gpu_instance_id=gi + 7)
    fake.set_power(gpu, 700.0)
    fake.set_energy(gpu, 1_000_000.0)
    fake.set_event_reasons(gpu, SW_POWER_CAP)
    source = open_source()
    for _ in range(2):  # the board at 700 W: 7000 J each 10 s
        clock.advance(10)
        fake.advance_energy(gpu, 7000.0)
        snapshot = source.read()

    instances = [r for r in snapshot.readings if r.gpu.mig_instance_id is not None]
    assert len(instances) == 7
    for reading in instances:
        assert reading.throttle[R.POWER] == 1.0
        # A 1g instance is 1/7 of the board: 700 W x 1/7 = 100 W; 14000 J x 1/7 = 2000 J since the source opened.
        assert reading.power_w == pytest.approx(100.0)
        assert reading.energy is not None
        assert reading.energy.joules == pytest.approx(2000.0)
    assert sum(r.power_w or 0.0 for r in instances) == pytest.approx(700.0)  # the board's, once
    assert sum(r.energy.joules for r in instances if r.energy) == pytest.approx(14000.0)


def test_a_lost_gpu_during_the_power_read_is_reacquired_like_any_other_loss(
    fake: FakeNvml, clock: ManualClock, open_source: Callable[[], NvmlSource]
) -> None:
    gpu = fake.add_gpu()
    fake.set_tensor_util(gpu, 50.0)
    fake.set_power(gpu, 300.0)
    source = open_source()
    clock.advance(10)
    fake.fail("nvmlDeviceGetPowerUsage", names.NvmlReturn.ERROR_GPU_IS_LOST, gpu=gpu, times=1)

    lost = source.read()
    clock.advance(10)
    source.read()  # re-acquired: its first interval starts now
    clock.advance(10)
    back = source.read()

    assert [error.reason for error in lost.errors] == [names.ErrorReason.GPU_LOST]
    assert gpu_reading(back, fake.uuid_of(gpu)).power_w == 300.0


def test_a_gpu_lost_while_sampling_the_bitmask_is_reported_by_the_read(
    fake: FakeNvml, clock: ManualClock, open_source: Callable[[], NvmlSource]
) -> None:
    gpu = fake.add_gpu()
    fake.set_tensor_util(gpu, 50.0)
    fake.set_event_reasons(gpu, 0)
    source = open_source()
    fake.fail("nvmlDeviceGetCurrentClocksEventReasons", names.NvmlReturn.ERROR_GPU_IS_LOST, gpu=gpu, times=1)

    source.sample_clocks()  # the sampler thread's call: must not raise
    clock.advance(10)
    snapshot = source.read()

    assert [error.reason for error in snapshot.errors] == [names.ErrorReason.GPU_LOST]
