"""What the two SQLite files of ``--spool`` share: opening one that may be damaged, and checking its WAL.

The spool (window outputs awaiting the downstream) and the write-ahead (the open windows' accepted
requests) are SQLite databases in WAL mode: a kill leaves their last transactions in the ``-wal`` file,
which the next open replays into the database. What can be wrong with them at a start:

- The file is not one of ours: random bytes, a folder, a database cut short or with broken pages
  (``PRAGMA quick_check``), another program's tables. ``open_store`` moves it aside, with its WAL, as
  ``FILE.damaged-<UTC time>`` (for whoever wants to look), copies the rows it can still read into a fresh
  file (a broken page costs its own rows only), says so in one line, and the collector starts.
- The WAL has damaged frames. SQLite's recovery stops at the first frame whose checksum fails and drops
  every transaction from there on without a word (the database stays consistent, so no integrity check
  sees it). ``wal_damage`` reads the frames as SQLite will, before SQLite opens the file, and says so.

A write that fails (a full disk, an I/O error) is not damage: the stores go on without the disk, say so
once, and try again at most every ``RETRY_S``.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sqlite3
import stat
import struct
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import BinaryIO, Final

import attrs

logger = logging.getLogger(__name__)

RETRY_S: Final = 5.0  # how often a store the disk refused tries again

_WAL_HEADER = 32
_FRAME_HEADER = 24
_WAL_MAGIC = {0x377F0682: False, 0x377F0683: True}  # magic -> checksums over big-endian words
_MASK = 0xFFFFFFFF
# After a checkpoint SQLite starts the WAL over at its beginning, salt-1 one higher: frames of the older
# generations beyond the new ones are what a WAL legitimately ends in. Random bytes fall in this range of
# salt-1 values below the header's with a chance of 1 in 4096.
_OLDER_GENERATIONS = 1 << 20
_SIDE_FILES = ("-wal", "-shm")


def wal_checksum(data: bytes, big_endian: bool, seed: tuple[int, int]) -> tuple[int, int]:
    """SQLite's WAL checksum of ``data`` (a multiple of 8 bytes) continuing from ``seed``: over its 32-bit
    words in pairs, s0 += x0 + s1; s1 += x1 + s0 (mod 2**32)."""
    words = struct.unpack(f"{'>' if big_endian else '<'}{len(data) // 4}I", data)
    s0, s1 = seed
    for x0, x1 in zip(words[0::2], words[1::2], strict=True):
        s0 = (s0 + x0 + s1) & _MASK
        s1 = (s1 + x1 + s0) & _MASK
    return s0, s1


def wal_damage(data: bytes) -> str | None:
    """``wal_damage_in`` of a WAL's bytes."""
    return wal_damage_in(io.BytesIO(data), len(data))


