"""A simulated GPU fleet: a counter source like any other, deterministic for a seed.

Hosts x GPUs run jobs with workload profiles (healthy dense training, an MoE job whose framework
over-counts FLOPs, a job that regresses, a mixed-precision job, an allocated GPU that sits idle) and
a GPU can be flaky (its reading fails now and then: an error, never a zero).

How it behaves like hardware:

* Every GPU's activity is generated on a fixed internal grid (``step_s``, 1 s by default) counted from
  the fleet's start, one seeded generator per GPU, step by step. The series is therefore the same
  whatever the read cadence: reads only integrate it.
* ``read`` covers ``[previous read, clock()]``. TPA is the exact average over that interval, as DCGM's
  field 1004 is; the SM clock is a POINT SAMPLE at the end of the interval, as field 100 and NVML are:
  the OFU paper's clock sampling noise appears. ``average_clock=True`` reports the true interval
  average instead, and ``cycle_counters=True`` adds exact cycle-counter deltas (``counting_units=1``)
  so studies can compare the three.
* Clocks boost near the board max (1980 MHz on H100 SXM) with a small load droop and jitter in 15 MHz
  bins, fall into power-throttle stretches (~1600-1750 MHz on H100) now and then, and sit at the idle
  clock when a GPU does nothing.
* Board power follows load and clock (idle ~10% of a 700 W limit, dynamic power ~ f^3), with an energy
  counter and the share of each interval power or temperature held the clock down, as a board with
  violation counters reports them. ``SimGpu.fault`` adds a ``power_cap`` GPU (a 420 W limit: clocks held
  to stay under it) or a ``thermal`` one (thermal slowdown to 0.7 x max for half of every two minutes).
* Beside the tensor pipes, each job's ``ActivityProfile`` (from its kind and ``JobSpec.bottleneck``) says how
  busy the engine (E: a kernel running), the SMs (S) and DRAM are and how much NVLink and PCIe traffic it moves
  while it runs at its nominal pace; each step scales them by how much of that pace the step ran (its TPA over
  the nominal TPA: a stall or a regression takes the engine with it), and clamps them so that T <= S <= E, as
  the counters nest on hardware. The link traffic is reported as byte counters since the fleet started.

Values a real GPU would never give you are named ``truth_*`` (``GpuReading.truth_ofu``,
``truth_precision``) or come from ``interval_truth``, ``truth_ofu`` and ``reported_mfu``; real sources
leave the ``truth_*`` fields None. Ground-truth OFU per fine step is what ``ofu_math.ofu`` gives for the
exact inputs: TPA x min(f / f_tensor, 1), in the catalog's tensor clock domain (the board max for a
model the catalog does not know), averaged over the interval.
"""

from __future__ import annotations

import math
import random
import uuid
from array import array
from collections.abc import Iterable, Sequence
from typing import Any, Final

import attrs

from otel_ofu import catalog, names
from otel_ofu.clock import ManualClock, wall_clock
from otel_ofu.model import (
    Clock,
    CycleCounters,
    EnergyCounter,
    GpuError,
    GpuIdentity,
    GpuReading,
    IoCounter,
    Snapshot,
)
from otel_ofu.sources.simulated_training import DOWN, HUNG, SAVE, TRAIN, WARMUP, Timeline, TrainingPlan, timeline

H100_SXM_NAME = "NVIDIA H100 80GB HBM3"
SCHEDULER = "static"

# Clock behaviour as fractions of the board max (H100 SXM: idle 345 MHz, power throttling to ~1600-1750).
_CLOCK_BIN_MHZ = 15.0
_IDLE_CLOCK_FRACTION = 345.0 / 1980.0
_THROTTLE_RANGE = (0.81, 0.885)
_THROTTLE_DURATION_S = (20.0, 150.0)
_THROTTLE_RATE_PER_S = 0.004  # at full nominal load; lighter loads throttle less often
# A flaky GPU's outages: how often one starts and how long it lasts.
_OUTAGE_RATE_PER_S = 1.0 / 240.0
_OUTAGE_DURATION_S = (15.0, 45.0)
_OUTAGE_REASONS = (names.ErrorReason.GPU_LOST, names.ErrorReason.NO_VALUE)  # codes 1 and 2
# How far ahead a job's phases are laid out (a simulated run is minutes to hours).
_TIMELINE_S = 30 * 86400.0
# Framework MFU noise: relative, per reported interval.
_MFU_NOISE = 0.015
# Board power as fractions of the power limit (H100 SXM: 700 W, ~70 W idle): idle + dynamic power that
# grows with load and like f^3 with the clock (P ~ f V^2, V ~ f near the top of the curve).
_POWER_LIMIT_W = 700.0
_IDLE_POWER_FRACTION = 0.1
_POWER_CAP_FRACTION = 0.6  # a "power_cap" GPU's enforced limit (420 W on a 700 W board)
# The demo fleet's straggler: (host index, GPU index) in the healthy job-1001, capped hard enough (245 W) that
# its clock, ~1350 MHz under load, puts its OFU near 0.74x its job's median.
DEMO_STRAGGLER: Final = (0, 3)
DEMO_STRAGGLER_CAP_W: Final = 245.0
# A "thermal" GPU overheats in cycles: the second half of every period at the thermal slowdown clock.
_THERMAL_PERIOD_S = 120.0
_THERMAL_CLOCK_FRACTION = 0.7


class GpuFault:
    """Faults a simulated GPU can have besides flakiness; each holds the SM clock down for a reason."""

    POWER_CAP = "power_cap"  # its power limit is set well below the board's: clocks held to stay under it
    THERMAL = "thermal"  # it overheats in cycles: software thermal slowdown for half of every cycle

    ALL = (POWER_CAP, THERMAL)


class Bottleneck:
    """What a simulated job's tensor pipes wait on, beyond the healthy mix (``JobSpec.bottleneck``)."""

    INPUT = "input"  # the input pipeline stalls 40% of every step: no kernel runs then (low E)
    COMMUNICATION = "communication"  # exposed collectives: SMs busy in communication kernels, NVLink near peak
    MEMORY = "memory"  # memory-bound kernels: SMs busy off the tensor pipes, DRAM ~70% busy

    ALL = (INPUT, COMMUNICATION, MEMORY)


# H100 SXM (NVIDIA's datasheet): 900 GB/s of NVLink 4 per GPU, i.e. 450 GB/s each way; HBM3 at 3.35 TB/s.
_NVLINK_PEAK_BYTES_PER_S = 450e9
_HBM_BYTES_PER_S = 3.35e12
_INPUT_RUN_SHARE = 0.6  # an input-bound job's engine runs 60% of the step: a 40% input pipeline stall
# What a GPU shows besides its job's paced profile in a phase other than training (engine, SM activity, occupancy,
# DRAM activity), with its tensor activity: a hung collective spins (one block per NCCL channel: 2% of the SMs busy,
# nothing moving); loading weights or a checkpoint runs a small kernel now and then, as a checkpoint save copies to
# the host (no tensor work either); a crashed job's GPUs sit idle until its relaunch.
HUNG_ACTIVITY: Final = (0.99, 0.02, 0.01, 0.0)
_PHASE_ACTIVITY: Final = {
    HUNG: (0.0, HUNG_ACTIVITY),
    WARMUP: (0.0, (0.1, 0.05, 0.02, 0.1)),
    SAVE: (0.0, (0.1, 0.05, 0.02, 0.05)),
    DOWN: (0.0, (0.0, 0.0, 0.0, 0.0)),
}


