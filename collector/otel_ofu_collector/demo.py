"""``otel-ofu demo``: the embedded default, end to end on loopback.

A simulated fleet (3 hosts x 8 H100s, six jobs: two healthy dense trainings, an MoE job whose framework
over-counts FLOPs ~2x, a job that regresses 2.5x mid-run, a mixed-precision job, an allocated but idle
GPU, plus a GPU that fails now and then and a power-capped straggler GPU inside a healthy job) runs through
the real producer, the real OTLP/gRPC transport and the real collector; each job's framework reports its
MFU over OTLP too. Simulated time runs as fast as the machine allows, so half an hour of fleet time takes
seconds. It ends with the fleet report: percentiles, each job's OFU against its reported MFU,
correlations, where OFU is lost (GPU-hours and cost by cause, at an example price), and which jobs and
GPUs are flagged and why. One seed, one report: the simulation is keyed by offsets from the fleet's start
and the demo closes its windows itself, so two runs print the same numbers.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from otel_ofu import names
from otel_ofu.attribution import build_chain
from otel_ofu.cli_support import CommandOptions, output_path, positive_float
from otel_ofu.clock import ManualClock
from otel_ofu.mfu.timed import TimedMfu
from otel_ofu.model import Clock
from otel_ofu.sources.simulated import H100_SXM_NAME, SimulatedFleet
from otel_ofu_collector.config import AggregatorConfig
from otel_ofu_collector.detectors import detector_for
from otel_ofu_collector.loopback import LoopbackPipeline, MfuReports
from otel_ofu_collector.prefixes import DEMO_PREFIX
from otel_ofu_collector.report.summary import CAUSES, FleetSummary, hours, money, share, summarize
from otel_ofu_collector.results import WindowReport

DESCRIPTION = """\
The embedded default, end to end on loopback.

A simulated fleet (3 hosts x 8 H100s, six jobs: two healthy dense trainings, an MoE job whose framework
over-counts FLOPs ~2x, a job that regresses 2.5x mid-run, a mixed-precision job, an allocated but idle
GPU, plus a GPU that fails now and then and a power-capped straggler GPU inside a healthy job) runs through
the real producer, the real OTLP/gRPC transport and the real collector; each job's framework reports its
MFU over OTLP too. Simulated time runs as fast as the machine allows, so half an hour of fleet time takes
seconds. It ends with the fleet report: percentiles, each job's OFU against its reported MFU,
correlations, where OFU is lost (GPU-hours and cost by cause, at an example price of 2.50 USD per H100
GPU-hour), and which jobs and GPUs are flagged and why."""


# The demo prices its GPUs to show the cost outputs: an example, not a quote.
EXAMPLE_PRICE_PER_GPU_HOUR = 2.50
EXAMPLE_CURRENCY = "USD"
EXAMPLE_PRICES = {H100_SXM_NAME: EXAMPLE_PRICE_PER_GPU_HOUR}


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="run a simulated fleet through the producer, OTLP and the collector, and report",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    options = CommandOptions(parser, DEMO_PREFIX)
    options.option(
        "--duration", metavar="SECONDS", type=positive_float, default=1800.0, help="simulated seconds of fleet time"
    )
    options.option(
        "--interval",
        metavar="SECONDS",
        type=positive_float,
        default=10.0,
        help="simulated seconds between producer reads",
    )
    options.option(
        "--window", metavar="SECONDS", type=positive_float, default=60.0, help="collector window in simulated seconds"
    )
    options.option("--seed", metavar="N", type=int, default=7, help="simulation seed")
    options.option("--html", metavar="PATH", type=output_path, help="also write the HTML fleet report to this path")
    parser.set_defaults(handler=_handle)


def _handle(args: argparse.Namespace) -> int:
    console = Console()
    reports = run_demo(
        duration_s=args.duration, interval_s=args.interval, window_s=args.window, seed=args.seed, console=console
    )
    summary = summarize(reports)
    print_report(summary, console)
    if args.html:
        from otel_ofu_collector.report.html_page import write_report

        write_report(Path(args.html), reports, title="otel-ofu demo fleet")
        console.print(f"HTML report written to {args.html}")
    return 0


def frameworks_mfu(fleet: SimulatedFleet) -> MfuReports:
    """What each simulated job's framework reports as its MFU over an interval (with its job name)."""

    def reports(start_ns: int, end_ns: int) -> list[TimedMfu]:
        return [
            TimedMfu(job.job_id, mfu, start_ns, end_ns, {names.JOB_NAME: job.name})
            for job in fleet.jobs
            if (mfu := fleet.reported_mfu(job.job_id, start_ns, end_ns)) is not None
        ]

    return reports


