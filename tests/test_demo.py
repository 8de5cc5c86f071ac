"""The demo: the simulated fleet end to end through producer, OTLP on loopback and the collector."""

from __future__ import annotations

from pathlib import Path

import pytest

from otel_ofu import names
from otel_ofu.cli import main
from otel_ofu.sources.simulated import GpuFault, ProfileKind, SimulatedFleet
from otel_ofu_collector.demo import run_demo
from otel_ofu_collector.report.summary import IDLE, STRAGGLER, FleetSummary, summarize
from otel_ofu_collector.results import WindowReport


@pytest.fixture(scope="module")
def reports() -> list[WindowReport]:
    return run_demo(duration_s=1800, interval_s=10, window_s=60, seed=7)


@pytest.fixture(scope="module")
def summary(reports: list[WindowReport]) -> FleetSummary:
    return summarize(reports)


def test_every_window_closes_and_every_gpu_reports(summary: FleetSummary) -> None:
    assert summary.windows == 30
    # 24 GPUs; the flaky one may miss a window, never report a zero in its place.
    assert 23 <= summary.gpus <= 24


def test_flags_name_the_injected_jobs_and_no_healthy_one(summary: FleetSummary) -> None:
    truth = {job.job_id: job for job in SimulatedFleet.demo(seed=7).jobs}
    by_id = {job.job_id: job for job in summary.jobs}
    assert set(by_id) == set(truth)
    for job_id, spec in truth.items():
        job = by_id[job_id]
        if spec.kind == ProfileKind.MOE:
            assert job.miscount_windows > 0
            assert job.regression_windows == 0
            ratio = job.mfu_over_ofu
            assert ratio is not None
            assert 1.7 < ratio < 2.2
            assert any(reason.startswith("suspected FLOP miscount") for reason in job.reasons())
        elif spec.kind == ProfileKind.REGRESSING:
            assert job.regression_windows > 0
            assert job.miscount_windows == 0
            assert any(reason.startswith("regression: OFU fell 2.") for reason in job.reasons())
        elif spec.kind == ProfileKind.IDLE:
            assert [flag.kind for flag in job.flags()] == [IDLE], job.reasons()
            assert any(reason.startswith("idle allocation: 1 GPU") for reason in job.reasons())
        elif any(gpu.fault for gpu in SimulatedFleet.demo(seed=7).gpus if gpu.job_id == job_id):
            # the healthy job with the power-capped GPU: flagged for that straggler only
            assert [flag.kind for flag in job.flags()] == [STRAGGLER], job.reasons()
        else:
            assert not job.flagged, (job_id, spec.kind, job.reasons())


def test_the_straggler_is_the_power_capped_gpu_and_no_other(reports: list[WindowReport]) -> None:
    (capped,) = [gpu for gpu in SimulatedFleet.demo(seed=7).gpus if gpu.fault == GpuFault.POWER_CAP]
    flagged = [flag for report in reports for flag in report.gpu_flags]
    assert flagged, "no straggler flagged"
    assert {(flag.job_id, flag.attributes[names.HW_ID]) for flag in flagged} == {(capped.job_id, capped.uuid)}
    # 1 while flagged, carrying the throttle reason that explains it; 3 windows to rise
    assert all(flag.value == 1 for flag in flagged)
    assert {flag.attributes.get(names.GPU_THROTTLE_REASON) for flag in flagged} == {names.ThrottleReason.POWER}
    first = next(index for index, report in enumerate(reports) if report.gpu_flags)
    assert first == 2
    assert all(flag.ofu * 1.25 < flag.job_median_ofu for flag in flagged)


def test_the_demo_prices_the_loss_and_every_window_adds_up(summary: FleetSummary, reports: list[WindowReport]) -> None:
    for report in reports:
        for job in report.jobs:
            if job.loss is None:
                continue
            assert job.ofu is not None
            assert job.ofu + sum(job.loss.shares.values()) == pytest.approx(1.0, abs=1e-12)
            # at the example price of 2.50 USD per H100 GPU-hour
            assert job.loss.cost == pytest.approx(job.loss.gpu_time_s / 3600 * 2.5)
            assert job.loss.currency == "USD"
        total = sum(sum(job.loss.lost_s.values()) for job in report.jobs if job.loss is not None)
        assert sum(report.fleet.loss.lost_s.values()) == pytest.approx(total)
    assert summary.cost_lost_total == pytest.approx(summary.lost_total_s / 3600 * 2.5)


def test_the_same_seed_gives_the_same_report_twice() -> None:
    # Started an hour and a minute apart, as two runs of the command would be: the same numbers.
    first = run_demo(duration_s=600, interval_s=10, window_s=60, seed=7, start_ns=1_800_000_000 * 10**9)
    second = run_demo(duration_s=600, interval_s=10, window_s=60, seed=7, start_ns=1_800_003_660 * 10**9)
    assert len(first) == len(second) == 10

    def content(report: WindowReport) -> object:  # everything but the wall-clock-aligned window times
        return (report.groups, report.jobs, report.fleet, report.gpu_flags)

    assert [content(r) for r in first] == [content(r) for r in second]


def test_ofu_tracks_mfu_for_honest_jobs(summary: FleetSummary) -> None:
    for job in summary.jobs:
        ratio = job.mfu_over_ofu
        if job.flagged or ratio is None:
            continue
        assert 0.9 < ratio < 1.05, job


def test_the_command_prints_the_report_and_exits_zero(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    html = tmp_path / "report.html"
    assert main(["demo", "--duration", "900", "--html", str(html)]) == 0
    page = html.read_text()
    assert "suspected FLOP miscount" in page
    assert 'id="loss-by-cause"' in page  # where OFU is lost, per job and for the fleet
    assert "straggler GPU OFU" in page  # the straggler on its job's timeline
    assert "idle allocation: 1 GPU" in page
    out = capsys.readouterr().out
    assert "suspected FLOP miscount" in out
    assert "regression: OFU fell" in out
    assert "job-1003" in out
    flat = " ".join(out.split())  # the terminal wraps long lines
    assert "straggler: GPU dgx-h100-01/" in flat
    assert "clock held down by its power cap" in flat
    assert "idle allocation: 1 GPU" in flat
    assert "example price of 2.50 USD per GPU-hour" in flat
    assert "Fleet lost" in flat


def test_a_mixed_precision_job_reads_as_both_precisions_whichever_window_ends_the_record(
    summary: FleetSummary,
) -> None:
    # The producer (run/snapshot --source sim) shows bf16 or fp8 for job-1005 depending on the interval;
    # the report names both, in the order seen, not whichever the last window happened to hold.
    (spec,) = [job for job in SimulatedFleet.demo(seed=7).jobs if job.kind == ProfileKind.MIXED]
    (job,) = [job for job in summary.jobs if job.job_id == spec.job_id]
    assert job.precision == f"{spec.precision}+{spec.alternate_precision}"
    short = summarize(run_demo(duration_s=120, interval_s=10, window_s=60, seed=7))
    assert next(j for j in short.jobs if j.job_id == spec.job_id).precision == spec.precision
