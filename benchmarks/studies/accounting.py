"""Study: every GPU-second billed once, over random fleets, in one collector and across shards merged.

Each fleet is drawn from a seed: 3-8 GPUs, each a whole H100, a MIG slice of one (1g.10gb, 3g.40gb) or an MI300X
compute partition (CPX), reporting at its own interval (1-60 s) from its own start (a random phase) to its own end,
some intervals without OFU (``gpu.ofu.unmeasured``), some GPUs moving to another job at a moment that is no window
boundary, each with an energy counter begun at its start and a constant power. Windows of 5, 10 or 60 s, shorter and
longer than the intervals; lateness of 0-60 s, so parts of long intervals land in windows already closed (carried).
The points go, in time order, to one collector and to 1-4 shards routed by ``job.id`` (as the OpenTelemetry
Collector's loadbalancing exporter does: a GPU that moves job may move shard mid-window), whose partial windows are
merged over OTLP. Each job here is one GPU's (``GPU-n-a``, ``GPU-n-b`` after its move), so job outputs are per GPU.

What must hold, each a violation where it does not (the target: none):

- per GPU, its GPU time over the run (its jobs' ``job.gpu_time``) equals its share x the wall time it reported, and
  its energy the counter's delta over that time (power x seconds), in the one collector and in the merge;
- every window: the fleet's lost GPU time by cause equals the sum over its jobs, and its GPU-seconds (``fleet.gpus``
  x the window) the sum of its jobs' GPU time; each job's OFU plus its loss shares is 1;
- every window: each group's percentiles over GPU capacity equal numpy's weighted quantile (inverted CDF) of the
  GPUs' window OFU weighed by share x measured seconds, computed here from the points (where nothing is carried);
- the merge tier's windows equal the one collector's: job outputs, GPU equivalents, and percentiles within the
  capacity histogram's relative error bound.

It holds by construction only in the sense every accounting identity does: the arithmetic is the windows', the
expected figures are this module's own, from the points as sent.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from collections.abc import Iterable

import attrs
import numpy as np
from opentelemetry.exporter.otlp.proto.common._internal.metrics_encoder import encode_metrics
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from benchmarks.common import BenchResult, RunContext, Table, Verdict, doc_summary
from otel_ofu import gpu_share, names
from otel_ofu_collector.aggregation.merge import MergeAggregator
from otel_ofu_collector.aggregation.windows import Aggregator
from otel_ofu_collector.config import AggregatorConfig
from otel_ofu_collector.otlp.encode import reports_to_metrics_data
from otel_ofu_collector.otlp.partials import partials_from_request
from otel_ofu_collector.results import WindowReport
from otel_ofu_collector.stats.exphist import relative_error_bound

S = 1_000_000_000
T0 = 29_000_000 * 60 * S  # a boundary of every window size drawn
H100 = "NVIDIA H100 80GB HBM3"
MI300X = "AMD Instinct MI300X OAM"
# (model, MIG profile, compute partition) of the GPUs drawn: whole GPUs and partitions of them.
KINDS = ((H100, None, None), (H100, "1g.10gb", None), (H100, "3g.40gb", None), (MI300X, None, "cpx"))
TOLERANCE = 1e-9  # relative: sums of the same seconds in another order


@attrs.frozen
class Point:
    gpu: str
    job: str
    start_ns: int
    end_ns: int
    ofu: float | None  # None: unmeasured
    energy_j: float  # the GPU's energy counter at the point's end, since its start
    power_w: float
    identity: dict[str, str]


@attrs.frozen
class Fleet:
    points: tuple[Point, ...]
    shares: dict[str, float]  # by GPU
    reported_s: dict[str, float]  # by GPU: its wall time reported
    power_w: dict[str, float]
    window_s: int
    lateness_s: int
    shards: int


def draw(seed: int) -> Fleet:
    """A random fleet (see the module doc)."""
    rng = random.Random(seed)
    window_s = rng.choice((5, 10, 60))
    lateness_s = rng.choice((0, 5, 60))
    horizon_ns = 6 * 60 * S
    points: list[Point] = []
    shares: dict[str, float] = {}
    reported: dict[str, float] = {}
    power: dict[str, float] = {}
    for n in range(rng.randint(3, 8)):
        gpu = f"GPU-{n}"
        model, mig, partition = rng.choice(KINDS)
        shares[gpu] = gpu_share.gpu_share(model, mig, partition)
        interval = rng.randint(1, 60) * S
        start = T0 + rng.randrange(0, 120 * S, S // 10)
        end = start + interval * rng.randint(2, max(2, horizon_ns // interval // 2))
        moves_at = start + rng.randrange(1, end - start) if rng.random() < 0.5 else None
        unmeasured = rng.choice((0.0, 0.0, 0.3))
        power[gpu] = rng.uniform(60.0, 700.0) * shares[gpu]
        level = rng.uniform(0.05, 0.7)
        at = start
        while at < end:
            until = min(at + interval, end)
            job = f"{gpu}-b" if moves_at is not None and until > moves_at else f"{gpu}-a"
            identity = {names.HOST_NAME: f"node-{n // 4}", names.HW_ID: gpu, names.HW_MODEL: model, names.JOB_ID: job}
            if mig is not None:
                identity[names.GPU_MIG_PROFILE] = mig
            if partition is not None:
                identity[names.GPU_COMPUTE_PARTITION] = partition
            ofu = None if rng.random() < unmeasured else min(1.0, max(0.0, rng.gauss(level, 0.05)))
            points.append(Point(gpu, job, at, until, ofu, power[gpu] * (until - start) / S, power[gpu], identity))
            at = until
        reported[gpu] = shares[gpu] * (end - start) / S
    points.sort(key=lambda point: point.end_ns)
    return Fleet(tuple(points), shares, reported, power, window_s, lateness_s, rng.randint(1, 4))


def _feed(aggregator: Aggregator, point: Point, series_start: int) -> None:
    key = f"{point.identity[names.HOST_NAME]}|{point.gpu}"
    if point.ofu is None:
        aggregator.add_unmeasured(key, point.start_ns, point.end_ns, point.identity)
    else:
        aggregator.add_ofu(key, point.ofu, point.start_ns, point.end_ns, point.identity)
    power = {names.GPU_POWER.name: point.power_w}
    aggregator.add_gpu_inputs(key, point.start_ns, point.end_ns, point.identity, power, {})
    counters = {names.GPU_ENERGY.name: point.energy_j}
    aggregator.add_gpu_counters(key, series_start, point.end_ns, point.identity, counters)


def run_fleet(fleet: Fleet) -> tuple[list[WindowReport], list[WindowReport]]:
    """(the one collector's windows, the merge tier's) for the fleet's points in time order."""
    config = AggregatorConfig(window_s=fleet.window_s, lateness_s=fleet.lateness_s, stale_after_s=3600)
    single = Aggregator(config)
    shards = [Aggregator(attrs.evolve(config, partials=True)) for _ in range(fleet.shards)]
    merge = MergeAggregator(config)
    starts = {point.gpu: point.start_ns for point in reversed(fleet.points)}  # each GPU's first: its series start
    one: list[WindowReport] = []
    merged: list[WindowReport] = []

    def flush(now: int, final: bool = False) -> None:
        one.extend(single.close_all() if final else single.flush(now))
        for index, shard in enumerate(shards):
            for report in shard.close_all() if final else shard.flush(now):
                for partial in _over_otlp(report, f"shard-{index}"):
                    merge.add_partial(partial)
        merged.extend(merge.close_all() if final else merge.flush(now))

    for point in fleet.points:  # each point arrives at its end, then time moves on
        _feed(single, point, starts[point.gpu])
        _feed(shards[hash_of(point.job) % fleet.shards], point, starts[point.gpu])
        flush(point.end_ns)
    flush(0, final=True)
    return one, merged


