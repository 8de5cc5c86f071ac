"""The collector stays in rooms a reader can hold: no class above MAX_METHODS methods, no module above MAX_LINES lines,
at most MAX_TOP_MODULES modules flat at its top, no function of the decoder or the windows above MAX_COMPLEXITY.

Read with ``ast`` over the source, not imported: a property, a static or class method, an attrs default and a
nested function's class all count as methods of the class whose body defines them.
"""

from __future__ import annotations

import ast
from pathlib import Path

import otel_ofu_collector

ROOT = Path(otel_ofu_collector.__file__).parent
MAX_METHODS = 25
MAX_LINES = 800


def methods_of(node: ast.ClassDef) -> int:
    return sum(isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) for item in node.body)


def large_classes(source: str) -> list[tuple[str, int]]:
    """(name, methods) of each class in the source (nested ones too) with more than MAX_METHODS methods."""
    classes = (node for node in ast.walk(ast.parse(source)) if isinstance(node, ast.ClassDef))
    return [(node.name, count) for node in classes if (count := methods_of(node)) > MAX_METHODS]


def modules() -> list[Path]:
    return sorted(ROOT.rglob("*.py"))


def test_the_count_sees_properties_and_nested_classes() -> None:
    body = "".join(f"    def m{i}(self) -> None: ...\n" for i in range(20))
    body += "".join(f"    @property\n    def p{i}(self) -> int: return {i}\n" for i in range(6))
    source = f"class Big:\n{body}\n\ndef outer() -> None:\n    class Inner:\n{body.replace('    ', '        ')}"
    assert large_classes(source) == [("Big", 26), ("Inner", 26)]
    assert large_classes("class Small:\n" + "".join(f"    def m{i}(self) -> None: ...\n" for i in range(25))) == []


def test_the_walk_finds_the_collector() -> None:
    found = {path.relative_to(ROOT).as_posix() for path in modules()}
    assert {"service.py", "report/summary.py", "aggregation/windows.py"} <= found


def test_no_collector_class_above_the_method_limit() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}: {name} has {count} methods"
        for path in modules()
        for name, count in large_classes(path.read_text(encoding="utf-8"))
    ]
    assert offenders == [], f"split these by what they hold (at most {MAX_METHODS} methods a class): {offenders}"


def test_no_collector_module_above_the_line_limit() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}: {lines} lines"
        for path in modules()
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    ]
    assert offenders == [], f"split these by what they hold (at most {MAX_LINES} lines a module): {offenders}"


MAX_TOP_MODULES = 8


def test_at_most_a_few_modules_flat_at_the_collectors_top() -> None:
    # The stages live in their folders (receivers/, otlp/, aggregation/, outputs/, storage/, demo/ ...); what stays
    # at the top is what every stage shares or what ties them together.
    top = sorted(path.name for path in ROOT.glob("*.py") if path.name != "__init__.py")
    assert len(top) <= MAX_TOP_MODULES, f"at most {MAX_TOP_MODULES} modules at the top, found {len(top)}: {top}"


MAX_COMPLEXITY = 20  # cyclomatic (radon's, as McCabe counts it), in the collector's hot middle


def test_no_function_of_the_decoder_or_the_windows_above_the_complexity_limit() -> None:
    from radon.complexity import cc_visit

    found = [
        f"{path.relative_to(ROOT)}:{block.name} {block.complexity}"
        for folder in ("otlp", "aggregation")
        for path in sorted((ROOT / folder).glob("*.py"))
        for block in cc_visit(path.read_text(encoding="utf-8"))
        if block.complexity > MAX_COMPLEXITY
    ]
    assert found == [], f"split these by what they decide (at most {MAX_COMPLEXITY}): {found}"
