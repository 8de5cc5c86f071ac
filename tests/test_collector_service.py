"""The collector service end to end on loopback: producer-like OTLP in, window outputs out at a downstream."""

from __future__ import annotations

import argparse
import inspect
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import grpc
import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from prometheus_client.parser import text_string_to_metric_families

from otel_ofu import names
from otel_ofu.otlp_client import Attempt
from otel_ofu.testing.otlp_requests import gpu_request, mfu_request
from otel_ofu.testing.otlp_sink import OtlpSink, SinkMode
from otel_ofu_collector import command
from otel_ofu_collector.config import AggregatorConfig
from otel_ofu_collector.outputs.consumer import CallbackConsumer
from otel_ofu_collector.outputs.record_codec import load_records
from otel_ofu_collector.receivers.otlp_grpc import EXPORT_METHOD, GrpcReceiver
from otel_ofu_collector.results import WindowReport
from otel_ofu_collector.service import DEFAULT_SHUTDOWN_GRACE_S, CollectorOptions, CollectorService
from tests.collector_helpers import collector_options

S = 1_000_000_000
W0 = 1_700_000_040 * S  # a multiple of 60 s: windows are aligned to the epoch
T1 = W0 + 11 * S  # a point time whose 10 s interval (W0 + 1 s, W0 + 11 s] lies inside the window after W0
WINDOW = 60 * S


def producer_request(
    gpus: Mapping[str, tuple[str, float]], time_ns: int, *, host: str = "node-1", extra: str | None = None
) -> ExportMetricsServiceRequest:
    """{hw.id: (job.id, ofu)} in the producer's layout, with its SM clock gauge (consumed, never forwarded)."""
    return gpu_request(gpus, time_ns=time_ns, host=host, sm_clock_hz=1.98e9, extra_metric=extra)


def send(port: int, request: ExportMetricsServiceRequest) -> ExportMetricsServiceResponse:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.unary_unary(EXPORT_METHOD, None, None)
        return ExportMetricsServiceResponse.FromString(call(request.SerializeToString(), timeout=10))


def outputs(sink: OtlpSink, name: str) -> list[tuple[dict[str, str], float, int]]:
    """(attributes, value, window end) of every gauge point of ``name`` the downstream received."""
    found = []
    for request in sink.requests():
        for rm in request.resource_metrics:
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    if metric.name == name and metric.WhichOneof("data") == "gauge":
                        for point in metric.gauge.data_points:
                            attributes = {
                                kv.key: kv.value.string_value or str(kv.value.double_value) for kv in point.attributes
                            }
                            value = point.as_double if point.WhichOneof("value") == "as_double" else point.as_int
                            found.append((attributes, float(value), point.time_unix_nano))
    return found


def metric_names(sink: OtlpSink) -> set[str]:
    return {m.name for r in sink.requests() for rm in r.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}


def options(sink: OtlpSink | None, **overrides: Any) -> CollectorOptions:
    """With a gRPC receiver on a free port and the miscount flag after two windows."""
    aggregator = AggregatorConfig(window_s=60.0, lateness_s=10.0, flag_settings={"miscount_windows": 2})
    return collector_options(sink, **{"aggregator": aggregator, "grpc_listen": "127.0.0.1:0", **overrides})


@pytest.fixture
def sink() -> Iterator[OtlpSink]:
    with OtlpSink.start(hold_limit_s=5) as started:
        yield started


@pytest.fixture
def service(sink: OtlpSink) -> Iterator[CollectorService]:
    started = CollectorService(options(sink), environ={})
    started.start()
    yield started
    started.stop(grace=2)


