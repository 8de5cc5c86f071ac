"""One bounded HTTP GET: an overall deadline, a size limit, cancellable (the Kubernetes pod lookups, the vendor
exporters' pages, a collector's report feed).

A per-read timeout does not bound a request: a server that drips a byte every 2 s never trips a 5 s read
timeout and holds the caller for as long as it likes, and one that never ends its answer fills the caller's
memory. Here every socket of the request, from the TCP connect through the TLS handshake, the headers and the
body, is shut down when the deadline passes or when ``Cancel.cancel`` is called (a pod directory closing, a
producer told to stop), which ends whatever read is blocked on it; and no more than ``max_bytes`` of body is
ever held.
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import ssl
import threading
import urllib.parse
from typing import Final

import attrs


class GetError(Exception):
    """The GET as a whole failed; the message says why in one line, with its URL (``reason``: without it).
    ``timed_out``: the deadline passed (the server was silent or too slow), not an error it answered with."""

    def __init__(self, where: str, reason: str, *, timed_out: bool = False) -> None:
        super().__init__(f"{where}: {reason}")
        self.reason = reason
        self.timed_out = timed_out


READ_CHUNK: Final = 64 * 1024


def first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else ""


@attrs.define
class Cancel:
    """The sockets of requests in flight, shut down together on ``cancel`` (thread-safe)."""

    # Reentrant: ``cancel`` may run in a signal handler on the very thread that holds it in ``track``.
    _lock: threading.RLock = attrs.field(factory=threading.RLock, init=False)
    _sockets: list[socket.socket] = attrs.field(factory=list, init=False)
    reason: str | None = attrs.field(default=None, init=False)
    timed_out: bool = attrs.field(default=False, init=False)  # cancelled by the deadline, not by a caller

    def track(self, sock: socket.socket) -> None:
        with self._lock:
            if self.reason is None:
                self._sockets.append(sock)
                return
        _shut(sock)  # cancelled while it connected

    def cancel(self, reason: str, *, timed_out: bool = False) -> None:
        with self._lock:
            if self.reason is None:
                self.reason = reason
                self.timed_out = timed_out
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            _shut(sock)


def _shut(sock: socket.socket) -> None:
    # socket.socket's own shutdown, also for an SSLSocket: it wakes a read blocked on the descriptor in
    # another thread without touching the TLS object that read is using.
    with contextlib.suppress(OSError):  # already closed, or never connected
        socket.socket.shutdown(sock, socket.SHUT_RDWR)


class _Connection(http.client.HTTPConnection):
    """HTTP, or HTTPS with ``tls``, whose sockets ``cancel`` tracks before the TLS handshake starts."""

    def __init__(self, host: str, port: int, *, timeout: float, tls: ssl.SSLContext | None, cancel: Cancel) -> None:
        super().__init__(host, port, timeout=timeout)
        self._tls = tls
        self._cancel = cancel

    def connect(self) -> None:
        super().connect()
        self._cancel.track(self.sock)
        if self._tls is not None:
            wrapped = self._tls.wrap_socket(self.sock, server_hostname=self.host, do_handshake_on_connect=False)
            self._cancel.track(wrapped)
            self.sock = wrapped
            wrapped.do_handshake()


@attrs.frozen
class Answer:
    status: int
    body: bytes | bytearray  # as read: a 64 MiB list is not copied once more
    content_type: str = ""  # the Content-Type header ("" when none)
    reason: str = ""  # the status line's reason phrase


def get(
    url: str,
    *,
    headers: dict[str, str],
    deadline_s: float,
    max_bytes: int,
    tls: ssl.SSLContext | None,
    cancel: Cancel | None = None,
) -> Answer:
    """GET ``url``: the status and at most ``max_bytes`` of body, all within ``deadline_s``.

    Raises a one-line ``GetError`` when it cannot: unreachable, TLS refused, the deadline passed,
    the body is larger than ``max_bytes`` (a non-200 answer's body is cut to its first 2 KiB instead), or
    ``cancel`` was cancelled.
    """
    parts = urllib.parse.urlsplit(url)
    https = parts.scheme == "https"
    where = f"{parts.scheme}://{parts.netloc}{parts.path}"
    host = parts.hostname or ""
    try:
        port = parts.port or (443 if https else 80)
    except ValueError as error:
        raise GetError(where, str(error)) from None
    cancel = Cancel() if cancel is None else cancel
    connection = _Connection(host, port, timeout=deadline_s, tls=tls if https else None, cancel=cancel)
    watchdog = threading.Timer(
        deadline_s, cancel.cancel, args=(f"no complete answer within {deadline_s:g} s",), kwargs={"timed_out": True}
    )
    watchdog.daemon = True
    watchdog.start()
    try:
        target = parts.path or "/"
        connection.request("GET", f"{target}?{parts.query}" if parts.query else target, headers=headers)
        response = connection.getresponse()
        limit = max_bytes if response.status == 200 else 2048
        declared = response.getheader("Content-Length", "")
        if response.status == 200 and declared.strip().isdigit() and int(declared) > max_bytes:
            raise GetError(where, f"answer of {int(declared)} bytes, larger than {max_bytes}")
        body = bytearray()
        while len(body) <= limit:
            chunk = response.read(READ_CHUNK)
            if not chunk:
                break
            body += chunk
        if cancel.reason is not None:  # the socket was shut down mid-body: what came is not the answer
            raise GetError(where, cancel.reason, timed_out=cancel.timed_out)
        if len(body) > limit and response.status == 200:
            raise GetError(where, f"answer larger than {max_bytes} bytes")
        if len(body) > limit:
            del body[limit:]
        elif response.length:  # the connection ended before the Content-Length it promised (read() says nothing)
            raise GetError(where, f"IncompleteRead({len(body)} bytes read, {response.length} more expected)")
        return Answer(response.status, body, response.getheader("Content-Type", "") or "", response.reason or "")
    except GetError:
        raise
    except (OSError, http.client.HTTPException, ValueError) as error:
        if cancel.reason is not None:
            raise GetError(where, cancel.reason, timed_out=cancel.timed_out) from None
        raise GetError(where, first_line(str(error)) or type(error).__name__) from None
    finally:
        watchdog.cancel()
        connection.close()
