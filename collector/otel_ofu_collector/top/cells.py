"""The model's numbers as the short strings and bars ``otel-ofu top`` puts in its cells. Pure.

Every missing value is "-". Bars tell causes apart by their glyph as well as by colour, so they read the
same with colours off (``NO_COLOR``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Final

from otel_ofu import names

MISSING: Final = "-"
SPARKS: Final = "▁▂▃▄▅▆▇█"
# A series drawn against its own top shows its trend; one that never reaches this is drawn against this, so an
# idle job's 0.001% and 0.002% are both the lowest block, not a swing from bottom to top.
SPARK_FLOOR: Final = 0.10
# Each loss cause's glyph and colour: the vocabulary's causes first, then any other a window carries, in turn.
_KNOWN_GLYPHS: Final = {
    names.OfuLossCause.IDLE: ("░", "grey58"),
    names.OfuLossCause.CLOCK: ("▒", "yellow"),
    names.OfuLossCause.TENSOR: ("▓", "magenta"),
}
_MORE_GLYPHS: Final = (("▚", "cyan"), ("▞", "red"), ("▙", "blue"), ("▟", "green"), ("▜", "bright_magenta"))


def percent(value: float | None) -> str:
    """A fraction as a percentage with one decimal: 0.4123 -> "41.2%"."""
    return MISSING if value is None or not math.isfinite(value) else f"{value:.1%}"


# A sum of MIG shares is whole up to rounding (seven 1/7 slices add to 0.9999999999999998): whole within this.
_WHOLE: Final = 1e-6


def gpus(count: float) -> str:
    """A count of GPU equivalents: whole (within rounding) as "8", a MIG slice's share as "0.14"."""
    nearest = round(count)
    return str(nearest) if abs(count - nearest) < _WHOLE else f"{count:.2f}"


def gpu_hours(seconds: float | None) -> str:
    """GPU-seconds as GPU-hours, three significant digits at most: 18720 -> "5.20"."""
    if seconds is None:
        return MISSING
    hours = seconds / 3600
    return f"{hours:.2f}" if hours < 100 else f"{hours:.0f}"


def money(value: float | None) -> str:
    """An amount with two decimals (thousands grouped): 1234.5 -> "1,234.50"."""
    return MISSING if value is None else f"{value:,.2f}"


def mhz(hz: float | None) -> str:
    return MISSING if hz is None else f"{hz / 1e6:.0f}"


def watts(value: float | None) -> str:
    return MISSING if value is None else f"{value:.0f} W"


def sparkline(values: Sequence[float | None], width: int) -> str:
    """The last ``width`` values as blocks from 0 to the largest of them (at least ``SPARK_FLOOR``), right
    aligned; a missing one is a space. Level = min(7, floor(value / top x 8)): a job at 40% and one at 20% both
    show their trend."""
    shown = list(values)[-width:] if width > 0 else []
    top = max((value for value in shown if value is not None), default=0.0)
    top = max(top, SPARK_FLOOR)
    blocks = []
    for value in shown:
        if value is None:
            blocks.append(" ")
        else:
            blocks.append(SPARKS[max(0, min(len(SPARKS) - 1, math.floor(value / top * len(SPARKS))))])
    return "".join(blocks).rjust(width)


def cause_style(cause: str, causes: Sequence[str]) -> tuple[str, str]:
    """A cause's glyph and colour: fixed for the vocabulary's causes, in turn for the others."""
    if cause in _KNOWN_GLYPHS:
        return _KNOWN_GLYPHS[cause]
    others = [other for other in causes if other not in _KNOWN_GLYPHS]
    index = others.index(cause) if cause in others else len(others)
    return _MORE_GLYPHS[index % len(_MORE_GLYPHS)]


def bar_cells(shares: Mapping[str, float], causes: Sequence[str], width: int) -> list[tuple[str, int]]:
    """How many of ``width`` cells each cause takes: its share of the GPU time, by largest remainder (the
    cells add up to round(sum of shares x width)); causes in ``causes`` order, those with no cell left out."""
    wanted = [(cause, max(0.0, shares.get(cause, 0.0)) * width) for cause in causes]
    total = min(width, round(sum(exact for _, exact in wanted)))
    cells = {cause: math.floor(exact) for cause, exact in wanted}
    left = total - sum(cells.values())
    by_remainder = sorted(range(len(wanted)), key=lambda i: -(wanted[i][1] - math.floor(wanted[i][1])))
    for i in by_remainder[: max(0, left)]:
        cells[wanted[i][0]] += 1
    return [(cause, cells[cause]) for cause in causes if cells[cause] > 0]
