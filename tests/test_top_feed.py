"""Where ``otel-ofu top`` gets its data: the feed's per-GPU section, the feed over real HTTP (and HTTPS with a
bearer token and mTLS), a feed that drops, and a node's own source (real pynvml on the fake NVML library)
through the loopback pipeline."""

from __future__ import annotations

import json
import logging
import socket
import ssl
import threading
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import attrs
import pytest

from otel_ofu import names
from otel_ofu.model import Snapshot
from otel_ofu.sources.nvml import NvmlSource
from otel_ofu.testing.fake_nvml import FakeNvml
from otel_ofu.testing.otlp_sink import unused_port
from otel_ofu.testing.pki import Pki
from otel_ofu_collector.config import AggregatorConfig
from otel_ofu_collector.demo.loopback import LoopbackPipeline
from otel_ofu_collector.outputs.feed_client import FeedAccess, feed_url
from otel_ofu_collector.outputs.feed_server import ReportFeed
from otel_ofu_collector.outputs.record_codec import parse_lines, report_from_line, report_to_line
from otel_ofu_collector.results import GpuReport, WindowReport
from otel_ofu_collector.top.feeds import PipelineRunner, ReportFeedPoller, Update
from otel_ofu_collector.top.model import NO_JOB, FleetModel
from tests.nvml_helpers import ManualClock
from tests.test_top_model import T, job, window

S = 1_000_000_000
H100 = "NVIDIA H100 80GB HBM3"


def gpu(ofu: float = 0.4, **values: Any) -> GpuReport:
    identity = {names.HOST_NAME: "node-1", names.HW_ID: "GPU-1", names.GPU_INDEX: "1", names.HW_MODEL: H100}
    return GpuReport(job_id="big", attributes=identity, ofu=ofu, **values)


# --- the per-GPU section of the window records -------------------------------------------------------------


def test_the_per_gpu_section_round_trips() -> None:
    report = window(
        T,
        jobs=[job("big", 0.4)],
        gpus=[
            gpu(0.4, tensor_active=0.44, sm_clock_hz=1700e6, sm_clock_max_hz=1980e6, power_w=512.5,
                throttle={"power": 0.5}),
            attrs.evolve(gpu(0.1), job_id=None),  # a GPU no job claims
        ],
    )  # fmt: skip
    read = report_from_line(report_to_line(report))
    assert read.gpus == report.gpus
    assert read.end_ns == report.end_ns


def test_missing_gpu_values_are_null_and_a_gpu_without_ofu_is_left_out_not_the_window() -> None:
    report = window(T, jobs=[job("big", 0.4)], gpus=[gpu(0.4, power_w=float("nan")), gpu(float("inf"))])
    line = report_to_line(report)
    data = json.loads(line)
    assert len(data["gpus"]) == 1
    assert data["gpus"][0]["power_w"] is None  # NaN is no number: null, never NaN or 0
    (read,) = report_from_line(line).gpus
    assert (read.ofu, read.power_w, read.sm_clock_hz) == (0.4, None, None)


def test_a_record_without_the_section_reads_as_none_and_a_bad_entry_costs_only_itself(
    caplog: pytest.LogCaptureFixture,
) -> None:
    plain = report_to_line(window(T, jobs=[job("big", 0.4)]))
    assert "gpus" not in json.loads(plain)  # nothing written where nothing is known
    assert report_from_line(plain).gpus == ()
    data = json.loads(report_to_line(window(T, jobs=[job("big", 0.4)], gpus=[gpu(0.4)])))
    data["gpus"].append({"job_id": "big", "attributes": {}, "ofu": "lots"})
    with caplog.at_level(logging.WARNING):
        records = parse_lines([json.dumps(data)])
    assert records.bad_lines == 0
    (report,) = records.reports
    assert [entry.ofu for entry in report.gpus] == [0.4]
    assert "skipped 1 unusable GPU entry, the first: gpu.ofu is missing or not" in caplog.text


# --- the feed, read live ------------------------------------------------------------------------------------


@pytest.fixture
def feed() -> Iterator[ReportFeed]:
    served = ReportFeed(port=0)
    served.start()
    yield served
    served.shutdown()


def minute(k: int) -> WindowReport:
    return window(T + 60 * k, jobs=[job("big", 0.40 + 0.01 * k)])


