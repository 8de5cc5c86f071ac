"""Where ``otel-ofu top`` gets its data, each on a thread of its own that hands ``Update``s to the screen.

- ``ReportFeedPoller``: a running collector's report feed, read every ``refresh_s`` (only the windows that
  ended since the last read). When the feed cannot be read the update says why and the screen keeps what it
  has; the next read tries again.
- ``PipelineRunner``: the demo's pipeline (``loopback.LoopbackPipeline``) on the demo fleet, its clock moved an
  interval per step and ``speed`` times faster than real time, or on one node's own source on the wall clock.
  Each step hands over the windows it closed and the GPUs as the producer read them.

A source never raises into the screen: whatever goes wrong becomes an update's one-line ``status``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Final, Protocol

import attrs

from otel_ofu.bounded_http import Cancel
from otel_ofu.control_chars import escape_controls
from otel_ofu.gpu_samples import ComputedSnapshot
from otel_ofu_collector.demo.loopback import LoopbackPipeline
from otel_ofu_collector.outputs.feed_client import MAX_FEED_BYTES, FeedAccess, FeedError, feed_url, fetch_records
from otel_ofu_collector.results import WindowReport
from otel_ofu_collector.top.model import GpuRow, rows_of_snapshot

logger = logging.getLogger(__name__)

_CLOCK_FORMAT: Final = "%H:%M:%S"


def clock_time(time_ns: int) -> str:
    """A moment as local wall-clock time, as a terminal user reads it."""
    return time.strftime(_CLOCK_FORMAT, time.localtime(time_ns / 1e9))


@attrs.frozen
class Update:
    """What a source has for the screen: closed windows, the GPUs' latest readings, a status line.

    ``readings`` None: this source has none (a feed). ``status`` None: the last status stands.
    ``problem``: the status is a fault (the feed is unreachable), shown as one.
    """

    windows: tuple[WindowReport, ...] = ()
    readings: tuple[GpuRow, ...] | None = None
    status: str | None = None
    problem: bool = False


Post = Callable[[Update], None]


class Source(Protocol):
    """A source of updates, run on its own thread until ``stop`` is set."""

    @property
    def title(self) -> str: ...  # what the screen shows, in a few words

    def run(self, post: Post, stop: threading.Event) -> None: ...


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


@attrs.define
class ReportFeedPoller:
    """Polls a collector's report feed; the first read takes every window the feed holds.

    Each read is bounded (``feed_client.fetch_records``): a feed that drips or stalls is said to be stuck once its
    read's ``timeout_s`` has passed, one that never ends is cut at ``max_bytes``, and stopping (q) cuts a read in
    flight at once, so the screen never waits on the feed to quit."""

    url: str
    refresh_s: float = 2.0
    timeout_s: float = 5.0
    access: FeedAccess = attrs.field(factory=FeedAccess)
    clock: Callable[[], int] = time.time_ns
    max_bytes: int = MAX_FEED_BYTES
    _since_ns: int | None = attrs.field(init=False, default=None)
    _in_flight: Cancel = attrs.field(init=False, factory=Cancel)

    @property
    def title(self) -> str:
        return f"feed {feed_url(self.url)}"

    def poll(self) -> Update:
        """One read of the feed, as an update (a fault is a status, never an exception)."""
        cancel = self._in_flight
        if cancel.reason is not None:
            return Update(status="stopped", problem=True)
        try:
            records = fetch_records(
                self.url,
                self.timeout_s,
                since_ns=self._since_ns,
                access=self.access,
                max_bytes=self.max_bytes,
                cancel=cancel,
            )
        except FeedError as error:
            if cancel.timed_out:  # the read's own deadline cut it, not a quit: the next read starts afresh
                self._in_flight = Cancel()
            if error.stuck:
                return Update(status=f"feed stuck: {error}", problem=True)
            return Update(status=f"feed unreachable: {error}", problem=True)
        except Exception as error:  # whatever else: one line on the screen, the poller goes on
            logger.debug("report feed read failed", exc_info=True)
            return Update(status=f"feed unreadable: {_one_line(error)}", problem=True)
        if records.reports:
            self._since_ns = max(self._since_ns or 0, records.reports[-1].end_ns)
        status = f"{self.title} · read {clock_time(self.clock())}"
        if records.bad_lines:
            status += f" · skipped {records.bad_lines} unusable line(s): {records.first_error}"
        return Update(windows=records.reports, status=status)

    def run(self, post: Post, stop: threading.Event) -> None:
        watcher = threading.Thread(target=self._cut_on, args=(stop,), name="otel-ofu-top-quit", daemon=True)
        watcher.start()
        while not stop.is_set():
            update = self.poll()
            if not stop.is_set():
                post(update)
            stop.wait(self.refresh_s)

    def _cut_on(self, stop: threading.Event) -> None:
        """Quitting cuts the read in flight (a feed that drips must not hold the exit)."""
        stop.wait()
        self._in_flight.cancel("top is quitting")


@attrs.define
class PipelineRunner:
    """Steps a loopback pipeline: ``advance`` moves its clock across an interval (a simulated fleet's
    ``ManualClock``) or does nothing (the wall clock, which moves by itself); ``pause_s`` of real time
    between steps."""

    pipeline: LoopbackPipeline
    title: str
    pause_s: float
    advance: Callable[[], object] = lambda: None
    fleet_clock: Callable[[], int] | None = None  # a simulated fleet's own time, said in the status

    def _status(self, windows: int, computed: ComputedSnapshot) -> tuple[str, bool]:
        """The status line after a step, and whether it is a fault: nothing read at all is one; some GPUs
        that could not be read are said (how many, the first reason) beside the others."""
        status = self.title
        if self.fleet_clock is not None:
            status += f" · fleet time {clock_time(self.fleet_clock())}"
        errors = computed.errors
        if errors and not (computed.samples or computed.partial):
            return f"{status} · no GPU read: {errors[0].message}", True
        if errors:
            status += f" · {len(errors)} GPU error(s), the first: {errors[0].message}"
        if not windows:
            status += " · waiting for the first window to close"
        return status, False

    def run(self, post: Post, stop: threading.Event) -> None:
        try:
            self.pipeline.start()
        except Exception as error:
            post(Update(status=f"cannot start: {_one_line(error)}", problem=True))
            return
        closed = 0
        try:
            while not stop.wait(self.pause_s):
                self.advance()
                try:
                    step = self.pipeline.step()
                except Exception as error:  # this interval is lost; the next may go through
                    logger.debug("pipeline step failed", exc_info=True)
                    post(Update(status=f"{self.title} · a read failed: {_one_line(error)}", problem=True))
                    continue
                closed += len(step.windows)
                status, problem = self._status(closed, step.computed)
                post(Update(step.windows, rows_of_snapshot(step.computed), status, problem))
        finally:
            try:
                self.pipeline.stop()
            except Exception:
                logger.debug("stopping the pipeline failed", exc_info=True)


def start_thread(source: Source, post: Post, stop: threading.Event) -> threading.Thread:
    """Run ``source`` on a daemon thread (quitting never waits on a feed that hangs). Every update reaches the
    screen with the control characters of its text written out (``control_chars``): a job id a feed or a page
    gave cannot retitle, clear or otherwise drive the terminal."""

    def post_escaped(update: Update) -> None:
        post(escape_controls(update))

    thread = threading.Thread(target=source.run, args=(post_escaped, stop), name="otel-ofu-top-source", daemon=True)
    thread.start()
    return thread
