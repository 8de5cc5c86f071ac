"""End to end with a real Prometheus: simulated fleet -> producer -> OTLP gRPC -> collector -> /metrics -> PromQL.

The demo fleet (SimulatedFleet.demo) runs on a manual clock, 10 s per producer interval, through the real
producer and its SDK gRPC exporter into the collector on loopback; the training side sends each job's
reported MFU as ``job.mfu`` with the interval's simulated timestamps. The collector closes 60 s windows
when the test flushes it, so simulated time runs as fast as the machine allows; Prometheus (Debian's
binary, a temporary config and TSDB, loopback only) scrapes the collector's /metrics every second.

At two checkpoints the test holds the last closed window on the endpoint, waits (bounded poll of the
query API) until Prometheus has scraped it, and checks through PromQL against the ground truth:

* before job-1004 regresses (last window (300 s, 360 s]): its regression flag is 0, the MoE job's
  miscount flag is already 1 (3 windows of MFU > 1.5 x OFU), every other flag 0;
* after (last window (540 s, 600 s]): job-1004's regression flag is 1, the flags are otherwise as
  before, and the fleet median OFU per group and every job's OFU match the truth.

Ground truth is the simulator's own OFU of the readings that were sent (``GpuReading.truth_ofu``, exact
TPA x mean clock, which no real GPU gives), aggregated as the collector does it: per GPU the time-weighted mean
in the window, the group median over GPUs, the job mean over its GPUs.
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import pytest
from opentelemetry.sdk.metrics.export import MetricExportResult, MetricsData

from otel_ofu import names
from otel_ofu.clock import ManualClock
from otel_ofu.mfu.timed import TimedMfu, timed_mfu_metrics_data
from otel_ofu.model import GpuReading, Snapshot
from otel_ofu.producer import Producer
from otel_ofu.producer.exporters import otlp_exporter
from otel_ofu.sources.simulated import ProfileKind, SimulatedFleet
from otel_ofu_collector.config import AggregatorConfig
from otel_ofu_collector.outputs.prometheus import prometheus_name
from otel_ofu_collector.service import CollectorOptions, CollectorService
from tests.e2e.helpers import PrometheusApi, StartProcess, prometheus_config, start_prometheus

WINDOW_S = 60.0
INTERVAL_S = 10.0
LATENESS_S = INTERVAL_S  # every interval of a window is in before the window may close
DEMO_DURATION_S = 900.0  # the demo places job-1004's 2.5x regression at 40% of this: 360 s
BEFORE_REGRESSION_S = 370.0  # flushing here closes (300 s, 360 s]: the last window before the regression
END_S = 610.0  # closes (540 s, 600 s]: four windows after it

# Tolerances. OFU: the producer point-samples the SM clock at the end of each interval where the truth uses
# the mean clock, so a throttle stretch starting mid-interval shifts one sample by up to ~15% of a GPU's OFU;
# over six samples per window the worst error seen with this seed is 0.003 (job and median). Prometheus
# stores the float as sent. Flags are exact.
OFU_TOLERANCE = 0.01
PROMETHEUS_SCRAPE_S = 1.0
SCRAPE_WAIT_S = 15.0  # a bounded wait for a fresh scrape: a few scrape intervals plus start-up jitter

MIS_COUNT_JOB = "job-1003"  # MoE, framework over-counts FLOPs 2x
REGRESSING_JOB = "job-1004"


@attrs.define
class RecordingSource:
    """The simulated fleet, keeping every snapshot the producer read (the ground truth travels with them)."""

    fleet: SimulatedFleet
    snapshots: list[Snapshot] = attrs.field(factory=list)
    name: str = "sim-recorded"

    def read(self) -> Snapshot:
        snapshot = self.fleet.read()
        self.snapshots.append(snapshot)
        return snapshot

    def close(self) -> None:
        self.fleet.close()


@attrs.frozen
class WindowTruth:
    medians: Mapping[tuple[str, str], float]  # (hw.model, gpu.precision) -> median per-GPU OFU
    job_ofu: Mapping[str, float]


def window_truth(snapshots: Sequence[Snapshot], start_ns: int, end_ns: int) -> WindowTruth:
    """The collector's window aggregation applied to the true OFU of the readings that were sent."""
    per_gpu: dict[str, list[GpuReading]] = defaultdict(list)
    for snapshot in snapshots:
        for reading in snapshot.readings:
            if start_ns < reading.end_ns <= end_ns:
                per_gpu[reading.gpu.key].append(reading)
    groups: dict[tuple[str, str], list[float]] = defaultdict(list)
    jobs: dict[str, list[float]] = defaultdict(list)
    for readings in per_gpu.values():
        assert all(r.truth_ofu is not None and r.truth_precision is not None for r in readings)
        weights = [min(r.end_ns, end_ns) - max(r.start_ns, start_ns) for r in readings]
        ofu = sum(w * (r.truth_ofu or 0.0) for w, r in zip(weights, readings, strict=True)) / sum(weights)
        latest = max(readings, key=lambda r: r.end_ns)
        groups[(latest.gpu.model, latest.truth_precision or "")].append(ofu)
        jobs[latest.gpu.hints[names.JOB_ID]].append(ofu)
    return WindowTruth(
        medians={group: statistics.median(values) for group, values in groups.items()},
        job_ofu={job: statistics.fmean(values) for job, values in jobs.items()},
    )


