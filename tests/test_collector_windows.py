"""Windows, correlation and flags, driven by explicit flush times (never by sleeping)."""

from __future__ import annotations

import random
from collections.abc import Mapping

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from otel_ofu import names
from otel_ofu_collector.aggregation.windows import Aggregator
from otel_ofu_collector.config import AggregatorConfig
from otel_ofu_collector.results import STATUS_NO_MFU, STATUS_NO_OFU, STATUS_OK, JobReport, WindowReport

S = 1_000_000_000
W = 60 * S
T0 = 28_333_334 * W  # a window boundary in 2023


def ident(
    job: str | None = None,
    *,
    model: str | None = "NVIDIA H100 80GB HBM3",
    precision: str | None = "bf16",
    host: str = "h1",
    name: str | None = None,
) -> dict[str, str]:
    out = {names.HOST_NAME: host}
    for key, value in ((names.JOB_ID, job), (names.HW_MODEL, model), (names.GPU_PRECISION, precision)):
        if value is not None:
            out[key] = value
    if name is not None:
        out[names.JOB_NAME] = name
    return out


def at(window: int, second: float = 30.0) -> int:
    return T0 + window * W + int(second * S)


def close(agg: Aggregator, window: int) -> list[WindowReport]:
    """Flush just far enough to close window ``window`` (and those before it)."""
    return agg.flush(T0 + (window + 1) * W + agg.config.lateness_ns)


def job_of(report: WindowReport, job_id: str) -> JobReport:
    return next(job for job in report.jobs if job.job_id == job_id)


def test_window_bounds_are_aligned_and_closed_on_the_right() -> None:
    agg = Aggregator(AggregatorConfig())
    assert agg.add_ofu("g1", 0.4, at(0, 50), at(0, 60), ident()) is None  # end exactly on the boundary: window 0
    assert agg.add_ofu("g2", 0.6, at(1, 0), at(1, 0) + 1, ident()) is None  # one ns past it: window 1
    first, second = close(agg, 1)
    assert (first.start_ns, first.end_ns) == (T0, T0 + W)
    assert (second.start_ns, second.end_ns) == (T0 + W, T0 + 2 * W)
    assert first.groups[0].ofu_sum == pytest.approx(0.4)
    assert second.groups[0].ofu_sum == pytest.approx(0.6)


def test_a_gpu_counts_once_time_weighted() -> None:
    agg = Aggregator(AggregatorConfig())
    agg.add_ofu("g1", 0.2, at(0, 0), at(0, 10), ident())
    agg.add_ofu("g1", 0.6, at(0, 10), at(0, 40), ident())
    # an interval that began in the window before weighs here only with its part inside this window (10 s);
    # its first 30 s go to the window before
    agg.add_ofu("g2", 0.9, at(0, -30), at(0, 10), ident())
    agg.add_ofu("g2", 0.1, at(0, 10), at(0, 40), ident())
    # instantaneous points at one time weigh the same (a plain mean) and cover no time: a stream's first point
    # without an interval marks its start, and the others are at the same time
    for value in (0.1, 0.2, 0.6):
        agg.add_ofu("g3", value, at(0, 20), at(0, 20), ident())
    before, report = close(agg, 0)
    (earlier,) = before.groups
    assert earlier.gpus == pytest.approx(0.5)  # g2's first 30 s of the window before: half a GPU on average
    assert earlier.ofu_sum == pytest.approx(0.9)  # g2's first 30 s
    (group,) = report.groups
    # g1 40 s, g2 40 s, g3 none: 80 GPU-s over a 60 s window
    assert group.gpus == pytest.approx(80 / 60)
    assert group.histogram.count == 3
    assert sorted([group.ofu_min, group.ofu_max]) == pytest.approx([0.3, 0.5])
    assert group.ofu_sum == pytest.approx(0.5 + 0.3 + 0.3)
    # Over capacity: g2 0.3 and g1 0.5 for 40 GPU-s each; half of it is reached at 0.3.
    assert group.quantiles[0.5] == pytest.approx(0.3)


