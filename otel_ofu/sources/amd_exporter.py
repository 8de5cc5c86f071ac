"""The AMD Device Metrics Exporter (ROCm/device-metrics-exporter) over HTTP: AMD Instinct GPUs and their compute
partitions, one scrape per read.

OFU's inputs, from its documented fields (its metrics list and the rocprofiler derived counters behind them):

- tensor activity: ``gpu_prof_tensor_active_percent`` is rocprofiler's ``MfmaUtil``, the MFMA (matrix core) busy
  cycles summed over SIMDs / (GPU-active cycles ``GRBM_GUI_ACTIVE`` x SIMDs): a share of the cycles the GPU was
  *active*, where NVIDIA's tensor pipe activity is a share of *all* cycles. ``gpu_prof_gui_util_percent``
  (``GPU_UTIL`` = GRBM_GUI_ACTIVE / GRBM_COUNT, the free-running cycles) converts it: TPA = MfmaUtil x GPU_UTIL.
  Without the second field the first would read a GPU busy half the interval at full MFMA rate as 100 %: such a
  GPU gets no OFU, and the error names the field to turn on (both are in the exporter's default field list);
- the engine clock: ``gpu_clock{clock_type="system"}`` in MHz (one series per clock domain on a multi-XCD GPU:
  their mean); its max, ``gpu_max_clock{clock_type="system"}``, else the catalog's peak engine clock;
- power ``gpu_power_usage`` (W; ``gpu_package_power`` where it is absent) and energy ``gpu_energy_consumed`` (uJ);
- engine activity (``gpu.engine.active``): ``GPU_UTIL`` itself, the share of cycles the graphics engine was busy,
  counted over the same profiler window as the MFMA activity, as DCGM's field 1001 is. There is no SM activity or
  occupancy in NVIDIA's sense (``gpu_prof_sm_active`` is VALU busy time), and no link traffic is read.

The profiler fields are off unless the exporter's ``ProfilerMetrics`` are on, and real pages come without
``gpu_prof_gui_util_percent``. There, on a whole GPU, ``gpu_gfx_activity`` (the SMI's GFX busy share, on by default)
stands in for it, as the GPU's active share and its engine activity, and the producer says once that it did: it is the
power-management firmware's own figure (the SMU metrics table's ``average_gfx_activity``), averaged on the firmware's
time base and read as a point at the scrape, so it describes the interval less exactly than GPU_UTIL. A compute
partition gets no stand-in (the SMI reports the whole GPU's activity, on partition 0). MFMA activity 0 is tensor
activity 0 whatever else the page lacks: no MFMA cycles, no tensor work.

Labels to identity: ``gpu_uuid`` -> hw.id, ``card_series`` -> hw.model, ``hostname`` -> host.name, ``gpu_id`` ->
gpu.index, ``gpu_compute_partition_type`` -> gpu.compute_partition, hw.vendor ``amd``; ``pod``, ``namespace``,
``container`` and ``job_id`` (its Slurm integration) are attribution hints, as dcgm-exporter's are.

Compute partitions (DPX, TPX, QPX, CPX): each partition is a device of its own (its own ``gpu_uuid`` and
``gpu_id``); the exporter reports the physical GPU's clocks, power and energy on the partition with
``gpu_partition_id`` 0 only (the others print a power of 0: there is no per-XCD sensor) and names the GPU by its
``serial_number`` on every partition. So a partition takes the clocks of its GPU's partition 0, and its power and
energy are the board's times its share of the GPU (``otel_ofu.gpu_share``): the partitions of a GPU add up to the
board, and nothing is counted twice. A partition whose share cannot be sized (a model the catalog does not know
in CPX) gets no power or energy, rather than the whole board's once per partition.
"""

from __future__ import annotations

import math
import time
import urllib.parse
from collections.abc import Iterator, Mapping
from typing import Any

import attrs

from otel_ofu import gpu_share, names, throttle
from otel_ofu.gpu_values import say_once
from otel_ofu.model import Clock, GpuError, GpuIdentity, GpuReading, Snapshot
from otel_ofu.sources import keep_values, prometheus_text
from otel_ofu.sources.dcgm import split
from otel_ofu.sources.exporter_page import page_summary
from otel_ofu.sources.prometheus_text import ScrapeError, label

