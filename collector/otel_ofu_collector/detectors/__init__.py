"""Flags: one module per flag, each defining ``DETECTOR`` (a job flag, ``base.Detector``: ``flops_miscount``,
``regression``, ``idle_gpus``, ``hang``) or ``GPU_DETECTOR`` (a GPU-level flag, ``base.GpuDetector``: ``straggler``).

``DETECTORS`` and ``GPU_DETECTORS`` hold every module's detector, found here at import, in the order of their
metrics in the collector's outputs (``names.COLLECTOR_METRICS``, ``names.COLLECTOR_LOSS_METRICS``, then
``names.COLLECTOR_GOODPUT_METRICS``): a new
flag is a module in this folder plus its metric in ``otel_ofu.names``. ``FLAG_OPTIONS`` holds their settings
(``base.FlagOption``), in the same order: ``AggregatorConfig`` checks its ``flag_settings`` against them and
``otel-ofu collector`` offers each as an option.
The windows run every job detector for every job and every GPU detector for each of its GPUs; the outputs, the
records and the report take the flags from ``JobReport.flags`` without naming any.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

from otel_ofu import names
from otel_ofu_collector.detectors.base import (
    NOT_ASSESSABLE,
    Detector,
    FlagOption,
    GpuDetector,
    GpuFlag,
    GpuVerdict,
    GpuWindowValues,
    JobFlag,
    JobWindowValues,
)

__all__ = [
    "DETECTORS",
    "FLAG_OPTIONS",
    "GPU_DETECTORS",
    "NOT_ASSESSABLE",
    "Detector",
    "FlagOption",
    "GpuDetector",
    "GpuFlag",
    "GpuVerdict",
    "GpuWindowValues",
    "JobFlag",
    "JobWindowValues",
    "detector_for",
]

_ORDER = {
    spec.name: index
    for index, spec in enumerate(
        (*names.COLLECTOR_METRICS, *names.COLLECTOR_LOSS_METRICS, *names.COLLECTOR_GOODPUT_METRICS)
    )
}


def _discover() -> tuple[tuple[Detector, ...], tuple[GpuDetector, ...]]:
    jobs: list[Detector] = []
    gpus: list[GpuDetector] = []
    for module in pkgutil.iter_modules(__path__):
        if module.name == "base":
            continue
        loaded = importlib.import_module(f"{__name__}.{module.name}")
        detector: Detector | None = getattr(loaded, "DETECTOR", None)
        gpu_detector: GpuDetector | None = getattr(loaded, "GPU_DETECTOR", None)
        if detector is None and gpu_detector is None:
            raise ImportError(f"detector module {__name__}.{module.name} defines no DETECTOR nor GPU_DETECTOR")
        if detector is not None:
            jobs.append(detector)
        if gpu_detector is not None:
            gpus.append(gpu_detector)
    every: list[Detector | GpuDetector] = [*jobs, *gpus]
    missing = [d.metric.name for d in every if d.metric.name not in _ORDER]
    if missing:
        raise ImportError(f"flag metric(s) {', '.join(missing)} not among the collector's outputs in names")
    return (
        tuple(sorted(jobs, key=lambda d: _ORDER[d.metric.name])),
        tuple(sorted(gpus, key=lambda d: _ORDER[d.metric.name])),
    )


DETECTORS: tuple[Detector, ...]
GPU_DETECTORS: tuple[GpuDetector, ...]
DETECTORS, GPU_DETECTORS = _discover()


def _options() -> tuple[FlagOption[Any], ...]:
    every: tuple[Detector | GpuDetector, ...] = (*DETECTORS, *GPU_DETECTORS)
    options = tuple(option for detector in every for option in detector.options)
    keys = [option.key for option in options]
    twice = sorted({key for key in keys if keys.count(key) > 1})
    if twice:
        raise ImportError(f"flag option(s) {', '.join(twice)} declared by more than one detector")
    return options


FLAG_OPTIONS: tuple[FlagOption[Any], ...] = _options()


def detector_for(kind: str) -> Detector | GpuDetector:
    """The detector a run report's flag kind names; KeyError for none."""
    every: tuple[Detector | GpuDetector, ...] = (*DETECTORS, *GPU_DETECTORS)
    for detector in every:
        if detector.kind == kind:
            return detector
    raise KeyError(kind)
