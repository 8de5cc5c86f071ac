"""Detection: the collector's miscount and regression flags on a simulated fleet with injected faults.

``SimulatedFleet.random_fleet`` places hundreds of jobs on H100 SXM hosts; 20% over-count their FLOPs in
the framework by 1.2-3x (MFU reported = true MFU x factor) and 20% regress by 1.5-3x at 30-60% of the run,
the rest are healthy (dense training, some switching bf16 <-> fp8). The fleet is read every 10 s, each
reading turned into ``gpu.ofu`` by ``gpu_values.compute`` (point-sampled clock, as NVML/DCGM give it), and
the points, with each job's reported MFU per interval, go through the collector's ``Aggregator``
(60 s windows) once per threshold setting. A job counts as detected when its flag rose in any window
(a regression only at or after its injected onset); a false positive is a flag on a job without that
fault, or a regression flag raised before the job's injected onset. Target: every miscount that puts
reported MFU at 1.5x its OFU or more and every regression >= 2x flagged, and no healthy job nor any flag
before its onset, at the default thresholds (``--miscount-ratio 1.5``, ``--regression-factor 2.0``).

Note on the miscount threshold: the flag compares reported MFU with OFU, and a healthy job's true MFU is
below its OFU (MFU ignores recompute and padding; the simulator's MFU/OFU efficiency is 0.93-0.99), so an
over-count by a factor f shows as MFU/OFU = f x efficiency: a 1.5x over-count as 1.40-1.49, under a 1.5
ratio. The target therefore counts the miscounts whose reported MFU is at least 1.5x their OFU (f x
efficiency >= 1.5, from the job's spec, before noise): what a ratio of MFU to OFU can see. Over-counts of
1.5x or more that their efficiency puts under the ratio are not dropped: they have their own column and
are listed with their MFU/OFU. At the default ratio they are undetectable by definition: flagging them
would take a lower ratio, or knowing each job's efficiency, which the collector does not.

Stragglers and idle allocations: a second fleet of the same kind, some of whose jobs are allocated but
idle (``job.gpus.idle``), and in which one GPU of some multi-GPU dense jobs is power-capped (to
``STRAGGLER_CAP_W``) from a random moment of the run: a straggler at 0.55-0.75x the median OFU of its
job's other GPUs. Counted per GPU: a straggler is detected when ``gpu.straggler`` rose on it at or after
its cap began; any flag on another GPU, or on it before its cap, is a false positive. Target: every
straggler and idle allocation found, no healthy GPU or job flagged, at the defaults
(``--straggler-factor 1.25``, 3 windows; 3 idle windows).

Fleet correlation: Pearson r across jobs of their run-mean OFU vs run-mean MFU, over all jobs, without
the injected miscounts, and without the jobs the collector flagged (published: r 0.53 over all jobs,
0.78 after excluding known miscounts).
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Mapping, Sequence

import attrs

from benchmarks.common import BenchResult, RunContext, Table, Verdict, doc_summary, fmt, new_figure, pct, save_figure
from otel_ofu import gpu_values, names, ofu_math
from otel_ofu.clock import ManualClock
from otel_ofu.sources.simulated import GpuFault, JobSpec, ProfileKind, SimulatedFleet
from otel_ofu_collector.aggregation.windows import Aggregator
from otel_ofu_collector.config import AggregatorConfig
from otel_ofu_collector.detectors.flops_miscount import RATIO as MISCOUNT_RATIO
from otel_ofu_collector.detectors.regression import FACTOR as REGRESSION_FACTOR
from otel_ofu_collector.results import WindowReport
from otel_ofu_collector.stats.comoments import CoMoments

INTERVAL_S = 10.0
MISCOUNT_RATIOS = (1.2, 1.3, 1.4, 1.5, 1.75, 2.0)
REGRESSION_FACTORS = (1.25, 1.5, 1.75, 2.0, 2.5, 3.0)  # paired with the ratios: one aggregator per pair
DEFAULT = AggregatorConfig()


@attrs.frozen
class OfuPoint:
    key: str
    value: float
    start_ns: int
    end_ns: int
    identity: Mapping[str, str]


@attrs.frozen
class Step:
    now_ns: int
    ofu: tuple[OfuPoint, ...]
    mfu: tuple[tuple[str, float, Mapping[str, str]], ...]


@attrs.frozen
class Outcome:
    """Per job: whether each flag rose, and the job's run-mean OFU and MFU over its windows."""

    miscount: dict[str, bool]
    regression: dict[str, bool]
    mean_ofu: dict[str, float]
    mean_mfu: dict[str, float]
    fleet_r: float | None
    early_regression: dict[str, bool] = attrs.field(factory=dict)  # flagged before its injected onset


