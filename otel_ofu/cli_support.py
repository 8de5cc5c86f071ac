"""Helpers every subcommand uses: options that also read an environment variable, and their validators.

A variable's value becomes the option's default *string*. argparse converts string defaults while it parses,
and only for the subcommand being run, so a bad value is that command's ordinary one-line usage error (exit 2)
instead of a traceback while the parser is built, and ``--help`` or another command never sees it. The
conversion also checks ``choices``, which argparse by itself checks for the command line only.

Variables are ``OTEL_OFU_<FLAG>`` for ``run`` (and the source options ``snapshot`` shares with it);
every other command has its own prefix, so one command's setting never changes another's.
"""

from __future__ import annotations

import argparse
import difflib
import logging
import math
import os
import re
import sys
import urllib.parse
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import attrs
from opentelemetry.sdk.environment_variables import OTEL_METRIC_EXPORT_INTERVAL

log = logging.getLogger(__name__)

# ``register(subparsers)`` adds one subcommand whose parser sets ``handler=fn(args) -> exit code``.
Register = Callable[["argparse._SubParsersAction[argparse.ArgumentParser]"], None]
# An ArgumentParser or one of its argument groups: both take add_argument.
Container = argparse._ActionsContainer

PREFIX: Final = "OTEL_OFU_"
MFU_PREFIX: Final = "OTEL_OFU_MFU_"
SNAPSHOT_PREFIX: Final = "OTEL_OFU_SNAPSHOT_"
DOCTOR_PREFIX: Final = "OTEL_OFU_DOCTOR_"

DEFAULT_EXPORT_INTERVAL_S: Final = 10.0
_TRUE: Final = frozenset({"1", "true", "yes", "on"})
_FALSE: Final = frozenset({"0", "false", "no", "off"})
# An empty variable reads as unset, so a listener is turned off by a word instead.
OFF_WORDS: Final = frozenset({"off", "none"})
_VARIABLE_IN_HELP: Final = re.compile(r"\(env ([A-Z0-9_]+)")


def env_name(flag: str, prefix: str = PREFIX) -> str:
    """``--export-endpoint`` -> ``OTEL_OFU_EXPORT_ENDPOINT`` (or ``<prefix>EXPORT_ENDPOINT``)."""
    return prefix + flag.lstrip("-").replace("-", "_").upper()


# --- validators: argparse ``type=`` functions ------------------------------------------------------------


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None


def positive_float(text: str) -> float:
    value = _float(text)
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}")
    return value


def non_negative_float(text: str) -> float:
    value = _float(text)
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"must be zero or more, got {text!r}")
    return value


def positive_int(text: str) -> int:
    value = _int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text!r}")
    return value


def _is_off(text: str) -> bool:
    word = text.strip()
    return not word or word.lower() in OFF_WORDS


