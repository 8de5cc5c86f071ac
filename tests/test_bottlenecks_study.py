"""The bottlenecks study's pipeline on a small fleet: every injected bottleneck named as what it is, no job
without one (and not regressing) named, through the producer, OTLP and the collector as the demo runs them."""

from __future__ import annotations

from benchmarks.studies import bottlenecks
from otel_ofu_collector.report.summary import summarize


def test_a_small_fleet_names_each_injected_bottleneck_and_no_healthy_job() -> None:
    fleet, reports = bottlenecks.fleet_reports(20, seed=5, seconds=360.0)
    judged = bottlenecks.judge(fleet, summarize(reports).jobs)
    injected = [n for n in judged if n.group in bottlenecks.EXPECTED]
    # round(20 x 0.3) = 6 bottlenecks asked for; as many as the fleet has dense jobs of two GPUs or more.
    assert injected
    assert {n.group for n in injected} <= set(bottlenecks.EXPECTED)
    assert all(n.named == bottlenecks.EXPECTED[n.group] for n in injected), injected
    healthy = [n for n in judged if n.group == bottlenecks.HEALTHY]
    assert healthy
    assert [n for n in healthy if n.named is not None] == []
