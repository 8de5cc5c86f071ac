"""The simulated fleet read over a stretch of manual-clock time, for the tests of what it shows over time."""

from __future__ import annotations

from otel_ofu.clock import ManualClock
from otel_ofu.model import Snapshot
from otel_ofu.sources.simulated import SimulatedFleet


def run_for(fleet: SimulatedFleet, clock: ManualClock, seconds: float, interval_s: float) -> list[Snapshot]:
    """Advance ``clock`` in ``interval_s`` steps for ``seconds`` and read the fleet after each step."""
    snapshots: list[Snapshot] = []
    for _ in range(round(seconds / interval_s)):
        clock.advance(interval_s)
        snapshots.append(fleet.read())
    return snapshots
