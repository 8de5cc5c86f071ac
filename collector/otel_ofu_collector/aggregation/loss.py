"""Where a job's OFU is lost, and what it costs: pure arithmetic over one window's per-GPU values.

Per GPU, from its window means (OFU ``O``, tensor pipe activity ``T``, SM clock ``f``; and where the source reports
them, engine activity ``E`` and SM activity ``S``):

    idle       = 1 - O when the GPU had no tensor activity all window (T < IDLE_TENSOR_ACTIVE), else 0
    clock      = T x (1 - r), r = min(1, f / f_ref), clamped to [0, T - O]          (0 for an idle GPU)
    with E and S, clamped so that T <= S <= E <= 1 where sampling noise disorders them:
    no_kernel  = 1 - E          (no kernel running: input pipeline, host, synchronisation, checkpoints)
    sm_idle    = E - S          (kernels running, SMs left empty: small grids, launch gaps, tails)
    non_tensor = S - O - clock  (SMs busy off useful tensor work)
    without them:
    tensor     = 1 - O - clock  (tensor pipes not kept busy, the coarse cause)

so that O + idle + clock + no_kernel + sm_idle + non_tensor (or O + idle + clock + tensor) = 1 for every GPU.

"No tensor activity" allows a stray kernel: tensor pipes active under 1% of the window do no work worth the
allocation, and an idle GPU's whole 1 - O is idle loss.

``f_ref`` is the clock OFU itself is measured against: the tensor clock of the GPU model where the catalog knows it
(the clock the datasheet's dense peak is specified at: an SM boosting above it adds no tensor FLOPs, so it is no
loss either), the board's maximum SM clock otherwise. Since the producer's OFU is ``T x r x calibration``,
``T - O = T(1 - r) + T r (1 - calibration)``: the clock term is the first part, and calibration's share (tile
quantization: tensor pipes busy on padding) stays in ``tensor``, or in ``non_tensor`` (S - T plus that share: SMs
busy on no useful tensor work), as work that did no useful FLOPs. The clamps keep every share >= 0 when window
means of separate gauges do not multiply exactly; without a clock reading ``clock`` is 0; without ``T`` (a
producer that sends only ``gpu.ofu``), ``T`` is taken as ``O``.

Per job, every average is weighted by GPU time: a GPU's capacity-seconds are its share of a GPU (a MIG slice's
fraction) x the seconds it covered in the window, of which the seconds its OFU covered are measured and the rest
``unmeasured`` (a GPU that reported ``gpu.ofu.unmeasured``: billed, neither work nor idleness). GPU-seconds lost by
cause = sum over GPUs of the cause's share x its measured capacity-seconds, and ``unmeasured`` its unmeasured ones;
useful GPU-seconds = sum of OFU x measured capacity-seconds; the job's GPU time is all of its capacity-seconds. Then
the job's OFU = useful / GPU time and each cause's share = its lost seconds / GPU time, so that OFU x GPU time is the
useful GPU time exactly and OFU + the causes = 1, the job's last split cause (``tensor`` where some GPU lacks E and S,
else ``non_tensor``) taken as 1 - OFU - the others, so the identity holds to the last bit of that one subtraction. A
job's causes are the ones its GPUs have: the finer three where some GPU reports E and S, ``tensor`` where some does
not, ``unmeasured`` where some time gave no OFU. Energy, FLOPs per joule, cost and emissions are sums over the GPUs
that have the inputs; cost is price x capacity-hours, its lost part by cause likewise.

These sums are what shards send their merge tier for a job (``JobSums``): a job whose points moved to another shard
mid-window adds up there to exactly what one collector would have reported (``job_values``).

Every sum over GPUs is exactly rounded (``math.fsum``): the GPUs come in the order their points arrived, which
differs between a single collector and a shard behind the load balancer, and a plain running sum would round
differently by order; the residual share of an idle job (1 - OFU - idle, ~0) would then come out +1e-16 one way
and -1e-16 the other. Same GPUs, same bits, whatever the order.
"""

