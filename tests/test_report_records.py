"""Recorded collector outputs: JSON-lines round trip, garbage skipped and counted, the feed over real HTTP."""

from __future__ import annotations

import errno
import io
import json
import logging
import math
import os
import re
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import attrs
import pytest

from otel_ofu import cli, names
from otel_ofu.testing.otlp_sink import unused_port
from otel_ofu_collector.aggregation.windows import Aggregator
from otel_ofu_collector.config import AggregatorConfig
from otel_ofu_collector.outputs.feed_client import FeedError, feed_url, fetch_records
from otel_ofu_collector.outputs.feed_server import ReportFeed
from otel_ofu_collector.outputs.record_codec import (
    FORMAT_KEY,
    load_records,
    parse_lines,
    report_from_line,
    report_to_line,
)
from otel_ofu_collector.outputs.recorder import ReportRecorder
from otel_ofu_collector.results import WindowReport

S = 1_000_000_000
T0 = 1_800_000_000 * S
WINDOW_S = 60


def fleet_reports(windows: int = 8) -> list[WindowReport]:
    """A small fleet through the real aggregator: a healthy job, a 2x over-counting one, an idle GPU."""
    aggregator = Aggregator(AggregatorConfig(window_s=WINDOW_S, lateness_s=0, flag_settings={"miscount_windows": 2}))
    reports: list[WindowReport] = []
    for w in range(windows):
        end = T0 + (w + 1) * WINDOW_S * S
        start = end - WINDOW_S * S
        for gpu in range(4):
            identity = {
                names.JOB_ID: "job-1",
                names.JOB_NAME: "llama",
                names.HW_MODEL: "NVIDIA H100 80GB HBM3",
                names.GPU_PRECISION: "bf16",
            }
            aggregator.add_ofu(f"h100-{gpu}", 0.40 + 0.01 * gpu + 0.005 * w, start, end, identity)
        for gpu in range(2):
            identity = {names.JOB_ID: "job-2", names.HW_MODEL: "NVIDIA A100-SXM4-80GB", names.GPU_PRECISION: "fp16"}
            aggregator.add_ofu(f"a100-{gpu}", 0.25 + 0.01 * gpu, start, end, identity)
        aggregator.add_ofu("idle", 0.0, start, end, {names.HW_MODEL: "NVIDIA A100-SXM4-80GB"})
        aggregator.add_mfu("job-1", 0.38 + 0.004 * w, end, {names.JOB_NAME: "llama"})
        aggregator.add_mfu("job-2", 0.52, end, {})
        reports.extend(aggregator.flush(end))
    return reports


def test_fleet_reports_cover_the_optional_values() -> None:
    reports = fleet_reports()
    jobs = [job for report in reports for job in report.jobs]
    assert len(reports) == 8
    assert any(job.correlation is None for job in jobs)
    assert any(job.correlation is not None for job in jobs)
    assert any(job.flops_miscount for job in jobs)
    assert any(group.histogram.zero_count for report in reports for group in report.groups)


def test_round_trip_through_a_file_is_exact(tmp_path: Path) -> None:
    reports = fleet_reports()
    path = tmp_path / "outputs.jsonl"
    with ReportRecorder(path) as recorder:
        recorder.consume_windows(reports[:3])
        recorder.consume_windows([])
        recorder.consume_windows(reports[3:])
        assert recorder.written == len(reports)
    assert list(load_records(path).reports) == reports
    lines = path.read_text(encoding="utf-8").splitlines()
    assert len(lines) == len(reports)
    first = json.loads(lines[0])
    assert first[FORMAT_KEY] == 1
    assert set(first) == {FORMAT_KEY, "start_ns", "end_ns", "groups", "jobs", "fleet"}
    assert set(first["groups"][0]["quantiles"]) == {repr(q) for q in names.QUANTILES}


def test_missing_values_are_null_never_zero() -> None:
    report = fleet_reports(1)[0]
    no_mfu = attrs.evolve(report.jobs[0], mfu=None, gap=None, correlation=None)
    line = report_to_line(attrs.evolve(report, jobs=(no_mfu,)))
    job = json.loads(line)["jobs"][0]
    assert job["mfu"] is None
    assert job["gap"] is None
    assert job["correlation"] is None
    assert report_from_line(line).jobs[0] == no_mfu


