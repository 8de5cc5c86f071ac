"""Replaying ``dcgmi dmon`` text: the two real captures and the shapes they stand for."""

from __future__ import annotations

from pathlib import Path

import pytest

from otel_ofu import names
from otel_ofu.model import GpuError, Snapshot, SourceUnavailable
from otel_ofu.sources.dcgmi_dmon import DcgmiDmonSource, parse_blocks
from otel_ofu.sources.factory import open_source

T0 = 1_800_000_000_000_000_000


def replay(path: Path, **kwargs: object) -> list[Snapshot]:
    source = DcgmiDmonSource(path, clock=lambda: T0, **kwargs)  # type: ignore[arg-type]
    snapshots = []
    try:
        while True:
            snapshot = source.read()
            if source.exhausted:
                assert snapshot == Snapshot()
                break
            snapshots.append(snapshot)
    finally:
        source.close()
    return snapshots


def test_mig_capture_one_block_of_gpu_instances(shared_fixtures: Path) -> None:
    (snapshot,) = replay(shared_fixtures / "dcgmi_dmon_issue151_mig.txt")
    # -e 1001,1002,1003,1004 has no SM clock: no OFU, and no 0 either, where the tensor pipes were busy; what dmon did
    # print stays. The idle instances (TENSO 0.000: 21, 22, 35) need no clock: no tensor work is OFU 0.
    assert all(reading.sm_clock_hz is None for reading in snapshot.readings)
    assert [r.gpu.mig_instance_id for r in snapshot.readings] == [21, 22, 29, 30, 31, 28, 35]
    ids = [error.gpu.mig_instance_id for error in snapshot.errors if error.gpu is not None]
    assert ids == [29, 30, 31, 28]
    for error in snapshot.errors:
        assert error.reason == names.ErrorReason.NO_VALUE
        assert "SM clock" in error.message
        assert "tensor" not in error.message  # TENSO was there
        assert error.gpu is not None
        assert error.gpu.index == -1  # dmon does not say which GPU an instance lives on


def test_mig_capture_values_follow_the_e_list(shared_fixtures: Path) -> None:
    lines = (shared_fixtures / "dcgmi_dmon_issue151_mig.txt").read_text().splitlines()
    (block,) = parse_blocks(iter(lines))
    row = next(row for row in block.rows if row.entity_id == 28)
    assert row.kind == "GPU-I"
    assert row.values == {
        names.DCGM_FI_PROF_GR_ENGINE_ACTIVE: 0.993,
        names.DCGM_FI_PROF_SM_ACTIVE: 0.987,
        names.DCGM_FI_PROF_SM_OCCUPANCY: 0.123,
        names.DCGM_FI_PROF_PIPE_TENSOR_ACTIVE: 0.940,
    }


def test_multiplex_capture_na_and_prompt(shared_fixtures: Path) -> None:
    path = shared_fixtures / "dcgmi_dmon_issue244_multiplex.txt"
    lines = path.read_text().splitlines()
    blocks = list(parse_blocks(iter(lines)))
    assert [len(block.rows) for block in blocks] == [8, 2]  # GPU 0 repeats: a second sample begins
    assert all(row.values == {} for row in blocks[0].rows)  # all N/A: absent, never 0
    gpu0, gpu1 = blocks[1].rows
    assert gpu0.values == {
        names.DCGM_FI_PROF_GR_ENGINE_ACTIVE: 0.888,
        names.DCGM_FI_PROF_PIPE_TENSOR_ACTIVE: 0.178,
        1008: 0.001,
    }
    assert gpu1.values[names.DCGM_FI_PROF_SM_ACTIVE] == 0.777
    assert names.DCGM_FI_PROF_PIPE_TENSOR_ACTIVE not in gpu1.values

    first, second = replay(path)
    assert len(first.errors) == 8
    assert all("tensor pipe activity" in error.message for error in first.errors)
    error0 = second.errors[0]
    assert error0.gpu is not None
    assert error0.gpu.host == "b76d14397"  # from the shell prompt
    assert error0.gpu.index == 0
    assert error0.gpu.mig_instance_id is None
    assert "tensor" not in error0.message


