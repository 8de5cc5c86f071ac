"""Collector end to end: CPU of the real ``otel-ofu collector`` process per GPU report, beside real peers.

Each collector runs as its own process on 127.0.0.1; one client in this process sends the same
pre-serialised OTLP/gRPC ``Export`` requests to each, one in flight at a time, and waits for every reply.
The requests are the producer's layout: one Resource per GPU (its identity) and either 1 point
(``gpu.ofu``) or 8 points (the producer's eight gauges) per GPU report, for a fleet whose GPUs report
again and again (as they do every 10 s), ``GPUs per request`` GPUs in one request (1 is a producer
sending straight to the collector; more is an agent batching a node or a rack). A collector's CPU is
utime + stime of its process from ``/proc/<pid>/stat`` (every thread), read after a warm-up and again
after the last reply plus a settle pause (so asynchronous batch work is counted); the client's CPU is
not counted. /proc counts in clock ticks (10 ms), so each case sends enough reports for hundreds of ticks.

Steady state: before the measured reports, every collector is sent one interval of the whole fleet (each
GPU once) and a settle pause, so the measured reports are the ones a fleet sends every 10 s from then on.
A collector that remembers what it saw (ours keeps each Resource's identity) is measured as it runs; the
first sight of a Resource is dearer, and is measured apart: ours with every Resource new (a fleet larger
than the run), reported beside the rest with no target. Until 2026-12-01 the quick run sent 2,000 reports
over a 4,096-GPU fleet and no warm-up of the fleet, so every report was a first sight.

Peers, in the same run on the same requests:

- ``otel-ofu collector``: receive, decode, aggregate per window (no downstream, so nothing is exported).
- Rotel (``rotel-agent``, Rust, PyPI ``rotel``): receive and pass everything to its blackhole exporter; the
  least any OTLP receiver can do, so it bounds what is possible in a compiled collector.
- The OpenTelemetry Collector (``build/otelcol/otelcol-ofu``): an OTLP receiver and a ``signaltometrics``
  connector computing the per-``hw.model`` exponential histogram of ``gpu.ofu`` (the same aggregate as
  ours), to a ``nop`` exporter. Run only where that binary has been built (``make otelcol``), else
  reported as not run.
- The floor: grpcio's synchronous Python server answering every request at once (``grpc_stages.floor``), the
  cheaper of grpcio's two Python servers (ours is the asyncio one). What any receiver on grpcio's Python server
  costs before its handler.
- A gateway tier: the producers' requests go to an OpenTelemetry Collector (``otlp`` receiver, ``batch``
  processor of 512 GPU reports, ``otlp`` exporter without compression on loopback) and from it to ours; the
  CPU of both processes, each apart and together, per GPU report sent (8 points, 8 GPUs per request).

By transport, in the same run: the same requests (8 points per GPU) at 8 GPUs per request (a node's producer)
and 1000 GPUs per request (a gateway's batch), over OTLP/HTTP (``application/x-protobuf`` POSTed to
``/v1/metrics``; ``SENDERS`` client threads at once, each on one keep-alive ``http.client`` connection, as a
node fleet sends) and over OTLP/gRPC (one in flight, as above), to ours, Rotel (its OTLP/HTTP endpoint for
HTTP) and the transport's floor: over OTLP/HTTP our HTTP/1.1 framing (``receivers/http_framing``) serving an
app that takes the body and answers 200 with an empty ExportMetricsServiceResponse, no parse, no gate
(``http_receiver_cost.floor``); over gRPC the grpcio no-op server. Each peer is a fresh process per case,
the peers in turn, ``repeats`` times: the median and the spread (min-max) of the repeats, and each ratio
to Rotel taken within one repeat.

GPUs per core at a 10 s interval = 10 s / CPU per GPU report.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs
import grpc
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from benchmarks.common import BenchResult, RunContext, Table, Verdict, doc_summary, new_figure, save_figure
from otel_ofu import names
from otel_ofu.testing.otlp_requests import set_attribute

ROOT = Path(__file__).resolve().parents[1]
# The console script beside this interpreter (the venv's), else the one on PATH.
OTEL_OFU = (
    str(Path(sys.executable).with_name("otel-ofu"))
    if Path(sys.executable).with_name("otel-ofu").is_file()
    else (shutil.which("otel-ofu") or "otel-ofu")
)
OTELCOL = ROOT / "build" / "otelcol" / "otelcol-ofu"
EXPORT_METHOD = "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export"
S = 1_000_000_000
INTERVAL_S = 10.0
TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")
SETTLE_S = 0.5  # after the last reply: batching peers finish their asynchronous work
MODELS = ("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB")
# Targets, per GPU report of 8 points at 8 GPUs per request (one producer exporting its host to the collector).
TARGET_US_PER_REPORT = 20.0
NODE_GPUS = 8  # GPUs per request of one producer: one host's GPUs, one Resource each
OURS, ROTEL, OTELCOL_NAME = "otel-ofu collector", "rotel", "otelcol (signaltometrics)"
FLOOR = "grpcio no-op server (floor)"
TIER = "otelcol gateway (batch) + otel-ofu collector"
FIRST_SIGHT = "(every Resource new)"
TARGET_RATIO_TO_ROTEL = 2.0  # our CPU per point / Rotel's
TARGET_THROUGHPUT_TO_OTELCOL = 0.5  # our GPU reports per CPU second / the OpenTelemetry Collector's
# By transport: a node's producer (8 GPUs per request) over OTLP/HTTP, and a gateway's batch over gRPC.
GATEWAY_GPUS = 1000
TRANSPORT_CASES = (("http", NODE_GPUS), ("http", GATEWAY_GPUS), ("grpc", GATEWAY_GPUS))
TARGET_HTTP_US_PER_REPORT = 15.0  # 8 GPUs per request over OTLP/HTTP
TARGET_GATEWAY_RATIO_TO_ROTEL = 1.8  # our CPU per point / Rotel's, 1000 GPUs per request over gRPC
SENDERS = 4  # OTLP/HTTP client threads at once, one keep-alive connection each
HTTP_FLOOR = "our HTTP framing, no-op app (floor)"
HTTP_PATH = "/v1/metrics"


# Readings in their units, so that every point is accepted: a share of 1.98 GHz for the SM clock (the board's
# maximum is sent as 1.98 GHz exactly) and of an H100's 989 TFLOP/s. Until 2026-12-02 every value was a share
# in [0.1, 0.9], so both clocks (Hz, under 1 MHz) were refused and every request cost a partial success.
SCALES: dict[str, float] = {names.GPU_CLOCK_SM.name: 1.98e9, names.GPU_FLOPS_ACHIEVED.name: 989e12}
FIXED: dict[str, float] = {names.GPU_CLOCK_SM_MAX.name: 1.98e9}


def producer_requests(gpus_per_request: int, points_per_gpu: int, requests: int, fleet: int) -> list[bytes]:
    """``requests`` serialised requests of ``gpus_per_request`` GPU reports each, in the producer's layout.

    The fleet's GPUs take turns, so each Resource comes back every ``fleet // gpus_per_request`` requests;
    point times advance 1 ms per request, so no two reports of a GPU share a timestamp. As a fleet's producers,
    each GPU reports at a phase of its own: GPU ``g``'s intervals end ``g % 60`` s after a minute's start (the next
    minute's, ahead of the clock by less than the collector's 5 min bound, so that none is late and no window closes
    during a case). So 1 report in 6 straddles a 60 s window's boundary, as over a real fleet of 10 s producers,
    whenever the benchmark runs: with one time for every GPU, every report of a case straddled or none did, by
    where the clock stood (ours cost 13.6-21.4 us per report from one repeat to the next).
    """
    metrics = names.PRODUCER_METRICS[:points_per_gpu]
    now_ns = time.time_ns()
    minute = 60 * S
    anchor_ns = now_ns - now_ns % minute + minute  # the next minute's start
    payloads = []
    resources: dict[int, Resource] = {}  # each GPU's Resource, made once (a 1000-GPU request is made in seconds)
    for index in range(requests):
        request = ExportMetricsServiceRequest()
        for slot in range(gpus_per_request):
            gpu = (index * gpus_per_request + slot) % fleet
            time_ns = anchor_ns + (gpu % 60) * S + index * 1_000_000
            rm = request.resource_metrics.add()
            resource = resources.get(gpu)
            if resource is None:
                resource = gpu_resource(gpu)
                if len(resources) < 65_536:
                    resources[gpu] = resource
            rm.resource.CopyFrom(resource)
            sm = rm.scope_metrics.add()
            sm.scope.name = names.INSTRUMENTATION_SCOPE
            for position, spec in enumerate(metrics):
                metric = sm.metrics.add(name=spec.name, unit=spec.unit)
                share = 0.1 + 0.8 * ((gpu * 7 + index + position) % 10) / 10
                reading = FIXED.get(spec.name, share * SCALES.get(spec.name, 1.0))
                point = metric.gauge.data_points.add(as_double=reading, time_unix_nano=time_ns)
                point.start_time_unix_nano = time_ns - int(INTERVAL_S * S)
        payloads.append(request.SerializeToString())
    return payloads


def gpu_resource(gpu: int) -> Resource:
    """The Resource of GPU number ``gpu`` of the fleet, as the producer sends it: its identity."""
    resource = Resource()
    for key, value in (
        (names.SERVICE_NAME, names.PRODUCER_SERVICE_NAME),
        (names.HOST_NAME, f"node-{gpu // 8:05d}"),
        (names.HW_ID, f"GPU-{gpu:08x}-1d2c-4b5a-9e8f-0a1b2c3d4e5f"),
        (names.HW_MODEL, MODELS[gpu % len(MODELS)]),
        (names.HW_TYPE, names.HW_TYPE_GPU),
        (names.HW_VENDOR, names.HW_VENDOR_NVIDIA),
        (names.GPU_INDEX, gpu % 8),
        (names.JOB_ID, f"job-{gpu // 16}"),
        (names.GPU_PRECISION, "bf16"),
    ):
        set_attribute(resource.attributes, key, value)
    return resource


def process_cpu_s(pid: int) -> float:
    """utime + stime of every thread of ``pid`` (fields 14 and 15 of /proc/<pid>/stat), in seconds."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) * TICK_S


