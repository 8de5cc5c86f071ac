"""What an open window holds: a cell per GPU stream (and job it served), its loss inputs, its jobs' MFU.

A cell keeps its OFU points' time-weighted sum and weight (their mean is the GPU's OFU in the window) and the time its
points cover: the union of their parts inside the window (``coverage``), so that a point sent twice, or intervals
that overlap by a timer's jitter, add no time. A producer's intervals follow each other, so a cell's time is nearly
always one span whose end moves on: kept as two integers (``lo``, ``hi``), a list of spans only once the points leave
a gap. The time of points without OFU (``gpu.ofu.unmeasured``) is kept apart, as spans.

Pure values and the few functions that fill and read them; the windows (``windows.Aggregator``) decide which cell a
point goes to, and the close (``closing``) reads them.
"""

from __future__ import annotations

from array import array
from collections.abc import Mapping

import attrs

from otel_ofu import bounds, names
from otel_ofu_collector.aggregation import coverage

NS_PER_S = 1e9
# A stream's identity as the windows need it: (job.id, *group values, *job attribute values, *partition values), None
# where absent. Interned (``streams.StreamTable.profile_of``), so the streams of one job share one tuple.
Profile = tuple[str | None, ...]
# A cell's key in its window: the stream's key; (key, job.id) for the cell of a stream that moved job in it.
CellKey = str | tuple[str, str | None]
# Seconds of a GPU's time in a window its energy counter's deltas may leave uncovered before its power fills them:
# the two cover the same intervals, up to the rounding of their splits over windows.
_UNCOVERED_S = 1e-6


@attrs.define(slots=True)
class Cell:
    """One stream (for one job) in one window. ``weighted`` / ``weight``: its OFU points' time-weighted sum and weight
    (weight 0: no OFU point, only unmeasured time). ``lo``, ``hi``: the one span its OFU points cover (``hi`` 0: none
    yet), or ``spans`` where they cover several (``coverage``); ``unmeasured``: what its points without OFU cover
    (None until one comes); ``carried`` and ``carried_unmeasured``: ns of earlier windows that had closed when the
    point came (``windows.Aggregator._parts``)."""

    weighted: float
    weight: float
    profile: Profile
    last_end_ns: int
    job_id: str | None
    lo: int = 0
    hi: int = 0
    spans: list[int] | None = None
    carried: float = 0.0
    unmeasured: list[int] | None = None
    carried_unmeasured: float = 0.0

    def cover(self, lo: int, hi: int) -> None:
        """Add (lo, hi] to what the cell's OFU points cover."""
        spans = self.spans
        if spans is None:
            if not self.hi:
                self.lo, self.hi = lo, hi
                return
            if lo <= self.hi and hi >= self.lo:  # meets or overlaps the one span: the common case
                if lo < self.lo:
                    self.lo = lo
                if hi > self.hi:
                    self.hi = hi
                return
            self.spans = spans = [self.lo, self.hi]
        coverage.cover(spans, lo, hi)

    def measured_ns(self) -> int:
        """The ns its OFU points cover in the window (carried time aside)."""
        return self.hi - self.lo if self.spans is None else coverage.covered(self.spans)

    def seconds(self) -> tuple[float, float]:
        """(seconds in the window, seconds of them its OFU covered), carried time included."""
        measured = self.hi - self.lo if self.spans is None else coverage.covered(self.spans)
        if self.unmeasured is None:
            total = measured
        else:
            total = coverage.covered_union(self.spans or ([self.lo, self.hi] if self.hi else []), self.unmeasured)
        carried = self.carried
        return (total + carried + self.carried_unmeasured) / NS_PER_S, (measured + carried) / NS_PER_S


