"""The collector's OTLP/HTTP receiver on loopback: protobuf, JSON, gzip, status codes, the SDK's HTTP exporter."""

from __future__ import annotations

import argparse
import contextlib
import gzip
import http.client
import json
import math
import select
import shutil
import socket
import ssl
import struct
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import attrs
import grpc
import pytest
from google.protobuf import json_format
from google.rpc import status_pb2  # type: ignore[import-untyped]
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.sdk.metrics.export import (
    Gauge,
    Metric,
    MetricExportResult,
    MetricsData,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from otel_ofu import names
from otel_ofu.testing.otlp_requests import T0, RecordingSink, gpu_request
from otel_ofu.testing.pki import make_pki
from otel_ofu_collector import command
from otel_ofu_collector.otlp.decode import DecodeOutcome, Decoder
from otel_ofu_collector.outputs.feed_server import ReportFeed
from otel_ofu_collector.receivers import http_framing
from otel_ofu_collector.receivers.admission import BodyBudget, Gate
from otel_ofu_collector.receivers.auth import BearerAuth, TlsFiles
from otel_ofu_collector.receivers.http_framing import parse_head
from otel_ofu_collector.receivers.otlp_http import HttpReceiver

INVALID_ARGUMENT = grpc.StatusCode.INVALID_ARGUMENT.value[0]


@attrs.define
class Running:
    receiver: HttpReceiver
    sink: RecordingSink
    gate: Gate

    def post(
        self, body: bytes, headers: Mapping[str, str] | None = None, path: str = "/v1/metrics"
    ) -> tuple[int, dict[str, str], bytes]:
        connection = http.client.HTTPConnection("127.0.0.1", self.receiver.port, timeout=10)
        try:
            connection.request(
                "POST", path, body=body, headers={"Content-Type": "application/x-protobuf", **(headers or {})}
            )
            response = connection.getresponse()
            return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
        finally:
            connection.close()


@attrs.define
class Held:
    """An ingest that holds each request it is given (those holding ``only``'s bytes, when given) inside the collector
    until ``release``, keeping every request's bytes in ``seen`` and saying when one is ``inside``."""

    only: bytes | None = None
    inside: threading.Event = attrs.Factory(threading.Event)
    release: threading.Event = attrs.Factory(threading.Event)
    seen: list[bytes] = attrs.Factory(list)
    decoder: Decoder = attrs.Factory(lambda: Decoder(RecordingSink()))

    def __call__(self, raw: bytes) -> DecodeOutcome:
        self.seen.append(raw)
        if self.only is None or self.only in raw:
            self.inside.set()
            self.release.wait(10)
        return self.decoder.decode_bytes(raw)


def _start(
    auth: BearerAuth | None = None,
    gate: Gate | None = None,
    ingest: object = None,
    inline_when: Callable[[], bool] | None = None,
) -> Running:
    sink = RecordingSink()
    decoder = Decoder(sink)
    gate = gate or Gate(max_in_flight=4, retry_after_s=2.0)
    receiver = HttpReceiver(
        ingest or decoder.decode_bytes,  # type: ignore[arg-type]
        gate,
        "127.0.0.1:0",
        None,
        auth,
        inline_when=inline_when,
    )
    receiver.start()
    return Running(receiver, sink, gate)


@pytest.fixture
def running() -> Iterator[Running]:
    server = _start()
    yield server
    server.receiver.stop()


def test_protobuf_request_is_accepted(running: Running) -> None:
    status, headers, body = running.post(gpu_request({"GPU-1": 0.5}).SerializeToString())
    assert status == 200
    assert headers["content-type"] == "application/x-protobuf"
    assert not ExportMetricsServiceResponse.FromString(body).HasField("partial_success")
    assert running.sink.ofu[0][:2] == ("node-1|GPU-1", 0.5)


def test_json_request_answers_in_json_with_partial_success(running: Running) -> None:
    request = gpu_request({"GPU-1": 0.25, "GPU-2": 2.0})
    body = json_format.MessageToJson(request).encode()
    status, headers, reply = running.post(body, {"Content-Type": "application/json"})
    assert status == 200
    assert headers["content-type"] == "application/json"
    parsed = json.loads(reply)
    assert parsed["partialSuccess"]["rejectedDataPoints"] == "1"
    assert [call[1] for call in running.sink.ofu] == [0.25]


def test_gzip_body(running: Running) -> None:
    body = gzip.compress(gpu_request({"GPU-1": 0.75}).SerializeToString())
    status, _, _ = running.post(body, {"Content-Encoding": "gzip"})
    assert status == 200
    assert running.sink.ofu[0][1] == 0.75


def test_malformed_bodies_are_400_and_state_survives(running: Running) -> None:
    for body, headers in (
        (b"\xff\xff\xff", {}),
        (b"{not json", {"Content-Type": "application/json"}),
        (b"not gzip", {"Content-Encoding": "gzip"}),
    ):
        status, _, reply = running.post(body, headers)
        assert status == 400
        if headers.get("Content-Type") == "application/json":
            parsed = json.loads(reply)
            assert "malformed" in parsed["message"]
            assert parsed["code"] == INVALID_ARGUMENT
        else:
            error = status_pb2.Status.FromString(reply)
            assert (error.code, bool(error.message)) == (INVALID_ARGUMENT, True)
    assert running.sink.ofu == []
    assert running.post(gpu_request({"GPU-1": 0.1}).SerializeToString())[0] == 200


def _code(reply: bytes) -> int:
    return int(status_pb2.Status.FromString(reply).code)


def test_wrong_path_and_content_type(running: Running) -> None:
    status, _, reply = running.post(b"", path="/v1/traces")
    assert (status, _code(reply)) == (404, grpc.StatusCode.NOT_FOUND.value[0])
    status, _, reply = running.post(b"x", {"Content-Type": "text/plain"})
    assert (status, _code(reply)) == (415, INVALID_ARGUMENT)


def test_oversized_body_is_413() -> None:
    sink = RecordingSink()
    receiver = HttpReceiver(Decoder(sink).decode_bytes, Gate(), "127.0.0.1:0", max_request_bytes=1024)
    receiver.start()
    try:
        server = Running(receiver, sink, Gate())
        status, _, reply = server.post(b"\x00" * 2048)
        assert (status, _code(reply)) == (413, INVALID_ARGUMENT)
        bomb = gzip.compress(b"\x00" * 100_000)
        assert server.post(bomb, {"Content-Encoding": "gzip"})[0] == 413
    finally:
        receiver.stop()


def test_bearer_auth_is_401() -> None:
    server = _start(auth=BearerAuth("tok"))
    try:
        body = gpu_request({"GPU-1": 0.5}).SerializeToString()
        status, headers, reply = server.post(body)
        assert (status, _code(reply)) == (401, grpc.StatusCode.UNAUTHENTICATED.value[0])
        assert headers["www-authenticate"] == "Bearer"
        assert server.post(body, {"Authorization": "Bearer wrong"})[0] == 401
        assert server.post(body, {"Authorization": "Bearer tok"})[0] == 200
        assert len(server.sink.ofu) == 1
    finally:
        server.receiver.stop()


def test_overload_and_shutdown_are_503_with_retry_after() -> None:
    held = Held()
    inside, release = held.inside, held.release
    server = _start(gate=Gate(max_in_flight=1, retry_after_s=2.0), ingest=held)
    body = gpu_request({"GPU-1": 0.5}).SerializeToString()
    try:
        first = threading.Thread(target=server.post, args=(body,))
        first.start()
        assert inside.wait(10)
        status, headers, reply = server.post(body)
        assert (status, headers["retry-after"]) == (503, "2")
        assert _code(reply) == grpc.StatusCode.UNAVAILABLE.value[0]
        release.set()
        first.join(10)
        server.gate.close()
        status, headers, _ = server.post(body)
        assert (status, headers["retry-after"]) == (503, "2")
    finally:
        release.set()
        server.receiver.stop()


def test_requests_behind_a_slow_one_answered_inline_wait_their_turn_and_are_all_taken() -> None:
    """One thread serves every connection: while a request answered on it (inline) is inside a slow collector, the
    next (from another client) waits in its connection, unanswered, and is taken once the first is out; nothing is
    refused or lost."""
    held = Held(only=b"GPU-1")
    inside, release, seen = held.inside, held.release, held.seen
    server = _start(gate=Gate(max_in_flight=4, retry_after_s=2.0), ingest=held, inline_when=lambda: True)
    first_body = gpu_request({"GPU-1": 0.5}).SerializeToString()
    second_body = gpu_request({"GPU-2": 0.25}).SerializeToString()
    statuses: dict[str, int] = {}
    try:
        first = threading.Thread(target=lambda: statuses.update(first=server.post(first_body)[0]))
        first.start()
        assert inside.wait(10)
        second = threading.Thread(target=lambda: statuses.update(second=server.post(second_body)[0]))
        second.start()
        second.join(0.5)
        assert second.is_alive()
        assert statuses == {}
        release.set()
        first.join(10)
        second.join(10)
        assert statuses == {"first": 200, "second": 200}
        assert seen == [first_body, second_body]
    finally:
        release.set()
        server.receiver.stop()


def test_a_small_protobuf_request_is_answered_inline_while_the_windows_are_free_and_any_other_on_a_worker() -> None:
    """As the gRPC receiver: inline (on the server's thread) only a protobuf request of at most 256 KiB, identity
    encoded, while ``inline_when`` says so; JSON, gzip, a larger body, or the windows busy: on a worker thread."""
    threads: list[str] = []
    decoder = Decoder(RecordingSink())

    def ingest(raw: bytes) -> DecodeOutcome:
        threads.append(threading.current_thread().name)
        return decoder.decode_bytes(raw)

    free = [True]
    server = _start(ingest=ingest, inline_when=lambda: free[0])
    request = gpu_request({"GPU-1": 0.5})
    small = request.SerializeToString()
    large = gpu_request({f"GPU-{i}": 0.5 for i in range(1200)}).SerializeToString()
    assert len(small) < 256 * 1024 < len(large)
    try:
        assert server.post(small)[0] == 200
        assert server.post(gzip.compress(small), {"Content-Encoding": "gzip"})[0] == 200
        assert server.post(json_format.MessageToJson(request).encode(), {"Content-Type": "application/json"})[0] == 200
        assert server.post(large)[0] == 200
        free[0] = False  # a window closing holds the lock
        assert server.post(small)[0] == 200
    finally:
        server.receiver.stop()
    assert [name.startswith("otlp-http-worker") for name in threads] == [False, True, True, True, True]
    assert threads[0] == "otlp-http"


def test_a_request_answered_on_a_worker_holds_no_other_client() -> None:
    """Off the loop, a request stuck in a slow collector leaves the server reading and answering the rest."""
    held = Held(only=b"GPU-1")
    release = held.release
    server = _start(gate=Gate(max_in_flight=4), ingest=held, inline_when=None)
    statuses: list[int] = []
    try:
        stuck = threading.Thread(
            target=lambda: statuses.append(server.post(gpu_request({"GPU-1": 0.5}).SerializeToString())[0])
        )
        stuck.start()
        assert held.inside.wait(10)
        assert server.post(gpu_request({"GPU-2": 0.25}).SerializeToString())[0] == 200  # while GPU-1 is held
        assert statuses == []
        release.set()
        stuck.join(10)
        assert statuses == [200]
    finally:
        release.set()
        server.receiver.stop()


def test_a_stop_with_a_request_on_a_worker_returns_and_its_body_is_released_when_the_worker_ends() -> None:
    held = Held()
    inside, release = held.inside, held.release
    server = _start(ingest=held)
    body = gpu_request({"GPU-1": 0.5}).SerializeToString()
    sock = socket.create_connection(("127.0.0.1", server.receiver.port), timeout=10)
    try:
        sock.sendall(
            b"POST /v1/metrics HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        assert inside.wait(10)
        bodies = server.receiver.bodies
        assert bodies.bytes == len(body)
        server.receiver.stop()  # the connection is cut; the worker is still inside the collector
        assert sock.recv(100) == b""
        assert bodies.bytes == len(body)  # still held by the worker: given back only when it ends
        release.set()
        _wait_for(lambda: bodies.bytes == 0)
    finally:
        release.set()
        sock.close()


def test_a_stop_with_a_request_stuck_on_the_loop_returns_and_says_so(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A request answered on the loop that never comes back out of the collector cannot be cut short; a stop waits
    its bound (here 0.2 s for the shutdown and 0.2 s for the loop's thread), says so in one line and returns, rather
    than wait on it for ever."""
    monkeypatch.setattr(http_framing, "_STOP_S", 0.2)
    held = Held()
    server = _start(ingest=held, inline_when=lambda: True)
    poster = threading.Thread(target=lambda: server.post(gpu_request({"GPU-1": 0.5}).SerializeToString()))
    try:
        poster.start()
        assert held.inside.wait(10)
        stopping = threading.Thread(target=server.receiver.stop)
        stopping.start()
        stopping.join(5)  # before: the stop waited on the loop's thread without a bound (here the 10 s Held holds)
        assert not stopping.is_alive()
        said = [record.getMessage() for record in caplog.records if "not stopped within" in record.getMessage()]
        assert said == [
            "HTTP server otlp-http: not stopped within 0.2 s (a request stuck inside the collector); left to the exit"
        ]
    finally:
        held.release.set()
        poster.join(10)


def test_the_sdk_http_exporter_delivers(running: Running) -> None:
    resource = Resource.create({names.HW_ID: "GPU-9", names.HOST_NAME: "h", names.JOB_ID: "j"})
    point = NumberDataPoint(attributes={}, start_time_unix_nano=0, time_unix_nano=T0, value=0.33)
    data = MetricsData(
        [
            ResourceMetrics(
                resource,
                [ScopeMetrics(InstrumentationScope("x"), [Metric(names.GPU_OFU.name, "", "1", Gauge([point]))], "")],
                "",
            )
        ]
    )
    exporter = OTLPMetricExporter(endpoint=f"http://127.0.0.1:{running.receiver.port}/v1/metrics", timeout=10)
    try:
        assert exporter.export(data) is MetricExportResult.SUCCESS
    finally:
        exporter.shutdown()
    assert running.sink.ofu[0][:2] == ("h|GPU-9", 0.33)
    assert not math.isnan(running.sink.ofu[0][1])


def test_a_failing_ingest_is_500_internal() -> None:
    def broken(raw: bytes) -> DecodeOutcome:
        raise RuntimeError("boom")

    server = _start(ingest=broken)
    try:
        status, _, reply = server.post(gpu_request({"GPU-1": 0.5}).SerializeToString())
        assert (status, _code(reply)) == (500, grpc.StatusCode.INTERNAL.value[0])
    finally:
        server.receiver.stop()


# --- message framing, on a raw socket ---------------------------------------------------------------


@attrs.frozen
class RawReply:
    status: int
    body: bytes
    closed: bool  # the server closed the connection after answering


def _raw(port: int, data: bytes, *, half_close: bool = False) -> RawReply:
    """Send ``data`` as is, read one response, and tell whether the server then closed the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(data)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        response = http.client.HTTPResponse(sock)
        response.begin()
        body = response.read()
        return RawReply(response.status, body, sock.recv(1) == b"")


def _head(body_headers: str, *, path: str = "/v1/metrics") -> bytes:
    return f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n{body_headers}\r\n".encode()


def _chunked(body: bytes, size: int = 7) -> bytes:
    chunks = [body[i : i + size] for i in range(0, len(body), size)]
    return b"".join(b"%x;ext=1\r\n%s\r\n" % (len(chunk), chunk) for chunk in chunks) + b"0\r\nX-Trailer: t\r\n\r\n"


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ("", 411),  # no framing at all: the body's end is unknown
        ("Content-Length: -1\r\n", 400),  # rfile.read(-1) would block for ever, holding a gate slot
        ("Content-Length: abc\r\n", 400),
        ("Content-Length: 5, 6\r\n", 400),
        ("Content-Length: 5\r\nContent-Length: 6\r\n", 400),
        ("Content-Length: \u0665\r\n", 400),  # a digit to str.isdigit, not to HTTP
        ("Transfer-Encoding: gzip, chunked\r\n", 400),
    ],
)
def test_bad_framing_is_refused_and_the_connection_closed(headers: str, status: int) -> None:
    server = _start(gate=Gate(max_in_flight=1))
    try:
        reply = _raw(server.receiver.port, _head(headers) + b"\x0a\x00")
        assert (reply.status, reply.closed) == (status, True)
        assert _code(reply.body) == INVALID_ARGUMENT
        assert server.gate.in_flight == 0
        assert server.post(gpu_request({"GPU-1": 0.5}).SerializeToString())[0] == 200  # the one slot is free
        assert len(server.sink.ofu) == 1
    finally:
        server.receiver.stop()


@pytest.mark.parametrize(
    ("head", "status"),
    [
        (b"POST /v1/metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n", 400),  # no Host (RFC 9112 3.2)
        (b"POST /v1/metrics HTTP/2.0\r\nHost: x\r\n\r\n", 505),
        (b"POST /v1/metrics HTTP/1.1\r\nHost: x\r\nX: a\r\n folded\r\n\r\n", 400),  # obsolete line folding
        (b"POST /v1/metrics HTTP/1.1\r\nHost: x\r\nX: a\x00b\r\n\r\n", 400),  # NUL in a value
        (b"POST /v1/metrics HTTP/1.1\r\nHost: x\r\nX : a\r\n\r\n", 400),  # whitespace before the colon
        (b"POST /v1/metrics HTTP/1.1\r\nHost: x\r\n" + b"X: a\r\n" * 101 + b"\r\n", 431),  # 102 header lines
        (b"POST /v1/metrics HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400),  # RFC 9112 6.1
    ],
    ids=["no-host", "http-2", "folded", "nul", "space-colon", "too-many-headers", "chunked-http-1.0"],
)
def test_malformed_heads_are_refused_and_the_connection_closed(head: bytes, status: int) -> None:
    server = _start(gate=Gate(max_in_flight=1))
    try:
        reply = _raw(server.receiver.port, head)
        assert (reply.status, reply.closed) == (status, True)
        assert server.post(gpu_request({"GPU-1": 0.5}).SerializeToString())[0] == 200
    finally:
        server.receiver.stop()


def test_header_values_are_read_trimmed_as_sent_whichever_way_the_head_is_read() -> None:
    """Values keep inner blanks and bytes past ASCII and lose the blanks around them; repeated names keep every value
    in order. The head with two CRs before a line's LF is the one not read in one match (read line by line, as
    before): the same result."""
    head = (
        b"POST /v1/metrics?x=1 HTTP/1.1\r\nHost: h:4318\r\nContent-Type: \t application/x-protobuf \t\r\n"
        b"X-Note: caf\xe9  au lait\r\nx-note:second\r\nEmpty:"  # as the reader hands it: no empty line at its end
    )
    expected = {
        "host": ["h:4318"],
        "content-type": ["application/x-protobuf"],
        "x-note": ["caf\u00e9  au lait", "second"],
        "empty": [""],
    }
    parsed = parse_head(head, "10.0.0.1")
    assert (parsed.method, parsed.path, parsed.version, parsed.peer) == ("POST", "/v1/metrics", "HTTP/1.1", "10.0.0.1")
    assert parsed.headers == expected
    assert parse_head(head.replace(b"lait\r\n", b"lait\r\r\n"), "10.0.0.1").headers == expected


def test_a_chunked_body_is_read_and_the_connection_kept(running: Running) -> None:
    first = gpu_request({"GPU-1": 0.5}).SerializeToString()
    second = gpu_request({"GPU-2": 0.25}).SerializeToString()
    chunked = _head("Transfer-Encoding: chunked\r\n") + _chunked(first)
    then = _head(f"Content-Length: {len(second)}\r\nConnection: close\r\n") + second
    with socket.create_connection(("127.0.0.1", running.receiver.port), timeout=10) as sock:
        sock.sendall(chunked + then)  # one keep-alive connection: nothing of the first body may be left over
        answers = b""
        while chunk := sock.recv(65536):
            answers += chunk
    assert answers.count(b"HTTP/1.1 200 OK\r\n") == 2
    assert [(call[0], call[1]) for call in running.sink.ofu] == [("node-1|GPU-1", 0.5), ("node-1|GPU-2", 0.25)]


@pytest.mark.parametrize(
    ("body", "status"),
    [
        (b"zz\r\nabc\r\n0\r\n\r\n", 400),  # not a hex size
        (b"3\r\nabcdef\r\n0\r\n\r\n", 400),  # a chunk longer than its size
        (b"3\r\nabc\r\n", 400),  # ends before the last chunk
        (b"400\r\n" + b"x" * 1024 + b"\r\n" + b"400\r\n" + b"x" * 1024 + b"\r\n0\r\n\r\n", 413),
    ],
)
def test_bad_chunked_bodies_are_refused(body: bytes, status: int) -> None:
    sink = RecordingSink()
    gate = Gate(max_in_flight=1)
    receiver = HttpReceiver(Decoder(sink).decode_bytes, gate, "127.0.0.1:0", max_request_bytes=1500)
    receiver.start()
    try:
        reply = _raw(receiver.port, _head("Transfer-Encoding: chunked\r\n") + body, half_close=True)
        assert (reply.status, reply.closed, _code(reply.body)) == (status, True, INVALID_ARGUMENT)
        assert gate.in_flight == 0  # the handler has returned: the connection is closed
        assert sink.ofu == []
    finally:
        receiver.stop()


def test_a_body_shorter_than_its_length_is_400(running: Running) -> None:
    reply = _raw(running.receiver.port, _head("Content-Length: 100\r\n") + b"\x0a\x00", half_close=True)
    assert (reply.status, reply.closed) == (400, True)
    assert running.gate.in_flight == 0
    assert running.sink.ofu == []


def test_a_stalled_body_times_out_and_frees_its_reader_slot() -> None:
    sink = RecordingSink()
    gate = Gate(max_in_flight=1)
    receiver = HttpReceiver(
        Decoder(sink).decode_bytes, gate, "127.0.0.1:0", read_timeout_s=0.2, bodies=BodyBudget(max_readers=1)
    )
    receiver.start()
    try:
        reply = _raw(receiver.port, _head("Content-Length: 100\r\n") + b"\x0a")  # and then nothing
        assert (reply.status, reply.closed) == (408, True)
        assert _code(reply.body) == grpc.StatusCode.DEADLINE_EXCEEDED.value[0]
        _wait_for(lambda: receiver.bodies is not None and receiver.bodies.readers == 0)
    finally:
        receiver.stop()


def _wait_for(condition: Callable[[], bool]) -> None:
    """Until ``condition`` holds: the handler thread finishes just after its answer is on the wire."""
    for _ in range(500):
        if condition():
            return
        time.sleep(0.01)
    raise AssertionError("condition never held")


def _closed(sock: socket.socket) -> bool:
    """The server closed the connection (a reset counts: it closed with our unread body in its buffer)."""
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


@pytest.mark.parametrize("refusal", [401, 404, 503])
def test_a_refused_request_declaring_a_huge_body_is_answered_without_reading_it(refusal: int) -> None:
    sink = RecordingSink()
    gate = Gate(max_in_flight=0 if refusal == 503 else 4)  # 0: every request is over the bound
    # Were the 60 MiB read (the client sends 64 KiB of it, then waits), the read timeout would end the
    # connection without any answer.
    receiver = HttpReceiver(
        Decoder(sink).decode_bytes, gate, "127.0.0.1:0", auth=BearerAuth("tok") if refusal == 401 else None,
        read_timeout_s=3.0,
    )  # fmt: skip
    receiver.start()
    try:
        head = _head(f"Content-Length: {60 * 1024 * 1024}\r\n", path="/v1/metrics" if refusal != 404 else "/v1/x")
        with socket.create_connection(("127.0.0.1", receiver.port), timeout=10) as sock:
            sock.sendall(head + b"\x00" * 65536)
            response = http.client.HTTPResponse(sock)
            response.begin()
            response.read()
            assert (response.status, response.getheader("Connection")) == (refusal, "close")
            assert _closed(sock)
        assert sink.ofu == []
    finally:
        receiver.stop()


def test_a_small_refused_body_is_read_and_the_connection_kept() -> None:
    server = _start(auth=BearerAuth("tok"))
    body = gpu_request({"GPU-1": 0.5}).SerializeToString()
    refused = _head(f"Content-Length: {len(body)}\r\n") + body
    accepted = _head(f"Authorization: Bearer tok\r\nContent-Length: {len(body)}\r\nConnection: close\r\n") + body
    try:
        with socket.create_connection(("127.0.0.1", server.receiver.port), timeout=10) as sock:
            sock.sendall(refused + accepted)  # one connection: the refused body must be consumed exactly
            answers = b""
            while chunk := sock.recv(65536):
                answers += chunk
        assert answers.startswith(b"HTTP/1.1 401 ")
        assert answers.count(b"HTTP/1.1 200 OK\r\n") == 1
        assert [call[1] for call in server.sink.ofu] == [0.5]
    finally:
        server.receiver.stop()


@pytest.mark.parametrize(
    ("framing", "drip"),
    [
        ("Content-Length: 100\r\n", b"\x00" * 100),
        ("Transfer-Encoding: chunked\r\n", b"64\r\n" + b"\x00" * 100 + b"\r\n0\r\n\r\n"),
    ],
    ids=["content-length", "chunked"],
)
def test_a_dripping_body_hits_the_overall_deadline_and_frees_its_reader_slot(framing: str, drip: bytes) -> None:
    sink = RecordingSink()
    gate = Gate(max_in_flight=1)
    # Never silent for the read timeout, so only the body's overall deadline can stop it.
    receiver = HttpReceiver(
        Decoder(sink).decode_bytes,
        gate,
        "127.0.0.1:0",
        read_timeout_s=10.0,
        body_deadline_s=0.5,
        bodies=BodyBudget(max_readers=1),
    )
    receiver.start()
    try:
        with socket.create_connection(("127.0.0.1", receiver.port), timeout=10) as sock:
            sock.sendall(_head(framing))
            for byte in drip:  # a byte every 50 ms: about 5 s for the whole body, far past the deadline
                if select.select([sock], [], [], 0.05)[0]:
                    break  # answered
                try:
                    sock.sendall(bytes([byte]))
                except OSError:
                    break
            response = http.client.HTTPResponse(sock)
            response.begin()
            assert _code(response.read()) == grpc.StatusCode.DEADLINE_EXCEEDED.value[0]
            assert (response.status, response.getheader("Connection")) == (408, "close")
            assert _closed(sock)
        _wait_for(lambda: receiver.bodies is not None and receiver.bodies.readers == 0)
        running = Running(receiver, sink, gate)
        assert running.post(gpu_request({"GPU-1": 0.5}).SerializeToString())[0] == 200  # the one slot is free
    finally:
        receiver.stop()


@pytest.mark.parametrize("reset", [True, False], ids=["reset", "close"])
def test_a_client_leaving_mid_body_leaves_no_traceback(capfd: pytest.CaptureFixture[str], reset: bool) -> None:
    server = _start(gate=Gate(max_in_flight=1))
    before = set(threading.enumerate())
    try:
        sock = socket.create_connection(("127.0.0.1", server.receiver.port), timeout=10)
        sock.sendall(_head("Content-Length: 1000\r\n") + b"\x0a\x00")
        bodies = server.receiver.bodies
        _wait_for(lambda: bodies is not None and bodies.readers == 1)  # the handler is reading the body
        if reset:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()
        for thread in set(threading.enumerate()) - before:
            if "process_request" in thread.name:
                thread.join(10)
        assert "Traceback" not in capfd.readouterr().err
        assert server.post(gpu_request({"GPU-1": 0.5}).SerializeToString())[0] == 200
    finally:
        server.receiver.stop()


# --- lifecycle ------------------------------------------------------------------------------------


def test_a_busy_port_is_one_line_oserror(running: Running) -> None:
    listen = f"127.0.0.1:{running.receiver.port}"
    second = HttpReceiver(Decoder(RecordingSink()).decode_bytes, Gate(), listen)
    with pytest.raises(OSError, match=f"cannot listen for OTLP/HTTP on {listen}") as caught:
        second.start()
    assert "\n" not in str(caught.value)


def test_stop_joins_the_server_thread() -> None:
    before = set(threading.enumerate())
    server = _start()
    started = [thread for thread in set(threading.enumerate()) - before if thread.name == "otlp-http"]
    server.receiver.stop()
    assert started
    assert not any(thread.is_alive() for thread in started)


def test_https_a_client_that_never_handshakes_blocks_no_one(tmp_path: Path) -> None:
    pki = make_pki(tmp_path)
    sink = RecordingSink()
    receiver = HttpReceiver(
        Decoder(sink).decode_bytes, Gate(max_in_flight=4, retry_after_s=2.0), "127.0.0.1:0",
        TlsFiles(str(pki.server_cert), str(pki.server_key)), None, read_timeout_s=30.0,
    )  # fmt: skip
    receiver.start()
    silent = socket.create_connection(("127.0.0.1", receiver.port), timeout=5)  # connects, never says hello
    try:
        context = ssl.create_default_context(cafile=str(pki.ca))
        connection = http.client.HTTPSConnection("127.0.0.1", receiver.port, timeout=5, context=context)
        connection.request(
            "POST", "/v1/metrics", body=gpu_request({"GPU-1": 0.7}).SerializeToString(),
            headers={"Content-Type": "application/x-protobuf"},
        )  # fmt: skip
        assert connection.getresponse().status == 200
        connection.close()
        assert [point[1] for point in sink.ofu] == [0.7]
    finally:
        silent.close()
        receiver.stop()


# --- hostile clients: the body budget counts bytes received, per peer, under a minimum rate ---------------


def _connect(port: int, source: str = "127.0.0.1") -> socket.socket:
    """A connection from ``source`` (any 127.x address is loopback on Linux: a peer of its own)."""
    return socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0))


def _post_from(port: int, source: str, body: bytes) -> int:
    with _connect(port, source) as sock:
        sock.sendall(_head(f"Content-Length: {len(body)}\r\nConnection: close\r\n") + body)
        response = http.client.HTTPResponse(sock)
        response.begin()
        response.read()
        return response.status


def _gpu_data(value: float) -> MetricsData:
    resource = Resource.create({names.HW_ID: "GPU-9", names.HOST_NAME: "h", names.JOB_ID: "j"})
    point = NumberDataPoint(attributes={}, start_time_unix_nano=0, time_unix_nano=T0, value=value)
    metric = Metric(names.GPU_OFU.name, "", "1", Gauge([point]))
    return MetricsData([ResourceMetrics(resource, [ScopeMetrics(InstrumentationScope("x"), [metric], "")], "")])


@attrs.define
class Drip:
    """Slow senders: connections that declared a body and send one byte of it a second, on one thread."""

    socks: list[socket.socket]
    stop: threading.Event = attrs.field(factory=threading.Event)
    thread: threading.Thread | None = None

    def start(self) -> None:
        def drip() -> None:
            while not self.stop.wait(1.0):
                for sock in self.socks:
                    with contextlib.suppress(OSError):  # answered and closed
                        sock.send(b"\x00")

        self.thread = threading.Thread(target=drip, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join(10)
        for sock in self.socks:
            sock.close()


def _drip(port: int, source: str, count: int, declared: int) -> Drip:
    socks = []
    for _ in range(count):
        sock = _connect(port, source)
        sock.sendall(_head(f"Content-Length: {declared}\r\n") + b"\x0a")
        socks.append(sock)
    drip = Drip(socks)
    drip.start()
    return drip


def test_slow_clients_declaring_big_bodies_leave_a_healthy_exporter_served() -> None:
    # The collector's defaults (--max-in-flight 64): before, the budget reserved declared bytes, 4 x 64 MiB in
    # all for at most 4 x 64 = 256 readers, so 4 bodies declaring 64 MiB, or 300 declaring 1 MiB, each sent at
    # a byte a second, made every other request 503. Counted as received they hold 1 byte each + 1/s.
    sink = RecordingSink()
    receiver = HttpReceiver(Decoder(sink).decode_bytes, Gate(max_in_flight=64), "127.0.0.1:0", body_grace_s=60.0)
    receiver.start()
    drips: list[Drip] = []
    exporter = OTLPMetricExporter(endpoint=f"http://127.0.0.1:{receiver.port}/v1/metrics", timeout=5)
    threads = threading.active_count()
    try:
        # Each 64 MiB one from a peer of its own (one peer would have 3 of its 4 refused at once: 64 MiB is its
        # share), the 1 MiB ones all from one more.
        drips.extend(_drip(receiver.port, f"127.0.0.{2 + peer}", 1, 64 * 1024 * 1024) for peer in range(4))
        drips.append(_drip(receiver.port, "127.0.0.6", 300, 1024 * 1024))
        bodies = receiver.bodies
        _wait_for(lambda: bodies.readers == 304)
        assert threading.active_count() == threads + len(drips)  # the drips' own: the receiver holds none per client
        for value in (0.25, 0.35, 0.45):
            assert exporter.export(_gpu_data(value)) is MetricExportResult.SUCCESS  # before: FAILURE (503s)
            assert _post_from(receiver.port, "127.0.0.1", gpu_request({"GPU-1": 0.5}).SerializeToString()) == 200
        _wait_for(lambda: bodies.readers == 304)  # the slow ones were still there all along (the last answer's
        # lease goes just after it is written)
        # 304 bytes and 304 a second since: far below a MiB, where before 4 x 64 + 300 x 1 MiB were reserved.
        assert bodies.bytes < 1024 * 1024
        assert [point[1] for point in sink.ofu] == [0.25, 0.5, 0.35, 0.5, 0.45, 0.5]
    finally:
        exporter.shutdown()
        for drip in drips:
            drip.close()
        receiver.stop()


def test_a_body_below_the_minimum_rate_is_cut_off_408_after_the_grace_and_its_bytes_released() -> None:
    sink = RecordingSink()
    gate = Gate(max_in_flight=1)
    receiver = HttpReceiver(
        Decoder(sink).decode_bytes, gate, "127.0.0.1:0", read_timeout_s=10.0, body_min_rate=1000.0, body_grace_s=0.3
    )
    receiver.start()
    try:
        # 20 bytes/s against 1000: the deadline, start + 0.3 s + received / 1000 s, is passed at about 0.31 s.
        with _connect(receiver.port) as sock:
            sock.sendall(_head("Content-Length: 100\r\n"))
            for _ in range(100):
                if select.select([sock], [], [], 0.05)[0]:
                    break  # answered
                sock.send(b"\x00")
            response = http.client.HTTPResponse(sock)
            response.begin()
            reply = response.read()
            assert (response.status, response.getheader("Connection")) == (408, "close")
            assert _code(reply) == grpc.StatusCode.DEADLINE_EXCEEDED.value[0]
            assert "1000 bytes/s" in status_pb2.Status.FromString(reply).message
            assert _closed(sock)
        _wait_for(lambda: receiver.bodies.readers == 0 and receiver.bodies.bytes == 0)
        # A 4650-byte body sent in four pieces 0.15 s apart, about 1163 bytes each: its deadline is 0.3 s
        # before the first (sent at 0.15 s), then 0.3 + 1163 / 1000 = 1.46 s, 2.63 s, 3.79 s, and it is done at
        # 0.6 s, a second or more ahead of each.
        body = gpu_request({f"GPU-{i}": 0.5 for i in range(20)}).SerializeToString()
        assert len(body) == 4650
        quarter = len(body) // 4 + 1
        with _connect(receiver.port) as sock:
            sock.sendall(_head(f"Content-Length: {len(body)}\r\n"))
            for start in range(0, len(body), quarter):
                time.sleep(0.15)
                sock.sendall(body[start : start + quarter])
            response = http.client.HTTPResponse(sock)
            response.begin()
            response.read()
            assert response.status == 200
        assert len(sink.ofu) == 20
    finally:
        receiver.stop()


def test_one_peer_holds_at_most_its_share_of_the_budget_and_the_others_are_served() -> None:
    sink = RecordingSink()
    budget = BodyBudget(max_bytes=8192, max_peer_bytes=4096)
    receiver = HttpReceiver(Decoder(sink).decode_bytes, Gate(), "127.0.0.1:0", bodies=budget, body_grace_s=60.0)
    receiver.start()
    body = gpu_request({"GPU-1": 0.5}).SerializeToString()
    try:
        with _connect(receiver.port, "127.0.0.2") as first, _connect(receiver.port, "127.0.0.2") as second:
            # Two bodies of 3000 declared from one peer: each fits its 4096 alone, as nothing is held yet.
            first.sendall(_head("Content-Length: 3000\r\n"))
            _wait_for(lambda: budget.readers == 1)
            second.sendall(_head("Content-Length: 3000\r\n"))
            _wait_for(lambda: budget.readers == 2)
            first.sendall(b"\x00" * 2500)
            _wait_for(lambda: budget.bytes == 2500)
            # 2500 + 2000 > 4096: the second is refused mid-body (retryable), closed, its bytes given back.
            second.sendall(b"\x00" * 2000)
            response = http.client.HTTPResponse(second)
            response.begin()
            response.read()
            assert (response.status, response.getheader("Connection")) == (503, "close")
            assert response.getheader("Retry-After") == "1"
            _wait_for(lambda: budget.bytes == 2500 and budget.readers == 1)
            # A third would take it to 2500 + 2000 > 4096 as well: refused before it is read.
            assert _post_from(receiver.port, "127.0.0.2", b"\x00" * 2000) == 503
            # Another peer holds nothing: 2500 + 232 is within 8192, and its own share is whole.
            assert _post_from(receiver.port, "127.0.0.1", body) == 200
        _wait_for(lambda: budget.bytes == 0 and budget.readers == 0)  # the first left mid-body
        assert [point[1] for point in sink.ofu] == [0.5]
    finally:
        receiver.stop()


# --- framing that desynchronises: both framings, junk chunk lines, Expect ------------------------------


def test_both_framings_with_a_junk_chunk_line_are_400_and_closed_without_waiting(running: Running) -> None:
    # The client frames by its Content-Length: it sends its 10 bytes and waits. Before: no answer at all (the
    # server waited for the chunk line's end until the read timeout).
    head = _head("Transfer-Encoding: chunked\r\nContent-Length: 10\r\n")
    reply = _raw(running.receiver.port, head + b"zzzzzzzzzz")
    assert (reply.status, reply.closed, _code(reply.body)) == (400, True, INVALID_ARGUMENT)
    assert running.post(gpu_request({"GPU-1": 0.5}).SerializeToString())[0] == 200


def test_a_junk_chunk_size_line_is_refused_at_its_first_bad_byte(running: Running) -> None:
    reply = _raw(running.receiver.port, _head("Transfer-Encoding: chunked\r\n") + b"5z")  # no line end coming
    assert (reply.status, reply.closed, _code(reply.body)) == (400, True, INVALID_ARGUMENT)


def test_expect_100_continue_is_answered_only_once_the_token_is_checked() -> None:
    server = _start(auth=BearerAuth("tok"))
    body = gpu_request({"GPU-1": 0.5}).SerializeToString()
    expect = f"Expect: 100-continue\r\nContent-Length: {len(body)}\r\n"
    try:
        with socket.create_connection(("127.0.0.1", server.receiver.port), timeout=10) as sock:
            sock.sendall(_head(expect))  # no token: the body must not be invited
            response = http.client.HTTPResponse(sock)
            response.begin()
            assert response.status == 401  # before: 100 Continue, then 401 once the body had come
        with socket.create_connection(("127.0.0.1", server.receiver.port), timeout=10) as sock:
            sock.sendall(_head(expect + "Authorization: Bearer tok\r\nConnection: close\r\n"))
            assert sock.recv(64) == b"HTTP/1.1 100 Continue\r\n\r\n"
            sock.sendall(body)
            response = http.client.HTTPResponse(sock)
            response.begin()
            assert response.status == 200
        assert [point[1] for point in server.sink.ofu] == [0.5]
    finally:
        server.receiver.stop()


def test_other_methods_are_405_with_allow_post(running: Running) -> None:
    with socket.create_connection(("127.0.0.1", running.receiver.port), timeout=10) as sock:
        sock.sendall(b"GET /v1/metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        response = http.client.HTTPResponse(sock)
        response.begin()
        # As the OpenTelemetry Collector's OTLP/HTTP receiver answers; before: 501 and an HTML page.
        assert (response.status, response.getheader("Allow")) == (405, "POST")
        assert _code(response.read()) == grpc.StatusCode.UNIMPLEMENTED.value[0]


# --- listeners --------------------------------------------------------------------------------------


def _listen_backlog(port: int) -> int:
    """The backlog the kernel holds for the listener on ``port``: ``ss`` shows it as a listener's Send-Q."""
    out = subprocess.run(["ss", "-Hltn", f"sport = :{port}"], capture_output=True, text=True, check=True).stdout
    return int(out.split()[2])


def test_the_http_listeners_have_the_receivers_listen_backlog(
    running: Running, require: Callable[[bool, str], None]
) -> None:
    require(shutil.which("ss") is not None, "ss (Debian package iproute2) is not installed")
    somaxconn = int(Path("/proc/sys/net/core/somaxconn").read_text())
    expected = min(4096, somaxconn)  # the kernel caps a listen() backlog at net.core.somaxconn
    feed = ReportFeed()
    feed.start()
    try:
        assert _listen_backlog(feed.bound_port) == expected  # before: 5, socketserver's default
        assert _listen_backlog(running.receiver.port) == expected
    finally:
        feed.shutdown()


def test_the_minimum_rate_is_an_option_with_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    def parsed(*argv: str) -> float:
        parser = argparse.ArgumentParser()  # the variables give the defaults when the command registers
        command.register(parser.add_subparsers())
        return command.options_from_args(parser.parse_args(["collector", *argv])).http_body_min_rate

    assert parsed() == 1024.0
    assert parsed("--http-body-min-rate", "0") == 0.0  # no minimum
    monkeypatch.setenv("OTEL_OFU_COLLECTOR_HTTP_BODY_MIN_RATE", "2048")
    assert parsed() == 2048.0


def test_an_ipv6_listen_address_is_served(require: Callable[[bool, str], None]) -> None:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
        has_ipv6 = True
    except OSError:
        has_ipv6 = False
    require(has_ipv6, "no IPv6 loopback (::1) on this machine")
    sink = RecordingSink()
    receiver = HttpReceiver(Decoder(sink).decode_bytes, Gate(), "[::1]:0")  # before: an IPv4 socket, so no bind
    receiver.start()
    try:
        connection = http.client.HTTPConnection("::1", receiver.port, timeout=10)
        body = gpu_request({"GPU-1": 0.5}).SerializeToString()
        connection.request("POST", "/v1/metrics", body, {"Content-Type": "application/x-protobuf"})
        assert connection.getresponse().status == 200
        connection.close()
        assert [point[1] for point in sink.ofu] == [0.5]
    finally:
        receiver.stop()


def test_the_go_otlp_http_exporter_delivers(require: Callable[[bool, str], None]) -> None:
    # telemetrygen (built beside otelcol-ofu by `make otelcol`): the OpenTelemetry Go SDK's OTLP/HTTP
    # exporter on Go's net/http, another client's framing than Python's.
    telemetrygen = Path(__file__).resolve().parent.parent / "build" / "otelcol" / "telemetrygen"
    require(telemetrygen.is_file(), "build/otelcol/telemetrygen is not built (make otelcol)")
    requests: list[int] = []

    def ingest(raw: bytes) -> DecodeOutcome:
        request = ExportMetricsServiceRequest.FromString(raw)
        requests.append(
            sum(len(scope.metrics) for resource in request.resource_metrics for scope in resource.scope_metrics)
        )
        return DecodeOutcome(accepted=0, rejected=0, error_message="", forward=None)

    receiver = HttpReceiver(ingest, Gate(), "127.0.0.1:0")
    receiver.start()
    try:
        argv = [str(telemetrygen), "metrics", "--otlp-http", "--otlp-insecure", "--otlp-endpoint",
                f"127.0.0.1:{receiver.port}", "--metrics", "20", "--workers", "2", "--rate", "50"]  # fmt: skip
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr[-2000:]
        assert sum(requests) == 2 * 20  # every metric of both workers, whatever their batching
    finally:
        receiver.stop()
