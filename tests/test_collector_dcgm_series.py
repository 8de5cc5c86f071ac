"""dcgm-exporter's series through an OpenTelemetry Collector's Prometheus receiver: the collector computes each GPU's
OFU as the producer would have (``otel_ofu_collector.otlp.dcgm_series``, in front of the decoder).

The hand-worked page, tests/data/dcgm_exporter_h100_node_written.prom (three H100 80GB HBM3 of one node, the real
DigitalOcean H100 label set, dcgm-exporter 3.x field names; SM clock in MHz, no max clock, as the default counters
file prints them), worked from the catalog's H100 SXM clocks (tensor clock 1830 MHz, board max 1980 MHz):

- GPU 0: tensor active 0.5 at 1755 MHz: OFU = 0.5 x 1755 / 1830 = 0.479508..., raw OFU = 0.5 x 1755 / 1980 = 0.443181...
- GPU 1: tensor active 0.25 at 1980 MHz, above the tensor clock, whose ratio is capped at 1: OFU = 0.25; raw OFU =
  0.25 x 1980 / 1980 = 0.25
- GPU 2: no tensor activity on the page (profiling off): no OFU, its time unmeasured; its clock still 345 MHz.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.sdk.resources import Resource

from otel_ofu import cli, names
from otel_ofu.attribution.kubernetes_pods import cluster_pods_url
from otel_ofu.gpu_samples import compute_snapshot
from otel_ofu.gpu_values import CalibrationTable
from otel_ofu.producer.metrics_data import MetricsDataBuilder
from otel_ofu.producer.otlp_encoding import encode_request
from otel_ofu.sources.dcgm_exporter import DcgmExporterSource
from otel_ofu.testing.fake_kubernetes import FakeApiServer, owner, serve
from otel_ofu.testing.fake_kubernetes import pod as fake_pod
from otel_ofu.testing.otlp_requests import gpu_request
from otel_ofu.testing.prometheus_receiver import add_scrape, scrape_request
from otel_ofu_collector.command import dcgm_attribution
from otel_ofu_collector.otlp.dcgm_series import DcgmSeries
from otel_ofu_collector.service import CollectorOptions, CollectorService
from tests.exporter_server import ExporterServer, serving
from tests.test_collector_command_options import built, usage_error
from tests.test_collector_write_ahead import spooled

S = 1_000_000_000
T0 = 1_000_000_000_000 + 20 * S  # the producer's first read with Ticks (built at +10 s, read at +20 s)
GPU0 = "GPU-927d7444-b45a-7c49-8402-5e686e46a026"
GPU1 = "GPU-3f1c2a9e-5d47-4b6e-9a0c-7e2b8d1f6a53"
GPU2 = "GPU-b83e0f27-9c1d-4a5b-8e6f-0d2c4a7b9e18"
OFU = names.GPU_OFU.name
RAW = names.GPU_OFU_RAW.name


@pytest.fixture
def page(shared_fixtures: Path) -> str:
    return (shared_fixtures / "dcgm_exporter_h100_node_written.prom").read_text()


@pytest.fixture
def exporter() -> Iterator[ExporterServer]:
    with serving() as server:
        yield server


def _text(value: Any) -> Any:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind is not None else None


def gpus(request: ExportMetricsServiceRequest) -> dict[str, dict[str, Any]]:
    """hw.id -> its Resource's attributes and, per metric, its points as (start, time, value, attributes)."""
    found: dict[str, dict[str, Any]] = {}
    for rm in request.resource_metrics:
        attributes = {kv.key: _text(kv.value) for kv in rm.resource.attributes}
        if names.HW_ID not in attributes:
            continue
        gpu = found.setdefault(str(attributes[names.HW_ID]), {"resource": attributes})
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                data = getattr(metric, str(metric.WhichOneof("data")))
                gpu[metric.name] = [
                    (
                        p.start_time_unix_nano,
                        p.time_unix_nano,
                        p.as_double or p.as_int,
                        {kv.key: _text(kv.value) for kv in p.attributes},
                    )
                    for p in data.data_points
                ]
    return found


def value(gpu: dict[str, Any], metric: str) -> float:
    (point,) = gpu[metric]
    return float(point[2])


