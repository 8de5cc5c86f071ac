"""Where a job's OFU is lost, and what it costs: pure arithmetic over one window's per-GPU values.

Per GPU, from its window means (OFU ``O``, tensor pipe activity ``T``, SM clock ``f``):

    idle   = 1 - O when the GPU had no tensor activity all window (T < IDLE_TENSOR_ACTIVE), else 0
    clock  = T x (1 - r), r = min(1, f / f_ref), clamped to [0, T - O]      (0 for an idle GPU)
    tensor = 1 - O - idle - clock                                            (0 for an idle GPU)

"No tensor activity" allows a stray kernel: tensor pipes active under 1% of the window do no work worth
the allocation, and an idle GPU's whole 1 - O is idle loss.

``f_ref`` is the clock OFU itself is measured against: the tensor clock of the GPU model where the catalog
knows it (the clock the datasheet's dense peak is specified at: an SM boosting above it adds no tensor
FLOPs, so it is no loss either), the board's maximum SM clock otherwise. Since the producer's OFU is
``T x r x calibration``, ``T - O = T(1 - r) + T r (1 - calibration)``: the clock term is the first part,
and calibration's share (tile quantization: tensor pipes busy on padding) stays in ``tensor``, as tensor
work that did no useful FLOPs. The clamp keeps every share >= 0 when window means of separate gauges do
not multiply exactly; without a clock reading ``clock`` is 0 and the whole ``T - O`` reads as ``tensor``;
without ``T`` (a producer that sends only ``gpu.ofu``), ``T`` is taken as ``O``: everything lost is tensor.

Per job: each share is the plain mean over its GPUs, as ``job.ofu`` is, and the job's ``tensor`` share is
taken as ``1 - OFU - idle - clock`` of those means, so ``OFU + idle + clock + tensor = 1`` holds to the
last bit of that one subtraction. GPU-seconds lost by cause = sum over GPUs of share x the GPU's seconds.
Energy, FLOPs per joule, cost and emissions are sums over the GPUs that have the inputs (see ``GpuLoss``).

Every sum over GPUs is exactly rounded (``math.fsum``): the GPUs come in the order their points arrived,
which differs between a single collector and a shard behind the load balancer, and a plain running sum
would round differently by order; the residual ``tensor`` share of an idle job (1 - OFU - idle, ~0)
would then come out +1e-16 one way and -1e-16 the other. Same GPUs, same bits, whatever the order.
"""

from __future__ import annotations

import itertools
import math
import operator
from collections.abc import Iterable
from typing import cast

import attrs

from otel_ofu import names
from otel_ofu_collector.results import FleetLoss, JobLoss

CAUSES = (names.OfuLossCause.IDLE, names.OfuLossCause.CLOCK, names.OfuLossCause.TENSOR)
IDLE, CLOCK, TENSOR = names.OfuLossCause.IDLE, names.OfuLossCause.CLOCK, names.OfuLossCause.TENSOR
IDLE_TENSOR_ACTIVE = 0.01  # mean tensor pipe activity below which a GPU did no tensor work in the window
J_PER_KWH = 3.6e6
S_PER_HOUR = 3600.0
_ONE = 1.0


@attrs.frozen
class GpuLoss:
    """One GPU's split of 1 - OFU in one window, and its inputs to the job's sums."""

    ofu: float
    tensor_active: float  # T as used (O where T was not reported)
    idle: float
    clock: float
    tensor: float
    seconds: float  # GPU-seconds in the window
    energy_j: float | None  # None: no energy counter nor power reading
    flops: float | None  # achieved FLOPs in the window (None where the dense peak is not known)
    price: float | None  # per GPU-hour, None: not priced


@attrs.frozen
class Split:
    """The split of a job's GPUs in columns, one entry per GPU in one order: T as used, and the causes."""

    tensor_active: list[float]
    idle: list[float]
    clock: list[float]
    tensor: list[float]


