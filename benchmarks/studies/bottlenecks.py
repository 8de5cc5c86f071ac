"""Bottlenecks: the report's naming of a job's biggest loss cause on simulated fleets with injected bottlenecks.

``SimulatedFleet.random_fleet`` places jobs on H100 SXM hosts (10% over-counting their FLOPs, 10% regressing,
10% switching bf16 <-> fp8, 5% idle, the rest dense) and gives 30% of the jobs' worth of the dense multi-GPU jobs
a ``Bottleneck`` in turn: an input pipeline that stalls 40% of every step (no kernel runs), exposed collectives
(SMs busy in communication kernels, NVLink ~73% of its peak), or memory-bound kernels (SMs busy, DRAM ~70%). Each
fleet runs through the demo's pipeline (the producer reading the simulator, OTLP on loopback, the collector's
finer loss split per window), the windows are summarised as the reports summarise them, and
``report.causes.bottleneck_of`` names each job's bottleneck or none. Right: an input-bound job named host side, a
communication-bound one communication, a memory-bound one memory. Wrong: any other name for them, or any name for
a job with no injected bottleneck that does not regress (dense, MoE, mixed precision, idle). Regressing jobs are
counted apart: the simulator's regression slows the whole step, engine with it, so the kernel-free time it leaves
is named host side when it is a quarter of the run or more; that is what the counters say, no error.

This holds by construction: the simulator draws each kind's engine, SM and DRAM activity and link traffic from
one fixed profile per kind (plus noise, stalls and throttling), and the report's bars (no_kernel 0.25, non_tensor
0.50, DRAM 0.50, NVLink 300 GB/s) sit between those profiles. So the study carries no verdict: what it measures is
that the chain from counters to sentence keeps the kinds apart through sampling, window means, the clamps of the
split and run means, and how far each group stays from the bars (the margins table). Real workloads spread wider;
the bars' reasons are in docs/ofu-method.md.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import attrs

from benchmarks.common import BenchResult, RunContext, Table, doc_summary, new_figure, save_figure
from otel_ofu import names
from otel_ofu.clock import ManualClock
from otel_ofu.sources.simulated import Bottleneck, JobSpec, ProfileKind, SimulatedFleet
from otel_ofu_collector.demo.command import demo_pipeline
from otel_ofu_collector.report import causes
from otel_ofu_collector.report.summary import JobSummary, summarize
from otel_ofu_collector.results import WindowReport

C = names.OfuLossCause
INTERVAL_S = 10.0
WINDOW_S = 60.0
EXPECTED = {
    Bottleneck.INPUT: causes.Kind.HOST,
    Bottleneck.COMMUNICATION: causes.Kind.COMMUNICATION,
    Bottleneck.MEMORY: causes.Kind.MEMORY,
}
HEALTHY = "no bottleneck"
REGRESSING = "regressing"


@attrs.frozen
class Named:
    """One job: what the simulation injected (its bottleneck, else HEALTHY or REGRESSING), what the report named
    (None: nothing), and the figures it decided from."""

    job_id: str
    group: str
    named: str | None
    no_kernel: float
    sm_idle: float
    non_tensor: float
    dram: float | None
    nvlink: float | None


def group_of(spec: JobSpec) -> str:
    if spec.bottleneck is not None:
        return spec.bottleneck
    return REGRESSING if spec.kind == ProfileKind.REGRESSING else HEALTHY


def fleet_reports(
    n_jobs: int, seed: int, seconds: float, hang_share: float = 0.0
) -> tuple[SimulatedFleet, list[WindowReport]]:
    """A random fleet with bottlenecks (and with ``hang_share``, hangs) through the producer, OTLP and the collector,
    as the demo runs its own."""
    clock = ManualClock(start_ns=1_800_000_000_000_000_000)
    fleet = SimulatedFleet.random_fleet(
        n_jobs,
        seed=seed,
        miscount_share=0.1,
        regression_share=0.1,
        mixed_share=0.1,
        idle_share=0.05,
        bottleneck_share=0.3,
        hang_share=hang_share,
        duration_s=seconds,
        clock=clock,
    )
    pipeline = demo_pipeline(fleet, clock, interval_s=INTERVAL_S, window_s=WINDOW_S)
    reports: list[WindowReport] = []
    pipeline.start()
    try:
        for _ in range(int(seconds // INTERVAL_S)):
            clock.advance(INTERVAL_S)
            reports.extend(pipeline.step().windows)
    finally:
        reports.extend(pipeline.stop())
    return fleet, reports


def judge(fleet: SimulatedFleet, jobs: Sequence[JobSummary]) -> list[Named]:
    specs = {spec.job_id: spec for spec in fleet.jobs}
    found = []
    for job in jobs:
        shares = job.loss.shares
        if shares is None:
            continue
        named = causes.bottleneck_of(job)
        found.append(
            Named(
                job.job_id,
                group_of(specs[job.job_id]),
                named.kind if named is not None else None,
                shares[C.NO_KERNEL],
                shares[C.SM_IDLE],
                shares[C.NON_TENSOR],
                job.loss.dram_active,
                job.loss.nvlink_bytes_per_s,
            )
        )
    return found


def _range(values: Sequence[float | None], scale: float = 1.0, digits: int = 2) -> str:
    known = [v / scale for v in values if v is not None]
    return f"{min(known):.{digits}f}-{max(known):.{digits}f}" if known else "-"


def run(ctx: RunContext) -> BenchResult:
    seeds, n_jobs, seconds = ((11,), 60, 1200.0) if ctx.quick else ((11, 12, 13), 150, 1800.0)
    judged: list[Named] = []
    for seed in seeds:
        fleet, reports = fleet_reports(n_jobs, seed, seconds)
        judged.extend(judge(fleet, summarize(reports).jobs))
    groups = (Bottleneck.INPUT, Bottleneck.COMMUNICATION, Bottleneck.MEMORY, HEALTHY, REGRESSING)
    rows = []
    counts: dict[str, dict[str, int]] = {}
    for group in groups:
        members = [n for n in judged if n.group == group]
        named = Counter(n.named or "nothing" for n in members)
        expected = EXPECTED.get(group)
        right = named[expected] if expected is not None else named["nothing"]
        counts[group] = {"jobs": len(members), "right": right, **named}
        rows.append(
            (
                group,
                str(len(members)),
                expected or ("nothing" if group == HEALTHY else "(no verdict)"),
                str(right) if group != REGRESSING else "-",
                ", ".join(f"{kind} {count}" for kind, count in sorted(named.items())),
            )
        )
    margins = [
        (
            group,
            _range([n.no_kernel for n in judged if n.group == group]),
            _range([n.sm_idle for n in judged if n.group == group]),
            _range([n.non_tensor for n in judged if n.group == group]),
            _range([n.dram for n in judged if n.group == group]),
            _range([n.nvlink for n in judged if n.group == group], 1e9, 0),
        )
        for group in groups
    ]
    bars = (
        f"bars: no_kernel {causes.NO_KERNEL_SHARE}, sm_idle {causes.SM_IDLE_SHARE}, non_tensor "
        f"{causes.NON_TENSOR_SHARE}, DRAM {causes.DRAM_BUSY}, NVLink {causes.NVLINK_BUSY / 1e9:.0f} GB/s"
    )
    tables = (
        Table(
            f"What the report named, {len(seeds)} fleet(s) of {n_jobs} jobs, {seconds / 60:.0f} min each",
            ("injected", "jobs", "right answer", "right", "named"),
            rows,
            note="'nothing': no bottleneck sentence. Holds by construction (see above): counts, no verdict.",
        ),
        Table(
            "Run shares of GPU time per group (min-max over its jobs) against the bars",
            ("injected", "no_kernel", "sm_idle", "non_tensor", "DRAM", "NVLink GB/s"),
            margins,
            note=bars,
        ),
    )
    return BenchResult(
        "bottlenecks",
        "Study: naming a job's bottleneck from its loss causes",
        doc_summary(__doc__),
        tables=tables,
        verdicts=(),
        data={
            "seeds": list(seeds),
            "jobs_per_fleet": n_jobs,
            "seconds": seconds,
            "counts": counts,
            "wrong": [attrs.asdict(n) for n in judged if n.group in EXPECTED and n.named != EXPECTED[n.group]],
            "healthy_named": [attrs.asdict(n) for n in judged if n.group == HEALTHY and n.named is not None],
        },
        plots=(_plot(ctx, judged),),
    )


def _plot(ctx: RunContext, judged: Sequence[Named]) -> str:
    figure, (left, right) = new_figure(width=10.0, ncols=2)
    markers = {Bottleneck.INPUT: "s", Bottleneck.COMMUNICATION: "^", Bottleneck.MEMORY: "D", HEALTHY: "o"}
    markers[REGRESSING] = "x"
    for group, marker in markers.items():
        members = [n for n in judged if n.group == group]
        left.scatter([n.no_kernel for n in members], [n.non_tensor for n in members], marker=marker, s=14, label=group)
        with_dram = [n for n in members if n.dram is not None]
        right.scatter([n.dram for n in with_dram], [n.non_tensor for n in with_dram], marker=marker, s=14, label=group)
    left.axvline(causes.NO_KERNEL_SHARE, color="grey", linestyle="--")
    left.axhline(causes.NON_TENSOR_SHARE, color="grey", linestyle="--")
    left.set_xlabel("no_kernel share of GPU time")
    left.set_ylabel("non_tensor share of GPU time")
    left.legend(fontsize=7)
    right.axvline(causes.DRAM_BUSY, color="grey", linestyle="--")
    right.axhline(causes.NON_TENSOR_SHARE, color="grey", linestyle="--")
    right.set_xlabel("DRAM activity (run mean)")
    right.set_ylabel("non_tensor share of GPU time")
    left.set_title("Host side vs off the tensor pipes")
    right.set_title("Memory vs the rest")
    return save_figure(figure, ctx, "bottlenecks")
