"""No new agent where dcgm-exporter runs: the project's OpenTelemetry Collector build, with the shipped
collector/otelcol/dcgm-exporter.yaml, scrapes a dcgm-exporter page served on 127.0.0.1 and sends the scrapes to a
real ``otel-ofu collector`` process, which exports each GPU's OFU equal to what the producer (``otel-ofu snapshot
--source dcgm-exporter``) reads from the same page.

The page is tests/data/dcgm_exporter_h100_node_written.prom (worked by hand in tests/test_collector_dcgm_series.py):
GPU 0 at 0.5 x 1755 / 1830, GPU 1 at 0.25, GPU 2 without tensor activity (no OFU, its time unmeasured). The shipped
file runs with only addresses and timing changed: the targets file names the loopback page, the exporter points at
the collector's port, the scrape runs every second.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from otel_ofu import names
from otel_ofu.testing.otlp_sink import OtlpSink, unused_port
from tests.collector_helpers import CollectorProcess
from tests.e2e.fake_discovery_api import DiscoveryApi, dcgm_exporter_objects
from tests.e2e.fake_discovery_api import serve as serve_discovery
from tests.e2e.helpers import StartProcess, attributes, port_open
from tests.exporter_server import ExporterServer, serving
from tests.test_helm_chart import helm_binary
from tests.test_helm_dcgm_scraper import CONFIGURATIONS as CHART_CONFIGURATIONS
from tests.test_helm_dcgm_scraper import render, scraper

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "collector" / "otelcol" / "dcgm-exporter.yaml"
PAGE = REPO / "tests" / "data" / "dcgm_exporter_h100_node_written.prom"
GPU0 = "GPU-927d7444-b45a-7c49-8402-5e686e46a026"
GPU1 = "GPU-3f1c2a9e-5d47-4b6e-9a0c-7e2b8d1f6a53"
GPU2 = "GPU-b83e0f27-9c1d-4a5b-8e6f-0d2c4a7b9e18"
WAIT_S = 60.0


@pytest.fixture
def exporter() -> Iterator[ExporterServer]:
    with serving() as server:
        yield server


def producer_snapshot(url: str) -> dict[str, dict[str, Any]]:
    """What the producer reads from the page: ``otel-ofu snapshot --source dcgm-exporter``, by hw.id."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "otel_ofu.cli",
            "snapshot",
            "--source",
            "dcgm-exporter",
            "--url",
            url,
            "--format",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    return {line[names.HW_ID]: line for line in lines}


def forwarded(sink: OtlpSink, metric: str) -> dict[str, float]:
    """The latest value of a per-GPU metric the collector forwarded, by hw.id."""
    found: dict[str, float] = {}
    for rm, _sm, data in sink.metrics(metric):
        hw_id = attributes(rm.resource.attributes).get(names.HW_ID)
        for point in data.gauge.data_points:
            found[str(hw_id)] = point.as_double
    return found


def collector_process() -> tuple[OtlpSink, CollectorProcess]:
    """A sink downstream and ``otel-ofu collector`` on a free port in front of it, forwarding the GPUs' own inputs (so
    that their gpu.ofu reaches the sink, to compare with the producer's) and closing 5 s windows."""
    sink = OtlpSink.start()
    argv = ["--listen", "127.0.0.1:0", "--export-endpoint", sink.grpc_endpoint, "--forward-inputs"]
    return sink, CollectorProcess.start(*argv, "--window", "5", "--lateness", "1")


def start_scraper(
    config: dict[str, Any], collector_port: int, tmp_path: Path, start_process: StartProcess, otelcol_binary: Path
) -> None:
    """otelcol-ofu with ``config`` (a dcgm-exporter scraper), its scrapes every second to the collector's port."""
    (job,) = config["receivers"]["prometheus"]["config"]["scrape_configs"]
    job["scrape_interval"] = job["scrape_timeout"] = "1s"
    config["exporters"]["otlp/otel-ofu-collector"]["endpoint"] = f"127.0.0.1:{collector_port}"
    telemetry = unused_port()
    reader = {"pull": {"exporter": {"prometheus": {"host": "127.0.0.1", "port": telemetry}}}}
    config["service"]["telemetry"] = {"metrics": {"readers": [reader]}}
    path = tmp_path / "dcgm-exporter.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    start_process([str(otelcol_binary), "--config", str(path)], "otelcol", lambda: port_open(telemetry))


def assert_the_producers_ofu(sink: OtlpSink, collector: CollectorProcess, reference: dict[str, dict[str, Any]]) -> None:
    """Every GPU of the page got the producer's OFU and raw OFU through the collector; GPU 2 its time unmeasured."""
    # Two scrapes of the target at least: the first has no interval, the second covers the time since.
    enough = sink.wait_for(lambda s: len([1 for _ in s.metrics(names.GPU_OFU.name)]) >= 4, timeout=WAIT_S)
    assert enough, "\n".join(collector.lines)
    ofu = forwarded(sink, names.GPU_OFU.name)
    raw = forwarded(sink, names.GPU_OFU_RAW.name)
    assert ofu == {gpu: reference[gpu][names.GPU_OFU.name] for gpu in (GPU0, GPU1)}
    assert raw == {gpu: reference[gpu][names.GPU_OFU_RAW.name] for gpu in (GPU0, GPU1)}
    assert ofu[GPU0] == pytest.approx(0.5 * 1755 / 1830, rel=1e-12)  # the hand-worked value
    unmeasured = {
        str(attributes(rm.resource.attributes)[names.HW_ID])
        for rm, _sm, _m in sink.metrics(names.GPU_OFU_UNMEASURED.name)
    }
    assert unmeasured == {GPU2}


