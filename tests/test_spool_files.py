"""What someone who can write the spool's folder can put there, and two collectors given one ``--spool``: each costs
only itself, says so in one line, and never hangs a start, reads a file whole, writes through a link or loses a
run's records without a word."""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import subprocess
import threading
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from otel_ofu import names
from otel_ofu.testing.otlp_requests import gpu_request
from otel_ofu_collector.outputs.queues import SqliteSpool
from otel_ofu_collector.service import CollectorService
from otel_ofu_collector.storage.write_ahead import WriteAhead
from tests.collector_helpers import CollectorProcess
from tests.test_collector_write_ahead import (
    SERVICE_LOG,
    W0,
    accepted_file,
    killed_run,
    spooled,
    warnings_about,
)

S = 1_000_000_000


@pytest.fixture
def collectors() -> Iterator[list[CollectorProcess]]:
    started: list[CollectorProcess] = []
    yield started
    for process in started:
        process.kill()


def _start(collectors: list[CollectorProcess], spool: Path) -> CollectorProcess:
    process = CollectorProcess.start(
        "--listen", "127.0.0.1:0", "--spool", str(spool), "--export-endpoint", "http://127.0.0.1:9",
        "--prometheus-port", "off",
    )  # fmt: skip
    collectors.append(process)
    return process


def _refused(process: CollectorProcess) -> list[str]:
    """The lines of a collector that must stop at its start: exit 2 within 30 s."""
    try:
        code = process.process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        raise AssertionError("the collector started:\n" + "\n".join(process.lines)) from None
    process.kill()  # joins its reader: every line is in
    assert code == 2, process.lines
    return process.lines


# --- 8. one spool, one collector ----------------------------------------------------------------------------


def test_a_second_collector_on_the_same_spool_refuses_to_start_with_one_line(
    tmp_path: Path, collectors: list[CollectorProcess]
) -> None:
    spool = tmp_path / "spool.sqlite"
    first = _start(collectors, spool)
    first.wait_for("otel-ofu collector ready")
    lines = _refused(_start(collectors, spool))
    assert len(lines) == 1, lines
    assert f"spool {spool} is in use by another collector (pid {first.process.pid})" in lines[0]
    first.kill()  # a kill frees it: the next start takes it over
    _start(collectors, spool).wait_for("otel-ofu collector ready")


def test_the_spool_lock_is_released_at_a_stop(tmp_path: Path) -> None:
    spool = tmp_path / "spool.sqlite"
    first = CollectorService(spooled(spool), environ={})
    with pytest.raises(OSError, match="in use by another collector"):
        CollectorService(spooled(spool), environ={})
    first.start()
    first.stop(0)
    second = CollectorService(spooled(spool), environ={})
    second.stop(0)


# --- 12. files in place of the spool's -----------------------------------------------------------------------


@pytest.mark.parametrize("which", ["spool", "write_ahead", "lock"])
def test_a_symlinked_spool_file_is_refused_and_its_target_left_alone(
    tmp_path: Path, collectors: list[CollectorProcess], which: str
) -> None:
    spool = tmp_path / "spool.sqlite"
    victim = tmp_path / "victim.txt"
    victim.write_text("someone else's file\n")
    link = {"spool": spool, "write_ahead": accepted_file(spool), "lock": Path(f"{spool}.lock")}[which]
    link.symlink_to(victim)
    lines = _refused(_start(collectors, spool))
    assert len(lines) == 1, lines
    assert f"{link} is a symbolic link" in lines[0]
    assert victim.read_text() == "someone else's file\n"
    assert link.is_symlink()


def _checkpoint(path: Path) -> None:
    with contextlib.closing(sqlite3.connect(path)) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")


def _in_a_thread(work: Any, bound_s: float = 20.0) -> Any:
    """``work()`` on a thread of its own; AssertionError when it has not returned within ``bound_s``."""
    found: list[Any] = []
    thread = threading.Thread(target=lambda: found.append(work()), daemon=True)
    thread.start()
    thread.join(bound_s)
    if thread.is_alive():
        raise AssertionError(f"still running after {bound_s:g} s")
    return found[0]


@pytest.mark.parametrize("which", ["spool", "write_ahead"])
def test_a_fifo_in_place_of_a_wal_does_not_hang_the_start_and_costs_only_itself(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, which: str
) -> None:
    spool = tmp_path / "spool.sqlite"
    target = spool if which == "spool" else accepted_file(spool)
    if which == "spool":  # an undelivered output the FIFO must not cost
        kept = SqliteSpool(str(spool))
        kept.put(b"an undelivered window")
        kept.close()
    else:
        killed_run(target, W0 + 20 * S)
        _checkpoint(target)  # into the file: the WAL the FIFO replaces holds nothing it alone had
    Path(f"{target}-wal").unlink(missing_ok=True)
    os.mkfifo(f"{target}-wal")
    caplog.set_level(logging.INFO, logger=SERVICE_LOG)
    try:
        service = _in_a_thread(lambda: CollectorService(spooled(spool), environ={}))
    finally:
        _unblock(Path(f"{target}-wal"))
    try:
        [line] = warnings_about(caplog, "-wal")  # one line
        assert f"{target}: its WAL is damaged: its -wal is a FIFO, not a WAL: moved aside to {target}-wal." in line
        assert not Path(f"{target}-wal").is_fifo()
        counts = service.self_metrics()[names.COLLECTOR_FILES_DAMAGED.name]
        assert counts[f"{which}_wal"] == 1
        if which == "spool":
            assert service.exports is not None
            assert len(service.exports.queue) == 1
        else:
            jobs = {job.job_id: job.gpus for report in service.flush(W0 + 60 * S + 11 * S) for job in report.jobs}
            assert jobs == {
                "j": pytest.approx(20 * 10 / 60)
            }  # the killed run's 20 GPUs, 10 s each of the 60 s, replayed
    finally:
        service.stop(0)