def add_to_cell(
    cells: dict[CellKey, Cell],
    key: str,
    value: float | None,
    low: int,
    high: int,
    carried: float,
    profile: Profile,
    job_id: str | None,
    bill_carried: bool,
) -> None:
    """Add one point's part (low, high] (``carried`` ns more from closed windows, billed as time only where
    ``bill_carried``: a point that extends its stream), with its OFU (None: unmeasured), to its stream's cell for its
    job: the stream's own cell, or the cell under (key, job.id) once the stream moved job in the window. A part without
    duration (a stream's first point without an interval) weighs 1 ns in the OFU mean and covers nothing."""
    cell = cells.get(key)
    if cell is not None and cell.job_id != job_id:
        moved = (key, job_id)
        cell = cells.get(moved)
        if cell is None:
            cell = cells[moved] = Cell(0.0, 0.0, profile, high, job_id)
    elif cell is None:
        cell = cells[key] = Cell(0.0, 0.0, profile, high, job_id)
    if value is None:
        if cell.unmeasured is None:
            cell.unmeasured = []
        coverage.cover(cell.unmeasured, low, high)
        if bill_carried:
            cell.carried_unmeasured += carried
    else:
        weight = float(high - low) + carried if high > low or carried else 1.0
        cell.weighted += value * weight
        cell.weight += weight
        if high > low:
            cell.cover(low, high)
        if bill_carried:
            cell.carried += carried
    if high >= cell.last_end_ns:
        cell.profile = profile
        cell.last_end_ns = high


# Where each averaged loss input keeps its (weighted sum, weight) pair in ``GpuInputs.sums``; after them the NVLink
# and PCIe bytes of the window (their counters' deltas, both directions) and each throttle reason's weighted share
# (over the GPU's OFU weight: the same intervals).
SLOTS: dict[str, int] = {
    names.GPU_TENSOR_ACTIVE.name: 0,
    names.GPU_CLOCK_SM.name: 2,
    names.GPU_CLOCK_SM_MAX.name: 4,
    names.GPU_FLOPS_ACHIEVED.name: 6,
    names.GPU_POWER.name: 8,
    names.GPU_ENGINE_ACTIVE.name: 10,
    names.GPU_SM_ACTIVE.name: 12,
    names.GPU_DRAM_ACTIVE.name: 14,
}
NVLINK_SLOT, PCIE_SLOT = 16, 18  # (bytes, parts counted): the second says the GPU sent the counter at all
REASON_SLOTS: dict[str, int] = {reason: 20 + i for i, reason in enumerate(names.ThrottleReason.ALL)}
_SUMS = 20 + len(REASON_SLOTS)
TENSOR_SLOT = SLOTS[names.GPU_TENSOR_ACTIVE.name]
CLOCK_SLOT = SLOTS[names.GPU_CLOCK_SM.name]
CLOCK_MAX_SLOT = SLOTS[names.GPU_CLOCK_SM_MAX.name]
FLOPS_SLOT = SLOTS[names.GPU_FLOPS_ACHIEVED.name]
POWER_SLOT = SLOTS[names.GPU_POWER.name]
ENGINE_SLOT = SLOTS[names.GPU_ENGINE_ACTIVE.name]
SM_SLOT = SLOTS[names.GPU_SM_ACTIVE.name]
DRAM_SLOT = SLOTS[names.GPU_DRAM_ACTIVE.name]
ENERGY = names.GPU_ENERGY.name
# The cumulative counters a GPU stream sends, by field (``otlp.roles.keyed_field``), with their metric; and where the
# I/O counters' deltas go (energy has a field of its own, ``GpuInputs.energy_j``).
COUNTER_FIELDS: dict[str, str] = {
    ENERGY: ENERGY,
    **{
        f"{metric}|{direction}": metric
        for metric in (names.GPU_NVLINK_IO.name, names.GPU_PCIE_IO.name)
        for direction in names.IoDirection.ALL
    },
}
# Each counter field's most per second a GPU can reach (``otel_ofu.bounds.MAX_RATES``).
COUNTER_RATES: dict[str, float] = {field: bounds.MAX_RATES[metric] for field, metric in COUNTER_FIELDS.items()}
COUNTER_SLOTS: dict[str, int] = {
    f"{metric}|{direction}": slot
    for metric, slot in ((names.GPU_NVLINK_IO.name, NVLINK_SLOT), (names.GPU_PCIE_IO.name, PCIE_SLOT))
    for direction in names.IoDirection.ALL
}


def _no_sums() -> array[float]:
    return array("d", bytes(8 * _SUMS))


