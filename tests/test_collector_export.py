"""Delivery to the downstream: retry with backoff, the SQLite spool across restarts, bounded drops counted."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import attrs
import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from otel_ofu import names
from otel_ofu.otlp_client import Attempt, ExporterConfigError, OtlpClient, OtlpSettings, configured_endpoint
from otel_ofu.otlp_client.senders import HttpSender
from otel_ofu.testing.otlp_sink import OtlpSink, SinkMode, unused_port
from otel_ofu_collector.outputs.delivery import Delivery
from otel_ofu_collector.outputs.queues import MemoryQueue, SqliteSpool


def payload(tag: str, padding: int = 0) -> bytes:
    """A real serialized request whose resource says which one it is."""
    request = ExportMetricsServiceRequest()
    rm = request.resource_metrics.add()
    kv = rm.resource.attributes.add()
    kv.key = "tag"
    kv.value.string_value = tag + "." * padding
    rm.scope_metrics.add().metrics.add(name=names.FLEET_GPUS.name)
    return request.SerializeToString()


def tags(sink: OtlpSink) -> list[str]:
    return [r.resource_metrics[0].resource.attributes[0].value.string_value.rstrip(".") for r in sink.requests()]


@pytest.fixture
def sink() -> Iterator[OtlpSink]:
    with OtlpSink.start(hold_limit_s=5) as started:
        yield started


def grpc_to(endpoint: str) -> OtlpClient:
    return OtlpClient(OtlpSettings.resolve(protocol="grpc", endpoint=endpoint, environ={}), "rejected")


def test_outage_then_recovery_delivers_everything_in_order(sink: OtlpSink) -> None:
    # jitter() = 0.5: the backoff's random factor exactly 1.
    delivery = Delivery(grpc_to(sink.grpc_endpoint), initial_backoff_s=0.5, max_backoff_s=4.0, jitter=lambda: 0.5)
    sink.set_mode(SinkMode.UNAVAILABLE)
    for tag in ("w1", "w2", "w3"):
        delivery.submit(payload(tag))
    backoffs = []
    for _ in range(5):
        assert not delivery.pump()
        backoffs.append(delivery.backoff_s)
    assert backoffs == [0.5, 1.0, 2.0, 4.0, 4.0]  # exponential, capped
    assert tags(sink) == []
    sink.set_mode(SinkMode.OK)
    assert delivery.pump()
    assert tags(sink) == ["w1", "w2", "w3"]
    assert delivery.stats.sent == 3
    assert delivery.stats.dropped_overflow == delivery.stats.dropped_rejected == 0
    assert delivery.backoff_s == 0.0
    delivery.stop(1)


def test_restart_resends_from_the_spool(sink: OtlpSink, tmp_path: Path) -> None:
    spool_path = str(tmp_path / "spool" / "windows.sqlite")
    down = Delivery(grpc_to(f"http://127.0.0.1:{unused_port()}"), SqliteSpool(spool_path))
    for tag in ("w1", "w2"):
        down.submit(payload(tag))
    assert not down.pump()
    assert down.stop(0.2) == 2  # could not deliver: kept on disk

    after_restart = Delivery(grpc_to(sink.grpc_endpoint), SqliteSpool(spool_path))
    assert len(after_restart.queue) == 2
    after_restart.submit(payload("w3"))
    assert after_restart.pump()
    assert tags(sink) == ["w1", "w2", "w3"]
    assert len(after_restart.queue) == 0
    after_restart.stop(1)
    assert len(SqliteSpool(spool_path)) == 0


def test_beyond_the_spool_bound_the_oldest_are_dropped_and_counted(sink: OtlpSink, tmp_path: Path) -> None:
    size = len(payload("w0", padding=200))
    spool = SqliteSpool(str(tmp_path / "s.sqlite"), max_bytes=3 * size)
    delivery = Delivery(grpc_to(f"http://127.0.0.1:{unused_port()}"), spool)
    for index in range(5):
        delivery.submit(payload(f"w{index}", padding=200))
    assert not delivery.pump()
    assert delivery.stats.dropped_overflow == 2
    assert len(spool) == 3
    delivery.transport = grpc_to(sink.grpc_endpoint)
    assert delivery.pump()
    assert tags(sink) == ["w2", "w3", "w4"]
    delivery.stop(1)


def test_memory_queue_bound_counts_drops() -> None:
    queue = MemoryQueue(max_items=2)
    assert [queue.put(payload(t)) for t in ("a", "b", "c")] == [0, 0, 1]
    assert len(queue) == 2


@attrs.define
class ScriptedTransport:
    """A downstream whose answers are scripted, for the outcomes a loopback sink cannot produce."""

    answers: list[Attempt]
    sent: list[bytes] = attrs.field(factory=list)

    def send(self, data: bytes) -> Attempt:
        outcome = self.answers.pop(0) if self.answers else Attempt(True)
        if outcome.delivered:
            self.sent.append(data)
        return outcome

    def close(self) -> None:
        return None


def test_permanent_refusal_is_dropped_and_counted_and_retry_after_is_honoured() -> None:
    transport = ScriptedTransport(
        [Attempt(False, retryable=False, cause="INVALID_ARGUMENT"), Attempt(False, True, 7.0, "UNAVAILABLE")]
    )
    delivery = Delivery(transport, initial_backoff_s=0.5)
    delivery.submit(b"bad")
    delivery.submit(b"good")
    assert not delivery.pump()
    assert delivery.stats.dropped_rejected == 1
    assert delivery.backoff_s == 7.0
    assert delivery.pump()
    assert transport.sent == [b"good"]


def test_sender_thread_retries_until_the_downstream_is_back(sink: OtlpSink) -> None:
    delivery = Delivery(grpc_to(sink.grpc_endpoint), initial_backoff_s=0.01, max_backoff_s=0.02)
    sink.set_mode(SinkMode.UNAVAILABLE)
    delivery.start()
    try:
        delivery.submit(payload("w1"))
        assert sink.wait_for(lambda s: s.attempts >= 3)
        sink.set_mode(SinkMode.OK)
        assert sink.wait_for(lambda s: len(s.received) == 1)
        assert tags(sink) == ["w1"]
    finally:
        delivery.stop(1)


def test_http_transport_with_gzip_and_headers(sink: OtlpSink) -> None:
    settings = OtlpSettings.resolve(
        environ={
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{sink.http_port}",
            "OTEL_EXPORTER_OTLP_HEADERS": "x-honeycomb-team=abc,x-honeycomb-dataset=fleet%20ofu",
            "OTEL_EXPORTER_OTLP_COMPRESSION": "gzip",
        },
    )
    assert settings.endpoint == sink.http_endpoint
    transport = OtlpClient(settings, "rejected")
    assert isinstance(transport.sender, HttpSender)
    assert transport.send(payload("h1")).delivered
    assert tags(sink) == ["h1"]
    received = sink.received[0]
    assert received.metadata["x-honeycomb-dataset"] == "fleet ofu"
    assert received.metadata["content-encoding"] == "gzip"
    sink.set_mode(SinkMode.UNAVAILABLE)
    outcome = transport.send(payload("h2"))
    assert (outcome.delivered, outcome.retryable) == (False, True)


def test_downstream_config_from_the_standard_variables() -> None:
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "https://otlp.example:4317",
        "OTEL_EXPORTER_OTLP_METRICS_HEADERS": "dd-api-key=k",
        "OTEL_EXPORTER_OTLP_TIMEOUT": "3",
    }
    settings = OtlpSettings.resolve(environ=env)
    assert (settings.endpoint, settings.protocol, settings.tls) == ("https://otlp.example:4317", "grpc", True)
    assert settings.headers == (("dd-api-key", "k"),)
    assert settings.timeout_s == 3.0
    metrics_only = OtlpSettings.resolve(
        protocol="http/protobuf", environ={"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://x:4318/custom"}
    )
    assert metrics_only.endpoint == "http://x:4318/custom"  # used as is, per the spec
    with_path = OtlpSettings.resolve(protocol="http/protobuf", endpoint="http://y:4318", environ={})
    assert with_path.endpoint == "http://y:4318/v1/metrics"
    with pytest.raises(ExporterConfigError, match="not supported"):
        OtlpSettings.resolve(protocol="thrift", endpoint="x", environ={}, protocol_option="--export-protocol")


def test_drop_counts_from_many_receiver_threads_add_up() -> None:
    delivery = Delivery(ScriptedTransport([]), MemoryQueue(max_items=1))
    threads, submits = 8, 2000

    def hammer() -> None:
        for _ in range(submits):
            delivery.submit(b"x")

    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible: an unlocked += loses counts
    try:
        workers = [threading.Thread(target=hammer) for _ in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
    finally:
        sys.setswitchinterval(switch)
    assert delivery.stats.dropped_overflow == threads * submits - 1
    assert len(delivery.queue) == 1


@attrs.define
class BlockingTransport:
    """A downstream that holds a send until released, and notes what happened in which order."""

    inside: threading.Event = attrs.field(factory=threading.Event)
    release: threading.Event = attrs.field(factory=threading.Event)
    events: list[str] = attrs.field(factory=list)

    def send(self, data: bytes) -> Attempt:
        self.inside.set()
        self.release.wait(10)
        self.events.append("sent")
        return Attempt(True)

    def close(self) -> None:
        self.events.append("closed")


def send_in_flight(tmp_path: Path) -> tuple[str, BlockingTransport, Delivery]:
    """A spooled delivery whose one request's send is running (and blocked until the test releases it)."""
    spool_path = str(tmp_path / "spool.sqlite")
    transport = BlockingTransport()
    delivery = Delivery(transport, SqliteSpool(spool_path))
    delivery.submit(payload("w1"))
    delivery.start()
    assert transport.inside.wait(10)
    return spool_path, transport, delivery


