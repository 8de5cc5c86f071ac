"""The protocol every job flag implements: a ``Detector`` makes, per job, a ``JobFlag`` fed its windows.

A flag's verdict for a window is 1 (up), 0 (down) or ``NOT_ASSESSABLE`` (None: this window says nothing
either way; the outputs leave an absent verdict out, as they do every missing value). The windows call
``assess`` once per closed window that has the job, in time order, with the job's window values; a flag
keeps whatever state it needs between windows (a run length, a baseline) and is started afresh when its
job comes back after eviction.

GPU-level flags (``gpu.straggler``) follow the sibling protocol ``GpuDetector``: it starts a ``GpuFlag`` per
job, fed each of the job's windows with all its GPUs at once, in columns (a job may have thousands of GPUs,
and a window close must not build an object per GPU), their job's peer medians beside them. A GPU flag
keeps what it needs per GPU (a GPU gone from the job lets go of it) and shows a value only for the GPUs it
has something to say about (flagged, or just cleared), so a healthy fleet adds no series. A module defines
``DETECTOR`` (a job flag) or ``GPU_DETECTOR`` (a GPU flag).

Every detector declares its settings as ``FlagOption`` s (a threshold, a number of windows): their defaults and
bounds live there and nowhere else. ``AggregatorConfig.flag_settings`` holds their values, checked against those
bounds, and ``otel-ofu collector`` offers each as ``--key-with-dashes`` with its own variable.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, Generic, Protocol

import attrs

from otel_ofu import names
from otel_ofu_collector.option_bounds import Bound, N

NOT_ASSESSABLE: Final = None


@attrs.frozen
class FlagOption(Generic[N]):
    """One setting of a flag: ``key`` in ``AggregatorConfig.flag_settings``, ``--key-with-dashes`` on the
    command line; ``metavar`` says its unit in ``--help``."""

    key: str
    default: N
    bound: Bound[N]
    help: str
    metavar: str

    def __attrs_post_init__(self) -> None:
        self.bound.check(self.key, self.default)

    @property
    def flag(self) -> str:
        return "--" + self.key.replace("_", "-")


class FlagSettings(Protocol):
    """What a flag reads of the collector's settings (an ``AggregatorConfig``): the value of each of its options.

    A protocol, not the config itself: the config checks its settings against the detectors' options, so it
    imports them, and the detectors must not import it back."""

    def flag(self, option: FlagOption[N]) -> N: ...


@attrs.frozen
class JobWindowValues:
    """What a flag sees of one job in one closed window; None where the window has no such value."""

    start_ns: int
    end_ns: int
    ofu: float | None  # mean OFU over the job's GPUs (weighted by their shares of a GPU)
    mfu: float | None  # mean reported MFU
    gpus: float  # GPU equivalents: a MIG slice counts as its share of its GPU (otel_ofu.gpu_share)
    # The job's GPUs (stream keys) with no tensor activity all window, each with its share of a GPU.
    idle_gpus: Mapping[str, float] = attrs.field(factory=dict)
    # Its GPUs running kernels with nothing moving all window (``hang.stalled``), each with its share of a GPU, and
    # the GPU equivalents judged moving; the rest could not be judged (no engine or SM activity).
    stalled_gpus: Mapping[str, float] = attrs.field(factory=dict)
    moving_gpus: float = 0.0
    # The job's progress (job.step) showed it starting or back from a restart in this window: its startup or its
    # recovery was booked (``aggregation.goodput``).
    restarting: bool = False

    @property
    def all_idle(self) -> bool:
        """Every one of the job's GPUs in the window had no tensor activity (False for a window without GPUs)."""
        return bool(self.idle_gpus) and math.fsum(self.idle_gpus.values()) >= self.gpus

    @property
    def all_stalled(self) -> bool:
        """Every one of the job's GPUs in the window ran kernels with nothing moving (False for a window without
        GPUs); to a relative 1e-9, as shares of slices add up in binary."""
        stalled = self.stalled_gpus
        return bool(stalled) and math.fsum(stalled.values()) >= self.gpus * (1.0 - 1e-9)


@attrs.frozen
class GpuWindowValues:
    """What a GPU flag sees of one job's GPUs in one closed window: one entry per GPU, in one order."""

    start_ns: int
    end_ns: int
    keys: Sequence[str]  # the GPUs' stream keys
    ofu: Sequence[float]  # each GPU's mean OFU in the window
    tensor_active: Sequence[float]  # its mean tensor pipe activity (its OFU where not reported)
    idle: Sequence[bool]  # no tensor activity all window (aggregation.loss.IDLE_TENSOR_ACTIVE)
    job_median_ofu: Sequence[float]  # the median OFU of the GPU's peers in the job (its other GPUs)
    # The i-th GPU's share of the window its clock was held down, by gpu.throttle.reason (asked for the few
    # GPUs a flag shows, not built for every GPU).
    throttle: Callable[[int], Mapping[str, float]]


@attrs.frozen
class GpuVerdict:
    """A GPU flag's value to show for one GPU in one window."""

    index: int  # the GPU's position in ``GpuWindowValues``
    value: int  # 1 (up) or 0 (just cleared)
    labels: Mapping[str, str]  # attributes besides the GPU's identity (e.g. gpu.throttle.reason)


class GpuFlag(Protocol):
    """One job's state for one GPU-level flag: what it keeps per GPU of the job."""

    def assess(self, window: GpuWindowValues) -> Sequence[GpuVerdict]:
        """The values to show for this window, in the GPUs' order: only for GPUs with something to show.

        Called for each closed window with any of the job's GPUs; a GPU not in ``window`` loses its state."""
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

    @property
    def options(self) -> Sequence[FlagOption[Any]]: ...

    def start(self, config: FlagSettings) -> GpuFlag:
        """A fresh state for one job's GPUs."""
        ...


class JobFlag(Protocol):
    """One job's state for one flag."""

    def assess(self, window: JobWindowValues) -> float | None:
        """The flag's value in this window: 1, 0 (or a count, as idle GPU equivalents), or NOT_ASSESSABLE."""
        ...


class Detector(Protocol):
    """One flag: its names and a factory of per-job state.

    ``metric`` is the job gauge the flag is exported as (its name also keys ``JobReport.flags``; its place in
    ``names.COLLECTOR_METRICS`` orders the flags everywhere); ``record_key`` is its key in window records;
    ``kind`` and ``label`` name it in the run report; ``options`` are its settings, read from the config
    with ``config.flag(option)``.
    """

    @property
    def metric(self) -> names.MetricSpec: ...

    @property
    def record_key(self) -> str: ...

    @property
    def kind(self) -> str: ...

    @property
    def label(self) -> str: ...

    @property
    def options(self) -> Sequence[FlagOption[Any]]: ...

    def start(self, config: FlagSettings) -> JobFlag:
        """A fresh state for one job."""
        ...
