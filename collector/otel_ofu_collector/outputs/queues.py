"""Bounded FIFOs of serialized requests for a delivery: in memory, or a SQLite spool that survives a restart.

Bytes are what the spool stores, so a request comes back after a restart exactly as it would have been
sent. A full queue drops its oldest entries and says how many.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import attrs

from otel_ofu import names
from otel_ofu_collector.storage import sqlite_files
from otel_ofu_collector.storage.sqlite_files import RETRY_S

logger = logging.getLogger(__name__)


class Queue(Protocol):
    """FIFO of serialized requests with a bound; ``put`` returns how many old entries it dropped."""

    def put(self, payload: bytes) -> int: ...

    def peek(self) -> tuple[int, bytes] | None: ...

    def remove(self, entry_id: int) -> None: ...

    def __len__(self) -> int: ...

    def close(self) -> None: ...


@attrs.define
class MemoryQueue:
    """In-memory bounded FIFO (by count and bytes)."""

    max_items: int = 1024
    max_bytes: int = 256 * 1024 * 1024
    _items: collections.deque[tuple[int, bytes]] = attrs.field(factory=collections.deque)
    _bytes: int = 0
    _next_id: int = 0
    _lock: threading.Lock = attrs.field(factory=threading.Lock)

    def put(self, payload: bytes) -> int:
        dropped = 0
        with self._lock:
            self._next_id += 1
            self._items.append((self._next_id, payload))
            self._bytes += len(payload)
            while len(self._items) > 1 and (len(self._items) > self.max_items or self._bytes > self.max_bytes):
                _, old = self._items.popleft()
                self._bytes -= len(old)
                dropped += 1
        return dropped

    def peek(self) -> tuple[int, bytes] | None:
        with self._lock:
            return self._items[0] if self._items else None

    def remove(self, entry_id: int) -> None:
        with self._lock:
            if self._items and self._items[0][0] == entry_id:
                _, old = self._items.popleft()
                self._bytes -= len(old)

    def __len__(self) -> int:
        return len(self._items)

    def close(self) -> None:
        return None


_TABLES = {"spool": ("id INTEGER PRIMARY KEY AUTOINCREMENT, payload BLOB NOT NULL", ("payload",))}


@attrs.define
class SqliteSpool:
    """A bounded FIFO of serialized requests in a SQLite file: what it holds survives a restart.

    It raises nothing past its methods but the constructor (a damaged file that cannot be moved aside:
    ``sqlite_files``). When the disk refuses a write (full, failing) it goes on in memory: new requests are
    held there after the file's, in order, within ``max_bytes`` of their own (beyond, the oldest held one
    is dropped, as from a full queue); a request sent whose delete the disk refused is skipped, and deleted
    when the disk takes writes again, which is tried at most every ``retry_s``. Then what is held goes to
    the file first. What is still held at ``close`` is lost, counted in ``unstored_dropped`` and logged:
    only a kill or a stop while the disk refuses loses window outputs the downstream did not take.
    """

    path: str
    max_bytes: int = 256 * 1024 * 1024
    clock: Callable[[], float] = time.monotonic
    retry_s: float = RETRY_S
    unstored_dropped: int = attrs.field(init=False, default=0)
    files_unreadable: int = attrs.field(init=False, default=0)  # files moved aside
    wal_damaged: int = attrs.field(init=False, default=0)  # damaged WALs found
    _db: sqlite3.Connection | None = attrs.field(init=False, default=None)
    _lock: threading.Lock = attrs.field(factory=threading.Lock)
    _left: int | None = None  # once closed: how many requests it kept for the next start
    _held: collections.deque[tuple[int, bytes]] = attrs.field(init=False, factory=collections.deque)
    _held_bytes: int = attrs.field(init=False, default=0)
    _held_serial: int = attrs.field(init=False, default=0)  # held requests' ids: -1, -2, ... (the file's are > 0)
    _sent_through: int = attrs.field(init=False, default=0)  # rows up to this id were sent, their delete refused
    _failing: bool = attrs.field(init=False, default=False)
    _retry_at: float = attrs.field(init=False, default=0.0)
    _counted: tuple[int, int] = attrs.field(init=False, default=(0, 0))  # the file's (rows, bytes) last read

    def __attrs_post_init__(self) -> None:
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        with self._lock:
            self._open()

    def put(self, payload: bytes) -> int:
        with self._lock:
            if self._left is not None:
                return 0
            self._held_serial += 1
            self._held.append((-self._held_serial, payload))
            self._held_bytes += len(payload)
            dropped = self._store()
            while len(self._held) > 1 and self._held_bytes > self.max_bytes:
                _, old = self._held.popleft()
                self._held_bytes -= len(old)
                dropped += 1
            return dropped

    def peek(self) -> tuple[int, bytes] | None:
        with self._lock:
            if self._left is not None:
                return None
            if self._db is not None:
                try:
                    row = self._db.execute(
                        "SELECT id, payload FROM spool WHERE id > ? ORDER BY id LIMIT 1", (self._sent_through,)
                    ).fetchone()
                except sqlite3.Error as error:  # what the file holds waits; what memory holds can go
                    self._fail(str(error))
                    row = None
                if row is not None:
                    return int(row[0]), bytes(row[1])
            return self._held[0] if self._held else None

    def remove(self, entry_id: int) -> None:
        with self._lock:
            if self._left is not None:
                return
            if self._held and self._held[0][0] == entry_id:
                _, old = self._held.popleft()
                self._held_bytes -= len(old)
                return
            if entry_id <= 0 or self._db is None:
                return
            self._sent_through = max(self._sent_through, entry_id)
            if self._failing and self.clock() < self._retry_at:
                return
            try:
                self._db.execute("DELETE FROM spool WHERE id <= ?", (self._sent_through,))
            except sqlite3.Error as error:
                self._fail(str(error))
                return
            self._sent_through = 0
            self._back(0)

    @property
    def size_bytes(self) -> int:
        """Bytes of requests held (0 once closed)."""
        with self._lock:
            return 0 if self._left is not None else self._count()[1] + self._held_bytes

    def self_metrics(self) -> dict[str, Any]:
        """Its size, and the files found damaged (the collector's ``SelfMetrics``; what it could not keep is its
        sender's to say, by stream)."""
        damaged = {"spool_unreadable": self.files_unreadable, "spool_wal": self.wal_damaged}
        return {names.COLLECTOR_SPOOL_SIZE.name: self.size_bytes, names.COLLECTOR_FILES_DAMAGED.name: damaged}

    def __len__(self) -> int:
        # A scrape of the self-metrics may come while the service shuts down, after the spool closed.
        with self._lock:
            if self._left is not None:
                return self._left
            return self._count()[0] + len(self._held)

    def close(self) -> None:
        with self._lock:
            if self._left is not None:
                return
            self._retry_at = 0.0  # one last try: the disk may take what memory holds now
            self._store()
            if self._held:
                self.unstored_dropped += len(self._held)
                logger.warning(
                    "spool %s: %d request(s) held in memory while the disk refused them are lost at shutdown",
                    self.path,
                    len(self._held),
                )
                self._held.clear()
            self._left = self._count()[0]
            if self._db is not None:
                # closing checkpoints the WAL: a full disk may refuse it, the WAL then stays
                with contextlib.suppress(sqlite3.Error):
                    self._db.close()
                self._db = None

    # --- the disk ---------------------------------------------------------------------------------

    def _open(self) -> bool:
        """Open the file (moving a damaged one aside); False when the disk refuses. The caller holds the lock."""
        opened = sqlite_files.open_store(self.path, "spool", _TABLES)
        self.files_unreadable += opened.moved_aside is not None
        self.wal_damaged += opened.wal_damage is not None
        self._db = opened.db
        if opened.db is None:
            self._fail(opened.error)
        return opened.db is not None

    def _store(self) -> int:
        """Move what memory holds to the file (after deleting what was sent), within ``max_bytes``: how many
        of the file's oldest were dropped for it. The caller holds the lock."""
        if not self._held and not self._sent_through:
            return 0
        if self._failing and self.clock() < self._retry_at:
            return 0
        dropped = 0
        try:
            if self._db is None and not self._open():
                return 0
            assert self._db is not None
            self._db.execute("BEGIN")
            self._db.execute("DELETE FROM spool WHERE id <= ?", (self._sent_through,))
            self._db.executemany("INSERT INTO spool (payload) VALUES (?)", [(payload,) for _, payload in self._held])
            dropped = self._trim(self._db)
            self._db.execute("COMMIT")
        except sqlite3.Error as error:
            if self._db is not None and self._db.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    self._db.execute("ROLLBACK")
            self._fail(str(error))
            return 0
        stored = len(self._held)
        self._held.clear()
        self._held_bytes = 0
        self._sent_through = 0
        self._back(stored)
        return dropped

    def _trim(self, db: sqlite3.Connection) -> int:
        """Drop the file's oldest requests beyond ``max_bytes`` (never the last one); how many."""
        dropped = 0
        size = int(db.execute("SELECT COALESCE(SUM(LENGTH(payload)), 0) FROM spool").fetchone()[0])
        while size > self.max_bytes:
            row = db.execute("SELECT id, LENGTH(payload) FROM spool ORDER BY id LIMIT 1").fetchone()
            count = db.execute("SELECT COUNT(*) FROM spool").fetchone()[0]
            if row is None or count <= 1:
                break
            db.execute("DELETE FROM spool WHERE id = ?", (row[0],))
            size -= int(row[1])
            dropped += 1
        return dropped

    def _count(self) -> tuple[int, int]:
        """The file's requests not yet sent and their bytes (the last count read, if the disk fails)."""
        if self._db is not None:
            try:
                row = self._db.execute(
                    "SELECT COUNT(*), COALESCE(SUM(LENGTH(payload)), 0) FROM spool WHERE id > ?", (self._sent_through,)
                ).fetchone()
                self._counted = (int(row[0]), int(row[1]))
            except sqlite3.Error as error:
                self._fail(str(error))
        return self._counted

    def _back(self, stored: int) -> None:
        if self._failing:
            self._failing = False
            logger.info("spool %s: writing again (%d request(s) held in memory meanwhile now in it)", self.path, stored)

    def _fail(self, error: str) -> None:
        if not self._failing:
            self._failing = True
            logger.warning(
                "spool %s cannot be written (%s): holding new window outputs in memory (at most %d bytes), "
                "retrying every %.0f s; a kill, crash or stop meanwhile loses what is held",
                self.path,
                error,
                self.max_bytes,
                self.retry_s,
            )
        self._retry_at = self.clock() + self.retry_s