def wal_damage_in(wal: BinaryIO, size: int) -> str | None:
    """What SQLite's recovery of this WAL (a ``-wal`` file of ``size`` bytes, open for reading) will drop that a
    run had committed, in words; None when nothing: no WAL, or one it reads whole but for an uncommitted or
    older tail.

    SQLite keeps the frames from the start that carry the header's salts and continue its checksum chain,
    up to the last commit among them. Past that a WAL may hold, legitimately, frames of a transaction never
    committed (a kill mid-write, a rollback) and frames of an older generation (other salts). Damage is a
    commit frame of this generation past the break, a frame header that belongs to no generation, or a WAL
    that ends inside a frame (SQLite writes whole frames).

    Read a frame at a time, and past the break only each frame's header: a WAL of gigabytes (holes, say)
    costs a page of memory and a read per frame, never its size."""
    if size <= _WAL_HEADER:
        return None if not size or size == _WAL_HEADER else "it ends inside its header"
    header = wal.read(_WAL_HEADER)
    magic, _version, page_size, _checkpoints, salt1, salt2, c1, c2 = struct.unpack(">8I", header)
    big_endian = _WAL_MAGIC.get(magic)
    if (
        big_endian is None
        or not 512 <= page_size <= 65536
        or page_size & (page_size - 1)
        or wal_checksum(header[:24], big_endian, (0, 0)) != (c1, c2)
    ):
        return "its header is damaged: SQLite ignores every frame in it"
    frame_size = _FRAME_HEADER + page_size
    checksum = (c1, c2)
    offset = _WAL_HEADER
    while offset + frame_size <= size:
        wal.seek(offset)
        frame = wal.read(frame_size)
        page, _commit, salt_1, salt_2, f1, f2 = struct.unpack(">6I", frame[:_FRAME_HEADER])
        if (salt_1, salt_2) != (salt1, salt2):
            break
        checksum = wal_checksum(frame[:8] + frame[_FRAME_HEADER:], big_endian, checksum)
        if checksum != (f1, f2) or page == 0:
            break
        offset += frame_size
    kept = (offset - _WAL_HEADER) // frame_size
    for at in range(offset, size - frame_size + 1, frame_size):
        wal.seek(at)
        page, commit, salt_1, salt_2 = struct.unpack(">4I", wal.read(16))
        if (salt_1, salt_2) == (salt1, salt2):
            if commit:
                return f"frame {kept + 1} fails its checksum: SQLite drops the transactions written from there on"
        elif not 0 < (salt1 - salt_1) & _MASK <= _OLDER_GENERATIONS:
            overwritten = (at - _WAL_HEADER) // frame_size + 1
            return f"frame {overwritten} is overwritten: what was written from frame {kept + 1} on is lost"
    if (size - _WAL_HEADER) % frame_size:
        return f"it ends inside frame {(size - _WAL_HEADER) // frame_size + 1}: its last transaction is lost"
    return None


def is_damage(error: sqlite3.Error) -> bool:
    """Whether SQLite found the file itself broken (not a disk that refuses a write)."""
    return str(getattr(error, "sqlite_errorname", "")).startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB"))


class Unusable(Exception):
    """The file at a store's path cannot be used as it is; the message says why."""


@attrs.frozen
class Opened:
    """What ``open_store`` found. ``db`` None: SQLite could not open or create the file now (``error``:
    a full or failing disk), so the store goes on without it and tries again later."""

    db: sqlite3.Connection | None
    error: str = ""
    moved_aside: str | None = None  # where a file that could not be used went
    wal_damage: str | None = None  # what a damaged WAL lost


def connect(path: str) -> sqlite3.Connection:
    """A connection as both stores use it: autocommit (they BEGIN themselves), shared by their threads."""
    return sqlite3.connect(path, check_same_thread=False, isolation_level=None)


def open_store(path: str, what: str, tables: Mapping[str, tuple[str, Sequence[str]]]) -> Opened:
    """Open the store ``what`` ("spool", "write-ahead") at ``path``, creating ``tables`` ({name: (column
    definitions, the columns a damaged copy's rows are read by)}). A file it cannot use is moved aside and
    its readable rows copied into a fresh one; each finding is one log line. Raises OSError, one line, only
    when such a file cannot be moved aside."""
    wal = _side_files_checked(path, what) or _wal_damage_at(path)
    if wal is not None:
        logger.warning("%s %s: its WAL is damaged: %s", what, path, wal)
    try:
        return attrs.evolve(Opened(_open(path, tables)), wal_damage=wal)
    except Unusable as why:
        reason = str(why)
    except sqlite3.Error as error:
        return Opened(None, error=str(error), wal_damage=wal)
    moved = move_aside(path, what, reason)
    try:
        db = _open(path, tables)
    except (Unusable, sqlite3.Error) as error:
        logger.warning("%s %s could not be read (%s): moved aside to %s", what, path, reason, moved)
        return Opened(None, error=str(error), moved_aside=moved, wal_damage=wal)
    kept = _copy_readable(moved, db, tables)
    logger.warning(
        "%s %s could not be read (%s): moved aside to %s, %d readable record(s) kept", what, path, reason, moved, kept
    )
    return Opened(db, moved_aside=moved, wal_damage=wal)


