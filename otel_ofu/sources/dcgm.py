"""DCGM through its Python bindings, plus the DCGM value conventions every DCGM-fed source shares.

The bindings are not on PyPI; they ship with DCGM under a fixed directory, which is put on
``sys.path`` only here and only when the source is opened. Importing this module never needs DCGM:
the pure helpers (blank sentinels, missing-value rule, cycle-counter deltas) serve the
dcgm-exporter and ``dcgmi dmon`` sources too.
"""

from __future__ import annotations

import contextlib
import importlib
import math
import os
import socket
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

import attrs

from otel_ofu import io_counters, names, throttle
from otel_ofu.model import Clock, CycleCounters, GpuError, GpuIdentity, GpuReading, Snapshot, SourceUnavailable
from otel_ofu.sources import keep_values

BINDINGS_PATHS: tuple[Path, ...] = (
    Path("/usr/share/datacenter-gpu-manager-4/bindings/python3"),
    Path("/usr/local/dcgm/bindings/python3"),
)

_INT32_MAX = 2**31 - 1

# --- Value conventions (pure) ------------------------------------------------------------------------


def dcgm_number(value: float | None, *, counter: bool = False) -> float | None:
    """A DCGM value, or None where DCGM means "no value" (blank sentinels, NaN, infinities).

    Gauges (ratios, clocks) of either DCGM type are blank from the INT32 blank window or the FP64
    blank (2^47) up, which also covers the INT64 blanks. Monotonic counters legitimately pass 2^47,
    so for them only the INT64 blanks are sentinels.
    """
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if counter:
        return None if value >= names.DCGM_INT64_BLANK_MIN else value
    if value >= names.DCGM_FP64_BLANK_MIN or names.DCGM_INT32_BLANK_MIN <= value <= _INT32_MAX:
        return None
    return value


def missing_core(tensor_active: float | None, sm_clock_hz: float | None, cycles: CycleCounters | None) -> str | None:
    """What is missing for OFU, in words, or None. Cycle counters alone suffice: they give both; tensor activity 0
    needs no clock (no tensor work at any clock is OFU 0)."""
    if cycles is not None or tensor_active == 0.0:
        return None
    missing = []
    if tensor_active is None:
        missing.append(f"tensor pipe activity (field {names.DCGM_FI_PROF_PIPE_TENSOR_ACTIVE})")
    if sm_clock_hz is None:
        old, new = names.DCGM_FI_DEV_SM_CLOCK, names.DCGM_FIELD_GENERATIONS[names.DCGM_FI_DEV_SM_CLOCK]
        missing.append(f"SM clock (field {old} or {new})")
    if not missing:
        return None
    return "no value for " + " and ".join(missing)


def reading_or_error(reading: GpuReading, *, what: str = "") -> GpuReading | GpuError:
    """The reading, or a NO_VALUE error naming what is missing: a value that is not there is never 0."""
    gap = missing_core(reading.tensor_active, reading.sm_clock_hz, reading.cycles)
    if gap is None:
        return reading
    return GpuError(names.ErrorReason.NO_VALUE, f"{what}{gap}", gpu=reading.gpu, gpu_key=reading.gpu.key)


def split(results: Sequence[GpuReading | GpuError], extra_errors: Sequence[GpuError] = ()) -> Snapshot:
    """A snapshot from per-GPU outcomes; source-level errors first."""
    readings = tuple(item for item in results if isinstance(item, GpuReading))
    errors = tuple(item for item in results if isinstance(item, GpuError))
    return Snapshot(readings=readings, errors=(*extra_errors, *errors))


