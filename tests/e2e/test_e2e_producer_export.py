"""The producer's own OTLP exporter against the real OpenTelemetry Collector (build/otelcol/otelcol-ofu).

The Collector's OTLP receiver (Go) parses the bytes the producer writes itself, over gRPC and OTLP/HTTP,
and passes them on to the loopback sink, gauge start times included; and the producer pointed at the
Collector's other port says, in one line, which protocol that port speaks.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from opentelemetry.sdk.metrics.export import MetricExportResult, MetricsData

from otel_ofu import names
from otel_ofu.model import GpuIdentity, GpuReading, Snapshot
from otel_ofu.otlp_client import OtlpSettings
from otel_ofu.producer import MetricsDataBuilder, compute_snapshot, env_resource
from otel_ofu.producer.exporters import OtlpMetricExporter
from otel_ofu.testing.otlp_sink import OtlpSink, unused_port
from tests.e2e.helpers import StartProcess, attributes, port_open

SECOND = 1_000_000_000
GPU = GpuIdentity(uuid="GPU-e2e", model="NVIDIA H100 80GB HBM3", index=3, host="node-e2e")


@pytest.fixture(autouse=True)
def _clean_otel_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("OTEL_"):
            monkeypatch.delenv(key)


@pytest.fixture
def sink() -> Iterator[OtlpSink]:
    with OtlpSink.start() as started:
        yield started


@pytest.fixture
def collector(otelcol_binary: Path, start_process: StartProcess, tmp_path: Path, sink: OtlpSink) -> tuple[int, int]:
    """The real Collector: OTLP receivers on two free ports (gRPC, HTTP), its otlp exporter to the sink."""
    grpc_port, http_port, telemetry = unused_port(), unused_port(), unused_port()
    config: dict[str, Any] = {
        "receivers": {
            "otlp": {
                "protocols": {
                    "grpc": {"endpoint": f"127.0.0.1:{grpc_port}"},
                    "http": {"endpoint": f"127.0.0.1:{http_port}"},
                }
            }
        },
        "exporters": {"otlp": {"endpoint": f"127.0.0.1:{sink.grpc_port}", "tls": {"insecure": True}}},
        "service": {
            "telemetry": {
                "metrics": {
                    "readers": [{"pull": {"exporter": {"prometheus": {"host": "127.0.0.1", "port": telemetry}}}}]
                }
            },
            "pipelines": {"metrics": {"receivers": ["otlp"], "exporters": ["otlp"]}},
        },
    }
    path = tmp_path / "otelcol.yaml"
    path.write_text(yaml.safe_dump(config))
    start_process(
        [str(otelcol_binary), f"--config={path}"],
        "otelcol",
        lambda: port_open(grpc_port) and port_open(http_port) and port_open(telemetry),
    )
    return grpc_port, http_port


def data() -> MetricsData:
    reading = GpuReading(GPU, 10 * SECOND, 20 * SECOND, tensor_active=0.5, sm_clock_hz=1.5e9, max_sm_clock_hz=1.98e9)
    return MetricsDataBuilder(base=env_resource("node-e2e")).build(compute_snapshot(Snapshot((reading,))))


def exporter(endpoint: str, protocol: str) -> OtlpMetricExporter:
    return OtlpMetricExporter(OtlpSettings.resolve(protocol=protocol, endpoint=endpoint))


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_the_collector_takes_what_the_producer_writes(
    collector: tuple[int, int], sink: OtlpSink, protocol: str
) -> None:
    grpc_port, http_port = collector
    port = grpc_port if protocol == "grpc" else http_port
    otlp = exporter(f"http://127.0.0.1:{port}", protocol)
    try:
        assert otlp.export(data()) is MetricExportResult.SUCCESS
    finally:
        otlp.shutdown()
    assert sink.wait_for(lambda s: len(s.received) >= 1, timeout=20)
    (resource,) = [
        rm
        for rm in sink.received[0].request.resource_metrics
        if attributes(rm.resource.attributes).get(names.HW_ID) == "GPU-e2e"
    ]
    assert attributes(resource.resource.attributes)[names.GPU_INDEX] == 3
    ofu = next(m for m in resource.scope_metrics[0].metrics if m.name == names.GPU_OFU.name)
    (point,) = ofu.gauge.data_points
    # The Collector kept what the SDK's encoder would have dropped: the gauge's start time.
    assert (point.start_time_unix_nano, point.time_unix_nano) == (10 * SECOND, 20 * SECOND)
    assert point.as_double == pytest.approx(0.5 * 1.5 / 1.83)  # TPA x f / f_tensor (H100: 1830 MHz)


@pytest.mark.parametrize(
    ("protocol", "says"),
    [
        ("grpc", "it answers in HTTP/1.1, not gRPC: this looks like an OTLP/HTTP port"),
        ("http/protobuf", "it answers in HTTP/2, as a gRPC server does: this looks like an OTLP/gRPC port"),
    ],
)
def test_the_collectors_other_port_is_named_in_one_line(
    collector: tuple[int, int], caplog: pytest.LogCaptureFixture, protocol: str, says: str
) -> None:
    grpc_port, http_port = collector
    wrong = http_port if protocol == "grpc" else grpc_port
    otlp = exporter(f"http://127.0.0.1:{wrong}", protocol)
    try:
        assert otlp.export(data()) is MetricExportResult.FAILURE
    finally:
        otlp.shutdown()
    (line,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert f"127.0.0.1:{wrong}" in line
    assert says in line
