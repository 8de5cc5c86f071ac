"""Replay of ``dcgmi dmon`` text output, one snapshot per sample block.

``dmon`` prints a header (the fields' short names), a units line, then one row per entity per sample
(``GPU 0 ...``, ``GPU-I 21 ...`` for MIG GPU instances, ``GPU-CI`` for compute instances), with ``N/A``
where DCGM had no value. Every layout DCGM has printed reads:

- DCGM 2.2-2.3, as the DCGM user guide's examples still show it: ``# Entity  GRACT  TENSO`` then ``Id``,
  everything right-aligned;
- DCGM 2.4-3.x: ``#Entity   GRACT ...`` then ``ID``, left-aligned;
- DCGM 4.x: the same with a wider entity column, a blank cell where an entity has no such field (placed by
  the header's column positions), and rows of other entities (``GPU 0 LINK 3``, ``CPU 0``), which are skipped.

Field ids come from the command line's ``-e`` list when the capture includes it, else from the column
names; each is read in its own unit (SMCLK, field 100, in MHz; DCGM 4.6.1's 1603 in Hz). Rows have no
timestamps: blocks are spaced by the ``-d`` delay (default 1 s). Anything else (shell prompts, messages)
is ignored; a row that does not fit its header is an error of that block, counted, and never stops the
replay.
"""

from __future__ import annotations

import bisect
import itertools
import re
import shlex
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TextIO

import attrs

from otel_ofu import io_counters, names
from otel_ofu.model import Clock, CycleCounters, GpuError, GpuIdentity, GpuReading, Snapshot, SourceUnavailable
from otel_ofu.sources import keep_values
from otel_ofu.sources.dcgm import COUNTER_FIELDS, LINKS, CycleTracker, FieldValues, dcgm_number, reading_or_error, split

DEFAULT_DELAY_S = 1.0  # dcgmi dmon's default -d is 1000 ms
ENTITY_KINDS = ("GPU", "GPU-I", "GPU-CI")
_PROMPT_HOST = re.compile(r"[\w.-]+@([\w.-]+)")


@attrs.frozen
class DmonRow:
    kind: str  # GPU, GPU-I or GPU-CI
    entity_id: int
    values: dict[int, float]  # field id -> value; N/A and blanks are absent


@attrs.frozen
class DmonBlock:
    """One sample of every entity dmon printed, plus the lines of it that could not be read."""

    rows: tuple[DmonRow, ...]
    errors: tuple[str, ...] = ()


@attrs.define
class _Command:
    fields: list[int] | None = None
    delay_s: float | None = None
    host: str | None = None


def _parse_command(line: str, command: _Command) -> None:
    match = _PROMPT_HOST.search(line.split("dcgmi", 1)[0])
    if match:
        command.host = match.group(1)
    try:
        words = shlex.split(line.split("dcgmi", 1)[1])
    except ValueError:
        return
    for flag, value in itertools.pairwise(words):
        try:
            if flag in ("-e", "--field-id"):
                command.fields = [int(item) for item in value.split(",")]
            elif flag in ("-d", "--delay"):
                command.delay_s = int(value) / 1000.0
        except ValueError:
            continue


def _column_ids(columns: list[str], command: _Command) -> list[int | None]:
    if command.fields is not None and len(command.fields) == len(columns):
        return list(command.fields)
    return [names.DCGMI_DMON_COLUMNS.get(column) for column in columns]


def header_columns(raw: str) -> list[str] | None:
    """The field columns of a dmon header line, or None when the line is not one: ``#Entity`` (DCGM 2.4 on) or
    ``# Entity`` (DCGM 2.2-2.3 and the DCGM user guide's examples, whose second line reads ``Id``, not ``ID``)."""
    words = raw.split()
    if words[:1] == ["#Entity"]:
        return words[1:]
    if words[:2] == ["#", "Entity"]:
        return words[2:]
    return None


def is_dmon_text(lines: Iterable[str]) -> bool:
    """Whether the first lines of a file look like ``dcgmi dmon`` output (its command line or a header)."""
    return any("dcgmi" in line or header_columns(line) is not None for line in lines if line.strip())