UUID_LABEL = "gpu_uuid"
MODEL_LABELS = ("card_series", "card_model")  # card_model is a part number; it falls back to the series itself
HOST_LABEL = "hostname"
GPU_ID_LABEL = "gpu_id"
PARTITION_TYPE_LABEL = "gpu_compute_partition_type"
PARTITION_ID_LABEL = "gpu_partition_id"
SERIAL_LABEL = "serial_number"
CLOCK_TYPE_LABEL = "clock_type"
HINT_LABELS: Mapping[str, tuple[str, ...]] = {
    names.K8S_POD_NAME: ("pod",),
    names.K8S_NAMESPACE_NAME: ("namespace",),
    names.K8S_CONTAINER_NAME: ("container",),
    names.K8S_POD_UID: ("pod_uuid",),
    names.JOB_ID: ("job_id",),  # its Slurm integration's label; Prometheus's own "job" label is not a job
}
WHOLE_GPU = "spx"

# Exporter metric -> the value it feeds; the clocks are lists (one series per clock domain).
FIELDS: Mapping[str, str] = {
    names.AMD_EXPORTER_MFMA_ACTIVE: "mfma_percent",
    names.AMD_EXPORTER_GPU_ACTIVE: "active_percent",
    names.AMD_EXPORTER_GFX_ACTIVITY: "gfx_percent",
    names.AMD_EXPORTER_POWER_USAGE: "power_w",
    names.AMD_EXPORTER_PACKAGE_POWER: "package_power_w",
    names.AMD_EXPORTER_ENERGY: "energy_uj",
}
CLOCKS: Mapping[str, str] = {names.AMD_EXPORTER_CLOCK: "clocks_mhz", names.AMD_EXPORTER_MAX_CLOCK: "max_clocks_mhz"}
_NOT_APPLICABLE = frozenset(float(value) for value in names.AMD_NOT_APPLICABLE)
_KNOWN = (*FIELDS, *CLOCKS)


def normalize_url(url: str) -> str:
    """``host:5000`` -> ``http://host:5000/metrics``; anything but http(s) is refused in one line."""
    return prometheus_text.normalize_url(url, "AMD Device Metrics Exporter", "http://HOST:5000/metrics")


def amd_number(value: float) -> float | None:
    """A value, or None where the exporter means "not applicable" (its sentinels), NaN or infinite."""
    if not math.isfinite(value) or value in _NOT_APPLICABLE:
        return None
    return value


@attrs.define
class _Entry:
    """What one scrape says about one device (a whole GPU or one compute partition)."""

    labels: dict[str, str]
    values: dict[str, float] = attrs.field(factory=dict)
    clocks_mhz: list[float] = attrs.field(factory=list)
    max_clocks_mhz: list[float] = attrs.field(factory=list)

    @property
    def partition_mode(self) -> str | None:
        mode = label(self.labels, (PARTITION_TYPE_LABEL,))
        return mode.strip().lower() if mode else None

    @property
    def partitioned(self) -> bool:
        return self.partition_mode not in (None, WHOLE_GPU)

    @property
    def primary(self) -> bool:
        """Partition 0 of its GPU, which carries the GPU's clocks, power and energy (a whole GPU is its own)."""
        return not self.partitioned or label(self.labels, (PARTITION_ID_LABEL,)) == "0"

    def board_key(self) -> tuple[str, str] | None:
        """Which physical GPU a partition is of: its host and serial number (None without a serial)."""
        serial = label(self.labels, (SERIAL_LABEL,))
        return None if serial is None else (label(self.labels, (HOST_LABEL,)) or "", serial)


def parse_exposition(text: str) -> dict[str, _Entry]:
    """Devices keyed by ``gpu_uuid`` from exposition text; ScrapeError when it is not parseable."""
    return entries_of(prometheus_text.parse_samples(text))


def _unprefixed(name: str) -> str:
    """A metric's name without the exporter's MetricsFieldPrefix (``amd_gpu_clock`` -> ``gpu_clock``)."""
    if name in FIELDS or name in CLOCKS:
        return name
    return next((known for known in _KNOWN if name.endswith("_" + known)), name)


def entries_of(samples: list[prometheus_text.Sample]) -> dict[str, _Entry]:
    """Devices keyed by ``gpu_uuid`` from a page's samples."""
    entries: dict[str, _Entry] = {}
    for sample in samples:
        uuid = label(sample.labels, (UUID_LABEL,))
        if uuid is None:
            continue  # not a GPU series (or the GPU_UUID label is off): no identity to report it under
        entry = entries.setdefault(uuid, _Entry(dict(sample.labels)))
        value = amd_number(sample.value)
        if value is None:
            continue
        name = _unprefixed(sample.name)
        if name in CLOCKS:
            if sample.labels.get(CLOCK_TYPE_LABEL) == names.AMD_EXPORTER_ENGINE_CLOCK_TYPE and value > 0:
                getattr(entry, CLOCKS[name]).append(value)
        elif name in FIELDS:
            entry.values.setdefault(FIELDS[name], value)
    return entries


