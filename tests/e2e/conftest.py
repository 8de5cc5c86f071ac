"""Fixtures of the end-to-end tests: find the third-party binaries and run them as child processes.

Each binary runs on 127.0.0.1 with free ports, logs into the test's temporary directory, and is stopped
by a finalizer whatever the test did. Start-up is a bounded poll on a readiness condition, never a sleep.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
import yaml

from tests.e2e.helpers import StartProcess

Require = Callable[[bool, str], None]

START_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 5.0


def _log_tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


@pytest.fixture
def prometheus_binary(require: Require) -> Path:
    """Debian's ``prometheus`` (tests/setup/debian-packages.txt)."""
    found = shutil.which("prometheus")
    require(found is not None, "the prometheus binary is not installed (apt-get install prometheus)")
    assert found is not None
    return Path(found)


@pytest.fixture
def rotel_binary(require: Require) -> Path:
    """The Rust collector shipped inside the ``rotel`` wheel (a dev extra; Linux x86_64 only)."""
    spec = importlib.util.find_spec("rotel")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    binary = next((Path(place) / "rotel-agent" for place in locations), None)
    require(
        binary is not None and binary.is_file(),
        "the rotel wheel (pip install -e '.[dev]') with its rotel-agent binary is not installed",
    )
    assert binary is not None
    return binary


REPO = Path(__file__).resolve().parents[2]
OTELCOL_BUILD = REPO / "build" / "otelcol"


def _built(require: Require, name: str) -> Path:
    binary = OTELCOL_BUILD / name
    require(
        binary.is_file() and os.access(binary, os.X_OK),
        f"{binary.relative_to(REPO)} is not built (make otelcol; `make test` builds it)",
    )
    return binary


@pytest.fixture
def otelcol_binary(require: Require) -> Path:
    """otel-ofu's OpenTelemetry Collector distribution (collector/otelcol/builder/manifest.yaml)."""
    return _built(require, "otelcol-ofu")


@pytest.fixture
def telemetrygen_binary(require: Require) -> Path:
    """The Collector project's telemetrygen, built beside otelcol-ofu from the same release line."""
    return _built(require, "telemetrygen")


OtelcolComponents = dict[str, set[str]]
# The Collector (v0.161 line) lists components by their new names and still takes the old ones, which the
# shipped configurations use so that older distributions run them too.
OTELCOL_OLD_NAMES = {
    "otlp_grpc": "otlp",
    "otlp_http": "otlphttp",
    "load_balancing": "loadbalancing",
    "cumulative_to_delta": "cumulativetodelta",
    "signal_to_metrics": "signaltometrics",
}


@pytest.fixture
def otelcol_components(otelcol_binary: Path) -> OtelcolComponents:
    """The component types built into otelcol-ofu by kind (``otelcol-ofu components``), old names too."""
    listed = subprocess.run([str(otelcol_binary), "components"], capture_output=True, check=True, timeout=60)
    data = yaml.safe_load(listed.stdout)
    kinds = ("receivers", "processors", "exporters", "connectors", "extensions")
    built = {kind: {entry["name"] for entry in data.get(kind) or []} for kind in kinds}
    return {
        kind: names | {OTELCOL_OLD_NAMES[name] for name in names if name in OTELCOL_OLD_NAMES}
        for kind, names in built.items()
    }


@pytest.fixture
def start_process(tmp_path: Path) -> Iterator[StartProcess]:
    """``start(argv, name, ready)``: run ``argv`` with output in ``tmp_path/name.log`` until ``ready()``.

    Fails with the log's tail if the process exits or is not ready within START_TIMEOUT_S; every
    process started is terminated (then killed) when the test ends.
    """
    started: list[subprocess.Popen[bytes]] = []

    def start(argv: Sequence[str], name: str, ready: Callable[[], bool]) -> subprocess.Popen[bytes]:
        log_path = tmp_path / f"{name}.log"
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                list(argv), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path
            )
        started.append(process)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not ready():
            if process.poll() is not None:
                pytest.fail(f"{name} exited with {process.returncode} before it was ready:\n{_log_tail(log_path)}")
            if time.monotonic() > deadline:
                pytest.fail(f"{name} was not ready within {START_TIMEOUT_S:g} s:\n{_log_tail(log_path)}")
            time.sleep(0.05)
        return process

    yield start
    for process in reversed(started):
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(STOP_TIMEOUT_S)
