"""The live feed: the last closed windows as JSON lines over HTTP, for ``otel-ofu report --live``.

``ReportFeed`` serves them at ``GET /reports.jsonl`` (``?since=END_NS`` for only the windows that ended
after it, so a poller fetches each once); ``feed_client`` reads it.
"""

from __future__ import annotations

import threading
import urllib.parse
from collections import deque
from collections.abc import Sequence
from typing import Final

import attrs

from otel_ofu.http_endpoint import HttpEndpoint, Reply, Request
from otel_ofu_collector.outputs.record_codec import encode_lines
from otel_ofu_collector.results import WindowReport

FEED_PATH: Final = "/reports.jsonl"
FEED_CONTENT_TYPE: Final = "application/jsonl; charset=utf-8"
DEFAULT_FEED_KEEP: Final = 1440  # a day of one-minute windows
# What the feed's encoded windows may hold (--report-feed-max-bytes): a day of a few thousand jobs' windows; a
# larger fleet's feed keeps fewer windows.
DEFAULT_FEED_MAX_BYTES: Final = 256 * 1024 * 1024


@attrs.define
class ReportFeed:
    """Serves the last ``keep`` closed windows, within ``max_bytes`` of encoded lines, as JSON lines at
    ``GET /reports.jsonl``; a window consumer.

    ``?since=END_NS`` returns only the windows that ended after END_NS, so a poller fetches each once. The feed is
    bounded in bytes as well as in windows (a day of windows of a 50,000-job fleet is gigabytes): past
    ``max_bytes`` its oldest windows are dropped, the newest always kept. The lines are held encoded, once, and
    every reader is answered with references to them, never a copy of its own (``http_endpoint``), so a slow
    reader or a poller costs a list of references and its socket's time, not the feed's size.
    """

    host: str = "127.0.0.1"
    port: int = 0
    keep: int = attrs.field(default=DEFAULT_FEED_KEEP)
    max_bytes: int = DEFAULT_FEED_MAX_BYTES
    _lines: deque[tuple[int, bytes]] = attrs.field(init=False, factory=deque)
    _bytes: int = attrs.field(init=False, default=0)  # of _lines
    _newest: tuple[int, bytes] | None = attrs.field(init=False, default=None)  # with its per-GPU means
    _lock: threading.Lock = attrs.field(init=False, factory=threading.Lock)
    _server: HttpEndpoint | None = attrs.field(init=False, default=None)

    @keep.validator
    def _check_keep(self, _attribute: object, value: int) -> None:
        if value < 1:
            raise ValueError(f"keep must be at least 1, got {value!r}")

    @property
    def held_bytes(self) -> int:
        """The encoded windows the feed holds, in bytes."""
        newest = self._newest
        return self._bytes + (len(newest[1]) if newest is not None else 0)

    def consume_windows(self, windows: Sequence[WindowReport]) -> None:
        # The per-GPU means only on the newest window: what a live screen opens a job from, and a 100k-GPU fleet's
        # would be tens of MB a window if every window kept them.
        newest = max(windows, key=lambda report: report.end_ns, default=None)
        lean = [attrs.evolve(report, gpus=()) if report.gpus else report for report in windows]
        encoded = [(report.end_ns, (line + "\n").encode("utf-8")) for report, line in encode_lines(lean)]
        full = encode_lines([newest]) if newest is not None and newest.gpus else []
        with self._lock:
            lines = self._lines
            for end, line in encoded:
                lines.append((end, line))
                self._bytes += len(line)
            if full:
                self._newest = (full[0][0].end_ns, (full[0][1] + "\n").encode("utf-8"))
            while len(lines) > 1 and (len(lines) > self.keep or self.held_bytes > self.max_bytes):
                _, old = lines.popleft()
                self._bytes -= len(old)
            if self._newest is not None and self._newest[0] < lines[0][0]:
                self._newest = None  # its window was dropped

    def reply(self, since_ns: int | None) -> Reply:
        """The feed's answer: references to its lines (those that ended after ``since_ns``), in order."""
        with self._lock:
            newest = self._newest
            parts = [
                newest[1] if newest is not None and end == newest[0] else line
                for end, line in self._lines
                if since_ns is None or end > since_ns
            ]
        return Reply(200, FEED_CONTENT_TYPE, parts, (("Cache-Control", "no-store"),))

    def body(self, since_ns: int | None = None) -> bytes:
        """The answer's bytes (a copy: for tests and small feeds)."""
        return b"".join(self.reply(since_ns).parts)

    def _answer(self, request: Request) -> Reply:
        if request.path != FEED_PATH:
            return Reply.text(404, f"not found: the feed is at {FEED_PATH}\n")
        since: int | None = None
        values = urllib.parse.parse_qs(request.query).get("since")
        if values:
            try:
                since = int(values[-1])
            except ValueError:
                return Reply.text(400, "since must be an integer (nanoseconds since the epoch)\n")
        return self.reply(since)

    def start(self) -> None:
        """Listen (``bound_port`` is the port); OSError, one line naming the address, when it cannot be had."""
        server = HttpEndpoint(self._answer, self.host, self.port, name="otel-ofu-report-feed")
        try:
            server.start()
        except OSError as error:
            host = self.host.strip("[]") or "0.0.0.0"
            address = f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"
            raise OSError(f"cannot serve the report feed on {address} ({error.strerror or error})") from error
        self._server = server

    @property
    def bound_port(self) -> int:
        if self._server is None:
            raise RuntimeError("the report feed is not started")
        return self._server.port

    @property
    def url(self) -> str:
        host = self.host if self.host not in ("", "0.0.0.0", "::") else "127.0.0.1"
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        return f"http://{host}:{self.bound_port}{FEED_PATH}"

    def shutdown(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.stop()