def test_late_points_are_counted_not_mixed_in() -> None:
    config = AggregatorConfig(lateness_s=15.0)
    agg = Aggregator(config)
    agg.add_ofu("g1", 0.5, at(0, 0), at(0, 30), ident())
    assert agg.flush(T0 + W + 10 * S) == []  # within the lateness: window 0 still open
    assert agg.add_ofu("g2", 0.7, at(0, 20), at(0, 50), ident()) is None
    (first,) = agg.flush(T0 + W + 15 * S)
    assert first.groups[0].gpus == pytest.approx(1.0)  # two GPUs for 30 s each of a 60 s window
    assert agg.add_ofu("g3", 0.1, at(0, 20), at(0, 50), ident()) is not None  # window 0 closed
    assert agg.add_mfu("j", 0.1, at(0, 50), ident("j")) is not None
    assert agg.add_ofu("g1", 0.5, at(1, 0), at(1, 30), ident()) is None
    (second,) = close(agg, 1)
    assert second.groups[0].gpus == pytest.approx(0.5)
    assert second.groups[0].ofu_min == 0.5
    assert agg.stats.late_points == 2
    assert agg.stats.points_ofu == 3
    assert agg.stats.windows_closed == 2


def test_groups_by_configured_keys_with_unknown_for_missing() -> None:
    agg = Aggregator(AggregatorConfig())
    agg.add_ofu("a", 0.5, at(0, 0), at(0, 60), ident(model="A100", precision="bf16"))
    agg.add_ofu("b", 0.4, at(0, 0), at(0, 60), ident(model="A100", precision="bf16"))
    agg.add_ofu("c", 0.3, at(0, 0), at(0, 60), ident(model="H100", precision="fp8"))
    agg.add_ofu("d", 0.2, at(0, 0), at(0, 60), ident(model="H100", precision=None))
    (report,) = close(agg, 0)
    found = {(g.attributes[names.HW_MODEL], g.attributes[names.GPU_PRECISION]): g.gpus for g in report.groups}
    assert found == {("A100", "bf16"): 2, ("H100", "fp8"): 1, ("H100", "unknown"): 1}

    by_host = Aggregator(AggregatorConfig(group_keys=(names.HOST_NAME,)))
    by_host.add_ofu("a", 0.5, at(0, 0), at(0, 30), ident(host="x"))
    by_host.add_ofu("b", 0.5, at(0, 0), at(0, 30), ident(host="y"))
    (report,) = close(by_host, 0)
    assert [dict(g.attributes) for g in report.groups] == [{names.HOST_NAME: "x"}, {names.HOST_NAME: "y"}]


def test_group_quantiles_are_exact_and_match_the_histogram() -> None:
    rng = random.Random(3)
    values = [rng.choice([0.0, rng.uniform(0.2, 0.7)]) for _ in range(500)]
    seconds = [rng.choice([10, 30, 60]) for _ in values]  # GPUs there for part of the window weigh less
    agg = Aggregator(AggregatorConfig())
    for i, (value, covered) in enumerate(zip(values, seconds, strict=True)):
        agg.add_ofu(f"g{i}", value, at(0, 60 - covered), at(0, 60), ident())
    (report,) = close(agg, 0)
    (group,) = report.groups
    for q in names.QUANTILES:  # over capacity: numpy's weighted quantile of the values by their GPU-seconds
        expected = float(np.quantile(values, q, weights=seconds, method="inverted_cdf"))
        assert group.quantiles[q] == expected
        estimate = group.histogram.quantile(q)
        assert estimate is not None
    assert group.histogram.count == 500
    assert group.gpus == pytest.approx(sum(seconds) / 60)
    assert group.histogram.zero_count == values.count(0.0)


def test_stream_and_job_caps_are_counted() -> None:
    agg = Aggregator(AggregatorConfig(max_streams=2, max_jobs=1))
    assert agg.add_ofu("a", 0.5, at(0, 0), at(0, 30), ident("j1")) is None
    # Over the job cap: refused (before, taken for the fleet and silently in no job's outputs), so the sender is
    # told, and the stream takes no place under max_streams.
    assert agg.add_ofu("b", 0.5, at(0, 0), at(0, 30), ident("j2")) == "max_jobs"
    assert agg.add_ofu("c", 0.5, at(0, 0), at(0, 30), ident("j1")) is None
    assert agg.add_ofu("d", 0.5, at(0, 0), at(0, 30), ident("j1")) == "max_streams"
    assert agg.add_ofu("a", 0.5, at(0, 30), at(0, 40), ident("j1")) is None  # known streams still flow
    assert agg.add_mfu("j3", 0.5, at(0, 30), ident("j3")) == "max_jobs"
    assert agg.add_mfu("j1", 0.5, at(0, 30), ident("j1")) is None
    (report,) = close(agg, 0)
    assert report.groups[0].gpus == pytest.approx(70 / 60)  # a for 30 + 10 s, c for 30 s
    assert [job.job_id for job in report.jobs] == ["j1"]
    stats = agg.stats
    assert (stats.rejected_stream_cap, stats.rejected_job_cap) == (1, 2)


