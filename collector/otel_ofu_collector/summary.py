"""A run's window reports condensed per job and per fleet, with each flag's reason in words.

Pure: window reports in, a summary out. The demo's terminal report and the HTML report read it.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

import attrs

from otel_ofu import names
from otel_ofu_collector.windows import GroupReport, JobReport, WindowReport


@attrs.frozen
class JobSummary:
    """One job over the run: means of its window values, its flags and why they rose."""

    job_id: str
    name: str | None
    precision: str | None
    gpus: int
    windows: int
    mean_ofu: float | None
    mean_mfu: float | None
    correlation: float | None  # the last window's Pearson r over the horizon
    miscount_windows: int
    regression_windows: int
    first_miscount_ns: int | None
    first_regression_ns: int | None
    baseline_ofu: float | None  # mean OFU before the first regression window
    regressed_ofu: float | None  # mean OFU over the regression windows

    @property
    def mfu_over_ofu(self) -> float | None:
        if self.mean_ofu is None or self.mean_mfu is None or self.mean_ofu <= 0.0:
            return None
        return self.mean_mfu / self.mean_ofu

    @property
    def flagged(self) -> bool:
        return self.miscount_windows > 0 or self.regression_windows > 0

    def reasons(self) -> list[str]:
        """Why the job was flagged, in words; empty for a job that never was."""
        found = []
        ratio = self.mfu_over_ofu
        if self.miscount_windows:
            found.append(
                "suspected FLOP miscount: reported MFU "
                + (f"{ratio:.1f}x its OFU" if ratio is not None else "far above its OFU")
                + f" (flagged in {self.miscount_windows} of {self.windows} windows)"
            )
        if self.regression_windows:
            drop = (
                self.baseline_ofu / self.regressed_ofu if self.baseline_ofu is not None and self.regressed_ofu else None
            )
            found.append(
                "regression: OFU fell "
                + (f"{drop:.1f}x below its own baseline" if drop is not None else "below its own baseline")
                + f" (flagged in {self.regression_windows} of {self.windows} windows)"
            )
        return found


@attrs.frozen
class FleetSummary:
    windows: int
    start_ns: int | None
    end_ns: int | None
    last_groups: tuple[GroupReport, ...]
    correlation: float | None  # the last window's fleet Pearson r over the horizon
    mae: float | None
    jobs: tuple[JobSummary, ...]

    @property
    def gpus(self) -> int:
        return sum(group.gpus for group in self.last_groups)


def _mean(values: Sequence[float]) -> float | None:
    return statistics.fmean(values) if values else None


def _summarize_job(job_id: str, entries: list[tuple[int, JobReport]]) -> JobSummary:
    ofus = [job.ofu for _, job in entries if job.ofu is not None]
    mfus = [job.mfu for _, job in entries if job.mfu is not None]
    miscount = [start for start, job in entries if job.flops_miscount]
    regression = [start for start, job in entries if job.regression]
    first_regression = regression[0] if regression else None
    before = [
        job.ofu
        for start, job in entries
        if job.ofu is not None and first_regression is not None and start < first_regression
    ]
    during = [job.ofu for _, job in entries if job.ofu is not None and job.regression]
    last = entries[-1][1]
    return JobSummary(
        job_id=job_id,
        name=last.attributes.get(names.JOB_NAME),
        precision=last.attributes.get(names.GPU_PRECISION),
        gpus=max(job.gpus for _, job in entries),
        windows=len(entries),
        mean_ofu=_mean(ofus),
        mean_mfu=_mean(mfus),
        correlation=last.correlation,
        miscount_windows=len(miscount),
        regression_windows=len(regression),
        first_miscount_ns=miscount[0] if miscount else None,
        first_regression_ns=first_regression,
        baseline_ofu=_mean(before),
        regressed_ofu=_mean(during),
    )


def summarize(reports: Sequence[WindowReport]) -> FleetSummary:
    """Condense window reports (in any order) into per-job and fleet figures."""
    ordered = sorted(reports, key=lambda report: report.start_ns)
    by_job: dict[str, list[tuple[int, JobReport]]] = {}
    for report in ordered:
        for job in report.jobs:
            by_job.setdefault(job.job_id, []).append((report.start_ns, job))
    jobs = [_summarize_job(job_id, entries) for job_id, entries in by_job.items()]
    last_report = ordered[-1] if ordered else None
    return FleetSummary(
        windows=len(ordered),
        start_ns=ordered[0].start_ns if ordered else None,
        end_ns=ordered[-1].end_ns if ordered else None,
        last_groups=last_report.groups if last_report else (),
        correlation=last_report.fleet.correlation if last_report else None,
        mae=last_report.fleet.mae if last_report else None,
        jobs=tuple(sorted(jobs, key=lambda job: job.job_id)),
    )
