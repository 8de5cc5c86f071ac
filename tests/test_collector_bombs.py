"""Requests that cost far more than they weigh: bodies that inflate past the receive limit, many inflating at once,
one GPU's two million identical points, and a few addresses each holding a real 64 MiB body. Each costs only
itself: refused by reason, inflated within one memory budget for every request together (not per request), and
never the others' 503."""

from __future__ import annotations

import gzip
import http.client
import socket
import threading
import time
import tracemalloc
import zlib
from collections.abc import Iterator

import grpc
import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)

from otel_ofu import names
from otel_ofu.testing.otlp_requests import RecordingSink, gpu_request
from otel_ofu_collector.otlp.decode import MAX_POINTS_PER_INTERVAL, MAX_POINTS_PER_STREAM, Decoder
from otel_ofu_collector.receivers.admission import MAX_REQUEST_BYTES, BodyBudget, Gate
from otel_ofu_collector.receivers.otlp_grpc import EXPORT_METHOD, GrpcReceiver
from otel_ofu_collector.receivers.otlp_http import HttpReceiver

S = 1_000_000_000
MiB = 1024 * 1024


def _bomb(inflated: int) -> bytes:
    """A gzip body of a few KB or so that inflates to ``inflated`` zero bytes."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = b"\0" * MiB
    parts = [compressor.compress(zeros) for _ in range(inflated // MiB)]
    return b"".join(parts) + compressor.flush()


def _duplicates(points: int) -> ExportMetricsServiceRequest:
    """One GPU and ``points`` identical gpu.ofu points, all of one interval."""
    request = gpu_request({"GPU-1": 0.5}, time_ns=1_700_000_000 * S)
    data_points = request.resource_metrics[0].scope_metrics[0].metrics[0].gauge.data_points
    first = data_points[0]
    data_points.extend([first] * (points - 1))
    return request


# --- implausible points ---------------------------------------------------------------------------------------


def test_two_million_identical_points_of_one_gpu_are_refused_by_reason_without_a_walk() -> None:
    request = _duplicates(2_000_000)
    raw = request.SerializeToString()
    assert len(gzip.compress(raw)) < 200 * 1024  # the attack: a small gzip body
    sink = RecordingSink()
    decoder = Decoder(sink)
    began = time.process_time()
    outcome = decoder.decode(ExportMetricsServiceRequest.FromString(raw), raw)
    spent = time.process_time() - began
    # The first few repeats are the windows' to judge (a retry may repeat a point); from the fifth on, implausible.
    assert outcome.accepted == MAX_POINTS_PER_INTERVAL == 4
    assert outcome.rejected == 2_000_000 - 4
    assert len(sink.ofu) == 4
    assert decoder.stats.rejected_by_reason[names.RejectReason.IMPLAUSIBLE] == 2_000_000 - 4
    words = "gpu.ofu with more points of one GPU for one interval than any source sends"
    assert f"{2_000_000 - 4} {words}" in outcome.error_message
    print(f"decoded in {spent:.3f} s of CPU")


def test_a_gpu_that_sends_each_interval_once_is_taken_whole() -> None:
    """Several intervals of one GPU in one request (a queue drained at once): every point taken."""
    request = gpu_request({"GPU-1": 0.5}, time_ns=1_700_000_000 * S)
    points = request.resource_metrics[0].scope_metrics[0].metrics[0].gauge.data_points
    first = points[0]
    for k in range(1, 40):
        points.add(
            as_double=0.5,
            start_time_unix_nano=first.start_time_unix_nano + k * 10 * S,
            time_unix_nano=first.time_unix_nano + k * 10 * S,
        )
    sink = RecordingSink()
    outcome = Decoder(sink).decode(request)
    assert (outcome.accepted, outcome.rejected) == (40, 0)


def test_a_backlog_longer_than_any_queue_is_refused_past_its_bound() -> None:
    """12,000 intervals of one GPU in one request, more than a day of 10 s intervals: the first 10,000 taken."""
    request = gpu_request({"GPU-1": 0.5}, time_ns=1_700_000_000 * S)
    points = request.resource_metrics[0].scope_metrics[0].metrics[0].gauge.data_points
    first = points[0]
    for k in range(1, 12_000):
        points.add(
            as_double=0.5, start_time_unix_nano=first.start_time_unix_nano + k, time_unix_nano=first.time_unix_nano + k
        )
    outcome = Decoder(RecordingSink()).decode(request)
    assert (outcome.accepted, outcome.rejected) == (MAX_POINTS_PER_STREAM, 12_000 - MAX_POINTS_PER_STREAM)
    assert "gpu.ofu with more intervals of one GPU in one request than any source sends" in outcome.error_message


def test_a_few_repeats_of_one_interval_are_left_to_the_windows() -> None:
    """An exporter's retry may repeat a point or two: not implausible (the windows decide what a repeat is)."""
    sink = RecordingSink()
    outcome = Decoder(sink).decode(_duplicates(3))
    assert (outcome.accepted, outcome.rejected) == (3, 0)


