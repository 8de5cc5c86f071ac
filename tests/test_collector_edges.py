"""The collector's receivers and endpoints at their edges: slow and trickling clients, bursts of connections,
unauthenticated bodies, absurd framing, what listens where, promtool, and a fuzz of both receivers."""

from __future__ import annotations

import http.client
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import attrs
import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from otel_ofu import cli, names
from otel_ofu.testing.otlp_requests import T0, RecordingSink, gpu_request, mfu_request
from otel_ofu_collector.command import options_from_args
from otel_ofu_collector.config import AggregatorConfig
from otel_ofu_collector.otlp.decode import Decoder
from otel_ofu_collector.receivers.admission import BodyLease, Gate
from otel_ofu_collector.receivers.auth import BearerAuth
from otel_ofu_collector.receivers.otlp_grpc import EXPORT_METHOD, GrpcReceiver
from otel_ofu_collector.receivers.otlp_http import HttpReceiver
from otel_ofu_collector.service import CollectorOptions, CollectorService

S = 1_000_000_000
VALID = gpu_request({"GPU-1": 0.5}).SerializeToString()


def _wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    done = threading.Event()
    for _ in range(int(timeout / 0.01)):
        if condition():
            return
        done.wait(0.01)
    raise AssertionError("condition never held")


def _head(headers: str, path: str = "/v1/metrics") -> bytes:
    return f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n{headers}\r\n".encode()


def _post(port: int, body: bytes = VALID, headers: dict[str, str] | None = None) -> int:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request("POST", "/v1/metrics", body, {"Content-Type": "application/x-protobuf", **(headers or {})})
        response = connection.getresponse()
        response.read()
        return response.status
    finally:
        connection.close()


def _grpc_export(port: int, payload: bytes = VALID, metadata: tuple[tuple[str, str], ...] = ()) -> grpc.StatusCode:
    with grpc.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.max_send_message_length", -1)]) as channel:
        try:
            channel.unary_unary(EXPORT_METHOD, None, None)(payload, metadata=metadata, timeout=30)
        except grpc.RpcError as error:
            return error.code()
    return grpc.StatusCode.OK


@attrs.define
class Receivers:
    sink: RecordingSink
    gate: Gate
    http: HttpReceiver
    grpc: GrpcReceiver


def serving(sink: RecordingSink, gate: Gate, http: HttpReceiver, grpc_receiver: GrpcReceiver) -> Iterator[Receivers]:
    """Both receivers started on one decoder and gate for as long as the fixture holds, then stopped."""
    http.start()
    grpc_receiver.start()
    yield Receivers(sink, gate, http, grpc_receiver)
    grpc_receiver.stop(0)
    http.stop()


@pytest.fixture
def receivers() -> Iterator[Receivers]:
    sink = RecordingSink()
    decoder = Decoder(sink)
    gate = Gate(max_in_flight=2, retry_after_s=1.0)
    http_receiver = HttpReceiver(decoder.decode_bytes, gate, "127.0.0.1:0", read_timeout_s=10.0, body_deadline_s=30.0)
    yield from serving(sink, gate, http_receiver, GrpcReceiver(decoder.decode_bytes, gate, "127.0.0.1:0"))


# --- 2. slow clients hold no admission meant for work ------------------------------------------------


def test_slow_bodies_hold_no_gate_slot_so_both_receivers_keep_serving(receivers: Receivers) -> None:
    slow = [socket.create_connection(("127.0.0.1", receivers.http.port), timeout=10) for _ in range(6)]
    try:
        for sock in slow:  # three times the gate's two slots, each body stalled after one byte
            sock.sendall(_head("Content-Length: 1000\r\n") + b"\x0a")
        bodies = receivers.http.bodies
        _wait_for(lambda: bodies is not None and bodies.readers == len(slow))
        assert _post(receivers.http.port) == 200  # before: 503 (the slow bodies held the gate)
        assert _grpc_export(receivers.grpc.port) is grpc.StatusCode.OK  # before: UNAVAILABLE
        assert receivers.gate.refused_overload == 0
    finally:
        for sock in slow:
            sock.close()


