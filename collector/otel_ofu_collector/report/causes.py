"""Where a job's tensor pipes' time went, in one sentence: its biggest loss cause, named only when it stands out.

Pure: a job's summary in, a ``Bottleneck`` (or None) out. It reads the finer split of the tensor pipes' loss over
the run (shares of the job's GPU time) and the context beside it (DRAM activity, NVLink and PCIe throughput), and
names a bottleneck only where the counters say so, never from the loss alone:

- ``no_kernel`` >= NO_KERNEL_SHARE: the host side (input pipeline, synchronisation, checkpoints) is the suspect.
  A healthy training keeps a kernel running all but a few percent of the time (the demo's dense jobs: 6%); a
  quarter of the GPU time with no kernel at all is no launch overhead.
- ``non_tensor`` >= NON_TENSOR_SHARE with DRAM >= DRAM_BUSY: memory-bound kernels. Healthy dense trainings spend
  0.30-0.41 of their time with SMs busy off the tensor pipes (normalisation, softmax, element-wise, the optimizer
  step) at about a third of DRAM's cycles, so neither share alone names anything; half the GPU time off the
  tensor pipes with DRAM busy half its cycles or more does.
- ``non_tensor`` >= NON_TENSOR_SHARE with DRAM below DRAM_BUSY and NVLink >= NVLINK_BUSY or PCIe >= PCIE_BUSY:
  communication-bound (collectives in SM kernels, the links busy, HBM streaming only what crosses them).
- ``non_tensor`` that stands out with neither DRAM nor the links busy (or not reported) names nothing: the
  counters do not say what the SMs were doing.
- ``sm_idle`` >= SM_IDLE_SHARE: kernels too small to fill the SMs (small grids, launch gaps, tails). Healthy jobs
  with a low tensor activity leave SMs empty up to ~0.45 of the time, so half is the bar.

The job's biggest finer cause that stands out is named; a job without the finer split (its source reports no
engine and SM activity) or whose causes all stay under their bars gets no sentence.
"""

from __future__ import annotations

from typing import Final

import attrs

from otel_ofu import names
from otel_ofu_collector.report.summary import JobSummary, percent

C: Final = names.OfuLossCause
NO_KERNEL_SHARE: Final = 0.25
NON_TENSOR_SHARE: Final = 0.50
SM_IDLE_SHARE: Final = 0.50
DRAM_BUSY: Final = 0.50
# Per GPU, sent and received together: a third of an H100 SXM's 900 GB/s of NVLink 4, half of an A100 SXM's 600 GB/s
# of NVLink 3; a healthy dense training's gradient all-reduce moves ~120 GB/s, an MoE's all-to-all ~240 GB/s.
NVLINK_BUSY: Final = 300e9
# A third of a PCIe Gen5 x16's 128 GB/s both ways (most of a Gen4 x16's 64 GB/s): collectives over PCIe on boards
# without NVLink; an input pipeline feeds a few GB/s.
PCIE_BUSY: Final = 40e9


class Kind:
    """What a named bottleneck is."""

    HOST = "host"  # no kernel running: input pipeline, synchronisation, checkpoints
    MEMORY = "memory"  # memory-bound kernels
    COMMUNICATION = "communication"  # exposed collectives
    SM_IDLE = "sm_idle"  # kernels that leave SMs empty

    ALL = (HOST, MEMORY, COMMUNICATION, SM_IDLE)


@attrs.frozen
class Bottleneck:
    """A job's named bottleneck: its kind, the cause and its share of the job's GPU time, and the sentence."""

    kind: str
    cause: str
    share: float
    sentence: str


def _gb_per_s(value: float) -> str:
    return f"{value / 1e9:.0f} GB/s" if value >= 10e9 else f"{value / 1e9:.1f} GB/s"


def _links(job: JobSummary) -> str:
    """The job's link traffic in words ("NVLink 637 GB/s, PCIe 0.6 GB/s"); empty where none was reported."""
    parts = []
    if job.loss.nvlink_bytes_per_s is not None:
        parts.append(f"NVLink {_gb_per_s(job.loss.nvlink_bytes_per_s)}")
    if job.loss.pcie_bytes_per_s is not None:
        parts.append(f"PCIe {_gb_per_s(job.loss.pcie_bytes_per_s)}")
    return ", ".join(parts)


def _links_busy(job: JobSummary) -> bool:
    nvlink, pcie = job.loss.nvlink_bytes_per_s, job.loss.pcie_bytes_per_s
    return (nvlink is not None and nvlink >= NVLINK_BUSY) or (pcie is not None and pcie >= PCIE_BUSY)


def _non_tensor(job: JobSummary, share: float) -> Bottleneck | None:
    dram = job.loss.dram_active
    links = _links(job)
    said = f"{percent(share)} of GPU time the SMs were busy off the tensor pipes"
    if dram is not None and dram >= DRAM_BUSY:
        return Bottleneck(Kind.MEMORY, C.NON_TENSOR, share, f"{said}; DRAM {percent(dram)} busy: memory-bound kernels")
    if _links_busy(job):
        dram_said = f"DRAM {percent(dram)} busy, " if dram is not None else ""
        return Bottleneck(
            Kind.COMMUNICATION,
            C.NON_TENSOR,
            share,
            f"{said}; {dram_said}{links}: communication-bound (collectives the compute does not hide)",
        )
    return None


def _no_kernel(job: JobSummary, share: float) -> Bottleneck:
    pcie = job.loss.pcie_bytes_per_s
    context = f"; PCIe {_gb_per_s(pcie)}" if pcie is not None else ""
    return Bottleneck(
        Kind.HOST,
        C.NO_KERNEL,
        share,
        f"{percent(share)} of GPU time no kernel ran{context}: the host side (input pipeline, synchronisation, "
        "checkpoints) is the suspect",
    )


def _sm_idle(share: float) -> Bottleneck:
    return Bottleneck(
        Kind.SM_IDLE,
        C.SM_IDLE,
        share,
        f"{percent(share)} of GPU time kernels ran with SMs left empty: kernels too small to fill the GPU "
        "(small grids, launch gaps, tails)",
    )


def bottleneck_of(job: JobSummary) -> Bottleneck | None:
    """The job's biggest finer loss cause that stands out, named with its context; None where none does (or the
    job's GPUs report no engine and SM activity)."""
    if not any(part in job.loss.causes for part in C.TENSOR_PARTS):
        return None
    shares = job.loss.shares
    if shares is None:
        return None
    for cause in sorted(C.TENSOR_PARTS, key=lambda part: -shares[part]):
        share = shares[cause]
        found: Bottleneck | None = None
        if cause == C.NO_KERNEL and share >= NO_KERNEL_SHARE:
            found = _no_kernel(job, share)
        elif cause == C.NON_TENSOR and share >= NON_TENSOR_SHARE:
            found = _non_tensor(job, share)
        elif cause == C.SM_IDLE and share >= SM_IDLE_SHARE:
            found = _sm_idle(share)
        if found is not None:
            return found
    return None