def test_stale_streams_and_jobs_are_evicted_by_event_time() -> None:
    config = AggregatorConfig(window_s=60, lateness_s=0, stale_after_s=120, horizon_s=600)
    agg = Aggregator(config)
    agg.add_ofu("gone", 0.5, at(0, 0), at(0, 30), ident("old"))
    for window in range(6):
        agg.add_ofu("alive", 0.5, at(window, 0), at(window, 30), ident("new"))
        agg.add_mfu("new", 0.5, at(window, 30), ident("new"))
        close(agg, window)
    assert agg.streams == 1
    assert agg.stats.evicted_streams == 1
    assert agg.stats.evicted_jobs == 1
    assert agg.jobs == 1  # "old" had no (OFU, MFU) pair, so nothing of it lingers


def test_evicted_job_still_counts_for_the_fleet_within_the_horizon() -> None:
    config = AggregatorConfig(window_s=60, lateness_s=0, stale_after_s=120, horizon_s=600)
    agg = Aggregator(config)
    agg.add_ofu("a", 0.5, at(0, 0), at(0, 30), ident("done"))
    agg.add_mfu("done", 0.6, at(0, 30), ident("done"))
    fleet_jobs = []
    for window in range(12):
        agg.add_ofu("b", 0.4, at(window, 0), at(window, 30), ident("running"))
        agg.add_mfu("running", 0.4, at(window, 30), ident("running"))
        (report,) = close(agg, window)
        fleet_jobs.append(report.fleet.jobs)
    assert agg.stats.evicted_jobs == 1
    assert fleet_jobs == [2] * 10 + [1] * 2  # "done" leaves with its last pair, ten windows on


def test_miscount_flag_after_exactly_n_consecutive_windows() -> None:
    agg = Aggregator(AggregatorConfig(flag_settings={"miscount_ratio": 1.5, "miscount_windows": 3}))
    moe, healthy = [], []
    for window in range(8):
        over_counting = window < 6
        agg.add_ofu("m", 0.3, at(window, 0), at(window, 30), ident("moe"))
        agg.add_mfu("moe", 0.6 if over_counting else 0.31, at(window, 30), ident("moe"))
        agg.add_ofu("h", 0.4, at(window, 0), at(window, 30), ident("dense"))
        agg.add_mfu("dense", 0.44, at(window, 30), ident("dense"))
        (report,) = close(agg, window)
        moe.append(job_of(report, "moe").flops_miscount)
        healthy.append(job_of(report, "dense").flops_miscount)
    assert moe == [0, 0, 1, 1, 1, 1, 0, 0]
    assert healthy == [0] * 8


def test_windows_without_mfu_neither_extend_nor_break_the_run() -> None:
    agg = Aggregator(AggregatorConfig(flag_settings={"miscount_windows": 3}))
    flags = []
    for window, mfu in enumerate([0.6, 0.6, None, 0.6]):
        agg.add_ofu("m", 0.3, at(window, 0), at(window, 30), ident("moe"))
        if mfu is not None:
            agg.add_mfu("moe", mfu, at(window, 30), ident("moe"))
        (report,) = close(agg, window)
        flags.append(job_of(report, "moe").flops_miscount)
    assert flags == [0, 0, 0, 1]


def test_regression_flagged_for_a_2_5x_drop_and_never_for_a_healthy_job() -> None:
    rng = random.Random(11)
    agg = Aggregator(AggregatorConfig(flag_settings={"regression_factor": 2.0, "baseline_windows": 10}))
    regressing, healthy = [], []
    for window in range(30):
        ofu = 0.5 if window < 15 else 0.2
        agg.add_ofu("r", ofu, at(window, 0), at(window, 30), ident("reg"))
        agg.add_ofu("h", 0.45 * rng.uniform(0.85, 1.15), at(window, 0), at(window, 30), ident("ok"))
        (report,) = close(agg, window)
        regressing.append(job_of(report, "reg").regression)
        healthy.append(job_of(report, "ok").regression)
    # Not assessable (absent) until the baseline holds 5 windows; flagged windows stay out of the baseline.
    assert regressing == [None] * 5 + [0] * 10 + [1] * 15
    assert healthy == [None] * 5 + [0] * 25