def test_windows_go_downstream_with_job_correlation_and_flags(sink: OtlpSink) -> None:
    seen: list[Sequence[WindowReport]] = []
    service = CollectorService(options(sink), consumers=[CallbackConsumer(seen.append)], environ={})
    service.start()
    try:
        port = service.ports["grpc"]
        for window in range(3):
            t = W0 + window * WINDOW + 30 * S
            send(port, producer_request({"GPU-1": ("dense", 0.5), "GPU-2": ("dense", 0.4), "GPU-3": ("moe", 0.2)}, t))
            # moe's framework claims 2x its real FLOPs: flagged after miscount_windows (2) windows
            send(port, mfu_request({"dense": 0.43 + 0.01 * window, "moe": 0.4 + 0.01 * window}, t))
            reports = service.flush(W0 + (window + 1) * WINDOW + 10 * S)
            assert [(r.start_ns, r.end_ns) for r in reports] == [(W0 + window * WINDOW, W0 + (window + 1) * WINDOW)]
        assert len(seen) == 3
        assert sink.wait_for(lambda s: len(outputs(s, names.JOB_FLOPS_MISCOUNT.name)) == 6)
        [gpus] = [value for attrs, value, end in outputs(sink, names.FLEET_GPUS.name) if end == W0 + WINDOW]
        assert gpus == pytest.approx(0.5)  # 3 GPUs x one 10 s interval each, over a 60 s window
        quantiles = {a[names.QUANTILE] for a, _, _ in outputs(sink, names.FLEET_OFU_QUANTILE.name)}
        assert len(quantiles) == len(names.QUANTILES)
        job_ofu = {(a[names.JOB_ID], end): v for a, v, end in outputs(sink, names.JOB_OFU.name)}
        assert job_ofu[("dense", W0 + WINDOW)] == pytest.approx(0.45)
        flags = {(a[names.JOB_ID], end): v for a, v, end in outputs(sink, names.JOB_FLOPS_MISCOUNT.name)}
        assert flags[("moe", W0 + 3 * WINDOW)] == 1.0
        assert flags[("dense", W0 + 3 * WINDOW)] == 0.0
        assert {names.FLEET_OFU.name, names.JOB_OFU_MFU_GAP.name} <= metric_names(sink)
        # our inputs were consumed, not forwarded
        assert not metric_names(sink) & {names.GPU_OFU.name, names.GPU_CLOCK_SM.name, names.JOB_MFU.name}
        resource = {kv.key: kv.value.string_value for kv in sink.requests()[0].resource_metrics[0].resource.attributes}
        assert resource[names.SERVICE_NAME] == names.COLLECTOR_SERVICE_NAME
    finally:
        service.stop(grace=2)


def test_foreign_metrics_pass_through_and_rejections_are_reported(service: CollectorService, sink: OtlpSink) -> None:
    request = producer_request({"GPU-1": ("j", 0.5), "GPU-2": ("j", 7.0)}, T1, extra="node.memory.usage")
    response = send(service.ports["grpc"], request)
    assert response.partial_success.rejected_data_points == 1
    assert sink.wait_for(lambda s: "node.memory.usage" in metric_names(s))
    [forwarded] = sink.requests()
    assert len(forwarded.resource_metrics) == 2
    assert forwarded.resource_metrics[0].resource == request.resource_metrics[0].resource
    assert [m.name for m in forwarded.resource_metrics[0].scope_metrics[0].metrics] == ["node.memory.usage"]
    counters = service.self_metrics()
    # GPU-1's OFU and both GPUs' SM clocks (a loss input: taken even where the OFU is refused)
    assert counters[names.COLLECTOR_POINTS_ACCEPTED.name] == 3
    assert sum(counters[names.COLLECTOR_POINTS_REJECTED.name].values()) == 1
    assert counters[names.COLLECTOR_REQUESTS_FORWARDED.name] == 1


def test_stop_flushes_open_windows_and_refuses_new_requests(sink: OtlpSink) -> None:
    service = CollectorService(options(sink), environ={})
    service.start()
    port = service.ports["grpc"]
    send(port, producer_request({"GPU-1": ("j", 0.5)}, T1))
    reports = service.stop(grace=2)
    assert [r.end_ns for r in reports] == [W0 + WINDOW]
    # exported before stop returned: one GPU's 10 s interval over the 60 s window
    assert outputs(sink, names.FLEET_GPUS.name)[0][1] == pytest.approx(1 / 6)
    with pytest.raises(grpc.RpcError):
        send(port, producer_request({"GPU-1": ("j", 0.5)}, T1))


