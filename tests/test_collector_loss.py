"""Where OFU is lost and what it costs: the split, GPU time, energy, FLOPs per joule, cost and emissions,
checked against values worked out by hand, and the identity OFU + idle + clock + tensor = 1 on real
windows of the simulated fleet through the real producer, OTLP encoding and decoder."""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping

import pytest
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.sdk.metrics.export import Gauge, Sum

from otel_ofu import names
from otel_ofu.attribution import build_chain
from otel_ofu.clock import ManualClock
from otel_ofu.gpu_values import CalibrationTable
from otel_ofu.producer.loop import Producer
from otel_ofu.sources.simulated import SimulatedFleet
from otel_ofu_collector.aggregation import loss
from otel_ofu_collector.aggregation.windows import Aggregator
from otel_ofu_collector.config import AggregatorConfig, parse_prices
from otel_ofu_collector.otlp.decode import Decoder
from otel_ofu_collector.otlp.encode import reports_to_metrics_data
from otel_ofu_collector.results import WindowReport, gauge_points
from tests.collector_helpers import add_gpu_input, split_gpu

S = 1_000_000_000
W = 60 * S
T0 = 29_000_000 * W
H100 = "NVIDIA H100 80GB HBM3"
IDLE, CLOCK, TENSOR = names.OfuLossCause.IDLE, names.OfuLossCause.CLOCK, names.OfuLossCause.TENSOR


def test_one_gpu_split_by_hand() -> None:
    # TPA 0.5 at 1647 MHz against the H100's 1830 MHz tensor clock: r = 0.9; OFU 0.3 = 0.5 x 0.9 x 2/3
    # (calibration 2/3). Clock: 0.5 x (1 - 0.9) = 0.05. Tensor: (1 - TPA) 0.5 plus calibration's share
    # 0.5 x 0.9 x (1/3) = 0.15: 0.65 = 1 - 0.3 - 0.05.
    ratio = loss.clock_ratio(1.647e9, 1.98e9, 1.83e9)
    assert ratio == pytest.approx(0.9)
    split = split_gpu(0.3, 0.5, ratio, seconds=60.0)
    assert split.idle == 0.0
    assert split.clock == pytest.approx(0.05)
    assert split.tensor == pytest.approx(0.65)
    # Boosting above the tensor clock is no loss: the ratio is capped at 1 in the tensor domain.
    assert loss.clock_ratio(1.98e9, 1.98e9, 1.83e9) == 1.0
    # Without a tensor clock the board max is the reference.
    assert loss.clock_ratio(1.485e9, 1.98e9, None) == pytest.approx(0.75)
    # No clock reading: the whole TPA - OFU reads as tensor loss; no TPA: TPA taken as OFU.
    assert split_gpu(0.3, 0.5, None, seconds=1.0).tensor == pytest.approx(0.7)
    assert split_gpu(0.3, None, 0.5, seconds=1.0).clock == 0.0
    # A stray kernel (TPA 0.004) is no work: idle, all of 1 - OFU.
    stray = split_gpu(0.002, 0.004, 0.2, seconds=1.0)
    assert (stray.idle, stray.clock, stray.tensor) == (0.998, 0.0, 0.0)
    # Window means that do not multiply exactly (TPA x (1 - r) > TPA - OFU) are clamped: nothing negative.
    clamped = split_gpu(0.45, 0.5, 0.8, seconds=1.0)
    assert clamped.clock == pytest.approx(0.05)
    assert clamped.tensor == pytest.approx(0.5)


def _gpu(agg: Aggregator, key: str, identity: dict[str, str], window: int, values: dict[str, float]) -> None:
    """Six 10-second producer intervals of one GPU in window ``window``, the same values each."""
    for tick in range(6):
        start = T0 + window * W + tick * 10 * S
        end = start + 10 * S
        agg.add_ofu(key, values["ofu"], start, end, identity)
        for metric, value in values.items():
            if metric != "ofu":
                add_gpu_input(agg, key, metric, value, start, end, identity)


