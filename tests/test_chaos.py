"""Chaos: the producer and the collector, as real processes, under a seeded random mix of faults for a bounded
time, and every healthy job's windows reach the downstream exactly once.

The fleet: ``otel-ofu run`` on the simulated fleet (5 hosts x 8 GPUs, eleven jobs) over OTLP/gRPC, looking its
pods up through a fake kubelet and pods server (the simulated GPUs name their jobs themselves, a hint that
comes first in the chain: the pods server's faults meet the lookup thread while sampling goes on); a sender
over OTLP/HTTP for one more job; and a sender whose every request holds a healthy GPU beside poisoned ones
(a finite 1e308 J energy, 1e9 W, NaN, points from the future).
The faults, drawn from the seed: the pods server drips, stalls or is slow; the collector is killed (its
write-ahead then gets a junk record and a record cut in half, and at times random bytes replace its spool
while that holds nothing undelivered) or stopped cleanly, and started again; the
disk fills up under it (RLIMIT_FSIZE, as ``ulimit -f``) and frees again; slow HTTP clients trickle bodies
and headers; slow gRPC streams hold their messages back; gzip bombs over both receivers and a request of one
GPU's 200,000 identical points; idle connections to /metrics and the report feed; and a second producer
scraping a dcgm-exporter page that at times drips (it must still stop at SIGTERM). Nothing here asserts a time:
only what was exported, how often, and what was counted.

``OTEL_OFU_CHAOS_SEED`` and ``OTEL_OFU_CHAOS_SECONDS`` choose another mix or a longer run; with
``OTEL_OFU_CHAOS_REPORT`` set, the run's measurements (what each fault cost) are written there as JSON, and
the collector's log beside it (``.log``).
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import json
import math
import os
import random
import re
import resource
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import zlib
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import grpc
import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.metrics.v1.metrics_pb2 import AGGREGATION_TEMPORALITY_CUMULATIVE

from otel_ofu import names
from otel_ofu.attribution.podresources_pb2 import ListPodResourcesResponse
from otel_ofu.testing.fake_kubernetes import FakeApiServer, Fault, pod, serve
from otel_ofu.testing.otlp_requests import gpu_request
from otel_ofu.testing.otlp_sink import OtlpSink, unused_port
from otel_ofu_collector.receivers.otlp_grpc import EXPORT_METHOD
from tests.collector_helpers import ROOT, CollectorProcess, self_metric
from tests.k8s_helpers import FakeKubelet, allocation
from tests.raw_http import RawHttpServer

SEED = int(os.environ.get("OTEL_OFU_CHAOS_SEED", "5"))
SECONDS = float(os.environ.get("OTEL_OFU_CHAOS_SECONDS", "36"))
WINDOW_S = 2.0
LATENESS_S = 5.0  # room for a restart (about 1-2 s here) and the resend of what queued meanwhile
INTERVAL_S = 0.5
S = 1_000_000_000
HEALTHY_SENT = ("beside-poison", "http-job")  # the senders' healthy jobs
ATTACKER = "127.0.0.2"  # idle connections come from another loopback address than the test's scrapes
POISONED = "poisoned"


def _job_of(rm: Any, point: Any) -> str:
    """A point's job.id: on the point (the collector's outputs) or else on its Resource."""
    for attributes in (point.attributes, rm.resource.attributes):
        for kv in attributes:
            if kv.key == names.JOB_ID:
                return str(kv.value.string_value)
    return ""


def _windows_of(sink: OtlpSink) -> dict[str, list[int]]:
    """Each job's exported job.ofu windows by their end in ns, as often as they came."""
    found: dict[str, list[int]] = {}
    for rm, _sm, metric in sink.metrics(names.JOB_OFU.name):
        for point in metric.gauge.data_points:
            found.setdefault(_job_of(rm, point), []).append(point.time_unix_nano)
    return found


def _job_sums(sink: OtlpSink, metric_name: str, job: str) -> list[float]:
    return [
        point.as_double
        for rm, _sm, metric in sink.metrics(metric_name)
        for point in metric.sum.data_points
        if _job_of(rm, point) == job
    ]


