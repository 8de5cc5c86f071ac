"""The fleet report in a terminal: the span, the percentiles, each job's OFU against its MFU, where OFU is
lost and which jobs are flagged and why, read from ``summary.summarize``.

Made for 80 columns, on a terminal or piped: no table cell wraps (GPU models by their short catalog name,
units in the headers, not in the cells, long names cut with an ellipsis), every paragraph keeps its indent
when it wraps, and every number is written the one way ``summary`` writes it, so the idle job's OFU reads
the same in every table.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from rich import box
from rich.console import Console
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from otel_ofu import names
from otel_ofu.control_chars import escape_controls, escaped
from otel_ofu_collector.report.causes import bottleneck_of
from otel_ofu_collector.report.goodput import GoodputSummary, goodput_line
from otel_ofu_collector.report.ranking import BOTTLENECK_TIERS, RANK_RULE, Ranked, legend, rank
from otel_ofu_collector.report.reasons import flags_of, reasons_of
from otel_ofu_collector.report.summary import (
    COARSE_CAUSES,
    MIN_FLEET_R_JOBS,
    TENSOR_PARTS,
    FleetSummary,
    JobSummary,
    coarse,
    count,
    format_time,
    hours,
    hours_number,
    model_name,
    money_number,
    percent,
    plural,
)

INDENT: Final = 2
_NAME_WIDTH: Final = 32  # an id or name longer than this is cut even when there is room
_MIN_NAME_WIDTH: Final = 6
_NO_SHARE: Final = 1e-9  # a share this small is rounding, not time
_GAP: Final = 2  # between columns: the box's separator and the cell's left padding


def short_model(model: str | None) -> str:
    """A GPU model as the catalog names it (``NVIDIA H100 80GB HBM3`` -> ``H100-SXM``), else less its vendor."""
    return model_name(model) or "unknown"


def _number(value: float | None) -> str:
    if value is None:
        return "-"
    text = f"{value:.2f}"
    return "0.00" if text == "-0.00" else text


def _table(*columns: tuple[str, str]) -> Table:
    """A table with a rule under its header and two spaces between columns: 80 columns hold it.

    ``justify`` is "right" for a number, "left" for a word (a precision, a flag: never cut) or "name" (an id
    or a name: cut short with an ellipsis when the table would be wider than the console; the JSON and HTML
    reports have them in full)."""
    table = Table(box=box.SIMPLE_HEAD, padding=(0, 0, 0, 1), pad_edge=False, show_edge=False)
    for header, justify in columns:
        if justify == "name":
            table.add_column(header, overflow="ellipsis", no_wrap=True, max_width=_NAME_WIDTH)
        else:
            table.add_column(header, justify="right" if justify == "right" else "left", no_wrap=True)
    return table


def _fit(table: Table, width: int) -> Table:
    """Every column but the ids and names as wide as its widest cell; the ids and names share what is left
    of ``width`` (each at most _NAME_WIDTH), so only they are ever cut."""
    natural = {
        index: max(Text.from_markup(str(cell)).cell_len for cell in (column.header, *column.cells))
        for index, column in enumerate(table.columns)
    }
    names_ = [index for index, column in enumerate(table.columns) if column.max_width is not None]
    fixed = sum(natural[i] for i in natural if i not in names_) + _GAP * (len(table.columns) - 1)
    room = max(_MIN_NAME_WIDTH * len(names_), width - fixed)
    given: dict[int, int] = {}
    # The narrowest first: what a short id does not need is left to the longer names.
    for left, index in enumerate(sorted(names_, key=lambda i: natural[i])):
        given[index] = min(natural[index], _NAME_WIDTH, room // (len(names_) - left))
        room -= given[index]
    for index, column in enumerate(table.columns):
        if index in given:
            column.max_width = column.min_width = given[index]
        else:
            column.min_width = natural[index]
    return table


def _paragraph(console: Console, text: str, indent: int = 0, style: str = "") -> None:
    """Text wrapped to the console's width, every line of it at ``indent``."""
    body = Text(text, style=style)
    console.print(Padding(body, (0, 0, 0, indent), expand=False) if indent else body)


