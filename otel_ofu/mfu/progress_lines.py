"""Training progress in a log line: the step it names, and a checkpoint save or load it timed. Pure.

What the log follower passes to the reporter as ``job.step`` and ``job.checkpoint.time`` (``otel-ofu mfu-from-log``):

* a step: ``step 120``, ``step: 120``, ``iteration 100/1000`` (Megatron-LM), ``iter 7``; a word before it joined by
  ``_`` or ``.`` (``global_step``, ``train.step``) is another counter and is not read. A line that names the step it
  loaded (``loaded checkpoint ... at iteration 80``, torchtitan's ``step-80``) names the step the job resumes from,
  which is what ``job.step`` then says (a restart, to the collector);
* a checkpoint timed: torchtitan's ``Finished saving the checkpoint ... in 5.23 seconds`` and ``Finished loading the
  checkpoint in 2.11 seconds``, the like ``checkpoint saved in 12 s``, and Megatron-LM's timer lines
  ``save-checkpoint ....: (3210.55, 3210.61)`` (milliseconds, min and max over the ranks: the max is what the job
  waited).
"""

from __future__ import annotations

import math
import re

import attrs

from otel_ofu import names

_NUMBER = r"\d+(?:\.\d*)?|\.\d+"
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
# The step, as most frameworks print it; torchtitan's checkpoint folders are named step-N.
_STEP = re.compile(r"(?<![\w.])(?:step|iteration|iter)(?:\b\s*[:=#]?\s*|-)(?P<step>\d+)\b", re.IGNORECASE)
# "saving the checkpoint ... in 5.2 seconds", "checkpoint saved in 12 s", "loaded checkpoint in 800 ms".
_TIMED = re.compile(
    rf"(?:(?P<op>sav|load)\w*\b[^\n]*?\bcheckpoint|checkpoint\w*\b[^\n]*?\b(?P<op_after>sav|load)\w*)"
    rf"[^\n]*?\bin\s+(?P<value>{_NUMBER})\s*(?P<unit>ms|milliseconds?|s|secs?|seconds?)\b",
    re.IGNORECASE,
)
# Megatron-LM's timers, in ms: "save-checkpoint ......: (3210.55, 3210.61)".
_TIMER = re.compile(
    rf"\b(?P<op>save|load)-checkpoint\s*\.*\s*:\s*\(\s*(?P<low>{_NUMBER})\s*,\s*(?P<high>{_NUMBER})\s*\)",
    re.IGNORECASE,
)
_OPERATIONS = {"sav": names.CheckpointOperation.SAVE, "save": names.CheckpointOperation.SAVE}


@attrs.frozen
class ProgressLine:
    """What one line says of progress: the step (None: none), a checkpoint's (operation, seconds) (None: none)."""

    step: int | None = None
    checkpoint: tuple[str, float] | None = None

    @property
    def empty(self) -> bool:
        return self.step is None and self.checkpoint is None


def _operation(text: str) -> str:
    return _OPERATIONS.get(text.lower(), names.CheckpointOperation.LOAD)


def parse_progress(line: str) -> ProgressLine:
    """The step and the timed checkpoint a log line states, either absent when it states none."""
    text = _ANSI.sub("", line) if "\x1b" in line else line
    checkpoint: tuple[str, float] | None = None
    timer = _TIMER.search(text)
    if timer is not None:
        checkpoint = (_operation(timer["op"]), float(timer["high"]) / 1000.0)
    else:
        timed = _TIMED.search(text)
        if timed is not None:
            value = float(timed["value"])
            seconds = value / 1000.0 if timed["unit"].lower().startswith("m") else value
            checkpoint = (_operation(timed["op"] or timed["op_after"]), seconds)
    if checkpoint is not None and not math.isfinite(checkpoint[1]):
        checkpoint = None
    found = _STEP.search(text)
    return ProgressLine(int(found["step"]) if found is not None else None, checkpoint)
