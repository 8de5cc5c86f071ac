"""One port map (``otel_ofu.ports``): every file that names a port of ours names the one the map gives it.

A new user copies a port from whichever page they read first: the alerts README's scrape target, the chart's
values, ``top --help``, docs/top.md. Each is checked here against the map, read as the user reads it (the
command a ``--prometheus-port`` belongs to decides which of the two endpoints it is).
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest
import yaml

from otel_ofu import cli, ports

ROOT = Path(__file__).resolve().parents[1]
VALUES = ROOT / "examples" / "deploy" / "helm" / "otel-ofu" / "values.yaml"
# Every page a user reads ports from (the chart's values and the unit are read as YAML / settings below).
PAGES = sorted(
    [
        ROOT / "README.md",
        *(ROOT / "docs").glob("*.md"),
        *(ROOT / "examples").rglob("*.md"),
        *(ROOT / "collector" / "otelcol").glob("*.md"),
        ROOT / "examples" / "deploy" / "otel-ofu.service",
        ROOT / "examples" / "deploy" / "daemonset.yaml",
    ]
)


def commands(text: str) -> list[str]:
    """The text's lines with shell continuations joined, so a command's options are on its line."""
    return text.replace("\\\n", " ").splitlines()


def named_ports(text: str) -> list[tuple[int, int, str]]:
    """(port named, port the map gives it, the line) for every port of ours the text names."""
    found: list[tuple[int, int, str]] = []
    for line in commands(text):
        for match in re.finditer(r"--report-feed-port[ =](\d+)|REPORT_FEED_PORT=(\d+)|port-forward \S+ (\d+):", line):
            found.append((int(next(g for g in match.groups() if g)), ports.COLLECTOR_REPORT_FEED, line))
        for match in re.finditer(r"(?:--feed|--live)[ =]\S*?:(\d+)|report feed, e\.g\. \S*?:(\d+)", line):
            found.append((int(next(g for g in match.groups() if g)), ports.COLLECTOR_REPORT_FEED, line))
        for match in re.finditer(r"COLLECTOR_PROMETHEUS_PORT\W+(\d+)", line):
            found.append((int(match.group(1)), ports.COLLECTOR_PROMETHEUS, line))
        for match in re.finditer(r"OTEL_OFU_PROMETHEUS_PORT\W+(\d+)", line):
            found.append((int(match.group(1)), ports.PRODUCER_PROMETHEUS, line))
        for match in re.finditer(r"otel-ofu (collector|run)\b[^|;&]*?--prometheus-port[ =](\d+)", line):
            expected = ports.COLLECTOR_PROMETHEUS if match.group(1) == "collector" else ports.PRODUCER_PROMETHEUS
            found.append((int(match.group(2)), expected, line))
        for match in re.finditer(r"otel-ofu (collector|run)\b[^|;&]*?--health-port[ =](\d+)", line):
            expected = ports.COLLECTOR_HEALTH if match.group(1) == "collector" else ports.PRODUCER_HEALTH
            found.append((int(match.group(2)), expected, line))
        for match in re.finditer(r"otel-ofu collector ready: .*?prometheus [\d.]+:(\d+)", line):
            found.append((int(match.group(1)), ports.COLLECTOR_PROMETHEUS, line))
    return found


def test_the_map_has_one_port_per_endpoint() -> None:
    numbers = [port.number for port in ports.PORT_MAP]
    assert len(numbers) == len(set(numbers))


@pytest.mark.parametrize("page", PAGES, ids=lambda path: path.relative_to(ROOT).as_posix())
def test_every_page_names_the_maps_ports(page: Path) -> None:
    wrong = [
        (named, expected, line.strip()) for named, expected, line in named_ports(page.read_text()) if named != expected
    ]
    assert not wrong, wrong


def test_the_checker_reads_ports_as_a_user_does() -> None:
    """It can fail: the four mismatches the first-hour user met."""
    text = (
        "otel-ofu collector --report-feed-port 9465\n"
        "otel-ofu top --feed http://127.0.0.1:9465\n"
        "otel-ofu collector --export-endpoint http://otelcol:4317 \\\n    --prometheus-port 9464\n"
        "otel-ofu run --source sim --prometheus-port 9464\n"
    )
    assert [(named, expected) for named, expected, _ in named_ports(text)] == [
        (9465, ports.COLLECTOR_REPORT_FEED),
        (9465, ports.COLLECTOR_REPORT_FEED),
        (9464, ports.COLLECTOR_PROMETHEUS),
        (9464, ports.PRODUCER_PROMETHEUS),
    ]


def test_the_chart_listens_where_the_map_says() -> None:
    values = yaml.safe_load(VALUES.read_text())
    assert values["producer"]["prometheusPort"] == ports.PRODUCER_PROMETHEUS
    assert values["producer"]["healthPort"] == ports.PRODUCER_HEALTH
    assert values["collector"]["grpcPort"] == ports.OTLP_GRPC
    assert values["collector"]["httpPort"] == ports.OTLP_HTTP
    assert values["collector"]["prometheusPort"] == ports.COLLECTOR_PROMETHEUS
    assert values["collector"]["healthPort"] == ports.COLLECTOR_HEALTH


def test_the_alert_rules_scrape_the_collectors_prometheus_port() -> None:
    readme = (ROOT / "examples" / "alerts" / "README.md").read_text()
    targets = re.findall(r'targets: \["[^"]*:(\d+)"\]', readme)
    assert targets
    assert {int(port) for port in targets} == {ports.COLLECTOR_PROMETHEUS}


def _help(command: str) -> str:
    parser = cli.build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return " ".join(str(action.choices[command].format_help()).split())  # one line: the wrapping undone


@pytest.mark.parametrize("command", ["top", "report", "collector", "run"])
def test_every_help_names_the_maps_ports(command: str) -> None:
    text = _help(command)
    wrong = [(named, expected, line.strip()) for named, expected, line in named_ports(text) if named != expected]
    assert not wrong, wrong


def test_every_option_of_the_map_exists() -> None:
    for port in ports.PORT_MAP:
        if not port.listener.startswith("otel-ofu "):
            continue
        command = port.listener.removeprefix("otel-ofu ")
        assert port.option in _help(command), (command, port.option)
