"""One rule from a snapshot to per-GPU values: ``run``, ``snapshot`` and the report's capture replay agree."""

from __future__ import annotations

from pathlib import Path

import pytest

from otel_ofu import names
from otel_ofu.commands.snapshot import snapshot_lines
from otel_ofu.gpu_samples import compute_snapshot
from otel_ofu.gpu_values import CalibrationTable
from otel_ofu.model import GpuError, GpuIdentity, GpuReading, Snapshot
from otel_ofu.producer.metrics_data import env_resource, snapshot_to_metrics_data
from otel_ofu.sources import Finite, ListsProcesses, is_exhausted, keep_values
from otel_ofu.sources.capture import CaptureWriter, ReplaySource
from otel_ofu_collector.report.command import replay_capture

MHZ = 1e6
SECOND = 10**9
T0 = 1_700_000_000 * SECOND
# How dcgm-exporter's HPC job mapping and a launcher spell them: raw, not yet in the contract's words.
HINTED = GpuIdentity(
    uuid="GPU-7",
    model="NVIDIA H100 80GB HBM3",
    index=3,
    host="node-7",
    hints={names.JOB_ID: "42", names.GPU_PRECISION: "BF16"},
)


def reading(start: int = T0, **values: float | None) -> GpuReading:
    fields: dict[str, float | None] = {"tensor_active": 0.5, "sm_clock_hz": 1980 * MHZ, "max_sm_clock_hz": 1980 * MHZ}
    fields.update(values)
    return GpuReading(gpu=HINTED, start_ns=start, end_ns=start + 10 * SECOND, **fields)  # type: ignore[arg-type]


def test_run_and_snapshot_attribute_and_calibrate_a_gpu_alike() -> None:
    table = CalibrationTable.parse("job:42=0.5")
    snapshot = Snapshot((reading(),))
    (sample,) = compute_snapshot(snapshot, calibration=table).samples
    # The hints link's words: precision normalised, the scheduler inferred from an HPC job id.
    assert sample.attributes[names.GPU_PRECISION] == "bf16"
    assert sample.attributes[names.JOB_SCHEDULER] == "slurm"
    assert sample.values.ofu == pytest.approx(0.25)  # 0.5 x full clock x the job's factor 0.5
    assert sample.values.flops_achieved is not None  # a precision the catalog knows gives FLOP/s

    data = snapshot_to_metrics_data(snapshot, calibration=table, base=env_resource("node-7"))
    (resource_metrics,) = data.resource_metrics
    exported = dict(resource_metrics.resource.attributes)
    gauges = {m.name: m.data.data_points[0].value for m in resource_metrics.scope_metrics[0].metrics}  # type: ignore[union-attr]

    (line,) = snapshot_lines(snapshot, table)
    for key in (names.JOB_ID, names.JOB_SCHEDULER, names.GPU_PRECISION, names.HW_ID, names.GPU_INDEX):
        assert line[key] == exported[key] == sample.attributes[key], key
    for name in (names.GPU_OFU.name, names.GPU_OFU_RAW.name, names.GPU_FLOPS_ACHIEVED.name):
        assert line[name] == pytest.approx(gauges[name]), name


def test_the_report_replays_a_capture_by_the_same_rule(tmp_path: Path) -> None:
    capture = tmp_path / "capture.jsonl"
    snapshots = [Snapshot((reading(T0 + i * 10 * SECOND, tensor_active=0.1 * (i + 1)),)) for i in range(6)]
    with CaptureWriter(capture) as writer:
        for snapshot in snapshots:
            writer.write(snapshot)
    replay = replay_capture(capture, window_s=60)
    expected = [compute_snapshot(snapshot).samples[0].values.ofu for snapshot in snapshots]
    assert replay.ofu_samples[HINTED.model] == pytest.approx(tuple(expected))
    jobs = [job for report in replay.reports for job in report.jobs]
    assert jobs
    assert {job.job_id for job in jobs} == {"42"}
    assert {job.attributes.get(names.GPU_PRECISION) for job in jobs} == {"bf16"}


def test_a_gpu_without_ofu_keeps_its_valid_values_and_one_error() -> None:
    no_tpa = reading(tensor_active=None)
    source_error = GpuError(names.ErrorReason.NOT_SUPPORTED, "no GPM", gpu=HINTED, gpu_key=HINTED.key)
    computed = compute_snapshot(Snapshot((no_tpa,), (source_error,)))
    assert computed.samples == ()
    assert computed.errors == (source_error,)  # the failed computation is the same problem, counted once
    (partial,) = computed.partial
    assert partial.known == {names.GPU_CLOCK_SM.name: 1980 * MHZ, names.GPU_CLOCK_SM_MAX.name: 1980 * MHZ}
    assert partial.attributes[names.JOB_ID] == "42"
    # Without a source error, the computation's own error says why.
    computed = compute_snapshot(Snapshot((reading(tensor_active=1.5),)))
    (error,) = computed.errors
    assert error.reason == names.ErrorReason.INVALID_VALUE
    assert computed.partial[0].known[names.GPU_CLOCK_SM.name] == 1980 * MHZ


@pytest.mark.parametrize(("watts", "kept"), [(1e308, False), (5001.0, False), (-1.0, False), (700.0, True)])
def test_a_gpu_without_ofu_keeps_only_a_power_a_board_can_draw(watts: float, kept: bool) -> None:
    # An AMD page's 1e308 W on a GPU whose OFU cannot be had: the bound the computed samples have (5 kW) holds here
    # too, so the partial sample carries no power rather than an impossible one.
    (partial,) = compute_snapshot(Snapshot((reading(tensor_active=None, power_w=watts),))).partial
    assert partial.known.get(names.GPU_POWER.name) == (watts if kept else None)


def test_keep_values_keeps_a_reading_that_holds_anything() -> None:
    partial = reading(tensor_active=None)
    error = GpuError(names.ErrorReason.NO_VALUE, "no TPA", gpu=HINTED)
    assert keep_values(partial, error) == (partial, error)
    empty = reading(tensor_active=None, sm_clock_hz=None, max_sm_clock_hz=None)
    assert keep_values(empty, error) == (error,)
    complete = reading()
    assert keep_values(complete, complete) == (complete,)


def test_source_abilities_are_protocols(tmp_path: Path) -> None:
    capture = tmp_path / "c.jsonl"
    with CaptureWriter(capture) as writer:
        writer.write(Snapshot((reading(),)))
    source = ReplaySource(capture)
    try:
        assert isinstance(source, Finite)
        assert not isinstance(source, ListsProcesses)
        assert not is_exhausted(source)
        source.read()
        source.read()
        assert is_exhausted(source)
    finally:
        source.close()
    assert not is_exhausted(object())  # a source that never runs out
