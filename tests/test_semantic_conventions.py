"""OpenTelemetry conventions: what the producer and the collector send says which semantic conventions it follows
(a schema URL on every ResourceMetrics and ScopeMetrics), that version is a real one, and the attribute keys the
project borrows from the conventions exist in it; every name of the project's own has a stability level.

The requests are the real ones: the producer exporting the simulated fleet and the MFU reporter's points over
gRPC to an OTLP sink on loopback, and a collector closing a window and sending its outputs downstream to it.
"""

from __future__ import annotations

import importlib
import pkgutil

import pytest

from otel_ofu import names
from otel_ofu.clock import ManualClock
from otel_ofu.mfu.timed import TimedMfu, timed_mfu_metrics_data
from otel_ofu.producer.exporters import otlp_exporter
from otel_ofu.producer.loop import Producer
from otel_ofu.sources.simulated import SimulatedFleet
from otel_ofu.testing.otlp_sink import OtlpSink
from otel_ofu_collector.config import AggregatorConfig
from otel_ofu_collector.service import CollectorOptions, CollectorService

S = 1_000_000_000
T0 = 1_800_000_040 * S  # a multiple of 60 s


def schema_urls(sink: OtlpSink) -> set[tuple[str, str]]:
    """(ResourceMetrics schema URL, ScopeMetrics schema URL) of everything the sink received."""
    return {
        (rm.schema_url, sm.schema_url)
        for request in sink.requests()
        for rm in request.resource_metrics
        for sm in rm.scope_metrics
    }


def test_the_producers_requests_carry_the_schema_url() -> None:
    clock = ManualClock(start_ns=T0)
    with OtlpSink.start() as sink:
        exporter = otlp_exporter(protocol="grpc", endpoint=f"http://127.0.0.1:{sink.grpc_port}")
        producer = Producer(source=SimulatedFleet.demo(seed=1, clock=clock), clock=clock)
        clock.advance(10)
        assert exporter.export(producer.run_once()).name == "SUCCESS"
        mfu = TimedMfu(job_id="job-1", value=0.4, start_ns=T0, end_ns=T0 + 10 * S)
        assert exporter.export(timed_mfu_metrics_data([mfu])).name == "SUCCESS"
        exporter.shutdown()
        assert schema_urls(sink) == {(names.SCHEMA_URL, names.SCHEMA_URL)}


def test_the_collectors_outputs_carry_the_schema_url() -> None:
    with OtlpSink.start() as sink:
        service = CollectorService(
            CollectorOptions(
                aggregator=AggregatorConfig(window_s=60.0, lateness_s=0.0),
                grpc_listen="127.0.0.1:0",
                export_endpoint=f"http://127.0.0.1:{sink.grpc_port}",
                flush_interval_s=0.0,
            ),
            clock=lambda: T0,
            environ={},
        )
        service.start()
        try:
            clock = ManualClock(start_ns=T0)
            producer = Producer(source=SimulatedFleet.demo(seed=1, clock=clock), clock=clock)
            exporter = otlp_exporter(protocol="grpc", endpoint=f"http://127.0.0.1:{service.ports['grpc']}")
            clock.advance(10)
            assert exporter.export(producer.run_once()).name == "SUCCESS"
            exporter.shutdown()
            service.flush(T0 + 120 * S)
            assert sink.wait_for(lambda s: any(m.name == names.FLEET_GPUS.name for _, _, m in s.metrics()), 20)
        finally:
            service.stop(grace=2)
        assert schema_urls(sink) == {(names.SCHEMA_URL, names.SCHEMA_URL)}


def test_the_schema_is_a_released_one_and_holds_every_convention_the_project_borrows() -> None:
    schemas = pytest.importorskip("opentelemetry.semconv.schemas")
    assert names.SCHEMA_URL in {schema.value for schema in schemas.Schemas}
    incubating = importlib.import_module("opentelemetry.semconv._incubating.attributes")
    defined: set[str] = set()
    for info in pkgutil.iter_modules(incubating.__path__):
        module = importlib.import_module(f"{incubating.__name__}.{info.name}")
        defined |= {value for key, value in vars(module).items() if key.isupper() and isinstance(value, str)}
    assert set(names.SEMCONV_ATTRIBUTES) <= defined, sorted(set(names.SEMCONV_ATTRIBUTES) - defined)


def test_every_name_of_the_projects_own_has_a_stability_level() -> None:
    from docs.generate import reference

    text = reference()
    for spec in (value for value in vars(names).values() if isinstance(value, names.MetricSpec)):
        assert spec.name in names.STABILITY, spec.name
        assert names.STABILITY[spec.name] in names.StabilityLevel.ALL
    rows = [line for line in text.splitlines() if line.startswith("| `gpu.ofu` |")]
    assert rows
    assert "stable" in rows[0]
    assert "## Stability" in text
