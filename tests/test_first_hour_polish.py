"""What a new user met in their first hour that was wrong in small ways, each as they met it.

- ``otel-ofu demo`` printed the embedded collector's INFO log line above its report.
- The README says the report fits 80 columns; in a wide terminal its paragraphs ran to the terminal's width.
- ``otel-ofu run --duration`` exited 0 when not one export got through.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from otel_ofu.testing.otlp_sink import OtlpSink, unused_port

LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ (DEBUG|INFO|WARNING|ERROR) ")


def otel_ofu(*args: str, columns: int | None = None) -> subprocess.CompletedProcess[str]:
    env_columns = {"COLUMNS": str(columns)} if columns else {}
    import os

    env = {key: value for key, value in os.environ.items() if key not in ("COLUMNS", "LINES")} | env_columns
    return subprocess.run(
        [sys.executable, "-m", "otel_ofu.cli", *args], capture_output=True, text=True, timeout=300, env=env
    )


@pytest.fixture(scope="module")
def wide_demo() -> subprocess.CompletedProcess[str]:
    return otel_ofu("demo", "--duration", "900", columns=200)


def test_the_demo_prints_its_report_and_no_log_lines(wide_demo: subprocess.CompletedProcess[str]) -> None:
    assert wide_demo.returncode == 0, wide_demo.stderr
    logged = [line for line in (wide_demo.stdout + wide_demo.stderr).splitlines() if LOG_LINE.match(line)]
    assert logged == []
    assert "otel-ofu demo: fleet report" in wide_demo.stdout


def test_a_wide_terminal_gets_a_report_no_wider_than_100_columns(wide_demo: subprocess.CompletedProcess[str]) -> None:
    """COLUMNS=200 is a terminal 200 wide to rich: the report takes up to 100 of them (its names whole: the
    exposed-allreduce job's 29-character name is cut at 80 columns), and its paragraphs stay readable."""
    lines = wide_demo.stdout.splitlines()
    assert max(len(line) for line in lines) <= 100
    assert any("gpt-30b-tp4-exposed-allreduce " in line for line in lines)


def test_run_with_a_duration_exits_non_zero_when_no_export_got_through() -> None:
    port = unused_port()
    failed = otel_ofu("run", "--source", "sim", "--interval", "0.5", "--duration", "2", "--quiet",
                      "--export-endpoint", f"http://127.0.0.1:{port}")  # fmt: skip
    assert failed.returncode == 1, failed.stderr
    last = failed.stderr.strip().splitlines()[-1]
    assert last.startswith(f"otel-ofu run: no export got through to http://127.0.0.1:{port} in ")
    assert "intervals" in last
    with OtlpSink.start() as sink:
        ok = otel_ofu("run", "--source", "sim", "--interval", "0.5", "--duration", "2", "--quiet",
                      "--export-endpoint", f"http://127.0.0.1:{sink.grpc_port}")  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    none = otel_ofu("run", "--source", "sim", "--interval", "0.5", "--duration", "1", "--quiet", "--exporter", "none")
    assert none.returncode == 0, none.stderr  # nothing to export to: nothing failed


def test_one_unreachable_downstream_is_said_once_not_once_per_stream(caplog: pytest.LogCaptureFixture) -> None:
    """The window export, the pass-through and the self-metrics all go to the one --export-endpoint: when nothing
    listens there, the log says so once, naming it, and once more when it answers."""
    import logging
    import time

    from otel_ofu.clock import ManualClock
    from otel_ofu.producer.exporters import otlp_exporter
    from otel_ofu.producer.loop import Producer
    from otel_ofu.sources.simulated import SimulatedFleet
    from otel_ofu_collector.config import AggregatorConfig
    from otel_ofu_collector.service import CollectorOptions, CollectorService

    port = unused_port()
    start = 1_800_000_040 * 10**9
    service = CollectorService(
        CollectorOptions(
            aggregator=AggregatorConfig(window_s=60.0, lateness_s=0.0),
            grpc_listen="127.0.0.1:0",
            export_endpoint=f"http://127.0.0.1:{port}",
            flush_interval_s=0.0,
            initial_backoff_s=0.05,
            max_backoff_s=0.2,
        ),
        clock=lambda: start,
        environ={},
    )
    caplog.set_level(logging.INFO, logger="otel_ofu_collector")
    service.start()
    try:
        clock = ManualClock(start_ns=start)
        producer = Producer(source=SimulatedFleet.demo(seed=1, clock=clock), clock=clock)
        exporter = otlp_exporter(protocol="grpc", endpoint=f"http://127.0.0.1:{service.ports['grpc']}")
        clock.advance(10)
        exporter.export(producer.run_once())
        exporter.shutdown()
        service.flush(start + 120 * 10**9)  # a window out, and the self-metrics with it
        deadline = time.monotonic() + 3.0  # a dozen failed attempts or more per stream at 0.05-0.2 s
        while time.monotonic() < deadline:
            time.sleep(0.1)
        stats = [d.stats.failures for d in service._deliveries()]
        assert sum(stats) >= 6, stats
    finally:
        service.stop(grace=0.5)
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and "downstream" in r.getMessage()]
    down = [line for line in said if "failed" in line or "unreachable" in line]
    assert len(down) == 1, said
    assert f"127.0.0.1:{port}" in down[0]
    assert all(stream in down[0] for stream in ("window export", "pass-through", "self-metrics"))


def test_the_demo_puts_the_loggers_back_as_it_found_them(capsys: pytest.CaptureFixture[str]) -> None:
    """Quieting the embedded collector is the demo's own business: a process that runs it goes on logging."""
    import logging

    from otel_ofu.cli import main

    names = ("otel_ofu_collector", "otel_ofu")
    before = [logging.getLogger(name).level for name in names]
    assert main(["demo", "--duration", "600"]) == 0
    capsys.readouterr()
    assert [logging.getLogger(name).level for name in names] == before
