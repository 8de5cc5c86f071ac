"""What ``otel-ofu top`` shows, built from closed windows and the GPUs' latest readings. Pure: no terminal.

- The fleet line: GPUs and fleet OFU p50/p95 of the newest window, GPU-hours and cost lost over the last hour
  (the windows that ended within an hour of the newest), the fleet's goodput, the flags up in the newest window.
- A row per job of the newest window: its OFU with the OFU of its recent windows (the sparkline), MFU, where
  its GPU time went over the last hour by ``ofu.loss.cause`` (whatever causes the windows carry), lost
  GPU-hours and cost, the flags up (else the job's bottleneck). Ranked as the reports rank them
  (``report.ranking``, over the last hour: flags, then bottlenecks, then GPU-hours short of the best OFU of
  the same GPU model), with the reports' sentences saying why; the other sorts on a key.
- A job's GPUs: OFU, SM clock against the clock OFU is measured against (the tensor clock where the catalog
  knows it, else the board's max), power, the throttle reason that held the clock down longest, straggler.
  From the GPUs' latest readings where the screen has them (``--demo``, ``--source``), else from the
  window's per-GPU section and its GPU flags (a feed); a value nobody sent is None, shown as "-".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Final

import attrs

from otel_ofu import catalog, names
from otel_ofu.gpu_samples import ComputedSnapshot
from otel_ofu_collector.config import DEFAULT_HISTOGRAM_MAX_BUCKETS
from otel_ofu_collector.detectors import DETECTORS, GPU_DETECTORS
from otel_ofu_collector.detectors.straggler import throttle_reason
from otel_ofu_collector.report.causes import bottleneck_of
from otel_ofu_collector.report.goodput import JobGoodputRow, job_goodput_sentence
from otel_ofu_collector.report.ranking import BOTTLENECK_TIERS, Ranked, rank
from otel_ofu_collector.report.reasons import reasons_of
from otel_ofu_collector.report.summary import model_name, summarize
from otel_ofu_collector.results import GpuFlagReport, GpuReport, GroupReport, JobReport, WindowReport
from otel_ofu_collector.stats.exphist import ExpHistogram

HOUR_NS: Final = 3600 * 1_000_000_000
HISTORY: Final = 8  # windows in a job's sparkline
NO_JOB: Final = "-"  # the row of GPUs that no job claims (a node's own source without attribution)
_KIND_OF: Final[dict[str, str]] = {
    **{d.metric.name: d.kind for d in DETECTORS},
    **{d.metric.name: d.kind for d in GPU_DETECTORS},
}
_STRAGGLER: Final = names.GPU_STRAGGLER.name


class Sort:
    """The orders of the job table, in the order the sort key steps through them."""

    RANK = "to act on"  # the reports' rank (report.ranking): flags, bottlenecks, then short of the model's best
    LOST = "lost cost"  # most lost first: cost where priced, else lost GPU time
    OFU = "OFU"  # lowest first
    GPUS = "GPUs"  # most first
    JOB = "job"  # by id

    ALL = (RANK, LOST, OFU, GPUS, JOB)


@attrs.frozen
class FleetLine:
    gpus: float  # GPU equivalents: a MIG slice counts as its share of its GPU
    ofu_p50: float | None
    ofu_p95: float | None
    lost_gpu_s: float | None  # over the last hour; None: no window carried where OFU was lost
    cost_lost: float | None  # over the last hour; None: no price configured
    currency: str | None
    flags_up: int
    windows: int  # in the last hour
    last_end_ns: int | None
    goodput: float | None = None  # the fleet's over the horizon, as of the newest window; None: none carried


@attrs.frozen
class JobRow:
    job_id: str
    name: str | None
    gpus: float  # GPU equivalents
    ofu: float | None
    mfu: float | None
    history: tuple[float | None, ...]  # OFU of the job's last windows, oldest first (None: not in that window)
    shares: Mapping[str, float]  # each loss cause's share of the job's GPU time over the last hour
    lost_gpu_s: float
    cost_lost: float | None
    currency: str | None
    flags: tuple[str, ...]  # the kinds of the flags up in the newest window (miscount, straggler, ...)
    rank: int | None = None  # 1: the most to act on (report.ranking over the last hour); None: not ranked
    bottleneck: str | None = None  # the job's named bottleneck over the last hour (input-bound, ...), if any
    why: tuple[str, ...] = ()  # the reports' sentences: each flag's reason, the bottleneck, the rank
    model: str | None = None  # the GPU model's one name (the catalog's, e.g. H100-SXM)


@attrs.frozen
class GpuRow:
    job_id: str | None
    gpu: str  # host/index where known, else host/hw.id
    hw_id: str
    ofu: float | None
    sm_clock_hz: float | None
    reference_clock_hz: float | None  # what OFU divides the SM clock by: the tensor clock, else the board max
    power_w: float | None
    throttle_reason: str | None  # the reason that held the clock down longest (a quarter of the time or more)
    throttle_share: float | None
    straggler: int | None  # 1 flagged, 0 just cleared, None not flagged
    mig: str = ""  # gpu.mig.instance.id, where the GPU is a MIG instance


def ordered_causes(found: Iterable[str]) -> tuple[str, ...]:
    """The vocabulary's causes first, in its order, then any other a window carries, by name."""
    present = set(found)
    known = tuple(cause for cause in names.OfuLossCause.ALL if cause in present)
    return known + tuple(sorted(present - set(known)))


