"""The GPU catalog: dense peak FLOP/s per precision, SM count and clocks per model, by device name.

Figures are dense (datasheets print 2:4-sparse tensor numbers; dense is half). Each entry names its
source. A tensor clock marked "derived" is the datasheet dense FP16/BF16 peak divided by
(SMs x dense FP16 FLOP per clock per SM), the same derivation the OFU paper uses for H100 SXM
(132 x 4096 x 1.83 GHz = 989.4 TFLOP/s). A figure no source gives is None (or absent from the peaks):
never filled in by analogy. A model that is not here gets no figures at all: OFU then uses the
device's own max clock (or ``--max-sm-clock``) and peak-derived metrics are left out.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping

import attrs

T = 1e12
MHZ = 1e6


@attrs.frozen
class GpuSpec:
    """What the catalog knows of one GPU model."""

    key: str
    sm_count: int | None  # None where no source gives it
    boost_clock_hz: float | None
    tensor_clock_hz: float | None
    peak_flops: Mapping[str, float]  # precision (names.PRECISIONS) -> dense FLOP/s per GPU
    # The compute slices a partition's share of the GPU is counted in: a MIG-capable NVIDIA GPU's compute slices
    # (a MIG profile "Ng" holds N of them; NVIDIA Multi-Instance GPU User Guide, "Supported GPUs", max number of
    # instances), an AMD Instinct's XCDs (a CPX partition holds one). None: the GPU cannot be partitioned, or no
    # source gives the count (see ``otel_ofu.gpu_share``).
    compute_slices: int | None = None

    def peak(self, precision: str | None) -> float | None:
        """Dense peak FLOP/s for a precision, or None where it is unknown (mixed, unknown, absent)."""
        if precision is None:
            return None
        return self.peak_flops.get(precision)


def _peaks(**tflops: float) -> dict[str, float]:
    peaks = {precision: value * T for precision, value in tflops.items()}
    if "bf16" in peaks:
        peaks.setdefault("fp16", peaks["bf16"])
    return peaks


# Source: NVIDIA A100 datasheet (2021), dense; 108 SMs, 1410 MHz boost; the tensor clock is the boost
# clock (108 x 2048 dense FP16 FLOP/clk/SM x 1.41 GHz = 312 TFLOP/s).
A100_SXM = GpuSpec(
    "A100-SXM", 108, 1410 * MHZ, 1410 * MHZ, _peaks(fp64=19.5, tf32=156, bf16=312, int8=624), compute_slices=7
)
# Source: NVIDIA A100 PCIe datasheet: same peaks and clocks as SXM.
A100_PCIE = GpuSpec(
    "A100-PCIe", 108, 1410 * MHZ, 1410 * MHZ, _peaks(fp64=19.5, tf32=156, bf16=312, int8=624), compute_slices=7
)
# Source: NVIDIA H100 datasheet (SXM5), dense; board max 1980 MHz per NVML; tensor clock 1830 MHz from
# the OFU paper (132 x 4096 x 1.83 GHz = 989.4 TFLOP/s).
H100_SXM = GpuSpec(
    "H100-SXM",
    132,
    1980 * MHZ,
    1830 * MHZ,
    _peaks(fp64=67, tf32=494.7, bf16=989.4, fp8=1979, int8=1979),
    compute_slices=7,
)
# Source: NVIDIA H100 PCIe datasheet, dense; 114 SMs; 1755 MHz board max; tensor clock 1620 MHz from
# the OFU paper (114 x 4096 x 1.62 GHz = 756 TFLOP/s).
H100_PCIE = GpuSpec(
    "H100-PCIe",
    114,
    1755 * MHZ,
    1620 * MHZ,
    _peaks(fp64=51, tf32=378, bf16=756, fp8=1513, int8=1513),
    compute_slices=7,
)
# Source: NVIDIA H100 NVL product brief, dense (sparse 1671 BF16 / 3341 FP8 halved); 132 SMs; 1785 MHz
# board max; tensor clock derived: 835.5 T / (132 x 4096) = 1545 MHz.
H100_NVL = GpuSpec(
    "H100-NVL",
    132,
    1785 * MHZ,
    1545 * MHZ,
    _peaks(fp64=60, tf32=417.5, bf16=835.5, fp8=1670.5, int8=1670.5),
    compute_slices=7,  # the MIG guide's "H100-PCIE 94GB" row
)
# Source: NVIDIA H200 datasheet: H200 SXM has the H100 SXM compute (same die, more HBM); OFU paper table.
H200_SXM = attrs.evolve(H100_SXM, key="H200-SXM")
# Source: NVIDIA H200 NVL datasheet: the H100 NVL compute figures and clocks.
H200_NVL = attrs.evolve(H100_NVL, key="H200-NVL")
# Source: NVIDIA L40S datasheet, dense (sparse 366 TF32 / 733 BF16 / 1466 FP8 halved); 142 SMs; 2520 MHz boost;
# tensor clock derived: 362 T / (142 x 1024 dense FP16 FLOP/clk/SM) = 2490 MHz (OFU paper: ~2490).
L40S = GpuSpec("L40S", 142, 2520 * MHZ, 2490 * MHZ, _peaks(tf32=183, bf16=362, fp8=733, int8=733))
# Source: NVIDIA L4 datasheet, dense (sparse 242 BF16 / 485 FP8 / 120 TF32 halved); 58 SMs; 2040 MHz boost;
# tensor clock derived: 121 T / (58 x 1024) = 2037 MHz, i.e. the boost clock.
L4 = GpuSpec("L4", 58, 2040 * MHZ, 2040 * MHZ, _peaks(tf32=60, bf16=121, fp8=242.5, int8=242.5))
# Source: NVIDIA Blackwell datasheet (HGX B200, per GPU), dense; 148 SMs; board max not published; tensor
# clock derived: 2250 T / (148 x 8192) = 1856 MHz (unverified on hardware, as the OFU paper says).
B200 = GpuSpec(
    "B200",
    148,
    None,
    1856 * MHZ,
    _peaks(fp64=40, tf32=1100, bf16=2250, fp8=4500, int8=4500, fp4=9000),
    compute_slices=7,
)
# Source: NVIDIA GB200 NVL72 datasheet (per GPU), dense; 148 SMs; tensor clock derived:
# 2500 T / (148 x 8192) = 2062 MHz (unverified on hardware).
GB200 = GpuSpec(
    "GB200",
    148,
    None,
    2062 * MHZ,
    _peaks(fp64=45, tf32=1250, bf16=2500, fp8=5000, int8=5000, fp4=10000),
    compute_slices=7,
)

# Source: NVIDIA developer blog "Programming Tensor Cores in CUDA 9" (V100 SXM2: "up to 125 Tensor
# TFLOPS"; Volta has no sparsity, so it is dense) and the Tesla V100 whitepaper, Table 1 (80 SMs, 8 tensor
# cores per SM, each 64 FP16 FMA per clock = 1024 FLOP/clk/SM). Board max clock: no final figure in
# those sources (the whitepaper's 1455 MHz was pre-launch), left to the device. Tensor clock derived:
# 125 T / (80 x 1024) = 1526 MHz.
V100_SXM2 = GpuSpec("V100-SXM2", 80, None, 1526 * MHZ, _peaks(bf16=125))
# Source: NVIDIA's Tesla V100 PCIe announcement as reported by io-tech.fi ("noin 1370 MHz", 112 Tensor
# TFLOPS, 80 SMs). Tensor clock derived: 112 T / (80 x 1024) = 1367 MHz. bf16 stands for Volta's FP16
# tensor rate (Volta has no BF16; _peaks gives fp16 the same figure).
V100_PCIE = GpuSpec("V100-PCIe", 80, None, 1367 * MHZ, _peaks(bf16=112))
# Source: NVIDIA's Tesla T4 announcement (GTC Japan 2018) as reported by Tom's Hardware and Geektopia:
# 320 Turing tensor cores, 2560 CUDA cores, 65 TFLOPS FP16 mixed precision, 130 TOPS INT8. SMs derived:
# 320 tensor cores / 8 per SM = 40. Tensor clock derived: 65 T / (40 x 1024) = 1587 MHz.
T4 = GpuSpec("T4", 40, None, 1587 * MHZ, _peaks(bf16=65, int8=130))
# Source: NVIDIA A40 datasheet (as reproduced by ecer.com): dense TF32 74.8, BF16/FP16 149.7, INT8 299.3
# (sparse figures doubled); 336 third-generation tensor cores = 84 SMs (4 per SM, derived). Board max
# and tensor clock: not in the datasheet, left unknown.
A40 = GpuSpec("A40", 84, None, None, _peaks(tf32=74.8, bf16=149.7, int8=299.3))
# Source: NVIDIA L40 datasheet (the L40/L40S table as reproduced by mullet.se): dense TF32 90.5,
# BF16/FP16 181.05, FP8 362, INT8 362; 568 fourth-generation tensor cores = 142 SMs (4 per SM, derived).
# Board max and tensor clock: not in the datasheet, left unknown.
L40 = GpuSpec("L40", 142, None, None, _peaks(tf32=90.5, bf16=181.05, fp8=362, int8=362))
# Source: NVIDIA H20 figures as reported by zangshuxian.com (78 SMs; dense FP16 148, TF32 74, INT8 296
# TFLOPS/TOPS) and willitrunai.com (148 TFLOPS FP16, 296 INT8). Hopper's 4096 FLOP/clk/SM would put the
# tensor clock at 463 MHz, so the H20's cap is not a clock: tensor clock and board max left unknown. FP8
# left out: no source gives it.
H20 = GpuSpec("H20", 78, None, None, _peaks(tf32=74, bf16=148, int8=296), compute_slices=7)
# Source: verda.com "GB300 NVL72 architecture", per-GPU table "without sparsity": B300 TF32 1.1, BF16 2.25,
# FP8 4.5 PFLOPS (Glenn Klockwood's B300 page from NVIDIA's HGX B300 figures agrees). FP4, INT8 and FP64
# left out: the sources disagree (FP4 13.1 vs 14 PF; INT8 4.5 PF vs 0.15 POPS). SMs, clocks unknown.
B300 = GpuSpec("B300", None, None, None, _peaks(tf32=1100, bf16=2250, fp8=4500))
# Source: verda.com, same table: GB300 TF32 1.25, BF16 2.5, FP8 5, FP4 15 PFLOPS dense (Tom's Hardware's
# Hot Chips 2025 report also gives 15 PF NVFP4 dense per package). SMs, clocks unknown.
GB300 = GpuSpec("GB300", None, None, None, _peaks(tf32=1250, bf16=2500, fp8=5000, fp4=15000))

ALL_SPECS: tuple[GpuSpec, ...] = (
    V100_SXM2,
    V100_PCIE,
    T4,
    A40,
    L40,
    H20,
    B300,
    GB300,
    A100_SXM,
    A100_PCIE,
    H100_SXM,
    H100_PCIE,
    H100_NVL,
    H200_SXM,
    H200_NVL,
    L40S,
    L4,
    B200,
    GB200,
)

# Device name strings as NVML and dcgm-exporter print them, most specific first.
_PATTERNS: tuple[tuple[re.Pattern[str], GpuSpec], ...] = tuple(
    (re.compile(pattern, re.IGNORECASE), spec)
    for pattern, spec in (
        (r"\bGB300\b", GB300),
        (r"\bB300\b", B300),  # not "GB300": \b needs a non-word character before "B"
        (r"\bGB200\b", GB200),
        (r"\bB200\b", B200),
        (r"\bH20\b", H20),  # "NVIDIA H20", not "H200": \b needs a non-word character after "0"
        (r"\bH200\b.*\bNVL\b", H200_NVL),
        (r"\bH200\b", H200_SXM),  # "NVIDIA H200", "NVIDIA H200 141GB HBM3e"
        (r"\bH100\b.*\bNVL\b", H100_NVL),
        (r"\bH100\b.*\bPCIe\b", H100_PCIE),  # "NVIDIA H100 PCIe"
        (r"\bH100\b", H100_SXM),  # "NVIDIA H100 80GB HBM3", "NVIDIA H100 SXM5 80GB"
        (r"\bA100\b.*\bPCIe\b", A100_PCIE),  # "NVIDIA A100-PCIE-40GB", "NVIDIA A100 80GB PCIe"
        (r"\bA100\b", A100_SXM),  # "NVIDIA A100-SXM4-80GB"
        (r"\bL40S\b", L40S),
        (r"\bL40\b", L40),
        (r"\bA40\b", A40),
        (r"\bT4\b", T4),  # "Tesla T4", "NVIDIA T4"
        (r"\bV100\b.*\bPCIE\b", V100_PCIE),  # "Tesla V100-PCIE-32GB"
        (r"\bV100\b.*\bSXM2\b", V100_SXM2),  # "Tesla V100-SXM2-16GB"
        (r"\bL4\b", L4),  # "NVIDIA L4", not "L40"/"L40S": \b needs a non-word character after "4"
    )
)


@functools.lru_cache(maxsize=256)  # asked for every GPU on every read; a host has a few model names
def lookup(device_name: str) -> GpuSpec | None:
    """The catalog entry for a device name string, or None for a model the catalog does not know."""
    for pattern, spec in _PATTERNS:
        if pattern.search(device_name):
            return spec
    return None
