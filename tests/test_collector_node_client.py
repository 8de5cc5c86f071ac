"""A real non-Python OTLP client: the OpenTelemetry JS SDK's gRPC exporter sends to the collector."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

from otel_ofu import names
from otel_ofu.testing.otlp_sink import OtlpSink
from otel_ofu_collector.config import AggregatorConfig
from otel_ofu_collector.outputs.consumer import CallbackConsumer
from otel_ofu_collector.results import WindowReport
from otel_ofu_collector.service import CollectorOptions, CollectorService

NODE_DIR = Path(__file__).parent / "setup" / "node"
S = 1_000_000_000


def test_node_sdk_client_is_aggregated(require: Callable[[bool, str], None]) -> None:
    node = shutil.which("node")
    require(node is not None, "node is not installed (tests/setup/install-system-deps.sh)")
    require(
        (NODE_DIR / "node_modules" / "@opentelemetry" / "exporter-metrics-otlp-grpc").is_dir(),
        "the npm OpenTelemetry packages are not installed (bash tests/setup/install-system-deps.sh)",
    )
    assert node is not None
    with OtlpSink.start(hold_limit_s=5) as downstream:
        options = CollectorOptions(
            aggregator=AggregatorConfig(window_s=60.0, lateness_s=10.0),
            grpc_listen="127.0.0.1:0",
            export_endpoint=downstream.grpc_endpoint,
            flush_interval_s=0.0,
            instance_id="node-test",
        )
        service = CollectorService(options, environ={})
        reports: list[WindowReport] = []
        service.consumers.append(CallbackConsumer(reports.extend))
        service.start()
        try:
            result = subprocess.run(
                [node, str(NODE_DIR / "send_ofu.js"), f"http://127.0.0.1:{service.ports['grpc']}"],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert result.returncode == 0, result.stderr
            stats = service.decoder.stats
            assert stats.accepted == 4  # three GPUs' OFU and one MFU point
            assert stats.rejected == 1  # the 1.7 OFU
            # The JS SDK stamps points with the wall clock: close every window they can be in.
            service.flush(service.aggregator.watermark_ns + 2 * 60 * S)
            assert downstream.wait_for(
                lambda sink: any(
                    m.name == names.JOB_OFU.name
                    for r in sink.requests()
                    for rm in r.resource_metrics
                    for sm in rm.scope_metrics
                    for m in sm.metrics
                )
            )
        finally:
            service.stop(grace=2)
    # The JS SDK stamps each gauge with the interval since its meter started (milliseconds, in this one-shot client):
    # the fleet's GPU equivalents count those seconds, the histogram the three GPUs observed.
    assert sum(group.histogram.count for report in reports for group in report.groups) == 3
    assert 0 < sum(group.gpus for report in reports for group in report.groups) < 3
    [job] = [job for report in reports for job in report.jobs if job.ofu is not None]
    assert job.job_id == "js-job"
    # 0.6, 0.4 and 0.2, each weighed by the interval its gauge covers: the time since its MeterProvider started,
    # which differs between the two providers; the plain mean would be 0.4.
    assert job.ofu is not None
    assert 0.2 < job.ofu < 0.6
    assert job.mfu == 0.38
    forwarded = {
        m.name
        for r in downstream.requests()
        for rm in r.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
    }
    assert "js.requests" in forwarded  # not ours: passed through
    assert names.GPU_OFU.name not in forwarded
