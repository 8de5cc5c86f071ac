"""otel-ofu: Overall FLOP Utilization for GPU fleets as OpenTelemetry metrics."""

__version__ = "0.1.0"
