"""The SDK's own exporters, built the way the standard variables say.

Endpoint, headers, TLS, compression and timeout are left to the SDK's env handling so every
``OTEL_EXPORTER_OTLP_*`` variable works as documented; explicit values are passed only for the
options a user gave on our command line. Each call builds a new exporter: one per pipeline, never
shared between readers.
"""

from __future__ import annotations

import os
import sys
from typing import IO
from urllib.parse import urlparse

from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as SdkGrpcExporter
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as SdkHttpExporter
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.sdk.environment_variables import (
    OTEL_EXPORTER_OTLP_ENDPOINT,
    OTEL_EXPORTER_OTLP_METRICS_ENDPOINT,
    OTEL_EXPORTER_OTLP_METRICS_PROTOCOL,
    OTEL_EXPORTER_OTLP_PROTOCOL,
)
from opentelemetry.sdk.metrics.export import (
    ConsoleMetricExporter,
    MetricExporter,
    MetricExportResult,
    MetricsData,
)

# Re-exported: the request our exporters send, for callers that encode alone.
from otel_ofu.producer.otlp_encoding import encode_with_intervals as encode_with_intervals

GRPC = "grpc"
HTTP_PROTOBUF = "http/protobuf"
PROTOCOLS = (GRPC, HTTP_PROTOBUF)
EXPORTER_KINDS = ("otlp", "console", "none")
HTTP_METRICS_PATH = "/v1/metrics"


class ExporterConfigError(ValueError):
    """An exporter setting the producer cannot honour; the message says which and why."""


def resolve_protocol(explicit: str | None = None) -> str:
    """``--protocol``, else ``OTEL_EXPORTER_OTLP_METRICS_PROTOCOL``, else ``OTEL_EXPORTER_OTLP_PROTOCOL``, else grpc."""
    for candidate, source in (
        (explicit, "--protocol"),
        (os.environ.get(OTEL_EXPORTER_OTLP_METRICS_PROTOCOL), OTEL_EXPORTER_OTLP_METRICS_PROTOCOL),
        (os.environ.get(OTEL_EXPORTER_OTLP_PROTOCOL), OTEL_EXPORTER_OTLP_PROTOCOL),
    ):
        if candidate:
            value = candidate.strip().lower()
            if value not in PROTOCOLS:
                raise ExporterConfigError(
                    f"{source}={candidate!r} is not supported: use {' or '.join(PROTOCOLS)}"
                    " (the Python SDK has no http/json exporter)"
                )
            return value
    return GRPC


def check_env_endpoint() -> None:
    """ExporterConfigError when the endpoint variable the SDK would use is not a URL (or HOST:PORT).

    The SDK takes any text and then fails every export in the background, so a typo would otherwise
    export nothing and say nothing.
    """
    from argparse import ArgumentTypeError

    from otel_ofu.cli_support import url_or_host_port

    for variable in (OTEL_EXPORTER_OTLP_METRICS_ENDPOINT, OTEL_EXPORTER_OTLP_ENDPOINT):
        value = os.environ.get(variable, "").strip()
        if not value:
            continue
        try:
            url_or_host_port(value)
        except ArgumentTypeError as error:
            raise ExporterConfigError(f"{variable}: {error}") from None
        return


def http_metrics_url(endpoint: str) -> str:
    """A base URL (like ``OTEL_EXPORTER_OTLP_ENDPOINT``) gets ``/v1/metrics``; a URL with a path is kept."""
    parsed = urlparse(endpoint)
    if parsed.path in ("", "/"):
        return endpoint.rstrip("/") + HTTP_METRICS_PATH
    return endpoint


class GrpcMetricExporter(SdkGrpcExporter):
    """The SDK's gRPC exporter (env handling, retries, TLS, compression) with interval start times kept."""

    def _translate_data(self, data: MetricsData) -> ExportMetricsServiceRequest:
        return encode_with_intervals(data)


class HttpMetricExporter(SdkHttpExporter):
    """The SDK's OTLP/HTTP protobuf exporter with interval start times kept."""

    def export(
        self, metrics_data: MetricsData, timeout_millis: float | None = 10_000, **kwargs: object
    ) -> MetricExportResult:
        # The SDK splits batches itself when asked to; only the single-request path is re-encoded here.
        if self._shutdown or self._max_export_batch_size is not None or not hasattr(self, "_export_batch"):
            return super().export(metrics_data, timeout_millis, **kwargs)
        try:
            request = encode_with_intervals(metrics_data)
        except Exception:
            return super().export(metrics_data, timeout_millis, **kwargs)
        result: MetricExportResult = self._export_batch(request)
        return result


def otlp_exporter(
    *,
    protocol: str | None = None,
    endpoint: str | None = None,
    headers: dict[str, str] | None = None,
    timeout_s: float | None = None,
) -> MetricExporter:
    """A new OTLP metric exporter; ``None`` arguments defer to the standard variables."""
    if endpoint is None:
        check_env_endpoint()
    chosen = resolve_protocol(protocol)
    if chosen == HTTP_PROTOBUF:
        return HttpMetricExporter(
            endpoint=http_metrics_url(endpoint) if endpoint else None,
            headers=headers,
            timeout=timeout_s,
        )
    return GrpcMetricExporter(endpoint=endpoint or None, headers=headers, timeout=timeout_s)


def console_exporter(out: IO[str] | None = None) -> MetricExporter:
    """The SDK's console exporter: every export as JSON on stdout, for debugging."""
    return ConsoleMetricExporter(out=out if out is not None else sys.stdout)


def build_exporter(
    kind: str,
    *,
    protocol: str | None = None,
    endpoint: str | None = None,
    headers: dict[str, str] | None = None,
    timeout_s: float | None = None,
) -> MetricExporter | None:
    """``otlp`` | ``console`` | ``none`` (None: no push export, e.g. Prometheus only)."""
    if kind == "otlp":
        return otlp_exporter(protocol=protocol, endpoint=endpoint, headers=headers, timeout_s=timeout_s)
    if kind == "console":
        return console_exporter()
    if kind == "none":
        return None
    raise ExporterConfigError(f"exporter {kind!r} is not one of {', '.join(EXPORTER_KINDS)}")
