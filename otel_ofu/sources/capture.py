"""Our own capture format: JSON lines, one GPU reading or error per line, grouped by read.

Every line carries the format version (``otel_ofu_capture``) and the read's sequence number
(``seq``); consecutive lines with the same ``seq`` are one read. A read with nothing in it is one
``{"type": "empty"}`` line so replay keeps its rhythm. Values that were not read are absent, never
0 or null. ``otel-ofu run --record FILE`` writes it; ``--source replay --file FILE`` reads it back.

    {"otel_ofu_capture": 1, "seq": 0, "type": "reading", "start_ns": ..., "end_ns": ...,
     "gpu": {"uuid": ..., "model": ..., "index": 0, "host": ...}, "values": {"tensor_active": 0.41, ...}}
    {"otel_ofu_capture": 1, "seq": 0, "type": "error", "reason": "no_value", "message": ..., "gpu": {...}}
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, TextIO

import attrs

from otel_ofu import names
from otel_ofu.model import (
    CycleCounters,
    EnergyCounter,
    GpuError,
    GpuIdentity,
    GpuReading,
    IoCounter,
    Snapshot,
    SourceUnavailable,
)

FORMAT_KEY = "otel_ofu_capture"
FORMAT_VERSION = 1
FLOAT_VALUES = (
    "tensor_active",
    "sm_clock_hz",
    "max_sm_clock_hz",
    "sm_active",
    "dram_active",
    "engine_active",
    "sm_occupancy",
    "truth_ofu",
    "power_w",
)
LINK_VALUES = ("nvlink_io", "pcie_io")  # {direction: {"bytes": ..., "start_ns": ...}}


def identity_to_json(gpu: GpuIdentity) -> dict[str, Any]:
    data: dict[str, Any] = {"uuid": gpu.uuid, "model": gpu.model, "index": gpu.index, "host": gpu.host}
    if gpu.mig_profile is not None:
        data["mig_profile"] = gpu.mig_profile
    if gpu.mig_instance_id is not None:
        data["mig_instance_id"] = gpu.mig_instance_id
    if gpu.vendor != names.HW_VENDOR_NVIDIA:  # older captures have no vendor: they were all NVIDIA
        data["vendor"] = gpu.vendor
    if gpu.compute_partition is not None:
        data["compute_partition"] = gpu.compute_partition
    if gpu.hints:
        data["hints"] = dict(gpu.hints)
    return data


def reading_to_json(reading: GpuReading) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for key in FLOAT_VALUES:
        value = getattr(reading, key)
        if value is not None and math.isfinite(value):
            values[key] = value
    if reading.truth_precision is not None:
        values["truth_precision"] = reading.truth_precision
    if reading.cycles is not None:
        values["cycles"] = {
            "sm_cycles_elapsed": reading.cycles.sm_cycles_elapsed,
            "mma_cycles_active": reading.cycles.mma_cycles_active,
        }
    values.update(loss_inputs_to_json(reading))
    return {
        "type": "reading",
        "start_ns": reading.start_ns,
        "end_ns": reading.end_ns,
        "gpu": identity_to_json(reading.gpu),
        "values": values,
    }


def error_to_json(error: GpuError) -> dict[str, Any]:
    data: dict[str, Any] = {"type": "error", "reason": error.reason, "message": error.message}
    if error.gpu is not None:
        data["gpu"] = identity_to_json(error.gpu)
    if error.gpu_key is not None:
        data["gpu_key"] = error.gpu_key
    return data


class CaptureFormatError(ValueError):
    """A line that is not a capture record of a version we read."""


def loss_inputs_to_json(reading: GpuReading) -> dict[str, Any]:
    """``energy`` as ``{"joules", "start_ns"}``, ``throttle`` as ``{reason: share}`` and the link counters as
    ``{direction: {"bytes", "start_ns"}}``, where known."""
    values: dict[str, Any] = {}
    if reading.energy is not None and math.isfinite(reading.energy.joules):
        values["energy"] = {"joules": reading.energy.joules, "start_ns": reading.energy.start_ns}
    throttle = {reason: share for reason, share in reading.throttle.items() if math.isfinite(share)}
    if throttle:
        values["throttle"] = throttle
    for key in LINK_VALUES:
        counters: Mapping[str, IoCounter] = getattr(reading, key)
        links = {
            direction: {"bytes": counter.total_bytes, "start_ns": counter.start_ns}
            for direction, counter in counters.items()
            if math.isfinite(counter.total_bytes)
        }
        if links:
            values[key] = links
    return values


def loss_inputs_from_json(values: Mapping[str, Any]) -> dict[str, Any]:
    """The ``energy``, ``throttle`` and link counters of a reading's values (CaptureFormatError when malformed)."""
    fields: dict[str, Any] = {}
    if "energy" in values:
        raw = _expect(values["energy"], dict, "values.energy")
        joules = float(_expect(raw.get("joules"), (int, float), "energy.joules"))
        if not math.isfinite(joules):
            raise CaptureFormatError("energy.joules is not finite")
        fields["energy"] = EnergyCounter(joules, _expect(raw.get("start_ns"), int, "energy.start_ns"))
    if "throttle" in values:
        raw = _expect(values["throttle"], dict, "values.throttle")
        throttle = {}
        for reason, share in raw.items():
            number = float(_expect(share, (int, float), f"throttle.{reason}"))
            if not math.isfinite(number):
                raise CaptureFormatError(f"throttle.{reason} is not finite")
            throttle[str(reason)] = number
        fields["throttle"] = throttle
    for key in LINK_VALUES:
        if key not in values:
            continue
        links: dict[str, IoCounter] = {}
        for direction, raw in _expect(values[key], dict, f"values.{key}").items():
            counter = _expect(raw, dict, f"{key}.{direction}")
            total = float(_expect(counter.get("bytes"), (int, float), f"{key}.{direction}.bytes"))
            if not math.isfinite(total):
                raise CaptureFormatError(f"{key}.{direction}.bytes is not finite")
            links[str(direction)] = IoCounter(
                total, _expect(counter.get("start_ns"), int, f"{key}.{direction}.start_ns")
            )
        fields[key] = links
    return fields


