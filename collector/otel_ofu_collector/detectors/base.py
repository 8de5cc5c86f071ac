"""The protocol every job flag implements: a ``Detector`` makes, per job, a ``JobFlag`` fed its windows.

A flag's verdict for a window is 1 (up), 0 (down) or ``NOT_ASSESSABLE`` (None: this window says nothing
either way; the outputs leave an absent verdict out, as they do every missing value). The windows call
``assess`` once per closed window that has the job, in time order, with the job's window values; a flag
keeps whatever state it needs between windows (a run length, a baseline) and is started afresh when its
job comes back after eviction.

GPU-level flags (``gpu.straggler``) follow the sibling protocol ``GpuDetector``: it starts a ``GpuFlag`` per
GPU of a job, fed that GPU's windows with its job's median beside them. A GPU flag's ``None`` means "no
point this window": a GPU-level flag is shown only for GPUs it has something to say about (flagged, or
just cleared), so a healthy fleet adds no series. A module defines ``DETECTOR`` (a job flag) or
``GPU_DETECTOR`` (a GPU flag).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, Protocol

import attrs

from otel_ofu import names
from otel_ofu_collector.config import AggregatorConfig

NOT_ASSESSABLE: Final = None


@attrs.frozen
class JobWindowValues:
    """What a flag sees of one job in one closed window; None where the window has no such value."""

    start_ns: int
    end_ns: int
    ofu: float | None  # mean OFU over the job's GPUs
    mfu: float | None  # mean reported MFU
    gpus: int
    # The job's GPUs (stream keys) with no tensor activity all window.
    idle_gpus: frozenset[str] = frozenset()


@attrs.frozen
class GpuWindowValues:
    """What a GPU flag sees of one GPU of a job in one closed window."""

    start_ns: int
    end_ns: int
    ofu: float  # the GPU's mean OFU in the window
    tensor_active: float  # its mean tensor pipe activity (its OFU where not reported)
    idle: bool  # no tensor activity all window (aggregation.loss.IDLE_TENSOR_ACTIVE)
    job_median_ofu: float  # the median OFU of the job's other GPUs in the window (its peers)
    job_gpus: int
    throttle: Mapping[str, float]  # share of the window the clock was held down, by gpu.throttle.reason


class GpuFlag(Protocol):
    """One GPU's state for one GPU-level flag."""

    def assess(self, window: GpuWindowValues) -> int | None:
        """The flag's value to show for this window (1, 0), or None: nothing to show."""
        ...

    @property
    def labels(self) -> Mapping[str, str]:
        """Attributes the latest shown value carries besides the GPU's identity (e.g. gpu.throttle.reason)."""
        ...


class GpuDetector(Protocol):
    """A GPU-level flag: names as ``Detector``'s and a factory of per-GPU state."""

    @property
    def metric(self) -> names.MetricSpec: ...

    @property
    def record_key(self) -> str: ...

    @property
    def kind(self) -> str: ...

    @property
    def label(self) -> str: ...

    def start(self, config: AggregatorConfig) -> GpuFlag:
        """A fresh state for one GPU of one job."""
        ...


class JobFlag(Protocol):
    """One job's state for one flag."""

    def assess(self, window: JobWindowValues) -> int | None:
        """The flag's value in this window: 1, 0, or NOT_ASSESSABLE."""
        ...


class Detector(Protocol):
    """One flag: its names and a factory of per-job state.

    ``metric`` is the job gauge the flag is exported as (its name also keys ``JobReport.flags``; its place in
    ``names.COLLECTOR_METRICS`` orders the flags everywhere); ``record_key`` is its key in window records;
    ``kind`` and ``label`` name it in the run report.
    """

    @property
    def metric(self) -> names.MetricSpec: ...

    @property
    def record_key(self) -> str: ...

    @property
    def kind(self) -> str: ...

    @property
    def label(self) -> str: ...

    def start(self, config: AggregatorConfig) -> JobFlag:
        """A fresh state for one job."""
        ...