def _energy(agg: Aggregator, key: str, identity: dict[str, str], series_start: int, joules: list[float]) -> None:
    for tick, value in enumerate(joules, start=1):
        add_gpu_input(agg, key, names.GPU_ENERGY.name, value, series_start, T0 + tick * 10 * S, identity)


def _identity(gpu: str, job: str | None, host: str = "node-1") -> dict[str, str]:
    identity = {names.HOST_NAME: host, names.HW_ID: gpu, names.HW_MODEL: H100, names.GPU_PRECISION: "bf16"}
    if job:
        identity[names.JOB_ID] = job
    return identity


def _config(**extra: object) -> AggregatorConfig:
    return AggregatorConfig(
        window_s=60,
        lateness_s=0,
        price_per_gpu_hour={H100: 2.0, "default": 1.0},
        pue=1.2,
        grid_intensity=0.4,
        **extra,  # type: ignore[arg-type]
    )


def test_a_job_window_by_hand() -> None:
    agg = Aggregator(_config())
    busy, idle, spare = _identity("GPU-a", "j"), _identity("GPU-b", "j"), _identity("GPU-c", None)
    peak = 989.4e12 * 0.4  # gpu.flops.achieved: OFU x the bf16 dense peak
    _gpu(
        agg,
        "a",
        busy,
        0,
        {
            "ofu": 0.4,
            names.GPU_TENSOR_ACTIVE.name: 0.5,
            names.GPU_CLOCK_SM.name: 1.647e9,
            names.GPU_CLOCK_SM_MAX.name: 1.98e9,
            names.GPU_FLOPS_ACHIEVED.name: peak,
            names.GPU_POWER.name: 500.0,
            names.GPU_THROTTLE.name: 0.0,  # ignored: no reason
        },
    )
    # The energy counter: its series began at T0 (within a window), 5000 J per 10 s.
    _energy(agg, "a", busy, T0, [5000.0 * n for n in range(1, 7)])
    _gpu(agg, "b", idle, 0, {"ofu": 0.0, names.GPU_TENSOR_ACTIVE.name: 0.0, names.GPU_POWER.name: 70.0})
    _gpu(agg, "c", spare, 0, {"ofu": 0.0, names.GPU_POWER.name: 100.0})  # no job: fleet energy only
    (report,) = agg.flush(T0 + W)
    (job,) = report.jobs
    assert job.gpus == 2
    assert job.loss is not None
    got = job.loss
    # GPU a: clock 0.5 x (1 - 1647/1830) = 0.05, tensor 1 - 0.4 - 0.05 = 0.55; GPU b: idle 1.
    assert got.gpu_time_s == pytest.approx(120.0)
    assert got.shares[IDLE] == pytest.approx(0.5)
    assert got.shares[CLOCK] == pytest.approx(0.025)
    assert got.shares[TENSOR] == pytest.approx(0.275)
    assert job.ofu == pytest.approx(0.2)
    assert job.ofu is not None
    assert job.ofu + sum(got.shares.values()) == pytest.approx(1.0, abs=1e-15)
    assert dict(got.lost_s) == pytest.approx({IDLE: 60.0, CLOCK: 3.0, TENSOR: 33.0})
    # a: 30 000 J from its counter; b: 70 W x 60 s = 4200 J (no counter).
    assert got.energy_j == pytest.approx(34_200.0)
    # FLOPs per joule over the GPUs with both: a's 0.4 x peak x 60 s / 30 000 J.
    assert got.flops_per_joule == pytest.approx(peak * 60 / 30_000)
    # 120 GPU-s at 2.0 per GPU-hour; lost by cause likewise.
    assert got.cost == pytest.approx(120 / 3600 * 2.0)
    assert got.cost_lost is not None
    assert dict(got.cost_lost) == pytest.approx({IDLE: 60 / 3600 * 2.0, CLOCK: 3 / 3600 * 2.0, TENSOR: 33 / 3600 * 2.0})
    assert got.currency == "USD"
    # 34 200 J = 0.0095 kWh, x PUE 1.2 x 0.4 kg/kWh.
    assert got.emissions_kg == pytest.approx(0.0095 * 1.2 * 0.4)
    fleet = report.fleet.loss
    assert fleet.lost_s == got.lost_s
    assert fleet.cost_lost == got.cost_lost
    assert fleet.energy_j == pytest.approx(34_200.0 + 100.0 * 60)  # the spare GPU too
    # job.gpus.idle needs 3 windows: not yet
    assert job.flag(names.JOB_GPUS_IDLE) == 0


