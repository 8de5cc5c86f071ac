"""A Prometheus exporter's /metrics page over HTTP: its URL, one scrape, and the exposition text parsed into samples.

Shared by the sources that read a vendor's exporter (dcgm-exporter, the AMD Device Metrics Exporter): each scrape
opens and closes its own connection, and a scrape that fails is a ``ScrapeError`` saying why in one line.

A page is whatever the exporter's port answers, so a scrape is bounded (``bounded_http``): the whole answer within
the source's timeout (a page dripping a byte a second is cut there, not read for ever), at most
``MAX_PAGE_BYTES`` of it (a page that never ends is cut there, not read into memory), and ``Scrape.interrupt``
(the producer told to stop) cuts a scrape in flight at once and gives the last read a short deadline.

The text is parsed here, in one pass over each line: a line of 200,000 labels costs its length, where
prometheus-client's parser took time quadratic in the line (minutes for a 2 MiB line).
"""

from __future__ import annotations

import re
import ssl
import threading
import urllib.parse
from collections.abc import Mapping
from email.message import Message
from typing import Final

import attrs

from otel_ofu import bounded_http
from otel_ofu.model import SourceUnavailable

# The largest page taken. A node's dcgm-exporter page is a few hundred KB (about 2 MB with every MIG instance of 8
# GPUs), an AMD exporter's of 8 GPUs in CPX mode a few MB.
MAX_PAGE_BYTES: Final = 32 * 1024 * 1024
# The deadline of the read that follows a stop (SIGTERM): a healthy exporter on the node answers in milliseconds.
STOPPING_DEADLINE_S: Final = 0.5


class ScrapeError(Exception):
    """The scrape as a whole failed; the message says why in one line."""


def normalize_url(url: str, exporter: str, example: str) -> str:
    """``host:9400`` -> ``http://host:9400/metrics``; anything but http(s) is refused in one line naming the exporter
    and an ``example`` URL."""
    text = url.strip()
    if "://" not in text:
        text = "http://" + text
    parts = urllib.parse.urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise SourceUnavailable(f"{exporter} URL must look like {example}, got {url!r}")
    if parts.path in ("", "/"):
        parts = parts._replace(path="/metrics")
    return urllib.parse.urlunsplit(parts)


@attrs.define
class Scrape:
    """One source's scrapes, one at a time: each bounded in time and bytes; ``interrupt`` (from a signal handler or
    another thread) cuts the one in flight and gives every later one ``STOPPING_DEADLINE_S`` at most."""

    max_bytes: int = MAX_PAGE_BYTES
    _in_flight: bounded_http.Cancel | None = attrs.field(default=None, init=False)
    _stopping: bool = attrs.field(default=False, init=False)
    _lock: threading.RLock = attrs.field(factory=threading.RLock, init=False)  # a signal handler may take it

    def fetch(self, url: str, timeout_s: float) -> str:
        """The exposition text at ``url``, or ScrapeError saying in one line why not."""
        cancel = bounded_http.Cancel()
        with self._lock:
            deadline = min(timeout_s, STOPPING_DEADLINE_S) if self._stopping else timeout_s
            self._in_flight = cancel
        try:
            answer = bounded_http.get(
                url,
                headers={"Accept": "text/plain"},
                deadline_s=deadline,
                max_bytes=self.max_bytes,
                tls=ssl.create_default_context() if url.startswith("https:") else None,
                cancel=cancel,
            )
        except bounded_http.GetError as error:
            raise ScrapeError(str(error)) from None
        finally:
            with self._lock:
                self._in_flight = None
        if answer.status != 200:
            raise ScrapeError(f"{url}: HTTP {answer.status} {answer.reason}".rstrip())
        try:
            return bytes(answer.body).decode(_charset(answer.content_type))
        except (LookupError, UnicodeDecodeError) as error:
            raise ScrapeError(f"{url}: {type(error).__name__}: {error}") from None

    def interrupt(self) -> None:
        """Stop: the scrape in flight ends now (a ScrapeError), and later ones get a short deadline."""
        with self._lock:
            self._stopping = True
            in_flight = self._in_flight
        if in_flight is not None:
            in_flight.cancel("the producer is stopping")


def _charset(content_type: str) -> str:
    message = Message()
    message["Content-Type"] = content_type or "text/plain"
    return message.get_content_charset() or "utf-8"


def fetch(url: str, timeout_s: float) -> str:
    """One bounded scrape of ``url`` (``Scrape.fetch``), or ScrapeError saying in one line why not."""
    return Scrape().fetch(url, timeout_s)


@attrs.frozen
class Sample:
    """One line of the page: its metric name (a counter's ``_total`` suffix removed), labels and value."""

    name: str
    labels: Mapping[str, str]
    value: float


_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
# One label and what follows it, matched where the previous one ended: each costs its own length, never the line's.
_LABEL = re.compile(r'[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"((?:[^"\\\n]|\\.)*)"[ \t]*(,[ \t]*|(?=\}))')
_ESCAPE = re.compile(r"\\(.)")
_ESCAPED = {"n": "\n", "\\": "\\", '"': '"'}


def _unescape(found: re.Match[str]) -> str:
    char = found.group(1)
    return _ESCAPED.get(char, "\\" + char)


def _sample(line: str) -> Sample:
    """One sample line; ValueError when it is not one."""
    name = _NAME.match(line)
    if name is None:
        raise ValueError(f"no metric name in {line[:80]!r}")
    at = name.end()
    labels: dict[str, str] = {}
    if at < len(line) and line[at] == "{":
        at += 1
        while True:
            while at < len(line) and line[at] in " \t":
                at += 1
            if at < len(line) and line[at] == "}":
                at += 1
                break
            found = _LABEL.match(line, at)
            if found is None:
                raise ValueError(f"malformed labels in {line[:80]!r}")
            value = found.group(2)
            labels[found.group(1)] = _ESCAPE.sub(_unescape, value) if "\\" in value else value
            at = found.end()
    rest = line[at:].split()
    if not rest or len(rest) > 2 or (at < len(line) and line[at] not in " \t"):
        raise ValueError(f"no value in {line[:80]!r}")
    return Sample(name.group().removesuffix("_total"), labels, float(rest[0]))


def parse_samples(text: str) -> list[Sample]:
    """Every sample of the page, in order (comments and blank lines skipped); ScrapeError at the first line that is
    not exposition text. A counter's ``_total`` suffix is left out of its name, as the sources look them up."""
    samples = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        try:
            samples.append(_sample(line))
        except ValueError as error:
            raise ScrapeError(f"malformed exposition text (line {number}): {error}") from None
    return samples


def label(labels: Mapping[str, str], keys: tuple[str, ...]) -> str | None:
    """The first of ``keys`` with a value: an exporter prints ``pod=""`` on GPUs no pod holds, and empty is absent."""
    for key in keys:
        value = labels.get(key)
        if value:
            return value
    return None