def _costs_in(log: str) -> dict[str, Any]:
    """What the collector's own lines say the faults cost: points rejected by reason, requests replayed and
    records skipped after kills, requests not written ahead and windows left out of the records file while
    the disk was full, and how many lines of each level it took to say so."""
    rejected: Counter[str] = Counter()
    for found in re.finditer(r"rejected \d+ data point\(s\)[^:]*: (.*)", log):
        for item in re.split(r"; (?=\d+ )", found.group(1)):  # a reason's own words may hold "; "
            count, _, reason = item.partition(" ")
            rejected[reason] += int(count)
    numbers = {
        "replayed_requests": r"replayed (\d+) request\(s\)",
        "damaged_records_skipped": r"(\d+) damaged record\(s\) skipped",
        "requests_not_written_ahead": r"(\d+) accepted request\(s\) were not written ahead",
        "windows_left_out_of_records": r"writing again; (\d+) window\(s\) left out",
        "spool_requests_held_in_memory": r"(\d+) request\(s\) held in memory meanwhile",
    }
    levels = Counter(m.group(1) for m in re.finditer(r"^\S+ \S+ (DEBUG|INFO|WARNING|ERROR|CRITICAL) ", log, re.M))
    return {
        "rejected_points": dict(rejected),
        **{key: sum(int(m.group(1)) for m in re.finditer(pattern, log)) for key, pattern in numbers.items()},
        "lines": dict(levels),
    }


# --- the senders ------------------------------------------------------------------------------------


def _poisoned_request(end_ns: int) -> ExportMetricsServiceRequest:
    """One healthy GPU of job beside-poison, and four poisoned GPUs of job poisoned, in one request."""
    start_ns = end_ns - round(INTERVAL_S * S)
    request = gpu_request(
        {
            "GPU-healthy-0": ("beside-poison", 0.41),
            "GPU-poison-energy": (POISONED, 0.3),
            "GPU-poison-power": (POISONED, 0.3),
            "GPU-poison-nan": (POISONED, 0.3),
            "GPU-poison-future": (POISONED, 0.3),
        },
        host="node-poison",
        time_ns=end_ns,
        interval_ns=end_ns - start_ns,
    )
    for rm in request.resource_metrics:
        hw_id = next(kv.value.string_value for kv in rm.resource.attributes if kv.key == names.HW_ID)
        metrics = rm.scope_metrics[0].metrics
        if hw_id == "GPU-poison-energy":  # a finite 1e308 J: two of these once overflowed a window's sums
            energy = metrics.add(name=names.GPU_ENERGY.name, unit=names.GPU_ENERGY.unit)
            energy.sum.aggregation_temporality = AGGREGATION_TEMPORALITY_CUMULATIVE
            energy.sum.is_monotonic = True
            energy.sum.data_points.add(as_double=1e308, start_time_unix_nano=start_ns - S, time_unix_nano=end_ns)
        elif hw_id == "GPU-poison-power":
            power = metrics.add(name=names.GPU_POWER.name, unit=names.GPU_POWER.unit)
            power.gauge.data_points.add(as_double=1e9, time_unix_nano=end_ns)
        elif hw_id == "GPU-poison-nan":
            metrics[0].gauge.data_points[0].as_double = math.nan
        elif hw_id == "GPU-poison-future":
            point = metrics[0].gauge.data_points[0]
            point.time_unix_nano = end_ns + 3600 * S
            point.start_time_unix_nano = end_ns + 3600 * S - (end_ns - start_ns)
    return request


