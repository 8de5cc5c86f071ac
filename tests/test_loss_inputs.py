"""Power, energy and throttle shares: the pure math, the simulator's power-capped and thermally throttled
GPUs, and the values' way out (OTLP data, snapshot JSON, capture and replay)."""

from __future__ import annotations

from pathlib import Path

import pytest
from opentelemetry.sdk.metrics.export import AggregationTemporality, Gauge, Sum
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from otel_ofu import gpu_values, names, throttle
from otel_ofu.clock import ManualClock
from otel_ofu.commands.snapshot import snapshot_lines
from otel_ofu.model import EnergyCounter, GpuIdentity, GpuReading, Snapshot
from otel_ofu.producer.metrics_data import MetricsDataBuilder, compute_snapshot, env_resource
from otel_ofu.producer.prometheus import LatestSnapshotCollector
from otel_ofu.producer.self_metrics import SelfMetrics
from otel_ofu.sources.capture import CaptureWriter, ReplaySource
from otel_ofu.sources.simulated import GpuFault, JobSpec, ProfileKind, SimGpu, SimulatedFleet
from otel_ofu.testing.simulated_runs import run_for

R = names.ThrottleReason
H100 = "NVIDIA H100 80GB HBM3"

# --- the pure math ------------------------------------------------------------------------------------


def test_bitmask_bits_map_to_reasons_and_idle_is_none() -> None:
    assert throttle.reasons_of(0x1) == frozenset()  # GPU idle
    assert throttle.reasons_of(0x4 | 0x20 | 0x40) == {R.POWER, R.THERMAL}
    assert throttle.reasons_of(0x8 | 0x80) == {R.HW_SLOWDOWN}
    assert throttle.reasons_of(0x2 | 0x10 | 0x200) == {R.APP_CLOCK, R.SYNC_BOOST, R.OTHER}
    assert throttle.bitmask_shares([]) == {}  # no sample: unknown, not unthrottled
    assert throttle.bitmask_shares([0x4, 0x4 | 0x8, 0x0, 0x1]) == {
        R.POWER: 0.5,
        R.THERMAL: 0.0,
        R.HW_SLOWDOWN: 0.25,
        R.SYNC_BOOST: 0.0,
        R.APP_CLOCK: 0.0,
        R.OTHER: 0.0,
    }


def test_violation_shares_clamp_jitter_and_drop_what_cannot_be_a_share() -> None:
    shares = throttle.violation_shares({R.POWER: 2.5e9, R.THERMAL: 10.2e9, R.OTHER: 11e9, R.SYNC_BOOST: -1.0}, 10e9)
    assert shares == {R.POWER: 0.25, R.THERMAL: 1.0}  # 1.02 is jitter; 1.1 and negative are not shares
    assert throttle.violation_shares({R.POWER: 1.0}, 0) == {}


def test_violation_tracker_sums_counters_of_one_reason_and_needs_a_baseline() -> None:
    tracker = throttle.ViolationTracker()
    counters = {names.NVML_PERF_POLICY_BOARD_LIMIT: 1e9, names.NVML_PERF_POLICY_RELIABILITY: 2e9}
    by_reason = throttle.sum_by_reason(counters, names.NVML_VIOLATION_POLICIES)
    assert by_reason == {R.OTHER: 3e9}
    assert tracker.update("g", by_reason, 0) == {}
    assert tracker.update("g", {R.OTHER: 5e9}, 20 * 10**9) == {R.OTHER: 0.1}  # 2 s of 20


def test_energy_tracker_power_staleness_and_reset() -> None:
    tracker = throttle.EnergyTracker()
    first = tracker.update("g", 1000.0, 0)
    assert (first.energy, first.power_w) == (EnergyCounter(0.0, 0), None)
    second = tracker.update("g", 1000.0, 10 * 10**9)  # not refreshed
    assert (second.power_w, second.stale) == (None, True)
    third = tracker.update("g", 7000.0, 20 * 10**9)
    assert (third.energy, third.power_w, third.stale) == (EnergyCounter(6000.0, 0), 300.0, False)  # over 20 s
    reset = tracker.update("g", 5.0, 30 * 10**9)
    assert (reset.energy, reset.power_w) == (EnergyCounter(0.0, 30 * 10**9), None)
    assert throttle.interval_power(reset, 250.0) == 250.0
    assert throttle.interval_power(None, float("nan")) is None


def test_values_drop_invalid_loss_inputs_and_keep_the_rest() -> None:
    identity = GpuIdentity(uuid="GPU-1", model=H100, index=0, host="h")
    reading = GpuReading(
        identity,
        0,
        10**10,
        tensor_active=0.5,
        sm_clock_hz=1.98e9,
        power_w=-3.0,
        energy=EnergyCounter(float("nan"), 0),
        throttle={R.POWER: 0.5, R.THERMAL: 1.5, "bogus": 0.1},
    )
    values = gpu_values.compute(reading)
    assert (values.power_w, values.energy, dict(values.throttle)) == (None, None, {R.POWER: 0.5})


