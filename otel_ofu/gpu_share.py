"""How much of a physical GPU one reporting device is: a whole GPU is 1, a partition the fraction of its GPU's
compute slices that it holds. Pure: no I/O.

NVIDIA MIG (Multi-Instance GPU User Guide, "MIG Device Names" and "Supported MIG Profiles"): a GPU instance's
profile is ``<G>g.<memory>gb`` (``1g.10gb``, ``3g.40gb``, ``1g.10gb+me`` with media extensions), a compute
instance inside one ``<C>c.<G>g.<memory>gb``; it holds G (or C) of the GPU's compute slices, 7 on an A100 or H100
and 4 on an A30, so a ``1g.10gb`` is 1/7 of an H100 and a ``1g.6gb`` 1/4 of an A30 (the guide's "Fraction of
SMs" column). The slice count is the catalog's (``GpuSpec.compute_slices``); a partitioned model it does not know
is counted against ``DEFAULT_MIG_SLICES``, which every MIG-capable datacenter GPU but the A30 has, and the caller
says so once (``assumed_slices``).

AMD Instinct compute partitions (``gpu_compute_partition_type`` of the AMD Device Metrics Exporter): SPX is the
whole GPU, DPX, TPX and QPX split it in 2, 3 and 4, CPX in one partition per XCD (8 on an MI300X).

These shares are what the collector counts GPUs, GPU time, cost and energy in ("GPU equivalents"), so that one
H100 split into seven 1g slices counts as one GPU, not seven: what schedulers allocate and the bill counts.

A slice's share of the GPU's dense peak FLOP/s is another thing (``peak_share``): its SMs' share of the GPU's SMs.
The MIG profiles use fewer SMs than the GPU has (an A100's seven compute slices hold 98 of its 108 SMs; a 3g.20gb
holds 42), so a 3g.20gb's peak is 312 x 42 / 108 = 121.3 TFLOP/s, not its 3/7 of the compute slices' 133.7. The SMs
per profile are the catalog's (``GpuSpec.mig_sms``); a profile it has none for has no peak share, never a guess.
An AMD compute partition's XCDs are alike (38 CUs each on an MI300X), so its peak share is its partition share.
"""

from __future__ import annotations

import functools
import re

from otel_ofu import catalog

DEFAULT_MIG_SLICES = 7
_MIG_PROFILE = re.compile(r"^(?:MIG\s+)?(?:(?P<c>\d+)c\.)?(?P<g>\d+)g\.", re.IGNORECASE)
# Partitions per GPU by AMD compute partition mode; CPX: one per XCD (the catalog's compute_slices).
_AMD_PARTS = {"spx": 1, "dpx": 2, "tpx": 3, "qpx": 4}
AMD_CPX = "cpx"


def mig_slices(mig_profile: str) -> int | None:
    """The compute slices a MIG profile holds (``1g.10gb`` -> 1, ``2c.4g.20gb`` -> 2); None when unreadable."""
    found = _MIG_PROFILE.match(mig_profile.strip())
    if found is None:
        return None
    slices = int(found.group("c") or found.group("g"))
    return slices if slices > 0 else None


def _slices_of(model: str | None) -> int | None:
    spec = catalog.lookup(model) if model else None
    return spec.compute_slices if spec is not None else None


@functools.lru_cache(maxsize=1024)  # asked per GPU stream; a fleet has a handful of (model, profile) pairs
def gpu_share(model: str | None, mig_profile: str | None = None, compute_partition: str | None = None) -> float:
    """The device's share of its physical GPU, in (0, 1]: 1 for a whole GPU (and for a partition it cannot size)."""
    if mig_profile:
        slices = mig_slices(mig_profile)
        if slices is None:
            return 1.0
        total = _slices_of(model) or DEFAULT_MIG_SLICES
        return min(1.0, slices / max(total, slices))
    if compute_partition:
        mode = compute_partition.strip().lower()
        parts = _AMD_PARTS.get(mode)
        if mode == AMD_CPX:
            parts = _slices_of(model)
        return 1.0 / parts if parts else 1.0
    return 1.0


def assumed_slices(model: str | None, mig_profile: str | None = None, compute_partition: str | None = None) -> bool:
    """Whether ``gpu_share`` had to assume the GPU's slice count (or could not size the partition at all): a case
    to say once in the log, with the model to add to the catalog."""
    if mig_profile:
        return mig_slices(mig_profile) is None or _slices_of(model) is None
    if compute_partition:
        mode = compute_partition.strip().lower()
        return mode not in _AMD_PARTS and (mode != AMD_CPX or _slices_of(model) is None)
    return False


def mig_profile_name(mig_profile: str) -> str:
    """A GPU instance profile as the catalog keys it: ``MIG 1g.10gb+me`` -> ``1g.10gb`` (media extensions add
    decoders, not SMs)."""
    name = mig_profile.strip()
    if name[:4].upper() == "MIG ":
        name = name[4:].strip()
    return name.split("+", 1)[0].lower()


@functools.lru_cache(maxsize=1024)  # asked per GPU reading; a fleet has a handful of (model, profile) pairs
def peak_share(model: str | None, mig_profile: str | None = None, compute_partition: str | None = None) -> float | None:
    """The device's share of its GPU's dense peak FLOP/s, in (0, 1]: a MIG slice's SMs over the GPU's, a compute
    partition's share, 1 for a whole GPU; None where no source gives the slice's SMs (or the partition's size)."""
    if mig_profile:
        spec = catalog.lookup(model) if model else None
        if spec is None or spec.sm_count is None:
            return None
        sms = spec.mig_sms.get(mig_profile_name(mig_profile))
        return None if sms is None else min(1.0, sms / spec.sm_count)
    if compute_partition:
        if assumed_slices(model, compute_partition=compute_partition):
            return None
        return gpu_share(model, compute_partition=compute_partition)
    return 1.0
