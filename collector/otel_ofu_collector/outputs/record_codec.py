"""The window-record format: the collector's closed windows as JSON lines, written and read.

Format (version 1), one closed window per line, UTF-8, keys as below; optional numbers are ``null`` when
the collector had no value (never 0 or NaN). Readers skip and count lines they cannot use, and lines of a
newer version; a later version may add keys, which version-1 readers ignore. Each job carries one key per
flag (its detector's ``record_key``); a record without one (written before that flag existed) reads as
the flag absent. Where OFU is lost (added in version 1 without a version change, as optional keys): a job's
``"loss"`` (``gpu_time_s``, ``shares`` and ``lost_s`` by cause, ``energy_j``, ``flops_per_joule``, ``cost``,
``cost_lost``, ``emissions_kg``, ``currency``, and what the GPUs did besides tensor work: ``dram_active``,
``nvlink_bytes_per_s``, ``pcie_bytes_per_s``), the fleet's ``"loss"`` (``lost_s``, ``energy_j``,
``cost_lost``, ``currency``) and the window's ``"gpu_flags"`` (GPU-level flags: ``metric``, ``job_id``,
``attributes``, ``value``, ``ofu``, ``job_median_ofu``); a record without them reads as none known. Per GPU
(likewise optional): the window's ``"gpus"``, each GPU's means (``job_id``, ``attributes``, ``ofu``,
``tensor_active``, ``sm_clock_hz``, ``sm_clock_max_hz``, ``power_w``, ``throttle`` by reason); an entry that
cannot be used is skipped with a warning, never the window. Goodput (likewise optional): a job's ``"goodput"``
(``badput_s`` by goodput cause, ``goodput``, ``goodput_flops``, ``basis``) and ``"flag_changes"`` (flag -> true when it
rose in the window, false when it fell), the fleet's ``"goodput"`` (``badput_s``, ``goodput``, ``basis``), and a GPU
flag's ``raised``.

    {"otel_ofu_report": 1, "start_ns": 1700000000000000000, "end_ns": 1700000060000000000,
     "groups": [{"attributes": {"hw.model": "NVIDIA H100 80GB HBM3", "gpu.precision": "bf16"}, "gpus": 8,
                 "quantiles": {"0.05": 0.31, "0.25": 0.38, "0.5": 0.41, "0.75": 0.44, "0.95": 0.47, "0.99": 0.48},
                 "histogram": {"scale": 6, "zero_count": 0, "offset": -80, "counts": [1, 0, 2],
                               "sum": 3.3, "min": 0.31, "max": 0.48},
                 "ofu_sum": 3.3, "ofu_min": 0.31, "ofu_max": 0.48}],
     "jobs": [{"job_id": "1234", "attributes": {"job.name": "llama-70b"}, "ofu": 0.41, "mfu": 0.39,
               "gap": -0.02, "correlation": 0.93, "flops_miscount": 0, "regression": 0, "status": "ok",
               "gpus": 8}],
     "fleet": {"correlation": 0.87, "mae": 0.05, "jobs": 4, "abs_diff_sum": 0.2,
               "comoments": {"n": 4, "mean_x": 0.4, "mean_y": 0.5, "m2_x": 0.1, "m2_y": 0.2, "c_xy": 0.1}}}

``recorder.ReportRecorder`` appends them to a file and ``feed_server.ReportFeed`` serves the last ones over
HTTP; ``feed_client`` and ``load_records`` read them back (the ``report`` command).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import attrs

from otel_ofu import ports
from otel_ofu_collector.detectors import DETECTORS
from otel_ofu_collector.results import (
    FleetGoodput,
    FleetLoss,
    FleetReport,
    GpuFlagReport,
    GpuReport,
    GroupReport,
    JobGoodput,
    JobLoss,
    JobReport,
    WindowReport,
)
from otel_ofu_collector.stats.comoments import CoMoments
from otel_ofu_collector.stats.exphist import ExpHistogram

logger = logging.getLogger(__name__)

FORMAT_KEY: Final = "otel_ofu_report"
FORMAT_VERSION: Final = 1


class RecordFormatError(ValueError):
    """A line that is not a window record of a version this code reads."""


class NotWindowRecords(ValueError):
    """Text that is something else altogether (a Prometheus /metrics page), said in one line."""


# How a Prometheus text exposition begins: what a reader pointed at a --prometheus-port gets.
_PROMETHEUS_TEXT: Final = ("# HELP ", "# TYPE ")


# --- encoding -----------------------------------------------------------------------------------------


def finite_or_none(value: float | None) -> float | None:
    """The value when it is a finite number; NaN and infinities are missing values, never numbers to show."""
    return value if value is not None and math.isfinite(value) else None


def _histogram_to_json(histogram: ExpHistogram) -> dict[str, Any]:
    return {
        "scale": histogram.scale,
        "zero_count": histogram.zero_count,
        "offset": histogram.offset,
        "counts": list(histogram.counts),
        "sum": histogram.sum,
        "min": histogram.min,
        "max": histogram.max,
    }


def _group_to_json(group: GroupReport) -> dict[str, Any]:
    return {
        "attributes": dict(group.attributes),
        "gpus": group.gpus,
        "quantiles": {repr(float(q)): value for q, value in group.quantiles.items()},
        "histogram": _histogram_to_json(group.histogram),
        "ofu_sum": group.ofu_sum,
        "ofu_min": group.ofu_min,
        "ofu_max": group.ofu_max,
    }


def _job_to_json(job: JobReport) -> dict[str, Any]:
    return {
        "job_id": job.job_id,
        "attributes": dict(job.attributes),
        "ofu": finite_or_none(job.ofu),
        "mfu": finite_or_none(job.mfu),
        "gap": finite_or_none(job.gap),
        "correlation": finite_or_none(job.correlation),
        **{detector.record_key: job.flags.get(detector.metric.name) for detector in DETECTORS},
        "status": job.status,
        "gpus": job.gpus,
        **({"loss": attrs.asdict(job.loss)} if job.loss is not None else {}),
        **({"goodput": attrs.asdict(job.goodput)} if job.goodput is not None else {}),
        **({"flag_changes": dict(job.flag_changes)} if job.flag_changes else {}),
    }


def _fleet_to_json(fleet: FleetReport) -> dict[str, Any]:
    moments = fleet.comoments
    return {
        "correlation": finite_or_none(fleet.correlation),
        "mae": finite_or_none(fleet.mae),
        "jobs": fleet.jobs,
        "abs_diff_sum": fleet.abs_diff_sum,
        "comoments": {
            "n": moments.n,
            "mean_x": moments.mean_x,
            "mean_y": moments.mean_y,
            "m2_x": moments.m2_x,
            "m2_y": moments.m2_y,
            "c_xy": moments.c_xy,
        },
        "loss": attrs.asdict(fleet.loss),
        **({"goodput": attrs.asdict(fleet.goodput)} if fleet.goodput is not None else {}),
    }


def _gpu_to_json(gpu: GpuReport) -> dict[str, Any] | None:
    """One GPU's means; None (left out) when its OFU is not a finite number. Missing values are null."""
    if finite_or_none(gpu.ofu) is None:
        return None
    return {
        "job_id": gpu.job_id,
        "attributes": dict(gpu.attributes),
        "ofu": gpu.ofu,
        "tensor_active": finite_or_none(gpu.tensor_active),
        "sm_clock_hz": finite_or_none(gpu.sm_clock_hz),
        "sm_clock_max_hz": finite_or_none(gpu.sm_clock_max_hz),
        "power_w": finite_or_none(gpu.power_w),
        "throttle": {reason: share for reason, share in gpu.throttle.items() if finite_or_none(share) is not None},
    }


