"""The collector at its outer limits: outputs too large for the downstream, permanent refusals, overlong
attributes, the job cap after eviction, its own health downstream, rate-limited logs and the shutdown grace."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import attrs
import grpc
import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from otel_ofu import names
from otel_ofu.otlp_client import Attempt, OtlpClient, OtlpSettings
from otel_ofu.testing.otlp_requests import RecordingSink, gpu_request, mfu_request, set_attribute
from otel_ofu.testing.otlp_sink import OtlpSink, unused_port
from otel_ofu_collector.aggregation.windows import Aggregator
from otel_ofu_collector.config import AggregatorConfig
from otel_ofu_collector.otlp.decode import Decoder
from otel_ofu_collector.otlp.encode import encode_request, reports_to_metrics_data
from otel_ofu_collector.outputs.delivery import Delivery
from otel_ofu_collector.outputs.split import split_request
from otel_ofu_collector.receivers.otlp_grpc import SERVICE_NAME as OTLP_SERVICE
from otel_ofu_collector.receivers.otlp_grpc import retry_trailers
from otel_ofu_collector.service import CollectorService
from otel_ofu_collector.stats.exphist import ExpHistogram
from tests.collector_helpers import collector_options as options

S = 1_000_000_000
W0 = 1_700_000_040 * S  # a multiple of 60 s
WINDOW = 60 * S
GRPC_DEFAULT_LIMIT = 4 * 1024 * 1024  # what a gRPC server (the sink among them) accepts by default


@pytest.fixture
def sink() -> Iterator[OtlpSink]:
    with OtlpSink.start(hold_limit_s=5) as started:
        yield started


def points_of(requests: list[Any], name: str) -> list[Any]:
    return [
        point
        for request in requests
        for rm in request.resource_metrics
        for sm in rm.scope_metrics
        for metric in sm.metrics
        if metric.name == name
        for point in getattr(metric, metric.WhichOneof("data")).data_points
    ]


def job_ids(requests: list[Any]) -> set[str]:
    found = set()
    for point in points_of(requests, names.JOB_OFU.name):
        found |= {kv.value.string_value for kv in point.attributes if kv.key == names.JOB_ID}
    return found


# --- 1. outputs larger than the downstream takes ----------------------------------------------------


def big_fleet(jobs: int, id_length: int) -> ExportMetricsServiceRequest:
    """One GPU per job, each job id ``id_length`` characters long (within the attribute bound)."""
    return gpu_request({f"GPU-{n}": (f"job-{n:05d}-".ljust(id_length, "x"), 0.5) for n in range(jobs)}, time_ns=W0 + S)


def test_a_window_too_large_for_the_downstream_is_split_and_delivered_and_the_next_one_too(sink: OtlpSink) -> None:
    # 4000-character job ids make a window's outputs larger than gRPC's limit: allow them here.
    service = CollectorService(options(sink, self_telemetry=False, max_attribute_length=4096), environ={})
    assert service.exports is not None
    service.ingest(big_fleet(1200, 4000))
    service.flush(W0 + WINDOW + 11 * S)
    service.ingest(gpu_request({"GPU-0": ("after", 0.5)}, time_ns=W0 + WINDOW + 20 * S))
    service.flush(W0 + 2 * WINDOW + 11 * S)
    try:
        assert service.exports.pump()  # before: RESOURCE_EXHAUSTED, retried for ever, the queue stuck
        assert job_ids(sink.requests()) == {f"job-{n:05d}-".ljust(4000, "x") for n in range(1200)} | {"after"}
        assert service.exports.stats.split >= 1
        assert all(request.ByteSize() <= GRPC_DEFAULT_LIMIT for request in sink.requests())
        assert service.exports.stats.dropped_rejected == service.exports.stats.dropped_oversized == 0
    finally:
        service.stop(0)


def test_a_large_foreign_request_passes_through_in_pieces_with_every_point(sink: OtlpSink) -> None:
    service = CollectorService(options(sink, self_telemetry=False), environ={})
    assert service.pass_through is not None
    foreign = ExportMetricsServiceRequest()
    rm = foreign.resource_metrics.add()
    set_attribute(rm.resource.attributes, names.SERVICE_NAME, "node-exporter")
    metric = rm.scope_metrics.add().metrics.add(name="node.filesystem.free")
    for n in range(8 * 1024):
        point = metric.gauge.data_points.add(as_int=n, time_unix_nano=W0)
        set_attribute(point.attributes, "mount", f"/mnt/{n}".ljust(1024, "x"))
    assert foreign.ByteSize() > 8 * 1024 * 1024
    service.ingest(foreign)
    try:
        assert service.pass_through.pump()
        received = points_of(sink.requests(), "node.filesystem.free")
        assert [point.as_int for point in received] == list(range(8 * 1024))  # each once, in order
        assert len(sink.requests()) >= 3
    finally:
        service.stop(0)


def test_split_keeps_every_point_once_under_its_resource_and_counts_a_point_that_cannot_fit() -> None:
    request = ExportMetricsServiceRequest()
    for r in range(3):
        rm = request.resource_metrics.add()
        set_attribute(rm.resource.attributes, "r", r)
        sm = rm.scope_metrics.add()
        sm.scope.name = "scope"
        for m in range(3):
            metric = sm.metrics.add(name=f"m{m}", unit="1")
            metric.sum.is_monotonic = True
            for p in range(50):
                metric.sum.data_points.add(as_int=p, time_unix_nano=1)
    lone = request.resource_metrics[2].scope_metrics[0].metrics[2].sum.data_points[0]
    set_attribute(lone.attributes, "huge", "x" * 5000)
    pieces, unfit = split_request(request.SerializeToString(), 2000)
    assert unfit == 1
    assert all(len(piece) <= 2000 for piece in pieces)
    seen = []
    for piece in map(ExportMetricsServiceRequest.FromString, pieces):
        for rm in piece.resource_metrics:
            for sm in rm.scope_metrics:
                assert sm.scope.name == "scope"
                for metric in sm.metrics:
                    assert metric.sum.is_monotonic
                    assert metric.unit == "1"
                    seen += [
                        (rm.resource.attributes[0].value.int_value, metric.name, p.as_int)
                        for p in metric.sum.data_points
                    ]
    expected = [(r, f"m{m}", p) for r in range(3) for m in range(3) for p in range(50)]
    expected.remove((2, "m2", 0))  # the one over the limit on its own
    assert seen == expected
    assert split_request(b"small", 2000) == ([b"small"], 0)


def test_resource_exhausted_without_retry_info_is_permanent_and_does_not_block_the_queue(sink: OtlpSink) -> None:
    transport = downstream(sink.grpc_endpoint)
    # A limit above the downstream's: the oversized request reaches it and is refused for its size.
    delivery = Delivery(transport, max_request_bytes=64 * 1024 * 1024)
    oversized = gpu_request({"GPU-1": ("x" * (5 * 1024 * 1024), 0.5)}).SerializeToString()
    delivery.submit(oversized)
    delivery.submit(gpu_request({"GPU-2": 0.5}).SerializeToString())
    try:
        assert delivery.pump()  # before: False, and the small request behind it never sent
        assert delivery.stats.dropped_rejected == 1
        assert "RESOURCE_EXHAUSTED" in delivery.stats.last_error
        assert len(sink.requests()) == 1
    finally:
        delivery.stop(0)


def downstream(endpoint: str) -> OtlpClient:
    settings = OtlpSettings.resolve(protocol="grpc", endpoint=endpoint, environ={})
    return OtlpClient(settings, names.COLLECTOR_EXPORT_REJECTED.name)


@pytest.fixture
def exhausted_with_retry_info() -> Iterator[str]:
    """A gRPC downstream answering RESOURCE_EXHAUSTED with RetryInfo (out of capacity for now)."""

    def export(_request: bytes, context: grpc.ServicerContext) -> bytes:
        status, trailers = retry_trailers(grpc.StatusCode.RESOURCE_EXHAUSTED, "busy", 3.0)
        context.set_trailing_metadata(trailers)
        context.abort(status.code, status.details)
        return b""

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    handler = grpc.unary_unary_rpc_method_handler(export)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(OTLP_SERVICE, {"Export": handler}),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop(None)


def test_resource_exhausted_with_retry_info_is_retried_after_its_delay(exhausted_with_retry_info: str) -> None:
    outcome = downstream(exhausted_with_retry_info).send(b"")
    assert (outcome.delivered, outcome.retryable, outcome.retry_after_s) == (False, True, 3.0)


@pytest.mark.parametrize("length", [4096, 4097])
def test_an_identity_attribute_over_the_length_bound_rejects_its_points_by_reason(length: int) -> None:
    sink = RecordingSink()
    decoder = Decoder(sink, max_attribute_length=4096)
    on_resource = decoder.decode(gpu_request({"GPU-1": ("j" * length, 0.5)}))
    on_point = decoder.decode(mfu_request({"j" * length: 0.4}))
    if length == 4096:
        assert (on_resource.rejected, on_point.rejected) == (0, 0)
        assert len(sink.ofu) == len(sink.mfu) == 1
    else:
        assert (on_resource.rejected, on_point.rejected) == (1, 1)
        assert sink.ofu == []  # rejected whole, never truncated
        assert sink.mfu == []
        assert decoder.stats.rejected_by_message == {
            "gpu.ofu with an attribute value longer than 4096 characters": 1,
            "job.mfu with an attribute value longer than 4096 characters": 1,
        }
        assert decoder.stats.rejected_by_reason[names.RejectReason.BAD_ATTRIBUTE] == 2
        assert "longer than 4096 characters" in on_point.error_message


# --- 15. histogram bounds ---------------------------------------------------------------------------


def test_unknown_histogram_bounds_stay_absent_in_the_encoding_and_through_a_merge() -> None:
    known = ExpHistogram.from_values([0.2, 0.4], max_buckets=160)
    unknown = attrs.evolve(known, min=None, max=None)  # a shard's partial sent without them
    merged = unknown.merge(known, max_buckets=160)
    assert (merged.min, merged.max) == (None, None)  # the known side does not bound the other's values
    assert known.merge(ExpHistogram(), max_buckets=160).min == known.min  # an empty side does not matter
    aggregator = Aggregator(AggregatorConfig())
    aggregator.add_ofu("g1", 0.3, W0, W0 + 30 * S, {names.HW_MODEL: "H100", names.GPU_PRECISION: "bf16"})
    (report,) = aggregator.close_all()
    report = attrs.evolve(report, groups=tuple(attrs.evolve(group, histogram=merged) for group in report.groups))
    data = reports_to_metrics_data([report], resource_attributes={}, include_partials=False)
    request = ExportMetricsServiceRequest.FromString(encode_request(data))
    (point,) = points_of([request], names.FLEET_OFU.name)
    assert point.count == merged.count
    assert not point.HasField("min")
    assert not point.HasField("max")


# --- 5. the job cap after eviction, and both on the self-metrics -----------------------------------


def test_evicted_jobs_free_their_place_under_max_jobs_and_caps_and_evictions_show_by_reason() -> None:
    config = AggregatorConfig(window_s=60.0, lateness_s=10.0, max_jobs=2, stale_after_s=120.0)
    service = CollectorService(options(None, aggregator=config), environ={})
    t1 = W0 + S
    service.ingest(gpu_request({"GPU-1": ("a", 0.5), "GPU-2": ("b", 0.5)}, time_ns=t1))
    service.ingest(mfu_request({"a": 0.4, "b": 0.4}, time_ns=t1))  # pairs: a and b stay in the horizon
    service.flush(t1 + WINDOW + 11 * S)
    t2 = t1 + 5 * WINDOW  # a and b silent since t1, not yet evicted: a third job is over the cap
    over = service.ingest(mfu_request({"c": 0.4}, time_ns=t2))
    assert over.rejected == 1
    assert "over --max-jobs" in over.error_message
    service.flush(t2 + WINDOW + 11 * S)  # evicts a and b (their horizon blocks stay for the fleet)
    t3 = t2 + 2 * WINDOW
    service.ingest(gpu_request({"GPU-3": ("c", 0.5)}, time_ns=t3))
    taken = service.ingest(mfu_request({"c": 0.4}, time_ns=t3))
    assert taken.rejected == 0  # before: refused for the whole horizon (24 h by default)
    reports = service.flush(t3 + WINDOW + 11 * S)
    # c's 10 s interval straddles a window boundary (t3 is 1 s past one): c in both windows, no one else.
    assert [job.job_id for report in reports for job in report.jobs] == ["c", "c"]
    metrics = service.self_metrics()
    assert metrics[names.COLLECTOR_EVICTED.name] == {"stream": 2, "job": 2}
    assert metrics[names.COLLECTOR_POINTS_OVER_CAP.name] == {"max_streams": 0, "max_jobs": 1, "max_state_bytes": 0}
    rejected = metrics[names.COLLECTOR_POINTS_REJECTED.name]
    assert {reason: count for reason, count in rejected.items() if count} == {names.RejectReason.MAX_JOBS: 1}
    assert set(rejected) == set(names.RejectReason.ALL)  # every reason from the start, at 0 until it happens
    assert service.decoder.stats.rejected_by_message == {"job.mfu over --max-jobs (a new job)": 1}


def test_a_point_over_max_streams_is_rejected_by_its_own_reason() -> None:
    config = AggregatorConfig(window_s=60.0, lateness_s=10.0, max_streams=1)
    service = CollectorService(options(None, aggregator=config), environ={})
    outcome = service.ingest(gpu_request({"GPU-1": 0.5, "GPU-2": 0.5}, time_ns=W0 + S))
    assert outcome.rejected == 1
    late = service.flush(W0 + 2 * WINDOW)
    assert late
    assert service.ingest(gpu_request({"GPU-1": 0.5}, time_ns=W0 + S)).rejected == 1
    rejected = service.self_metrics()[names.COLLECTOR_POINTS_REJECTED.name]
    assert {reason: count for reason, count in rejected.items() if count} == {
        names.RejectReason.MAX_STREAMS: 1,
        names.RejectReason.LATE: 1,
    }
    assert service.decoder.stats.rejected_by_message == {
        "gpu.ofu over --max-streams (a new GPU stream)": 1,
        "gpu.ofu late (its window already closed)": 1,
    }


# --- the collector's own health, downstream ---------------------------------------------------------


def test_the_self_metrics_reach_the_downstream_under_the_collectors_resource(sink: OtlpSink) -> None:
    service = CollectorService(options(sink), environ={})
    service.ingest(gpu_request({"GPU-1": 0.5}, time_ns=W0 + S))
    service.ingest(gpu_request({"GPU-2": 2.0}, time_ns=W0 + S))  # rejected: not in [0, 1]
    service.flush(W0 + WINDOW + 11 * S)
    try:
        assert service.telemetry is not None
        assert service.telemetry.pump()
        ours = [
            request
            for request in sink.requests()
            if any(
                metric.name == names.COLLECTOR_POINTS_ACCEPTED.name
                for metric in request.resource_metrics[0].scope_metrics[0].metrics
            )
        ]
        assert len(ours) == 1
        (rm,) = ours[0].resource_metrics
        resource = {kv.key: kv.value.string_value for kv in rm.resource.attributes}
        assert resource[names.SERVICE_NAME] == names.COLLECTOR_SERVICE_NAME
        assert resource[names.SERVICE_INSTANCE_ID] == "test-1"
        metrics = {metric.name: metric for metric in rm.scope_metrics[0].metrics}
        assert set(metrics) <= {spec.name for spec in names.COLLECTOR_SELF_METRICS}
        accepted = metrics[names.COLLECTOR_POINTS_ACCEPTED.name].sum
        assert accepted.is_monotonic
        assert [point.as_int for point in accepted.data_points] == [1]
        rejected = {
            point.attributes[0].value.string_value: point.as_int
            for point in metrics[names.COLLECTOR_POINTS_REJECTED.name].sum.data_points
        }
        # Every reason from the first export on, at 0 until it happens: a one-off burst shows in rate().
        assert rejected == {**dict.fromkeys(names.RejectReason.ALL, 0), names.RejectReason.OUT_OF_RANGE: 1}
        queued = {
            point.attributes[0].value.string_value: point.as_int
            for point in metrics[names.COLLECTOR_EXPORT_QUEUED.name].gauge.data_points
        }
        assert set(queued) == {"windows", "pass_through", "events"}
    finally:
        service.stop(0)


# --- 13. rejected points logged, the log backing off, the shutdown grace ----------------------------


def test_rejected_points_are_logged_as_one_rate_limited_summary_by_reason(caplog: pytest.LogCaptureFixture) -> None:
    service = CollectorService(options(None, rejection_log_interval_s=3600.0), environ={}, clock=lambda: W0)
    caplog.set_level(logging.WARNING, logger="otel_ofu_collector.service")
    future = W0 + 3600 * S
    service.ingest(gpu_request({"GPU-1": 0.5, "GPU-2": 0.5}, time_ns=future))
    service.ingest(mfu_request({"j": 0.4}, time_ns=future))
    service.flush()
    lines = [record.getMessage() for record in caplog.records if "rejected" in record.getMessage()]
    assert lines == [
        "rejected 3 data point(s): 2 gpu.ofu without a timestamp or stamped in the future; "
        "1 job.mfu without a timestamp or stamped in the future"
    ]
    service.ingest(gpu_request({"GPU-1": 0.5}, time_ns=future))
    service.flush()  # within the interval: no second line
    assert len([record for record in caplog.records if "rejected" in record.getMessage()]) == 1
    service.stop(0)  # the rest is summed up on the way out
    last = [record.getMessage() for record in caplog.records if "rejected" in record.getMessage()][-1]
    assert last.startswith("rejected 1 data point(s) in the last ")


def test_an_unreachable_downstream_is_logged_as_the_retries_back_off(caplog: pytest.LogCaptureFixture) -> None:
    transport = downstream(f"http://127.0.0.1:{unused_port()}")
    delivery = Delivery(transport, initial_backoff_s=0.001, max_backoff_s=0.001)
    delivery.submit(b"")
    caplog.set_level(logging.WARNING, logger="otel_ofu_collector.outputs.delivery")
    for _ in range(20):
        assert not delivery.pump()
    warnings = [record for record in caplog.records if "downstream failed" in record.getMessage()]
    assert len(warnings) == 5  # the 1st, 2nd, 4th, 8th and 16th failure; before: all 20
    assert "(16 failed attempt(s) in a row)" in warnings[-1].getMessage()
    delivery.stop(0)


@attrs.define
class CountingDownTransport:
    attempts: int = 0
    lock: threading.Lock = attrs.field(factory=threading.Lock)

    def send(self, payload: bytes) -> Attempt:
        with self.lock:
            self.attempts += 1
        return Attempt(False, True, None, "UNAVAILABLE: down")

    def close(self) -> None:
        return None


def test_new_requests_do_not_cut_a_backoff_short() -> None:
    transport = CountingDownTransport()
    delivery = Delivery(transport, initial_backoff_s=30.0, max_backoff_s=30.0)
    delivery.start()
    try:
        delivery.submit(b"w1")
        deadline = time.monotonic() + 10
        while transport.attempts == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        for n in range(20):  # a flush or a pass-through request each: each wakes the sender
            delivery.submit(f"w{n}".encode())
            time.sleep(0.005)
        assert transport.attempts == 1  # before: about one retry per submission
    finally:
        delivery.stop(0)


def test_shutdown_with_the_downstream_down_keeps_to_the_grace() -> None:
    grace = 1.0
    service = CollectorService(options(None), transport=CountingDownTransport(), environ={})
    service.start()
    service.ingest(gpu_request({"GPU-1": 0.5}, time_ns=W0 + S, extra_metric="node.load"))  # pass-through too
    started = time.monotonic()
    service.stop(grace=grace)
    # Each sender used to get the whole grace after the other: twice it (three times with the self-metrics).
    assert time.monotonic() - started < 1.5 * grace


def test_the_self_metrics_go_downstream_even_when_no_window_closes(sink: OtlpSink) -> None:
    service = CollectorService(options(sink), environ={}, clock=lambda: W0)
    service.flush()  # nothing received: no window, but its health is what shows that
    service.flush()  # within a window's length: not again
    try:
        assert service.telemetry is not None
        assert service.telemetry.pump()
        accepted = points_of(sink.requests(), names.COLLECTOR_POINTS_ACCEPTED.name)
        assert [point.as_int for point in accepted] == [0]
    finally:
        service.stop(0)


# --- 8. a kill loses no accepted point: the write-ahead beside the spool ---------------------------


def test_after_a_kill_the_open_window_is_rebuilt_from_the_write_ahead_and_closed_ones_are_not_repeated(
    sink: OtlpSink, tmp_path: Any
) -> None:
    spool = str(tmp_path / "spool.sqlite")
    settings = {"spool_path": spool, "self_telemetry": False, "write_ahead_batch_s": 0.0}  # each request at once
    first = CollectorService(options(sink, **settings), environ={})
    # Its 10 s interval (W0 + 1 s, W0 + 11 s] lies inside window 1.
    first.ingest(gpu_request({"GPU-1": ("closed", 0.25)}, time_ns=W0 + 11 * S))
    first.flush(W0 + WINDOW + 11 * S)  # window 1 closed: its outputs are in the spool
    first.ingest(gpu_request({"GPU-1": ("open", 0.5), "GPU-2": ("open", 0.7)}, time_ns=W0 + WINDOW + 20 * S))
    first.ingest(mfu_request({"open": 0.4}, time_ns=W0 + WINDOW + 20 * S))
    # Killed here: no stop, nothing closed. (The files are as a SIGKILL leaves them: each write committed, and the
    # spool's lock dropped, as the kernel drops a killed process's.)
    assert first.spool_lock is not None
    first.spool_lock.release()
    second = CollectorService(options(sink, **settings), environ={})
    try:
        reports = second.flush(W0 + 2 * WINDOW + 11 * S)
        jobs = [job for report in reports for job in report.jobs]
        assert [job.job_id for job in jobs] == ["open"]  # before: nothing (the open window was lost)
        assert jobs[0].ofu == pytest.approx(0.6)
        assert jobs[0].mfu == pytest.approx(0.4)
        assert second.self_metrics()[names.COLLECTOR_POINTS_ACCEPTED.name] == 0  # counted by the first run
        assert second.exports is not None
        assert second.exports.pump()
        assert job_ids(sink.requests()) == {"closed", "open"}
        assert len(points_of(sink.requests(), names.JOB_OFU.name)) == 2  # each window once
    finally:
        second.stop(0)
    third = CollectorService(options(sink, **settings), environ={})
    try:
        assert third.flush(W0 + 10 * WINDOW) == []  # a clean stop left nothing to replay
    finally:
        third.stop(0)


def test_the_write_ahead_writes_in_batches_and_a_batch_is_written_before_any_read(tmp_path: Any) -> None:
    from otel_ofu_collector.storage.write_ahead import WriteAhead

    path = str(tmp_path / "wal.sqlite")
    ahead = WriteAhead(path, batch_s=3600.0, batch_size=3)
    ahead.append(b"a", 1)
    ahead.append(b"b", 2)
    assert WriteAhead(path).pending() == (None, [])  # still in the batch: a kill now loses these two
    ahead.append(b"c", 3)  # the third fills the batch: written
    assert WriteAhead(path).pending() == (None, [b"a", b"b", b"c"])
    ahead.append(b"d", 4)
    ahead.closed_through(10, 3)  # writes the batch first, then drops what is done
    assert WriteAhead(path).pending() == (10, [b"c", b"d"])
    ahead.clear()
    assert ahead.pending() == (None, [])
    ahead.close()