def simulate(fleet: SimulatedFleet, clock: ManualClock, seconds: float) -> list[Step]:
    steps: list[Step] = []
    mfu_jobs = [job for job in fleet.jobs if job.reports_mfu]
    for _ in range(round(seconds / INTERVAL_S)):
        start = clock()
        clock.advance(INTERVAL_S)
        end = clock()
        ofu_points: list[OfuPoint] = []
        for reading in fleet.read().readings:
            precision = reading.gpu.hints.get(names.GPU_PRECISION)
            try:
                values = gpu_values.compute(reading, precision=precision)
            except ofu_math.InvalidReading:
                continue
            identity = {
                names.JOB_ID: reading.gpu.hints[names.JOB_ID],
                names.HW_MODEL: reading.gpu.model,
                names.GPU_PRECISION: precision or "unknown",
            }
            ofu_points.append(OfuPoint(reading.gpu.key, values.ofu, reading.start_ns, reading.end_ns, identity))
        mfu_points = []
        for job in mfu_jobs:
            mfu = fleet.reported_mfu(job.job_id, start, end)
            if mfu is not None:
                mfu_points.append((job.job_id, mfu, {names.JOB_ID: job.job_id}))
        steps.append(Step(end, tuple(ofu_points), tuple(mfu_points)))
    return steps


def evaluate(steps: Sequence[Step], config: AggregatorConfig, fleet: SimulatedFleet) -> Outcome:
    aggregator = Aggregator(config)
    miscount: dict[str, bool] = {}
    regression: dict[str, bool] = {}
    early: dict[str, bool] = {}
    ofus: dict[str, list[float]] = {}
    mfus: dict[str, list[float]] = {}
    fleet_r: float | None = None
    jobs = {job.job_id: job for job in fleet.jobs}

    def collect(reports: Sequence[object]) -> None:
        nonlocal fleet_r
        for report in reports:
            fleet_r = report.fleet.correlation  # type: ignore[attr-defined]
            for job in report.jobs:  # type: ignore[attr-defined]
                spec = jobs[job.job_id]
                miscount[job.job_id] = miscount.get(job.job_id, False) or bool(job.flops_miscount)
                onset_ns = fleet.start_ns + round((spec.regression_at_s or 0.0) * 1e9)
                counts = not spec.has_regression or report.end_ns > onset_ns  # type: ignore[attr-defined]
                regression[job.job_id] = regression.get(job.job_id, False) or (bool(job.regression) and counts)
                # A flag raised before the fault begins is a false positive, not a detection.
                if bool(job.regression) and not counts:
                    early[job.job_id] = True
                if job.ofu is not None and job.mfu is not None:
                    ofus.setdefault(job.job_id, []).append(job.ofu)
                    mfus.setdefault(job.job_id, []).append(job.mfu)

    for step in steps:
        for p in step.ofu:
            aggregator.add_ofu(p.key, p.value, p.start_ns, p.end_ns, p.identity)
        for job_id, value, identity in step.mfu:
            aggregator.add_mfu(job_id, value, step.now_ns, identity)
        collect(aggregator.flush(step.now_ns))
    collect(aggregator.close_all())
    return Outcome(
        miscount,
        regression,
        {job: statistics.fmean(v) for job, v in ofus.items()},
        {job: statistics.fmean(v) for job, v in mfus.items()},
        fleet_r,
        early,
    )


@attrs.frozen
class MiscountGroups:
    """The injected miscounts, by what the flag can see of them (from each job's spec, before noise)."""

    target: list[JobSpec]  # reported MFU at least ``ratio`` x OFU: over-count x MFU/OFU efficiency >= ratio
    under_ratio: list[JobSpec]  # over-counted by ``ratio`` or more, but their efficiency puts MFU/OFU under it
    below: list[JobSpec]  # over-counted by less than ``ratio``


def miscount_groups(jobs: Sequence[JobSpec], ratio: float = DEFAULT.flag(MISCOUNT_RATIO)) -> MiscountGroups:
    miscounted = [j for j in jobs if j.has_miscount]
    return MiscountGroups(
        target=[j for j in miscounted if j.mfu_ratio >= ratio],
        under_ratio=[j for j in miscounted if j.miscount_factor >= ratio > j.mfu_ratio],
        below=[j for j in miscounted if j.miscount_factor < ratio],
    )


