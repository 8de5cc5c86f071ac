"""Jobs ranked by what an owner can act on, worked by hand, then as the demo's user reads them.

A fleet of H100s: a healthy dense training at 45% OFU on 8 GPUs (the most GPU time lost against 100%, and
nothing to act on), a second dense job at 30% on 4 GPUs, an idle notebook on 1 GPU, and a memory-bound job at
20% on 2 GPUs (SMs busy off the tensor pipes 60% of the time, DRAM 70% busy). Each runs one hour (one window of
3600 s), so a job's GPU time is its GPU count in hours.

By "lost against 100%" the order would be: healthy 8 x 0.55 = 4.4 GPU-h, second 4 x 0.7 = 2.8, memory-bound
2 x 0.8 = 1.6, notebook 1.0. By what an owner can act on: the notebook (a flag: idle), the memory-bound job (a
bottleneck), then the rest by GPU-hours short of the best OFU on H100 in this fleet (45%): second
(0.45 - 0.30) x 4 = 0.6 GPU-h, healthy 0 (it is the best).
"""

from __future__ import annotations

import io
import re

import pytest
from rich.console import Console

from otel_ofu import names
from otel_ofu_collector.report import ranking
from otel_ofu_collector.report.summary import FleetSummary, JobSummary, JobWindow, summarize
from otel_ofu_collector.report.terminal import print_report
from otel_ofu_collector.results import JobLoss, WindowReport

S = 1_000_000_000
T0 = 1_800_000_000 * S
HOUR = 3600.0
H100 = "NVIDIA H100 80GB HBM3"
C = names.OfuLossCause


def job(job_id: str, gpus: int, ofu: float, *, idle: bool = False, dram: float = 0.3) -> JobSummary:
    gpu_time = gpus * HOUR
    if idle:
        shares = {C.IDLE: 1.0 - ofu}
    elif job_id == "membound":
        shares = {C.NO_KERNEL: 0.05, C.SM_IDLE: 0.15, C.NON_TENSOR: 0.60}
    else:
        shares = {C.NO_KERNEL: 0.05, C.SM_IDLE: 0.15, C.NON_TENSOR: 1.0 - ofu - 0.20}
    loss = JobLoss(
        gpu_time_s=gpu_time,
        shares=shares,
        lost_s={cause: share * gpu_time for cause, share in shares.items()},
        dram_active=dram,
    )
    window = JobWindow(
        T0,
        T0 + int(HOUR * S),
        ofu,
        ofu * 0.95 if not idle else None,
        None,
        frozenset({"idle"}) if idle else frozenset(),
        float(gpus),
        loss,
    )
    return JobSummary(job_id, {names.HW_MODEL: H100, names.JOB_NAME: job_id}, (window,))


def fleet() -> FleetSummary:
    jobs = (
        job("healthy", 8, 0.45),
        job("second", 4, 0.30),
        job("notebook", 1, 0.0, idle=True),
        job("membound", 2, 0.20, dram=0.70),
    )
    return FleetSummary(windows=1, start_ns=T0, end_ns=T0 + int(HOUR * S), last_groups=(), correlation=None,
                        mae=None, jobs=jobs)  # fmt: skip


def test_jobs_rank_by_what_an_owner_can_act_on_not_by_loss_against_100_percent() -> None:
    ranked = ranking.rank(fleet())
    assert [item.job.job_id for item in ranked] == ["notebook", "membound", "second", "healthy"]
    assert [item.rank for item in ranked] == [1, 2, 3, 4]
    assert [item.tier.label for item in ranked] == ["idle", "memory-bound", "below best", "ok"]
    by_id = {item.job.job_id: item for item in ranked}
    assert by_id["second"].shortfall_s == pytest.approx((0.45 - 0.30) * 4 * HOUR)
    assert by_id["healthy"].shortfall_s == 0.0
    assert by_id["notebook"].shortfall_s == pytest.approx(0.45 * 1 * HOUR)
    assert by_id["second"].best_ofu == pytest.approx(0.45)
    # The flags column: the flag, the bottleneck in place of "ok", ok for the rest.
    assert [item.label for item in ranked] == ["idle", "memory-bound", "ok", "ok"]
    assert by_id["second"].why == (
        "below best: short of the best OFU its GPU model reaches in this fleet; "
        "0.60 GPU-h short of the best (45.0%) on its GPU model"
    )