# --- bombs over OTLP/HTTP --------------------------------------------------------------------------------------


@pytest.fixture
def http_receiver() -> Iterator[HttpReceiver]:
    receiver = HttpReceiver(Decoder(RecordingSink()).decode_bytes, Gate(max_in_flight=64), "127.0.0.1:0")
    receiver.start()
    yield receiver
    receiver.stop()


def _post(port: int, body: bytes, encoding: str = "gzip", source: str = "127.0.0.1") -> int:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60, source_address=(source, 0))
    try:
        connection.request(
            "POST",
            "/v1/metrics",
            body=body,
            headers={"Content-Type": "application/x-protobuf", "Content-Encoding": encoding},
        )
        response = connection.getresponse()
        response.read()
        return response.status
    finally:
        connection.close()


def test_concurrent_gzip_bombs_inflate_within_one_budget(http_receiver: HttpReceiver) -> None:
    """24 bombs of about 120 KB, each inflating to just under the 64 MiB limit, at once: the inflated bytes held
    together stay within the body budget (4 x 64 MiB), not 24 x 64 MiB; the bombs beyond it are told to retry."""
    bomb = _bomb(MAX_REQUEST_BYTES - MiB)
    assert len(bomb) < 130 * 1024
    statuses: list[int] = []
    tracemalloc.start()
    try:
        threads = [
            threading.Thread(target=lambda: statuses.append(_post(http_receiver.port, bomb)), daemon=True)
            for _ in range(24)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(statuses) == 24
    assert set(statuses) <= {400, 503}  # zeros are not a request (400); over the budget, retry later (503)
    assert statuses.count(503) > 0
    assert peak < 2 * http_receiver.bodies.max_bytes, f"{peak / MiB:.0f} MiB"


def test_a_bomb_that_would_inflate_past_the_shared_budget_is_told_to_retry(http_receiver: HttpReceiver) -> None:
    """The budget is shared with the gRPC receiver: with 3 x 64 MiB of its 4 x 64 held by other peers' bodies, and
    its last quarter kept for small bodies, a bomb inflating to 63 MiB has no room: 503, the held bytes unchanged."""
    budget = http_receiver.bodies
    held = []
    for peer, size in (("10.0.0.1", 2 * MAX_REQUEST_BYTES), ("10.0.0.2", MAX_REQUEST_BYTES)):
        lease = budget.open(peer)
        assert lease is not None
        assert lease.take(size)
        held.append(lease)
    try:
        assert _post(http_receiver.port, _bomb(MAX_REQUEST_BYTES - MiB)) == 503
        # The answer is written before the request's lease is given back, so the client may read it a moment before.
        end = time.monotonic() + 5
        while budget.bytes != 3 * MAX_REQUEST_BYTES and time.monotonic() < end:
            time.sleep(0.01)
        assert budget.bytes == 3 * MAX_REQUEST_BYTES
    finally:
        for lease in held:
            lease.release()
    assert _post(http_receiver.port, _bomb(MAX_REQUEST_BYTES - MiB)) == 400  # room again: inflated, zeros refused


def test_a_bomb_past_the_limit_is_refused_as_too_large(http_receiver: HttpReceiver) -> None:
    assert _post(http_receiver.port, _bomb(MAX_REQUEST_BYTES + MiB)) == 413


# --- a few addresses holding real 64 MiB bodies ----------------------------------------------------------------


def _hold_body(port: int, source: str, size: int, release: threading.Event) -> None:
    """Send all of a ``size``-byte body but its last byte and hold it there until ``release``; cut off (the budget
    refused it), start again, as an attacker would."""
    head = (
        "POST /v1/metrics HTTP/1.1\r\nHost: c\r\nContent-Type: application/x-protobuf\r\n"
        f"Content-Length: {size}\r\n\r\n"
    ).encode()
    chunk = b"\0" * MiB
    while not release.is_set():
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=60, source_address=(source, 0)) as connection:
                connection.sendall(head)
                sent = 0
                while sent < size - 1:
                    piece = chunk[: min(MiB, size - 1 - sent)]
                    connection.sendall(piece)
                    sent += len(piece)
                while not release.wait(0.5):
                    connection.sendall(b"")
        except OSError:
            release.wait(0.1)


def test_four_addresses_holding_64_mib_bodies_leave_room_for_everyone_else() -> None:
    receiver = HttpReceiver(Decoder(RecordingSink()).decode_bytes, Gate(max_in_flight=64), "127.0.0.1:0")
    receiver.body_min_rate = 0.0  # the holders send at full speed, then wait: the minimum rate is not what is tested
    receiver.start()
    release = threading.Event()
    holders = [
        threading.Thread(target=_hold_body, args=(receiver.port, f"127.0.0.{2 + k}", MAX_REQUEST_BYTES, release))
        for k in range(4)
    ]
    try:
        for holder in holders:
            holder.start()
        deadline = time.monotonic() + 60
        while receiver.bodies.bytes < 150 * MiB and time.monotonic() < deadline:
            time.sleep(0.1)
        assert receiver.bodies.bytes >= 150 * MiB  # the big bodies hold most of the budget
        good = gpu_request({"GPU-1": 0.5}).SerializeToString()
        statuses = [_post(receiver.port, good, encoding="identity") for _ in range(70)]
        assert statuses.count(200) == 70, statuses
    finally:
        release.set()
        for holder in holders:
            holder.join(30)
        receiver.stop()