def report_to_json(report: WindowReport) -> dict[str, Any]:
    return {
        FORMAT_KEY: FORMAT_VERSION,
        "start_ns": report.start_ns,
        "end_ns": report.end_ns,
        "groups": [_group_to_json(group) for group in report.groups],
        "jobs": [_job_to_json(job) for job in report.jobs],
        "fleet": _fleet_to_json(report.fleet),
        **({"gpu_flags": [attrs.asdict(flag) for flag in report.gpu_flags]} if report.gpu_flags else {}),
        **({"gpus": [found for gpu in report.gpus if (found := _gpu_to_json(gpu)) is not None]} if report.gpus else {}),
        **({"closed_at_ns": report.closed_at_ns} if report.closed_at_ns is not None else {}),
    }


def report_to_line(report: WindowReport) -> str:
    """One JSON line (no newline); ValueError if a required number is not finite."""
    return json.dumps(report_to_json(report), separators=(",", ":"), allow_nan=False, ensure_ascii=False)


# --- decoding -----------------------------------------------------------------------------------------


def _get(data: Mapping[str, Any], key: str, kind: type | tuple[type, ...], what: str) -> Any:
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, kind):
        raise RecordFormatError(f"{what}.{key} is missing or not {getattr(kind, '__name__', 'a number')}")
    return value


