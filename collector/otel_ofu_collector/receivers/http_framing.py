"""HTTP/1.1 on a socket, apart from what is served: heads, bodies, answers, and the guards of a public port.

An ``HttpServer`` accepts connections (listen backlog ``LISTEN_BACKLOG``, TLS handshaken under the read timeout)
and runs requests through an ``HttpApp``, which sees a parsed ``RequestHead`` and a whole body and returns a
``Response``; it knows nothing of sockets. The receiver's own app is OTLP (``otlp_http``).

One thread serves every connection: an asyncio event loop, each connection's logic a generator that reads as a
blocking server's would and yields wherever it waits for bytes (``_Connection``). A request the app answers
``inline`` (the OTLP app: a small protobuf request while the windows are free) is answered on that thread, the
others waiting in their connections meanwhile (TCP holds them); any other on a worker thread, the loop serving
the rest. Why: with a thread per connection, which this replaced, four clients at once cost 43 us of CPU per GPU
report at 8 GPUs per request, and 26 here, on the same requests and collector (the end-to-end benchmark's case,
2-core machine): each request passed the interpreter lock between threads, and that cost more than the framing
itself. The collector's work is Python under that lock either way, so threads bought no parallelism; and every
request on a worker thread measured 33: the hop each way costs more than a node's request. The gRPC receiver
chooses the same way (``receivers.base.INLINE_BYTES``).

Parsing is strict (RFC 9112): one request line ``METHOD SP TARGET SP HTTP/1.x``, token header names, no
obsolete line folding, no control characters in values, ``Host`` required of HTTP/1.1. A body is framed by
``Content-Length`` or by ``Transfer-Encoding: chunked``; none on a POST is 411, both at once 400 (a request
smuggling probe: the two framings disagree on where the next request starts), anything unusable 400, and
every framing error closes the connection. A chunk-size line is refused at its first byte that cannot
belong to one, not only at its end: a client framing by Content-Length may never send that end.

Time: the head must arrive within ``header_deadline_s`` of its first byte; a body within
``body_deadline_s`` of its head, and at an average of at least ``body_min_rate`` bytes/s after its first
``body_grace_s`` (Apache's mod_reqtimeout model: each byte received extends the deadline by 1/rate s);
no silence longer than ``read_timeout_s`` anywhere. A body cut off is answered 408.

Memory: a body's bytes are counted in a ``BodyBudget`` as they arrive (never as declared), per peer, and
held until its answer is written (its inflated bytes with them: the app takes those from the same lease); a
body that would pass the budget is answered 503 and its bytes given back. A body refused before it is read (the
app's refusals, the budget) is read and discarded when small, so the connection stays usable, and not read at all
when large (the connection then closes).

Why not h11 (a well-kept HTTP/1.1 parser): measured with the same OTLP app on the same machine, when connections
still had a thread each, the server spent 74 us of CPU per request on this module's parsing and 130 us on h11 with
the least connection loop it allows (no deadlines, no minimum rate: a floor). And h11 takes both Content-Length
and chunked at once, a Content-Length of 5,000 digits is a 400 to it (413 here), a POST without framing an empty
body (411 here), all three needing checks of our own in front of it, and it waits for a junk chunk-size line to
end, which nothing in front of it can change.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import email.utils
import logging
import re
import socket
import ssl
import threading
import time
from collections.abc import Callable, Generator, Mapping, Sequence
from http import HTTPStatus
from typing import Final, Protocol, TypeAlias, TypeVar, cast

import attrs

from otel_ofu_collector.receivers.admission import MAX_REQUEST_BYTES, BodyBudget, BodyLease
from otel_ofu_collector.receivers.base import LISTEN_BACKLOG

logger = logging.getLogger(__name__)

READ_TIMEOUT_S: Final = 30.0
BODY_DEADLINE_S: Final = 60.0  # a whole body, 64 MiB at about 1 MB/s; READ_TIMEOUT_S still bounds each silence
BODY_GRACE_S: Final = 10.0  # before the minimum rate applies: a slow start (TLS, a cold client) is no offence
BODY_MIN_RATE: Final = 1024.0  # bytes/s on average after the grace; Apache's default is 500
HEADER_DEADLINE_S: Final = 10.0  # the request line and headers, from their first byte; real ones take milliseconds
SKIP_MAX_BYTES: Final = 1024 * 1024  # the most read and discarded of a body refused before it was read
MAX_HEAD_BYTES: Final = 64 * 1024  # request line and headers together (431 past it); real ones are < 1 KiB
MAX_HEADERS: Final = 100
LINGER_S: Final = 0.5  # after a closing answer, what the client still sends is drained this long (see _close)
_PIECE = 1024 * 1024  # the most one recv of a body asks for: the deadline is checked between recvs
_HEAD_PIECE = 64 * 1024  # one recv otherwise: a head and a producer's whole request fit
_MAX_LINE = 1024  # a chunk-size or trailer line; real ones are a few bytes
_MAX_TRAILERS = 64
_MAX_LENGTH_DIGITS = 18  # a Content-Length longer than this is over any limit (and int() refuses past 4300)
_HEAD_END = re.compile(rb"\r?\n\r?\n")
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_TARGET = re.compile(rb"[\x21-\x7e]+")
_VERSION = re.compile(rb"HTTP/([0-9])\.([0-9])")
_FIELD_CTL = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")  # control characters but HTAB
# A header line: a token, a colon, a value of no control characters but HTAB (its blanks trimmed after: a lazy
# value before optional blanks would backtrack quadratically over a long run of them), a CR before its LF.
_FIELD_LINE = re.compile(rb"([!#$%&'*+\-.^_`|~0-9A-Za-z]+):([^\x00-\x08\x0a-\x1f\x7f]*)\r?\n")
_FIELD_LINES = re.compile(rb"(?:[!#$%&'*+\-.^_`|~0-9A-Za-z]+:[^\x00-\x08\x0a-\x1f\x7f]*\r?\n)*")
_DIGITS = re.compile(r"[0-9]+")
_HEX = re.compile(rb"[0-9A-Fa-f]+")
# What a chunk-size line may look like before its end: hex digits, then optional whitespace and extensions.
_CHUNK_LINE_START = re.compile(rb"[0-9A-Fa-f]*(?:[ \t]*;[^\r\n]*|[ \t]*)\r?")
_OVER_BUDGET = "overloaded (request bodies being received), retry later"
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})  # a request of these without framing is 411
_STOP_S: Final = 5.0  # the most a stop waits for its loop to close the connections

_T = TypeVar("_T")
# A connection's steps (``_Connection``): each yield is a wait for more bytes until a time (None: the idle timeout
# only; a time already past: TimeoutError at once); each resumption says whether bytes came (False: the stream
# ended), or the deadline's TimeoutError is thrown in; the return is the steps' result.
_Steps: TypeAlias = Generator[float | None, bool, _T]


@attrs.frozen
class RequestHead:
    """A request's line and headers; header names lower-cased, every value of a repeated one in order."""

    method: str
    target: str
    version: str  # "HTTP/1.1" or "HTTP/1.0"
    headers: Mapping[str, Sequence[str]]
    peer: str  # the client's address, as the body budget keys it

    @property
    def path(self) -> str:
        return self.target.split("?", 1)[0]

    def get(self, name: str) -> str | None:
        """The first value of header ``name`` (lower case), or None."""
        values = self.headers.get(name)
        return values[0] if values else None


