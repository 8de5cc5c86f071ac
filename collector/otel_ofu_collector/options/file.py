"""``otel-ofu collector --config FILE``: the options in a YAML file, under the flags and their variables.

The file holds the options by section, each by its name (``windows: {window: 30}`` is ``--window 30``); the
reference lists every key. A flag wins over its variable, a variable over the file, the file over the default:
the file's values become the options' defaults while the command line is parsed (an option whose variable is set
keeps the variable's), as the text its flag would take, so argparse's own order does the rest and a bad value is
the usage error the same flag gets, naming the file and the key. An empty value is no value (the default holds);
a YAML true or false reads as on or off, which is what a switch takes and what turns a listener off
(``listen: off``). A key that is no option is refused, naming the closest one.

``--print-config`` prints the options' values as such a file (a secret redacted): what a run would use.
"""

from __future__ import annotations

import argparse
import copy
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import yaml

from otel_ofu.cli_support import closest, default_source, read_from
from otel_ofu_collector.options.declared import OPTIONS, SECTIONS, in_section
from otel_ofu_collector.options.option import Option, as_text

REDACTED: Final = "[REDACTED]"  # as the OpenTelemetry Collector's print-config shows a secret

_BY_KEY: Final = {option.key: option for option in OPTIONS}
_SECTIONS: Final = {section.key: section for section in SECTIONS}


def read(path: str) -> dict[Option[Any], str]:
    """The options the file at ``path`` sets, each as the text its flag would take; ValueError, in one line, for
    a file that cannot be read, is not YAML sections of options, or holds a key that is no option."""
    try:
        document = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as error:
        raise ValueError(f"cannot read {path}: {error.strerror or error}") from None
    except UnicodeDecodeError:
        raise ValueError(f"cannot read {path}: not UTF-8 text") from None
    except yaml.YAMLError as error:
        raise ValueError(f"{path}: not YAML: {_problem(error)}") from None
    if document is None:
        return {}
    if not isinstance(document, Mapping):
        raise ValueError(f"{path}: expected sections of options ({', '.join(_SECTIONS)}), got {_kind(document)}")
    found: dict[Option[Any], str] = {}
    for section_key, entries in document.items():
        if str(section_key) not in _SECTIONS:
            raise ValueError(f"{path}: unknown key {section_key}{_did_you_mean(str(section_key))}")
        if entries is None:
            continue
        if not isinstance(entries, Mapping):
            raise ValueError(f"{path}: {section_key} must be a mapping of its options, got {_kind(entries)}")
        for name, value in entries.items():
            key = f"{section_key}.{name}"
            option = _BY_KEY.get(key)
            if option is None:
                raise ValueError(f"{path}: unknown key {key}{_did_you_mean(key)}")
            text = as_text(value)
            if text is not None:
                found[option] = text
    return found


def _did_you_mean(key: str) -> str:
    """`` (did you mean KEY?)`` for the option or section ``key`` most likely means, else nothing."""
    name = key.rpartition(".")[2]
    elsewhere = [option.key for option in OPTIONS if option.name == name]  # the right name in the wrong place
    guess = elsewhere[0] if elsewhere else closest(key, [*_BY_KEY, *_SECTIONS])
    return "" if guess is None else f" (did you mean {guess}?)"


def _problem(error: yaml.YAMLError) -> str:
    mark = getattr(error, "problem_mark", None)
    problem = getattr(error, "problem", None) or str(error).splitlines()[0]
    return f"{problem} (line {mark.line + 1})" if mark is not None else str(problem)


def _kind(value: object) -> str:
    if isinstance(value, list):
        return "a list"
    return "a text" if isinstance(value, str) else type(value).__name__


def read_before_parsing(parser: argparse.ArgumentParser, config_dest: str = "config") -> None:
    """Make ``parser`` take the values of its ``--config`` file as defaults while it parses (the module's doc).

    The command line is parsed once to learn the file (given, abbreviated or from its variable, as argparse reads
    it), then again over the file's values; an unreadable file or a key that is no option is a usage error."""
    parse = parser.parse_known_args
    actions = {action.dest: action for action in parser._actions}

    def parse_known_args(
        args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        first, _ = parse(args, copy.copy(namespace))
        path = getattr(first, config_dest, None)
        if not path:
            return parse(args, namespace)
        try:
            values = read(str(path))
        except ValueError as error:
            parser.error(str(error))
        declared = {action: action.default for action in actions.values()}
        for option, text in values.items():
            action = actions[option.name]
            if default_source(action) is None:  # a variable that is set wins over the file
                action.default = read_from(text, f"{path}: {option.key}")
        try:
            return parse(args, namespace)
        finally:
            for action, default in declared.items():
                action.default = default

    parser.parse_known_args = parse_known_args  # type: ignore[method-assign,assignment]


def effective(values: Mapping[str, Any]) -> str:
    """``values`` (by option name: a parsed command line's) as a configuration file, every option in it."""
    document = {
        section.key: {option.name: _as_yaml(option, values[option.name]) for option in in_section(section)}
        for section in SECTIONS
    }
    head = "# otel-ofu collector's configuration: flags over their variables, over a --config file, over defaults\n"
    return head + yaml.safe_dump(document, sort_keys=False, default_flow_style=False, allow_unicode=True)


def _as_yaml(option: Option[Any], value: Any) -> Any:
    if option.secret and value is not None:
        return REDACTED
    if value is None and option.default is not None:
        return "off"  # a listener turned off: an empty value would read back as its default
    if isinstance(value, tuple):
        return list(value)
    if not isinstance(value, str | int | float | list | dict | None):
        return as_text(value)  # a parsed table (a calibration): written as its flag takes it
    return value
