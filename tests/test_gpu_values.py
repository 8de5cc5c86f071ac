"""From a reading to the contract's values: clock domains, catalog fallbacks, cycle counters, calibration."""

from __future__ import annotations

import logging
import math

import pytest

from otel_ofu import gpu_values, names
from otel_ofu.gpu_values import CalibrationTable
from otel_ofu.model import CycleCounters, GpuIdentity, GpuReading
from otel_ofu.names import ErrorReason
from otel_ofu.ofu_math import InvalidReading

MHZ = 1e6
H100 = "NVIDIA H100 80GB HBM3"
START_NS = 1_767_225_600_000_000_000
TEN_S_NS = 10_000_000_000


def reading(
    model: str = H100,
    *,
    tensor_active: float | None = 0.5,
    sm_clock_hz: float | None = 1830 * MHZ,
    max_sm_clock_hz: float | None = 1980 * MHZ,
    cycles: CycleCounters | None = None,
    sm_active: float | None = None,
    dram_active: float | None = None,
) -> GpuReading:
    gpu = GpuIdentity(uuid="GPU-00000000-0000-4000-8000-000000000000", model=model, index=0, host="node-1")
    return GpuReading(
        gpu=gpu,
        start_ns=START_NS,
        end_ns=START_NS + TEN_S_NS,
        tensor_active=tensor_active,
        sm_clock_hz=sm_clock_hz,
        max_sm_clock_hz=max_sm_clock_hz,
        sm_active=sm_active,
        dram_active=dram_active,
        cycles=cycles,
    )


def test_h100_ofu_is_in_the_tensor_domain_and_raw_in_the_board_domain() -> None:
    values = gpu_values.compute(reading(), precision="bf16")
    assert values.ofu == pytest.approx(0.5)
    assert values.ofu_raw == pytest.approx(0.5 * 1830 / 1980)
    assert values.tensor_active == 0.5
    assert values.sm_clock_hz == 1830 * MHZ
    assert values.max_sm_clock_hz == 1980 * MHZ
    assert not values.max_clock_from_catalog
    assert values.flops_achieved == pytest.approx(0.5 * 989.4e12)


def test_h100_boost_above_tensor_clock_is_capped() -> None:
    values = gpu_values.compute(reading(sm_clock_hz=1980 * MHZ))
    assert values.ofu == pytest.approx(0.5)
    assert values.ofu_raw == pytest.approx(0.5)


@pytest.mark.parametrize(
    ("precision", "peak"), [("bf16", 989.4e12), ("fp16", 989.4e12), ("fp8", 1979e12), ("tf32", 494.7e12)]
)
def test_achieved_flops_uses_the_peak_of_the_precision(precision: str, peak: float) -> None:
    values = gpu_values.compute(reading(), precision=precision)
    assert values.flops_achieved == pytest.approx(values.ofu * peak)


@pytest.mark.parametrize("precision", [None, "mixed", "unknown", "fp4"])
def test_achieved_flops_is_left_out_without_a_known_peak(precision: str | None) -> None:
    values = gpu_values.compute(reading(), precision=precision)
    assert values.flops_achieved is None
    assert names.GPU_FLOPS_ACHIEVED.name not in values.as_metrics()


def test_unknown_model_uses_the_device_max_clock_and_has_no_flops(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="otel_ofu.gpu_values"):
        values = gpu_values.compute(
            reading("NVIDIA TITAN V", sm_clock_hz=1200 * MHZ, max_sm_clock_hz=1455 * MHZ), precision="fp16"
        )
    assert values.ofu == pytest.approx(0.5 * 1200 / 1455)
    assert values.ofu_raw == values.ofu
    assert values.flops_achieved is None
    assert not values.max_clock_from_catalog


def test_unknown_model_without_a_max_clock_has_no_ofu() -> None:
    with pytest.raises(InvalidReading) as excinfo:
        gpu_values.compute(reading("NVIDIA A30", max_sm_clock_hz=None))
    assert excinfo.value.reason == ErrorReason.NO_VALUE


def test_missing_max_clock_falls_back_to_the_catalog_boost_clock() -> None:
    values = gpu_values.compute(reading(max_sm_clock_hz=None, sm_clock_hz=1700 * MHZ))
    assert values.max_clock_from_catalog
    assert values.max_sm_clock_hz == 1980 * MHZ
    assert values.ofu == pytest.approx(0.5 * 1700 / 1830)
    assert values.ofu_raw == pytest.approx(0.5 * 1700 / 1980)


def test_catalog_without_a_board_clock_needs_the_device_max_clock() -> None:
    # B200's board max is not published: no fallback may be invented.
    with pytest.raises(InvalidReading) as excinfo:
        gpu_values.compute(reading("NVIDIA B200", sm_clock_hz=1800 * MHZ, max_sm_clock_hz=None))
    assert excinfo.value.reason == ErrorReason.NO_VALUE
    values = gpu_values.compute(reading("NVIDIA B200", sm_clock_hz=1800 * MHZ, max_sm_clock_hz=1965 * MHZ))
    assert values.ofu == pytest.approx(0.5 * 1800 / 1856)


def test_cycle_counters_take_precedence_over_the_point_sample() -> None:
    # 10 s at a mean 1700 MHz, tensor pipes active 40% of the cycles; the point sample says otherwise.
    elapsed = round(1700 * MHZ * 10)
    cycles = CycleCounters(sm_cycles_elapsed=elapsed, mma_cycles_active=round(elapsed * 0.4))
    values = gpu_values.compute(reading(tensor_active=0.9, sm_clock_hz=1980 * MHZ, cycles=cycles), precision="bf16")
    assert values.tensor_active == pytest.approx(0.4)
    assert values.sm_clock_hz == pytest.approx(1700 * MHZ)
    assert values.ofu == pytest.approx(0.4 * 1700 / 1830)
    assert values.ofu_raw == pytest.approx(0.4 * 1700 / 1980)
    assert values.flops_achieved == pytest.approx(values.ofu * 989.4e12)


