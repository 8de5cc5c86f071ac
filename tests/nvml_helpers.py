"""What the NVML source tests share: a clock they move by hand (the fixtures are in tests/conftest.py)."""

from __future__ import annotations

import attrs

SECOND = 1_000_000_000
T0 = 1_700_000_000 * SECOND


@attrs.define
class ManualClock:
    """Nanoseconds since the epoch that move only when a test advances them."""

    now: int = T0

    def __call__(self) -> int:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += round(seconds * SECOND)