def _expect(value: object, kind: type | tuple[type, ...], what: str) -> Any:
    if isinstance(value, bool) or not isinstance(value, kind):
        raise CaptureFormatError(f"{what} is missing or not {getattr(kind, '__name__', kind)}")
    return value


def identity_from_json(data: object) -> GpuIdentity:
    gpu = _expect(data, dict, "gpu")
    mig_id = gpu.get("mig_instance_id")
    hints = gpu.get("hints", {})
    if not isinstance(hints, dict) or not all(isinstance(v, str) for v in hints.values()):
        raise CaptureFormatError("gpu.hints must map names to strings")
    return GpuIdentity(
        uuid=_expect(gpu.get("uuid"), str, "gpu.uuid"),
        model=_expect(gpu.get("model"), str, "gpu.model"),
        index=_expect(gpu.get("index"), int, "gpu.index"),
        host=_expect(gpu.get("host"), str, "gpu.host"),
        mig_profile=None if gpu.get("mig_profile") is None else _expect(gpu["mig_profile"], str, "gpu.mig_profile"),
        mig_instance_id=None if mig_id is None else _expect(mig_id, int, "gpu.mig_instance_id"),
        vendor=_expect(gpu.get("vendor", names.HW_VENDOR_NVIDIA), str, "gpu.vendor"),
        compute_partition=None
        if gpu.get("compute_partition") is None
        else _expect(gpu["compute_partition"], str, "gpu.compute_partition"),
        hints=hints,
    )


def record_from_json(data: Mapping[str, Any]) -> GpuReading | GpuError | None:
    """One parsed line -> a reading, an error, or None for an empty read; CaptureFormatError if it is neither."""
    kind = data.get("type")
    if kind == "empty":
        return None
    if kind == "error":
        gpu = data.get("gpu")
        key = data.get("gpu_key")
        return GpuError(
            reason=_expect(data.get("reason"), str, "reason"),
            message=_expect(data.get("message"), str, "message"),
            gpu=None if gpu is None else identity_from_json(gpu),
            gpu_key=None if key is None else _expect(key, str, "gpu_key"),
        )
    if kind != "reading":
        raise CaptureFormatError(f"unknown record type {kind!r}")
    values = _expect(data.get("values", {}), dict, "values")
    floats: dict[str, Any] = {}
    for key in FLOAT_VALUES:
        if key in values:
            value = float(_expect(values[key], (int, float), f"values.{key}"))
            if not math.isfinite(value):
                raise CaptureFormatError(f"values.{key} is not finite")
            floats[key] = value
    cycles = None
    if "cycles" in values:
        raw = _expect(values["cycles"], dict, "values.cycles")
        cycles = CycleCounters(
            sm_cycles_elapsed=_expect(raw.get("sm_cycles_elapsed"), int, "cycles.sm_cycles_elapsed"),
            mma_cycles_active=_expect(raw.get("mma_cycles_active"), int, "cycles.mma_cycles_active"),
        )
    precision = values.get("truth_precision")
    return GpuReading(
        gpu=identity_from_json(data.get("gpu")),
        start_ns=_expect(data.get("start_ns"), int, "start_ns"),
        end_ns=_expect(data.get("end_ns"), int, "end_ns"),
        cycles=cycles,
        truth_precision=None if precision is None else _expect(precision, str, "values.truth_precision"),
        **floats,
        **loss_inputs_from_json(values),
    )


