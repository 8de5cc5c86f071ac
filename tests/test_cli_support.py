"""Options with environment variables: validators, bad values as usage errors, and one name per meaning."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import pytest

from otel_ofu import cli
from otel_ofu.cli_support import (
    DOCTOR_PREFIX,
    MFU_PREFIX,
    PREFIX,
    SNAPSHOT_PREFIX,
    CommandOptions,
    add_flag,
    add_option,
    address_or_off,
    export_interval_s,
    non_negative_float,
    option_variables,
    parse_bool,
    port_number,
    positive_float,
    positive_int,
)
from otel_ofu_collector.prefixes import COLLECTOR_PREFIX, DEMO_PREFIX, REPORT_PREFIX, TOP_PREFIX

# The options run, snapshot and top share on purpose: one node's source settings serve all three.
SHARED_SOURCE_OPTIONS = frozenset(
    {"--source", "--url", "--file", "--host", "--seed", "--calibration", "--clock-sample-hz", "--nvml-library",
     "--dcgm-address", "--model", "--max-sm-clock"}
)  # fmt: skip
COMMAND_PREFIXES = {
    "collector": COLLECTOR_PREFIX,
    "demo": DEMO_PREFIX,
    "doctor": DOCTOR_PREFIX,
    "mfu-from-log": MFU_PREFIX,
    "report": REPORT_PREFIX,
    "snapshot": SNAPSHOT_PREFIX,
    "top": TOP_PREFIX,
}
SOURCE_COMMANDS = frozenset({"run", "snapshot", "doctor", "top"})


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("OTEL_"):
            monkeypatch.delenv(key)


def subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = cli.build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


# --- validators -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("validate", "good", "bad"),
    [
        (positive_float, {"0.5": 0.5, "10": 10.0}, ["0", "-1", "nan", "inf", "abc", ""]),
        (non_negative_float, {"0": 0.0, "2.5": 2.5}, ["-0.1", "nan", "inf", "x"]),
        (positive_int, {"1": 1, "64": 64}, ["0", "-3", "1.5", "many"]),
        (port_number, {"0": 0, "9464": 9464, "65535": 65535}, ["-1", "65536", "http"]),
        (parse_bool, {"1": True, "TRUE": True, " yes ": True, "on": True, "0": False, "off": False}, ["maybe", ""]),
    ],
)
def test_validators_accept_and_refuse(validate: object, good: dict[str, object], bad: list[str]) -> None:
    assert callable(validate)
    for text, value in good.items():
        assert validate(text) == value
    for text in bad:
        with pytest.raises(argparse.ArgumentTypeError):
            validate(text)


def test_export_interval_reads_milliseconds_and_ignores_bad_values(caplog: pytest.LogCaptureFixture) -> None:
    assert export_interval_s({}) == 10.0
    assert export_interval_s({"OTEL_METRIC_EXPORT_INTERVAL": "2500"}) == 2.5
    assert export_interval_s({"OTEL_METRIC_EXPORT_INTERVAL": "0"}, default=3.0) == 3.0
    assert export_interval_s({"OTEL_METRIC_EXPORT_INTERVAL": "soon"}) == 10.0
    assert caplog.text.count("ignoring OTEL_METRIC_EXPORT_INTERVAL") == 2


# --- values from variables --------------------------------------------------------------------------------


def small_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tool")
    options = CommandOptions(parser, "TOOL_")
    options.option("--size", type=positive_int, default=3, help="how many")
    options.option("--colour", choices=("red", "blue"), default="red", help="which")
    options.flag("--loud", help="say more")
    add_option(parser, "--name", env="TOOL_WHO", required=True, help="who")
    add_flag(parser, "--fast", prefix="TOOL_", default=True, help="hurry")
    return parser


def test_variables_set_defaults_and_the_command_line_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOOL_SIZE", "7")
    monkeypatch.setenv("TOOL_COLOUR", "blue")
    monkeypatch.setenv("TOOL_LOUD", "yes")
    monkeypatch.setenv("TOOL_WHO", "env")  # satisfies the required --name
    args = small_parser().parse_args([])
    assert (args.size, args.colour, args.loud, args.name, args.fast) == (7, "blue", True, "env", True)
    args = small_parser().parse_args(["--size", "2", "--colour", "red", "--no-loud", "--no-fast", "--name", "cli"])
    assert (args.size, args.colour, args.loud, args.name, args.fast) == (2, "red", False, "cli", False)


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("TOOL_SIZE", "0", "argument --size: must be at least 1, got '0' (from TOOL_SIZE)"),
        ("TOOL_SIZE", "lots", "argument --size: not a whole number: 'lots' (from TOOL_SIZE)"),
        (
            "TOOL_COLOUR",
            "green",
            "argument --colour: invalid choice: 'green' (from TOOL_COLOUR) (choose from red, blue)",
        ),
        ("TOOL_LOUD", "maybe", "argument --loud/--no-loud: expected true or false"),
    ],
)
def test_a_bad_variable_is_a_one_line_usage_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], variable: str, value: str, message: str
) -> None:
    monkeypatch.setenv("TOOL_WHO", "someone")
    monkeypatch.setenv(variable, value)
    parser = small_parser()  # building the parser never converts
    with pytest.raises(SystemExit) as exited:
        parser.parse_args([])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: tool")
    (error,) = [line for line in err.splitlines() if "error:" in line]
    assert message in error


def test_a_bad_variable_given_on_the_command_line_too_is_never_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOOL_SIZE", "lots")
    assert small_parser().parse_args(["--size", "4", "--name", "n"]).size == 4


def test_choices_are_checked_on_the_command_line_as_before(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        small_parser().parse_args(["--colour", "green", "--name", "n"])
    assert "invalid choice: 'green'" in capsys.readouterr().err


# --- the real commands ------------------------------------------------------------------------------------


def test_a_bad_variable_breaks_only_its_own_command(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("OTEL_OFU_COLLECTOR_WINDOW", "abc")
    monkeypatch.setenv("OTEL_OFU_SNAPSHOT_FORMAT", "xml")
    for command in ("run", "collector", "snapshot", "demo", "report", "mfu-from-log", "top"):
        with pytest.raises(SystemExit) as exited:
            cli.main([command, "--help"])
        assert exited.value.code == 0, command
    capsys.readouterr()
    cli.build_parser().parse_args(["demo", "--duration", "60"])  # another command parses fine
    with pytest.raises(SystemExit) as exited:
        cli.main(["collector"])
    assert exited.value.code == 2
    assert "argument --window: not a number: 'abc' (from OTEL_OFU_COLLECTOR_WINDOW)" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        cli.main(["snapshot", "--source", "sim"])
    assert exited.value.code == 2
    assert "invalid choice: 'xml' (from OTEL_OFU_SNAPSHOT_FORMAT)" in capsys.readouterr().err


def test_every_option_of_every_command_names_its_variable_in_help() -> None:
    for command, parser in subcommands().items():
        variables = option_variables(parser)
        flags = {
            next(flag for flag in action.option_strings if flag.startswith("--"))
            for action in parser._actions
            # Hidden options (deprecated spellings) are not documented, so they name no variable either.
            if action.option_strings and action.dest != "help" and action.help != argparse.SUPPRESS
        }
        assert flags, command
        assert set(variables) == flags, (command, flags - set(variables))
        help_text = " ".join(parser.format_help().split())
        for variable in variables.values():
            assert f"env {variable}" in help_text, (command, variable)


def test_each_command_has_its_own_variables() -> None:
    users: dict[str, set[tuple[str, str]]] = {}
    for command, parser in subcommands().items():
        for flag, variable in option_variables(parser).items():
            if flag == "--log-level":  # the one global option, also accepted after every command
                assert variable == f"{PREFIX}LOG_LEVEL", command
                continue
            users.setdefault(variable, set()).add((command, flag))
            shared = command in SOURCE_COMMANDS and flag in SHARED_SOURCE_OPTIONS
            expected = PREFIX if command == "run" or shared else COMMAND_PREFIXES[command]
            assert variable.startswith(expected), (command, flag, variable)
    for variable, where in users.items():
        if len(where) > 1:
            commands = {command for command, _ in where}
            flags = {flag for _, flag in where}
            assert commands <= SOURCE_COMMANDS, (variable, where)
            assert len(flags) == 1, (variable, where)
            assert flags <= SHARED_SOURCE_OPTIONS, (variable, where)
    assert users[f"{PREFIX}SOURCE"] == {
        ("run", "--source"),
        ("snapshot", "--source"),
        ("doctor", "--source"),
        ("top", "--source"),
    }


def test_shared_options_read_the_same_in_both_commands_help() -> None:
    commands = subcommands()

    def metavars(command: str) -> dict[str, object]:
        return {
            flag: action.metavar
            for action in commands[command]._actions
            for flag in action.option_strings
            if flag in SHARED_SOURCE_OPTIONS
        }

    assert metavars("run") == metavars("snapshot") == metavars("top")
    assert set(metavars("run")) == SHARED_SOURCE_OPTIONS


def test_help_is_plain_text() -> None:
    for command, parser in subcommands().items():
        text = parser.format_help()
        assert "``" not in text, command  # reStructuredText belongs in docstrings, not in --help
        assert "option_strings" not in text, command  # a bare % in a help string breaks its formatting


@pytest.mark.parametrize(("text", "expected"), [("0.0.0.0:4317", "0.0.0.0:4317"), ("off", None), (" None ", None),
                                                ("OFF", None), ("", None), ("[::1]:4317", "[::1]:4317")])  # fmt: skip
def test_a_listen_address_or_off(text: str, expected: str | None) -> None:
    assert address_or_off(text) == expected


def test_a_variable_turns_the_collector_listeners_off(monkeypatch: pytest.MonkeyPatch) -> None:
    from otel_ofu_collector import command

    def parse(*argv: str) -> argparse.Namespace:
        return cli.build_parser().parse_args(["collector", *argv])  # built now: defaults read the variables

    assert parse().listen == "0.0.0.0:4317"
    assert parse("--listen", "none").listen is None
    monkeypatch.setenv("OTEL_OFU_COLLECTOR_LISTEN", "")  # empty reads as unset: the default stays
    assert parse().listen == "0.0.0.0:4317"
    monkeypatch.setenv("OTEL_OFU_COLLECTOR_LISTEN", "off")
    monkeypatch.setenv("OTEL_OFU_COLLECTOR_HTTP_LISTEN", "127.0.0.1:0")
    built = command.options_from_args(parse())
    assert (built.grpc_listen, built.http_listen) == (None, "127.0.0.1:0")
    assert parse("--listen", "127.0.0.1:0").listen == "127.0.0.1:0"  # the command line wins
    monkeypatch.setenv("OTEL_OFU_COLLECTOR_HTTP_LISTEN", "Off")
    assert parse().http_listen is None


def test_the_global_log_level_is_checked(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.build_parser().parse_args(["--log-level", "debug", "demo"]).log_level == "DEBUG"
    monkeypatch.setenv("OTEL_OFU_LOG_LEVEL", "chatty")
    with pytest.raises(SystemExit) as exited:
        cli.build_parser().parse_args(["demo"])
    assert exited.value.code == 2
    assert "(from OTEL_OFU_LOG_LEVEL)" in capsys.readouterr().err


def test_building_the_parser_does_not_load_plotly() -> None:
    # Every `otel-ofu run` builds the whole parser; only `report` (and `demo --html`) draw.
    code = "import sys, otel_ofu.cli; otel_ofu.cli.build_parser(); print('plotly' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "False"
