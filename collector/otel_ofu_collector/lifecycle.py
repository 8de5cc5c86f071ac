"""Starting parts in order and shutting them down in reverse, as the OpenTelemetry Collector's service does.

A part that fails to start stops the rest from starting, and the ones already started are shut down again
(nothing is left holding a port or a file). At shutdown every part is shut down whatever the others did: one
that raises is logged once, with its traceback, and costs none of the others.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TypeVar

logger = logging.getLogger(__name__)

Part = TypeVar("Part")


def start_in_order(parts: Sequence[Part], start: Callable[[Part], object], shutdown: Callable[[Part], object]) -> None:
    """``start`` each part in turn; when one raises, ``shutdown`` the started ones (last first) and re-raise."""
    started: list[Part] = []
    try:
        for part in parts:
            start(part)
            started.append(part)
    except BaseException:
        shutdown_in_reverse(started, shutdown)
        raise


def shutdown_in_reverse(parts: Sequence[Part], shutdown: Callable[[Part], object]) -> int:
    """``shutdown`` every part, the last started first; how many raised (each logged once)."""
    failed = 0
    for part in reversed(parts):
        try:
            shutdown(part)
        except Exception:
            failed += 1
            logger.exception("shutting down %s failed", type(part).__name__)
    return failed
