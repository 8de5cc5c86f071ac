"""The demo: the simulated fleet end to end through producer, OTLP on loopback and the collector."""

from __future__ import annotations

from pathlib import Path

import pytest

from otel_ofu.cli import main
from otel_ofu.sources.simulated import ProfileKind, SimulatedFleet
from otel_ofu_collector.demo import run_demo
from otel_ofu_collector.report.summary import FleetSummary, summarize


@pytest.fixture(scope="module")
def summary() -> FleetSummary:
    return summarize(run_demo(duration_s=1800, interval_s=10, window_s=60, seed=7))


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
        else:
            assert not job.flagged, (job_id, spec.kind, job.reasons())


def test_ofu_tracks_mfu_for_honest_jobs(summary: FleetSummary) -> None:
    for job in summary.jobs:
        ratio = job.mfu_over_ofu
        if job.flagged or ratio is None:
            continue
        assert 0.9 < ratio < 1.05, job


def test_the_command_prints_the_report_and_exits_zero(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    html = tmp_path / "report.html"
    assert main(["demo", "--duration", "900", "--html", str(html)]) == 0
    assert "suspected FLOP miscount" in html.read_text()
    out = capsys.readouterr().out
    assert "suspected FLOP miscount" in out
    assert "regression: OFU fell" in out
    assert "job-1003" in out
