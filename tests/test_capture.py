"""Our JSON-lines capture: what the writer records, replay gives back, and garbage never stops it."""

from __future__ import annotations

import json
from pathlib import Path

from otel_ofu import names
from otel_ofu.model import CycleCounters, GpuError, GpuIdentity, GpuReading, Snapshot
from otel_ofu.sources.capture import FORMAT_KEY, CaptureWriter, ReplaySource, is_capture

GPU0 = GpuIdentity(uuid="GPU-aaaa", model="NVIDIA H100 80GB HBM3", index=0, host="node-1")
MIG = GpuIdentity(
    uuid="GPU-bbbb",
    model="NVIDIA A100-SXM4-80GB",
    index=1,
    host="node-1",
    mig_profile="3g.40gb",
    mig_instance_id=2,
    hints={names.K8S_POD_NAME: "trainer-0", names.JOB_SCHEDULER: "kubernetes"},
)

SNAPSHOTS = (
    Snapshot(
        readings=(
            GpuReading(GPU0, 1_000, 2_000, tensor_active=0.5, sm_clock_hz=1.755e9),
            GpuReading(
                MIG,
                1_000,
                2_000,
                tensor_active=0.25,
                sm_clock_hz=1.41e9,
                max_sm_clock_hz=1.41e9,
                sm_active=0.5,
                dram_active=0.1,
                cycles=CycleCounters(sm_cycles_elapsed=2**53 + 1, mma_cycles_active=7),
                truth_ofu=0.24,
                truth_precision="bf16",
            ),
        ),
        errors=(
            GpuError(names.ErrorReason.GPU_LOST, "GPU is lost", gpu=GPU0),
            GpuError(names.ErrorReason.NO_PERMISSION, "no permission", gpu_key="GPU-cccc"),
        ),
    ),
    Snapshot(),  # an empty read keeps its place
    Snapshot(errors=(GpuError(names.ErrorReason.SCRAPE, "exporter down"),)),
    Snapshot(readings=(GpuReading(GPU0, 2_000, 3_000, tensor_active=0.0, sm_clock_hz=1.98e9),)),
)


def record(path: Path, snapshots: tuple[Snapshot, ...] = SNAPSHOTS) -> None:
    with CaptureWriter(path) as writer:
        for snapshot in snapshots:
            writer.write(snapshot)


def replay_all(path: Path) -> tuple[list[Snapshot], ReplaySource]:
    source = ReplaySource(path)
    snapshots = []
    while True:
        snapshot = source.read()
        if source.exhausted:
            if snapshot.errors:
                snapshots.append(snapshot)
            break
        snapshots.append(snapshot)
    source.close()
    return snapshots, source


def test_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "capture.jsonl"
    record(path)
    replayed, source = replay_all(path)
    assert tuple(replayed) == SNAPSHOTS
    assert source.bad_lines == 0


def test_lines_are_versioned_and_absent_values_absent(tmp_path: Path) -> None:
    path = tmp_path / "capture.jsonl"
    record(path)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert all(line[FORMAT_KEY] == 1 for line in lines)
    assert [line["seq"] for line in lines] == [0, 0, 0, 0, 1, 2, 3]
    first = lines[0]
    assert first["values"] == {"tensor_active": 0.5, "sm_clock_hz": 1.755e9}
    assert "mig_instance_id" not in first["gpu"]
    assert "hints" not in first["gpu"]
    assert lines[4]["type"] == "empty"
    assert is_capture(path.read_text().splitlines()[0])
    assert not is_capture("#Entity   GRACT")


def test_appending_a_second_recording_replays_both(tmp_path: Path) -> None:
    path = tmp_path / "capture.jsonl"
    record(path)
    record(path, SNAPSHOTS[3:])  # seq restarts at 0: a change of seq is what separates reads
    replayed, _ = replay_all(path)
    assert tuple(replayed) == (*SNAPSHOTS, SNAPSHOTS[3])


def test_garbage_lines_are_counted_errors(tmp_path: Path) -> None:
    path = tmp_path / "capture.jsonl"
    record(path)
    good = path.read_text().splitlines()
    damaged = [
        good[0],
        "not json at all",
        json.dumps({"seq": 0, "type": "reading"}),  # no format version
        json.dumps({FORMAT_KEY: 99, "seq": 0, "type": "reading"}),  # from the future
        *good[1:4],
        json.dumps({FORMAT_KEY: 1, "seq": 1, "type": "reading", "gpu": {"uuid": 5}}),  # wrong types
        json.dumps({FORMAT_KEY: 1, "seq": 1, "type": "reading", "gpu": good[0], "start_ns": 1}),
        json.dumps({FORMAT_KEY: 1, "seq": 1, "type": "mystery"}),
        *good[4:],
        "{truncated",
    ]
    path.write_text("\n".join(damaged) + "\n")
    replayed, source = replay_all(path)
    assert source.bad_lines == 7
    first = replayed[0]
    assert first.readings == SNAPSHOTS[0].readings
    scrape = [e for e in first.errors if e.reason == names.ErrorReason.SCRAPE and e.gpu is None]
    assert len(scrape) == 3
    assert any(":2: not JSON" in e.message for e in scrape)
    assert any("newer" in e.message for e in scrape)
    # The good records of every read survive the bad ones around them.
    assert len(replayed) == len(SNAPSHOTS)
    assert replayed[2].errors == SNAPSHOTS[2].errors
    last = replayed[-1]
    assert last.readings == SNAPSHOTS[3].readings
    assert any("not JSON" in e.message for e in last.errors)  # the trailing garbage, noted with the last read
