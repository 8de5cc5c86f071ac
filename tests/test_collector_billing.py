"""Every GPU-second billed once: each case worked out by hand, the expected numbers from the arithmetic in its comment.

GPUs that give no OFU, GPUs that change job mid-window, averages weighted by GPU time, percentiles over GPU capacity,
time counted once however often an interval is sent, the first interval of an energy series, a job on two GPU models,
and a ratio met exactly.
"""

from __future__ import annotations

import attrs
import pytest
from opentelemetry.exporter.otlp.proto.common._internal.metrics_encoder import encode_metrics
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from otel_ofu import names
from otel_ofu_collector.aggregation.merge import MergeAggregator
from otel_ofu_collector.aggregation.windows import Aggregator
from otel_ofu_collector.config import AggregatorConfig
from otel_ofu_collector.otlp.encode import reports_to_metrics_data
from otel_ofu_collector.otlp.partials import partials_from_request
from otel_ofu_collector.results import JobReport, PartialWindow, WindowReport
from tests.collector_helpers import add_gpu_input

S = 1_000_000_000
W = 60 * S
T0 = 29_000_000 * W  # a window boundary
H100 = "NVIDIA H100 80GB HBM3"
A100 = "NVIDIA A100-SXM4-80GB"
C = names.OfuLossCause


def gpu(
    name: str, job: str | None, model: str = H100, mig: str | None = None, instance: int | None = None
) -> dict[str, str]:
    identity = {names.HOST_NAME: "node-1", names.HW_ID: name, names.HW_MODEL: model, names.GPU_PRECISION: "bf16"}
    if job is not None:
        identity[names.JOB_ID] = job
    if mig is not None:
        identity[names.GPU_MIG_PROFILE] = mig
        identity[names.GPU_MIG_INSTANCE_ID] = str(instance)
    return identity


def key(identity: dict[str, str]) -> str:
    mig = identity.get(names.GPU_MIG_INSTANCE_ID)
    return f"node-1|{identity[names.HW_ID]}" + (f"|{mig}" if mig else "")


def at(second: float, window: int = 0) -> int:
    return T0 + window * W + round(second * S)


def ofu_every_10s(agg: Aggregator, identity: dict[str, str], ofu: float, first: int = 0, last: int = 60) -> None:
    for second in range(first, last, 10):
        assert agg.add_ofu(key(identity), ofu, at(second), at(second + 10), identity) is None


def unmeasured_every_10s(agg: Aggregator, identity: dict[str, str], first: int = 0, last: int = 60) -> None:
    for second in range(first, last, 10):
        assert agg.add_unmeasured(key(identity), at(second), at(second + 10), identity) is None


def power_every_10s(agg: Aggregator, identity: dict[str, str], watts: float, first: int = 0, last: int = 60) -> None:
    for second in range(first, last, 10):
        assert (
            add_gpu_input(agg, key(identity), names.GPU_POWER.name, watts, at(second), at(second + 10), identity)
            is None
        )


def close(agg: Aggregator, window: int = 0) -> WindowReport:
    return agg.flush(T0 + (window + 1) * W + agg.config.lateness_ns)[-1]


def job_of(report: WindowReport, job_id: str) -> JobReport:
    return next(job for job in report.jobs if job.job_id == job_id)


# --- 1. A GPU that gives no OFU is billed, under its own cause ----------------------------------------------------


