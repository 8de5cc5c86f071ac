"""The packages use public OpenTelemetry API only, so an SDK minor release cannot break them silently.

Read from the source (nothing is imported but the OpenTelemetry classes the packages subclass): no import of
a private OpenTelemetry module or name (a path part or a name with a leading underscore), no override of an
OpenTelemetry base class's private method, and, in a module that uses OpenTelemetry, no ``hasattr`` or
``getattr`` probing for a private attribute.
"""

from __future__ import annotations

import ast
import importlib
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = (ROOT / "otel_ofu", ROOT / "collector" / "otel_ofu_collector")


def sources() -> Iterator[Path]:
    for package in PACKAGES:
        for path in sorted(package.rglob("*.py")):
            if "_pb2" not in path.name:  # generated protobuf code, not ours
                yield path


def private(dotted: str) -> bool:
    return any(part.startswith("_") for part in dotted.split("."))


def otel_imports(tree: ast.Module) -> Iterator[tuple[int, str, ast.alias | None]]:
    """(line, module, the name imported from it or None) for every OpenTelemetry import, at any depth."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "opentelemetry":
                    yield node.lineno, alias.name, None
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] == "opentelemetry":
                for alias in node.names:
                    yield node.lineno, node.module, alias
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and str(node.args[0].value).startswith("opentelemetry")
        ):
            yield node.lineno, str(node.args[0].value), None


def private_uses(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name
    found = []
    imported: dict[str, type] = {}
    for line, module, alias in otel_imports(tree):
        if private(module) or (alias is not None and private(alias.name)):
            found.append(f"{where}:{line}: imports {module}{'.' + alias.name if alias else ''}")
        elif alias is not None:
            value = getattr(importlib.import_module(module), alias.name, None)
            if isinstance(value, type):
                imported[alias.asname or alias.name] = value  # the name the module's classes derive from
    uses_otel = any(True for _ in otel_imports(tree))
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            bases = [imported[b.id] for b in node.bases if isinstance(b, ast.Name) and b.id in imported]
            for item in node.body:
                if (
                    isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
                    and item.name.startswith("_")
                    and not item.name.endswith("__")
                    and any(hasattr(base, item.name) for base in bases)
                ):
                    found.append(f"{where}:{item.lineno}: {node.name} overrides the private {item.name}")
        elif (
            uses_otel
            and isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("hasattr", "getattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and str(node.args[1].value).startswith("_")
            and not str(node.args[1].value).endswith("__")
        ):
            found.append(f"{where}:{node.lineno}: probes {node.func.id}(..., {node.args[1].value!r})")
    return found


def test_no_private_opentelemetry_api_in_the_packages() -> None:
    found = [use for path in sources() for use in private_uses(path)]
    assert found == []


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("from opentelemetry.exporter.otlp.proto.common._internal import _encode_attributes\n", "imports"),
        ("from opentelemetry.sdk.metrics.export import _private\n", "imports"),
        ("import opentelemetry.sdk._logs\n", "imports"),
        ("import importlib\nimportlib.import_module('opentelemetry.sdk.metrics._internal')\n", "imports"),
        (
            "from opentelemetry.sdk.metrics.export import MetricReader as Base\n"
            "class Mine(Base):\n    def _receive_metrics(self): ...\n",
            "overrides the private _receive_metrics",
        ),
        ("from opentelemetry.sdk.resources import Resource\nok = hasattr(object(), '_export_batch')\n", "probes"),
    ],
)
def test_the_check_finds_each_kind_of_private_use(tmp_path: Path, source: str, expected: str) -> None:
    # The check itself, on code that does each thing it forbids.
    module = tmp_path / "mine.py"
    module.write_text(source)
    (use,) = private_uses(module)
    assert expected in use


def test_the_check_allows_own_private_helpers_and_dunders(tmp_path: Path) -> None:
    module = tmp_path / "mine.py"
    module.write_text(
        "from opentelemetry.sdk.metrics.export import MetricExporter\n"
        "class Mine(MetricExporter):\n    def _own_helper(self): ...\n    def __repr__(self): ...\n"
        "x = getattr(object(), '__name__', None)\n"
    )
    assert private_uses(module) == []
