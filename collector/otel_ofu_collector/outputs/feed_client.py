"""Reading a running collector's live feed (``feed_server``) into window records.

A feed behind TLS and a bearer token (a TLS-terminating proxy or an ingress in front of the collector) is read
with ``FeedAccess``: the CA to trust, a client certificate for mTLS, the token sent as
``Authorization: Bearer``. ``since_ns`` asks only for the windows that ended after it, so a poller fetches each
window once. A read is bounded in time and bytes and can be cut short (``fetch_records``).
"""

from __future__ import annotations

import ssl
import urllib.parse
from typing import Final

import attrs

from otel_ofu import bounded_http
from otel_ofu_collector.outputs.feed_server import DEFAULT_FEED_MAX_BYTES, FEED_PATH
from otel_ofu_collector.outputs.record_codec import Records, parse_lines

_WHY: Final = {401: " (the bearer token is missing or wrong)", 403: " (the bearer token is not allowed)"}
# The most of a feed read at once: the largest feed the collector holds by default and room beside it. A feed that
# never ends (or a port that is not a feed) is cut here rather than read into memory.
MAX_FEED_BYTES: Final = DEFAULT_FEED_MAX_BYTES + 64 * 1024 * 1024


class FeedError(RuntimeError):
    """A report feed that could not be read; the message says why in one line. ``stuck``: the feed answered too
    slowly or not at all within the read's deadline (dripping, stalled), not with an error."""

    def __init__(self, message: str, *, stuck: bool = False) -> None:
        super().__init__(message)
        self.stuck = stuck


@attrs.frozen
class FeedAccess:
    """What reaching a feed takes beyond plain HTTP: a bearer token, the CA of an https feed, a client
    certificate and key (mTLS). Files are read when a request is made, so a renewed certificate is taken."""

    bearer_token: str | None = None
    ca_file: str | None = None
    client_cert: str | None = None
    client_key: str | None = None

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.bearer_token}"} if self.bearer_token else {}

    def context(self) -> ssl.SSLContext:
        """The TLS context of an https feed: the system's CAs, or ``ca_file``; the client certificate if any."""
        try:
            context = ssl.create_default_context(cafile=self.ca_file)
            if self.client_cert:
                context.load_cert_chain(self.client_cert, self.client_key)
        except (OSError, ssl.SSLError) as error:
            raise FeedError(f"cannot load the feed's TLS files: {getattr(error, 'strerror', None) or error}") from None
        return context


def feed_url(url: str, since_ns: int | None = None) -> str:
    """``http://host:port`` (or any path but the feed's) -> the feed's URL; ``since_ns`` adds ``?since=``."""
    parts = urllib.parse.urlsplit(url if "://" in url else f"http://{url}")
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise FeedError(f"report feed URL {url!r} is not an http(s) URL")
    path = parts.path if parts.path.endswith(".jsonl") else parts.path.rstrip("/") + FEED_PATH
    query = parts.query
    if since_ns is not None:
        kept = [(key, value) for key, value in urllib.parse.parse_qsl(query) if key != "since"]
        query = urllib.parse.urlencode([*kept, ("since", str(since_ns))])
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, query, ""))


def fetch_records(
    url: str,
    timeout: float = 10.0,
    *,
    since_ns: int | None = None,
    access: FeedAccess | None = None,
    max_bytes: int = MAX_FEED_BYTES,
    cancel: bounded_http.Cancel | None = None,
) -> Records:
    """The windows a running collector's feed holds (those that ended after ``since_ns``); FeedError when it
    cannot be read. The read is bounded (``bounded_http``): the whole answer within ``timeout`` (a feed that drips
    is cut there, ``stuck``), at most ``max_bytes`` of it (one that never ends is cut there), and ``cancel`` ends
    it at once (a screen quitting)."""
    target = feed_url(url, since_ns)
    where = feed_url(url)  # what the messages name: the feed, not this read's query
    access = access or FeedAccess()
    context = access.context() if target.startswith("https:") else None
    try:
        answer = bounded_http.get(
            target, headers=access.headers(), deadline_s=timeout, max_bytes=max_bytes, tls=context, cancel=cancel
        )
    except bounded_http.GetError as error:
        if error.timed_out:
            raise FeedError(f"report feed {where} sent no complete answer within {timeout:g} s", stuck=True) from None
        raise FeedError(f"cannot read report feed {where}: {error.reason}") from None
    if answer.status != 200:
        raise FeedError(f"report feed {where} answered HTTP {answer.status}{_WHY.get(answer.status, '')}")
    text = bytes(answer.body).decode("utf-8", errors="replace")
    return parse_lines(text.splitlines(), where)
