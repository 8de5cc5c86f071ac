"""The bill through the real processes: ``otel-ofu run`` scraping a dcgm-exporter page on loopback, exporting OTLP to
``otel-ofu collector``, whose records file is read back.

Six H100s of one job on the page, three of them with their tensor activity blank (DCGM could not profile them): all
six are billed, the three without OFU as ``unmeasured`` time, with their power, and the fleet counts six GPUs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from otel_ofu import names
from tests.collector_helpers import CollectorProcess
from tests.exporter_server import ExporterServer, serving

ROOT = Path(__file__).resolve().parents[1]
H100 = "NVIDIA H100 80GB HBM3"
C = names.OfuLossCause


def page(gpus: int = 6, blank: frozenset[int] = frozenset({3, 4, 5})) -> str:
    """A dcgm-exporter page: every GPU at the tensor clock (1830 MHz) and 500 W; tensor activity 0.4, blank (no
    value: DCGM's profiling could not watch it) on the ``blank`` ones."""
    lines = []
    for gpu in range(gpus):
        labels = (
            f'gpu="{gpu}",UUID="GPU-0000000{gpu}-aaaa-bbbb-cccc-dddddddddddd",device="nvidia{gpu}",'
            f'modelName="{H100}",Hostname="node-1"'
        )
        lines.append(f"DCGM_FI_DEV_SM_CLOCK{{{labels}}} 1830")
        lines.append(f"DCGM_FI_DEV_POWER_USAGE{{{labels}}} 500")
        if gpu not in blank:
            lines.append(f"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{{labels}}} 0.4")
    return "\n".join(lines) + "\n"


@pytest.fixture
def exporter() -> Iterator[ExporterServer]:
    with serving() as server:
        yield server


def test_gpus_without_ofu_are_billed_through_the_real_processes(exporter: ExporterServer, tmp_path: Path) -> None:
    records = tmp_path / "windows.jsonl"
    collector = CollectorProcess.start(
        "--listen", "127.0.0.1:0", "--window", "2", "--lateness", "1", "--record-outputs", str(records)
    )
    try:
        port = collector.grpc_port
        env = {key: value for key, value in os.environ.items() if not key.startswith(("OTEL_", "OTEL_OFU"))}
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://127.0.0.1:{port}"
        run = subprocess.run(
            [
                *(sys.executable, "-m", "otel_ofu.cli", "run", "--source", "dcgm-exporter"),
                *("--url", exporter.serve(page()), "--interval", "0.5", "--duration", "7", "--job-id", "train"),
            ],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert run.returncode == 0, run.stderr
    finally:
        assert collector.terminate() == 0
    windows = [json.loads(line) for line in records.read_text().splitlines() if line.strip()]
    jobs = [job for window in windows for job in window["jobs"] if job["job_id"] == "train"]
    assert jobs
    gpu_time = sum(job["loss"]["gpu_time_s"] for job in jobs)
    unmeasured = sum(job["loss"]["lost_s"].get(C.UNMEASURED, 0.0) for job in jobs)
    energy = sum(job["loss"]["energy_j"] for job in jobs)
    # Every GPU's time is billed and the three without OFU account for exactly half of it: they reported the same
    # intervals as the other three. The job's energy is 500 W over all six GPUs' seconds.
    assert gpu_time > 5 * 6  # about 7 s of six GPUs, less the first scrape that only marks the start
    assert unmeasured == pytest.approx(gpu_time / 2, rel=1e-9)
    assert energy == pytest.approx(500.0 * gpu_time, rel=1e-9)
    # OFU = 0.4 at the tensor clock over the measured half: job.ofu = 0.2 of all its GPU time, and the shares add up.
    for job in jobs:
        assert job["ofu"] == pytest.approx(0.2)
        assert job["ofu"] + sum(job["loss"]["shares"].values()) == pytest.approx(1.0, abs=1e-12)
    # A window the run covered whole counts six GPUs, in the fleet and in the job.
    full = [window for window in windows[1:-1] if window["jobs"]]
    assert full
    for window in full:
        (group,) = window["groups"]
        assert group["gpus"] == pytest.approx(6.0)
        histogram = group["histogram"]
        assert histogram["zero_count"] + sum(histogram["counts"]) == 3  # the percentiles: the three measured GPUs