def test_regression_needs_a_baseline_first() -> None:
    agg = Aggregator(AggregatorConfig(flag_settings={"baseline_windows": 10}))  # at least 5 windows of baseline
    flags = []
    for window, ofu in enumerate([0.5, 0.5, 0.5, 0.5, 0.1, 0.5, 0.1]):
        agg.add_ofu("r", ofu, at(window, 0), at(window, 30), ident("reg"))
        (report,) = close(agg, window)
        flags.append(job_of(report, "reg").regression)
    # window 4 has only 4 windows behind it; by window 6 the baseline holds 6 (median 0.5)
    assert flags == [None, None, None, None, None, 0, 1]


def test_an_idle_job_near_zero_is_never_a_regression() -> None:
    rng = random.Random(3)
    agg = Aggregator(AggregatorConfig(flag_settings={"regression_min_baseline": 0.05}))
    flags = []
    for window in range(30):
        # An allocated GPU with nothing running: OFU is noise around 0.2%, often halving. All its GPUs idle every
        # window: an idle allocation (job.gpus.idle), never assessed as a regression.
        agg.add_ofu("idle", 0.002 * rng.uniform(0.0, 2.0), at(window, 0), at(window, 30), ident("idle"))
        (report,) = close(agg, window)
        flags.append(job_of(report, "idle").regression)
    assert flags == [None] * 30


def test_a_job_whose_gpus_all_go_idle_is_an_idle_allocation_not_a_regression() -> None:
    # Ten windows at OFU 0.4 (the baseline), then the job finishes but keeps its GPUs: OFU 0.001, tensor pipes
    # idle. Before, the regression flag rose at the first idle window (0.001 < 0.4 / 2); the idle count rises
    # after --idle-windows (3).
    agg = Aggregator(AggregatorConfig(flag_settings={"idle_windows": 3}))
    regression, idle = [], []
    for window in range(14):
        ofu = 0.4 if window < 10 else 0.001
        for gpu in ("a", "b"):
            agg.add_ofu(gpu, ofu, at(window, 0), at(window, 30), ident("j", host=gpu))
        (report,) = close(agg, window)
        job = job_of(report, "j")
        regression.append(job.regression)
        idle.append(job.flag(names.JOB_GPUS_IDLE))
    assert regression[5:] == [0] * 9  # assessed from the baseline on, and never up
    assert idle[10:] == [0, 0, 2, 2]


def test_jobs_with_one_side_missing_are_reported() -> None:
    agg = Aggregator(AggregatorConfig())
    agg.add_ofu("a", 0.4, at(0, 0), at(0, 30), ident("ofu-only", name="train"))
    agg.add_mfu("mfu-only", 0.5, at(0, 30), {names.JOB_ID: "mfu-only", names.JOB_NAME: "eval"})
    agg.add_ofu("b", 0.3, at(0, 0), at(0, 30), ident("both"))
    agg.add_ofu("c", 0.5, at(0, 0), at(0, 30), ident("both", host="h2"))
    agg.add_mfu("both", 0.5, at(0, 10), ident("both"))
    agg.add_mfu("both", 0.3, at(0, 20), ident("both"))
    (report,) = close(agg, 0)
    only_ofu = job_of(report, "ofu-only")
    assert (only_ofu.status, only_ofu.ofu, only_ofu.mfu, only_ofu.gap, only_ofu.gpus) == (
        STATUS_NO_MFU,
        0.4,
        None,
        None,
        0.5,  # one GPU for 30 s of the window: half a GPU on average
    )
    assert only_ofu.attributes[names.JOB_NAME] == "train"
    assert only_ofu.attributes[names.HW_MODEL] == "NVIDIA H100 80GB HBM3"
    only_mfu = job_of(report, "mfu-only")
    assert (only_mfu.status, only_mfu.ofu, only_mfu.mfu, only_mfu.gap, only_mfu.gpus) == (
        STATUS_NO_OFU,
        None,
        0.5,
        None,
        0,
    )
    assert dict(only_mfu.attributes) == {names.JOB_NAME: "eval"}
    both = job_of(report, "both")
    assert both.status == STATUS_OK
    assert both.gpus == 1  # two GPUs for 30 s each of a 60 s window
    assert both.ofu == pytest.approx(0.4)
    assert both.mfu == pytest.approx(0.4)
    assert both.gap == pytest.approx(0.0)


