"""A stand-in for a vendor's Prometheus exporter on loopback: a real HTTP server serving whatever page a test puts
in its routes, for the dcgm-exporter and AMD Device Metrics Exporter sources' tests."""

from __future__ import annotations

import contextlib
import http.server
import threading
from collections.abc import Iterator

import attrs


@attrs.define
class Route:
    body: str = ""
    status: int = 200
    stall: bool = False


@attrs.define
class ExporterServer:
    """A stand-in dcgm-exporter: serves whatever the test puts in ``routes``."""

    routes: dict[str, Route]
    server: http.server.ThreadingHTTPServer
    release: threading.Event

    def url(self, path: str = "/metrics") -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}{path}"

    def serve(self, body: str, path: str = "/metrics") -> str:
        self.routes[path] = Route(body)
        return self.url(path)


@contextlib.contextmanager
def serving() -> Iterator[ExporterServer]:
    """A started server on 127.0.0.1 port 0, shut down on exit (each test module's ``exporter`` fixture)."""
    routes: dict[str, Route] = {}
    release = threading.Event()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            route = routes.get(self.path)
            if route is None:
                self.send_error(404)
                return
            if route.stall:
                release.wait(10)  # the client gives up long before; teardown releases us
                return
            data = route.body.encode()
            self.send_response(route.status)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *_: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)
    thread.start()
    try:
        yield ExporterServer(routes, server, release)
    finally:
        release.set()
        server.shutdown()
        server.server_close()
        thread.join(5)


class Ticks:
    """An injectable clock that moves 10 s per call."""

    def __init__(self) -> None:
        self.now = 1_000_000_000_000

    def __call__(self) -> int:
        self.now += 10_000_000_000
        return self.now
