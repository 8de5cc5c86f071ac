"""Benchmarks of otel-ofu (numbers against the DESIGN.md targets, measured side by side in one run)."""
