"""NVLink and PCIe traffic as cumulative byte counters, from the rates the sources report. Pure: no I/O.

DCGM (fields 1009-1012), NVML GPM (``PCIE_TX/RX_PER_SEC``, ``NVLINK_TOTAL_TX/RX_PER_SEC``) and dcgm-exporter give a
link's traffic as a rate, bytes per second over their own sampling period. The OpenTelemetry hardware conventions
count traffic as a cumulative sum of bytes per direction (``hw.network.io`` with ``network.io.direction``), which
is what a backend rates, sums over a job or integrates over a window without knowing the producer's interval. So
the producer integrates each reading's rate x its interval into a counter per GPU, link and direction:

- the counter starts at 0 at the start of the first interval it counts, which is its start time (when the
  producer started counting); a producer that restarts counts again from 0 with a new start time, which is how a
  cumulative sum says it was reset;
- a rate that is missing for an interval (a blank, a field the GPU lacks, a GPU that could not be read) adds
  nothing and gives no point: the counter keeps its value, and counts again from the next interval that has a
  rate. The traffic of the missing interval is unknown, so it is left out rather than guessed;
- a rate that cannot be one (negative, NaN, faster than any link: ``bounds.MAX_LINK_BYTES_PER_S``) is missing.

A partition of a GPU (a MIG instance) carries its share of the board's counters (``scaled``), as it does the
board's energy: the partitions add up to the board and nothing is counted twice.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Final, TypedDict

import attrs

from otel_ofu import bounds, names
from otel_ofu.model import IoCounter

# Metric -> the GpuReading field its counters go in.
READING_FIELDS: Final = {names.GPU_NVLINK_IO.name: "nvlink_io", names.GPU_PCIE_IO.name: "pcie_io"}


class LinkFields(TypedDict, total=False):
    """The GpuReading fields of the counters that have a point for an interval, by direction."""

    nvlink_io: dict[str, IoCounter]
    pcie_io: dict[str, IoCounter]


# link metric -> network.io.direction -> bytes per second (None: not read)
Rates = Mapping[str, Mapping[str, float | None]]


def link_rates(
    *,
    pcie_tx: float | None = None,
    pcie_rx: float | None = None,
    nvlink_tx: float | None = None,
    nvlink_rx: float | None = None,
) -> dict[str, dict[str, float | None]]:
    """The rates of a reading by link metric and direction, in bytes per second."""
    transmit, receive = names.IoDirection.TRANSMIT, names.IoDirection.RECEIVE
    return {
        names.GPU_PCIE_IO.name: {transmit: pcie_tx, receive: pcie_rx},
        names.GPU_NVLINK_IO.name: {transmit: nvlink_tx, receive: nvlink_rx},
    }


def valid_rate(bytes_per_s: float | None) -> float | None:
    """A link rate, or None where it cannot be one."""
    if bytes_per_s is None or isinstance(bytes_per_s, bool) or not math.isfinite(bytes_per_s):
        return None
    return float(bytes_per_s) if bounds.link_rate_plausible(bytes_per_s) else None


def scaled(counters: Mapping[str, IoCounter], share: float) -> dict[str, IoCounter]:
    """A partition's share of the board's counters: a cumulative sum times a constant is the share's own sum,
    with the board's start."""
    return {
        direction: IoCounter(counter.total_bytes * share, counter.start_ns) for direction, counter in counters.items()
    }


@attrs.define
class IoIntegrator:
    """Per GPU (its stream key), link and direction: bytes since the counter's start."""

    _totals: dict[tuple[str, str, str], IoCounter] = attrs.field(factory=dict)

    def add(self, key: str, rates: Rates, start_ns: int, end_ns: int) -> LinkFields:
        """Adds rate x (end - start) to each counter of ``key`` with a rate; returns the GpuReading fields
        (``nvlink_io``, ``pcie_io``) of the counters that have a point for this interval, by direction."""
        fields = LinkFields()
        if end_ns <= start_ns:
            return fields  # no interval: nothing measured
        nvlink = self._integrate(key, names.GPU_NVLINK_IO.name, rates, start_ns, end_ns)
        if nvlink:
            fields["nvlink_io"] = nvlink
        pcie = self._integrate(key, names.GPU_PCIE_IO.name, rates, start_ns, end_ns)
        if pcie:
            fields["pcie_io"] = pcie
        return fields

    def _integrate(self, key: str, metric: str, rates: Rates, start_ns: int, end_ns: int) -> dict[str, IoCounter]:
        by_direction = rates.get(metric, {})
        counters: dict[str, IoCounter] = {}
        for direction in names.IoDirection.ALL:
            rate = valid_rate(by_direction.get(direction))
            if rate is None:
                continue  # the counter keeps its value; this interval has no point
            slot = (key, metric, direction)
            before = self._totals.get(slot)
            counters[direction] = self._totals[slot] = IoCounter(
                (before.total_bytes if before is not None else 0.0) + rate * (end_ns - start_ns) / 1e9,
                before.start_ns if before is not None else start_ns,
            )
        return counters

    def forget(self, keep: Iterable[str]) -> None:
        """Drops the counters of GPUs gone from the source, so state stays bounded (one that returns starts anew)."""
        kept = set(keep)
        for slot in [slot for slot in self._totals if slot[0] not in kept]:
            del self._totals[slot]
