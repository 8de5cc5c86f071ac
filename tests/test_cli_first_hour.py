"""A new user's first hour with ``otel-ofu``: mistakes are one line and an exit code, never silence or a traceback.

Everything goes through the real entry point: ``cli.main(argv)`` in process, or ``python -m otel_ofu.cli``
where the process itself matters (stderr of a long run, a closed pipe).
"""

from __future__ import annotations

import argparse
import io
import logging
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

import otel_ofu
from otel_ofu import cli, cli_support, names
from otel_ofu.commands.snapshot import print_table
from otel_ofu.gpu_samples import ComputedSnapshot, GpuSample
from otel_ofu.gpu_values import GpuValues
from otel_ofu.model import GpuError, GpuIdentity, Snapshot
from otel_ofu.producer.loop import Producer
from otel_ofu.producer.source_health import SourceHealth

GPU = GpuIdentity(uuid="GPU-1", model="NVIDIA H100 80GB HBM3", index=0, host="node-1")


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("OTEL_"):
            monkeypatch.delenv(key)


def otel_ofu_process(*argv: str) -> subprocess.Popen[str]:
    """``otel-ofu ARGV`` as its own process, stdout and stderr piped, none of this environment's OTEL_*."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("OTEL_")}
    command = [sys.executable, "-m", "otel_ofu.cli", *argv]
    return subprocess.Popen(command, text=True, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def usage_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Runs ``argv``, which must be a usage error: exit 2 and one line on stderr, which is returned."""
    with pytest.raises(SystemExit) as exited:
        cli.main(argv)
    assert exited.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""
    (line,) = err.strip().splitlines()
    assert "Traceback" not in line
    return line


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port  # nothing listens there now: every connection is refused


# --- 9: a source that fails on every read is said, not silent -------------------------------------------


def test_run_against_a_dead_exporter_says_so_once() -> None:
    url = f"http://127.0.0.1:{closed_port()}/metrics"
    process = otel_ofu_process(
        *("run", "--source", "dcgm-exporter", "--url", url, "--exporter", "none", "--interval", "0.5"),
        *("--duration", "2", "--quiet"),
    )
    _, err = process.communicate(timeout=60)
    assert process.returncode == 0
    failing = [line for line in err.splitlines() if "is failing" in line]
    assert len(failing) == 1, err  # about five reads failed the same way: said once
    assert "source dcgm-exporter is failing" in failing[0]
    assert url in failing[0]
    assert "refused" in failing[0].lower()


class Ticking:
    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now


def _failed(message: str) -> ComputedSnapshot:
    return ComputedSnapshot(errors=(GpuError(names.ErrorReason.SCRAPE, message),))


def _fine() -> ComputedSnapshot:
    values = GpuValues(0.5, 0.5, 0.5, 1.98e9, 1.98e9, False)
    return ComputedSnapshot(samples=(GpuSample(GPU, {}, values, 0, 1),))


