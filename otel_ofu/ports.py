"""The port map: which port each otel-ofu endpoint listens on by convention, in one place.

The commands open no HTTP endpoint unless given a port (an endpoint without TLS or a token should be asked
for); where they are given one, these are the numbers the Helm chart, the systemd unit, the examples, the
alert rules' scrape configuration, the ``--help`` texts and the docs use, so that what one of them scrapes
is what another serves. docs/reference.md lists them (generated from ``PORT_MAP``), and a test checks every
file that names one against this module.

9464 is the OpenTelemetry SDKs' Prometheus exporter port; the project's own endpoints follow it, one each.
"""

from __future__ import annotations

from typing import Final

import attrs

OTLP_GRPC: Final = 4317  # the OTLP default: the collector's --listen, and an OpenTelemetry Collector's receiver
OTLP_HTTP: Final = 4318  # the OTLP/HTTP default: the collector's --http-listen
PRODUCER_PROMETHEUS: Final = 9464  # otel-ofu run --prometheus-port: the GPUs' metrics on /metrics
COLLECTOR_PROMETHEUS: Final = 9465  # otel-ofu collector --prometheus-port: the window outputs on /metrics
COLLECTOR_REPORT_FEED: Final = 9466  # otel-ofu collector --report-feed-port: what top --feed and report --live read
PRODUCER_HEALTH: Final = 9467  # otel-ofu run --health-port: /healthz, the liveness probe's
COLLECTOR_HEALTH: Final = 9468  # otel-ofu collector --health-port: /healthz, the liveness probe's
GATEWAY_PROMETHEUS: Final = 8889  # an OpenTelemetry Collector's prometheus exporter (backend-gateway.yaml)


@attrs.frozen
class Port:
    """One row of the map: the number, who listens, the option that opens it, and what it serves."""

    number: int
    listener: str
    option: str
    serves: str


PORT_MAP: Final = (
    Port(OTLP_GRPC, "otel-ofu collector", "--listen", "OTLP over gRPC (on by default)"),
    Port(OTLP_HTTP, "otel-ofu collector", "--http-listen", "OTLP over HTTP (off by default)"),
    Port(PRODUCER_PROMETHEUS, "otel-ofu run", "--prometheus-port", "Prometheus /metrics: the GPUs' latest interval"),
    Port(
        COLLECTOR_PROMETHEUS,
        "otel-ofu collector",
        "--prometheus-port",
        "Prometheus /metrics: the window outputs and the collector's own health (what the alert rules scrape)",
    ),
    Port(
        COLLECTOR_REPORT_FEED,
        "otel-ofu collector",
        "--report-feed-port",
        "the report feed (window records as JSON lines) that `top --feed` and `report --live` read",
    ),
    Port(PRODUCER_HEALTH, "otel-ofu run", "--health-port", "/healthz: 200 while the sampling loop keeps reading"),
    Port(COLLECTOR_HEALTH, "otel-ofu collector", "--health-port", "/healthz: 200 while the receivers and windows run"),
    Port(
        GATEWAY_PROMETHEUS,
        "an OpenTelemetry Collector",
        "prometheus exporter endpoint",
        "Prometheus /metrics of backend-gateway.yaml: the same names as the collector's own endpoint",
    ),
)