def _kind(path: str) -> str | None:
    """What is at ``path`` when it is there but not a regular file ("a FIFO", "a symbolic link", ...), else None."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    if stat.S_ISREG(mode):
        return None
    kinds = ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"),
             (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device"))  # fmt: skip
    return next((name for test, name in kinds if test(mode)), "not a file")


def _side_files_checked(path: str, what: str) -> str | None:
    """A WAL or shared-memory index that is not a regular file (a FIFO would hang the open forever, a link would
    take SQLite's writes elsewhere) is moved aside on its own, before anything opens it: what it stands for in
    words (the transactions only a WAL held are lost), or None when both are regular or absent."""
    found: str | None = None
    for suffix in _SIDE_FILES:
        name = path + suffix
        kind = _kind(name)
        if kind is None:
            continue
        target = _aside_name(name)
        try:
            os.rename(name, target)
        except OSError as error:
            raise OSError(
                f"{what} {path}: its {suffix} is {kind} and cannot be moved aside: {error.strerror}"
            ) from None
        if suffix == "-wal":  # said in the WAL's one line (``open_store``)
            found = f"its -wal is {kind}, not a WAL: moved aside to {target}; the transactions only a WAL held are lost"
        else:
            logger.warning("%s %s: its %s is %s, not a file: moved aside to %s", what, path, suffix, kind, target)
    return found


def remove_files(path: str) -> None:
    """Delete a store's file with its WAL and shared-memory index (missing ones are fine); OSError if not."""
    for name in (path, *(path + suffix for suffix in _SIDE_FILES)):
        with contextlib.suppress(FileNotFoundError):
            os.remove(name)


def _wal_damage_at(path: str) -> str | None:
    try:
        # O_NONBLOCK: nothing but a regular file is here (``_side_files_checked``), and even a FIFO swapped in
        # since cannot hang the open.
        fd = os.open(path + "-wal", os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except OSError:  # none (the usual case after a clean stop)
        return None
    with os.fdopen(fd, "rb") as wal:
        size = os.fstat(fd).st_size
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return wal_damage_in(wal, size)


def _open(path: str, tables: Mapping[str, tuple[str, Sequence[str]]]) -> sqlite3.Connection:
    """Open and check: Unusable when the file is not a store of ours, sqlite3.Error when the disk refuses."""
    for name in (path, *(path + suffix for suffix in _SIDE_FILES)):
        kind = _kind(name)
        if kind is not None:
            raise Unusable(f"{name} is {kind}, not a file")
    if os.path.exists(path):
        if not os.access(path, os.R_OK | os.W_OK):
            raise Unusable("this user cannot read and write it: permission denied")
        wal_size = os.path.getsize(path + "-wal") if os.path.exists(path + "-wal") else 0
        if os.path.getsize(path) == 0 and wal_size > _WAL_HEADER:
            # SQLite would read an empty database and delete the WAL on closing it: every record in it, gone.
            raise Unusable(f"it is empty but its WAL holds {wal_size} bytes (a crash of its file system?)")
    db = connect(path)
    try:
        _check(db, tables)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")  # survives a killed process; a power loss may cost the last writes
        for table, (columns, _) in tables.items():
            db.execute(f"CREATE TABLE IF NOT EXISTS {table} ({columns})")
    except BaseException:
        db.close()
        raise
    return db


def _check(db: sqlite3.Connection, tables: Mapping[str, tuple[str, Sequence[str]]]) -> None:
    """Unusable unless the file is empty or holds our tables, with our columns, on sound pages."""
    try:
        found = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        others = found - set(tables) - {"sqlite_sequence"}
        if others:
            raise Unusable(f"it holds tables of another program: {', '.join(sorted(others))}")
        for table, (_, columns) in tables.items():
            if table in found:
                db.execute(f"SELECT {', '.join(columns)} FROM {table} LIMIT 0")
        problems = [row[0] for row in db.execute("PRAGMA quick_check")]
    except sqlite3.Error as error:
        if is_damage(error) or error.sqlite_errorname == "SQLITE_ERROR":  # the latter: no such column
            raise Unusable(str(error)) from error
        raise
    if problems != ["ok"]:
        raise Unusable(f"its pages are damaged: {problems[0]}")


def _aside_name(path: str) -> str:
    """``path.damaged-<UTC time>`` (with a serial when taken): where a file that cannot be used goes."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    target = f"{path}.damaged-{stamp}"
    serial = 1
    while any(os.path.lexists(target + suffix) for suffix in ("", *_SIDE_FILES)):
        serial += 1
        target = f"{path}.damaged-{stamp}-{serial}"
    return target


def move_aside(path: str, what: str, reason: str) -> str:
    """Rename ``path`` with its WAL and shared-memory index to ``_aside_name``; where it went. OSError, one line,
    when it cannot be moved."""
    target = _aside_name(path)
    try:
        os.rename(path, target)
        if os.path.lexists(path + "-wal"):  # the copy's own WAL: applied to a fresh file it would corrupt it
            os.rename(path + "-wal", target + "-wal")
        if os.path.lexists(path + "-shm"):
            os.rename(path + "-shm", target + "-shm")
    except OSError as error:
        raise OSError(f"{what} {path} cannot be read ({reason}) nor moved aside: {error.strerror or error}") from error
    return target


def _copy_readable(source: str, db: sqlite3.Connection, tables: Mapping[str, tuple[str, Sequence[str]]]) -> int:
    """Copy the rows of ``source`` that can be read into ``db``'s tables; how many (of the first table)."""
    copied = 0
    try:
        db.execute("BEGIN")
        for index, (table, (_, columns)) in enumerate(tables.items()):
            marks = ", ".join("?" * len(columns))
            statement = f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks})"
            for row in readable_rows(source, table, columns):
                db.execute(statement, row)
                copied += index == 0
        db.execute("COMMIT")
    except sqlite3.Error:  # the fresh file refuses (a full disk): it starts empty
        if db.in_transaction:
            db.execute("ROLLBACK")
        return 0
    return copied