# DCGM field id -> the reading value it feeds, in the base unit (``base_value``), every generation of the field: the one
# table the DCGM source (by id), dcgm-exporter (tag -> id, names.DCGM_EXPORTER_FIELDS) and dcgmi dmon (column -> id)
# read by. Each violation counter is a value of its own (two of them feed "other").
QUANTITY_OF_FIELD: Mapping[int, str] = {
    names.DCGM_FI_DEV_SM_CLOCK: "sm_clock_hz",
    names.DCGM_FI_DEV_SM_CLOCK_HERTZ: "sm_clock_hz",
    names.DCGM_FI_DEV_MAX_SM_CLOCK: "max_sm_clock_hz",
    names.DCGM_FI_DEV_SM_MAX_CLOCK_HERTZ: "max_sm_clock_hz",
    names.DCGM_FI_PROF_PIPE_TENSOR_ACTIVE: "tensor_active",
    names.DCGM_FI_PROF_SM_ACTIVE: "sm_active",
    names.DCGM_FI_PROF_DRAM_ACTIVE: "dram_active",
    names.DCGM_FI_PROF_GR_ENGINE_ACTIVE: "engine_active",
    names.DCGM_FI_PROF_SM_OCCUPANCY: "sm_occupancy",
    # Bytes per second (DCGM's average over its sampling period), integrated into the byte counters.
    names.DCGM_FI_PROF_PCIE_TX_BYTES: "pcie_tx",
    names.DCGM_FI_PROF_PCIE_RX_BYTES: "pcie_rx",
    names.DCGM_FI_PROF_NVLINK_TX_BYTES: "nvlink_tx",
    names.DCGM_FI_PROF_NVLINK_RX_BYTES: "nvlink_rx",
    names.DCGM_FI_PROF_SM_CYCLES_ELAPSED: "sm_cycles_elapsed",
    names.DCGM_FI_PROF_MMA_CYCLES_ACTIVE: "mma_cycles_active",
    names.DCGM_FI_DEV_POWER_USAGE: "power_w",
    names.DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION: "energy_j",
    names.DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL: "energy_j",
    names.DCGM_FI_DEV_CLOCKS_EVENT_REASONS: "clocks_event_reasons",
    **{field_id: f"violation_{field_id}" for field_id in names.DCGM_VIOLATION_FIELDS},
}
# Monotonic counters: they legitimately pass the FP64 blank (2^47), so only the INT64 blanks are "no value" for them.
COUNTER_FIELDS = frozenset(
    {
        names.DCGM_FI_PROF_SM_CYCLES_ELAPSED,
        names.DCGM_FI_PROF_MMA_CYCLES_ACTIVE,
        names.DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION,
        names.DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL,
        *names.DCGM_VIOLATION_FIELDS,
    }
)
_NEWER_GENERATION = frozenset(names.DCGM_FIELD_GENERATIONS.values())
LINKS = ("pcie_tx", "pcie_rx", "nvlink_tx", "nvlink_rx")


def base_value(field_id: int, value: float) -> float:
    """A field's value in the base unit its reading value carries (Hz, J, W, a ratio, bytes per second)."""
    return value * names.DCGM_FIELD_TO_BASE_UNIT.get(field_id, 1.0)


def field_value(field_id: int, raw: float | None) -> float | None:
    """A field's value in its base unit, or None where DCGM means "no value" (blank sentinels, NaN)."""
    value = dcgm_number(raw, counter=field_id in COUNTER_FIELDS)
    return None if value is None else base_value(field_id, value)


@attrs.define
class FieldValues:
    """One entity's values by the reading value they feed, whichever generation of field gave each: the newer wins
    where a source gives both (the old ids stay valid beside the new ones)."""

    values: dict[str, float] = attrs.field(factory=dict)
    blank: set[str] = attrs.field(factory=set)  # values whose field was there but blank
    fields: dict[str, int] = attrs.field(factory=dict)  # value -> the field id it came from

    def add(self, field_id: int, raw: float | None) -> None:
        quantity = QUANTITY_OF_FIELD.get(field_id)
        if quantity is None:
            return
        value = field_value(field_id, raw)
        if value is None:
            self.blank.add(quantity)
            return
        previous = self.fields.get(quantity)
        if previous is not None and (previous in _NEWER_GENERATION or field_id not in _NEWER_GENERATION):
            return  # the first of a generation stays; a newer generation replaces an older
        self.values[quantity] = value
        self.fields[quantity] = field_id


