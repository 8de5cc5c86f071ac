"""A self-contained HTML fleet report from closed windows: the picture people decide from.

One page, no network needed to open it (plotly.js is inlined once), with:

- a fleet summary (span, GPUs, jobs, fleet OFU-MFU correlation and MAE, OFU percentiles of the last window);
- the flagged jobs, each with its reason in words;
- OFU vs reported MFU per job, the fleet OFU distribution per GPU model and its percentiles over time, where
  each job's GPU time went, and per-job OFU and MFU timelines with the windows a flag was up shaded (the
  figures are ``plots``'s);
- every job in a table.

Every string that came from the network (job names, ids, models) is HTML-escaped, in the page and in the
plot labels alike; plotly's JSON encoder escapes ``<``, ``>`` and ``/`` inside the script blocks.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

import plotly.graph_objects as go
from plotly.offline import get_plotlyjs

from otel_ofu import names
from otel_ofu_collector.detectors import detector_for
from otel_ofu_collector.report.causes import bottleneck_of
from otel_ofu_collector.report.goodput import goodput_line, goodput_summary
from otel_ofu_collector.report.plots import (
    MAX_TIMELINE_JOBS,
    distribution_figure,
    flag_colour,
    group_quantiles,
    job_point,
    loss_figure,
    percentiles_figure,
    scatter_figure,
    shown_model,
    timelines_figure,
)
from otel_ofu_collector.report.ranking import BOTTLENECK_TIERS, RANK_RULE, Ranked, legend, rank
from otel_ofu_collector.report.reasons import Flag, flags_of, fleet_flags
from otel_ofu_collector.report.summary import (
    CAUSES,
    FLAG_KINDS,
    MIN_FLEET_R_JOBS,
    TENSOR_PARTS,
    FleetSummary,
    JobSummary,
    count,
    format_time,
    hours,
    money,
    percent,
    plural,
    summarize,
)
from otel_ofu_collector.results import WindowReport

DEFAULT_TITLE: Final = "otel-ofu fleet report"
# Beyond this the page grows without telling a person more; what is left out is said on the page.
MAX_TABLE_JOBS: Final = 200
PLOTLY_CONFIG: Final = {"displaylogo": False, "responsive": True}


def flag_styles(kinds: Sequence[str] = FLAG_KINDS) -> str:
    """One CSS rule per flag kind, for its badge (``<span class="flag KIND">``)."""
    return "".join(f".flag.{kind} {{ background: {flag_colour(kind, kinds)}; }}\n" for kind in kinds)


# --- the page -----------------------------------------------------------------------------------------

_STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 0; color: #1d2330;
       background: #f5f6f8; }
main { max-width: 1320px; margin: 0 auto; padding: 24px 28px 48px; }
h1 { font-size: 26px; margin: 0 0 4px; }
h2 { font-size: 19px; margin: 30px 0 8px; }
p.lead, p.note { color: #4a5468; margin: 4px 0 12px; }
section.card { background: #fff; border: 1px solid #dde1e8; border-radius: 8px; padding: 14px 18px;
               margin-top: 16px; }
.stats { display: grid; grid-template-columns: repeat(auto-fit, minmax(170px, 1fr)); gap: 10px; }
.stat { background: #fff; border: 1px solid #dde1e8; border-radius: 8px; padding: 10px 14px; }
.stat .value { font-size: 22px; font-weight: 600; }
.stat .label { color: #5b6476; font-size: 13px; }
.pair { display: grid; grid-template-columns: 1fr 1fr; gap: 16px; }
@media (max-width: 1000px) { .pair { grid-template-columns: 1fr; } }
table { border-collapse: collapse; width: 100%; font-size: 14px; }
th, td { text-align: left; padding: 6px 10px; border-bottom: 1px solid #e4e7ec; vertical-align: top; }
th { background: #f0f2f5; font-weight: 600; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
.flag { display: inline-block; border-radius: 4px; padding: 1px 7px; margin: 1px 0; font-size: 12px;
        font-weight: 600; color: #fff; white-space: nowrap; }
.ok { color: #2f7d32; }
.rank { display: inline-block; border-radius: 4px; padding: 1px 7px; margin: 1px 0; font-size: 12px;
        white-space: nowrap; border: 1px solid #c9ced8; }
.rank.bottleneck { border-color: #b26a00; color: #8a4f00; font-weight: 600; }
/* A table wider than the page scrolls inside its card: the page itself never scrolls sideways. */
.table-scroll { overflow-x: auto; }
td.reason { overflow-wrap: anywhere; }
#flagged-jobs td:first-child, #all-jobs td:first-child { min-width: 120px; }
#render-errors { background: #fdecea; color: #8a1c12; border: 1px solid #f5c2bd; border-radius: 6px;
                 padding: 10px 14px; white-space: pre-wrap; }
footer { color: #6b7385; font-size: 12px; margin-top: 28px; }
"""