def _heading(console: Console, text: str) -> None:
    console.print()
    _paragraph(console, text, style="bold")


def fleet_lines(summary: FleetSummary) -> list[str]:
    """The span and the fleet's figures, in sentences short enough for 80 columns."""
    assert summary.start_ns is not None
    assert summary.end_ns is not None
    assert summary.last_width_ns is not None
    lines = [
        f"{plural(summary.windows, 'window')} of {summary.last_width_ns / 1e9:g} s, from "
        f"{format_time(summary.start_ns)} to {format_time(summary.end_ns)}.",
        f"{plural(summary.gpus, 'GPU')} reporting in the last window (peak {summary.peak_gpus}), "
        f"{plural(len(summary.jobs), 'job')}.",
    ]
    if summary.fleet_jobs < MIN_FLEET_R_JOBS:
        lines.append(
            f"Fleet r(OFU, MFU): not enough jobs ({summary.fleet_jobs} with both; it needs {MIN_FLEET_R_JOBS} "
            f"or more). Mean absolute error {percent(summary.mae)}."
        )
    else:
        lines.append(
            f"Fleet r(OFU, MFU) = {_number(summary.correlation)} over {summary.fleet_jobs} jobs, "
            f"mean absolute error {percent(summary.mae)}."
        )
    return lines


def _verdict(item: Ranked) -> str:
    """The flags column: the job's flags, else its bottleneck (input-, comm-, memory-bound), else ok or no MFU."""
    label = item.label
    if flags_of(item.job):
        return f"[red]{label}"
    if item.tier in BOTTLENECK_TIERS.values():
        return f"[yellow]{label}"
    return f"[yellow]{label}" if label == "no MFU" else f"[green]{label}"


def print_report(
    summary: FleetSummary, console: Console, *, title: str = "otel-ofu fleet report", price_note: str = ""
) -> None:
    """The whole report; a record without windows says so in one line. ``price_note`` follows the fleet's
    lost cost (where the prices came from). Every name and id in it (what producers and feeds said) is printed
    with its control characters written out (``control_chars``): a job id cannot retitle or clear the terminal."""
    summary = escape_controls(summary)
    console.rule(f"[bold]{escaped(title)}")
    if not summary.windows:
        console.print("No closed windows: nothing to report yet.")
        return
    for line in fleet_lines(summary):
        _paragraph(console, line)
    _paragraph(
        console,
        "(fleet r compares each job's mean OFU with its mean reported MFU: a job whose framework over-counts "
        "its FLOPs drags it down, which is what it is for)",
        indent=INDENT,
    )

    _heading(console, "Fleet OFU percentiles, last window")
    groups = _table(
        ("GPU model", "name"),
        ("precision", "left"),
        ("GPUs", "right"),
        *((f"p{quantile * 100:g}", "right") for quantile in names.QUANTILES),
    )
    for group in summary.last_groups:
        groups.add_row(
            short_model(group.attributes.get(names.HW_MODEL)),
            group.attributes.get(names.GPU_PRECISION, "unknown"),
            count(group.gpus),
            *(percent(group.quantiles.get(quantile)) for quantile in names.QUANTILES),
        )
    console.print(_fit(groups, console.width))

    ranked = rank(summary)
    _heading(console, "Jobs, most to act on first: OFU (hardware) vs reported MFU")
    jobs = _table(
        ("job", "name"),
        ("name", "name"),
        ("GPUs", "right"),
        ("OFU", "right"),
        ("MFU", "right"),
        ("MFU/OFU", "right"),
        ("r", "right"),
        ("flags", "left"),
    )
    for item in ranked:
        job = item.job
        ratio = job.mfu_over_ofu
        jobs.add_row(
            job.job_id,
            job.attributes.get(names.JOB_NAME) or "-",
            count(job.gpus),
            percent(job.mean_ofu),
            percent(job.mean_mfu),
            "-" if ratio is None else f"{ratio:.2f}x",
            _number(job.correlation),
            _verdict(item),
        )
    console.print(_fit(jobs, console.width))
    _paragraph(console, f"OFU and MFU: means over the windows with both. {RANK_RULE}", indent=INDENT)
    for line in legend(ranked):
        _paragraph(console, line, indent=2 * INDENT)
    print_loss(summary, console, price_note=price_note, ranked=ranked)
    print_flags(summary, console, ranked=ranked)


