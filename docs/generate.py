"""The metric and attribute reference, docs/reference.md, generated from the vocabulary ``otel_ofu.names``
(and its table of ``otel-ofu collector`` options, from their declarations in ``otel_ofu_collector.options``).

The generator reads the vocabulary module itself, in the order it is written: every ``MetricSpec``, every
attribute key, every value set and every hardware id declared there lands in the reference under the
``# --- Section ---`` comment it was declared beneath, with the comment on its line as its note. A name
added to the vocabulary therefore shows up here without touching this file, and the test that compares
the output with the committed copy fails until it is regenerated:

    python docs/generate.py          # rewrite docs/reference.md
    python docs/generate.py --check  # exit 1 if it is stale
"""

from __future__ import annotations

import ast
import inspect
import io
import re
import sys
import textwrap
import tokenize
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import attrs

from otel_ofu import names, ports
from otel_ofu.cli_support import env_name
from otel_ofu.generated_files import write_or_check
from otel_ofu_collector.options import SECTIONS, Option, in_section
from otel_ofu_collector.prefixes import COLLECTOR_PREFIX

HERE = Path(__file__).resolve().parent
REFERENCE = HERE / "reference.md"

_SECTION = re.compile(r"^# -{3,}\s*(?P<title>.*?)\s*-*$")
# An attribute key: a dotted lower-case name (``hw.id``), or one of the vocabulary's bare keys.
_ATTRIBUTE = re.compile(r"[a-z][a-z0-9_]*(\.[a-z0-9_]+)+")
_BARE_ATTRIBUTES = {names.QUANTILE, names.ERROR_REASON}


@attrs.frozen
class Entry:
    """One module-level name of the vocabulary: where it sits, its value and the comment beside it."""

    section: str
    group: str  # the comment heading the run of lines this name belongs to, if any
    name: str
    value: object
    note: str  # the comment on its own line(s)


def _comments(source: str) -> dict[int, str]:
    """Line number -> the comment on that line (without the ``#``)."""
    found: dict[int, str] = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            found[token.start[0]] = token.string.lstrip("#").strip()
    return found


def _block_comment(lines: list[str], lineno: int) -> str:
    """The comment lines directly above line ``lineno`` (1-based), unless they are a section header."""
    block: list[str] = []
    index = lineno - 2
    while index >= 0 and lines[index].startswith("#") and not _SECTION.match(lines[index]):
        block.insert(0, lines[index].lstrip("#").strip())
        index -= 1
    return " ".join(block)


def entries(module: ModuleType) -> Iterator[Entry]:
    """Every module-level assignment and class of ``module``, in source order, with its section and note."""
    source = inspect.getsource(module)
    lines = source.splitlines()
    comments = _comments(source)
    headers = sorted((number, m["title"]) for number, line in enumerate(lines, 1) if (m := _SECTION.match(line)))
    group, previous_end, previous_section = "", -1, ""
    for node in ast.parse(source).body:
        name = node.name if isinstance(node, ast.ClassDef) else _target(node)
        if name is None or not hasattr(module, name):
            continue
        section = next((title for number, title in reversed(headers) if number < node.lineno), "General")
        end = node.end_lineno or node.lineno
        # The comment at the end of its first or last line (a class's inner comments are its members').
        at_ends = dict.fromkeys(comments[n] for n in (node.lineno, end) if n in comments)
        note = "" if isinstance(node, ast.ClassDef) else " ".join(at_ends)
        # A comment above a name heads the run of lines that follows it, up to the next blank line.
        above = _block_comment(lines, node.lineno)
        if above:
            group = above
        elif node.lineno != previous_end + 1 or section != previous_section:
            group = ""
        previous_end, previous_section = end, section
        yield Entry(section, group, name, getattr(module, name), note)


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _code(value: object) -> str:
    return f"`{value}`"


def _table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(_cell(cell) for cell in row) + " |" for row in rows]
    return [*out, ""]


def _is_attribute(entry: Entry) -> bool:
    return (
        entry.name.isupper()
        and isinstance(entry.value, str)
        and (bool(_ATTRIBUTE.fullmatch(entry.value)) or entry.value in _BARE_ATTRIBUTES)
    )


def _is_value_set(entry: Entry) -> bool:
    value = entry.value
    if inspect.isclass(value):
        return isinstance(getattr(value, "ALL", None), tuple)
    return isinstance(value, tuple) and bool(value) and all(isinstance(item, str | float) for item in value)


def _target(node: ast.stmt) -> str | None:
    """The name an assignment (plain or annotated, with a value) binds, or None."""
    if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
        return node.targets[0].id
    if isinstance(node, ast.AnnAssign) and node.value is not None and isinstance(node.target, ast.Name):
        return node.target.id
    return None


def _members(cls: type) -> list[tuple[str, object, str]]:
    """A vocabulary class's constants but ``ALL``: (name, value, comment on its line), in source order."""
    source = textwrap.dedent(inspect.getsource(cls))
    comments = _comments(source)
    body = ast.parse(source).body[0]
    assert isinstance(body, ast.ClassDef)
    members: list[tuple[str, object, str]] = []
    for node in body.body:
        name = _target(node)
        if name is not None and name != "ALL" and hasattr(cls, name):
            members.append((name, getattr(cls, name), comments.get(node.lineno, "")))
    return members


