"""Admission for the receivers: a bounded number of requests in flight and a shutdown switch (``Gate``, both
receivers), and the bytes of OTLP/HTTP bodies being received (``BodyBudget``).

Past a bound, or once shutdown has begun, requests are refused as retryable (gRPC UNAVAILABLE /
HTTP 503) with a retry delay, never RESOURCE_EXHAUSTED: the client should come back, not give up.
"""

from __future__ import annotations

import threading
import zlib

import attrs

from otel_ofu import names

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

    def self_metrics(self) -> dict[str, dict[str, int]]:
        """The requests refused, by why (the collector's ``SelfMetrics``)."""
        refused = {"overload": self.refused_overload, "shutdown": self.refused_shutdown}
        return {names.COLLECTOR_REQUESTS_REFUSED.name: refused}

    @property
    def in_flight(self) -> int:
        return self._in_flight

    @property
    def full(self) -> bool:
        """Whether a request arriving now would be refused as overload (a receiver may refuse it before
        reading its body; ``enter`` decides for the ones that pass)."""
        return self._in_flight >= self.max_in_flight


@attrs.define
class BodyBudget:
    """The bytes request bodies hold while they are received, inflated and processed, before and inside the gate:
    counted as they arrive (never as declared), in all and per peer (the client's address). Both receivers share
    one: a body inflated (gzip, deflate) is counted at its inflated size too, so many small bombs at once inflate
    within this budget together, not each within the receive limit.

    A declared length reserves nothing: a client declaring 64 MiB and sending a byte a second holds a byte
    a second, and the minimum rate cuts it off (``http_framing``). A peer holds at most ``max_peer_bytes``,
    so one client, however many connections it opens, leaves the rest of ``max_bytes`` to the others (the
    receivers give a peer twice the receive limit: one body of it and what that body inflates to). And what a
    peer holds beyond its first ``small_bytes`` comes out of the budget less ``reserve_bytes``: a few addresses
    each holding a real 64 MiB body can fill at most that, and the reserve stays for every other peer's requests
    (a producer's are tens of KB), which would otherwise all be 503 until the big bodies are done. A body that
    would pass a bound is refused (503, retryable) and its bytes given back. ``max_readers`` optionally bounds the
    bodies being received at once (None: their number is not bounded, their bytes are).
    """

    max_bytes: int = 4 * MAX_REQUEST_BYTES
    max_peer_bytes: int = MAX_REQUEST_BYTES
    max_readers: int | None = None
    small_bytes: int = 4 * 1024 * 1024
    reserve_bytes: int = attrs.field(default=attrs.Factory(lambda self: self.max_bytes // 4, takes_self=True))
    _readers: int = 0
    _bytes: int = 0
    _large: int = 0  # what peers hold beyond their small_bytes, together
    _peers: dict[str, int] = attrs.field(factory=dict)  # bytes held per peer, while it holds any or reads
    _peer_readers: dict[str, int] = attrs.field(factory=dict)
    _lock: threading.Lock = attrs.field(factory=threading.Lock)

    def _fits(self, held: int, size: int) -> int | None:
        """The large part after ``size`` more bytes of a peer holding ``held``, or None when that passes a bound.
        The caller holds the lock."""
        if held + size > self.max_peer_bytes or self._bytes + size > self.max_bytes:
            return None
        grown = max(0, held + size - self.small_bytes) - max(0, held - self.small_bytes)
        if grown and self._large + grown > self.max_bytes - self.reserve_bytes:
            return None
        return self._large + grown

    def open(self, peer: str, declared: int | None = None) -> BodyLease | None:
        """A lease for one body from ``peer``, or None when it cannot be had now: the readers' bound, or a
        declared length that does not fit in what ``peer`` and everyone hold already (bytes received, not
        declared, so no one's declaration blocks another)."""
        with self._lock:
            if self.max_readers is not None and self._readers >= self.max_readers:
                return None
            held = self._peers.get(peer, 0)
            if declared is not None and self._fits(held, declared) is None:
                return None
            self._readers += 1
            self._peer_readers[peer] = self._peer_readers.get(peer, 0) + 1
            self._peers[peer] = held
            return BodyLease(self, peer)

    def _take(self, peer: str, size: int) -> bool:
        with self._lock:
            held = self._peers[peer]
            large = self._fits(held, size)
            if large is None:
                return False
            self._peers[peer] = held + size
            self._bytes += size
            self._large = large
            return True

    def _give(self, peer: str, size: int) -> None:
        with self._lock:
            held = self._peers[peer]
            self._large -= max(0, held - self.small_bytes) - max(0, held - size - self.small_bytes)
            self._bytes -= size
            self._peers[peer] = held - size
            self._readers -= 1
            readers = self._peer_readers[peer] - 1
            if readers:
                self._peer_readers[peer] = readers
            else:  # nothing kept for a peer that holds nothing: a scan of the internet leaves no state
                del self._peer_readers[peer], self._peers[peer]

    @property
    def readers(self) -> int:
        """Bodies being received or processed now."""
        return self._readers

    @property
    def bytes(self) -> int:
        """Bytes those bodies hold now."""
        return self._bytes


@attrs.define
class BodyLease:
    """One body's share of a ``BodyBudget``: ``take`` as its bytes arrive (or inflate), ``release`` once (after
    its answer)."""

    budget: BodyBudget
    peer: str
    held: int = 0
    _released: bool = False

    def take(self, size: int) -> bool:
        """Count ``size`` more bytes received; False (nothing counted) when that would pass a bound."""
        if not self.budget._take(self.peer, size):
            return False
        self.held += size
        return True

    def release(self) -> None:
        if not self._released:
            self._released = True
            self.budget._give(self.peer, self.held)


class TooLarge(Exception):
    """A body that inflates past the receive limit."""


class OverBudget(Exception):
    """A body whose inflated bytes do not fit in the budget now (retryable)."""


_GZIP_WBITS = 16 + zlib.MAX_WBITS
_INFLATE_PIECE = 1024 * 1024


def inflate(data: bytes, *, gzip: bool, limit: int, lease: BodyLease) -> bytes:
    """``data`` inflated (gzip, or zlib's deflate), at most ``limit`` bytes, each piece counted in ``lease`` as it
    comes: a bomb costs the budget what it inflates to, a piece at a time, and is cut at the limit (TooLarge) or
    when the budget is full (OverBudget), never inflated whole first. zlib.error or EOFError: not such data."""
    inflater = zlib.decompressobj(_GZIP_WBITS if gzip else zlib.MAX_WBITS)
    out = bytearray()
    pending = data
    while True:
        piece = inflater.decompress(pending, _INFLATE_PIECE)
        pending = inflater.unconsumed_tail
        if piece:
            if len(out) + len(piece) > limit:
                raise TooLarge
            if not lease.take(len(piece)):
                raise OverBudget
            out += piece
        if inflater.eof or (not piece and not pending):
            break
    if not inflater.eof:
        raise EOFError("compressed data ends early")
    return bytes(out)  # a copy for a moment, as long as a memcpy takes