def test_blocks_are_spaced_by_the_delay(tmp_path: Path) -> None:
    capture = tmp_path / "dmon.txt"
    capture.write_text(
        "$ dcgmi dmon -e 100,113,1004,1002 -d 500\n"
        "#Entity   SMCLK        SMMAX        TENSO        SMACT\n"
        "ID\n"
        "GPU 0     1755         1980         0.500        0.800\n"
        "GPU 1     1755         N/A          0.250        0.400\n"
        "GPU 0     1980         1980         0.600        0.900\n"
        "GPU 1     1980         1980         9223372036854775794 0.400\n"
    )
    first, second = replay(capture, host="node-7", model="NVIDIA H100 80GB HBM3")
    gpu0, gpu1 = first.readings
    assert (gpu0.start_ns, gpu0.end_ns) == (T0, T0 + 500_000_000)
    assert gpu0.sm_clock_hz == 1755e6
    assert gpu0.max_sm_clock_hz == 1980e6
    assert (gpu0.tensor_active, gpu0.sm_active) == (0.5, 0.8)
    assert gpu1.max_sm_clock_hz is None
    assert gpu0.gpu.host == "node-7"
    assert gpu0.gpu.model == "NVIDIA H100 80GB HBM3"
    reading, kept = second.readings
    assert reading.start_ns == T0 + 500_000_000
    # GPU 1's blank TPA is no value, not 9.2e18; its clock and SM activity stay beside the error.
    assert (kept.gpu.index, kept.tensor_active, kept.sm_clock_hz, kept.sm_active) == (1, None, 1980e6, 0.4)
    (error,) = second.errors
    assert isinstance(error, GpuError)
    assert error.gpu is not None
    assert error.gpu.index == 1


def test_cycle_counter_columns_give_deltas(tmp_path: Path) -> None:
    capture = tmp_path / "dmon.txt"
    capture.write_text(
        "#Entity   SMCELAP        MMACACT\nGPU 0     1000000        100000\nGPU 0     1001755000     877600000\n"
    )
    first, second = replay(capture)
    assert first.readings == ()
    assert "no value" in first.errors[0].message
    (reading,) = second.readings
    assert reading.cycles is not None
    assert (reading.cycles.sm_cycles_elapsed, reading.cycles.mma_cycles_active) == (1_000_755_000, 877_500_000)


def test_bad_rows_are_counted_errors(tmp_path: Path) -> None:
    capture = tmp_path / "dmon.txt"
    capture.write_text(
        "GPU 0 0.5\n"  # before any header
        "#Entity   SMCLK        TENSO\n"
        "GPU 0   1755\n"  # a column short, and its one value under no column (DCGM 4 leaves a blank cell aligned)
        "GPU 1     1755         abc\n"
        "GPU 2     1755         0.5\n"
        "Error: lost connection to the host engine\n"
    )
    source = DcgmiDmonSource(capture, clock=lambda: T0)
    blocks = [source.read(), source.read(), source.read()]
    assert source.exhausted
    assert source.bad_lines == 3
    scrape = [e for s in blocks for e in s.errors if e.reason == names.ErrorReason.SCRAPE]
    assert len(scrape) == 3
    assert any("1 values for 2 columns" in e.message for e in scrape)
    assert [r.gpu.index for s in blocks for r in s.readings] == [2]
    source.close()


def test_missing_file_is_unavailable(tmp_path: Path) -> None:
    with pytest.raises(SourceUnavailable, match="cannot open dcgmi dmon capture"):
        DcgmiDmonSource(tmp_path / "absent.txt")


# --- engine activity, occupancy and link traffic -------------------------------------------------------------


