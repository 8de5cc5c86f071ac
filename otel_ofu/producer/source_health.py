"""Saying, on stderr, that the source is failing: once, again when the failure changes, and when it is over.

A producer whose every read fails still runs (the next read may work), so without this it would be
silent: errors are only counted in the self-metrics. The failure is logged when it starts; a different
failure is logged at most once per ``every_s`` of the producer's clock (the latest one, when that time
has passed), so a flapping endpoint cannot flood the log; recovery is logged once.
"""

from __future__ import annotations

import logging

import attrs

from otel_ofu.gpu_samples import ComputedSnapshot
from otel_ofu.model import Clock

log = logging.getLogger(__name__)

DEFAULT_EVERY_S = 60.0


def problem_of(computed: ComputedSnapshot) -> str | None:
    """What is wrong with the source as a whole, in one line, or None when it reads.

    Source-level errors (no GPU named) are the source failing; a read in which no GPU gave OFU at all is
    one too, said by its first error.
    """
    whole = [error for error in computed.errors if error.gpu is None and error.gpu_key is None]
    if whole:
        return "; ".join(dict.fromkeys(f"{error.message} ({error.reason})" for error in whole))
    if not computed.samples and computed.errors:
        first = computed.errors[0]
        count = len(computed.errors)
        plural = "s" if count != 1 else ""
        return f"no GPU gave OFU ({count} error{plural}), the first: {first.message} ({first.reason})"
    return None


@attrs.define
class SourceHealth:
    """Tracks the source's failure across reads and logs its changes (see the module docstring)."""

    source_name: str
    clock: Clock
    every_s: float = DEFAULT_EVERY_S
    _said: str | None = attrs.field(init=False, default=None)
    _said_ns: int | None = attrs.field(init=False, default=None)

    def observe(self, computed: ComputedSnapshot) -> None:
        problem = problem_of(computed)
        if problem == self._said:
            return
        now = self.clock()
        if problem is None:
            log.warning("source %s is reading again", self.source_name)
            self._said, self._said_ns = None, now
            return
        if self._said is not None and self._said_ns is not None and now - self._said_ns < self.every_s * 1e9:
            return  # a change within the quiet period: the latest one is said once it is over
        log.warning("source %s is failing: %s", self.source_name, problem)
        self._said, self._said_ns = problem, now