@attrs.frozen
class Response:
    status: int
    body: bytes = b""
    headers: Sequence[tuple[str, str]] = ()  # beyond Date, Server, Content-Length and Connection


class HttpApp(Protocol):
    """What a server serves: ``admit`` and ``refuse`` on the server's thread, ``respond`` there too where ``inline``
    says so (a request at a time: one that blocks holds every connection's next request until it returns), else on
    a worker thread, concurrently."""

    def admit(self, head: RequestHead) -> Response | None:
        """Before the body is read: a refusal (401, 404, ...), or None to receive the body."""
        ...

    def inline(self, head: RequestHead, body: bytes) -> bool:
        """Whether ``respond`` runs on the server's own thread (cheap, nothing in its way now) rather than on a worker
        thread, the server's other connections served meanwhile."""
        ...

    def respond(self, head: RequestHead, body: bytes, lease: BodyLease) -> Response:
        """The answer to a request whose body is in; ``lease`` holds its bytes in the body budget until the answer
        is written, and takes whatever else the request holds meanwhile (its body inflated)."""
        ...

    def refuse(self, head: RequestHead | None, status: HTTPStatus, message: str) -> Response:
        """The answer to a request the framing refuses: malformed (400, 411, 431, 505), too large (413), too
        slow (408), over the body budget (503). ``head`` is None when the head itself could not be read."""
        ...


