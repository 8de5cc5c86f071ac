"""What the collector tests share: the options of a collector a test drives by hand; loss inputs one by one."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from otel_ofu import names
from otel_ofu.testing.otlp_sink import OtlpSink
from otel_ofu_collector.aggregation.windows import Aggregator
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


def add_gpu_input(
    aggregator: Aggregator,
    stream_key: str,
    metric: str,
    value: float,
    start_ns: int,
    end_ns: int,
    identity: Mapping[str, str],
    reason: str | None = None,
) -> str | None:
    """One loss-input point into the windows as the decoder groups it (a gpu.throttle share under its reason)."""
    if metric == names.GPU_THROTTLE.name:
        if reason is None:  # the decoder refuses a throttle share without its reason
            return names.RejectReason.BAD_ATTRIBUTE
        return aggregator.add_gpu_inputs(stream_key, start_ns, end_ns, identity, {}, {reason: value})
    if metric == names.GPU_ENERGY.name:  # a cumulative counter: start_ns is its series start
        return aggregator.add_gpu_counters(stream_key, start_ns, end_ns, identity, {metric: value})
    return aggregator.add_gpu_inputs(stream_key, start_ns, end_ns, identity, {metric: value}, {})
