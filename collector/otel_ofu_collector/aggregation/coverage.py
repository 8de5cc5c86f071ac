"""The time a GPU's points cover in one window, each nanosecond once: pure arithmetic on spans.

A GPU reports intervals (start, end]. Its time in a window is the union of the parts of its intervals inside the
window, so that a request delivered twice (an OTLP retry), a reading sent again after a restart, or intervals that
overlap by a few milliseconds (a producer's timer jitter) add nothing: the GPU is billed for each second it reported,
once, and never more than the window.

Spans are kept flat and sorted, ``[lo0, hi0, lo1, hi1, ...]``, disjoint and not touching: a producer's intervals
follow each other, so a window's spans are nearly always one pair whose end moves on (``cover``'s first branch).
"""

from __future__ import annotations

import bisect

Spans = list[int]


def cover(spans: Spans, lo: int, hi: int) -> None:
    """Add (lo, hi] to ``spans`` in place, merging every span it overlaps or touches."""
    if hi <= lo:
        return
    if not spans or lo > spans[-1]:
        spans += (lo, hi)
        return
    if lo >= spans[-2]:  # meets or overlaps the last span: the common case of intervals that follow each other
        if hi > spans[-1]:
            spans[-1] = hi
        return
    # Anywhere else: the pairs from the first ending at or after lo to the last starting at or before hi merge.
    first = bisect.bisect_left(spans, lo)
    first -= first % 2  # the start of the pair holding the first value >= lo
    last = bisect.bisect_right(spans, hi)
    last += last % 2  # past the end of the pair holding the last value <= hi
    if first >= last:  # between two spans, touching neither
        spans[first:first] = (lo, hi)
        return
    spans[first:last] = (min(lo, spans[first]), max(hi, spans[last - 1]))


def covered(spans: Spans) -> int:
    """The nanoseconds the spans cover."""
    return sum(spans[1::2]) - sum(spans[0::2])


def covered_union(first: Spans, second: Spans) -> int:
    """The nanoseconds either list of spans covers."""
    if not second:
        return covered(first)
    if not first:
        return covered(second)
    merged = list(first)
    for at in range(0, len(second), 2):
        cover(merged, second[at], second[at + 1])
    return covered(merged)
