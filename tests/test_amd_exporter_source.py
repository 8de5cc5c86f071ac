"""The AMD Device Metrics Exporter source against pages in the exporter's documented format on a real HTTP server.

The pages start from the real MI300X lines in tests/data (their label sets, whole GPUs and a CPX partition, with and
without pod labels); the other fields' lines are written here with the same labels, as the exporter's metrics list
documents them (names, units, ``clock_type`` and ``clock_index`` labels), since the real sample carries only
``gpu_gfx_activity``.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from otel_ofu import cli, names
from otel_ofu.gpu_samples import compute_snapshot
from otel_ofu.model import GpuError, GpuReading, Snapshot, SourceUnavailable
from otel_ofu.sources.amd_exporter import AmdExporterSource, normalize_url
from otel_ofu.sources.factory import open_source
from tests.exporter_server import ExporterServer, Route, Ticks, serving

MI300X = "AMD Instinct MI300X OAM"
BUSY_UUID = "3dff74a1-0000-1000-80d3-0c4c1df1df58"  # gpu_id 0, tw038, in pod default/high-utilization-57ls6
IDLE_UUID = "ccff74a1-0000-1000-80e0-c6d49f5b0d86"  # gpu_id 2, tw038, no pod
CPX_UUID = "c3ff74a1-0000-0000-80ff-88426fc31c9e"  # gpu_id 47: partition 0 of a CPX GPU on tw009


@pytest.fixture
def exporter() -> Iterator[ExporterServer]:
    with serving() as server:
        yield server


def real_labels(shared_fixtures: Path) -> dict[str, str]:
    """The label text (inside the braces) of each real line, by its gpu_uuid."""
    found = {}
    for line in (shared_fixtures / "amd_metrics_exporter_mi300x_kaiwo.prom").read_text().splitlines():
        labels = line.split("{", 1)[1].rsplit("}", 1)[0]
        uuid = re.search(r'gpu_uuid="([^"]+)"', labels)
        assert uuid is not None
        found[uuid.group(1)] = labels
    return found


def cpx_partition(labels: str, partition: int) -> str:
    """Partition ``partition`` of the same CPX GPU: its own gpu_uuid and gpu_id, the GPU's serial number (written for
    these tests from the real partition 0's labels, as the exporter labels its partitions)."""
    return (
        labels.replace(CPX_UUID, CPX_UUID[:-1] + str(partition))
        .replace('gpu_id="47"', f'gpu_id="{47 + partition}"')
        .replace('gpu_partition_id="0"', f'gpu_partition_id="{partition}"')
    )


def line(metric: str, labels: str, value: float | str, **extra: str) -> str:
    more = "".join(f'{key}="{val}",' for key, val in extra.items())
    return f"{metric}{{{more}{labels}}} {value}"


def clocks(labels: str, system_mhz: list[float], max_mhz: float = 2100) -> list[str]:
    """gpu_clock and gpu_max_clock as the exporter prints them: one series per clock domain, by clock_index and
    clock_type; a memory clock beside the engine (system) clocks, which OFU must not take."""
    lines = []
    for index, mhz in enumerate(system_mhz):
        lines.append(line("gpu_clock", labels, mhz, clock_index=str(index), clock_type="system"))
        lines.append(line("gpu_max_clock", labels, max_mhz, clock_index=str(index), clock_type="system"))
    lines.append(line("gpu_clock", labels, 1300, clock_index="8", clock_type="memory"))
    return lines


