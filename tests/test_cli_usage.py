"""Usage mistakes a new user makes, each one line and exit status 2 that says what to do instead.

A mistyped option or choice names the closest right one (argparse in Python 3.11 suggests nothing), and a
collector that could receive nothing, or whose port is taken, stops before it starts, in one clean line.
Everything goes through the real entry point, ``cli.main`` in process or ``python -m otel_ofu.cli``
where stderr at the file-descriptor level matters (grpc's C core writes there directly).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from otel_ofu import cli, cli_support


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("OTEL_"):
            monkeypatch.delenv(key)


def usage_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Runs ``argv``, which must be a usage error: exit 2, nothing on stdout, one line on stderr (returned)."""
    with pytest.raises(SystemExit) as exited:
        cli.main(argv)
    assert exited.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""
    (line,) = err.strip().splitlines()
    return line


def test_a_mistyped_option_names_the_closest_one_of_its_command(capsys: pytest.CaptureFixture[str]) -> None:
    line = usage_error(["collector", "--windw", "10"], capsys)
    # The command's own usage error, not the top-level one, and the option it most likely meant.
    assert line.startswith("otel-ofu collector: error: unrecognized arguments: --windw 10")
    assert "did you mean --window?" in line
    assert line.endswith("(see otel-ofu collector --help)")
    # The same with --flag=value, and for each of several mistakes.
    line = usage_error(["collector", "--prometheus-prot=9464", "--windw=3"], capsys)
    assert "--prometheus-prot: did you mean --prometheus-port?" in line
    assert "--windw: did you mean --window?" in line
    # Nothing close: no guess, the plain argparse message.
    line = usage_error(["collector", "--zzzzzz"], capsys)
    assert line == "otel-ofu collector: error: unrecognized arguments: --zzzzzz (see otel-ofu collector --help)"


def test_a_mistyped_command_or_choice_names_the_closest_one(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert "did you mean collector?" in usage_error(["colector"], capsys)
    line = usage_error(["run", "--source", "simm"], capsys)
    assert line.startswith("otel-ofu run: error: argument --source: invalid choice: 'simm'")
    assert "did you mean sim?" in line
    monkeypatch.setenv("OTEL_OFU_SOURCE", "dcgm-exportr")  # from a variable: named, and the guess too
    line = usage_error(["run"], capsys)
    assert "(from OTEL_OFU_SOURCE)" in line
    assert "did you mean dcgm-exporter?" in line


def test_closest_is_difflib_over_the_candidates() -> None:
    assert cli_support.closest("--windw", {"--window", "--lateness"}) == "--window"
    assert cli_support.closest("--x", {"--window", "--lateness"}) is None
    assert cli_support.with_choice_suggestion("argument --x: must be positive") == "argument --x: must be positive"


def test_a_collector_with_no_receiver_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    line = usage_error(["collector", "--listen", "off", "--http-listen", "off"], capsys)
    assert line == (
        "otel-ofu collector: error: --listen and --http-listen are both off: the collector would receive "
        "nothing (see otel-ofu collector --help)"
    )
    assert "--listen and --http-listen are both off" in usage_error(["collector", "--listen", "none"], capsys)


def test_a_grpc_port_in_use_is_one_clean_line_without_grpcs_own_log() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        env = {key: value for key, value in os.environ.items() if not key.startswith(("OTEL_", "GRPC_"))}
        result = subprocess.run(
            [sys.executable, "-m", "otel_ofu.cli", "collector", "--listen", f"127.0.0.1:{port}"],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
            check=False,
        )
    assert result.returncode == 2
    assert result.stdout == ""
    (line,) = result.stderr.strip().splitlines()
    assert "add_port.cc" not in line
    assert line.endswith(f"otel-ofu collector cannot start: cannot listen for OTLP/gRPC on 127.0.0.1:{port} "
                         "(Address already in use)")  # fmt: skip


# --- the snapshot table shows the clock OFU divides by -------------------------------------------------


def test_the_snapshot_table_shows_the_clock_ofu_divides_by() -> None:
    import io

    from rich.console import Console

    from otel_ofu import names
    from otel_ofu.commands.snapshot import print_table

    h100 = {names.HOST_NAME: "n1", names.GPU_INDEX: 0, names.HW_MODEL: "NVIDIA H100 80GB HBM3"}
    unknown = {names.HOST_NAME: "n2", names.GPU_INDEX: 0, names.HW_MODEL: "NVIDIA A800 80GB PCIe"}
    lines = [
        # H100 SXM: OFU = TPA x SM / tensor clock = 0.5 x 1755 / 1830 = 0.4795, not / 1980 (the board max).
        {**h100, names.GPU_TENSOR_ACTIVE.name: 0.5, names.GPU_CLOCK_SM.name: 1755e6,
         names.GPU_CLOCK_SM_MAX.name: 1980e6, names.GPU_OFU.name: 0.5 * 1755 / 1830},
        # A model the catalog does not know: its own max clock, 0.5 x 1200 / 1410 = 0.4255.
        {**unknown, names.GPU_TENSOR_ACTIVE.name: 0.5, names.GPU_CLOCK_SM.name: 1200e6,
         names.GPU_CLOCK_SM_MAX.name: 1410e6, names.GPU_OFU.name: 0.5 * 1200 / 1410},
    ]  # fmt: skip
    out = io.StringIO()
    print_table(lines, Console(file=out, width=80, color_system=None))
    text = out.getvalue().splitlines()
    assert all(len(line) <= 80 for line in text)
    (header,) = [line for line in text if "TPA" in line]
    assert header.split()[2:6] == ["TPA", "SM", "MHz", "ref"]
    (first,) = [line for line in text if line.strip().startswith("n1/0")]
    (second,) = [line for line in text if line.strip().startswith("n2/0")]
    assert first.split()[2:6] == ["0.500", "1755", "1830", "0.480"]
    assert second.split()[2:6] == ["0.500", "1200", "1410", "0.426"]
    assert any("ref MHz: the clock OFU divides by (tensor clock, else max SM clock)" in line for line in text)
