"""A window consumer appending each closed window to a JSON-lines file (the ``record_codec`` format)."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

import attrs

from otel_ofu_collector.outputs.record_codec import encode_lines
from otel_ofu_collector.results import WindowReport


@attrs.define
class ReportRecorder:
    """A window consumer appending each closed window to a JSON-lines file, flushed per batch."""

    path: Path = attrs.field(converter=Path)
    written: int = attrs.field(init=False, default=0)
    _file: TextIO = attrs.field(init=False)
    _lock: threading.Lock = attrs.field(init=False, factory=threading.Lock)

    def __attrs_post_init__(self) -> None:
        self._file = self.path.open("a", encoding="utf-8")

    def consume_windows(self, windows: Sequence[WindowReport]) -> None:
        # Without the windows' per-GPU means: a live screen's, too large to keep for every window of a run.
        encoded = encode_lines([attrs.evolve(report, gpus=()) if report.gpus else report for report in windows])
        if not encoded:
            return
        with self._lock:
            self._file.write("".join(line + "\n" for _, line in encoded))
            self._file.flush()
            self.written += len(encoded)

    def close(self) -> None:
        with self._lock:
            self._file.close()

    def __enter__(self) -> ReportRecorder:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
