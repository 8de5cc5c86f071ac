"""Every generation of DCGM's field names and units reads the same, in all three DCGM paths.

DCGM 4.6.1 (NVIDIA/go-dcgm pkg/dcgm/const_fields.go, "DCGM 4.6.1 support") gave the SM clock, its maximum and the
energy counter new fields in base units (1603 DCGM_FI_DEV_SM_CLOCK_HERTZ in Hz for 100 in MHz, 1608
DCGM_FI_DEV_SM_MAX_CLOCK_HERTZ for 113, 1611 DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL in J for 156 in mJ) and renamed the
other tags (DCGM_FI_DEV_BOARD_POWER_WATTS, DCGM_FI_DEV_CLOCKS_EVENT_REASONS, the *_UTIL_RATIO profiling fields, the
DCGM_FI_SYSTEM_DRIVER_VERSION label); dcgm-exporter prints each field under the tag its counters file names, and 4.10
prints the link rates as *_BYTES_PER_SECOND. tests/data/dcgm_exporter_h100_generation_{3x,49,410}.prom are one H100's
page (the real DigitalOcean H100 label set) in each generation, with the same physical values in each one's units.
"""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from otel_ofu import gpu_values, names
from otel_ofu.model import GpuReading, Snapshot
from otel_ofu.sources.dcgm import DcgmSource, import_bindings
from otel_ofu.sources.dcgm_exporter import DcgmExporterSource
from otel_ofu.sources.dcgmi_dmon import DcgmiDmonSource
from tests.exporter_server import ExporterServer, Ticks, serving
from tests.test_dcgm_source import AGENT, PYDCGM, STRUCTS

GENERATIONS = ("3x", "49", "410")
# The page's energy counter, then 7000 J later, in each generation's unit (mJ before 4.6.1, J after).
ENERGY = {"3x": ("123456789", "130456789"), "49": ("123456.789", "130456.789"), "410": ("123456.789", "130456.789")}


@pytest.fixture
def exporter() -> Iterator[ExporterServer]:
    with serving() as server:
        yield server


def two_reads(exporter: ExporterServer, shared_fixtures: Path, generation: str) -> tuple[Snapshot, Snapshot]:
    page = (shared_fixtures / f"dcgm_exporter_h100_generation_{generation}.prom").read_text()
    before, after = ENERGY[generation]
    url = exporter.serve(page, f"/{generation}")
    source = DcgmExporterSource(url, clock=Ticks())  # 10 s between reads
    try:
        first = source.read()
        exporter.serve(page.replace(f"}} {before}\n", f"}} {after}\n"), f"/{generation}")
        return first, source.read()
    finally:
        source.close()


@pytest.mark.parametrize("generation", GENERATIONS)
def test_every_exporter_generation_gives_the_same_reading(
    exporter: ExporterServer, shared_fixtures: Path, generation: str
) -> None:
    first, second = two_reads(exporter, shared_fixtures, generation)
    assert first.errors == ()
    assert second.errors == ()
    (reading,) = second.readings
    assert reading.gpu.host == "6d6d7dc3ce21"  # Hostname before May 2026, hostname after
    assert reading.tensor_active == 0.5
    assert reading.sm_clock_hz == 1755e6  # 1755 MHz, or 1755000000 Hz
    assert reading.max_sm_clock_hz == 1980e6
    assert (reading.engine_active, reading.sm_active, reading.sm_occupancy, reading.dram_active) == (
        0.9,
        0.8,
        0.25,
        0.3,
    )
    assert reading.energy is not None
    assert reading.energy.joules == pytest.approx(7000.0)  # +7,000,000 mJ, or +7000 J
    assert reading.power_w == pytest.approx(700.0)  # 7000 J over the 10 s between scrapes
    assert reading.throttle[names.ThrottleReason.POWER] == 1.0  # bitmask 0x4, SwPowerCap
    # 1.5 GB/s PCIe transmit over two 10 s scrape intervals.
    assert reading.pcie_io[names.IoDirection.TRANSMIT].total_bytes == pytest.approx(1.5e9 * 20)
    assert reading.nvlink_io[names.IoDirection.RECEIVE].total_bytes == pytest.approx(1e10 * 20)
    values = gpu_values.compute(reading)
    # 0.5 x 1755 / 1830 (H100 SXM tensor clock) = 0.47951; raw 0.5 x 1755 / 1980 = 0.44318.
    assert values.ofu == pytest.approx(0.479508, abs=1e-6)
    assert values.ofu_raw == pytest.approx(0.443182, abs=1e-6)
    assert not values.max_clock_from_catalog  # the page's own max clock, in whichever field it came