def test_job_correlation_over_the_rolling_horizon() -> None:
    config = AggregatorConfig(horizon_s=300)  # five windows
    agg = Aggregator(config)
    rng = random.Random(5)
    series: list[tuple[float, float]] = []
    correlations = []
    for window in range(12):
        ofu = rng.uniform(0.2, 0.6)
        mfu = ofu * 0.9 + rng.uniform(-0.05, 0.05)
        series.append((ofu, mfu))
        agg.add_ofu("g", ofu, at(window, 0), at(window, 30), ident("j"))
        agg.add_mfu("j", mfu, at(window, 30), ident("j"))
        (report,) = close(agg, window)
        correlations.append(job_of(report, "j").correlation)
    assert correlations[0] is None  # one pair
    for window in range(1, 12):
        recent = np.array(series[max(0, window - 4) : window + 1])
        expected = float(np.corrcoef(recent[:, 0], recent[:, 1])[0, 1])
        assert correlations[window] == pytest.approx(expected, abs=1e-9)


def test_fleet_correlation_and_mae_across_jobs() -> None:
    agg = Aggregator(AggregatorConfig())
    jobs = {"a": (0.2, 0.25), "b": (0.4, 0.38), "c": (0.5, 0.9), "d": (0.3, 0.33)}
    for window in range(3):
        for job_id, (ofu, mfu) in jobs.items():
            agg.add_ofu(f"gpu-{job_id}", ofu + 0.01 * window, at(window, 0), at(window, 30), ident(job_id))
            agg.add_mfu(job_id, mfu + 0.02 * window, at(window, 30), ident(job_id))
        (report,) = close(agg, window)
    means_ofu = np.array([ofu + 0.01 for ofu, _ in jobs.values()])  # mean over the three windows
    means_mfu = np.array([mfu + 0.02 for _, mfu in jobs.values()])
    assert report.fleet.jobs == 4
    assert report.fleet.correlation == pytest.approx(float(np.corrcoef(means_ofu, means_mfu)[0, 1]), abs=1e-9)
    assert report.fleet.mae == pytest.approx(float(np.mean(np.abs(means_ofu - means_mfu))), abs=1e-12)
    assert report.fleet.abs_diff_sum == pytest.approx(float(np.sum(np.abs(means_ofu - means_mfu))), abs=1e-12)