@attrs.define
class CycleTracker:
    """Turns monotonic cycle counters into deltas with the time span they cover.

    A counter that did not move since the last read is a sample the source has not refreshed yet,
    not an idle GPU (the elapsed counter always advances): no delta then, and the span keeps growing
    from the time the previous value was first seen. A counter that went backwards (reset) restarts.
    """

    _last: dict[str, tuple[int, int, int]] = attrs.field(factory=dict)

    def update(self, key: str, elapsed: int, mma: int, time_ns: int) -> tuple[CycleCounters, int] | None:
        """``(deltas, start_ns)`` of the span ending at ``time_ns``, or None when there is none yet."""
        previous = self._last.get(key)
        if previous is not None and (elapsed, mma) == previous[:2]:
            return None
        self._last[key] = (elapsed, mma, time_ns)
        if previous is None or elapsed < previous[0] or mma < previous[1] or time_ns <= previous[2]:
            return None
        return CycleCounters(sm_cycles_elapsed=elapsed - previous[0], mma_cycles_active=mma - previous[1]), previous[2]

    def forget(self, keep: Iterable[str]) -> None:
        """Drop GPUs that are gone so state stays bounded."""
        kept = set(keep)
        for key in [key for key in self._last if key not in kept]:
            del self._last[key]


# --- The bindings ------------------------------------------------------------------------------------

# Field ids read from DCGM; the cycle counters only exist from DCGM 4.6 on. 1001-1005 are the profiling fields every
# GPU DCGM profiles has (`dcgmi dmon -e 1001,1002,1003,1004,1005`); where one pass cannot collect them all (before
# Hopper), DCGM multiplexes them and a field reads N/A in some samples: absent then, never 0.
CORE_FIELDS: tuple[int, ...] = (
    names.DCGM_FI_DEV_SM_CLOCK,
    names.DCGM_FI_DEV_MAX_SM_CLOCK,
    names.DCGM_FI_PROF_PIPE_TENSOR_ACTIVE,
    names.DCGM_FI_PROF_SM_ACTIVE,
    names.DCGM_FI_PROF_DRAM_ACTIVE,
    names.DCGM_FI_PROF_GR_ENGINE_ACTIVE,
    names.DCGM_FI_PROF_SM_OCCUPANCY,
)
CYCLE_FIELDS: tuple[int, ...] = (names.DCGM_FI_PROF_SM_CYCLES_ELAPSED, names.DCGM_FI_PROF_MMA_CYCLES_ACTIVE)
# Link traffic in bytes per second, never needed for OFU: a GPU without NVLink (a PCIe card) may refuse the NVLink
# fields, so PCIe alone is tried before neither.
PCIE_FIELDS: tuple[int, ...] = (names.DCGM_FI_PROF_PCIE_TX_BYTES, names.DCGM_FI_PROF_PCIE_RX_BYTES)
LINK_FIELDS: tuple[int, ...] = (
    *PCIE_FIELDS,
    names.DCGM_FI_PROF_NVLINK_TX_BYTES,
    names.DCGM_FI_PROF_NVLINK_RX_BYTES,
)
# Power, energy and throttling: watched where the host engine knows them, never needed for OFU.
LOSS_FIELDS: tuple[int, ...] = (
    names.DCGM_FI_DEV_POWER_USAGE,
    names.DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION,
    names.DCGM_FI_DEV_CLOCKS_EVENT_REASONS,
    *names.DCGM_VIOLATION_FIELDS,
)
PROFILING_FIELDS = frozenset(
    {
        names.DCGM_FI_PROF_PIPE_TENSOR_ACTIVE,
        names.DCGM_FI_PROF_SM_ACTIVE,
        names.DCGM_FI_PROF_DRAM_ACTIVE,
        names.DCGM_FI_PROF_GR_ENGINE_ACTIVE,
        names.DCGM_FI_PROF_SM_OCCUPANCY,
        *CYCLE_FIELDS,
        *LINK_FIELDS,
    }
)


