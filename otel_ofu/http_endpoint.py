"""A small HTTP/1.1 server for the read-only endpoints: the producer's and the collector's Prometheus ``/metrics`` and
the collector's report feed. What it serves is a ``Reply`` from a handler; what it guards is the process.

A scraper's port is open to whoever can reach it, and http.server gives every connection a thread of its own with
no timeout: 1,100 idle connections took 1,025 threads and every descriptor of a process at ``ulimit -n 1024``, and
no producer could connect to the collector any more. Here:

- at most ``max_connections`` connections are served at once, and at most a quarter of them from one address; a
  connection beyond is answered 503 and closed at once, with no thread (its descriptor is free again at once);
- a connection must complete a request head within ``idle_timeout_s`` of its arrival or of its previous answer
  (an idle or trickling client is closed);
- an answer is written a piece at a time, each piece within ``send_timeout_s`` and the whole within
  ``answer_deadline_s``: a reader that takes nothing is cut, and what it held (references to the pages and lines
  of the moment it asked, never copies) is freed with it;
- a client that leaves (a reset, a broken pipe) costs one debug line, never a traceback.
"""

from __future__ import annotations

import email.utils
import logging
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Sequence
from typing import Final

import attrs

logger = logging.getLogger(__name__)

DEFAULT_MAX_CONNECTIONS: Final = 64
IDLE_TIMEOUT_S: Final = 10.0
SEND_TIMEOUT_S: Final = 10.0
ANSWER_DEADLINE_S: Final = 60.0
LISTEN_BACKLOG: Final = 4096  # as gRPC's: a burst of scrapes waits to be accepted instead of being reset
MAX_HEAD_BYTES: Final = 16 * 1024
_PIECE: Final = 1024 * 1024
_BUSY: Final = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\nRetry-After: 1\r\n\r\n"
_REASONS: Final = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 431: "Too Large"}


@attrs.frozen
class Request:
    path: str
    query: str


@attrs.frozen
class Reply:
    """An answer: its parts are written in turn, never joined (a feed's lines are shared, not copied per reader)."""

    status: int
    content_type: str
    parts: Sequence[bytes]
    headers: Sequence[tuple[str, str]] = ()

    @classmethod
    def text(cls, status: int, text: str) -> Reply:
        return cls(status, "text/plain; charset=utf-8", (text.encode(),))


Handler = Callable[[Request], Reply]


class _Gone(Exception):
    """The client left or went silent: nothing more to do on this connection."""


