"""``job.hang``: every GPU of the job runs kernels and nothing moves, window after window.

A hung collective (an NCCL hang, a deadlock between ranks) leaves a kernel spinning on every GPU of the job: the
engine is busy, the SMs are nearly empty (a collective holds one block per channel), and no tensor, DRAM or link
traffic moves. A GPU is **stalled** in a window when its window means say so: engine activity at or above
``hang_engine_active``, SM activity at or below ``hang_sm_active``, tensor activity (and DRAM activity, where
reported) under ``hang_activity``, and NVLink + PCIe bytes per second (where reported) under
``hang_link_throughput``. A GPU doing any of the work a busy job does is **moving**: tensor work, DRAM traffic or
link traffic over those bars, or SMs busy (a memory-bound kernel), or no kernel at all (an idle GPU, an input
pipeline stall: the engine waits, it does not spin). A GPU without engine or SM activity cannot be judged
(``stalled`` None), unless its tensor pipes, DRAM or links already show it moving.

The flag rises after ``hang_windows`` windows in a row in which every GPU of the job was stalled, and falls at the
first window in which one moves. A window in which some GPU cannot be judged and none moves neither extends nor breaks
the run, and says nothing (absent); a job whose GPUs are never judged never has the flag (absent, not 0).

The judgement per GPU is made where the GPUs' means are (``aggregation.closing``, with these settings): a shard sends
its merge tier the stalled GPUs and how many moved (``names.PartialField``), and the merge tier's flag runs on them.
A stalled GPU is never counted idle (``idle_gpus`` yields to this flag), and the job's GPU time in a window all its
GPUs were stalled is ``hang`` badput from the first such window (``aggregation.goodput``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from otel_ofu import names
from otel_ofu_collector.detectors.base import FlagOption, FlagSettings, JobWindowValues
from otel_ofu_collector.option_bounds import Bound

WINDOWS = FlagOption(
    "hang_windows",
    3,
    Bound(int, 1, 10_000),
    help="windows in a row with every GPU of a job stalled (kernels running, nothing moving) before job.hang rises",
    metavar="WINDOWS",
)
# A hung kernel spins all window (engine ~1); an input-bound job's engine waits on its data loader (~0.6 and less).
ENGINE = FlagOption(
    "hang_engine_active",
    0.5,
    Bound(float, 0.0, 1.0),
    help="engine activity at or above which a GPU counts as running kernels, for job.hang",
    metavar="FRACTION",
)
# A hung NCCL collective holds one block per channel, up to 32 channels: 32 of an H100's 132 SMs is 0.24. A busy
# job's SMs are 0.8 and more (a communication-bound one's too: its kernels move bytes).
SM = FlagOption(
    "hang_sm_active",
    0.25,
    Bound(float, 0.0, 1.0),
    help="SM activity at or below which a GPU's SMs count as nearly empty, for job.hang",
    metavar="FRACTION",
)
# The loss split's own bar for no tensor work (1% of the window), applied to DRAM activity as well.
ACTIVITY = FlagOption(
    "hang_activity",
    0.01,
    Bound(float, 0.0, 1.0),
    help="tensor and DRAM activity under which nothing moves on a GPU, for job.hang",
    metavar="FRACTION",
)
# Collectives move tens to hundreds of GB/s; 1 GB/s leaves room for what a stalled job's host still moves over PCIe
# (kernel launches, polling, monitoring).
LINKS = FlagOption(
    "hang_link_throughput",
    1e9,
    Bound(float, 0.0, 1e13, "B/s"),
    help="NVLink + PCIe bytes per second (both directions) under which a GPU's links count as quiet, for job.hang",
    metavar="BYTES_PER_S",
)


@attrs.frozen
class Thresholds:
    """The settings a GPU is judged stalled by (``stalled``)."""

    engine_active: float
    sm_active: float
    activity: float
    link_bytes_per_s: float

    @classmethod
    def of(cls, config: FlagSettings) -> Thresholds:
        return cls(config.flag(ENGINE), config.flag(SM), config.flag(ACTIVITY), config.flag(LINKS))


def stalled(
    thresholds: Thresholds,
    tensor: Sequence[float],
    engine: Sequence[float | None] | None,
    sm: Sequence[float | None] | None,
    dram: Sequence[float | None] | None,
    links: Sequence[float | None] | None,
) -> list[bool | None]:
    """Each GPU's verdict in one window, from its window means in columns (None: the GPU, or the column, has no such
    input): True stalled, False moving, None not judged (no engine or SM activity and nothing else moving)."""
    n = len(tensor)
    none: list[float | None] = [None] * n
    engine_of, sm_of, dram_of, links_of = (
        column if column is not None else none for column in (engine, sm, dram, links)
    )
    found: list[bool | None] = []
    for t, e, s, d, bytes_per_s in zip(tensor, engine_of, sm_of, dram_of, links_of, strict=True):
        if t >= thresholds.activity or (d is not None and d >= thresholds.activity):
            found.append(False)  # tensor or memory work
        elif bytes_per_s is not None and bytes_per_s >= thresholds.link_bytes_per_s:
            found.append(False)  # communication
        elif e is None or s is None:
            found.append(None)
        else:
            found.append(e >= thresholds.engine_active and s <= thresholds.sm_active)
    return found


@attrs.define
class _Hang:
    windows: int
    run: int = 0
    up: int | None = None

    def assess(self, window: JobWindowValues) -> int | None:
        if not window.gpus:
            return None
        if window.moving_gpus > 0.0:
            self.run = 0
            self.up = 0
            return 0
        if window.all_stalled:
            self.run += 1
            self.up = int(self.run >= self.windows)
            return self.up
        return None  # some GPUs not judged, none moving: this window says nothing


@attrs.frozen
class Hang:
    metric: names.MetricSpec = names.JOB_HANG
    record_key: str = "hang"
    kind: str = "hang"
    label: str = "hang"
    options: Sequence[FlagOption[Any]] = (WINDOWS, ENGINE, SM, ACTIVITY, LINKS)

    def start(self, config: FlagSettings) -> _Hang:
        return _Hang(config.flag(WINDOWS))


DETECTOR = Hang()