@attrs.define
class Sender:
    """Sends one request per interval for its GPUs and, like an OTLP exporter, retries a request that was
    not answered until it is too late for its window (then it is counted as dropped)."""

    name: str
    send: Callable[[bytes], None]
    build: Callable[[int], ExportMetricsServiceRequest]
    stop: threading.Event = attrs.field(factory=threading.Event)
    sent: int = 0
    retried: int = 0
    dropped: int = 0
    thread: threading.Thread | None = None

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        interval_ns = round(INTERVAL_S * S)
        next_end = (time.time_ns() // interval_ns + 1) * interval_ns
        while not self.stop.is_set():
            wait_s = (next_end - time.time_ns()) / S
            if wait_s > 0 and self.stop.wait(wait_s):
                return
            payload = self.build(next_end).SerializeToString()
            give_up = next_end + round((WINDOW_S + LATENESS_S - 1.0) * S)
            while True:
                try:
                    self.send(payload)
                    self.sent += 1
                    break
                except (grpc.RpcError, OSError):
                    if time.time_ns() > give_up or self.stop.is_set():
                        self.dropped += 1
                        break
                    self.retried += 1
                    time.sleep(0.2)
            next_end += interval_ns
            while next_end < time.time_ns() - interval_ns:  # behind after a long retry: skip, as a timer would
                next_end += interval_ns


def _http_request(end_ns: int) -> ExportMetricsServiceRequest:
    gpus = {"GPU-http-0": 0.55, "GPU-http-1": 0.57}
    return gpu_request(gpus, host="node-http", job="http-job", time_ns=end_ns, interval_ns=round(INTERVAL_S * S))


def _grpc_send(port: int) -> Callable[[bytes], None]:
    def send(payload: bytes) -> None:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = channel.unary_unary(EXPORT_METHOD, None, None)
            ExportMetricsServiceResponse.FromString(call(payload, timeout=3))

    return send


def _http_send(port: int) -> Callable[[bytes], None]:
    def send(payload: bytes) -> None:
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/metrics",
            data=payload,
            headers={"Content-Type": "application/x-protobuf"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=3) as response:
            response.read()

    return send


# --- the faults -------------------------------------------------------------------------------------


@attrs.define
class SlowClients:
    """Connections that declare large bodies and trickle them, or trickle their headers: held open until closed."""

    port: int
    sockets: list[socket.socket] = attrs.field(factory=list)
    stop: threading.Event = attrs.field(factory=threading.Event)
    threads: list[threading.Thread] = attrs.field(factory=list)

    def open(self, bodies: int, headers: int) -> None:
        for kind in ["body"] * bodies + ["headers"] * headers:
            thread = threading.Thread(target=self._trickle, args=(kind,), daemon=True)
            thread.start()
            self.threads.append(thread)

    def _trickle(self, kind: str) -> None:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=5) as connection:
            self.sockets.append(connection)
            head = (
                "POST /v1/metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/x-protobuf\r\n"
                f"Content-Length: {64 * 1024 * 1024}\r\n\r\n"
            ).encode()
            if kind == "body":
                connection.sendall(head)
                trickle = b"\x0a"
            else:
                trickle, head = head[:1], head[1:]
            while not self.stop.wait(1.0):
                connection.sendall(trickle)  # raises once the collector closed the connection
                if kind == "headers" and head:
                    trickle, head = head[:1], head[1:]

    def close(self) -> None:
        self.stop.set()
        for connection in self.sockets:
            with contextlib.suppress(OSError):
                connection.close()
        for thread in self.threads:
            thread.join(timeout=5)


@attrs.define
class SlowStreams:
    """gRPC calls that open their stream and hold their message back (a client-streaming call on Export whose message
    never comes) until closed: what a stream sending its message a byte at a time is to the server."""

    port: int
    count: int = 80  # more than the thread pool the collector once gave its calls (68)
    channel: grpc.Channel | None = None
    codes: Counter[str] = attrs.field(factory=Counter)
    threads: list[threading.Thread] = attrs.field(factory=list)
    stop: threading.Event = attrs.field(factory=threading.Event)

    def open(self) -> None:
        self.close()
        self.stop = threading.Event()
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.port}")
        call = self.channel.stream_unary(EXPORT_METHOD, None, None)
        self.threads = [threading.Thread(target=self._hold, args=(call,), daemon=True) for _ in range(self.count)]
        for thread in self.threads:
            thread.start()

    def _hold(self, call: Any) -> None:
        def never() -> Iterator[bytes]:
            self.stop.wait(60)
            yield from ()

        try:
            call(never(), timeout=60)
        except grpc.RpcError as error:
            self.codes[error.code().name] += 1

    def close(self) -> None:
        self.stop.set()
        if self.channel is not None:
            self.channel.close()
            self.channel = None
        for thread in self.threads:
            thread.join(10)


