"""Goodput: where a job's allocated GPU time went, window by window and over the job. Pure arithmetic.

Every GPU-second a job was allocated (its GPU time, ``job.gpu_time``) is either productive or badput, by
``names.GoodputCause``, each second booked once:

1. **From the counters, in the window they happen** (``counter_badput``), by precedence, each capped by what the
   ones before it left: ``hang``, the job's whole GPU time in a window all its GPUs were stalled (running kernels with
   nothing moving: ``detectors.hang.stalled``), counted from the first such window, whether or not ``job.hang`` has
   risen yet (the flag waits its windows so that a passing stall pages no one; the time was lost either way);
   ``checkpoint``, the seconds of the window the job's framework reported saving or loading checkpoints x the job's
   GPU equivalents (its GPU time over the window's length); ``idle``, the GPU-seconds of its GPUs with no tensor
   activity all window that were not stalled. The rest of the window is productive, until progress says otherwise.
2. **From progress, in the window the step points show it** (``GoodputState.close``), for a job that reports
   ``job.step``: ``startup``, the productive time from the job's first GPU report to its first step point;
   ``rework``, at a restart (a step point below the last one), the productive time its steps after the one it resumed
   from took the first time; ``recovery``, the productive time from its last progress before the restart (the first
   time it reached its highest step) to the step point of the restart. These move time already counted productive to
   badput, so they are booked in the window that shows them, which may be windows after the time itself: a window's
   ``job.badput`` is what that window learnt, and over the job every second is counted once.

Within a window, productive time is taken as spread evenly over it (exact for a job whose GPUs report all window): the
productive time up to a step point at ``t`` is the productive time before the window plus the window's x the share of
the window before ``t``. Steps between two step points are taken as evenly spaced in productive time, so a restart to
a step between two points is exact when the framework reports the step it resumed from (the reporter does at a
checkpoint load) and the steps run at an even pace.

The state per job (``GoodputState``) keeps its sums since its first window and, once it reported a step, the marks of
its current progress: (step, productive time to reach it since the first step) at each new highest step, at most
``MAX_MARKS`` (past that the older half is thinned, every other mark: a restart far back is interpolated over a wider
span). ``job.goodput`` = (allocated - badput) / allocated over the job so far; ``job.goodput.flops`` the same for the
useful GPU time (OFU x time) of the productive time: useful FLOPs over the peak FLOPs of the allocated time, the
program's own efficiency included. ``fleet.goodput`` is over the ``--horizon``, from the jobs' windows in it.
"""

from __future__ import annotations

import bisect
import math
from array import array
from collections import deque
from collections.abc import Iterable, Mapping

import attrs

from otel_ofu import names
from otel_ofu_collector.results import FleetGoodput, JobGoodput

G = names.GoodputCause
B = names.GoodputBasis
COUNTER_CAUSES = (G.IDLE, G.HANG, G.CHECKPOINT)  # what a job without progress input has
MAX_MARKS = 128
NS_PER_S = 1e9


def counter_badput(
    gpu_time_s: float, stalled: bool, checkpoint_s: float, window_s: float, idle_s: float
) -> dict[str, float]:
    """A window's badput from the counters and the reported checkpoint time (see the module doc), each capped by
    what the causes before it left of ``gpu_time_s``."""
    left = gpu_time_s
    hang = left if stalled else 0.0
    left -= hang
    checkpoint = min(left, checkpoint_s * gpu_time_s / window_s) if window_s > 0.0 else 0.0
    left -= checkpoint
    idle = min(left, idle_s)
    return {G.IDLE: idle, G.HANG: hang, G.CHECKPOINT: checkpoint}


