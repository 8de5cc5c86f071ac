"""The simulated fleet: determinism, the demo fleet's ground truth, sampling noise, and the source contract."""

from __future__ import annotations

import itertools
import re
import statistics
from collections import Counter

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from otel_ofu import gpu_values, names
from otel_ofu.clock import DEFAULT_START_NS, ManualClock, wall_clock
from otel_ofu.model import GpuError, GpuReading, Snapshot, Source
from otel_ofu.sources.simulated import (
    ActivityProfile,
    Bottleneck,
    JobSpec,
    ProfileKind,
    SimGpu,
    SimulatedFleet,
)
from otel_ofu.testing.simulated_runs import run_for

DURATION_S = 1800.0
INTERVAL_S = 10.0
S = 1_000_000_000
UUID = re.compile(r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def run_demo(seed: int = 7, interval_s: float = INTERVAL_S, **options: bool) -> tuple[SimulatedFleet, list[Snapshot]]:
    clock = ManualClock()
    fleet = SimulatedFleet.demo(seed=seed, clock=clock, duration_s=DURATION_S, **options)
    return fleet, run_for(fleet, clock, DURATION_S, interval_s)


@pytest.fixture(scope="module")
def demo() -> tuple[SimulatedFleet, list[Snapshot]]:
    return run_demo()


def readings_of(snapshots: list[Snapshot], job_id: str) -> list[GpuReading]:
    return [r for snapshot in snapshots for r in snapshot.readings if r.gpu.hints[names.JOB_ID] == job_id]


def job_of_kind(fleet: SimulatedFleet, kind: str) -> JobSpec:
    (job,) = (job for job in fleet.jobs if job.kind == kind)
    return job


def window(fleet: SimulatedFleet, start_s: float, end_s: float) -> tuple[int, int]:
    return fleet.start_ns + round(start_s * S), fleet.start_ns + round(end_s * S)


# --- clocks -----------------------------------------------------------------------------------------


def test_manual_clock_moves_only_when_told() -> None:
    clock = ManualClock(start_ns=5 * S)
    assert clock() == clock.now() == 5 * S
    assert clock.advance(1.5) == 6_500_000_000
    clock.set(7 * S)
    assert clock() == 7 * S
    assert ManualClock()() == DEFAULT_START_NS


@pytest.mark.parametrize("seconds", [-1.0, float("nan"), float("inf")])
def test_manual_clock_never_runs_backwards(seconds: float) -> None:
    clock = ManualClock()
    with pytest.raises(ValueError, match="advances"):
        clock.advance(seconds)
    with pytest.raises(ValueError, match="backwards"):
        clock.set(clock() - 1)


def test_wall_clock_is_epoch_nanoseconds() -> None:
    assert wall_clock() > DEFAULT_START_NS


# --- determinism and the source contract ------------------------------------------------------------


def test_same_seed_same_fleet_same_readings() -> None:
    first, first_snapshots = run_demo(seed=11)
    second, second_snapshots = run_demo(seed=11)
    assert first.gpus == second.gpus
    assert first.jobs == second.jobs
    assert first_snapshots == second_snapshots


def test_other_seed_other_fleet() -> None:
    first, first_snapshots = run_demo(seed=11)
    other, other_snapshots = run_demo(seed=12)
    assert {gpu.uuid for gpu in first.gpus}.isdisjoint({gpu.uuid for gpu in other.gpus})
    first_tpa = [r.tensor_active for r in first_snapshots[0].readings]
    other_tpa = [r.tensor_active for r in other_snapshots[0].readings]
    assert first_tpa != other_tpa


def test_ground_truth_does_not_depend_on_the_read_cadence() -> None:
    fast, fast_snapshots = run_demo(interval_s=10.0)
    slow, slow_snapshots = run_demo(interval_s=30.0)
    key = fast.jobs[0].gpu_keys[0]
    for start_s, end_s in ((0.0, 600.0), (123.4, 987.6)):
        assert fast.interval_truth(key, *window(fast, start_s, end_s)) == slow.interval_truth(
            key, *window(slow, start_s, end_s)
        )
    # The interval readings integrate the same series: their time-weighted truth agrees.
    for snapshots, interval in ((fast_snapshots, 10.0), (slow_snapshots, 30.0)):
        total = sum(r.truth_ofu or 0.0 for s in snapshots for r in s.readings if r.gpu.uuid == key) * interval
        assert total / DURATION_S == pytest.approx(fast.jobs[0].tensor_active, rel=0.1)


def test_the_fleet_is_a_source() -> None:
    fleet = SimulatedFleet.demo(clock=ManualClock())
    assert isinstance(fleet, Source)
    assert fleet.name == "sim-demo"


def test_reads_cover_contiguous_intervals_from_the_clock() -> None:
    clock = ManualClock()
    fleet = SimulatedFleet.demo(clock=clock)
    assert fleet.read() == Snapshot()  # no time has passed: nothing to report
    clock.advance(10)
    first = fleet.read()
    clock.advance(7.5)
    second = fleet.read()
    assert {(r.start_ns, r.end_ns) for r in first.readings} == {(DEFAULT_START_NS, DEFAULT_START_NS + 10 * S)}
    assert {(r.start_ns, r.end_ns) for r in second.readings} == {
        (DEFAULT_START_NS + 10 * S, DEFAULT_START_NS + 17_500_000_000)
    }


def test_a_clock_that_goes_backwards_is_a_source_error_not_a_crash() -> None:
    now = [DEFAULT_START_NS + 100 * S]
    fleet = SimulatedFleet.demo(clock=lambda: now[0])
    now[0] += 10 * S
    assert fleet.read().readings
    now[0] -= 5 * S
    snapshot = fleet.read()
    assert not snapshot.readings
    (error,) = snapshot.errors
    assert error.gpu is None
    assert error.reason == names.ErrorReason.UNKNOWN
    now[0] += 20 * S
    after = fleet.read()
    assert len(after.readings) + len(after.errors) == len(fleet.gpus)  # it carries on once time moves on


def test_read_after_close_is_an_error() -> None:
    clock = ManualClock()
    fleet = SimulatedFleet.demo(clock=clock)
    fleet.close()
    clock.advance(10)
    with pytest.raises(RuntimeError, match="closed"):
        fleet.read()


# --- the demo fleet ---------------------------------------------------------------------------------


def test_demo_fleet_layout(demo: tuple[SimulatedFleet, list[Snapshot]]) -> None:
    fleet, _ = demo
    assert len(fleet.gpus) == 40
    hosts = ("dgx-h100-01", "dgx-h100-02", "dgx-h100-03", "dgx-h100-04", "dgx-h100-05")
    assert Counter(gpu.host for gpu in fleet.gpus) == dict.fromkeys(hosts, 8)
    assert all(gpu.model == "NVIDIA H100 80GB HBM3" and gpu.max_clock_mhz == 1980 for gpu in fleet.gpus)
    assert all(UUID.match(gpu.uuid) for gpu in fleet.gpus)
    assert sorted(key for job in fleet.jobs for key in job.gpu_keys) == sorted(gpu.key for gpu in fleet.gpus)
    assert Counter(job.kind for job in fleet.jobs) == {
        ProfileKind.DENSE: 7,  # two healthy, three with a bottleneck, one that hangs, one that restarts
        ProfileKind.MOE: 1,
        ProfileKind.REGRESSING: 1,
        ProfileKind.MIXED: 1,
        ProfileKind.IDLE: 1,
    }
    (flaky,) = fleet.flaky_gpus
    assert fleet.job(flaky.job_id).kind == ProfileKind.DENSE
    regressing = job_of_kind(fleet, ProfileKind.REGRESSING)
    assert regressing.regression_at_s == pytest.approx(0.4 * DURATION_S)
    assert regressing.regression_factor == 2.5
    assert job_of_kind(fleet, ProfileKind.MOE).miscount_factor == 2.0
    bottlenecks = {job.job_id: job.bottleneck for job in fleet.jobs if job.bottleneck is not None}
    assert bottlenecks == {
        "job-1007": Bottleneck.INPUT,
        "job-1008": Bottleneck.COMMUNICATION,
        "job-1009": Bottleneck.MEMORY,
    }
    hung = [job for job in fleet.jobs if job.has_hang]
    assert [job.job_id for job in hung] == ["job-1010"]
    assert hung[0].hang_at_s == pytest.approx(0.5 * DURATION_S)
    restarting = [job for job in fleet.jobs if job.training is not None and job.training.crash_at_s is not None]
    assert [job.job_id for job in restarting] == ["job-1011"]


def test_readings_carry_the_attribution_the_simulation_knows(demo: tuple[SimulatedFleet, list[Snapshot]]) -> None:
    fleet, snapshots = demo
    for r in snapshots[0].readings:
        job = fleet.job(r.gpu.hints[names.JOB_ID])
        assert r.gpu.key in job.gpu_keys
        assert r.gpu.hints[names.JOB_NAME] == job.name
        assert r.gpu.hints[names.JOB_SCHEDULER] == "static"
        assert r.gpu.hints[names.GPU_PRECISION] == r.truth_precision
        assert r.gpu.hints[names.GPU_PRECISION] in names.PRECISIONS
        assert r.max_sm_clock_hz == 1980e6


def test_every_reading_passes_the_ofu_math(demo: tuple[SimulatedFleet, list[Snapshot]]) -> None:
    _, snapshots = demo
    count = 0
    for snapshot in snapshots:
        for r in snapshot.readings:
            values = gpu_values.compute(r, precision=r.gpu.hints[names.GPU_PRECISION])
            assert 0.0 <= values.ofu <= 1.0
            assert r.truth_ofu is not None
            assert 0.0 <= r.truth_ofu <= 1.0
            count += 1
    assert count > 0.97 * 32 * DURATION_S / INTERVAL_S


@pytest.mark.parametrize("options", [{"cycle_counters": True}, {"average_clock": True}, {"report_max_clock": False}])
def test_every_reading_passes_the_ofu_math_in_every_mode(options: dict[str, bool]) -> None:
    _, snapshots = run_demo(**options)
    for snapshot in snapshots:
        for r in snapshot.readings:
            values = gpu_values.compute(r)
            assert values.max_clock_from_catalog == (not options.get("report_max_clock", True))
            assert (r.cycles is not None) == options.get("cycle_counters", False)


def test_moe_framework_reports_about_twice_its_ofu(demo: tuple[SimulatedFleet, list[Snapshot]]) -> None:
    fleet, _ = demo
    moe = job_of_kind(fleet, ProfileKind.MOE)
    for start_s in range(0, int(DURATION_S), 60):
        start, end = window(fleet, start_s, start_s + 60)
        ofu, mfu = fleet.truth_ofu(moe.job_id, start, end), fleet.reported_mfu(moe.job_id, start, end)
        assert ofu is not None
        assert mfu is not None
        assert 1.8 < mfu / ofu < 2.1
    assert 0.2 < statistics.mean(r.truth_ofu or 0.0 for r in readings_of(demo[1], moe.job_id)) < 0.3


@pytest.mark.parametrize("kind", [ProfileKind.DENSE, ProfileKind.MIXED, ProfileKind.REGRESSING])
def test_healthy_frameworks_report_close_to_ofu(demo: tuple[SimulatedFleet, list[Snapshot]], kind: str) -> None:
    fleet, _ = demo
    # The jobs that train to a plan (they start, save, hang or restart) report no MFU while they do not train.
    for job in (job for job in fleet.jobs if job.kind == kind and fleet.timeline(job.job_id) is None):
        for start_s in range(0, int(DURATION_S), 60):
            start, end = window(fleet, start_s, start_s + 60)
            ofu, mfu = fleet.truth_ofu(job.job_id, start, end), fleet.reported_mfu(job.job_id, start, end)
            assert ofu is not None
            assert mfu is not None
            assert 0.85 < mfu / ofu < 1.05


def test_regressing_job_drops_about_2_5x_after_its_regression(demo: tuple[SimulatedFleet, list[Snapshot]]) -> None:
    fleet, snapshots = demo
    job = job_of_kind(fleet, ProfileKind.REGRESSING)
    assert job.regression_at_s is not None
    at_ns = fleet.start_ns + round(job.regression_at_s * S)
    before = [r.truth_ofu or 0.0 for r in readings_of(snapshots, job.job_id) if r.end_ns <= at_ns]
    after = [r.truth_ofu or 0.0 for r in readings_of(snapshots, job.job_id) if r.start_ns >= at_ns]
    assert statistics.mean(before) / statistics.mean(after) == pytest.approx(2.5, rel=0.1)
    measured_before = statistics.mean(gpu_values.compute(r).ofu for r in readings_of(snapshots, job.job_id)[:100])
    assert measured_before == pytest.approx(statistics.mean(before), rel=0.05)
    # The framework's MFU follows the real drop.
    mfu_before = fleet.reported_mfu(job.job_id, *window(fleet, 0, job.regression_at_s))
    mfu_after = fleet.reported_mfu(job.job_id, *window(fleet, job.regression_at_s, DURATION_S))
    assert mfu_before is not None
    assert mfu_after is not None
    assert mfu_before / mfu_after == pytest.approx(2.5, rel=0.1)
    # Nobody else regresses.
    for other in fleet.jobs:
        if other.kind in (ProfileKind.DENSE, ProfileKind.MOE) and fleet.timeline(other.job_id) is None:
            early = fleet.truth_ofu(other.job_id, *window(fleet, 0, job.regression_at_s))
            late = fleet.truth_ofu(other.job_id, *window(fleet, job.regression_at_s, DURATION_S))
            assert early is not None
            assert late == pytest.approx(early, rel=0.1)


def test_regression_can_recover() -> None:
    clock = ManualClock()
    gpu = SimGpu("GPU-1", "h", 0, "NVIDIA H100 80GB HBM3", 1980.0, "j")
    job = JobSpec(
        "j", "debug-flag", ProfileKind.REGRESSING, "bf16", ("GPU-1",), regression_at_s=300.0,
        regression_factor=2.5, recovery_at_s=600.0, tensor_active=0.5,
    )  # fmt: skip
    fleet = SimulatedFleet(gpus=(gpu,), jobs=(job,), seed=1, clock=clock)
    healthy, regressed, recovered = (
        fleet.truth_ofu("j", *window(fleet, a, b)) for a, b in ((0, 300), (300, 600), (600, 900))
    )
    assert healthy is not None
    assert regressed is not None
    assert healthy / regressed == pytest.approx(2.5, rel=0.1)
    assert recovered == pytest.approx(healthy, rel=0.1)


def test_idle_gpu_has_a_job_but_no_ofu_and_no_mfu(demo: tuple[SimulatedFleet, list[Snapshot]]) -> None:
    fleet, snapshots = demo
    idle = job_of_kind(fleet, ProfileKind.IDLE)
    readings = readings_of(snapshots, idle.job_id)
    assert len(readings) == DURATION_S / INTERVAL_S
    assert all(gpu_values.compute(r).ofu < 0.005 for r in readings)
    assert all(r.gpu.hints[names.JOB_NAME] == idle.name for r in readings)
    assert fleet.reported_mfu(idle.job_id, *window(fleet, 0, DURATION_S)) is None


def test_flaky_gpu_errors_never_read_zero_and_recovers(demo: tuple[SimulatedFleet, list[Snapshot]]) -> None:
    fleet, snapshots = demo
    (flaky,) = fleet.flaky_gpus
    failed: list[int] = []
    for number, snapshot in enumerate(snapshots):
        errors = [e for e in snapshot.errors if e.gpu_key == flaky.key]
        readings = [r for r in snapshot.readings if r.gpu.key == flaky.key]
        assert len(errors) + len(readings) == 1  # one or the other, never both, never neither
        assert all(e.reason in (names.ErrorReason.GPU_LOST, names.ErrorReason.NO_VALUE) for e in errors)
        assert all(isinstance(e, GpuError) and e.gpu is not None for e in errors)
        assert all((r.tensor_active or 0.0) > 0.0 for r in readings)
        if errors:
            failed.append(number)
    assert failed
    assert {e.reason for s in snapshots for e in s.errors} == {names.ErrorReason.GPU_LOST, names.ErrorReason.NO_VALUE}
    assert len(failed) < len(snapshots) / 4
    recovered = [number for number in range(failed[0], len(snapshots)) if number not in failed]
    assert recovered  # it is read again after failing
    assert any(b - a > 1 for a, b in itertools.pairwise(failed))  # and fails again later: now and then
    other_errors = [e for s in snapshots for e in s.errors if e.gpu_key != flaky.key]
    assert not other_errors


def test_mixed_precision_job_switches_between_fp8_and_bf16(demo: tuple[SimulatedFleet, list[Snapshot]]) -> None:
    fleet, snapshots = demo
    job = job_of_kind(fleet, ProfileKind.MIXED)
    assert job.switch_every_s == 180.0
    readings = [r for r in readings_of(snapshots, job.job_id) if r.gpu.key == job.gpu_keys[0]]
    precisions = [r.gpu.hints[names.GPU_PRECISION] for r in readings]
    assert set(precisions) == {"bf16", "fp8"}
    switches = sum(a != b for a, b in itertools.pairwise(precisions))
    assert switches == DURATION_S // 180 - 1
    assert precisions[0] == "bf16"
    assert precisions[18] == "fp8"  # 180-190 s
    # OFU is precision-agnostic: the fp8 phases show lower tensor activity, and MFU tracks it.
    bf16 = statistics.mean(r.truth_ofu or 0.0 for r in readings if r.truth_precision == "bf16")
    fp8 = statistics.mean(r.truth_ofu or 0.0 for r in readings if r.truth_precision == "fp8")
    assert fp8 < bf16
    values = gpu_values.compute(readings[20], precision="fp8")
    assert values.flops_achieved == pytest.approx(values.ofu * 1979e12)


def test_clock_boosts_throttles_and_jitters(demo: tuple[SimulatedFleet, list[Snapshot]]) -> None:
    fleet, snapshots = demo
    busy = fleet.jobs[0]
    clocks = [r.sm_clock_hz or 0.0 for r in readings_of(snapshots, busy.job_id)]
    assert max(clocks) <= 1980e6
    assert sum(c >= 1900e6 for c in clocks) > len(clocks) / 2  # mostly boosting
    assert any(1550e6 <= c <= 1760e6 for c in clocks)  # power throttling stretches
    assert len(set(clocks)) > 5  # jitter
    assert all(c % 15e6 == 0 for c in clocks)  # 15 MHz bins
    idle = readings_of(snapshots, job_of_kind(fleet, ProfileKind.IDLE).job_id)
    assert all(r.sm_clock_hz == 345e6 for r in idle)


def test_point_sampled_clock_adds_noise_that_averages_out(demo: tuple[SimulatedFleet, list[Snapshot]]) -> None:
    _, snapshots = demo
    busy = [r for s in snapshots for r in s.readings if (r.truth_ofu or 0.0) > 0.05]
    errors = [gpu_values.compute(r).ofu - (r.truth_ofu or 0.0) for r in busy]
    assert sum(abs(e) > 1e-4 for e in errors) > len(errors) / 20  # the noise is there
    assert max(abs(e) for e in errors) > 0.01
    assert abs(statistics.mean(errors)) < 0.0005  # and averages out
    assert statistics.mean(abs(e) for e in errors) < 0.0022  # the paper: < 0.22 pp


@pytest.mark.parametrize("option", ["cycle_counters", "average_clock"])
def test_exact_clocks_remove_most_sampling_noise(option: str) -> None:
    _, point_snapshots = run_demo()
    _, exact_snapshots = run_demo(**{option: True})

    def mean_abs_error(snapshots: list[Snapshot]) -> float:
        busy = [r for s in snapshots for r in s.readings if (r.truth_ofu or 0.0) > 0.05]
        return statistics.mean(abs(gpu_values.compute(r).ofu - (r.truth_ofu or 0.0)) for r in busy)

    assert mean_abs_error(exact_snapshots) < mean_abs_error(point_snapshots) / 2


def test_interval_truth_reports_the_true_average_clock(demo: tuple[SimulatedFleet, list[Snapshot]]) -> None:
    fleet, snapshots = demo
    r = snapshots[5].readings[0]
    truth = fleet.interval_truth(r.gpu.key, r.start_ns, r.end_ns)
    assert truth is not None
    assert truth.ofu == r.truth_ofu
    assert truth.tensor_active == pytest.approx(r.tensor_active)
    assert 1500e6 < truth.mean_sm_clock_hz <= 1980e6
    assert fleet.interval_truth(r.gpu.key, r.end_ns, r.end_ns) is None
    with pytest.raises(KeyError, match="no simulated GPU"):
        fleet.interval_truth("GPU-nope", r.start_ns, r.end_ns)
    with pytest.raises(KeyError, match="no simulated job"):
        fleet.reported_mfu("job-nope", r.start_ns, r.end_ns)


def test_reported_mfu_is_deterministic_and_empty_for_empty_intervals(
    demo: tuple[SimulatedFleet, list[Snapshot]],
) -> None:
    fleet, _ = demo
    job_id = fleet.jobs[0].job_id
    start, end = window(fleet, 100, 160)
    assert fleet.reported_mfu(job_id, start, end) == fleet.reported_mfu(job_id, start, end)
    assert fleet.reported_mfu(job_id, end, end) is None
    assert fleet.reported_mfu(job_id, start - 10**13, start - 10**12) is None  # before the fleet started


# --- specs and random fleets ------------------------------------------------------------------------


def test_job_spec_validates_its_fields() -> None:
    with pytest.raises(ValueError, match="kind"):
        JobSpec("j", "n", "training", "bf16", ("g",))
    with pytest.raises(ValueError, match="precision"):
        JobSpec("j", "n", ProfileKind.DENSE, "fp12", ("g",))
    with pytest.raises(ValueError, match="tensor_active"):
        JobSpec("j", "n", ProfileKind.DENSE, "bf16", ("g",), tensor_active=1.5)
    with pytest.raises(ValueError, match="miscount_factor"):
        JobSpec("j", "n", ProfileKind.MOE, "bf16", ("g",), miscount_factor=0.0)


def test_fleet_rejects_inconsistent_placement() -> None:
    gpu = SimGpu("GPU-1", "h", 0, "NVIDIA H100 80GB HBM3", 1980.0, "j")
    job = JobSpec("j", "n", ProfileKind.DENSE, "bf16", ("GPU-2",))
    with pytest.raises(ValueError, match="not placed on it"):
        SimulatedFleet(gpus=(gpu,), jobs=(job,), clock=ManualClock())


def test_random_fleet_injects_the_requested_shares() -> None:
    fleet = SimulatedFleet.random_fleet(
        200, seed=3, miscount_share=0.1, regression_share=0.15, clock=ManualClock(), duration_s=3600
    )
    kinds = Counter(job.kind for job in fleet.jobs)
    assert kinds[ProfileKind.MOE] == 20
    assert kinds[ProfileKind.REGRESSING] == 30
    assert sum(job.has_miscount for job in fleet.jobs) == 20
    assert sum(job.has_regression for job in fleet.jobs) == 30
    for job in fleet.jobs:
        if job.has_miscount:
            assert 1.2 <= job.miscount_factor <= 3.0
        if job.has_regression:
            assert 1.5 <= job.regression_factor <= 3.0
            assert job.regression_at_s is not None
            assert 0.3 * 3600 <= job.regression_at_s <= 0.6 * 3600
        assert 0.93 <= job.mfu_efficiency <= 0.99
    assert len({gpu.uuid for gpu in fleet.gpus}) == len(fleet.gpus)
    assert max(Counter(gpu.host for gpu in fleet.gpus).values()) <= 8
    again = SimulatedFleet.random_fleet(
        200, seed=3, miscount_share=0.1, regression_share=0.15, clock=ManualClock(), duration_s=3600
    )
    assert again.jobs == fleet.jobs


def test_random_fleet_reads_like_the_demo() -> None:
    clock = ManualClock()
    fleet = SimulatedFleet.random_fleet(
        20, seed=5, miscount_share=0.2, regression_share=0.2, clock=clock, duration_s=600, step_s=5.0,
        flaky_share=0.2, cycle_counters=True,
    )  # fmt: skip
    snapshots = run_for(fleet, clock, 600, 60)
    assert all(len(s.readings) + len(s.errors) == len(fleet.gpus) for s in snapshots)
    for snapshot in snapshots:
        for r in snapshot.readings:
            assert 0.0 <= gpu_values.compute(r).ofu <= 1.0
    start, end = window(fleet, 0, 600)
    for job in fleet.jobs:
        ofu, mfu = fleet.truth_ofu(job.job_id, start, end), fleet.reported_mfu(job.job_id, start, end)
        assert ofu is not None
        assert mfu is not None
        assert mfu / ofu == pytest.approx(job.mfu_ratio, rel=0.06)


def test_random_fleet_rejects_shares_above_one() -> None:
    with pytest.raises(ValueError, match="add up"):
        SimulatedFleet.random_fleet(10, seed=1, miscount_share=0.6, regression_share=0.6)


@settings(max_examples=15, deadline=None)
@given(st.integers(min_value=0, max_value=2**32), st.sampled_from([7.0, 10.0, 30.0]))
def test_any_seed_gives_valid_readings(seed: int, interval_s: float) -> None:
    clock = ManualClock()
    fleet = SimulatedFleet.random_fleet(
        6, seed=seed, miscount_share=0.2, regression_share=0.2, clock=clock, duration_s=300, flaky_share=0.3,
        idle_share=0.2, gpus_per_job=(1, 2),
    )  # fmt: skip
    for snapshot in run_for(fleet, clock, 300, interval_s):
        assert len(snapshot.readings) + len(snapshot.errors) == len(fleet.gpus)
        for r in snapshot.readings:
            values = gpu_values.compute(r, precision=r.gpu.hints[names.GPU_PRECISION])
            assert 0.0 <= values.ofu <= 1.0
            assert r.truth_ofu is not None
            assert abs(values.ofu - r.truth_ofu) < 0.1


# --- engine, SM and DRAM activity and link traffic ------------------------------------------------------------

TX, RX = names.IoDirection.TRANSMIT, names.IoDirection.RECEIVE


def test_activity_profiles_by_kind_and_bottleneck() -> None:
    eight = tuple(f"g{i}" for i in range(8))
    healthy = ActivityProfile.of(JobSpec("a", "a", ProfileKind.DENSE, "bf16", eight, tensor_active=0.48))
    # The healthy mix: E 0.97; S = min(0.9, 0.48 + 0.37) = 0.85; DRAM 0.35; NVLink 60 GB/s each way.
    assert healthy == ActivityProfile(0.97, 0.85, 0.30, 0.35, 60e9, 0.5e9, 0.1e9)
    single = ActivityProfile.of(JobSpec("b", "b", ProfileKind.DENSE, "bf16", ("g",), tensor_active=0.48))
    assert single.nvlink_bytes_per_s == 0.0  # one GPU has no NVLink peer
    moe = ActivityProfile.of(JobSpec("c", "c", ProfileKind.MOE, "bf16", eight, tensor_active=0.26))
    assert moe.sm_active == pytest.approx(0.63)  # 0.26 + 0.37
    assert moe.nvlink_bytes_per_s == 120e9  # all-to-all between the experts
    # Input-bound: the engine runs 60% of the step at the healthy mix: E = 0.97 x 0.6 = 0.582; at TPA 0.288 the
    # running SMs are min(0.9, 0.288 / 0.6 + 0.37) = 0.85 busy, so S = 0.51; DRAM 0.35 x 0.6 = 0.21; PCIe 6 GB/s in.
    job = JobSpec("d", "d", ProfileKind.DENSE, "bf16", eight, tensor_active=0.288, bottleneck=Bottleneck.INPUT)
    assert attrs.astuple(ActivityProfile.of(job)) == pytest.approx((0.582, 0.51, 0.18, 0.21, 36e9, 6e9, 0.2e9))
    # Communication-bound: NVLink at 0.73 x 450 GB/s = 328.5 GB/s each way; DRAM streams both directions of it:
    # 2 x 328.5 / 3350 + 0.02 = 0.21612.
    job = JobSpec(
        "e", "e", ProfileKind.DENSE, "bf16", eight[:4], tensor_active=0.2, bottleneck=Bottleneck.COMMUNICATION
    )
    profile = attrs.astuple(ActivityProfile.of(job))
    assert profile == pytest.approx((0.96, 0.80, 0.12, 0.21612, 328.5e9, 0.5e9, 0.1e9), abs=1e-5)
    job = JobSpec("f", "f", ProfileKind.DENSE, "bf16", eight[:2], tensor_active=0.16, bottleneck=Bottleneck.MEMORY)
    assert ActivityProfile.of(job) == ActivityProfile(0.96, 0.88, 0.45, 0.70, 40e9, 0.5e9, 0.1e9)
    idle = ActivityProfile.of(JobSpec("g", "g", ProfileKind.IDLE, "bf16", ("g",), tensor_active=0.0))
    assert idle == ActivityProfile(0.0, 0.0, 0.0, 0.0)


def test_every_reading_nests_tensor_within_sm_within_engine_and_counts_links_from_the_start(
    demo: tuple[SimulatedFleet, list[Snapshot]],
) -> None:
    fleet, snapshots = demo
    previous: dict[str, float] = {}
    for snapshot in snapshots:
        for r in snapshot.readings:
            t, sm, engine = r.tensor_active or 0.0, r.sm_active or 0.0, r.engine_active
            assert engine is not None
            assert t <= sm <= engine <= 1.0
            assert 0.0 <= (r.sm_occupancy or 0.0) <= 1.0
            assert 0.0 <= (r.dram_active or 0.0) <= 1.0
            assert None not in (r.tensor_active, r.sm_active, r.sm_occupancy, r.dram_active)
            for counter in (*r.nvlink_io.values(), *r.pcie_io.values()):
                assert counter.start_ns == fleet.start_ns
            if TX in r.pcie_io:
                total = r.pcie_io[TX].total_bytes
                assert total >= previous.get(r.gpu.key, 0.0)  # monotonic, outages included
                previous[r.gpu.key] = total
    idle = [r for snapshot in snapshots for r in snapshot.readings if r.gpu.hints[names.JOB_ID] == "job-1006"]
    # The idle GPU's counters are there and flat: a measured 0 bytes/s, as NVML and DCGM read one, not absent.
    assert idle
    for r in idle:
        assert r.dram_active == 0.0
        assert set(r.nvlink_io) == set(r.pcie_io) == {TX, RX}
        assert all(counter.total_bytes == 0.0 for counter in (*r.nvlink_io.values(), *r.pcie_io.values()))


def test_a_readings_activity_follows_its_profile_at_the_pace_the_interval_ran(
    demo: tuple[SimulatedFleet, list[Snapshot]],
) -> None:
    _, snapshots = demo
    readings = readings_of(snapshots, "job-1009")  # memory-bound: E 0.96, S 0.88, occupancy 0.45, DRAM 0.70
    for r in readings:
        assert r.dram_active is not None
        assert r.tensor_active is not None
        assert r.sm_active is not None
        pace = r.dram_active / 0.70  # the share of the nominal pace the interval ran
        assert 0.0 < pace <= 1.0
        assert r.sm_active == pytest.approx(max(r.tensor_active, 0.88 * pace), abs=1e-12)
        assert r.engine_active == pytest.approx(max(r.sm_active, 0.96 * pace), abs=1e-12)
        assert r.sm_occupancy == pytest.approx(0.45 * pace, abs=1e-12)
    # Both links scale with the same paced time: NVLink 40 GB/s against PCIe 0.5 GB/s in is 80 to 1, exactly.
    first, last = readings[0], readings[-1]
    nvlink = last.nvlink_io[TX].total_bytes - first.nvlink_io[TX].total_bytes
    pcie = last.pcie_io[RX].total_bytes - first.pcie_io[RX].total_bytes
    assert nvlink / pcie == pytest.approx(80.0, rel=1e-12)


def _means(snapshots: list[Snapshot], job_id: str) -> dict[str, float]:
    readings = readings_of(snapshots, job_id)

    def mean(values: list[float | None]) -> float:
        known = [value for value in values if value is not None]
        return sum(known) / len(known)

    engine = mean([r.engine_active for r in readings])
    sm = mean([r.sm_active for r in readings])
    tensor = mean([r.tensor_active for r in readings])
    last = readings[-1]
    seconds = (last.end_ns - last.nvlink_io[TX].start_ns) / S if last.nvlink_io else 1.0
    return {
        "no_kernel": 1 - engine,
        "sm_idle": engine - sm,
        "non_tensor": sm - tensor,
        "dram": mean([r.dram_active for r in readings]),
        "nvlink_bytes_per_s": last.nvlink_io[TX].total_bytes / seconds if last.nvlink_io else 0.0,
    }


def test_the_demos_three_bottlenecked_jobs_show_three_different_causes(
    demo: tuple[SimulatedFleet, list[Snapshot]],
) -> None:
    _, snapshots = demo
    # Over the run a job runs at ~0.97 of its nominal pace: TPA noise above the nominal is capped at the pace
    # (E[min(1, 1 + 0.06 g)] = 1 - 0.06 x 0.399 = 0.976) and a 1% share of steps stalls to 0.3 (-0.007).
    pace = (0.95, 0.99)
    input_bound = _means(snapshots, "job-1007")
    # No kernel 40% of the step, and the healthy 3% of the rest: 1 - 0.582 x 0.97 = 0.44.
    assert 1 - 0.582 * pace[1] <= input_bound["no_kernel"] <= 1 - 0.582 * pace[0]
    assert input_bound["no_kernel"] > max(input_bound["sm_idle"], input_bound["non_tensor"])
    communication = _means(snapshots, "job-1008")
    assert communication["non_tensor"] > max(communication["no_kernel"], communication["sm_idle"])
    assert 328.5e9 * pace[0] <= communication["nvlink_bytes_per_s"] <= 328.5e9 * pace[1]
    assert communication["dram"] < 0.25
    memory = _means(snapshots, "job-1009")
    assert memory["non_tensor"] > max(memory["no_kernel"], memory["sm_idle"])
    assert 0.70 * pace[0] <= memory["dram"] <= 0.70 * pace[1]
    assert memory["nvlink_bytes_per_s"] < 50e9
    healthy = _means(snapshots, "job-1001")
    assert healthy["no_kernel"] < 0.1  # 1 - 0.97 x 0.97
    assert healthy["dram"] < 0.4
    assert healthy["nvlink_bytes_per_s"] < 100e9


def test_a_regression_takes_the_engine_with_it(demo: tuple[SimulatedFleet, list[Snapshot]]) -> None:
    fleet, snapshots = demo
    regressing = job_of_kind(fleet, ProfileKind.REGRESSING)
    assert regressing.regression_at_s is not None
    at_ns = fleet.start_ns + round(regressing.regression_at_s * S)
    before = [r.engine_active or 0.0 for r in readings_of(snapshots, regressing.job_id) if r.end_ns <= at_ns]
    after = [r.engine_active or 0.0 for r in readings_of(snapshots, regressing.job_id) if r.start_ns >= at_ns]
    # 2.5x slower with the same kernels: the engine runs 1 / 2.5 of the time, E = 0.97 x 0.4 x ~0.97 = 0.38.
    assert statistics.mean(before) == pytest.approx(0.97 * 0.97, abs=0.03)  # E 0.97 at ~0.97 of the pace
    assert statistics.mean(after) == pytest.approx(0.97 * 0.4 * 0.97, abs=0.03)


def test_a_random_fleet_injects_bottlenecks_and_leaves_the_other_jobs_as_they_were() -> None:
    plain = SimulatedFleet.random_fleet(40, seed=5, gpus_per_job=(1, 2, 4))
    injected = SimulatedFleet.random_fleet(40, seed=5, gpus_per_job=(1, 2, 4), bottleneck_share=0.3)
    changed = [job for job in injected.jobs if job.bottleneck is not None]
    assert len(changed) == 12  # round(40 x 0.3), enough dense jobs of two GPUs or more in this fleet
    assert Counter(job.bottleneck for job in changed) == dict.fromkeys(Bottleneck.ALL, 4)
    before = {job.job_id: job for job in plain.jobs}
    for job in injected.jobs:
        if job.bottleneck is None:
            assert job == before[job.job_id]
        else:
            assert job.kind == ProfileKind.DENSE
            assert len(job.gpu_keys) > 1
            if job.bottleneck == Bottleneck.INPUT:
                assert job.tensor_active == pytest.approx(0.6 * before[job.job_id].tensor_active)
    assert injected.gpus == plain.gpus
