"""``otel-ofu snapshot``: one reading of a source, one JSON object per GPU per line (or a table).

Keys are the contract's names (``hw.id``, ``gpu.tensor.active``, ``gpu.ofu`` ...). A value that is
not known is absent, never 0; a GPU that could not be read is a line with ``error`` and ``reason``.
Sources whose values are rates over an interval (NVML, DCGM, the simulator) are read twice,
``--interval`` apart, and the second read is printed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import Any

from otel_ofu import catalog, gpu_values, names, ofu_math
from otel_ofu.cli_support import SNAPSHOT_PREFIX, CommandOptions, non_negative_float
from otel_ofu.model import GpuError, GpuIdentity, GpuReading, Snapshot, Source, SourceUnavailable
from otel_ofu.sources.factory import SOURCE_KINDS, open_source

FORMATS = ("json", "table")
DESCRIPTION = """\
Read a source once and print one JSON object per GPU per line (or a table: --format table).

Keys are the contract's names (hw.id, gpu.tensor.active, gpu.ofu, ...). A value that is not known is
absent, never 0; a GPU that could not be read is a line with error and reason. Sources whose values are
rates over an interval (NVML, DCGM, the simulator) are read twice, --interval apart, and the second read
is printed.

Exit status: 0 when at least one GPU gave its OFU, 1 when none did, 2 when the source could not open."""
# Kinds whose first read only opens the interval.
INTERVAL_KINDS = frozenset({"auto", "nvml", "dcgm", "sim"})


def _identity(gpu: GpuIdentity) -> dict[str, Any]:
    attributes: dict[str, Any] = dict(gpu.resource_attributes())
    for key, value in gpu.hints.items():
        attributes.setdefault(key, value)
    return attributes


def _known_raw_values(reading: GpuReading) -> dict[str, float]:
    """The reading's own values that are valid on their own, for a GPU whose OFU cannot be had."""
    checks = (
        (names.GPU_TENSOR_ACTIVE.name, reading.tensor_active, ofu_math.check_fraction),
        (names.GPU_CLOCK_SM.name, reading.sm_clock_hz, ofu_math.check_clock),
        (names.GPU_CLOCK_SM_MAX.name, reading.max_sm_clock_hz, ofu_math.check_clock),
        (names.GPU_SM_ACTIVE.name, reading.sm_active, ofu_math.check_fraction),
        (names.GPU_DRAM_ACTIVE.name, reading.dram_active, ofu_math.check_fraction),
    )
    known: dict[str, float] = {}
    for name, value, check in checks:
        if value is None:
            continue
        try:
            known[name] = check(name, value)
        except ofu_math.InvalidReading:
            continue
    return known


def reading_line(
    reading: GpuReading, calibration: gpu_values.CalibrationTable, source_errors: list[GpuError] | None = None
) -> dict[str, Any]:
    """The JSON object of one reading: identity, then every known value, or ``error``/``reason``.

    When OFU cannot be had, the values that are valid on their own (a clock without GPM, say) stay,
    and the source's own errors for this GPU, if any, say why; they are the cause, compute's is the effect.
    """
    line = _identity(reading.gpu)
    precision = reading.gpu.hints.get(names.GPU_PRECISION)
    try:
        factor = calibration.factor(reading.gpu.model, reading.gpu.hints.get(names.JOB_ID))
        values = gpu_values.compute(reading, precision=precision, calibration=factor)
    except ofu_math.InvalidReading as error:
        line.update(_known_raw_values(reading))
        if source_errors:
            line["error"] = "; ".join(e.message for e in source_errors)
            line[names.ERROR_REASON] = source_errors[0].reason
        else:
            line["error"] = str(error)
            line[names.ERROR_REASON] = error.reason
        return line
    line.update(values.as_json())
    return line


def error_line(error: GpuError) -> dict[str, Any]:
    line: dict[str, Any] = _identity(error.gpu) if error.gpu is not None else {}
    if error.gpu is None and error.gpu_key is not None:
        line["gpu_key"] = error.gpu_key
    line["error"] = error.message
    line[names.ERROR_REASON] = error.reason
    return line


def snapshot_lines(snapshot: Snapshot, calibration: gpu_values.CalibrationTable | None = None) -> list[dict[str, Any]]:
    """One object per GPU: a GPU with both a reading and errors (clocks but no TPA) is one line."""
    table = calibration or gpu_values.CalibrationTable()
    errors_by_gpu: dict[str, list[GpuError]] = {}
    for error in snapshot.errors:
        if error.gpu is not None:
            errors_by_gpu.setdefault(error.gpu.key, []).append(error)
    lines = []
    merged: set[str] = set()
    for reading in snapshot.readings:
        line = reading_line(reading, table, errors_by_gpu.get(reading.gpu.key))
        if "error" in line:
            merged.add(reading.gpu.key)
        lines.append(line)
    lines.extend(error_line(e) for e in snapshot.errors if e.gpu is None or e.gpu.key not in merged)
    return lines


