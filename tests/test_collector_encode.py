"""Window reports as SDK MetricsData, through the SDK's OTLP encoder into protobuf and back as partials."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.common._internal.metrics_encoder import encode_metrics
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.metrics.v1 import metrics_pb2
from opentelemetry.sdk.metrics.export import AggregationTemporality, ExponentialHistogram, Gauge, MetricsData

from otel_ofu import names
from otel_ofu_collector.aggregation.windows import Aggregator
from otel_ofu_collector.config import AggregatorConfig
from otel_ofu_collector.otlp.encode import reports_to_metrics_data
from otel_ofu_collector.otlp.partials import (
    is_merge_recomputed_metric,
    is_partial_metric,
    job_points,
    partials_from_request,
)
from otel_ofu_collector.results import JobSums, JobWindow, WindowReport

S = 1_000_000_000
W = 60 * S
T0 = 28_333_334 * W


def wire(reports: list[WindowReport], shard: str, include_partials: bool = True) -> ExportMetricsServiceRequest:
    data = reports_to_metrics_data(
        reports,
        resource_attributes={names.SERVICE_INSTANCE_ID: shard, "k8s.pod.name": "collector-0"},
        include_partials=include_partials,
    )
    return ExportMetricsServiceRequest.FromString(encode_metrics(data).SerializeToString())


def _sample_reports() -> list[WindowReport]:
    agg = Aggregator(AggregatorConfig())
    identity = {
        names.HW_MODEL: "NVIDIA H100 80GB HBM3",
        names.GPU_PRECISION: "bf16",
        names.JOB_ID: "j1",
        names.JOB_NAME: "train",
    }
    for window in range(2):
        for gpu, value in enumerate((0.0, 0.4 + 0.1 * window, 0.5)):
            agg.add_ofu(f"g{gpu}", value, T0 + window * W, T0 + (window + 1) * W, identity)  # all window
        agg.add_mfu("j1", 0.45 + 0.1 * window, T0 + window * W + 40 * S, identity)
        agg.add_mfu("mfu-only", 0.3, T0 + window * W + 40 * S, {names.JOB_ID: "mfu-only"})
    return agg.close_all()


def _metrics(data: MetricsData) -> dict[str, object]:
    (resource_metrics,) = data.resource_metrics
    (scope_metrics,) = resource_metrics.scope_metrics
    return {metric.name: metric.data for metric in scope_metrics.metrics}


def test_outputs_follow_the_contract() -> None:
    reports = _sample_reports()
    data = reports_to_metrics_data(reports, resource_attributes={"service.name": "other"}, include_partials=False)
    (resource_metrics,) = data.resource_metrics
    assert resource_metrics.resource.attributes[names.SERVICE_NAME] == names.COLLECTOR_SERVICE_NAME
    assert resource_metrics.scope_metrics[0].scope.name == names.COLLECTOR_INSTRUMENTATION_SCOPE
    metrics = _metrics(data)
    outputs = (*names.COLLECTOR_METRICS, *names.COLLECTOR_LOSS_METRICS, *names.COLLECTOR_GOODPUT_METRICS)
    assert set(metrics) <= {spec.name for spec in outputs}
    histogram = metrics[names.FLEET_OFU.name]
    assert isinstance(histogram, ExponentialHistogram)
    assert histogram.aggregation_temporality == AggregationTemporality.DELTA
    first = histogram.data_points[0]
    assert (first.start_time_unix_nano, first.time_unix_nano) == (T0, T0 + W)
    assert (first.count, first.zero_count) == (3, 1)
    quantiles = metrics[names.FLEET_OFU_QUANTILE.name]
    assert isinstance(quantiles, Gauge)
    assert {(p.attributes or {}).get(names.QUANTILE) for p in quantiles.data_points} == set(names.QUANTILES)
    gpus = metrics[names.FLEET_GPUS.name]
    assert isinstance(gpus, Gauge)
    assert [p.value for p in gpus.data_points] == [3, 3]
    job_ofu = metrics[names.JOB_OFU.name]
    assert isinstance(job_ofu, Gauge)
    # the MFU-only job sends no job.ofu, the job with GPUs does, with its identity
    assert dict(job_ofu.data_points[0].attributes or {}) == {
        names.JOB_ID: "j1",
        names.JOB_NAME: "train",
        names.HW_MODEL: "NVIDIA H100 80GB HBM3",
        names.GPU_PRECISION: "bf16",
    }
    assert {p.attributes[names.JOB_ID] for p in job_ofu.data_points} == {"j1"}  # type: ignore[index]
    miscount = metrics[names.JOB_FLOPS_MISCOUNT.name]
    assert isinstance(miscount, Gauge)
    # the MFU-only job has no OFU to compare with: its miscount flag cannot be assessed, so is absent
    assert {p.attributes[names.JOB_ID] for p in miscount.data_points} == {"j1"}  # type: ignore[index]
    # one pair: no correlation yet in window 0
    correlation = metrics[names.JOB_OFU_MFU_CORRELATION.name]
    assert isinstance(correlation, Gauge)
    assert [p.time_unix_nano for p in correlation.data_points] == [T0 + 2 * W]
    assert names.FLEET_OFU_MFU_MAE.name in metrics
    # the outputs a merge tier also reads (the histograms with each group's GPU count, the fleet's loss sums) are
    # the only partial ones
    merged_outputs = {
        names.FLEET_OFU.name,
        names.FLEET_GPUS.name,
        names.FLEET_GPU_TIME_LOST.name,
        names.FLEET_ENERGY.name,
    }
    assert not any(is_partial_metric(name) for name in metrics if name not in merged_outputs)


def test_partial_gauges_only_in_shard_mode() -> None:
    reports = _shard_reports()
    plain = _metrics(reports_to_metrics_data(reports, resource_attributes={}, include_partials=False))
    shard = _metrics(reports_to_metrics_data(reports, resource_attributes={}, include_partials=True))
    partial_names = {spec.name for spec in names.COLLECTOR_PARTIAL_METRICS}
    assert not partial_names & set(plain)
    assert partial_names <= set(shard)
    assert all(is_partial_metric(name) for name in partial_names)
    assert is_partial_metric(names.FLEET_OFU.name)
    assert not is_partial_metric(names.JOB_OFU.name)
    assert not is_partial_metric(names.FLEET_OFU_QUANTILE.name)
    assert is_merge_recomputed_metric(names.FLEET_OFU_QUANTILE.name)
    assert not is_merge_recomputed_metric(names.JOB_FLOPS_MISCOUNT.name)


def test_no_reports_give_an_empty_resource() -> None:
    data = reports_to_metrics_data([], resource_attributes={}, include_partials=True)
    assert encode_metrics(data).resource_metrics[0].scope_metrics == []


def _shard_reports() -> list[WindowReport]:
    """``_sample_reports`` as a shard closes them (with the partial state its merge tier adds up)."""
    agg = Aggregator(AggregatorConfig(partials=True, price_per_gpu_hour={"default": 2.0}))
    identity = {names.HW_MODEL: "NVIDIA H100 80GB HBM3", names.GPU_PRECISION: "bf16", names.JOB_ID: "j1"}
    for window in range(2):
        for gpu, value in enumerate((0.0, 0.4 + 0.1 * window, 0.5)):
            agg.add_ofu(f"g{gpu}", value, T0 + window * W, T0 + (window + 1) * W, identity)
            agg.add_gpu_inputs(f"g{gpu}", T0 + window * W, T0 + (window + 1) * W, identity, {"gpu.power": 300.0}, {})
        agg.add_mfu("j1", 0.45 + 0.1 * window, T0 + window * W + 40 * S, identity)
        agg.add_mfu("mfu-only", 0.3, T0 + window * W + 40 * S, {names.JOB_ID: "mfu-only"})
    return agg.close_all()


def test_round_trip_through_the_sdk_encoder() -> None:
    reports = _shard_reports()
    request = wire(reports, "shard-a")
    partials = partials_from_request(request)
    assert [(p.start_ns, p.end_ns, p.shard_id) for p in partials] == [
        (r.start_ns, r.end_ns, "shard-a") for r in reports
    ]
    for partial, report in zip(partials, reports, strict=True):
        assert [(dict(g.attributes), g.histogram, g.gpus, g.capacity) for g in partial.groups] == [
            (dict(g.attributes), g.histogram, g.gpus, g.capacity) for g in report.groups
        ]
        assert report.job_parts.keys() == {"j1", "mfu-only"}
        assert partial.jobs == report.job_parts  # doubles travel bit for bit
    # A shard sends no job output of its own: the merge tier computes them from the parts.
    sent = {m.name for rm in request.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
    assert names.JOB_OFU.name not in sent
    assert {names.PARTIAL_JOB.name, names.PARTIAL_WINDOW.name, names.PARTIAL_FLEET_OFU_CAPACITY.name} <= sent


def _request_with(point: metrics_pb2.ExponentialHistogramDataPoint) -> ExportMetricsServiceRequest:
    request = ExportMetricsServiceRequest()
    metric = request.resource_metrics.add().scope_metrics.add().metrics.add()
    metric.name = names.FLEET_OFU.name
    metric.exponential_histogram.data_points.append(point)
    return request


def test_unusable_partials_are_refused() -> None:
    good = metrics_pb2.ExponentialHistogramDataPoint(time_unix_nano=T0 + W, count=2, scale=3, zero_count=1)
    good.positive.offset = -2
    good.positive.bucket_counts.extend([1])
    assert partials_from_request(_request_with(good))[0].groups[0].gpus == 2

    wrong_count = metrics_pb2.ExponentialHistogramDataPoint()
    wrong_count.CopyFrom(good)
    wrong_count.count = 7
    negative = metrics_pb2.ExponentialHistogramDataPoint()
    negative.CopyFrom(good)
    negative.negative.bucket_counts.extend([1])
    bad_scale = metrics_pb2.ExponentialHistogramDataPoint()
    bad_scale.CopyFrom(good)
    bad_scale.scale = 99
    huge_offset = metrics_pb2.ExponentialHistogramDataPoint()
    huge_offset.CopyFrom(good)
    huge_offset.positive.offset = 2**30
    for bad in (wrong_count, negative, bad_scale, huge_offset):
        with pytest.raises(ValueError):  # noqa: PT011 - each says why in its own words
            partials_from_request(_request_with(bad))


def _job_partial_points(request: ExportMetricsServiceRequest) -> Any:
    for metric in request.resource_metrics[0].scope_metrics[0].metrics:
        if metric.name == names.PARTIAL_JOB.name:
            return metric.gauge.data_points
    raise AssertionError("no job.partial points")


def test_a_jobs_partial_sums_must_be_whole_and_known() -> None:
    twice = wire(_shard_reports(), "s")
    points = _job_partial_points(twice)
    points.add().CopyFrom(points[0])
    with pytest.raises(ValueError, match="twice"):
        partials_from_request(twice)
    unknown = wire(_shard_reports(), "s")
    fields = [
        kv.value for point in _job_partial_points(unknown) for kv in point.attributes if kv.key == names.PARTIAL_FIELD
    ]
    lost = next(value for value in fields if value.string_value.startswith(names.PartialField.LOST))
    lost.string_value = names.PartialField.LOST + "cosmic_rays"
    with pytest.raises(ValueError, match="unknown cause"):
        partials_from_request(unknown)


def test_a_window_without_jobs_round_trips() -> None:
    agg = Aggregator(AggregatorConfig(partials=True))
    agg.add_ofu("g", 0.5, T0, T0 + 30 * S, {names.HW_MODEL: "X"})
    (partial,) = partials_from_request(wire(agg.close_all(), "s"))
    assert partial.jobs == {}
    assert partial.groups[0].gpus == 0.5


def test_a_jobs_partial_points_in_their_order() -> None:
    """Every field of a job's window, each once, in the order a shard sends them: identity first, the field, then
    the cost points' currency (the order of the points and of their attributes is what goes on the wire)."""
    sums = JobSums(
        gpu_time_s=120.0,
        useful_s=60.0,
        lost_s={"idle": 40.0, "clock": 20.0},
        energy_j=9000.0,
        flops=5e15,
        flops_energy_j=8000.0,
        cost=0.25,
        cost_lost={"idle": 0.08},
        emissions_kg=0.002,
        currency="EUR",
        context={"dram": (30.0, 120.0)},
    )
    part = JobWindow(
        sums=sums,
        point_ofu=(0.3, 0.5),
        mfu=(0.8, 2),
        gpus=2.0,
        idle_gpus={"gpu-b": 0.5},
        attributes={names.GPU_PRECISION: "bf16", names.JOB_NAME: "train", "other": "dropped"},
        models=frozenset({"H100", "A100"}),
        stalled_gpus={"gpu-a": 0.25},
        moving_gpus=1.5,
        idle_s=12.0,
        checkpoint_s=3.0,
        steps={2_000: 11.0, 1_000: 10.0},
    )
    job = {names.JOB_ID: "j1", names.JOB_NAME: "train", names.GPU_PRECISION: "bf16"}
    eur = {names.PARTIAL_CURRENCY: "EUR"}
    expected = [
        ("gpu_time", 120.0, {}),
        ("useful", 60.0, {}),
        ("lost.idle", 40.0, {}),
        ("lost.clock", 20.0, {}),
        ("energy", 9000.0, {}),
        ("flops", 5e15, {}),
        ("flops_energy", 8000.0, {}),
        ("cost", 0.25, eur),
        ("cost_lost.idle", 0.08, eur),
        ("emissions", 0.002, {}),
        ("context.dram", 30.0, {}),
        ("context_weight.dram", 120.0, {}),
        ("point_ofu", 0.3, {}),
        ("point_ofu_weight", 0.5, {}),
        ("mfu_sum", 0.8, {}),
        ("mfu_count", 2, {}),
        ("gpus", 2.0, {}),
        ("idle_gpu.gpu-b", 0.5, {}),
        ("model.A100", 1.0, {}),
        ("model.H100", 1.0, {}),
        ("stalled_gpu.gpu-a", 0.25, {}),
        ("moving_gpus", 1.5, {}),
        ("idle_s", 12.0, {}),
        ("checkpoint_s", 3.0, {}),
        ("step.1000", 10.0, {}),
        ("step.2000", 11.0, {}),
    ]
    points = list(job_points("j1", part))
    assert [(list(a.items()), v) for a, v in points] == [
        ([*job.items(), (names.PARTIAL_FIELD, field), *extra.items()], value) for field, value, extra in expected
    ]
    # A window without sums sends only what it has; a job without time on its points, no point_ofu.
    assert [a[names.PARTIAL_FIELD] for a, _ in job_points("j2", JobWindow(gpus=1.0))] == ["gpus"]