def test_a_gpu_without_ofu_is_billed_its_time_energy_and_cost_as_unmeasured() -> None:
    agg = Aggregator(AggregatorConfig(lateness_s=0, price_per_gpu_hour={"default": 3.6}))
    a, b = gpu("GPU-a", "j"), gpu("GPU-b", "j")
    ofu_every_10s(agg, a, 0.5)
    power_every_10s(agg, a, 600.0)
    unmeasured_every_10s(agg, b)  # tensor activity blank all window: no OFU, still allocated
    power_every_10s(agg, b, 300.0)
    report = close(agg)
    job = job_of(report, "j")
    assert job.loss is not None
    # Two GPUs for the whole window: 120 GPU-s, 2 GPUs; useful GPU-s = 0.5 x 60 = 30, so OFU = 30 / 120 = 0.25.
    assert job.loss.gpu_time_s == pytest.approx(120.0)
    assert job.gpus == pytest.approx(2.0)
    assert job.ofu == pytest.approx(0.25)
    # b's 60 s are unmeasured: 60 / 120 = 0.5; a's other half (no tensor activity sent: T = O) is tensor: 30 s = 0.25.
    assert job.loss.lost_s[C.UNMEASURED] == pytest.approx(60.0)
    assert job.loss.lost_s[C.TENSOR] == pytest.approx(30.0)
    assert job.loss.shares[C.UNMEASURED] == pytest.approx(0.5)
    assert job.loss.shares[C.TENSOR] == pytest.approx(0.25)
    assert job.ofu is not None
    assert job.ofu + sum(job.loss.shares.values()) == pytest.approx(1.0, abs=1e-15)
    assert C.IDLE not in job.loss.shares or job.loss.shares[C.IDLE] == 0.0  # never read as idleness
    # Energy: 600 W x 60 s + 300 W x 60 s = 36 kJ + 18 kJ = 54 kJ, the fleet's too.
    assert job.loss.energy_j == pytest.approx(54_000.0)
    assert report.fleet.loss.energy_j == pytest.approx(54_000.0)
    # Cost at 3.6 per GPU-hour (0.001 per GPU-s): 0.12 in all; 0.06 of it unmeasured, 0.03 tensor.
    assert job.loss.cost == pytest.approx(0.12)
    assert job.loss.cost_lost is not None
    assert job.loss.cost_lost[C.UNMEASURED] == pytest.approx(0.06)
    assert job.loss.cost_lost[C.TENSOR] == pytest.approx(0.03)
    # The fleet counts both GPUs; its percentiles are the one OFU measured.
    (group,) = report.groups
    assert group.gpus == pytest.approx(2.0)
    assert group.histogram.count == 1
    assert set(group.quantiles.values()) == {0.5}
    assert report.fleet.loss.lost_s[C.UNMEASURED] == pytest.approx(60.0)


def test_mfu_is_compared_with_the_ofu_that_was_measured() -> None:
    agg = Aggregator(AggregatorConfig(lateness_s=0, flag_settings={"miscount_windows": 1}))
    a, b = gpu("GPU-a", "j"), gpu("GPU-b", "j")
    ofu_every_10s(agg, a, 0.4)
    unmeasured_every_10s(agg, b)
    assert agg.add_mfu("j", 0.42, at(30), {names.JOB_ID: "j"}) is None
    job = job_of(close(agg), "j")
    # Half the GPU time is unmeasured: job.ofu = 0.4 x 60 / 120 = 0.2, but MFU speaks for both GPUs and is compared
    # with the 0.4 measured: gap 0.42 - 0.4 = 0.02, and 0.42 < 1.5 x 0.4: no miscount (against 0.2 it would be 2.1x).
    assert job.ofu == pytest.approx(0.2)
    assert job.gap == pytest.approx(0.02)
    assert job.flops_miscount == 0


def test_a_job_whose_gpus_all_lack_ofu_has_no_ofu_and_all_its_time_unmeasured() -> None:
    agg = Aggregator(AggregatorConfig(lateness_s=0, price_per_gpu_hour={"default": 3.6}))
    for name in ("GPU-a", "GPU-b", "GPU-c"):
        unmeasured_every_10s(agg, gpu(name, "j"))
    report = close(agg)
    job = job_of(report, "j")
    assert job.ofu is None  # not 0: nothing was measured
    assert job.loss is not None
    assert job.gpus == pytest.approx(3.0)
    assert job.loss.gpu_time_s == pytest.approx(180.0)
    assert job.loss.shares == {C.UNMEASURED: 1.0}
    assert job.loss.cost == pytest.approx(0.18)
    (group,) = report.groups
    assert group.gpus == pytest.approx(3.0)
    assert group.quantiles == {}
    assert group.histogram.count == 0


# --- 2. A GPU that changes job mid-window is billed once, split by time ------------------------------------------