@attrs.define
class Progress:
    """A job's marks along its current progress: (step, productive GPU-seconds and useful GPU-seconds to reach it from
    its first step point), in step order, at most ``MAX_MARKS``."""

    steps: array[float] = attrs.field(factory=lambda: array("d"))
    kept: array[float] = attrs.field(factory=lambda: array("d"))
    useful: array[float] = attrs.field(factory=lambda: array("d"))

    @property
    def last_step(self) -> float:
        return self.steps[-1]

    def add(self, step: float, kept: float, useful: float) -> None:
        if len(self.steps) >= MAX_MARKS:
            self._thin()
        self.steps.append(step)
        self.kept.append(kept)
        self.useful.append(useful)

    def at(self, step: float) -> tuple[float, float]:
        """The productive and useful time to reach ``step``: between the marks around it, evenly; the first mark's
        below it (nothing before the first step point is progress)."""
        steps = self.steps
        i = bisect.bisect_left(steps, step)
        if i < len(steps) and steps[i] == step:
            return self.kept[i], self.useful[i]
        if i == 0:
            return self.kept[0], self.useful[0]
        if i == len(steps):
            return self.kept[-1], self.useful[-1]
        share = (step - steps[i - 1]) / (steps[i] - steps[i - 1])
        return (
            self.kept[i - 1] + share * (self.kept[i] - self.kept[i - 1]),
            self.useful[i - 1] + share * (self.useful[i] - self.useful[i - 1]),
        )

    def back_to(self, step: float, kept: float, useful: float) -> None:
        """A restart to ``step``: the marks past it are no longer progress; ``step`` becomes the last, at the time it
        took to reach it the first time."""
        i = bisect.bisect_left(self.steps, step)
        del self.steps[i:], self.kept[i:], self.useful[i:]
        self.add(step, kept, useful)

    def _thin(self) -> None:
        """Every other mark of the older half: the newest marks, where a restart most likely goes back to, stay."""
        half = len(self.steps) // 2
        for column in (self.steps, self.kept, self.useful):
            column[:half] = column[:half:2]


@attrs.define
class GoodputState:
    """One job's goodput state: sums since its first window and its progress (None until its first step point)."""

    gpu_time_s: float = 0.0
    productive_s: float = 0.0  # as the counters left it, before progress moved any of it to badput
    useful_s: float = 0.0  # OFU x time of that productive time
    moved_s: float = 0.0  # productive time progress moved to badput (startup, recovery, rework)
    moved_useful_s: float = 0.0
    progress: Progress | None = None

    def close(
        self,
        start_ns: int,
        end_ns: int,
        gpu_time_s: float,
        useful_s: float,
        stalled: bool,
        idle_s: float,
        checkpoint_s: float,
        steps: Mapping[int, float],
    ) -> JobGoodput | None:
        """One window of the job: its badput by cause (booked in it) and its goodput so far; None while the job has had
        no GPU time."""
        window_s = (end_ns - start_ns) / NS_PER_S
        booked = counter_badput(gpu_time_s, stalled, checkpoint_s, window_s, idle_s)
        productive = max(0.0, gpu_time_s - math.fsum(booked.values()))
        useful = useful_s * productive / gpu_time_s if gpu_time_s > 0.0 else 0.0
        if steps:
            booked.update(self._progress(start_ns, end_ns, productive, useful, steps))
        elif self.progress is not None:
            booked.update(dict.fromkeys(G.PROGRESS, 0.0))
        self.gpu_time_s += gpu_time_s
        self.productive_s += productive
        self.useful_s += useful
        if self.gpu_time_s <= 0.0:
            return None
        return JobGoodput(
            badput_s=booked,
            goodput=max(0.0, self.productive_s - self.moved_s) / self.gpu_time_s,
            goodput_flops=max(0.0, self.useful_s - self.moved_useful_s) / self.gpu_time_s,
            basis=self.basis,
        )

    @property
    def basis(self) -> str:
        return B.COUNTERS if self.progress is None else B.PROGRESS

    def _progress(
        self, start_ns: int, end_ns: int, productive: float, useful: float, steps: Mapping[int, float]
    ) -> dict[str, float]:
        """The window's step points in time order against the marks: what they move to badput."""
        moved = dict.fromkeys(G.PROGRESS, 0.0)
        width = end_ns - start_ns
        # Kept productive and useful time before the window, less what this window's points moved so far.
        kept_before = self.productive_s - self.moved_s
        useful_before = self.useful_s - self.moved_useful_s
        for time_ns in sorted(steps):
            step = steps[time_ns]
            share = min(1.0, max(0.0, (time_ns - start_ns) / width)) if width > 0 else 1.0
            kept = kept_before + productive * share
            kept_useful = useful_before + useful * share
            progress = self.progress
            if progress is None:  # the first step point: everything before it was startup
                startup, startup_useful = max(0.0, kept), max(0.0, kept_useful)
                moved[G.STARTUP] += startup
                self._move(startup, startup_useful)
                kept_before -= startup
                useful_before -= startup_useful
                self.progress = Progress()
                self.progress.add(step, 0.0, 0.0)
            elif step > progress.last_step:
                progress.add(step, kept, kept_useful)
            elif step < progress.last_step:  # a restart
                resumed, resumed_useful = progress.at(step)
                reached, reached_useful = progress.kept[-1], progress.useful[-1]
                rework, rework_useful = max(0.0, reached - resumed), max(0.0, reached_useful - resumed_useful)
                recovery, recovery_useful = max(0.0, kept - reached), max(0.0, kept_useful - reached_useful)
                moved[G.REWORK] += rework
                moved[G.RECOVERY] += recovery
                self._move(rework + recovery, rework_useful + recovery_useful)
                kept_before -= rework + recovery
                useful_before -= rework_useful + recovery_useful
                progress.back_to(step, resumed, resumed_useful)
        return moved

    def _move(self, seconds: float, useful: float) -> None:
        self.moved_s += seconds
        self.moved_useful_s += useful


