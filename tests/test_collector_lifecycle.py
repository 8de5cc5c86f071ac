"""The outputs' and receivers' lifecycle: started in order, shut down in reverse, one failure isolated."""

from __future__ import annotations

import logging
import socket
from collections.abc import Sequence
from pathlib import Path

import attrs
import pytest

from otel_ofu.testing.otlp_requests import gpu_request
from otel_ofu_collector.config import AggregatorConfig
from otel_ofu_collector.lifecycle import shutdown_in_reverse, start_in_order
from otel_ofu_collector.outputs.feed_server import ReportFeed
from otel_ofu_collector.outputs.recorder import ReportRecorder
from otel_ofu_collector.results import WindowReport
from otel_ofu_collector.service import CollectorService
from tests.collector_helpers import collector_options

S = 1_000_000_000
W0 = 1_700_000_040 * S  # a multiple of 60 s: the windows [W0, W0 + 60 s) and on
T1 = W0 + 11 * S  # a 10 s interval (W0 + 1 s, W0 + 11 s]: inside the window at W0


@attrs.define
class Recording:
    """A window consumer writing what is done to it into a log shared with the others."""

    name: str
    log: list[str]
    fail_start: bool = False
    fail_shutdown: bool = False
    service: CollectorService | None = None  # to see, as it starts, whether the receivers listen yet

    def start(self) -> None:
        listening = self.service is not None and "grpc" in self.service.ports
        self.log.append(f"start {self.name}" + (" (receivers listening)" if listening else ""))
        if self.fail_start:
            raise OSError(f"{self.name} cannot start")

    def consume_windows(self, windows: Sequence[WindowReport]) -> None:
        self.log.append(f"windows {self.name} {[(report.start_ns - W0) // S for report in windows]}")

    def shutdown(self) -> None:
        self.log.append(f"shutdown {self.name}")
        if self.fail_shutdown:
            raise RuntimeError(f"{self.name} cannot shut down")


def service_with(*consumers: Recording, **overrides: object) -> CollectorService:
    options = collector_options(
        None, aggregator=AggregatorConfig(window_s=60.0, lateness_s=10.0), grpc_listen="127.0.0.1:0", **overrides
    )
    service = CollectorService(options, consumers=list(consumers), environ={})
    for consumer in consumers:
        consumer.service = service
    return service


def test_consumers_start_in_order_before_the_receivers_and_shut_down_in_reverse_after_the_last_windows() -> None:
    log: list[str] = []
    service = service_with(Recording("a", log), Recording("b", log), Recording("c", log))
    service.start()
    assert log == ["start a", "start b", "start c"]  # none sees a receiver listening: data comes after them
    assert "grpc" in service.ports
    service.ingest(gpu_request({"GPU-1": ("j", 0.5)}, time_ns=T1, sm_clock_hz=1.98e9))
    service.flush(W0 + 60 * S + 10 * S)  # the window at W0 is due at its end + lateness: W0 + 70 s
    service.ingest(gpu_request({"GPU-1": ("j", 0.5)}, time_ns=T1 + 60 * S, sm_clock_hz=1.98e9))
    log.clear()
    service.stop(grace=1)
    # The open window at W0 + 60 s goes to every consumer in order, then they shut down last first.
    assert log == ["windows a [60]", "windows b [60]", "windows c [60]", "shutdown c", "shutdown b", "shutdown a"]
    log.clear()
    service.stop(grace=1)
    assert log == []  # a second stop shuts nothing down twice


def test_a_failing_shutdown_is_logged_once_and_costs_none_of_the_others(caplog: pytest.LogCaptureFixture) -> None:
    log: list[str] = []
    service = service_with(Recording("a", log), Recording("b", log, fail_shutdown=True), Recording("c", log))
    service.start()
    grpc_port = service.ports["grpc"]
    with caplog.at_level(logging.ERROR, logger="otel_ofu_collector.lifecycle"):
        service.stop(grace=1)
    assert log[-3:] == ["shutdown c", "shutdown b", "shutdown a"]
    failures = [record for record in caplog.records if record.name == "otel_ofu_collector.lifecycle"]
    assert [record.getMessage() for record in failures] == ["shutting down Recording failed"]
    assert failures[0].exc_info is not None
    assert "b cannot shut down" in str(failures[0].exc_info[1])
    with socket.socket() as probe:  # the receiver after the failing consumer was stopped too: its port is free
        probe.bind(("127.0.0.1", grpc_port))


def test_a_failing_start_shuts_down_the_started_and_starts_nothing_after_it() -> None:
    log: list[str] = []
    service = service_with(Recording("a", log), Recording("b", log, fail_start=True), Recording("c", log))
    with pytest.raises(OSError, match=r"^b cannot start$"):
        service.start()
    assert log == ["start a", "start b", "shutdown a"]  # c never started, so never shut down; b never started
    assert service.ports == {}  # no receiver was built, none listens
    log.clear()
    service.stop(grace=0)
    assert log == []


def test_a_receiver_that_cannot_listen_shuts_the_started_consumers_down() -> None:
    log: list[str] = []
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = f"127.0.0.1:{busy.getsockname()[1]}"
        service = service_with(Recording("a", log), Recording("b", log), http_listen=taken)
        with pytest.raises(OSError, match=f"cannot listen for OTLP/HTTP on {taken}"):
            service.start()
    assert log == ["start a", "start b", "shutdown b", "shutdown a"]
    with socket.socket() as probe:  # the gRPC receiver, started before the HTTP one failed, was stopped
        probe.bind(("127.0.0.1", service.ports["grpc"]))


def test_the_service_starts_and_shuts_down_the_file_and_feed_outputs(tmp_path: Path) -> None:
    records = tmp_path / "windows.jsonl"
    recorder, feed = ReportRecorder(records), ReportFeed(port=0)
    options = collector_options(None, aggregator=AggregatorConfig(window_s=60.0, lateness_s=10.0))
    service = CollectorService(options, consumers=[recorder, feed], environ={})
    with pytest.raises(RuntimeError, match="not started"):
        _ = feed.bound_port
    service.start()
    port = feed.bound_port  # the service started it
    service.ingest(gpu_request({"GPU-1": ("j", 0.5)}, time_ns=T1, sm_clock_hz=1.98e9))
    service.stop(grace=1)
    assert recorder.written == 1
    assert len(records.read_text().splitlines()) == 1
    with pytest.raises(RuntimeError, match="not started"):
        _ = feed.bound_port  # shut down: the port is released
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", port))


def test_start_in_order_undoes_the_started_and_shutdown_in_reverse_counts_failures() -> None:
    done: list[str] = []

    def start(name: str) -> None:
        done.append(f"+{name}")
        if name == "z":
            raise ValueError("z")

    def shutdown(name: str) -> None:
        done.append(f"-{name}")
        if name == "y":
            raise RuntimeError("y")

    with pytest.raises(ValueError, match="z"):
        start_in_order(["x", "y", "z", "never"], start, shutdown)
    assert done == ["+x", "+y", "+z", "-y", "-x"]  # y's failing shutdown did not keep x running
    done.clear()
    assert shutdown_in_reverse(["x", "y", "w"], shutdown) == 1
    assert done == ["-w", "-y", "-x"]
