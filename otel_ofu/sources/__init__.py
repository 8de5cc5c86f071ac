"""Counter sources, each implementing ``otel_ofu.model.Source``, and the optional abilities some have.

An ability is a small protocol of its own: the producer asks ``isinstance(source, Finite)`` instead of
probing attributes by name, and mypy checks every source that claims one.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import attrs

from otel_ofu.model import GpuError, GpuIdentity, GpuReading

# What a reading holds beyond its identity and span; truth_* is the simulator's, never read from a GPU.
_NOT_VALUES = frozenset({"gpu", "start_ns", "end_ns", "truth_ofu", "truth_precision"})


@runtime_checkable
class Finite(Protocol):
    """A source that runs out (a replayed capture, dcgmi dmon text): ``exhausted`` once it has."""

    exhausted: bool


@runtime_checkable
class ListsProcesses(Protocol):
    """A source that can list the processes computing on a GPU (NVML), for process-based attribution."""

    def compute_pids(self, gpu: GpuIdentity) -> tuple[int, ...]: ...


def is_exhausted(source: object) -> bool:
    """Whether ``source`` is finite and has run out."""
    return isinstance(source, Finite) and source.exhausted


def keep_values(reading: GpuReading, outcome: GpuReading | GpuError) -> tuple[GpuReading | GpuError, ...]:
    """``outcome`` (the reading, or the error saying why it gives no OFU), with the reading kept beside an
    error whenever it holds any value: a GPU whose tensor activity is blank still has its clock."""
    if outcome is reading:
        return (reading,)
    # A value is any field that is set: not None, and not an empty mapping (no throttle reason known).
    has_values = any(
        getattr(reading, field.name) not in (None, {})
        for field in attrs.fields(GpuReading)
        if field.name not in _NOT_VALUES
    )
    return (reading, outcome) if has_values else (outcome,)
