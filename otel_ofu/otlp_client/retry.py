"""The OTLP specification's retry rules: which failures are retried, after how long.

Retryable are the gRPC codes CANCELLED, DEADLINE_EXCEEDED, ABORTED, OUT_OF_RANGE, UNAVAILABLE and DATA_LOSS,
RESOURCE_EXHAUSTED only when the server sends RetryInfo (out of capacity for now: without it, a quota or a size
limit no retry cures), and the HTTP statuses 429, 502, 503 and 504; every other refusal is permanent. The
server's delay is honoured (gRPC RetryInfo, HTTP ``Retry-After`` as seconds or an HTTP date); else the wait is
an exponential backoff with jitter (``Backoff``), so that clients that failed together do not come back
together. A partial success is a success: never retried (``partial.py`` reads it).
"""

from __future__ import annotations

import contextlib
import email.utils
import math
import time

import attrs
import grpc
from google.protobuf.message import DecodeError
from google.rpc import error_details_pb2  # type: ignore[import-untyped]
from grpc_status import rpc_status

RETRYABLE_GRPC = frozenset(
    {
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.OUT_OF_RANGE,
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DATA_LOSS,
    }
)
RETRYABLE_HTTP = frozenset({429, 502, 503, 504})
RETRY_INFO_TRAILER = "google.rpc.retryinfo-bin"
BACKOFF_JITTER = 0.2
# 2 ** 60 times any initial wait is past every cap: a longer run of failures (a collector's downstream down
# for days) must not overflow a float.
_MAX_DOUBLINGS = 60


@attrs.frozen
class Attempt:
    """One attempt at sending a request, as the client saw it."""

    delivered: bool
    # The OTLP rules say a later attempt may succeed (a transient failure, or a connection that failed).
    retryable: bool = False
    retry_after_s: float | None = None  # the delay the receiver asked for
    cause: str = ""  # why it failed, in one line (for a delivered request: empty)
    # Only a change of settings cures it (the other protocol, TLS spoken to plain text, an untrusted
    # certificate): not retried within an export, but the receiver never refused the data either.
    misconfigured: bool = False
    rejected_points: int = 0  # partial_success: data points the receiver refused
    rejection: str = ""  # and what it said (also a warning about an export it took whole)

    @property
    def refused(self) -> bool:
        """The receiver refused the request for good: sending it again cannot succeed."""
        return not self.delivered and not self.retryable and not self.misconfigured


def grpc_retryable(code: grpc.StatusCode, retry_after_s: float | None) -> bool:
    return code in RETRYABLE_GRPC or (code == grpc.StatusCode.RESOURCE_EXHAUSTED and retry_after_s is not None)


def grpc_retry_delay(error: grpc.Call) -> float | None:
    """The receiver's RetryInfo: in the ``google.rpc.retryinfo-bin`` trailer or the standard status details."""
    infos: list[error_details_pb2.RetryInfo] = []
    for key, value in error.trailing_metadata() or ():
        if key == RETRY_INFO_TRAILER and isinstance(value, bytes):
            with contextlib.suppress(DecodeError):
                infos.append(error_details_pb2.RetryInfo.FromString(value))
    if not infos:
        try:
            status = rpc_status.from_call(error)
        except (ValueError, DecodeError):  # details inconsistent with the call's code
            status = None
        for detail in status.details if status is not None else ():
            if detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
                info = error_details_pb2.RetryInfo()
                detail.Unpack(info)
                infos.append(info)
    for info in infos:
        return float(info.retry_delay.seconds + info.retry_delay.nanos / 1e9)
    return None


def retry_after_s(value: str | None, now: float | None = None) -> float | None:
    """``Retry-After`` in seconds: a number of seconds or an HTTP date (RFC 9110); None when absent or bad."""
    if not value or not value.strip():
        return None
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(text)
        except (TypeError, ValueError):
            return None
        seconds = when.timestamp() - (time.time() if now is None else now)
    return max(seconds, 0.0) if math.isfinite(seconds) else None


@attrs.frozen
class Backoff:
    """The wait before the next attempt: what the receiver asked for when it did, else ``initial_s`` doubled
    after each failure in a row, times a random factor within ``1 ± jitter``; never above ``max_s``."""

    initial_s: float = 1.0
    max_s: float = math.inf
    jitter: float = BACKOFF_JITTER

    def delay(self, failures: int, asked_s: float | None, draw: float) -> float:
        """After the ``failures``-th failure in a row (1: the first); ``draw`` is uniform in [0, 1)."""
        if asked_s is not None:
            return min(asked_s, self.max_s)
        doublings = min(max(failures - 1, 0), _MAX_DOUBLINGS)
        return min(self.max_s, self.initial_s * 2.0**doublings * (1 + self.jitter * (2 * draw - 1)))
