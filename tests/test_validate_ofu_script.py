"""benchmarks/gpu/validate_ofu.py end to end on the CPU: numpy stand-in GEMMs, the fake NVML, the real NvmlSource."""

from __future__ import annotations

import importlib
import importlib.util
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from otel_ofu import ofu_math
from otel_ofu.testing.fake_nvml import compiler

ROOT = Path(__file__).resolve().parents[1]
MODULE = "benchmarks.gpu.validate_ofu"


def run_script(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", MODULE, *args], cwd=ROOT, capture_output=True, text=True, timeout=180, check=False
    )


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], Path]:
    out = tmp_path_factory.mktemp("validate")
    if compiler() is None:
        return subprocess.CompletedProcess([], 0, "", "no compiler"), out
    return run_script("--dry-run", "--out", str(out), "--precisions", "bf16,tf32,fp8"), out


@pytest.fixture
def finished(
    dry_run: tuple[subprocess.CompletedProcess[str], Path], require: Callable[[bool, str], None]
) -> tuple[dict[str, Any], str]:
    require(compiler() is not None, "gcc is needed to build the fake NVML library")
    result, out = dry_run
    assert result.returncode == 0, result.stderr
    data: dict[str, Any] = json.loads((out / "validate_ofu.json").read_text())
    return data, (out / "validate_ofu.md").read_text()


def test_dry_run_measures_every_shape_through_the_nvml_source(finished: tuple[dict[str, Any], str]) -> None:
    data, _ = finished
    header, rows = data["header"], data["rows"]
    assert header["dry_run"] is True
    assert "fake NVML" in header["meter"]
    assert {row["precision"] for row in rows} == {"bf16", "tf32", "fp8"}
    assert {row["shape_set"] for row in rows} == {"aligned", "unaligned", "small"}
    for row in rows:
        assert row["skipped"] is None
        assert row["ofu_path"] == "cycles"  # the fake GPU has GPM cycle counters: the exact path is taken
        assert 0.0 < row["mfu"] <= 1.0
        assert row["interval_s"] == pytest.approx(row["event_s"], rel=1e-6)


def test_ofu_read_back_is_the_scripted_activity_and_the_correction_is_applied(
    finished: tuple[dict[str, Any], str],
) -> None:
    data, _ = finished
    for row in data["rows"]:
        m, n, k = row["shape"]
        # the dry run's "GPU" does the padded FLOPs of its kernel tile, so OFU >= MFU and padding shows as raw error
        assert row["ofu"] >= row["mfu"] - 1e-6
        tile = tuple(row["tile"])
        assert row["factor"] == pytest.approx(ofu_math.tile_quantization(m, n, k, tile).factor)
        assert row["ofu_corrected"] == pytest.approx(row["ofu"] * row["factor"])
        assert row["error_raw_pp"] == pytest.approx(abs(row["ofu"] - row["mfu"]) * 100)
        assert row["error_corrected_pp"] == pytest.approx(abs(row["ofu_corrected"] - row["mfu"]) * 100)
    aligned = [row for row in data["rows"] if row["shape_set"] == "aligned"]
    assert all(row["error_raw_pp"] < 0.01 for row in aligned)  # no padding, nothing to correct
    padded = [row for row in data["rows"] if row["factor"] < 0.99]
    assert padded
    assert all(row["error_corrected_pp"] < row["error_raw_pp"] for row in padded)


def test_summary_and_markdown_table(finished: tuple[dict[str, Any], str]) -> None:
    data, text = finished
    summary = data["summary"]
    assert summary["shapes_measured"] == len(data["rows"])
    assert set(summary["by_precision"]) == {"bf16", "tf32", "fp8"}
    share = summary["all"]["within_2pp_corrected"]
    assert 0.0 <= share <= 1.0
    assert summary["all"]["mae_corrected_pp"] < summary["all"]["mae_raw_pp"]
    measured = len(data["rows"])
    assert (summary["all"]["n_raw"], summary["all"]["n_corrected"]) == (measured, measured)
    assert "| precision | shapes | M x N x K |" in text
    assert "within 2 pp corrected" in text
    assert f"| all | {measured} | {measured} | {measured} |" in text
    assert "Target: OFU within" in text
    assert "dry run" in text


def test_each_mae_and_share_says_how_many_shapes_it_is_over(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(ROOT))
    script = importlib.import_module(MODULE)
    full = script.Row("bf16", "aligned", (256, 256, 256), mfu=0.50, ofu=0.51, factor=1.0)
    uncorrected = script.Row("bf16", "unaligned", (200, 300, 250), mfu=0.40, ofu=0.45)  # no tile factor
    no_mfu = script.Row("bf16", "small", (64, 64, 64), ofu=0.2, factor=0.9)
    skipped = script.Row("fp8", "small", (64, 64, 64), skipped="no fp8 here")
    rows = [full, uncorrected, no_mfu, skipped]
    summary = script.summarise(rows)
    assert (summary["shapes_measured"], summary["shapes_skipped"]) == (1, 3)
    stats = summary["all"]  # over the three shapes that ran, each figure saying how many it is over
    assert (stats["n"], stats["n_raw"], stats["n_corrected"]) == (3, 2, 1)
    assert stats["mae_raw_pp"] == pytest.approx((1.0 + 5.0) / 2)
    assert stats["within_2pp_raw"] == 0.5
    assert (stats["mae_corrected_pp"], stats["within_2pp_corrected"]) == (pytest.approx(1.0), 1.0)
    assert set(summary["by_precision"]) == {"bf16"}
    header = {"mode": "dry run", "device": "cpu", "meter": "fake", "host": "h", "seconds": 0.1, "dry_run": True}
    text = script.markdown(rows, summary, header)
    assert "1 shapes measured, 3 without a corrected error" in text
    assert "| all | 3 | 2 | 1 | 3.00 | 1.00 | 50% | 100% |" in text
    assert "of shapes: met (100% of 1)" in text


def test_without_a_gpu_it_says_to_use_the_dry_run(tmp_path: Path) -> None:
    if importlib.util.find_spec("torch") is not None:
        pytest.skip("torch is installed here: the GPU mode would try the real device")
    result = run_script("--out", str(tmp_path))
    assert result.returncode == 1
    assert "--dry-run" in result.stderr
    assert not (tmp_path / "validate_ofu.json").exists()
