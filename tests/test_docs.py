"""The docs explain the project from inside it: the reference matches the vocabulary, nothing points outside."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import pytest

from otel_ofu import names

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def _load(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # inspect.getsource finds a module's file through sys.modules
    spec.loader.exec_module(module)
    return module


generate = _load(DOCS / "generate.py", "docs_generate")


# --- The reference is generated from the vocabulary ----------------------------------------------------


def test_committed_reference_matches_the_generator() -> None:
    committed = (DOCS / "reference.md").read_text()
    assert committed == generate.reference(), "docs/reference.md is stale: run python docs/generate.py"


def test_generator_check_mode_passes_on_the_committed_reference() -> None:
    assert generate.main(["--check"]) == 0


def test_check_mode_fails_on_a_stale_reference(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stale = tmp_path / "reference.md"
    stale.write_text((DOCS / "reference.md").read_text().replace("`gpu.ofu`", "`gpu.ofu.old`", 1))
    monkeypatch.setattr(generate, "REFERENCE", stale)
    assert generate.main(["--check"]) == 1
    monkeypatch.setattr(generate, "REFERENCE", tmp_path / "missing.md")
    assert generate.main(["--check"]) == 1


def test_every_name_the_vocabulary_declares_is_in_the_reference() -> None:
    text = (DOCS / "reference.md").read_text()
    for key, value in vars(names).items():
        if isinstance(value, names.MetricSpec):
            row = f"| `{value.name}` | {value.kind.replace('_', ' ')} | `{value.unit}` |"
            assert row in text, f"{key} ({value.name}) is missing from docs/reference.md"
        elif key.isupper() and isinstance(value, str | int | float):
            assert f"`{value}`" in text, f"{key} = {value!r} is missing from docs/reference.md"


FUTURE_VOCABULARY = '''
"""A vocabulary as it may grow: a new section, metrics, an attribute and a value set."""

from typing import Final

from otel_ofu.names import MetricSpec

# --- Producer metrics -----------------------------------------------------------------------------

GPU_OFU: Final = MetricSpec("gpu.ofu", "1", "gauge", "OFU")

# --- Where OFU is lost ----------------------------------------------------------------------------
# Loss and cost, per job per window.

GPU_POWER: Final = MetricSpec("gpu.power", "W", "gauge", "Power draw over the interval")
GPU_ENERGY: Final = MetricSpec(
    "gpu.energy", "J", "sum", "Energy counter of the board"
)  # NVML total energy, DCGM 156
# Loss split by cause.
JOB_OFU_LOSS: Final = MetricSpec("job.ofu.loss", "1", "gauge", "1 - OFU by cause")
LOSS_METRICS: Final = (JOB_OFU_LOSS,)

OFU_LOSS_CAUSE: Final = "ofu.loss.cause"  # idle, clock or tensor
DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION: Final = 156


class LossCause:
    """Values of ``ofu.loss.cause``."""

    IDLE: Final = "idle"  # no tensor activity all window
    CLOCK = "clock"
    ALL = (IDLE, CLOCK)
'''


def test_the_generator_picks_up_names_added_later(tmp_path: Path) -> None:
    path = tmp_path / "future_names.py"
    path.write_text(textwrap.dedent(FUTURE_VOCABULARY))
    text = generate.render(_load(path, "future_names"))
    where_lost = text.index("### Where OFU is lost")
    assert text.index("`gpu.ofu`") < where_lost < text.index("| `gpu.power` | gauge | `W` |")
    assert "Loss and cost, per job per window." in text
    assert "| `gpu.energy` | sum | `J` | Energy counter of the board (NVML total energy, DCGM 156) |" in text
    # A comment above a run of names heads its own table; the group tuple is listed beside the metric.
    assert text.index("Loss split by cause.") < text.index("| `job.ofu.loss` |")
    assert "`JOB_OFU_LOSS`, `LOSS_METRICS`" in text
    assert "| `ofu.loss.cause` | `OFU_LOSS_CAUSE` |  | idle, clock or tensor |" in text
    assert "| `DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION` | `156` |" in text
    assert "### `LossCause`" in text
    assert "| `idle` | `IDLE` | no tensor activity all window |" in text
    assert "| `clock` | `CLOCK` |  |" in text


# --- Nothing in the project points at files outside it -------------------------------------------------

# Spelled in pieces so that this file does not match itself.
OUTSIDE = re.compile(
    "|".join(re.escape(part) for part in ("DESIGN" + ".md", "PAPER" + ".md", "../" + "shared", "/work/" + "shared"))
)


def _tracked_files() -> list[Path]:
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z"], cwd=ROOT, check=True, capture_output=True, text=True
        ).stdout.split("\0")
    except (OSError, subprocess.CalledProcessError):
        # Not a git checkout (an unpacked sdist): every file but the usual build and tool folders.
        skip = {".git", ".venv", "build", "dist", "node_modules", "__pycache__", ".mypy_cache", ".ruff_cache"}
        return [p for p in ROOT.rglob("*") if p.is_file() and not skip & set(p.relative_to(ROOT).parts)]
    return [ROOT / name for name in listed if name]


def test_no_tracked_file_points_outside_the_project() -> None:
    offenders = []
    for path in _tracked_files():
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # binary files (plots) and files removed in the working tree
        for number, line in enumerate(text.splitlines(), 1):
            if OUTSIDE.search(line):
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:100]}")
    assert not offenders, "files outside the project referenced:\n" + "\n".join(offenders)


def test_the_readme_lists_the_docs() -> None:
    readme = (ROOT / "README.md").read_text()
    for page in ("docs/design.md", "docs/ofu-method.md", "docs/reference.md"):
        assert (ROOT / page).is_file()
        assert f"]({page})" in readme, f"README.md does not link {page}"
