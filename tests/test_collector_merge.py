"""Merge mode: N job-sharded collectors merged equal one collector over all the data."""

from __future__ import annotations

import random
import zlib
from collections.abc import Callable

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.proto.common._internal.metrics_encoder import encode_metrics
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from otel_ofu import names
from otel_ofu_collector.aggregation.merge import MergeAggregator
from otel_ofu_collector.aggregation.windows import Aggregator
from otel_ofu_collector.config import AggregatorConfig
from otel_ofu_collector.otlp.encode import reports_to_metrics_data
from otel_ofu_collector.otlp.partials import partials_from_request
from otel_ofu_collector.results import PartialGroup, PartialWindow, WindowReport
from otel_ofu_collector.stats.exphist import relative_error_bound
from tests.collector_helpers import add_gpu_input

S = 1_000_000_000
W = 60 * S
T0 = 28_333_334 * W
MODELS = ("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB")
PRECISIONS = ("bf16", "fp8", "mixed")

Point = tuple[str, str, float, int, int, dict[str, str]]  # kind, key, value, start, end, identity


def partial_of(report: WindowReport, shard_id: str) -> PartialWindow:
    """The mergeable part of a shard's window report, as ``otlp.partials`` carries it over OTLP (for the tests that
    merge reports without going through OTLP)."""
    return PartialWindow(
        start_ns=report.start_ns,
        end_ns=report.end_ns,
        groups=tuple(PartialGroup(g.attributes, g.histogram, g.gpus, g.capacity) for g in report.groups),
        shard_id=shard_id,
        fleet_loss=report.fleet.loss,
        jobs=report.job_parts,
    )


