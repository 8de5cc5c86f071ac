"""``gpu.straggler``: one GPU of a job far below the job's median OFU, window after window.

A GPU is below in a window when its OFU x ``straggler_factor`` < the median OFU of its job's other GPUs in
the window (its peers: a GPU is not its own reference, which in a two-GPU job would halve the gap; with
three GPUs or more it is the job's median but for the straggler's own vote). The job needs two GPUs and a
median above 0; a GPU with no tensor activity is idle, counted by
``job.gpus.idle``, not a straggler). The flag rises after ``straggler_windows`` consecutive windows below and
falls at the first window not below. Shown only while up (1) and once when it falls (0): a healthy fleet adds
no series. While up it carries ``gpu.throttle.reason`` when throttling explains it: the reason that held the
clock down for the largest share of the window, if that share is at least ``EXPLAINS_SHARE``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

import attrs

from otel_ofu import names
from otel_ofu_collector.config import AggregatorConfig
from otel_ofu_collector.detectors.base import GpuWindowValues

# A reason that held the clock down for at least this share of the window explains a slow GPU.
EXPLAINS_SHARE: Final = 0.25
_NO_LABELS: Final[Mapping[str, str]] = {}


def throttle_reason(throttle: Mapping[str, float]) -> str | None:
    """The reason that held the clock down longest, when that is at least ``EXPLAINS_SHARE`` of the window."""
    best: str | None = None
    for reason in names.ThrottleReason.ALL:
        share = throttle.get(reason)
        if share is not None and share >= EXPLAINS_SHARE and (best is None or share > throttle[best]):
            best = reason
    return best


@attrs.define
class _Straggler:
    factor: float
    windows: int
    run: int = 0
    up: bool = False
    labels: Mapping[str, str] = _NO_LABELS

    def assess(self, window: GpuWindowValues) -> int | None:
        below = (
            window.job_gpus >= 2
            and window.job_median_ofu > 0.0
            and not window.idle
            and window.ofu * self.factor < window.job_median_ofu
        )
        self.run = self.run + 1 if below else 0
        was_up = self.up
        self.up = self.run >= self.windows
        if self.up:
            reason = throttle_reason(window.throttle)
            self.labels = {names.GPU_THROTTLE_REASON: reason} if reason else _NO_LABELS
            return 1
        self.labels = _NO_LABELS
        return 0 if was_up else None


@attrs.frozen
class Straggler:
    metric: names.MetricSpec = names.GPU_STRAGGLER
    record_key: str = "straggler"
    kind: str = "straggler"
    label: str = "straggler GPU"

    def start(self, config: AggregatorConfig) -> _Straggler:
        return _Straggler(config.straggler_factor, config.straggler_windows)


GPU_DETECTOR = Straggler()