from __future__ import annotations

import itertools
import math
import operator
from collections.abc import Iterable
from typing import cast

import attrs

from otel_ofu import names
from otel_ofu_collector.results import FleetLoss, JobLoss, JobSums

C = names.OfuLossCause
CAUSES = C.ALL
SPLIT_CAUSES = tuple(cause for cause in CAUSES if cause != C.UNMEASURED)  # what a GPU's OFU measurement splits
IDLE, CLOCK, TENSOR, UNMEASURED = C.IDLE, C.CLOCK, C.TENSOR, C.UNMEASURED
NO_KERNEL, SM_IDLE, NON_TENSOR = C.NO_KERNEL, C.SM_IDLE, C.NON_TENSOR
IDLE_TENSOR_ACTIVE = 0.01  # mean tensor pipe activity below which a GPU did no tensor work in the window
J_PER_KWH = 3.6e6
S_PER_HOUR = 3600.0
_ONE = 1.0


@attrs.frozen
class Split:
    """The split of a job's GPUs in columns, one entry per GPU in one order: T as used, and the causes. ``finer``:
    the GPUs with engine and SM activity (None: none had them); ``no_kernel``, ``sm_idle``, ``non_tensor`` are
    zeros where a GPU lacks them, as ``tensor`` is where it has them."""

    tensor_active: list[float]
    idle: list[float]
    clock: list[float]
    tensor: list[float]
    no_kernel: list[float] | None = None
    sm_idle: list[float] | None = None
    non_tensor: list[float] | None = None
    finer: list[bool] | None = None

    def column(self, cause: str) -> list[float]:
        found = {IDLE: self.idle, CLOCK: self.clock, TENSOR: self.tensor}.get(cause)
        if found is None:
            found = {NO_KERNEL: self.no_kernel, SM_IDLE: self.sm_idle, NON_TENSOR: self.non_tensor}[cause]
        return found if found is not None else [0.0] * len(self.idle)


def split_columns(
    ofu: list[float],
    tensor_active: list[float | None] | None = None,
    clock_ratio: list[float | None] | None = None,
    engine_active: list[float | None] | None = None,
    sm_active: list[float | None] | None = None,
) -> Split:
    """The split of every GPU (see the module doc), in columns: the one implementation of it.

    ``tensor_active`` None (or an entry None): the GPU sent no tensor activity, T is taken as O; ``clock_ratio`` None
    (or an entry None): no clock reading, no clock term (a ratio of 1 gives the same bits: T x 0 = 0);
    ``engine_active`` and ``sm_active`` None (or an entry None in either): the coarse ``tensor``. Each column is a
    C-level pass in the same operations and order for every GPU, so one GPU's shares do not depend on which other
    GPUs share its job.
    """
    n = len(ofu)
    if tensor_active is None:
        tpa = list(ofu)
    elif None in tensor_active:
        tpa = [o if t is None else max(t, o) for o, t in zip(ofu, tensor_active, strict=True)]
    else:
        tpa = list(map(max, cast(list[float], tensor_active), ofu))  # max(T, O)
    if clock_ratio is None:
        clock = [0.0] * n
    else:
        ratio = clock_ratio if None not in clock_ratio else [1.0 if r is None else r for r in clock_ratio]
        unclamped = map(operator.mul, tpa, map(_ONE.__sub__, cast(list[float], ratio)))  # T x (1 - r)
        clock = list(map(min, map(max, unclamped, itertools.repeat(0.0)), map(operator.sub, tpa, ofu)))
    tensor = list(map(operator.sub, map(_ONE.__sub__, ofu), clock))  # 1 - O - clock
    idle = [0.0] * n
    idle_at = list(itertools.compress(range(n), map(IDLE_TENSOR_ACTIVE.__gt__, tpa)))  # the few idle GPUs
    for i in idle_at:
        idle[i], clock[i], tensor[i] = 1.0 - ofu[i], 0.0, 0.0
    finer = _finer(engine_active, sm_active)
    if finer is None:
        return Split(tpa, idle, clock, tensor)
    engine, sm = cast(list[float | None], engine_active), cast(list[float | None], sm_active)
    if all(finer):
        s_used = list(map(min, itertools.repeat(1.0), map(max, cast(list[float], sm), tpa)))  # T <= S <= 1
        e_used = list(map(min, itertools.repeat(1.0), map(max, cast(list[float], engine), s_used)))  # S <= E <= 1
    else:
        s_used = [min(1.0, max(s, t)) if s is not None else t for s, t in zip(sm, tpa, strict=True)]
        e_used = [min(1.0, max(e, s)) if e is not None else s for e, s in zip(engine, s_used, strict=True)]
    no_kernel = list(map(_ONE.__sub__, e_used))  # 1 - E
    sm_idle = list(map(operator.sub, e_used, s_used))  # E - S
    non_tensor = list(map(operator.sub, map(operator.sub, s_used, ofu), clock))  # S - O - clock
    for i in itertools.compress(range(n), map(operator.not_, finer)):  # GPUs without E and S keep the coarse cause
        no_kernel[i] = sm_idle[i] = non_tensor[i] = 0.0
    for i in idle_at:
        no_kernel[i] = sm_idle[i] = non_tensor[i] = 0.0
    for i in itertools.compress(range(n), finer):
        tensor[i] = 0.0
    return Split(tpa, idle, clock, tensor, no_kernel, sm_idle, non_tensor, finer)


