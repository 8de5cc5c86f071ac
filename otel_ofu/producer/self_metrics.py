"""The producer's own health: skipped readings, failed exports, points the receiver refused and how long
exports take.

Counters follow ``OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE`` the way the SDK's OTLP exporters
treat a synchronous Counter: ``cumulative`` (the default) reports running totals since start,
``delta`` and ``lowmemory`` report what was added since the previous report.
"""

from __future__ import annotations

import threading
from collections import Counter

import attrs
from opentelemetry.sdk.environment_variables import OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE
from opentelemetry.sdk.metrics import Counter as CounterInstrument
from opentelemetry.sdk.metrics.export import AggregationTemporality, Gauge, Metric, NumberDataPoint, Sum

from otel_ofu import names
from otel_ofu.producer.preferences import preferred_temporality


def counter_temporality(preference: str | None = None) -> AggregationTemporality:
    """The temporality the OTLP exporters give a Counter under the standard preference variable."""
    environ = {OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE: preference} if preference is not None else None
    return preferred_temporality(environ)[CounterInstrument]


@attrs.define
class SelfMetrics:
    """Thread-safe: the sampling loop counts source errors, the export worker counts failures and the exporter
    the points the receiver refused."""

    start_ns: int
    temporality: AggregationTemporality = attrs.field(factory=counter_temporality)
    _lock: threading.Lock = attrs.field(factory=threading.Lock, init=False)
    _source_errors: Counter[str] = attrs.field(factory=Counter, init=False)
    _export_failures: Counter[str] = attrs.field(factory=Counter, init=False)
    _reported_errors: Counter[str] = attrs.field(factory=Counter, init=False)
    _reported_failures: Counter[str] = attrs.field(factory=Counter, init=False)
    _rejected_points: int = attrs.field(default=0, init=False)
    _reported_rejected: int = attrs.field(default=0, init=False)
    _last_report_ns: int = attrs.field(default=0, init=False)
    _last_duration_s: float | None = attrs.field(default=None, init=False)

    def __attrs_post_init__(self) -> None:
        self._last_report_ns = self.start_ns

    def count_source_error(self, reason: str, count: int = 1) -> None:
        with self._lock:
            self._source_errors[reason] += count

    def count_export_failure(self, reason: str, count: int = 1) -> None:
        with self._lock:
            self._export_failures[reason] += count

    def count_rejected_points(self, count: int) -> None:
        """Points the receiver refused of an export it took (its ``partial_success``)."""
        with self._lock:
            self._rejected_points += count

    @property
    def rejected_points(self) -> int:
        """The running total, whatever the temporality."""
        with self._lock:
            return self._rejected_points

    def record_export_duration(self, seconds: float) -> None:
        with self._lock:
            self._last_duration_s = seconds

    def totals(self) -> tuple[dict[str, int], dict[str, int]]:
        """Running totals (source errors, export failures) by reason, whatever the temporality."""
        with self._lock:
            return dict(self._source_errors), dict(self._export_failures)

    @property
    def last_export_duration_s(self) -> float | None:
        with self._lock:
            return self._last_duration_s

    def metrics(self, now_ns: int) -> list[Metric]:
        """The self-metrics as of ``now_ns``; a delta report resets the window it covers."""
        with self._lock:
            errors, failures = self._source_errors.copy(), self._export_failures.copy()
            rejected, duration = self._rejected_points, self._last_duration_s
            if self.temporality is AggregationTemporality.DELTA:
                start = self._last_report_ns
                errors_out = errors - self._reported_errors
                failures_out = failures - self._reported_failures
                rejected_out = rejected - self._reported_rejected
                self._reported_errors, self._reported_failures = errors, failures
                self._reported_rejected = rejected
            else:
                start, errors_out, failures_out, rejected_out = self.start_ns, errors, failures, rejected
            self._last_report_ns = now_ns
        metrics = [
            self._sum(spec, counts, start, now_ns)
            for spec, counts in ((names.SOURCE_ERRORS, errors_out), (names.EXPORT_FAILURES, failures_out))
            if counts
        ]
        if rejected_out:
            point = NumberDataPoint(
                attributes={}, start_time_unix_nano=start, time_unix_nano=now_ns, value=rejected_out
            )
            data = Sum(data_points=[point], aggregation_temporality=self.temporality, is_monotonic=True)
            spec = names.EXPORT_REJECTED
            metrics.append(Metric(spec.name, spec.description, spec.unit, data))
        if duration is not None:
            point = NumberDataPoint(attributes={}, start_time_unix_nano=0, time_unix_nano=now_ns, value=duration)
            spec = names.EXPORT_DURATION
            metrics.append(Metric(spec.name, spec.description, spec.unit, Gauge(data_points=[point])))
        return metrics

    def _sum(self, spec: names.MetricSpec, counts: Counter[str], start_ns: int, now_ns: int) -> Metric:
        points = [
            NumberDataPoint(
                attributes={names.ERROR_REASON: reason},
                start_time_unix_nano=start_ns,
                time_unix_nano=now_ns,
                value=count,
            )
            for reason, count in sorted(counts.items())
        ]
        data = Sum(data_points=points, aggregation_temporality=self.temporality, is_monotonic=True)
        return Metric(spec.name, spec.description, spec.unit, data)
