"""Clock domains: the error of normalising by the board's max SM clock instead of the tensor clock.

The datasheet's dense peak is specified at the tensor clock (H100 SXM: 132 SMs x 4096 FLOP/clk x 1.83 GHz
= 989.4 TFLOP/s) while NVML and DCGM report the board max (1980 MHz). OFU in the board domain is
TPA x f / f_board; in the tensor domain TPA x min(f / f_tensor, 1) (``ofu_math.ofu``). Their ratio is
f_board / f for f between the two clocks and f_board / f_tensor at or below the tensor clock: the board
domain under-reads by up to f_board / f_tensor (1.082x on H100 SXM). Above the tensor clock the tensor
pipes cannot go faster, so the domains converge at f = f_board.

Per catalog model: the worst-case factor, the error at a loaded clock (board max less a 40 MHz droop, as
the simulated fleet runs) and at a power-throttled clock (85% of the board max), in pp of OFU for a GPU at
TPA 0.45. Models without a published board max (B200, GB200) get no figures (no invented numbers).

Holds by construction, so no verdict: the factor is the catalog's board max over its tensor clock (1980 /
1830 MHz on H100 SXM = 1.082x, the published figure, because the published figure is that same quotient).
What the study adds is the size of the error at the clocks GPUs really run at.
"""

from __future__ import annotations

from benchmarks.common import BenchResult, RunContext, Table, doc_summary, new_figure, save_figure
from otel_ofu import catalog, ofu_math

TPA = 0.45
LOADED_DROOP_MHZ = 40.0
THROTTLED_FRACTION = 0.85


def error_factor(spec: catalog.GpuSpec, sm_clock_hz: float) -> float | None:
    """Tensor-domain OFU / board-domain OFU at this SM clock (1 = no error), None without both clocks."""
    if spec.boost_clock_hz is None or spec.tensor_clock_hz is None:
        return None
    board = ofu_math.raw_ofu(TPA, sm_clock_hz, spec.boost_clock_hz)
    tensor = ofu_math.ofu(TPA, sm_clock_hz, spec.boost_clock_hz, tensor_clock_hz=spec.tensor_clock_hz)
    return tensor / board


def run(ctx: RunContext) -> BenchResult:
    rows: list[tuple[str, ...]] = []
    records: list[dict[str, object]] = []
    h100_factor: float | None = None
    for spec in catalog.ALL_SPECS:
        board, tensor = spec.boost_clock_hz, spec.tensor_clock_hz
        if board is None or tensor is None:
            why = "board max not published" if board is None else "tensor clock unknown: board domain only"
            rows.append(
                (
                    spec.key,
                    f"{board / 1e6:.0f}" if board else "-",
                    f"{tensor / 1e6:.0f}" if tensor else "-",
                    "-",
                    "-",
                    "-",
                    why,
                )
            )
            board_mhz, tensor_mhz = board and board / 1e6, tensor and tensor / 1e6
            records.append({"model": spec.key, "board_mhz": board_mhz, "tensor_mhz": tensor_mhz})
            continue
        worst = error_factor(spec, min(board, tensor))
        loaded_hz = board - LOADED_DROOP_MHZ * 1e6
        throttled_hz = board * THROTTLED_FRACTION
        loaded = error_factor(spec, loaded_hz)
        throttled = error_factor(spec, throttled_hz)
        assert worst is not None
        assert loaded is not None
        assert throttled is not None
        if spec.key == "H100-SXM":
            h100_factor = worst
        pp_loaded = (
            ofu_math.ofu(TPA, loaded_hz, board, tensor_clock_hz=tensor) - ofu_math.raw_ofu(TPA, loaded_hz, board)
        ) * 100
        rows.append(
            (
                spec.key,
                f"{board / 1e6:.0f}",
                f"{tensor / 1e6:.0f}",
                f"{worst:.3f}x ({TPA * (1 - tensor / board) * 100:.2f} pp)",
                f"{loaded:.3f}x ({pp_loaded:.2f} pp)",
                f"{throttled:.3f}x",
                "same clock: no domain error" if worst == 1.0 else "",
            )
        )
        records.append(
            {
                "model": spec.key,
                "board_mhz": board / 1e6,
                "tensor_mhz": tensor / 1e6,
                "worst_factor": worst,
                "loaded_factor": loaded,
                "loaded_pp_at_tpa": pp_loaded,
                "throttled_factor": throttled,
            }
        )
    table = Table(
        f"Board-domain under-read per catalog model (TPA {TPA})",
        (
            "model",
            "board max MHz",
            "tensor MHz",
            "worst (f <= f_tensor)",
            f"loaded (max - {LOADED_DROOP_MHZ:.0f} MHz)",
            f"throttled ({THROTTLED_FRACTION:.0%} of max)",
            "note",
        ),
        rows,
        note="Factor = tensor-domain OFU / board-domain OFU; pp = OFU points lost by the board domain at that clock.",
    )
    if h100_factor is None:
        raise RuntimeError("the catalog has no H100-SXM with both clocks")
    return BenchResult(
        "clock_domains",
        "Study: clock domains",
        doc_summary(__doc__),
        tables=(table,),
        data={"tpa": TPA, "models": records},
        plots=(_plot(ctx),),
    )


def _plot(ctx: RunContext) -> str:
    figure, axes = new_figure()
    for spec in catalog.ALL_SPECS:
        if spec.boost_clock_hz is None or spec.tensor_clock_hz is None or spec.key.startswith("H200"):
            continue  # H200 share H100's clocks
        board = spec.boost_clock_hz
        clocks = [board * (0.6 + 0.4 * i / 200) for i in range(201)]
        factors = [error_factor(spec, f) or 1.0 for f in clocks]
        axes.plot([f / board for f in clocks], factors, label=spec.key)
    axes.set_xlabel("SM clock / board max clock")
    axes.set_ylabel("tensor-domain OFU / board-domain OFU")
    axes.set_title("Error of normalising by the board clock")
    axes.legend(fontsize=7)
    return save_figure(figure, ctx, "clock_domains")
