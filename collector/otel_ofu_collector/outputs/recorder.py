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
    """A window consumer appending each closed window to a JSON-lines file, flushed per batch.

    ``start`` opens the file (appending: a restarted collector's windows follow the last run's), ``shutdown``
    closes it; ``with ReportRecorder(path) as recorder:`` does both.
    """

    path: Path = attrs.field(converter=Path)
    written: int = attrs.field(init=False, default=0)
    _file: TextIO | None = attrs.field(init=False, default=None)
    _lock: threading.Lock = attrs.field(init=False, factory=threading.Lock)

    def start(self) -> None:
        try:
            self._file = self.path.open("a", encoding="utf-8")
        except OSError as error:
            raise OSError(f"cannot append window records to {self.path} ({error.strerror or error})") from error

    def consume_windows(self, windows: Sequence[WindowReport]) -> None:
        # Without the windows' per-GPU means: a live screen's, too large to keep for every window of a run.
        encoded = encode_lines([attrs.evolve(report, gpus=()) if report.gpus else report for report in windows])
        if not encoded:
            return
        with self._lock:
            if self._file is None:
                raise RuntimeError("the window recorder is not started")
            self._file.write("".join(line + "\n" for _, line in encoded))
            self._file.flush()
            self.written += len(encoded)

    def shutdown(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None

    def __enter__(self) -> ReportRecorder:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.shutdown()