def test_fleet_windows_without_data_are_reported_while_the_horizon_has_pairs() -> None:
    # The data's staleness (120 s after the last point at 30 s: windows ending before 150 s) would report windows
    # 0 and 1; the horizon's (OFU, MFU) pair of window 0 keeps the fleet state alive through window 2 (180 s).
    agg = Aggregator(AggregatorConfig(horizon_s=180, lateness_s=0, stale_after_s=120))
    agg.add_ofu("g", 0.5, at(0, 0), at(0, 30), ident("j"))
    agg.add_mfu("j", 0.5, at(0, 30), ident("j"))
    reports = agg.flush(T0 + 10 * W)
    assert [(r.start_ns - T0) // W for r in reports] == [0, 1, 2]
    assert [r.fleet.jobs for r in reports] == [1, 1, 1]
    assert reports[1].groups == ()
    assert reports[1].jobs == ()
    assert agg.flush(T0 + 20 * W) == []


def test_a_quiet_fleet_reads_as_empty_windows_until_its_state_goes_stale() -> None:
    # No MFU, so no horizon pairs: the last point ends at 30 s, streams go stale 180 s later, so the windows ending
    # at 60, 120 and 180 s are reported (1 and 2 without GPUs: the fleet went quiet) and then nothing.
    agg = Aggregator(AggregatorConfig(lateness_s=0, stale_after_s=180))
    agg.add_ofu("g", 0.5, at(0, 0), at(0, 30), ident("j"))
    reports = agg.flush(T0 + 10 * W)
    assert [(r.start_ns - T0) // W for r in reports] == [0, 1, 2]
    assert [len(r.groups) for r in reports] == [1, 0, 0]
    assert agg.flush(T0 + 20 * W) == []


def test_close_all_closes_every_open_window() -> None:
    agg = Aggregator(AggregatorConfig())
    agg.add_ofu("g", 0.5, at(0, 0), at(0, 30), ident())
    agg.add_ofu("g", 0.5, at(3, 0), at(3, 30), ident())
    reports = agg.close_all()
    assert [(r.start_ns - T0) // W for r in reports] == [0, 1, 2, 3]  # the empty ones between included
    assert agg.add_ofu("g", 0.5, at(3, 0), at(3, 40), ident()) is not None  # closed for good
    assert agg.close_all() == []


def test_watermark_is_the_latest_event_time() -> None:
    agg = Aggregator(AggregatorConfig())
    agg.add_ofu("g", 0.5, at(2, 0), at(2, 30), ident())
    agg.add_ofu("g", 0.5, at(0, 0), at(0, 30), ident())
    agg.add_mfu("j", 0.5, at(1, 0), ident("j"))
    assert agg.watermark_ns == at(2, 30)


def test_a_gpu_moving_between_jobs_counts_once_split_by_time() -> None:
    agg = Aggregator(AggregatorConfig())
    agg.add_ofu("g", 0.2, at(0, 0), at(0, 30), ident("first"))
    agg.add_ofu("g", 0.6, at(0, 30), at(0, 60), ident("second"))
    (report,) = close(agg, 0)
    # Half the window in each job: half a GPU each, one GPU in the fleet.
    assert [(job.job_id, job.ofu, job.gpus) for job in report.jobs] == [("first", 0.2, 0.5), ("second", 0.6, 0.5)]
    assert report.groups[0].gpus == 1


def test_config_is_validated() -> None:
    with pytest.raises(ValueError, match="window_s"):
        AggregatorConfig(window_s=0)
    with pytest.raises(ValueError, match="stale_after_s"):
        AggregatorConfig(window_s=60, lateness_s=15, stale_after_s=70)
    with pytest.raises(ValueError, match="miscount_windows"):
        AggregatorConfig(flag_settings={"miscount_windows": 0})
    with pytest.raises(ValueError, match="group_keys"):
        AggregatorConfig(group_keys=(names.QUANTILE,))
    with pytest.raises(ValueError, match="horizon_s"):
        AggregatorConfig(horizon_s=10)


point = st.tuples(
    st.integers(min_value=0, max_value=5),  # stream
    st.floats(min_value=0.0, max_value=1.0, allow_nan=False),  # value
    st.integers(min_value=0, max_value=4 * W - 1),  # end offset
    st.integers(min_value=0, max_value=90 * S),  # duration
)


def _split(start: int, end: int, closed: set[int] | None = None) -> dict[int, tuple[int, int, int]]:
    """The model the windows follow, worked out by hand: an interval (start, end] weighs in every window (w, w + W]
    it overlaps with its overlap, given as (weight, low, high) with (low, high] the part inside the window (a point
    without duration, start == end, weighs 1 ns in its own window and covers nothing); the part of a window already
    closed goes to the first open window the interval overlaps, as weight outside the window's span."""
    end_window = (end - 1) // W * W
    if start >= end:
        return {end_window: (1, end, end)}
    closed = closed or set()
    parts: dict[int, tuple[int, int, int]] = {}
    carried = 0
    for window in range(start // W * W, end_window + 1, W):
        low, high = max(start, window), min(end, window + W)
        if window in closed:
            carried += high - low
        else:
            parts[window] = (high - low + carried, low, high)
            carried = 0
    return parts


def _covered(spans: list[tuple[int, int]]) -> int:
    """The ns a set of (low, high] spans covers, each once."""
    covered, reach = 0, None
    for low, high in sorted(spans):
        if reach is None or low > reach:
            covered += high - low
            reach = high
        elif high > reach:
            covered += high - reach
            reach = high
    return covered


def test_an_interval_over_a_boundary_weighs_in_both_windows() -> None:
    # A producer 0.75 s off 4 s windows, 1 s intervals: the point (3.75, 4.75] is 0.25 s in window 0 and 0.75 s in
    # window 1, so each fully covered window holds 4 GPU-s, not 3.75.
    config = AggregatorConfig(window_s=4, lateness_s=2, horizon_s=60, stale_after_s=60)
    agg = Aggregator(config)
    for tick in range(1, 13):  # intervals (k - 0.25, k + 0.75] for k = 1..12: (0.75, 1.75] ... (11.75, 12.75]
        end = T0 + tick * S + 3 * S // 4
        assert agg.add_ofu("g", 0.5, end - S, end, ident("j")) is None
    reports = agg.close_all()
    seconds = {(r.start_ns - T0) // S: r.jobs[0].loss.gpu_time_s for r in reports if r.jobs and r.jobs[0].loss}
    # window (0, 4]: 0.75..4 = 3.25 s; (4, 8] and (8, 12]: 4 s each; (12, 16]: 12..12.75 = 0.75 s
    assert seconds == {0: pytest.approx(3.25), 4: pytest.approx(4.0), 8: pytest.approx(4.0), 12: pytest.approx(0.75)}
    assert sum(seconds.values()) == pytest.approx(12.0)  # the wall time reported: 12 intervals of 1 s


@settings(max_examples=60, deadline=None)
@given(st.lists(point, max_size=60), st.lists(st.integers(min_value=0, max_value=6 * W), max_size=4))
def test_every_point_is_split_over_the_windows_it_overlaps_or_is_late(
    points: list[tuple[int, float, int, int]], flushes: list[int]
) -> None:
    lateness = 10 * S
    agg = Aggregator(AggregatorConfig(lateness_s=10))
    flush_times = sorted(flushes)
    flushed: int | None = None
    reports: list[WindowReport] = []
    expected: dict[int, dict[int, list[tuple[float, int]]]] = {}
    spans: dict[int, dict[int, list[tuple[int, int]]]] = {}  # by window, by stream: what its points cover
    carried_in: dict[int, dict[int, int]] = {}  # by window, by stream: ns carried in from closed windows
    last_seen: dict[int, int] = {}  # by stream: the latest end taken
    inferred: dict[int, tuple[int, int]] = {}  # by stream: the latest (end, start) given a point without interval
    late = 0
    for index, (stream, value, end, duration) in enumerate(points):
        while flush_times and flush_times[0] <= index * W // 10:
            now = T0 + flush_times.pop(0)
            flushed = now if flushed is None else max(flushed, now)
            reports += agg.flush(now)
        start_ns, end_ns = T0 + end - duration, T0 + end
        taken = agg.add_ofu(f"s{stream}", value, start_ns, end_ns, ident()) is None
        previous = last_seen.get(stream)
        if duration == 0:  # no interval: the time since the stream's previous point, the same for every point of it
            if inferred.get(stream, (None, 0))[0] == end_ns:
                start_ns = inferred[stream][1]
            else:
                if previous is not None and end_ns > previous:
                    start_ns = previous
                inferred[stream] = (end_ns, start_ns)
        closed = {
            window
            for window in range(start_ns // W * W, end_ns, W)
            if flushed is not None and window + W + lateness <= flushed
        }
        assert taken == ((end_ns - 1) // W * W not in closed)  # late exactly when the window of its end closed
        if not taken:
            late += 1
            continue
        extends = previous is None or end_ns > previous
        last_seen[stream] = end_ns if previous is None else max(previous, end_ns)
        for window, (weight, low, high) in _split(start_ns, end_ns, closed).items():
            expected.setdefault(window, {}).setdefault(stream, []).append((value, weight))
            spans.setdefault(window, {}).setdefault(stream, []).append((low, high))
            if extends:  # time of closed windows is carried only by a point that extends its stream
                carried = weight - (high - low) if high > low else 0
                carried_in.setdefault(window, {})[stream] = carried_in.get(window, {}).get(stream, 0) + carried
    reports += agg.close_all()
    assert agg.stats.late_points == late
    got = {r.start_ns: r for r in reports if r.groups}
    assert set(got) == set(expected)
    for window, streams in expected.items():
        (group,) = got[window].groups
        seconds = sum(_covered(spans[window][stream]) + carried_in.get(window, {}).get(stream, 0) for stream in streams)
        assert group.gpus == pytest.approx(seconds / W, abs=1e-12)  # GPU-seconds over the window's
        means = sorted(sum(v * w for v, w in pts) / sum(w for _, w in pts) for pts in streams.values())
        assert group.ofu_sum == pytest.approx(sum(means), abs=1e-9)
        assert group.ofu_min == pytest.approx(means[0], abs=1e-12)


def _healthy_identity(job: str) -> Mapping[str, str]:
    return ident(job)


def test_reports_are_deterministic_in_order() -> None:
    agg = Aggregator(AggregatorConfig())
    for job in ("z", "a", "m"):
        agg.add_ofu(f"g-{job}", 0.3, at(0, 0), at(0, 30), _healthy_identity(job))
    (report,) = close(agg, 0)
    assert [job.job_id for job in report.jobs] == ["a", "m", "z"]
