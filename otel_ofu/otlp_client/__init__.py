"""The one OTLP client of otel-ofu: the producer's exporter and the collector's downstream both send through it.

``settings.py`` reads the options and the standard ``OTEL_EXPORTER_OTLP_*`` variables once, as the SDK's
exporters do; ``senders.py`` makes one attempt over gRPC or OTLP/HTTP; ``retry.py`` holds the OTLP
specification's retry rules (what is retried, the receiver's delay, backoff with jitter) and ``failures.py``
the cause of a failure in words; ``partial.py`` reads ``partial_success`` and says each message once;
``client.py`` puts them together (``OtlpClient``). Nothing here imports the producer or the collector.
"""

from __future__ import annotations

from otel_ofu.otlp_client.client import MAX_ATTEMPTS, OtlpClient, Transport
from otel_ofu.otlp_client.retry import Attempt, Backoff, retry_after_s
from otel_ofu.otlp_client.senders import Sender, open_sender
from otel_ofu.otlp_client.settings import (
    GRPC,
    HTTP_METRICS_PATH,
    HTTP_PROTOBUF,
    PROTOCOLS,
    ExporterConfigError,
    OtlpSettings,
    check_env_endpoint,
    configured_endpoint,
    http_metrics_url,
    resolve_protocol,
)

__all__ = [
    "GRPC",
    "HTTP_METRICS_PATH",
    "HTTP_PROTOBUF",
    "MAX_ATTEMPTS",
    "PROTOCOLS",
    "Attempt",
    "Backoff",
    "ExporterConfigError",
    "OtlpClient",
    "OtlpSettings",
    "Sender",
    "Transport",
    "check_env_endpoint",
    "configured_endpoint",
    "http_metrics_url",
    "open_sender",
    "resolve_protocol",
    "retry_after_s",
]
