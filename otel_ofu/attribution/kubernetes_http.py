"""One bounded GET to the Kubernetes API server or the kubelet (``bounded_http``), its failures as the
attribution chain's ``AttributionError``."""

from __future__ import annotations

import ssl

from otel_ofu import bounded_http
from otel_ofu.attribution.base import AttributionError
from otel_ofu.bounded_http import READ_CHUNK, Answer, Cancel, first_line

__all__ = ["READ_CHUNK", "Answer", "Cancel", "first_line", "get"]


def get(
    url: str,
    *,
    headers: dict[str, str],
    deadline_s: float,
    max_bytes: int,
    tls: ssl.SSLContext | None,
    cancel: Cancel | None = None,
) -> Answer:
    """``bounded_http.get``; its one-line failure as an ``AttributionError``."""
    try:
        return bounded_http.get(
            url, headers=headers, deadline_s=deadline_s, max_bytes=max_bytes, tls=tls, cancel=cancel
        )
    except bounded_http.GetError as error:
        raise AttributionError(str(error)) from None
