"""A run's window reports condensed per job and per fleet, with each flag's reason in words.

Pure: window reports in, a summary out. The one place that says why a job is flagged: the demo's terminal
report and the HTML report both read it, so they say the same thing.

- A FLOP miscount is sized by MFU / OFU over the windows the flag was up (mean MFU over mean OFU there).
- A regression is measured against the job's own baseline: the median OFU of its unflagged windows before
  the first regression window, against the median OFU of the regression windows.
- Every flag says the GPU-hours (and, where prices were configured, the cost) it accounts for: a miscount the
  job's GPU time while it was up; a regression the GPU time its OFU fell short of its baseline
  ((baseline - OFU) x GPU-hours); idle GPUs their idle GPU-time; a straggler its shortfall against its job's
  median ((median - OFU) x its hours), priced at the job's mean price per GPU-hour.
- Where OFU is lost: GPU-hours lost by cause (idle, clock, tensor; tensor split into no_kernel, sm_idle and
  non_tensor where the GPUs report engine and SM activity) and their cost, per job and for the fleet, beside
  the job's DRAM activity and NVLink and PCIe throughput (what tells the causes of non_tensor apart).
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
    detector_for,
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


def _ratio(numerator: float, denominator: float) -> float | None:
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
class Flag:
    """A flag a job raised during the record, said in words."""

    job: JobSummary
    kind: str  # one of FLAG_KINDS
    reason: str
    first_ns: int
    windows: int
    active: bool  # still up in the job's last window


@attrs.frozen
class JobSummary:
    """One job over the run: its windows in time order, its latest attributes, its flags and why they rose."""

    job_id: str
    attributes: Mapping[str, str]
    history: tuple[JobWindow, ...]

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
        return None if ofu is None or mfu is None else _ratio(mfu, ofu)

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
        ratio = _ratio(sum(p[1] for p in pairs), sum(p[0] for p in pairs)) if pairs else None
        return ratio if ratio is not None else self.mfu_over_ofu

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

    def flags(self) -> list[Flag]:
        """The flags the job raised, a FLOP miscount first; empty for a job that never was flagged."""
        found = []
        last = self.history[-1] if self.history else None
        for kind in FLAG_KINDS:
            flagged = self.flagged_windows(kind)
            if flagged:
                reason = self._reason(kind, flagged)
                active = last is not None and last.flag_up(kind)
                found.append(Flag(self, kind, reason, flagged[0].start_ns, len(flagged), active))
        return found

    # --- where the job's OFU was lost, over the run ---

    @property
    def gpu_time_s(self) -> float:
        return sum(w.loss.gpu_time_s for w in self.history if w.loss is not None)

    @property
    def lost_s(self) -> dict[str, float]:
        return _sum_causes([w.loss.lost_s for w in self.history if w.loss is not None])

    @property
    def currency(self) -> str | None:
        return next((w.loss.currency for w in self.history if w.loss is not None and w.loss.currency), None)

    @property
    def cost(self) -> float | None:
        costs = [w.loss.cost for w in self.history if w.loss is not None and w.loss.cost is not None]
        return sum(costs) if costs else None

    @property
    def cost_lost(self) -> dict[str, float] | None:
        parts = [w.loss.cost_lost for w in self.history if w.loss is not None and w.loss.cost_lost is not None]
        return _sum_causes(parts) if parts else None

    @property
    def energy_j(self) -> float | None:
        parts = [w.loss.energy_j for w in self.history if w.loss is not None and w.loss.energy_j is not None]
        return sum(parts) if parts else None

    @property
    def causes(self) -> tuple[str, ...]:
        """The causes the job's windows split its loss into, in CAUSES order."""
        return _present(w.loss.lost_s for w in self.history if w.loss is not None)

    def loss_shares(self) -> dict[str, float] | None:
        """OFU and each cause (every one of CAUSES, 0 where the job has none of it) as shares of the run's GPU time
        (GPU-time weighted): they sum to 1."""
        total = self.gpu_time_s
        if total <= 0:
            return None
        lost = self.lost_s
        shares = {cause: lost[cause] / total for cause in CAUSES}
        return {"ofu": 1.0 - sum(shares.values()), **shares}

    def _context(self, field: Callable[[JobLoss], float | None]) -> float | None:
        """A context value's mean over the run, weighted by each window's GPU time, over the windows that have it."""
        pairs = [
            (value, w.loss.gpu_time_s)
            for w in self.history
            if w.loss is not None and (value := field(w.loss)) is not None
        ]
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

    def _sized(self, seconds: float, windows: Sequence[JobWindow]) -> str:
        """``X GPU-h`` and, where the windows were priced, its cost at their mean price per GPU-hour."""
        priced = [w.loss for w in windows if w.loss is not None and w.loss.cost is not None and w.loss.gpu_time_s]
        text = hours(seconds)
        if priced:
            price = sum(p.cost or 0.0 for p in priced) / sum(p.gpu_time_s for p in priced) * _H
            text += f", {money(seconds / _H * price, priced[0].currency)}"
        return text

    def straggler_gpus(self) -> list[str]:
        """The GPUs of the job flagged as stragglers, by hw.id (host.name/hw.id where known), in order."""
        seen: dict[str, None] = {}
        for w in self.history:
            for flag in w.gpu_flags:
                seen.setdefault(_gpu_name(flag), None)
        return list(seen)

    def reasons(self) -> list[str]:
        """Why the job was flagged, in words; empty for a job that never was."""
        return [flag.reason for flag in self.flags()]

    def _reason(self, kind: str, flagged: list[JobWindow]) -> str:
        if kind == MISCOUNT:
            return self._miscount_reason(flagged)
        if kind == REGRESSION:
            return self._regression_reason(flagged)
        if kind == IDLE:
            return self._idle_reason(flagged)
        if kind == STRAGGLER:
            return self._straggler_reason(flagged)
        if kind == HANG:
            return self._hang_reason(flagged)
        # A flag with no sizing of its own: when and for how long it was up.
        since = format_time(flagged[0].start_ns)
        return f"{detector_for(kind).label}: flag up for {plural(len(flagged), 'window')} (from {since})"

    def _miscount_reason(self, flagged: list[JobWindow]) -> str:
        ratio = self.miscount_ratio
        size = f"{ratio:.1f}x" if ratio is not None else "far above"
        seconds = sum(w.loss.gpu_time_s for w in flagged if w.loss is not None)
        sized = f", over {self._sized(seconds, flagged)} of GPU time" if _has_loss(flagged) else ""
        return (
            f"suspected FLOP miscount: reported MFU {size} its OFU for {plural(len(flagged), 'window')} "
            f"(from {format_time(flagged[0].start_ns)}){sized}"
        )

    def _regression_reason(self, flagged: list[JobWindow]) -> str:
        when = format_time(flagged[0].start_ns)
        baseline, level = self.baseline_ofu, self.regressed_ofu
        if baseline is None or level is None:
            return f"regression: OFU fell below its own baseline from {when} (baseline not in this record)"
        factor = _ratio(baseline, level)
        drop = f"fell {factor:.1f}x below its own baseline" if factor is not None else "fell to zero from its baseline"
        short = sum(
            max(0.0, baseline - w.ofu) * w.loss.gpu_time_s for w in flagged if w.ofu is not None and w.loss is not None
        )
        sized = f": {self._sized(short, flagged)} lost against its baseline" if _has_loss(flagged) else ""
        return (
            f"regression: OFU {drop} from {when} ({percent(baseline)} -> {percent(level)}, "
            f"{plural(len(flagged), 'window')}){sized}"
        )

    def _idle_reason(self, flagged: list[JobWindow]) -> str:
        idle = sum(w.loss.lost_s.get(names.OfuLossCause.IDLE, 0.0) for w in flagged if w.loss is not None)
        most = max(w.gpus for w in flagged)
        return (
            f"idle allocation: {plural(most, 'GPU')} attributed with no tensor activity for "
            f"{plural(len(flagged), 'window')} (from {format_time(flagged[0].start_ns)}): "
            f"{self._sized(idle, flagged)} idle"
        )

    def _hang_reason(self, flagged: list[JobWindow]) -> str:
        held = sum(w.loss.gpu_time_s for w in flagged if w.loss is not None)
        sized = f": {self._sized(held, flagged)} held with nothing moving" if _has_loss(flagged) else ""
        return (
            f"hang: every one of its {plural(max(w.gpus for w in flagged), 'GPU')} ran kernels with nothing moving "
            f"(no tensor, memory or link traffic) for {plural(len(flagged), 'window')} "
            f"(from {format_time(flagged[0].start_ns)}){sized}"
        )

    def _straggler_reason(self, flagged: list[JobWindow]) -> str:
        parts = []
        for name in self.straggler_gpus():
            flags = [(w, f) for w in flagged for f in w.gpu_flags if _gpu_name(f) == name]
            if not flags:
                continue
            ratio = _ratio(sum(f.ofu for _, f in flags), sum(f.job_median_ofu for _, f in flags))
            reasons = sorted(
                {f.attributes[names.GPU_THROTTLE_REASON] for _, f in flags if names.GPU_THROTTLE_REASON in f.attributes}
            )
            cause = f", clock held down by {' and '.join(THROTTLE_WORDS.get(r, r) for r in reasons)}" if reasons else ""
            short = sum(max(0.0, f.job_median_ofu - f.ofu) * (w.end_ns - w.start_ns) / 1e9 for w, f in flags)
            size = f"{ratio:.2f}x" if ratio is not None else "far below"
            parts.append(
                f"GPU {name} at {size} the median OFU of its job's other GPUs for {plural(len(flags), 'window')} "
                f"(from {format_time(flags[0][0].start_ns)}){cause}: {self._sized(short, [w for w, _ in flags])} "
                f"short of its peers"
            )
        return "straggler: " + "; ".join(parts)


THROTTLE_WORDS: Final = {
    names.ThrottleReason.POWER: "its power cap",
    names.ThrottleReason.THERMAL: "heat (thermal slowdown)",
    names.ThrottleReason.HW_SLOWDOWN: "a hardware slowdown",
    names.ThrottleReason.SYNC_BOOST: "sync boost",
    names.ThrottleReason.APP_CLOCK: "application clocks",
    names.ThrottleReason.OTHER: "another limit",
}


def _has_loss(windows: Sequence[JobWindow]) -> bool:
    """Whether the windows carry loss figures (records written before the collector had them do not)."""
    return any(w.loss is not None for w in windows)


def _gpu_name(flag: GpuFlagReport) -> str:
    host = flag.attributes.get(names.HOST_NAME)
    gpu = flag.attributes.get(names.HW_ID, "?")
    return f"{host}/{gpu}" if host else gpu


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
        present = {cause for job in self.jobs for cause in job.causes}
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

    def flags(self) -> list[Flag]:
        """Every flag of every job: FLOP miscounts first, then by when they rose and by job name."""
        every = (flag for job in self.jobs for flag in job.flags())
        return sorted(every, key=lambda f: (f.kind != MISCOUNT, f.first_ns, f.job.name))


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