def test_the_poller_reads_each_window_once_and_says_when_the_feed_is_gone(feed: ReportFeed) -> None:
    feed.consume_windows([minute(0), minute(1)])
    port = feed.bound_port
    poller = ReportFeedPoller(f"http://127.0.0.1:{port}", timeout_s=5, clock=lambda: T * S)
    first = poller.poll()
    assert [report.end_ns for report in first.windows] == [T * S, (T + 60) * S]
    assert not first.problem
    assert first.status is not None
    assert first.status.startswith(f"feed http://127.0.0.1:{port}/reports.jsonl · read ")
    assert poller.poll().windows == ()  # nothing new: ?since= the last window's end
    feed.consume_windows([minute(2)])
    assert [report.end_ns for report in poller.poll().windows] == [(T + 120) * S]

    model = FleetModel()
    model.add_windows(first.windows)
    feed.shutdown()
    gone = poller.poll()
    assert gone.problem
    assert gone.windows == ()
    assert gone.status is not None
    assert gone.status.startswith(f"feed unreachable: cannot read report feed http://127.0.0.1:{port}/")
    assert "\n" not in gone.status
    model.add_windows(gone.windows)
    assert [row.ofu for row in model.jobs()] == [pytest.approx(0.41)]  # the screen keeps the last data


def test_an_unreachable_feed_is_one_line_from_the_first_read() -> None:
    port = unused_port()
    update = ReportFeedPoller(f"127.0.0.1:{port}", timeout_s=2).poll()
    assert update.problem
    target = f"http://127.0.0.1:{port}/reports.jsonl"
    assert update.status == f"feed unreachable: cannot read report feed {target}: [Errno 111] Connection refused"


def test_feed_url_asks_for_only_the_new_windows() -> None:
    assert feed_url("http://c:9465", 5) == "http://c:9465/reports.jsonl?since=5"
    assert feed_url("http://c:9465/reports.jsonl?since=1", 7) == "http://c:9465/reports.jsonl?since=7"
    assert feed_url("c:9465") == "http://c:9465/reports.jsonl"


def _serve(handler: type[BaseHTTPRequestHandler], context: ssl.SSLContext | None = None) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    if context is not None:
        server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_a_feed_that_drops_mid_answer_is_a_status_not_a_crash() -> None:
    class Drops(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", "100000")
            self.end_headers()
            self.wfile.write(b'{"otel_ofu_report": 1, "start')
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = _serve(Drops)
    try:
        update = ReportFeedPoller(f"http://127.0.0.1:{server.server_address[1]}", timeout_s=5).poll()
    finally:
        server.shutdown()
        server.server_close()
    assert update.problem
    assert update.status is not None
    assert update.status.startswith("feed unreachable: cannot read report feed")
    assert "IncompleteRead" in update.status


def test_a_feed_behind_tls_and_a_bearer_token(feed: ReportFeed, pki: Pki) -> None:
    """A TLS-terminating proxy in front of the feed, asking for a token and a client certificate (mTLS)."""
    feed.consume_windows([minute(0)])

    class Proxy(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.headers.get("Authorization") != "Bearer s3cret":
                self.send_response(401)
                self.end_headers()
                return
            since = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query).get("since")
            body = feed.body(int(since[0]) if since else None)
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pki.server_cert, pki.server_key)
    context.load_verify_locations(pki.ca)
    context.verify_mode = ssl.CERT_REQUIRED
    server = _serve(Proxy, context)
    url = f"https://127.0.0.1:{server.server_address[1]}"
    mtls = {"ca_file": str(pki.ca), "client_cert": str(pki.client_cert), "client_key": str(pki.client_key)}
    try:
        good = ReportFeedPoller(url, timeout_s=5, access=FeedAccess("s3cret", **mtls)).poll()
        wrong = ReportFeedPoller(url, timeout_s=5, access=FeedAccess("guess", **mtls)).poll()
        untrusted = ReportFeedPoller(url, timeout_s=5, access=FeedAccess("s3cret")).poll()
    finally:
        server.shutdown()
        server.server_close()
    assert not good.problem, good.status
    assert [report.end_ns for report in good.windows] == [T * S]
    assert wrong.problem
    assert (
        wrong.status
        == f"feed unreachable: report feed {url}/reports.jsonl answered HTTP 401 (the bearer token is missing or wrong)"
    )
    assert untrusted.problem
    assert untrusted.status is not None
    assert "CERTIFICATE_VERIFY_FAILED" in untrusted.status  # the system's CAs do not know the test CA


