"""The NVML source: per-GPU tensor activity from GPM, SM clocks sub-sampled over the interval, through pynvml.

The only module that imports pynvml. Each read covers the interval since the previous one: a GPM sample
is taken at open and at every read, and ``nvmlGpmMetricsGet`` over the last two gives the interval's
tensor pipe activity (``NVML_GPM_METRIC_ANY_TENSOR_UTIL``), engine (``GRAPHICS_UTIL``), SM and DRAM activity, SM
occupancy, PCIe and NVLink throughput, and, where the driver has them, the SM-cycles-elapsed and MMA-cycles-active
counter deltas that give the interval OFU exactly. The throughput (MiB/s between the two samples) times the
interval becomes the cumulative byte counters ``gpu.pcie.io`` and ``gpu.nvlink.io`` (``otel_ofu.io_counters``).
With MIG on, each instance's activity comes from its own GPM samples (``nvmlGpmMigSampleGet``), and the links,
which are the board's, from a sample of the whole GPU: each instance carries its share of them, as of the power.
The SM clock is an instantaneous reading, so a background thread samples it at ``clock_sample_hz``
and the read reports the mean of the samples taken within the interval: TPA and clock then describe
the same interval. Tests drive ``sample_clocks()`` themselves with the thread off.

A GPU that fails is reported as a per-GPU error and the others are read as usual. A GPU that is lost
(or whose driver goes away) has its handle and samples dropped and is re-acquired by UUID on a later
read; its first interval after that has no baseline and is reported as ``no_value``.
"""

from __future__ import annotations

import ctypes
import logging
import math
import os
import socket
import struct
import threading
import time
from collections.abc import Mapping
from typing import Any

import attrs
import pynvml

from otel_ofu import gpu_share, io_counters, names, throttle
from otel_ofu.gpu_values import say_once
from otel_ofu.model import (
    Clock,
    CycleCounters,
    EnergyCounter,
    GpuError,
    GpuIdentity,
    GpuReading,
    Snapshot,
    SourceUnavailable,
)
from otel_ofu.ofu_math import MAX_CLOCK_TOLERANCE

log = logging.getLogger(__name__)

Reason = names.ErrorReason
Code = names.NvmlReturn

NO_GPM_MESSAGE = "tensor activity unavailable: no GPM on this GPU"
MHZ = 1e6

_REASONS: dict[int, str] = {
    Code.ERROR_GPU_IS_LOST: Reason.GPU_LOST,
    Code.ERROR_RESET_REQUIRED: Reason.GPU_LOST,
    Code.ERROR_GPU_NOT_FOUND: Reason.GPU_LOST,
    Code.ERROR_NOT_SUPPORTED: Reason.NOT_SUPPORTED,
    Code.ERROR_FUNCTION_NOT_FOUND: Reason.NOT_SUPPORTED,
    Code.ERROR_NO_PERMISSION: Reason.NO_PERMISSION,
    Code.ERROR_UNINITIALIZED: Reason.DRIVER,
    Code.ERROR_DRIVER_NOT_LOADED: Reason.DRIVER,
    Code.ERROR_LIBRARY_NOT_FOUND: Reason.DRIVER,
    Code.ERROR_LIB_RM_VERSION_MISMATCH: Reason.DRIVER,
    Code.ERROR_NO_DATA: Reason.NO_VALUE,
    Code.ERROR_NOT_READY: Reason.NO_VALUE,
}
# After these the handle is not trusted: drop it and its samples, re-acquire on a later read.
_REACQUIRE = frozenset({Reason.GPU_LOST, Reason.DRIVER})

_RATE_METRICS = (
    names.NVML_GPM_METRIC_ANY_TENSOR_UTIL,
    names.NVML_GPM_METRIC_SM_UTIL,
    names.NVML_GPM_METRIC_DRAM_BW_UTIL,
    names.NVML_GPM_METRIC_GRAPHICS_UTIL,
    names.NVML_GPM_METRIC_SM_OCCUPANCY,
)
# The board's links: (transmit, receive) metric ids per link, MiB/s between the two samples.
_LINK_METRICS = {
    names.GPU_PCIE_IO.name: (names.NVML_GPM_METRIC_PCIE_TX_PER_SEC, names.NVML_GPM_METRIC_PCIE_RX_PER_SEC),
    names.GPU_NVLINK_IO.name: (
        names.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC,
        names.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC,
    ),
}
_IO_METRICS = tuple(metric for pair in _LINK_METRICS.values() for metric in pair)
_CYCLE_METRICS = (names.NVML_GPM_METRIC_SM_CYCLES_ELAPSED, names.NVML_GPM_METRIC_MMA_CYCLES_ACTIVE)


def error_reason(code: int) -> str:
    """The ``ErrorReason`` of an nvmlReturn_t code."""
    return _REASONS.get(code, Reason.UNKNOWN)


