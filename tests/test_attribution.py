"""Job attribution: each link against real files and directories, and the chain that merges and caches them."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import attrs
import pytest

from otel_ofu import names
from otel_ofu.attribution import (
    DEFAULT_ORDER,
    AttributionChain,
    AttributionError,
    Attributor,
    HintsAttributor,
    ProcessEnvAttributor,
    SlurmMappingAttributor,
    StaticAttributor,
    build_chain,
    merge,
    normalise_precision,
)
from otel_ofu.attribution.process_env import parse_environ
from otel_ofu.model import GpuIdentity

SECRET = "hunter2-do-not-leak"
S = 1_000_000_000  # ns per second


def gpu(index: int = 0, *, mig: int | None = None, hints: Mapping[str, str] | None = None) -> GpuIdentity:
    return GpuIdentity(
        uuid=f"GPU-0000000{index}-aaaa-bbbb-cccc-dddddddddddd",
        model="NVIDIA H100 80GB HBM3",
        index=index,
        host="node-1",
        mig_profile=None if mig is None else "1g.10gb",
        mig_instance_id=mig,
        hints=dict(hints or {}),
    )


@attrs.define
class FakeClock:
    now: int = 1_000 * S

    def __call__(self) -> int:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += int(seconds * S)


@attrs.define
class RecordingLink:
    """A link that answers what it is told (or raises it) and counts the questions."""

    name: str
    answer: Mapping[str, str] = attrs.field(factory=dict)
    error: Exception | None = None
    calls: list[str] = attrs.field(factory=list)
    closed: bool = False
    close_error: Exception | None = None

    def attribute(self, gpu: GpuIdentity) -> Mapping[str, str]:
        self.calls.append(gpu.key)
        if self.error is not None:
            raise self.error
        return self.answer

    def close(self) -> None:
        self.closed = True
        if self.close_error is not None:
            raise self.close_error


def write_environ(proc: Path, pid: int, variables: Mapping[str, str], *, extra: bytes = b"") -> Path:
    directory = proc / str(pid)
    directory.mkdir(parents=True)
    block = b"".join(f"{key}={value}".encode() + b"\0" for key, value in variables.items()) + extra
    path = directory / "environ"
    path.write_bytes(block)
    return path


def pids(mapping: Mapping[int, Sequence[int]]) -> Callable[[GpuIdentity], Sequence[int]]:
    return lambda identity: mapping.get(identity.index, ())


# --- precision ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("written", "expected"),
    [
        ("bf16", "bf16"),
        ("bfloat16", "bf16"),
        ("torch.bfloat16", "bf16"),
        ("BF16-mixed", "bf16"),
        ("float16", "fp16"),
        ("half", "fp16"),
        ("16-mixed", "fp16"),
        ("fp8_e4m3", "fp8"),
        ("float8_e5m2", "fp8"),
        ("MXFP8", "fp8"),
        ("nvfp4", "fp4"),
        ("mxfp4", "fp4"),
        ("tf32", "tf32"),
        ("float64", "fp64"),
        ("int8", "int8"),
        ("mixed", "mixed"),
        (" FP16 ", "fp16"),
        ("fp32", "unknown"),
        ("banana", "unknown"),
        ("", "unknown"),
    ],
)
def test_precision_is_normalised_onto_the_contract(written: str, expected: str) -> None:
    assert normalise_precision(written) == expected
    assert normalise_precision(written) in names.PRECISIONS


# --- hints ---------------------------------------------------------------------------------------------


def test_hints_with_a_pod_are_kubernetes() -> None:
    hints = {
        names.K8S_POD_NAME: "trainer-0",
        names.K8S_NAMESPACE_NAME: "ml",
        names.K8S_CONTAINER_NAME: "main",
        names.HINT_MIG_UUID: "MIG-1234",  # a hint for other links, not an attribute
        "Hostname": "node-1",
    }
    assert HintsAttributor().attribute(gpu(hints=hints)) == {
        names.K8S_POD_NAME: "trainer-0",
        names.K8S_NAMESPACE_NAME: "ml",
        names.K8S_CONTAINER_NAME: "main",
        names.JOB_SCHEDULER: "kubernetes",
    }


def test_hints_with_an_hpc_job_are_slurm() -> None:
    assert HintsAttributor().attribute(gpu(hints={names.JOB_ID: "4242"})) == {
        names.JOB_ID: "4242",
        names.JOB_SCHEDULER: "slurm",
    }


def test_hints_keep_a_valid_scheduler_and_replace_an_invalid_one() -> None:
    simulated = {names.JOB_ID: "moe-7", names.JOB_SCHEDULER: "static", names.GPU_PRECISION: "bfloat16"}
    assert HintsAttributor().attribute(gpu(hints=simulated)) == {
        names.JOB_ID: "moe-7",
        names.JOB_SCHEDULER: "static",
        names.GPU_PRECISION: "bf16",
    }
    odd = {names.JOB_ID: "7", names.JOB_SCHEDULER: "pbs"}
    assert HintsAttributor().attribute(gpu(hints=odd))[names.JOB_SCHEDULER] == "slurm"


def test_no_hints_no_attributes() -> None:
    assert HintsAttributor().attribute(gpu()) == {}
    assert HintsAttributor().attribute(gpu(hints={names.JOB_ID: "  ", "pod": "x"})) == {}


# --- static --------------------------------------------------------------------------------------------


def test_static_gives_every_gpu_the_same_job() -> None:
    link = StaticAttributor(job_id="run-1", job_name="llama", precision="bfloat16")
    expected = {
        names.JOB_ID: "run-1",
        names.JOB_NAME: "llama",
        names.JOB_SCHEDULER: "static",
        names.GPU_PRECISION: "bf16",
    }
    assert link.attribute(gpu(0)) == expected
    assert link.attribute(gpu(3, mig=2)) == expected


def test_static_precision_alone_names_no_scheduler() -> None:
    assert StaticAttributor(precision="fp8").attribute(gpu()) == {names.GPU_PRECISION: "fp8"}
    assert StaticAttributor(job_id=" ", job_name="").attribute(gpu()) == {}


# --- process environment ---------------------------------------------------------------------------------


def test_ofu_variables_win_and_name_the_process_scheduler(tmp_path: Path) -> None:
    write_environ(
        tmp_path,
        100,
        {"OFU_JOB_ID": "run-9", "OFU_JOB_NAME": "llama-70b", "OFU_PRECISION": "bfloat16", "SLURM_JOB_ID": "77"},
    )
    link = ProcessEnvAttributor(pids_for=pids({0: [100]}), proc_root=tmp_path)
    assert link.attribute(gpu(0)) == {
        names.JOB_ID: "run-9",
        names.JOB_NAME: "llama-70b",
        names.JOB_SCHEDULER: "process",
        names.GPU_PRECISION: "bf16",
    }
    assert link.attribute(gpu(1)) == {}


def test_slurm_then_torchelastic(tmp_path: Path) -> None:
    write_environ(tmp_path, 200, {"SLURM_JOB_ID": "4242", "SLURM_JOB_NAME": "pretrain", "TORCHELASTIC_RUN_ID": "x"})
    write_environ(tmp_path, 300, {"TORCHELASTIC_RUN_ID": "elastic-5", "OFU_JOB_NAME": "ft"})
    link = ProcessEnvAttributor(pids_for=pids({0: [200], 1: [300]}), proc_root=tmp_path)
    assert link.attribute(gpu(0)) == {
        names.JOB_ID: "4242",
        names.JOB_NAME: "pretrain",
        names.JOB_SCHEDULER: "slurm",
    }
    assert link.attribute(gpu(1)) == {
        names.JOB_ID: "elastic-5",
        names.JOB_NAME: "ft",
        names.JOB_SCHEDULER: "process",
    }


def test_unreadable_and_vanished_processes_are_skipped(tmp_path: Path) -> None:
    # As root every file is readable, so "unreadable" is a directory where environ should be.
    (tmp_path / "101" / "environ").mkdir(parents=True)
    write_environ(tmp_path, 103, {"PATH": "/usr/bin"})  # readable but says nothing
    write_environ(tmp_path, 104, {"OFU_JOB_ID": "survivor"})
    link = ProcessEnvAttributor(pids_for=pids({0: [101, 102, 103, 104]}), proc_root=tmp_path)
    assert link.attribute(gpu(0)) == {names.JOB_ID: "survivor", names.JOB_SCHEDULER: "process"}


def test_permission_denied_is_skipped(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root reads a mode-000 file; the directory case covers unreadable environ files")
    write_environ(tmp_path, 105, {"OFU_JOB_ID": "hidden"}).chmod(0)
    write_environ(tmp_path, 106, {"SLURM_JOB_ID": "12"})
    link = ProcessEnvAttributor(pids_for=pids({0: [105, 106]}), proc_root=tmp_path)
    assert link.attribute(gpu(0)) == {names.JOB_ID: "12", names.JOB_SCHEDULER: "slurm"}


def test_first_process_with_a_job_decides_and_precision_may_come_later(tmp_path: Path) -> None:
    write_environ(tmp_path, 10, {"SLURM_JOB_ID": "1"})
    write_environ(tmp_path, 11, {"OFU_JOB_ID": "second", "OFU_PRECISION": "fp8_e4m3"})
    link = ProcessEnvAttributor(pids_for=pids({0: [10, 11]}), proc_root=tmp_path)
    assert link.attribute(gpu(0)) == {
        names.JOB_ID: "1",
        names.JOB_SCHEDULER: "slurm",
        names.GPU_PRECISION: "fp8",
    }


def test_parse_environ_keeps_only_the_listed_keys() -> None:
    raw = (
        b"AWS_SECRET_ACCESS_KEY=" + SECRET.encode() + b"\0"
        b"OFU_JOB_ID=a\0"
        b"OFU_JOB_ID=b\0"  # getenv returns the first
        b"OFU_JOB_NAME=\0"  # empty counts as absent
        b"NOT_AN_ASSIGNMENT\0"
        b"BINARY=\xff\xfe\0"
        b"OFU_JOB_ID_SUFFIX=no\0"
        b"SLURM_JOB_NAME=caf\xc3\xa9\0"
    )
    assert parse_environ(raw) == {"OFU_JOB_ID": "a", "SLURM_JOB_NAME": "café"}
    assert set(parse_environ(raw)) <= set(names.PROCESS_ENV_KEYS)


def test_secrets_in_a_process_environment_never_leak(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    write_environ(
        tmp_path,
        500,
        {"HF_TOKEN": SECRET, "OFU_JOB_ID": "run-1", "DB_PASSWORD": SECRET},
        extra=f"SECRET_AT_END={SECRET}".encode(),
    )
    (tmp_path / "501" / "environ").mkdir(parents=True)  # unreadable: logged, must not leak either
    chain = build_chain(pids_for=pids({0: [501, 502, 500]}), proc_root=tmp_path, static_precision="bf16")
    result = chain.attribute(gpu(0))
    link = chain.links[1]
    everything = " ".join([repr(dict(result)), str(result), repr(chain), repr(link), caplog.text, repr(caplog.records)])
    assert result[names.JOB_ID] == "run-1"
    assert SECRET not in everything
    assert "HF_TOKEN" not in everything
    assert "DB_PASSWORD" not in everything


# --- Slurm HPC job mapping ----------------------------------------------------------------------------


def test_slurm_mapping_reads_one_file_per_gpu(tmp_path: Path) -> None:
    (tmp_path / "0").write_text("1001\n")
    (tmp_path / "1").write_text("  1002  \n\n")
    (tmp_path / "2").write_text("")
    link = SlurmMappingAttributor(tmp_path)
    assert link.attribute(gpu(0)) == {names.JOB_ID: "1001", names.JOB_SCHEDULER: "slurm"}
    assert link.attribute(gpu(1)) == {names.JOB_ID: "1002", names.JOB_SCHEDULER: "slurm"}
    assert link.attribute(gpu(2)) == {}
    assert link.attribute(gpu(3)) == {}


def test_several_jobs_on_a_gpu_take_the_last_line(tmp_path: Path) -> None:
    (tmp_path / "0").write_text("stale-900\n1001\n\n1002\n\n")
    assert SlurmMappingAttributor(tmp_path).attribute(gpu(0))[names.JOB_ID] == "1002"


def test_mig_instances_have_their_own_files_and_fall_back_to_the_gpu(tmp_path: Path) -> None:
    (tmp_path / "0.1").write_text("mig-job\n")
    (tmp_path / "1").write_text("whole-gpu-job\n")
    link = SlurmMappingAttributor(tmp_path)
    assert link.attribute(gpu(0, mig=1))[names.JOB_ID] == "mig-job"
    assert link.attribute(gpu(0, mig=2)) == {}
    assert link.attribute(gpu(1, mig=3))[names.JOB_ID] == "whole-gpu-job"
    assert link.attribute(gpu(0)) == {}


def test_missing_directory_and_odd_entries_mean_no_job(tmp_path: Path) -> None:
    assert SlurmMappingAttributor(tmp_path / "absent").attribute(gpu(0)) == {}
    (tmp_path / "0").mkdir()
    assert SlurmMappingAttributor(tmp_path).attribute(gpu(0)) == {}


def test_an_unreadable_mapping_file_is_an_attribution_error(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root reads a mode-000 file")
    path = tmp_path / "0"
    path.write_text("1\n")
    path.chmod(0)
    with pytest.raises(AttributionError, match="HPC job-mapping file"):
        SlurmMappingAttributor(tmp_path).attribute(gpu(0))


# --- merge ---------------------------------------------------------------------------------------------


def test_the_first_link_with_a_job_id_decides_the_whole_job() -> None:
    merged = merge(
        [
            {names.JOB_NAME: "orphan-name", names.JOB_SCHEDULER: "kubernetes", names.K8S_POD_NAME: "p"},
            {names.JOB_ID: "1", names.JOB_SCHEDULER: "slurm"},
            {names.JOB_ID: "2", names.JOB_NAME: "static-name", names.JOB_SCHEDULER: "static"},
        ]
    )
    assert merged == {names.JOB_ID: "1", names.JOB_SCHEDULER: "slurm", names.K8S_POD_NAME: "p"}


def test_without_any_job_id_name_and_scheduler_come_from_the_first_that_has_them() -> None:
    merged = merge([{names.K8S_POD_NAME: "p", names.JOB_SCHEDULER: "kubernetes"}, {names.JOB_NAME: "n"}])
    assert merged == {names.K8S_POD_NAME: "p", names.JOB_SCHEDULER: "kubernetes", names.JOB_NAME: "n"}


def test_pod_attributes_come_together_and_precision_prefers_a_known_one() -> None:
    merged = merge(
        [
            {names.GPU_PRECISION: "unknown", names.K8S_NAMESPACE_NAME: "stray"},
            {names.K8S_POD_NAME: "p", names.K8S_NAMESPACE_NAME: "ml", names.K8S_CONTAINER_NAME: "c"},
            {names.GPU_PRECISION: "fp8"},
            {names.GPU_PRECISION: "bf16"},
        ]
    )
    assert merged == {
        names.K8S_POD_NAME: "p",
        names.K8S_NAMESPACE_NAME: "ml",
        names.K8S_CONTAINER_NAME: "c",
        names.GPU_PRECISION: "fp8",
    }
    assert merge([{names.GPU_PRECISION: "unknown"}]) == {names.GPU_PRECISION: "unknown"}
    assert merge([]) == {}


# --- the chain -------------------------------------------------------------------------------------------


def test_results_are_cached_per_gpu_and_refreshed_on_their_own_period() -> None:
    clock = FakeClock()
    link = RecordingLink("a", {names.JOB_ID: "1"})
    chain = AttributionChain([link], refresh_s=30.0, clock=clock)
    for _ in range(5):
        assert chain.attribute(gpu(0)) == {names.JOB_ID: "1"}
    assert link.calls == [gpu(0).key]
    chain.attribute(gpu(1))
    chain.attribute(gpu(0, mig=1))
    assert len(link.calls) == 3
    clock.advance(29.9)
    chain.attribute(gpu(0))
    assert len(link.calls) == 3
    link.answer = {names.JOB_ID: "2"}
    clock.advance(0.1)
    assert chain.attribute(gpu(0)) == {names.JOB_ID: "2"}
    assert len(link.calls) == 4


def test_new_hints_and_a_clock_going_back_refresh_at_once() -> None:
    clock = FakeClock()
    link = RecordingLink("a")
    chain = AttributionChain([HintsAttributor(), link], clock=clock)
    assert chain.attribute(gpu(0)) == {}
    with_pod = gpu(0, hints={names.K8S_POD_NAME: "p"})
    assert chain.attribute(with_pod)[names.K8S_POD_NAME] == "p"
    clock.now -= 5 * S
    chain.attribute(with_pod)
    assert len(link.calls) == 3
    chain.forget(with_pod)
    chain.attribute(with_pod)
    assert len(link.calls) == 4


def test_results_are_read_only_and_hold_only_attribution_keys() -> None:
    link = RecordingLink("a", {names.JOB_ID: "1", "password": SECRET, names.JOB_NAME: ""})
    result = AttributionChain([link], clock=FakeClock()).attribute(gpu())
    assert result == {names.JOB_ID: "1"}
    with pytest.raises(TypeError):
        result[names.JOB_ID] = "2"  # type: ignore[index]


def test_a_failing_link_is_skipped_and_logged_once_per_period(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    broken = RecordingLink("broken", error=OSError("kubelet gone\nsecond line"))
    good = RecordingLink("good", {names.JOB_ID: "7"})
    chain = AttributionChain([broken, good], refresh_s=10.0, clock=clock)
    with caplog.at_level(logging.WARNING, logger="otel_ofu.attribution"):
        assert chain.attribute(gpu(0)) == {names.JOB_ID: "7"}
        assert chain.attribute(gpu(1)) == {names.JOB_ID: "7"}
        clock.advance(5)
        chain.forget(gpu(0))
        assert chain.attribute(gpu(0)) == {names.JOB_ID: "7"}
        assert len(broken.calls) == 3
        assert len(caplog.records) == 1
        assert "broken" in caplog.text
        assert "OSError: kubelet gone" in caplog.text
        assert "second line" not in caplog.text
        clock.advance(10)
        chain.attribute(gpu(0))
        assert len(caplog.records) == 2
        broken.error = None
        clock.advance(10)
        chain.attribute(gpu(0))
        assert len(caplog.records) == 2


def test_close_closes_every_link_even_when_one_fails(caplog: pytest.LogCaptureFixture) -> None:
    first = RecordingLink("first", close_error=RuntimeError("boom"))
    second = RecordingLink("second")
    with caplog.at_level(logging.WARNING, logger="otel_ofu.attribution"):
        AttributionChain([first, second]).close()
    assert first.closed
    assert second.closed
    assert "first" in caplog.text


def test_refresh_period_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        AttributionChain([], refresh_s=0)


def test_every_link_is_an_attributor(tmp_path: Path) -> None:
    links: list[Attributor] = [
        HintsAttributor(),
        StaticAttributor(job_id="1"),
        ProcessEnvAttributor(pids_for=pids({}), proc_root=tmp_path),
        SlurmMappingAttributor(tmp_path),
        AttributionChain([]),
    ]
    assert all(isinstance(link, Attributor) for link in links)


# --- build_chain -------------------------------------------------------------------------------------------


def test_build_chain_leaves_out_what_is_not_configured(tmp_path: Path) -> None:
    assert [link.name for link in build_chain().links] == ["hints"]
    full = build_chain(
        static_job_id="s",
        pids_for=pids({}),
        proc_root=tmp_path,
        slurm_mapping_dir=tmp_path,
        kubelet_socket=tmp_path / "kubelet.sock",
    )
    assert [link.name for link in full.links] == list(DEFAULT_ORDER)
    assert DEFAULT_ORDER == ("hints", "process_env", "slurm_mapping", "kubernetes", "static")
    reordered = build_chain(static_precision="fp8", slurm_mapping_dir=tmp_path, order=("static", "slurm_mapping"))
    assert [link.name for link in reordered.links] == ["static", "slurm_mapping"]
    full.close()


def test_build_chain_rejects_unknown_or_repeated_links() -> None:
    with pytest.raises(ValueError, match="unknown attribution link"):
        build_chain(order=("hints", "pbs"))
    with pytest.raises(ValueError, match="twice"):
        build_chain(order=("hints", "hints"))


def test_default_chain_from_real_files(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    mapping = tmp_path / "jobmap"
    mapping.mkdir()
    write_environ(proc, 41, {"OFU_JOB_ID": "from-process", "OFU_PRECISION": "bf16"})
    (mapping / "0").write_text("slurm-0\n")
    (mapping / "1").write_text("slurm-1\n")
    clock = FakeClock()
    chain = build_chain(
        static_job_id="node-default",
        static_precision="fp16",
        proc_root=proc,
        pids_for=pids({0: [41]}),
        slurm_mapping_dir=mapping,
        clock=clock,
    )
    # GPU 0: its process says who it is; GPU 1: the Slurm mapping; GPU 2: the node's default.
    assert chain.attribute(gpu(0)) == {
        names.JOB_ID: "from-process",
        names.JOB_SCHEDULER: "process",
        names.GPU_PRECISION: "bf16",
    }
    assert chain.attribute(gpu(1)) == {
        names.JOB_ID: "slurm-1",
        names.JOB_SCHEDULER: "slurm",
        names.GPU_PRECISION: "fp16",
    }
    assert chain.attribute(gpu(2)) == {
        names.JOB_ID: "node-default",
        names.JOB_SCHEDULER: "static",
        names.GPU_PRECISION: "fp16",
    }
    # The source's own hints come first.
    hinted = gpu(0, hints={names.JOB_ID: "hpc-job", names.K8S_POD_NAME: "p"})
    assert chain.attribute(hinted)[names.JOB_ID] == "hpc-job"
    # Epilog removed the job: seen after the refresh period, not before.
    (mapping / "1").unlink()
    assert chain.attribute(gpu(1))[names.JOB_ID] == "slurm-1"
    clock.advance(30)
    assert chain.attribute(gpu(1))[names.JOB_ID] == "node-default"
