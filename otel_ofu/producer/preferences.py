"""What the standard variables ask of the producer's metrics before they are exported: each instrument kind's
temporality (``OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE``) and the histogram aggregation
(``OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION``), read as the SDK's OTLP exporters read them.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

from opentelemetry.sdk.environment_variables import (
    OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION,
    OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE,
)
from opentelemetry.sdk.metrics import (
    Counter,
    Histogram,
    ObservableCounter,
    ObservableGauge,
    ObservableUpDownCounter,
    UpDownCounter,
)
from opentelemetry.sdk.metrics.export import AggregationTemporality
from opentelemetry.sdk.metrics.view import (
    Aggregation,
    ExplicitBucketHistogramAggregation,
    ExponentialBucketHistogramAggregation,
)

log = logging.getLogger(__name__)


def preferred_temporality(environ: Mapping[str, str] | None = None) -> dict[type, AggregationTemporality]:
    """What ``OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE`` asks of each instrument kind, as the
    OpenTelemetry exporters read it: ``cumulative`` (default), ``delta`` or ``lowmemory``; an unknown value is
    cumulative, said once."""
    env = os.environ if environ is None else environ
    raw = env.get(OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE, "").strip()
    preference = raw.lower() or "cumulative"
    cumulative, delta = AggregationTemporality.CUMULATIVE, AggregationTemporality.DELTA
    chosen: dict[type, AggregationTemporality] = dict.fromkeys((Counter, UpDownCounter, Histogram), cumulative)
    chosen |= dict.fromkeys((ObservableCounter, ObservableUpDownCounter, ObservableGauge), cumulative)
    if preference == "delta":
        chosen |= {Counter: delta, Histogram: delta, ObservableCounter: delta}
    elif preference == "lowmemory":
        chosen |= {Counter: delta, Histogram: delta}
    elif preference != "cumulative":
        _warn_once(OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE, raw, "cumulative")
    return chosen


def preferred_aggregation(environ: Mapping[str, str] | None = None) -> dict[type, Aggregation]:
    """The histogram aggregation ``OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION`` asks for."""
    env = os.environ if environ is None else environ
    raw = env.get(OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION, "").strip()
    if raw.lower() == "base2_exponential_bucket_histogram":
        return {Histogram: ExponentialBucketHistogramAggregation()}
    if raw and raw.lower() != "explicit_bucket_histogram":
        _warn_once(OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION, raw, "explicit_bucket_histogram")
    return {Histogram: ExplicitBucketHistogramAggregation()}


_WARNED: set[tuple[str, str]] = set()


def _warn_once(variable: str, value: str, instead: str) -> None:
    """A bad variable is said once per process, however many exporters (and self-metrics) read it."""
    if (variable, value) not in _WARNED:
        _WARNED.add((variable, value))
        log.warning("unknown %s %r: using %s", variable, value, instead)
