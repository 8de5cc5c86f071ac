"""What a closed window holds: the value classes every stage of the collector passes along.

The windows (``aggregation``) and the merge tier make them; the outputs (OTLP, Prometheus, records, the
live feed) and the report read them. Plain frozen values with no behaviour beyond what they derive, so
this module sits below everything else in the collector and imports nothing of it but the mergeable
statistics the values are made of.

Also here: a shard's mergeable part of a window (``PartialWindow``), what the merge tier takes in.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Final

import attrs

from otel_ofu import names
from otel_ofu_collector.aggregation.comoments import CoMoments
from otel_ofu_collector.aggregation.exphist import ExpHistogram

STATUS_OK: Final = "ok"
STATUS_NO_MFU: Final = "no_mfu"
STATUS_NO_OFU: Final = "no_ofu"


def finite_or_none(value: float | None) -> float | None:
    """The value when it is a finite number; NaN and infinities are missing values, never numbers to show."""
    return value if value is not None and math.isfinite(value) else None


@attrs.frozen
class GroupReport:
    attributes: Mapping[str, str]
    gpus: int
    quantiles: Mapping[float, float]
    histogram: ExpHistogram
    ofu_sum: float
    ofu_min: float
    ofu_max: float


@attrs.frozen
class JobReport:
    job_id: str
    attributes: Mapping[str, str]  # job.name, hw.model, gpu.precision where known
    ofu: float | None
    mfu: float | None
    gap: float | None
    correlation: float | None
    # Each detector's verdict by its metric name (``detectors.DETECTORS``): 1 up, 0 down, None not assessable.
    flags: Mapping[str, int | None]
    status: str  # STATUS_OK | STATUS_NO_MFU | STATUS_NO_OFU
    gpus: int

    def flag(self, metric: names.MetricSpec) -> int | None:
        """The verdict of the flag exported as ``metric``; None when absent."""
        return self.flags.get(metric.name)

    @property
    def flops_miscount(self) -> int | None:
        return self.flag(names.JOB_FLOPS_MISCOUNT)

    @property
    def regression(self) -> int | None:
        return self.flag(names.JOB_OFU_REGRESSION)


@attrs.frozen
class FleetReport:
    correlation: float | None
    mae: float | None
    jobs: int  # jobs with an (OFU, MFU) pair in the horizon: those behind correlation and mae
    comoments: CoMoments
    abs_diff_sum: float


@attrs.frozen
class WindowReport:
    start_ns: int
    end_ns: int
    groups: tuple[GroupReport, ...]
    jobs: tuple[JobReport, ...]
    fleet: FleetReport


@attrs.frozen
class PartialGroup:
    attributes: Mapping[str, str]
    histogram: ExpHistogram
    gpus: int


@attrs.frozen
class PartialWindow:
    """One shard's mergeable state of one window. ``fleet_comoments`` None: this part carries no fleet state."""

    start_ns: int
    end_ns: int
    groups: tuple[PartialGroup, ...]
    fleet_comoments: CoMoments | None
    abs_diff_sum: float
    jobs_count: int
    shard_id: str


def partial_of(report: WindowReport, shard_id: str) -> PartialWindow:
    """The mergeable part of a shard's window report (what ``otlp.partials`` carries over OTLP)."""
    return PartialWindow(
        start_ns=report.start_ns,
        end_ns=report.end_ns,
        groups=tuple(PartialGroup(g.attributes, g.histogram, g.gpus) for g in report.groups),
        fleet_comoments=report.fleet.comoments,
        abs_diff_sum=report.fleet.abs_diff_sum,
        jobs_count=report.fleet.jobs,
        shard_id=shard_id,
    )


_COLLECTOR_METRICS: Final = {spec.name: spec for spec in names.COLLECTOR_METRICS}


@attrs.frozen
class GaugePoint:
    """One gauge value a closed window yields: what the OTLP encoder and the Prometheus endpoint both show."""

    spec: names.MetricSpec
    attributes: Mapping[str, str | float | int]
    value: float


def gauge_points(report: WindowReport) -> Iterator[GaugePoint]:
    """The window's gauge outputs (every collector metric but the ``fleet.ofu`` histogram), in report
    order; a value that is None is not a point."""
    for group in report.groups:
        attributes: dict[str, str | float | int] = dict(group.attributes)
        for q, value in group.quantiles.items():
            yield GaugePoint(names.FLEET_OFU_QUANTILE, {**attributes, names.QUANTILE: q}, value)
        yield GaugePoint(names.FLEET_GPUS, attributes, group.gpus)
    for job in report.jobs:
        job_attributes = {names.JOB_ID: job.job_id, **job.attributes}
        for spec, job_value in (
            (names.JOB_OFU, job.ofu),
            (names.JOB_OFU_MFU_GAP, job.gap),
            (names.JOB_OFU_MFU_CORRELATION, job.correlation),
        ):
            if job_value is not None:
                yield GaugePoint(spec, job_attributes, job_value)
        for name, verdict in job.flags.items():
            if verdict is not None:
                yield GaugePoint(_COLLECTOR_METRICS[name], job_attributes, verdict)
    fleet = report.fleet
    for spec, fleet_value in (
        (names.FLEET_OFU_MFU_CORRELATION, fleet.correlation),
        (names.FLEET_OFU_MFU_MAE, fleet.mae),
    ):
        if fleet_value is not None:
            yield GaugePoint(spec, {}, fleet_value)