def unused_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@attrs.frozen
class Peer:
    """A collector to run: how to start it on a gRPC port, or why it cannot run here (``missing``)."""

    name: str
    version: str
    argv: Callable[[int, Path], list[str]]
    missing: str | None = None
    config: Callable[[int, Path], None] | None = None  # writes the peer's config file before it starts
    transport: str = "grpc"  # what it serves on the port: "grpc" (OTLP/gRPC) or "http" (OTLP/HTTP)


def ours(transport: str = "grpc") -> Peer:
    from importlib.metadata import version

    def argv(port: int, work: Path) -> list[str]:
        if transport == "http":
            return [OTEL_OFU, "collector", "--listen=off", f"--http-listen=127.0.0.1:{port}"]
        return [OTEL_OFU, "collector", f"--listen=127.0.0.1:{port}", "--http-listen=off"]

    return Peer("otel-ofu collector", version("otel-ofu"), argv, transport=transport)


def rotel_binary() -> Path | None:
    import importlib.util

    spec = importlib.util.find_spec("rotel")
    for place in list(spec.submodule_search_locations or []) if spec is not None else []:
        binary = Path(place) / "rotel-agent"
        if binary.is_file():
            return binary
    return None


def rotel(transport: str = "grpc") -> Peer:
    binary = rotel_binary()
    if binary is None:
        return Peer(
            "rotel",
            "-",
            lambda port, work: [],
            missing="the rotel wheel (a dev extra) is not installed",
            transport=transport,
        )
    version = subprocess.run([str(binary), "--version"], capture_output=True, text=True, check=False).stdout.strip()

    def argv(port: int, work: Path) -> list[str]:
        grpc_port, http_port = (unused_port(), port) if transport == "http" else (port, unused_port())
        return [
            str(binary),
            "start",
            f"--otlp-grpc-endpoint=127.0.0.1:{grpc_port}",
            f"--otlp-http-endpoint=127.0.0.1:{http_port}",
            "--exporter=blackhole",
            f"--pid-file={work / 'rotel.pid'}",
            f"--log-file={work / 'rotel.log'}",
        ]

    return Peer("rotel", version.removeprefix("rotel ").strip() or "?", argv, transport=transport)


