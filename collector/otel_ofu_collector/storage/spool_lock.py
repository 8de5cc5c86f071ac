"""One collector per ``--spool``, and the spool's files never reached through a symbolic link.

Two collectors given one spool both deliver what it holds (every window twice) and each rebuilds the open
windows from the other's write-ahead; after a kill one deletes what the other still needed. So the first takes
an exclusive ``flock`` on ``<spool>.lock`` (the kernel drops it when the process ends, however it ends) and a
second is refused at its start with one line naming the holder's pid.

A link in place of the spool, its write-ahead or the lock file is refused rather than followed: whoever can
write the spool's folder could otherwise point the collector's writes, its moving aside of damaged files and
its deleting of the write-ahead at a clean stop at any file the collector may write. Resolving the link once
at the start would not help: the folder's owner could swap it afterwards. The folder itself may be a link (a
mount elsewhere); a deployment that means a linked spool passes the resolved path.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

import attrs

LOCK_SUFFIX = ".lock"


def refuse_links(*paths: str) -> None:
    """OSError, one line, when one of ``paths`` is a symbolic link."""
    for path in paths:
        if os.path.islink(path):
            raise OSError(
                f"{path} is a symbolic link: refused (the spool's files are written, moved aside and deleted "
                "where they are named, never through a link; give --spool the path the link points to)"
            )


@attrs.define
class SpoolLock:
    """The lock on one spool, held from ``take`` until ``release`` (or the end of the process)."""

    spool: str
    _fd: int | None = None

    @classmethod
    def take(cls, spool: str) -> SpoolLock:
        """Lock ``spool`` for this process; OSError, one line, when another holds it or a file is a link."""
        lock_path = spool + LOCK_SUFFIX
        refuse_links(spool, f"{spool}.accepted", lock_path)
        Path(spool).parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except OSError as error:
            raise OSError(f"cannot lock spool {spool} ({lock_path}: {error.strerror or error})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
            os.close(fd)
            raise OSError(
                f"spool {spool} is in use by another collector (pid {holder}): two collectors on one spool "
                "would export its windows twice; give each its own --spool"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return cls(spool, fd)

    def release(self) -> None:
        """Let another collector take the spool (idempotent). The lock file stays: deleting it could let a
        starting collector lock a file another is about to delete."""
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