def split_columns(
    ofu: list[float],
    tensor_active: list[float | None] | None = None,
    clock_ratio: list[float | None] | None = None,
) -> Split:
    """The split of every GPU (see the module doc), in columns: the one implementation of it.

    ``tensor_active`` None (or an entry None): the GPU sent no tensor activity, T is taken as O; ``clock_ratio`` None
    (or an entry None): no clock reading, no clock term (a ratio of 1 gives the same bits: T x 0 = 0). Each column
    is a C-level pass in the same operations and order for every GPU, so one GPU's shares do not depend on which
    other GPUs share its job.
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
    for i in itertools.compress(range(n), map(IDLE_TENSOR_ACTIVE.__gt__, tpa)):  # the few idle GPUs
        idle[i], clock[i], tensor[i] = 1.0 - ofu[i], 0.0, 0.0
    return Split(tpa, idle, clock, tensor)


def split_gpu(
    ofu: float,
    tensor_active: float | None,
    clock_ratio: float | None,
    *,
    seconds: float,
    energy_j: float | None = None,
    flops_per_s: float | None = None,
    price: float | None = None,
) -> GpuLoss:
    """One GPU's split (``split_columns`` of one GPU); ``clock_ratio`` is ``min(1, f / f_ref)`` or None."""
    split = split_columns([ofu], [tensor_active], [clock_ratio])
    flops = None if flops_per_s is None else flops_per_s * seconds
    return GpuLoss(
        ofu, split.tensor_active[0], split.idle[0], split.clock[0], split.tensor[0], seconds, energy_j, flops, price
    )


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
    """A job's GPUs' splits in columns, one entry per GPU in one order: what a window close fills in one pass
    over the job's GPUs (``GpuLoss``'s fields, without an object per GPU). ``share``: each GPU's share of a
    physical GPU (a MIG slice's fraction, ``otel_ofu.gpu_share``), None when all are whole GPUs."""

    ofu: list[float] = attrs.field(factory=list)
    idle: list[float] = attrs.field(factory=list)
    clock: list[float] = attrs.field(factory=list)
    tensor: list[float] = attrs.field(factory=list)
    seconds: list[float] = attrs.field(factory=list)
    energy_j: list[float | None] = attrs.field(factory=list)
    flops: list[float | None] = attrs.field(factory=list)
    price: list[float | None] = attrs.field(factory=list)
    share: list[float] | None = None


def job_loss_of(
    gpus: GpuColumns,
    *,
    currency: str | None,
    pue: float = 1.0,
    grid_intensity: float | None = None,
) -> JobLoss | None:
    """The job's window values from its GPUs' splits in columns (each sum a C-level pass over a column); None for
    a job without GPUs in the window. Shares are means weighted by each GPU's share of a GPU, and GPU time, lost
    time and cost count GPU equivalents (a 1g slice of an H100 for a minute is 1/7 of a GPU-minute)."""
    n = len(gpus.ofu)
    if not n:
        return None
    share = gpus.share
    ofu = weighted_mean(gpus.ofu, share)
    idle = weighted_mean(gpus.idle, share)
    clock = weighted_mean(gpus.clock, share)
    shares = {IDLE: idle, CLOCK: clock, TENSOR: 1.0 - ofu - idle - clock}
    own = {IDLE: gpus.idle, CLOCK: gpus.clock, TENSOR: gpus.tensor}
    seconds = gpus.seconds if share is None else list(map(operator.mul, gpus.seconds, share))
    lost = {cause: math.fsum(map(operator.mul, own[cause], seconds)) for cause in CAUSES}
    energy: float | None = None
    flops = flops_energy = 0.0
    if gpus.energy_j.count(None) < n:
        energy = math.fsum(e for e in gpus.energy_j if e is not None)
        with_flops = [(f, e) for f, e in zip(gpus.flops, gpus.energy_j, strict=True) if f is not None and e is not None]
        flops = math.fsum(f for f, _e in with_flops)
        flops_energy = math.fsum(e for _f, e in with_flops)
    cost: float | None = None
    cost_lost: dict[str, float] | None = None
    unpriced = gpus.price.count(None)
    if unpriced < n:
        prices = [price for price in gpus.price if price is not None] if unpriced else cast(list[float], gpus.price)
        hours = list(map(S_PER_HOUR.__rtruediv__, seconds))  # seconds / S_PER_HOUR
        parts = own
        if unpriced:  # some GPUs not priced: the others' columns alone
            priced = [i for i, price in enumerate(gpus.price) if price is not None]
            hours = [hours[i] for i in priced]
            parts = {cause: [own[cause][i] for i in priced] for cause in CAUSES}
        cost = math.fsum(map(operator.mul, prices, hours))
        cost_lost = {
            cause: math.fsum(map(operator.mul, map(operator.mul, prices, parts[cause]), hours)) for cause in CAUSES
        }
    return JobLoss(
        gpu_time_s=math.fsum(seconds),
        shares=shares,
        lost_s=lost,
        energy_j=energy,
        flops_per_joule=flops / flops_energy if flops_energy > 0.0 else None,
        cost=cost,
        cost_lost=cost_lost,
        emissions_kg=emissions_kg(energy, pue, grid_intensity),
        currency=currency if cost is not None else None,
    )


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
