"""From one GPU reading to the contract's per-GPU values: OFU, raw OFU, clocks, achieved FLOP/s.

Pure: the reading, the catalog entry and the calibration in, the values (or a typed error) out.
Used by the producer, the snapshot command and the demo alike.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any

import attrs

from otel_ofu import bounds, catalog, gpu_share, names, ofu_math
from otel_ofu.model import EnergyCounter, GpuReading, IoCounter

log = logging.getLogger(__name__)


@attrs.frozen
class CalibrationTable:
    """Tile-quantization calibration factors in (0, 1]: per job first, then per GPU model, else 1.

    Models are keyed by catalog key (``H100-SXM``) or by the exact device name string.
    Parsed from ``job:ID=F,model:KEY=F`` (option ``--calibration``).
    """

    by_job: Mapping[str, float] = attrs.field(factory=dict)
    by_model: Mapping[str, float] = attrs.field(factory=dict)

    def factor(self, model: str, job_id: str | None) -> float:
        if job_id is not None and job_id in self.by_job:
            return self.by_job[job_id]
        if model in self.by_model:
            return self.by_model[model]
        spec = catalog.lookup(model)
        if spec is not None and spec.key in self.by_model:
            return self.by_model[spec.key]
        return 1.0

    @classmethod
    def parse(cls, text: str) -> CalibrationTable:
        by_job: dict[str, float] = {}
        by_model: dict[str, float] = {}
        for item in filter(None, (part.strip() for part in text.split(","))):
            scope, _, rest = item.partition(":")
            key, _, raw = rest.rpartition("=")
            if scope not in ("job", "model") or not key or not raw:
                raise ValueError(f"calibration entry {item!r} is not job:ID=FACTOR or model:KEY=FACTOR")
            factor = ofu_math.check_calibration(float(raw))
            (by_job if scope == "job" else by_model)[key] = factor
        return cls(by_job=by_job, by_model=by_model)

    def __str__(self) -> str:
        """The table as ``parse`` reads it (``--print-config`` writes it so)."""
        entries = [f"job:{key}={factor!r}" for key, factor in self.by_job.items()]
        return ",".join(entries + [f"model:{key}={factor!r}" for key, factor in self.by_model.items()])


@attrs.frozen
class GpuValues:
    """The per-GPU gauges of one interval. ``None`` means the value is not known and is not exported."""

    ofu: float
    ofu_raw: float | None  # TPA x f / f_max_board: none without a board max (a tensor clock alone gives OFU)
    tensor_active: float
    sm_clock_hz: float | None  # absent only where tensor activity 0 made OFU 0 without a clock
    max_sm_clock_hz: float | None
    max_clock_from_catalog: bool
    flops_achieved: float | None = None
    sm_active: float | None = None
    dram_active: float | None = None
    power_w: float | None = None
    energy: EnergyCounter | None = None  # exported as the cumulative sum gpu.energy
    throttle: Mapping[str, float] = attrs.field(factory=dict)  # gpu.throttle by gpu.throttle.reason
    engine_active: float | None = None
    sm_occupancy: float | None = None
    # The cumulative sums gpu.nvlink.io and gpu.pcie.io, by network.io.direction.
    nvlink_io: Mapping[str, IoCounter] = attrs.field(factory=dict)
    pcie_io: Mapping[str, IoCounter] = attrs.field(factory=dict)

    def link_counters(self) -> tuple[tuple[names.MetricSpec, Mapping[str, IoCounter]], ...]:
        """(metric, counters by direction) of the links this GPU has counters of, NVLink first."""
        links = ((names.GPU_NVLINK_IO, self.nvlink_io), (names.GPU_PCIE_IO, self.pcie_io))
        return tuple((spec, counters) for spec, counters in links if counters)

    def as_metrics(self) -> dict[str, float]:
        """Metric name -> value for every known gauge without attributes (not the sums, not gpu.throttle)."""
        values: dict[str, float | None] = {
            names.GPU_OFU.name: self.ofu,
            names.GPU_OFU_RAW.name: self.ofu_raw,
            names.GPU_TENSOR_ACTIVE.name: self.tensor_active,
            names.GPU_CLOCK_SM.name: self.sm_clock_hz,
            names.GPU_CLOCK_SM_MAX.name: self.max_sm_clock_hz,
            names.GPU_FLOPS_ACHIEVED.name: self.flops_achieved,
            names.GPU_SM_ACTIVE.name: self.sm_active,
            names.GPU_DRAM_ACTIVE.name: self.dram_active,
            names.GPU_ENGINE_ACTIVE.name: self.engine_active,
            names.GPU_SM_OCCUPANCY.name: self.sm_occupancy,
            names.GPU_POWER.name: self.power_w,
        }
        return {name: value for name, value in values.items() if value is not None}

    def as_json(self) -> dict[str, Any]:
        """Every known value keyed by metric name; gpu.throttle as ``{reason: share}``, the link counters as
        ``{direction: bytes}``."""
        values: dict[str, Any] = dict(self.as_metrics())
        if self.energy is not None:
            values[names.GPU_ENERGY.name] = self.energy.joules
        if self.throttle:
            values[names.GPU_THROTTLE.name] = dict(self.throttle)
        for spec, counters in self.link_counters():
            values[spec.name] = {direction: counter.total_bytes for direction, counter in counters.items()}
        return values


class _SaidOnce:
    """Logs each distinct message once per process: "said once", not once per interval."""

    def __init__(self) -> None:
        self._said: set[str] = set()

    def __call__(self, message: str) -> None:
        if message not in self._said:
            self._said.add(message)
            log.warning("%s", message)

    def forget(self) -> None:
        """Say each message again once: a new run in the same process (each test is one) starts fresh."""
        self._said.clear()


say_once = _SaidOnce()


def _optional_fraction(name: str, value: float | None) -> float | None:
    if value is None:
        return None
    try:
        return ofu_math.check_fraction(name, value)
    except ofu_math.InvalidReading:
        return None  # an optional gauge that is off is left out; OFU itself does not depend on it


def max_clock_hint(model: str) -> str:
    """The ``--max-sm-clock`` option that gives ``model`` its max clock, quoted for a POSIX shell as the option
    wants it: the device's name string exactly, ``=``, the clock in MHz (``MHZ`` stands for it)."""
    quoted = "".join("\\" + char if char in '"\\$`' else char for char in model)
    return f'--max-sm-clock "{quoted}=MHZ"'


