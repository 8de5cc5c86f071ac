"""Producer: CPU of the whole export cycle for 8 GPUs, against the SDK's OTLP encoder, its own encode step
and OpenLIT's GPU metrics.

One cycle of ours is ``Producer.run_once`` as the running producer calls it, with its export queue and
worker thread: the source read (8 GPUs on the fake NVML library through real pynvml, and on the
simulator), the job attribution, the OFU math, the ``MetricsData``, the queue, and the producer's real
``OtlpMetricExporter``: its encode and its send, to a sender that keeps the bytes in memory (the network
is left out). The cycle waits until the worker has exported it.

Two yardsticks, in the same run, on the very ``MetricsData`` each of our cycles produced:

- the SDK reference (the contract's target): the OpenTelemetry SDK's own OTLP encoder, public
  ``encode_metrics`` + ``SerializeToString``, the encode a producer built on the SDK's exporters does;
- the floor: the exporter's own encode step alone (``encode_request``), the one piece of work the cycle
  cannot leave out, so the whole cycle never beats it (a ratio under 1 would mean an unfair floor).

The peer, in the same run and the same process: OpenLIT's GPU instrumentation (PyPI ``openlit``,
``GPUInstrumentor``), reading the same 8 fake GPUs through pynvml with its own callbacks, collected by an
SDK ``MeterProvider`` with an ``InMemoryMetricReader`` and encoded by the same SDK encoder. The fake
library is built for this run with the few NVML entry points OpenLIT reads that the project's fake does
not have (temperature, utilisation, memory, power: ``benchmarks/peers/openlit_nvml.c``).

CPU is ``time.process_time`` (every thread of this process), the best of several repeats of many
cycles, the four interleaved. Targets: at most 1.3x the SDK reference, never under the floor, at most 2 ms
of CPU per cycle, and less CPU per GPU than OpenLIT.

The send, by protocol (``otel-ofu run --protocol``): the same cycle on the fake NVML with the producer's
real exporter and its real sender, over OTLP/gRPC (``grpc``) and over OTLP/HTTP (``http/protobuf``: one
keep-alive ``requests`` session), to a receiver on 127.0.0.1 in a process of its own (Rotel, whose CPU is not
counted; our no-op floors where Rotel is not installed), beside the cycle with the in-memory sender (no
network): what each protocol's send costs the producer, per export of a node's 8 GPUs. The three in turn,
``repeats`` times: the median and spread (min-max) of the repeats, no target.
"""

from __future__ import annotations

import gc
import hashlib
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib import resources
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import attrs
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.sdk.metrics.export import MetricsData

from otel_ofu.attribution.static import StaticAttributor
from otel_ofu.clock import ManualClock
from otel_ofu.otlp_client import Attempt, OtlpSettings
from otel_ofu.otlp_client.senders import Sender, open_sender
from otel_ofu.producer.exporters import OtlpMetricExporter
from otel_ofu.producer.loop import Producer
from otel_ofu.producer.metrics_data import MetricsDataBuilder, env_resource
from otel_ofu.producer.otlp_encoding import encode_request
from otel_ofu.sources.simulated import JobSpec, ProfileKind, SimGpu, SimulatedFleet
from otel_ofu.testing import fake_nvml

GPUS = 8
MODEL = "NVIDIA H100 80GB HBM3"
TARGET_MS = 2.0
TARGET_RATIO = 1.3
INTERVAL_S = 10.0
HERE = Path(__file__).resolve().parent


@attrs.define
class MemorySender:
    """The exporter's transport with the network left out: every request delivered, its bytes counted."""

    sent_bytes: int = 0
    requests: int = 0

    def send(self, payload: bytes, timeout_s: float) -> Attempt:
        self.sent_bytes += len(payload)
        self.requests += 1
        return Attempt(True)

    def close(self) -> None:
        pass


def bench_library() -> Path:
    """The fake NVML plus OpenLIT's extra entry points, as one library (built once per source hash)."""
    fake_dir = resources.files("otel_ofu.fake_nvml")
    extras = HERE / "peers" / "openlit_nvml.c"
    source = fake_nvml.source_text() + extras.read_bytes()
    digest = hashlib.sha256(source + " ".join(fake_nvml.CFLAGS).encode()).hexdigest()[:16]
    target = fake_nvml.default_cache_dir() / f"libbench-nvml-{digest}.so"
    if target.exists():
        return target
    cc = fake_nvml.compiler()
    if cc is None:
        raise fake_nvml.FakeNvmlUnavailable("no C compiler (gcc): the fake NVML library is built from C source")
    with resources.as_file(fake_dir) as include:
        built = target.with_suffix(".tmp")
        result = subprocess.run(
            [cc, *fake_nvml.CFLAGS, f"-I{include}", "-o", str(built), str(extras)],
            capture_output=True,
            text=True,
            check=False,
        )
    if result.returncode != 0:
        raise fake_nvml.FakeNvmlUnavailable(f"building the benchmark NVML library failed: {result.stderr.strip()}")
    built.replace(target)
    return target