def mi300x_page(shared_fixtures: Path, energy_step: int = 0) -> str:
    """The real lines, and beside them, with the same labels:

    - GPU 0 (busy, in a pod): MFMA 80 %, GPU activity 90 %, four engine clocks 2100/2050/2000/1950 MHz, 650 W;
    - GPU 2 (idle): MFMA 0 %, activity 0 %, engine clock 132 MHz, 140 W;
    - the CPX GPU, 8 partitions (gpu_id 47-54): partition 0 carries the GPU's engine clock (1800 MHz), power
      (600 W) and energy; partitions 1-7 print power 0 and no clock, as the exporter documents. Partition 0: MFMA
      50 %, activity 100 %; the others MFMA 30 %, activity 50 %.

    The energy counters (uJ) grow by 10 s of their power per ``energy_step``."""
    labels = real_labels(shared_fixtures)
    busy, idle, cpx = labels[BUSY_UUID], labels[IDLE_UUID], labels[CPX_UUID]
    lines = (shared_fixtures / "amd_metrics_exporter_mi300x_kaiwo.prom").read_text().splitlines()
    lines += [
        "# HELP gpu_prof_tensor_active_percent MFMA Utilization Unit percent",
        "# TYPE gpu_prof_tensor_active_percent gauge",
        line("gpu_prof_tensor_active_percent", busy, 80),
        line("gpu_prof_tensor_active_percent", idle, 0),
        line("gpu_prof_tensor_active_percent", cpx, 50),
        *(line("gpu_prof_tensor_active_percent", cpx_partition(cpx, p), 30) for p in range(1, 8)),
        "# HELP gpu_prof_gui_util_percent Percentage of the time that GUI is active",
        "# TYPE gpu_prof_gui_util_percent gauge",
        line("gpu_prof_gui_util_percent", busy, 90),
        line("gpu_prof_gui_util_percent", idle, 0),
        line("gpu_prof_gui_util_percent", cpx, 100),
        *(line("gpu_prof_gui_util_percent", cpx_partition(cpx, p), 50) for p in range(1, 8)),
        "# HELP gpu_clock List of current GPU clock frequencies in MHz",
        "# TYPE gpu_clock gauge",
        *clocks(busy, [2100, 2050, 2000, 1950]),
        *clocks(idle, [132]),
        *clocks(cpx, [1800]),
        "# HELP gpu_power_usage GPU Power usage in Watts",
        "# TYPE gpu_power_usage gauge",
        line("gpu_power_usage", busy, 650),
        line("gpu_power_usage", idle, 140),
        line("gpu_power_usage", cpx, 600),
        *(line("gpu_power_usage", cpx_partition(cpx, p), 0) for p in range(1, 8)),
        "# HELP gpu_energy_consumed Accumulated energy consumed by the GPU in uJ",
        "# TYPE gpu_energy_consumed gauge",
        line("gpu_energy_consumed", busy, 9_000_000_000 + energy_step * 6_500_000_000),
        line("gpu_energy_consumed", idle, 4_000_000_000 + energy_step * 1_400_000_000),
        line("gpu_energy_consumed", cpx, 7_000_000_000 + energy_step * 6_000_000_000),
    ]
    return "\n".join(lines) + "\n"


def by_uuid(snapshot: Snapshot) -> dict[str, GpuReading]:
    return {reading.gpu.uuid: reading for reading in snapshot.readings}


def errors_by_uuid(snapshot: Snapshot) -> dict[str, GpuError]:
    return {error.gpu.uuid: error for error in snapshot.errors if error.gpu is not None}


def test_identity_from_the_labels(exporter: ExporterServer, shared_fixtures: Path) -> None:
    source = AmdExporterSource(exporter.serve(mi300x_page(shared_fixtures)), clock=Ticks())
    readings = by_uuid(source.read())
    assert len(readings) == 10  # two whole GPUs and the CPX GPU's eight partitions
    busy, idle, cpx = readings[BUSY_UUID].gpu, readings[IDLE_UUID].gpu, readings[CPX_UUID].gpu
    assert (busy.model, busy.index, busy.host, busy.vendor) == (MI300X, 0, "tw038", "amd")
    assert busy.compute_partition == "spx"
    assert busy.hints == {
        names.K8S_POD_NAME: "high-utilization-57ls6",
        names.K8S_NAMESPACE_NAME: "default",
        names.K8S_CONTAINER_NAME: "workload",
        names.JOB_SCHEDULER: "kubernetes",
    }
    assert idle.hints == {}  # pod="" and namespace="": no pod
    assert (cpx.index, cpx.host, cpx.compute_partition) == (47, "tw009", "cpx")
    attributes = busy.resource_attributes()
    assert attributes[names.HW_VENDOR] == names.HW_VENDOR_AMD
    assert attributes[names.HW_ID] == BUSY_UUID
    assert attributes[names.GPU_COMPUTE_PARTITION] == "spx"
    # Prometheus's own relabelled "job" label (job="gpu-exporter") is not a job: only job_id is.
    assert names.JOB_ID not in cpx.hints