def test_unreadable_tls_files_are_a_status() -> None:
    update = ReportFeedPoller("https://127.0.0.1:1", access=FeedAccess(ca_file="/nonexistent/ca.pem")).poll()
    assert update.problem
    assert update.status == "feed unreachable: cannot load the feed's TLS files: No such file or directory"


# --- one node's own source, through the loopback pipeline --------------------------------------------------


def test_a_nodes_gpus_through_the_pipeline(fake: FakeNvml) -> None:
    """Real pynvml on the fake NVML library: what ``top --source nvml`` shows, stepped on a clock moved by hand."""
    first = fake.add_gpu(H100, sm_clock_mhz=1755)
    second = fake.add_gpu(H100, sm_clock_mhz=1830)
    fake.set_tensor_util(first, 42.5)
    fake.set_tensor_util(second, 20.0)
    fake.set_power(first, 550.0)
    clock = ManualClock(T * S)  # on a window boundary (T is a multiple of 10 s)
    source = NvmlSource(host="node-1", clock=clock, background=False)
    pipeline = LoopbackPipeline(
        source=source, clock=clock, aggregator=AggregatorConfig(window_s=10, lateness_s=2), interval_s=2
    )
    updates: list[Update] = []
    stop = threading.Event()

    def advance() -> None:
        clock.advance(2)
        if len(updates) >= 7:  # (T, T + 10] closes at T + 12: the sixth step
            stop.set()

    runner = PipelineRunner(pipeline, title="nvml", pause_s=0, advance=advance)
    runner.run(updates.append, stop)  # on this thread; the last step's update is handed over before it ends

    model = FleetModel()
    for update in updates:
        model.add_windows(update.windows)
        if update.readings is not None:
            model.set_readings(update.readings)
    assert not any(update.problem for update in updates), [update.status for update in updates]
    assert [report.end_ns for report in model.windows] == [(T + 10) * S]
    assert updates[0].status == "nvml · waiting for the first window to close"
    # Neither GPU has a job: one row for the GPUs no job claims, opened like a job
    (row,) = model.jobs()
    assert (row.job_id, row.gpus) == (NO_JOB, 2)
    rows = model.gpus(NO_JOB)
    assert [entry.gpu for entry in rows] == ["node-1/0", "node-1/1"]
    # OFU = TPA x min(1, f / f_tensor): 0.425 x 1755 / 1830 = 0.40758; 0.20 x 1830 / 1830 = 0.20
    assert rows[0].ofu == pytest.approx(0.425 * 1755 / 1830)
    assert rows[1].ofu == pytest.approx(0.20)
    assert (rows[0].sm_clock_hz, rows[0].reference_clock_hz, rows[0].power_w) == (1755e6, 1830e6, 550.0)
    fleet = model.fleet()
    assert fleet.gpus == 2  # the window's group
    # its median over capacity: the two GPUs' capacity is equal, and half of it is reached at the lower, 0.20
    assert fleet.ofu_p50 == pytest.approx(0.20)


@attrs.define
class DownSource:
    """A source whose every read fails as a whole (a dcgm-exporter that is down, say)."""

    name: str = "dcgm-exporter"
    reads: int = 0

    def read(self) -> Snapshot:
        self.reads += 1
        raise OSError("cannot scrape http://node-7:9400/metrics: [Errno 111] Connection refused")

    def close(self) -> None:
        pass


def test_a_source_that_reads_nothing_says_why_on_the_status_line() -> None:
    clock = ManualClock(T * S)
    down = DownSource()
    pipeline = LoopbackPipeline(
        source=down, clock=clock, aggregator=AggregatorConfig(window_s=10, lateness_s=2), interval_s=2
    )
    updates: list[Update] = []
    stop = threading.Event()

    def advance() -> None:
        clock.advance(2)
        if len(updates) >= 2:
            stop.set()

    PipelineRunner(
        pipeline, title="dcgm-exporter: scraping http://node-7:9400/metrics", pause_s=0, advance=advance
    ).run(updates.append, stop)
    assert down.reads == 3
    assert [update.problem for update in updates] == [True, True, True]
    assert updates[-1].status == (
        "dcgm-exporter: scraping http://node-7:9400/metrics · no GPU read: "
        "cannot scrape http://node-7:9400/metrics: [Errno 111] Connection refused"
    )
    assert updates[-1].readings == ()  # nothing read: no GPU shown, none shown as 0