def test_outage_and_restart_lose_no_window(sink: OtlpSink, tmp_path: Path) -> None:
    spool = str(tmp_path / "spool.sqlite")
    sink.set_mode(SinkMode.UNAVAILABLE)
    first = CollectorService(options(sink, spool_path=spool, pass_through=False), environ={})
    first.start()
    try:
        send(first.ports["grpc"], producer_request({"GPU-1": ("j", 0.5)}, T1))
        first.flush(W0 + WINDOW + 10 * S)
        send(first.ports["grpc"], producer_request({"GPU-1": ("j", 0.6)}, W0 + WINDOW + S))
    finally:
        first.stop(grace=0.5)  # the downstream is still down: both windows stay in the spool
    assert sink.received == []

    sink.set_mode(SinkMode.OK)
    second = CollectorService(options(sink, spool_path=spool, pass_through=False), environ={})
    second.start()
    try:
        assert sink.wait_for(lambda s: len(outputs(s, names.FLEET_GPUS.name)) == 2)
        assert sorted(end for _, _, end in outputs(sink, names.FLEET_GPUS.name)) == [W0 + WINDOW, W0 + 2 * WINDOW]
    finally:
        second.stop(grace=2)


def test_without_a_downstream_outputs_still_reach_listeners() -> None:
    service = CollectorService(options(None), environ={})
    seen: list[Sequence[WindowReport]] = []
    service.consumers.append(CallbackConsumer(seen.append))
    service.start()
    try:
        assert service.exports is None
        service.ingest(producer_request({"GPU-1": ("j", 0.5)}, T1))
        service.flush(W0 + 2 * WINDOW)
        assert seen[0][0].groups[0].gpus == pytest.approx(1 / 6)  # one GPU's 10 s interval of the window
    finally:
        service.stop(grace=1)


def test_prometheus_endpoint_shows_gauges_not_histograms(sink: OtlpSink) -> None:
    service = CollectorService(options(sink, prometheus_port=0, prometheus_host="127.0.0.1"), environ={})
    service.start()
    try:
        service.ingest(producer_request({"GPU-1": ("j", 0.5), "GPU-2": ("j", 0.3)}, T1))
        service.ingest(mfu_request({"j": 0.35}, T1))
        service.flush(W0 + 2 * WINDOW)
        url = f"http://127.0.0.1:{service.ports['prometheus']}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
    finally:
        service.stop(grace=1)
    families = {family.name: family for family in text_string_to_metric_families(text)}
    assert "fleet_ofu" not in families
    quantile = families["fleet_ofu_quantile"]
    assert {sample.labels[names.PROMETHEUS_QUANTILE_LABEL] for sample in quantile.samples} >= {"0.5", "0.99"}
    assert families["fleet_gpus"].samples[0].value == pytest.approx(2 / 6)  # two GPUs' 10 s of the 60 s window
    assert families["job_ofu"].samples[0].labels["job_id"] == "j"
    assert families["job_ofu_mfu_gap"].samples[0].value == pytest.approx(-0.05)
    # Each self-metric is exposed with its kind from the vocabulary: sums as counters, the queue as a gauge.
    assert families["otel_ofu_collector_points_accepted"].type == "counter"
    assert families["otel_ofu_collector_requests_forwarded"].type == "counter"
    assert families["otel_ofu_collector_export_queued"].type == "gauge"


def test_shards_merge_into_fleet_windows(sink: OtlpSink) -> None:
    merge = CollectorService(options(sink, mode="merge", instance_id="merge"), environ={})
    shards: list[CollectorService] = []
    try:
        merge.start()
        merge_endpoint = f"http://127.0.0.1:{merge.ports['grpc']}"
        shards = [
            CollectorService(
                options(None, mode="shard", instance_id=f"shard-{i}", export_endpoint=merge_endpoint), environ={}
            )
            for i in range(2)
        ]
        for shard in shards:
            shard.start()
        # jobs are split across shards as the loadbalancing exporter would (by job.id)
        shards[0].ingest(producer_request({"GPU-1": ("a", 0.5), "GPU-2": ("a", 0.3)}, T1))
        shards[0].ingest(mfu_request({"a": 0.45}, T1))
        shards[1].ingest(producer_request({"GPU-3": ("b", 0.7)}, T1, host="node-2"))
        shards[1].ingest(mfu_request({"b": 0.6}, T1))
        for shard in shards:
            shard.flush(W0 + WINDOW + 10 * S)
        deadline = time.monotonic() + 10
        while merge.decoder.stats.accepted < 2 and time.monotonic() < deadline:
            time.sleep(0.01)  # one partial window per shard, arriving over loopback
        [merged] = merge.flush(W0 + WINDOW + 10 * S)
        assert merged.groups[0].gpus == pytest.approx(0.5)  # 3 GPUs x 10 s over the 60 s window
        assert merged.fleet.jobs == 2
        assert sink.wait_for(
            lambda s: len(outputs(s, names.JOB_OFU.name)) == 2 and outputs(s, names.FLEET_GPUS.name) != []
        )
        # one fleet-wide fleet.gpus (the merge tier's), not the shards' local ones
        assert [v for _, v, _ in outputs(sink, names.FLEET_GPUS.name)] == [pytest.approx(0.5)]
        assert {a[names.JOB_ID] for a, _, _ in outputs(sink, names.JOB_OFU.name)} == {"a", "b"}  # passed through
        assert not metric_names(sink) & {spec.name for spec in names.COLLECTOR_PARTIAL_METRICS}
    finally:
        for shard in shards:
            shard.stop(grace=1)
        merge.stop(grace=2)