def _finer(engine_active: list[float | None] | None, sm_active: list[float | None] | None) -> list[bool] | None:
    """Which GPUs have both engine and SM activity; None when none has."""
    if engine_active is None or sm_active is None:
        return None
    finer = [e is not None and s is not None for e, s in zip(engine_active, sm_active, strict=True)]
    return finer if any(finer) else None


def clock_ratios(sm_clock_hz: list[float], reference_hz: list[float]) -> list[float]:
    """``clock_ratio`` of GPUs whose clock and reference (tensor clock, else max clock) are all known, > 0."""
    return list(
        map(
            min,
            itertools.repeat(1.0),
            map(max, itertools.repeat(0.0), map(operator.truediv, sm_clock_hz, reference_hz)),
        )
    )


def clock_ratio(sm_clock_hz: float | None, max_clock_hz: float | None, tensor_clock_hz: float | None) -> float | None:
    """``min(1, f / f_ref)``: the tensor clock where known, else the board's max; None without the clocks."""
    reference = tensor_clock_hz if tensor_clock_hz else max_clock_hz
    if sm_clock_hz is None or not reference or reference <= 0.0:
        return None
    return min(1.0, max(0.0, sm_clock_hz / reference))


def weighted_mean(values: list[float], share: list[float] | None) -> float:
    """The mean of a job's per-GPU values, each GPU weighing its share of a GPU (None: all whole GPUs); exactly
    rounded, so the same GPUs give the same bits in any order."""
    if share is None:
        return math.fsum(values) / len(values)
    return math.fsum(map(operator.mul, values, share)) / math.fsum(share)


@attrs.define
class GpuColumns:
    """A job's GPUs in columns, one entry per GPU in one order: what a window close fills in one pass over the job's
    GPUs, without an object per GPU. ``seconds``: each GPU's seconds in the window, ``measured`` the part its OFU
    covered (a GPU without OFU: 0; its ``ofu`` entry is then a stand-in that weighs nothing). ``share``: each GPU's
    share of a physical GPU (a MIG slice's fraction, ``otel_ofu.gpu_share``), None when all are whole GPUs; ``dram``,
    ``nvlink``, ``pcie``: each GPU's DRAM activity and link bytes per second, None where it sent none (the column None:
    no GPU did)."""

    ofu: list[float]
    split: Split
    seconds: list[float]
    energy_j: list[float | None]
    flops: list[float | None]
    price: list[float | None]
    share: list[float] | None = None
    dram: list[float | None] | None = None
    nvlink: list[float | None] | None = None
    pcie: list[float | None] | None = None
    measured: list[float] | None = None  # None: every second measured (``seconds``)


