"""Reading a running collector's live feed (``feed_server``) into window records.

A feed behind TLS and a bearer token (a TLS-terminating proxy or an ingress in front of the collector) is read
with ``FeedAccess``: the CA to trust, a client certificate for mTLS, the token sent as
``Authorization: Bearer``. ``since_ns`` asks only for the windows that ended after it, so a poller fetches each
window once.
"""

from __future__ import annotations

import http.client
import ssl
import urllib.error
import urllib.parse
import urllib.request
from typing import Final

import attrs

from otel_ofu_collector.outputs.feed_server import FEED_PATH
from otel_ofu_collector.outputs.record_codec import Records, parse_lines

_WHY: Final = {401: " (the bearer token is missing or wrong)", 403: " (the bearer token is not allowed)"}


class FeedError(RuntimeError):
    """A report feed that could not be read; the message says why in one line."""


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
    url: str, timeout: float = 10.0, *, since_ns: int | None = None, access: FeedAccess | None = None
) -> Records:
    """The windows a running collector's feed holds (those that ended after ``since_ns``); FeedError when it
    cannot be read."""
    target = feed_url(url, since_ns)
    where = feed_url(url)  # what the messages name: the feed, not this read's query
    access = access or FeedAccess()
    request = urllib.request.Request(target, headers=access.headers())
    context = access.context() if target.startswith("https:") else None
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=context) as response:
            text = response.read().decode("utf-8", errors="replace")
    except urllib.error.HTTPError as error:
        raise FeedError(f"report feed {where} answered HTTP {error.code}{_WHY.get(error.code, '')}") from None
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        raise FeedError(f"cannot read report feed {where}: {reason}") from None
    except http.client.HTTPException as error:  # a connection dropped mid-answer, or no HTTP server there
        raise FeedError(f"cannot read report feed {where}: {type(error).__name__} {error}".rstrip()) from None
    return parse_lines(text.splitlines(), where)
