"""The hang study's pipeline on a small fleet: every injected hang flagged after its onset, no busy job (memory-,
communication-, input-bound or not) flagged, no hung job flagged idle, through the producer, OTLP and the collector as
the demo runs them."""

from __future__ import annotations

from benchmarks.studies import hang


def test_a_small_fleet_flags_each_injected_hang_and_no_busy_job() -> None:
    fleet, reports = hang.fleet_reports(20, seed=5, seconds=600.0)
    judged = hang.judge(fleet, reports, 600.0)
    hung = [j for j in judged if j.group == hang.HUNG]
    busy = [j for j in judged if j.group != hang.HUNG]
    assert len(hung) == round(20 * hang.HANG_SHARE)
    assert all(j.flagged and not j.early for j in hung), hung
    assert {j.group for j in busy} & {"memory", "communication", "input"}  # the busy kinds the hang must not read as
    assert [j for j in busy if j.flagged] == []
    assert [j for j in hung if j.flagged_idle] == []
    # The hang's GPU time booked as hang badput: all of it but (part of) the window it began in.
    for job in hung:
        assert 0.8 * job.hung_s <= job.hang_badput_s <= job.hung_s