def test_the_vocabulary_declares_each_exporter_tag_once_with_its_field_and_unit() -> None:
    fields = names.DCGM_EXPORTER_FIELDS
    for old, new in (
        ("DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_SM_CLOCK_HERTZ"),
        ("DCGM_FI_DEV_MAX_SM_CLOCK", "DCGM_FI_DEV_SM_MAX_CLOCK_HERTZ"),
        ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL"),
    ):
        # A renamed field with a new unit is a new field id; its values convert to the same base unit.
        assert names.DCGM_FIELD_GENERATIONS[fields[old]] == fields[new]
        assert names.DCGM_FIELD_TO_BASE_UNIT.get(fields[new], 1.0) == 1.0
    assert names.DCGM_FIELD_TO_BASE_UNIT[fields["DCGM_FI_DEV_SM_CLOCK"]] == 1e6  # MHz -> Hz
    assert names.DCGM_FIELD_TO_BASE_UNIT[fields["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"]] == 1e-3  # mJ -> J
    for old, new in (
        ("DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_BOARD_POWER_WATTS"),
        ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"),
        ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_PROF_TENSOR_UTIL_RATIO"),
        ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO"),
        ("DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_SM_UTIL_RATIO"),
        ("DCGM_FI_PROF_SM_OCCUPANCY", "DCGM_FI_PROF_SM_OCCUPANCY_RATIO"),
        ("DCGM_FI_PROF_DRAM_ACTIVE", "DCGM_FI_PROF_DRAM_UTIL_RATIO"),
        ("DCGM_FI_PROF_PCIE_TX_BYTES", "DCGM_FI_PROF_PCIE_TX_BYTES_PER_SECOND"),
        ("DCGM_FI_PROF_NVLINK_RX_BYTES", "DCGM_FI_PROF_NVLINK_RX_BYTES_PER_SECOND"),
    ):
        assert fields[old] == fields[new]  # a new tag for the same field: same id, same unit
    assert names.DCGM_EXPORTER_DRIVER_LABELS == ("DCGM_FI_SYSTEM_DRIVER_VERSION", "DCGM_FI_DRIVER_VERSION")


# --- the DCGM source, by field id ----------------------------------------------------------------------------


@pytest.fixture
def bindings(tmp_path: Path) -> Iterator[tuple[Path, dict[str, Any]]]:
    """DCGM's Python bindings as tests/test_dcgm_source.py stands them in."""
    for name, text in (("dcgm_structs", STRUCTS), ("dcgm_agent", AGENT), ("pydcgm", PYDCGM)):
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(text))
    _structs, agent, _pydcgm = import_bindings([tmp_path])
    state: dict[str, Any] = agent.STATE
    state["gpus"] = [(0, "GPU-0000", "NVIDIA H100 80GB HBM3")]
    try:
        yield tmp_path, state
    finally:
        sys.path.remove(str(tmp_path))
        for name in ("dcgm_structs", "dcgm_agent", "pydcgm"):
            module: ModuleType | None = sys.modules.pop(name, None)
            assert module is not None


class Clock:
    def __init__(self) -> None:
        self.now = 10_000_000_000

    def __call__(self) -> int:
        self.now += 10_000_000_000
        return self.now


def test_a_host_engine_of_the_base_unit_generation_is_read_by_field_id(bindings: tuple[Path, dict[str, Any]]) -> None:
    path, state = bindings
    # A host engine that knows only the 4.6.1 fields for the clocks and the energy counter.
    state["known"] = {1603, 1608, 1611, 112, 155, 240, 241, 242, 243, 245, 1001, 1002, 1003, 1004, 1005}
    second = 1_000_000  # DCGM timestamps are in us
    state["values"] = {
        (0, 1603): (1_755_000_000, second),
        (0, 1608): (1_980_000_000, second),
        (0, 1004): (0.5, second),
        (0, 1611): (123_456.789, 10 * second),
    }
    source = DcgmSource.open(clock=Clock(), paths=[path])
    assert {1603, 1608, 1611} <= set(state["watched"])
    first = source.read()
    state["values"][(0, 1611)] = (130_456.789, 20 * second)  # +7000 J in 10 s
    (reading,) = source.read().readings
    source.close()
    assert first.errors == ()
    assert (reading.tensor_active, reading.sm_clock_hz, reading.max_sm_clock_hz) == (0.5, 1755e6, 1980e6)
    assert reading.energy is not None
    assert reading.energy.joules == pytest.approx(7000.0)
    assert reading.power_w == pytest.approx(700.0)


def test_a_host_engine_of_the_old_generation_still_reads(bindings: tuple[Path, dict[str, Any]]) -> None:
    path, state = bindings
    state["known"] = {100, 113, 156, 1001, 1002, 1003, 1004, 1005}
    state["values"] = {(0, 100): (1755, 1), (0, 113): (1980, 1), (0, 1004): (0.5, 1)}
    source = DcgmSource.open(clock=Clock(), paths=[path])
    (reading,) = source.read().readings
    source.close()
    assert {100, 113} <= set(state["watched"])
    assert (reading.sm_clock_hz, reading.max_sm_clock_hz) == (1755e6, 1980e6)


# --- dcgmi dmon, by the -e list -------------------------------------------------------------------------------


def test_dmon_columns_of_the_hertz_fields_are_read_in_hertz(tmp_path: Path) -> None:
    # DCGM 4.6.1's dmon short names for 1603/1608 are in no source here, so the column names are this test's own; the
    # capture includes its command line, and the -e list says which field each column is, as for any capture.
    capture = tmp_path / "dmon.txt"
    capture.write_text(
        "$ dcgmi dmon -e 1004,1603,1608\n"
        "#Entity           TENSO                 SMCLKHZ               SMMAXHZ\n"
        "ID\n"
        "GPU 0             0.500                 1755000000            1980000000\n"
    )
    source = DcgmiDmonSource(capture, model="NVIDIA H100 80GB HBM3", clock=lambda: 0)
    (reading,) = source.read().readings
    source.close()
    assert isinstance(reading, GpuReading)
    assert (reading.tensor_active, reading.sm_clock_hz, reading.max_sm_clock_hz) == (0.5, 1755e6, 1980e6)