def test_bodies_past_the_reader_bound_are_refused_503_not_queued() -> None:
    from otel_ofu_collector.receivers.admission import BodyBudget

    gate = Gate(max_in_flight=2)
    receiver = HttpReceiver(
        Decoder(RecordingSink()).decode_bytes, gate, "127.0.0.1:0", bodies=BodyBudget(max_readers=1)
    )
    receiver.start()
    try:
        with socket.create_connection(("127.0.0.1", receiver.port), timeout=10) as sock:
            sock.sendall(_head("Content-Length: 1000\r\n") + b"\x0a")
            _wait_for(lambda: receiver.bodies is not None and receiver.bodies.readers == 1)
            assert _post(receiver.port) == 503
            assert gate.refused_overload == 1
    finally:
        receiver.stop()


def test_headers_trickled_byte_by_byte_are_cut_off_at_the_header_deadline() -> None:
    receiver = HttpReceiver(
        Decoder(RecordingSink()).decode_bytes, Gate(), "127.0.0.1:0", read_timeout_s=10.0, header_deadline_s=0.3
    )
    receiver.start()
    try:
        with socket.create_connection(("127.0.0.1", receiver.port), timeout=10) as sock:
            head = b"POST /v1/metrics HTTP/1.1\r\nX-Pad: " + b"a" * 400  # never silent for the read timeout
            closed = False
            for byte in head:  # a byte every 20 ms: 8 s in all, far past the deadline
                if select.select([sock], [], [], 0.02)[0]:
                    closed = sock.recv(1024) == b""
                    break
                try:
                    sock.sendall(bytes([byte]))
                except OSError:
                    closed = True
                    break
            assert closed  # before: open as long as the bytes kept coming
        assert _post(receiver.port) == 200
    finally:
        receiver.stop()


# --- 3. a burst of new connections -------------------------------------------------------------------


def test_a_burst_of_simultaneous_valid_requests_all_succeed() -> None:
    gate = Gate(max_in_flight=256)
    receiver = HttpReceiver(Decoder(RecordingSink()).decode_bytes, gate, "127.0.0.1:0")
    receiver.start()
    clients = 128
    barrier = threading.Barrier(clients)
    statuses: list[int | str] = []
    lock = threading.Lock()

    def client() -> None:
        barrier.wait()
        try:
            status: int | str = _post(receiver.port)
        except OSError as error:  # a reset connection: what a listen backlog of 5 did
            status = type(error).__name__
        with lock:
            statuses.append(status)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert statuses == [200] * clients
    finally:
        receiver.stop()


# --- 4. no body buffered for an unauthenticated gRPC client ------------------------------------------


def test_an_unauthenticated_grpc_request_is_refused_before_its_body_is_received() -> None:
    sink = RecordingSink()
    bodies: list[int] = []

    class Watched(GrpcReceiver):
        def _process(self, raw: bytes, lease: BodyLease) -> Any:
            bodies.append(len(raw))  # the whole body was received and buffered to get here
            return super()._process(raw, lease)

    receiver = Watched(Decoder(sink).decode_bytes, Gate(), "127.0.0.1:0", auth=BearerAuth("s3cret"))
    receiver.start()
    try:
        big = b"\x0a" + b"\x00" * (32 * 1024 * 1024)
        assert _grpc_export(receiver.port, big) is grpc.StatusCode.UNAUTHENTICATED
        wrong = (("authorization", "Bearer nope"),)
        assert _grpc_export(receiver.port, big, wrong) is grpc.StatusCode.UNAUTHENTICATED
        assert bodies == []  # before: [33554433, 33554433]
        assert _grpc_export(receiver.port, VALID, (("authorization", "Bearer s3cret"),)) is grpc.StatusCode.OK
        assert bodies == [len(VALID)]
        assert len(sink.ofu) == 1
    finally:
        receiver.stop(0)


# --- 6. absurd framing ---------------------------------------------------------------------------------