# Before plotly.js loads: any script error (a plot that cannot draw) is shown on the page, not only in a console.
_ERROR_HOOK = """
window.addEventListener("error", function (event) {
  var message = "A plot could not be drawn: " + (event.message || "unknown error");
  var box = document.getElementById("render-errors");
  if (box) { box.hidden = false; box.textContent += message + "\\n"; }
  else { (window.otelOfuErrors = window.otelOfuErrors || []).push(message); }
});
"""

_ERROR_FLUSH = """
(function () {
  var box = document.getElementById("render-errors");
  var early = window.otelOfuErrors || [];
  if (typeof Plotly === "undefined") { early.push("The plotting library did not load: no plots can be drawn."); }
  if (early.length) { box.hidden = false; box.textContent += early.join("\\n") + "\\n"; }
})();
"""


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _percent(value: float | None) -> str:
    return percent(value)  # written as the terminal report writes it


def _scrolling(table: str) -> str:
    return f'<div class="table-scroll">{table}</div>'


def _number(value: float | None, digits: int = 2) -> str:
    if value is None:
        return "-"
    text = f"{value:.{digits}f}"
    return text[1:] if text.startswith("-") and float(text) == 0 else text  # no "-0.00"


def _figure_html(figure: go.Figure, div_id: str) -> str:
    height = int(figure.layout.height or 450)
    body: str = figure.to_html(
        full_html=False, include_plotlyjs=False, div_id=div_id, config=PLOTLY_CONFIG, default_height=f"{height}px"
    )
    return f'<div class="figure" id="{div_id}-figure">{body}</div>'


def _stat(value: str, label: str, element_id: str | None = None) -> str:
    where = f' id="{element_id}"' if element_id else ""
    return f'<div class="stat"{where}><div class="value">{_e(value)}</div><div class="label">{_e(label)}</div></div>'


def _fleet_r_stat(summary: FleetSummary) -> str:
    """The fleet's r as a headline only over enough jobs: over two or three it says next to nothing."""
    if summary.fleet_jobs < MIN_FLEET_R_JOBS:
        label = f"fleet r(OFU, MFU): {plural(summary.fleet_jobs, 'job')} with both; it needs {MIN_FLEET_R_JOBS} or more"
        return _stat("not enough jobs", label, "fleet-r")
    return _stat(_number(summary.correlation), f"fleet r(OFU, MFU) over {plural(summary.fleet_jobs, 'job')}", "fleet-r")


def _summary(summary: FleetSummary, flags: Sequence[Flag]) -> str:
    """The span, the fleet's figures (as ``summarize`` says them: a non-finite one is absent) and the last
    window's percentiles."""
    assert summary.start_ns is not None
    assert summary.end_ns is not None
    assert summary.last_width_ns is not None
    jobs, last_groups = summary.jobs, summary.last_groups
    with_mfu = sum(1 for job in jobs if job_point(job) is not None)
    flagged_jobs = len({flag.job.job_id for flag in flags})
    cards = [
        _stat(f"{summary.gpus}", f"GPUs in the last window (peak {summary.peak_gpus})"),
        _stat(f"{len(jobs)}", f"jobs ({with_mfu} report MFU)"),
        _fleet_r_stat(summary),
        _stat(_percent(summary.mae), "fleet MAE |OFU - MFU|"),
        _stat(f"{flagged_jobs}", "jobs flagged"),
    ]
    span = (
        f"{plural(summary.windows, 'window')} of {summary.last_width_ns / 1e9:g} s, "
        f"from {format_time(summary.start_ns)} to {format_time(summary.end_ns)}"
    )
    header = "".join(f'<th class="num">p{round(q * 100)}</th>' for q in names.QUANTILES)
    # One row per group (GPU model and precision), as the terminal report shows them: the same numbers.
    rows = []
    for group in last_groups:
        quantiles = group_quantiles([group]) or {}
        cells = "".join(f'<td class="num">{_percent(quantiles.get(q))}</td>' for q in names.QUANTILES)
        rows.append(
            f"<tr><td>{_e(group.attributes.get(names.HW_MODEL, 'unknown'))}</td>"
            f"<td>{_e(group.attributes.get(names.GPU_PRECISION, 'unknown'))}</td>"
            f'<td class="num">{group.gpus}</td>{cells}</tr>'
        )
    table = (
        _scrolling(
            '<table class="percentiles"><thead><tr><th>GPU model</th><th>precision</th><th class="num">GPUs</th>'
            f"{header}</tr></thead><tbody>{''.join(rows)}</tbody></table>"
        )
        if rows
        else '<p class="note">No GPU reported OFU in the last window.</p>'
    )
    return (
        f'<section class="summary"><p class="lead">{_e(span)}.</p><div class="stats">{"".join(cards)}</div>'
        f'<section class="card"><h3>OFU percentiles of the last window</h3>{table}</section></section>'
    )


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value / 1e9:.1f} GB/s"