def newest_generation(fields: tuple[int, ...]) -> tuple[int, ...]:
    """The same fields with each old one replaced by its DCGM 4.6.1 base-unit successor (1603 for 100, ...)."""
    return tuple(names.DCGM_FIELD_GENERATIONS.get(field_id, field_id) for field_id in fields)


def watch_attempts() -> tuple[tuple[tuple[int, ...], bool], ...]:
    """The field lists to watch, best first, each with whether it is a base (no optional fields): with the cycle
    counters (DCGM 4.6+), without them, and without profiling at all (a GPU or host engine that refuses profiling
    still gives clocks, and says why TPA is missing); each first with the optional fields, NVLink and PCIe traffic
    and the power and throttle fields, which a host engine or a GPU may not have. All of it first in DCGM 4.6.1's
    base-unit fields (the clocks in Hz, the energy in J), then in the old ones, which a host engine before 4.6.1 knows
    (and which one after still accepts)."""
    bases = (CORE_FIELDS + CYCLE_FIELDS, CORE_FIELDS, tuple(f for f in CORE_FIELDS if f not in PROFILING_FIELDS))
    attempts: list[tuple[tuple[int, ...], bool]] = []
    generations: tuple[Callable[[tuple[int, ...]], tuple[int, ...]], ...] = (newest_generation, tuple)
    for generation in generations:
        for base in map(generation, bases):
            profiling = bool(PROFILING_FIELDS & set(base))
            links = (LINK_FIELDS, PCIE_FIELDS, ()) if profiling else ((),)
            for loss in (generation(LOSS_FIELDS), ()):
                for link in links:
                    fields = base + link + loss
                    if fields not in [seen for seen, _ in attempts]:
                        attempts.append((fields, fields == base))
    return tuple(attempts)


@attrs.frozen
class FieldValue:
    """One latest value of one field of one GPU, as DCGM returned it (``value`` None when DCGM had none)."""

    gpu_id: int
    field_id: int
    value: float | None
    ts_us: int = 0
    status: int = 0


@attrs.frozen
class DcgmGpu:
    gpu_id: int
    uuid: str
    model: str


class DcgmBackend(Protocol):
    """What the source needs of DCGM; the bindings implement it, tests use an in-memory one."""

    def gpus(self) -> Sequence[DcgmGpu]: ...

    def latest(self) -> Sequence[FieldValue]: ...

    @property
    def watched_fields(self) -> frozenset[int]: ...

    @property
    def profiling_problem(self) -> str | None: ...

    def close(self) -> None: ...


def import_bindings(paths: Sequence[Path] = BINDINGS_PATHS) -> tuple[ModuleType, ModuleType, ModuleType]:
    """``(dcgm_structs, dcgm_agent, pydcgm)`` from an installed DCGM, or SourceUnavailable in one line."""
    for path in paths:
        if (path / "dcgm_structs.py").is_file() and str(path) not in sys.path:
            sys.path.append(str(path))
    try:
        modules = tuple(importlib.import_module(name) for name in ("dcgm_structs", "dcgm_agent", "pydcgm"))
    except ImportError as error:
        where = " or ".join(str(path) for path in paths)
        raise SourceUnavailable(
            f"DCGM Python bindings not found in {where} ({error}); install datacenter-gpu-manager-4 "
            "or use --source nvml or dcgm-exporter"
        ) from None
    return modules[0], modules[1], modules[2]


def _text(value: object) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


