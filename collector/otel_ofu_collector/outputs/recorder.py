"""A window consumer appending each closed window to a JSON-lines file (the ``record_codec`` format)."""

from __future__ import annotations

import io
import logging
import os
import threading
from collections.abc import Sequence
from pathlib import Path

import attrs

from otel_ofu import names
from otel_ofu_collector.outputs.record_codec import encode_lines
from otel_ofu_collector.results import WindowReport

logger = logging.getLogger(__name__)


@attrs.define
class ReportRecorder:
    """A window consumer appending each closed window to a JSON-lines file, written per batch.

    ``start`` opens the file (appending: a restarted collector's windows follow the last run's), ``shutdown``
    closes it; ``with ReportRecorder(path) as recorder:`` does both.

    A batch is written whole or not at all: a write the disk refuses (full, a file size limit) is cut back
    to where the batch began, so a reader never meets half a line, and its windows are counted in
    ``unrecorded``. One warning line when writes start failing and one when they work again; the next
    batch simply tries again (the file costs nothing to try: it is the windows' copy, not their delivery).
    """

    path: Path = attrs.field(converter=Path)
    written: int = attrs.field(init=False, default=0)
    unrecorded: int = attrs.field(init=False, default=0)  # windows a refused write left out of the file
    _file: io.FileIO | None = attrs.field(init=False, default=None)
    _failing: int = attrs.field(init=False, default=0)  # windows left out since the writes began failing
    _cut_to: int | None = attrs.field(init=False, default=None)  # a refused batch's start, when cutting it back failed
    _lock: threading.Lock = attrs.field(init=False, factory=threading.Lock)

    def start(self) -> None:
        try:
            self._file = io.FileIO(self.path, "a")  # unbuffered: a failed write leaves nothing behind to retry
        except OSError as error:
            raise OSError(f"cannot append window records to {self.path} ({error.strerror or error})") from error

    def self_metrics(self) -> dict[str, dict[str, int]]:
        """The windows a refused write left out of the file (the collector's ``SelfMetrics``)."""
        return {names.COLLECTOR_DROPPED.name: {"records_failed": self.unrecorded}}

    def consume_windows(self, windows: Sequence[WindowReport]) -> None:
        # Without the windows' per-GPU means: a live screen's, too large to keep for every window of a run.
        encoded = encode_lines([attrs.evolve(report, gpus=()) if report.gpus else report for report in windows])
        if not encoded:
            return
        data = "".join(line + "\n" for _, line in encoded).encode()
        with self._lock:
            if self._file is None:
                raise RuntimeError("the window recorder is not started")
            try:
                self._append(self._file, data)
            except OSError as error:
                self.unrecorded += len(encoded)
                if not self._failing:
                    logger.warning(
                        "window records %s cannot be written (%s): windows are left out of it until it can",
                        self.path,
                        error.strerror or error,
                    )
                self._failing += len(encoded)
                return
            if self._failing:
                logger.info("window records %s: writing again; %d window(s) left out", self.path, self._failing)
                self._failing = 0
            self.written += len(encoded)

    def _append(self, file: io.FileIO, data: bytes) -> None:
        """All of ``data`` at the end of the file, or (raising) the file as it was. A refused batch whose cut
        back failed too (an I/O error) is cut before the next one is written, never written after."""
        fd = file.fileno()
        if self._cut_to is not None:
            os.ftruncate(fd, self._cut_to)
            self._cut_to = None
        began = os.fstat(fd).st_size
        view = memoryview(data)
        try:
            while view:
                done = file.write(view)
                if not done:  # an unbuffered write that takes nothing is a refusal too
                    raise OSError(f"wrote nothing of {len(view)} bytes")
                view = view[done:]
        except OSError:
            try:
                os.ftruncate(fd, began)  # needs no free space
            except OSError:
                self._cut_to = began
            raise

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