def _loss_table(summary: FleetSummary, ranked: Sequence[Ranked]) -> str:
    """The lost GPU-hours and their cost by cause, per job and for the fleet; beside them each job's DRAM activity
    and link traffic (what tells the causes of non_tensor apart) where its GPUs reported them."""
    causes = summary.causes or CAUSES
    context = any(
        value is not None
        for job in summary.jobs
        for value in (job.loss.dram_active, job.loss.nvlink_bytes_per_s, job.loss.pcie_bytes_per_s)
    )
    header = "".join(f'<th class="num">{_e(cause)}</th>' for cause in causes)
    context_header = '<th class="num">DRAM</th><th class="num">NVLink</th><th class="num">PCIe</th>' if context else ""
    rows = []
    for job in [item.job for item in ranked][:MAX_TABLE_JOBS]:
        if job.loss.gpu_time_s <= 0:
            continue
        lost, cost_lost = job.loss.lost_s, job.loss.cost_lost
        cells = "".join(f'<td class="num">{_e(hours(lost[cause]))}</td>' for cause in causes)
        cost = "-" if cost_lost is None else money(sum(cost_lost.values()), job.loss.currency)
        beside = (
            f'<td class="num">{_e(_percent(job.loss.dram_active))}</td>'
            f'<td class="num">{_e(_rate(job.loss.nvlink_bytes_per_s))}</td>'
            f'<td class="num">{_e(_rate(job.loss.pcie_bytes_per_s))}</td>'
            if context
            else ""
        )
        rows.append(
            f"<tr><td>{_e(job.name)}</td><td>{_e(job.job_id)}</td>"
            f'<td class="num">{_e(hours(job.loss.gpu_time_s))}</td>{cells}'
            f'<td class="num">{_e(hours(sum(lost.values())))}</td><td class="num">{_e(cost)}</td>{beside}</tr>'
        )
    if summary.lost_s:
        cells = "".join(f'<td class="num">{_e(hours(summary.lost_s.get(cause, 0.0)))}</td>' for cause in causes)
        total = summary.cost_lost_total
        cost = "-" if total is None else money(total, summary.currency)
        gpu_time = sum(job.loss.gpu_time_s for job in summary.jobs)
        rows.append(
            f'<tr class="fleet"><td><b>the fleet</b></td><td></td><td class="num">{_e(hours(gpu_time))}</td>'
            f'{cells}<td class="num"><b>{_e(hours(summary.lost_total_s))}</b></td>'
            f'<td class="num"><b>{_e(cost)}</b></td>{"<td></td>" * 3 if context else ""}</tr>'
        )
    if not rows:
        return '<p class="note">No GPU time in this record.</p>'
    return _scrolling(
        '<table id="loss-by-cause"><thead><tr><th>job</th><th>id</th><th class="num">GPU time</th>'
        f'{header}<th class="num">lost</th><th class="num">lost cost</th>{context_header}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table>"
    )