def test_the_same_gpus_in_any_arrival_order_give_the_same_bits() -> None:
    """A single collector and a shard behind the load balancer see a job's GPUs in different orders: the
    job's values must not depend on it. An idle job's residual tensor share (1 - OFU - idle, ~0) is where a
    running sum shows it first: +1e-16 one way, -1e-16 the other."""
    ofus = [1.2e-05, 3.7e-06, 2.1e-05, 9.9e-07, 4.4e-06, 1.7e-05]
    seen = set()
    for order in itertools.permutations(range(len(ofus))):
        agg = Aggregator(_config())
        for index in order:
            values = {"ofu": ofus[index], names.GPU_TENSOR_ACTIVE.name: ofus[index], names.GPU_POWER.name: 70.0 + index}
            _gpu(agg, f"g{index}", _identity(f"GPU-{index}", "idle-job"), 0, values)
        (report,) = agg.flush(T0 + W)
        (job,) = report.jobs
        assert job.loss is not None
        seen.add(
            (
                job.ofu,
                tuple(sorted(job.loss.shares.items())),
                tuple(sorted(job.loss.lost_s.items())),
                job.loss.energy_j,
                job.loss.cost,
                report.fleet.loss.energy_j,
            )
        )
    assert len(seen) == 1, seen
    ((_ofu, shares, _lost, _energy, _cost, _fleet),) = seen
    assert abs(dict(shares)[TENSOR]) < 1e-15  # 0 but for the rounding of that one subtraction


def test_the_outputs_carry_the_split_by_cause_as_sums_with_the_currency_as_unit() -> None:
    agg = Aggregator(_config(currency="EUR"))
    _gpu(agg, "a", _identity("GPU-a", "j"), 0, {"ofu": 0.3, names.GPU_TENSOR_ACTIVE.name: 0.5})
    (report,) = agg.flush(T0 + W)
    points = {(p.spec.name, p.attributes.get(names.OFU_LOSS_CAUSE)): p for p in gauge_points(report)}
    assert points[(names.JOB_GPUS.name, None)].value == 1
    assert points[(names.JOB_GPU_TIME.name, None)].value == pytest.approx(60.0)
    assert points[(names.JOB_OFU_LOSS.name, TENSOR)].value == pytest.approx(0.7)
    assert points[(names.JOB_GPU_TIME_LOST.name, TENSOR)].value == pytest.approx(42.0)
    assert points[(names.JOB_COST_LOST.name, TENSOR)].spec.unit == "{EUR}"
    assert points[(names.FLEET_COST_LOST.name, TENSOR)].value == pytest.approx(42 / 3600 * 2.0)
    # no energy input: no energy, FLOPs per joule nor emissions (absent, not 0)
    assert not {names.JOB_ENERGY.name, names.JOB_FLOPS_PER_JOULE.name, names.JOB_EMISSIONS.name} & {
        name for name, _ in points
    }
    data = reports_to_metrics_data([report], resource_attributes={}, include_partials=False)
    metrics = {m.name: m for m in data.resource_metrics[0].scope_metrics[0].metrics}
    lost = metrics[names.JOB_GPU_TIME_LOST.name]
    assert lost.unit == "s"
    assert isinstance(lost.data, Sum)
    assert lost.data.is_monotonic
    assert lost.data.aggregation_temporality.name == "DELTA"
    assert metrics[names.JOB_COST.name].unit == "{EUR}"
    assert isinstance(metrics[names.JOB_OFU_LOSS.name].data, Gauge)