def test_the_mig_captures_engine_sm_and_occupancy_per_instance(shared_fixtures: Path) -> None:
    (snapshot,) = replay(shared_fixtures / "dcgmi_dmon_issue151_mig.txt")
    by_instance = {r.gpu.mig_instance_id: r for r in snapshot.readings}
    busy = by_instance[28]  # GPU-I 28  0.993  0.987  0.123  0.940
    assert (busy.engine_active, busy.sm_active, busy.sm_occupancy, busy.tensor_active) == (0.993, 0.987, 0.123, 0.94)
    half = by_instance[29]  # GPU-I 29  0.495  0.490  0.061  0.468
    assert (half.engine_active, half.sm_active, half.sm_occupancy) == (0.495, 0.49, 0.061)
    assert by_instance[21].engine_active == 0.0  # idle, measured
    assert all(not r.nvlink_io and not r.pcie_io for r in snapshot.readings)  # -e had no link fields


def test_the_multiplexed_captures_na_engine_activity_is_absent_and_its_sample_kept(shared_fixtures: Path) -> None:
    first, second = replay(shared_fixtures / "dcgmi_dmon_issue244_multiplex.txt")
    assert all(r.engine_active is None for r in first.readings)  # every column N/A
    gpu0, gpu1 = second.readings
    assert (gpu0.engine_active, gpu0.sm_active, gpu0.sm_occupancy) == (0.888, None, None)
    assert (gpu1.engine_active, gpu1.sm_active) == (None, 0.777)


LINKS_CAPTURE = """\
$ dcgmi dmon -e 1001,1002,1004,1009,1010,1011,1012 -d 2000
#Entity   GRACT    SMACT    TENSO    PCITX        PCIRX        NVLTX        NVLRX
ID
GPU 0     0.950    0.850    0.480    1000000000   4000000000   300000000000 290000000000
GPU-I 3   0.500    0.450    0.200    1000000000   4000000000   N/A          N/A
GPU 0     0.940    0.840    0.470    1500000000   N/A          100000000000 290000000000
GPU-I 3   0.500    0.450    0.200    1000000000   4000000000   N/A          N/A
"""


def test_link_rates_are_integrated_over_the_delay_for_gpus_and_left_out_for_instances(tmp_path: Path) -> None:
    path = tmp_path / "links.txt"  # written for this test in the shape of the real captures above
    path.write_text(LINKS_CAPTURE)
    first, second = replay(path)
    gpu, instance = first.readings
    assert (gpu.engine_active, gpu.sm_active) == (0.95, 0.85)
    tx, rx = names.IoDirection.TRANSMIT, names.IoDirection.RECEIVE
    # -d 2000: each block spans 2 s from the replay's start. PCIe 1 GB/s -> 2 GB, 4 GB/s -> 8 GB; NVLink 300 GB/s ->
    # 600 GB, 290 GB/s -> 580 GB.
    assert {d: c.total_bytes for d, c in gpu.pcie_io.items()} == {tx: 2e9, rx: 8e9}
    assert {d: c.total_bytes for d, c in gpu.nvlink_io.items()} == {tx: 6e11, rx: 5.8e11}
    assert {c.start_ns for c in (*gpu.pcie_io.values(), *gpu.nvlink_io.values())} == {T0}
    # An instance row's links are the board's, and dmon does not say its share of them: left out.
    assert (dict(instance.pcie_io), instance.engine_active) == ({}, 0.5)
    gpu, _ = second.readings
    # + 1.5 GB/s x 2 s = 5 GB sent; the N/A receive rate adds nothing and has no point; NVLink + 200 GB, + 580 GB.
    assert {d: c.total_bytes for d, c in gpu.pcie_io.items()} == {tx: 5e9}
    assert {d: c.total_bytes for d, c in gpu.nvlink_io.items()} == {tx: 8e11, rx: 1.16e12}


# --- every layout DCGM has printed ----------------------------------------------------------------------------


