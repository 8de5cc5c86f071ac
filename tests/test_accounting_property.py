"""Every GPU-second billed once over random fleets, in one collector and across shards merged: the property of
``benchmarks/studies/accounting.py`` (which the benchmarks run over more fleets as a deterministic target)."""

from __future__ import annotations

import pytest

from benchmarks.studies.accounting import violations


@pytest.mark.parametrize("seed", range(12))
def test_every_gpu_second_is_billed_once(seed: int) -> None:
    assert violations(seed) == []