def test_cost_and_emissions_are_absent_unless_configured() -> None:
    agg = Aggregator(AggregatorConfig(window_s=60, lateness_s=0))
    _gpu(agg, "a", _identity("GPU-a", "j"), 0, {"ofu": 0.3, names.GPU_POWER.name: 300.0})
    (report,) = agg.flush(T0 + W)
    (job,) = report.jobs
    assert job.loss is not None
    assert job.loss.energy_j == pytest.approx(18_000.0)
    assert (job.loss.cost, job.loss.cost_lost, job.loss.emissions_kg, job.loss.currency) == (None, None, None, None)
    shown = {p.spec.name for p in gauge_points(report)}
    assert not shown & {names.JOB_COST.name, names.JOB_COST_LOST.name, names.JOB_EMISSIONS.name}
    assert names.FLEET_COST_LOST.name not in shown
    assert {names.JOB_ENERGY.name, names.FLEET_ENERGY.name} <= shown


def test_energy_counter_deltas_resets_and_a_collector_joining_mid_series() -> None:
    agg = Aggregator(AggregatorConfig(window_s=60, lateness_s=0))
    identity = _identity("GPU-a", "j")
    _gpu(agg, "a", identity, 0, {"ofu": 0.3})
    _gpu(agg, "a", identity, 1, {"ofu": 0.3})
    energy = names.GPU_ENERGY.name
    long_ago = T0 - 3600 * S
    # Joined mid-series: the first point only sets the baseline (its hour of energy is not this window's).
    add_gpu_input(agg, "a", energy, 1_000_000.0, long_ago, T0 + 10 * S, identity)
    add_gpu_input(agg, "a", energy, 1_004_000.0, long_ago, T0 + 20 * S, identity)
    add_gpu_input(agg, "a", energy, 1_004_000.0, long_ago, T0 + 20 * S, identity)  # a retry: counted once
    add_gpu_input(agg, "a", energy, 1_007_000.0, long_ago, T0 + 30 * S, identity)
    # The board restarted its counter: a new series start within a window counts whole.
    add_gpu_input(agg, "a", energy, 2_500.0, T0 + 40 * S, T0 + 50 * S, identity)
    # 3500 J more over (50 s, 70 s]: the window boundary at 60 s splits it, 1750 J to each window.
    add_gpu_input(agg, "a", energy, 6_000.0, T0 + 40 * S, T0 + 70 * S, identity)
    first, second = agg.flush(T0 + 2 * W)
    assert first.jobs[0].loss is not None
    assert second.jobs[0].loss is not None
    assert first.jobs[0].loss.energy_j == pytest.approx(4_000 + 3_000 + 2_500 + 1_750)
    assert second.jobs[0].loss.energy_j == pytest.approx(1_750)


def test_an_older_interval_arriving_late_keeps_its_inputs() -> None:
    """A load balancer's parallel exports can deliver a GPU's intervals out of order: the older one's
    counter reading is already inside the newer delta, but its tensor activity and clocks still count."""

    def window(order: list[int]) -> WindowReport:
        agg = Aggregator(AggregatorConfig(window_s=60, lateness_s=0))
        identity = _identity("GPU-a", "j")
        for tick in order:
            start, end = T0 + tick * 10 * S, T0 + (tick + 1) * 10 * S
            agg.add_ofu("a", 0.3, start, end, identity)
            # As the decoder groups them: the counter with its series start, the gauges with their interval.
            energy = {names.GPU_ENERGY.name: 1_000_000.0 + 5_000.0 * tick}
            assert agg.add_gpu_counters("a", T0 - 3600 * S, end, identity, energy) is None
            values = {
                names.GPU_TENSOR_ACTIVE.name: 0.4 + 0.1 * tick,
                names.GPU_CLOCK_SM.name: 1.5e9 + 1e8 * tick,
                names.GPU_CLOCK_SM_MAX.name: 1.98e9,
            }
            assert agg.add_gpu_inputs("a", start, end, identity, values, {}) is None
        (report,) = agg.flush(T0 + W)
        return report

    in_order, reordered = window([0, 1, 2]), window([0, 2, 1])
    assert in_order.jobs[0].loss is not None
    assert reordered.jobs[0].loss == in_order.jobs[0].loss
    assert in_order.jobs[0].loss.energy_j == pytest.approx(10_000.0)