def _percent(what: str, value: float | None) -> tuple[float | None, str | None]:
    """A percent as a fraction, or the problem with it."""
    if value is None:
        return None, None
    if not 0.0 <= value <= 100.0:
        return None, f"{what} {value:g}% is outside [0, 100]"
    return value / 100.0, None


@attrs.define
class AmdExporterSource:
    """Scrapes one AMD Device Metrics Exporter endpoint per read."""

    url: str = attrs.field(converter=normalize_url)
    timeout_s: float = 5.0
    host_fallback: str | None = None
    clock: Clock = time.time_ns
    name: str = "amd-exporter"
    _previous_ns: int = attrs.field(init=False, default=0)
    _energy: throttle.EnergyTracker = attrs.field(init=False, factory=throttle.EnergyTracker)
    # GPU key -> the field its active share (TPA = MFMA x it) came from in the last read: which one was used.
    activity_basis: dict[str, str] = attrs.field(init=False, factory=dict)
    _scrape: prometheus_text.Scrape = attrs.field(init=False, factory=prometheus_text.Scrape)

    def __attrs_post_init__(self) -> None:
        self._previous_ns = self.clock()
        if self.host_fallback is None:
            self.host_fallback = urllib.parse.urlsplit(self.url).hostname

    def fetch(self) -> str:
        """The exposition text, or ScrapeError saying in one line why not (the scrape bounded: ``prometheus_text``)."""
        return self._scrape.fetch(self.url, self.timeout_s)

    def interrupt(self) -> None:
        """The producer is stopping: a scrape in flight ends now."""
        self._scrape.interrupt()

    def read(self) -> Snapshot:
        now = self.clock()
        start, self._previous_ns = self._previous_ns, now
        try:
            samples = prometheus_text.parse_samples(self.fetch())
        except ScrapeError as error:
            return Snapshot(errors=(GpuError(names.ErrorReason.SCRAPE, str(error)),))
        entries = entries_of(samples)
        if not entries:
            # A wrong port or another exporter's page: one line naming what it had, not an empty read.
            message = (
                f"{self.url}: no AMD Device Metrics Exporter metric on the page (no series with a {UUID_LABEL} "
                f"label); {page_summary(samples)}. Is this the exporter's /metrics (port 5000 by default)?"
            )
            return Snapshot(errors=(GpuError(names.ErrorReason.SCRAPE, message),))
        # Partition 0 of each partitioned GPU, by the GPU's serial: it carries the GPU's clocks, power and energy.
        primaries: dict[tuple[str, str], _Entry] = {}
        for entry in entries.values():
            key = entry.board_key()
            if entry.partitioned and entry.primary and key is not None:
                primaries[key] = entry
        results: list[GpuReading | GpuError] = []
        self.activity_basis = {}
        for uuid, entry in entries.items():
            key = entry.board_key()
            board = entry if entry.primary else (primaries.get(key) if key is not None else None)
            results.extend(self._reading(uuid, entry, board, start, now))
        self._energy.forget(item.gpu.key for item in results if item.gpu is not None)
        return split(results)

    def _identity(self, uuid: str, labels: Mapping[str, str]) -> GpuIdentity:
        hints = {attribute: value for attribute, keys in HINT_LABELS.items() if (value := label(labels, keys))}
        if names.K8S_POD_NAME in hints:
            hints[names.JOB_SCHEDULER] = "kubernetes"
        elif names.JOB_ID in hints:
            hints[names.JOB_SCHEDULER] = "slurm"
        try:
            index = int(labels.get(GPU_ID_LABEL, ""))
        except ValueError:
            index = -1
        mode = label(labels, (PARTITION_TYPE_LABEL,))
        return GpuIdentity(
            uuid=uuid,
            model=label(labels, MODEL_LABELS) or "unknown",
            index=index,
            host=label(labels, (HOST_LABEL,)) or self.host_fallback or "unknown",
            vendor=names.HW_VENDOR_AMD,
            compute_partition=mode.strip().lower() if mode else None,
            hints=hints,
        )

    def _reading(
        self, uuid: str, entry: _Entry, board: _Entry | None, start: int, now: int
    ) -> tuple[GpuReading | GpuError, ...]:
        """The device's reading, and beside it the error when it gives no OFU (what it did give is kept)."""
        identity = self._identity(uuid, entry.labels)
        mfma, mfma_problem = _percent("MFMA activity", entry.values.get("mfma_percent"))
        active, active_problem = _percent("GPU activity", entry.values.get("active_percent"))
        if active is not None:
            self.activity_basis[identity.key] = names.AMD_EXPORTER_GPU_ACTIVE
        elif active_problem is None and not entry.partitioned:
            active, active_problem = _percent("GFX activity", entry.values.get("gfx_percent"))
            if active is not None:
                self.activity_basis[identity.key] = names.AMD_EXPORTER_GFX_ACTIVITY
            if active is not None and mfma:
                say_once(
                    f"{identity.model} on {identity.host}: {names.AMD_EXPORTER_GPU_ACTIVE} is not on the exporter's "
                    f"page, so {names.AMD_EXPORTER_GFX_ACTIVITY} (the SMI's GFX busy share) stands in for it: tensor "
                    f"activity = MFMA activity x GFX activity; the profiler's own ({names.AMD_EXPORTER_GPU_ACTIVE}, "
                    "ProfilerMetrics on) is counted over the MFMA counters' own window"
                )
        # No MFMA cycles is no tensor work, whatever the GPU's active share.
        tensor_active = 0.0 if mfma == 0.0 else (mfma * active if mfma is not None and active is not None else None)
        clocks = board.clocks_mhz if board is not None else []
        max_clocks = board.max_clocks_mhz if board is not None else []
        reading = GpuReading(
            gpu=identity,
            start_ns=start,
            end_ns=now,
            tensor_active=tensor_active,
            sm_clock_hz=sum(clocks) / len(clocks) * 1e6 if clocks else None,
            max_sm_clock_hz=max(max_clocks) * 1e6 if max_clocks else None,
            engine_active=active,
            **self._power_and_energy(identity, board, now),
        )
        problems = [problem for problem in (mfma_problem, active_problem) if problem is not None]
        if problems:
            error = GpuError(names.ErrorReason.INVALID_VALUE, "; ".join(problems), gpu=identity, gpu_key=identity.key)
            return keep_values(reading, error)
        missing = list(_missing(entry, reading, board))
        if not missing:
            return (reading,)
        error = GpuError(names.ErrorReason.NO_VALUE, "no value for " + " and ".join(missing), identity, identity.key)
        return keep_values(reading, error)

    def _power_and_energy(self, identity: GpuIdentity, board: _Entry | None, now: int) -> dict[str, Any]:
        """The device's share of its board's power and energy (all of it for a whole GPU), as GpuReading fields."""
        if board is None:
            return {}
        share = 1.0
        if identity.compute_partition not in (None, WHOLE_GPU):
            if gpu_share.assumed_slices(identity.model, compute_partition=identity.compute_partition):
                say_once(
                    f"compute partition {identity.compute_partition!r} of {identity.model!r} cannot be sized (the "
                    "catalog has no XCD count for it): its power and energy are left out rather than the board's "
                    "counted once per partition"
                )
                return {}
            share = gpu_share.gpu_share(identity.model, compute_partition=identity.compute_partition)
        result: dict[str, Any] = {}
        observation = None
        energy_uj = board.values.get("energy_uj")
        if energy_uj is not None and energy_uj >= 0:
            # The share of the board's counter is a counter of its own, keyed by the device: its deltas are the
            # board's deltas times the share, and a board counter that goes back restarts it too.
            observation = self._energy.update(identity.key, energy_uj * names.AMD_ENERGY_UNIT_J * share, now)
            result["energy"] = observation.energy
        watts = board.values.get("power_w", board.values.get("package_power_w"))
        result["power_w"] = throttle.interval_power(observation, None if watts is None else watts * share)
        return result

    def close(self) -> None:
        """Nothing to release: every scrape opens and closes its own connection."""


def _missing(entry: _Entry, reading: GpuReading, board: _Entry | None) -> Iterator[str]:
    """What OFU lacks, in words naming the exporter's fields to turn on (nothing when MFMA activity is 0: OFU 0)."""
    if reading.tensor_active == 0.0:
        return
    if "mfma_percent" not in entry.values:
        yield f"MFMA activity ({names.AMD_EXPORTER_MFMA_ACTIVE}, a profiler field: ProfilerMetrics on)"
    if reading.tensor_active is None and "active_percent" not in entry.values:
        stand_in = "" if entry.partitioned else f", or {names.AMD_EXPORTER_GFX_ACTIVITY} on a whole GPU"
        yield (
            f"GPU activity ({names.AMD_EXPORTER_GPU_ACTIVE}, a profiler field{stand_in}; without it MFMA activity "
            "counts the GPU's active cycles only)"
        )
    if reading.sm_clock_hz is None:
        where = "" if board is not None else ", and its GPU's partition 0 is not on the page"
        yield f'engine clock ({names.AMD_EXPORTER_CLOCK}{{{CLOCK_TYPE_LABEL}="system"}}{where})'
