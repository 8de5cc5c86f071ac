"""The one interface every output implements: a consumer of closed windows.

In the spirit of the OpenTelemetry Collector's ``consumer.Metrics``: the service hands each batch of
windows it closed (oldest first) to every consumer in turn, and one consumer's failure is logged without
costing the others. The OTLP export (``outputs.otlp_export``), the Prometheus endpoint, the window-record
file (``outputs.recorder``) and the live feed (``outputs.feed_server``) are consumers; a new output is one
more module implementing ``consume_windows``, added to ``CollectorService.consumers``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import attrs

from otel_ofu_collector.results import WindowReport


class WindowConsumer(Protocol):
    """Takes closed windows. Called from the service's flush, one batch at a time, never concurrently."""

    def consume_windows(self, windows: Sequence[WindowReport]) -> None: ...


@attrs.frozen
class CallbackConsumer:
    """A plain function as a window consumer (``CallbackConsumer(seen.extend)``, say)."""

    callback: Callable[[Sequence[WindowReport]], object]

    def consume_windows(self, windows: Sequence[WindowReport]) -> None:
        self.callback(windows)