def grpcio_floor() -> Peer:
    """grpcio's synchronous Python server answering every Export at once, as the collector's receiver builds
    it: what any Python gRPC receiver costs per request here before it reads a byte of the body."""

    def argv(port: int, work: Path) -> list[str]:
        code = f"import sys; sys.path.insert(0, {str(ROOT)!r}); from benchmarks.grpc_stages import floor; floor({port})"
        return [sys.executable, "-c", code]

    return Peer(FLOOR, grpc.__version__, argv)


def http_floor() -> Peer:
    """Our HTTP/1.1 framing serving an app that takes each body and answers 200 with an empty
    ExportMetricsServiceResponse (``http_receiver_cost.floor``): the least our OTLP/HTTP receiver can cost."""
    from importlib.metadata import version

    def argv(port: int, work: Path) -> list[str]:
        code = (
            f"import sys; sys.path.insert(0, {str(ROOT)!r}); "
            f"from benchmarks.http_receiver_cost import floor; floor({port})"
        )
        return [sys.executable, "-c", code]

    return Peer(HTTP_FLOOR, version("otel-ofu"), argv, transport="http")


OTELCOL_CONFIG = """\
receivers:
  otlp:
    protocols:
      grpc:
        endpoint: 127.0.0.1:{port}
connectors:
  signaltometrics:
    datapoints:
      - name: gpu.ofu.fleet
        description: exponential histogram of gpu.ofu per hw.model
        conditions:
          - metric.name == "gpu.ofu"
        include_resource_attributes:
          - key: hw.model
        exponential_histogram:
          max_size: 160
          value: Double(value_double)
exporters:
  nop:
service:
  telemetry:
    metrics:
      level: none
  pipelines:
    metrics/in:
      receivers: [otlp]
      exporters: [signaltometrics]
    metrics/out:
      receivers: [signaltometrics]
      exporters: [nop]
"""


GATEWAY_CONFIG = """\
receivers:
  otlp:
    protocols:
      grpc:
        endpoint: 127.0.0.1:{port}
processors:
  batch:
    send_batch_size: {batch_points}
    send_batch_max_size: {batch_points}
    timeout: 200ms
exporters:
  otlp_grpc:
    endpoint: 127.0.0.1:{downstream}
    compression: none
    tls:
      insecure: true
service:
  telemetry:
    metrics:
      level: none
  pipelines:
    metrics:
      receivers: [otlp]
      processors: [batch]
      exporters: [otlp_grpc]
"""
GATEWAY_BATCH_GPUS = 512  # GPU reports per request the gateway sends on


def gateway_tier(points: int, payloads: Sequence[bytes], gpus_per_request: int, warmup: int) -> dict[str, float]:
    """CPU per GPU report of an OpenTelemetry Collector gateway (``batch`` processor, ``GATEWAY_BATCH_GPUS``
    GPU reports per request it sends) and of our collector behind it, each process apart, over ``payloads``
    sent to the gateway."""
    with tempfile.TemporaryDirectory(prefix="bench-e2e-tier-") as scratch:
        work = Path(scratch)
        downstream = unused_port()
        config = GATEWAY_CONFIG.format(port="{port}", batch_points=GATEWAY_BATCH_GPUS * points, downstream=downstream)

        def write_config(port: int, work: Path) -> None:
            (work / "gateway.yaml").write_text(config.format(port=port))

        def argv(port: int, work: Path) -> list[str]:
            return [str(OTELCOL), f"--config={work / 'gateway.yaml'}"]

        gateway = Peer("otelcol gateway", "-", argv, config=write_config)
        with running(ours(), work, downstream) as (collector, _), running(gateway, work) as (agent, channel):
            export = channel.unary_unary(EXPORT_METHOD, request_serializer=None, response_deserializer=None)
            for payload in payloads[:warmup]:
                export(payload, timeout=30)
            time.sleep(SETTLE_S)
            before = process_cpu_s(agent.pid), process_cpu_s(collector.pid)
            for payload in payloads[warmup:]:
                export(payload, timeout=30)
            time.sleep(SETTLE_S)
            after = process_cpu_s(agent.pid), process_cpu_s(collector.pid)
    reports = (len(payloads) - warmup) * gpus_per_request
    return {"gateway": (after[0] - before[0]) / reports, "collector": (after[1] - before[1]) / reports}


