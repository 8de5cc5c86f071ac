"""Clock sampling noise: OFU error vs sampling interval when TPA is an interval average and the clock is not.

TPA (DCGM 1004, GPM) is an average over the interval; the SM clock (DCGM 100, NVML) is an instantaneous
sample. Under throttling the clock moves within the interval, so TPA x f_sample / f_max differs from the
true interval OFU, mean(TPA(t) f(t)) / f_max. Four ways to get the clock, for intervals of 1-60 s:

* point: one sample at the end of the interval (what dcgm-exporter and a plain NVML read give);
* sub-sampled 1 Hz and 10 Hz: the mean of samples at that rate over the interval (the NVML source's
  background thread, 10 Hz by default);
* cycle counters: deltas of SM-cycles-elapsed and MMA-cycles-active (DCGM 1084/1086, GPM 248/250) through
  ``ofu_math.ofu_from_cycles``: exact by construction, in the board domain.

Traces are generated here at 100 Hz for H100 SXM GPUs running training steps (compute/communication
phases, data-loader stalls) with clocks that boost near 1980 MHz with a load droop and fall into
power-throttle episodes (81-88.5% of max for 20-150 s) in which the clock follows power within a few
hundred ms, lower while the tensor pipes are busy. Errors in percentage points of OFU, for the published
board-domain formula (``gpu.ofu.raw``) and the tensor-domain ``gpu.ofu`` the producer exports. The project's
simulated fleet (1 s grid, ``SimulatedFleet.demo``) is measured too, point sample vs cycle counters.
A published figure is < 0.22 pp at 5-30 s; here the point-sample error is shown over many generator
seeds, with no verdict (the generator's noise parameters are this study's, not measured).
"""

from __future__ import annotations

import statistics

import numpy as np
import numpy.typing as npt

from benchmarks.common import BenchResult, RunContext, Table, doc_summary, new_figure, save_figure
from otel_ofu import catalog, gpu_values, ofu_math
from otel_ofu.clock import ManualClock
from otel_ofu.sources.simulated import SimulatedFleet

Array = npt.NDArray[np.float64]
INTERVALS_S = (1, 5, 10, 30, 60)
DT = 0.01
SPEC = catalog.H100_SXM
F_MAX = float(SPEC.boost_clock_hz or 1980e6)
F_TENSOR = float(SPEC.tensor_clock_hz or F_MAX)
METHODS = ("point", "sub-sampled 1 Hz", "sub-sampled 10 Hz", "cycle counters")
PAPER_PP = 0.22


def trace(rng: np.random.Generator, seconds: float, throttling: bool = True) -> tuple[Array, Array]:
    """(TPA, SM clock Hz) at 100 Hz for one GPU; ``throttling`` False: no power-throttle episodes."""
    n = round(seconds / DT)
    t = np.arange(n) * DT
    nominal = rng.uniform(0.25, 0.6)
    period = rng.uniform(0.6, 2.0)
    phase = (t / period + rng.uniform()) % 1.0
    tpa = np.where(phase < 0.75, nominal * 1.25, nominal * 0.25) * (1 + 0.08 * rng.standard_normal(n))
    stall_starts = np.flatnonzero(rng.random(n) < 0.01 * DT)
    for start in stall_starts:
        tpa[start : start + round(rng.uniform(0.5, 3.0) / DT)] *= 0.3
    tpa = np.clip(tpa, 0.0, 1.0)
    # Power follows load within ~0.3 s: a smoothed load drives the droop and the throttled clock.
    alpha = DT / 0.3
    smooth = np.empty(n)
    level = float(tpa[0])
    for i in range(n):
        level += alpha * (float(tpa[i]) - level)
        smooth[i] = level
    mhz = F_MAX / 1e6 - 40.0 * smooth / 0.45 - np.abs(rng.normal(0.0, 15.0, n))
    throttled = np.zeros(n, dtype=bool)
    i = 0 if throttling else n
    while i < n:
        gap = rng.exponential(200.0)
        i += round(gap / DT)
        length = round(rng.uniform(20.0, 150.0) / DT)
        level_mhz = F_MAX / 1e6 * rng.uniform(0.81, 0.885)
        end = min(n, i + length)
        if i < n:
            throttled[i:end] = True
            mhz[i:end] = level_mhz - 120.0 * (smooth[i:end] - nominal) + rng.normal(0.0, 20.0, end - i)
        i = end
    mhz = F_MAX / 1e6 - 15.0 * np.round(np.maximum(0.0, F_MAX / 1e6 - mhz) / 15.0)
    return tpa, np.minimum(mhz, F_MAX / 1e6) * 1e6