def use_library(path: str | os.PathLike[str] | None) -> None:
    """Points pynvml at the NVML shared library at ``path`` (None: back to its own ``libnvidia-ml.so.1``).

    pynvml loads its library once into the module global ``nvmlLib`` (``CDLL("libnvidia-ml.so.1")`` on
    the first ``nvmlInit`` while it is None) and caches function pointers; setting the global and
    clearing the cache is the one supported-by-construction way to swap it in-process. Used for the fake
    NVML of the tests and the demo, and for drivers installed outside the loader's search path.
    Raises OSError when the library cannot be loaded.
    """
    library = None if path is None else ctypes.CDLL(os.fspath(path))
    with pynvml.libLoadLock:
        pynvml.nvmlLib = library
        pynvml._nvmlGetFunctionPointer_cache.clear()


class _Failure(Exception):
    """An NVML call that failed, with the call named and the reason mapped."""

    def __init__(self, call: str, code: int, text: str) -> None:
        super().__init__(f"{call}: {text}")
        self.call = call
        self.code = code
        self.reason = error_reason(code)

    @property
    def message(self) -> str:
        return str(self)


def _nvml(call: str, fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except pynvml.NVMLError as exc:
        raise _Failure(call, int(exc.value), str(exc)) from exc


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _mig_profile(mig_name: str) -> str | None:
    """``NVIDIA H100 80GB HBM3 MIG 1g.10gb`` -> ``1g.10gb``."""
    _, found, profile = mig_name.rpartition(" MIG ")
    if not found:
        return None
    return profile.strip() or None


@attrs.define
class _Unit:
    """What GPM samples: a whole GPU, or one MIG GPU instance of it (with MIG on, ``_Gpu.board`` is the whole GPU
    again, sampled for its links only)."""

    identity: GpuIdentity
    gpu_instance_id: int | None = None
    mig_handle: Any = None
    samples: list[Any] = attrs.Factory(list)  # [baseline, spare]; empty without GPM
    baseline_ns: int | None = None
    ask_cycles: bool = True
    # The GPM metrics request, kept between reads: only its two samples change (see _metrics_get).
    requests: dict[tuple[int, ...], Any] = attrs.Factory(dict)


@attrs.define
class _Gpu:
    """One physical GPU as NVML enumerates it, and what the source holds for it."""

    index: int
    uuid: str | None = None
    identity: GpuIdentity | None = None
    handle: Any = None
    max_clock_hz: float | None = None
    units: list[_Unit] = attrs.Factory(list)
    board: _Unit | None = None  # with MIG on: the whole GPU, sampled for its links (the instances' share of them)
    clock_sum_mhz: float = 0.0
    clock_count: int = 0
    clock_failure: _Failure | None = None
    reasons_samples: list[int] = attrs.Factory(list)  # clocks event reasons, sampled with the clock
    # NVML calls this GPU does not support (NOT_SUPPORTED once): not asked again until re-acquired.
    unsupported: set[str] = attrs.Factory(set)

    @property
    def key(self) -> str:
        return self.uuid if self.uuid is not None else f"nvml-index-{self.index}"

    def reset_clocks(self) -> None:
        self.clock_sum_mhz, self.clock_count, self.clock_failure = 0.0, 0, None
        self.reasons_samples = []

    def release(self) -> None:
        """Frees every GPM sample of the GPU and drops its handle (until it is acquired again)."""
        _free([*self.units, *([self.board] if self.board is not None else [])])
        self.handle, self.units, self.board = None, [], None


@attrs.frozen
class _Gpm:
    """The interval values one metrics-get gave for a unit."""

    tensor_active: float | None
    sm_active: float | None
    dram_active: float | None
    engine_active: float | None
    sm_occupancy: float | None
    cycles: CycleCounters | None
    tensor_problem: _Failure | None
    link_rates: io_counters.Rates  # bytes per second by link metric and direction; empty for a MIG instance


class NvmlSource:
    """Counter source reading every GPU on this host through NVML; implements ``otel_ofu.model.Source``.

    Opening initialises NVML, discovers the GPUs and takes the first GPM samples; it raises
    ``SourceUnavailable`` (one line) when NVML cannot start or sees no GPU. ``library`` points pynvml at
    another NVML shared library first (see ``use_library``: this is process-wide). ``clock_sample_hz``
    is the SM clock sub-sampling rate of the background thread (0 or ``background=False``: no thread;
    each read then samples the clock once unless ``sample_clocks()`` was called within the interval).
    """

    name = "nvml"

    def __init__(
        self,
        host: str | None = None,
        *,
        clock_sample_hz: float = 10.0,
        clock: Clock = time.time_ns,
        background: bool = True,
        library: str | os.PathLike[str] | None = None,
    ) -> None:
        if not math.isfinite(clock_sample_hz) or clock_sample_hz < 0:
            raise ValueError(f"clock_sample_hz must be >= 0, got {clock_sample_hz!r}")
        self.host = host if host is not None else socket.gethostname()
        self._clock = clock
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._gpus: list[_Gpu] = []
        self._energy = throttle.EnergyTracker()
        self._violations = throttle.ViolationTracker()
        self._links = io_counters.IoIntegrator()
        self._open(library)
        if background and clock_sample_hz > 0:
            self._thread = threading.Thread(
                target=self._sample_loop, args=(1.0 / clock_sample_hz,), name="otel-ofu-nvml-clocks", daemon=True
            )
            self._thread.start()

    # --- opening ---------------------------------------------------------------------------------

    def _open(self, library: str | os.PathLike[str] | None) -> None:
        if library is not None:
            try:
                use_library(library)
            except OSError as exc:
                raise SourceUnavailable(f"NVML unavailable: cannot load {os.fspath(library)!r}: {exc}") from None
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise SourceUnavailable(_init_failure(int(exc.value), str(exc))) from None
        try:
            count = int(_nvml("nvmlDeviceGetCount", pynvml.nvmlDeviceGetCount))
            if count == 0:
                raise SourceUnavailable("NVML unavailable: the driver sees no GPUs on this host")
            driver = _text(_nvml("nvmlSystemGetDriverVersion", pynvml.nvmlSystemGetDriverVersion))
            now = self._clock()
            for index in range(count):
                gpu = _Gpu(index)
                self._gpus.append(gpu)
                try:
                    self._acquire(gpu, now)
                except _Failure as failure:
                    log.warning("NVML GPU %d not available yet (%s); retried on every read", index, failure)
            log.info("NVML source: driver %s, %d GPU(s)", driver, count)
        except _Failure as failure:
            self._shutdown()
            raise SourceUnavailable(f"NVML unavailable: {failure}") from None
        except BaseException:
            self._shutdown()
            raise

    def _acquire(self, gpu: _Gpu, now: int) -> None:
        """Gets a handle, the identity, the max clock, GPM support and MIG instances; takes baselines."""
        if gpu.uuid is not None:
            handle = _nvml("nvmlDeviceGetHandleByUUID", pynvml.nvmlDeviceGetHandleByUUID, gpu.uuid)
        else:
            handle = _nvml("nvmlDeviceGetHandleByIndex", pynvml.nvmlDeviceGetHandleByIndex, gpu.index)
        uuid = _text(_nvml("nvmlDeviceGetUUID", pynvml.nvmlDeviceGetUUID, handle))
        model = _text(_nvml("nvmlDeviceGetName", pynvml.nvmlDeviceGetName, handle))
        index = int(_nvml("nvmlDeviceGetIndex", pynvml.nvmlDeviceGetIndex, handle))
        identity = GpuIdentity(uuid=uuid, model=model, index=index, host=self.host)
        max_clock_hz = self._max_clock(handle)
        units = self._units(handle, identity) if self._gpm_supported(handle) else [_Unit(identity)]
        board: _Unit | None = None
        try:
            board = self._board(handle, identity) if units[0].gpu_instance_id is not None else None
            for unit in units:
                if unit.samples:
                    self._sample(handle, unit, unit.samples[0])
                unit.baseline_ns = now
        except _Failure:
            _free([*units, *([board] if board is not None else [])])
            raise
        gpu.uuid, gpu.identity, gpu.handle, gpu.max_clock_hz, gpu.units = uuid, identity, handle, max_clock_hz, units
        gpu.board = board
        if board is not None:
            board.baseline_ns = now
        gpu.index = index
        gpu.unsupported = set()
        gpu.reset_clocks()
        try:
            self._loss_inputs(gpu, now)  # baselines of the energy and violation counters
        except _Failure as failure:
            log.debug("NVML GPU %s: no power or throttle baseline yet: %s", gpu.key, failure)

    def _max_clock(self, handle: Any) -> float | None:
        try:
            mhz = _nvml("nvmlDeviceGetMaxClockInfo", pynvml.nvmlDeviceGetMaxClockInfo, handle, names.NVML_CLOCK_SM)
        except _Failure as failure:
            if failure.reason in _REACQUIRE:
                raise
            return None  # the catalog's board clock stands in (gpu_values.compute says so)
        return float(mhz) * MHZ if mhz else None

    def _gpm_supported(self, handle: Any) -> bool:
        try:
            support = _nvml("nvmlGpmQueryDeviceSupport", pynvml.nvmlGpmQueryDeviceSupport, handle)
        except _Failure as failure:
            if failure.reason in _REACQUIRE:
                raise
            return False  # older drivers lack the call altogether
        return bool(support.isSupportedDevice)

    def _units(self, handle: Any, identity: GpuIdentity) -> list[_Unit]:
        """The GPM units of a GPU with GPM: its MIG instances when MIG is on, else the GPU itself."""
        units = [_Unit(mig.identity, mig.gpu_instance_id, mig.mig_handle) for mig in self._mig_units(handle, identity)]
        if not units:
            units = [_Unit(identity)]
        try:
            for unit in units:
                for _ in range(2):
                    unit.samples.append(_nvml("nvmlGpmSampleAlloc", pynvml.nvmlGpmSampleAlloc))
        except _Failure:
            _free(units)
            raise
        return units

    def _board(self, handle: Any, identity: GpuIdentity) -> _Unit | None:
        """With MIG on, the whole GPU as a GPM unit for its links (its first sample taken); None where the driver
        gives no whole-GPU sample then: the instances' link counters are left out, said once."""
        board = _Unit(identity)
        try:
            board.samples = [_nvml("nvmlGpmSampleAlloc", pynvml.nvmlGpmSampleAlloc) for _ in range(2)]
            self._sample(handle, board, board.samples[0])
        except _Failure as failure:
            _free([board])
            if failure.reason in _REACQUIRE:
                raise
            say_once(
                f"NVML on {identity.uuid}: no GPM sample of the whole GPU with MIG on ({failure}): its instances "
                "carry no NVLink or PCIe traffic"
            )
            return None
        return board

    def _mig_units(self, handle: Any, identity: GpuIdentity) -> list[_Unit]:
        try:
            current, _pending = _nvml("nvmlDeviceGetMigMode", pynvml.nvmlDeviceGetMigMode, handle)
        except _Failure as failure:
            if failure.reason in _REACQUIRE:
                raise
            return []  # not MIG capable
        if int(current) != 1:
            return []
        count = int(_nvml("nvmlDeviceGetMaxMigDeviceCount", pynvml.nvmlDeviceGetMaxMigDeviceCount, handle))
        units = []
        for slot in range(count):
            try:
                mig = _nvml(
                    "nvmlDeviceGetMigDeviceHandleByIndex", pynvml.nvmlDeviceGetMigDeviceHandleByIndex, handle, slot
                )
            except _Failure as failure:
                if failure.code in (Code.ERROR_NOT_FOUND, Code.ERROR_INVALID_ARGUMENT):
                    continue  # an empty slot
                raise
            instance = int(_nvml("nvmlDeviceGetGpuInstanceId", pynvml.nvmlDeviceGetGpuInstanceId, mig))
            profile = _mig_profile(_text(_nvml("nvmlDeviceGetName", pynvml.nvmlDeviceGetName, mig)))
            mig_identity = attrs.evolve(identity, mig_profile=profile, mig_instance_id=instance)
            units.append(_Unit(mig_identity, instance, mig))
        return units

    # --- reading ---------------------------------------------------------------------------------

    def sample_clocks(self) -> None:
        """Takes one SM clock sample of every GPU into the current interval's average (the thread calls it)."""
        with self._lock:
            for gpu in self._gpus:
                if gpu.handle is None:
                    continue
                try:
                    mhz = _sm_clock_mhz(gpu.handle)
                except _Failure as failure:
                    gpu.clock_failure = failure
                    continue
                gpu.clock_sum_mhz += mhz
                gpu.clock_count += 1
                try:
                    reasons = _optional(gpu, "nvmlDeviceGetCurrentClocksEventReasons", _event_reasons, gpu.handle)
                except _Failure as failure:  # the GPU is gone: the read re-acquires it
                    gpu.clock_failure = failure
                    continue
                if reasons is not None:
                    gpu.reasons_samples.append(int(reasons))

    def read(self) -> Snapshot:
        readings: list[GpuReading] = []
        errors: list[GpuError] = []
        with self._lock:
            if self._closed:
                raise RuntimeError("NVML source is closed")
            now = self._clock()
            for gpu in self._gpus:
                if gpu.handle is None:
                    errors.append(self._reacquire(gpu, now))
                    continue
                try:
                    gpu_readings, gpu_errors = self._read_gpu(gpu, now)
                except _Failure as failure:
                    gpu.release()
                    gpu.reset_clocks()
                    errors.append(GpuError(failure.reason, failure.message, gpu=gpu.identity, gpu_key=gpu.key))
                    continue
                readings.extend(gpu_readings)
                errors.extend(gpu_errors)
        return Snapshot(readings=tuple(readings), errors=tuple(errors))

    def _reacquire(self, gpu: _Gpu, now: int) -> GpuError:
        try:
            self._acquire(gpu, now)
        except _Failure as failure:
            return GpuError(failure.reason, failure.message, gpu=gpu.identity, gpu_key=gpu.key)
        log.info("NVML GPU %s acquired", gpu.key)
        return GpuError(
            Reason.NO_VALUE, "GPU acquired: its first interval starts now", gpu=gpu.identity, gpu_key=gpu.key
        )

    def _loss_inputs(self, gpu: _Gpu, now: int) -> dict[str, Any]:
        """Power, energy and throttle shares of the interval ending now (GpuReading fields); the energy and
        violation counters' deltas span from their previous read. Raises ``_Failure`` when the GPU is gone."""
        handle, key = gpu.handle, gpu.key
        fields: dict[str, Any] = {}
        observation = None
        millijoules = _optional(
            gpu, "nvmlDeviceGetTotalEnergyConsumption", pynvml.nvmlDeviceGetTotalEnergyConsumption, handle
        )
        if millijoules is not None:
            observation = self._energy.update(key, float(millijoules) / 1000.0, now)
            fields["energy"] = observation.energy
        milliwatts = None
        if observation is None or observation.power_w is None:
            milliwatts = _optional(gpu, "nvmlDeviceGetPowerUsage", pynvml.nvmlDeviceGetPowerUsage, handle)
        fields["power_w"] = throttle.interval_power(observation, None if milliwatts is None else milliwatts / 1000.0)
        counters: dict[int, float] = {}
        for policy in names.NVML_VIOLATION_POLICIES:
            status = _optional(
                gpu, f"nvmlDeviceGetViolationStatus/{policy}", pynvml.nvmlDeviceGetViolationStatus, handle, policy
            )
            if status is not None:
                counters[policy] = float(status.violationTime)
        by_reason = throttle.sum_by_reason(counters, names.NVML_VIOLATION_POLICIES)
        counter_shares = self._violations.update(key, by_reason, now) if by_reason else {}
        reasons = gpu.reasons_samples
        if not reasons:  # no sample in the interval (no sampler thread): one taken now
            sample = _optional(gpu, "nvmlDeviceGetCurrentClocksEventReasons", _event_reasons, handle)
            reasons = [] if sample is None else [int(sample)]
        fields["throttle"] = throttle.merge_shares(counter_shares, throttle.bitmask_shares(reasons))
        return fields

    def _read_gpu(self, gpu: _Gpu, now: int) -> tuple[list[GpuReading], list[GpuError]]:
        """The GPU's readings and per-unit errors; raises ``_Failure`` when the GPU itself is gone."""
        loss_inputs = self._loss_inputs(gpu, now)
        if gpu.board is not None:
            loss_inputs.update(self._board_links(gpu, gpu.board, now))  # shared out below, as the power is
        clock_hz, clock_problem = self._interval_clock(gpu)
        readings: list[GpuReading] = []
        errors: list[GpuError] = []
        for unit in gpu.units:
            start_ns = unit.baseline_ns if unit.baseline_ns is not None else now
            gpm: _Gpm | None = None
            problem: tuple[str, str] | None = None
            if not unit.samples:
                unit.baseline_ns = now
                problem = (Reason.NOT_SUPPORTED, NO_GPM_MESSAGE)
            else:
                try:
                    gpm = self._gpm_interval(gpu, unit, now)
                except _Failure as failure:
                    if failure.reason in _REACQUIRE:
                        raise
                    problem = (failure.reason, f"tensor activity unavailable: {failure}")
            links = (
                self._links.add(unit.identity.key, gpm.link_rates, start_ns, now)
                if gpm is not None
                else io_counters.LinkFields()
            )
            cycles = gpm.cycles if gpm is not None else None
            if cycles is not None:
                cycles = _plausible_cycles(cycles, (now - start_ns) / 1e9, gpu.max_clock_hz, unit.identity)
            if problem is None and gpm is not None and cycles is None:
                if gpm.tensor_problem is not None:
                    tensor = gpm.tensor_problem
                    problem = (tensor.reason, f"tensor activity unavailable: {tensor}")
                elif clock_problem is not None:
                    problem = (clock_problem.reason, f"SM clock unavailable: {clock_problem}")
            readings.append(
                GpuReading(
                    gpu=unit.identity,
                    start_ns=start_ns,
                    end_ns=now,
                    tensor_active=gpm.tensor_active if gpm is not None else None,
                    sm_clock_hz=clock_hz,
                    max_sm_clock_hz=gpu.max_clock_hz,
                    sm_active=gpm.sm_active if gpm is not None else None,
                    dram_active=gpm.dram_active if gpm is not None else None,
                    engine_active=gpm.engine_active if gpm is not None else None,
                    sm_occupancy=gpm.sm_occupancy if gpm is not None else None,
                    cycles=cycles,
                    # The clock and its throttling are GPU-wide, like the SM clock; power, energy and the links are
                    # the board's, and a MIG instance carries its share of them (the instances add up to the board).
                    **(loss_inputs if unit.gpu_instance_id is None else _instance_share(loss_inputs, unit.identity)),
                    **links,
                )
            )
            if problem is not None:
                errors.append(GpuError(problem[0], problem[1], gpu=unit.identity, gpu_key=unit.identity.key))
        return readings, errors

    def _interval_clock(self, gpu: _Gpu) -> tuple[float | None, _Failure | None]:
        """Mean SM clock (Hz) of the interval's samples, one taken now when there were none."""
        if gpu.clock_failure is not None and gpu.clock_failure.reason in _REACQUIRE:
            raise gpu.clock_failure
        total, count = gpu.clock_sum_mhz, gpu.clock_count
        gpu.reset_clocks()
        if count == 0:
            try:
                total = _sm_clock_mhz(gpu.handle)
                count = 1
            except _Failure as failure:
                if failure.reason in _REACQUIRE:
                    raise
                return None, failure
        return total / count * MHZ, None

    def _sample(self, handle: Any, unit: _Unit, sample: Any) -> None:
        if unit.gpu_instance_id is None:
            _nvml("nvmlGpmSampleGet", pynvml.nvmlGpmSampleGet, handle, sample)
        else:
            _nvml("nvmlGpmMigSampleGet", pynvml.nvmlGpmMigSampleGet, handle, unit.gpu_instance_id, sample)

    def _board_links(self, gpu: _Gpu, board: _Unit, now: int) -> io_counters.LinkFields:
        """The board's link counters over the interval (GpuReading fields), from a sample of the whole GPU; none
        when the sample or the metrics cannot be had this interval (the counters keep their value)."""
        baseline, spare = board.samples
        start_ns = board.baseline_ns if board.baseline_ns is not None else now
        try:
            self._sample(gpu.handle, board, spare)
        except _Failure as failure:
            if failure.reason in _REACQUIRE:
                raise
            log.debug("NVML GPU %s: no whole-GPU GPM sample for the links: %s", gpu.key, failure)
            return io_counters.LinkFields()
        board.samples, board.baseline_ns = [spare, baseline], now
        try:
            results = _metrics_get(board, baseline, spare, _IO_METRICS)
        except _Failure as failure:
            if failure.reason in _REACQUIRE:
                raise
            log.debug("NVML GPU %s: no link metrics: %s", gpu.key, failure)
            return io_counters.LinkFields()
        return self._links.add(gpu.key, _link_rates(results), start_ns, now)

    def _gpm_interval(self, gpu: _Gpu, unit: _Unit, now: int) -> _Gpm:
        """Samples into the spare buffer and gets the metrics between it and the baseline, which it replaces."""
        baseline, spare = unit.samples
        self._sample(gpu.handle, unit, spare)
        # The new sample is the next baseline whatever the metrics call says: the interval has ended.
        unit.samples = [spare, baseline]
        unit.baseline_ns = now
        # A MIG instance's own sample has no links of its own: they are the board's (see _board_links).
        rates = _RATE_METRICS + (_IO_METRICS if unit.gpu_instance_id is None else ())
        metrics = rates + (_CYCLE_METRICS if unit.ask_cycles else ())
        try:
            results = _metrics_get(unit, baseline, spare, metrics)
        except _Failure as failure:
            if not unit.ask_cycles or failure.code not in (Code.ERROR_INVALID_ARGUMENT, Code.ERROR_NOT_SUPPORTED):
                raise
            # Drivers that predate the cycle-counter metric ids may reject the whole request.
            unit.ask_cycles = False
            say_once(f"NVML on {gpu.key} rejects the GPM cycle-counter metrics ({failure}); using tensor utilisation")
            results = _metrics_get(unit, baseline, spare, rates)

        def ratio(metric: int) -> float | None:
            code, value = results[metric]
            return value / 100.0 if code == Code.SUCCESS else None

        tensor_code, _ = results[names.NVML_GPM_METRIC_ANY_TENSOR_UTIL]
        tensor_problem = None
        if tensor_code != Code.SUCCESS:
            tensor_problem = _Failure("GPM metric ANY_TENSOR_UTIL", tensor_code, _error_text(tensor_code))
        cycles = None
        if unit.ask_cycles:
            (elapsed_code, elapsed), (mma_code, mma) = (results[metric] for metric in _CYCLE_METRICS)
            if elapsed_code == Code.SUCCESS and mma_code == Code.SUCCESS:
                cycles = CycleCounters(sm_cycles_elapsed=round(elapsed), mma_cycles_active=round(mma))
        return _Gpm(
            tensor_active=ratio(names.NVML_GPM_METRIC_ANY_TENSOR_UTIL),
            sm_active=ratio(names.NVML_GPM_METRIC_SM_UTIL),
            dram_active=ratio(names.NVML_GPM_METRIC_DRAM_BW_UTIL),
            engine_active=ratio(names.NVML_GPM_METRIC_GRAPHICS_UTIL),
            sm_occupancy=ratio(names.NVML_GPM_METRIC_SM_OCCUPANCY),
            cycles=cycles,
            tensor_problem=tensor_problem,
            link_rates=_link_rates(results) if unit.gpu_instance_id is None else {},
        )

    # --- attribution and identity ----------------------------------------------------------------

    def identities(self) -> tuple[GpuIdentity, ...]:
        """The GPUs and MIG instances currently acquired."""
        with self._lock:
            return tuple(unit.identity for gpu in self._gpus for unit in gpu.units)

    def compute_pids(self, gpu: GpuIdentity) -> tuple[int, ...]:
        """PIDs of the compute processes on a GPU or MIG instance (empty when unknown or unreadable)."""
        with self._lock:
            handle = None
            for candidate in self._gpus:
                if candidate.uuid != gpu.uuid or candidate.handle is None:
                    continue
                handle = candidate.handle
                if gpu.mig_instance_id is not None:
                    migs = [unit for unit in candidate.units if unit.gpu_instance_id == gpu.mig_instance_id]
                    handle = migs[0].mig_handle if migs else None
            if handle is None:
                return ()
            try:
                processes = _nvml(
                    "nvmlDeviceGetComputeRunningProcesses", pynvml.nvmlDeviceGetComputeRunningProcesses, handle
                )
            except _Failure as failure:
                log.debug("no compute processes for %s: %s", gpu.key, failure)
                return ()
        return tuple(sorted({int(process.pid) for process in processes}))

    # --- closing ---------------------------------------------------------------------------------

    def _sample_loop(self, period_s: float) -> None:
        while not self._stop.wait(period_s):
            try:
                self.sample_clocks()
            except Exception:  # the sampler must outlive anything one call does
                log.exception("NVML clock sampling failed")

    def close(self) -> None:
        """Stops the sampler, frees the GPM samples and shuts NVML down. Idempotent."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._shutdown()

    def _shutdown(self) -> None:
        for gpu in self._gpus:
            gpu.release()
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError as exc:
            log.debug("nvmlShutdown: %s", exc)

    def __enter__(self) -> NvmlSource:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def _init_failure(code: int, text: str) -> str:
    if code == Code.ERROR_LIBRARY_NOT_FOUND:
        return "NVML unavailable: libnvidia-ml.so.1 not found (no NVIDIA driver on this host)"
    if code == Code.ERROR_DRIVER_NOT_LOADED:
        return "NVML unavailable: the NVIDIA driver is not loaded"
    return f"NVML unavailable: nvmlInit failed: {text}"


def _sm_clock_mhz(handle: Any) -> float:
    return float(_nvml("nvmlDeviceGetClockInfo", pynvml.nvmlDeviceGetClockInfo, handle, names.NVML_CLOCK_SM))


def _event_reasons(handle: Any) -> int:
    """The clocks event reasons bitmask; drivers before the 'event' rename have only the throttle call."""
    try:
        return int(pynvml.nvmlDeviceGetCurrentClocksEventReasons(handle))
    except pynvml.NVMLError_FunctionNotFound:
        return int(pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle))


def _optional(gpu: _Gpu, call: str, fn: Any, *args: Any) -> Any:
    """An optional reading (power, energy, throttling): None when not there, never an error of the GPU.

    NOT_SUPPORTED is remembered so the call is not made again; a lost GPU or driver raises as any call.
    """
    if call in gpu.unsupported:
        return None
    try:
        return _nvml(call, fn, *args)
    except _Failure as failure:
        if failure.reason in _REACQUIRE:
            raise
        if failure.reason == Reason.NOT_SUPPORTED:
            gpu.unsupported.add(call)
        else:
            log.debug("NVML %s on %s: %s", call, gpu.key, failure)
        return None


def _error_text(code: int) -> str:
    return str(pynvml.NVMLError(code))


# Where NVML writes each metric's return code and value in the request, from pynvml's own declaration of
# nvmlGpmMetric_t: the results are read from the request's memory in one unpack per metric, not field by field.
_METRIC_SIZE = ctypes.sizeof(pynvml.c_nvmlGpmMetric_t)
_METRIC_RESULT = struct.Struct("=Id")  # nvmlReturn (unsigned int), value (double), adjacent in nvml.h
_METRIC_RESULT_AT = pynvml.c_nvmlGpmMetric_t.nvmlReturn.offset
if pynvml.c_nvmlGpmMetric_t.value.offset != _METRIC_RESULT_AT + 4:  # a pynvml whose nvml.h differs from ours
    raise ImportError("pynvml's nvmlGpmMetric_t has no value right after nvmlReturn: this NVML source cannot read it")


def _metrics_get(unit: _Unit, baseline: Any, current: Any, metrics: tuple[int, ...]) -> dict[int, tuple[int, float]]:
    """metric id -> (its own nvmlReturn, value) over the two samples.

    The request (version, metric ids) is built once per unit and metric list and reused: every field
    of a pynvml structure is set and read through Python code, and NVML writes each requested metric's
    return code and value on every call, which are read back from the request's memory."""
    cached = unit.requests.get(metrics)
    if cached is None:
        request = pynvml.c_nvmlGpmMetricsGet_t()
        request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(metrics)
        entries = request.metrics  # a view of the request's own memory
        for slot, metric in enumerate(metrics):
            entries[slot].metricId = metric
        cached = unit.requests[metrics] = (request, memoryview(entries).cast("B"))
    request, memory = cached
    request.sample1 = baseline
    request.sample2 = current
    _nvml("nvmlGpmMetricsGet", pynvml.nvmlGpmMetricsGet, request)
    results: dict[int, tuple[int, float]] = {}
    for slot, metric in enumerate(metrics):
        code, value = _METRIC_RESULT.unpack_from(memory, slot * _METRIC_SIZE + _METRIC_RESULT_AT)
        if code == Code.SUCCESS and not math.isfinite(value):
            code = Code.ERROR_NO_DATA
        results[metric] = (code, value)
    return results


def _link_rates(results: Mapping[int, tuple[int, float]]) -> dict[str, dict[str, float | None]]:
    """Bytes per second by link and direction from the GPM results (MiB/s); a metric that failed is None."""

    def rate(metric: int) -> float | None:
        code, value = results.get(metric, (Code.ERROR_NOT_SUPPORTED, 0.0))
        return value * names.NVML_GPM_BYTES_PER_UNIT if code == Code.SUCCESS else None

    transmit, receive = names.IoDirection.TRANSMIT, names.IoDirection.RECEIVE
    return {link: {transmit: rate(tx), receive: rate(rx)} for link, (tx, rx) in _LINK_METRICS.items()}


def _plausible_cycles(
    cycles: CycleCounters, elapsed_s: float, max_clock_hz: float | None, gpu: GpuIdentity
) -> CycleCounters | None:
    """The counters when they can describe one clock domain over the interval, else None (TPA used).

    Their semantics (one SM clock domain vs summed over SMs) are unconfirmed on hardware; counters that
    would imply a clock above the max would turn every reading invalid, so they are set aside instead.
    """
    elapsed, mma = cycles.sm_cycles_elapsed, cycles.mma_cycles_active
    if elapsed <= 0 or mma < 0 or mma > elapsed or elapsed_s <= 0:
        say_once(f"GPM cycle counters of {gpu.key} are inconsistent (elapsed {elapsed}, mma {mma}): not used")
        return None
    implied_hz = elapsed / elapsed_s
    if max_clock_hz is not None and implied_hz > max_clock_hz * (1.0 + MAX_CLOCK_TOLERANCE):
        say_once(
            f"GPM SM cycles of {gpu.key} imply {implied_hz / MHZ:.0f} MHz, above the max clock "
            f"{max_clock_hz / MHZ:.0f} MHz: counters not used, tensor utilisation is"
        )
        return None
    return cycles


def _free(units: list[_Unit]) -> None:
    for unit in units:
        for sample in unit.samples:
            try:
                pynvml.nvmlGpmSampleFree(sample)
            except pynvml.NVMLError as exc:
                log.debug("nvmlGpmSampleFree: %s", exc)
        unit.samples = []


def _instance_share(board: Mapping[str, Any], instance: GpuIdentity) -> dict[str, Any]:
    """A MIG instance's loss inputs: the GPU's throttling as is, the board's power, energy and link counters times
    the instance's share of the GPU (``otel_ofu.gpu_share``: its profile's compute slices of the model's). A
    cumulative counter times a constant share is the share's counter, with the board counter's start."""
    if instance.mig_profile is None or gpu_share.mig_slices(instance.mig_profile) is None:
        # An instance that cannot be sized leaves the board out rather than count it whole once per instance.
        return {"throttle": board["throttle"]}
    share = gpu_share.gpu_share(instance.model, instance.mig_profile)
    if gpu_share.assumed_slices(instance.model, instance.mig_profile):
        say_once(
            f"MIG profile {instance.mig_profile!r} of {instance.model!r}: the catalog has no compute-slice count for "
            f"the model, so its power and energy are shared as {gpu_share.DEFAULT_MIG_SLICES} slices'"
        )
    power, energy = board.get("power_w"), board.get("energy")
    return {
        "throttle": board["throttle"],
        "power_w": None if power is None else power * share,
        "energy": None if energy is None else EnergyCounter(energy.joules * share, energy.start_ns),
        **{
            field: io_counters.scaled(board[field], share)
            for field in io_counters.READING_FIELDS.values()
            if field in board
        },
    }