def test_stop_lets_a_send_in_flight_finish_and_remove_its_request(tmp_path: Path) -> None:
    spool_path, transport, delivery = send_in_flight(tmp_path)
    left: list[int] = []
    stopper = threading.Thread(target=lambda: left.append(delivery.stop(10)))
    stopper.start()
    transport.release.set()
    stopper.join(10)
    assert transport.events == ["sent", "closed"]  # never closed under a running send
    assert left == [0]
    assert len(SqliteSpool(spool_path)) == 0  # its remove was not lost: no duplicate after a restart


def test_stop_does_not_wait_for_a_send_in_flight_past_its_deadline(tmp_path: Path) -> None:
    spool_path, transport, delivery = send_in_flight(tmp_path)
    assert delivery.stop(0) == 1  # returned while the send still hangs: the shutdown grace holds
    assert transport.events == []  # and closed nothing under it
    transport.release.set()
    assert _eventually(lambda: len(SqliteSpool(spool_path)) == 0)  # the late send still removes its request


def _eventually(condition: Callable[[], bool]) -> bool:
    for _ in range(500):
        if condition():
            return True
        time.sleep(0.01)
    return False


def test_a_sender_waking_after_stop_finds_the_delivery_closed(tmp_path: Path) -> None:
    transport = ScriptedTransport([])
    delivery = Delivery(transport, SqliteSpool(str(tmp_path / "spool.sqlite")))
    delivery.stop(0)
    assert delivery.pump()  # no ProgrammingError from the closed spool
    assert transport.sent == []


