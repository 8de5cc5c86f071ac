"""Job flags behind the Detector protocol: found in the folder, in the vocabulary's order, and a verdict
of "not assessable" left out of every output instead of written as 0."""

from __future__ import annotations

import attrs

from otel_ofu import names
from otel_ofu_collector.aggregation.windows import Aggregator
from otel_ofu_collector.config import AggregatorConfig
from otel_ofu_collector.detectors import (
    DETECTORS,
    GPU_DETECTORS,
    NOT_ASSESSABLE,
    Detector,
    GpuDetector,
    JobWindowValues,
)
from otel_ofu_collector.otlp.encode import reports_to_metrics_data
from otel_ofu_collector.outputs.prometheus import OutputsCollector
from otel_ofu_collector.outputs.record_codec import report_from_line, report_to_line
from otel_ofu_collector.report.reasons import flags_of
from otel_ofu_collector.report.summary import summarize
from otel_ofu_collector.results import FleetReport, JobReport, WindowReport, gauge_points
from otel_ofu_collector.stats.comoments import CoMoments

S = 1_000_000_000


def test_every_flag_module_is_found_in_the_order_of_the_vocabulary() -> None:
    assert [d.metric for d in DETECTORS] == [
        names.JOB_FLOPS_MISCOUNT,
        names.JOB_OFU_REGRESSION,
        names.JOB_GPUS_IDLE,
        names.JOB_HANG,
    ]
    assert [d.record_key for d in DETECTORS] == ["flops_miscount", "regression", "gpus_idle", "hang"]
    assert [d.metric for d in GPU_DETECTORS] == [names.GPU_STRAGGLER]
    every: tuple[Detector | GpuDetector, ...] = (*DETECTORS, *GPU_DETECTORS)
    assert len({d.kind for d in every}) == len(every)


def test_the_windows_run_every_detector_for_every_job() -> None:
    aggregator = Aggregator(AggregatorConfig(window_s=60, lateness_s=0))
    aggregator.add_ofu("gpu-0", 0.4, 20 * S, 30 * S, {names.JOB_ID: "job-1"})
    (report,) = aggregator.flush(60 * S)
    (job,) = report.jobs
    # No MFU reported, no baseline yet: those two cannot be assessed (absent, not 0); its one GPU works.
    assert job.flags == {
        names.JOB_FLOPS_MISCOUNT.name: None,
        names.JOB_OFU_REGRESSION.name: None,
        names.JOB_GPUS_IDLE.name: 0,
        names.JOB_HANG.name: 0,  # its tensor pipes at work: judged moving
    }


def test_a_job_that_never_reported_mfu_has_no_miscount_value_and_one_without_a_baseline_no_regression() -> None:
    aggregator = Aggregator(AggregatorConfig(window_s=60, lateness_s=0, flag_settings={"baseline_windows": 4}))
    reports = []
    for window in range(4):
        start = window * 60 * S
        aggregator.add_ofu("gpu-0", 0.4, start + 20 * S, start + 30 * S, {names.JOB_ID: "job-1"})
        if window >= 1:
            aggregator.add_mfu("job-1", 0.41, start + 30 * S, {names.JOB_ID: "job-1"})
        reports += aggregator.flush(start + 60 * S)
    flags = [(r.jobs[0].flops_miscount, r.jobs[0].regression) for r in reports]
    # MFU from the second window on; the baseline needs 2 windows (half of 4) before it judges.
    assert flags == [(None, None), (0, None), (0, 0), (0, 0)]


def test_a_fresh_flag_state_per_job_judges_only_what_it_is_given() -> None:
    miscount = next(d for d in DETECTORS if d.metric == names.JOB_FLOPS_MISCOUNT)
    flag = miscount.start(AggregatorConfig(flag_settings={"miscount_ratio": 1.5, "miscount_windows": 2}))
    over = JobWindowValues(0, 60 * S, ofu=0.2, mfu=0.5, gpus=1)
    assert [flag.assess(over), flag.assess(over)] == [0, 1]
    # A window without MFU neither extends nor breaks the run: the flag keeps its value.
    assert flag.assess(JobWindowValues(60 * S, 120 * S, ofu=0.2, mfu=None, gpus=1)) == 1


def _window(flags: dict[str, int | None]) -> WindowReport:
    job = JobReport(
        job_id="job-1",
        attributes={},
        ofu=0.4,
        mfu=None,
        gap=None,
        correlation=None,
        flags=flags,
        status="no_mfu",
        gpus=1,
    )
    fleet = FleetReport(correlation=None, mae=None, jobs=0, comoments=CoMoments(), abs_diff_sum=0.0)
    return WindowReport(0, 60 * S, (), (job,), fleet)


def test_a_flag_that_cannot_be_assessed_is_absent_from_every_output() -> None:
    report = _window(
        {
            names.JOB_FLOPS_MISCOUNT.name: NOT_ASSESSABLE,
            names.JOB_OFU_REGRESSION.name: 1,
            names.JOB_GPUS_IDLE.name: NOT_ASSESSABLE,
            names.JOB_HANG.name: NOT_ASSESSABLE,
        }
    )
    shown = {point.spec for point in gauge_points(report)}
    assert names.JOB_FLOPS_MISCOUNT not in shown
    assert names.JOB_OFU_REGRESSION in shown
    metrics = {
        metric.name
        for rm in reports_to_metrics_data([report], resource_attributes={}, include_partials=False).resource_metrics
        for sm in rm.scope_metrics
        for metric in sm.metrics
    }
    assert names.JOB_FLOPS_MISCOUNT.name not in metrics
    assert names.JOB_OFU_REGRESSION.name in metrics
    prometheus = OutputsCollector()
    prometheus.consume_windows([report])
    assert {family.name for family in prometheus.collect()} == {"job_ofu", "job_ofu_regression", "job_gpus"}
    line = report_to_line(report)
    assert '"flops_miscount":null' in line
    assert report_from_line(line) == report
    (job,) = summarize([report]).jobs
    assert [flag.kind for flag in flags_of(job)] == ["regression"]


def test_the_flag_properties_read_the_flags_by_their_metric() -> None:
    report = _window({names.JOB_FLOPS_MISCOUNT.name: 1, names.JOB_OFU_REGRESSION.name: 0})
    (job,) = report.jobs
    assert (job.flops_miscount, job.regression) == (1, 0)
    assert attrs.evolve(job, flags={}).regression is None
