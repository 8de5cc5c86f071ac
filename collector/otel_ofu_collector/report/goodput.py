"""Where each job's allocated GPU time went over a record: goodput and badput by cause, for the reports and ``top``.

From the windows' own figures (``JobReport.goodput``, ``FleetReport.goodput``): a job's badput by
``names.GoodputCause`` summed over its windows (each booked once, in the window that learnt it), its goodput and the
FLOP view beside it as of its last window (over the job so far), and the basis they stand on; the fleet's badput over
the record and its goodput over the horizon as of the last window. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

import attrs

from otel_ofu import names
from otel_ofu_collector.report.summary import hours, percent
from otel_ofu_collector.results import WindowReport

CAUSES: Final = names.GoodputCause.ALL


@attrs.frozen
class JobGoodputRow:
    job_id: str
    name: str | None
    gpu_time_s: float  # allocated GPU-seconds over the record
    badput_s: Mapping[str, float]  # by cause, over the record
    goodput: float  # over the job so far, as of its last window
    goodput_flops: float
    basis: str

    @property
    def badput_total_s(self) -> float:
        return sum(self.badput_s.values())


@attrs.frozen
class GoodputSummary:
    jobs: tuple[JobGoodputRow, ...]  # least goodput first
    badput_s: Mapping[str, float]  # the fleet's, by cause, over the record
    goodput: float | None  # the fleet's over the horizon, as of the last window
    basis: str | None

    @property
    def causes(self) -> tuple[str, ...]:
        """The causes any job booked time under, in the vocabulary's order."""
        return tuple(cause for cause in CAUSES if any(row.badput_s.get(cause) for row in self.jobs))


def goodput_summary(reports: Sequence[WindowReport]) -> GoodputSummary:
    """The record's goodput, per job and for the fleet (windows in any order)."""
    ordered = sorted(reports, key=lambda report: (report.end_ns, report.start_ns))
    rows: dict[str, JobGoodputRow] = {}
    for report in ordered:
        for job in report.jobs:
            found = job.goodput
            if found is None:
                continue
            before = rows.get(job.job_id)
            badput = dict(before.badput_s) if before is not None else {}
            for cause, seconds in found.badput_s.items():
                badput[cause] = badput.get(cause, 0.0) + seconds
            gpu_time = job.loss.gpu_time_s if job.loss is not None else 0.0
            rows[job.job_id] = JobGoodputRow(
                job.job_id,
                job.attributes.get(names.JOB_NAME) or (before.name if before is not None else None),
                (before.gpu_time_s if before is not None else 0.0) + gpu_time,
                badput,
                found.goodput,
                found.goodput_flops,
                found.basis,
            )
    fleet: dict[str, float] = {}
    last = None
    for report in ordered:
        if report.fleet.goodput is not None:
            last = report.fleet.goodput
            for cause, seconds in last.badput_s.items():
                fleet[cause] = fleet.get(cause, 0.0) + seconds
    jobs = tuple(sorted(rows.values(), key=lambda row: (row.goodput, row.job_id)))
    return GoodputSummary(jobs, fleet, last.goodput if last else None, last.basis if last else None)


def goodput_line(summary: GoodputSummary) -> str | None:
    """The fleet's goodput in one sentence; None without any."""
    if summary.goodput is None:
        return None
    lost = sum(summary.badput_s.values())
    by_cause = ", ".join(f"{cause} {hours(summary.badput_s[cause])}" for cause in CAUSES if summary.badput_s.get(cause))
    detail = f" ({by_cause})" if by_cause else ""
    return (
        f"Fleet goodput {percent(summary.goodput)} of its GPU time over the horizon, on the {summary.basis} basis: "
        f"{hours(lost)} made no progress{detail}."
    )


def job_goodput_sentence(row: JobGoodputRow) -> str:
    """One job's goodput in a sentence (``top``'s job screen)."""
    lost = ", ".join(f"{cause} {hours(row.badput_s[cause])}" for cause in CAUSES if row.badput_s.get(cause))
    return (
        f"goodput {percent(row.goodput)} of its GPU time so far ({percent(row.goodput_flops)} in useful FLOPs), on "
        f"the {row.basis} basis" + (f"; no progress: {lost}" if lost else "")
    )