@attrs.frozen
class Limits:
    max_body_bytes: int = MAX_REQUEST_BYTES
    read_timeout_s: float = READ_TIMEOUT_S
    header_deadline_s: float = HEADER_DEADLINE_S
    body_deadline_s: float = BODY_DEADLINE_S
    body_min_rate: float = BODY_MIN_RATE  # bytes/s; 0: none
    body_grace_s: float = BODY_GRACE_S
    skip_max_bytes: int = SKIP_MAX_BYTES


class _Refused(Exception):
    """A request the framing answers itself (``HttpApp.refuse``); the connection then closes."""

    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class _Gone(Exception):
    """The client left, or went silent past a deadline before a request began: nobody to answer."""


class _BodyClock:
    """When a body must be in by: its overall deadline, or sooner while it runs below the minimum rate."""

    __slots__ = ("hard", "limits", "received", "start")

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.start = time.monotonic()
        self.hard = self.start + limits.body_deadline_s
        self.received = 0

    def deadline(self) -> float:
        rate = self.limits.body_min_rate
        if rate <= 0:
            return self.hard
        return min(self.hard, self.start + self.limits.body_grace_s + self.received / rate)

    def why(self) -> str:
        limits = self.limits
        if time.monotonic() >= self.hard:
            return f"body not received within {limits.body_deadline_s:g} s"
        if limits.body_min_rate > 0 and time.monotonic() >= self.deadline():
            return f"body slower than {limits.body_min_rate:g} bytes/s after {limits.body_grace_s:g} s"
        return f"body silent for {limits.read_timeout_s:g} s"


_DATE_LOCK = threading.Lock()
_date_cache: tuple[int, str] = (0, "")


def _http_date() -> str:
    """The Date header (RFC 9110 6.6.1), formatted once a second."""
    global _date_cache
    now = int(time.time())
    cached = _date_cache
    if cached[0] != now:
        with _DATE_LOCK:
            cached = _date_cache = (now, email.utils.formatdate(now, usegmt=True))
    return cached[1]


_REASONS: Final = {int(status): status.phrase for status in HTTPStatus}


def parse_head(data: bytes, peer: str) -> RequestHead:
    """The request line and headers (without the empty line that ends them); _Refused when malformed."""
    if data.count(b"\n") > MAX_HEADERS:
        raise _Refused(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, f"more than {MAX_HEADERS} header lines")
    line, _, fields = data.partition(b"\n")
    parts = line.rstrip(b"\r").split(b" ")
    if len(parts) != 3 or not _TOKEN.fullmatch(parts[0]) or not _TARGET.fullmatch(parts[1]):
        raise _Refused(HTTPStatus.BAD_REQUEST, "malformed request line")
    version = _VERSION.fullmatch(parts[2])
    if version is None:
        raise _Refused(HTTPStatus.BAD_REQUEST, "malformed request line")
    if version.group(1) != b"1":
        raise _Refused(HTTPStatus.HTTP_VERSION_NOT_SUPPORTED, "only HTTP/1.0 and HTTP/1.1 are served")
    block = fields + b"\n" if fields else b""
    # Every line well formed, in one match (as nearly every head is): each line is then one pair; otherwise the
    # lines are read one by one, to name the first that is not.
    pairs = _FIELD_LINE.findall(block) if _FIELD_LINES.fullmatch(block) else _fields_one_by_one(fields)
    headers: dict[str, list[str]] = {}
    for name, value in pairs:
        headers.setdefault(name.decode("ascii").lower(), []).append(value.strip(b" \t").decode("latin-1"))
    # A later 1.x minor is served as 1.1, the highest this server speaks (RFC 9110 2.5).
    served = "HTTP/1.0" if version.group(2) == b"0" else "HTTP/1.1"
    head = RequestHead(parts[0].decode("ascii"), parts[1].decode("ascii"), served, headers, peer)
    if head.version != "HTTP/1.0" and "host" not in headers:
        raise _Refused(HTTPStatus.BAD_REQUEST, "Host header required (RFC 9112 3.2)")
    return head


