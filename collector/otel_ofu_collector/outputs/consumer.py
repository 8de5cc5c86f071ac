"""The one interface every output implements: a consumer of closed windows, with a lifecycle.

In the spirit of the OpenTelemetry Collector's ``consumer.Metrics`` and ``component.Component``: the service
starts every consumer (``start``) before its receivers listen, hands each batch of windows it closed (oldest
first) to every consumer in turn, and at shutdown, after the last windows, shuts them down (``shutdown``) in
the reverse order of their start. One consumer's failure is logged without costing the others. The OTLP
export (``outputs.otlp_export``), the Prometheus endpoint, the window-record file (``outputs.recorder``) and
the live feed (``outputs.feed_server``) are consumers; a new output is one more module implementing the three
methods, added to ``CollectorService.consumers``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import attrs

from otel_ofu_collector.results import WindowReport


class WindowConsumer(Protocol):
    """Takes closed windows between its ``start`` and its ``shutdown`` (each called once, in that order).

    ``consume_windows`` is called from the service's flush, one batch at a time, never concurrently.
    """

    def start(self) -> None:
        """Take what it needs (a port, a file); OSError or ValueError, in one line, when it cannot."""
        ...

    def consume_windows(self, windows: Sequence[WindowReport]) -> None: ...

    def shutdown(self) -> None:
        """Let go of what ``start`` took; the service calls it after the last ``consume_windows``."""
        ...


@attrs.frozen
class CallbackConsumer:
    """A plain function as a window consumer (``CallbackConsumer(seen.extend)``, say): it holds nothing,
    so its start and shutdown have nothing to do."""

    callback: Callable[[Sequence[WindowReport]], object]

    def start(self) -> None:
        return None

    def consume_windows(self, windows: Sequence[WindowReport]) -> None:
        self.callback(windows)

    def shutdown(self) -> None:
        return None