def test_a_gpu_that_moves_job_half_way_bills_each_job_half_its_energy_and_counts_once() -> None:
    agg = Aggregator(AggregatorConfig(lateness_s=0))
    g, h = gpu("GPU-g", "A"), gpu("GPU-h", "A")
    g_in_b = gpu("GPU-g", "B")
    ofu_every_10s(agg, g, 0.4, 0, 30)
    ofu_every_10s(agg, g_in_b, 0.4, 30, 60)
    ofu_every_10s(agg, h, 0.4)
    # g's energy counter: a series begun at the window's start, 600 W: 36 kJ over the window.
    for second in range(10, 70, 10):
        counters = {names.GPU_ENERGY.name: 600.0 * second}
        identity = g if second <= 30 else g_in_b
        assert agg.add_gpu_counters(key(g), at(0), at(second), identity, counters) is None
    report = close(agg)
    job_a, job_b = job_of(report, "A"), job_of(report, "B")
    assert job_a.loss is not None
    assert job_b.loss is not None
    # g: 30 s in A and 30 s in B, 18 kJ each (not 36 kJ each); h: 60 s in A.
    assert job_a.loss.energy_j == pytest.approx(18_000.0)
    assert job_b.loss.energy_j == pytest.approx(18_000.0)
    assert job_a.loss.gpu_time_s == pytest.approx(90.0)
    assert job_b.loss.gpu_time_s == pytest.approx(30.0)
    # GPU equivalents on average over the window: A 1.5, B 0.5; the fleet 2 (not 3: g counts once).
    assert job_a.gpus == pytest.approx(1.5)
    assert job_b.gpus == pytest.approx(0.5)
    (group,) = report.groups
    assert group.gpus == pytest.approx(2.0)
    assert report.fleet.loss.energy_j == pytest.approx(36_000.0)


def test_a_moving_gpu_with_power_only_bills_each_job_its_seconds_and_the_fleet_the_whole_window() -> None:
    agg = Aggregator(AggregatorConfig(lateness_s=0, grid_intensity=0.5))
    g, g_in_b = gpu("GPU-g", "A"), gpu("GPU-g", "B")
    ofu_every_10s(agg, g, 0.4, 0, 30)
    ofu_every_10s(agg, g_in_b, 0.4, 30, 60)
    power_every_10s(agg, g, 600.0, 0, 30)
    power_every_10s(agg, g_in_b, 600.0, 30, 60)
    report = close(agg)
    job_a, job_b = job_of(report, "A"), job_of(report, "B")
    assert job_a.loss is not None
    assert job_b.loss is not None
    # 600 W x 30 s = 18 kJ each; the fleet's 600 W x 60 s = 36 kJ (not 18 kJ: the GPU's seconds over both jobs).
    assert job_a.loss.energy_j == pytest.approx(18_000.0)
    assert job_b.loss.energy_j == pytest.approx(18_000.0)
    assert report.fleet.loss.energy_j == pytest.approx(36_000.0)
    # Emissions follow energy: 18 kJ = 0.005 kWh x 0.5 kg/kWh = 0.0025 kg each.
    assert job_a.loss.emissions_kg == pytest.approx(0.0025)
    assert job_b.loss.emissions_kg == pytest.approx(0.0025)


# --- 3. Averages weighted by GPU time ------------------------------------------------------------------------------


def test_job_ofu_and_its_loss_shares_weigh_each_gpu_by_its_time() -> None:
    agg = Aggregator(AggregatorConfig(lateness_s=0))
    x, y = gpu("GPU-x", "j"), gpu("GPU-y", "j")
    ofu_every_10s(agg, x, 0.8)  # the whole window
    assert agg.add_ofu(key(y), 0.2, at(45), at(60), y) is None  # joined for the last 15 s
    job = job_of(close(agg), "j")
    assert job.loss is not None
    # OFU = (0.8 x 60 + 0.2 x 15) / 75 = 51 / 75 = 0.68 (the plain mean would be 0.5).
    assert job.ofu == pytest.approx(0.68)
    # Lost: x 0.2 x 60 = 12 s, y 0.8 x 15 = 12 s: 24 s of 75 = 0.32 = 1 - 0.68.
    assert job.loss.lost_s[C.TENSOR] == pytest.approx(24.0)
    assert job.loss.shares[C.TENSOR] == pytest.approx(0.32)
    assert job.ofu is not None
    assert job.ofu * job.loss.gpu_time_s == pytest.approx(51.0)  # OFU x GPU time = useful GPU time
    assert job.gpus == pytest.approx(1.25)  # 75 GPU-s over a 60 s window


