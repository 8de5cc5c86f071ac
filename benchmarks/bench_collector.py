"""Collector benchmark: ingest throughput vs the parse floor, window close, state per GPU stream, export latency.

    .venv/bin/python benchmarks/bench_collector.py [--gpus-per-request 1000] [--requests 200] [--fleet 20000]

In-process only (the collector process over real gRPC, beside its peers, is ``bench_collector_e2e``).
Targets: >= 0.5x the floor measured in the same run (ratio); the floor parses each request, finds each
Resource's identity by its encoding as sent (a shallow second read of the same bytes), reading its
attributes only the first time it sees that encoding, as the collector caches it, and reads every point's
value and time once; nothing else. A floor without that cache walked every attribute per point and was
beaten by what it bounds (1.25x); with it the ratio is below 1, as a floor's must be. Also: closing a window
of 100k GPUs in < 250 ms (absolute, reported), < 2 KiB of state per GPU stream (deterministic). Points/s
are reported (absolute). All but the export latency runs in this one thread, so CPU time is one core's.

Ingest workload (unchanged since the first run): 200 requests of 1000 GPUs in the producer's layout (one
Resource per GPU carrying its identity, one ``gpu.ofu`` gauge point), a fleet of 20 000 GPUs reporting every
10 s, so each GPU's Resource arrives 10 times; a data point is one ``gpu.ofu`` point, and every one must be
taken. Ingest = ``ExportMetricsServiceRequest.FromString`` (what the receivers do) + ``Decoder.decode`` into
a fresh ``Aggregator`` per repeat; best of 5 repeats, interleaved with the floor (3 before 2026-11-29).
On this shared 2-core VM the floor alone has measured 170k-215k points/s from run to run, and ingest moves
with it: the ratio is the steadier figure. Before the decoder rework of 2026-11-29 (Resource identity keyed
by the encoding as sent, profile once per Resource, window and cell lookups inlined) ingest measured
148k-152k points/s, 0.71x the floor of that time (the floor without the cache).

Since 2026-12-01 the decoder reads a Resource whose metrics come in a layout it has seen through that
layout's template (one ``struct`` call over the ScopeMetrics' bytes) instead of walking a protobuf object per
metric and point: ingest went from 46k to 99k points/s here (0.45x -> 0.60-0.66x the floor, which still walks every
point: it stays the bound, since a floor beaten by what it bounds would have to read through templates too).

Where the ingest time goes now (py-spy at 500 Hz on this workload, share of samples):

- 21 %: the points read through their templates into ``Aggregator.add_ofu`` (14 % of it: stream table, window
  cell, job liveness).
- 18 %: the loop over ResourceMetrics: a upb wrapper per Resource, its view, the lookup by encoding.
- 12 %: first sight of a Resource in a fresh decoder (1 point in 10 here): its attributes read into
  identity, stream key and profile.
- 10 %: ``FromString`` of the request (the receivers parse it; the decoder reads the parsed request only
  where no template fits).
- 9 %: the request's bytes re-read with the Resource and each ScopeMetrics as bytes fields (the view).

Window close: 1k / 10k / 100k GPUs after one point each. State: tracemalloc growth (aggregator plus the
decoder's resource cache) per GPU stream after one window of 100k GPUs. Export latency: wall time from
``flush(now)`` closing a window of N GPUs in a ``CollectorService`` to a real OTLP gRPC receiver on loopback
holding its outputs, p50/p95 over repeats (no target: a measurement).
"""

from __future__ import annotations

import argparse
import gc
import json
import time
import tracemalloc
from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from otel_ofu import names
from otel_ofu.testing.otlp_sink import OtlpSink
from otel_ofu_collector.aggregation.windows import Aggregator
from otel_ofu_collector.config import AggregatorConfig
from otel_ofu_collector.otlp.decode import Decoder, resource_views
from otel_ofu_collector.service import CollectorOptions, CollectorService
from otel_ofu_collector.stats.quantiles import percentile_of_sorted

S = 1_000_000_000
W0 = 1_700_000_040 * S
TARGETS = {"points_per_s": 200_000.0, "ratio_to_floor": 0.5, "close_ms_100k": 250.0, "bytes_per_stream": 2048.0}


