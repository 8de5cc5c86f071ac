"""The GPU catalog: dense peak FLOP/s per precision, SM (compute unit) count and clocks per model, by device name.

Figures are dense (datasheets print 2:4-sparse tensor numbers; dense is half). Each entry names its source; a
figure read from a third party's copy of the vendor's table, not from the vendor's own document, says so.

- The board max clock (``boost_clock_hz``) stands for what NVML's max SM clock (``nvidia-smi -q``, "Max Clocks: SM")
  and AMD's max engine clock report: the clock dcgm-exporter does not export by default and OFU's f_max falls back on.
  Where a public capture of what NVML reports is cited, it is that; else the vendor's rated boost clock; where the
  vendor prints no clock, the datasheet's FP32 peak / (2 x CUDA cores): NVIDIA specifies the FP32 peak at the boost
  clock (A100: 19.5 TFLOPS = 6912 x 2 x 1.41 GHz; H100 SXM: 67 TFLOPS = 16896 x 2 x 1.98 GHz). A rated clock is not a
  bound (an idle RTX 4000 Ada runs at 2310 MHz against its 2175 MHz boost): a reading above the catalog's max is taken
  at a clock ratio of 1, never refused (``otel_ofu.gpu_values``).
- A MIG profile's SMs (``mig_sms``, for the slice's share of the dense peak) are the ``SM`` column of
  ``nvidia-smi mig -lgip`` as NVIDIA's DCGM user guide and public captures print it, per board: a profile holds a
  share of the compute slices (what schedulers allocate and the bill counts, ``compute_slices``), but the MIG
  profiles use fewer SMs than the GPU has (an A100's seven slices hold 98 of its 108 SMs).
- A tensor clock marked "derived" is the datasheet dense FP16/BF16 peak divided by (SMs x dense FP16 FLOP per clock
  per SM), the same derivation the OFU paper uses for H100 SXM (132 x 4096 x 1.83 GHz = 989.4 TFLOP/s); for AMD
  Instinct it is the peak engine clock (AMD specifies the matrix peaks at it).

A figure no source gives is None (or absent from the peaks): never filled in by analogy with a sibling model. A
model that is not here gets no figures at all: OFU then uses the device's own max clock (or ``--max-sm-clock``)
and peak-derived metrics are left out.
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
    sm_count: int | None  # SMs (NVIDIA) or compute units (AMD); None where no source gives it
    boost_clock_hz: float | None  # the board's max SM (engine) clock
    tensor_clock_hz: float | None
    peak_flops: Mapping[str, float]  # precision (names.PRECISIONS) -> dense FLOP/s per GPU
    # The compute slices a partition's share of the GPU is counted in: a MIG-capable NVIDIA GPU's compute slices
    # (a MIG profile "Ng" holds N of them; NVIDIA Multi-Instance GPU User Guide, "Supported GPUs", max number of
    # instances), an AMD Instinct's XCDs (a CPX partition holds one). None: the GPU cannot be partitioned, or no
    # source gives the count (see ``otel_ofu.gpu_share``).
    compute_slices: int | None = None
    # GPU instance profile (``3g.20gb``, without ``+me``) -> its SMs, per the row's source; a profile not listed has no
    # known SM count (its slice of the peak is left out rather than guessed from its compute slices).
    mig_sms: Mapping[str, int] = attrs.field(factory=dict)

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


# --- NVIDIA Ampere (A100, A30: GA100; A10, A40, RTX A6000: GA102) ------------------------------------------------

# A100 MIG profiles' SMs: NVIDIA DCGM user guide, Feature Overview, profiling MIG example (`nvidia-smi mig -lgip` on
# an A100 40GB: 1g.5gb 14, 2g.10gb 28, 3g.20gb 42, 4g.20gb 56, 7g.40gb 98 SMs: "the compute resources are 2*42/98"), and
# public `nvidia-smi mig -lgip` captures of the A100 80GB's names for the same slices (1g.10gb 14, 2g.20gb 28, 3g.40gb
# 42, 4g.40gb 56, 7g.80gb 98). Its 1g.20gb (80GB only) is in no capture found.
A100_MIG_SMS = {
    "1g.5gb": 14,
    "2g.10gb": 28,
    "3g.20gb": 42,
    "4g.20gb": 56,
    "7g.40gb": 98,
    "1g.10gb": 14,
    "2g.20gb": 28,
    "3g.40gb": 42,
    "4g.40gb": 56,
    "7g.80gb": 98,
}
# Source: NVIDIA A100 datasheet (2021), dense; 108 SMs. Board max 1410 MHz: the datasheet's 19.5 TFLOPS FP32 =
# 6912 x 2 x 1.41 GHz (the datasheet as reproduced by glennklockwood.com), and deviceQuery on an A100 reports "GPU
# Max Clock rate: 1410 MHz" (Paderborn PC2's system documentation). The tensor clock is the boost clock
# (108 x 2048 dense FP16 FLOP/clk/SM x 1.41 GHz = 312 TFLOP/s).
A100_SXM = GpuSpec(
    "A100-SXM",
    108,
    1410 * MHZ,
    1410 * MHZ,
    _peaks(fp64=19.5, tf32=156, bf16=312, int8=624),
    compute_slices=7,
    mig_sms=A100_MIG_SMS,
)
# Source: NVIDIA A100 PCIe datasheet: same peaks and clocks as SXM (boost 1410 MHz, as NVIDIA's table is
# reproduced by sysrqmts.com).
A100_PCIE = attrs.evolve(A100_SXM, key="A100-PCIe")
# Source: NVIDIA A800 40GB Active / A800 PCIe: the A100's GA100 configuration (6912 CUDA cores, 432 tensor cores,
# 108 SMs) and peaks (FP32 19.5, TF32 156, BF16 312, INT8 624, FP64 tensor 19.5 TFLOPS dense) with boost 1410 MHz,
# as NVIDIA's table is reproduced by siliconcat.net and hmc-tech.com (NVIDIA's own A800 datasheet was not found).
# Its MIG slice count: no source found (a MIG profile on it is counted against the default 7 and said once).
A800 = GpuSpec("A800", 108, 1410 * MHZ, 1410 * MHZ, _peaks(fp64=19.5, tf32=156, bf16=312, int8=624))
# Source: NVIDIA A30 datasheet: FP64 5.2, FP64 tensor 10.3, FP32 10.3, dense TF32 82, BF16/FP16 165, INT8 330
# (sparse figures halved); 3584 CUDA cores, 56 SMs. Board max 1440 MHz: boost clock as NVIDIA's table is reproduced
# by sysrqmts.com; the datasheet's 10.3 TFLOPS FP32 / (2 x 3584) = 1437 MHz agrees. Tensor clock derived:
# 165 T / (56 x 2048) = 1439 MHz, i.e. the boost clock. MIG: 4 compute slices (MIG User Guide, "Supported GPUs"); its
# A30 table's "Fraction of SMs" 1/4, 2/4 and 4/4 ("Full") of the 56 SMs give 1g.6gb 14, 2g.12gb 28, 4g.24gb 56.
A30 = GpuSpec(
    "A30",
    56,
    1440 * MHZ,
    1440 * MHZ,
    _peaks(fp64=10.3, tf32=82, bf16=165, int8=330),
    compute_slices=4,
    mig_sms={"1g.6gb": 14, "2g.12gb": 28, "4g.24gb": 56},
)
# Source: NVIDIA A10 datasheet: FP32 31.2, dense TF32 62.5, BF16/FP16 125, INT8 250 (sparse halved); 9216 CUDA
# cores, 72 SMs. Board max 1695 MHz: boost clock as NVIDIA's table is reproduced by sysrqmts.com; the datasheet's
# 31.2 TFLOPS / (2 x 9216) = 1693 MHz agrees. Tensor clock derived: 125 T / (72 x 1024) = 1695 MHz.
A10 = GpuSpec("A10", 72, 1695 * MHZ, 1695 * MHZ, _peaks(tf32=62.5, bf16=125, int8=250))
# Source: for the A10G (the GA102 board AWS builds its G5 instances on) NVIDIA publishes no datasheet, and the
# reproductions found disagree with each other (80 vs 72 SMs, 62.5 vs 125 FP16 TFLOPS): no SMs, tensor clock or peaks.
# Board max 1710 MHz: AWS's EC2 user guide ("Optimize GPU settings") sets every G5 GPU's clocks to their maximum with
# `nvidia-smi -ac 6250,1710` (memory, graphics MHz), the highest clocks NVML lists as supported on the board.
A10G = GpuSpec("A10G", None, 1710 * MHZ, None, _peaks())
# Source: NVIDIA A40 datasheet (as reproduced by ecer.com): dense TF32 74.8, BF16/FP16 149.7, INT8 299.3 (sparse
# figures doubled); 10752 CUDA cores, 336 third-generation tensor cores = 84 SMs (4 per SM, derived). Board max
# 1740 MHz: NVIDIA A40 product brief PB-09976-001 (boost 1740 MHz, as reproduced by gpu.spicedreamphone.com and
# sysrqmts.com; the brief's own copy found shows only its contents); the datasheet's 37.4 TFLOPS FP32 /
# (2 x 10752) = 1739 MHz agrees. Tensor clock derived:
# 149.7 T / (84 x 1024) = 1740 MHz, i.e. the boost clock.
A40 = GpuSpec("A40", 84, 1740 * MHZ, 1740 * MHZ, _peaks(tf32=74.8, bf16=149.7, int8=299.3))
# Source: NVIDIA RTX A6000 datasheet: 10752 CUDA cores, 84 SMs, 38.7 TFLOPS FP32; board max 1800 MHz: the
# datasheet's 38.7 TFLOPS / (2 x 10752) = 1800 MHz, the boost clock NVIDIA's table gives as reproduced by
# sysrqmts.com. Its "tensor performance" figure does not say which precision or accumulate it is: no peaks.
RTX_A6000 = GpuSpec("RTX-A6000", 84, 1800 * MHZ, None, _peaks())

# --- NVIDIA Hopper ----------------------------------------------------------------------------------------------

# Source: NVIDIA H100 datasheet (SXM5), dense; board max 1980 MHz: NVIDIA's final H100 table (GPU boost 1.98 GHz
# SXM5, 1.75 GHz PCIe; as reproduced by prohardver.hu) and the datasheet's 67 TFLOPS FP32 = 16896 x 2 x 1.98 GHz;
# tensor clock 1830 MHz from the OFU paper (132 x 4096 x 1.83 GHz = 989.4 TFLOP/s). MIG profiles' SMs: public
# `nvidia-smi mig -lgip` captures of the H100 80GB (1g.10gb 16, 1g.20gb 26, 2g.20gb 32, 3g.40gb 60, 4g.40gb 64,
# 7g.80gb 132; a 1g.20gb is one compute slice with more SMs than a 1g.10gb).
H100_SXM = GpuSpec(
    "H100-SXM",
    132,
    1980 * MHZ,
    1830 * MHZ,
    _peaks(fp64=67, tf32=494.7, bf16=989.4, fp8=1979, int8=1979),
    compute_slices=7,
    mig_sms={"1g.10gb": 16, "1g.20gb": 26, "2g.20gb": 32, "3g.40gb": 60, "4g.40gb": 64, "7g.80gb": 132},
)
# Source: NVIDIA H100 PCIe datasheet, dense; 114 SMs; board max 1755 MHz (NVIDIA's table above: 1.75 GHz; the
# datasheet's 51 TFLOPS FP32 / (2 x 14592) = 1748 MHz at its rounding); tensor clock 1620 MHz from the OFU paper
# (114 x 4096 x 1.62 GHz = 756 TFLOP/s).
H100_PCIE = GpuSpec(
    "H100-PCIe",
    114,
    1755 * MHZ,
    1620 * MHZ,
    _peaks(fp64=51, tf32=378, bf16=756, fp8=1513, int8=1513),
    compute_slices=7,
)
# Source: NVIDIA H100 NVL product brief, dense (sparse 1671 BF16 / 3341 FP8 halved); 132 SMs. Board max 1776 MHz,
# derived: the brief's 60 TFLOPS FP32 / (2 x 16896) (the 1785 MHz quoted for it elsewhere has no NVIDIA source found).
# Tensor clock derived: 835.5 T / (132 x 4096) = 1545 MHz. MIG profiles' SMs: a public `nvidia-smi mig -lgip` capture on
# an H100 NVL (94GB: 1g.12gb 16, 1g.24gb 26, 2g.24gb 32, 3g.47gb 60, 4g.47gb 64, 7g.94gb 132).
H100_NVL = GpuSpec(
    "H100-NVL",
    132,
    1776 * MHZ,
    1545 * MHZ,
    _peaks(fp64=60, tf32=417.5, bf16=835.5, fp8=1670.5, int8=1670.5),
    compute_slices=7,  # the MIG guide's "H100-PCIE 94GB" row
    mig_sms={"1g.12gb": 16, "1g.24gb": 26, "2g.24gb": 32, "3g.47gb": 60, "4g.47gb": 64, "7g.94gb": 132},
)
# Source: NVIDIA H200 datasheet: H200 SXM has the H100 SXM compute (same die, more HBM); OFU paper table. MIG
# profiles' SMs: a public `nvidia-smi mig -lgip` capture of an H200 (1g.18gb 16, 2g.35gb 32, 7g.141gb 132; its other
# profiles were not in it).
H200_SXM = attrs.evolve(H100_SXM, key="H200-SXM", mig_sms={"1g.18gb": 16, "2g.35gb": 32, "7g.141gb": 132})
# Source: NVIDIA H200 NVL datasheet: the H100 NVL compute figures and clocks; no capture of its MIG profiles found.
H200_NVL = attrs.evolve(H100_NVL, key="H200-NVL", mig_sms={})
# Source: NVIDIA GH200 Grace Hopper Superchip datasheet: its Hopper GPU has 132 SMs and the H100 SXM's peaks (FP64
# 67, TF32 989 sparse, BF16/FP16 1979 sparse, FP8 3958 sparse TFLOPS; dense halved) and FP32 67 TFLOPS, i.e. the
# 1980 MHz board max (67 T / (2 x 16896) = 1983 MHz) and so the OFU paper's 1830 MHz tensor clock. MIG slices:
# not confirmed in a source here (counted against the default 7, said once).
GH200 = GpuSpec("GH200", 132, 1980 * MHZ, 1830 * MHZ, _peaks(fp64=67, tf32=494.7, bf16=989.4, fp8=1979, int8=1979))
# Source: NVIDIA H800 (the H100 variant sold in China, SXM5): the same GH100 configuration as H100 SXM with NVLink
# cut to 400 GB/s and FP64 to 1 TFLOPS, per aiwiki.ai's and philisun.com's summaries of NVIDIA's H800 table. No
# source found gives its clocks or tensor peaks, and they are not copied from the H100: --max-sm-clock gives the
# max clock. FP64 1 TFLOPS is the one peak stated.
H800 = GpuSpec("H800", None, None, None, _peaks(fp64=1))
# Source: NVIDIA H20 figures as reported by zangshuxian.com (78 SMs; dense FP16 148, TF32 74, INT8 296
# TFLOPS/TOPS) and willitrunai.com (148 TFLOPS FP16, 296 INT8). Hopper's 4096 FLOP/clk/SM would put the
# tensor clock at 463 MHz, so the H20's cap is not a clock: tensor clock and board max left unknown (the same
# report's 44 TFLOPS FP32 would put the boost clock at 2203 MHz, above any Hopper's: not a figure to use; and no
# public `nvidia-smi -q` capture of an H20's "Max Clocks: SM" was found). FP8 left out: no source gives it.
H20 = GpuSpec("H20", 78, None, None, _peaks(tf32=74, bf16=148, int8=296), compute_slices=7)

# --- NVIDIA Ada Lovelace ----------------------------------------------------------------------------------------

# Source: NVIDIA L40S datasheet, dense (sparse 366 TF32 / 733 BF16 / 1466 FP8 halved); 142 SMs; 2520 MHz boost
# (the datasheet's 91.6 TFLOPS FP32 / (2 x 18176) = 2520 MHz); tensor clock derived: 362 T / (142 x 1024 dense FP16
# FLOP/clk/SM) = 2490 MHz (OFU paper: ~2490).
L40S = GpuSpec("L40S", 142, 2520 * MHZ, 2490 * MHZ, _peaks(tf32=183, bf16=362, fp8=733, int8=733))
# Source: NVIDIA L40 datasheet (the L40/L40S table as reproduced by mullet.se): dense TF32 90.5,
# BF16/FP16 181.05, FP8 362, INT8 362; 18176 CUDA cores, 568 fourth-generation tensor cores = 142 SMs (4 per SM,
# derived). Board max 2490 MHz: the datasheet's 90.5 TFLOPS FP32 / (2 x 18176) = 2490 MHz (pcpartdb.com's copy of
# NVIDIA's table gives the same boost clock). Tensor clock: not derivable without the L40's per-SM rate (its FP32-
# accumulate rate is half the L40S's), left to the board clock.
L40 = GpuSpec("L40", 142, 2490 * MHZ, None, _peaks(tf32=90.5, bf16=181.05, fp8=362, int8=362))
# Source: NVIDIA L4 datasheet, dense (sparse 242 BF16 / 485 FP8 / 120 TF32 halved); 58 SMs; 2040 MHz boost (the
# datasheet's 30.3 TFLOPS FP32 / (2 x 7424) = 2041 MHz); tensor clock derived: 121 T / (58 x 1024) = 2037 MHz,
# i.e. the boost clock.
L4 = GpuSpec("L4", 58, 2040 * MHZ, 2040 * MHZ, _peaks(tf32=60, bf16=121, fp8=242.5, int8=242.5))
# Source: NVIDIA L20 (the AD102 board sold in China): 11776 CUDA cores, 92 SMs, boost 2520 MHz, 59.35 TFLOPS FP32,
# only as NVIDIA's table is reproduced by topcpu.net and technical.city (59.35 T / (2 x 11776) = 2520 MHz). No
# source gives its tensor peaks.
L20 = GpuSpec("L20", 92, 2520 * MHZ, None, _peaks())
# Source: NVIDIA RTX 6000 Ada Generation datasheet: 18176 CUDA cores, 142 SMs, 91.1 TFLOPS FP32; board max
# 2505 MHz, the boost clock NVIDIA's table gives as reproduced by cputronic.com (91.1 T / (2 x 18176) = 2506 MHz
# agrees). Its "tensor performance" figure names no precision: no peaks.
RTX_6000_ADA = GpuSpec("RTX-6000-Ada", 142, 2505 * MHZ, None, _peaks())
# Source: NVIDIA RTX 4000 Ada Generation datasheet: 6144 CUDA cores, 48 SMs, 192 tensor cores, 26.7 TFLOPS FP32;
# board max 2175 MHz, the boost clock NVIDIA's table gives as reproduced by siliconcat.net (26.7 T / (2 x 6144) =
# 2173 MHz agrees; an idle one runs at 2310 MHz, above it: a rating, not a bound; no public capture of its NVML max
# clock was found). No peaks, as for the RTX 6000 Ada.
RTX_4000_ADA = GpuSpec("RTX-4000-Ada", 48, 2175 * MHZ, None, _peaks())

# --- NVIDIA Blackwell (board max clocks are not published: OFU takes the tensor clock) ---------------------------

# Source: NVIDIA Blackwell datasheet (HGX B200, per GPU), dense; 148 SMs; board max not published; tensor
# clock derived: 2250 T / (148 x 8192) = 1856 MHz (unverified on hardware, as the OFU paper says). FP64: 37 TFLOPS,
# NVIDIA's current DGX/HGX B200 table (the launch datasheet said 40).
B200 = GpuSpec(
    "B200",
    148,
    None,
    1856 * MHZ,
    _peaks(fp64=37, tf32=1100, bf16=2250, fp8=4500, int8=4500, fp4=9000),
    compute_slices=7,
)
# Source: NVIDIA GB200 NVL72 datasheet (per GPU), dense; 148 SMs; tensor clock derived:
# 2500 T / (148 x 8192) = 2062 MHz (unverified on hardware). FP64: 40 TFLOPS per GPU, NVIDIA's current GB200 NVL72
# table (2880 TFLOPS per 72 GPUs; the launch datasheet said 45).
GB200 = GpuSpec(
    "GB200",
    148,
    None,
    2062 * MHZ,
    _peaks(fp64=40, tf32=1250, bf16=2500, fp8=5000, int8=5000, fp4=10000),
    compute_slices=7,
)
# Source: verda.com "GB300 NVL72 architecture", per-GPU table "without sparsity": B300 TF32 1.1, BF16 2.25,
# FP8 4.5 PFLOPS (Glenn Klockwood's B300 page from NVIDIA's HGX B300 figures agrees). FP4, INT8 and FP64
# left out: the sources disagree (FP4 13.1 vs 14 PF; INT8 4.5 PF vs 0.15 POPS). SMs, clocks unknown.
B300 = GpuSpec("B300", None, None, None, _peaks(tf32=1100, bf16=2250, fp8=4500))
# Source: verda.com, same table: GB300 TF32 1.25, BF16 2.5, FP8 5, FP4 15 PFLOPS dense (Tom's Hardware's
# Hot Chips 2025 report also gives 15 PF NVFP4 dense per package). SMs, clocks unknown.
GB300 = GpuSpec("GB300", None, None, None, _peaks(tf32=1250, bf16=2500, fp8=5000, fp4=15000))

# --- NVIDIA Volta and Turing ------------------------------------------------------------------------------------

# Source: NVIDIA developer blog "Programming Tensor Cores in CUDA 9" (V100 SXM2: "up to 125 Tensor TFLOPS"; Volta
# has no sparsity, so it is dense) and the Tesla V100 whitepaper, Table 1 (80 SMs, 8 tensor cores per SM, each 64
# FP16 FMA per clock = 1024 FLOP/clk/SM). Board max 1530 MHz: the V100 datasheet's 15.7 TFLOPS FP32 / (2 x 5120)
# = 1533 MHz (the whitepaper's pre-launch table said 1455 MHz at 15 TFLOPS; the shipped part is 15.7). Tensor clock
# derived: 125 T / (80 x 1024) = 1526 MHz.
V100_SXM2 = GpuSpec("V100-SXM2", 80, 1530 * MHZ, 1526 * MHZ, _peaks(bf16=125))
# Source: NVIDIA's Tesla V100 PCIe announcement as reported by io-tech.fi ("noin 1370 MHz", 112 Tensor TFLOPS,
# 14 TFLOPS FP32, 80 SMs); board max 1380 MHz, the boost clock NVIDIA's table gives as reproduced by sysrqmts.com.
# Tensor clock derived: 112 T / (80 x 1024) = 1367 MHz. bf16 stands for Volta's FP16 tensor rate (Volta has no
# BF16; _peaks gives fp16 the same figure).
V100_PCIE = GpuSpec("V100-PCIe", 80, 1380 * MHZ, 1367 * MHZ, _peaks(bf16=112))
# Source: NVIDIA V100S PCIe datasheet: FP64 8.2, FP32 16.4, tensor 130 TFLOPS; 5120 CUDA cores, 80 SMs (as the
# GPU database reproduced in Lambda's LLM calculator lists it). Board max 1597 MHz: the datasheet prints no clock;
# its 16.4 TFLOPS / (2 x 5120) puts it at 1597-1607 MHz within the figure's rounding, and 1597 MHz is the boost
# clock GPU databases give (not NVIDIA's own table). Tensor clock derived: 130 T / (80 x 1024) = 1587 MHz.
V100S_PCIE = GpuSpec("V100S-PCIe", 80, 1597 * MHZ, 1587 * MHZ, _peaks(bf16=130))
# Source: NVIDIA DGX-2 datasheet: 16 Tesla V100 SXM3 32GB, 2 petaFLOPS of tensor performance, i.e. 125 TFLOPS per
# GPU; 80 SMs (GV100). Tensor clock derived: 125 T / (80 x 1024) = 1526 MHz. Its board max: no NVIDIA figure found
# (left to the device, or --max-sm-clock).
V100_SXM3 = GpuSpec("V100-SXM3", 80, None, 1526 * MHZ, _peaks(bf16=125))
# Source: NVIDIA's Tesla T4 announcement (GTC Japan 2018) as reported by Tom's Hardware and Geektopia:
# 320 Turing tensor cores, 2560 CUDA cores, 65 TFLOPS FP16 mixed precision, 130 TOPS INT8. SMs derived:
# 320 tensor cores / 8 per SM = 40. Board max 1590 MHz: the T4's boost clock as NVIDIA's table is reproduced by
# sysrqmts.com and cputronic.com (deviceQuery on a T4: "GPU Max Clock rate: 1590 MHz"); the datasheet's 8.1 TFLOPS
# FP32 / (2 x 2560) = 1582 MHz agrees. Tensor clock derived: 65 T / (40 x 1024) = 1587 MHz.
T4 = GpuSpec("T4", 40, 1590 * MHZ, 1587 * MHZ, _peaks(bf16=65, int8=130))

# --- AMD Instinct (compute units for SMs; the clocks are the peak engine clock) -----------------------------------
# Compute units and XCDs: ROCm documentation, "Accelerator and GPU hardware specifications" (MI325X and MI300X
# 304 CUs, 38 per XCD; MI300A 228; MI250X 220, 110 per GCD; MI210 104). Peaks: ROCm "MI300 series
# microarchitecture" and "MI250 microarchitecture" tables (FLOPS/clock/CU and peak TFLOPS), dense.

# Source: ROCm MI300 microarchitecture table for the MI300X: matrix FP64 163.4, TF32 653.7, FP16/BF16 1307.4,
# FP8 2614.9, INT8 2614.9 TFLOPS (2048 FP16 FLOP/clk/CU); 304 CUs in 8 XCDs. Peak engine clock 2100 MHz (AMD's
# MI300X system-optimization guide: "the default 2100 MHz"; 304 x 2048 x 2.1 GHz = 1307.4 TFLOP/s).
MI300X = GpuSpec(
    "MI300X",
    304,
    2100 * MHZ,
    2100 * MHZ,
    _peaks(fp64=163.4, tf32=653.7, bf16=1307.4, fp8=2614.9, int8=2614.9),
    compute_slices=8,
)
# Source: AMD Instinct MI325X: the MI300X's CDNA 3 compute (304 CUs, 38 per XCD, per the ROCm specifications table)
# with 256 GB HBM3E; AMD's MI325X datasheet gives the MI300X's peaks (FP16 1307.4, FP8 2614.9 TFLOPS dense) at the
# same 2100 MHz peak engine clock.
MI325X = attrs.evolve(MI300X, key="MI325X")
# Source: AMD Instinct MI300A: 228 CUs in 6 XCDs (ROCm specifications table; "MI300A ... with 6 XCDs", ROCm MI300
# microarchitecture); the MI300 tables' per-CU rates at the 2100 MHz peak engine clock give the MI300A datasheet's
# FP64 matrix 122.6, TF32 490.3, FP16/BF16 980.6, FP8 1961.2, INT8 1961.2 TFLOPS (228 x 2048 x 2.1 GHz = 980.6).
MI300A = GpuSpec(
    "MI300A",
    228,
    2100 * MHZ,
    2100 * MHZ,
    _peaks(fp64=122.6, tf32=490.3, bf16=980.6, fp8=1961.2, int8=1961.2),
    compute_slices=6,
)
# Source: AMD Instinct MI355X (CDNA 4): 8 XCDs of 32 active CUs = 256 CUs, FP8 8192 FLOP/clk/CU (AMD at ISSCC 2026,
# as reported by Tom's Hardware), peak engine clock 2400 MHz (AMD MI355X datasheet): FP8 256 x 8192 x 2.4 GHz =
# 5033.2 TFLOPS, FP16/BF16 2516.6, MXFP4 10066.3 dense. TF32, INT8 and FP64 left out: no source here gives them.
MI355X = GpuSpec("MI355X", 256, 2400 * MHZ, 2400 * MHZ, _peaks(bf16=2516.6, fp8=5033.2, fp4=10066.3), compute_slices=8)
# Source: ROCm MI250 microarchitecture (CDNA 2, peak clock 1.7 GHz, 1024 FP16 FLOP/clk/CU): the MI250X is two
# GCDs, each its own device to the driver and the exporter, so the row is one GCD: 110 CUs, matrix FP64 47.9,
# FP16/BF16 191.5, INT8 191.5 TFLOPS (110 x 1024 x 1.7 GHz; AMD's 383 TFLOPS per OAM halved). No compute
# partitions.
MI250X = GpuSpec("MI250X", 110, 1700 * MHZ, 1700 * MHZ, _peaks(fp64=47.9, bf16=191.5, int8=191.5))
# Source: AMD Instinct MI210 (CDNA 2, one GCD, 104 CUs per the ROCm specifications table) at the 1.7 GHz peak
# engine clock: matrix FP64 45.3, FP16/BF16 181.0, INT8 181.0 TFLOPS (104 x 1024 x 1.7 GHz).
MI210 = GpuSpec("MI210", 104, 1700 * MHZ, 1700 * MHZ, _peaks(fp64=45.3, bf16=181.0, int8=181.0))

ALL_SPECS: tuple[GpuSpec, ...] = (
    V100_SXM2,
    V100_PCIE,
    V100S_PCIE,
    V100_SXM3,
    T4,
    A10,
    A10G,
    A30,
    A40,
    RTX_A6000,
    L40,
    L20,
    RTX_6000_ADA,
    RTX_4000_ADA,
    H20,
    H800,
    GH200,
    B300,
    GB300,
    A100_SXM,
    A100_PCIE,
    A800,
    H100_SXM,
    H100_PCIE,
    H100_NVL,
    H200_SXM,
    H200_NVL,
    L40S,
    L4,
    B200,
    GB200,
    MI210,
    MI250X,
    MI300X,
    MI300A,
    MI325X,
    MI355X,
)

# Device name strings as NVML, dcgm-exporter (modelName) and the AMD Device Metrics Exporter (card_series) print
# them, most specific first.
_PATTERNS: tuple[tuple[re.Pattern[str], GpuSpec], ...] = tuple(
    (re.compile(pattern, re.IGNORECASE), spec)
    for pattern, spec in (
        (r"\bGB300\b", GB300),
        (r"\bB300\b", B300),  # not "GB300": \b needs a non-word character before "B"
        (r"\bGB200\b", GB200),
        (r"\bB200\b", B200),
        (r"\bGH200\b", GH200),  # "NVIDIA GH200 480GB", "NVIDIA GH200 144G HBM3e"
        (r"\bH20\b", H20),  # "NVIDIA H20", not "H200": \b needs a non-word character after "0"
        (r"\bH200\b.*\bNVL\b", H200_NVL),
        (r"\bH200\b", H200_SXM),  # "NVIDIA H200", "NVIDIA H200 141GB HBM3e"
        (r"\bH800\b", H800),
        (r"\bH100\b.*\bNVL\b", H100_NVL),
        (r"\bH100\b.*\bPCIe\b", H100_PCIE),  # "NVIDIA H100 PCIe"
        (r"\bH100\b", H100_SXM),  # "NVIDIA H100 80GB HBM3", "NVIDIA H100 SXM5 80GB"
        (r"\bA800\b", A800),  # "NVIDIA A800 80GB PCIe", "NVIDIA A800-SXM4-80GB", "NVIDIA A800 40GB Active"
        (r"\bA100\b.*\bPCIe\b", A100_PCIE),  # "NVIDIA A100-PCIE-40GB", "NVIDIA A100 80GB PCIe"
        (r"\bA100\b", A100_SXM),  # "NVIDIA A100-SXM4-80GB"
        (r"\bA30\b", A30),
        (r"\bA10G\b", A10G),
        (r"\bA10\b", A10),  # "NVIDIA A10", not "A100" or "A10G": \b after "0"
        (r"\bRTX\s+A6000\b", RTX_A6000),  # "NVIDIA RTX A6000"
        (r"\bRTX\s+6000\s+Ada\b", RTX_6000_ADA),  # "NVIDIA RTX 6000 Ada Generation"
        (r"\bRTX\s+4000\s+Ada\b", RTX_4000_ADA),  # "NVIDIA RTX 4000 Ada Generation"
        (r"\bL40S\b", L40S),
        (r"\bL40\b", L40),
        (r"\bL20\b", L20),
        (r"\bA40\b", A40),
        (r"\bT4\b", T4),  # "Tesla T4", "NVIDIA T4"
        (r"\bV100S\b", V100S_PCIE),  # "Tesla V100S-PCIE-32GB"
        (r"\bV100\b.*\bSXM3\b", V100_SXM3),  # "Tesla V100-SXM3-32GB", "Tesla V100-SXM3-32GB-H"
        (r"\bV100\b.*\bPCIE\b", V100_PCIE),  # "Tesla V100-PCIE-32GB"
        (r"\bV100\b.*\bSXM2\b", V100_SXM2),  # "Tesla V100-SXM2-16GB"
        (r"\bL4\b", L4),  # "NVIDIA L4", not "L40"/"L40S": \b needs a non-word character after "4"
        (r"\bMI355X\b", MI355X),  # "AMD Instinct MI355X", "AMD Instinct MI355X OAM"
        (r"\bMI325X\b", MI325X),
        (r"\bMI300X\b", MI300X),  # "AMD Instinct MI300X OAM", "AMD Instinct MI300X VF"
        (r"\bMI300A\b", MI300A),
        # "AMD Instinct MI250X"; not "AMD Instinct MI250X/MI250", which may be an MI250 (104 CUs per GCD)
        (r"\bMI250X\b(?!/MI250)", MI250X),
        (r"\bMI210\b", MI210),
    )
)


@functools.lru_cache(maxsize=256)  # asked for every GPU on every read; a host has a few model names
def lookup(device_name: str) -> GpuSpec | None:
    """The catalog entry for a device name string, or None for a model the catalog does not know."""
    for pattern, spec in _PATTERNS:
        if pattern.search(device_name):
            return spec
    return None


def name_patterns() -> tuple[tuple[str, GpuSpec], ...]:
    """The device-name patterns ``lookup`` tries, in its order (the first that matches anywhere in the name wins, case
    ignored), as regular-expression source: what Prometheus rules match ``modelName`` with (``otel_ofu.dcgm_rules``)."""
    return tuple((pattern.pattern, spec) for pattern, spec in _PATTERNS)