def rate(flags: Mapping[str, bool], jobs: Sequence[JobSpec]) -> float | None:
    if not jobs:
        return None
    return sum(flags.get(job.job_id, False) for job in jobs) / len(jobs)


def pearson(outcome: Outcome, jobs: Sequence[JobSpec]) -> float | None:
    pairs = [(outcome.mean_ofu[j.job_id], outcome.mean_mfu[j.job_id]) for j in jobs if j.job_id in outcome.mean_mfu]
    return CoMoments.of(pairs).pearson()


def run(ctx: RunContext) -> BenchResult:
    n_jobs, seconds = (60, 2400.0) if ctx.quick else (300, 3600.0)
    clock = ManualClock()
    fleet = SimulatedFleet.random_fleet(
        n_jobs, seed=42, miscount_share=0.2, regression_share=0.2, clock=clock, duration_s=seconds
    )
    steps = simulate(fleet, clock, seconds)
    miscounted = [j for j in fleet.jobs if j.has_miscount]
    regressing = [j for j in fleet.jobs if j.has_regression]
    healthy = [j for j in fleet.jobs if not j.has_miscount and not j.has_regression]
    groups = miscount_groups(miscounted)
    m_hi, m_under, m_lo = groups.target, groups.under_ratio, groups.below
    m_factor = [*m_hi, *m_under]
    r_hi = [j for j in regressing if j.regression_factor >= 2.0]
    r_lo = [j for j in regressing if j.regression_factor < 2.0]
    rows: list[tuple[str, ...]] = []
    sweep: list[dict[str, float | None]] = []
    default_outcome: Outcome | None = None
    for ratio, factor in zip(MISCOUNT_RATIOS, REGRESSION_FACTORS, strict=True):
        config = AggregatorConfig(flag_settings={"miscount_ratio": ratio, "regression_factor": factor})
        outcome = evaluate(steps, config, fleet)
        if ratio == DEFAULT.flag(MISCOUNT_RATIO) and factor == DEFAULT.flag(REGRESSION_FACTOR):
            default_outcome = outcome
        entry: dict[str, float | None] = {
            "miscount_ratio": ratio,
            "regression_factor": factor,
            "miscount_detected_mfu_ge_1_5x_ofu": rate(outcome.miscount, m_hi),
            "miscount_detected_ge_1_5_under_ratio": rate(outcome.miscount, m_under),
            "miscount_detected_ge_1_5": rate(outcome.miscount, m_factor),
            "miscount_detected_lt_1_5": rate(outcome.miscount, m_lo),
            "miscount_false_positive": rate(outcome.miscount, [j for j in fleet.jobs if not j.has_miscount]),
            "regression_detected_ge_2": rate(outcome.regression, r_hi),
            "regression_detected_lt_2": rate(outcome.regression, r_lo),
            "regression_false_positive": rate(
                {
                    j.job_id: outcome.regression.get(j.job_id, False) or outcome.early_regression.get(j.job_id, False)
                    for j in fleet.jobs
                },
                [j for j in fleet.jobs if not j.has_regression or outcome.early_regression.get(j.job_id)],
            ),
            "regression_flagged_before_onset": float(sum(outcome.early_regression.values())),
        }
        sweep.append(entry)
        marker = " (default)" if outcome is default_outcome else ""
        rows.append(
            (
                f"{ratio}{marker}",
                pct(entry["miscount_detected_mfu_ge_1_5x_ofu"], 0),
                pct(entry["miscount_detected_ge_1_5_under_ratio"], 0),
                pct(entry["miscount_detected_lt_1_5"], 0),
                pct(entry["miscount_false_positive"], 1),
                f"{factor}{marker}",
                pct(entry["regression_detected_ge_2"], 0),
                pct(entry["regression_detected_lt_2"], 0),
                pct(entry["regression_false_positive"], 1),
            )
        )
    assert default_outcome is not None
    d = default_outcome
    healthy_flagged = [j.job_id for j in healthy if d.miscount.get(j.job_id) or d.regression.get(j.job_id)]
    early_flagged = sorted(job for job, flagged in d.early_regression.items() if flagged)
    missed_miscounts = sorted(
        (round(j.miscount_factor, 2), round(j.mfu_ratio, 3)) for j in m_hi if not d.miscount.get(j.job_id)
    )
    under_ratio = sorted(
        (round(j.miscount_factor, 2), round(j.mfu_ratio, 3), bool(d.miscount.get(j.job_id))) for j in m_under
    )
    factor_flagged = sum(bool(d.miscount.get(j.job_id)) for j in m_factor)
    missed_regressions = sorted(round(j.regression_factor, 2) for j in r_hi if not d.regression.get(j.job_id))
    flagged = {j for j, v in d.miscount.items() if v}
    r_all = pearson(d, fleet.jobs)
    r_clean = pearson(d, [j for j in fleet.jobs if not j.has_miscount])
    r_unflagged = pearson(d, [j for j in fleet.jobs if j.job_id not in flagged])
    corr_rows = [
        ("all jobs", str(len(d.mean_mfu)), fmt(r_all), "0.53"),
        (
            "without injected miscounts",
            str(sum(1 for j in fleet.jobs if not j.has_miscount and j.job_id in d.mean_mfu)),
            fmt(r_clean),
            "0.78",
        ),
        ("without collector-flagged jobs", str(sum(1 for j in d.mean_mfu if j not in flagged)), fmt(r_unflagged), "-"),
        ("collector's fleet.ofu_mfu.correlation (last window, all)", "-", fmt(d.fleet_r), "-"),
    ]
    tables = (
        Table(
            f"Detection and false-positive rates ({n_jobs} jobs: {len(miscounted)} miscounted, "
            f"{len(regressing)} regressing, "
            f"{len(healthy)} healthy; {seconds / 60:.0f} min, 10 s reads, 60 s windows)",
            (
                "miscount ratio",
                f"miscount, MFU >= 1.5x OFU ({len(m_hi)})",
                f">= 1.5x, MFU < 1.5x OFU ({len(m_under)})",
                f"1.2-1.5x ({len(m_lo)})",
                "false positive",
                "regression factor",
                f"regression >= 2x ({len(r_hi)})",
                f"1.5-2x ({len(r_lo)})",
                "false positive",
            ),
            rows,
            note="Each row is one Aggregator over the same points with that pair of thresholds. "
            f"At the defaults: healthy jobs flagged {len(healthy_flagged)}; "
            "miscounts with MFU >= 1.5x OFU missed (factor, MFU/OFU): "
            f"{missed_miscounts or 'none'}; over-counts >= 1.5x under the ratio by their MFU/OFU efficiency, "
            f"undetectable at 1.5 by definition (factor, MFU/OFU, flagged): {under_ratio or 'none'}; "
            f"all over-counts >= 1.5x: {factor_flagged} of {len(m_factor)} flagged; "
            f"regressions >= 2x missed (factor): {missed_regressions or 'none'}.",
        ),
        Table(
            "Fleet OFU-MFU correlation across jobs (run means)",
            ("jobs", "n", "Pearson r", "published"),
            corr_rows,
        ),
    )
    verdicts = (
        Verdict(
            "every injected miscount with reported MFU >= 1.5x its OFU flagged (default thresholds)",
            (rate(d.miscount, m_hi) or 0.0) * 100,
            100.0,
            "%",
            higher_is_better=True,
        ),
        # The target as first stated, by the injected factor alone: kept, so that what a ratio of MFU to OFU
        # cannot see stays in view (a known miss in the full run, see benchmarks/known_misses.json).
        Verdict(
            "every injected miscount >= 1.5x flagged, whatever its MFU/OFU (default thresholds)",
            (rate(d.miscount, m_factor) or 0.0) * 100,
            100.0,
            "%",
            higher_is_better=True,
        ),
        Verdict(
            "every injected regression >= 2x flagged (default thresholds)",
            (rate(d.regression, r_hi) or 0.0) * 100,
            100.0,
            "%",
            higher_is_better=True,
        ),
        Verdict(
            "healthy jobs flagged, and regressing jobs flagged before their onset (default thresholds)",
            float(len(healthy_flagged) + len(early_flagged)),
            0.0,
            "jobs",
        ),
    )
    gpu_table, gpu_verdicts, gpu_data = gpu_faults(ctx)
    return BenchResult(
        "detection",
        "Study: miscount and regression detection",
        doc_summary(__doc__),
        tables=(*tables, gpu_table),
        verdicts=(*verdicts, *gpu_verdicts),
        data={
            "jobs": n_jobs,
            "seconds": seconds,
            "sweep": sweep,
            "healthy_flagged": healthy_flagged,
            "missed_miscounts": missed_miscounts,
            "miscounts_under_ratio": under_ratio,
            "miscounts_ge_1_5_flagged": [factor_flagged, len(m_factor)],
            "missed_regressions": missed_regressions,
            "correlation": {
                "all": r_all,
                "without_miscounts": r_clean,
                "without_flagged": r_unflagged,
                "fleet_gauge": d.fleet_r,
            },
            "gpu_faults": gpu_data,
        },
        plots=(_plot(ctx, d, fleet, sweep),),
    )