@attrs.frozen
class ActivityProfile:
    """What a job's GPUs do beside the tensor pipes while the job runs at its nominal pace: interval averages of
    engine activity (E: a kernel running), SM activity (S), SM occupancy and DRAM activity, and link traffic in bytes
    per second (NVLink each way; PCIe from the host, ``pcie_rx``, and to it, ``pcie_tx``). Illustrative H100 figures:
    the healthy mix is a dense training step whose SMs are ~85% busy at a TPA of 0.48 (DCGM's guidance: SM activity
    of 0.8 or more is needed for effective use) and whose DRAM is about a third busy."""

    engine_active: float
    sm_active: float
    sm_occupancy: float
    dram_active: float
    nvlink_bytes_per_s: float = 0.0
    pcie_rx_bytes_per_s: float = 0.0
    pcie_tx_bytes_per_s: float = 0.0

    @classmethod
    def of(cls, job: JobSpec) -> ActivityProfile:
        """The profile of a job's kind and bottleneck; NVLink traffic only for a job of two GPUs or more."""
        tpa = job.tensor_active
        peers = 1.0 if len(job.gpu_keys) > 1 else 0.0
        if job.kind == ProfileKind.IDLE:
            return cls(0.0, 0.0, 0.0, 0.0)
        if job.bottleneck == Bottleneck.INPUT:
            # The healthy mix for the 60% of the step the engine runs; the host feeds decoded samples over PCIe.
            run = _INPUT_RUN_SHARE
            busy_sm = min(0.9, tpa / run + 0.37) * run
            return cls(0.97 * run, max(tpa, busy_sm), 0.30 * run, 0.35 * run, 60e9 * run * peers, 6e9, 0.2e9)
        if job.bottleneck == Bottleneck.COMMUNICATION:
            # Collectives at ~73% of the links' 450 GB/s each way; HBM only streams what crosses them (2 x 330 GB/s
            # of 3.35 TB/s: ~0.2) and communication kernels keep SMs resident with few warps.
            nvlink = 0.73 * _NVLINK_PEAK_BYTES_PER_S * peers
            dram = min(1.0, 2 * nvlink / _HBM_BYTES_PER_S + 0.02)
            return cls(0.96, max(tpa, 0.80), 0.12, dram, nvlink, 0.5e9, 0.1e9)
        if job.bottleneck == Bottleneck.MEMORY:
            return cls(0.96, max(tpa, 0.88), 0.45, 0.70, 40e9 * peers, 0.5e9, 0.1e9)
        nvlink = (120e9 if job.kind == ProfileKind.MOE else 60e9) * peers  # MoE: all-to-all between experts
        return cls(0.97, max(tpa, min(0.9, tpa + 0.37)), 0.30, 0.35, nvlink, 0.5e9, 0.1e9)


class ProfileKind:
    """The workload profiles of simulated jobs."""

    DENSE = "dense"  # healthy dense training: MFU ~ OFU x efficiency
    MOE = "moe"  # a framework FLOP formula that over-counts (``miscount_factor``)
    REGRESSING = "regressing"  # OFU drops by ``regression_factor`` at ``regression_at_s``
    MIXED = "mixed"  # alternates between two precisions every ``switch_every_s``
    IDLE = "idle"  # allocated, does nothing, reports no MFU

    ALL = (DENSE, MOE, REGRESSING, MIXED, IDLE)


def _in_unit(_instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{attribute.name} must be in [0, 1], got {value!r}")


def _positive(_instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not (math.isfinite(value) and value > 0.0):
        raise ValueError(f"{attribute.name} must be positive, got {value!r}")


def _keys(values: Iterable[str]) -> tuple[str, ...]:
    return tuple(values)


def _gpus(values: Iterable[SimGpu]) -> tuple[SimGpu, ...]:
    return tuple(values)


def _jobs(values: Iterable[JobSpec]) -> tuple[JobSpec, ...]:
    return tuple(values)


@attrs.frozen
class JobSpec:
    """A simulated job and its ground truth. Times are seconds since the fleet started."""

    job_id: str
    name: str
    kind: str = attrs.field(validator=attrs.validators.in_(ProfileKind.ALL))
    precision: str = attrs.field(validator=attrs.validators.in_(names.PRECISIONS))  # mixed: the first one
    gpu_keys: tuple[str, ...] = attrs.field(converter=_keys)
    # Reported MFU / true MFU of the framework's FLOP formula (1.0: a correct formula).
    miscount_factor: float = attrs.field(default=1.0, validator=_positive)
    regression_at_s: float | None = None
    regression_factor: float = attrs.field(default=1.0, validator=_positive)  # OFU divides by it
    recovery_at_s: float | None = None
    tensor_active: float = attrs.field(default=0.45, validator=_in_unit)  # nominal TPA, first precision
    # True MFU / OFU: MFU ignores recompute and padding that the tensor pipes do see.
    mfu_efficiency: float = attrs.field(default=0.96, validator=_in_unit)
    switch_every_s: float | None = None  # mixed: precision alternates with ``alternate_precision``
    alternate_precision: str | None = None
    alternate_tensor_scale: float = 0.72  # TPA in the alternate precision relative to ``tensor_active``
    # What else holds the tensor pipes back (a ``Bottleneck``); None: the healthy mix of its kind.
    bottleneck: str | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.in_(Bottleneck.ALL))
    )
    # From this second on every GPU of the job spins in a hung collective: engine busy, SMs nearly empty, nothing
    # moving (``HUNG_ACTIVITY``), no step, no MFU; None: it never hangs.
    hang_at_s: float | None = None
    # How it trains over time (startup, steps, checkpoint saves, a crash and a reload: ``simulated_training``): what its
    # framework reports as job.step and job.checkpoint.time; None: it reports no progress and runs all along.
    training: TrainingPlan | None = None

    @property
    def reports_mfu(self) -> bool:
        return self.kind != ProfileKind.IDLE

    @property
    def has_miscount(self) -> bool:
        return self.miscount_factor != 1.0

    @property
    def has_regression(self) -> bool:
        return self.regression_at_s is not None and self.regression_factor > 1.0

    @property
    def has_hang(self) -> bool:
        return self.hang_at_s is not None

    def hung_at(self, t_s: float) -> bool:
        return self.hang_at_s is not None and t_s >= self.hang_at_s

    @property
    def mfu_ratio(self) -> float:
        """Expected reported MFU / OFU: ``mfu_efficiency x miscount_factor`` (noise aside)."""
        return self.mfu_efficiency * self.miscount_factor

    def regressed_at(self, t_s: float) -> bool:
        if self.regression_at_s is None or t_s < self.regression_at_s:
            return False
        return self.recovery_at_s is None or t_s < self.recovery_at_s

    def _in_alternate(self, t_s: float) -> bool:
        if self.switch_every_s is None or self.alternate_precision is None:
            return False
        return int(t_s // self.switch_every_s) % 2 == 1

    def dominant_precision(self, start_s: float, end_s: float) -> str:
        """The precision the job ran in for most of ``[start_s, end_s]``."""
        if self.switch_every_s is None or self.alternate_precision is None:
            return self.precision
        period = self.switch_every_s
        alternate = 0.0
        segment = int(start_s // period)
        while segment * period < end_s:
            overlap = min(end_s, (segment + 1) * period) - max(start_s, segment * period)
            if segment % 2 == 1:
                alternate += max(0.0, overlap)
            segment += 1
        return self.alternate_precision if alternate > (end_s - start_s) / 2 else self.precision

    def nominal_tensor_active(self, t_s: float, *, regressed: bool = True) -> float:
        """TPA the job would show at ``t_s`` before noise, throttling and stalls (``regressed=False``: as if it had
        not regressed, the pace its engine and links are sized for)."""
        if self.kind == ProfileKind.IDLE:
            return 0.0
        tpa = self.tensor_active * (self.alternate_tensor_scale if self._in_alternate(t_s) else 1.0)
        if regressed and self.regressed_at(t_s):
            tpa /= self.regression_factor
        return tpa


@attrs.frozen
class SimGpu:
    """One simulated GPU, its placement and whether it is flaky."""

    uuid: str
    host: str
    index: int
    model: str
    max_clock_mhz: float
    job_id: str
    flaky: bool = False
    fault: str | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.in_(GpuFault.ALL))
    )
    # A power_cap GPU's enforced limit in W; None: 60% of the board's 700 W.
    power_cap_w: float | None = attrs.field(default=None, validator=attrs.validators.optional(_positive))
    fault_from_s: float = 0.0  # the fault begins this many seconds after the fleet's start

    @property
    def key(self) -> str:
        return self.uuid


