"""What a receiver says of a request it took: ``partial_success``, read from its answer and said once.

A partial success is a success (the OTLP specification: never retried): the receiver took the request and
refused ``rejected_data_points`` of its points, or took it whole with a warning in ``error_message``. Each
side counts the refused points in its self-metrics; the log says each distinct message once, not once per
request (a downstream that refuses a point of every window would otherwise fill the log), and stops after
``MAX_MESSAGES`` distinct ones (a message that names a count or a time is new every time).
"""

from __future__ import annotations

import logging
import threading

import attrs
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceResponse

from otel_ofu.otlp_client.retry import Attempt

log = logging.getLogger(__name__)

MAX_MESSAGES = 100
_NO_REASON = "no reason given"


def delivered(response: bytes) -> Attempt:
    """A delivered request, with what the receiver's ``partial_success`` says it refused."""
    if not response:
        return Attempt(True)
    try:
        partial = ExportMetricsServiceResponse.FromString(response).partial_success
    except DecodeError:
        return Attempt(True)  # a receiver that answers something else still took the request
    return Attempt(True, rejected_points=partial.rejected_data_points, rejection=partial.error_message)


@attrs.define
class PartialSuccessLog:
    """Says each distinct ``partial_success`` message of one destination once. Thread-safe: the senders that
    share a client (the collector's window export, pass-through and self-metrics) share its log."""

    where: str  # the destination, as the log names it
    counted_in: str  # the self-metric that counts the refused points
    max_messages: int = MAX_MESSAGES
    _said: set[str] = attrs.field(init=False, factory=set)
    _full: bool = attrs.field(init=False, default=False)
    _lock: threading.Lock = attrs.field(init=False, factory=threading.Lock)

    def note(self, attempt: Attempt) -> None:
        if not attempt.rejected_points and not attempt.rejection:
            return
        message = " ".join(attempt.rejection.split())[:300] or _NO_REASON
        with self._lock:
            if message in self._said or self._full:
                return
            if len(self._said) >= self.max_messages:
                self._full = True
                log.warning(
                    "%s: %d distinct partial-success messages said; further ones are not (the refused points "
                    "are still counted in %s)",
                    self.where,
                    len(self._said),
                    self.counted_in,
                )
                return
            self._said.add(message)
        if attempt.rejected_points:
            log.warning(
                "%s refused %d data point(s) of an export: %s (counted in %s; each message said once)",
                self.where,
                attempt.rejected_points,
                message,
                self.counted_in,
            )
        else:
            log.warning("%s took an export whole with a warning: %s (each message said once)", self.where, message)
