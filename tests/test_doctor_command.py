"""``otel-ofu doctor``: per GPU, which outputs it will have and, for each one missing, why and the exact line to add.

Against real pages (tests/data) served by a real HTTP server on loopback, through the real command line.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from otel_ofu import cli
from tests.exporter_server import ExporterServer, serving
from tests.test_amd_exporter_source import BUSY_UUID, mi300x_page, without_gpu_activity
from tests.test_dcgm_exporter_source import NODE_EXPORTER_PAGE


@pytest.fixture
def exporter() -> Iterator[ExporterServer]:
    with serving() as server:
        yield server


def doctor(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = cli.main(["doctor", *args])
    return code, capsys.readouterr().out


def doctor_json(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, list[dict[str, Any]]]:
    code, out = doctor([*args, "--format", "json"], capsys)
    return code, [json.loads(line) for line in out.splitlines()]


def test_a_new_generation_page_gives_every_output_but_the_job(
    exporter: ExporterServer, shared_fixtures: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    page = (shared_fixtures / "dcgm_exporter_h100_generation_49.prom").read_text()
    url = exporter.serve(page)
    code, (gpu,) = doctor_json(["--source", "dcgm-exporter", "--url", url], capsys)
    assert code == 0
    outputs = gpu["outputs"]
    assert outputs["ofu"]["present"] is True
    assert outputs["ofu"]["value"] == pytest.approx(0.479508, abs=1e-6)  # 0.5 x 1755 / 1830
    assert outputs["ofu_raw"]["present"] is True  # the page's own max clock (DCGM_FI_DEV_SM_MAX_CLOCK_HERTZ)
    for output in ("loss_split", "energy", "throttle", "links"):
        assert outputs[output]["present"] is True, output
    job = outputs["job"]
    assert job["present"] is False
    assert "--kubernetes" in job["fix"]
    assert "--hpc-job-mapping-dir" in job["fix"]


def test_the_default_counters_page_says_which_counters_file_lines_to_add(
    exporter: ExporterServer, shared_fixtures: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The DigitalOcean H100 page: dcgm-exporter with only clocks (SM 345 MHz). No tensor activity: no OFU.
    url = exporter.serve((shared_fixtures / "dcgm_exporter_h100_digitalocean_docs.prom").read_text())
    code, out = doctor(["--source", "dcgm-exporter", "--url", url], capsys)
    assert code == 1  # no GPU gives OFU: a script can tell
    assert "GPU-927d7444-b45a-7c49-8402-5e686e46a026" in out
    # The exact lines of dcgm-exporter's counters file (DCGM FIELD, Prometheus metric type, help message).
    assert "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE, gauge, " in out
    assert "DCGM_FI_PROF_SM_ACTIVE, gauge, " in out  # the finer loss split needs SM activity
    assert "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION, counter, " in out
    assert "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS, gauge, " in out
    assert "DCGM_FI_PROF_PCIE_TX_BYTES, gauge, " in out
    assert "0 of 1 GPUs give OFU" in out


def test_a_model_without_a_max_clock_gets_the_option_to_add(
    exporter: ExporterServer, shared_fixtures: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # TITAN V (dcgm-exporter issue 58): not in the catalog, no max clock on the page.
    page = (shared_fixtures / "dcgm_exporter_titanv_issue58.prom").read_text()
    tensor = page.replace("DCGM_FI_DEV_SM_CLOCK{", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{").replace("} 135", "} 0.4")
    url = exporter.serve(page + tensor.split("\n", 2)[2])
    code, gpus = doctor_json(["--source", "dcgm-exporter", "--url", url], capsys)
    assert code == 1
    ofu = gpus[0]["outputs"]["ofu"]
    assert ofu["present"] is False
    assert "no max SM clock" in ofu["why"]
    assert '--max-sm-clock "NVIDIA TITAN V=MHZ"' in ofu["fix"]
    assert "DCGM_FI_DEV_MAX_SM_CLOCK, gauge, " in ofu["fix"]
    # With the option, the same page gives OFU: 0.4 x 135 / 1455.
    code, gpus = doctor_json(
        ["--source", "dcgm-exporter", "--url", url, "--max-sm-clock", "NVIDIA TITAN V=1455"], capsys
    )
    assert code == 0
    assert gpus[0]["outputs"]["ofu"]["value"] == pytest.approx(0.4 * 135 / 1455)


def test_mig_instances_with_pods_name_the_option_that_gives_their_jobs(
    exporter: ExporterServer, shared_fixtures: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = exporter.serve((shared_fixtures / "dcgm_exporter_h100_mig_k8s_issue512.prom").read_text())
    code, gpus = doctor_json(["--source", "dcgm-exporter", "--url", url], capsys)
    assert code == 1
    assert [gpu["gpu.mig.instance_id"] for gpu in gpus] == [7, 8, 9]
    with_pod = gpus[0]["outputs"]["job"]
    assert with_pod["present"] is False
    assert "text-embedding-predictor" in with_pod["why"]
    assert "--k8s-pods-url" in with_pod["fix"]


def test_an_amd_page_without_gpu_util_says_what_stood_in_and_what_to_turn_on(
    exporter: ExporterServer, shared_fixtures: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = exporter.serve(without_gpu_activity(mi300x_page(shared_fixtures)))
    code, gpus = doctor_json(["--source", "amd-exporter", "--url", url], capsys)
    assert code == 0
    busy = next(gpu for gpu in gpus if gpu["hw.id"] == BUSY_UUID)
    ofu = busy["outputs"]["ofu"]
    assert ofu["present"] is True
    assert "gpu_gfx_activity" in ofu["note"]  # which one was used
    assert '"GPU_PROF_GUI_UTIL_PERCENT"' in ofu["fix"]
    assert '"ProfilerMetrics"' in ofu["fix"]
    assert busy["outputs"]["loss_split"]["present"] is False  # no SM activity in NVIDIA's sense from this exporter
    # A CPX partition gets no stand-in: its fix is the one field it lacks, not the MFMA activity it has.
    partition = next(gpu for gpu in gpus if gpu["gpu.compute_partition"] == "cpx")
    assert partition["outputs"]["ofu"]["present"] is False
    assert '"GPU_PROF_GUI_UTIL_PERCENT"' in partition["outputs"]["ofu"]["fix"]
    assert "GPU_PROF_TENSOR_ACTIVE_PERCENT" not in partition["outputs"]["ofu"]["fix"]


def test_a_page_that_is_not_the_exporters_is_one_line_and_exit_1(
    exporter: ExporterServer, capsys: pytest.CaptureFixture[str]
) -> None:
    url = exporter.serve(NODE_EXPORTER_PAGE)
    code, out = doctor(["--source", "dcgm-exporter", "--url", url], capsys)
    assert code == 1
    assert "no dcgm-exporter metric on the page" in out
    assert "0 of 0 GPUs give OFU" in out


def test_a_source_that_cannot_open_is_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["doctor", "--source", "dcgm-exporter"])
    assert code == 2
    assert "needs --url" in capsys.readouterr().err


def test_the_dmon_capture_of_the_dcgm_guide_asks_for_the_clock_field(
    shared_fixtures: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The guide's A100 capture from its first busy sample on (TENSO 0.928): no clock in its -e list, so no OFU.
    lines = (shared_fixtures / "dcgmi_dmon_dcgm_guide_a100.txt").read_text().splitlines()
    busy = tmp_path / "busy.txt"
    busy.write_text("\n".join(lines[:3] + lines[7:]) + "\n")
    code, gpus = doctor_json(["--source", "replay", "--file", str(busy), "--model", "NVIDIA A100-SXM4-40GB"], capsys)
    assert code == 1
    ofu = gpus[0]["outputs"]["ofu"]
    assert "SM clock" in ofu["why"]
    assert "dcgmi dmon -e 1001,1004,1005,100,113" in ofu["fix"]
    # The idle first sample needs no clock: tensor activity 0 is OFU 0.
    code, gpus = doctor_json(
        ["--source", "replay", "--file", str(shared_fixtures / "dcgmi_dmon_dcgm_guide_a100.txt")], capsys
    )
    assert code == 0
    assert gpus[0]["outputs"]["ofu"]["value"] == 0.0
