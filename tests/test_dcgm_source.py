"""The DCGM source without DCGM: the one-line reason, the value conventions, and the binding calls
exercised against stand-in binding modules (same module names, functions and ctypes layouts as
DCGM's testing/python3 bindings) loaded from a temporary directory."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from otel_ofu import names
from otel_ofu.model import CycleCounters, IoCounter, SourceUnavailable
from otel_ofu.sources.dcgm import CycleTracker, DcgmSource, dcgm_number, import_bindings, missing_core

SECOND_NS = 1_000_000_000
TX, RX = names.IoDirection.TRANSMIT, names.IoDirection.RECEIVE

# --- value conventions -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        140737488355328.0,  # DCGM_FP64_BLANK
        140737488355330.0,  # FP64 not supported
        9223372036854775792,  # DCGM_INT64_BLANK
        9223372036854775794,  # INT64 not supported
        2147483632,  # DCGM_INT32_BLANK
        2147483635,
        float("nan"),
        float("inf"),
        None,
    ],
)
def test_blanks_are_no_value(value: float | None) -> None:
    assert dcgm_number(value) is None


@pytest.mark.parametrize("value", [0, 0.0, 0.5, 1.0, 1755, 1980.0, 2147483648.0])
def test_real_values_pass(value: float) -> None:
    assert dcgm_number(value) == value


def test_counters_pass_two_to_the_47_but_not_int64_blanks() -> None:
    assert dcgm_number(2**50, counter=True) == 2**50
    assert dcgm_number(9223372036854775792, counter=True) is None
    assert dcgm_number(2**50) is None  # a gauge that large is the FP64 blank range


def test_missing_core_names_what_is_missing() -> None:
    assert missing_core(0.5, 1.5e9, None) is None
    assert missing_core(None, None, CycleCounters(10, 5)) is None
    message = missing_core(None, None, None)
    assert message is not None
    assert "tensor pipe activity (field 1004)" in message
    assert "SM clock (field 100 or 1603)" in message  # DCGM 4.6.1 has it in Hz as field 1603


def test_cycle_tracker() -> None:
    tracker = CycleTracker()
    assert tracker.update("g", 100, 10, 1_000) is None
    assert tracker.update("g", 100, 10, 2_000) is None  # not refreshed: no delta, span keeps its start
    assert tracker.update("g", 300, 60, 3_000) == (CycleCounters(200, 50), 1_000)
    assert tracker.update("g", 5, 1, 4_000) is None  # reset
    assert tracker.update("g", 15, 2, 5_000) == (CycleCounters(10, 1), 4_000)
    tracker.forget(["other"])
    assert tracker.update("g", 25, 3, 6_000) is None


# --- without DCGM ------------------------------------------------------------------------------------------


def test_without_bindings_opening_says_why_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(SourceUnavailable) as caught:
        DcgmSource.open(paths=[tmp_path / "nowhere"])
    message = str(caught.value)
    assert "\n" not in message
    assert "DCGM Python bindings not found" in message
    assert str(tmp_path / "nowhere") in message
    assert str(tmp_path / "nowhere") not in sys.path


# --- against stand-in bindings ----------------------------------------------------------------------------

STRUCTS = """
import ctypes

DCGM_ST_OK = 0
DCGM_ST_NOT_SUPPORTED = -6
DCGM_ST_UNKNOWN_FIELD = -13
DCGM_ST_NO_DATA = -14
DCGM_ST_CONNECTION_NOT_VALID = -21
DCGM_ST_PROFILING_NOT_SUPPORTED = -36
DCGM_GROUP_DEFAULT = 0
DCGM_OPERATION_MODE_AUTO = 1
_TEXT = {-13: "Unknown field id", -21: "Connection to the host engine is not valid any longer",
         -36: "Profiling is not supported for this group of GPUs or GPU"}


class DCGMError(Exception):
    def __init__(self, value):
        self.value = value

    def __str__(self):
        return _TEXT.get(self.value, "DCGM error %d" % self.value)


