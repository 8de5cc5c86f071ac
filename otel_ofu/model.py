"""The values every counter source produces and the one protocol every source implements.

A source reads a snapshot: per-GPU readings for the interval since its previous read, and per-GPU
errors. A reading that is missing or invalid is left as ``None`` (or reported as an error), never
written as 0 or NaN.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol, runtime_checkable

import attrs

from otel_ofu import names

# A clock returns nanoseconds since the Unix epoch. Injectable so simulations and tests run faster
# than wall time and windows are tested by calling flush with a time, never by sleeping.
Clock = Callable[[], int]


@attrs.frozen
class GpuIdentity:
    """Who a GPU (or MIG instance) is. ``uuid`` plus the MIG instance id is the stream key."""

    uuid: str
    model: str
    index: int
    host: str
    mig_profile: str | None = None
    mig_instance_id: int | None = None
    vendor: str = names.HW_VENDOR_NVIDIA  # hw.vendor
    # An AMD compute partition mode (names.GPU_COMPUTE_PARTITION: spx, dpx, tpx, qpx, cpx); its own UUID is hw.id.
    compute_partition: str | None = None
    # Attribution hints the source itself knows (pod labels or hpc_job from dcgm-exporter, say),
    # keyed by the contract's attribute names (names.K8S_POD_NAME, names.JOB_ID, ...).
    hints: Mapping[str, str] = attrs.field(factory=dict)

    @property
    def key(self) -> str:
        if self.mig_instance_id is None:
            return self.uuid
        return f"{self.uuid}/{self.mig_instance_id}"

    def resource_attributes(self) -> dict[str, str | int]:
        """The identity attributes of the contract that this GPU itself determines."""
        attributes: dict[str, str | int] = {
            names.HOST_NAME: self.host,
            names.HW_ID: self.uuid,
            names.HW_TYPE: names.HW_TYPE_GPU,
            names.HW_VENDOR: self.vendor,
            names.HW_MODEL: self.model,
            names.GPU_INDEX: self.index,
        }
        if self.mig_profile is not None:
            attributes[names.GPU_MIG_PROFILE] = self.mig_profile
        if self.mig_instance_id is not None:
            attributes[names.GPU_MIG_INSTANCE_ID] = self.mig_instance_id
        if self.compute_partition is not None:
            attributes[names.GPU_COMPUTE_PARTITION] = self.compute_partition
        return attributes


@attrs.frozen
class CycleCounters:
    """Deltas of monotonic cycle counters over the reading's interval (DCGM 1084/1086, GPM 248/250)."""

    sm_cycles_elapsed: int
    mma_cycles_active: int


@attrs.frozen
class EnergyCounter:
    """The board's energy counter as a cumulative sum: joules used since ``start_ns`` (when the source
    first read the counter, or since it went back)."""

    joules: float
    start_ns: int


@attrs.frozen
class IoCounter:
    """One direction of a link's traffic as a cumulative sum: bytes since ``start_ns`` (when the producer started
    counting them; ``otel_ofu.io_counters`` integrates the rates sources report into it)."""

    total_bytes: float
    start_ns: int


@attrs.frozen
class GpuReading:
    """What one GPU reported for one interval ``[start_ns, end_ns]``. ``None`` means not read."""

    gpu: GpuIdentity
    start_ns: int
    end_ns: int
    tensor_active: float | None = None  # TPA in [0, 1], interval average
    sm_clock_hz: float | None = None  # interval average where the source allows, else a point sample
    max_sm_clock_hz: float | None = None  # as the device reports it; None when the source lacks it
    sm_active: float | None = None
    dram_active: float | None = None
    cycles: CycleCounters | None = None
    power_w: float | None = None  # over the interval where an energy counter gives it, else instantaneous
    energy: EnergyCounter | None = None
    throttle: Mapping[str, float] = attrs.field(factory=dict)  # gpu.throttle.reason -> share; absent: unknown
    # What the engine and SMs did beside the tensor pipes (interval averages in [0, 1]): the share of the interval a
    # kernel was running (gpu.engine.active) and the resident warps as a share of the maximum (gpu.sm.occupancy).
    engine_active: float | None = None
    sm_occupancy: float | None = None
    # Link traffic by network.io.direction (transmit, receive); a direction the source did not give is absent.
    nvlink_io: Mapping[str, IoCounter] = attrs.field(factory=dict)
    pcie_io: Mapping[str, IoCounter] = attrs.field(factory=dict)
    # Training-side truth a simulated source knows (ground-truth OFU, the framework's MFU);
    # real sources leave these None. Never exported as GPU metrics.
    truth_ofu: float | None = None
    truth_precision: str | None = None


@attrs.frozen
class GpuError:
    """A GPU (or a whole source, when ``gpu`` is None) that could not be read this interval."""

    reason: str
    message: str
    gpu: GpuIdentity | None = None
    gpu_key: str | None = None  # what the source knows of the GPU when it has no full identity


@attrs.frozen
class Snapshot:
    """One read of a source: the readings that succeeded and the errors of the ones that did not."""

    readings: tuple[GpuReading, ...] = ()
    errors: tuple[GpuError, ...] = ()


@runtime_checkable
class Source(Protocol):
    """A counter source. ``read`` covers the interval since the previous read (or since opening)."""

    name: str

    def read(self) -> Snapshot: ...

    def close(self) -> None: ...


class SourceUnavailable(RuntimeError):
    """A source that cannot start at all; the message is one line saying why."""
