"""OTLP/gRPC calls whose request message comes slowly or never: each costs only itself. Before, every call held a
worker thread while its message arrived, so as many slow streams as workers (68 by default) left good calls
waiting without end; now a call waits for its message without a thread, and no longer than the message deadline.

A slow stream here is a client-streaming call on the Export method whose message the client holds back: what the
server sees of it is what it sees of a unary call whose message trickles in, an opened stream with no message yet.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Iterator

import grpc
import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceResponse

from otel_ofu.testing.otlp_requests import RecordingSink, gpu_request
from otel_ofu_collector.otlp.decode import Decoder
from otel_ofu_collector.receivers.admission import Gate
from otel_ofu_collector.receivers.otlp_grpc import EXPORT_METHOD, GrpcReceiver


class SlowStreams:
    """``count`` calls that open their stream and hold their message back until ``release``."""

    def __init__(self, target: str, count: int) -> None:
        self.channel = grpc.insecure_channel(target)
        self.release = threading.Event()
        self.codes: list[grpc.StatusCode] = []
        self.threads = [threading.Thread(target=self._call, daemon=True) for _ in range(count)]
        for thread in self.threads:
            thread.start()

    def _messages(self) -> Iterator[bytes]:
        self.release.wait(120)
        yield gpu_request({"GPU-slow": 0.5}).SerializeToString()

    def _call(self) -> None:
        call = self.channel.stream_unary(EXPORT_METHOD, None, ExportMetricsServiceResponse.FromString)
        try:
            call(self._messages(), timeout=120)
            self.codes.append(grpc.StatusCode.OK)
        except grpc.RpcError as error:
            self.codes.append(error.code())

    def close(self) -> None:
        self.release.set()
        for thread in self.threads:
            thread.join(30)
        self.channel.close()


@pytest.fixture
def receiver() -> Iterator[GrpcReceiver]:
    sink = RecordingSink()
    started = GrpcReceiver(Decoder(sink).decode_bytes, Gate(max_in_flight=4), "127.0.0.1:0")
    started.start()
    yield started
    started.stop(0)


def _export(port: int) -> grpc.StatusCode:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.unary_unary(EXPORT_METHOD, None, ExportMetricsServiceResponse.FromString)
        try:
            call(gpu_request({"GPU-1": 0.5}).SerializeToString(), timeout=10)
        except grpc.RpcError as error:
            return error.code()
        return grpc.StatusCode.OK


def test_slow_streams_do_not_hold_the_good_calls(receiver: GrpcReceiver) -> None:
    slow = SlowStreams(f"127.0.0.1:{receiver.port}", 100)  # far more than the gate's 4 slots and any worker pool
    try:
        time.sleep(1.0)  # every slow stream is open at the server by now
        assert [_export(receiver.port) for _ in range(10)] == [grpc.StatusCode.OK] * 10
    finally:
        slow.close()
    # Released at once, each is taken or, past the gate's 4 slots, told to retry: none was cut or lost.
    assert len(slow.codes) == 100
    assert set(slow.codes) <= {grpc.StatusCode.OK, grpc.StatusCode.UNAVAILABLE}
    assert grpc.StatusCode.OK in slow.codes


def test_a_message_not_received_within_its_deadline_ends_the_call() -> None:
    receiver = GrpcReceiver(Decoder(RecordingSink()).decode_bytes, Gate(), "127.0.0.1:0", message_deadline_s=1.0)
    receiver.start()
    slow = SlowStreams(f"127.0.0.1:{receiver.port}", 3)
    try:
        for thread in slow.threads:
            thread.join(30)  # ended by the server, long before the client's own 120 s
        assert slow.codes == [grpc.StatusCode.DEADLINE_EXCEEDED] * 3
        assert _export(receiver.port) == grpc.StatusCode.OK
    finally:
        slow.close()
        receiver.stop(0)


def test_stopping_with_slow_streams_open_logs_no_traceback(
    caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    receiver = GrpcReceiver(Decoder(RecordingSink()).decode_bytes, Gate(), "127.0.0.1:0")
    receiver.start()
    slow = SlowStreams(f"127.0.0.1:{receiver.port}", 20)
    try:
        time.sleep(1.0)
        with caplog.at_level(logging.DEBUG):
            receiver.stop(0)
            time.sleep(0.5)
            gc.collect()  # what the stop left pending is closed now, if not before
    finally:
        slow.close()
    assert not [record for record in caplog.records if record.exc_info or record.levelno >= logging.ERROR]
    assert "Traceback" not in capfd.readouterr().err
    assert set(slow.codes) <= {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED}