@attrs.define
class FleetGoodputLedger:
    """The fleet's goodput: the jobs' window sums added as they close (``add_job``), then per window (``close``) its
    badput by cause and the goodput over the horizon, from blocks of whole windows (as the correlation horizon)."""

    horizon_ns: int
    block_ns: int
    _blocks: deque[tuple[int, float, float]] = attrs.field(init=False, factory=deque)  # (start, allocated, badput)
    _allocated: float = attrs.field(init=False, default=0.0)
    _badput: dict[str, float] = attrs.field(init=False, factory=dict)
    _bases: set[str] = attrs.field(init=False, factory=set)
    _basis: str = attrs.field(init=False, default=B.COUNTERS)

    def add_job(self, gpu_time_s: float, goodput: JobGoodput | None) -> None:
        if goodput is None:
            return
        self._allocated += gpu_time_s
        for cause, seconds in goodput.badput_s.items():
            self._badput[cause] = self._badput.get(cause, 0.0) + seconds
        self._bases.add(goodput.basis)

    def close(self, start_ns: int, end_ns: int) -> FleetGoodput | None:
        """The window's fleet goodput; None while no job had GPU time in the horizon."""
        badput = {cause: self._badput[cause] for cause in G.ALL if cause in self._badput}
        total = math.fsum(badput.values())
        block = start_ns - start_ns % self.block_ns
        blocks = self._blocks
        if self._allocated or total:
            if blocks and blocks[-1][0] == block:
                _start, allocated, lost = blocks[-1]
                blocks[-1] = (block, allocated + self._allocated, lost + total)
            else:
                blocks.append((block, self._allocated, total))
        while blocks and blocks[0][0] < end_ns - self.horizon_ns:
            blocks.popleft()
        if self._bases:
            self._basis = self._bases.pop() if len(self._bases) == 1 else B.MIXED
        self._allocated, self._badput, self._bases = 0.0, {}, set()
        allocated = math.fsum(entry[1] for entry in blocks)
        if allocated <= 0.0:
            return None
        # Rework booked now for work older than the horizon could outweigh the horizon's time: read as none left.
        goodput = max(0.0, 1.0 - math.fsum(entry[2] for entry in blocks) / allocated)
        return FleetGoodput(badput_s=badput, goodput=goodput, basis=self._basis)


def bases(found: Iterable[str]) -> str:
    """The basis of goodputs of these bases: the one they share, else ``mixed``."""
    every = set(found)
    return every.pop() if len(every) == 1 else B.MIXED
