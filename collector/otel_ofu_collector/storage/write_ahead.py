"""A write-ahead of accepted requests, so a SIGKILL or a crash does not lose the open window.

The spool keeps closed windows' outputs; what the open windows hold lives only in memory. With a spool
configured the service also appends every request that had points accepted to this SQLite file, and
after each flush records up to when windows are closed (``flushed_ns``, the flush's time) and drops the
requests that can hold no point of a window still open. On the next start it replays what is left into
the fresh aggregator after closing through the recorded time, so points of windows already exported are
late and only the open windows are rebuilt. A clean stop closes every window, the open one too, early:
it deletes the file and leaves a fresh one holding only that close time, so the points a producer sends
for that window after the restart are late rather than the window's second export.

A request received at ``r`` holds points stamped at most ``r + max_future`` (the decoder's future bound);
the window of such a point closes at most a window plus the lateness after it, so the request is needed
until the flush time passes ``r + max_future + window + lateness``.

Requests are written in batches (every ``batch_s`` or ``batch_size`` requests, one transaction each): one
insert per request would more than double the cost of ingest. A kill loses at most the last batch.

The write-ahead only makes the open windows crash-safe: their points are in memory whatever happens to it.
So nothing here raises past its methods but the constructor (a damaged file that cannot be moved aside).
A disk that refuses a write turns it off: the batch is counted in ``unwritten``, one line says so, and it
tries again at most every ``retry_s`` (a flush's ``closed_through`` the disk refused meanwhile is written
with the next batch, so a kill after it comes back replays no window already exported). Each record
carries the CRC-32 of its bytes: a record whose bytes changed on disk is skipped and counted
(``damaged_records``), never replayed as other numbers. Damaged files and WALs: ``sqlite_files``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import threading
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from otel_ofu import names
from otel_ofu_collector.storage import sqlite_files
from otel_ofu_collector.storage.sqlite_files import RETRY_S

logger = logging.getLogger(__name__)

_TABLES = {
    "accepted": (
        "id INTEGER PRIMARY KEY AUTOINCREMENT, received_ns INTEGER NOT NULL, payload BLOB NOT NULL, crc INTEGER",
        ("received_ns", "payload", "crc"),
    ),
    "state": ("key TEXT PRIMARY KEY, value INTEGER NOT NULL", ("key", "value")),
}


@attrs.define
class WriteAhead:
    path: str
    batch_s: float = 0.2
    batch_size: int = 256
    clock: Callable[[], float] = time.monotonic
    retry_s: float = RETRY_S
    unwritten: int = attrs.field(init=False, default=0)  # accepted requests the disk refused
    damaged_records: int = attrs.field(init=False, default=0)  # records skipped by pending(): bytes changed
    files_unreadable: int = attrs.field(init=False, default=0)  # files moved aside
    wal_damaged: int = attrs.field(init=False, default=0)  # damaged WALs found
    # Records a start's replay could not use, by why: damaged (bytes changed, unparsable) or failed (it raised).
    skipped: dict[str, int] = attrs.field(init=False, factory=lambda: {"damaged": 0, "failed": 0})
    _db: sqlite3.Connection | None = attrs.field(init=False, default=None)
    _batch: list[tuple[int, bytes, int]] = attrs.field(init=False, factory=list)
    _batch_started: float = attrs.field(init=False, default=0.0)
    _lock: threading.Lock = attrs.field(init=False, factory=threading.Lock)
    _closed: bool = attrs.field(init=False, default=False)
    _failing: bool = attrs.field(init=False, default=False)
    _retry_at: float = attrs.field(init=False, default=0.0)
    _unwritten_before: int = attrs.field(init=False, default=0)  # ``unwritten`` when the disk began refusing
    _state: tuple[int, int] | None = attrs.field(init=False, default=None)  # a refused closed_through
    _stale: bool = attrs.field(init=False, default=False)  # opened only after the start: its records are old
    # A file that was there at the start but could not be opened (locked by another program, a failing disk): its
    # records were not replayed, so they are not this run's to delete. It is moved aside, kept, before this run
    # writes a fresh one or at a clean stop, whichever comes first.
    _unread: bool = attrs.field(init=False, default=False)

    def __attrs_post_init__(self) -> None:
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        existed = os.path.lexists(self.path)
        with self._lock:
            if not self._open():
                self._stale = True  # what the file holds could not be replayed at the start
                self._unread = existed
                if existed:
                    logger.warning(
                        "write-ahead %s cannot be read at the start: its records are not replayed, and it is kept "
                        "(moved aside before this run writes its own)",
                        self.path,
                    )

    def append(self, payload: bytes, received_ns: int) -> None:
        with self._lock:
            if self._closed:
                return
            now = self.clock()
            if self._failing and now < self._retry_at:
                self.unwritten += 1
                return
            if not self._batch:
                self._batch_started = now
            self._batch.append((received_ns, payload, zlib.crc32(payload)))
            if self._failing or len(self._batch) >= self.batch_size or now - self._batch_started >= self.batch_s:
                self._write()

    @property
    def intact(self) -> bool:
        """Whether every accepted request reached the file: the disk refused none (a stop may then leave the open
        windows to the next start, which replays them)."""
        with self._lock:
            return not self._failing and self.unwritten == 0

    def closed_through(self, flushed_ns: int, needed_after_ns: int) -> None:
        """Windows are closed as of ``flushed_ns``; requests received before ``needed_after_ns`` are done."""
        with self._lock:
            if self._closed:
                return
            self._state = (flushed_ns, needed_after_ns)
            if not self._failing or self.clock() >= self._retry_at:
                self._write()

    def pending(self) -> tuple[int | None, list[bytes]]:
        """What a previous run left: the time it had closed windows through (None: none closed), and the
        requests to replay, oldest first. Records whose bytes fail their CRC are left out, counted in
        ``damaged_records`` and deleted."""
        with self._lock:
            if self._batch:
                self._write()
            if self._db is None:
                return None, []
            flushed_ns: int | None = None
            payloads: list[bytes] = []
            damaged: list[int] = []
            try:
                row = self._db.execute("SELECT value FROM state WHERE key = 'flushed_ns'").fetchone()
                flushed_ns = None if row is None else int(row[0])
                for record_id, payload, crc in self._db.execute("SELECT id, payload, crc FROM accepted ORDER BY id"):
                    # crc None: a record copied from a file without the column (see sqlite_files.readable_rows)
                    if isinstance(payload, bytes) and (crc is None or zlib.crc32(payload) == crc):
                        payloads.append(payload)
                    else:
                        damaged.append(record_id)
            except (sqlite3.Error, TypeError, ValueError) as error:  # TypeError, ValueError: a damaged value
                logger.warning("write-ahead %s: reading it stopped (%s); replaying what was read", self.path, error)
            with contextlib.suppress(sqlite3.Error):  # else they are skipped again at the next start
                self._db.executemany("DELETE FROM accepted WHERE id = ?", [(record_id,) for record_id in damaged])
            self.damaged_records += len(damaged)
        return flushed_ns, payloads

    def clear(self, closed_through_ns: int | None = None) -> None:
        """Every window is closed and handed on (a clean stop): nothing to replay. Deletes the file, which
        needs no free space, unlike a DELETE; then, given ``closed_through_ns`` (the windows' close time),
        writes a fresh file holding only that, for the next start to close through. A disk that refuses
        it costs only that: the next start may export the window the stop closed early a second time."""
        with self._lock:
            self._closed = True
            self._batch.clear()
            self._close_db()
            try:
                if self._unread:
                    self._set_aside_unread()
                else:
                    sqlite_files.remove_files(self.path)
            except OSError as error:
                logger.error(
                    "write-ahead %s could not be deleted at a clean stop (%s): the next start replays windows "
                    "already exported",
                    self.path,
                    error,
                )
                return
            if closed_through_ns is None:
                return
            opened = sqlite_files.open_store(self.path, "write-ahead", _TABLES)
            try:
                if opened.db is None:
                    raise sqlite3.OperationalError(opened.error)
                with opened.db:
                    opened.db.execute("INSERT INTO state (key, value) VALUES ('flushed_ns', ?)", (closed_through_ns,))
            except sqlite3.Error as error:
                logger.warning(
                    "write-ahead %s: the close time of a clean stop could not be kept (%s): points sent for the "
                    "window it closed early may make the next start export that window again",
                    self.path,
                    error,
                )
            finally:
                if opened.db is not None:
                    opened.db.close()

    def self_metrics(self) -> dict[str, Any]:
        """What it could not write or replay, and the files found damaged (the collector's ``SelfMetrics``)."""
        damaged = {"write_ahead_unreadable": self.files_unreadable, "write_ahead_wal": self.wal_damaged}
        return {
            names.COLLECTOR_WRITE_AHEAD_UNWRITTEN.name: self.unwritten,
            names.COLLECTOR_WRITE_AHEAD_SKIPPED.name: dict(self.skipped),
            names.COLLECTOR_FILES_DAMAGED.name: damaged,
        }

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                if self._batch:
                    self._write()
                self._closed = True
                self._close_db()

    # --- the disk ---------------------------------------------------------------------------------

    def _open(self) -> bool:
        """Open the file (moving a damaged one aside); False when the disk refuses. The caller holds the lock."""
        opened = sqlite_files.open_store(self.path, "write-ahead", _TABLES)
        self.files_unreadable += opened.moved_aside is not None
        self.wal_damaged += opened.wal_damage is not None
        self._db = opened.db
        if opened.db is None:
            self._fail(opened.error)
        return opened.db is not None

    def _set_aside_unread(self) -> None:
        """Move the file the start could not read aside, with one line; OSError when it cannot be moved."""
        moved = sqlite_files.move_aside(self.path, "write-ahead", "never read by this run")
        self._unread = False
        logger.warning(
            "write-ahead %s was never read by this run: moved aside to %s, its records kept", self.path, moved
        )

    def _write(self) -> None:
        """Write the batch and a waiting closed_through in one transaction; the caller holds the lock."""
        try:
            if self._db is None and self._unread:
                self._set_aside_unread()
            if self._db is None and not self._open():
                raise sqlite3.OperationalError("the file cannot be opened")
            assert self._db is not None
            self._db.execute("BEGIN")
            if self._stale:
                self._db.execute("DELETE FROM accepted")  # a run before the start's: its windows are gone
            self._db.executemany("INSERT INTO accepted (received_ns, payload, crc) VALUES (?, ?, ?)", self._batch)
            if self._state is not None:
                flushed_ns, needed_after_ns = self._state
                self._db.execute("INSERT OR REPLACE INTO state (key, value) VALUES ('flushed_ns', ?)", (flushed_ns,))
                self._db.execute("DELETE FROM accepted WHERE received_ns < ?", (needed_after_ns,))
            self._db.execute("COMMIT")
        except (sqlite3.Error, OSError) as error:
            self._rollback()
            self.unwritten += len(self._batch)
            self._batch.clear()
            self._fail(str(error))
            return
        self._batch.clear()
        self._state = None
        self._stale = False
        if self._failing:
            self._failing = False
            logger.info(
                "write-ahead %s: writing again; %d accepted request(s) were not written ahead meanwhile",
                self.path,
                self.unwritten - self._unwritten_before,
            )

    def _fail(self, error: str) -> None:
        if not self._failing:
            self._failing = True
            self._unwritten_before = self.unwritten
            logger.warning(
                "write-ahead %s cannot be written (%s): going on without it, retrying every %.0f s; the accepted "
                "points are in the windows, but a kill or crash meanwhile loses those of the open windows",
                self.path,
                error,
                self.retry_s,
            )
        self._retry_at = self.clock() + self.retry_s

    def _rollback(self) -> None:
        try:
            if self._db is not None and self._db.in_transaction:
                self._db.execute("ROLLBACK")
        except sqlite3.Error:
            pass  # SQLite rolls back itself on a failed write

    def _close_db(self) -> None:
        if self._db is not None:
            # closing checkpoints the WAL: a full disk may refuse it, the WAL then stays
            with contextlib.suppress(sqlite3.Error):
                self._db.close()
            self._db = None