# --- 4. Percentiles over GPU capacity ----------------------------------------------------------------------------


def test_percentiles_are_over_gpu_capacity_however_the_gpu_is_cut() -> None:
    def fleet(slices: list[tuple[str, float]]) -> dict[float, float]:
        agg = Aggregator(AggregatorConfig(lateness_s=0))
        for instance, (profile, ofu) in enumerate(slices):
            ofu_every_10s(agg, gpu("GPU-a", "j", mig=profile, instance=instance), ofu)
        (group,) = close(agg).groups
        assert group.gpus == pytest.approx(1.0)  # one H100, however it is cut
        return dict(group.quantiles)

    # One H100 as a 3g.40gb slice at 0.5 and four 1g.10gb slices at 0.1: 3/7 of its capacity at 0.5, 4/7 at 0.1.
    # p75: 4/7 = 0.571 < 0.75 of the capacity sits at 0.1 or below, all of it at 0.5 or below: 0.5.
    # p50 and below: 0.571 >= 0.5: 0.1. The same capacity as seven 1g slices gives the same percentiles.
    cut = fleet([("3g.40gb", 0.5)] + [("1g.10gb", 0.1)] * 4)
    sevenths = fleet([("1g.10gb", 0.5)] * 3 + [("1g.10gb", 0.1)] * 4)
    assert cut == sevenths
    assert cut[0.75] == 0.5
    assert cut[0.5] == 0.1
    assert cut[0.05] == 0.1
    assert cut[0.95] == 0.5


def test_a_gpu_there_for_part_of_the_window_weighs_its_seconds_in_the_percentiles() -> None:
    agg = Aggregator(AggregatorConfig(lateness_s=0))
    ofu_every_10s(agg, gpu("GPU-a", "j"), 0.2)  # 60 s
    ofu_every_10s(agg, gpu("GPU-b", "j"), 0.4)  # 60 s
    ofu_every_10s(agg, gpu("GPU-c", "j"), 0.9, 50, 60)  # 10 s
    (group,) = close(agg).groups
    # Capacity: 60 GPU-s at 0.2, 60 at 0.4, 10 at 0.9 (130 in all). p50: 65 >= 60 is first reached at 0.4;
    # p95: 123.5 > 120, reached only at 0.9.
    assert group.quantiles[0.5] == 0.4
    assert group.quantiles[0.95] == 0.9
    assert group.gpus == pytest.approx(130 / 60)


# --- 5/6. Time counted once; instantaneous points; a window shorter than the interval -------------------------------


def test_a_request_delivered_twice_and_jittered_intervals_bill_each_second_once() -> None:
    agg = Aggregator(AggregatorConfig(lateness_s=0, price_per_gpu_hour={"default": 3.6}))
    g = gpu("GPU-g", "j")
    for second in range(0, 30, 10):  # a GPU reporting the window's first half
        for _ in range(2):  # every request delivered twice (an OTLP retry after a lost response)
            assert agg.add_ofu(key(g), 0.5, at(second), at(second + 10), g) is None
    h = gpu("GPU-h", "j")
    for second in range(0, 30, 10):  # a timer that runs 40 ms long: each interval overlaps the next
        assert agg.add_ofu(key(h), 0.5, at(second), at(second + 10.04), h) is None
    job = job_of(close(agg), "j")
    assert job.loss is not None
    # g: (0, 30] once = 30 s (not 60); h: (0, 30.04] = 30.04 s (not 3 x 10.04 = 30.12).
    assert job.loss.gpu_time_s == pytest.approx(60.04)
    assert job.loss.cost == pytest.approx(0.06004)
    assert job.ofu == pytest.approx(0.5)


