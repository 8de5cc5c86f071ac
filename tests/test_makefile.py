"""A cold ``make demo`` is the light path: otel-ofu and its runtime dependencies only, in an environment of its
own (not the dev tools and the benchmark peer ``make test`` installs), each step announced; setuptools' boxed
notice about an editable install (a warning about nothing wrong) is filtered out, with the real setuptools.

The install itself needs the package index, so it is not run here: ``make -n`` prints what it would run
(tests/test_packaging.py installs the built wheel, with its dependencies, into a clean environment).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def make(require: Callable[[bool, str], None]) -> str:
    found = shutil.which("make")
    require(found is not None, "make (Debian package make) is not installed")
    assert found is not None
    return found


def dry_run(make: str, tmp_path: Path, target: str = "demo") -> list[str]:
    """What a cold ``make TARGET`` would run, in order, for virtual environments that do not exist yet."""
    # Run as a top-level make even under ``make test``: an inherited MAKELEVEL or MAKEFLAGS would have it
    # print "Entering/Leaving directory" lines among the commands.
    env = {key: value for key, value in os.environ.items() if key not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS")}
    result = subprocess.run(
        [make, "-n", "--no-print-directory", f"VENV={tmp_path / 'venv'}", f"DEMO_VENV={tmp_path / 'demo'}", target],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return result.stdout.splitlines()


def test_a_cold_make_demo_installs_the_runtime_package_only_into_its_own_environment(make: str, tmp_path: Path) -> None:
    lines = dry_run(make, tmp_path)
    steps = [i for i, line in enumerate(lines) if "pip install" in line or "-m venv" in line]
    assert len(steps) == 2  # the demo's venv, otel-ofu with its runtime dependencies
    for step in steps:
        # The line before each step says, in words, what is about to be installed.
        assert lines[step - 1].startswith('echo "make: '), (lines[step - 1], lines[step])
    (install,) = [line for line in lines if "pip install" in line]
    assert install.rstrip().endswith("-e .")  # no [dev] extras
    assert str(tmp_path / "demo") in install
    assert str(tmp_path / "venv") not in " ".join(lines)  # the dev environment is not touched
    assert not any("openlit" in line or "[dev]" in line for line in lines)
    assert lines[-1].endswith(f"{tmp_path / 'demo'}/bin/otel-ofu demo")


def test_the_dev_environment_still_gets_its_tools_and_announces_each_step(make: str, tmp_path: Path) -> None:
    lines = dry_run(make, tmp_path, f"{tmp_path / 'venv'}/.installed")
    steps = [i for i, line in enumerate(lines) if "pip install" in line or "-m venv" in line]
    assert len(steps) == 4  # the venv, pip itself, otel-ofu with its dev extras, openlit
    for step in steps:
        assert lines[step - 1].startswith('echo "make: '), (lines[step - 1], lines[step])
    (editable,) = [line for line in lines if "pip install" in line and "-e '.[dev]'" in line]
    announced = lines[lines.index(editable) - 1]
    assert "otel-ofu" in announced
    assert "dev tools" in announced


def test_the_editable_install_notice_is_filtered_with_the_real_setuptools(make: str, tmp_path: Path) -> None:
    (editable,) = [line for line in dry_run(make, tmp_path) if "pip install" in line and "-e ." in line]
    match = re.search(r"PYTHONWARNINGS='([^']+)'", editable)
    assert match is not None, editable
    # setuptools' own notice, emitted as its editable_wheel command emits it.
    emit = (
        "from setuptools.warnings import InformationOnly\n"
        "InformationOnly.emit('Editable installation.', 'Please be careful with folders in your working directory')"
    )
    env = {key: value for key, value in os.environ.items() if key != "PYTHONWARNINGS"}

    def stderr(warnings: str | None) -> str:
        extra = {"PYTHONWARNINGS": warnings} if warnings else {}
        result = subprocess.run(
            [sys.executable, "-c", emit], env={**env, **extra}, capture_output=True, text=True, timeout=60, check=True
        )
        return result.stderr

    assert "Editable installation" in stderr(None)  # the boxed notice a cold install printed
    assert stderr(match.group(1)) == ""