def interval_errors(
    tpa: Array, hz: Array, interval_s: int, phase_rng: np.random.Generator
) -> dict[str, dict[str, Array]]:
    """Per interval: |estimate - truth| in pp per method, board and tensor domain."""
    steps = round(interval_s / DT)
    count = len(tpa) // steps
    tpa_i = tpa[: count * steps].reshape(count, steps)
    hz_i = hz[: count * steps].reshape(count, steps)
    mean_tpa = tpa_i.mean(axis=1)
    truth_board = (tpa_i * hz_i).mean(axis=1) / F_MAX
    truth_tensor = (tpa_i * np.minimum(hz_i / F_TENSOR, 1.0)).mean(axis=1)
    clocks: dict[str, Array] = {"point": hz_i[:, -1]}
    for label, rate in (("sub-sampled 1 Hz", 1.0), ("sub-sampled 10 Hz", 10.0)):
        stride = round(1.0 / rate / DT)
        offset = int(phase_rng.integers(0, stride))
        clocks[label] = hz_i[:, offset::stride].mean(axis=1)
    out: dict[str, dict[str, Array]] = {"board": {}, "tensor": {}}
    for label, f in clocks.items():
        out["board"][label] = np.abs(mean_tpa * f / F_MAX - truth_board) * 100
        out["tensor"][label] = np.abs(mean_tpa * np.minimum(f / F_TENSOR, 1.0) - truth_tensor) * 100
    board_c = np.empty(count)
    tensor_c = np.empty(count)
    for j in range(count):
        elapsed = round(float(hz_i[j].sum()) * DT)
        active = round(float((tpa_i[j] * hz_i[j]).sum()) * DT)
        exact = ofu_math.ofu_from_cycles(active, elapsed, float(interval_s), F_MAX, tensor_clock_hz=F_TENSOR)
        board_c[j] = ofu_math.raw_ofu(exact.tensor_active, exact.mean_sm_clock_hz, F_MAX)
        tensor_c[j] = exact.ofu
    out["board"]["cycle counters"] = np.abs(board_c - truth_board) * 100
    out["tensor"]["cycle counters"] = np.abs(tensor_c - truth_tensor) * 100
    return out


def simulator_errors(interval_s: int, seconds: float) -> dict[str, float]:
    """MAE (pp) of gpu.ofu vs ground truth on the project's simulated demo fleet: point sample vs cycles."""
    results: dict[str, float] = {}
    for label, cycles in (("point", False), ("cycle counters", True)):
        clock = ManualClock()
        fleet = SimulatedFleet.demo(clock=clock, cycle_counters=cycles)
        errs: list[float] = []
        for _ in range(round(seconds / interval_s)):
            clock.advance(interval_s)
            for reading in fleet.read().readings:
                if reading.truth_ofu is None or (reading.truth_ofu == 0.0 and reading.tensor_active == 0.0):
                    continue
                values = gpu_values.compute(reading)
                errs.append(abs(values.ofu - reading.truth_ofu) * 100)
        results[label] = statistics.fmean(errs)
    return results


