"""The detection study's miscount target: what a ratio of reported MFU to OFU can see of an over-count.

A healthy job's true MFU sits under its OFU (its MFU/OFU efficiency), so an over-count by a factor f shows
as MFU/OFU = f x efficiency. The study's target counts the miscounts whose MFU/OFU is at least the ratio,
and keeps those over-counted by the ratio or more but shown under it in a group of their own.
"""

from __future__ import annotations

from benchmarks.studies import detection
from otel_ofu.clock import ManualClock
from otel_ofu.sources.simulated import H100_SXM_NAME, JobSpec, ProfileKind, SimGpu, SimulatedFleet
from otel_ofu_collector.config import AggregatorConfig


def _job(job_id: str, factor: float, efficiency: float) -> JobSpec:
    kind = ProfileKind.MOE if factor != 1.0 else ProfileKind.DENSE
    return JobSpec(
        job_id,
        job_id,
        kind,
        "bf16",
        (f"GPU-{job_id}",),
        miscount_factor=factor,
        tensor_active=0.3,
        mfu_efficiency=efficiency,
    )


# A 1.55x over-count at efficiency 0.93 shows as MFU/OFU 1.44; a 1.6x one at 0.97 as 1.55.
UNDER = _job("under", 1.55, 0.93)
SEEN = _job("seen", 1.6, 0.97)
LOW = _job("low", 1.3, 0.99)
HEALTHY = _job("healthy", 1.0, 0.99)


def test_the_groups_follow_each_jobs_mfu_over_ofu_not_its_factor_alone() -> None:
    groups = detection.miscount_groups((UNDER, SEEN, LOW, HEALTHY), ratio=1.5)
    assert [j.job_id for j in groups.target] == ["seen"]
    assert [j.job_id for j in groups.under_ratio] == ["under"]
    assert [j.job_id for j in groups.below] == ["low"]
    # Every injected miscount is in exactly one group: none is dropped.
    every = [*groups.target, *groups.under_ratio, *groups.below]
    assert sorted(j.job_id for j in every) == ["low", "seen", "under"]


def test_at_the_default_ratio_the_flag_sees_mfu_over_ofu_and_never_flags_the_healthy_job() -> None:
    clock = ManualClock()
    jobs = (UNDER, SEEN, HEALTHY)
    gpus = tuple(
        SimGpu(
            uuid=job.gpu_keys[0], host="node-0", index=i, model=H100_SXM_NAME, max_clock_mhz=1980.0, job_id=job.job_id
        )
        for i, job in enumerate(jobs)
    )
    fleet = SimulatedFleet(gpus=gpus, jobs=jobs, seed=7, clock=clock)
    steps = detection.simulate(fleet, clock, 900.0)
    outcome = detection.evaluate(steps, AggregatorConfig(), fleet)
    # The over-count whose MFU is 1.55x its OFU is flagged; the 1.55x one shown at 1.44x is not, by the
    # flag's definition (MFU above 1.5 x OFU), and is what the study's under-the-ratio group reports.
    assert outcome.miscount == {"under": False, "seen": True, "healthy": False}
    assert not any(outcome.regression.values())