def otelcol() -> Peer:
    def write_config(port: int, work: Path) -> None:
        (work / "otelcol.yaml").write_text(OTELCOL_CONFIG.format(port=port))

    def argv(port: int, work: Path) -> list[str]:
        return [str(OTELCOL), f"--config={work / 'otelcol.yaml'}"]

    if not OTELCOL.is_file():
        return Peer(
            "otelcol (signaltometrics)",
            "-",
            argv,
            missing=f"{OTELCOL.relative_to(ROOT)} is not built here (make otelcol builds it)",
        )
    out = subprocess.run([str(OTELCOL), "--version"], capture_output=True, text=True, check=False).stdout.strip()
    return Peer("otelcol (signaltometrics)", out.split()[-1] if out else "?", argv, config=write_config)


def _listening(port: int, process: subprocess.Popen[bytes], timeout_s: float) -> bool:
    """Whether something accepts TCP connections on 127.0.0.1:``port`` within ``timeout_s`` (while ``process`` runs)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and process.poll() is None:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1.0):
            return True
        time.sleep(0.05)
    return False


@contextlib.contextmanager
def started(peer: Peer, work: Path, port: int | None = None) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """``peer`` running on ``port`` (one unused when None), once it serves its transport there."""
    port = port or unused_port()
    if peer.config is not None:
        peer.config(port, work)
    log = (work / f"{peer.name.split()[0]}.out").open("wb")
    process = subprocess.Popen(peer.argv(port, work), stdout=log, stderr=subprocess.STDOUT, cwd=work)
    try:
        if peer.transport == "http":
            ready = _listening(port, process, 30.0)
        else:
            with grpc.insecure_channel(f"127.0.0.1:{port}") as probe:
                try:
                    grpc.channel_ready_future(probe).result(timeout=30)
                    ready = True
                except grpc.FutureTimeoutError:
                    ready = False
        if not ready:
            log.flush()
            tail = (work / f"{peer.name.split()[0]}.out").read_text(errors="replace")[-400:]
            raise RuntimeError(f"{peer.name} did not listen on port {port} within 30 s: {tail}")
        yield process, port
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


@contextlib.contextmanager
def running(peer: Peer, work: Path, port: int | None = None) -> Iterator[tuple[subprocess.Popen[bytes], grpc.Channel]]:
    """``peer`` serving OTLP/gRPC, and a channel to it."""
    with started(peer, work, port) as (process, bound), grpc.insecure_channel(f"127.0.0.1:{bound}") as channel:
        yield process, channel


class HttpSenders:
    """``count`` OTLP/HTTP clients on 127.0.0.1:``port``, each one keep-alive ``http.client`` connection of its own,
    sending at once as a node fleet does; every answer must be 200."""

    def __init__(self, port: int, count: int = SENDERS) -> None:
        self.connections = [http.client.HTTPConnection("127.0.0.1", port, timeout=60) for _ in range(count)]

    def send(self, payloads: Sequence[bytes], whole: bool = True) -> None:
        """Every payload once: client ``i`` sends payloads ``i``, ``i + count``, ... in turn; returns when all are
        answered. ``whole``: a point refused stops the run (``RefusedPoints``)."""
        failures: list[BaseException] = []
        rejected = [0] * len(self.connections)

        def post(index: int, mine: Sequence[bytes]) -> None:
            connection = self.connections[index]
            headers = {"Content-Type": "application/x-protobuf"}
            try:
                for payload in mine:
                    connection.request("POST", HTTP_PATH, payload, headers)
                    response = connection.getresponse()
                    body = response.read()
                    if response.status != 200:
                        raise RuntimeError(f"answered {response.status}: {body[:200]!r}")
                    rejected[index] += rejected_points(body)
            except BaseException as error:  # told in the calling thread
                failures.append(error)

        count = len(self.connections)
        threads = [threading.Thread(target=post, args=(i, payloads[i::count])) for i in range(count)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if failures:
            raise RuntimeError(f"an OTLP/HTTP send failed: {failures[0]}") from failures[0]
        refused = sum(rejected)
        if whole and refused:
            raise RefusedPoints(refused)

    def close(self) -> None:
        for connection in self.connections:
            connection.close()


def http_cpu_per_report(port: int, pid: int, payloads: Sequence[bytes], gpus_per_request: int, warmup: int) -> float:
    """CPU seconds the process at ``pid`` spends per GPU report over OTLP/HTTP, over ``payloads`` after ``warmup``
    of them, ``SENDERS`` at once on keep-alive connections (opened in the warm-up)."""
    senders = HttpSenders(port)
    try:
        senders.send(payloads[:warmup], whole=False)  # a warm-up point refused is not timed
        time.sleep(SETTLE_S)
        before = process_cpu_s(pid)
        senders.send(payloads[warmup:])
        time.sleep(SETTLE_S)
        spent = process_cpu_s(pid) - before
    finally:
        senders.close()
    return spent / ((len(payloads) - warmup) * gpus_per_request)


def cpu_per_report(
    channel: grpc.Channel, pid: int, payloads: Sequence[bytes], gpus_per_request: int, warmup: int
) -> float:
    """CPU seconds the process at ``pid`` spends per GPU report, over ``payloads`` after ``warmup`` of them."""
    export = channel.unary_unary(EXPORT_METHOD, request_serializer=None, response_deserializer=None)
    for payload in payloads[:warmup]:
        export(payload, timeout=30)  # a warm-up point refused (late: made a while ago) is not timed
    time.sleep(SETTLE_S)
    rejected = 0
    before = process_cpu_s(pid)
    for payload in payloads[warmup:]:
        rejected += rejected_points(export(payload, timeout=30))
    time.sleep(SETTLE_S)
    spent = process_cpu_s(pid) - before
    if rejected:
        raise RefusedPoints(rejected)
    return spent / ((len(payloads) - warmup) * gpus_per_request)


class RefusedPoints(RuntimeError):
    """A receiver refused points of a healthy fleet's requests: what was timed would be its refusals."""

    def __init__(self, points: int) -> None:
        super().__init__(f"the receiver refused {points} points (partial success): the requests must be taken whole")