def _port(text: str, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{what} must be a port number 0-65535, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{what} must be a port number 0-65535, got {text!r}")
    return value


def port_number(text: str) -> int | None:
    """A listener's TCP port (0 asks the system for a free one), or None for ``off``/``none``: no listener."""
    if _is_off(text):
        return None
    return _port(text.strip(), "the port")


def host_port(text: str) -> str:
    """``HOST:PORT`` (``[::1]:4317`` for IPv6; an empty host is every address), as given, once it is valid."""
    address = text.strip()
    host, colon, port = address.rpartition(":")
    if not colon or not port:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    if host.startswith("[") != host.endswith("]") or (":" in host and not host.startswith("[")):
        raise argparse.ArgumentTypeError(f"expected HOST:PORT (an IPv6 host in brackets, [::1]:4317), got {text!r}")
    if any(char.isspace() or char in "/?#@" for char in host):
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    _port(port, f"the port of {address!r}")
    return address


def address_or_off(text: str) -> str | None:
    """A listen address (HOST:PORT, checked), or None for ``off``, ``none`` (any case) or nothing: turned off."""
    return None if _is_off(text) else host_port(text)


def url(text: str) -> str:
    """An http(s) URL with a host (and a valid port, if it has one), as given."""
    address = text.strip()
    parts = urllib.parse.urlsplit(address)
    if parts.scheme not in ("http", "https") or not parts.hostname or any(char.isspace() for char in address):
        raise argparse.ArgumentTypeError(f"expected an http:// or https:// URL, got {text!r}")
    try:
        parts.port  # noqa: B018 - urllib checks the port only when asked for it
    except ValueError:
        raise argparse.ArgumentTypeError(f"the port of {text!r} must be a number 0-65535") from None
    return address


def url_or_host_port(text: str) -> str:
    """An http(s) URL, or ``HOST:PORT`` where the scheme is implied (a gRPC endpoint, a scrape target)."""
    if "://" in text:
        return url(text)
    try:
        return host_port(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected a URL (http://HOST:PORT/...) or HOST:PORT, got {text!r}") from None


def output_path(text: str) -> str:
    """A file to write: its folder must exist (checked now, so a typo fails before any work is done)."""
    path = Path(text).expanduser()
    parent = path.parent
    if not parent.is_dir():
        raise argparse.ArgumentTypeError(f"cannot write {text!r}: the folder {str(parent)!r} does not exist")
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"cannot write {text!r}: it is a folder")
    if not os.access(parent, os.W_OK):
        raise argparse.ArgumentTypeError(f"cannot write {text!r}: the folder {str(parent)!r} is not writable")
    return text


def parse_bool(text: str) -> bool:
    word = text.strip().lower()
    if word in _TRUE:
        return True
    if word in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"expected true or false (1/0, yes/no, on/off), got {text!r}")


def export_interval_s(environ: Mapping[str, str] | None = None, default: float = DEFAULT_EXPORT_INTERVAL_S) -> float:
    """``OTEL_METRIC_EXPORT_INTERVAL`` (milliseconds, as the SDK reads it) in seconds, else ``default``.

    A value that is not a positive number is ignored with a warning, as the SDK does.
    """
    raw = (environ if environ is not None else os.environ).get(OTEL_METRIC_EXPORT_INTERVAL, "").strip()
    if not raw:
        return default
    try:
        value = float(raw) / 1000.0
    except ValueError:
        log.warning("ignoring %s=%r: not a number of milliseconds", OTEL_METRIC_EXPORT_INTERVAL, raw)
        return default
    if not value > 0:
        log.warning("ignoring %s=%r: not positive", OTEL_METRIC_EXPORT_INTERVAL, raw)
        return default
    return value


# --- options with variables -----------------------------------------------------------------------------


class _FromEnv(str):
    """A default string read from ``variable`` (or a configuration file's key), so a conversion error can say
    where the value came from."""

    variable: str

    def __new__(cls, value: str, variable: str) -> _FromEnv:
        self = super().__new__(cls, value)
        self.variable = variable
        return self


def read_from(text: str, source: str) -> str:
    """``text`` as an option's default read from ``source`` (a configuration file and key): argparse converts it
    only when the option is not given, and a bad value's usage error names ``source`` as it names a variable."""
    return _FromEnv(text, source)


def default_source(action: argparse.Action) -> str | None:
    """Where the default of an option added here was read from (its variable), or None for its declared one."""
    default = action.default
    return default.variable if isinstance(default, _FromEnv) else None


def _converter(
    convert: Callable[[str], Any], choices: Collection[Any] | None, renamed: tuple[str, str, str] | None = None
) -> Callable[[str], Any]:
    """``convert`` that also checks ``choices`` and names the variable when the text came from one.

    ``renamed`` is (command, old variable, new variable): a value read from the old one says it is deprecated
    (argparse converts a default only when its option was not given, so the line shows only when it counts)."""
    name = getattr(convert, "__name__", "value")

    def checked(text: str) -> Any:
        origin = f" (from {text.variable})" if isinstance(text, _FromEnv) else ""
        if renamed is not None and isinstance(text, _FromEnv) and text.variable == renamed[1]:
            print(f"{renamed[0]}: {renamed[1]} is deprecated, use {renamed[2]}", file=sys.stderr)
        try:
            value = convert(str(text))
        except argparse.ArgumentTypeError as error:
            raise argparse.ArgumentTypeError(f"{error}{origin}") from None
        except (TypeError, ValueError):
            raise argparse.ArgumentTypeError(f"invalid {name} value: {str(text)!r}{origin}") from None
        if choices is not None and value not in choices:
            allowed = ", ".join(str(choice) for choice in choices)
            raise argparse.ArgumentTypeError(f"invalid choice: {str(text)!r}{origin} (choose from {allowed})")
        return value

    checked.__name__ = name
    return checked


def add_option(
    parser: Container,
    flag: str,
    *,
    help: str,
    default: Any = None,
    env: str | None = None,
    prefix: str = PREFIX,
    type: Callable[[str], Any] = str,
    choices: Sequence[Any] | None = None,
    required: bool = False,
    old_env: str | None = None,
    **kwargs: Any,
) -> None:
    """Add ``flag`` whose default comes from ``env`` (``<prefix><FLAG>`` unless given), then ``default``.

    The help text names the variable and the default, so ``--help`` documents both. A required option is
    satisfied by its variable. ``old_env`` is the variable's former name: still read when the new one is
    unset, with a deprecation line when its value is used.
    """
    variable = env or env_name(flag, prefix)
    raw, source = os.environ.get(variable, ""), variable
    if not raw and old_env:
        raw, source = os.environ.get(old_env, ""), old_env
    shown = "" if default is None else f"; default {default}"
    renamed = (getattr(parser, "prog", "otel-ofu"), old_env, variable) if old_env else None
    parser.add_argument(
        flag,
        default=_FromEnv(raw, source) if raw else default,
        type=_converter(type, choices, renamed),
        choices=choices,
        required=required and not raw,
        help=f"{help} (env {variable}{shown})",
        **kwargs,
    )


class _EnvFlag(argparse.BooleanOptionalAction):
    """``--flag``/``--no-flag`` whose default may be a variable's text, converted like any other default."""

    def __init__(self, option_strings: Sequence[str], dest: str, default: Any = False, help: str | None = None):
        # The default is set afterwards: Python 3.11 would otherwise print it into the help as well.
        super().__init__(option_strings, dest, default=None, help=help)
        self.default = default
        # argparse converts a string default with ``type``; the switches themselves take no value.
        self.type = _converter(parse_bool, None)


def add_flag(
    parser: Container,
    flag: str,
    *,
    help: str,
    default: bool = False,
    env: str | None = None,
    prefix: str = PREFIX,
) -> None:
    """``--flag`` and ``--no-flag``; the variable (true/false, 1/0, yes/no, on/off) sets the default."""
    variable = env or env_name(flag, prefix)
    raw = os.environ.get(variable, "")
    shown = "; default on" if default else ""
    parser.add_argument(
        flag,
        action=_EnvFlag,
        default=_FromEnv(raw, variable) if raw else default,
        help=f"{help} (env {variable}{shown})",
    )


@attrs.frozen
class CommandOptions:
    """``add_option``/``add_flag`` for one command, every variable named ``prefix`` + the flag."""

    parser: Container
    prefix: str = PREFIX

    def option(self, flag: str, *, help: str, **kwargs: Any) -> None:
        add_option(self.parser, flag, help=help, prefix=self.prefix, **kwargs)

    def flag(self, flag: str, *, help: str, **kwargs: Any) -> None:
        add_flag(self.parser, flag, help=help, prefix=self.prefix, **kwargs)

    def group(self, title: str) -> CommandOptions:
        return CommandOptions(self.parser.add_argument_group(title), self.prefix)


class _Deprecated(argparse.Action):
    """An old spelling of an option: still works, says its new name on stderr, hidden from ``--help``."""

    def __init__(self, option_strings: Sequence[str], dest: str, new: str = "", **kwargs: Any) -> None:
        super().__init__(option_strings, dest, default=argparse.SUPPRESS, help=argparse.SUPPRESS, **kwargs)
        self.new = new

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option: Any = None
    ) -> None:
        print(f"{parser.prog}: {option} is deprecated, use {self.new}", file=sys.stderr)
        setattr(namespace, self.dest, values)


