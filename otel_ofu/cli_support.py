"""Helpers every subcommand uses: options that also read an environment variable."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any

# ``register(subparsers)`` adds one subcommand whose parser sets ``handler=fn(args) -> exit code``.
Register = Callable[["argparse._SubParsersAction[argparse.ArgumentParser]"], None]


def env_name(flag: str) -> str:
    """``--export-endpoint`` -> ``OTEL_OFU_EXPORT_ENDPOINT``."""
    return "OTEL_OFU_" + flag.lstrip("-").replace("-", "_").upper()


def add_option(
    parser: argparse.ArgumentParser,
    flag: str,
    *,
    help: str,
    default: Any = None,
    env: str | None = None,
    type: Callable[[str], Any] = str,
    **kwargs: Any,
) -> None:
    """Add ``flag`` whose default comes from ``env`` (``OTEL_OFU_<FLAG>`` unless given), then ``default``.

    The help text names the variable and the default, so ``--help`` documents both.
    """
    variable = env or env_name(flag)
    raw = os.environ.get(variable)
    value = type(raw) if raw not in (None, "") else default
    shown = "" if default is None else f"; default {default}"
    parser.add_argument(flag, default=value, type=type, help=f"{help} (env {variable}{shown})", **kwargs)


def add_flag(parser: argparse.ArgumentParser, flag: str, *, help: str, env: str | None = None) -> None:
    """A boolean switch, also set by its variable being ``1``/``true``/``yes``."""
    variable = env or env_name(flag)
    on = os.environ.get(variable, "").strip().lower() in ("1", "true", "yes", "on")
    parser.add_argument(flag, action="store_true", default=on, help=f"{help} (env {variable})")