def _no_max_clock(model: str, known: bool) -> ofu_math.InvalidReading:
    """The error of a GPU with no max clock from the source, the catalog or the option, said once with the fix."""
    where = "the catalog has no clock for it" if known else "the catalog does not know it"
    hint = f"{max_clock_hint(model)} (its max SM clock in MHz; env OTEL_OFU_MAX_SM_CLOCK) gives it one"
    say_once(f"GPU model {model!r} has no max SM clock from the source and {where}: no OFU until {hint}")
    return ofu_math.InvalidReading(names.ErrorReason.NO_VALUE, f"no max SM clock: {hint}")


def _valid_clock(hz: float | None) -> float | None:
    return hz if hz is not None and bounds.MIN_CLOCK_HZ <= hz <= bounds.MAX_CLOCK_HZ else None  # NaN fails both


def _peak(reading: GpuReading, spec: catalog.GpuSpec | None, precision: str | None) -> float | None:
    """The dense peak FLOP/s of the device for the precision: a MIG slice or compute partition has its share of its
    GPU's tensor cores (its SMs' share: otel_ofu.gpu_share.peak_share); None where that is not known."""
    peak = spec.peak(precision) if spec is not None else None
    if peak is None:
        return None
    gpu = reading.gpu
    share = gpu_share.peak_share(gpu.model, gpu.mig_profile, gpu.compute_partition)
    if share is None:
        say_once(
            f"MIG profile {gpu.mig_profile or gpu.compute_partition!r} of {gpu.model!r}: the catalog has no SM count "
            "for it, so its share of the GPU's peak is not known and gpu.flops.achieved is left out (its OFU stands)"
        )
        return None
    return peak * share


