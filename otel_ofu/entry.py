"""The ``otel-ofu`` console script's entry point: Ctrl-C at any moment is one line, never a traceback.

Kept apart from ``otel_ofu.cli`` and importing nothing of the project at module level: the console script
imports this module first, so a SIGINT during the second or two the commands take to import (grpc, the SDK,
numpy) already lands in ``main``'s ``try``. Commands that stop cleanly on SIGINT (``run``, ``collector``,
``mfu-from-log``) install their own handlers and never get here; anywhere else a KeyboardInterrupt ends the
process with one line and status 130, at once: threads a command started (a demo's collector, its gRPC
server) would otherwise keep the interpreter alive or print their own tracebacks while it winds down.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Sequence

INTERRUPTED = "otel-ofu: interrupted"
EXIT_INTERRUPTED = 128 + signal.SIGINT  # 130, what shells report for a job ended by Ctrl-C


def interrupted() -> int:
    """Say so in one line and end the process now (no second Ctrl-C, no thread, no atexit handler in between)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with contextlib.suppress(OSError, ValueError):  # a closed or broken stdout has nothing left to lose
        sys.stdout.flush()
    try:
        sys.stderr.write(f"{INTERRUPTED}\n")
        sys.stderr.flush()
    finally:
        os._exit(EXIT_INTERRUPTED)


def _on_sigint(_signum: int, _frame: object) -> None:
    interrupted()


def main(argv: Sequence[str] | None = None) -> int:
    # Ctrl-C ends the process from the handler itself, not by a KeyboardInterrupt: one raised while a weakref
    # callback or a __del__ runs is printed ("Exception ignored in ...") and swallowed, and the command went on.
    signal.signal(signal.SIGINT, _on_sigint)
    try:
        from otel_ofu import cli

        status = cli.main(argv)
        # The command is done: a Ctrl-C now, while the interpreter winds down, would raise in whatever runs then (a
        # weakref callback, printed as "Exception ignored ... KeyboardInterrupt"), with nothing left to interrupt.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        return status
    except KeyboardInterrupt:  # raised by a command's own handler, or before ours was installed
        return interrupted()