@pytest.mark.parametrize(
    ("start", "end"),
    [(25, 25), (40, 25), (0, 25)],
    ids=["start equal to end", "start after end", "no start"],
)
def test_a_point_without_an_interval_covers_the_time_since_the_streams_previous_one(start: int, end: int) -> None:
    agg = Aggregator(AggregatorConfig(lateness_s=0))
    g = gpu("GPU-g", "j")
    assert agg.add_ofu(key(g), 0.5, at(0), at(10), g) is None  # (0, 10]
    # (start, end] as sent: the decoder passes a point without a start time with its start at its end.
    sent_start = at(end) if start == 0 else at(start)
    assert agg.add_ofu(key(g), 0.5, sent_start, at(end), g) is None
    job = job_of(close(agg), "j")
    assert job.loss is not None
    assert job.loss.gpu_time_s == pytest.approx(25.0)  # (0, 10] and (10, 25]: never the whole window


def test_a_streams_first_point_without_an_interval_covers_nothing() -> None:
    agg = Aggregator(AggregatorConfig(lateness_s=0))
    g = gpu("GPU-g", "j")
    for second in (10, 20, 30):  # scrapes without start times: (10, 20] and (20, 30] are known, before 10 is not
        assert agg.add_ofu(key(g), 0.5, at(second), at(second), g) is None
    job = job_of(close(agg), "j")
    assert job.loss is not None
    assert job.loss.gpu_time_s == pytest.approx(20.0)


def test_points_without_intervals_weigh_ofu_and_its_inputs_alike() -> None:
    agg = Aggregator(AggregatorConfig(lateness_s=0))
    g = gpu("GPU-g", "j")
    clock = 0.8 * 1.83e9  # 80% of the H100's tensor clock: OFU = 0.8 x tensor activity
    # Gauges scraped without start times (the SDK's encoder and Prometheus send them so), the inputs first at one
    # time and OFU first at another: every point of one time covers the same interval, (10, 20] and (20, 60].
    for second, tensor in ((10, 0.9), (20, 0.3), (60, 0.6)):
        inputs = {names.GPU_TENSOR_ACTIVE.name: tensor, names.GPU_CLOCK_SM.name: clock}
        if second == 20:
            assert agg.add_gpu_inputs(key(g), at(second), at(second), g, inputs, {}) is None
        assert agg.add_ofu(key(g), 0.8 * tensor, at(second), at(second), g) is None
        if second != 20:
            assert agg.add_gpu_inputs(key(g), at(second), at(second), g, inputs, {}) is None
    job = job_of(close(agg), "j")
    assert job.loss is not None
    # 50 s, the first point weighing 1 ns: tensor activity (0.3 x 10 + 0.6 x 40) / 50 = 0.54, OFU 0.8 x 0.54 = 0.432;
    # clock loss 0.54 x (1 - 0.8) = 0.108, tensor 1 - 0.432 - 0.108 = 0.46. (Weighing the gauges 1 ns each would read
    # tensor activity 0.6 and a clock loss of 0.12.)
    assert job.loss.gpu_time_s == pytest.approx(50.0)
    assert job.ofu == pytest.approx(0.432)
    assert job.loss.shares[C.CLOCK] == pytest.approx(0.108)
    assert job.loss.shares[C.TENSOR] == pytest.approx(0.46)


def test_a_window_shorter_than_the_interval_keeps_the_first_energy_interval() -> None:
    agg = Aggregator(AggregatorConfig(window_s=10, lateness_s=0, stale_after_s=600))
    g = gpu("GPU-g", "j")
    # A producer at a 60 s interval starting at T0: its energy series begins with its first interval; 600 W.
    assert agg.add_ofu(key(g), 0.5, at(0), at(60), g) is None
    assert agg.add_gpu_counters(key(g), at(0), at(60), g, {names.GPU_ENERGY.name: 36_000.0}) is None
    reports = agg.flush(at(60))
    energies = [job_of(r, "j").loss.energy_j for r in reports if any(j.job_id == "j" for j in r.jobs)]  # type: ignore[union-attr]
    # 36 kJ over six 10 s windows: 6 kJ each (the first interval is not only a baseline).
    assert energies == pytest.approx([6_000.0] * 6)


def test_a_collector_restarted_mid_series_still_takes_only_a_baseline() -> None:
    agg = Aggregator(AggregatorConfig(lateness_s=0))
    g = gpu("GPU-g", "j")
    # The stream's first point here is at 50 s; its energy series began an hour before (this collector restarted).
    assert agg.add_ofu(key(g), 0.5, at(50), at(60), g) is None
    assert agg.add_gpu_counters(key(g), at(-3600), at(60), g, {names.GPU_ENERGY.name: 600.0 * 3660}) is None
    job = job_of(close(agg), "j")
    assert job.loss is not None
    assert job.loss.energy_j is None  # the hour's 2.2 MJ are not booked into this window