def compute(
    reading: GpuReading,
    *,
    precision: str | None = None,
    calibration: float = 1.0,
) -> GpuValues:
    """The contract's values for one reading; raises ``ofu_math.InvalidReading`` when OFU cannot be had.

    The max clock is the device's own when the source has it, else the catalog's board clock (dcgm-exporter does not
    export field 113 by default), which is a rating, not a bound: a clock above it is taken at a ratio of 1. Without a
    board max, the catalog's tensor clock alone gives OFU (raw OFU and the max clock are then absent); with neither,
    there is no OFU and the producer says once which ``--max-sm-clock`` to add. Tensor activity 0 is OFU 0 whatever
    the clocks: no tensor work at any clock.
    """
    if reading.sm_clock_hz is not None and reading.sm_clock_hz > bounds.MAX_CLOCK_HZ:
        # 9.2e24 Hz is garbage even on an idle GPU (whose OFU needs no clock): the reading is not believed either.
        ofu_math.check_clock("SM clock", reading.sm_clock_hz)
    power = reading.power_w
    if power is not None and math.isfinite(power) and power > bounds.MAX_GPU_POWER_W:
        # A board that reads 1e308 W (or a reading in mW) is not one whose other values can be believed this interval.
        raise ofu_math.InvalidReading(
            names.ErrorReason.INVALID_VALUE,
            f"power {power:.6g} W is beyond what a GPU can draw ({bounds.MAX_GPU_POWER_W:g} W)",
        )
    spec = catalog.lookup(reading.gpu.model)
    if spec is None:
        say_once(
            f"GPU model {reading.gpu.model!r} is not in the catalog: OFU uses the device's own max clock "
            "and peak-derived metrics (gpu.flops.achieved) are left out"
        )
    tensor_clock = spec.tensor_clock_hz if spec is not None else None
    max_clock = reading.max_sm_clock_hz
    from_catalog = False
    if max_clock is None and spec is not None and spec.boost_clock_hz is not None:
        max_clock = spec.boost_clock_hz
        from_catalog = True
        say_once(
            f"no max SM clock from the source for {reading.gpu.model!r}: using the catalog's "
            f"{spec.boost_clock_hz / 1e6:.0f} MHz"
        )
    mean_clock: float | None = None
    if reading.cycles is not None:
        elapsed_s = (reading.end_ns - reading.start_ns) / 1e9
        tpa, mean_clock = ofu_math.cycle_activity(
            reading.cycles.mma_cycles_active, reading.cycles.sm_cycles_elapsed, elapsed_s
        )
    else:
        tpa = ofu_math.check_fraction("tensor pipe activity", reading.tensor_active)
    if tpa == 0.0:
        return _idle(reading, spec, precision, max_clock, from_catalog, mean_clock)
    if max_clock is None:
        if tensor_clock is None:
            raise _no_max_clock(reading.gpu.model, known=spec is not None)
        say_once(
            f"no board max clock for {reading.gpu.model!r} from the source or the catalog: gpu.ofu is taken "
            f"against the catalog's tensor clock ({tensor_clock / 1e6:.0f} MHz); gpu.ofu.raw and gpu.clock.sm.max "
            "are left out"
        )
    # The device's own max bounds its clock (above it, the max is stale or wrong); the catalog's rating does not.
    bounded = not from_catalog
    sm_clock = mean_clock if mean_clock is not None else ofu_math.check_clock("SM clock", reading.sm_clock_hz)
    value = ofu_math.ofu(
        tpa, sm_clock, max_clock, tensor_clock_hz=tensor_clock, calibration=calibration, bounded=bounded
    )
    raw = ofu_math.raw_ofu(tpa, sm_clock, max_clock, bounded=bounded) if max_clock is not None else None
    return GpuValues(
        ofu=value,
        ofu_raw=raw,
        tensor_active=tpa,
        sm_clock_hz=sm_clock,
        max_sm_clock_hz=ofu_math.check_clock("max SM clock", max_clock) if max_clock is not None else None,
        max_clock_from_catalog=from_catalog,
        flops_achieved=ofu_math.achieved_flops(value, _peak(reading, spec, precision)),
        **_activities(reading),
        **loss_inputs(reading),
    )


def _idle(
    reading: GpuReading,
    spec: catalog.GpuSpec | None,
    precision: str | None,
    max_clock: float | None,
    from_catalog: bool,
    mean_clock: float | None,
) -> GpuValues:
    """The values of a reading with tensor activity 0: OFU 0 (and raw OFU 0 where there is a board max), with the
    clocks it did give that are clocks; no clock is needed, none is checked against a max."""
    board_max = _valid_clock(max_clock)
    return GpuValues(
        ofu=0.0,
        ofu_raw=0.0 if board_max is not None else None,
        tensor_active=0.0,
        sm_clock_hz=mean_clock if mean_clock is not None else _valid_clock(reading.sm_clock_hz),
        max_sm_clock_hz=board_max,
        max_clock_from_catalog=from_catalog and board_max is not None,
        flops_achieved=ofu_math.achieved_flops(0.0, _peak(reading, spec, precision)),
        **_activities(reading),
        **loss_inputs(reading),
    )


def _activities(reading: GpuReading) -> dict[str, Any]:
    """The optional activity gauges of a reading that are valid fractions; the others are left out."""
    return {
        "sm_active": _optional_fraction("SM active", reading.sm_active),
        "dram_active": _optional_fraction("DRAM active", reading.dram_active),
        "engine_active": _optional_fraction("engine active", reading.engine_active),
        "sm_occupancy": _optional_fraction("SM occupancy", reading.sm_occupancy),
    }


_THROTTLE_REASONS = frozenset(names.ThrottleReason.ALL)


def loss_inputs(reading: GpuReading) -> dict[str, Any]:
    """Power, energy, throttle shares and link counters of a reading that are valid; the others are left out."""
    power = reading.power_w
    energy = reading.energy
    # A share outside [0, 1] (NaN and infinities compare false) is left out, as check_fraction would.
    throttle = {
        reason: share
        for reason, share in reading.throttle.items()
        if reason in _THROTTLE_REASONS and share is not None and 0.0 <= share <= 1.0
    }
    return {
        "power_w": power if power is not None and 0 <= power <= bounds.MAX_GPU_POWER_W else None,
        "energy": energy if energy is not None and math.isfinite(energy.joules) and energy.joules >= 0 else None,
        "throttle": throttle,
        "nvlink_io": valid_counters(reading.nvlink_io),
        "pcie_io": valid_counters(reading.pcie_io),
    }


_DIRECTIONS = frozenset(names.IoDirection.ALL)


def valid_counters(counters: Mapping[str, IoCounter]) -> dict[str, IoCounter]:
    """The link counters of known directions that can be byte counts (finite, >= 0); the others are left out."""
    return {
        direction: counter
        for direction, counter in counters.items()
        if direction in _DIRECTIONS and math.isfinite(counter.total_bytes) and counter.total_bytes >= 0
    }