def test_a_content_length_of_five_thousand_digits_is_413_with_one_log_line(
    receivers: Receivers, capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="otel_ofu_collector.receivers.otlp_http")
    with socket.create_connection(("127.0.0.1", receivers.http.port), timeout=10) as sock:
        sock.sendall(_head(f"Content-Length: {'9' * 5000}\r\n"))
        response = http.client.HTTPResponse(sock)
        response.begin()  # before: no answer at all, the connection dropped
        assert (response.status, response.getheader("Connection")) == (413, "close")
        response.read()
    assert "Traceback" not in capfd.readouterr().err
    lines = [record.getMessage() for record in caplog.records if "digits" in record.getMessage()]
    assert len(lines) == 1
    assert _post(receivers.http.port) == 200


# --- 7. what listens where -------------------------------------------------------------------------------


def test_the_prometheus_endpoint_and_the_report_feed_listen_on_loopback_by_default() -> None:
    args = cli.build_parser().parse_args(["collector", "--prometheus-port", "0"])
    assert (args.prometheus_host, args.report_feed_host) == ("127.0.0.1", "127.0.0.1")
    options = options_from_args(args)
    assert options.prometheus_host == CollectorOptions().prometheus_host == "127.0.0.1"
    service = CollectorService(attrs.evolve(options, grpc_listen=None, flush_interval_s=0.0), environ={})
    service.start()
    try:
        port = service.ports["prometheus"]
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
        outward = _outward_address()
        if outward is not None:  # a non-loopback address of this machine: nothing answers there
            with pytest.raises((ConnectionRefusedError, TimeoutError)):
                socket.create_connection((outward, port), timeout=2).close()
    finally:
        service.stop(0)