def causes_of(split: Split) -> tuple[str, ...]:
    """The causes a job's split has, in ``names.OfuLossCause.ALL`` order: the finer three where some GPU reports
    engine and SM activity, ``tensor`` where some does not (``unmeasured`` is not the split's: see ``job_loss_of``)."""
    finer = split.finer
    coarse = finer is None or not all(finer)
    return tuple(
        cause
        for cause in SPLIT_CAUSES
        if (cause not in C.TENSOR_PARTS or finer is not None) and (cause != TENSOR or coarse)
    )


def job_values(sums: JobSums) -> tuple[float | None, dict[str, float]]:
    """The job's OFU (useful / GPU time; None when no second was measured) and each cause's share of its GPU time,
    summing to 1 with the OFU: the residual cause takes what rounding leaves."""
    total = sums.gpu_time_s
    shares = {cause: seconds / total for cause, seconds in sums.lost_s.items()}
    residual = sums.residual
    if residual is None:
        return None, shares
    ofu = sums.useful_s / total
    shares[residual] = 1.0 - ofu - math.fsum(v for cause, v in shares.items() if cause != residual)
    return ofu, shares


def job_loss(sums: JobSums) -> JobLoss:
    """The ``JobLoss`` a job's window sums make."""
    _ofu, shares = job_values(sums)
    return JobLoss(
        gpu_time_s=sums.gpu_time_s,
        shares=shares,
        lost_s=dict(sums.lost_s),
        energy_j=sums.energy_j,
        flops_per_joule=sums.flops / sums.flops_energy_j if sums.flops_energy_j > 0.0 else None,
        cost=sums.cost,
        cost_lost=dict(sums.cost_lost) if sums.cost_lost is not None else None,
        emissions_kg=sums.emissions_kg,
        currency=sums.currency if sums.cost is not None else None,
        dram_active=_context_of(sums, DRAM),
        nvlink_bytes_per_s=_context_of(sums, NVLINK),
        pcie_bytes_per_s=_context_of(sums, PCIE),
    )


DRAM, NVLINK, PCIE = "dram", "nvlink", "pcie"  # JobSums.context keys


def _context_of(sums: JobSums, kind: str) -> float | None:
    found = sums.context.get(kind)
    return found[0] / found[1] if found is not None and found[1] > 0.0 else None


def job_sums_of(
    gpus: GpuColumns,
    *,
    currency: str | None,
    pue: float = 1.0,
    grid_intensity: float | None = None,
) -> JobSums | None:
    """The job's window sums from its GPUs' splits in columns (each sum a C-level pass over a column); None for a job
    without GPU time in the window. GPU time, lost time and cost count GPU equivalents (a 1g slice of an H100 for a
    minute is 1/7 of a GPU-minute)."""
    n = len(gpus.ofu)
    if not n:
        return None
    share = gpus.share
    total = gpus.seconds if share is None else list(map(operator.mul, gpus.seconds, share))  # capacity-seconds
    measured_s = gpus.measured if gpus.measured is not None else gpus.seconds
    measured = measured_s if share is None else list(map(operator.mul, measured_s, share))
    gpu_time = math.fsum(total)
    if not gpu_time > 0.0:
        return None
    split = gpus.split
    causes = causes_of(split) if any(measured) else ()
    own = {cause: split.column(cause) for cause in causes}
    lost = {cause: math.fsum(map(operator.mul, own[cause], measured)) for cause in causes}
    unmeasured: list[float] | None = None
    if gpus.measured is not None:
        unmeasured = [max(0.0, t - m) for t, m in zip(total, measured, strict=True)]
        if any(unmeasured):
            lost[UNMEASURED] = math.fsum(unmeasured)
    energy, flops, flops_energy = _energy_sums(gpus)
    cost, cost_lost = _cost_sums(gpus.price, total, {cause: (own[cause], measured) for cause in causes}, unmeasured)
    context = {
        kind: found
        for kind, column in ((DRAM, gpus.dram), (NVLINK, gpus.nvlink), (PCIE, gpus.pcie))
        if (found := _weighted(column, total)) is not None
    }
    return JobSums(
        gpu_time_s=gpu_time,
        useful_s=math.fsum(map(operator.mul, gpus.ofu, measured)),
        lost_s=lost,
        energy_j=energy,
        flops=flops,
        flops_energy_j=flops_energy,
        cost=cost,
        cost_lost=cost_lost,
        emissions_kg=emissions_kg(energy, pue, grid_intensity),
        currency=currency if cost is not None else None,
        context=context,
    )