def _fields_one_by_one(fields: bytes) -> list[tuple[bytes, bytes]]:
    """Each header line's name and value (untrimmed); _Refused at the first line that is malformed."""
    pairs = []
    for line in fields.split(b"\n"):
        line = line.rstrip(b"\r")
        name, colon, value = line.partition(b":")
        if not colon or not _TOKEN.fullmatch(name):  # a folded line starts with whitespace: no token
            raise _Refused(HTTPStatus.BAD_REQUEST, "malformed header line")
        if _FIELD_CTL.search(value.strip(b" \t")):
            raise _Refused(HTTPStatus.BAD_REQUEST, "control character in a header value")
        pairs.append((name, value))
    return pairs


def body_length(head: RequestHead) -> int | None:
    """The declared length of the body, None for a chunked one; _Refused when the framing is not usable."""
    transfer = head.headers.get("transfer-encoding")
    lengths = head.headers.get("content-length")
    if transfer:
        codings = [coding.strip().lower() for value in transfer for coding in value.split(",")]
        if codings != ["chunked"]:
            raise _Refused(HTTPStatus.BAD_REQUEST, f"Transfer-Encoding {', '.join(transfer)} not supported")
        if lengths:
            raise _Refused(HTTPStatus.BAD_REQUEST, "both Content-Length and Transfer-Encoding: chunked")
        if head.version == "HTTP/1.0":  # its framing is faulty by definition (RFC 9112 6.1)
            raise _Refused(HTTPStatus.BAD_REQUEST, "Transfer-Encoding in an HTTP/1.0 request")
        return None
    declared = {part.strip() for value in lengths or () for part in value.split(",")}
    if not declared:
        if head.method in _BODY_METHODS:
            raise _Refused(HTTPStatus.LENGTH_REQUIRED, "Content-Length (or a chunked body) required")
        return 0
    if len(declared) > 1 or not _DIGITS.fullmatch(text := declared.pop()):
        shown = ", ".join(lengths or ())[:40]
        raise _Refused(HTTPStatus.BAD_REQUEST, f"invalid Content-Length {shown!r}")
    if len(text.lstrip("0")) > _MAX_LENGTH_DIGITS:
        raise _Refused(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"Content-Length of {len(text)} digits")
    return int(text)


def _wants_close(head: RequestHead) -> bool:
    """Whether the connection closes after this request: asked to, or HTTP/1.0 (served one request each)."""
    if head.version == "HTTP/1.0":
        return True
    return any(
        token.strip().lower() == "close" for value in head.headers.get("connection", ()) for token in value.split(",")
    )


