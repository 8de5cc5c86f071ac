"""Follow a training log like ``tail -F`` and pull the MFU out of its lines.

``parse_mfu`` is the pure part: one line in, an MFU fraction (or None) out. ``LogFollower`` is the file
part: ``poll()`` reads whatever has been appended since the last call and returns the MFU values of the
complete lines; ``run()`` calls it on an injectable clock and sleep, so tests drive it without waiting.

It survives what happens to real logs: appends in pieces (a partial line waits for its newline),
rotation by rename (the old file is read to its end, then the new one from its start), copytruncate
(a file shorter than the read position is read again from the start), a file that does not exist yet,
and junk (binary or non-UTF-8 lines and over-long lines are skipped and counted, never fatal). Like any
``tail``, a truncation followed by more writes than were there before is indistinguishable from an append.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import attrs

from otel_ofu.mfu.progress_lines import ProgressLine, parse_progress
from otel_ofu.mfu.values import InvalidMfu, check_mfu

_NUMBER = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|nan|[-+]?inf(?:inity)?"

# "MFU 32.5%", "mfu: 0.325", "mfu=0.325", "MFU: 41%", "train/mfu 0.4", torchtitan's "mfu: 32.45%".
# A preceding word character or dot rules out keys like "avg_mfu"; "mfu_target" fails the word boundary.
DEFAULT_REGEX = rf"(?<![\w.])(?:mfu|model[ _]flops[ _]utili[sz]ation)\b\s*[:=]?\s*(?P<mfu>{_NUMBER})"

# Colour codes (torchtitan colours its metrics) would otherwise sit between the key and the number.
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")

UNITS = ("auto", "percent", "fraction")


@attrs.frozen
class MfuPattern:
    """A regex with a named group ``mfu``, and whether its value is a percent.

    ``unit="auto"`` decides by a ``%`` right after the number (spaces allowed); ``percent`` and
    ``fraction`` force the reading.
    """

    regex: re.Pattern[str]
    unit: str = "auto"

    def __attrs_post_init__(self) -> None:
        if "mfu" not in self.regex.groupindex:
            raise ValueError(f"MFU pattern {self.regex.pattern!r} has no named group 'mfu', as in (?P<mfu>...)")
        if self.unit not in UNITS:
            raise ValueError(f"unit must be one of {', '.join(UNITS)}, got {self.unit!r}")

    @classmethod
    def compile(cls, regex: str, *, percent: bool | None = None, ignore_case: bool = False) -> MfuPattern:
        """A pattern from regex text; ``percent`` True/False forces the unit, None decides by the ``%`` sign."""
        try:
            compiled = re.compile(regex, re.IGNORECASE if ignore_case else 0)
        except re.error as error:
            raise ValueError(f"MFU pattern {regex!r} is not a valid regex: {error}") from error
        unit = "auto" if percent is None else ("percent" if percent else "fraction")
        return cls(compiled, unit)


DEFAULT_PATTERN = MfuPattern.compile(DEFAULT_REGEX, ignore_case=True)


def parse_mfu(line: str, pattern: MfuPattern = DEFAULT_PATTERN) -> float | None:
    """The MFU fraction a log line states (its first match), None when it states none.

    Raises ``InvalidMfu`` when the line names an MFU that is not usable (NaN, negative, a percent above
    what any miscount explains, text the custom pattern captured that is not a number).
    """
    text = _ANSI.sub("", line) if "\x1b" in line else line
    match = pattern.regex.search(text)
    if match is None:
        return None
    raw = match.group("mfu")
    if raw is None:
        return None
    try:
        value = float(raw.strip())
    except ValueError as error:
        raise InvalidMfu(f"MFU {raw!r} is not a number") from error
    if pattern.unit == "percent" or (pattern.unit == "auto" and text[match.end("mfu") :].lstrip().startswith("%")):
        value /= 100.0
    return check_mfu(value)


@attrs.define
class FollowerStats:
    """What the follower has seen; junk is counted here, never raised."""

    lines: int = 0  # complete lines read
    values: int = 0  # lines that gave a usable MFU
    rejected: int = 0  # lines whose MFU was not usable
    without_mfu: int = 0  # readable lines with no MFU in them, nor progress when asked for (the log's other lines)
    skipped: int = 0  # binary, non-UTF-8 or over-long lines
    dropped_partials: int = 0  # fragments: a line cut by the start position, rotation or truncation
    reopens: int = 0  # rotations followed (new file at the path)
    truncations: int = 0  # the file got shorter than the read position
    progress: int = 0  # lines that named a step or a timed checkpoint (when the follower was asked for progress)


def _identity(stat: os.stat_result) -> tuple[int, int]:
    return (stat.st_dev, stat.st_ino)


@attrs.define
class LogFollower:
    """Tails ``path``; ``poll()`` returns the MFU values of the complete lines appended since the last call.

    Without ``from_start`` a file that exists at construction is followed from its end there; a file that
    appears later (or after a rotation) is read from its start. ``close()`` (or ``with``) releases the file.
    """

    path: Path = attrs.field(converter=Path)
    pattern: MfuPattern = attrs.field(default=DEFAULT_PATTERN, kw_only=True)
    from_start: bool = attrs.field(default=False, kw_only=True)
    max_line_bytes: int = attrs.field(default=1 << 20, kw_only=True)
    chunk_bytes: int = attrs.field(default=1 << 16, kw_only=True)
    clock: Callable[[], float] = attrs.field(default=time.monotonic, kw_only=True)
    sleep: Callable[[float], object] = attrs.field(default=time.sleep, kw_only=True)
    stats: FollowerStats = attrs.field(factory=FollowerStats, kw_only=True)
    # Given: each readable line's progress (a step, a timed checkpoint: ``progress_lines``) is handed to it.
    on_progress: Callable[[ProgressLine], object] | None = attrs.field(default=None, kw_only=True)

    _file: BinaryIO | None = attrs.field(init=False, default=None)
    _buffer: bytearray = attrs.field(init=False, factory=bytearray)
    _discarding: bool = attrs.field(init=False, default=False)  # skipping to the next newline
    _seen_file: bool = attrs.field(init=False, default=False)

    def __attrs_post_init__(self) -> None:
        self._open()  # "from now on" means from construction, not from the first poll

    def __enter__(self) -> LogFollower:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def poll(self) -> list[float]:
        """Process what the file holds now; the MFU values found, in order."""
        values: list[float] = []
        if self._file is None and not self._open():
            return values
        assert self._file is not None
        values += self._drain()
        try:
            current = os.stat(self.path)
        except FileNotFoundError:
            return values  # renamed away and not yet replaced: the old file may still grow
        if _identity(current) != _identity(os.fstat(self._file.fileno())):
            values += self._drain()  # lines written to the old file between the read and the rename
            self._drop_partial()
            self._file.close()
            self._file = None
            self.stats.reopens += 1
            if self._open():
                values += self._drain()
        elif current.st_size < self._file.tell():
            self.stats.truncations += 1
            self._drop_partial()
            self._file.seek(0)
            values += self._drain()
        return values

    def run(
        self,
        on_mfu: Callable[[float], object],
        *,
        poll_interval: float = 1.0,
        duration: float | None = None,
        should_stop: Callable[[], bool] = lambda: False,
    ) -> None:
        """Poll every ``poll_interval`` seconds, handing each value to ``on_mfu``, until stopped or ``duration``."""
        if poll_interval <= 0:
            raise ValueError(f"poll interval must be positive, got {poll_interval!r}")
        deadline = None if duration is None else self.clock() + duration
        while not should_stop():
            for value in self.poll():
                on_mfu(value)
            if deadline is not None:
                left = deadline - self.clock()
                if left <= 0:
                    return
                self.sleep(min(poll_interval, left))
            else:
                self.sleep(poll_interval)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def _open(self) -> bool:
        try:
            handle = open(self.path, "rb")  # noqa: SIM115  # kept open across polls, closed by close()
        except FileNotFoundError:
            self._seen_file = True  # missing at first: whatever appears later is all new
            return False
        at_end = not self._seen_file and not self.from_start
        self._seen_file = True
        self._file = handle
        if at_end:
            size = handle.seek(0, os.SEEK_END)
            if size > 0:
                handle.seek(size - 1)
                # Started in the middle of a line: its head is gone, so its tail is not a line.
                self._discarding = handle.read(1) != b"\n"
                if self._discarding:
                    self.stats.dropped_partials += 1
        return True

    def _drain(self) -> list[float]:
        assert self._file is not None
        values: list[float] = []
        while chunk := self._file.read(self.chunk_bytes):
            values += self._feed(chunk)
        return values

    def _feed(self, chunk: bytes) -> list[float]:
        values: list[float] = []
        start = 0
        while (newline := chunk.find(b"\n", start)) >= 0:
            piece = chunk[start:newline]
            start = newline + 1
            if self._discarding:
                self._discarding = False
                continue
            line = bytes(self._buffer) + piece if self._buffer else piece
            self._buffer.clear()
            if len(line) > self.max_line_bytes:
                self.stats.skipped += 1
                continue
            value = self._line(line)
            if value is not None:
                values.append(value)
        if not self._discarding:
            self._buffer += chunk[start:]
            if len(self._buffer) > self.max_line_bytes:
                # Bounded memory: a runaway line (a binary blob without newlines) is dropped, not kept.
                self._buffer.clear()
                self._discarding = True
                self.stats.skipped += 1
        return values

    def _line(self, raw: bytes) -> float | None:
        self.stats.lines += 1
        if b"\x00" in raw:
            self.stats.skipped += 1
            return None
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            self.stats.skipped += 1
            return None
        progressed = False
        if self.on_progress is not None:
            progress = parse_progress(text)
            if not progress.empty:
                progressed = True
                self.stats.progress += 1
                self.on_progress(progress)
        try:
            value = parse_mfu(text.rstrip("\r"), self.pattern)
        except InvalidMfu:
            self.stats.rejected += 1
            return None
        if value is not None:
            self.stats.values += 1
        elif not progressed:
            self.stats.without_mfu += 1
        return value

    def _drop_partial(self) -> None:
        if self._buffer:
            self.stats.dropped_partials += 1
            self._buffer.clear()
        self._discarding = False
