"""What an attacker can do with a token file and a job id: an empty token file must not turn auth off, and control
characters in identity values (an OSC sequence that retitles a terminal, a raw ESC on /metrics) are refused at the
receiver and escaped wherever a terminal prints what a feed or a page said."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from otel_ofu import names
from otel_ofu.clock import ManualClock
from otel_ofu.control_chars import escape_controls, escaped
from otel_ofu.gpu_samples import ComputedSnapshot, GpuSample
from otel_ofu.gpu_values import GpuValues
from otel_ofu.model import GpuIdentity
from otel_ofu.producer.prometheus import PrometheusEndpoint
from otel_ofu.producer.self_metrics import SelfMetrics
from otel_ofu.sources.simulated import SimulatedFleet
from otel_ofu.testing.otlp_requests import RecordingSink, gpu_request, mfu_request, set_attribute
from otel_ofu_collector.config import AggregatorConfig
from otel_ofu_collector.demo.command import demo_pipeline
from otel_ofu_collector.otlp.decode import Decoder
from otel_ofu_collector.outputs.record_codec import encode_lines
from otel_ofu_collector.report import summary
from otel_ofu_collector.report import terminal as report_terminal
from otel_ofu_collector.service import CollectorOptions, CollectorService
from tests.collector_helpers import ROOT
from tests.test_top_terminal import EXITED, Terminal, quits_at_once
from tests.test_top_terminal import terminal as terminal

S = 1_000_000_000
OSC_TITLE = "\x1b]2;pwned\x07"  # xterm's "set the window title" to "pwned"
EVIL_JOB = f"job-evil{OSC_TITLE}\x1b[2J"  # ... and clear the screen


# --- the bearer token ------------------------------------------------------------------------------------


def _collector(argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_EXPORTER", "OTEL_OFU"))}
    return subprocess.Popen(
        [sys.executable, "-m", "otel_ofu.cli", "collector", "--listen", "127.0.0.1:0", *argv],
        cwd=ROOT,
        env={**clean, **(env or {})},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def _refused_at_start(process: subprocess.Popen[str]) -> list[str]:
    """The stderr lines of a collector that must stop at its start (exit 2); killed (and failed) if it serves."""
    try:
        _, err = process.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        _, err = process.communicate()
        raise AssertionError(f"the collector started:\n{err}") from None
    assert process.returncode == 2, err
    return err.strip().splitlines()


@pytest.mark.parametrize("content", ["", "  \n\t\n"], ids=["empty", "whitespace"])
def test_an_empty_bearer_token_file_refuses_to_start_instead_of_turning_auth_off(tmp_path: Path, content: str) -> None:
    token = tmp_path / "token"
    token.write_text(content)
    lines = _refused_at_start(_collector(["--bearer-token-file", str(token)]))
    assert len(lines) == 1, lines
    assert f"--bearer-token-file {token} is empty" in lines[0]


def test_a_blank_bearer_token_from_the_environment_refuses_to_start() -> None:
    lines = _refused_at_start(_collector([], env={"OTEL_OFU_COLLECTOR_BEARER_TOKEN": "   "}))
    assert len(lines) == 1, lines
    assert "bearer token is empty" in lines[0]


# --- control characters at the receiver --------------------------------------------------------------------


def test_control_characters_in_identity_values_are_refused_by_reason() -> None:
    sink = RecordingSink()
    decoder = Decoder(sink)
    on_resource = decoder.decode(gpu_request({"GPU-1": (EVIL_JOB, 0.5), "GPU-2": ("job-fine", 0.5)}))
    c1 = decoder.decode(gpu_request({"GPU-3": 0.5}, host="node\x9b31m"))  # a C1 CSI, one byte on some terminals
    on_point = decoder.decode(mfu_request({"job\nforged log line": 0.4, "job-fine": 0.4}))
    datapoint = gpu_request({"GPU-4": 0.5})
    point = datapoint.resource_metrics[0].scope_metrics[0].metrics[0].gauge.data_points[0]
    set_attribute(point.attributes, names.JOB_ID, "job\tx")
    on_data_point = decoder.decode(datapoint)
    assert (on_resource.rejected, c1.rejected, on_point.rejected, on_data_point.rejected) == (1, 1, 1, 1)
    assert [entry[4][names.JOB_ID] for entry in sink.ofu] == ["job-fine"]
    assert [entry[0] for entry in sink.mfu] == ["job-fine"]
    assert decoder.stats.rejected_by_reason[names.RejectReason.BAD_ATTRIBUTE] == 4
    assert decoder.stats.rejected_by_message == {
        "gpu.ofu with a control character in an identity attribute value": 3,
        "job.mfu with a control character in an identity attribute value": 1,
    }


def test_prometheus_metrics_never_carry_a_raw_escape_byte() -> None:
    window = 60 * S
    start = 1_700_000_040 * S - (1_700_000_040 * S) % window
    options = CollectorOptions(
        aggregator=AggregatorConfig(window_s=60.0, lateness_s=10.0),
        grpc_listen=None,
        prometheus_port=0,
        flush_interval_s=0.0,
    )
    service = CollectorService(options, environ={}, clock=lambda: start + S)
    service.start()
    try:
        outcome = service.ingest(gpu_request({"GPU-1": (EVIL_JOB, 0.5), "GPU-2": ("job-fine", 0.5)}, time_ns=start + S))
        assert outcome.rejected == 1
        assert service.flush(start + window + 11 * S)
        text = urllib.request.urlopen(f"http://127.0.0.1:{service.ports['prometheus']}/metrics", timeout=10).read()
    finally:
        service.stop(0)
    assert b'job_id="job-fine"' in text
    assert b"\x1b" not in text
    assert b"job-evil" not in text


def _values() -> GpuValues:
    return GpuValues(
        ofu=0.5,
        ofu_raw=0.5,
        tensor_active=0.5,
        sm_clock_hz=1.98e9,
        max_sm_clock_hz=1.98e9,
        max_clock_from_catalog=False,
    )


def test_the_producers_prometheus_labels_escape_what_a_page_said() -> None:
    """A dcgm-exporter page's pod label becomes the producer's label: escaped, never a raw ESC on /metrics."""
    gpu = GpuIdentity(uuid="GPU-1", index=0, model="NVIDIA H100 80GB HBM3", host="node-1")
    sample = GpuSample(gpu, {names.JOB_ID: EVIL_JOB, names.HW_ID: "GPU-1"}, _values(), 0, 10 * S)
    endpoint = PrometheusEndpoint(port=0, addr="127.0.0.1")
    try:
        endpoint.update(ComputedSnapshot(samples=(sample,)), SelfMetrics(start_ns=0))
        text = urllib.request.urlopen(f"http://127.0.0.1:{endpoint.port}/metrics", timeout=10).read()
    finally:
        endpoint.close()
    assert b"\x1b" not in text
    assert b"\x07" not in text
    assert b'job_id="job-evil\\\\x1b]2;pwned\\\\x07\\\\x1b[2J"' in text  # \x1b written out, its backslash escaped


# --- what a terminal prints -----------------------------------------------------------------------------------


def test_escaped_writes_every_control_character_out_and_leaves_the_rest() -> None:
    assert escaped("job-1 ü 東京") == "job-1 ü 東京"
    assert escaped("a\x1b]2;t\x07b\x9bc\x7f\n\t") == "a\\x1b]2;t\\x07b\\x9bc\\x7f\\x0a\\x09"


def test_escape_controls_reaches_every_string_of_a_report() -> None:
    record = {"jobs": [{"job_id": EVIL_JOB, "flags": ("ok", "\x1b[31m")}], "n": 3, "x": None}
    assert escape_controls(record) == {
        "jobs": [{"job_id": escaped(EVIL_JOB), "flags": ("ok", "\\x1b[31m")}],
        "n": 3,
        "x": None,
    }


def _evil_reports() -> list[Any]:
    """Two windows of the demo fleet (its job-1001 is the one the tests rename)."""
    clock = ManualClock(start_ns=time.time_ns() // (60 * S) * 60 * S)
    fleet = SimulatedFleet.demo(seed=7, clock=clock)
    pipeline = demo_pipeline(fleet, clock, interval_s=10, window_s=60)
    pipeline.start()
    reports: list[Any] = []
    try:
        while len(reports) < 2:
            clock.advance(10)
            reports.extend(pipeline.step().windows)
    finally:
        pipeline.stop()
    return reports


def test_the_text_report_escapes_control_characters_in_job_ids(tmp_path: Path) -> None:
    from otel_ofu_collector.outputs.record_codec import parse_lines

    reports = _evil_reports()
    lines = [line.replace("job-1001", json.dumps(EVIL_JOB)[1:-1]) for _, line in encode_lines(reports)]
    records = parse_lines(lines, "test")
    out = io.StringIO()
    console = Console(file=out, width=120, force_terminal=True, color_system=None)
    report_terminal.print_report(summary.summarize(records.reports), console)
    text = out.getvalue()
    assert "job-evil\\x1b]2;pwned\\x07\\x1b[2J" in text  # written out (whole: the report shows names whole)
    assert "\x07" not in text
    assert "\x1b" not in text


@pytest.fixture
def evil_feed() -> Iterator[str]:
    """A report feed (as an older collector, or a hostile one, would serve it) naming a job with an OSC title."""
    lines = [line.replace("job-1001", json.dumps(EVIL_JOB)[1:-1]) for _, line in encode_lines(_evil_reports())]
    body = "".join(line + "\n" for line in lines).encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/jsonl")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_top_shows_a_control_character_escaped_and_the_terminal_title_stays(
    terminal: Callable[..., Terminal], evil_feed: str
) -> None:
    term = terminal(["--feed", evil_feed, "--refresh", "0.5"])
    term.wait_for("the job table", lambda text: "job-evi" in text)
    term.keys("/")
    term.wait_for("the filter field", lambda text: "filter jobs: type" in text)
    term.keys("evil")
    term.keys("Enter")
    term.wait_for("the filtered table", lambda text: "filter: evil" in text)
    term.keys("Enter")  # the job's own screen names it whole
    screen = term.wait_for("the job's screen", lambda text: "job-evil\\x1b]2;pwned\\x07\\x1b[2J" in text)
    assert "pwned" not in term.tmux("display-message", "-p", "-t", "top", "#{pane_title}")
    assert EXITED not in screen
    quits_at_once(term)