def test_idle_gpus_counted_after_the_idle_windows() -> None:
    agg = Aggregator(_config(flag_settings={"idle_windows": 3}))
    counts = []
    for window in range(5):
        _gpu(agg, "a", _identity("GPU-a", "j"), window, {"ofu": 0.4, names.GPU_TENSOR_ACTIVE.name: 0.5})
        _gpu(agg, "b", _identity("GPU-b", "j"), window, {"ofu": 0.0, names.GPU_TENSOR_ACTIVE.name: 0.0})
        if window < 4:
            _gpu(agg, "c", _identity("GPU-c", "j"), window, {"ofu": 0.0, names.GPU_TENSOR_ACTIVE.name: 0.0})
        (report,) = agg.flush(T0 + (window + 1) * W)
        counts.append(report.jobs[0].flag(names.JOB_GPUS_IDLE))
    # b and c idle from window 0: counted from window 2; c stops reporting in window 4.
    assert counts == [0, 0, 2, 2, 1]


def _straggler_fleet(agg: Aggregator, window: int, slow: float, reason_share: float) -> list[WindowReport]:
    for gpu in range(4):
        ofu = slow if gpu == 3 else 0.45
        values = {"ofu": ofu, names.GPU_TENSOR_ACTIVE.name: 0.5}
        _gpu(agg, f"g{gpu}", _identity(f"GPU-{gpu}", "j"), window, values)
        if gpu == 3:
            start, end = T0 + window * W, T0 + (window + 1) * W
            add_gpu_input(
                agg, "g3", names.GPU_THROTTLE.name, reason_share, start, end, _identity("GPU-3", "j"), "power"
            )
            add_gpu_input(agg, "g3", names.GPU_THROTTLE.name, 0.1, start, end, _identity("GPU-3", "j"), "thermal")
    return agg.flush(T0 + (window + 1) * W)


def test_a_straggler_is_flagged_on_its_identity_and_cleared_once() -> None:
    agg = Aggregator(_config())
    shown: list[list[tuple[str, int, dict[str, str]]]] = []
    # median 0.45; 0.34 x 1.25 = 0.425 < 0.45: below. 0.37 x 1.25 = 0.4625: not below.
    plan = [(0.34, 0.9)] * 4 + [(0.37, 0.0)] * 3
    for window, (slow, share) in enumerate(plan):
        (report,) = _straggler_fleet(agg, window, slow, share)
        shown.append([(f.job_id, f.value, dict(f.attributes)) for f in report.gpu_flags])
        points = [p for p in gauge_points(report) if p.spec == names.GPU_STRAGGLER]
        assert len(points) == len(report.gpu_flags)
    identity = {names.HOST_NAME: "node-1", names.HW_ID: "GPU-3"}
    powered = {**identity, names.GPU_THROTTLE_REASON: "power"}
    assert shown == [[], [], [("j", 1, powered)], [("j", 1, powered)], [("j", 0, identity)], [], []]


def test_a_straggler_needs_peers_and_a_working_job() -> None:
    agg = Aggregator(_config(flag_settings={"straggler_windows": 1}))
    for window in range(3):
        _gpu(agg, "solo", _identity("GPU-s", "solo"), window, {"ofu": 0.1, names.GPU_TENSOR_ACTIVE.name: 0.2})
        for gpu in range(3):  # an idle GPU among working ones is idle, not a straggler
            ofu, tpa = (0.0, 0.0) if gpu == 0 else (0.4, 0.5)
            _gpu(agg, f"g{gpu}", _identity(f"GPU-{gpu}", "j"), window, {"ofu": ofu, names.GPU_TENSOR_ACTIVE.name: tpa})
        (report,) = agg.flush(T0 + (window + 1) * W)
        assert report.gpu_flags == ()


