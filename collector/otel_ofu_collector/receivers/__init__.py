"""Receivers: OTLP over gRPC and HTTP, their admission control and authentication."""