def test_cycle_counters_alone_are_enough() -> None:
    elapsed = round(1500 * MHZ * 10)
    cycles = CycleCounters(sm_cycles_elapsed=elapsed, mma_cycles_active=elapsed // 4)
    values = gpu_values.compute(reading(tensor_active=None, sm_clock_hz=None, cycles=cycles))
    assert values.ofu == pytest.approx(0.25 * 1500 / 1830)


def test_impossible_cycle_counters_are_invalid() -> None:
    cycles = CycleCounters(sm_cycles_elapsed=100, mma_cycles_active=200)
    with pytest.raises(InvalidReading) as excinfo:
        gpu_values.compute(reading(cycles=cycles))
    assert excinfo.value.reason == ErrorReason.INVALID_VALUE


@pytest.mark.parametrize(
    ("tensor_active", "sm_clock", "reason"),
    [
        (None, 1700 * MHZ, ErrorReason.NO_VALUE),
        (math.nan, 1700 * MHZ, ErrorReason.INVALID_VALUE),
        (1.5, 1700 * MHZ, ErrorReason.INVALID_VALUE),
        (0.5, 0.0, ErrorReason.INVALID_VALUE),
        (0.5, None, ErrorReason.NO_VALUE),
        (0.5, 2500 * MHZ, ErrorReason.INVALID_VALUE),
    ],
)
def test_bad_readings_raise_typed_errors(tensor_active: float | None, sm_clock: float | None, reason: str) -> None:
    with pytest.raises(InvalidReading) as excinfo:
        gpu_values.compute(reading(tensor_active=tensor_active, sm_clock_hz=sm_clock))
    assert excinfo.value.reason == reason


def test_calibration_scales_ofu_and_flops_but_not_raw() -> None:
    plain = gpu_values.compute(reading(sm_clock_hz=1700 * MHZ), precision="bf16")
    calibrated = gpu_values.compute(reading(sm_clock_hz=1700 * MHZ), precision="bf16", calibration=0.9)
    assert calibrated.ofu == pytest.approx(plain.ofu * 0.9)
    assert calibrated.ofu_raw == plain.ofu_raw
    assert plain.flops_achieved is not None
    assert calibrated.flops_achieved == pytest.approx(plain.flops_achieved * 0.9)


def test_optional_gauges_are_kept_when_valid_and_left_out_when_not() -> None:
    values = gpu_values.compute(reading(sm_active=0.8, dram_active=0.3))
    assert (values.sm_active, values.dram_active) == (0.8, 0.3)
    broken = gpu_values.compute(reading(sm_active=math.nan, dram_active=1.7))
    assert broken.sm_active is None
    assert broken.dram_active is None
    assert broken.ofu == pytest.approx(0.5)


def test_as_metrics_names_come_from_the_vocabulary() -> None:
    metrics = gpu_values.compute(reading(sm_active=0.8), precision="bf16").as_metrics()
    assert set(metrics) == {
        names.GPU_OFU.name,
        names.GPU_OFU_RAW.name,
        names.GPU_TENSOR_ACTIVE.name,
        names.GPU_CLOCK_SM.name,
        names.GPU_CLOCK_SM_MAX.name,
        names.GPU_FLOPS_ACHIEVED.name,
        names.GPU_SM_ACTIVE.name,
    }
    assert all(math.isfinite(value) for value in metrics.values())


def test_say_once_logs_each_message_once(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="otel_ofu.gpu_values"):
        for _ in range(3):
            gpu_values.say_once("test_say_once: a message seen once")
    assert [record.getMessage() for record in caplog.records].count("test_say_once: a message seen once") == 1


# --- calibration table ------------------------------------------------------------------------------


def test_calibration_table_parse_and_lookup() -> None:
    table = CalibrationTable.parse("job:run-7=0.9, model:H100-SXM=0.95 ,model:NVIDIA L4=0.97")
    assert table.by_job == {"run-7": 0.9}
    assert table.by_model == {"H100-SXM": 0.95, "NVIDIA L4": 0.97}
    assert table.factor(H100, "run-7") == 0.9  # the job beats the model
    assert table.factor(H100, "other") == 0.95  # catalog key of the device name
    assert table.factor(H100, None) == 0.95
    assert table.factor("NVIDIA L4", None) == 0.97  # exact device name
    assert table.factor("NVIDIA A100-SXM4-80GB", None) == 1.0
    assert table.factor("NVIDIA TITAN V", "run-8") == 1.0


def test_exact_device_name_beats_the_catalog_key() -> None:
    table = CalibrationTable.parse(f"model:H100-SXM=0.95,model:{H100}=0.92")
    assert table.factor(H100, None) == 0.92
    assert table.factor("NVIDIA H100 SXM5 80GB", None) == 0.95


def test_empty_calibration_is_identity() -> None:
    table = CalibrationTable.parse("")
    assert table.factor(H100, "job") == 1.0
    assert CalibrationTable().factor(H100, None) == 1.0


@pytest.mark.parametrize(
    "text",
    ["run-7=0.9", "job:=0.9", "job:run-7=", "host:a=0.9", "job:run-7", "job:run-7=abc", "model:L4=0", "model:L4=1.2"],
)
def test_calibration_table_rejects_bad_entries(text: str) -> None:
    with pytest.raises(ValueError):  # noqa: PT011  # messages differ by entry; each is a ValueError
        CalibrationTable.parse(text)
