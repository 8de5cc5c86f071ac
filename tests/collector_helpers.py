"""What the collector service tests share: the options of a collector that a test drives by hand."""

from __future__ import annotations

from typing import Any

from otel_ofu.testing.otlp_sink import OtlpSink
from otel_ofu_collector.config import AggregatorConfig
from otel_ofu_collector.service import CollectorOptions


def collector_options(sink: OtlpSink | None, **overrides: Any) -> CollectorOptions:
    """60 s windows, no receiver, no timed flush (the test flushes), quick retries into ``sink`` if any."""
    settings: dict[str, Any] = {
        "aggregator": AggregatorConfig(window_s=60.0, lateness_s=10.0),
        "grpc_listen": None,
        "export_endpoint": sink.grpc_endpoint if sink else None,
        "flush_interval_s": 0.0,
        "initial_backoff_s": 0.01,
        "max_backoff_s": 0.05,
        "instance_id": "test-1",
    }
    settings.update(overrides)
    return CollectorOptions(**settings)
