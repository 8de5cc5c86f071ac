"""Subcommands of ``otel-ofu``: each module has ``register(subparsers)``."""
