"""The run summary: per-job figures and each flag's reason, the one wording both reports use."""

from __future__ import annotations

import math

import attrs
import pytest

from otel_ofu import names
from otel_ofu_collector.report.reasons import flags_of, fleet_flags, reasons_of
from otel_ofu_collector.report.summary import (
    MIN_FLEET_R_JOBS,
    MISCOUNT,
    REGRESSION,
    format_time,
    hours,
    percent,
    summarize,
)
from otel_ofu_collector.results import FleetReport, GroupReport, JobReport, WindowReport
from otel_ofu_collector.stats.comoments import CoMoments
from otel_ofu_collector.stats.exphist import ExpHistogram

S = 1_000_000_000
T0 = 1_800_000_000 * S
WINDOW = 60 * S


def _job(ofu: float | None, mfu: float | None, *, miscount: bool = False, regression: bool = False) -> JobReport:
    return JobReport(
        job_id="job-1",
        attributes={names.JOB_NAME: "trainer"},
        ofu=ofu,
        mfu=mfu,
        gap=None,
        correlation=0.8,
        flags={names.JOB_FLOPS_MISCOUNT.name: int(miscount), names.JOB_OFU_REGRESSION.name: int(regression)},
        status="ok",
        gpus=2,
    )


def _reports(jobs: list[JobReport]) -> list[WindowReport]:
    group = GroupReport({names.HW_MODEL: "H100"}, 2, {}, ExpHistogram(), 0.0, 0.0, 0.0)
    fleet = FleetReport(correlation=None, mae=None, jobs=0, comoments=CoMoments(), abs_diff_sum=0.0)
    return [WindowReport(T0 + i * WINDOW, T0 + (i + 1) * WINDOW, (group,), (job,), fleet) for i, job in enumerate(jobs)]


def test_miscount_is_sized_over_the_flagged_windows_not_the_whole_run() -> None:
    honest = [_job(0.40, 0.40)] * 10
    over = [_job(0.20, 0.60, miscount=True)] * 5
    (job,) = summarize(_reports(honest + over)).jobs
    assert job.miscount_ratio == pytest.approx(3.0)
    assert job.mfu_over_ofu == pytest.approx((10 * 0.40 + 5 * 0.60) / (10 * 0.40 + 5 * 0.20))  # the run's
    (flag,) = flags_of(job)
    assert (flag.kind, flag.windows, flag.first_ns, flag.active) == (MISCOUNT, 5, T0 + 10 * WINDOW, True)
    assert flag.reason == (
        f"suspected FLOP miscount: reported MFU 3.0x its OFU for 5 windows (from {format_time(T0 + 10 * WINDOW)})"
    )


def test_regression_baseline_is_the_median_of_the_unflagged_windows_before_it() -> None:
    # A one-window spike before the drop would move a mean; the median ignores it.
    before = [_job(0.40, None)] * 4 + [_job(0.95, None)]
    during = [_job(0.16, None, regression=True)] * 3
    after = [_job(0.41, None)]  # recovered: not part of the baseline, and the flag is no longer up
    (job,) = summarize(_reports(before + during + after)).jobs
    assert job.baseline_ofu == pytest.approx(0.40)
    assert job.regressed_ofu == pytest.approx(0.16)
    (flag,) = flags_of(job)
    assert (flag.kind, flag.windows, flag.active) == (REGRESSION, 3, False)
    assert flag.reason == (
        f"regression: OFU fell 2.5x below its own baseline from {format_time(T0 + 5 * WINDOW)} "
        "(40.0% -> 16.0%, 3 windows)"
    )


def test_regression_without_a_baseline_in_the_record_says_so() -> None:
    (job,) = summarize(_reports([_job(0.1, None, regression=True)] * 2)).jobs
    assert job.baseline_ofu is None
    assert reasons_of(job) == [
        f"regression: OFU fell below its own baseline from {format_time(T0)} (baseline not in this record)"
    ]


def test_regression_to_zero_has_no_factor() -> None:
    (job,) = summarize(_reports([_job(0.3, None), _job(0.0, None, regression=True)])).jobs
    (reason,) = reasons_of(job)
    assert reason.startswith("regression: OFU fell to zero from its baseline from ")
    assert "(30.0% -> 0.0%, 1 window)" in reason


