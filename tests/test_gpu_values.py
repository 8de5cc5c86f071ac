"""From a reading to the contract's values: clock domains, catalog fallbacks, cycle counters, calibration."""

from __future__ import annotations

import logging
import math
import subprocess

import attrs
import pytest

from otel_ofu import gpu_values, names
from otel_ofu.gpu_values import CalibrationTable
from otel_ofu.model import CycleCounters, GpuIdentity, GpuReading
from otel_ofu.names import ErrorReason
from otel_ofu.ofu_math import InvalidReading
from otel_ofu.sources.max_clock import MaxClockTable

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


def test_a_mig_slice_achieves_its_share_of_the_gpus_peak() -> None:
    # A 1g.10gb instance holds 1 of the H100's 7 compute slices: at OFU 0.5 it does 0.5 x 989.4 / 7 = 70.7 TFLOP/s,
    # not half the whole GPU's peak (its OFU is the share of its own tensor cores).
    slice_reading = reading()
    slice_reading = attrs.evolve(slice_reading, gpu=attrs.evolve(slice_reading.gpu, mig_profile="1g.10gb"))
    values = gpu_values.compute(slice_reading, precision="bf16")
    assert values.ofu == pytest.approx(0.5)
    assert values.flops_achieved == pytest.approx(0.5 * 989.4e12 / 7)


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
        gpu_values.compute(reading("NVIDIA Future GPU 80GB", max_sm_clock_hz=None))
    assert excinfo.value.reason == ErrorReason.NO_VALUE


def test_a_model_with_no_max_clock_anywhere_is_told_the_exact_option_once(caplog: pytest.LogCaptureFixture) -> None:
    # A name with the characters a shell would take apart inside double quotes: the suggestion quotes them.
    name = 'NVIDIA Lab "X" $1 GPU'
    with caplog.at_level(logging.WARNING, logger="otel_ofu.gpu_values"):
        for _ in range(3):  # three intervals: one log line
            with pytest.raises(InvalidReading) as excinfo:
                gpu_values.compute(reading(name, max_sm_clock_hz=None))
            assert excinfo.value.reason == ErrorReason.NO_VALUE
    said = [record.getMessage() for record in caplog.records if "--max-sm-clock" in record.getMessage()]
    assert len(said) == 1
    option = '--max-sm-clock "NVIDIA Lab \\"X\\" \\$1 GPU=MHZ"'
    assert option in said[0]
    assert option in str(excinfo.value)  # the GPU's error (snapshot shows it) says it too
    # Typed into a real shell with the MHz filled in, the option gives exactly this model its clock.
    shell = subprocess.run(
        ["sh", "-c", "printf '%s\\n' " + option.replace("MHZ", "1500")], capture_output=True, text=True, check=True
    )
    argv = shell.stdout.splitlines()
    assert argv[0] == "--max-sm-clock"
    assert MaxClockTable.parse(argv[1]).max_clock_hz(name) == 1500 * MHZ


def test_a_catalog_model_with_no_clock_is_told_the_option_too(caplog: pytest.LogCaptureFixture) -> None:
    # The H20 is in the catalog (its peaks are known) but no source gives its clocks.
    with caplog.at_level(logging.WARNING, logger="otel_ofu.gpu_values"), pytest.raises(InvalidReading) as excinfo:
        gpu_values.compute(reading("NVIDIA H20", max_sm_clock_hz=None))
    assert '--max-sm-clock "NVIDIA H20=MHZ"' in str(excinfo.value)


def test_missing_max_clock_falls_back_to_the_catalog_boost_clock() -> None:
    values = gpu_values.compute(reading(max_sm_clock_hz=None, sm_clock_hz=1700 * MHZ))
    assert values.max_clock_from_catalog
    assert values.max_sm_clock_hz == 1980 * MHZ
    assert values.ofu == pytest.approx(0.5 * 1700 / 1830)
    assert values.ofu_raw == pytest.approx(0.5 * 1700 / 1980)


def test_a_catalog_tensor_clock_gives_ofu_where_no_board_max_is_known() -> None:
    # B200: the catalog knows its tensor clock (1856 MHz), not its board max; dcgm-exporter's default counters carry
    # no max clock. TPA 0.5 at 1800 MHz: OFU = 0.5 x 1800 / 1856 = 0.48491, FLOP/s = 0.48491 x 2250 T = 1091 T.
    # Raw OFU (TPA x f / f_max_board) and the max clock have no value without a board max: absent, never 0.
    values = gpu_values.compute(reading("NVIDIA B200", sm_clock_hz=1800 * MHZ, max_sm_clock_hz=None), precision="bf16")
    assert values.ofu == pytest.approx(0.48491, abs=1e-5)
    assert values.flops_achieved == pytest.approx(0.48491 * 2250e12, rel=1e-4)
    assert values.ofu_raw is None
    assert values.max_sm_clock_hz is None
    assert not values.max_clock_from_catalog
    metrics = values.as_metrics()
    assert names.GPU_OFU.name in metrics
    assert names.GPU_OFU_RAW.name not in metrics
    assert names.GPU_CLOCK_SM_MAX.name not in metrics
    # The device's own max clock, when a source sends it, gives raw OFU as before: 0.5 x 1800 / 1965 = 0.45802.
    values = gpu_values.compute(reading("NVIDIA B200", sm_clock_hz=1800 * MHZ, max_sm_clock_hz=1965 * MHZ))
    assert values.ofu == pytest.approx(0.48491, abs=1e-5)
    assert values.ofu_raw == pytest.approx(0.45802, abs=1e-5)


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
