"""The read-only endpoints (the producer's and the collector's Prometheus /metrics, the report feed) against clients
that connect and say nothing, read nothing, poll without pause or leave mid-answer: each costs only itself, in
threads, descriptors, memory and log lines."""

from __future__ import annotations

import gc
import socket
import struct
import threading
import time
import tracemalloc
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import attrs
import pytest

from otel_ofu import names
from otel_ofu.producer.prometheus import PrometheusEndpoint as ProducerEndpoint
from otel_ofu_collector.outputs.feed_client import fetch_records
from otel_ofu_collector.outputs.feed_server import ReportFeed
from otel_ofu_collector.outputs.prometheus import PrometheusEndpoint as CollectorEndpoint
from otel_ofu_collector.results import WindowReport
from tests.test_report_records import fleet_reports

ATTACKER = "127.0.0.2"  # loopback too: the idle clients come from another address than the scraper's


@attrs.define
class Served:
    url: str  # what a good client asks for
    port: int
    stop: Callable[[], None]


def _collector_metrics() -> Served:
    endpoint = CollectorEndpoint(host="127.0.0.1", port=0)
    endpoint.start()
    return Served(f"http://127.0.0.1:{endpoint.port}/metrics", endpoint.port, endpoint.shutdown)


def _producer_metrics() -> Served:
    endpoint = ProducerEndpoint(port=0, addr="127.0.0.1")
    return Served(f"http://127.0.0.1:{endpoint.port}/metrics", endpoint.port, endpoint.close)


def _feed() -> Served:
    feed = ReportFeed(port=0)
    feed.start()
    feed.consume_windows(fleet_reports(3))
    return Served(feed.url, feed.bound_port, feed.shutdown)


ENDPOINTS = {"collector /metrics": _collector_metrics, "producer /metrics": _producer_metrics, "feed": _feed}


@pytest.fixture(params=sorted(ENDPOINTS))
def served(request: pytest.FixtureRequest) -> Iterator[Served]:
    found = ENDPOINTS[request.param]()
    yield found
    found.stop()


def _threads() -> int:
    return threading.active_count()


def _idle(port: int, count: int) -> list[socket.socket]:
    opened = []
    for _ in range(count):
        connection = socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(ATTACKER, 0))
        opened.append(connection)
    return opened


def _closed_by_the_server(connection: socket.socket, bound_s: float) -> bool:
    connection.settimeout(bound_s)
    try:
        while data := connection.recv(4096):
            if b" 503 " in data:
                return True
    except TimeoutError:
        return False
    except OSError:
        return True
    return True


def test_idle_connections_take_a_bounded_number_of_threads_and_a_scrape_still_answers(served: Served) -> None:
    before = _threads()
    idle = _idle(served.port, 200)
    try:
        time.sleep(0.5)
        assert _threads() - before <= 64, "a thread per idle connection"
        with urllib.request.urlopen(served.url, timeout=10) as response:  # from another address: answered
            assert response.status == 200
        # Beyond the bound a connection is answered 503 and closed at once, its descriptor freed.
        assert sum(_closed_by_the_server(c, 0.2) for c in idle[-100:]) == 100
    finally:
        for connection in idle:
            connection.close()


def test_an_idle_connection_is_closed_after_the_idle_timeout(served: Served) -> None:
    [connection] = _idle(served.port, 1)
    with connection:
        assert _closed_by_the_server(connection, 30.0)  # closed by the server, well before 30 s


def test_a_client_that_trickles_its_request_is_closed_too(served: Served) -> None:
    connection = socket.create_connection(("127.0.0.1", served.port), timeout=5)
    with connection:
        gone = False
        began = time.monotonic()
        for byte in b"GET /metrics HTTP/1.1\r\nHost: x\r\n" + b"X-Pad: y\r\n" * 100:
            try:
                connection.sendall(bytes([byte]))
            except OSError:
                gone = True
                break
            time.sleep(0.2)
            if time.monotonic() - began > 40:
                break
        assert gone or _closed_by_the_server(connection, 1.0)


