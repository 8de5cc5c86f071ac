"""``otel-ofu top``'s model and cells, without a terminal: every expected number worked by hand."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest

from otel_ofu import names
from otel_ofu.gpu_samples import ComputedSnapshot, GpuSample, PartialSample
from otel_ofu.gpu_values import GpuValues
from otel_ofu.model import GpuIdentity
from otel_ofu_collector.results import (
    FleetLoss,
    FleetReport,
    GpuFlagReport,
    GpuReport,
    GroupReport,
    JobLoss,
    JobReport,
    WindowReport,
)
from otel_ofu_collector.stats.comoments import CoMoments
from otel_ofu_collector.stats.exphist import ExpHistogram
from otel_ofu_collector.top import cells
from otel_ofu_collector.top.model import (
    HISTORY,
    NO_JOB,
    FleetModel,
    Sort,
    fleet_quantiles,
    ordered_causes,
    rows_of_snapshot,
)

S = 1_000_000_000
T = 1_800_000_000  # seconds: the newest window ends here
H100 = "NVIDIA H100 80GB HBM3"  # H100 SXM: tensor clock 1830 MHz in the catalog
MISCOUNT = names.JOB_FLOPS_MISCOUNT.name
REGRESSION = names.JOB_OFU_REGRESSION.name


def group(values: Sequence[float], model: str = H100) -> GroupReport:
    ordered = sorted(values)
    return GroupReport(
        attributes={names.HW_MODEL: model},
        gpus=len(values),
        quantiles={0.5: ordered[len(ordered) // 2], 0.95: ordered[-1]},
        histogram=ExpHistogram.from_values(values, max_buckets=1280),
        ofu_sum=sum(values),
        ofu_min=ordered[0],
        ofu_max=ordered[-1],
    )


def job(
    job_id: str,
    ofu: float | None,
    *,
    gpus: int = 8,
    name: str | None = None,
    mfu: float | None = None,
    flags: Mapping[str, int | None] | None = None,
    gpu_time_s: float = 480.0,
    lost_s: Mapping[str, float] | None = None,
    cost_lost: Mapping[str, float] | None = None,
) -> JobReport:
    loss = None
    if lost_s is not None:
        shares = {cause: seconds / gpu_time_s for cause, seconds in lost_s.items()}
        loss = JobLoss(gpu_time_s, shares, lost_s, cost_lost=cost_lost, currency="USD" if cost_lost else None)
    return JobReport(
        job_id=job_id,
        attributes={names.JOB_NAME: name} if name else {},
        ofu=ofu,
        mfu=mfu,
        gap=None,
        correlation=None,
        flags=flags or {MISCOUNT: 0, REGRESSION: None},
        status="ok",
        gpus=gpus,
        loss=loss,
    )


def window(
    end_s: int,
    jobs: Sequence[JobReport] = (),
    groups: Sequence[GroupReport] = (),
    fleet_loss: FleetLoss | None = None,
    gpu_flags: Sequence[GpuFlagReport] = (),
    gpus: Sequence[GpuReport] = (),
) -> WindowReport:
    fleet = FleetReport(None, None, 0, CoMoments(), 0.0, fleet_loss or FleetLoss())
    return WindowReport((end_s - 60) * S, end_s * S, tuple(groups), tuple(jobs), fleet, tuple(gpu_flags), tuple(gpus))


def straggler(job_id: str, hw_id: str, value: int = 1, reason: str | None = "power") -> GpuFlagReport:
    attributes = {names.HOST_NAME: "node-1", names.HW_ID: hw_id}
    if reason:
        attributes[names.GPU_THROTTLE_REASON] = reason
    return GpuFlagReport(names.GPU_STRAGGLER.name, job_id, attributes, value, ofu=0.2, job_median_ofu=0.4)


# --- the fleet line --------------------------------------------------------------------------------------


def test_the_fleet_line_sums_the_last_hour_and_reads_the_newest_window() -> None:
    model = FleetModel()
    model.add_windows(
        [
            # ended an hour before the newest: not "the last hour" (a window counts when it ends after T - 3600)
            window(T - 3600, fleet_loss=FleetLoss({"idle": 1000.0}, cost_lost={"idle": 9.0}, currency="USD")),
            window(
                T - 60, fleet_loss=FleetLoss({"idle": 60.0, "clock": 30.0}, cost_lost={"idle": 0.05}, currency="USD")
            ),
            window(
                T,
                jobs=[job("a", 0.4, flags={MISCOUNT: 1, REGRESSION: 1}), job("b", 0.3, flags={MISCOUNT: 0})],
                groups=[group([0.1, 0.3, 0.5])],
                fleet_loss=FleetLoss({"idle": 60.0, "tensor": 90.0}, cost_lost={"tensor": 0.25}, currency="USD"),
                gpu_flags=[straggler("b", "GPU-1"), straggler("b", "GPU-2", value=0)],
            ),
        ]
    )
    fleet = model.fleet()
    # lost: (60 + 30) + (60 + 90) = 240 GPU-s; cost 0.05 + 0.25 = 0.30; the window at T - 3600 is left out
    assert fleet.lost_gpu_s == pytest.approx(240.0)
    assert fleet.cost_lost == pytest.approx(0.30)
    assert fleet.currency == "USD"
    assert fleet.windows == 2
    # the newest window's group: 3 GPUs, its own p50 and p95
    assert (fleet.gpus, fleet.ofu_p50, fleet.ofu_p95) == (3, 0.3, 0.5)
    # flags up: job a's two, b's straggler GPU at 1 (the cleared one, at 0, is not up)
    assert fleet.flags_up == 3
    assert fleet.last_end_ns == T * S


def test_an_empty_model_has_a_fleet_line_with_nothing_known() -> None:
    fleet = FleetModel().fleet()
    assert (fleet.gpus, fleet.ofu_p50, fleet.lost_gpu_s, fleet.cost_lost, fleet.flags_up) == (0, None, None, None, 0)
    assert FleetModel().jobs() == []


def test_fleet_percentiles_of_several_groups_come_from_their_merged_histograms() -> None:
    # 3 H100s at 30% and 1 A100 at 50%, sorted 0.3 0.3 0.3 0.5; as the collector's: the smallest OFU at or below
    # which that share of the GPUs sat. p50: 2 of 4 are reached at 0.3; p95: 3.8 of 4 only at 0.5.
    p50, p95 = fleet_quantiles([group([0.3, 0.3, 0.3]), group([0.5], "NVIDIA A100-SXM4-80GB")])
    assert p50 == pytest.approx(0.30, rel=0.01)  # within the histogram's relative error (0.55% at 1280 buckets)
    assert p95 == pytest.approx(0.50, rel=0.01)
    assert fleet_quantiles([]) == (None, None)


# --- the job table ---------------------------------------------------------------------------------------


def hour_of_jobs() -> FleetModel:
    model = FleetModel()
    model.add_windows(
        [
            window(
                T - 120,
                jobs=[job("big", 0.45, lost_s={"tensor": 240.0}, cost_lost={"tensor": 0.20})],
            ),
            # "big" is missing from this window: its history has a hole there
            window(T - 60, jobs=[job("small", 0.20, gpus=2, gpu_time_s=120.0, lost_s={"idle": 96.0})]),
            window(
                T,
                jobs=[
                    # 8 GPUs x 60 s = 480 GPU-s; lost 48 clock + 240 tensor + 24 no_kernel (a cause the windows
                    # may carry later: shown all the same)
                    job(
                        "big",
                        0.40,
                        name="llama-70b",
                        mfu=0.38,
                        lost_s={"clock": 48.0, "tensor": 240.0, "no_kernel": 24.0},
                        cost_lost={"clock": 0.05, "tensor": 0.25, "no_kernel": 0.02},
                    ),
                    job(
                        "small",
                        0.10,
                        gpus=2,
                        name="notebook",
                        gpu_time_s=120.0,
                        lost_s={"idle": 96.0},
                        cost_lost={"idle": 0.80},
                        flags={MISCOUNT: None, names.JOB_GPUS_IDLE.name: 1},
                    ),
                    job("mid", 0.30, gpus=4, name="moe-16b", flags={MISCOUNT: 1}),
                ],
                gpu_flags=[straggler("big", "GPU-3")],
            ),
        ]
    )
    return model


def test_job_rows_sum_the_hour_and_sort_by_lost_cost() -> None:
    rows = hour_of_jobs().jobs(Sort.LOST)
    # lost cost over the hour: small 0.80; big 0.20 + (0.05 + 0.25 + 0.02) = 0.52; mid none (0)
    assert [row.job_id for row in rows] == ["small", "big", "mid"]
    small, big, mid = rows
    assert small.cost_lost == pytest.approx(0.80)
    assert big.cost_lost == pytest.approx(0.52)
    assert mid.cost_lost is None
    # big: GPU time 480 + 480 = 960 GPU-s; clock 48 / 960 = 5%, tensor (240 + 240) / 960 = 50%, no_kernel 2.5%
    assert dict(big.shares) == pytest.approx({"clock": 0.05, "tensor": 0.50, "no_kernel": 0.025})
    assert big.lost_gpu_s == pytest.approx(48 + 240 + 240 + 24)
    assert (big.ofu, big.mfu, big.gpus, big.name) == (0.40, 0.38, 8, "llama-70b")
    assert big.currency == "USD"
    # small: 96 + 96 idle over 120 + 120 GPU-s = 80%
    assert dict(small.shares) == pytest.approx({"idle": 0.80})
    # OFU of the last windows, oldest first; big was not in the middle one
    assert big.history == (0.45, None, 0.40)
    assert small.history == (None, 0.20, 0.10)
    # the flags up, in the vocabulary's order, the straggler GPU shown on its job
    assert big.flags == ("straggler",)
    assert small.flags == ("idle",)
    assert mid.flags == ("miscount",)


def test_the_other_sorts_and_the_text_filter() -> None:
    model = hour_of_jobs()
    assert [row.job_id for row in model.jobs(Sort.OFU)] == ["small", "mid", "big"]  # lowest OFU first
    assert [row.job_id for row in model.jobs(Sort.GPUS)] == ["big", "mid", "small"]
    assert [row.job_id for row in model.jobs(Sort.JOB)] == ["big", "mid", "small"]
    assert [row.job_id for row in model.jobs(Sort.LOST, "LLAMA")] == ["big"]  # by name, any case
    assert [row.job_id for row in model.jobs(Sort.LOST, "miscount")] == ["mid"]  # by flag
    assert [row.job_id for row in model.jobs(Sort.LOST, "sm")] == ["small"]  # by id
    assert model.jobs(Sort.LOST, "nothing like it") == []
    with pytest.raises(ValueError, match="unknown sort"):
        model.jobs("colour")


def test_without_prices_the_table_sorts_by_lost_gpu_time() -> None:
    model = FleetModel()
    model.add_windows(
        [window(T, jobs=[job("a", 0.4, lost_s={"tensor": 100.0}), job("b", 0.2, lost_s={"idle": 300.0})])]
    )
    rows = model.jobs(Sort.LOST)
    assert [row.job_id for row in rows] == ["b", "a"]
    assert [row.cost_lost for row in rows] == [None, None]


def test_the_default_order_is_the_reports_rank_and_each_row_says_why() -> None:
    """Flags first, in the reports' order: the idle notebook, the straggler's job, the miscount; not by lost cost
    (which puts the notebook first too, but big, 0.52 lost, before the unpriced mid only by the money)."""
    model = hour_of_jobs()
    rows = model.jobs()
    assert [row.job_id for row in rows] == ["small", "big", "mid"]
    assert [row.rank for row in rows] == [1, 2, 3]
    small, big, mid = rows
    assert small.why[0].startswith("idle allocation: 2 GPUs attributed with no tensor activity for 1 window")
    assert small.why[-1].startswith("rank 1: idle: GPUs allocated that do no tensor work")
    assert big.why[0].startswith("straggler: GPU node-1/GPU-3 at 0.50x the median OFU of its job's other GPUs")
    assert mid.why[0].startswith("suspected FLOP miscount")
    assert big.model == "H100-SXM" or big.model is None  # the catalog's one name where the window says the model
    assert [row.job_id for row in model.jobs(Sort.RANK, "idle")] == ["small"]


def test_causes_are_those_the_windows_carry_in_the_vocabularys_order_then_by_name() -> None:
    # The vocabulary's order: idle, clock, the finer split of tensor (no_kernel, sm_idle, non_tensor), tensor.
    assert hour_of_jobs().causes() == ("idle", "clock", "no_kernel", "tensor")
    assert ordered_causes(["tensor", "sm_idle", "no_kernel", "idle"]) == ("idle", "no_kernel", "sm_idle", "tensor")
    assert ordered_causes(["cosmic", "idle"]) == ("idle", "cosmic")  # one outside the vocabulary last, by name


def test_a_window_read_twice_replaces_its_copy_and_the_model_keeps_an_hour() -> None:
    model = FleetModel()
    model.add_windows([window(T, jobs=[job("a", 0.4)])])
    assert not model.add_windows([])
    model.add_windows([window(T, jobs=[job("a", 0.5)])])
    assert [row.ofu for row in model.jobs()] == [0.5]
    model.add_windows(window(T + 60 * k) for k in range(1, 70))  # 69 more minutes
    kept = model.windows
    # the newest ends at T + 4140 s: the hour back from it holds the 60 windows that end after T + 540 s
    assert len(kept) == 60
    assert kept[0].end_ns == (T + 600) * S
    assert len(kept) >= HISTORY


# --- a job's GPUs ----------------------------------------------------------------------------------------


def sample(index: int, job_id: str | None, values: GpuValues) -> GpuSample:
    gpu = GpuIdentity(uuid=f"GPU-{index}", host="node-1", index=index, model=H100)
    attributes: dict[str, str | int] = dict(gpu.resource_attributes())
    if job_id:
        attributes[names.JOB_ID] = job_id
    return GpuSample(gpu, attributes, values, 0, 10 * S)


def values(ofu: float, clock_mhz: float, power: float | None, throttle: Mapping[str, float]) -> GpuValues:
    return GpuValues(
        ofu=ofu,
        ofu_raw=ofu,
        tensor_active=ofu,
        sm_clock_hz=clock_mhz * 1e6,
        max_sm_clock_hz=1980e6,
        max_clock_from_catalog=False,
        power_w=power,
        throttle=throttle,
    )


def test_a_jobs_gpus_from_the_latest_readings_with_the_windows_straggler_verdicts() -> None:
    broken = GpuIdentity(uuid="GPU-7", host="node-1", index=7, model=H100)
    computed = ComputedSnapshot(
        samples=(
            sample(1, "big", values(0.45, 1830, 600.0, {})),
            # power held the clock down 60% of the interval, thermal 30%: power is the reason shown
            sample(3, "big", values(0.20, 1350, 240.0, {"power": 0.6, "thermal": 0.3})),
            sample(2, "big", values(0.44, 1830, None, {"thermal": 0.1})),  # under a quarter: no reason
            sample(0, None, values(0.0, 1980, 70.0, {})),
        ),
        partial=(
            PartialSample(
                broken,
                {**broken.resource_attributes(), names.JOB_ID: "big"},
                {names.GPU_CLOCK_SM.name: 1500e6, names.GPU_POWER.name: 300.0},
                0,
                10 * S,
            ),
        ),
    )
    model = hour_of_jobs()
    model.set_readings(rows_of_snapshot(computed))
    assert model.has_gpu_values
    rows = model.gpus("big")
    assert [row.gpu for row in rows] == ["node-1/1", "node-1/2", "node-1/3", "node-1/7"]  # by index
    first, second, slow, partial = rows
    # the reference clock is the H100 SXM's tensor clock (1830 MHz), not the board's 1980 MHz max
    assert (first.ofu, first.sm_clock_hz, first.reference_clock_hz, first.power_w) == (0.45, 1830e6, 1830e6, 600.0)
    assert (first.throttle_reason, first.straggler) == (None, None)
    assert (second.power_w, second.throttle_reason) == (None, None)
    assert (slow.throttle_reason, slow.throttle_share, slow.straggler) == ("power", 0.6, 1)  # the window's flag
    # no OFU this read: its clock and power all the same, OFU missing (never 0)
    assert (partial.ofu, partial.sm_clock_hz, partial.power_w) == (None, 1500e6, 300.0)
    # the GPU no job claims is a row of its own in the table and opens like a job
    unclaimed = [row for row in model.jobs() if row.job_id == NO_JOB]
    assert [(row.gpus, row.ofu, row.name) for row in unclaimed] == [(1, 0.0, "(no job)")]
    assert [row.gpu for row in model.gpus(NO_JOB)] == ["node-1/0"]


def test_a_feeds_gpus_come_from_its_per_gpu_section_and_its_flags() -> None:
    per_gpu = GpuReport(
        job_id="big",
        attributes={names.HOST_NAME: "node-1", names.HW_ID: "GPU-1", names.GPU_INDEX: "1", names.HW_MODEL: H100},
        ofu=0.45,
        sm_clock_hz=1700e6,
        sm_clock_max_hz=1980e6,
        power_w=500.0,
        throttle={"thermal": 0.5},
    )
    flags = [straggler("big", "GPU-1", reason="thermal"), straggler("big", "GPU-9", reason=None)]
    with_section = FleetModel()
    with_section.add_windows([window(T, jobs=[job("big", 0.4)], gpus=[per_gpu], gpu_flags=flags)])
    assert with_section.has_gpu_values
    known, flagged_only = with_section.gpus("big")
    assert (known.gpu, known.reference_clock_hz, known.throttle_reason, known.throttle_share) == (
        "node-1/1",
        1830e6,
        "thermal",
        0.5,
    )
    assert known.straggler == 1
    # a flagged GPU the section does not hold: what its flag says, the rest missing
    assert (flagged_only.gpu, flagged_only.ofu, flagged_only.straggler) == ("node-1/GPU-9", 0.2, 1)
    assert (flagged_only.sm_clock_hz, flagged_only.power_w, flagged_only.throttle_reason) == (None, None, None)

    without = FleetModel()  # today's collector: no per-GPU section, only its flags
    without.add_windows([window(T, jobs=[job("big", 0.4)], gpu_flags=flags)])
    assert not without.has_gpu_values
    assert [(row.gpu, row.throttle_reason) for row in without.gpus("big")] == [
        ("node-1/GPU-1", "thermal"),
        ("node-1/GPU-9", None),
    ]
    assert without.gpus("nobody") == ()


# --- cells -----------------------------------------------------------------------------------------------


def test_sparkline_levels() -> None:
    # top 0.4: 0.1 -> floor(0.1 / 0.4 x 8) = 2 (the third block), 0.2 -> 4, 0.4 -> 8, capped at the last, 7
    assert cells.sparkline([0.1, 0.2, 0.4], 4) == " ▃▅█"
    assert cells.sparkline([0.4, None, 0.0], 3) == "█ ▁"  # a window the job was not in is a gap
    assert cells.sparkline([0.1, 0.2, 0.3, 0.4], 2) == "▆█"  # the last ones: 0.3 / 0.4 x 8 = 6
    # an idle job's specks are drawn against 10%: 0.00001 and 0.00002 are both the lowest block
    assert cells.sparkline([0.00001, 0.00002], 2) == "▁▁"
    assert cells.sparkline([0.05], 1) == "▅"  # 0.05 / 0.10 x 8 = 4
    assert cells.sparkline([], 3) == "   "


def test_loss_bar_cells_by_largest_remainder() -> None:
    causes = ("clock", "tensor", "no_kernel")
    # of 10 cells: clock 0.5, tensor 5.5, no_kernel 0.25, in all round(6.25) = 6: floors 0 + 5 + 0, and the
    # one cell left goes to the largest remainder, a tie of 0.5 broken by the causes' order: clock
    shares = {"clock": 0.05, "tensor": 0.55, "no_kernel": 0.025}
    assert cells.bar_cells(shares, causes, 10) == [("clock", 1), ("tensor", 5)]
    assert cells.bar_cells({"idle": 1.0}, ("idle",), 8) == [("idle", 8)]
    assert cells.bar_cells({}, causes, 10) == []
    # every cause has a glyph of its own, so the bar reads without colour; unknown causes take turns
    glyphs = {
        cells.cause_style(cause, ("idle", "clock", "tensor", "a", "b"))[0]
        for cause in ("idle", "clock", "tensor", "a", "b")
    }
    assert len(glyphs) == 5


def test_gpu_counts_are_integers_where_whole() -> None:
    # Seven 1g MIG slices of one H100 add up to 0.9999999999999998 in floating point: one GPU, shown as "1".
    assert cells.gpus(sum([1 / 7] * 7)) == "1"
    assert cells.gpus(32.000000001) == "32"
    assert cells.gpus(8.0) == "8"
    assert cells.gpus(2 / 7) == "0.29"


def test_numbers_in_cells() -> None:
    assert cells.percent(0.4123) == "41.2%"
    assert cells.percent(None) == "-"
    assert cells.percent(float("nan")) == "-"
    assert cells.gpu_hours(18720.0) == "5.20"  # 18720 / 3600
    assert cells.gpu_hours(None) == "-"
    assert cells.money(1234.5) == "1,234.50"
    assert cells.mhz(1830e6) == "1830"
    assert cells.watts(612.4) == "612 W"
    assert cells.watts(None) == "-"
