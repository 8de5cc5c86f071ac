"""Flag events: each flag's rise and fall as an OTLP log record, sent to the downstream's logs endpoint beside the
window's metrics, over gRPC and OTLP/HTTP, into a real receiver on loopback."""

from __future__ import annotations

import pytest

from otel_ofu import names
from otel_ofu.otlp_client import OtlpSettings
from otel_ofu.testing.otlp_sink import OtlpSink
from otel_ofu_collector.outputs.flag_events import flag_events, logs_endpoint
from otel_ofu_collector.report.flag_words import SENTENCES
from otel_ofu_collector.service import CollectorService
from tests.collector_helpers import collector_options
from tests.test_goodput import CONFIG, HEALTHY, HUNG, IDLE, T0, Fleet, S

E = names.FlagEventName


def attributes(record: object) -> dict[str, object]:
    found: dict[str, object] = {}
    for kv in record.attributes:  # type: ignore[attr-defined]
        kind = kv.value.WhichOneof("value")
        found[kv.key] = getattr(kv.value, kind)
    return found


def fleet() -> Fleet:
    """A job hung in windows 2-4 of 5 (flag up in window 4, down in 5), an idle one (flag up from window 3)."""
    found = Fleet()
    found.job("hung", [HEALTHY, HUNG, HUNG, HUNG, HEALTHY])
    found.job("idle", [IDLE] * 5, gpus=2)
    return found


def test_every_rise_and_fall_is_one_event_in_the_reports_words() -> None:
    reports = fleet().run()
    events = [event for report in reports for event in flag_events(report, SENTENCES)]
    said = [(e.attributes[names.JOB_ID], e.attributes[names.EVENT_FLAG], e.name, e.time_ns) for e in events]
    assert said == [
        ("idle", names.JOB_GPUS_IDLE.name, E.RAISED, T0 + 180 * S),
        ("hung", names.JOB_HANG.name, E.RAISED, T0 + 240 * S),
        ("hung", names.JOB_HANG.name, E.CLEARED, T0 + 300 * S),
    ]
    idle, hang, cleared = events
    assert hang.severity_text == "ERROR"
    assert idle.severity_text == "WARN"
    assert cleared.severity_text == "INFO"
    assert hang.body == (
        "job hung: hang: every one of its 4 GPUs ran kernels with nothing moving (no tensor, memory or link traffic): "
        "0.067 GPU-h hung in the window to 2027-01-15 08:04:00 UTC"
    )
    assert hang.attributes[names.JOB_BADPUT.name] == 240.0
    assert hang.attributes[names.GOODPUT_CAUSE] == names.GoodputCause.HANG
    assert hang.attributes[names.JOB_GPUS.name] == 4.0
    assert hang.attributes[names.EVENT_FLAG_KIND] == "hang"
    assert idle.body == "job idle: idle allocation: 2 GPUs attributed with no tensor activity"
    assert cleared.body.startswith("job hung: hang cleared (OFU 40.0%")


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_the_collector_sends_them_to_the_downstreams_logs_endpoint(protocol: str) -> None:
    with OtlpSink.start() as sink:
        endpoint = sink.grpc_endpoint if protocol == "grpc" else sink.http_endpoint
        options = collector_options(sink, aggregator=CONFIG, export_endpoint=endpoint, export_protocol=protocol)
        service = CollectorService(options, environ={})
        service.start()
        try:
            found = fleet()
            for at, method, args in sorted(found.points, key=lambda p: p[0]):
                with service.aggregator.lock:
                    assert getattr(service.aggregator, method)(*args) is None
                service.flush(at)
            service.flush(T0 + 300 * S + CONFIG.lateness_ns)
            assert sink.wait_for(lambda s: len(s.log_records()) == 3)
        finally:
            service.stop(5)
        records = sink.log_records()
        [(resource_logs, first)] = records[:1]
        resource = {kv.key: kv.value.string_value for kv in resource_logs.resource.attributes}
        assert resource[names.SERVICE_NAME] == names.COLLECTOR_SERVICE_NAME
        assert resource_logs.schema_url == names.SCHEMA_URL
        assert [record.event_name for _rl, record in records] == [E.RAISED, E.RAISED, E.CLEARED]
        hang = attributes(records[1][1])
        assert hang[names.JOB_ID] == "hung"
        assert hang[names.EVENT_FLAG] == names.JOB_HANG.name
        assert records[1][1].time_unix_nano == T0 + 240 * S
        assert records[1][1].body.string_value.startswith("job hung: hang: every one of its 4 GPUs")
        assert first.severity_text == "WARN"
        # the metrics went their own way, beside them
        assert any(True for _ in sink.metrics(names.JOB_HANG.name))