def test_whether_and_where_a_downstream_is_configured() -> None:
    metrics_variable = {"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": " http://m:4318/v1/metrics ", **_GENERIC}
    assert configured_endpoint(None, {}) is None  # no downstream: never a guessed localhost
    assert configured_endpoint("  ", {"OTEL_EXPORTER_OTLP_ENDPOINT": ""}) is None
    assert configured_endpoint(None, _GENERIC) == "http://g:4317"
    assert configured_endpoint(None, metrics_variable) == "http://m:4318/v1/metrics"
    assert configured_endpoint("http://option:4317", metrics_variable) == "http://option:4317"


_GENERIC = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://g:4317"}


@attrs.define
class FlakyTransport:
    """Raises what no transport is meant to (a closed channel, a library bug) on its first ``failures`` sends."""

    failures: int = 1
    sent: list[bytes] = attrs.field(factory=list)
    done: threading.Event = attrs.field(factory=threading.Event)
    expect: int = 2

    def send(self, data: bytes) -> Attempt:
        if self.failures:
            self.failures -= 1
            raise RuntimeError("unforeseen")
        self.sent.append(data)
        if len(self.sent) >= self.expect:
            self.done.set()
        return Attempt(True)

    def close(self) -> None:
        return None


def test_an_unexpected_error_is_retried_with_backoff_and_the_sender_thread_survives() -> None:
    transport = FlakyTransport()
    delivery = Delivery(transport, initial_backoff_s=0.01, max_backoff_s=0.02)
    delivery.start()
    try:
        delivery.submit(b"w1")
        delivery.submit(b"w2")
        assert transport.done.wait(10)  # the first send raised; the thread retried and drained the queue
        assert transport.sent == [b"w1", b"w2"]
        assert delivery.stats.retries == 1
        assert delivery.stats.last_error == "RuntimeError: unforeseen"
        transport.done.clear()
        transport.expect = 3
        delivery.submit(b"w3")
        assert transport.done.wait(10)  # the sender thread is still there
    finally:
        assert delivery.stop(1) == 0


def test_pump_treats_an_unexpected_error_as_retryable() -> None:
    delivery = Delivery(FlakyTransport(), initial_backoff_s=0.5, jitter=lambda: 0.5)
    delivery.submit(b"w1")
    assert not delivery.pump()
    assert (delivery.backoff_s, len(delivery.queue)) == (0.5, 1)  # kept at the head, backed off
    assert delivery.pump()
    assert len(delivery.queue) == 0


def test_stop_leaves_a_transport_it_does_not_own_open() -> None:
    transport = BlockingTransport()
    transport.release.set()
    shared = Delivery(transport, owns_transport=False)
    shared.stop(0)
    owner = Delivery(transport)
    owner.stop(0)
    assert transport.events == ["closed"]  # by its owner only


def test_a_closed_spool_still_says_how_many_requests_it_kept(tmp_path: Path) -> None:
    spool = SqliteSpool(str(tmp_path / "spool.sqlite"))
    spool.put(payload("w1"))
    spool.put(payload("w2"))
    spool.close()
    spool.close()
    assert len(spool) == 2  # no ProgrammingError for a self-metrics scrape during shutdown
    assert spool.peek() is None
