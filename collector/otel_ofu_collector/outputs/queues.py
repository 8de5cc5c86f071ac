"""Bounded FIFOs of serialized requests for a delivery: in memory, or a SQLite spool that survives a restart.

Bytes are what the spool stores, so a request comes back after a restart exactly as it would have been
sent. A full queue drops its oldest entries and says how many.
"""

from __future__ import annotations

import collections
import sqlite3
import threading
from pathlib import Path
from typing import Protocol

import attrs


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


@attrs.define
class SqliteSpool:
    """A bounded FIFO of serialized requests in a SQLite file: what it holds survives a restart."""

    path: str
    max_bytes: int = 256 * 1024 * 1024
    _db: sqlite3.Connection = attrs.field(init=False)
    _lock: threading.Lock = attrs.field(factory=threading.Lock)
    _left: int | None = None  # once closed: how many requests it kept for the next start

    def __attrs_post_init__(self) -> None:
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS spool (id INTEGER PRIMARY KEY AUTOINCREMENT, payload BLOB NOT NULL)"
        )

    def _size(self) -> int:
        row = self._db.execute("SELECT COALESCE(SUM(LENGTH(payload)), 0) FROM spool").fetchone()
        return int(row[0])

    def put(self, payload: bytes) -> int:
        dropped = 0
        with self._lock:
            self._db.execute("INSERT INTO spool (payload) VALUES (?)", (payload,))
            size = self._size()
            while size > self.max_bytes:
                row = self._db.execute("SELECT id, LENGTH(payload) FROM spool ORDER BY id LIMIT 1").fetchone()
                count = self._db.execute("SELECT COUNT(*) FROM spool").fetchone()[0]
                if row is None or count <= 1:
                    break
                self._db.execute("DELETE FROM spool WHERE id = ?", (row[0],))
                size -= int(row[1])
                dropped += 1
        return dropped

    def peek(self) -> tuple[int, bytes] | None:
        with self._lock:
            if self._left is not None:
                return None
            row = self._db.execute("SELECT id, payload FROM spool ORDER BY id LIMIT 1").fetchone()
        return None if row is None else (int(row[0]), bytes(row[1]))

    def remove(self, entry_id: int) -> None:
        with self._lock:
            if self._left is None:
                self._db.execute("DELETE FROM spool WHERE id = ?", (entry_id,))

    @property
    def size_bytes(self) -> int:
        """Bytes of requests held (0 once closed)."""
        with self._lock:
            return 0 if self._left is not None else self._size()

    def __len__(self) -> int:
        # A scrape of the self-metrics may come while the service shuts down, after the spool closed.
        with self._lock:
            if self._left is not None:
                return self._left
            return int(self._db.execute("SELECT COUNT(*) FROM spool").fetchone()[0])

    def close(self) -> None:
        with self._lock:
            if self._left is None:
                self._left = int(self._db.execute("SELECT COUNT(*) FROM spool").fetchone()[0])
                self._db.close()
