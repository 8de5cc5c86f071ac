"""What a vendor exporter's page held, in words: the one line a source says when the page has none of its metrics
(a wrong port, another exporter's page), so that an empty read is never mistaken for a node without GPUs."""

from __future__ import annotations

from collections.abc import Sequence

from otel_ofu.sources.prometheus_text import Sample


def page_summary(samples: Sequence[Sample], shown: int = 5) -> str:
    """How many series of how many metrics the page had, and the first few metric names."""
    metrics = list(dict.fromkeys(sample.name for sample in samples))
    if not metrics:
        return "the page had no series at all"
    more = f" and {len(metrics) - shown} more" if len(metrics) > shown else ""
    kinds = "metric" if len(metrics) == 1 else "metrics"
    return f"the page had {len(samples)} series of {len(metrics)} {kinds}: {', '.join(metrics[:shown])}{more}"
