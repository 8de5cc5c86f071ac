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
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from otel_ofu import catalog, gpu_values, names, ofu_math
from otel_ofu.cli_support import SNAPSHOT_PREFIX, CommandOptions, non_negative_float
from otel_ofu.gpu_samples import Attribution, attributes_of, compute_snapshot, hints_attribution
from otel_ofu.model import GpuError, GpuIdentity, Snapshot, Source, SourceUnavailable
from otel_ofu.sources.factory import add_source_options, open_from_args

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


def _line(gpu: GpuIdentity, attributes: Mapping[str, Any]) -> dict[str, Any]:
    line: dict[str, Any] = dict(gpu.resource_attributes())  # identity first: it reads best that way
    line.update(attributes)
    return line


def _error_fields(errors: Sequence[GpuError]) -> dict[str, Any]:
    return {"error": "; ".join(error.message for error in errors), names.ERROR_REASON: errors[0].reason}


def error_line(error: GpuError, attribution: Attribution = hints_attribution) -> dict[str, Any]:
    line: dict[str, Any] = {} if error.gpu is None else _line(error.gpu, attributes_of(error.gpu, attribution))
    if error.gpu is None and error.gpu_key is not None:
        line["gpu_key"] = error.gpu_key
    line.update(_error_fields([error]))
    return line


def snapshot_lines(
    snapshot: Snapshot,
    calibration: gpu_values.CalibrationTable | None = None,
    attribution: Attribution = hints_attribution,
) -> list[dict[str, Any]]:
    """One object per GPU, in the source's order, by the rule ``run`` exports with (``compute_snapshot``).

    A GPU without OFU keeps the values it did give beside ``error``: the source's own errors for it, when
    it has any (they are the cause, the failed computation is the effect). Errors of GPUs that gave no
    reading, and of the source as a whole, follow as lines of their own.
    """
    computed = compute_snapshot(snapshot, attribution=attribution, calibration=calibration)
    # Each reading became a sample or a partial one, both kept in reading order: merged back in that order.
    samples, partial = deque(computed.samples), deque(computed.partial)
    lines: list[dict[str, Any]] = []
    explained: set[str] = set()
    for reading in snapshot.readings:
        if samples and (samples[0].gpu, samples[0].start_ns) == (reading.gpu, reading.start_ns):
            sample = samples.popleft()
            line = _line(sample.gpu, sample.attributes)
            line.update(sample.values.as_json())
        else:
            failed = partial.popleft()
            line = _line(failed.gpu, failed.attributes)
            line.update(failed.known)
            line.update(_error_fields(computed.errors_of(failed.gpu.key)))
            explained.add(failed.gpu.key)
        lines.append(line)
    unexplained = (error for error in computed.errors if error.gpu is None or error.gpu.key not in explained)
    lines.extend(error_line(error, attribution) for error in unexplained)
    return lines


T = TypeVar("T")


def take(source: Source, *, needs_interval: bool, wait: Callable[[], object]) -> Snapshot:
    """One snapshot; with ``needs_interval`` the first read opens the interval and ``wait`` spans it."""
    if needs_interval:
        source.read()
        wait()
    return source.read()


def read_from_args(args: argparse.Namespace, command: str, inspect: Callable[[Source], T]) -> tuple[Snapshot, T] | None:
    """The source the command line names, opened, read over one interval (simulated time moves the clock rather
    than sleep) and closed, with what ``inspect`` found in it before it closed; None, the reason said in one line on
    stderr, when the source cannot open."""
    kind: str = args.source
    wait: Callable[[], object] = lambda: time.sleep(args.interval)  # noqa: E731
    clock = None
    if kind == "sim":
        from otel_ofu.clock import ManualClock

        manual = ManualClock()
        clock = manual
        wait = lambda: manual.advance(args.interval or 1.0)  # noqa: E731
    try:
        source, why = open_from_args(args, clock)
    except SourceUnavailable as error:
        print(f"otel-ofu {command}: {error}", file=sys.stderr)
        return None
    print(f"otel-ofu {command}: {why}", file=sys.stderr)
    try:
        return take(source, needs_interval=kind in INTERVAL_KINDS, wait=wait), inspect(source)
    finally:
        source.close()


def _fmt(value: Any, scale: float = 1.0, pattern: str = "{:.3f}") -> str:
    return "" if value is None else pattern.format(value / scale)