def translate_two_scrapes(
    page: str, stage: DcgmSeries | None = None, later: str | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The GPUs of a scrape of ``page`` at T0 and of ``later`` (default: the same page) 10 s after."""
    stage = stage or DcgmSeries()
    found = []
    for k, text in enumerate((page, later or page)):
        translated = stage.translate(scrape_request(text, time_ns=T0 + k * 10 * S), None)
        assert translated is not None
        assert translated.refusals == ()
        found.append(gpus(translated.request))
    return found[0], found[1]


def test_hand_worked_ofu_of_two_gpus_and_the_unmeasured_third(page: str) -> None:
    # 10 s later GPU 0's energy counter has gone 4125 J further (412.5 W x 10 s).
    _, found = translate_two_scrapes(page, later=page.replace("} 123456789\n", "} 127581789\n"))
    assert set(found) == {GPU0, GPU1, GPU2}
    # GPU 0: 0.5 x 1755 MHz / 1830 MHz (the H100 SXM tensor clock); raw against the board's 1980 MHz.
    assert value(found[GPU0], OFU) == pytest.approx(0.4795081967213115, rel=1e-12)
    assert value(found[GPU0], RAW) == pytest.approx(0.4431818181818182, rel=1e-12)
    assert value(found[GPU0], names.GPU_CLOCK_SM.name) == 1755e6
    assert value(found[GPU0], names.GPU_CLOCK_SM_MAX.name) == 1980e6  # the catalog's: the page has none
    assert value(found[GPU0], names.GPU_TENSOR_ACTIVE.name) == 0.5
    # GPU 1: at 1980 MHz the clock ratio to the tensor clock is capped at 1.
    assert value(found[GPU1], OFU) == 0.25
    assert value(found[GPU1], RAW) == 0.25
    # GPU 2: no tensor activity on the page: no OFU, its time marked unmeasured, what it did give kept.
    assert OFU not in found[GPU2]
    assert RAW not in found[GPU2]
    (marker,) = found[GPU2][names.GPU_OFU_UNMEASURED.name]
    assert marker[3][names.ERROR_TYPE] == names.ErrorReason.NO_VALUE
    assert value(found[GPU2], names.GPU_CLOCK_SM.name) == 345e6
    # Energy: the counter in mJ, as a cumulative sum in J since the first scrape; power over the interval from it.
    assert value(found[GPU0], names.GPU_ENERGY.name) == pytest.approx(4125.0)
    assert value(found[GPU0], names.GPU_POWER.name) == pytest.approx(412.5)


def test_the_gpus_identity_and_pod_come_from_the_series_labels(page: str) -> None:
    _, found = translate_two_scrapes(page)
    resource = found[GPU0]["resource"]
    assert resource[names.SERVICE_NAME] == names.PRODUCER_SERVICE_NAME
    assert resource[names.HOST_NAME] == "6d6d7dc3ce21"  # the Hostname label, not the scrape target
    assert resource[names.HW_MODEL] == "NVIDIA H100 80GB HBM3"
    assert resource[names.GPU_INDEX] == 0
    assert resource[names.K8S_POD_NAME] == "pretrain-7b-worker-0"
    assert resource[names.K8S_NAMESPACE_NAME] == "llm-train"
    assert resource[names.K8S_CONTAINER_NAME] == "pytorch"
    assert resource[names.JOB_SCHEDULER] == "kubernetes"
    # The scrape target's attributes are the exporter's, not the GPU's: none of them is carried over.
    assert "service.instance.id" not in resource
    assert "server.address" not in resource
    assert names.K8S_POD_NAME not in found[GPU2]["resource"]  # pod="" is no pod


def test_a_reading_covers_the_time_since_the_targets_previous_scrape(page: str) -> None:
    first, second = translate_two_scrapes(page)
    # The first scrape of a target: no start (a point in time, whose interval the windows infer).
    assert first[GPU0][OFU][0][:2] == (T0, T0)
    assert second[GPU0][OFU][0][:2] == (T0, T0 + 10 * S)


@pytest.mark.parametrize("generation", ["3x", "49", "410"])
def test_every_field_name_generation_gives_the_same_ofu(shared_fixtures: Path, generation: str) -> None:
    page = (shared_fixtures / f"dcgm_exporter_h100_generation_{generation}.prom").read_text()
    _, found = translate_two_scrapes(page)
    assert value(found[GPU0], OFU) == pytest.approx(0.5 * 1755 / 1830, rel=1e-12)
    assert value(found[GPU0], RAW) == pytest.approx(0.5 * 1755 / 1980, rel=1e-12)  # the page's own max clock
    assert value(found[GPU0], names.GPU_ENGINE_ACTIVE.name) == 0.9


PAGES = (
    "dcgm_exporter_h100_node_written.prom",
    "dcgm_exporter_h100_generation_3x.prom",
    "dcgm_exporter_h100_generation_49.prom",
    "dcgm_exporter_h100_generation_410.prom",
    "dcgm_exporter_a30_mig_issue68.prom",
    "dcgm_exporter_h100_mig_k8s_issue512.prom",
    "dcgm_exporter_titanv_issue58.prom",
    "dcgm_exporter_h100_digitalocean_docs.prom",
)


@pytest.mark.parametrize("name", PAGES)
def test_the_request_is_the_producers_own_for_the_same_page(
    name: str, shared_fixtures: Path, exporter: ExporterServer
) -> None:
    """One implementation: the producer reading a page from a dcgm-exporter on loopback and the collector reading the
    same page from the receiver's OTLP send the same bytes for the same interval (the second: 10 s after the first,
    the energy counter gone further where the page has one). The producer is opened at its first read, so that its
    first interval is as empty as a target's first scrape (the link counters integrate their rates from there)."""
    page = (shared_fixtures / name).read_text()
    later = re.sub(r"(ENERGY\w*\{[^}]*\}) (\d+(?:\.\d+)?)", lambda m: f"{m[1]} {float(m[2]) * 1.0001!r}", page)
    base = Resource({names.SERVICE_NAME: names.PRODUCER_SERVICE_NAME})
    times = iter((T0, T0, T0 + 10 * S))  # opened, first read, second read
    source = DcgmExporterSource(exporter.serve(page), clock=lambda: next(times))
    builder = MetricsDataBuilder(base=base)
    try:
        source.read()
        exporter.serve(later)
        produced = encode_request(builder.build(compute_snapshot(source.read())))
    finally:
        source.close()
    stage = DcgmSeries()
    stage.translate(scrape_request(page, time_ns=T0), None)
    translated = stage.translate(scrape_request(later, time_ns=T0 + 10 * S), None)
    assert translated is not None
    ours = ExportMetricsServiceRequest()
    ours.resource_metrics.extend(
        rm for rm in translated.request.resource_metrics if any(kv.key == names.HW_ID for kv in rm.resource.attributes)
    )
    assert ours.SerializeToString() == produced