def reference_clock_hz(model: str | None, max_clock_hz: float | None) -> float | None:
    """The clock OFU measures the SM clock against: the model's tensor clock where known, else the board max."""
    spec = catalog.lookup(model) if model else None
    if spec is not None and spec.tensor_clock_hz:
        return spec.tensor_clock_hz
    return max_clock_hz


def fleet_quantiles(groups: Sequence[GroupReport]) -> tuple[float | None, float | None]:
    """Fleet OFU p50 and p95: a lone group's own; several groups' from their merged histograms."""
    if not groups:
        return None, None
    if len(groups) == 1:
        quantiles = groups[0].quantiles
        return quantiles.get(0.5), quantiles.get(0.95)
    merged = ExpHistogram()
    for group in groups:
        merged = merged.merge(group.histogram, max_buckets=DEFAULT_HISTOGRAM_MAX_BUCKETS)
    return merged.quantile(0.5), merged.quantile(0.95)


def _sum(parts: Iterable[Mapping[str, float]]) -> dict[str, float]:
    total: dict[str, float] = {}
    for part in parts:
        for cause, value in part.items():
            total[cause] = total.get(cause, 0.0) + value
    return total


def _flags_up(job: JobReport) -> list[str]:
    return [_KIND_OF.get(name, name) for name, verdict in job.flags.items() if verdict == 1]


def _gpu_label(attributes: Mapping[str, object]) -> str:
    host = str(attributes.get(names.HOST_NAME, ""))
    index = attributes.get(names.GPU_INDEX)
    where = str(index) if index is not None else str(attributes.get(names.HW_ID, "?"))
    mig = attributes.get(names.GPU_MIG_INSTANCE_ID)
    label = f"{host}/{where}" if host else where
    return f"{label}:{mig}" if mig is not None else label


def _gpu_key(attributes: Mapping[str, object]) -> tuple[str, str]:
    return str(attributes.get(names.HW_ID, "")), str(attributes.get(names.GPU_MIG_INSTANCE_ID, ""))


def _throttle(shares: Mapping[str, float]) -> tuple[str | None, float | None]:
    reason = throttle_reason(shares)
    return reason, shares[reason] if reason is not None else None


def rows_of_snapshot(computed: ComputedSnapshot) -> tuple[GpuRow, ...]:
    """The GPUs as the producer computed them in its latest read: those without OFU keep what they gave."""
    rows: list[GpuRow] = []
    for sample in computed.samples:
        values, attributes = sample.values, sample.attributes
        reason, share = _throttle(values.throttle)
        job = attributes.get(names.JOB_ID)
        rows.append(
            GpuRow(
                job_id=str(job) if job is not None else None,
                gpu=_gpu_label(attributes),
                hw_id=sample.gpu.uuid,
                ofu=values.ofu,
                sm_clock_hz=values.sm_clock_hz,
                reference_clock_hz=reference_clock_hz(sample.gpu.model, values.max_sm_clock_hz),
                power_w=values.power_w,
                throttle_reason=reason,
                throttle_share=share,
                straggler=None,
                mig=_gpu_key(attributes)[1],
            )
        )
    for partial in computed.partial:
        attributes, known = partial.attributes, partial.known
        job = attributes.get(names.JOB_ID)
        rows.append(
            GpuRow(
                job_id=str(job) if job is not None else None,
                gpu=_gpu_label(attributes),
                hw_id=partial.gpu.uuid,
                ofu=None,
                sm_clock_hz=known.get(names.GPU_CLOCK_SM.name),
                reference_clock_hz=reference_clock_hz(partial.gpu.model, known.get(names.GPU_CLOCK_SM_MAX.name)),
                power_w=known.get(names.GPU_POWER.name),
                throttle_reason=None,
                throttle_share=None,
                straggler=None,
                mig=_gpu_key(attributes)[1],
            )
        )
    return tuple(rows)