def _goodput_section(reports: Sequence[WindowReport]) -> str:
    """Where each job's allocated GPU time went (``report.goodput``): a table, and the fleet's in a sentence; nothing
    where no window carries goodput (records from before it)."""
    goodput = goodput_summary(reports)
    if not goodput.jobs:
        return ""
    causes = goodput.causes
    header = "".join(f'<th class="num">{_e(cause)}</th>' for cause in causes)
    rows = []
    for row in goodput.jobs[:MAX_TABLE_JOBS]:
        cells = "".join(f'<td class="num">{_e(hours(row.badput_s.get(cause, 0.0)))}</td>' for cause in causes)
        rows.append(
            f"<tr><td>{_e(row.name or row.job_id)}</td><td>{_e(row.job_id)}</td>"
            f'<td class="num">{_e(hours(row.gpu_time_s))}</td><td class="num"><b>{_e(_percent(row.goodput))}</b></td>'
            f'<td class="num">{_e(_percent(row.goodput_flops))}</td>{cells}<td>{_e(row.basis)}</td></tr>'
        )
    note = (
        "Goodput: the share of a job's allocated GPU time that made progress, over the job so far (as Google's ML "
        "Productivity Goodput and Meta's ETTR count it, on GPU-seconds); FLOPs: the useful FLOPs of that time over "
        "the peak of the GPU time. Without progress: idle GPUs, a hang (every GPU running kernels with nothing "
        "moving) and reported checkpoint time, from the counters; and for a job that reports its steps, its startup, "
        "its recovery from a restart and the steps it did again (rework). Each GPU-second counts once."
    )
    line = goodput_line(goodput)
    return (
        f'<h2>Where GPU time went</h2><p class="note">{_e(note)}</p><section class="card">'
        + (f'<p class="lead" id="fleet-goodput">{_e(line)}</p>' if line else "")
        + _scrolling(
            '<table id="goodput"><thead><tr><th>job</th><th>id</th><th class="num">GPU time</th>'
            f'<th class="num">goodput</th><th class="num">FLOPs</th>{header}<th>basis</th></tr></thead>'
            f"<tbody>{''.join(rows)}</tbody></table>"
        )
        + "</section>"
    )


def _bottlenecks(summary: FleetSummary) -> str:
    """Each job's bottleneck in one sentence where one stands out (``report.causes``); nothing where no job's GPUs
    split the tensor pipes' loss."""
    split = [job for job in summary.jobs[:MAX_TABLE_JOBS] if any(part in job.loss.causes for part in TENSOR_PARTS)]
    if not split:
        return ""
    items = []
    for job in split:
        found = bottleneck_of(job)
        if found is not None:
            items.append(
                f'<li data-kind="{_e(found.kind)}"><b>{_e(job.name)}</b> <small>{_e(job.job_id)}</small>: '
                f"{_e(found.sentence)}.</li>"
            )
    if not items:
        return '<p class="note" id="no-bottleneck">No job\'s loss points to a single bottleneck.</p>'
    return f'<h3>Bottlenecks</h3><ul id="bottlenecks">{"".join(items)}</ul>'


def _flag_badge(kind: str) -> str:
    text = detector_for(kind).label
    return f'<span class="flag {kind}">{text}</span>'


def _flags_table(flags: Sequence[Flag]) -> str:
    if not flags:
        return '<p class="note ok" id="no-flags">No job raised a flag in this record.</p>'
    rows = []
    for flag in flags:
        job = flag.job
        state = "still flagged" if flag.active else "cleared"
        rows.append(
            "<tr>"
            f"<td><b>{_e(job.name)}</b><br><small>{_e(job.job_id)}</small></td>"
            f"{_model_cell(job.model, below=job.precision or '')}"
            f"<td>{_flag_badge(flag.kind)}</td>"
            f'<td class="reason">{_e(flag.reason)}</td>'
            f"<td>{state}</td>"
            "</tr>"
        )
    return _scrolling(
        '<table id="flagged-jobs"><thead><tr><th>job</th><th>GPU model</th><th>flag</th><th>why</th>'
        f"<th>at the end</th></tr></thead><tbody>{''.join(rows)}</tbody></table>"
    )


def _model_cell(model: str | None, below: str | None = None) -> str:
    """A table cell naming a GPU model by its one name, the device's own string on hover (``below``: a small
    second line, the precision)."""
    extra = f"<br><small>{_e(below)}</small>" if below is not None else ""
    if not model:
        return f"<td>-{extra}</td>"
    return f'<td title="{_e(model)}">{_e(shown_model(model))}{extra}</td>'


