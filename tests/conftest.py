"""Shared test helpers."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest


def _require(available: bool, reason: str) -> None:
    """Skip with a reason when something a test needs is missing; under CI=true that is a failure."""
    if available:
        return
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true but {reason}: .ci/run must install it")
    pytest.skip(reason)


@pytest.fixture
def require() -> Callable[[bool, str], None]:
    return _require


@pytest.fixture
def shared_fixtures() -> Path:
    """The real dcgm-exporter and dcgmi output in tests/data."""
    return Path(__file__).parent / "data"