def test_command_line_builds_the_options(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_OFU_COLLECTOR_MISCOUNT_RATIO", "1.8")
    monkeypatch.setenv("OTEL_OFU_COLLECTOR_HTTP_BODY_DEADLINE", "12.5")
    monkeypatch.setenv("OTEL_OFU_MISCOUNT_RATIO", "9")  # run's prefix: no command reads it, the collector's is its own
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=prod,service.name=mine,k8s.pod.name=c-0")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "renamed")
    parser = argparse.ArgumentParser()
    command.register(parser.add_subparsers())
    args = parser.parse_args(
        ["collector", "--window", "30", "--lateness", "5", "--group-by", "hw.model", "--no-pass-through",
         "--mode", "shard", "--http-listen", "127.0.0.1:0", "--spool", "/tmp/x.sqlite"]
    )  # fmt: skip
    built = command.options_from_args(args)
    assert built.aggregator.window_s == 30.0
    assert built.aggregator.flag_settings["miscount_ratio"] == 1.8
    assert built.aggregator.flag_settings["regression_min_baseline"] == 0.05
    assert built.http_body_deadline_s == 12.5
    assert built.aggregator.group_keys == ("hw.model",)
    assert (built.pass_through, built.mode, built.include_partials) == (False, "shard", True)
    assert (built.grpc_listen, built.http_listen, built.spool_path) == ("0.0.0.0:4317", "127.0.0.1:0", "/tmp/x.sqlite")
    # the standard variable adds attributes; the outputs' service.name stays the collector's own
    assert dict(built.resource_attributes) == {"deployment.environment": "prod", "k8s.pod.name": "c-0"}
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "service.instance.id=shard-2")
    assert command.options_from_args(args).instance_id == "shard-2"
    assert command.options_from_args(parser.parse_args(["collector", "--instance-id", "x"])).instance_id == "x"
    with pytest.raises(ValueError, match="go together"):
        command.options_from_args(parser.parse_args(["collector", "--tls-cert", "c.pem"]))