def _row_of_report(gpu: GpuReport) -> GpuRow:
    reason, share = _throttle(gpu.throttle)
    return GpuRow(
        job_id=gpu.job_id,
        gpu=_gpu_label(gpu.attributes),
        hw_id=gpu.attributes.get(names.HW_ID, "?"),
        ofu=gpu.ofu,
        sm_clock_hz=gpu.sm_clock_hz,
        reference_clock_hz=reference_clock_hz(gpu.attributes.get(names.HW_MODEL), gpu.sm_clock_max_hz),
        power_w=gpu.power_w,
        throttle_reason=reason,
        throttle_share=share,
        straggler=None,
        mig=_gpu_key(gpu.attributes)[1],
    )


def _row_of_flag(flag: GpuFlagReport) -> GpuRow:
    """A flagged GPU of a window without per-GPU values: what the flag itself carries."""
    return GpuRow(
        job_id=flag.job_id,
        gpu=_gpu_label(flag.attributes),
        hw_id=flag.attributes.get(names.HW_ID, "?"),
        ofu=flag.ofu,
        sm_clock_hz=None,
        reference_clock_hz=None,
        power_w=None,
        throttle_reason=flag.attributes.get(names.GPU_THROTTLE_REASON),
        throttle_share=None,
        straggler=flag.value,
        mig=_gpu_key(flag.attributes)[1],
    )


def with_flags(rows: Iterable[GpuRow], flags: Sequence[GpuFlagReport]) -> tuple[GpuRow, ...]:
    """The rows with the window's straggler verdicts; a flagged GPU no row holds gets a row of its own."""
    verdicts: dict[tuple[str | None, str, str], GpuFlagReport] = {
        (flag.job_id, *_gpu_key(flag.attributes)): flag for flag in flags if flag.metric == _STRAGGLER
    }
    result: list[GpuRow] = []
    for row in rows:
        flag = verdicts.pop((row.job_id, row.hw_id, row.mig), None)
        if flag is None:
            result.append(row)
            continue
        reason = row.throttle_reason or flag.attributes.get(names.GPU_THROTTLE_REASON)
        result.append(attrs.evolve(row, straggler=flag.value, throttle_reason=reason))
    result.extend(_row_of_flag(flag) for flag in verdicts.values())
    return tuple(result)


def gpu_rows_of_window(report: WindowReport) -> tuple[GpuRow, ...]:
    """A window's GPUs: its per-GPU section, with its GPU flags (the only GPUs a window without one names)."""
    return with_flags((_row_of_report(gpu) for gpu in report.gpus), report.gpu_flags)


