"""A job's ``job.checkpoint.time`` readings as deltas: the seconds its framework spent saving or loading checkpoints.

The training side reports the seconds it spent on each operation (``names.CheckpointOperation``) as a cumulative sum
since its reporter started (the series' start time). Each reading's delta since the series' previous one is the
checkpoint time of the interval between them, which the windows split over that interval in proportion. A series'
first reading counts whole only where the series began in a window still open (a reporter that started here and now);
else (a collector restarted under a running job) it only sets the baseline. A reading sent again adds nothing; one
that went back without a new series, or claims more seconds than passed, is refused as implausible and never becomes
the baseline. A job keeps its last reading of at most ``MAX_SERIES`` series (a restarted reporter starts a new one;
the oldest is let go).
"""

from __future__ import annotations

from otel_ofu import names

MAX_SERIES = 8
# Seconds of checkpoint time per second of wall time, at most: a reporter times one operation at a time, and a
# timer's rounding is allowed a little slack.
_MAX_RATE = 1.01
_SLACK_S = 1.0
_FIRST_MAX_S = 86400.0

Readings = dict[tuple[str, int], tuple[int, float]]


def delta(
    readings: Readings, operation: str, series_start_ns: int, time_ns: int, value: float, first_counts: bool
) -> tuple[float, int] | str:
    """(seconds to book, the time they began to accrue from) for one reading, the reading kept as the series'
    baseline; or the ``names.RejectReason`` code it is refused with. ``first_counts``: a series' first reading counts
    whole (its series began in an open window)."""
    key = (operation, series_start_ns)
    previous = readings.get(key)
    if previous is None:
        since = series_start_ns if first_counts and 0 < series_start_ns < time_ns else time_ns
        seconds = value if since < time_ns else 0.0
    else:
        last_ns, last_value = previous
        if time_ns <= last_ns:
            return 0.0, time_ns  # sent again, or an older reading: nothing new
        if value < last_value:
            return names.RejectReason.IMPLAUSIBLE
        since, seconds = last_ns, value - last_value
    # A series' first reading may hold a load timed before its reporter started (a job loads, then reports): it is
    # bound by a day only. A later delta cannot exceed the time between its readings.
    limit = _FIRST_MAX_S if previous is None else (time_ns - since) / 1e9 * _MAX_RATE + _SLACK_S
    if seconds > limit:
        return names.RejectReason.IMPLAUSIBLE
    if previous is None and len(readings) >= MAX_SERIES:
        del readings[min(readings, key=lambda found: readings[found][0])]
    readings[key] = (time_ns, value)
    return seconds, since
