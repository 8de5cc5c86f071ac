"""HTTP/1.1 on a socket, apart from what is served: heads, bodies, answers, and the guards of a public port.

An ``HttpServer`` accepts connections (a thread each, listen backlog ``LISTEN_BACKLOG``, TLS handshaken in
that thread) and runs requests through an ``HttpApp``, which sees a parsed ``RequestHead`` and a whole
body and returns a ``Response``; it knows nothing of sockets. The receiver's own app is OTLP
(``otlp_http``).

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

Why not h11 (a well-kept HTTP/1.1 parser): measured with the same OTLP app on the same 2-core machine
(``benchmarks/http_receiver_cost.py``, producer-sized requests, 9 interleaved rounds, medians), the server
spent 74 us of CPU per request on this module, 130 us on h11 with the least connection loop it allows
(no deadlines, no minimum rate: a floor), and 103 us on the http.server this replaced. And h11 takes
both Content-Length and chunked at once, a Content-Length of 5,000 digits is a 400 to it (413 here), a
POST without framing an empty body (411 here), all three needing checks of our own in front of it, and
it waits for a junk chunk-size line to end, which nothing in front of it can change.
"""

from __future__ import annotations

import email.utils
import logging
import re
import socket
import socketserver
import ssl
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from http import HTTPStatus
from typing import Any, Final, Protocol, cast

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
_DIGITS = re.compile(r"[0-9]+")
_HEX = re.compile(rb"[0-9A-Fa-f]+")
# What a chunk-size line may look like before its end: hex digits, then optional whitespace and extensions.
_CHUNK_LINE_START = re.compile(rb"[0-9A-Fa-f]*(?:[ \t]*;[^\r\n]*|[ \t]*)\r?")
_OVER_BUDGET = "overloaded (request bodies being received), retry later"
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})  # a request of these without framing is 411


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
    """What a server serves. Called from connection threads, concurrently."""

    def admit(self, head: RequestHead) -> Response | None:
        """Before the body is read: a refusal (401, 404, ...), or None to receive the body."""
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


class _Wire:
    """The connection's received bytes: a buffer over the socket, each recv under a deadline."""

    __slots__ = ("buffer", "idle_s", "sock")

    def __init__(self, sock: socket.socket, idle_s: float) -> None:
        self.sock = sock
        self.idle_s = idle_s
        self.buffer = bytearray()

    def recv(self, deadline: float | None, size: int = _HEAD_PIECE) -> bool:
        """Append one recv of at most ``size`` bytes to the buffer, waiting no longer than ``deadline`` (and the
        idle timeout); False at the end of the stream. TimeoutError once the deadline has passed."""
        timeout = self.idle_s
        if deadline is not None:
            timeout = min(timeout, deadline - time.monotonic())
            if timeout <= 0:
                raise TimeoutError("deadline passed")
        self.sock.settimeout(timeout)
        data = self.sock.recv(size)
        self.buffer += data
        return bool(data)


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
    lines = data.split(b"\n")
    if len(lines) > MAX_HEADERS + 1:
        raise _Refused(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, f"more than {MAX_HEADERS} header lines")
    parts = lines[0].rstrip(b"\r").split(b" ")
    if len(parts) != 3 or not _TOKEN.fullmatch(parts[0]) or not _TARGET.fullmatch(parts[1]):
        raise _Refused(HTTPStatus.BAD_REQUEST, "malformed request line")
    version = _VERSION.fullmatch(parts[2])
    if version is None:
        raise _Refused(HTTPStatus.BAD_REQUEST, "malformed request line")
    if version.group(1) != b"1":
        raise _Refused(HTTPStatus.HTTP_VERSION_NOT_SUPPORTED, "only HTTP/1.0 and HTTP/1.1 are served")
    headers: dict[str, list[str]] = {}
    for line in lines[1:]:
        line = line.rstrip(b"\r")
        name, colon, value = line.partition(b":")
        if not colon or not _TOKEN.fullmatch(name):  # a folded line starts with whitespace: no token
            raise _Refused(HTTPStatus.BAD_REQUEST, "malformed header line")
        value = value.strip(b" \t")
        if _FIELD_CTL.search(value):
            raise _Refused(HTTPStatus.BAD_REQUEST, "control character in a header value")
        headers.setdefault(name.decode("ascii").lower(), []).append(value.decode("latin-1"))
    # A later 1.x minor is served as 1.1, the highest this server speaks (RFC 9110 2.5).
    served = "HTTP/1.0" if version.group(2) == b"0" else "HTTP/1.1"
    head = RequestHead(parts[0].decode("ascii"), parts[1].decode("ascii"), served, headers, peer)
    if head.version != "HTTP/1.0" and "host" not in headers:
        raise _Refused(HTTPStatus.BAD_REQUEST, "Host header required (RFC 9112 3.2)")
    return head


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


