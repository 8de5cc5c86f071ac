"""NVLink and PCIe traffic as cumulative byte counters: the integration of rates, and the values' way out (the
per-GPU values, snapshot JSON, capture and replay, the Prometheus endpoint). Every number is worked by hand."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from otel_ofu import gpu_values, io_counters, names
from otel_ofu.commands.snapshot import snapshot_lines
from otel_ofu.model import GpuIdentity, GpuReading, IoCounter, Snapshot
from otel_ofu.producer.metrics_data import compute_snapshot
from otel_ofu.producer.prometheus import PROMETHEUS_NAMES, LatestSnapshotCollector
from otel_ofu.producer.self_metrics import SelfMetrics
from otel_ofu.sources.capture import CaptureWriter, ReplaySource

SECOND = 1_000_000_000
T0 = 1_700_000_000 * SECOND
TX, RX = names.IoDirection.TRANSMIT, names.IoDirection.RECEIVE
NVLINK, PCIE = names.GPU_NVLINK_IO.name, names.GPU_PCIE_IO.name


def at(seconds: float) -> int:
    return T0 + round(seconds * SECOND)


# --- the integration ----------------------------------------------------------------------------------


def test_rate_times_interval_adds_up_from_the_first_interval_start() -> None:
    counters = io_counters.IoIntegrator()
    first = counters.add("GPU-1", io_counters.link_rates(nvlink_tx=2e9, nvlink_rx=1.5e9), at(0), at(10))
    second = counters.add("GPU-1", io_counters.link_rates(nvlink_tx=5e8, nvlink_rx=1.5e9), at(10), at(20))

    # 2 GB/s x 10 s = 20 GB, then + 0.5 GB/s x 10 s = 25 GB; the receive side 15 GB, then 30 GB.
    assert first == {"nvlink_io": {TX: IoCounter(2e10, at(0)), RX: IoCounter(1.5e10, at(0))}}
    assert second == {"nvlink_io": {TX: IoCounter(2.5e10, at(0)), RX: IoCounter(3e10, at(0))}}


def test_a_missing_rate_gives_no_point_and_the_counter_keeps_its_value() -> None:
    counters = io_counters.IoIntegrator()
    counters.add("GPU-1", io_counters.link_rates(pcie_tx=1e9, pcie_rx=4e9), at(0), at(10))
    # The second interval has no transmit rate (a blank): no transmit point, receive goes on.
    gap = counters.add("GPU-1", io_counters.link_rates(pcie_rx=4e9), at(10), at(20))
    after = counters.add("GPU-1", io_counters.link_rates(pcie_tx=3e9, pcie_rx=4e9), at(20), at(30))

    assert gap == {"pcie_io": {RX: IoCounter(8e10, at(0))}}  # 4 GB/s x 20 s
    # Transmit: 1 GB/s x 10 s, nothing for the unknown interval, then 3 GB/s x 10 s = 10 + 30 = 40 GB; the
    # series keeps its start.
    assert after["pcie_io"][TX] == IoCounter(4e10, at(0))
    assert after["pcie_io"][RX] == IoCounter(1.2e11, at(0))  # 4 GB/s x 30 s


def test_a_producer_that_restarts_counts_from_zero_with_a_new_start() -> None:
    before = io_counters.IoIntegrator()
    before.add("GPU-1", io_counters.link_rates(nvlink_tx=1e9), at(0), at(10))
    restarted = io_counters.IoIntegrator()  # a new process: nothing carried over

    fields = restarted.add("GPU-1", io_counters.link_rates(nvlink_tx=1e9), at(60), at(70))

    assert fields == {"nvlink_io": {TX: IoCounter(1e10, at(60))}}  # 1 GB/s x 10 s, from the new start


@pytest.mark.parametrize("rate", [-1.0, math.nan, math.inf, 2e13])
def test_a_rate_that_cannot_be_one_is_missing(rate: float) -> None:
    counters = io_counters.IoIntegrator()
    counters.add("GPU-1", io_counters.link_rates(nvlink_rx=1e9), at(0), at(10))
    assert counters.add("GPU-1", io_counters.link_rates(nvlink_rx=rate), at(10), at(20)) == {}
    # The counter is where it was: 10 GB + 1 GB/s x 10 s.
    assert counters.add("GPU-1", io_counters.link_rates(nvlink_rx=1e9), at(20), at(30)) == {
        "nvlink_io": {RX: IoCounter(2e10, at(0))}
    }


def test_no_interval_measures_nothing_and_gpus_are_counted_apart() -> None:
    counters = io_counters.IoIntegrator()
    assert counters.add("GPU-1", io_counters.link_rates(pcie_tx=1e9), at(10), at(10)) == {}
    counters.add("GPU-1", io_counters.link_rates(pcie_tx=1e9), at(10), at(20))
    other = counters.add("GPU-2", io_counters.link_rates(pcie_tx=2e9), at(10), at(20))
    assert other == {"pcie_io": {TX: IoCounter(2e10, at(10))}}
    counters.forget(["GPU-2"])  # GPU-1 is gone from the source: a later return counts anew
    again = counters.add("GPU-1", io_counters.link_rates(pcie_tx=1e9), at(40), at(50))
    assert again == {"pcie_io": {TX: IoCounter(1e10, at(40))}}


def test_a_partition_carries_its_share_of_the_board() -> None:
    board = {TX: IoCounter(7e10, at(0)), RX: IoCounter(1.4e11, at(0))}
    # A 1g slice of an H100's seven: 70 GB / 7 = 10 GB, 140 GB / 7 = 20 GB, from the board counter's start.
    assert io_counters.scaled(board, 1 / 7) == {
        TX: IoCounter(pytest.approx(1e10), at(0)),  # type: ignore[arg-type]
        RX: IoCounter(pytest.approx(2e10), at(0)),  # type: ignore[arg-type]
    }


# --- the values' way out ------------------------------------------------------------------------------


def reading(**values: object) -> GpuReading:
    identity = GpuIdentity(uuid="GPU-1", model="NVIDIA H100 80GB HBM3", index=0, host="node-1")
    return GpuReading(identity, at(0), at(10), tensor_active=0.4, sm_clock_hz=1.83e9, **values)  # type: ignore[arg-type]


LINKS = {
    "nvlink_io": {TX: IoCounter(3e12, at(-50)), RX: IoCounter(2.5e12, at(-50))},
    "pcie_io": {RX: IoCounter(4e9, at(-50))},
}


def test_values_keep_engine_occupancy_and_counters_and_leave_out_what_cannot_be() -> None:
    values = gpu_values.compute(reading(engine_active=0.93, sm_occupancy=0.31, **LINKS))
    assert values.as_metrics()[names.GPU_ENGINE_ACTIVE.name] == 0.93
    assert values.as_metrics()[names.GPU_SM_OCCUPANCY.name] == 0.31
    assert values.nvlink_io == LINKS["nvlink_io"]
    assert values.pcie_io == LINKS["pcie_io"]

    broken = gpu_values.compute(
        reading(
            engine_active=1.4,
            sm_occupancy=math.nan,
            nvlink_io={TX: IoCounter(-1.0, at(0)), "sideways": IoCounter(1.0, at(0)), RX: IoCounter(5.0, at(0))},
            pcie_io={TX: IoCounter(math.inf, at(0))},
        )
    )
    assert (broken.engine_active, broken.sm_occupancy) == (None, None)
    assert broken.nvlink_io == {RX: IoCounter(5.0, at(0))}
    assert broken.pcie_io == {}
    assert {names.GPU_ENGINE_ACTIVE.name, names.GPU_SM_OCCUPANCY.name, PCIE}.isdisjoint(broken.as_json())


def test_snapshot_json_shows_counters_by_direction() -> None:
    (line,) = snapshot_lines(Snapshot((reading(engine_active=0.9, **LINKS),)))
    assert line[NVLINK] == {TX: 3e12, RX: 2.5e12}
    assert line[PCIE] == {RX: 4e9}
    assert line[names.GPU_ENGINE_ACTIVE.name] == 0.9


def test_capture_records_and_replays_engine_occupancy_and_counters(tmp_path: Path) -> None:
    original = reading(engine_active=0.9, sm_occupancy=0.25, **LINKS)
    path = tmp_path / "capture.jsonl"
    with CaptureWriter(path) as writer:
        writer.write(Snapshot((original,)))
    source = ReplaySource(path)
    (again,) = source.read().readings
    source.close()
    assert (again.engine_active, again.sm_occupancy) == (0.9, 0.25)
    assert (again.nvlink_io, again.pcie_io) == (original.nvlink_io, original.pcie_io)
    assert '"nvlink_io":{"transmit":{"bytes":3000000000000.0' in path.read_text()


def test_prometheus_serves_the_counters_with_their_direction_and_start() -> None:
    collector = LatestSnapshotCollector()
    collector.update(compute_snapshot(Snapshot((reading(engine_active=0.9, **LINKS),))), SelfMetrics(start_ns=0))
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    families = {f.name: f for f in text_string_to_metric_families(generate_latest(registry).decode())}

    assert PROMETHEUS_NAMES[NVLINK] == "gpu_nvlink_io_bytes"
    totals = {
        s.labels["network_io_direction"]: s.value
        for s in families["gpu_nvlink_io_bytes"].samples
        if s.name == "gpu_nvlink_io_bytes_total"
    }
    assert totals == {TX: 3e12, RX: 2.5e12}
    created = {s.labels["network_io_direction"]: s.value for s in families["gpu_nvlink_io_bytes_created"].samples}
    assert created == {TX: pytest.approx(at(-50) / 1e9), RX: pytest.approx(at(-50) / 1e9)}
    (pcie,) = (s for s in families["gpu_pcie_io_bytes"].samples if s.name == "gpu_pcie_io_bytes_total")
    assert (pcie.labels["network_io_direction"], pcie.value) == (RX, 4e9)
    (engine,) = families["gpu_engine_active"].samples
    assert engine.value == 0.9