class c_dcgmGroupEntityPair_t(ctypes.Structure):
    _fields_ = [("entityGroupId", ctypes.c_uint32), ("entityId", ctypes.c_uint32)]


class c_dcgmFieldValue_v1_value(ctypes.Union):
    _fields_ = [("i64", ctypes.c_int64), ("dbl", ctypes.c_double), ("str", ctypes.c_char * 256)]


class c_dcgmFieldValue_v2(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint), ("entityGroupId", ctypes.c_uint), ("entityId", ctypes.c_uint),
                ("fieldId", ctypes.c_ushort), ("fieldType", ctypes.c_short), ("status", ctypes.c_int),
                ("unused", ctypes.c_uint), ("ts", ctypes.c_int64), ("value", c_dcgmFieldValue_v1_value)]
"""

AGENT = """
import dcgm_structs as s

STATE = {"known": set(), "profiling": True, "gpus": [], "values": {}, "watched": None, "calls": []}
PROFILING = {1001, 1002, 1003, 1004, 1005, 1009, 1010, 1011, 1012, 1084, 1085, 1086}


class _Attributes:
    def __init__(self, uuid, name):
        class Identifiers:
            pass
        self.identifiers = Identifiers()
        self.identifiers.uuid = uuid
        self.identifiers.deviceName = name


def dcgmGetAllSupportedDevices(handle):
    return [gpu for gpu, _, _ in STATE["gpus"]]


def dcgmGetDeviceAttributes(handle, gpu_id):
    for gpu, uuid, name in STATE["gpus"]:
        if gpu == gpu_id:
            return _Attributes(uuid, name)
    raise s.DCGMError(-6)


def dcgmGroupCreate(handle, kind, name):
    assert kind == s.DCGM_GROUP_DEFAULT
    return "group"


def dcgmGroupDestroy(handle, group):
    STATE["calls"].append("group destroyed")


def dcgmFieldGroupCreate(handle, fields, name):
    unknown = [f for f in fields if f not in STATE["known"]]
    if unknown:
        raise s.DCGMError(s.DCGM_ST_UNKNOWN_FIELD)
    return tuple(fields)


def dcgmFieldGroupDestroy(handle, field_group):
    STATE["calls"].append("field group destroyed")


def dcgmWatchFields(handle, group, field_group, update_us, keep_age, keep_samples):
    if not STATE["profiling"] and PROFILING & set(field_group):
        raise s.DCGMError(s.DCGM_ST_PROFILING_NOT_SUPPORTED)
    STATE["watched"] = field_group
    STATE["update_us"] = update_us


def dcgmUnwatchFields(handle, group, field_group):
    STATE["calls"].append("unwatched")


def dcgmUpdateAllFields(handle, wait):
    pass


def dcgmEntitiesGetLatestValues(handle, entities, fields, flags):
    out = (s.c_dcgmFieldValue_v2 * (len(entities) * len(fields)))()
    i = 0
    for entity in entities:
        assert entity.entityGroupId == 1
        for field in fields:
            item = out[i]
            i += 1
            item.entityGroupId, item.entityId, item.fieldId = 1, entity.entityId, field
            value = STATE["values"].get((entity.entityId, field))
            if value is None:
                item.status = s.DCGM_ST_NO_DATA
                continue
            number, ts = value
            item.ts = ts
            if isinstance(number, float):
                item.fieldType, item.value.dbl = ord("d"), number
            else:
                item.fieldType, item.value.i64 = ord("i"), number
    return out
"""

PYDCGM = """
import dcgm_agent
import dcgm_structs


class DcgmHandle:
    def __init__(self, handle=None, ipAddress=None, opMode=None):
        if ipAddress == "down":
            raise dcgm_structs.DCGMError(dcgm_structs.DCGM_ST_CONNECTION_NOT_VALID)
        self.handle = "handle"

    def Shutdown(self):
        dcgm_agent.STATE["calls"].append("shutdown")