def _outward_address() -> str | None:
    """An address of this host other than loopback (no packet is sent: a UDP connect only picks a route)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("10.255.255.255", 1))
        except OSError:
            return None
        address: str = probe.getsockname()[0]
    return None if address.startswith("127.") or address == "0.0.0.0" else address


def test_a_bearer_token_on_the_command_line_is_warned_about_once(tmp_path: Any) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_EXPORTER", "OTEL_OFU"))}
    argv = ["collector", "--listen", "127.0.0.1:0", "--bearer-token", "s3cret"]
    process = subprocess.Popen(
        [sys.executable, "-m", "otel_ofu.cli", *argv], stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        assert process.stderr is not None
        seen = []
        line = process.stderr.readline()
        while line and "ready" not in line:
            seen.append(line)
            line = process.stderr.readline()
        process.send_signal(signal.SIGTERM)
        _, rest = process.communicate(timeout=30)
        warnings = [text for text in seen if "process table" in text]
        assert len(warnings) == 1
        assert "--bearer-token-file" in warnings[0]
        assert "OTEL_OFU_COLLECTOR_BEARER_TOKEN" in warnings[0]
        assert "s3cret" not in "".join(seen) + rest
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


# --- 12. promtool --------------------------------------------------------------------------------------


def test_the_prometheus_exposition_passes_promtool_check_metrics(promtool: str) -> None:
    window = 60 * S
    start = T0 - T0 % window
    options = CollectorOptions(
        aggregator=AggregatorConfig(window_s=60.0, lateness_s=10.0, max_jobs=1),
        grpc_listen=None,
        prometheus_port=0,
        flush_interval_s=0.0,
    )
    service = CollectorService(options, environ={}, clock=lambda: start + S)
    service.start()
    try:
        service.ingest(gpu_request({"GPU-1": ("a", 0.5), "GPU-2": ("b", 0.3)}, time_ns=start + S))
        service.ingest(mfu_request({"a": 0.4, "c": 0.4}, time_ns=start + S))  # c: over --max-jobs
        service.ingest(gpu_request({"GPU-3": 2.0}, time_ns=start + S))  # rejected
        assert service.flush(start + window + 11 * S)
        text = urllib.request.urlopen(f"http://127.0.0.1:{service.ports['prometheus']}/metrics", timeout=10).read()
    finally:
        service.stop(0)
    assert b"fleet_ofu_quantile{" in text
    assert f'{names.PROMETHEUS_QUANTILE_LABEL}="0.5"'.encode() in text
    checked = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, timeout=60)
    assert checked.returncode == 0, (checked.stdout + checked.stderr).decode()  # before: "quantile" on a gauge


# --- fuzz: both receivers, protobuf payloads and HTTP framing ------------------------------------------

_MUTATIONS = st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=6)


def _mutated(base: bytes, flips: list[tuple[int, int]], cut: int) -> bytes:
    data = bytearray(base[: max(0, len(base) - cut)])
    for offset, value in flips:
        if data:
            data[offset % len(data)] = value
    return bytes(data)


_payloads = st.one_of(
    st.binary(max_size=256),
    st.builds(_mutated, st.just(VALID), _MUTATIONS, st.integers(0, 40)),
    st.builds(_mutated, st.just(mfu_request({"j": 0.4}).SerializeToString()), _MUTATIONS, st.integers(0, 20)),
)
_header_lines = st.lists(
    st.sampled_from(
        [
            "Content-Type: application/x-protobuf",
            "Content-Type: application/json",
            "Content-Type: text/plain",
            "Content-Encoding: gzip",
            "Content-Encoding: br",
            "Transfer-Encoding: chunked",
            "Transfer-Encoding: gzip, chunked",
            "Content-Length: 0",
            "Content-Length: 3",
            "Content-Length: -1",
            "Content-Length: 1, 2",
            "Content-Length: 99999999999999999999999",
            "Content-Length: 0x10",
            "Expect: 100-continue",
            "Connection: close",
            "X: \x00\x7f",
            ":",
            " folded",
        ]
    ),
    max_size=5,
)
_request_lines = st.sampled_from(
    ["POST /v1/metrics HTTP/1.1", "POST /v1/metrics HTTP/1.0", "GET /v1/metrics HTTP/1.1", "POST /x HTTP/1.1",
     "POST /v1/metrics HTTP/9.9", "BREW /v1/metrics HTTP/1.1", "POST /v1/metrics", "\x16\x03\x01", ""]
)  # fmt: skip


@pytest.fixture(scope="module")
def fuzzed() -> Iterator[Receivers]:
    sink = RecordingSink()
    decoder = Decoder(sink)
    gate = Gate(max_in_flight=8)
    http_receiver = HttpReceiver(
        decoder.decode_bytes, gate, "127.0.0.1:0", read_timeout_s=0.5, body_deadline_s=1.0, header_deadline_s=1.0
    )
    yield from serving(sink, gate, http_receiver, GrpcReceiver(decoder.decode_bytes, gate, "127.0.0.1:0"))


_GRPC_ANSWERS = {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(payload=_payloads, as_http=st.booleans())
def test_fuzzed_protobuf_payloads_get_a_well_formed_answer_from_both_receivers(
    fuzzed: Receivers, payload: bytes, as_http: bool
) -> None:
    if as_http:
        assert _post(fuzzed.http.port, payload) in (200, 400)
    else:
        assert _grpc_export(fuzzed.grpc.port, payload) in _GRPC_ANSWERS
    _wait_for(lambda: fuzzed.gate.in_flight == 0)  # the reply goes out just before the slot is left


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(request_line=_request_lines, headers=_header_lines, body=_payloads)
def test_fuzzed_http_framing_gets_a_well_formed_status_and_the_receiver_still_serves(
    fuzzed: Receivers, request_line: str, headers: list[str], body: bytes
) -> None:
    raw = (request_line + "\r\n" + "".join(line + "\r\n" for line in headers) + "\r\n").encode("latin-1") + body
    with socket.create_connection(("127.0.0.1", fuzzed.http.port), timeout=10) as sock:
        sock.sendall(raw)
        sock.shutdown(socket.SHUT_WR)  # no more is coming: every request must be answered or refused now
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    # Every answer starts with a well-formed status line (http.server's HTTP/0.9 error page had none); only
    # an empty request line, which is no request, may be closed without one.
    if request_line:
        status_line = reply.split(b"\r\n", 1)[0].decode("latin-1")
        version, code, *_ = status_line.split(" ", 2)
        assert version in ("HTTP/1.1", "HTTP/1.0"), (raw, reply)
        assert 100 <= int(code) < 600, (raw, reply)
    assert _post(fuzzed.http.port) == 200
