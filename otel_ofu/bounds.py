"""What a GPU can physically report: the bounds every per-GPU input is held to before anything adds it up.

One poisoned value must not cost the rest: a finite 1e308 J energy reading overflows every sum it enters, and
a power reading in mW where W belongs (700000 for 700 W) would bill a job for a thousand GPUs. A reading outside
these bounds is refused by reason (``names.RejectReason``), never clipped into range.

The bounds are generous on purpose: they catch unit mistakes and garbage, not unusual hardware. The most
power-hungry accelerators draw about 1.4 kW per board (NVIDIA GB300, AMD MI355X), SM and engine clocks stay
below 3.2 GHz, and the fastest dense tensor rate is about 15 PFLOP/s (GB300, FP4).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from typing import Final

from otel_ofu import names

MAX_GPU_POWER_W: Final = 5000.0  # board power; also bounds an energy counter's rate
MIN_CLOCK_HZ: Final = 1e6  # a clock under 1 MHz is a reading in the wrong unit (MHz sent as Hz), not a clock
MAX_CLOCK_HZ: Final = 1e10
MAX_FLOPS: Final = 1e17  # per GPU, FLOP/s
# One direction of one GPU's NVLink or PCIe traffic, bytes per second: NVLink 5 carries 900 GB/s each way per GPU
# (B200), PCIe 6.0 x16 about 128 GB/s; ten times the fastest link still catches a rate in the wrong unit.
MAX_LINK_BYTES_PER_S: Final = 1e13

# Per metric: (lowest, highest) value a point may carry. Beyond the range of a fraction is out of range; beyond
# the physics of power, clocks and FLOP/s is implausible.
FRACTION: Final = (0.0, 1.0)
RANGES: Final[Mapping[str, tuple[float, float]]] = {
    names.GPU_OFU.name: FRACTION,
    names.GPU_TENSOR_ACTIVE.name: FRACTION,
    names.GPU_THROTTLE.name: FRACTION,
    names.GPU_SM_ACTIVE.name: FRACTION,
    names.GPU_DRAM_ACTIVE.name: FRACTION,
    names.GPU_ENGINE_ACTIVE.name: FRACTION,
    names.GPU_SM_OCCUPANCY.name: FRACTION,
    names.GPU_CLOCK_SM.name: (MIN_CLOCK_HZ, MAX_CLOCK_HZ),
    names.GPU_CLOCK_SM_MAX.name: (MIN_CLOCK_HZ, MAX_CLOCK_HZ),
    names.GPU_FLOPS_ACHIEVED.name: (0.0, MAX_FLOPS),
    names.GPU_POWER.name: (0.0, MAX_GPU_POWER_W),
    # Any finite counter: its rate is bounded where deltas are taken (MAX_RATES).
    names.GPU_ENERGY.name: (0.0, sys.float_info.max),
    names.GPU_NVLINK_IO.name: (0.0, sys.float_info.max),
    names.GPU_PCIE_IO.name: (0.0, sys.float_info.max),
}
_ANY: Final = (0.0, sys.float_info.max)


def range_of(metric: str) -> tuple[float, float]:
    """The (lowest, highest) value a point of ``metric`` may carry: any finite number >= 0 for a metric not bounded
    here. Comparisons ``low <= value <= high`` refuse NaN and infinities too."""
    return RANGES.get(metric, _ANY)


def refusal(metric: str, value: float) -> str | None:
    """Why a point of ``metric`` with ``value`` is refused (a ``names.RejectReason``), None when it is in bounds."""
    low, high = range_of(metric)
    if low <= value <= high:
        return None
    if not math.isfinite(value) or value < low or RANGES.get(metric) is FRACTION:
        return names.RejectReason.OUT_OF_RANGE
    return names.RejectReason.IMPLAUSIBLE


# The cumulative counters whose rate is bounded, by metric: the most of it per second a GPU can reach. A delta beyond
# it over the time since the counter's previous reading, or a reading beyond it over its series' age, is refused.
MAX_RATES: Final[Mapping[str, float]] = {
    names.GPU_ENERGY.name: MAX_GPU_POWER_W,
    names.GPU_NVLINK_IO.name: MAX_LINK_BYTES_PER_S,
    names.GPU_PCIE_IO.name: MAX_LINK_BYTES_PER_S,
}


def link_rate_plausible(bytes_per_s: float) -> bool:
    """Whether one direction of a GPU's NVLink or PCIe traffic can run at ``bytes_per_s`` (NaN cannot)."""
    return 0.0 <= bytes_per_s <= MAX_LINK_BYTES_PER_S