@attrs.define
class FleetModel:
    """The windows of the last hour (and the last ``HISTORY``) and the GPUs' latest readings, if any.

    A window that comes again (a feed read twice) replaces its earlier copy.
    """

    _windows: dict[int, WindowReport] = attrs.field(factory=dict)  # by end time
    _jobs: dict[int, dict[str, JobReport]] = attrs.field(factory=dict)  # each window's jobs by id, by end time
    _readings: tuple[GpuRow, ...] | None = None  # None: the source gives windows only (a feed)
    # The job rows and causes as last built: built again only when data comes, not for each key or redraw.
    _rows: list[JobRow] | None = attrs.field(default=None, init=False)
    _causes: tuple[str, ...] | None = attrs.field(default=None, init=False)

    def add_windows(self, reports: Iterable[WindowReport]) -> bool:
        """Take closed windows; True when the model changed."""
        changed = False
        for report in reports:
            self._windows[report.end_ns] = report
            self._jobs[report.end_ns] = {job.job_id: job for job in report.jobs}
            changed = True
        if changed:
            ends = sorted(self._windows)
            newest = ends[-1]
            keep = set(ends[-HISTORY:]) | {end for end in ends if end > newest - HOUR_NS}
            self._windows = {end: self._windows[end] for end in ends if end in keep}
            self._jobs = {end: self._jobs[end] for end in ends if end in keep}
            self._rows = self._causes = None
        return changed

    def set_readings(self, rows: Sequence[GpuRow]) -> None:
        self._readings = tuple(rows)
        self._rows = None

    @property
    def has_gpu_values(self) -> bool:
        """Whether the GPUs' own values are known: readings, or a window with a per-GPU section."""
        newest = self.newest
        return self._readings is not None or (newest is not None and bool(newest.gpus))

    @property
    def windows(self) -> tuple[WindowReport, ...]:
        return tuple(self._windows[end] for end in sorted(self._windows))

    @property
    def newest(self) -> WindowReport | None:
        return self._windows[max(self._windows)] if self._windows else None

    def _hour(self) -> list[WindowReport]:
        newest = self.newest
        if newest is None:
            return []
        return [report for report in self.windows if report.end_ns > newest.end_ns - HOUR_NS]

    def fleet(self) -> FleetLine:
        newest = self.newest
        hour = self._hour()
        losses = [report.fleet.loss for report in hour]
        lost = _sum(loss.lost_s for loss in losses)
        costs = [loss.cost_lost for loss in losses if loss.cost_lost is not None]
        currency = next((loss.currency for loss in losses if loss.currency), None)
        if newest is None:
            return FleetLine(0, None, None, None, None, None, 0, 0, None)
        p50, p95 = fleet_quantiles(newest.groups)
        flags_up = sum(len(_flags_up(job)) for job in newest.jobs)
        flags_up += sum(1 for flag in newest.gpu_flags if flag.value == 1)
        return FleetLine(
            gpus=sum(group.gpus for group in newest.groups),
            ofu_p50=p50,
            ofu_p95=p95,
            lost_gpu_s=sum(lost.values()) if lost else None,
            cost_lost=sum(sum(cost.values()) for cost in costs) if costs else None,
            currency=currency,
            flags_up=flags_up,
            windows=len(hour),
            last_end_ns=newest.end_ns,
            goodput=newest.fleet.goodput.goodput if newest.fleet.goodput is not None else None,
        )

    def causes(self) -> tuple[str, ...]:
        """Every loss cause the last hour's windows carry, in the vocabulary's order then by name."""
        if self._causes is None:
            self._causes = ordered_causes(
                cause for report in self._hour() for job in report.jobs if job.loss for cause in job.loss.shares
            )
        return self._causes

    def jobs(self, sort: str = Sort.RANK, text: str = "") -> list[JobRow]:
        """The newest window's jobs (and the GPUs no job claims), sorted, those matching ``text`` only."""
        if self._rows is None:
            self._rows = self._job_rows()
        rows = self._rows
        needle = text.strip().lower()
        if needle:
            rows = [row for row in rows if needle in _haystack(row)]
        return sort_jobs(rows, sort)

    def _job_rows(self) -> list[JobRow]:
        newest = self.newest
        rows: list[JobRow] = []
        if newest is not None:
            hour = self._hour()
            recent = self.windows[-HISTORY:]
            flagged: dict[str, list[str]] = {}
            for flag in newest.gpu_flags:
                if flag.value == 1:
                    kinds = flagged.setdefault(flag.job_id, [])
                    kind = _KIND_OF.get(flag.metric, flag.metric)
                    if kind not in kinds:
                        kinds.append(kind)
            ranked = {item.job.job_id: item for item in rank(summarize(hour))}
            rows = [
                self._job_row(job, hour, recent, flagged.get(job.job_id, ()), ranked.get(job.job_id))
                for job in newest.jobs
            ]
        unclaimed = [row for row in self._readings or () if row.job_id is None]
        if unclaimed:
            rows.append(_unclaimed_row(unclaimed))
        return rows

    def _job_row(
        self,
        job: JobReport,
        hour: Sequence[WindowReport],
        recent: Sequence[WindowReport],
        gpu_flags: Sequence[str],  # the kinds of the GPU flags up on the job's GPUs
        ranked: Ranked | None,
    ) -> JobRow:
        mine = [found for report in hour if (found := self._jobs[report.end_ns].get(job.job_id)) is not None]
        losses = [found.loss for found in mine if found.loss is not None]
        gpu_time = sum(loss.gpu_time_s for loss in losses)
        lost = _sum(loss.lost_s for loss in losses)
        costs = [loss.cost_lost for loss in losses if loss.cost_lost is not None]
        history = tuple(
            found.ofu if (found := self._jobs[report.end_ns].get(job.job_id)) else None for report in recent
        )
        flags = [*_flags_up(job), *gpu_flags]
        return JobRow(
            job_id=job.job_id,
            name=job.attributes.get(names.JOB_NAME),
            gpus=job.gpus,
            ofu=job.ofu,
            mfu=job.mfu,
            history=history,
            shares={cause: seconds / gpu_time for cause, seconds in lost.items()} if gpu_time > 0 else {},
            lost_gpu_s=sum(lost.values()),
            cost_lost=sum(sum(cost.values()) for cost in costs) if costs else None,
            currency=next((loss.currency for loss in losses if loss.currency), None),
            flags=tuple(flags),
            rank=ranked.rank if ranked is not None else None,
            bottleneck=ranked.tier.label if ranked is not None and ranked.tier in BOTTLENECK_TIERS.values() else None,
            why=_why(ranked) + _goodput_why(job),
            model=model_name(job.attributes.get(names.HW_MODEL)),
        )

    def gpus(self, job_id: str) -> tuple[GpuRow, ...]:
        """The job's GPUs, by where they sit (host, then index)."""
        newest = self.newest
        flags = newest.gpu_flags if newest is not None else ()
        if self._readings is not None:
            rows = with_flags(self._readings, flags)
        else:
            rows = gpu_rows_of_window(newest) if newest is not None else ()
        wanted = None if job_id == NO_JOB else job_id
        return tuple(sorted((row for row in rows if row.job_id == wanted), key=_where))