# --- the simulator ------------------------------------------------------------------------------------


def faulty_fleet(seed: int = 7) -> tuple[SimulatedFleet, ManualClock]:
    clock = ManualClock()
    gpus = tuple(
        SimGpu(f"GPU-{index}", "sim-1", index, H100, 1980.0, "j", fault=fault)
        for index, fault in enumerate((None, GpuFault.POWER_CAP, GpuFault.THERMAL))
    )
    job = JobSpec("j", "dense", ProfileKind.DENSE, "bf16", tuple(gpu.key for gpu in gpus), tensor_active=0.9)
    return SimulatedFleet(gpus=gpus, jobs=(job,), seed=seed, clock=clock), clock


def series(snapshots: list[Snapshot], uuid: str) -> list[GpuReading]:
    return [reading for snapshot in snapshots for reading in snapshot.readings if reading.gpu.uuid == uuid]


def test_a_power_capped_gpu_is_held_under_its_cap_by_power() -> None:
    fleet, clock = faulty_fleet()
    capped = series(run_for(fleet, clock, 600, 10), "GPU-1")
    # Full load (activity 1): P = 70 W + 630 W x (f / 1980)^3 <= 420 W gives f <= 1627.8 MHz, 1620 in 15 MHz
    # bins, which draws 70 + 630 x (1620 / 1980)^3 = 415.1 W.
    assert len(capped) == 60
    assert all(reading.sm_clock_hz is not None and reading.sm_clock_hz <= 1620e6 for reading in capped)
    assert all(reading.power_w is not None and reading.power_w <= 415.11 for reading in capped)
    assert max(reading.power_w or 0.0 for reading in capped) == pytest.approx(415.1, abs=0.05)
    assert all(reading.throttle[R.POWER] == 1.0 for reading in capped)
    assert all(reading.throttle[R.THERMAL] == 0.0 for reading in capped)


def test_a_thermally_throttled_gpu_runs_hot_half_of_every_two_minutes() -> None:
    fleet, clock = faulty_fleet()
    hot = series(run_for(fleet, clock, 240, 10), "GPU-2")
    expected = [0.0] * 6 + [1.0] * 6  # the second minute of every 120 s cycle
    assert [reading.throttle[R.THERMAL] for reading in hot] == expected * 2
    for reading in hot:
        if reading.throttle[R.THERMAL] == 1.0:
            assert reading.sm_clock_hz == 1380e6  # 0.7 x 1980 = 1386 MHz, in 15 MHz bins below the max
    cool_power = [r.power_w or 0.0 for r in hot if r.throttle[R.THERMAL] == 0.0 and r.throttle[R.POWER] == 0.0]
    hot_power = [r.power_w or 0.0 for r in hot if r.throttle[R.THERMAL] == 1.0]
    assert max(hot_power) < min(cool_power)  # a slower clock draws less


def test_energy_is_the_integral_of_power_since_the_fleet_started() -> None:
    fleet, clock = faulty_fleet()
    readings = series(run_for(fleet, clock, 300, 10), "GPU-0")
    previous = 0.0
    for reading in readings:
        assert reading.energy is not None
        assert reading.power_w is not None
        assert reading.energy.start_ns == fleet.start_ns
        assert reading.energy.joules - previous == pytest.approx(reading.power_w * 10.0)
        previous = reading.energy.joules
        assert set(reading.throttle) == set(R.ALL)  # every reason measured: a board with violation counters


def test_the_simulated_inputs_are_deterministic_per_seed() -> None:
    runs = []
    for _ in range(2):
        fleet, clock = faulty_fleet(seed=11)
        runs.append(
            [
                (r.power_w, r.energy, dict(r.throttle))
                for snapshot in run_for(fleet, clock, 120, 10)
                for r in snapshot.readings
            ]
        )
    assert runs[0] == runs[1]


# --- the way out --------------------------------------------------------------------------------------