def hash_of(job: str) -> int:
    return sum(map(ord, job)) * 2654435761 % 2**32


def _over_otlp(report: WindowReport, shard: str) -> list:  # type: ignore[type-arg]
    data = reports_to_metrics_data(
        [report], resource_attributes={names.SERVICE_INSTANCE_ID: shard}, include_partials=True
    )
    return partials_from_request(ExportMetricsServiceRequest.FromString(encode_metrics(data).SerializeToString()))


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=TOLERANCE, abs_tol=1e-9)


def violations(seed: int) -> list[str]:
    """What does not hold for the fleet of ``seed`` (empty: every GPU-second billed once)."""
    fleet = draw(seed)
    one, merged = run_fleet(fleet)
    found: list[str] = []
    for name, reports in (("one collector", one), ("merge", merged)):
        found += [f"{name}: {problem}" for problem in _per_gpu(fleet, reports)]
        found += [f"{name}: {problem}" for problem in _per_window(reports)]
    if fleet.lateness_s >= 60:  # nothing carried: the points say each window's OFU and seconds directly
        found += [f"one collector: {problem}" for problem in _percentiles(fleet, one)]
    found += [f"merge vs one: {problem}" for problem in _merged_equal(one, merged)]
    return [f"seed {seed}: {problem}" for problem in found]


def _per_gpu(fleet: Fleet, reports: Iterable[WindowReport]) -> list[str]:
    seconds: dict[str, float] = defaultdict(float)
    energy: dict[str, float] = defaultdict(float)
    for report in reports:
        for job in report.jobs:
            if job.loss is None:
                continue
            gpu = job.job_id.rsplit("-", 1)[0]
            seconds[gpu] += job.loss.gpu_time_s
            energy[gpu] += job.loss.energy_j or 0.0
    problems = []
    for gpu, reported in fleet.reported_s.items():
        if not _close(seconds[gpu], reported):
            problems.append(f"{gpu}: {seconds[gpu]:.9f} GPU-s billed, {reported:.9f} reported")
        wall = reported / fleet.shares[gpu]
        if not _close(energy[gpu], fleet.power_w[gpu] * wall):
            problems.append(f"{gpu}: {energy[gpu]:.6f} J billed, the counter counted {fleet.power_w[gpu] * wall:.6f}")
    return problems


