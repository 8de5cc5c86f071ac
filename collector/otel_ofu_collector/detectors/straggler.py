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

import itertools
import operator
from collections.abc import Mapping, Sequence
from typing import Any, Final

import attrs

from otel_ofu import names
from otel_ofu_collector.detectors.base import FlagOption, FlagSettings, GpuVerdict, GpuWindowValues
from otel_ofu_collector.option_bounds import Bound

# A factor of 1 flags every GPU under its peers' median, half of any job; beyond 100x the GPU does no work
# worth comparing (it is idle, counted by job.gpus.idle).
FACTOR = FlagOption(
    "straggler_factor",
    1.25,
    Bound(float, 1.0, 100.0),
    help="a GPU straggles while its OFU x this stays below its job's median OFU",
    metavar="FACTOR",
)
WINDOWS = FlagOption(
    "straggler_windows",
    3,
    Bound(int, 1, 10_000),
    help="consecutive windows below before gpu.straggler rises",
    metavar="WINDOWS",
)

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
class _Stragglers:
    """One job's GPUs: each GPU's run of windows below, kept only while it runs (a GPU not below, or gone from
    the job, is where a fresh one starts), so a healthy job holds nothing per GPU."""

    factor: float
    windows: int
    runs: dict[str, int] = attrs.field(factory=dict)  # stream key -> consecutive windows below, >= 1

    def assess(self, window: GpuWindowValues) -> list[GpuVerdict]:
        keys, ofus, medians, idle = window.keys, window.ofu, window.job_median_ofu, window.idle
        below: list[int] = []
        if len(keys) >= 2:  # OFU x factor < the peers' median, in one C-level pass; then the few others' tests
            slow = map(operator.lt, map(self.factor.__mul__, ofus), medians)
            below = [i for i in itertools.compress(range(len(keys)), slow) if medians[i] > 0.0 and not idle[i]]
        below_keys = list(map(keys.__getitem__, below))
        previous = self.runs
        get = previous.get
        runs = {key: get(key, 0) + 1 for key in below_keys} if previous else dict.fromkeys(below_keys, 1)
        self.runs = runs
        windows = self.windows
        shown = dict.fromkeys(itertools.compress(below, map(windows.__le__, map(runs.__getitem__, below_keys))), 1)
        was_up = {key for key, run in previous.items() if run >= windows and runs.get(key, 0) < windows}
        if was_up:  # cleared: shown once, with 0
            shown.update((i, 0) for i, key in enumerate(keys) if key in was_up)
        verdicts = []
        for i in sorted(shown):
            labels = _NO_LABELS
            if shown[i]:
                reason = throttle_reason(window.throttle(i))
                labels = {names.GPU_THROTTLE_REASON: reason} if reason else _NO_LABELS
            verdicts.append(GpuVerdict(i, shown[i], labels))
        return verdicts


@attrs.frozen
class Straggler:
    metric: names.MetricSpec = names.GPU_STRAGGLER
    record_key: str = "straggler"
    kind: str = "straggler"
    label: str = "straggler GPU"
    options: Sequence[FlagOption[Any]] = (FACTOR, WINDOWS)

    def start(self, config: FlagSettings) -> _Stragglers:
        return _Stragglers(config.flag(FACTOR), config.flag(WINDOWS))


GPU_DETECTOR = Straggler()