@attrs.frozen
class IntervalTruth:
    """What only the simulation knows of one GPU over an interval (a real GPU does not give you these)."""

    ofu: float  # ground-truth OFU, tensor clock domain
    tensor_active: float  # exact time-average TPA
    mean_sm_clock_hz: float  # exact time-average SM clock (what a point sample approximates)
    precision: str  # the precision the job ran in for most of the interval


@attrs.define
class _Track:
    """A GPU's generated series as prefix sums over the step grid (index k: sum of steps < k)."""

    gpu: SimGpu
    job: JobSpec
    rng: random.Random
    tensor_clock_mhz: float
    straggle: float  # per-GPU scale of the job's TPA: GPUs of one job are alike, not identical
    activity: ActivityProfile
    cum_tpa: array[float] = attrs.field(factory=lambda: array("d", [0.0]))
    cum_mhz: array[float] = attrs.field(factory=lambda: array("d", [0.0]))
    cum_tpa_mhz: array[float] = attrs.field(factory=lambda: array("d", [0.0]))
    cum_ofu: array[float] = attrs.field(factory=lambda: array("d", [0.0]))
    cum_joules: array[float] = attrs.field(factory=lambda: array("d", [0.0]))  # board energy per step (J/s)
    cum_power_held: array[float] = attrs.field(factory=lambda: array("d", [0.0]))  # 1 per step held by power
    cum_thermal_held: array[float] = attrs.field(factory=lambda: array("d", [0.0]))
    # How much of the job's nominal pace each step ran (its TPA / the unregressed nominal TPA, at most 1): what
    # scales the engine, SM and DRAM activity and the link traffic of the job's profile.
    cum_pace: array[float] = attrs.field(factory=lambda: array("d", [0.0]))
    # What a phase other than training adds (``_PHASE_ACTIVITY``): engine, SM activity, occupancy, DRAM activity.
    cum_extra: tuple[array[float], ...] = attrs.field(factory=lambda: tuple(array("d", [0.0]) for _ in range(4)))
    timeline: Timeline | None = None  # the job's phases, where it hangs or has a training plan
    outage: bytearray | None = None  # per step: 0 readable, else 1 + index into _OUTAGE_REASONS
    throttle_left: int = 0
    throttle_mhz: float = 0.0
    outage_left: int = 0
    outage_code: int = 0

    @property
    def steps(self) -> int:
        return len(self.cum_tpa) - 1


def _quantize(mhz: float, max_mhz: float) -> float:
    """Clocks move in 15 MHz bins below the board max, never above it."""
    below = max(0.0, max_mhz - mhz)
    return max(_CLOCK_BIN_MHZ, max_mhz - _CLOCK_BIN_MHZ * round(below / _CLOCK_BIN_MHZ))


def _gpu_uuid(seed: int, host: str, index: int) -> str:
    rng = random.Random(f"{seed}/uuid/{host}/{index}")
    return f"GPU-{uuid.UUID(int=rng.getrandbits(128), version=4)}"


def _max_clock_mhz(model: str, max_clock_mhz: float | None) -> float:
    if max_clock_mhz is not None:
        return max_clock_mhz
    spec = catalog.lookup(model)
    if spec is None or spec.boost_clock_hz is None:
        raise ValueError(f"the catalog has no board max clock for {model!r}: pass max_clock_mhz")
    return spec.boost_clock_hz / 1e6