def _per_window(reports: Iterable[WindowReport]) -> list[str]:
    problems = []
    for report in reports:
        width = (report.end_ns - report.start_ns) / S
        jobs = [job for job in report.jobs if job.loss is not None]
        lost: dict[str, float] = defaultdict(float)
        for job in jobs:
            assert job.loss is not None
            for cause, value in job.loss.lost_s.items():
                lost[cause] += value
            if job.ofu is not None and not _close(job.ofu + sum(job.loss.shares.values()), 1.0):
                problems.append(f"window {report.end_ns}: {job.job_id}'s OFU and shares sum to != 1")
        for cause, value in report.fleet.loss.lost_s.items():
            if not _close(value, lost[cause]):
                problems.append(f"window {report.end_ns}: fleet lost {cause} {value} != its jobs' {lost[cause]}")
        fleet_s = sum(group.gpus for group in report.groups) * width
        jobs_s = sum(job.loss.gpu_time_s for job in jobs if job.loss is not None)
        if not _close(fleet_s, jobs_s):
            problems.append(f"window {report.end_ns}: fleet {fleet_s} GPU-s != its jobs' {jobs_s}")
    return problems


def _percentiles(fleet: Fleet, reports: Iterable[WindowReport]) -> list[str]:
    width = fleet.window_s * S
    cells: dict[int, dict[tuple[str, str, str], list[float]]] = defaultdict(lambda: defaultdict(lambda: [0.0, 0.0]))
    for point in fleet.points:
        if point.ofu is None:
            continue
        window = (point.start_ns // width) * width
        while window < point.end_ns:
            overlap = min(point.end_ns, window + width) - max(point.start_ns, window)
            if overlap > 0:
                cell = cells[window + width][(point.identity[names.HW_MODEL], point.gpu, point.job)]
                cell[0] += point.ofu * overlap
                cell[1] += overlap
            window += width
    problems = []
    for report in reports:
        for group in report.groups:
            model = group.attributes.get(names.HW_MODEL)
            found = [
                (ofu_sum / weight, round(fleet.shares[gpu] * weight / 1e3))  # GPU-microseconds, as the windows count
                for (m, gpu, _j), (ofu_sum, weight) in cells[report.end_ns].items()
                if m == model
            ]
            if not found:
                continue
            values, weights = zip(*sorted(found), strict=True)
            for q, value in group.quantiles.items():
                expected = float(np.quantile(values, q, weights=weights, method="inverted_cdf"))
                if not math.isclose(value, expected, rel_tol=1e-12, abs_tol=1e-12):
                    problems.append(f"window {report.end_ns} {model} p{q}: {value} != numpy's {expected}")
    return problems


def _merged_equal(one: list[WindowReport], merged: list[WindowReport]) -> list[str]:
    problems = []
    if [r.end_ns for r in one] != [r.end_ns for r in merged]:
        return ["the windows differ"]
    for mine, theirs in zip(one, merged, strict=True):
        if [job.job_id for job in mine.jobs] != [job.job_id for job in theirs.jobs]:
            problems.append(f"window {mine.end_ns}: jobs differ")
            continue
        for a, b in zip(mine.jobs, theirs.jobs, strict=True):
            pairs = [(a.ofu, b.ofu), (a.gpus, b.gpus)]
            if a.loss is not None and b.loss is not None:
                pairs += [(a.loss.gpu_time_s, b.loss.gpu_time_s), (a.loss.energy_j, b.loss.energy_j)]
            for x, y in pairs:
                if (x is None) != (y is None) or (x is not None and y is not None and not _close(x, y)):
                    problems.append(f"window {mine.end_ns}: {a.job_id} {x} != {y}")
        groups = {tuple(sorted(g.attributes.items())): g for g in theirs.groups}
        for group in mine.groups:
            other = groups.get(tuple(sorted(group.attributes.items())))
            if other is None or not _close(group.gpus, other.gpus):
                problems.append(f"window {mine.end_ns}: group GPUs differ")
                continue
            bound = relative_error_bound(other.capacity.scale) if other.capacity is not None else 0.01
            for q, value in group.quantiles.items():
                if abs(other.quantiles.get(q, -1.0) - value) > bound * value * (1 + 1e-9) + 1e-12:
                    problems.append(f"window {mine.end_ns}: p{q} merged {other.quantiles.get(q)} vs {value}")
    return problems


def run(ctx: RunContext) -> BenchResult:
    fleets = 40 if ctx.quick else 200
    found: list[str] = []
    for seed in range(fleets):
        found += violations(seed)
    rows = [(str(fleets), str(len(found)), found[0] if found else "")]
    return BenchResult(
        "accounting",
        "Study: every GPU-second billed once over random fleets",
        doc_summary(__doc__),
        tables=(Table("Random fleets", ("fleets", "violations", "first"), rows),),
        verdicts=(
            Verdict("accounting violations over random fleets (one collector and shards merged)", len(found), 0),
        ),
        data={"fleets": fleets, "violations": found[:20]},
    )