def test_the_collector_build_scrapes_dcgm_exporter_and_the_collector_gives_the_producers_ofu(
    otelcol_binary: Path, start_process: StartProcess, exporter: ExporterServer, tmp_path: Path
) -> None:
    url = exporter.serve(PAGE.read_text())
    reference = producer_snapshot(url)
    assert names.GPU_OFU.name not in reference[GPU2]  # the producer's own reading of the page: no OFU there
    sink, collector = collector_process()
    try:
        targets = tmp_path / "targets"
        targets.mkdir()
        (targets / "page.json").write_text(json.dumps([{"targets": [url.split("/")[2]]}]))
        with pytest.MonkeyPatch.context() as env:
            env.setenv("DCGM_EXPORTER_TARGETS_DIR", str(targets))
            env.setenv("OTEL_OFU_COLLECTOR_BEARER_TOKEN", "unused")
            start_scraper(
                yaml.safe_load(SHIPPED.read_text()), collector.grpc_port, tmp_path, start_process, otelcol_binary
            )
        assert_the_producers_ofu(sink, collector, reference)
        # The windows closed by the collector: its fleet outputs count the page's H100s.
        assert sink.wait_for(lambda s: any(s.metrics(names.FLEET_GPUS.name)), timeout=WAIT_S)
        models = {
            attributes(point.attributes).get(names.HW_MODEL)
            for _rm, _sm, metric in sink.metrics(names.FLEET_GPUS.name)
            for point in metric.gauge.data_points
        }
        assert "NVIDIA H100 80GB HBM3" in models
        # The scrapes themselves pass through untouched (not ours).
        assert any(sink.metrics("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"))
    finally:
        assert collector.terminate() == 0
        sink.close()
    assert not [line for line in collector.lines if "rejected" in line and "dcgm-exporter" in line]


def test_the_charts_scraper_finds_the_exporter_by_kubernetes_discovery(
    otelcol_binary: Path,
    start_process: StartProcess,
    exporter: ExporterServer,
    tmp_path: Path,
    require: Callable[[bool, str], None],
) -> None:
    """The Collector configuration the chart's scrape mode renders, as rendered (only the API server's address, the
    scrape interval and the collector's address changed): Kubernetes service discovery (role endpointslice, client-go
    list and watch against a fake API server on loopback) finds the GPU Operator's dcgm-exporter Service's endpoint,
    the page served there, and the collector gives each GPU the producer's OFU."""
    binary = helm_binary()
    require(binary is not None, "helm is not on PATH and could not be built (make helm needs Go)")
    assert binary is not None
    url = exporter.serve(PAGE.read_text())
    port = int(url.split("/")[2].rpartition(":")[2])
    reference = producer_snapshot(url)
    objects = dcgm_exporter_objects("gpu-operator", "nvidia-dcgm-exporter", "gpu-metrics", "127.0.0.1", port, "gpu-7")
    with serve_discovery(DiscoveryApi(objects={"gpu-operator": objects})) as api:
        sink, collector = collector_process()
        try:
            _, config = scraper(render(binary, "scrape"))
            (job,) = config["receivers"]["prometheus"]["config"]["scrape_configs"]
            (discovery,) = job["kubernetes_sd_configs"]
            discovery["api_server"] = api.url  # in a pod: the in-cluster API server and its service account
            start_scraper(config, collector.grpc_port, tmp_path, start_process, otelcol_binary)
            assert_the_producers_ofu(sink, collector, reference)
            # The scrape passed through names the exporter's pod and node, as discovery found them.
            (scrape_resource, *_) = [rm.resource for rm, _sm, _m in sink.metrics("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE")]
            found = attributes(scrape_resource.attributes)
            assert found["k8s.node.name"] == "gpu-7"
            assert found["k8s.pod.name"] == "nvidia-dcgm-exporter-x7k2p"
        finally:
            assert collector.terminate() == 0
            sink.close()
    asked = {request.split("?")[0] for request in api.requests}
    assert "/apis/discovery.k8s.io/v1/namespaces/gpu-operator/endpointslices" in asked


@pytest.mark.parametrize("configuration", sorted(CHART_CONFIGURATIONS))
def test_the_charts_scraper_configuration_validates(
    otelcol_binary: Path, configuration: str, tmp_path: Path, require: Callable[[bool, str], None]
) -> None:
    """The Collector configuration the chart's scrape mode renders (Kubernetes service discovery of the dcgm-exporter
    Service's endpoints) passes otelcol-ofu's own ``validate``."""
    binary = helm_binary()
    require(binary is not None, "helm is not on PATH and could not be built (make helm needs Go)")
    assert binary is not None
    _, config = scraper(render(binary, configuration))
    path = tmp_path / "dcgm-exporter.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    env = {**os.environ, "OTEL_OFU_COLLECTOR_BEARER_TOKEN": "test-token"}
    done = subprocess.run(
        [str(otelcol_binary), "validate", "--config", str(path)], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
