"""The ``otel-ofu`` command: one parser, one module per subcommand.

Subcommands of this package live in ``otel_ofu.commands``; the collector package adds its own
(``collector``, ``demo``) through the ``otel_ofu.commands`` entry-point group, so this package never
imports the collector.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import pkgutil
import sys
from collections.abc import Sequence
from importlib.metadata import entry_points
from typing import NoReturn

import otel_ofu
import otel_ofu.commands
from otel_ofu.cli_support import (
    Register,
    add_option,
    env_name,
    long_options,
    unrecognized_message,
    with_choice_suggestion,
)

ENTRY_POINT_GROUP = "otel_ofu.commands"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def _registrars() -> list[Register]:
    registrars: list[Register] = []
    # Every module of otel_ofu.commands has ``register(subparsers)``.
    for info in sorted(pkgutil.iter_modules(otel_ofu.commands.__path__), key=lambda info: info.name):
        module = importlib.import_module(f"otel_ofu.commands.{info.name}")
        registrars.append(module.register)
    for entry_point in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda ep: ep.name):
        registrars.append(entry_point.load())
    return registrars


class Parser(argparse.ArgumentParser):
    """A parser whose usage errors are one line (exit 2) that points at ``--help``, not the whole usage block:
    the collector's usage alone is thirty lines, and the error is what the user has to read. A mistyped
    choice gets the closest one suggested."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {with_choice_suggestion(message)} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="otel-ofu",
        description="Overall FLOP Utilization (OFU) for GPU fleets, as OpenTelemetry metrics.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {otel_ofu.__version__}")
    add_option(parser, "--log-level", default="INFO", type=str.upper, choices=LOG_LEVELS, help="logging level")
    # Every command's parser is a Parser too (one-line errors); typed as the plain kind the registrars take.
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser] = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=Parser
    )
    for register in _registrars():
        register(subparsers)
    for command in subparsers.choices.values():
        # Also after the command (otel-ofu run --log-level debug); given there it wins, else the top's stays.
        command.add_argument(
            "--log-level",
            type=str.upper,
            choices=LOG_LEVELS,
            default=argparse.SUPPRESS,
            help=f"logging level (env {env_name('--log-level')}; default INFO)",
        )
    return parser


def parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None = None) -> argparse.Namespace:
    """``parser.parse_args``, except that an unknown option is the chosen command's usage error and names
    the closest option it has (``--windw``: did you mean ``--window``?)."""
    args, extras = parser.parse_known_args(argv)
    if extras:
        command = _command_parser(parser, getattr(args, "command", None)) or parser
        command.error(unrecognized_message(extras, long_options(command, parser)))
    return args


def _command_parser(parser: argparse.ArgumentParser, command: str | None) -> argparse.ArgumentParser | None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and command in action.choices:
            chosen: argparse.ArgumentParser = action.choices[command]
            return chosen
    return None


def main(argv: Sequence[str] | None = None) -> int:
    # grpc logs a failed TLS handshake itself, on stderr, once per attempt ("I... ssl_transport_security.cc"),
    # beside the commands' own one line on what is wrong. It reads this when imported: before the commands are.
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    parser = build_parser()
    args = parse(parser, argv)
    logging.basicConfig(
        level=args.log_level,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    handler = args.handler
    try:
        result: int = handler(args)
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader went away (otel-ofu snapshot | head): stop quietly, as the Python docs advise, and
        # point stdout at /dev/null so the interpreter's own flush at exit does not complain either.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    return result


if __name__ == "__main__":
    from otel_ofu.entry import main as entry_main  # Ctrl-C as one line, as the console script does

    sys.exit(entry_main())