def test_source_health_says_a_failure_once_then_changes_at_most_once_a_minute(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Ticking()
    health = SourceHealth("dcgm-exporter", clock, every_s=60)
    with caplog.at_level(logging.WARNING, logger="otel_ofu.producer.source_health"):
        for _ in range(5):
            health.observe(_failed("connection refused"))
            clock.now += 10 * 10**9
        assert len(caplog.messages) == 1
        assert "source dcgm-exporter is failing: connection refused (scrape)" in caplog.messages[0]
        health.observe(_failed("HTTP 503"))  # 50 s after the first line: held back
        assert len(caplog.messages) == 1
        clock.now += 20 * 10**9
        health.observe(_failed("HTTP 503"))  # the quiet minute is over: the change is said
        assert len(caplog.messages) == 2
        assert "HTTP 503" in caplog.messages[1]
        health.observe(_fine())
        assert len(caplog.messages) == 3
        assert "reading again" in caplog.messages[2]
        health.observe(_fine())
        assert len(caplog.messages) == 3


class DeadSource:
    name = "dead"

    def read(self) -> Snapshot:
        return Snapshot(errors=(GpuError(names.ErrorReason.SCRAPE, "connection refused"),))

    def close(self) -> None:
        pass


def test_the_debug_line_of_a_source_error_names_the_source_not_none(caplog: pytest.LogCaptureFixture) -> None:
    producer = Producer(source=DeadSource())
    with caplog.at_level(logging.DEBUG, logger="otel_ofu.producer.loop"):
        producer.run_once()
    producer.close()
    (skipped,) = [message for message in caplog.messages if message.startswith("skipped")]
    assert "None" not in skipped
    assert skipped == "skipped source dead: connection refused (scrape)"


# --- 10: host:port and URLs are checked when the command line is read ----------------------------------


@pytest.mark.parametrize("option", ["--listen", "--http-listen"])
def test_a_listener_port_out_of_range_is_a_usage_error(option: str, capsys: pytest.CaptureFixture[str]) -> None:
    line = usage_error(["collector", option, "127.0.0.1:70000"], capsys)
    assert f"argument {option}" in line
    assert "70000" in line


@pytest.mark.parametrize(
    "argv",
    [
        ["collector", "--export-endpoint", "not a url"],
        ["run", "--export-endpoint", "not a url"],
        ["report", "--live", "http://collector:99999"],
        ["snapshot", "--source", "dcgm-exporter", "--url", "node-7:9400x"],
    ],
)
def test_an_endpoint_that_is_no_url_is_a_usage_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    line = usage_error(argv, capsys)
    option = next(arg for arg in argv if arg.startswith("--") and arg != "--source")
    assert f"argument {option}" in line


@pytest.mark.parametrize("variable", ["OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"])
def test_an_otlp_endpoint_variable_that_is_no_url_stops_run_in_one_line(
    variable: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(variable, "not a url")
    assert cli.main(["run", "--source", "sim", "--duration", "1", "--quiet"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    (line,) = err.strip().splitlines()
    assert line.startswith(f"otel-ofu run: {variable}: ")
    assert "'not a url'" in line


@pytest.mark.parametrize(
    ("validator", "good", "bad"),
    [
        (
            cli_support.host_port,
            ["0.0.0.0:4317", "localhost:0", "[::1]:4317", ":4317", "node-1.example:65535"],
            ["127.0.0.1:70000", "127.0.0.1", "127.0.0.1:", "::1:4317", "host:port", "a b:1", "http://x:1"],
        ),
        (
            cli_support.url,
            ["http://collector:4318", "https://x/v1/metrics", "http://[::1]:9400/metrics"],
            ["not a url", "collector:4318", "ftp://x", "http://", "http://x:70000", "http://x:port"],
        ),
        (
            cli_support.url_or_host_port,
            ["http://collector:4318", "collector:4317", "localhost:9400"],
            ["not a url", "collector", "http://x:99999", "ftp://x"],
        ),
    ],
)
def test_address_validators(validator: object, good: list[str], bad: list[str]) -> None:
    assert callable(validator)
    for text in good:
        assert validator(text) == text
    for text in bad:
        with pytest.raises(argparse.ArgumentTypeError):
            validator(text)


def test_listeners_and_ports_turned_off_by_a_word() -> None:
    assert cli_support.address_or_off("off") is None
    assert cli_support.port_number("off") is None
    assert cli_support.port_number(" None ") is None
    assert cli_support.port_number("9464") == 9464
    run_args = cli.build_parser().parse_args(["run", "--prometheus-port", "off"])
    assert run_args.prometheus_port is None
    collector_args = cli.build_parser().parse_args(["collector", "--prometheus-port", "off"])
    assert collector_args.prometheus_port is None


# --- 11: one line, never a traceback --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "option"),
    [
        (["report", "--capture", "c.jsonl", "--out", "/nonexistent-dir/x.html"], "--out"),
        (["demo", "--html", "/nonexistent-dir/r.html"], "--html"),
        (["run", "--record", "/nonexistent-dir/capture.jsonl"], "--record"),
    ],
)
def test_an_output_in_a_missing_folder_is_a_usage_error(
    argv: list[str], option: str, capsys: pytest.CaptureFixture[str]
) -> None:
    line = usage_error(argv, capsys)
    assert f"argument {option}" in line
    assert "'/nonexistent-dir' does not exist" in line


def test_an_output_path_that_is_a_folder_is_refused(tmp_path: Path) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="is a folder"):
        cli_support.output_path(str(tmp_path))
    assert cli_support.output_path(str(tmp_path / "r.html")) == str(tmp_path / "r.html")


def test_snapshot_into_a_closed_pipe_exits_quietly() -> None:
    process = otel_ofu_process("snapshot", "--source", "sim")
    assert process.stdout is not None
    process.stdout.close()  # the reader is gone before a line is written, as `| head` is after its lines
    _, err = process.communicate(timeout=60)
    assert process.returncode == 1
    assert "Traceback" not in err
    assert "BrokenPipe" not in err
    assert "Exception ignored" not in err


# --- 16: polish -----------------------------------------------------------------------------------------


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == f"otel-ofu {otel_ofu.__version__}"


def test_log_level_before_or_after_the_command(monkeypatch: pytest.MonkeyPatch) -> None:
    parser = cli.build_parser()
    assert parser.parse_args(["snapshot"]).log_level == "INFO"
    assert parser.parse_args(["--log-level", "debug", "snapshot"]).log_level == "DEBUG"
    assert parser.parse_args(["snapshot", "--log-level", "debug"]).log_level == "DEBUG"
    assert parser.parse_args(["--log-level", "error", "collector", "--log-level", "debug"]).log_level == "DEBUG"
    monkeypatch.setenv("OTEL_OFU_LOG_LEVEL", "warning")
    assert cli.build_parser().parse_args(["run"]).log_level == "WARNING"  # the variable, with nothing after


def test_run_names_the_prometheus_host_as_the_collector_does(capsys: pytest.CaptureFixture[str]) -> None:
    parser = cli.build_parser()
    assert parser.parse_args(["run"]).prometheus_host == "127.0.0.1"
    assert parser.parse_args(["run", "--prometheus-host", "127.0.0.1"]).prometheus_host == "127.0.0.1"
    assert parser.parse_args(["collector", "--prometheus-host", "127.0.0.1"]).prometheus_host == "127.0.0.1"
    capsys.readouterr()
    # The old spelling still works, says its new name, and is no longer in the help.
    assert parser.parse_args(["run", "--prometheus-addr", "127.0.0.2"]).prometheus_host == "127.0.0.2"
    assert "--prometheus-addr is deprecated, use --prometheus-host" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["run", "--help"])
    help_text = capsys.readouterr().out
    assert "--prometheus-host" in help_text
    assert "--prometheus-addr" not in help_text


def test_runs_old_prometheus_variable_still_counts(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("OTEL_OFU_PROMETHEUS_ADDR", "127.0.0.3")
    assert cli.build_parser().parse_args(["run"]).prometheus_host == "127.0.0.3"
    monkeypatch.setenv("OTEL_OFU_PROMETHEUS_HOST", "127.0.0.4")  # the new name wins
    assert cli.build_parser().parse_args(["run"]).prometheus_host == "127.0.0.4"
    assert cli.main(["run", "--calibration", "bad"]) == 2  # stops before anything starts
    assert "OTEL_OFU_PROMETHEUS_ADDR is deprecated, use OTEL_OFU_PROMETHEUS_HOST" in capsys.readouterr().err


def test_the_snapshot_table_reads_at_80_columns() -> None:
    long_host = GpuIdentity(uuid="GPU-2", model="NVIDIA H100 80GB HBM3", index=7, host="a-very-long-node-name-01")
    lines = [
        {**GPU.resource_attributes(), names.JOB_ID: "job-1001", names.GPU_TENSOR_ACTIVE.name: 0.496,
         names.GPU_CLOCK_SM.name: 1.95e9, names.GPU_CLOCK_SM_MAX.name: 1.98e9, names.GPU_OFU.name: 0.496,
         names.GPU_FLOPS_ACHIEVED.name: 490.3e12},
        {**long_host.resource_attributes(), names.JOB_ID: "a-long-job-name-of-forty-characters-long",
         names.GPU_CLOCK_SM.name: 1.755e9, "error": "no value for tensor pipe activity (field 1004) (blank "
         "sentinel or NaN)", names.ERROR_REASON: names.ErrorReason.NO_VALUE},
    ]  # fmt: skip
    out = io.StringIO()
    print_table(lines, Console(file=out, width=80, color_system=None))
    text = out.getvalue().splitlines()
    assert all(len(line) <= 80 for line in text)
    rows = [line for line in text if "H100-SXM" in line]
    assert len(rows) == 2  # one line per GPU: nothing wrapped onto a second line
    assert rows[0].split()[2:] == ["0.496", "1950", "1830", "0.496", "490.3", "job-1001"]  # ref: the tensor clock
    assert "1755" in rows[1]
    assert rows[1].split()[0].endswith("…/7")  # the host is cut, never the GPU index
    # The error is a note under the table, in full, its number where the GPU's OFU would be.
    assert rows[1].split()[-2] == "[1]"
    notes = " ".join(line.strip() for line in text if not line.startswith(" "))
    assert "no_value: no value for tensor pipe activity (field 1004) (blank sentinel or NaN)" in notes