def _number(data: Mapping[str, Any], key: str, what: str) -> float:
    value = float(_get(data, key, (int, float), what))
    if not math.isfinite(value):
        raise RecordFormatError(f"{what}.{key} is not finite")
    return value


def _optional_number(data: Mapping[str, Any], key: str, what: str) -> float | None:
    return None if data.get(key) is None else _number(data, key, what)


def _object(value: object, what: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise RecordFormatError(f"{what} is missing or not an object")
    return value


def _list(value: object, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise RecordFormatError(f"{what} is missing or not a list")
    return value


def _attributes(value: object, what: str) -> dict[str, str]:
    data = _object(value, what)
    if not all(isinstance(item, str) for item in data.values()):
        raise RecordFormatError(f"{what} must map names to strings")
    return dict(data)


def _histogram_from_json(value: object) -> ExpHistogram:
    data = _object(value, "histogram")
    counts = _list(data.get("counts"), "histogram.counts")
    if not all(isinstance(count, int) and not isinstance(count, bool) for count in counts):
        raise RecordFormatError("histogram.counts must be integers")
    return ExpHistogram(
        scale=_get(data, "scale", int, "histogram"),
        zero_count=_get(data, "zero_count", int, "histogram"),
        offset=_get(data, "offset", int, "histogram"),
        counts=tuple(counts),
        sum=_number(data, "sum", "histogram"),
        min=_optional_number(data, "min", "histogram"),
        max=_optional_number(data, "max", "histogram"),
    )


def _group_from_json(value: object) -> GroupReport:
    data = _object(value, "group")
    quantiles: dict[float, float] = {}
    for key, quantile_value in _object(data.get("quantiles"), "group.quantiles").items():
        try:
            quantile = float(key)
        except ValueError:
            raise RecordFormatError(f"group.quantiles key {key!r} is not a number") from None
        quantiles[quantile] = _number({"value": quantile_value}, "value", f"group.quantiles[{key}]")
    return GroupReport(
        attributes=_attributes(data.get("attributes"), "group.attributes"),
        gpus=float(_get(data, "gpus", (int, float), "group")),
        quantiles=quantiles,
        histogram=_histogram_from_json(data.get("histogram")),
        ofu_sum=_number(data, "ofu_sum", "group"),
        ofu_min=_number(data, "ofu_min", "group"),
        ofu_max=_number(data, "ofu_max", "group"),
    )


def _flag(data: Mapping[str, Any], key: str) -> float | None:
    """A flag's verdict (0/1, or a count such as idle GPU equivalents); absent (None) when the record has none:
    null, or written before the flag existed."""
    return None if data.get(key) is None else _get(data, key, (int, float), "job")


def _job_from_json(value: object) -> JobReport:
    data = _object(value, "job")
    return JobReport(
        job_id=_get(data, "job_id", str, "job"),
        attributes=_attributes(data.get("attributes", {}), "job.attributes"),
        ofu=_optional_number(data, "ofu", "job"),
        mfu=_optional_number(data, "mfu", "job"),
        gap=_optional_number(data, "gap", "job"),
        correlation=_optional_number(data, "correlation", "job"),
        flags={detector.metric.name: _flag(data, detector.record_key) for detector in DETECTORS},
        status=_get(data, "status", str, "job"),
        gpus=float(_get(data, "gpus", (int, float), "job")),
        loss=_job_loss_from_json(data["loss"]) if data.get("loss") is not None else None,
        goodput=_job_goodput_from_json(data["goodput"]) if data.get("goodput") is not None else None,
        flag_changes=_flag_changes(data.get("flag_changes", {})),
    )


def _flag_changes(value: object) -> dict[str, bool]:
    data = _object(value, "job.flag_changes")
    if not all(isinstance(rose, bool) for rose in data.values()):
        raise RecordFormatError("job.flag_changes must map flags to true (rose) or false (fell)")
    return dict(data)


def _job_goodput_from_json(value: object) -> JobGoodput:
    data = _object(value, "job.goodput")
    return JobGoodput(
        badput_s=_by_cause(data.get("badput_s"), "job.goodput.badput_s"),
        goodput=_number(data, "goodput", "job.goodput"),
        goodput_flops=_number(data, "goodput_flops", "job.goodput"),
        basis=_get(data, "basis", str, "job.goodput"),
    )


def _fleet_goodput_from_json(value: object) -> FleetGoodput:
    data = _object(value, "fleet.goodput")
    return FleetGoodput(
        badput_s=_by_cause(data.get("badput_s"), "fleet.goodput.badput_s"),
        goodput=_number(data, "goodput", "fleet.goodput"),
        basis=_get(data, "basis", str, "fleet.goodput"),
    )


def _by_cause(value: object, what: str) -> dict[str, float]:
    data = _object(value, what)
    return {str(cause): _number(data, cause, what) for cause in data}


def _optional_by_cause(data: Mapping[str, Any], key: str, what: str) -> dict[str, float] | None:
    return None if data.get(key) is None else _by_cause(data[key], f"{what}.{key}")


def _optional_text(data: Mapping[str, Any], key: str, what: str) -> str | None:
    return None if data.get(key) is None else str(_get(data, key, str, what))


def _job_loss_from_json(value: object) -> JobLoss:
    data = _object(value, "job.loss")
    return JobLoss(
        gpu_time_s=_number(data, "gpu_time_s", "job.loss"),
        shares=_by_cause(data.get("shares"), "job.loss.shares"),
        lost_s=_by_cause(data.get("lost_s"), "job.loss.lost_s"),
        energy_j=_optional_number(data, "energy_j", "job.loss"),
        flops_per_joule=_optional_number(data, "flops_per_joule", "job.loss"),
        cost=_optional_number(data, "cost", "job.loss"),
        cost_lost=_optional_by_cause(data, "cost_lost", "job.loss"),
        emissions_kg=_optional_number(data, "emissions_kg", "job.loss"),
        currency=_optional_text(data, "currency", "job.loss"),
        dram_active=_optional_number(data, "dram_active", "job.loss"),
        nvlink_bytes_per_s=_optional_number(data, "nvlink_bytes_per_s", "job.loss"),
        pcie_bytes_per_s=_optional_number(data, "pcie_bytes_per_s", "job.loss"),
    )


def _fleet_loss_from_json(value: object) -> FleetLoss:
    if value is None:
        return FleetLoss()
    data = _object(value, "fleet.loss")
    return FleetLoss(
        lost_s=_by_cause(data.get("lost_s", {}), "fleet.loss.lost_s"),
        energy_j=_optional_number(data, "energy_j", "fleet.loss"),
        cost_lost=_optional_by_cause(data, "cost_lost", "fleet.loss"),
        currency=_optional_text(data, "currency", "fleet.loss"),
    )


def _gpu_flag_from_json(value: object) -> GpuFlagReport:
    data = _object(value, "gpu_flag")
    return GpuFlagReport(
        metric=_get(data, "metric", str, "gpu_flag"),
        job_id=_get(data, "job_id", str, "gpu_flag"),
        attributes=_attributes(data.get("attributes", {}), "gpu_flag.attributes"),
        value=_get(data, "value", int, "gpu_flag"),
        ofu=_number(data, "ofu", "gpu_flag"),
        job_median_ofu=_number(data, "job_median_ofu", "gpu_flag"),
        raised=bool(data.get("raised", False)),
    )


def _gpu_from_json(value: object) -> GpuReport:
    data = _object(value, "gpu")
    job_id = data.get("job_id")
    if job_id is not None and not isinstance(job_id, str):
        raise RecordFormatError("gpu.job_id is not a string")
    return GpuReport(
        job_id=job_id,
        attributes=_attributes(data.get("attributes", {}), "gpu.attributes"),
        ofu=_number(data, "ofu", "gpu"),
        tensor_active=_optional_number(data, "tensor_active", "gpu"),
        sm_clock_hz=_optional_number(data, "sm_clock_hz", "gpu"),
        sm_clock_max_hz=_optional_number(data, "sm_clock_max_hz", "gpu"),
        power_w=_optional_number(data, "power_w", "gpu"),
        throttle=_by_cause(data.get("throttle", {}), "gpu.throttle"),
    )


def _gpus_from_json(value: object, end_ns: object) -> tuple[GpuReport, ...]:
    """The usable GPU entries; one that is not is skipped with a warning, never the window."""
    gpus: list[GpuReport] = []
    skipped = 0
    first: str | None = None
    for entry in _list(value, "gpus"):
        try:
            gpus.append(_gpu_from_json(entry))
        except (RecordFormatError, TypeError, ValueError) as error:
            skipped += 1
            first = first or str(error)
    if skipped:
        logger.warning(
            "window ending %s: skipped %d unusable GPU %s, the first: %s",
            end_ns,
            skipped,
            "entry" if skipped == 1 else "entries",
            first,
        )
    return tuple(gpus)


def _fleet_from_json(value: object) -> FleetReport:
    data = _object(value, "fleet")
    moments = _object(data.get("comoments"), "fleet.comoments")
    return FleetReport(
        correlation=_optional_number(data, "correlation", "fleet"),
        mae=_optional_number(data, "mae", "fleet"),
        jobs=_get(data, "jobs", int, "fleet"),
        comoments=CoMoments(
            n=_get(moments, "n", int, "fleet.comoments"),
            mean_x=_number(moments, "mean_x", "fleet.comoments"),
            mean_y=_number(moments, "mean_y", "fleet.comoments"),
            m2_x=_number(moments, "m2_x", "fleet.comoments"),
            m2_y=_number(moments, "m2_y", "fleet.comoments"),
            c_xy=_number(moments, "c_xy", "fleet.comoments"),
        ),
        abs_diff_sum=_number(data, "abs_diff_sum", "fleet"),
        loss=_fleet_loss_from_json(data.get("loss")),
        goodput=_fleet_goodput_from_json(data["goodput"]) if data.get("goodput") is not None else None,
    )


def report_from_json(data: object) -> WindowReport:
    """One parsed line -> a window report; RecordFormatError when it is not one this version reads."""
    record = _object(data, "record")
    version = record.get(FORMAT_KEY)
    if isinstance(version, bool) or not isinstance(version, int):
        raise RecordFormatError(f"not an otel-ofu window record (no {FORMAT_KEY!r} version)")
    if version > FORMAT_VERSION:
        raise RecordFormatError(f"record format {version} is newer than this otel-ofu reads ({FORMAT_VERSION})")
    try:
        return WindowReport(
            start_ns=_get(record, "start_ns", int, "record"),
            end_ns=_get(record, "end_ns", int, "record"),
            groups=tuple(_group_from_json(group) for group in _list(record.get("groups"), "groups")),
            jobs=tuple(_job_from_json(job) for job in _list(record.get("jobs"), "jobs")),
            fleet=_fleet_from_json(record.get("fleet")),
            gpu_flags=tuple(_gpu_flag_from_json(flag) for flag in _list(record.get("gpu_flags", []), "gpu_flags")),
            gpus=_gpus_from_json(record.get("gpus", []), record.get("end_ns")),
            closed_at_ns=_get(record, "closed_at_ns", int, "record") if "closed_at_ns" in record else None,
        )
    except (TypeError, ValueError) as error:  # attrs validators (a negative count, say)
        if isinstance(error, RecordFormatError):
            raise
        raise RecordFormatError(str(error)) from None


def report_from_line(line: str) -> WindowReport:
    try:
        data = json.loads(line)
    except ValueError:
        raise RecordFormatError("not JSON") from None
    return report_from_json(data)


@attrs.frozen
class Records:
    """What a file or feed held: its windows in time order and the lines that were skipped."""

    reports: tuple[WindowReport, ...]
    bad_lines: int = 0
    first_error: str | None = None


def parse_lines(lines: Iterable[str], source: str = "records") -> Records:
    """Every usable window of ``lines`` in time order; blank lines are ignored, bad ones counted. Prometheus
    text instead of records (a reader given the wrong port) is NotWindowRecords, which says so."""
    reports: list[WindowReport] = []
    bad = 0
    first_error: str | None = None
    first_line = ""
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        first_line = first_line or line
        try:
            reports.append(report_from_line(line))
        except RecordFormatError as error:
            bad += 1
            if first_error is None:
                first_error = f"{source}:{number}: {error}"
    if not reports and first_line.startswith(_PROMETHEUS_TEXT):
        raise NotWindowRecords(_prometheus_said(source))
    reports.sort(key=lambda report: (report.end_ns, report.start_ns))
    return Records(tuple(reports), bad, first_error)


def _prometheus_said(source: str) -> str:
    what = "is a Prometheus /metrics endpoint, not a report feed" if "://" in source else "holds Prometheus metrics"
    return (
        f"{source} {what} (window records): give the collector's --report-feed-port ({ports.COLLECTOR_REPORT_FEED} "
        f"by the port map), not its --prometheus-port ({ports.COLLECTOR_PROMETHEUS})"
    )


def load_records(path: str | Path) -> Records:
    """Read a recorded-outputs file; OSError when it cannot be opened."""
    with Path(path).open(encoding="utf-8", errors="replace") as file:
        return parse_lines(file, str(path))


def encode_lines(reports: Sequence[WindowReport]) -> list[tuple[WindowReport, str]]:
    """Each window with its line; a window that cannot be encoded is logged and left out, not the batch."""
    encoded = []
    for report in reports:
        try:
            encoded.append((report, report_to_line(report)))
        except ValueError as error:  # a non-finite required number: lose this window, not the batch
            logger.warning("window ending %d not recorded: %s", report.end_ns, error)
    return encoded