class _Connection(asyncio.Protocol):
    """One client connection: requests in turn until either side closes.

    Its logic (``_serve``) reads as a blocking server's would, top to bottom, but is a generator: wherever it needs
    more bytes than the buffer holds it yields the time by which they must come (None: only the idle timeout), and
    the event loop resumes it with True when bytes (or room to write) came, False at the end of the stream, or
    throws TimeoutError into it once that time has passed. So every deadline, refusal and answer sits where a reader
    expects it, and the whole server is one thread.
    """

    def __init__(self, server: HttpServer, loop: asyncio.AbstractEventLoop) -> None:
        self.server = server
        self.loop = loop
        self.app = server.app
        self.limits = server.limits
        self.budget = server.budget
        self.buffer = bytearray()
        self.peer = "?"
        self.transport: asyncio.Transport | None = None
        self.steps: _Steps[None] | None = None
        self.due = 0.0  # when what ``steps`` waits for must have come (the idle timeout included)
        self.timer: asyncio.TimerHandle | None = None
        self.eof = False
        self.writable = True  # False while answers written wait for a client that does not read them
        self.idle = False  # waiting for a request's first byte: a stop closes it at once
        self.working = False  # its request is on a worker thread: no deadline, no read, until it is answered

    # --- the event loop's side -----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        self.peer = str(peer[0]) if peer else "?"
        self.server.connections.add(self)
        self.steps = self._serve()
        self._advance(None, first=True)

    def data_received(self, data: bytes) -> None:
        if self.steps is not None:  # else the last answer is out and the rest is dropped
            self.buffer += data
            self._advance(True)

    def eof_received(self) -> bool:
        self.eof = True
        self._advance(False)
        # Keep our side open: a half-closed client can still read why its request was refused (over TLS asyncio
        # closes on the peer's close_notify whatever this says).
        return self.transport is not None and self.transport.get_extra_info("sslcontext") is None

    def pause_writing(self) -> None:
        self.writable = False
        if self.transport is not None:
            self.transport.pause_reading()  # no more requests while their answers pile up

    def resume_writing(self) -> None:
        self.writable = True
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()
        self._advance(True)

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        steps, self.steps = self.steps, None
        if steps is not None:  # reset or cut short mid-request: the generator's finally gives its lease back
            logger.debug("HTTP client %s: connection lost: %s", self.peer, exc)
            steps.close()

    def stop(self) -> None:
        """The server stops: an idle connection closes, any other is cut short (``Receiver.stop``)."""
        if self.transport is not None:
            if self.idle:
                self.transport.close()
            else:
                self.transport.abort()

    # --- driving the generator ----------------------------------------------------------------------

    def _advance(self, more: bool | None, first: bool = False) -> None:
        """Resume ``steps`` with ``more`` (None: its deadline passed) and run it until it waits again."""
        steps = self.steps
        if steps is None:
            return
        try:
            if first:
                deadline = next(steps)
            elif more is None:
                deadline = steps.throw(TimeoutError("deadline passed"))
            else:
                deadline = steps.send(more)
            while True:
                if self.working:  # resumed by the worker's end, whatever comes before
                    return
                if self.eof and self.writable:  # every later read ends at once, as recv() gives b"" again
                    deadline = steps.send(False)
                    continue
                now = time.monotonic()
                due = now + self.limits.read_timeout_s
                if deadline is not None and deadline < due:
                    due = deadline
                if due > now:
                    break
                deadline = steps.throw(TimeoutError("deadline passed"))
        except StopIteration:
            self.steps = None
            return
        except Exception:  # a defect in the app or here: this client only
            self.steps = None
            logger.error("HTTP connection from %s failed", self.peer, exc_info=True)
            if self.transport is not None:
                self.transport.abort()
            return
        self.due = due
        # One timer per connection, moved only when a wait must end sooner than it fires: a keep-alive
        # connection's idle wait after each request ends later than the one before and costs no new timer.
        timer = self.timer
        if timer is None or timer.when() > due:
            if timer is not None:
                timer.cancel()
            self.timer = self.loop.call_at(due, self._expired)

    def _expired(self) -> None:
        self.timer = None
        if self.steps is None or self.working:
            return
        if time.monotonic() < self.due:  # the wait now is a later one than the timer was set for
            self.timer = self.loop.call_at(self.due, self._expired)
            return
        self._advance(None)

    # --- one connection -------------------------------------------------------------------------------

    def _serve(self) -> _Steps[None]:
        try:
            while (yield from self._one()):
                pass
        except _Gone:
            pass
        except OSError as error:  # a timeout no step turned into an answer: this client only
            logger.debug("HTTP client %s: %s", self.peer, error)
        yield from self._close()

    # --- one request ---------------------------------------------------------------------------------

    def _one(self) -> _Steps[bool]:
        """Serve one request; whether the connection stays open for another."""
        try:
            head = yield from self._read_head()
        except _Refused as refused:
            yield from self._send(self.app.refuse(None, refused.status, refused.message), close=True)
            return False
        close = _wants_close(head)
        try:
            length = body_length(head)
        except _Refused as refused:
            yield from self._send(self.app.refuse(head, refused.status, refused.message), close=True)
            return False
        expect_continue = head.version == "HTTP/1.1" and (head.get("expect") or "").lower() == "100-continue"
        refusal = self.app.admit(head)
        if refusal is None and length is not None and length > self.limits.max_body_bytes:
            refusal = self.app.refuse(
                head, HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"body exceeds {self.limits.max_body_bytes} bytes"
            )
            yield from self._send(refusal, close=True)
            return False
        lease: BodyLease | None = None
        if refusal is None:
            lease = self.budget.open(self.peer, length)
            if lease is None:
                refusal = self.app.refuse(head, HTTPStatus.SERVICE_UNAVAILABLE, _OVER_BUDGET)
        if lease is None:
            assert refusal is not None
            # A client waiting for 100 Continue may or may not send its body now: the connection cannot be reused.
            keep = not expect_continue and (yield from self._skip(length))
            sent = yield from self._send(refusal, close=close or not keep)
            return sent and keep and not close
        try:
            if expect_continue:  # only now, admitted: a client refused before its body never sends it
                self._write(b"HTTP/1.1 100 Continue\r\n\r\n")
            try:
                body = yield from self._read_body(length, lease)
            except _Refused as refused:
                yield from self._send(self.app.refuse(head, refused.status, refused.message), close=True)
                return False
            if self.app.inline(head, body):
                response = self.app.respond(head, body, lease)
            else:
                worker = self.server.submit(self.app.respond, head, body, lease)
                try:
                    response = yield from self._wait_for(worker)
                except GeneratorExit:  # the client is gone: the worker still holds the body's bytes until it ends
                    worker.add_done_callback(lambda _: lease.release())
                    raise
            sent = yield from self._send(response, close=close)
            return sent and not close
        finally:
            if not self.working:
                lease.release()

    def _read_head(self) -> _Steps[RequestHead]:
        buffer = self.buffer
        deadline: float | None = None  # until a first byte, the idle timeout (a keep-alive connection waits)
        scanned = 0
        while True:
            if buffer and deadline is None:  # from the first byte, even of the empty lines below
                deadline = time.monotonic() + self.limits.header_deadline_s
            while buffer[:2] == b"\r\n" or buffer[:1] == b"\n":  # empty lines before a request (RFC 9112 2.2)
                del buffer[: 2 if buffer[:1] == b"\r" else 1]
            found = _HEAD_END.search(buffer, scanned)
            if found is not None:
                self.idle = False
                data = bytes(buffer[: found.start()])
                del buffer[: found.end()]
                return parse_head(data, self.peer)
            if len(buffer) > MAX_HEAD_BYTES:
                raise _Refused(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, f"request head over {MAX_HEAD_BYTES} bytes")
            scanned = max(0, len(buffer) - 3)
            self.idle = not buffer
            try:
                more = yield deadline
            except TimeoutError as error:  # silent or trickling: closed without an answer, as servers do
                raise _Gone from error
            if not more:
                if buffer:  # a half-closed client can still read why
                    raise _Refused(HTTPStatus.BAD_REQUEST, "request head incomplete")
                raise _Gone

    def _read_body(self, length: int | None, lease: BodyLease) -> _Steps[bytes]:
        clock = _BodyClock(self.limits)
        try:
            if length is None:
                return (yield from self._read_chunked(clock, lease))
            body = bytearray()
            yield from self._read_exact(body, length, clock, lease)
            return bytes(body)
        except TimeoutError as error:
            raise _Refused(HTTPStatus.REQUEST_TIMEOUT, clock.why()) from error

    def _read_exact(self, body: bytearray, size: int, clock: _BodyClock, lease: BodyLease | None) -> _Steps[None]:
        """Append ``size`` bytes to ``body``, each piece counted in ``lease`` as it arrives."""
        buffer = self.buffer
        want = len(body) + size
        while len(body) < want:
            if not buffer and not (yield clock.deadline()):
                raise _Refused(HTTPStatus.BAD_REQUEST, f"body ended after {len(body)} of {want} bytes")
            take = min(len(buffer), want - len(body))
            if lease is not None and not lease.take(take):
                raise _Refused(HTTPStatus.SERVICE_UNAVAILABLE, _OVER_BUDGET)
            body += buffer[:take]
            del buffer[:take]
            clock.received += take

    def _line(self, clock: _BodyClock, what: str, start: re.Pattern[bytes] | None = None) -> _Steps[bytes]:
        """One line of a chunked body with its end; refused as soon as it cannot be a ``start`` line."""
        buffer = self.buffer
        scanned = 0
        while True:
            end = buffer.find(b"\n", scanned)
            if end >= 0:
                line = bytes(buffer[: end + 1])
                del buffer[: end + 1]
                return line
            if start is not None and not start.fullmatch(buffer):
                raise _Refused(HTTPStatus.BAD_REQUEST, f"malformed {what}")
            if len(buffer) > _MAX_LINE:
                raise _Refused(HTTPStatus.BAD_REQUEST, f"{what} over {_MAX_LINE} bytes")
            scanned = len(buffer)
            if not (yield clock.deadline()):
                raise _Refused(HTTPStatus.BAD_REQUEST, "chunked body ended early")

    def _read_chunked(self, clock: _BodyClock, lease: BodyLease) -> _Steps[bytes]:
        """A chunked body (RFC 9112 7.1); extensions and trailers are read and dropped."""
        limit = self.limits.max_body_bytes
        body = bytearray()
        while True:
            line = yield from self._line(clock, "chunk size line", _CHUNK_LINE_START)
            size_text = line.split(b";", 1)[0].rstrip(b"\r\n").rstrip(b" \t")
            if not _HEX.fullmatch(size_text):
                raise _Refused(HTTPStatus.BAD_REQUEST, "malformed chunk size line")
            size = int(size_text, 16)
            if size == 0:
                break
            if len(body) + size > limit:
                raise _Refused(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"body exceeds {limit} bytes")
            yield from self._read_exact(body, size, clock, lease)
            if (yield from self._line(clock, "chunk end")) not in (b"\r\n", b"\n"):
                raise _Refused(HTTPStatus.BAD_REQUEST, "a chunk overran its size")
        for _ in range(_MAX_TRAILERS):
            if (yield from self._line(clock, "trailer line")) in (b"\r\n", b"\n"):
                return bytes(body)
        raise _Refused(HTTPStatus.BAD_REQUEST, f"more than {_MAX_TRAILERS} trailer lines")

    def _skip(self, length: int | None) -> _Steps[bool]:
        """Read and discard a small declared body (refused before it was read), so the connection stays
        usable; a large or chunked one is not read at all (False: the connection closes)."""
        if length is None or length > min(self.limits.skip_max_bytes, self.limits.max_body_bytes):
            return False
        try:
            yield from self._read_exact(bytearray(), length, _BodyClock(self.limits), None)
        except (_Refused, TimeoutError) as error:  # the deadline or the client gone: answer if we can, then close
            logger.debug("HTTP client %s: body not skipped: %s", self.peer, error)
            return False
        return True

    def _wait_for(self, worker: concurrent.futures.Future[Response]) -> _Steps[Response]:
        """The worker's answer; meanwhile this connection reads nothing and has no deadline (its client waits)."""
        transport = self.transport
        assert transport is not None
        self.working = True
        transport.pause_reading()
        worker.add_done_callback(self._worker_done)
        try:
            while not worker.done():
                yield None
        finally:
            if worker.done():
                self.working = False
                if not transport.is_closing():
                    transport.resume_reading()
        return worker.result()

    def _worker_done(self, worker: concurrent.futures.Future[Response]) -> None:
        """On the worker's thread: resume the connection on the loop's (unless the server has stopped)."""
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits for this answer any more
            self.loop.call_soon_threadsafe(self._advance, True)

    # --- answers -------------------------------------------------------------------------------------

    def _write(self, data: bytes) -> bool:
        transport = self.transport
        if transport is None or transport.is_closing():
            return False
        transport.write(data)
        return True

    def _send(self, response: Response, close: bool) -> _Steps[bool]:
        """Write ``response``; False when the client is gone, or reads nothing for the read timeout."""
        lines = [
            f"HTTP/1.1 {response.status} {_REASONS.get(response.status, '')}",
            f"Date: {_http_date()}",
            "Server: otel-ofu-collector",
            f"Content-Length: {len(response.body)}",
            *(f"{key}: {value}" for key, value in response.headers),
        ]
        if close:  # tell the client, which may still be sending a body we will not read
            lines.append("Connection: close")
        if not self._write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + response.body):
            logger.debug("HTTP client %s left before its answer", self.peer)
            return False
        deadline = time.monotonic() + self.limits.read_timeout_s  # a client that reads nothing cannot hold us
        try:
            while not self.writable:
                yield deadline
        except TimeoutError:
            logger.debug("HTTP client %s read no answer for %g s", self.peer, self.limits.read_timeout_s)
            assert self.transport is not None
            self.transport.abort()
            return False
        return True

    def _close(self) -> _Steps[None]:
        """Close, first draining briefly what the client still sends (a refused body): closing on unread bytes
        resets the connection, and a reset can destroy the answer before the client reads it (Go's net/http and
        nginx linger likewise)."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if transport.get_extra_info("sslcontext") is None and transport.can_write_eof():
            try:
                transport.write_eof()  # after the answer, still buffered or not
            except OSError:  # the client has closed both ways already
                transport.abort()
                return
            end = time.monotonic() + LINGER_S
            drained = 0
            try:
                while drained < SKIP_MAX_BYTES:
                    drained += len(self.buffer)
                    self.buffer.clear()
                    if not (yield end):
                        break
            except TimeoutError:
                pass
        transport.close()
        # An answer the client never reads would hold the socket open forever: cut it off after the read timeout.
        self.loop.call_later(self.limits.read_timeout_s, transport.abort)


@attrs.define
class HttpServer:
    """Serves ``app`` on ``host:port`` (port 0 picks one; ``port`` tells which after ``start``), every connection
    on one event loop in a thread of its own."""

    app: HttpApp
    host: str
    port: int
    limits: Limits = attrs.field(factory=Limits)
    budget: BodyBudget = attrs.field(factory=BodyBudget)
    tls: ssl.SSLContext | None = None
    name: str = "http"  # its thread's name
    workers: int = 8  # the most requests answered off the loop at once (threads made as they are needed)
    connections: set[_Connection] = attrs.field(init=False, factory=set)  # touched on the loop's thread only
    _loop: asyncio.AbstractEventLoop | None = attrs.field(init=False, default=None)
    _server: asyncio.Server | None = attrs.field(init=False, default=None)
    _thread: threading.Thread | None = attrs.field(init=False, default=None)
    _pool: concurrent.futures.ThreadPoolExecutor | None = attrs.field(init=False, default=None)

    def submit(self, respond: Callable[..., Response], *args: object) -> concurrent.futures.Future[Response]:
        """``respond(*args)`` on a worker thread."""
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(self.workers, thread_name_prefix=f"{self.name}-worker")
        return self._pool.submit(respond, *args)

    def start(self) -> int:
        """Bind and serve; OSError when the port cannot be had (the caller names the address)."""
        host = self.host.strip("[]") or "0.0.0.0"
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, self.port))
        except OSError:
            sock.close()
            raise
        loop = asyncio.new_event_loop()
        self._server = loop.run_until_complete(
            loop.create_server(
                lambda: _Connection(self, loop),
                sock=sock,
                backlog=LISTEN_BACKLOG,
                ssl=self.tls,
                # The handshake is under the read timeout: a client that connects and never completes it holds
                # nothing but its socket.
                ssl_handshake_timeout=self.limits.read_timeout_s if self.tls is not None else None,
            )
        )
        self.port = int(sock.getsockname()[1])
        self._loop = loop
        self._thread = threading.Thread(target=self._run, args=(loop,), name=self.name, daemon=True)
        self._thread.start()
        return self.port

    def stop(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        self._loop = self._thread = None
        done = asyncio.run_coroutine_threadsafe(self._shutdown(), loop)
        with contextlib.suppress(TimeoutError):  # the loop is held: said below, once
            done.result(timeout=_STOP_S)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=_STOP_S)
        if thread.is_alive():  # a request answered on the loop is stuck inside the collector: it cannot be cut short
            logger.warning(
                "HTTP server %s: not stopped within %g s (a request stuck inside the collector); left to the exit",
                self.name,
                _STOP_S,
            )
        if self._pool is not None:  # a worker still in the collector ends there; its client is gone
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    def _run(self, loop: asyncio.AbstractEventLoop) -> None:
        """The loop's thread: serve until stopped, then close what is left and the loop. A stop that could not wait
        for the loop (a request stuck on it) is finished here, whenever that request comes out."""
        try:
            loop.run_forever()
            loop.run_until_complete(self._shutdown())
        finally:
            loop.close()

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        for connection in list(self.connections):
            connection.stop()
        for _ in range(20):  # the closes and aborts run their connection_lost soon after
            if not self.connections:
                break
            await asyncio.sleep(0.01)
        if self._server is not None:
            await self._server.wait_closed()