def test_ofu_power_and_energy_worked_by_hand(exporter: ExporterServer, shared_fixtures: Path) -> None:
    url = exporter.serve(mi300x_page(shared_fixtures, energy_step=0))
    source = AmdExporterSource(url, clock=Ticks())
    first = by_uuid(source.read())
    exporter.serve(mi300x_page(shared_fixtures, energy_step=1))
    snapshot = source.read()
    second = by_uuid(snapshot)
    assert snapshot.errors == ()
    values = {sample.gpu.uuid: sample.values for sample in compute_snapshot(snapshot).samples}

    # Busy GPU: TPA = MFMA 0.80 x GPU activity 0.90 = 0.72; engine clock = mean(2100, 2050, 2000, 1950) = 2025 MHz;
    # max 2100 MHz (gpu_max_clock; the catalog's peak engine clock is the same): OFU = 0.72 x 2025 / 2100 = 0.69429.
    busy = values[BUSY_UUID]
    assert busy.tensor_active == pytest.approx(0.72)
    assert busy.sm_clock_hz == pytest.approx(2025e6)
    assert busy.max_sm_clock_hz == pytest.approx(2100e6)
    assert busy.ofu == pytest.approx(0.69429, abs=1e-5)
    assert busy.ofu_raw == pytest.approx(0.69429, abs=1e-5)
    assert first[BUSY_UUID].power_w == 650.0  # no energy delta yet: the power reading
    assert second[BUSY_UUID].power_w == pytest.approx(650.0)  # 6500 J over the 10 s between scrapes
    energy = second[BUSY_UUID].energy
    assert energy is not None
    assert energy.joules == pytest.approx(6500.0)
    assert second[BUSY_UUID].throttle == {}  # no throttle reasons from this exporter: absent, never 0
    # Idle GPU: OFU 0 (a reading, not a missing value), 140 W.
    assert values[IDLE_UUID].ofu == 0.0
    assert second[IDLE_UUID].power_w == pytest.approx(140.0)

    # CPX partitions: each is 1/8 of the MI300X (8 XCDs). Partition 0: TPA 0.5 x 1.0 at the GPU's 1800 MHz:
    # 0.5 x 1800 / 2100 = 0.42857; partitions 1-7: TPA 0.3 x 0.5 = 0.15 at the same clock: 0.15 x 1800/2100 = 0.12857.
    # Power: the board's 600 W x 1/8 = 75 W each (their own "0" is no reading); energy 6000 J x 1/8 = 750 J each.
    partitions = [uuid for uuid, reading in second.items() if reading.gpu.compute_partition == "cpx"]
    assert len(partitions) == 8
    assert values[CPX_UUID].ofu == pytest.approx(0.42857, abs=1e-5)
    for uuid in partitions:
        reading = second[uuid]
        assert reading.sm_clock_hz == pytest.approx(1800e6)
        assert reading.power_w == pytest.approx(75.0)
        assert first[uuid].power_w == pytest.approx(75.0)
        assert reading.energy is not None
        assert reading.energy.joules == pytest.approx(750.0)
        if uuid != CPX_UUID:
            assert values[uuid].ofu == pytest.approx(0.12857, abs=1e-5)
    # The partitions add up to the board, and nothing is counted twice.
    assert sum(second[uuid].power_w or 0.0 for uuid in partitions) == pytest.approx(600.0)
    assert sum(energy.joules for uuid in partitions if (energy := second[uuid].energy)) == pytest.approx(6000.0)


def without_gpu_activity(page: str) -> str:
    """The page as the exporter prints it with its profiler's GPU_UTIL off (gpu_prof_gui_util_percent is a profiler
    field, off unless ProfilerMetrics is on): the real MI300X page had no such series."""
    return "\n".join(text for text in page.splitlines() if "gpu_prof_gui_util_percent" not in text) + "\n"


