"""CPU per export cycle of the producer for 8, 64 and 1000 GPUs, against the bare OpenTelemetry SDK floor.

One cycle of ours: snapshot -> OFU values -> ``MetricsData`` (one Resource per GPU) -> ``exporter.export``.
The floor, in the same run: the SDK's own ``MeterProvider`` with one observable gauge per metric whose
callbacks yield the same number of precomputed points (GPU identity as point attributes, since a
MeterProvider has one Resource), collected by an ``InMemoryMetricReader`` and handed to the same
exporter. CPU is ``time.process_time`` (all threads of this process), the best of several repeats.

Two exporters: ``encode`` serialises the OTLP request in memory, exactly the CPU an OTLP exporter spends
before the network; ``grpc`` is the real gRPC exporter to a receiver in a child process on loopback
(so the receiver's CPU is not counted).

Target: <= 2 ms per cycle at 8 GPUs and <= 1.3x the floor.
Run: ``python -m benchmarks.bench_producer [--gpus 8,64,1000] [--exporter encode,grpc]``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, MetricExporter, MetricExportResult, MetricsData
from opentelemetry.sdk.resources import Resource

from otel_ofu import names
from otel_ofu.gpu_values import compute
from otel_ofu.model import GpuIdentity, GpuReading, Snapshot
from otel_ofu.producer.exporters import encode_with_intervals, otlp_exporter
from otel_ofu.producer.metrics_data import MetricsDataBuilder, compute_snapshot, env_resource
from otel_ofu.producer.self_metrics import SelfMetrics

MODEL = "NVIDIA H100 80GB HBM3"
GPUS_PER_HOST = 8
TARGET_MS_AT_8 = 2.0
TARGET_RATIO = 1.3
SECOND = 1_000_000_000
START_NS = 1_767_225_600 * SECOND


class EncodingExporter(MetricExporter):
    """Does the CPU work of an OTLP exporter (encode + serialise) and keeps nothing."""

    def __init__(self) -> None:
        super().__init__()
        self.bytes = 0

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any) -> MetricExportResult:
        self.bytes += len(encode_with_intervals(metrics_data).SerializeToString())
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        pass


def make_snapshots(gpus: int, cycles: int) -> list[Snapshot]:
    identities = [
        GpuIdentity(
            uuid=f"GPU-{index:08x}-0000-4000-8000-000000000000",
            model=MODEL,
            index=index % GPUS_PER_HOST,
            host=f"node-{index // GPUS_PER_HOST:04d}",
            hints={names.JOB_ID: f"job-{index // 16}", names.GPU_PRECISION: "bf16", names.JOB_SCHEDULER: "static"},
        )
        for index in range(gpus)
    ]
    snapshots = []
    for cycle in range(cycles):
        start, end = START_NS + cycle * 10 * SECOND, START_NS + (cycle + 1) * 10 * SECOND
        readings = tuple(
            GpuReading(
                gpu,
                start,
                end,
                tensor_active=0.2 + 0.6 * ((index * 7 + cycle) % 10) / 10,
                sm_clock_hz=1.755e9,
                max_sm_clock_hz=1.98e9,
                sm_active=0.9,
                dram_active=0.4,
            )
            for index, gpu in enumerate(identities)
        )
        snapshots.append(Snapshot(readings))
    return snapshots


def cpu_per_cycle(run_cycle: Callable[[int], None], cycles: int, repeats: int) -> float:
    """Best-of-``repeats`` CPU seconds per cycle (one warm-up cycle first)."""
    run_cycle(0)
    best = float("inf")
    for _ in range(repeats):
        started = time.process_time()
        for cycle in range(1, cycles + 1):
            run_cycle(cycle)
        best = min(best, (time.process_time() - started) / cycles)
    return best


def ours(snapshots: Sequence[Snapshot], exporter: MetricExporter) -> Callable[[int], None]:
    builder = MetricsDataBuilder(placement="resource", base=env_resource("bench-host"))
    self_metrics = SelfMetrics(start_ns=START_NS)

    def cycle(index: int) -> None:
        snapshot = snapshots[index % len(snapshots)]
        computed = compute_snapshot(snapshot)
        for error in computed.errors:
            self_metrics.count_source_error(error.reason)
        data = builder.build(computed, self_metrics.metrics(snapshot.readings[0].end_ns))
        exporter.export(data)

    return cycle


def floor(snapshots: Sequence[Snapshot], exporter: MetricExporter) -> Callable[[int], None]:
    """The bare SDK producing the same points: observable gauges, one callback per metric."""
    # Values computed up front: the floor is what the SDK costs to turn points into an export.
    per_cycle: list[dict[str, list[tuple[dict[str, str | int], float]]]] = []
    for snapshot in snapshots:
        points: dict[str, list[tuple[dict[str, str | int], float]]] = {}
        for reading in snapshot.readings:
            attributes = dict(reading.gpu.hints) | reading.gpu.resource_attributes()
            for name, value in compute(reading, precision="bf16").as_metrics().items():
                points.setdefault(name, []).append((attributes, value))
        per_cycle.append(points)
    current = [0]
    reader = InMemoryMetricReader()
    provider = MeterProvider(resource=Resource.create({names.SERVICE_NAME: "floor"}), metric_readers=[reader])
    meter = provider.get_meter(names.INSTRUMENTATION_SCOPE)

    def callback_for(name: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def callback(options: CallbackOptions) -> Iterable[Observation]:
            return [Observation(value, attributes) for attributes, value in per_cycle[current[0]].get(name, [])]

        return callback

    for spec in names.PRODUCER_METRICS:
        meter.create_observable_gauge(
            spec.name, [callback_for(spec.name)], unit=spec.unit, description=spec.description
        )

    def cycle(index: int) -> None:
        current[0] = index % len(per_cycle)
        data = reader.get_metrics_data()
        if data is not None:
            exporter.export(data)

    return cycle


class ChildSink:
    """An OTLP receiver in a child process, so its CPU is not counted against the exporter."""

    def __init__(self) -> None:
        code = (
            "import sys\n"
            "from otel_ofu.testing.otlp_sink import OtlpSink\n"
            "sink = OtlpSink.start()\n"
            "print(sink.grpc_endpoint, flush=True)\n"
            "sys.stdin.read()\n"
            "sink.close()\n"
        )
        self.process = subprocess.Popen(
            [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self.process.stdout is not None
        self.endpoint = self.process.stdout.readline().strip()

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait(timeout=10)


def run(gpu_counts: Sequence[int] = (8, 64, 1000), exporters: Sequence[str] = ("encode", "grpc")) -> dict[str, Any]:
    results: dict[str, Any] = {"target": {"ms_at_8_gpus": TARGET_MS_AT_8, "ratio": TARGET_RATIO}, "runs": []}
    sink = ChildSink() if "grpc" in exporters else None
    try:
        for kind in exporters:
            for gpus in gpu_counts:
                cycles = max(5, min(200, 2000 // gpus))
                snapshots = make_snapshots(gpus, cycles + 1)
                ours_exporter: MetricExporter
                floor_exporter: MetricExporter
                if kind == "grpc":
                    assert sink is not None
                    ours_exporter = otlp_exporter(endpoint=sink.endpoint)
                    floor_exporter = otlp_exporter(endpoint=sink.endpoint)  # one exporter per pipeline
                else:
                    ours_exporter, floor_exporter = EncodingExporter(), EncodingExporter()
                repeats = 5
                ours_s = cpu_per_cycle(ours(snapshots, ours_exporter), cycles, repeats)
                floor_s = cpu_per_cycle(floor(snapshots, floor_exporter), cycles, repeats)
                ours_exporter.shutdown()
                floor_exporter.shutdown()
                entry = {
                    "exporter": kind,
                    "gpus": gpus,
                    "points": gpus * len(compute(snapshots[0].readings[0], precision="bf16").as_metrics()),
                    "ours_ms": round(ours_s * 1e3, 4),
                    "floor_ms": round(floor_s * 1e3, 4),
                    "ratio": round(ours_s / floor_s, 3),
                }
                if gpus == GPUS_PER_HOST:
                    entry["meets_target"] = ours_s * 1e3 <= TARGET_MS_AT_8 and ours_s / floor_s <= TARGET_RATIO
                results["runs"].append(entry)
    finally:
        if sink is not None:
            sink.close()
    return results


def print_results(results: dict[str, Any]) -> None:
    print(f"producer CPU per export cycle (target: <= {TARGET_MS_AT_8} ms at 8 GPUs, <= {TARGET_RATIO}x the SDK floor)")
    print(f"{'exporter':>8} {'gpus':>6} {'points':>7} {'ours ms':>9} {'floor ms':>9} {'ratio':>6}")
    for entry in results["runs"]:
        print(
            f"{entry['exporter']:>8} {entry['gpus']:>6} {entry['points']:>7} {entry['ours_ms']:>9.3f} "
            f"{entry['floor_ms']:>9.3f} {entry['ratio']:>6.2f}"
            + (f"  target {'met' if entry['meets_target'] else 'MISSED'}" if "meets_target" in entry else "")
        )


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--gpus", default="8,64,1000", help="comma-separated GPU counts")
    parser.add_argument("--exporter", default="encode,grpc", help="encode and/or grpc")
    args = parser.parse_args(argv)
    results = run(
        [int(part) for part in args.gpus.split(",") if part],
        [part for part in args.exporter.split(",") if part],
    )
    print_results(results)
    return results


if __name__ == "__main__":
    main()
