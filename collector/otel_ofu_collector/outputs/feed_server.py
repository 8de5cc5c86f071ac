"""The live feed: the last closed windows as JSON lines over HTTP, for ``otel-ofu report --live``.

``ReportFeed`` serves them at ``GET /reports.jsonl`` (``?since=END_NS`` for only the windows that ended
after it, so a poller fetches each once); ``feed_client`` reads it.
"""

from __future__ import annotations

import logging
import threading
import urllib.parse
from collections import deque
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Final

import attrs

from otel_ofu_collector.outputs.record_codec import encode_lines
from otel_ofu_collector.receivers.base import LISTEN_BACKLOG
from otel_ofu_collector.results import WindowReport

logger = logging.getLogger(__name__)

FEED_PATH: Final = "/reports.jsonl"
FEED_CONTENT_TYPE: Final = "application/jsonl; charset=utf-8"
DEFAULT_FEED_KEEP: Final = 1440  # a day of one-minute windows


@attrs.define
class ReportFeed:
    """Serves the last ``keep`` closed windows as JSON lines at ``GET /reports.jsonl``; a window consumer.

    ``?since=END_NS`` returns only the windows that ended after END_NS, so a poller fetches each once.
    """

    host: str = "127.0.0.1"
    port: int = 0
    keep: int = attrs.field(default=DEFAULT_FEED_KEEP)
    _lines: deque[tuple[int, str]] = attrs.field(init=False)
    _newest: tuple[WindowReport, str] | None = attrs.field(init=False, default=None)  # with its per-GPU means
    _lock: threading.Lock = attrs.field(init=False, factory=threading.Lock)
    _server: ThreadingHTTPServer | None = attrs.field(init=False, default=None)
    _thread: threading.Thread | None = attrs.field(init=False, default=None)

    @keep.validator
    def _check_keep(self, _attribute: object, value: int) -> None:
        if value < 1:
            raise ValueError(f"keep must be at least 1, got {value!r}")

    def __attrs_post_init__(self) -> None:
        self._lines = deque(maxlen=self.keep)

    def consume_windows(self, windows: Sequence[WindowReport]) -> None:
        # The per-GPU means only on the newest window: what a live screen opens a job from, and a 100k-GPU fleet's
        # would be tens of MB a window if every window kept them.
        newest = max(windows, key=lambda report: report.end_ns, default=None)
        lean = [attrs.evolve(report, gpus=()) if report.gpus else report for report in windows]
        encoded = encode_lines(lean)
        full = encode_lines([newest]) if newest is not None and newest.gpus else []
        with self._lock:
            self._lines.extend((report.end_ns, line) for report, line in encoded)
            if full:
                self._newest = full[0]

    def body(self, since_ns: int | None = None) -> bytes:
        with self._lock:
            newest = self._newest
            lines = [
                newest[1] if newest is not None and end == newest[0].end_ns else line
                for end, line in self._lines
                if since_ns is None or end > since_ns
            ]
        return "".join(line + "\n" for line in lines).encode("utf-8")

    def start(self) -> None:
        """Listen (``bound_port`` is the port); OSError, one line naming the address, when it cannot be had."""
        feed = self

        class Handler(_FeedHandler):
            pass

        Handler.feed = feed
        host = self.host.strip("[]") or "0.0.0.0"
        try:
            server = _FeedServer((host, self.port), Handler)
        except OSError as error:
            address = f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"
            raise OSError(f"cannot serve the report feed on {address} ({error.strerror or error})") from error
        server.daemon_threads = True
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, name="otel-ofu-report-feed", daemon=True)
        self._thread.start()

    @property
    def bound_port(self) -> int:
        if self._server is None:
            raise RuntimeError("the report feed is not started")
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        host = self.host if self.host not in ("", "0.0.0.0", "::") else "127.0.0.1"
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        return f"http://{host}:{self.bound_port}{FEED_PATH}"

    def shutdown(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None


class _FeedServer(ThreadingHTTPServer):
    request_queue_size = LISTEN_BACKLOG  # socketserver's default is 5: a burst of pollers would be reset


class _FeedHandler(BaseHTTPRequestHandler):
    feed: ReportFeed
    server_version = "otel-ofu-report-feed"

    def do_GET(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        if url.path != FEED_PATH:
            self._reply(404, b"not found: the feed is at " + FEED_PATH.encode() + b"\n", "text/plain")
            return
        since: int | None = None
        values = urllib.parse.parse_qs(url.query).get("since")
        if values:
            try:
                since = int(values[-1])
            except ValueError:
                self._reply(400, b"since must be an integer (nanoseconds since the epoch)\n", "text/plain")
                return
        self._reply(200, self.feed.body(since), FEED_CONTENT_TYPE)

    def _reply(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("report feed: " + format, *args)