def fleet_points(seed: int, windows: int = 8, jobs: int = 14) -> list[Point]:
    """A fleet: jobs of 1-8 GPUs starting and ending at random, some without MFU, MFU-only jobs, idle GPUs."""
    rng = random.Random(seed)
    points: list[Point] = []
    for j in range(jobs):
        job = f"job-{j}"
        model = rng.choice(MODELS)
        precision = rng.choice(PRECISIONS)
        gpus = rng.randint(1, 8)
        first = rng.randrange(windows)
        last = rng.randrange(first, windows)
        level = rng.uniform(0.05, 0.6)
        reports_mfu = rng.random() < 0.8
        has_gpus = rng.random() < 0.9
        for window in range(first, last + 1):
            base = T0 + window * W
            if has_gpus:
                for g in range(gpus):
                    identity = {
                        names.HOST_NAME: f"host-{j}-{g // 4}",
                        names.HW_ID: f"GPU-{j}-{g}",
                        names.JOB_ID: job,
                        names.HW_MODEL: model,
                        names.GPU_PRECISION: precision,
                    }
                    for tick in range(0, 60, 15):
                        value = min(1.0, max(0.0, rng.gauss(level, 0.05)))
                        start = base + tick * S
                        points.append(("ofu", f"{j}-{g}", value, start, start + 15 * S, identity))
                        # the loss inputs beside it: tensor activity, clock, power (the energy from power)
                        tpa = min(1.0, value * rng.uniform(1.0, 1.3))
                        points.append((names.GPU_TENSOR_ACTIVE.name, f"{j}-{g}", tpa, start, start + 15 * S, identity))
                        clock = rng.uniform(1.4e9, 1.98e9)
                        points.append((names.GPU_CLOCK_SM.name, f"{j}-{g}", clock, start, start + 15 * S, identity))
                        power = rng.uniform(80.0, 700.0)
                        points.append((names.GPU_POWER.name, f"{j}-{g}", power, start, start + 15 * S, identity))
            if reports_mfu:
                for tick in (20, 50):
                    identity = {names.JOB_ID: job, names.JOB_NAME: f"train-{j}"}
                    mfu = min(1.0, level * rng.uniform(0.8, 2.2))
                    points.append(("mfu", job, mfu, base + tick * S, base + tick * S, identity))
    for idle in range(5):  # allocated to nobody: fleet only
        identity = {names.HOST_NAME: "spare", names.HW_ID: f"GPU-idle-{idle}", names.HW_MODEL: MODELS[0]}
        for window in range(windows):
            base = T0 + window * W
            points.append(("ofu", f"idle-{idle}", 0.0, base, base + 30 * S, identity))
    rng.shuffle(points)
    points.sort(key=lambda p: p[4] // W)  # roughly in time order, shuffled within a window
    return points


def route(point: Point, shards: int) -> int:
    """Like the loadbalancing exporter with routing_attributes [job.id]; job-less data goes by its key."""
    key = point[5].get(names.JOB_ID) or point[1]
    return zlib.crc32(key.encode()) % shards


def feed(agg: Aggregator, point: Point) -> None:
    kind, key, value, start, end, identity = point
    if kind == "ofu":
        agg.add_ofu(key, value, start, end, identity)
    elif kind == "mfu":
        agg.add_mfu(key, value, end, identity)
    else:
        add_gpu_input(agg, key, kind, value, start, end, identity)


def run(
    points: list[Point], config: AggregatorConfig, shards: int
) -> tuple[list[WindowReport], list[list[WindowReport]]]:
    single = Aggregator(config)
    parts = [Aggregator(attrs.evolve(config, partials=True)) for _ in range(shards)]  # as --mode shard runs them
    single_reports: list[WindowReport] = []
    shard_reports: list[list[WindowReport]] = [[] for _ in range(shards)]
    current = None
    for point in points:
        window = point[4] // W
        if current is not None and window != current:  # the service's timer: flush at each window turn
            now = (current + 1) * W + config.lateness_ns
            single_reports += single.flush(now)
            for index, part in enumerate(parts):
                shard_reports[index] += part.flush(now)
        current = window
        feed(single, point)
        feed(parts[route(point, shards)], point)
    if current is not None:  # time moves on for every replica alike (close_all would stop at each one's own data)
        now = (current + 1) * W + config.lateness_ns
        single_reports += single.flush(now)
        for index, part in enumerate(parts):
            shard_reports[index] += part.flush(now)
    return single_reports, shard_reports


def merge_all(
    shard_reports: list[list[WindowReport]],
    config: AggregatorConfig,
    convert: Callable[[WindowReport, str], list[PartialWindow]] | None = None,
) -> list[WindowReport]:
    merger = MergeAggregator(config)
    for index, reports in enumerate(shard_reports):
        for report in reports:
            partials = convert(report, f"shard-{index}") if convert else [partial_of(report, f"shard-{index}")]
            for partial in partials:
                assert merger.add_partial(partial) is None
    return merger.close_all()


def assert_merged_equals_single(
    single: list[WindowReport], merged: list[WindowReport], shards: list[list[WindowReport]]
) -> None:
    assert [r.end_ns for r in merged] == [r.end_ns for r in single]
    for one, many in zip(single, merged, strict=True):
        assert many.start_ns == one.start_ns
        assert [dict(g.attributes) for g in many.groups] == [dict(g.attributes) for g in one.groups]
        for mine, theirs in zip(one.groups, many.groups, strict=True):
            assert theirs.gpus == pytest.approx(mine.gpus, rel=1e-12)
            h1, h2 = mine.histogram, theirs.histogram
            assert (h2.scale, h2.zero_count, h2.offset, h2.counts, h2.min, h2.max) == (
                h1.scale,
                h1.zero_count,
                h1.offset,
                h1.counts,
                h1.min,
                h1.max,
            )
            assert theirs.ofu_sum == pytest.approx(mine.ofu_sum, rel=1e-12, abs=1e-12)
            assert theirs.capacity is not None  # the percentiles over capacity, from the shards' capacity histograms
            bound = relative_error_bound(theirs.capacity.scale)
            for q in names.QUANTILES:
                assert abs(theirs.quantiles[q] - mine.quantiles[q]) <= bound * mine.quantiles[q] * (1 + 1e-9)
        f1, f2 = one.fleet, many.fleet
        assert f2.jobs == f1.jobs == f1.comoments.n == f2.comoments.n
        for field in ("mean_x", "mean_y", "m2_x", "m2_y", "c_xy"):
            assert getattr(f2.comoments, field) == pytest.approx(getattr(f1.comoments, field), rel=1e-12, abs=1e-12)
        assert f2.abs_diff_sum == pytest.approx(f1.abs_diff_sum, rel=1e-12, abs=1e-12)
        assert (f2.correlation is None) == (f1.correlation is None)
        if f1.correlation is not None:
            assert f2.correlation == pytest.approx(f1.correlation, abs=1e-9)
        assert (f2.mae is None) == (f1.mae is None)
        if f1.mae is not None:
            assert f2.mae == pytest.approx(f1.mae, rel=1e-12, abs=1e-12)
        # where OFU is lost: the fleet's totals are sums, added across shards
        l1, l2 = f1.loss, f2.loss
        assert set(l2.lost_s) == set(l1.lost_s)
        for cause, seconds in l1.lost_s.items():
            assert l2.lost_s[cause] == pytest.approx(seconds, rel=1e-12, abs=1e-9)
        assert (l2.energy_j is None) == (l1.energy_j is None)
        if l1.energy_j is not None:
            assert l2.energy_j == pytest.approx(l1.energy_j, rel=1e-12)
        assert (l2.cost_lost is None) == (l1.cost_lost is None)
        if l1.cost_lost is not None:
            assert l2.cost_lost is not None
            for cause, cost in l1.cost_lost.items():
                assert l2.cost_lost[cause] == pytest.approx(cost, rel=1e-12, abs=1e-12)
        assert l2.currency == l1.currency
        # each job's outputs: the merge tier adds up its parts and closes it as the single collector did
        assert list(many.jobs) == list(one.jobs)
        on_shards = sorted(
            (job for reports in shards for r in reports if r.end_ns == one.end_ns for job in r.jobs),
            key=lambda job: job.job_id,
        )
        assert on_shards == list(one.jobs)  # each job on one shard here: the shard's own view is the same


@pytest.mark.parametrize("shards", [2, 3, 8])
@pytest.mark.parametrize("seed", [1, 2])
def test_n_shards_merged_equal_one_process(shards: int, seed: int) -> None:
    config = AggregatorConfig(horizon_s=300, histogram_max_buckets=160, price_per_gpu_hour={"default": 2.0})
    single, parts = run(fleet_points(seed), config, shards)
    assert sum(len(r.jobs) for r in single) > 0
    assert any(r.fleet.loss.energy_j for r in single)
    assert any(r.fleet.loss.cost_lost for r in single)
    assert any(r.fleet.correlation is not None for r in single)
    assert_merged_equals_single(single, merge_all(parts, config), parts)


@settings(max_examples=15, deadline=None)
@given(
    st.integers(min_value=0, max_value=10_000), st.integers(min_value=1, max_value=6), st.sampled_from([20, 160, 640])
)
def test_merge_equals_one_process_for_any_fleet(seed: int, shards: int, max_buckets: int) -> None:
    config = AggregatorConfig(horizon_s=240, histogram_max_buckets=max_buckets)
    single, parts = run(fleet_points(seed, windows=6, jobs=8), config, shards)
    assert_merged_equals_single(single, merge_all(parts, config), parts)


def test_a_retried_partial_replaces_instead_of_doubling() -> None:
    config = AggregatorConfig()
    single, parts = run(fleet_points(4), config, 2)
    merger = MergeAggregator(config)
    for index, reports in enumerate(parts):
        for report in reports:
            assert merger.add_partial(partial_of(report, f"s{index}")) is None
            assert merger.add_partial(partial_of(report, f"s{index}")) is None  # an export retry
    merged = merger.close_all()
    assert [sum(g.gpus for g in r.groups) for r in merged] == [sum(g.gpus for g in r.groups) for r in single]
    assert merger.stats.replaced_partials > 0


def test_partials_without_shard_id_are_all_added() -> None:
    config = AggregatorConfig()
    single, parts = run(fleet_points(5), config, 3)
    merged = merge_all(parts, config, convert=lambda report, _shard: [partial_of(report, "")])
    assert [sum(g.gpus for g in r.groups) for r in merged] == [sum(g.gpus for g in r.groups) for r in single]


def test_late_partials_are_refused_and_counted() -> None:
    config = AggregatorConfig(lateness_s=15)
    _single, parts = run(fleet_points(6), config, 2)
    merger = MergeAggregator(config)
    first = parts[0][0]
    assert merger.add_partial(partial_of(first, "a")) is None
    assert merger.watermark_ns == first.end_ns
    (closed,) = merger.flush(first.end_ns + 15 * S)
    assert closed.end_ns == first.end_ns
    assert merger.add_partial(partial_of(first, "b")) is not None
    assert merger.stats.late_partials == 1
    assert merger.stats.windows_closed == 1


def test_merged_quantiles_meet_the_design_target_with_default_buckets() -> None:
    """Target: percentiles from merged histograms within 1% (relative) of exact."""
    config = AggregatorConfig(horizon_s=300)
    single, parts = run(fleet_points(9, windows=4, jobs=40), config, 8)
    merged = merge_all(parts, config)
    worst = 0.0
    for one, many in zip(single, merged, strict=True):
        for mine, theirs in zip(one.groups, many.groups, strict=True):
            for q in names.QUANTILES:
                if mine.quantiles[q] > 0:
                    worst = max(worst, abs(theirs.quantiles[q] - mine.quantiles[q]) / mine.quantiles[q])
    assert worst < 0.01


@pytest.mark.parametrize("shards", [2, 5])
def test_shards_over_otlp_merged_equal_one_process(shards: int) -> None:
    config = AggregatorConfig(horizon_s=300, price_per_gpu_hour={MODELS[0]: 2.5}, currency="EUR")
    single, parts = run(fleet_points(21), config, shards)

    def over_the_wire(report: WindowReport, shard: str) -> list[PartialWindow]:
        return partials_from_request(wire([report], shard))

    assert_merged_equals_single(single, merge_all(parts, config, convert=over_the_wire), parts)


def test_a_request_of_many_windows_and_shards() -> None:
    config = AggregatorConfig(horizon_s=300)
    _single, parts = run(fleet_points(22), config, 3)
    request = ExportMetricsServiceRequest()
    for index, reports in enumerate(parts):
        request.resource_metrics.extend(wire(reports, f"s{index}").resource_metrics)
    assert len(partials_from_request(request)) == sum(len(reports) for reports in parts)


def wire(reports: list[WindowReport], shard: str) -> ExportMetricsServiceRequest:
    """Shard-mode outputs as the SDK's OTLP exporter would put them on the wire."""
    data = reports_to_metrics_data(
        reports, resource_attributes={names.SERVICE_INSTANCE_ID: shard}, include_partials=True
    )
    return ExportMetricsServiceRequest.FromString(encode_metrics(data).SerializeToString())