def test_a_shard_says_only_its_gpu_flags_the_merge_tier_the_jobs() -> None:
    reports = fleet().run()
    assert [event for report in reports for event in flag_events(report, SENTENCES, job_flags=False)] == []


def test_the_logs_endpoint_follows_the_metrics_one() -> None:
    grpc = OtlpSettings.resolve(protocol="grpc", endpoint="http://gateway:4317", environ={})
    assert logs_endpoint(grpc, {}) == "http://gateway:4317"
    http = OtlpSettings.resolve(protocol="http/protobuf", endpoint="http://gateway:4318", environ={})
    assert logs_endpoint(http, {}) == "http://gateway:4318/v1/logs"
    custom = OtlpSettings.resolve(protocol="http/protobuf", endpoint="http://gateway:4318/otlp/metrics", environ={})
    assert logs_endpoint(custom, {}) == "http://gateway:4318/otlp/metrics/v1/logs"
    assert logs_endpoint(http, {"OTEL_EXPORTER_OTLP_LOGS_ENDPOINT": "http://logs:4318/v1/logs"}) == (
        "http://logs:4318/v1/logs"
    )


def test_no_events_without_a_downstream_nor_when_turned_off() -> None:
    assert CollectorService(collector_options(None), environ={}).events is None
    with OtlpSink.start() as sink:
        service = CollectorService(collector_options(sink, flag_events=False), environ={})
        assert service.events is None


def test_the_shipped_routing_matches_on_the_vocabularys_names() -> None:
    """examples/events/otelcol-flag-events.yaml filters on the events' attributes by name: a renamed key would route
    nothing, silently; the end-to-end test (tests/e2e/test_goodput_e2e.py) runs it in the real Collector."""
    from pathlib import Path

    import yaml

    path = Path(__file__).resolve().parents[1] / "examples" / "events" / "otelcol-flag-events.yaml"
    config = yaml.safe_load(path.read_text(encoding="utf-8"))
    conditions = [
        condition
        for processor in config["processors"].values()
        if processor
        for condition in processor.get("logs", {}).get("log_record", [])
    ]
    assert f'attributes["{names.EVENT_FLAG}"] == nil' in conditions
    assert f'attributes["{names.EVENT_FLAG}"] != "{names.JOB_HANG.name}"' in conditions
    assert f'attributes["{names.EVENT_FLAG_STATE}"] != "{names.FlagState.RAISED}"' in conditions
    assert {name.split("/")[0] for name in config["service"]["pipelines"]} == {"metrics", "logs"}


def test_a_downstream_without_logs_is_said_once_and_the_events_counted(caplog: pytest.LogCaptureFixture) -> None:
    """A Collector with metrics pipelines only answers UNIMPLEMENTED: the first refusal is the delivery's (dropped,
    counted), then one warning, and the later events are dropped without a call, counted."""
    from otel_ofu.otlp_client.retry import Attempt
    from otel_ofu_collector.outputs.flag_events import EventsTransport

    class NoLogs:
        calls = 0

        def send(self, payload: bytes) -> Attempt:
            self.calls += 1
            cause = "it has no OTLP logs service (UNIMPLEMENTED: unknown service LogsService): is it ...?"
            return Attempt(False, cause=cause)

        def close(self) -> None:
            return None

    inner = NoLogs()
    transport = EventsTransport(inner, "http://gateway:4317")
    assert not transport.send(b"1").delivered
    assert transport.send(b"2").delivered
    assert transport.send(b"3").delivered
    assert inner.calls == 1
    assert transport.unsupported == 2
    warnings = [r.getMessage() for r in caplog.records if "takes no OTLP logs" in r.getMessage()]
    assert len(warnings) == 1
