"""What every benchmark and study shares: the result shape, target verdicts, machine info, JSON and markdown.

A benchmark module exposes ``run(ctx: RunContext) -> BenchResult``. ``RunContext`` says where files go and
whether the run is the quick one; the result carries the tables for RESULTS.md, the verdicts against the
the targets (measured in the same run as their floors) and free-form JSON data. RESULTS.md is
rebuilt from every ``*.json`` in the results folder, so ``--only NAME`` refreshes one section and keeps
the others.
"""

from __future__ import annotations

import inspect
import json
import math
import os
import platform
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

JSON_SCHEMA = 1
# ``--strict`` fails a ratio target only when it is missed by more than this (relative). Measured on the shared
# 2-core machine this project is built on: the quick ratios, each run 3-4 times in a row
# (benchmarks/results/ratio_spread.json), spread by up to 26% (max / min - 1; producer / SDK encoder on the
# fake NVML: 1.85-2.34), 16% (same on the simulator), 7% (collector / Rotel end to end) and 5% (in-process
# ingest / floor). The margin is the largest, rounded up.
RATIO_MARGIN = 0.30


@attrs.frozen
class RunContext:
    """Where a benchmark writes (``out_dir``: JSON and plots) and how long it may take (``quick``)."""

    out_dir: Path
    quick: bool = False


@attrs.frozen
class Verdict:
    """A measured value against a target limit: met or missed, and by how much."""

    target: str  # the target as the project (or a publication) states it
    measured: float
    limit: float
    unit: str = ""
    higher_is_better: bool = False
    source: str = "target"  # "target" rows are the contract; "published" rows compare with published figures
    # How ``--strict`` treats a miss: "deterministic" (same inputs, same number: any miss fails), "ratio"
    # (two timings from one run: fails when missed by more than the machine's noise margin) or "absolute"
    # (a time on this machine: reported, never enforced).
    kind: str = attrs.field(
        default="deterministic", validator=attrs.validators.in_(("deterministic", "ratio", "absolute"))
    )

    def missed_beyond(self, margin: float) -> bool:
        """Missed by more than ``margin`` (relative; 0 for deterministic targets)."""
        if not math.isfinite(self.measured):
            return True
        slack = 1.0 + (margin if self.kind == "ratio" else 0.0)
        if self.higher_is_better:
            return self.measured * slack < self.limit
        return self.measured > self.limit * slack

    @property
    def met(self) -> bool:
        if not math.isfinite(self.measured):
            return False
        return self.measured >= self.limit if self.higher_is_better else self.measured <= self.limit

    @property
    def margin(self) -> str:
        """How far from the limit, as a ratio of it ("met with 38% to spare", "missed by 12%")."""
        if not math.isfinite(self.measured):
            return "not measured"
        if self.limit == 0.0:
            return "met exactly" if self.met else f"{self.measured - self.limit:+.3g} {self.unit} over".strip()
        if self.higher_is_better:
            ratio = self.measured / self.limit
        else:
            ratio = self.limit / self.measured if self.measured > 0 else math.inf
        if ratio == math.inf:
            return "met with everything to spare"
        if ratio >= 1.0:
            return f"met, {ratio:.2f}x the limit" if self.higher_is_better else f"met, {ratio:.2f}x headroom"
        return f"missed by {(1.0 / ratio - 1.0) * 100:.1f}%"

    def as_json(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "measured": _finite_or_none(self.measured),
            "limit": self.limit,
            "unit": self.unit,
            "higher_is_better": self.higher_is_better,
            "source": self.source,
            "kind": self.kind,
            "met": self.met,
            "margin": self.margin,
        }


def _strs(values: Iterable[str]) -> tuple[str, ...]:
    return tuple(values)


def _rows(rows: Iterable[Iterable[str]]) -> tuple[tuple[str, ...], ...]:
    return tuple(tuple(row) for row in rows)


