"""``job.ofu.regression``: the job's OFU fell well below its own recent level.

1 while window OFU < baseline / ``regression_factor``, the baseline being the MEDIAN (robust to one
checkpoint pause) of the job's last ``baseline_windows`` unflagged window OFUs, once it has
``config.baseline_min_windows`` and the baseline is at least ``config.regression_min_baseline`` (an idle
job has nothing to regress from). A window without OFU keeps the flag's value, and so does one in which all the
job's GPUs were idle: a job that finished or stalled while holding its GPUs is an idle allocation
(``job.gpus.idle``), not a regression, and its idle windows do not enter the baseline. Until the baseline has
its windows the flag cannot be assessed: absent, not 0.
"""

from __future__ import annotations

import statistics
from collections import deque

import attrs

from otel_ofu import names
from otel_ofu_collector.config import AggregatorConfig
from otel_ofu_collector.detectors.base import JobWindowValues


@attrs.define
class _Regression:
    config: AggregatorConfig
    baseline: deque[float] = attrs.field(init=False)
    up: int | None = None  # None until the baseline has its windows

    def __attrs_post_init__(self) -> None:
        self.baseline = deque(maxlen=self.config.baseline_windows)

    def assess(self, window: JobWindowValues) -> int | None:
        ofu = window.ofu
        if ofu is None or window.all_idle:
            return self.up
        config = self.config
        baseline = self.baseline
        if len(baseline) < config.baseline_min_windows:
            baseline.append(ofu)
            return self.up  # no baseline yet: not assessable
        median = statistics.median(baseline)
        flagged = median >= config.regression_min_baseline and ofu < median / config.regression_factor
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

    def start(self, config: AggregatorConfig) -> _Regression:
        return _Regression(config)


DETECTOR = Regression()
