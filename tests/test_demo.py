"""The demo: the simulated fleet end to end through producer, OTLP on loopback and the collector."""

from __future__ import annotations

import io
import re
import time
from pathlib import Path

import attrs
import pytest
from rich.console import Console

from otel_ofu import names
from otel_ofu.cli import main
from otel_ofu.sources.simulated import GpuFault, ProfileKind, SimulatedFleet
from otel_ofu_collector.demo.command import UnreadableGpus, print_unreadable, run_demo, short_duration_warning
from otel_ofu_collector.report.causes import Kind, bottleneck_of
from otel_ofu_collector.report.reasons import flags_of, reasons_of
from otel_ofu_collector.report.summary import HANG, IDLE, STRAGGLER, FleetSummary, summarize
from otel_ofu_collector.report.terminal import print_report
from otel_ofu_collector.results import WindowReport


@pytest.fixture(scope="module")
def unreadable() -> UnreadableGpus:
    return UnreadableGpus()


@pytest.fixture(scope="module")
def reports(unreadable: UnreadableGpus) -> list[WindowReport]:
    return run_demo(duration_s=1800, interval_s=10, window_s=60, seed=7, observers=[unreadable])


@pytest.fixture(scope="module")
def summary(reports: list[WindowReport]) -> FleetSummary:
    return summarize(reports)


def test_every_window_closes_and_every_gpu_reports(summary: FleetSummary) -> None:
    assert summary.windows == 30
    # 40 GPUs; the flaky one may miss a window, never report a zero in its place.
    assert 39 <= summary.gpus <= 40


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
            assert any(reason.startswith("suspected FLOP miscount") for reason in reasons_of(job))
        elif spec.kind == ProfileKind.REGRESSING:
            assert job.regression_windows > 0
            assert job.miscount_windows == 0
            assert any(reason.startswith("regression: OFU fell 2.") for reason in reasons_of(job))
        elif spec.kind == ProfileKind.IDLE:
            assert [flag.kind for flag in flags_of(job)] == [IDLE], reasons_of(job)
            assert any(reason.startswith("idle allocation: 1 GPU") for reason in reasons_of(job))
        elif spec.has_hang:
            # hung half way: the hang and nothing else (not an idle allocation, not a regression)
            assert [flag.kind for flag in flags_of(job)] == [HANG], reasons_of(job)
            assert reasons_of(job)[0].startswith("hang: every one of its 4 GPUs ran kernels with nothing moving")
        elif any(gpu.fault for gpu in SimulatedFleet.demo(seed=7).gpus if gpu.job_id == job_id):
            # the healthy job with the power-capped GPU: flagged for that straggler only
            assert [flag.kind for flag in flags_of(job)] == [STRAGGLER], reasons_of(job)
        else:
            assert not job.flagged, (job_id, spec.kind, reasons_of(job))


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
    # The restarting job's framework reports MFU per step, not over its checkpoint pauses and its relaunch, which
    # its windows' OFU spans: its MFU/OFU sits a little higher, as a real one's would.
    planned = {job.job_id for job in SimulatedFleet.demo(seed=7).jobs if job.training is not None}
    for job in summary.jobs:
        ratio = job.mfu_over_ofu
        if job.flagged or ratio is None or job.job_id in planned:
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
    assert "example price of 2.50 USD per H100-SXM GPU-hour" in flat
    assert "Fleet lost" in flat
    assert "hang: every one of its 4 GPUs ran kernels with nothing moving" in flat
    assert "Where GPU time went" in flat
    assert "Fleet goodput" in flat
    assert 'id="goodput"' in page  # where the GPU time went, per job


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


# --- what a new user reads: the record ends now, at 80 columns, piped --------------------------------


def test_the_record_ends_by_now_not_half_an_hour_into_the_future() -> None:
    before = time.time_ns()
    reports = run_demo(duration_s=300, interval_s=10, window_s=60, seed=7)
    after = time.time_ns()
    # 300 s of fleet time ending by now: 5 windows of 60 s, the first starting (aligned down to the
    # minute) at most 300 + 60 s before the run began, the last ending no later than the run ended.
    assert len(reports) == 5
    assert reports[-1].end_ns <= after
    assert reports[0].start_ns >= before - 360 * 10**9
    assert reports[-1].end_ns - reports[0].start_ns == 300 * 10**9