@functools.cache
def _gzip_bomb() -> bytes:
    """About 60 KB of gzip that inflates to 60 MiB of zeros (built once: the test's own CPU is not the attack)."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    return b"".join(compressor.compress(b"\0" * 2**20) for _ in range(60)) + compressor.flush()


@functools.cache
def _duplicates() -> bytes:
    """One GPU's 200,000 identical points of one interval, gzipped (about 15 KB); stamped once, so late after a while:
    refused as implausible all the same, before any window is asked."""
    request = gpu_request({"GPU-bomb": ("bomb", 0.5)}, host="node-bomb", time_ns=time.time_ns())
    points = request.resource_metrics[0].scope_metrics[0].metrics[0].gauge.data_points
    points.extend([points[0]] * 199_999)
    return gzip.compress(request.SerializeToString())


def _bombs(collector: Collector) -> Counter[str]:
    """Eight gzip bombs over each receiver at once (over gRPC the gzip bytes as the message: the collector inflates
    what it is sent), and one request of 200,000 identical points of one GPU: what each was answered (a bomb is never
    taken; the duplicates are refused by reason)."""
    answers: Counter[str] = Counter()
    bomb = _gzip_bomb()

    def over_http() -> None:
        request = urllib.request.Request(
            f"http://127.0.0.1:{collector.http_port}/v1/metrics",
            data=bomb,
            headers={"Content-Type": "application/x-protobuf", "Content-Encoding": "gzip"},
            method="POST",
        )
        try:
            urllib.request.urlopen(request, timeout=60).close()
            answers["http 200"] += 1
        except urllib.error.HTTPError as error:
            answers[f"http {error.code}"] += 1
            error.close()
        except OSError:
            answers["http gone"] += 1

    def over_grpc() -> None:
        with grpc.insecure_channel(f"127.0.0.1:{collector.grpc_port}") as channel:
            try:
                channel.unary_unary(EXPORT_METHOD, None, None)(bomb, timeout=60)
                answers["grpc OK"] += 1
            except grpc.RpcError as error:
                answers[f"grpc {error.code().name}"] += 1

    threads = [threading.Thread(target=send, daemon=True) for send in [over_http] * 8 + [over_grpc] * 8]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(90)
    # Then, the budget free again, the duplicates (sent amid the bombs they may be told to retry, as they should).
    try:
        with grpc.insecure_channel(f"127.0.0.1:{collector.grpc_port}") as channel:
            reply = ExportMetricsServiceResponse.FromString(
                channel.unary_unary(EXPORT_METHOD, None, None)(_duplicates(), timeout=60)
            )
        # The first 4 of the interval are the windows' (late by the second time); the rest implausible, unread.
        answers[
            "duplicates refused" if reply.partial_success.rejected_data_points >= 199_996 else "duplicates taken"
        ] += 1
    except grpc.RpcError as error:
        answers[f"duplicates {error.code().name}"] += 1
    return answers


@attrs.define
class IdleConnections:
    """Connections to /metrics and the report feed that never send a request (from another loopback address than
    the scraper's): the collector must close them and keep its threads and descriptors."""

    ports: tuple[int, ...]
    sockets: list[socket.socket] = attrs.field(factory=list)

    def open(self, count: int) -> None:
        for index in range(count):
            with contextlib.suppress(OSError):
                port = self.ports[index % len(self.ports)]
                self.sockets.append(
                    socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(ATTACKER, 0))
                )

    def close(self) -> None:
        for connection in self.sockets:
            connection.close()
        self.sockets.clear()


@attrs.define
class Exporter(RawHttpServer):
    """A dcgm-exporter on loopback serving one GPU's page (job ``exporter-job``), or, while ``dripping``, a byte of
    it every 0.3 s for as long as the reader waits."""

    dripping: bool = False
    served: int = 0
    dripped: int = 0

    def serve(self, connection: socket.socket) -> None:
        labels = (
            'gpu="0",UUID="GPU-exporter-0",modelName="NVIDIA H100 80GB HBM3",Hostname="node-exporter",'
            'hpc_job="exporter-job"'
        )
        page = (f"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{{labels}}} 0.5\nDCGM_FI_DEV_SM_CLOCK{{{labels}}} 1830\n").encode()
        with contextlib.suppress(OSError), connection:
            connection.settimeout(5)
            connection.recv(65536)
            if not self.dripping:
                self.served += 1
                head = f"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {len(page)}\r\n\r\n"
                connection.sendall(head.encode() + page)
                return
            self.dripped += 1
            connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n")
            while not self.stop.wait(0.3):
                connection.sendall(b"#")