def test_the_command_runs_until_sigterm_and_flushes(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_EXPORTER", "OTEL_OFU"))}
    records = tmp_path / "windows.jsonl"
    argv = ["collector", "--listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0", "--record-outputs", str(records)]
    process = subprocess.Popen(
        [sys.executable, "-m", "otel_ofu.cli", *argv],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert process.stderr is not None
        line = process.stderr.readline()
        while line and "ready" not in line:
            line = process.stderr.readline()
        assert "otel-ofu collector ready: grpc 127.0.0.1:" in line
        port = int(line.split("grpc 127.0.0.1:")[1].split()[0])
        now = time.time_ns()
        # A 10 s interval inside the current window (it would straddle a boundary one time in six at "now").
        send(port, producer_request({"GPU-1": ("j", 0.5)}, now - now % WINDOW + 11 * S))
        process.send_signal(signal.SIGTERM)
        _, rest = process.communicate(timeout=20)
        assert process.returncode == 0
        assert "1 window(s) flushed" in rest
        (recorded,) = load_records(records).reports
        assert [job.job_id for job in recorded.jobs] == ["j"]
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_a_point_from_the_future_cannot_drag_the_windows_ahead() -> None:
    now = [W0 + 30 * S]
    service = CollectorService(options(None), clock=lambda: now[0], environ={})
    far = service.ingest(producer_request({"GPU-x": ("j", 0.5)}, now[0] + 3600 * S))
    assert far.rejected == 2  # its OFU and its SM clock
    assert "future" in far.error_message
    assert service.ingest(producer_request({"GPU-1": ("j", 0.5)}, now[0])).accepted == 2
    now[0] = W0 + 75 * S
    [report] = service.flush()  # the clock closes only the first window...
    assert report.end_ns == W0 + WINDOW
    # ...so the next window is still open for the fleet's points
    assert service.ingest(producer_request({"GPU-1": ("j", 0.5)}, W0 + 80 * S)).accepted == 2


def test_a_producer_a_minute_ahead_does_not_close_the_current_window() -> None:
    now = [W0 + 75 * S]
    service = CollectorService(options(None), clock=lambda: now[0], environ={})
    service.ingest(producer_request({"GPU-1": ("j", 0.5)}, W0 + 30 * S))
    service.ingest(producer_request({"GPU-2": ("j", 0.5)}, W0 + 70 * S))  # the current window
    ahead = service.ingest(producer_request({"GPU-3": ("j", 0.5)}, now[0] + 60 * S, host="fast-clock"))
    assert ahead.accepted == 2  # well within the accepted clock skew (its OFU and SM clock)
    [report] = service.flush()  # the timer's path: the collector's clock decides, not the data's watermark
    assert report.end_ns == W0 + WINDOW
    assert service.ingest(producer_request({"GPU-2": ("j", 0.4)}, W0 + 100 * S)).accepted == 2  # still open


@attrs.define
class _GapProbe:
    """Stands in for the decoder's lock. On its first release it starts a rival flush and, if the publish
    lock is free at that point (closing and publishing are not one step), lets the rival finish inside
    the gap, as an unlucky timer tick would."""

    inner: threading.Lock
    service: CollectorService
    rival_now_ns: int
    rivals: list[threading.Thread] = attrs.field(factory=list)

    def __enter__(self) -> None:
        self.inner.acquire()

    def __exit__(self, *_: object) -> None:
        self.inner.release()
        if self.rivals:
            return
        rival = threading.Thread(target=self.service.flush, args=(self.rival_now_ns,))
        self.rivals.append(rival)
        rival.start()
        if not self.service._publish_lock.locked():
            rival.join()


def test_concurrent_flushes_publish_windows_in_order() -> None:
    service = CollectorService(options(None, grpc_listen=None), environ={})
    published: list[int] = []
    service.consumers.append(CallbackConsumer(lambda reports: published.extend(r.end_ns for r in reports)))
    service.start()  # the consumers take windows once started
    service.ingest(producer_request({"GPU-1": ("j", 0.5)}, W0 + 30 * S))
    service.ingest(producer_request({"GPU-1": ("j", 0.5)}, W0 + 90 * S))
    probe = _GapProbe(service.aggregator.lock, service, W0 + 2 * WINDOW + 10 * S)
    service.aggregator.lock = probe  # type: ignore[assignment]
    service.flush(W0 + WINDOW + 10 * S)  # closes the first window; the rival closes the second
    for rival in probe.rivals:
        rival.join(10)
    assert published == [W0 + WINDOW, W0 + 2 * WINDOW]
    service.stop(grace=0)


@attrs.define
class RecordingTransport:
    sent: list[bytes] = attrs.field(factory=list)

    def send(self, payload: bytes) -> Attempt:
        self.sent.append(payload)
        return Attempt(True)

    def close(self) -> None:
        return None


def test_outputs_carry_the_users_resource_under_our_service_name_and_instance_id() -> None:
    transport = RecordingTransport()
    user = {
        names.K8S_POD_NAME: "collector-0",
        "deployment.environment.name": "prod",
        names.SERVICE_NAME: "user-says",
        names.SERVICE_INSTANCE_ID: "user-id",
    }
    service = CollectorService(
        options(None, resource_attributes=user, grpc_listen=None), transport=transport, environ={}
    )
    service.start()  # the window export takes windows once started
    service.ingest(producer_request({"GPU-1": ("j", 0.5)}, T1))
    service.flush(W0 + 2 * WINDOW)
    assert service.exports is not None
    assert service.exports.pump()
    assert service.telemetry is not None
    assert service.telemetry.pump()
    # The window outputs and the self-metrics of that flush (their senders are two threads: either may be first).
    [windows, self_metrics] = transport.sent
    service.stop(grace=0)
    for payload in (windows, self_metrics):
        resource = ExportMetricsServiceRequest.FromString(payload).resource_metrics[0].resource
        assert {kv.key: kv.value.string_value for kv in resource.attributes} == {
            names.K8S_POD_NAME: "collector-0",
            "deployment.environment.name": "prod",
            names.SERVICE_NAME: names.COLLECTOR_SERVICE_NAME,
            names.SERVICE_INSTANCE_ID: "test-1",  # how the merge tier tells shards apart
        }


def test_a_busy_port_fails_start_with_one_line_and_leaves_nothing_listening() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = f"127.0.0.1:{busy.getsockname()[1]}"
        service = CollectorService(options(None, http_listen=taken), environ={})
        with pytest.raises(OSError, match=f"cannot listen for OTLP/HTTP on {taken}"):
            service.start()
    grpc_port = service.ports["grpc"]  # bound before the HTTP receiver failed: it must be released
    again = GrpcReceiver(service.ingest_bytes, service.gate, f"127.0.0.1:{grpc_port}")
    again.start()
    again.stop(0)


def test_stop_waits_as_long_as_the_command_by_default() -> None:
    parser = argparse.ArgumentParser()
    command.register(parser.add_subparsers())
    args = parser.parse_args(["collector"])
    grace = inspect.signature(CollectorService.stop).parameters["grace"].default
    assert grace == DEFAULT_SHUTDOWN_GRACE_S == args.shutdown_grace


@attrs.define
class SharedTransport:
    """One transport for both deliveries: holds each send until released, and fails like a gRPC channel
    would (AttributeError) when sent on after it was closed."""

    inside: threading.Event = attrs.field(factory=threading.Event)
    release: threading.Event = attrs.field(factory=threading.Event)
    sent: threading.Event = attrs.field(factory=threading.Event)
    events: list[str] = attrs.field(factory=list)
    closed: bool = False

    def send(self, payload: bytes) -> Attempt:
        self.inside.set()
        self.release.wait(10)
        if self.closed:
            raise AttributeError("'NoneType' object has no attribute 'unary_unary'")
        self.events.append("sent")
        self.sent.set()
        return Attempt(True)

    def close(self) -> None:
        self.closed = True
        self.events.append("closed")


def test_stopping_the_window_export_leaves_pass_through_its_transport() -> None:
    transport = SharedTransport()
    service = CollectorService(options(None, grpc_listen=None, self_telemetry=False), transport=transport, environ={})
    service.start()
    try:
        assert service.exports is not None
        assert service.pass_through is not None
        service.ingest(producer_request({"GPU-1": ("j", 0.5)}, T1, extra="node.memory.usage"))
        assert transport.inside.wait(10)  # pass-through is mid-send
        assert service.exports.stop(0) == 0
        transport.release.set()
        assert transport.sent.wait(10)
        assert service.pass_through.stats.sent == 1
        assert service.pass_through.stats.last_error == ""
    finally:
        transport.release.set()
        service.stop(grace=1)
    assert transport.events == ["sent", "closed"]  # closed once, by the service, after every send


@attrs.define
class DownTransport:
    def send(self, payload: bytes) -> Attempt:
        return Attempt(False, True, None, "UNAVAILABLE: down")

    def close(self) -> None:
        return None


def test_self_metrics_after_stop_report_what_the_spool_kept(tmp_path: Path) -> None:
    spool = str(tmp_path / "spool.sqlite")
    service = CollectorService(
        options(None, grpc_listen=None, spool_path=spool, pass_through=False), transport=DownTransport(), environ={}
    )
    service.start()
    service.ingest(producer_request({"GPU-1": ("j", 0.5)}, T1))
    service.flush(W0 + 2 * WINDOW)
    service.stop(grace=0.1)
    # A Prometheus scrape can land between the spool closing and the endpoint stopping: no ProgrammingError. The
    # spool kept what could not be delivered: the window, and the empty windows after it the stop closed too (the
    # collector's clock is far past them).
    queued = service.self_metrics()[names.COLLECTOR_EXPORT_QUEUED.name]
    assert set(queued) == {"windows"}
    assert queued["windows"] >= 1