def test_calibration_is_the_producers(page: str) -> None:
    stage = DcgmSeries(calibration=CalibrationTable.parse("model:H100-SXM=0.9"))
    _, found = translate_two_scrapes(page, stage)
    assert value(found[GPU1], OFU) == pytest.approx(0.25 * 0.9)
    assert value(found[GPU1], RAW) == 0.25  # raw OFU: nothing applied


def test_a_real_page_without_a_clock_gives_unmeasured_time_not_a_zero(shared_fixtures: Path) -> None:
    # dcgm-exporter issue 68: an A30 MIG instance with tensor activity 0.022137 and no SM clock on the page.
    page = (shared_fixtures / "dcgm_exporter_a30_mig_issue68.prom").read_text()
    _, found = translate_two_scrapes(page)
    (gpu,) = found.values()
    assert OFU not in gpu
    assert gpu[names.GPU_OFU_UNMEASURED.name]
    assert value(gpu, names.GPU_TENSOR_ACTIVE.name) == 0.022137
    assert gpu["resource"][names.GPU_MIG_PROFILE] == "2g.12gb"
    assert gpu["resource"][names.HOST_NAME] == "dcgm-exporter-sn5rp"


def test_producer_requests_pass_untouched() -> None:
    request = gpu_request({"GPU-1": 0.5}, time_ns=T0)
    assert DcgmSeries().translate(request, request.SerializeToString()) is None
    assert DcgmSeries().translate(request, None) is None