def _energy_sums(gpus: GpuColumns) -> tuple[float | None, float, float]:
    """(the GPUs' energy, None where none reported any; FLOPs done; the energy of the GPUs that reported both)."""
    if gpus.energy_j.count(None) == len(gpus.energy_j):
        return None, 0.0, 0.0
    energy = math.fsum(e for e in gpus.energy_j if e is not None)
    with_flops = [(f, e) for f, e in zip(gpus.flops, gpus.energy_j, strict=True) if f is not None and e is not None]
    return energy, math.fsum(f for f, _e in with_flops), math.fsum(e for _f, e in with_flops)


def _cost_sums(
    price: list[float | None],
    total: list[float],
    causes: dict[str, tuple[list[float], list[float]]],
    unmeasured: list[float] | None,
) -> tuple[float | None, dict[str, float] | None]:
    """(the job's cost over its GPUs' capacity-seconds ``total``, each cause's share of it), over the GPUs with a
    price; (None, None) without one. ``causes`` holds each cause's (share of the measured time, measured seconds)."""
    priced = [i for i, found in enumerate(price) if found is not None]
    if not priced:
        return None, None
    prices = [(cast(float, price[i]), i) for i in priced]
    cost = math.fsum(rate * total[i] / S_PER_HOUR for rate, i in prices)
    cost_lost = {
        cause: math.fsum(rate * own[i] * measured[i] / S_PER_HOUR for rate, i in prices)
        for cause, (own, measured) in causes.items()
    }
    if unmeasured is not None and any(unmeasured):
        cost_lost[UNMEASURED] = math.fsum(rate * unmeasured[i] / S_PER_HOUR for rate, i in prices)
    return cost, cost_lost


def _weighted(values: list[float | None] | None, weights: list[float]) -> tuple[float, float] | None:
    """(sum of a per-GPU context value weighted by GPU time, that GPU time) over the GPUs that report it; None when
    none does."""
    if values is None:
        return None
    pairs = [(v, weights[i]) for i, v in enumerate(values) if v is not None]
    weight = math.fsum(w for _v, w in pairs)
    if not pairs or not weight > 0.0:
        return None
    return math.fsum(v * w for v, w in pairs), weight


def emissions_kg(energy_j: float | None, pue: float, grid_intensity: float | None) -> float | None:
    """kg CO2e: facility energy (GPU energy x PUE, in kWh) x the grid's intensity (kg CO2e per kWh)."""
    if energy_j is None or grid_intensity is None:
        return None
    return energy_j / J_PER_KWH * pue * grid_intensity


def fleet_loss(jobs: Iterable[JobLoss], energy_j: float | None, currency: str | None) -> FleetLoss:
    """The fleet's totals: lost time and cost summed over its jobs; ``energy_j`` over all its GPUs."""
    lost: dict[str, float] = {}
    cost_lost: dict[str, float] | None = None
    for job in jobs:
        for cause, seconds in job.lost_s.items():
            lost[cause] = lost.get(cause, 0.0) + seconds
        if job.cost_lost is not None:
            cost_lost = cost_lost or {}
            for cause, value in job.cost_lost.items():
                cost_lost[cause] = cost_lost.get(cause, 0.0) + value
    return FleetLoss(lost, energy_j, cost_lost, currency if cost_lost is not None else None)