@contextmanager
def fake_gpus(gpus: int) -> Iterator[fake_nvml.FakeNvml]:
    """``gpus`` H100s on the benchmark's fake NVML, pynvml pointed at it for the duration."""
    import ctypes

    path = bench_library()
    lib = ctypes.CDLL(str(path))
    fake_nvml._declare(lib)  # the fake's control API, declared once in its own module
    fake = fake_nvml.FakeNvml(path, lib)
    fake.reset()
    for index in range(gpus):
        gpu = fake.add_gpu(MODEL, sm_clock_mhz=1755)
        fake.set_tensor_util(gpu, 45.0)
        fake.set_power(gpu, 550.0 + index)  # every real H100 reports its power; OpenLIT reads it too
    with fake.installed():
        yield fake


def simulated_fleet(clock: ManualClock) -> SimulatedFleet:
    gpus = tuple(SimGpu(f"GPU-sim-{i}", "node-0", i, MODEL, 1980.0, "job-0") for i in range(GPUS))
    job = JobSpec("job-0", "train", ProfileKind.DENSE, "bf16", tuple(g.uuid for g in gpus))
    return SimulatedFleet(gpus=gpus, jobs=(job,), seed=1, clock=clock)


@attrs.define
class Ours:
    """A cycle of the real producer; ``kept`` holds each cycle's MetricsData for the yardsticks to encode."""

    cycle: Callable[[], None]
    sender: MemorySender
    kept: list[MetricsData]
    close: Callable[[], None]


def ours(source_kind: str) -> Ours:
    """A cycle of the real producer on ``source_kind`` ('nvml' or 'simulator'), exporting through its real
    OtlpMetricExporter to an in-memory sender."""
    from otel_ofu.sources.nvml import NvmlSource

    clock = ManualClock()
    source: Any = (
        NvmlSource("bench-host", background=False, clock=clock) if source_kind == "nvml" else simulated_fleet(clock)
    )
    sender = MemorySender()
    exporter = OtlpMetricExporter(OtlpSettings(protocol="grpc", endpoint="http://bench:4317"), sender=sender)
    producer = Producer(
        source=source,
        attribution=StaticAttributor(job_id="job-0", job_name="train", precision="bf16"),
        exporter=exporter,
        clock=clock,
        builder=MetricsDataBuilder(placement="resource", base=env_resource("bench-host")),
        max_queue=1_000_000,
    )
    worker = producer.worker
    assert worker is not None
    kept: list[MetricsData] = []

    def cycle() -> None:
        clock.advance(INTERVAL_S)
        kept.append(producer.run_once())
        worker.flush(30.0)

    def close() -> None:
        producer.close()
        getattr(source, "close", lambda: None)()

    return Ours(cycle, sender, kept, close)


def sdk_reference(kept: list[MetricsData]) -> Callable[[], None]:
    """The SDK's own OTLP encoder on the MetricsData our cycles produced, one per cycle, in order."""
    position = [0]

    def cycle() -> None:
        data = kept[position[0] % len(kept)]
        position[0] += 1
        encode_metrics(data).SerializeToString()

    return cycle


def floor(kept: list[MetricsData]) -> Callable[[], None]:
    """The floor: our exporter's own encode step alone on the same MetricsData, one per cycle.

    The producer encodes from cached Resource encodings straight to bytes, so it is faster than the SDK's
    encoder, which is the contract's reference rather than a floor; this is the one work every cycle must do.
    """
    position = [0]

    def cycle() -> None:
        data = kept[position[0] % len(kept)]
        position[0] += 1
        encode_request(data)

    return cycle


def openlit_version() -> str:
    try:
        return version("openlit")
    except PackageNotFoundError:
        return "-"


_OPENLIT: list[tuple[Callable[[], None], int]] = []  # once per process: see openlit_cycle


