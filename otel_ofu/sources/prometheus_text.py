"""A Prometheus exporter's /metrics page over HTTP: its URL, one scrape, and the exposition text parsed into samples.

Shared by the sources that read a vendor's exporter (dcgm-exporter, the AMD Device Metrics Exporter): each scrape
opens and closes its own connection, and a scrape that fails is a ``ScrapeError`` saying why in one line.
"""

from __future__ import annotations

import http.client
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping

import attrs
from prometheus_client.parser import text_string_to_metric_families

from otel_ofu.model import SourceUnavailable


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


def fetch(url: str, timeout_s: float) -> str:
    """The exposition text at ``url``, or ScrapeError saying in one line why not."""
    request = urllib.request.Request(url, headers={"Accept": "text/plain"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            charset = response.headers.get_content_charset() or "utf-8"
            body: bytes = response.read()
        return body.decode(charset)
    except urllib.error.HTTPError as error:
        error.close()
        raise ScrapeError(f"{url}: HTTP {error.code} {error.reason}") from None
    except urllib.error.URLError as error:
        raise ScrapeError(f"{url}: {error.reason}") from None
    except TimeoutError:
        raise ScrapeError(f"{url}: no complete answer within {timeout_s:g} s") from None
    except (OSError, http.client.HTTPException, ValueError) as error:
        raise ScrapeError(f"{url}: {type(error).__name__}: {error}") from None


@attrs.frozen
class Sample:
    """One line of the page: its metric name (a counter's ``_total`` suffix removed), labels and value."""

    name: str
    labels: Mapping[str, str]
    value: float


def parse_samples(text: str) -> list[Sample]:
    """Every sample of the page, in order; ScrapeError when the text is not parseable."""
    try:
        families = list(text_string_to_metric_families(text))
    except Exception as error:  # the parser raises ValueError, IndexError... on malformed text
        raise ScrapeError(f"malformed exposition text: {error}") from None
    # prometheus-client appends "_total" to counter samples even when the family already ends in "_TOTAL".
    return [
        Sample(sample.name.removesuffix("_total"), sample.labels, sample.value)
        for family in families
        for sample in family.samples
    ]


def label(labels: Mapping[str, str], keys: tuple[str, ...]) -> str | None:
    """The first of ``keys`` with a value: an exporter prints ``pod=""`` on GPUs no pod holds, and empty is absent."""
    for key in keys:
        value = labels.get(key)
        if value:
            return value
    return None
