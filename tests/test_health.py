"""The liveness endpoint of ``run`` and ``collector`` (``--health-port``): 200 while the main loop beats, 503 once
it is stuck, which is what the Helm chart's liveness probes ask.

The real commands are asked over HTTP on loopback; a stuck loop is made in process: a source whose read blocks
(the producer) and a flush held on the aggregator's lock (the collector), with the endpoint each command builds.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator

import pytest

from otel_ofu.health import HealthEndpoint, Heartbeat, loop_bound_s
from otel_ofu.model import Snapshot
from otel_ofu.producer.loop import Producer
from otel_ofu.sources.simulated import SimulatedFleet
from otel_ofu.testing.otlp_sink import unused_port
from otel_ofu_collector.service import CollectorOptions, CollectorService

BOUND_S = 60.0  # the longest a process may take to answer on a loaded machine


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def wait_for(what: str, test: Callable[[], bool], bound_s: float = BOUND_S) -> None:
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        if test():
            return
        time.sleep(0.05)
    pytest.fail(f"no {what} within {bound_s:g} s")


def answers(url: str) -> Callable[[], bool]:
    def check() -> bool:
        try:
            return get(url)[0] == 200
        except OSError:
            return False

    return check


class ManualSeconds:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_heartbeat_is_healthy_while_it_beats_and_says_why_when_it_stops() -> None:
    clock = ManualSeconds()
    heart = Heartbeat(30.0, "the sampling loop", clock=clock)
    assert heart.check() == (True, "ok: starting, the sampling loop has not run yet")
    clock.now += 29.0
    heart.beat()
    clock.now += 2.5
    assert heart.check() == (True, "ok: the sampling loop ran 2.5 s ago")
    clock.now += 28.0  # 30.5 s since the beat
    assert heart.check() == (False, "the sampling loop has not run for 30 s (bound 30 s)")
    assert loop_bound_s(10.0) == 30.0
    assert loop_bound_s(60.0) == 180.0


def test_the_endpoint_answers_200_then_503_and_404_off_its_path() -> None:
    state = {"healthy": True}
    endpoint = HealthEndpoint(lambda: (state["healthy"], "ok" if state["healthy"] else "stuck"), port=0)
    endpoint.start()
    try:
        assert get(endpoint.url) == (200, "ok\n")
        state["healthy"] = False
        assert get(endpoint.url) == (503, "stuck\n")
        status, body = get(endpoint.url.replace("/healthz", "/metrics"))
        assert status == 404
        assert "/healthz" in body
    finally:
        endpoint.close()


class BlockingSource:
    """The simulated fleet, except that reads block once ``hang`` is set (an NVML call that never returns)."""

    name = "blocking"

    def __init__(self) -> None:
        self.fleet = SimulatedFleet.demo(seed=1)
        self.hang = threading.Event()
        self.release = threading.Event()

    def read(self) -> Snapshot:
        if self.hang.is_set():
            self.release.wait(30)
        return self.fleet.read()

    def close(self) -> None:
        self.release.set()


def test_a_producer_whose_read_hangs_turns_unhealthy() -> None:
    source = BlockingSource()
    heart = Heartbeat(0.5, "the sampling loop")
    producer = Producer(source=source, interval_s=0.05, observers=[heart.beat])
    endpoint = HealthEndpoint(heart.check, port=0)
    endpoint.start()
    runner = threading.Thread(target=producer.run, kwargs={"handle_signals": False}, daemon=True)
    runner.start()
    try:
        wait_for("a first beat", lambda: producer.cycles > 0)
        status, body = get(endpoint.url)
        assert status == 200
        assert body.startswith("ok: the sampling loop ran")
        source.hang.set()
        wait_for("a 503", lambda: get(endpoint.url)[0] == 503)
        assert "the sampling loop has not run for" in get(endpoint.url)[1]
    finally:
        producer.request_stop()
        source.release.set()
        runner.join(10)
        endpoint.close()


def test_a_collector_whose_flush_is_stuck_turns_unhealthy() -> None:
    service = CollectorService(CollectorOptions(grpc_listen="127.0.0.1:0", flush_interval_s=0.05), environ={})
    service.heartbeat = Heartbeat(0.5, "the window flush")
    endpoint = HealthEndpoint(service.health, port=0)
    service.start()
    endpoint.start()
    try:
        wait_for("a healthy collector", lambda: get(endpoint.url)[1].startswith("ok: the window flush ran"))
        with service.aggregator.lock:  # a flush that never gets the lock
            wait_for("a 503", lambda: get(endpoint.url)[0] == 503)
            assert "the window flush has not run for" in get(endpoint.url)[1]
        wait_for("a healthy collector again", lambda: get(endpoint.url)[0] == 200)
    finally:
        endpoint.close()
        service.stop(grace=1)


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=10)


def command(*args: str) -> list[str]:
    return [sys.executable, "-m", "otel_ofu.cli", *args]


def test_run_and_collector_serve_the_health_endpoint(processes: list[subprocess.Popen[str]]) -> None:
    producer_port, collector_port, grpc = unused_port(), unused_port(), unused_port()
    env = {**os.environ, "OTEL_OFU_HEALTH_PORT": str(producer_port)}  # the variable, as the chart sets it
    processes.append(
        subprocess.Popen(
            command("run", "--source", "sim", "--interval", "1", "--exporter", "none"),
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
    )
    processes.append(
        subprocess.Popen(
            command("collector", "--listen", f"127.0.0.1:{grpc}", "--health-port", str(collector_port)),
            stderr=subprocess.PIPE,
            text=True,
        )
    )
    for port, loop in ((producer_port, "the sampling loop"), (collector_port, "the window flush")):
        url = f"http://127.0.0.1:{port}/healthz"
        wait_for(f"a health answer on {port}", answers(url))
        assert get(url)[1].startswith("ok:")
        assert loop in get(url)[1]
    for process in processes:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=20)
        assert process.returncode == 0, stderr
