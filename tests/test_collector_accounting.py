"""GPU time, GPU equivalents, cost and energy as a fleet owner bills by: each case worked out by hand.

The windows split every point's interval over the windows it overlaps, count a MIG slice as its share of its
GPU, and refuse inputs beyond physics; a 24 h fleet of producers at 1, 10, 15 and 60 s intervals at random
phases adds up to its wall time.
"""

from __future__ import annotations

import heapq
import random

import pytest

from otel_ofu import names
from otel_ofu_collector.aggregation.windows import Aggregator
from otel_ofu_collector.config import AggregatorConfig
from otel_ofu_collector.results import JobReport, WindowReport
from tests.collector_helpers import add_gpu_input

S = 1_000_000_000
W = 60 * S
T0 = 29_000_000 * W
H100 = "NVIDIA H100 80GB HBM3"


def _gpu(gpu: str, job: str, mig: str | None = None, instance: int | None = None) -> dict[str, str]:
    identity = {
        names.HOST_NAME: "node-1",
        names.HW_ID: gpu,
        names.HW_MODEL: H100,
        names.GPU_PRECISION: "bf16",
        names.JOB_ID: job,
    }
    if mig is not None:
        identity[names.GPU_MIG_PROFILE] = mig
        identity[names.GPU_MIG_INSTANCE_ID] = str(instance)
    return identity


def _key(identity: dict[str, str]) -> str:
    mig = identity.get(names.GPU_MIG_INSTANCE_ID)
    return f"node-1|{identity[names.HW_ID]}" + (f"|{mig}" if mig else "")


def _window_of(agg: Aggregator, identity: dict[str, str], ofu: float, window: int = 0) -> None:
    """Six 10 s intervals covering window ``window`` exactly."""
    for tick in range(6):
        start = T0 + window * W + tick * 10 * S
        assert agg.add_ofu(_key(identity), ofu, start, start + 10 * S, identity) is None


def _job(report: WindowReport, job_id: str) -> JobReport:
    return next(job for job in report.jobs if job.job_id == job_id)


# --- GPU equivalents: a MIG slice is its share of its GPU -------------------------------------------------------


def test_an_h100_in_seven_1g_slices_in_one_job_is_one_gpu_one_gpu_minute_and_its_price() -> None:
    agg = Aggregator(AggregatorConfig(lateness_s=0, price_per_gpu_hour={H100: 2.5}))
    for instance in range(7):
        _window_of(agg, _gpu("GPU-a", "j", "1g.10gb", instance), 0.5)
    (report,) = agg.flush(T0 + W)
    job = _job(report, "j")
    assert job.loss is not None
    # 7 slices x 1/7 of a GPU = 1 GPU; 7 x 60 s x 1/7 = 60 GPU-s; 2.5 USD/GPU-h x 60/3600 h = 0.041667 USD.
    assert job.gpus == pytest.approx(1.0)
    assert job.loss.gpu_time_s == pytest.approx(60.0)
    assert job.loss.cost == pytest.approx(2.5 * 60 / 3600)
    (group,) = report.groups
    assert group.gpus == pytest.approx(1.0)
    assert group.histogram.count == 7  # the histogram counts observations: seven slices reported
    assert job.ofu == pytest.approx(0.5)


def test_an_mi300x_in_cpx_mode_is_one_gpu_and_a_dpx_half_is_half_of_one() -> None:
    agg = Aggregator(AggregatorConfig(lateness_s=0, price_per_gpu_hour={"default": 3.6}))
    mi300x = "AMD Instinct MI300X OAM"

    def partition(gpu: str, job: str, mode: str) -> dict[str, str]:
        return {
            names.HOST_NAME: "node-1",
            names.HW_ID: gpu,
            names.HW_MODEL: mi300x,
            names.HW_VENDOR: names.HW_VENDOR_AMD,
            names.GPU_PRECISION: "bf16",
            names.JOB_ID: job,
            names.GPU_COMPUTE_PARTITION: mode,
        }

    # Each AMD partition reports under its own UUID: eight CPX partitions of one GPU (one per XCD) in job "cpx",
    # and one DPX half of another GPU in job "dpx".
    for index in range(8):
        _window_of(agg, partition(f"GPU-cpx-{index}", "cpx", "cpx"), 0.4)
    _window_of(agg, partition("GPU-dpx-0", "dpx", "dpx"), 0.2)
    (report,) = agg.flush(T0 + W)
    cpx, dpx = _job(report, "cpx"), _job(report, "dpx")
    assert cpx.loss is not None
    assert dpx.loss is not None
    # CPX: 8 partitions x 1/8 of an MI300X (8 XCDs) = 1 GPU; 60 GPU-s; 3.6 USD/GPU-h = 0.001 USD/GPU-s: 0.06 USD.
    assert cpx.gpus == pytest.approx(1.0)
    assert cpx.loss.gpu_time_s == pytest.approx(60.0)
    assert cpx.loss.cost == pytest.approx(0.06)
    # DPX: one half of a GPU: 0.5 GPU, 30 GPU-s, 0.03 USD.
    assert dpx.gpus == pytest.approx(0.5)
    assert dpx.loss.gpu_time_s == pytest.approx(30.0)
    assert dpx.loss.cost == pytest.approx(0.03)
    (group,) = report.groups
    assert group.gpus == pytest.approx(1.5)


