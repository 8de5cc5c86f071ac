"""A liveness endpoint: ``GET /healthz`` answers 200 while the process's main loop keeps beating, 503 once it
has not beaten for longer than its bound (a source read or a flush that hangs), which is what a Kubernetes
liveness probe restarts a container for. ``otel-ofu run --health-port`` and ``otel-ofu collector
--health-port`` serve it (``otel_ofu.ports``: 9467 and 9468 by convention).

A port that answers is not enough for a probe: the listener thread of a process whose loop is stuck still
accepts connections. So the answer is the age of the loop's last beat: the producer beats after every read,
the collector after every flush of its windows. Until the first beat, the process's start counts as one.
The body is one line of plain text saying why.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Final

import attrs

log = logging.getLogger(__name__)

HEALTH_PATHS: Final = ("/healthz", "/livez")
MIN_BOUND_S: Final = 30.0  # a loop a little late (a slow scrape, a GC pause) is not dead


@attrs.define
class Heartbeat:
    """When a loop last beat; stale (unhealthy) once older than ``bound_s``. Thread-safe: a float store."""

    bound_s: float
    what: str  # the loop, in words: "the sampling loop"
    clock: Callable[[], float] = time.monotonic
    _last: float = attrs.field(init=False)
    _beats: int = attrs.field(init=False, default=0)

    def __attrs_post_init__(self) -> None:
        self._last = self.clock()

    def beat(self, *_args: object) -> None:
        """A beat (callable as a producer observer, which passes the interval's values)."""
        self._last = self.clock()
        self._beats += 1

    def check(self) -> tuple[bool, str]:
        """(healthy, the one line that says so)."""
        age = self.clock() - self._last
        if age > self.bound_s:
            return False, f"{self.what} has not run for {age:.0f} s (bound {self.bound_s:g} s)"
        if not self._beats:
            return True, f"ok: starting, {self.what} has not run yet"
        return True, f"ok: {self.what} ran {age:.1f} s ago"


def loop_bound_s(interval_s: float) -> float:
    """How long a loop of ``interval_s`` may go without a beat: three intervals, at least ``MIN_BOUND_S``."""
    return max(3 * interval_s, MIN_BOUND_S)


class _Handler(BaseHTTPRequestHandler):
    check: Callable[[], tuple[bool, str]]

    def do_GET(self) -> None:
        if self.path.split("?", 1)[0] not in HEALTH_PATHS:
            self._answer(404, f"not found: the health endpoint is {HEALTH_PATHS[0]}")
            return
        try:
            healthy, line = type(self).check()
        except Exception as error:  # a check that fails is an unhealthy answer, not a dropped connection
            healthy, line = False, f"the health check failed: {type(error).__name__}: {error}"
        self._answer(200 if healthy else 503, line)

    def _answer(self, status: int, line: str) -> None:
        body = (line + "\n").encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        """Probes every few seconds are not news."""


@attrs.define
class HealthEndpoint:
    """``/healthz`` on ``host:port`` (port 0: any free one, then ``port`` says which), on a daemon thread."""

    check: Callable[[], tuple[bool, str]]
    port: int
    host: str = "127.0.0.1"
    _server: ThreadingHTTPServer | None = attrs.field(init=False, default=None)

    def start(self) -> None:
        """Listen; OSError when the port cannot be had."""
        handler = type("HealthHandler", (_Handler,), {"check": staticmethod(self.check)})
        server = ThreadingHTTPServer((self.host, self.port), handler)
        server.daemon_threads = True
        self._server = server
        self.port = int(server.server_address[1])
        threading.Thread(target=server.serve_forever, name="otel-ofu-health", daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}{HEALTH_PATHS[0]}"

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
