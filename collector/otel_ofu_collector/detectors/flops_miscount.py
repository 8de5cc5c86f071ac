"""``job.flops_miscount``: reported MFU far above the OFU its GPUs measured, window after window.

It rises after ``miscount_windows`` consecutive windows with both values and MFU >= ``miscount_ratio`` x OFU,
and falls at the first such window without it; windows missing either value neither extend nor break the
run (the flag keeps its value through them). Until a window has both values (a job that never reported
MFU) the flag cannot be assessed: absent, not 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from otel_ofu import names
from otel_ofu_collector.detectors.base import FlagOption, FlagSettings, JobWindowValues
from otel_ofu_collector.option_bounds import Bound

# An honest FLOP count keeps MFU at or under OFU (the tensor pipes do at least the model's work), so a ratio
# under 1 would flag honest jobs; the paper's worst miscount was ~3x, and 100x is a unit mistake.
RATIO = FlagOption(
    "miscount_ratio",
    1.5,
    Bound(float, 1.0, 100.0),
    help="reported MFU at least this many times the job's OFU counts as a FLOP miscount",
    metavar="RATIO",
)
# Windows are counted, not kept: a week of minute windows is the most a run needs.
WINDOWS = FlagOption(
    "miscount_windows",
    3,
    Bound(int, 1, 10_000),
    help="consecutive miscounted windows before job.flops_miscount rises",
    metavar="WINDOWS",
)


# "1.5x or more" in decimal: 1.5 x 0.4 is 0.6000000000000001 in binary floating point, so MFU 0.6 would miss the ratio
# it meets; a relative tolerance far below any real difference lets it meet it.
_AT_THE_RATIO = 1.0 - 1e-12


@attrs.define
class _Miscount:
    ratio: float
    windows: int
    run: int = 0
    up: int | None = None  # None until a window had both values

    def assess(self, window: JobWindowValues) -> int | None:
        ofu, mfu = window.ofu, window.mfu
        if ofu is not None and mfu is not None:
            self.run = self.run + 1 if mfu >= self.ratio * ofu * _AT_THE_RATIO else 0  # "1.5x or more"
            self.up = int(self.run >= self.windows)
        return self.up


@attrs.frozen
class FlopsMiscount:
    metric: names.MetricSpec = names.JOB_FLOPS_MISCOUNT
    record_key: str = "flops_miscount"
    kind: str = "miscount"
    label: str = "FLOP miscount"
    options: Sequence[FlagOption[Any]] = (RATIO, WINDOWS)

    def start(self, config: FlagSettings) -> _Miscount:
        return _Miscount(config.flag(RATIO), config.flag(WINDOWS))


DETECTOR = FlopsMiscount()