def reported_mfu(fleet: SimulatedFleet, start_ns: int, end_ns: int) -> MetricsData:
    """What the training frameworks report for the interval: ``job.mfu`` with ``job.id``, simulated times."""
    points = [
        TimedMfu(job.job_id, mfu, start_ns, end_ns, {names.JOB_NAME: job.name})
        for job in fleet.jobs
        if (mfu := fleet.reported_mfu(job.job_id, start_ns, end_ns)) is not None
    ]
    return timed_mfu_metrics_data(points)


def wait_for_scrape_after(prometheus: PrometheusApi, metrics: Sequence[str], wall_s: float) -> None:
    """Bounded poll until every series of ``metrics`` comes from a scrape that started after ``wall_s``.

    A series the collector stopped showing gets Prometheus' staleness marker at that scrape and drops
    out of the selector, so the oldest sample time covers exactly the series shown now.
    """
    deadline = time.monotonic() + SCRAPE_WAIT_S
    for metric in metrics:
        oldest: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            oldest = prometheus.query(f"min(timestamp({metric}))")
            if oldest and float(oldest[0]["value"][1]) > wall_s:
                break
            time.sleep(0.1)
        else:
            pytest.fail(f"Prometheus did not scrape {metric} after {wall_s:.3f} within {SCRAPE_WAIT_S:g} s: {oldest}")


@pytest.fixture
def collector(tmp_path: Path) -> Iterator[tuple[CollectorService, ManualClock]]:
    clock = ManualClock()
    options = CollectorOptions(
        aggregator=AggregatorConfig(window_s=WINDOW_S, lateness_s=LATENESS_S),
        grpc_listen="127.0.0.1:0",
        prometheus_port=0,
        prometheus_host="127.0.0.1",
        flush_interval_s=0,  # the test closes windows by flushing at simulated times
    )
    service = CollectorService(options, clock=clock, environ={})
    service.start()
    yield service, clock
    service.stop(grace=1.0)


