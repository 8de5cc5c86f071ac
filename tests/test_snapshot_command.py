"""``otel-ofu snapshot``: JSON lines keyed by the contract's names, for the exporter, replay and sim sources."""

from __future__ import annotations

import http.server
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from otel_ofu import cli, names
from otel_ofu.model import GpuError, GpuIdentity, GpuReading, Snapshot, SourceUnavailable
from otel_ofu.sources.capture import CaptureWriter, ReplaySource
from otel_ofu.sources.dcgmi_dmon import DcgmiDmonSource
from otel_ofu.sources.factory import SOURCE_KINDS, open_source
from otel_ofu.testing.fake_nvml import FakeNvml

H100_LABELS = (
    'gpu="0",UUID="GPU-927d7444-b45a-7c49-8402-5e686e46a026",pci_bus_id="00000000:00:09.0",device="nvidia0",'
    'modelName="NVIDIA H100 80GB HBM3",Hostname="6d6d7dc3ce21",DCGM_FI_DRIVER_VERSION="535.183.01"'
)
H100_PAGE = f"DCGM_FI_DEV_SM_CLOCK{{{H100_LABELS}}} 1755\nDCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{{H100_LABELS}}} 0.5\n"


@pytest.fixture
def page() -> Iterator[tuple[str, dict[str, Any]]]:
    """A one-page HTTP server: ``state["body"]`` and ``state["status"]`` are what it answers."""
    state: dict[str, Any] = {"body": H100_PAGE, "status": 200}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            data = str(state["body"]).encode()
            self.send_response(int(state["status"]))
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *_: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/metrics", state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def run_snapshot(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, list[dict[str, Any]], str]:
    """The real ``otel-ofu`` entry point, in process."""
    code = cli.main(["snapshot", *argv])
    out, err = capsys.readouterr()
    lines = [json.loads(line) for line in out.splitlines() if line.strip()] if "--format" not in argv else []
    return code, lines, out + err


def test_dcgm_exporter_json_line(page: tuple[str, dict[str, Any]], capsys: pytest.CaptureFixture[str]) -> None:
    url, _ = page
    code, lines, _ = run_snapshot(["--source", "dcgm-exporter", "--url", url], capsys)
    assert code == 0
    (line,) = lines
    assert line[names.HW_ID] == "GPU-927d7444-b45a-7c49-8402-5e686e46a026"
    assert line[names.HW_MODEL] == "NVIDIA H100 80GB HBM3"
    assert line[names.HOST_NAME] == "6d6d7dc3ce21"
    assert line[names.GPU_INDEX] == 0
    assert line[names.HW_TYPE] == "gpu"
    assert line[names.GPU_TENSOR_ACTIVE.name] == 0.5
    assert line[names.GPU_CLOCK_SM.name] == 1755e6
    assert line[names.GPU_CLOCK_SM_MAX.name] == 1980e6  # from the catalog: the exporter has no field 113
    assert line[names.GPU_OFU_RAW.name] == pytest.approx(0.5 * 1755 / 1980)
    assert 0 < line[names.GPU_OFU.name] <= 1
    # Unknown precision: no achieved FLOP/s; no SM/DRAM activity scraped: absent, not 0 or null.
    for absent in (names.GPU_FLOPS_ACHIEVED.name, names.GPU_SM_ACTIVE.name, names.GPU_DRAM_ACTIVE.name, "error"):
        assert absent not in line


def test_dcgm_exporter_gpus_without_values_are_error_lines(
    page: tuple[str, dict[str, Any]], capsys: pytest.CaptureFixture[str], shared_fixtures: Path
) -> None:
    url, state = page
    state["body"] = (shared_fixtures / "dcgm_exporter_titanv_issue58.prom").read_text()
    code, lines, _ = run_snapshot(["--source", "dcgm-exporter", "--url", url], capsys)
    assert code == 1
    assert len(lines) == 5
    for line in lines:
        assert line[names.ERROR_REASON] == names.ErrorReason.NO_VALUE
        assert "tensor pipe activity" in line["error"]
        assert line[names.HW_MODEL] == "NVIDIA TITAN V"
        assert names.GPU_OFU.name not in line
        assert names.GPU_TENSOR_ACTIVE.name not in line