def _damage_write_ahead(path: Path, rng: random.Random) -> dict[str, int]:
    """What a kill can leave: a junk record, and one real record cut in half (both fail their CRC)."""
    if not path.exists():
        return {"junk": 0, "halved": 0}
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        db.execute(
            "INSERT INTO accepted (received_ns, payload, crc) VALUES (?, ?, ?)",
            (time.time_ns(), rng.randbytes(rng.randrange(1, 400)), rng.randrange(2**32)),
        )
        ids = [row[0] for row in db.execute("SELECT id FROM accepted")]
        halved = 0
        if len(ids) > 2:
            db.execute("UPDATE accepted SET payload = substr(payload, 1, length(payload) / 2) WHERE id = ?", (ids[0],))
            halved = 1
    return {"junk": 1, "halved": halved}


def _replace_empty_spool(path: Path, rng: random.Random) -> int:
    """Random bytes in place of the spool and no WAL, when it holds no undelivered output (1), else nothing
    (0): what a damaged spool costs is its undelivered outputs, which this test could not tell from a loss."""
    if not path.exists():
        return 0
    with contextlib.closing(sqlite3.connect(path)) as db:
        if db.execute("SELECT COUNT(*) FROM spool").fetchone()[0]:
            return 0
    for leftover in (Path(f"{path}-wal"), Path(f"{path}-shm")):
        leftover.unlink(missing_ok=True)
    path.write_bytes(rng.randbytes(rng.randrange(100, 20_000)))
    return 1