# --- the windows' per-GPU means, for a screen that opens a job ---------------------------------------------


def test_the_windows_give_each_gpus_means_when_asked_and_the_feed_keeps_them_on_its_newest_window() -> None:
    from otel_ofu_collector.aggregation.windows import Aggregator

    window_ns = 60 * S
    t0 = 29_000_000 * window_ns
    identity = {
        names.HOST_NAME: "node-1",
        names.HW_ID: "GPU-1",
        names.GPU_INDEX: "3",
        names.HW_MODEL: H100,
        names.JOB_ID: "big",
    }
    agg = Aggregator(AggregatorConfig(lateness_s=0, per_gpu_reports=True))
    plain = Aggregator(AggregatorConfig(lateness_s=0))
    for minute_index in range(2):
        for tick in range(6):  # 10 s intervals: power 500 W then 300 W, the clock at 1700 MHz, 40% power-capped
            start = t0 + minute_index * window_ns + tick * 10 * S
            values = {
                names.GPU_TENSOR_ACTIVE.name: 0.5,
                names.GPU_CLOCK_SM.name: 1.7e9,
                names.GPU_CLOCK_SM_MAX.name: 1.98e9,
                names.GPU_POWER.name: 500.0 if tick < 3 else 300.0,
            }
            for each in (agg, plain):
                assert each.add_ofu("node-1|GPU-1", 0.4, start, start + 10 * S, identity) is None
                assert (
                    each.add_gpu_inputs("node-1|GPU-1", start, start + 10 * S, identity, values, {"power": 0.4}) is None
                )
    reports = agg.flush(t0 + 2 * window_ns)
    assert all(report.gpus == () for report in plain.flush(t0 + 2 * window_ns))  # off unless asked: no cost
    (first, *_), (newest, *_) = (report.gpus for report in reports)
    assert first.job_id == "big"
    assert dict(first.attributes) == {
        names.HOST_NAME: "node-1",
        names.HW_ID: "GPU-1",
        names.GPU_INDEX: "3",
        names.HW_MODEL: H100,
    }
    # The window's means: power (3 x 500 + 3 x 300) / 6 = 400 W; the power cap held the clock 40% of the window.
    assert (first.ofu, first.tensor_active, first.sm_clock_hz, first.sm_clock_max_hz) == pytest.approx(
        (0.4, 0.5, 1.7e9, 1.98e9)
    )
    assert first.power_w == pytest.approx(400.0)
    assert dict(first.throttle) == pytest.approx({"power": 0.4})
    feed = ReportFeed(port=0)
    feed.consume_windows(reports)
    records = parse_lines(feed.body().decode().splitlines())
    assert [len(report.gpus) for report in records.reports] == [0, 1]  # only the newest keeps its GPUs
    assert records.reports[1].gpus[0] == newest


def test_the_records_file_leaves_the_per_gpu_means_out(tmp_path: Any) -> None:
    from otel_ofu_collector.outputs.recorder import ReportRecorder

    with ReportRecorder(tmp_path / "windows.jsonl") as recorder:
        recorder.consume_windows([window(T, jobs=[job("big", 0.4)], gpus=[gpu(0.4)])])
    (line,) = (tmp_path / "windows.jsonl").read_text().splitlines()
    assert "gpus" not in json.loads(line)  # a run's records keep jobs and flags, not every GPU of every window


def test_top_and_report_pointed_at_a_prometheus_endpoint_say_that_is_what_they_found(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """The user gives the collector's --prometheus-port (9465) where its --report-feed-port (9466) belongs."""
    from otel_ofu.cli import main
    from otel_ofu_collector.service import CollectorOptions, CollectorService

    service = CollectorService(
        CollectorOptions(grpc_listen="127.0.0.1:0", prometheus_port=0, flush_interval_s=0.0), environ={}
    )
    service.start()
    try:
        url = f"http://127.0.0.1:{service.ports['prometheus']}"
        update = ReportFeedPoller(url, timeout_s=5).poll()
        assert update.problem
        assert update.status is not None
        assert "\n" not in update.status
        assert "is a Prometheus /metrics endpoint, not a report feed" in update.status
        assert "--report-feed-port" in update.status
        assert main(["report", "--live", url, "--out", str(tmp_path / "r.html")]) == 1
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1
        assert "is a Prometheus /metrics endpoint, not a report feed" in err
    finally:
        service.stop(grace=1)