def producer_request(first_gpu: int, gpus: int, time_ns: int, jobs: int = 500) -> bytes:
    """``gpus`` GPUs in the producer's layout (one Resource per GPU, identity on the resource)."""
    request = ExportMetricsServiceRequest()
    for gpu in range(first_gpu, first_gpu + gpus):
        rm = request.resource_metrics.add()
        for key, value in (
            (names.SERVICE_NAME, names.PRODUCER_SERVICE_NAME),
            (names.HOST_NAME, f"node-{gpu // 8:05d}"),
            (names.HW_ID, f"GPU-{gpu:08x}-1d2c-4b5a-9e8f-0a1b2c3d4e5f"),
            (names.HW_MODEL, "NVIDIA H100 80GB HBM3" if gpu % 3 else "NVIDIA A100-SXM4-80GB"),
            (names.HW_TYPE, names.HW_TYPE_GPU),
            (names.HW_VENDOR, names.HW_VENDOR_NVIDIA),
            (names.JOB_ID, f"job-{gpu % jobs}"),
            (names.GPU_PRECISION, "bf16" if gpu % 2 else "fp8"),
        ):
            kv = rm.resource.attributes.add()
            kv.key = key
            kv.value.string_value = value
        kv = rm.resource.attributes.add()
        kv.key = names.GPU_INDEX
        kv.value.int_value = gpu % 8
        sm = rm.scope_metrics.add()
        sm.scope.name = names.INSTRUMENTATION_SCOPE
        metric = sm.metrics.add(name=names.GPU_OFU.name, unit="1")
        # As the producer sends it: the interval the value covers, the 10 s before its time.
        metric.gauge.data_points.add(
            as_double=(gpu % 97) / 100.0, start_time_unix_nano=time_ns - 10 * S, time_unix_nano=time_ns
        )
    return request.SerializeToString()


def floor_pass(payloads: Sequence[bytes], cache: dict[bytes, tuple[tuple[str, str], ...]] | None = None) -> int:
    """What any receiver that remembers a Resource's identity must do: parse each request, read each
    Resource's encoding as sent (a second, shallow read of the same bytes), look its identity up by that
    encoding (reading the attributes only the first time a Resource is seen: the cache the collector keeps),
    and read every point's value and time once. Nothing is aggregated. ``cache`` persists across calls
    like the collector's decoder does (a fresh one per repeat, as the ingest gets a fresh decoder)."""
    identity_keys = frozenset(names.IDENTITY_ATTRIBUTES)
    cache = {} if cache is None else cache
    points = 0
    for payload in payloads:
        request = ExportMetricsServiceRequest.FromString(payload)
        encodings = [view.resource for view in resource_views(request, payload)]  # as the decoder reads them
        for rm, encoding in zip(request.resource_metrics, encodings, strict=True):
            identity = cache.get(encoding)
            if identity is None:
                identity = tuple(
                    (kv.key, kv.value.string_value) for kv in rm.resource.attributes if kv.key in identity_keys
                )
                cache[encoding] = identity
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    for point in metric.gauge.data_points:
                        _ = (point.as_double, point.time_unix_nano, identity)
                        points += 1
    return points


def ingest_pass(payloads: Sequence[bytes], decoder: Decoder) -> int:
    """The real ingest of each request's bytes, as the receivers hand them over (parsed only where needed)."""
    points = 0
    for payload in payloads:
        outcome = decoder.decode_bytes(payload)
        points += outcome.accepted + outcome.rejected
    return points


def cpu_seconds(work: Callable[[], int]) -> tuple[float, int]:
    gc.collect()
    start = time.process_time()
    count = work()
    return time.process_time() - start, count


def throughput(gpus_per_request: int, requests: int, fleet: int, repeats: int = 5) -> dict[str, float]:
    """Points/s of the real ingest (decode + aggregate) and of the floor, best of ``repeats``, interleaved.

    A fleet of ``fleet`` GPUs reports every 10 s, ``gpus_per_request`` GPUs per request (an agent's batch),
    as in steady state: each GPU sends the same Resource every interval.
    """
    payloads = []
    for index in range(requests):
        first = index * gpus_per_request
        interval = first // fleet
        payloads.append(producer_request(first % fleet, gpus_per_request, W0 + S + interval * 10 * S))
    best_ingest = best_floor = 0.0
    for _ in range(repeats):
        cache: dict[bytes, tuple[tuple[str, str], ...]] = {}
        floor_s, floor_points = cpu_seconds(lambda: floor_pass(payloads, cache))  # noqa: B023 - used at once
        aggregator = Aggregator(AggregatorConfig())
        decoder = Decoder(aggregator, pass_through=True)
        ingest_s, ingest_points = cpu_seconds(lambda: ingest_pass(payloads, decoder))  # noqa: B023 - used at once
        assert decoder.stats.accepted == ingest_points == floor_points, "every point must be taken"
        best_floor = max(best_floor, floor_points / floor_s)
        best_ingest = max(best_ingest, ingest_points / ingest_s)
    return {"points_per_s": best_ingest, "floor_points_per_s": best_floor, "ratio_to_floor": best_ingest / best_floor}