def test_a_job_on_a_whole_gpu_and_a_slice_weighs_each_by_its_share() -> None:
    agg = Aggregator(AggregatorConfig(lateness_s=0, price_per_gpu_hour={"default": 3.6}))
    _window_of(agg, _gpu("GPU-a", "j"), 0.6)
    _window_of(agg, _gpu("GPU-b", "j", "1g.10gb", 3), 0.1)
    (report,) = agg.flush(T0 + W)
    job = _job(report, "j")
    assert job.loss is not None
    # GPU equivalents 1 + 1/7 = 8/7; OFU weighted by them: (0.6 x 1 + 0.1 x 1/7) / (8/7) = 4.3/8 = 0.5375.
    assert job.gpus == pytest.approx(8 / 7)
    assert job.ofu is not None
    assert job.ofu == pytest.approx(0.5375)
    # Lost to "tensor" (no TPA sent: all of 1 - OFU): (0.4 x 60 + 0.9 x 60 / 7) GPU-s = 24 + 7.714 = 31.714.
    assert job.loss.lost_s[names.OfuLossCause.TENSOR] == pytest.approx(24 + 0.9 * 60 / 7)
    assert job.loss.gpu_time_s == pytest.approx(60 * 8 / 7)
    # 3.6 per GPU-hour: 0.001 per GPU-second, so the cost is 1/1000 of the GPU-seconds.
    assert job.loss.cost == pytest.approx(60 * 8 / 7 / 1000)
    assert job.loss.shares[names.OfuLossCause.TENSOR] + job.ofu == pytest.approx(1.0, abs=1e-12)  # idle, clock: 0


def test_a_groups_percentiles_weigh_slices_by_their_share() -> None:
    # One H100 group: slices at OFU 0.2 and 0.5 (1/7 of a GPU each) and a whole GPU at 0.8, all window: 9/7 of a
    # GPU's capacity, 1/7 at 0.2, 1/7 at 0.5, 7/7 at 0.8. p5 (0.45/7 of it): 0.2; p25 (2.25/7): past 2/7, 0.8;
    # p50 and up: 0.8 (unweighted, the median would be 0.5).
    agg = Aggregator(AggregatorConfig(lateness_s=0))
    _window_of(agg, _gpu("GPU-a", "j", "1g.10gb", 1), 0.2)
    _window_of(agg, _gpu("GPU-a", "j", "1g.10gb", 2), 0.5)
    _window_of(agg, _gpu("GPU-b", "j"), 0.8)
    (report,) = agg.flush(T0 + W)
    (group,) = report.groups
    assert group.gpus == pytest.approx(9 / 7)
    assert group.quantiles[0.05] == 0.2
    assert group.quantiles[0.25] == 0.8
    assert group.quantiles[0.5] == 0.8
    assert group.quantiles[0.95] == 0.8


# --- GPU time: each interval split over the windows it overlaps -------------------------------------------------