def test_appending_after_a_restart_keeps_every_window_in_time_order(tmp_path: Path) -> None:
    reports = fleet_reports()
    path = tmp_path / "outputs.jsonl"
    with ReportRecorder(path) as first:
        first.consume_windows(reports[4:])
    with ReportRecorder(path) as second:  # a shard's or a restarted collector's older windows
        second.consume_windows(reports[:4])
    assert list(load_records(path).reports) == reports


def test_garbage_lines_are_counted_and_skipped(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    reports = fleet_reports(3)
    good = [report_to_line(report) for report in reports]
    newer = json.loads(good[0])
    newer[FORMAT_KEY] = 99
    negative = json.loads(good[1])
    negative["groups"][0]["histogram"]["counts"] = [-1]
    path = tmp_path / "outputs.jsonl"
    path.write_text(
        "\n".join(
            [
                good[0],
                "this is not json",
                "",
                '{"some": "other record"}',
                json.dumps(newer),
                good[1][: len(good[1]) // 2],  # a crash mid-line
                json.dumps(negative),
                '{"otel_ofu_report": 1, "start_ns": "soon"}',
                "[1, 2, 3]",
                good[2],
            ]
        )
        + "\n",
        encoding="utf-8",
    )
    records = load_records(path)
    assert records.reports == (reports[0], reports[2])
    assert records.bad_lines == 7
    assert records.first_error is not None
    assert records.first_error.startswith(f"{path}:2: not JSON")
    # The report says so in one line and reports on the two windows left.
    with caplog.at_level(logging.WARNING, logger="otel_ofu_collector.report.command"):
        assert cli.main(["report", "--records", str(path), "--out", str(tmp_path / "report.html")]) == 0
    assert f"{path}: skipped 7 unusable line(s), the first: {path}:2: not JSON" in caplog.text


def test_a_window_that_cannot_be_written_costs_only_itself(tmp_path: Path) -> None:
    reports = fleet_reports(3)
    group = reports[1].groups[0]
    broken = attrs.evolve(reports[1], groups=(attrs.evolve(group, ofu_sum=math.nan),))
    path = tmp_path / "outputs.jsonl"
    with ReportRecorder(path) as recorder:
        recorder.consume_windows([reports[0], broken, reports[2]])
        assert recorder.written == 2
    assert list(load_records(path).reports) == [reports[0], reports[2]]


def test_feed_serves_the_last_windows_over_http() -> None:
    reports = fleet_reports()
    feed = ReportFeed(port=0, keep=5)
    feed.start()
    try:
        assert list(fetch_records(feed.url, timeout=5).reports) == []
        feed.consume_windows(reports[:6])
        feed.consume_windows(reports[6:])
        assert list(fetch_records(feed.url, timeout=5).reports) == reports[-5:]
        base = f"http://127.0.0.1:{feed.bound_port}"
        assert list(fetch_records(base, timeout=5).reports) == reports[-5:]  # the path is implied
        since = reports[5].end_ns
        assert list(fetch_records(f"{feed.url}?since={since}", timeout=5).reports) == reports[6:]
        with urllib.request.urlopen(feed.url, timeout=5) as response:
            assert response.headers["Content-Type"].startswith("application/jsonl")
        for path, status in (("/metrics", 404), ("/reports.jsonl?since=yesterday", 400)):
            with pytest.raises(urllib.error.HTTPError) as caught:
                urllib.request.urlopen(base + path, timeout=5)
            assert caught.value.code == status
            caught.value.close()
    finally:
        feed.shutdown()


def test_fetching_a_feed_that_is_not_there_says_why() -> None:
    with pytest.raises(FeedError, match=re.escape("cannot read report feed http://127.0.0.1:")):
        fetch_records(f"http://127.0.0.1:{unused_port()}", timeout=5)
    with pytest.raises(FeedError, match="not an http"):
        fetch_records("ftp://example.invalid/x", timeout=5)


def test_feed_url_forms() -> None:
    assert feed_url("127.0.0.1:9465") == "http://127.0.0.1:9465/reports.jsonl"
    assert feed_url("http://collector:9465/") == "http://collector:9465/reports.jsonl"
    assert feed_url("https://c/otel/reports.jsonl?since=5") == "https://c/otel/reports.jsonl?since=5"


def test_a_busy_feed_port_is_one_line_naming_the_address() -> None:
    feed = ReportFeed(port=0)
    feed.start()
    try:
        taken = f"127.0.0.1:{feed.bound_port}"
        with pytest.raises(OSError, match=f"cannot serve the report feed on {re.escape(taken)} ") as caught:
            ReportFeed(port=feed.bound_port).start()
        assert "\n" not in str(caught.value)
    finally:
        feed.shutdown()


def test_a_record_without_a_flag_reads_as_that_flag_absent() -> None:
    # A record written before a flag existed has no verdict for it: absent, never 0, and the line still counts.
    report = next(r for r in fleet_reports() if r.jobs)
    data = json.loads(report_to_line(report))
    for job in data["jobs"]:
        del job["regression"]
    (job, *_) = parse_lines([json.dumps(data)]).reports[0].jobs
    assert job.regression is None
    assert job.flops_miscount == report.jobs[0].flops_miscount
    data["jobs"][0]["flops_miscount"] = "yes"
    assert parse_lines([json.dumps(data)]).bad_lines == 1


# The child writes two windows, then no file may grow past 100 bytes more (RLIMIT_FSIZE, what `ulimit -f`
# sets): the next batch of three is cut short by the disk, then the limit goes and three more are written.
FULL_DISK_RECORDS = """
import json, logging, os, resource, sys
from tests.test_report_records import fleet_reports
from otel_ofu_collector.outputs.recorder import ReportRecorder
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
reports = fleet_reports()
with ReportRecorder(sys.argv[1]) as recorder:
    recorder.consume_windows(reports[:2])
    size = os.path.getsize(sys.argv[1])
    resource.setrlimit(resource.RLIMIT_FSIZE, (size + 100, resource.RLIM_INFINITY))
    recorder.consume_windows(reports[2:5])  # about 2 KB: the first 100 bytes are written, then EFBIG
    full = {"size_while_full": os.path.getsize(sys.argv[1]), "size_before": size, "unrecorded": recorder.unrecorded}
    resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    recorder.consume_windows(reports[5:])
    print(json.dumps({**full, "written": recorder.written, "unrecorded_after": recorder.unrecorded}))
"""


def test_a_full_disk_under_the_records_file_leaves_whole_lines_counts_the_windows_and_recovers(
    tmp_path: Path,
) -> None:
    # Before: each window batch the disk refused raised a traceback in the log and left half a line in the file.
    path = tmp_path / "outputs.jsonl"
    env = {key: value for key, value in os.environ.items() if not key.startswith("OTEL_")}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    done = subprocess.run(
        [sys.executable, "-c", FULL_DISK_RECORDS, str(path)],
        cwd=Path(__file__).resolve().parent.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["size_while_full"] == result["size_before"]  # the cut-short batch taken back
    assert (result["unrecorded"], result["written"], result["unrecorded_after"]) == (3, 5, 3)
    reports = fleet_reports()
    assert list(load_records(path).reports) == reports[:2] + reports[5:]  # whole lines only, in order
    lines = done.stderr.splitlines()
    assert "Traceback" not in done.stderr
    assert len([line for line in lines if line.startswith("WARNING") and "cannot be written" in line]) == 1
    assert [line for line in lines if "writing again" in line] == [
        f"INFO window records {path}: writing again; 3 window(s) left out"
    ]


def test_a_batch_whose_cut_back_failed_is_cut_before_the_next_one_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A dying disk: the write stops after 10 bytes and the cut back fails too (EIO). Appending the next batch
    # after the half line would merge the two into one unreadable line; it is cut first.
    reports = fleet_reports(3)
    path = tmp_path / "outputs.jsonl"

    class DyingFile(io.FileIO):
        writes = 0

        def write(self, data: Any) -> int:
            DyingFile.writes += 1
            if DyingFile.writes == 1:
                return super().write(bytes(data)[:10])
            raise OSError(errno.EIO, "Input/output error")

    def failing_ftruncate(fd: int, length: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    with ReportRecorder(path) as recorder:
        recorder.consume_windows(reports[:1])
        good = path.stat().st_size
        recorder.shutdown()
        recorder._file = DyingFile(path, "a")  # the same file, on a disk that is failing
        with monkeypatch.context() as patched:
            patched.setattr(os, "ftruncate", failing_ftruncate)
            recorder.consume_windows(reports[1:2])
        assert path.stat().st_size == good + 10  # the half batch is still there
        recorder.shutdown()
        recorder.start()  # the disk is back
        recorder.consume_windows(reports[2:])
        assert (recorder.written, recorder.unrecorded) == (2, 1)
    assert list(load_records(path).reports) == [reports[0], reports[2]]