def test_the_dcgm_user_guides_two_line_header_reads(shared_fixtures: Path) -> None:
    # NVIDIA's DCGM user guide, profiling example on an A100 (dcgmproftester -t 1004 in another console): the header
    # "# Entity  GRACT  TENSO  DRAMA" then "Id", as DCGM 2.2-2.3 printed it, 15 one-GPU samples.
    snapshots = replay(shared_fixtures / "dcgmi_dmon_dcgm_guide_a100.txt", model="NVIDIA A100-SXM4-40GB")
    assert len(snapshots) == 15
    readings = [snapshot.readings[0] for snapshot in snapshots]
    assert [r.tensor_active for r in readings[:5]] == [0.0, 0.0, 0.0, 0.527, 0.928]
    steady = readings[4:]
    assert [r.engine_active for r in steady] == [0.969, 0.973, 0.971, 0.969, 0.971, 0.971, 0.973, 0.974, 0.971, 0.974,
                                                 0.972]  # fmt: skip
    assert [r.dram_active for r in readings] == [0.0] * 15
    # The example recorded no clock: no OFU, and the error says the clock is what is missing, not the activity.
    assert all(reading.sm_clock_hz is None for reading in readings)
    assert all("SM clock" in e.message and "tensor" not in e.message for s in snapshots for e in s.errors)


def test_the_guides_capture_without_its_command_line_is_still_dmon_text(shared_fixtures: Path, tmp_path: Path) -> None:
    lines = (shared_fixtures / "dcgmi_dmon_dcgm_guide_a100.txt").read_text().splitlines()
    capture = tmp_path / "pasted.txt"
    capture.write_text("\n".join(lines[1:]) + "\n")  # as pasted from the guide, without "$ dcgmi dmon ..."
    source, why = open_source("replay", file=capture, clock=lambda: T0)
    try:
        assert isinstance(source, DcgmiDmonSource)
        assert "dcgmi dmon" in why
        assert source.read().readings[0].engine_active == 0.0
    finally:
        source.close()


def test_the_guides_mig_example_reads_its_gpu_and_instance_rows(shared_fixtures: Path) -> None:
    # The same guide's MIG example: an A100 as two 3g.20gb GPU instances, the group holding GPU 0 and both instances.
    snapshots = replay(shared_fixtures / "dcgmi_dmon_dcgm_guide_mig.txt")
    assert len(snapshots) == 10
    busy = snapshots[3].readings  # "GPU 0 0.845 0.816", "GPU-I 0 0.986 0.953", "GPU-I 1 0.985 0.952"
    assert [(r.gpu.index, r.gpu.mig_instance_id, r.engine_active, r.tensor_active) for r in busy] == [
        (0, None, 0.845, 0.816),
        (-1, 0, 0.986, 0.953),
        (-1, 1, 0.985, 0.952),
    ]
    assert len({r.gpu.key for r in busy}) == 3  # GPU-I 0 is not GPU 0


def test_dcgm_4_blank_cells_and_link_rows(tmp_path: Path) -> None:
    # DCGM 4's layout (dcgmi/DeviceMonitor.cpp: "#Entity" in 14 + 2 columns, each field its width + 6 + 2, a blank
    # cell where the entity has no such field) and its "GPU 0 LINK n" rows; written for this test from that code.
    capture = tmp_path / "dmon4.txt"
    capture.write_text(
        "$ dcgmi dmon -e 1001,1004,1005\n"
        "#Entity         GRACT        TENSO        DRAMA\n"
        "ID\n"
        "GPU 0           0.845        0.816        0.400\n"
        "GPU-CI 1        0.986        0.953\n"
        "GPU-I 1         0.985                     0.300\n"
        "GPU 0 LINK 3    N/A          N/A          N/A\n"
    )
    (snapshot,) = replay(capture)
    assert snapshot.errors != ()  # no clock in -e: every entity says so
    assert all(e.reason == names.ErrorReason.NO_VALUE for e in snapshot.errors)
    gpu, compute_instance, gpu_instance = snapshot.readings
    assert (gpu.engine_active, gpu.tensor_active, gpu.dram_active) == (0.845, 0.816, 0.4)
    assert (compute_instance.gpu.mig_instance_id, compute_instance.tensor_active) == (1, 0.953)
    assert compute_instance.dram_active is None  # blank: absent, never 0
    assert (gpu_instance.engine_active, gpu_instance.tensor_active, gpu_instance.dram_active) == (0.985, None, 0.3)
