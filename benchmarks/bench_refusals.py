"""Refusing a point costs no more than taking it: the same requests decoded when every point is taken and when
every point is refused, in process, CPU per GPU report.

    .venv/bin/python -m benchmarks --only refusals [--quick]

A misconfigured or hostile producer must not multiply the collector's cost: before the decoder read refusals
through a layout's template, the same 1000-GPU requests cost 113 us of collector CPU per GPU report when every
point was refused (timestamps from the future) against 13 us when taken, about 9x, because a refused point sent
its whole Resource to the point-by-point read.

Workload: the real producer's requests (the simulator's GPUs through ``MetricsDataBuilder`` and the exporter's own
``encode_request``: one Resource per GPU, its full layout of gauges and the energy counter), ``gpus_per_request``
GPUs per request, every GPU's Resource seen once before the measured interval (steady state, as a fleet reporting
every 10 s). Each case decodes the same requests with ``ExportMetricsServiceRequest.FromString`` +
``Decoder.decode`` into a fresh ``Aggregator``:

- taken: the collector's clock at the points' time;
- refused, from the future: the collector's clock an hour behind (every point is more than ``max_future`` ahead);
- refused, late: the windows of the points already closed (every point late: the sink's own refusal);
- refused, no identity: the same requests with ``hw.id`` left out of every Resource (a misconfigured producer,
  or one that sends on purpose what can never be taken), warmed with those requests too. Before its layout was
  read through a template when it carries no GPU identity, each such Resource was walked point by point, about
  1.56x the cost of taking it.

Target: each refused case at most 1x the taken case's CPU (ratio, in one run, best of the repeats interleaved).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Sequence

import attrs
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from benchmarks.common import BenchResult, RunContext, Table, Verdict, doc_summary, fmt
from otel_ofu import names
from otel_ofu.attribution.static import StaticAttributor
from otel_ofu.clock import ManualClock
from otel_ofu.gpu_samples import compute_snapshot
from otel_ofu.producer.metrics_data import MetricsDataBuilder, env_resource
from otel_ofu.producer.otlp_encoding import encode_request
from otel_ofu.sources.simulated import JobSpec, ProfileKind, SimGpu, SimulatedFleet
from otel_ofu_collector.aggregation.windows import Aggregator
from otel_ofu_collector.config import AggregatorConfig
from otel_ofu_collector.otlp.decode import Decoder

S = 1_000_000_000
T0 = 1_700_000_040 * S
MODEL = "NVIDIA H100 80GB HBM3"
HOUR_NS = 3600 * S
CASES = ("taken", "future", "late", "no_identity")


def requests(gpus_per_request: int, requests_per_interval: int, intervals: int) -> list[list[bytes]]:
    """The producer's requests, interval by interval: ``requests_per_interval`` hosts' worth of GPUs each."""
    clock = ManualClock(start_ns=T0)
    total = gpus_per_request * requests_per_interval
    gpus = tuple(SimGpu(f"GPU-sim-{i:06d}", f"node-{i // 8:05d}", i % 8, MODEL, 1980.0, "job-0") for i in range(total))
    job = JobSpec("job-0", "train", ProfileKind.DENSE, "bf16", tuple(g.uuid for g in gpus))
    fleet = SimulatedFleet(gpus=gpus, jobs=(job,), seed=1, clock=clock)
    attribution = StaticAttributor(job_id="job-0", job_name="train", precision="bf16")
    builder = MetricsDataBuilder(placement="resource", base=env_resource("bench-host"))
    out: list[list[bytes]] = []
    try:
        for _ in range(intervals):
            clock.advance(10.0)
            computed = compute_snapshot(fleet.read(), attribution=attribution.attribute)
            per_interval = []
            for first in range(0, total, gpus_per_request):
                part = attrs.evolve(computed, samples=computed.samples[first : first + gpus_per_request])
                per_interval.append(encode_request(builder.build(part)))
            out.append(per_interval)
    finally:
        fleet.close()
    return out


def decode_all(decoder: Decoder, payloads: Sequence[bytes]) -> tuple[int, int]:
    accepted = rejected = 0
    for payload in payloads:
        outcome = decoder.decode_bytes(payload)
        accepted += outcome.accepted
        rejected += outcome.rejected
    return accepted, rejected


def without_hw_id(payload: bytes) -> bytes:
    """The request with ``hw.id`` left out of every Resource."""
    request = ExportMetricsServiceRequest.FromString(payload)
    for rm in request.resource_metrics:
        kept = [kv for kv in rm.resource.attributes if kv.key != names.HW_ID]
        del rm.resource.attributes[:]
        rm.resource.attributes.extend(kept)
    return request.SerializeToString()


def case(warm: Sequence[bytes], measured: Sequence[bytes], how: str) -> tuple[float, int, int]:
    """CPU seconds decoding ``measured`` after ``warm`` (every Resource seen once), and what it took and refused."""
    if how == "no_identity":
        warm, measured = [without_hw_id(p) for p in warm], [without_hw_id(p) for p in measured]
    clock = [T0 + 20 * S]
    aggregator = Aggregator(AggregatorConfig())
    decoder = Decoder(aggregator, clock=lambda: clock[0], max_future_ns=300 * S)
    decode_all(decoder, warm)
    if how == "future":
        clock[0] -= HOUR_NS
    elif how == "late":
        aggregator.flush(T0 + HOUR_NS)
    gc.collect()
    start = time.process_time()
    accepted, rejected = decode_all(decoder, measured)
    return time.process_time() - start, accepted, rejected


def measure(gpus_per_request: int, hosts: int, repeats: int) -> dict[str, tuple[float, int, int]]:
    first, second = requests(gpus_per_request, hosts, 2)
    best: dict[str, tuple[float, int, int]] = {}
    for _ in range(repeats):
        for how in CASES:
            seconds, accepted, rejected = case(first, second, how)
            if how not in best or seconds < best[how][0]:
                best[how] = (seconds, accepted, rejected)
    return best


def run(ctx: RunContext) -> BenchResult:
    # (GPUs per request, requests per interval): one node's producer sending its 8 GPUs, an agent batching 1000.
    sizes = [(8, 64), (1000, 2)] if ctx.quick else [(8, 250), (1000, 4)]
    repeats = 3 if ctx.quick else 5
    rows: list[tuple[str, ...]] = []
    verdicts: list[Verdict] = []
    data: dict[str, object] = {}
    for gpus_per_request, hosts in sizes:
        best = measure(gpus_per_request, hosts, repeats)
        reports = gpus_per_request * hosts
        taken_s, accepted, rejected = best["taken"]
        assert accepted, "the taken case takes points"
        assert not rejected, "the taken case takes every point"
        for how in CASES:
            seconds, took, refused = best[how]
            if how != "taken":
                assert refused, f"the {how} case refuses points"
                assert not took, f"the {how} case refuses every point"
            rows.append(
                (
                    f"{gpus_per_request} GPUs per request",
                    how,
                    fmt(seconds / reports * 1e6, 3),
                    fmt(seconds / taken_s, 3),
                    str(took),
                    str(refused),
                )
            )
            data[f"{gpus_per_request}x_{how}_us_per_report"] = seconds / reports * 1e6
            if how != "taken":
                verdicts.append(
                    Verdict(
                        f"refusing ({how}) costs at most taking, {gpus_per_request} GPUs per request",
                        seconds / taken_s,
                        1.0,
                        higher_is_better=False,
                        kind="ratio",
                    )
                )
    return BenchResult(
        "refusals",
        "Refusing points costs no more than taking them",
        doc_summary(__doc__),
        tables=(
            Table(
                "CPU per GPU report, in process (best of the repeats)",
                ("requests", "case", "us per report", "x taken", "points taken", "points refused"),
                rows,
            ),
        ),
        verdicts=verdicts,
        data=data,
    )
