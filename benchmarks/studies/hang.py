"""Hangs: the collector's ``job.hang`` flag on simulated fleets with injected hangs, beside busy jobs of every kind.

``SimulatedFleet.random_fleet`` places jobs on H100 SXM hosts (10% over-counting their FLOPs, 10% regressing, 10%
switching bf16 <-> fp8, 5% idle, the rest dense) and gives 30% of the jobs' worth of its dense multi-GPU jobs a
``Bottleneck`` in turn: an input pipeline that stalls 40% of every step (the engine waits, no kernel), exposed
collectives (SMs busy in communication kernels, NVLink ~73% of its peak) or memory-bound kernels (SMs busy, DRAM ~70%).
Then 15% of the jobs that train (of any kind, with a bottleneck or not) hang at a random moment of 20-60% of the run:
from then on every GPU of the job spins in a collective that never completes (engine 0.99, SMs 0.02, no tensor, DRAM
or link traffic) to the end. Each fleet runs through the demo's pipeline (the producer reading the simulator, OTLP on
loopback, the collector's 60 s windows at the default thresholds: 3 windows, engine >= 0.5, SMs <= 0.25, tensor and
DRAM < 0.01, links < 1 GB/s).

Counted per job: a hang is **detected** when ``job.hang`` rose in a window ending after its onset; the delay is the
windows from its onset to the first window the flag was up. A **false positive** is ``job.hang`` up on a job that never
hangs (by kind: memory-, communication-, input-bound, the others), or on a hung job before its onset. Also counted:
hung jobs flagged as idle allocations (``job.gpus.idle``: a hang must not read as one), and the hang badput the
collector booked against the GPU time each hang held (the first, partly hung window is not stalled all window, so it
counts productive: the booked share is under 1 by up to a window of the hang).

Targets: every injected hang flagged, no job that never hangs flagged, no hung job flagged idle (default thresholds).
The simulator draws each kind's activity from one profile (plus noise, stalls and throttling) and the thresholds sit
far from every busy kind's, so these hold by construction of the profiles; what the study measures is that the chain
from counters to flag keeps them apart through sampling, window means and the 3-window run, on every seed, and how far
each kind stays from the bars. Real hangs and busy jobs spread wider: the thresholds are options.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from benchmarks.common import BenchResult, RunContext, Table, Verdict, doc_summary, new_figure, save_figure
from benchmarks.studies import bottlenecks
from otel_ofu import names
from otel_ofu.sources.simulated import JobSpec, ProfileKind, SimulatedFleet
from otel_ofu_collector.results import WindowReport

WINDOW_S = bottlenecks.WINDOW_S  # the fleets' windows, as the bottleneck study runs them
HANG_SHARE = 0.15
W_NS = int(WINDOW_S * 1e9)
HUNG = "hung"
OTHERS = "other busy jobs"


def group_of(spec: JobSpec) -> str:
    if spec.has_hang:
        return HUNG
    if spec.kind == ProfileKind.IDLE:
        return "idle"
    return spec.bottleneck or OTHERS


@attrs.frozen
class Judged:
    """One job: its group, whether and when the hang flag rose, and what the collector booked."""

    job_id: str
    group: str
    gpus: int
    flagged: bool  # job.hang up in a window ending after its onset (for a hung job), or ever (for the others)
    early: bool  # up on a hung job before its onset
    delay_windows: int | None  # from its onset's window to the first window the flag was up
    flagged_idle: bool  # job.gpus.idle up in a window after its onset (a hung job)
    hang_badput_s: float  # hang badput the collector booked
    hung_s: float  # GPU-seconds the simulated hang held (0: no hang)


def fleet_reports(n_jobs: int, seed: int, seconds: float) -> tuple[SimulatedFleet, list[WindowReport]]:
    """A random fleet with bottlenecks and hangs through the producer, OTLP and the collector."""
    return bottlenecks.fleet_reports(n_jobs, seed, seconds, hang_share=HANG_SHARE)


def judge(fleet: SimulatedFleet, reports: Sequence[WindowReport], seconds: float) -> list[Judged]:
    ordered = sorted(reports, key=lambda report: report.end_ns)
    found: list[Judged] = []
    for spec in fleet.jobs:
        onset_ns = None if spec.hang_at_s is None else fleet.start_ns + round(spec.hang_at_s * 1e9)
        windows = [(r.end_ns, job) for r in ordered for job in r.jobs if job.job_id == spec.job_id]
        up = [end for end, job in windows if job.flag(names.JOB_HANG)]
        after = [end for end in up if onset_ns is None or end > onset_ns]
        early = onset_ns is not None and any(end <= onset_ns for end in up)
        delay = None
        if onset_ns is not None and after:
            onset_window_end = (onset_ns // W_NS + 1) * W_NS
            delay = (after[0] - onset_window_end) // W_NS + 1
        idle = any(job.flag(names.JOB_GPUS_IDLE) and (onset_ns is not None and end > onset_ns) for end, job in windows)
        hang_badput = sum(
            job.goodput.badput_s.get(names.GoodputCause.HANG, 0.0) for _end, job in windows if job.goodput is not None
        )
        hung_s = 0.0 if spec.hang_at_s is None else len(spec.gpu_keys) * (seconds - spec.hang_at_s)
        found.append(
            Judged(
                spec.job_id,
                group_of(spec),
                len(spec.gpu_keys),
                bool(after),
                early,
                delay,
                bool(idle),
                hang_badput,
                hung_s,
            )
        )
    return found


def run(ctx: RunContext) -> BenchResult:
    seeds, n_jobs, seconds = ((21,), 40, 1200.0) if ctx.quick else ((21, 22, 23), 120, 1800.0)
    judged: list[Judged] = []
    for seed in seeds:
        fleet, reports = fleet_reports(n_jobs, seed, seconds)
        judged.extend(judge(fleet, reports, seconds))
    hung = [j for j in judged if j.group == HUNG]
    busy = [j for j in judged if j.group != HUNG]
    detected = [j for j in hung if j.flagged]
    false_positives = [j for j in busy if j.flagged] + [j for j in hung if j.early]
    idle_flagged = [j for j in hung if j.flagged_idle]
    delays = sorted(j.delay_windows for j in detected if j.delay_windows is not None)
    shares = [j.hang_badput_s / j.hung_s for j in hung if j.hung_s > 0]
    groups = (HUNG, "memory", "communication", "input", OTHERS, "idle")
    rows = []
    for group in groups:
        members = [j for j in judged if j.group == group]
        if not members:
            continue
        flagged = sum(j.flagged for j in members)
        rows.append(
            (
                group,
                str(len(members)),
                str(flagged) if group == HUNG else "-",
                str(len(members) - flagged) if group == HUNG else "-",
                str(sum(j.early for j in members)) if group == HUNG else str(flagged),
                str(sum(j.flagged_idle for j in members)) if group == HUNG else "-",
            )
        )
    timing = [
        (
            "windows from the onset's window to the flag (3 needed)",
            f"{delays[0]}-{delays[-1]}" if delays else "-",
            f"{sum(delays) / len(delays):.2f}" if delays else "-",
        ),
        (
            "hang badput booked / GPU time the hang held",
            f"{min(shares):.3f}-{max(shares):.3f}" if shares else "-",
            f"{sum(shares) / len(shares):.3f}" if shares else "-",
        ),
    ]
    tables = (
        Table(
            f"Hangs found and false positives, {len(seeds)} fleet(s) of {n_jobs} jobs, {seconds / 60:.0f} min each "
            f"({len(hung)} hung, {len(busy)} that never hang)",
            ("jobs", "n", "flagged", "missed", "false positives", "flagged idle"),
            rows,
            note="false positives: job.hang up on a job that never hangs, or on a hung job before its onset. "
            "memory, communication, input: the injected bottlenecks; other busy jobs: dense, MoE, regressing, "
            "mixed precision.",
        ),
        Table(
            "How soon, and how much of the hang's time is booked as hang badput",
            ("measure", "min-max", "mean"),
            timing,
            note="The window the hang begins in is partly busy (not stalled all window) and counts productive; "
            "every later one is the job's whole GPU time of hang badput, from the first, before the flag rises.",
        ),
    )
    verdicts = (
        Verdict(
            "every injected hang flagged (default thresholds)",
            len(detected) / len(hung) * 100 if hung else 0.0,
            100.0,
            "%",
            higher_is_better=True,
        ),
        Verdict(
            "jobs that never hang flagged (memory-, communication-, input-bound and the rest), or hung ones early",
            float(len(false_positives)),
            0.0,
            "jobs",
        ),
        Verdict("hung jobs flagged as idle allocations", float(len(idle_flagged)), 0.0, "jobs"),
    )
    return BenchResult(
        "hang",
        "Study: hang detection",
        doc_summary(__doc__),
        tables=tables,
        verdicts=verdicts,
        data={
            "seeds": list(seeds),
            "jobs_per_fleet": n_jobs,
            "seconds": seconds,
            "hung": len(hung),
            "detected": len(detected),
            "false_positives": [attrs.asdict(j) for j in false_positives],
            "hung_flagged_idle": [j.job_id for j in idle_flagged],
            "delays_windows": delays,
            "hang_badput_shares": shares,
            "by_group": {group: sum(1 for j in judged if j.group == group) for group in groups},
        },
        plots=(_plot(ctx, hung),),
    )


def _plot(ctx: RunContext, hung: Sequence[Judged]) -> str:
    figure, axis = new_figure(6.0, 4.0)
    if hung:
        axis.scatter([j.hung_s / 3600 for j in hung], [j.hang_badput_s / 3600 for j in hung], s=14, label="hung jobs")
        top = max(j.hung_s / 3600 for j in hung) or 1.0
        axis.plot([0, top], [0, top], color="grey", linewidth=0.8, label="all of it")
    axis.set_xlabel("GPU-h the simulated hang held")
    axis.set_ylabel("hang badput booked (GPU-h)")
    axis.set_title("Hang badput against the hang")
    axis.legend(fontsize=7)
    return save_figure(figure, ctx, "hang")