def openlit_cycle() -> tuple[Callable[[], None], int]:
    """OpenLIT's GPU instrumentation on the global MeterProvider (its ``get_meter`` takes the global one),
    collected by an in-memory reader and encoded by the SDK; returns (cycle, points per collection).

    Set up once per process: the global MeterProvider can be set only once, and OpenLIT's instrumentor is
    a singleton that instruments once; later calls reuse the first (pynvml reads whichever library is
    installed when the callbacks run)."""
    if _OPENLIT:
        return _OPENLIT[0]
    from opentelemetry import metrics
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    try:
        from openlit.instrumentation.gpu import GPUInstrumentor  # type: ignore[import-untyped,unused-ignore]
    except ImportError as exc:  # one line, not a traceback
        raise ModuleNotFoundError(
            f"openlit's GPU instrumentation cannot be imported ({exc}); "
            "install it with: pip install --no-deps 'openlit>=1.45,<2'",
            name="openlit",
        ) from None
    reader = InMemoryMetricReader()
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
    instrumentor = GPUInstrumentor()
    instrumentor.instrument(application_name="bench", environment="bench")
    if getattr(instrumentor, "gpu_type", None) != "nvidia":
        raise RuntimeError("openlit did not find the fake NVML GPUs (its nvmlInit failed)")

    def cycle() -> None:
        data = reader.get_metrics_data()
        if data is not None:
            encode_metrics(data).SerializeToString()

    first = reader.get_metrics_data()
    points = (
        sum(len(m.data.data_points) for rm in first.resource_metrics for sm in rm.scope_metrics for m in sm.metrics)
        if first is not None
        else 0
    )
    return cycle, points


def cpu_ms(cycle: Callable[[], None], cycles: int) -> float:
    """CPU per cycle with the garbage collector held off while timing, as ``timeit`` does, for every side alike.

    The run keeps each cycle's MetricsData alive for the yardsticks to encode again; a running producer keeps none.
    With the collector on, those kept objects would make full collections land on whichever side runs later.
    """
    gc.collect()
    gc.disable()
    try:
        started = time.process_time()
        for _ in range(cycles):
            cycle()
        return (time.process_time() - started) / cycles * 1e3
    finally:
        gc.enable()


def points_of(data: MetricsData) -> int:
    return sum(len(m.data.data_points) for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics)


@attrs.define
class Delivering:
    """The producer's real sender for its settings, counting what it delivered (a failed send would time a retry)."""

    inner: Sender
    delivered: int = 0
    failed: int = 0

    def send(self, payload: bytes, timeout_s: float) -> Attempt:
        attempt = self.inner.send(payload, timeout_s)
        if attempt.delivered:
            self.delivered += 1
        else:
            self.failed += 1
        return attempt

    def close(self) -> None:
        self.inner.close()


def exporting(settings: OtlpSettings | None) -> Ours:
    """A cycle of the real producer on the fake NVML, exporting through its real sender for ``settings`` (None: the
    in-memory sender)."""
    if settings is None:
        return ours("nvml")
    from otel_ofu.sources.nvml import NvmlSource

    clock = ManualClock()
    source = NvmlSource("bench-host", background=False, clock=clock)
    sender = Delivering(open_sender(settings))
    producer = Producer(
        source=source,
        attribution=StaticAttributor(job_id="job-0", job_name="train", precision="bf16"),
        exporter=OtlpMetricExporter(settings, sender=sender),
        clock=clock,
        builder=MetricsDataBuilder(placement="resource", base=env_resource("bench-host")),
        max_queue=1_000_000,
    )
    worker = producer.worker
    assert worker is not None

    def cycle() -> None:
        clock.advance(INTERVAL_S)
        producer.run_once()
        if not worker.flush(30.0):
            raise RuntimeError(f"the {settings.protocol} export to {settings.endpoint} did not finish in 30 s")
        if sender.failed:
            raise RuntimeError(f"a {settings.protocol} export to {settings.endpoint} failed: this would time retries")

    def close() -> None:
        producer.close()
        source.close()

    return Ours(cycle, MemorySender(), [], close)


