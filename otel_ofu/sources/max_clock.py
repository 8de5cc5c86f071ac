"""``--max-sm-clock``: the max SM clock of GPU models whose source does not report one.

OFU needs f_max. NVML and DCGM report it; dcgm-exporter only when field 113 is configured, and
``dcgmi dmon`` captures only when it was sampled. For a model in the catalog the catalog's board clock
fills the gap; for any other model the reading had no OFU at all. This table (``"NVIDIA X=1500"``,
megahertz, by the device's name string as the source prints it, case-insensitive) fills it for the
models a site knows, and never overrides a max clock the source did report.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from otel_ofu.model import GpuReading, Snapshot, Source

MHZ = 1e6


@attrs.frozen
class MaxClockTable:
    """Model name (lower-cased) -> max SM clock in Hz."""

    clocks_hz: Mapping[str, float] = attrs.field(factory=dict)

    @classmethod
    def parse(cls, text: str) -> MaxClockTable:
        """``"NVIDIA A800 80GB PCIe=1410,Tesla V100S-PCIE-32GB=1597"`` (MHz); a bad entry is a ValueError."""
        clocks: dict[str, float] = {}
        for entry in (item.strip() for item in text.split(",")):
            if not entry:
                continue
            model, sep, value = entry.rpartition("=")
            if not sep or not model.strip():
                raise ValueError(f"max SM clock entry {entry!r} is not MODEL=MHZ")
            try:
                mhz = float(value)
            except ValueError:
                raise ValueError(f"max SM clock of {model.strip()!r}: {value!r} is not a number of MHz") from None
            if not 100 <= mhz <= 10_000:  # any GPU's SM clock lies well within; catches Hz or GHz given
                raise ValueError(f"max SM clock of {model.strip()!r}: {mhz:g} MHz is not plausible (100-10000 MHz)")
            clocks[model.strip().lower()] = mhz * MHZ
        return cls(clocks)

    def max_clock_hz(self, model: str) -> float | None:
        return self.clocks_hz.get(model.strip().lower())

    def fill(self, reading: GpuReading) -> GpuReading:
        if reading.max_sm_clock_hz is not None:
            return reading
        clock = self.max_clock_hz(reading.gpu.model)
        return reading if clock is None else attrs.evolve(reading, max_sm_clock_hz=clock)


class MaxClockSource:
    """A source whose readings get the table's max clock where they have none; otherwise the source itself."""

    def __init__(self, source: Source, table: MaxClockTable) -> None:
        self._source = source
        self._table = table
        self.name = source.name

    def read(self) -> Snapshot:
        snapshot = self._source.read()
        return Snapshot(tuple(self._table.fill(r) for r in snapshot.readings), snapshot.errors)

    def close(self) -> None:
        self._source.close()

    def __getattr__(self, attribute: str) -> Any:
        # What callers look for on some sources (compute_pids, exhausted) stays reachable.
        return getattr(self._source, attribute)


def max_clock_option(text: str) -> MaxClockTable:
    """argparse type of ``--max-sm-clock``: a bad table is a usage error that says what is wrong."""
    import argparse

    try:
        return MaxClockTable.parse(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def with_max_clocks(source: Source, table: MaxClockTable | None) -> Source:
    return MaxClockSource(source, table) if table is not None and table.clocks_hz else source
