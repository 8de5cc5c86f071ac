"""One OTLP destination, for the producer's exporter and the collector's downstream alike.

``OtlpClient`` holds a sender (``senders.py``: gRPC or OTLP/HTTP, from ``OtlpSettings``) and says what the
receiver answered in ``partial_success`` once per distinct message (``partial.py``). ``send`` is one
attempt, at the settings' timeout unless told: the collector's delivery queue retries it, with the same
``Backoff``, for as long as its queue or spool holds the request. ``export`` retries as the OTLP
specification says within one export's timeout: after the receiver's delay (RetryInfo, Retry-After), else
1, 2, 4 ... s with 20% jitter, six attempts at most as the SDK's exporters make; never a failure the rules
call permanent, nor one only a change of settings cures.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Protocol

import attrs

from otel_ofu.otlp_client.partial import PartialSuccessLog
from otel_ofu.otlp_client.retry import Attempt, Backoff
from otel_ofu.otlp_client.senders import Sender, open_sender
from otel_ofu.otlp_client.settings import OtlpSettings

MAX_ATTEMPTS = 6  # as the SDK's exporters: the first try and five retries, all within the timeout
EXPORT_BACKOFF = Backoff(initial_s=1.0)


class Transport(Protocol):
    """What a delivery queue sends through: one attempt per ``send``, at the client's own timeout."""

    def send(self, payload: bytes) -> Attempt: ...

    def close(self) -> None: ...


@attrs.define
class OtlpClient:
    """Safe to share between threads; ``close`` ends a call in flight (gRPC) and an ``export``'s retries."""

    settings: OtlpSettings
    counted_in: str  # the self-metric that counts the points receivers refuse, named in the log
    sender: Sender = attrs.field(default=attrs.Factory(lambda self: open_sender(self.settings), takes_self=True))
    # The destination as the log names it; default: the endpoint.
    where: str = attrs.field(default=attrs.Factory(lambda self: self.settings.endpoint, takes_self=True))
    partial: PartialSuccessLog = attrs.field(init=False)
    _closed: bool = attrs.field(init=False, default=False)

    def __attrs_post_init__(self) -> None:
        self.partial = PartialSuccessLog(self.where, self.counted_in)

    @property
    def endpoint(self) -> str:
        return self.settings.endpoint

    def send(self, payload: bytes, timeout_s: float | None = None) -> Attempt:
        """One attempt; what the receiver refused of a delivered request is said (once per message)."""
        attempt = self.sender.send(payload, self.settings.timeout_s if timeout_s is None else timeout_s)
        if attempt.delivered and (attempt.rejected_points or attempt.rejection):
            self.partial.note(attempt)
        return attempt

    def export(
        self,
        payload: bytes,
        timeout_s: float,
        wait: Callable[[float], bool],
        on_retry: Callable[[Attempt, float], None] | None = None,
        draw: Callable[[], float] = random.random,
        backoff: Backoff = EXPORT_BACKOFF,
    ) -> Attempt | None:
        """Deliver ``payload`` within ``timeout_s``, retrying as the rules say; the last attempt, or None
        when the client was closed meanwhile (the loss is the shutdown's). ``wait(seconds)`` sleeps between
        attempts and says whether to stop; ``on_retry(attempt, delay)`` is told of each retry to come."""
        deadline = time.monotonic() + timeout_s
        number = 0
        while True:
            number += 1
            attempt = self.send(payload, max(deadline - time.monotonic(), 0.001))
            if attempt.delivered:
                return attempt
            if self._closed:
                return None
            if not attempt.retryable or attempt.misconfigured or number == MAX_ATTEMPTS:
                return attempt
            delay = backoff.delay(number, attempt.retry_after_s, draw())
            if delay > deadline - time.monotonic():
                return attempt
            if on_retry is not None:
                on_retry(attempt, delay)
            if wait(delay):
                return None

    def close(self) -> None:
        self._closed = True
        self.sender.close()
