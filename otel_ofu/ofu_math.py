"""The OFU math: pure functions, no I/O.

    OFU = TPA x f / f_max

Two variants are exported:

* raw OFU (``gpu.ofu.raw``): TPA x f_SM / f_max_board, exactly the paper's formula with the board's
  maximum SM clock as NVML/DCGM report it;
* OFU (``gpu.ofu``): the clock ratio is taken in the tensor clock domain where the GPU catalog knows
  the tensor clock (the clock at which the datasheet's dense peak is specified), the board maximum
  otherwise, and a calibration factor (tile quantization) is applied. A tensor clock alone suffices
  (Blackwell: the vendor publishes no board max, and dcgm-exporter exports none by default); raw OFU has
  no value then, since it is defined against the board maximum.

Clock-ratio bound. Tensor pipes cannot issue faster than their own maximum, and the datasheet peak is
defined at that clock, so the ratio f_SM / f_tensor is capped at 1: an SM boosting above the tensor
clock does not produce more tensor FLOPs (H100 SXM: 1980 MHz board max vs 1830 MHz tensor clock).
The board ratio f_SM / f_max_board is not capped silently: a current clock above the device's reported
maximum by more than ``MAX_CLOCK_TOLERANCE`` is an invalid reading (a stale or wrong max clock), and within
the tolerance it is clamped to 1 (sampling jitter). A maximum that is not the device's own but a rated
clock from the catalog (``bounded=False``) is no bound: a clock above it is a reading, at a ratio of 1.
"""

from __future__ import annotations

import math

import attrs

from otel_ofu import bounds
from otel_ofu.names import ErrorReason

# A current clock may exceed the reported max by this fraction before the reading is rejected.
MAX_CLOCK_TOLERANCE = 0.02


