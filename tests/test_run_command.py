"""``otel-ofu run``: options and their variables, and a short real run against the loopback sink."""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import attrs
import pytest

from otel_ofu import names
from otel_ofu.cli_support import export_interval_s, option_variables
from otel_ofu.commands import run
from otel_ofu.model import Snapshot
from otel_ofu.testing.otlp_sink import OtlpSink


def run_parser() -> argparse.ArgumentParser:
    """A parser holding only ``run`` (built after the test has set its variables: defaults read them)."""
    parser = argparse.ArgumentParser(prog="otel-ofu")
    run.register(parser.add_subparsers(dest="command", required=True))
    return parser


def parse(*argv: str) -> argparse.Namespace:
    return run_parser().parse_args(["run", *argv])


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith(("OTEL_", "OTEL_OFU_")):
            monkeypatch.delenv(key)


@pytest.fixture
def sink() -> Iterator[OtlpSink]:
    with OtlpSink.start() as started:
        yield started


def run_subparser() -> argparse.ArgumentParser:
    parser = run_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    sub: argparse.ArgumentParser = action.choices["run"]
    return sub


def test_every_option_names_its_plain_variable_in_help() -> None:
    sub = run_subparser()
    variables = option_variables(sub)
    assert {"--source", "--interval", "--duration", "--placement", "--record", "--sim-speed", "--quiet"} <= set(
        variables
    )
    for flag, variable in variables.items():
        assert variable == "OTEL_OFU_" + flag[2:].replace("-", "_").upper(), flag  # the deploy kit's names
    flat = re.sub(r"\s+", " ", sub.format_help())
    assert all(f"env {variable}" in flat for variable in variables.values())


def test_interval_default_follows_otel_metric_export_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse().interval is None  # the handler asks OTEL_METRIC_EXPORT_INTERVAL, else 10
    assert export_interval_s() == 10.0
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "2500")
    assert export_interval_s() == 2.5
    monkeypatch.setenv("OTEL_OFU_INTERVAL", "7")
    assert parse().interval == 7.0
    assert parse("--interval", "3").interval == 3.0


def test_the_handler_takes_the_interval_from_otel_metric_export_interval(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "2500")
    args = parse("--source", "sim", "--exporter", "none", "--sim-speed", "1000", "--duration", "5")
    assert args.handler(args) == 0
    assert "exporting every 2.5 s" in capsys.readouterr().err


def test_a_bad_otel_interval_falls_back_to_ten_seconds(caplog: pytest.LogCaptureFixture) -> None:
    assert export_interval_s({"OTEL_METRIC_EXPORT_INTERVAL": "soon"}) == 10.0
    assert export_interval_s({"OTEL_METRIC_EXPORT_INTERVAL": "-5"}) == 10.0
    assert "ignoring OTEL_METRIC_EXPORT_INTERVAL" in caplog.text


def test_options_come_from_their_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_OFU_SOURCE", "sim")
    monkeypatch.setenv("OTEL_OFU_PLACEMENT", "both")
    monkeypatch.setenv("OTEL_OFU_JOB_ID", "job-42")
    monkeypatch.setenv("OTEL_OFU_PROMETHEUS_PORT", "9464")
    monkeypatch.setenv("OTEL_OFU_QUIET", "true")
    args = parse()
    assert (args.source, args.placement, args.job_id, args.prometheus_port, args.quiet) == (
        "sim",
        "both",
        "job-42",
        9464,
        True,
    )
    assert parse("--placement", "datapoint").placement == "datapoint"  # the command line wins


def test_a_bad_choice_from_a_variable_is_a_usage_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("OTEL_OFU_PLACEMENT", "everywhere")
    with pytest.raises(SystemExit) as exited:
        parse("--source", "sim")
    assert exited.value.code == 2
    (error,) = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert "argument --placement: invalid choice: 'everywhere' (from OTEL_OFU_PLACEMENT)" in error
    assert parse("--placement", "both").placement == "both"  # the command line wins over a bad variable


def test_an_env_enabled_flag_can_be_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_OFU_QUIET", "yes")
    assert parse().quiet is True
    assert parse("--no-quiet").quiet is False