def _plot(ctx: RunContext, outcome: Outcome, fleet: SimulatedFleet, sweep: Sequence[Mapping[str, float | None]]) -> str:
    figure, (scatter, curves) = new_figure(11.0, 4.2, ncols=2)
    kinds = {"healthy": [], "miscount": [], "regression": []}  # type: dict[str, list[tuple[float, float]]]
    for job in fleet.jobs:
        if job.job_id not in outcome.mean_mfu:
            continue
        kind = "miscount" if job.has_miscount else "regression" if job.has_regression else "healthy"
        kinds[kind].append((outcome.mean_ofu[job.job_id], outcome.mean_mfu[job.job_id]))
    for kind, points in kinds.items():
        if points:
            scatter.scatter([p[0] for p in points], [p[1] for p in points], s=10, label=kind)
    top = max([p[1] for pts in kinds.values() for p in pts] + [0.1])
    scatter.plot([0, top], [0, top], color="grey", linewidth=0.8)
    scatter.set_xlabel("job mean OFU")
    scatter.set_ylabel("job mean reported MFU")
    scatter.set_title("Jobs: OFU vs reported MFU")
    scatter.legend(fontsize=7)
    ratios = [e["miscount_ratio"] or 0.0 for e in sweep]
    factors = [e["regression_factor"] or 0.0 for e in sweep]
    curves.plot(
        ratios,
        [e["miscount_detected_mfu_ge_1_5x_ofu"] for e in sweep],
        marker="o",
        label="miscount, MFU >= 1.5x OFU, detected (vs ratio)",
    )
    curves.plot(
        ratios, [e["miscount_false_positive"] for e in sweep], marker="x", label="miscount false positives (vs ratio)"
    )
    curves.plot(
        factors,
        [e["regression_detected_ge_2"] for e in sweep],
        marker="s",
        label="regression >= 2x detected (vs factor)",
    )
    curves.plot(
        factors,
        [e["regression_false_positive"] for e in sweep],
        marker="+",
        label="regression false positives (vs factor)",
    )
    curves.set_xlabel("threshold (miscount ratio / regression factor)")
    curves.set_ylabel("share of jobs")
    curves.set_title("Flags vs thresholds")
    curves.legend(fontsize=7)
    return save_figure(figure, ctx, "detection")


