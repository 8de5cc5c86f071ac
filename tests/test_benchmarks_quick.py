"""`python -m benchmarks --quick` end to end in a child process: JSON, plots and RESULTS.md with target verdicts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def run_benchmarks(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "benchmarks", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], Path]:
    out = tmp_path_factory.mktemp("bench")
    result = run_benchmarks(
        "--quick", "--only", "percentiles", "--only", "clock_domains", "--only", "tile_quantization", "--out", str(out)
    )
    return result, out


def load(out: Path, name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((out / f"{name}.json").read_text())
    return data


def test_quick_run_succeeds_and_writes_only_what_was_asked(
    quick_run: tuple[subprocess.CompletedProcess[str], Path],
) -> None:
    result, out = quick_run
    assert result.returncode == 0, result.stderr
    written = sorted(path.name for path in out.iterdir())
    assert written == [
        "RESULTS.md",
        "clock_domains.json",
        "clock_domains.png",
        "percentiles.json",
        "percentiles.png",
        "tile_quantization.json",
        "tile_quantization.png",
    ]
    for png in out.glob("*.png"):
        assert png.read_bytes().startswith(PNG_MAGIC)


def test_percentiles_json_has_a_design_verdict_with_its_margin(
    quick_run: tuple[subprocess.CompletedProcess[str], Path],
) -> None:
    _, out = quick_run
    data = load(out, "percentiles")
    assert data["quick"] is True
    assert data["error"] is None
    assert {"platform", "cpu", "cores", "python"} <= data["machine"].keys()
    [verdict] = data["verdicts"]
    assert verdict["source"] == "target"
    assert verdict["limit"] == 1.0
    assert verdict["unit"] == "%"
    assert verdict["met"] == (verdict["measured"] <= 1.0)
    assert verdict["margin"].startswith("met" if verdict["met"] else "missed by")
    # every shard count was measured, and the merge is exact
    records = data["data"]["records"]
    assert {record["shards"] for record in records} == {1, 2, 8, 32}
    assert data["data"]["merge_equals_single"] is True
    # where the exact percentile is 0 the relative error is undefined and the absolute one is reported
    zero_quantiles = [q for record in records for q in record["quantiles"] if q["exact"] == 0.0]
    assert zero_quantiles
    assert all(q["relative"] is None and q["absolute_at_zero"] is not None for q in zero_quantiles)


def test_study_results_carry_tables(quick_run: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    _, out = quick_run
    domains = load(out, "clock_domains")
    h100 = next(model for model in domains["data"]["models"] if model["model"] == "H100-SXM")
    assert h100["worst_factor"] == pytest.approx(1980 / 1830)
    tiles = load(out, "tile_quantization")
    assert tiles["tables"][0]["rows"]
    assert set(tiles["data"]["summary"]) == {"fp16/bf16", "tf32", "fp8"}


def test_results_md_states_machine_and_every_verdict(quick_run: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    _, out = quick_run
    text = (out / "RESULTS.md").read_text()
    assert "python -m benchmarks --quick" in text
    assert "## Machines" in text
    assert "cores" in text
    assert "## Targets" in text
    target_rows = [line for line in text.splitlines() if line.startswith("| percentiles |")]
    assert len(target_rows) == 1
    assert "met" in target_rows[0] or "MISSED" in target_rows[0]
    assert "(paper)" in text  # the studies' comparison rows are marked as not contract targets
    assert "![percentiles](percentiles.png)" in text


def test_only_refreshes_one_section_and_keeps_the_others(
    quick_run: tuple[subprocess.CompletedProcess[str], Path], tmp_path: Path
) -> None:
    _, out = quick_run
    for path in out.iterdir():
        (tmp_path / path.name).write_bytes(path.read_bytes())
    before = load(tmp_path, "tile_quantization")["finished_at"]
    result = run_benchmarks("--quick", "--only", "clock_domains", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert load(tmp_path, "tile_quantization")["finished_at"] == before
    text = (tmp_path / "RESULTS.md").read_text()
    assert "(`percentiles`)" in text
    assert "(`clock_domains`)" in text


def test_unknown_benchmark_is_a_usage_error() -> None:
    result = run_benchmarks("--quick", "--only", "nope")
    assert result.returncode == 2
    assert "invalid choice" in result.stderr
