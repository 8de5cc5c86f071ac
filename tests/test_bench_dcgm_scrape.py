"""benchmarks/bench_dcgm_scrape.py: its workload is what it says (one node's dcgm-exporter default-counters page per
request, as the Prometheus receiver sends it, every GPU given its OFU by the collector), and it measures the real
collector process."""

from __future__ import annotations

import importlib
import sys
import time
from pathlib import Path
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from otel_ofu import names
from otel_ofu_collector.otlp.dcgm_series import DcgmSeries

ROOT = Path(__file__).resolve().parents[1]


def bench() -> Any:
    if str(ROOT) not in sys.path:  # benchmarks/ is a folder of the repository, not an installed package
        sys.path.insert(0, str(ROOT))
    return importlib.import_module("benchmarks.bench_dcgm_scrape")


def test_each_request_is_one_nodes_scrape_whose_eight_gpus_get_their_ofu() -> None:
    module = bench()
    payloads = module.scrape_rounds(3, 2, time.time_ns())
    assert len(payloads) == 6  # two rounds of three nodes
    request = ExportMetricsServiceRequest.FromString(payloads[0])
    (rm,) = request.resource_metrics
    metrics = [m for m in rm.scope_metrics[0].metrics if m.name.startswith("DCGM_")]
    assert [m.name for m in metrics] == [field for field, _kind in module.DEFAULT_COUNTERS]
    assert all(len(m.gauge.data_points or m.sum.data_points) == 8 for m in metrics)
    stage = DcgmSeries()
    first = stage.translate(ExportMetricsServiceRequest.FromString(payloads[0]), payloads[0])
    translated = stage.translate(ExportMetricsServiceRequest.FromString(payloads[3]), payloads[3])  # 10 s later
    assert first is not None
    assert translated is not None
    assert first.gpus == translated.gpus == 8
    ofu = [
        metric.gauge.data_points[0]
        for rm in translated.request.resource_metrics
        for sm in rm.scope_metrics
        for metric in sm.metrics
        if metric.name == names.GPU_OFU.name
    ]
    assert len(ofu) == 8
    assert all(point.time_unix_nano - point.start_time_unix_nano == 10_000_000_000 for point in ofu)


def test_it_measures_the_collector_process_on_both_paths() -> None:
    rows = bench().measure_collector(nodes=20, rounds=5)
    assert [row["path"] for row in rows] == [bench().PRODUCER, bench().DCGM, bench().DCGM_NO_PASS]
    for row in rows:
        assert row["gpu_reports"] == 20 * 5 * 8
        assert row["us_per_report"] > 0.0  # the process's own CPU, from /proc, grew while it served them