def _fill(gpus: int) -> tuple[Aggregator, Decoder]:
    aggregator = Aggregator(AggregatorConfig())
    decoder = Decoder(aggregator)
    step = 1000
    for first in range(0, gpus, step):
        payload = producer_request(first, min(step, gpus - first), W0 + 30 * S)
        decoder.decode_bytes(payload)
    return aggregator, decoder


def close_ms(gpus: int) -> float:
    aggregator, _ = _fill(gpus)
    gc.collect()
    start = time.perf_counter()
    [report] = aggregator.flush(W0 + 60 * S + AggregatorConfig().lateness_ns)
    elapsed = time.perf_counter() - start
    assert sum(group.histogram.count for group in report.groups) == gpus  # every GPU closed
    return elapsed * 1000.0


def bytes_per_stream(gpus: int) -> float:
    """Memory the aggregator holds per GPU stream after one window of points (stream table + window cell)."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        aggregator, decoder = _fill(gpus)
        gc.collect()
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    held = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
    assert aggregator.streams == gpus
    del decoder
    return held / gpus


def export_latency(gpus: int, repeats: int) -> dict[str, float]:
    """Wall ms from ``flush(now)`` closing a window of ``gpus`` GPUs to the downstream holding its outputs.

    A ``CollectorService`` exports over OTLP gRPC to a real receiver (``OtlpSink``) on loopback, with the
    default exporter settings (no compression). Each repeat fills the next window with one point per GPU
    (``service.ingest``, as the receivers call it), then times ``flush`` (close, encode, enqueue) and the
    wait until the sink has stored that window's request (its condition variable, no polling). The first
    window only warms the channel up and is not counted. p50/p95 as the collector's own percentiles.
    """
    config = AggregatorConfig()
    now = [W0]
    with OtlpSink.start() as sink:
        service = CollectorService(
            CollectorOptions(
                aggregator=config,
                grpc_listen=None,
                export_endpoint=sink.grpc_endpoint,
                export_protocol="grpc",
                flush_interval_s=0.0,
                pass_through=False,
                instance_id="bench",
            ),
            clock=lambda: now[0],
            environ={},
        )
        service.start()
        totals: list[float] = []
        flushes: list[float] = []
        try:
            for repeat in range(repeats + 1):
                start = W0 + repeat * config.window_ns
                now[0] = start + 30 * S
                for first in range(0, gpus, 1000):
                    payload = producer_request(first, min(1000, gpus - first), start + 30 * S)
                    service.ingest_bytes(payload)
                expected = len(sink.requests()) + 1
                now[0] = start + config.window_ns + config.lateness_ns
                gc.collect()
                began = time.perf_counter()
                [report] = service.flush(now[0])
                flushed = time.perf_counter()
                assert sink.wait_for(lambda s: len(s.received) >= expected, timeout=60.0), "window never arrived"  # noqa: B023
                arrived = time.perf_counter()
                assert sum(group.histogram.count for group in report.groups) == gpus  # every GPU closed
                if repeat:
                    totals.append((arrived - began) * 1000.0)
                    flushes.append((flushed - began) * 1000.0)
        finally:
            service.stop(grace=5.0)
    totals.sort()
    flushes.sort()
    return {
        "gpus": float(gpus),
        "repeats": float(repeats),
        "p50_ms": percentile_of_sorted(totals, 0.5),
        "p95_ms": percentile_of_sorted(totals, 0.95),
        "flush_p50_ms": percentile_of_sorted(flushes, 0.5),
    }


LATENCY_REPEATS = {1_000: 30, 10_000: 15}


def run(gpus_per_request: int = 1000, requests: int = 200, fleet: int = 20_000) -> dict[str, Any]:
    results: dict[str, Any] = dict(throughput(gpus_per_request, requests, fleet))
    for gpus in (1_000, 10_000, 100_000):
        results[f"close_ms_{gpus // 1000}k"] = close_ms(gpus)
    results["bytes_per_stream"] = bytes_per_stream(100_000)
    for gpus, repeats in LATENCY_REPEATS.items():
        results[f"export_latency_{gpus // 1000}k"] = export_latency(gpus, repeats)
    results["targets"] = TARGETS
    results["meets"] = {
        "points_per_s": results["points_per_s"] >= TARGETS["points_per_s"],
        "ratio_to_floor": results["ratio_to_floor"] >= TARGETS["ratio_to_floor"],
        "close_ms_100k": results["close_ms_100k"] < TARGETS["close_ms_100k"],
        "bytes_per_stream": results["bytes_per_stream"] < TARGETS["bytes_per_stream"],
    }
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--gpus-per-request", type=int, default=1000)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--fleet", type=int, default=20_000, help="GPUs in the fleet (each reports every 10 s)")
    args = parser.parse_args()
    print(json.dumps(run(args.gpus_per_request, args.requests, args.fleet), indent=2))


if __name__ == "__main__":
    main()
