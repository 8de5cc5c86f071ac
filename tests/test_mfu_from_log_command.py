"""``otel-ofu mfu-from-log`` as a user meets it: where it exports, ``--export-endpoint`` like ``run``, what it
counts as junk, and its file variable named like every other one (``OTEL_OFU_MFU_<OPTION>``).

Through the real parser (``cli.build_parser``) into a real OTLP sink on 127.0.0.1 port 0, gRPC and HTTP.
"""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path
from typing import Any

import pytest

from otel_ofu import cli, names
from otel_ofu.testing.otlp_sink import OtlpSink

MFU_LINE = "[rank0] step 120 | loss 3.112 | 1.02 s/step | 128.4k tok/s | MFU 32.5% | dataloader wait"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("OTEL_"):
            monkeypatch.delenv(key)


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def mfu_values(sink: OtlpSink) -> list[float]:
    return [
        point.as_double
        for request in sink.requests()
        for resource_metrics in request.resource_metrics
        for scope_metrics in resource_metrics.scope_metrics
        for metric in scope_metrics.metrics
        if metric.name == names.JOB_MFU.name
        for point in metric.gauge.data_points
    ]


def run(argv: list[str]) -> int:
    args = cli.build_parser().parse_args(["mfu-from-log", *argv])
    code: int = args.handler(args)
    return code


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_export_endpoint_wins_over_the_variable_and_the_log_says_where(
    protocol: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    log = tmp_path / "train.log"
    log.write_text(MFU_LINE + "\n")
    # The standard variable points at nothing: only --export-endpoint can deliver.
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{closed_port()}")
    with OtlpSink.start() as sink:
        endpoint = sink.grpc_endpoint if protocol == "grpc" else f"http://127.0.0.1:{sink.http_port}"
        argv = ["--file", str(log), "--job-id", "job-7", "--from-start", "--duration", "0", "--interval", "60"]
        with caplog.at_level(logging.INFO):
            assert run([*argv, "--export-endpoint", endpoint, "--protocol", protocol]) == 0
        assert sink.wait_for(lambda s: bool(mfu_values(s)), timeout=10.0)
        assert mfu_values(sink) == [0.325]
    # OTLP/HTTP posts to /v1/metrics of a base URL, as the SDK does with OTEL_EXPORTER_OTLP_ENDPOINT.
    where = endpoint if protocol == "grpc" else f"{endpoint}/v1/metrics"
    assert f"exporting job.mfu every 60 s to otlp {protocol} {where}" in caplog.text


def test_the_log_names_the_variable_endpoint_or_the_sdk_default(monkeypatch: pytest.MonkeyPatch) -> None:
    from otel_ofu.commands.mfu_from_log import export_target

    assert export_target(None, None) == "grpc localhost:4317 (the SDK's default)"
    assert export_target("http/protobuf", None) == "http/protobuf http://localhost:4318/v1/metrics (the SDK's default)"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318")
    assert export_target("http/protobuf", None) == "http/protobuf http://collector:4318/v1/metrics"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "http://other:4318/custom")  # used as it is
    assert export_target("http/protobuf", None) == "http/protobuf http://other:4318/custom"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    assert export_target(None, "http://given:4317") == "grpc http://given:4317"


def test_a_line_without_an_mfu_is_a_junk_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    log = tmp_path / "train.log"
    # 5 lines: one MFU (its line names step 120 too), one refused MFU (above the plausibility bound), a line with a
    # step and no MFU, one with neither and one binary line. Junk: 1 with neither + 1 unreadable = 2.
    log.write_bytes(
        b"starting the run\n" + MFU_LINE.encode() + b"\nMFU 900%\nstep 2 | loss 2.9 | 1.01 s/step\n\x00\x01\x02\n"
    )
    with OtlpSink.start() as sink, caplog.at_level(logging.INFO):
        assert run(["--file", str(log), "--job-id", "j", "--from-start", "--duration", "0", "--interval", "60",
                    "--export-endpoint", sink.grpc_endpoint]) == 0  # fmt: skip
    (stopped,) = [record.getMessage() for record in caplog.records if record.getMessage().startswith("stopped")]
    assert stopped.startswith(
        "stopped: 5 lines, 1 MFU values, 2 progress lines, 1 rejected, 2 junk lines skipped "
        "(1 without an MFU or progress, 1 unreadable)"
    )


def test_the_file_variable_follows_the_command_prefix_and_the_old_name_still_works(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def parse(*argv: str) -> Any:
        return cli.build_parser().parse_args(["mfu-from-log", "--job-id", "j", *argv])

    monkeypatch.setenv("OTEL_OFU_MFU_FILE", "/var/log/new.log")
    assert parse().file == "/var/log/new.log"
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("OTEL_OFU_MFU_LOG_FILE", "/var/log/old.log")
    assert parse().file == "/var/log/new.log"  # the new name wins, and the old one is not mentioned
    assert capsys.readouterr().err == ""
    monkeypatch.delenv("OTEL_OFU_MFU_FILE")
    assert parse().file == "/var/log/old.log"
    assert capsys.readouterr().err == (
        "otel-ofu mfu-from-log: OTEL_OFU_MFU_LOG_FILE is deprecated, use OTEL_OFU_MFU_FILE\n"
    )
    assert parse("--file", "/given.log").file == "/given.log"  # given on the command line: nothing to say
    assert capsys.readouterr().err == ""
    with pytest.raises(SystemExit):
        cli.main(["mfu-from-log", "--help"])
    help_text = capsys.readouterr().out
    assert "OTEL_OFU_MFU_FILE" in help_text
    assert "OTEL_OFU_MFU_EXPORT_ENDPOINT" in help_text
    assert "OTEL_OFU_MFU_PROTOCOL" in help_text