@attrs.frozen
class _Header:
    """A header's field ids and, for the left-aligned layouts (``#Entity``, DCGM 2.4 on), where each column starts: a
    DCGM 4 row leaves a cell blank where the entity has no such field, so its cells are placed by position then."""

    ids: list[int | None]
    starts: tuple[int, ...] | None

    @classmethod
    def of(cls, raw: str, columns: list[str], command: _Command) -> _Header:
        spans = [match.start() for match in re.finditer(r"\S+", raw.rstrip())]
        left_aligned = raw.split()[0] == "#Entity"
        return cls(_column_ids(columns, command), tuple(spans[1:]) if left_aligned else None)


def parse_blocks(lines: Iterator[str], command: _Command | None = None) -> Iterator[DmonBlock]:
    """Sample blocks of dmon text; a block ends where an entity repeats or a header comes again."""
    command = command or _Command()
    header: _Header | None = None
    rows: list[DmonRow] = []
    errors: list[str] = []
    seen: set[tuple[str, int]] = set()
    for number, raw in enumerate(lines, start=1):
        words = raw.split()
        if not words:
            continue
        if "dcgmi" in raw and "dmon" in raw:
            _parse_command(raw, command)
            continue
        columns = header_columns(raw)
        if columns is not None:
            if rows or errors:
                yield DmonBlock(tuple(rows), tuple(errors))
                rows, errors, seen = [], [], set()
            header = _Header.of(raw, columns, command)
            continue
        if words[0] not in ENTITY_KINDS or len(words) < 2:
            continue  # "ID"/"Id" units line, CPU and switch rows, prompts, messages
        if len(words) > 2 and words[2] == "LINK":
            continue  # "GPU 0 LINK 3": an NVLink's own row (DCGM 4), not the GPU's
        key = (words[0], _entity_id(words[1]))
        if key in seen:
            yield DmonBlock(tuple(rows), tuple(errors))
            rows, errors, seen = [], [], set()
        seen.add(key)
        row = _row(raw, words, header)
        if isinstance(row, str):
            errors.append(f"line {number}: {row}: {raw.strip()!r}")
        else:
            rows.append(row)
    if rows or errors:
        yield DmonBlock(tuple(rows), tuple(errors))


