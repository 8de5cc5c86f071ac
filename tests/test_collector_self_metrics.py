"""The collector's self-metrics: each part says what it counted (``SelfMetrics``), the service asks each in a list.

The counts below are worked by hand from what each case does to its part; the names are the vocabulary's
(``otel_ofu.names.COLLECTOR_SELF_METRICS``), and the service's whole mapping is checked against them in
test_collector_service.py, test_collector_limits.py and test_collector_write_ahead.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from otel_ofu import names
from otel_ofu_collector.outputs.recorder import ReportRecorder
from otel_ofu_collector.outputs.self_telemetry import SelfMetrics, gathered
from otel_ofu_collector.receivers.admission import Gate
from otel_ofu_collector.service import CollectorService
from otel_ofu_collector.storage.write_ahead import WriteAhead
from tests.collector_helpers import collector_options

DROPPED = names.COLLECTOR_DROPPED.name
ACCEPTED = names.COLLECTOR_POINTS_ACCEPTED.name
REFUSED = names.COLLECTOR_REQUESTS_REFUSED.name


@attrs.frozen
class Counted:
    """A part with fixed counts."""

    points: Mapping[str, Any]

    def self_metrics(self) -> Mapping[str, Any]:
        return self.points


def test_the_gate_counts_its_refusals() -> None:
    gate = Gate(max_in_flight=1)
    assert gate.enter() is None  # the one request it takes
    assert gate.enter() == "overload"
    assert gate.enter() == "overload"
    gate.close()
    assert gate.enter() == "shutdown"
    assert gate.self_metrics() == {REFUSED: {"overload": 2, "shutdown": 1}}


def test_parts_sharing_a_metric_add_up_by_attribute_value_in_the_vocabularys_order() -> None:
    parts: list[SelfMetrics] = [
        Counted({DROPPED: {"windows_overflow": 1}}),
        Counted({ACCEPTED: 5, DROPPED: {"records_failed": 2}}),
        Counted({DROPPED: {"records_failed": 3}}),  # a second recorder: 2 + 3 windows left out of the files
        Counted({ACCEPTED: 1}),  # the same count from two parts adds up: 5 + 1
    ]
    found = gathered(parts)
    assert found == {ACCEPTED: 6, DROPPED: {"windows_overflow": 1, "records_failed": 5}}
    assert list(found) == [ACCEPTED, DROPPED]  # accepted comes first in names.COLLECTOR_SELF_METRICS
    # A metric shown empty when no part has counted it (the drop counts without a downstream).
    assert gathered([], shown=(DROPPED,)) == {DROPPED: {}}


def test_a_recorder_says_the_windows_it_left_out(tmp_path: Path) -> None:
    recorder = ReportRecorder(tmp_path / "windows.jsonl")
    assert recorder.self_metrics() == {DROPPED: {"records_failed": 0}}
    recorder.unrecorded = 4  # as four windows of a refused batch would leave
    assert recorder.self_metrics() == {DROPPED: {"records_failed": 4}}


def test_the_write_ahead_says_what_it_could_not_write_or_replay(tmp_path: Path) -> None:
    ahead = WriteAhead(str(tmp_path / "spool.sqlite.accepted"))
    try:
        ahead.skipped["damaged"] += 2  # as a replay that met two damaged records counts them
        assert ahead.self_metrics() == {
            names.COLLECTOR_WRITE_AHEAD_UNWRITTEN.name: 0,
            names.COLLECTOR_WRITE_AHEAD_SKIPPED.name: {"damaged": 2, "failed": 0},
            names.COLLECTOR_FILES_DAMAGED.name: {"write_ahead_unreadable": 0, "write_ahead_wal": 0},
        }
    finally:
        ahead.close()


def test_the_service_asks_every_window_consumer_that_counts(tmp_path: Path) -> None:
    # Two records files: the windows each left out add up under one attribute value, 1 + 2.
    first, second = ReportRecorder(tmp_path / "a.jsonl"), ReportRecorder(tmp_path / "b.jsonl")
    first.unrecorded, second.unrecorded = 1, 2
    service = CollectorService(collector_options(None), consumers=[first, second], environ={})
    found = service.self_metrics()
    assert found[DROPPED] == {"records_failed": 3}
    assert found[names.COLLECTOR_EXPORT_QUEUED.name] == {}  # no downstream: shown, empty
    assert names.COLLECTOR_EXPORT_FAILURES.name not in found  # no sender to fail
    assert found[REFUSED] == {"overload": 0, "shutdown": 0}