"""


@pytest.fixture
def bindings(tmp_path: Path) -> Iterator[tuple[Path, dict[str, Any]]]:
    for name, text in (("dcgm_structs", STRUCTS), ("dcgm_agent", AGENT), ("pydcgm", PYDCGM)):
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(text))
    _structs, agent, _pydcgm = import_bindings([tmp_path])
    state: dict[str, Any] = agent.STATE
    state["known"] = {100, 113, 1001, 1002, 1003, 1004, 1005}
    state["gpus"] = [(0, "GPU-0000", "NVIDIA H100 80GB HBM3"), (1, "GPU-1111", "NVIDIA H100 80GB HBM3")]
    try:
        yield tmp_path, state
    finally:
        sys.path.remove(str(tmp_path))
        for name in ("dcgm_structs", "dcgm_agent", "pydcgm"):
            module: ModuleType | None = sys.modules.pop(name, None)
            assert module is not None


class Ticks:
    def __init__(self) -> None:
        self.now = 10_000_000_000

    def __call__(self) -> int:
        self.now += 1_000_000_000
        return self.now


def test_reads_fields_blank_sentinels_and_missing_values(bindings: tuple[Path, dict[str, Any]]) -> None:
    path, state = bindings
    state["values"] = {
        (0, 100): (1755, 5_000_000),
        (0, 113): (1980, 5_000_000),
        (0, 1004): (0.5, 5_000_000),
        (0, 1002): (0.75, 5_000_000),
        (1, 100): (1755, 5_000_000),
        (1, 1004): (140737488355328.0, 5_000_000),  # DCGM_FP64_BLANK
    }
    clock = Ticks()
    source = DcgmSource.open(host="node-3", clock=clock, paths=[path])
    # No 1084/1086 before DCGM 4.6, and this DCGM knows no link fields (1009-1012): watched without them.
    assert state["watched"] == (100, 113, 1004, 1002, 1005, 1001, 1003)
    assert state["update_us"] == 1_000_000
    snapshot = source.read()
    reading, blank = snapshot.readings
    # GPU 1's blank TPA is no value, and its clock, which DCGM did give, stays beside the error.
    assert (blank.gpu.uuid, blank.tensor_active, blank.sm_clock_hz) == ("GPU-1111", None, 1755e6)
    assert reading.gpu.uuid == "GPU-0000"
    assert (reading.gpu.model, reading.gpu.host, reading.gpu.index) == ("NVIDIA H100 80GB HBM3", "node-3", 0)
    assert (reading.tensor_active, reading.sm_clock_hz, reading.max_sm_clock_hz) == (0.5, 1755e6, 1980e6)
    assert reading.sm_active == 0.75
    assert reading.dram_active is None  # DCGM had no data: absent
    assert (reading.start_ns, reading.end_ns) == (11_000_000_000, 12_000_000_000)
    (error,) = snapshot.errors
    assert error.gpu is not None
    assert error.gpu.uuid == "GPU-1111"
    assert error.reason == names.ErrorReason.NO_VALUE
    assert "tensor pipe activity" in error.message
    source.close()
    assert state["calls"] == ["unwatched", "field group destroyed", "group destroyed", "shutdown"]


def test_cycle_counters_where_dcgm_has_them(bindings: tuple[Path, dict[str, Any]]) -> None:
    path, state = bindings
    state["known"] |= {1084, 1086}
    state["gpus"] = state["gpus"][:1]
    state["values"] = {(0, 100): (1755, 1), (0, 1084): (10**15, 1_000_000), (0, 1086): (10**14, 1_000_000)}
    source = DcgmSource.open(clock=Ticks(), paths=[path])
    assert 1084 in state["watched"]
    assert 1086 in state["watched"]
    assert source.read().errors[0].reason == names.ErrorReason.NO_VALUE  # one counter value is no delta yet
    state["values"].update(
        {(0, 1084): (10**15 + 1_755_000_000, 2_000_000), (0, 1086): (10**14 + 877_500_000, 2_000_000)}
    )
    (reading,) = source.read().readings
    assert reading.cycles == CycleCounters(1_755_000_000, 877_500_000)
    assert (reading.start_ns, reading.end_ns) == (1_000_000_000, 2_000_000_000)  # the counters' own timestamps
    source.close()


def test_profiling_refused_still_reads_clocks_and_says_why(bindings: tuple[Path, dict[str, Any]]) -> None:
    path, state = bindings
    state["profiling"] = False
    state["values"] = {(0, 100): (1410, 1), (1, 100): (1410, 1)}
    source = DcgmSource.open(clock=Ticks(), paths=[path])
    assert state["watched"] == (100, 113)
    snapshot = source.read()
    assert [(r.tensor_active, r.sm_clock_hz) for r in snapshot.readings] == [(None, 1410e6)] * 2  # clocks kept
    assert len(snapshot.errors) == 2
    assert all("Profiling is not supported" in e.message for e in snapshot.errors)
    source.close()


def test_host_engine_down_is_one_line(bindings: tuple[Path, dict[str, Any]]) -> None:
    path, _ = bindings
    with pytest.raises(SourceUnavailable, match=r"^DCGM: cannot use nv-hostengine at down: Connection") as caught:
        DcgmSource.open("down", paths=[path])
    assert "\n" not in str(caught.value)


def test_no_supported_gpus_is_unavailable(bindings: tuple[Path, dict[str, Any]]) -> None:
    path, state = bindings
    state["gpus"] = []
    with pytest.raises(SourceUnavailable, match="sees no supported GPUs"):
        DcgmSource.open(paths=[path])
    assert state["calls"] == ["group destroyed", "shutdown"]


# --- power, energy, throttling ----------------------------------------------------------------------------


def test_power_energy_and_violation_shares_from_dcgm_fields(bindings: tuple[Path, dict[str, Any]]) -> None:
    path, state = bindings
    state["known"] |= {112, 155, 156, 240, 241, 242, 243, 245}
    state["gpus"] = state["gpus"][:1]
    second = 1_000_000  # DCGM timestamps are in us
    core = {(0, 100): (1755, 1), (0, 1004): (0.5, 1)}
    state["values"] = {
        **core,
        (0, 155): (612.5, 10 * second),  # W
        (0, 156): (9_000_000_000, 10 * second),  # mJ since the driver loaded
        (0, 112): (0x4, 10 * second),  # SW power cap, sampled once
        (0, 240): (50 * 10**9, 10 * second),  # ns of violation so far
        (0, 241): (10**9, 10 * second),
    }
    source = DcgmSource.open(clock=Ticks(), paths=[path])
    assert {112, 155, 156, 240, 241, 242, 243, 245} <= set(state["watched"])
    (first,) = source.read().readings
    assert first.power_w == 612.5  # no energy delta yet: the field's own reading
    assert first.energy is not None
    assert (first.energy.joules, first.energy.start_ns) == (0.0, 10 * 10**9)
    assert first.throttle == {reason: 1.0 if reason == "power" else 0.0 for reason in names.ThrottleReason.ALL}

    state["values"].update(
        {
            (0, 155): (640.0, 20 * second),
            (0, 156): (9_000_000_000 + 6_000_000, 20 * second),  # +6000 J in 10 s
            (0, 112): (0x0, 20 * second),
            (0, 240): (50 * 10**9 + 4 * 10**9, 20 * second),  # +4 s of 10
            (0, 241): (10**9, 20 * second),
        }
    )
    (reading,) = source.read().readings
    assert reading.power_w == 600.0  # 6000 J / 10 s, not the instantaneous 640 W
    assert reading.energy is not None
    assert (reading.energy.joules, reading.energy.start_ns) == (6000.0, 10 * 10**9)
    assert reading.throttle == pytest.approx(
        {"power": 0.4, "thermal": 0.0, "hw_slowdown": 0.0, "sync_boost": 0.0, "app_clock": 0.0, "other": 0.0}
    )
    source.close()


def test_a_host_engine_without_the_power_fields_still_reads_ofu_and_leaves_them_absent(
    bindings: tuple[Path, dict[str, Any]],
) -> None:
    path, state = bindings
    state["gpus"] = state["gpus"][:1]
    state["values"] = {(0, 100): (1755, 1), (0, 1004): (0.5, 1)}
    source = DcgmSource.open(clock=Ticks(), paths=[path])
    assert 155 not in state["watched"]  # this DCGM knows none of them: watched without
    (reading,) = source.read().readings
    assert (reading.power_w, reading.energy, dict(reading.throttle)) == (None, None, {})
    source.close()


def test_blank_power_fields_are_absent_not_zero(bindings: tuple[Path, dict[str, Any]]) -> None:
    path, state = bindings
    state["known"] |= {112, 155, 156, 240, 241, 242, 243, 245}
    state["gpus"] = state["gpus"][:1]
    state["values"] = {
        (0, 100): (1755, 1),
        (0, 1004): (0.5, 1),
        (0, 155): (140737488355328.0, 1),  # DCGM_FP64_BLANK
        (0, 156): (9223372036854775794, 1),  # INT64 not supported
        (0, 112): (9223372036854775792, 1),  # DCGM_INT64_BLANK
    }
    source = DcgmSource.open(clock=Ticks(), paths=[path])
    (reading,) = source.read().readings
    assert (reading.power_w, reading.energy, dict(reading.throttle)) == (None, None, {})
    source.close()


# --- engine activity, occupancy and link traffic ------------------------------------------------------------


def test_engine_activity_occupancy_and_link_rates_integrated_over_the_read_interval(
    bindings: tuple[Path, dict[str, Any]],
) -> None:
    path, state = bindings
    state["known"] |= {1009, 1010, 1011, 1012}
    state["gpus"] = state["gpus"][:1]
    blank = 9223372036854775792  # DCGM_INT64_BLANK: the link fields are int64
    state["values"] = {
        (0, 100): (1755, 1),
        (0, 1004): (0.45, 1),
        (0, 1001): (0.93, 1),
        (0, 1002): (0.81, 1),
        (0, 1003): (0.31, 1),
        (0, 1009): (1_000_000_000, 1),  # bytes per second
        (0, 1010): (4_000_000_000, 1),
        (0, 1011): (250_000_000_000, 1),
        (0, 1012): (blank, 1),
    }
    source = DcgmSource.open(clock=Ticks(), paths=[path])  # opened at 11 s: the reads come every second
    assert {1001, 1003, 1009, 1010, 1011, 1012} <= set(state["watched"])
    (first,) = source.read().readings
    state["values"][(0, 1011)] = (50_000_000_000, 2)
    (second,) = source.read().readings
    source.close()

    assert (first.engine_active, first.sm_active, first.sm_occupancy) == (0.93, 0.81, 0.31)
    start = 11 * SECOND_NS
    # Rate x the 1 s read interval: PCIe 1 GB and 4 GB; NVLink 250 GB sent; the receive side is blank: no point.
    assert first.pcie_io == {TX: IoCounter(1e9, start), RX: IoCounter(4e9, start)}
    assert first.nvlink_io == {TX: IoCounter(2.5e11, start)}
    # Then + 50 GB/s x 1 s: 300 GB since the counter started; PCIe doubles.
    assert second.nvlink_io == {TX: IoCounter(3e11, start)}
    assert second.pcie_io == {TX: IoCounter(2e9, start), RX: IoCounter(8e9, start)}


def test_a_gpu_that_refuses_the_nvlink_fields_still_gets_pcie(bindings: tuple[Path, dict[str, Any]]) -> None:
    path, state = bindings
    state["known"] |= {1009, 1010}  # a PCIe card: no NVLink fields
    state["gpus"] = state["gpus"][:1]
    state["values"] = {(0, 100): (1755, 1), (0, 1004): (0.5, 1), (0, 1009): (2_000_000_000, 1)}
    source = DcgmSource.open(clock=Ticks(), paths=[path])
    assert state["watched"] == (100, 113, 1004, 1002, 1005, 1001, 1003, 1009, 1010)
    (reading,) = source.read().readings
    source.close()
    assert reading.pcie_io == {TX: IoCounter(2e9, 11 * SECOND_NS)}  # 2 GB/s x 1 s
    assert (dict(reading.nvlink_io), reading.engine_active) == ({}, None)  # DCGM had no 1001 value: absent
