"""A run's window reports condensed per job and per fleet: what each job reached and where its OFU was lost.

Pure: window reports in, a summary out; the demo's terminal report, the HTML report and ``top`` all read it, so
they say the same thing. Why a job's flags rose, in words, is ``reasons``'s.

- A job's OFU and MFU are means over its windows; MFU / OFU over the windows that have both.
- A regression's baseline is the median OFU of the job's unflagged windows before the first regression window;
  its level, the median OFU of the regression windows.
- Where OFU is lost (``RunLoss``, a job's ``loss``): GPU-hours lost by cause (idle, clock, tensor; tensor split
  into no_kernel, sm_idle and non_tensor where the GPUs report engine and SM activity) and their cost, per job
  and for the fleet, beside the job's DRAM activity and NVLink and PCIe throughput (what tells the causes of
  non_tensor apart).
"""

from __future__ import annotations

import datetime as dt
import statistics
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Final

import attrs

from otel_ofu import catalog, names
from otel_ofu_collector.detectors import (
    DETECTORS,
    GPU_DETECTORS,
    flops_miscount,
    hang,
    idle_gpus,
    regression,
    straggler,
)
from otel_ofu_collector.results import GpuFlagReport, GroupReport, JobLoss, JobReport, WindowReport, finite_or_none

MISCOUNT: Final = flops_miscount.DETECTOR.kind
REGRESSION: Final = regression.DETECTOR.kind
IDLE: Final = idle_gpus.DETECTOR.kind
STRAGGLER: Final = straggler.GPU_DETECTOR.kind
HANG: Final = hang.DETECTOR.kind
# Every flag, in the vocabulary's order: the job flags, then the GPU flags (shown on their job).
FLAG_KINDS: Final = tuple(d.kind for d in DETECTORS) + tuple(d.kind for d in GPU_DETECTORS)
C: Final = names.OfuLossCause
# Every cause, in the vocabulary's order: idle, clock, the finer split of the tensor pipes' loss (no_kernel,
# sm_idle, non_tensor, on GPUs that report engine and SM activity) and the coarse tensor (on those that do not).
CAUSES: Final = C.ALL
TENSOR_PARTS: Final = C.TENSOR_PARTS
# The three a reader compares across every job, whatever its source: the finer parts folded back into tensor.
COARSE_CAUSES: Final = (C.IDLE, C.CLOCK, C.TENSOR)
CAUSE_WORDS: Final = {
    C.IDLE: "idle GPUs",
    C.CLOCK: "clock held below max",
    C.NO_KERNEL: "no kernel running",
    C.SM_IDLE: "kernels running, SMs left empty",
    C.NON_TENSOR: "SMs busy off the tensor pipes",
    C.TENSOR: "tensor pipes not busy",
    C.UNMEASURED: "GPU time without OFU (tensor activity or clock unreadable)",
}
_H: Final = 3600.0
# A correlation over fewer jobs says next to nothing (three points fit almost any line): the reports show
# the fleet's r as a figure from this many jobs on, and say "not enough jobs" below it.
MIN_FLEET_R_JOBS: Final = 4


def model_name(model: str | None) -> str | None:
    """A GPU model's one name, in every report and on every screen: the catalog's (``NVIDIA H100 80GB HBM3`` ->
    ``H100-SXM``), else the device's name less its vendor; None where it is unknown."""
    if not model:
        return None
    spec = catalog.lookup(model)
    return spec.key if spec is not None else model.removeprefix("NVIDIA ").removeprefix("AMD ")


