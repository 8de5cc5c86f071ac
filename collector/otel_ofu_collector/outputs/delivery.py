"""Delivery of window outputs and pass-through to the downstream OTLP receiver: a queue drained by a sender.

Window outputs are encoded once (``otlp.encode.encode_request``) and from then on travel as serialized
ExportMetricsServiceRequest bytes, the same as pass-through data; a ``transports`` client sends both.

A failed send stays at the head of its queue and is retried with exponential backoff (honouring the
receiver's RetryInfo / Retry-After); a permanent refusal (bad request, unauthenticated) is dropped
and counted; a full queue drops its oldest request and counts it. Nothing is dropped silently. An
error nobody foresaw (from the transport or the spool) is logged and retried the same way: the sender
thread outlives it, so the queue never silently stops draining.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import attrs

from otel_ofu_collector.outputs.queues import MemoryQueue, Queue
from otel_ofu_collector.outputs.transports import Transport

logger = logging.getLogger(__name__)


@attrs.define
class DeliveryStats:
    sent: int = 0
    retries: int = 0
    dropped_overflow: int = 0  # pushed out of a full queue or spool
    dropped_rejected: int = 0  # refused permanently by the downstream
    last_error: str = ""


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
    sleep: Callable[[float], object] | None = None  # None: wait on the wake-up event (interruptible)
    stats: DeliveryStats = attrs.field(factory=DeliveryStats)
    owns_transport: bool = True
    _backoff_s: float = 0.0
    _wake: threading.Event = attrs.field(factory=threading.Event)
    _stopping: bool = False
    _thread: threading.Thread | None = None
    _lock: threading.Lock = attrs.field(factory=threading.Lock)  # held for a whole send and its remove
    _stats_lock: threading.Lock = attrs.field(factory=threading.Lock)
    _closed: bool = False

    def submit(self, payload: bytes) -> None:
        dropped = self.queue.put(payload)
        if dropped:
            # Every receiver thread submits pass-through: the count needs its own lock (``_lock`` is
            # held for whole sends, which would stall the receivers behind a slow downstream).
            with self._stats_lock:
                self.stats.dropped_overflow += dropped
            logger.warning("%s queue full: dropped %d oldest request(s)", self.name, dropped)
        self._wake.set()

    def pump(self) -> bool:
        """Send queued requests in order until the queue is empty (True) or a retryable failure (False)."""
        with self._lock:
            if self._closed:  # the sender thread woke after stop closed the queue and transport
                return True
            try:
                return self._drain()
            except Exception as error:  # unforeseen (a closed channel, sqlite3.Error): retried, never fatal
                self.stats.last_error = f"{type(error).__name__}: {error}"
                self._back_off(None)
                logger.error(
                    "%s: sending failed unexpectedly; retrying in %.1fs", self.name, self._backoff_s, exc_info=True
                )
                return False

    def _drain(self) -> bool:
        while True:
            head = self.queue.peek()
            if head is None:
                self._backoff_s = 0.0
                return True
            entry_id, payload = head
            outcome = self.transport.send(payload)
            if outcome.ok:
                self.queue.remove(entry_id)
                self.stats.sent += 1
                self._backoff_s = 0.0
                continue
            self.stats.last_error = outcome.error
            if not outcome.retryable:
                self.queue.remove(entry_id)
                self.stats.dropped_rejected += 1
                logger.error("%s: downstream refused a request permanently (%s); dropped", self.name, outcome.error)
                continue
            self._back_off(outcome.retry_after_s)
            logger.warning("%s: downstream failed (%s); retrying in %.1fs", self.name, outcome.error, self._backoff_s)
            return False

    def _back_off(self, retry_after_s: float | None) -> None:
        self.stats.retries += 1
        base = self._backoff_s * 2 if self._backoff_s else self.initial_backoff_s
        self._backoff_s = min(self.max_backoff_s, base)
        if retry_after_s is not None:
            self._backoff_s = min(self.max_backoff_s, max(self._backoff_s, retry_after_s))

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
                self._wake.wait(self._backoff_s)
                self._wake.clear()

    def stop(self, timeout_s: float = 5.0) -> int:
        """Try to empty the queue within ``timeout_s``, then stop; returns how many requests were left
        undelivered (a spool keeps them for the next start, a memory queue loses them)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and len(self.queue):
            if not self.pump():
                time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))
        self._stopping = True
        self._wake.set()
        # Closing under the lock waits out a send still in flight (bounded by the transport's timeout):
        # closing the spool under it would lose its remove, and the request would be sent again after a
        # restart. The sender then finds the delivery closed and returns at once.
        with self._lock:
            left = len(self.queue)
            self._closed = True
            if self.owns_transport:
                self.transport.close()
            self.queue.close()
        if self._thread is not None:
            self._thread.join()
        return left