def _rank_cell(item: Ranked) -> str:
    """The flags column: the job's flag badges, else its bottleneck, else ok / no MFU; the rank's reason on hover."""
    badges = " ".join(_flag_badge(flag.kind) for flag in flags_of(item.job))
    if not badges:
        kind = "bottleneck" if item.tier in BOTTLENECK_TIERS.values() else "plain"
        badges = f'<span class="rank {kind}">{_e(item.label)}</span>'
    return f'<td title="{_e(item.why)}">{badges}</td>'


def _rank_legend(ranked: Sequence[Ranked]) -> str:
    items = "".join(f"<li>{_e(line)}</li>" for line in legend(ranked))
    return f'<p class="note">{_e(RANK_RULE)}</p><ol class="note" id="rank-legend">{items}</ol>'


def _jobs_table(ranked: Sequence[Ranked]) -> str:
    rows = []
    for item in ranked[:MAX_TABLE_JOBS]:
        job = item.job
        rows.append(
            f'<tr data-rank="{item.rank}">'
            f"<td>{_e(job.name)}</td><td>{_e(job.job_id)}</td>{_model_cell(job.model)}"
            f'<td>{_e(job.precision or "-")}</td><td class="num">{count(job.gpus)}</td>'
            f'<td class="num">{job.windows}</td><td class="num">{_percent(job.mean_ofu)}</td>'
            f'<td class="num">{_percent(job.mean_mfu)}</td><td class="num">{_number(job.mfu_over_ofu)}</td>'
            f'<td class="num">{_number(job.correlation)}</td><td class="num">{_e(hours(item.shortfall_s))}</td>'
            f"{_rank_cell(item)}</tr>"
        )
    more = (
        f'<p class="note">{len(ranked) - MAX_TABLE_JOBS} more jobs not listed.</p>'
        if len(ranked) > MAX_TABLE_JOBS
        else ""
    )
    return (
        _scrolling(
            '<table id="all-jobs"><thead><tr><th>job</th><th>id</th><th>GPU model</th><th>precision</th>'
            '<th class="num">GPUs</th><th class="num">windows</th><th class="num">mean OFU</th>'
            '<th class="num">mean MFU</th><th class="num">MFU/OFU</th><th class="num">r</th>'
            '<th class="num" title="GPU-hours short of the best OFU a job on the same GPU model reached">short of best'
            "</th><th>flags</th></tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table>"
        )
        + more
        + _rank_legend(ranked)
    )


def _timeline_jobs(jobs: Sequence[JobSummary]) -> list[JobSummary]:
    """Flagged jobs first, then the rest by name, up to MAX_TIMELINE_JOBS."""

    def order(job: JobSummary) -> tuple[int, str, str]:
        return (0 if job.flagged else 1, job.name, job.job_id)

    return sorted(jobs, key=order)[:MAX_TIMELINE_JOBS]


