"""otel-ofu collector processor: fleet OFU percentiles, OFU-vs-MFU correlation and flags over OTLP."""