class DcgmBindings:
    """The DCGM host engine through ``dcgm_agent``: one GPU group, one field group, one watch."""

    def __init__(
        self,
        address: str | None = "localhost",
        *,
        update_interval_s: float = 1.0,
        paths: Sequence[Path] = BINDINGS_PATHS,
    ) -> None:
        structs, agent, pydcgm = import_bindings(paths)
        self._structs, self._agent = structs, agent
        self._watched: frozenset[int] = frozenset()
        self._profiling_problem: str | None = None
        tag = f"otel_ofu_{os.getpid()}"
        try:
            # None starts an embedded host engine (needs root); else the nv-hostengine at ``address``.
            self._handle_owner: Any = pydcgm.DcgmHandle(ipAddress=address, opMode=structs.DCGM_OPERATION_MODE_AUTO)
            handle = self._handle_owner.handle
            self._handle = handle
            self._gpus = tuple(self._describe(gpu_id) for gpu_id in agent.dcgmGetAllSupportedDevices(handle))
            self._group = agent.dcgmGroupCreate(handle, structs.DCGM_GROUP_DEFAULT, tag)
        except (structs.DCGMError, OSError) as error:
            where = "an embedded host engine" if address is None else f"nv-hostengine at {address}"
            raise SourceUnavailable(f"DCGM: cannot use {where}: {error}") from None
        if not self._gpus:
            with contextlib.suppress(structs.DCGMError):
                agent.dcgmGroupDestroy(self._handle, self._group)
            self._handle_owner.Shutdown()
            raise SourceUnavailable(f"DCGM at {address or 'embedded'} sees no supported GPUs")
        update_us = max(int(update_interval_s * 1e6), 100_000)  # DCGM's profiling minimum is 100 ms
        self._field_group: Any = None
        last_error: Exception | None = None
        for fields, is_base in watch_attempts():
            try:
                self._field_group = agent.dcgmFieldGroupCreate(handle, list(fields), tag)
                agent.dcgmWatchFields(handle, self._group, self._field_group, update_us, 3600.0, 0)
            except structs.DCGMError as error:
                if is_base:  # a host engine that lacks an optional field is not why profiling failed
                    last_error = error
                self._destroy_field_group()
                continue
            self._watched = frozenset(fields)
            if not PROFILING_FIELDS & self._watched:
                self._profiling_problem = f"DCGM refused the profiling fields: {last_error}"
            agent.dcgmUpdateAllFields(handle, 1)
            return
        self.close()
        raise SourceUnavailable(f"DCGM: cannot watch fields {list(CORE_FIELDS)}: {last_error}")

    def _describe(self, gpu_id: int) -> DcgmGpu:
        attributes = self._agent.dcgmGetDeviceAttributes(self._handle, gpu_id)
        identifiers = attributes.identifiers
        return DcgmGpu(gpu_id, _text(identifiers.uuid), _text(identifiers.deviceName))

    def _destroy_field_group(self) -> None:
        if self._field_group is not None:
            with contextlib.suppress(self._structs.DCGMError):
                self._agent.dcgmFieldGroupDestroy(self._handle, self._field_group)
            self._field_group = None

    def gpus(self) -> Sequence[DcgmGpu]:
        return self._gpus

    @property
    def watched_fields(self) -> frozenset[int]:
        return self._watched

    @property
    def profiling_problem(self) -> str | None:
        return self._profiling_problem

    def latest(self) -> Sequence[FieldValue]:
        structs = self._structs
        fields = sorted(self._watched)
        pairs = []
        for gpu in self._gpus:
            pair = structs.c_dcgmGroupEntityPair_t()
            pair.entityGroupId = 1  # DCGM_FE_GPU
            pair.entityId = gpu.gpu_id
            pairs.append(pair)
        raw = self._agent.dcgmEntitiesGetLatestValues(self._handle, pairs, fields, 0)
        values = []
        for item in raw:
            field_type = chr(item.fieldType) if item.fieldType else ""
            number: float | None = None
            if item.status == structs.DCGM_ST_OK:
                if field_type == "d":
                    number = float(item.value.dbl)
                elif field_type == "i":
                    number = int(item.value.i64)
            values.append(FieldValue(int(item.entityId), int(item.fieldId), number, int(item.ts), int(item.status)))
        return values

    def close(self) -> None:
        agent, structs, handle = self._agent, self._structs, getattr(self, "_handle", None)
        if handle is None:
            return
        try:
            if self._field_group is not None:
                agent.dcgmUnwatchFields(handle, self._group, self._field_group)
        except structs.DCGMError:
            pass
        self._destroy_field_group()
        with contextlib.suppress(structs.DCGMError, AttributeError):
            agent.dcgmGroupDestroy(handle, self._group)
        self._handle_owner.Shutdown()
        self._handle = None