def take(source: Source, *, needs_interval: bool, wait: Callable[[], object]) -> Snapshot:
    """One snapshot; with ``needs_interval`` the first read opens the interval and ``wait`` spans it."""
    if needs_interval:
        source.read()
        wait()
    return source.read()


def _fmt(value: Any, scale: float = 1.0, pattern: str = "{:.3f}") -> str:
    return "" if value is None else pattern.format(value / scale)


def print_table(lines: list[dict[str, Any]]) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    table = Table(title="otel-ofu snapshot", box=box.SIMPLE_HEAD)
    for column in ("GPU", "model", "TPA", "SM MHz", "max MHz", "OFU", "TFLOP/s", "job", "error"):
        # Numbers never shrink; names wrap when the terminal is narrow.
        if column in ("TPA", "SM MHz", "max MHz", "OFU", "TFLOP/s"):
            table.add_column(column, justify="right", no_wrap=True, min_width=len(column))
        else:
            table.add_column(column, overflow="fold")
    for line in lines:
        gpu = f"{line.get(names.HOST_NAME, '')}/{line.get(names.GPU_INDEX, line.get('gpu_key', ''))}"
        if names.GPU_MIG_INSTANCE_ID in line:
            gpu += f":{line[names.GPU_MIG_INSTANCE_ID]}"
        model = str(line.get(names.HW_MODEL, ""))
        spec = catalog.lookup(model)
        table.add_row(
            gpu,
            spec.key if spec is not None else model,
            _fmt(line.get(names.GPU_TENSOR_ACTIVE.name)),
            _fmt(line.get(names.GPU_CLOCK_SM.name), 1e6, "{:.0f}"),
            _fmt(line.get(names.GPU_CLOCK_SM_MAX.name), 1e6, "{:.0f}"),
            _fmt(line.get(names.GPU_OFU.name)),
            _fmt(line.get(names.GPU_FLOPS_ACHIEVED.name), 1e12, "{:.1f}"),
            str(line.get(names.JOB_ID, "")),
            f"{line[names.ERROR_REASON]}: {line['error']}" if "error" in line else "",
        )
    Console().print(table)


def run(args: argparse.Namespace) -> int:
    """Exit 0 when at least one GPU gave values, 1 when none did, 2 when the source could not open."""
    kind: str = args.source
    try:
        calibration = gpu_values.CalibrationTable.parse(args.calibration or "")
    except ValueError as error:
        print(f"otel-ofu snapshot: {error}", file=sys.stderr)
        return 2
    wait: Callable[[], object] = lambda: time.sleep(args.interval)  # noqa: E731
    clock = None
    if kind == "sim":
        # Simulated time: span the interval by moving the clock, not by sleeping.
        from otel_ofu.clock import ManualClock

        manual = ManualClock()
        clock = manual
        wait = lambda: manual.advance(args.interval or 1.0)  # noqa: E731
    try:
        source, why = open_source(kind, url=args.url, file=args.file, host=args.host, seed=args.seed, clock=clock)
    except SourceUnavailable as error:
        print(f"otel-ofu snapshot: {error}", file=sys.stderr)
        return 2
    print(f"otel-ofu snapshot: {why}", file=sys.stderr)
    try:
        snapshot = take(source, needs_interval=kind in INTERVAL_KINDS, wait=wait)
    finally:
        source.close()
    lines = snapshot_lines(snapshot, calibration)
    if args.format == "table":
        print_table(lines)
    else:
        for line in lines:
            sys.stdout.write(json.dumps(line, allow_nan=False) + "\n")
        sys.stdout.flush()
    return 0 if any(names.GPU_OFU.name in line for line in lines) else 1


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "snapshot",
        help="read a source once and print one JSON object per GPU",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    # The source options are run's own (plain OTEL_OFU_*: one node's settings serve both); the rest are ours.
    source = CommandOptions(parser)
    ours = CommandOptions(parser, SNAPSHOT_PREFIX)
    source.option("--source", default="auto", choices=SOURCE_KINDS, help="where GPU counters come from")
    # Metavars as run's: the same option reads the same in both commands' help.
    source.option("--url", metavar="URL", help="dcgm-exporter /metrics URL (for --source dcgm-exporter)")
    source.option(
        "--file", metavar="FILE", help="capture to replay: otel-ofu JSON lines or dcgmi dmon text (--source replay)"
    )
    source.option("--host", metavar="NAME", help="host.name where the source does not say (default: the source's own)")
    source.option("--seed", metavar="N", type=int, help="seed of the simulated fleet (--source sim)")
    source.option("--calibration", metavar="SPEC", help="tile calibration factors, job:ID=F,model:KEY=F")
    ours.option(
        "--interval",
        metavar="SECONDS",
        default=1.0,
        type=non_negative_float,
        help="seconds between the two reads of rate sources",
    )
    ours.option("--format", default="json", choices=FORMATS, help="output format")
    parser.set_defaults(handler=run)
