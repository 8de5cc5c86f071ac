"""A self-contained HTML fleet report from closed windows: the picture people decide from.

One page, no network needed to open it (plotly.js is inlined once), with:

- a fleet summary (span, GPUs, jobs, fleet OFU-MFU correlation and MAE, OFU percentiles of the last window);
- the flagged jobs, each with its reason in words;
- OFU vs reported MFU, one point per job (means over the windows that have both), beside the line MFU = OFU:
  a framework that over-counts its FLOPs reports an MFU the tensor pipes never delivered, so its job stands
  far above the line (the paper's picture);
- the fleet OFU distribution per GPU model: a box per model from the run's exponential histograms merged
  exactly (each GPU counts once per window; whiskers p5-p95), or violins of raw per-GPU samples when a
  producer capture supplies them; and the per-model percentiles over time;
- per-job OFU and MFU timelines with the windows a flag was up shaded;
- every job in a table.

Every string that came from the network (job names, ids, models) is HTML-escaped, in the page and in the
plot labels alike (plotly renders a subset of HTML in labels and decodes entities, so escaped text shows
literally); plotly's JSON encoder escapes ``<``, ``>`` and ``/`` inside the script blocks.
"""

from __future__ import annotations

import datetime as dt
import html
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import plotly.graph_objects as go
from plotly.offline import get_plotlyjs
from plotly.subplots import make_subplots

from otel_ofu import names
from otel_ofu_collector.config import DEFAULT_HISTOGRAM_MAX_BUCKETS
from otel_ofu_collector.detectors import detector_for, hang
from otel_ofu_collector.report.causes import bottleneck_of
from otel_ofu_collector.report.goodput import goodput_line, goodput_summary
from otel_ofu_collector.report.ranking import BOTTLENECK_TIERS, RANK_RULE, Ranked, legend, rank
from otel_ofu_collector.report.summary import (
    CAUSE_WORDS,
    CAUSES,
    FLAG_KINDS,
    IDLE,
    MIN_FLEET_R_JOBS,
    MISCOUNT,
    REGRESSION,
    STRAGGLER,
    TENSOR_PARTS,
    Flag,
    FleetSummary,
    JobSummary,
    JobWindow,
    count,
    format_time,
    hours,
    model_name,
    money,
    percent,
    plural,
    summarize,
)
from otel_ofu_collector.results import GroupReport, WindowReport
from otel_ofu_collector.stats.exphist import ExpHistogram

DEFAULT_TITLE: Final = "otel-ofu fleet report"
# Beyond these the page grows without telling a person more; what is left out is said on the page.
MAX_TIMELINE_JOBS: Final = 24
MAX_TABLE_JOBS: Final = 200
MAX_VIOLIN_SAMPLES: Final = 4000
FLEET_LABEL: Final = "all GPUs"

COLOUR_HEALTHY: Final = "#1f77b4"
COLOUR_MISCOUNT: Final = "#d62728"
COLOUR_REGRESSION: Final = "#ff7f0e"
COLOUR_MFU: Final = "#2ca02c"
COLOUR_STRAGGLER: Final = "#9467bd"
# Each flag's colour: its badge (white bold text on it), the shading of the windows it was up and their
# legend. A flag without one here (a new detector) takes the next colour of FLAG_PALETTE in the
# vocabulary's order, so every flag the detectors define is styled without touching this file.
FLAG_COLOURS: Final = {
    MISCOUNT: COLOUR_MISCOUNT,
    REGRESSION: "#e8700c",  # COLOUR_REGRESSION darkened: white text on it stays readable
    STRAGGLER: COLOUR_STRAGGLER,
    IDLE: "#6f6f6f",
    hang.DETECTOR.kind: "#8b0000",  # dark red: a hung job holds every GPU it has and does nothing
}
FLAG_PALETTE: Final = ("#8c564b", "#1f6f8b", "#b5338a", "#5b7d1e", "#6a51a3")
SHADE_ALPHA: Final = 0.18
SHADE_LEGEND_ALPHA: Final = 0.5
# Where OFU went: achieved (the blue of OFU), then each cause of loss.
LOSS_COLOURS: Final = {
    "ofu": COLOUR_HEALTHY,
    names.OfuLossCause.IDLE: "#7f7f7f",
    names.OfuLossCause.CLOCK: "#ff7f0e",
    # The tensor pipes' loss split by what the engine and SMs did, from the host's side inwards: the lighter the
    # segment, the closer the time came to useful tensor work.
    names.OfuLossCause.NO_KERNEL: "#8c564b",
    names.OfuLossCause.SM_IDLE: "#e377c2",
    names.OfuLossCause.NON_TENSOR: "#bcbd22",
    names.OfuLossCause.TENSOR: "#c7c7c7",
    names.OfuLossCause.UNMEASURED: "#aec7e8",  # time without OFU: neither work (green) nor idleness (grey)
}
_SHADE_TITLE: Final = {
    MISCOUNT: "FLOP-miscount flag up",
    REGRESSION: "OFU-regression flag up",
    STRAGGLER: "straggler GPU flagged",
    IDLE: "idle GPUs flagged",
}
PLOTLY_CONFIG: Final = {"displaylogo": False, "responsive": True}
# From the bottom of the timelines' last subplot to their legend: past the tick labels and the axis title.
TIMELINE_LEGEND_GAP_PX: Final = 64
# GPU models get colours apart from the flag colours (red, orange), the same in every figure.
MODEL_PALETTE: Final = ("#1f77b4", "#9467bd", "#8c564b", "#17becf", "#bcbd22", "#e377c2", "#7f7f7f")


