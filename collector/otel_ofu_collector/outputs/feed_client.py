"""Reading a running collector's live feed (``feed_server``) into window records."""

from __future__ import annotations

import urllib.error
import urllib.parse
import urllib.request

from otel_ofu_collector.outputs.feed_server import FEED_PATH
from otel_ofu_collector.outputs.record_codec import Records, parse_lines, warn_bad_lines
from otel_ofu_collector.results import WindowReport


class FeedError(RuntimeError):
    """A report feed that could not be read; the message says why in one line."""


def feed_url(url: str) -> str:
    """``http://host:port`` (or any path but the feed's) -> the feed's URL."""
    parts = urllib.parse.urlsplit(url if "://" in url else f"http://{url}")
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise FeedError(f"report feed URL {url!r} is not an http(s) URL")
    path = parts.path if parts.path.endswith(".jsonl") else parts.path.rstrip("/") + FEED_PATH
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


def fetch_records(url: str, timeout: float = 10.0) -> Records:
    """Every window a running collector's feed holds; FeedError when it cannot be read."""
    target = feed_url(url)
    try:
        with urllib.request.urlopen(target, timeout=timeout) as response:
            text = response.read().decode("utf-8", errors="replace")
    except urllib.error.HTTPError as error:
        raise FeedError(f"report feed {target} answered HTTP {error.code}") from None
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        raise FeedError(f"cannot read report feed {target}: {reason}") from None
    return parse_lines(text.splitlines(), target)


def fetch_feed(url: str, timeout: float = 10.0) -> list[WindowReport]:
    """The windows of a running collector's report feed in time order (unusable lines skipped, logged)."""
    records = fetch_records(url, timeout)
    warn_bad_lines(records)
    return list(records.reports)