def print_loss(
    summary: FleetSummary, console: Console, *, price_note: str = "", ranked: Sequence[Ranked] | None = None
) -> None:
    """Per job (in rank order), each cause's share of its GPU time and the GPU-hours (and cost) lost; then the
    fleet's."""
    currency = summary.currency or next((job.loss.currency for job in summary.jobs if job.loss.currency), None)
    priced = any(job.loss.cost_lost is not None for job in summary.jobs)
    # GPU time without OFU: a column of its own where there is some
    unmeasured = bool(summary.lost_s.get(names.OfuLossCause.UNMEASURED))
    causes = (*COARSE_CAUSES, *((names.OfuLossCause.UNMEASURED,) if unmeasured else ()))
    _heading(console, "Where OFU is lost: shares of each job's GPU time, GPU-hours and cost lost")
    table = _table(
        ("job", "name"),
        ("GPU-h", "right"),
        ("OFU", "right"),
        *((cause, "right") for cause in causes),
        ("lost GPU-h", "right"),
        *(((f"lost {currency or 'cost'}", "right"),) if priced else ()),
    )
    for job in (item.job for item in (ranked if ranked is not None else rank(summary))):
        shares = job.loss.shares
        if shares is None:
            continue
        cost_lost = job.loss.cost_lost
        cost_cell = ("-" if cost_lost is None else money_number(sum(cost_lost.values())),) if priced else ()
        table.add_row(
            job.job_id,
            hours_number(job.loss.gpu_time_s),
            percent(shares["ofu"]),
            *(percent(value) for value in coarse(shares, unmeasured).values()),
            hours_number(sum(job.loss.lost_s.values())),
            *cost_cell,
        )
    console.print(_fit(table, console.width))
    if not summary.lost_s:
        return
    fleet_lost = coarse(summary.lost_s, unmeasured)
    by_cause = ", ".join(f"{cause} {hours(fleet_lost[cause])}" for cause in causes)
    line = f"Fleet lost {hours(summary.lost_total_s)} of GPU time ({by_cause})"
    cost = summary.cost_lost_total
    if cost is not None:
        line += f", costing {money_number(cost)} {summary.currency or ''}".rstrip() + price_note
    if summary.energy_j is not None:
        line += f"; the fleet's GPUs used {summary.energy_j / 3.6e6:.1f} kWh"
    _paragraph(console, line + ".")
    print_causes(summary, console, ranked=ranked)


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value / 1e9:.1f}"


def _has_parts(job: JobSummary) -> bool:
    """Whether the job's GPUs split the tensor pipes' loss and had any of it: an idle job has none, its last cause
    being the residual 1 - OFU - idle, a rounding's +-1e-16 from 0."""
    shares = job.loss.shares
    if shares is None or not any(part in job.loss.causes for part in TENSOR_PARTS):
        return False
    return sum(shares[part] for part in TENSOR_PARTS) > _NO_SHARE