def demo_pipeline(fleet: SimulatedFleet, clock: Clock, *, interval_s: float, window_s: float) -> LoopbackPipeline:
    """The demo fleet through the producer, OTLP on loopback and the collector, priced at the example price."""
    return LoopbackPipeline(
        source=fleet,
        clock=clock,
        aggregator=AggregatorConfig(
            window_s=window_s,
            lateness_s=interval_s,
            price_per_gpu_hour=EXAMPLE_PRICES,
            currency=EXAMPLE_CURRENCY,
        ),
        interval_s=interval_s,
        attribution=build_chain(clock=clock).attribute,
        mfu=frameworks_mfu(fleet),
    )


def run_demo(
    *,
    duration_s: float = 1800.0,
    interval_s: float = 10.0,
    window_s: float = 60.0,
    seed: int = 7,
    console: Console | None = None,
    start_ns: int | None = None,
) -> list[WindowReport]:
    """Run the simulated fleet end to end and return the collector's closed windows.

    ``start_ns``: the fleet's start (rounded down to the window); None: now. The numbers do not depend on it.
    """
    if duration_s <= 0 or interval_s <= 0 or window_s <= 0:
        raise ValueError("duration, interval and window must be positive")
    console = console or Console(quiet=True)
    # Aligned to the window so the first window is whole.
    window_ns = int(window_s * 1e9)
    start = time.time_ns() if start_ns is None else start_ns
    clock = ManualClock(start_ns=start // window_ns * window_ns)
    fleet = SimulatedFleet.demo(seed=seed, clock=clock, duration_s=duration_s)
    reports: list[WindowReport] = []
    pipeline = demo_pipeline(fleet, clock, interval_s=interval_s, window_s=window_s)
    pipeline.start()
    steps = int(duration_s // interval_s)
    try:
        with Progress(
            TextColumn("[bold]simulated fleet"),
            BarColumn(),
            TextColumn("{task.fields[sim]} of fleet time, {task.fields[windows]} windows closed"),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        ) as progress:
            task = progress.add_task("demo", total=steps, sim="0 min", windows=0)
            for step in range(steps):
                clock.advance(interval_s)
                reports.extend(pipeline.step().windows)
                progress.update(task, advance=1, sim=f"{(step + 1) * interval_s / 60:.0f} min", windows=len(reports))
    finally:
        reports.extend(pipeline.stop())
    return reports


def _fraction(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def print_report(summary: FleetSummary, console: Console) -> None:
    console.rule("[bold]otel-ofu demo: fleet report")
    console.print(
        f"{summary.windows} windows, {summary.gpus} GPUs reporting in the last one, "
        f"{len(summary.jobs)} jobs; fleet OFU-MFU correlation r = {_number(summary.correlation)}, "
        f"mean absolute error {_fraction(summary.mae)}"
    )
    console.print(
        "  (fleet r compares each job's mean OFU with its mean reported MFU: the job whose framework over-counts "
        "FLOPs drags it down, which is what it is for)"
    )
    groups = Table(title="Fleet OFU percentiles, last window", title_justify="left")
    groups.add_column("GPU model")
    groups.add_column("precision")
    groups.add_column("GPUs", justify="right")
    for quantile in names.QUANTILES:
        groups.add_column(f"p{quantile * 100:g}", justify="right")
    for group in summary.last_groups:
        groups.add_row(
            group.attributes.get(names.HW_MODEL, "unknown").removeprefix("NVIDIA "),
            group.attributes.get(names.GPU_PRECISION, "unknown"),
            str(group.gpus),
            *(_fraction(group.quantiles.get(quantile)) for quantile in names.QUANTILES),
        )
    console.print(groups)
    jobs = Table(
        title="Jobs: OFU (hardware) vs MFU (framework-reported), means over the windows with both",
        title_justify="left",
    )
    for column, justify in (
        ("job", "left"),
        ("name", "left"),
        ("GPUs", "right"),
        ("OFU", "right"),
        ("MFU", "right"),
        ("MFU/OFU", "right"),
        ("r", "right"),
        ("verdict", "left"),
    ):
        jobs.add_column(column, justify=justify)  # type: ignore[arg-type]
    for job in summary.jobs:
        ratio = job.mfu_over_ofu
        verdict = "[green]ok"
        if job.flagged:
            verdict = "[red]" + " + ".join(detector_for(flag.kind).label for flag in job.flags())
        elif job.mean_mfu is None:
            verdict = "[yellow]no MFU reported"
        jobs.add_row(
            job.job_id,
            job.attributes.get(names.JOB_NAME) or "-",
            str(job.gpus),
            _fraction(job.mean_ofu),
            _fraction(job.mean_mfu),
            "-" if ratio is None else f"{ratio:.2f}x",
            _number(job.correlation),
            verdict,
        )
    console.print(jobs)
    print_loss(summary, console)
    flagged = [job for job in summary.jobs if job.flagged]
    if flagged:
        console.print("[bold]Flagged jobs and GPUs:")
        for job in flagged:
            for reason in job.reasons():
                console.print(f"  {job.job_id} ({job.attributes.get(names.JOB_NAME) or 'unnamed'}): {reason}")
    else:
        console.print("No job flagged.")


def print_loss(summary: FleetSummary, console: Console) -> None:
    """Where the fleet's OFU went: per job, each cause's share of its GPU time, and the lost GPU-hours and cost."""
    table = Table(
        title="Where OFU is lost: shares of each job's GPU time, lost GPU-hours and their cost",
        title_justify="left",
    )
    for column, justify in (
        ("job", "left"),
        ("GPU-h", "right"),
        ("OFU", "right"),
        *((cause, "right") for cause in CAUSES),
        ("lost", "right"),
        ("lost cost", "right"),
    ):
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    for job in summary.jobs:
        shares = job.loss_shares()
        if shares is None:
            continue
        lost = job.lost_s
        cost_lost = job.cost_lost
        table.add_row(
            job.job_id,
            f"{job.gpu_time_s / 3600:.2f}",
            share(shares["ofu"]),
            *(share(shares[cause]) for cause in CAUSES),
            hours(sum(lost.values())),
            "-" if cost_lost is None else money(sum(cost_lost.values()), job.currency),
        )
    console.print(table)
    fleet_lost = summary.lost_s
    if not fleet_lost:
        return
    by_cause = ", ".join(f"{cause} {hours(fleet_lost.get(cause, 0.0))}" for cause in CAUSES)
    line = f"Fleet lost {hours(summary.lost_total_s)} of GPU time ({by_cause})"
    cost = summary.cost_lost_total
    if cost is not None:
        line += (
            f", costing {money(cost, summary.currency)} at an example price of "
            f"{money(EXAMPLE_PRICE_PER_GPU_HOUR, EXAMPLE_CURRENCY)} per GPU-hour (the demo's example, not a quote)"
        )
    if summary.energy_j is not None:
        line += f"; the fleet's GPUs used {summary.energy_j / 3.6e6:.1f} kWh"
    console.print(line + ".")


def main(argv: Sequence[str] | None = None) -> int:  # pragma: no cover - convenience for python -m
    from otel_ofu.cli import main as cli_main

    return cli_main(["demo", *(argv or [])])