def rejected_points(response: bytes) -> int:
    """The points an ExportMetricsServiceResponse says were rejected (an empty one: none)."""
    if not response:
        return 0
    return int(ExportMetricsServiceResponse.FromString(response).partial_success.rejected_data_points)


def warmup_requests(gpus_per_request: int, fleet: int) -> int:
    """Requests sent before the measured ones: one interval of the whole fleet, and at least 20."""
    return max(20, -(-fleet // gpus_per_request))


def measure(
    peers: Sequence[Peer],
    gpus_per_request: Sequence[int],
    points: Sequence[int],
    reports: int,
    fleet: int,
    first_sight: tuple[int, int] | None = None,
) -> list[dict[str, Any]]:
    """One row per (peer, points per GPU, GPUs per request): us of CPU per GPU report and per point, in the
    steady state (after one interval of the fleet); plus, for ``first_sight`` = (points, GPUs per request), one
    row of ours with every Resource new."""
    rows: list[dict[str, Any]] = []
    cases = [(p, g, False) for p in points for g in gpus_per_request]
    if first_sight is not None:
        cases.append((*first_sight, True))

    def workload(p: int, g: int, new: bool) -> tuple[int, list[bytes]]:
        warmup = warmup_requests(g, fleet) if not new else max(20, 200 // g)
        measured = max(100, reports // g)
        # Every Resource new: a fleet larger than the run, so no GPU comes back.
        return warmup, producer_requests(g, p, warmup + measured, fleet if not new else 2**30)

    for peer in peers:
        if peer.missing is not None:
            continue
        with tempfile.TemporaryDirectory(prefix="bench-e2e-") as scratch:
            for p, g, new in cases:
                if new and peer.name != OURS:
                    continue  # the peers keep nothing per Resource: their first sight is their steady state
                # A fresh process per case: each starts with no state, and one case's backlog never
                # lands in the next one's CPU.
                # Made just before they are sent: points stamped minutes earlier would be late for ours (its
                # windows close by the clock), and it would time the refusals. Until 2026-12-04 they were made once
                # for every peer and case, and ours refused every point of its later cases.
                warmup, payloads = workload(p, g, new)
                with running(peer, Path(scratch)) as (process, channel):
                    per_report = cpu_per_report(channel, process.pid, payloads, g, warmup=warmup)
                rows.append(
                    {
                        "peer": f"{peer.name} {FIRST_SIGHT}" if new else peer.name,
                        "points_per_gpu": p,
                        "gpus_per_request": g,
                        "reports": (len(payloads) - warmup) * g,
                        "us_per_report": per_report * 1e6,
                        "us_per_point": per_report * 1e6 / p,
                        "gpus_per_core": INTERVAL_S / per_report if per_report > 0 else None,
                    }
                )
    return rows


def measure_tier(reports: int, fleet: int, points: int = 8, gpus_per_request: int = NODE_GPUS) -> list[dict[str, Any]]:
    """The gateway tier's rows: the gateway, our collector behind it, and both (producers sending 8 GPUs per
    request to the gateway)."""
    warmup = warmup_requests(gpus_per_request, fleet)
    measured = max(100, reports // gpus_per_request)
    payloads = producer_requests(gpus_per_request, points, warmup + measured, fleet)
    cost = gateway_tier(points, payloads, gpus_per_request, warmup)
    rows = []
    for name, per_report in (
        (f"{TIER}: the gateway", cost["gateway"]),
        (f"{TIER}: our collector", cost["collector"]),
        (TIER, cost["gateway"] + cost["collector"]),
    ):
        rows.append(
            {
                "peer": name,
                "points_per_gpu": points,
                "gpus_per_request": gpus_per_request,
                "reports": measured * gpus_per_request,
                "us_per_report": per_report * 1e6,
                "us_per_point": per_report * 1e6 / points,
                "gpus_per_core": INTERVAL_S / per_report if per_report > 0 else None,
            }
        )
    return rows


def transport_peers(transport: str) -> list[Peer]:
    """Ours, Rotel and the transport's floor, serving ``transport``."""
    return [ours(transport), rotel(transport), http_floor() if transport == "http" else grpcio_floor()]


def spread(values: Sequence[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def measure_transports(
    reports: int,
    fleet: int,
    repeats: int = 3,
    cases: Sequence[tuple[str, int]] = TRANSPORT_CASES,
    points: int = 8,
    min_requests: int = 100,
) -> list[dict[str, Any]]:
    """One row per (transport, GPUs per request, peer): us of CPU per GPU report in each of ``repeats`` rounds (each
    peer a fresh process, the peers in turn), their median and spread, and the ratio to Rotel's within each round."""
    workloads: dict[int, tuple[int, list[bytes]]] = {}
    runs: dict[tuple[str, int, str], list[float]] = {}
    peers = {transport: transport_peers(transport) for transport, _ in cases}
    with tempfile.TemporaryDirectory(prefix="bench-e2e-transports-") as scratch:
        for _ in range(repeats):  # in turn, so drift on a shared machine lands on every peer alike
            for transport, gpus in cases:
                # Made just before ours (first of the peers) is sent them, as in ``measure``: ours refuses late points.
                warmup = warmup_requests(gpus, fleet)
                measured = max(min_requests, reports // gpus)
                payloads = producer_requests(gpus, points, warmup + measured, fleet)
                workloads[gpus] = (warmup, payloads)
                for peer in peers[transport]:
                    if peer.missing is not None:
                        continue
                    with started(peer, Path(scratch)) as (process, port):
                        if transport == "http":
                            cost = http_cpu_per_report(port, process.pid, payloads, gpus, warmup)
                        else:
                            with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
                                cost = cpu_per_report(channel, process.pid, payloads, gpus, warmup)
                    runs.setdefault((transport, gpus, peer.name), []).append(cost * 1e6)
    rows = []
    for (transport, gpus, name), values in runs.items():
        warmup, payloads = workloads[gpus]
        ratios = ratios_within_repeats(values, runs.get((transport, gpus, ROTEL)))
        rows.append(
            {
                "peer": name,
                "transport": transport,
                "points_per_gpu": points,
                "gpus_per_request": gpus,
                "reports": (len(payloads) - warmup) * gpus,
                "runs_us_per_report": values,
                "us_per_report": spread(values),
                "ratio_to_rotel": spread(ratios) if ratios else None,
                "senders": SENDERS if transport == "http" else 1,
            }
        )
    return rows


def ratios_within_repeats(values: Sequence[float], rotel_runs: Sequence[float] | None) -> list[float] | None:
    """Each repeat's cost over Rotel's in the same repeat; a repeat where Rotel's CPU stayed under one /proc tick (0:
    too little work to see, as in a small run) has no ratio, and with none left there is none (never a division by
    zero)."""
    if not rotel_runs:
        return None
    ratios = [value / rotel for value, rotel in zip(values, rotel_runs, strict=True) if rotel > 0.0]
    return ratios or None


def transport_row(rows: Sequence[dict[str, Any]], peer: str, transport: str, gpus: int) -> dict[str, Any] | None:
    return next(
        (r for r in rows if r["peer"] == peer and r["transport"] == transport and r["gpus_per_request"] == gpus), None
    )


def measure_all(quick: bool = False) -> dict[str, Any]:
    peers = [ours(), rotel(), otelcol(), grpcio_floor()]
    sweep = (1, 8, 64) if quick else (1, 8, 64, 512)
    reports, fleet = (4_000, 1_024) if quick else (8_000, 4_096)
    rows = measure(peers, sweep, (1, 8), reports=reports, fleet=fleet, first_sight=(8, 8))
    if OTELCOL.is_file():
        rows.extend(measure_tier(reports, fleet))
    # /proc counts 10 ms ticks: enough 8-GPU requests over OTLP/HTTP for Rotel's few us per report to span ~30.
    transports = measure_transports(24_000 if quick else 64_000, fleet, repeats=3, min_requests=50 if quick else 100)
    return {
        "peers": [{"name": p.name, "version": p.version, "not_run": p.missing} for p in [*peers, http_floor()]],
        "rows": rows,
        "transports": transports,
        "interval_s": INTERVAL_S,
        "tick_s": TICK_S,
        "settle_s": SETTLE_S,
        "cpu_count": os.cpu_count(),
        "otelcol_path": str(OTELCOL.relative_to(ROOT)),
        "targets": {
            "us_per_report": TARGET_US_PER_REPORT,
            "ratio_to_rotel": TARGET_RATIO_TO_ROTEL,
            "throughput_to_otelcol": TARGET_THROUGHPUT_TO_OTELCOL,
            "http_us_per_report": TARGET_HTTP_US_PER_REPORT,
            "gateway_ratio_to_rotel": TARGET_GATEWAY_RATIO_TO_ROTEL,
        },
    }


def row(rows: Sequence[dict[str, Any]], peer: str, points: int, gpus: int) -> dict[str, Any] | None:
    return next(
        (r for r in rows if r["peer"] == peer and r["points_per_gpu"] == points and r["gpus_per_request"] == gpus),
        None,
    )


def run(ctx: RunContext) -> BenchResult:
    from benchmarks import grpc_stages

    data = measure_all(quick=ctx.quick)
    data["stages"] = grpc_stages.run_all(
        requests=500 if ctx.quick else 1500, repeats=3, gateway_requests=40 if ctx.quick else 100
    )
    rows = data["rows"]
    targets = data["targets"]
    table_rows = [
        (
            r["peer"],
            str(r["points_per_gpu"]),
            str(r["gpus_per_request"]),
            f"{r['reports']:,}",
            f"{r['us_per_report']:.1f}",
            f"{r['us_per_point']:.2f}",
            f"{r['gpus_per_core']:,.0f}" if r["gpus_per_core"] else "-",
        )
        for r in sorted(rows, key=lambda r: (r["points_per_gpu"], r["gpus_per_request"], r["peer"]))
    ]
    not_run = [f"{p['name']}: not run, {p['not_run']}" for p in data["peers"] if p["not_run"]]
    verdicts: list[Verdict] = []
    for points in (8, 1):
        mine = row(rows, OURS, points, NODE_GPUS)
        rust = row(rows, ROTEL, points, NODE_GPUS)
        col = row(rows, OTELCOL_NAME, points, NODE_GPUS)
        case = f"{points} point{'s' if points > 1 else ''} per GPU, {NODE_GPUS} GPUs per request"
        if mine is None:
            continue
        if points == 8:
            verdicts.append(
                Verdict(
                    f"CPU per GPU report, {case}",
                    mine["us_per_report"],
                    targets["us_per_report"],
                    "us",
                    kind="absolute",
                )
            )
        if rust is not None and points == 8:
            verdicts.append(
                Verdict(
                    f"CPU per point / Rotel's, {case}",
                    mine["us_per_point"] / rust["us_per_point"],
                    targets["ratio_to_rotel"],
                    "x",
                    kind="ratio",
                )
            )
        if col is not None and points == 8:
            verdicts.append(
                Verdict(
                    f"throughput / the OpenTelemetry Collector's (signaltometrics), {case}",
                    col["us_per_report"] / mine["us_per_report"],
                    targets["throughput_to_otelcol"],
                    "x",
                    higher_is_better=True,
                    kind="ratio",
                )
            )
    mine, rust, grpc_floor, tier = (row(rows, name, 8, NODE_GPUS) for name in (OURS, ROTEL, FLOOR, TIER))
    if mine is not None and grpc_floor is not None:
        verdicts.append(
            Verdict(
                f"a floor is never beaten: ours / the grpcio no-op server (>= 1), 8 points per GPU, {NODE_GPUS} GPUs "
                "per request",
                mine["us_per_report"] / grpc_floor["us_per_report"],
                1.0,
                "x",
                higher_is_better=True,
                kind="ratio",
            )
        )
    if tier is not None and rust is not None:
        verdicts.append(
            Verdict(
                f"CPU per point / Rotel's through a batching gateway (gateway + ours), 8 points per GPU, {NODE_GPUS} "
                "GPUs per request",
                tier["us_per_point"] / rust["us_per_point"],
                targets["ratio_to_rotel"],
                "x",
                kind="ratio",
            )
        )
    verdicts += transport_verdicts(data["transports"])
    data["peer_versions"] = {
        p["name"]: p["version"] for p in data["peers"] if not p["not_run"] and p["name"] not in (OURS, HTTP_FLOOR)
    }
    return BenchResult(
        "collector_e2e",
        "Collector end to end: process CPU per GPU report over real gRPC, beside Rotel and otelcol",
        doc_summary(__doc__),
        tables=(
            Table(
                "CPU of the collector process (utime + stime from /proc) per GPU report",
                (
                    "collector",
                    "points per GPU",
                    "GPUs per request",
                    "GPU reports",
                    "us CPU per report",
                    "us CPU per point",
                    "GPUs per core at 10 s",
                ),
                table_rows,
                note="Targets (8 points per GPU, 8 GPUs per request: one producer's host): at most 20 us of CPU per "
                "GPU report, i.e. at least 500k GPUs per core at a 10 s interval (absolute, reported); CPU per point "
                "at most 2x Rotel's (ratio); at least 0.5x the OpenTelemetry Collector's throughput (ratio). "
                f"The grpcio no-op server is the floor of any Python gRPC receiver (ours never below it). The gateway "
                f"rows: producers send {NODE_GPUS} GPUs per request to an OpenTelemetry Collector (otlp receiver, "
                f"batch processor of {GATEWAY_BATCH_GPUS} GPU reports, otlp exporter without compression) in front "
                "of ours; the CPU of each process apart, and of both, per GPU report sent by the producers. "
                + " ".join(not_run),
            ),
            transport_table(data["transports"]),
            Table(
                "Where one request's CPU goes: us of CPU per GPU report, 8 points per GPU, median (min-max) of "
                f"{len(next(iter(data['stages']['runs'].values())))} repeats",
                ("stage", *grpc_stages.table_columns(data["stages"])),
                grpc_stages.table_rows(data["stages"]),
                note=doc_summary(grpc_stages.__doc__)
                + " Multiply by the GPUs per request for the CPU per request. The server's row is the process's CPU "
                "less the stages' thread CPU: what the server costs around our handler; beside it, the floors' whole "
                "process. The in-process split (of which) is measured on the same requests in the benchmark's own "
                "process, so its rest also holds the difference between a decoder alone in a loop and one between "
                "the receiver's socket calls (caches, the interpreter's own state).",
            ),
        ),
        verdicts=verdicts,
        data=data,
        plots=(_plot(ctx, rows),),
    )


def transport_verdicts(rows: Sequence[dict[str, Any]]) -> list[Verdict]:
    """The targets by transport: a node's producer over OTLP/HTTP, a gateway's batch over gRPC, and the floors."""
    verdicts = []
    node = f"8 points per GPU, {NODE_GPUS} GPUs per request"
    mine = transport_row(rows, OURS, "http", NODE_GPUS)
    if mine is not None:
        verdicts.append(
            Verdict(
                f"CPU per GPU report over OTLP/HTTP, {node} (median of the repeats)",
                mine["us_per_report"]["median"],
                TARGET_HTTP_US_PER_REPORT,
                "us",
                kind="absolute",
            )
        )
        if mine["ratio_to_rotel"] is not None:
            verdicts.append(
                Verdict(
                    f"CPU per point / Rotel's over OTLP/HTTP, {node} (median of the repeats)",
                    mine["ratio_to_rotel"]["median"],
                    TARGET_RATIO_TO_ROTEL,
                    "x",
                    kind="ratio",
                )
            )
    gateway = transport_row(rows, OURS, "grpc", GATEWAY_GPUS)
    if gateway is not None and gateway["ratio_to_rotel"] is not None:
        verdicts.append(
            Verdict(
                f"CPU per point / Rotel's over gRPC, 8 points per GPU, {GATEWAY_GPUS} GPUs per request (median of "
                "the repeats)",
                gateway["ratio_to_rotel"]["median"],
                TARGET_GATEWAY_RATIO_TO_ROTEL,
                "x",
                kind="ratio",
            )
        )
    for transport, gpus in TRANSPORT_CASES:
        mine = transport_row(rows, OURS, transport, gpus)
        floor_row = transport_row(rows, HTTP_FLOOR if transport == "http" else FLOOR, transport, gpus)
        if mine is None or floor_row is None:
            continue
        what = "our HTTP framing with a no-op app" if transport == "http" else "the grpcio no-op server"
        verdicts.append(
            Verdict(
                f"a floor is never beaten: ours / {what} (>= 1), over {'OTLP/HTTP' if transport == 'http' else 'gRPC'}"
                f", 8 points per GPU, {gpus} GPUs per request (median of the repeats)",
                mine["us_per_report"]["median"] / floor_row["us_per_report"]["median"],
                1.0,
                "x",
                higher_is_better=True,
                kind="ratio",
            )
        )
    return verdicts


def _spread_text(values: dict[str, float] | None, digits: int = 1) -> str:
    if values is None:
        return "-"
    return f"{values['median']:.{digits}f} ({values['min']:.{digits}f}-{values['max']:.{digits}f})"


def transport_table(rows: Sequence[dict[str, Any]]) -> Table:
    order = {name: i for i, name in enumerate((OURS, ROTEL, HTTP_FLOOR, FLOOR))}
    ordered = sorted(
        rows, key=lambda r: (r["transport"] != "http", r["gpus_per_request"], order.get(r["peer"], len(order)))
    )
    repeats = max((len(r["runs_us_per_report"]) for r in rows), default=0)
    return Table(
        f"By transport: us of CPU per GPU report (8 points per GPU), median (min-max) of {repeats} repeats",
        (
            "transport",
            "GPUs per request",
            "collector",
            "GPU reports per repeat",
            "us CPU per report",
            "ratio to Rotel (same repeat)",
            "GPUs per core at 10 s (median)",
        ),
        [
            (
                "OTLP/HTTP" if r["transport"] == "http" else "OTLP/gRPC",
                str(r["gpus_per_request"]),
                r["peer"],
                f"{r['reports']:,}",
                _spread_text(r["us_per_report"]),
                _spread_text(r["ratio_to_rotel"], 2),
                f"{INTERVAL_S / (r['us_per_report']['median'] / 1e6):,.0f}" if r["us_per_report"]["median"] else "-",
            )
            for r in ordered
        ],
        note=f"OTLP/HTTP: {SENDERS} client threads at once, each on one keep-alive http.client connection, "
        "POSTing application/x-protobuf to /v1/metrics (Rotel: its --otlp-http-endpoint; ours: --http-listen); "
        "OTLP/gRPC: one request in flight. The OTLP/HTTP floor is our HTTP/1.1 framing with an app that takes the "
        "body and answers 200 with an empty ExportMetricsServiceResponse (no parse, no gate); the gRPC floor is the "
        f"grpcio no-op server. Targets: at {NODE_GPUS} GPUs per request over OTLP/HTTP at most "
        f"{TARGET_HTTP_US_PER_REPORT:g} us per report (absolute, reported) and at most {TARGET_RATIO_TO_ROTEL:g}x "
        f"Rotel's CPU per point (ratio); at {GATEWAY_GPUS} GPUs per request over gRPC at most "
        f"{TARGET_GATEWAY_RATIO_TO_ROTEL:g}x Rotel's (ratio).",
    )


def _plot(ctx: RunContext, rows: Sequence[dict[str, Any]]) -> str:
    figure, axes = new_figure(ncols=2, width=10.0)
    for ax, points in zip(axes, (1, 8), strict=True):
        for peer in sorted({r["peer"] for r in rows}):
            mine = sorted(
                (r for r in rows if r["peer"] == peer and r["points_per_gpu"] == points),
                key=lambda r: r["gpus_per_request"],
            )
            if not mine:
                continue  # ours with every Resource new is measured at 8 points per GPU only
            ax.plot([r["gpus_per_request"] for r in mine], [r["us_per_report"] for r in mine], marker="o", label=peer)
        ax.axhline(TARGET_US_PER_REPORT, color="grey", linestyle="--", linewidth=0.8, label="target 20 us")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("GPUs per request")
        ax.set_ylabel("us of collector CPU per GPU report")
        ax.set_title(f"{points} point{'s' if points > 1 else ''} per GPU report")
        ax.legend(fontsize=7)
    return save_figure(figure, ctx, "collector_e2e")


def main() -> None:
    import json

    print(json.dumps(measure_all(quick="--quick" in sys.argv), indent=2))


if __name__ == "__main__":
    main()