def test_a_reader_that_leaves_mid_answer_logs_no_traceback(capfd: pytest.CaptureFixture[str]) -> None:
    feed = ReportFeed(port=0)
    feed.start()
    try:
        feed.consume_windows(_big_reports(windows=3, jobs=3000))
        for _ in range(5):
            connection = socket.create_connection(("127.0.0.1", feed.bound_port), timeout=5)
            connection.sendall(b"GET /reports.jsonl HTTP/1.1\r\nHost: x\r\n\r\n")
            connection.recv(10)
            connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # a reset
            connection.close()
        time.sleep(0.5)
        assert len(fetch_records(feed.url, timeout=10).reports) == 3  # still serving
    finally:
        feed.shutdown()
    _, err = capfd.readouterr()
    assert "Traceback" not in err


def _big_reports(windows: int, jobs: int) -> list[WindowReport]:
    """``windows`` of the fleet reports, each with ``jobs`` jobs (a large fleet's feed)."""
    base = fleet_reports(windows)
    out = []
    for report in base:
        job = report.jobs[0]
        many = tuple(attrs.evolve(job, job_id=f"job-{i:06d}-{'x' * 40}") for i in range(jobs))
        out.append(attrs.evolve(report, jobs=many))
    return out


def test_slow_readers_share_the_feed_rather_than_each_pinning_a_copy() -> None:
    feed = ReportFeed(port=0)
    feed.start()
    readers: list[socket.socket] = []
    try:
        feed.consume_windows(_big_reports(windows=4, jobs=5000))
        size = len(b"".join(feed.reply(None).parts))
        assert size > 4 * 2**20
        gc.collect()
        tracemalloc.start()
        for _ in range(8):  # ask, then read nothing
            reader = socket.create_connection(("127.0.0.1", feed.bound_port), timeout=5)
            reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            reader.sendall(b"GET /reports.jsonl HTTP/1.1\r\nHost: x\r\n\r\n")
            readers.append(reader)
        time.sleep(1.0)
        held, _ = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert held < size, f"8 slow readers hold {held / 2**20:.1f} MiB of a {size / 2**20:.1f} MiB feed"
    finally:
        for reader in readers:
            reader.close()
        feed.shutdown()


def test_the_feed_is_bounded_in_bytes_keeping_the_newest_windows() -> None:
    reports = _big_reports(windows=6, jobs=500)
    feed = ReportFeed(port=0, max_bytes=1)  # at least the newest window is always kept
    feed.consume_windows(reports)
    assert [r.end_ns for r in _parsed(feed)] == [reports[-1].end_ns]
    one = feed.held_bytes
    feed = ReportFeed(port=0, max_bytes=3 * one)
    feed.consume_windows(reports[:3])
    feed.consume_windows(reports[3:])
    assert [r.end_ns for r in _parsed(feed)] == [r.end_ns for r in reports[-3:]]
    assert feed.held_bytes <= 3 * one


def _parsed(feed: ReportFeed) -> list[Any]:
    from otel_ofu_collector.outputs.record_codec import parse_lines

    text = b"".join(feed.reply(None).parts).decode()
    return list(parse_lines(text.splitlines(), "feed").reports)


def test_the_metrics_page_of_many_jobs_is_rendered_once_per_window_and_served_from_memory() -> None:
    endpoint = CollectorEndpoint(host="127.0.0.1", port=0)
    endpoint.start()
    try:
        [report] = fleet_reports(1)
        job = report.jobs[0]
        jobs = tuple(attrs.evolve(job, job_id=f"job-{i:06d}") for i in range(20_000))
        endpoint.consume_windows([attrs.evolve(report, jobs=jobs)])
        url = f"http://127.0.0.1:{endpoint.port}/metrics"
        first = urllib.request.urlopen(url, timeout=60).read()
        rendered = endpoint.collector.renders
        for _ in range(3):
            assert urllib.request.urlopen(url, timeout=60).read().count(b"\njob_ofu{") == first.count(b"\njob_ofu{")
        assert endpoint.collector.renders == rendered  # the windows' part is not rendered again per scrape
        assert first.count(b"\njob_ofu{") == 20_000
        assert f"{names.JOB_OFU.name}".replace(".", "_").encode() in first
    finally:
        endpoint.shutdown()
