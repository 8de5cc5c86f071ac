"""The window export: each batch of closed windows encoded as one OTLP request and queued for the downstream."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs

from otel_ofu_collector.otlp.encode import encode_request, reports_to_metrics_data
from otel_ofu_collector.outputs.delivery import Delivery
from otel_ofu_collector.results import WindowReport


@attrs.frozen
class OtlpWindowExport:
    """A window consumer: ``include_partials`` (shard mode) adds the partial state the merge tier reads."""

    delivery: Delivery
    resource_attributes: Mapping[str, str | int]
    include_partials: bool = False
    started_ns: int | None = None  # when this collector started: no window's points begin before it

    def start(self) -> None:
        # The delivery is the service's, not this output's: the window export, the pass-through and the
        # self-metrics share one transport and one shutdown deadline, so the service starts and stops them
        # together (``CollectorService._deliveries``).
        return None

    def consume_windows(self, windows: Sequence[WindowReport]) -> None:
        metrics_data = reports_to_metrics_data(
            windows,
            resource_attributes=self.resource_attributes,
            include_partials=self.include_partials,
            started_ns=self.started_ns,
        )
        self.delivery.submit(encode_request(metrics_data))

    def shutdown(self) -> None:
        return None  # the service stops the delivery (see ``start``), after the last windows are queued