class _Connection:
    """One client connection: requests in turn until either side closes (``serve``)."""

    def __init__(self, sock: socket.socket, peer: str, server: HttpServer) -> None:
        self.sock = sock
        self.peer = peer
        self.app = server.app
        self.limits = server.limits
        self.budget = server.budget
        self.wire = _Wire(sock, server.limits.read_timeout_s)

    def serve(self) -> None:
        try:
            if isinstance(self.sock, ssl.SSLSocket):
                self.sock.settimeout(self.limits.read_timeout_s)
                self.sock.do_handshake()
            while self._one():
                pass
        except _Gone:
            pass
        except OSError as error:  # reset, TLS failures, a timeout while answering: this client only
            logger.debug("HTTP client %s: %s", self.peer, error)
        self._close()

    # --- one request ---------------------------------------------------------------------------------

    def _one(self) -> bool:
        """Serve one request; whether the connection stays open for another."""
        try:
            head = self._read_head()
        except _Refused as refused:
            self._send(self.app.refuse(None, refused.status, refused.message), close=True)
            return False
        close = _wants_close(head)
        try:
            length = body_length(head)
        except _Refused as refused:
            self._send(self.app.refuse(head, refused.status, refused.message), close=True)
            return False
        expect_continue = head.version == "HTTP/1.1" and (head.get("expect") or "").lower() == "100-continue"
        refusal = self.app.admit(head)
        if refusal is None and length is not None and length > self.limits.max_body_bytes:
            self._send(
                self.app.refuse(
                    head, HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"body exceeds {self.limits.max_body_bytes} bytes"
                ),
                close=True,
            )
            return False
        lease: BodyLease | None = None
        if refusal is None:
            lease = self.budget.open(self.peer, length)
            if lease is None:
                refusal = self.app.refuse(head, HTTPStatus.SERVICE_UNAVAILABLE, _OVER_BUDGET)
        if lease is None:
            assert refusal is not None
            # A client waiting for 100 Continue may or may not send its body now: the connection cannot be reused.
            keep = not expect_continue and self._skip(length)
            return self._send(refusal, close=close or not keep) and keep and not close
        try:
            if expect_continue:  # only now, admitted: a client refused before its body never sends it
                self.sock.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
            try:
                body = self._read_body(length, lease)
            except _Refused as refused:
                self._send(self.app.refuse(head, refused.status, refused.message), close=True)
                return False
            response = self.app.respond(head, body, lease)
            return self._send(response, close=close) and not close
        finally:
            lease.release()

    def _read_head(self) -> RequestHead:
        wire = self.wire
        buffer = wire.buffer
        deadline: float | None = None  # until a first byte, the idle timeout (a keep-alive connection waits)
        scanned = 0
        while True:
            if buffer and deadline is None:  # from the first byte, even of the empty lines below
                deadline = time.monotonic() + self.limits.header_deadline_s
            while buffer[:2] == b"\r\n" or buffer[:1] == b"\n":  # empty lines before a request (RFC 9112 2.2)
                del buffer[: 2 if buffer[:1] == b"\r" else 1]
            found = _HEAD_END.search(buffer, scanned)
            if found is not None:
                data = bytes(buffer[: found.start()])
                del buffer[: found.end()]
                return parse_head(data, self.peer)
            if len(buffer) > MAX_HEAD_BYTES:
                raise _Refused(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, f"request head over {MAX_HEAD_BYTES} bytes")
            scanned = max(0, len(buffer) - 3)
            try:
                more = wire.recv(deadline)
            except TimeoutError as error:  # silent or trickling: closed without an answer, as servers do
                raise _Gone from error
            if not more:
                if buffer:  # a half-closed client can still read why
                    raise _Refused(HTTPStatus.BAD_REQUEST, "request head incomplete")
                raise _Gone

    def _read_body(self, length: int | None, lease: BodyLease) -> bytes:
        clock = _BodyClock(self.limits)
        try:
            if length is None:
                return self._read_chunked(clock, lease)
            body = bytearray()
            self._read_exact(body, length, clock, lease)
            return bytes(body)
        except TimeoutError as error:
            raise _Refused(HTTPStatus.REQUEST_TIMEOUT, clock.why()) from error
        finally:
            self.sock.settimeout(self.limits.read_timeout_s)

    def _read_exact(self, body: bytearray, size: int, clock: _BodyClock, lease: BodyLease | None) -> None:
        """Append ``size`` bytes to ``body``, each piece counted in ``lease`` as it arrives."""
        wire = self.wire
        buffer = wire.buffer
        want = len(body) + size
        while len(body) < want:
            if not buffer and not wire.recv(clock.deadline(), min(want - len(body), _PIECE)):
                raise _Refused(HTTPStatus.BAD_REQUEST, f"body ended after {len(body)} of {want} bytes")
            take = min(len(buffer), want - len(body))
            if lease is not None and not lease.take(take):
                raise _Refused(HTTPStatus.SERVICE_UNAVAILABLE, _OVER_BUDGET)
            body += buffer[:take]
            del buffer[:take]
            clock.received += take

    def _line(self, clock: _BodyClock, what: str, start: re.Pattern[bytes] | None = None) -> bytes:
        """One line of a chunked body with its end; refused as soon as it cannot be a ``start`` line."""
        wire = self.wire
        buffer = wire.buffer
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
            if not wire.recv(clock.deadline()):
                raise _Refused(HTTPStatus.BAD_REQUEST, "chunked body ended early")

    def _read_chunked(self, clock: _BodyClock, lease: BodyLease) -> bytes:
        """A chunked body (RFC 9112 7.1); extensions and trailers are read and dropped."""
        limit = self.limits.max_body_bytes
        body = bytearray()
        while True:
            line = self._line(clock, "chunk size line", _CHUNK_LINE_START)
            size_text = line.split(b";", 1)[0].rstrip(b"\r\n").rstrip(b" \t")
            if not _HEX.fullmatch(size_text):
                raise _Refused(HTTPStatus.BAD_REQUEST, "malformed chunk size line")
            size = int(size_text, 16)
            if size == 0:
                break
            if len(body) + size > limit:
                raise _Refused(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"body exceeds {limit} bytes")
            self._read_exact(body, size, clock, lease)
            if self._line(clock, "chunk end") not in (b"\r\n", b"\n"):
                raise _Refused(HTTPStatus.BAD_REQUEST, "a chunk overran its size")
        for _ in range(_MAX_TRAILERS):
            if self._line(clock, "trailer line") in (b"\r\n", b"\n"):
                return bytes(body)
        raise _Refused(HTTPStatus.BAD_REQUEST, f"more than {_MAX_TRAILERS} trailer lines")

    def _skip(self, length: int | None) -> bool:
        """Read and discard a small declared body (refused before it was read), so the connection stays
        usable; a large or chunked one is not read at all (False: the connection closes)."""
        if length is None or length > min(self.limits.skip_max_bytes, self.limits.max_body_bytes):
            return False
        discarded = bytearray()
        try:
            self._read_exact(discarded, length, _BodyClock(self.limits), None)
        except (_Refused, OSError) as error:  # the deadline or the client gone: answer if we can, then close
            logger.debug("HTTP client %s: body not skipped: %s", self.peer, error)
            return False
        finally:
            self.sock.settimeout(self.limits.read_timeout_s)
        return True

    # --- answers -------------------------------------------------------------------------------------

    def _send(self, response: Response, close: bool) -> bool:
        """Write ``response``; False when the client is gone."""
        lines = [
            f"HTTP/1.1 {response.status} {_REASONS.get(response.status, '')}",
            f"Date: {_http_date()}",
            "Server: otel-ofu-collector",
            f"Content-Length: {len(response.body)}",
            *(f"{key}: {value}" for key, value in response.headers),
        ]
        if close:  # tell the client, which may still be sending a body we will not read
            lines.append("Connection: close")
        data = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + response.body
        try:
            self.sock.settimeout(self.limits.read_timeout_s)  # a client that reads nothing cannot hold us
            self.sock.sendall(data)
        except OSError as error:
            logger.debug("HTTP client %s left before its answer: %s", self.peer, error)
            return False
        return True

    def _close(self) -> None:
        """Close, first draining briefly what the client still sends (a refused body): closing on unread
        bytes resets the connection, and a reset can destroy the answer before the client reads it (Go's
        net/http and nginx linger likewise)."""
        sock = self.sock
        try:
            if not isinstance(sock, ssl.SSLSocket):
                sock.shutdown(socket.SHUT_WR)
                end = time.monotonic() + LINGER_S
                drained = 0
                while drained < SKIP_MAX_BYTES and (left := end - time.monotonic()) > 0:
                    sock.settimeout(left)
                    piece = sock.recv(64 * 1024)
                    if not piece:
                        break
                    drained += len(piece)
        except OSError:
            pass
        sock.close()