# --- 6. A job on two GPU models; a ratio met exactly ---------------------------------------------------------------


def test_a_job_on_two_models_is_not_tagged_with_either() -> None:
    agg = Aggregator(AggregatorConfig(lateness_s=0, price_per_gpu_hour={H100: 3.6, A100: 1.8}))
    ofu_every_10s(agg, gpu("GPU-h", "j", H100), 0.5)
    ofu_every_10s(agg, gpu("GPU-a", "j", A100), 0.5)
    job = job_of(close(agg), "j")
    assert names.HW_MODEL not in job.attributes
    assert job.loss is not None
    assert job.loss.cost == pytest.approx(0.06 + 0.03)  # 60 s at 0.001/s + 60 s at 0.0005/s


def test_mfu_exactly_the_miscount_ratio_times_ofu_is_a_miscount() -> None:
    agg = Aggregator(AggregatorConfig(lateness_s=0, flag_settings={"miscount_windows": 1}))
    ofu_every_10s(agg, gpu("GPU-a", "j"), 0.4)
    assert agg.add_mfu("j", 0.6, at(30), {names.JOB_ID: "j"}) is None  # 1.5 x 0.4 = 0.6: "1.5x or more"
    assert job_of(close(agg), "j").flops_miscount == 1


# --- #34 item 1: a point stamped at the epoch costs one window, not the years to it ---------------------------


def test_a_point_stamped_at_the_epoch_costs_its_own_window_not_every_window_since() -> None:
    agg = Aggregator(AggregatorConfig(lateness_s=0))
    g = gpu("GPU-g", "j")
    assert agg.add_ofu(key(g), 0.5, 1 * S, 11 * S, g) is None  # 1970-01-01T00:00:11Z
    ofu_every_10s(agg, gpu("GPU-h", "k"), 0.5)
    reports = agg.flush(T0 + W)
    # The epoch's window (ending at 60 s), the nine empty ones ending within the staleness (600 s) after it (120 s
    # to 600 s), then the window of T0: not the 29 million windows between.
    assert len(reports) == 11
    assert reports[0].end_ns == W
    assert reports[-1].end_ns == T0 + W


# --- 5. A job whose points move to another shard is combined by its identity --------------------------------------


def _over_otlp(report: WindowReport, shard: str) -> list[PartialWindow]:
    data = reports_to_metrics_data(
        [report], resource_attributes={names.SERVICE_INSTANCE_ID: shard}, include_partials=True
    )
    return partials_from_request(ExportMetricsServiceRequest.FromString(encode_metrics(data).SerializeToString()))