@attrs.frozen
class Table:
    title: str
    columns: tuple[str, ...] = attrs.field(converter=_strs)
    rows: tuple[tuple[str, ...], ...] = attrs.field(converter=_rows)
    note: str = ""

    def markdown(self) -> str:
        lines = [f"**{self.title}**", ""] if self.title else []
        lines.append("| " + " | ".join(self.columns) + " |")
        lines.append("|" + "|".join("---" for _ in self.columns) + "|")
        lines.extend("| " + " | ".join(row) + " |" for row in self.rows)
        if self.note:
            lines += ["", self.note]
        return "\n".join(lines)

    def as_json(self) -> dict[str, Any]:
        return {
            "title": self.title,
            "columns": list(self.columns),
            "rows": [list(r) for r in self.rows],
            "note": self.note,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Table:
        return cls(data["title"], data["columns"], data["rows"], data.get("note", ""))


def _tables(values: Iterable[Table]) -> tuple[Table, ...]:
    return tuple(values)


def _verdicts(values: Iterable[Verdict]) -> tuple[Verdict, ...]:
    return tuple(values)


@attrs.frozen
class BenchResult:
    name: str
    title: str
    summary: str  # what is measured, against which floor or ground truth, and how
    tables: tuple[Table, ...] = attrs.field(converter=_tables, default=())
    verdicts: tuple[Verdict, ...] = attrs.field(converter=_verdicts, default=())
    data: Mapping[str, Any] = attrs.field(factory=dict)
    plots: tuple[str, ...] = attrs.field(converter=_strs, default=())  # file names beside the JSON


def doc_summary(doc: str | None) -> str:
    """A module docstring as markdown paragraphs for RESULTS.md."""
    return inspect.cleandoc(doc or "")


def _finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None


def fmt(value: float | None, digits: int = 3) -> str:
    """A number for a table cell; missing values are a dash, never 0."""
    if value is None or not math.isfinite(value):
        return "-"
    return f"{value:.{digits}g}" if abs(value) >= 1e-3 or value == 0.0 else f"{value:.2e}"


def pct(value: float | None, digits: int = 2) -> str:
    if value is None or not math.isfinite(value):
        return "-"
    return f"{value * 100:.{digits}f}%"


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=False,
            cwd=Path(__file__).resolve().parent,
            timeout=5,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def machine_info() -> dict[str, Any]:
    """The machine a result came from: enough to tell whether two runs are comparable."""
    return {
        "platform": platform.platform(),
        "cpu": cpu_model(),
        "cores": usable_cores(),
        "python": platform.python_version(),
        "implementation": sys.implementation.name,
        "git_commit": git_commit(),
    }


def machine_line(machine: Mapping[str, Any]) -> str:
    return (
        f"{machine.get('cpu', '?')}, {machine.get('cores', '?')} cores, {machine.get('platform', '?')}, "
        f"Python {machine.get('python', '?')}"
    )


def write_result(result: BenchResult, ctx: RunContext, seconds: float, error: str | None = None) -> Path:
    """``NAME.json`` in the results folder: everything RESULTS.md shows, and the raw data."""
    ctx.out_dir.mkdir(parents=True, exist_ok=True)
    payload = {
        "schema": JSON_SCHEMA,
        "name": result.name,
        "title": result.title,
        "summary": result.summary,
        "quick": ctx.quick,
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "seconds": round(seconds, 3),
        "machine": machine_info(),
        "error": error,
        "verdicts": [verdict.as_json() for verdict in result.verdicts],
        "tables": [table.as_json() for table in result.tables],
        "plots": list(result.plots),
        "data": result.data,
    }
    path = ctx.out_dir / f"{result.name}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(payload, indent=2, sort_keys=False, default=_json_default) + "\n")
    os.replace(tmp, path)
    return path


def _json_default(value: object) -> object:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if hasattr(value, "tolist"):  # numpy scalars and arrays
        return value.tolist()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def load_results(results_dir: Path, order: Sequence[str]) -> list[dict[str, Any]]:
    """Every result JSON in the folder, in the registry's order, unknown names last."""
    found: list[dict[str, Any]] = []
    for path in sorted(results_dir.glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if isinstance(data, dict) and data.get("schema") == JSON_SCHEMA and "name" in data:
            found.append(data)
    rank = {name: i for i, name in enumerate(order)}
    found.sort(key=lambda data: (rank.get(str(data["name"]), len(rank)), str(data["name"])))
    return found


def gpu_validation_row(results_dir: Path) -> str:
    """The GPU target's row: from ``gpu/validate_ofu.json`` when a GPU run left one, else "not measured"."""
    target = "controlled GEMMs on a Hopper GPU: OFU within 2 pp of MFU after tile correction, share of shapes"
    path = results_dir / "gpu" / "validate_ofu.json"
    try:
        data = json.loads(path.read_text())
        share = data["summary"]["all"]["within_2pp_corrected"]
        dry_run = bool(data["header"]["dry_run"])
    except (OSError, ValueError, KeyError, TypeError):
        share, dry_run = None, True
    if share is None or dry_run:
        return (
            f"| gpu (validate_ofu) | {target} | - | 95 % | hardware | not measured | no Hopper GPU in this run: "
            "`python -m benchmarks.gpu.validate_ofu --out benchmarks/results/gpu` on an H100/H200 |"
        )
    verdict = Verdict(target, share * 100, 95.0, "%", higher_is_better=True)
    return (
        f"| gpu (validate_ofu) | {target} ({data['header']['device']}) | {share * 100:.1f} % | 95 % | hardware | "
        f"{'met' if verdict.met else '**MISSED**'} | {verdict.margin} |"
    )


def render_markdown(
    results: Iterable[Mapping[str, Any]], *, quick: bool, plot_prefix: str, gpu_row: str | None = None
) -> str:
    """RESULTS.md: the machines, every target with its verdict, then one section per benchmark."""
    results = list(results)
    command = "python -m benchmarks --quick" if quick else "python -m benchmarks"
    lines = [
        "# Benchmark and study results",
        "",
        f"Reproduce every number here with `{command}` (`make bench`; CI runs `make bench-quick`, which is",
        "`python -m benchmarks --quick --strict`). Each target is measured against its floor, its peers or",
        "its ground truth in the same run. Kinds: *deterministic* targets give the same number for the same",
        "inputs and any miss fails CI; *ratio* targets compare two timings of one run and fail CI when missed",
        f"by more than this machine's measured noise margin ({RATIO_MARGIN:.0%}: the largest spread of repeated quick",
        "runs of the ratios, max / min - 1, was 26%, `benchmarks/results/ratio_spread.json`); *absolute*",
        "times depend on the machine and are reported, never enforced. Rows marked *published* compare with",
        "published figures and are not targets; a study that holds by construction carries no verdict.",
        "",
        "## Machines",
        "",
    ]
    machines = sorted({machine_line(r.get("machine", {})) for r in results})
    lines += [f"- {machine}" for machine in machines] or ["- (no results yet)"]
    commits = sorted({str(r["machine"]["git_commit"]) for r in results if r.get("machine", {}).get("git_commit")})
    if commits:
        lines += ["", f"Source at commit {', '.join(commits)} (plus the working tree when it ran)."]
    peers = sorted(
        {f"{name} {v}" for r in results for name, v in (r.get("data", {}).get("peer_versions") or {}).items()}
    )
    if peers:
        lines += ["", "Peers: " + ", ".join(peers) + "."]
    lines += [
        "",
        "## Targets",
        "",
        "| benchmark | target | measured | limit | kind | verdict | margin |",
        "|---|---|---|---|---|---|---|",
    ]
    for result in results:
        for v in result.get("verdicts", []):
            measured = "-" if v["measured"] is None else f"{fmt(v['measured'], 4)} {v['unit']}".strip()
            published = v.get("source") == "published"
            verdict = ("met" if v["met"] else "**MISSED**") + (" (published)" if published else "")
            kind = "published" if published else v.get("kind", "deterministic")
            lines.append(
                f"| {result['name']} | {v['target']} | {measured} | {fmt(v['limit'], 4)} {v['unit']} | {kind} | "
                f"{verdict} | {v['margin']} |"
            )
        if result.get("error"):
            lines.append(f"| {result['name']} | (did not finish) | - | - | - | **ERROR** | {result['error']} |")
    if gpu_row is not None:
        lines.append(gpu_row)
    for result in results:
        lines += ["", f"## {result['title']} (`{result['name']}`)", ""]
        lines.append(
            f"{result['summary']}  \n*{result['finished_at']}, {result['seconds']:.1f} s"
            f"{', quick mode' if result.get('quick') else ''}.*"
        )
        if result.get("error"):
            lines += ["", f"**Error:** `{result['error']}`"]
        for table in result.get("tables", []):
            lines += ["", Table.from_json(table).markdown()]
        for plot in result.get("plots", []):
            lines += ["", f"![{result['name']}]({plot_prefix}{plot})"]
    return "\n".join(lines) + "\n"


def write_markdown(results_dir: Path, markdown_path: Path, order: Sequence[str], *, quick: bool) -> Path:
    results = load_results(results_dir, order)
    prefix = os.path.relpath(results_dir, markdown_path.parent)
    prefix = "" if prefix == "." else prefix.replace(os.sep, "/") + "/"
    markdown_path.parent.mkdir(parents=True, exist_ok=True)
    text = render_markdown(results, quick=quick, plot_prefix=prefix, gpu_row=gpu_validation_row(results_dir))
    markdown_path.write_text(text)
    return markdown_path


def new_figure(width: float = 7.0, height: float = 4.2, ncols: int = 1) -> Any:
    """A matplotlib figure on the Agg backend (no display needed); returns (figure, axes)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(ncols=ncols, figsize=(width, height), layout="constrained")


def save_figure(figure: Any, ctx: RunContext, name: str) -> str:
    import matplotlib.pyplot as plt

    ctx.out_dir.mkdir(parents=True, exist_ok=True)
    file_name = f"{name}.png"
    figure.savefig(ctx.out_dir / file_name, dpi=110)
    plt.close(figure)
    return file_name
