"""``job.mfu`` points with their own timestamps, for MFU that was measured over a known interval; and the training
side's progress with its own (``job.step``, ``job.checkpoint.time``), for a replayed log or a simulated framework.

The MfuReporter stamps points with the SDK's clock at collection time, which is right for live training.
A replayed log, a simulated framework or a backfill knows when each MFU was measured instead; this builds
the same metric as SDK ``MetricsData`` with those times, ready for any SDK metric exporter.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Gauge,
    Metric,
    MetricsData,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from otel_ofu import __version__, names
from otel_ofu.mfu.values import check_mfu

_SCOPE = InstrumentationScope(names.INSTRUMENTATION_SCOPE, __version__, names.SCHEMA_URL)


@attrs.frozen
class TimedMfu:
    """One job's MFU over ``[start_ns, end_ns]``; ``attributes`` adds job.name, gpu.precision, ..."""

    job_id: str
    value: float = attrs.field(converter=check_mfu)
    start_ns: int
    end_ns: int
    attributes: Mapping[str, str] = attrs.field(factory=dict)


def timed_mfu_metrics_data(points: Sequence[TimedMfu], *, service_name: str = names.MFU_SERVICE_NAME) -> MetricsData:
    """One resource (the reporting service), one ``job.mfu`` gauge, one point per job and interval."""
    data_points = [
        NumberDataPoint(
            attributes={**point.attributes, names.JOB_ID: point.job_id},
            start_time_unix_nano=point.start_ns,
            time_unix_nano=point.end_ns,
            value=point.value,
        )
        for point in points
    ]
    metric = Metric(
        name=names.JOB_MFU.name,
        description=names.JOB_MFU.description,
        unit=names.JOB_MFU.unit,
        data=Gauge(data_points=data_points),
    )
    resource = Resource({names.SERVICE_NAME: service_name}, names.SCHEMA_URL)
    return MetricsData(
        resource_metrics=[
            ResourceMetrics(resource=resource, scope_metrics=[ScopeMetrics(_SCOPE, [metric], "")], schema_url="")
        ]
    )


@attrs.frozen
class TimedStep:
    """The last step ``job_id`` completed, as reported at ``time_ns``."""

    job_id: str
    step: int
    time_ns: int


@attrs.frozen
class TimedCheckpoints:
    """The seconds ``job_id``'s reporter process (started at ``series_start_ns``) spent on each checkpoint operation by
    ``time_ns``: its cumulative ``job.checkpoint.time`` series."""

    job_id: str
    series_start_ns: int
    time_ns: int
    seconds: Mapping[str, float]


def timed_progress_metrics_data(
    steps: Sequence[TimedStep],
    checkpoints: Sequence[TimedCheckpoints] = (),
    *,
    service_name: str = names.MFU_SERVICE_NAME,
) -> MetricsData:
    """One resource (the reporting service): a ``job.step`` gauge and a cumulative ``job.checkpoint.time`` sum."""
    metrics: list[Metric] = []
    if steps:
        points = [
            NumberDataPoint(
                attributes={names.JOB_ID: step.job_id},
                start_time_unix_nano=step.time_ns,
                time_unix_nano=step.time_ns,
                value=step.step,
            )
            for step in steps
        ]
        metrics.append(
            Metric(names.JOB_STEP.name, names.JOB_STEP.description, names.JOB_STEP.unit, Gauge(data_points=points))
        )
    sums = [
        NumberDataPoint(
            attributes={names.JOB_ID: found.job_id, names.CHECKPOINT_OPERATION: operation},
            start_time_unix_nano=found.series_start_ns,
            time_unix_nano=found.time_ns,
            value=seconds,
        )
        for found in checkpoints
        for operation, seconds in sorted(found.seconds.items())
    ]
    if sums:
        spec = names.JOB_CHECKPOINT_TIME
        data = Sum(data_points=sums, aggregation_temporality=AggregationTemporality.CUMULATIVE, is_monotonic=True)
        metrics.append(Metric(spec.name, spec.description, spec.unit, data))
    resource = Resource({names.SERVICE_NAME: service_name}, names.SCHEMA_URL)
    return MetricsData(
        resource_metrics=[
            ResourceMetrics(resource=resource, scope_metrics=[ScopeMetrics(_SCOPE, metrics, "")], schema_url="")
        ]
    )