def test_a_job_that_moves_shard_mid_window_counts_once_in_the_merge() -> None:
    config = AggregatorConfig(lateness_s=0, horizon_s=600)
    shards = [Aggregator(attrs.evolve(config, partials=True)) for _ in range(2)]
    single = Aggregator(config)
    merge = MergeAggregator(config)
    a, b, k = gpu("GPU-a", "j"), gpu("GPU-b", "j"), gpu("GPU-k", "k")
    merged: list[WindowReport] = []
    reference: list[WindowReport] = []
    for window in range(3):
        for second in range(0, 60, 10):
            # The load balancer's ring changes at 30 s of window 1: job j's points go to the second shard from then.
            j_shard = shards[0] if window == 0 or (window == 1 and second < 30) else shards[1]
            for target in (j_shard, single):
                for identity in (a, b):
                    start = at(second, window)
                    assert target.add_ofu(key(identity), 0.4, start, start + 10 * S, identity) is None
            for target in (shards[1], single):
                start = at(second, window)
                assert target.add_ofu(key(k), 0.6, start, start + 10 * S, k) is None
        for job, mfu, target in (("j", 0.4, shards[0] if window == 0 else shards[1]), ("k", 0.6, shards[1])):
            for receiver in (target, single):
                assert receiver.add_mfu(job, mfu, at(55, window), {names.JOB_ID: job}) is None
        now = T0 + (window + 1) * W
        reference += single.flush(now)
        for index, shard in enumerate(shards):
            for report in shard.flush(now):
                for partial in _over_otlp(report, f"shard-{index}"):
                    assert merge.add_partial(partial) is None
        merged += merge.flush(now)
    moved = merged[1]
    # Window 1: j's two GPUs were on shard 0 for 30 s and on shard 1 for 30 s; k on shard 1 all window. The fleet:
    # 3 GPUs (not 5); j once, with 2 GPUs, 120 GPU-s and its OFU 0.4 (not two series of 1 GPU-equivalent each).
    (group,) = moved.groups
    assert group.gpus == pytest.approx(3.0)
    j = job_of(moved, "j")
    assert [job.job_id for job in moved.jobs] == ["j", "k"]
    assert j.gpus == pytest.approx(2.0)
    assert j.ofu == pytest.approx(0.4)
    assert j.loss is not None
    assert j.loss.gpu_time_s == pytest.approx(120.0)
    # Every window's job outputs and the fleet's correlation count each job once, as one collector does (to the
    # rounding of adding the shards' sums: equal to 1e-12).
    for got, want in zip(merged, reference, strict=True):
        assert got.fleet.jobs == want.fleet.jobs == 2
        assert got.fleet.mae == pytest.approx(want.fleet.mae, rel=1e-12)
        assert [job.job_id for job in got.jobs] == [job.job_id for job in want.jobs]
        for mine, theirs in zip(got.jobs, want.jobs, strict=True):
            assert (mine.ofu, mine.mfu, mine.gap, mine.gpus) == pytest.approx(
                (theirs.ofu, theirs.mfu, theirs.gap, theirs.gpus), rel=1e-12, abs=1e-12
            )
            assert mine.flags == theirs.flags
            assert mine.loss is not None
            assert theirs.loss is not None
            assert mine.loss.gpu_time_s == pytest.approx(theirs.loss.gpu_time_s, rel=1e-12)


# --- #34 item 9: a flood of new streams and jobs leaves room for the ones that reported before --------------------


def test_a_flood_of_new_streams_and_jobs_leaves_a_tenth_for_those_that_reported_before() -> None:
    agg = Aggregator(AggregatorConfig(lateness_s=0, max_streams=10, max_jobs=10, stale_after_s=120))
    # A legitimate GPU reports, then goes quiet past its staleness (120 s) and is evicted.
    ofu_every_10s(agg, gpu("GPU-legit", "train"), 0.5)
    refused = []
    for n in range(20):  # a flood four windows later: new streams, each of a new job
        identity = gpu(f"GPU-flood-{n}", f"flood-{n}")
        refused.append(agg.add_ofu(key(identity), 0.1, at(0, 4), at(10, 4), identity))
        if n == 0:
            agg.flush(at(0, 4))
            assert agg.streams == 1  # the flood's first; the legitimate GPU evicted
    # Nine of the ten places are the flood's; the tenth is kept for a GPU that reported before.
    assert refused.count(None) == 9
    assert set(refused[9:]) == {names.RejectReason.MAX_STREAMS}
    # It comes back, in a new job: the place kept is there, for it and its job.
    back = gpu("GPU-legit", "train-2")
    assert agg.add_ofu(key(back), 0.5, at(10, 4), at(20, 4), back) is None
    assert agg.streams == 10


def test_the_decoders_identity_cache_counts_in_the_state_bound() -> None:
    from otel_ofu.testing.otlp_requests import gpu_request
    from otel_ofu_collector.otlp.decode import Decoder

    bound = 4 * 1024 * 1024
    agg = Aggregator(AggregatorConfig(lateness_s=0, max_state_bytes=bound))
    decoder = Decoder(agg, pass_through=False, max_attribute_length=4096)
    long_job = "j" * 3000  # long identity values: each Resource's cache entry is kilobytes
    for batch in range(40):
        gpus = {f"GPU-{batch}-{n}": (f"{long_job}-{batch}-{n}", 0.5) for n in range(50)}
        decoder.decode(gpu_request(gpus, time_ns=T0 + 30 * S))
        assert agg.state_bytes + decoder.cache_bytes <= bound
    assert agg.stats.rejected_state_cap > 0  # the bound was reached, and held with the cache in it
