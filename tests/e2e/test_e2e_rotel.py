"""End to end through a real third-party OpenTelemetry collector: the pipeline-stage deployment.

    producer, training MFU, an unrelated app --OTLP gRPC--> Rotel (agent) --OTLP gRPC, gzip--> otel-ofu
    collector --OTLP gRPC--> downstream receiver (OtlpSink)

Rotel is the Rust collector that the ``rotel`` wheel ships (a dev extra); it stands in for the OpenTelemetry
Collector, which cannot be installed here. The demo fleet runs on a manual clock, 10 s per interval, for
250 simulated seconds; after each interval the test waits (bounded poll) until the collector has taken
every point Rotel was given, then closes due 60 s windows, so the run is deterministic however Rotel batches.

Checked downstream: the aggregates of the last window (240 s) arrive with the collector's resource and the
values the collector computed (fleet median per group, every job's OFU, the flags: the MoE job's FLOP
miscount is up after three windows, every other job's flags are 0); the producer's inputs are consumed,
not forwarded; and a foreign metric (``app.requests`` of another service) comes out of the otel-ofu stage
exactly as it went into Rotel: same resource, scope, name, unit, temporality, attributes, values and times.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.sdk.metrics.export import (
    MetricExportResult,
    MetricsData,
    NumberDataPoint,
)
from opentelemetry.sdk.resources import Resource

from otel_ofu import names
from otel_ofu.clock import ManualClock
from otel_ofu.mfu.timed import TimedMfu, timed_mfu_metrics_data
from otel_ofu.producer import Producer
from otel_ofu.producer.exporters import otlp_exporter
from otel_ofu.sources.simulated import SimulatedFleet
from otel_ofu.testing.otlp_sink import OtlpSink, unused_port
from otel_ofu_collector.config import AggregatorConfig
from otel_ofu_collector.otlp.decode import GPU_INPUT_NAMES
from otel_ofu_collector.outputs.consumer import CallbackConsumer
from otel_ofu_collector.results import WindowReport
from otel_ofu_collector.service import CollectorOptions, CollectorService
from tests.e2e.helpers import StartProcess, app_requests, attributes, port_open

WINDOW_S = 60.0
INTERVAL_S = 10.0
LATENESS_S = INTERVAL_S
RUN_S = 250.0  # closes the windows ending at 60, 120, 180 and 240 s
LAST_WINDOW_S = 240
ROTEL_BATCH_TIMEOUT = "50ms"  # Rotel holds a batch this long before it exports
DELIVERY_WAIT_S = 15.0  # bound on each wait for Rotel and the collector's downstream delivery

MIS_COUNT_JOB = "job-1003"
APP_SERVICE = "checkout"


def wait_until_received(service: CollectorService, expected: int) -> None:
    """Bounded poll until the collector has decoded ``expected`` points: Rotel exports on its own schedule."""
    deadline = time.monotonic() + DELIVERY_WAIT_S
    stats = service.decoder.stats
    while stats.accepted + stats.rejected < expected:
        if time.monotonic() > deadline:
            pytest.fail(
                f"the collector got {stats.accepted + stats.rejected} of {expected} points within {DELIVERY_WAIT_S:g} s"
            )
        time.sleep(0.01)


def points_of(data: MetricsData, name: str) -> int:
    return sum(
        len(metric.data.data_points)
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for metric in sm.metrics
        if metric.name == name
    )


def app_metrics_data(end_ns: int, requests: int) -> MetricsData:
    """Another service's counter, with attributes of its own on the resource and the points."""
    resource = Resource({names.SERVICE_NAME: APP_SERVICE, "deployment.environment.name": "e2e", "k8s.pod.name": "c-1"})
    points = [
        NumberDataPoint(
            attributes={"http.route": route, "http.response.status_code": status},
            start_time_unix_nano=end_ns - 250 * 10**9,
            time_unix_nano=end_ns,
            value=value,
        )
        for route, status, value in (("/cart", 200, requests), ("/cart", 503, 3), ("/pay", 200, requests // 2))
    ]
    return app_requests(resource, points)


def downstream_metrics(sink: OtlpSink) -> Iterator[tuple[Any, Any, Any]]:
    """(resource_metrics, scope_metrics, metric) of everything the downstream received."""
    for request in sink.requests():
        for rm in request.resource_metrics:
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    yield rm, sm, metric


def window_gauges(sink: OtlpSink, name: str, end_ns: int) -> list[tuple[dict[str, Any], float, dict[str, Any]]]:
    """(point attributes, value, resource attributes) of gauge ``name`` for the window ending at ``end_ns``."""
    return [
        (
            attributes(point.attributes),
            float(getattr(point, point.WhichOneof("value"))),
            attributes(rm.resource.attributes),
        )
        for rm, _sm, metric in downstream_metrics(sink)
        if metric.name == name
        for point in metric.gauge.data_points
        if point.time_unix_nano == end_ns
    ]


@pytest.fixture
def sink() -> Iterator[OtlpSink]:
    with OtlpSink.start() as started:
        yield started


@pytest.fixture
def collector(sink: OtlpSink) -> Iterator[tuple[CollectorService, ManualClock, list[WindowReport]]]:
    clock = ManualClock()
    reports: list[WindowReport] = []
    options = CollectorOptions(
        aggregator=AggregatorConfig(window_s=WINDOW_S, lateness_s=LATENESS_S),
        grpc_listen="127.0.0.1:0",
        export_endpoint=sink.grpc_endpoint,
        export_protocol="grpc",
        flush_interval_s=0,  # the test closes windows by flushing at simulated times
        initial_backoff_s=0.1,
    )
    service = CollectorService(options, clock=clock, consumers=[CallbackConsumer(reports.extend)], environ={})
    service.start()
    yield service, clock, reports
    service.stop(grace=2.0)


def test_rotel_forwards_to_the_collector_stage_which_adds_aggregates_and_passes_the_rest(
    rotel_binary: Path,
    start_process: StartProcess,
    sink: OtlpSink,
    collector: tuple[CollectorService, ManualClock, list[WindowReport]],
    tmp_path: Path,
) -> None:
    service, clock, reports = collector
    grpc_port, http_port = unused_port(), unused_port()
    start_process(
        [
            str(rotel_binary),
            "start",
            f"--otlp-grpc-endpoint=127.0.0.1:{grpc_port}",
            f"--otlp-http-endpoint=127.0.0.1:{http_port}",
            "--exporter=otlp",
            f"--otlp-exporter-endpoint=http://127.0.0.1:{service.ports['grpc']}",
            "--otlp-exporter-protocol=grpc",
            f"--batch-timeout={ROTEL_BATCH_TIMEOUT}",
            "--otlp-exporter-retry-initial-backoff=100ms",
            f"--pid-file={tmp_path / 'rotel.pid'}",
            f"--log-file={tmp_path / 'rotel-agent.log'}",
        ],
        "rotel",
        lambda: port_open(grpc_port),
    )
    rotel = f"http://127.0.0.1:{grpc_port}"

    fleet = SimulatedFleet.demo(seed=7, clock=clock)
    producer = Producer(source=fleet, exporter=otlp_exporter(protocol="grpc", endpoint=rotel), clock=clock)
    mfu_exporter = otlp_exporter(protocol="grpc", endpoint=rotel)
    app_exporter = otlp_exporter(protocol="grpc", endpoint=rotel)
    start_ns = clock()
    expected_points = 0
    app_data = app_metrics_data(start_ns + round(RUN_S * 1e9), 1234)
    try:
        while clock() - start_ns < round(RUN_S * 1e9):
            interval_start = clock()
            clock.advance(INTERVAL_S)
            data = producer.run_once()
            # the OFU points and the loss inputs beside them: every point the collector takes
            expected_points += sum(points_of(data, name) for name in (names.GPU_OFU.name, *sorted(GPU_INPUT_NAMES)))
            assert producer.worker is not None
            assert producer.worker.flush(10.0)
            mfu = [
                TimedMfu(job.job_id, value, interval_start, clock(), {names.JOB_NAME: job.name})
                for job in fleet.jobs
                if (value := fleet.reported_mfu(job.job_id, interval_start, clock())) is not None
            ]
            assert mfu_exporter.export(timed_mfu_metrics_data(mfu)) is MetricExportResult.SUCCESS
            expected_points += len(mfu)
            wait_until_received(service, expected_points)
            service.flush(clock())
        assert app_exporter.export(app_data) is MetricExportResult.SUCCESS

        last_end = start_ns + LAST_WINDOW_S * 10**9
        assert reports
        assert reports[-1].end_ns == last_end
        assert service.decoder.stats.rejected == 0
        assert service.decoder.stats.accepted == expected_points

        def arrived(sink: OtlpSink) -> bool:
            names_seen = {metric.name for _rm, _sm, metric in downstream_metrics(sink)}
            return "app.requests" in names_seen and bool(window_gauges(sink, names.JOB_FLOPS_MISCOUNT.name, last_end))

        assert sink.wait_for(arrived, timeout=DELIVERY_WAIT_S), "aggregates or app.requests never reached downstream"
    finally:
        producer.close()
        mfu_exporter.shutdown()
        app_exporter.shutdown()

    last = reports[-1]

    # Aggregates: the last window's values, as the collector computed them, with its resource.
    medians = {
        (point[names.HW_MODEL], point[names.GPU_PRECISION]): (value, resource[names.SERVICE_NAME])
        for point, value, resource in window_gauges(sink, names.FLEET_OFU_QUANTILE.name, last_end)
        if point[names.QUANTILE] == 0.5
    }
    assert medians == {
        (group.attributes[names.HW_MODEL], group.attributes[names.GPU_PRECISION]): (
            group.quantiles[0.5],
            names.COLLECTOR_SERVICE_NAME,
        )
        for group in last.groups
    }
    assert len(medians) == 2  # bf16, and job-1005 in its fp8 phase (180 s - 360 s)
    job_ofu = {point[names.JOB_ID]: value for point, value, _ in window_gauges(sink, names.JOB_OFU.name, last_end)}
    assert job_ofu == {job.job_id: job.ofu for job in last.jobs}
    assert set(job_ofu) == {job.job_id for job in fleet.jobs}
    assert all(0.0 <= value <= 1.0 for value in job_ofu.values())
    miscount = {
        point[names.JOB_ID]: value for point, value, _ in window_gauges(sink, names.JOB_FLOPS_MISCOUNT.name, last_end)
    }
    # the idle notebook reports no MFU: its miscount flag cannot be assessed, so is absent (not 0)
    expected = {job.job_id: 1.0 if job.job_id == MIS_COUNT_JOB else 0.0 for job in fleet.jobs if job.reports_mfu}
    assert miscount == expected
    regression = {
        point[names.JOB_ID]: value for point, value, _ in window_gauges(sink, names.JOB_OFU_REGRESSION.name, last_end)
    }
    # a run this short gives no job the baseline windows a regression is judged against: absent, not 0
    assert regression == {}
    # Every closed window reached the downstream, not only the last.
    ends = {
        point.time_unix_nano
        for _rm, _sm, m in downstream_metrics(sink)
        if m.name == names.JOB_OFU.name
        for point in m.gauge.data_points
    }
    assert ends == {report.end_ns for report in reports}

    # The stage consumes its inputs: none of them is forwarded.
    forwarded = {metric.name for _rm, _sm, metric in downstream_metrics(sink)}
    assert not forwarded & {names.GPU_OFU.name, names.JOB_MFU.name, *(spec.name for spec in names.PRODUCER_METRICS)}

    # The foreign metric passes through untouched.
    sent = encode_metrics(app_data).resource_metrics[0]
    received = [(rm, sm, metric) for rm, sm, metric in downstream_metrics(sink) if metric.name == "app.requests"]
    assert len(received) == 1
    rm, sm, metric = received[0]
    assert attributes(rm.resource.attributes) == attributes(sent.resource.attributes)
    assert (sm.scope.name, sm.scope.version) == (sent.scope_metrics[0].scope.name, sent.scope_metrics[0].scope.version)
    assert metric == sent.scope_metrics[0].metrics[0]