# --- The source --------------------------------------------------------------------------------------


def _status_reason(status: int) -> str:
    # DCGM_ST_* codes (dcgm_structs.py): -6 not supported, -17 no permission, -18 GPU lost, -29 requires root,
    # -36 profiling not supported.
    return {
        -6: names.ErrorReason.NOT_SUPPORTED,
        -36: names.ErrorReason.NOT_SUPPORTED,
        -17: names.ErrorReason.NO_PERMISSION,
        -29: names.ErrorReason.NO_PERMISSION,
        -18: names.ErrorReason.GPU_LOST,
    }.get(status, names.ErrorReason.NO_VALUE)


@attrs.define
class DcgmSource:
    """Latest DCGM values per GPU. Field 1004 is DCGM's own average over its update interval, so a
    reading covers ``[previous read, this read]``; with the 4.6 cycle counters the span is exact,
    from the counters' own timestamps."""

    _backend: DcgmBackend
    _host: str = attrs.field(factory=socket.gethostname)
    _clock: Clock = time.time_ns
    name: str = "dcgm"
    _previous_ns: int | None = attrs.field(default=None, init=False)
    _cycles: CycleTracker = attrs.field(factory=CycleTracker, init=False)
    _energy: throttle.EnergyTracker = attrs.field(factory=throttle.EnergyTracker, init=False)
    _violations: throttle.ViolationTracker = attrs.field(factory=throttle.ViolationTracker, init=False)
    _links: io_counters.IoIntegrator = attrs.field(factory=io_counters.IoIntegrator, init=False)

    @classmethod
    def open(
        cls,
        address: str | None = "localhost",
        *,
        host: str | None = None,
        update_interval_s: float = 1.0,
        clock: Clock = time.time_ns,
        paths: Sequence[Path] = BINDINGS_PATHS,
    ) -> DcgmSource:
        """Connect to DCGM; raises SourceUnavailable with one line when it cannot."""
        backend = DcgmBindings(address, update_interval_s=update_interval_s, paths=paths)
        return cls(backend, host or socket.gethostname(), clock)

    def __attrs_post_init__(self) -> None:
        self._previous_ns = self._clock()

    def read(self) -> Snapshot:
        now = self._clock()
        start = self._previous_ns if self._previous_ns is not None else now
        self._previous_ns = now
        try:
            values = self._backend.latest()
        except Exception as error:  # the bindings raise DCGMError subclasses we cannot name statically
            return Snapshot(errors=(GpuError(names.ErrorReason.DRIVER, f"DCGM read failed: {error}"),))
        by_gpu: dict[int, dict[int, FieldValue]] = {}
        for value in values:
            by_gpu.setdefault(value.gpu_id, {})[value.field_id] = value
        gpus = self._backend.gpus()
        results = [item for gpu in gpus for item in self._one(gpu, by_gpu.get(gpu.gpu_id, {}), start, now)]
        for tracker in (self._cycles, self._energy, self._violations, self._links):
            tracker.forget(gpu.uuid for gpu in gpus)
        return split(results)

    def _one(
        self, gpu: DcgmGpu, fields: dict[int, FieldValue], start: int, now: int
    ) -> tuple[GpuReading | GpuError, ...]:
        identity = GpuIdentity(uuid=gpu.uuid, model=gpu.model, index=gpu.gpu_id, host=self._host)
        got = FieldValues()
        for field in fields.values():
            got.add(field.field_id, field.value)
        values = got.values

        def stamp(quantity: str) -> int:
            # DCGM's own time of the value (a stale one spans 0), from whichever generation's field gave it.
            return fields[got.fields[quantity]].ts_us * 1000 or now

        # 1009-1012 are DCGM's bytes per second over its sampling period, taken for the whole read interval (the
        # read-to-read spans tile time, so nothing is counted twice or left out between reads).
        rates = io_counters.link_rates(**{link: values[link] for link in LINKS if link in values})
        links = self._links.add(gpu.uuid, rates, start, now)
        cycles: CycleCounters | None = None
        if "sm_cycles_elapsed" in values and "mma_cycles_active" in values:
            at = stamp("sm_cycles_elapsed")
            delta = self._cycles.update(
                gpu.uuid, int(values["sm_cycles_elapsed"]), int(values["mma_cycles_active"]), at
            )
            if delta is not None:
                cycles, start = delta[0], delta[1]
                now = at
        reading = GpuReading(
            gpu=identity,
            start_ns=start,
            end_ns=now,
            tensor_active=values.get("tensor_active"),
            sm_clock_hz=values.get("sm_clock_hz"),
            max_sm_clock_hz=values.get("max_sm_clock_hz"),
            sm_active=values.get("sm_active"),
            dram_active=values.get("dram_active"),
            engine_active=values.get("engine_active"),
            sm_occupancy=values.get("sm_occupancy"),
            cycles=cycles,
            **self._loss_inputs(gpu.uuid, got, stamp),
            **links,
        )
        result = reading_or_error(reading)
        if isinstance(result, GpuError):
            tensor = fields.get(names.DCGM_FI_PROF_PIPE_TENSOR_ACTIVE)
            if reading.tensor_active is None and self._backend.profiling_problem is not None:
                result = attrs.evolve(result, message=f"{result.message}: {self._backend.profiling_problem}")
            elif tensor is not None and tensor.status != 0:
                reason = _status_reason(tensor.status)
                result = attrs.evolve(result, reason=reason, message=f"{result.message} (DCGM status {tensor.status})")
        return keep_values(reading, result)  # what the GPU did give stays beside the error

    def _loss_inputs(self, key: str, got: FieldValues, stamp: Callable[[str], int]) -> dict[str, Any]:
        """Power (the energy counter's delta over its own timestamps, else 155), energy (1611 in J or 156 in mJ) and
        throttle shares (violation fields 240-245 in ns, else the one bitmask sample of field 112) as GpuReading
        fields."""
        values = got.values
        result: dict[str, Any] = {}
        observation = None
        if "energy_j" in values:
            observation = self._energy.update(key, values["energy_j"], stamp("energy_j"))
            result["energy"] = observation.energy
        result["power_w"] = throttle.interval_power(observation, values.get("power_w"))
        counters = {
            field_id: values[quantity] * names.DCGM_VIOLATION_UNIT_NS
            for field_id in names.DCGM_VIOLATION_FIELDS
            if (quantity := QUANTITY_OF_FIELD[field_id]) in values
        }
        shares: dict[str, float] = {}
        if counters:
            at = max(stamp(QUANTITY_OF_FIELD[field_id]) for field_id in counters)
            by_reason = throttle.sum_by_reason(counters, names.DCGM_VIOLATION_FIELDS)
            shares = self._violations.update(key, by_reason, at)
        bitmask = values.get("clocks_event_reasons")
        sampled = throttle.bitmask_shares([] if bitmask is None else [int(bitmask)])
        result["throttle"] = throttle.merge_shares(shares, sampled)
        return result

    def close(self) -> None:
        self._backend.close()
