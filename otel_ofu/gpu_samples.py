"""From a source's snapshot to attributed, calibrated per-GPU values: the one rule ``run``, ``snapshot`` and
the report's capture replay all follow.

Per reading:

- attributes: the source's hints, then what ``attribution`` says (it wins), then the GPU's own identity
  (which wins over both). Without an attribution chain the hints link is used, so a command that has no
  job options still gets the normalised precision and inferred scheduler ``run`` would export;
- calibration: the factor for the attributed ``job.id``, else for the model;
- a reading whose OFU cannot be had is an error, never a 0, and the values it did give that are valid on
  their own (a clock without tensor activity, say) are kept beside the error in ``partial``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import attrs

from otel_ofu import bounds, names, ofu_math
from otel_ofu.attribution.hints import HintsAttributor
from otel_ofu.gpu_values import CalibrationTable, GpuValues, compute, loss_inputs, say_once
from otel_ofu.model import EnergyCounter, GpuError, GpuIdentity, GpuReading, IoCounter, Snapshot

AttributeValue = str | int
# Attribution: which job a GPU belongs to, as contract attribute keys (job.id, gpu.precision, k8s.*...).
Attribution = Callable[[GpuIdentity], Mapping[str, str]]


def no_attribution(gpu: GpuIdentity) -> Mapping[str, str]:
    """Nothing beyond the source's raw hints."""
    return {}


hints_attribution: Attribution = HintsAttributor().attribute


@attrs.frozen
class GpuSample:
    """One GPU's computed values for one interval, with everything that says whose GPU it is."""

    gpu: GpuIdentity
    attributes: Mapping[str, AttributeValue]  # identity + attribution, contract keys
    values: GpuValues
    start_ns: int
    end_ns: int


@attrs.frozen
class PartialSample:
    """A GPU that was read but has no OFU: the values it gave that are valid on their own (gauges by metric name,
    possibly none; its energy, throttle shares and link counters as ``gpu_values.loss_inputs`` keeps them) and why it
    has no OFU (an ``names.ErrorReason``, also among the snapshot's errors for ``gpu.key``). The producer still
    exports it (``gpu.ofu.unmeasured``): the GPU is allocated and draws power, and its time is billed."""

    gpu: GpuIdentity
    attributes: Mapping[str, AttributeValue]
    known: Mapping[str, float]
    start_ns: int
    end_ns: int
    reason: str = names.ErrorReason.UNKNOWN
    energy: EnergyCounter | None = None
    throttle: Mapping[str, float] = attrs.field(factory=dict)
    nvlink_io: Mapping[str, IoCounter] = attrs.field(factory=dict)
    pcie_io: Mapping[str, IoCounter] = attrs.field(factory=dict)


@attrs.frozen
class ComputedSnapshot:
    """The values of every GPU that could be read and the errors of those that could not."""

    samples: tuple[GpuSample, ...] = ()
    errors: tuple[GpuError, ...] = ()
    partial: tuple[PartialSample, ...] = ()

    def errors_of(self, key: str) -> tuple[GpuError, ...]:
        return tuple(error for error in self.errors if error.gpu is not None and error.gpu.key == key)


def attributes_of(gpu: GpuIdentity, attribution: Attribution = hints_attribution) -> dict[str, AttributeValue]:
    """The GPU's attributes: hints, then attribution, then its own identity (see the module docstring)."""
    attributes: dict[str, AttributeValue] = dict(gpu.hints)
    try:
        attributes.update(attribution(gpu))
    except Exception as error:  # a broken attribution must not cost the GPU its OFU
        say_once(f"attribution failed for GPU {gpu.key}: {error}; exporting it without job attributes")
    # The GPU's own identity is what it is, whatever hints or attribution claim.
    attributes.update(gpu.resource_attributes())
    return attributes


def known_values(reading: GpuReading) -> dict[str, float]:
    """The reading's own values that are valid on their own, for a GPU whose OFU cannot be had."""
    checks = (
        (names.GPU_TENSOR_ACTIVE.name, reading.tensor_active, ofu_math.check_fraction),
        (names.GPU_CLOCK_SM.name, reading.sm_clock_hz, ofu_math.check_clock),
        (names.GPU_CLOCK_SM_MAX.name, reading.max_sm_clock_hz, ofu_math.check_clock),
        (names.GPU_SM_ACTIVE.name, reading.sm_active, ofu_math.check_fraction),
        (names.GPU_DRAM_ACTIVE.name, reading.dram_active, ofu_math.check_fraction),
        (names.GPU_ENGINE_ACTIVE.name, reading.engine_active, ofu_math.check_fraction),
        (names.GPU_SM_OCCUPANCY.name, reading.sm_occupancy, ofu_math.check_fraction),
    )
    known: dict[str, float] = {}
    for name, value, check in checks:
        if value is None:
            continue
        try:
            known[name] = check(name, value)
        except ofu_math.InvalidReading:
            continue
    power = reading.power_w
    if power is not None and 0 <= power <= bounds.MAX_GPU_POWER_W:  # NaN fails both
        known[names.GPU_POWER.name] = power  # the board draws power whether or not its OFU can be had
    return known


def compute_snapshot(
    snapshot: Snapshot,
    *,
    attribution: Attribution = hints_attribution,
    calibration: CalibrationTable | None = None,
) -> ComputedSnapshot:
    """Attribute and compute every reading; one that cannot be computed becomes an error, never a 0."""
    table = calibration or CalibrationTable()
    samples: list[GpuSample] = []
    partial: list[PartialSample] = []
    errors = list(snapshot.errors)
    # A source may return a GPU's clocks together with an error saying why its TPA is missing (no GPM);
    # that GPU's failed computation is the same problem and is counted once.
    already_failed = {error.gpu.key for error in snapshot.errors if error.gpu is not None}
    for reading in snapshot.readings:
        gpu = reading.gpu
        attributes = attributes_of(gpu, attribution)
        precision = attributes.get(names.GPU_PRECISION)
        job_id = attributes.get(names.JOB_ID)
        try:
            values = compute(
                reading,
                precision=str(precision) if precision is not None else None,
                calibration=table.factor(gpu.model, str(job_id) if job_id is not None else None),
            )
        except Exception as error:  # one broken reading never takes down the rest
            if isinstance(error, ofu_math.InvalidReading):
                failure = GpuError(error.reason, str(error), gpu)
            else:
                failure = GpuError(names.ErrorReason.UNKNOWN, f"{type(error).__name__}: {error}", gpu)
            if gpu.key not in already_failed:
                errors.append(failure)
                already_failed.add(gpu.key)
            inputs = loss_inputs(reading)
            partial.append(
                PartialSample(
                    gpu,
                    attributes,
                    known_values(reading),
                    reading.start_ns,
                    reading.end_ns,
                    failure.reason,
                    inputs["energy"],
                    inputs["throttle"],
                    inputs["nvlink_io"],
                    inputs["pcie_io"],
                )
            )
            continue
        samples.append(GpuSample(gpu, attributes, values, reading.start_ns, reading.end_ns))
    return ComputedSnapshot(tuple(samples), tuple(errors), tuple(partial))
