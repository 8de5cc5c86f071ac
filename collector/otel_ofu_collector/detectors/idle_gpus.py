"""``job.gpus.idle``: GPUs attributed to the job with no tensor activity for ``idle_windows`` windows running.

Counted per window: the job's GPUs whose tensor pipes were inactive all window (``gpu.tensor.active`` 0, or
OFU 0 where activity is not reported) for ``idle_windows`` consecutive windows of the job. A window in which
the job has no GPU says nothing (not assessable); a GPU missing from a window starts its count afresh.

A GPU that ran kernels with nothing moving (``hang.stalled``: a hung collective) is not idle, whatever its tensor
pipes did: its job is hung, not an allocation nobody uses, and ``job.hang`` says so. Such a GPU's count starts afresh.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import attrs

from otel_ofu import names
from otel_ofu_collector.detectors.base import FlagOption, FlagSettings, JobWindowValues
from otel_ofu_collector.option_bounds import Bound

WINDOWS = FlagOption(
    "idle_windows",
    3,
    Bound(int, 1, 10_000),
    help="windows without tensor activity before a GPU counts in job.gpus.idle",
    metavar="WINDOWS",
)


@attrs.define
class _IdleGpus:
    windows: int
    runs: dict[str, int] = attrs.field(factory=dict)  # idle GPU (stream key) -> consecutive idle windows

    def assess(self, window: JobWindowValues) -> float | None:
        if not window.gpus:
            return None
        runs = self.runs
        stalled = window.stalled_gpus
        self.runs = {key: runs.get(key, 0) + 1 for key in window.idle_gpus if key not in stalled}
        # In GPU equivalents, as job.gpus: an idle MIG slice is its share of a GPU.
        shares = window.idle_gpus
        return math.fsum(shares[key] for key, run in self.runs.items() if run >= self.windows)


@attrs.frozen
class IdleGpus:
    metric: names.MetricSpec = names.JOB_GPUS_IDLE
    record_key: str = "gpus_idle"
    kind: str = "idle"
    label: str = "idle GPUs"
    options: Sequence[FlagOption[Any]] = (WINDOWS,)

    def start(self, config: FlagSettings) -> _IdleGpus:
        return _IdleGpus(config.flag(WINDOWS))


DETECTOR = IdleGpus()