def test_a_ten_second_producer_off_the_boundaries_counts_every_second() -> None:
    # Intervals (55 s, 65 s], (65 s, 75 s], ...: the one over the boundary at 60 s is 5 s in each window. Before,
    # its first 5 s went to no window: 55 GPU-s per full window (8% low), not 60.
    agg = Aggregator(AggregatorConfig(lateness_s=15, price_per_gpu_hour={"default": 3.6}))
    identity = _gpu("GPU-a", "j")
    for tick in range(18):  # (-5 s, 5 s] ... (165 s, 175 s]
        end = T0 + 5 * S + tick * 10 * S
        assert agg.add_ofu(_key(identity), 0.4, end - 10 * S, end, identity) is None
    reports = agg.close_all()
    seconds = {(r.start_ns - T0) // W: _job(r, "j").loss.gpu_time_s for r in reports if r.jobs}  # type: ignore[union-attr]
    assert seconds == {-1: pytest.approx(5.0), 0: pytest.approx(60.0), 1: pytest.approx(60.0), 2: pytest.approx(55.0)}
    assert sum(_job(r, "j").loss.cost for r in reports if r.jobs) == pytest.approx(0.180)  # type: ignore[union-attr,misc]


def test_a_part_whose_window_closed_goes_to_the_next_open_one() -> None:
    # 60 s intervals, 15 s lateness, each point arriving as its interval ends (the collector flushes first). The
    # interval (30 s, 90 s] arrives at 90 s, after window (0, 60 s] closed at 75 s: its first 30 s go to (60 s, 120 s]
    # with its own 30 s. Each window then holds 60 GPU-s (30 of its own, 30 carried) and none is lost.
    agg = Aggregator(AggregatorConfig(lateness_s=15))
    identity = _gpu("GPU-a", "j")
    reports: list[WindowReport] = []
    for end_s in (30, 90, 150):
        reports += agg.flush(T0 + end_s * S)
        assert agg.add_ofu(_key(identity), 0.5, T0 + (end_s - 60) * S, T0 + end_s * S, identity) is None
    reports += agg.close_all()
    seconds = {(r.start_ns - T0) // W: _job(r, "j").loss.gpu_time_s for r in reports if r.jobs}  # type: ignore[union-attr]
    assert seconds == {0: pytest.approx(60.0), 1: pytest.approx(60.0), 2: pytest.approx(60.0)}
    assert agg.stats.late_points == 0


@pytest.mark.parametrize("seed", [1, 2])
def test_a_day_of_unaligned_producers_adds_up_to_their_wall_time(seed: int) -> None:
    """24 h of GPUs reporting every 1, 10, 15 and 60 s from random phases, each point arriving up to 0.5 s after
    its interval ends, the collector flushing by its clock at the shipped defaults (60 s windows, 15 s lateness):
    each GPU's GPU time over the run equals the wall time it reported, and a constant 300 W gives 300 J per
    second of it (the power-derived energy is split as the time is)."""
    rng = random.Random(seed)
    agg = Aggregator(AggregatorConfig())
    day = 86_400 * S
    events: list[tuple[int, int, str, int, int]] = []  # (arrival, order, gpu, start, end)
    reported: dict[str, int] = {}  # the wall time each GPU's points cover, ns
    for interval_s in (1, 10, 15, 60):
        for copy in range(2):
            gpu = f"GPU-{interval_s}s-{copy}"
            step = interval_s * S
            start = T0 + rng.randrange(step)  # a random phase against the windows
            reported[gpu] = 0
            while start + step <= T0 + day:
                events.append((start + step + rng.randrange(S // 2), len(events), gpu, start, start + step))
                reported[gpu] += step
                start += step
    heapq.heapify(events)
    seconds: dict[str, float] = dict.fromkeys(reported, 0.0)
    energy: dict[str, float] = dict.fromkeys(reported, 0.0)
    next_flush = T0

    def collect(reports: list[WindowReport]) -> None:
        for report in reports:
            for job in report.jobs:
                assert job.loss is not None
                seconds[job.job_id] += job.loss.gpu_time_s
                energy[job.job_id] += job.loss.energy_j or 0.0

    while events:
        arrival, _order, gpu, start, end = heapq.heappop(events)
        if arrival >= next_flush:  # the collector's timer, once a second
            collect(agg.flush(arrival))
            next_flush = arrival + S
        identity = {names.HOST_NAME: "n", names.HW_ID: gpu, names.HW_MODEL: H100, names.JOB_ID: gpu}
        assert agg.add_ofu(f"n|{gpu}", 0.5, start, end, identity) is None
        assert agg.add_gpu_inputs(f"n|{gpu}", start, end, identity, {names.GPU_POWER.name: 300.0}, {}) is None
    collect(agg.close_all())
    assert agg.stats.late_points == 0
    for gpu, total_ns in reported.items():
        assert seconds[gpu] == pytest.approx(total_ns / S, rel=1e-9), gpu
        assert energy[gpu] == pytest.approx(300.0 * total_ns / S, rel=1e-9), gpu


# --- inputs beyond physics are refused, and cost nothing else --------------------------------------------------


def test_a_poisoned_energy_reading_is_refused_and_the_window_closes_for_everyone() -> None:
    agg = Aggregator(AggregatorConfig(lateness_s=0))
    energy = names.GPU_ENERGY.name
    series = T0 - 3600 * S
    for gpu in ("a", "b", "c"):
        identity = _gpu(f"GPU-{gpu}", f"job-{gpu}")
        _window_of(agg, identity, 0.5)
        assert (
            add_gpu_input(agg, _key(identity), energy, 1_000_000.0, series, T0 + 10 * S, identity) is None
        )  # baseline
        # 60 kJ in the next 50 s: 1200 W, a plausible board.
        assert add_gpu_input(agg, _key(identity), energy, 1_060_000.0, series, T0 + 60 * S, identity) is None
    # Two GPUs report a finite 1e308 J: it would overflow every sum; it is refused as implausible.
    for gpu in ("a", "b"):
        identity = _gpu(f"GPU-{gpu}", f"job-{gpu}")
        assert add_gpu_input(agg, _key(identity), energy, 1e308, series, T0 + 61 * S, identity) == "implausible"
    # A counter running backwards within its series, and one faster than 5 kW (1 MJ in 10 s), likewise.
    identity = _gpu("GPU-c", "job-c")
    assert add_gpu_input(agg, _key(identity), energy, 900_000.0, series, T0 + 61 * S, identity) == "implausible"
    assert add_gpu_input(agg, _key(identity), energy, 2_060_000.0, series, T0 + 70 * S, identity) == "implausible"
    (report,) = agg.flush(T0 + W)
    assert [job.job_id for job in report.jobs] == ["job-a", "job-b", "job-c"]
    for job in report.jobs:
        assert job.loss is not None
        assert job.loss.energy_j == pytest.approx(60_000.0)
    assert report.fleet.loss.energy_j == pytest.approx(180_000.0)
    assert agg.close_all() == []  # shutdown: nothing left open, nothing raised


def test_an_interval_longer_than_the_staleness_is_refused() -> None:
    agg = Aggregator(AggregatorConfig(lateness_s=0, stale_after_s=600))
    identity = _gpu("GPU-a", "j")
    # A start time a day before its end: its stream would have been evicted as silent many times over.
    assert agg.add_ofu(_key(identity), 0.5, T0 - 86_400 * S, T0 + 10 * S, identity) == "implausible"
    assert (
        agg.add_ofu(_key(identity), 0.5, T0 - 590 * S, T0 + 10 * S, identity) is None
    )  # 600 s: taken, over 11 windows


# --- state bounded in bytes -------------------------------------------------------------------------------------


def test_the_windows_state_is_bounded_in_bytes() -> None:
    # What the bound counts (Aggregator.state_bytes): per GPU stream 2048 B + twice its key, per job 4096 B + its id,
    # per distinct profile 64 + 8 x its 8 fields + its values ("j", and the H100's name and "bf16" both as the group
    # and as the job's attributes: 1 + 2 x (21 + 4)) = 179 B. A new stream is taken while the state plus what it may
    # bring (2048 + 2 x 10 for its key, 64 + 2 x (21 + 4 + 1) for its identity: 2184 B, and 4096 for a new job) fits
    # in the nine tenths of the bound that new identities may take (a tenth is kept for GPUs that reported before):
    # 179 + 4097 + 2068 k + 2184 <= 0.9 x 1,048,576 = 943,718.4 holds for k up to 453, so 454 streams are taken.
    agg = Aggregator(AggregatorConfig(lateness_s=0, max_state_bytes=1024 * 1024))
    identity = {names.HW_MODEL: H100, names.GPU_PRECISION: "bf16", names.JOB_ID: "j"}
    taken = [agg.add_ofu(f"h|GPU-{n:04d}", 0.5, T0, T0 + 10 * S, identity) for n in range(600)]
    assert taken[:454] == [None] * 454
    assert set(taken[454:]) == {"max_state"}
    assert agg.state_bytes == 179 + 4097 + 2068 * 454
    assert agg.stats.rejected_state_cap == 146
    # Known streams still flow at the bound: only new state is refused.
    assert agg.add_ofu("h|GPU-0000", 0.5, T0 + 10 * S, T0 + 20 * S, identity) is None


def test_identity_values_longer_than_real_ones_are_refused_by_default() -> None:
    from otel_ofu.testing.otlp_requests import RecordingSink, gpu_request
    from otel_ofu_collector.otlp.decode import Decoder

    # A Kubernetes "namespace/name" is at most 63 + 1 + 253 = 317 characters: 320 is the default bound.
    sink = RecordingSink()
    decoder = Decoder(sink)
    assert decoder.decode(gpu_request({"GPU-1": ("j" * 320, 0.5)})).rejected == 0
    refused = decoder.decode(gpu_request({"GPU-2": ("j" * 321, 0.5)}))
    assert refused.rejected == 1
    assert "longer than 320 characters" in refused.error_message
