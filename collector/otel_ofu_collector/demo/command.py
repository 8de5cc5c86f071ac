"""``otel-ofu demo``: the embedded default, end to end on loopback. What it runs and prints is ``DESCRIPTION``
(its ``--help``). One seed, one report: the simulation is keyed by offsets from the fleet's start and the demo closes
its windows itself, so two runs print the same numbers.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Final

import attrs
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from otel_ofu import names
from otel_ofu.attribution import build_chain
from otel_ofu.cli_support import CommandOptions, output_path, positive_float
from otel_ofu.clock import ManualClock
from otel_ofu.gpu_samples import ComputedSnapshot
from otel_ofu.mfu.timed import TimedCheckpoints, TimedMfu, TimedStep
from otel_ofu.model import Clock
from otel_ofu.producer.loop import Observer
from otel_ofu.producer.self_metrics import SelfMetrics
from otel_ofu.sources.simulated import H100_SXM_NAME, SimulatedFleet
from otel_ofu_collector.config import AggregatorConfig
from otel_ofu_collector.demo.loopback import LoopbackPipeline, MfuReports, ProgressReports
from otel_ofu_collector.options.declared import WINDOW_RANGE
from otel_ofu_collector.prefixes import DEMO_PREFIX
from otel_ofu_collector.report.goodput import goodput_summary
from otel_ofu_collector.report.summary import model_name, summarize
from otel_ofu_collector.report.terminal import print_goodput, print_lines, print_report
from otel_ofu_collector.results import WindowReport

DESCRIPTION = """\
The embedded default, end to end on loopback.

A simulated fleet (5 hosts x 8 H100s, eleven jobs: two healthy dense trainings, an MoE job whose framework
over-counts FLOPs ~2x, a job that regresses 2.5x mid-run, a mixed-precision job, an allocated but idle
GPU, an input-bound, a communication-bound and a memory-bound training, a job that hangs in a collective and
one that crashes and restarts from its last checkpoint, plus a GPU that fails now and then and a power-capped
straggler GPU inside a healthy job) runs through the real producer, the real OTLP/gRPC transport and the real
collector; each job's framework reports its MFU (and two of them their steps and checkpoint time) over OTLP too.
Simulated time runs as fast as the machine allows, so half an hour of fleet time takes seconds. It ends with the
fleet report: percentiles, each job's OFU against its reported MFU, correlations, where OFU is lost (GPU-hours
and cost by cause, at an example price of 2.50 USD per H100 GPU-hour), where its GPU time went (goodput), and
which jobs and GPUs are flagged and why."""


# The demo prices its GPUs to show the cost outputs: an example, not a quote.
EXAMPLE_PRICE_PER_GPU_HOUR = 2.50
EXAMPLE_CURRENCY = "USD"
EXAMPLE_PRICES = {H100_SXM_NAME: EXAMPLE_PRICE_PER_GPU_HOUR}
DEFAULT_DURATION_S = 1800.0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="run a simulated fleet through the producer, OTLP and the collector, and report",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    options = CommandOptions(parser, DEMO_PREFIX)
    options.option(
        "--duration",
        metavar="SECONDS",
        type=positive_float,
        default=DEFAULT_DURATION_S,
        help="simulated seconds of fleet time, ending now (at least one --window)",
    )
    options.option(
        "--interval",
        metavar="SECONDS",
        type=positive_float,
        default=10.0,
        help="simulated seconds between producer reads",
    )
    options.option(
        "--window",
        metavar="SECONDS",
        type=WINDOW_RANGE.parse,
        default=60.0,
        help="collector window in simulated seconds",
    )
    options.option("--seed", metavar="N", type=int, default=7, help="simulation seed")
    options.option("--html", metavar="PATH", type=output_path, help="also write the HTML fleet report to this path")
    parser.set_defaults(handler=_handle)


def short_duration_warning(duration_s: float, interval_s: float, window_s: float) -> str | None:
    """What to say when ``--duration`` cannot fill one window: its report would be empty or one partial window."""
    least = max(window_s, interval_s)
    if duration_s >= least:
        return None
    return (
        f"otel-ofu demo: --duration {duration_s:g} s is shorter than one window (--window {window_s:g} s, "
        f"reads every {interval_s:g} s): no whole window closes. Give --duration {least:g} or more; the flags "
        f"need several windows (the default {DEFAULT_DURATION_S:g} s shows every one)."
    )


# The report is made for 80 columns; a wider terminal gives its names room up to this, its paragraphs no more.
MAX_REPORT_WIDTH: Final = 100


@contextmanager
def _quiet_collector_logs() -> Iterator[None]:
    """The embedded collector's and producer's INFO lines ("collector ready: ...") are for a deployed process, not
    for the demo's report: at the default level they are left out while the demo runs (--log-level DEBUG shows
    them); the loggers' levels are put back after it (the demo may run inside a longer-lived process)."""
    loggers = [logging.getLogger(name) for name in ("otel_ofu_collector", "otel_ofu")]
    before = [found.level for found in loggers]
    if logging.getLogger().getEffectiveLevel() >= logging.INFO:
        for found in loggers:
            found.setLevel(logging.WARNING)
    try:
        yield
    finally:
        for found, level in zip(loggers, before, strict=True):
            found.setLevel(level)


def _handle(args: argparse.Namespace) -> int:
    with _quiet_collector_logs():
        return _report(args)


