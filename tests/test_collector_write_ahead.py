"""The write-ahead and the spool under damaged files and a full disk: the collector always starts, keeps
what it can read, and counts and says what it lost.

Real SQLite files throughout. A kill is a real process ending without closing anything (``os._exit``), so
its WAL is left as a SIGKILL leaves it; a full disk is RLIMIT_FSIZE (what ``ulimit -f`` sets): writes
past it fail with EFBIG, which SQLite reports as a disk I/O error.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import resource
import sqlite3
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)

from otel_ofu import names
from otel_ofu.testing.otlp_requests import gpu_request
from otel_ofu.testing.otlp_sink import OtlpSink, unused_port
from otel_ofu_collector.config import AggregatorConfig
from otel_ofu_collector.outputs.queues import SqliteSpool
from otel_ofu_collector.receivers.otlp_grpc import EXPORT_METHOD
from otel_ofu_collector.service import CollectorOptions, CollectorService
from otel_ofu_collector.storage.write_ahead import WriteAhead
from tests.collector_helpers import CollectorProcess, collector_options, self_metric

S = 1_000_000_000
W0 = 1_700_000_040 * S  # a multiple of 60 s: windows are aligned to the epoch
WINDOW = 60 * S
ROOT = Path(__file__).resolve().parent.parent
SERVICE_LOG = "otel_ofu_collector"


def spooled(spool: Path, **overrides: Any) -> CollectorOptions:
    """A collector with a spool (so a write-ahead) and a downstream that is down: outputs stay spooled."""
    settings: dict[str, Any] = {
        "spool_path": str(spool),
        "export_endpoint": f"http://127.0.0.1:{unused_port()}",
        "self_telemetry": False,
        "write_ahead_batch_s": 0.0,  # each request written at once
        **overrides,
    }
    return collector_options(None, **settings)


def accepted_file(spool: Path) -> Path:
    return Path(f"{spool}.accepted")


def request_bytes(gpus: dict[str, tuple[str, float]], time_ns: int) -> bytes:
    return gpu_request(gpus, time_ns=time_ns).SerializeToString()


def jobs_of(service: CollectorService, now_ns: int) -> dict[str, tuple[object, float]]:
    """{job: (OFU, GPUs that reported)} of the windows ``flush(now_ns)`` closes (OFU as ``object``: tests compare it
    with pytest.approx). Each GPU of these tests sends one 10 s interval (``gpu_request``): its GPU-seconds / 10."""
    return {
        job.job_id: (job.ofu, round(job.loss.gpu_time_s / 10, 9) if job.loss is not None else 0.0)
        for report in service.flush(now_ns)
        for job in report.jobs
    }


def warnings_about(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and text in r.getMessage()]


def aside(path: Path) -> list[Path]:
    """What a damaged ``path`` was moved aside to (its WAL piece, if any, left out)."""
    return [found for found in path.parent.glob(f"{path.name}.damaged-*") if not found.name.endswith(("-wal", "-shm"))]


def run_python(code: str, *args: str) -> tuple[list[Any], str]:
    """Run ``code`` in a fresh interpreter (the repository on its path); its JSON lines and its stderr."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("OTEL_")}
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # nothing of the interpreter's own writes under a file size limit
    done = subprocess.run(
        [sys.executable, "-c", code, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines() if line.strip()], done.stderr


# A previous run that wrote 20 requests ahead, one GPU each (GPU-00 ... GPU-19 of job "j", OFU 0.5), one
# transaction each, and was killed: nothing closed, the WAL as a SIGKILL leaves it.
KILLED_RUN = """
import os, sys
from otel_ofu.testing.otlp_requests import gpu_request
from otel_ofu_collector.storage.write_ahead import WriteAhead
ahead = WriteAhead(sys.argv[1], batch_s=0.0)
t = int(sys.argv[2])
for k in range(20):
    ahead.append(gpu_request({f"GPU-{k:02d}": ("j", 0.5)}, time_ns=t).SerializeToString(), t)
os._exit(0)
"""


def killed_run(path: Path, time_ns: int) -> bytes:
    """Run KILLED_RUN against ``path``; the WAL it left."""
    run_python(KILLED_RUN, str(path), str(time_ns))
    wal = Path(f"{path}-wal")
    assert wal.stat().st_size > 0  # the kill left its writes in the WAL, not yet checkpointed
    return wal.read_bytes()


@pytest.fixture
def sink() -> Iterator[OtlpSink]:
    with OtlpSink.start(hold_limit_s=5) as started:
        yield started


# --- 21.3: damaged records and unreadable files -------------------------------------------------------


def test_damaged_records_are_skipped_and_counted_and_the_good_ones_replayed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spool = tmp_path / "spool.sqlite"
    t = W0 + 20 * S
    first = WriteAhead(str(accepted_file(spool)), batch_s=0.0)
    for gpu, job, ofu in (("GPU-1", "a", 0.5), ("GPU-2", "b", 0.7), ("GPU-3", "c", 0.3), ("GPU-4", "a", 0.25)):
        first.append(request_bytes({gpu: (job, ofu)}, t), t)
    first.close()  # a run that ended before its window closed: the four records stay
    with contextlib.closing(sqlite3.connect(accepted_file(spool))) as db, db:
        [(whole,)] = db.execute("SELECT payload FROM accepted WHERE id = 3").fetchall()
        db.execute("UPDATE accepted SET payload = ? WHERE id = 2", (random.Random(2).randbytes(300),))
        db.execute("UPDATE accepted SET payload = ? WHERE id = 3", (whole[: len(whole) // 2],))  # half a record
    caplog.set_level(logging.INFO, logger=SERVICE_LOG)
    service = CollectorService(spooled(spool), clock=lambda: W0 + 30 * S, environ={})
    try:
        # b's and c's records are lost; a's two GPUs are kept: job.ofu = (0.5 + 0.25) / 2 = 0.375
        assert jobs_of(service, W0 + WINDOW + 11 * S) == {"a": (pytest.approx(0.375), 2)}
        assert service.self_metrics()[names.COLLECTOR_WRITE_AHEAD_SKIPPED.name] == {"damaged": 2, "failed": 0}
        [line] = warnings_about(caplog, "replayed")
        assert "2 damaged record(s) skipped" in line
    finally:
        service.stop(0)


def test_a_record_whose_replay_raises_costs_only_itself(tmp_path: Path) -> None:
    spool = tmp_path / "spool.sqlite"
    t = W0 + 20 * S
    first = WriteAhead(str(accepted_file(spool)), batch_s=0.0)
    for gpu in ("GPU-1", "GPU-2", "GPU-3"):
        first.append(request_bytes({gpu: ("a", 0.5)}, t), t)
    first.close()
    calls = [0]

    def clock() -> int:
        """The decoder reads the clock once per request (its future bound): the second read fails."""
        calls[0] += 1
        if calls[0] == 2:
            raise OSError("the clock failed")
        return W0 + 30 * S

    service = CollectorService(spooled(spool), clock=clock, environ={})
    try:
        assert service.self_metrics()[names.COLLECTOR_WRITE_AHEAD_SKIPPED.name] == {"damaged": 0, "failed": 1}
        assert jobs_of(service, W0 + WINDOW + 11 * S) == {"a": (pytest.approx(0.5), 2)}  # the other two GPUs
    finally:
        service.stop(0)


def test_a_damaged_close_time_is_ignored_rather_than_closing_the_windows_to_come(tmp_path: Path) -> None:
    spool = tmp_path / "spool.sqlite"
    t = W0 + 20 * S
    first = WriteAhead(str(accepted_file(spool)), batch_s=0.0)
    first.append(request_bytes({"GPU-1": ("a", 0.5)}, t), t)
    first.closed_through(2**62, 0)  # as if damaged: a close time a century ahead (nothing done before 0)
    first.close()
    service = CollectorService(spooled(spool), clock=lambda: W0 + 30 * S, environ={})
    try:
        # before: every window up to 2**62 ns was marked closed, so the replayed point was late, and so
        # would every point be for a century
        assert jobs_of(service, W0 + WINDOW + 11 * S) == {"a": (pytest.approx(0.5), 1)}
        assert service.ingest(gpu_request({"GPU-2": ("b", 0.4)}, time_ns=W0 + 80 * S)).accepted == 1
    finally:
        service.stop(0)


def _random_file(path: Path) -> None:
    path.write_bytes(random.Random(21).randbytes(10_000))


def _folder(path: Path) -> None:
    path.mkdir()
    (path / "inside").write_text("a folder where the file should be")


def _half_a_file(path: Path) -> None:
    """A real store of ten 3000-byte records, cut after its first 12 KiB (three of its pages)."""
    if path.name.endswith(".accepted"):
        ahead = WriteAhead(str(path), batch_s=0.0)
        for k in range(10):
            ahead.append(bytes([k]) * 3000, k)
        ahead.close()
    else:
        spool = SqliteSpool(str(path))
        for k in range(10):
            spool.put(bytes([k]) * 3000)
        spool.close()
    with path.open("r+b") as cut:
        cut.truncate(12 * 1024)


def _another_schema(path: Path) -> None:
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        db.execute("CREATE TABLE accepted (name TEXT)")
        db.execute("CREATE TABLE spool (name TEXT)")
        db.execute("INSERT INTO spool VALUES ('not ours')")


@pytest.mark.parametrize("damage", [_random_file, _folder, _half_a_file, _another_schema])
@pytest.mark.parametrize("which", ["spool", "write_ahead"])
def test_an_unreadable_file_is_moved_aside_with_one_line_and_the_collector_starts_and_works(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, which: str, damage: Callable[[Path], None]
) -> None:
    spool = tmp_path / "spool.sqlite"
    target = spool if which == "spool" else accepted_file(spool)
    damage(target)
    caplog.set_level(logging.INFO, logger=SERVICE_LOG)
    service = CollectorService(spooled(spool), clock=lambda: W0 + 30 * S, environ={})
    try:
        [moved] = aside(target)
        [line] = warnings_about(caplog, "moved aside")
        assert str(target) in line
        assert str(moved) in line
        counts = service.self_metrics()[names.COLLECTOR_FILES_DAMAGED.name]
        assert counts == {**dict.fromkeys(counts, 0), f"{which}_unreadable": 1}
        # ...and both files work: the window's outputs spooled, the accepted request written ahead
        assert service.ingest(gpu_request({"GPU-1": ("j", 0.5)}, time_ns=W0 + 30 * S)).accepted == 1
        reader = WriteAhead(str(accepted_file(spool)))
        assert reader.pending()[1] != []
        reader.close()
        service.flush(W0 + WINDOW + 11 * S)
        assert service.exports is not None
        assert len(service.exports.queue) == 1
    finally:
        service.stop(0)
    reopened = SqliteSpool(str(spool))
    assert len(reopened) == 1  # the spool file is a spool again, its window kept
    reopened.close()


def test_the_readable_records_of_a_write_ahead_with_a_damaged_page_are_kept(tmp_path: Path) -> None:
    spool = tmp_path / "spool.sqlite"
    path = accepted_file(spool)
    t = W0 + 20 * S
    first = WriteAhead(str(path), batch_s=0.0)
    for k in range(5):  # ~3 KB each (a long host name): one record per 4 KiB page
        request = gpu_request({f"GPU-{k}": ("j", 0.1 * (k + 1))}, time_ns=t, host="node-" + "x" * 3000)
        first.append(request.SerializeToString(), t)
    first.close()
    content = bytearray(path.read_bytes())
    page = content.find(b"GPU-2") // 4096 * 4096
    content[page : page + 8] = b"\xff" * 8  # the page header of GPU-2's record: no longer a b-tree page
    path.write_bytes(content)
    # The long host names are longer than the default --max-attribute-length: allowed here.
    service = CollectorService(spooled(spool, max_attribute_length=4096), clock=lambda: W0 + 30 * S, environ={})
    try:
        assert len(aside(path)) == 1
        # GPU-2's record is lost with its page; the others' OFU: (0.1 + 0.2 + 0.4 + 0.5) / 4 = 0.3
        assert jobs_of(service, W0 + WINDOW + 11 * S) == {"j": (pytest.approx(0.3), 4)}
    finally:
        service.stop(0)


@pytest.fixture
def collector_process() -> Iterator[Callable[..., CollectorProcess]]:
    started: list[CollectorProcess] = []

    def start(*argv: str) -> CollectorProcess:
        started.append(CollectorProcess.start(*argv))
        return started[-1]

    yield start
    for process in started:
        process.kill()


def send(port: int, request: ExportMetricsServiceRequest) -> ExportMetricsServiceResponse:
    """One OTLP/gRPC export; an error status raises grpc.RpcError."""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.unary_unary(EXPORT_METHOD, None, None)
        return ExportMetricsServiceResponse.FromString(call(request.SerializeToString(), timeout=10))


def job_ofu_points(sink: OtlpSink, job: str) -> int:
    """How many job.ofu points of ``job`` the downstream received: once per window, never twice."""
    return sum(
        [kv.value.string_value for kv in point.attributes if kv.key == names.JOB_ID] == [job]
        for _rm, _sm, metric in sink.metrics(names.JOB_OFU.name)
        for point in metric.gauge.data_points
    )


def test_the_command_starts_with_a_damaged_record_and_a_random_spool_file_and_replays_the_rest(
    tmp_path: Path, sink: OtlpSink, collector_process: Callable[..., CollectorProcess]
) -> None:
    spool = tmp_path / "spool.sqlite"
    now = time.time_ns()
    # The points' 10 s intervals inside one window, two windows back: a run killed before closing it, which this
    # start closes (a clean stop keeps the window still open for the next start instead).
    now -= now % (60 * S) + 109 * S
    first = WriteAhead(str(accepted_file(spool)), batch_s=0.0)
    first.append(request_bytes({"GPU-1": ("kept", 0.5)}, now), now)
    first.append(request_bytes({"GPU-2": ("lost", 0.5)}, now), now)
    first.close()
    with contextlib.closing(sqlite3.connect(accepted_file(spool))) as db, db:
        db.execute("UPDATE accepted SET payload = ? WHERE id = 2", (random.Random(7).randbytes(200),))
    _random_file(spool)
    collector = collector_process(
        "--listen", "127.0.0.1:0", "--spool", str(spool), "--export-endpoint", sink.grpc_endpoint
    )
    collector.wait_for("otel-ofu collector ready")
    assert collector.terminate() == 0
    log = "\n".join(collector.lines)
    assert "Traceback" not in log
    assert len([line for line in collector.lines if "moved aside" in line]) == 1
    assert "1 damaged record(s) skipped" in log
    assert sink.wait_for(lambda s: job_ofu_points(s, "kept") == 1)
    assert job_ofu_points(sink, "lost") == 0


# --- a restart bills every GPU-second once -------------------------------------------------------------------


def test_a_restart_with_a_write_ahead_closes_the_window_it_fell_in_once_and_whole(tmp_path: Path) -> None:
    # A stop at W0 + 30 s with GPU-1's interval (W0 + 10, W0 + 20] (OFU 0.5) in the open window (W0, W0 + 60]: the
    # window stays open, its request in the write-ahead. The next start replays it and takes the producer's next
    # interval (W0 + 20, W0 + 30] (OFU 0.7): the window closes once, with both, 20 GPU-s at OFU 0.6. (Before, the
    # stop closed it early with the first interval and the second was refused as late: half the window billed.)
    spool = tmp_path / "spool.sqlite"
    first = CollectorService(spooled(spool), clock=lambda: W0 + 30 * S, environ={})
    first.ingest(gpu_request({"GPU-1": ("j", 0.5)}, time_ns=W0 + 20 * S))
    assert first.stop(0) == []  # nothing was due
    close_time, kept = WriteAhead(str(accepted_file(spool))).pending()
    assert (close_time, len(kept)) == (W0 + 30 * S, 1)
    second = CollectorService(spooled(spool), clock=lambda: W0 + 35 * S, environ={})
    try:
        taken = second.ingest(gpu_request({"GPU-1": ("j", 0.7)}, time_ns=W0 + 30 * S))
        assert (taken.accepted, taken.rejected) == (1, 0)
        assert jobs_of(second, W0 + WINDOW + 11 * S) == {"j": (pytest.approx(0.6), 2)}  # 20 GPU-s: two intervals
    finally:
        second.stop(0)


def test_a_restart_without_a_write_ahead_reports_each_part_of_its_window_at_its_own_times(
    sink: OtlpSink,
) -> None:
    # Without a spool nothing outlives the process: the stop at W0 + 30 s exports the window it falls in with what
    # it has, stamped (W0, W0 + 30 s]; the next run, started at W0 + 35 s, exports the rest stamped
    # (W0 + 35 s, W0 + 60 s]. Each GPU-second once (10 + 20 s), and two delta points a backend adds up, not one
    # point sent twice with the same timestamps (which it would take for a duplicate and keep one of).
    options = collector_options(sink, aggregator=AggregatorConfig(window_s=60.0, lateness_s=10.0))
    now = [W0 - 600 * S]  # the first run started ten minutes before
    first = CollectorService(options, clock=lambda: now[0], environ={})
    first.start()
    now[0] = W0 + 30 * S
    first.ingest(gpu_request({"GPU-1": ("j", 0.5)}, time_ns=W0 + 20 * S))
    first.stop(1)
    second = CollectorService(options, clock=lambda: W0 + 35 * S, environ={})
    second.start()
    try:
        for end in (30, 40):
            second.ingest(gpu_request({"GPU-1": ("j", 0.5)}, time_ns=W0 + end * S))
        second.flush(W0 + WINDOW + 11 * S)
    finally:
        second.stop(1)
    assert sink.wait_for(lambda found: len(gpu_time_points(found)) == 2)
    assert sorted(gpu_time_points(sink)) == [(W0, W0 + 30 * S, 10.0), (W0 + 35 * S, W0 + WINDOW, 20.0)]


def gpu_time_points(sink: OtlpSink) -> list[tuple[int, int, float]]:
    """(start, time, value) of every job.gpu_time point the downstream received."""
    return [
        (point.start_time_unix_nano, point.time_unix_nano, point.as_double)
        for _rm, _sm, metric in sink.metrics(names.JOB_GPU_TIME.name)
        for point in metric.sum.data_points
    ]


def test_a_window_a_skewed_producer_opened_ahead_of_the_clock_stays_open_across_a_restart(tmp_path: Path) -> None:
    # One producer's clock runs 220 s ahead (inside the 300 s future bound): its point opens the window
    # [W0 + 240, W0 + 300 s). A stop at W0 + 30 s keeps it open, like the current one: the close time kept is the
    # stop's own, so the restarted collector takes every producer's points as usual.
    spool = tmp_path / "spool.sqlite"
    first = CollectorService(spooled(spool), clock=lambda: W0 + 30 * S, environ={})
    first.ingest(gpu_request({"GPU-1": ("j", 0.5)}, time_ns=W0 + 20 * S))
    first.ingest(gpu_request({"GPU-2": ("skewed", 0.5)}, host="node-2", time_ns=W0 + 250 * S))
    assert first.stop(0) == []
    assert WriteAhead(str(accepted_file(spool))).pending()[0] == W0 + 30 * S
    second = CollectorService(spooled(spool), clock=lambda: W0 + 35 * S, environ={})
    try:
        taken = second.ingest(gpu_request({"GPU-1": ("j", 0.6)}, time_ns=W0 + 70 * S))
        assert (taken.accepted, taken.rejected) == (1, 0)
        reports = second.flush(W0 + 5 * WINDOW + 11 * S)
        skewed = [job for report in reports for job in report.jobs if job.job_id == "skewed"]
        assert len(skewed) == 1  # its window closed once, by the restarted collector
    finally:
        second.stop(0)


def test_a_restart_with_day_long_windows_keeps_the_day_open(tmp_path: Path) -> None:
    # Windows of a day and a day's lateness: a stop 30 s into the day D0 keeps the day open; the next start
    # takes the producer's points for it (before, the day was closed early at the stop and the rest refused).
    day = 86_400 * S
    d0 = (W0 // day + 1) * day
    config = AggregatorConfig(window_s=86_400.0, lateness_s=86_400.0, stale_after_s=3 * 86_400.0)
    spool = tmp_path / "spool.sqlite"
    first = CollectorService(spooled(spool, aggregator=config), clock=lambda: d0 + 30 * S, environ={})
    first.ingest(gpu_request({"GPU-1": ("j", 0.5)}, time_ns=d0 + 20 * S))
    assert first.stop(0) == []
    second = CollectorService(spooled(spool, aggregator=config), clock=lambda: d0 + 35 * S, environ={})
    try:
        taken = second.ingest(gpu_request({"GPU-1": ("j", 0.7)}, time_ns=d0 + 30 * S))
        assert (taken.accepted, taken.rejected) == (1, 0)
        assert jobs_of(second, d0 + 2 * day + 1) == {"j": (pytest.approx(0.6), 2)}
    finally:
        second.stop(0)


# --- 21.4: a full disk under the write-ahead and the spool --------------------------------------------

# The child sets RLIMIT_FSIZE to the size its files have (as `ulimit -f` would): no file may grow.
DISK_FULL_WRITE_AHEAD = """
import json, logging, os, resource, sys
from otel_ofu_collector.storage.sqlite_files import RETRY_S
from otel_ofu_collector.storage.write_ahead import WriteAhead
logging.basicConfig(level=logging.INFO)
path = sys.argv[1]
now = [100.0]
ahead = WriteAhead(path, batch_s=0.0, clock=lambda: now[0])
ahead.append(b"before", 1)
def disk(full):
    size = max(os.path.getsize(p) for p in (path, path + "-wal")) if full else resource.RLIM_INFINITY
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, resource.RLIM_INFINITY))
disk(full=True)
for k in range(10):
    ahead.append(os.urandom(5000), 2 + k)  # raises nothing
ahead.closed_through(50, 0)  # nor this
print(json.dumps({"unwritten": ahead.unwritten}))
disk(full=False)
now[0] += RETRY_S / 2
ahead.append(b"too soon", 20)  # space is back, but the last failure was too recent to try again
now[0] += RETRY_S / 2
ahead.append(b"after", 21)
flushed, pending = WriteAhead(path).pending()
print(json.dumps({"unwritten": ahead.unwritten, "flushed": flushed, "pending": [p.decode() for p in pending]}))
disk(full=True)
ahead.clear()  # a clean stop on a full disk
print(json.dumps({"after_clear": WriteAhead(path).pending()[1]}))
"""


def test_a_full_disk_under_the_write_ahead_costs_only_crash_safety_counted_logged_once_and_recovers(
    tmp_path: Path,
) -> None:
    (full, recovered, cleared), log = run_python(DISK_FULL_WRITE_AHEAD, str(tmp_path / "spool.sqlite.accepted"))
    assert full == {"unwritten": 10}  # the ten requests the disk refused
    # "too soon" is not tried yet; the flush refused while the disk was full is written with "after" (else a
    # kill now would replay windows already exported)
    assert recovered == {"unwritten": 11, "flushed": 50, "pending": ["before", "after"]}
    assert cleared == {"after_clear": []}
    assert "Traceback" not in log
    assert len([line for line in log.splitlines() if "going on without it" in line]) == 1
    assert len([line for line in log.splitlines() if "writing again" in line]) == 1


DISK_FULL_SPOOL = """
import json, logging, os, resource, sys
from otel_ofu_collector.outputs.queues import SqliteSpool
from otel_ofu_collector.storage.sqlite_files import RETRY_S
logging.basicConfig(level=logging.INFO)
path = sys.argv[1]
now = [100.0]
spool = SqliteSpool(path, max_bytes=2500, clock=lambda: now[0])
spool.put(b"1" * 1000)
def disk(full):
    size = max(os.path.getsize(p) for p in (path, path + "-wal")) if full else resource.RLIM_INFINITY
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, resource.RLIM_INFINITY))
def contents(queue):
    found = []
    while (head := queue.peek()) is not None:
        found.append(head[1][:1].decode())
        queue.remove(head[0])
    return found
disk(full=True)
dropped = [spool.put(str(k).encode() * 1000) for k in (2, 3, 4)]  # held in memory, within 2500 bytes
print(json.dumps({"dropped": dropped, "len": len(spool)}))
head = spool.peek()
spool.remove(head[0])  # "1", sent: its delete cannot be written yet
head = spool.peek()
spool.remove(head[0])  # "3", sent from memory
print(json.dumps({"len": len(spool), "size": spool.size_bytes}))
disk(full=False)
now[0] += RETRY_S
spool.put(b"5" * 1000)  # space is back: what was held goes to the file first, in order
spool.close()
print(json.dumps({"after_restart": contents(SqliteSpool(path))}))
spool = SqliteSpool(path, clock=lambda: now[0])
spool.put(b"6" * 1000)
disk(full=True)
spool.put(b"7" * 1000)
spool.close()  # "7" is held in memory only: lost, counted
disk(full=False)
print(json.dumps({"lost": spool.unstored_dropped, "after_restart": contents(SqliteSpool(path))}))
"""


def test_a_full_disk_under_the_spool_holds_outputs_in_memory_in_order_drops_by_reason_and_recovers(
    tmp_path: Path,
) -> None:
    (held, sent, restarted, lost), log = run_python(DISK_FULL_SPOOL, str(tmp_path / "spool.sqlite"))
    # What memory holds is bounded by max_bytes on its own: "2", "3", "4" held are 3000 > 2500 bytes, so
    # the third put drops the oldest held, "2"; the spool then holds "1" (on disk), "3", "4" (in memory).
    assert held == {"dropped": [0, 0, 1], "len": 3}
    assert sent == {"len": 1, "size": 1000}  # "1" and "3" sent: "4" is left
    assert restarted == {"after_restart": ["4", "5"]}  # "1" is not sent again
    assert lost == {"lost": 1, "after_restart": ["6"]}
    assert "Traceback" not in log
    assert len([line for line in log.splitlines() if "holding" in line]) == 2  # once per run that hit it


SERVICE_ON_A_FULL_DISK = """
import json, resource, sys
from otel_ofu import names
from otel_ofu.testing.otlp_requests import gpu_request
from otel_ofu_collector.service import CollectorService
from tests.collector_helpers import collector_options
spool, downstream = sys.argv[1:]
FULL = 4096  # every file already holds its first page: none takes a write past it
S = 10**9
W0 = 1_700_000_040 * S
options = collector_options(None, spool_path=spool, export_endpoint=downstream, self_telemetry=False)
service = CollectorService(options, environ={})
resource.setrlimit(resource.RLIMIT_FSIZE, (FULL, resource.RLIM_INFINITY))
outcome = service.ingest(gpu_request({"GPU-1": ("j", 0.5)}, time_ns=W0 + 30 * S))
reports = service.flush(W0 + 71 * S)  # the window closes: its outputs held in memory, the downstream down
service.stop(0)  # no time to deliver them: lost
metrics = service.self_metrics()
print(json.dumps({
    "accepted": outcome.accepted,
    "windows": len(reports),
    "dropped": metrics[names.COLLECTOR_DROPPED.name]["windows_spool_failed"],
    "unwritten": metrics[names.COLLECTOR_WRITE_AHEAD_UNWRITTEN.name],
}))
"""


def test_on_a_full_disk_the_service_takes_points_closes_windows_and_counts_what_a_stop_lost(tmp_path: Path) -> None:
    [found], log = run_python(
        SERVICE_ON_A_FULL_DISK, str(tmp_path / "spool.sqlite"), f"http://127.0.0.1:{unused_port()}"
    )
    # One request accepted but not written ahead; its window's outputs (one request) held, then lost at stop
    assert found == {"accepted": 1, "windows": 1, "dropped": 1, "unwritten": 1}
    assert "Traceback" not in log


# A clean stop while no file may be written at all (RLIMIT_FSIZE 0): the write-ahead is deleted, and the fresh
# file with the stop's close time cannot be written. Then, with space back, a start on what was left.
STOP_ON_A_FULL_DISK = """
import json, logging, resource, sys
from otel_ofu import names
from otel_ofu.testing.otlp_requests import gpu_request
from otel_ofu_collector.service import CollectorService
from otel_ofu_collector.storage.write_ahead import WriteAhead
from tests.collector_helpers import collector_options
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
spool, downstream = sys.argv[1:]
S = 10**9
W0 = 1_700_000_040 * S
options = collector_options(None, spool_path=spool, export_endpoint=downstream, self_telemetry=False)
first = CollectorService(options, clock=lambda: W0 + 30 * S, environ={})
first.ingest(gpu_request({"GPU-1": ("j", 0.5)}, time_ns=W0 + 20 * S))
resource.setrlimit(resource.RLIMIT_FSIZE, (0, resource.RLIM_INFINITY))
windows = len(first.stop(0))
resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
second = CollectorService(options, clock=lambda: W0 + 35 * S, environ={})
late = second.ingest(gpu_request({"GPU-1": ("j", 0.7)}, time_ns=W0 + 30 * S))
damaged = second.self_metrics()[names.COLLECTOR_FILES_DAMAGED.name]
second.stop(0)
print(json.dumps({"windows": windows, "accepted_after": late.accepted, "damaged": damaged}))
"""


def test_a_clean_stop_on_a_full_disk_costs_only_the_kept_close_time_and_the_next_start_counts_no_damage(
    tmp_path: Path,
) -> None:
    [found], log = run_python(STOP_ON_A_FULL_DISK, str(tmp_path / "spool.sqlite"), f"http://127.0.0.1:{unused_port()}")
    assert found["windows"] == 1
    # Without the close time the next start takes the stopped-in window's later point: the cost the warning
    # names. Whatever the refused write left (an empty file) is no damage to count, and no start fails on it.
    assert found["accepted_after"] == 1
    assert set(found["damaged"].values()) == {0}, found["damaged"]
    assert "Traceback" not in log
    assert len([line for line in log.splitlines() if "close time of a clean stop could not be kept" in line]) == 1


FULL = 4096  # a file size limit every file of the spool already reaches: none takes a write past it


def _prlimit_fsize(pid: int, limit: int) -> None:
    resource.prlimit(pid, resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))


def test_the_command_on_a_full_disk_answers_every_request_goes_on_and_recovers_and_exits_0(
    tmp_path: Path,
    sink: OtlpSink,
    collector_process: Callable[..., CollectorProcess],
    require: Callable[[bool, str], None],
) -> None:
    require(hasattr(resource, "prlimit"), "resource.prlimit (Linux) sets the collector's file size limit")
    spool = tmp_path / "spool.sqlite"
    collector = collector_process(
        "--listen", "127.0.0.1:0", "--spool", str(spool), "--export-endpoint", sink.grpc_endpoint
    )
    port = collector.grpc_port
    _prlimit_fsize(collector.process.pid, FULL)
    sent = [0]

    def one_request() -> None:
        sent[0] += 1
        response = send(port, gpu_request({f"GPU-{sent[0]}": ("j", 0.5)}, time_ns=time.time_ns()))
        assert response.partial_success.rejected_data_points == 0  # never INTERNAL, never refused

    collector.wait_for("going on without it", between=one_request)
    for _ in range(5):
        one_request()
    _prlimit_fsize(collector.process.pid, resource.RLIM_INFINITY)
    collector.wait_for("writing again", between=one_request)
    assert collector.terminate() == 0
    assert "Traceback" not in "\n".join(collector.lines)
    assert len([line for line in collector.lines if "going on without it" in line]) == 1
    assert sink.wait_for(lambda s: job_ofu_points(s, "j") >= 1)
    assert job_ofu_points(sink, "j") in (1, 2)  # each window once (the requests may span two windows)
    [unwritten] = self_metric(sink, names.COLLECTOR_WRITE_AHEAD_UNWRITTEN.name).values()
    assert 0 < unwritten < sent[0]


def test_the_command_stopped_while_the_disk_is_full_exports_its_windows_and_exits_0(
    tmp_path: Path,
    sink: OtlpSink,
    collector_process: Callable[..., CollectorProcess],
    require: Callable[[bool, str], None],
) -> None:
    require(hasattr(resource, "prlimit"), "resource.prlimit (Linux) sets the collector's file size limit")
    spool = tmp_path / "spool.sqlite"
    collector = collector_process(
        "--listen", "127.0.0.1:0", "--spool", str(spool), "--export-endpoint", sink.grpc_endpoint
    )
    port = collector.grpc_port
    _prlimit_fsize(collector.process.pid, FULL)
    now = time.time_ns()
    inside = now - now % (60 * S) + 11 * S  # every point's 10 s interval inside one window: one job.ofu point
    collector.wait_for(
        "going on without it",
        between=lambda: send(port, gpu_request({"GPU-1": ("full", 0.5)}, time_ns=inside)),
    )
    assert collector.terminate() == 0  # before: exit 1, the write-ahead's clear raised
    assert "Traceback" not in "\n".join(collector.lines)
    assert any("holding new window outputs in memory" in line for line in collector.lines)  # the spool's too
    assert sink.wait_for(lambda s: job_ofu_points(s, "full") == 1)  # delivered from memory


# --- 21.7: random bytes in the SQLite WAL ---------------------------------------------------------------


def test_random_bytes_in_the_write_aheads_wal_are_detected_counted_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spool = tmp_path / "spool.sqlite"
    t = W0 + 20 * S
    wal = bytearray(killed_run(accepted_file(spool), t))
    hit = wal.find(b"GPU-10")  # first written by the 11th transaction
    wal[hit : hit + 6] = random.Random(10).randbytes(6)
    Path(f"{accepted_file(spool)}-wal").write_bytes(wal)
    caplog.set_level(logging.INFO, logger=SERVICE_LOG)
    service = CollectorService(spooled(spool), clock=lambda: W0 + 30 * S, environ={})
    try:
        counts = service.self_metrics()[names.COLLECTOR_FILES_DAMAGED.name]
        assert counts["write_ahead_wal"] == 1
        [line] = warnings_about(caplog, "WAL")
        assert str(accepted_file(spool)) in line
        # SQLite keeps the transactions before the damaged frame: GPU-00 ... GPU-09
        assert jobs_of(service, W0 + WINDOW + 11 * S) == {"j": (pytest.approx(0.5), 10)}
    finally:
        service.stop(0)


def test_an_undamaged_wal_left_by_a_kill_is_replayed_whole_and_counts_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spool = tmp_path / "spool.sqlite"
    killed_run(accepted_file(spool), W0 + 20 * S)
    caplog.set_level(logging.INFO, logger=SERVICE_LOG)
    service = CollectorService(spooled(spool), clock=lambda: W0 + 30 * S, environ={})
    try:
        counts = service.self_metrics()[names.COLLECTOR_FILES_DAMAGED.name]
        assert set(counts.values()) == {0}
        assert warnings_about(caplog, "WAL") == []
        assert jobs_of(service, W0 + WINDOW + 11 * S) == {"j": (pytest.approx(0.5), 20)}
    finally:
        service.stop(0)


def test_a_damaged_wal_header_loses_the_whole_wal_and_is_counted(tmp_path: Path) -> None:
    spool = tmp_path / "spool.sqlite"
    wal = bytearray(killed_run(accepted_file(spool), W0 + 20 * S))
    wal[:32] = random.Random(32).randbytes(32)
    Path(f"{accepted_file(spool)}-wal").write_bytes(wal)
    service = CollectorService(spooled(spool), clock=lambda: W0 + 30 * S, environ={})
    try:
        assert service.self_metrics()[names.COLLECTOR_FILES_DAMAGED.name]["write_ahead_wal"] == 1
        assert jobs_of(service, W0 + WINDOW + 11 * S) == {}  # every record was in the WAL
    finally:
        service.stop(0)


SPOOL_KILLED = """
import os, sys
from otel_ofu_collector.outputs.queues import SqliteSpool
spool = SqliteSpool(sys.argv[1])
for k in range(10):
    spool.put(b"window-%02d" % k + bytes(100))
os._exit(0)
"""


def test_random_bytes_in_the_spools_wal_are_detected_and_counted(tmp_path: Path) -> None:
    spool = tmp_path / "spool.sqlite"
    run_python(SPOOL_KILLED, str(spool))
    wal_path = Path(f"{spool}-wal")
    wal = bytearray(wal_path.read_bytes())
    hit = wal.find(b"window-05")
    wal[hit : hit + 9] = b"\x00" * 9
    wal_path.write_bytes(wal)
    service = CollectorService(spooled(spool), environ={})
    try:
        assert service.self_metrics()[names.COLLECTOR_FILES_DAMAGED.name]["spool_wal"] == 1
        assert service.exports is not None
        assert len(service.exports.queue) == 5  # window-00 ... window-04, written before the damaged frame
    finally:
        service.stop(0)


def test_the_wal_checksum_is_sqlites_cumulative_fibonacci_weighted_sum() -> None:
    from otel_ofu_collector.storage.sqlite_files import wal_checksum

    # Words 1, 2, 3, 4 from (0, 0), per SQLite's file format: s0 += x0 + s1; s1 += x1 + s0, pair by pair
    # (1, 2): s0 = 0 + 1 + 0 = 1, s1 = 0 + 2 + 1 = 3; (3, 4): s0 = 1 + 3 + 3 = 7, s1 = 3 + 4 + 7 = 14
    words = struct.pack(">4I", 1, 2, 3, 4)
    assert wal_checksum(words, big_endian=True, seed=(0, 0)) == (7, 14)
    assert wal_checksum(struct.pack("<4I", 1, 2, 3, 4), big_endian=False, seed=(0, 0)) == (7, 14)
    # mod 2**32: from (2**32 - 1, 0), the pair (1, 0): s0 = 2**32 - 1 + 1 + 0 = 0 (wrapped), s1 = 0 + 0 + 0 = 0
    assert wal_checksum(struct.pack(">2I", 1, 0), big_endian=True, seed=(2**32 - 1, 0)) == (0, 0)


def _scribble(rng: random.Random, path: Path) -> None:
    """One random fault on a file: bytes overwritten, the file cut, or a page header scrambled."""
    data = bytearray(path.read_bytes())
    if not data:
        return
    at = rng.randrange(len(data))
    kind = rng.choice(("bytes", "cut", "page"))
    if kind == "bytes":
        data[at : at + 64] = rng.randbytes(64)[: len(data) - at]
    elif kind == "cut":
        del data[at:]
    else:
        page = at // 4096 * 4096
        data[page : page + 16] = rng.randbytes(16)[: len(data) - page]
    path.write_bytes(data)


@pytest.mark.parametrize("seed", range(8))
def test_random_damage_to_any_of_the_files_never_stops_a_start_a_flush_or_a_stop(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    spool = tmp_path / "spool.sqlite"
    killed_run(accepted_file(spool), W0 + 20 * S)
    run_python(SPOOL_KILLED, str(spool))
    files = sorted(tmp_path.iterdir())
    for path in rng.sample(files, rng.randint(1, len(files))):
        _scribble(rng, path)
    service = CollectorService(spooled(spool), clock=lambda: W0 + 30 * S, environ={})
    try:
        service.ingest(gpu_request({"GPU-new": ("j", 0.5)}, time_ns=W0 + 25 * S))
        [(ofu, gpus)] = jobs_of(service, W0 + WINDOW + 11 * S).values()
        assert ofu == pytest.approx(0.5)
        assert 1 <= gpus <= 21  # the new GPU, and of the killed run's 20 what its files still held
        assert service.exports is not None
        assert service.exports.pump(wait_s=0) is False  # the downstream is down: nothing raised either
    finally:
        service.stop(0)