def test_dcgm_exporter_down_is_one_scrape_error_line(
    page: tuple[str, dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    url, state = page
    state["status"] = 503
    code, lines, _ = run_snapshot(["--source", "dcgm-exporter", "--url", url], capsys)
    assert code == 1
    (line,) = lines
    assert line[names.ERROR_REASON] == names.ErrorReason.SCRAPE
    assert "HTTP 503" in line["error"]


def test_table_format(page: tuple[str, dict[str, Any]], capsys: pytest.CaptureFixture[str]) -> None:
    url, _ = page
    code, _, output = run_snapshot(["--source", "dcgm-exporter", "--url", url, "--format", "table"], capsys)
    assert code == 0
    assert "otel-ofu snapshot" in output
    assert "1755" in output


def test_replay_of_our_capture(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    hints = {names.JOB_ID: "job-7", names.GPU_PRECISION: "bf16", names.JOB_SCHEDULER: "slurm"}
    gpu = GpuIdentity("GPU-1", "NVIDIA H100 80GB HBM3", 0, "node-1", hints=hints)
    lost = GpuIdentity("GPU-2", "NVIDIA H100 80GB HBM3", 1, "node-1")
    odd = GpuIdentity("GPU-3", "NVIDIA H100 80GB HBM3", 2, "node-1")
    capture = tmp_path / "trace.jsonl"
    with CaptureWriter(capture) as writer:
        writer.write(
            Snapshot(
                readings=(
                    GpuReading(gpu, 0, 10**10, tensor_active=0.6, sm_clock_hz=1.98e9, max_sm_clock_hz=1.98e9),
                    GpuReading(odd, 0, 10**10, tensor_active=1.5, sm_clock_hz=1.98e9),
                ),
                errors=(GpuError(names.ErrorReason.GPU_LOST, "GPU is lost", gpu=lost),),
            )
        )
    code, lines, _ = run_snapshot(["--source", "replay", "--file", str(capture)], capsys)
    assert code == 0
    good, invalid, gone = lines
    assert good[names.JOB_ID] == "job-7"
    assert good[names.GPU_PRECISION] == "bf16"
    assert good[names.GPU_OFU_RAW.name] == pytest.approx(0.6)
    assert good[names.GPU_FLOPS_ACHIEVED.name] == pytest.approx(good[names.GPU_OFU.name] * 989.4e12)
    assert invalid[names.ERROR_REASON] == names.ErrorReason.INVALID_VALUE
    assert names.GPU_TENSOR_ACTIVE.name not in invalid  # 1.5 is not a fraction: left out
    assert invalid[names.GPU_CLOCK_SM.name] == 1.98e9  # the clock on its own is fine
    assert gone[names.ERROR_REASON] == names.ErrorReason.GPU_LOST
    assert gone[names.HW_ID] == "GPU-2"


def test_replay_of_dcgmi_text(shared_fixtures: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = shared_fixtures / "dcgmi_dmon_issue151_mig.txt"
    code, lines, output = run_snapshot(["--source", "replay", "--file", str(path)], capsys)
    assert code == 0  # the idle instances' OFU is 0: tensor activity 0 needs no clock
    assert "replay: dcgmi dmon output" in output
    assert "Source" not in output  # the user reads what the file is, never a class name
    assert [line[names.GPU_MIG_INSTANCE_ID] for line in lines] == [21, 22, 29, 30, 31, 28, 35]
    idle = [line for line in lines if line[names.GPU_TENSOR_ACTIVE.name] == 0.0]
    assert [line[names.GPU_OFU.name] for line in idle] == [0.0, 0.0, 0.0]
    busy = [line for line in lines if line not in idle]
    assert all("SM clock" in line["error"] for line in busy)  # the busy ones lack the clock their OFU needs


def test_sim_reads_an_interval_without_sleeping(capsys: pytest.CaptureFixture[str]) -> None:
    code, lines, _ = run_snapshot(["--source", "sim", "--interval", "30", "--seed", "3"], capsys)
    assert code == 0
    read = [line for line in lines if "error" not in line]
    assert len(read) >= 20
    assert all(0 <= line[names.GPU_OFU.name] <= 1 for line in read)
    assert {line[names.JOB_ID] for line in read} >= {"job-1001", "job-1003"}


def test_a_url_that_is_not_one_is_a_one_line_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["snapshot", "--source", "dcgm-exporter", "--url", "ftp://x"])
    assert exited.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "--url" in line
    assert "http://" in line


def test_dcgm_exporter_blank_tensor_keeps_the_clock_beside_the_error(
    page: tuple[str, dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    url, state = page
    state["body"] = H100_PAGE.replace("} 0.5", "} 140737488355328.0")  # DCGM's blank sentinel for TPA
    code, lines, _ = run_snapshot(["--source", "dcgm-exporter", "--url", url], capsys)
    assert code == 1
    (line,) = lines
    assert line[names.ERROR_REASON] == names.ErrorReason.NO_VALUE
    assert "tensor pipe activity" in line["error"]
    assert line[names.GPU_CLOCK_SM.name] == 1755e6  # what the exporter did give stays
    assert names.GPU_TENSOR_ACTIVE.name not in line
    assert names.GPU_OFU.name not in line


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--source", "dcgm-exporter"], "needs --url"),
        (["--source", "replay"], "needs --file"),
        (["--source", "replay", "--file", "/nonexistent/trace.jsonl"], "cannot open capture"),
        (["--source", "sim", "--calibration", "bogus"], "job:ID=FACTOR"),
    ],
)
def test_a_source_that_cannot_open_says_why_in_one_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["snapshot", *argv]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    (line,) = err.strip().splitlines()
    assert message in line


# --- the source factory behind --source ------------------------------------------------------------------


def test_auto_uses_nvml_or_dcgm_or_says_why_not() -> None:
    try:
        source, why = open_source("auto")
    except SourceUnavailable as error:  # no GPU here: both reasons, in one line
        message = str(error)
        assert "\n" not in message
        assert "NVML:" in message
        assert "DCGM:" in message
        assert "--source dcgm-exporter" in message
    else:  # a GPU host
        source.close()
        assert why.startswith("auto: using ")


def test_replay_tells_captures_from_dcgmi_text(tmp_path: Path, shared_fixtures: Path) -> None:
    capture = tmp_path / "trace.jsonl"
    with CaptureWriter(capture) as writer:
        writer.write(Snapshot())
    source, why = open_source("replay", file=capture)
    assert isinstance(source, ReplaySource)
    source.close()
    source, why = open_source("replay", file=shared_fixtures / "dcgmi_dmon_issue244_multiplex.txt")
    assert isinstance(source, DcgmiDmonSource)
    assert "dcgmi dmon output" in why
    source.close()
    other = tmp_path / "notes.txt"
    other.write_text("hello\n")
    with pytest.raises(SourceUnavailable, match="neither"):
        open_source("replay", file=other)


def test_unknown_kind() -> None:
    assert SOURCE_KINDS == ("auto", "nvml", "dcgm", "dcgm-exporter", "amd-exporter", "replay", "sim")
    with pytest.raises(SourceUnavailable, match="unknown source 'gpu'"):
        open_source("gpu")


def test_nvml_against_the_fake_library(fake: FakeNvml, capsys: pytest.CaptureFixture[str]) -> None:
    busy = fake.add_gpu("NVIDIA H100 80GB HBM3", sm_clock_mhz=1755)
    fake.set_tensor_util(busy, 50.0)
    fake.add_gpu("NVIDIA H100 80GB HBM3", gpm=False)
    code, lines, output = run_snapshot(["--source", "nvml", "--interval", "0.05", "--host", "n1"], capsys)
    assert code == 0
    assert "nvml:" in output
    good, no_gpm = sorted(lines, key=lambda line: int(line[names.GPU_INDEX]))
    assert good[names.HW_ID] == fake.uuid_of(busy)
    assert good[names.HOST_NAME] == "n1"
    assert good[names.GPU_TENSOR_ACTIVE.name] == pytest.approx(0.5)
    assert good[names.GPU_CLOCK_SM.name] == pytest.approx(1755e6)
    assert good[names.GPU_CLOCK_SM_MAX.name] == pytest.approx(1980e6)
    assert "error" not in good
    # No GPM: one line with the clocks it has and why TPA is not there; no OFU, least of all 0.
    assert no_gpm[names.ERROR_REASON] == names.ErrorReason.NOT_SUPPORTED
    assert "GPM" in no_gpm["error"]
    assert no_gpm[names.GPU_CLOCK_SM.name] == pytest.approx(1980e6)
    assert names.GPU_OFU.name not in no_gpm
    assert names.GPU_TENSOR_ACTIVE.name not in no_gpm


def test_snapshot_takes_runs_nvml_library_option(fake_library: FakeNvml, capsys: pytest.CaptureFixture[str]) -> None:
    fake = fake_library
    busy = fake.add_gpu("NVIDIA H100 80GB HBM3", sm_clock_mhz=1755)
    fake.set_tensor_util(busy, 50.0)
    argv = ["--source", "nvml", "--nvml-library", str(fake.path), "--interval", "0.05", "--clock-sample-hz", "50"]
    code, lines, _ = run_snapshot(argv, capsys)  # the library is the option's, not installed by the test
    assert code == 0
    (line,) = lines
    assert line[names.HW_ID] == fake.uuid_of(busy)
    assert line[names.GPU_TENSOR_ACTIVE.name] == pytest.approx(0.5)


def test_console_script(shared_fixtures: Path) -> None:
    script = Path(sys.executable).with_name("otel-ofu")
    if not script.exists():
        pytest.skip("the otel-ofu console script is not installed next to this interpreter")
    path = shared_fixtures / "dcgmi_dmon_issue244_multiplex.txt"
    done = subprocess.run(
        [str(script), "snapshot", "--source", "replay", "--file", str(path), "--format", "json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1, done.stderr  # every GPU of the first sample is N/A
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert [line[names.GPU_INDEX] for line in lines] == list(range(8))
    assert all(line[names.ERROR_REASON] == names.ErrorReason.NO_VALUE for line in lines)
