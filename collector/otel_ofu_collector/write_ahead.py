"""A write-ahead of accepted requests, so a SIGKILL or a crash does not lose the open window.

The spool keeps closed windows' outputs; what the open windows hold lives only in memory. With a spool
configured the service also appends every request that had points accepted to this SQLite file, and
after each flush records up to when windows are closed (``flushed_ns``, the flush's time) and drops the
requests that can hold no point of a window still open. On the next start it replays what is left into
the fresh aggregator after closing through the recorded time, so points of windows already exported are
late and only the open windows are rebuilt. A clean stop closes every window, so it clears the file.

A request received at ``r`` holds points stamped at most ``r + max_future`` (the decoder's future bound);
the window of such a point closes at most a window plus the lateness after it, so the request is needed
until the flush time passes ``r + max_future + window + lateness``.

Requests are written in batches (every ``batch_s`` or ``batch_size`` requests, one transaction each): one
insert per request would more than double the cost of ingest. A kill loses at most the last batch.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

import attrs


@attrs.define
class WriteAhead:
    path: str
    batch_s: float = 0.2
    batch_size: int = 256
    _db: sqlite3.Connection = attrs.field(init=False)
    _batch: list[tuple[int, bytes]] = attrs.field(init=False, factory=list)
    _batch_started: float = attrs.field(init=False, default=0.0)
    _lock: threading.Lock = attrs.field(init=False, factory=threading.Lock)
    _closed: bool = attrs.field(init=False, default=False)

    def __attrs_post_init__(self) -> None:
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")  # survives a killed process; the spool's own choice too
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS accepted "
            "(id INTEGER PRIMARY KEY AUTOINCREMENT, received_ns INTEGER NOT NULL, payload BLOB NOT NULL)"
        )
        self._db.execute("CREATE TABLE IF NOT EXISTS state (key TEXT PRIMARY KEY, value INTEGER NOT NULL)")

    def append(self, payload: bytes, received_ns: int) -> None:
        with self._lock:
            if self._closed:
                return
            if not self._batch:
                self._batch_started = time.monotonic()
            self._batch.append((received_ns, payload))
            if len(self._batch) >= self.batch_size or time.monotonic() - self._batch_started >= self.batch_s:
                self._write_batch()

    def _write_batch(self) -> None:
        """Write what waits, in one transaction; the caller holds the lock."""
        if self._batch:
            self._db.execute("BEGIN")
            self._db.executemany("INSERT INTO accepted (received_ns, payload) VALUES (?, ?)", self._batch)
            self._db.execute("COMMIT")
            self._batch.clear()

    def closed_through(self, flushed_ns: int, needed_after_ns: int) -> None:
        """Windows are closed as of ``flushed_ns``; requests received before ``needed_after_ns`` are done."""
        with self._lock:
            if self._closed:
                return
            self._write_batch()
            self._db.execute("BEGIN")
            self._db.execute("INSERT OR REPLACE INTO state (key, value) VALUES ('flushed_ns', ?)", (flushed_ns,))
            self._db.execute("DELETE FROM accepted WHERE received_ns < ?", (needed_after_ns,))
            self._db.execute("COMMIT")

    def pending(self) -> tuple[int | None, list[bytes]]:
        """What a previous run left: the time it had closed windows through (None: none closed), and the
        requests to replay, oldest first."""
        with self._lock:
            self._write_batch()
            row = self._db.execute("SELECT value FROM state WHERE key = 'flushed_ns'").fetchone()
            payloads = [bytes(found[0]) for found in self._db.execute("SELECT payload FROM accepted ORDER BY id")]
        return (None if row is None else int(row[0])), payloads

    def clear(self) -> None:
        """Every window is closed and handed on (a clean stop): nothing to replay."""
        with self._lock:
            if not self._closed:
                self._batch.clear()
                self._db.execute("BEGIN")
                self._db.execute("DELETE FROM accepted")
                self._db.execute("DELETE FROM state")
                self._db.execute("COMMIT")

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._write_batch()
                self._closed = True
                self._db.close()