def flag_colour(kind: str, kinds: Sequence[str] = FLAG_KINDS) -> str:
    """The colour of a flag: its own, else the palette's, in the order of the flags that have none."""
    if kind in FLAG_COLOURS:
        return FLAG_COLOURS[kind]
    others = [k for k in kinds if k not in FLAG_COLOURS]
    position = others.index(kind) if kind in others else len(others)
    return FLAG_PALETTE[position % len(FLAG_PALETTE)]


def _rgba(colour: str, alpha: float) -> str:
    red, green, blue = (int(colour[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgba({red}, {green}, {blue}, {alpha})"


def flag_styles(kinds: Sequence[str] = FLAG_KINDS) -> str:
    """One CSS rule per flag kind, for its badge (``<span class="flag KIND">``)."""
    return "".join(f".flag.{kind} {{ background: {flag_colour(kind, kinds)}; }}\n" for kind in kinds)


# --- what the windows say, per job: summary.py condenses them and words the flags -------------------


def _plot_time(time_ns: int) -> str:
    """A timestamp plotly's date axis reads (UTC, no zone suffix: plotly does not shift zones)."""
    return dt.datetime.fromtimestamp(time_ns / 1e9, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")


def _point(job: JobSummary) -> tuple[float, float] | None:
    """The job's place on the scatter: mean OFU and mean reported MFU over the windows that have both."""
    ofu, mfu = job.mean_ofu, job.mean_mfu
    return None if ofu is None or mfu is None else (ofu, mfu)


# --- the fleet distribution ---------------------------------------------------------------------------


def _model_of(attributes: Mapping[str, str]) -> str:
    return attributes.get(names.HW_MODEL) or FLEET_LABEL


def _shown(model: str) -> str:
    """A GPU model as every report names it (the catalog's name: H100-SXM), whatever the device string."""
    return model_name(model) or model


def _merge(histograms: Sequence[ExpHistogram]) -> ExpHistogram:
    merged = ExpHistogram()
    for histogram in histograms:
        merged = merged.merge(histogram, max_buckets=DEFAULT_HISTOGRAM_MAX_BUCKETS)
    return merged


def model_histograms(reports: Sequence[WindowReport]) -> dict[str, ExpHistogram]:
    """Per GPU model, the per-GPU window OFU of the whole record (exact merge of the windows' histograms)."""
    by_model: dict[str, list[ExpHistogram]] = {}
    for report in reports:
        for group in report.groups:
            by_model.setdefault(_model_of(group.attributes), []).append(group.histogram)
    return {model: _merge(histograms) for model, histograms in sorted(by_model.items())}


def window_quantiles(report: WindowReport, model: str | None = None) -> dict[float, float] | None:
    """Percentiles of one window for one model (None: the whole fleet); exact when a single group holds them."""
    return group_quantiles(report.groups, model)


def group_quantiles(groups: Sequence[GroupReport], model: str | None = None) -> dict[float, float] | None:
    """Percentiles of one window's groups for one model (None: all of them)."""
    groups = [g for g in groups if model is None or _model_of(g.attributes) == model]
    if not groups:
        return None
    if len(groups) == 1 and all(q in groups[0].quantiles for q in names.QUANTILES):
        return {q: groups[0].quantiles[q] for q in names.QUANTILES}
    merged = _merge([g.histogram for g in groups])
    found = {q: merged.quantile(q) for q in names.QUANTILES}
    return {q: value for q, value in found.items() if value is not None} or None


def _model_colour(models: Sequence[str], model: str) -> str:
    return MODEL_PALETTE[models.index(model) % len(MODEL_PALETTE)]


def _thin(values: Sequence[float], limit: int) -> list[float]:
    """At most ``limit`` values that keep the shape: evenly spaced order statistics."""
    ordered = sorted(v for v in values if math.isfinite(v))
    if len(ordered) <= limit:
        return ordered
    step = (len(ordered) - 1) / (limit - 1)
    return [ordered[round(i * step)] for i in range(limit)]


# --- figures ------------------------------------------------------------------------------------------


def _label(text: str) -> str:
    """Text for a plot label: escaped, so plotly shows it literally instead of reading it as markup."""
    return html.escape(text, quote=False)


def _layout(figure: go.Figure, height: int, **extra: Any) -> None:
    figure.update_layout(
        template="plotly_white",
        height=height,
        margin={"l": 70, "r": 30, "t": 50, "b": 60},
        font={"family": "system-ui, -apple-system, Segoe UI, Roboto, sans-serif", "size": 13},
        **extra,
    )


def scatter_figure(jobs: Sequence[JobSummary]) -> go.Figure | None:
    points = [(job, pair) for job in jobs if (pair := _point(job)) is not None]
    if not points:
        return None
    top = max(0.1, *(max(pair) for _, pair in points)) * 1.1
    top = math.ceil(top * 10) / 10
    figure = go.Figure()
    figure.add_trace(
        go.Scatter(
            x=[0, top],
            y=[0, top],
            mode="lines",
            name="MFU = OFU",
            line={"color": "#7f7f7f", "dash": "dash", "width": 1.5},
            hoverinfo="skip",
        )
    )
    categories = (
        ("healthy", COLOUR_HEALTHY),
        ("suspected FLOP miscount", COLOUR_MISCOUNT),
        ("OFU regression", COLOUR_REGRESSION),
    )
    for title, colour in categories:
        chosen = [(job, pair) for job, pair in points if _category(job) == title]
        if not chosen:
            continue
        labelled = title != "healthy"
        figure.add_trace(
            go.Scatter(
                x=[pair[0] for _, pair in chosen],
                y=[pair[1] for _, pair in chosen],
                mode="markers+text" if labelled else "markers",
                name=title,
                text=[_label(job.name) for job, _ in chosen] if labelled else None,
                textposition="middle right",
                textfont={"color": colour},
                marker={"color": colour, "size": 12 if labelled else 10, "line": {"color": "white", "width": 1}},
                customdata=[_hover(job, pair) for job, pair in chosen],
                hovertemplate="%{customdata}<extra></extra>",
            )
        )
    _layout(
        figure,
        520,
        title={"text": "OFU vs reported MFU per job"},
        xaxis={"title": {"text": "mean OFU (measured)"}, "range": [0, top], "tickformat": ".0%", "constrain": "domain"},
        yaxis={
            "title": {"text": "mean reported MFU"},
            "range": [0, top],
            "tickformat": ".0%",
            "scaleanchor": "x",
            "scaleratio": 1,
        },
        legend={"orientation": "h", "y": -0.18},
    )
    return figure


def _category(job: JobSummary) -> str:
    """The scatter's colour: a FLOP miscount outranks a regression (it is what moves the point up)."""
    if job.miscount_windows:
        return "suspected FLOP miscount"
    if job.regression_windows:
        return "OFU regression"
    return "healthy"


def _hover(job: JobSummary, pair: tuple[float, float]) -> str:
    ratio = job.mfu_over_ofu
    lines = [
        f"<b>{_label(job.name)}</b> ({_label(job.job_id)})",
        f"{_label(_shown(job.model) if job.model else 'unknown model')}, "
        f"{_label(job.precision or 'unknown precision')}",
        f"OFU {pair[0]:.1%}, reported MFU {pair[1]:.1%}" + (f", MFU/OFU {ratio:.2f}" if ratio is not None else ""),
    ]
    if (r := job.correlation) is not None:
        lines.append(f"r(OFU, MFU) = {r:.2f}")
    return "<br>".join(lines)


def distribution_figure(
    reports: Sequence[WindowReport], ofu_samples: Mapping[str, Sequence[float]] | None
) -> go.Figure | None:
    figure = go.Figure()
    if ofu_samples:
        models = sorted(ofu_samples)
        for model, values in sorted(ofu_samples.items()):
            kept = _thin(values, MAX_VIOLIN_SAMPLES)
            if kept:
                figure.add_trace(
                    go.Violin(
                        y=kept,
                        name=_label(_shown(model)),
                        line={"color": _model_colour(models, model)},
                        box={"visible": True},
                        meanline={"visible": True},
                        points=False,
                        spanmode="hard",
                        hoverinfo="y+name",
                    )
                )
        subtitle = "per-GPU OFU samples of the capture"
    else:
        histograms = model_histograms(reports)
        models = sorted(histograms)
        for model, histogram in histograms.items():
            stats = {q: histogram.quantile(q) for q in (0.05, 0.25, 0.5, 0.75, 0.95)}
            if any(value is None for value in stats.values()):
                continue
            figure.add_trace(
                go.Box(
                    x=[_label(_shown(model))],
                    q1=[stats[0.25]],
                    median=[stats[0.5]],
                    q3=[stats[0.75]],
                    lowerfence=[stats[0.05]],
                    upperfence=[stats[0.95]],
                    mean=[histogram.sum / histogram.count],
                    name=_label(_shown(model)),
                    marker={"color": _model_colour(models, model)},
                    boxpoints=False,
                    hoverinfo="y+name",
                )
            )
        subtitle = "per-GPU window OFU over the run; box p25-p75, whiskers p5-p95"
    if not figure.data:
        return None
    _layout(
        figure,
        520,
        title={"text": f"Fleet OFU by GPU model<br><sup>{subtitle}</sup>"},
        yaxis={"title": {"text": "OFU"}, "tickformat": ".0%", "rangemode": "tozero"},
        showlegend=False,
    )
    return figure


def percentiles_figure(reports: Sequence[WindowReport]) -> go.Figure | None:
    models = sorted({_model_of(g.attributes) for r in reports for g in r.groups})
    if not models:
        return None
    figure = go.Figure()
    for model in models:
        colour = _model_colour(models, model)
        times, p25, p50, p75, p5, p95 = [], [], [], [], [], []
        for report in reports:
            quantiles = window_quantiles(report, model)
            if quantiles is None:
                continue
            times.append(_plot_time(report.end_ns))
            p5.append(quantiles.get(0.05))
            p25.append(quantiles.get(0.25))
            p50.append(quantiles.get(0.5))
            p75.append(quantiles.get(0.75))
            p95.append(quantiles.get(0.95))
        name = _label(_shown(model))
        band = colour + "33"
        figure.add_trace(
            go.Scatter(
                x=times, y=p25, mode="lines", line={"width": 0}, legendgroup=name, showlegend=False, hoverinfo="skip"
            )
        )
        figure.add_trace(
            go.Scatter(
                x=times,
                y=p75,
                mode="lines",
                line={"width": 0},
                fill="tonexty",
                fillcolor=band,
                legendgroup=name,
                name=f"{name} p25-p75",
                hoverinfo="skip",
            )
        )
        for values, label, dash in ((p5, "p5", "dot"), (p95, "p95", "dot"), (p50, "median", "solid")):
            figure.add_trace(
                go.Scatter(
                    x=times,
                    y=values,
                    mode="lines",
                    name=f"{name} {label}",
                    legendgroup=name,
                    showlegend=label == "median",
                    line={"color": colour, "dash": dash, "width": 2.2 if label == "median" else 1},
                    hovertemplate=f"{name} {label}: %{{y:.1%}}<extra></extra>",
                )
            )
    _layout(
        figure,
        380,
        title={
            "text": "Fleet OFU percentiles per window<br><sup>line: median; band: p25-p75; dotted: p5 and p95; "
            "time: window end, UTC</sup>"
        },
        yaxis={"title": {"text": "OFU"}, "tickformat": ".0%", "rangemode": "tozero"},
        hovermode="x unified",
        legend={"orientation": "h", "y": -0.2},
    )
    return figure


def _runs(windows: Sequence[JobWindow], kind: str) -> list[tuple[int, int]]:
    """Contiguous stretches of windows with the flag up, as (first start, last end)."""
    runs: list[tuple[int, int]] = []
    for window in windows:
        if not window.flag_up(kind):
            continue
        if runs and runs[-1][1] >= window.start_ns:
            runs[-1] = (runs[-1][0], window.end_ns)
        else:
            runs.append((window.start_ns, window.end_ns))
    return runs


def timelines_figure(jobs: Sequence[JobSummary]) -> go.Figure | None:
    if not jobs:
        return None
    titles = []
    for job in jobs:
        parts = [job.name if job.name == job.job_id else f"{job.name} ({job.job_id})"]
        parts += [part for part in (_shown(job.model) if job.model else None, job.precision) if part]
        titles.append(_label(" - ".join(parts)))
    rows = len(jobs)
    spacing = min(0.12, 0.5 / rows)
    figure = make_subplots(rows=rows, cols=1, shared_xaxes=True, subplot_titles=titles, vertical_spacing=spacing)
    top = max([0.1] + [v for job in jobs for w in job.history for v in (w.ofu, w.mfu) if v is not None]) * 1.1
    for row, job in enumerate(jobs, start=1):
        times = [_plot_time(w.end_ns) for w in job.history]
        mode = "lines+markers" if len(times) <= 60 else "lines"
        first = row == 1
        figure.add_trace(
            go.Scatter(
                x=times,
                y=[w.ofu for w in job.history],
                mode=mode,
                name="OFU (measured)",
                legendgroup="ofu",
                showlegend=first,
                line={"color": COLOUR_HEALTHY, "width": 2},
                marker={"size": 4},
                hovertemplate="OFU %{y:.1%}<extra></extra>",
            ),
            row=row,
            col=1,
        )
        if any(w.mfu is not None for w in job.history):
            figure.add_trace(
                go.Scatter(
                    x=times,
                    y=[w.mfu for w in job.history],
                    mode=mode,
                    name="MFU (reported)",
                    legendgroup="mfu",
                    showlegend=first,
                    line={"color": COLOUR_MFU, "width": 2, "dash": "dash"},
                    marker={"size": 4},
                    hovertemplate="MFU %{y:.1%}<extra></extra>",
                ),
                row=row,
                col=1,
            )
        if any(w.gpu_flags for w in job.history):
            # The straggler on its job's timeline: its OFU in the windows it was flagged.
            figure.add_trace(
                go.Scatter(
                    x=times,
                    y=[min((f.ofu for f in w.gpu_flags), default=None) for w in job.history],
                    mode="lines+markers",
                    name="straggler GPU OFU",
                    legendgroup="straggler",
                    showlegend=not any(any(w.gpu_flags for w in j.history) for j in jobs[: row - 1]),
                    line={"color": COLOUR_STRAGGLER, "width": 2, "dash": "dot"},
                    marker={"size": 4},
                    connectgaps=False,
                    hovertemplate="straggler GPU OFU %{y:.1%}<extra></extra>",
                ),
                row=row,
                col=1,
            )
        for kind in FLAG_KINDS:
            for start, end in _runs(job.history, kind):
                figure.add_vrect(
                    x0=_plot_time(start),
                    x1=_plot_time(end),
                    fillcolor=_rgba(flag_colour(kind), SHADE_ALPHA),
                    line_width=0,
                    layer="below",
                    row=row,
                    col=1,
                )
        figure.update_yaxes(range=[0, top], tickformat=".0%", row=row, col=1)
    for kind in FLAG_KINDS:
        title = _SHADE_TITLE.get(kind) or f"{detector_for(kind).label} flag up"
        if any(_runs(job.history, kind) for job in jobs):
            figure.add_trace(
                go.Scatter(
                    x=[None],
                    y=[None],
                    mode="markers",
                    name=title,
                    hoverinfo="skip",
                    marker={"symbol": "square", "size": 14, "color": _rgba(flag_colour(kind), SHADE_LEGEND_ALPHA)},
                ),
                row=1,
                col=1,
            )
    figure.update_xaxes(title={"text": "window end (UTC)"}, row=rows, col=1)
    # The legend goes below the x axis and its title, where nothing else is drawn: above the first subplot
    # it sat on the figure's title once it wrapped to a second row (plotly does not keep the two apart).
    # A margin for three rows of it; plotly widens the margin further when a narrow page needs more.
    top_margin, bottom_margin = 90, 150
    height = 150 * rows + top_margin + bottom_margin - 10
    legend_y = -TIMELINE_LEGEND_GAP_PX / (height - top_margin - bottom_margin)  # paper coordinates
    _layout(
        figure,
        height,
        title={"text": "Per-job OFU and reported MFU"},
        legend={"orientation": "h", "y": legend_y, "yanchor": "top", "x": 0.0, "xanchor": "left"},
        hovermode="x unified",
    )
    figure.update_layout(margin={"t": top_margin, "b": bottom_margin})
    return figure


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
    with_mfu = sum(1 for job in jobs if _point(job) is not None)
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


def loss_figure(summary: FleetSummary) -> go.Figure | None:
    """Each job's GPU time split into OFU and the causes of loss (GPU-time weighted), the fleet on top."""
    rows: list[tuple[str, dict[str, float]]] = []
    causes = summary.causes or CAUSES
    fleet_time = sum(job.gpu_time_s for job in summary.jobs)
    if fleet_time > 0 and summary.lost_s:
        lost = {cause: summary.lost_s.get(cause, 0.0) / fleet_time for cause in causes}
        rows.append(("the fleet", {"ofu": 1.0 - sum(lost.values()), **lost}))
    for job in summary.jobs[:MAX_TIMELINE_JOBS]:
        shares = job.loss_shares()
        if shares is not None:
            rows.append((job.name if job.name == job.job_id else f"{job.name} ({job.job_id})", shares))
    if not rows:
        return None
    figure = go.Figure()
    labels = [_label(label) for label, _ in reversed(rows)]
    for part in ("ofu", *causes):
        name = "OFU (useful tensor work)" if part == "ofu" else f"{part}: {CAUSE_WORDS[part]}"
        figure.add_trace(
            go.Bar(
                x=[shares[part] for _, shares in reversed(rows)],
                y=labels,
                orientation="h",
                name=name,
                marker={"color": LOSS_COLOURS[part]},
                hovertemplate=f"{name}: %{{x:.1%}}<extra></extra>",
            )
        )
    _layout(
        figure,
        70 + 34 * len(rows) + 80,
        title={"text": "Where each job's GPU time went: OFU and the loss by cause"},
        barmode="stack",
        xaxis={"tickformat": ".0%", "range": [0, 1]},
        legend={"orientation": "h", "y": -0.25},
    )
    return figure


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value / 1e9:.1f} GB/s"


def _loss_table(summary: FleetSummary, ranked: Sequence[Ranked]) -> str:
    """The lost GPU-hours and their cost by cause, per job and for the fleet; beside them each job's DRAM activity
    and link traffic (what tells the causes of non_tensor apart) where its GPUs reported them."""
    causes = summary.causes or CAUSES
    context = any(
        value is not None
        for job in summary.jobs
        for value in (job.dram_active, job.nvlink_bytes_per_s, job.pcie_bytes_per_s)
    )
    header = "".join(f'<th class="num">{_e(cause)}</th>' for cause in causes)
    context_header = '<th class="num">DRAM</th><th class="num">NVLink</th><th class="num">PCIe</th>' if context else ""
    rows = []
    for job in [item.job for item in ranked][:MAX_TABLE_JOBS]:
        if job.gpu_time_s <= 0:
            continue
        lost, cost_lost = job.lost_s, job.cost_lost
        cells = "".join(f'<td class="num">{_e(hours(lost[cause]))}</td>' for cause in causes)
        cost = "-" if cost_lost is None else money(sum(cost_lost.values()), job.currency)
        beside = (
            f'<td class="num">{_e(_percent(job.dram_active))}</td><td class="num">{_e(_rate(job.nvlink_bytes_per_s))}'
            f'</td><td class="num">{_e(_rate(job.pcie_bytes_per_s))}</td>'
            if context
            else ""
        )
        rows.append(
            f"<tr><td>{_e(job.name)}</td><td>{_e(job.job_id)}</td>"
            f'<td class="num">{_e(hours(job.gpu_time_s))}</td>{cells}'
            f'<td class="num">{_e(hours(sum(lost.values())))}</td><td class="num">{_e(cost)}</td>{beside}</tr>'
        )
    if summary.lost_s:
        cells = "".join(f'<td class="num">{_e(hours(summary.lost_s.get(cause, 0.0)))}</td>' for cause in causes)
        total = summary.cost_lost_total
        cost = "-" if total is None else money(total, summary.currency)
        gpu_time = sum(job.gpu_time_s for job in summary.jobs)
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
    split = [job for job in summary.jobs[:MAX_TABLE_JOBS] if any(part in job.causes for part in TENSOR_PARTS)]
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
    return f'<td title="{_e(model)}">{_e(_shown(model))}{extra}</td>'


def _rank_cell(item: Ranked) -> str:
    """The flags column: the job's flag badges, else its bottleneck, else ok / no MFU; the rank's reason on hover."""
    badges = " ".join(_flag_badge(flag.kind) for flag in item.job.flags())
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
    jobs, flags = summary.jobs, summary.flags()
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
        no_mfu = sum(1 for job in jobs if _point(job) is None)
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