@attrs.define
class CaptureWriter:
    """Appends each snapshot as one read of JSON lines, flushed per read so a crash loses at most one."""

    path: Path = attrs.field(converter=Path)
    _file: TextIO = attrs.field(init=False)
    _seq: int = attrs.field(init=False, default=0)

    def __attrs_post_init__(self) -> None:
        self._file = self.path.open("a", encoding="utf-8")

    def write(self, snapshot: Snapshot) -> None:
        records = [reading_to_json(r) for r in snapshot.readings] + [error_to_json(e) for e in snapshot.errors]
        if not records:
            records = [{"type": "empty"}]
        for record in records:
            line = {FORMAT_KEY: FORMAT_VERSION, "seq": self._seq, **record}
            self._file.write(json.dumps(line, separators=(",", ":"), allow_nan=False) + "\n")
        self._file.flush()
        self._seq += 1

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> CaptureWriter:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def is_capture(first_line: str) -> bool:
    """Whether a file's first non-empty line is one of ours (used to tell captures from dcgmi text)."""
    try:
        data = json.loads(first_line)
    except ValueError:
        return False
    return isinstance(data, dict) and FORMAT_KEY in data


@attrs.define
class ReplaySource:
    """Replays a capture: each ``read`` returns the next recorded read, then empty snapshots.

    Recorded timestamps are kept, so interval math (cycle counters) is what it was. A line that is not
    a capture record becomes a SCRAPE error of the read it sits in and is counted in ``bad_lines``.
    """

    path: Path = attrs.field(converter=Path)
    name: str = "replay"
    bad_lines: int = attrs.field(init=False, default=0)
    exhausted: bool = attrs.field(init=False, default=False)
    _file: TextIO = attrs.field(init=False)
    _lines: Iterator[tuple[int, str]] = attrs.field(init=False)
    _pending: tuple[int, Mapping[str, Any]] | None = attrs.field(init=False, default=None)
    _pending_errors: list[GpuError] = attrs.field(init=False, factory=list)

    def __attrs_post_init__(self) -> None:
        try:
            self._file = self.path.open(encoding="utf-8", errors="replace")
        except OSError as error:
            raise SourceUnavailable(f"cannot open capture {self.path}: {error.strerror}") from None
        self._lines = enumerate(self._file, start=1)

    def _bad(self, number: int, why: str) -> None:
        self.bad_lines += 1
        self._pending_errors.append(GpuError(names.ErrorReason.SCRAPE, f"{self.path}:{number}: {why}"))

    def _next_record(self) -> tuple[int, Mapping[str, Any]] | None:
        """The next well-formed line as (seq, data); bad lines are noted on the way."""
        for number, line in self._lines:
            if not line.strip():
                continue
            try:
                data = json.loads(line)
            except ValueError:
                self._bad(number, "not JSON")
                continue
            if not isinstance(data, dict) or not isinstance(data.get(FORMAT_KEY), int):
                self._bad(number, f"not an otel-ofu capture record (no {FORMAT_KEY!r} version)")
                continue
            if data[FORMAT_KEY] > FORMAT_VERSION:
                self._bad(number, f"capture format {data[FORMAT_KEY]} is newer than this otel-ofu reads")
                continue
            seq = data.get("seq")
            if not isinstance(seq, int) or isinstance(seq, bool):
                self._bad(number, "no read sequence number")
                continue
            return seq, {**data, "_line": number}
        return None

    def read(self) -> Snapshot:
        first = self._pending or self._next_record()
        self._pending = None
        if first is None:
            self.exhausted = True
            trailing, self._pending_errors = tuple(self._pending_errors), []
            return Snapshot(errors=trailing)
        seq = first[0]
        records = [first[1]]
        while (following := self._next_record()) is not None:
            if following[0] != seq:
                self._pending = following
                break
            records.append(following[1])
        results: list[GpuReading | GpuError] = []
        for data in records:
            try:
                item = record_from_json(data)
            except (CaptureFormatError, TypeError, ValueError) as error:
                self._bad(int(data["_line"]), str(error))
                continue
            if item is not None:
                results.append(item)
        errors, self._pending_errors = self._pending_errors, []
        readings = tuple(item for item in results if isinstance(item, GpuReading))
        recorded = tuple(item for item in results if isinstance(item, GpuError))
        return Snapshot(readings=readings, errors=(*errors, *recorded))

    def close(self) -> None:
        self._file.close()
