"""The deployment kit in examples/deploy cannot rot: every variable it sets is an option ``run`` accepts."""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from otel_ofu import names
from otel_ofu.attribution import SlurmMappingAttributor
from otel_ofu.cli_support import option_variables
from otel_ofu.commands import run
from otel_ofu.model import GpuIdentity

DEPLOY = Path(__file__).resolve().parents[1] / "examples" / "deploy"


def run_subparser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="otel-ofu")
    action = parser.add_subparsers(dest="command", required=True)
    run.register(action)
    sub: argparse.ArgumentParser = action.choices["run"]
    return sub


def run_variables() -> set[str]:
    """The OTEL_OFU_* variable of every ``run`` option, as its help names it."""
    return set(option_variables(run_subparser()).values())


def unit_environment(text: str) -> dict[str, str]:
    environment: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("Environment="):
            for assignment in shlex.split(line.removeprefix("Environment=")):
                key, _, value = assignment.partition("=")
                environment[key] = value
    return environment


def unit_exec_args(text: str) -> list[str]:
    (line,) = [line for line in text.splitlines() if line.startswith("ExecStart=")]
    argv = shlex.split(line.removeprefix("ExecStart="))
    assert Path(argv[0]).name == "otel-ofu"
    return argv[1:]


def daemonset_container() -> dict[str, Any]:
    documents = [doc for doc in yaml.safe_load_all((DEPLOY / "daemonset.yaml").read_text()) if doc]
    (daemonset,) = [doc for doc in documents if doc["kind"] == "DaemonSet"]
    (container,) = daemonset["spec"]["template"]["spec"]["containers"]
    assert isinstance(container, dict)
    return container


def check_settings(environment: dict[str, str], argv: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    known = run_variables()
    ours = {key for key in environment if key.startswith("OTEL_OFU_")}
    assert ours, "the kit sets no OTEL_OFU_* variable"
    assert ours <= known, f"not options of `otel-ofu run`: {sorted(ours - known)}"
    for key in list(os.environ):
        if key.startswith("OTEL_"):
            monkeypatch.delenv(key)
    for key, value in environment.items():
        monkeypatch.setenv(key, value)
    sub = run_subparser()
    # Parsing converts and checks every value from a variable: a bad one exits here.
    sub.parse_args(argv[1:] if argv[:1] == ["run"] else argv)


def test_systemd_unit_sets_only_run_options(monkeypatch: pytest.MonkeyPatch) -> None:
    text = (DEPLOY / "otel-ofu.service").read_text()
    assert "[Service]" in text
    assert "[Install]" in text
    argv = unit_exec_args(text)
    assert argv[0] == "run"
    environment = unit_environment(text)
    check_settings(environment, argv, monkeypatch)
    assert "KillSignal=SIGTERM" in text  # SIGTERM flushes the last interval
    # Scraped from the Prometheus host, and the producer's endpoint is on loopback unless told otherwise.
    assert environment["OTEL_OFU_PROMETHEUS_HOST"] == "0.0.0.0"


def test_daemonset_sets_only_run_options_and_mounts_what_they_name(monkeypatch: pytest.MonkeyPatch) -> None:
    container = daemonset_container()
    environment = {item["name"]: item["value"] for item in container["env"] if "value" in item}
    from_fields = {item["name"] for item in container["env"] if "valueFrom" in item}
    assert from_fields <= run_variables() | {"NVIDIA_VISIBLE_DEVICES", "NODE_NAME"}  # NODE_NAME: downward API
    check_settings(environment, list(container["args"]), monkeypatch)
    mounts = {mount["mountPath"]: mount for mount in container["volumeMounts"]}
    socket = Path(environment["OTEL_OFU_KUBELET_SOCKET"])
    assert str(socket.parent) in mounts
    assert mounts[str(socket.parent)]["readOnly"] is True
    proc = mounts[environment["OTEL_OFU_PROC_ROOT"]]
    assert proc["readOnly"] is True
    ports = {port["containerPort"] for port in container["ports"]}
    assert int(environment["OTEL_OFU_PROMETHEUS_PORT"]) in ports
    # The producer's endpoint is on loopback unless told otherwise: a declared pod port must be opened.
    assert environment["OTEL_OFU_PROMETHEUS_HOST"] == "0.0.0.0"


def run_script(name: str, mapping: Path, job: str, gpus: str) -> None:
    environment = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "OTEL_OFU_SLURM_MAPPING_DIR": str(mapping),
        "SLURM_JOB_ID": job,
        "SLURM_JOB_GPUS": gpus,
    }
    subprocess.run(["sh", str(DEPLOY / "slurm" / name)], env=environment, check=True, timeout=30)


def test_slurm_prolog_and_epilog_keep_one_file_per_gpu(tmp_path: Path, require: Any) -> None:
    require(shutil.which("flock") is not None, "flock (util-linux) is needed by the Slurm scripts")
    mapping = tmp_path / "job-mapping"
    run_script("prolog.sh", mapping, "1001", "0,1")
    run_script("prolog.sh", mapping, "1002", "1,2")
    run_script("prolog.sh", mapping, "1002", "1,2")  # a requeued prolog does not duplicate the line
    assert (mapping / "0").read_text() == "1001\n"
    assert (mapping / "1").read_text() == "1001\n1002\n"  # the newest job last
    assert (mapping / "2").read_text() == "1002\n"
    reader = SlurmMappingAttributor(mapping)  # what `run --slurm-mapping-dir` reads
    gpu = GpuIdentity(uuid="GPU-1", model="NVIDIA H100 80GB HBM3", index=1, host="node")
    assert reader.attribute(gpu)[names.JOB_ID] == "1002"
    run_script("epilog.sh", mapping, "1001", "0,1")
    assert not (mapping / "0").exists()
    assert (mapping / "1").read_text() == "1002\n"
    run_script("epilog.sh", mapping, "1002", "")  # no GPU list: every file is searched
    assert sorted(path.name for path in mapping.iterdir() if not path.name.startswith(".")) == []
