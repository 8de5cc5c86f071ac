"""Why points were refused: counted by reason code (the self-metric's label) and told in words (partial_success).

Every refusal has a code from ``names.RejectReason`` (a short fixed set, so the counters can start at 0 and an
alert can name one) and a message naming the metric, the same whichever way the decoder read the point (through
a layout's template or point by point), so that a sender gets the same answer either way.
"""

from __future__ import annotations

from typing import Final

from otel_ofu import names

R = names.RejectReason


class MalformedRequest(ValueError):
    """The bytes are not an ExportMetricsServiceRequest: the whole request is refused (INVALID_ARGUMENT, 400), and
    nothing of it was taken."""


# The words for a code, after the metric's name.
_WORDS: Final = {
    R.OUT_OF_RANGE: "not finite or outside its range",
    R.IMPLAUSIBLE: "beyond what a GPU can report (power, energy rate, clock, FLOP/s; an interval over --stale-after)",
    R.WRONG_TYPE: "not a gauge or sum",
    R.NO_IDENTITY: "without hw.id",
    R.BAD_TIME: "without a timestamp or stamped in the future",
    R.LATE: "late (its window already closed)",
    R.MAX_STREAMS: "over --max-streams (a new GPU stream)",
    R.MAX_JOBS: "over --max-jobs (a new job)",
    R.MAX_STATE: "over --max-state-bytes (the collector's state is full)",
    R.UNREADABLE: "unreadable",
}


def message(metric: str, code: str) -> str:
    """The words for refusing a point of ``metric`` for ``code``."""
    return f"{metric} {_WORDS.get(code, code)}"


class Rejections:
    """Refused points of one request, by message (partial_success) and by code (the self-metric)."""

    __slots__ = ("by_code", "by_message", "total")

    def __init__(self) -> None:
        self.total = 0
        self.by_message: dict[str, int] = {}
        self.by_code: dict[str, int] = {}

    def add(self, code: str, text: str, count: int = 1) -> None:
        self.total += count
        self.by_message[text] = self.by_message.get(text, 0) + count
        self.by_code[code] = self.by_code.get(code, 0) + count

    def add_each(self, code: str, counted: tuple[tuple[str, int], ...]) -> None:
        """``add`` for each (words, count) of ``counted``, all for ``code``."""
        by_message = self.by_message
        total = 0
        for text, count in counted:
            by_message[text] = by_message.get(text, 0) + count
            total += count
        self.total += total
        self.by_code[code] = self.by_code.get(code, 0) + total

    def refuse(self, metric: str, code: str, count: int = 1) -> None:
        """``add`` with the standard words for the code."""
        self.add(code, message(metric, code), count)

    def message(self) -> str:
        if not self.total:
            return ""
        parts = "; ".join(f"{count} {text}" for text, count in sorted(self.by_message.items()))
        return f"rejected {self.total} data point(s): {parts}"