@attrs.define
class SimulatedFleet:
    """A deterministic simulated fleet implementing ``otel_ofu.model.Source``."""

    gpus: tuple[SimGpu, ...] = attrs.field(converter=_gpus)
    jobs: tuple[JobSpec, ...] = attrs.field(converter=_jobs)
    seed: int = 0
    clock: Clock = wall_clock
    step_s: float = attrs.field(default=1.0, validator=_positive)
    cycle_counters: bool = False  # fill GpuReading.cycles with exact deltas (counting_units=1)
    average_clock: bool = False  # report the true interval-average clock instead of a point sample
    report_max_clock: bool = True  # False: like dcgm-exporter without field 113 (catalog fallback)
    name: str = "sim"
    _start_ns: int = attrs.field(init=False)
    _last_ns: int = attrs.field(init=False)
    _tracks: dict[str, _Track] = attrs.field(init=False, factory=dict)
    _jobs_by_id: dict[str, JobSpec] = attrs.field(init=False, factory=dict)
    _timelines: dict[str, Timeline] = attrs.field(init=False, factory=dict)
    _closed: bool = attrs.field(init=False, default=False)

    def __attrs_post_init__(self) -> None:
        self._jobs_by_id = {job.job_id: job for job in self.jobs}
        if len(self._jobs_by_id) != len(self.jobs):
            raise ValueError("job ids must be unique")
        gpus_by_key = {gpu.key: gpu for gpu in self.gpus}
        if len(gpus_by_key) != len(self.gpus):
            raise ValueError("GPU uuids must be unique")
        for job in self.jobs:
            for key in job.gpu_keys:
                if key not in gpus_by_key or gpus_by_key[key].job_id != job.job_id:
                    raise ValueError(f"job {job.job_id} lists GPU {key}, which is not placed on it")
        for gpu in self.gpus:
            owner = self._jobs_by_id.get(gpu.job_id)
            if owner is None or gpu.key not in owner.gpu_keys:
                raise ValueError(f"GPU {gpu.key} is placed on job {gpu.job_id!r}, which does not list it")
            rng = random.Random(f"{self.seed}/gpu/{gpu.uuid}")
            spec = catalog.lookup(gpu.model)
            tensor_mhz = spec.tensor_clock_hz / 1e6 if spec is not None and spec.tensor_clock_hz else gpu.max_clock_mhz
            self._tracks[gpu.key] = _Track(
                gpu=gpu,
                job=owner,
                rng=rng,
                tensor_clock_mhz=min(tensor_mhz, gpu.max_clock_mhz),
                straggle=rng.uniform(0.97, 1.03),
                activity=ActivityProfile.of(owner),
                outage=bytearray() if gpu.flaky else None,
                timeline=self.timeline(owner.job_id),
            )
        self._start_ns = self.clock()
        self._last_ns = self._start_ns

    # --- the Source protocol ----------------------------------------------------------------------

    def read(self) -> Snapshot:
        """Readings for ``[previous read, clock()]``; an empty snapshot when no time has passed."""
        if self._closed:
            raise RuntimeError("the simulated fleet is closed")
        now = self.clock()
        if now < self._last_ns:
            message = f"clock went backwards ({now} < {self._last_ns}); nothing read"
            return Snapshot(errors=(GpuError(names.ErrorReason.UNKNOWN, message),))
        if now == self._last_ns:
            return Snapshot()
        start, self._last_ns = self._last_ns, now
        readings: list[GpuReading] = []
        errors: list[GpuError] = []
        for track in self._tracks.values():
            result = self._read_gpu(track, start, now)
            if isinstance(result, GpuReading):
                readings.append(result)
            else:
                errors.append(result)
        return Snapshot(readings=tuple(readings), errors=tuple(errors))

    def close(self) -> None:
        self._closed = True

    # --- what the training frameworks report besides MFU -------------------------------------------

    def timeline(self, job_id: str) -> Timeline | None:
        """The job's phases (``simulated_training``), where it hangs or trains to a plan; None: it trains all along."""
        found = self._timelines.get(job_id)
        if found is None:
            job = self.job(job_id)
            if job.training is None and job.hang_at_s is None:
                return None
            plan = job.training or TrainingPlan(startup_s=0.0)  # no plan: it trains from the start until it hangs
            found = self._timelines[job_id] = timeline(plan, _TIMELINE_S, job.hang_at_s)
        return found

    def reported_step(self, job_id: str, t_ns: int) -> int | None:
        """The last step the job's framework says it completed at ``t_ns`` (None: it reports no progress, or none
        yet, or its process is down)."""
        found = self.timeline(job_id)
        if found is None or self.job(job_id).training is None:
            return None
        return found.step(self.seconds(t_ns))

    def reported_checkpoints(self, job_id: str, t_ns: int) -> tuple[int, dict[str, float]] | None:
        """(its reporter process's start in ns, seconds it spent saving and loading by ``t_ns``): the cumulative
        ``job.checkpoint.time`` series of the job's current process; None where it reports none, or is down."""
        found = self.timeline(job_id)
        if found is None or self.job(job_id).training is None:
            return None
        t_s = self.seconds(t_ns)
        if found.kind(t_s) == DOWN:
            return None
        process, seconds = found.checkpoint_seconds(t_s)
        return self._start_ns + round(found.process_start(process) * 1e9), seconds

    # --- ground truth (what a real fleet does not tell you) ---------------------------------------

    @property
    def start_ns(self) -> int:
        return self._start_ns

    @property
    def flaky_gpus(self) -> tuple[SimGpu, ...]:
        return tuple(gpu for gpu in self.gpus if gpu.flaky)

    def job(self, job_id: str) -> JobSpec:
        try:
            return self._jobs_by_id[job_id]
        except KeyError:
            raise KeyError(f"no simulated job {job_id!r}") from None

    def gpu(self, key: str) -> SimGpu:
        try:
            return self._tracks[key].gpu
        except KeyError:
            raise KeyError(f"no simulated GPU {key!r}") from None

    def seconds(self, t_ns: int) -> float:
        """Seconds since the fleet started (the time base of ``JobSpec``)."""
        return (t_ns - self._start_ns) / 1e9

    def interval_truth(self, gpu_key: str, start_ns: int, end_ns: int) -> IntervalTruth | None:
        """Exact averages of one GPU over ``[start_ns, end_ns]`` (clamped to the fleet's start)."""
        try:
            track = self._tracks[gpu_key]
        except KeyError:
            raise KeyError(f"no simulated GPU {gpu_key!r}") from None
        ta, tb = max(0.0, self.seconds(start_ns)), self.seconds(end_ns)
        if tb <= ta:
            return None
        self._extend(track, tb)
        span = tb - ta
        return IntervalTruth(
            ofu=min(1.0, max(0.0, self._integral(track.cum_ofu, ta, tb) / span)),
            tensor_active=min(1.0, max(0.0, self._integral(track.cum_tpa, ta, tb) / span)),
            mean_sm_clock_hz=self._integral(track.cum_mhz, ta, tb) / span * 1e6,
            precision=track.job.dominant_precision(ta, tb),
        )

    def truth_ofu(self, job_id: str, start_ns: int, end_ns: int) -> float | None:
        """The job's ground-truth OFU over the interval: the mean over its GPUs."""
        job = self.job(job_id)
        truths = [self.interval_truth(key, start_ns, end_ns) for key in job.gpu_keys]
        values = [truth.ofu for truth in truths if truth is not None]
        return sum(values) / len(values) if values else None

    def reported_mfu(self, job_id: str, start_ns: int, end_ns: int) -> float | None:
        """What the job's training framework would log as MFU for the interval (None: it logs none).

        True MFU is OFU x ``mfu_efficiency`` (MFU ignores recompute and padding); the framework's FLOP
        formula multiplies it by ``miscount_factor``; a little noise is added, deterministic per
        (seed, job, interval).
        """
        job = self.job(job_id)
        if not job.reports_mfu:
            return None
        found = self.timeline(job_id)
        if found is not None and found.kind(self.seconds(end_ns)) != TRAIN:
            return None  # starting, saving, down or hung: no step, no MFU
        ofu = self.truth_ofu(job_id, start_ns, end_ns)
        if ofu is None:
            return None
        # Keyed by the interval's offsets from the fleet's start, not by wall time: one seed, one series.
        offsets = f"{start_ns - self._start_ns}/{end_ns - self._start_ns}"
        noise = random.Random(f"{self.seed}/mfu/{job_id}/{offsets}").gauss(0.0, _MFU_NOISE)
        return max(0.0, ofu * job.mfu_ratio * (1.0 + noise))

    # --- generation and integration ---------------------------------------------------------------

    def _integral(self, cum: array[float], ta: float, tb: float) -> float:
        return self._cumulative(cum, tb) - self._cumulative(cum, ta)

    def _cumulative(self, cum: array[float], t: float) -> float:
        """Integral of the piecewise-constant series from the fleet's start to ``t`` seconds."""
        x = t / self.step_s
        k = min(int(x), len(cum) - 2)
        return self.step_s * (cum[k] + (x - k) * (cum[k + 1] - cum[k]))

    def _extend(self, track: _Track, t: float) -> None:
        """Generate the GPU's steps up to time ``t`` (at least one step)."""
        upto = max(1, math.ceil(t / self.step_s - 1e-9))
        step = self.step_s
        job, rng, gpu = track.job, track.rng, track.gpu
        max_mhz, tensor_mhz = gpu.max_clock_mhz, track.tensor_clock_mhz
        idle_mhz = _quantize(max_mhz * _IDLE_CLOCK_FRACTION, max_mhz)
        idle = job.kind == ProfileKind.IDLE
        for k in range(track.steps, upto):
            mid = (k + 0.5) * step
            nominal = job.nominal_tensor_active(mid) * track.straggle
            pace_of = job.nominal_tensor_active(mid, regressed=False) * track.straggle
            boost_held = track.throttle_left > 0 and not idle  # a throttle stretch sets this step's clock
            if idle:
                tpa = 0.002 if rng.random() < 0.02 else 0.0  # a stray kernel now and then
                mhz = idle_mhz
            else:
                tpa = nominal * (1.0 + 0.06 * rng.gauss(0.0, 1.0))
                if rng.random() < 0.01 * step:
                    tpa *= 0.3  # a data-loader or collective stall
                tpa = min(1.0, max(0.0, tpa))
                mhz = self._next_clock(track, nominal, max_mhz)
            phase = track.timeline.kind(mid) if track.timeline is not None else TRAIN
            extra = (0.0, 0.0, 0.0, 0.0)
            if phase != TRAIN:  # the same draws as a training step, then what the phase shows instead
                tpa, extra = _PHASE_ACTIVITY[phase]
                pace_of = 0.0
                nominal = 0.05 if phase != DOWN else 0.0  # spinning or loading kernels hold a boost clock, lightly
                if phase == DOWN:
                    mhz = idle_mhz
            for column, value in zip(track.cum_extra, extra, strict=True):
                column.append(column[-1] + value)
            mhz, watts, power_held, thermal_held = self._limits(track, mid, 0.0 if idle else nominal, mhz, boost_held)
            ofu = tpa * min(mhz / tensor_mhz, 1.0)
            track.cum_joules.append(track.cum_joules[-1] + watts)
            track.cum_power_held.append(track.cum_power_held[-1] + power_held)
            track.cum_thermal_held.append(track.cum_thermal_held[-1] + thermal_held)
            track.cum_tpa.append(track.cum_tpa[-1] + tpa)
            track.cum_pace.append(track.cum_pace[-1] + (min(1.0, tpa / pace_of) if pace_of > 0 else 0.0))
            track.cum_mhz.append(track.cum_mhz[-1] + mhz)
            track.cum_tpa_mhz.append(track.cum_tpa_mhz[-1] + tpa * mhz)
            track.cum_ofu.append(track.cum_ofu[-1] + ofu)
            if track.outage is not None:
                track.outage.append(self._next_outage(track))

    def _next_clock(self, track: _Track, load: float, max_mhz: float) -> float:
        rng, step = track.rng, self.step_s
        if track.throttle_left > 0:
            track.throttle_left -= 1
            return min(max_mhz, _quantize(track.throttle_mhz + rng.gauss(0.0, 20.0), max_mhz))
        if rng.random() < _THROTTLE_RATE_PER_S * step * min(1.0, load / 0.45):
            track.throttle_left = max(1, round(rng.uniform(*_THROTTLE_DURATION_S) / step))
            track.throttle_mhz = max_mhz * rng.uniform(*_THROTTLE_RANGE)
        droop = 40.0 * load + abs(rng.gauss(0.0, 20.0))
        return _quantize(max_mhz - droop, max_mhz)

    def _limits(
        self, track: _Track, t_s: float, load: float, mhz: float, boost_held: bool
    ) -> tuple[float, float, float, float]:
        """The step's clock after the GPU's power and thermal limits, its power (W), and whether power
        or temperature held the clock down (1.0 or 0.0). No random draws: series stay the same per seed."""
        max_mhz = track.gpu.max_clock_mhz
        idle_w = _POWER_LIMIT_W * _IDLE_POWER_FRACTION
        activity = min(1.0, 0.3 + 1.2 * load) if load > 0 else 0.0

        def power(clock_mhz: float) -> float:
            return idle_w + (_POWER_LIMIT_W - idle_w) * activity * (clock_mhz / max_mhz) ** 3

        # The boost clock's own throttle stretches (see _next_clock) are the board's power limit at work.
        power_held = 1.0 if boost_held and activity > 0 else 0.0
        thermal_held = 0.0
        fault = track.gpu.fault
        if (
            fault == GpuFault.THERMAL
            and activity > 0
            and t_s >= track.gpu.fault_from_s
            and t_s % _THERMAL_PERIOD_S >= _THERMAL_PERIOD_S / 2
        ):
            hot = _quantize(max_mhz * _THERMAL_CLOCK_FRACTION, max_mhz)
            if hot < mhz:
                mhz, thermal_held = hot, 1.0
        if fault == GpuFault.POWER_CAP and activity > 0 and t_s >= track.gpu.fault_from_s:
            cap_w = track.gpu.power_cap_w or _POWER_LIMIT_W * _POWER_CAP_FRACTION
            if power(mhz) > cap_w:
                allowed = max_mhz * ((cap_w - idle_w) / ((_POWER_LIMIT_W - idle_w) * activity)) ** (1.0 / 3.0)
                mhz = max(_CLOCK_BIN_MHZ, _CLOCK_BIN_MHZ * math.floor(allowed / _CLOCK_BIN_MHZ))
                power_held = 1.0
        return mhz, power(mhz), power_held, thermal_held

    def _next_outage(self, track: _Track) -> int:
        rng, step = track.rng, self.step_s
        if track.outage_left > 0:
            track.outage_left -= 1
            return track.outage_code
        if rng.random() < _OUTAGE_RATE_PER_S * step:
            track.outage_left = max(1, round(rng.uniform(*_OUTAGE_DURATION_S) / step)) - 1
            track.outage_code = 1 + rng.randrange(len(_OUTAGE_REASONS))
            return track.outage_code
        return 0

    def _identity(self, track: _Track, precision: str) -> GpuIdentity:
        gpu, job = track.gpu, track.job
        hints = {
            names.JOB_ID: job.job_id,
            names.JOB_NAME: job.name,
            names.GPU_PRECISION: precision,
            names.JOB_SCHEDULER: SCHEDULER,
        }
        return GpuIdentity(uuid=gpu.uuid, model=gpu.model, index=gpu.index, host=gpu.host, hints=hints)

    def _read_gpu(self, track: _Track, start_ns: int, end_ns: int) -> GpuReading | GpuError:
        ta, tb = self.seconds(start_ns), self.seconds(end_ns)
        self._extend(track, tb)
        precision = track.job.dominant_precision(ta, tb)
        identity = self._identity(track, precision)
        if track.outage is not None:
            first, last = int(ta / self.step_s), max(int(ta / self.step_s) + 1, math.ceil(tb / self.step_s - 1e-9))
            code = max(track.outage[first:last], default=0)
            if code:
                reason = _OUTAGE_REASONS[code - 1]
                message = "GPU is lost" if reason == names.ErrorReason.GPU_LOST else "tensor activity is N/A"
                return GpuError(reason, f"{message} (simulated)", gpu=identity, gpu_key=track.gpu.key)
        span = tb - ta
        tpa = min(1.0, max(0.0, self._integral(track.cum_tpa, ta, tb) / span))
        mhz_seconds = self._integral(track.cum_mhz, ta, tb)
        sample = max(0, min(track.steps, math.ceil(tb / self.step_s - 1e-9)) - 1)
        point_mhz = track.cum_mhz[sample + 1] - track.cum_mhz[sample]
        clock_mhz = mhz_seconds / span if self.average_clock else point_mhz
        cycles = None
        if self.cycle_counters:
            elapsed = round(mhz_seconds * 1e6)
            active = min(elapsed, round(self._integral(track.cum_tpa_mhz, ta, tb) * 1e6))
            cycles = CycleCounters(sm_cycles_elapsed=elapsed, mma_cycles_active=active) if elapsed > 0 else None
        # As a board with an energy counter and violation counters: power over the interval, energy
        # since the fleet started, and the share of the interval each limit held the clock down.
        held = dict.fromkeys(names.ThrottleReason.ALL, 0.0)
        held[names.ThrottleReason.POWER] = min(1.0, self._integral(track.cum_power_held, ta, tb) / span)
        held[names.ThrottleReason.THERMAL] = min(1.0, self._integral(track.cum_thermal_held, ta, tb) / span)
        return GpuReading(
            gpu=identity,
            start_ns=start_ns,
            end_ns=end_ns,
            tensor_active=tpa,
            sm_clock_hz=clock_mhz * 1e6,
            max_sm_clock_hz=track.gpu.max_clock_mhz * 1e6 if self.report_max_clock else None,
            cycles=cycles,
            power_w=self._integral(track.cum_joules, ta, tb) / span,
            energy=EnergyCounter(self._cumulative(track.cum_joules, tb), self._start_ns),
            throttle=held,
            **self._activity(track, tpa, ta, tb),
            truth_ofu=min(1.0, max(0.0, self._integral(track.cum_ofu, ta, tb) / span)),
            truth_precision=precision,
        )

    def _activity(self, track: _Track, tpa: float, ta: float, tb: float) -> dict[str, Any]:
        """The interval's engine, SM and DRAM activity and occupancy, ordered T <= S <= E, and the link counters
        since the fleet started (GpuReading fields)."""
        profile = track.activity
        span = tb - ta
        pace = min(1.0, self._integral(track.cum_pace, ta, tb) / span)
        extra_engine, extra_sm, extra_occupancy, extra_dram = (
            self._integral(column, ta, tb) / span for column in track.cum_extra
        )
        sm = min(1.0, max(tpa, profile.sm_active * pace + extra_sm))
        engine = min(1.0, max(sm, profile.engine_active * pace + extra_engine))
        paced_s = self._cumulative(track.cum_pace, tb)  # seconds at the nominal pace since the fleet started
        transmit, receive = names.IoDirection.TRANSMIT, names.IoDirection.RECEIVE

        def counter(bytes_per_s: float) -> IoCounter:
            return IoCounter(bytes_per_s * paced_s, self._start_ns)

        # A GPU without traffic (an idle one, a job on one GPU) reads flat counters, as NVML and DCGM report a
        # measured 0 bytes/s: the counters are there, they just do not climb.
        nvlink = counter(profile.nvlink_bytes_per_s)
        links: dict[str, Any] = {
            "nvlink_io": {transmit: nvlink, receive: nvlink},  # collectives send what they receive
            "pcie_io": {
                transmit: counter(profile.pcie_tx_bytes_per_s),
                receive: counter(profile.pcie_rx_bytes_per_s),
            },
        }
        return {
            "sm_active": sm,
            "engine_active": engine,
            "sm_occupancy": min(1.0, profile.sm_occupancy * pace + extra_occupancy),
            "dram_active": min(1.0, profile.dram_active * pace + extra_dram),
            **links,
        }

    # --- ready-made fleets ------------------------------------------------------------------------

    @classmethod
    def demo(
        cls,
        seed: int = 7,
        clock: Clock | None = None,
        *,
        duration_s: float = 1800.0,
        cycle_counters: bool = False,
        average_clock: bool = False,
        report_max_clock: bool = True,
    ) -> SimulatedFleet:
        """The demo fleet: 5 hosts x 8 H100 SXM, eleven jobs, one flaky GPU.

        ``job-1001``/``job-1002`` healthy dense, ``job-1003`` MoE over-counting ~2x, ``job-1004`` regresses
        2.5x at 40% of ``duration_s``, ``job-1005`` switches bf16 <-> fp8 every 3 minutes, ``job-1006`` an
        allocated GPU that sits idle; GPU 6 of the third host (in ``job-1002``) is flaky, and GPU 3 of the
        first host (in the healthy ``job-1001``) is power-capped to ``DEMO_STRAGGLER_CAP_W``: a straggler.
        The fourth host runs three jobs that lose their OFU to three different causes (``Bottleneck``):
        ``job-1007`` is input-bound (its data loader stalls 40% of every step: the engine idles, TPA 0.29 where
        it would be 0.48), ``job-1008`` communication-bound (exposed tensor-parallel collectives: SMs 80% busy
        at TPA 0.20, NVLink at 330 GB/s each way, DRAM ~0.2), ``job-1009`` memory-bound (embedding lookups: SMs
        88% busy at TPA 0.16, DRAM 70% busy).
        The fifth host runs two jobs that report their progress (``job.step``, checkpoint time): ``job-1010`` hangs at
        half of ``duration_s`` (a collective that never completes: every GPU spins, nothing moves), ``job-1011``
        crashes at 42% of it, between two checkpoints, and is relaunched 90 s later from its last one (a 40 s load):
        the steps after that checkpoint are done again.
        """
        hosts = ("dgx-h100-01", "dgx-h100-02", "dgx-h100-03", "dgx-h100-04", "dgx-h100-05")
        max_mhz = _max_clock_mhz(H100_SXM_NAME, None)
        gpus: list[SimGpu] = []

        def place(job_id: str, host_index: int, first: int, count: int) -> tuple[str, ...]:
            placed = [
                SimGpu(
                    uuid=_gpu_uuid(seed, hosts[host_index], index),
                    host=hosts[host_index],
                    index=index,
                    model=H100_SXM_NAME,
                    max_clock_mhz=max_mhz,
                    job_id=job_id,
                    flaky=(host_index, index) == (2, 6),
                    fault=GpuFault.POWER_CAP if (host_index, index) == DEMO_STRAGGLER else None,
                    power_cap_w=DEMO_STRAGGLER_CAP_W if (host_index, index) == DEMO_STRAGGLER else None,
                )
                for index in range(first, first + count)
            ]
            gpus.extend(placed)
            return tuple(gpu.key for gpu in placed)

        dense, moe, regressing = ProfileKind.DENSE, ProfileKind.MOE, ProfileKind.REGRESSING
        jobs = [
            JobSpec(
                "job-1001",
                "llama3-70b-pretrain",
                dense,
                "bf16",
                place("job-1001", 0, 0, 8),
                tensor_active=0.48,
                mfu_efficiency=0.96,
            ),
            JobSpec(
                "job-1002",
                "mistral-7b-finetune",
                dense,
                "bf16",
                place("job-1002", 2, 4, 3),
                tensor_active=0.38,
                mfu_efficiency=0.95,
            ),
            JobSpec(
                "job-1003",
                "deepseek-moe-16b",
                moe,
                "bf16",
                place("job-1003", 1, 0, 4),
                tensor_active=0.26,
                miscount_factor=2.0,
                mfu_efficiency=0.97,
            ),
            JobSpec(
                "job-1004",
                "gpt-13b-sft",
                regressing,
                "bf16",
                place("job-1004", 1, 4, 4),
                tensor_active=0.44,
                regression_at_s=0.4 * duration_s,
                regression_factor=2.5,
                mfu_efficiency=0.95,
            ),
            JobSpec(
                "job-1005",
                "llama3-8b-mixed-fp8",
                ProfileKind.MIXED,
                "bf16",
                place("job-1005", 2, 0, 4),
                tensor_active=0.42,
                switch_every_s=180.0,
                alternate_precision="fp8",
                mfu_efficiency=0.97,
            ),
            JobSpec(
                "job-1006", "notebook-idle", ProfileKind.IDLE, "bf16", place("job-1006", 2, 7, 1), tensor_active=0.0
            ),
            JobSpec(
                "job-1007",
                "vit-h-video-pretrain",
                dense,
                "bf16",
                place("job-1007", 3, 0, 2),
                tensor_active=0.48 * _INPUT_RUN_SHARE,  # a healthy step's 0.48 for the 60% the engine runs
                mfu_efficiency=0.96,
                bottleneck=Bottleneck.INPUT,
            ),
            JobSpec(
                "job-1008",
                "gpt-30b-tp4-exposed-allreduce",
                dense,
                "bf16",
                place("job-1008", 3, 2, 4),
                tensor_active=0.20,
                mfu_efficiency=0.95,
                bottleneck=Bottleneck.COMMUNICATION,
            ),
            JobSpec(
                "job-1009",
                "dlrm-embedding-train",
                dense,
                "bf16",
                place("job-1009", 3, 6, 2),
                tensor_active=0.16,
                mfu_efficiency=0.95,
                bottleneck=Bottleneck.MEMORY,
            ),
            JobSpec(
                "job-1010",
                "gpt-7b-nccl-hang",
                dense,
                "bf16",
                place("job-1010", 4, 0, 4),
                tensor_active=0.42,
                mfu_efficiency=0.96,
                hang_at_s=0.5 * duration_s,
                training=TrainingPlan(step_s=4.0, startup_s=30.0, checkpoint_every=60, save_s=15.0),
            ),
            JobSpec(
                "job-1011",
                "llama3-8b-restarts",
                dense,
                "bf16",
                place("job-1011", 4, 4, 4),
                tensor_active=0.40,
                mfu_efficiency=0.96,
                training=TrainingPlan(
                    step_s=5.0,
                    startup_s=45.0,
                    checkpoint_every=48,
                    save_s=20.0,
                    crash_at_s=0.42 * duration_s,
                    down_s=90.0,
                    load_s=40.0,
                ),
            ),
        ]
        gpus.sort(key=lambda gpu: (gpu.host, gpu.index))
        return cls(
            gpus=tuple(gpus),
            jobs=tuple(jobs),
            seed=seed,
            clock=clock if clock is not None else ManualClock(),
            cycle_counters=cycle_counters,
            average_clock=average_clock,
            report_max_clock=report_max_clock,
            name="sim-demo",
        )

    @classmethod
    def random_fleet(
        cls,
        n_jobs: int,
        seed: int,
        miscount_share: float = 0.1,
        miscount_range: tuple[float, float] = (1.2, 3.0),
        regression_share: float = 0.1,
        regression_range: tuple[float, float] = (1.5, 3.0),
        *,
        clock: Clock | None = None,
        duration_s: float = 3600.0,
        regression_window: tuple[float, float] = (0.3, 0.6),
        recovery_share: float = 0.0,
        mixed_share: float = 0.1,
        idle_share: float = 0.0,
        flaky_share: float = 0.0,
        bottleneck_share: float = 0.0,
        hang_share: float = 0.0,
        hang_window: tuple[float, float] = (0.2, 0.6),
        gpus_per_job: Sequence[int] = (1, 2, 4),
        gpus_per_host: int = 8,
        model: str = H100_SXM_NAME,
        max_clock_mhz: float | None = None,
        step_s: float = 1.0,
        cycle_counters: bool = False,
        average_clock: bool = False,
    ) -> SimulatedFleet:
        """A fleet of ``n_jobs`` random jobs with injected FLOP miscounts and regressions.

        ``round(n_jobs x share)`` jobs of each kind, disjoint: miscounted jobs (kind ``moe``) draw their
        ``miscount_factor`` from ``miscount_range``; regressing jobs draw ``regression_factor`` from
        ``regression_range`` and regress at a time in ``regression_window`` x ``duration_s`` (a
        ``recovery_share`` of them recover halfway to the end). The rest are dense, mixed or idle.
        GPUs per job are drawn from ``gpus_per_job``; jobs are packed onto hosts of ``gpus_per_host``.
        ``round(n_jobs x bottleneck_share)`` of the dense jobs of two GPUs or more (as many as there are) get a
        ``Bottleneck``, the three in turn, drawn apart so that the other jobs are the same with or without them.
        ``round(n_jobs x hang_share)`` of the jobs that train (dense, MoE, regressing, mixed; with a bottleneck or
        not) hang at a time in ``hang_window`` x ``duration_s`` (``JobSpec.hang_at_s``), drawn apart likewise.
        """
        if n_jobs < 1:
            raise ValueError(f"n_jobs must be >= 1, got {n_jobs}")
        rng = random.Random(f"{seed}/random-fleet")
        order = list(range(n_jobs))
        rng.shuffle(order)
        counts = [round(n_jobs * share) for share in (miscount_share, regression_share, mixed_share, idle_share)]
        if sum(counts) > n_jobs:
            raise ValueError("the shares of miscounted, regressing, mixed and idle jobs add up to more than 1")
        kinds = [ProfileKind.DENSE] * n_jobs
        cursor = 0
        for kind, count in zip(
            (ProfileKind.MOE, ProfileKind.REGRESSING, ProfileKind.MIXED, ProfileKind.IDLE), counts, strict=True
        ):
            for position in order[cursor : cursor + count]:
                kinds[position] = kind
            cursor += count
        max_mhz = _max_clock_mhz(model, max_clock_mhz)
        placement = _Placement(seed, gpus_per_host)
        gpus: list[SimGpu] = []
        jobs: list[JobSpec] = []
        for number, kind in enumerate(kinds):
            job_id = f"job-{number:05d}"
            slots = placement.take(rng.choice(list(gpus_per_job)))
            placed = [
                SimGpu(
                    uuid=uid,
                    host=host,
                    index=index,
                    model=model,
                    max_clock_mhz=max_mhz,
                    job_id=job_id,
                    flaky=rng.random() < flaky_share,
                )
                for host, index, uid in slots
            ]
            gpus.extend(placed)
            jobs.append(
                _random_job(
                    rng,
                    job_id,
                    kind,
                    placed,
                    duration_s,
                    regression_window,
                    recovery_share,
                    miscount_range,
                    regression_range,
                )
            )
        if bottleneck_share > 0:
            jobs = _with_bottlenecks(jobs, round(n_jobs * bottleneck_share), random.Random(f"{seed}/bottlenecks"))
        if hang_share > 0:
            hangs = random.Random(f"{seed}/hangs")
            working = [job for job in jobs if job.kind != ProfileKind.IDLE]
            chosen = {job.job_id for job in hangs.sample(working, min(round(n_jobs * hang_share), len(working)))}
            jobs = [
                attrs.evolve(job, hang_at_s=duration_s * hangs.uniform(*hang_window)) if job.job_id in chosen else job
                for job in jobs
            ]
        return cls(
            gpus=tuple(gpus),
            jobs=tuple(jobs),
            seed=seed,
            clock=clock if clock is not None else ManualClock(),
            step_s=step_s,
            cycle_counters=cycle_counters,
            average_clock=average_clock,
            name="sim-random",
        )