def run(ctx: RunContext) -> BenchResult:
    gpus, seconds = (4, 600.0) if ctx.quick else (16, 1800.0)
    rng = np.random.default_rng(20260529)
    scenarios = {"throttling": True, "steady": False}
    stats: dict[str, dict[str, dict[int, dict[str, dict[str, float]]]]] = {}
    for scenario, throttling in scenarios.items():
        traces = [trace(rng, seconds, throttling) for _ in range(gpus)]
        stats[scenario] = _scenario_stats(traces, rng)
    tables = [
        Table(
            f"Generated traces, {scenario}, {domain} domain "
            f"({'gpu.ofu.raw, the published formula' if domain == 'board' else 'gpu.ofu'}): "
            f"MAE / p95 in pp ({gpus} GPUs x {seconds:.0f} s at 100 Hz)",
            ("interval", *METHODS),
            [
                (
                    f"{interval} s",
                    *(
                        f"{stats[scenario][domain][interval][m]['mae']:.3f} / "
                        f"{stats[scenario][domain][interval][m]['p95']:.3f}"
                        for m in METHODS
                    ),
                )
                for interval in INTERVALS_S
            ],
        )
        for scenario, domain in (("throttling", "board"), ("throttling", "tensor"), ("steady", "board"))
    ]
    sim_seconds = 600.0 if ctx.quick else 1800.0
    sim_rows: list[tuple[str, ...]] = []
    sim_data: dict[int, dict[str, float]] = {}
    for interval in (5, 10, 30, 60):
        sim_data[interval] = simulator_errors(interval, sim_seconds)
        sim_rows.append(
            (f"{interval} s", f"{sim_data[interval]['point']:.3f}", f"{sim_data[interval]['cycle counters']:.4f}")
        )
    tables.append(
        Table(
            f"Project simulator (SimulatedFleet.demo, {len(SimulatedFleet.demo().gpus)} GPUs x {sim_seconds:.0f} s, "
            "1 s grid): "
            "gpu.ofu MAE vs truth in pp",
            ("interval", "point sample", "cycle counters"),
            sim_rows,
            note="The simulator's clock is constant within its 1 s grid, so it has less sub-interval structure than "
            "the generated traces; its truth is the tensor-domain OFU.",
        )
    )
    # The trace generator's noise constants are modelling choices, not measurements, so one seed's figure
    # proves nothing: the point-sample MAE at 5-30 s is reported over many seeds as a distribution, and
    # compared with the published figure only as such (no verdict).
    seeds = range(6) if ctx.quick else range(12)
    seed_gpus, seed_seconds = 4, 300.0
    spread: dict[str, list[float]] = {"throttling": [], "steady": []}
    for seed in seeds:
        seeded = np.random.default_rng(seed)
        for scenario, throttling in scenarios.items():
            traces = [trace(seeded, seed_seconds, throttling) for _ in range(seed_gpus)]
            board = _scenario_stats(traces, seeded)["board"]
            spread[scenario].append(max(board[i]["point"]["mae"] for i in (5, 10, 30)))
    tables.append(
        Table(
            f"Point-sampled clock, board-domain MAE (worst of 5/10/30 s) over {len(seeds)} seeds of the trace "
            f"generator ({seed_gpus} GPUs x {seed_seconds:.0f} s each)",
            ("scenario", "min pp", "median pp", "max pp", f"seeds above {PAPER_PP} pp (published bound)"),
            [
                (
                    scenario,
                    f"{min(values):.3f}",
                    f"{statistics.median(values):.3f}",
                    f"{max(values):.3f}",
                    f"{sum(v > PAPER_PP for v in values)} / {len(values)}",
                )
                for scenario, values in spread.items()
            ],
            note="No verdict: the traces' noise parameters are this study's own, so whether the error stays under "
            "the published bound depends on them (and on the seed). Cycle counters are exact by construction "
            "(they invert the very trace that produced them) and carry no verdict either.",
        )
    )
    return BenchResult(
        "clock_sampling",
        "Study: clock sampling noise",
        doc_summary(__doc__),
        tables=tables,
        data={
            "gpus": gpus,
            "seconds": seconds,
            "seed_spread_pp": spread,
            "stats": _keys_to_str(stats),
            "simulator": _keys_to_str(sim_data),
        },
        plots=(_plot(ctx, stats),),
    )


def _scenario_stats(
    traces: list[tuple[Array, Array]], rng: np.random.Generator
) -> dict[str, dict[int, dict[str, dict[str, float]]]]:
    stats: dict[str, dict[int, dict[str, dict[str, float]]]] = {"board": {}, "tensor": {}}
    for interval in INTERVALS_S:
        pooled: dict[str, dict[str, list[Array]]] = {d: {m: [] for m in METHODS} for d in stats}
        for tpa, hz in traces:
            errs = interval_errors(tpa, hz, interval, rng)
            for domain in pooled:
                for method in METHODS:
                    pooled[domain][method].append(errs[domain][method])
        for domain, by_method in pooled.items():
            stats[domain][interval] = {}
            for method, arrays in by_method.items():
                values = np.concatenate(arrays)
                stats[domain][interval][method] = {
                    "mae": float(values.mean()),
                    "p95": float(np.percentile(values, 95)),
                    "max": float(values.max()),
                }
    return stats


def _keys_to_str(value: object) -> object:
    if isinstance(value, dict):
        return {str(key): _keys_to_str(item) for key, item in value.items()}
    return value


def _plot(ctx: RunContext, stats: dict[str, dict[str, dict[int, dict[str, dict[str, float]]]]]) -> str:
    figure, axes = new_figure()
    floor = 2e-3  # cycle counters are exact up to rounding (~1e-8 pp): drawn at the floor
    colors = dict(zip(METHODS, ("tab:blue", "tab:orange", "tab:green", "tab:red"), strict=True))
    for scenario, style in (("throttling", "-"), ("steady", ":")):
        for method in METHODS:
            maes = [max(stats[scenario]["board"][i][method]["mae"], floor) for i in INTERVALS_S]
            label = f"{method} ({scenario})" + (", exact: at the floor" if method == "cycle counters" else "")
            axes.plot(INTERVALS_S, maes, marker="o", linestyle=style, color=colors[method], label=label)
    axes.axhline(PAPER_PP, color="red", linestyle="--", label="published: < 0.22 pp at 5-30 s")
    axes.set_xscale("log")
    axes.set_yscale("log")
    axes.set_xticks(list(INTERVALS_S), [str(i) for i in INTERVALS_S])
    axes.set_xlabel("sampling interval (s)")
    axes.set_ylabel("MAE of OFU vs truth (pp, board domain)")
    axes.set_title("Clock sampling noise under throttling")
    axes.legend(fontsize=7)
    return save_figure(figure, ctx, "clock_sampling")