@attrs.define
class Collector:
    """The collector under test: one process at a time on fixed ports, restarted as the faults say."""

    tmp: Path
    sink: OtlpSink
    grpc_port: int = attrs.field(factory=unused_port)
    http_port: int = attrs.field(factory=unused_port)
    prometheus_port: int = attrs.field(factory=unused_port)
    feed_port: int = attrs.field(factory=unused_port)
    process: CollectorProcess | None = None
    logs: list[str] = attrs.field(factory=list)
    exits: list[int] = attrs.field(factory=list)
    clean_stops_ns: list[tuple[int, int]] = attrs.field(factory=list)  # (SIGTERM sent, process gone) per restart

    @property
    def spool(self) -> Path:
        return self.tmp / "spool.sqlite"

    def start(self) -> float:
        began = time.monotonic()
        self.process = CollectorProcess.start(
            "--listen", f"127.0.0.1:{self.grpc_port}", "--http-listen", f"127.0.0.1:{self.http_port}",
            "--window", str(WINDOW_S), "--lateness", str(LATENESS_S), "--spool", str(self.spool),
            "--record-outputs", str(self.tmp / "windows.jsonl"), "--export-endpoint", self.sink.grpc_endpoint,
            "--prometheus-port", str(self.prometheus_port), "--report-feed-port", str(self.feed_port),
            "--instance-id", "chaos", "--shutdown-grace", "10",
        )  # fmt: skip
        self.process.wait_for("otel-ofu collector ready", timeout_s=30)
        return time.monotonic() - began

    def kill(self) -> None:
        assert self.process is not None
        self.process.kill()
        self.exits.append(-9)
        self._keep_log()

    def stop(self) -> int:
        """A clean stop (SIGTERM), its span kept: the window it falls in is closed early at a time within it."""
        assert self.process is not None
        signalled_ns = time.time_ns()
        code = self.process.terminate()
        self.clean_stops_ns.append((signalled_ns, time.time_ns()))
        self.exits.append(code)
        self._keep_log()
        return code

    def restart(self, kill: bool, rng: random.Random) -> dict[str, Any]:
        """Kill it (and damage what a kill leaves) or stop it cleanly, then start it again; what it took."""
        signalled = time.monotonic()
        damage: dict[str, int] = {}
        if kill:
            self.kill()
            damage = _damage_write_ahead(Path(f"{self.spool}.accepted"), rng)
            if rng.random() < 0.5:
                damage["spool_replaced"] = _replace_empty_spool(self.spool, rng)
        else:
            assert self.stop() == 0, "\n".join(self.logs[-30:])
        ready_s = self.start()
        return {
            "kind": "kill" if kill else "restart",
            "down_s": round(time.monotonic() - signalled, 2),
            "start_s": round(ready_s, 2),
            **damage,
        }

    def disk(self, full: bool) -> None:
        """No file may grow past 4 KiB (a full disk to SQLite and to the records file), or no limit."""
        assert self.process is not None
        limit = 4096 if full else resource.RLIM_INFINITY
        resource.prlimit(self.process.process.pid, resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))

    def cpu_s(self) -> float:
        """The running process's CPU seconds so far (user + system)."""
        assert self.process is not None
        fields = Path(f"/proc/{self.process.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def _keep_log(self) -> None:
        assert self.process is not None
        self.logs.extend(self.process.lines)
        self.process = None


@attrs.frozen
class Event:
    at_s: float
    kind: str  # pods | kill | restart | disk | slow | exporter | streams | bomb | idle


def schedule(rng: random.Random, seconds: float) -> list[Event]:
    """Faults every 2.5-4.5 s after a calm first 4 s; no kill or restart while the disk is full or within
    8 s after (the write-ahead retries every 5 s: a kill before it writes again loses its points, as the
    docs say), and collector restarts at least 5 s apart (the producers' queues drain in between)."""
    events: list[Event] = []
    at = 4.0
    calm_until = last_restart = -math.inf
    while at < seconds - 6.0:
        kinds = ["pods", "slow", "disk", "exporter", "streams", "bomb", "idle"]
        if at >= calm_until and at - last_restart >= 5.0:
            kinds += ["kill", "kill", "restart"]
        kind = rng.choice(kinds)
        events.append(Event(round(at, 2), kind))
        if kind == "disk":
            calm_until = at + 3.0 + 8.0
        if kind in ("kill", "restart"):
            last_restart = at
        at += rng.uniform(2.5, 4.5)
    return events


@pytest.fixture
def pods_server(kubelet: FakeKubelet) -> Iterator[FakeApiServer]:
    kubelet.response = ListPodResourcesResponse(pod_resources=[allocation("sweep-0", "ml", "nvidia.com/gpu", ["0"])])
    api = FakeApiServer(pods=[pod("sweep-0", "ml", labels={"volcano.sh/job-name": "sweep"})], drip_s=1.0, delay_s=3.0)
    with serve(api) as served:
        yield served


def test_every_healthy_jobs_windows_are_exported_exactly_once_under_a_seeded_mix_of_faults(
    tmp_path: Path, socket_path: Path, pods_server: FakeApiServer
) -> None:
    rng = random.Random(SEED)
    events = schedule(rng, SECONDS)
    print(f"chaos seed {SEED}, {SECONDS:g} s: " + ", ".join(f"{e.kind}@{e.at_s:g}" for e in events))
    environment = {key: value for key, value in os.environ.items() if not key.startswith(("OTEL_", "OFU_"))}
    measured: dict[str, Any] = {"seed": SEED, "seconds": SECONDS, "events": [attrs.asdict(e) for e in events]}
    faults: Counter[str] = Counter()
    with OtlpSink.start() as sink:
        collector = Collector(tmp_path, sink)
        measured["first_start_s"] = collector.start()
        producer = subprocess.Popen(
            [
                sys.executable, "-m", "otel_ofu.cli", "run", "--source", "sim", "--interval", str(INTERVAL_S),
                "--quiet", "--export-endpoint", f"http://127.0.0.1:{collector.grpc_port}", "--max-queue", "40",
                "--kubelet-socket", str(socket_path), "--k8s-pods-url", pods_server.url, "--k8s-node-name",
                "node-a", "--k8s-token-file", "", "--attribution-refresh", "1",
            ],
            cwd=ROOT, env=environment, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        exporter = Exporter()
        exporter.start()
        scraper = subprocess.Popen(
            [
                sys.executable, "-m", "otel_ofu.cli", "run", "--source", "dcgm-exporter", "--url", exporter.url,
                "--interval", str(INTERVAL_S), "--quiet", "--export-endpoint",
                f"http://127.0.0.1:{collector.grpc_port}", "--max-queue", "40",
            ],
            cwd=ROOT, env=environment, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        senders = [
            Sender("poisoned-requests", _grpc_send(collector.grpc_port), _poisoned_request),
            Sender("http-requests", _http_send(collector.http_port), _http_request),
        ]
        slow = SlowClients(collector.http_port)
        streams = SlowStreams(collector.grpc_port)
        idle = IdleConnections((collector.prometheus_port, collector.feed_port))
        bombs: Counter[str] = Counter()
        restarts: list[dict[str, Any]] = []
        disk_full: list[dict[str, Any]] = []
        try:
            deadline = time.monotonic() + 20
            while pods_server.answered == 0 and time.monotonic() < deadline:
                time.sleep(0.1)
            assert pods_server.answered, "the producer never listed its pods"
            for sender in senders:
                sender.start()
            began = time.monotonic()
            cpu_before = 0.0
            for event in events:
                time.sleep(max(0.0, began + event.at_s - time.monotonic()))
                faults[event.kind] += 1
                if event.kind == "pods":
                    pods_server.fault = rng.choice([Fault.DRIP, Fault.SILENT, Fault.SLOW, Fault.NONE])
                    faults[f"pods_{pods_server.fault.value}"] += 1
                elif event.kind == "slow":
                    slow.open(bodies=rng.randrange(1, 5), headers=rng.randrange(0, 3))
                elif event.kind == "exporter":
                    exporter.dripping = not exporter.dripping
                elif event.kind == "streams":
                    streams.open()
                elif event.kind == "bomb":
                    bombs += _bombs(collector)
                elif event.kind == "idle":
                    idle.close()
                    idle.open(200)
                elif event.kind == "disk":
                    cpu = collector.cpu_s()
                    collector.disk(full=True)
                    time.sleep(3.0)
                    collector.disk(full=False)
                    disk_full.append({"at_s": event.at_s, "cpu_s": round(collector.cpu_s() - cpu, 3)})
                else:
                    cpu_before += collector.cpu_s()
                    restarts.append({"at_s": event.at_s, **collector.restart(event.kind == "kill", rng)})
            time.sleep(max(0.0, began + SECONDS - time.monotonic()))
            # The end: the pods server drips, and the producer must still stop at once on SIGTERM.
            pods_server.fault = Fault.DRIP
            time.sleep(1.5)
            stop_began = time.monotonic()
            producer.send_signal(signal.SIGTERM)
            _, producer_log = producer.communicate(timeout=30)
            measured["producer_sigterm_to_exit_s"] = round(time.monotonic() - stop_began, 2)
            # ... and the exporter's scraper, its page dripping, as promptly.
            exporter.dripping = True
            time.sleep(1.5)
            stop_began = time.monotonic()
            scraper.send_signal(signal.SIGTERM)
            _, scraper_log = scraper.communicate(timeout=30)
            measured["scraper_sigterm_to_exit_s"] = round(time.monotonic() - stop_began, 2)
            # The endpoints still answer a scraper, whatever idle connections are open.
            with urllib.request.urlopen(f"http://127.0.0.1:{collector.prometheus_port}/metrics", timeout=10) as page:
                assert page.status == 200
            with urllib.request.urlopen(f"http://127.0.0.1:{collector.feed_port}/reports.jsonl", timeout=10) as feed:
                assert feed.status == 200
            for sender in senders:
                sender.stop.set()
            for sender in senders:
                assert sender.thread is not None
                sender.thread.join(timeout=30)
            slow.close()
            streams.close()
            idle.close()
            cpu_last = collector.cpu_s()
            assert collector.stop() == 0, "\n".join(collector.logs[-30:])
            measured["collector_cpu_s"] = round(cpu_before + cpu_last, 2)
            sink.wait_for(lambda _: False, timeout=1.0)  # what the last stop delivered has arrived
        finally:
            for process in (producer, scraper):
                if process.poll() is None:
                    process.kill()
                    process.communicate()
            slow.close()
            streams.close()
            idle.close()
            exporter.close()
            for sender in senders:
                sender.stop.set()
            if collector.process is not None:
                collector.kill()

        log = "\n".join(collector.logs)
        windows = _windows_of(sink)
        rejected = self_metric(sink, names.COLLECTOR_POINTS_REJECTED.name)
        skipped = self_metric(sink, names.COLLECTOR_WRITE_AHEAD_SKIPPED.name)
        unwritten = self_metric(sink, names.COLLECTOR_WRITE_AHEAD_UNWRITTEN.name)
        poisoned_energy = _job_sums(sink, names.JOB_ENERGY.name, POISONED)

    measured |= {
        "faults": dict(faults),
        "restarts": restarts,
        "disk_full": disk_full,
        "senders": {s.name: {"sent": s.sent, "retried": s.retried, "dropped": s.dropped} for s in senders},
        "rejected_last_run": rejected,
        "write_ahead_skipped_last_run": skipped,
        "write_ahead_unwritten_last_run": unwritten,
        "windows_per_job": {job: len(found) for job, found in sorted(windows.items())},
        "bombs_answered": dict(bombs),
        "slow_streams_ended": dict(streams.codes),
        "exporter_pages": {"served": exporter.served, "dripped": exporter.dripped},
        "collector_log": _costs_in(log),
    }
    print(json.dumps(measured, indent=1))
    if os.environ.get("OTEL_OFU_CHAOS_REPORT"):
        report = Path(os.environ["OTEL_OFU_CHAOS_REPORT"])
        report.write_text(json.dumps(measured, indent=1) + "\n")
        report.with_name(report.name + ".log").write_text(log + "\n")

    assert "Traceback" not in log, log[-5000:]
    assert "Traceback" not in producer_log, producer_log[-3000:]
    assert producer.returncode == 0, producer_log[-3000:]
    assert "Traceback" not in scraper_log, scraper_log[-3000:]
    assert scraper.returncode == 0, scraper_log[-3000:]
    # A bomb is never taken (refused as too large, unparseable or over the budget), the duplicates by reason.
    assert not any(answer in bombs for answer in ("http 200", "grpc OK")), bombs
    assert all(key.startswith(("http 4", "http 503", "grpc ", "duplicates refused")) for key in bombs), bombs
    assert collector.exits.count(0) == len(collector.exits) - faults["kill"]
    assert all(sender.dropped == 0 for sender in senders), measured["senders"]
    healthy = {job: found for job, found in windows.items() if job not in (POISONED, "bomb", "exporter-job")}
    # The scraper's job misses the windows its page dripped through (no reading, never a 0): never one twice.
    assert not [end for end, count in Counter(windows.get("exporter-job", [])).items() if count > 1]
    assert set(HEALTHY_SENT) <= set(healthy), sorted(windows)
    assert len(healthy) >= 2 + 11, sorted(windows)  # the simulated fleet's eleven jobs too
    width = round(WINDOW_S * S)
    least = int(SECONDS / WINDOW_S) - 4
    # What the docs say a clean restart costs: the window the stop falls in is exported early with what it
    # has, and the points sent for it after the restart are late; a job with no point in it yet misses it.
    # Nothing else may be missing, and nothing may come twice.
    # The stop's clock falls somewhere between the signal and the exit: any window ending in that span.
    closed_early = {
        end
        for sent, gone in collector.clean_stops_ns
        for end in range((sent // width + 1) * width, (gone // width + 1) * width + 1, width)
    }
    stops = collector.clean_stops_ns
    for job, found in sorted(healthy.items()):
        twice = [window for window, count in Counter(found).items() if count > 1]
        assert not twice, f"{job}: windows exported more than once: {twice}"
        # A window a clean stop closed early carries the stop's time (its rest, after the restart, the window's end):
        # off the grid only within a stop.
        early = [end for end in found if end % width and not any(sent <= end <= gone for sent, gone in stops)]
        assert not early, f"{job}: windows off the {WINDOW_S:g} s grid outside any clean stop: {early}"
        ends = sorted(end for end in found if end % width == 0)
        missing = sorted(set(range(ends[0], ends[-1] + width, width)) - set(ends) - closed_early)
        assert not missing, f"{job}: windows never exported: {missing} of {ends[0]}..{ends[-1]}"
        assert len(ends) >= least, f"{job}: {len(ends)} windows, expected at least {least}"
    # The poison cost only itself: no energy of a thousand GPUs, every poisoned kind refused by its reason.
    assert all(value < 4 * 5000.0 * WINDOW_S for value in poisoned_energy), poisoned_energy
    assert sum(rejected.values()) > 0, rejected
    # ... each by its reason (the last run's counts: it runs at least the schedule's last 6 s).
    refused = {reason for reason, count in rejected.items() if count}
    assert {names.RejectReason.OUT_OF_RANGE, names.RejectReason.IMPLAUSIBLE, names.RejectReason.BAD_TIME} <= refused
