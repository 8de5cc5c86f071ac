"""Benchmarks of otel-ofu (numbers against the project's targets, measured side by side in one run)."""
