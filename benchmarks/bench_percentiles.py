"""Fleet percentiles from exponential histograms, single and merged across 2 / 8 / 32 shards, vs exact.

Ground truth: the exact percentiles of the same values (``quantiles.percentile_of_sorted``, the definition
the collector's histogram estimate also uses). Each fleet is split into shards at random (as a
``loadbalancing`` exporter routing by job would), each shard builds its histogram at the collector's default
size (``config.DEFAULT_HISTOGRAM_MAX_BUCKETS``), the shards are merged, and every quantile of
``names.QUANTILES`` is read from the merge. The OpenTelemetry SDK's default size (160 buckets) is shown too,
for information.

Error: relative, |estimate - exact| / exact. Where the exact percentile is 0 (idle GPUs: zeros have their
own exact bucket) relative error is undefined, so the absolute error is reported there instead; it is 0
unless the estimate is off the zero bucket.

Distributions (OFU in [0, 1]): a bimodal fleet (25% idle GPUs at exactly 0 or at 0.03-0.4% from a stray
kernel at the idle clock, the rest busy around 0.45), a narrow one (0.40 +- 0.01) and a heavy-tailed
one (log-normal around 0.05 spanning four decades, clipped to 1), which forces a coarser scale.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence

from benchmarks.common import BenchResult, RunContext, Table, Verdict, doc_summary, fmt, new_figure, pct, save_figure
from otel_ofu import names
from otel_ofu_collector.config import DEFAULT_HISTOGRAM_MAX_BUCKETS
from otel_ofu_collector.stats.exphist import ExpHistogram, relative_error_bound
from otel_ofu_collector.stats.quantiles import percentile_of_sorted

SHARDS = (1, 2, 8, 32)
OTEL_SDK_DEFAULT_BUCKETS = 160
TARGET_RELATIVE = 0.01


def bimodal(rng: random.Random, n: int) -> list[float]:
    values = []
    for _ in range(n):
        if rng.random() < 0.25:
            values.append(0.0 if rng.random() < 0.7 else rng.uniform(0.0003, 0.004))
        else:
            values.append(min(1.0, max(0.0, rng.gauss(0.45, 0.09))))
    return values


def narrow(rng: random.Random, n: int) -> list[float]:
    return [min(1.0, max(0.0, rng.gauss(0.40, 0.01))) for _ in range(n)]


def heavy_tail(rng: random.Random, n: int) -> list[float]:
    return [min(1.0, rng.lognormvariate(math.log(0.05), 1.4)) for _ in range(n)]


DISTRIBUTIONS: dict[str, Callable[[random.Random, int], list[float]]] = {
    "bimodal idle/busy": bimodal,
    "narrow ~0.40": narrow,
    "heavy tail": heavy_tail,
}


def merged_histogram(values: Sequence[float], shards: int, max_buckets: int, rng: random.Random) -> ExpHistogram:
    parts: list[list[float]] = [[] for _ in range(shards)]
    for value in values:
        parts[rng.randrange(shards)].append(value)
    histograms = [ExpHistogram.from_values(part, max_buckets=max_buckets) for part in parts]
    merged = histograms[0]
    for histogram in histograms[1:]:
        merged = merged.merge(histogram, max_buckets=max_buckets)
    return merged


def errors(histogram: ExpHistogram, ordered: Sequence[float]) -> tuple[float, float, list[dict[str, float | None]]]:
    """(worst relative error where exact > 0, worst absolute error where exact == 0, per quantile)."""
    worst_rel = 0.0
    worst_abs_at_zero = 0.0
    per_quantile: list[dict[str, float | None]] = []
    for q in names.QUANTILES:
        exact = percentile_of_sorted(ordered, q)
        estimate = histogram.quantile(q)
        assert estimate is not None
        if exact > 0.0:
            worst_rel = max(worst_rel, abs(estimate - exact) / exact)
            relative: float | None = abs(estimate - exact) / exact
            absolute: float | None = None
        else:
            relative = None
            absolute = abs(estimate - exact)
            worst_abs_at_zero = max(worst_abs_at_zero, abs(estimate - exact))
        per_quantile.append(
            {"q": q, "exact": exact, "estimate": estimate, "relative": relative, "absolute_at_zero": absolute}
        )
    return worst_rel, worst_abs_at_zero, per_quantile


def run(ctx: RunContext) -> BenchResult:
    n = 20_000 if ctx.quick else 100_000
    sizes = (DEFAULT_HISTOGRAM_MAX_BUCKETS, OTEL_SDK_DEFAULT_BUCKETS)
    rows: list[tuple[str, ...]] = []
    records: list[dict[str, object]] = []
    worst_default = 0.0
    worst_zero_abs = 0.0
    merge_exact = True
    plot_data: dict[tuple[str, int], list[float]] = {}
    for dist_name, generate in DISTRIBUTIONS.items():
        values = generate(random.Random(f"percentiles/{dist_name}"), n)
        ordered = sorted(values)
        single = ExpHistogram.from_values(values, max_buckets=DEFAULT_HISTOGRAM_MAX_BUCKETS)
        for size in sizes:
            for shards in SHARDS:
                histogram = merged_histogram(values, shards, size, random.Random(f"shards/{dist_name}/{shards}"))
                if size == DEFAULT_HISTOGRAM_MAX_BUCKETS:
                    merge_exact = merge_exact and histogram == single
                worst_rel, zero_abs, per_quantile = errors(histogram, ordered)
                bound = relative_error_bound(histogram.scale)
                if size == DEFAULT_HISTOGRAM_MAX_BUCKETS:
                    worst_default = max(worst_default, worst_rel)
                    worst_zero_abs = max(worst_zero_abs, zero_abs)
                    plot_data[(dist_name, shards)] = [
                        (entry["relative"] or 0.0) * 100
                        for entry in per_quantile  # zeros plotted at 0
                    ]
                zero_quantiles = sum(1 for entry in per_quantile if entry["relative"] is None)
                rows.append(
                    (
                        dist_name,
                        str(size),
                        str(shards),
                        str(histogram.scale),
                        pct(bound, 2),
                        pct(worst_rel, 3),
                        f"{fmt(zero_abs)} ({zero_quantiles} q)" if zero_quantiles else "-",
                        "met" if worst_rel <= TARGET_RELATIVE else "**missed**",
                    )
                )
                records.append(
                    {
                        "distribution": dist_name,
                        "max_buckets": size,
                        "shards": shards,
                        "scale": histogram.scale,
                        "error_bound": bound,
                        "worst_relative": worst_rel,
                        "worst_absolute_at_zero": zero_abs,
                        "quantiles": per_quantile,
                    }
                )
    plots = (_plot(ctx, plot_data),)
    verdicts = (
        Verdict(
            f"merged-histogram percentiles vs exact, worst relative error ({DEFAULT_HISTOGRAM_MAX_BUCKETS} buckets)",
            worst_default * 100,
            TARGET_RELATIVE * 100,
            "%",
        ),
    )
    table = Table(
        f"Worst error over quantiles {', '.join(str(q) for q in names.QUANTILES)} ({n:,} GPUs per fleet)",
        (
            "distribution",
            "max buckets",
            "shards",
            "scale",
            "bound",
            "worst relative",
            "abs. error where exact = 0",
            "1% target",
        ),
        rows,
        note=(
            "Shards merged with `ExpHistogram.merge`; at the collector default "
            f"({DEFAULT_HISTOGRAM_MAX_BUCKETS} buckets) the merge of every shard count "
            f"{'equals' if merge_exact else 'does NOT equal'} the single-process histogram bucket for bucket. "
            "Where the exact percentile is 0 relative error is undefined and the absolute error is shown "
            f"(worst: {fmt(worst_zero_abs)}). {OTEL_SDK_DEFAULT_BUCKETS} buckets is the OpenTelemetry SDK default, "
            "for information; the target is judged at the collector's default."
        ),
    )
    return BenchResult(
        "percentiles",
        "Percentiles: merged exponential histograms vs exact",
        doc_summary(__doc__),
        tables=(table,),
        verdicts=verdicts,
        data={"gpus_per_fleet": n, "merge_equals_single": merge_exact, "records": records},
        plots=plots,
    )


def _plot(ctx: RunContext, data: dict[tuple[str, int], list[float]]) -> str:
    figure, axes = new_figure()
    x = list(range(len(names.QUANTILES)))
    for (dist_name, shards), errs in data.items():
        if shards in (1, 32):
            axes.plot(x, errs, marker="o", label=f"{dist_name}, {shards} shard{'s' if shards > 1 else ''}")
    axes.axhline(TARGET_RELATIVE * 100, color="red", linestyle="--", label="target 1%")
    axes.set_xticks(x, [str(q) for q in names.QUANTILES])
    axes.set_xlabel("quantile")
    axes.set_ylabel("relative error vs exact (%)")
    axes.set_title(f"Exponential-histogram percentiles ({DEFAULT_HISTOGRAM_MAX_BUCKETS} buckets)")
    axes.legend(fontsize=7)
    return save_figure(figure, ctx, "percentiles")