def _unblock(fifo: Path) -> None:
    """Open a FIFO for writing without waiting (releasing a reader blocked on it), if it still is one."""
    for found in (fifo, *fifo.parent.glob(f"{fifo.name}.damaged-*")):
        if found.is_fifo():
            with contextlib.suppress(OSError):
                os.close(os.open(found, os.O_WRONLY | os.O_NONBLOCK))


def test_a_sparse_two_gigabyte_wal_is_checked_without_reading_it_whole(tmp_path: Path) -> None:
    spool = tmp_path / "spool.sqlite"
    path = accepted_file(spool)
    wal = killed_run(path, W0 + 20 * S)  # a real WAL header and frames, then 2 GiB of holes
    with open(f"{path}-wal", "r+b") as file:
        file.truncate(len(wal) + 2 * 1024**3)
    tracemalloc.start()
    try:
        ahead = WriteAhead(str(path))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    try:
        assert peak < 64 * 1024**2, f"{peak / 1024**2:.0f} MiB allocated"
        assert len(ahead.pending()[1]) == 20  # every record the WAL holds before the holes
    finally:
        ahead.close()


def test_a_zero_length_write_ahead_whose_wal_holds_records_is_said_and_kept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spool = tmp_path / "spool.sqlite"
    path = accepted_file(spool)
    wal = killed_run(path, W0 + 20 * S)
    os.truncate(path, 0)  # what a crash of the file system can leave
    caplog.set_level(logging.INFO, logger=SERVICE_LOG)
    service = CollectorService(spooled(spool), environ={})
    try:
        [line] = warnings_about(caplog, "is empty but its WAL holds")
        [moved] = [p for p in tmp_path.glob(f"{path.name}.damaged-*") if not p.name.endswith(("-wal", "-shm"))]
        assert str(moved) in line
        assert Path(f"{moved}-wal").read_bytes() == wal  # the records are kept, for whoever can recover them
        counts = service.self_metrics()[names.COLLECTOR_FILES_DAMAGED.name]
        assert counts["write_ahead_unreadable"] == 1
    finally:
        service.stop(0)


def _records_in(path: Path) -> int:
    with contextlib.closing(sqlite3.connect(path)) as db:
        return int(db.execute("SELECT COUNT(*) FROM accepted").fetchone()[0])


@pytest.mark.skipif(os.getuid() == 0, reason="as root every file is readable: the attack needs another user")
def test_a_write_ahead_this_user_cannot_read_is_moved_aside_with_one_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spool = tmp_path / "spool.sqlite"
    path = accepted_file(spool)
    killed_run(path, W0 + 20 * S)
    _checkpoint(path)  # the records in the file itself
    records = path.read_bytes()
    path.chmod(0)
    caplog.set_level(logging.INFO, logger=SERVICE_LOG)
    service = CollectorService(spooled(spool), environ={})
    try:
        [line] = warnings_about(caplog, "moved aside")
        assert "permission" in line
        counts = service.self_metrics()[names.COLLECTOR_FILES_DAMAGED.name]
        assert counts["write_ahead_unreadable"] == 1
    finally:
        service.stop(0)
    [moved] = [p for p in tmp_path.glob(f"{path.name}.damaged-*") if not p.name.endswith(("-wal", "-shm"))]
    moved.chmod(0o600)
    assert moved.read_bytes() == records


def test_a_write_ahead_the_start_could_not_read_is_kept_not_deleted_at_the_clean_stop(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spool = tmp_path / "spool.sqlite"
    path = accepted_file(spool)
    killed_run(path, W0 + 20 * S)
    holder = sqlite3.connect(path, isolation_level=None)  # another program holds it while the collector starts
    holder.execute("PRAGMA locking_mode=EXCLUSIVE")
    holder.execute("SELECT COUNT(*) FROM accepted").fetchone()  # locked from here until it closes
    caplog.set_level(logging.INFO, logger=SERVICE_LOG)
    try:
        service = CollectorService(spooled(spool), environ={})
    finally:
        holder.close()
    service.start()
    service.stop(0)  # a clean stop: what it never read is not its to delete
    [line] = warnings_about(caplog, "never read")
    kept = [p for p in tmp_path.glob(f"{path.name}.*") if not p.name.endswith(("-wal", "-shm"))]
    assert len(kept) == 1, sorted(tmp_path.iterdir())
    assert str(kept[0]) in line
    assert _records_in(kept[0]) == 20


def test_refusing_a_spool_link_needs_no_spool_folder_of_its_own(tmp_path: Path) -> None:
    """The folder above the spool may itself be a link (a mount elsewhere): only the files are checked."""
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "linked").symlink_to(real)
    spool = tmp_path / "linked" / "spool.sqlite"
    service = CollectorService(spooled(spool), environ={})
    try:
        assert service.ingest(gpu_request({"GPU-1": ("j", 0.5)}, time_ns=W0 + 30 * S)).accepted == 1
    finally:
        service.stop(0)
    assert (real / "spool.sqlite").exists()