def add_deprecated_alias(parser: Container, old: str, new: str, *, dest: str, **kwargs: Any) -> None:
    """``old`` sets ``dest`` like ``new`` does (pass the same ``type``), with a deprecation line."""
    parser.add_argument(old, dest=dest, action=_Deprecated, new=new, **kwargs)


# --- suggestions for a mistyped option or choice (argparse in Python 3.11 makes none) -------------------

_INVALID_CHOICE: Final = re.compile(
    r"invalid choice: '(?P<given>[^']*)'(?: \(from [^)]+\))? \(choose from (?P<choices>.*)\)$"
)


def closest(word: str, candidates: Collection[str]) -> str | None:
    """The candidate ``word`` was most likely meant to be (difflib's ratio of at least 0.6), else None."""
    found = difflib.get_close_matches(word, sorted(candidates), n=1)
    return found[0] if found else None


def long_options(*parsers: argparse.ArgumentParser) -> set[str]:
    """Every ``--option`` these parsers take (hidden ones too: an old spelling is still a right one)."""
    flags = (flag for parser in parsers for action in parser._actions for flag in action.option_strings)
    return {flag for flag in flags if flag.startswith("--")}


def unrecognized_message(extras: Sequence[str], options: Collection[str]) -> str:
    """argparse's "unrecognized arguments" line, with the closest option for each mistyped one."""
    guesses = []
    for extra in extras:
        given = extra.split("=", 1)[0]
        if given.startswith("--") and (guess := closest(given, options)) is not None:
            guesses.append(f"{given}: did you mean {guess}?")
    message = f"unrecognized arguments: {' '.join(extras)}"
    return f"{message} ({'; '.join(guesses)})" if guesses else message


def with_choice_suggestion(message: str) -> str:
    """An "invalid choice" message with the closest choice added; any other message as it is."""
    match = _INVALID_CHOICE.search(message)
    if match is None:
        return message
    choices = [choice.strip().strip("'") for choice in match.group("choices").split(",")]
    guess = closest(match.group("given"), choices)
    return message if guess is None else f"{message}: did you mean {guess}?"


def option_variables(parser: argparse.ArgumentParser) -> dict[str, str]:
    """Each option's first long flag -> the variable its help names (options without one are left out)."""
    variables: dict[str, str] = {}
    for action in parser._actions:
        flags = [flag for flag in action.option_strings if flag.startswith("--")]
        match = _VARIABLE_IN_HELP.search(action.help or "")
        if flags and match:
            variables[flags[0]] = match.group(1)
    return variables
