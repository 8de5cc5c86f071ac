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
