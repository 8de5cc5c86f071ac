"""Outputs: consumers of closed windows (OTLP delivery, Prometheus, window records, the live feed)."""
