"""``job.flops_miscount``: reported MFU far above the OFU its GPUs measured, window after window.

It rises after ``miscount_windows`` consecutive windows with both values and MFU >= ``miscount_ratio`` x OFU,
and falls at the first such window without it; windows missing either value neither extend nor break the
run (the flag keeps its value through them). Until a window has both values (a job that never reported
MFU) the flag cannot be assessed: absent, not 0.
"""

from __future__ import annotations

import attrs

from otel_ofu import names
from otel_ofu_collector.config import AggregatorConfig
from otel_ofu_collector.detectors.base import JobWindowValues


@attrs.define
class _Miscount:
    ratio: float
    windows: int
    run: int = 0
    up: int | None = None  # None until a window had both values

    def assess(self, window: JobWindowValues) -> int | None:
        ofu, mfu = window.ofu, window.mfu
        if ofu is not None and mfu is not None:
            self.run = self.run + 1 if mfu >= self.ratio * ofu else 0  # "1.5x or more"
            self.up = int(self.run >= self.windows)
        return self.up


@attrs.frozen
class FlopsMiscount:
    metric: names.MetricSpec = names.JOB_FLOPS_MISCOUNT
    record_key: str = "flops_miscount"
    kind: str = "miscount"
    label: str = "FLOP miscount"

    def start(self, config: AggregatorConfig) -> _Miscount:
        return _Miscount(config.miscount_ratio, config.miscount_windows)


DETECTOR = FlopsMiscount()