def section_intros(module: ModuleType) -> dict[str, str]:
    """Section title -> the comment paragraph right under its ``# --- Title ---`` line, if any."""
    lines = inspect.getsource(module).splitlines()
    intros: dict[str, str] = {}
    for index, line in enumerate(lines):
        if m := _SECTION.match(line):
            block = []
            for following in lines[index + 1 :]:
                if not following.startswith("#") or _SECTION.match(following):
                    break
                block.append(following.lstrip("#").strip())
            intros[m["title"]] = " ".join(block)
    return intros


def _grouped(rows: Sequence[tuple[Entry, Sequence[object]]], header: Sequence[str]) -> list[str]:
    """Tables of rows, a new one (headed by its comment) wherever the vocabulary starts a commented run."""
    out: list[str] = []
    runs: list[tuple[str, list[Sequence[object]]]] = []
    for entry, row in rows:
        if not runs or runs[-1][0] != entry.group:
            runs.append((entry.group, []))
        runs[-1][1].append(row)
    for group, run in runs:
        if group:
            out += [group, ""]
        out += _table(header, run)
    return out


def _sections(entries: list[Entry], intros: dict[str, str]) -> Iterator[tuple[str, list[str], list[Entry]]]:
    """(section title, its heading lines, its entries) in source order."""
    for section in dict.fromkeys(e.section for e in entries):
        heading = [f"### {section}", ""]
        if intros.get(section):
            heading += [intros[section], ""]
        yield section, heading, [e for e in entries if e.section == section]


def render(module: ModuleType = names) -> str:
    """The reference as Markdown."""
    everything = list(entries(module))
    intros = section_intros(module)
    spec_type = getattr(module, "MetricSpec", names.MetricSpec)
    metrics = [e for e in everything if isinstance(e.value, spec_type)]
    groups = [
        e
        for e in everything
        if isinstance(e.value, tuple) and e.value and all(isinstance(v, spec_type) for v in e.value)
    ]
    identity = set(getattr(module, "IDENTITY_ATTRIBUTES", ()))
    attributes = [e for e in everything if _is_attribute(e)]
    value_sets = [e for e in everything if _is_value_set(e) and e not in groups]
    shown = [*metrics, *groups, *attributes, *value_sets]
    # Everything else that is a plain constant: service names, hardware ids, sentinels, environment keys.
    stability: dict[str, str] = dict(getattr(module, "STABILITY", {}))
    constants = [
        e
        for e in everything
        if e not in shown
        and e.name.isupper()
        and not e.name.startswith("_")
        and e.name != "STABILITY"  # shown beside each metric
        and isinstance(e.value, str | int | float | tuple | dict)
    ]
    member_of: dict[str, list[str]] = {}
    for group in {e.name: e for e in groups}.values():  # a tuple built up in steps is one group, as it ends
        assert isinstance(group.value, tuple)
        for spec in group.value:
            member_of.setdefault(spec.name, []).append(group.name)

    path = module.__name__.replace(".", "/") + ".py"
    out = [
        "# Metric and attribute reference",
        "",
        f"<!-- Generated by docs/generate.py from {path}: do not edit by hand. -->",
        "",
        f"Every name below is declared once, in `{module.__name__}` (`{path}`); the producer, the collector,"
        " the dashboards and the tests import it from there. This page is generated from that module"
        " (`python docs/generate.py`), and a test fails when it is stale.",
        "",
        "Units follow the OpenTelemetry (UCUM) conventions: `1` is a ratio, annotations such as `{gpu}` count"
        " things. On the Prometheus endpoints dots become underscores (`gpu.ofu` -> `gpu_ofu`); the producer"
        " appends the unit (`gpu_clock_sm_hertz`), the collector's outputs keep their bare name, and counters"
        " end in `_total` (`otel_ofu/prometheus_names.py`).",
        "",
        "## Stability",
        "",
        "Each metric of the project's own has a stability level (the `stability` column below, from `STABILITY`):"
        " *stable* names are the product's contract, never renamed, their unit, kind and meaning kept;"
        " *development* names (the shards' partial state, the processes' self-metrics, the jobs' activity"
        " context) may change in a minor release, said in CHANGELOG.md. The attribute keys borrowed from the"
        " OpenTelemetry semantic conventions (`SEMCONV_ATTRIBUTES`: `hw.*`, `host.name`, `k8s.*`, `service.*`,"
        " `network.io.direction`) follow the conventions of the `SCHEMA_URL` every request carries, at the"
        " conventions' own stability; docs/design.md says how the contract's names relate to their `hw.*`"
        " metrics.",
        "",
        "## Metrics",
        "",
    ]
    for _, heading, section_metrics in _sections(metrics, intros):
        out += heading
        rows = []
        for e in section_metrics:
            assert isinstance(e.value, spec_type)
            meaning = e.value.description + (f" ({e.note})" if e.note else "")
            declared = ", ".join(_code(n) for n in (e.name, *member_of.get(e.value.name, ())))
            level = (stability.get(e.value.name, ""),) if stability else ()
            kind = e.value.kind.replace("_", " ")
            cells = (_code(e.value.name), kind, _code(e.value.unit), *level, meaning, declared)
            rows.append((e, cells))
        header = ("name", "kind", "unit", *(("stability",) if stability else ()), "meaning", "declared as")
        out += _grouped(rows, header)

    out += [
        "## Attributes",
        "",
        "*identity*: looked up by the collector on the data point first and the resource second, and copied"
        " onto every data point by `--placement datapoint|both` (for backends such as Datadog that drop"
        " resource attributes).",
        "",
    ]
    attribute_rows = [
        (_code(e.value), _code(e.name), "identity" if e.value in identity else "", e.note or e.group)
        for e in attributes
    ]
    out += _table(("key", "constant", "identity", "note"), attribute_rows)

    out += ["## Value sets", ""]
    for e in value_sets:
        out += [f"### `{e.name}`", ""]
        if inspect.isclass(e.value):
            out += [inspect.getdoc(e.value) or "", ""]
            members = [(_code(v), _code(n), c) for n, v, c in _members(e.value)]
            out += _table(("value", "constant", "note"), members)
        else:
            assert isinstance(e.value, tuple)
            if e.note or e.group:
                out += [e.note or e.group, ""]
            out += [_constant(e.value), ""]

    out += ["## Other constants", ""]
    for _, heading, section_constants in _sections(constants, intros):
        out += heading
        out += _grouped(
            [(e, (_code(e.name), _constant(e.value), e.note)) for e in section_constants], ("constant", "value", "note")
        )
    return "\n".join(out).rstrip("\n") + "\n"


