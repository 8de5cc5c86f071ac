"""``job.ofu.regression``: the job's OFU fell well below its own recent level.

1 while window OFU < baseline / ``regression_factor``, the baseline being the MEDIAN (robust to one
checkpoint pause) of the job's last ``baseline_windows`` unflagged window OFUs, once it has
``min_windows(baseline_windows)`` and the baseline is at least ``regression_min_baseline`` (an idle
job has nothing to regress from). A window without OFU keeps the flag's value, and so does one in which all the
job's GPUs were idle: a job that finished or stalled while holding its GPUs is an idle allocation
(``job.gpus.idle``), not a regression, and its idle windows do not enter the baseline. So does a window in which its
progress shows it starting or back from a restart (``JobWindowValues.restarting``): a relaunch's low window is
recovery, which goodput counts, not a slower job. Until the baseline has
its windows the flag cannot be assessed: absent, not 0.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Sequence
from typing import Any

import attrs

from otel_ofu import names
from otel_ofu_collector.detectors.base import FlagOption, FlagSettings, JobWindowValues
from otel_ofu_collector.option_bounds import Bound

# A factor of 1 flags any window under the median (half of a steady job's windows); 100x is a stall, not a
# regression to compare against.
FACTOR = FlagOption(
    "regression_factor",
    2.0,
    Bound(float, 1.0, 100.0),
    help="a job regresses while its window OFU x this stays below its baseline OFU",
    metavar="FACTOR",
)
# Each job keeps its baseline's OFUs: 100 windows x --max-jobs 50000 is ~160 MB of floats at most.
BASELINE_WINDOWS = FlagOption(
    "baseline_windows",
    10,
    Bound(int, 1, 100),
    help="windows in a job's trailing OFU baseline (the flag judges once it has half of them)",
    metavar="WINDOWS",
)
# A job whose baseline OFU is under this does no tensor work to regress from (an idle notebook, a data-loading
# phase): its noise around zero must not read as a 2x drop. An OFU, so at most 1.
MIN_BASELINE = FlagOption(
    "regression_min_baseline",
    0.05,
    Bound(float, 0.0, 1.0),
    help="baseline OFU under which a job is idle, not regressing",
    metavar="OFU",
)


def min_windows(baseline_windows: int) -> int:
    """Unflagged windows a job needs before its regression flag may rise: half the baseline, at least 1."""
    return max(1, (baseline_windows + 1) // 2)


@attrs.define
class _Regression:
    factor: float
    min_baseline: float
    min_windows: int
    baseline: deque[float]
    up: int | None = None  # None until the baseline has its windows

    def assess(self, window: JobWindowValues) -> int | None:
        ofu = window.ofu
        if ofu is None or window.all_idle or window.restarting:
            return self.up
        baseline = self.baseline
        if len(baseline) < self.min_windows:
            baseline.append(ofu)
            return self.up  # no baseline yet: not assessable
        median = statistics.median(baseline)
        flagged = median >= self.min_baseline and ofu < median / self.factor
        self.up = int(flagged)
        if not flagged:
            baseline.append(ofu)
        return self.up


@attrs.frozen
class Regression:
    metric: names.MetricSpec = names.JOB_OFU_REGRESSION
    record_key: str = "regression"
    kind: str = "regression"
    label: str = "OFU regression"
    options: Sequence[FlagOption[Any]] = (FACTOR, BASELINE_WINDOWS, MIN_BASELINE)

    def start(self, config: FlagSettings) -> _Regression:
        windows = config.flag(BASELINE_WINDOWS)
        return _Regression(config.flag(FACTOR), config.flag(MIN_BASELINE), min_windows(windows), deque(maxlen=windows))


DETECTOR = Regression()