def build_report(
    reports: Sequence[WindowReport],
    *,
    title: str = DEFAULT_TITLE,
    ofu_samples: Mapping[str, Sequence[float]] | None = None,
    generated_ns: int | None = None,
    summary: FleetSummary | None = None,
) -> str:
    """The whole HTML page for these windows (any order); opens offline.

    ``summary``, when the caller has it already, must be ``summarize(reports)``.
    """
    ordered = sorted(reports, key=lambda r: (r.end_ns, r.start_ns))
    if summary is None:
        summary = summarize(ordered)
    jobs, flags = summary.jobs, fleet_flags(summary)
    ranked = rank(summary)
    parts = [f"<h1>{_e(title)}</h1>"]
    if generated_ns is not None:
        parts.append(f'<p class="note">Generated {_e(format_time(generated_ns))} by otel-ofu.</p>')
    parts.append('<div id="render-errors" hidden></div>')
    if not ordered:
        parts.append('<p class="lead" id="empty">No closed windows in this record: nothing to show yet.</p>')
    else:
        parts.append(_summary(summary, flags))
        parts.append('<h2>Flagged jobs</h2><section class="card">' + _flags_table(flags) + "</section>")
        scatter = scatter_figure(jobs)
        distribution = distribution_figure(ordered, ofu_samples)
        pair = []
        no_mfu = sum(1 for job in jobs if job_point(job) is None)
        if scatter is not None:
            note = (
                "Each job at its mean measured OFU and mean reported MFU over the windows that have both. "
                "A framework that counts FLOPs correctly sits near the dashed line (a little below: MFU leaves "
                "out recomputation and padding); one that over-counts stands far above it."
            )
            if no_mfu:
                note += f" {plural(no_mfu, 'job')} without reported MFU not shown."
            pair.append(
                f'<section class="card">{_figure_html(scatter, "ofu-mfu-scatter")}'
                f'<p class="note">{_e(note)}</p></section>'
            )
        else:
            pair.append(
                '<section class="card"><p class="note" id="no-mfu">No job reported MFU in this record: '
                "no OFU-vs-MFU comparison.</p></section>"
            )
        if distribution is not None:
            pair.append(f'<section class="card">{_figure_html(distribution, "ofu-distribution")}</section>')
        parts.append('<h2>OFU against reported MFU, and the fleet</h2><div class="pair">' + "".join(pair) + "</div>")
        percentiles = percentiles_figure(ordered)
        if percentiles is not None:
            parts.append(f'<section class="card">{_figure_html(percentiles, "ofu-percentiles")}</section>')
        loss = loss_figure(summary)
        if loss is not None:
            note = (
                "Each bar is a job's GPU time: the share that did useful tensor work (OFU) and the share lost to "
                "idle GPUs (no tensor activity), to a clock held below its max (power cap, heat, other limits) "
                "and to tensor pipes not kept busy (including tile padding). Where the GPUs report engine and SM "
                "activity, that last share is split: no kernel running (the host side: input pipeline, "
                "synchronisation, checkpoints), kernels running with SMs left empty, and SMs busy off the tensor "
                "pipes (memory-bound kernels, exposed communication, element-wise work); the job's DRAM activity "
                "and link traffic beside it tell those apart. Lost GPU-hours and their cost below; the cost is "
                "GPU time x the configured price per GPU-hour."
            )
            parts.append(
                f'<h2>Where OFU is lost</h2><p class="note">{_e(note)}</p>'
                f'<section class="card">{_figure_html(loss, "ofu-loss")}{_bottlenecks(summary)}'
                f"{_loss_table(summary, ranked)}</section>"
            )
        parts.append(_goodput_section(ordered))
        shown = _timeline_jobs(jobs)
        timelines = timelines_figure(shown)
        if timelines is not None:
            left_out = len(jobs) - len(shown)
            note = (
                "Shaded: the windows a flag was up (red: FLOP miscount, orange: OFU regression, purple: a "
                "straggler GPU, grey: idle GPUs, dark red: a hang); dotted purple: the straggler GPU's own OFU."
            )
            if left_out:
                note += f" {plural(left_out, 'more job')} not drawn; all are in the table below."
            parts.append(
                f'<h2>Jobs over time</h2><p class="note">{_e(note)}</p>'
                f'<section class="card">{_figure_html(timelines, "job-timelines")}</section>'
            )
        parts.append(
            '<h2>All jobs, most to act on first</h2><section class="card">' + _jobs_table(ranked) + "</section>"
        )
    parts.append(
        "<footer>OFU: tensor pipe activity x SM clock / max clock, measured on the GPUs; MFU: as the training "
        "framework reports it. Percentiles from exponential histograms merged exactly across windows.</footer>"
    )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_e(title)}</title><style>{_STYLE}{flag_styles()}</style>"
        f"<script>{_ERROR_HOOK}</script>"
        f'<script type="text/javascript">{get_plotlyjs()}</script>'
        f"</head><body><main>{''.join(parts)}</main><script>{_ERROR_FLUSH}</script></body></html>\n"
    )


def write_report(
    path: str | Path,
    reports: Sequence[WindowReport],
    *,
    title: str = DEFAULT_TITLE,
    ofu_samples: Mapping[str, Sequence[float]] | None = None,
    generated_ns: int | None = None,
    summary: FleetSummary | None = None,
) -> Path:
    """Write the page to ``path`` (replacing it whole, so a reader never sees half a page)."""
    target = Path(path)
    page = build_report(reports, title=title, ofu_samples=ofu_samples, generated_ns=generated_ns, summary=summary)
    partial = target.with_name(f".{target.name}.partial")
    partial.write_text(page, encoding="utf-8")
    partial.replace(target)
    return target