def test_prometheus_sees_fleet_median_job_ofu_and_flags(
    prometheus_binary: Path,
    start_process: StartProcess,
    collector: tuple[CollectorService, ManualClock],
    tmp_path: Path,
) -> None:
    service, clock = collector
    config = prometheus_config("otel-ofu-collector", service.ports["prometheus"], PROMETHEUS_SCRAPE_S)
    prometheus = start_prometheus(start_process, prometheus_binary, tmp_path, config)

    fleet = SimulatedFleet.demo(seed=7, clock=clock, duration_s=DEMO_DURATION_S)
    source = RecordingSource(fleet)
    endpoint = f"http://127.0.0.1:{service.ports['grpc']}"
    producer = Producer(source=source, exporter=otlp_exporter(protocol="grpc", endpoint=endpoint), clock=clock)
    mfu_exporter = otlp_exporter(protocol="grpc", endpoint=endpoint)
    start_ns = clock()
    expected_jobs = {job.job_id for job in fleet.jobs}
    # A job that never reported MFU has no miscount value: absent, not 0.
    mfu_jobs = {job.job_id for job in fleet.jobs if job.reports_mfu}
    # The idle notebook's GPUs are idle every window: an idle allocation (job.gpus.idle), never assessed as a
    # regression, so its regression flag is absent, not 0.
    assessed = {job.job_id for job in fleet.jobs if job.kind != ProfileKind.IDLE}

    def run_until(simulated_s: float) -> int:
        """Produce up to ``simulated_s``; each interval is delivered, then due windows close, as the service's
        timer would close them. Returns the end of the last window closed: the one /metrics now shows."""
        last_end = 0
        while clock() - start_ns < round(simulated_s * 1e9):
            interval_start = clock()
            clock.advance(INTERVAL_S)
            producer.run_once()
            assert producer.worker is not None
            assert producer.worker.flush(10.0)
            assert mfu_exporter.export(reported_mfu(fleet, interval_start, clock())) is MetricExportResult.SUCCESS
            reports = service.flush(clock())
            assert len(reports) <= 1
            last_end = reports[-1].end_ns if reports else last_end
        return last_end

    def flags(spec: names.MetricSpec) -> dict[str, float]:
        return prometheus.by_label(prometheus_name(spec.name), "job_id")

    try:
        # Checkpoint 1: the last window before the regression.
        window_end = run_until(BEFORE_REGRESSION_S)
        assert window_end - start_ns == 360 * 10**9
        published = time.time()
        asserted = (names.JOB_OFU, names.JOB_FLOPS_MISCOUNT, names.JOB_OFU_REGRESSION, names.FLEET_OFU_QUANTILE)
        selector = [prometheus_name(spec.name) for spec in asserted]
        wait_for_scrape_after(prometheus, selector, published)
        miscount = flags(names.JOB_FLOPS_MISCOUNT)
        regression = flags(names.JOB_OFU_REGRESSION)
        assert set(regression) == assessed
        assert set(miscount) == mfu_jobs
        assert miscount == {job: 1.0 if job == MIS_COUNT_JOB else 0.0 for job in mfu_jobs}
        assert regression == dict.fromkeys(assessed, 0.0)

        # Checkpoint 2: four windows into the regression.
        window_end = run_until(END_S)
        assert window_end - start_ns == 600 * 10**9
        published = time.time()
        wait_for_scrape_after(prometheus, selector, published)
        miscount = flags(names.JOB_FLOPS_MISCOUNT)
        regression = flags(names.JOB_OFU_REGRESSION)
        assert miscount == {job: 1.0 if job == MIS_COUNT_JOB else 0.0 for job in mfu_jobs}
        assert regression == {job: 1.0 if job == REGRESSING_JOB else 0.0 for job in assessed}

        truth = window_truth(source.snapshots, window_end - round(WINDOW_S * 1e9), window_end)
        job_ofu = prometheus.by_label(prometheus_name(names.JOB_OFU.name), "job_id")
        assert set(job_ofu) == set(truth.job_ofu) == expected_jobs
        for job, value in job_ofu.items():
            assert value == pytest.approx(truth.job_ofu[job], abs=OFU_TOLERANCE), job
        # The regressed job really is at its regressed level (not merely flagged): 2.5x below its start.
        before = fleet.truth_ofu(REGRESSING_JOB, start_ns, start_ns + 300 * 10**9)
        assert before is not None
        assert job_ofu[REGRESSING_JOB] < 0.5 * before

        medians_query = f'{prometheus_name(names.FLEET_OFU_QUANTILE.name)}{{{names.PROMETHEUS_QUANTILE_LABEL}="0.5"}}'
        medians = {
            (item["metric"]["hw_model"], item["metric"]["gpu_precision"]): float(item["value"][1])
            for item in prometheus.query(medians_query)
        }
        assert set(medians) == set(truth.medians)
        assert len(medians) == 2  # bf16, and job-1005 in its fp8 phase (540 s - 720 s)
        for group, value in medians.items():
            assert value == pytest.approx(truth.medians[group], abs=OFU_TOLERANCE), group
    finally:
        producer.close()
        mfu_exporter.shutdown()