def test_a_scrape_not_after_the_targets_previous_is_refused_and_said(page: str) -> None:
    stage = DcgmSeries()
    stage.translate(scrape_request(page, time_ns=T0 + 10 * S), None)
    again = stage.translate(scrape_request(page, time_ns=T0 + 10 * S), None)
    older = stage.translate(scrape_request(page, time_ns=T0), None)
    for translation in (again, older):
        assert translation is not None
        assert translation.gpus == 0
        (refusal,) = translation.refusals
        assert refusal.code == names.RejectReason.LATE
        assert "dcgm-exporter scrape of dcgm-exporter/10.0.0.7:9400" in refusal.message
    # Another target's scrape at the same time is its own.
    other = stage.translate(scrape_request(page, time_ns=T0 + 10 * S, instance="10.0.0.8:9400"), None)
    assert other is not None
    assert other.gpus == 3
    assert other.refusals == ()


def test_two_scrapes_in_one_request_are_read_in_time_order(page: str) -> None:
    request = ExportMetricsServiceRequest()
    add_scrape(request, page, time_ns=T0 + 10 * S)
    add_scrape(request, page, time_ns=T0)
    translated = DcgmSeries().translate(request, None)
    assert translated is not None
    assert translated.refusals == ()
    assert translated.gpus == 6
    intervals = sorted(point[:2] for rm_gpu in [gpus(translated.request)] for point in rm_gpu[GPU0][OFU])
    assert intervals[-1] == (T0, T0 + 10 * S)


def test_staleness_markers_are_no_readings(page: str) -> None:
    request = scrape_request(page, time_ns=T0)
    for metric in request.resource_metrics[0].scope_metrics[0].metrics:
        if metric.name == "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE":
            for point in metric.gauge.data_points:
                point.flags = 1  # FLAG_NO_RECORDED_VALUE: the series is gone
                point.as_double = float("nan")
    translated = DcgmSeries().translate(request, None)
    assert translated is not None
    found = gpus(translated.request)
    assert all(OFU not in gpu and names.GPU_OFU_UNMEASURED.name in gpu for gpu in found.values())


def test_scrape_targets_are_bounded(page: str) -> None:
    stage = DcgmSeries(max_targets=2)
    for n in range(5):
        stage.translate(scrape_request(page, time_ns=T0, instance=f"10.0.0.{n}:9400"), None)
    assert stage.targets == 2
    assert stage.targets_evicted == 3


def test_the_collector_aggregates_the_translated_gpus(page: str) -> None:
    """Through CollectorService.ingest, as a receiver calls it: the window's GPU OFU is the page's."""
    options = CollectorOptions(grpc_listen=None, flush_interval_s=0, self_telemetry=False)
    service = CollectorService(options, clock=lambda: T0 + 30 * S)
    for k in range(4):  # scrapes at 0, 10, 20, 30 s: the first only a point, the next three 10 s each
        outcome = service.ingest(scrape_request(page, time_ns=T0 + k * 10 * S))
        assert outcome.rejected == 0, outcome.error_message
    reports = service.aggregator.close_all()
    assert reports
    # The window [T0, T0 + 60 s) holds the three 10 s intervals: its H100 group's two GPUs with OFU, and the third's
    # unmeasured time (three GPUs in all, each for 30 of the 60 s: 1.5 GPU equivalents).
    (window,) = [report for report in reports if report.start_ns == T0]
    (group,) = window.groups
    assert group.attributes[names.HW_MODEL] == "NVIDIA H100 80GB HBM3"
    assert group.ofu_max == pytest.approx(0.5 * 1755 / 1830)
    assert group.ofu_min == pytest.approx(0.25)
    assert group.gpus == pytest.approx(1.5)


def test_the_collector_takes_the_producers_calibration_option(capsys: pytest.CaptureFixture[str]) -> None:
    options = built("--calibration", "model:H100-SXM=0.9")
    assert options.calibration.factor("NVIDIA H100 80GB HBM3", None) == 0.9
    assert built().calibration.factor("NVIDIA H100 80GB HBM3", None) == 1.0
    line = usage_error(["--calibration", "model:H100-SXM=1.5"], capsys)
    assert "--calibration" in line
    assert "(0, 1]" in line


# --- jobs: the producer's Kubernetes workload rules, where the collector can read the cluster's pods ------------------


