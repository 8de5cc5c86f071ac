"""``otel-ofu top`` against a feed that never ends, one that drips, and quitting while a read hangs: top's memory is
bounded by the read's byte bound, a dripping feed is said to be stuck, and stopping cuts the read in flight."""

from __future__ import annotations

import threading
import time
import tracemalloc
from collections.abc import Iterator

import pytest

from otel_ofu_collector.top.feeds import ReportFeedPoller, Update
from tests.test_exporter_scrapes import HostilePage


@pytest.fixture
def pages() -> Iterator[list[HostilePage]]:
    found: list[HostilePage] = []
    yield found
    for page in found:
        page.close()


def _page(pages: list[HostilePage], kind: str) -> str:
    page = HostilePage(kind)
    page.start()
    pages.append(page)
    return page.url.replace("/metrics", "")


def _poll(poller: ReportFeedPoller, bound_s: float = 60.0) -> Update:
    found: list[Update] = []
    thread = threading.Thread(target=lambda: found.append(poller.poll()), daemon=True)
    thread.start()
    thread.join(bound_s)
    assert not thread.is_alive(), f"one read of the feed took over {bound_s:g} s"
    return found[0]


def test_a_feed_that_never_ends_is_cut_at_the_byte_bound(pages: list[HostilePage]) -> None:
    poller = ReportFeedPoller(_page(pages, "endless"), timeout_s=60.0, max_bytes=16 * 2**20)
    tracemalloc.start()
    try:
        update = _poll(poller)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert update.problem
    assert update.status is not None
    assert update.status.startswith("feed unreachable: cannot read report feed ")
    assert f"answer larger than {16 * 2**20} bytes" in update.status
    assert peak < 3 * 16 * 2**20, f"{peak / 2**20:.0f} MiB"


def test_a_dripping_feed_is_said_to_be_stuck(pages: list[HostilePage]) -> None:
    url = _page(pages, "drip")
    poller = ReportFeedPoller(url, timeout_s=1.0)
    for _ in range(2):  # and again at the next read, for as long as it drips
        update = _poll(poller)
        assert update.problem
        assert update.status == f"feed stuck: report feed {url}/reports.jsonl sent no complete answer within 1 s"


def test_stopping_cuts_a_read_in_flight(pages: list[HostilePage]) -> None:
    """q sets the stop: the poller must not sit out its read of a dripping feed (60 s here) before it ends."""
    poller = ReportFeedPoller(_page(pages, "drip"), timeout_s=60.0, refresh_s=0.1)
    posted: list[Update] = []
    stop = threading.Event()
    thread = threading.Thread(target=poller.run, args=(posted.append, stop), daemon=True)
    thread.start()
    time.sleep(1.0)  # the read is dripping by now
    stop.set()
    thread.join(10.0)
    assert not thread.is_alive(), "the poller still reads the dripping feed after the stop"
    assert posted == []  # nothing posted to a screen that is gone