@attrs.define
class ClosableSource:
    name: str = "fake"
    closed: bool = False

    def read(self) -> Snapshot:
        return Snapshot()

    def close(self) -> None:
        self.closed = True


def test_a_busy_prometheus_port_says_so_in_one_line_and_closes_the_source(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    source = ClosableSource()
    monkeypatch.setattr(run, "open_from_args", lambda args, clock: (source, "a fake source"))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        args = parse("--source", "sim", "--exporter", "none", "--prometheus-port", str(port), "--prometheus-host",
                     "127.0.0.1", "--quiet")  # fmt: skip
        assert args.handler(args) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert f"cannot serve Prometheus on 127.0.0.1:{port}" in line
    assert source.closed


@attrs.define
class ClosableRecorder:
    closed: bool = False

    def write(self, snapshot: Snapshot) -> None:
        raise AssertionError("nothing runs: the producer was never built")

    def close(self) -> None:
        self.closed = True


def test_a_producer_that_cannot_be_built_closes_the_recorder_and_the_source(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    source, recorder = ClosableSource(), ClosableRecorder()
    opened: list[str] = []

    def open_recorder(path: str) -> ClosableRecorder:
        opened.append(path)
        return recorder

    def refuse(**settings: object) -> NoReturn:
        raise RuntimeError("the producer refuses its settings")

    monkeypatch.setattr(run, "open_from_args", lambda args, clock: (source, "a fake source"))
    monkeypatch.setattr(run, "open_recorder", open_recorder)
    monkeypatch.setattr(run, "Producer", refuse)
    capture = str(tmp_path / "capture.jsonl")
    args = parse("--source", "sim", "--exporter", "none", "--record", capture, "--quiet")
    with pytest.raises(RuntimeError, match="refuses"):
        args.handler(args)
    assert opened == [capture]
    assert (recorder.closed, source.closed) == (True, True)


def test_bad_calibration_and_unavailable_source_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    args = parse("--calibration", "job:x=7")
    assert args.handler(args) == 2
    assert "--calibration" in capsys.readouterr().err
    args = parse("--source", "replay", "--exporter", "none")  # no --file
    assert args.handler(args) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_sim_run_exports_records_and_stops_after_duration(
    sink: OtlpSink, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capture = tmp_path / "capture.jsonl"
    args = parse(
        "--source",
        "sim",
        "--sim-speed",
        "500",
        "--interval",
        "10",
        "--duration",
        "40",
        "--export-endpoint",
        sink.grpc_endpoint,
        "--record",
        str(capture),
        "--prometheus-port",
        "0",
        "--prometheus-addr",
        "127.0.0.1",
        "--job-id",
        "fallback-job",
    )
    assert args.handler(args) == 0
    err = capsys.readouterr().err
    assert "sim:" in err
    assert "exporting every 10 s" in err
    requests = sink.requests()
    assert len(requests) >= 1
    resources = [
        {item.key: item.value for item in rm.resource.attributes}
        for rm in requests[-1].resource_metrics
        if any(item.key == names.HW_ID for item in rm.resource.attributes)
    ]
    assert len(resources) >= 28  # the demo fleet: 4 hosts x 8 GPUs, less any flaky one
    job_ids = {attributes[names.JOB_ID].string_value for attributes in resources}
    assert "job-1001" in job_ids  # the fleet's own attribution beats the static fallback
    lines = capture.read_text().splitlines()
    assert lines
    assert all(isinstance(json.loads(line), dict) for line in lines)


def test_replaying_a_recorded_capture_exports_it_and_stops_at_its_end(sink: OtlpSink, tmp_path: Path) -> None:
    capture = tmp_path / "capture.jsonl"
    record = parse("--source", "sim", "--sim-speed", "1000", "--interval", "10", "--duration", "30")
    record.exporter, record.record, record.quiet = "none", str(capture), True
    assert record.handler(record) == 0
    recorded_reads = {json.loads(line)["seq"] for line in capture.read_text().splitlines()}
    replay = parse(
        "--source", "replay", "--file", str(capture), "--interval", "0.01", "--export-endpoint", sink.grpc_endpoint
    )
    assert replay.handler(replay) == 0  # no --duration: it ends because the capture does
    assert sink.wait_for(lambda received: len(received.requests()) >= len(recorded_reads), timeout=10)
