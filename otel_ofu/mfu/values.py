"""What counts as a usable MFU value: pure checks shared by the reporter and the log follower.

MFU above 1 is physically impossible when FLOPs are counted right, but a framework that over-counts
(the paper's MoE case inflated its FLOPs ~3x) does claim it, and that claim is exactly what the collector's
miscount flag needs to see; so values up to ``MFU_MAX`` pass (with a warning from the reporter). Above
``MFU_MAX`` the value is almost surely a percent given as a fraction (32.5 for 32.5%) and is rejected:
a wrong number is worse than a missing one.
"""

from __future__ import annotations

import math

from otel_ofu.names import MFU_MAX as MFU_MAX  # re-exported: the reporter's public bound


class InvalidMfu(ValueError):
    """A value that cannot be reported as MFU (not finite, negative, or implausibly large)."""


def check_mfu(value: float) -> float:
    """``value`` as a float when it is a usable MFU fraction, else ``InvalidMfu`` saying why."""
    try:
        number = float(value)
    except (TypeError, ValueError) as error:
        raise InvalidMfu(f"MFU must be a number, got {value!r}") from error
    if not math.isfinite(number):
        raise InvalidMfu(f"MFU must be finite, got {value!r}")
    if number < 0.0:
        raise InvalidMfu(f"MFU must not be negative, got {value!r}")
    if number > MFU_MAX:
        raise InvalidMfu(f"MFU {number!r} is above {MFU_MAX:g}: pass a fraction (0.325 for 32.5%), not a percent")
    return number