def collector_options() -> list[str]:
    """The ``otel-ofu collector`` options, one table per section, from their declarations: range, default,
    variable, meaning, and the key in a configuration file."""
    out = [
        "## Collector options",
        "",
        "`otel-ofu collector`'s options as its `--help` groups them, read from their declarations"
        " (`collector/otel_ofu_collector/options/declared.py`). Each is also a variable and a key in a YAML file"
        " given with `--config FILE` (its name under its section, as the last column shows:"
        " `windows: {window: 30}`); `--print-config` prints a run's whole configuration as such a file. A flag"
        " wins over its variable, a variable over the file, the file over the default; a key that is no option is"
        " refused with the closest one. A value outside an option's range (both ends included; never infinite or"
        " NaN) is a one-line usage error naming the option, exit 2, before anything starts, whether it came from"
        " the command line, the option's variable or the file (naming the file and the key).",
        "",
    ]
    for section in SECTIONS:
        rows = [
            (
                _option_usage(option),
                option.bound.describe() if option.bound is not None else "",
                _code(option.shown_default) if option.shown_default is not None else "",
                _code(env_name(option.flag, COLLECTOR_PREFIX)),
                " ".join(option.help.split()),
                _code(option.key),
            )
            for option in in_section(section)
        ]
        out += [f"### {section.title}", ""]
        out += _table(("option", "range", "default", "variable", "meaning", "in --config"), rows)
    return out


def _option_usage(option: Option[Any]) -> str:
    """The option as ``--help`` shows it: with its metavar, its choices, or its ``--no-`` form."""
    if option.switch:
        return f"{_code(option.flag)} / {_code('--no-' + option.flag[2:])}"
    if option.metavar:
        return _code(f"{option.flag} {option.metavar}")
    if option.choices:
        return _code(f"{option.flag} {{{','.join(option.choices)}}}")
    return _code(option.flag)


def _constant(value: object) -> str:
    if isinstance(value, dict):
        return ", ".join(f"`{key}` -> `{item}`" for key, item in value.items())
    if isinstance(value, tuple):
        return ", ".join(_code(item) for item in value)
    return _code(value)


def port_map() -> list[str]:
    """The port map of ``otel_ofu.ports``: the one place every doc, chart and help text takes its ports from."""
    out = [
        "## Ports",
        "",
        "No endpoint listens unless given a port; these are the ports the Helm chart, the systemd unit, the"
        " examples, the alert rules' scrape configuration and the `--help` texts use (`otel_ofu/ports.py`; a test"
        " checks every file that names one). The HTTP endpoints listen on `127.0.0.1` unless told otherwise"
        " (`--prometheus-host`, `--report-feed-host`, `--health-host`).",
        "",
    ]
    rows = [(_code(port.number), port.listener, _code(port.option), port.serves) for port in ports.PORT_MAP]
    return out + _table(("port", "who listens", "option", "what"), rows)


def reference() -> str:
    """docs/reference.md: the vocabulary, the port map, then the collector's options."""
    return (
        render()
        + "\n"
        + "\n".join(port_map()).rstrip("\n")
        + "\n\n"
        + "\n".join(collector_options()).rstrip("\n")
        + "\n"
    )


def main(argv: list[str] | None = None) -> int:
    return write_or_check(REFERENCE.parent, {REFERENCE.name: reference()}, argv, __doc__ or "")


if __name__ == "__main__":
    sys.exit(main())