def transport_cost(cycles: int = 200, repeats: int = 5) -> dict[str, Any]:
    """CPU per export cycle of 8 GPUs: the producer's real sender over OTLP/gRPC and over OTLP/HTTP to a receiver in
    another process, and the in-memory sender; each repeat runs the three in turn."""
    import statistics
    import tempfile

    from benchmarks import bench_collector_e2e as e2e
    from otel_ofu.otlp_client.settings import GRPC, HTTP_PROTOBUF

    def receiver(transport: str) -> e2e.Peer:
        peer = e2e.rotel(transport)
        if peer.missing is None:
            return peer
        return e2e.http_floor() if transport == "http" else e2e.grpcio_floor()

    runs: dict[str, list[float]] = {"memory": [], GRPC: [], HTTP_PROTOBUF: []}
    receivers = {GRPC: receiver("grpc"), HTTP_PROTOBUF: receiver("http")}
    names = {protocol: f"{peer.name} {peer.version}" for protocol, peer in receivers.items()}
    with (
        fake_gpus(GPUS),
        tempfile.TemporaryDirectory(prefix="bench-producer-") as scratch,
        e2e.started(receivers[GRPC], Path(scratch)) as (_, grpc_port),
        e2e.started(receivers[HTTP_PROTOBUF], Path(scratch)) as (_, http_port),
    ):
        endpoints = {GRPC: f"http://127.0.0.1:{grpc_port}", HTTP_PROTOBUF: f"http://127.0.0.1:{http_port}"}
        sides: dict[str, Ours] = {"memory": exporting(None)}
        for protocol, endpoint in endpoints.items():
            sides[protocol] = exporting(OtlpSettings.resolve(protocol=protocol, endpoint=endpoint, environ={}))
        try:
            for side in sides.values():
                for _ in range(5):  # warm-up: the connection, the Resource encodings
                    side.cycle()
            for _ in range(repeats):
                for name, side in sides.items():
                    runs[name].append(cpu_ms(side.cycle, cycles))
        finally:
            for side in sides.values():
                side.close()

    def spread(values: list[float]) -> dict[str, float]:
        return {"median": statistics.median(values), "min": min(values), "max": max(values)}

    http_to_grpc = [h / g for h, g in zip(runs[HTTP_PROTOBUF], runs[GRPC], strict=True)]
    return {
        "cycles": cycles,
        "repeats": repeats,
        "receivers": names,
        "runs_ms": runs,
        "ms": {name: spread(values) for name, values in runs.items()},
        "send_ms": {
            protocol: spread([v - m for v, m in zip(runs[protocol], runs["memory"], strict=True)])
            for protocol in (GRPC, HTTP_PROTOBUF)
        },
        "http_to_grpc": spread(http_to_grpc),
    }


def run(cycles: int = 200, repeats: int = 5) -> dict[str, Any]:
    results: dict[str, Any] = {
        "gpus": GPUS,
        "cycles": cycles,
        "repeats": repeats,
        "target": {"ms": TARGET_MS, "ratio": TARGET_RATIO},
        "openlit_version": openlit_version(),
        "sources": [],
    }
    with fake_gpus(GPUS):
        peer, openlit_points = openlit_cycle()
        peer()  # warm-up
        for kind in ("nvml", "simulator"):
            run_ours = ours(kind)
            try:
                for _ in range(3):  # warm-up; also gives the yardsticks data to start with
                    run_ours.cycle()
                sides = {
                    "ours": run_ours.cycle,
                    "sdk": sdk_reference(run_ours.kept),
                    "floor": floor(run_ours.kept),
                    "openlit": peer,
                }
                best = dict.fromkeys(sides, float("inf"))
                for _ in range(repeats):
                    for side, side_cycle in sides.items():
                        best[side] = min(best[side], cpu_ms(side_cycle, cycles))
                sample = run_ours.kept[-1]
                results["sources"].append(
                    {
                        "source": "fake NVML (pynvml)" if kind == "nvml" else "simulator",
                        "ours_ms": best["ours"],
                        "sdk_ms": best["sdk"],
                        "sdk_ratio": best["ours"] / best["sdk"],
                        "floor_ms": best["floor"],
                        "floor_ratio": best["ours"] / best["floor"],
                        "ours_us_per_gpu": best["ours"] * 1e3 / GPUS,
                        "openlit_us_per_gpu": best["openlit"] * 1e3 / GPUS,
                        "openlit_ms": best["openlit"],
                        "ours_points": points_of(sample),
                        "openlit_points": openlit_points,
                        "ours_bytes_per_cycle": run_ours.sender.sent_bytes / run_ours.sender.requests,
                        "sdk_bytes_per_cycle": len(encode_metrics(sample).SerializeToString()),
                    }
                )
            finally:
                run_ours.close()
    return results


def main() -> None:
    import json

    print(json.dumps(run(), indent=2))


if __name__ == "__main__":
    main()
