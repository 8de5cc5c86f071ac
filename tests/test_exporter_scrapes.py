"""A vendor exporter's page is whatever its port answers: a page that drips, one that never ends, a line of 200,000
labels, a reading no GPU can give. Each costs only that scrape (a per-GPU error, or the scrape's one error), and
``otel-ofu run`` still stops within a second of SIGTERM."""

from __future__ import annotations

import contextlib
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

from otel_ofu import bounds, names
from otel_ofu.gpu_samples import compute_snapshot
from otel_ofu.model import Snapshot
from otel_ofu.sources.amd_exporter import AmdExporterSource
from otel_ofu.sources.dcgm_exporter import DcgmExporterSource
from otel_ofu.sources.prometheus_text import MAX_PAGE_BYTES, parse_samples
from otel_ofu.testing.otlp_sink import OtlpSink
from tests.collector_helpers import ROOT
from tests.exporter_server import ExporterServer, Ticks, serving
from tests.raw_http import RawHttpServer
from tests.test_amd_exporter_source import BUSY_UUID, IDLE_UUID, mi300x_page

GOOD_LINE = 'DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{gpu="0",UUID="GPU-1",modelName="NVIDIA H100 80GB HBM3"} 0.5\n'


@attrs.define
class HostilePage(RawHttpServer):
    """An exporter that answers 200 and then its body: a byte every ``drip_s`` (``"drip"``), or as fast as the
    client reads it, never ending (``"endless"``)."""

    kind: str
    drip_s: float = 0.2
    sent: int = 0

    def serve(self, connection: socket.socket) -> None:
        with contextlib.suppress(OSError), connection:
            connection.recv(65536)
            connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n\r\n")
            chunk = GOOD_LINE.encode() * 1024
            while not self.stop.is_set():
                if self.kind == "drip":
                    connection.sendall(b"#")
                    self.sent += 1
                    time.sleep(self.drip_s)
                else:
                    connection.sendall(chunk)
                    self.sent += len(chunk)


@pytest.fixture
def hostile() -> Iterator[list[HostilePage]]:
    pages: list[HostilePage] = []
    yield pages
    for page in pages:
        page.close()


def _page(pages: list[HostilePage], kind: str) -> HostilePage:
    page = HostilePage(kind)
    page.start()
    pages.append(page)
    return page


def _in_a_thread(work: object, bound_s: float) -> object:
    found: list[object] = []
    thread = threading.Thread(target=lambda: found.append(work()), daemon=True)  # type: ignore[operator]
    thread.start()
    thread.join(bound_s)
    if thread.is_alive():
        raise AssertionError(f"still running after {bound_s:g} s")
    return found[0]


def _scrape_error(snapshot: Snapshot) -> str:
    assert snapshot.readings == ()
    [error] = snapshot.errors
    assert error.reason == names.ErrorReason.SCRAPE
    return error.message


@pytest.mark.parametrize("source", [DcgmExporterSource, AmdExporterSource])
def test_a_dripping_page_is_cut_at_the_scrapes_deadline(hostile: list[HostilePage], source: type) -> None:
    page = _page(hostile, "drip")
    snapshot = _in_a_thread(lambda: source(page.url, timeout_s=1.0).read(), bound_s=20)
    assert isinstance(snapshot, Snapshot)
    assert "no complete answer within 1 s" in _scrape_error(snapshot)
    assert page.sent >= 2  # it was dripping, not silent


@pytest.mark.parametrize("source", [DcgmExporterSource, AmdExporterSource])
def test_a_page_that_never_ends_is_cut_at_the_byte_bound(hostile: list[HostilePage], source: type) -> None:
    page = _page(hostile, "endless")
    tracemalloc.start()
    try:
        snapshot = _in_a_thread(lambda: source(page.url, timeout_s=60.0).read(), bound_s=60)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert isinstance(snapshot, Snapshot)
    assert f"answer larger than {MAX_PAGE_BYTES} bytes" in _scrape_error(snapshot)
    assert peak < 3 * MAX_PAGE_BYTES, f"{peak / 2**20:.0f} MiB"


def test_a_line_of_200k_labels_is_parsed_in_one_pass() -> None:
    """prometheus-client's parser took time quadratic in a line's labels: about 50 s for this one line."""
    labels = ",".join(f'label_{i:06d}="value {i:06d}"' for i in range(200_000))
    line = f'DCGM_FI_DEV_SM_CLOCK{{gpu="0",UUID="GPU-1",{labels}}} 1500\n'
    assert len(line) > 2 * 2**20
    samples = _in_a_thread(lambda: parse_samples(line + GOOD_LINE), bound_s=20)
    assert isinstance(samples, list)
    first, second = samples
    assert (first.name, first.value, len(first.labels)) == ("DCGM_FI_DEV_SM_CLOCK", 1500.0, 200_002)
    assert first.labels["label_199999"] == "value 199999"
    assert second.name == "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"