@attrs.define(slots=True)
class GpuInputs:
    """One stream's loss inputs in one window: time-weighted sums and weights per metric and the weighted throttle
    shares, in one flat array of doubles (a few hundred bytes less per GPU than tables). A metric's mean is
    sums[slot] / sums[slot + 1], None without weight; the GPU's energy (``energy``) is its counter's deltas
    (``energy_j``, over ``energy_ns``) and mean power over the rest."""

    identity: Mapping[str, str]
    sums: array[float] = attrs.field(factory=_no_sums)
    energy_j: float | None = None
    energy_ns: float = 0.0  # the time the counter's deltas cover in the window

    def add(self, values: Mapping[str, float], throttle: Mapping[str, float], weight: float) -> None:
        """One interval's gauges (by metric) and throttle shares (by reason), weighing ``weight`` ns. The hottest
        loop of the windows (a GPU report's gauges): the table's lookup is bound once, not found per metric, and a
        report without throttle shares (most) does not start a loop over none."""
        sums = self.sums
        slot_of = SLOTS.get
        for metric, value in values.items():
            slot = slot_of(metric)
            if slot is not None:
                sums[slot] += value * weight
                sums[slot + 1] += weight
        if throttle:
            for reason, value in throttle.items():
                if value:  # a reason absent from the interval: nothing to add (the window reads it as 0)
                    slot = REASON_SLOTS.get(reason)
                    if slot is not None:
                        sums[slot] += value * weight

    def add_counter(self, field: str, part: float, weight: float) -> None:
        """Part of a counter's delta, over ``weight`` ns of the window."""
        if field == ENERGY:
            self.energy_j = part if self.energy_j is None else self.energy_j + part
            self.energy_ns += weight
        else:
            slot = COUNTER_SLOTS[field]
            self.sums[slot] += part
            self.sums[slot + 1] += 1.0

    def energy(self, seconds: float) -> float | None:
        """The GPU's energy over its ``seconds`` in the window: the counter's deltas, and mean power x the seconds they
        do not cover (a counter's first reading here only sets its baseline: a collector restarted, or a job moved to
        this shard); mean power x the seconds without a counter; None with neither."""
        sums = self.sums
        weight = sums[POWER_SLOT + 1]
        if self.energy_j is None:
            return sums[POWER_SLOT] / weight * seconds if weight else None
        uncovered = seconds - self.energy_ns / NS_PER_S
        if weight and uncovered > _UNCOVERED_S:
            return self.energy_j + sums[POWER_SLOT] / weight * uncovered
        return self.energy_j

    def mean(self, slot: int) -> float | None:
        sums = self.sums
        return sums[slot] / sums[slot + 1] if sums[slot + 1] else None

    def throttle_shares(self, covered: float) -> dict[str, float]:
        """Each reason's share of the window, over ``covered`` (the GPU's OFU weight: the same intervals; the decoder
        leaves zero shares out), for the reasons that held the clock at all."""
        sums = self.sums
        return {
            reason: min(1.0, sums[slot] / covered) if covered > 0 else 0.0
            for reason, slot in REASON_SLOTS.items()
            if sums[slot] > 0
        }


@attrs.define(slots=True)
class MfuCell:
    total: float
    count: int
    attributes: Mapping[str, str]


@attrs.define
class Window:
    # A stream's cell under its key; should the stream move to another job inside the window, the cell for that job
    # under (key, job.id). One table, so that cells keep the order their first points came in.
    cells: dict[CellKey, Cell] = attrs.field(factory=dict)
    mfu: dict[str, MfuCell] = attrs.field(factory=dict)
    gpus: dict[str, GpuInputs] = attrs.field(factory=dict)  # loss inputs by stream key
    # By job.id: its job.step points (time in ns -> step) and the seconds its checkpoints took in the window.
    steps: dict[str, dict[int, float]] = attrs.field(factory=dict)
    checkpoints: dict[str, float] = attrs.field(factory=dict)


# An interval's part in one window: (window, low, high, ns carried in from windows that had closed), its span
# (low, high] inside the window.
Part = tuple[Window, int, int, float]


def window_start(time_ns: int, window_ns: int) -> int:
    """The start of the window (start, start + width] that holds ``time_ns``."""
    return ((time_ns - 1) // window_ns) * window_ns