def test_a_duration_shorter_than_a_window_is_warned_with_the_minimum(capsys: pytest.CaptureFixture[str]) -> None:
    assert short_duration_warning(1800, 10, 60) is None
    assert short_duration_warning(60, 10, 60) is None
    assert main(["demo", "--duration", "30"]) == 0
    err = capsys.readouterr().err
    assert (
        "otel-ofu demo: --duration 30 s is shorter than one window (--window 60 s, reads every 10 s): no whole "
        "window closes. Give --duration 60 or more"
    ) in err
    # Reads 20 s apart cannot fill a 15 s window either: the minimum is the longer of the two.
    warning = short_duration_warning(15, 20, 10)
    assert warning is not None
    assert "Give --duration 20 or more" in warning


def rendered(summary: FleetSummary, unreadable: UnreadableGpus, console: Console) -> list[str]:
    print_report(summary, console, title="otel-ofu demo: fleet report")
    print_unreadable(unreadable, console)
    file = console.file
    assert isinstance(file, io.StringIO)
    return file.getvalue().splitlines()


@pytest.mark.parametrize("piped", [False, True], ids=["terminal-80", "piped"])
def test_the_report_fits_80_columns_on_a_terminal_and_piped(
    piped: bool, summary: FleetSummary, unreadable: UnreadableGpus, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.delenv("LINES", raising=False)
    # Piped: not a terminal, so rich takes its default of 80 columns; else a terminal 80 columns wide (its
    # colours left out, so that the text can be measured).
    file = io.StringIO()
    console = Console(file=file) if piped else Console(file=file, width=80, force_terminal=True, color_system=None)
    assert console.is_terminal is not piped
    plain = rendered(summary, unreadable, console)
    assert all(len(line) <= 80 for line in plain), [line for line in plain if len(line) > 80]

    # Nothing wraps in a table: each job is one line in the jobs table and one in the loss table (and one in
    # the tensor pipes' table when it lost time to them: not the idle job), each GPU group one line (short model
    # names), and no cell carries a unit (it is in the header).
    rows = [line for line in plain if line.startswith("job-")]
    assert len(rows) == 3 * len(summary.jobs) - 1
    assert not any("GPU-h" in row or "USD" in row for row in rows)
    assert len([line for line in plain if line.startswith("H100-SXM ")]) == len(summary.last_groups)
    (loss_header,) = [line for line in plain if line.startswith("job ") and "lost GPU-h" in line]
    assert loss_header.split() == ["job", "GPU-h", "OFU", "idle", "clock", "tensor", "lost", "GPU-h", "lost", "USD"]

    # The idle job's OFU reads the same in both tables (it was 0.00059% in one and 0.0% in the other).
    idle_rows = [row.split() for row in rows if row.startswith("job-1006")]
    assert idle_rows[0][3] == "<0.1%"  # jobs table: job, name, GPUs, OFU
    assert idle_rows[1][2] == "<0.1%"  # loss table: OFU column

    # Flagged jobs: one paragraph per reason, every line of it indented, none back at the margin.
    start = plain.index("Flagged jobs and GPUs:")
    paragraphs = plain[start + 1 : plain.index("", start)]
    assert len([line for line in paragraphs if line.startswith("  job-")]) == sum(
        len(reasons_of(job)) for job in summary.jobs
    )
    assert all(line.startswith("  ") for line in paragraphs)


def test_the_report_tells_the_three_bottlenecks_apart_and_names_none_for_a_healthy_job(
    summary: FleetSummary, unreadable: UnreadableGpus
) -> None:
    # job-1007 stalls on its input 40% of every step (no kernel runs), job-1008 waits on exposed collectives (SMs
    # busy, NVLink ~640 GB/s both ways, DRAM ~0.2), job-1009 on memory (SMs busy, DRAM ~0.7). job-1004's
    # regression slows its whole step, engine with it: 60% of the run at 1/2.5 of the engine's 0.97 leaves no
    # kernel running ~0.6 x 0.61 = 0.37 of its time, so the host side is named there too. The healthy jobs (and
    # the over-counting MoE, the mixed-precision job, the idle notebook) get no sentence.
    named = {job.job_id: found.kind for job in summary.jobs if (found := bottleneck_of(job)) is not None}
    assert named == {
        "job-1004": Kind.HOST,
        "job-1007": Kind.HOST,
        "job-1008": Kind.COMMUNICATION,
        "job-1009": Kind.MEMORY,
    }
    words = " ".join(" ".join(rendered(summary, unreadable, Console(file=io.StringIO(), width=80))).split())
    assert "job-1007 (vit-h-video-pretrain): 4" in words
    assert "no kernel ran; PCIe 6.0 GB/s: the host side (input pipeline, synchronisation, checkpoints)" in words
    assert re.search(
        r"job-1008 \([^)]*\): 5\d\.\d% of GPU time the SMs were busy off the tensor pipes; DRAM 2\d", words
    )
    assert "communication-bound" in words
    assert re.search(r"job-1009 \([^)]*\): 6\d\.\d% of GPU time .* DRAM 6\d\.\d% busy: memory-bound kernels", words)
    for healthy in ("job-1001", "job-1002", "job-1003", "job-1005", "job-1006"):
        assert f"{healthy} (" not in words.split("Where the tensor pipes' time went")[1].split("Flagged jobs")[0]


def test_the_flaky_gpu_the_readme_promises_is_in_the_report(summary: FleetSummary, unreadable: UnreadableGpus) -> None:
    (flaky,) = SimulatedFleet.demo(seed=7).flaky_gpus
    lines = rendered(summary, unreadable, Console(file=io.StringIO(), width=80))
    (line,) = [line for line in lines if line.startswith(f"  GPU {flaky.host}/{flaky.index} ({flaky.job_id}): ")]
    # 1800 s read every 10 s: 180 reads, some of them failed (an outage of 15-45 s every 4 minutes or so).
    failed = int(line.split(": ")[1].split()[0])
    assert 0 < failed < 180
    assert f"{failed} of 180 reads failed (" in line
    assert set(unreadable.by_gpu) == {(f"{flaky.host}/{flaky.index}", flaky.job_id)}  # no other GPU failed


def test_long_ids_and_names_are_cut_not_wrapped(summary: FleetSummary) -> None:
    # A Kubernetes job id is <namespace>/<workload>: 40 characters and more. Only ids and names give way.
    long_id = "research-llm-pretraining/llama3-405b-pretrain-run-0042"
    job = summary.jobs[0]
    renamed = attrs.evolve(job, job_id=long_id, attributes={**job.attributes, names.JOB_NAME: long_id + "-name"})
    console = Console(file=io.StringIO(), width=80)
    print_report(attrs.evolve(summary, jobs=(renamed, *summary.jobs[1:])), console)
    file = console.file
    assert isinstance(file, io.StringIO)
    lines = file.getvalue().splitlines()
    assert all(len(line) <= 80 for line in lines)
    rows = [line for line in lines if line.startswith("research-llm-")]
    assert len(rows) == 3  # the jobs table, the loss table and the tensor pipes' table, one line each
    assert all("…" in row for row in rows)
    assert rows[0].split()[-1] == "straggler"  # the flag is never the part cut


def test_the_hung_and_the_restarted_jobs_time_goes_where_it_went(reports: list[WindowReport]) -> None:
    """job-1010 hangs at 900 s of 1800 on 4 GPUs: 4 x 900 = 3600 GPU-s held, of which the collector books all but the
    part of the window the hang began in (a window is 240 GPU-s) as hang badput. job-1011 crashes at 756 s, 191 s (38
    steps of 5 s) after the checkpoint it resumes from: 4 x 190 = 760 GPU-s of its steps are done again (rework, within
    the step points' 10 s), and its relaunch is counted as recovery or, where its GPUs sat idle all window, idle."""
    from otel_ofu_collector.report.goodput import goodput_summary

    rows = {row.job_id: row for row in goodput_summary(reports).jobs}
    hung, restarted = rows["job-1010"], rows["job-1011"]
    assert 3600 - 240 <= hung.badput_s[names.GoodputCause.HANG] <= 3600
    assert hung.basis == names.GoodputBasis.PROGRESS
    assert 760 - 4 * 10 <= restarted.badput_s[names.GoodputCause.REWORK] <= 760 + 4 * 10
    assert restarted.badput_s[names.GoodputCause.RECOVERY] > 0
    assert restarted.badput_s[names.GoodputCause.CHECKPOINT] > 0
    healthy = rows["job-1001"]
    assert healthy.goodput == 1.0  # no progress input, nothing idle or hung: all of it counts productive
    assert healthy.basis == names.GoodputBasis.COUNTERS