def test_prices_parse_per_model_with_a_default() -> None:
    prices = parse_prices("NVIDIA H100 80GB HBM3=2.5, default=2.0")
    assert prices == {H100: 2.5, "default": 2.0}
    config = AggregatorConfig(price_per_gpu_hour=prices)
    assert (config.price_of(H100), config.price_of("NVIDIA A100-SXM4-80GB"), config.price_of(None)) == (2.5, 2.0, 2.0)
    assert AggregatorConfig(price_per_gpu_hour={H100: 3.0}).price_of("other") is None
    for bad in ("H100", "H100=-1", "=2", "H100=abc"):
        with pytest.raises(ValueError, match="MODEL=PRICE"):
            parse_prices(bad)
    with pytest.raises(ValueError, match="currency"):
        AggregatorConfig(currency="US$")


def _sim_windows(calibration: str, seed: int = 7, duration_s: float = 600.0) -> list[WindowReport]:
    """The demo fleet through the real producer, the SDK's OTLP encoding and the collector's decoder."""
    clock = ManualClock(start_ns=T0)
    fleet = SimulatedFleet.demo(seed=seed, clock=clock, duration_s=duration_s)
    producer = Producer(
        source=fleet,
        attribution=build_chain(clock=clock).attribute,
        interval_s=10.0,
        clock=clock,
        calibration=CalibrationTable.parse(calibration) if calibration else CalibrationTable(),
    )
    aggregator = Aggregator(AggregatorConfig(window_s=60, lateness_s=10, price_per_gpu_hour={"default": 2.0}))
    decoder = Decoder(sink=aggregator, pass_through=False)
    reports: list[WindowReport] = []
    try:
        for _ in range(int(duration_s // 10)):
            clock.advance(10.0)
            request = encode_metrics(producer.run_once())
            outcome = decoder.decode(request, request.SerializeToString())
            assert outcome.rejected == 0, outcome.error_message
            reports += aggregator.flush(clock())
    finally:
        producer.close()
        fleet.close()
    return reports + aggregator.close_all()


@pytest.mark.parametrize("calibration", ["", "model:H100-SXM=0.85"])
def test_ofu_and_the_three_causes_add_up_to_one_on_real_windows(calibration: str) -> None:
    reports = _sim_windows(calibration)
    jobs = [job for report in reports for job in report.jobs if job.loss is not None]
    assert len(jobs) >= 50
    for job in jobs:
        assert job.loss is not None
        assert job.ofu is not None
        # The demo fleet's GPUs carry engine and SM activity, so 'tensor' comes split into its finer causes.
        assert TENSOR not in job.loss.shares
        assert job.ofu + math.fsum(job.loss.shares.values()) == pytest.approx(1.0, abs=1e-12)
        assert all(share >= -1e-12 for share in job.loss.shares.values())
        assert job.loss.energy_j is not None
        assert job.loss.energy_j > 0
        assert job.loss.flops_per_joule is not None
    by_id = {job.job_id: job for job in jobs}
    assert by_id["job-1006"].loss is not None
    assert by_id["job-1006"].loss.shares[IDLE] > 0.99
    # The healthy job with the power-capped GPU loses more to the clock, on the whole, than one without.
    clock_1001 = [j.loss.shares[CLOCK] for j in jobs if j.job_id == "job-1001" and j.loss]
    clock_1002 = [j.loss.shares[CLOCK] for j in jobs if j.job_id == "job-1002" and j.loss]
    assert sum(clock_1001) / len(clock_1001) > 1.5 * sum(clock_1002) / len(clock_1002)


def tensor_side(shares: Mapping[str, float]) -> float:
    """The tensor cause, whole or split (no_kernel, sm_idle, non_tensor): all but idle and clock."""
    return math.fsum(share for cause, share in shares.items() if cause not in (IDLE, CLOCK))


def test_calibrations_share_goes_to_tensor_not_clock() -> None:
    plain, calibrated = _sim_windows(""), _sim_windows("model:H100-SXM=0.85")
    # A job that hangs or restarts changes phase within a window: its window means (T x (1 - r) against T - O, means of
    # products) are where the clamp binds, and calibration's lower OFU loosens it by more than rounding. The steady
    # jobs show the split's rule.
    phased = {job.job_id for job in SimulatedFleet.demo(seed=7).jobs if job.has_hang or job.training is not None}
    assert phased  # the demo's hung and restarting jobs
    for one, other in zip(plain, calibrated, strict=True):
        for a, b in zip(one.jobs, other.jobs, strict=True):
            if a.loss is None or b.loss is None or a.ofu is None or b.ofu is None or a.job_id in phased:
                continue
            # The same clock loss (up to the clamp on window means, which a lower OFU loosens) ...
            assert b.loss.shares[CLOCK] == pytest.approx(a.loss.shares[CLOCK], abs=1e-4)
            assert a.ofu - b.ofu >= 0.1 * a.ofu
            if a.loss.shares[IDLE] == 0:
                # ... and on working GPUs what calibration takes from OFU, tensor gains
                assert b.loss.shares[IDLE] == 0
                assert tensor_side(b.loss.shares) - tensor_side(a.loss.shares) == pytest.approx(a.ofu - b.ofu, abs=1e-4)


def test_the_decoder_takes_the_loss_inputs_and_refuses_bad_ones_by_name() -> None:
    from otel_ofu.testing.otlp_requests import gpu_request

    aggregator = Aggregator(AggregatorConfig(window_s=60, lateness_s=0))
    decoder = Decoder(sink=aggregator, pass_through=False)
    end = T0 + 30 * S
    request = gpu_request({"GPU-1": ("j", 0.4)}, time_ns=end, sm_clock_hz=1.647e9)
    scope = request.resource_metrics[0].scope_metrics[0]
    power = scope.metrics.add(name=names.GPU_POWER.name, unit="W")
    power.gauge.data_points.add(as_double=350.0, time_unix_nano=end, start_time_unix_nano=end - 10 * S)
    power.gauge.data_points.add(as_double=-1.0, time_unix_nano=end)  # refused: negative
    throttle = scope.metrics.add(name=names.GPU_THROTTLE.name, unit="1")
    held = throttle.gauge.data_points.add(as_double=0.5, time_unix_nano=end, start_time_unix_nano=end - 10 * S)
    held.attributes.add(key=names.GPU_THROTTLE_REASON).value.string_value = "power"
    throttle.gauge.data_points.add(as_double=0.2, time_unix_nano=end)  # refused: no reason
    energy = scope.metrics.add(name=names.GPU_ENERGY.name, unit="J")
    energy.sum.data_points.add(as_double=3500.0, time_unix_nano=end, start_time_unix_nano=end - 10 * S)
    outcome = decoder.decode(request, request.SerializeToString())
    assert (outcome.accepted, outcome.rejected) == (5, 2)
    assert "gpu.power not finite or outside its range" in outcome.error_message
    assert "gpu.throttle without a known gpu.throttle.reason" in outcome.error_message
    (report,) = aggregator.flush(T0 + W)
    (job,) = report.jobs
    assert job.loss is not None
    assert job.loss.energy_j == pytest.approx(3500.0)  # the counter's, not power x time
    # no tensor activity sent: TPA taken as OFU, and the H100's clock 1647/1830 cannot take more than TPA - OFU = 0
    assert job.loss.shares[CLOCK] == 0.0
    assert job.loss.shares[TENSOR] == pytest.approx(0.6)


def test_peer_medians_equal_the_median_of_the_others_computed_directly() -> None:
    import random
    import statistics

    from otel_ofu_collector.aggregation.closing import _peer_medians

    rng = random.Random(5)
    for n in (2, 3, 4, 5, 8, 17):
        values = [round(rng.uniform(0, 1), 2) for _ in range(n)]  # ties on purpose
        expected = [statistics.median(values[:i] + values[i + 1 :]) for i in range(n)]
        assert _peer_medians(values) == pytest.approx(expected)
    assert _peer_medians([0.4]) == [0.4]


def test_loss_and_gpu_flags_survive_the_window_records() -> None:
    from otel_ofu_collector.outputs.record_codec import report_from_line, report_to_line

    agg = Aggregator(_config())
    reports: list[WindowReport] = []
    for window in range(4):
        reports += _straggler_fleet(agg, window, 0.3, 0.9)
    assert reports[-1].gpu_flags
    for report in reports:
        assert report_from_line(report_to_line(report)) == report