class _TcpServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = LISTEN_BACKLOG
    owner: HttpServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        # socketserver prints a traceback on stderr for any error: one client's failure is its own concern.
        logger.error("HTTP connection from %s failed", client_address, exc_info=sys.exc_info())


class _TcpServer6(_TcpServer):
    address_family = socket.AF_INET6


class _Handler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        server = cast(_TcpServer, self.server).owner
        _Connection(cast(socket.socket, self.request), str(self.client_address[0]), server).serve()


@attrs.define
class HttpServer:
    """Serves ``app`` on ``host:port`` (port 0 picks one; ``port`` tells which after ``start``)."""

    app: HttpApp
    host: str
    port: int
    limits: Limits = attrs.field(factory=Limits)
    budget: BodyBudget = attrs.field(factory=BodyBudget)
    tls: ssl.SSLContext | None = None
    name: str = "http"  # its thread's name
    _server: _TcpServer | None = attrs.field(init=False, default=None)
    _thread: threading.Thread | None = attrs.field(init=False, default=None)

    def start(self) -> int:
        """Bind and serve; OSError when the port cannot be had (the caller names the address)."""
        host = self.host.strip("[]") or "0.0.0.0"
        server_class = _TcpServer6 if ":" in host else _TcpServer
        server = server_class((host, self.port), _Handler)
        server.owner = self
        if self.tls is not None:
            # The handshake runs in each connection's own thread, under the read timeout: done on accept, one
            # client that connects and never completes it would stall all intake.
            server.socket = self.tls.wrap_socket(server.socket, server_side=True, do_handshake_on_connect=False)
        self._server = server
        self.port = int(server.server_address[1])
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, name=self.name, daemon=True
        )
        self._thread.start()
        return self.port

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join()
            self._thread = None