def _entity_id(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        return -1


def _cells(raw: str, words: list[str], header: _Header) -> list[str | None] | str:
    """The row's cells, one per column (None where DCGM left it blank), or what is wrong with the row."""
    cells: list[str | None] = list(words[2:])
    if len(cells) == len(header.ids):
        return cells
    if header.starts is None or len(cells) > len(header.ids):
        return f"{len(cells)} values for {len(header.ids)} columns"
    # Left-aligned columns: each value starts where its column does; a column no value starts in is blank.
    placed: list[str | None] = [None] * len(header.ids)
    for match in list(re.finditer(r"\S+", raw.rstrip()))[2:]:
        column = bisect.bisect_right(header.starts, match.start()) - 1
        if column < 0 or placed[column] is not None:
            return f"{len(cells)} values for {len(header.ids)} columns"
        placed[column] = match.group()
    return placed


def _row(raw: str, words: list[str], header: _Header | None) -> DmonRow | str:
    if header is None:
        return "row before any #Entity header"
    entity = _entity_id(words[1])
    if entity < 0:
        return f"entity id {words[1]!r} is not a number"
    cells = _cells(raw, words, header)
    if isinstance(cells, str):
        return cells
    values: dict[int, float] = {}
    for field_id, cell in zip(header.ids, cells, strict=True):
        if field_id is None or cell is None or cell == "N/A":
            continue
        try:
            number = float(cell)
        except ValueError:
            return f"value {cell!r} is not a number"
        counter = field_id in COUNTER_FIELDS
        value = dcgm_number(int(number) if counter and number.is_integer() else number, counter=counter)
        if value is not None:
            values[field_id] = value
    return DmonRow(words[0], entity, values)


@attrs.define
class DcgmiDmonSource:
    """Replays a ``dcgmi dmon`` capture: each ``read`` returns the next sample block, then empty snapshots."""

    path: Path = attrs.field(converter=Path)
    host: str | None = None
    model: str = "unknown"  # dmon prints no device names
    delay_s: float | None = None
    clock: Clock = time.time_ns
    name: str = "replay"
    bad_lines: int = attrs.field(init=False, default=0)
    exhausted: bool = attrs.field(init=False, default=False)
    _command: _Command = attrs.field(init=False, factory=_Command)
    _blocks: Iterator[DmonBlock] = attrs.field(init=False)
    _file: TextIO | None = attrs.field(init=False, default=None)
    _start_ns: int = attrs.field(init=False, default=0)
    _index: int = attrs.field(init=False, default=0)
    _cycles: CycleTracker = attrs.field(init=False, factory=CycleTracker)
    _links: io_counters.IoIntegrator = attrs.field(init=False, factory=io_counters.IoIntegrator)

    def __attrs_post_init__(self) -> None:
        try:
            handle = self.path.open(encoding="utf-8", errors="replace")
        except OSError as error:
            raise SourceUnavailable(f"cannot open dcgmi dmon capture {self.path}: {error.strerror}") from None
        self._file = handle
        self._blocks = parse_blocks(iter(handle), self._command)
        self._start_ns = self.clock()

    @property
    def field_ids(self) -> tuple[int, ...] | None:
        """The capture's ``-e`` field list, where its command line is in it (read with the first block)."""
        fields = self._command.fields
        return None if fields is None else tuple(fields)

    def read(self) -> Snapshot:
        block = next(self._blocks, None)
        if block is None:
            self.exhausted = True
            return Snapshot()
        delay_ns = int((self.delay_s or self._command.delay_s or DEFAULT_DELAY_S) * 1e9)
        start = self._start_ns + self._index * delay_ns
        end = start + delay_ns
        self._index += 1
        self.bad_lines += len(block.errors)
        host = self.host or self._command.host or "unknown"
        errors = [GpuError(names.ErrorReason.SCRAPE, f"{self.path}: {message}") for message in block.errors]
        return split([item for row in block.rows for item in self._reading(row, host, start, end)], errors)

    def _reading(self, row: DmonRow, host: str, start: int, end: int) -> tuple[GpuReading | GpuError, ...]:
        instance = row.kind != "GPU"
        identity = GpuIdentity(
            # dmon prints no UUIDs: a stable stand-in per host and entity (instances keyed by their id).
            uuid=f"dcgmi:{host}:{row.kind}" if instance else f"dcgmi:{host}:GPU-{row.entity_id}",
            model=self.model,
            index=-1 if instance else row.entity_id,  # dmon does not say which GPU an instance is on
            host=host,
            mig_instance_id=row.entity_id if instance else None,
        )
        got = FieldValues()
        for field_id, value in row.values.items():
            got.add(field_id, value)  # by field id, in its unit: SMCLK (100) in MHz, 1603 in Hz
        values = got.values
        # PCITX/PCIRX/NVLTX/NVLRX are bytes per second over the block's delay. They are the board's: a GPU row
        # counts them, an instance row cannot (dmon prints no profile, so its share of the board is unknown).
        links = io_counters.LinkFields()
        if not instance:
            rates = io_counters.link_rates(**{link: values[link] for link in LINKS if link in values})
            links = self._links.add(identity.key, rates, start, end)
        cycles: CycleCounters | None = None
        if "sm_cycles_elapsed" in values and "mma_cycles_active" in values:
            delta = self._cycles.update(
                identity.key, int(values["sm_cycles_elapsed"]), int(values["mma_cycles_active"]), end
            )
            if delta is not None:
                cycles, start = delta
        reading = GpuReading(
            gpu=identity,
            start_ns=start,
            end_ns=end,
            tensor_active=values.get("tensor_active"),
            sm_clock_hz=values.get("sm_clock_hz"),
            max_sm_clock_hz=values.get("max_sm_clock_hz"),
            sm_active=values.get("sm_active"),
            dram_active=values.get("dram_active"),
            engine_active=values.get("engine_active"),
            sm_occupancy=values.get("sm_occupancy"),
            cycles=cycles,
            **links,
        )
        return keep_values(reading, reading_or_error(reading, what=f"{row.kind} {row.entity_id}: "))

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
