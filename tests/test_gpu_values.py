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


def mig_reading(model: str, profile: str, *, tensor_active: float, clock_mhz: float) -> GpuReading:
    plain = reading(model, tensor_active=tensor_active, sm_clock_hz=clock_mhz * MHZ, max_sm_clock_hz=None)
    return attrs.evolve(plain, gpu=attrs.evolve(plain.gpu, mig_profile=profile))


def test_a_mig_slice_achieves_its_sms_share_of_the_gpus_peak() -> None:
    # NVIDIA's DCGM user guide, MIG example: an A100 (108 SMs, 312 dense FP16 TFLOP/s at 1410 MHz) as 3g.20gb GPU
    # instances of 42 SMs each (nvidia-smi mig -lgip there: 42 SMs of the 98 the MIG profiles use). A slice's peak is
    # its SMs' share, 312 x 42 / 108 = 121.33 TFLOP/s, not its compute slices' 3/7 x 312 = 133.71 (10.2 % high).
    # At the guide's instance tensor activity 0.952 and the full 1410 MHz: 0.952 x 121.33 = 115.51 TFLOP/s.
    values = gpu_values.compute(
        mig_reading("NVIDIA A100-SXM4-40GB", "3g.20gb", tensor_active=0.952, clock_mhz=1410), precision="fp16"
    )
    assert values.ofu == pytest.approx(0.952)
    assert values.flops_achieved == pytest.approx(115.51e12, rel=1e-4)
    # An H100's 1g.10gb holds 16 of its 132 SMs: at OFU 0.5, 0.5 x 989.4 x 16 / 132 = 59.96 TFLOP/s (not 1/7's 70.67).
    h100 = gpu_values.compute(mig_reading(H100, "1g.10gb", tensor_active=0.5, clock_mhz=1830), precision="bf16")
    assert h100.flops_achieved == pytest.approx(59.964e12, rel=1e-4)


def test_a_mig_profile_whose_sms_no_source_gives_has_no_achieved_flops(caplog: pytest.LogCaptureFixture) -> None:
    # A compute instance inside a GPU instance (1c.3g.40gb): its SM count is in no table here. The slice share would
    # be a guess, so FLOP/s are left out (OFU, a share of the slice's own tensor cores, stands).
    with caplog.at_level(logging.WARNING, logger="otel_ofu.gpu_values"):
        values = gpu_values.compute(
            mig_reading(H100, "1c.3g.40gb", tensor_active=0.5, clock_mhz=1830), precision="bf16"
        )
    assert values.ofu == pytest.approx(0.5)
    assert values.flops_achieved is None
    assert any("1c.3g.40gb" in record.getMessage() for record in caplog.records)


# --- what a reading must hold for OFU --------------------------------------------------------------------------

RTX_4000_ADA = "NVIDIA RTX 4000 Ada Generation"


def test_a_clock_above_the_catalogs_max_is_a_reading_not_an_error() -> None:
    # An idle RTX 4000 Ada runs its SM clock at 2310 MHz, above the 2175 MHz boost its datasheet rates and the
    # catalog holds as its max (dcgm-exporter gives no max). The catalog's figure is a rating, not a bound: the
    # reading stands, its clock ratio is 1, and tensor activity 0 gives OFU 0 (it used to be invalid, and the GPU
    # dropped out of the bill).
    idle = gpu_values.compute(reading(RTX_4000_ADA, tensor_active=0.0, sm_clock_hz=2310 * MHZ, max_sm_clock_hz=None))
    assert (idle.ofu, idle.ofu_raw, idle.sm_clock_hz) == (0.0, 0.0, 2310 * MHZ)
    assert idle.max_clock_from_catalog
    busy = gpu_values.compute(reading(RTX_4000_ADA, tensor_active=0.5, sm_clock_hz=2310 * MHZ, max_sm_clock_hz=None))
    assert busy.ofu == pytest.approx(0.5)  # 0.5 x min(1, 2310 / 2175)
    assert busy.ofu_raw == pytest.approx(0.5)


def test_a_clock_above_the_devices_own_max_is_still_invalid() -> None:
    # The device's own max clock (NVML, DCGM 113/1608) is a bound: 5 % above it is a stale or wrong max.
    with pytest.raises(InvalidReading, match="above the max clock"):
        gpu_values.compute(reading(H100, sm_clock_hz=2079 * MHZ, max_sm_clock_hz=1980 * MHZ))


@pytest.mark.parametrize(
    ("model", "sm_clock_hz", "max_sm_clock_hz"),
    [
        (H100, None, None),  # no clock at all
        ("NVIDIA TITAN V", 1200 * MHZ, None),  # a model the catalog does not know, no max: no OFU but at TPA 0
        (H100, 2500 * MHZ, 1980 * MHZ),  # a clock that would be invalid against its own max
    ],
)
def test_tensor_activity_zero_is_ofu_zero_whatever_the_clocks(
    model: str, sm_clock_hz: float | None, max_sm_clock_hz: float | None
) -> None:
    values = gpu_values.compute(
        reading(model, tensor_active=0.0, sm_clock_hz=sm_clock_hz, max_sm_clock_hz=max_sm_clock_hz), precision="bf16"
    )
    assert values.ofu == 0.0
    assert values.tensor_active == 0.0
    assert values.sm_clock_hz in (None, 1200 * MHZ, 2500 * MHZ)  # the reading's clock when it is one, else absent


def test_tensor_activity_zero_from_cycle_counters_is_ofu_zero_without_a_max() -> None:
    counters = reading("NVIDIA TITAN V", tensor_active=None, sm_clock_hz=None, max_sm_clock_hz=None,
                       cycles=CycleCounters(sm_cycles_elapsed=12_000_000_000, mma_cycles_active=0))  # fmt: skip
    values = gpu_values.compute(counters)
    assert (values.ofu, values.tensor_active) == (0.0, 0.0)
    assert values.sm_clock_hz == pytest.approx(1200 * MHZ)  # 1.2e10 cycles over 10 s


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