@attrs.define
class _Placement:
    """Packs jobs onto hosts: a job that does not fit in the current host's free GPUs opens a new host."""

    seed: int
    gpus_per_host: int
    host_count: int = 0
    used: int = 0

    def _host(self) -> str:
        return f"sim-node-{self.host_count:04d}"

    def take(self, count: int) -> list[tuple[str, int, str]]:
        if count < 1:
            raise ValueError(f"a job needs at least one GPU, got {count}")
        if self.host_count == 0 or (self.used > 0 and self.used + count > self.gpus_per_host):
            self.host_count += 1
            self.used = 0
        slots: list[tuple[str, int, str]] = []
        for _ in range(count):
            if self.used == self.gpus_per_host:
                self.host_count += 1
                self.used = 0
            host = self._host()
            slots.append((host, self.used, _gpu_uuid(self.seed, host, self.used)))
            self.used += 1
        return slots


def _random_job(
    rng: random.Random,
    job_id: str,
    kind: str,
    gpus: Sequence[SimGpu],
    duration_s: float,
    regression_window: tuple[float, float],
    recovery_share: float,
    miscount_range: tuple[float, float],
    regression_range: tuple[float, float],
) -> JobSpec:
    keys = tuple(gpu.key for gpu in gpus)
    efficiency = rng.uniform(0.93, 0.99)
    name = f"{kind}-{job_id.removeprefix('job-')}"
    if kind == ProfileKind.MOE:
        return JobSpec(
            job_id,
            name,
            kind,
            "bf16",
            keys,
            miscount_factor=rng.uniform(*miscount_range),
            tensor_active=rng.uniform(0.15, 0.40),
            mfu_efficiency=efficiency,
        )
    if kind == ProfileKind.REGRESSING:
        at = duration_s * rng.uniform(*regression_window)
        recovery = at + (duration_s - at) / 2 if rng.random() < recovery_share else None
        return JobSpec(
            job_id,
            name,
            kind,
            "bf16",
            keys,
            regression_at_s=at,
            regression_factor=rng.uniform(*regression_range),
            recovery_at_s=recovery,
            tensor_active=rng.uniform(0.25, 0.60),
            mfu_efficiency=efficiency,
        )
    if kind == ProfileKind.MIXED:
        return JobSpec(
            job_id,
            name,
            kind,
            "bf16",
            keys,
            tensor_active=rng.uniform(0.25, 0.55),
            switch_every_s=rng.choice((120.0, 180.0, 300.0)),
            alternate_precision="fp8",
            mfu_efficiency=efficiency,
        )
    if kind == ProfileKind.IDLE:
        return JobSpec(job_id, name, kind, "bf16", keys, tensor_active=0.0)
    return JobSpec(
        job_id,
        name,
        kind,
        rng.choice(("bf16", "bf16", "bf16", "fp8")),
        keys,
        tensor_active=rng.uniform(0.20, 0.60),
        mfu_efficiency=efficiency,
    )


def _with_bottlenecks(jobs: list[JobSpec], count: int, rng: random.Random) -> list[JobSpec]:
    """``count`` dense jobs of two GPUs or more given a bottleneck each (input, communication, memory in turn), their
    TPA set to what that bottleneck leaves of it."""
    candidates = [job for job in jobs if job.kind == ProfileKind.DENSE and len(job.gpu_keys) > 1]
    chosen = rng.sample(candidates, min(count, len(candidates)))
    changed: dict[str, JobSpec] = {}
    for number, job in enumerate(chosen):
        bottleneck = Bottleneck.ALL[number % len(Bottleneck.ALL)]
        if bottleneck == Bottleneck.INPUT:
            tpa = job.tensor_active * _INPUT_RUN_SHARE
        elif bottleneck == Bottleneck.COMMUNICATION:
            tpa = rng.uniform(0.12, 0.25)
        else:
            tpa = rng.uniform(0.10, 0.22)
        changed[job.job_id] = attrs.evolve(job, bottleneck=bottleneck, tensor_active=tpa)
    return [changed.get(job.job_id, job) for job in jobs]