def test_means_compare_like_with_like_and_missing_values_stay_absent() -> None:
    # MFU only in the last two windows: the job's OFU mean for the ratio covers those two only.
    jobs = [_job(0.10, None), _job(math.nan, None), _job(0.40, 0.36), _job(0.40, 0.44)]
    summary = summarize(_reports(jobs))
    (job,) = summary.jobs
    assert job.mean_ofu == pytest.approx(0.40)
    assert job.mean_mfu == pytest.approx(0.40)
    assert job.history[1].ofu is None  # NaN is a missing value, not a number
    assert (job.name, job.gpus, job.windows, job.flagged, reasons_of(job)) == ("trainer", 2, 4, False, [])
    (no_mfu,) = summarize(_reports(jobs[:2])).jobs
    assert no_mfu.mean_ofu == pytest.approx(0.10)  # no MFU at all: over every window with OFU
    assert (no_mfu.mean_mfu, no_mfu.mfu_over_ofu) == (None, None)


def test_fleet_orders_flags_miscount_first_and_reads_reports_in_any_order() -> None:
    reports = _reports([_job(0.4, 0.4), _job(0.1, 0.4, regression=True, miscount=True)])
    summary = summarize(list(reversed(reports)))
    assert (summary.windows, summary.start_ns, summary.end_ns, summary.gpus) == (2, T0, T0 + 2 * WINDOW, 2)
    assert [flag.kind for flag in fleet_flags(summary)] == [MISCOUNT, REGRESSION]
    assert (summary.peak_gpus, summary.last_width_ns, summary.fleet_jobs) == (2, WINDOW, 0)
    empty = summarize([])
    assert (empty.windows, empty.start_ns, empty.jobs, fleet_flags(empty)) == (0, None, (), [])
    assert (empty.gpus, empty.peak_gpus, empty.last_width_ns, empty.fleet_jobs) == (0, 0, None, 0)


def test_fleet_figures_are_the_last_windows_and_non_finite_ones_are_absent() -> None:
    reports = _reports([_job(0.4, 0.4), _job(0.3, 0.3)])
    defined = FleetReport(correlation=0.5, mae=0.02, jobs=7, comoments=CoMoments(), abs_diff_sum=0.14)
    undefined = FleetReport(correlation=math.nan, mae=math.nan, jobs=1, comoments=CoMoments(), abs_diff_sum=0.0)
    summary = summarize([attrs.evolve(reports[0], fleet=defined), attrs.evolve(reports[1], fleet=undefined)])
    assert (summary.correlation, summary.mae, summary.fleet_jobs) == (None, None, 1)
    summary = summarize([attrs.evolve(reports[0], fleet=undefined), attrs.evolve(reports[1], fleet=defined)])
    assert (summary.correlation, summary.mae, summary.fleet_jobs) == (0.5, 0.02, 7)


def test_numbers_are_written_one_way() -> None:
    assert percent(0.448) == "44.8%"
    assert percent(1.0) == "100.0%"
    assert percent(0.0) == "0.0%"
    # An idle GPU's measured 0.00059% is not a zero: it reads "<0.1%" (it read "0.00059%" in one table
    # and "0.0%" in another); a rounding to -0 reads 0.
    assert percent(0.0000059) == "<0.1%"
    assert percent(0.0005) == "0.1%"  # the smallest value written as a number
    assert percent(-0.0001) == "0.0%"
    assert percent(None) == "-"
    assert hours(7956) == "2.21 GPU-h"  # 7956 s / 3600 = 2.21
    assert hours(200) == "0.056 GPU-h"  # 0.0556: two significant digits under 0.1


def test_the_fleet_r_is_a_finding_only_over_enough_jobs() -> None:
    from otel_ofu_collector.report.terminal import fleet_lines

    reports = _reports([_job(0.4, 0.38)])
    few = attrs.evolve(reports[0], fleet=attrs.evolve(reports[0].fleet, correlation=0.99, jobs=MIN_FLEET_R_JOBS - 1))
    enough = attrs.evolve(few, fleet=attrs.evolve(few.fleet, jobs=MIN_FLEET_R_JOBS))
    assert MIN_FLEET_R_JOBS == 4
    assert summarize([few]).correlation == 0.99  # the figure is kept, but 3 jobs are too few to show it
    assert fleet_lines(summarize([few]))[2] == (
        "Fleet r(OFU, MFU): not enough jobs (3 with both; it needs 4 or more). Mean absolute error -."
    )
    assert fleet_lines(summarize([enough]))[2] == "Fleet r(OFU, MFU) = 0.99 over 4 jobs, mean absolute error -."