class InvalidReading(ValueError):
    """A reading from which no OFU may be computed; ``reason`` is an ``ErrorReason`` value."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def check_fraction(name: str, value: float | None) -> float:
    """A ratio in [0, 1] (TPA, SM active, ...), or a typed error."""
    if value is None:
        raise InvalidReading(ErrorReason.NO_VALUE, f"{name} is missing")
    if not math.isfinite(value):
        raise InvalidReading(ErrorReason.INVALID_VALUE, f"{name} is not finite: {value!r}")
    if value < 0.0 or value > 1.0:
        raise InvalidReading(ErrorReason.INVALID_VALUE, f"{name} {value!r} is outside [0, 1]")
    return float(value)


def check_clock(name: str, hz: float | None) -> float:
    """A clock in Hz that a GPU can run at (``bounds``: 1 MHz to 10 GHz, what catches a clock in the wrong unit or
    a page's garbage, 9.2e24 Hz say), or a typed error."""
    if hz is None:
        raise InvalidReading(ErrorReason.NO_VALUE, f"{name} is missing")
    if not math.isfinite(hz):
        raise InvalidReading(ErrorReason.INVALID_VALUE, f"{name} is not finite: {hz!r}")
    if hz <= 0.0:
        raise InvalidReading(ErrorReason.INVALID_VALUE, f"{name} must be positive, got {hz!r}")
    if not bounds.MIN_CLOCK_HZ <= hz <= bounds.MAX_CLOCK_HZ:
        span = f"{bounds.MIN_CLOCK_HZ:g} to {bounds.MAX_CLOCK_HZ:g} Hz"
        raise InvalidReading(ErrorReason.INVALID_VALUE, f"{name} {hz:.6g} Hz is beyond what a GPU can run at ({span})")
    return float(hz)


def board_clock_ratio(sm_clock_hz: float | None, max_clock_hz: float | None, *, bounded: bool = True) -> float:
    """f_SM / f_max_board in [0, 1]; above-max clocks within the tolerance clamp to 1, and so does any clock above
    a max that is no bound (``bounded=False``: a rated clock, not the device's own)."""
    current = check_clock("SM clock", sm_clock_hz)
    maximum = check_clock("max SM clock", max_clock_hz)
    ratio = current / maximum
    if bounded and ratio > 1.0 + MAX_CLOCK_TOLERANCE:
        raise InvalidReading(
            ErrorReason.INVALID_VALUE,
            f"SM clock {current / 1e6:.0f} MHz is above the max clock {maximum / 1e6:.0f} MHz",
        )
    return min(ratio, 1.0)


def raw_ofu(
    tensor_active: float | None, sm_clock_hz: float | None, max_clock_hz: float | None, *, bounded: bool = True
) -> float:
    """TPA x f_SM / f_max_board, nothing else applied."""
    tpa = check_fraction("tensor pipe activity", tensor_active)
    return tpa * board_clock_ratio(sm_clock_hz, max_clock_hz, bounded=bounded)


def reference_clock_hz(max_clock_hz: float | None, tensor_clock_hz: float | None) -> float | None:
    """The clock OFU divides the SM clock by: the tensor clock where it is known, else the max SM clock."""
    return tensor_clock_hz if tensor_clock_hz is not None else max_clock_hz


def domain_clock_ratio(
    sm_clock_hz: float | None, max_clock_hz: float | None, tensor_clock_hz: float | None, *, bounded: bool = True
) -> float:
    """The clock ratio in the tensor clock domain when it is known, the board domain otherwise.

    With a board max the current clock is checked against it (a clock above it is invalid); with only a tensor
    clock there is nothing to check it against but its being a clock: boosting above the tensor clock is normal.
    """
    if max_clock_hz is None and tensor_clock_hz is not None:
        current = check_clock("SM clock", sm_clock_hz)
        return min(current / check_clock("tensor clock", tensor_clock_hz), 1.0)
    board = board_clock_ratio(sm_clock_hz, max_clock_hz, bounded=bounded)  # validates both clocks
    if tensor_clock_hz is None:
        return board
    tensor = check_clock("tensor clock", reference_clock_hz(max_clock_hz, tensor_clock_hz))
    return min(float(sm_clock_hz) / tensor, 1.0)  # type: ignore[arg-type]  # validated above


def check_calibration(calibration: float) -> float:
    if not math.isfinite(calibration) or calibration <= 0.0 or calibration > 1.0:
        raise ValueError(f"calibration factor must be in (0, 1], got {calibration!r}")
    return calibration


def ofu(
    tensor_active: float | None,
    sm_clock_hz: float | None,
    max_clock_hz: float | None,
    *,
    tensor_clock_hz: float | None = None,
    calibration: float = 1.0,
    bounded: bool = True,
) -> float:
    """OFU in [0, 1]: TPA x clock ratio in the tensor clock domain x calibration factor; ``max_clock_hz`` may be
    None where ``tensor_clock_hz`` is known, and is no bound on the clock with ``bounded=False``."""
    tpa = check_fraction("tensor pipe activity", tensor_active)
    ratio = domain_clock_ratio(sm_clock_hz, max_clock_hz, tensor_clock_hz, bounded=bounded)
    return tpa * ratio * check_calibration(calibration)


@attrs.frozen
class CycleOfu:
    """Interval-exact values derived from cycle-counter deltas."""

    tensor_active: float  # MMA cycles active / SM cycles elapsed
    mean_sm_clock_hz: float  # SM cycles elapsed / (elapsed seconds x counting units)
    ofu: float


def cycle_activity(
    mma_cycles_active: int, sm_cycles_elapsed: int, elapsed_s: float, *, counting_units: int = 1
) -> tuple[float, float]:
    """(TPA, mean SM clock in Hz) from deltas of monotonic counters over ``elapsed_s``, or a typed error."""
    if sm_cycles_elapsed <= 0 or mma_cycles_active < 0:
        raise InvalidReading(
            ErrorReason.INVALID_VALUE,
            f"cycle deltas must be positive (elapsed {sm_cycles_elapsed}, mma {mma_cycles_active})",
        )
    if mma_cycles_active > sm_cycles_elapsed:
        raise InvalidReading(
            ErrorReason.INVALID_VALUE, f"MMA cycles {mma_cycles_active} exceed elapsed cycles {sm_cycles_elapsed}"
        )
    if not math.isfinite(elapsed_s) or elapsed_s <= 0.0:
        raise InvalidReading(ErrorReason.INVALID_VALUE, f"elapsed time must be positive, got {elapsed_s!r}")
    if counting_units < 1:
        raise ValueError(f"counting_units must be >= 1, got {counting_units}")
    return mma_cycles_active / sm_cycles_elapsed, sm_cycles_elapsed / (elapsed_s * counting_units)


def ofu_from_cycles(
    mma_cycles_active: int,
    sm_cycles_elapsed: int,
    elapsed_s: float,
    max_clock_hz: float | None,
    *,
    counting_units: int = 1,
    tensor_clock_hz: float | None = None,
    calibration: float = 1.0,
    bounded: bool = True,
) -> CycleOfu:
    """Exact interval OFU from deltas of monotonic counters: no clock sampling noise.

    ``counting_units`` is the number of units whose cycles the elapsed counter sums (1 when it counts
    one clock domain, the SM count when it sums per SM): the counters' semantics are to be confirmed
    on hardware, so it is a parameter, not an assumption.
    """
    tpa, mean_clock = cycle_activity(mma_cycles_active, sm_cycles_elapsed, elapsed_s, counting_units=counting_units)
    value = ofu(
        tpa, mean_clock, max_clock_hz, tensor_clock_hz=tensor_clock_hz, calibration=calibration, bounded=bounded
    )
    return CycleOfu(tensor_active=tpa, mean_sm_clock_hz=mean_clock, ofu=value)


@attrs.frozen
class TileCorrection:
    """Hardware FLOPs of a tiled GEMM against its model FLOPs (2MNK)."""

    model_flops: int
    hardware_flops: int

    @property
    def factor(self) -> float:
        """2MNK / FLOPs_hw in (0, 1]: multiply raw OFU by it to compare with MFU."""
        return self.model_flops / self.hardware_flops


def tile_quantization(m: int, n: int, k: int, tile: tuple[int, int, int]) -> TileCorrection:
    """FLOPs a GEMM of (M, N, K) costs when padded to tiles (Tm, Tn, Tk), and the correction factor."""
    for label, size in (("M", m), ("N", n), ("K", k)):
        if size <= 0:
            raise ValueError(f"GEMM dimension {label} must be positive, got {size}")
    tm, tn, tk = tile
    if tm <= 0 or tn <= 0 or tk <= 0:
        raise ValueError(f"tile sizes must be positive, got {tile}")

    def padded(size: int, step: int) -> int:
        return -(-size // step) * step

    return TileCorrection(
        model_flops=2 * m * n * k,
        hardware_flops=2 * padded(m, tm) * padded(n, tn) * padded(k, tk),
    )


def achieved_flops(ofu_value: float, dense_peak_flops: float | None) -> float | None:
    """OFU x dense peak FLOP/s for the precision, or None where the peak is not known."""
    if dense_peak_flops is None:
        return None
    if not math.isfinite(dense_peak_flops) or dense_peak_flops <= 0.0:
        raise ValueError(f"peak FLOP/s must be positive, got {dense_peak_flops!r}")
    return check_fraction("OFU", ofu_value) * dense_peak_flops


def mfu(flops_per_token: float, tokens_per_second: float, num_gpus: int, peak_flops_per_gpu: float) -> float:
    """MFU = FLOPs/token x tokens/s / (num GPUs x peak FLOP/s per GPU); 6N FLOPs/token for dense training."""
    if num_gpus < 1:
        raise ValueError(f"num_gpus must be >= 1, got {num_gpus}")
    for label, value in (
        ("FLOPs per token", flops_per_token),
        ("tokens per second", tokens_per_second),
        ("peak FLOP/s", peak_flops_per_gpu),
    ):
        if not math.isfinite(value) or value < 0.0 or (label == "peak FLOP/s" and value == 0.0):
            raise ValueError(f"{label} must be finite and positive, got {value!r}")
    return flops_per_token * tokens_per_second / (num_gpus * peak_flops_per_gpu)