def test_a_peers_bytes_beyond_its_small_share_leave_the_reserve_to_the_others() -> None:
    budget = BodyBudget(max_bytes=100, max_peer_bytes=40, small_bytes=5, reserve_bytes=25)
    big = [budget.open(f"10.0.0.{k}") for k in range(3)]
    assert all(lease is not None for lease in big)
    taken = [lease.take(40) if lease is not None else False for lease in big]
    # 5 + 5 + 5 small and 35 + 35 of large (the large part stops at 100 - 25 = 75): the third is refused
    assert taken == [True, True, False]
    small = budget.open("10.0.0.9")
    assert small is not None
    assert small.take(5)  # the first 5 bytes of another peer come from the reserve
    assert not small.take(20)  # beyond its small share: the large part is full
    for lease in (*big, small):
        if lease is not None:
            lease.release()
    assert (budget.bytes, budget.readers) == (0, 0)


# --- bombs over gRPC -------------------------------------------------------------------------------------------


@pytest.fixture
def grpc_receiver() -> Iterator[GrpcReceiver]:
    receiver = GrpcReceiver(Decoder(RecordingSink()).decode_bytes, Gate(max_in_flight=64), "127.0.0.1:0")
    receiver.start()
    yield receiver
    receiver.stop(0)


def _grpc_export(port: int, payload: bytes, compression: grpc.Compression) -> grpc.StatusCode:
    with grpc.insecure_channel(
        f"127.0.0.1:{port}", options=[("grpc.max_send_message_length", 256 * MiB)], compression=compression
    ) as channel:
        call = channel.unary_unary(EXPORT_METHOD, None, ExportMetricsServiceResponse.FromString)
        try:
            call(payload, timeout=120)
        except grpc.RpcError as error:
            return error.code()
        return grpc.StatusCode.OK


def test_concurrent_grpc_gzip_bombs_inflate_within_one_budget(grpc_receiver: GrpcReceiver) -> None:
    payload = b"\0" * (MAX_REQUEST_BYTES - MiB)  # grpc compresses it on the way: about 64 KB on the wire
    codes: list[grpc.StatusCode] = []
    tracemalloc.start()
    try:
        threads = [
            threading.Thread(
                target=lambda: codes.append(_grpc_export(grpc_receiver.port, payload, grpc.Compression.Gzip)),
                daemon=True,
            )
            for _ in range(24)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(180)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(codes) == 24
    assert set(codes) <= {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.UNAVAILABLE}
    assert codes.count(grpc.StatusCode.UNAVAILABLE) > 0
    assert peak < 2 * grpc_receiver.bodies.max_bytes, f"{peak / MiB:.0f} MiB"


def test_a_grpc_message_that_inflates_past_the_limit_is_invalid_argument(grpc_receiver: GrpcReceiver) -> None:
    payload = b"\0" * (MAX_REQUEST_BYTES + MiB)
    assert _grpc_export(grpc_receiver.port, payload, grpc.Compression.Gzip) == grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize(
    "compression", [grpc.Compression.Gzip, grpc.Compression.Deflate, grpc.Compression.NoCompression]
)
def test_compressed_grpc_requests_are_still_taken(grpc_receiver: GrpcReceiver, compression: grpc.Compression) -> None:
    payload = gpu_request({"GPU-1": 0.5}).SerializeToString()
    assert _grpc_export(grpc_receiver.port, payload, compression) == grpc.StatusCode.OK


def test_two_million_identical_steps_of_one_job_are_refused_past_a_few() -> None:
    """job.step is bounded as job.mfu is: a job reports its last step once per interval, so the fifth point of one
    job at one time, and every one after it, is a bomb's (4 taken, 1,999,996 refused in one count)."""
    request = ExportMetricsServiceRequest()
    rm = request.resource_metrics.add()
    rm.resource.attributes.add(key=names.JOB_ID).value.string_value = "train-7"
    steps = rm.scope_metrics.add().metrics.add(name=names.JOB_STEP.name, unit="{step}")
    steps.gauge.data_points.add(as_double=1200.0, time_unix_nano=1_700_000_000 * S)
    first = steps.gauge.data_points[0]
    steps.gauge.data_points.extend([first] * (2_000_000 - 1))
    sink = RecordingSink()
    outcome = Decoder(sink).decode(request)
    assert (outcome.accepted, outcome.rejected) == (4, 2_000_000 - 4)
    words = "job.step with more points of one GPU for one interval than any source sends"
    assert f"{2_000_000 - 4} {words}" in outcome.error_message
