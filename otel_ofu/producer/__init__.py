"""The node-side OpenTelemetry producer: snapshot -> MetricsData -> an exporter (its own OTLP one) and Prometheus."""

from __future__ import annotations

from otel_ofu.producer.exporters import build_exporter, console_exporter, otlp_exporter
from otel_ofu.producer.loop import Producer
from otel_ofu.producer.metrics_data import (
    ComputedSnapshot,
    GpuSample,
    MetricsDataBuilder,
    compute_snapshot,
    env_resource,
    snapshot_to_metrics_data,
)
from otel_ofu.producer.self_metrics import SelfMetrics, counter_temporality

__all__ = [
    "ComputedSnapshot",
    "GpuSample",
    "MetricsDataBuilder",
    "Producer",
    "SelfMetrics",
    "build_exporter",
    "compute_snapshot",
    "console_exporter",
    "counter_temporality",
    "env_resource",
    "otlp_exporter",
    "snapshot_to_metrics_data",
]