def format_time(time_ns: int) -> str:
    moment = dt.datetime.fromtimestamp(time_ns / 1e9, tz=dt.UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")


def count(value: float) -> str:
    """A count of GPU equivalents as a number: whole (within rounding: seven 1/7 MIG slices add up to
    0.9999999999999998) as "8", a MIG slice's share as "0.29"."""
    nearest = round(value)
    return str(nearest) if abs(value - nearest) < 1e-6 else f"{value:.2f}".rstrip("0").rstrip(".")


def plural(number: float, word: str) -> str:
    """``3 GPUs``, ``1 window``; a count of GPU equivalents that is not whole as ``0.29 GPUs`` (two MIG slices)."""
    return f"{count(number)} {word}{'' if number == 1 else 's'}"


def percent(value: float | None) -> str:
    """A fraction as a percentage, written one way in every table and sentence: one decimal; a value above
    zero too small for it reads "<0.1%" (an idle GPU's 0.0006% was measured, it is not a 0); none, "-"."""
    if value is None:
        return "-"
    if 0 < value < 0.0005:
        return "<0.1%"
    text = f"{value:.1%}"
    return "0.0%" if text == "-0.0%" else text


def hours_number(seconds: float) -> str:
    """GPU-seconds as a number of GPU-hours: two decimals, two significant digits under 0.1 (a short run)."""
    value = seconds / _H
    return f"{value:.2f}" if value >= 0.1 or value == 0 else f"{value:.2g}"


def hours(seconds: float) -> str:
    return f"{hours_number(seconds)} GPU-h"


def money_number(value: float) -> str:
    return f"{value:,.2f}"


def money(value: float, currency: str | None) -> str:
    return f"{money_number(value)} {currency or ''}".rstrip()


def _sum_causes(parts: Sequence[Mapping[str, float]]) -> dict[str, float]:
    return {cause: sum(part.get(cause, 0.0) for part in parts) for cause in CAUSES}


def coarse(shares: Mapping[str, float], unmeasured: bool = False) -> dict[str, float]:
    """Shares (or seconds) by the coarse three: the finer parts of the tensor pipes' loss summed into tensor; and the
    time without OFU beside them where ``unmeasured`` (a report with some shows it for every job)."""
    tensor = shares.get(C.TENSOR, 0.0) + sum(shares.get(part, 0.0) for part in TENSOR_PARTS)
    found = {C.IDLE: shares.get(C.IDLE, 0.0), C.CLOCK: shares.get(C.CLOCK, 0.0), C.TENSOR: tensor}
    if unmeasured:
        found[C.UNMEASURED] = shares.get(C.UNMEASURED, 0.0)
    return found


def _present(parts: Iterator[Mapping[str, float]]) -> tuple[str, ...]:
    """The causes some part names, in CAUSES order."""
    seen: set[str] = set()
    for part in parts:
        seen.update(part)
    return tuple(cause for cause in CAUSES if cause in seen)


def _mean(values: Sequence[float]) -> float | None:
    return statistics.fmean(values) if values else None


def ratio(numerator: float, denominator: float) -> float | None:
    return numerator / denominator if denominator > 0 else None


@attrs.frozen
class JobWindow:
    """One job in one window; non-finite values are absent."""

    start_ns: int
    end_ns: int
    ofu: float | None
    mfu: float | None
    correlation: float | None
    flags_up: frozenset[str]  # the kinds of the flags up in this window
    gpus: float  # GPU equivalents
    loss: JobLoss | None = None
    gpu_flags: tuple[GpuFlagReport, ...] = ()  # the job's GPUs flagged (value 1) in this window
    precision: str | None = None  # the job's gpu.precision in this window

    def flag_up(self, kind: str) -> bool:
        return kind in self.flags_up

    @property
    def miscount(self) -> bool:
        return MISCOUNT in self.flags_up

    @property
    def regression(self) -> bool:
        return REGRESSION in self.flags_up


@attrs.frozen
class RunLoss:
    """Where a job's OFU was lost over the run: its windows' ``JobLoss`` summed (GPU time, lost time and cost by
    cause, energy) or weighted by GPU time (the context: DRAM activity, NVLink and PCIe throughput). The names are
    ``JobLoss``'s, so ``job.loss.cost_lost`` reads the same for a run as ``window.loss.cost_lost`` for a window."""

    windows: tuple[JobLoss, ...]  # the loss of each of the job's windows that carries one, in time order

    @property
    def gpu_time_s(self) -> float:
        return sum(loss.gpu_time_s for loss in self.windows)

    @property
    def lost_s(self) -> dict[str, float]:
        return _sum_causes([loss.lost_s for loss in self.windows])

    @property
    def currency(self) -> str | None:
        return next((loss.currency for loss in self.windows if loss.currency), None)

    @property
    def cost(self) -> float | None:
        costs = [loss.cost for loss in self.windows if loss.cost is not None]
        return sum(costs) if costs else None

    @property
    def cost_lost(self) -> dict[str, float] | None:
        parts = [loss.cost_lost for loss in self.windows if loss.cost_lost is not None]
        return _sum_causes(parts) if parts else None

    @property
    def energy_j(self) -> float | None:
        parts = [loss.energy_j for loss in self.windows if loss.energy_j is not None]
        return sum(parts) if parts else None

    @property
    def causes(self) -> tuple[str, ...]:
        """The causes the job's windows split its loss into, in CAUSES order."""
        return _present(loss.lost_s for loss in self.windows)

    @property
    def shares(self) -> dict[str, float] | None:
        """OFU (under "ofu") and each cause (every one of CAUSES, 0 where the job has none of it) as shares of the
        run's GPU time (GPU-time weighted): they sum to 1. A window's ``JobLoss.shares`` has the causes only (its
        OFU is the window's). None: no GPU time."""
        total = self.gpu_time_s
        if total <= 0:
            return None
        lost = self.lost_s
        shares = {cause: lost[cause] / total for cause in CAUSES}
        return {"ofu": 1.0 - sum(shares.values()), **shares}

    def _context(self, field: Callable[[JobLoss], float | None]) -> float | None:
        """A context value's mean over the run, weighted by each window's GPU time, over the windows that have it."""
        pairs = [(value, loss.gpu_time_s) for loss in self.windows if (value := field(loss)) is not None]
        if not pairs:
            return None
        weight = sum(seconds for _, seconds in pairs)
        if weight <= 0:
            return statistics.fmean(value for value, _ in pairs)
        return sum(value * seconds for value, seconds in pairs) / weight

    @property
    def dram_active(self) -> float | None:
        """Mean DRAM activity of the job's GPUs over the run; None: none reported it."""
        return self._context(lambda loss: loss.dram_active)

    @property
    def nvlink_bytes_per_s(self) -> float | None:
        """Mean NVLink bytes per second per GPU, sent and received, over the run; None: none reported it."""
        return self._context(lambda loss: loss.nvlink_bytes_per_s)

    @property
    def pcie_bytes_per_s(self) -> float | None:
        """Mean PCIe bytes per second per GPU, sent and received, over the run; None: none reported it."""
        return self._context(lambda loss: loss.pcie_bytes_per_s)


@attrs.frozen
class JobSummary:
    """One job over the run: its windows in time order, its latest attributes, what it reached and which flags
    rose (why, in words: ``reasons``); ``loss``: where its OFU was lost over the run."""

    job_id: str
    attributes: Mapping[str, str]
    history: tuple[JobWindow, ...]
    # Made once from the history (the reports read it many times over); not compared: the history says it all.
    loss: RunLoss = attrs.field(init=False, repr=False, eq=False)

    @loss.default
    def _loss(self) -> RunLoss:
        return RunLoss(tuple(w.loss for w in self.history if w.loss is not None))

    @property
    def name(self) -> str:
        """The job's name, else its id."""
        return self.attributes.get(names.JOB_NAME) or self.job_id

    @property
    def model(self) -> str | None:
        return self.attributes.get(names.HW_MODEL)

    @property
    def precision(self) -> str | None:
        """Every precision the job ran in over the record, in the order first seen ("bf16+fp8" for a job that
        switches): one answer whichever window a reader looks at, as a producer shows it interval by interval."""
        seen = dict.fromkeys(w.precision for w in self.history if w.precision)
        return "+".join(seen) if seen else self.attributes.get(names.GPU_PRECISION)

    @property
    def windows(self) -> int:
        return len(self.history)

    @property
    def gpus(self) -> float:
        return max((w.gpus for w in self.history), default=0.0)

    @property
    def pairs(self) -> list[tuple[float, float]]:
        """(OFU, MFU) of the windows that have both."""
        return [(w.ofu, w.mfu) for w in self.history if w.ofu is not None and w.mfu is not None]

    @property
    def mean_ofu(self) -> float | None:
        """Mean OFU over the windows that also have MFU (so MFU/OFU compares like with like); for a job that
        never reported MFU, over every window with OFU."""
        pairs = self.pairs
        if pairs:
            return statistics.fmean(ofu for ofu, _ in pairs)
        return _mean([w.ofu for w in self.history if w.ofu is not None])

    @property
    def mean_mfu(self) -> float | None:
        """Mean reported MFU over the windows that also have OFU."""
        return _mean([mfu for _, mfu in self.pairs])

    @property
    def mfu_over_ofu(self) -> float | None:
        ofu, mfu = self.mean_ofu, self.mean_mfu
        return None if ofu is None or mfu is None else ratio(mfu, ofu)

    @property
    def correlation(self) -> float | None:
        """The collector's horizon correlation in the latest window that had one."""
        return next((w.correlation for w in reversed(self.history) if w.correlation is not None), None)

    def flagged_windows(self, kind: str) -> list[JobWindow]:
        return [w for w in self.history if w.flag_up(kind)]

    @property
    def miscount_windows(self) -> int:
        return len(self.flagged_windows(MISCOUNT))

    @property
    def regression_windows(self) -> int:
        return len(self.flagged_windows(REGRESSION))

    @property
    def flagged(self) -> bool:
        return any(w.flags_up for w in self.history)

    @property
    def miscount_ratio(self) -> float | None:
        """Mean MFU over mean OFU in the windows the miscount flag was up; the run's ratio when they lack a pair."""
        pairs = [(w.ofu, w.mfu) for w in self.flagged_windows(MISCOUNT) if w.ofu is not None and w.mfu is not None]
        found = ratio(sum(p[1] for p in pairs), sum(p[0] for p in pairs)) if pairs else None
        return found if found is not None else self.mfu_over_ofu

    @property
    def baseline_ofu(self) -> float | None:
        """Median OFU of the unflagged windows that ended before the first regression window began."""
        flagged = self.flagged_windows(REGRESSION)
        if not flagged:
            return None
        first = flagged[0].start_ns
        before = [w.ofu for w in self.history if w.end_ns <= first and not w.regression and w.ofu is not None]
        return statistics.median(before) if before else None

    @property
    def regressed_ofu(self) -> float | None:
        """Median OFU over the regression windows."""
        during = [w.ofu for w in self.flagged_windows(REGRESSION) if w.ofu is not None]
        return statistics.median(during) if during else None


@attrs.frozen
class FleetSummary:
    windows: int
    start_ns: int | None
    end_ns: int | None
    last_groups: tuple[GroupReport, ...]
    correlation: float | None  # the last window's fleet Pearson r over the horizon; non-finite values are absent
    mae: float | None
    jobs: tuple[JobSummary, ...]  # in order of job id
    fleet_jobs: int = 0  # jobs with an (OFU, MFU) pair behind the last window's correlation and MAE
    peak_gpus: float = 0.0  # the most GPUs (equivalents) any one window held
    last_width_ns: int | None = None
    lost_s: Mapping[str, float] = attrs.field(factory=dict)  # the fleet's lost GPU-seconds by cause, over the run
    cost_lost: Mapping[str, float] | None = None
    energy_j: float | None = None
    currency: str | None = None

    @property
    def causes(self) -> tuple[str, ...]:
        """The causes any job's loss was split into over the run, in CAUSES order."""
        present = {cause for job in self.jobs for cause in job.loss.causes}
        return tuple(cause for cause in CAUSES if cause in present)

    @property
    def lost_total_s(self) -> float:
        return sum(self.lost_s.values())

    @property
    def cost_lost_total(self) -> float | None:
        return sum(self.cost_lost.values()) if self.cost_lost is not None else None

    @property
    def gpus(self) -> float:
        return sum(group.gpus for group in self.last_groups)


def _job_windows(report: WindowReport) -> Iterator[tuple[JobReport, JobWindow]]:
    """Each job of one window with what the summary keeps of it (its flags up, its GPUs flagged)."""
    gpu_flags: dict[str, list[GpuFlagReport]] = {}
    for flag in report.gpu_flags:
        if flag.value:
            gpu_flags.setdefault(flag.job_id, []).append(flag)
    for job in report.jobs:
        job_gpu_flags = tuple(gpu_flags.get(job.job_id, ()))
        up = {d.kind for d in DETECTORS if job.flags.get(d.metric.name)}
        up |= {d.kind for d in GPU_DETECTORS if any(f.metric == d.metric.name for f in job_gpu_flags)}
        yield (
            job,
            JobWindow(
                report.start_ns,
                report.end_ns,
                finite_or_none(job.ofu),
                finite_or_none(job.mfu),
                finite_or_none(job.correlation),
                frozenset(up),
                job.gpus,
                job.loss,
                job_gpu_flags,
                job.attributes.get(names.GPU_PRECISION),
            ),
        )


def summarize(reports: Sequence[WindowReport]) -> FleetSummary:
    """Condense window reports (in any order) into per-job and fleet figures."""
    ordered = sorted(reports, key=lambda report: (report.end_ns, report.start_ns))
    history: dict[str, list[JobWindow]] = {}
    attributes: dict[str, Mapping[str, str]] = {}
    for report in ordered:
        for job, window in _job_windows(report):
            history.setdefault(job.job_id, []).append(window)
            if job.attributes:
                attributes[job.job_id] = job.attributes  # the latest that said anything
    jobs = tuple(JobSummary(job_id, attributes.get(job_id, {}), tuple(history[job_id])) for job_id in sorted(history))
    last = ordered[-1] if ordered else None
    fleet_costs = [r.fleet.loss.cost_lost for r in ordered if r.fleet.loss.cost_lost is not None]
    energies = [r.fleet.loss.energy_j for r in ordered if r.fleet.loss.energy_j is not None]
    return FleetSummary(
        windows=len(ordered),
        start_ns=min(r.start_ns for r in ordered) if ordered else None,
        end_ns=last.end_ns if last else None,
        last_groups=last.groups if last else (),
        correlation=finite_or_none(last.fleet.correlation) if last else None,
        mae=finite_or_none(last.fleet.mae) if last else None,
        jobs=jobs,
        fleet_jobs=last.fleet.jobs if last else 0,
        peak_gpus=max((sum(group.gpus for group in r.groups) for r in ordered), default=0.0),
        last_width_ns=last.end_ns - last.start_ns if last else None,
        lost_s=_sum_causes([r.fleet.loss.lost_s for r in ordered]),
        cost_lost=_sum_causes(fleet_costs) if fleet_costs else None,
        energy_j=sum(energies) if energies else None,
        currency=next((r.fleet.loss.currency for r in ordered if r.fleet.loss.currency), None),
    )
