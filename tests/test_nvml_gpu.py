"""The NVML source on real hardware: skipped where no NVIDIA driver and GPU are present (CI included).

Run on a GPU host with ``pytest -m gpu tests/test_nvml_gpu.py -s``; the properties it records (SM cycle
counter semantics, GPM support) are what the issue's note on confirmed behaviours draws on.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest

from otel_ofu import gpu_values, names, ofu_math
from otel_ofu.model import SourceUnavailable
from otel_ofu.sources import nvml
from otel_ofu.sources.nvml import NvmlSource

pytestmark = pytest.mark.gpu

Reason = names.ErrorReason
INTERVAL_S = 1.0


@pytest.fixture
def source() -> Iterator[NvmlSource]:
    nvml.use_library(None)  # the real libnvidia-ml.so.1, whatever another test pointed pynvml at
    try:
        opened = NvmlSource(clock_sample_hz=20.0)
    except SourceUnavailable as exc:
        pytest.skip(f"no real NVIDIA GPU here: {exc}")
    yield opened
    opened.close()


def test_real_gpus_report_identity_clocks_and_interval_values(
    source: NvmlSource, record_property: Callable[[str, object], None]
) -> None:
    assert source.identities()
    time.sleep(INTERVAL_S)  # a real interval of real hardware; this test never runs without a GPU
    snapshot = source.read()

    assert snapshot.readings
    for error in snapshot.errors:
        assert error.reason in (Reason.NOT_SUPPORTED, Reason.NO_PERMISSION, Reason.NO_VALUE), error
    for reading in snapshot.readings:
        record_property(f"{reading.gpu.key} model", reading.gpu.model)
        assert reading.gpu.uuid.startswith("GPU-")
        assert reading.end_ns > reading.start_ns
        assert reading.max_sm_clock_hz is not None
        assert reading.max_sm_clock_hz > 0
        assert reading.sm_clock_hz is not None
        assert 0 < reading.sm_clock_hz <= reading.max_sm_clock_hz * (1 + ofu_math.MAX_CLOCK_TOLERANCE)
        if reading.tensor_active is None:
            continue
        assert 0.0 <= reading.tensor_active <= 1.0
        values = gpu_values.compute(reading)
        assert 0.0 <= values.ofu <= 1.0
        record_property(f"{reading.gpu.key} tpa", reading.tensor_active)
        if reading.cycles is not None:
            # Confirms (or refutes) that SM cycles elapsed count one clock domain: the implied clock
            # should match the sub-sampled SM clock, not be a multiple of it.
            elapsed_s = (reading.end_ns - reading.start_ns) / 1e9
            implied_hz = reading.cycles.sm_cycles_elapsed / elapsed_s
            record_property(f"{reading.gpu.key} cycles implied MHz", implied_hz / 1e6)
            record_property(f"{reading.gpu.key} sampled MHz", reading.sm_clock_hz / 1e6)
            assert implied_hz == pytest.approx(reading.sm_clock_hz, rel=0.25)


def test_real_gpus_list_compute_processes(source: NvmlSource) -> None:
    for identity in source.identities():
        pids = source.compute_pids(identity)
        assert all(isinstance(pid, int) and pid > 0 for pid in pids)


def test_real_source_closes_cleanly(source: NvmlSource) -> None:
    source.close()
    with pytest.raises(RuntimeError, match="closed"):
        source.read()
