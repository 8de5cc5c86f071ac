"""Job flags: one module per flag, each defining ``DETECTOR`` (a ``base.Detector``).

``DETECTORS`` holds every module's detector, found here at import, in the order of their metrics in
``names.COLLECTOR_METRICS``: a new flag is a module in this folder plus its metric in ``otel_ofu.names``.
The windows run every detector for every job; the outputs, the records and the report take the flags
from ``JobReport.flags`` without naming any.
"""

from __future__ import annotations

import importlib
import pkgutil

from otel_ofu import names
from otel_ofu_collector.detectors.base import NOT_ASSESSABLE, Detector, JobFlag, JobWindowValues

__all__ = ["DETECTORS", "NOT_ASSESSABLE", "Detector", "JobFlag", "JobWindowValues", "detector_for"]


def _discover() -> tuple[Detector, ...]:
    found: list[Detector] = []
    for module in pkgutil.iter_modules(__path__):
        if module.name == "base":
            continue
        detector: Detector | None = getattr(importlib.import_module(f"{__name__}.{module.name}"), "DETECTOR", None)
        if detector is None:
            raise ImportError(f"detector module {__name__}.{module.name} defines no DETECTOR")
        found.append(detector)
    order = {spec.name: index for index, spec in enumerate(names.COLLECTOR_METRICS)}
    missing = [d.metric.name for d in found if d.metric.name not in order]
    if missing:
        raise ImportError(f"flag metric(s) {', '.join(missing)} not in names.COLLECTOR_METRICS")
    return tuple(sorted(found, key=lambda d: order[d.metric.name]))


DETECTORS: tuple[Detector, ...] = _discover()


def detector_for(kind: str) -> Detector:
    """The detector a run report's flag kind names; KeyError for none."""
    for detector in DETECTORS:
        if detector.kind == kind:
            return detector
    raise KeyError(kind)