def test_exported_as_a_cumulative_monotonic_sum_and_a_gauge_per_reason() -> None:
    fleet, clock = faulty_fleet()
    snapshot = run_for(fleet, clock, 20, 10)[-1]
    data = MetricsDataBuilder(base=env_resource("h")).build(compute_snapshot(snapshot))
    capped = next(rm for rm in data.resource_metrics if rm.resource.attributes[names.HW_ID] == "GPU-1")
    metrics = {metric.name: metric for metric in capped.scope_metrics[0].metrics}
    reading = next(r for r in snapshot.readings if r.gpu.uuid == "GPU-1")

    energy = metrics[names.GPU_ENERGY.name]
    assert isinstance(energy.data, Sum)
    assert energy.data.is_monotonic
    assert energy.data.aggregation_temporality == AggregationTemporality.CUMULATIVE
    assert energy.unit == "J"
    (point,) = energy.data.data_points
    assert reading.energy is not None
    assert (point.start_time_unix_nano, point.time_unix_nano) == (fleet.start_ns, reading.end_ns)
    assert point.value == reading.energy.joules
    power = metrics[names.GPU_POWER.name]
    assert isinstance(power.data, Gauge)
    assert power.unit == "W"
    assert power.data.data_points[0].value == reading.power_w
    shares = metrics[names.GPU_THROTTLE.name]
    assert isinstance(shares.data, Gauge)
    by_reason = {p.attributes[names.GPU_THROTTLE_REASON]: p.value for p in shares.data.data_points}  # type: ignore[index]
    assert by_reason == dict(reading.throttle)
    assert by_reason[R.POWER] == 1.0


def test_datapoint_placement_keeps_one_throttle_point_per_gpu_and_reason() -> None:
    fleet, clock = faulty_fleet()
    snapshot = run_for(fleet, clock, 10, 10)[-1]
    data = MetricsDataBuilder(placement="datapoint", base=env_resource("h")).build(compute_snapshot(snapshot))
    (resource_metrics,) = data.resource_metrics
    metrics = {metric.name: metric for metric in resource_metrics.scope_metrics[0].metrics}
    points = metrics[names.GPU_THROTTLE.name].data.data_points
    keys = {(p.attributes[names.HW_ID], p.attributes[names.GPU_THROTTLE_REASON]) for p in points}  # type: ignore[index]
    assert len(points) == len(keys) == 3 * len(R.ALL)


def test_snapshot_json_carries_them_by_name() -> None:
    fleet, clock = faulty_fleet()
    snapshot = run_for(fleet, clock, 10, 10)[-1]
    line = next(line for line in snapshot_lines(snapshot) if line[names.HW_ID] == "GPU-1")
    reading = next(r for r in snapshot.readings if r.gpu.uuid == "GPU-1")
    assert reading.energy is not None
    assert line[names.GPU_POWER.name] == reading.power_w
    assert line[names.GPU_ENERGY.name] == reading.energy.joules
    assert line[names.GPU_THROTTLE.name] == dict(reading.throttle)


def test_capture_records_and_replays_them(tmp_path: Path) -> None:
    fleet, clock = faulty_fleet()
    snapshots = run_for(fleet, clock, 30, 10)
    path = tmp_path / "capture.jsonl"
    with CaptureWriter(path) as writer:
        for snapshot in snapshots:
            writer.write(snapshot)
    source = ReplaySource(path)
    replayed = [source.read() for _ in snapshots]
    source.close()
    for original, again in zip(snapshots, replayed, strict=True):
        for a, b in zip(original.readings, again.readings, strict=True):
            assert (b.power_w, b.energy, dict(b.throttle)) == (a.power_w, a.energy, dict(a.throttle))
    lines = path.read_text().splitlines()
    assert '"energy":{"joules":' in lines[0]
    assert '"throttle":{"power":' in lines[0]


def test_prometheus_endpoint_serves_energy_as_a_counter_and_throttle_by_reason() -> None:
    fleet, clock = faulty_fleet()
    snapshot = run_for(fleet, clock, 10, 10)[-1]
    collector = LatestSnapshotCollector()
    collector.update(compute_snapshot(snapshot), SelfMetrics(start_ns=0))
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    families = {f.name: f for f in text_string_to_metric_families(generate_latest(registry).decode())}
    reading = next(r for r in snapshot.readings if r.gpu.uuid == "GPU-1")
    assert reading.energy is not None
    energy = {s.name: s for s in families["gpu_energy_joules"].samples if s.labels["hw_id"] == "GPU-1"}
    assert energy["gpu_energy_joules_total"].value == pytest.approx(reading.energy.joules)
    (created,) = (s for s in families["gpu_energy_joules_created"].samples if s.labels["hw_id"] == "GPU-1")
    assert created.value == pytest.approx(fleet.start_ns / 1e9)  # the counter's start, as its _created
    (power,) = (s for s in families["gpu_power_watts"].samples if s.labels["hw_id"] == "GPU-1")
    assert power.value == pytest.approx(reading.power_w)
    shares = {
        s.labels["gpu_throttle_reason"]: s.value
        for s in families["gpu_throttle"].samples
        if s.labels["hw_id"] == "GPU-1"
    }
    assert shares == dict(reading.throttle)