# --- stragglers and idle allocations ---------------------------------------------------------------------

STRAGGLER_CAP_W = 170.0  # the capped GPU's power limit: its clock ~1050-1350 MHz under load, 0.55-0.75x its peers
STRAGGLER_SHARE = 0.25  # of the dense jobs with two GPUs or more


def straggler_fleet(n_jobs: int, seconds: float, clock: ManualClock, seed: int = 43) -> SimulatedFleet:
    """A random fleet with idle jobs, and a power-capped GPU from a random onset in a share of its dense jobs."""
    fleet = SimulatedFleet.random_fleet(
        n_jobs,
        seed=seed,
        miscount_share=0.0,
        regression_share=0.0,
        idle_share=0.1,
        mixed_share=0.1,
        clock=clock,
        duration_s=seconds,
    )
    rng = random.Random(f"{seed}/stragglers")
    candidates = [job for job in fleet.jobs if job.kind == ProfileKind.DENSE and len(job.gpu_keys) >= 2]
    chosen = {job.job_id for job in rng.sample(candidates, max(1, round(len(candidates) * STRAGGLER_SHARE)))}
    capped: dict[str, float] = {}
    for job in fleet.jobs:
        if job.job_id in chosen:
            capped[rng.choice(job.gpu_keys)] = rng.uniform(0.2, 0.6) * seconds
    gpus = tuple(
        attrs.evolve(gpu, fault=GpuFault.POWER_CAP, power_cap_w=STRAGGLER_CAP_W, fault_from_s=capped[gpu.key])
        if gpu.key in capped
        else gpu
        for gpu in fleet.gpus
    )
    fleet.close()
    return SimulatedFleet(gpus=gpus, jobs=fleet.jobs, seed=seed, clock=clock, name="sim-stragglers")


