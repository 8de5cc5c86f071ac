"""Jobs ranked by what their owner can act on, the one order of the text report, the HTML report and ``top``.

Pure: a fleet summary in, the jobs in rank order out, each with the tier that put it there. "Lost" against 100%
OFU is no order to act in: a healthy dense training on an H100 loses more than half its GPU time to what no
owner can change (44.8% OFU is excellent there), while an idle notebook loses all of its one GPU. So the order
is, first to last:

1. a flag: a hang (where the collector detects them), idle GPUs, a regression, a straggler GPU, a FLOP
   miscount (``FLAG_TIERS``), in that order; a flag of a detector this module does not know comes after them;
2. a named bottleneck (``causes.bottleneck_of``: input-bound, no kernel running; communication-bound;
   memory-bound; kernels too small to fill the SMs), all one tier: each is the owner's to fix;
3. the rest, by how far they are below what the same GPU model achieves in this fleet.

Within a tier, and in the last one, jobs go by the GPU-hours they are short of the best OFU any job on the same
GPU model reached in the record (``shortfall_s``: (best - OFU) x GPU time), most first, then by id. A job at the
best of its model is short by nothing: the healthy training comes last, where it belongs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import attrs

from otel_ofu_collector.report.causes import Kind, bottleneck_of
from otel_ofu_collector.report.reasons import flags_of
from otel_ofu_collector.report.summary import FleetSummary, JobSummary, hours


@attrs.frozen
class Tier:
    """One rank's tier: the short word the tables show and what it means, in words."""

    label: str
    meaning: str


# The flags, most urgent first, by the kind their detector gives them (a hang detector's "hang" when there is one).
# Each meaning fits one line of the 80-column report after its label.
FLAG_TIERS: Final = {
    "hang": Tier("hang", "kernels running with nothing moving: the job makes no progress"),
    "idle": Tier("idle", "GPUs allocated that do no tensor work: release them"),
    "regression": Tier("regression", "OFU fell below the job's own baseline: something changed"),
    "straggler": Tier("straggler", "one GPU holds the others back: fix or drain it"),
    "miscount": Tier("miscount", "the framework over-counts its FLOPs: its MFU is not utilization"),
}
BOTTLENECK_TIERS: Final = {
    Kind.HOST: Tier("input-bound", "no kernel running much of the time: the host side waits"),
    Kind.COMMUNICATION: Tier("comm-bound", "collectives the compute does not hide"),
    Kind.MEMORY: Tier("memory-bound", "SMs busy off the tensor pipes with DRAM busy"),
    Kind.SM_IDLE: Tier("small-kernels", "kernels too small to fill the SMs"),
}
BELOW: Final = Tier("below best", "short of the best OFU its GPU model reaches in this fleet")
AT_BEST: Final = Tier("ok", "at the best OFU its GPU model reaches in this fleet")
# A shortfall under this share of the job's own GPU time is rounding, not a gap to act on.
AT_BEST_SHARE: Final = 0.005


@attrs.frozen
class Ranked:
    """A job at its rank (1 first), the tier that put it there and its shortfall against its model's best."""

    rank: int
    job: JobSummary
    tier: Tier
    order: int  # the tier's place: flags first, then bottlenecks, then the rest
    shortfall_s: float  # GPU-seconds short of the best OFU of its GPU model in this record
    best_ofu: float | None  # that best; None where the job's OFU or model is unknown

    @property
    def label(self) -> str:
        """What the tables' flags column shows: the flags up over the run, else the bottleneck, else ok/no MFU."""
        kinds = [flag.kind for flag in flags_of(self.job)]
        if kinds:
            return "+".join(kinds)
        if self.tier in BOTTLENECK_TIERS.values():
            return self.tier.label
        return "no MFU" if self.job.mean_mfu is None else "ok"

    @property
    def why(self) -> str:
        """The rank in words: its tier's meaning, and the GPU-hours short of the model's best."""
        text = f"{self.tier.label}: {self.tier.meaning}"
        if self.shortfall_s > 0 and self.best_ofu is not None:
            text += f"; {hours(self.shortfall_s)} short of the best ({self.best_ofu:.1%}) on its GPU model"
        return text


def job_ofu(job: JobSummary) -> float | None:
    """The job's OFU over the record, weighted by GPU time where the windows carry it, else its mean OFU."""
    shares = job.loss.shares
    return shares["ofu"] if shares is not None else job.mean_ofu


def best_by_model(jobs: Sequence[JobSummary]) -> dict[str, float]:
    """The best OFU any job reached on each GPU model in the record."""
    best: dict[str, float] = {}
    for job in jobs:
        ofu = job_ofu(job)
        if ofu is not None and job.model:
            best[job.model] = max(best.get(job.model, ofu), ofu)
    return best


def _tier(job: JobSummary) -> tuple[int, Tier | None]:
    kinds = [flag.kind for flag in flags_of(job)]
    flag_order = list(FLAG_TIERS)
    known = [flag_order.index(kind) for kind in kinds if kind in FLAG_TIERS]
    if known:
        first = min(known)
        return first, FLAG_TIERS[flag_order[first]]
    if kinds:  # a detector this module does not know: a flag still, after the known ones
        return len(FLAG_TIERS), Tier(kinds[0], "flagged")
    found = bottleneck_of(job)
    if found is not None:
        return len(FLAG_TIERS) + 1, BOTTLENECK_TIERS[found.kind]
    return len(FLAG_TIERS) + 2, None


def rank(summary: FleetSummary) -> list[Ranked]:
    """Every job of the summary, most actionable first (the module's docstring has the order)."""
    best = best_by_model(summary.jobs)
    found: list[tuple[int, float, str, Tier, float | None, JobSummary]] = []
    for job in summary.jobs:
        order, tier = _tier(job)
        ofu = job_ofu(job)
        top = best.get(job.model) if job.model else None
        shortfall = max(0.0, top - ofu) * job.loss.gpu_time_s if top is not None and ofu is not None else 0.0
        if tier is None:
            at_best = top is None or ofu is None or shortfall <= AT_BEST_SHARE * job.loss.gpu_time_s
            tier = AT_BEST if at_best else BELOW
            order += 0 if not at_best else 1
        found.append((order, shortfall, job.job_id, tier, top, job))
    found.sort(key=lambda item: (item[0], -item[1], item[2]))
    return [
        Ranked(index, job, tier, order, shortfall, top)
        for index, (order, shortfall, _, tier, top, job) in enumerate(found, start=1)
    ]


def legend(ranked: Sequence[Ranked]) -> list[str]:
    """The rank order in words: a line per flag and bottleneck tier the jobs reached, in rank order, then the
    rule for the rest."""
    seen: dict[str, str] = {}
    for item in ranked:
        if item.tier not in (BELOW, AT_BEST):
            seen.setdefault(item.tier.label, item.tier.meaning)
    lines = [f"{label}: {meaning}" for label, meaning in seen.items()]
    lines.append("then the rest: GPU-hours short of the best OFU on the same GPU model here")
    return lines


RANK_RULE: Final = "Ranked by what an owner can act on, first to last:"
