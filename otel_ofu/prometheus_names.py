"""One naming rule from OpenTelemetry names to Prometheus names, for both ``/metrics`` endpoints and the
dashboards that query them.

It follows the OpenTelemetry spec's OTLP -> Prometheus conversion:

============================= ===================================== ========================================
OpenTelemetry                 Prometheus                            rule
============================= ===================================== ========================================
``fleet.ofu.quantile``        ``fleet_ofu_quantile``                characters Prometheus forbids -> ``_``
``gpu.ofu`` (unit ``1``)      ``gpu_ofu``                           unit ``1`` adds nothing
``gpu.clock.sm`` (``Hz``)     ``gpu_clock_sm_hertz``                with a unit: spelled out as a suffix
``gpu.flops.achieved``        ``gpu_flops_achieved_per_second``     ``{annotation}`` dropped, ``/s`` -> per_second
``hw.id`` (attribute)         ``hw_id`` (label)                     as names, but no ``:`` in labels
============================= ===================================== ========================================

A name starting with a digit gets a leading ``_``. Counters get their ``_total`` from prometheus-client.
The producer exposes its contract metrics with unit suffixes; the collector exposes its outputs by name
alone (no unit), which is what the Grafana dashboard queries.
"""

from __future__ import annotations

import re
from typing import Final

_INVALID_METRIC: Final = re.compile(r"[^a-zA-Z0-9_:]")
_INVALID_LABEL: Final = re.compile(r"[^a-zA-Z0-9_]")
_ANNOTATION: Final = re.compile(r"\{[^}]*\}")
_UNIT_WORDS: Final = {
    "Hz": "hertz",
    "s": "seconds",
    "ms": "milliseconds",
    "By": "bytes",
    "%": "percent",
    "1": "",
    "W": "watts",
    "J": "joules",
}
_PER_WORDS: Final = {"s": "second", "m": "minute", "h": "hour", "d": "day"}


def _lead(cleaned: str) -> str:
    return f"_{cleaned}" if cleaned[:1].isdigit() else cleaned


def label_name(key: str) -> str:
    """The Prometheus label for an attribute key: ``hw.model`` -> ``hw_model``."""
    return _lead(_INVALID_LABEL.sub("_", key))


def unit_suffix(unit: str) -> str:
    """The words an OpenTelemetry unit adds to a Prometheus name (``Hz`` -> ``hertz``; ``1`` -> nothing)."""
    unit = _ANNOTATION.sub("", unit)  # annotations like {flop} carry no unit
    numerator, _, denominator = unit.partition("/")
    words = [_UNIT_WORDS.get(numerator, numerator)] if numerator else []
    if denominator:
        words.append("per_" + _PER_WORDS.get(denominator, denominator))
    return _INVALID_LABEL.sub("_", "_".join(word for word in words if word))


def metric_name(name: str, unit: str | None = None) -> str:
    """The Prometheus metric name of an OpenTelemetry metric; with ``unit``, its suffix is appended once."""
    base = _lead(_INVALID_METRIC.sub("_", name))
    suffix = unit_suffix(unit) if unit is not None else ""
    if suffix and not base.endswith("_" + suffix):
        base = f"{base}_{suffix}"
    return base
