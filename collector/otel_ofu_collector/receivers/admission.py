"""Admission for both receivers: a bounded number of requests in flight, and a shutdown switch.

Past the bound, or once shutdown has begun, requests are refused as retryable (gRPC UNAVAILABLE /
HTTP 503) with a retry delay, never RESOURCE_EXHAUSTED: the client should come back, not give up.
"""

from __future__ import annotations

import threading

import attrs

MAX_REQUEST_BYTES = 64 * 1024 * 1024


@attrs.define
class Gate:
    max_in_flight: int = 64
    retry_after_s: float = 1.0
    _in_flight: int = 0
    _closing: bool = False
    _lock: threading.Lock = attrs.field(factory=threading.Lock)
    refused_overload: int = 0
    refused_shutdown: int = 0

    def enter(self) -> str | None:
        """None when admitted (call ``leave`` after), else why not: ``"overload"`` or ``"shutdown"``."""
        with self._lock:
            if self._closing:
                self.refused_shutdown += 1
                return "shutdown"
            if self._in_flight >= self.max_in_flight:
                self.refused_overload += 1
                return "overload"
            self._in_flight += 1
            return None

    def count_refusal(self, why: str) -> None:
        """Count a refusal made before ``enter`` (the HTTP receiver's body readers were all busy)."""
        with self._lock:
            if why == "shutdown":
                self.refused_shutdown += 1
            else:
                self.refused_overload += 1

    def leave(self) -> None:
        with self._lock:
            self._in_flight -= 1

    def close(self) -> None:
        with self._lock:
            self._closing = True

    @property
    def closing(self) -> bool:
        return self._closing

    @property
    def in_flight(self) -> int:
        return self._in_flight


@attrs.define
class BodyBudget:
    """What OTLP/HTTP bodies may hold while they are received, before the gate: connections reading a body
    at once, and the bytes their declared lengths add up to (a chunked body counts as the largest allowed).

    A body is read before its request takes a gate slot, so a client sending its body slowly holds one of
    these and never the slots meant for work; the body deadline bounds how long.
    """

    max_readers: int = 256
    max_bytes: int = 4 * MAX_REQUEST_BYTES
    _readers: int = 0
    _bytes: int = 0
    _lock: threading.Lock = attrs.field(factory=threading.Lock)

    def take(self, size: int) -> bool:
        with self._lock:
            if self._readers >= self.max_readers or (self._readers and self._bytes + size > self.max_bytes):
                return False
            self._readers += 1
            self._bytes += size
            return True

    def give(self, size: int) -> None:
        with self._lock:
            self._readers -= 1
            self._bytes -= size

    @property
    def readers(self) -> int:
        return self._readers