def test_each_flag_outranks_the_next_and_a_model_is_compared_with_itself() -> None:
    """Flags in order idle, regression, straggler, miscount; an A100 job is not held to an H100's OFU."""
    base = job("a100", 4, 0.25)
    a100 = JobSummary("a100", {names.HW_MODEL: "NVIDIA A100-SXM4-80GB"}, base.history)

    def flagged(job_id: str, kind: str) -> JobSummary:
        found = job(job_id, 2, 0.40)
        window = found.history[0]
        from attrs import evolve

        return evolve(found, history=(evolve(window, flags_up=frozenset({kind})),))

    jobs = (
        flagged("m", "miscount"),
        flagged("s", "straggler"),
        flagged("r", "regression"),
        flagged("i", "idle"),
        a100,
        job("h", 2, 0.45),
    )
    summary = FleetSummary(1, T0, T0 + int(HOUR * S), (), None, None, jobs)
    ranked = ranking.rank(summary)
    assert [item.job.job_id for item in ranked] == ["i", "r", "s", "m", "a100", "h"]
    a100_rank = next(item for item in ranked if item.job.job_id == "a100")
    assert a100_rank.shortfall_s == 0.0  # the best A100 job of this fleet
    assert a100_rank.tier.label == "ok"


@pytest.fixture(scope="module")
def demo_reports() -> list[WindowReport]:
    from otel_ofu_collector.demo.command import run_demo

    return run_demo(duration_s=1800, interval_s=10, window_s=60, seed=7)


@pytest.fixture(scope="module")
def demo_summary(demo_reports: list[WindowReport]) -> FleetSummary:
    return summarize(demo_reports)


def report_lines(summary: FleetSummary) -> list[str]:
    console = Console(file=io.StringIO(), width=80)
    print_report(summary, console)
    file = console.file
    assert isinstance(file, io.StringIO)
    return file.getvalue().splitlines()


def test_the_demo_report_ranks_its_jobs_and_names_the_bound_ones(demo_summary: FleetSummary) -> None:
    """The demo as its user reads it: the hung job, idle notebook, regression, straggler, miscount; then the
    communication-, memory- and input-bound jobs by their GPU-hours short of llama3-70b's 44.8% (the best H100 job);
    then the unflagged jobs likewise (the restarting job at ~33.7% on 2 GPU-h 0.22 GPU-h short, the mixed-precision
    job at ~34.8% on 2 GPU-h 0.20, mistral at ~37.6% on 1.46 GPU-h 0.10)."""
    lines = report_lines(demo_summary)
    start = next(i for i, line in enumerate(lines) if line.startswith("Jobs"))
    rows = [line.split() for line in lines[start:] if re.match(r"job-\d+ ", line)][: len(demo_summary.jobs)]
    order = [row[0] for row in rows]
    assert order == [
        "job-1010",  # hang
        "job-1006",  # idle
        "job-1004",  # regression
        "job-1001",  # straggler
        "job-1003",  # miscount
        "job-1008",  # communication-bound, (0.448 - 0.195) x 2.00 = 0.51 GPU-h short
        "job-1009",  # memory-bound, (0.448 - 0.160) x 1.00 = 0.29
        "job-1007",  # input-bound, (0.448 - 0.281) x 1.00 = 0.17
        "job-1011",  # the restarting job at ~33.7% on 2 GPU-h: 0.22 GPU-h short
        "job-1005",
        "job-1002",
    ]
    flags = {row[0]: row[-1] for row in rows}
    assert flags["job-1007"] == "input-bound"
    assert flags["job-1008"] == "comm-bound"
    assert flags["job-1009"] == "memory-bound"
    assert flags["job-1005"] == "ok"
    words = " ".join(" ".join(lines).split())
    assert "Ranked by what an owner can act on" in words
    for meaning in ("idle: GPUs allocated that do no tensor work", "memory-bound: SMs busy off the tensor pipes"):
        assert meaning in words
    # The loss table in the same order.
    loss_start = next(i for i, line in enumerate(lines) if line.startswith("Where OFU is lost"))
    loss_rows = [line.split()[0] for line in lines[loss_start:] if re.match(r"job-\d+ ", line)]
    assert loss_rows[: len(order)] == order


def test_the_html_report_ranks_the_same_and_says_what_each_rank_means(
    demo_reports: list[WindowReport], demo_summary: FleetSummary
) -> None:
    from otel_ofu_collector.report.html_page import build_report

    page = build_report(demo_reports, summary=demo_summary)
    expected = [item.job.job_id for item in ranking.rank(demo_summary)]
    table = page[page.index('<table id="all-jobs">') :]
    table = table[: table.index("</table>")]
    rows = re.findall(r'<tr data-rank="(\d+)"><td>[^<]*</td><td>([^<]*)</td>', table)
    assert [job_id for _, job_id in rows] == expected
    assert [int(rank) for rank, _ in rows] == list(range(1, len(expected) + 1))
    for job_id, word in (("job-1007", "input-bound"), ("job-1008", "comm-bound"), ("job-1009", "memory-bound")):
        row = table[table.index(f"<td>{job_id}</td>") :]
        assert word in row[: row.index("</tr>")]
    assert "Ranked by what an owner can act on" in page
    assert "memory-bound: SMs busy off the tensor pipes with DRAM busy" in page
    loss = page[page.index('<table id="loss-by-cause">') :]
    loss_ids = re.findall(r"<tr><td>[^<]*</td><td>(job-\d+)</td>", loss[: loss.index("</table>")])
    assert loss_ids == expected