def gpu_faults(ctx: RunContext) -> tuple[Table, tuple[Verdict, ...], dict[str, object]]:
    n_jobs, seconds = (60, 1800.0) if ctx.quick else (240, 3600.0)
    clock = ManualClock()
    fleet = straggler_fleet(n_jobs, seconds, clock)
    steps = simulate(fleet, clock, seconds)
    onset = {gpu.key: fleet.start_ns + round(gpu.fault_from_s * 1e9) for gpu in fleet.gpus if gpu.fault}
    idle_jobs = {job.job_id for job in fleet.jobs if job.kind == ProfileKind.IDLE}
    aggregator = Aggregator(DEFAULT)
    found: set[str] = set()
    early: set[str] = set()  # flagged before its fault began: a false positive
    wrong_gpus: set[str] = set()
    idle_found: set[str] = set()
    idle_wrong: set[str] = set()

    def collect(reports: Sequence[WindowReport]) -> None:
        for report in reports:
            for flag in report.gpu_flags:
                if flag.metric != names.GPU_STRAGGLER.name or not flag.value:
                    continue
                gpu = flag.attributes.get(names.HW_ID, "")
                if gpu not in onset:
                    wrong_gpus.add(gpu)
                elif report.end_ns <= onset[gpu]:
                    early.add(gpu)
                else:
                    found.add(gpu)
            for job in report.jobs:
                if job.flag(names.JOB_GPUS_IDLE):
                    (idle_found if job.job_id in idle_jobs else idle_wrong).add(job.job_id)

    for step in steps:
        for p in step.ofu:
            aggregator.add_ofu(p.key, p.value, p.start_ns, p.end_ns, p.identity)
        for job_id, value, identity in step.mfu:
            aggregator.add_mfu(job_id, value, step.now_ns, identity)
        collect(aggregator.flush(step.now_ns))
    collect(aggregator.close_all())
    healthy_gpus = sum(1 for gpu in fleet.gpus if not gpu.fault)
    table = Table(
        f"Stragglers and idle allocations ({n_jobs} jobs, {len(fleet.gpus)} GPUs: {len(onset)} power-capped "
        f"from a random onset, {len(idle_jobs)} idle jobs; {seconds / 60:.0f} min, default thresholds)",
        ("fault", "injected", "found", "missed", "false positives"),
        (
            (
                "straggler GPU (power cap)",
                str(len(onset)),
                str(len(found)),
                str(len(set(onset) - found)),
                f"{len(wrong_gpus)} of {healthy_gpus} healthy GPUs; {len(early)} before their fault",
            ),
            (
                "idle allocation",
                str(len(idle_jobs)),
                str(len(idle_found)),
                str(len(idle_jobs - idle_found)),
                f"{len(idle_wrong)} of {len(fleet.jobs) - len(idle_jobs)} working jobs",
            ),
        ),
        note="A straggler counts as found when gpu.straggler rose on that GPU in a window ending after its cap "
        "began; a flag on it before then, or on any other GPU, is a false positive.",
    )
    verdicts = (
        Verdict(
            "every injected straggler GPU flagged (default thresholds)",
            len(found) / len(onset) * 100 if onset else 0.0,
            100.0,
            "%",
            higher_is_better=True,
        ),
        Verdict(
            "every idle allocation flagged (default thresholds)",
            len(idle_found) / len(idle_jobs) * 100 if idle_jobs else 0.0,
            100.0,
            "%",
            higher_is_better=True,
        ),
        Verdict(
            "healthy GPUs or jobs flagged, or stragglers before their fault",
            float(len(wrong_gpus) + len(early) + len(idle_wrong)),
            0.0,
            "flags",
        ),
    )
    data: dict[str, object] = {
        "jobs": n_jobs,
        "gpus": len(fleet.gpus),
        "stragglers": len(onset),
        "stragglers_found": len(found),
        "stragglers_early": sorted(early),
        "healthy_gpus_flagged": sorted(wrong_gpus),
        "idle_jobs": len(idle_jobs),
        "idle_found": len(idle_found),
        "working_jobs_flagged_idle": sorted(idle_wrong),
    }
    return table, verdicts, data
