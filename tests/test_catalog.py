"""The GPU catalog: matching NVML/dcgm-exporter name strings, and the consistency of its figures."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import pytest

from otel_ofu import catalog, names
from otel_ofu.model import GpuIdentity, GpuReading
from otel_ofu.sources.max_clock import MaxClockTable

# Device names exactly as NVML (nvmlDeviceGetName) and dcgm-exporter's modelName label print them.
KNOWN_NAMES = [
    ("NVIDIA H100 80GB HBM3", "H100-SXM"),
    ("NVIDIA H100 SXM5 80GB", "H100-SXM"),
    ("NVIDIA H100 PCIe", "H100-PCIe"),
    ("NVIDIA H100 NVL", "H100-NVL"),
    ("NVIDIA H200", "H200-SXM"),
    ("NVIDIA H200 141GB HBM3e", "H200-SXM"),
    ("NVIDIA H200 NVL", "H200-NVL"),
    ("NVIDIA A100-SXM4-80GB", "A100-SXM"),
    ("NVIDIA A100-SXM4-40GB", "A100-SXM"),
    ("NVIDIA A100-PCIE-40GB", "A100-PCIe"),
    ("NVIDIA A100 80GB PCIe", "A100-PCIe"),
    ("NVIDIA L40S", "L40S"),
    ("NVIDIA L4", "L4"),
    ("NVIDIA B200", "B200"),
    ("NVIDIA GB200", "GB200"),
    ("Tesla V100-SXM2-16GB", "V100-SXM2"),
    ("Tesla V100-SXM2-32GB", "V100-SXM2"),
    ("Tesla V100-PCIE-32GB", "V100-PCIe"),
    ("Tesla T4", "T4"),
    ("NVIDIA A40", "A40"),
    ("NVIDIA L40", "L40"),
    ("NVIDIA H20", "H20"),
    ("NVIDIA B300", "B300"),
    ("NVIDIA GB300", "GB300"),
    ("NVIDIA A10", "A10"),
    ("NVIDIA A10G", "A10G"),
    ("NVIDIA A30", "A30"),
    ("Tesla V100S-PCIE-32GB", "V100S-PCIe"),
    ("Tesla V100-SXM3-32GB", "V100-SXM3"),
    ("Tesla V100-SXM3-32GB-H", "V100-SXM3"),
    ("NVIDIA RTX 6000 Ada Generation", "RTX-6000-Ada"),
    ("NVIDIA RTX A6000", "RTX-A6000"),
    ("NVIDIA RTX 4000 Ada Generation", "RTX-4000-Ada"),
    ("NVIDIA L20", "L20"),
    ("NVIDIA GH200 480GB", "GH200"),
    ("NVIDIA H800", "H800"),
    ("NVIDIA A800 80GB PCIe", "A800"),
    ("NVIDIA A800-SXM4-80GB", "A800"),
    # AMD Instinct, as the AMD Device Metrics Exporter's card_series label (amd-smi's market name) prints them.
    ("AMD Instinct MI210", "MI210"),
    ("AMD Instinct MI250X", "MI250X"),
    ("AMD Instinct MI300X OAM", "MI300X"),
    ("AMD Instinct MI300A", "MI300A"),
    ("AMD Instinct MI325X OAM", "MI325X"),
    ("AMD Instinct MI355X OAM", "MI355X"),
]

# No source for their figures was found: they stay unknown (--max-sm-clock gives them a max clock). "MI250X/MI250"
# is the name both MI250 and MI250X boards may carry, which differ in compute units.
UNKNOWN_NAMES = ["NVIDIA TITAN V", "NVIDIA Future GPU 80GB", "AMD Instinct MI250X/MI250", "AMD Instinct MI100", ""]

# Dense FP16/BF16 tensor FLOP per clock per SM of each architecture (Ampere 2048 on A100, Hopper 4096,
# Ada 1024, Blackwell 8192): tensor clock x SMs x rate must give the datasheet's dense peak.
DENSE_FP16_FLOP_PER_CLOCK_PER_SM = {
    "A100-SXM": 2048,
    "A100-PCIe": 2048,
    "H100-SXM": 4096,
    "H100-PCIe": 4096,
    "H100-NVL": 4096,
    "H200-SXM": 4096,
    "H200-NVL": 4096,
    "L40S": 1024,
    "L4": 1024,
    "B200": 8192,
    "GB200": 8192,
    "V100-SXM2": 1024,  # Volta: 8 tensor cores x 64 FMA x 2
    "V100-PCIe": 1024,
    "V100S-PCIe": 1024,
    "V100-SXM3": 1024,
    "T4": 1024,  # Turing: the same 8 x 64 FMA per SM
    "A30": 2048,  # GA100, as A100
    "A800": 2048,
    "GH200": 4096,  # Hopper, as H100
    "A10": 1024,  # GA102 with full-rate FP32 accumulate (the datasheet's 125 TFLOPS at 72 SMs and 1695 MHz)
    "A40": 1024,
    # AMD Instinct, FP16 matrix FLOP per clock per compute unit (ROCm MI250 / MI300 microarchitecture tables; CDNA 4
    # doubles CDNA 3's per-CU rate).
    "MI210": 1024,
    "MI250X": 1024,
    "MI300X": 2048,
    "MI300A": 2048,
    "MI325X": 2048,
    "MI355X": 4096,
}


@pytest.mark.parametrize(("device_name", "key"), KNOWN_NAMES)
def test_lookup_matches_real_device_names(device_name: str, key: str) -> None:
    spec = catalog.lookup(device_name)
    assert spec is not None
    assert spec.key == key


@pytest.mark.parametrize("device_name", UNKNOWN_NAMES)
def test_unknown_models_get_no_figures(device_name: str) -> None:
    assert catalog.lookup(device_name) is None


def test_lookup_ignores_case() -> None:
    assert catalog.lookup("nvidia h100 pcie") is catalog.H100_PCIE


def test_every_spec_is_reachable_by_some_name() -> None:
    reachable = {spec.key for name, _ in KNOWN_NAMES if (spec := catalog.lookup(name)) is not None}
    assert reachable == {spec.key for spec in catalog.ALL_SPECS}


def test_keys_are_unique() -> None:
    keys = [spec.key for spec in catalog.ALL_SPECS]
    assert len(keys) == len(set(keys))


@pytest.mark.parametrize("spec", catalog.ALL_SPECS, ids=lambda spec: spec.key)
def test_fp16_equals_bf16(spec: catalog.GpuSpec) -> None:
    assert spec.peak("fp16") == spec.peak("bf16")


# Rows whose tensor peaks no source gives (a workstation datasheet's "tensor performance" names no precision; the
# A10G has no NVIDIA datasheet): they get OFU but no gpu.flops.achieved.
NO_TENSOR_PEAKS = {"A10G", "RTX-A6000", "RTX-6000-Ada", "RTX-4000-Ada", "L20", "H800"}


@pytest.mark.parametrize("spec", catalog.ALL_SPECS, ids=lambda spec: spec.key)
def test_fp8_is_twice_bf16_where_present(spec: catalog.GpuSpec) -> None:
    fp8, bf16 = spec.peak("fp8"), spec.peak("bf16")
    if fp8 is None:
        # Volta, Turing, Ampere and CDNA 2 have no FP8 matrix units; no source gives the H20's.
        assert spec.key.startswith(("A", "V100", "T4", "H20", "MI2")) or spec.key in NO_TENSOR_PEAKS
        return
    assert bf16 is not None
    assert fp8 == pytest.approx(2 * bf16, rel=0.02)  # L40S prints 362 / 733


@pytest.mark.parametrize("spec", catalog.ALL_SPECS, ids=lambda spec: spec.key)
def test_peaks_are_known_precisions_and_positive(spec: catalog.GpuSpec) -> None:
    assert spec.sm_count is None or spec.sm_count > 0
    assert bool(spec.peak("bf16")) != (spec.key in NO_TENSOR_PEAKS)
    for precision, flops in spec.peak_flops.items():
        assert precision in names.PRECISIONS
        assert flops > 0
    assert spec.peak("mixed") is None
    assert spec.peak("unknown") is None
    assert spec.peak(None) is None


@pytest.mark.parametrize("spec", catalog.ALL_SPECS, ids=lambda spec: spec.key)
def test_tensor_clock_x_sms_x_rate_is_the_bf16_peak(spec: catalog.GpuSpec) -> None:
    if spec.key not in DENSE_FP16_FLOP_PER_CLOCK_PER_SM:
        # No per-SM rate or clock from a source: the tensor clock stays unknown, never guessed.
        assert spec.tensor_clock_hz is None
        return
    assert spec.tensor_clock_hz is not None
    assert spec.sm_count is not None
    bf16 = spec.peak("bf16")
    assert bf16 is not None
    derived = spec.tensor_clock_hz * spec.sm_count * DENSE_FP16_FLOP_PER_CLOCK_PER_SM[spec.key]
    assert derived == pytest.approx(bf16, rel=0.01)


def test_h100_figures_match_the_paper() -> None:
    # 132 SMs x 4096 dense FP16 FLOP/clk/SM x 1.83 GHz = 989.4 TFLOP/s; NVML reports 1980 MHz max.
    sxm, pcie = catalog.H100_SXM, catalog.H100_PCIE
    assert (sxm.sm_count, sxm.boost_clock_hz, sxm.tensor_clock_hz) == (132, 1980e6, 1830e6)
    assert sxm.peak("bf16") == pytest.approx(989.4e12)
    assert sxm.peak("fp8") == pytest.approx(1979e12)
    assert (pcie.sm_count, pcie.boost_clock_hz, pcie.tensor_clock_hz) == (114, 1755e6, 1620e6)


def test_h200_has_the_h100_sxm_compute() -> None:
    assert catalog.H200_SXM.peak_flops == catalog.H100_SXM.peak_flops
    assert catalog.H200_SXM.tensor_clock_hz == catalog.H100_SXM.tensor_clock_hz


@pytest.mark.parametrize("spec", catalog.ALL_SPECS, ids=lambda spec: spec.key)
def test_tensor_clock_never_exceeds_the_board_clock(spec: catalog.GpuSpec) -> None:
    if spec.boost_clock_hz is not None and spec.tensor_clock_hz is not None:
        assert spec.tensor_clock_hz <= spec.boost_clock_hz


def test_blackwell_board_clock_is_not_invented() -> None:
    assert catalog.B200.boost_clock_hz is None
    assert catalog.GB200.boost_clock_hz is None
    assert catalog.B200.peak("fp4") == pytest.approx(2 * catalog.B200.peak_flops["fp8"])


# The rows no NVIDIA source gives a board max clock for (said in each row's comment): every other row has one, so
# dcgm-exporter's default counters (no max clock) give OFU for them. Blackwell still gets OFU from its tensor clock.
NO_BOARD_MAX = {"B200", "GB200", "B300", "GB300", "H20", "H800", "V100-SXM3"}


@pytest.mark.parametrize("spec", catalog.ALL_SPECS, ids=lambda spec: spec.key)
def test_every_row_with_a_source_for_it_has_a_board_max_clock(spec: catalog.GpuSpec) -> None:
    assert (spec.boost_clock_hz is None) == (spec.key in NO_BOARD_MAX)


# Board max clocks worked from each datasheet's FP32 peak / (2 x CUDA cores) (the clock NVIDIA specifies the FP32
# peak at), against the row's figure: within the datasheet's rounding of the TFLOPS (2 %).
FP32_PEAK_TFLOPS_AND_CORES = {
    "V100-SXM2": (15.7, 5120),  # 1533 MHz against 1530
    "V100-PCIe": (14.0, 5120),  # 1367 against 1380 (14 is rounded to 2 figures)
    "V100S-PCIe": (16.4, 5120),  # 1602 against 1597
    "T4": (8.1, 2560),  # 1582 against 1590
    "A10": (31.2, 9216),  # 1693 against 1695
    "A30": (10.3, 3584),  # 1437 against 1440
    "A40": (37.4, 10752),  # 1739 against 1740
    "RTX-A6000": (38.7, 10752),  # 1800
    "L40": (90.5, 18176),  # 2490
    "L20": (59.35, 11776),  # 2520
    "RTX-6000-Ada": (91.1, 18176),  # 2506 against 2505
    "RTX-4000-Ada": (26.7, 6144),  # 2173 against 2175
    "L40S": (91.6, 18176),  # 2520
    "L4": (30.3, 7424),  # 2041 against 2040
    "A100-SXM": (19.5, 6912),  # 1411 against 1410
    "A800": (19.5, 6912),
    "H100-SXM": (67.0, 16896),  # 1983 against 1980
    "GH200": (67.0, 16896),
    "H100-PCIe": (51.0, 14592),  # 1748 against 1755
    "H100-NVL": (60.0, 16896),  # 1776: no source gives the 1785 MHz quoted for it
}


@pytest.mark.parametrize(("key", "fp32"), FP32_PEAK_TFLOPS_AND_CORES.items())
def test_board_max_clocks_agree_with_the_datasheet_fp32_peaks(key: str, fp32: tuple[float, int]) -> None:
    spec = next(spec for spec in catalog.ALL_SPECS if spec.key == key)
    tflops, cores = fp32
    assert spec.boost_clock_hz == pytest.approx(tflops * 1e12 / (2 * cores), rel=0.02)


def test_the_new_rows_hand_checked() -> None:
    # A30: 56 SMs x 2048 FLOP/clk x 1.44 GHz = 165 TFLOP/s; 4 MIG slices (MIG User Guide).
    assert (catalog.A30.boost_clock_hz, catalog.A30.compute_slices) == (1440e6, 4)
    assert catalog.A30.peak("bf16") == pytest.approx(56 * 2048 * 1.44e9, rel=0.001)
    # MI300X: 304 CUs x 2048 x 2.1 GHz = 1307.4 TFLOP/s FP16, 8 XCDs; MI300A: 228 CUs in 6 XCDs.
    assert (catalog.MI300X.sm_count, catalog.MI300X.boost_clock_hz, catalog.MI300X.compute_slices) == (304, 2.1e9, 8)
    assert catalog.MI300X.peak("fp16") == pytest.approx(304 * 2048 * 2.1e9, rel=0.001)
    assert (catalog.MI300A.sm_count, catalog.MI300A.compute_slices) == (228, 6)
    # MI355X: 256 CUs x 8192 FP8 FLOP/clk x 2.4 GHz = 5033 TFLOP/s.
    assert catalog.MI355X.peak("fp8") == pytest.approx(256 * 8192 * 2.4e9, rel=0.001)
    # MI250X, one GCD: 110 CUs x 1024 x 1.7 GHz = 191.5 TFLOP/s, half of AMD's 383 per OAM.
    assert catalog.MI250X.peak("bf16") == pytest.approx(383e12 / 2, rel=0.001)


def test_every_row_names_its_source() -> None:
    # Each row is assigned under a comment that starts with "Source:" (the catalog's rule: every figure cited).
    import inspect

    lines = inspect.getsource(catalog).splitlines()
    for spec in catalog.ALL_SPECS:
        name = next(n for n, v in vars(catalog).items() if v is spec and n.isupper())
        at = next(i for i, line in enumerate(lines) if line.startswith(f"{name} = "))
        above = at - 1
        while above > 0 and lines[above].startswith("#") and not lines[above].startswith("# Source:"):
            above -= 1
        assert lines[above].startswith("# Source:"), f"{name} has no Source comment"


# --model and --max-sm-clock: a dcgmi dmon capture names no model and, here, has no max clock (SMMAX).
DMON_NO_MAX_CLOCK = """\
dcgmi dmon -e 1004,100 -d 1000
#Entity    TENSO        SMCLK
ID
GPU 0      0.500        1300
GPU 1      0.250        1200
"""


def snapshot_lines(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, list[dict[str, Any]], str]:
    from otel_ofu import cli

    code = cli.main(["snapshot", *argv])
    out, err = capsys.readouterr()
    return code, [json.loads(line) for line in out.splitlines() if line.strip()], err


def test_a_dmon_replay_names_its_model_and_a_table_gives_an_unknown_models_max_clock(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    capture = tmp_path / "dmon.txt"
    capture.write_text(DMON_NO_MAX_CLOCK)
    replay = ["--source", "replay", "--file", str(capture)]
    code, lines, _ = snapshot_lines(replay, capsys)
    assert code == 1  # model "unknown", no max clock: no OFU at all
    assert {line[names.HW_MODEL] for line in lines} == {"unknown"}
    assert not any(names.GPU_OFU.name in line for line in lines)
    # --model: the catalog knows an H100's board clock (1980 MHz), so OFU comes.
    code, lines, _ = snapshot_lines([*replay, "--model", "NVIDIA H100 80GB HBM3"], capsys)
    assert code == 0
    assert lines[0][names.HW_MODEL] == "NVIDIA H100 80GB HBM3"
    assert lines[0][names.GPU_CLOCK_SM_MAX.name] == pytest.approx(1980e6)
    # A model the catalog lacks gets its max clock (MHz) from --max-sm-clock, or from its variable.
    monkeypatch.setenv("OTEL_OFU_MAX_SM_CLOCK", "nvidia future gpu 80gb=1410, Other GPU=1000")
    code, lines, _ = snapshot_lines([*replay, "--model", "NVIDIA Future GPU 80GB"], capsys)
    assert code == 0
    first = lines[0]
    assert first[names.GPU_CLOCK_SM_MAX.name] == pytest.approx(1410e6)
    assert first[names.GPU_OFU_RAW.name] == pytest.approx(0.5 * 1300 / 1410)


def test_a_device_reported_max_clock_is_never_overridden_and_bad_tables_say_why() -> None:
    table = MaxClockTable.parse("NVIDIA X=1500")
    gpu = GpuIdentity(uuid="GPU-1", model="NVIDIA X", index=0, host="h")
    own = GpuReading(gpu=gpu, start_ns=0, end_ns=1, tensor_active=0.5, sm_clock_hz=1e9, max_sm_clock_hz=1.7e9)
    assert table.fill(own).max_sm_clock_hz == 1.7e9
    assert table.fill(attrs.evolve(own, max_sm_clock_hz=None)).max_sm_clock_hz == 1.5e9
    other = attrs.evolve(own, gpu=attrs.evolve(gpu, model="NVIDIA Y"), max_sm_clock_hz=None)
    assert table.fill(other).max_sm_clock_hz is None
    for text, message in (("NVIDIA X", "MODEL=MHZ"), ("=1500", "MODEL=MHZ"), ("X=fast", "not a number"),
                          ("X=1.5", "not plausible"), ("X=1500000000", "not plausible")):  # fmt: skip
        with pytest.raises(ValueError, match=message):
            MaxClockTable.parse(text)


def test_issue_33s_catalog_figures() -> None:
    # A10G (AWS G5): no NVIDIA datasheet; AWS's EC2 guide sets G5's clocks to their maximum with
    # `nvidia-smi -ac 6250,1710`: 1710 MHz is the board's max graphics (SM) clock.
    assert catalog.A10G.boost_clock_hz == 1710e6
    # NVIDIA's current Blackwell tables: FP64 (and FP64 tensor) 37 TFLOPS per B200, 40 per GB200 GPU (launch: 40, 45).
    assert catalog.B200.peak("fp64") == 37e12
    assert catalog.GB200.peak("fp64") == 40e12
    # H100 NVL: no NVIDIA source gives the 1785 MHz once quoted; its brief's 60 TFLOPS FP32 / (2 x 16896) = 1776 MHz.
    assert catalog.H100_NVL.boost_clock_hz == 1776e6
    # H20: no public capture of its NVML max clock was found: none, and --max-sm-clock or the device gives it.
    assert catalog.H20.boost_clock_hz is None