_GPU_WIDTH = 16
REFERENCE_CAPTION = "ref MHz: the clock OFU divides by (tensor clock, else max SM clock)"


def reference_clock_hz(line: Mapping[str, Any]) -> float | None:
    """The clock this GPU's OFU was divided by, by the producer's rule: its model's tensor clock where the
    catalog knows it (1830 MHz on H100 SXM, not the 1980 MHz board max), else the max SM clock."""
    spec = catalog.lookup(str(line.get(names.HW_MODEL, "")))
    tensor = spec.tensor_clock_hz if spec is not None else None
    return ofu_math.reference_clock_hz(line.get(names.GPU_CLOCK_SM_MAX.name), tensor)


def print_table(lines: list[dict[str, Any]], console: Any = None) -> None:
    """The lines as a table that reads at 80 columns: numbers never wrap, each error is a note below it."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title="otel-ofu snapshot",
        caption=REFERENCE_CAPTION,
        caption_justify="left",
        box=box.SIMPLE_HEAD,
        padding=(0, 0, 0, 1),
        pad_edge=False,
    )
    # Numbers never shrink; at 80 columns a long host, model or job name is cut short with an ellipsis
    # (the JSON output has it in full). A GPU without OFU shows the number of its note in the OFU column.
    table.add_column("GPU", overflow="ellipsis", min_width=8, max_width=_GPU_WIDTH)
    table.add_column("model", overflow="ellipsis", min_width=8, max_width=10)
    for column, width in (("TPA", 5), ("SM MHz", 6), ("ref MHz", 7), ("OFU", 5), ("TFLOP/s", 7)):
        table.add_column(column, justify="right", no_wrap=True, min_width=width)
    table.add_column("job", overflow="ellipsis", min_width=8, max_width=10)
    notes: list[str] = []
    for line in lines:
        where = f"/{line.get(names.GPU_INDEX, line.get('gpu_key', ''))}"
        if names.GPU_MIG_INSTANCE_ID in line:
            where += f":{line[names.GPU_MIG_INSTANCE_ID]}"
        host = str(line.get(names.HOST_NAME, ""))
        # A long host name is cut, never the GPU index after it.
        room = max(4, _GPU_WIDTH - len(where))
        gpu = (host if len(host) <= room else host[: room - 1] + "…") + where
        ofu = _fmt(line.get(names.GPU_OFU.name))
        if "error" in line:
            notes.append(f"[{len(notes) + 1}] {gpu}: {line[names.ERROR_REASON]}: {line['error']}")
            ofu = ofu or f"[{len(notes)}]"
        model = str(line.get(names.HW_MODEL, ""))
        spec = catalog.lookup(model)
        table.add_row(
            gpu,
            spec.key if spec is not None else model,
            _fmt(line.get(names.GPU_TENSOR_ACTIVE.name)),
            _fmt(line.get(names.GPU_CLOCK_SM.name), 1e6, "{:.0f}"),
            _fmt(reference_clock_hz(line) if names.GPU_CLOCK_SM_MAX.name in line else None, 1e6, "{:.0f}"),
            ofu,
            _fmt(line.get(names.GPU_FLOPS_ACHIEVED.name), 1e12, "{:.1f}"),
            str(line.get(names.JOB_ID, "")),
        )
    out = console if console is not None else Console()
    out.print(table)
    for note in notes:
        out.print(note, markup=False, highlight=False, overflow="fold")


def run(args: argparse.Namespace) -> int:
    """Exit 0 when at least one GPU gave values, 1 when none did, 2 when the source could not open."""
    try:
        calibration = gpu_values.CalibrationTable.parse(args.calibration or "")
    except ValueError as error:
        print(f"otel-ofu snapshot: {error}", file=sys.stderr)
        return 2
    read = read_from_args(args, "snapshot", lambda source: None)
    if read is None:
        return 2
    snapshot, _ = read
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
    add_source_options(CommandOptions(parser))
    CommandOptions(parser).option(
        "--calibration", metavar="SPEC", help="tile calibration factors, job:ID=F,model:KEY=F"
    )
    ours = CommandOptions(parser, SNAPSHOT_PREFIX)
    ours.option(
        "--interval",
        metavar="SECONDS",
        default=1.0,
        type=non_negative_float,
        help="seconds between the two reads of rate sources",
    )
    ours.option("--format", default="json", choices=FORMATS, help="output format")
    parser.set_defaults(handler=run)