@attrs.define
class HttpEndpoint:
    """Serves ``handler`` on ``host:port`` (port 0: a free one, ``port`` once started) under the bounds above."""

    handler: Handler
    host: str = "127.0.0.1"
    port: int = 0
    name: str = "http"  # its threads' names
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    idle_timeout_s: float = IDLE_TIMEOUT_S
    send_timeout_s: float = SEND_TIMEOUT_S
    answer_deadline_s: float = ANSWER_DEADLINE_S
    refused: int = attrs.field(init=False, default=0)  # connections answered 503 at the bound
    _listener: socket.socket | None = attrs.field(init=False, default=None)
    _thread: threading.Thread | None = attrs.field(init=False, default=None)
    _stopping: threading.Event = attrs.field(init=False, factory=threading.Event)
    _lock: threading.Lock = attrs.field(init=False, factory=threading.Lock)
    _open: dict[str, int] = attrs.field(init=False, factory=dict)  # connections served now, by address
    _served: int = attrs.field(init=False, default=0)

    @property
    def connections(self) -> int:
        """Connections being served now."""
        return self._served

    def start(self) -> int:
        """Bind and serve; OSError when the port cannot be had (the caller names the address)."""
        host = self.host.strip("[]") or "0.0.0.0"
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        listener = socket.create_server((host, self.port), family=family, backlog=LISTEN_BACKLOG)
        listener.settimeout(0.2)  # how soon the accept loop sees a stop
        self._listener = listener
        self.port = int(listener.getsockname()[1])
        self._thread = threading.Thread(target=self._accept, name=self.name, daemon=True)
        self._thread.start()
        return self.port

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._listener is not None:
            self._listener.close()
            self._listener = None

    # --- connections -------------------------------------------------------------------------------------

    def _accept(self) -> None:
        listener = self._listener
        assert listener is not None
        per_address = max(1, self.max_connections // 4)
        while not self._stopping.is_set():
            try:
                connection, address = listener.accept()
            except TimeoutError:
                continue
            except OSError as error:  # out of descriptors, say: this one is not served, the next may be
                logger.debug("%s: accept failed: %s", self.name, error)
                time.sleep(0.05)
                continue
            peer = str(address[0])
            with self._lock:
                admitted = self._served < self.max_connections and self._open.get(peer, 0) < per_address
                if admitted:
                    self._served += 1
                    self._open[peer] = self._open.get(peer, 0) + 1
                else:
                    self.refused += 1
            if not admitted:
                _refuse(connection)
                continue
            threading.Thread(target=self._serve, args=(connection, peer), name=f"{self.name}-conn", daemon=True).start()

    def _serve(self, connection: socket.socket, peer: str) -> None:
        try:
            buffer = bytearray()
            while not self._stopping.is_set():
                head = self._read_head(connection, buffer)
                close = self._answer(connection, head)
                if close:
                    break
        except _Gone:
            pass
        except OSError as error:  # reset, broken pipe, a timeout while writing: this client only
            logger.debug("%s: client %s: %s", self.name, peer, error)
        finally:
            connection.close()
            with self._lock:
                self._served -= 1
                left = self._open[peer] - 1
                if left:
                    self._open[peer] = left
                else:
                    del self._open[peer]

    def _read_head(self, connection: socket.socket, buffer: bytearray) -> bytes:
        """The next request's head, within ``idle_timeout_s`` from now; _Gone when the client leaves or is slow."""
        deadline = time.monotonic() + self.idle_timeout_s
        while True:
            end = buffer.find(b"\r\n\r\n")
            if end >= 0:
                head = bytes(buffer[:end])
                del buffer[: end + 4]
                return head
            if len(buffer) > MAX_HEAD_BYTES:
                self._send(connection, Reply.text(431, "request head too large\n"), close=True, head_only=False)
                raise _Gone
            left = deadline - time.monotonic()
            if left <= 0:
                raise _Gone
            connection.settimeout(left)
            try:
                data = connection.recv(65536)
            except TimeoutError:
                raise _Gone from None
            if not data:
                raise _Gone
            buffer += data

    def _answer(self, connection: socket.socket, head: bytes) -> bool:
        """Answer one request; whether the connection closes after it."""
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            self._send(connection, Reply.text(400, "malformed request line\n"), close=True, head_only=False)
            return True
        method, target, version = parts
        close = version == "HTTP/1.0" or any(
            line.lower().startswith("connection:") and "close" in line.lower() for line in lines[1:]
        )
        if method not in ("GET", "HEAD"):
            reply = Reply.text(405, "only GET is served\n")
        else:
            url = urllib.parse.urlsplit(target)
            try:
                reply = self.handler(Request(url.path, url.query))
            except Exception as error:  # a defect of the handler costs this answer only
                logger.error("%s: answering %s failed: %s", self.name, url.path, error)
                logger.debug("%s: the failure", self.name, exc_info=True)
                reply = Reply.text(500, "internal error\n")
        self._send(connection, reply, close=close, head_only=method == "HEAD")
        return close

    def _send(self, connection: socket.socket, reply: Reply, *, close: bool, head_only: bool) -> None:
        length = sum(len(part) for part in reply.parts)
        lines = [
            f"HTTP/1.1 {reply.status} {_REASONS.get(reply.status, '')}",
            f"Date: {email.utils.formatdate(usegmt=True)}",
            f"Content-Type: {reply.content_type}",
            f"Content-Length: {length}",
            *(f"{key}: {value}" for key, value in reply.headers),
        ]
        if close:
            lines.append("Connection: close")
        pieces: list[bytes | memoryview] = [("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")]
        deadline = time.monotonic() + self.answer_deadline_s
        for part in () if head_only else reply.parts:
            view = memoryview(part)
            pieces.extend(view[at : at + _PIECE] for at in range(0, len(view), _PIECE))
        for piece in pieces:
            left = deadline - time.monotonic()
            if left <= 0:
                raise _Gone
            connection.settimeout(min(self.send_timeout_s, left))
            try:
                connection.sendall(piece)
            except TimeoutError:
                raise _Gone from None


def _refuse(connection: socket.socket) -> None:
    """Answer 503 without waiting (a full send buffer is not ours to wait on) and close."""
    try:
        connection.setblocking(False)
        connection.send(_BUSY)
    except OSError:
        pass
    finally:
        connection.close()