def test_the_exposition_text_reads_as_prometheus_writes_it() -> None:
    text = (
        "# HELP x_total a counter\n# TYPE x_total counter\n"
        'x_total{a="1",b="with \\"quotes\\", a \\\\ and a\\nline", } 3 1700000000000\n'
        "y NaN\n"
        'z{a="}{,="} +Inf\n'
        "\n"
        "w -1.5e3\n"
    )
    found = [(s.name, dict(s.labels), s.value) for s in parse_samples(text)]
    assert found[0] == ("x", {"a": "1", "b": 'with "quotes", a \\ and a\nline'}, 3.0)
    assert found[1][0] == "y"
    assert math.isnan(found[1][2])
    assert found[2] == ("z", {"a": "}{,="}, math.inf)
    assert found[3] == ("w", {}, -1500.0)


@pytest.mark.parametrize("text", ['x{a="1" 3\n', "x{a=1} 3\n", "x\n", "x 1 2 3\n", 'x{a="1"}3\n', "{} 1\n"])
def test_malformed_lines_are_a_scrape_error(text: str) -> None:
    from otel_ofu.sources.prometheus_text import ScrapeError

    with pytest.raises(ScrapeError, match="malformed exposition text"):
        parse_samples(text)


def test_run_stops_within_a_second_of_sigterm_while_its_exporter_drips(hostile: list[HostilePage]) -> None:
    page = _page(hostile, "drip")
    env = {key: value for key, value in os.environ.items() if not key.startswith(("OTEL_", "OFU_"))}
    with OtlpSink.start() as sink:
        process = subprocess.Popen(
            [
                sys.executable, "-m", "otel_ofu.cli", "run", "--source", "dcgm-exporter", "--url", page.url,
                "--interval", "1", "--export-endpoint", sink.grpc_endpoint,
            ],
            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            assert process.stderr is not None
            for line in process.stderr:
                if "exporting every" in line:
                    break
            deadline = time.monotonic() + 30
            while page.sent < 3 and time.monotonic() < deadline:  # a scrape is dripping now
                time.sleep(0.1)
            signalled = time.monotonic()
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                raise AssertionError("otel-ofu run ignored SIGTERM while its exporter dripped") from None
            took = time.monotonic() - signalled
            rest = process.stderr.read()
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
            if process.stderr is not None:
                process.stderr.close()
    assert process.returncode == 0, rest
    assert "Traceback" not in rest
    print(f"SIGTERM to exit: {took:.2f} s")


# --- a reading no GPU can give -------------------------------------------------------------------------------


def test_a_pages_1e308_watts_or_9e24_hertz_is_a_per_gpu_error(shared_fixtures: Path) -> None:
    page = mi300x_page(shared_fixtures)
    busy_power = next(line for line in page.splitlines() if line.startswith("gpu_power_usage") and BUSY_UUID in line)
    page = page.replace(busy_power, busy_power.rsplit(" ", 1)[0] + " 1e308")
    idle_clock = next(
        line for line in page.splitlines() if line.startswith("gpu_clock{") and IDLE_UUID in line and "system" in line
    )
    page = page.replace(idle_clock, idle_clock.rsplit(" ", 1)[0] + " 9.2e18")  # MHz: 9.2e24 Hz
    with serving() as server:
        snapshot = AmdExporterSource(ExporterServer.serve(server, page), clock=Ticks()).read()
    computed = compute_snapshot(snapshot)
    errors = {error.gpu.uuid: error for error in computed.errors if error.gpu is not None}
    assert set(errors) == {BUSY_UUID, IDLE_UUID}
    assert {error.reason for error in errors.values()} == {names.ErrorReason.INVALID_VALUE}
    assert "power" in errors[BUSY_UUID].message
    assert "SM clock" in errors[IDLE_UUID].message
    assert len(computed.samples) == 8  # the CPX GPU's partitions
    for sample in computed.samples:
        assert sample.values.power_w is None or sample.values.power_w <= bounds.MAX_GPU_POWER_W
        assert sample.values.sm_clock_hz is None or sample.values.sm_clock_hz <= bounds.MAX_CLOCK_HZ
    for partial in computed.partial:
        assert partial.known.get(names.GPU_CLOCK_SM.name, 0.0) <= bounds.MAX_CLOCK_HZ
