"""The HTML fleet report's figures (plotly), each from the summary or the windows; the page lays them out.

- OFU vs reported MFU, one point per job (means over the windows that have both), beside the line MFU = OFU:
  a framework that over-counts its FLOPs reports an MFU the tensor pipes never delivered, so its job stands
  far above the line (the paper's picture);
- the fleet OFU distribution per GPU model: a box per model from the run's exponential histograms merged
  exactly (each GPU counts once per window; whiskers p5-p95), or violins of raw per-GPU samples when a
  producer capture supplies them; and the per-model percentiles over time;
- where each job's GPU time went: OFU and the loss by cause;
- per-job OFU and MFU timelines with the windows a flag was up shaded.

Every string that came from the network (job names, ids, models) is HTML-escaped in the plot labels
(plotly renders a subset of HTML in labels and decodes entities, so escaped text shows literally).
"""

from __future__ import annotations

import datetime as dt
import html
import math
from collections.abc import Mapping, Sequence
from typing import Any, Final

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from otel_ofu import names
from otel_ofu_collector.config import DEFAULT_HISTOGRAM_MAX_BUCKETS
from otel_ofu_collector.detectors import detector_for
from otel_ofu_collector.report.summary import (
    CAUSE_WORDS,
    CAUSES,
    FLAG_KINDS,
    HANG,
    IDLE,
    MISCOUNT,
    REGRESSION,
    STRAGGLER,
    FleetSummary,
    JobSummary,
    JobWindow,
    model_name,
)
from otel_ofu_collector.results import GroupReport, WindowReport
from otel_ofu_collector.stats.exphist import ExpHistogram

# Beyond these a figure grows without telling a person more; what is left out is said on the page.
MAX_TIMELINE_JOBS: Final = 24
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
    HANG: "#8b0000",  # dark red: a hung job holds every GPU it has and does nothing
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


# --- where windows and jobs sit on the axes -----------------------------------------------------------


def _plot_time(time_ns: int) -> str:
    """A timestamp plotly's date axis reads (UTC, no zone suffix: plotly does not shift zones)."""
    return dt.datetime.fromtimestamp(time_ns / 1e9, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")


def job_point(job: JobSummary) -> tuple[float, float] | None:
    """The job's place on the scatter: mean OFU and mean reported MFU over the windows that have both."""
    ofu, mfu = job.mean_ofu, job.mean_mfu
    return None if ofu is None or mfu is None else (ofu, mfu)


# --- the fleet distribution ---------------------------------------------------------------------------


def _model_of(attributes: Mapping[str, str]) -> str:
    return attributes.get(names.HW_MODEL) or FLEET_LABEL


def shown_model(model: str) -> str:
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
    points = [(job, pair) for job in jobs if (pair := job_point(job)) is not None]
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
        f"{_label(shown_model(job.model) if job.model else 'unknown model')}, "
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
                        name=_label(shown_model(model)),
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
                    x=[_label(shown_model(model))],
                    q1=[stats[0.25]],
                    median=[stats[0.5]],
                    q3=[stats[0.75]],
                    lowerfence=[stats[0.05]],
                    upperfence=[stats[0.95]],
                    mean=[histogram.sum / histogram.count],
                    name=_label(shown_model(model)),
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
        name = _label(shown_model(model))
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
        parts += [part for part in (shown_model(job.model) if job.model else None, job.precision) if part]
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


def loss_figure(summary: FleetSummary) -> go.Figure | None:
    """Each job's GPU time split into OFU and the causes of loss (GPU-time weighted), the fleet on top."""
    rows: list[tuple[str, dict[str, float]]] = []
    causes = summary.causes or CAUSES
    fleet_time = sum(job.loss.gpu_time_s for job in summary.jobs)
    if fleet_time > 0 and summary.lost_s:
        lost = {cause: summary.lost_s.get(cause, 0.0) / fleet_time for cause in causes}
        rows.append(("the fleet", {"ofu": 1.0 - sum(lost.values()), **lost}))
    for job in summary.jobs[:MAX_TIMELINE_JOBS]:
        shares = job.loss.shares
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
