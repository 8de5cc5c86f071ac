"""A simulated job's training run over time: when it starts, trains, saves, crashes, reloads and hangs. Pure.

The simulated fleet (``simulated.SimulatedFleet``) asks a job's ``Timeline`` what its GPUs are doing at a moment
(``Phase.kind``: what the counters then show) and what its framework reports: the last completed step (``job.step``)
and the seconds its current process has spent saving and loading checkpoints (``job.checkpoint.time``, a cumulative
series per process: a relaunched job starts a new one). The phases of a ``TrainingPlan``:

* ``warmup`` from the start for ``startup_s`` (loading weights, compiling: kernels now and then), then
* ``train``: a step every ``step_s``; every ``checkpoint_every`` steps a ``save`` of ``save_s`` (progress pauses);
* at ``crash_at_s`` the process dies: ``down`` for ``down_s`` (its GPUs allocated and idle), then ``warmup`` again
  for ``load_s`` (the relaunched process loads its last checkpoint), and training resumes from that checkpoint's step;
  the reporter says that step when the load ends, then the steps again;
* from ``hang_at_s`` (``JobSpec.hang_at_s``) ``hung``: every GPU spins in a collective, nothing moves, no step.
"""

from __future__ import annotations

import bisect
from typing import Final

import attrs

WARMUP: Final = "warmup"
TRAIN: Final = "train"
SAVE: Final = "save"
DOWN: Final = "down"
HUNG: Final = "hung"


@attrs.frozen
class TrainingPlan:
    """How a simulated job trains; seconds since the fleet started."""

    step_s: float = 5.0
    startup_s: float = 60.0
    checkpoint_every: int = 0  # steps between saves; 0: never saves
    save_s: float = 0.0
    crash_at_s: float | None = None
    down_s: float = 60.0
    load_s: float = 30.0


@attrs.frozen
class Phase:
    start_s: float
    end_s: float
    kind: str
    step: int  # the last step completed when the phase starts (0: none yet)
    process: int  # which run of the job (0 the first; a relaunch starts the next)


@attrs.frozen
class Timeline:
    """A job's phases from the fleet's start to ``end_s``, with what its framework reports."""

    phases: tuple[Phase, ...]
    step_s: float
    starts: tuple[float, ...] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "starts", tuple(phase.start_s for phase in self.phases))

    def phase(self, t_s: float) -> Phase:
        return self.phases[max(0, bisect.bisect_right(self.starts, t_s) - 1)]

    def kind(self, t_s: float) -> str:
        return self.phase(t_s).kind

    def step(self, t_s: float) -> int | None:
        """The last step completed by ``t_s`` as the framework reports it: None before the first one and while its
        process is down; after a relaunch, the checkpoint's step from the end of its load."""
        phase = self.phase(t_s)
        if phase.kind == DOWN:
            return None
        done = phase.step
        if phase.kind == TRAIN:
            done += int((t_s - phase.start_s) / self.step_s + 1e-9)
        if phase.process > 0 and phase.kind == WARMUP:
            return None  # the relaunched process reports once its load is done
        return done if done > 0 else None

    def checkpoint_seconds(self, t_s: float) -> tuple[int, dict[str, float]]:
        """(the current process's number, seconds it spent saving and loading by ``t_s``): its cumulative series."""
        current = self.phase(t_s).process
        saved = loaded = 0.0
        for phase in self.phases:
            if phase.process != current or phase.start_s >= t_s:
                continue
            spent = min(t_s, phase.end_s) - phase.start_s
            if phase.kind == SAVE:
                saved += spent
            elif phase.kind == WARMUP and current > 0:
                loaded += spent
        found: dict[str, float] = {}
        if saved:
            found["save"] = saved
        if loaded:
            found["load"] = loaded
        return current, found

    def process_start(self, process: int) -> float:
        return next(phase.start_s for phase in self.phases if phase.process == process)


def timeline(plan: TrainingPlan, end_s: float, hang_at_s: float | None = None) -> Timeline:
    """The plan's phases up to ``end_s`` (a hang from ``hang_at_s`` on, to the end)."""
    phases: list[Phase] = []
    t, step, process, saved_step = 0.0, 0, 0, 0
    stop = end_s if hang_at_s is None else min(end_s, hang_at_s)

    def add(kind: str, length: float) -> None:
        nonlocal t
        end = min(stop, t + length)
        if end > t:
            phases.append(Phase(t, end, kind, step, process))
        t = end

    add(WARMUP, plan.startup_s)
    crashed = False
    while t < stop:
        if plan.crash_at_s is not None and not crashed and t >= plan.crash_at_s:
            crashed = True
            add(DOWN, plan.down_s)
            process += 1
            step = saved_step
            add(WARMUP, plan.load_s)
            continue
        run = plan.checkpoint_every if plan.checkpoint_every > 0 else 10**9
        length = run * plan.step_s
        if plan.crash_at_s is not None and not crashed and t + length > plan.crash_at_s:
            length = plan.crash_at_s - t  # trains until it dies
        start = t
        add(TRAIN, length)
        step += int((t - start) / plan.step_s + 1e-9)
        if plan.checkpoint_every > 0 and t < stop and step % plan.checkpoint_every == 0 and t - start >= length:
            saved_step = step
            add(SAVE, plan.save_s)
    if hang_at_s is not None and hang_at_s < end_s:
        if phases and phases[-1].kind == TRAIN:
            last = phases[-1]
            step = last.step + int((last.end_s - last.start_s) / plan.step_s + 1e-9)
        phases.append(Phase(hang_at_s, end_s, HUNG, step, process))
    return Timeline(tuple(phases), plan.step_s)
