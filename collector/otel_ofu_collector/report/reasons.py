"""Why a job was flagged, in words: the one place that says it, so the demo's terminal report, the HTML report and
``top`` say the same thing.

Pure: a job's summary in, its flags with their reasons out.

- A FLOP miscount is sized by MFU / OFU over the windows the flag was up (mean MFU over mean OFU there).
- A regression is measured against the job's own baseline: the median OFU of its unflagged windows before
  the first regression window, against the median OFU of the regression windows.
- Every flag says the GPU-hours (and, where prices were configured, the cost) it accounts for: a miscount the
  job's GPU time while it was up; a regression the GPU time its OFU fell short of its baseline
  ((baseline - OFU) x GPU-hours); idle GPUs their idle GPU-time; a straggler its shortfall against its job's
  median ((median - OFU) x its hours), priced at the job's mean price per GPU-hour.
- A flag with no sizing of its own (a detector added later) says when and for how long it was up.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import attrs

from otel_ofu import names
from otel_ofu_collector.detectors import detector_for
from otel_ofu_collector.report.summary import (
    FLAG_KINDS,
    HANG,
    IDLE,
    MISCOUNT,
    REGRESSION,
    STRAGGLER,
    FleetSummary,
    JobSummary,
    JobWindow,
    format_time,
    hours,
    money,
    percent,
    plural,
    ratio,
)
from otel_ofu_collector.results import GpuFlagReport

_H: Final = 3600.0
THROTTLE_WORDS: Final = {
    names.ThrottleReason.POWER: "its power cap",
    names.ThrottleReason.THERMAL: "heat (thermal slowdown)",
    names.ThrottleReason.HW_SLOWDOWN: "a hardware slowdown",
    names.ThrottleReason.SYNC_BOOST: "sync boost",
    names.ThrottleReason.APP_CLOCK: "application clocks",
    names.ThrottleReason.OTHER: "another limit",
}


@attrs.frozen
class Flag:
    """A flag a job raised during the record, said in words."""

    job: JobSummary
    kind: str  # one of FLAG_KINDS
    reason: str
    first_ns: int
    windows: int
    active: bool  # still up in the job's last window


def flags_of(job: JobSummary) -> list[Flag]:
    """The flags the job raised, a FLOP miscount first; empty for a job that never was flagged."""
    found = []
    last = job.history[-1] if job.history else None
    for kind in FLAG_KINDS:
        flagged = job.flagged_windows(kind)
        if flagged:
            active = last is not None and last.flag_up(kind)
            found.append(Flag(job, kind, reason(job, kind, flagged), flagged[0].start_ns, len(flagged), active))
    return found


def reasons_of(job: JobSummary) -> list[str]:
    """Why the job was flagged, in words; empty for a job that never was."""
    return [flag.reason for flag in flags_of(job)]


def fleet_flags(fleet: FleetSummary) -> list[Flag]:
    """Every flag of every job: FLOP miscounts first, then by when they rose and by job name."""
    every = (flag for job in fleet.jobs for flag in flags_of(job))
    return sorted(every, key=lambda f: (f.kind != MISCOUNT, f.first_ns, f.job.name))


def reason(job: JobSummary, kind: str, flagged: list[JobWindow]) -> str:
    """Why the job raised flag ``kind`` over the windows ``flagged`` (those it was up, in time order)."""
    if kind == MISCOUNT:
        return miscount_reason(job, flagged)
    if kind == REGRESSION:
        return regression_reason(job, flagged)
    if kind == IDLE:
        return idle_reason(flagged)
    if kind == STRAGGLER:
        return straggler_reason(job, flagged)
    if kind == HANG:
        return hang_reason(flagged)
    # A flag with no sizing of its own: when and for how long it was up.
    since = format_time(flagged[0].start_ns)
    return f"{detector_for(kind).label}: flag up for {plural(len(flagged), 'window')} (from {since})"


def miscount_reason(job: JobSummary, flagged: list[JobWindow]) -> str:
    found = job.miscount_ratio
    size = f"{found:.1f}x" if found is not None else "far above"
    seconds = sum(w.loss.gpu_time_s for w in flagged if w.loss is not None)
    sized = f", over {_sized(seconds, flagged)} of GPU time" if _has_loss(flagged) else ""
    return (
        f"suspected FLOP miscount: reported MFU {size} its OFU for {plural(len(flagged), 'window')} "
        f"(from {format_time(flagged[0].start_ns)}){sized}"
    )


def regression_reason(job: JobSummary, flagged: list[JobWindow]) -> str:
    when = format_time(flagged[0].start_ns)
    baseline, level = job.baseline_ofu, job.regressed_ofu
    if baseline is None or level is None:
        return f"regression: OFU fell below its own baseline from {when} (baseline not in this record)"
    factor = ratio(baseline, level)
    drop = f"fell {factor:.1f}x below its own baseline" if factor is not None else "fell to zero from its baseline"
    short = sum(
        max(0.0, baseline - w.ofu) * w.loss.gpu_time_s for w in flagged if w.ofu is not None and w.loss is not None
    )
    sized = f": {_sized(short, flagged)} lost against its baseline" if _has_loss(flagged) else ""
    return (
        f"regression: OFU {drop} from {when} ({percent(baseline)} -> {percent(level)}, "
        f"{plural(len(flagged), 'window')}){sized}"
    )


def idle_reason(flagged: list[JobWindow]) -> str:
    idle = sum(w.loss.lost_s.get(names.OfuLossCause.IDLE, 0.0) for w in flagged if w.loss is not None)
    most = max(w.gpus for w in flagged)
    return (
        f"idle allocation: {plural(most, 'GPU')} attributed with no tensor activity for "
        f"{plural(len(flagged), 'window')} (from {format_time(flagged[0].start_ns)}): "
        f"{_sized(idle, flagged)} idle"
    )


def hang_reason(flagged: list[JobWindow]) -> str:
    held = sum(w.loss.gpu_time_s for w in flagged if w.loss is not None)
    sized = f": {_sized(held, flagged)} held with nothing moving" if _has_loss(flagged) else ""
    return (
        f"hang: every one of its {plural(max(w.gpus for w in flagged), 'GPU')} ran kernels with nothing moving "
        f"(no tensor, memory or link traffic) for {plural(len(flagged), 'window')} "
        f"(from {format_time(flagged[0].start_ns)}){sized}"
    )


def straggler_reason(job: JobSummary, flagged: list[JobWindow]) -> str:
    parts = []
    for name in straggler_gpus(job):
        flags = [(w, f) for w in flagged for f in w.gpu_flags if _gpu_name(f) == name]
        if not flags:
            continue
        found = ratio(sum(f.ofu for _, f in flags), sum(f.job_median_ofu for _, f in flags))
        reasons = sorted(
            {f.attributes[names.GPU_THROTTLE_REASON] for _, f in flags if names.GPU_THROTTLE_REASON in f.attributes}
        )
        cause = f", clock held down by {' and '.join(THROTTLE_WORDS.get(r, r) for r in reasons)}" if reasons else ""
        short = sum(max(0.0, f.job_median_ofu - f.ofu) * (w.end_ns - w.start_ns) / 1e9 for w, f in flags)
        size = f"{found:.2f}x" if found is not None else "far below"
        parts.append(
            f"GPU {name} at {size} the median OFU of its job's other GPUs for {plural(len(flags), 'window')} "
            f"(from {format_time(flags[0][0].start_ns)}){cause}: {_sized(short, [w for w, _ in flags])} "
            f"short of its peers"
        )
    return "straggler: " + "; ".join(parts)


def straggler_gpus(job: JobSummary) -> list[str]:
    """The GPUs of the job flagged as stragglers, by hw.id (host.name/hw.id where known), in order."""
    seen: dict[str, None] = {}
    for w in job.history:
        for flag in w.gpu_flags:
            seen.setdefault(_gpu_name(flag), None)
    return list(seen)


def _sized(seconds: float, windows: Sequence[JobWindow]) -> str:
    """``X GPU-h`` and, where the windows were priced, its cost at their mean price per GPU-hour."""
    priced = [w.loss for w in windows if w.loss is not None and w.loss.cost is not None and w.loss.gpu_time_s]
    text = hours(seconds)
    if priced:
        price = sum(p.cost or 0.0 for p in priced) / sum(p.gpu_time_s for p in priced) * _H
        text += f", {money(seconds / _H * price, priced[0].currency)}"
    return text


def _has_loss(windows: Sequence[JobWindow]) -> bool:
    """Whether the windows carry loss figures (records written before the collector had them do not)."""
    return any(w.loss is not None for w in windows)


def _gpu_name(flag: GpuFlagReport) -> str:
    host = flag.attributes.get(names.HOST_NAME)
    gpu = flag.attributes.get(names.HW_ID, "?")
    return f"{host}/{gpu}" if host else gpu