def readable_rows(path: str, table: str, columns: Sequence[str]) -> Iterator[tuple[object, ...]]:
    """The rows of ``table`` in a damaged file that can still be read, by rowid; a column it lacks reads as
    NULL. A broken page costs only its own rows: the read seeks past it (galloping, then bisecting back to
    the first row that reads). Nothing from a file SQLite cannot read at all. One row per query: a cursor
    steps to the next row before it hands over the current one, so a broken next page would cost it."""
    if _kind(path) is not None or not os.path.exists(path) or os.path.getsize(path) == 0:
        return  # not a file; or an empty one, whose WAL SQLite would delete on closing it
    if any(_kind(path + suffix) is not None for suffix in _SIDE_FILES):
        return
    db = sqlite3.connect(path)
    try:
        try:
            present = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
            top = _top_rowid(db, table)
        except sqlite3.Error:
            return
        selected = ", ".join(column if column in present else "NULL" for column in columns)
        query = f"SELECT rowid, {selected} FROM {table} WHERE rowid >= ? ORDER BY rowid LIMIT 1"
        start: int | None = 0
        while start is not None:
            try:
                row = db.execute(query, (start,)).fetchone()
            except sqlite3.Error:
                start = _next_readable(db, query, start, top)
                continue
            if row is None:
                return
            start = int(row[0]) + 1
            yield tuple(row[1:])
    finally:
        db.close()


def _top_rowid(db: sqlite3.Connection, table: str) -> int:
    """The highest rowid the table has held: AUTOINCREMENT's own record, else its last row, else 0."""
    for query in (f"SELECT seq FROM sqlite_sequence WHERE name = '{table}'", f"SELECT max(rowid) FROM {table}"):
        try:
            row = db.execute(query).fetchone()
        except sqlite3.Error:
            continue
        if row is not None and row[0] is not None:
            return int(row[0])
    return 0


def _next_readable(db: sqlite3.Connection, query: str, failed: int, top: int) -> int | None:
    """The lowest rowid after ``failed`` from which a row reads again, or None when none up to ``top``."""

    def reads(start: int) -> bool:
        try:
            db.execute(query, (start,)).fetchone()
        except sqlite3.Error:
            return False
        return True

    bad, step = failed, 1
    while not reads(bad + step):
        bad += step
        step *= 2
        if bad >= top:
            return None
    good = bad + step
    while good - bad > 1:  # the rows between are unreadable up to some rowid: find it
        middle = (bad + good) // 2
        bad, good = (bad, middle) if reads(middle) else (middle, good)
    return good