def _where(row: GpuRow) -> tuple[str, int, str, str]:
    """Host, then GPU index (a GPU known by UUID only after the indexed ones), then MIG instance."""
    host, _, rest = row.gpu.rpartition("/")
    index = rest.split(":", 1)[0]
    return (host, int(index) if index.isdigit() else 1 << 30, row.hw_id, row.mig)


def _unclaimed_row(rows: Sequence[GpuRow]) -> JobRow:
    """The GPUs no job claims, as one row: their mean OFU now (no window splits their loss by job)."""
    ofus = [row.ofu for row in rows if row.ofu is not None]
    return JobRow(
        job_id=NO_JOB,
        name="(no job)",
        gpus=len(rows),
        ofu=sum(ofus) / len(ofus) if ofus else None,
        mfu=None,
        history=(),
        shares={},
        lost_gpu_s=0.0,
        cost_lost=None,
        currency=None,
        flags=(),
    )


def _goodput_why(job: JobReport) -> tuple[str, ...]:
    """The job's goodput so far in a sentence (``report.goodput``), as of the newest window."""
    found = job.goodput
    if found is None:
        return ()
    gpu_time = job.loss.gpu_time_s if job.loss is not None else 0.0
    row = JobGoodputRow(job.job_id, None, gpu_time, found.badput_s, found.goodput, found.goodput_flops, found.basis)
    return (job_goodput_sentence(row),)


def _why(ranked: Ranked | None) -> tuple[str, ...]:
    """The reports' sentences for a job: why each flag rose, its bottleneck, and what its rank means."""
    if ranked is None:
        return ()
    job = ranked.job
    found = bottleneck_of(job)
    return (*reasons_of(job), *((found.sentence,) if found is not None else ()), f"rank {ranked.rank}: {ranked.why}")


def _haystack(row: JobRow) -> str:
    return " ".join((row.job_id, row.name or "", *row.flags, row.bottleneck or "")).lower()


def sort_jobs(rows: Iterable[JobRow], sort: str) -> list[JobRow]:
    """``rows`` in the order ``sort`` names (``Sort``); ties by job id."""
    by_id = sorted(rows, key=lambda row: row.job_id)
    if sort == Sort.RANK:
        return sorted(by_id, key=lambda row: (row.rank is None, row.rank or 0))
    if sort == Sort.LOST:
        return sorted(by_id, key=lambda row: (row.cost_lost or 0.0, row.lost_gpu_s), reverse=True)
    if sort == Sort.OFU:
        return sorted(by_id, key=lambda row: (row.ofu is None, row.ofu or 0.0))
    if sort == Sort.GPUS:
        return sorted(by_id, key=lambda row: row.gpus, reverse=True)
    if sort == Sort.JOB:
        return by_id
    raise ValueError(f"unknown sort {sort!r}; one of {', '.join(Sort.ALL)}")