def _report(args: argparse.Namespace) -> int:
    console = Console()
    if console.width > MAX_REPORT_WIDTH:
        console = Console(width=MAX_REPORT_WIDTH)
    warning = short_duration_warning(args.duration, args.interval, args.window)
    if warning:
        print(warning, file=sys.stderr)
    unreadable = UnreadableGpus()
    reports = run_demo(
        duration_s=args.duration,
        interval_s=args.interval,
        window_s=args.window,
        seed=args.seed,
        console=console,
        observers=[unreadable],
    )
    summary = summarize(reports)
    price = (
        f" at an example price of {EXAMPLE_PRICE_PER_GPU_HOUR:.2f} {EXAMPLE_CURRENCY} per "
        f"{model_name(H100_SXM_NAME)} GPU-hour"
    )
    print_report(summary, console, title="otel-ofu demo: fleet report", price_note=price + " (not a quote)")
    print_goodput(goodput_summary(reports), console)
    print_unreadable(unreadable, console)
    if args.html:
        from otel_ofu_collector.report.html_page import write_report

        write_report(Path(args.html), reports, title="otel-ofu demo fleet")
        # A path split over two lines could not be pasted: the terminal wraps it, rich does not.
        console.print(f"HTML report written to {args.html}", soft_wrap=True, markup=False, highlight=False)
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


def frameworks_progress(fleet: SimulatedFleet) -> ProgressReports:
    """What each simulated job's framework reports of its progress at a moment: its last step and the checkpoint
    seconds of its current process (the jobs that train to a plan)."""

    def reports(time_ns: int) -> tuple[list[TimedStep], list[TimedCheckpoints]]:
        steps: list[TimedStep] = []
        checkpoints: list[TimedCheckpoints] = []
        for job in fleet.jobs:
            step = fleet.reported_step(job.job_id, time_ns)
            if step is not None:
                steps.append(TimedStep(job.job_id, step, time_ns))
            found = fleet.reported_checkpoints(job.job_id, time_ns)
            if found is not None and found[1]:
                checkpoints.append(TimedCheckpoints(job.job_id, found[0], time_ns, found[1]))
        return steps, checkpoints

    return reports


def demo_pipeline(
    fleet: SimulatedFleet, clock: Clock, *, interval_s: float, window_s: float, observers: Sequence[Observer] = ()
) -> LoopbackPipeline:
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
        progress=frameworks_progress(fleet),
        observers=observers,
    )


def run_demo(
    *,
    duration_s: float = DEFAULT_DURATION_S,
    interval_s: float = 10.0,
    window_s: float = 60.0,
    seed: int = 7,
    console: Console | None = None,
    start_ns: int | None = None,
    observers: Sequence[Observer] = (),
) -> list[WindowReport]:
    """Run the simulated fleet end to end and return the collector's closed windows.

    ``start_ns``: the fleet's start (rounded down to the window); None: ``duration_s`` before now, so the
    record ends by now, as a real one would (a window never ends in the future). The numbers do not depend
    on it. ``observers`` see each of the producer's cycles, as ``Producer`` calls them.
    """
    if duration_s <= 0 or interval_s <= 0 or window_s <= 0:
        raise ValueError("duration, interval and window must be positive")
    console = console or Console(quiet=True)
    # Aligned down to the window so the first window is whole (and the last one ends by now).
    window_ns = int(window_s * 1e9)
    start = time.time_ns() - int(duration_s * 1e9) if start_ns is None else start_ns
    clock = ManualClock(start_ns=start // window_ns * window_ns)
    fleet = SimulatedFleet.demo(seed=seed, clock=clock, duration_s=duration_s)
    reports: list[WindowReport] = []
    pipeline = demo_pipeline(fleet, clock, interval_s=interval_s, window_s=window_s, observers=observers)
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


@attrs.define
class UnreadableGpus:
    """Which GPUs the demo's producer could not read, how often and why (an observer of its cycles): the
    flaky GPU's failed reads are skipped and counted (``otel_ofu.source.errors``), never sent as a 0."""

    reads: int = 0
    by_gpu: dict[tuple[str, str], Counter[str]] = attrs.field(factory=dict)  # (GPU, job) -> reason -> reads

    def __call__(self, computed: ComputedSnapshot, _metrics: SelfMetrics) -> None:
        self.reads += 1
        for error in computed.errors:
            gpu = error.gpu
            name = f"{gpu.host}/{gpu.index}" if gpu is not None else error.gpu_key or "the source"
            job = gpu.hints.get(names.JOB_ID, "") if gpu is not None else ""
            self.by_gpu.setdefault((name, job), Counter())[error.reason] += 1

    def lines(self) -> list[str]:
        found = []
        for (name, job), reasons in sorted(self.by_gpu.items()):
            why = ", ".join(f"{reason} {count}" for reason, count in sorted(reasons.items()))
            where = f"GPU {name}" + (f" ({job})" if job else "")
            found.append(f"{where}: {sum(reasons.values())} of {self.reads} reads failed ({why})")
        return found


def print_unreadable(unreadable: UnreadableGpus, console: Console) -> None:
    lines = unreadable.lines()
    if not lines:
        return
    console.print()
    console.print(Text("Unreadable GPU reads (skipped and counted, never sent as 0):", "bold"))
    print_lines(console, lines)


def main(argv: Sequence[str] | None = None) -> int:  # pragma: no cover - convenience for python -m
    from otel_ofu.cli import main as cli_main

    return cli_main(["demo", *(argv or [])])
