"""Delivery of window outputs and pass-through to the downstream OTLP receiver: a queue drained by a sender.

Window outputs are encoded once (``otlp.encode.encode_request``) and from then on travel as serialized
ExportMetricsServiceRequest bytes, the same as pass-through data; otel-ofu's OTLP client
(``otel_ofu.otlp_client``, the producer's too) sends both.

A request larger than ``max_request_bytes`` is split on submit (``split.split_request``) into requests
that fit, so one huge window or foreign request can never be refused for its size and block the queue;
a single data point over the limit is dropped and counted. A failed send stays at the head of its
queue and is retried with exponential backoff and jitter (the client's ``Backoff``: the receiver's
RetryInfo / Retry-After when it sends one); new submissions do not cut a backoff short. A permanent refusal
(the OTLP spec's non-retryable codes) is dropped and counted; a failure only a change of settings cures (the
other protocol, TLS) is kept and retried, so the spool still holds the windows when the settings are fixed; a
full queue drops its oldest request and counts it. Points the downstream refuses of a request it takes
(``partial_success``) are counted (``rejected_points``) and said once per message by the client. Nothing is
dropped silently.
An error nobody foresaw (from the transport or the spool) is logged and retried the same way: the
sender thread outlives it, so the queue never silently stops draining. Failures are logged as the
retries back off: the 1st, 2nd, 4th, 8th... of a run of failures, and once when the downstream is back.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable

import attrs

from otel_ofu.otlp_client import Backoff, Transport
from otel_ofu_collector.outputs.queues import MemoryQueue, Queue
from otel_ofu_collector.outputs.split import DEFAULT_MAX_EXPORT_BYTES, split_request

logger = logging.getLogger(__name__)


@attrs.define
class DeliveryStats:
    sent: int = 0
    retries: int = 0
    dropped_overflow: int = 0  # pushed out of a full queue or spool
    dropped_rejected: int = 0  # refused permanently by the downstream
    dropped_oversized: int = 0  # data points that alone exceed the request size limit
    split: int = 0  # requests split to fit the request size limit
    failures: int = 0  # sends that failed, retryable or not
    rejected_points: int = 0  # data points the downstream refused of requests it took (partial_success)
    last_error: str = ""


@attrs.define
class DownstreamLog:
    """What the log says of one downstream, whichever of the streams sharing it (the window export, the
    pass-through, the self-metrics) finds it down: once when it fails, with the streams that retry it, at most
    once every ``remind_s`` while it stays down, and once when it answers again. Each stream's own attempts
    go to DEBUG."""

    where: str  # the endpoint, as the user gave it
    streams: tuple[str, ...] = ()
    remind_s: float = 300.0
    clock: Callable[[], float] = time.monotonic
    _down_since: float | None = None
    _said_at: float = 0.0
    _failures: int = 0
    _lock: threading.Lock = attrs.field(factory=threading.Lock)

    def failed(self, stream: str, error: str, backoff_s: float) -> None:
        with self._lock:
            now = self.clock()
            self._failures += 1
            first = self._down_since is None
            if first:
                self._down_since = now
            elif now - self._said_at < self.remind_s:
                logger.debug("%s: downstream %s failed (%s); retrying in %.1fs", stream, self.where, error, backoff_s)
                return
            self._said_at = now
            down_s, failures = now - (self._down_since or now), self._failures
        which = ", ".join(self.streams) or stream
        if first:
            logger.warning(
                "downstream %s failed (%s): %s queue and retry it with backoff, said again when it answers",
                self.where,
                error,
                which,
            )
        else:
            logger.warning(
                "downstream %s still failing after %d attempts over %.0f s (%s)", self.where, failures, down_s, error
            )

    def answered(self, stream: str) -> None:
        with self._lock:
            if self._down_since is None:
                return
            down_s, failures = self.clock() - self._down_since, self._failures
            self._down_since, self._failures = None, 0
        logger.info("downstream %s answers again (%s first) after %d failed attempts over %.0f s",
                    self.where, stream, failures, down_s)  # fmt: skip


@attrs.define
class Delivery:
    """One downstream stream of requests: a bounded queue, a sender thread, backoff between failures.

    Tests drive it without the thread: ``submit`` then ``pump`` (sends until empty or a failure).
    ``stop`` closes the transport only when the delivery owns it: one shared with another delivery (the
    service's export and pass-through) is closed by its owner once both have stopped.
    """

    transport: Transport
    queue: Queue = attrs.field(factory=MemoryQueue)
    name: str = "export"
    initial_backoff_s: float = 0.5
    max_backoff_s: float = 30.0
    jitter: Callable[[], float] = random.random  # each backoff's random factor, a draw in [0, 1)
    sleep: Callable[[float], object] | None = None  # None: wait on the wake-up event (interruptible)
    stats: DeliveryStats = attrs.field(factory=DeliveryStats)
    owns_transport: bool = True
    max_request_bytes: int = DEFAULT_MAX_EXPORT_BYTES
    # Shared with the other streams to the same downstream: the log says it once for all of them. None: this
    # stream says its own failures.
    downstream: DownstreamLog | None = None
    _backoff_s: float = 0.0
    _backoffs: int = 0  # backoffs in a row: the exponent of the next one
    _failing: int = 0  # consecutive failed sends (retryable ones), for the log's own backoff
    _wake: threading.Event = attrs.field(factory=threading.Event)
    _stopping: bool = False
    _thread: threading.Thread | None = None
    _lock: threading.Lock = attrs.field(factory=threading.Lock)  # held for a whole send and its remove
    _stats_lock: threading.Lock = attrs.field(factory=threading.Lock)
    _closed: bool = False

    def submit(self, payload: bytes) -> None:
        pieces, unfit = split_request(payload, self.max_request_bytes)
        dropped = 0
        for piece in pieces:
            dropped += self.queue.put(piece)
        # Every receiver thread submits pass-through: the counts need their own lock (``_lock`` is
        # held for whole sends, which would stall the receivers behind a slow downstream).
        if dropped or unfit or len(pieces) > 1:
            with self._stats_lock:
                self.stats.dropped_overflow += dropped
                self.stats.dropped_oversized += unfit
                self.stats.split += len(pieces) > 1
        if dropped:
            logger.warning("%s queue full: dropped %d oldest request(s)", self.name, dropped)
        if unfit:
            logger.error(
                "%s: dropped %d data point(s) that alone exceed the %d-byte request limit",
                self.name,
                unfit,
                self.max_request_bytes,
            )
        self._wake.set()

    def pump(self, wait_s: float = -1) -> bool:
        """Send queued requests in order until the queue is empty (True) or a retryable failure (False).

        ``wait_s``: how long to wait for a send the sender thread has in flight (-1: as long as it takes);
        False when that is not long enough."""
        if not self._lock.acquire(timeout=wait_s):
            return False
        try:
            if self._closed:  # the sender thread woke after stop closed the queue and transport
                return True
            return self._drain()
        except Exception as error:  # unforeseen (a closed channel, sqlite3.Error): retried, never fatal
            self.stats.last_error = f"{type(error).__name__}: {error}"
            self._back_off(None)
            logger.error(
                "%s: sending failed unexpectedly; retrying in %.1fs", self.name, self._backoff_s, exc_info=True
            )
            return False
        finally:
            self._lock.release()

    def _drain(self) -> bool:
        while True:
            head = self.queue.peek()
            if head is None:
                self._backoff_s, self._backoffs = 0.0, 0
                return True
            entry_id, payload = head
            outcome = self.transport.send(payload)
            if outcome.delivered:
                self.queue.remove(entry_id)
                self.stats.sent += 1
                self.stats.rejected_points += outcome.rejected_points
                self._backoff_s, self._backoffs = 0.0, 0
                if self._failing:
                    if self.downstream is not None:
                        self.downstream.answered(self.name)
                    else:
                        logger.info("%s: downstream back after %d failed attempt(s)", self.name, self._failing)
                    self._failing = 0
                continue
            self.stats.last_error = outcome.cause
            self.stats.failures += 1
            if outcome.refused:
                self.queue.remove(entry_id)
                self.stats.dropped_rejected += 1
                logger.error("%s: downstream refused a request permanently (%s); dropped", self.name, outcome.cause)
                continue
            self._back_off(outcome.retry_after_s)
            self._failing += 1
            if self.downstream is not None:
                self.downstream.failed(self.name, outcome.cause, self._backoff_s)
            elif self._failing & (self._failing - 1) == 0:  # the 1st, 2nd, 4th, 8th...: the log backs off too
                logger.warning(
                    "%s: downstream failed (%s); retrying in %.1fs (%d failed attempt(s) in a row)",
                    self.name,
                    outcome.cause,
                    self._backoff_s,
                    self._failing,
                )
            return False

    def _back_off(self, retry_after_s: float | None) -> None:
        self.stats.retries += 1
        self._backoffs += 1
        backoff = Backoff(self.initial_backoff_s, self.max_backoff_s)
        self._backoff_s = backoff.delay(self._backoffs, retry_after_s, self.jitter())

    @property
    def backoff_s(self) -> float:
        return self._backoff_s

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"otel-ofu-{self.name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopping:
            if self.pump():
                self._wake.wait()
                self._wake.clear()
            elif self.sleep is not None:
                self.sleep(self._backoff_s)
            else:
                # The whole backoff, even when new requests arrive meanwhile (each submit wakes the
                # event): only stop cuts it short. Else every flush and pass-through request would
                # retry a down downstream at once.
                until = time.monotonic() + self._backoff_s
                while not self._stopping and (left := until - time.monotonic()) > 0:
                    self._wake.wait(left)
                    self._wake.clear()

    def stop(self, timeout_s: float = 5.0) -> int:
        """Try to empty the queue within ``timeout_s``, then stop; returns how many requests were left
        undelivered (a spool keeps them for the next start, a memory queue loses them).

        Returns within ``timeout_s`` plus at most one send of its own (bounded by the transport's
        timeout): a send the sender thread has in flight is not waited for past the deadline.
        """
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and len(self.queue):
            if not self.pump(max(0.0, deadline - time.monotonic())):
                time.sleep(min(max(self._backoff_s, 0.05), max(0.0, deadline - time.monotonic())))
        self._stopping = True
        self._wake.set()
        # Closing under the lock waits out a send still in flight: closing the spool under it would lose
        # its remove, and the request would be sent again after a restart. The sender then finds the
        # delivery closed and returns at once. Past the deadline the send is left to finish on its own
        # (the thread is a daemon; a spool's rows stay until the next start).
        if not self._lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            logger.warning("%s: a send still in flight at the shutdown deadline was abandoned", self.name)
            return len(self.queue)
        try:
            left = len(self.queue)
            self._closed = True
            if self.owns_transport:
                self.transport.close()
            self.queue.close()
        finally:
            self._lock.release()
        if self._thread is not None:
            self._thread.join()
        return left