def test_the_clusters_pod_list_url() -> None:
    assert cluster_pods_url(None) is None
    assert cluster_pods_url("off") is None
    assert cluster_pods_url("https://10.0.0.1:6443") == "https://10.0.0.1:6443/api/v1/pods"  # no node's selector
    assert cluster_pods_url("https://10.0.0.1:6443/api/v1/pods") == "https://10.0.0.1:6443/api/v1/pods"


def test_a_gpus_pod_names_its_job_by_the_producers_workload_rules(page: str) -> None:
    """GPU 0 and 1 of the page are held by pod llm-train/pretrain-7b-worker-0, a worker of the PyTorchJob pretrain-7b:
    with the cluster's pods, their job is llm-train/pretrain-7b (the producer's job.id: <namespace>/<workload>)."""
    worker = fake_pod(
        "pretrain-7b-worker-0",
        "llm-train",
        labels={"training.kubeflow.org/job-name": "pretrain-7b", "training.kubeflow.org/replica-type": "worker"},
        owners=[owner("kubeflow.org/v1", "PyTorchJob", "pretrain-7b", "uid-pretrain-7b")],
    )
    with serve(FakeApiServer(pods=[worker])) as api:
        args = cli.build_parser().parse_args(["collector", "--k8s-pods-url", api.url])
        chain = dcgm_attribution(args)
        assert chain is not None
        try:
            stage = DcgmSeries(attribution=chain.attribute)
            _, found = translate_two_scrapes(page, stage)
        finally:
            chain.close()
    assert ("/api/v1/pods", None) in [(path.split("?")[0], auth) for path, auth in api.requests]  # every node's pods
    for gpu in (GPU0, GPU1):
        resource = found[gpu]["resource"]
        assert resource[names.JOB_ID] == "llm-train/pretrain-7b"
        assert resource[names.JOB_NAME] == "pretrain-7b"
    assert names.JOB_ID not in found[GPU2]["resource"]  # no pod holds it
    assert dcgm_attribution(cli.build_parser().parse_args(["collector"])) is None  # off by default: pod labels only


def test_a_restart_replays_the_gpus_read_from_scrapes(page: str, tmp_path: Path) -> None:
    """With a spool, what the write-ahead keeps of a scrape is the request the decoder read, the GPUs' requests
    appended: a collector started on it after a kill rebuilds the open window from it, without the scrapes' pages."""
    spool = tmp_path / "spool.sqlite"
    killed = CollectorService(spooled(spool), clock=lambda: T0 + 30 * S)
    for k in range(4):
        assert killed.ingest(scrape_request(page, time_ns=T0 + k * 10 * S)).rejected == 0
    # Never stopped: its write-ahead holds the accepted requests of the open window, and its spool's lock is dropped
    # as the kernel drops a killed process's.
    assert killed.spool_lock is not None
    killed.spool_lock.release()
    restarted = CollectorService(spooled(spool), clock=lambda: T0 + 30 * S)
    (window,) = [report for report in restarted.aggregator.close_all() if report.start_ns == T0]
    (group,) = window.groups
    assert group.ofu_max == pytest.approx(0.5 * 1755 / 1830)
    assert group.ofu_min == pytest.approx(0.25)
    assert group.gpus == pytest.approx(1.5)  # as the killed one had it: each GPU's time once


class _BrokenBuilder(MetricsDataBuilder):
    def build(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a defect")


def test_a_defect_in_the_stage_costs_the_scrapes_their_gpus_never_the_request(
    page: str, caplog: pytest.LogCaptureFixture
) -> None:
    service = CollectorService(CollectorOptions(grpc_listen=None, flush_interval_s=0, self_telemetry=False))
    assert service.dcgm_series is not None
    service.dcgm_series.builder = _BrokenBuilder()
    for k in range(2):
        request = gpu_request({"GPU-producer": 0.5}, time_ns=T0 + k * 10 * S)  # a producer's GPU beside the scrape
        request.MergeFrom(scrape_request(page, time_ns=T0 + k * 10 * S))
        outcome = service.ingest(request)
        assert outcome.accepted == 1  # the producer's gpu.ofu
        assert outcome.rejected == 0
    assert len([r for r in caplog.records if "reading dcgm-exporter scrapes failed" in r.getMessage()]) == 1