def test_without_the_gpu_activity_field_gfx_activity_stands_in_and_says_so(
    exporter: ExporterServer, shared_fixtures: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # MFMA activity counts MFMA busy cycles per GPU-active cycle, so it needs the GPU's active share beside it. Without
    # gpu_prof_gui_util_percent, the SMI's gpu_gfx_activity (on by default; the real lines: 100 on GPU 0, 0 on GPU 2)
    # stands in for it on a whole GPU.
    page = without_gpu_activity(mi300x_page(shared_fixtures))
    with caplog.at_level(logging.WARNING, logger="otel_ofu.gpu_values"):
        snapshot = AmdExporterSource(exporter.serve(page), clock=Ticks()).read()
    readings, errors = by_uuid(snapshot), errors_by_uuid(snapshot)
    # Busy GPU: TPA = MFMA 0.80 x GFX activity 1.00 = 0.80 at 2025 of 2100 MHz: OFU 0.80 x 2025 / 2100 = 0.77143.
    busy = readings[BUSY_UUID]
    assert busy.tensor_active == pytest.approx(0.8)
    assert busy.engine_active == 1.0
    values = {sample.gpu.uuid: sample.values for sample in compute_snapshot(snapshot).samples}
    assert values[BUSY_UUID].ofu == pytest.approx(0.77143, abs=1e-5)
    assert values[IDLE_UUID].ofu == 0.0  # MFMA 0 x GFX 0
    said = [record.getMessage() for record in caplog.records]
    assert any(
        names.AMD_EXPORTER_GPU_ACTIVE in text and names.AMD_EXPORTER_GFX_ACTIVITY in text and "stands in" in text
        for text in said
    )
    # A compute partition has no GFX activity of its own (the SMI reports it for the whole GPU, on partition 0):
    # no stand-in there, and the error names the field to turn on.
    assert BUSY_UUID not in errors
    assert names.AMD_EXPORTER_GPU_ACTIVE in errors[CPX_UUID].message
    assert readings[CPX_UUID].sm_clock_hz == pytest.approx(1800e6)  # the clock kept beside the error


def test_mfma_zero_is_ofu_zero_whatever_else_is_missing(exporter: ExporterServer, shared_fixtures: Path) -> None:
    # An idle GPU whose page has MFMA activity 0 and nothing else: no GPU activity of either kind, no clock. 0 MFMA
    # cycles are 0 tensor work at any clock: OFU 0, a reading, not a missing value.
    labels = real_labels(shared_fixtures)[IDLE_UUID]
    page = line("gpu_prof_tensor_active_percent", labels, 0) + "\n"
    snapshot = AmdExporterSource(exporter.serve(page), clock=Ticks()).read()
    assert snapshot.errors == ()
    (sample,) = compute_snapshot(snapshot).samples
    assert (sample.values.tensor_active, sample.values.ofu) == (0.0, 0.0)
    assert sample.values.sm_clock_hz is None  # no clock on the page: absent, not 0


def test_bad_and_not_applicable_values(exporter: ExporterServer, shared_fixtures: Path) -> None:
    labels = real_labels(shared_fixtures)[BUSY_UUID]
    page = "\n".join(
        [
            line("gpu_prof_tensor_active_percent", labels, 120),  # above 100 %: an invalid reading, not a clamp
            line("gpu_prof_gui_util_percent", labels, 90),
            *clocks(labels, [2000]),
            line("gpu_power_usage", labels, 4294967295),  # the exporter's "not applicable" (max uint32)
        ]
    )
    snapshot = AmdExporterSource(exporter.serve(page + "\n"), clock=Ticks()).read()
    (error,) = snapshot.errors
    assert error.reason == names.ErrorReason.INVALID_VALUE
    assert "120%" in error.message
    (reading,) = snapshot.readings
    assert (reading.tensor_active, reading.power_w) == (None, None)
    assert reading.sm_clock_hz == pytest.approx(2000e6)
    clock_page = "\n".join(
        [
            line("gpu_prof_tensor_active_percent", labels, 50),
            line("gpu_prof_gui_util_percent", labels, 100),
            line("gpu_clock", labels, 65535, clock_index="0", clock_type="system"),  # max uint16: no clock
        ]
    )
    (error,) = AmdExporterSource(exporter.serve(clock_page + "\n"), clock=Ticks()).read().errors
    assert error.reason == names.ErrorReason.NO_VALUE
    assert "engine clock" in error.message


def test_a_partition_without_its_gpu_partition_0_on_the_page(exporter: ExporterServer, shared_fixtures: Path) -> None:
    one = cpx_partition(real_labels(shared_fixtures)[CPX_UUID], 3)
    page = "\n".join(
        [
            line("gpu_prof_tensor_active_percent", one, 30),
            line("gpu_prof_gui_util_percent", one, 50),
            line("gpu_power_usage", one, 0),
        ]
    )
    snapshot = AmdExporterSource(exporter.serve(page + "\n"), clock=Ticks()).read()
    (error,) = snapshot.errors
    assert "partition 0 is not on the page" in error.message
    (reading,) = snapshot.readings
    assert reading.power_w is None  # its "0" is no reading, and there is no board to take a share of
    assert reading.tensor_active == pytest.approx(0.15)


def test_a_partition_of_a_model_the_catalog_cannot_size_gets_no_power(
    exporter: ExporterServer, shared_fixtures: Path, caplog: pytest.LogCaptureFixture
) -> None:
    labels = real_labels(shared_fixtures)[CPX_UUID].replace(MI300X, "AMD Instinct MI308X")
    page = "\n".join(
        [
            line("gpu_prof_tensor_active_percent", labels, 50),
            line("gpu_prof_gui_util_percent", labels, 100),
            *clocks(labels, [1800]),
            line("gpu_power_usage", labels, 600),
            line("gpu_energy_consumed", labels, 7_000_000_000),
        ]
    )
    with caplog.at_level(logging.WARNING, logger="otel_ofu.gpu_values"):
        (reading,) = AmdExporterSource(exporter.serve(page + "\n"), clock=Ticks()).read().readings
    assert (reading.power_w, reading.energy) == (None, None)
    assert any("cannot be sized" in record.getMessage() for record in caplog.records)


def test_scrape_failures_and_urls(exporter: ExporterServer) -> None:
    exporter.routes["/metrics"] = Route("boom", status=500)
    snapshot = AmdExporterSource(exporter.url(), clock=Ticks()).read()
    (error,) = snapshot.errors
    assert (error.reason, error.gpu) == (names.ErrorReason.SCRAPE, None)
    assert "HTTP 500" in error.message
    assert normalize_url("node-3:5000") == "http://node-3:5000/metrics"
    with pytest.raises(SourceUnavailable, match="AMD Device Metrics Exporter URL"):
        normalize_url("ftp://node-3")
    with pytest.raises(SourceUnavailable, match="--url"):
        open_source("amd-exporter")


def test_snapshot_gives_each_instinct_gpu_its_ofu_vendor_uuid_and_power(
    exporter: ExporterServer, shared_fixtures: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = exporter.serve(mi300x_page(shared_fixtures))
    code = cli.main(["snapshot", "--source", "amd-exporter", "--url", url, "--format", "json"])
    lines: list[dict[str, Any]] = [json.loads(text) for text in capsys.readouterr().out.splitlines() if text.strip()]
    assert code == 0
    assert len(lines) == 10
    rows = {row[names.HW_ID]: row for row in lines}
    busy = rows[BUSY_UUID]
    assert busy[names.HW_VENDOR] == "amd"
    assert busy[names.HW_MODEL] == MI300X
    assert busy[names.GPU_OFU.name] == pytest.approx(0.69429, abs=1e-5)
    assert busy[names.GPU_POWER.name] == 650.0
    assert busy[names.K8S_POD_NAME] == "high-utilization-57ls6"
    assert rows[CPX_UUID][names.GPU_COMPUTE_PARTITION] == "cpx"
    assert rows[CPX_UUID][names.GPU_POWER.name] == pytest.approx(75.0)
    assert all("error" not in row for row in lines)


def test_a_recorded_capture_keeps_the_vendor_and_the_partition(exporter: ExporterServer, shared_fixtures: Path) -> None:
    from otel_ofu.sources.capture import identity_from_json, identity_to_json

    readings = by_uuid(AmdExporterSource(exporter.serve(mi300x_page(shared_fixtures)), clock=Ticks()).read())
    for reading in readings.values():
        assert identity_from_json(json.loads(json.dumps(identity_to_json(reading.gpu)))) == reading.gpu
    # A capture recorded before vendors were written down is NVIDIA's, as every GPU was then.
    old = {"uuid": "GPU-1", "model": "NVIDIA H100 80GB HBM3", "index": 0, "host": "n"}
    assert identity_from_json(old).vendor == names.HW_VENDOR_NVIDIA


def test_engine_activity_is_the_gpu_activity_else_the_gfx_activity(
    exporter: ExporterServer, shared_fixtures: Path
) -> None:
    # GPU_UTIL (gpu_prof_gui_util_percent), the share of cycles the engine was busy over the profiler's window, is
    # AMD's engine activity: 90 % on the busy GPU, 100 % on CPX partition 0, 50 % on the others.
    readings = by_uuid(AmdExporterSource(exporter.serve(mi300x_page(shared_fixtures)), clock=Ticks()).read())
    assert readings[BUSY_UUID].engine_active == pytest.approx(0.9)
    assert readings[IDLE_UUID].engine_active == 0.0
    assert readings[CPX_UUID].engine_active == 1.0
    assert readings[CPX_UUID[:-1] + "3"].engine_active == pytest.approx(0.5)  # partition 3 (cpx_partition)
    # The real sample's gpu_gfx_activity alone stands in for it on whole GPUs (100 on GPU 0, 0 on GPU 2), not on the
    # CPX partition (the SMI's figure is the whole GPU's, printed on partition 0).
    only_gfx = (shared_fixtures / "amd_metrics_exporter_mi300x_kaiwo.prom").read_text()
    snapshot = AmdExporterSource(exporter.serve(only_gfx, "/gfx-only"), clock=Ticks()).read()
    gfx = by_uuid(snapshot)
    assert (gfx[BUSY_UUID].engine_active, gfx[IDLE_UUID].engine_active) == (1.0, 0.0)
    assert CPX_UUID not in gfx or gfx[CPX_UUID].engine_active is None
    assert all(
        not reading.nvlink_io and not reading.pcie_io and reading.sm_active is None for reading in snapshot.readings
    )


def test_a_page_without_amd_exporter_metrics_says_so_naming_what_it_had(exporter: ExporterServer) -> None:
    page = 'DCGM_FI_DEV_SM_CLOCK{gpu="0",UUID="GPU-1",modelName="NVIDIA H100 80GB HBM3"} 1755\nnode_load1 0.2\n'
    url = exporter.serve(page)
    snapshot = AmdExporterSource(url, clock=Ticks()).read()
    (error,) = snapshot.errors
    assert error.gpu is None
    assert error.reason == names.ErrorReason.SCRAPE
    assert error.message.startswith(f"{url}: no AMD Device Metrics Exporter metric on the page")
    assert "the page had 2 series of 2 metrics: DCGM_FI_DEV_SM_CLOCK, node_load1" in error.message


def test_a_metrics_prefix_is_read_through(exporter: ExporterServer, shared_fixtures: Path) -> None:
    # The exporter's CommonConfig.MetricsFieldPrefix ("amd_" in its example config.json) prefixes every metric name.
    prefixed = "\n".join(
        "amd_" + text if text.startswith("gpu_") else text for text in mi300x_page(shared_fixtures).splitlines()
    )
    readings = by_uuid(AmdExporterSource(exporter.serve(prefixed + "\n"), clock=Ticks()).read())
    assert readings[BUSY_UUID].tensor_active == pytest.approx(0.72)
    assert readings[BUSY_UUID].sm_clock_hz == pytest.approx(2025e6)
