"""The collector's Prometheus endpoint: the newest window when one flush closes several; a busy port."""

from __future__ import annotations

import pytest

from otel_ofu import names
from otel_ofu_collector.aggregation.windows import Aggregator
from otel_ofu_collector.config import AggregatorConfig
from otel_ofu_collector.outputs.prometheus import OutputsCollector, PrometheusEndpoint

SECOND = 1_000_000_000


def test_the_newest_window_wins_when_one_flush_closes_two() -> None:
    aggregator = Aggregator(AggregatorConfig(window_s=60, lateness_s=0))
    identity = {names.JOB_ID: "job-a", names.HW_MODEL: "NVIDIA H100 80GB HBM3", names.GPU_PRECISION: "bf16"}
    for window, ofu in enumerate((0.1, 0.9)):
        end = (window * 60 + 30) * SECOND
        aggregator.add_ofu("gpu-0", ofu, end - 10 * SECOND, end, identity)
    reports = aggregator.flush(150 * SECOND)  # windows (0, 60 s] and (60 s, 120 s]
    assert len(reports) == 2
    collector = OutputsCollector()
    collector.consume_windows(reports)
    job_ofu = {
        sample.value
        for family in collector.collect()
        for sample in family.samples
        if family.name == "job_ofu" and sample.labels.get("job_id") == "job-a"
    }
    assert job_ofu == {0.9}


def test_a_busy_port_is_one_line_naming_the_address() -> None:
    first = PrometheusEndpoint()
    port = first.start("127.0.0.1", 0)
    try:
        with pytest.raises(OSError, match=f"cannot serve Prometheus metrics on 127.0.0.1:{port} ") as caught:
            PrometheusEndpoint().start("127.0.0.1", port)
        assert "\n" not in str(caught.value)
    finally:
        first.stop()