def print_causes(summary: FleetSummary, console: Console, *, ranked: Sequence[Ranked] | None = None) -> None:
    """The tensor column split by what the engine and SMs did, beside DRAM and link traffic, for the jobs whose
    GPUs report engine and SM activity (in rank order); then each job's bottleneck where one stands out."""
    order = ranked if ranked is not None else rank(summary)
    jobs = [item.job for item in order if _has_parts(item.job)]
    if not jobs:
        return
    _heading(console, "Where the tensor pipes' time went: shares of GPU time, and what else was busy")
    table = _table(
        ("job", "name"),
        *((cause, "right") for cause in TENSOR_PARTS),
        ("DRAM", "right"),
        ("NVLink GB/s", "right"),
        ("PCIe GB/s", "right"),
    )
    for job in jobs:
        shares = job.loss.shares
        if shares is None:
            continue
        table.add_row(
            job.job_id,
            *(percent(shares[cause]) for cause in TENSOR_PARTS),
            percent(job.loss.dram_active),
            _rate(job.loss.nvlink_bytes_per_s),
            _rate(job.loss.pcie_bytes_per_s),
        )
    console.print(_fit(table, console.width))
    found = [(job, bottleneck_of(job)) for job in jobs]
    named = [(job, bottleneck) for job, bottleneck in found if bottleneck is not None]
    if not named:
        _paragraph(console, "No job's loss points to a single bottleneck.", INDENT)
        return
    for job, bottleneck in named:
        name = job.attributes.get(names.JOB_NAME) or "unnamed"
        _paragraph(console, f"{job.job_id} ({name}): {bottleneck.sentence}.", INDENT)


def print_flags(summary: FleetSummary, console: Console, *, ranked: Sequence[Ranked] | None = None) -> None:
    """Each flagged job's reasons in words (in rank order), one indented paragraph each."""
    order = ranked if ranked is not None else rank(summary)
    flagged = [item.job for item in order if item.job.flagged]
    if not flagged:
        _heading(console, "No job flagged.")
        return
    _heading(console, "Flagged jobs and GPUs:")
    for job in flagged:
        for reason in reasons_of(job):
            _paragraph(console, f"{job.job_id} ({job.attributes.get(names.JOB_NAME) or 'unnamed'}): {reason}", INDENT)


# Short headers: six causes fit 80 columns beside the job and its goodput.
_CAUSE_HEADERS: Final = {
    names.GoodputCause.CHECKPOINT: "ckpt",
    names.GoodputCause.STARTUP: "start",
    names.GoodputCause.RECOVERY: "recov",
}


def print_goodput(goodput: GoodputSummary, console: Console) -> None:
    """Where each job's allocated GPU time went: goodput (productive / allocated, over the job so far), the FLOP view
    beside it, and the GPU-hours that made no progress by cause; the fleet's in one line. Nothing without any."""
    if not goodput.jobs:
        return
    causes = goodput.causes
    _heading(console, "Where GPU time went: goodput (productive / allocated GPU time) and GPU-h without progress")
    table = _table(
        ("job", "name"),
        ("GPU-h", "right"),
        ("goodput", "right"),
        ("FLOPs", "right"),
        *((_CAUSE_HEADERS.get(cause, cause), "right") for cause in causes),
    )
    for row in goodput.jobs:
        table.add_row(
            row.job_id,
            hours_number(row.gpu_time_s),
            percent(row.goodput),
            percent(row.goodput_flops),
            *(hours_number(row.badput_s.get(cause, 0.0)) for cause in causes),
        )
    console.print(_fit(table, console.width))
    progress = [row.job_id for row in goodput.jobs if row.basis == names.GoodputBasis.PROGRESS]
    _paragraph(
        console,
        "Goodput over each job so far; FLOPs: the useful FLOPs of its productive time over its GPU time's peak; "
        "ckpt: checkpoint save and load, start: startup, recov: recovery from a restart. "
        + (
            f"From the counters (idle, hang, checkpoint) and, for {', '.join(progress)}, its reported steps "
            "(startup, recovery, rework)."
            if progress
            else "From the counters only (idle, hang, checkpoint): no job reported its steps."
        ),
        indent=INDENT,
    )
    line = goodput_line(goodput)
    if line:
        _paragraph(console, line)


def print_lines(console: Console, lines: Sequence[str], indent: int = INDENT) -> None:
    """Paragraphs at ``indent`` (a section another part of the program adds, such as the demo's)."""
    for line in lines:
        _paragraph(console, line, indent)
